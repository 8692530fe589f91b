#!/usr/bin/env python3
"""Linear against softmax on the copy task, paired by seed.

    python3 experiments/copy/seeds.py [RESULTS_DIR]     (default: results)

Reads RESULTS_DIR/copy-cpu-softmax, copy-cpu-linear (seed 1) and
copy-cpu-seedS-softmax, copy-cpu-seedS-linear (seed S), as written by run-cpu.sh and
run-seeds.sh; uses the seeds where both variants finished all their steps.

Per seed and variant, three measures of the final copy loss:
  eval      the last evaluation's loss (dropout off, the fixed evaluation set);
  eval-10%  the median of the evaluations in the last 10% of the steps (less
            sensitive to where exactly the run stopped; the median because single
            evaluations spike 10-30x now and then);
  train-10% the mean per-step training loss over the last 10% of the steps (dropout
            on; the curve Figure 2 draws).
For each measure: the ratio linear / softmax per seed, their geometric mean, and a 95%
interval for it (Student t on the log ratios; the seeds are independent pairs). The
ratio of two variants' final losses is what "the same final loss within 5%" is about:
an upper end of the interval at or below 1.05 says linear's final loss is no more than
5% above softmax's."""
import json
import math
import os
import re
import statistics
import sys

# Two-sided 95% Student t quantiles, by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    keys = sorted(k for k in T95 if k <= df)
    return T95[keys[-1]] if keys else None


def measures(path):
    run = json.load(open(os.path.join(path, "train.json")))
    steps = run["config"]["steps"]
    s = run.get("summary", {})
    if s.get("steps_done") != steps:
        return None
    evals = [r for r in run["records"] if r["kind"] == "eval"]
    tail = [r["eval_loss"] for r in evals if r["step"] > steps - steps // 10]
    loss = run["step_loss"]
    return {"eval": evals[-1]["eval_loss"],
            "eval-10%": statistics.median(tail),
            "train-10%": statistics.fmean(loss[len(loss) - len(loss) // 10:])}


def find_runs(root):
    runs = {}
    for name in sorted(os.listdir(root)):
        m = re.fullmatch(r"copy-cpu-(?:seed(\d+)-)?(softmax|linear)", name)
        if not m or not os.path.exists(os.path.join(root, name, "train.json")):
            continue
        seed = int(m.group(1) or 1)
        got = measures(os.path.join(root, name))
        if got is not None:
            runs.setdefault(seed, {})[m.group(2)] = got
    return {s: r for s, r in sorted(runs.items()) if len(r) == 2}


def main(root):
    runs = find_runs(root)
    if not runs:
        sys.exit("seeds.py: no seed with both softmax and linear complete under " + root)
    names = ["eval", "eval-10%", "train-10%"]
    print("| seed | " + " | ".join("%s softmax | %s linear | ratio" % (n, n) for n in names) + " |")
    print("|---" * (1 + 3 * len(names)) + "|")
    logs = {n: [] for n in names}
    for seed, r in runs.items():
        cells = []
        for n in names:
            a, b = r["softmax"][n], r["linear"][n]
            logs[n].append(math.log(b / a))
            cells.append("%.3g | %.3g | %.2f" % (a, b, b / a))
        print("| %d | %s |" % (seed, " | ".join(cells)))
    print()
    print("%d seeds. Ratio linear / softmax, geometric mean [95%% interval]:" % len(runs))
    for n in names:
        x = logs[n]
        g = math.exp(statistics.fmean(x))
        t = t95(len(x) - 1)
        if t is None:
            print("  %-9s %.2f (one seed: no interval)" % (n, g))
            continue
        half = t * statistics.stdev(x) / math.sqrt(len(x))
        lo, hi = math.exp(statistics.fmean(x) - half), math.exp(statistics.fmean(x) + half)
        worse = sum(1 for v in x if v > math.log(1.05))
        print("  %-9s %.2f [%.2f, %.2f]; seeds where linear is more than 5%% above softmax: %d of %d"
              % (n, g, lo, hi, worse, len(x)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results")
