#!/usr/bin/env python3
"""test_check_fences.py — the fence lint finds what it must, on tiny trees written to a temp dir.

  python3 tests/lint/test_check_fences.py        (registered as ctest lint.check_fences_selftest)
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_fences  # noqa: E402  (the module under test, next to this file)

SOLUTION = """\
// step.cpp — a lab file
int step(int x) {
  // TODO(lab07-1) BEGIN  double it
  //   1. multiply by two
  return 2 * x;
  // TODO(lab07-1) END
}
int rate(int a, int b) {
  SL_CHECK(b > 0, "b=%d", b);
  // TODO(lab07-2) BEGIN  divide
  return a / b;
  // TODO(lab07-2) END
}
"""

LEARNER = """\
// step.cpp — a lab file
int step(int x) {
  // TODO(lab07-1) BEGIN  double it
  //   1. multiply by two
  throw scalelab::NotImplemented("lab07-1 step");
  // TODO(lab07-1) END
}
int rate(int a, int b) {
  SL_CHECK(b > 0, "b=%d", b);
  // TODO(lab07-2) BEGIN  divide
  throw scalelab::NotImplemented("lab07-2 rate");
  // TODO(lab07-2) END
}
"""


class CheckFencesTest(unittest.TestCase):
    def tree(self, learner, solution, lab="07_example", name="step.cpp", keep_root=False):
        """A repo root holding labs/<lab>/<name> and solutions/<lab>/<name> (None: no such file);
        returns the lint's problems, or with keep_root the root itself."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        root = tmp.name
        for side, text in (("labs", learner), ("solutions", solution)):
            if text is None:
                continue
            os.makedirs(os.path.join(root, side, lab), exist_ok=True)
            with open(os.path.join(root, side, lab, name), "w", encoding="utf-8") as f:
                f.write(text)
        return root if keep_root else check_fences.compare_all(root)

    def test_identical_outside_fences_passes(self):
        self.assertEqual(self.tree(LEARNER, SOLUTION), [])

    def test_planted_difference_outside_fences_is_reported_with_a_diff(self):
        planted = LEARNER.replace('SL_CHECK(b > 0, "b=%d", b);', 'SL_CHECK(b >= 0, "b=%d", b);')
        problems = self.tree(planted, SOLUTION)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("outside the TODO fences", problems[0].message)
        self.assertIn('-  SL_CHECK(b > 0, "b=%d", b);', problems[0].diff)
        self.assertIn('+  SL_CHECK(b >= 0, "b=%d", b);', problems[0].diff)

    def test_stub_must_throw_its_own_id(self):
        wrong_id = LEARNER.replace('NotImplemented("lab07-2 rate")', 'NotImplemented("lab07-1 rate")')
        problems = self.tree(wrong_id, SOLUTION)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("TODO(lab07-2) must throw", problems[0].message)
        # lab07-1 must not be satisfied by a lab07-10 stub
        self.assertFalse(check_fences.stub_throws_own_id('throw scalelab::NotImplemented("lab07-10 x");', "lab07-1"))

    def test_fence_ids_and_order_must_match(self):
        swapped = SOLUTION.replace("lab07-2", "lab07-3")
        problems = self.tree(LEARNER, swapped)
        self.assertTrue(any("fences differ" in p.message for p in problems), problems)

    def test_unbalanced_and_foreign_fences(self):
        unclosed = LEARNER.replace("  // TODO(lab07-2) END\n", "")
        self.assertTrue(any("has no END" in p.message for p in self.tree(unclosed, SOLUTION)))
        foreign = LEARNER.replace("lab07-1", "lab03-1")
        self.assertTrue(any("fence ids are lab07-K" in p.message for p in self.tree(foreign, SOLUTION)))

    def test_reference_must_implement(self):
        stubbed = SOLUTION.replace("  return a / b;\n", '  throw scalelab::NotImplemented("lab07-2 rate");\n')
        problems = self.tree(LEARNER, stubbed)
        self.assertTrue(any("the reference implements every TODO" in p.message for p in problems), problems)

    def test_missing_learner_twin_of_a_fenced_file(self):
        problems = self.tree(None, SOLUTION)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("does not exist", problems[0].message)

    def test_edited_mode_accepts_a_learners_solution(self):
        # The grader's view of a learner who wrote the TODO bodies: no stubs left, and that is fine,
        # while a change outside the fences is still reported.
        solved = SOLUTION.replace("2 * x", "x + x")
        root = self.tree(solved, SOLUTION, keep_root=True)
        self.assertEqual(check_fences.compare_all(root, edited=True), [])
        self.assertEqual(len(check_fences.compare_all(root, edited=False)), 2)  # no stub in lab07-1, lab07-2
        root = self.tree(solved.replace("int rate", "long rate"), SOLUTION, keep_root=True)
        self.assertEqual(len(check_fences.compare_all(root, edited=True)), 1)

if __name__ == "__main__":
    unittest.main()
