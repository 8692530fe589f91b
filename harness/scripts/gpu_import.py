#!/usr/bin/env python3
"""Brings the run documents of a GPU check (harness/scripts/gpu-check.sh's archive,
extracted, or its WORK folder) into the repository's run folders, with the paths of the
GPU machine taken out of them:

    gpu_import.py GPU_CHECK_DIR CARD [--sweep DIR] [--images DIR]

GPU_CHECK_DIR: the folder holding results/ (and PACK_INFO). CARD: a short name of the
card for the folder names (e.g. h200). Writes
  SWEEP/CARD/NAME.json     each results/*.json bench document (default SWEEP:
                           experiments/sweep/runs)
  IMAGES/speed-gpu-CARD/POINT/sample.json   each results/POINT/sample.json (default
                           IMAGES: experiments/images/runs)
The documents' command lines and paths name the pack's folder on the GPU machine
(wherever it was extracted, e.g. /tmp/x/attnbench-gpu/build/attnbench): that folder is
read off the commands that start with an absolute path to build/attnbench (or
attnbench-emu), and every string is rewritten relative to it (build/attnbench), as a
checkout would run it.
An existing file is replaced only when it is a run document of the same kind (bench or
sample). Exit status 2 with one line on bad input. Standard library only.
"""
import glob
import json
import os
import re
import sys

PROG = "gpu_import"
EXE = re.compile(r"^(/\S*/)build/attnbench(?:-emu)?(?:\s|$)")


def die(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def strip_paths(x, roots):
    if isinstance(x, str):
        for r in roots:
            x = x.replace(r, "")
        return x
    if isinstance(x, list):
        return [strip_paths(v, roots) for v in x]
    if isinstance(x, dict):
        return {k: strip_paths(v, roots) for k, v in x.items()}
    return x


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        die(f"{path}: not a JSON document ({e})")


def kind(doc):
    if isinstance(doc, dict) and "records" in doc and "config" in doc:
        return "bench"
    if isinstance(doc, dict) and "images_per_s" in doc:
        return "sample"
    return None


def put(doc, dest, want, roots):
    if os.path.exists(dest):
        old = None
        try:
            with open(dest) as f:
                old = json.load(f)
        except (OSError, ValueError):
            pass
        if kind(old) != want:
            die(f"{dest} exists and is not a {want} run document: not replaced")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = dest + ".tmp"
    with open(tmp, "w") as f:
        json.dump(strip_paths(doc, roots), f, indent=1)
        f.write("\n")
    os.replace(tmp, dest)
    print(f"{PROG}: {dest}")


def main(argv):
    args, opts = [], {"--sweep": "experiments/sweep/runs", "--images": "experiments/images/runs"}
    i = 0
    while i < len(argv):
        if argv[i] in opts:
            if i + 1 >= len(argv):
                die(f"{argv[i]} needs a folder")
            opts[argv[i]] = argv[i + 1]
            i += 2
        elif argv[i].startswith("-"):
            die(f"unknown option '{argv[i]}'")
        else:
            args.append(argv[i])
            i += 1
    if len(args) != 2:
        die("usage: gpu_import.py GPU_CHECK_DIR CARD [--sweep DIR] [--images DIR]")
    src, card = args
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", card):
        die(f"card name '{card}': lower-case letters, digits and '-' only")
    res = os.path.join(src, "results")
    if not os.path.isdir(res):
        die(f"{src} has no results/ folder (not a gpu-check folder)")
    todo = []
    for p in sorted(glob.glob(os.path.join(res, "*.json"))):
        doc = load(p)
        if kind(doc) != "bench":
            die(f"{p}: not a bench run document")
        todo.append((doc, os.path.join(opts["--sweep"], card, os.path.basename(p)), "bench"))
    for p in sorted(glob.glob(os.path.join(res, "*", "sample.json"))):
        doc = load(p)
        if kind(doc) != "sample":
            die(f"{p}: not a sample run document")
        todo.append((doc, os.path.join(opts["--images"], f"speed-gpu-{card}", os.path.basename(os.path.dirname(p)),
                                        "sample.json"), "sample"))
    if not todo:
        die(f"no run documents under {res}")
    roots = sorted({m.group(1) for doc, _, _ in todo
                    for m in [EXE.match(str(doc.get("command", "")))] if m}, key=len, reverse=True)
    for doc, dest, want in todo:
        put(doc, dest, want, roots)


if __name__ == "__main__":
    main(sys.argv[1:])
