/* experiments/driver/sweep_config.c: `attnbench bench CONFIG.json` as far as the config
 * goes (loaded by ab_config_load, as the command does, then parsed and validated, every
 * variant created once with its options). */
#include "config.h"
#include "error.h"
#include "fuzz_util.h"
#include "sweep.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *root = ab_config_load(fuzz_file("bench.json", data, size));
    if (!root) {
        fuzz_refused(AB_EINVAL, "ab_config_load");
        return 0;
    }
    sweep_config c;
    int rc = sweep_config_parse(root, AB_DEV_CPU, &c);
    if (rc) {
        fuzz_refused(rc, "sweep_config_parse");
    } else {
        if (c.n_variants < 1 || c.n_lengths < 0 || c.heads < 1 || c.qk_dim < 1 || c.v_dim < 1)
            fuzz_fail("sweep_config_parse", "accepted %d variants, %d heads, dims %d/%d", c.n_variants, c.heads,
                      c.qk_dim, c.v_dim);
        sweep_config_free(&c);
    }
    json_decref(root);
    fuzz_no_tracked_memory("sweep_config_parse");
    return 0;
}
