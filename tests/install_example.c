/* A program outside the project that uses the installed library through pkg-config:
 * causal linear attention on a tiny input, checked against the formula by hand. */
#include <attnbench/attention.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    /* B=H=1, N=2, D=M=1: q = k = 0 so elu(0)+1 = 1 and every weight is equal. */
    float q[2] = {0, 0}, k[2] = {0, 0}, v[2] = {1, 3}, out[2];
    attn_options opt = {"linear", AB_DEV_CPU, 0, 0, NULL};
    attn *a;
    if (attn_create(&opt, &a)) {
        fprintf(stderr, "attn_create: %s\n", attn_error());
        return 1;
    }
    attn_shape s = {1, 1, 2, 1, 1, true, NULL};
    size_t saved_bytes = attn_saved_bytes(a, &s);
    void *saved = malloc(saved_bytes ? saved_bytes : 1);
    if (attn_forward(a, &s, q, k, v, out, saved)) {
        fprintf(stderr, "attn_forward: %s\n", attn_error());
        return 1;
    }
    /* out_0 = v_0 / (1 + eps), out_1 = (v_0 + v_1) / (2 + eps), eps = 1e-6 */
    int ok = fabs(out[0] - 1 / (1 + 1e-6)) < 1e-6 && fabs(out[1] - 4 / (2 + 1e-6)) < 1e-6;
    printf("install example: out = [%g, %g] %s\n", out[0], out[1], ok ? "ok" : "WRONG");
    free(saved);
    attn_destroy(a);
    return ok ? 0 : 1;
}
