#!/usr/bin/env python3
"""test_manifest_fuzz.py — a property test of the lab manifests' reader (scripts/lib/labs.py), the Python twin of
the libFuzzer targets of tests/fuzz/: random mutations of every labs/NN_name/lab.json (bytes flipped, cut or
repeated; fields dropped, retyped or added) and random expressions for evaluate(). Every input must give a
manifest or a ManifestError; any other exception (KeyError, AttributeError, ZeroDivisionError, ...) is a
finding. ctest robustness.manifest_fuzz (tests/robustness/CMakeLists.txt).

SL_FUZZ_SEED (default 39) and SL_FUZZ_CASES (default 3000 per kind) choose the run; a failure prints the
seed and the input, so it can be replayed and kept as a case below.
"""
import copy
import json
import os
import random
import sys
import tempfile
import unittest
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts", "lib"))
import labs  # noqa: E402

warnings.simplefilter("ignore", SyntaxWarning)  # ast.parse of mutated expressions ("9N"): noise, not a finding
SEED = int(os.environ.get("SL_FUZZ_SEED", "39"))
CASES = int(os.environ.get("SL_FUZZ_CASES", "3000"))
VALUES = [None, True, 0, -1, 1, 2 ** 63, 1.5, float("inf"), "", "x", "01", [], [0], [1, "a"], {}, {"default": 0},
          {"default": 1, "allowed": "any"}, {"default": 2, "allowed": [0]}, {"if": "N //", "why": 1}]
EXPRESSIONS = ["N // 0", "N % 0", "N // (N - N)", "gcd(N)", "min()", "max(N)", "N ** 2", "N if N else 1",
               "(N", "N.real", "__import__('os')", "N < heads < layers", "not N", "N // 4", "gcd(N, heads)",
               "9" * 5000, "-" * 200 + "N", "(" * 300 + "N" + ")" * 300, "min(N, heads, 1 // 0)"]
# Findings, kept as cases: evaluate("N // 0") raised ZeroDivisionError (now a ManifestError naming the
# values); a scale_demo with "skip": null raised TypeError in scale_row (seed 1).
REGRESSIONS = [{"number": "03", "name": "x", "scale_demo": {"skip": None}},
               {"number": "03", "name": "x", "scale_demo": {"skip": [{"if": 1, "why": "w"}]}},
               {"number": "03", "name": "x", "scale_demo": {"skip": [{"if": "N // 0", "why": "w"}]}}]
ENV = {"N": 4, "B": 2, "G": 16, "S": 1, "heads": 4, "layers": 2}


def mutate_bytes(rng, data):
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(4)
        at = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(at, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            del b[at:at + rng.randint(1, 40)]
        elif op == 2:
            b[at:at] = bytes(rng.choice(b"{}[]\",:0123456789-eE.ntrufals\\ \n") for _ in range(rng.randint(1, 6)))
        else:
            b[at:at] = b[:rng.randint(0, 60)]
    return bytes(b)


def mutate_fields(rng, lab):
    lab = json.loads(json.dumps(lab))
    for _ in range(rng.randint(1, 4)):
        keys = list(lab)
        op = rng.randrange(4)
        if op == 0 and keys:
            del lab[rng.choice(keys)]
        elif op == 1 and keys:
            lab[rng.choice(keys)] = copy.deepcopy(rng.choice(VALUES))
        elif op == 2:
            lab[rng.choice(["extra", "dir", "graded", "ranks", "number"])] = copy.deepcopy(rng.choice(VALUES))
        elif keys:
            k = rng.choice(keys)
            if isinstance(lab[k], dict) and lab[k]:
                lab[k][rng.choice(list(lab[k]))] = copy.deepcopy(rng.choice(VALUES))
            elif isinstance(lab[k], list) and lab[k]:
                lab[k][rng.randrange(len(lab[k]))] = copy.deepcopy(rng.choice(VALUES))
    return lab


class ManifestFuzz(unittest.TestCase):
    def setUp(self):
        self.paths = labs.manifest_paths()
        self.assertTrue(self.paths, "no labs/*/lab.json found")

    def read(self, folder, data, what):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "labs", folder))
            path = os.path.join(root, "labs", folder, "lab.json")
            with open(path, "wb") as f:
                f.write(data)
            try:
                lab = labs.read_manifest(path, root=root)
            except labs.ManifestError:
                return
            except Exception as e:  # noqa: BLE001: anything else is the finding
                self.fail(f"seed {SEED}, {what}: {type(e).__name__}: {e}\ninput: {data[:2000]!r}")
            if lab.get("scale_demo"):  # a manifest that reads must also expand, or refuse clearly
                try:
                    labs.scale_row(lab, dict(ENV))
                except labs.ManifestError:
                    pass
                except Exception as e:  # noqa: BLE001
                    self.fail(f"seed {SEED}, {what}: scale_row: {type(e).__name__}: {e}\ninput: {data[:2000]!r}")

    def test_mutated_bytes(self):
        rng = random.Random(SEED)
        for n in range(CASES):
            path = rng.choice(self.paths)
            with open(path, "rb") as f:
                data = f.read()
            self.read(os.path.basename(os.path.dirname(path)), mutate_bytes(rng, data), f"bytes case {n}")

    def test_mutated_fields(self):
        rng = random.Random(SEED + 1)
        for n in range(CASES):
            path = rng.choice(self.paths)
            with open(path) as f:
                lab = json.load(f)
            data = json.dumps(mutate_fields(rng, lab)).encode()
            self.read(os.path.basename(os.path.dirname(path)), data, f"fields case {n}")

    def test_regressions(self):
        for case in REGRESSIONS:
            with self.assertRaises(labs.ManifestError, msg=repr(case)):
                labs.scale_row(case, dict(ENV))

    def test_expressions(self):
        rng = random.Random(SEED + 2)
        cases = list(EXPRESSIONS)
        for _ in range(CASES):
            a, b = rng.choice(EXPRESSIONS), rng.choice(EXPRESSIONS)
            cases.append(a[:rng.randrange(len(a) + 1)] + rng.choice(["", " // ", " % ", " + ", ", "]) + b)
        for expr in cases:
            try:
                labs.evaluate(expr, dict(ENV))
            except labs.ManifestError:
                pass
            except Exception as e:  # noqa: BLE001
                self.fail(f"seed {SEED}, evaluate({expr[:200]!r}): {type(e).__name__}: {e}")


if __name__ == "__main__":
    unittest.main()
