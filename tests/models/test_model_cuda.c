/* The model on CUDA against the model on the CPU: every position-wise layer's device
 * forward and backward (models/layers_cuda.h) against its CPU layer, the dropout masks
 * bit for bit, the LSTM stack (models/lstm.h: forward, backward, masks, padding,
 * bit-identical repeats) against the CPU's, a tiny transformer's logits, loss, every gradient and one optimiser
 * step (softmax, linear, stateful-softmax and lsh attention; dropout on and off;
 * post- and pre-norm; padding and weights), the frames + LSTM model's logits, loss,
 * masks and gradients (bidirectional and causal, padding, dropout; bit-identical
 * repeats, no allocation per step), generation on the device (test_model_cuda_gen.c: recurrent ==
 * recomputation, the CPU's greedy tokens and draws), the optimiser on the device (bit for bit
 * against the CPU's, state download and upload, checkpoints), no allocation per
 * training step on either side, and the logistic mixture head (its layer and a tiny
 * model with it) against the CPU.
 *
 * Written once, built twice (tests/meson.build), like test_cuda.c:
 * - test_model_cuda: linked to the real library; runs on a machine with a GPU and
 *   skips (with the reason) without one, or in a build without CUDA (where the
 *   layer-level tests, which call layers_cuda.h directly, are not compiled).
 * - test_model_cuda_emu: linked to the emulated library (the same .cu sources on the
 *   CPU emulator of tests/cuda_emu/), so it runs everywhere. Shapes stay tiny: the
 *   emulator runs every GPU thread as a fiber.
 *
 * Error figures are tu_rel_err (max abs error over a tensor / the tensor's max abs).
 * TEST_VERBOSE=1 prints every measured error; the tolerance comments quote what the
 * emulator measured. On a GPU cuBLAS and the device's fused multiply-adds round
 * differently from the emulator (whose GEMM accumulates in double): the margins
 * below are meant to cover that, but no GPU has run this suite yet. */
#include "test_model_cuda.h"

/* Skips the test when this build or machine has no CUDA device. */
void require_cuda(void) {
    int rc = ab_cuda_init();
    if (rc) cr_skip_test("CUDA not available here: %s", ab_error());
}

/* ---- device buffers ---- */

void *dput(const void *h, size_t bytes) {
    void *d = NULL;
    cr_assert_eq(ab_dev_malloc(AB_DEV_CUDA, &d, bytes ? bytes : 4), 0, "%s", ab_error());
    if (h && bytes) cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d, h, bytes), 0, "%s", ab_error());
    return d;
}

void dget(void *h, const void *d, size_t bytes) {
    cr_assert_eq(ab_dev_download(AB_DEV_CUDA, h, d, bytes), 0, "%s", ab_error());
}

void dfree(void *d) { ab_dev_free(AB_DEV_CUDA, d); }

float *fdup(const float *x, size_t n) {
    float *y = tu_alloc_f(n);
    memcpy(y, x, sizeof(float) * n);
    return y;
}

/* Whether a device result equals the CPU's bit for bit. */
bool dev_same(const void *d, const void *cpu, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    dget(h, d, bytes);
    bool same = memcmp(h, cpu, bytes) == 0;
    free(h);
    return same;
}

/* ======================================================================================
 * Layers
 * ==================================================================================== */

#ifdef TEST_CUDA_BACKEND

/* tu_rel_err of a device result (downloaded) against the CPU's float result. */
double dev_err(const float *d, const float *cpu, size_t n, const char *what) {
    float *h = tu_alloc_f(n);
    dget(h, d, sizeof(float) * n);
    double *want = tu_to_double(cpu, n);
    double e = tu_rel_err(h, want, n, 1e-30);
    if (tu_verbose()) fprintf(stderr, "%s: err %.3g\n", what, e);
    free(h);
    free(want);
    return e;
}

Test(layers_cuda, dense_forward_backward_accumulate) {
    require_cuda();
    const int BT = 7, C = 5, OC = 9;
    for (int bias = 0; bias < 2; bias++) {
        float *x = tu_normal((size_t)BT * C, 1, 1, 1.0), *w = tu_normal((size_t)OC * C, 1, 2, 0.5);
        float *b = tu_normal(OC, 1, 3, 0.5);
        float *dout = tu_normal((size_t)BT * OC, 1, 4, 1.0);
        /* gradients start non-zero: backward must add */
        float *dx = tu_normal((size_t)BT * C, 1, 5, 1.0), *dw = tu_normal((size_t)OC * C, 1, 6, 1.0);
        float *db = tu_normal(OC, 1, 7, 1.0);
        float *out = tu_alloc_f((size_t)BT * OC);
        float *d_x = dput(x, sizeof(float) * BT * C), *d_w = dput(w, sizeof(float) * OC * C);
        float *d_b = dput(b, sizeof(float) * OC), *d_dout = dput(dout, sizeof(float) * BT * OC);
        float *d_dx = dput(dx, sizeof(float) * BT * C), *d_dw = dput(dw, sizeof(float) * OC * C);
        float *d_db = dput(db, sizeof(float) * OC), *d_out = dput(NULL, sizeof(float) * BT * OC);
        dense_forward(out, x, w, bias ? b : NULL, BT, C, OC);
        cr_assert_eq(dense_forward_cuda(d_out, d_x, d_w, bias ? d_b : NULL, BT, C, OC), 0, "%s", ab_error());
        cr_expect_lt(dev_err(d_out, out, (size_t)BT * OC, "dense out"), LAYER_TOL);
        dense_backward(dx, dw, bias ? db : NULL, dout, x, w, BT, C, OC);
        cr_assert_eq(dense_backward_cuda(d_dx, d_dw, bias ? d_db : NULL, d_dout, d_x, d_w, BT, C, OC), 0, "%s",
                     ab_error());
        cr_expect_lt(dev_err(d_dx, dx, (size_t)BT * C, "dense dx"), LAYER_TOL);
        cr_expect_lt(dev_err(d_dw, dw, (size_t)OC * C, "dense dw"), LAYER_TOL);
        cr_expect_lt(dev_err(d_db, db, OC, "dense db"), LAYER_TOL);
        /* dx = NULL is allowed */
        cr_assert_eq(dense_backward_cuda(NULL, d_dw, NULL, d_dout, d_x, d_w, BT, C, OC), 0, "%s", ab_error());
        void *ptrs[] = {x, w, b, dout, dx, dw, db, out};
        for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) free(ptrs[i]);
        void *dptrs[] = {d_x, d_w, d_b, d_dout, d_dx, d_dw, d_db, d_out};
        for (size_t i = 0; i < sizeof dptrs / sizeof *dptrs; i++) dfree(dptrs[i]);
    }
}

Test(layers_cuda, layernorm_forward_backward) {
    require_cuda();
    /* C > 32 (lanes stride over channels, two column blocks); BT > 16 (row lanes of the
     * column sums) */
    const int BT = 40, C = 37;
    const size_t n = (size_t)BT * C;
    float *x = tu_normal(n, 2, 1, 2.0), *g = tu_normal(C, 2, 2, 0.3), *b = tu_normal(C, 2, 3, 0.5);
    float *dout = tu_normal(n, 2, 4, 1.0);
    for (int c = 0; c < C; c++) g[c] += 1.0f;
    for (size_t i = 0; i < n; i++) x[i] += 3.0f; /* an offset the mean must remove */
    float *out = tu_alloc_f(n), *mean = tu_alloc_f(BT), *rstd = tu_alloc_f(BT);
    float *dx = tu_normal(n, 2, 5, 1.0), *dg = tu_normal(C, 2, 6, 1.0), *db = tu_normal(C, 2, 7, 1.0);
    float *d_x = dput(x, 4 * n), *d_g = dput(g, 4 * C), *d_b = dput(b, 4 * C), *d_dout = dput(dout, 4 * n);
    float *d_out = dput(NULL, 4 * n), *d_mean = dput(NULL, 4 * BT), *d_rstd = dput(NULL, 4 * BT);
    float *d_dx = dput(dx, 4 * n), *d_dg = dput(dg, 4 * C), *d_db = dput(db, 4 * C);
    layernorm_forward(out, mean, rstd, x, g, b, BT, C);
    cr_assert_eq(layernorm_forward_cuda(d_out, d_mean, d_rstd, d_x, d_g, d_b, BT, C), 0, "%s", ab_error());
    cr_expect_lt(dev_err(d_out, out, n, "layernorm out"), LAYER_TOL);
    cr_expect_lt(dev_err(d_mean, mean, BT, "layernorm mean"), LAYER_TOL);
    cr_expect_lt(dev_err(d_rstd, rstd, BT, "layernorm rstd"), LAYER_TOL);
    /* backward from the CPU's saved statistics on both sides */
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_mean, mean, 4 * BT), 0);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_rstd, rstd, 4 * BT), 0);
    layernorm_backward(dx, dg, db, dout, x, g, mean, rstd, BT, C);
    cr_assert_eq(layernorm_backward_cuda(d_dx, d_dg, d_db, d_dout, d_x, d_g, d_mean, d_rstd, BT, C), 0, "%s",
                 ab_error());
    cr_expect_lt(dev_err(d_dx, dx, n, "layernorm dx"), LAYER_TOL);
    cr_expect_lt(dev_err(d_dg, dg, C, "layernorm dg"), LAYER_TOL);
    cr_expect_lt(dev_err(d_db, db, C, "layernorm db"), LAYER_TOL);
    void *ptrs[] = {x, g, b, dout, out, mean, rstd, dx, dg, db};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) free(ptrs[i]);
    void *dptrs[] = {d_x, d_g, d_b, d_dout, d_out, d_mean, d_rstd, d_dx, d_dg, d_db};
    for (size_t i = 0; i < sizeof dptrs / sizeof *dptrs; i++) dfree(dptrs[i]);
}

Test(layers_cuda, embedding_positions_bit_for_bit) {
    require_cuda();
    const int V = 7, B = 3, N = 9, BT = B * N, C = 10, pos0 = 2;
    int tokens[27], order[27], starts[8];
    tu_fill_int(tokens, BT, 3, 1, 0, V - 2); /* token V-1 never occurs: its rows stay */
    tokens[5] = tokens[6] = tokens[20] = 1; /* repeats, summed in position order */
    embedding_token_index(order, starts, tokens, BT, V);
    /* the index itself: each bucket lists its positions in increasing order */
    for (int v = 0; v < V; v++)
        for (int j = starts[v]; j < starts[v + 1]; j++) {
            cr_assert_eq(tokens[order[j]], v);
            if (j > starts[v]) cr_assert_lt(order[j - 1], order[j]);
        }
    cr_assert_eq(starts[V], BT);
    float *wte = tu_normal((size_t)V * C, 3, 2, 1.0), *dout = tu_normal((size_t)BT * C, 3, 3, 1.0);
    float *dwte = tu_normal((size_t)V * C, 3, 4, 1.0), *out = tu_alloc_f((size_t)BT * C);
    float *table = tu_alloc_f((size_t)(N + pos0) * C);
    positions_table(table, N + pos0, C);
    int *d_tokens = dput(tokens, sizeof tokens), *d_order = dput(order, sizeof order);
    int *d_starts = dput(starts, sizeof starts);
    float *d_wte = dput(wte, 4 * V * C), *d_dout = dput(dout, 4 * BT * C), *d_dwte = dput(dwte, 4 * V * C);
    float *d_out = dput(NULL, 4 * BT * C), *d_table = dput(table, 4 * (N + pos0) * C);
    embedding_forward(out, tokens, wte, BT, C);
    positions_add(out, table, B, N, C, pos0);
    cr_assert_eq(embedding_forward_cuda(d_out, d_tokens, d_wte, BT, C), 0, "%s", ab_error());
    cr_assert_eq(positions_add_cuda(d_out, d_table, B, N, C, pos0), 0, "%s", ab_error());
    cr_expect(dev_same(d_out, out, 4 * (size_t)BT * C), "embedding + positions differ from the CPU");
    embedding_backward(dwte, dout, tokens, BT, C);
    cr_assert_eq(embedding_backward_cuda(d_dwte, d_dout, d_order, d_starts, V, C), 0, "%s", ab_error());
    cr_expect(dev_same(d_dwte, dwte, 4 * (size_t)V * C), "embedding gradient differs from the CPU's sums");
    free(wte), free(dout), free(dwte), free(out), free(table);
    dfree(d_tokens), dfree(d_order), dfree(d_starts), dfree(d_wte), dfree(d_dout), dfree(d_dwte), dfree(d_out);
    dfree(d_table);
}

Test(layers_cuda, dropout_masks_and_outputs_bit_for_bit) {
    require_cuda();
    const size_t n = 1003; /* not a multiple of 4 */
    const float rates[3] = {0.1f, 0.3f, 0.9f};
    float *x = tu_normal(n, 4, 1, 1.0), *dout = tu_normal(n, 4, 2, 1.0), *out = tu_alloc_f(n);
    float *dx = tu_normal(n, 4, 3, 1.0);
    uint8_t *mask = malloc(n), *mask2 = malloc(n);
    float *d_x = dput(x, 4 * n), *d_dout = dput(dout, 4 * n), *d_out = dput(NULL, 4 * n), *d_dx = dput(dx, 4 * n);
    uint8_t *d_mask = dput(NULL, n);
    for (int r = 0; r < 3; r++) {
        const float p = rates[r];
        const uint64_t seed = 77 + (uint64_t)r, stream = 0x1234567890ULL + (uint64_t)r;
        dropout_mask(mask, n, p, seed, stream);
        cr_assert_eq(dropout_mask_cuda(d_mask, n, p, seed, stream, 0), 0, "%s", ab_error());
        cr_expect(dev_same(d_mask, mask, n), "p=%g: device mask differs from the CPU's", (double)p);
        dropout_forward(out, mask2, x, n, p, seed, stream);
        cr_assert_eq(dropout_forward_cuda(d_out, d_mask, d_x, n, p, seed, stream, 0), 0, "%s", ab_error());
        cr_expect(dev_same(d_out, out, 4 * n), "p=%g: dropout output differs", (double)p);
        cr_expect(dev_same(d_mask, mask2, n), "p=%g: forward's mask differs", (double)p);
        /* backward: one multiply-add per element, which the device (and g++ for the
         * emulator) may fuse: one rounding instead of two, <= 1 ulp of the O(1) sums.
         * Measured on the emulator: up to 1e-7 (one ulp relative to the largest). */
        dropout_backward(dx, dout, mask2, n, p);
        cr_assert_eq(dropout_backward_cuda(d_dx, d_dout, d_mask, n, p), 0, "%s", ab_error());
        cr_expect_lt(dev_err(d_dx, dx, n, "dropout dx"), 1e-6);
    }
    /* in place, as the encoder uses it */
    dropout_forward(out, mask, x, n, 0.5f, 5, 6);
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_out, x, 4 * n), 0);
    cr_assert_eq(dropout_forward_cuda(d_out, d_mask, d_out, n, 0.5f, 5, 6, 0), 0, "%s", ab_error());
    cr_expect(dev_same(d_out, out, 4 * n), "in-place dropout differs");
    /* a part of a larger batch (dropout_forward_at): from element 401, off a block boundary */
    dropout_forward_at(out, mask, x, n - 401, 0.3f, 5, 6, 401);
    cr_assert_eq(dropout_forward_cuda(d_out, d_mask, d_x, n - 401, 0.3f, 5, 6, 401), 0, "%s", ab_error());
    cr_expect(dev_same(d_out, out, 4 * (n - 401)), "dropout from element 401 differs");
    cr_expect(dev_same(d_mask, mask, n - 401), "mask from element 401 differs");
    free(x), free(dout), free(out), free(dx), free(mask), free(mask2);
    dfree(d_x), dfree(d_dout), dfree(d_out), dfree(d_dx), dfree(d_mask);
}

Test(layers_cuda, relu_heads_residuals_bit_for_bit) {
    require_cuda();
    const int B = 2, N = 3, C = 6, H = 3;
    const size_t n = (size_t)B * N * C;
    float *qkv = tu_normal(3 * n, 5, 1, 1.0), *q = tu_alloc_f(n), *k = tu_alloc_f(n), *v = tu_alloc_f(n);
    float *back = tu_alloc_f(3 * n), *merged = tu_alloc_f(n), *heads = tu_alloc_f(n);
    float *d_qkv = dput(qkv, 12 * n), *d_q = dput(NULL, 4 * n), *d_k = dput(NULL, 4 * n), *d_v = dput(NULL, 4 * n);
    float *d_back = dput(NULL, 12 * n), *d_merged = dput(NULL, 4 * n), *d_heads = dput(NULL, 4 * n);
    heads_split(q, k, v, qkv, B, N, C, H);
    cr_assert_eq(heads_split_cuda(d_q, d_k, d_v, d_qkv, B, N, C, H), 0, "%s", ab_error());
    cr_expect(dev_same(d_q, q, 4 * n) && dev_same(d_k, k, 4 * n) && dev_same(d_v, v, 4 * n), "split differs");
    heads_join(back, q, k, v, B, N, C, H);
    cr_assert_eq(heads_join_cuda(d_back, d_q, d_k, d_v, B, N, C, H), 0, "%s", ab_error());
    cr_expect(dev_same(d_back, back, 12 * n), "join differs");
    cr_expect(memcmp(back, qkv, 12 * n) == 0, "join is not the inverse of split");
    heads_merge(merged, q, B, N, C, H);
    cr_assert_eq(heads_merge_cuda(d_merged, d_q, B, N, C, H), 0, "%s", ab_error());
    cr_expect(dev_same(d_merged, merged, 4 * n), "merge differs");
    heads_unmerge(heads, merged, B, N, C, H);
    cr_assert_eq(heads_unmerge_cuda(d_heads, d_merged, B, N, C, H), 0, "%s", ab_error());
    cr_expect(dev_same(d_heads, heads, 4 * n), "unmerge differs");
    cr_expect(memcmp(heads, q, 4 * n) == 0, "unmerge is not the inverse of merge");
    /* residuals and ReLU */
    residual_add(merged, q, k, n);
    cr_assert_eq(residual_add_cuda(d_merged, d_q, d_k, n), 0, "%s", ab_error());
    cr_expect(dev_same(d_merged, merged, 4 * n), "residual add differs");
    residual_acc(merged, v, n);
    cr_assert_eq(residual_acc_cuda(d_merged, d_v, n), 0, "%s", ab_error());
    cr_expect(dev_same(d_merged, merged, 4 * n), "residual acc differs");
    relu_forward(merged, n);
    cr_assert_eq(relu_forward_cuda(d_merged, n), 0, "%s", ab_error());
    cr_expect(dev_same(d_merged, merged, 4 * n), "relu differs");
    relu_backward(q, k, merged, n);
    cr_assert_eq(relu_backward_cuda(d_q, d_k, d_merged, n), 0, "%s", ab_error());
    cr_expect(dev_same(d_q, q, 4 * n), "relu backward differs");
    /* strided rows */
    cr_assert_eq(rows_copy_cuda(d_heads, 2, d_qkv + 1, 5, 4, 2), 0, "%s", ab_error());
    float got[8];
    dget(got, d_heads, sizeof got);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 2; c++) cr_expect_eq(got[r * 2 + c], qkv[1 + r * 5 + c]);
    free(qkv), free(q), free(k), free(v), free(back), free(merged), free(heads);
    dfree(d_qkv), dfree(d_q), dfree(d_k), dfree(d_v), dfree(d_back), dfree(d_merged), dfree(d_heads);
}

Test(layers_cuda, fused_step_layers) {
    /* The recurrent step's fused layers (layers.h: fused.c) on the device against the
     * CPU's, and the CPU's against the chains they replace: element-wise ones bit for
     * bit (the same single float operations), the layer norm within LAYER_TOL (a warp's
     * double sums against a loop's, as layernorm_forward_cuda). */
    require_cuda();
    const int B = 3, N = 2, C = 6, H = 2, F = 5, V = 4;
    const size_t n = (size_t)B * N * C, nh = (size_t)B * N * F;
    int tokens[6] = {3, 0, 2, 2, 1, 3};
    float *wte = tu_normal((size_t)V * C, 7, 1, 1.0), *table = tu_normal((size_t)8 * C, 7, 2, 1.0);
    float *qkv = tu_normal(3 * n, 7, 3, 1.0), *bias = tu_normal(3 * (size_t)C, 7, 4, 1.0);
    float *x = tu_normal(n, 7, 5, 1.0), *branch = tu_normal(n, 7, 6, 1.0), *h = tu_normal(nh, 7, 7, 1.0);
    float *g = tu_normal((size_t)C, 7, 8, 1.0), *b = tu_normal((size_t)C, 7, 9, 1.0);
    float *out = tu_alloc_f(n), *ref = tu_alloc_f(n), *q = tu_alloc_f(n), *k = tu_alloc_f(n), *v = tu_alloc_f(n);
    float *res = tu_alloc_f(n), *ln = tu_alloc_f(n), *mean = tu_alloc_f(B * N), *rstd = tu_alloc_f(B * N);
    int *d_tok = dput(tokens, sizeof tokens);
    float *d_wte = dput(wte, 4 * (size_t)V * C), *d_table = dput(table, 4 * (size_t)8 * C), *d_out = dput(NULL, 4 * n);
    float *d_qkv = dput(qkv, 12 * n), *d_bias = dput(bias, 12 * (size_t)C), *d_q = dput(NULL, 4 * n);
    float *d_k = dput(NULL, 4 * n), *d_v = dput(NULL, 4 * n), *d_x = dput(x, 4 * n), *d_br = dput(branch, 4 * n);
    float *d_h = dput(h, 4 * nh), *d_g = dput(g, 4 * (size_t)C), *d_b = dput(b, 4 * (size_t)C);
    float *d_res = dput(NULL, 4 * n), *d_ln = dput(NULL, 4 * n), *d_mean = dput(NULL, 4 * (size_t)B * N);
    float *d_rstd = dput(NULL, 4 * (size_t)B * N);
    /* embedding + positions, from position 3 */
    embedding_positions(out, tokens, wte, table, B, N, C, 3);
    embedding_forward(ref, tokens, wte, B * N, C);
    positions_add(ref, table, B, N, C, 3);
    cr_expect(memcmp(out, ref, 4 * n) == 0, "embedding_positions differs from embedding then positions");
    cr_assert_eq(embedding_positions_cuda(d_out, d_tok, d_wte, d_table, B, N, C, 3), 0, "%s", ab_error());
    cr_expect(dev_same(d_out, out, 4 * n), "embedding_positions on the device differs");
    embedding_positions(out, tokens, wte, NULL, B, N, C, 0);
    cr_assert_eq(embedding_positions_cuda(d_out, d_tok, d_wte, NULL, B, N, C, 0), 0, "%s", ab_error());
    cr_expect(dev_same(d_out, out, 4 * n), "embedding without positions on the device differs");
    /* bias + heads split */
    bias_heads_split(q, k, v, qkv, bias, B, N, C, H);
    float *qkvb = fdup(qkv, 3 * n);
    for (size_t r = 0; r < (size_t)B * N; r++)
        for (int c = 0; c < 3 * C; c++) qkvb[r * 3 * C + c] += bias[c];
    heads_split(out, ref, res, qkvb, B, N, C, H);
    cr_expect(memcmp(q, out, 4 * n) == 0 && memcmp(k, ref, 4 * n) == 0 && memcmp(v, res, 4 * n) == 0,
              "bias_heads_split differs from the bias then the split");
    cr_assert_eq(bias_heads_split_cuda(d_q, d_k, d_v, d_qkv, d_bias, B, N, C, H), 0, "%s", ab_error());
    cr_expect(dev_same(d_q, q, 4 * n) && dev_same(d_k, k, 4 * n) && dev_same(d_v, v, 4 * n),
              "bias_heads_split on the device differs");
    /* bias + ReLU */
    float *hb = fdup(h, nh);
    bias_relu(hb, b, B * N, F);
    for (size_t i = 0; i < nh; i++) {
        const float y = h[i] + b[i % F];
        cr_assert(hb[i] == (y > 0.0f ? y : 0.0f), "bias_relu at %zu", i);
    }
    cr_assert_eq(bias_relu_cuda(d_h, d_b, B * N, F), 0, "%s", ab_error());
    cr_expect(dev_same(d_h, hb, 4 * nh), "bias_relu on the device differs");
    /* bias + residual + layer norm, and without the norm */
    bias_residual_layernorm(res, ln, mean, rstd, x, branch, g, g, b, B * N, C);
    for (size_t i = 0; i < n; i++) cr_assert(res[i] == x[i] + (branch[i] + g[i % C]), "residual at %zu", i);
    layernorm_forward(out, ref, ref + B * N, res, g, b, B * N, C);
    cr_expect(memcmp(out, ln, 4 * n) == 0, "bias_residual_layernorm's norm differs from layernorm_forward");
    cr_assert_eq(bias_residual_layernorm_cuda(d_res, d_ln, d_mean, d_rstd, d_x, d_br, d_g, d_g, d_b, B * N, C), 0, "%s",
                 ab_error());
    cr_expect(dev_same(d_res, res, 4 * n), "the residual on the device differs");
    cr_expect_lt(dev_err(d_ln, ln, n, "fused layernorm out"), LAYER_TOL);
    cr_expect_lt(dev_err(d_mean, mean, (size_t)B * N, "fused layernorm mean"), LAYER_TOL);
    cr_expect_lt(dev_err(d_rstd, rstd, (size_t)B * N, "fused layernorm rstd"), LAYER_TOL);
    cr_assert_eq(ab_dev_memset(AB_DEV_CUDA, d_res, 0, 4 * n), 0);
    cr_assert_eq(bias_residual_layernorm_cuda(d_res, NULL, NULL, NULL, d_x, d_br, d_g, NULL, NULL, B * N, C), 0, "%s",
                 ab_error());
    cr_expect(dev_same(d_res, res, 4 * n), "the residual alone on the device differs");
    free(wte), free(table), free(qkv), free(bias), free(x), free(branch), free(h), free(g), free(b), free(out);
    free(ref), free(q), free(k), free(v), free(res), free(ln), free(mean), free(rstd), free(qkvb), free(hb);
    dfree(d_tok), dfree(d_wte), dfree(d_table), dfree(d_out), dfree(d_qkv), dfree(d_bias), dfree(d_q), dfree(d_k);
    dfree(d_v), dfree(d_x), dfree(d_br), dfree(d_h), dfree(d_g), dfree(d_b), dfree(d_res), dfree(d_ln);
    dfree(d_mean), dfree(d_rstd);
}

static void ffn_case(float p) {
    const int BT = 6, C = 5, F = 11;
    const size_t nx = (size_t)BT * C, nh = (size_t)BT * F;
    float *x = tu_normal(nx, 6, 1, 1.0), *par = tu_normal(2 * F * C + F + C, 6, 2, 0.5);
    float *dout = tu_normal(nx, 6, 3, 1.0);
    float *gr = tu_normal(2 * F * C + F + C, 6, 4, 0.1), *dx = tu_normal(nx, 6, 5, 1.0);
    float *out = tu_alloc_f(nx), *hidden = tu_alloc_f(nh), *dh = tu_alloc_f(nh);
    uint8_t *mask = p > 0 ? malloc(nh) : NULL;
    float *d_x = dput(x, 4 * nx), *d_par = dput(par, 4 * (2 * F * C + F + C)), *d_dout = dput(dout, 4 * nx);
    float *d_gr = dput(gr, 4 * (2 * F * C + F + C)), *d_dx = dput(dx, 4 * nx), *d_out = dput(NULL, 4 * nx);
    float *d_hidden = dput(NULL, 4 * nh), *d_dh = dput(NULL, 4 * nh);
    uint8_t *d_mask = p > 0 ? dput(NULL, nh) : NULL;
    ffn_params hp = {par, par + F * C, par + F * C + F, par + 2 * F * C + F};
    ffn_params dp = {d_par, d_par + F * C, d_par + F * C + F, d_par + 2 * F * C + F};
    ffn_grads hg = {gr, gr + F * C, gr + F * C + F, gr + 2 * F * C + F};
    ffn_grads dg = {d_gr, d_gr + F * C, d_gr + F * C + F, d_gr + 2 * F * C + F};
    ffn_forward(out, hidden, mask, x, &hp, BT, C, F, p, 8, 9, 0);
    cr_assert_eq(ffn_forward_cuda(d_out, d_hidden, d_mask, d_x, &dp, BT, C, F, p, 8, 9, 0), 0, "%s", ab_error());
    cr_expect_lt(dev_err(d_out, out, nx, "ffn out"), LAYER_TOL, "p=%g", (double)p);
    cr_expect_lt(dev_err(d_hidden, hidden, nh, "ffn hidden"), LAYER_TOL, "p=%g", (double)p);
    if (mask) cr_expect(dev_same(d_mask, mask, nh), "ffn mask differs");
    ffn_backward(dx, &hg, dh, dout, x, hidden, mask, &hp, BT, C, F, p);
    cr_assert_eq(ffn_backward_cuda(d_dx, &dg, d_dh, d_dout, d_x, d_hidden, d_mask, &dp, BT, C, F, p), 0, "%s",
                 ab_error());
    cr_expect_lt(dev_err(d_dx, dx, nx, "ffn dx"), LAYER_TOL, "p=%g", (double)p);
    cr_expect_lt(dev_err(d_gr, gr, 2 * F * C + F + C, "ffn grads"), LAYER_TOL, "p=%g", (double)p);
    free(x), free(par), free(dout), free(gr), free(dx), free(out), free(hidden), free(dh), free(mask);
    dfree(d_x), dfree(d_par), dfree(d_dout), dfree(d_gr), dfree(d_dx), dfree(d_out), dfree(d_hidden), dfree(d_dh);
    dfree(d_mask);
}

Test(layers_cuda, ffn_with_and_without_dropout) {
    require_cuda();
    ffn_case(0.0f);
    ffn_case(0.25f);
}

static void ce_case(int BT, int V, bool weighted, uint64_t seed) {
    float *logits = tu_normal((size_t)BT * V, seed, 1, 2.0), *w = tu_alloc_f(BT);
    int *targets = malloc(sizeof(int) * BT);
    tu_fill_int(targets, BT, seed, 2, 0, V - 1);
    for (int i = 0; i < BT; i++) {
        w[i] = (float)(i % 4) * 0.5f; /* 0, 0.5, 1, 1.5 */
        if (w[i] == 0.0f && weighted) targets[i] = -1; /* unscored: never read */
    }
    /* first-argmax ties: rows 1 and 2 have their maximum at columns 0 and 2 and the
     * target 2, which is not correct (the first argmax is 0) */
    for (int r = 1; r <= 2; r++) {
        logits[r * V + 0] = logits[r * V + 2] = 9.0f;
        targets[r] = 2;
    }
    float *nll = tu_alloc_f(BT), *dl = tu_normal((size_t)BT * V, seed, 3, 1.0);
    float *d_logits = dput(logits, 4 * (size_t)BT * V), *d_w = dput(w, 4 * (size_t)BT);
    int *d_targets = dput(targets, sizeof(int) * BT);
    float *d_nll = dput(NULL, 4 * (size_t)BT), *d_dl = dput(dl, 4 * (size_t)BT * V);
    void *d_ws = dput(NULL, cross_entropy_cuda_ws_bytes(BT));
    ce_stats st, dst;
    const float *wts = weighted ? w : NULL, *d_wts = weighted ? d_w : NULL;
    cross_entropy_forward(&st, nll, logits, targets, wts, BT, V);
    cr_assert_eq(cross_entropy_forward_cuda(&dst, d_nll, d_logits, d_targets, d_wts, BT, V, d_ws), 0, "%s",
                 ab_error());
    /* loss: the mean of float nll values (each the same to <= 1 ulp) in double; the
     * weight sum of multiples of 0.5: exact in any order. Measured 0 (the double sums
     * round to the same float nll; the loss sums differ in order only). */
    double le = fabs(dst.loss - st.loss) / st.loss;
    if (tu_verbose()) fprintf(stderr, "ce BT=%d V=%d: loss err %.3g\n", BT, V, le);
    cr_expect_lt(le, 1e-6, "loss %.17g vs %.17g", dst.loss, st.loss);
    cr_expect_eq(dst.weight_sum, st.weight_sum);
    cr_expect_eq(dst.correct, st.correct);
    cr_expect_eq(dst.counted, st.counted);
    cr_expect_lt(dev_err(d_nll, nll, BT, "ce nll"), LAYER_TOL);
    cross_entropy_backward(dl, logits, targets, wts, st.weight_sum, BT, V);
    cr_assert_eq(cross_entropy_backward_cuda(d_dl, d_logits, d_targets, d_wts, st.weight_sum, BT, V), 0, "%s",
                 ab_error());
    cr_expect_lt(dev_err(d_dl, dl, (size_t)BT * V, "ce dlogits"), LAYER_TOL);
    free(logits), free(w), free(targets), free(nll), free(dl);
    dfree(d_logits), dfree(d_w), dfree(d_targets), dfree(d_nll), dfree(d_dl), dfree(d_ws);
}

Test(layers_cuda, cross_entropy_weights_ties_and_wide_rows) {
    require_cuda();
    ce_case(13, 7, true, 7);
    ce_case(13, 7, false, 8);
    ce_case(300, 40, true, 9); /* V > 32: lanes stride over classes; more rows than the sum's threads */
}

/* ---- the LSTM stack (models/lstm.h) ---- */

/* A stack's tables and buffers on one device; the parameters uploaded from `host`
 * (laid out as the parameter table), activations and scratch filled with NaN. */
typedef struct {
    ab_device dev;
    tf_table pt, at, st;
    lstm_params p, g;
    lstm_acts a;
    lstm_scratch s;
    float *params, *grads;
    void *acts, *scratch;
} lstm_bufs;

static void *lstm_alloc(ab_device dev, size_t bytes) {
    void *p = NULL;
    cr_assert_eq(ab_dev_malloc(dev, &p, bytes), 0, "%s", ab_error());
    return p;
}

static void lstm_bufs_init(lstm_bufs *k, const lstm_config *c, int B, int N, ab_device dev, const float *host) {
    memset(k, 0, sizeof *k);
    k->dev = dev;
    tf_table_init(&k->pt, sizeof(float), 1);
    tf_table_begin(&k->pt, NULL);
    lstm_carve_params(&k->pt, &k->p, c);
    tf_table_init(&k->at, 1, 64);
    tf_table_begin(&k->at, NULL);
    lstm_carve_acts(&k->at, &k->a, c, B, N, c->dropout > 0);
    tf_table_init(&k->st, 1, 64);
    tf_table_begin(&k->st, NULL);
    lstm_carve_scratch(&k->st, &k->s, c, B, N);
    cr_assert(!k->pt.err && !k->at.err && !k->st.err, "%s", ab_error());
    const size_t pb = sizeof(float) * k->pt.total;
    k->params = lstm_alloc(dev, pb);
    k->grads = lstm_alloc(dev, pb);
    k->acts = lstm_alloc(dev, tf_table_bytes(&k->at));
    k->scratch = lstm_alloc(dev, tf_table_bytes(&k->st));
    cr_assert_eq(ab_dev_upload(dev, k->params, host, pb), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_memset(dev, k->acts, 0xff, k->at.total), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_memset(dev, k->scratch, 0xff, k->st.total), 0, "%s", ab_error());
    tf_table_begin(&k->pt, k->params);
    lstm_carve_params(&k->pt, &k->p, c);
    tf_table_begin(&k->pt, k->grads);
    lstm_carve_params(&k->pt, &k->g, c);
    tf_table_begin(&k->at, k->acts);
    lstm_carve_acts(&k->at, &k->a, c, B, N, c->dropout > 0);
    tf_table_begin(&k->st, k->scratch);
    lstm_carve_scratch(&k->st, &k->s, c, B, N);
}

static void lstm_bufs_free(lstm_bufs *k) {
    ab_dev_free(k->dev, k->params);
    ab_dev_free(k->dev, k->grads);
    ab_dev_free(k->dev, k->acts);
    ab_dev_free(k->dev, k->scratch);
    tf_table_free(&k->pt);
    tf_table_free(&k->at);
    tf_table_free(&k->st);
}

/* One forward and backward on k's device: x, dout and the starting dx and
 * gradients (host) uploaded; output, dx and gradients downloaded into host arrays. */
static void lstm_run(lstm_bufs *k, const lstm_config *c, const lstm_dims *d, bool train, const float *x,
                     const float *dout, const float *dx0, const float *g0, float *out, float *dx, float *g) {
    const ab_device dv = k->dev;
    const size_t nx = (size_t)d->B * d->N * c->I, no = (size_t)d->B * d->N * lstm_out_width(c);
    const size_t pb = sizeof(float) * k->pt.total;
    float *d_x = lstm_alloc(k->dev, 4 * nx), *d_dout = lstm_alloc(k->dev, 4 * no), *d_dx = lstm_alloc(k->dev, 4 * nx);
    cr_assert_eq(ab_dev_upload(dv, d_x, x, 4 * nx), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_upload(dv, d_dout, dout, 4 * no), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_upload(dv, d_dx, dx0, 4 * nx), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_upload(dv, k->grads, g0, pb), 0, "%s", ab_error());
    cr_assert_eq(lstm_stack_forward(c, d, d_x, &k->p, &k->a, &k->s, train, 31, 0x55), 0, "%s", ab_error());
    cr_assert_eq(lstm_stack_backward(c, d, d_dx, &k->g, d_dout, d_x, &k->p, &k->a, &k->s, train), 0, "%s",
                 ab_error());
    cr_assert_eq(ab_dev_download(dv, out, lstm_output(c, &k->a), 4 * no), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_download(dv, dx, d_dx, 4 * nx), 0, "%s", ab_error());
    cr_assert_eq(ab_dev_download(dv, g, k->grads, pb), 0, "%s", ab_error());
    ab_dev_free(dv, d_x);
    ab_dev_free(dv, d_dout);
    ab_dev_free(dv, d_dx);
}

/* The stack on CUDA against the stack on the CPU (test_lstm.c checks the CPU against
 * the double reference): the same cuBLAS/OpenBLAS products in another summation order
 * (the emulator's GEMM accumulates in double) and the device's expf/tanhf (within
 * 2 ulp of glibc's) through up to 7 steps of the cell recurrence and two layers. Each
 * side is within test_lstm.c's measured 2.5e-7 (forward) and 4.6e-7 (gradients) of
 * the exact values, so they agree within about the sum: 1e-5 leaves a 12x margin on
 * the worst measured here, while a wrong position, a missed padding row, a lost
 * carried gradient or a device buffer read before it is written (NaN on the
 * emulator) gives 1e-2 or worse. Measured on the emulator (both modes): forward
 * <= 2.5e-7, gradients (dx and every parameter, without their common start)
 * <= 8.3e-7. */
#define LSTM_CUDA_TOL 1e-5

static void lstm_cuda_case(const lstm_config *c, int B, int N, const int *lengths, bool train, uint64_t seed) {
    require_cuda();
    const size_t nx = (size_t)B * N * c->I, no = (size_t)B * N * lstm_out_width(c);
    /* the parameters, drawn on the host as a model would */
    tf_table t;
    lstm_params hp;
    tf_table_init(&t, sizeof(float), 1);
    tf_table_begin(&t, NULL);
    lstm_carve_params(&t, &hp, c);
    const size_t np = t.total;
    float *host = tu_alloc_f(np);
    tf_table_begin(&t, host);
    lstm_carve_params(&t, &hp, c);
    lstm_init_params(c, &hp, seed, 0);
    lstm_bufs cpu, gpu;
    lstm_bufs_init(&cpu, c, B + 1, N + 1, AB_DEV_CPU, host);
    lstm_bufs_init(&gpu, c, B + 1, N + 1, AB_DEV_CUDA, host);
    /* inputs, and gradients that start non-zero (backward must add) */
    float *x = tu_normal(nx, seed, 1, 1.0), *dout = tu_normal(no, seed, 2, 1.0);
    float *dx0 = tu_normal(nx, seed, 3, 1.0), *g0 = tu_normal(np, seed, 4, 0.5);
    float *out[3], *dx[3], *g[3];
    for (int r = 0; r < 3; r++) out[r] = tu_alloc_f(no), dx[r] = tu_alloc_f(nx), g[r] = tu_alloc_f(np);
    lstm_dims dc = {B, N, lengths, AB_DEV_CPU, 0}, dg = {B, N, lengths, AB_DEV_CUDA, 0};
    lstm_run(&cpu, c, &dc, train, x, dout, dx0, g0, out[0], dx[0], g[0]);
    lstm_run(&gpu, c, &dg, train, x, dout, dx0, g0, out[1], dx[1], g[1]);
    char what[128];
    int k = snprintf(what, sizeof what, "lstm L=%d %s p=%g train=%d lengths", c->layers,
                     c->bidirectional ? "bi" : "uni", (double)c->dropout, train);
    for (int b = 0; lengths && b < B && k < (int)sizeof what; b++)
        k += snprintf(what + k, sizeof what - (size_t)k, " %d", lengths[b]);
    double *want = tu_to_double(out[0], no);
    double e = tu_rel_err(out[1], want, no, 1e-30);
    free(want);
    if (tu_verbose()) fprintf(stderr, "%s: forward err %.3g\n", what, e);
    cr_expect_lt(e, LSTM_CUDA_TOL, "%s: forward err %g", what, e);
    for (int b = 0; b < B; b++)
        for (size_t i = (size_t)(lengths ? lengths[b] : N) * lstm_out_width(c); i < (size_t)N * lstm_out_width(c);
             i++)
            cr_expect(out[1][(size_t)b * N * lstm_out_width(c) + i] == 0.0f, "%s: padding output not 0", what);
    /* dropout masks: the CPU's bits */
    for (int l = 0; train && c->dropout > 0 && l < c->layers - 1; l++)
        cr_expect(dev_same(gpu.a.layer[l].mask, cpu.a.layer[l].mask, no), "%s: layer %d mask differs", what, l);
    /* the gradients themselves (minus the common start), so the start's scale hides nothing */
    want = tu_alloc_d(nx);
    float *dd = tu_alloc_f(nx);
    for (size_t i = 0; i < nx; i++) {
        dd[i] = dx[1][i] - dx0[i];
        want[i] = (double)dx[0][i] - dx0[i];
    }
    e = tu_rel_err(dd, want, nx, 1e-30);
    free(want);
    free(dd);
    if (tu_verbose()) fprintf(stderr, "%s: dx err %.3g\n", what, e);
    cr_expect_lt(e, LSTM_CUDA_TOL, "%s: dx err %g", what, e);
    for (int i = 0; i < cpu.pt.n; i++) {
        const tf_tensor *tt = &cpu.pt.t[i];
        float *gd = tu_alloc_f(tt->count);
        double *gw = tu_alloc_d(tt->count);
        for (size_t j = 0; j < tt->count; j++) {
            gd[j] = g[1][tt->offset + j] - g0[tt->offset + j];
            gw[j] = (double)g[0][tt->offset + j] - g0[tt->offset + j];
        }
        e = tu_rel_err(gd, gw, tt->count, 1e-30);
        if (tu_verbose()) fprintf(stderr, "%s: d%s err %.3g\n", what, tt->name, e);
        cr_expect_lt(e, LSTM_CUDA_TOL, "%s: gradient of %s: err %g", what, tt->name, e);
        free(gd);
        free(gw);
    }
    /* a second run on the device gives the same bits */
    lstm_run(&gpu, c, &dg, train, x, dout, dx0, g0, out[2], dx[2], g[2]);
    cr_expect(memcmp(out[1], out[2], 4 * no) == 0, "%s: CUDA output differs between two runs", what);
    cr_expect(memcmp(dx[1], dx[2], 4 * nx) == 0, "%s: CUDA dx differs between two runs", what);
    cr_expect(memcmp(g[1], g[2], 4 * np) == 0, "%s: CUDA gradients differ between two runs", what);
    for (int r = 0; r < 3; r++) free(out[r]), free(dx[r]), free(g[r]);
    free(x), free(dout), free(dx0), free(g0), free(host);
    tf_table_free(&t);
    lstm_bufs_free(&cpu);
    lstm_bufs_free(&gpu);
}

Test(lstm_cuda, bidirectional_two_layers_padded_dropout) {
    const int lengths[3] = {7, 0, 1};
    lstm_config c = {5, 4, 2, true, 0.3f};
    lstm_cuda_case(&c, 3, 7, lengths, true, 201);
    lstm_cuda_case(&c, 3, 7, lengths, false, 202); /* evaluation: no dropout */
}

Test(lstm_cuda, unidirectional_one_and_two_layers) {
    const int lengths[3] = {3, 7, 5};
    lstm_config c1 = {5, 4, 1, false, 0.0f}, c2 = {5, 4, 2, false, 0.0f};
    lstm_cuda_case(&c1, 3, 7, NULL, true, 203);
    lstm_cuda_case(&c2, 3, 7, lengths, true, 204);
}

/* B H = 350 threads: two blocks of the step kernels' grid-stride loop */
Test(lstm_cuda, wide_rows) {
    const int lengths[5] = {5, 0, 3, 1, 5};
    lstm_config c = {3, 70, 1, true, 0.0f};
    lstm_cuda_case(&c, 5, 5, lengths, true, 205);
}

#endif /* TEST_CUDA_BACKEND */


/* ======================================================================================
 * The optimiser on the device
 * ==================================================================================== */

/* CUDA and CPU optimisers fed the same gradients: parameters, moments and every info
 * field equal bit for bit, step after step (optim_cuda.h says why). */
static void optim_case(ab_optim_kind kind, bool decoupled, double clip, uint64_t seed) {
    const size_t n = 10007; /* three norm blocks, the last one short */
    const ab_optim_range r[3] = {{0, 4000, true}, {4000, 17, false}, {4017, n - 4017, true}};
    ab_optim_config c;
    ab_optim_config_default(&c);
    c.kind = kind;
    c.lr = 3e-3;
    c.weight_decay = 0.05;
    c.decoupled_decay = decoupled;
    c.clip_norm = clip;
    c.n_milestones = 1;
    c.milestones[0] = 5;
    c.warmup = 3;
    ab_optim *oc = NULL, *og = NULL;
    cr_assert_eq(ab_optim_create_on(AB_DEV_CPU, &c, n, r, 3, &oc), 0, "%s", ab_error());
    int rc = ab_optim_create_on(AB_DEV_CUDA, &c, n, r, 3, &og);
    if (rc == AB_EDEVICE) cr_skip_test("CUDA not available here: %s", ab_error());
    cr_assert_eq(rc, 0, "%s", ab_error());
    cr_assert_eq(ab_optim_device(og), AB_DEV_CUDA);
    float *p = tu_normal(n, seed, 1, 1.0), *g = tu_alloc_f(n);
    float *d_p = dput(p, 4 * n), *d_g = dput(NULL, 4 * n);
    for (int t = 1; t <= 8; t++) { /* RAdam: steps 1-5 momentum, 6-8 rectified */
        tu_fill_normal(g, n, seed, 10 + (uint64_t)t, t == 2 ? 30.0 : 1.0); /* step 2 is clipped */
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_g, g, 4 * n), 0);
        ab_optim_info ic, ig;
        cr_assert_eq(ab_optim_step(oc, p, g, &ic), 0, "%s", ab_error());
        cr_assert_eq(ab_optim_step(og, d_p, d_g, &ig), 0, "%s", ab_error());
        cr_expect_eq(ig.grad_norm, ic.grad_norm, "step %d: norm %.17g vs %.17g", t, ig.grad_norm, ic.grad_norm);
        cr_expect_eq(ig.clip_scale, ic.clip_scale);
        cr_expect_eq(ig.lr, ic.lr);
        cr_expect_eq(ig.rho, ic.rho);
        cr_expect_eq(ig.rectified, ic.rectified);
        cr_expect_eq(ig.step, t);
        cr_expect(dev_same(d_p, p, 4 * n), "%s decoupled=%d clip=%g: parameters differ after step %d",
                  ab_optim_kind_name(kind), decoupled, clip, t);
    }
    /* the states are the same blob */
    const void *sc, *sg;
    size_t bc, bg;
    cr_assert_eq(ab_optim_get_state(oc, &sc, &bc), 0);
    cr_assert_eq(ab_optim_get_state(og, &sg, &bg), 0, "%s", ab_error());
    cr_assert_eq(bg, bc);
    cr_expect(memcmp(sg, sc, bc) == 0, "the device's state differs from the CPU's");
    free(p), free(g);
    dfree(d_p), dfree(d_g);
    ab_optim_destroy(oc);
    ab_optim_destroy(og);
}

Test(optim_cuda, adam_and_radam_bit_for_bit) {
    optim_case(AB_OPTIM_RADAM, true, 50.0, 31);
    optim_case(AB_OPTIM_ADAM, true, 50.0, 32);
    optim_case(AB_OPTIM_ADAM, false, 0.0, 33);
    optim_case(AB_OPTIM_RADAM, false, 0.0, 34);
}

/* State moves between devices and through a checkpoint; a non-finite gradient changes
 * nothing on the device. */
Test(optim_cuda, state_checkpoint_and_refusals) {
    const size_t n = 3001;
    ab_optim_config c;
    ab_optim_config_default(&c);
    ab_optim *a = NULL, *b = NULL, *cpu = NULL;
    int rc = ab_optim_create_on(AB_DEV_CUDA, &c, n, NULL, 0, &a);
    if (rc == AB_EDEVICE) cr_skip_test("CUDA not available here: %s", ab_error());
    cr_assert_eq(rc, 0, "%s", ab_error());
    cr_assert_eq(ab_optim_create_on(AB_DEV_CUDA, &c, n, NULL, 0, &b), 0, "%s", ab_error());
    cr_assert_eq(ab_optim_create(&c, n, NULL, 0, &cpu), 0, "%s", ab_error());
    float *p = tu_normal(n, 41, 1, 1.0), *g = tu_alloc_f(n);
    float *d_pa = dput(p, 4 * n), *d_pb = dput(p, 4 * n), *d_g = dput(NULL, 4 * n);
    char path[512];
    /* TEST_DATA_DIR is the build folder of this binary; a copy run elsewhere (the GPU
     * pack, harness/scripts/gpu-pack.sh) names a scratch folder in ATTNBENCH_TEST_DIR */
    const char *dir = getenv("ATTNBENCH_TEST_DIR");
    snprintf(path, sizeof path, "%s/model_cuda_optim_%d.ckpt", dir && *dir ? dir : TEST_DATA_DIR, (int)getpid());
    for (int t = 1; t <= 9; t++) {
        tu_fill_normal(g, n, 41, (uint64_t)t, 1.0);
        cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_g, g, 4 * n), 0);
        cr_assert_eq(ab_optim_step(a, d_pa, d_g, NULL), 0, "%s", ab_error());
        if (t <= 4) cr_assert_eq(ab_optim_step(b, d_pb, d_g, NULL), 0, "%s", ab_error());
        if (t == 4) {
            /* b's state through a checkpoint into the CPU optimiser, then back into a
             * fresh device optimiser, which carries on */
            ab_ckpt_writer *w = NULL;
            cr_assert_eq(ab_ckpt_begin(path, &w), 0, "%s", ab_error());
            cr_assert_eq(ab_ckpt_add_optim(w, AB_CKPT_OPTIM, b), 0, "%s", ab_error());
            cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());
            ab_ckpt_reader *r = NULL;
            cr_assert_eq(ab_ckpt_open(path, &r), 0, "%s", ab_error());
            cr_assert_eq(ab_ckpt_get_optim(r, AB_CKPT_OPTIM, cpu), 0, "%s", ab_error());
            ab_ckpt_close(r);
            unlink(path);
            cr_assert_eq(ab_optim_steps(cpu), 4);
            const void *st;
            size_t sb;
            cr_assert_eq(ab_optim_get_state(cpu, &st, &sb), 0);
            ab_optim *b2 = NULL;
            cr_assert_eq(ab_optim_create_on(AB_DEV_CUDA, &c, n, NULL, 0, &b2), 0, "%s", ab_error());
            cr_assert_eq(ab_optim_set_state(b2, st, sb), 0, "%s", ab_error());
            cr_assert_eq(ab_optim_steps(b2), 4);
            ab_optim_destroy(b);
            b = b2;
        } else if (t > 4) {
            cr_assert_eq(ab_optim_step(b, d_pb, d_g, NULL), 0, "%s", ab_error());
        }
    }
    float *pa = tu_alloc_f(n);
    dget(pa, d_pa, 4 * n);
    cr_expect(dev_same(d_pb, pa, 4 * n), "resumed parameters differ from the uninterrupted run");
    /* a NaN gradient: refused, nothing changes */
    g[17] = NAN;
    cr_assert_eq(ab_dev_upload(AB_DEV_CUDA, d_g, g, 4 * n), 0);
    cr_expect_eq(ab_optim_step(a, d_pa, d_g, NULL), AB_EINVAL);
    cr_expect(strstr(ab_error(), "nan"), "%s", ab_error());
    cr_expect_eq(ab_optim_steps(a), 9);
    cr_expect(dev_same(d_pa, pa, 4 * n), "a refused step changed the parameters");
    free(p), free(g), free(pa);
    dfree(d_pa), dfree(d_pb), dfree(d_g);
    ab_optim_destroy(a), ab_optim_destroy(b), ab_optim_destroy(cpu);
}
