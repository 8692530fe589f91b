#!/usr/bin/env python3
"""The curves of speech runs: validation PER and CTC loss against the epoch, drawn by
plots/speech.gp (gnuplot) from `attnbench train` run documents.

    python3 experiments/speech/curves.py RUN.json... --out PREFIX [--title TEXT]

Writes PREFIX.tsv (columns run, kind, epoch, loss, per: a "train" row per log record,
its mean training loss over the log interval; an "eval" row per evaluation after step
0, the validation loss and PER) and PREFIX.png and PREFIX.svg. A run is named by its
config's label (blanks become '_'). The epoch of step t is t x batch / training rows.
Standard library and gnuplot; exit status 2 with one line for bad input.
"""
import json
import os
import subprocess
import sys

GP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plots", "speech.gp")


def die(msg):
    print(f"curves.py: {msg}", file=sys.stderr)
    sys.exit(2)


def rows_of(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"cannot read {path}: {e}")
    cfg = doc.get("config") if isinstance(doc, dict) else None
    if doc.get("schema") != "attnbench/run/1" or not isinstance(cfg, dict) or cfg.get("task", {}).get("name") != "speech":
        die(f"{path} is not a run document of the speech task")
    name = "".join("_" if c in " \t\n\"'" else c for c in (cfg.get("label") or cfg["name"]))
    per_epoch = cfg["batch"] / cfg["task"]["rows"]["train"]
    out = []
    for r in doc.get("records", []):
        k, step = r.get("kind"), r.get("step", 0)
        num = lambda v: "NaN" if not isinstance(v, (int, float)) else f"{v:.9g}"
        if k == "train":
            out.append((name, "train", f"{step * per_epoch:.6g}", num(r.get("loss")), "NaN"))
        elif k == "eval" and step > 0:
            out.append((name, "eval", f"{step * per_epoch:.6g}", num(r.get("eval_loss")), num(r.get("eval_per"))))
    return out


def main(argv):
    title, prefix, runs = "Phone recognition with CTC (festvox-ru, CPU scale)", None, []
    i = 0
    while i < len(argv):
        if argv[i] in ("--out", "--title"):
            if i + 1 >= len(argv):
                die(f"{argv[i]} needs a value")
            if argv[i] == "--out":
                prefix = argv[i + 1]
            else:
                title = argv[i + 1]
            i += 2
        else:
            runs.append(argv[i])
            i += 1
    if not runs or not prefix:
        die("usage: curves.py RUN.json... --out PREFIX [--title TEXT]")
    with open(prefix + ".tsv", "w") as f:
        f.write("run\tkind\tepoch\tloss\tper\n")
        for p in runs:
            for row in rows_of(p):
                f.write("\t".join(row) + "\n")
    for ext in ("png", "svg"):
        r = subprocess.run(["gnuplot", "-c", GP, prefix + ".tsv", f"{prefix}.{ext}", title],
                           capture_output=True, text=True)
        if r.returncode != 0:
            die(f"gnuplot failed on {prefix}.{ext}: {r.stderr.strip()[:300]}")
    print(f"curves.py: {prefix}.tsv, {prefix}.png, {prefix}.svg")


if __name__ == "__main__":
    main(sys.argv[1:])
