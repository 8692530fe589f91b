#!/usr/bin/env python3
"""The copy experiment's analysis scripts (experiments/copy/seeds.py, plateau.py,
collect.py) on
synthetic runs whose answers are known by construction.

    python3 tests/scripts/copy/test_copy_scripts.py SOURCE_ROOT

The conclusions about linear against softmax in experiments/copy/RESULTS.md come from
these scripts, so their arithmetic (windows, medians, paired log ratios, the t interval) and their
choice of runs (complete, paired, the right folders) are checked here. Standard
library only."""
import io
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "experiments", "copy"))
import plateau  # noqa: E402
import seeds  # noqa: E402


def make_run(root, name, steps, loss, evals, done=None, task=None):
    """A train.json as `attnbench train` writes it, reduced to what the scripts read:
    loss(i) for step i+1, evals {step: eval loss}, the config's task (default: the
    noiseless copy)."""
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    done = steps if done is None else done
    run = {"config": {"steps": steps, "task": task or {"name": "copy", "symbols": 10}},
           "summary": {"steps_done": done},
           "step_loss": [loss(i) for i in range(done)],
           "records": [{"kind": "train", "step": 10, "loss": 1.0}]
           + [{"kind": "eval", "step": s, "eval_loss": v} for s, v in sorted(evals.items()) if s <= done]}
    with open(os.path.join(d, "train.json"), "w") as f:
        json.dump(run, f)
    return d


def load(d):
    with open(os.path.join(d, "train.json")) as f:
        return json.load(f)


def const_evals(steps, value, every=100):
    return {s: value for s in range(0, steps + 1, every)}


class Seeds(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_measures_use_the_last_tenth_up_to_the_step(self):
        # steps 1..900 at 1.0, 901..1000 alternate 2 and 4 (mean 3, median 3: statistics.median
        # of an even count averages the middle two), later steps (a continued run) 100.
        loss = lambda i: 1.0 if i < 900 else (2.0 if i % 2 else 4.0) if i < 1000 else 100.0
        evals = {s: float(s) for s in range(0, 2001, 100)}
        run = load(make_run(self.root, "r", 2000, loss, evals))
        m = seeds.measures(run, 1000)
        self.assertEqual(m["eval"], 1000.0)
        self.assertEqual(m["eval-10%"], 1000.0)  # the one evaluation in steps 901..1000
        self.assertEqual(m["train-10%"], 3.0)
        self.assertEqual(m["train-med"], 3.0)
        full = seeds.measures(run)  # the configured 2000 steps: steps 1801..2000
        self.assertEqual(full["train-10%"], 100.0)
        self.assertEqual(full["eval-10%"], 1950.0)  # evaluations after step 1800: 1900 and 2000
        self.assertEqual(full["eval"], 2000.0)

    def test_median_differs_from_mean_when_spikes_are_rare(self):
        loss = lambda i: 1e-4 if i % 50 else 1e-1  # one spike in 50 steps
        run = load(make_run(self.root, "r", 1000, loss, const_evals(1000, 1e-5)))
        m = seeds.measures(run)
        self.assertEqual(m["train-med"], 1e-4)
        self.assertAlmostEqual(m["train-10%"], (98 * 1e-4 + 2 * 1e-1) / 100, delta=1e-12)

    def test_unfinished_or_unevaluated_steps_are_not_measured(self):
        run = load(make_run(self.root, "a", 1000, lambda i: 1.0, const_evals(1000, 1.0),
                                  done=600))
        self.assertIsNone(seeds.measures(run))           # configured 1000, done 600
        self.assertIsNone(seeds.measures(run, 700))      # beyond what was done
        self.assertIsNotNone(seeds.measures(run, 600))
        self.assertIsNone(seeds.measures(run, 550))      # no evaluation after step 550

    def paired(self, prefix, ratios, steps=1000, task=None, level=1e-4):
        """Seeds 1.. with softmax at `level` (training) / level / 10 (evaluation) and
        linear at ratio times those."""
        for k, q in enumerate(ratios, start=1):
            for v, f in (("softmax", 1.0), ("linear", q)):
                if prefix == "copy-cpu" and k == 1:
                    name = "copy-cpu-%s" % v
                else:
                    name = "%s-seed%d-%s" % (prefix, k, v)
                make_run(self.root, name, steps, lambda i, f=f: level * f, const_evals(steps, level / 10 * f),
                         task=task)

    def test_loss_floor_hand_values(self):
        # the C test's values (copy_loss_floor): the same formula, computed by hand
        self.assertEqual(seeds.loss_floor({"name": "copy", "symbols": 10}), 0.0)
        self.assertEqual(seeds.loss_floor({"name": "copy", "symbols": 10, "noise": 0}), 0.0)
        self.assertAlmostEqual(seeds.loss_floor({"symbols": 10, "noise": 0.01}), 0.07112917546111897, delta=1e-15)
        self.assertAlmostEqual(seeds.loss_floor({"symbols": 4, "noise": 0.2}), 0.5875009311062073, delta=1e-15)
        self.assertAlmostEqual(seeds.loss_floor({"symbols": 10, "noise": 1.0}), math.log(10), delta=1e-15)
        self.assertAlmostEqual(seeds.loss_floor({"noise": 0.01}), 0.07112917546111897, delta=1e-15)  # 10 symbols

    def report_text(self, prefix):
        out = io.StringIO()
        seeds.report(seeds.find_runs(self.root, prefix), None, out)
        return out.getvalue()

    def test_noisy_runs_report_the_floor(self):
        noisy = {"name": "copy", "symbols": 10, "noise": 0.01}
        f = 0.07112917546111897
        # softmax trains at 1.5 x the floor, evaluates at 0.15 x; linear 1.1 x those
        self.paired("copy-cpu-noise", [1.1, 1.1], task=noisy, level=1.5 * f)
        text = self.report_text("copy-cpu-noise")
        self.assertIn("Loss floor (noisy copy): 0.07113 nats. Levels / floor: eval softmax 0.150, linear 0.165; "
                      "eval-10% softmax 0.150, linear 0.165; train-10% softmax 1.500, linear 1.650; "
                      "train-med softmax 1.500, linear 1.650", text)
        # without noise there is no floor line
        self.paired("copy-cpu-clean", [1.1, 1.1])
        self.assertNotIn("floor", self.report_text("copy-cpu-clean"))
        # a pair whose runs differ in noise is not one experiment
        self.paired("copy-cpu-mixed", [1.1, 1.1], task=noisy)
        make_run(self.root, "copy-cpu-mixed-seed2-linear", 1000, lambda i: 1e-4, const_evals(1000, 1e-5),
                 task={"name": "copy", "symbols": 10, "noise": 0.02})
        self.assertIn("The runs differ in task.noise (loss floors 0.07113, 0.1297): they are not one experiment.",
                      self.report_text("copy-cpu-mixed"))

    def test_paired_ratios_geometric_mean_and_t_interval(self):
        self.paired("copy-cpu", [2.0, 0.5, 1.0])
        runs = seeds.find_runs(self.root)
        self.assertEqual(sorted(runs), [1, 2, 3])
        for name in seeds.NAMES:
            g, lo, hi, worse = seeds.summarise(runs, name)
            # log ratios ln2, -ln2, 0: mean 0, standard deviation ln2, t(2 df) = 4.303
            half = 4.303 * math.log(2) / math.sqrt(3)
            self.assertAlmostEqual(g, 1.0, delta=1e-9)
            self.assertAlmostEqual(lo, math.exp(-half), delta=1e-9)
            self.assertAlmostEqual(hi, math.exp(half), delta=1e-9)
            self.assertEqual(worse, 1)  # only the ratio 2 exceeds 1.05

    def test_a_ratio_of_exactly_one_everywhere_gives_a_point_interval(self):
        self.paired("copy-cpu", [1.0, 1.0])
        g, lo, hi, worse = seeds.summarise(seeds.find_runs(self.root), "train-10%")
        self.assertEqual((g, lo, hi, worse), (1.0, 1.0, 1.0, 0))

    def test_one_seed_has_no_interval(self):
        self.paired("copy-cpu", [3.0])
        g, lo, hi, _ = seeds.summarise(seeds.find_runs(self.root), "eval")
        self.assertAlmostEqual(g, 3.0, delta=1e-12)
        self.assertIsNone(lo)
        self.assertIsNone(hi)
        self.assertAlmostEqual(seeds.level(seeds.find_runs(self.root), "linear", "eval"), 3e-5, delta=1e-15)

    def test_runs_are_chosen_by_prefix_and_paired(self):
        self.paired("copy-cpu", [2.0, 2.0])
        self.paired("copy-cpu-x20k", [4.0, 4.0, 4.0], steps=2000)
        os.remove(os.path.join(self.root, "copy-cpu-x20k-seed3-softmax", "train.json"))  # seed 3 unpaired
        base = seeds.find_runs(self.root)
        self.assertEqual(sorted(base), [1, 2])  # the x20k folders are not seed runs of copy-cpu
        self.assertAlmostEqual(base[1]["linear"]["train-10%"] / base[1]["softmax"]["train-10%"], 2.0, delta=1e-12)
        longer = seeds.find_runs(self.root, "copy-cpu-x20k")
        self.assertEqual(sorted(longer), [1, 2])
        self.assertEqual(sorted(seeds.find_runs(self.root, "copy-cpu-x20k", 1000)), [1, 2])

    def test_command_line(self):
        self.paired("copy-cpu", [2.0, 0.5, 1.0])
        out = io.StringIO()
        sys.stdout, saved = out, sys.stdout
        try:
            rc = seeds.main([self.root, "--at", "1000", "--at", "900"])
        finally:
            sys.stdout = saved
        self.assertEqual(rc, 0)
        text = out.getvalue()
        self.assertIn("3 seeds, after step 1000.", text)
        self.assertIn("3 seeds, after step 900.", text)
        # levels: softmax 1e-4 on every seed, linear 1e-4 x (2 * 0.5 * 1)^(1/3)
        self.assertIn("train-10% 1.00 [0.18, 5.60] (softmax 0.0001, linear 0.0001); "
                      "seeds where linear is more than 5% above softmax: 1 of 3", text)
        self.assertIn("| 1 | 1e-05 | 2e-05 | 2.00 | 1e-05 | 2e-05 | 2.00 | 0.0001 | 0.0002 | 2.00 | 0.0001 | 0.0002 | 2.00 |",
                      text)
        err = io.StringIO()
        sys.stderr, saved = err, sys.stderr
        try:
            self.assertEqual(seeds.main([self.root, "--bogus"]), 2)
            self.assertEqual(seeds.main([self.root, "--at", "ten"]), 2)
            self.assertEqual(seeds.main([self.root, "--at"]), 2)
            self.assertEqual(seeds.main([os.path.join(self.root, "missing")]), 2)
            self.assertEqual(seeds.main([self.root, "--prefix", "nothing"]), 2)
            self.assertEqual(seeds.main([self.root, "--at", "5000"]), 2)
        finally:
            sys.stderr = saved
        lines = err.getvalue().splitlines()
        self.assertEqual(len(lines), 6)  # one line per refusal
        self.assertIn("unknown option '--bogus'", lines[0])
        self.assertIn("not 'ten'", lines[1])


class Curve(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        # seed 1: softmax 1e-4, linear 1e-3; seed 2: softmax 4e-4, linear 1e-3 until
        # step 500, then 4e-3. Evaluations every 100 steps at a tenth of the level;
        # seed 2's linear run has none at step 1000. Seed 3 has no linear run.
        for seed, sm, lin in ((1, 1e-4, lambda i: 1e-3), (2, 4e-4, lambda i: 1e-3 if i < 500 else 4e-3)):
            make_run(self.root, "copy-cpu-x2k-seed%d-softmax" % seed, 1500, lambda i, sm=sm: sm,
                     const_evals(1500, sm / 10))
            ev = {k: lin(k - 1) / 10 for k in range(0, 1501, 100) if not (seed == 2 and k == 1000)}
            make_run(self.root, "copy-cpu-x2k-seed%d-linear" % seed, 1500, lin, ev)
        make_run(self.root, "copy-cpu-x2k-seed3-softmax", 1500, lambda i: 1.0, const_evals(1500, 1.0))

    def tearDown(self):
        self.tmp.cleanup()

    def test_geometric_mean_and_range_over_the_seeds(self):
        head, rows, used = seeds.curve(self.root, "copy-cpu-x2k", 500)
        self.assertEqual(used, [1, 2])
        self.assertEqual(head[:5], ["step", "variant", "train", "train_lo", "train_hi"])
        self.assertEqual([(r[0], r[1]) for r in rows],
                         [(k, v) for k in (500, 1000, 1500) for v in ("softmax", "linear")])
        sm, lin = rows[0], rows[1]
        self.assertAlmostEqual(sm[2], 2e-4, delta=1e-15)  # sqrt(1e-4 * 4e-4)
        self.assertEqual((sm[3], sm[4]), (1e-4, 4e-4))
        self.assertAlmostEqual(sm[5], 2e-5, delta=1e-15)
        self.assertAlmostEqual(lin[2], 1e-3, delta=1e-15)
        self.assertAlmostEqual(rows[3][2], 2e-3, delta=1e-15)  # sqrt(1e-3 * 4e-3) over steps 501..1000
        self.assertTrue(all(math.isnan(x) for x in rows[3][5:]))  # seed 2 has no evaluation at step 1000
        self.assertFalse(math.isnan(rows[2][5]))

    def test_command_line_writes_the_table(self):
        path = os.path.join(self.root, "c.tsv")
        out, err = io.StringIO(), io.StringIO()
        sys.stdout, sys.stderr, saved = out, err, (sys.stdout, sys.stderr)
        try:
            rc = seeds.main([self.root, "--prefix", "copy-cpu-x2k", "--curve", path, "--window", "750"])
            bad = seeds.main([self.root, "--prefix", "copy-cpu-x2k", "--curve", path, "--window", "0"])
            none = seeds.main([self.root, "--prefix", "copy-cpu-x2k", "--curve", path, "--window", "5000"])
        finally:
            sys.stdout, sys.stderr = saved
        self.assertEqual((rc, bad, none), (0, 2, 2))
        with open(path) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0].split("\t"), ["step", "variant", "train", "train_lo", "train_hi", "eval",
                                                "eval_lo", "eval_hi"])
        self.assertEqual([l.split("\t")[:2] for l in lines[1:]],
                         [["750", "softmax"], ["750", "linear"], ["1500", "softmax"], ["1500", "linear"]])
        self.assertIn("wrote %s: 2 steps x 2 variants, seeds 1 2" % path, out.getvalue())
        self.assertIn("positive step count, not '0'", err.getvalue())


class Plateau(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def verdict(self, loss, steps=2000):
        return plateau.check(make_run(self.tmp.name, "r", steps, loss, const_evals(steps, 1.0)))

    def test_flat_noisy_loss_is_a_plateau(self):
        # 1.0 with 10% Gaussian noise (fixed seed): no trend, so the decline is noise
        noise = random.Random(5)
        self.assertTrue(self.verdict(lambda i: 1.0 + 0.1 * noise.gauss(0, 1)).endswith(": plateau"))

    def test_falling_loss_is_not(self):
        # falls by a factor 2 over the last 20% of the steps, with little noise
        noise = random.Random(6)
        r = self.verdict(lambda i: 2.0 ** (-(i / 400.0)) * (1 + 0.01 * noise.gauss(0, 1)))
        self.assertIn("NOT a plateau", r)

    def test_rising_loss_is_a_plateau(self):
        self.assertTrue(self.verdict(lambda i: 1.0 + i / 2000.0).endswith(": plateau"))

    def test_step_count_must_divide(self):
        self.assertIn("need a multiple of 200", self.verdict(lambda i: 1.0, steps=1010))



class Table(unittest.TestCase):
    def test_rows_name_the_seed_when_seeds_differ(self):
        table = os.path.join(ROOT, "experiments", "copy", "table.py")
        with tempfile.TemporaryDirectory() as root:
            dirs = []
            for seed, v in ((1, "softmax"), (2, "softmax")):
                d = make_run(root, f"s{seed}-{v}", 200, lambda i: 0.5, const_evals(200, 0.1))
                run = load(d)
                run["config"].update(label=v, seed=seed, name="copy-cpu-" + v)
                run["summary"].update(final_train_loss_mean=0.5, final_eval_loss=0.1)
                with open(os.path.join(d, "train.json"), "w") as f:
                    json.dump(run, f)
                dirs.append(d)
            out = subprocess.run([sys.executable, table] + dirs, capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            rows = [l for l in out.stdout.splitlines() if l.startswith("| softmax")]
            self.assertEqual([r.split(" | ")[0] for r in rows], ["| softmax (seed 1)", "| softmax (seed 2)"])
            # the last 10% of a constant loss: mean 0.5, standard error 0 over 20 blocks of 1
            self.assertIn("| 0.5 ± 0 (", rows[0])
            out = subprocess.run([sys.executable, table, dirs[0]], capture_output=True, text=True)
            self.assertTrue(out.stdout.splitlines()[2].startswith("| softmax | 200 |"), out.stdout)


class Collect(unittest.TestCase):
    def test_compacts_train_records_and_keeps_the_rest(self):
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            d = os.path.join(src, "copy-cpu-x")
            os.makedirs(d)
            run = {"schema": "attnbench/run/1", "config": {"steps": 20, "task": {"name": "copy"}},
                   "git": {"commit": "abc", "dirty": False}, "summary": {"steps_done": 20},
                   "step_loss": [0.5 + i for i in range(20)],
                   "records": [{"kind": "eval", "step": 0, "eval_loss": 2.0, "eval_accuracy": 0.1},
                               {"kind": "train", "step": 10, "loss": 1.5, "lr": 0.001, "grad_norm": 3.0}]}
            with open(os.path.join(d, "train.json"), "w") as f:
                json.dump(run, f)
            with open(os.path.join(d, "generate.json"), "w") as f:
                json.dump({"exact_rate": 1.0}, f)
            collect = os.path.join(ROOT, "experiments", "copy", "collect.py")
            r = subprocess.run([sys.executable, collect, "--from", src, "--to", dst, "copy-cpu-x"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = load(os.path.join(dst, "copy-cpu-x"))
            self.assertEqual(out["records"][1], {"kind": "train", "step": 10, "loss": 1.5})
            self.assertEqual(out["records"][0], run["records"][0])
            for k in ("step_loss", "config", "git", "summary", "schema"):
                self.assertEqual(out[k], run[k])
            with open(os.path.join(dst, "copy-cpu-x", "generate.json")) as f:
                self.assertEqual(json.load(f), {"exact_rate": 1.0})
            # a run without its per-step losses, or a missing one: refused, nothing written
            del run["step_loss"]
            with open(os.path.join(d, "train.json"), "w") as f:
                json.dump(run, f)
            os.makedirs(os.path.join(src, "copy-cpu-y"))
            for name in ("copy-cpu-x", "copy-cpu-y", "../x"):
                r = subprocess.run([sys.executable, collect, "--from", src, "--to", os.path.join(dst, "new"), name],
                                   capture_output=True, text=True)
                self.assertEqual(r.returncode, 2)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertFalse(os.path.exists(os.path.join(dst, "new")))

class ShellArguments(unittest.TestCase):
    """run-seeds.sh and run-longer.sh refuse bad arguments with one line and exit
    status 2 before they build or train anything."""

    def refuse(self, script, args, env, message):
        full = {k: v for k, v in os.environ.items() if k not in ("JOBS", "PREFIX", "SET", "THREADS", "VARIANTS")}
        full.update(env)
        r = subprocess.run(["bash", os.path.join(ROOT, "experiments", "copy", script)] + args,
                           env=full, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stdout, "")
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(message, lines[0])

    def test_run_seeds(self):
        self.refuse("run-seeds.sh", [], {}, "usage: run-seeds.sh SEED...")
        self.refuse("run-seeds.sh", ["1", "2x"], {}, "a seed must be a number, not '2x'")
        self.refuse("run-seeds.sh", ["1"], {"JOBS": "3"}, "JOBS must be 1 or 2, not '3'")
        self.refuse("run-seeds.sh", ["1"], {"PREFIX": "../x"}, "PREFIX must be a plain name")
        self.refuse("run-seeds.sh", ["1"], {"SET": "model.layers=1"}, "give the runs their own PREFIX")

    def test_run_longer(self):
        self.refuse("run-longer.sh", ["20000"], {}, "usage: run-longer.sh STEPS SEED...")
        self.refuse("run-longer.sh", ["20k", "1"], {}, "STEPS must be a step count, not '20k'")
        self.refuse("run-longer.sh", ["20000", "1"], {"JOBS": "0"}, "JOBS must be 1 or 2, not '0'")
        self.refuse("run-longer.sh", ["20000", "1"], {"PREFIX": "a b"}, "PREFIX must be a plain name")


if __name__ == "__main__":
    unittest.main(verbosity=1)
