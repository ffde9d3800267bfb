/* Variables you can watch (doc/filesystem.md, "Watching"): the mount's
 * watchers, one thread per ps task running the task's change stream (GET
 * /v1/vars?watch=1 through dg_var_watch), started by the first open of
 * `events` or the first poll(2) of a variable's file, and what they feed:
 *  - `events`, a log file of one line per change ("TIME TASK NAME VERSION
 *    EVENT", as dg var watch prints), which grows as changes come (its
 *    attributes are invalidated at each batch, so tail -f sees the growth);
 *    the last EVENTS_CAP bytes are kept;
 *  - poll(2) on an open vars/, text/ or npy/ file, readable once a version
 *    newer than the one the file was opened at exists (FUSE poll: the
 *    kernel asks again after a notify), and on `events`, readable when it
 *    grew past what that open file read.
 * A stream that restarts (the ps restarted, or the watcher fell behind)
 * wakes every poll of that task: its file is compared with a HEAD. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define FUSE_USE_VERSION 31
#include <fuse.h>

#include "dg/clock.h"
#include "dg/log.h"
#include "fs.h"
#include "ops.h"

#define EVENTS_CAP ((size_t)4 << 20)   /* bytes of events kept */
#define SLICE_MS 2000                   /* one poll of a stream: how soon unmount stops it */
#define RETRY_MS 500                    /* between tries of a task that cannot be reached */

/* One poll(2) waiting (or woken): a variable's open file, or `events`'s. */
struct waiter {
	struct waiter *next;
	const struct dgfs_handle *key;
	bool events;                    /* `events`: woken by any line */
	int task;                       /* the variable's task; -1 for events */
	char *name;                     /* the variable (owned); NULL for events */
	uint64_t version;               /* the version the file was opened at */
	bool woken;                     /* a newer version came (or the stream restarted) */
	struct fuse_pollhandle *ph;     /* owned until notified; NULL when none waits */
};

struct stream {
	struct dgfs_watch *w;
	int task;
	struct dg_watch_pos pos;        /* where it starts: positioned by dgfs_watch_start */
	pthread_t th;
	bool started;
};

struct dgfs_watch {
	struct dgfs *fs;
	pthread_mutex_t mu;             /* guards everything below */
	pthread_cond_t cv;              /* the start finished */
	bool starting, running;
	atomic_bool stop;
	struct stream *streams;         /* n_tasks */
	char *log;                      /* EVENTS_CAP bytes, a ring */
	uint64_t end;                   /* bytes ever appended: the file's size */
	struct waiter *waiters;
};

struct dgfs_watch *dgfs_watch_new(struct dgfs *fs)
{
	struct dgfs_watch *w = calloc(1, sizeof *w);

	if (!w)
		return NULL;
	w->fs = fs;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	return w;
}

static void waiter_free(struct waiter *x)
{
	if (x->ph)
		fuse_pollhandle_destroy(x->ph);
	free(x->name);
	free(x);
}

void dgfs_watch_stop(struct dgfs_watch *w)
{
	if (!w)
		return;
	atomic_store(&w->stop, true);
	for (int i = 0; w->streams && i < w->fs->n_tasks; i++)
		if (w->streams[i].started) {
			pthread_join(w->streams[i].th, NULL);
			w->streams[i].started = false;
		}
}

void dgfs_watch_free(struct dgfs_watch *w)
{
	if (!w)
		return;
	dgfs_watch_stop(w);
	while (w->waiters) {
		struct waiter *x = w->waiters;
		w->waiters = x->next;
		waiter_free(x);
	}
	free(w->streams);
	free(w->log);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
}

/* Wake x (caller holds mu). */
static void wake(struct waiter *x)
{
	x->woken = true;
	if (x->ph) {
		fuse_notify_poll(x->ph);
		fuse_pollhandle_destroy(x->ph);
		x->ph = NULL;
	}
}

/* Append n bytes to the ring (caller holds mu). */
static void log_append(struct dgfs_watch *w, const char *p, size_t n)
{
	if (n > EVENTS_CAP) {
		p += n - EVENTS_CAP;
		w->end += n - EVENTS_CAP;
		n = EVENTS_CAP;
	}
	size_t at = (size_t)(w->end % EVENTS_CAP), first = EVENTS_CAP - at < n ? EVENTS_CAP - at : n;
	memcpy(w->log + at, p, first);
	memcpy(w->log, p + first, n - first);
	w->end += n;
}

static void take_events(struct dgfs_watch *w, int task, const json_t *evs, bool reset)
{
	const json_t *ev;
	size_t i;
	char line[DG_VAR_NAME_MAX + 128];
	bool any = false;

	pthread_mutex_lock(&w->mu);
	json_array_foreach(evs, i, ev) {
		const char *name = json_string_value(json_object_get(ev, "name"));
		uint64_t v = (uint64_t)json_integer_value(json_object_get(ev, "version"));
		int n = dg_watch_event_line(ev, w->fs->tasks[task].label, line, sizeof line);
		if (!name || n <= 0)
			continue;
		log_append(w, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
		any = true;
		for (struct waiter *x = w->waiters; x; x = x->next)
			if (!x->events && x->task == task && v > x->version &&
			    strcmp(x->name, name) == 0)
				wake(x);
	}
	for (struct waiter *x = w->waiters; x; x = x->next)
		if ((x->events && any) || (reset && !x->events && x->task == task))
			wake(x);
	pthread_mutex_unlock(&w->mu);
	/* tail -f follows the size: the kernel must ask for it again */
	if (any && w->fs->fuse)
		fuse_invalidate_path(w->fs->fuse, "/events");
}

static void *stream_main(void *arg)
{
	struct stream *s = arg;
	struct dgfs_watch *w = s->w;
	struct dgfs_task *t = &w->fs->tasks[s->task];
	struct dg_watch_pos pos = s->pos;
	struct dg_client *c = NULL;
	bool down = false;

	while (!atomic_load(&w->stop)) {
		struct dg_err err = { 0 };
		json_t *evs = NULL;
		bool reset = false;
		enum dg_status st;

		if (!c && !(c = dg_client_new(t->address, w->fs->cfg.token, &err))) {
			dg_sleep_ms(RETRY_MS);
			continue;
		}
		/* a stopped ps must not hold up an unmount for long */
		dg_client_set_timeout(c, SLICE_MS + w->fs->timeout_ms);
		st = dg_var_watch(c, NULL, &pos, SLICE_MS, &evs, &reset, &err);
		if (st != DG_OK) {
			if (!down)
				dg_log(DG_LOG_WARN, "fs", "watching %s: %s; retrying", t->label,
				       err.msg);
			down = true;
			dg_client_free(c);
			c = NULL;
			dg_sleep_ms(RETRY_MS);
			continue;
		}
		if (down)
			dg_log(DG_LOG_INFO, "fs", "watching %s again", t->label);
		down = false;
		take_events(w, s->task, evs, reset);
		json_decref(evs);
	}
	dg_client_free(c);
	return NULL;
}

enum dg_status dgfs_watch_start(struct dgfs_watch *w, struct dg_err *err)
{
	enum dg_status st = DG_OK;
	struct stream *ss;
	char *log;

	pthread_mutex_lock(&w->mu);
	while (w->starting)
		pthread_cond_wait(&w->cv, &w->mu);
	if (w->running) {
		pthread_mutex_unlock(&w->mu);
		return DG_OK;
	}
	w->starting = true;
	pthread_mutex_unlock(&w->mu);
	log = malloc(EVENTS_CAP);
	ss = calloc((size_t)w->fs->n_tasks, sizeof *ss);
	if (!log || !ss) {
		free(log);
		free(ss);
		st = dg_err_set(err, DG_ENOMEM, "out of memory watching");
		goto out;
	}
	/* Position every stream now: what changes after this call is seen (a
	 * task that does not answer starts from its first answer). */
	for (int i = 0; i < w->fs->n_tasks; i++) {
		struct dg_client *c = dg_client_new(w->fs->tasks[i].address, w->fs->cfg.token, NULL);
		json_t *evs = NULL;
		bool reset;
		ss[i] = (struct stream){ .w = w, .task = i };
		if (c && dg_var_watch(c, NULL, &ss[i].pos, 0, &evs, &reset, NULL) != DG_OK)
			ss[i].pos = (struct dg_watch_pos){ 0 };
		json_decref(evs);
		dg_client_free(c);
	}
	pthread_mutex_lock(&w->mu);
	w->log = log;
	w->streams = ss;
	pthread_mutex_unlock(&w->mu);
	for (int i = 0; i < w->fs->n_tasks; i++) {
		ss[i].started = pthread_create(&ss[i].th, NULL, stream_main, &ss[i]) == 0;
		if (!ss[i].started && st == DG_OK)
			st = dg_err_set(err, DG_ENOMEM, "cannot start a watch thread");
	}
out:
	pthread_mutex_lock(&w->mu);
	w->starting = false;
	w->running = w->streams != NULL;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return st;
}

uint64_t dgfs_events_size(struct dgfs_watch *w)
{
	uint64_t n;

	pthread_mutex_lock(&w->mu);
	n = w->end;
	pthread_mutex_unlock(&w->mu);
	return n;
}

size_t dgfs_events_read(struct dgfs_watch *w, char *out, size_t size, uint64_t off)
{
	size_t n = 0;

	pthread_mutex_lock(&w->mu);
	uint64_t first = w->end > EVENTS_CAP ? w->end - EVENTS_CAP : 0;
	if (off < first)
		off = first;    /* fell behind by more than is kept: from the oldest kept */
	if (w->log && off < w->end) {
		n = w->end - off < size ? (size_t)(w->end - off) : size;
		size_t at = (size_t)(off % EVENTS_CAP);
		size_t a = EVENTS_CAP - at < n ? EVENTS_CAP - at : n;
		memcpy(out, w->log + at, a);
		memcpy(out + a, w->log, n - a);
	}
	pthread_mutex_unlock(&w->mu);
	return n;
}

/* The waiter of key, made when missing (caller holds mu). NULL: no memory. */
static struct waiter *waiter_of(struct dgfs_watch *w, const struct dgfs_handle *key)
{
	struct waiter *x;

	for (x = w->waiters; x; x = x->next)
		if (x->key == key)
			return x;
	if (!(x = calloc(1, sizeof *x)))
		return NULL;
	x->key = key;
	x->task = -1;
	x->next = w->waiters;
	w->waiters = x;
	return x;
}

/* Answer a poll of x (caller holds mu): readable, or keep ph for x
 * (replacing an older one) to be notified. */
static void answer(struct waiter *x, bool ready, struct fuse_pollhandle *ph, unsigned *revents)
{
	*revents = ready ? POLLIN | POLLRDNORM : 0;
	if (!ph)
		return;
	if (ready) {
		fuse_pollhandle_destroy(ph);
		return;
	}
	if (x->ph)
		fuse_pollhandle_destroy(x->ph);
	x->ph = ph;
}

int dgfs_watch_poll_events(struct dgfs_watch *w, const struct dgfs_handle *key, uint64_t read_to,
			   struct fuse_pollhandle *ph, unsigned *revents)
{
	struct waiter *x;

	pthread_mutex_lock(&w->mu);
	if (!(x = waiter_of(w, key))) {
		pthread_mutex_unlock(&w->mu);
		if (ph)
			fuse_pollhandle_destroy(ph);
		return -ENOMEM;
	}
	x->events = true;
	x->woken = false;
	answer(x, w->end > read_to, ph, revents);
	pthread_mutex_unlock(&w->mu);
	return 0;
}

int dgfs_watch_poll_var(struct dgfs_watch *w, const struct dgfs_handle *key, int task,
			const char *name, uint64_t version, bool (*newer)(void *ud), void *ud,
			struct fuse_pollhandle *ph, unsigned *revents)
{
	struct waiter *x;
	bool fresh, woken;

	pthread_mutex_lock(&w->mu);
	x = waiter_of(w, key);
	if (x && !x->name && !(x->name = strdup(name))) {
		x = NULL;
	}
	if (!x) {
		pthread_mutex_unlock(&w->mu);
		if (ph)
			fuse_pollhandle_destroy(ph);
		return -ENOMEM;
	}
	fresh = x->task < 0;            /* the first poll of this open file */
	x->task = task;
	x->version = version;
	woken = x->woken;
	x->woken = false;
	pthread_mutex_unlock(&w->mu);
	/* The first poll (the stream may have started after the open) and a
	 * stream that restarted ask the ps itself; the stream is already
	 * positioned, so a change after this HEAD wakes the waiter. */
	if ((fresh || woken) && newer(ud)) {
		if (ph)
			fuse_pollhandle_destroy(ph);
		*revents = POLLIN | POLLRDNORM;
		return 0;
	}
	pthread_mutex_lock(&w->mu);
	answer(x, x->woken, ph, revents);       /* woken since the unlock? */
	pthread_mutex_unlock(&w->mu);
	return 0;
}

void dgfs_watch_forget(struct dgfs_watch *w, const struct dgfs_handle *key)
{
	struct waiter **pp, *x;

	pthread_mutex_lock(&w->mu);
	for (pp = &w->waiters; (x = *pp); pp = &x->next)
		if (x->key == key) {
			*pp = x->next;
			waiter_free(x);
			break;
		}
	pthread_mutex_unlock(&w->mu);
}
