#!/usr/bin/env python3
"""Tests of tests/layering_test.py itself: fake trees in a temporary folder, each breaking one rule
(the module order, or a cycle) or keeping them all, and what the checker says of them."""

import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layering_test as layering  # noqa: E402


class FakeTree:
    """A repository with src/ files of given contents, in a temporary folder."""

    def __init__(self, files):
        self._dir = tempfile.TemporaryDirectory()
        self.root = self._dir.name
        for rel, text in files.items():
            path = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)

    def close(self):
        self._dir.cleanup()


GOOD = {
    "src/core/tensor.h": "#pragma once\n",
    "src/core/tensor.cpp": '#include "core/tensor.h"\n',
    "src/ops/linear.h": '#pragma once\n#include "core/tensor.h"\n',
    "src/ops/cpu/linear.cpp": '#include "ops/linear.h"\n#include <vector>\n#include "generated_commit.h"\n',
    "src/model/block.h": '#pragma once\n#include "ops/linear.h"\n',
    "src/train/trainer.h": '#pragma once\n#include "model/block.h"\n#include "core/tensor.h"\n',
    "src/train/trainer.cpp": '#include "train/trainer.h"\n',
}


class LayeringCheckerTest(unittest.TestCase):
    def run_check(self, files, allowed=None, cycles_allowed=None):
        """main() on a fake tree, with the allow-lists given (empty unless given)."""
        tree = FakeTree(files)
        self.addCleanup(tree.close)
        for table, entries in ((layering.LAYERING_ALLOWED, allowed), (layering.CYCLE_ALLOWED, cycles_allowed)):
            saved = dict(table)
            self.addCleanup(lambda table=table, saved=saved: (table.clear(), table.update(saved)))
            table.clear()
            table.update(entries or {})
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = layering.main(["--root", tree.root])
        return rc, out.getvalue()

    def test_a_tree_that_keeps_the_order_passes(self):
        rc, out = self.run_check(GOOD)
        self.assertEqual(rc, 0, out)

    def test_an_include_of_a_later_module_fails_naming_file_line_and_rule(self):
        files = dict(GOOD)
        files["src/ops/cpu/linear.cpp"] = '#include "ops/linear.h"\n\n#include "model/block.h"\n'
        rc, out = self.run_check(files)
        self.assertEqual(rc, 1, out)
        self.assertIn('src/ops/cpu/linear.cpp:3: includes "model/block.h"', out)
        self.assertIn("module `ops` may include only core", out)
        self.assertIn("`model` is not among them", out)

    def test_a_module_beside_rather_than_beneath_fails(self):
        # io is not beneath ops in docs/design.md's table (ops uses only core), though the two
        # are independent: an include across such a pair fails as well
        files = dict(GOOD)
        files["src/io/reader.h"] = '#pragma once\n#include "core/tensor.h"\n'
        files["src/ops/cast.h"] = '#pragma once\n#include "io/reader.h"\n'
        rc, out = self.run_check(files)
        self.assertEqual(rc, 1, out)
        self.assertIn('src/ops/cast.h:2: includes "io/reader.h"', out)

    def test_a_generated_header_of_a_later_module_fails(self):
        files = dict(GOOD)
        files["src/core/tensor.cpp"] = '#include "core/tensor.h"\n#include "train/generated.h"\n'
        rc, out = self.run_check(files)
        self.assertEqual(rc, 1, out)
        self.assertIn('src/core/tensor.cpp:2: includes "train/generated.h"', out)

    def test_an_allowed_include_passes_and_a_stale_entry_fails(self):
        files = dict(GOOD)
        files["src/ops/cpu/linear.cpp"] = '#include "model/block.h"\n'
        rc, out = self.run_check(files, {("src/ops/cpu/linear.cpp", "model/block.h"): "kept"})
        self.assertEqual(rc, 0, out)
        rc, out = self.run_check(GOOD, {("src/ops/cpu/linear.cpp", "model/block.h"): "kept"})
        self.assertEqual(rc, 1, out)
        self.assertIn("no longer breaks the rule", out)

    def test_a_cycle_through_a_cpp_and_its_header_fails_naming_each_include(self):
        files = dict(GOOD)
        files["src/train/plan.h"] = '#pragma once\n#include "model/block.h"\n'
        files["src/train/plan.cpp"] = '#include "train/plan.h"\n#include "train/trainer.h"\n'
        files["src/train/trainer.h"] = '#pragma once\n#include "model/block.h"\n#include "train/plan.h"\n'
        rc, out = self.run_check(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("include cycle train/plan -> train/trainer -> train/plan", out)
        self.assertIn('src/train/plan.cpp:2 includes "train/trainer.h"', out)
        self.assertIn('src/train/trainer.h:3 includes "train/plan.h"', out)

    def test_a_longer_cycle_of_headers_fails(self):
        files = dict(GOOD)
        files["src/core/a.h"] = '#pragma once\n#include "core/b.h"\n'
        files["src/core/b.h"] = '#pragma once\n#include "core/c.h"\n'
        files["src/core/c.h"] = '#pragma once\n#include "core/a.h"\n'
        rc, out = self.run_check(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("include cycle core/a -> core/b -> core/c -> core/a", out)

    def test_a_private_header_belongs_to_its_unit(self):
        files = dict(GOOD)
        files["src/io/parquet.h"] = '#pragma once\n'
        files["src/io/parquet_internal.h"] = '#pragma once\n#include "io/parquet.h"\n'
        files["src/io/parquet.cpp"] = '#include "io/parquet.h"\n#include "io/parquet_internal.h"\n'
        rc, out = self.run_check(files)
        self.assertEqual(rc, 0, out)

    def test_an_allowed_cycle_edge_passes_and_a_stale_one_fails(self):
        files = dict(GOOD)
        files["src/core/tensor.h"] = '#pragma once\n'
        files["src/core/tensor.cpp"] = '#include "core/tensor.h"\n#include "core/view.h"\n'
        files["src/core/view.h"] = '#pragma once\n#include "core/tensor.h"\n'
        rc, out = self.run_check(files)
        self.assertEqual(rc, 1, out)
        self.assertIn("include cycle core/tensor -> core/view -> core/tensor", out)
        allowed = {("src/core/tensor.cpp", "core/view.h"): "kept"}
        rc, out = self.run_check(files, cycles_allowed=allowed)
        self.assertEqual(rc, 0, out)
        rc, out = self.run_check(GOOD, cycles_allowed=allowed)
        self.assertEqual(rc, 1, out)
        self.assertIn('the cycle allow-list names the include "core/view.h", which is gone', out)
        files["src/core/view.h"] = '#pragma once\n'
        rc, out = self.run_check(files, cycles_allowed=allowed)
        self.assertEqual(rc, 1, out)
        self.assertIn('the cycle allow-list names the include "core/view.h", which no longer closes a cycle', out)

    def test_the_real_tree_passes(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.assertEqual(layering.check(root), [])


if __name__ == "__main__":
    unittest.main()
