#!/usr/bin/env python3
"""test_quiz.py — scripts/quiz: every lab's quiz file, a pass and a fail on canned answers, questions graded
from small fixture run logs, and a missing log explained. ctest lint.quiz (tests/lint/CMakeLists.txt).

The fixture logs are the few records docs/log_schema.md gives each lab (lab 06's `bubble` per step, lab 08's
`stragglers` in the summary), written into a temp runs/ folder; nothing is built or run.
"""
import importlib.machinery
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUIZ = os.path.join(REPO, "scripts", "quiz")
sys.path.insert(0, os.path.join(REPO, "scripts", "lib"))
import labs  # noqa: E402

_loader = importlib.machinery.SourceFileLoader("quiz", QUIZ)
_spec = importlib.util.spec_from_loader("quiz", _loader)
quiz = importlib.util.module_from_spec(_spec)
_loader.exec_module(quiz)


def write_run(root, lab, run_id, ranks):
    """ranks: {rank: [records]} -> root/lab<lab>/<run_id>/rank<k>.jsonl."""
    d = os.path.join(root, f"lab{lab}", run_id)
    os.makedirs(d)
    for rank, records in ranks.items():
        with open(os.path.join(d, f"rank{rank}.jsonl"), "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(dict({"rank": rank}, **r)) + "\n")
    return d


def lab06_run(bubbles):
    """Two stages, 1F1B, m = 4: formula 1/5 = 0.2; bubbles[rank] = that stage's bubble in steps 1 and 2."""
    out = {}
    for rank, b in enumerate(bubbles):
        out[rank] = [{"type": "run", "world_size": 2, "config": {"pp": 2, "schedule": "1f1b", "micro_batches": 4,
                                                                  "chunks": 1, "bubble_formula": 0.2}},
                     {"type": "step", "step": 0, "bubble": 0.9},  # warm-up: left out
                     {"type": "step", "step": 1, "bubble": b},
                     {"type": "step", "step": 2, "bubble": b},
                     {"type": "summary"}]
    return out


def run_quiz(number, answers, runs_root):
    """(exit status, output) of scripts/quiz NUMBER with the answers on stdin."""
    p = subprocess.run([sys.executable, QUIZ, number, "--answers", "-", "--runs", runs_root],
                       input="\n".join(answers) + "\n", capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def right_answers(number):
    lab = labs.find(number)
    return [str(q["answer"]) for q in quiz.load_quiz(lab)["questions"]]


class QuizFiles(unittest.TestCase):
    def test_every_lab_has_a_valid_quiz_in_the_lessons_format(self):
        for lab in labs.load():
            with self.subTest(lab=lab["number"]):
                q = quiz.load_quiz(lab)  # raises with the problems
                self.assertEqual(len(q["questions"]), 5)
                self.assertEqual(q["pass"], 3)

    def test_every_hindi_quiz_is_valid_too(self):
        for lab in labs.load():
            path, notice = quiz.quiz_path(lab, "hi")
            if notice is None:  # labs/NN_name/quiz.hi.json exists (tests/lint/hindi_sync.py: same answers)
                with self.subTest(lab=lab["number"]):
                    self.assertEqual(len(quiz.load_quiz(lab, "hi")["questions"]), 5)

    def test_the_hard_question_is_lab_04s(self):
        texts = " ".join(q["text"] for q in quiz.load_quiz(labs.find("04"))["questions"])
        self.assertIn("1.4x instead of 2x", texts)

    def test_a_broken_quiz_is_named(self):
        bad = {"pass": 9, "questions": [{"text": "t", "why": "w", "choices": {"a": "x", "b": "y"}, "answer": "c"},
                                        {"text": "t", "why": "w", "measure": "nope"}]}
        problems = " | ".join(quiz.quiz_problems(bad))
        for part in ("\"pass\"", "not a choice", "measure 'nope'", "needs \"command\""):
            self.assertIn(part, problems)


class Grading(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.runs = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_pass_on_right_answers_and_answers_shown_only_after(self):
        answers = right_answers("09")  # lab 09's questions read no run
        rc, out = run_quiz("09", answers, self.runs)
        self.assertEqual(rc, 0, out)
        self.assertIn("5 of 5 right: passed", out)
        before = out.split("--- Answers ---")[0]
        for q in quiz.load_quiz(labs.find("09"))["questions"]:
            self.assertNotIn(q["why"], before)
            self.assertIn(q["why"], out)

    def test_three_right_pass_two_fail(self):
        answers = right_answers("09")
        three = answers[:3] + ["999", "zz"]
        two = answers[:2] + ["999", "zz", "zz"]
        self.assertEqual(run_quiz("09", three, self.runs)[0], 0)
        rc, out = run_quiz("09", two, self.runs)
        self.assertEqual(rc, 1, out)
        self.assertIn("2 of 5 right: not passed", out)

    def test_input_ending_early_shows_no_answer(self):
        # a closed pipe or /dev/null must not grade blanks and print the answer key
        for args, stdin in ((["09"], "a\n"), (["09", "--answers", "-"], "a\nb\n")):
            p = subprocess.run([sys.executable, QUIZ] + args + ["--runs", self.runs], input=stdin,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertIn("nothing graded, no answer shown", p.stderr)
            self.assertNotIn("--- Answers ---", p.stdout)
            for q in quiz.load_quiz(labs.find("09"))["questions"]:
                self.assertNotIn(q["why"], p.stdout)

    def test_bubble_graded_from_the_fixture_log(self):
        write_run(self.runs, "06", "20260101T000000Z-aaaa", lab06_run([0.30, 0.20]))
        fixed = [str(q["answer"]) for q in quiz.load_quiz(labs.find("06"))["questions"][2:]]
        # the run's formula 0.2 and its measured bubble: the mean of the stages' means, 0.25 (step 0 left out)
        rc, out = run_quiz("06", ["0.2", "0.25"] + fixed, self.runs)
        self.assertEqual(rc, 0, out)
        self.assertIn("5 of 5 right", out)
        self.assertIn("answered from your run", out)
        self.assertIn("20260101T000000Z-aaaa", out)
        # 0.9 is step 0's warm-up bubble: not right; 0.2 for the measured one is 0.05 off (tolerance 0.03)
        rc, out = run_quiz("06", ["0.9", "0.2"] + fixed, self.runs)
        self.assertIn("3 of 5 right", out)
        self.assertIn("1. not right", out)
        self.assertIn("2. not right", out)

    def test_the_newest_fitting_run_is_read(self):
        old = write_run(self.runs, "06", "old", lab06_run([0.5, 0.5]))
        new = write_run(self.runs, "06", "new", lab06_run([0.3, 0.3]))
        os.utime(os.path.join(old, "rank0.jsonl"), (1, 1))
        os.utime(os.path.join(new, "rank0.jsonl"), (2, 2))
        values, run_dir = quiz.measure_bubble(self.runs, "06", "cmd")
        self.assertEqual(run_dir, new)
        self.assertAlmostEqual(values["answer"], 0.3)

    def test_straggler_rank_from_the_fixture_summary(self):
        summary = {"type": "summary", "stragglers": [{"rank": 2, "compute_ms": 120.6, "typical_compute_ms": 60.6,
                                                      "ratio": 1.99, "others_wait_ms": 60.6}]}
        write_run(self.runs, "08", "r", {0: [{"type": "run", "world_size": 4}, summary]})
        items = quiz.prepare(quiz.load_quiz(labs.find("08")), labs.find("08"), self.runs)
        self.assertEqual(items[0]["answer"], 2)
        self.assertTrue(quiz.is_right(items[0], "2"))
        self.assertFalse(quiz.is_right(items[0], "1"))

    def test_exposed_comm_skips_warm_up_and_single_rank_runs(self):
        steps = [{"type": "step", "step": 0, "step_ms": 100, "comm_ms": 90},
                 {"type": "step", "step": 1, "step_ms": 100, "comm_ms": 10},
                 {"type": "step", "step": 2, "step_ms": 100, "comm_ms": 20}]
        write_run(self.runs, "03", "two", {0: [{"type": "run", "world_size": 2}] + steps, 1: []})
        values, _ = quiz.measure_exposed_comm(self.runs, "03", "cmd")
        self.assertAlmostEqual(values["answer"], 15.0)
        one = write_run(self.runs, "03", "one", {0: [{"type": "run", "world_size": 1}] + steps})
        os.utime(os.path.join(one, "rank0.jsonl"), None)  # newer, but one rank: not the one read
        self.assertEqual(quiz.measure_exposed_comm(self.runs, "03", "cmd")[1], os.path.join(self.runs, "lab03", "two"))

    def test_a_missing_log_says_what_to_run(self):
        lab = labs.find("06")
        rc, out = run_quiz("06", ["0.2", "0.25", "a", "a", "a"], self.runs)
        self.assertEqual(rc, 1, out)
        command = quiz.load_quiz(lab)["questions"][0]["command"]
        self.assertIn(f"run first: {command}", out)
        self.assertIn("cannot be graded", out)
        self.assertIn("1. not right", out)

    def test_a_missing_run_shows_no_raw_placeholder(self):
        # Every lab's measured questions without a run: "?" for the run's values, never "{tp}" (lab 07's
        # question 5 printed "tp {tp} x pp {pp}"), and the command to run first.
        for lab in labs.load():
            if not os.path.isfile(os.path.join(REPO, lab["dir"], "quiz.json")):
                continue
            questions = quiz.load_quiz(lab)["questions"]
            if not any("measure" in q for q in questions):
                continue
            rc, out = run_quiz(lab["number"], [""] * len(questions), self.runs)
            self.assertEqual(rc, 1, out)
            self.assertNotRegex(out, r"\{[a-z_]+\}", f"lab {lab['number']}")
            for q in questions:
                if "measure" in q:
                    self.assertIn(f"run first: {q['command']}", out)

    def write_why_not_2x(self, name, provoke, blind=None, culprits=(), efficiency=0.7):
        """runs/why_not_2x/<name>/{run,report}.json as scripts/why_not_2x.sh writes them."""
        d = os.path.join(self.runs, "why_not_2x", name)
        os.makedirs(d)
        names = ["data-loader saturation", "exposed gradient communication", "per-device batch too small",
                 "straggling device"]
        causes = [{"order": i + 1, "cause": n, "culprit": n in culprits, "measured": 0.5, "threshold": 0.1,
                   "has_evidence": True} for i, n in enumerate(names)]
        with open(os.path.join(d, "run.json"), "w", encoding="utf-8") as f:
            json.dump({"provoke": provoke, "blind": blind, "sim": True, "np": 2}, f)
        with open(os.path.join(d, "report.json"), "w", encoding="utf-8") as f:
            json.dump({"world_size": 2, "single_tokens_per_s": 100.0, "multi_tokens_per_s": 2 * 100.0 * efficiency,
                       "single_mfu": 0.08, "multi_mfu": 0.06, "scaling_efficiency": efficiency, "causes": causes}, f)

    def test_lab04_part2_graded_from_why_not_2x_runs(self):
        self.write_why_not_2x("healthy", "none", efficiency=0.95)
        self.write_why_not_2x("cpu-loader", "loader", efficiency=0.5)  # provoked, not blind: not the healthy one
        for k, (provoke, cause) in enumerate([("batch", "per-device batch too small"),
                                              ("loader", "data-loader saturation"),
                                              ("straggler", "straggling device"),
                                              ("comm", "exposed gradient communication")], 1):
            self.write_why_not_2x(f"blind-{k}", provoke, blind=k, culprits=(cause,))
        p = subprocess.run([sys.executable, QUIZ, "04", "--part", "2", "--answers", "-", "--runs", self.runs],
                           input="95\nc\na\nd\nb\n", capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("part 2: the lesson's lab", p.stdout)
        self.assertIn("5 of 5 right: passed (pass: 4)", p.stdout)
        # the blind runs' causes are not printed before the answers
        self.assertNotIn("provoked straggling device", p.stdout.split("--- Answers ---")[0])
        p = subprocess.run([sys.executable, QUIZ, "04", "--part", "2", "--answers", "-", "--runs", self.runs],
                           input="50\nc\nb\nd\nb\n", capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stdout)  # the efficiency (50: not the healthy run's) and blind 2 wrong
        self.assertIn("3 of 5 right: not passed", p.stdout)

    def test_lab04_part2_without_runs_says_what_to_run(self):
        p = subprocess.run([sys.executable, QUIZ, "04", "--part", "2", "--answers", "-", "--runs", self.runs],
                           input="95\nc\na\nd\nb\n", capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("run first: scripts/why_not_2x.sh --sim --blind 3", p.stdout)

    def test_a_missing_part_is_a_usage_error(self):
        p = subprocess.run([sys.executable, QUIZ, "03", "--part", "2", "--answers", "-", "--runs", self.runs],
                           input="", capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no part 2 quiz", p.stderr)

    def test_unknown_lab_is_a_usage_error(self):
        self.assertEqual(run_quiz("42", [], self.runs)[0], 2)


class Hindi(unittest.TestCase):
    """--lang hi reads quiz.hi.json beside quiz.json (a copy of lab 09's with one text translated, in a temp
    lab folder), and falls back to quiz.json with a notice in Hindi and English where there is none."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.lab = dict(labs.find("09"), dir=self.tmp.name)  # quiz_path joins the repo root to an absolute dir
        with open(os.path.join(REPO, labs.find("09")["dir"], "quiz.json"), encoding="utf-8") as f:
            self.quiz = json.load(f)
        with open(os.path.join(self.tmp.name, "quiz.json"), "w", encoding="utf-8") as f:
            json.dump(self.quiz, f)

    def tearDown(self):
        self.tmp.cleanup()

    def test_the_hindi_file_is_read_where_it_exists(self):
        hi = json.loads(json.dumps(self.quiz))
        hi["questions"][0]["text"] = "योजनाकार (planner) क्या ढूँढता है?"
        with open(os.path.join(self.tmp.name, "quiz.hi.json"), "w", encoding="utf-8") as f:
            json.dump(hi, f, ensure_ascii=False)
        path, notice = quiz.quiz_path(self.lab, "hi")
        self.assertEqual((os.path.basename(path), notice), ("quiz.hi.json", None))
        self.assertEqual(quiz.load_quiz(self.lab, "hi")["questions"][0]["text"], "योजनाकार (planner) क्या ढूँढता है?")
        self.assertEqual(quiz.load_quiz(self.lab, "en")["questions"][0]["text"], self.quiz["questions"][0]["text"])

    def test_english_with_a_notice_where_there_is_none(self):
        path, notice = quiz.quiz_path(self.lab, "hi")
        self.assertEqual(os.path.basename(path), "quiz.json")
        self.assertIn("quiz.hi.json has no Hindi version yet; showing the English one", notice)
        self.assertIn("अभी हिन्दी में नहीं है", notice)

    def test_lang_option_and_environment_end_to_end(self):
        hindi = os.path.isfile(os.path.join(REPO, labs.find("09")["dir"], "quiz.hi.json"))
        for args, env in ((["--lang", "hi"], {}), ([], {"SCALELAB_LANG": "hi"})):
            p = subprocess.run([sys.executable, QUIZ, "09", "--answers", "-", "--runs", self.tmp.name] + args,
                               input="\n".join(right_answers("09")) + "\n", capture_output=True, text=True,
                               timeout=60, env=dict(os.environ, **env))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)  # the Hindi quiz has the English answers
            self.assertIn("5 में से 5 सही: पास" if hindi else "5 of 5 right: passed", p.stdout)
            self.assertEqual("has no Hindi version yet" in p.stdout, not hindi, p.stdout)
        p = subprocess.run([sys.executable, QUIZ, "09"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, SCALELAB_LANG="xx"))
        self.assertEqual(p.returncode, 2, p.stderr)


class Frame(unittest.TestCase):
    """The quiz's own words around the questions ("Question 2 of 5", "--- Answers ---", the verdicts, the
    score, the answer-format line) in the language of the quiz file read: English exactly as before, Hindi
    for a quiz.hi.json (scripts/lib/lang.py FRAME). A fixture quiz of three questions: multiple choice, a
    number with a unit, and one read from a fixture lab 06 run (the run's path shows as RUNS)."""

    QUIZ = {"pass": 2, "questions": [
        {"text": "Pick b.", "choices": {"a": "no", "b": "yes"}, "answer": "b", "why": "Because b."},
        {"text": "How many?", "answer": 12, "tolerance": 0.5, "unit": "GB", "why": "Twelve."},
        {"text": "Bubble?", "measure": "bubble", "command": "scripts/run 06", "tolerance": 0.03, "why": "{formula}."}]}
    ENGLISH = """Lab 06 (pipeline): 3 questions, 2 right to pass.

Question 1 of 3. Pick b.
  a) no
  b) yes
> b

Question 2 of 3. How many?
  Answer with a number in GB.
> 99

Question 3 of 3. Bubble?
  (answered from your run RUNS/lab06/r1)
  Answer with a number.
> 0.25

--- Answers ---

1. right (you: b; answer: b) yes)
   Because b.

2. not right (you: 99; answer: 12 GB (within 0.5 GB))
   Twelve.

3. right (you: 0.25; answer: 0.25 (within 0.03))
   0.2.

2 of 3 right: passed (pass: 2).
"""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.runs = self.tmp.name
        write_run(self.runs, "06", "r1", lab06_run([0.30, 0.20]))
        self.lab = {"number": "06", "title": "pipeline", "dir": self.tmp.name}

    def tearDown(self):
        self.tmp.cleanup()

    def output(self, words=None):
        out = io.StringIO()
        args = (self.lab, self.QUIZ, self.runs, ["b", "99", "0.25"], out) + ((words,) if words else ())
        passed = quiz.run_quiz(*args)
        return passed, out.getvalue().replace(self.runs, "RUNS")

    def test_english_frame_is_unchanged(self):
        self.assertEqual(self.output(), (True, self.ENGLISH))
        self.assertEqual(self.output("en"), (True, self.ENGLISH))

    def test_hindi_frame(self):
        passed, text = self.output("hi")
        self.assertTrue(passed)
        for line in ("लैब 06 (pipeline): 3 सवाल, पास होने के लिए 2 सही।", "सवाल 2 (3 में से)। How many?",
                     "  जवाब एक संख्या में दीजिए, GB में।", "  जवाब एक संख्या में दीजिए।",
                     "  (जवाब आपके रन RUNS/lab06/r1 से)", "--- जवाब ---",
                     "1. सही (आपका जवाब: b; सही जवाब: b) yes)",
                     "2. सही नहीं (आपका जवाब: 99; सही जवाब: 12 GB (0.5 GB की छूट के साथ))",
                     "3 में से 2 सही: पास (पास के लिए: 2)।"):
            self.assertIn(line, text.splitlines())
        for english in ("Question", "Answer", "right", "passed", "within", "answered from"):
            self.assertNotIn(english, text)

    def test_the_frame_follows_the_file_read(self):
        self.assertEqual(quiz.lang.of_file(quiz.quiz_path(labs.find("09"), "hi")[0]), "hi")
        self.assertEqual(quiz.lang.of_file(quiz.quiz_path(labs.find("09"), "en")[0]), "en")
        self.assertEqual(quiz.lang.of_file(quiz.quiz_path(self.lab, "hi")[0]), "en")  # no quiz.hi.json: English

    def test_every_frame_string_has_both_languages_with_the_same_fields(self):
        import string
        for key, texts in quiz.lang.FRAME.items():
            fields = [{f for _, f, _, _ in string.Formatter().parse(t) if f} for t in texts]
            self.assertEqual(len(texts), 2, key)
            self.assertEqual(fields[0], fields[1], key)


if __name__ == "__main__":
    unittest.main(verbosity=2)
