#!/usr/bin/env python3
"""p2p_compare.py: lab 00's sendrecv rows (the communicator's point to point) against the plain-MPI twin
(bin/bench_mpi_sendrecv), in alternating runs on 2 ranks, so that a machine whose speed drifts (other
builds, other users) slows both alike. Prints, per size, the median time per message of each program
over the runs, their spread (min-max) and the ratio of the medians (ours / plain MPI). bench/p2p.md
holds the measured tables.

    python3 bench/p2p_compare.py --build-dir build --runs 5
    python3 bench/p2p_compare.py --build-dir build --also before=/path/to/old/lab00_setup   # a third program

Sizes: --min-bytes .. --max-bytes in x--factor steps (the same options, the same rule in both programs).
Every run uses its own log folder under --out (default /tmp/p2p_compare). Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def mpirun(np, program, args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    cmd = ["mpirun", "-np", str(np), "--bind-to", "none", program] + args
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout


def lab00_times(program, sizes, np, out, run_id):
    """{bytes: time_us} of lab00_setup's sendrecv rows (its probe.json)."""
    mpirun(np, program, sizes + ["--skip-gemm", "--memcpy-bytes", "1M", "--log-dir", out, "--run-id", run_id])
    with open(os.path.join(out, "lab00", run_id, "probe.json")) as f:
        rows = json.load(f)["sweep"]["rows"]
    return {r["size_bytes"]: r["time_ms"] * 1e3 for r in rows if r["op"] == "sendrecv"}


def twin_times(program, sizes, np):
    """{bytes: time_us} of bench_mpi_sendrecv's table (bytes in column 1, time_us in column 5)."""
    times = {}
    for line in mpirun(np, program, sizes).splitlines():
        cols = line.split()
        if len(cols) == 8 and cols[0].isdigit():
            times[int(cols[0])] = float(cols[4])
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--runs", type=int, default=5, help="alternations (each runs every program once)")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--min-bytes", default="16")
    ap.add_argument("--max-bytes", default="1M")
    ap.add_argument("--factor", default="4")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=LAB00",
                    help="another lab00_setup to alternate with (e.g. an older build's)")
    ap.add_argument("--out", default="/tmp/p2p_compare")
    a = ap.parse_args()
    sizes = ["--min-bytes", a.min_bytes, "--max-bytes", a.max_bytes, "--factor", a.factor]
    programs = [("ours", os.path.join(a.build_dir, "bin", "lab00_setup"))]
    programs += [tuple(x.split("=", 1)) for x in a.also]
    twin = os.path.join(a.build_dir, "bin", "bench_mpi_sendrecv")
    samples = {name: [] for name, _ in programs}
    samples["mpi"] = []
    for run in range(a.runs):
        samples["mpi"].append(twin_times(twin, sizes, a.np))
        for name, program in programs:
            samples[name].append(lab00_times(program, sizes, a.np, a.out, f"{name}-{os.getpid()}-{run}"))
        print(f"run {run + 1}/{a.runs} done", file=sys.stderr)

    names = [name for name, _ in programs] + ["mpi"]
    print(f"sendrecv, {a.np} ranks, {a.runs} alternating runs: median time per message, us [min-max]")
    print(f"{'bytes':>10} " + " ".join(f"{n:>24}" for n in names) +
          "".join(f" {n + '/mpi':>10}" for n in names[:-1]))
    for size in sorted(samples["mpi"][0]):
        med = {}
        cells = []
        for n in names:
            xs = [s[size] for s in samples[n] if size in s]
            med[n] = statistics.median(xs)
            cells.append(f"{med[n]:9.1f} [{min(xs):.1f}-{max(xs):.1f}]")
        print(f"{size:>10} " + " ".join(f"{c:>24}" for c in cells) +
              "".join(f" {med[n] / med['mpi']:10.2f}" for n in names[:-1]))


if __name__ == "__main__":
    sys.exit(main())
