#!/usr/bin/env python3
"""Side by side: an `attnbench bench` run document and the PyTorch peer's
(experiments/sweep/torch_bench.py) from the same sweep config, as ratio tables (ours /
PyTorch) of time and memory per variant and N, and of the recurrent step times.

    compare_torch.py OURS.json TORCH.json [--allow-mismatch]

Pairs: each PyTorch record stands against the labels in its "peer_of" (e.g. softmax ->
PyTorch's eager softmax and sdpa, linear -> linear_chunked), at the same length,
batch, heads, dimensions and causality. Time: medians of forward and of
forward+backward (ms). Memory: ours is the tracked allocator's peak over the point
(inputs q, k, v, dout, out, gradients, saved state, workspace); PyTorch's peak_bytes
excludes its inputs (q, k, v, dout), so the ratio is taken against PyTorch's
peak_bytes + input_bytes. Recurrent: the median time per generated position at each
context, and the state each keeps.

The two runs must have used the same BLAS core type and thread count (machine.blas_core,
machine.threads and machine.blas_threads, on the CPU) or the same GPU (machine.gpu.name,
on CUDA), the same device, and measured sgemm rates (the documents' sgemm.gflops) no
more than 25% apart: otherwise one line and exit status 2, unless --allow-mismatch,
which the output then states. Standard library only.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import provenance  # noqa: E402  (experiments/provenance.py)

PROG = "compare_torch"


class Refusal(Exception):
    pass


def load(path, what):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise Refusal(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise Refusal(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}")
    if not isinstance(doc, dict) or doc.get("schema") != "attnbench/run/1" or not isinstance(doc.get("records"), list):
        raise Refusal(f"{path}: not a run document (schema attnbench/run/1) from {what}")
    if not isinstance(doc.get("machine"), dict):
        raise Refusal(f"{path}: the run document has no machine section")
    return doc


def device(doc):
    return (doc.get("config") or {}).get("device", "cpu")


# The most the two sides' measured sgemm rates may differ by (the larger over the
# smaller, less 1): beyond it the machine was not the same for both (another load, a
# core lost, other kernels), and the ratios would measure that.
SGEMM_GAP = 0.25


def sgemm_gap(ours, theirs):
    """A phrase when both sides measured sgemm and the rates are more than SGEMM_GAP apart."""
    a, b = ((d.get("sgemm") or {}).get("gflops") for d in (ours, theirs))
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a <= 0 or b <= 0:
        return None
    if max(a, b) / min(a, b) - 1 > SGEMM_GAP:
        return (f"measured sgemm rate {a:.0f} vs {b:.0f} GFLOP/s (more than {SGEMM_GAP:.0%} apart: "
                "not the same machine conditions)")
    return None


def mismatches(ours, theirs):
    """What differs between the two runs' conditions, as short phrases."""
    out = []
    dv_o, dv_t = device(ours), device(theirs)
    if dv_o != dv_t:
        return [f"device {dv_o} vs {dv_t}"]
    mo, mt = ours["machine"], theirs["machine"]
    gap = sgemm_gap(ours, theirs)
    if dv_o == "cuda":
        go, gt = (mo.get("gpu") or {}).get("name"), (mt.get("gpu") or {}).get("name")
        if go != gt:
            out.append(f"GPU {go} vs {gt}")
        return out + ([gap] if gap else [])
    for key, name in (("blas_core", "BLAS core type"), ("threads", "thread count"),
                      ("blas_threads", "BLAS thread count")):
        a, b = mo.get(key), mt.get(key)
        if a != b:
            out.append(f"{name} {a} vs {b}")
    return out + ([gap] if gap else [])


def ms(x):
    if x is None:
        return "-"
    return f"{x:.1f}" if x >= 100 else f"{x:.2f}" if x >= 1 else f"{x:.4f}"


def mib(x):
    if x is None:
        return "-"
    return f"{x / 2**20:.3f}" if x < 2**20 else f"{x / 2**20:.1f}" if x < 10 * 2**20 else f"{x / 2**20:.0f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "-"
    r = a / b
    return f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"


def med(r, key):
    v = r.get(key)
    return v.get("median") if isinstance(v, dict) else None


def shape_key(r):
    return (r.get("len"), r.get("batch"), r.get("heads"), r.get("qk_dim"), r.get("v_dim"), r.get("causal"))


def side_line(doc, who):
    m = doc["machine"]
    sg = (doc.get("sgemm") or {}).get("gflops")
    extra = f", PyTorch {m.get('torch')}" if m.get("torch") else ""
    gpu = (m.get("gpu") or {}).get("name")
    return (f"{who}: {m.get('cpu')}{', GPU ' + gpu if gpu else ''}, {m.get('threads')} threads, "
            f"{m.get('blas')} core {m.get('blas_core')} ({m.get('blas_parallel_model')}, "
            f"{m.get('blas_threads')} threads), OPENBLAS_CORETYPE={m.get('openblas_coretype_env') or '(unset)'}, "
            f"allocator {m.get('allocator')}{extra}; sgemm {'-' if sg is None else f'{sg:.0f}'} GFLOP/s; "
            f"{provenance.source_line(doc)}")


def tables(ours, theirs):
    par, rec = [], []  # the rows of each table
    own = {}
    for r in ours["records"]:
        own[(r.get("kind"), r.get("variant")) + shape_key(r) + (r.get("context"),)] = r
    for t in theirs["records"]:
        if t.get("kind") != "parallel":
            continue
        for label in t.get("peer_of") or []:
            o = own.get(("parallel", label) + shape_key(t) + (None,))
            if o is None:
                continue
            row = [label, t["variant"], str(t["len"]), str(t["batch"])]
            ok_o, ok_t = o.get("status") == "ok", t.get("status") == "ok"
            of, ofb = (med(o, "fwd_ms"), med(o, "fwd_bwd_ms")) if ok_o else (None, None)
            tf, tfb = (med(t, "fwd_ms"), med(t, "fwd_bwd_ms")) if ok_t else (None, None)
            op = o.get("peak_bytes") if ok_o else None
            tp = t.get("peak_bytes") if ok_t else None
            tpi = tp + (t.get("input_bytes") or 0) if tp is not None else None
            row += [ms(of) if ok_o else o.get("status", "-"), ms(tf) if ok_t else t.get("status", "-"), ratio(of, tf),
                    ms(ofb) if ok_o else o.get("status", "-"), ms(tfb) if ok_t else t.get("status", "-"),
                    ratio(ofb, tfb), mib(op), mib(tpi), ratio(op, tpi)]
            par.append("| " + " | ".join(row) + " |")
    for t in theirs["records"]:
        if t.get("kind") != "recurrent":
            continue
        for label in t.get("peer_of") or []:
            o = own.get(("recurrent", label) + shape_key(t) + (t.get("context"),))
            if o is None:
                continue
            ok_o, ok_t = o.get("status") == "ok", t.get("status") == "ok"
            op, tp = (o.get("per_position_ms") if ok_o else None), (t.get("per_position_ms") if ok_t else None)
            rec.append("| " + " | ".join([
                label, t["variant"], str(t.get("context")), str(t["batch"]),
                ms(op) if ok_o else o.get("status", "-"), ms(tp) if ok_t else t.get("status", "-"), ratio(op, tp),
                mib(o.get("state_bytes") if ok_o else None), mib(t.get("state_bytes") if ok_t else None)]) + " |")
    # each table with rows under its header, a blank line between them: none of headers alone
    lines = []
    if par:
        lines += ["| ours | PyTorch | N | B | ours fwd ms | PyTorch fwd ms | fwd ratio | ours fwd+bwd ms | "
                  "PyTorch fwd+bwd ms | fwd+bwd ratio | ours peak MiB | PyTorch peak + inputs MiB | memory ratio |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + par
    if rec:
        lines += ([""] if lines else []) + [
            "| ours | PyTorch | context | B | ours ms/step | PyTorch ms/step | step ratio | ours state MiB | "
            "PyTorch state MiB |", "|---|---|---|---|---|---|---|---|---|"] + rec
    return lines, len(par), len(rec)


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    flags = [a for a in argv if a.startswith("--")]
    if "--help" in flags or "-h" in argv:
        print(__doc__)
        return 0
    bad = [f for f in flags if f != "--allow-mismatch"]
    try:
        if bad:
            raise Refusal(f"unknown option {bad[0]} (usage: compare_torch.py OURS.json TORCH.json [--allow-mismatch])")
        if len(args) != 2:
            raise Refusal("usage: compare_torch.py OURS.json TORCH.json [--allow-mismatch]")
        ours = load(args[0], "attnbench bench")
        theirs = load(args[1], "torch_bench.py")
        if "torch" not in theirs["machine"] or "peer_of" not in next(iter(theirs["records"]), {"peer_of": 0}):
            raise Refusal(f"{args[1]}: not a torch_bench.py run document (no machine.torch or records' peer_of)")
        if "torch" in ours["machine"]:
            raise Refusal(f"{args[0]}: a torch_bench.py document where attnbench's is expected (order: OURS TORCH)")
        diff = mismatches(ours, theirs)
        if diff and "--allow-mismatch" not in flags:
            raise Refusal("the runs differ in " + "; ".join(diff) + ": refusing to compare (--allow-mismatch to do it "
                          "anyway)")
    except Refusal as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(side_line(ours, "ours"))
    print(side_line(theirs, "PyTorch"))
    if diff:
        print("WARNING: compared with --allow-mismatch although the runs differ in " + "; ".join(diff))
    print(f"device {device(ours)}; ratios are ours / PyTorch (below 1: ours is faster or smaller); memory: ours' "
          "tracked peak (inputs included) against PyTorch's peak beyond its inputs + its inputs")
    print()
    lines, n_par, n_rec = tables(ours, theirs)
    print("\n".join(lines))
    if n_par + n_rec == 0:
        print(f"{PROG}: error: no record of {args[1]} has a peer in {args[0]} (different configs or shapes?)",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
