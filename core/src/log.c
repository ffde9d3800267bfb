/* The logging sink: one function pointer behind a mutex. Default: stderr,
 * "dg: component: message", optionally timestamped for daemons. */
#include "dg/log.h"
#include "dg/clock.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dg_log_sink_fn sink_fn;
static void *sink_ud;
static int level = -1;          /* -1: not yet read from DG_LOG */
static int timestamps;

static const char *const names[] = { "debug", "info", "warn", "error" };

int dg_log_level_parse(const char *s)
{
	for (int i = 0; s && i < 4; i++)
		if (strcasecmp(s, names[i]) == 0)
			return i;
	if (s && strcasecmp(s, "warning") == 0)
		return DG_LOG_WARN;
	return -1;
}

/* Caller holds lock. */
static int current_level(void)
{
	if (level < 0) {
		int l = dg_log_level_parse(getenv("DG_LOG"));
		level = l < 0 ? DG_LOG_WARN : l;
	}
	return level;
}

void dg_log_set_sink(dg_log_sink_fn fn, void *ud)
{
	pthread_mutex_lock(&lock);
	sink_fn = fn;
	sink_ud = ud;
	pthread_mutex_unlock(&lock);
}

void dg_log_set_level(enum dg_log_level l)
{
	pthread_mutex_lock(&lock);
	level = (int)l;
	pthread_mutex_unlock(&lock);
}

enum dg_log_level dg_log_get_level(void)
{
	pthread_mutex_lock(&lock);
	int l = current_level();
	pthread_mutex_unlock(&lock);
	return (enum dg_log_level)l;
}

void dg_log_set_timestamps(int on)
{
	pthread_mutex_lock(&lock);
	timestamps = on;
	pthread_mutex_unlock(&lock);
}

static void default_sink(enum dg_log_level l, const char *component, const char *line)
{
	char ts[40] = "";

	if (timestamps) {
		dg_iso8601_ms(dg_wall_ms(), ts, sizeof ts - 1);
		strcat(ts, " ");
	}
	/* "dg: warn: blas: text" for warnings and errors, "dg: blas: text" below. */
	fprintf(stderr, "%sdg: %s%s%s\n", ts, l >= DG_LOG_WARN ? names[l] : "",
		l >= DG_LOG_WARN ? ": " : "", line);
	(void)component;
}

void dg_log(enum dg_log_level l, const char *component, const char *fmt, ...)
{
	char line[1024];
	char full[1100];
	va_list ap;

	pthread_mutex_lock(&lock);
	if ((int)l < current_level()) {
		pthread_mutex_unlock(&lock);
		return;
	}
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (sink_fn) {
		sink_fn(l, component, line, sink_ud);
	} else {
		snprintf(full, sizeof full, "%s: %s", component ? component : "dg", line);
		default_sink(l, component, full);
	}
	pthread_mutex_unlock(&lock);
}
