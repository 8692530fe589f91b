#!/usr/bin/env python3
"""Linear against softmax on the copy task, paired by seed.

    python3 experiments/copy/seeds.py [RESULTS_DIR] [--prefix NAME] [--at STEP]...
                                      [--curve FILE.tsv [--window K]]

RESULTS_DIR (default: results) holds the runs as written by run-cpu.sh, run-seeds.sh
and run-longer.sh: with the default prefix copy-cpu, RESULTS_DIR/copy-cpu-softmax and
copy-cpu-linear are seed 1 and copy-cpu-seedS-softmax, copy-cpu-seedS-linear seed S;
with --prefix NAME the folders NAME-seedS-VARIANT (run-longer.sh's copies, e.g.
copy-cpu-x20k). Only seeds where both variants have run at least to the step measured
are used.

--at STEP measures the runs as they stood after STEP steps (default: each run's
configured step count); given several times, one table per step. The measures of a
step depend only on the steps up to it, so a run continued to 20000 steps measured
--at 10000 gives exactly what the 10000-step run gave.

Per seed and variant, measures of the final copy loss at step T:
  eval       the evaluation's loss after step T (dropout off, the fixed evaluation set);
  eval-10%   the median of the evaluations in the last 10% of the steps up to T (less
             sensitive to where exactly the run stopped; the median because single
             evaluations spike 10-30x now and then);
  train-10%  the mean per-step training loss over the last 10% of the steps up to T
             (dropout on; the curve Figure 2 draws);
  train-med  the median of those per-step training losses (the level of the floor the
             spikes rise from; added after the ten-seed results had been seen, so it is
             a description, not a test fixed in advance).
--curve FILE.tsv also writes both variants' loss curves summarised over the seeds
(every K steps, default 250: geometric mean and range over the seeds of each run's
median training loss over the K steps, and of the evaluation loss), which
plots/figure2-seeds.gp draws.

Runs of the noisy copy (config task.noise = p > 0; PROTOCOL.md, addendum 2) have a
loss floor above zero, the entropy of a copied target given the symbol to copy
(loss_floor; copy_loss_floor in copy_task.c): the report then gives it and each
variant's levels as multiples of it.

For each measure: the ratio linear / softmax per seed, their geometric mean, a 95%
interval for it (Student t on the log ratios; the seeds are independent pairs), and
each variant's level (geometric mean over the seeds). The
ratio of two variants' final losses is what "the same final loss within 5%" is about:
an upper end of the interval at or below 1.05 says linear's final loss is no more than
5% above softmax's."""
import json
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from seedstats import t95  # noqa: E402  (experiments/seedstats.py)

NAMES = ["eval", "eval-10%", "train-10%", "train-med"]


def geomean(xs):
    """Geometric mean of positive numbers."""
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def loss_floor(task):
    """The lowest expected loss (nats) of a copied symbol's prediction for a copy task's
    config (dict): with noise p over S symbols, -(q ln q + (S - 1) (p/S) ln(p/S)),
    q = 1 - p + p/S; 0 without noise."""
    p, n = task.get("noise", 0), task.get("symbols", 10)
    if p <= 0:
        return 0.0
    other = p / n
    q = 1 - p + other
    return -(q * math.log(q) + (n - 1) * other * math.log(other))


def measures(run, at=None):
    """The measures of one run (train.json, parsed) after step `at` (default: its
    configured steps); None when the run has not reached that step or has no
    evaluation after it."""
    steps = run["config"]["steps"]
    at = steps if at is None else at
    done = run.get("summary", {}).get("steps_done", 0)
    loss = run["step_loss"]
    if at < 10 or done < at or len(loss) < at:
        return None
    evals = [r for r in run["records"] if r["kind"] == "eval" and r["step"] <= at]
    if not evals or evals[-1]["step"] != at:
        return None
    tail = [r["eval_loss"] for r in evals if r["step"] > at - at // 10]
    window = loss[at - at // 10:at]
    return {"eval": evals[-1]["eval_loss"],
            "eval-10%": statistics.median(tail),
            "train-10%": statistics.fmean(window),
            "train-med": statistics.median(window),
            "floor": loss_floor(run["config"].get("task", {}))}


def load_pairs(root, prefix="copy-cpu"):
    """{seed: {variant: parsed train.json}} of the run folders of the prefix, for the
    seeds that have both variants. Read once; the measures and the curve use it."""
    pat = re.compile(re.escape(prefix) + (r"-(?:seed(\d+)-)?" if prefix == "copy-cpu" else r"-seed(\d+)-")
                     + r"(softmax|linear)")
    pairs = {}
    for name in sorted(os.listdir(root)):
        m = pat.fullmatch(name)
        path = os.path.join(root, name, "train.json")
        if not m or not os.path.exists(path):
            continue
        with open(path) as f:
            pairs.setdefault(int(m.group(1) or 1), {})[m.group(2)] = json.load(f)
    return {s: r for s, r in sorted(pairs.items()) if len(r) == 2}


def pair_measures(pairs, at=None):
    """{seed: {variant: measures}} of load_pairs' runs, for the seeds where both
    variants can be measured."""
    runs = {s: {v: measures(run, at) for v, run in p.items()} for s, p in pairs.items()}
    return {s: r for s, r in runs.items() if None not in r.values()}


def find_runs(root, prefix="copy-cpu", at=None):
    """{seed: {variant: measures}} for the seeds where both variants can be measured."""
    return pair_measures(load_pairs(root, prefix), at)


def curve(root, prefix="copy-cpu", window=250):
    """curve_rows of the runs under root."""
    return curve_rows(load_pairs(root, prefix), window)


def curve_rows(pairs, window=250):
    """The loss curves of both variants summarised over the seeds, as TSV rows: for
    every `window` steps up to the step all paired runs have reached, per variant, the
    geometric mean over the seeds of each run's median training loss over the window
    (train), with the smallest and largest run's (train_lo, train_hi); and the same of
    the evaluation loss at that step (eval, eval_lo, eval_hi; NaN without an evaluation
    there). Returns (header, rows, seeds)."""
    if not pairs:
        return None, [], []
    last = min(min(r["summary"].get("steps_done", 0), len(r["step_loss"])) for p in pairs.values() for r in p.values())
    head = ["step", "variant", "train", "train_lo", "train_hi", "eval", "eval_lo", "eval_hi"]
    rows = []
    evals = {(s, v): {r["step"]: r["eval_loss"] for r in run["records"] if r["kind"] == "eval"}
             for s, p in pairs.items() for v, run in p.items()}
    for step in range(window, last + 1, window):
        for v in ("softmax", "linear"):
            tr = [statistics.median(pairs[s][v]["step_loss"][step - window:step]) for s in pairs]
            ev = [evals[(s, v)].get(step) for s in pairs]
            row = [step, v, geomean(tr), min(tr), max(tr)]
            row += [geomean(ev), min(ev), max(ev)] if all(e is not None and e > 0 for e in ev) else [math.nan] * 3
            rows.append(row)
    return head, rows, sorted(pairs)


def summarise(runs, name):
    """Geometric mean of the ratio linear / softmax over the seeds, its 95% interval
    (None, None for one seed) and the number of seeds where the ratio exceeds 1.05."""
    x = [math.log(r["linear"][name] / r["softmax"][name]) for r in runs.values()]
    mean = statistics.fmean(x)
    worse = sum(1 for v in x if v > math.log(1.05))
    t = t95(len(x) - 1)
    if t is None:
        return math.exp(mean), None, None, worse
    half = t * statistics.stdev(x) / math.sqrt(len(x))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half), worse


def level(runs, variant, name):
    """Geometric mean of one variant's measure over the seeds."""
    return geomean(r[variant][name] for r in runs.values())


def report(runs, at, out=None):
    out = out or sys.stdout
    print("| seed | " + " | ".join("%s softmax | %s linear | ratio" % (n, n) for n in NAMES) + " |", file=out)
    print("|---" * (1 + 3 * len(NAMES)) + "|", file=out)
    for seed, r in runs.items():
        cells = ["%.3g | %.3g | %.2f" % (r["softmax"][n], r["linear"][n], r["linear"][n] / r["softmax"][n])
                 for n in NAMES]
        print("| %d | %s |" % (seed, " | ".join(cells)), file=out)
    print(file=out)
    print("%d seeds, %s. Ratio linear / softmax, geometric mean [95%% interval] (the levels: geometric "
          "means over the seeds):"
          % (len(runs), "after step %d" % at if at else "after each run's configured steps"), file=out)
    for n in NAMES:
        g, lo, hi, worse = summarise(runs, n)
        levels = "(softmax %.3g, linear %.3g)" % (level(runs, "softmax", n), level(runs, "linear", n))
        if lo is None:
            print("  %-9s %.2f (one seed: no interval) %s" % (n, g, levels), file=out)
        else:
            print("  %-9s %.2f [%.2f, %.2f] %s; seeds where linear is more than 5%% above softmax: %d of %d"
                  % (n, g, lo, hi, levels, worse, len(runs)), file=out)
    floors = {r[v]["floor"] for r in runs.values() for v in r}
    if len(floors) > 1:
        print("The runs differ in task.noise (loss floors %s): they are not one experiment."
              % ", ".join("%.4g" % f for f in sorted(floors)), file=out)
    elif floors != {0.0}:
        f = floors.pop()
        print("Loss floor (noisy copy): %.4g nats. Levels / floor: %s" % (f, "; ".join(
            "%s softmax %.3f, linear %.3f" % (n, level(runs, "softmax", n) / f, level(runs, "linear", n) / f)
            for n in NAMES)), file=out)


def main(argv):
    root, prefix, ats, curve_out, window = "results", "copy-cpu", [], None, 250
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--prefix", "--at", "--curve", "--window"):
            if i + 1 >= len(argv):
                sys.stderr.write("seeds.py: %s needs a value\n" % a)
                return 2
            if a == "--prefix":
                prefix = argv[i + 1]
            elif a == "--curve":
                curve_out = argv[i + 1]
            else:
                try:
                    k = int(argv[i + 1])
                    if k < 1:
                        raise ValueError
                except ValueError:
                    sys.stderr.write("seeds.py: %s takes a positive step count, not '%s'\n" % (a, argv[i + 1]))
                    return 2
                if a == "--at":
                    ats.append(k)
                else:
                    window = k
            i += 2
        elif a.startswith("-"):
            sys.stderr.write("seeds.py: unknown option '%s' (usage: seeds.py [RESULTS_DIR] [--prefix NAME] "
                             "[--at STEP]... [--curve FILE.tsv [--window K]])\n" % a)
            return 2
        else:
            root = a
            i += 1
    if not os.path.isdir(root):
        sys.stderr.write("seeds.py: no folder '%s'\n" % root)
        return 2
    pairs = load_pairs(root, prefix)
    for k, at in enumerate(ats or [None]):
        runs = pair_measures(pairs, at)
        if not runs:
            sys.stderr.write("seeds.py: no seed with both softmax and linear measurable%s under %s/%s-*\n"
                             % (" at step %d" % at if at else "", root, prefix))
            return 2
        if k:
            print()
        report(runs, at)
    if curve_out:
        head, rows, used = curve_rows(pairs, window)
        if not rows:
            sys.stderr.write("seeds.py: no paired runs of %d steps or more for --curve under %s/%s-*\n"
                             % (window, root, prefix))
            return 2
        tmp = curve_out + ".part"
        with open(tmp, "w") as f:
            f.write("\t".join(head) + "\n")
            for r in rows:
                f.write("\t".join(str(x) if isinstance(x, (int, str)) else "%.6g" % x for x in r) + "\n")
        os.replace(tmp, curve_out)
        print("\nwrote %s: %d steps x 2 variants, seeds %s" % (curve_out, len(rows) // 2,
                                                             " ".join(str(s) for s in used)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
