#!/usr/bin/env python3
"""check_readme_notebooks.py — README.md's "## Notebooks" section names exactly the manifests' notebooks.

Each lab's manifest (labs/NN_name/lab.json, "notebooks") says which notebooks plot its runs; the top README
lists them for the reader. This lint fails when the section leaves one out or names a notebooks/*.ipynb that
no manifest names.

  tests/lint/check_readme_notebooks.py [--root REPO]    exit 0 when they agree, 1 with the differences
Registered as ctest lint.readme_notebooks (tests/lint/CMakeLists.txt); its own test:
tests/lint/test_check_readme_notebooks.py.
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "lib"))
import labs  # noqa: E402  (scripts/lib/labs.py: the labs' manifests)

NOTEBOOK = re.compile(r"notebooks/[\w.-]+\.ipynb")


def section(text, heading="## Notebooks"):
    """The text from the heading to the next '## ' heading ('' when there is no such heading)."""
    text = "\n" + text  # a heading on the first line too
    start = text.find("\n" + heading + "\n")
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(heading) + 2)
    return text[start:end if end >= 0 else len(text)]


def problems(root):
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        listed = set(NOTEBOOK.findall(section(f.read())))
    named = {nb for lab in labs.load(root) for nb in lab["notebooks"]}
    out = [f"README.md \"## Notebooks\" does not name {nb} (the manifest of its lab does)"
           for nb in sorted(named - listed)]
    out += [f"README.md \"## Notebooks\" names {nb}, which no labs/*/lab.json names" for nb in sorted(listed - named)]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(HERE)))
    found = problems(ap.parse_args(argv).root)
    for p in found:
        print(p)
    if not found:
        print("check_readme_notebooks: README.md names every manifest's notebooks")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
