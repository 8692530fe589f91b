#!/usr/bin/env python3
"""PyTorch eager peer of `attnbench bench`: the same sweep config, the same protocol,
the same run document, so that experiments/sweep/compare_torch.py can put the two side
by side.

    torch_bench.py CONFIG.json [--set KEY=VALUE].. [--device cpu|cuda] [--threads N]
                   [--map LABEL=METHOD[,METHOD..]].. [--out FILE] [--quiet]
    torch_bench.py --list

CONFIG is an `attnbench bench` sweep config (experiments/sweep/*.json: lengths, heads,
qk_dim, v_dim, causal, batch rule, warmup, repeats, time_budget_s, memory_limit_gib,
seed, recurrent contexts/steps/batch, gemm), validated as attnbench does, with --set
overriding a value by its dotted path (--set 'lengths=[256,512]'). Each variant label
of the config is mapped to PyTorch methods (--list prints them):

  softmax, stateful-softmax  -> parallel: softmax (eager: matmul, mask, softmax, matmul)
                                and sdpa (scaled_dot_product_attention, when the
                                installed PyTorch has it; else recorded as skipped);
                                recurrent (stateful-softmax): kv_cache_step
  linear (feature_map elu)   -> parallel: linear_chunked (causal) or linear_global
                                (non-causal); recurrent: linear_rnn_step
  linear (feature_map favor) -> parallel: favor_chunked (causal) or favor_global
                                (non-causal): the same linear paths on FAVOR+ features
  efficient                  -> parallel: efficient
  local                      -> parallel: local_blocked
  linformer                  -> parallel: linformer
  anything else              -> no peer: its points are recorded as skipped

--map LABEL=METHOD[,METHOD..] (or LABEL=none) replaces a label's methods. Records
carry the method as "variant" and the labels it stands against as "peer_of"; a method
mapped from two labels with the same options runs once.

Protocol, as attnbench's (experiments/sweep/sweep_measure.c): per point a first
forward+backward call (the time-budget probe: over time_budget_s is "timeout"), the
rest of the warm-up, then `repeats` timed forwards and `repeats` timed
forward+backwards (fewer when 1.5x the first call times them would pass the budget);
median, p20, p80 by linear interpolation. Forwards run with autograd on (the graph is
built, as attnbench's forward saves its state for backward); fwd+bwd is the gradient
of sum(out * dout). A point whose estimated memory passes memory_limit_gib is "oom"
without running (on the CPU an allocation past the machine's memory would not fail
cleanly; on CUDA, where it does, only when the config sets memory_limit_gib), as is one
that runs out; a method's larger lengths are then "skipped". The
recurrent side: per context T, a prefill of T positions, then `steps` timed steps at
positions T, T+1, ... (no autograd), each timed alone. Timers: the host clock around
each call, after torch.cuda.synchronize() on CUDA.

Memory: on CUDA torch.cuda.max_memory_allocated() over the point minus the bytes
allocated before it (inputs excluded). On the CPU the bytes PyTorch's CPU allocator
has live beyond the inputs at the peak of one more (untimed) fwd+bwd step, from its
profiler's allocation events (profile_memory=True), and beside it the process's RSS
growth over that step (VmHWM after resetting it through /proc/self/clear_refs, less
VmRSS before); the document's "memory" section says which one peak_bytes holds.

Output: a run document (schema attnbench/run/1, the same record fields as attnbench
bench; default results/NAME-torch.json) and a TSV beside it, rewritten after every
point. Bad arguments, a bad config or an unknown method: one line on stderr, exit 2.
"""
import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

PROG = "torch_bench"

# ---------------------------------------------------------------- config ----

TOP_KEYS = ["name", "description", "variants", "lengths", "heads", "qk_dim", "v_dim", "causal", "batch", "warmup",
            "repeats", "time_budget_s", "memory_limit_gib", "seed", "recurrent", "gemm"]
VARIANT_OPTIONS = {
    "softmax": ["scale"],
    "stateful-softmax": ["scale"],
    "linear": ["feature_map", "eps", "chunk", "features"],
    "polynomial": ["c", "scale", "eps", "chunk"],
    "lsh": ["rounds", "bits", "chunk", "combine", "scale"],
    "efficient": [],
    "local": ["window", "scale"],
    "linformer": ["k", "share", "scale"],
}
TSV_COLUMNS = ["kind", "variant", "len", "context", "batch", "heads", "qk_dim", "v_dim", "causal", "status",
               "fwd_ms.median", "fwd_ms.p20", "fwd_ms.p80", "fwd_bwd_ms.median", "fwd_bwd_ms.p20", "fwd_bwd_ms.p80",
               "per_sample_fwd_ms", "per_sample_fwd_bwd_ms", "peak_bytes", "peak_bytes_per_sample", "fwd_bwd_gflops",
               "per_position_ms", "state_bytes"]


class BadInput(Exception):
    """A bad argument, config or mapping: one line, exit status 2."""


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise BadInput(f"duplicate key '{k}'")
        d[k] = v
    return d


def load_config(path):
    try:
        with open(path) as f:
            root = json.load(f, object_pairs_hook=_no_duplicates)
    except OSError as e:
        raise BadInput(f"cannot read config {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise BadInput(f"config {path}:{e.lineno}:{e.colno}: {e.msg}")
    except BadInput as e:
        raise BadInput(f"config {path}: {e}")
    if not isinstance(root, dict):
        raise BadInput(f"config {path}: the top level must be a JSON object")
    return root


def apply_set(root, assignment):
    """attnbench's --set KEY=VALUE: a dotted path to an existing key (list indices
    allowed), the value parsed as JSON, else taken as a string."""
    path, eq, text = assignment.partition("=")
    if not eq or not path:
        raise BadInput(f"--set {assignment}: expected KEY=VALUE")
    try:
        val = json.loads(text)
    except json.JSONDecodeError:
        val = text
    cur = root
    toks = path.split(".")
    for i, tok in enumerate(toks):
        last = i == len(toks) - 1
        if isinstance(cur, dict):
            if tok not in cur:
                raise BadInput(f"--set {path}: the config has no key '{tok}'")
            if last:
                cur[tok] = val
            else:
                cur = cur[tok]
        elif isinstance(cur, list) and tok.isdigit():
            idx = int(tok)
            if idx >= len(cur):
                raise BadInput(f"--set {path}: index {idx} is past the end ({len(cur)} elements)")
            if last:
                cur[idx] = val
            else:
                cur = cur[idx]
        else:
            raise BadInput(f"--set {path}: '{tok}' is not inside an object or list")


def _only_keys(obj, where, allowed):
    for k in obj:
        if k not in allowed:
            raise BadInput(f"config: unknown key '{where + '.' if where else ''}{k}' (allowed here: {', '.join(allowed)})")


def _int(obj, where, key, required, default, lo, hi):
    name = f"{where + '.' if where else ''}{key}"
    if key not in obj:
        if required:
            raise BadInput(f"config: missing key '{name}'")
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or v > hi:
        raise BadInput(f"config: '{name}' must be an integer in [{lo}, {hi}]")
    return v


def _num(obj, where, key, default, lo, hi):
    name = f"{where + '.' if where else ''}{key}"
    if key not in obj:
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise BadInput(f"config: '{name}' must be a number in [{lo:g}, {hi:g}]")
    return float(v)


def _str(obj, where, key, required, default=None):
    name = f"{where + '.' if where else ''}{key}"
    if key not in obj:
        if required:
            raise BadInput(f"config: missing key '{name}'")
        return default
    if not isinstance(obj[key], str):
        raise BadInput(f"config: '{name}' must be a string")
    return obj[key]


def _int_list(v, name, lo, hi):
    if not isinstance(v, list):
        raise BadInput(f"config: '{name}' must be a list of integers")
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise BadInput(f"config: '{name}.{i}' must be an integer in [{lo}, {hi}]")
    return list(v)


def parse_config(root):
    """The sweep config as attnbench reads it (sweep_config.c), as a plain dict.
    memory_limit_gib's default depends on the device: None here, filled in later."""
    _only_keys(root, "", TOP_KEYS)
    c = {"name": _str(root, "", "name", True)}
    _str(root, "", "description", False, "")
    vs = root.get("variants")
    if not isinstance(vs, list) or not vs:
        raise BadInput("config: 'variants' must be a non-empty list")
    c["variants"] = []
    labels = set()
    for i, v in enumerate(vs):
        where = f"variants.{i}"
        if not isinstance(v, dict):
            raise BadInput(f"config: '{where}' must be an object")
        _only_keys(v, where, ["label", "variant", "set", "modes"])
        name = _str(v, where, "variant", True)
        if name not in VARIANT_OPTIONS:
            raise BadInput(f"config: {where}: unknown variant '{name}' (known: {', '.join(VARIANT_OPTIONS)})")
        label = _str(v, where, "label", False, name)
        if label in labels:
            raise BadInput(f"config: {where}: label '{label}' is used twice")
        labels.add(label)
        modes = v.get("modes")
        par = rec = modes is None
        if modes is not None:
            if not isinstance(modes, list) or not modes:
                raise BadInput(f"config: '{where}.modes' must be a non-empty list of \"parallel\", \"recurrent\"")
            for mi, m in enumerate(modes):
                if m == "parallel":
                    par = True
                elif m == "recurrent":
                    rec = True
                else:
                    raise BadInput(f"config: '{where}.modes.{mi}' must be \"parallel\" or \"recurrent\"")
        settings = v.get("set", {})
        if not isinstance(settings, dict):
            raise BadInput(f"config: '{where}.set' must be an object")
        for k, x in settings.items():
            if k not in VARIANT_OPTIONS[name]:
                raise BadInput(f"config: {where}: variant '{name}' has no option '{k}' "
                               f"(options: {', '.join(VARIANT_OPTIONS[name])})")
            if isinstance(x, bool) or not isinstance(x, (str, int, float)):
                raise BadInput(f"config: '{where}.set.{k}' must be a string or a number")
        c["variants"].append({"label": label, "variant": name, "set": dict(settings), "parallel": par,
                              "recurrent": rec})
    if "lengths" not in root:
        raise BadInput("config: missing key 'lengths'")
    c["lengths"] = _int_list(root["lengths"], "lengths", 1, 1 << 24)
    c["heads"] = _int(root, "", "heads", True, 0, 1, 4096)
    c["qk_dim"] = _int(root, "", "qk_dim", True, 0, 1, 65536)
    c["v_dim"] = _int(root, "", "v_dim", True, 0, 1, 65536)
    causal = root.get("causal", True)
    if not isinstance(causal, bool):
        raise BadInput("config: 'causal' must be true or false")
    c["causal"] = causal
    b = root.get("batch")
    if not isinstance(b, dict):
        raise BadInput("config: 'batch' must be an object {\"rule\": \"fixed\"|\"scaled\", ...}")
    _only_keys(b, "batch", ["rule", "size", "tokens", "max"])
    rule = _str(b, "batch", "rule", True)
    if rule == "fixed":
        c["batch"] = {"rule": "fixed", "size": _int(b, "batch", "size", True, 1, 1, 1 << 20)}
    elif rule == "scaled":
        c["batch"] = {"rule": "scaled", "tokens": _int(b, "batch", "tokens", True, 0, 1, 1 << 32),
                      "max": _int(b, "batch", "max", False, 1 << 20, 1, 1 << 20)}
    else:
        raise BadInput(f"config: 'batch.rule' = '{rule}': must be \"fixed\" or \"scaled\"")
    c["warmup"] = _int(root, "", "warmup", False, 1, 0, 1000)
    c["repeats"] = _int(root, "", "repeats", False, 5, 1, 100000)
    c["time_budget_s"] = _num(root, "", "time_budget_s", 30.0, 1e-3, 1e6)
    c["memory_limit_gib"] = _num(root, "", "memory_limit_gib", None, 1e-6, 1e6)
    c["seed"] = _int(root, "", "seed", False, 0, 0, (1 << 63) - 1)
    c["contexts"], c["steps"], c["rec_batch"] = [], 32, 1
    r = root.get("recurrent")
    if r is not None:
        if not isinstance(r, dict):
            raise BadInput("config: 'recurrent' must be an object")
        _only_keys(r, "recurrent", ["contexts", "steps", "batch"])
        if "contexts" not in r:
            raise BadInput("config: missing key 'recurrent.contexts'")
        c["contexts"] = _int_list(r["contexts"], "recurrent.contexts", 0, 1 << 24)
        c["steps"] = _int(r, "recurrent", "steps", False, 32, 1, 1 << 20)
        c["rec_batch"] = _int(r, "recurrent", "batch", False, 1, 1, 1 << 16)
    c["gemm_size"], c["gemm_repeats"] = 2048, 5
    g = root.get("gemm")
    if g is not None:
        if not isinstance(g, dict):
            raise BadInput("config: 'gemm' must be an object")
        _only_keys(g, "gemm", ["size", "repeats"])
        c["gemm_size"] = _int(g, "gemm", "size", False, 2048, 0, 16384)
        c["gemm_repeats"] = _int(g, "gemm", "repeats", False, 5, 1, 1000)
    return c


def batch_for(c, n):
    if c["batch"]["rule"] == "fixed":
        return c["batch"]["size"]
    return max(1, min(c["batch"]["tokens"] // n, c["batch"]["max"]))

# --------------------------------------------------------------- methods ----

METHODS = {
    "softmax": ("parallel", "eager softmax attention: (Q K^T) * scale, masked_fill(-inf) above the diagonal when "
                            "causal, softmax, @ V (materialises B*H*N*N scores)"),
    "sdpa": ("parallel", "torch.nn.functional.scaled_dot_product_attention(is_causal=causal) (PyTorch >= 2.0 picks "
                         "its kernel: flash, memory-efficient or math)"),
    "linear_chunked": ("parallel", "causal linear attention (elu+1), chunk-parallel: per chunk c, "
                                   "O_c = phi(Q_c) S_<c + (phi(Q_c) phi(K_c)^T, lower-triangular) [V_c, 1]; "
                                   "S_<c an exclusive prefix sum of phi(K_c)^T [V_c, 1]; out = O[:M] / (O[M] + eps)"),
    "linear_global": ("parallel", "non-causal linear attention (elu+1): S = phi(K)^T [V, 1], O = phi(Q) S, "
                                  "out = O[:M] / (O[M] + eps)"),
    "favor_chunked": ("parallel", "causal linear attention on FAVOR+ features, as linear_chunked: W [m x D] drawn per "
                                  "call (Gaussian D x D blocks orthogonalised by torch.linalg.qr, rows scaled by "
                                  "chi norms), phi(x) = m^-1/2 exp(W x' - |x'|^2/2 - max), x' = D^-1/4 x, the "
                                  "maximum per query row and over all keys of a slice (Performer's stabiliser)"),
    "favor_global": ("parallel", "non-causal linear attention on FAVOR+ features (as favor_chunked), as "
                                 "linear_global"),
    "efficient": ("parallel", "Efficient Attention: softmax(q, dim=-1) @ (softmax(k, dim=-2)^T @ v), non-causal"),
    "local_blocked": ("parallel", "sliding-window softmax in blocks of 64 query rows: keys padded, unfolded into "
                                  "overlapping spans of 64 + w - 1 (causal) or 64 + 2(w - 1) columns (a view), "
                                  "scores by one batched matmul, the band masked (a precomputed mask), softmax, "
                                  "@ the values' spans"),
    "linformer": ("parallel", "Linformer: E, F (k x N parameters with requires_grad, uniform(+-1/sqrt(N)); F = E "
                              "for share kv or layer) project keys and values along the sequence, Kp = E @ k, "
                              "Vp = F @ v (matmul broadcast over B, H), then softmax(q Kp^T * scale) @ Vp; "
                              "backward gives dE, dF as attnbench's does"),
    "kv_cache_step": ("recurrent", "softmax decoding step: k, v copied into a preallocated cache at position t, "
                                   "softmax(q K[:t+1]^T * scale) V[:t+1]"),
    "linear_rnn_step": ("recurrent", "linear attention RNN step (elu+1): S += phi(k) v^T, Z += phi(k), "
                                     "out = phi(q)^T S / (phi(q)^T Z + eps)"),
}


def default_methods(v, causal):
    """(parallel methods, recurrent methods, reason when there is no peer) of a
    config variant."""
    name, s = v["variant"], v["set"]
    if name == "softmax":
        return ["softmax", "sdpa"], [], None
    if name == "stateful-softmax":
        return ["softmax", "sdpa"], ["kv_cache_step"], None
    if name == "linear" and str(s.get("feature_map", "elu")) == "elu":
        return ["linear_chunked" if causal else "linear_global"], ["linear_rnn_step"], None
    if name == "linear" and str(s.get("feature_map")) == "favor":
        return ["favor_chunked" if causal else "favor_global"], [], None
    if name == "efficient":
        return ["efficient"], [], None
    if name == "local":
        return ["local_blocked"], [], None
    if name == "linformer":
        return ["linformer"], [], None
    what = f"{name} with feature_map={s['feature_map']}" if name == "linear" else name
    return [], [], f"no PyTorch peer for {what} in torch_bench.py"


def method_options(method, v, device):
    """The options a method takes from the variant it stands against."""
    s = v["set"]
    o = {}
    if method in ("softmax", "sdpa", "kv_cache_step"):
        if "scale" in s:
            o["scale"] = float(s["scale"])
    elif method == "efficient":
        if v["variant"] != "efficient":
            raise BadInput(f"--map {v['label']}={method}: efficient stands against the efficient variant only")
    elif method == "linformer":
        if v["variant"] != "linformer":
            raise BadInput(f"--map {v['label']}={method}: linformer stands against the linformer variant only")
        o["k"] = int(s.get("k", 256))
        o["share"] = str(s.get("share", "none"))
        if "scale" in s:
            o["scale"] = float(s["scale"])
    elif method == "local_blocked":
        if v["variant"] != "local":
            raise BadInput(f"--map {v['label']}={method}: local_blocked stands against the local variant only")
        o["window"] = int(s.get("window", 256))
        if "scale" in s:
            o["scale"] = float(s["scale"])
    elif method in ("favor_chunked", "favor_global"):
        if v["variant"] != "linear" or str(s.get("feature_map")) != "favor":
            raise BadInput(f"--map {v['label']}={method}: the favor methods stand against linear with "
                           "feature_map=favor only")
        o["eps"] = float(s.get("eps", 1e-6))
        f = s.get("features", "auto")
        o["features"] = None if f == "auto" else int(f)
        if method == "favor_chunked":
            ch = s.get("chunk", "auto")
            o["chunk"] = (64 if device == "cuda" else 32) if ch == "auto" else int(ch)
    else:
        fm = str(s.get("feature_map", "elu"))
        if v["variant"] != "linear" or fm != "elu":
            raise BadInput(f"--map {v['label']}={method}: the linear methods implement linear attention with the "
                           f"elu+1 feature map only (this label is {v['variant']}"
                           f"{' with feature_map=' + fm if v['variant'] == 'linear' else ''})")
        o["eps"] = float(s.get("eps", 1e-6))
        if method == "linear_chunked":
            ch = s.get("chunk", "auto")
            if ch == "auto":
                ch = 64 if device == "cuda" else 32  # attnbench's automatic chunk
            try:
                ch = int(ch)
            except (TypeError, ValueError):
                raise BadInput(f"config: {v['label']}: chunk '{ch}' is not an integer or auto")
            if ch < 1:
                raise BadInput(f"config: {v['label']}: chunk must be at least 1")
            o["chunk"] = ch
    return o


def plan(c, maps, device):
    """Jobs per side: [{method, variant (record name), options, peer_of}], and the
    labels without a peer, with the reason."""
    labels = {v["label"]: v for v in c["variants"]}
    chosen = {}
    for m in maps:
        label, eq, names = m.partition("=")
        if not eq or not label:
            raise BadInput(f"--map {m}: expected LABEL=METHOD[,METHOD..] or LABEL=none")
        if label not in labels:
            raise BadInput(f"--map {m}: the config has no variant labelled '{label}' (labels: {', '.join(labels)})")
        ms = [] if names == "none" else [x for x in names.split(",") if x]
        for x in ms:
            if x not in METHODS:
                raise BadInput(f"--map {m}: unknown method '{x}' (known: {', '.join(METHODS)})")
        chosen[label] = ms
    sides = {"parallel": [], "recurrent": []}
    no_peer = []
    for v in c["variants"]:
        if v["label"] in chosen:
            ms = chosen[v["label"]]
            par = [x for x in ms if METHODS[x][0] == "parallel"]
            rec = [x for x in ms if METHODS[x][0] == "recurrent"]
            why = f"mapped to no PyTorch method (--map {v['label']}=...)"
        else:
            par, rec, why = default_methods(v, c["causal"])
        for side, ms, on in (("parallel", par, v["parallel"]), ("recurrent", rec, v["recurrent"] and c["contexts"])):
            if not on:
                continue
            if not ms:
                if side == "parallel":  # recorded as skipped; a recurrent side without a peer is left out
                    no_peer.append((side, v, why or "no PyTorch parallel method mapped"))
                continue
            for x in ms:
                opts = method_options(x, v, device)
                same = [j for j in sides[side] if j["method"] == x]
                match = [j for j in same if j["options"] == opts]
                if match:
                    match[0]["peer_of"].append(v["label"])
                    continue
                name = x if not same else f"{x}-{v['label']}"
                sides[side].append({"method": x, "variant": name, "options": opts, "peer_of": [v["label"]]})
    return sides, no_peer

# ----------------------------------------------------- torch implementations ----


def make_parallel(torch, method, causal, options, n, device):
    """fn(q, k, v) -> out for one parallel method at length n ([B, H, N, D] inputs),
    and the bytes of what it keeps between calls (the causal mask). None with a reason
    when the installed PyTorch lacks the method."""
    F = torch.nn.functional
    if method == "softmax":
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), 1) if causal else None
        scale = options.get("scale")

        def softmax(q, k, v):
            sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
            s = torch.matmul(q, k.transpose(-1, -2)) * sc
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            return torch.matmul(torch.softmax(s, dim=-1), v)
        return softmax, (mask.numel() if mask is not None else 0), None
    if method == "sdpa":
        sdpa = getattr(F, "scaled_dot_product_attention", None)
        if sdpa is None:
            return None, 0, (f"torch {torch.__version__} has no torch.nn.functional.scaled_dot_product_attention "
                             "(added in PyTorch 2.0)")
        kw = {}
        if "scale" in options:
            kw["scale"] = options["scale"]  # PyTorch >= 2.1

        def sdpa_fn(q, k, v):
            return sdpa(q, k, v, is_causal=causal, **kw)
        return sdpa_fn, 0, None
    if method == "linear_chunked":
        if not causal:
            return None, 0, "linear_chunked is the causal form (the config is non-causal: map to linear_global)"
        C, eps = options["chunk"], options["eps"]
        tri = torch.tril(torch.ones(C, C, dtype=torch.float32, device=device))

        def linear_chunked(q, k, v):
            return linear_chunked_fn(torch, q, k, v, C, eps, tri)
        return linear_chunked, tri.numel() * 4, None
    if method == "linear_global":
        if causal:
            return None, 0, "linear_global is the non-causal form (the config is causal: map to linear_chunked)"
        eps = options["eps"]

        def linear_global(q, k, v):
            Q, K = F.elu(q) + 1.0, F.elu(k) + 1.0
            Vx = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
            O = torch.matmul(Q, torch.matmul(K.transpose(-1, -2), Vx))
            M = v.shape[-1]
            return O[..., :M] / (O[..., M:] + eps)
        return linear_global, 0, None
    if method in ("favor_chunked", "favor_global"):
        want_causal = method == "favor_chunked"
        if causal != want_causal:
            return None, 0, f"{method} is the {'' if want_causal else 'non-'}causal form"
        eps, C = options["eps"], options.get("chunk")
        tri = torch.tril(torch.ones(C, C, dtype=torch.float32, device=device)) if C else None
        gen = torch.Generator(device="cpu")

        def favor(q, k, v):
            D = q.shape[-1]
            m = options["features"] or 2 * D
            gen.manual_seed(12345)  # a fixed W: the timing is what is compared
            Wt = favor_projection(torch, D, m, gen).to(q.device)
            Q, K = favor_features(torch, q, Wt, True), favor_features(torch, k, Wt, False)
            if want_causal:
                return linear_chunked_core(torch, Q, K, v, C, eps, tri)
            Vx = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
            O = torch.matmul(Q, torch.matmul(K.transpose(-1, -2), Vx))
            M = v.shape[-1]
            return O[..., :M] / (O[..., M:] + eps)
        return favor, (tri.numel() * 4 if tri is not None else 0), None
    if method == "efficient":
        if causal:
            return None, 0, "Efficient Attention is non-causal only"

        def efficient(q, k, v):
            return torch.matmul(torch.softmax(q, dim=-1), torch.matmul(torch.softmax(k, dim=-2).transpose(-1, -2), v))
        return efficient, 0, None
    if method == "linformer":
        if causal:
            return None, 0, "Linformer is non-causal only"
        P, scale = options["k"], options.get("scale")
        gen = torch.Generator(device="cpu")
        gen.manual_seed(12345)
        bound = 1.0 / math.sqrt(n)
        E = ((torch.rand(P, n, generator=gen) * 2 - 1) * bound).to(device).requires_grad_(True)
        Fm = E if options["share"] != "none" else \
            ((torch.rand(P, n, generator=gen) * 2 - 1) * bound).to(device).requires_grad_(True)

        def linformer(q, k, v):
            sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
            kp, vp = torch.matmul(E, k), torch.matmul(Fm, v)                  # B,H,k,D and B,H,k,M
            p = torch.softmax(torch.matmul(q, kp.transpose(-1, -2)) * sc, dim=-1)
            return torch.matmul(p, vp)
        linformer.params = (E, Fm)  # the tests read them
        return linformer, 4 * P * n * (1 if Fm is E else 2), None
    if method == "local_blocked":
        w, Tb = options["window"], 64
        nb = min(-(-(w - 1) // Tb), -(-n // Tb) - 1) if w > 1 else 0
        na = 0 if causal else nb
        nblk = -(-n // Tb)
        span = (nb + 1 + na) * Tb
        # allowed[c, i, j]: query c*Tb + i and key (c - nb)*Tb + j (padding queries may see
        # anything in range, so that no row is empty)
        qi = (torch.arange(nblk, device=device)[:, None, None] * Tb + torch.arange(Tb, device=device)[None, :, None])
        kj = ((torch.arange(nblk, device=device)[:, None, None] - nb) * Tb + torch.arange(span, device=device)[None, None, :])
        band = (kj <= qi) & (kj > qi - w) if causal else (kj > qi - w) & (kj < qi + w)
        allowed = ((kj >= 0) & (kj < n) & (band | (qi >= n)))
        scale = options.get("scale")

        def local_blocked(q, k, v):
            B, H, N, D = q.shape
            M = v.shape[-1]
            sc = scale if scale is not None else 1.0 / math.sqrt(D)
            pad = nblk * Tb - N
            qb = F.pad(q, (0, 0, 0, pad)).reshape(B, H, nblk, Tb, D)
            kw = F.pad(k, (0, 0, nb * Tb, pad + na * Tb)).unfold(2, span, Tb)      # B,H,nblk,D,span
            vw = F.pad(v, (0, 0, nb * Tb, pad + na * Tb)).unfold(2, span, Tb)      # B,H,nblk,M,span
            s = torch.matmul(qb, kw) * sc                                           # B,H,nblk,Tb,span
            p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
            out = torch.matmul(p, vw.transpose(-1, -2))                             # B,H,nblk,Tb,M
            return out.reshape(B, H, nblk * Tb, M)[:, :, :N]
        return local_blocked, allowed.numel(), None
    raise ValueError(method)


def favor_projection(torch, D, m, gen):
    """[D, m]: m rows of Gaussian D x D blocks orthogonalised (QR), scaled by chi norms,
    transposed for x @ W^T."""
    blocks = []
    for _ in range(-(-m // D)):
        g = torch.randn(D, D, generator=gen)
        qm, _ = torch.linalg.qr(g)
        blocks.append(qm.T)
    W = torch.cat(blocks, dim=0)[:m] * torch.randn(m, D, generator=gen).norm(dim=1, keepdim=True)
    return W.T.contiguous()


def favor_features(torch, x, Wt, is_query):
    """m^-1/2 exp(x' W^T - |x'|^2/2 - max): the maximum per row for queries, over all of a
    slice's keys for keys (both cancel in linear attention's ratio)."""
    D, m = x.shape[-1], Wt.shape[-1]
    xp = x * D ** -0.25
    a = torch.matmul(xp, Wt) - 0.5 * (xp * xp).sum(-1, keepdim=True)
    a = a - (a.amax(-1, keepdim=True) if is_query else a.amax(dim=(-2, -1), keepdim=True))
    return torch.exp(a) * m ** -0.5


def linear_chunked_fn(torch, q, k, v, C, eps, tri=None):
    """Causal linear attention (elu+1) in chunks of C positions: the values carry a
    column of ones, so one product gives the numerator and the denominator."""
    F = torch.nn.functional
    return linear_chunked_core(torch, F.elu(q) + 1.0, F.elu(k) + 1.0, v, C, eps, tri)


def linear_chunked_core(torch, Q, K, v, C, eps, tri=None):
    """linear_chunked_fn on given features Q, K [B, H, N, C_features]."""
    F = torch.nn.functional
    B, H, N, D = Q.shape
    M = v.shape[-1]
    if tri is None:
        tri = torch.tril(torch.ones(C, C, dtype=Q.dtype, device=Q.device))
    Vx = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    pad = (-N) % C
    if pad:  # zero features past the end: they add nothing to any state
        Q, K, Vx = F.pad(Q, (0, 0, 0, pad)), F.pad(K, (0, 0, 0, pad)), F.pad(Vx, (0, 0, 0, pad))
    nc = (N + pad) // C
    Qc, Kc, Vc = Q.reshape(B, H, nc, C, D), K.reshape(B, H, nc, C, D), Vx.reshape(B, H, nc, C, M + 1)
    states = torch.matmul(Kc.transpose(-1, -2), Vc)                       # B,H,nc,D,M+1
    prev = torch.cumsum(states, dim=2)
    prev = torch.cat([torch.zeros_like(prev[:, :, :1]), prev[:, :, :-1]], dim=2)  # exclusive
    A = torch.matmul(Qc, Kc.transpose(-1, -2)) * tri                      # B,H,nc,C,C
    O = torch.matmul(Qc, prev) + torch.matmul(A, Vc)
    O = O.reshape(B, H, nc * C, M + 1)[:, :, :N]
    return O[..., :M] / (O[..., M:] + eps)


class KVCacheStep:
    """Softmax decoding with a preallocated key/value cache of `cap` positions."""

    def __init__(self, torch, options, B, H, D, M, cap, device):
        self.torch = torch
        self.K = torch.zeros(B, H, cap, D, device=device)
        self.V = torch.zeros(B, H, cap, M, device=device)
        self.scale = options.get("scale", 1.0 / math.sqrt(D))

    def state_bytes(self):
        return (self.K.numel() + self.V.numel()) * 4

    def prefill(self, k, v):
        T = k.shape[2]
        self.K[:, :, :T].copy_(k)
        self.V[:, :, :T].copy_(v)

    def step(self, t, q, k, v):
        """q, k: [B, H, D]; v: [B, H, M]; position t. Returns [B, H, M]."""
        torch = self.torch
        self.K[:, :, t].copy_(k)
        self.V[:, :, t].copy_(v)
        s = torch.matmul(self.K[:, :, :t + 1], q.unsqueeze(-1)).squeeze(-1) * self.scale   # B,H,t+1
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p.unsqueeze(-2), self.V[:, :, :t + 1]).squeeze(-2)


class LinearRNNStep:
    """Linear attention (elu+1) as an RNN: state S [D, M] and Z [D] per slice."""

    def __init__(self, torch, options, B, H, D, M, cap, device):
        self.torch = torch
        self.S = torch.zeros(B, H, D, M, device=device)
        self.Z = torch.zeros(B, H, D, device=device)
        self.eps = options.get("eps", 1e-6)

    def state_bytes(self):
        return (self.S.numel() + self.Z.numel()) * 4

    def prefill(self, k, v):
        fk = self.torch.nn.functional.elu(k) + 1.0
        self.S.copy_(self.torch.matmul(fk.transpose(-1, -2), v))
        self.Z.copy_(fk.sum(dim=2))

    def step(self, t, q, k, v):
        F = self.torch.nn.functional
        fk, fq = F.elu(k) + 1.0, F.elu(q) + 1.0
        self.S.add_(fk.unsqueeze(-1) * v.unsqueeze(-2))
        self.Z.add_(fk)
        num = self.torch.matmul(fq.unsqueeze(-2), self.S).squeeze(-2)     # B,H,M
        den = (fq * self.Z).sum(dim=-1, keepdim=True)
        return num / (den + self.eps)


RECURRENT = {"kv_cache_step": KVCacheStep, "linear_rnn_step": LinearRNNStep}


def estimated_extra_bytes(method, device, B, H, N, D, M, options):
    """Upper estimate of what a fwd+bwd step allocates beyond q, k, v, out, dout and
    the gradients (checked against the measured peaks at small N)."""
    bh = B * H
    if method == "softmax" or (method == "sdpa" and device == "cpu"):
        # scores, masked scores, probabilities, a gradient of each at the peak (about 3 N x N
        # measured), and the mask
        return 4.0 * 4 * bh * N * N + N * N
    if method == "sdpa":
        return 4.0 * 4 * bh * N * (D + M)
    if method == "linear_chunked":
        C = options["chunk"]
        nc = -(-N // C)
        return 4.0 * 2 * (6 * bh * nc * C * (D + M + 1) + 3 * bh * nc * D * (M + 1) + 2 * bh * nc * C * C)
    if method in ("favor_chunked", "favor_global"):
        m = options["features"] or 2 * D
        C = options.get("chunk") or 64
        nc = -(-N // C)
        return 4.0 * 2 * (8 * bh * N * (m + M + 1) + 3 * bh * nc * m * (M + 1) + 2 * bh * nc * C * C)
    if method == "local_blocked":
        w = options["window"]
        span = min(N, 64 + 2 * (w - 1)) + 64  # the non-causal span, the larger
        return 4.0 * 6 * bh * N * span + 4.0 * 4 * bh * N * span * (D + M) / 64
    if method == "efficient":
        return 4.0 * 6 * bh * N * (D + M)
    if method == "linformer":
        P = options["k"]
        # scores, probabilities and their gradients (N x k per slice), the projections
        # and their gradients, E, F and their gradients
        return 4.0 * (4 * bh * N * P + 4 * bh * P * (D + M) + 4 * P * N)
    return 4.0 * 2 * (4 * bh * N * (D + M + 1) + 2 * bh * D * (M + 1))

# ------------------------------------------------------------- measurement ----


def quantile(xs, p):
    s = sorted(xs)
    if not s:
        return None
    pos = p * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def stats(ms):
    return {"median": quantile(ms, 0.5), "p20": quantile(ms, 0.2), "p80": quantile(ms, 0.8), "n": len(ms)}


def proc_status(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def is_oom(torch, e):
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(e, oom_type):
        return True
    msg = str(e).lower()
    return isinstance(e, (RuntimeError, MemoryError)) and (
        "out of memory" in msg or "can't allocate memory" in msg or isinstance(e, MemoryError))


class Bench:
    def __init__(self, torch, c, device, quiet):
        self.torch, self.c, self.device, self.quiet = torch, c, device, quiet
        self.cuda = device == "cuda"
        self.gen = torch.Generator(device="cpu")
        self.cpu_mem_api = None  # set by the first profiled step
        self.peak_rss = 0  # the process's peak RSS across the resets of VmHWM

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def timed(self, f):
        self.sync()
        t0 = time.perf_counter()
        r = f()
        self.sync()
        return (time.perf_counter() - t0) * 1e3, r

    def randn(self, stream, *shape):
        self.gen.manual_seed(self.c["seed"] * 1000003 + stream)
        return self.torch.randn(*shape, generator=self.gen).to(self.device)

    def cpu_step_peak(self, f):
        """Peak bytes live in PyTorch's CPU allocator during f() beyond what was live
        before (its profiler's allocation events), and the process's RSS growth."""
        torch = self.torch
        rss0 = proc_status("VmRSS")
        self.peak_rss = max(self.peak_rss, proc_status("VmHWM") or 0)  # the process's peak, before the reset
        rss_ok = reset_peak_rss()
        alloc_peak = None
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                f()
            evs = prof.profiler.kineto_results.events()
            mem = []
            for i, e in enumerate(evs):
                if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"):
                    t = e.start_ns() if hasattr(e, "start_ns") else e.start_us() * 1000
                    mem.append((t, i, e.nbytes()))
            mem.sort()
            run = peak = 0
            for _, _, nb in mem:
                run += nb
                peak = max(peak, run)
            alloc_peak = peak
            self.cpu_mem_api = "profiler"
        except Exception:  # no Kineto, or another profiler interface: RSS only
            f()
            self.cpu_mem_api = self.cpu_mem_api or "rss"
        hwm = proc_status("VmHWM")
        rss_growth = (hwm - rss0) if (rss_ok and hwm is not None and rss0 is not None) else None
        return alloc_peak, rss_growth

    def flops(self, method, B, H, N, D, M, backward, options=None):
        """The counts attnbench's variants give (attention/*.c, attn_flops)."""
        bh, options = B * H, options or {}
        if method in ("softmax", "sdpa"):
            pairs = N * (N + 1) / 2 if self.c["causal"] else N * N
            f = 2 * pairs * (D + M) * bh
        elif method in ("linear_chunked", "linear_global"):
            f = 4 * N * D * (M + 1) * bh
        elif method in ("favor_chunked", "favor_global"):
            f = 4 * N * (options.get("features") or 2 * D) * (M + 1) * bh
        elif method == "efficient":
            f = 4 * N * D * M * bh
        elif method == "linformer":
            f = 4 * N * options["k"] * (D + M) * bh
        elif method == "local_blocked":
            K = min(options["window"], N) - 1
            below = K * N - K * (K + 1) / 2
            f = 2 * (N + (below if self.c["causal"] else 2 * below)) * (D + M) * bh
        else:
            return None
        return 3 * f if backward else f

    def base_record(self, kind, job, B, N, causal):
        c = self.c
        return {"kind": kind, "variant": job["variant"], "variant_name": job.get("method"),
                "method": job.get("method"), "peer_of": job["peer_of"], "options": job.get("options", {}),
                "len": N, "batch": B, "heads": c["heads"], "qk_dim": c["qk_dim"], "v_dim": c["v_dim"],
                "causal": causal}

    def null_timings(self, r):
        for k in ("fwd_ms", "fwd_bwd_ms", "per_sample_fwd_ms", "per_sample_fwd_bwd_ms", "peak_bytes",
                  "peak_bytes_per_sample", "fwd_gflops", "fwd_bwd_gflops"):
            r.setdefault(k, None)

    def run_point(self, job, N, interrupted):
        """One parallel point; returns (record, stop_method)."""
        torch, c = self.torch, self.c
        B, H, D, M = batch_for(c, N), c["heads"], c["qk_dim"], c["v_dim"]
        rec = self.base_record("parallel", job, B, N, c["causal"])
        bh = B * H
        nq, nv = bh * N * D, bh * N * M
        need = 4.0 * (3 * nq + 5 * nv) + estimated_extra_bytes(job["method"], self.device, B, H, N, D, M,
                                                                 job["options"])
        rec["estimated_bytes"] = need
        if need > c["memory_limit_bytes"] and (not self.cuda or c["memory_limit_gib"] is not None):
            rec.update(status="oom", reason="estimated memory exceeds memory_limit_gib")
            self.null_timings(rec)
            return rec, True
        fn = q = k = v = dout = None
        try:
            fn, keep_bytes, why = make_parallel(torch, job["method"], c["causal"], job["options"], N, self.device)
            if fn is None:
                rec.update(status="skipped", reason=why)
                self.null_timings(rec)
                return rec, True
            q = self.randn(0, B, H, N, D).requires_grad_(True)
            k = self.randn(1, B, H, N, D).requires_grad_(True)
            v = self.randn(2, B, H, N, M).requires_grad_(True)
            dout = self.randn(3, B, H, N, M)
            rec["input_bytes"] = 4 * (2 * nq + 2 * nv)
            rec["kept_bytes"] = keep_bytes
            if self.cuda:
                self.sync()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()

            def fwd():
                with torch.enable_grad():
                    return fn(q, k, v)

            def fwd_bwd():
                q.grad = k.grad = v.grad = None
                out = fn(q, k, v)
                out.backward(dout)

            first, _ = self.timed(fwd_bwd)
            rec["first_call_ms"] = first
            budget = c["time_budget_s"] * 1e3
            if first > budget:
                rec.update(status="timeout", reason="one forward+backward call exceeded time_budget_s")
                self.null_timings(rec)
                return rec, True
            reps = int(min(c["repeats"], max(1.0, math.floor(budget / (1.5 * first)))))
            for _ in range(1, c["warmup"]):
                self.timed(fwd_bwd)
            fms, fbms = [], []
            for _ in range(reps):
                if interrupted():
                    break
                t, out = self.timed(fwd)
                del out
                fms.append(t)
            for _ in range(reps):
                if interrupted():
                    break
                fbms.append(self.timed(fwd_bwd)[0])
            if not fms or not fbms:
                rec.update(status="interrupted", reason="interrupted")
                self.null_timings(rec)
                return rec, True
            if self.cuda:
                self.sync()
                peak = torch.cuda.max_memory_allocated() - base
                rec["device_reserved_bytes"] = torch.cuda.max_memory_reserved()
                rec["memory_source"] = "torch.cuda.max_memory_allocated over the point, less the inputs"
            else:
                q.grad = k.grad = v.grad = None
                alloc, rss = self.cpu_step_peak(fwd_bwd)
                rec["peak_alloc_step_bytes"] = alloc
                rec["peak_rss_growth_bytes"] = rss
                peak = alloc if alloc is not None else rss
                rec["memory_source"] = ("torch profiler: CPU allocator bytes live at the peak of one fwd+bwd step, "
                                        "less the inputs" if alloc is not None else
                                        "process RSS growth over one fwd+bwd step (VmHWM reset)")
        except Exception as e:  # noqa: BLE001: recorded, the sweep goes on
            fn = q = k = v = dout = None  # frees the tensors before the next point
            if self.cuda:
                torch.cuda.empty_cache()
            st = "oom" if is_oom(torch, e) else "failed"
            rec.update(status=st, reason=str(e).splitlines()[0] if str(e) else type(e).__name__)
            self.null_timings(rec)
            return rec, True
        fmed, fbmed = quantile(fms, 0.5), quantile(fbms, 0.5)
        rec.update(status="ok", fwd_ms=stats(fms), fwd_bwd_ms=stats(fbms), per_sample_fwd_ms=fmed / B,
                   per_sample_fwd_bwd_ms=fbmed / B, peak_bytes=peak, peak_bytes_per_sample=None if peak is None
                   else peak / B)
        ff, fbf = (self.flops(job["method"], B, H, N, D, M, bw, job["options"]) for bw in (False, True))
        rec["fwd_gflops"] = None if ff is None else ff / (fmed * 1e-3) * 1e-9
        rec["fwd_bwd_gflops"] = None if fbf is None else fbf / (fbmed * 1e-3) * 1e-9
        rec["process_peak_rss_bytes"] = max(self.peak_rss, proc_status("VmHWM") or 0) or None
        fn = q = k = v = dout = None  # frees the tensors before the next point
        if self.cuda:
            torch.cuda.empty_cache()
        return rec, False

    def run_recurrent(self, job, T):
        torch, c = self.torch, self.c
        B, H, D, M, steps = c["rec_batch"], c["heads"], c["qk_dim"], c["v_dim"], c["steps"]
        rec = self.base_record("recurrent", job, B, max(T, 1), True)
        rec.update(context=T, steps=steps)
        cap = T + steps
        cls = RECURRENT[job["method"]]
        bh = B * H
        state_est = 4.0 * bh * (cap * (D + M) if cls is KVCacheStep else D * (M + 1))
        prompt = 4.0 * bh * max(T, 1) * (2 * D + M)
        if state_est + prompt > c["memory_limit_bytes"]:
            rec.update(status="oom", reason="estimated memory exceeds memory_limit_gib", step_ms=None,
                       per_position_ms=None)
            return rec, True
        try:
            with torch.no_grad():
                if self.cuda:
                    self.sync()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                st = cls(torch, job["options"], B, H, D, M, cap, self.device)
                Tq = max(T, 1)
                pq = self.randn(10, B, H, Tq, D)
                pk = self.randn(11, B, H, Tq, D)
                pv = self.randn(12, B, H, Tq, M)
                qt, kt, vt = self.randn(13, B, H, D), self.randn(14, B, H, D), self.randn(15, B, H, M)
                held = 4 * (pq.numel() + pk.numel() + pv.numel() + qt.numel() + kt.numel() + vt.numel())
                prefill_ms = self.timed(lambda: st.prefill(pk[:, :, :T], pv[:, :, :T]) if T > 0 else None)[0]
                step_alloc = None
                if not self.cuda:  # the step's own temporaries, on a step at position T (untimed)
                    step_alloc, _ = self.cpu_step_peak(lambda: st.step(T, qt, kt, vt))
                ms = [self.timed(lambda: st.step(T + t, qt, kt, vt))[0] for t in range(steps)]
                if self.cuda:
                    self.sync()
                    peak = torch.cuda.max_memory_allocated() - base
                    src = "torch.cuda.max_memory_allocated from before the state was made"
                else:
                    peak = st.state_bytes() + held + (step_alloc or 0)
                    src = ("state + prompt and step inputs + the step's own peak allocation (torch profiler)"
                           if step_alloc is not None else "state + prompt and step inputs (no profiler)")
                sb = st.state_bytes()
                st = pq = pk = pv = None  # frees the state before the next point
        except Exception as e:  # noqa: BLE001
            if self.cuda:
                torch.cuda.empty_cache()
            rec.update(status="oom" if is_oom(torch, e) else "failed",
                       reason=str(e).splitlines()[0] if str(e) else type(e).__name__, step_ms=None,
                       per_position_ms=None)
            return rec, True
        med = quantile(ms, 0.5)
        rec.update(status="ok", step_ms=stats(ms), per_position_ms=med, positions_per_s=B * 1e3 / med,
                   prefill_ms=prefill_ms, state_bytes=sb, peak_bytes=peak, step_alloc_bytes=step_alloc,
                   memory_source=src)
        if self.cuda:
            torch.cuda.empty_cache()
        return rec, False

    def gemm(self):
        torch, n, reps = self.torch, self.c["gemm_size"], self.c["gemm_repeats"]
        if n <= 0:
            return None
        a, b = self.randn(100, n, n), self.randn(101, n, n)
        ms = []
        for r in range(-1, reps):
            t, out = self.timed(lambda: torch.mm(a, b))
            del out
            if r >= 0:
                ms.append(t)
        return 2.0 * n ** 3 / (quantile(ms, 0.5) * 1e-3) * 1e-9

# ---------------------------------------------------------------- machine ----


def _first_line(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        out = r.stdout.strip().splitlines()
        return out[0] if r.returncode == 0 and out else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def openblas_in_process():
    """The OpenBLAS this process has loaded (through PyTorch), found among the mapped
    libraries by its symbols: {library, config, core, threads, parallel} or None."""
    import ctypes
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if "blas" in os.path.basename(p).lower() and ".so" in p and p not in paths:
                    paths.append(p)
    except OSError:
        return None
    for p in paths:
        try:
            lib = ctypes.CDLL(p)
            corename = lib.openblas_get_corename
        except (OSError, AttributeError):
            continue
        corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        info = {"library": os.path.realpath(p), "config": lib.openblas_get_config().decode(),
                "core": corename().decode(), "threads": lib.openblas_get_num_threads(), "parallel": None,
                "lib": lib}
        try:
            info["parallel"] = lib.openblas_get_parallel()
        except AttributeError:
            pass
        return info
    return None


def machine_info(torch, device, threads_set, ob):
    cfg = torch.__config__.show()
    par = torch.__config__.parallel_info()

    def setting(name):
        m = re.search(r"\b" + name + r"=([^,\s]*)", cfg)
        return m.group(1) if m else None
    backend = None
    for line in par.splitlines():
        if line.startswith("ATen parallel backend:"):
            backend = line.split(":", 1)[1].strip()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    libc = platform.libc_ver()
    m = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "threads_requested": threads_set,
        "interop_threads": torch.get_num_interop_threads(),
        "blas": "OpenBLAS" if ob else ("MKL" if torch.backends.mkl.is_available() else setting("BLAS_INFO")),
        "blas_config": ob["config"] if ob else None,
        "blas_core": ob["core"] if ob else None,
        "blas_threads": ob["threads"] if ob else None,
        "blas_parallel": ob["parallel"] if ob else None,
        "blas_parallel_model": ({0: "sequential", 1: "pthreads", 2: "openmp"}.get(ob["parallel"], "unknown")
                                if ob and ob["parallel"] is not None else None),
        "blas_library": ob["library"] if ob else None,
        "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE"),
        "torch_blas_info": setting("BLAS_INFO"),
        "torch_lapack_info": setting("LAPACK_INFO"),
        "torch_parallel_backend": backend,
        "torch_config": cfg,
        "torch_parallel_info": par,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "allocator": (f"PyTorch c10 DefaultCPUAllocator (posix_memalign) on {libc[0] or 'libc'} malloc"
                      f"{', ' + libc[0] + ' ' + libc[1] if libc[0] else ''}"),
        "libc": f"{libc[0]} {libc[1]}".strip() or None,
        "ld_preload": os.environ.get("LD_PRELOAD"),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "memory_bytes": mem,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": torch.__version__,
        "device_allocator": None,
        "gpu": None,
    }
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        backend_fn = getattr(torch.cuda, "get_allocator_backend", None)
        m["device_allocator"] = ("PyTorch CUDA caching allocator"
                                 + (f" ({backend_fn()})" if backend_fn else "")
                                 + (f", PYTORCH_CUDA_ALLOC_CONF={os.environ['PYTORCH_CUDA_ALLOC_CONF']}"
                                    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") else ""))
        m["gpu"] = {"name": p.name, "compute_capability": f"{p.major}.{p.minor}",
                    "multiprocessors": p.multi_processor_count, "memory_bytes": p.total_memory,
                    "cuda_runtime": torch.version.cuda,
                    "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                    "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "emulated": False}
    return m


def git_info():
    here = os.path.dirname(os.path.abspath(__file__))
    commit = _first_line(["git", "-C", here, "rev-parse", "HEAD"])
    dirty = None
    if commit:
        try:
            r = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
            dirty = bool(r.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return {"commit": commit, "dirty": dirty}

# ------------------------------------------------------------------ output ----


def iso_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _dotted(rec, path):
    cur = rec
    for t in path.split("."):
        cur = cur.get(t) if isinstance(cur, dict) else None
    return cur


def _tsv(v):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "NaN"
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return f"{v:.9g}"
    if isinstance(v, (dict, list)):
        return "-"
    return str(v).replace("\t", " ").replace("\n", " ")


def _clean(x):
    """NaN and infinities as null, as attnbench writes them."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def save(doc, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(doc), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    tsv = (path[:-5] if path.endswith(".json") else path) + ".tsv"
    with open(tsv + ".tmp", "w") as f:
        f.write("\t".join(TSV_COLUMNS) + "\n")
        for r in doc["records"]:
            f.write("\t".join(_tsv(_dotted(r, col)) for col in TSV_COLUMNS) + "\n")
    os.replace(tsv + ".tmp", tsv)


def growth_summary(records):
    out = {}
    for r in records:
        if r.get("kind") != "parallel" or r["variant"] in out:
            continue
        pts = [(math.log(q["len"]), math.log(q["per_sample_fwd_bwd_ms"])) for q in records
               if q.get("kind") == "parallel" and q["variant"] == r["variant"] and q["status"] == "ok"
               and q.get("per_sample_fwd_bwd_ms")]
        n = len(pts)
        sx, sy = sum(p[0] for p in pts), sum(p[1] for p in pts)
        sxx, sxy = sum(p[0] ** 2 for p in pts), sum(p[0] * p[1] for p in pts)
        den = n * sxx - sx * sx
        lens = [q["len"] for q in records if q.get("kind") == "parallel" and q["variant"] == r["variant"]
                and q["status"] == "ok"]
        out[r["variant"]] = {"fwd_bwd_time_exponent": (n * sxy - sx * sy) / den if n >= 2 and den > 0 else None,
                             "points": n, "len_min": min(lens) if lens else 0, "len_max": max(lens) if lens else 0}
    return out

# -------------------------------------------------------------------- main ----


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise BadInput(message)


def parse_args(argv):
    ap = _Parser(prog="torch_bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=None,
                    help="intra-op threads (torch.set_num_threads, and OpenBLAS's when it is found); default PyTorch's")
    ap.add_argument("--map", action="append", default=[], metavar="LABEL=METHOD[,METHOD..]")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--list", action="store_true", help="print the methods and exit")
    a = ap.parse_args(argv)
    if not a.list and not a.config:
        raise BadInput("a CONFIG.json is required (see experiments/sweep/)")
    if a.threads is not None and a.threads < 1:
        raise BadInput(f"--threads {a.threads}: must be at least 1")
    return a


def prepare(argv):
    """Everything that needs no PyTorch: arguments, config, mapping. Raises BadInput."""
    a = parse_args(argv)
    if a.list:
        return a, None, None
    root = load_config(a.config)
    for s in a.set:
        apply_set(root, s)
    c = parse_config(root)
    sides, no_peer = plan(c, a.map, a.device)
    return a, (root, c), (sides, no_peer)


def main(argv):
    try:
        a, conf, jobs = prepare(argv)
    except BadInput as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if a.list:
        for name, (kind, desc) in METHODS.items():
            print(f"{name:16s} {kind:9s} {desc}")
        return 0
    root, c = conf
    sides, no_peer = jobs
    try:
        import torch
    except ImportError as e:
        print(f"{PROG}: error: PyTorch is not importable by {sys.executable} ({e}; Debian: apt-get install "
              "python3-torch)", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"{PROG}: error: no CUDA device visible to PyTorch {torch.__version__}", file=sys.stderr)
        return 2
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 products, as attnbench's
        torch.backends.cudnn.allow_tf32 = False
    ob = openblas_in_process()
    if a.threads is not None:
        torch.set_num_threads(a.threads)
        if ob:
            ob["lib"].openblas_set_num_threads(a.threads)
            ob["threads"] = ob["lib"].openblas_get_num_threads()
    if c["memory_limit_gib"] is not None:
        c["memory_limit_bytes"] = c["memory_limit_gib"] * 2.0 ** 30
    elif a.device == "cuda":
        c["memory_limit_bytes"] = float(torch.cuda.get_device_properties(0).total_memory)
    else:
        c["memory_limit_bytes"] = 0.75 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    out = a.out or os.path.join("results", f"{c['name']}-torch.json")
    if os.path.dirname(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
    config_doc = json.loads(json.dumps(root))
    config_doc["device"] = a.device
    doc = {
        "schema": "attnbench/run/1",
        "command": " ".join([os.path.relpath(__file__) if os.path.isabs(__file__) else __file__] + list(argv)),
        "producer": "torch_bench.py (PyTorch eager peer of attnbench bench)",
        "config": config_doc,
        "seed": c["seed"],
        "machine": machine_info(torch, a.device, a.threads, ob),
        "git": git_info(),
        "started": iso_now(),
        "finished": None,
        "status": "running",
        "methods": {name: {"kind": kind, "description": desc} for name, (kind, desc) in METHODS.items()},
        "mapping": {side: [{k: j[k] for k in ("variant", "method", "options", "peer_of")} for j in js]
                    for side, js in sides.items()},
        "memory": None,
        "records": [],
    }
    try:
        save(doc, out)
    except OSError as e:
        print(f"{PROG}: error: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 2
    b = Bench(torch, c, a.device, a.quiet)
    log = (lambda *x: None) if a.quiet else (lambda s: print(f"{PROG}: {s}", file=sys.stderr, flush=True))
    interrupted = [False]
    failed = 0

    def add(rec):
        doc["records"].append(rec)
        save(doc, out)

    try:
        g = b.gemm()
        doc["sgemm"] = {"size": c["gemm_size"], "gflops": g, "device": a.device, "threads": torch.get_num_threads()}
        if g is not None:
            log(f"sgemm {c['gemm_size']}x{c['gemm_size']} (torch.mm): {g:.1f} GFLOP/s on "
                f"{torch.get_num_threads()} threads")
        save(doc, out)
        for side, v, why in no_peer:
            if side != "parallel":
                continue
            for N in c["lengths"]:
                r = b.base_record("parallel", {"variant": v["label"], "peer_of": [v["label"]]}, batch_for(c, N), N,
                                  c["causal"])
                r.update(status="skipped", reason=why)
                b.null_timings(r)
                add(r)
        for job in sides["parallel"]:
            stop_reason = None
            for N in c["lengths"]:
                if stop_reason:
                    r = b.base_record("parallel", job, batch_for(c, N), N, c["causal"])
                    r.update(status="skipped", reason=stop_reason)
                    b.null_timings(r)
                else:
                    r, stop = b.run_point(job, N, lambda: interrupted[0])
                    if stop:  # a method the installed PyTorch lacks keeps its reason
                        stop_reason = (r["reason"] if r["status"] == "skipped"
                                       else "ran out of time or memory at a smaller length")
                failed += r["status"] == "failed"
                fb = (r.get("fwd_bwd_ms") or {}).get("median")
                pk = r.get("peak_bytes")
                log(f"{job['variant']:18s} N={N:<6d} B={r['batch']:<4d} {r['status']:8s} fwd+bwd "
                    f"{'-' if fb is None else f'{fb:.3f}':>10s} ms  peak "
                    f"{'-' if pk is None else f'{pk / 2**20:.1f}':>8s} MiB")
                add(r)
        for job in sides["recurrent"]:
            stop = False
            for T in c["contexts"]:
                if stop:
                    r = b.base_record("recurrent", job, c["rec_batch"], max(T, 1), True)
                    r.update(context=T, status="skipped", reason="ran out of time or memory at a shorter context",
                             step_ms=None, per_position_ms=None)
                else:
                    r, stop = b.run_recurrent(job, T)
                failed += r["status"] == "failed"
                pp = r.get("per_position_ms")
                log(f"{job['variant']:18s} context={T:<6d} {r['status']:8s} step "
                    f"{'-' if pp is None else f'{pp:.4f}':>10s} ms")
                add(r)
    except KeyboardInterrupt:
        interrupted[0] = True
    doc["memory"] = {
        "parallel": ("torch.cuda.max_memory_allocated() over the point less the bytes allocated before it (the "
                     "inputs q, k, v, dout and the causal mask)" if a.device == "cuda" else
                     "PyTorch CPU allocator: bytes live at the peak of one extra fwd+bwd step beyond those live "
                     "before it (inputs q, k, v, dout and the causal mask excluded), from torch.profiler's "
                     "allocation events (profile_memory=True)" if b.cpu_mem_api == "profiler" else
                     "process RSS growth over one extra fwd+bwd step (VmHWM reset through /proc/self/clear_refs)"),
        "recurrent": ("torch.cuda.max_memory_allocated() from before the state was made" if a.device == "cuda"
                      else "state + prompt and step inputs + the step's own peak allocation"),
        "cpu_source": None if a.device == "cuda" else b.cpu_mem_api,
        "also": None if a.device == "cuda" else "peak_rss_growth_bytes: the process's RSS growth over that step",
    }
    doc["summary"] = growth_summary(doc["records"])
    doc["finished"] = iso_now()
    doc["status"] = "interrupted" if interrupted[0] else "failed" if failed else "ok"
    save(doc, out)
    log(f"wrote {out} (status {doc['status']})")
    return 130 if interrupted[0] else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
