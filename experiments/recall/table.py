#!/usr/bin/env python3
"""Prints the associative-recall results (experiments/recall/RESULTS.md) from `attnbench
train` run documents, and with --plot PREFIX draws them with gnuplot
(plots/recall.gp): PREFIX-state.png (accuracy against the recurrent state's bytes)
and, when the runs cover more than one length, PREFIX-length.png (accuracy against the
sequence length), one line per variant.

    python3 experiments/recall/table.py experiments/recall/runs [--plot plots/recall]

Reads every train.json under the folders given (a run folder, or a folder of them, at
any depth). A row is one (variant, d_model, length, pairs) point; its accuracy is the
final evaluation's recall accuracy (the queried values only), as the mean over its
seeds with a 95% interval (Student's t; one seed: no interval). The state is the
summary's state_bytes: what one sequence's recurrent state holds over all layers at
the task's length; for softmax, which has no recurrent mode of its own, the key/value
cache its recurrent twin stateful-softmax holds for it (layers x N x 2 x d_model floats).
A run that did not finish
(status other than "ok") is left out and listed. Standard library and gnuplot;
exit status 2 with one line for bad input."""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GP = os.path.join(HERE, "..", "..", "plots", "recall.gp")

# two-sided 95% Student t quantiles by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def die(msg):
    print(f"table.py: {msg}", file=sys.stderr)
    sys.exit(2)


def label_of(cfg):
    """The variant as the runs name it: its registry name and any settings."""
    att = cfg["model"]["attention"]
    name = att["variant"]
    sets = att.get("set") or {}
    if sets:
        name += "(" + ",".join(f"{k}={v}" for k, v in sorted(sets.items())) + ")"
    return name


def state_of(cfg, task, summary):
    """The run's recurrent state in bytes (see the docstring); None where there is none."""
    if summary.get("state_bytes") is not None:
        return summary["state_bytes"]
    m = cfg["model"]
    if m["attention"]["variant"] == "softmax":
        return 4 * m["layers"] * task["length"] * 2 * m["d_model"]
    return None


def load_runs(roots):
    runs, skipped = [], []
    for root in roots:
        if not os.path.exists(root):
            die(f"{root}: no such file or folder")
        for d, _, files in os.walk(root):
            if "train.json" not in files:
                continue
            path = os.path.join(d, "train.json")
            try:
                with open(path) as f:
                    doc = json.load(f)
                cfg, s = doc["config"], doc["summary"]
                task = cfg["task"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                die(f"{path}: not a train run document ({e})")
            if task.get("name") != "recall":
                continue
            if doc.get("status") != "ok":
                skipped.append((path, doc.get("status")))
                continue
            runs.append({
                "variant": label_of(cfg), "d_model": cfg["model"]["d_model"], "length": task["length"],
                "pairs": task["pairs"], "seed": cfg["seed"], "acc": s["final_eval_accuracy"],
                "state": state_of(cfg, task, s), "steps": s["steps_done"], "path": path,
            })
    return runs, skipped


def mean_ci(xs):
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return m, T95.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))


def points(runs):
    pts = {}
    for r in runs:
        k = (r["variant"], r["d_model"], r["length"], r["pairs"])
        p = pts.setdefault(k, {"accs": [], "seeds": [], "state": r["state"], "steps": set()})
        if r["seed"] in p["seeds"]:
            die(f"{r['path']}: seed {r['seed']} of {k} twice")
        p["accs"].append(r["acc"])
        p["seeds"].append(r["seed"])
        p["steps"].add(r["steps"])
    return pts


def fmt_state(b):
    return "n/a" if b is None else f"{b / 1024:.1f} KiB"


def print_table(pts):
    print("| variant | d_model | length | pairs | seeds | recall accuracy | state (1 sequence) |")
    print("|---|---|---|---|---|---|---|")
    for k in sorted(pts, key=lambda k: (k[1], k[2], k[3], k[0])):
        p = pts[k]
        m, ci = mean_ci(p["accs"])
        acc = f"{m:.3f}" + ("" if ci is None else f" ± {ci:.3f}")
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {len(p['accs'])} | {acc} | {fmt_state(p['state'])} |")


def plot(pts, prefix):
    """Two data files (one block per variant) and the gnuplot script's two figures."""
    by_var = {}
    for k, p in pts.items():
        by_var.setdefault(k[0], []).append((k, p))
    tmp = tempfile.mkdtemp(prefix="recall-plot-")
    state_tsv, length_tsv = os.path.join(tmp, "state.tsv"), os.path.join(tmp, "length.tsv")
    with open(state_tsv, "w") as fs, open(length_tsv, "w") as fl:
        for v in sorted(by_var):
            rows = sorted(by_var[v], key=lambda kp: (kp[0][2], kp[0][1]))
            fs.write(f'"{v}"\n')
            for k, p in sorted(rows, key=lambda kp: kp[1]["state"] or 0):
                if p["state"]:
                    fs.write(f"{p['state']}\t{mean_ci(p['accs'])[0]}\n")
            fs.write("\n\n")
            fl.write(f'"{v}"\n')
            for k, p in rows:
                fl.write(f"{k[2]}\t{mean_ci(p['accs'])[0]}\n")
            fl.write("\n\n")
    figures = [(state_tsv, "state")]
    if len({k[2] for k in pts}) > 1:  # the length figure needs more than one length
        figures.append((length_tsv, "length"))
    for tsv, what in figures:
        r = subprocess.run(["gnuplot", "-c", GP, tsv, f"{prefix}-{what}.png", what, str(len(by_var))],
                           capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            die(f"gnuplot failed on {what}: {r.stderr.strip()[:300]}")
    shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    args, prefix = [], None
    i = 0
    while i < len(argv):
        if argv[i] == "--plot":
            if i + 1 >= len(argv):
                die("--plot needs a PREFIX")
            prefix = argv[i + 1]
            i += 2
        else:
            args.append(argv[i])
            i += 1
    if not args:
        die("usage: table.py RUNS... [--plot PREFIX]")
    runs, skipped = load_runs(args)
    if not runs:
        die("no finished recall runs under " + " ".join(args))
    pts = points(runs)
    print_table(pts)
    steps = sorted({s for p in pts.values() for s in p["steps"]})
    print(f"\nsteps per run: {', '.join(map(str, steps))}")
    for path, status in skipped:
        print(f"left out (status {status}): {path}")
    if prefix:
        plot(pts, prefix)


if __name__ == "__main__":
    main(sys.argv[1:])
