#include "progress.h"

#include "timer.h"

#include <stdio.h>
#include <unistd.h>

void ab_progress_begin(ab_progress *p, long long start, long long total, bool enabled) {
    p->on = enabled && isatty(fileno(stderr));
    p->drawn = false;
    p->start = start;
    p->total = total;
    p->t0_ns = ab_now_ns();
    p->last_ns = 0;
}

bool ab_progress_on(const ab_progress *p) { return p->on; }

static void fmt_time(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 1e8) snprintf(buf, cap, "?");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
}

void ab_progress_draw(ab_progress *p, long long done, const char *status, bool force) {
    if (!p->on) return;
    uint64_t now = ab_now_ns();
    if (!force && p->drawn && now - p->last_ns < 100000000ULL) return;
    p->last_ns = now;
    const int width = 24;
    double frac = p->total > 0 ? (double)done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    int fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[width] = '\0';
    double el = (double)(now - p->t0_ns) * 1e-9;
    double rate = el > 0 ? (double)(done - p->start) / el : 0;
    char eta[32];
    fmt_time(eta, sizeof eta, rate > 0 ? (double)(p->total - done) / rate : -1);
    fprintf(stderr, "\r[%s] %lld/%lld %3d%% %6.2f it/s ETA %s %s\033[K", bar, done, p->total, (int)(frac * 100),
            rate, eta, status ? status : "");
    fflush(stderr);
    p->drawn = true;
}

void ab_progress_end(ab_progress *p) {
    if (p->on && p->drawn) fputc('\n', stderr);
    p->drawn = false;
}
