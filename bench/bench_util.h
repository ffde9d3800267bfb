/* Helpers shared by the benchmarks in bench/: a monotonic clock, the median of
 * a run of timings, the stop of a child process (a server the bench started)
 * and the dump of its log. Linked into every bench executable
 * (bench/meson.build). */
#ifndef DG_BENCH_UTIL_H
#define DG_BENCH_UTIL_H

#include <sys/types.h>

/* Seconds on CLOCK_MONOTONIC. Thread-safe. */
double bench_now_s(void);

/* qsort comparator of doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);

/* Median of v[0..n): sorts a copy, v is left as it is. -1 when n <= 0 or the
 * copy cannot be allocated. Thread-safe. */
double bench_median(const double *v, int n);

/* SIGTERM to pid, then up to grace_ms for it to exit (reaped), then SIGKILL
 * and a blocking reap. Does nothing for pid <= 0. Only for our own children. */
void bench_stop_child(pid_t pid, int grace_ms);

/* Copy the text file at path (a child's log, after a failure) to stderr, each
 * line prefixed with "  | ". Nothing when it cannot be opened. */
void bench_dump_file(const char *path);

#endif
