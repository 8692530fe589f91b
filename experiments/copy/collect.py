#!/usr/bin/env python3
"""Copies copy-task run folders into experiments/copy/runs/, where RESULTS.md's tables
are printed from (table.py, seeds.py; the results_tables test prints them again):

    python3 experiments/copy/collect.py [--from RESULTS] [--to RUNS] NAME...

RESULTS (default results) holds NAME/train.json and, when present, NAME/generate.json,
as run-cpu.sh, run-seeds.sh and run-longer.sh write them. Each goes to RUNS/NAME/
(default RUNS: experiments/copy/runs) with
its train.json made compact: the training records (one per log interval) keep only
kind, step and loss (what `attnbench plot` draws); the per-step losses (step_loss,
what table.py, seeds.py and plateau.py measure), the evaluation and test records, the
config, summary, machine and git sections are kept as they are. generate.json is copied
as it is. Refuses (exit status 2, one line, nothing written) a NAME with no train.json
or a train.json that is not a copy-task run document. Standard library only.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def die(msg):
    print(f"collect.py: {msg}", file=sys.stderr)
    sys.exit(2)


def compact(doc):
    out = dict(doc)
    recs = []
    for r in doc.get("records", []):
        if r.get("kind") == "train":
            recs.append({k: r[k] for k in ("kind", "step", "loss") if k in r})
        else:
            recs.append(r)
    out["records"] = recs
    return out


def write(doc, dest):
    tmp = dest + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, dest)


def main(argv):
    src, to, names = "results", os.path.join(HERE, "runs"), []
    i = 0
    while i < len(argv):
        if argv[i] in ("--from", "--to"):
            if i + 1 >= len(argv):
                die(f"{argv[i]} needs a folder")
            if argv[i] == "--from":
                src = argv[i + 1]
            else:
                to = argv[i + 1]
            i += 2
        else:
            names.append(argv[i])
            i += 1
    if not names:
        die("usage: collect.py [--from RESULTS] [--to RUNS] NAME...")
    loaded = []
    for n in names:
        if not n or "/" in n or n.startswith("."):
            die(f"'{n}': a run folder's name, not a path")
        p = os.path.join(src, n, "train.json")
        try:
            with open(p, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            die(f"cannot read {p}: {e}")
        if not isinstance(doc, dict) or doc.get("schema") != "attnbench/run/1" or \
                doc.get("config", {}).get("task", {}).get("name") != "copy" or "step_loss" not in doc:
            die(f"{p} is not a copy-task run document with its per-step losses")
        g = os.path.join(src, n, "generate.json")
        gen = None
        if os.path.exists(g):
            try:
                with open(g, encoding="utf-8") as f:
                    gen = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                die(f"cannot read {g}: {e}")
        loaded.append((n, doc, gen))
    for n, doc, gen in loaded:
        dest = os.path.join(to, n)
        os.makedirs(dest, exist_ok=True)
        write(compact(doc), os.path.join(dest, "train.json"))
        if gen is not None:
            write(gen, os.path.join(dest, "generate.json"))
        print(f"collect: {dest}")


if __name__ == "__main__":
    main(sys.argv[1:])
