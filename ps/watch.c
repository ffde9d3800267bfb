/* The change log of a store (watch.h): a ring of the last cap events under
 * one mutex. Noting an event costs a lock, a copy of the name into the
 * ring's slot (its buffer is reused, so a steady stream of changes does not
 * allocate) and a broadcast when someone waits. */
#include "watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dg/clock.h"

struct slot {
	uint64_t seq, version;
	double time;
	enum ps_watch_kind kind;
	char *name;                     /* owned; NULL: a gap (the name was not stored) */
	size_t name_cap;
};

struct ps_watch {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int waiting;                    /* readers in a wait */
	uint32_t cap;
	uint64_t last;                  /* seq of the newest event; 0: none yet */
	uint64_t gap;                   /* seq of the newest gap; 0: none */
	struct slot *ring;              /* event seq lives at ring[(seq - 1) % cap] */
};

struct ps_watch *ps_watch_new(uint32_t cap)
{
	struct ps_watch *w = calloc(1, sizeof *w);

	if (!w || cap == 0 || !(w->ring = calloc(cap, sizeof *w->ring))) {
		free(w);
		return NULL;
	}
	w->cap = cap;
	pthread_mutex_init(&w->mu, NULL);
	dg_cond_init_mono(&w->cv);
	return w;
}

void ps_watch_free(struct ps_watch *w)
{
	if (!w)
		return;
	for (uint32_t i = 0; i < w->cap; i++)
		free(w->ring[i].name);
	free(w->ring);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
}

const char *ps_watch_kind_name(enum ps_watch_kind k)
{
	return k == PS_WATCH_APPLY ? "apply" : k == PS_WATCH_DELETE ? "delete" : "put";
}

void ps_watch_note(struct ps_watch *w, const char *name, uint64_t version,
		   enum ps_watch_kind kind)
{
	size_t n = strlen(name) + 1;

	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	uint64_t seq = ++w->last;
	struct slot *sl = &w->ring[(seq - 1) % w->cap];
	if (sl->name_cap < n) {
		char *p = realloc(sl->name, n < 64 ? 64 : n);
		if (p) {
			sl->name = p;
			sl->name_cap = n < 64 ? 64 : n;
		}
	}
	sl->seq = seq;
	sl->version = version;
	sl->time = dg_wall_s();
	sl->kind = kind;
	if (sl->name_cap >= n) {
		memcpy(sl->name, name, n);
	} else {
		w->gap = seq;   /* out of memory: readers must re-read what they keep */
	}
	if (w->waiting)
		pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

uint64_t ps_watch_seq(struct ps_watch *w)
{
	uint64_t s;

	pthread_mutex_lock(&w->mu);
	s = w->last;
	pthread_mutex_unlock(&w->mu);
	return s;
}

/* The oldest position still kept (caller holds mu). */
static uint64_t oldest(const struct ps_watch *w)
{
	return w->last > w->cap ? w->last - w->cap + 1 : 1;
}

int ps_watch_read(struct ps_watch *w, uint64_t after, const char *prefix, int max,
		  int64_t timeout_ms, void (*fn)(void *ud, const struct ps_watch_event *e),
		  void *ud, uint64_t *next, bool *reset)
{
	struct timespec dl = dg_deadline_timespec(dg_deadline_in_ms(timeout_ms > 0 ?
								      timeout_ms : 0));
	size_t plen = prefix ? strlen(prefix) : 0;
	int given = 0;

	*reset = false;
	pthread_mutex_lock(&w->mu);
	for (;;) {
		if (after > w->last || after + 1 < oldest(w) || w->gap > after) {
			*reset = true;
			after = w->last;
			break;
		}
		for (uint64_t s = after + 1; s <= w->last && given < max; s++) {
			const struct slot *sl = &w->ring[(s - 1) % w->cap];
			after = s;
			if (plen && strncmp(sl->name, prefix, plen) != 0)
				continue;
			struct ps_watch_event e = { .seq = s, .version = sl->version,
						    .time = sl->time, .kind = sl->kind,
						    .name = sl->name };
			fn(ud, &e);
			given++;
		}
		if (given > 0)
			break;
		w->waiting++;
		int rc = pthread_cond_timedwait(&w->cv, &w->mu, &dl);
		w->waiting--;
		if (rc == ETIMEDOUT) {
			/* events that came with the timeout are left for the next read */
			break;
		}
	}
	*next = after;
	pthread_mutex_unlock(&w->mu);
	return given;
}
