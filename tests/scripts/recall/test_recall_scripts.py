#!/usr/bin/env python3
"""experiments/recall/run-cpu.sh and table.py end to end, shrunk to 2 steps a run: every
entry of the four configs trains (the seeds of the headline), the table has a row per
point with the headline's 3 seeds, the three figures are drawn, and a second call
skips the finished entries.

    python3 tests/scripts/recall/test_recall_scripts.py SOURCE_ROOT ATTNBENCH
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT, EXE = sys.argv.pop(1), os.path.abspath(sys.argv.pop(1))
SHRINK = ["--set", "steps=2", "--set", "eval_every=1", "--set", "eval_batches=1", "--set", "checkpoint_every=1"]


def count(cfg):
    with open(os.path.join(ROOT, "experiments", "recall", cfg + ".json")) as f:
        return len(json.load(f)["array"])


@unittest.skipUnless(shutil.which("gnuplot"), "no gnuplot")
class RunCpu(unittest.TestCase):
    def run_script(self, out):
        env = dict(os.environ, OUT=out, ATTNBENCH=EXE, OMP_NUM_THREADS="1")
        return subprocess.run(["bash", os.path.join(ROOT, "experiments", "recall", "run-cpu.sh")] + SHRINK,
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    def test_every_entry_then_the_table_and_figures(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "recall")
            p = self.run_script(out)
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            docs = glob.glob(os.path.join(out, "**", "train.json"), recursive=True)
            want = 3 * count("recall-cpu") + sum(count(c) for c in ("recall-wide-cpu", "recall-length-cpu",
                                                                     "recall-pairs-cpu"))
            self.assertEqual(len(docs), want)
            for path in docs:
                with open(path) as f:
                    self.assertEqual(json.load(f)["status"], "ok", path)
            rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| ") and not ln.startswith("| variant")]
            # points: the headline's 8 variants, then 7 at width 128, 7 x 3 lengths, 7 x 2 pair counts
            self.assertEqual(len(rows), 8 + 7 + 21 + 14)
            head = [r for r in rows if "| 64 | 64 | 8 |" in r]
            self.assertEqual(len(head), 8)
            self.assertTrue(all("| 3 |" in r for r in head), head)
            for what in ("state", "length", "pairs"):
                self.assertGreater(os.path.getsize(os.path.join(out, f"recall-cpu-{what}.png")), 1000, what)
            before = {q: os.path.getmtime(q) for q in docs}
            p = self.run_script(out)
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            self.assertEqual(before, {q: os.path.getmtime(q) for q in docs}, "finished entries ran again")


if __name__ == "__main__":
    unittest.main()
