#!/usr/bin/env python3
"""The curves of speech runs: validation PER and CTC loss against the epoch, drawn by
plots/speech.gp (gnuplot) from `attnbench train` run documents; with --pareto, PER
against CPU time instead, drawn by plots/pareto.gp.

    python3 experiments/speech/curves.py RUN.json... --out PREFIX [--title TEXT] [--pareto]

Writes PREFIX.tsv (columns run, kind, epoch, loss, per: a "train" row per log record,
its mean training loss over the log interval; an "eval" row per evaluation after step
0, the validation loss and PER) and PREFIX.png and PREFIX.svg. With --pareto the
columns are run, kind ("valid" per evaluation after step 0, "test" per test record),
cpu_h, value (PER in percent): cpu_h is the record's cpu_s, the process's CPU time up
to it (training and the evaluations before it), in hours; a run whose records lack
cpu_s is refused. A run is named by its
config's label (blanks become '_'). The epoch of step t is t x batch / training rows.
Standard library and gnuplot; exit status 2 with one line for bad input.
"""
import json
import os
import subprocess
import sys

GP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plots", "speech.gp")
PARETO_GP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plots", "pareto.gp")


def die(msg):
    print(f"curves.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load_speech(path):
    """The document and the run's name (its config's label, blanks become '_')."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"cannot read {path}: {e}")
    cfg = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("schema") != "attnbench/run/1" or not isinstance(cfg, dict) or cfg.get("task", {}).get("name") != "speech":
        die(f"{path} is not a run document of the speech task")
    return doc, "".join("_" if c in " \t\n\"'" else c for c in (cfg.get("label") or cfg["name"]))


def rows_of(path):
    doc, name = load_speech(path)
    cfg = doc["config"]
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


def pareto_rows_of(path):
    doc, name = load_speech(path)
    out = []
    for r in doc.get("records", []):
        k = {"eval": "valid", "test": "test"}.get(r.get("kind"))
        if k is None or (k == "valid" and r.get("step", 0) == 0):
            continue
        cpu, per = r.get("cpu_s"), r.get(f"{r['kind']}_per")
        if not isinstance(cpu, (int, float)):
            die(f"{path}: its {r['kind']} record at step {r.get('step')} has no cpu_s (a run of an older attnbench)")
        out.append((name, k, f"{cpu / 3600:.6f}", "NaN" if not isinstance(per, (int, float)) else f"{100 * per:.6g}"))
    return out


def main(argv):
    title, prefix, runs, pareto = None, None, [], False
    i = 0
    while i < len(argv):
        if argv[i] == "--pareto":
            pareto = True
            i += 1
        elif argv[i] in ("--out", "--title"):
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
        die("usage: curves.py RUN.json... --out PREFIX [--title TEXT] [--pareto]")
    if pareto:
        header, rows = "run\tkind\tcpu_h\tvalue", [row for p in runs for row in pareto_rows_of(p)]
        title = title or "Phone recognition with CTC (festvox-ru, CPU scale): PER against CPU time"
        gp = [PARETO_GP, "", "", title, "phone error rate (%)",
              "CPU hours at 1 thread (the process's, evaluations included)", "0"]
    else:
        header, rows = "run\tkind\tepoch\tloss\tper", [row for p in runs for row in rows_of(p)]
        title = title or "Phone recognition with CTC (festvox-ru, CPU scale)"
        gp = [GP, "", "", title]
    with open(prefix + ".tsv", "w") as f:
        f.write(header + "\n")
        for row in rows:
            f.write("\t".join(row) + "\n")
    for ext in ("png", "svg"):
        gp[1:3] = [prefix + ".tsv", f"{prefix}.{ext}"]
        try:
            r = subprocess.run(["gnuplot", "-c"] + gp, capture_output=True, text=True)
        except OSError as e:  # no gnuplot: the data is written, the figure is not
            print(f"curves.py: warning: gnuplot cannot run ({e.strerror}): {prefix}.tsv written, no figure",
                  file=sys.stderr)
            return
        if r.returncode != 0:
            die(f"gnuplot failed on {prefix}.{ext}: {r.stderr.strip()[:300]}")
    print(f"curves.py: {prefix}.tsv, {prefix}.png, {prefix}.svg")


if __name__ == "__main__":
    main(sys.argv[1:])
