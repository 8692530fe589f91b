/* Feature maps of linear attention (see feature_maps.h for the definitions). */
#include "feature_maps.h"

#include <math.h>
#include <stdint.h>

size_t fm_dim(fm_kind kind, int D) {
    size_t d = (size_t)D;
    switch (kind) {
    case FM_ELU: return d;
    case FM_TAYLOR: return 1 + d;
    case FM_POLY: return 1 + d + d * d;
    }
    return 0;
}

void fm_init(fm_spec *f, fm_kind kind, int D, double c, double scale) {
    f->kind = kind;
    f->D = D;
    f->C = (int)fm_dim(kind, D);
    f->c = (float)c;
    f->lin = (float)sqrt(2.0 * c * scale);
    f->scale = (float)scale;
}

/* exp(x) for x <= 0, written to vectorise (libm's expf does not, and was half the
 * time of the elu forward at D = 64). Range reduction x = n ln2 + r, |r| <= ln2/2
 * (ln2 split in a 16-bit-exact high part and a low part so n ln2_hi is exact), then
 * a degree-7 Taylor polynomial for e^r (truncation error |r|^8/8! < 5e-9, below
 * float rounding) and 2^n from the exponent bits. Accurate to ~2 ulp; inputs below
 * -87.3 (result under FLT_MIN) give 0. */
static inline float exp_nonpos(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693145751953125f - n * 1.42860682030941723e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } two_n;
    two_n.i = ((int32_t)n + 127) << 23;
    float e = p * two_n.f;
    return x < -87.3f ? 0.0f : e;
}

/* |x| of one row in double, floored (taylor). */
static double taylor_norm(const float *x, int D) {
    double s = 0;
    for (int a = 0; a < D; a++) s += (double)x[a] * x[a];
    return fmax(sqrt(s), FM_TAYLOR_NORM_FLOOR);
}

void fm_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi) {
    const int D = f->D;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        float *p = phi + (size_t)i * ldphi;
        switch (f->kind) {
        case FM_ELU:
            for (int a = 0; a < D; a++) {
                float e = exp_nonpos(xi[a] < 0.0f ? xi[a] : 0.0f);
                p[a] = xi[a] > 0.0f ? xi[a] + 1.0f : e;
            }
            break;
        case FM_TAYLOR: {
            double inv = 1.0 / taylor_norm(xi, D);
            p[0] = 1.0f;
            for (int a = 0; a < D; a++) p[1 + a] = (float)(xi[a] * inv);
            break;
        }
        case FM_POLY: {
            p[0] = f->c;
            for (int a = 0; a < D; a++) p[1 + a] = f->lin * xi[a];
            float *quad = p + 1 + D;
            for (int a = 0; a < D; a++) {
                float sa = f->scale * xi[a];
                float *row = quad + (size_t)a * D;
                for (int b = 0; b < D; b++) row[b] = sa * xi[b];
            }
            break;
        }
        }
    }
}

void fm_backward(const fm_spec *f, int n, const float *x, int ldx, const float *gphi, int ldg, float *gx,
                 int ldgx) {
    const int D = f->D;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        const float *g = gphi + (size_t)i * ldg;
        float *o = gx + (size_t)i * ldgx;
        switch (f->kind) {
        case FM_ELU:
            for (int a = 0; a < D; a++) {
                float e = exp_nonpos(xi[a] < 0.0f ? xi[a] : 0.0f);
                o[a] = xi[a] > 0.0f ? g[a] : g[a] * e;
            }
            break;
        case FM_TAYLOR: {
            /* u = x / r: du/dx = (I - u u^T) / r above the floor, I / floor below it. */
            double s = 0;
            for (int a = 0; a < D; a++) s += (double)xi[a] * xi[a];
            double r = sqrt(s);
            const float *gu = g + 1;
            if (r > FM_TAYLOR_NORM_FLOOR) {
                double ug = 0;
                for (int a = 0; a < D; a++) ug += xi[a] / r * gu[a];
                for (int a = 0; a < D; a++) o[a] = (float)((gu[a] - xi[a] / r * ug) / r);
            } else {
                for (int a = 0; a < D; a++) o[a] = (float)(gu[a] / FM_TAYLOR_NORM_FLOOR);
            }
            break;
        }
        case FM_POLY: {
            /* d/dx_a of sum_{b,e} G_be x_b x_e = sum_e G_ae x_e + sum_e x_e G_ea: the first
             * term a dot product per row of G, the second an axpy over rows of G (both
             * contiguous). */
            const float *G = g + 1 + D;
            for (int a = 0; a < D; a++) o[a] = 0.0f;
            for (int e = 0; e < D; e++) {
                const float xe = xi[e], *row = G + (size_t)e * D;
                for (int a = 0; a < D; a++) o[a] += xe * row[a];
            }
            for (int a = 0; a < D; a++) {
                const float *row = G + (size_t)a * D;
                float acc = 0.0f;
                for (int e = 0; e < D; e++) acc += row[e] * xi[e];
                o[a] = f->lin * g[1 + a] + f->scale * (acc + o[a]);
            }
            break;
        }
        }
    }
}
