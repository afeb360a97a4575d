#!/usr/bin/env python3
"""check_fences.py — the learner's files equal the reference outside the TODO fences.

docs/design.md "How the two tracks link": labs/NN_name/<file> (the learner's, with TODO stubs) and
solutions/NN_name/<file> (the reference) are byte-identical except between

    // TODO(labNN-K) BEGIN  <what to write>
    ...                                        <- learner: hints + throw scalelab::NotImplemented("labNN-K ...")
    // TODO(labNN-K) END                       <- reference: the code

For every solutions/NN_name/*.cpp|*.h with a labs/NN_name counterpart this checks:
  - the fences pair up (BEGIN then END of the same id, no nesting), and their ids carry the lab's NN;
  - both files have the same fences, in the same order, with identical BEGIN and END lines;
  - outside the fence bodies the files are byte-identical (a unified diff shows where not);
  - each learner fence body throws scalelab::NotImplemented("labNN-K ...") with its own id, and no
    reference fence body does (the reference implements every TODO).
A solutions/ file with fences but no labs/ counterpart is an error too (its learner twin went missing).

  tests/lint/check_fences.py [--root REPO] [--lab NN]     exit 0 when clean, 1 with a report otherwise
Registered as a ctest by tests/lint/CMakeLists.txt; scripts/grade imports it (compare_lab with
edited=True) to warn a learner who changed the shared code. Its own test: tests/lint/test_check_fences.py.
"""
import argparse
import difflib
import os
import re
import sys
from dataclasses import dataclass, field

# "// TODO(lab01-2) BEGIN  FLOPs per token ..." or "// TODO(lab01-2) END"
FENCE_RE = re.compile(r"^\s*//\s*TODO\((lab(\d\d)-(\d+))\)\s+(BEGIN|END)\b")
SOURCE_EXTS = (".cpp", ".h", ".cu", ".cuh")


@dataclass
class Fence:
    fence_id: str     # "lab01-2"
    begin: int        # 1-based line numbers of the BEGIN and END lines
    end: int
    body: str         # the lines strictly between them


@dataclass
class Parsed:
    fences: list = field(default_factory=list)
    skeleton: list = field(default_factory=list)  # the file's lines, each fence body replaced by one marker
    errors: list = field(default_factory=list)


@dataclass
class Problem:
    path: str         # the file the problem is about (relative to the repo root)
    message: str
    diff: str = ""    # a unified diff, when the problem is a difference outside the fences


def parse(text, rel_path, lab_nn=None):
    """Splits a file into its fences and its skeleton (everything outside the fence bodies)."""
    out = Parsed()
    lines = text.splitlines(keepends=True)
    open_fence = None  # (id, begin line number, body lines)
    for number, line in enumerate(lines, start=1):
        m = FENCE_RE.match(line)
        if not m:
            if open_fence is None:
                out.skeleton.append(line)
            else:
                open_fence[2].append(line)
            continue
        fence_id, nn, kind = m.group(1), m.group(2), m.group(4)
        if lab_nn is not None and nn != lab_nn:
            out.errors.append(f"{rel_path}:{number}: TODO({fence_id}) is in lab {lab_nn}'s folder; "
                              f"fence ids are lab{lab_nn}-K")
        if kind == "BEGIN":
            if open_fence is not None:
                out.errors.append(f"{rel_path}:{number}: TODO({fence_id}) BEGIN inside TODO({open_fence[0]}), "
                                  f"opened on line {open_fence[1]}: fences do not nest")
                continue
            open_fence = (fence_id, number, [])
            out.skeleton.append(line)
        else:
            if open_fence is None:
                out.errors.append(f"{rel_path}:{number}: TODO({fence_id}) END without a BEGIN")
                out.skeleton.append(line)
                continue
            if fence_id != open_fence[0]:
                out.errors.append(f"{rel_path}:{number}: TODO({fence_id}) END closes TODO({open_fence[0]}) "
                                  f"BEGIN of line {open_fence[1]}")
            out.fences.append(Fence(open_fence[0], open_fence[1], number, "".join(open_fence[2])))
            out.skeleton.append(f"    <body of TODO({open_fence[0]})>\n")
            out.skeleton.append(line)
            open_fence = None
    if open_fence is not None:
        out.errors.append(f"{rel_path}:{open_fence[1]}: TODO({open_fence[0]}) BEGIN has no END")
    return out


def stub_throws_own_id(body, fence_id):
    """The learner's stub: throw scalelab::NotImplemented("lab01-2 ...") naming this fence's id."""
    return re.search(r'throw\s+scalelab::NotImplemented\(\s*"' + re.escape(fence_id) + r'[ "]', body) is not None


def compare_pair(learner_text, solution_text, learner_rel, solution_rel, lab_nn=None, edited=False):
    """Problems between one learner file and its reference twin (an empty list when they agree).
    edited=True is the grader's view of a learner's working copy: fence bodies are theirs, so a body
    without the stub is expected; only fence structure and the code outside the fences are checked."""
    problems = []
    learner = parse(learner_text, learner_rel, lab_nn)
    solution = parse(solution_text, solution_rel, lab_nn)
    problems += [Problem(learner_rel, e) for e in learner.errors]
    problems += [Problem(solution_rel, e) for e in solution.errors]

    learner_ids = [f.fence_id for f in learner.fences]
    solution_ids = [f.fence_id for f in solution.fences]
    if learner_ids != solution_ids:
        problems.append(Problem(learner_rel, f"fences differ: {learner_rel} has {learner_ids or 'none'}, "
                                             f"{solution_rel} has {solution_ids or 'none'} (same ids, same order)"))

    if learner.skeleton != solution.skeleton:
        # Line numbers in the hunks count each folded fence body as one line.
        diff = "".join(difflib.unified_diff(solution.skeleton, learner.skeleton,
                                            fromfile=solution_rel + " (fence bodies folded)",
                                            tofile=learner_rel + " (fence bodies folded)"))
        problems.append(Problem(learner_rel, f"{learner_rel} differs from {solution_rel} outside the TODO fences",
                                diff))

    if not edited:
        for f in learner.fences:
            if not stub_throws_own_id(f.body, f.fence_id):
                problems.append(Problem(learner_rel, f"{learner_rel}:{f.begin}: the body of TODO({f.fence_id}) "
                                                     f"must throw scalelab::NotImplemented(\"{f.fence_id} ...\")"))
    for f in solution.fences:
        if "NotImplemented(" in f.body:
            problems.append(Problem(solution_rel, f"{solution_rel}:{f.begin}: the reference's TODO({f.fence_id}) "
                                                  f"throws NotImplemented: the reference implements every TODO"))
    return problems


def lab_dirs(root):
    """{"01": "01_single_device", ...} for every solutions/NN_name folder."""
    found = {}
    solutions = os.path.join(root, "solutions")
    if os.path.isdir(solutions):
        for name in sorted(os.listdir(solutions)):
            m = re.match(r"^(\d\d)_", name)
            if m and os.path.isdir(os.path.join(solutions, name)):
                found[m.group(1)] = name
    return found


def read(path):
    with open(path, encoding="utf-8", newline="") as f:  # newline="": keep \r\n visible to the comparison
        return f.read()


def compare_lab(root, lab_name, edited=False):
    """Problems for every source file of solutions/<lab_name> (e.g. "01_single_device")."""
    problems = []
    lab_nn = lab_name[:2]
    sol_dir = os.path.join(root, "solutions", lab_name)
    for dirpath, _, files in os.walk(sol_dir):
        for name in sorted(files):
            if not name.endswith(SOURCE_EXTS):
                continue
            sol_path = os.path.join(dirpath, name)
            rel = os.path.relpath(sol_path, sol_dir)
            solution_rel = os.path.join("solutions", lab_name, rel)
            learner_rel = os.path.join("labs", lab_name, rel)
            learner_path = os.path.join(root, learner_rel)
            solution_text = read(sol_path)
            if not os.path.exists(learner_path):
                if parse(solution_text, solution_rel).fences:
                    problems.append(Problem(solution_rel, f"{solution_rel} has TODO fences but {learner_rel} "
                                                          f"does not exist"))
                continue
            problems += compare_pair(read(learner_path), solution_text, learner_rel, solution_rel, lab_nn, edited)
    return problems


def compare_all(root, labs=None, edited=False):
    problems = []
    for nn, lab_name in lab_dirs(root).items():
        if labs is None or nn in labs:
            problems += compare_lab(root, lab_name, edited)
    return problems


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="labs/ equals solutions/ outside the TODO fences")
    ap.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")), help="repository root")
    ap.add_argument("--lab", action="append", help="only this lab (NN); repeatable")
    args = ap.parse_args(argv)
    labs = lab_dirs(args.root)
    if args.lab:
        labs = {nn: name for nn, name in labs.items() if nn in args.lab}
    problems = compare_all(args.root, set(labs))
    for p in problems:
        print(f"FAIL {p.message}")
        if p.diff:
            print(p.diff, end="" if p.diff.endswith("\n") else "\n")
    print(f"check_fences: {len(labs)} lab(s) ({', '.join(labs.values()) or 'none'}), "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
