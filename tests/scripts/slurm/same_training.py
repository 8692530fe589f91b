#!/usr/bin/env python3
"""Whether the training array's runs in DIR_A and DIR_B are the same runs:

    same_training.py COUNT DIR_A DIR_B

Each DIR/array-I/train.json finished ("ok"), entry I's seed, and the per-step losses of
A's and B's run I equal (bit for bit: the same config and thread count). Exit 0 or 1.
"""
import json
import sys


def main(count, a, b):
    bad = []
    for i in range(int(count)):
        docs = []
        for d in (a, b):
            try:
                with open(f"{d}/array-{i}/train.json") as f:
                    docs.append(json.load(f))
            except (OSError, ValueError) as e:
                bad.append(f"{d}/array-{i}: {e}")
        if len(docs) < 2:
            continue
        for d, doc in zip((a, b), docs):
            if doc.get("status") != "ok":
                bad.append(f"{d}/array-{i}: status {doc.get('status')}")
        if docs[0]["config"] != docs[1]["config"]:
            bad.append(f"array-{i}: the configs differ")
        if docs[0]["step_loss"] != docs[1]["step_loss"]:
            bad.append(f"array-{i}: the losses differ")
        if docs[0]["config"].get("seed") != i + 1:
            bad.append(f"array-{i}: seed {docs[0]['config'].get('seed')}, not {i + 1}")
    for x in bad:
        print(f"same_training: {x}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
