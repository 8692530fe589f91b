/* Internal: feature maps phi of linear attention, sim(q, k) = phi(q) . phi(k).
 *
 *   elu     phi(x) = elu(x) + 1                                    C = D
 *   taylor  phi(x) = [1, x / max(|x|, FM_TAYLOR_NORM_FLOOR)]        C = 1 + D
 *           (sim = 1 + cos(q, k); below the floor, in particular at x = 0, the
 *           direction part is x / floor, which is continuous at |x| = floor and 0 at
 *           x = 0, so sim = 1 there: a zero vector is "orthogonal" to everything)
 *   poly    phi(x) = [c, sqrt(2 c scale) x, scale x_a x_b (a, b = 0..D-1, a major)]
 *           C = 1 + D + D^2; phi(q) . phi(k) = (c + scale q.k)^2 exactly
 *
 * The maps are one table, fm_maps (feature_maps.c): each entry holds the map's name,
 * its feature count, its CPU forward and backward, and its CUDA kernels (the entry's
 * `cuda`, defined in linear_cuda.cu). Everything else follows from the table: the
 * choices (and their help) of linear's feature_map option are the entries marked
 * linear_choice, in table order; `polynomial` uses the "poly" entry; `attnbench list`
 * lists them all. A new map is its functions (CPU here, device ones in linear_cuda.cu)
 * plus its entry.
 *
 * Rows are processed independently; x is [n x D] with leading dimension ldx, phi is
 * [n x C] with leading dimension ldphi. */
#ifndef ATTN_FEATURE_MAPS_H
#define ATTN_FEATURE_MAPS_H

#include "variant.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FM_TAYLOR_NORM_FLOOR 1e-12

/* Indices into fm_maps of the maps that code names directly (the polynomial variant,
 * tests); other entries are found by name (fm_find) or through linear's choices. */
typedef enum { FM_ELU = 0, FM_TAYLOR = 1, FM_POLY = 2 } fm_kind;

typedef struct fm_map fm_map;

/* One map instantiated for a call: the entry, sizes and the values its functions read. */
typedef struct {
    fm_kind kind;     /* index into fm_maps */
    const fm_map *map;
    int D, C;         /* input and feature sizes */
    float c;          /* poly: constant feature */
    float lin;        /* poly: sqrt(2 c scale), weight of the linear features */
    float scale;      /* poly: weight of the quadratic features */
    /* For maps with parameters of their own (e.g. random features drawn from the seed,
     * with a feature-count option): the attention's options and seed. NULL and 0 when
     * the map is used on its own (fm_init). */
    const attn_params *params;
    uint64_t seed;
} fm_spec;

struct fm_cuda_map; /* a map's kernel launchers (linear_cuda.cu) */

struct fm_map {
    const char *name;     /* the option value (linear's feature_map) and list's name */
    const char *features; /* feature count C for input size D, as a formula (for people) */
    const char *help;     /* what phi is; linear's option help lists it */
    bool linear_choice;   /* offered as a value of linear's feature_map option */
    /* Feature count for input size D (size_t so callers can check overflow); p: the
     * attention's options (NULL: defaults), for maps whose size is an option. */
    size_t (*dim)(int D, const attn_params *p);
    /* phi[i, :] = phi(x[i, :]) for i < n. */
    void (*forward)(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi);
    /* gx[i, :] = (d phi(x_i) / d x_i)^T gphi[i, :] for i < n (overwrites gx). */
    void (*backward)(const fm_spec *f, int n, const float *x, int ldx, const float *gphi, int ldg, float *gx,
                     int ldgx);
    /* Its CUDA kernels; NULL in a build without CUDA (or for a map without them: the
     * CUDA backend then refuses it). */
    const struct fm_cuda_map *cuda;
};

extern const fm_map fm_maps[];
extern const int fm_n_maps;

/* Index of the map called `name`, or -1. */
int fm_find(const char *name);

/* Feature size of a map for input size D with default options. */
size_t fm_dim(fm_kind kind, int D);

/* Fills *f (no attention options: params NULL, seed 0); c and scale are read by
 * FM_POLY only. */
void fm_init(fm_spec *f, fm_kind kind, int D, double c, double scale);

/* f->map's forward and backward (see fm_map). */
void fm_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi);
void fm_backward(const fm_spec *f, int n, const float *x, int ldx, const float *gphi, int ldg, float *gx,
                 int ldgx);

/* linear's feature_map option: choice c is the c-th entry marked linear_choice (the
 * index stored in attn_params.feature_map); NULL past the last. */
const fm_map *fm_linear_choice(int c);
/* Its names and help ("NAME (HELP)" for each choice) for the option table. */
extern const attn_choice_source fm_linear_choices;

/* The map (with sizes, options and seed) that a `linear` or `polynomial` attention uses
 * for input size D (linear.c; the CUDA backend builds its device map from it too). */
void lin_feature_map(const attn *a, int D, fm_spec *f);

#endif
