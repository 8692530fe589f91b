#!/usr/bin/env python3
"""Side-by-side table of an `attnbench bench` result and the PyTorch peer's `train`
output (torch_attention_bench.py), at the same N, D, H, B: our median forward+backward
time and peak memory against PyTorch's, and the ratios.

    python3 experiments/sweep/compare_torch.py results/compare-torch.json torch-train.json

Pairs: softmax <-> softmax_causal, linear <-> linear_causal_chunked (the fastest PyTorch
form of causal linear attention) and linear_causal_cumsum; with the GPU peer
(torch_gpu_bench.py) also linear and softmax <-> sdpa_causal (PyTorch's fused causal
scaled_dot_product_attention). Memory: ours is the tracked
allocator's peak (inputs, outputs, gradients, saved state, workspace); PyTorch's is
peak_alloc_step (bytes live in its allocator during one step, from its profiler) and
peak_rss_delta (process RSS growth), as the peer reports them. Standard library only.
"""
import json
import sys

PAIRS = [("softmax", "softmax_causal"), ("linear", "linear_causal_chunked"), ("linear", "linear_causal_cumsum"),
         ("linear", "sdpa_causal"), ("softmax", "sdpa_causal")]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ours = json.load(open(sys.argv[1]))
    theirs = json.load(open(sys.argv[2]))
    rows = {}
    for r in ours["records"]:
        if r.get("kind") == "parallel" and r["status"] == "ok":
            rows[(r["variant"], r["len"], r["qk_dim"])] = r
    m = ours["machine"]
    print(f"machine: {m.get('cpu')}, {m.get('threads')} threads, OpenBLAS core {m.get('blas_core')}, "
          f"OPENBLAS_CORETYPE={m.get('openblas_coretype_env')}; sgemm {ours.get('sgemm', {}).get('gflops', 0):.0f} GFLOP/s")
    print()
    print("| ours | PyTorch | N | ours fwd+bwd ms | PyTorch fwd+bwd ms | time ratio | ours peak MiB | PyTorch alloc / rss MiB | memory ratio | ours GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ov, tm in PAIRS:
        for t in theirs:
            if t.get("method") != tm:
                continue
            o = rows.get((ov, t["N"], t["D"]))
            if o is None:
                continue
            ours_ms = o["fwd_bwd_ms"]["median"]
            if t["status"] != "ok":
                print(f"| {ov} | {tm} | {t['N']} | {ours_ms:.1f} | {t['status']} | - | {o['peak_bytes'] / 2**20:.0f} | - | - | - |")
                continue
            th_ms = t["fwdbwd_median"] * 1e3
            alloc = t.get("peak_alloc_step") or 0
            rss = t.get("peak_rss_delta") or 0
            theirs_mem = max(alloc, rss)
            gf = o.get("fwd_bwd_gflops")
            print(f"| {ov} | {tm} | {t['N']} | {ours_ms:.1f} | {th_ms:.1f} | {ours_ms / th_ms:.2f} | "
                  f"{o['peak_bytes'] / 2**20:.0f} | {alloc / 2**20:.0f} / {rss / 2**20:.0f} | "
                  f"{o['peak_bytes'] / theirs_mem:.2f} | {'-' if gf is None else f'{gf:.0f}'} |")


if __name__ == "__main__":
    main()
