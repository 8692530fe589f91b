/* experiments/driver/train_config.c: `attnbench train CONFIG.json` as far as the config
 * goes (ab_config_load, then train_config_parse: the task, the model, the attention
 * variant and its options, the optimiser). An accepted config's canonical form parses
 * again, to itself. Runs in its own folder (fuzz.sh), so a dataset task's relative data
 * path finds nothing. */
#include "config.h"
#include "error.h"
#include "fuzz_util.h"
#include "task_list.h"
#include "train_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    task_list_install();
    json_t *root = ab_config_load(fuzz_file("train.json", data, size));
    if (!root) {
        fuzz_refused(AB_EINVAL, "ab_config_load");
        return 0;
    }
    train_config c;
    int rc = train_config_parse(root, &c);
    json_decref(root);
    if (rc) {
        fuzz_refused(rc, "train_config_parse");
    } else {
        train_config again;
        rc = train_config_parse(c.canon, &again);
        if (rc) fuzz_fail("train_config_parse", "its canonical form is refused: %s", ab_error());
        char key[512];
        if (train_config_diff(c.canon, again.canon, key, sizeof key))
            fuzz_fail("train_config_parse", "the canonical form parses to another config ('%s' differs)", key);
        if (!json_equal(c.canon, again.canon))
            fuzz_fail("train_config_parse", "the canonical form parses to another config (a resumable key)");
        train_config_free(&again);
        train_config_free(&c);
    }
    fuzz_no_tracked_memory("train_config_parse");
    return 0;
}
