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

void embedding_token_index(int *order, int *starts, const int *tokens, int BT, int V) {
    for (int v = 0; v <= V; v++) starts[v] = 0;
    for (int i = 0; i < BT; i++) starts[tokens[i] + 1]++;
    for (int v = 0; v < V; v++) starts[v + 1] += starts[v];
    /* stable placement: starts[v] walks through bucket v, then is restored */
    for (int i = 0; i < BT; i++) order[starts[tokens[i]]++] = i;
    for (int v = V; v > 0; v--) starts[v] = starts[v - 1];
    starts[0] = 0;
}
