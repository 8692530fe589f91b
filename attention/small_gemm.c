/* small_gemm.h's products. Register blocking: sg_rows keeps 4 rows x 64 columns of Y
 * (16 vectors of 16 floats) while k runs over K, each step loading one row of W (4
 * vectors) and 4 scalars of X: 16 fused multiply-adds per 4 loads and 4 broadcasts.
 * sg_outer_acc keeps 4 rows x 64 columns of W while the rows of X and Y go by, in row
 * blocks of SG_ROW_BLOCK so that the block of X and Y read 16 times (once per 4 rows of
 * W at K = 64) stays in the core's L2. Narrower tails: 16 columns at a time, single
 * rows. Vectors are GCC/Clang vector types, which the compiler maps to the machine's
 * registers (AVX-512 here: one register each).
 *
 * Measured against OpenBLAS 0.3.21 (Cooperlake kernels, one thread, the machine shared
 * with other work, best of 30, 8 slices of N = 4096, D = M = 64): (N x 64)(64 x 64) 2.95
 * ms (91 GFLOP/s) against 3.47 ms (77); (64 x N)(N x 64) 3.27 ms (82) against 4.02 ms
 * (67); its sgemm at 2048^3 reaches about 100 GFLOP/s. Sums run over k (sg_rows) and
 * over the rows in order (sg_outer_acc), each element with its own chain of fused
 * multiply-adds. */
#include "small_gemm.h"

#include <stddef.h>

typedef float sg_vec __attribute__((vector_size(64), aligned(4))); /* 16 floats, any float alignment */
#define SG_LD(p) (*(const sg_vec *)(const void *)(p))
#define SG_ST(p, x) (*(sg_vec *)(void *)(p) = (x))
enum { SG_ROW_BLOCK = 256 };

/* a + b * w as one fused multiply-add per element (ISO C mode turns GCC's contraction
 * off; the attribute turns it on for these functions) */
#if defined(__clang__)
#define SG_CONTRACT _Pragma("clang fp contract(fast)")
#define SG_FMA_ATTR
#elif defined(__GNUC__)
#define SG_CONTRACT
#define SG_FMA_ATTR __attribute__((optimize("fp-contract=fast")))
#else
#define SG_CONTRACT
#define SG_FMA_ATTR
#endif

SG_FMA_ATTR void sg_rows(int t, int K, int P, const float *restrict X, int ldx, const float *restrict W, int ldw,
                         float *restrict Y, int ldy) {
    SG_CONTRACT
    int j0 = 0;
    for (; j0 + 64 <= P; j0 += 64) {
        int i = 0;
        for (; i + 4 <= t; i += 4) {
            const float *x0 = X + (size_t)i * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
            sg_vec a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
            sg_vec a20 = {0}, a21 = {0}, a22 = {0}, a23 = {0}, a30 = {0}, a31 = {0}, a32 = {0}, a33 = {0};
            for (int k = 0; k < K; k++) {
                const float *w = W + (size_t)k * ldw + j0;
                const sg_vec w0 = SG_LD(w), w1 = SG_LD(w + 16), w2 = SG_LD(w + 32), w3 = SG_LD(w + 48);
                const float b0 = x0[k], b1 = x1[k], b2 = x2[k], b3 = x3[k];
                a00 += b0 * w0, a01 += b0 * w1, a02 += b0 * w2, a03 += b0 * w3;
                a10 += b1 * w0, a11 += b1 * w1, a12 += b1 * w2, a13 += b1 * w3;
                a20 += b2 * w0, a21 += b2 * w1, a22 += b2 * w2, a23 += b2 * w3;
                a30 += b3 * w0, a31 += b3 * w1, a32 += b3 * w2, a33 += b3 * w3;
            }
            float *y = Y + (size_t)i * ldy + j0;
            SG_ST(y, a00), SG_ST(y + 16, a01), SG_ST(y + 32, a02), SG_ST(y + 48, a03);
            y += ldy;
            SG_ST(y, a10), SG_ST(y + 16, a11), SG_ST(y + 32, a12), SG_ST(y + 48, a13);
            y += ldy;
            SG_ST(y, a20), SG_ST(y + 16, a21), SG_ST(y + 32, a22), SG_ST(y + 48, a23);
            y += ldy;
            SG_ST(y, a30), SG_ST(y + 16, a31), SG_ST(y + 32, a32), SG_ST(y + 48, a33);
        }
        for (; i < t; i++) {
            const float *x = X + (size_t)i * ldx;
            sg_vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int k = 0; k < K; k++) {
                const float *w = W + (size_t)k * ldw + j0;
                const float b = x[k];
                a0 += b * SG_LD(w), a1 += b * SG_LD(w + 16), a2 += b * SG_LD(w + 32), a3 += b * SG_LD(w + 48);
            }
            float *y = Y + (size_t)i * ldy + j0;
            SG_ST(y, a0), SG_ST(y + 16, a1), SG_ST(y + 32, a2), SG_ST(y + 48, a3);
        }
    }
    for (; j0 < P; j0 += 16) /* P % 64 == 16, 32 or 48 */
        for (int i = 0; i < t; i++) {
            const float *x = X + (size_t)i * ldx;
            sg_vec a = {0};
            for (int k = 0; k < K; k++) a += x[k] * SG_LD(W + (size_t)k * ldw + j0);
            SG_ST(Y + (size_t)i * ldy + j0, a);
        }
}

SG_FMA_ATTR void sg_outer_acc(int t, int K, int P, const float *restrict X, int ldx, const float *restrict Y, int ldy,
                              float *restrict W, int ldw) {
    SG_CONTRACT
    for (int i0 = 0; i0 < t; i0 += SG_ROW_BLOCK) {
        const int i1 = t - i0 < SG_ROW_BLOCK ? t : i0 + SG_ROW_BLOCK;
        int j0 = 0;
        for (; j0 + 64 <= P; j0 += 64) {
            int k = 0;
            for (; k + 4 <= K; k += 4) {
                float *w0 = W + (size_t)k * ldw + j0, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
                sg_vec a00 = SG_LD(w0), a01 = SG_LD(w0 + 16), a02 = SG_LD(w0 + 32), a03 = SG_LD(w0 + 48);
                sg_vec a10 = SG_LD(w1), a11 = SG_LD(w1 + 16), a12 = SG_LD(w1 + 32), a13 = SG_LD(w1 + 48);
                sg_vec a20 = SG_LD(w2), a21 = SG_LD(w2 + 16), a22 = SG_LD(w2 + 32), a23 = SG_LD(w2 + 48);
                sg_vec a30 = SG_LD(w3), a31 = SG_LD(w3 + 16), a32 = SG_LD(w3 + 32), a33 = SG_LD(w3 + 48);
                for (int i = i0; i < i1; i++) {
                    const float *y = Y + (size_t)i * ldy + j0, *x = X + (size_t)i * ldx + k;
                    const sg_vec y0 = SG_LD(y), y1 = SG_LD(y + 16), y2 = SG_LD(y + 32), y3 = SG_LD(y + 48);
                    const float b0 = x[0], b1 = x[1], b2 = x[2], b3 = x[3];
                    a00 += b0 * y0, a01 += b0 * y1, a02 += b0 * y2, a03 += b0 * y3;
                    a10 += b1 * y0, a11 += b1 * y1, a12 += b1 * y2, a13 += b1 * y3;
                    a20 += b2 * y0, a21 += b2 * y1, a22 += b2 * y2, a23 += b2 * y3;
                    a30 += b3 * y0, a31 += b3 * y1, a32 += b3 * y2, a33 += b3 * y3;
                }
                SG_ST(w0, a00), SG_ST(w0 + 16, a01), SG_ST(w0 + 32, a02), SG_ST(w0 + 48, a03);
                SG_ST(w1, a10), SG_ST(w1 + 16, a11), SG_ST(w1 + 32, a12), SG_ST(w1 + 48, a13);
                SG_ST(w2, a20), SG_ST(w2 + 16, a21), SG_ST(w2 + 32, a22), SG_ST(w2 + 48, a23);
                SG_ST(w3, a30), SG_ST(w3 + 16, a31), SG_ST(w3 + 32, a32), SG_ST(w3 + 48, a33);
            }
            for (; k < K; k++) { /* K % 4 rows of W, one at a time */
                float *w = W + (size_t)k * ldw + j0;
                sg_vec a0 = SG_LD(w), a1 = SG_LD(w + 16), a2 = SG_LD(w + 32), a3 = SG_LD(w + 48);
                for (int i = i0; i < i1; i++) {
                    const float *y = Y + (size_t)i * ldy + j0;
                    const float b = X[(size_t)i * ldx + k];
                    a0 += b * SG_LD(y), a1 += b * SG_LD(y + 16), a2 += b * SG_LD(y + 32), a3 += b * SG_LD(y + 48);
                }
                SG_ST(w, a0), SG_ST(w + 16, a1), SG_ST(w + 32, a2), SG_ST(w + 48, a3);
            }
        }
        for (; j0 < P; j0 += 16) /* P % 64 == 16, 32 or 48 */
            for (int k = 0; k < K; k++) {
                float *w = W + (size_t)k * ldw + j0;
                sg_vec a = SG_LD(w);
                for (int i = i0; i < i1; i++) a += X[(size_t)i * ldx + k] * SG_LD(Y + (size_t)i * ldy + j0);
                SG_ST(w, a);
            }
    }
}
