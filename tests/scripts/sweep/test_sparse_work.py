#!/usr/bin/env python3
"""experiments/sweep/sparse_work.py: its count of a mask's (query, key) pairs against
a brute-force count over every pair, its table on a synthetic bench document, and its
refusals.

    python3 tests/scripts/sweep/test_sparse_work.py SOURCE_ROOT
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "..")
SCRIPT = os.path.join(ROOT, "experiments", "sweep", "sparse_work.py")
spec = importlib.util.spec_from_file_location("sparse_work", SCRIPT)
sw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sw)


def brute(n, causal, w, s):
    """Every pair tested by the definition of experiments/sweep's variants."""
    count = 0
    for i in range(n):
        for j in range(n):
            d = i - j if causal else abs(i - j)
            if d < 0:
                continue
            if d < w or (s is not None and d % s == 0):
                count += 1
    return count


def record(variant, label, n, ms, opts, causal=True, status="ok"):
    return {"kind": "parallel", "variant": label, "variant_name": variant, "options": opts, "len": n,
            "causal": causal, "status": status, "per_sample_fwd_bwd_ms": ms}


def run(doc):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "run.json")
        with open(path, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        p = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


class Pairs(unittest.TestCase):
    def test_counts_match_brute_force(self):
        # windows and strides below, at and above n; stride 1 (every key); both masks
        for n in (1, 2, 7, 16, 33):
            for w in (1, 3, 5, 16, 40):
                for s in (None, 1, 2, 5, 16, 50):
                    for causal in (True, False):
                        with self.subTest(n=n, w=w, s=s, causal=causal):
                            self.assertEqual(sw.pairs(n, causal, w, s), brute(n, causal, w, s))

    def test_auto_is_rounded_sqrt(self):
        # llround(sqrt(n)) of attention/sparse_geo.h: 45.25 -> 45, 181.02 -> 181, 1 -> 1
        self.assertEqual([sw.auto(n) for n in (1, 2048, 32768, 65536)], [1, 45, 181, 256])


class Table(unittest.TestCase):
    def test_table_and_exponents(self):
        # time exactly proportional to the pairs: ns per pair constant, both exponents equal
        recs = []
        for n in (64, 256, 1024):
            p = sw.pairs(n, True, sw.auto(n), sw.auto(n))
            recs.append(record("sparse", "sparse", n, p * 2e-6, {"window": "auto", "stride": "auto"}))
        recs.append(record("local", "local-8", 64, 1.0, {"window": 8.0}))
        recs.append(record("local", "local-8", 256, None, {"window": 8.0}, status="timeout"))
        recs.append(record("softmax", "softmax", 64, 1.0, {}))
        rc, out, err = run({"schema": "attnbench/run/1", "records": recs})
        self.assertEqual(rc, 0, err)
        self.assertIn("| sparse | 64 | 8 | 8 |", out)
        self.assertEqual(out.count("| 2.0 |"), 3, out)  # 2 ns per pair at every sparse point
        self.assertIn("| local-8 | 256 | 8 | - |", out)
        self.assertIn("| timeout | - |", out)
        self.assertNotIn("softmax", out)
        ep = sw.fit([(n, sw.pairs(n, True, sw.auto(n), sw.auto(n))) for n in (64, 256, 1024)])
        self.assertIn(f"| sparse | {ep:.2f} | {ep:.2f} | 64..1024 |", out)
        self.assertIn("| local-8 | - | - | 64..64 |", out)  # one point: no fit

    def test_refusals(self):
        for doc, what in (("{", "not JSON"), ({"schema": "other"}, "not an attnbench run"),
                          ({"schema": "attnbench/run/1", "records": []}, "no bench points"),
                          ({"schema": "attnbench/run/1",
                            "records": [record("sparse", "s", 16, 1.0, {"window": -3})]}, "window=-3")):
            with self.subTest(what=what):
                rc, out, err = run(doc)
                self.assertEqual(rc, 2)
                self.assertIn(what, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertEqual(out, "")


if __name__ == "__main__":
    unittest.main()
