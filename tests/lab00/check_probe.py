#!/usr/bin/env python3
"""check_probe.py: reads the probe.json that lab00_setup wrote and checks its sweep table against
nccl-tests' definitions (its doc/PERFORMANCE.md; labs/00_setup/README.md), recomputed here from the
bytes and the time alone:

    algbw = S / t                        S = size_bytes (the total of n chunks for all_gather and
                                         reduce_scatter)
    busbw = algbw * 2(n-1)/n             all_reduce
          = algbw * (n-1)/n              all_gather, reduce_scatter
          = algbw * 1                    broadcast, sendrecv (point to point, nccl-tests' sendrecv_perf)
          = null (n/a)                   one rank

and that the table is what was asked for: all four collectives (and sendrecv with 2 or more ranks; with
one there is no peer, so no sendrecv rows), f32 element counts that match the bytes,
equal chunks for all_gather and reduce_scatter, no wrong results, a positive time per row.

    python3 tests/lab00/check_probe.py runs/lab00/<run id>/probe.json --world-size 2 --max-bytes 65536
    python3 tests/lab00/check_probe.py --selftest      # the checker catches planted faults
Standard library only. Exit status 0 when every check holds; otherwise each failure is printed.
"""
import argparse
import json
import math
import sys

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv")


def expected_ops(n):
    """The ops whose rows a sweep of n ranks has: sendrecv needs a peer."""
    return OPS if n > 1 else tuple(op for op in OPS if op != "sendrecv")
REL_TOL = 1e-9  # the program computes in double from the same two numbers; only rounding differs


def bus_factor(op, n):
    if n == 1:
        return None
    return {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n,
            "reduce_scatter": (n - 1) / n, "broadcast": 1.0, "sendrecv": 1.0}[op]


def check(probe, world_size, max_bytes):
    failures = []
    n = probe.get("world_size")
    if n != world_size:
        failures.append(f"world_size is {n}, expected {world_size}")
        return failures
    rows = probe["sweep"]["rows"]
    for op in expected_ops(n):
        sizes = [r["size_bytes"] for r in rows if r["op"] == op]
        if not sizes:
            failures.append(f"{op}: no rows")
        elif max_bytes and max(sizes) != max_bytes:
            failures.append(f"{op}: largest size {max(sizes)} bytes, expected {max_bytes}")
    for r in rows:
        where = f"{r['op']} {r['size_bytes']} B"
        t_s = r["time_ms"] / 1e3
        if not t_s > 0:
            failures.append(f"{where}: time_ms {r['time_ms']} is not positive")
            continue
        if r["elements"] * 4 != r["size_bytes"]:
            failures.append(f"{where}: {r['elements']} f32 elements are not {r['size_bytes']} bytes")
        if r["op"] in ("all_gather", "reduce_scatter") and r["elements"] % n:
            failures.append(f"{where}: {r['elements']} elements do not split into {n} equal chunks")
        if r["wrong"] != 0:
            failures.append(f"{where}: {r['wrong']} elements came back wrong")
        algbw = r["size_bytes"] / t_s
        if not math.isclose(r["algbw_bytes_per_s"], algbw, rel_tol=REL_TOL):
            failures.append(f"{where}: algbw {r['algbw_bytes_per_s']} != S / t = {algbw}")
        factor = bus_factor(r["op"], n)
        if factor is None:
            if r["busbw_bytes_per_s"] is not None:
                failures.append(f"{where}: busbw {r['busbw_bytes_per_s']} with one rank, expected null (n/a)")
        elif r["busbw_bytes_per_s"] is None or not math.isclose(r["busbw_bytes_per_s"], algbw * factor,
                                                                rel_tol=REL_TOL):
            failures.append(f"{where}: busbw {r['busbw_bytes_per_s']} != algbw x {factor:.4f} = {algbw * factor}")
    return failures


def selftest():
    """The checker must catch what it is for: a busbw with the wrong factor, a wrong algbw, a wrong
    result, a busbw with one rank. Each planted fault must be reported; the clean table must pass."""
    def table(n):
        rows = []
        for op in expected_ops(n):
            for size in (64, 1024):
                t_ms = 0.01 * size / 64
                algbw = size / (t_ms / 1e3)
                factor = bus_factor(op, n)
                rows.append({"op": op, "size_bytes": size, "elements": size // 4, "time_ms": t_ms,
                             "algbw_bytes_per_s": algbw, "wrong": 0,
                             "busbw_bytes_per_s": None if factor is None else algbw * factor})
        return {"world_size": n, "sweep": {"rows": rows}}

    problems = []
    for n in (1, 2, 4):
        if check(table(n), n, 1024):
            problems.append(f"a correct {n}-rank table was rejected: {check(table(n), n, 1024)}")
    faults = {
        "all_reduce busbw with the all_gather factor (n-1)/n":
            lambda r: r.update(busbw_bytes_per_s=r["algbw_bytes_per_s"] * 3 / 4) if r["op"] == "all_reduce" else None,
        "algbw on the per-rank chunk instead of the total":
            lambda r: r.update(algbw_bytes_per_s=r["algbw_bytes_per_s"] / 4) if r["op"] == "all_gather" else None,
        "a wrong result": lambda r: r.update(wrong=3) if r["op"] == "broadcast" else None,
        "sendrecv busbw with the all_reduce factor 2(n-1)/n":
            lambda r: r.update(busbw_bytes_per_s=r["algbw_bytes_per_s"] * 1.5) if r["op"] == "sendrecv" else None,
    }
    for name, plant in faults.items():
        t = table(4)
        for r in t["sweep"]["rows"]:
            plant(r)
        if not check(t, 4, 1024):
            problems.append(f"not caught: {name}")
    one = table(1)
    one["sweep"]["rows"][0]["busbw_bytes_per_s"] = 1.0
    if not check(one, 1, 1024):
        problems.append("not caught: a busbw with one rank")
    for p in problems:
        print("FAIL", p)
    if not problems:
        print(f"ok: the checker accepts correct tables and catches {len(faults) + 1} planted faults")
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe_json", nargs="?")
    ap.add_argument("--world-size", type=int)
    ap.add_argument("--max-bytes", type=int, default=0, help="the sweep's --max-bytes (0: not checked)")
    ap.add_argument("--selftest", action="store_true", help="check the checker on planted faults")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if not args.probe_json or not args.world_size:
        ap.error("give probe.json and --world-size")
    with open(args.probe_json) as f:
        probe = json.load(f)
    failures = check(probe, args.world_size, args.max_bytes)
    rows = probe["sweep"]["rows"]
    if failures:
        for msg in failures:
            print("FAIL", msg)
        return 1
    print(f"ok: {len(rows)} rows, {args.world_size} rank(s): algbw = S/t and busbw = algbw x factor in every row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
