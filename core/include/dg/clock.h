/* Clocks and deadlines for every module: one definition instead of a private
 * helper per file. Monotonic time (CLOCK_MONOTONIC) measures intervals,
 * timeouts and uptime and never jumps when the system clock is set; wall time
 * (CLOCK_REALTIME) is for timestamps that people read or that are stored (a
 * variable's mtime, a log line, a checkpoint's date). Header-only: each call
 * is one clock_gettime, so hot paths (a request's latency, a step's timing)
 * pay nothing extra. All functions are thread-safe. */
#ifndef DG_CLOCK_H
#define DG_CLOCK_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* ---- now ---- */

static inline int64_t dg_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t dg_mono_us(void) { return dg_mono_ns() / 1000; }
static inline int64_t dg_mono_ms(void) { return dg_mono_ns() / 1000000; }
static inline double dg_mono_s(void) { return (double)dg_mono_ns() * 1e-9; }

/* Milliseconds since the Unix epoch (UTC). */
static inline int64_t dg_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Seconds since the Unix epoch, with the fraction (an mtime, a Dg-Mtime header). */
static inline double dg_wall_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ms milliseconds since the Unix epoch as ISO 8601 UTC with milliseconds,
 * "2026-12-05T07:10:39.123Z" (24 characters; buf holds at least 25). What
 * log lines and watch events print. */
static inline void dg_iso8601_ms(int64_t ms, char *buf, size_t n)
{
	time_t sec = (time_t)(ms / 1000);
	struct tm tm;
	size_t k = 0;

	if (n == 0)
		return;
	if (gmtime_r(&sec, &tm))
		k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
	if (k)
		snprintf(buf + k, n - k, ".%03dZ", (int)(ms % 1000));
	else
		buf[0] = '\0';         /* strftime's buffer is unspecified when it fails */
}

/* ---- deadlines ---- */

/* A point on the monotonic clock. A plain value: copy it, pass it by value. */
struct dg_deadline {
	int64_t ns;                     /* CLOCK_MONOTONIC; INT64_MAX: never */
};

#define DG_DEADLINE_NEVER ((struct dg_deadline){ INT64_MAX })

/* The deadline timeout_ms from now; a negative timeout_ms never expires. */
static inline struct dg_deadline dg_deadline_in_ms(int64_t timeout_ms)
{
	int64_t now = dg_mono_ns();

	if (timeout_ms < 0 || timeout_ms > (INT64_MAX - now) / 1000000)
		return DG_DEADLINE_NEVER;
	return (struct dg_deadline){ now + timeout_ms * 1000000 };
}

static inline bool dg_deadline_is_never(struct dg_deadline d) { return d.ns == INT64_MAX; }

/* Milliseconds left, rounded up (so it is 0 exactly when the deadline has
 * passed, and a wait for the result never spins on 0 before that); INT64_MAX
 * for a deadline that never expires. */
static inline int64_t dg_deadline_left_ms(struct dg_deadline d)
{
	int64_t left;

	if (dg_deadline_is_never(d))
		return INT64_MAX;
	left = d.ns - dg_mono_ns();
	return left <= 0 ? 0 : (left + 999999) / 1000000;
}

static inline bool dg_deadline_expired(struct dg_deadline d)
{
	return !dg_deadline_is_never(d) && dg_mono_ns() >= d.ns;
}

/* The deadline as the absolute time pthread_cond_timedwait takes. Valid only
 * for a condition variable made with dg_cond_init_mono (a default one waits
 * on the wall clock). */
static inline struct timespec dg_deadline_timespec(struct dg_deadline d)
{
	return (struct timespec){ .tv_sec = (time_t)(d.ns / 1000000000),
				  .tv_nsec = (long)(d.ns % 1000000000) };
}

/* pthread_cond_init for a condition variable whose timed waits take monotonic
 * deadlines (dg_deadline_timespec). Returns pthread_cond_init's result. */
static inline int dg_cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t ca;
	int rc;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	rc = pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
	return rc;
}

/* Sleep ms milliseconds (the whole time, also when a signal interrupts it). */
static inline void dg_sleep_ms(int64_t ms)
{
	struct timespec ts = { .tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000 };

	if (ms <= 0)
		return;
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

#endif
