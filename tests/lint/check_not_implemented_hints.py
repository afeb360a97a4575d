#!/usr/bin/env python3
"""check_not_implemented_hints.py — every "not implemented" record of the learner track sends the learner to
a file of theirs.

  python3 tests/lint/check_not_implemented_hints.py build/grades/learner

scripts/test.sh runs it after grading the untouched learner track. Each record of a check that reported
not implemented carries the NotImplemented message, "... hint: fill in the TODO(labNN-k) block in <file>;";
<file> must be under labs/. A check that runs a lab's program and re-throws the program's NotImplemented
(tests/lab08/test_lab08.cpp) once named its own test file there instead. Exit 1, listing the records, when
one names another file or none.
"""
import glob
import json
import os
import re
import sys


def main():
    grades = sys.argv[1] if len(sys.argv) > 1 else "build/grades/learner"
    bad, seen = [], 0
    for path in sorted(glob.glob(os.path.join(grades, "*.json"))):
        with open(path) as f:
            record = json.load(f)
        for suite in record.get("testsuites", []):
            for test in suite.get("testsuite", []):
                if test.get("check_status") != "not_implemented":
                    continue
                seen += 1
                m = re.search(r"fill in the TODO\([^)]*\) block in ([^;\s]+);", json.dumps(test))
                if m is None or not m.group(1).startswith("labs/"):
                    bad.append(f"{os.path.basename(path)}: {m.group(1) if m else 'no file named'}")
    if seen == 0:
        print(f"FAIL: no 'not implemented' record under {grades} (grade the learner track first)")
        return 1
    if bad:
        print("FAIL: these 'not implemented' records do not send the learner to a file under labs/:")
        print("\n".join("  " + b for b in bad))
        return 1
    print(f"ok: {seen} 'not implemented' records, each naming the learner's file under labs/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
