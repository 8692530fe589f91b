#!/usr/bin/env python3
"""The float64 numpy reference of tests/crosscheck/xcheck.py: Philox4x32-10 as
harness/rng.h documents it (LSH's rotations, FAVOR+'s projections, Linformer's
projections are drawn from it), and every variant's forward and analytic gradients with
the magnitude bounds the comparison's tolerance is measured against (REFERENCES, by
variant name; FEATURE_MAPS, by linear's feature map). Written from the specification
only: xcheck.py's docstring says which documents and why."""

import functools
import math

import numpy as np

from xref_rnn import DELTANET_EPS, ref_deltanet, ref_gla, ref_retention  # noqa: F401

# ---------------------------------------------------------------------------------------
# Philox4x32-10 as harness/rng.h documents it
# ---------------------------------------------------------------------------------------

_M0, _M1 = 0xD2511F53, 0xCD9E8D57      # round multipliers (Salmon et al. 2011)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85      # key schedule increments
_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    """Four 32-bit words from a 4-word counter and a 2-word key."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for rnd in range(10):
        if rnd > 0:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & _MASK32,
                          (p0 >> 32) ^ c3 ^ k1, p0 & _MASK32)
    return c0, c1, c2, c3


def philox_block(seed, stream, index):
    """rng.h: key = (seed low 32, seed high 32), counter = (index low, index high,
    stream low, stream high)."""
    return philox4x32_10((index & _MASK32, (index >> 32) & _MASK32,
                          stream & _MASK32, (stream >> 32) & _MASK32),
                         (seed & _MASK32, (seed >> 32) & _MASK32))


def _unit(w):
    """rng.h's uniform conversion of a 32-bit word: ((w >> 8) + 0.5) / 2^24, in (0, 1)."""
    return ((w >> 8) + 0.5) / 16777216.0


def rng_normal(seed, stream, index):
    """rng.h: block index/2, Box-Muller in double on words 0 and 1 (each word converted
    as the uniform is), cos for even index, sin for odd."""
    w = philox_block(seed, stream, index // 2)
    u0, u1 = _unit(w[0]), _unit(w[1])
    r = math.sqrt(-2.0 * math.log(u0))
    return r * (math.cos if index % 2 == 0 else math.sin)(2.0 * math.pi * u1)


# Known answers of Philox4x32-10 from the Random123 distribution (tests/kat_vectors).
_PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((_MASK32,) * 4, (_MASK32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def selftest_philox():
    for ctr, key, want in _PHILOX_KAT:
        got = philox4x32_10(ctr, key)
        if got != want:
            raise AssertionError("Philox4x32-10 known answer: got %s want %s" %
                                 (["%08x" % x for x in got], ["%08x" % x for x in want]))


@functools.lru_cache(maxsize=256)
def lsh_rotation(seed, r, D, bits):
    """R_r[d][j] = normal(seed, stream r, index d*bits + j), shape (D, bits)."""
    return _readonly(np.array([[rng_normal(seed, r, d * bits + j) for j in range(bits)]
                     for d in range(D)], dtype=np.float64))


def _readonly(a):
    a.flags.writeable = False
    return a


# ---------------------------------------------------------------------------------------
# The reference, float64. Layout: q, k (B, H, N, D); v, dout (B, H, N, M).
# Every variant returns a dict: out, dq, dk, dv (the gradients of sum(out * g)) and, for
# each of them, "mag_" + name: an elementwise bound on the sum of the magnitudes of the
# terms that make up that value when it is evaluated as the C code must (through the
# feature map for linear and polynomial). A float32 evaluation errs by about u times
# this magnitude, whatever cancellation leaves of the value itself; it is zero exactly
# where the value is structurally zero (padding, length 0, lsh's dk, scale 0).
# ---------------------------------------------------------------------------------------

def _T(x):
    return np.swapaxes(x, -1, -2)


def base_mask(B, N, lengths, causal):
    """(B, 1, N, N): query i may attend to key j. Positions >= lengths[b] take no part."""
    L = np.full(B, N) if lengths is None else np.asarray(lengths)
    pos = np.arange(N)
    valid = pos[None, :] < L[:, None]                      # (B, N)
    m = valid[:, :, None] & valid[:, None, :]
    if causal:
        m = m & (pos[:, None] >= pos[None, :])[None]
    return m[:, None]


def masked_softmax(s, mask):
    """Row softmax of s over mask; rows with nothing allowed are zero (lse = -inf)."""
    s = np.where(mask, s, -np.inf)
    rmax = s.max(-1, keepdims=True)
    rmax = np.where(np.isfinite(rmax), rmax, 0.0)
    e = np.where(mask, np.exp(s - rmax), 0.0)
    z = e.sum(-1, keepdims=True)
    p = e / np.where(z > 0, z, 1.0)
    lse = np.where(z > 0, np.log(np.where(z > 0, z, 1.0)) + rmax, -np.inf)[..., 0]
    return p, lse


def softmax_weight_mag(p, q, k, scale):
    """Magnitude for the softmax weights: exp(s) turns the absolute rounding of a score,
    about u |scale| |q|.|k|, into a relative error of the weight, so each weight counts
    (1 + |scale| |q_i|.|k_j|) times."""
    return p * (1.0 + abs(scale) * (np.abs(q) @ _T(np.abs(k))))


def band_mask(N, window, causal):
    """(N, N): key j is within the sliding window of query i (README: i - w < j <= i
    causal, |i - j| < w otherwise)."""
    d = np.arange(N)[:, None] - np.arange(N)[None, :]      # i - j
    return (d >= 0) & (d < window) if causal else np.abs(d) < window


def strided_mask(N, window, stride, causal):
    """(N, N): key j is in the strided pattern of query i (Child et al. 2019; README:
    |i - j| < window or |i - j| a multiple of stride, and j <= i when causal)."""
    d = np.arange(N)[:, None] - np.arange(N)[None, :]      # i - j
    allowed = (np.abs(d) < window) | (np.abs(d) % stride == 0)
    return allowed & (d >= 0) if causal else allowed


def ref_softmax(q, k, v, g, lengths, causal, scale, window=None, pattern=None):
    """softmax attention; with a window, the local variant (the band of the window);
    with a pattern ((N, N) booleans), only the pairs it allows (sparse)."""
    B, H, N, D = q.shape
    mask = base_mask(B, N, lengths, causal)
    if window is not None:
        mask = mask & band_mask(N, window, causal)[None, None]
    if pattern is not None:
        mask = mask & pattern[None, None]
    p, _ = masked_softmax(scale * (q @ _T(k)), mask)      # (B, H, N, N)
    out = p @ v
    ds = p * (g @ _T(v) - (g * out).sum(-1, keepdims=True))
    pm = softmax_weight_mag(p, q, k, scale)
    mag_out = pm @ np.abs(v)
    ds_mag = pm * (np.abs(g) @ _T(np.abs(v)) + (np.abs(g) * mag_out).sum(-1, keepdims=True))
    return dict(out=out, dq=scale * (ds @ k), dk=scale * (_T(ds) @ q), dv=_T(p) @ g,
                mag_out=mag_out,
                mag_dq=abs(scale) * (ds_mag @ np.abs(k)),
                mag_dk=abs(scale) * (_T(ds_mag) @ np.abs(q)),
                mag_dv=_T(pm) @ np.abs(g))


def _kernel_smoother(S, S_mag, v, g, mask, eps):
    """out_i = sum_j S_ij v_j / (sum_j S_ij + eps) over allowed j; padded rows zero.
    S_mag bounds the magnitude of the terms S is computed from. Returns a dict with
    out, dv, dS (gradient of sum(out*g) w.r.t. S, zero off the mask) and their mags."""
    S = np.where(mask, S, 0.0)
    S_mag = np.where(mask, S_mag, 0.0)
    live = mask.any(-1, keepdims=True)
    den = np.where(live, S.sum(-1, keepdims=True) + eps, 1.0)
    out = (S @ v) / den
    gd = np.where(live, g / den, 0.0)
    dS = np.where(mask, gd @ _T(v) - (gd * out).sum(-1, keepdims=True), 0.0)
    agd = np.abs(gd)
    # numerator and denominator both carry rounding of size u * S_mag.
    mag_out = (S_mag @ np.abs(v) + np.abs(out) * S_mag.sum(-1, keepdims=True)) / den
    # out enters the gradient with its own rounding, so with its magnitude.
    dS_mag = np.where(mask, agd @ _T(np.abs(v)) + (agd * mag_out).sum(-1, keepdims=True), 0.0)
    mag_dv = _T(S_mag) @ agd
    return dict(out=out, dv=_T(S) @ gd, dS=dS, mag_out=mag_out, mag_dv=mag_dv, dS_mag=dS_mag)


def feature_elu(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def feature_elu_backward(x, dphi, absolute=False):
    """Gradient through elu + 1 (its derivative is positive: the magnitude bound for a
    nonnegative dphi magnitude is the same expression)."""
    return dphi * np.where(x > 0, 1.0, np.exp(np.minimum(x, 0.0)))


def feature_taylor(x):
    n = np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return np.concatenate([np.ones(x.shape[:-1] + (1,)), x / n], axis=-1)


def feature_taylor_backward(x, dphi, absolute=False):
    """Gradient through [1, x/max(|x|, 1e-12)]; absolute=True gives the magnitude bound
    for a nonnegative dphi magnitude."""
    nrm = np.linalg.norm(x, axis=-1, keepdims=True)
    n = np.maximum(nrm, 1e-12)
    u = x / n
    dx = dphi[..., 1:]
    if absolute:
        return (dx + np.abs(u) * (np.abs(u) * dx).sum(-1, keepdims=True)) / n
    # d(x/|x|) = (I - u u^T)/|x| where |x| > 1e-12; the constant 1e-12 below it.
    return np.where(nrm > 1e-12, (dx - u * (u * dx).sum(-1, keepdims=True)) / n, dx / n)


class FixedMap:
    """A feature map without parameters: phi, the gradient through it (absolute=True:
    the magnitude bound for a nonnegative magnitude of dphi), and the magnitudes of the
    features (|phi|: each feature is one rounded operation or a few)."""

    def __init__(self, phi, back):
        self.phi, self.back = phi, back

    def mag(self, x):
        return np.abs(self.phi(x))

    def sim_mag(self, q, k):
        """Bound on the magnitudes of the terms of phi(q_i) . phi(k_j)."""
        return self.mag(q) @ _T(self.mag(k))


@functools.lru_cache(maxsize=256)
def favor_projection(seed, D, m):
    """favor's W [m x D] as attention/favor.h documents it: block b of D x D Gaussians
    G_b[r][d] = normal(seed, stream 0, (b D + r) D + d), its rows orthonormalised in row
    order (Gram-Schmidt: here numpy's QR of G_b^T with the signs fixed so that R has a
    positive diagonal, which is the same basis), row i = b D + r scaled by the norm of
    n_i[d] = normal(seed, stream 1, i D + d), rounded to float32."""
    rows = []
    for b in range((m + D - 1) // D):
        G = np.array([[rng_normal(seed, 0, (b * D + r) * D + d) for d in range(D)] for r in range(D)])
        Q, R = np.linalg.qr(G.T)
        E = (Q * np.sign(np.diag(R))).T                    # orthonormal rows, in order
        for r in range(min(D, m - b * D)):
            i = b * D + r
            n = np.array([rng_normal(seed, 1, i * D + d) for d in range(D)])
            rows.append(E[r] * np.linalg.norm(n))
    return _readonly(np.array(rows, dtype=np.float32).astype(np.float64))


class FavorMap:
    """favor (README, attention/favor.h): phi(x)_r = m^-1/2 exp(w_r . x' - |x'|^2/2) with
    x' = D^-1/4 x, the unshifted formula (float64 has the range; the C code's shifts
    cancel by definition, rounding included: a row's, or the keys', shift is one rounded
    number that every term of its numerator and denominator, and its eps, share).
    Magnitudes: the exponent a_r is a sum of terms of total size
    t_r = D^-1/4 sum_d |w_rd x_d| + |x'|^2/2, so its float evaluation errs by ~u t_r,
    a relative error of the feature: each feature counts (1 + t_r) times, and a product
    phi_r(q) phi_r(k) (1 + t_r(q) + t_r(k)) times."""

    def __init__(self, q, k, seed, o):
        D = q.shape[-1]
        m = int(o.get("features", 2 * D))
        self.W = favor_projection(seed, D, m)
        self.c4, self.c2, self.norm = D ** -0.25, D ** -0.5, m ** -0.5

    def _t(self, x):
        return self.c4 * (np.abs(x) @ np.abs(self.W).T) + 0.5 * self.c2 * (x * x).sum(-1, keepdims=True)

    def phi(self, x):
        a = self.c4 * (x @ self.W.T) - 0.5 * self.c2 * (x * x).sum(-1, keepdims=True)
        return self.norm * np.exp(a)

    def mag(self, x):
        return self.phi(x) * (1.0 + self._t(x))

    def sim_mag(self, q, k):
        return self.mag(q) @ _T(self.phi(k)) + self.phi(q) @ _T(self.phi(k) * self._t(k))

    def back(self, x, dphi, absolute=False):
        """d/dx of phi_r = phi_r (D^-1/4 w_r - D^-1/2 x); absolute: dphi is the magnitude of
        the feature gradient, times the features' own magnitudes."""
        if absolute:
            u = dphi * self.mag(x)
            return self.c4 * (u @ np.abs(self.W)) + self.c2 * np.abs(x) * u.sum(-1, keepdims=True)
        u = dphi * self.phi(x)
        return self.c4 * (u @ self.W) - self.c2 * x * u.sum(-1, keepdims=True)


# linear's feature maps by name (its feature_map choices): a factory of the map for one
# case, map(q, k, seed, options). Every choice `attnbench list --json` lists must have an
# entry (see coverage).
FEATURE_MAPS = {
    "elu": lambda q, k, seed, o: FixedMap(feature_elu, feature_elu_backward),
    "taylor": lambda q, k, seed, o: FixedMap(feature_taylor, feature_taylor_backward),
    "favor": lambda q, k, seed, o: FavorMap(q, k, seed, o),
}


def ref_linear(q, k, v, g, lengths, causal, feature_map, eps, seed=0, o=None):
    B, H, N, D = q.shape
    mask = base_mask(B, N, lengths, causal)
    fm = FEATURE_MAPS[feature_map](q, k, seed, o or {})
    fq, fk = fm.phi(q), fm.phi(k)
    mq, mk = fm.mag(q), fm.mag(k)
    r = _kernel_smoother(fq @ _T(fk), fm.sim_mag(q, k), v, g, mask, eps)
    dS, dS_mag = r.pop("dS"), r.pop("dS_mag")
    r["dq"] = fm.back(q, dS @ fk)
    r["dk"] = fm.back(k, _T(dS) @ fq)
    r["mag_dq"] = fm.back(q, dS_mag @ mk, absolute=True)
    r["mag_dk"] = fm.back(k, _T(dS_mag) @ mq, absolute=True)
    return r


def ref_efficient(q, k, v, g, lengths):
    """Efficient Attention (README): Q' = softmax of each query row over D, K' = softmax
    of each key feature over the valid positions, out = Q' (K'^T V); padded rows zero.
    Magnitudes: exp(x - max) errs by ~u (|x| + |max|) relative, so each weight counts
    (1 + |x| + max|x|) times (the max over its row, or over its column's positions)."""
    B, H, N, D = q.shape
    L = np.full(B, N) if lengths is None else np.asarray(lengths)
    valid = (np.arange(N)[None, :] < L[:, None])[:, None, :, None]      # (B, 1, N, 1)
    qs = q - q.max(-1, keepdims=True)
    qp = np.exp(qs) / np.exp(qs).sum(-1, keepdims=True)
    km = np.where(valid, k, -np.inf).max(-2, keepdims=True)
    km = np.where(np.isfinite(km), km, 0.0)
    ke = np.where(valid, np.exp(np.where(valid, k - km, 0.0)), 0.0)
    ks = ke.sum(-2, keepdims=True)
    kp = ke / np.where(ks > 0, ks, 1.0)
    qp = np.where(valid, qp, 0.0)
    ctx = _T(kp) @ v                                        # (B, H, D, M)
    out = qp @ ctx
    # gradients
    dctx = _T(qp) @ g
    dqp = g @ _T(ctx)
    dq = np.where(valid, qp * (dqp - (qp * dqp).sum(-1, keepdims=True)), 0.0)
    dkp = v @ _T(dctx)
    dk = np.where(valid, kp * (dkp - (kp * dkp).sum(-2, keepdims=True)), 0.0)
    dv = np.where(valid, kp @ dctx, 0.0)
    # magnitudes
    aq, ak = np.abs(q), np.abs(np.where(valid, k, 0.0))
    qm = qp * (1.0 + aq + aq.max(-1, keepdims=True))
    kmg = kp * (1.0 + ak + ak.max(-2, keepdims=True))
    ag, av = np.abs(g), np.abs(v)
    ctx_m = _T(kmg) @ av
    dctx_m = _T(qm) @ ag
    dqp_m = ag @ _T(ctx_m)
    dkp_m = av @ _T(dctx_m)
    return dict(out=out, dq=dq, dk=dk, dv=dv,
                mag_out=qm @ ctx_m,
                mag_dq=np.where(valid, qm * (dqp_m + (qm * dqp_m).sum(-1, keepdims=True)), 0.0),
                mag_dk=np.where(valid, kmg * (dkp_m + (kmg * dkp_m).sum(-2, keepdims=True)), 0.0),
                mag_dv=np.where(valid, kmg @ dctx_m, 0.0))


@functools.lru_cache(maxsize=64)
def linformer_params(seed, count, max_len):
    """attention/README.md (linformer): `op` draws its parameters from --seed, stream 0:
    element j = (2 uniform(seed, 0, j) - 1) / sqrt(max_len), rounded to float32."""
    bound = 1.0 / math.sqrt(max_len)
    vals = [(2.0 * _unit(philox_block(seed, 0, j)[0]) - 1.0) * bound for j in range(count)]
    return _readonly(np.array(vals, dtype=np.float32).astype(np.float64))


def ref_linformer(q, k, v, g, lengths, E, F, scale):
    """Linformer (README): per slice Kp = E[:, :L] K[:L], Vp = F[:, :L] V[:L] (E, F: k x
    max_len, shared by the heads), out_i = softmax_r(scale q_i . Kp_r) Vp for i < L,
    padded rows zero. Also dE, dF (summed over batch rows and heads). Magnitudes: the
    products' |terms|, each softmax weight counted (1 + |scale| |q_i|.|Kp_r|mag) times."""
    B, H, N, D = q.shape
    L = np.full(B, N) if lengths is None else np.asarray(lengths)
    valid = (np.arange(N)[None, :] < L[:, None])[:, None, :, None]      # (B, 1, N, 1)
    E, F = E[:, :N], F[:, :N]
    km, vm = np.where(valid, k, 0.0), np.where(valid, v, 0.0)
    kp, vp = E @ km, F @ vm                                             # (B, H, P, D|M)
    P = E.shape[0]
    mask = np.broadcast_to(valid, (B, 1, N, P))
    a, _ = masked_softmax(scale * (q @ _T(kp)), mask)                  # (B, H, N, P)
    out = a @ vp
    gm = np.where(valid, g, 0.0)
    ds = a * (gm @ _T(vp) - (gm * out).sum(-1, keepdims=True))
    dkp = scale * (_T(ds) @ q)
    dvp = _T(a) @ gm
    dq = scale * (ds @ kp)
    dk = np.where(valid, _T(E) @ dkp, 0.0)
    dv = np.where(valid, _T(F) @ dvp, 0.0)
    dE = (dkp @ _T(km)).sum((0, 1))                                    # (P, N)
    dF = (dvp @ _T(vm)).sum((0, 1))
    # magnitudes
    aE, aF, aq, ag = np.abs(E), np.abs(F), np.abs(q), np.abs(gm)
    kp_m, vp_m = aE @ np.abs(km), aF @ np.abs(vm)
    pm = a * (1.0 + abs(scale) * (aq @ _T(kp_m)))
    mag_out = pm @ vp_m
    ds_m = pm * (ag @ _T(vp_m) + (ag * mag_out).sum(-1, keepdims=True))
    dkp_m = abs(scale) * (_T(ds_m) @ aq)
    dvp_m = _T(pm) @ ag
    return dict(out=out, dq=dq, dk=dk, dv=dv, dE=dE, dF=dF,
                mag_out=mag_out, mag_dq=abs(scale) * (ds_m @ kp_m),
                mag_dk=np.where(valid, _T(aE) @ dkp_m, 0.0), mag_dv=np.where(valid, _T(aF) @ dvp_m, 0.0),
                mag_dE=(dkp_m @ _T(np.abs(km))).sum((0, 1)), mag_dF=(dvp_m @ _T(np.abs(vm))).sum((0, 1)))


def ref_polynomial(q, k, v, g, lengths, causal, c, scale, eps):
    """sim = (c + scale q.k)^2, computed directly (no feature map). The magnitudes are
    those of the exact features [c, sqrt(2 c scale) x, scale x_a x_b]: their products
    sum to (c + scale |q|.|k|)^2."""
    B, H, N, D = q.shape
    mask = base_mask(B, N, lengths, causal)
    t = c + scale * (q @ _T(k))
    t_mag = c + scale * (np.abs(q) @ _T(np.abs(k)))
    r = _kernel_smoother(t * t, t_mag * t_mag, v, g, mask, eps)
    dS, dS_mag = r.pop("dS"), r.pop("dS_mag")
    dA = dS * 2.0 * t * scale
    dA_mag = dS_mag * 2.0 * t_mag * scale
    r.update(dq=dA @ k, dk=_T(dA) @ q, mag_dq=dA_mag @ np.abs(k), mag_dk=_T(dA_mag) @ np.abs(q))
    return r


def lsh_buckets(q, R):
    """First argmax of [xR, -xR] for every position, and the gap between the largest
    and second largest entry for unit-norm x (how far the hash is from a tie)."""
    n = np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
    xr = (q / n) @ R
    cand = np.concatenate([xr, -xr], axis=-1)
    bucket = np.argmax(cand, axis=-1)                      # numpy: first maximum
    srt = np.sort(cand, axis=-1)
    return bucket, srt[..., -1] - srt[..., -2]


def lsh_masks(q, lengths, causal, rounds, bits, chunk, seed):
    """(rounds, B, H, N, N) boolean: who attends to whom in each round, following the
    README: stable sort by (bucket, position), chunk c sees chunks c and c-1, causal by
    original position, padding never attended, self only when nothing else is allowed.
    Only positions < lengths[b] are sorted (padding takes no chunk slot, so the content
    of padding cannot change the output)."""
    B, H, N, D = q.shape
    L = np.full(B, N) if lengths is None else np.asarray(lengths)
    masks = np.zeros((rounds, B, H, N, N), dtype=bool)
    pos = np.arange(N)
    for r in range(rounds):
        bucket, _ = lsh_buckets(q, lsh_rotation(seed, r, D, bits))
        for b in range(B):
            Lb = int(L[b])
            for h in range(H):
                order = np.lexsort((pos[:Lb], bucket[b, h, :Lb]))  # by bucket, then position
                ch = np.empty(Lb, dtype=np.int64)
                ch[order] = np.arange(Lb) // chunk
                m = np.zeros((N, N), dtype=bool)
                m[:Lb, :Lb] = (ch[None, :] == ch[:, None]) | (ch[None, :] == ch[:, None] - 1)
                if causal:
                    m &= pos[:, None] >= pos[None, :]
                np.fill_diagonal(m, False)
                alone = ~m.any(-1) & (pos < Lb)
                m[alone, alone] = True
                masks[r, b, h] = m
    return masks


def ref_lsh(q, k, v, g, lengths, causal, rounds, bits, chunk, combine, scale, seed,
            masks=None):
    """Shared-QK LSH attention; masks (from lsh_masks) may be passed to hold the buckets
    fixed (finite differences)."""
    if masks is None:
        masks = lsh_masks(q, lengths, causal, rounds, bits, chunk, seed)
    nrm = np.linalg.norm(q, axis=-1, keepdims=True)
    n = np.maximum(nrm, 1e-12)
    kn = q / n                                             # keys: normalised queries
    s = scale * (q @ _T(kn))
    ps, lses, outs = [], [], []
    for r in range(rounds):
        p, lse = masked_softmax(s, masks[r])
        ps.append(p)
        lses.append(lse)
        outs.append(p @ v)
    live = masks[0].any(-1)                                # (B, H, N): non-padded rows
    if combine == "mean":
        w = [np.full(live.shape, 1.0 / rounds)] * rounds
    else:
        lse = np.stack([np.where(live, x, 0.0) for x in lses])   # (R, B, H, N)
        e = np.exp(lse - lse.max(0, keepdims=True))
        w = list(np.where(live, e / e.sum(0, keepdims=True), 0.0))
    out = sum(w[r][..., None] * outs[r] for r in range(rounds))

    ag, av, aq, akn = np.abs(g), np.abs(v), np.abs(q), np.abs(kn)
    dw = [(g * outs[r]).sum(-1) for r in range(rounds)]
    out_mags = [softmax_weight_mag(ps[r], q, kn, scale) @ av for r in range(rounds)]
    dw_mag = [(ag * out_mags[r]).sum(-1) for r in range(rounds)]
    wdw = sum(w[r] * dw[r] for r in range(rounds))
    wdw_mag = sum(w[r] * dw_mag[r] for r in range(rounds))
    dq, dkn, dv = np.zeros_like(q), np.zeros_like(q), np.zeros_like(v)
    mag_out, mag_dq, mag_dkn, mag_dv = (np.zeros_like(v), np.zeros_like(q),
                                        np.zeros_like(q), np.zeros_like(v))
    for r in range(rounds):
        p, wr = ps[r], w[r][..., None]
        pm = softmax_weight_mag(p, q, kn, scale)
        gr = wr * g
        if combine == "logsumexp":
            dlse = w[r] * (dw[r] - wdw)
            dlse_mag = w[r] * (dw_mag[r] + wdw_mag)
        else:
            dlse = dlse_mag = np.zeros_like(w[r])
        ds = p * (gr @ _T(v) - (gr * outs[r]).sum(-1, keepdims=True) + dlse[..., None])
        ds_mag = pm * (wr * (ag @ _T(av) + (ag * out_mags[r]).sum(-1, keepdims=True))
                      + dlse_mag[..., None])
        dv += _T(p) @ gr
        dq += scale * (ds @ kn)
        dkn += scale * (_T(ds) @ q)
        mag_out += wr * out_mags[r]
        mag_dv += _T(pm) @ (wr * ag)
        mag_dq += scale * (ds_mag @ akn)
        mag_dkn += scale * (_T(ds_mag) @ aq)
    dq += np.where(nrm > 1e-12, (dkn - kn * (kn * dkn).sum(-1, keepdims=True)) / n, dkn / n)
    mag_dq += (mag_dkn + akn * (akn * mag_dkn).sum(-1, keepdims=True)) / n
    return dict(out=out, dq=dq, dk=np.zeros_like(q), dv=dv, mag_out=mag_out, mag_dq=mag_dq,
                mag_dk=np.zeros_like(q), mag_dv=mag_dv)


# DeltaNet (attention/README.md, "deltanet"): the eps under the normalisation's root.
def reference(variant, q, k, v, g, lengths, causal, o, seed, masks=None, max_len=None, params=None, aux=None):
    """o: the options as given to `--set` (absent or "auto": the README's default).
    A variant with parameters (linformer) takes them for max_len (default N), drawn from
    the seed as `op` does, or given (params: the flat array, the self-test's). A variant
    with an input of its own (INPUTS) takes it as aux."""
    o = {key: val for key, val in o.items() if val != "auto" and key not in COMMON_OPTIONS}
    if variant == "linformer":
        return _linformer(q, k, v, g, lengths, causal, o, seed, max_len or q.shape[2], params)
    if aux is not None:
        return REFERENCES[variant].fn(q, k, v, g, lengths, causal, o, seed, masks, aux=aux)
    return REFERENCES[variant].fn(q, k, v, g, lengths, causal, o, seed, masks)


def _auto_scale(q):
    return 1.0 / math.sqrt(q.shape[-1])


def _softmax(q, k, v, g, lengths, causal, o, seed, masks):
    return ref_softmax(q, k, v, g, lengths, causal, o.get("scale", _auto_scale(q)))


def _linear(q, k, v, g, lengths, causal, o, seed, masks):
    return ref_linear(q, k, v, g, lengths, causal, o.get("feature_map", "elu"), o.get("eps", 1e-6), seed, o)


def _efficient(q, k, v, g, lengths, causal, o, seed, masks):
    assert not causal, "efficient is non-causal only"
    return ref_efficient(q, k, v, g, lengths)


def _local(q, k, v, g, lengths, causal, o, seed, masks):
    return ref_softmax(q, k, v, g, lengths, causal, o.get("scale", _auto_scale(q)), window=o.get("window", 256))


def _sparse(q, k, v, g, lengths, causal, o, seed, masks):
    N = q.shape[2]
    auto = int(math.floor(math.sqrt(N) + 0.5))      # round(sqrt(N)), the README's auto
    pattern = strided_mask(N, o.get("window", auto), o.get("stride", auto), causal)
    return ref_softmax(q, k, v, g, lengths, causal, o.get("scale", _auto_scale(q)), pattern=pattern)


def _polynomial(q, k, v, g, lengths, causal, o, seed, masks):
    return ref_polynomial(q, k, v, g, lengths, causal, o.get("c", 1.0), o.get("scale", _auto_scale(q)),
                          o.get("eps", 1e-6))


def _retention(q, k, v, g, lengths, causal, o, seed, masks):
    return ref_retention(q, k, v, g, lengths, causal, o.get("gamma"), o.get("scale", _auto_scale(q)))
def _gla(q, k, v, g, lengths, causal, o, seed, masks, aux=None):
    return ref_gla(q, k, v, g, lengths, causal, aux, o.get("scale", _auto_scale(q)))


def linformer_split(params, o, max_len):
    """E and F (k x max_len) of the flat parameters: E then F (share=none), or E = F."""
    P = o.get("k", 256)
    E = params[:P * max_len].reshape(P, max_len)
    F = params[P * max_len:].reshape(P, max_len) if o.get("share", "none") == "none" else E
    return E, F


def linformer_count(o, max_len):
    return o.get("k", 256) * max_len * (2 if o.get("share", "none") == "none" else 1)


def _linformer(q, k, v, g, lengths, causal, o, seed, max_len, params=None):
    assert not causal, "linformer is non-causal only"
    if params is None:
        params = linformer_params(seed, linformer_count(o, max_len), max_len)
    E, F = linformer_split(params, o, max_len)
    r = ref_linformer(q, k, v, g, lengths, E, F, o.get("scale", _auto_scale(q)))
    # the gradient of the flat parameters: dE then dF, or dE + dF when E = F
    dE, dF = np.zeros((E.shape[0], max_len)), np.zeros((E.shape[0], max_len))
    mE, mF = np.zeros_like(dE), np.zeros_like(dF)
    N = q.shape[2]
    dE[:, :N], dF[:, :N], mE[:, :N], mF[:, :N] = r.pop("dE"), r.pop("dF"), r.pop("mag_dE"), r.pop("mag_dF")
    if o.get("share", "none") == "none":
        r["dparams"], r["mag_dparams"] = np.concatenate([dE.ravel(), dF.ravel()]), np.concatenate([mE.ravel(), mF.ravel()])
    else:
        r["dparams"], r["mag_dparams"] = (dE + dF).ravel(), (mE + mF).ravel()
    r["params"] = params
    return r


def _lsh(q, k, v, g, lengths, causal, o, seed, masks):
    return ref_lsh(q, k, v, g, lengths, causal, o.get("rounds", 1), o.get("bits", 8), o.get("chunk", 32),
                   o.get("combine", "mean"), o.get("scale", _auto_scale(q)), seed, masks)


# How a case draws a variant's options: rng, the case's D, and the allowed values of the
# variant's choice options as `attnbench list --json` gives them (option -> names).
# Each option is left at its default now and then.
CHUNK_CHOICES = [1, 2, 3, 5, 7, 8, 16, 32, 64, 100]


def _deltanet(q, k, v, g, lengths, causal, o, seed, masks, aux=None):
    assert causal, "deltanet is causal only"
    assert aux is not None, "deltanet reads beta"
    return ref_deltanet(q, k, v, g, lengths, aux)


def _draw_scale(rng, o, explicit, value):
    """o["scale"]: value() (rounded to float32) with probability `explicit`, else "auto"
    half of the time, else unset (the variant's default)."""
    if rng.random() < explicit:
        o["scale"] = float(np.float32(value()))
    elif rng.random() < 0.5:
        o["scale"] = "auto"


def _draw_softmax(rng, D, choices):
    o = {}
    _draw_scale(rng, o, 0.6, lambda: rng.choice([0.0, rng.uniform(-2, 2), 1.0]))
    return o


def _draw_linear(rng, D, choices):
    o = {"feature_map": str(rng.choice(choices["feature_map"]))}
    if o["feature_map"] == "favor" and rng.random() < 0.7:
        o["features"] = int(rng.choice([1, 2, D, 2 * D + 1, 3 * D]))
    if rng.random() < 0.7:
        o["eps"] = float(rng.choice([0.0, 1e-6, 1e-3, 0.1, 1.0]))
        if o["eps"] == 0.0 and o["feature_map"] == "taylor" and D == 1:
            # taylor's sim = 1 + sign(q) sign(k) is 0 for opposite signs, so a row
            # may have a zero denominator: 0/0, NaN on both sides (README).
            o["eps"] = 1e-6
    if rng.random() < 0.7:
        o["chunk"] = int(rng.choice(CHUNK_CHOICES))
    elif rng.random() < 0.5:
        o["chunk"] = "auto"
    return o


def _draw_polynomial(rng, D, choices):
    o = {}
    if rng.random() < 0.7:
        o["c"] = float(rng.choice([0.0, 0.5, 1.0, 2.5]))
    _draw_scale(rng, o, 0.6, lambda: rng.uniform(0.05, 1.0))
    if rng.random() < 0.6:
        o["eps"] = float(rng.choice([0.0, 1e-6, 1e-3, 0.1]))
    if rng.random() < 0.7:
        o["chunk"] = int(rng.choice(CHUNK_CHOICES))
    elif rng.random() < 0.5:
        o["chunk"] = "auto"
    return o


def _draw_efficient(rng, D, choices):
    return {}


def _draw_local(rng, D, choices):
    o = {}
    if rng.random() < 0.85:
        o["window"] = int(rng.choice([1, 2, 3, 5, 17, 64, 1000]))
    _draw_scale(rng, o, 0.6, lambda: rng.choice([0.0, rng.uniform(-2, 2), 1.0]))
    return o


def _draw_sparse(rng, D, choices):
    o = {}
    if rng.random() < 0.8:
        o["window"] = int(rng.choice([1, 2, 3, 5, 17, 64, 1000]))
    elif rng.random() < 0.5:
        o["window"] = "auto"
    if rng.random() < 0.8:
        o["stride"] = int(rng.choice([1, 2, 3, 4, 7, 16, 1000]))
    elif rng.random() < 0.5:
        o["stride"] = "auto"
    _draw_scale(rng, o, 0.6, lambda: rng.choice([0.0, rng.uniform(-2, 2), 1.0]))
    return o


def _draw_linformer(rng, D, choices):
    o = {"k": int(rng.choice([1, 2, 3, 5, 8, 17, 40]))}
    if rng.random() < 0.85:
        o["share"] = str(rng.choice(choices["share"]))
    _draw_scale(rng, o, 0.5, lambda: rng.choice([0.0, rng.uniform(-2, 2), 1.0]))
    return o


def _draw_deltanet(rng, D, choices):
    o = {}
    if rng.random() < 0.7:
        o["chunk"] = int(rng.choice(CHUNK_CHOICES))
    elif rng.random() < 0.5:
        o["chunk"] = "auto"
    return o


def _draw_lsh(rng, D, choices):
    # defaults: rounds 1, bits 8, chunk 32, mean
    o = {}
    if rng.random() < 0.85:
        o["rounds"] = int(rng.choice([1, 2, 4]))
    if rng.random() < 0.85:
        o["bits"] = int(rng.choice([1, 2, 3, 4, 8]))
    if rng.random() < 0.85:
        o["chunk"] = int(rng.choice(CHUNK_CHOICES))
    if rng.random() < 0.85:
        o["combine"] = str(rng.choice(choices["combine"]))
    _draw_scale(rng, o, 0.6, lambda: rng.uniform(0.0, 2.0))
    return o


def _draw_retention(rng, D, choices):
    o = {}
    if rng.random() < 0.7:
        o["gamma"] = float(rng.choice([1.0, 0.999, 0.9, 0.5, 0.05]))
    elif rng.random() < 0.5:
        o["gamma"] = "auto"
    _draw_scale(rng, o, 0.5, lambda: rng.choice([0.0, rng.uniform(-2, 2), 1.0]))
    if rng.random() < 0.7:
        o["chunk"] = int(rng.choice(CHUNK_CHOICES))
    elif rng.random() < 0.5:
        o["chunk"] = "auto"
    return o


def _draw_gla(rng, D, choices):
    o = {}
    if rng.random() < 0.8:
        o["gate"] = str(rng.choice(choices["gate"]))
    _draw_scale(rng, o, 0.5, lambda: rng.uniform(0.05, 2.0))
    if rng.random() < 0.7:
        o["chunk"] = int(rng.choice(CHUNK_CHOICES))
    elif rng.random() < 0.5:
        o["chunk"] = "auto"
    return o


def _input_g(rng, B, H, N, D, o):
    """gla's log-gates: (B, H, N, D) with gate=vector (the default), (B, H, N) with
    gate=scalar or D = 1 (one float per position: `op` reads it as [B, H, N]); -gmax u^2,
    u uniform, gmax from mild (0.05) to strong (20, whose products along N = 70 fall far
    below float range), some exactly 0."""
    shape = (B, H, N) if o.get("gate") == "scalar" or D == 1 else (B, H, N, D)
    gmax = float(rng.choice([0.05, 0.5, 2.0, 20.0]))
    x = -gmax * rng.uniform(0.0, 1.0, size=shape) ** 2
    x[rng.random(shape) < 0.1] = 0.0
    return x.astype(np.float32)


def _input_beta(rng, B, H, N, D, o):
    """deltanet's rates: (B, H, N), uniform in [0.05, 0.95], away from the ends so that
    every step both keeps and writes."""
    return rng.uniform(0.05, 0.95, size=(B, H, N)).astype(np.float32)


class Ref:
    """A variant's reference: fn(q, k, v, g, lengths, causal, o, seed, masks) -> dict (o
    without "auto" values), the options it reads (name -> None for a number, or the set
    of values it knows for a choice option), draw (see above), and the name of its own
    input (INPUTS) if it reads one, which fn then takes as aux=, and whether it computes
    causal attention only (its cases are all causal)."""

    def __init__(self, fn, options, draw, input=None, causal_only=False):
        self.fn, self.options, self.draw, self.input = fn, options, draw, input
        self.causal_only = causal_only


# The references, by the variant names of `attnbench list --json`. The cross-check
# runs the variants the binary lists; one listed without an entry here, or with an
# option or a choice value its entry does not know, fails the test (see coverage).
REFERENCES = {
    "softmax": Ref(_softmax, {"scale": None}, _draw_softmax),
    "stateful-softmax": Ref(_softmax, {"scale": None}, _draw_softmax),
    "linear": Ref(_linear, {"feature_map": set(FEATURE_MAPS), "eps": None, "chunk": None, "features": None},
                  _draw_linear),
    "polynomial": Ref(_polynomial, {"c": None, "scale": None, "eps": None, "chunk": None}, _draw_polynomial),
    "lsh": Ref(_lsh, {"rounds": None, "bits": None, "chunk": None, "combine": {"mean", "logsumexp"},
                      "scale": None}, _draw_lsh),
    "efficient": Ref(_efficient, {}, _draw_efficient),
    "local": Ref(_local, {"window": None, "scale": None}, _draw_local),
    "linformer": Ref(_linformer, {"k": None, "share": {"none", "kv", "layer"}, "scale": None}, _draw_linformer),
    "retention": Ref(_retention, {"gamma": None, "scale": None, "chunk": None}, _draw_retention),
    "sparse": Ref(_sparse, {"window": None, "stride": None, "scale": None}, _draw_sparse),
    "deltanet": Ref(_deltanet, {"chunk": None}, _draw_deltanet, input="beta", causal_only=True),
    "gla": Ref(_gla, {"scale": None, "gate": {"vector", "scalar"}, "chunk": None}, _draw_gla, input="g"),
}

# Inputs of a variant's own, by the name `attnbench list --json` gives under "input"
# (op's --NAME FILE.npy, its gradient dNAME.npy): draw(rng, B, H, N, D, o) -> float32
# array of the shape the variant reads with options o. The reference takes it as aux
# and returns "dNAME" and "mag_dNAME" beside dq, dk, dv.
INPUTS = {"g": _input_g, "beta": _input_beta}

# Options every variant has (the registry's common options): precision changes how the
# CUDA backend rounds (fp32 or TF32 operands), not what is computed, so the references
# ignore it; cases draw tf32 on the CUDA device only and hold it to TOL_TF32 (xcheck.py).
COMMON_OPTIONS = {"precision": {"fp32", "tf32"}}

# The modes run_op knows: "parallel" (forward and backward) and "recurrent" (steps over
# t = 0..N-1, compared with the causal forward).
MODES = {"parallel", "recurrent"}
