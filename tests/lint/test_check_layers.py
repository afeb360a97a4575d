#!/usr/bin/env python3
"""test_check_layers.py — the layer lint finds what it must, on tiny trees written to a temp dir: an
include that points up, a sibling include (ops <-> comm), an include without its layer, a missing
header, a file outside any layer, the data layer reaching for the model, a layer reaching up for the driver;
and passes a tree that keeps the rules.

  python3 tests/lint/test_check_layers.py        (registered as ctest lint.check_layers_selftest)
"""
import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layers  # noqa: E402  (the module under test, next to this file)


def tree(files):
    root = Path(tempfile.mkdtemp(prefix="check_layers_"))
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


GOOD = {
    "common/include/scalelab/core/tensor.h": "#pragma once\n",
    "common/include/scalelab/ops/ops.h": '#include "scalelab/core/tensor.h"\n',
    "common/include/scalelab/comm/comm.h": '#include "scalelab/core/tensor.h"\n',
    "common/include/scalelab/model/gpt2.h": '#include "scalelab/ops/ops.h"\n#include "scalelab/comm/comm.h"\n',
    "common/include/scalelab/measure/metrics.h": '#include "scalelab/model/gpt2.h"\n',
    "common/include/scalelab/data/batch.h": '#include "scalelab/core/tensor.h"\n',
    "common/include/scalelab/driver/train_loop.h": '#include "scalelab/measure/metrics.h"\n'
                                                   '#include "scalelab/data/batch.h"\n',
    "common/src/ops/cpu/gelu.cpp": '#include "scalelab/ops/ops.h"\n',
    "labs/05_x/main.cpp": '#include "scalelab/measure/metrics.h"\n',
}


class CheckLayers(unittest.TestCase):
    def errors(self, extra):
        return check_layers.check(tree({**GOOD, **extra}))

    def test_good_tree_passes(self):
        self.assertEqual(check_layers.check(tree(GOOD)), [])

    def test_include_pointing_up_fails(self):
        e = self.errors({"common/src/core/tensor.cpp": '#include "scalelab/model/gpt2.h"\n'})
        self.assertEqual(len(e), 1)
        self.assertIn("common/src/core/tensor.cpp:1: layer core includes \"scalelab/model/gpt2.h\"", e[0])
        self.assertIn("points up", e[0])

    def test_sibling_include_fails(self):
        e = self.errors({"common/src/comm/mpi.cpp": '// x\n#include "scalelab/ops/ops.h"\n'})
        self.assertEqual(len(e), 1)
        self.assertIn("mpi.cpp:2: layer comm includes \"scalelab/ops/ops.h\" from layer ops", e[0])

    def test_include_without_layer_fails_anywhere(self):
        e = self.errors({"tests/lab01/test_x.cpp": '#include "scalelab/gpt2.h"\n'})
        self.assertEqual(len(e), 1)
        self.assertIn("names no layer", e[0])

    def test_missing_header_fails(self):
        e = self.errors({"labs/05_x/tp.cpp": '#include "scalelab/model/nothing.h"\n'})
        self.assertEqual(len(e), 1)
        self.assertIn("no such header", e[0])

    def test_data_including_the_model_fails(self):
        e = self.errors({"common/src/data/shard.cpp": '#include "scalelab/model/gpt2.h"\n'})
        self.assertEqual(len(e), 1)
        self.assertIn("layer data includes \"scalelab/model/gpt2.h\" from layer model", e[0])

    def test_a_layer_including_the_driver_fails(self):
        e = self.errors({"common/src/measure/metrics.cpp": '#include "scalelab/driver/train_loop.h"\n'})
        self.assertEqual(len(e), 1)
        self.assertIn("points up", e[0])

    def test_file_outside_layers_fails(self):
        e = self.errors({"common/src/misc.cpp": "int x;\n"})
        self.assertEqual(len(e), 1)
        self.assertIn("not inside a layer folder", e[0])


if __name__ == "__main__":
    unittest.main(verbosity=2)
