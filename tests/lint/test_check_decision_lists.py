#!/usr/bin/env python3
"""test_check_decision_lists.py — the decision-list lint on the kit's own labs with docs/grading.md edited:
as it is, one lab's lines left out, a range that stops short, an id no twin holds.
ctest lint.decision_lists_selftest (tests/lint/CMakeLists.txt)."""
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_decision_lists as lint  # noqa: E402

with open(os.path.join(ROOT, "docs", "grading.md"), encoding="utf-8") as f:
    GRADING = f.read()


def tree(grading):
    """A temp root whose labs/ and solutions/ are the kit's (links) and whose docs/grading.md is `grading`."""
    d = tempfile.mkdtemp()
    for name in ("labs", "solutions"):
        os.symlink(os.path.join(ROOT, name), os.path.join(d, name))
    os.makedirs(os.path.join(d, "docs"))
    with open(os.path.join(d, "docs", "grading.md"), "w", encoding="utf-8") as f:
        f.write(grading)
    return d


class DecisionLists(unittest.TestCase):
    def test_the_kit_passes(self):
        self.assertEqual(lint.problems(tree(GRADING)), [])

    def test_ranges_name_every_id(self):
        self.assertEqual(lint.mentioned("- lab03-5, -6 when: `x`; lab04-2, -3, -4 what"),
                         {"lab03-5", "lab03-6", "lab04-2", "lab04-3", "lab04-4"})

    def test_a_lab_left_out(self):
        start = GRADING.index("**Lab 01**")
        cut = GRADING[:start] + GRADING[GRADING.index("**Lab 02**"):]
        found = lint.problems(tree(cut))
        self.assertEqual([re.search(r"lab\d\d-\d+", p).group(0) for p in found],
                         ["lab01-1", "lab01-2", "lab01-3", "lab01-4"], found)

    def test_a_range_that_stops_short(self):
        cut = GRADING.replace("- lab03-5, -6 when", "- lab03-5 when", 1)
        self.assertNotEqual(cut, GRADING)
        found = lint.problems(tree(cut))
        self.assertEqual(len(found), 1, found)
        self.assertIn("no line for lab03-6", found[0])

    def test_an_id_no_twin_holds(self):
        extra = GRADING.replace("**Lab 09**", "- lab09-7 a TODO that is not there: `x`\n\n**Lab 09**", 1)
        found = lint.problems(tree(extra))
        self.assertEqual(len(found), 1, found)
        self.assertIn("lab09-7, which no lab's twin holds", found[0])

    def test_no_section(self):
        self.assertEqual(len(lint.problems(tree("# Grading\n\n## A check\n"))), 1)


if __name__ == "__main__":
    unittest.main()
