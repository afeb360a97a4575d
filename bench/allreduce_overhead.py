#!/usr/bin/env python3
"""allreduce_overhead.py — what the communicator costs over a plain MPI_Allreduce, as medians of runs.

Runs lab00_setup (the all_reduce row of its sweep: the scalelab communicator, blocking form) and
bench_mpi_allreduce (a plain MPI_Allreduce loop, bench/mpi_allreduce_plain.cpp) at each rank count and
size, REPEATS times each, alternating the two programs so a change in the machine's load hits both, and
prints the median time per call (us) of each and their ratio, and the best (fastest) run of each (on a
machine that other jobs share, the runs fall into a fast and a slow mode: the best shows the fast one). Both programs time the same way: f32 sum
in place, warm-up calls, then the mean of the timed calls of the slowest rank. Several --bin folders
(builds before and after a change) are run in turn within each repeat, so the machine's load of the
moment falls on all of them alike.

  bench/allreduce_overhead.py --bin build/bin                      # 8 B, 1 MiB, 64 MiB at 2 and 4 ranks
  bench/allreduce_overhead.py --bin build-before/bin --bin build/bin --sizes 8 --ranks 2 --repeats 11
  bench/allreduce_overhead.py --bin build/bin --thread-multiple   # + the plain loop at MPI_THREAD_MULTIPLE

Needs mpirun (as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1). Timings on a shared
machine swing run to run: read the medians, and the load average printed before and after.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile


def mpirun(ranks, argv):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + argv
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return out.stdout


def lab00_us(binary, ranks, size, iters, warmup, seconds, log_dir):
    """Time per call (us) of lab00_setup's all_reduce row at `size` bytes."""
    text = mpirun(ranks, [os.path.join(binary, "lab00_setup"), "--skip-gemm", "--memcpy-bytes", "1M",
                          "--min-bytes", size, "--max-bytes", size, "--iters", str(iters), "--warmup",
                          str(warmup), "--seconds-per-size", str(seconds), "--threads", "1", "--log-dir", log_dir])
    # The row under "all_reduce (sum)": bytes elements warmup iters time_us algbw busbw wrong
    block = text.split("all_reduce (sum)", 1)[1].splitlines()
    return float(block[2].split()[4])


def plain_us(binary, ranks, size, iters, warmup, seconds, thread_multiple=False):
    """Time per call (us) of bench_mpi_allreduce at `size` bytes (MPI_THREAD_MULTIPLE when asked)."""
    text = mpirun(ranks, [os.path.join(binary, "bench_mpi_allreduce"), "--sizes", size, "--iters", str(iters),
                          "--warmup", str(warmup), "--seconds-per-size", str(seconds)]
                  + (["--thread-multiple"] if thread_multiple else []))
    row = [line for line in text.splitlines() if re.match(r"^\s*\d+\s+\d+\s", line)][0]
    return float(row.split()[4])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, action="append",
                    help="folder with lab00_setup and bench_mpi_allreduce (build/bin); repeat to compare builds")
    ap.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--sizes", nargs="+", default=["8", "1M", "64M"], help="bytes (K, M = powers of 1024)")
    ap.add_argument("--repeats", type=int, default=7, help="runs of each program per rank count and size")
    ap.add_argument("--iters", type=int, default=200, help="timed calls per run, at most (both programs)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls per run, at most (both programs)")
    ap.add_argument("--seconds-per-size", type=float, default=0.5, help="budget that limits big sizes' calls")
    ap.add_argument("--thread-multiple", action="store_true",
                    help="also time the plain loop under MPI_THREAD_MULTIPLE (the thread level the communicator "
                         "needs; needs a bench_mpi_allreduce with --thread-multiple in the first --bin)")
    a = ap.parse_args()

    print(f"load average before: {os.getloadavg()[0]:.2f}  (cores: {os.cpu_count()})")
    print(f"{'ranks':>5} {'bytes':>6} {'communicator_us':>16} {'plain_mpi_us':>13} {'ratio':>6} "
          f"{'best_comm_us':>13} {'best_plain_us':>14} {'ratio':>6} {'plain_mt_us':>12} {'ratio_mt':>8}"
          f"   bin: all runs (us)")
    with tempfile.TemporaryDirectory() as log_dir:
        for ranks in a.ranks:
            for size in a.sizes:
                comm = {b: [] for b in a.bin}
                plain = {b: [] for b in a.bin}
                plain_mt = []  # MPI_THREAD_MULTIPLE, as the mpi backend initializes MPI (the first --bin)
                for _ in range(a.repeats):
                    for b in a.bin:
                        comm[b].append(lab00_us(b, ranks, size, a.iters, a.warmup, a.seconds_per_size, log_dir))
                        plain[b].append(plain_us(b, ranks, size, a.iters, a.warmup, a.seconds_per_size))
                    if a.thread_multiple:
                        plain_mt.append(plain_us(a.bin[0], ranks, size, a.iters, a.warmup, a.seconds_per_size, True))
                for b in a.bin:
                    c, p = statistics.median(comm[b]), statistics.median(plain[b])
                    bc, bp = min(comm[b]), min(plain[b])
                    mt = f"{statistics.median(plain_mt):>12.1f} {c / statistics.median(plain_mt):>8.2f}" if plain_mt \
                        else f"{'-':>12} {'-':>8}"
                    print(f"{ranks:>5} {size:>6} {c:>16.1f} {p:>13.1f} {c / p:>6.2f} {bc:>13.1f} {bp:>14.1f} "
                          f"{bc / bp:>6.2f} {mt}   {b}: comm {comm[b]} plain {plain[b]}"
                          + (f" plain_mt {plain_mt}" if plain_mt else ""), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
