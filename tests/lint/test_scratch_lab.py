#!/usr/bin/env python3
"""test_scratch_lab.py — a lab is its folders and its manifest: add a dummy lab 11 to a copy of the tree, and
every script finds it (ctest lint.scratch_lab, label slow; docs/design.md "A lab is one unit").

  tests/lint/test_scratch_lab.py --build-dir BUILD [--keep]

Copies the working tree (git's tracked and untracked-but-not-ignored files) to BUILD/scratch_lab/tree and adds
labs/11_scratch/ (lab.json, a header, a given file, the driver, README.md with its check table, hints.md), the
reference twin solutions/11_scratch/scratch.cpp, tests/lab11/ (one graded check), a notebook, and a planted
mistake tests/mistakes/lab11/; then `python3 scripts/lib/labs.py tables --write` (the labs tables of README.md
and docs/design.md are made from the manifests). Nothing else of the tree changes. The copy is committed to a
git repository of its own, as a learner's clone is. Then, in that copy:
  configure, with BUILD's settings (CUDA, oneDNN, -march: ccache serves the objects BUILD compiled), and build
  only lab 11's targets (its programs and graded programs, and what they link); <build>/labs.json lists lab 11;
  scripts/run 11 (reference: the answer; learner: "not implemented"; --np 2 refused: one process);
  scripts/grade 11 --track reference: 100 %;  scripts/grade 11 (learner): "not implemented", exit 1;
  scripts/hint 11-1: tier 1;  scripts/test.sh --list, scripts/notebooks.sh --list, scripts/scale_demo.sh
  --dry-run: lab 11 in each;  scripts/check_mistakes.py --lint --lab 11: its patch applies inside its fence;
  the lints: scripts/lib/labs.py check, check_fences.py, check_lab_docs.py (with the build: the README's check
  table against the grader), check_citations.py.
Exits 0 when all hold, 1 with the first that did not (its command and output), 77 (skipped) outside a git
checkout. On the 2-core development machine with a warm ccache: about 2 minutes (the configure and lab 11's
build dominate; with a cold cache the build compiles common/ and labs 01-02: several minutes).
"""
import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import check_mistakes  # noqa: E402  (scripts/check_mistakes.py: like_settings, the settings --like copies)

MANIFEST = {
    "number": "11", "name": "scratch", "title": "scratch",
    "you_write": "answer(x): twice x (a dummy lab: tests/lint/test_scratch_lab.py)",
    "graded_on": "answer(x) = 2x",
    "twins": ["scratch.cpp"], "given": ["scratch_given.cpp"], "driver": "main.cpp", "deps": [],
    "ranks": {"default": 1, "allowed": [1]}, "corpus": False, "tests": ["tests/lab11"],
    "notebooks": ["notebooks/11_scratch.ipynb"], "notebook_logs": None,
    "scale_demo": {"args": ["--x", "{N * 21}"]},
}
HEADER = """// scratch.h — the dummy lab 11 of tests/lint/test_scratch_lab.py: what the learner writes, declared once.
#pragma once

#include <string>

#ifndef SL_TRACK_LAB11
#define SL_TRACK_LAB11 ref
#endif

namespace scalelab::lab11 {
inline namespace SL_TRACK_LAB11 {

// TODO(lab11-1): twice x.
int answer(int x);

// Given: "answer(x) = <answer(x)>", calling this track's answer.
std::string report(int x);

}  // namespace SL_TRACK_LAB11
}  // namespace scalelab::lab11
"""
TWIN = """// scratch.cpp — the dummy lab 11's TODO function (tests/lint/test_scratch_lab.py).
#include "scratch.h"

#include "scalelab/core/error.h"

namespace scalelab::lab11 {
inline namespace SL_TRACK_LAB11 {

int answer(int x) {
  // TODO(lab11-1) BEGIN  twice x
  //   Hints, one tier at a time: scripts/hint 11-1
%s
  // TODO(lab11-1) END
}

}  // namespace SL_TRACK_LAB11
}  // namespace scalelab::lab11
"""
STUB = '  throw scalelab::NotImplemented("lab11-1 answer");'
SOLUTION = "  return 2 * x;"
GIVEN = """// scratch_given.cpp — the dummy lab 11's given code, compiled into both tracks.
#include <string>

#include "scratch.h"

namespace scalelab::lab11 {
inline namespace SL_TRACK_LAB11 {

std::string report(int x) { return "answer(" + std::to_string(x) + ") = " + std::to_string(answer(x)); }

}  // namespace SL_TRACK_LAB11
}  // namespace scalelab::lab11
"""
DRIVER = """// main.cpp — the dummy lab 11's program: prints report(21), or why it cannot.
#include <cstdio>

#include "scalelab/core/error.h"
#include "scratch.h"

int main() {
  try {
    std::printf("scratch: %s\\n", scalelab::lab11::report(21).c_str());
  } catch (const scalelab::Error& e) {
    std::fprintf(stderr, "%s\\n", e.what());
    return 1;
  }
  return 0;
}
"""
README = """# Lab 11: scratch

## Your task

Write `answer` in `labs/11_scratch/scratch.cpp`.

| check | points | TODOs | what it must do |
|---|---:|---|---|
| `lab11.answer_doubles` | 1 | `lab11-1` | answer(x) = 2x |
| **total** | **1** | | |
"""
HINTS = """# Lab 11 hints

## lab11-1
### tier 1
What is twice x?
### tier 2
Multiply.
### tier 3
`return 2 * x;`
"""
TEST_CMAKE = """# tests/lab11 — the dummy lab 11's graded check (tests/lint/test_scratch_lab.py).
sl_add_graded_test(11 test_lab11 SOURCES test_lab11.cpp CHECKS Lab11Scratch.AnswerDoubles TIMEOUT 60)
"""
TEST_CPP = """// test_lab11.cpp — the dummy lab 11's one graded check (tests/lint/test_scratch_lab.py).
#include <gtest/gtest.h>

#include "grading.h"  // defines: grading::Check, grading::run, grading::Record
#include "scratch.h"  // defines: lab11::answer

TEST(Lab11Scratch, AnswerDoubles) {
  const scalelab::grading::Check check{"lab11.answer_doubles", /*points=*/1, /*target=*/"answer(x) = 2x",
                                       /*hint=*/"README 'Your task'"};
  scalelab::grading::run(check, [&](scalelab::grading::Record& record) {
    for (int x : {-3, 0, 21}) EXPECT_EQ(scalelab::lab11::answer(x), 2 * x) << "x = " << x;
  });
}
"""
NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


class Failed(Exception):
    pass


def sh(cmd, cwd, want_rc=0, env=None, timeout=900):
    """Runs cmd (a list) in cwd; returns its output; raises Failed when the exit status is not want_rc."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                       env=dict(os.environ, **(env or {})), timeout=timeout)
    print(f"   {time.monotonic() - t0:5.1f} s  rc {p.returncode}  {' '.join(cmd)}", flush=True)
    if want_rc is not None and p.returncode != want_rc:
        raise Failed(f"{' '.join(cmd)} exited {p.returncode}, expected {want_rc}:\n{p.stdout[-4000:]}")
    return p.stdout


def expect(text, output, what):
    if text not in output:
        raise Failed(f"{what}: '{text}' not in its output:\n{output[-4000:]}")


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def copy_tree(dst):
    """The working tree as git sees it (tracked, and untracked but not ignored; no build, data or runs)."""
    out = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         stdout=subprocess.PIPE, check=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):  # a tracked file deleted in the working tree is left out
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel))


def add_scratch_lab(root):
    """Lab 11: its folders and its manifest, nothing else; then the labs tables, made from the manifests."""
    write(root, "labs/11_scratch/lab.json", json.dumps(MANIFEST, indent=2) + "\n")
    write(root, "labs/11_scratch/scratch.h", HEADER)
    write(root, "labs/11_scratch/scratch.cpp", TWIN % STUB)
    write(root, "labs/11_scratch/scratch_given.cpp", GIVEN)
    write(root, "labs/11_scratch/main.cpp", DRIVER)
    write(root, "labs/11_scratch/README.md", README)
    write(root, "labs/11_scratch/hints.md", HINTS)
    write(root, "solutions/11_scratch/scratch.cpp", TWIN % SOLUTION)
    write(root, "tests/lab11/CMakeLists.txt", TEST_CMAKE)
    write(root, "tests/lab11/test_lab11.cpp", TEST_CPP)
    write(root, "notebooks/11_scratch.ipynb", json.dumps(NOTEBOOK) + "\n")
    # A planted mistake (docs/grading.md "Planted mistakes"): answer(x) = x + x + 1, inside the fence.
    rel = "solutions/11_scratch/scratch.cpp"
    diff = difflib.unified_diff((TWIN % SOLUTION).splitlines(True), (TWIN % "  return x + x + 1;").splitlines(True),
                                f"a/{rel}", f"b/{rel}")
    write(root, "tests/mistakes/lab11/answer-off-by-one.patch", "".join(diff))
    write(root, "tests/mistakes/lab11/manifest.json", json.dumps({"lab": "11", "mutations": [{
        "id": "lab11-answer-off-by-one", "file": rel, "patch": "answer-off-by-one.patch", "fence": "lab11-1",
        "check": "lab11.answer_doubles", "mistake": "x + x + 1", "concept": "twice"}]}, indent=2) + "\n")
    sh([sys.executable, "scripts/lib/labs.py", "tables", "--write"], root)
    # A checkout of its own, as a learner's clone is: git in the copy must not find the repository around it
    # (the lints list files with git ls-files; the grader diffs the given files against the kit's commit).
    git = ["git", "-c", "user.name=scratch", "-c", "user.email=scratch@localhost", "-c", "init.defaultBranch=main"]
    sh(git + ["init", "-q"], root)
    sh(git + ["add", "-A"], root)
    sh(git + ["commit", "-q", "-m", "the kit and a scratch lab 11"], root)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", required=True, help="the build whose settings (and ccache objects) to reuse")
    ap.add_argument("--keep", action="store_true", help="keep the scratch tree and its build (else removed on success)")
    args = ap.parse_args()
    if subprocess.run(["git", "-C", REPO, "rev-parse", "--is-inside-work-tree"], capture_output=True).returncode:
        print("SKIPPED: not a git checkout (the scratch tree is the files git knows)")
        return 77
    like = os.path.abspath(args.build_dir)
    work = os.path.join(like, "scratch_lab")
    root, build = os.path.join(work, "tree"), os.path.join(work, "tree", "build")
    t0 = time.monotonic()
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(root)
    try:
        copy_tree(root)
        add_scratch_lab(root)
        py = sys.executable

        # The manifests and the lints, before any build.
        expect("0 problem(s)", sh([py, "scripts/lib/labs.py", "check"], root), "labs.py check")
        expect("1 lab(s) (11_scratch), 0 problem(s)", sh([py, "tests/lint/check_fences.py", "--lab", "11"], root),
               "check_fences.py")
        sh([py, "tests/lint/check_citations.py", "--root", root], root)
        expect("for labs: 01 02 03 04 05 06 07 08 09 10 11", sh(["scripts/test.sh", "--list", "--build-dir", build], root),
               "scripts/test.sh --list")
        expect("lab 11 (scratch): notebooks/11_scratch.ipynb", sh(["scripts/notebooks.sh", "--list"], root),
               "scripts/notebooks.sh --list")
        expect("== lab11-1, tier 1 of 3", sh(["scripts/hint", "11-1", "--build-dir", work], root), "scripts/hint 11-1")
        expect("1 of 1 patches apply", sh([py, "scripts/check_mistakes.py", "--lint", "--lab", "11"], root),
               "scripts/check_mistakes.py --lint --lab 11")

        # Configure like BUILD (its objects come from ccache), build lab 11's targets only.
        settings = [f"-D{k}={v}" for k, v in check_mistakes.like_settings(like).items()]
        sh(["cmake", "-S", root, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"] + settings, root)
        with open(os.path.join(build, "labs.json"), encoding="utf-8") as f:
            listed = {lab["number"]: lab for lab in json.load(f)["labs"]}
        if "11" not in listed or not (listed["11"]["programs"] or {}).get("reference"):
            raise Failed(f"{build}/labs.json does not list lab 11 with its programs: {sorted(listed)}")
        sh(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target", "lab11_scratch_ref",
            "lab11_scratch_learner", "graded_lab11_reference", "graded_lab11_learner"], root)

        # Run, grade, list.
        run = ["scripts/run", "11", "--build-dir", build]
        expect("scratch: answer(21) = 42", sh(run + ["--track", "reference"], root), "scripts/run 11 (reference)")
        expect("not implemented: lab11-1", sh(run, root, want_rc=1), "scripts/run 11 (learner)")
        expect("is one process", sh(run + ["--np", "2", "--no-build"], root, want_rc=2), "scripts/run 11 --np 2")
        out = sh(["scripts/grade", "11", "--track", "reference", "--build-dir", build, "--jobs", "2"], root)
        expect("Score: 1 / 1 points (100 %)", out, "scripts/grade 11 --track reference")
        out = sh(["scripts/grade", "11", "--build-dir", build, "--jobs", "2"], root, want_rc=1)
        expect("not implemented", out, "scripts/grade 11 (learner)")
        expect("lab 11 at 1 rank:", sh(["scripts/scale_demo.sh", "--build-dir", build, "--labs", "11", "--dry-run",
                                        "--max-ranks", "2", "--model", "tiny", "--launcher", "echo"], root),
               "scripts/scale_demo.sh --dry-run")
        expect("check tables of labs 11: 0 problem(s)",
               sh([py, "tests/lint/check_lab_docs.py", "--root", root, "--build-dir", build, "--lab", "11"], root),
               "check_lab_docs.py (the README's check table against the grader)")
    except Failed as e:
        print(f"FAIL {e}\n(the scratch tree and its build are kept in {work})")
        return 1
    print(f"scratch lab 11: built, run, graded, hinted and listed by every script in {time.monotonic() - t0:.0f} s")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
