#!/usr/bin/env python3
"""Table 3 (speech recognition with CTC) at CPU scale, from `attnbench train` run
documents, beside the paper's numbers.

    python3 experiments/speech/table.py [--loss] RUN.json... [--decoded DECODE.json...]
    python3 experiments/speech/table.py --seeds RUN.json...

RUN.json: a training run's train.json (the speech task). One row per run, in the order
given, labelled with its config's label: the phone error rate on the validation split
at the end of the run and the best of its evaluations (with the epoch it was reached
at), the test split's at the end, the CPU time per epoch (CPU seconds inside the
training steps over the epochs run: evaluation left out; at one thread, about the wall
time on an idle core) and the wall time per epoch, the epochs run, the parameters, and
the paper's validation PER and time per epoch for the same model (WSJ, a GPU). Then
the ratio of linear's CPU time per epoch to softmax's (and the paper's 824 / 2711).

--loss adds a column: the validation loss (CTC, nats per utterance) at its lowest,
with the epoch, and at the end; how far the end is above the lowest says how far the
run overfits.

--decoded DECODE.json...: `attnbench decode` documents of those runs on the same rows;
prints, for each row, its reference and each run's best path with its errors.

--seeds RUN.json...: runs of one model that differ only in their seed (their configs
equal but for seed, name, label and description) make one row, labelled with the
lowest seed's label, in the order of each model's first run: the seeds, the mean over
them of the validation PER at the end, of the best validation PER and of the test PER,
each with its 95% interval (Student's t over the seeds, experiments/seedstats.py; none
for one seed), and the mean CPU time per epoch. Two runs of one model with the same
seed are refused.

Standard library only; exit status 2 with one line for a file that is not what it
should be.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import provenance  # noqa: E402  (experiments/provenance.py)
from seedstats import fmt_mean_ci  # noqa: E402  (experiments/seedstats.py)

# The paper's Table 3 (WSJ, validation PER %, seconds per epoch on a GPU), by label.
PAPER = {"Bi-LSTM": (10.94, 1047), "softmax": (5.12, 2711), "lsh-4": (9.33, 2250), "linear": (8.08, 824)}


def die(msg):
    print(f"table.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path, schema):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        die(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}")
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        die(f"{path} is not an attnbench document of schema {schema}")
    return doc


def label(doc):
    cfg = doc.get("config", {})
    return cfg.get("label") or cfg.get("name", "?")


def run_row(path):
    doc = load(path, "attnbench/run/1")
    cfg = doc.get("config", {})
    if cfg.get("task", {}).get("name") != "speech":
        die(f"{path} is not a run of the speech task")
    s = doc.get("summary") or {}
    need = ("final_eval_per", "test_per", "step_cpu_s", "step_s", "epochs_done", "params")
    missing = [k for k in need if not isinstance(s.get(k), (int, float))]
    if doc.get("status") != "ok" or missing:
        die(f"{path}: not a complete run (status {doc.get('status')}; summary lacks {', '.join(missing) or '-'})")
    rows = cfg["task"]["rows"]["train"]
    batch = cfg["batch"]
    best, best_epoch = None, None
    low, low_epoch, last = None, None, None
    for r in doc["records"]:
        if r.get("kind") == "eval" and r.get("step", 0) > 0 and isinstance(r.get("eval_per"), (int, float)):
            if best is None or r["eval_per"] < best:
                best, best_epoch = r["eval_per"], r["step"] * batch / rows
        if r.get("kind") == "eval" and r.get("step", 0) > 0 and isinstance(r.get("eval_loss"), (int, float)):
            last = r["eval_loss"]
            if low is None or last < low:
                low, low_epoch = last, r["step"] * batch / rows
    ep = s["epochs_done"]
    return {
        "label": label(doc), "valid": s["final_eval_per"], "best": best, "best_epoch": best_epoch,
        "test": s["test_per"], "loss_low": low, "loss_low_epoch": low_epoch, "loss_end": last,
        "cpu_epoch": s["step_cpu_s"] / ep, "wall_epoch": s["step_s"] / ep, "epochs": ep,
        "params": s["params"], "threads": s.get("threads"), "doc": doc,
    }


def pct(x):
    return "-" if x is None else f"{100 * x:.2f}"


def machine_line(doc):
    m = doc.get("machine", {})
    return (f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores; OpenBLAS core {m.get('blas_core', '?')}; "
            f"{m.get('compiler', '?')}")


def lossc(r):
    if r["loss_low"] is None:
        return "- | "
    return f"{r['loss_low']:.1f} ({r['loss_low_epoch']:.0f}) / {r['loss_end']:.1f} | "


def table(paths, loss=False):
    rows = [run_row(p) for p in paths]
    machines = sorted({machine_line(r["doc"]) for r in rows})
    threads = sorted({str(r["threads"]) for r in rows})
    print(f"Machine: {'; '.join(machines)}; {', '.join(threads)} thread(s) per run  ")
    print("Data: festvox-ru (one speaker, Russian), 491 / 66 / 63 utterances (1.30 / 0.19 / 0.17 h); "
          "the paper's: WSJ (80 h)")
    print()
    print("| model | valid PER % (end) | valid PER % (best, epoch) | test PER % | CPU s / epoch | wall s / epoch "
          "| epochs | parameters |" + (" valid loss: lowest (epoch) / end |" if loss else "")
          + " paper: valid PER % | paper: s / epoch (GPU) |")
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if loss else ""))
    for r in rows:
        p = PAPER.get(r["label"])
        best = "-" if r["best"] is None else f"{pct(r['best'])} ({r['best_epoch']:.0f})"
        print(f"| {provenance.mark(r['label'], [r['doc']])} | {pct(r['valid'])} | {best} | {pct(r['test'])} | {r['cpu_epoch']:.1f} | "
              f"{r['wall_epoch']:.1f} | {r['epochs']:.0f} | {r['params']:,} | " + (lossc(r) if loss else "") +
              f"{'-' if p is None else p[0]} | {'-' if p is None else p[1]} |")
    for line in provenance.notes([r["doc"] for r in rows]):
        print()
        print(line)
    by = {r["label"]: r for r in rows}
    if "linear" in by and "softmax" in by:
        ratio = by["linear"]["cpu_epoch"] / by["softmax"]["cpu_epoch"]
        print()
        print(f"linear / softmax, CPU time per epoch: {ratio:.2f} (the paper's, GPU: 824 / 2711 = {824 / 2711:.2f})")


def model_key(cfg):
    """The config less what tells seeds apart, as a comparable string."""
    return json.dumps({k: v for k, v in cfg.items() if k not in ("seed", "name", "label", "description")},
                      sort_keys=True)


def seeds_table(paths):
    groups = {}  # model -> {seed: (path, row)}
    for p in paths:
        r = run_row(p)
        seed = r["doc"]["config"].get("seed")
        g = groups.setdefault(model_key(r["doc"]["config"]), {})
        if seed in g:
            die(f"{p}: seed {seed} of its model twice (also {g[seed][0]})")
        g[seed] = (p, r)
    groups = {k: [r for _, r in g.values()] for k, g in groups.items()}
    rows = [r for g in groups.values() for r in g]
    machines = sorted({machine_line(r["doc"]) for r in rows})
    threads = sorted({str(r["threads"]) for r in rows})
    print(f"Machine: {'; '.join(machines)}; {', '.join(threads)} thread(s) per run  ")
    print("Mean over the seeds [95% interval, Student's t over the seeds; none for one seed]")
    print()
    print("| model | seeds | valid PER % (end) | valid PER % (best) | test PER % | CPU s / epoch | paper: valid PER % |")
    print("|---|---|---|---|---|---|---|")
    for g in groups.values():
        g.sort(key=lambda r: r["doc"]["config"].get("seed", 0))
        lab = g[0]["label"]
        p = PAPER.get(lab)
        best = "-" if any(r["best"] is None for r in g) else fmt_mean_ci([r["best"] for r in g], 100)
        cpu = sum(r["cpu_epoch"] for r in g) / len(g)
        print(f"| {provenance.mark(lab, [r['doc'] for r in g])} | {', '.join(str(r['doc']['config'].get('seed')) for r in g)} "
              f"| {fmt_mean_ci([r['valid'] for r in g], 100)} | {best} | {fmt_mean_ci([r['test'] for r in g], 100)} "
              f"| {cpu:.1f} | {'-' if p is None else p[0]} |")
    for line in provenance.notes([r["doc"] for r in rows]):
        print()
        print(line)


def decoded(paths):
    docs = [load(p, "attnbench/decode/1") for p in paths]
    split, ids = docs[0].get("split"), [u.get("id") for u in docs[0].get("utterances", [])]
    for p, d in zip(paths, docs):
        if d.get("split") != split or [u.get("id") for u in d.get("utterances", [])] != ids:
            die(f"{p}: other rows than {paths[0]}'s (decode every run on the same split and --n)")
    for i, uid in enumerate(ids):
        ref = docs[0]["utterances"][i]["ref"]
        print()
        print(f"{uid} ({split}), {docs[0]['utterances'][i]['ref_len']} phones:")
        print()
        print("| | phones | errors |")
        print("|---|---|---|")
        print(f"| reference | {ref} | |")
        for d in docs:
            u = d["utterances"][i]
            print(f"| {provenance.mark(d.get('label', d.get('run')), [d])} | {u['hyp'] or '(nothing)'} | {u['errors']} |")
    for line in provenance.notes(docs):
        print()
        print(line)


def main(argv):
    if argv[:1] == ["--seeds"]:
        if len(argv) < 2:
            die("usage: table.py --seeds RUN.json...")
        seeds_table(argv[1:])
        return
    if "--decoded" in argv:
        k = argv.index("--decoded")
        runs, decs = argv[:k], argv[k + 1:]
        if not decs:
            die("usage: table.py [--loss] RUN.json... [--decoded DECODE.json...]")
    else:
        runs, decs = argv, []
    loss = "--loss" in runs
    runs = [a for a in runs if a != "--loss"]
    if not runs and not decs:
        die("usage: table.py [--loss] RUN.json... [--decoded DECODE.json...]")
    if runs:
        table(runs, loss)
    if decs:
        decoded(decs)


if __name__ == "__main__":
    main(sys.argv[1:])
