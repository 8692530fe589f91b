/* Linear attention with a feature map (Katharopoulos et al. 2020) on the CPU:
 * variants `linear` (elu+1 or taylor "1 + cos" features) and `polynomial`
 * ((c + scale q.k)^2 through its exact degree-2 features).
 *
 *   out_i = phi(q_i)^T S_i / (phi(q_i)^T Z_i + eps),  S_i = sum_j phi(k_j) v_j^T,
 *   Z_i = sum_j phi(k_j) over allowed j (j <= i when causal; j < L otherwise, L the
 *   valid length of the batch row; rows >= L are padding: zero output and gradient).
 *
 * Numerator and denominator come out of the same products by augmenting V with a
 * column of ones: Vaug [N x (M+1)], Saug [C x (M+1)], Oaug = phiQ Saug.
 *
 * Everything is chunked along N with chunk T: features are computed T rows at a time
 * into per-thread workspace (never a whole-sequence N x C feature tensor: for the
 * polynomial map C = 1 + D + D^2), and every product is an ab_sgemm on T x C, T x T,
 * C x (M+1) blocks. OpenMP runs over the B*H slices.
 *
 * Causal forward, per chunk c (rows of the chunk only):
 *     A = phiQ_c phiK_c^T, lower triangle incl. diagonal
 *     O_c = phiQ_c Saug + A Vaug_c;   Saug += phiK_c^T Vaug_c
 * Backward (paper eqs. 13-15 in chunk form, no per-position state stored), with
 * Gaug_i = [dout_i / (den_i+eps), -(dout_i . out_i) / (den_i+eps)]:
 *   forward sweep:  recompute O_c (so out_i and den_i), then
 *     dphiQ_c = Gaug_c Saug^T + (Gaug_c Vaug_c^T masked) phiK_c;  Saug += ...
 *   reverse sweep, R = sum over later chunks of phiQ^T Gaug:
 *     dphiK_c = Vaug_c R^T + (Gaug_c Vaug_c^T masked)^T phiQ_c
 *     dV_c    = phiK_c R[:, :M] + A^T Gaug_c[:, :M];  R += phiQ_c^T Gaug_c
 * and dq, dk through the feature map's backward.
 *
 * What forward saves for backward: nothing (saved_bytes = 0). The backward's forward
 * sweep must rebuild Saug chunk by chunk for dphiQ anyway, and with it Oaug, which
 * gives out_i and den_i exactly as the forward computed them; saving den_i would
 * spare no work. The two per-position scalars the reverse sweep needs (1/(den+eps)
 * and (dout.out)/(den+eps)) live in O(N) workspace vectors per thread slot.
 *
 * Log-scaled maps (favor, favor.h): the query features of row i come shifted by their
 * own s_i (kept for the chunk's rows in `ls`), the key features by the running key
 * shift c, the largest log-feature over the keys so far: each chunk's keys first by
 * their own maxima, then c grows to the chunk's largest when that is larger, the sums
 * so far (S) are rescaled by e^(c_old - c_new) and the chunk's rows by e^(s_j - c_new)
 * (k_features_running; no pass over the keys beforehand). So Oaug_i carries
 * e^(-s_i - c_i), c_i the shift at row i's chunk, and the eps of row i becomes
 * eps e^(-s_i - c_i) (row_eps): the result is the unshifted formula's. The causal
 * backward keeps each chunk's c (w->cs) from its forward sweep and brings R to the
 * chunk at hand's shift on its way back (e^(c_j - c_next) <= 1). The random projection W is drawn from the seed at the start of every
 * parallel call into the front of the workspace (favor_draw: m D normals and a
 * Gram-Schmidt per D x D block, small next to the attention), and into the recurrent
 * state at its first position (prefill, or step 0), which keeps it. The recurrent state
 * then also holds c per slice, the running maximum over the keys so far: a step whose
 * key raises it rescales S by e^(c_old - c_new) first.
 */
#include "cpu_util.h"
#include "favor.h"
#include "feature_maps.h"
#include "variant.h"

#ifdef ATTNBENCH_HAVE_CUDA
#include "linear_cuda.h"
#endif

#include "../harness/error.h"
#include "../harness/memory.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- options ---- */

#define OPT_EPS                                                                                                       \
    {"eps", ATTN_OPT_DOUBLE, offsetof(attn_params, eps), "1e-6", "added to the denominator, in [0, 1e30]", NULL, 0.0, \
     1e30, false, NULL}
#define OPT_CHUNK                                                                                                     \
    {"chunk", ATTN_OPT_INT, offsetof(attn_params, chunk), "auto",                                                     \
     "chunk length of the chunk-parallel algorithm, 1..65536 or auto (CPU: 32, measured best; CUDA: rounded up to "   \
     "16..64, lowered until the kernels' tiles fit; auto 32, polynomial 64)",                                         \
     NULL, 1,                                                                                                          \
     65536, true, NULL}

/* feature_map's values and help come from the feature maps' table (feature_maps.c);
 * its default is the table's first choice (index 0). */
static const attn_option_spec linear_options[] = {
    {"feature_map", ATTN_OPT_CHOICE, offsetof(attn_params, feature_map), "elu", NULL, NULL, 0, 0, false,
     &fm_linear_choices},
    OPT_EPS,
    OPT_CHUNK,
    {"features", ATTN_OPT_INT, offsetof(attn_params, features), "auto",
     "random features m of feature_map=favor, 1..65536 or auto (2 D); the other maps refuse it", NULL, 1, 65536, true,
     NULL},
};

static const attn_option_spec poly_options[] = {
    {"c", ATTN_OPT_DOUBLE, offsetof(attn_params, c), "1", "constant of sim = (c + scale q.k)^2, in [0, 1e30]", NULL,
     0.0, 1e30, false, NULL},
    {"scale", ATTN_OPT_DOUBLE, offsetof(attn_params, scale), "1/sqrt(D)",
     "scale of q.k in sim = (c + scale q.k)^2, in (0, 1e30] or auto (1/sqrt(D))", NULL, 1e-300, 1e30, true, NULL},
    OPT_EPS,
    OPT_CHUNK,
};

static void defaults_linear(attn_params *p) {
    p->scale = NAN;
    p->feature_map = 0; /* elu */
    p->eps = 1e-6;
    p->chunk = 0;
    p->features = 0; /* auto */
}

static void defaults_poly(attn_params *p) {
    p->scale = NAN;
    p->c = 1.0;
    p->eps = 1e-6;
    p->chunk = 0;
}

/* ---- configuration of one call ---- */

typedef struct {
    fm_spec f;   /* f.W: favor's projection, set once drawn */
    int T;       /* chunk length actually used (<= N) */
    int C, D, M, M1;
    double eps;
    bool scaled; /* the map is log-scaled (favor) */
} lin_cfg;

static bool is_poly(const attn *a) { return a->v == &attn_variant_polynomial; }

/* The map of the attention: polynomial's exact degree-2 map, or linear's choice. */
static fm_kind kind_of(const attn *a) {
    if (is_poly(a)) return FM_POLY;
    return (fm_kind)(fm_linear_choice(a->p.feature_map) - fm_maps);
}

/* Feature count C for input size D, with the attention's options. */
static size_t feature_count(const attn *a, int D) { return fm_maps[kind_of(a)].dim(D, &a->p); }

void lin_feature_map(const attn *a, int D, fm_spec *f) {
    fm_kind kind = kind_of(a);
    fm_init(f, kind, D, a->p.c, kind == FM_POLY ? attn_scale(a, D) : 1.0);
    f->C = (int)feature_count(a, D);
    f->params = &a->p;
    f->seed = a->seed;
}

/* chunk=auto. Measured: causal forward+backward, B=1, H=8, N=4096, 2 threads (AMD
 * EPYC, OpenBLAS OpenMP build, release build), best of 3, ms, for chunk
 * 16/32/48/64/96/128/256:
 *   linear elu     D=M=64:       33.5 32.9 33.3 35.5 40.5 47.3 72.8
 *   linear taylor  D=M=64:       39.3 38.3 38.6  -    -    -    -
 *   polynomial     D=16, M=64:   91.1 90.9 94.3 99.7 113.7 131.5 200.7  (H=8)
 *   polynomial     D=32, M=64:   76.8 77.2 79.6 91.1 100.2 118.4 167.1  (H=2)
 * Small chunks win: the chunk's own T x T products are the only part whose cost
 * grows with T, and at T = 32 the C x (M+1) state products already run near
 * BLAS speed. 32 is best or within 1% everywhere. At N=16384 (elu, H=8) the host
 * was noisy (fwd+bwd 134-240 ms between runs); 16 and 32 were within that noise. */
static int auto_chunk(fm_kind kind, int D) {
    (void)kind;
    (void)D;
    return 32;
}

static int chunk_of(const attn *a, int D) { return a->p.chunk > 0 ? a->p.chunk : auto_chunk(kind_of(a), D); }

static void cfg_make(const attn *a, const attn_shape *s, int len, lin_cfg *g) {
    lin_feature_map(a, s->qk_dim, &g->f);
    int T = chunk_of(a, s->qk_dim);
    g->T = T < len ? T : len;
    if (g->T < 1) g->T = 1;
    g->C = g->f.C;
    g->D = s->qk_dim;
    g->M = s->v_dim;
    g->M1 = s->v_dim + 1;
    g->eps = a->p.eps;
    g->scaled = g->f.map->log_scaled;
}

/* ---- workspace: one slot per outer thread, 64-byte aligned pieces ---- */

typedef struct {
    float *phiq, *phik, *dphi; /* T x C */
    float *vaug, *gaug, *o;    /* T x M1 */
    float *A, *Bm;             /* T x T */
    float *S, *R;              /* C x M1 */
    float *inv, *gd;           /* N: 1/(den+eps), (dout.out)/(den+eps) */
    float *ls, *kl;            /* T: the query rows' shifts s_i; the key rows' own shifts (log-scaled maps) */
    float *cs;                 /* ceil(N/T): the key shift c of each chunk (log-scaled maps' causal backward) */
} lin_slot;

/* Bytes in front of the slots: favor's W (C x D floats) and its draw scratch. */
static size_t prefix_bytes(const lin_cfg *g) {
    if (!g->scaled) return 0;
    return attn_align64((size_t)g->C * (size_t)g->D * sizeof(float)) + attn_align64(favor_draw_scratch(g->D));
}

/* Bytes of one slot, or 0 on overflow. `len` is the number of positions. */
static size_t slot_bytes(const lin_cfg *g, int len) {
    size_t T = (size_t)g->T, C = (size_t)g->C, M1 = (size_t)g->M1, n = (size_t)len, f = sizeof(float);
    size_t tc, cm;
    if (ab_mul_size(T, C, &tc) || ab_mul_size(tc, f, &tc) || ab_mul_size(C, M1, &cm) || ab_mul_size(cm, f, &cm))
        return 0;
    size_t tot = 3 * attn_align64(tc);
    tot += 3 * attn_align64(T * M1 * f) + 2 * attn_align64(T * T * f) + 2 * attn_align64(cm) + 2 * attn_align64(n * f);
    tot += 2 * attn_align64(T * f) + attn_align64(((n + T - 1) / T) * f);
    return tot;
}

static lin_slot slot_carve(const lin_cfg *g, int len, void *ws, int slot) {
    size_t T = (size_t)g->T, C = (size_t)g->C, M1 = (size_t)g->M1, f = sizeof(float);
    char *p = (char *)ws + prefix_bytes(g) + (size_t)slot * slot_bytes(g, len);
    lin_slot w;
#define TAKE(field, count)                                                                                            \
    do {                                                                                                              \
        w.field = (float *)p;                                                                                         \
        p += attn_align64((count) * f);                                                                               \
    } while (0)
    TAKE(phiq, T * C);
    TAKE(phik, T * C);
    TAKE(dphi, T * C);
    TAKE(vaug, T * M1);
    TAKE(gaug, T * M1);
    TAKE(o, T * M1);
    TAKE(A, T * T);
    TAKE(Bm, T * T);
    TAKE(S, C * M1);
    TAKE(R, C * M1);
    TAKE(inv, (size_t)len);
    TAKE(gd, (size_t)len);
    TAKE(ls, T);
    TAKE(kl, T);
    TAKE(cs, ((size_t)len + T - 1) / T);
#undef TAKE
    return w;
}

static int check_shape(const attn *a, const attn_shape *s) {
    lin_cfg g;
    cfg_make(a, s, s->len, &g);
    if (a->p.features > 0 && kind_of(a) != FM_FAVOR)
        return ab_fail(AB_EINVAL, "variant '%s': option features applies to feature_map=favor only (this is %s)",
                       a->v->name, fm_maps[kind_of(a)].name);
    if (g.scaled && (size_t)g.C * (size_t)g.D > (size_t)INT_MAX)
        return ab_fail(AB_EINVAL, "variant '%s': favor's projection of %d x %d is too large", a->v->name, g.C, g.D);
    size_t C = feature_count(a, s->qk_dim), M1 = (size_t)s->v_dim + 1, T = (size_t)g.T;
    /* BLAS takes int sizes and leading dimensions: every block must index with int. */
    if (C > (size_t)INT_MAX || C * M1 > (size_t)INT_MAX || T * C > (size_t)INT_MAX || T * M1 > (size_t)INT_MAX)
        return ab_fail(AB_EINVAL, "variant '%s': D=%d M=%d with chunk %d gives blocks too large (feature size %zu)",
                       a->v->name, s->qk_dim, s->v_dim, g.T, C);
    size_t one = slot_bytes(&g, s->len), all;
    if (one == 0 || ab_mul_size(one, (size_t)attn_outer_threads(s->batch * s->heads), &all) ||
        all > SIZE_MAX - prefix_bytes(&g))
        return ab_fail(AB_EINVAL, "variant '%s': workspace size overflows for D=%d M=%d N=%d", a->v->name, s->qk_dim,
                       s->v_dim, s->len);
    return 0;
}

static size_t saved_bytes(const attn *a, const attn_shape *s) {
    (void)a;
    (void)s;
    return 0;
}

static size_t workspace_bytes(const attn *a, const attn_shape *s) {
    lin_cfg g;
    cfg_make(a, s, s->len, &g);
    return prefix_bytes(&g) + slot_bytes(&g, s->len) * (size_t)attn_outer_threads(s->batch * s->heads);
}

/* favor: draws W into the front of the workspace and points the map at it. */
static void draw_into_ws(const attn *a, lin_cfg *g) {
    if (!g->scaled) return;
    float *W = a->ws;
    favor_draw(a->seed, g->D, g->C, (char *)a->ws + attn_align64((size_t)g->C * g->D * sizeof(float)), W);
    g->f.W = W;
}

/* ---- building blocks ---- */

/* vaug[0..t) = [v_i, 1]. */
static void load_vaug(const lin_cfg *g, int t, const float *v, float *vaug) {
    for (int i = 0; i < t; i++) {
        memcpy(vaug + (size_t)i * g->M1, v + (size_t)i * g->M, sizeof(float) * (size_t)g->M);
        vaug[(size_t)i * g->M1 + g->M] = 1.0f;
    }
}

/* Zeroes the strictly upper triangle of a t x t block (leading dimension ld). */
static void mask_upper(int t, float *X, int ld) {
    for (int i = 0; i < t; i++) memset(X + (size_t)i * ld + i + 1, 0, sizeof(float) * (size_t)(t - i - 1));
}

static void zero_rows(float *x, int from, int to, int width) {
    if (to > from) memset(x + (size_t)from * width, 0, sizeof(float) * (size_t)(to - from) * (size_t)width);
}

/* Features of t query rows into phi (log-scaled maps: each row shifted by its own
 * maximum, written to ls) and of t key rows (shifted by c). */
static void q_features(const lin_cfg *g, int t, const float *x, float *phi, float *ls) {
    fm_shift sh = {ls, 0.0f};
    fm_forward(&g->f, t, x, g->D, phi, g->C, g->scaled ? &sh : NULL);
}

static void k_features(const lin_cfg *g, int t, const float *x, float *phi, float c) {
    fm_shift sh = {NULL, c};
    fm_forward(&g->f, t, x, g->D, phi, g->C, g->scaled ? &sh : NULL);
}

/* Key features of a chunk under the running key shift *c (log-scaled maps; the
 * others: k_features): each row first by its own maximum (kl), then *c grows to the
 * chunk's largest if that is larger, S (the sums so far, C x M1; NULL: none) is rescaled
 * by e^(c_old - c_new), and each row by e^(kl_j - c_new). Both factors are <= 1. */
static void k_features_running(const lin_cfg *g, lin_slot *w, int t, const float *x, float *phi, float *S,
                               float *c) {
    if (!g->scaled) {
        k_features(g, t, x, phi, 0.0f);
        return;
    }
    fm_shift sh = {w->kl, 0.0f};
    fm_forward(&g->f, t, x, g->D, phi, g->C, &sh);
    const float cm = attn_max_f(w->kl, t), c0 = *c;
    if (cm > c0) {
        if (S && c0 > -INFINITY) {
            const float r = (float)exp((double)c0 - cm);
            for (size_t e = 0; e < (size_t)g->C * g->M1; e++) S[e] *= r;
        }
        *c = cm;
    }
    for (int i = 0; i < t; i++) {
        const float r = (float)exp((double)w->kl[i] - *c);
        float *p = phi + (size_t)i * g->C;
        for (int e = 0; e < g->C; e++) p[e] *= r;
    }
}

/* eps of row i: eps, or eps e^(-ls_i - c) for a log-scaled map (its Oaug row carries
 * that factor; see the top of the file). */
static double row_eps(const lin_cfg *g, const float *ls, float c, int i) {
    return g->scaled ? g->eps * exp(-((double)ls[i] + (double)c)) : g->eps;
}

/* Oaug rows -> out rows (num / (den + eps)); inv[i] = 1/(den+eps) if inv != NULL. */
static void finish_rows(const lin_cfg *g, int t, const float *o, float *out, float *inv, const float *ls, float c) {
    for (int i = 0; i < t; i++) {
        const float *oi = o + (size_t)i * g->M1;
        float r = (float)(1.0 / ((double)oi[g->M] + row_eps(g, ls, c, i)));
        if (inv) inv[i] = r;
        if (out)
            for (int m = 0; m < g->M; m++) out[(size_t)i * g->M + m] = oi[m] * r;
    }
}

/* Causal chunked forward over positions [0, L) of one slice, starting from and
 * updating Saug = S and, for a log-scaled map, the running key shift *c (-inf: no key
 * yet; each chunk's is kept in w->cs). out (may be NULL) receives L rows. */
static void causal_forward_slice(const lin_cfg *g, lin_slot *w, int L, const float *q, const float *k,
                                 const float *v, float *out, float *S, float *c) {
    const int T = g->T, C = g->C, D = g->D, M = g->M, M1 = g->M1;
    for (int i0 = 0; i0 < L; i0 += T) {
        int t = L - i0 < T ? L - i0 : T;
        k_features_running(g, w, t, k + (size_t)i0 * D, w->phik, S, c);
        w->cs[i0 / T] = *c;
        load_vaug(g, t, v + (size_t)i0 * M, w->vaug);
        if (out) {
            q_features(g, t, q + (size_t)i0 * D, w->phiq, w->ls);
            ab_sgemm(false, true, t, t, C, 1.0f, w->phiq, C, w->phik, C, 0.0f, w->A, T);
            mask_upper(t, w->A, T);
            ab_sgemm(false, false, t, M1, C, 1.0f, w->phiq, C, S, M1, 0.0f, w->o, M1);
            ab_sgemm(false, false, t, M1, t, 1.0f, w->A, T, w->vaug, M1, 1.0f, w->o, M1);
            finish_rows(g, t, w->o, out + (size_t)i0 * M, NULL, w->ls, *c);
        }
        ab_sgemm(true, false, C, M1, t, 1.0f, w->phik, C, w->vaug, M1, 1.0f, S, M1);
    }
}

/* Non-causal: S = sum over keys j < L of phiK_j Vaug_j^T; a log-scaled map's key
 * features under the running shift, whose final value (the largest over the keys) is
 * returned (0 for the other maps). */
static float noncausal_state(const lin_cfg *g, lin_slot *w, int L, const float *k, const float *v, float *S) {
    const int T = g->T, C = g->C, D = g->D, M = g->M, M1 = g->M1;
    float c = -INFINITY;
    memset(S, 0, sizeof(float) * (size_t)C * M1);
    for (int j0 = 0; j0 < L; j0 += T) {
        int t = L - j0 < T ? L - j0 : T;
        k_features_running(g, w, t, k + (size_t)j0 * D, w->phik, S, &c);
        load_vaug(g, t, v + (size_t)j0 * M, w->vaug);
        ab_sgemm(true, false, C, M1, t, 1.0f, w->phik, C, w->vaug, M1, 1.0f, S, M1);
    }
    return g->scaled ? c : 0.0f;
}

static void noncausal_forward_slice(const lin_cfg *g, lin_slot *w, int L, const float *q, const float *k,
                                    const float *v, float *out) {
    const int T = g->T, C = g->C, D = g->D, M = g->M, M1 = g->M1;
    const float c = noncausal_state(g, w, L, k, v, w->S);
    for (int i0 = 0; i0 < L; i0 += T) {
        int t = L - i0 < T ? L - i0 : T;
        q_features(g, t, q + (size_t)i0 * D, w->phiq, w->ls);
        ab_sgemm(false, false, t, M1, C, 1.0f, w->phiq, C, w->S, M1, 0.0f, w->o, M1);
        finish_rows(g, t, w->o, out + (size_t)i0 * M, NULL, w->ls, c);
    }
}

/* gaug rows from dout, inv and gd: [dout * inv, -gd]. */
static void load_gaug(const lin_cfg *g, int t, const float *dout, const float *inv, const float *gd, float *gaug) {
    for (int i = 0; i < t; i++) {
        float *gi = gaug + (size_t)i * g->M1;
        const float *di = dout + (size_t)i * g->M;
        for (int m = 0; m < g->M; m++) gi[m] = di[m] * inv[i];
        gi[g->M] = -gd[i];
    }
}

/* From Oaug rows and dout rows: inv = 1/(den+eps), gd = (dout . out) * inv, and Gaug
 * (eps per row: row_eps). */
static void grad_rows(const lin_cfg *g, int t, const float *o, const float *dout, float *inv, float *gd,
                      float *gaug, const float *ls, float c) {
    for (int i = 0; i < t; i++) {
        const float *oi = o + (size_t)i * g->M1, *di = dout + (size_t)i * g->M;
        double r = 1.0 / ((double)oi[g->M] + row_eps(g, ls, c, i)), dn = 0;
        for (int m = 0; m < g->M; m++) dn += (double)di[m] * oi[m];
        inv[i] = (float)r;
        gd[i] = (float)(dn * r * r); /* (dout . num/(den+eps)) / (den+eps) */
    }
    load_gaug(g, t, dout, inv, gd, gaug);
}

static void causal_backward_slice(const lin_cfg *g, lin_slot *w, int L, const float *q, const float *k,
                                  const float *v, const float *dout, float *dq, float *dk, float *dv) {
    const int T = g->T, C = g->C, D = g->D, M = g->M, M1 = g->M1;
    float *S = w->S, *R = w->R;
    float c = -INFINITY; /* a log-scaled map's running key shift, as the forward's */
    memset(S, 0, sizeof(float) * (size_t)C * M1);
    /* forward sweep: Oaug (out, den), Gaug, dphiQ -> dq */
    for (int i0 = 0; i0 < L; i0 += T) {
        int t = L - i0 < T ? L - i0 : T;
        q_features(g, t, q + (size_t)i0 * D, w->phiq, w->ls);
        k_features_running(g, w, t, k + (size_t)i0 * D, w->phik, S, &c);
        w->cs[i0 / T] = c;
        load_vaug(g, t, v + (size_t)i0 * M, w->vaug);
        ab_sgemm(false, true, t, t, C, 1.0f, w->phiq, C, w->phik, C, 0.0f, w->A, T);
        mask_upper(t, w->A, T);
        ab_sgemm(false, false, t, M1, C, 1.0f, w->phiq, C, S, M1, 0.0f, w->o, M1);
        ab_sgemm(false, false, t, M1, t, 1.0f, w->A, T, w->vaug, M1, 1.0f, w->o, M1);
        grad_rows(g, t, w->o, dout + (size_t)i0 * M, w->inv + i0, w->gd + i0, w->gaug, w->ls, c);
        ab_sgemm(false, true, t, t, M1, 1.0f, w->gaug, M1, w->vaug, M1, 0.0f, w->Bm, T);
        mask_upper(t, w->Bm, T);
        ab_sgemm(false, true, t, C, M1, 1.0f, w->gaug, M1, S, M1, 0.0f, w->dphi, C);
        ab_sgemm(false, false, t, C, t, 1.0f, w->Bm, T, w->phik, C, 1.0f, w->dphi, C);
        fm_backward(&g->f, t, q + (size_t)i0 * D, D, w->phiq, C, w->dphi, C, dq + (size_t)i0 * D, D);
        ab_sgemm(true, false, C, M1, t, 1.0f, w->phik, C, w->vaug, M1, 1.0f, S, M1);
    }
    /* reverse sweep: R = sum over later chunks of phiQ^T Gaug; dphiK -> dk, dv. For a
     * log-scaled map every term is taken at the shift of the chunk at hand: R (whose terms
     * carry their own chunks' shifts, >= this one's) is rescaled by e^(c_j - c_next) <= 1
     * on the way back, and the chunk's key features are shifted by its c_j (>= all of
     * its keys' maxima). */
    memset(R, 0, sizeof(float) * (size_t)C * M1);
    int last = L > 0 ? ((L - 1) / T) * T : -1;
    float c_next = last >= 0 ? w->cs[last / T] : 0.0f;
    for (int i0 = last; i0 >= 0; i0 -= T) {
        int t = L - i0 < T ? L - i0 : T;
        const float cj = g->scaled ? w->cs[i0 / T] : 0.0f;
        if (cj < c_next) {
            const float r = (float)exp((double)cj - c_next);
            for (size_t e = 0; e < (size_t)C * M1; e++) R[e] *= r;
        }
        c_next = cj;
        q_features(g, t, q + (size_t)i0 * D, w->phiq, w->ls);
        k_features(g, t, k + (size_t)i0 * D, w->phik, cj);
        load_vaug(g, t, v + (size_t)i0 * M, w->vaug);
        load_gaug(g, t, dout + (size_t)i0 * M, w->inv + i0, w->gd + i0, w->gaug);
        ab_sgemm(false, true, t, t, C, 1.0f, w->phiq, C, w->phik, C, 0.0f, w->A, T);
        mask_upper(t, w->A, T);
        ab_sgemm(false, true, t, t, M1, 1.0f, w->gaug, M1, w->vaug, M1, 0.0f, w->Bm, T);
        mask_upper(t, w->Bm, T);
        ab_sgemm(false, true, t, C, M1, 1.0f, w->vaug, M1, R, M1, 0.0f, w->dphi, C);
        ab_sgemm(true, false, t, C, t, 1.0f, w->Bm, T, w->phiq, C, 1.0f, w->dphi, C);
        float *dvc = dv + (size_t)i0 * M;
        ab_sgemm(false, false, t, M, C, 1.0f, w->phik, C, R, M1, 0.0f, dvc, M);
        ab_sgemm(true, false, t, M, t, 1.0f, w->A, T, w->gaug, M1, 1.0f, dvc, M);
        fm_backward(&g->f, t, k + (size_t)i0 * D, D, w->phik, C, w->dphi, C, dk + (size_t)i0 * D, D);
        ab_sgemm(true, false, C, M1, t, 1.0f, w->phiq, C, w->gaug, M1, 1.0f, R, M1);
    }
}

static void noncausal_backward_slice(const lin_cfg *g, lin_slot *w, int L, const float *q, const float *k,
                                     const float *v, const float *dout, float *dq, float *dk, float *dv) {
    const int T = g->T, C = g->C, D = g->D, M = g->M, M1 = g->M1;
    float *S = w->S, *R = w->R;
    const float c = noncausal_state(g, w, L, k, v, S); /* the keys' features below use its final shift */
    memset(R, 0, sizeof(float) * (size_t)C * M1);
    /* queries: Oaug, Gaug, dphiQ = Gaug S^T -> dq; R = sum phiQ^T Gaug */
    for (int i0 = 0; i0 < L; i0 += T) {
        int t = L - i0 < T ? L - i0 : T;
        q_features(g, t, q + (size_t)i0 * D, w->phiq, w->ls);
        ab_sgemm(false, false, t, M1, C, 1.0f, w->phiq, C, S, M1, 0.0f, w->o, M1);
        grad_rows(g, t, w->o, dout + (size_t)i0 * M, w->inv + i0, w->gd + i0, w->gaug, w->ls, c);
        ab_sgemm(false, true, t, C, M1, 1.0f, w->gaug, M1, S, M1, 0.0f, w->dphi, C);
        ab_sgemm(true, false, C, M1, t, 1.0f, w->phiq, C, w->gaug, M1, 1.0f, R, M1);
        fm_backward(&g->f, t, q + (size_t)i0 * D, D, w->phiq, C, w->dphi, C, dq + (size_t)i0 * D, D);
    }
    /* keys: dphiK = Vaug R^T -> dk; dV = phiK R[:, :M] */
    for (int j0 = 0; j0 < L; j0 += T) {
        int t = L - j0 < T ? L - j0 : T;
        k_features(g, t, k + (size_t)j0 * D, w->phik, c);
        load_vaug(g, t, v + (size_t)j0 * M, w->vaug);
        ab_sgemm(false, true, t, C, M1, 1.0f, w->vaug, M1, R, M1, 0.0f, w->dphi, C);
        ab_sgemm(false, false, t, M, C, 1.0f, w->phik, C, R, M1, 0.0f, dv + (size_t)j0 * M, M);
        fm_backward(&g->f, t, k + (size_t)j0 * D, D, w->phik, C, w->dphi, C, dk + (size_t)j0 * D, D);
    }
}

/* ---- entry points ---- */

static int forward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, float *out,
                   void *saved) {
    (void)saved;
    lin_cfg g;
    cfg_make(a, s, s->len, &g);
    draw_into_ws(a, &g);
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim;
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        lin_slot w = slot_carve(&g, N, a->ws, omp_get_thread_num());
        int L = attn_valid_len(s, bh / s->heads);
        const float *qs = q + attn_slice(s, bh, D), *ks = k + attn_slice(s, bh, D), *vs = v + attn_slice(s, bh, M);
        float *os = out + attn_slice(s, bh, M);
        if (s->causal) {
            memset(w.S, 0, sizeof(float) * (size_t)g.C * g.M1);
            float c = -INFINITY;
            causal_forward_slice(&g, &w, L, qs, ks, vs, os, w.S, &c);
        } else {
            noncausal_forward_slice(&g, &w, L, qs, ks, vs, os);
        }
        zero_rows(os, L, N, M);
    }
    return 0;
}

static int backward(attn *a, const attn_shape *s, const float *q, const float *k, const float *v, const float *dout,
                    const void *saved, float *dq, float *dk, float *dv) {
    (void)saved;
    lin_cfg g;
    cfg_make(a, s, s->len, &g);
    draw_into_ws(a, &g);
    const int BH = s->batch * s->heads, N = s->len, D = s->qk_dim, M = s->v_dim;
    const int nt = attn_outer_threads(BH);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        lin_slot w = slot_carve(&g, N, a->ws, omp_get_thread_num());
        int L = attn_valid_len(s, bh / s->heads);
        size_t oq = attn_slice(s, bh, D), ov = attn_slice(s, bh, M);
        if (s->causal)
            causal_backward_slice(&g, &w, L, q + oq, k + oq, v + ov, dout + ov, dq + oq, dk + oq, dv + ov);
        else
            noncausal_backward_slice(&g, &w, L, q + oq, k + oq, v + ov, dout + ov, dq + oq, dk + oq, dv + ov);
        zero_rows(dq + oq, L, N, D);
        zero_rows(dk + oq, L, N, D);
        zero_rows(dv + ov, L, N, M);
    }
    return 0;
}

/* ---- recurrent mode ----
 *
 * State: per slice S [C x M] (rows of M floats) followed by Z [C], B*H of them, at
 * offset 0: the same C (M+1) floats as Saug, with the normaliser's column kept apart
 * so that the rows of S stay aligned and the step's passes are whole vectors (the
 * prefill builds Saug with the chunked forward, then splits it in place); for a log-scaled
 * map (favor) then, at 64-byte boundaries, the key shift c of each slice (B*H floats),
 * the projection W (C x D floats) and its transpose (written by the CUDA backend only).
 * The CUDA backend places its parts at the same offsets (lin_state_layout), its S
 * part kept as Saug [C x (M+1)]. */

static size_t state_s_bytes(const attn *a, const attn_shape *s) {
    return (size_t)s->batch * (size_t)s->heads * feature_count(a, s->qk_dim) * ((size_t)s->v_dim + 1) * sizeof(float);
}

void lin_state_layout(const attn *a, const attn_shape *s, size_t *c_off, size_t *w_off, size_t *total) {
    size_t sb = state_s_bytes(a, s);
    if (!fm_maps[kind_of(a)].log_scaled) {
        *c_off = *w_off = 0;
        *total = sb;
        return;
    }
    *c_off = attn_align64(sb);
    *w_off = *c_off + attn_align64((size_t)s->batch * (size_t)s->heads * sizeof(float));
    /* W, then its transpose (which only the CUDA backend's kernels read) */
    *total = *w_off + 2 * attn_align64(feature_count(a, s->qk_dim) * (size_t)s->qk_dim * sizeof(float));
}

static size_t state_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)capacity;
    size_t c_off, w_off, total;
    lin_state_layout(a, s, &c_off, &w_off, &total);
    return total;
}

/* W and c are set at the first position (prefill or step 0): clearing S is enough. */
static int state_init(attn *a, const attn_shape *s, int capacity, void *state) {
    (void)capacity;
    memset(state, 0, state_s_bytes(a, s));
    return 0;
}

/* Step workspace: per slot phi(q), phi(k) [C], oaug [M+1]; in front, for a log-scaled
 * map, favor's draw scratch (the state's W is drawn at step 0). */
static size_t step_slot_bytes(size_t C, size_t M1) { return 2 * attn_align64(C * sizeof(float)) + attn_align64(M1 * sizeof(float)); }

static size_t step_prefix_bytes(const attn *a, const attn_shape *s) {
    return fm_maps[kind_of(a)].log_scaled ? attn_align64(favor_draw_scratch(s->qk_dim)) : 0;
}

static size_t step_workspace_bytes(const attn *a, const attn_shape *s, int capacity) {
    (void)capacity;
    size_t C = feature_count(a, s->qk_dim);
    return step_prefix_bytes(a, s) +
           step_slot_bytes(C, (size_t)s->v_dim + 1) * (size_t)attn_outer_threads(s->batch * s->heads);
}

/* Saug [C x M1] -> S [C x M], Z [C], in place; zbuf holds C floats. */
static void split_saug(float *mem, int C, int M, float *zbuf) {
    const int M1 = M + 1;
    for (int c = 0; c < C; c++) zbuf[c] = mem[(size_t)c * M1 + M];
    for (int c = 1; c < C; c++) memmove(mem + (size_t)c * M, mem + (size_t)c * M1, sizeof(float) * (size_t)M);
    memcpy(mem + (size_t)C * M, zbuf, sizeof(float) * (size_t)C);
}

static int prefill(attn *a, const attn_shape *s, int capacity, int prompt_len, const float *q, const float *k,
                   const float *v, float *out, void *state) {
    (void)capacity;
    attn_shape ps = *s;
    ps.len = prompt_len;
    lin_cfg g;
    cfg_make(a, &ps, prompt_len, &g);
    const int BH = s->batch * s->heads, D = s->qk_dim, M = s->v_dim;
    const int nt = attn_outer_threads(BH);
    size_t c_off, w_off, total;
    lin_state_layout(a, s, &c_off, &w_off, &total);
    float *states = state, *cs = (float *)((char *)state + c_off);
    if (g.scaled) {
        /* the state's own W, drawn with the seed the attention has now */
        float *W = (float *)((char *)state + w_off);
        favor_draw(a->seed, D, g.C, (char *)a->ws + attn_align64((size_t)g.C * D * sizeof(float)), W);
        g.f.W = W;
    }
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int bh = 0; bh < BH; bh++) {
        lin_slot w = slot_carve(&g, prompt_len, a->ws, omp_get_thread_num());
        float *S = states + (size_t)bh * g.C * g.M1;
        const float *ks = k + attn_slice(&ps, bh, D);
        float c = -INFINITY; /* the state's running key shift, as a step would have raised it */
        causal_forward_slice(&g, &w, prompt_len, q + attn_slice(&ps, bh, D), ks, v + attn_slice(&ps, bh, M),
                             out ? out + attn_slice(&ps, bh, M) : NULL, S, &c);
        split_saug(S, g.C, M, w.phiq); /* phiq (T x C floats, T >= 1) is free again */
        if (g.scaled) cs[bh] = c;
    }
    return 0;
}

/* One position of the recurrence on a slice's state (S [C x M], Z [C]):
 *   S += phi(k) v^T, Z += phi(k);  oa[0..M) = phi(q)^T S, oa[M] = phi(q)^T Z
 * in one pass over S: blocks of up to 64 columns (four 16-float vectors, GCC/Clang
 * vector types: the compiler maps them to the machine's registers) whose sums over the
 * rows stay in registers while the rows go by; each element of S is read and written
 * once. Then Z as whole vectors with 16 partial sums, added in a fixed order. The sums
 * over the rows run in row order per column. Measured (B = 1, H = 8, D = M = 64, one
 * thread, this machine loaded by other work, same run): 4.1 us for this loop against
 * 6.3 us for the earlier one over Saug [C x (M+1)] (unaligned rows and a strided
 * normaliser column). */
typedef float step_vec __attribute__((vector_size(64), aligned(4))); /* 16 floats, any float alignment */
#define STEP_W 16

/* x + k * b on the vectors as one fused multiply-add per element (ISO C mode turns
 * GCC's contraction off; fmaf does it for the scalar loops) */
#if defined(__clang__)
#define STEP_CONTRACT _Pragma("clang fp contract(fast)")
#define STEP_FMA_ATTR
#elif defined(__GNUC__)
#define STEP_CONTRACT
#define STEP_FMA_ATTR __attribute__((optimize("fp-contract=fast")))
#else
#define STEP_CONTRACT
#define STEP_FMA_ATTR
#endif

STEP_FMA_ATTR static void step_update(float *restrict S, float *restrict Z, const float *restrict pq, const float *restrict pk,
                        const float *restrict v, float *restrict oa, int C, int M) {
    STEP_CONTRACT
    int j0 = 0;
    for (; j0 + 4 * STEP_W <= M; j0 += 4 * STEP_W) {
        const step_vec b0 = *(const step_vec *)(v + j0), b1 = *(const step_vec *)(v + j0 + 16),
                       b2 = *(const step_vec *)(v + j0 + 32), b3 = *(const step_vec *)(v + j0 + 48);
        step_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int c = 0; c < C; c++) {
            float *row = S + (size_t)c * (size_t)M + (size_t)j0;
            const float kc = pk[c], qc = pq[c];
            const step_vec x0 = *(step_vec *)row + kc * b0, x1 = *(step_vec *)(row + 16) + kc * b1,
                           x2 = *(step_vec *)(row + 32) + kc * b2, x3 = *(step_vec *)(row + 48) + kc * b3;
            *(step_vec *)row = x0;
            *(step_vec *)(row + 16) = x1;
            *(step_vec *)(row + 32) = x2;
            *(step_vec *)(row + 48) = x3;
            a0 += qc * x0;
            a1 += qc * x1;
            a2 += qc * x2;
            a3 += qc * x3;
        }
        *(step_vec *)(oa + j0) = a0;
        *(step_vec *)(oa + j0 + 16) = a1;
        *(step_vec *)(oa + j0 + 32) = a2;
        *(step_vec *)(oa + j0 + 48) = a3;
    }
    for (; j0 + STEP_W <= M; j0 += STEP_W) {
        const step_vec b = *(const step_vec *)(v + j0);
        step_vec acc = {0};
        for (int c = 0; c < C; c++) {
            float *row = S + (size_t)c * (size_t)M + (size_t)j0;
            const step_vec x = *(step_vec *)row + pk[c] * b;
            *(step_vec *)row = x;
            acc += pq[c] * x;
        }
        *(step_vec *)(oa + j0) = acc;
    }
    for (int j = j0; j < M; j++) { /* the last M % 16 columns, one at a time */
        float acc = 0;
        for (int c = 0; c < C; c++) {
            float *x = S + (size_t)c * (size_t)M + (size_t)j;
            *x = fmaf(pk[c], v[j], *x);
            acc = fmaf(pq[c], *x, acc);
        }
        oa[j] = acc;
    }
    step_vec zacc = {0};
    int c = 0;
    for (; c + STEP_W <= C; c += STEP_W) {
        const step_vec z = *(step_vec *)(Z + c) + *(const step_vec *)(pk + c);
        *(step_vec *)(Z + c) = z;
        zacc += *(const step_vec *)(pq + c) * z;
    }
    float den = 0;
    for (int l = 0; l < STEP_W; l++) den += zacc[l];
    for (; c < C; c++) {
        Z[c] += pk[c];
        den = fmaf(pq[c], Z[c], den);
    }
    oa[M] = den;
}

static int step(attn *a, const attn_shape *s, int capacity, void *state, int t, const float *q, const float *k,
                const float *v, float *out) {
    (void)capacity;
    lin_cfg g;
    cfg_make(a, s, 1, &g);
    const int BH = s->batch * s->heads, D = s->qk_dim, M = s->v_dim, C = g.C, M1 = g.M1;
    const int nt = attn_outer_threads(BH);
    const size_t slot = step_slot_bytes((size_t)C, (size_t)M1), front = step_prefix_bytes(a, s);
    size_t c_off, w_off, total;
    lin_state_layout(a, s, &c_off, &w_off, &total);
    float *states = state, *cs = (float *)((char *)state + c_off);
    if (g.scaled) {
        float *W = (float *)((char *)state + w_off);
        if (t == 0) favor_draw(a->seed, D, C, a->ws, W); /* the state's W, from the seed it has now */
        g.f.W = W;
    }
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int bh = 0; bh < BH; bh++) {
        char *p = (char *)a->ws + front + slot * (size_t)omp_get_thread_num();
        float *pq = (float *)p, *pk = (float *)(p + attn_align64((size_t)C * sizeof(float)));
        float *oa = (float *)(p + 2 * attn_align64((size_t)C * sizeof(float)));
        float *S = states + (size_t)bh * C * M1;
        float sq = 0.0f, c = 0.0f;
        if (g.scaled) {
            /* Features shifted by their own maxima; the key's then moved to the slice's
             * running shift c, which it may raise (S rescaled to the new c first). */
            float sk;
            fm_shift shq = {&sq, 0.0f}, shk = {&sk, 0.0f};
            fm_forward(&g.f, 1, q + (size_t)bh * D, D, pq, C, &shq);
            fm_forward(&g.f, 1, k + (size_t)bh * D, D, pk, C, &shk);
            c = t == 0 || sk > cs[bh] ? sk : cs[bh];
            if (t > 0 && c > cs[bh]) {
                const float r = (float)exp((double)cs[bh] - c);
                for (size_t e = 0; e < (size_t)C * M1; e++) S[e] *= r;
            }
            const float rk = (float)exp((double)sk - c);
            for (int e = 0; e < C; e++) pk[e] *= rk;
            cs[bh] = c;
        } else {
            fm_forward(&g.f, 1, q + (size_t)bh * D, D, pq, C, NULL);
            fm_forward(&g.f, 1, k + (size_t)bh * D, D, pk, C, NULL);
        }
        step_update(S, S + (size_t)C * M, pq, pk, v + (size_t)bh * M, oa, C, M);
        finish_rows(&g, 1, oa, out + (size_t)bh * M, NULL, &sq, c);
    }
    return 0;
}

/* ---- useful floating-point operations ----
 *
 * The scan form, per slice: S += phi(k_i) [v_i, 1]^T and out_i = phi(q_i)^T S, two
 * C x (M+1) multiply-adds per position: 4 N C (M+1). Forward plus backward: 3 times
 * that (the usual rule, a backward costing two forwards; the sweep's figures have
 * always used it). The chunked algorithm's T x T blocks do the same sums in another
 * order and are not counted; neither are the feature maps. */
static double flops(const attn *a, const attn_shape *s, bool backward) {
    double bh = (double)s->batch * s->heads, n = s->len, M = s->v_dim;
    double C = (double)feature_count(a, s->qk_dim);
    double fwd = 4 * n * C * (M + 1) * bh; /* favor: m = features; its W x products are not counted either */
    return backward ? 3 * fwd : fwd;
}

static const attn_backend cpu_backend = {
    .check_shape = check_shape,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
    .state_bytes = state_bytes,
    .state_init = state_init,
    .prefill = prefill,
    .step = step,
    .step_workspace_bytes = step_workspace_bytes,
};

#ifdef ATTNBENCH_HAVE_CUDA
/* The CPU's checks, and a feature map the CUDA backend has kernels for. */
static int cuda_check_shape(const attn *a, const attn_shape *s) {
    int rc = check_shape(a, s);
    if (rc) return rc;
    const fm_map *m = &fm_maps[kind_of(a)];
    if (!m->cuda)
        return ab_fail(AB_EUNSUPPORTED, "variant '%s': feature map '%s' has no CUDA implementation (use --device cpu)",
                       a->v->name, m->name);
    return 0;
}

/* CUDA (linear_cuda.cu): same shape checks, nothing saved, the same state layout
 * followed by the step's counters. */
/* favor's step starts its key shifts and W at position 0 */
static bool cuda_step_replayable(const attn *a) { return kind_of(a) != FM_FAVOR; }

static const attn_backend cuda_backend = {
    .check_shape = cuda_check_shape,
    .saved_bytes = saved_bytes,
    .workspace_bytes = lin_cuda_workspace_bytes,
    .forward = lin_cuda_forward,
    .backward = lin_cuda_backward,
    .state_bytes = lin_cuda_state_bytes,
    .state_init = lin_cuda_state_init,
    .prefill = lin_cuda_prefill,
    .step = lin_cuda_step,
    .step_workspace_bytes = lin_cuda_step_workspace_bytes,
    .step_replayable = cuda_step_replayable,
};
#define CUDA_LINEAR (&cuda_backend)
#else
#define CUDA_LINEAR NULL
#endif

const attn_variant attn_variant_linear = {
    .name = "linear",
    .summary = "linear attention, sim = phi(q).phi(k) with phi = elu+1, taylor (1 + cos) or favor (FAVOR+ random "
               "features); O(N C M) for C features",
    .options = linear_options,
    .n_options = (int)(sizeof linear_options / sizeof linear_options[0]),
    .defaults = defaults_linear,
    .flops = flops,
    .cpu = &cpu_backend,
    .cuda = CUDA_LINEAR,
};

const attn_variant attn_variant_polynomial = {
    .name = "polynomial",
    .summary = "linear attention with sim = (c + scale q.k)^2 through exact degree-2 features; O(N D^2 M)",
    .options = poly_options,
    .n_options = (int)(sizeof poly_options / sizeof poly_options[0]),
    .defaults = defaults_poly,
    .flops = flops,
    .cpu = &cpu_backend,
    .cuda = CUDA_LINEAR,
};
