#!/usr/bin/env python3
"""The speech experiment's scripts (experiments/speech/table.py, curves.py) on
synthetic run documents whose answers are known by construction.

    python3 tests/scripts/speech/test_speech_scripts.py SOURCE_ROOT

Table 3 of experiments/speech/RESULTS.md is printed by table.py, so its arithmetic
(PER in percent, the best evaluation and its epoch, CPU and wall time per epoch, the
linear / softmax ratio, the means over seeds and their intervals) and its refusals (a run that is not a complete speech run, a
decode of other rows) are checked here; curves.py's data file too (gnuplot draws it
when present). Standard library only."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..")
TABLE = os.path.join(ROOT, "experiments", "speech", "table.py")
CURVES = os.path.join(ROOT, "experiments", "speech", "curves.py")


def run_doc(label, per_by_epoch, test_per, step_cpu, step_s, params, status="ok", task="speech"):
    """A train.json reduced to what the scripts read: 100 training rows, batch 10 (10
    steps an epoch), an evaluation at the end of each epoch with the given PER."""
    epochs = len(per_by_epoch)
    recs = [{"kind": "eval", "step": 0, "eval_loss": 900.0, "eval_per": 1.2}]
    for e, p in enumerate(per_by_epoch, 1):
        recs.append({"kind": "train", "step": 10 * e, "loss": 100.0 / e})
        recs.append({"kind": "eval", "step": 10 * e, "eval_loss": 120.0 / e, "eval_per": p, "cpu_s": 36.0 * e})
    recs.append({"kind": "test", "step": 10 * epochs, "test_loss": 1.0, "test_per": test_per, "cpu_s": 36.0 * epochs + 18})
    return {"schema": "attnbench/run/1", "status": status,
            "config": {"name": "speech-" + label, "label": label, "batch": 10,
                       "task": {"name": task, "rows": {"train": 100, "valid": 10, "test": 10}}},
            "machine": {"cpu": "Test CPU", "cores": 2, "blas_core": "Haswell", "compiler": "gcc 12"},
            "records": recs,
            "summary": {"final_eval_per": per_by_epoch[-1], "test_per": test_per, "step_cpu_s": step_cpu,
                        "step_s": step_s, "epochs_done": float(epochs), "params": params, "threads": 1}}


def decode_doc(label, ids, hyps, split="test"):
    return {"schema": "attnbench/decode/1", "label": label, "split": split,
            "utterances": [{"id": i, "ref": "a b c", "hyp": h, "errors": 3 - len(h.split()), "ref_len": 3}
                           for i, h in zip(ids, hyps)]}


class Scripts(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, doc):
        p = os.path.join(self.tmp.name, name)
        with open(p, "w") as f:
            json.dump(doc, f)
        return p

    def run_script(self, script, *args):
        return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)

    def test_table_rows_and_ratio(self):
        a = self.write("a.json", run_doc("softmax", [0.9, 0.4, 0.5], 0.45, 30.0, 60.0, 1000))
        b = self.write("b.json", run_doc("linear", [0.8, 0.6, 0.55], 0.5, 12.0, 45.0, 1000))
        r = self.run_script(TABLE, a, b)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        # softmax: end 50.00, best 40.00 at epoch 2, test 45.00, 10.0 CPU s and 20.0 wall s an epoch
        self.assertIn("| softmax | 50.00 | 40.00 (2) | 45.00 | 10.0 | 20.0 | 3 | 1,000 | 5.12 | 2711 |", lines)
        self.assertIn("| linear | 55.00 | 55.00 (3) | 50.00 | 4.0 | 15.0 | 3 | 1,000 | 8.08 | 824 |", lines)
        self.assertIn("linear / softmax, CPU time per epoch: 0.40 (the paper's, GPU: 824 / 2711 = 0.30)", lines)
        self.assertTrue(lines[0].startswith("Machine: Test CPU, 2 cores"), lines[0])

    def test_table_loss_column(self):
        d = run_doc("softmax", [0.9, 0.4, 0.5], 0.45, 30.0, 60.0, 1000)
        next(r for r in d["records"] if r["kind"] == "eval" and r["step"] == 30)["eval_loss"] = 70.0
        r = self.run_script(TABLE, "--loss", self.write("a.json", d))
        self.assertEqual(r.returncode, 0, r.stderr)
        # evaluation losses 120, 60, 70 at epochs 1-3 (step 0's 900 left out)
        self.assertIn("| softmax | 50.00 | 40.00 (2) | 45.00 | 10.0 | 20.0 | 3 | 1,000 | 60.0 (2) / 70.0 | 5.12 | 2711 |",
                      r.stdout.splitlines())
        self.assertEqual(self.run_script(TABLE, "--loss").returncode, 2)

    def test_table_refusals(self):
        bad = [run_doc("softmax", [0.5], 0.5, 1, 1, 1, status="running"),
               run_doc("softmax", [0.5], 0.5, 1, 1, 1, task="frames"),
               {"schema": "attnbench/decode/1"}]
        for i, d in enumerate(bad):
            r = self.run_script(TABLE, self.write(f"bad{i}.json", d))
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        r = self.run_script(TABLE, os.path.join(self.tmp.name, "missing.json"))
        self.assertEqual(r.returncode, 2)

    def seed_doc(self, label, seed, per_end, test_per, step_cpu):
        d = run_doc(label, [0.9, per_end], test_per, step_cpu, 2 * step_cpu, 1000)
        d["config"]["seed"] = seed
        d["config"]["model"] = {"attention": {"variant": label.split(",")[0]}}
        return self.write(f"{label}-{seed}.json", d)

    def test_seeds(self):
        # given out of seed order: the row takes seed 1's label and lists the seeds sorted
        s2 = self.seed_doc("softmax, seed 2", 2, 0.6, 0.42, 20.0)
        s1 = self.seed_doc("softmax", 1, 0.5, 0.40, 10.0)
        lin = self.seed_doc("linear", 1, 0.55, 0.5, 6.0)
        s3 = self.seed_doc("softmax, seed 3", 3, 0.7, 0.44, 30.0)
        r = self.run_script(TABLE, "--seeds", s2, s1, lin, s3)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        # end PER 50, 60, 70: mean 60, sd 10, half-width t(2) 4.303 * 10 / sqrt(3) = 24.84;
        # test 40, 42, 44: mean 42, sd 2, half-width 4.97; CPU s an epoch (10+20+30)/2/3 = 10
        self.assertIn("| softmax | 1, 2, 3 | 60.00 [35.16, 84.84] | 60.00 [35.16, 84.84] | 42.00 [37.03, 46.97] "
                      "| 10.0 | 5.12 |", lines)
        self.assertIn("| linear | 1 | 55.00 | 55.00 | 50.00 | 3.0 | 8.08 |", lines)
        self.assertLess(lines.index(next(x for x in lines if x.startswith("| softmax"))),
                        lines.index(next(x for x in lines if x.startswith("| linear"))))
        # another config is another row, however it is labelled
        d = run_doc("softmax", [0.9, 0.5], 0.4, 10.0, 20.0, 1000)
        d["config"]["seed"] = 4
        d["config"]["model"] = {"attention": {"variant": "softmax"}, "layers": 2}
        r = self.run_script(TABLE, "--seeds", s1, self.write("other.json", d))
        self.assertEqual(sum(1 for x in r.stdout.splitlines() if x.startswith("| softmax |")), 2, r.stdout)
        # the same seed twice is refused
        again = self.seed_doc("softmax, again", 1, 0.5, 0.40, 10.0)
        r = self.run_script(TABLE, "--seeds", s1, again)
        self.assertEqual(r.returncode, 2)
        self.assertIn("seed 1 of its model twice", r.stderr)
        self.assertEqual(self.run_script(TABLE, "--seeds").returncode, 2)

    def test_decoded(self):
        a = self.write("da.json", decode_doc("softmax", ["u1", "u2"], ["a b c", ""]))
        b = self.write("db.json", decode_doc("linear", ["u1", "u2"], ["a c", "b"]))
        r = self.run_script(TABLE, "--decoded", a, b)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn("u1 (test), 3 phones:", out)
        self.assertIn("| reference | a b c | |", out)
        self.assertIn("| softmax | (nothing) | 3 |", out)
        self.assertIn("| linear | a c | 1 |", out)
        c = self.write("dc.json", decode_doc("lsh-4", ["u1", "u3"], ["a", "b"]))
        r = self.run_script(TABLE, "--decoded", a, c)
        self.assertEqual(r.returncode, 2)
        self.assertIn("other rows", r.stderr)

    def test_curves(self):
        a = self.write("a.json", run_doc("Bi LSTM", [0.9, 0.4], 0.45, 30.0, 60.0, 1000))
        prefix = os.path.join(self.tmp.name, "cv")
        r = self.run_script(CURVES, a, "--out", prefix)
        if shutil.which("gnuplot"):
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.getsize(prefix + ".png") > 0)
        rows = open(prefix + ".tsv").read().splitlines()
        self.assertEqual(rows[0], "run\tkind\tepoch\tloss\tper")
        self.assertIn("Bi_LSTM\ttrain\t1\t100\tNaN", rows)
        self.assertIn("Bi_LSTM\teval\t2\t60\t0.4", rows)
        self.assertEqual(len(rows), 1 + 4, "step 0's evaluation is left out")
        r = self.run_script(CURVES, a)
        self.assertEqual(r.returncode, 2)

    def test_pareto(self):
        a = self.write("a.json", run_doc("Bi LSTM", [0.9, 0.4], 0.45, 30.0, 60.0, 1000))
        prefix = os.path.join(self.tmp.name, "pa")
        r = self.run_script(CURVES, a, "--pareto", "--out", prefix)
        if shutil.which("gnuplot"):
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.getsize(prefix + ".png") > 0)
        rows = open(prefix + ".tsv").read().splitlines()
        # the records' cpu_s in hours (72 s = 0.02 h), PER in percent; step 0 left out
        self.assertEqual(rows, ["run\tkind\tcpu_h\tvalue", "Bi_LSTM\tvalid\t0.010000\t90",
                                "Bi_LSTM\tvalid\t0.020000\t40", "Bi_LSTM\ttest\t0.025000\t45"])
        d = run_doc("old", [0.9], 0.45, 30.0, 60.0, 1000)
        del d["records"][-1]["cpu_s"]
        b = self.write("b.json", d)
        r = self.run_script(CURVES, b, "--pareto", "--out", prefix)
        self.assertEqual(r.returncode, 2)
        self.assertIn("has no cpu_s", r.stderr)


if __name__ == "__main__":
    unittest.main()
