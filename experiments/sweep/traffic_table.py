#!/usr/bin/env python3
"""The memory traffic table (markdown) of an `attnbench bench --device cuda` run on the
instrumented CPU emulator (build/attnbench-emu; experiments/sweep/TRAFFIC.md).

    python3 experiments/sweep/traffic_table.py RUN.json
    python3 experiments/sweep/traffic_table.py --compact RUN.json OUT.json
    python3 experiments/sweep/traffic_table.py --compare BEFORE.json AFTER.json

Prints the run's command, the shape, and one row per point that counted its traffic
(the records' "traffic": one forward+backward, or one step): launches, DRAM bytes read
and written (MiB), the op's minimal bytes (its inputs read and outputs written once),
DRAM and requested bytes over the minimum, and the operation that moved the most DRAM
bytes with its share; then, per variant with several lengths, the fitted exponent of
DRAM bytes against N (1: linear, 2: quadratic).

--compare prints, for the points both runs counted, the launches and the ratios to the
minimal bytes side by side, and the growth exponents before and after.

--compact writes a copy of RUN.json for experiments/sweep/runs/: the same document
with one record per line, and machine.os cut to the system and architecture (as the
other committed runs, runs/README.md).

Standard library only; exit status 2 with one line for a file that is not such a run.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import provenance  # noqa: E402  (experiments/provenance.py)


def die(msg):
    print(f"traffic_table.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        die(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}")
    if not isinstance(doc, dict) or doc.get("schema") != "attnbench/run/1" or not isinstance(doc.get("records"), list):
        die(f"{path} is not an attnbench run document (schema attnbench/run/1)")
    return doc


def mib(x):
    return f"{x / 1048576:.3f}"


def point(r):
    if r.get("kind") == "recurrent":
        return f"step at {r['traffic'].get('position', r.get('context'))}"
    return f"fwd+bwd N={r['len']}"


def top_op(t):
    ops = t.get("by_name") or []
    total = t["dram_read_bytes"] + t["dram_write_bytes"]
    if not ops or total <= 0:
        return "-"
    best = max(ops, key=lambda e: e["dram_read_bytes"] + e["dram_write_bytes"])
    share = (best["dram_read_bytes"] + best["dram_write_bytes"]) / total
    return f"{best['name']} ({share:.0%})"


def slope(points):
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(b) for _, b in points]
    n = len(points)
    den = n * sum(x * x for x in xs) - sum(xs) ** 2
    return (n * sum(x * y for x, y in zip(xs, ys)) - sum(xs) * sum(ys)) / den


def table(doc):
    recs = [r for r in doc["records"] if isinstance(r, dict) and isinstance(r.get("traffic"), dict)]
    if not recs:
        die("the run holds no records with traffic (run `bench --device cuda` with build/attnbench-emu)")
    cfg = doc.get("config", {})
    gpu = (doc.get("machine") or {}).get("gpu") or {}
    print(f"Run: {doc.get('command', '?')}  ")
    print(f"Source: {provenance.source_line(doc)}  ")
    print(f"Device: {gpu.get('name', '?')}, traffic counted: {str(gpu.get('traffic_counted')).lower()}  ")
    rb = cfg.get("recurrent", {}).get("batch", 1)
    print(f"Shape: H={cfg.get('heads')}, D={cfg.get('qk_dim')}, M={cfg.get('v_dim')}, causal={str(cfg.get('causal')).lower()}, "
          f"batch {json.dumps(cfg.get('batch'))} (steps: batch {rb})")
    print()
    print("| variant | counted | launches | DRAM read MiB | DRAM written MiB | min MiB | DRAM / min | requested / min "
          "| most DRAM bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        t = r["traffic"]
        mn = t["min_read_bytes"] + t["min_write_bytes"]
        print(f"| {r['variant']} | {point(r)} | {t['launches']} | {mib(t['dram_read_bytes'])} | "
              f"{mib(t['dram_write_bytes'])} | {mib(mn)} | {t['dram_over_min']:.2f} | {t['requested_over_min']:.2f} | "
              f"{top_op(t)} |")
    print()
    growth = []
    for v in dict.fromkeys(r["variant"] for r in recs if r.get("kind") == "parallel"):
        pts = [(r["len"], r["traffic"]["dram_read_bytes"] + r["traffic"]["dram_write_bytes"])
               for r in recs if r.get("kind") == "parallel" and r["variant"] == v]
        if len(pts) >= 2:
            growth.append((v, slope(pts), min(p[0] for p in pts), max(p[0] for p in pts), len(pts)))
    if growth:
        print("growth of forward+backward DRAM bytes with N (fitted exponent, log-log least squares):")
        print()
        print("| variant | exponent | over N | points |")
        print("|---|---|---|---|")
        for v, x, lo, hi, n in growth:
            print(f"| {v} | {x:.2f} | {lo}..{hi} | {n} |")
        print()


def keyed(doc):
    """(variant, point) -> record, for the records that counted their traffic."""
    return {(r["variant"], point(r)): r for r in doc["records"]
            if isinstance(r, dict) and isinstance(r.get("traffic"), dict)}


def growth_of(doc, v):
    pts = [(r["len"], r["traffic"]["dram_read_bytes"] + r["traffic"]["dram_write_bytes"])
           for r in doc["records"] if isinstance(r, dict) and isinstance(r.get("traffic"), dict)
           and r.get("kind") == "parallel" and r["variant"] == v]
    return slope(pts) if len(pts) >= 2 else None


def compare(before, after):
    """Each point of both runs: launches and DRAM / min before and after, and the
    variants' growth exponents."""
    kb, ka = keyed(before), keyed(after)
    both = [k for k in kb if k in ka]
    if not both:
        die("the two runs share no point with traffic")
    print("| variant | counted | launches before | after | DRAM / min before | after | requested / min before | after |")
    print("|---|---|---|---|---|---|---|---|")
    for k in both:
        tb, ta = kb[k]["traffic"], ka[k]["traffic"]
        print(f"| {k[0]} | {k[1]} | {tb['launches']} | {ta['launches']} | {tb['dram_over_min']:.2f} | "
              f"{ta['dram_over_min']:.2f} | {tb['requested_over_min']:.2f} | {ta['requested_over_min']:.2f} |")
    print()
    rows = []
    for v in dict.fromkeys(k[0] for k in both):
        gb, ga = growth_of(before, v), growth_of(after, v)
        if gb is not None and ga is not None:
            rows.append((v, gb, ga))
    if rows:
        print("growth of forward+backward DRAM bytes with N (fitted exponent):")
        print()
        print("| variant | before | after |")
        print("|---|---|---|")
        for v, gb, ga in rows:
            print(f"| {v} | {gb:.2f} | {ga:.2f} |")
        print()


def compact(src, dst):
    doc = load(src)
    m = doc.get("machine")
    if isinstance(m, dict) and isinstance(m.get("os"), str):
        parts = m["os"].split()
        if len(parts) >= 2:
            m["os"] = f"{parts[0]} {parts[-1]}"
    records = doc.get("records", [])
    head = {k: v for k, v in doc.items() if k != "records"}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))},")
    lines.append('"records": [')
    lines.append(",\n".join(json.dumps(r, separators=(",", ":")) for r in records))
    lines.append("]}")
    with open(dst, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv):
    if len(argv) == 3 and argv[0] == "--compact":
        compact(argv[1], argv[2])
        return
    if len(argv) == 3 and argv[0] == "--compare":
        compare(load(argv[1]), load(argv[2]))
        return
    if len(argv) != 1 or argv[0].startswith("-"):
        die("usage: traffic_table.py RUN.json | traffic_table.py --compact RUN.json OUT.json | "
            "traffic_table.py --compare BEFORE.json AFTER.json")
    table(load(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
