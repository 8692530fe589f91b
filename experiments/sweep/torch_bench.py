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

Protocol, as attnbench's (experiments/driver/sweep_measure.c): per point a first
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

# ------------------------------------------- config, methods, implementations ----

# the config in torch_bench_config.py, the methods and their PyTorch code in
# torch_peers.py (beside this file)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench_config import TSV_COLUMNS, BadInput, apply_set, batch_for, load_config, parse_config  # noqa: E402
from torch_peers import (METHODS, RECURRENT, KVCacheStep, LinearRNNStep, estimated_extra_bytes,  # noqa: E402,F401
                         linear_chunked_fn, make_parallel, plan)


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
            if first > budget and self.cuda:
                # a method's first call on the GPU loads its kernels (CUDA's lazy module
                # loading: on an H200, eager softmax's first call took over 2 s at N=1024)
                first, _ = self.timed(fwd_bwd)
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
        "os": f"{platform.system()} {platform.machine()}",
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
