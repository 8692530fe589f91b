/* attnbench list: every variant, its options and their defaults. */
#include "attention.h"
#include "cli_util.h"
#include "commands.h"

#include <stdio.h>
#include <string.h>

int cmd_list(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            puts("usage: attnbench list\nPrints every attention variant with its options, defaults, modes and the devices\n"
                 "this build runs it on.");
            return 0;
        }
        cli_die(AB_EXIT_USAGE, "list takes no argument '%s'", argv[i]);
    }
    for (int i = 0; i < attn_variant_count(); i++) {
        printf("%s\n    %s\n    modes: parallel (forward, backward)%s\n    devices: cpu%s\n", attn_variant_name(i),
               attn_variant_summary(i), attn_variant_has_step(i) ? ", recurrent (step, prefill)" : "",
               attn_variant_has_device(i, ATTN_DEVICE_CUDA) ? ", cuda" : "");
        const char *name, *def, *help;
        for (int j = 0; attn_variant_option(i, j, &name, &def, &help); j++)
            printf("    --set %s=VALUE   default %s: %s\n", name, def, help);
        if (i + 1 < attn_variant_count()) putchar('\n');
    }
    return 0;
}
