#!/usr/bin/env python3
"""Plateau check of the copy runs (the CPU-scale config choice, see
experiments/copy/PROTOCOL.md), one run at a time.

    python3 experiments/copy/plateau.py results/copy-cpu-softmax results/copy-cpu-linear

For a run of T steps (per-step training losses `step_loss` of train.json, dropout
on): A = the mean loss over steps 0.8T+1..0.9T, B = the mean over 0.9T+1..T. The
noise of each mean is estimated from 20 block means per window (blocks of T/200
steps, so that neighbouring steps' correlation is averaged inside a block):
SE = sqrt(var(blocks A)/20 + var(blocks B)/20). The run has reached its plateau
when the decline A - B is at most 2 SE ("flat within noise over the last 20%").

Prints, per run, only relative figures (the decline and the 2 SE threshold as
fractions of B), not the loss levels, so that the check can be read without
comparing variants."""
import json
import os
import statistics
import sys


def check(d):
    with open(os.path.join(d, "train.json")) as f:
        run = json.load(f)
    loss = run["step_loss"]
    t = len(loss)
    if t < 200 or t % 200:
        return "%s: %d steps (need a multiple of 200)" % (d, t)
    w = t // 10
    blk = w // 20
    a = loss[t - 2 * w:t - w]
    b = loss[t - w:]
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    ba = [statistics.fmean(a[i:i + blk]) for i in range(0, w, blk)]
    bb = [statistics.fmean(b[i:i + blk]) for i in range(0, w, blk)]
    se = (statistics.variance(ba) / len(ba) + statistics.variance(bb) / len(bb)) ** 0.5
    decline = (ma - mb) / mb
    thr = 2 * se / mb
    return "%s: %d steps, decline over the last 10%% %+.1f%% of the final level, noise threshold (2 SE) %.1f%%: %s" % (
        d, t, 100 * decline, 100 * thr, "plateau" if ma - mb <= 2 * se else "NOT a plateau (still falling)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: plateau.py RUN_DIR...")
    for d in sys.argv[1:]:
        print(check(d))
