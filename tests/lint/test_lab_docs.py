#!/usr/bin/env python3
"""test_lab_docs.py — the README/hints checks find what they must, on a tiny lab written to a temp dir.

  python3 tests/lint/test_lab_docs.py        (registered as ctest lint.lab_docs_selftest)
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_lab_docs  # noqa: E402  (the modules under test, next to this file)
import lab_docs  # noqa: E402

STEP = """\
int step(int x) {
  // TODO(lab07-1) BEGIN  double it
  throw scalelab::NotImplemented("lab07-1 step");
  // TODO(lab07-1) END
}
int rate(int a, int b) {
  // TODO(lab07-2) BEGIN  divide
  throw scalelab::NotImplemented("lab07-2 rate");
  // TODO(lab07-2) END
}
"""

README = """\
# Lab 07

## Your task

| check | points | TODOs | what |
|---|---:|---|---|
| `lab07.doubles` | 2 | `lab07-1` | x |
| `lab07.divides` | 1 | `lab07-2`, `lab07-9` | y |
| **total** | **3** | | |

## The lesson

| check | passes when |
|---|---|
| `lab07.doubles` | always |
"""

HINTS = """\
# Hints, lab 07

## lab07-1
### tier 1
What is twice x?
### tier 2
Multiply.
### tier 3
return 2 * x;

## lab07-2
### tier 1
a over b?
### tier 2
Divide.
"""


class LabDocsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        for top in ("labs", "solutions"):
            os.makedirs(os.path.join(self.root, top, "07_x"))
        for path, text in (("labs/07_x/step.cpp", STEP), ("solutions/07_x/step.cpp", STEP),
                           ("labs/07_x/README.md", README), ("labs/07_x/hints.md", HINTS)):
            with open(os.path.join(self.root, path), "w") as f:
                f.write(text)

    def tearDown(self):
        self.tmp.cleanup()

    def test_check_table_reads_rows_total_and_todos(self):
        table = lab_docs.check_table(README)
        self.assertEqual([(r["id"], r["points"], r["todos"]) for r in table["rows"]],
                         [("lab07.doubles", 2, ["lab07-1"]), ("lab07.divides", 1, ["lab07-2", "lab07-9"])])
        self.assertEqual(table["total"], 3)
        self.assertEqual(table["errors"], [])  # the lesson's table has no points column: not a second check table

    def test_two_check_tables_are_an_error(self):
        table = lab_docs.check_table(README + "\n| check | points |\n|---|---|\n| `lab07.doubles` | 2 |\n")
        self.assertTrue(any("2 tables" in e for e in table["errors"]), table["errors"])

    def test_missing_tier_is_found(self):
        sections, errors = lab_docs.hints(HINTS)
        self.assertEqual(sections["lab07-1"][3], "return 2 * x;")
        self.assertEqual(errors, ["lab07-2: tier 3 is missing or empty"])

    def test_hint_problems_name_the_file(self):
        problems = check_lab_docs.hint_problems(self.root, "07", "07_x", required=True)
        self.assertEqual(problems, ["labs/07_x/hints.md: lab07-2: tier 3 is missing or empty"])
        os.remove(os.path.join(self.root, "labs/07_x/hints.md"))
        self.assertIn("missing", check_lab_docs.hint_problems(self.root, "07", "07_x", required=True)[0])
        self.assertEqual(check_lab_docs.hint_problems(self.root, "07", "07_x", required=False), [])

    def test_table_against_the_grader(self):
        problems = check_lab_docs.table_problems(self.root, "07", "07_x", [("lab07.doubles", 3), ("lab07.rounds", 1)])
        text = "\n".join(problems)
        self.assertIn("`lab07.doubles` has 2 points in the table, 3 in the grader", text)
        self.assertIn("lacks `lab07.rounds`", text)
        self.assertIn("`lab07.divides` is in the check table, but", text)
        self.assertIn("total is 3, the grader's checks add up to 4", text)
        self.assertIn("names lab07-9, which is no TODO fence", text)
        agreeing = check_lab_docs.table_problems(self.root, "07", "07_x", [("lab07.doubles", 2), ("lab07.divides", 1)])
        self.assertEqual(agreeing, ["labs/07_x/README.md:8: `lab07.divides` names lab07-9, which is no TODO fence of the lab"])

    def test_task_comes_first(self):
        self.assertEqual(check_lab_docs.task_first_problems(self.root, "07_x"), [])
        with open(os.path.join(self.root, "labs/07_x/README.md"), "w") as f:
            f.write("# Lab 07\n\n## The lesson\n\n## Your task\n")
        self.assertIn("'## The lesson'", check_lab_docs.task_first_problems(self.root, "07_x")[0])


if __name__ == "__main__":
    unittest.main()
