#!/usr/bin/env python3
"""Cross-check of `attnbench op` against an independent float64 numpy reference.

The reference (xref.py, beside this file) is written from the specification only (the
paper's formulas, the README's "Variants and options", attention/README.md's
"Definitions the paper leaves open", `attnbench list`, `attnbench op --help` and the
Philox layout documented in harness/rng.h), not from the C sources, so that a shared
misreading cannot hide a bug.

What is checked is what the binary under test lists (`attnbench list --json`): its
variants in registry order, in turn, the modes each has and the values of its choice
options. Each variant's reference is looked up by name in REFERENCES (and linear's
feature maps in FEATURE_MAPS); a listed variant, option, choice value or mode that has
none fails the test before any case runs, so a new variant cannot slip past the
cross-check.

For every case: random shapes and options from a fixed seed, inputs written as .npy
with numpy's own writer, one `attnbench op` call (and one `--mode recurrent` call for
causal variants that have a step), then out/dq/dk/dv compared with the reference:
every element within TOL of the magnitude of the terms it is made of (see TOL), exact
zeros where the definitions promise them; max|C - ref| / max|ref| per tensor is
reported beside it.

Gradients of sum(out * dout) are analytic in float64 (exact up to float64 rounding,
cheap on every case); they are themselves checked against central finite differences
of the float64 forward on small shapes before any case runs (see selftest_gradients),
with LSH buckets held fixed under the perturbation.

Usage: xcheck.py ATTNBENCH [--cases N] [--seed S] [--case K] [--variant NAME]
                 [--max-n N] [--max-d D] [--device cpu|cuda] [--progress K] [--jobs J] [-v]

--jobs J checks J cases at a time (threads, each starting its own attnbench calls): the
cases, their figures and the verdict are the same as one at a time, and they are
reported in case order. Worth it where a call's start-up dominates, as a CUDA
context's on a GPU (about a second a call).

With --device cuda every call runs on the GPU (or, given the attnbench-emu binary, on
the CPU emulator of the CUDA code: the meson test crosscheck_cuda_emu).
Exit status: 0 all cases agree, 1 a disagreement (the case is named with the command
that reproduces it) or something listed without a reference, 2 a usage or setup error,
77 numpy missing (test skipped).
"""

import argparse
import concurrent.futures
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:  # the test is skipped, not passed
    print("crosscheck: SKIP: numpy is not installed for " + sys.executable +
          " (Debian: apt-get install python3-numpy)")
    sys.exit(77)

# the reference (float64 numpy) in xref.py beside this file
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xref import (COMMON_OPTIONS, FEATURE_MAPS, INPUTS, MODES, REFERENCES, linformer_count,  # noqa: E402
                  lsh_buckets, lsh_masks, lsh_rotation, reference, selftest_philox)

# The tensors compared: the output, the gradients, and the gradient of a variant's own
# input (dNAME for the input NAME of INPUTS).
TENSORS = ("out", "dq", "dk", "dv", "dparams") + tuple("d" + n for n in sorted(INPUTS))

# ---------------------------------------------------------------------------------------
# Self-test of the reference: analytic gradients against central finite differences
# ---------------------------------------------------------------------------------------

def check_magnitudes(ref, what):
    """The magnitude bounds must bound the values (a bound below |value| would excuse
    nothing but points at a mistake in the reference)."""
    for n in TENSORS:
        if n not in ref:
            continue
        if not np.all(np.abs(ref[n]) <= ref["mag_" + n] * (1 + 1e-9) + 1e-300):
            raise AssertionError("%s: |%s| exceeds its magnitude bound" % (what, n))


def selftest_gradients():
    """Every element of dq, dk, dv against (f(x+h) - f(x-h)) / 2h of f = sum(out*g),
    in float64, on small shapes covering every variant, causal or not, padding and the
    option branches. LSH buckets are held fixed (masks computed once). h = 1e-5: the
    truncation error is O(h^2 |f'''|) ~ 1e-10 and the rounding error ~ 1e-16/h ~ 1e-11,
    so 1e-7 relative to the largest gradient entry is a tolerance that a wrong
    derivative (errors of order 1) cannot meet."""
    rng = np.random.default_rng(12345)
    configs = [
        ("softmax", False, None, {}),
        ("softmax", True, [3, 0], {"scale": -0.8}),
        ("linear", False, [2, 4], {"feature_map": "elu", "eps": 0.3}),
        ("linear", True, None, {"feature_map": "taylor", "eps": 1e-3}),
        ("linear", False, [4, 1], {"feature_map": "taylor", "eps": 0.0}),
        ("polynomial", True, [4, 2], {"c": 0.5, "scale": 0.7, "eps": 0.1}),
        ("polynomial", False, None, {"c": 0.0, "scale": 0.4, "eps": 1e-6}),
        ("lsh", False, None, {"rounds": 2, "bits": 2, "chunk": 2, "combine": "mean"}),
        ("lsh", True, [4, 3], {"rounds": 3, "bits": 1, "chunk": 1, "combine": "logsumexp"}),
        ("lsh", False, [3, 4], {"rounds": 2, "bits": 3, "chunk": 2, "combine": "logsumexp",
                                "scale": 1.3}),
        ("linear", True, [4, 2], {"feature_map": "favor", "eps": 0.05}),
        ("linear", False, None, {"feature_map": "favor", "features": 5, "eps": 1e-6}),
        ("efficient", False, None, {}),
        ("efficient", False, [3, 1], {}),
        ("local", True, [4, 3], {"window": 2, "scale": 0.9}),
        ("local", False, None, {"window": 2}),
        ("linformer", False, [3, 1], {"k": 3, "share": "none", "scale": 0.7}),
        ("linformer", False, None, {"k": 5, "share": "kv"}),
        ("gla", True, [3, 4], {"gate": "vector", "chunk": 2}),
        ("gla", False, [4, 2], {"gate": "scalar", "scale": 0.7}),
        ("gla", True, None, {"gate": "scalar"}),
        ("gla", False, None, {}),
    ]
    B, H, N, D, M = 2, 1, 4, 3, 2
    h = 1e-5
    for variant, causal, lengths, o in configs:
        q = rng.standard_normal((B, H, N, D))
        k = rng.standard_normal((B, H, N, D))
        v = rng.standard_normal((B, H, N, M))
        g = rng.standard_normal((B, H, N, M))
        L = None if lengths is None else np.array(lengths)
        masks = None
        if variant == "lsh":
            masks = lsh_masks(q, L, causal, o["rounds"], o["bits"], o["chunk"], 7)
        params, pmax = None, None
        if variant == "linformer":
            pmax = N + 2      # columns past N: never read, zero gradient
            params = rng.standard_normal(linformer_count(o, pmax))
        iname = REFERENCES[variant].input
        aux = None if iname is None else INPUTS[iname](rng, B, H, N, D, o).astype(np.float64)
        if iname == "g":      # mild gates: with strong ones the gradients fall below what h resolves
            aux = -rng.uniform(0.0, 1.0, size=aux.shape)
        ref = reference(variant, q, k, v, g, L, causal, o, 7, masks=masks, max_len=pmax, params=params, aux=aux)
        check_magnitudes(ref, "self-test %s %s" % (variant, o))
        xs = (("q", q), ("k", k), ("v", v)) + ((("params", params),) if params is not None else ()) + \
            (((iname, aux),) if aux is not None else ())
        for name, x in xs:
            dx = ref["d" + name]
            fd = np.zeros_like(x)
            for idx in np.ndindex(x.shape):
                old = x[idx]
                x[idx] = old + h
                fp = (reference(variant, q, k, v, g, L, causal, o, 7, masks=masks, max_len=pmax,
                                params=params, aux=aux)["out"] * g).sum()
                x[idx] = old - h
                fm = (reference(variant, q, k, v, g, L, causal, o, 7, masks=masks, max_len=pmax,
                                params=params, aux=aux)["out"] * g).sum()
                x[idx] = old
                fd[idx] = (fp - fm) / (2 * h)
            err = np.abs(fd - dx).max() / max(np.abs(fd).max(), 1e-300)
            if not err < 1e-7:
                raise AssertionError("reference gradient d%s of %s %s (causal=%s, lengths=%s) "
                                     "differs from finite differences by %.2e" %
                                     (name, variant, o, causal, lengths, err))


# ---------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------

LIST_SCHEMA = "attnbench/list/1"


def read_listing(exe):
    """`attnbench list --json` of the binary under test: its variants, their options,
    modes and devices (what the cases are drawn from)."""
    p = subprocess.run([exe, "list", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s list --json exited %d: %s" % (exe, p.returncode, (p.stderr or p.stdout).strip()))
    try:
        doc = json.loads(p.stdout)
    except ValueError as e:
        raise RuntimeError("%s list --json is not JSON: %s" % (exe, e))
    if doc.get("schema") != LIST_SCHEMA or not doc.get("variants"):
        raise RuntimeError("%s list --json: schema %r, expected %r with variants" %
                           (exe, doc.get("schema"), LIST_SCHEMA))
    return doc


def coverage(listing):
    """What the binary lists that this file has no reference for: one message per
    variant, option, choice value or mode (empty when everything is covered)."""
    problems = []
    for var in listing["variants"]:
        name = var["name"]
        ref = REFERENCES.get(name)
        if ref is None:
            problems.append("variant '%s' has no reference in xcheck.py: add one to REFERENCES "
                            "(a reference function and how cases draw its options)" % name)
            continue
        for opt in var["options"]:
            if opt["name"] not in ref.options and opt["name"] not in COMMON_OPTIONS:
                problems.append("option '%s' of variant '%s' is unknown to its reference in xcheck.py" %
                                (opt["name"], name))
                continue
            known = ref.options.get(opt["name"], COMMON_OPTIONS.get(opt["name"]))
            for value in opt.get("choices") or []:
                if known is None or value not in known:
                    problems.append("%s=%s of variant '%s' has no reference in xcheck.py%s" %
                                    (opt["name"], value, name,
                                     " (add the feature map to FEATURE_MAPS)" if opt["name"] == "feature_map"
                                     else ""))
        if var.get("input") is not None and (var["input"] not in INPUTS or ref.input != var["input"]):
            problems.append("input '%s' of variant '%s' has no reference in xcheck.py: add how its values "
                            "are drawn to INPUTS (xref.py) and name it in the variant's Ref" % (var["input"], name))
        for mode in var["modes"]:
            if mode not in MODES:
                problems.append("mode '%s' of variant '%s' is unknown to xcheck.py" % (mode, name))
    return problems


def selftest_coverage(listing):
    """coverage() must report a variant, an option and a choice value it has no
    reference for (a listing of the binary's with one of each added)."""
    fake = json.loads(json.dumps(listing))
    fake["variants"].append({"name": "no-such-variant", "options": [], "modes": ["parallel"],
                             "devices": ["cpu"]})
    for var in fake["variants"]:
        if var["name"] == "linear":
            var["options"].append({"name": "no_such_option", "type": "int"})
            for opt in var["options"]:
                if opt["name"] == "feature_map":
                    opt["choices"] = opt["choices"] + ["no-such-map"]
    found = coverage(fake)
    for word in ("no-such-variant", "no_such_option", "no-such-map"):
        if not any(word in m for m in found):
            raise AssertionError("coverage() does not report %s: %s" % (word, found))

# Smallest gap between the two largest hash scores (unit-norm x, N(0,1) rotations) that
# a case may contain. float32 evaluation of xR errs by at most about D * 2^-24 * sum|x_d
# R_dj| <= 12 * 6e-8 * 3.5 * 4 ~ 1e-5 (seen: ~1e-7), so with gaps above 1e-4 the C code
# and this reference choose the same bucket; rows of q closer to a tie are redrawn.
LSH_MIN_GAP = 1e-4


# Share of the cases on the CUDA device that run with precision=tf32 (drawn from a
# generator of their own, so the other cases are the same on either device).
TF32_SHARE = 0.3


def make_case(seed, idx, variants, only=None, max_n=70, max_d=12, device="cpu"):
    """Case idx: variants (the listing's entries to draw from) in turn, or only."""
    rng = np.random.default_rng([seed, idx])
    variant = only or variants[idx % len(variants)]["name"]
    entry = next(v for v in variants if v["name"] == variant)
    allowed = {opt["name"]: opt.get("choices") for opt in entry["options"]}
    B, H = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    if idx % 13 == 0:
        N = 1
    elif idx % 13 == 1:
        N = int(rng.integers(max_n - 10 if max_n > 11 else 2, max_n + 1))
    else:
        N = int(rng.integers(2, max_n + 1))
    D = int(rng.integers(1, max_d + 1))
    M = D if rng.random() < 0.4 else int(rng.integers(1, max_d + 1))
    causal = bool(rng.random() < 0.5) and entry.get("causal", True)
    if REFERENCES[variant].causal_only:
        causal = True
    lengths = None
    if rng.random() < 0.5:
        choices = rng.integers(0, 3, size=B)              # 0: zero, 1: N, 2: anything
        lengths = np.where(choices == 0, 0, np.where(choices == 1, N,
                                                       rng.integers(0, N + 1, size=B)))
        if rng.random() < 0.5:
            lengths[rng.integers(0, B)] = int(rng.integers(1, N + 1))
    amp = float(rng.uniform(0.3, 2.0))
    q = (amp * rng.standard_normal((B, H, N, D))).astype(np.float32)
    k = (amp * rng.standard_normal((B, H, N, D))).astype(np.float32)
    v = rng.standard_normal((B, H, N, M)).astype(np.float32)
    dout = rng.standard_normal((B, H, N, M)).astype(np.float32)
    lsh_seed = int(rng.choice([0, 1, int(rng.integers(2, 2**31)), int(rng.integers(2**32, 2**40))]))
    o = REFERENCES[variant].draw(rng, D, allowed)
    if device == "cuda" and np.random.default_rng([seed, idx, 1]).random() < TF32_SHARE:
        o["precision"] = "tf32"
    len_dtype = np.int32 if rng.random() < 0.5 else np.int64
    if lengths is not None:
        lengths = lengths.astype(len_dtype)
    case = dict(idx=idx, variant=variant, B=B, H=H, N=N, D=D, M=M, causal=causal,
                lengths=lengths, opts=o, seed=lsh_seed, q=q, k=k, v=v, dout=dout, redrawn=0,
                threads=1 + idx % 3, max_len=None)
    if variant == "linformer":
        # parameters for sequences of up to max_len: often N, else longer (the first
        # N columns are used)
        case["max_len"] = N + int(rng.choice([0, 0, 1, 9]))
    if entry.get("input") is not None:
        # the variant's own input (gla's g, deltanet's beta), from a generator of its
        # own so that the other draws stay those of the variants without one
        case["aux_name"] = entry["input"]
        case["aux"] = INPUTS[entry["input"]](np.random.default_rng([seed, idx, 2]), B, H, N, D, o)
    if variant == "lsh":
        # Keep every hash away from a tie (see LSH_MIN_GAP): redraw the rows of q that
        # come too close, deterministically; with D = 1 (or no luck) the rotations are
        # at fault, so take the next seed.
        for attempt in range(200):
            bad = np.zeros((B, H, N), dtype=bool)
            for r in range(o.get("rounds", 1)):
                _, gap = lsh_buckets(q.astype(np.float64),
                                     lsh_rotation(case["seed"], r, D, o.get("bits", 8)))
                bad |= gap < LSH_MIN_GAP
            if not bad.any():
                break
            case["redrawn"] += int(bad.sum())
            if D == 1 or attempt >= 100:
                case["seed"] += 1
            else:
                q[bad] = (amp * rng.standard_normal((int(bad.sum()), D))).astype(np.float32)
        else:
            raise RuntimeError("case %d: could not keep LSH hashes away from ties" % idx)
    return case


def describe(c):
    L = "none" if c["lengths"] is None else "[%s] (%s)" % (
        ",".join(str(int(x)) for x in c["lengths"]), c["lengths"].dtype)
    s = "case %d: %s B=%d H=%d N=%d D=%d M=%d causal=%s lengths=%s opts=%s" % (
        c["idx"], c["variant"], c["B"], c["H"], c["N"], c["D"], c["M"], c["causal"], L,
        c["opts"] or "{}")
    if c["variant"] in ("lsh", "linformer"):
        s += " seed=%d" % c["seed"]
    if c.get("max_len") is not None:
        s += " max_len=%d" % c["max_len"]
    return s


def fmt_opt(x):
    return repr(x) if isinstance(x, float) else str(x)


def run_op(exe, c, folder, mode, device):
    os.makedirs(folder, exist_ok=True)
    files = {}
    for name in ("q", "k", "v", "dout"):
        files[name] = os.path.join(folder, name + ".npy")
        np.save(files[name], c[name])
    cmd = [exe, "op", "--variant", c["variant"], "--q", files["q"], "--k", files["k"],
           "--v", files["v"], "--out", os.path.join(folder, "out"), "--seed", str(c["seed"]),
           "--threads", str(c["threads"]), "--device", device]
    if mode == "parallel":
        cmd += ["--dout", files["dout"]]
    else:
        cmd += ["--mode", "recurrent"]
    if c["causal"]:
        cmd.append("--causal")
    if c.get("max_len") is not None:
        cmd += ["--max-len", str(c["max_len"])]
    if c.get("aux") is not None:
        files["aux"] = os.path.join(folder, c["aux_name"] + ".npy")
        np.save(files["aux"], c["aux"])
        cmd += ["--" + c["aux_name"], files["aux"]]
    if c["lengths"] is not None and mode == "parallel":   # recurrent mode takes no lengths
        lp = os.path.join(folder, "lengths.npy")
        np.save(lp, c["lengths"])
        cmd += ["--lengths", lp]
    for key, val in c["opts"].items():
        cmd += ["--set", "%s=%s" % (key, fmt_opt(val))]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("attnbench op exited %d: %s\n  command: %s" %
                           (p.returncode, (p.stderr or p.stdout).strip(), " ".join(cmd)))
    names = ["out"] + (["dq", "dk", "dv"] if mode == "parallel" else [])
    n_par = None
    if c.get("max_len") is not None:
        n_par = linformer_count({k: v for k, v in c["opts"].items() if v != "auto"}, c["max_len"])
        names += ["params"] + (["dparams"] if mode == "parallel" else [])
    if c.get("aux") is not None and mode == "parallel":
        names.append("d" + c["aux_name"])
    res = {}
    for n in names:
        a = np.load(os.path.join(folder, "out", n + ".npy"))
        want = (n_par,) if n in ("params", "dparams") else c["v"].shape if n in ("out", "dv") else \
            c["aux"].shape if c.get("aux") is not None and n == "d" + c["aux_name"] else c["q"].shape
        if a.dtype != np.float32 or a.shape != want:
            raise RuntimeError("%s.npy: dtype %s shape %s, expected float32 %s" %
                               (n, a.dtype, a.shape, want))
        res[n] = a.astype(np.float64)
    return res


# Tolerance. C works in float32 (unit roundoff u = 2^-24 = 6.0e-8), with double for
# some reductions; the inputs are exact float32 values, so the whole difference from
# this float64 reference is C's rounding. Every element must satisfy
#     |C - ref| <= TOL * mag
# where mag (see the reference) is the sum of the magnitudes of the terms the value is
# made of, each softmax weight counted (1 + |score terms|) times. Rounding error
# analysis bounds the error by n u mag, n the longest chain of roundings: a dot product
# over D <= 12 values or C <= 157 features, a sum over N <= 70 keys, a few products
# and a division, so n < 250 and n u < 1.5e-5; random rounding errors partly cancel and
# the measured worst over 22,000 cases (seeds 300-339 with these shapes, 400-409 with
# N <= 300 and D, M <= 20) is 1.1e-6 (18 u, polynomial dv). TOL = 1e-5 (170 u) leaves
# a margin of 9 over it and stays under the worst-case bound. A wrong formula, mask,
# bucket or option is off by a fair fraction of the values themselves, far above this
# (checked by breaking the reference on purpose: a scale off by 1e-4, eps dropped, the
# lsh seed, chunk, self rule or combine changed, a strict causal mask: all fail).
# Besides the bound, values whose mag is exactly 0 (padded rows, lengths of 0, lsh's dk,
# a score scale of 0) must be exactly 0 in C's output, as the README promises.
TOL = 1e-5

# With precision=tf32 (CUDA only) the matrix products round their operands to TF32
# (unit roundoff u = 2^-11 = 4.9e-4) and sum in float32: the same chains of roundings
# with a unit 8192 times larger wherever an operand goes through a tensor core. A chain
# holds a few such roundings (each product's two operands, the softmax weights, the
# features), so the bound is a few u: TOL_TF32 = 1e-2 (20 u). Measured on the emulator
# (500 cases; softmax, stateful-softmax and local in the fused kernels' tensor-core
# path, attention/flash_softmax.cu, whose operands are q, k, v, dO and the rounded
# probabilities and dS; linear and polynomial in their fused kernels,
# attention/linear_chunk.cuh, poly_chunk.cuh, their tile products on wmma, favor's
# projections split in two TF32 parts; the others in cuBLAS's TF32 products): up to
# 6.9e-4 (1.4 u, local's dv; softmax out 3.6e-4, dq 1.0e-4, dk 1.3e-4, dv 6.8e-4;
# stateful-softmax dq 4.3e-4; local out 4.9e-4, dk 3.1e-4; linear 5.8e-4 (dv), favor
# 2.8e-4, polynomial 6.2e-4): the bound stands with a margin of 14. The errors are
# printed under the "[tf32]" keys. A wrong formula or mask is still off by a fair
# fraction of the values; small option errors are caught by the fp32 cases.
TOL_TF32 = 1e-2


def tolerance(c):
    return TOL_TF32 if c["opts"].get("precision") == "tf32" else TOL


# A tensor whose values are all within 10^4 rounding units of zero (max|ref| <
# 1e4 u max(mag), e.g. dq and dk at N = 1, which are exactly 0 in exact arithmetic)
# says nothing through max|err|/max|ref|: it is held to the bound like any other but
# left out of that figure.
DEGENERATE = 1e4 * 2.0**-24


# float32 underflows below 1.2e-38 (softmax weights exp(s - max) of rows with a large
# score range, and what they multiply): there C's error is absolute, not relative, while
# float64 still resolves values far smaller. Magnitudes below this floor count as it.
UNDERFLOW = 1e-30


def compare(got, ref, mag):
    """Returns (figure, bound, message). figure: max|err|/max|ref| over the tensor, or
    None where the tensor is exactly zero or degenerate; bound: max over elements of
    |err| / mag (the measure held to the tolerance); message: why it fails outright."""
    if got.size == 0:
        return None, 0.0, None
    if not np.all(np.isfinite(got)):
        return math.inf, math.inf, "non-finite values"
    err = np.abs(got - ref)
    rmax, mmax = float(np.abs(ref).max()), float(mag.max())
    fig = float(err.max()) / rmax if rmax > 0 and rmax >= DEGENERATE * mmax else None
    live = mag > 0
    bound = float((err[live] / np.maximum(mag[live], UNDERFLOW)).max()) if live.any() else 0.0
    nonzero = ~live & (got != 0)
    if nonzero.any():
        i = tuple(int(x) for x in np.argwhere(nonzero)[0])
        return fig, bound, ("%d values that must be exactly 0 are not, first at %s: %.3e" %
                            (int(nonzero.sum()), i, got[i]))
    return fig, bound, None


def keep_worst(worst, n, e, case):
    """worst[n] = (e, case) when e is the first or a larger figure of tensor n."""
    w = worst.get(n)
    if w is None or e > w[0]:
        worst[n] = (e, case)


def check_case(exe, c, folder, stats, failures, verbose, device, modes_of):
    f64 = {n: c[n].astype(np.float64) for n in ("q", "k", "v", "dout")}

    def ref_for(lengths):
        aux = c["aux"].astype(np.float64) if c.get("aux") is not None else None
        r = reference(c["variant"], f64["q"], f64["k"], f64["v"], f64["dout"], lengths,
                      c["causal"], c["opts"], c["seed"], max_len=c.get("max_len"), aux=aux)
        check_magnitudes(r, describe(c))
        return r

    ref = ref_for(c["lengths"])
    modes = ["parallel"]
    if c["causal"] and "recurrent" in modes_of[c["variant"]]:
        modes.append("recurrent")
    # favor's figures apart from the other maps' (its features are exponentials)
    name = c["variant"] + ("[favor]" if c["opts"].get("feature_map") == "favor" else "") + \
        ("[tf32]" if c["opts"].get("precision") == "tf32" else "")
    for mode in modes:
        key = name + ("/recurrent" if mode == "recurrent" else "")
        r = ref
        if mode == "recurrent" and c["lengths"] is not None:
            r = ref_for(None)       # `op --mode recurrent` takes no lengths
        try:
            got = run_op(exe, c, folder, mode, device)
        except RuntimeError as e:
            failures.append((c, key, str(e)))
            continue
        st = stats.setdefault(key, {"cases": 0, "fig": {}, "bound": {}, "degenerate": 0})
        st["cases"] += 1
        if "params" in got:
            # the parameters drawn from the seed: exactly the README's rule
            p = got.pop("params")
            if not np.array_equal(p, r["params"]):
                i = int(np.argwhere(p != r["params"])[0][0])
                failures.append((c, key, "params.npy differs from the seed's draw, first at %d: %.9g vs %.9g" %
                                 (i, p[i], r["params"][i])))
        for n, a in got.items():
            fig, bound, msg = compare(a, r[n], r["mag_" + n])
            tol = tolerance(c)
            if fig is None and r["mag_" + n].max() > 0:
                st["degenerate"] += 1
            for which, e in (("fig", fig), ("bound", bound)):
                if e is None:
                    continue
                keep_worst(st[which], n, e, c["idx"])
            if verbose:
                print("  %-27s %-3s max|err|/max|ref| %s  max|err|/mag %.2e" %
                      (key, n, "degenerate" if fig is None else "%.2e" % fig, bound))
            if msg is not None:
                failures.append((c, key, "%s: %s" % (n, msg)))
            elif not bound <= tol:
                failures.append((c, key, "%s: max |err|/mag = %.3e, over the tolerance "
                                 "%.0e (max|err|/max|ref| = %s)" %
                                 (n, bound, tol, "degenerate" if fig is None else "%.3e" % fig)))


def merge_stats(into, part):
    """Adds one case's figures (check_case's stats) to the run's: call counts add up, the
    worst figure per tensor is kept with its case (the earlier case on a tie, as when the
    cases are checked one after the other)."""
    for key, st in part.items():
        g = into.setdefault(key, {"cases": 0, "fig": {}, "bound": {}, "degenerate": 0})
        g["cases"] += st["cases"]
        g["degenerate"] += st["degenerate"]
        for which in ("fig", "bound"):
            for n, (e, ci) in st[which].items():
                keep_worst(g[which], n, e, ci)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attnbench", help="path of the built attnbench binary")
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--seed", type=int, default=20240607)
    ap.add_argument("--case", type=int, help="run only this case number")
    ap.add_argument("--variant", help="run only this variant (one that the binary lists)")
    ap.add_argument("--max-n", type=int, default=70, help="largest sequence length (>= 2)")
    ap.add_argument("--max-d", type=int, default=12, help="largest D and M")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="the device `attnbench op` runs on (cuda: a GPU, or the CPU emulator "
                         "with the attnbench-emu binary)")
    ap.add_argument("--progress", type=int, default=0, metavar="K",
                    help="print a line after every K cases (0: none)")
    ap.add_argument("--jobs", type=int, default=1, metavar="J", help="cases checked at a time (default 1)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.progress < 0:
        ap.error("--progress %d: must be >= 0" % args.progress)
    if args.jobs < 1:
        ap.error("--jobs %d: must be >= 1" % args.jobs)
    if args.verbose:
        args.jobs = 1       # -v prints while a case runs: one at a time keeps the lines together
    exe = os.path.abspath(args.attnbench)
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        print("crosscheck: error: %s is not an executable" % exe)
        return 2

    # The variants and modes to check are the binary's own (`list --json`); every one of
    # them needs a reference here, or the test fails.
    try:
        listing = read_listing(exe)
    except RuntimeError as e:
        print("crosscheck: error: %s" % e)
        return 2
    problems = coverage(listing)
    if problems:
        print("crosscheck: FAILED: %s lists what this cross-check has no reference for "
              "(tests/crosscheck/xcheck.py):" % args.attnbench)
        for m in problems:
            print("  " + m)
        return 1
    variants = [v for v in listing["variants"] if args.device in v["devices"]]
    for v in listing["variants"]:
        if args.device not in v["devices"]:
            print("crosscheck: %s does not run on %s in this build: not checked" % (v["name"], args.device))
    if not variants:
        print("crosscheck: error: no variant runs on %s in this build" % args.device)
        return 2
    if args.variant is not None and args.variant not in [v["name"] for v in variants]:
        print("crosscheck: error: --variant %s: not one of %s" %
              (args.variant, ", ".join(v["name"] for v in variants)))
        return 2
    modes_of = {v["name"]: set(v["modes"]) for v in variants}

    t0 = time.time()
    selftest_philox()
    selftest_coverage(listing)
    selftest_gradients()
    t_self = time.time() - t0

    idxs = [args.case] if args.case is not None else range(args.cases)
    stats, failures = {}, []
    redrawn = 0
    with tempfile.TemporaryDirectory(prefix="xcheck-") as tmp:
        def one(i):
            """Case i on its own: its case, figures and disagreements (merged in case order)."""
            c = make_case(args.seed, i, variants, args.variant, args.max_n, args.max_d, args.device)
            if args.verbose:
                print(describe(c))
            st, fl = {}, []
            folder = os.path.join(tmp, "c%d" % i)
            check_case(exe, c, folder, st, fl, args.verbose, args.device, modes_of)
            shutil.rmtree(folder, ignore_errors=True)
            return c, st, fl

        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for n_done, (c, st, fl) in enumerate(pool.map(one, idxs), 1):
                redrawn += c["redrawn"]
                merge_stats(stats, st)
                failures += fl
                if args.progress and n_done % args.progress == 0:
                    # a part stopped by its time limit still says how far it got
                    print("crosscheck: progress: %d cases checked, %d disagreements, %.1f s" %
                          (n_done, len(failures), time.time() - t0), flush=True)
    elapsed = time.time() - t0

    worst = (-1.0, None, None, None)
    for key in sorted(stats):
        st = stats[key]
        figs = ", ".join("%s %.1e" % (n, st["fig"][n][0]) for n in TENSORS if n in st["fig"])
        bounds = []
        for n in TENSORS:
            if n in st["bound"]:
                e, ci = st["bound"][n]
                bounds.append("%s %.1e (case %d)" % (n, e, ci))
                tol = TOL_TF32 if key.endswith("[tf32]") or "[tf32]/" in key else TOL
                if e / tol > worst[0]:
                    worst = (e / tol, key, n, ci)
        print("crosscheck: %-26s %3d calls; worst max|err|/max|ref|: %s%s; max |err|/mag: %s" %
              (key, st["cases"], figs,
               " (%d degenerate tensors left out)" % st["degenerate"] if st["degenerate"] else "",
               ", ".join(bounds)))
    if worst[1] is not None:
        wc = make_case(args.seed, worst[3], variants, args.variant, args.max_n, args.max_d, args.device)
        print("crosscheck: closest to its tolerance: %s of %s at %.0f%% of it, %s" %
              (worst[2], worst[1], 100 * worst[0], describe(wc)))
    print("crosscheck: %d cases, %d attnbench calls on %s, seed %d, %.1f s (reference self-test %.1f s); "
          "%d LSH query rows redrawn away from hash ties" %
          (len(idxs), sum(s["cases"] for s in stats.values()), args.device, args.seed, elapsed, t_self,
           redrawn))
    if failures:
        print("crosscheck: FAILED: %d disagreements" % len(failures))
        for c, key, msg in failures[:20]:
            print("  %s [%s]: %s\n    reproduce: %s %s %s --seed %d --case %d%s -v" % (
                describe(c), key, msg, os.path.basename(sys.executable), sys.argv[0],
                args.attnbench, args.seed, c["idx"],
                (" --variant " + args.variant if args.variant else "") +
                (" --max-n %d" % args.max_n if args.max_n != 70 else "") +
                (" --max-d %d" % args.max_d if args.max_d != 12 else "") +
                (" --device " + args.device if args.device != "cpu" else "")))
        return 1
    print("crosscheck: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
