/* CTC in double (ref_ctc.h). */
#include "ref_ctc.h"

#include <math.h>
#include <stdlib.h>

/* softmax of one frame's K logits */
static void softmax(const double *x, int K, double *y) {
    double mx = x[0], s = 0;
    for (int k = 1; k < K; k++) mx = fmax(mx, x[k]);
    for (int k = 0; k < K; k++) s += (y[k] = exp(x[k] - mx));
    for (int k = 0; k < K; k++) y[k] /= s;
}

/* The path's label sequence equals `labels`: collapse repeats, drop blanks, compare. */
static int path_maps_to(const int *path, int T, const int *labels, int L) {
    int n = 0, prev = -1;
    for (int t = 0; t < T; t++) {
        int k = path[t];
        if (k != prev && k != 0) {
            if (n == L || labels[n] != k - 1) return 0;
            n++;
        }
        prev = k;
    }
    return n == L;
}

double ref_ctc_nll_brute(const double *logits, int T, int K, const int *labels, int L) {
    if (T == 0) return L == 0 ? 0.0 : INFINITY;
    double *y = malloc(sizeof(double) * (size_t)T * K);
    for (int t = 0; t < T; t++) softmax(logits + (size_t)t * K, K, y + (size_t)t * K);
    int *path = calloc((size_t)T, sizeof(int));
    double p = 0;
    for (;;) {
        if (path_maps_to(path, T, labels, L)) {
            double q = 1;
            for (int t = 0; t < T; t++) q *= y[(size_t)t * K + path[t]];
            p += q;
        }
        /* the next path: count in base K, frame 0 fastest */
        int t = 0;
        while (t < T && ++path[t] == K) path[t++] = 0;
        if (t == T) break;
    }
    free(path);
    free(y);
    return p > 0 ? -log(p) : INFINITY;
}

/* The extended sequence: z_s = blank (0) for even s, output labels[(s-1)/2] + 1 for odd s. */
static int ext(const int *labels, int s) { return s % 2 == 0 ? 0 : labels[(s - 1) / 2] + 1; }

/* A path may jump from state s - 2 to s (skipping the blank between) when s is a
 * label whose label differs from the one before. */
static int can_skip(const int *labels, int s) { return s % 2 == 1 && s >= 3 && labels[(s - 1) / 2] != labels[(s - 3) / 2]; }

double ref_ctc_nll(const double *logits, int T, int K, const int *labels, int L, double *grad) {
    if (grad)
        for (long i = 0; i < (long)T * K; i++) grad[i] = 0;
    if (T == 0) return L == 0 ? 0.0 : INFINITY;
    const int S = 2 * L + 1;
    double *y = malloc(sizeof(double) * (size_t)T * K);
    double *a = calloc((size_t)T * S, sizeof(double)), *b = calloc((size_t)T * S, sizeof(double));
    for (int t = 0; t < T; t++) softmax(logits + (size_t)t * K, K, y + (size_t)t * K);
    /* forward: a[t][s] = P(frames 0..t, in state s at t) / (c_0 ... c_t) */
    double logp = 0;
    int dead = 0;
    for (int t = 0; t < T && !dead; t++) {
        double c = 0;
        for (int s = 0; s < S; s++) {
            double v;
            if (t == 0) v = s < 2 ? 1.0 : 0.0;
            else {
                v = a[(size_t)(t - 1) * S + s];
                if (s >= 1) v += a[(size_t)(t - 1) * S + s - 1];
                if (can_skip(labels, s)) v += a[(size_t)(t - 1) * S + s - 2];
            }
            v *= y[(size_t)t * K + ext(labels, s)];
            a[(size_t)t * S + s] = v;
            c += v;
        }
        if (c == 0) dead = 1;
        for (int s = 0; s < S && !dead; s++) a[(size_t)t * S + s] /= c;
        logp += log(c);
    }
    double end = dead ? 0 : a[(size_t)(T - 1) * S + S - 1] + (S >= 2 ? a[(size_t)(T - 1) * S + S - 2] : 0);
    if (end == 0) {
        free(y), free(a), free(b);
        return INFINITY;
    }
    logp += log(end);
    if (grad) {
        /* backward: b[t][s] = P(frames t+1..T-1 | in state s at t), rescaled per frame
         * (any scale will do: the occupancy is normalised per frame below) */
        for (int s = 0; s < S; s++) b[(size_t)(T - 1) * S + s] = s >= S - 2 ? 1.0 : 0.0;
        for (int t = T - 2; t >= 0; t--) {
            double d = 0;
            for (int s = 0; s < S; s++) {
                const double *bn = b + (size_t)(t + 1) * S, *yn = y + (size_t)(t + 1) * K;
                double v = bn[s] * yn[ext(labels, s)];
                if (s + 1 < S) v += bn[s + 1] * yn[ext(labels, s + 1)];
                if (s + 2 < S && can_skip(labels, s + 2)) v += bn[s + 2] * yn[ext(labels, s + 2)];
                b[(size_t)t * S + s] = v;
                d += v;
            }
            for (int s = 0; s < S; s++) b[(size_t)t * S + s] /= d;
        }
        /* occupancy of state s at t: a b normalised over the states; grad = y - occupancy */
        for (int t = 0; t < T; t++) {
            double z = 0;
            for (int s = 0; s < S; s++) z += a[(size_t)t * S + s] * b[(size_t)t * S + s];
            for (int k = 0; k < K; k++) grad[(size_t)t * K + k] = y[(size_t)t * K + k];
            for (int s = 0; s < S; s++)
                grad[(size_t)t * K + ext(labels, s)] -= a[(size_t)t * S + s] * b[(size_t)t * S + s] / z;
        }
    }
    free(y), free(a), free(b);
    return -logp;
}

int ref_ctc_best_path(const double *logits, int T, int K, int *out) {
    int n = 0, prev = -1;
    for (int t = 0; t < T; t++) {
        int am = 0;
        for (int k = 1; k < K; k++)
            if (logits[(size_t)t * K + k] > logits[(size_t)t * K + am]) am = k;
        if (am != prev && am != 0) out[n++] = am - 1;
        prev = am;
    }
    return n;
}

int ref_edit_distance(const int *a, int na, const int *b, int nb) {
    /* D[i][j]: the distance between the first i of a and the first j of b */
    int *D = malloc(sizeof(int) * (size_t)(na + 1) * (nb + 1));
#define AT(i, j) D[(size_t)(i) * (nb + 1) + (j)]
    for (int i = 0; i <= na; i++) AT(i, 0) = i;
    for (int j = 0; j <= nb; j++) AT(0, j) = j;
    for (int i = 1; i <= na; i++)
        for (int j = 1; j <= nb; j++) {
            int sub = AT(i - 1, j - 1) + (a[i - 1] != b[j - 1]);
            int del = AT(i - 1, j) + 1, ins = AT(i, j - 1) + 1;
            int m = sub < del ? sub : del;
            AT(i, j) = m < ins ? m : ins;
        }
    int d = AT(na, nb);
#undef AT
    free(D);
    return d;
}
