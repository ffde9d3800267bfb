/* Logging with levels through one sink. Library code never writes to stdout:
 * stdout belongs to the `dg` command's results. The default sink writes to
 * stderr; daemons add timestamps, tests install a capture sink. */
#ifndef DG_LOG_H
#define DG_LOG_H

enum dg_log_level { DG_LOG_DEBUG = 0, DG_LOG_INFO = 1, DG_LOG_WARN = 2, DG_LOG_ERROR = 3 };

/* A sink receives one complete line (no trailing newline). ud is the pointer
 * given to dg_log_set_sink. Sinks may be called from any thread, one call at
 * a time (dg_log serialises them). */
typedef void (*dg_log_sink_fn)(enum dg_log_level level, const char *component,
			       const char *line, void *ud);

/* Replace the sink (NULL restores the default stderr sink). */
void dg_log_set_sink(dg_log_sink_fn fn, void *ud);

/* Lines below level are dropped. The initial level comes from the DG_LOG
 * environment variable (debug|info|warn|error), default warn. */
void dg_log_set_level(enum dg_log_level level);
enum dg_log_level dg_log_get_level(void);

/* Prefix every line of the default sink with an ISO-8601 UTC timestamp (daemons). */
void dg_log_set_timestamps(int on);

/* Parse "debug", "info", "warn", "error"; returns -1 for anything else. */
int dg_log_level_parse(const char *s);

/* Log one line: "component: message". Thread-safe. */
void dg_log(enum dg_log_level level, const char *component, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
