// mpi_sendrecv_plain.cpp — bin/bench_mpi_sendrecv: a plain MPI_Sendrecv loop, no communicator, no
// communication thread, no event log: the baseline of lab 00's sendrecv rows (labs/00_setup/main.cpp).
// The difference between the two is what scalelab's point to point costs (bench/p2p.md).
// The same sizes (--min-bytes .. --max-bytes in x--factor steps) and timing as lab 00: every rank sends
// S bytes to rank + 1 and receives S from rank - 1 at once (nccl-tests' sendrecv_perf), f32; the first
// call is checked, warm-up calls, then the mean of the timed calls of the SLOWEST rank; algbw = S / time
// and busbw = algbw x 1 (nccl-tests, doc/PERFORMANCE.md).
//
//   mpirun -np 2 build/bin/bench_mpi_sendrecv --max-bytes 1M
#include <CLI/CLI.hpp>  // defines: CLI::App (command line)
#include <mpi.h>        // defines: MPI_Sendrecv, MPI_Wtime

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_sizes.h"  // defines: parse_bytes

// Element i of rank r's buffer: exact small integers, as lab 00's pattern (its `wrong` column).
static float pattern(int r, long long i) { return static_cast<float>((r + 1) + i % 7); }

int main(int argc, char** argv) {
  CLI::App app{"A plain MPI_Sendrecv loop: time, algbw and busbw per size (the baseline of lab00_setup's sendrecv)"};
  std::string min_bytes = "8", max_bytes = "256M";
  int factor = 2, iters = 50, warmup = 5;
  double seconds_per_size = 0.2;
  bool thread_multiple = false;
  app.add_option("--min-bytes", min_bytes, "smallest message, bytes (K, M, G = powers of 1024)")->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "largest message, bytes")->capture_default_str();
  app.add_option("--factor", factor, "each size is the previous one times this")->capture_default_str();
  app.add_option("--iters", iters, "timed calls per size, at most")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed calls per size, at most (at least 2)")->capture_default_str();
  app.add_option("--seconds-per-size", seconds_per_size, "time budget per size that limits the calls of big sizes")
      ->capture_default_str();
  app.add_flag("--thread-multiple", thread_multiple,
               "initialize MPI with MPI_THREAD_MULTIPLE, as the communicator's mpi backend must");
  try {
    app.parse(argc, argv);  // before MPI starts: the flag decides how MPI is initialized
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const long long lo = parse_bytes(min_bytes), hi = parse_bytes(max_bytes);
  if (n < 2 || lo < 4 || hi < lo || factor < 2) {
    if (rank == 0)
      std::fprintf(stderr, "needs 2 or more ranks (mpirun -np 2), 4 <= --min-bytes <= --max-bytes, --factor >= 2\n");
    MPI_Finalize();
    return 1;
  }
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;

  if (rank == 0) {
    std::printf(
        "plain MPI_Sendrecv (f32, to rank+1, from rank-1), %d ranks, %s; time = mean per call of the slowest "
        "rank\n",
        n, thread_multiple ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SINGLE");
    std::printf("%12s %11s %6s %6s %11s %11s %11s %6s\n", "bytes", "elements", "warmup", "iters", "time_us",
                "algbw_GB/s", "busbw_GB/s", "wrong");
  }
  for (long long bytes = lo; bytes <= hi; bytes *= factor) {
    const int count = static_cast<int>(bytes / 4);  // elements
    std::vector<float> out(static_cast<size_t>(count)), in(static_cast<size_t>(count), -1.0f);
    for (int i = 0; i < count; ++i) out[i] = pattern(rank, i);
    auto call = [&] {
      MPI_Sendrecv(out.data(), count, MPI_FLOAT, next, 0, in.data(), count, MPI_FLOAT, prev, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
    };

    // 1. The first call is checked; 2. a second one sizes the budget (lab 00's rule).
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    call();
    const double first_s = MPI_Wtime() - t0;
    long long wrong = 0;
    for (int i = 0; i < count; ++i) wrong += in[i] != pattern(prev, i);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    call();
    double estimate_s = std::min(first_s, MPI_Wtime() - t0);
    MPI_Allreduce(MPI_IN_PLACE, &estimate_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const int fit = static_cast<int>(std::min(1e6, std::floor(seconds_per_size / std::max(estimate_s, 1e-9))));
    const int n_warmup = 2 + std::max(0, std::min(warmup - 2, fit / 4));  // the two calls above count
    const int n_iters = std::max(1, std::min(iters, fit));

    // 3. More warm-up, then the timed calls.
    for (int w = 2; w < n_warmup; ++w) call();
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int it = 0; it < n_iters; ++it) call();
    double time_s = (MPI_Wtime() - t0) / n_iters;
    MPI_Allreduce(MPI_IN_PLACE, &time_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank

    const double algbw = static_cast<double>(count) * 4 / time_s;  // bytes/s, each way
    if (rank == 0) {
      std::printf("%12lld %11d %6d %6d %11.1f %11.3f %11.3f %6lld\n", static_cast<long long>(count) * 4, count,
                  n_warmup, n_iters, time_s * 1e6, algbw / 1e9, algbw / 1e9, wrong);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
