#!/usr/bin/env python3
"""The sweep config as experiments/sweep/torch_bench.py reads it: an `attnbench bench`
config (experiments/sweep/*.json) validated as attnbench does, --set overrides by dotted
path, the batch rule, and the TSV columns of the run document. Bad input raises
BadInput with the one-line message. The variants and their options are attnbench's own,
read from `attnbench list --json` (attnbench_exe says which binary). Standard library
only."""
import json
import os
import subprocess

TOP_KEYS = ["name", "description", "variants", "lengths", "heads", "qk_dim", "v_dim", "causal", "batch", "warmup",
            "repeats", "time_budget_s", "memory_limit_gib", "seed", "recurrent", "gemm", "copy"]
TSV_COLUMNS = ["kind", "variant", "len", "context", "batch", "heads", "qk_dim", "v_dim", "causal", "status",
               "fwd_ms.median", "fwd_ms.p20", "fwd_ms.p80", "fwd_bwd_ms.median", "fwd_bwd_ms.p20", "fwd_bwd_ms.p80",
               "per_sample_fwd_ms", "per_sample_fwd_bwd_ms", "peak_bytes", "peak_bytes_per_sample", "fwd_bwd_gflops",
               "per_position_ms", "state_bytes"]


class BadInput(Exception):
    """A bad argument, config or mapping: one line, exit status 2."""


def attnbench_exe():
    """The attnbench binary whose variants a config is checked against: $ATTNBENCH, else
    build/attnbench of this checkout (as compare-torch.sh and gpu-check.sh find it)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    return os.environ.get("ATTNBENCH") or os.path.normpath(os.path.join(root, "build", "attnbench"))


_variant_options = None


def variant_options():
    """{variant: [option, ...]} as `attnbench list --json` gives them (every option
    attnbench accepts in a sweep config's "set", the common ones included); read once."""
    global _variant_options
    if _variant_options is None:
        exe = attnbench_exe()
        try:
            p = subprocess.run([exe, "list", "--json"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise BadInput(f"cannot run {exe} list --json (ATTNBENCH names the binary): {e}")
        if p.returncode != 0:
            raise BadInput(f"{exe} list --json failed (exit status {p.returncode}): {p.stderr.strip()}")
        try:
            doc = json.loads(p.stdout)
            _variant_options = {v["name"]: [o["name"] for o in v["options"]] for v in doc["variants"]}
        except (ValueError, KeyError, TypeError) as e:
            raise BadInput(f"{exe} list --json: not the list document expected: {e}")
    return _variant_options


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
        options = variant_options()
        if name not in options:
            raise BadInput(f"config: {where}: unknown variant '{name}' (known: {', '.join(options)})")
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
            if k not in options[name]:
                raise BadInput(f"config: {where}: variant '{name}' has no option '{k}' "
                               f"(options: {', '.join(options[name])})")
            if isinstance(x, bool) or not isinstance(x, (str, int, float)):
                raise BadInput(f"config: '{where}.set.{k}' must be a string or a number")
            # the PyTorch side multiplies in float32 only (torch_bench.py turns TF32 off):
            # attnbench's tf32 products would have no like-for-like peer
            if k == "precision" and x != "fp32":
                raise BadInput(f"config: {where}: precision '{x}' has no PyTorch peer here (float32 products only)")
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
    # the copy bandwidth (attnbench's memory floor): checked as attnbench does, not
    # measured here (both sides run on the same device: attnbench's figure serves both)
    c["copy_mib"], c["copy_repeats"] = 64, 5
    cp = root.get("copy")
    if cp is not None:
        if not isinstance(cp, dict):
            raise BadInput("config: 'copy' must be an object")
        _only_keys(cp, "copy", ["mib", "repeats"])
        c["copy_mib"] = _int(cp, "copy", "mib", False, 64, 0, 16384)
        c["copy_repeats"] = _int(cp, "copy", "repeats", False, 5, 1, 1000)
    return c


def batch_for(c, n):
    if c["batch"]["rule"] == "fixed":
        return c["batch"]["size"]
    return max(1, min(c["batch"]["tokens"] // n, c["batch"]["max"]))
