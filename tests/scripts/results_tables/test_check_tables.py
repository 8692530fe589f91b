#!/usr/bin/env python3
"""check_tables.py itself, on a made-up repository: a page whose block is what its script
prints passes; a stale block fails; --write replaces the stale block (and only it) with
the script's output; a command that fails is reported and its block kept.

    python3 tests/scripts/results_tables/test_check_tables.py SOURCE_ROOT

Standard library only."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..")
CHECK = os.path.join(ROOT, "tests", "scripts", "results_tables", "check_tables.py")

PAGE = """# Results

Printed by `python3 experiments/x/p.py 3`:

{a}
<!-- end of printed output -->

Text between.

Printed by `python3 experiments/x/p.py 2`:

| n |
|---|
| 2 |
<!-- end of printed output -->

Printed by `python3 experiments/x/fail.py`:

kept
<!-- end of printed output -->
"""


class CheckTables(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = os.path.join(self.tmp.name, "experiments", "x")
        os.makedirs(d)
        with open(os.path.join(d, "p.py"), "w") as f:
            f.write("import sys\nprint('| n |')\nprint('|---|')\nprint(f'| {sys.argv[1]} |')\n")
        with open(os.path.join(d, "fail.py"), "w") as f:
            f.write("import sys\nsys.exit(2)\n")
        self.page = os.path.join(d, "RESULTS.md")

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, *args):
        return subprocess.run([sys.executable, CHECK, self.tmp.name, *args], capture_output=True, text=True)

    def test_stale_block_then_write(self):
        with open(self.page, "w") as f:
            f.write(PAGE.format(a="| n |\n|---|\n| 1 |"))
        r = self.check()
        self.assertEqual(r.returncode, 1)
        self.assertIn("prints otherwise, first at line 3", r.stdout)
        self.assertIn("experiments/x/fail.py' failed (exit 2)", r.stdout)
        r = self.check("--write")
        self.assertIn("rewrote the block of 'python3 experiments/x/p.py 3'", r.stdout)
        self.assertEqual(r.stdout.count("rewrote"), 1, r.stdout)
        with open(self.page) as f:
            self.assertEqual(f.read(), PAGE.format(a="| n |\n|---|\n| 3 |"))
        # only the failing command is left to report
        r = self.check()
        self.assertEqual(r.returncode, 1)
        self.assertEqual([x for x in r.stdout.splitlines() if "experiments/x" in x],
                         ["experiments/x/RESULTS.md: 'python3 experiments/x/fail.py' failed (exit 2): "])


if __name__ == "__main__":
    unittest.main()
