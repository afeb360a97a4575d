#!/usr/bin/env python3
"""check_citations.py — every file and document the kit cites is in the repository.

A comment or a document that points at a file a user's clone does not have sends a reader nowhere. This
lint reads every tracked text file (`git ls-files`; without git, every file under the root but build and
run folders) and checks two kinds of citation:
  - a Markdown document, `<name>.md`, with or without a folder: it must exist relative to the
    repository root or to the citing file's folder; a bare name (`README.md`) may also be any tracked file
    of that name;
  - a path into one of the kit's own top-level folders (`common/...`, `labs/...`, `docs/...`, `tests/...`,
    ...) ending in a source or document extension: it must exist relative to the root.
Placeholders are not citations: a path with `NN`, `<...>`, `{...}`, `$` or `*` in it (`labs/NN_name/README.md`)
is skipped, as are URLs, the a/ and b/ paths of planted-mistake patches, and the planted texts of the lint
self-tests. Files a program writes (a bench's `table.md`) and documents of other projects cited with their
project (nccl-tests' `doc/PERFORMANCE.md`) are listed in NOT_IN_THIS_REPOSITORY below, each with why.

  tests/lint/check_citations.py [--root REPO]     exit 0 when every citation resolves, 1 with a list otherwise
Registered as ctest lint.citations (tests/lint/CMakeLists.txt); its own test: tests/lint/test_check_citations.py.
"""
import argparse
import os
import re
import subprocess
import sys

TOP_FOLDERS = ("common", "labs", "solutions", "tests", "scripts", "docs", "bench", "tools", "notebooks", "cmake",
               ".ci")
SOURCE_EXTS = ("md", "py", "h", "hpp", "cpp", "cu", "cuh", "inc", "sh", "cmake", "json", "ipynb", "txt")

# Names that look like citations but are not files of this repository, and why each is allowed.
NOT_IN_THIS_REPOSITORY = {
    "doc/PERFORMANCE.md": "nccl-tests' own definition of algbw and busbw, cited with that project's name",
    "scale_table.md": "written by scripts/scale_demo.sh into its --out folder",
    "table.md": "written by bench/bench_lab02.sh and bench/bench_lab03.sh into their output folder",
    "gpu_runs_row.md": "written by scripts/gpu_check.sh for docs/gpu_runs.md",
    "placement.md": "written by bench/placement_3d.py",
    "search.md": "written by bench/placement_3d.py",
    "sim_search.md": "written by bench/placement_3d.py --sim-search",
    "bubble.md": "written by bench/pp_bubble_sweep.py",
    "published.md": "written by bench/plan_published.py",
    "validation.md": "written by bench/plan_validate.py",
}

# Files whose paths are planted examples, not citations.
SKIP_FILES = re.compile(r"^tests/lint/test_[\w]+\.py$|\.patch$")

_PATH = r"(?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*"
# Not preceded by a character that would make the match part of a longer path, URL or placeholder.
_BEFORE = r"(?<![\w./<>{}$*-])"
MARKDOWN = re.compile(_BEFORE + r"((?:\.\./|\./)?" + _PATH + r"\.md)(?![\w/])")
REPO_PATH = re.compile(_BEFORE + r"((?:" + "|".join(re.escape(t) for t in TOP_FOLDERS) + r")/" + _PATH +
                       r"\.(?:" + "|".join(SOURCE_EXTS) + r"))(?![\w/])")
PLACEHOLDER = re.compile(r"NN|<|>|\{|\}|\$|\*")
URL_BEFORE = re.compile(r"[a-z]+://\S*$")


def tracked_files(root):
    """The files to read, relative to root: git's list, or a walk that leaves out build and run folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
        return [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not (d.startswith(".") or d.startswith("build") or d in ("runs", "data"))]
            files += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames]
        return files


def citations(line):
    """The (column, cited path) pairs of one line that must resolve."""
    found = {}
    for rx in (MARKDOWN, REPO_PATH):
        for m in rx.finditer(line):
            path = m.group(1)
            if PLACEHOLDER.search(path) or URL_BEFORE.search(line[:m.start()]):
                continue
            found.setdefault(m.start(), path)
    return sorted(found.items())


def resolves(path, citing_file, root, basenames):
    if path in NOT_IN_THIS_REPOSITORY:
        return True
    here = os.path.dirname(os.path.join(root, citing_file))
    if os.path.exists(os.path.join(root, path)) or os.path.exists(os.path.join(here, path)):
        return True
    return "/" not in path and path in basenames


def check(root):
    """Returns a list of 'file:line: cites X, which ...' problems."""
    files = tracked_files(root)
    basenames = {os.path.basename(f) for f in files}
    problems = []
    for rel in files:
        if SKIP_FILES.search(rel):
            continue
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not a text that cites anything
        for number, line in enumerate(text.splitlines(), start=1):
            for _, path in citations(line):
                if not resolves(path, rel, root, basenames):
                    problems.append(f"{rel}:{number}: cites {path}, which is not in the repository")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    args = ap.parse_args()
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"\n{len(problems)} citation(s) point at files that are not in the repository.\n"
              "  hint: cite a file of the repository (docs/references.md holds the formulas and published figures,\n"
              "        docs/style.md the conventions, docs/design.md the architecture) or a public source (paper\n"
              "        with its section, URL); a file a program writes goes into NOT_IN_THIS_REPOSITORY with why")
        return 1
    print("check_citations: every cited file is in the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main())
