/* Run documents: one JSON object per run, schema "attnbench/run/1" (keys schema,
 * command, config, seed, machine, git, started, finished, status, records, and what a
 * command adds: summary, step_loss, ...), rewritten atomically after every record so a crash loses at most
 * the record in flight, plus a TSV beside it (same name, .tsv) with chosen columns. */
#ifndef AB_RESULTS_H
#define AB_RESULTS_H

#include <jansson.h>
#include <stdint.h>

typedef struct ab_run ab_run;

/* Starts a run document at PATH (its folder is created). `config` is copied. The TSV
 * gets one column per entry of `tsv_columns` (NULL-terminated dotted paths into each
 * record, e.g. "fwd_bwd_ms.median"), or none when NULL. NULL with a message on error. */
ab_run *ab_run_begin(const char *path, const char *command, const json_t *config, uint64_t seed,
                     const char *const *tsv_columns);
/* Sets a top-level key (steals `value`); written with the next save. */
int ab_run_set(ab_run *r, const char *key, json_t *value);
/* Appends a record (steals it) and rewrites the JSON and TSV. */
int ab_run_add(ab_run *r, json_t *record);
/* Sets status ("ok", "failed", "oom", "timeout", "interrupted"), the finish time,
 * writes, and frees the run. Returns the write's result. */
int ab_run_finish(ab_run *r, const char *status);
/* Frees the run without writing it again (a run that could not be written at all: what
 * is on disk stays as the last save left it). */
void ab_run_discard(ab_run *r);
/* Writes the current state (status stays "running"). */
int ab_run_save(ab_run *r);
/* The records so far (borrowed reference). */
json_t *ab_run_records(ab_run *r);

/* A JSON number, or null for NaN and infinities (the record's status says why). */
json_t *ab_json_num(double x);
/* Current time as ISO 8601 UTC. */
void ab_iso_time(char *buf, size_t cap);

/* This machine: CPU model, cores, threads, BLAS build, core type (blas_core:
 * openblas_get_corename()), OPENBLAS_CORETYPE (openblas_coretype_env), OpenBLAS's
 * thread count and threading model (blas_parallel: 0 sequential, 1 pthreads, 2 OpenMP;
 * blas_parallel_model: its name), the host allocator (allocator, libc, ld_preload,
 * glibc_tunables), OS, compiler, library versions, and the CUDA device (name, compute
 * capability, memory, driver and runtime versions) when the process initialised one,
 * else null (device_allocator likewise). */
json_t *ab_machine_info(void);
/* {"commit": ..., "dirty": bool, "diff_sha1": ...} of the source tree the binary was
 * built from (null when unknown): git's answer in the source folder compiled in, or,
 * when the environment has ATTNBENCH_GIT_COMMIT (a copy of the binary away from its
 * checkout: harness/scripts/gpu-pack.sh records the commit), that, with dirty from
 * ATTNBENCH_GIT_DIRTY ("0": false, other text: true, unset: null) and diff_sha1 from
 * ATTNBENCH_GIT_DIFF_SHA1. diff_sha1: where the tracked files differ from the commit,
 * git's object name of that difference (`git diff HEAD --binary | git hash-object
 * --stdin`: the same changes give the same name), else null. */
json_t *ab_git_info(void);
/* The same for the git checkout at dir (ab_git_info's own answer, and the tests'). */
json_t *ab_git_info_at(const char *dir);

#endif
