/* The engines' shared state (dist.c, dist_nccl.c); not for other callers. */
#ifndef AB_DIST_INTERNAL_H
#define AB_DIST_INTERNAL_H

#include "dist.h"

#include <stdbool.h>
#include <stddef.h>

struct ab_dist {
    ab_dist_kind kind;
    int rank, size;
    ab_device device;
    bool mpi_owned;      /* MPI_Init was ours: MPI_Finalize at close */
    double comm_s, comm_bytes;
    float *stage;        /* host buffers of the sums (grown) */
    size_t stage_cap;
    void *nccl;          /* dist_nccl.c's state */
};

/* Host staging of at least `floats` floats (kept); NULL with AB_ENOMEM. */
float *dist_stage(ab_dist *d, size_t floats);
/* MPI_Init (when not yet), rank and size. */
int dist_mpi_start(ab_dist *d);

/* dist_nccl.c */
bool dist_nccl_built(void);
int dist_nccl_start(ab_dist *d);
void dist_nccl_stop(ab_dist *d);
int dist_nccl_sum(ab_dist *d, ab_device mem, float *x, size_t n);

#endif
