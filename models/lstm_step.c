/* The element-wise LSTM step on the CPU (lstm_step.h); lstm_cuda.cu is the same on
 * CUDA. The stack (lstm.c) calls it through the per-device layer table. */
#include "lstm_step.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* The step loops run their rows on several threads from this many elements (B H). */
#define STEP_PAR_MIN 4096

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static inline int row_len(const lstm_step_shape *s, int b) { return s->lengths ? s->lengths[b] : s->N; }

void lstm_step_forward(const lstm_step_shape *s, float *gates, float *c, float *out, int out_ld, float *h,
                       float *cs, const float *hw) {
    const int B = s->B, N = s->N, H = s->H, k = s->k;
#pragma omp parallel for schedule(static) if ((size_t)B * H >= STEP_PAR_MIN)
    for (int b = 0; b < B; b++) {
        const int L = row_len(s, b);
        float *hb = h + (size_t)b * H, *cb = cs + (size_t)b * H;
        if (k >= L) {
            if (k == 0)
                for (int j = 0; j < H; j++) hb[j] = cb[j] = 0.0f;
            continue;
        }
        const size_t row = (size_t)b * N + (size_t)(s->reverse ? L - 1 - k : k);
        float *g = gates + row * 4 * H, *cr = c + row * H, *hr = out + row * out_ld;
        const float *r = hw ? hw + (size_t)b * 4 * H : NULL;
        for (int j = 0; j < H; j++) {
            float zi = g[j], zf = g[H + j], zg = g[2 * H + j], zo = g[3 * H + j];
            if (r) {
                zi += r[j];
                zf += r[H + j];
                zg += r[2 * H + j];
                zo += r[3 * H + j];
            }
            const float ig = sigmoid(zi), fg = sigmoid(zf), gg = tanhf(zg), og = sigmoid(zo);
            const float cp = k > 0 ? cb[j] : 0.0f;
            const float cn = fg * cp + ig * gg;
            const float hn = og * tanhf(cn);
            g[j] = ig;
            g[H + j] = fg;
            g[2 * H + j] = gg;
            g[3 * H + j] = og;
            cr[j] = cn;
            hr[j] = hn;
            cb[j] = cn;
            hb[j] = hn;
        }
    }
}

void lstm_step_backward(const lstm_step_shape *s, float *dgates, float *dstep, float *hprev, float *dcs,
                        const float *dh_rec, const float *dout, int dout_ld, const float *gates, const float *c,
                        const float *out, int out_ld) {
    const int B = s->B, N = s->N, H = s->H, k = s->k;
#pragma omp parallel for schedule(static) if ((size_t)B * H >= STEP_PAR_MIN)
    for (int b = 0; b < B; b++) {
        const int L = row_len(s, b);
        float *ds = dstep + (size_t)b * 4 * H;
        if (k >= L) {
            memset(ds, 0, sizeof(float) * 4 * (size_t)H);
            continue;
        }
        const int p = s->reverse ? L - 1 - k : k;
        const bool first = k == L - 1; /* the row's last position in time: nothing carried */
        const size_t row = (size_t)b * N + (size_t)p;
        const float *g = gates + row * 4 * H, *cr = c + row * H, *dr = dout + row * dout_ld;
        const float *dhr = first || !dh_rec ? NULL : dh_rec + (size_t)b * H;
        float *dg = dgates + row * 4 * H, *hp = hprev + row * H, *dcb = dcs + (size_t)b * H;
        const float *cprev = NULL, *hsrc = NULL; /* the previous position in the direction's order */
        if (k > 0) {
            const size_t prow = (size_t)b * N + (size_t)(s->reverse ? p + 1 : p - 1);
            cprev = c + prow * H;
            hsrc = out + prow * out_ld;
        }
        for (int j = 0; j < H; j++) {
            const float ig = g[j], fg = g[H + j], gg = g[2 * H + j], og = g[3 * H + j];
            const float tc = tanhf(cr[j]);
            const float dh = dhr ? dr[j] + dhr[j] : dr[j];
            const float dc = (first ? 0.0f : dcb[j]) + dh * og * (1.0f - tc * tc);
            const float cp = cprev ? cprev[j] : 0.0f;
            const float di = dc * gg * ig * (1.0f - ig);
            const float df = dc * cp * fg * (1.0f - fg);
            const float dgg = dc * ig * (1.0f - gg * gg);
            const float dog = dh * tc * og * (1.0f - og);
            dg[j] = ds[j] = di;
            dg[H + j] = ds[H + j] = df;
            dg[2 * H + j] = ds[2 * H + j] = dgg;
            dg[3 * H + j] = ds[3 * H + j] = dog;
            dcb[j] = dc * fg;
            hp[j] = hsrc ? hsrc[j] : 0.0f;
        }
    }
}
