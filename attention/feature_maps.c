/* Feature maps of linear attention (see feature_maps.h for the definitions), and their
 * table. */
#include "feature_maps.h"

#include "cpu_util.h"
#include "favor.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- elu: phi(x) = elu(x) + 1 ---- */

static size_t elu_dim(int D, const attn_params *p) {
    (void)p;
    return (size_t)D;
}

static void elu_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi,
                        const fm_shift *sh) {
    (void)sh;
    const int D = f->D;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        float *p = phi + (size_t)i * ldphi;
        for (int a = 0; a < D; a++) {
            float e = attn_exp_nonpos(xi[a] < 0.0f ? xi[a] : 0.0f);
            p[a] = xi[a] > 0.0f ? xi[a] + 1.0f : e;
        }
    }
}

static void elu_backward(const fm_spec *f, int n, const float *x, int ldx, const float *phi, int ldphi, float *gphi,
                         int ldg, float *gx, int ldgx) {
    (void)phi, (void)ldphi;
    const int D = f->D;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        const float *g = gphi + (size_t)i * ldg;
        float *o = gx + (size_t)i * ldgx;
        for (int a = 0; a < D; a++) {
            float e = attn_exp_nonpos(xi[a] < 0.0f ? xi[a] : 0.0f);
            o[a] = xi[a] > 0.0f ? g[a] : g[a] * e;
        }
    }
}

/* ---- taylor: phi(x) = [1, x / max(|x|, floor)] ---- */

static size_t taylor_dim(int D, const attn_params *p) {
    (void)p;
    return 1 + (size_t)D;
}

/* |x| of one row in double, floored. */
static double taylor_norm(const float *x, int D) {
    double s = 0;
    for (int a = 0; a < D; a++) s += (double)x[a] * x[a];
    return fmax(sqrt(s), FM_TAYLOR_NORM_FLOOR);
}

static void taylor_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi,
                        const fm_shift *sh) {
    (void)sh;
    const int D = f->D;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        float *p = phi + (size_t)i * ldphi;
        double inv = 1.0 / taylor_norm(xi, D);
        p[0] = 1.0f;
        for (int a = 0; a < D; a++) p[1 + a] = (float)(xi[a] * inv);
    }
}

static void taylor_backward(const fm_spec *f, int n, const float *x, int ldx, const float *phi, int ldphi,
                            float *gphi, int ldg, float *gx, int ldgx) {
    (void)phi, (void)ldphi;
    const int D = f->D;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        const float *g = gphi + (size_t)i * ldg;
        float *o = gx + (size_t)i * ldgx;
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
    }
}

/* ---- poly: phi(x) = [c, sqrt(2 c scale) x, scale x_a x_b] ---- */

static size_t poly_dim(int D, const attn_params *p) {
    (void)p;
    size_t d = (size_t)D;
    return 1 + d + d * d;
}

static void poly_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi,
                        const fm_shift *sh) {
    (void)sh;
    const int D = f->D;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        float *p = phi + (size_t)i * ldphi;
        p[0] = f->c;
        for (int a = 0; a < D; a++) p[1 + a] = f->lin * xi[a];
        float *quad = p + 1 + D;
        for (int a = 0; a < D; a++) {
            float sa = f->scale * xi[a];
            float *row = quad + (size_t)a * D;
            for (int b = 0; b < D; b++) row[b] = sa * xi[b];
        }
    }
}

static void poly_backward(const fm_spec *f, int n, const float *x, int ldx, const float *phi, int ldphi, float *gphi,
                          int ldg, float *gx, int ldgx) {
    (void)phi, (void)ldphi;
    const int D = f->D;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * ldx;
        const float *g = gphi + (size_t)i * ldg;
        float *o = gx + (size_t)i * ldgx;
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
    }
}

/* ---- the table ---- */

#ifdef ATTNBENCH_HAVE_CUDA
/* feature_maps_cuda.cu, favor_cuda.cu */
extern const struct fm_cuda_map fm_elu_cuda, fm_taylor_cuda, fm_poly_cuda, fm_favor_cuda;
#define FM_CUDA(ops) (&(ops))
#else
#define FM_CUDA(ops) NULL
#endif

const fm_map fm_maps[] = {
    [FM_ELU] = {"elu", "D", "elu(x)+1", true, false, elu_dim, elu_forward, elu_backward,
                FM_CUDA(fm_elu_cuda)},
    [FM_TAYLOR] = {"taylor", "1 + D", "features [1, x/|x|], sim = 1 + cos(q,k)", true, false, taylor_dim,
                   taylor_forward, taylor_backward, FM_CUDA(fm_taylor_cuda)},
    [FM_POLY] = {"poly", "1 + D + D^2",
                 "the polynomial variant's exact features of (c + scale q.k)^2: [c, sqrt(2 c scale) x, scale x x^T]",
                 false, false, poly_dim, poly_forward, poly_backward, FM_CUDA(fm_poly_cuda)},
    [FM_FAVOR] = {"favor", "features (2 D)",
                  "FAVOR+ positive orthogonal random features m^-1/2 exp(W x' - |x'|^2/2), x' = x/D^(1/4), "
                  "estimating exp(q.k/sqrt(D)); m = option features, W redrawn from the seed",
                  true, true, favor_dim, favor_forward, favor_backward, FM_CUDA(fm_favor_cuda)},
};
const int fm_n_maps = (int)(sizeof fm_maps / sizeof fm_maps[0]);

int fm_find(const char *name) {
    for (int i = 0; name && i < fm_n_maps; i++)
        if (strcmp(fm_maps[i].name, name) == 0) return i;
    return -1;
}

size_t fm_dim(fm_kind kind, int D) { return fm_maps[kind].dim(D, NULL); }

void fm_init(fm_spec *f, fm_kind kind, int D, double c, double scale) {
    f->W = NULL;
    f->kind = kind;
    f->map = &fm_maps[kind];
    f->D = D;
    f->C = (int)fm_dim(kind, D);
    f->c = (float)c;
    f->lin = (float)sqrt(2.0 * c * scale);
    f->scale = (float)scale;
    f->params = NULL;
    f->seed = 0;
}

void fm_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi, const fm_shift *sh) {
    f->map->forward(f, n, x, ldx, phi, ldphi, sh);
}

void fm_backward(const fm_spec *f, int n, const float *x, int ldx, const float *phi, int ldphi, float *gphi, int ldg,
                 float *gx, int ldgx) {
    f->map->backward(f, n, x, ldx, phi, ldphi, gphi, ldg, gx, ldgx);
}

/* ---- linear's feature_map option ---- */

const fm_map *fm_linear_choice(int c) {
    for (int i = 0; c >= 0 && i < fm_n_maps; i++)
        if (fm_maps[i].linear_choice && c-- == 0) return &fm_maps[i];
    return NULL;
}

static const char *linear_choice_name(int c) {
    const fm_map *m = fm_linear_choice(c);
    return m ? m->name : NULL;
}

/* "a (help a), b (help b) or c (help c)", written once: the registry hands the pointer
 * out as the option's help, which lives as long as the program. */
static char g_linear_help[1024];
static pthread_once_t g_linear_help_once = PTHREAD_ONCE_INIT;

static void write_linear_help(void) {
    int n_choices = 0;
    while (fm_linear_choice(n_choices)) n_choices++;
    size_t n = 0;
    for (int c = 0; c < n_choices && n < sizeof g_linear_help; c++) {
        const fm_map *m = fm_linear_choice(c);
        const char *sep = c == 0 ? "" : c + 1 == n_choices ? " or " : ", ";
        n += (size_t)snprintf(g_linear_help + n, sizeof g_linear_help - n, "%s%s (%s)", sep, m->name, m->help);
    }
}

static const char *linear_choice_help(void) {
    pthread_once(&g_linear_help_once, write_linear_help);
    return g_linear_help;
}

const attn_choice_source fm_linear_choices = {linear_choice_name, linear_choice_help};
