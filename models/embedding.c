/* Token embedding: a lookup of rows of wte (V, C). */
#include "layers.h"

#include <string.h>

/* Below this many elements the loops run on one thread (fork/join costs more). */
#define EMB_PAR_MIN 16384

void embedding_forward(float *out, const int *tokens, const float *wte, int BT, int C) {
#pragma omp parallel for schedule(static) if ((size_t)BT * C > EMB_PAR_MIN)
    for (int i = 0; i < BT; i++) memcpy(out + (size_t)i * C, wte + (size_t)tokens[i] * C, sizeof(float) * (size_t)C);
}

/* Threads own blocks of channels and each walks the rows in order, so a token's row
 * of dwte is summed in the same order whatever the thread count (no races, no
 * atomics). */
void embedding_backward(float *dwte, const float *dout, const int *tokens, int BT, int C) {
    const int CB = 16;
    int nblocks = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static) if ((size_t)BT * C > EMB_PAR_MIN && nblocks > 1)
    for (int cb = 0; cb < nblocks; cb++) {
        int c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int i = 0; i < BT; i++) {
            float *dst = dwte + (size_t)tokens[i] * C;
            const float *src = dout + (size_t)i * C;
            for (int c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}
