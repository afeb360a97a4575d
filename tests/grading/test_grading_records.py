#!/usr/bin/env python3
"""test_grading_records.py — the grading records say what happened (docs/grading.md).

Runs each check of the grading_selftest program (tests/grading/grading_selftest.cpp) alone, as
sl_add_graded_test does, and reads its GoogleTest JSON record the way scripts/grade does.
  tests/grading/test_grading_records.py <path to grading_selftest>   (ctest: grading.records_selftest)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

PROGRAM = None  # set from argv


def record(test_name, extra_env=None):
    """Runs one TEST; returns (exit code, the check_* properties of its record)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "record.json")
        env = dict(os.environ, **(extra_env or {}))
        p = subprocess.run([PROGRAM, f"--gtest_filter=GradingSelftest.{test_name}", f"--gtest_output=json:{path}"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        with open(path) as f:
            doc = json.load(f)
    (case,) = [c for s in doc["testsuites"] for c in s["testsuite"]]
    return p.returncode, {k: v for k, v in case.items() if k.startswith("check_")}


class GradingRecordsTest(unittest.TestCase):
    def test_passed(self):
        rc, rec = record("Passes")
        self.assertEqual(rc, 0)
        self.assertEqual(rec["check_status"], "passed")
        self.assertEqual(rec["check_id"], "lab99.passes")
        self.assertEqual(rec["check_points"], "2")
        self.assertEqual(rec["check_target"], "1 + 1 = 2")
        self.assertEqual(rec["check_hint"], "arithmetic")
        self.assertEqual(rec["check_measured"], "1 + 1 = 2")
        self.assertEqual(rec["check_track"], "selftest")

    def test_failed_expectation(self):
        rc, rec = record("FailsAnExpectation")
        self.assertNotEqual(rc, 0)
        self.assertEqual(rec["check_status"], "failed")
        self.assertIn("planted failure", rec["check_message"])
        self.assertEqual(rec["check_measured"], "1 + 1 = 2")

    def test_not_implemented_is_a_status_not_a_crash(self):
        rc, rec = record("ThrowsNotImplemented")
        self.assertEqual(rc, 1)  # a failed test, not a signal
        self.assertEqual(rec["check_status"], "not_implemented")
        self.assertEqual(rec["check_todo"], "lab99-4 some_function")
        self.assertEqual(rec["check_message"], "TODO(lab99-4) some_function")

    def test_error_is_a_failure(self):
        rc, rec = record("ThrowsError")
        self.assertEqual(rc, 1)
        self.assertEqual(rec["check_status"], "failed")
        self.assertIn("planted check failure: 1 > 2", rec["check_message"])

    def test_skipped(self):
        rc, rec = record("Skips")
        self.assertEqual(rc, 0)
        self.assertEqual(rec["check_status"], "skipped")
        self.assertEqual(rec["check_message"], "no GPU here")

    def test_skipped_optional_carries_the_command(self):
        rc, rec = record("SkipsOptional")
        self.assertEqual(rec["check_status"], "skipped")
        self.assertEqual(rec["check_message"], "the machine is shared")
        self.assertEqual(rec["check_optional"], "time it by hand: planted command")
        rc, rec = record("Skips")
        self.assertNotIn("check_optional", rec)  # a plain skip is not labelled optional

    def test_skip_switch(self):
        rc, rec = record("Passes", {"SL_GRADING_SKIP": "needs MPI"})
        self.assertEqual(rec["check_status"], "skipped")
        self.assertEqual(rec["check_message"], "needs MPI")

    def test_describe_switch_runs_nothing(self):
        rc, rec = record("FailsAnExpectation", {"SL_GRADING_DESCRIBE": "1"})
        self.assertEqual(rc, 0)
        self.assertEqual(rec["check_status"], "described")
        self.assertEqual(rec["check_points"], "3")
        self.assertNotIn("check_measured", rec)

    def test_id_must_match_test_name(self):
        rc, rec = record("IdDoesNotMatchName")
        self.assertEqual(rec["check_status"], "failed")
        self.assertIn("expected 'lab99.id_does_not_match_name'", rec["check_message"])

    def test_other_rank_failure_fails_the_check(self):
        rc, rec = record("OtherRankFails")
        self.assertNotEqual(rc, 0)
        self.assertEqual(rec["check_status"], "failed")
        self.assertIn("rank 1 (failed): planted failure on rank 1", rec["check_message"])
        # the measured line is the failing rank's first, then rank 0's pass: never rank 0's alone
        self.assertEqual(rec["check_measured"], "rank 1 (failed): rank 1 off by 0.5\nrank 0 (passed): rank 0 fine")

    def test_exception_before_wait_timeouts(self):
        rc, rec = record("ExceptionBeforeWaitTimeouts")
        self.assertEqual(rec["check_status"], "failed")
        self.assertTrue(rec["check_message"].startswith("rank 1 (failed): scalelab::Error thrown:\nplanted on rank 1"),
                        rec["check_message"])
        self.assertIn("rank 0 (failed): rank 0 waited 20.0 s", rec["check_message"])

    def test_error_excerpt(self):
        rc, rec = record("ErrorExcerpt")
        self.assertEqual(rec["check_status"], "passed", rec)

    def test_all_ranks(self):
        rc, rec = record("AllRanksReports")
        self.assertEqual(rec["check_status"], "passed", rec)

    def test_all_ranks_groups_identical_messages(self):
        rc, rec = record("AllRanksGroupsIdenticalMessages")
        self.assertEqual(rec["check_status"], "passed", rec)


if __name__ == "__main__":
    PROGRAM = sys.argv.pop(1)
    unittest.main()
