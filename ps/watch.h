/* The change log of a store: every change of a variable (a put or patch,
 * an apply, a delete) as an event with a position (seq), kept in a bounded
 * ring, so that watchers (GET /v1/vars?watch=1: the mount, dg var watch)
 * learn of changes without asking about each variable, and resume from the
 * position they last saw. Positions count from 1 in each run of the server
 * (its epoch): events are ordered by when their change became visible,
 * which is not always the order of their versions (two variables' changes
 * take versions and become visible under their own locks). */
#ifndef DG_PS_WATCH_H
#define DG_PS_WATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "dg/status.h"

enum ps_watch_kind { PS_WATCH_PUT, PS_WATCH_APPLY, PS_WATCH_DELETE };

struct ps_watch_event {
	uint64_t seq;                   /* position in the log, from 1 */
	uint64_t version;               /* the variable's new version (of the delete) */
	double time;                    /* seconds since the Unix epoch */
	enum ps_watch_kind kind;
	const char *name;               /* valid during the callback only */
};

struct ps_watch;

/* A log keeping the last cap events (cap >= 1). NULL when out of memory. */
struct ps_watch *ps_watch_new(uint32_t cap);
void ps_watch_free(struct ps_watch *w);           /* NULL is fine */

/* Record a change and wake the readers. Never fails: a name that cannot be
 * stored (out of memory) is recorded as a gap, which readers see as reset. */
void ps_watch_note(struct ps_watch *w, const char *name, uint64_t version,
		   enum ps_watch_kind kind);

/* The position of the last event (0 before the first). */
uint64_t ps_watch_seq(struct ps_watch *w);

/* The events after position `after` whose name starts with prefix (NULL or
 * "": all), at most max of them, each given to fn (under the log's lock: fn
 * must not call back into the log). Waits up to timeout_ms for the first
 * one. *next gets the position to resume from. *reset is set, and no event
 * given, when the events after `after` are no longer all kept (the reader
 * fell behind by more than the log holds) or `after` is beyond the last
 * position (a position of an earlier run): the reader must re-read what it
 * keeps, then resume from *next. Returns the number of events given;
 * 0 after the timeout. */
int ps_watch_read(struct ps_watch *w, uint64_t after, const char *prefix, int max,
		  int64_t timeout_ms, void (*fn)(void *ud, const struct ps_watch_event *e),
		  void *ud, uint64_t *next, bool *reset);

const char *ps_watch_kind_name(enum ps_watch_kind k);   /* "put", "apply", "delete" */

#endif
