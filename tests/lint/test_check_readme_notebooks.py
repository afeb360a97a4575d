#!/usr/bin/env python3
"""test_check_readme_notebooks.py — the README notebook lint on temp trees: agreeing, one left out, one extra.
ctest lint.readme_notebooks_selftest (tests/lint/CMakeLists.txt)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_readme_notebooks as lint  # noqa: E402

MANIFEST = {"number": "01", "name": "one", "title": "01 one", "you_write": "x", "graded_on": "x", "twins": [],
            "driver": None, "ranks": {"default": 1, "allowed": [1]}, "corpus": False, "tests": [],
            "notebooks": ["notebooks/01_one.ipynb"]}


def tree(readme):
    d = tempfile.mkdtemp()
    os.makedirs(os.path.join(d, "labs", "01_one"))
    with open(os.path.join(d, "labs", "01_one", "lab.json"), "w") as f:
        json.dump(MANIFEST, f)
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write(readme)
    return d


class ReadmeNotebooks(unittest.TestCase):
    def test_agreeing(self):
        self.assertEqual(lint.problems(tree("# k\n\n## Notebooks\n\n`notebooks/01_one.ipynb` plots.\n\n## Next\n")), [])

    def test_one_left_out(self):
        # named only outside the section: still missing from it
        found = lint.problems(tree("# k\n`notebooks/01_one.ipynb`\n## Notebooks\n\nnone\n\n## Next\n"))
        self.assertEqual(len(found), 1)
        self.assertIn("does not name notebooks/01_one.ipynb", found[0])

    def test_one_extra(self):
        found = lint.problems(tree("## Notebooks\n\n`notebooks/01_one.ipynb`, `notebooks/02_two.ipynb`\n"))
        self.assertEqual(len(found), 1)
        self.assertIn("names notebooks/02_two.ipynb", found[0])


if __name__ == "__main__":
    unittest.main(verbosity=2)
