"""The cross-check's numpy references of the linear-RNN family since the paper (gla,
retention, deltanet), written from their definitions (attention/README.md), as xref.py's
others; xref.py registers them in REFERENCES."""

import numpy as np


def _T(x):
    return np.swapaxes(x, -1, -2)


def _base_mask(B, N, lengths, causal):
    """xref.base_mask (imported at the call: xref imports this module)."""
    from xref import base_mask
    return base_mask(B, N, lengths, causal)


def ref_gla(q, k, v, g, lengths, causal, gates, scale):
    """Gated linear attention (README, attention/README.md: gla), from its definition:
    gates (B, H, N, D) or (B, H, N) are the log-gates g <= 0, b_i = sum_{t<=i} g_t per key
    dimension (a scalar gate serves every dimension), and
        out_i = scale sum_j sum_d q_id k_jd w_ijd v_j,
    w_ijd = e^(b_id - b_jd) over j <= i (causal), e^(-|b_id - b_jd|) over every j
    (non-causal); only valid positions take part. The gradient of the gate: w_ijd is
    e^(the sum of the gates g_td for min(i, j) < t <= max(i, j)), so each term
    c_ijd = scale (g_i . v_j) q_id k_jd w_ijd adds to dg_td for exactly those t.
    Magnitudes: a weight carries the rounding of the gates' sums, u |b_i - b_j|
    relative, so it counts (1 + |b_id - b_jd|) times (as softmax's scores); dg is held
    to the magnitude of its evaluation through dg_t = sum_{t'>=t} (q dq - k dk)_t'
    (Yang et al. 2023), summed over the whole sequence when non-causal (each direction
    has its own suffix sums), the cheap form any implementation uses: the value itself is
    the definition's."""
    B, H, N, D = q.shape
    scalar = gates.ndim == 3
    gd = gates[..., None] if scalar else gates
    b = np.cumsum(gd, axis=2)                                   # (B, H, N, D or 1)
    diff = b[:, :, :, None, :] - b[:, :, None, :, :]            # b_i - b_j: (B, H, N, N, D|1)
    mask = _base_mask(B, N, lengths, causal)[..., None]          # (B, 1, N, N, 1)
    w = np.where(mask, np.exp(-np.abs(diff)), 0.0)
    wm = w * (1.0 + np.abs(diff))
    w = np.broadcast_to(w, (B, H, N, N, D))
    wm = np.broadcast_to(wm, (B, H, N, N, D))
    aq, ak, av, ag = np.abs(q), np.abs(k), np.abs(v), np.abs(g)
    A = scale * np.einsum("bhid,bhjd,bhijd->bhij", q, k, w)
    Am = abs(scale) * np.einsum("bhid,bhjd,bhijd->bhij", aq, ak, wm)
    out = A @ v
    dA = g @ _T(v)
    dAm = ag @ _T(av)
    dq = scale * np.einsum("bhij,bhijd,bhjd->bhid", dA, w, k)
    dk = scale * np.einsum("bhij,bhijd,bhid->bhjd", dA, w, q)
    mag_dq = abs(scale) * np.einsum("bhij,bhijd,bhjd->bhid", dAm, wm, ak)
    mag_dk = abs(scale) * np.einsum("bhij,bhijd,bhid->bhjd", dAm, wm, aq)
    t = np.arange(N)
    lo = np.minimum(t[:, None], t[None, :])
    hi = np.maximum(t[:, None], t[None, :])
    straddle = (lo[None] < t[:, None, None]) & (t[:, None, None] <= hi[None])    # (t, i, j)
    c = scale * np.einsum("bhij,bhid,bhjd,bhijd->bhijd", dA, q, k, w)
    dgate = np.einsum("tij,bhijd->bhtd", straddle.astype(np.float64), c)
    per = aq * mag_dq + ak * mag_dk                             # (B, H, N, D)
    if scalar:
        dgate, per = dgate.sum(-1), per.sum(-1)
    if causal:
        mag_dg = np.flip(np.cumsum(np.flip(per, 2), axis=2), 2)
    else:
        mag_dg = np.broadcast_to(per.sum(2, keepdims=True), per.shape).copy()
    valid = _base_mask(B, N, lengths, False)[:, 0, 0, :]          # (B, N): position valid
    vmask = valid[:, None, :] if scalar else valid[:, None, :, None]
    mag_dg = np.where(vmask, mag_dg, 0.0)
    return dict(out=out, dq=dq, dk=dk, dv=_T(A) @ g, dg=dgate,
                mag_out=Am @ av, mag_dq=mag_dq, mag_dk=mag_dk, mag_dv=_T(Am) @ ag, mag_dg=mag_dg)


def ref_retention(q, k, v, g, lengths, causal, gamma, scale):
    """RetNet's retention (README): out_i = scale sum_j gamma_h^|i-j| (q_i . k_j) v_j over
    the allowed j, gamma_h = 1 - 2^(-5-h) per head h unless one gamma is given. The
    weights W_ij = scale gamma^|i-j| are exact, so the magnitudes are those of the
    products q.k, g.v with W's absolute value."""
    B, H, N, D = q.shape
    if gamma is None:
        gam = 1.0 - 2.0 ** (-5.0 - np.arange(H))
    else:
        gam = np.full(H, float(gamma))
    dist = np.abs(np.arange(N)[:, None] - np.arange(N)[None, :]).astype(float)
    W = scale * gam[:, None, None] ** dist[None]                         # (H, N, N)
    W = np.where(_base_mask(B, N, lengths, causal), W[None], 0.0)         # (B, H, N, N)
    aW = np.abs(W)
    A = W * (q @ _T(k))
    dA = W * (g @ _T(v))
    A_mag = aW * (np.abs(q) @ _T(np.abs(k)))
    dA_mag = aW * (np.abs(g) @ _T(np.abs(v)))
    return dict(out=A @ v, dq=dA @ k, dk=_T(dA) @ q, dv=_T(A) @ g,
                mag_out=A_mag @ np.abs(v), mag_dq=dA_mag @ np.abs(k), mag_dk=_T(dA_mag) @ np.abs(q),
                mag_dv=_T(A_mag) @ np.abs(g))


DELTANET_EPS = 1e-6


def ref_deltanet(q, k, v, g, lengths, beta, eps=DELTANET_EPS):
    """DeltaNet, causal: per slice, with qn = q / sqrt(|q|^2 + eps), kn likewise,
    S_0 = 0, S_t = (I - beta_t kn_t kn_t^T) S_{t-1} + beta_t kn_t v_t^T (D x M),
    out_t = S_t^T qn_t; positions >= lengths[b] take no part and get zeros. Gradients of
    sum(out * g) by the reverse recurrence (G = dL/dS_t):
        G += qn_t g_t^T; dqn_t = S_t g_t; dv_t = beta_t G^T kn_t;
        dbeta_t = kn_t^T G (v_t - S_{t-1}^T kn_t);
        dkn_t = beta_t (G (v_t - S_{t-1}^T kn_t) - S_{t-1} G^T kn_t); G <- (I - beta_t kn_t kn_t^T) G
    and through the normalisation dx = (dxn - xn (xn . dxn)) / |x|_eps.
    Magnitudes: per position, broadcast over the row, bounds on the norms of the terms
    a value is made of (below)."""
    B, H, N, D = q.shape
    M = v.shape[-1]
    L = np.full(B, N) if lengths is None else np.asarray(lengths)
    valid = (np.arange(N)[None, :] < L[:, None])[:, None, :]            # (B, 1, N)
    rq, rk = np.sqrt((q * q).sum(-1) + eps), np.sqrt((k * k).sum(-1) + eps)
    qn, kn = q / rq[..., None], k / rk[..., None]
    bt = np.where(valid, beta, 0.0)                                      # padding: no update
    gm = np.where(valid[..., None], g, 0.0)
    eye = np.eye(D)
    S = np.zeros((B, H, D, M))
    states = [S]
    out = np.zeros_like(v)
    for t in range(N):
        kk = kn[:, :, t, :, None] * kn[:, :, t, None, :]                   # (B, H, D, D)
        b = bt[:, :, t, None, None]
        S = (eye - b * kk) @ S + b * (kn[:, :, t, :, None] * v[:, :, t, None, :])
        states.append(S)
        out[:, :, t] = np.einsum("bhdm,bhd->bhm", S, qn[:, :, t])
    out = np.where(valid[..., None], out, 0.0)
    dqn, dkn = np.zeros_like(q), np.zeros_like(k)
    dv, dbeta = np.zeros_like(v), np.zeros_like(beta)
    G = np.zeros((B, H, D, M))
    gnorm = np.zeros((B, H, N))
    for t in range(N - 1, -1, -1):
        Sp, St = states[t], states[t + 1]
        kt, b = kn[:, :, t], bt[:, :, t]
        G = G + qn[:, :, t, :, None] * gm[:, :, t, None, :]
        gnorm[:, :, t] = np.sqrt((G * G).sum((-1, -2)))
        dqn[:, :, t] = np.einsum("bhdm,bhm->bhd", St, gm[:, :, t])
        e = v[:, :, t] - np.einsum("bhdm,bhd->bhm", Sp, kt)
        gk = np.einsum("bhdm,bhd->bhm", G, kt)
        dv[:, :, t] = b[..., None] * gk
        dbeta[:, :, t] = (gk * e).sum(-1)
        dkn[:, :, t] = b[..., None] * (np.einsum("bhdm,bhm->bhd", G, e) - np.einsum("bhdm,bhm->bhd", Sp, gk))
        G = G - b[..., None, None] * (kt[..., :, None] * gk[..., None, :])
    dq = (dqn - qn * (qn * dqn).sum(-1, keepdims=True)) / rq[..., None]
    dk = (dkn - kn * (kn * dkn).sum(-1, keepdims=True)) / rk[..., None]
    # magnitudes: norms of the terms (a dot product's |terms| sum to at most the norms'
    # product, |kn| <= 1, beta <= 1); a step adds terms of |S_{t-1}|, |v_t| and |e_t| to S
    # and its rounding is never amplified later, so the steps' terms add up (eS); the
    # same backwards for G (eG)
    sF = np.array([np.sqrt((s * s).sum((-1, -2))) for s in states[1:]]).transpose(1, 2, 0)     # |S_t|_F
    sP = np.array([np.sqrt((s * s).sum((-1, -2))) for s in states[:-1]]).transpose(1, 2, 0)    # |S_{t-1}|_F
    vn, gn = np.sqrt((v * v).sum(-1)), np.sqrt((gm * gm).sum(-1))
    eS = np.cumsum((2 * sP + vn) * valid, axis=-1)
    eSp = eS - (2 * sP + vn) * valid                                     # through t - 1
    eG = np.cumsum(((2 * gnorm + gn) * valid)[..., ::-1], axis=-1)[..., ::-1]
    mag_s = sF + eS                                                      # S_t
    mag_sp = sP + eSp                                                    # S_{t-1}
    mag_e = vn + mag_sp                                                  # e_t
    mag_g = gnorm + eG                                                   # G (after out_t's share)
    mag_dqn = mag_s * gn
    mag_dkn = mag_g * mag_e + mag_sp * mag_g
    z = lambda x: np.where(valid, x, 0.0)                                # noqa: E731
    r = dict(out=out, dq=np.where(valid[..., None], dq, 0.0), dk=np.where(valid[..., None], dk, 0.0),
             dv=np.where(valid[..., None], dv, 0.0), dbeta=z(dbeta),
             mag_out=np.broadcast_to(z(mag_s)[..., None], v.shape).copy(),
             mag_dq=np.broadcast_to(z(2 * mag_dqn / rq)[..., None], q.shape).copy(),
             mag_dk=np.broadcast_to(z(2 * mag_dkn / rk)[..., None], k.shape).copy(),
             mag_dv=np.broadcast_to(z(mag_g)[..., None], v.shape).copy(),
             mag_dbeta=z(mag_g * mag_e))
    return r
