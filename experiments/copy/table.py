#!/usr/bin/env python3
"""The copy experiment's results table (markdown) from run folders written by
`attnbench train` (train.json) and `attnbench generate` (generate.json).

    python3 experiments/copy/table.py results/copy-cpu-softmax results/copy-cpu-linear ...

Columns: final eval loss and accuracy (teacher forcing, the fixed evaluation set),
the mean of the per-step training loss over the last 10% of the steps with the
standard error of that mean (from 20 block means, as plateau.py: neighbouring steps'
losses are correlated) and the standard deviation of the per-step loss, greedy-generation copy accuracy and exact-copy rate, training wall
time (all processes of the run), training tokens/s (positions processed per second
inside the steps), generation mode and tokens/s. When the runs differ in their seed,
each row's variant names it."""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import provenance  # noqa: E402  (experiments/provenance.py)


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def mean_se(loss):
    """Mean of the last 10% of the per-step losses and its standard error from 20
    block means (None when the run is too short to split)."""
    t = len(loss)
    w = loss[t - t // 10:]
    blk = len(w) // 20
    if blk < 1:
        return None, None
    means = [statistics.fmean(w[i:i + blk]) for i in range(0, blk * 20, blk)]
    return statistics.fmean(w), statistics.stdev(means) / len(means) ** 0.5


def main(dirs):
    print("| variant | steps | final eval loss | eval accuracy | train loss, last 10% ± SE (std) | "
          "generation accuracy | exact copies | wall time | train tokens/s | generation mode | generation tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    runs = [json.load(open(os.path.join(d, "train.json"))) for d in dirs]
    # runs of several seeds: each row names its seed
    seeded = len({r["config"].get("seed") for r in runs}) > 1
    docs = []
    for d, run in zip(dirs, runs):
        s = run.get("summary", {})
        g = {}
        gp = os.path.join(d, "generate.json")
        if os.path.exists(gp):
            g = json.load(open(gp))
        label = run["config"].get("label", run["config"]["name"])
        if seeded:
            label += f" (seed {run['config'].get('seed')})"
        label = provenance.mark(label, [run])
        docs.append(run)
        _, se = mean_se(run.get("step_loss", []))
        wall = s.get("wall_s")
        print("| %s | %s | %s | %s | %s ± %s (%s) | %s | %s | %s | %s | %s | %s |" % (
            label, s.get("steps_done"), fmt(s.get("final_eval_loss"), ".3g"), fmt(s.get("final_eval_accuracy"), ".4f"),
            fmt(s.get("final_train_loss_mean"), ".3g"), fmt(se, ".2g"), fmt(s.get("final_train_loss_std"), ".2g"),
            fmt(g.get("accuracy"), ".4f"), fmt(g.get("exact_rate"), ".3f"),
            "-" if wall is None else "%.1f min" % (wall / 60), fmt(s.get("train_tokens_per_s"), ".0f"),
            g.get("mode", "-"), fmt(g.get("tokens_per_s"), ".0f")))
    for line in provenance.notes(docs):
        print()
        print(line)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: table.py RUN_DIR...")
    main(sys.argv[1:])
