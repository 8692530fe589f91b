#!/usr/bin/env python3
"""The dependency direction of the source tree: experiments -> models -> attention ->
harness, never back up (DESIGN: "harness includes nothing above it"); inside
experiments/, cli -> tasks -> driver (the driver knows tasks only through
experiments/driver/task.h; the list of tasks is made in experiments/cli/task_list.c).

    python3 tests/layout/check_layout.py SOURCE_ROOT

Every `#include "..."` in a C, C++ or CUDA file under harness/, attention/, models/ and
experiments/ is resolved (beside the including file, then in the include folders the
build uses) and the folder of the file it names must be at or below the including
folder's level. Code under experiments/ lives in cli/, tasks/ or driver/ only (the
other folders there hold an experiment's configs, scripts and results). The one exception: harness/cuda_compat.h includes the CUDA emulator's
header (tests/cuda_emu/cuda_emu.h) in the emulated build only. An include that resolves
nowhere is an error too (it would hide a dependency). Prints one line per violation and
exits 1 if there is any; 0 otherwise."""
import os
import re
import sys

LEVEL = {"harness": 0, "attention": 1, "models": 2, "experiments/driver": 3, "experiments/tasks": 4,
         "experiments/cli": 5}
TOPS = ("harness", "attention", "models", "experiments")
ALLOWED = {("harness/cuda_compat.h", "tests/cuda_emu/cuda_emu.h")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
EXTS = (".c", ".h", ".cu", ".cuh", ".cpp")


def include_dirs(root):
    dirs = ["harness", "attention", "models", "tests/cuda_emu"]
    for d, _, _ in os.walk(os.path.join(root, "experiments")):
        dirs.append(os.path.relpath(d, root))
    return dirs


def level_of(rel):
    """The level's folder of a path: harness, ..., or experiments/driver, tasks, cli;
    None for anything else (tests/, or code in another folder of experiments/)."""
    parts = rel.split("/")
    if parts[0] == "experiments":
        key = "/".join(parts[:2])
        return key if key in LEVEL and len(parts) > 2 else None
    return parts[0] if parts[0] in LEVEL else None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    dirs = include_dirs(root)
    bad = []
    checked = 0
    for folder in TOPS:
        for d, _, files in os.walk(os.path.join(root, folder)):
            for f in sorted(files):
                if not f.endswith(EXTS):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)
                here = level_of(rel)
                if here is None:
                    bad.append(f"{rel}: code outside experiments/cli, experiments/tasks and experiments/driver")
                    continue
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                for name in INCLUDE.findall(text):
                    checked += 1
                    cands = [os.path.normpath(os.path.join(d, name))] + [os.path.join(root, x, name) for x in dirs]
                    hit = next((c for c in cands if os.path.isfile(c)), None)
                    if hit is None:
                        bad.append(f"{rel}: #include \"{name}\" resolves to no file of the tree")
                        continue
                    target = os.path.relpath(hit, root)
                    if (rel, target) in ALLOWED:
                        continue
                    t = level_of(target)
                    if t is None or LEVEL[t] > LEVEL[here]:
                        bad.append(f"{rel}: includes {target} ({t or target}/ is above {here}/)")
    for b in bad:
        print("layout: " + b)
    print(f"layout: {checked} includes checked, {len(bad)} against the direction "
          "experiments (cli -> tasks -> driver) -> models -> attention -> harness")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
