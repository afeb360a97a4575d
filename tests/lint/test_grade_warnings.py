#!/usr/bin/env python3
"""test_grade_warnings.py — scripts/grade names the given files a learner changed, committed or not.

scripts/grade (changed_shared_files) compares a lab's non-twin sources with the kit's commit in git: where
the learner's branch left the branch it tracks (a clone of the kit), else HEAD. Here on throw-away git
repositories: a kit, and a learner's clone of it that edits a given file, a fence body and a header.

  python3 tests/lint/test_grade_warnings.py      (registered as ctest lint.grade_warnings_selftest;
                                                  exit 77, skipped, without git)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_docs  # noqa: E402  (load_script: scripts/grade as a module)

grade = lab_docs.load_script("grade")

TWIN = "int step(int x) {\n  // TODO(lab07-1) BEGIN  double it\n  return 2 * x;\n  // TODO(lab07-1) END\n}\n"
FILES = {
    "labs/07_example/step.cpp": TWIN.replace("return 2 * x;", 'throw scalelab::NotImplemented("lab07-1 step");'),
    "solutions/07_example/step.cpp": TWIN,
    "labs/07_example/step.h": "int step(int x);\n",
    "labs/07_example/given.cpp": "int given(int x) { return step(x) + 1; }\n",
    "labs/07_example/README.md": "# lab 07\n",
}


def git(root, *args):
    subprocess.run(["git", "-C", root, "-c", "user.name=test", "-c", "user.email=test@example.com", *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def write(root, rel, text):
    os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    with open(os.path.join(root, rel), "w") as f:
        f.write(text)


class GradeWarningsTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.kit = os.path.join(tmp.name, "kit")
        os.makedirs(self.kit)
        for rel, text in FILES.items():
            write(self.kit, rel, text)
        git(self.kit, "init", "-q")
        git(self.kit, "add", ".")
        git(self.kit, "commit", "-q", "-m", "the kit")
        self.clone = os.path.join(tmp.name, "clone")
        git(tmp.name, "clone", "-q", self.kit, self.clone)

    def test_untouched_clone_has_no_changes(self):
        base, changed = grade.changed_shared_files("07", root=self.clone)
        self.assertEqual(changed, [])

    def test_given_file_and_header_changes_are_named_committed_or_not(self):
        write(self.clone, "labs/07_example/given.cpp", "int given(int x) { return step(x) + 2; }\n")
        write(self.clone, "labs/07_example/step.cpp", FILES["solutions/07_example/step.cpp"])  # the learner's TODO
        write(self.clone, "labs/07_example/README.md", "# my notes\n")  # not code
        base, changed = grade.changed_shared_files("07", root=self.clone)
        self.assertEqual(changed, ["labs/07_example/given.cpp"])
        git(self.clone, "commit", "-q", "-am", "my work")  # committed: still a change against the kit
        write(self.clone, "labs/07_example/step.h", "int step(int x);  // mine\n")
        base, changed = grade.changed_shared_files("07", root=self.clone)
        self.assertEqual(changed, ["labs/07_example/given.cpp", "labs/07_example/step.h"])
        kit_head = subprocess.run(["git", "-C", self.kit, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                                  text=True, check=True).stdout.strip()
        self.assertEqual(base, kit_head)  # the kit's commit, not the learner's

    def test_without_an_upstream_head_is_the_kit(self):
        write(self.kit, "labs/07_example/given.cpp", "int given(int x) { return 0; }\n")
        base, changed = grade.changed_shared_files("07", root=self.kit)
        self.assertEqual(changed, ["labs/07_example/given.cpp"])

    def test_outside_git_nothing_is_claimed(self):
        shutil.rmtree(os.path.join(self.clone, ".git"))
        self.assertEqual(grade.changed_shared_files("07", root=self.clone), (None, []))


if __name__ == "__main__":
    if shutil.which("git") is None:
        print("SKIPPED: git is not installed")
        sys.exit(77)
    unittest.main()
