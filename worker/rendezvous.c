/* The rendezvous (dg/rendezvous.h): a hash table of (step, key) -> tensor
 * under one mutex, one condition variable (CLOCK_MONOTONIC) broadcast on every
 * put, abort and close, and a ring of the last aborts (a range of step ids
 * each, so that aborting a long multi-step run takes one slot and does not push
 * out the aborts of other steps) with their reasons. Waiters re-check their
 * keys on every wake: puts are rare compared with the work they carry, so a
 * broadcast per put costs nothing measurable.
 *
 * Limits. Every entry is also on a list in put order, so the tensors older
 * than max_age_ms are found from its head and dropped on each put (no timer
 * thread, no full scan); the bytes held are summed as entries come and go and
 * a put that would pass max_bytes is refused. */
#include "dg/rendezvous.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dg/clock.h"
#include "dg/log.h"

#define N_BUCKETS 1024

struct entry {
	struct entry *next;             /* in its hash bucket */
	struct entry *older, *newer;    /* in put order: rv->oldest .. rv->newest */
	uint64_t step;
	int64_t put_ms;                 /* CLOCK_MONOTONIC, ms */
	size_t charge;                  /* bytes counted in rv->bytes */
	struct dg_tensor *t;            /* owned */
	char key[];                     /* NUL-terminated */
};

/* Steps first..first+count-1 were aborted for reason. */
struct aborted {
	uint64_t first;
	uint64_t count;                 /* >= 1 once used */
	char reason[160];
};

struct dg_rendezvous {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct entry *buckets[N_BUCKETS];
	struct entry *oldest, *newest;  /* every entry, in put order */
	int count;
	size_t bytes;                   /* sum of the entries' charge */
	struct dg_rendezvous_limits lim;
	uint64_t expired;               /* entries dropped for their age */
	bool closed;
	struct aborted *ring;           /* DG_RV_ABORTED_KEEP aborts (ranges) */
	int ring_n, ring_next;          /* slots used; the next to write (the oldest when full) */
};

static uint64_t hash(uint64_t step, const char *key)
{
	uint64_t h = 1469598103934665603ull ^ (step * 0x9e3779b97f4a7c15ull);

	for (const unsigned char *p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return h;
}

/* $name as a decimal number 0..max; false (with a WARN) when set but malformed. */
static bool env_u64(const char *name, uint64_t max, uint64_t *out)
{
	const char *v = getenv(name);
	char *end;

	if (!v)
		return false;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno == ERANGE || x > max) {
		dg_log(DG_LOG_WARN, "worker", "%s='%.32s' is not a number 0..%" PRIu64
		       ": using the default", name, v, max);
		return false;
	}
	*out = x;
	return true;
}

/* The memory this process may use: physical memory, or its cgroup v2 limit
 * when that is lower (a container). 0 when unknown. */
static uint64_t memory_available(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	uint64_t mem = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
	FILE *f = fopen("/sys/fs/cgroup/memory.max", "re");
	unsigned long long lim;

	if (f) {
		/* "max" (no limit) does not scan as a number. */
		if (fscanf(f, "%llu", &lim) == 1 && lim > 0 && (mem == 0 || lim < mem))
			mem = lim;
		fclose(f);
	}
	return mem;
}

void dg_rendezvous_default_limits(struct dg_rendezvous_limits *out)
{
	uint64_t mb, s, mem = memory_available();

	out->max_bytes = DG_RV_DEFAULT_MAX_BYTES;
	if (mem > 0 && mem / 4 < out->max_bytes)
		out->max_bytes = (size_t)(mem / 4);
	if (env_u64("DG_RENDEZVOUS_MAX_MB", SIZE_MAX >> 20, &mb))
		out->max_bytes = (size_t)mb << 20;
	out->max_age_ms = DG_RV_DEFAULT_MAX_AGE_MS;
	if (env_u64("DG_RENDEZVOUS_MAX_AGE_S", INT64_MAX / 1000, &s))
		out->max_age_ms = (int64_t)s * 1000;
}

size_t dg_rendezvous_charge(const struct dg_tensor *t, const char *key)
{
	return t->nbytes + sizeof *t + sizeof(struct entry) + strlen(key) + 1;
}

struct dg_rendezvous *dg_rendezvous_new(void)
{
	struct dg_rendezvous *rv = calloc(1, sizeof *rv);

	if (!rv)
		return NULL;
	dg_rendezvous_default_limits(&rv->lim);
	rv->ring = calloc(DG_RV_ABORTED_KEEP, sizeof *rv->ring);
	if (!rv->ring) {
		free(rv);
		return NULL;
	}
	pthread_mutex_init(&rv->mu, NULL);
	dg_cond_init_mono(&rv->cv);
	return rv;
}

void dg_rendezvous_free(struct dg_rendezvous *rv)
{
	if (!rv)
		return;
	for (int b = 0; b < N_BUCKETS; b++) {
		for (struct entry *e = rv->buckets[b], *next; e; e = next) {
			next = e->next;
			dg_tensor_free(e->t);
			free(e);
		}
	}
	pthread_cond_destroy(&rv->cv);
	pthread_mutex_destroy(&rv->mu);
	free(rv->ring);
	free(rv);
}

enum dg_status dg_rendezvous_key_check(const char *key, struct dg_err *err)
{
	size_t n = key ? strlen(key) : 0;

	if (n == 0 || n > DG_RV_KEY_MAX) {
		dg_err_set(err, DG_EINVAL, "tensor key of %zu bytes: it must have 1 to %d", n,
			   DG_RV_KEY_MAX);
		return DG_EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		char c = key[i];
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		    strchr("_.:/>-", c))
			continue;
		dg_err_set(err, DG_EINVAL, "tensor key '%.64s' has the character 0x%02x at %zu",
			   key, (unsigned char)c, i);
		dg_err_hint(err, "keys are made of A-Z a-z 0-9 _ . : / > -");
		return DG_EINVAL;
	}
	return DG_OK;
}

/* Under mu: the oldest remembered abort that covers step (its reason is the
 * first one given), or NULL. */
static const struct aborted *find_aborted(const struct dg_rendezvous *rv, uint64_t step)
{
	int start = rv->ring_n < DG_RV_ABORTED_KEEP ? 0 : rv->ring_next;

	for (int k = 0; k < rv->ring_n; k++) {
		const struct aborted *a = &rv->ring[(start + k) % DG_RV_ABORTED_KEEP];
		if (step - a->first < a->count)         /* unsigned: below first wraps */
			return a;
	}
	return NULL;
}

/* Under mu: the refusal for step, if any (closed or aborted). */
static enum dg_status refused(const struct dg_rendezvous *rv, uint64_t step, struct dg_err *err)
{
	const struct aborted *a;

	if (rv->closed)
		return dg_err_set(err, DG_EUNAVAILABLE, "step %" PRIu64 ": this task is "
				  "shutting down", step);
	if ((a = find_aborted(rv, step)))
		return dg_err_set(err, DG_ECANCELED, "step %" PRIu64 " was aborted: %s", step,
				  a->reason);
	return DG_OK;
}

/* Under mu: e is off its bucket's chain; take it off the age list and the
 * totals. */
static void forget(struct dg_rendezvous *rv, struct entry *e)
{
	if (e->older)
		e->older->newer = e->newer;
	else
		rv->oldest = e->newer;
	if (e->newer)
		e->newer->older = e->older;
	else
		rv->newest = e->older;
	rv->count--;
	rv->bytes -= e->charge;
}

/* Under mu: unlink and return the entry (step, key), or NULL. */
static struct entry *unlink_entry(struct dg_rendezvous *rv, uint64_t step, const char *key)
{
	struct entry **pp = &rv->buckets[hash(step, key) % N_BUCKETS];

	for (; *pp; pp = &(*pp)->next) {
		struct entry *e = *pp;
		if (e->step == step && strcmp(e->key, key) == 0) {
			*pp = e->next;
			forget(rv, e);
			return e;
		}
	}
	return NULL;
}

/* Under mu: drop every entry of steps first..first+count-1 (one pass). */
static void drop_steps(struct dg_rendezvous *rv, uint64_t first, uint64_t count)
{
	for (int b = 0; b < N_BUCKETS && rv->count > 0; b++) {
		struct entry **pp = &rv->buckets[b];
		while (*pp) {
			struct entry *e = *pp;
			if (e->step - first >= count) {         /* unsigned: below first wraps */
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			forget(rv, e);
			dg_tensor_free(e->t);
			free(e);
		}
	}
}

/* Under mu: remember steps first..first+count-1 as aborted, in one slot
 * (steps aborted before keep their first reason: find_aborted looks at the
 * oldest first). A repeated abort of steps all aborted already adds nothing. */
static void mark_aborted(struct dg_rendezvous *rv, uint64_t first, uint64_t count,
			 const char *reason)
{
	const struct aborted *old = find_aborted(rv, first);

	if (old && first - old->first + count <= old->count)
		return;
	struct aborted *a = &rv->ring[rv->ring_next];
	a->first = first;
	a->count = count;
	snprintf(a->reason, sizeof a->reason, "%s", reason && reason[0] ? reason :
		 "no reason given");
	rv->ring_next = (rv->ring_next + 1) % DG_RV_ABORTED_KEEP;
	if (rv->ring_n < DG_RV_ABORTED_KEEP)
		rv->ring_n++;
}

/* Under mu: drop the entries put max_age_ms or more before now (the oldest
 * first) and abort their steps: a receiver that turns up late then hears why at
 * once instead of waiting out its deadline. Other entries of such a step stay
 * until they expire themselves or the step is finished (no scan of the table
 * here: this runs on every put). */
static void expire(struct dg_rendezvous *rv, int64_t now)
{
	char reason[160], first[80] = "";
	uint64_t n = 0;

	if (rv->lim.max_age_ms <= 0)
		return;
	while (rv->oldest && now - rv->oldest->put_ms >= rv->lim.max_age_ms) {
		struct entry *e = rv->oldest;
		struct entry **pp = &rv->buckets[hash(e->step, e->key) % N_BUCKETS];
		while (*pp != e)
			pp = &(*pp)->next;
		*pp = e->next;
		forget(rv, e);
		snprintf(reason, sizeof reason, "tensor '%.48s' was not received within %" PRId64
			 " ms: dropped (DG_RENDEZVOUS_MAX_AGE_S)", e->key, rv->lim.max_age_ms);
		mark_aborted(rv, e->step, 1, reason);
		if (n++ == 0)
			snprintf(first, sizeof first, "'%.48s' of step %" PRIu64, e->key, e->step);
		dg_tensor_free(e->t);
		free(e);
	}
	rv->expired += n;
	if (n)          /* one line per sweep, however many went */
		dg_log(DG_LOG_WARN, "worker", "rendezvous: dropped %" PRIu64 " tensor(s) nobody "
		       "received within %" PRId64 " ms (first %s); their steps are aborted", n,
		       rv->lim.max_age_ms, first);
}

/* Under mu: would holding charge more bytes pass max_bytes? Then DG_ETOOLARGE
 * naming the limit, what is held and the oldest tensor (the likely culprit). */
static enum dg_status check_room(const struct dg_rendezvous *rv, uint64_t step, const char *key,
				 size_t charge, int64_t now, struct dg_err *err)
{
	size_t max = rv->lim.max_bytes;

	if (max == 0 || (charge <= max && rv->bytes <= max - charge))
		return DG_OK;
	if (!rv->oldest)
		dg_err_set(err, DG_ETOOLARGE, "tensor '%.64s' of step %" PRIu64 " needs %zu bytes, "
			   "more than this task's rendezvous may hold (%zu bytes)", key, step,
			   charge, max);
	else
		dg_err_set(err, DG_ETOOLARGE, "rendezvous full: tensor '%.40s' of step %" PRIu64
			   " (%zu bytes) would pass the limit of %zu bytes; %d tensors (%zu bytes) "
			   "wait to be received, the oldest '%.40s' of step %" PRIu64 " for %.1f s",
			   key, step, charge, max, rv->count, rv->bytes, rv->oldest->key,
			   rv->oldest->step, (double)(now - rv->oldest->put_ms) / 1e3);
	dg_err_hint(err, "a receiver is not taking its tensors (a stalled step or a sender far "
		    "ahead); if that is expected, raise DG_RENDEZVOUS_MAX_MB on this task");
	return DG_ETOOLARGE;
}

enum dg_status dg_rendezvous_put(struct dg_rendezvous *rv, uint64_t step, const char *key,
				 struct dg_tensor *t, struct dg_err *err)
{
	enum dg_status st;
	struct entry *e;
	size_t n;

	if (!t) {
		return dg_err_set(err, DG_EINVAL, "no tensor given for key '%.64s'",
				  key ? key : "");
	}
	if ((st = dg_rendezvous_key_check(key, err)) != DG_OK) {
		dg_tensor_free(t);
		return st;
	}
	n = strlen(key);
	if (!(e = malloc(sizeof *e + n + 1))) {
		dg_tensor_free(t);
		return dg_err_set(err, DG_ENOMEM, "out of memory holding tensor '%s'", key);
	}
	e->step = step;
	e->t = t;
	e->charge = dg_rendezvous_charge(t, key);
	e->put_ms = dg_mono_ms();
	memcpy(e->key, key, n + 1);
	pthread_mutex_lock(&rv->mu);
	expire(rv, e->put_ms);
	st = refused(rv, step, err);
	if (st == DG_OK) {
		struct entry **head = &rv->buckets[hash(step, key) % N_BUCKETS];
		for (struct entry *o = *head; o && st == DG_OK; o = o->next) {
			if (o->step == step && strcmp(o->key, key) == 0) {
				st = dg_err_set(err, DG_EEXIST, "tensor '%s' of step %" PRIu64
						" was sent already and not received yet", key,
						step);
				dg_err_hint(err, "each key is sent once per step");
			}
		}
		if (st == DG_OK)
			st = check_room(rv, step, key, e->charge, e->put_ms, err);
		if (st == DG_OK) {
			e->next = *head;
			*head = e;
			e->newer = NULL;
			e->older = rv->newest;
			if (rv->newest)
				rv->newest->newer = e;
			else
				rv->oldest = e;
			rv->newest = e;
			rv->count++;
			rv->bytes += e->charge;
			pthread_cond_broadcast(&rv->cv);
		}
	}
	pthread_mutex_unlock(&rv->mu);
	if (st != DG_OK) {
		dg_tensor_free(t);
		free(e);
	}
	return st;
}

enum dg_status dg_rendezvous_wait_any(struct dg_rendezvous *rv, uint64_t step,
				      const char *const *keys, int n, int64_t timeout_ms,
				      bool (*woken)(void *ud), void *ud, int *which,
				      struct dg_tensor **out, struct dg_err *err)
{
	enum dg_status st = DG_OK;
	struct timespec deadline;
	struct entry *e = NULL;
	bool timed_out = false;

	*out = NULL;
	*which = -1;
	if (n < 0 || (n > 0 && !keys) || (n == 0 && !woken))
		return dg_err_set(err, DG_EINVAL, "no tensor key to wait for");
	for (int i = 0; i < n; i++)
		if ((st = dg_rendezvous_key_check(keys[i], err)) != DG_OK)
			return st;
	if (timeout_ms < 0)
		timeout_ms = 0;
	if (timeout_ms > (int64_t)1 << 40)
		timeout_ms = (int64_t)1 << 40;
	deadline = dg_deadline_timespec(dg_deadline_in_ms(timeout_ms));
	pthread_mutex_lock(&rv->mu);
	for (;;) {
		if ((st = refused(rv, step, err)) != DG_OK)
			break;
		for (int i = 0; i < n && !e; i++) {
			if ((e = unlink_entry(rv, step, keys[i])))
				*which = i;
		}
		if (e || (woken && woken(ud)))
			break;
		if (timed_out) {
			if (n == 0)
				st = dg_err_set(err, DG_ETIMEOUT, "step %" PRIu64 ": nothing "
						"completed within %" PRId64 " ms", step,
						timeout_ms);
			else if (n == 1)
				st = dg_err_set(err, DG_ETIMEOUT, "tensor '%s' of step %" PRIu64
						" did not arrive within %" PRId64 " ms", keys[0],
						step, timeout_ms);
			else
				st = dg_err_set(err, DG_ETIMEOUT, "none of %d tensors ('%s', ...) "
						"of step %" PRIu64 " arrived within %" PRId64
						" ms", n, keys[0], step, timeout_ms);
			dg_err_hint(err, "the sending task may have failed or be slow; see its "
				    "log, or raise the step's timeout_ms");
			break;
		}
		if (pthread_cond_timedwait(&rv->cv, &rv->mu, &deadline) == ETIMEDOUT)
			timed_out = true;
	}
	pthread_mutex_unlock(&rv->mu);
	if (e) {
		*out = e->t;
		free(e);
	}
	return st;
}

enum dg_status dg_rendezvous_take_any(struct dg_rendezvous *rv, uint64_t step,
				      const char *const *keys, int n, int64_t timeout_ms,
				      int *which, struct dg_tensor **out, struct dg_err *err)
{
	if (n <= 0 || !keys) {
		*out = NULL;
		return dg_err_set(err, DG_EINVAL, "no tensor key to wait for");
	}
	return dg_rendezvous_wait_any(rv, step, keys, n, timeout_ms, NULL, NULL, which, out,
				      err);
}

void dg_rendezvous_wake(struct dg_rendezvous *rv)
{
	pthread_mutex_lock(&rv->mu);
	pthread_cond_broadcast(&rv->cv);
	pthread_mutex_unlock(&rv->mu);
}

enum dg_status dg_rendezvous_check(struct dg_rendezvous *rv, uint64_t step, struct dg_err *err)
{
	enum dg_status st;

	pthread_mutex_lock(&rv->mu);
	st = refused(rv, step, err);
	pthread_mutex_unlock(&rv->mu);
	return st;
}

enum dg_status dg_rendezvous_take(struct dg_rendezvous *rv, uint64_t step, const char *key,
				  int64_t timeout_ms, struct dg_tensor **out, struct dg_err *err)
{
	int which;

	return dg_rendezvous_take_any(rv, step, &key, 1, timeout_ms, &which, out, err);
}

void dg_rendezvous_abort(struct dg_rendezvous *rv, uint64_t step, const char *reason)
{
	dg_rendezvous_abort_range(rv, step, 1, reason);
}

void dg_rendezvous_abort_range(struct dg_rendezvous *rv, uint64_t first, int64_t count,
			       const char *reason)
{
	if (count < 1)
		return;
	if (count > DG_RV_ABORTED_KEEP)
		count = DG_RV_ABORTED_KEEP;
	if (first > UINT64_MAX - (uint64_t)(count - 1))         /* the range ends at 2^64-1 */
		count = (int64_t)(UINT64_MAX - first) + 1;
	pthread_mutex_lock(&rv->mu);
	mark_aborted(rv, first, (uint64_t)count, reason);
	drop_steps(rv, first, (uint64_t)count);
	pthread_cond_broadcast(&rv->cv);
	pthread_mutex_unlock(&rv->mu);
}

bool dg_rendezvous_is_aborted(struct dg_rendezvous *rv, uint64_t step)
{
	bool r;

	pthread_mutex_lock(&rv->mu);
	r = find_aborted(rv, step) != NULL;
	pthread_mutex_unlock(&rv->mu);
	return r;
}

void dg_rendezvous_finish(struct dg_rendezvous *rv, uint64_t step)
{
	pthread_mutex_lock(&rv->mu);
	drop_steps(rv, step, 1);
	pthread_mutex_unlock(&rv->mu);
}

void dg_rendezvous_close(struct dg_rendezvous *rv)
{
	pthread_mutex_lock(&rv->mu);
	rv->closed = true;
	pthread_cond_broadcast(&rv->cv);
	pthread_mutex_unlock(&rv->mu);
}

int dg_rendezvous_count(struct dg_rendezvous *rv)
{
	int n;

	pthread_mutex_lock(&rv->mu);
	n = rv->count;
	pthread_mutex_unlock(&rv->mu);
	return n;
}

size_t dg_rendezvous_bytes(struct dg_rendezvous *rv)
{
	size_t n;

	pthread_mutex_lock(&rv->mu);
	n = rv->bytes;
	pthread_mutex_unlock(&rv->mu);
	return n;
}

uint64_t dg_rendezvous_expired(struct dg_rendezvous *rv)
{
	uint64_t n;

	pthread_mutex_lock(&rv->mu);
	n = rv->expired;
	pthread_mutex_unlock(&rv->mu);
	return n;
}

void dg_rendezvous_set_limits(struct dg_rendezvous *rv, const struct dg_rendezvous_limits *l)
{
	pthread_mutex_lock(&rv->mu);
	rv->lim = *l;
	pthread_mutex_unlock(&rv->mu);
}

void dg_rendezvous_get_limits(struct dg_rendezvous *rv, struct dg_rendezvous_limits *out)
{
	pthread_mutex_lock(&rv->mu);
	*out = rv->lim;
	pthread_mutex_unlock(&rv->mu);
}
