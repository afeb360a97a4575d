// mpi_allreduce_plain.cpp — bin/bench_mpi_allreduce: a plain MPI_Allreduce loop, no communicator, no
// communication thread, no event log: the baseline for lab 00's all_reduce rows. The difference between
// the two is what scalelab's Communicator costs (docs/labs/00_setup.md, "The communicator's overhead").
// Timing as in lab 00: f32 sum in place, warm-up calls, then the mean of the timed calls of the
// SLOWEST rank; algbw = S / time, busbw = algbw x 2(n-1)/n (nccl-tests, doc/PERFORMANCE.md).
//
//   mpirun -np 2 build/bin/bench_mpi_allreduce --sizes 1M,64M
#include <CLI/CLI.hpp>  // defines: CLI::App (command line)
#include <mpi.h>        // defines: MPI_Allreduce, MPI_Wtime

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_sizes.h"  // defines: parse_bytes

int main(int argc, char** argv) {
  CLI::App app{"A plain MPI_Allreduce loop: time, algbw and busbw per size (the baseline of lab00_setup)"};
  std::vector<std::string> sizes = {"1M", "64M"};
  int iters = 50, warmup = 5;
  double seconds_per_size = 0.2;
  bool thread_multiple = false;
  app.add_option("--sizes", sizes, "buffer sizes in bytes (K, M, G = powers of 1024)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--iters", iters, "timed calls per size, at most")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed calls per size, at most")->capture_default_str();
  app.add_option("--seconds-per-size", seconds_per_size, "time budget per size that limits the calls of big sizes")
      ->capture_default_str();
  app.add_flag("--thread-multiple", thread_multiple,
               "initialize MPI with MPI_THREAD_MULTIPLE, as the communicator's mpi backend must (its communication "
               "threads call MPI too): the part of the communicator's overhead that is MPI's own locking");
  try {
    app.parse(argc, argv);  // before MPI starts: the flag decides how MPI is initialized
  } catch (const CLI::ParseError& e) {
    return app.exit(e);  // prints help or the error (on every rank: MPI has not started)
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (thread_multiple && provided < MPI_THREAD_MULTIPLE) {
    if (rank == 0) std::fprintf(stderr, "this MPI provides thread level %d, not MPI_THREAD_MULTIPLE\n", provided);
    MPI_Finalize();
    return 1;
  }

  if (rank == 0) {
    std::printf("plain MPI_Allreduce (f32 sum, in place), %d ranks, %s; time = mean per call of the slowest rank\n", n,
                thread_multiple ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SINGLE");
    std::printf("%12s %11s %6s %6s %11s %11s %11s\n", "bytes", "elements", "warmup", "iters", "time_us", "algbw_GB/s",
                "busbw_GB/s");
  }
  for (const std::string& s : sizes) {
    const long long bytes = parse_bytes(s);
    if (bytes < 4) {
      if (rank == 0) std::fprintf(stderr, "bad size '%s': give 1M, 64M, ... (at least 4 bytes)\n", s.c_str());
      MPI_Finalize();
      return 1;
    }
    const int count = static_cast<int>(bytes / 4);             // elements
    std::vector<float> buf(static_cast<size_t>(count), 0.0f);  // zeros: the sum in place stays finite

    // The first call times the size, so that big sizes make fewer calls (the same rule as lab00_setup).
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double first_s = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &first_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const int fit = static_cast<int>(std::min(1e6, std::floor(seconds_per_size / std::max(first_s, 1e-9))));
    const int n_warmup = 1 + std::min(warmup - 1, fit / 4);
    const int n_iters = std::max(1, std::min(iters, fit));
    for (int w = 1; w < n_warmup; ++w)
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int it = 0; it < n_iters; ++it)
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double time_s = (MPI_Wtime() - t0) / n_iters;
    MPI_Allreduce(MPI_IN_PLACE, &time_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank

    const double algbw = static_cast<double>(count) * 4 / time_s;  // bytes/s
    const double busbw = algbw * 2.0 * (n - 1) / n;                // 0 for one rank
    if (rank == 0) {
      std::printf("%12lld %11d %6d %6d %11.1f %11.3f %11.3f\n", static_cast<long long>(count) * 4, count, n_warmup,
                  n_iters, time_s * 1e6, algbw / 1e9, busbw / 1e9);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
