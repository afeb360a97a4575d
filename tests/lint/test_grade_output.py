#!/usr/bin/env python3
"""test_grade_output.py — what scripts/grade prints for a check that did not pass (ctest
lint.grade_output_selftest). Passes when
  - `stuck? scripts/hint NN-K` names the TODO the failure message names ("... (lab05-8 train_step)"), not
    the first of the check's README list; the stub's own id when it was not implemented; the list otherwise;
  - a measured text of several lines (ranks that differ, grading.cpp) is printed one line per rank group;
  - the `stuck?` line carries `--lang hi` when the learner reads Hindi (SCALELAB_LANG=hi), and nothing
    otherwise;
  - a check whose process died keeps the signal's lines (MPI's "Signal: ...") in its message, and its rerun
    command carries OpenMPI's two root variables when the grader runs as root;
  - a lab whose manifest says it trains on data/kjv gets it made when it is missing (a stand-in
    prepare_corpus.sh in a scratch root), and when that fails the message names the command to run.
"""
import contextlib
import io
import os
import sys
import tempfile
import unittest
import unittest.mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab_docs  # noqa: E402

grade = lab_docs.load_script("grade")


class TodosToTry(unittest.TestCase):
    listed = {"lab05.sgd_steps_match_dense": ["lab05-8", "lab05-2", "lab05-3", "lab05-4", "lab05-5"]}

    def row(self, message, todo=""):
        return {"check_id": "lab05.sgd_steps_match_dense", "check_message": message, "check_todo": todo}

    def test_named_by_the_failure_first(self):
        got = grade.todos_to_try(self.row("step 1 (m = 2 micro-batches): ... (lab05-5 the loss) and lab07-3"),
                                 self.listed)
        self.assertEqual(got, ["lab05-5", "lab05-8", "lab05-2", "lab05-3", "lab05-4"])  # lab07-3: another lab

    def test_stub_id_wins(self):
        self.assertEqual(grade.todos_to_try(self.row("TODO(lab05-3) g", "lab05-3 g_forward"), self.listed),
                         ["lab05-3"])

    def test_nothing_named_keeps_the_list(self):
        self.assertEqual(grade.todos_to_try(self.row("relative error 1e-2"), self.listed), self.listed[
            "lab05.sgd_steps_match_dense"])


class MeasuredLines(unittest.TestCase):
    def test_one_line_per_rank_group(self):
        row = {"check_id": "lab05.x", "check_points": "2", "check_status": "failed", "check_target": "t",
               "check_hint": "h", "check_message": "m",
               "check_measured": "rank 1 (failed): loss 2.0\nrank 0 (passed): every parameter as one process's"}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            grade.print_table("05", "reference", [row])
        lines = out.getvalue().splitlines()
        first = [ln for ln in lines if "measured" in ln]
        self.assertEqual(len(first), 1, out.getvalue())
        at = lines.index(first[0])
        self.assertIn("rank 1 (failed): loss 2.0", lines[at])
        self.assertIn("rank 0 (passed)", lines[at + 1])


class StuckLanguage(unittest.TestCase):
    row = {"check_id": "lab03.bucket_layout", "check_points": "3", "check_status": "failed", "check_target": "t",
           "check_hint": "h", "check_message": "m"}

    def stuck(self, env):
        """The text after `stuck?` for a failed check, env the only SCALELAB_LANG setting."""
        out = io.StringIO()
        others = {k: v for k, v in os.environ.items() if k != "SCALELAB_LANG"}
        with unittest.mock.patch.dict(os.environ, dict(others, **env), clear=True), contextlib.redirect_stdout(out):
            grade.print_table("03", "learner", [self.row])
        return [ln.split(None, 1)[1] for ln in out.getvalue().splitlines() if ln.strip().startswith("stuck?")]

    def test_hindi_reader_gets_lang_hi(self):
        self.assertEqual(self.stuck({"SCALELAB_LANG": "hi"}),
                         ["scripts/hint 03-3 --lang hi: the TODO's hints, one tier at a time"])

    def test_english_unchanged(self):
        for env in ({}, {"SCALELAB_LANG": "en"}, {"SCALELAB_LANG": "xx"}):  # xx: scripts/hint says what is wrong
            self.assertEqual(self.stuck(env), ["scripts/hint 03-3: the TODO's hints, one tier at a time"], env)


class Corpus(unittest.TestCase):
    def scratch(self, script):
        root = tempfile.mkdtemp()
        os.makedirs(os.path.join(root, "scripts"))
        path = os.path.join(root, "scripts", "prepare_corpus.sh")
        with open(path, "w") as f:
            f.write("#!/usr/bin/env bash\n" + script)
        os.chmod(path, 0o755)
        return root

    def ensure(self, root, corpus=True):
        real = grade.lab_manifests.find
        grade.lab_manifests.find = lambda number, r=None, b=None: {"number": number, "corpus": corpus}
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return grade.ensure_corpus("/nonexistent-build", "08", root=root)
        finally:
            grade.lab_manifests.find = real

    def test_made_when_missing(self):
        root = self.scratch("mkdir -p data/kjv && echo x > data/kjv/train_000000.bin && echo made >> made.txt\n")
        self.assertEqual(self.ensure(root), "")
        self.assertTrue(grade.corpus_ready(root))
        self.assertEqual(self.ensure(root), "")  # there now: not made again
        with open(os.path.join(root, "made.txt")) as f:
            self.assertEqual(f.read().split(), ["made"])

    def test_not_for_a_lab_without_corpus(self):
        root = self.scratch("echo made > made.txt\n")
        self.assertEqual(self.ensure(root, corpus=False), "")
        self.assertFalse(os.path.exists(os.path.join(root, "made.txt")))

    def test_failure_names_the_command(self):
        root = self.scratch("echo 'no text to shard' >&2; exit 1\n")
        problem = self.ensure(root)
        self.assertIn("no text to shard", problem)
        self.assertIn("scripts/prepare_corpus.sh --build-dir /nonexistent-build --out data/kjv", problem)


class CrashedCheck(unittest.TestCase):
    """A check whose process died before writing its record: the signal that killed it is kept in the message
    even when MPI's report pushes it above the last lines, and the rerun command runs as root."""
    test = {"name": "lab10.layout_and_refusals.learner", "timeout": 300.0,
            "command": ["/usr/bin/mpiexec", "-n", "2", "/b/tests/bin/learner/test_lab10_np2",
                        "--gtest_filter=Lab10Cp.LayoutAndRefusals", "--gtest_output=json:/nonexistent/r.json"]}
    output = "\n".join(["[rank 0] make_layout", "*** Process received signal ***",
                         "Signal: Floating point exception (8)", "Signal code: Integer divide-by-zero (1)"] +
                        [f"mpi noise line {i}" for i in range(12)])

    def row(self):
        with unittest.mock.patch.object(grade, "describe", return_value=None):
            return grade.grade_test(self.test, {"exit": "Failed", "output": self.output})

    def test_signal_kept(self):
        message = self.row()["check_message"]
        self.assertIn("Signal: Floating point exception (8)", message)
        self.assertIn("Integer divide-by-zero", message)
        self.assertIn("mpi noise line 11", message)

    def test_rerun_as_root(self):
        with unittest.mock.patch.object(grade.os, "geteuid", return_value=0):
            self.assertTrue(self.row()["rerun"].startswith("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "))
        with unittest.mock.patch.object(grade.os, "geteuid", return_value=1000):
            self.assertTrue(self.row()["rerun"].startswith("/usr/bin/mpiexec"))


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
