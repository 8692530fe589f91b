#include "test_model_util.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

tf_config tm_tiny_config(const char *variant) {
    tf_config c;
    tf_config_default(&c);
    c.vocab = 5;
    c.max_len = 6;
    c.d_model = 8;
    c.heads = 2;
    c.layers = 2;
    c.d_ff = 16;
    c.dropout = 0.0f;
    c.attention = variant;
    c.seed = 3;
    return c;
}

ref_params tm_ref_params(const tf_model *m, const double *pd) {
    ref_params r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < tf_param_tensor_count(m); i++) {
        const tf_tensor *t = tf_param_tensor(m, i);
        const double *p = pd + t->offset;
        int l;
        char suffix[64];
        const double **slot = NULL;
        if (strcmp(t->name, "tok_emb") == 0) slot = &r.tok_emb;
        else if (strcmp(t->name, "final_ln.g") == 0) slot = &r.lnf_g;
        else if (strcmp(t->name, "final_ln.b") == 0) slot = &r.lnf_b;
        else if (strcmp(t->name, "head.w") == 0) slot = &r.head_w;
        else if (strcmp(t->name, "head.b") == 0) slot = &r.head_b;
        else if (sscanf(t->name, "layers.%d.%63s", &l, suffix) == 2 && l >= 0 && l < REF_MAX_LAYERS) {
            ref_layer_params *lp = &r.layer[l];
            const char *names[12] = {"ln1.g", "ln1.b", "attn.wqkv", "attn.bqkv", "attn.wo", "attn.bo",
                                     "ln2.g", "ln2.b", "ffn.w1",    "ffn.b1",    "ffn.w2",  "ffn.b2"};
            const double **slots[12] = {&lp->ln1_g, &lp->ln1_b, &lp->wqkv, &lp->bqkv, &lp->wo, &lp->bo,
                                        &lp->ln2_g, &lp->ln2_b, &lp->w1,   &lp->b1,   &lp->w2, &lp->b2};
            for (int k = 0; k < 12; k++)
                if (strcmp(suffix, names[k]) == 0) slot = slots[k];
        }
        cr_assert_not_null(slot, "parameter %s has no place in the reference", t->name);
        cr_assert_null(*slot, "parameter %s mapped twice", t->name);
        *slot = p;
    }
    return r;
}
