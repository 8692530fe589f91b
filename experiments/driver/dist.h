/* Data-parallel training's communication: R processes (ranks) of one run, each with
 * the whole model, each computing the gradient of its slice of every step's batch
 * (trainer.h, "Micro-batches"). The sums they need are made in a fixed order, so that
 * a run's bits depend on the slices, never on timing or the engine:
 *
 *   ab_dist_sum_floats   x = x_0 + x_1 + ... + x_{R-1}, added left to right in rank
 *                        order, on every rank. The vector is cut into R chunks; rank c
 *                        receives chunk c of every rank (all-to-all), adds them in rank
 *                        order, and the sums are gathered back (all-gather): each rank
 *                        sends and receives 2 (R-1)/R of the vector, as a ring
 *                        all-reduce, but every element is the same sum, in the same
 *                        order, as one process adding the R vectors one after another.
 *   ab_dist_allgather    every rank's bytes, in rank order, on every rank.
 *
 * Engines: "none" (one process, R = 1; every call a copy), "mpi" (MPI, when the build
 * found it: MPI_Alltoall and MPI_Allgather, on host memory), "nccl" (NCCL's send,
 * receive and all-gather on device memory, libnccl.so.2 loaded at run time, MPI for
 * the start-up; dist_nccl.c). A rank that dies ends the job: MPI's runtime stops the
 * others, and a rank that finds an error calls ab_dist_abort.
 *
 * The time each rank spends inside these calls (waiting for the others included) is
 * counted: ab_dist_comm_seconds. */
#ifndef AB_DIST_H
#define AB_DIST_H

#include "device_type.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum { AB_DIST_NONE = 0, AB_DIST_MPI = 1, AB_DIST_NCCL = 2 } ab_dist_kind;

typedef struct ab_dist ab_dist;

/* "none", "mpi", "nccl"; NULL for another value */
const char *ab_dist_kind_name(ab_dist_kind k);
/* 0, or AB_EINVAL naming the accepted values */
int ab_dist_kind_parse(const char *s, ab_dist_kind *k);
/* Whether this build can run the engine ("none" always; "mpi" when built with MPI;
 * "nccl" when built with MPI and CUDA: libnccl itself is looked for by ab_dist_open).
 * why (may be NULL) receives the reason when not. */
bool ab_dist_built(ab_dist_kind k, const char **why);

/* Starts the engine (MPI_Init for mpi and nccl; for nccl also the communicator over
 * the ranks, each on the CUDA device of its local rank when `device` is cuda).
 * 0, or an error naming what failed (AB_EUNSUPPORTED: not built; AB_EIO: the engine
 * or library failed). */
int ab_dist_open(ab_dist_kind kind, ab_device device, ab_dist **out);
/* Ends the engine (MPI_Finalize); NULL is fine. */
void ab_dist_close(ab_dist *d);

ab_dist_kind ab_dist_kind_of(const ab_dist *d);
int ab_dist_rank(const ab_dist *d); /* 0 for NULL */
int ab_dist_size(const ab_dist *d); /* 1 for NULL */
/* Seconds spent inside the collectives so far (0 for NULL). */
double ab_dist_comm_seconds(const ab_dist *d);
/* Bytes this rank sent so far (0 for NULL). */
double ab_dist_comm_bytes(const ab_dist *d);

/* The rank-order sum above, in place, on n floats in memory of `mem` (the host for the
 * none and mpi engines, or copied through it; the device for nccl). */
int ab_dist_sum_floats(ab_dist *d, ab_device mem, float *x, size_t n);
/* all (size x bytes, host) = every rank's `mine` (bytes, host) in rank order. */
int ab_dist_allgather(ab_dist *d, const void *mine, size_t bytes, void *all);
/* Every rank agrees: a barrier. */
int ab_dist_barrier(ab_dist *d);
/* Ends every rank of the job with `status` (MPI_Abort); returns only for NULL or the
 * none engine. */
void ab_dist_abort(ab_dist *d, int status);

/* The combine step of ab_dist_sum_floats, shared by every engine and by a single
 * process accumulating micro-batches (trainer.c), so that the float additions are the
 * same ones: acc[i] = acc[i] + x[i] (host memory). */
void ab_dist_add_floats(float *acc, const float *x, size_t n);

#endif
