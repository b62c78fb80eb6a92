#!/usr/bin/env python3
"""Tests of scripts/format.sh and the repository's .clang-format on files in a temporary folder
(never on the sources: the code base is not required to be formatted). Exit 77 (skipped) when
no clang-format is installed."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "format.sh")

# Laid out as .clang-format asks: 2-space indent, a 109-column line left whole, a short case
# label on its line, the namespace's closing comment.
FORMATTED = """namespace shardtrain {

int pick(int kind, int a_long_argument_name, int another_long_argument_name, int yet_another_argument_name) {
  switch (kind) {
    case 0: return a_long_argument_name;
    default: return another_long_argument_name + yet_another_argument_name;
  }
}

}  // namespace shardtrain
"""
# The same with a 4-space indent and the parameters on a line past 120 columns.
UNFORMATTED = """namespace shardtrain {

int pick(int kind, int a_long_argument_name, int another_long_argument_name, int yet_another_argument_name, int more_arguments) {
    switch (kind) {
        case 0: return a_long_argument_name;
        default: return another_long_argument_name + yet_another_argument_name;
    }
}

}  // namespace shardtrain
"""


class FormatScriptTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def run_script(self, *args):
        return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True)

    def test_check_lists_only_the_files_that_differ(self):
        good = self.write("good.cpp", FORMATTED)
        bad = self.write("bad.cpp", UNFORMATTED)
        r = self.run_script("--check", good, bad)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stdout.split(), [bad])
        self.assertIn("1 of 2 files differ", r.stderr)
        with open(bad, encoding="utf-8") as f:
            self.assertEqual(f.read(), UNFORMATTED, "--check must not change a file")

    def test_a_formatted_file_passes(self):
        r = self.run_script(self.write("good.cpp", FORMATTED))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")

    def test_fix_rewrites_in_the_repository_style(self):
        bad = self.write("bad.cpp", UNFORMATTED)
        r = self.run_script("--fix", bad)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(bad, encoding="utf-8") as f:
            fixed = f.read()
        self.assertIn("\n  switch (kind) {\n    case 0: return a_long_argument_name;\n", fixed)
        self.assertTrue(all(len(line) <= 120 for line in fixed.splitlines()), fixed)
        self.assertEqual(self.run_script("--check", bad).returncode, 0)

    def test_errors_name_the_option_or_file(self):
        r = self.run_script("--bogus")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown option `--bogus`", r.stderr)
        r = self.run_script(os.path.join(self.dir, "missing.cpp"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("missing.cpp`: no such file", r.stderr)
        r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True,
                           env=dict(os.environ, CLANG_FORMAT="no-such-clang-format"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("apt-get install clang-format", r.stderr)


if __name__ == "__main__":
    if not (shutil.which("clang-format-14") or shutil.which("clang-format")):
        print("no clang-format installed: skipped")
        sys.exit(77)
    unittest.main()
