#!/usr/bin/env python3
"""scripts/lib/labs.py — the labs the kit knows: each lab's manifest, labs/NN_name/lab.json, read once.

A lab is one unit: its folders and its manifest (docs/design.md "A lab is one unit"). CMake reads the
manifests (cmake/scalelab.cmake sl_read_lab_manifests), builds each lab, and writes <build>/labs.json: the
same manifests plus what the build made of them (program paths per track). Every script reads the labs
through this file: from <build>/labs.json where a build is given and configured, else from the manifests
themselves (scripts/hint, and scripts/run before its first configure). Python standard library only.

The manifest's fields (FIELDS below; docs/design.md lists them with an example):
  number, name     "03", "ddp": the folders labs/03_ddp/ and solutions/03_ddp/
  title            one line: the lab's short name in tables ("03 DDP" in the scale demo's)
  you_write        what the learner writes: the README's labs table
  graded_on        what the checks hold the code to: docs/design.md's labs table
  twins            the TODO files, labs/NN_name/<f> and solutions/NN_name/<f> (sl_add_lab's SOURCES); [] for a
                   lab without TODOs (nothing to grade)
  given            the lab's given code, compiled into both tracks (sl_add_lab's GIVEN)
  driver           the lab's program ("main.cpp") or null
  deps             what the lab's libraries link: "NN" is lab NN's reference (labNN_ref; an earlier lab, or a
                   later one that does not link this one back: lab 07 links lab 10's ring), any other name a
                   target the lab's own labs/NN_name/lab.cmake defines
  program_deps     what the program alone links besides (lab 02: lab 01's training step)
  notes            for the reader: why these deps, what is special (JSON has no comments)
  ranks            {"default": N, "allowed": "any" | [n, ...]}; [1]: one process, run without mpirun
  corpus           true when the program trains on data/kjv (scripts/run makes it when missing)
  tests            the test folders tests/CMakeLists.txt adds ("tests/lab03"); the graded checks among them
  notebooks        the notebooks that plot the lab's runs ("notebooks/03_ddp.ipynb")
  notebook_logs    the shell snippet scripts/notebooks.sh --make-logs sources to make their runs, or null
  scale_demo       the lab's rows in scripts/scale_demo.sh, or null: {"args": [...], "skip": [{"if": ..., "why":
                   ...}], "table_note": null | "batch" | "pipeline" | "grid", "why": "..."}; see scale_row()
  sim              the lab program's run on the simulated GPU cluster in CI (tests/drivers/check_sim.py, label
                   sim), or null: {"ranks": N, "args": [...], "why": "..."}; N among the lab's allowed ranks; args
                   the lab's own options (the check adds --device sim, --backend sim on more than one rank, and a
                   tiny model for a few steps)

Command line (bash scripts use it; `--build-dir B` reads B/labs.json where it exists):
  labs.py list [--graded|--program|--notebooks|--scale-demo|--sim] [--build-dir B]   the numbers, one a line
  labs.py shell NN [--track learner|reference] [--build-dir B]   shell assignments lab_* (lab_exists=0: none)
  labs.py scale-row NN N=8 B=4 G=32 S=3 heads=4 layers=4 model=demo node=8 grid_tp=2 grid_pp=2 T=64 device=cpu
                                               "skip" + why, or "run" + one arg a line
  labs.py check [--root R]                     every manifest against its folders (exit 1 with a list)
  labs.py tables [--write] [--root R]          the labs tables of README.md and docs/design.md against the
                                               manifests (--write rewrites them)
"""
import argparse
import ast
import glob
import json
import math
import os
import re
import shlex
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# field -> (the JSON types it may hold, required). Checked by load() (a wrong type stops every script with
# the file and field named) and by check() (which also looks at the files the fields name).
FIELDS = {
    "number": (str, True), "name": (str, True), "title": (str, True), "you_write": (str, True),
    "graded_on": (str, True), "twins": (list, True), "given": (list, False), "driver": ((str, type(None)), True),
    "deps": (list, False), "program_deps": (list, False), "notes": (str, False), "ranks": (dict, True),
    "corpus": (bool, True), "tests": (list, True), "notebooks": (list, False),
    "notebook_logs": ((str, type(None)), False), "scale_demo": ((dict, type(None)), False),
    "sim": ((dict, type(None)), False),
}
DEFAULTS = {"given": [], "deps": [], "program_deps": [], "notes": "", "notebooks": [], "notebook_logs": None,
            "scale_demo": None, "sim": None}
SCALE_NOTES = (None, "batch", "pipeline", "grid")  # scripts/scale_demo_table.py: what a row's note adds
# What the readers add (and <build>/labs.json holds besides the manifest): the lab's folders, whether it
# is graded, whether its program is one process, and the build's programs per track.
DERIVED = ("dir", "solutions_dir", "graded", "single_process", "programs")
TABLE_BEGIN = "<!-- labs table: generated from labs/*/lab.json by `python3 scripts/lib/labs.py tables --write` -->"
TABLE_END = "<!-- end of labs table -->"


class ManifestError(Exception):
    """A manifest that cannot be read: the message names the file and what to fix."""


# ---------------------------------------------------------------------------------------------
# Reading

def manifest_paths(root=REPO):
    """labs/NN_name/lab.json, in number order."""
    return sorted(glob.glob(os.path.join(root, "labs", "[0-9][0-9]_*", "lab.json")))


def read_manifest(path, root=REPO):
    """One manifest as a dict, with defaults filled in and dir, solutions_dir, graded, single_process added."""
    rel = os.path.relpath(path, root)
    try:
        with open(path, encoding="utf-8") as f:
            lab = json.load(f)
    except (OSError, ValueError) as e:
        raise ManifestError(f"{rel}: not readable JSON ({e})")
    derived = sorted(set(lab) & set(DERIVED)) if isinstance(lab, dict) else []
    if derived:
        raise ManifestError(f"{rel}: {', '.join(derived)}: made by the readers, not written in a manifest")
    return _normalize(lab, rel, folder=os.path.basename(os.path.dirname(path)))


def _normalize(lab, where, folder=None):
    """Checks the fields' types, fills in the optional ones, adds the derived ones (dir, solutions_dir,
    graded: the lab has TODOs; single_process: ranks allowed [1]; programs: None until a build says)."""
    if not isinstance(lab, dict):
        raise ManifestError(f"{where}: holds {type(lab).__name__}, not an object")
    for key, (types, required) in FIELDS.items():
        if key not in lab:
            if required:
                raise ManifestError(f"{where}: no \"{key}\" (the fields: scripts/lib/labs.py)")
            lab[key] = DEFAULTS[key]
        elif not isinstance(lab[key], types):
            raise ManifestError(f"{where}: \"{key}\" is {json.dumps(lab[key])}, not a {_type_words(types)}")
    unknown = sorted(set(lab) - set(FIELDS) - set(DERIVED))
    if unknown:
        raise ManifestError(f"{where}: unknown field(s) {', '.join(unknown)} (the fields: scripts/lib/labs.py)")
    folder = folder or f"{lab['number']}_{lab['name']}"
    if f"{lab['number']}_{lab['name']}" != folder or not re.fullmatch(r"\d\d", lab["number"]):
        raise ManifestError(f"{where}: number \"{lab['number']}\" and name \"{lab['name']}\" must spell the "
                            f"folder {folder} (two digits, '_', the name)")
    ranks = lab["ranks"]
    allowed = ranks.get("allowed")
    if not (isinstance(ranks.get("default"), int) and ranks["default"] >= 1 and
            (allowed == "any" or (isinstance(allowed, list) and allowed and
                                  all(isinstance(n, int) and n >= 1 for n in allowed)))):
        raise ManifestError(f"{where}: \"ranks\" is {json.dumps(ranks)}, not {{\"default\": N >= 1, "
                            f"\"allowed\": \"any\" or [N, ...]}}")
    lab.setdefault("dir", f"labs/{folder}")
    lab.setdefault("solutions_dir", f"solutions/{folder}")
    lab.setdefault("graded", bool(lab["twins"]))
    lab.setdefault("single_process", allowed == [1])
    lab.setdefault("programs", None)
    return lab


def _type_words(types):
    types = types if isinstance(types, tuple) else (types,)
    names = {str: "string", list: "list", dict: "object", bool: "true/false", type(None): "null"}
    return " or ".join(names[t] for t in types)


def load(root=REPO, build_dir=None):
    """Every lab, in number order: from <build_dir>/labs.json where it exists (with "programs": per track
    {"target", "path"} or null), else from the manifests (with "programs": None)."""
    if build_dir:
        path = os.path.join(build_dir, "labs.json")
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
                labs = [_normalize(lab, f"{path}: lab {lab.get('number')}") for lab in doc["labs"]]
                return sorted(labs, key=lambda lab: lab["number"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ManifestError(f"{path}: not readable ({e}); configure again: cmake -S {root} -B {build_dir}")
    return [read_manifest(p, root) for p in manifest_paths(root)]


def find(number, root=REPO, build_dir=None):
    """The lab with this two-digit number, or None."""
    return next((lab for lab in load(root, build_dir) if lab["number"] == number), None)


# ---------------------------------------------------------------------------------------------
# Checking a manifest against its folders (lint.lab_manifests)

def lab_deps_closure(numbers, number):
    """The lab numbers whose references lab `number` links, directly or through them (its "deps")."""
    seen, todo = set(), [number]
    while todo:
        for d in numbers.get(todo.pop(), {}).get("deps", []):
            if re.fullmatch(r"\d\d", d) and d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def check(root=REPO):
    """Problems of every manifest, one line each: unreadable fields, files that are not there, twins that are
    not solutions/'s, dependencies on labs without TODOs or in a cycle, notebooks no manifest names."""
    problems, labs = [], []
    for path in manifest_paths(root):
        try:
            labs.append(read_manifest(path, root))
        except ManifestError as e:
            problems.append(str(e))
    folders = sorted(os.path.basename(d) for d in glob.glob(os.path.join(root, "labs", "[0-9][0-9]_*"))
                     if os.path.isdir(d))
    for folder in folders:
        if not os.path.isfile(os.path.join(root, "labs", folder, "lab.json")):
            problems.append(f"labs/{folder}: no lab.json (a lab is its folders and its manifest)")
    numbers = {lab["number"]: lab for lab in labs}
    for lab in labs:
        rel = f"{lab['dir']}/lab.json"
        exists = lambda p: os.path.isfile(os.path.join(root, p))  # noqa: E731
        for f in lab["twins"]:
            for d in (lab["dir"], lab["solutions_dir"]):
                if not exists(f"{d}/{f}"):
                    problems.append(f"{rel}: twin {d}/{f} does not exist")
        sol = os.path.join(root, lab["solutions_dir"])
        if os.path.isdir(sol):
            extra = sorted(set(os.listdir(sol)) - set(lab["twins"]))
            if extra:
                problems.append(f"{rel}: {lab['solutions_dir']}/ holds {', '.join(extra)}, "
                                f"which \"twins\" does not name")
        elif lab["twins"]:
            problems.append(f"{rel}: \"twins\" names files, but {lab['solutions_dir']}/ does not exist")
        for key in ("given", "driver"):
            for f in lab[key] if key == "given" else [lab[key]] if lab[key] else []:
                if not exists(f"{lab['dir']}/{f}"):
                    problems.append(f"{rel}: {key} {lab['dir']}/{f} does not exist")
        for key in ("deps", "program_deps"):
            for d in lab[key]:
                if re.fullmatch(r"\d\d", d):
                    other = numbers.get(d)
                    if other is None or not other["twins"] or d == lab["number"]:
                        problems.append(f"{rel}: {key} \"{d}\" is not another lab with TODOs (lab{d}_ref)")
                    elif d > lab["number"] and lab["number"] in lab_deps_closure(numbers, d):
                        # A later lab's reference is fine (lab 07 links lab 10's ring) unless it links this lab
                        # back: two static libraries needing each other.
                        problems.append(f"{rel}: {key} \"{d}\" links lab {lab['number']} back (a cycle of "
                                        f"references)")
                elif re.fullmatch(r"scalelab_[a-z_]+", d):
                    pass  # a library of common/ (scalelab_driver): common/CMakeLists.txt makes it
                elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", d) or not exists(f"{lab['dir']}/lab.cmake"):
                    problems.append(f"{rel}: {key} \"{d}\" is neither a lab number, a library of common/ "
                                    f"(scalelab_*) nor a target of {lab['dir']}/lab.cmake")
        if lab["graded"] and not lab["driver"] and lab["program_deps"]:
            problems.append(f"{rel}: \"program_deps\" without a \"driver\"")
        if lab["ranks"]["allowed"] != "any" and lab["ranks"]["default"] not in lab["ranks"]["allowed"]:
            problems.append(f"{rel}: ranks: the default {lab['ranks']['default']} is not among "
                            f"{lab['ranks']['allowed']}")
        for t in lab["tests"]:
            if not exists(f"{t}/CMakeLists.txt"):
                problems.append(f"{rel}: test folder {t}/CMakeLists.txt does not exist")
        graded = any(f"sl_add_graded_test({lab['number']} " in _read(os.path.join(root, t, "CMakeLists.txt"))
                     for t in lab["tests"])
        if lab["twins"] and not graded:
            problems.append(f"{rel}: the lab has TODOs but no folder of \"tests\" adds graded checks "
                            f"(sl_add_graded_test({lab['number']} ...))")
        if not lab["twins"] and graded:
            problems.append(f"{rel}: graded checks, but no \"twins\" to grade")
        if lab["twins"] and not exists(f"{lab['dir']}/hints.md"):
            problems.append(f"{rel}: the lab has TODOs but no {lab['dir']}/hints.md (scripts/hint)")
        if not exists(f"{lab['dir']}/README.md"):
            problems.append(f"{rel}: {lab['dir']}/README.md does not exist")
        for nb in lab["notebooks"]:
            if not exists(nb) or not nb.startswith("notebooks/") or not nb.endswith(".ipynb"):
                problems.append(f"{rel}: notebook {nb} is not a notebooks/*.ipynb file")
        if lab["notebook_logs"] and not exists(lab["notebook_logs"]):
            problems.append(f"{rel}: notebook_logs {lab['notebook_logs']} does not exist")
        if lab["notebook_logs"] and not lab["notebooks"]:
            problems.append(f"{rel}: notebook_logs without notebooks to plot them")
        if lab["scale_demo"] is not None:
            problems += [f"{rel}: scale_demo: {p}" for p in _scale_demo_problems(lab)]
        if lab["sim"] is not None:
            problems += [f"{rel}: sim: {p}" for p in _sim_problems(lab)]
    named = {nb for lab in labs for nb in lab["notebooks"]}
    for nb in sorted(glob.glob(os.path.join(root, "notebooks", "*.ipynb"))):
        if os.path.relpath(nb, root) not in named:
            problems.append(f"{os.path.relpath(nb, root)}: no manifest names it (\"notebooks\" of its lab's lab.json): "
                            f"scripts/notebooks.sh would not run it")
    problems += table_problems(root, labs)
    return problems


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _scale_demo_problems(lab):
    sd, problems = lab["scale_demo"], []
    unknown = sorted(set(sd) - {"args", "skip", "table_note", "why"})
    if unknown:
        problems.append(f"unknown field(s) {', '.join(unknown)} (args, skip, table_note, why)")
    if not lab["driver"]:
        problems.append("the lab has no program to run")
    if sd.get("table_note") not in SCALE_NOTES:
        problems.append(f"table_note {sd.get('table_note')!r} is not one of {', '.join(str(n) for n in SCALE_NOTES)}")
    example = dict(N=8, B=4, G=32, S=3, heads=4, layers=4, model="demo", node=8, grid_tp=2, grid_pp=2, T=64,
                   device="cpu")
    try:
        scale_row(lab, example)
    except (ManifestError, KeyError, TypeError) as e:
        problems.append(f"at {example}: {e}")
    return problems


def _sim_problems(lab):
    sim, problems = lab["sim"], []
    unknown = sorted(set(sim) - {"ranks", "args", "why"})
    if unknown:
        problems.append(f"unknown field(s) {', '.join(unknown)} (ranks, args, why)")
    if not lab["driver"]:
        problems.append("the lab has no program to run")
    n, allowed = sim.get("ranks"), lab["ranks"]["allowed"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        problems.append(f"ranks {json.dumps(n)} is not a number of ranks >= 1")
    elif allowed != "any" and n not in allowed:
        problems.append(f"ranks {n} is not among the lab's allowed ranks {allowed}")
    args = sim.get("args", [])
    if not isinstance(args, list) or not all(isinstance(x, str) for x in args):
        problems.append(f"args {json.dumps(args)} is not a list of strings")
    elif any(x in ("--device", "--backend", "--sim-gpu") for x in args):
        problems.append("args name --device, --backend or --sim-gpu: the check adds them")
    return problems


# ---------------------------------------------------------------------------------------------
# The scale demo's rows: each lab's arguments with {expressions} of the run's numbers

_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Name, ast.Load, ast.Constant,
            ast.Call, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.USub, ast.And, ast.Or, ast.Not,
            ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)
_FUNCTIONS = {"gcd": math.gcd, "min": min, "max": max}


def evaluate(expr, env):
    """An integer expression of the run's numbers ("N // 4", "gcd(N, heads)", "N > layers"): + - * // %,
    comparisons, and/or/not, gcd/min/max. Nothing else parses, so a manifest cannot run code."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ManifestError(f"'{expr}' does not parse ({e.msg})")
    except (RecursionError, MemoryError):
        raise ManifestError(f"'{expr[:80]}...' is nested too deeply")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED) or (isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS)):
            raise ManifestError(f"'{expr}': {type(node).__name__} is not allowed (+ - * // %, comparisons, "
                                f"and/or/not, gcd/min/max)")
        if isinstance(node, ast.Name) and node.id not in env and node.id not in _FUNCTIONS:
            raise ManifestError(f"'{expr}': unknown name {node.id} (the names: {', '.join(sorted(env))})")
    try:
        return eval(compile(tree, "<manifest>", "eval"), {"__builtins__": {}}, dict(env, **_FUNCTIONS))
    except (ArithmeticError, TypeError, ValueError, RecursionError) as e:  # N // 0, gcd(N), min()
        raise ManifestError(f"'{expr}': {e} (with {', '.join(f'{k}={v}' for k, v in sorted(env.items()))})")


def expand(text, env):
    """text with every {expression} replaced by its value: "{G // B}" -> "8"."""
    return re.sub(r"\{([^{}]+)\}", lambda m: str(evaluate(m.group(1), env)), text)


def scale_row(lab, env):
    """("skip", why) or ("run", [args]) for one run of the scale demo: lab at env["N"] ranks.
    env: N ranks, B micro-batch, G global batch (sequences per step), S ZeRO stage, heads and layers of the
    model, model its name, node the ranks of one node (the largest tensor-parallel group), grid_tp and grid_pp
    lab 07's tp and pp at N ranks (scripts/scale_demo.sh's rule), T the sequence length, device the run's (cpu,
    cuda, sim). A skip entry's "if" is an expression; the first that holds skips the run."""
    sd = lab["scale_demo"]
    skip = sd.get("skip", [])
    if not isinstance(skip, list):
        raise ManifestError(f"skip {skip!r} is not a list of {{\"if\": ..., \"why\": ...}}")
    for entry in skip:
        if not (isinstance(entry, dict) and set(entry) == {"if", "why"} and isinstance(entry["if"], str) and
                isinstance(entry["why"], str)):
            raise ManifestError(f"skip entry {entry!r} is not {{\"if\": \"expression\", \"why\": \"text\"}}")
        if evaluate(entry["if"], env):
            return "skip", expand(entry["why"], env)
    args = sd.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ManifestError(f"args {args!r} is not a list of strings")
    return "run", [expand(a, env) for a in args]


# ---------------------------------------------------------------------------------------------
# The labs tables of README.md and docs/design.md, made from the manifests

TABLES = {
    "README.md": (["#", "lab", "you write", "run it"],
                  lambda lab: [lab["number"], f"[{lab['name']}]({lab['dir']}/README.md)", lab["you_write"],
                               _run_it(lab)]),
    "docs/design.md": (["#", "lab", "the learner writes", "graded on"],
                       lambda lab: [lab["number"], lab["name"], lab["you_write"], lab["graded_on"]]),
}


def _run_it(lab):
    if not lab["driver"]:
        return "-"
    n = lab["ranks"]["default"]
    return f"`scripts/run {lab['number']}`" + ("" if lab["single_process"] else f" ({n} rank{'s' if n > 1 else ''})")


def table(doc, labs):
    head, row = TABLES[doc]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row(lab)) + " |" for lab in labs]
    return "\n".join(lines)


def _table_span(text):
    """(start, end) of the lines between the markers, or None."""
    b, e = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if b < 0 or e < b:
        return None
    return b + len(TABLE_BEGIN) + 1, e


def table_problems(root, labs):
    problems = []
    for doc in TABLES:
        text = _read(os.path.join(root, doc))
        span = _table_span(text)
        if span is None:
            problems.append(f"{doc}: no labs table between '{TABLE_BEGIN}' and '{TABLE_END}'")
        elif text[span[0]:span[1]].strip("\n") != table(doc, labs):
            problems.append(f"{doc}: the labs table is not the manifests' (labs/*/lab.json); rewrite it: "
                            f"python3 scripts/lib/labs.py tables --write")
    return problems


def write_tables(root, labs):
    for doc in TABLES:
        path = os.path.join(root, doc)
        text = _read(path)
        span = _table_span(text)
        if span is None:
            raise ManifestError(f"{doc}: no markers '{TABLE_BEGIN}' ... '{TABLE_END}' to write the table between")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:span[0]] + table(doc, labs) + "\n" + text[span[1]:])


# ---------------------------------------------------------------------------------------------
# Command line

def shell_assignments(lab, track):
    """The lab as bash variables: lab_exists, lab_name, lab_title, lab_dir, lab_graded, lab_corpus,
    lab_np_default, lab_np_allowed ("any" or "1 2"), lab_single_process, lab_has_program, lab_has_sim (the
    program runs on the simulated GPU: a "sim" field), lab_target and lab_exe (the
    track's program: empty without a driver, or when the build does not say)."""
    if lab is None:
        return {"lab_exists": 0}
    prog = (lab.get("programs") or {}).get(track) or {}
    allowed = lab["ranks"]["allowed"]
    return {"lab_exists": 1, "lab_name": lab["name"], "lab_title": lab["title"], "lab_dir": lab["dir"],
            "lab_graded": int(lab["graded"]), "lab_corpus": int(lab["corpus"]),
            "lab_has_program": int(bool(lab["driver"])), "lab_has_sim": int(bool(lab["sim"])),
            "lab_np_default": lab["ranks"]["default"],
            "lab_np_allowed": allowed if allowed == "any" else " ".join(str(n) for n in allowed),
            "lab_single_process": int(lab["single_process"]), "lab_target": prog.get("target", ""),
            "lab_exe": prog.get("path", ""), "lab_notebooks": " ".join(lab["notebooks"]),
            "lab_notebook_logs": lab["notebook_logs"] or ""}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="scripts/lib/labs.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=REPO, help="repository root (default: this checkout)")
    ap.add_argument("--build-dir", help="read <build>/labs.json where it exists")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="the lab numbers, one a line")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--graded", action="store_true", help="labs with TODOs (graded checks)")
    which.add_argument("--program", action="store_true", help="labs with a program")
    which.add_argument("--notebooks", action="store_true", help="labs with notebooks")
    which.add_argument("--scale-demo", action="store_true", help="labs with scale-demo rows")
    which.add_argument("--sim", action="store_true", help="labs whose program CI runs on the simulated cluster")
    p = sub.add_parser("shell", help="one lab as shell assignments")
    p.add_argument("number")
    p.add_argument("--track", choices=["learner", "reference"], default="reference")
    p = sub.add_parser("scale-row", help="one run of the scale demo: skip + why, or run + its arguments")
    p.add_argument("number")
    p.add_argument("vars", nargs="*",
                   help="NAME=VALUE: N, B, G, S, heads, layers, node, grid_tp, grid_pp (integers), model")
    sub.add_parser("check", help="every manifest against its folders and the labs tables")
    p = sub.add_parser("tables", help="the labs tables of README.md and docs/design.md")
    p.add_argument("--write", action="store_true", help="rewrite them from the manifests")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    build = os.path.abspath(args.build_dir) if args.build_dir else None
    try:
        if args.cmd == "check":
            problems = check(root)
            for line in problems:
                print(f"FAIL {line}")
            print(f"labs.py check: {len(manifest_paths(root))} manifest(s), {len(problems)} problem(s)")
            return 1 if problems else 0
        labs = load(root, build)
        if args.cmd == "list":
            key = ("graded" if args.graded else "driver" if args.program else "notebooks" if args.notebooks
                   else "scale_demo" if args.scale_demo else "sim" if args.sim else None)
            for lab in labs:
                if key is None or lab[key]:
                    print(lab["number"])
        elif args.cmd == "shell":
            lab = next((x for x in labs if x["number"] == args.number), None)
            for k, v in shell_assignments(lab, args.track).items():
                print(f"{k}={shlex.quote(str(v))}")
        elif args.cmd == "scale-row":
            lab = next((x for x in labs if x["number"] == args.number), None)
            if lab is None or not lab["scale_demo"]:
                sys.exit(f"labs.py: lab {args.number} has no scale-demo rows")
            env = {}
            for kv in args.vars:
                k, _, v = kv.partition("=")
                env[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
            kind, what = scale_row(lab, env)
            print(kind)  # then the reason, or each argument on a line of its own (none: nothing more)
            for line in [what] if kind == "skip" else what:
                print(line)
        elif args.cmd == "tables":
            if args.write:
                write_tables(root, labs)
                print(f"labs.py: wrote the labs tables of {', '.join(TABLES)}")
                return 0
            problems = table_problems(root, labs)
            for line in problems:
                print(f"FAIL {line}")
            return 1 if problems else 0
    except ManifestError as e:
        print(f"[scalelab] labs: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
