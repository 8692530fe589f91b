/* The checkpoint_fuzz suite (every byte, every length, random damage) and resuming
 * an optimiser from a checkpoint, part of the checkpoint suite (test_checkpoint.c
 * describes it; its scratch folder and file helpers are in test_checkpoint.h). */
#include "test_checkpoint.h"

/* ------------------------------------------------------------------------------------
 * Fuzz: every byte, every length, random damage
 * ---------------------------------------------------------------------------------- */

/* Opens PATH: either it fails with a message naming the file, or it succeeds and then
 * (strict) holds exactly the standard blobs, or (not strict) every blob it lists can
 * be read to its last byte. Returns whether it opened. */
static bool open_or_refuse(const char *p, const blob_set *set, bool strict, const char *what, size_t where) {
    ab_ckpt_reader *r = NULL;
    ab_clear_error();
    int rc = ab_ckpt_open(p, &r);
    if (rc == 0) {
        if (strict) {
            expect_same(r, set);
        } else {
            unsigned sum = 0;
            for (int i = 0; i < ab_ckpt_count(r); i++) {
                const void *d;
                size_t nb;
                cr_assert_eq(ab_ckpt_get(r, ab_ckpt_name(r, i), &d, &nb), 0);
                for (size_t j = 0; j < nb; j++) sum += ((const unsigned char *)d)[j];
            }
            (void)sum;
        }
        ab_ckpt_close(r);
        return true;
    }
    cr_assert_eq(rc, AB_EINVAL, "%s at %zu: code %d", what, where, rc);
    cr_assert_null(r);
    cr_assert(strstr(ab_error(), p), "%s at %zu: message '%s' does not name the file", what, where, ab_error());
    return false;
}

/* Writes n bytes at offset `at` of an open file. */
static void put_at(int fd, size_t at, const void *data, size_t n) {
    cr_assert_eq(pwrite(fd, data, n, (off_t)at), (ssize_t)n, "pwrite: %s", strerror(errno));
}

Test(checkpoint_fuzz, every_byte_every_length_and_random_damage) {
    const char *p = path_in("f.ckpt");
    blob_set set;
    write_standard(p, &set);
    size_t n;
    unsigned char *good = tp_read_bytes(p, &n);
    unsigned char *b = malloc(n + 64);
    size_t before = ab_mem_current(AB_DEV_CPU);
    /* The file is edited in place (one byte, or its length) and restored, which is
     * much cheaper than rewriting it for each of the ~25000 cases. */
    int fd = open(p, O_RDWR);
    cr_assert_geq(fd, 0);

    /* Every single byte changed (to a value that differs): always refused, since every
     * byte is under a CRC or must be zero. */
    ab_rng rng = ab_rng_make(99, 0);
    for (size_t i = 0; i < n; i++) {
        unsigned char x = good[i] ^ (unsigned char)(1 + ab_rng_next_below(&rng, 255));
        put_at(fd, i, &x, 1);
        cr_assert_not(open_or_refuse(p, &set, true, "changed byte", i), "a change at byte %zu went unnoticed", i);
        put_at(fd, i, good + i, 1);
    }
    /* Every length short of the full file: refused as truncated (or empty). */
    for (size_t len = n; len-- > 0;) {
        cr_assert_eq(ftruncate(fd, (off_t)len), 0);
        cr_assert_not(open_or_refuse(p, &set, true, "truncated", len));
        cr_assert(strstr(ab_error(), len ? "truncated" : "empty"), "length %zu: %s", len, ab_error());
    }
    close(fd);
    /* Random damage: 1 to 16 random bytes overwritten, sometimes truncated or extended
     * as well. Opening may not crash; if it succeeds, the data must be intact. */
    for (int it = 0; it < 300; it++) {
        memcpy(b, good, n);
        size_t len = n;
        int k = 1 + (int)ab_rng_next_below(&rng, 16);
        for (int j = 0; j < k; j++) b[ab_rng_next_below(&rng, (uint32_t)n)] = (unsigned char)ab_rng_next_below(&rng, 256);
        uint32_t mode = ab_rng_next_below(&rng, 4);
        if (mode == 1) len = ab_rng_next_below(&rng, (uint32_t)n);
        if (mode == 2) {
            size_t extra = 1 + ab_rng_next_below(&rng, 64);
            for (size_t j = 0; j < extra; j++) b[n + j] = (unsigned char)ab_rng_next_below(&rng, 256);
            len = n + extra;
        }
        tp_write_bytes(p, b, len);
        open_or_refuse(p, &set, true, "random damage", (size_t)it);
    }
    /* Damage with the CRCs recomputed, so the structural checks are reached: header and
     * table bytes set at random. Such a file may be valid (a renamed blob, say); then
     * every blob it lists must be readable. */
    int opened = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(b, good, n);
        int k = 1 + (int)ab_rng_next_below(&rng, 4);
        for (int j = 0; j < k; j++) {
            size_t at = 8 + ab_rng_next_below(&rng, 64 + 64 * 7 - 8); /* header after the magic, used table */
            if (at >= 36 && at < 40) continue;                         /* the header CRC itself */
            b[at] = (unsigned char)ab_rng_next_below(&rng, 256);
        }
        fix_crcs(b, n);
        tp_write_bytes(p, b, n);
        opened += open_or_refuse(p, &set, false, "structural damage", (size_t)it);
    }
    /* Most such damage is refused (sizes, offsets, flags); only name changes pass. */
    cr_assert_lt(opened, 30, "%d of 300 structurally damaged files opened (6 measured)", opened);
    cr_assert_eq(ab_mem_current(AB_DEV_CPU), before, "refused opens leak nothing");
    set_free(&set);
    free(b);
    free(good);
}

/* ------------------------------------------------------------------------------------
 * Resume: an optimiser run continued from a checkpoint equals the uninterrupted run
 * ---------------------------------------------------------------------------------- */

#define RESUME_N 5003
#define RESUME_STEPS 20

static const char *RESUME_CONFIG =
    "{\"kind\": \"radam\", \"lr\": 0.01, \"weight_decay\": 0.05, \"clip_norm\": 30.0,"
    " \"schedule\": {\"milestones\": [9, 15], \"gamma\": 0.3, \"warmup\": 3}}";

/* The gradient of step t: a function of (seed, data position) as a data stream would be. */
static void resume_grad(float *g, uint64_t seed, uint64_t position) {
    tu_fill_normal(g, RESUME_N, seed, 1000 + position, 1.0);
}

static ab_optim *resume_optim(const json_t *cfg_json) {
    ab_optim_config c;
    cr_assert_eq(ab_optim_config_from_json(cfg_json, "optim", &c), 0, "%s", ab_error());
    const ab_optim_range r[3] = {{0, 2000, true}, {2000, 3, false}, {2003, RESUME_N - 2003, true}};
    ab_optim *o;
    cr_assert_eq(ab_optim_create(&c, RESUME_N, r, 3, &o), 0, "%s", ab_error());
    return o;
}

Test(checkpoint, resume_is_bit_identical) {
    json_error_t err;
    json_t *cfg = json_loads(RESUME_CONFIG, 0, &err);
    cr_assert_not_null(cfg);
    const uint64_t seed = 4242;
    float *g = tu_alloc_f(RESUME_N);

    /* Uninterrupted. */
    float *pa = tu_alloc_f(RESUME_N);
    tu_fill_normal(pa, RESUME_N, seed, 0, 1.0);
    ab_optim *a = resume_optim(cfg);
    for (uint64_t t = 1; t <= RESUME_STEPS; t++) {
        resume_grad(g, seed, t);
        cr_assert_eq(ab_optim_step(a, pa, g, NULL), 0);
    }

    /* Stopped after 5 steps (before RAdam's first rectified step, the warm-up done, the
     * milestones ahead), checkpointed, everything thrown away, then resumed. */
    const char *p = path_in("run.ckpt");
    {
        float *pb = tu_alloc_f(RESUME_N);
        tu_fill_normal(pb, RESUME_N, seed, 0, 1.0);
        ab_optim *b = resume_optim(cfg);
        uint64_t t = 0;
        while (t < 5) {
            t++;
            resume_grad(g, seed, t);
            cr_assert_eq(ab_optim_step(b, pb, g, NULL), 0);
        }
        json_t *m = json_pack("{s:I, s:I, s:I, s:I}", "step", (json_int_t)ab_optim_steps(b), "n_params",
                              (json_int_t)RESUME_N, "seed", (json_int_t)seed, "data_position", (json_int_t)t);
        ab_ckpt_writer *w;
        cr_assert_eq(ab_ckpt_begin(p, &w), 0);
        cr_assert_eq(ab_ckpt_add_json(w, "state", m), 0);
        json_decref(m);
        cr_assert_eq(ab_ckpt_add_json(w, AB_CKPT_CONFIG, cfg), 0);
        cr_assert_eq(ab_ckpt_add(w, AB_CKPT_PARAMS, pb, RESUME_N * sizeof(float)), 0);
        cr_assert_eq(ab_ckpt_add_optim(w, AB_CKPT_OPTIM, b), 0);
        cr_assert_eq(ab_ckpt_commit(w), 0, "%s", ab_error());
        ab_optim_destroy(b);
        memset(pb, 0, RESUME_N * sizeof(float));
        free(pb);
    }
    ab_ckpt_reader *r;
    cr_assert_eq(ab_ckpt_open(p, &r), 0, "%s", ab_error());
    json_t *mj;
    cr_assert_eq(ab_ckpt_get_json(r, "state", &mj), 0, "%s", ab_error());
    struct {
        uint64_t step, n_params, seed, data_position;
    } m = {(uint64_t)json_integer_value(json_object_get(mj, "step")),
           (uint64_t)json_integer_value(json_object_get(mj, "n_params")),
           (uint64_t)json_integer_value(json_object_get(mj, "seed")),
           (uint64_t)json_integer_value(json_object_get(mj, "data_position"))};
    json_decref(mj);
    json_t *cfg2;
    cr_assert_eq(ab_ckpt_get_json(r, AB_CKPT_CONFIG, &cfg2), 0, "%s", ab_error());
    ab_optim *b = resume_optim(cfg2);
    json_decref(cfg2);
    float *pb = tu_alloc_f(RESUME_N);
    cr_assert_eq(m.n_params, RESUME_N);
    cr_assert_eq(ab_ckpt_read(r, AB_CKPT_PARAMS, pb, RESUME_N * sizeof(float)), 0, "%s", ab_error());
    cr_assert_eq(ab_ckpt_get_optim(r, AB_CKPT_OPTIM, b), 0, "%s", ab_error());
    ab_ckpt_close(r);
    cr_assert_eq(ab_optim_steps(b), 5);
    cr_assert_eq(m.step, 5u);
    for (uint64_t t = m.data_position + 1; t <= RESUME_STEPS; t++) {
        resume_grad(g, m.seed, t);
        ab_optim_info info;
        cr_assert_eq(ab_optim_step(b, pb, g, &info), 0);
        cr_assert_eq(info.step, (long long)t);
    }
    cr_assert_eq(memcmp(pa, pb, RESUME_N * sizeof(float)), 0, "resumed parameters differ from the uninterrupted run");
    const void *sa, *sb;
    size_t na, nb;
    ab_optim_state(a, &sa, &na);
    ab_optim_state(b, &sb, &nb);
    cr_assert_eq(na, nb);
    cr_assert_eq(memcmp(sa, sb, na), 0, "resumed optimiser state differs");
    ab_optim_destroy(a), ab_optim_destroy(b);
    free(pa), free(pb), free(g);
    json_decref(cfg);
}
