#!/usr/bin/env python3
"""check_decision_lists.py — every TODO of every lab has a line in docs/grading.md's decision lists.

docs/grading.md "What the learner decides, and which check sees it" lists, per lab, each decision a TODO
leaves to the learner and the graded check that fails when it is made wrong: a decision no check observes
is a grader gap. This lint fails when a TODO id of a lab's twins (the `TODO(labNN-K) BEGIN` fences of
solutions/NN_name/, as tests/lint/check_fences.py parses them) appears nowhere in that section (as
`labNN-K`, or in a range such as `lab03-5, -6`), or when the section names a TODO id no twin holds.

  tests/lint/check_decision_lists.py [--root REPO]    exit 0 when every TODO has its line, 1 otherwise
Registered as ctest lint.decision_lists (tests/lint/CMakeLists.txt); its own test:
tests/lint/test_check_decision_lists.py.
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "lib"))
import check_fences  # noqa: E402  (the fence parser)
import labs  # noqa: E402  (scripts/lib/labs.py: the labs' manifests)
from check_readme_notebooks import section  # noqa: E402  (a '## ' section of a markdown text)

HEADING = "## What the learner decides, and which check sees it"
# "lab03-5, -6" or "lab04-2, -3": a first id, then the other numbers of the same lab after ", -".
MENTION = re.compile(r"\blab(\d\d)-(\d+)((?:,\s*-\d+)*)")


def mentioned(text):
    """The TODO ids a decision list names: {"lab03-5", "lab03-6", ...}."""
    ids = set()
    for m in MENTION.finditer(text):
        ids.add(f"lab{m.group(1)}-{m.group(2)}")
        ids.update(f"lab{m.group(1)}-{k}" for k in re.findall(r"-(\d+)", m.group(3)))
    return ids


def todo_ids(root):
    """Every TODO id of every lab's reference twins."""
    ids = set()
    for lab in labs.load(root):
        for twin in lab["twins"]:
            rel = f"{lab['solutions_dir']}/{twin}"
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                ids.update(fence.fence_id for fence in check_fences.parse(f.read(), rel).fences)
    return ids


def problems(root):
    with open(os.path.join(root, "docs", "grading.md"), encoding="utf-8") as f:
        listed = mentioned(section(f.read(), HEADING))
    if not listed:
        return [f"docs/grading.md has no \"{HEADING[3:]}\" section naming any TODO"]
    todos = todo_ids(root)
    key = lambda t: (t[3:5], int(t.split("-")[1]))  # noqa: E731  (lab, then K as a number)
    out = [f"docs/grading.md's decision lists have no line for {t}: which decision is it, and which check sees it?"
           for t in sorted(todos - listed, key=key)]
    out += [f"docs/grading.md's decision lists name {t}, which no lab's twin holds" for t in sorted(listed - todos, key=key)]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(HERE)))
    found = problems(ap.parse_args(argv).root)
    for p in found:
        print(p)
    if not found:
        print("check_decision_lists: every TODO has a line in docs/grading.md's decision lists")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
