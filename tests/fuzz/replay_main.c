/* A main for a fuzz target without libFuzzer: runs LLVMFuzzerTestOneInput once on each
 * file named, and on each file of each folder named (in name order), as libFuzzer would
 * with a single input. meson test runs every target this way over its seeds
 * (corpus/TARGET/) and the inputs that once crashed it (crashes/TARGET/), in every
 * build: the found bugs stay fixed without clang. A failed check aborts (fuzz_util.h).
 * Prints "replay: N inputs". */
#include "fuzz_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) {
        perror(path);
        exit(1);
    }
    /* exactly the file's size, so that AddressSanitizer sees a read past the end */
    size_t n = (size_t)st.st_size;
    unsigned char *input = malloc(n ? n : 1);
    if (!input || fread(input, 1, n, f) != n) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(input, n);
    free(input);
}

int main(int argc, char **argv) {
    int count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) continue; /* a target without crashes/TARGET/ */
        if (!S_ISDIR(st.st_mode)) {
            run_file(argv[i]);
            count++;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, NULL, alphasort); /* name order (the C locale's) */
        if (n < 0) {
            perror(argv[i]);
            return 1;
        }
        for (int j = 0; j < n; j++) {
            if (names[j]->d_name[0] != '.') {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", argv[i], names[j]->d_name);
                run_file(path);
                count++;
            }
            free(names[j]);
        }
        free(names);
    }
    printf("replay: %d inputs\n", count);
    return 0;
}
