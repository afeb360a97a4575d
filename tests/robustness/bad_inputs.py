#!/usr/bin/env python3
"""bad_inputs.py — bad options, data, checkpoints, rank faults and script arguments, each a case with the verdict
it must get: a clear error (non-zero exit, the words the message must contain) or success. ctest
robustness.bad_inputs (tests/robustness/CMakeLists.txt); about 900 cases in 75 s on 2 cores (two at a time).

A case fails on a crash (a signal, or the C library's heap-corruption words), on a hang (its hard timeout:
the whole process group is killed), on a bad value accepted (exit 0 where an error was expected), on an
error without the words (the option, the value), or on CLI11's unhelpful ones ("Could not convert", a
309-digit range). The recoveries (damaged checkpoints, disk full, a killed rank under scripts/supervise) are
tested bit for bit where they live: tests/lab08 and tests/robustness/test_supervise.py.

  tests/robustness/bad_inputs.py --build-dir build                  # every case
  tests/robustness/bad_inputs.py --build-dir build --only steps     # cases whose name contains "steps"
  tests/robustness/bad_inputs.py --build-dir build --list           # the cases, not run

The option cases are made from each program's --help (every lab program, lab 00's probe and the tools:
sl_plan, sl_calibrate, sl_make_shards, sl_memory): every option that takes a number gets the values that no
numeric option of the kit accepts (a word, -5, a number beyond its type; nan and inf for a real number).
Ranks that read different files under one option (each its own node's disk) are run with mpirun's -wdir per
rank: a copy of --data with one shard another, a checkpoint directory without the newest checkpoint.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
# Words that say a program crashed rather than refused (glibc's heap checks, a signal, MPI's report of one).
CRASH_WORDS = ["Segmentation fault", "malloc(): ", "free(): ", "malloc_consolidate", "corrupted size",
               "double free", "exited on signal", "core dumped", "terminate called", "Traceback (most recent"]
# Words a clear error never has (CLI11's defaults for a value out of a type's range or a range check).
UNCLEAR_WORDS = ["Could not convert", "1797693134862315708"]


class Case:
    """One bad input: `argv` run from the repository root; `expect` 'error' (exit != 0, every `words`
    in the output) or 'ok' (exit 0); `timeout_s` hard."""

    def __init__(self, name, argv, expect="error", words=(), timeout_s=30, forbid=()):
        self.name, self.argv, self.expect, self.words, self.timeout_s = name, argv, expect, list(words), timeout_s
        self.forbid = list(forbid)


def with_options(base, *pairs):
    """`base` (a list of options and values) with each (option, value) of `pairs` set: replaced where base has
    the option (CLI11 refuses an option given twice), appended where it has not."""
    out = list(base)
    for opt, value in pairs:
        if opt in out:
            out[out.index(opt) + 1] = value
        else:
            out += [opt, value]
    return out


def without_option(base, opt):
    """`base` (a list of options and values) without `opt` and the value after it."""
    if opt not in base:
        return list(base)
    i = base.index(opt)
    return base[:i] + base[i + 2:]


def mpirun(np_args):
    """mpirun with one process per core or more (--oversubscribe) and the given program parts."""
    return ["mpirun", "--oversubscribe", "--bind-to", "none"] + np_args


def numeric_options(program):
    """(option, type) of every option of `program --help` that takes a number: INT, UINT or FLOAT."""
    out = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=30).stdout
    opts = []
    for line in out.splitlines():
        m = re.match(r"\s+((?:-\w,)?--[\w-]+)(?:,--[\w-]+)*\s+(INT|UINT|FLOAT)\b", line)
        if m:
            opts.append((m.group(1).split(",")[-1], m.group(2)))
    return opts


def bad_values(kind):
    """Values no numeric option of the kit accepts, for an option of this CLI11 type."""
    if kind == "FLOAT":
        return ["nan", "inf", "-5", "abc"]
    if kind == "UINT":
        return ["-5", "abc", "99999999999999999999"]
    return ["-5", "abc", "99999999999"]


def option_cases(programs):
    cases = []
    for label, program, base in programs:
        opts = numeric_options(program)
        if not opts:
            cases.append(Case(f"{label} --help lists its numeric options", [program, "--help"], "error",
                              ["(no numeric option found in --help)"]))
        for opt, kind in opts:
            for v in bad_values(kind):
                # option=value: a value that starts with '-' is not taken for an option; the base's own
                # value of that option left out (CLI11 refuses an option given twice)
                cases.append(Case(f"{label} {opt} {v}", [program] + without_option(base, opt) + [f"{opt}={v}"],
                                  "error", [opt, v], timeout_s=20))
    return cases


def lab00_base(tmp):
    """Lab 00's quick probe (no GEMM, a 64 KiB sweep of 2 timed calls), its output under `tmp`."""
    return ["--skip-gemm", "--max-bytes", "64K", "--iters", "2", "--warmup", "2", "--memcpy-bytes", "64K",
            "--threads", "1", "--log-dir", os.path.join(tmp, "runs")]


def fixed_cases(build, data, tmp):
    """The cases that are not one option's value: ranks that disagree, rank options beyond the world, data,
    checkpoints, scripts."""
    ref = os.path.join(build, "bin", "reference")
    lab = {n: os.path.join(ref, p) for n, p in [("01", "lab01_single_device"), ("02", "lab02_data_pipeline"),
                                               ("03", "lab03_ddp"), ("04", "lab04_fsdp"),
                                               ("05", "lab05_tensor_parallel"), ("06", "lab06_pipeline_parallel"),
                                               ("07", "lab07_parallel_3d"), ("08", "lab08_resilience")]}
    quick = ["--data", data, "--model", "tiny", "--seq-len", "16", "--threads", "1", "--val-batches", "1",
             "--sample-tokens", "0", "--quiet", "--log-dir", os.path.join(tmp, "runs")]
    cases = []
    # Ranks started with other options (mpirun's MPMD form): every rank stops naming the option, no crash.
    for n, opt, a, b in [("03", "--steps", "6", "9"), ("08", "--steps", "6", "9"), ("04", "--lr", "0.002", "0.01"),
                         ("03", "--micro-batch", "2", "3"), ("05", "--seed", "1", "2"), ("06", "--micro-batches", "2", "4"),
                         ("07", "--weight-decay", "0.1", "0"), ("08", "--spike-z", "3", "4"),
                         ("04", "--stage", "1", "3"), ("03", "--mode", "naive", "overlap")]:
        cmd = mpirun(["-np", "1", lab[n]] + quick + [opt, a, ":", "-np", "1", lab[n]] + quick + [opt, b])
        cases.append(Case(f"lab{n} ranks with {opt} {a} and {b}", cmd, "error",
                          ["different options", opt, f"rank 0 '{a}'", f"rank 1 '{b}'"], timeout_s=60))
    cases.append(Case("lab03 ranks of two programs", mpirun(["-np", "1", lab["03"]] + quick + [":", "-np", "1",
                                                                                            lab["04"]] + quick),
                      "error", ["different options", "program"], timeout_s=60))
    cases.append(Case("lab03 ranks that agree (2e-3 and 0.002 are one value)",
                      mpirun(["-np", "1", lab["03"]] + quick + ["--steps", "2", "--lr", "2e-3", ":", "-np", "1",
                                                                 lab["03"]] + quick + ["--steps", "2", "--lr", "0.002"]),
                      "ok", timeout_s=90))
    # Ranks that read other files under the same option (each node its own disk: mpirun's -wdir per rank
    # here): every rank stops, naming the shard or the checkpoint and the ranks.
    node = {x: os.path.join(tmp, "node_" + x) for x in "ABC"}
    for x in "ABC":
        shutil.copytree(data, os.path.join(node[x], "kjv"))
    train_shards = sorted(f for f in os.listdir(data) if f.startswith("train_"))
    other = os.path.join(node["B"], "kjv", train_shards[-1])  # node B: its last train shard another one
    shutil.copyfile(os.path.join(data, train_shards[0]), other)
    here = with_options(quick, ("--data", "kjv"), ("--log-dir", "runs"))  # relative to each rank's -wdir

    def on_nodes(prog, a, b, extra=()):
        return mpirun(["-np", "1", "-wdir", node[a], prog] + here + list(extra) +
                      [":", "-np", "1", "-wdir", node[b], prog] + here + list(extra))

    for n in ["03", "08"]:
        cases.append(Case(f"lab{n} ranks whose --data has another {train_shards[-1]}", on_nodes(lab[n], "A", "B"),
                          "error", ["read different data", f"--data {train_shards[-1]}", "rank 0 '", "rank 1 '",
                                    "rank 0 of 2 stops", "rank 1 of 2 stops"], timeout_s=60))
    cases.append(Case("lab03 ranks whose --data are equal copies", on_nodes(lab["03"], "A", "C", ["--steps", "2"]),
                      "ok", timeout_s=90))
    # Checkpoints: node A saves steps 2 and 4 (2 ranks), node C gets a copy without the newest: resuming,
    # rank 0 (node A) would load step 4 and rank 1 (node C) step 2.
    resume = ["--checkpoint-dir", "ckpt", "--checkpoint-every", "2", "--resume", "latest"]
    save = " ".join(mpirun(["-np", "2", "-wdir", node["A"], lab["08"]] + here + resume + ["--steps", "4"]))
    copy = f"rm -rf {node['C']}/ckpt && cp -r {node['A']}/ckpt {node['C']}/ckpt"
    drop = f"rm -rf $(ls -d {node['C']}/ckpt/step_* | sort | tail -1)"
    both = " ".join(on_nodes(lab["08"], "A", "C", resume + ["--steps", "6"]))
    cases.append(Case("lab08 ranks that would resume different checkpoints",
                      ["bash", "-c", f"{save} >/dev/null && {copy} && {drop} && {both}"], "error",
                      ["read different data", "--resume checkpoint", "rank 0 'step 4", "rank 1 'step 2",
                       "rank 0 of 2 stops", "rank 1 of 2 stops"], timeout_s=120))
    # A quiet rank (alive, silent: --fail-mode hang, no supervisor): the wait timeout names it, no hang.
    cases.append(Case("lab08 a rank that hangs, named by the wait timeout",
                      mpirun(["-np", "2", lab["08"]] + quick + ["--steps", "6", "--fail-at-step", "3", "--fail-rank",
                                                                "1", "--fail-mode", "hang", "--wait-timeout-s", "10"]),
                      "error", ["injected fault (hang)", "have not called it: rank 1", "have stopped or are slow"],
                      timeout_s=90))
    # Rank options beyond the world (checked once the world size is known).
    for n, opt in [("08", "--fail-rank"), ("08", "--poison-rank"), ("04", "--slow-rank")]:
        cases.append(Case(f"lab{n} {opt} 5 on 2 ranks", mpirun(["-np", "2", lab[n]] + quick + [opt, "5"]), "error",
                          [opt, "5", "no such rank", "2 ranks"], timeout_s=60))
    cases.append(Case("lab08 --slow-rank 7 on 2 ranks", mpirun(["-np", "2", lab["08"]] + quick +
                                                              ["--slow-rank", "7", "--uniform-compute-ms", "1"]),
                      "error", ["--slow-rank", "no such rank"], timeout_s=60))
    # Data.
    empty = os.path.join(tmp, "empty_data")
    os.makedirs(empty, exist_ok=True)
    for n in ["01", "02"]:
        cases.append(Case(f"lab{n} --data that does not exist", [lab[n]] + with_options(quick, ("--data", "/nonexistent/kjv")),
                          "error", ["/nonexistent/kjv"]))
        cases.append(Case(f"lab{n} --data without shards", [lab[n]] + with_options(quick, ("--data", empty)), "error", [empty]))
    cases.append(Case("lab03 --data that does not exist, 2 ranks",
                      mpirun(["-np", "2", lab["03"]] + with_options(quick, ("--data", "/nonexistent/kjv"))), "error",
                      ["/nonexistent/kjv"], timeout_s=60))
    cases.append(Case("lab01 --seq-len above the model's", [lab["01"]] + with_options(quick, ("--seq-len", "4096")), "error",
                      ["--seq-len", "max_seq_len"]))
    cases.append(Case("lab01 --model unknown", [lab["01"]] + with_options(quick, ("--model", "d1000")), "error", ["d1000"]))
    # Checkpoints.
    a_file = os.path.join(tmp, "a_file")
    with open(a_file, "w") as f:
        f.write("not a directory\n")
    cases.append(Case("lab01 --resume a file that does not exist", [lab["01"]] + quick +
                      ["--resume", "/nonexistent/ckpt_3.bin"], "error", ["/nonexistent/ckpt_3.bin"]))
    cases.append(Case("lab01 --resume a file that is not a checkpoint", [lab["01"]] + quick + ["--resume", a_file],
                      "error", [a_file]))
    cases.append(Case("lab08 --resume latest without --checkpoint-dir",
                      mpirun(["-np", "2", lab["08"]] + quick + ["--resume", "latest"]), "error",
                      ["--checkpoint-dir"], timeout_s=60))
    cases.append(Case("lab08 --resume sometimes", mpirun(["-np", "2", lab["08"]] + quick + ["--resume", "sometimes"]),
                      "error", ["--resume"], timeout_s=60))
    # Directories that cannot be written, found before the first step with the real cause.
    for n in ["01", "08"]:
        run = [lab[n]] if n == "01" else mpirun(["-np", "2", lab[n]])
        cases.append(Case(f"lab{n} --log-dir inside a file", run + with_options(quick, ("--log-dir", a_file + "/runs")),
                          "error", ["--log-dir", "is not a directory"], timeout_s=60))
        cases.append(Case(f"lab{n} --checkpoint-dir inside a file",
                          run + quick + ["--checkpoint-dir", a_file + "/ckpt"], "error",
                          ["--checkpoint-dir", a_file, "is not a directory"], timeout_s=60))
    # A token outside the vocabulary: refused when the shard is opened, naming the shard and the position.
    bad_data = os.path.join(tmp, "bad_token_data")
    shutil.copytree(data, bad_data)
    shard = os.path.join(bad_data, "train_000000.bin")
    with open(shard, "r+b") as f:
        f.seek(4096)  # past the header: two bytes of a 2-byte token
        f.write(b"\xff\xff")
    for n in ["01", "02"]:
        cases.append(Case(f"lab{n} a token outside the vocabulary", [lab[n]] + with_options(quick, ("--data", bad_data)),
                          "error", ["train_000000.bin", "outside the vocabulary", "position"]))
    # Words instead of names.
    for n, opt, v in [("01", "--device", "tpu"), ("01", "--precision", "fp8"), ("01", "--optimizer", "lion"),
                      ("01", "--recompute", "some"), ("01", "--attention", "fast"), ("04", "--overlap", "maybe")]:
        cases.append(Case(f"lab{n} {opt} {v}", [lab[n]] + quick + [opt, v], "error", [v]))
    # Lab 00's sizes (text with K, M, G: not in --help as numbers) and its ranks that disagree.
    probe = [os.path.join(build, "bin", "lab00_setup")] + lab00_base(tmp)
    for opt in ["--min-bytes", "--max-bytes", "--memcpy-bytes"]:
        for v in ["0", "-5", "abc", "8X", "2048G", "99999999999999999999"]:
            cases.append(Case(f"lab00 {opt} {v}", with_options(probe, (opt, v)), "error", [opt, v]))
    cases.append(Case("lab00 --min-bytes above --max-bytes", with_options(probe, ("--min-bytes", "1M")), "error",
                      ["--min-bytes", "--max-bytes"]))
    cases.append(Case("lab00 ranks with --iters 2 and 3",
                      mpirun(["-np", "1"] + probe + [":", "-np", "1"] + with_options(probe, ("--iters", "3"))),
                      "error", ["different options", "--iters", "rank 0 '2'", "rank 1 '3'"], timeout_s=60))
    cases.append(Case("lab00 ranks that agree", mpirun(["-np", "2"] + probe), "ok", timeout_s=60))
    # The tools: sl_make_shards's cross checks.
    shards = os.path.join(build, "bin", "sl_make_shards")
    cases.append(Case("sl_make_shards an input that does not exist",
                      [shards, "/nonexistent/kjv.txt", "--out-dir", os.path.join(tmp, "shards")], "error",
                      ["/nonexistent/kjv.txt"]))
    cases.append(Case("sl_make_shards --check a directory that does not exist", [shards, "--check", "/nonexistent/kjv"],
                      "error", ["/nonexistent/kjv"]))
    memory = os.path.join(build, "bin", "sl_memory")
    cases.append(Case("sl_memory --model and --psi", [memory, "--model", "tiny", "--psi", "7e9"], "error",
                      ["--model", "--psi"]))
    # The planner.
    plan = os.path.join(build, "bin", "sl_plan")
    cases.append(Case("sl_plan --memory-gb inf", [plan, "--model", "d12", "--memory-gb", "inf"], "error",
                      ["--memory-gb", "inf", "finite"]))
    cases.append(Case("sl_plan --gpus 0", [plan, "--model", "d12", "--gpus", "0"], "error", ["--gpus", "0"]))
    cases.append(Case("sl_plan --efficiency 1.5", [plan, "--model", "d12", "--efficiency", "1.5"], "error",
                      ["--efficiency", "1.5", "<= 1"]))
    cases.append(Case("sl_plan --model unknown", [plan, "--model", "d1000"], "error", ["d1000"]))
    # Scripts.
    cases.append(Case("scripts/grade 99", [os.path.join(REPO, "scripts", "grade"), "99", "--build-dir", build],
                      "error", ["99"], forbid=["hint 99-"]))
    cases.append(Case("scripts/supervise a command that cannot start",
                      [os.path.join(REPO, "scripts", "supervise"), "--", "/nonexistent/prog"], "error",
                      ["/nonexistent/prog"]))
    return cases


def verdict(case, rc, out, timed_out):
    """'' when the case got what it expects, else why not."""
    if timed_out:
        return f"hung: no answer within {case.timeout_s} s (killed)"
    if rc < 0:
        return f"crashed: signal {-rc}"
    for w in CRASH_WORDS:
        if w in out:
            return f"crashed: '{w}' in the output"
    if case.expect == "ok":
        return "" if rc == 0 else f"exit {rc}, expected success"
    if rc == 0:
        return "accepted: exit 0 where an error was expected"
    missing = [w for w in case.words if w not in out]
    if missing:
        return "the error does not say " + ", ".join(repr(w) for w in missing)
    for w in UNCLEAR_WORDS + case.forbid:
        if w in out:
            return f"an unclear error: '{w}'"
    if re.search(r"\d{40}", out):
        return "an unclear error: a number of 40 digits or more"
    return ""


def run_case(case, env):
    p = subprocess.Popen(case.argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=case.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        # The whole group: SIGTERM first, so that mpirun ends its ranks (killed at once, it cannot, and they
        # live on), SIGKILL after 5 s.
        os.killpg(p.pid, signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        timed_out = True
    out = out.decode(errors="replace")
    return verdict(case, p.returncode, out, timed_out), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--data", default=os.path.join(REPO, "data", "kjv"))
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="print the cases, run none")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    ref = os.path.join(build, "bin", "reference")
    tmp = tempfile.mkdtemp(prefix="sl_bad_inputs_")
    programs = [(f"lab{p[3:5]}", os.path.join(ref, p), []) for p in sorted(os.listdir(ref)) if p.startswith("lab")]
    # Every other program with numeric options, with the options that keep a run short should a bad value
    # be accepted (no cache written, nothing in the repository).
    bindir = os.path.join(build, "bin")
    programs += [("lab00", os.path.join(bindir, "lab00_setup"), lab00_base(tmp)),
                 ("sl_plan", os.path.join(bindir, "sl_plan"), ["--model", "d12"]),
                 ("sl_calibrate", os.path.join(bindir, "sl_calibrate"), ["--no-cache"]),
                 ("sl_make_shards", os.path.join(bindir, "sl_make_shards"), []),
                 ("sl_memory", os.path.join(bindir, "sl_memory"), ["--model", "tiny"])]
    try:
        cases = option_cases(programs) + fixed_cases(build, os.path.abspath(a.data), tmp)
        cases = [c for c in cases if a.only in c.name]
        if a.list:
            for c in cases:
                print(f"{c.name}: {c.expect} {c.words}")
            return 0
        env = dict(os.environ, **MPI_ENV)
        failed = 0
        with ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for case, (why, out) in zip(cases, pool.map(lambda c: run_case(c, env), cases)):
                if why:
                    failed += 1
                    tail = "\n    ".join(out.strip().splitlines()[-6:])
                    print(f"FAIL {case.name}: {why}\n  $ {' '.join(case.argv)}\n    {tail}")
        print(f"{len(cases) - failed} of {len(cases)} bad-input cases got their verdict")
        return 1 if failed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
