#!/usr/bin/env python3
"""The Figure 1 tables (markdown) from an `attnbench bench` run document.

    python3 experiments/sweep/table.py results/figure1-cpu.json [--fwd]

Prints: the machine line (CPU or GPU, threads, BLAS core type and threading, the
measured GEMM rate); the time per sample of forward+backward (--fwd: forward only) in
ms, median over the repeats, one row per variant label and one column per length (a point
that did not run shows its status: oom, timeout, skipped, error); the peak memory per
sample in MiB the same way; the recurrent step's time per generated position in ms at
each context; and the fitted growth exponent of time per sample with N per variant
(the run's summary: least squares on log-log over the points that ran).
Standard library only; exit status 2 with one line for a file that is not a bench run.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import provenance  # noqa: E402  (experiments/provenance.py)


def die(msg):
    # the running script's name: sparse_work.py reads run documents through load() too
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "table.py"
    print(f"{prog}: {msg}", file=sys.stderr)
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
    if not any(r.get("kind") == "parallel" for r in doc["records"] if isinstance(r, dict)):
        die(f"{path} holds no bench points (records of kind 'parallel')")
    return doc


def fmt(x):
    if x >= 100:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def machine_line(doc):
    m = doc.get("machine", {})
    g = doc.get("sgemm", {})
    dev = "cpu"
    parts = []
    if isinstance(m.get("gpu"), dict) and any(r.get("device") == "cuda" for r in doc["records"] if isinstance(r, dict)):
        dev = "cuda"
    parts.append(f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('threads', '?')} threads")
    parts.append(f"OpenBLAS core {m.get('blas_core', '?')} (OPENBLAS_CORETYPE {m.get('openblas_coretype_env') or 'unset'}), "
                 f"{m.get('blas_threads', '?')} BLAS threads ({m.get('blas_parallel_model', '?')})")
    if isinstance(m.get("gpu"), dict):
        parts.append(f"GPU {m['gpu'].get('name', '?')}")
    if g.get("gflops"):
        parts.append(f"sgemm {g['gflops']:.0f} GFLOP/s at {g.get('size', '?')}^3 ({g.get('device', dev)})")
    return "; ".join(parts)


def main(argv):
    fwd = "--fwd" in argv
    paths = [a for a in argv if a != "--fwd"]
    if len(paths) != 1 or paths[0].startswith("-"):
        die("usage: table.py RESULT.json [--fwd]")
    doc = load(paths[0])
    cfg = doc.get("config", {})
    recs = [r for r in doc["records"] if isinstance(r, dict)]
    par = [r for r in recs if r.get("kind") == "parallel"]
    names = []
    for r in par:
        if r["variant"] not in names:
            names.append(r["variant"])
    lens = sorted({r["len"] for r in par})
    key = "per_sample_fwd_ms" if fwd else "per_sample_fwd_bwd_ms"
    print(f"Run: {doc.get('command', '?')}  ")
    print(f"Source: {provenance.source_line(doc)}  ")
    print(f"Machine: {machine_line(doc)}  ")
    print(f"Config: {cfg.get('name', '?')}, H={cfg.get('heads')}, D={cfg.get('qk_dim')}, M={cfg.get('v_dim')}, "
          f"causal={str(cfg.get('causal')).lower()}, batch rule {json.dumps(cfg.get('batch'))}, "
          f"{cfg.get('repeats')} repeats (medians)")
    print()
    tables = [(("forward" if fwd else "forward+backward") + " time per sample, ms", key, 1.0),
              ("peak memory per sample, MiB", "peak_bytes_per_sample", 1.0 / 1048576)]
    cp = doc.get("copy") or {}
    if cp.get("device") == "cuda" and cp.get("gbps") and any("fwd_bwd_over_floor" in r for r in par):
        # on a GPU, how far each point is from the time its minimal bytes (inputs,
        # outputs and their gradients) take at the card's measured copy rate
        tables.append((("forward" if fwd else "forward+backward") + " time over the memory floor (the point's "
                       f"minimal bytes at the measured copy rate, {cp['gbps']:.0f} GB/s)",
                       "fwd_over_floor" if fwd else "fwd_bwd_over_floor", 1.0))
    for title, field, scale in tables:
        print(f"{title}:")
        print()
        print("| variant | " + " | ".join(f"N={n}" for n in lens) + " |")
        print("|---|" + "---|" * len(lens))
        for v in names:
            cells = []
            for n in lens:
                r = next((x for x in par if x["variant"] == v and x["len"] == n), None)
                if r is None:
                    cells.append("")
                elif r.get("status") == "ok" and isinstance(r.get(field), (int, float)):
                    cells.append(fmt(r[field] * scale))
                else:
                    cells.append(str(r.get("status", "?")))
            print(f"| {v} | " + " | ".join(cells) + " |")
        print()
    rec = [r for r in recs if r.get("kind") == "recurrent"]
    if rec:
        ctx = sorted({r["context"] for r in rec})
        print("recurrent step, ms per generated position (median; batch %s):" % rec[0].get("batch", "?"))
        print()
        print("| variant | " + " | ".join(f"context {c}" for c in ctx) + " |")
        print("|---|" + "---|" * len(ctx))
        vs = []
        for r in rec:
            if r["variant"] not in vs:
                vs.append(r["variant"])
        for v in vs:
            cells = []
            for c in ctx:
                r = next((x for x in rec if x["variant"] == v and x["context"] == c), None)
                if r is None:
                    cells.append("")
                elif r.get("status") == "ok":
                    cells.append(f"{r['per_position_ms']:.4g}")
                else:
                    cells.append(str(r.get("status", "?")))
            print(f"| {v} | " + " | ".join(cells) + " |")
        print()
    growth = doc.get("summary") or {}
    if isinstance(growth, dict) and growth:
        print("growth of forward+backward time per sample with N (fitted exponent, log-log least squares):")
        print()
        print("| variant | exponent | over N | points |")
        print("|---|---|---|---|")
        for v, g in growth.items():
            x = g.get("fwd_bwd_time_exponent")
            print(f"| {v} | {'-' if x is None else format(x, '.2f')} | {g.get('len_min', '?')}..{g.get('len_max', '?')} "
                  f"| {g.get('points', '?')} |")
        print()

if __name__ == "__main__":
    main(sys.argv[1:])
