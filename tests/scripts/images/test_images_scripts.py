#!/usr/bin/env python3
"""The image experiment's scripts (experiments/images/table.py, collect.py) on
synthetic run documents whose answers are known by construction.

    python3 tests/scripts/images/test_images_scripts.py SOURCE_ROOT

The tables of experiments/images/RESULTS.md are printed by table.py, so its arithmetic
(the budgets read from the runs, epochs from steps, the best validation record, the
linear - softmax differences, the speed ratios and the estimate's check) and its
refusals are checked here, and collect.py's copies (per-step losses dropped, the rest
kept). Standard library only."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..")
TABLE = os.path.join(ROOT, "experiments", "images", "table.py")
COLLECT = os.path.join(ROOT, "experiments", "images", "collect.py")
MACHINE = {"cpu": "Test CPU", "cores": 2, "threads": 1, "blas_core": "Haswell",
           "openblas_coretype_env": "Haswell", "blas_threads": 1, "blas_parallel_model": "openmp"}


def train_doc(steps, evals, test_bits, wall_s):
    """A train.json reduced to what the scripts read: evaluations (step, bits/dim), a
    test record at the end, per-step losses."""
    recs = [{"kind": "eval", "step": s, "eval_bits_per_dim": b} for s, b in evals]
    recs.append({"kind": "test", "step": steps, "test_bits_per_dim": test_bits})
    return {"schema": "attnbench/run/1", "status": "ok", "machine": MACHINE, "records": recs,
            "step_loss": [1.0] * steps, "summary": {"steps_done": steps, "wall_s": wall_s}}


def sample_doc(run, variant, values, batch, s_per_image, method="sampled", mode="recompute", every=None):
    d = {"schema": "attnbench/sample/1", "run": run, "variant": variant, "values_per_row": values,
         "batch": batch, "method": method, "mode": mode, "s_per_image": s_per_image,
         "images_per_s": 1.0 / s_per_image, "cpu_s_per_image": s_per_image / 2, "threads": 2, "machine": MACHINE}
    if every:
        d["estimate"] = {"every": every}
    return d


class Scripts(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, rel, doc):
        p = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            json.dump(doc, f)
        return p

    def run_script(self, *args):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True)

    def runs(self):
        # 590 steps of 16 images = 0.16 epochs of 59,000; softmax's equal time is its own
        self.write("mnist-cpu-softmax-epochs.json", train_doc(590, [(500, 1.30), (590, 1.25)], 1.20, 3600))
        self.write("mnist-cpu-softmax-time.json", train_doc(590, [(500, 1.30), (590, 1.25)], 1.20, 3600))
        self.write("mnist-cpu-linear-epochs.json", train_doc(590, [(500, 1.28)], 1.22, 1800))
        self.write("mnist-cpu-linear-time.json", train_doc(877, [(500, 1.28), (877, 1.10)], 1.15, 5400))

    def test_bits_table(self):
        self.runs()
        r = self.run_script(TABLE, "bits", self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].startswith("Machine: Test CPU, 2 cores, 1 thread(s); OpenBLAS core Haswell"), lines[0])
        # the budget from the runs: 590 steps, 590 x 0.6238 s = 0.10 h
        self.assertIn("equal epochs = 590 steps of 16 images (0.16 epochs)", lines[1])
        self.assertIn("softmax's 590 steps, 0.10 h at 1 thread", lines[1])
        self.assertIn("| softmax | 1.2000 | 1.2000 | 590 (0.16) | 1.2500 (590) | 1.00 | 0.621 |", lines)
        # linear: the best validation over both documents is the time run's, 5400 s = 1.50 h
        self.assertIn("| linear | 1.2200 | 1.1500 | 877 (0.24) | 1.1000 (877) | 1.50 | 0.644 |", lines)
        self.assertIn("| lsh-1 | not run | | | | | 0.745 |", lines)
        self.assertIn("linear - softmax: +0.0200 bits/dim at 0.16 epochs (paper, 250 epochs: +0.023), "
                      "-0.0500 at equal time", lines)
        self.assertIn("worst at 0.16 epochs: linear; below 1.0 bits/dim at 0.16 epochs: none", lines)

    def test_bits_refuses_unequal_budgets(self):
        self.runs()
        self.write("mnist-cpu-linear-epochs.json", train_doc(600, [(500, 1.28)], 1.22, 1800))
        r = self.run_script(TABLE, "bits", self.dir)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("linear's equal-epochs run has 600 steps, softmax's 590", r.stderr)
        r = self.run_script(TABLE, "bits", os.path.join(self.dir, "nothing"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no MNIST runs", r.stderr)

    def seed_doc(self, name, seed, steps, test_bits):
        d = train_doc(steps, [(steps, test_bits + 0.05)], test_bits, 100)
        d["config"] = {"seed": seed}
        self.write(name, d)

    def test_seeds(self):
        self.seed_doc("mnist-cpu-softmax-epochs.json", 1, 590, 1.20)
        self.seed_doc("mnist-cpu-softmax-seed3-epochs.json", 3, 590, 1.24)
        self.seed_doc("mnist-cpu-softmax-seed2-epochs.json", 2, 590, 1.22)
        self.seed_doc("mnist-cpu-linear-epochs.json", 1, 590, 1.30)
        self.write("mnist-cpu-linear-time.json", train_doc(877, [(877, 1.1)], 1.15, 5400))  # not read
        r = self.run_script(TABLE, "seeds", self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("Equal epochs: 590 steps of 16 images (0.16 epochs)", lines[1])
        # 1.20, 1.22, 1.24: mean 1.22, sd 0.02, half-width t(2) 4.303 x 0.02 / sqrt(3) = 0.0497
        self.assertIn("| softmax | 1, 2, 3 | 1.2200 [1.1703, 1.2697] | 1.2000, 1.2200, 1.2400 | 0.621 |", lines)
        self.assertIn("| linear | 1 | 1.3000 | 1.3000 | 0.644 |", lines)
        self.assertFalse(any(x.startswith("| lsh-1") for x in lines))
        self.seed_doc("mnist-cpu-linear-seed2-epochs.json", 2, 600, 1.3)
        r = self.run_script(TABLE, "seeds", self.dir)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("has 600 steps, the other equal-epochs runs 590", r.stderr)
        self.seed_doc("mnist-cpu-linear-seed2-epochs.json", 1, 590, 1.3)
        r = self.run_script(TABLE, "seeds", self.dir)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("linear: a seed twice", r.stderr)

    def test_curves(self):
        self.runs()
        r = self.run_script(TABLE, "curves", self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "run\tepochs\tcpu_h\tbits_per_dim")
        # linear at step 877: 877 x 16 / 59000 epochs, 877 x 0.4198 s
        self.assertIn(f"mnist-linear\t{877 * 16 / 59000:.5f}\t{877 * 0.4198 / 3600:.5f}\t1.100000", lines)
        # a step in both documents once
        self.assertEqual(sum(1 for l in lines if l.startswith("mnist-softmax\t")), 2)

    def test_pareto(self):
        self.runs()
        r = self.run_script(TABLE, "pareto", self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "run\tkind\tcpu_h\tvalue")
        # linear's evaluations over both documents (500 once) and its two test records,
        # at 877 and 590 steps x 0.4198 CPU s
        self.assertIn(f"mnist-linear\tvalid\t{877 * 0.4198 / 3600:.5f}\t1.100000", lines)
        self.assertIn(f"mnist-linear\ttest\t{590 * 0.4198 / 3600:.5f}\t1.220000", lines)
        self.assertIn(f"mnist-linear\ttest\t{877 * 0.4198 / 3600:.5f}\t1.150000", lines)
        self.assertEqual(sum(1 for l in lines if l.startswith("mnist-linear\tvalid")), 2)
        # softmax's two budgets are one run: its test record once
        self.assertEqual([l for l in lines if l.startswith("mnist-softmax\ttest")],
                         [f"mnist-softmax\ttest\t{590 * 0.6238 / 3600:.5f}\t1.200000"])
        r = self.run_script(TABLE, "pareto", os.path.join(self.dir, "nothing"), "cifar10")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no cifar10 runs", r.stderr)

    def test_cifar_table_and_curves(self):
        # softmax 1942 steps x 1.39 s = 0.75 h, linear 5934 x 0.455 s = 0.75 h
        self.write("cifar10-cpu-softmax.json", train_doc(1942, [(500, 5.1), (1942, 4.60)], 4.55, 3600))
        self.write("cifar10-cpu-linear.json", train_doc(5934, [(500, 5.2), (5000, 4.41), (5934, 4.43)], 4.40, 5400))
        r = self.run_script(TABLE, "cifar", self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("equal training time, softmax 0.75, linear 0.75 CPU-hours at 1 thread", lines[1])
        self.assertIn("| softmax | 1942 | 7768 (0.16) | 4.5500 | 4.6000 (1942) | 1.00 | 3.47 |", lines)
        self.assertIn("| linear | 5934 | 23736 (0.48) | 4.4000 | 4.4100 (5000) | 1.50 | 3.4 |", lines)
        self.assertIn("linear - softmax at equal time: -0.1500 bits/dim (paper, 7 days each: -0.07)", lines)
        r = self.run_script(TABLE, "curves", self.dir, "cifar10")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn(f"cifar10-linear\t{5000 * 4 / 49000:.5f}\t{5000 * 0.455 / 3600:.5f}\t4.410000", lines)
        self.assertEqual(sum(1 for l in lines if l.startswith("cifar10-softmax\t")), 2)
        r = self.run_script(TABLE, "curves", self.dir, "svhn")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown dataset 'svhn'", r.stderr)

    def test_speed_table(self):
        self.write("s/mnist-linear-b1/sample.json", sample_doc("mnist-linear", "linear", 784, 1, 0.5, mode="recurrent"))
        self.write("s/mnist-linear-b16/sample.json", sample_doc("mnist-linear", "linear", 784, 16, 0.05, mode="recurrent"))
        self.write("s/mnist-softmax-b1/sample.json", sample_doc("mnist-softmax", "softmax", 784, 1, 20.0))
        self.write("s/mnist-softmax-b1-e49/sample.json",
                   sample_doc("mnist-softmax", "softmax", 784, 1, 21.0, method="estimated", every=49))
        self.write("s/mnist-softmax-b16-e49/sample.json",
                   sample_doc("mnist-softmax", "softmax", 784, 16, 2.0, method="estimated", every=49))
        self.write("s/mnist-lsh-4-b1-e49/sample.json",
                   sample_doc("mnist-lsh-4", "lsh", 784, 1, 30.0, method="estimated", every=49))
        r = self.run_script(TABLE, "speed", os.path.join(self.dir, "s"))
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        # the sampled point is preferred to the estimate at batch 1
        self.assertIn("| softmax | recompute | 20 | 0.5 e (16) | 72.6 / 10.2 | 0.45 |", lines)
        self.assertIn("| linear | recurrent | 0.5 | 20 (16) | 5.5 / 7.3 | 142.8 |", lines)
        self.assertIn("| lsh-4 | recompute | 30 e | - | 112.0 / 55.8 | 0.27 |", lines)
        # 20 / 0.5 = 40x at batch 1; 20 / 0.5 = 40x the images/s at batch 16; the paper's
        # 72.6 / 5.5 = 13.2x and 142.8 / 0.45 = 317.3x
        self.assertIn("linear / softmax: 40.0x faster at batch 1 (paper CPU: 13.2x), "
                      "40.0x the images/s at the large batch (paper GPU: 317.3x)  ", lines)
        self.assertIn("The estimate's check (MNIST shape, softmax, batch 1): sampled 20.0 s/image, "
                      "estimated 21.0 (every 49th position), ratio 1.050", lines)
        # on the CPU clock: every point's CPU seconds (half the wall seconds here)
        r = self.run_script(TABLE, "speed", os.path.join(self.dir, "s"), "cpu")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].endswith("the process's CPU seconds"), lines[0])
        self.assertIn("| softmax | recompute | 10 | 1 e (16) | 72.6 / 10.2 | 0.45 |", lines)
        self.assertIn("| linear | recurrent | 0.25 | 40 (16) | 5.5 / 7.3 | 142.8 |", lines)
        # a point whose steps ran as a CUDA graph is compared with its plain twin, not
        # put in the table: 1 / 0.05 = 20 images/s without, 1 / 0.04 = 25 with: 1.25
        g = sample_doc("mnist-linear", "linear", 784, 16, 0.04, mode="recurrent")
        g["graph"] = {"asked": True, "records": 1, "launches": 783, "note": None}
        self.write("s/mnist-linear-b16-graph/sample.json", g)
        r = self.run_script(TABLE, "speed", os.path.join(self.dir, "s"))
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("| linear | recurrent | 0.5 | 20 (16) | 5.5 / 7.3 | 142.8 |", lines)
        self.assertIn("| mnist | linear | 16 | 20 | 25 | 1.25 |", lines)
        r = self.run_script(TABLE, "speed", os.path.join(self.dir, "s"), "sundial")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown clock 'sundial'", r.stderr)

    def traffic_doc(self, variant, values, batch, position, dram, minimum, by_name):
        return {"schema": "attnbench/sample/1", "run": "r", "variant": variant, "values_per_row": values,
                "batch": batch, "method": "traffic", "mode": "recurrent", "threads": 1,
                "machine": dict(MACHINE, gpu={"name": "attnbench CUDA emulator (CPU)", "traffic_counted": True}),
                "traffic": {"position": position, "launches": 77, "dram_read_bytes": dram - 1000,
                            "dram_write_bytes": 1000, "requested_read_bytes": 2 * dram, "requested_write_bytes": 0,
                            "min_read_bytes": minimum - 500, "min_write_bytes": 500, "by_name": by_name}}

    def test_traffic_table(self):
        mib = 2 ** 20
        k = [{"name": "cublasSgemm", "dram_read_bytes": 30 * mib, "dram_write_bytes": 0},
             {"name": "elu", "dram_read_bytes": 5 * mib, "dram_write_bytes": 5 * mib},
             {"name": "draw_rows_kernel", "dram_read_bytes": 0, "dram_write_bytes": 0}]
        # 40 MiB a step of 16 rows of 784 values: at 1000 GB/s 41.94 us a position,
        # 16 / (784 x 41.94e-6 s) = 486.6 images/s; the floor (32 MiB) 33.55 us, 608.2
        self.write("t/mnist-linear-b16-t1/sample.json", self.traffic_doc("linear", 784, 16, 1, 40 * mib, 32 * mib, k))
        self.write("t/mnist-stateful-softmax-b16-t392/sample.json",
                   self.traffic_doc("stateful-softmax", 784, 16, 392, 40 * mib, 40 * mib, k))
        self.write("t/other/sample.json", sample_doc("mnist-linear", "linear", 784, 1, 0.5))  # not a count: skipped
        r = self.run_script(TABLE, "traffic", os.path.join(self.dir, "t"), "1000")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].startswith("Device: attnbench CUDA emulator (CPU), traffic counted: true"), lines[0])
        self.assertEqual(lines[1], "Source: no commit recorded")
        self.assertIn("| MNIST | linear | 16 | 1 | 77 | 40 | 32 | 1.25 | 2.50 | cublasSgemm (75%), elu (25%) "
                      "| 41.94, 33.55 | 486.6, 608.2 |", lines)
        self.assertIn("| MNIST | stateful-softmax | 16 | 392 | 77 | 40 | 40 | 1.00 | 2.00 | cublasSgemm (75%), "
                      "elu (25%) | 41.94, 41.94 | 486.6, 486.6 |", lines)
        self.assertEqual(sum(1 for x in lines if x.startswith("| MNIST")), 2)
        for bad in ("0", "fast"):
            r = self.run_script(TABLE, "traffic", os.path.join(self.dir, "t"), bad)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(f"GBPS '{bad}' is not a positive number", r.stderr)
        r = self.run_script(TABLE, "traffic", os.path.join(self.dir, "nothing"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no sample.json of `sample --traffic`", r.stderr)

    def test_collect(self):
        res = os.path.join(self.dir, "results")
        self.write("results/mnist-cpu-linear/train-epochs.json", train_doc(5, [(5, 1.5)], 1.4, 10))
        self.write("results/mnist-cpu-linear-seed2/train-epochs.json", train_doc(5, [(5, 1.5)], 1.3, 10))
        self.write("results/images-speed/mnist-linear-b1/sample.json",
                   sample_doc("mnist-linear", "linear", 784, 1, 0.5, mode="recurrent"))
        self.write("results/images-traffic/mnist-linear-b1-t1/sample.json",
                   sample_doc("mnist-linear", "linear", 784, 1, 0.5, method="traffic", mode="recurrent"))
        # collect writes into the source tree's runs/: run it on a copy of the script
        # placed in a scratch tree so that the repository is not touched
        tree = os.path.join(self.dir, "tree", "experiments", "images")
        os.makedirs(tree)
        with open(COLLECT) as f, open(os.path.join(tree, "collect.py"), "w") as g:
            g.write(f.read())
        r = self.run_script(os.path.join(tree, "collect.py"), res)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(tree, "runs", "mnist-cpu-linear-epochs.json")) as f:
            doc = json.load(f)
        self.assertNotIn("step_loss", doc)
        self.assertEqual(doc["records"][-1]["test_bits_per_dim"], 1.4)
        with open(os.path.join(tree, "runs", "mnist-cpu-linear-seed2-epochs.json")) as f:
            self.assertEqual(json.load(f)["records"][-1]["test_bits_per_dim"], 1.3)
        self.assertTrue(os.path.exists(os.path.join(tree, "runs", "speed", "mnist-linear-b1", "sample.json")))
        self.assertTrue(os.path.exists(os.path.join(tree, "runs", "traffic-emu", "mnist-linear-b1-t1", "sample.json")))
        self.assertIn("missing, skipped", r.stderr)  # the other variants' documents


if __name__ == "__main__":
    unittest.main(verbosity=1)
