/* A one-line progress bar on stderr, drawn only when stderr is a terminal:
 *   [=========>          ]  1234/5000  25%  8.5 it/s  ETA 7m23s  STATUS
 * Redrawn at most 10 times a second; ab_progress_end moves to the next line. */
#ifndef AB_PROGRESS_H
#define AB_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    bool on;                 /* stderr is a terminal and the caller wants a bar */
    bool drawn;              /* something is on the line */
    long long start, total;  /* units done before this process, units in all */
    uint64_t t0_ns, last_ns;
} ab_progress;

/* enabled: the caller's wish (e.g. not --quiet); the bar is on only if stderr is a tty. */
void ab_progress_begin(ab_progress *p, long long start, long long total, bool enabled);
bool ab_progress_on(const ab_progress *p);
/* done units so far (out of total); status: short text after the bar (may be NULL).
 * force: draw even if the last draw was less than 0.1 s ago. */
void ab_progress_draw(ab_progress *p, long long done, const char *status, bool force);
void ab_progress_end(ab_progress *p);

#endif
