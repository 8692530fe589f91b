#!/usr/bin/env python3
"""The PyTorch methods that experiments/sweep/torch_bench.py times: what each is (METHODS),
which stand against which attnbench variant (default_methods, method_options, plan), each
parallel method as a function of (q, k, v) built by make_parallel, the recurrent steps
(KVCacheStep, LinearRNNStep) and the memory estimate of a point. torch is passed in (the
module imports nothing from it), so torch_bench.py's config checks run without PyTorch.
See torch_bench.py for the protocol and METHODS for what each method is."""
import math

from torch_bench_config import BadInput

# ---------------------------------------------------------------- methods ----

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
