#!/usr/bin/env python3
"""Copies the image runs' documents that RESULTS.md reports into experiments/images/runs/
(the tables are printed from there by table.py, and the results_tables test prints
them again):

    python3 experiments/images/collect.py [RESULTS]        (default RESULTS: results)

- RESULTS/mnist-cpu-VARIANT/train-{epochs,time}.json -> runs/mnist-cpu-VARIANT-{epochs,time}.json
- RESULTS/mnist-cpu-VARIANT-seedS/train-epochs.json  -> runs/mnist-cpu-VARIANT-seedS-epochs.json
- RESULTS/cifar10-cpu-VARIANT/train.json             -> runs/cifar10-cpu-VARIANT.json
- RESULTS/images-speed/POINT/sample.json             -> runs/speed/POINT/sample.json
- RESULTS/images-traffic/POINT/sample.json           -> runs/traffic-emu/POINT/sample.json
- RESULTS/*-samples*/sample.json                     -> runs/samples/NAME/sample.json

Training documents lose their per-step losses (`step_loss`: tens of thousands of numbers;
the records every log_every steps keep the training curve); everything else is copied
as it is. Missing inputs are skipped with a line on stderr. Standard library only.
"""
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def write(doc, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = dest + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, dest)
    print(f"collect: {os.path.relpath(dest, HERE)}")


def copy_train(src, dest):
    if not os.path.exists(src):
        print(f"collect: {src} missing, skipped", file=sys.stderr)
        return
    with open(src, encoding="utf-8") as f:
        doc = json.load(f)
    doc.pop("step_loss", None)
    write(doc, dest)


def main(argv):
    res = argv[0] if argv else "results"
    runs = os.path.join(HERE, "runs")
    for v in ("softmax", "linear", "lsh-1", "lsh-4"):
        for b in ("epochs", "time"):
            copy_train(os.path.join(res, f"mnist-cpu-{v}", f"train-{b}.json"), os.path.join(runs, f"mnist-cpu-{v}-{b}.json"))
        for p in sorted(glob.glob(os.path.join(res, f"mnist-cpu-{v}-seed*", "train-epochs.json"))):
            name = os.path.basename(os.path.dirname(p))
            copy_train(p, os.path.join(runs, f"{name}-epochs.json"))
    for v in ("softmax", "linear"):
        copy_train(os.path.join(res, f"cifar10-cpu-{v}", "train.json"), os.path.join(runs, f"cifar10-cpu-{v}.json"))
    for src, dest in (("images-speed", "speed"), ("images-traffic", "traffic-emu")):
        for p in sorted(glob.glob(os.path.join(res, src, "*", "sample.json"))):
            with open(p, encoding="utf-8") as f:
                write(json.load(f), os.path.join(runs, dest, os.path.basename(os.path.dirname(p)), "sample.json"))
    for p in sorted(glob.glob(os.path.join(res, "*-samples*", "sample.json"))):
        with open(p, encoding="utf-8") as f:
            write(json.load(f), os.path.join(runs, "samples", os.path.basename(os.path.dirname(p)), "sample.json"))


if __name__ == "__main__":
    main(sys.argv[1:])
