/* Reference transformer in double: see ref_model.h. */
#include "ref_model.h"

#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_layernorm(const double *x, const double *g, const double *b, int BT, int C, double *out) {
    for (int i = 0; i < BT; i++) {
        const double *xi = x + (long)i * C;
        double mean = 0, var = 0;
        for (int c = 0; c < C; c++) mean += xi[c];
        mean /= C;
        for (int c = 0; c < C; c++) var += (xi[c] - mean) * (xi[c] - mean);
        var /= C;
        double rstd = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) out[(long)i * C + c] = (xi[c] - mean) * rstd * g[c] + b[c];
    }
}

void ref_dense(const double *x, const double *w, const double *b, int BT, int IN, int OUT, double *out) {
    for (int i = 0; i < BT; i++)
        for (int o = 0; o < OUT; o++) {
            double s = b ? b[o] : 0.0;
            for (int c = 0; c < IN; c++) s += x[(long)i * IN + c] * w[(long)o * IN + c];
            out[(long)i * OUT + o] = s;
        }
}

void ref_dropout(const double *x, const uint8_t *mask, double p, long n, double *out) {
    for (long i = 0; i < n; i++) out[i] = mask[i] ? x[i] / (1.0 - p) : 0.0;
}

void ref_ffn(const double *x, const double *w1, const double *b1, const double *w2, const double *b2,
             const uint8_t *mask, double p, int BT, int C, int F, double *out) {
    double *h = malloc(sizeof(double) * (size_t)BT * F);
    ref_dense(x, w1, b1, BT, C, F, h);
    for (long i = 0; i < (long)BT * F; i++) h[i] = h[i] > 0 ? h[i] : 0.0;
    if (mask) ref_dropout(h, mask, p, (long)BT * F, h);
    ref_dense(h, w2, b2, BT, F, C, out);
    free(h);
}

/* The attention's own input the block makes from x (B, N, C): act(x W1 [W2] + b) in the
 * heads' layout [B, H, N, W] (malloc'ed). */
static double *ref_mha_aux(const ref_model_cfg *c, const ref_layer_params *p, const double *x, int B, int N) {
    const int H = c->H, W = c->aux_w, HW = H * W, R = c->aux_rank, BT = B * N;
    double *y = malloc(sizeof(double) * (size_t)BT * HW), *out = malloc(sizeof(double) * (size_t)BT * HW);
    if (R) {
        double *z1 = malloc(sizeof(double) * (size_t)BT * R);
        ref_dense(x, p->aux_w1, NULL, BT, c->C, R, z1);
        ref_dense(z1, p->aux_w2, p->aux_b, BT, R, HW, y);
        free(z1);
    } else {
        ref_dense(x, p->aux_w1, p->aux_b, BT, c->C, HW, y);
    }
    for (long i = 0; i < (long)BT * HW; i++)
        y[i] = c->aux_act == 0 ? -log1p(exp(-y[i])) / 16.0 : 1.0 / (1.0 + exp(-y[i]));
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < W; w++)
                    out[(((long)b * H + h) * N + i) * W + w] = y[((long)b * N + i) * HW + h * W + w];
    free(y);
    return out;
}

void ref_mha(const ref_model_cfg *c, const ref_layer_params *p, const double *x, int B, int N, const int *lengths,
             double *out) {
    int C = c->C, H = c->H, D = C / H;
    long n = (long)B * N * C;
    double *qkv = malloc(sizeof(double) * 3 * n);
    double *q = malloc(sizeof(double) * n), *k = malloc(sizeof(double) * n), *v = malloc(sizeof(double) * n);
    double *att = malloc(sizeof(double) * n), *merged = malloc(sizeof(double) * n);
    ref_dense(x, p->wqkv, p->bqkv, B * N, C, 3 * C, qkv);
    /* split: channel h*D + d of the q / k / v thirds -> [b, h, n, d] */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    long src = ((long)b * N + i) * 3 * C + h * D + d;
                    long dst = (((long)b * H + h) * N + i) * D + d;
                    q[dst] = qkv[src];
                    k[dst] = qkv[src + C];
                    v[dst] = qkv[src + 2 * C];
                }
    ref_shape s = {B, H, N, D, D, c->causal, lengths};
    if (c->attn == REF_ATTN_GLA || c->attn == REF_ATTN_DELTANET) {
        double *aux = ref_mha_aux(c, p, x, B, N);
        if (c->attn == REF_ATTN_GLA) ref_gla(&s, c->aux_w, 1.0 / sqrt((double)D), q, k, v, aux, att);
        else ref_deltanet(&s, 1e-6, q, k, v, aux, att);
        free(aux);
    } else if (c->attn == REF_ATTN_SOFTMAX) ref_softmax(&s, 1.0 / sqrt((double)D), q, k, v, att);
    else if (c->attn == REF_ATTN_LINFORMER)
        ref_linformer(&s, c->lin_k, c->lin_len, p->proj, c->lin_one ? p->proj : p->proj + (long)c->lin_k * c->lin_len,
                      1.0 / sqrt((double)D), q, k, v, att);
    else ref_linear(&s, REF_SIM_ELU, 0, 0, 1e-6, q, k, v, att);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++)
                    merged[((long)b * N + i) * C + h * D + d] = att[(((long)b * H + h) * N + i) * D + d];
    ref_dense(merged, p->wo, p->bo, B * N, C, C, out);
    free(qkv);
    free(q);
    free(k);
    free(v);
    free(att);
    free(merged);
}

void ref_encoder_layer(const ref_model_cfg *c, const ref_layer_params *p, const double *x, int B, int N,
                       const int *lengths, const ref_masks *masks, double *out) {
    int C = c->C, F = c->F, BT = B * N;
    long n = (long)BT * C;
    double *a = malloc(sizeof(double) * n), *r1 = malloc(sizeof(double) * n), *h = malloc(sizeof(double) * n);
    double *f = malloc(sizeof(double) * n), *r2 = malloc(sizeof(double) * n);
    bool drop = masks && masks->attn;
    if (!c->pre_norm) {
        /* r1 = x + Drop(Attn(x)); h1 = LN1(r1); r2 = h1 + Drop(FFN(h1)); out = LN2(r2) */
        ref_mha(c, p, x, B, N, lengths, a);
        if (drop) ref_dropout(a, masks->attn, masks->p, n, a);
        for (long i = 0; i < n; i++) r1[i] = x[i] + a[i];
        ref_layernorm(r1, p->ln1_g, p->ln1_b, BT, C, h);
        ref_ffn(h, p->w1, p->b1, p->w2, p->b2, drop ? masks->hidden : NULL, drop ? masks->p : 0, BT, C, F, f);
        if (drop) ref_dropout(f, masks->ffn, masks->p, n, f);
        for (long i = 0; i < n; i++) r2[i] = h[i] + f[i];
        ref_layernorm(r2, p->ln2_g, p->ln2_b, BT, C, out);
    } else {
        /* r1 = x + Drop(Attn(LN1(x))); out = r1 + Drop(FFN(LN2(r1))) */
        ref_layernorm(x, p->ln1_g, p->ln1_b, BT, C, h);
        ref_mha(c, p, h, B, N, lengths, a);
        if (drop) ref_dropout(a, masks->attn, masks->p, n, a);
        for (long i = 0; i < n; i++) r1[i] = x[i] + a[i];
        ref_layernorm(r1, p->ln2_g, p->ln2_b, BT, C, h);
        ref_ffn(h, p->w1, p->b1, p->w2, p->b2, drop ? masks->hidden : NULL, drop ? masks->p : 0, BT, C, F, f);
        if (drop) ref_dropout(f, masks->ffn, masks->p, n, f);
        for (long i = 0; i < n; i++) out[i] = r1[i] + f[i];
    }
    free(a);
    free(r1);
    free(h);
    free(f);
    free(r2);
}

/* x (B, N, C): the input stage's output without positions; adds them, runs the layers,
 * the final LN and the head. Overwrites x. */
static void body_and_head(const ref_model_cfg *c, const ref_params *p, double *x, int B, int N, const int *lengths,
                          double *logits) {
    int C = c->C, BT = B * N;
    long n = (long)BT * C;
    double *y = malloc(sizeof(double) * n);
    /* sinusoidal positions */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++)
            for (int ch = 0; ch < C; ch++) {
                int pair = ch / 2;
                double angle = i / pow(10000.0, 2.0 * pair / C);
                x[((long)b * N + i) * C + ch] += ch % 2 == 0 ? sin(angle) : cos(angle);
            }
    for (int l = 0; l < c->L; l++) {
        ref_encoder_layer(c, &p->layer[l], x, B, N, lengths, NULL, y);
        memcpy(x, y, sizeof(double) * n);
    }
    if (c->final_norm) {
        ref_layernorm(x, p->lnf_g, p->lnf_b, BT, C, y);
        memcpy(x, y, sizeof(double) * n);
    }
    ref_dense(x, p->head_w, p->head_b, BT, C, c->V, logits);
    free(y);
}

void ref_model_logits(const ref_model_cfg *c, const ref_params *p, const int *tokens, int B, int N,
                      const int *lengths, double *logits) {
    int C = c->C, BT = B * N;
    double *x = malloc(sizeof(double) * (size_t)BT * C);
    /* token embedding */
    for (long r = 0; r < BT; r++)
        for (int ch = 0; ch < C; ch++) x[r * C + ch] = p->tok_emb[(long)tokens[r] * C + ch];
    body_and_head(c, p, x, B, N, lengths, logits);
    free(x);
}

void ref_model_logits_frames(const ref_model_cfg *c, const ref_params *p, const double *frames, int F_in, int B,
                             int N, const int *lengths, double *logits) {
    double *x = malloc(sizeof(double) * (size_t)B * N * c->C);
    ref_dense(frames, p->in_w, p->in_b, B * N, F_in, c->C, x);
    body_and_head(c, p, x, B, N, lengths, logits);
    free(x);
}

double ref_cross_entropy(const double *logits, const int *targets, const double *weights, int BT, int V) {
    double swl = 0, sw = 0;
    for (int i = 0; i < BT; i++) {
        double w = weights ? weights[i] : 1.0;
        if (!(w > 0)) continue;
        const double *li = logits + (long)i * V;
        double mx = li[0];
        for (int v = 1; v < V; v++) mx = fmax(mx, li[v]);
        double s = 0;
        for (int v = 0; v < V; v++) s += exp(li[v] - mx);
        swl += w * (log(s) + mx - li[targets[i]]);
        sw += w;
    }
    return sw > 0 ? swl / sw : 0.0;
}
