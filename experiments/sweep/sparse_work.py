#!/usr/bin/env python3
"""How sparse's (and local's) time grows against its work, from a bench run document.

    python3 experiments/sweep/sparse_work.py RUN.json

For every point of a `sparse` or `local` variant: the number of (query, key) pairs one
sequence scores, counted exactly from the mask (sparse: i - j < window or (i - j) a
multiple of stride, causal j <= i; non-causal |i - j|; auto window and stride are
round(sqrt(N)), as attention/sparse_geo.h resolves them; local: i - j < window), the
mean keys per query, the forward+backward time per sample and the time per pair in ns
(all heads). Then, per variant, the fitted exponents (log-log least squares over the
points that ran) of the pairs and of the time: the difference says how much of the
growth the mask's work explains and how much the cost per pair changes with N.
Standard library only; exit status 2 with one line for a file that is not a bench run.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table import die, load  # noqa: E402  (experiments/sweep/table.py: one-line refusals)


def auto(n):
    r = int(math.floor(math.sqrt(n) + 0.5))  # llround of a non-negative value
    return max(r, 1)


def option(opts, name, n):
    v = opts.get(name, "auto")
    if v == "auto":
        return auto(n)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 1:
        die(f"option {name}={v!r} is not a positive integer or auto")
    return int(v)


def side_count(n_d, w, s):
    """Distances d = 0..n_d-1 (n_d >= 0) allowed: d < w or d a multiple of s."""
    if n_d <= 0:
        return 0
    inside = min(n_d, w)
    if n_d <= w:
        return inside
    # multiples of s in [w, n_d - 1]
    first = -(-w // s) * s
    return inside + (0 if first > n_d - 1 else (n_d - 1 - first) // s + 1)


def pairs(n, causal, w, s):
    """(query, key) pairs of one sequence of n positions; s = None for local."""
    if s is None:
        s = n + w + 1  # no distance of a sequence is a multiple: local only
    total = 0
    for i in range(n):
        total += side_count(i + 1, w, s)  # d = i - j in [0, i]
        if not causal:
            total += side_count(n - i, w, s) - 1  # d = j - i in [0, n-1-i], d = 0 once
    return total


def fit(points):
    """Slope of log y on log x."""
    if len(points) < 2:
        return None
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else None


def main(argv):
    if len(argv) != 2:
        die("usage: sparse_work.py RUN.json")
    doc = load(argv[1])
    rows, order = {}, []
    for r in doc["records"]:
        if not isinstance(r, dict) or r.get("kind") != "parallel" or r.get("variant_name") not in ("sparse", "local"):
            continue
        label = r.get("variant", r["variant_name"])
        n, causal, opts = r.get("len"), r.get("causal"), r.get("options") or {}
        if not isinstance(n, int) or n < 1 or not isinstance(causal, bool):
            die(f"record of {label} lacks its length or causal flag")
        w = option(opts, "window", n)
        s = option(opts, "stride", n) if r["variant_name"] == "sparse" else None
        p = pairs(n, causal, w, s)
        t = r.get("per_sample_fwd_bwd_ms") if r.get("status") == "ok" else None
        if label not in rows:
            rows[label] = []
            order.append(label)
        rows[label].append((n, w, s, p, t, r.get("status", "?")))
    if not rows:
        die(f"{argv[1]} holds no bench points of sparse or local")
    print("| variant | N | window | stride | keys per query (mean) | fwd+bwd ms per sample | ns per pair |")
    print("|---|---|---|---|---|---|---|")
    for label in order:
        for n, w, s, p, t, status in rows[label]:
            ms = f"{t:.4g}" if t is not None else status
            ns = f"{t * 1e6 / p:.1f}" if t is not None else "-"
            print(f"| {label} | {n} | {w} | {s if s is not None else '-'} | {p / n:.1f} | {ms} | {ns} |")
    print()
    print("| variant | exponent of pairs | exponent of time | over N |")
    print("|---|---|---|---|")
    for label in order:
        ran = [(n, p, t) for n, _, _, p, t, _ in rows[label] if t is not None]
        ep, et = fit([(n, p) for n, p, _ in ran]), fit([(n, t) for n, _, t in ran])
        span = f"{ran[0][0]}..{ran[-1][0]}" if ran else "-"
        f = lambda e: f"{e:.2f}" if e is not None else "-"  # noqa: E731
        print(f"| {label} | {f(ep)} | {f(et)} | {span} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
