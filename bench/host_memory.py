#!/usr/bin/env python3
"""bench/host_memory.py — a command's wall time and the peak host memory of its whole process tree (mpirun, its
daemons and every rank), sampled from /proc. Used by bench/placement_3d.py --sim-search and for the 64-rank
figures of docs/simulation.md ("Timing-only runs").

  python3 bench/host_memory.py [--every-s 0.2] -- mpirun -np 64 build/bin/reference/lab07_parallel_3d ...

Every --every-s seconds it sums, over the command and all its descendants, the proportional set size (Pss of
/proc/<pid>/smaps_rollup: a process's private pages, plus each page it shares divided by the processes sharing
it), so the sum is the memory the machine gave them all, each shared page (the program's code, MPI's libraries)
counted once; it also sums their resident sets (Rss), in which a shared page counts once per process, an upper
bound. The peaks of both sums are the figures. A process that starts and ends between two samples is missed.
Linux only (/proc).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time



def process_tree(root):
    """The pids of root and all its descendants, from each process's parent in /proc/<pid>/stat."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # after "pid (comm) state": the parent's pid
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def memory_bytes(pids):
    """(sum of Pss, sum of Rss) of the processes, bytes; a process that ended meanwhile counts 0."""
    pss = rss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return pss, rss


def run_sampled(cmd, cwd=None, env=None, timeout=None, every_s=0.2):
    """Run cmd (a list); return {"rc", "output" (stdout and stderr), "wall_s", "peak_pss_bytes" (the figure),
    "peak_rss_bytes" (the upper bound), "peak_processes"}. rc is 124 when it ran past timeout seconds (it is
    then killed, with its process group)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        peak, peak_rss, processes, rc = 0, 0, 0, None
        while rc is None:
            tree = process_tree(p.pid)
            pss, rss = memory_bytes(tree)
            peak_rss = max(peak_rss, rss)
            if pss > peak:
                peak, processes = pss, len(tree)
            time.sleep(every_s)
            rc = p.poll()
            if rc is None and timeout and time.monotonic() - t0 > timeout:
                os.killpg(p.pid, 9)
                p.wait()
                rc = 124
        wall = time.monotonic() - t0
        out.seek(0)
        return {"rc": rc, "output": out.read(), "wall_s": wall, "peak_pss_bytes": peak, "peak_rss_bytes": peak_rss,
                "peak_processes": processes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--every-s", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command: bench/host_memory.py -- CMD ARGS...")
    r = run_sampled(cmd, every_s=a.every_s)
    sys.stdout.write(r["output"])
    print(f"host_memory: exit {r['rc']}, {r['wall_s']:.1f} s wall, peak host memory {r['peak_pss_bytes'] / 2**30:.2f} "
          f"GiB (Pss of {r['peak_processes']} processes summed, every {a.every_s:g} s; their Rss summed: "
          f"{r['peak_rss_bytes'] / 2**30:.2f} GiB)")
    return r["rc"]


if __name__ == "__main__":
    sys.exit(main())
