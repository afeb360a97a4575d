#!/usr/bin/env python3
"""test_check_fences.py — the fence lint finds what it must, on tiny trees written to a temp dir.
Each rule is shown to fire on a planted fault and to stay quiet on the clean tree, and the default mode
(the ctest, run on learners' trees) to accept a learner's own fence bodies while --pristine does not.

  python3 tests/lint/test_check_fences.py        (registered as ctest lint.check_fences_selftest)
"""
import contextlib
import io
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


def run_main(argv):
    """check_fences.main(argv)'s exit status, its report swallowed."""
    with contextlib.redirect_stdout(io.StringIO()):
        return check_fences.main(argv)


class CheckFencesTest(unittest.TestCase):
    def tree(self, learner, solution, lab="07_example", name="step.cpp", keep_root=False, given=None):
        """A repo root holding labs/<lab>/<name> and solutions/<lab>/<name> (None: no such file), and
        labs/<lab>/given.cpp when given is a text; returns the lint's problems (default mode), or with
        keep_root the root itself."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        root = tmp.name
        os.makedirs(os.path.join(root, "solutions", lab), exist_ok=True)
        for rel, text in ((os.path.join("labs", lab, name), learner), (os.path.join("solutions", lab, name), solution),
                          (os.path.join("labs", lab, "given.cpp"), given)):
            if text is None:
                continue
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(text)
        return root if keep_root else check_fences.compare_all(root)

    def test_identical_outside_fences_passes(self):
        self.assertEqual(self.tree(LEARNER, SOLUTION), [])
        root = self.tree(LEARNER, SOLUTION, keep_root=True)
        self.assertEqual(check_fences.compare_all(root, pristine=True), [])
        self.assertEqual(run_main(["--root", root]), 0)
        self.assertEqual(run_main(["--root", root, "--pristine"]), 0)

    def test_planted_difference_outside_fences_is_reported_with_a_diff(self):
        planted = LEARNER.replace('SL_CHECK(b > 0, "b=%d", b);', 'SL_CHECK(b >= 0, "b=%d", b);')
        problems = self.tree(planted, SOLUTION)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("outside the TODO fences", problems[0].message)
        self.assertIn('-  SL_CHECK(b > 0, "b=%d", b);', problems[0].diff)
        self.assertIn('+  SL_CHECK(b >= 0, "b=%d", b);', problems[0].diff)

    def test_pristine_stub_must_throw_its_own_id(self):
        wrong_id = LEARNER.replace('NotImplemented("lab07-2 rate")', 'NotImplemented("lab07-1 rate")')
        root = self.tree(wrong_id, SOLUTION, keep_root=True)
        problems = check_fences.compare_all(root, pristine=True)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("TODO(lab07-2) must throw", problems[0].message)
        self.assertEqual(check_fences.compare_all(root), [])  # the default mode leaves fence bodies alone
        self.assertEqual(run_main(["--root", root, "--pristine"]), 1)
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

    def test_missing_learner_twin(self):
        problems = self.tree(None, SOLUTION)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("does not exist", problems[0].message)

    def test_given_code_in_a_twin_is_reported(self):
        # A helper without a fence, in both twins alike (so no difference outside the fences): given code
        # that belongs in the lab's given file. Named with its line; the given file is suggested.
        helper = "static int twice(int x) { return 2 * x; }\n"
        problems = self.tree(LEARNER + helper, SOLUTION + helper, given="int given() { return 1; }\n")
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("solutions/07_example/step.cpp:14: `static int twice(int x)` holds no TODO fence",
                      problems[0].message)
        self.assertIn("labs/07_example/given.cpp", problems[0].message)
        # A class at namespace scope too; a lambda or a nested block inside a TODO function is not one.
        klass = "namespace scalelab {\ninline namespace ref {\nstruct Queue {\n  int n = 0;\n};\n}\n}\n"
        problems = self.tree(LEARNER + klass, SOLUTION + klass)
        self.assertEqual([p.message.split(" holds")[0] for p in problems],
                         ["solutions/07_example/step.cpp:16: `struct Queue`"])
        nested = SOLUTION.replace("  return 2 * x;\n", "  auto f = [](int y) { return y; };\n  { return 2 * f(x); }\n")
        self.assertEqual(self.tree(LEARNER, nested), [])

    def test_braces_in_comments_and_literals_are_not_code(self):
        text = ('namespace a::b {\n'
                'inline namespace ref {\n'
                '// a comment with a brace { and a semicolon ;\n'
                'const char* kOpen = "{ \\" }";  /* } */\n'
                "char c = '{';\n"
                'const char* kRaw = R"x(})x";\n'
                'int n = 1\'000;\n'
                'int f() {\n'
                '  return 0;\n'
                '}\n'
                '}  // namespace ref\n'
                '}  // namespace a::b\n')
        self.assertEqual(check_fences.namespace_scope_blocks(text), [(8, 10, "int f()")])

    def test_a_fence_outside_the_twins_is_reported(self):
        given = "int given() {\n  // TODO(lab07-3) BEGIN  x\n  return 1;\n  // TODO(lab07-3) END\n}\n"
        problems = self.tree(LEARNER, SOLUTION, given=given)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("labs/07_example/given.cpp:2: TODO(lab07-3) in a file with no reference twin", problems[0].message)

    def test_default_mode_accepts_a_learners_solution(self):
        # A learner who wrote the TODO bodies: no stubs left, and that is fine (the ctest runs on learners'
        # trees), while a change outside the fences is still reported; --pristine reports the two bodies.
        solved = SOLUTION.replace("2 * x", "x + x")
        root = self.tree(solved, SOLUTION, keep_root=True)
        self.assertEqual(check_fences.compare_all(root), [])
        self.assertEqual(len(check_fences.compare_all(root, pristine=True)), 2)  # no stub in lab07-1, lab07-2
        root = self.tree(solved.replace("int rate", "long rate"), SOLUTION, keep_root=True)
        self.assertEqual(len(check_fences.compare_all(root)), 1)

    def test_shared_files_are_the_labs_other_sources(self):
        root = self.tree(LEARNER, SOLUTION, keep_root=True, given="int given() { return 1; }\n")
        with open(os.path.join(root, "labs", "07_example", "step.h"), "w") as f:
            f.write("int step(int x);\n")
        self.assertEqual(check_fences.shared_files(root, "07_example"),
                         [os.path.join("labs", "07_example", "given.cpp"), os.path.join("labs", "07_example", "step.h")])


if __name__ == "__main__":
    unittest.main()
