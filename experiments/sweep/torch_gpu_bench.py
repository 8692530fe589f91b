#!/usr/bin/env python3
"""PyTorch on the GPU at the shapes of experiments/sweep/compare-torch-gpu.json, so that
`attnbench bench --device cuda` can be read side by side with what a user would
otherwise run (issue targets: causal linear at N = 16384 at least 5x faster than
PyTorch's causal scaled_dot_product_attention, at most its memory; materialised
softmax no slower than PyTorch eager matmul-softmax).

    python3 experiments/sweep/torch_gpu_bench.py --out results/torch-gpu.json
    python3 experiments/sweep/compare_torch.py results/compare-torch-gpu.json results/torch-gpu.json

Methods (float32 inputs, causal, B = 2, H = 8 so B*H = 16, D = M = 64, fwd+bwd of
sum(out * dout)):
  sdpa_causal      torch.nn.functional.scaled_dot_product_attention(is_causal=True)
                   (PyTorch picks its fastest kernel: FlashAttention or memory-efficient)
  softmax_causal   eager: Q K^T / sqrt(D), masked_fill, softmax, @ V (materialised N x N)
  linear_causal_chunked  eager chunked causal linear attention (elu+1), chunk 64
Timing: CUDA events around fwd+bwd after warm-up, median of repeats. Memory:
torch.cuda.max_memory_allocated during one step minus the bytes allocated before it
(inputs excluded), as `peak_alloc_step`; out-of-memory is recorded as status "oom" and
larger N are skipped for that method. Output: a JSON list of records with the fields
compare_torch.py reads (method, N, D, H, B, status, fwdbwd_median, fwd_median,
peak_alloc_step). Runs on the CPU too (--device cpu) for a quick check of the script.
"""
import argparse
import json
import math
import statistics
import sys


def methods(torch):
    F = torch.nn.functional

    def sdpa_causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    masks = {}

    def softmax_causal(q, k, v):
        n, d = q.shape[-2], q.shape[-1]
        key = (n, q.device)
        if key not in masks:
            masks[key] = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), 1)
        s = (q * (1.0 / math.sqrt(d))) @ k.transpose(-1, -2)
        s = s.masked_fill(masks[key], float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    def linear_causal_chunked(q, k, v, C=64, eps=1e-6):
        # O_c = phi(Q_c) S_{<c} + (phi(Q_c) phi(K_c)^T lower-triangular) V_c, states by an
        # exclusive prefix sum over chunks; the denominator the same with V -> 1.
        B, H, N, D = q.shape
        M = v.shape[-1]
        pad = (-N) % C
        Q, K = F.elu(q) + 1.0, F.elu(k) + 1.0
        V = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        if pad:
            Q = F.pad(Q, (0, 0, 0, pad))
            K = F.pad(K, (0, 0, 0, pad))
            V = F.pad(V, (0, 0, 0, pad))
        n = (N + pad) // C
        Qc, Kc, Vc = (t.reshape(B, H, n, C, t.shape[-1]) for t in (Q, K, V))
        states = Kc.transpose(-1, -2) @ Vc                       # B,H,n,D,M+1
        prev = torch.cumsum(states, dim=2) - states              # exclusive prefix
        tri = torch.tril(torch.ones(C, C, dtype=q.dtype, device=q.device))
        A = (Qc @ Kc.transpose(-1, -2)) * tri
        O = Qc @ prev + A @ Vc
        O = O.reshape(B, H, n * C, M + 1)[:, :, :N]
        return O[..., :M] / (O[..., M:] + eps)

    return {"sdpa_causal": sdpa_causal, "softmax_causal": softmax_causal,
            "linear_causal_chunked": linear_causal_chunked}


def run_one(torch, fn, B, H, N, D, device, warmup, repeats):
    gen = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda: torch.randn(B, H, N, D, generator=gen).to(device).requires_grad_(True)
    q, k, v = mk(), mk(), mk()
    dout = torch.randn(B, H, N, D, generator=gen).to(device)
    cuda = device.startswith("cuda")

    def step():
        q.grad = k.grad = v.grad = None
        out = fn(q, k, v)
        out.backward(dout)

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    def timed(f, n):
        ts = []
        for _ in range(n):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                f()
                b.record()
                torch.cuda.synchronize()
                ts.append(a.elapsed_time(b) * 1e-3)
            else:
                import time
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
        return ts

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    step()
    peak = (torch.cuda.max_memory_allocated() - base) if cuda else None
    fb = timed(step, repeats)
    fw = timed(fwd, repeats)
    return dict(status="ok", fwdbwd_median=statistics.median(fb), fwd_median=statistics.median(fw),
                fwdbwd_samples=fb, peak_alloc_step=peak, peak_rss_delta=None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--methods", nargs="+", default=["sdpa_causal", "softmax_causal", "linear_causal_chunked"])
    ap.add_argument("--ns", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    import torch
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("torch_gpu_bench: no CUDA device visible to PyTorch (use --device cpu to check the script)")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products, as ours
    torch.backends.cudnn.allow_tf32 = False
    table = methods(torch)
    env = dict(torch=torch.__version__, device=a.device,
               gpu=torch.cuda.get_device_name(0) if a.device.startswith("cuda") else None)
    results = []
    for name in a.methods:
        if name not in table:
            sys.exit(f"torch_gpu_bench: unknown method '{name}' (known: {', '.join(table)})")
        stop = False
        for N in a.ns:
            rec = dict(method=name, N=N, D=a.D, H=a.H, B=a.B, env=env)
            if stop:
                rec.update(status="skipped")
            else:
                try:
                    rec.update(run_one(torch, table[name], a.B, a.H, N, a.D, a.device, a.warmup, a.repeats))
                except torch.cuda.OutOfMemoryError:
                    rec.update(status="oom")
                    stop = True
                if a.device.startswith("cuda"):
                    torch.cuda.empty_cache()
            results.append(rec)
            fb, pk = rec.get("fwdbwd_median"), rec.get("peak_alloc_step")
            fb_s = "-" if fb is None else "%.3f ms" % (fb * 1e3)
            pk_s = "-" if pk is None else "%.0f MiB" % (pk / 2**20)
            print("%-24s N=%6d %-8s fwd+bwd %s peak %s" % (name, N, rec["status"], fb_s, pk_s), flush=True)
            with open(a.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
