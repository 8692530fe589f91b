/* The options several commands share, parsed in one place: --help (-h), --device,
 * --seed, --out, --set KEY=VALUE (repeated), --quiet, and the command's positional
 * argument (a config or a checkpoint). A command names the ones it takes and handles
 * its own options in a callback; everything else is refused with one line. */
#ifndef AB_CLI_ARGS_H
#define AB_CLI_ARGS_H

#include "device_type.h"

#include <stdbool.h>
#include <stdint.h>

enum {
    CLI_DEVICE = 1 << 0, /* --device cpu|cuda (cuda checked at the end of parsing) */
    CLI_SEED = 1 << 1,   /* --seed S (an unsigned 64-bit integer) */
    CLI_OUT = 1 << 2,    /* --out PATH (not empty) */
    CLI_SET = 1 << 3,    /* --set KEY=VALUE, up to CLI_MAX_SETS times, in order */
    CLI_QUIET = 1 << 4,  /* --quiet */
};
#define CLI_MAX_SETS 64

typedef struct {
    /* given by the command */
    const char *cmd;        /* its name, for messages ("train") */
    const char *usage;      /* its --help text */
    unsigned takes;         /* CLI_* */
    const char *positional; /* what its one positional argument is ("config",
                             * "checkpoint", "data directory"), NULL: none */
    /* parsed */
    ab_device device;       /* CPU unless --device cuda */
    uint64_t seed;
    bool have_seed;
    const char *out;        /* NULL unless --out */
    const char *sets[CLI_MAX_SETS];
    int n_sets;
    bool quiet;
    const char *arg;        /* the positional argument, NULL if none was given */
} cli_args;

/* A command's own options: argv[*i] is an option the common ones are not; returns true
 * when it is one of the command's (its value consumed with cli_value, *i advanced),
 * false for an unknown argument. */
typedef bool (*cli_own_fn)(int argc, char **argv, int *i, void *ctx);

/* Parses argv into a (a->cmd, usage, takes, positional set beforehand; the rest is
 * reset here). --help prints the usage and exits 0. Dies with one line (exit 2) on an
 * unknown argument, a second positional argument, a bad value, too many --set, or
 * --device cuda on a build or machine without a usable device. */
void cli_parse(int argc, char **argv, cli_args *a, cli_own_fn own, void *ctx);

#endif
