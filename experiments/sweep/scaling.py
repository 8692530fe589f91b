#!/usr/bin/env python3
"""The scaling table of data-parallel training (CLUSTER.md), from run documents of
`attnbench train` (scaling.sh writes them):

    python3 experiments/sweep/scaling.py RUN.json...

One row per run: ranks, threads per rank, step time (rank 0's time inside training
steps over the steps, waiting for the other ranks included), the part of it spent
communicating (the gradient sums and the per-step statistics, rank 0's), tokens
(positions) per second, the speed-up over the first run, and the mean loss of the
last 10 steps (the ranks train the same model: it agrees to float rounding).
Standard library only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import provenance  # noqa: E402  (experiments/provenance.py)


def row(path):
    doc = json.load(open(path, encoding="utf-8"))
    s = doc["summary"]
    steps = s["steps_done"]
    losses = doc["step_loss"][-10:]
    return {
        "ranks": s.get("ranks", 1),
        "threads": s["threads"],
        "step_ms": 1e3 * s["step_s"] / steps,
        "comm_ms": 1e3 * s.get("comm_s", 0.0) / steps,
        "tps": s["train_tokens_per_s"],
        "loss": sum(losses) / len(losses),
        "steps": steps,
        "machine": doc.get("machine", {}),
        "doc": doc,
    }


def main(paths):
    if not paths:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    rows = [row(p) for p in paths]
    m = rows[0]["machine"]
    print(f"{rows[0]['steps']} steps of the copy task (batch 64 x 16 positions), "
          f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, BLAS core {m.get('blas_core', '?')}")
    print()
    print("| ranks | threads per rank | step ms | communication ms (share) | tokens/s | speed-up | loss, last 10 steps |")
    print("|---|---|---|---|---|---|---|")
    base = rows[0]["tps"]
    for r in rows:
        share = r["comm_ms"] / r["step_ms"] if r["step_ms"] > 0 else 0.0
        print(f"| {provenance.mark(str(r['ranks']), [r['doc']])} | {r['threads']} | {r['step_ms']:.1f} | {r['comm_ms']:.1f} ({100 * share:.0f}%) "
              f"| {r['tps']:.0f} | {r['tps'] / base:.2f} | {r['loss']:.6f} |")
    for line in provenance.notes([r["doc"] for r in rows]):
        print()
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
