#!/usr/bin/env python3
"""test_mistake_names.py — the planted mistakes' name lint (scripts/check_mistakes.py name_problems; ctest
lint.mistake_names_selftest). Passes when
  - the kit's old lab05-no-divide-by-microsteps (a patch that removed the data-parallel average under a name
    that says it drops the 1/m) is refused, for its text and for its changed lines;
  - the same id on a patch that drops the 1/m, described so, is accepted;
  - a word the table does not know is not judged, a known word in the text but not the code is refused;
  - every mistake of the kit passes (what `check_mistakes.py --lint` also runs, here without patching).
"""
import glob
import importlib.machinery
import importlib.util
import json
import os
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_check_mistakes():
    path = os.path.join(REPO, "scripts", "check_mistakes.py")
    loader = importlib.machinery.SourceFileLoader("sl_check_mistakes", path)
    spec = importlib.util.spec_from_loader("sl_check_mistakes", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


cm = load_check_mistakes()

HEADER = "Planted mistake x.\nMust trip: lab05.x\nMistake: x\n\n"
DIFF = """--- a/solutions/05_tensor_parallel/tensor_parallel.cpp
+++ b/solutions/05_tensor_parallel/tensor_parallel.cpp
@@ -185,7 +185,6 @@
{lines}
   r.grad_norm = clip_grad_norm(model, grad_clip, {{&points.group()}});
"""
# The kit's patch before the fix: it removes the replicas' average, its name speaks of micro-steps.
OLD_PATCH = HEADER + DIFF.format(
    lines="-  if (dp_group != nullptr && dp_group->size() > 1) average_over_replicas(model, *dp_group);")
OLD = {"id": "lab05-no-divide-by-microsteps",
       "mistake": "Skips the data-parallel average across replicas: each replica steps on its own half of the batch."}
NEW_PATCH = HEADER + DIFF.format(
    lines="-      if (model.owns_unit(u)) scale_(model.unit_grads(u), 1.0f / static_cast<float>(m));  // 1/m")
NEW = {"id": "lab05-no-divide-by-microsteps",
       "mistake": "Does not divide the accumulated gradients by the number of micro-batches m."}


class NameLint(unittest.TestCase):
    def test_old_mislabelled_patch_refused(self):
        problems = cm.name_problems(OLD, OLD_PATCH)
        self.assertTrue(any("'divide', no line the patch changes" in p for p in problems), problems)
        self.assertTrue(any("'microsteps', its \"mistake\" text does not" in p for p in problems), problems)

    def test_patch_that_does_what_it_says_accepted(self):
        self.assertEqual(cm.name_problems(NEW, NEW_PATCH), [])

    def test_comments_are_not_code(self):
        # the changed line says "average" in a comment only: no Avg, no division in the code
        patch = HEADER + DIFF.format(lines="-  foo(model);  // the average over replicas / 2")
        entry = {"id": "lab05-no-average", "mistake": "Leaves out the average."}
        self.assertTrue(any("'average', no line" in p for p in cm.name_problems(entry, patch)))

    def test_unknown_words_not_judged(self):
        entry = {"id": "lab05-layout-frobnicates", "mistake": "Anything."}
        self.assertEqual(cm.name_problems(entry, OLD_PATCH), [])

    def test_every_kit_mistake_passes(self):
        bad = []
        for path in sorted(glob.glob(os.path.join(REPO, "tests", "mistakes", "lab[0-9][0-9]", "manifest.json"))):
            with open(path) as f:
                for entry in json.load(f)["mutations"]:
                    with open(os.path.join(os.path.dirname(path), entry["patch"]), encoding="utf-8") as p:
                        bad += [f"{entry['id']}: {x}" for x in cm.name_problems(entry, p.read())]
        self.assertEqual(bad, [])


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
