/* Internal: feature maps phi of linear attention, sim(q, k) = phi(q) . phi(k).
 *
 *   elu     phi(x) = elu(x) + 1                                    C = D
 *   taylor  phi(x) = [1, x / max(|x|, FM_TAYLOR_NORM_FLOOR)]        C = 1 + D
 *           (sim = 1 + cos(q, k); below the floor, in particular at x = 0, the
 *           direction part is x / floor, which is continuous at |x| = floor and 0 at
 *           x = 0, so sim = 1 there: a zero vector is "orthogonal" to everything)
 *   poly    phi(x) = [c, sqrt(2 c scale) x, scale x_a x_b (a, b = 0..D-1, a major)]
 *           C = 1 + D + D^2; phi(q) . phi(k) = (c + scale q.k)^2 exactly
 *   favor   phi(x) = m^(-1/2) exp(W x' - |x'|^2 / 2), x' = D^(-1/4) x, W [m x D] positive
 *           orthogonal random features drawn from the attention's seed (favor.h)
 *           C = m = `features` (default 2 D)
 *
 * The maps are one table, fm_maps (feature_maps.c): each entry holds the map's name,
 * its feature count, its CPU forward and backward, and its CUDA kernels (the entry's
 * `cuda`, defined in feature_maps_cuda.cu and favor_cuda.cu). Everything else follows from the table: the
 * choices (and their help) of linear's feature_map option are the entries marked
 * linear_choice, in table order; `polynomial` uses the "poly" entry; `attnbench list`
 * lists them all. A new map is its functions (CPU here or in a file of its own, device
 * ones in feature_maps_cuda.cu or a file of its own) plus its entry.
 *
 * Rows are processed independently; x is [n x D] with leading dimension ldx, phi is
 * [n x C] with leading dimension ldphi.
 *
 * Log-scaled maps (favor): features that are exponentials, which overflow float for
 * large inputs. Their forward writes phi(x_i) e^(-shift_i) instead, with the shift
 * chosen by the caller (fm_shift): each row its own maximum log-feature (the map writes
 * it out), or one shift shared by all rows (keys: at least the largest log-feature over
 * the keys the attention combines). linear.c carries the shifts so that they cancel
 * (favor.h explains how). Maps that are not log-scaled take sh = NULL.
 * Maps with parameters of their own drawn from the seed (favor's W) get them through
 * fm_spec.W, which the attention fills for each call. */
#ifndef ATTN_FEATURE_MAPS_H
#define ATTN_FEATURE_MAPS_H

#include "variant.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FM_TAYLOR_NORM_FLOOR 1e-12

/* Indices into fm_maps of the maps that code names directly (the polynomial variant,
 * tests); other entries are found by name (fm_find) or through linear's choices. */
typedef enum { FM_ELU = 0, FM_TAYLOR = 1, FM_POLY = 2, FM_FAVOR = 3 } fm_kind;

/* The shift of a log-scaled map's forward: rows != NULL: each row by its own largest
 * log-feature, written to rows[i]; rows == NULL: every row by `shared`. */
typedef struct {
    float *rows;
    float shared;
} fm_shift;

typedef struct fm_map fm_map;

/* One map instantiated for a call: the entry, sizes and the values its functions read. */
typedef struct {
    fm_kind kind;     /* index into fm_maps */
    const fm_map *map;
    int D, C;         /* input and feature sizes */
    float c;          /* poly: constant feature */
    float lin;        /* poly: sqrt(2 c scale), weight of the linear features */
    float scale;      /* poly: weight of the quadratic features */
    /* For maps with parameters of their own (random features drawn from the seed, with
     * a feature-count option): the attention's options and seed, NULL and 0 when the map
     * is used on its own (fm_init); and the parameters for this call (favor: W, C x D
     * floats in host memory, which the attention draws; NULL for the other maps). */
    const attn_params *params;
    uint64_t seed;
    const float *W;
} fm_spec;

struct fm_cuda_map; /* a map's kernel launchers (linear_cuda.cu) */

struct fm_map {
    const char *name;     /* the option value (linear's feature_map) and list's name */
    const char *features; /* feature count C for input size D, as a formula (for people) */
    const char *help;     /* what phi is; linear's option help lists it */
    bool linear_choice;   /* offered as a value of linear's feature_map option */
    bool log_scaled;      /* forward writes shifted features (see above) */
    /* Feature count for input size D (size_t so callers can check overflow); p: the
     * attention's options (NULL: defaults), for maps whose size is an option. */
    size_t (*dim)(int D, const attn_params *p);
    /* phi[i, :] = phi(x[i, :]) for i < n (log-scaled maps: times e^(-shift), sh given;
     * others: sh ignored, may be NULL). */
    void (*forward)(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi, const fm_shift *sh);
    /* gx[i, :] = (d phi(x_i) / d x_i)^T gphi[i, :] for i < n (overwrites gx), the shift
     * of a log-scaled map held constant. phi: what forward wrote for these rows (with
     * that shift), for maps whose derivative comes cheaper from it. gphi may be
     * overwritten (scratch). */
    void (*backward)(const fm_spec *f, int n, const float *x, int ldx, const float *phi, int ldphi, float *gphi,
                     int ldg, float *gx, int ldgx);
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
void fm_forward(const fm_spec *f, int n, const float *x, int ldx, float *phi, int ldphi, const fm_shift *sh);
void fm_backward(const fm_spec *f, int n, const float *x, int ldx, const float *phi, int ldphi, float *gphi, int ldg,
                 float *gx, int ldgx);

/* linear's feature_map option: choice c is the c-th entry marked linear_choice (the
 * index stored in attn_params.feature_map); NULL past the last. */
const fm_map *fm_linear_choice(int c);
/* Its names and help ("NAME (HELP)" for each choice) for the option table. */
extern const attn_choice_source fm_linear_choices;

/* The map (with sizes, options and seed) that a `linear` or `polynomial` attention uses
 * for input size D (linear.c; the CUDA backend builds its device map from it too); f->W
 * is NULL (the caller provides it where the map has one). */
void lin_feature_map(const attn *a, int D, fm_spec *f);

/* The recurrent state of a `linear` or `polynomial` attention for shape s (linear.c,
 * shared with the CUDA backend): Saug at offset 0; for a log-scaled map the slices' key
 * shifts at *c_off and the projection W at *w_off, its transpose 64-byte aligned after it
 * (both 0 otherwise); *total bytes. */
void lin_state_layout(const attn *a, const attn_shape *s, size_t *c_off, size_t *w_off, size_t *total);

#endif
