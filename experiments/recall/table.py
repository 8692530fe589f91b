#!/usr/bin/env python3
"""Prints the associative-recall results (experiments/recall/RESULTS.md) from `attnbench
train` run documents, and with --plot PREFIX draws them with gnuplot
(plots/recall.gp), one line per variant, each figure on one slice of the points with
the rest at the headline setting (width 64, 64 positions, 8 pairs): PREFIX-state.png
(accuracy against the recurrent state's bytes: 64 positions, 8 pairs, every width),
PREFIX-length.png (against the sequence length: width 64, 8 pairs) and
PREFIX-pairs.png (against the pairs: width 64, 64 positions), each only when its
slice has more than one point for some variant.

    python3 experiments/recall/table.py experiments/recall/runs [--plot plots/recall]

Reads every train.json under the folders given (a run folder, or a folder of them, at
any depth). A row is one (variant, d_model, length, pairs) point; its accuracy is the
final evaluation's recall accuracy (the queried values only), as the mean over its
seeds with a 95% interval (Student's t; one seed: no interval). The state is the
summary's state_bytes: what one sequence's recurrent state holds over all layers at
the task's length; for softmax, which has no recurrent mode of its own, the key/value
cache its recurrent twin stateful-softmax holds for it (layers x N x 2 x d_model floats).
A run that did not finish
(status other than "ok") is left out and listed; a point resting on a run made from a
tree with changes not committed is marked (experiments/provenance.py). Standard library and gnuplot;
exit status 2 with one line for bad input."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import provenance  # noqa: E402  (experiments/provenance.py)
from seedstats import mean_ci  # noqa: E402  (experiments/seedstats.py)

HERE = os.path.dirname(os.path.abspath(__file__))
GP = os.path.join(HERE, "..", "..", "plots", "recall.gp")


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
                "state": state_of(cfg, task, s), "steps": s["steps_done"], "path": path, "doc": doc,
            })
    return runs, skipped


def points(runs):
    pts = {}
    for r in runs:
        k = (r["variant"], r["d_model"], r["length"], r["pairs"])
        p = pts.setdefault(k, {"accs": [], "seeds": [], "state": r["state"], "steps": set(), "docs": []})
        if r["seed"] in p["seeds"]:
            die(f"{r['path']}: seed {r['seed']} of {k} twice")
        p["accs"].append(r["acc"])
        p["seeds"].append(r["seed"])
        p["steps"].add(r["steps"])
        p["docs"].append(r["doc"])
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
        print(f"| {provenance.mark(k[0], p['docs'])} | {k[1]} | {k[2]} | {k[3]} | {len(p['accs'])} | {acc} "
              f"| {fmt_state(p['state'])} |")
    for line in provenance.notes([d for p in pts.values() for d in p["docs"]]):
        print()
        print(line)


# The figures, each on one slice of the points (the rest held at the headline
# setting: width 64, 64 positions, 8 pairs): x, the slice's test, and the x value.
FIGURES = (
    ("state", lambda k: k[2] == 64 and k[3] == 8, lambda k, p: p["state"]),  # both widths
    ("length", lambda k: k[1] == 64 and k[3] == 8, lambda k, p: k[2]),
    ("pairs", lambda k: k[1] == 64 and k[2] == 64, lambda k, p: k[3]),
)


def plot(pts, prefix):
    """Per figure whose slice has more than one x for some variant: a data file (one
    block per variant) and the gnuplot script's figure, PREFIX-WHAT.png."""
    tmp = tempfile.mkdtemp(prefix="recall-plot-")
    try:
        for what, keep, x_of in FIGURES:
            by_var = {}
            for k, p in pts.items():
                x = x_of(k, p)
                if keep(k) and x:
                    by_var.setdefault(k[0], []).append((x, mean_ci(p["accs"])[0]))
            if not any(len(v) > 1 for v in by_var.values()):
                continue
            tsv = os.path.join(tmp, what + ".tsv")
            with open(tsv, "w") as f:
                for v in sorted(by_var):
                    f.write(f'"{v}"\n')
                    for x, a in sorted(by_var[v]):
                        f.write(f"{x}\t{a}\n")
                    f.write("\n\n")
            r = subprocess.run(["gnuplot", "-c", GP, tsv, f"{prefix}-{what}.png", what, str(len(by_var))],
                               capture_output=True, text=True)
            if r.returncode != 0:
                die(f"gnuplot failed on {what}: {r.stderr.strip()[:300]}")
    finally:
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
