/* Internal: the feature maps of linear attention on the device, as the CUDA backend
 * of `linear` and `polynomial` (linear_cuda.cu) reaches them: through each map's entry
 * in the table (feature_maps.h: fm_maps[...].cuda, a struct fm_cuda_map of launchers).
 * The elu, taylor and poly maps are feature_maps_cuda.cu; favor is favor_cuda.cu.
 * C++ (CUDA) only. */
#ifndef ATTN_FEATURE_MAPS_CUDA_CUH
#define ATTN_FEATURE_MAPS_CUDA_CUH

#include "cuda_util.cuh"

extern "C" {
#include "feature_maps.h"
}

/* What the maps' device functions read: the fm_spec of the call (feature_maps.h),
 * copied by linear_cuda.cu's cfg_make, and favor's projection in device memory (W
 * [C x D] and its transpose WT [D x C], set by the caller once drawn; NULL otherwise). */
struct fm_dev {
    int D, C;
    float c, lin, scale;
    const float *W, *WT;
};

__device__ __forceinline__ double fm_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Rows of a group buffer: row r is position p0 + r % rows_per of slice r / rows_per;
 * that slice's tensor rows start at (tensor base of the group's first slice) +
 * slice * stride, width floats each. Positions >= L are padding. */
struct rowmap {
    long long n_rows, stride;
    long long rows_per, p0, L; /* long long: the padded last chunk may reach past INT_MAX */
};

__device__ __forceinline__ void row_at(const rowmap &rm, long long r, long long *slice, long long *pos) {
    *slice = r / rm.rows_per;
    *pos = rm.p0 + r % rm.rows_per;
}

/* One recurrent step of n_slices slices (linear_cuda.cu's lin_cuda_step): S (each
 * slice's C x (M+1) state) += phi(k) [v, 1]^T, then out = num / (den + eps) from
 * phi(q)^T S. shift: a log-scaled map's running key shift per slice (the state's), NULL
 * otherwise; t: the position (0: the state is empty); ws: step workspace
 * (lin_cuda_step_workspace_bytes). */
struct fm_step_args {
    fm_dev f;
    float *S, *shift;
    const float *q, *k, *v;
    float *out, *ws;
    long long n_slices;
    int M, t;
    double eps;
};

/* A map's launchers (the struct is opaque to the C side). */
struct fm_cuda_map {
    /* phi rows (rm.n_rows x C) of the x rows of rm, zero for padding rows. Log-scaled
     * maps: queries (row_shift != NULL) shifted by their own maximum log-feature, written
     * to row_shift[r]; keys by slice_shift[slice of r]. Others ignore both. */
    int (*forward)(const fm_dev &f, const float *x, const rowmap &rm, float *phi, float *row_shift,
                   const float *slice_shift);
    /* gx rows (valid positions, the layout of x) = (d phi / d x)^T gphi rows, shifts held
     * constant; phi: the forward's rows; gphi may be overwritten. */
    int (*backward)(const fm_dev &f, const float *x, const rowmap &rm, const float *phi, float *gphi, float *gx);
    /* Log-scaled maps (NULL for the others): slice_max[s] = max(slice_max[s], the largest
     * log-feature of the valid rows of slice s of rm). */
    int (*key_max)(const fm_dev &f, const float *x, const rowmap &rm, float *slice_max);
    /* One recurrent step (fm_step_args). */
    int (*step)(const fm_step_args &a);
    /* Floats of step workspace per slice (besides nothing else). */
    long long (*step_ws_floats)(const fm_dev &f, int M);
};

#endif
