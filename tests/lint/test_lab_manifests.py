#!/usr/bin/env python3
"""test_lab_manifests.py — the manifest reader and lint (scripts/lib/labs.py) on tiny trees in a temp dir: a
tree whose two labs keep every rule passes; each planted fault (a folder the manifest does not spell, a twin
missing or extra, a dependency on a later lab, a notebook no manifest names, a stale labs table, a field of the
wrong type, an unknown field, a scale-demo expression that is not arithmetic, a simulated-cluster run the lab
cannot make) is reported; the scale-demo rows
and the shell assignments the scripts read say what the manifest says.

  python3 tests/lint/test_lab_manifests.py        (registered as ctest lint.lab_manifests_selftest)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "lib"))
import labs  # noqa: E402  (the module under test)

LAB00 = {"number": "00", "name": "probe", "title": "probe", "you_write": "nothing", "graded_on": "runs",
         "twins": [], "driver": "main.cpp", "ranks": {"default": 1, "allowed": "any"}, "corpus": False,
         "tests": ["tests/lab00"]}
LAB01 = {"number": "01", "name": "step", "title": "one step", "you_write": "the step", "graded_on": "the loss",
         "twins": ["step.cpp"], "given": ["given.cpp"], "driver": "main.cpp", "deps": [],
         "ranks": {"default": 1, "allowed": [1]}, "corpus": True, "tests": ["tests/lab01"],
         "notebooks": ["notebooks/01_step.ipynb"], "notebook_logs": "notebooks/logs/01_step.sh",
         "scale_demo": {"args": ["--batch", "{B}", "--tp", "{gcd(N, heads)}"],
                        "skip": [{"if": "N > layers", "why": "{model} has {layers} layers"}], "table_note": "batch"},
         "sim": {"ranks": 1, "args": ["--batch", "2"], "why": "one process"}}


def write(root, rel, text):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def tree(lab00=LAB00, lab01=LAB01):
    """A tree with labs 00 and 01 that keeps every rule (the tables written from the manifests)."""
    root = Path(tempfile.mkdtemp(prefix="lab_manifests_"))
    for lab in (lab00, lab01):
        d = f"labs/{lab['number']}_{lab['name']}"
        write(root, f"{d}/lab.json", json.dumps(lab))
        write(root, f"{d}/README.md", "## Your task\n")
        write(root, f"{d}/main.cpp", "int main() {}\n")
    write(root, "labs/01_step/step.cpp", "// twin\n")
    write(root, "labs/01_step/given.cpp", "// given\n")
    write(root, "labs/01_step/hints.md", "## lab01-1\n")
    write(root, "solutions/01_step/step.cpp", "// twin\n")
    write(root, "tests/lab00/CMakeLists.txt", "add_test(NAME lab00.probe COMMAND true)\n")
    write(root, "tests/lab01/CMakeLists.txt", "sl_add_graded_test(01 test_lab01 SOURCES t.cpp CHECKS A.B)\n")
    write(root, "notebooks/01_step.ipynb", "{}\n")
    write(root, "notebooks/logs/01_step.sh", "true\n")
    for doc in labs.TABLES:
        write(root, doc, f"# doc\n\n{labs.TABLE_BEGIN}\n{labs.TABLE_END}\n\nmore\n")
    labs.write_tables(str(root), labs.load(str(root)))
    return root


class LabManifests(unittest.TestCase):
    def setUp(self):
        self.root = tree()
        self.addCleanup(lambda: shutil.rmtree(self.root, ignore_errors=True))  # the tree the test ended with

    def problems(self):
        return labs.check(str(self.root))

    def assertReported(self, text):
        found = self.problems()
        self.assertTrue(any(text in p for p in found), f"'{text}' not in {found}")

    def test_a_tree_that_keeps_the_rules_passes(self):
        self.assertEqual(self.problems(), [])
        self.assertEqual([lab["number"] for lab in labs.load(str(self.root))], ["00", "01"])
        lab = labs.find("01", str(self.root))
        self.assertTrue(lab["graded"] and lab["single_process"])
        self.assertEqual((lab["dir"], lab["solutions_dir"]), ("labs/01_step", "solutions/01_step"))
        self.assertFalse(labs.find("00", str(self.root))["graded"])

    def test_the_folder_must_be_number_and_name(self):
        (self.root / "labs/01_step").rename(self.root / "labs/01_steps")
        self.assertReported("must spell the folder 01_steps")

    def test_a_lab_folder_without_a_manifest(self):
        write(self.root, "labs/02_new/README.md", "x\n")
        self.assertReported("labs/02_new: no lab.json")

    def test_twins_are_solutions_files_exactly(self):
        (self.root / "solutions/01_step/step.cpp").unlink()
        self.assertReported("twin solutions/01_step/step.cpp does not exist")
        write(self.root, "solutions/01_step/step.cpp", "// twin\n")
        write(self.root, "solutions/01_step/helper.cpp", "// not named\n")
        self.assertReported("holds helper.cpp, which \"twins\" does not name")

    def test_deps_name_earlier_labs_with_todos(self):
        lab = dict(LAB01, deps=["00"])  # lab 00 has no TODOs: no lab00_ref
        shutil.rmtree(self.root)
        self.root = tree(lab01=lab)
        self.assertReported("deps \"00\" is not another lab with TODOs")
        lab = dict(LAB01, deps=["01"])  # itself
        shutil.rmtree(self.root)
        self.root = tree(lab01=lab)
        self.assertReported("deps \"01\" is not another lab with TODOs")
        lab = dict(LAB01, deps=["lab01_given"])  # a target without a lab.cmake to define it
        shutil.rmtree(self.root)
        self.root = tree(lab01=lab)
        self.assertReported("nor a target of labs/01_step/lab.cmake")

    def test_graded_checks_and_twins_go_together(self):
        write(self.root, "tests/lab01/CMakeLists.txt", "add_test(NAME x COMMAND true)\n")
        self.assertReported("the lab has TODOs but no folder of \"tests\" adds graded checks")

    def test_every_notebook_belongs_to_a_lab(self):
        write(self.root, "notebooks/02_orphan.ipynb", "{}\n")
        self.assertReported("notebooks/02_orphan.ipynb: no manifest names it")

    def test_a_stale_labs_table_is_reported_and_rewritten(self):
        lab = dict(LAB01, you_write="the step, and more")
        write(self.root, "labs/01_step/lab.json", json.dumps(lab))
        self.assertReported("README.md: the labs table is not the manifests'")
        self.assertReported("docs/design.md: the labs table is not the manifests'")
        labs.write_tables(str(self.root), labs.load(str(self.root)))
        self.assertEqual(self.problems(), [])
        self.assertIn("| 01 | [step](labs/01_step/README.md) | the step, and more | `scripts/run 01` |",
                      (self.root / "README.md").read_text())

    def test_fields_of_the_wrong_type_or_unknown_stop_the_reader(self):
        for bad, said in ((dict(LAB01, corpus="yes"), "\"corpus\" is \"yes\", not a true/false"),
                          (dict(LAB01, twin=["step.cpp"]), "unknown field(s) twin"),
                          (dict(LAB01, ranks={"default": 0, "allowed": "any"}), "\"ranks\" is"),
                          (dict(LAB01, programs={}), "programs: made by the readers")):
            write(self.root, "labs/01_step/lab.json", json.dumps(bad))
            with self.assertRaises(labs.ManifestError) as e:
                labs.load(str(self.root))
            self.assertIn(said, str(e.exception))
            self.assertReported(said)

    def test_scale_demo_rows(self):
        lab = labs.find("01", str(self.root))
        env = dict(N=4, B=8, G=32, S=3, heads=6, layers=4, model="demo")
        self.assertEqual(labs.scale_row(lab, env), ("run", ["--batch", "8", "--tp", "2"]))
        self.assertEqual(labs.scale_row(lab, dict(env, N=8)), ("skip", "demo has 4 layers"))
        for expr in ("__import__('os')", "B.real", "open('x')", "N ** 1000"):
            with self.assertRaises(labs.ManifestError, msg=expr):
                labs.evaluate(expr, env)
        with self.assertRaises(labs.ManifestError):
            labs.evaluate("Q + 1", env)  # an unknown name
        lab = dict(LAB01, scale_demo={"args": ["--x", "{os.system('true')}"]})
        write(self.root, "labs/01_step/lab.json", json.dumps(lab))
        self.assertReported("scale_demo:")

    def test_sim_runs(self):
        for bad, said in (({"ranks": 2, "args": []}, "ranks 2 is not among the lab's allowed ranks [1]"),
                          ({"ranks": 0}, "ranks 0 is not a number of ranks >= 1"),
                          ({"ranks": 1, "args": ["--device", "sim"]}, "args name --device, --backend or --sim-gpu"),
                          ({"ranks": 1, "args": [3]}, "args [3] is not a list of strings"),
                          ({"ranks": 1, "steps": 3}, "unknown field(s) steps")):
            write(self.root, "labs/01_step/lab.json", json.dumps(dict(LAB01, sim=bad)))
            self.assertReported(f"sim: {said}")
        write(self.root, "labs/00_probe/lab.json", json.dumps(dict(LAB00, driver=None, sim={"ranks": 1})))
        self.assertReported("labs/00_probe/lab.json: sim: the lab has no program to run")

    def test_the_command_line_the_scripts_read(self):
        def run(*a):
            return subprocess.run([sys.executable, str(REPO / "scripts/lib/labs.py"), "--root", str(self.root), *a],
                                  capture_output=True, text=True)
        self.assertEqual(run("list").stdout.split(), ["00", "01"])
        self.assertEqual(run("list", "--graded").stdout.split(), ["01"])
        self.assertEqual(run("list", "--scale-demo").stdout.split(), ["01"])
        self.assertEqual(run("list", "--sim").stdout.split(), ["01"])
        out = run("shell", "01").stdout
        for line in ("lab_exists=1", "lab_name=step", "lab_np_allowed=1", "lab_single_process=1", "lab_corpus=1",
                     "lab_exe=''", "lab_notebook_logs=notebooks/logs/01_step.sh"):
            self.assertIn(line, out.splitlines())
        self.assertEqual(run("shell", "07").stdout.strip(), "lab_exists=0")
        self.assertEqual(run("scale-row", "01", "N=8", "B=4", "G=32", "S=3", "heads=4", "layers=8",
                             "model=demo").stdout.split("\n"), ["run", "--batch", "4", "--tp", "4", ""])
        self.assertEqual(run("check").returncode, 0)
        # a build's labs.json: the same manifests, with the programs per track
        build = self.root / "build"
        doc = {"labs": [dict(lab, programs={"learner": None, "reference": {"target": "lab01_step_ref",
                                                                           "path": "/b/bin/reference/lab01_step"}})
                        for lab in (LAB00, LAB01)]}
        write(self.root, "build/labs.json", json.dumps(doc))
        out = run("--build-dir", str(build), "shell", "01", "--track", "reference").stdout.splitlines()
        self.assertIn("lab_exe=/b/bin/reference/lab01_step", out)
        self.assertIn("lab_target=lab01_step_ref", out)
        out = run("--build-dir", str(build), "shell", "01", "--track", "learner").stdout.splitlines()
        self.assertIn("lab_exe=''", out)


if __name__ == "__main__":
    unittest.main()
