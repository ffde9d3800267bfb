/* Shared input queues of a server (ps/queue.h): named, bounded queues of
 * examples that many producers enqueue into and many consumers dequeue
 * disjoint batches from, FIFO or seeded-shuffle (TensorFlow's
 * RandomShuffleQueue). The HTTP routes (routes.c) are a thin layer over this
 * file; it talks to nothing else. Everything lives in memory. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "dg/clock.h"
#include "queue.h"

/* Bound on the bytes one queue may hold (capacity x example size), so that a
 * create request cannot reserve the machine's memory by accident: 16 GiB, and
 * never more than half the machine's memory (queue_max_bytes). */
#define QUEUE_MAX_BYTES ((uint64_t)16 << 30)

/* Example ids tracked per queue (spec.has_ids): two uint32 counts each, so at
 * most 128 MiB of counts; larger ids are counted as untracked. */
#define QUEUE_MAX_IDS ((int64_t)1 << 24)

/* The requeue log (ps_queue_requeues) keeps the leases that ended without
 * their examples applied, newest last, up to this many examples' ids (8 MiB)
 * or entries, the oldest going first: enough for a job's master, which reads
 * it as the job runs, to put every dropped example's id in its ledger. */
#define REQUEUE_LOG_MAX_IDS ((int64_t)1 << 20)
#define REQUEUE_LOG_MAX_ENTRIES ((int64_t)1 << 16)

/* Why a lease ended without its examples applied (the log's "reason"). */
enum unapplied { UA_RELEASED, UA_EXPIRED, UA_HOLDER, UA_DROPPED };
static const char *const unapplied_names[] = { "released", "expired", "holder_released",
					       "dropped" };

/* One entry of the requeue log: a lease and its examples' ids (ids[] only
 * with spec.has_ids). */
struct requeue_rec {
	struct requeue_rec *next;
	uint64_t seq, lease;
	char holder[PS_LEASE_HOLDER_MAX + 1];
	enum unapplied why;
	int64_t n;
	int64_t ids[];
};

/* A leased dequeue's examples (ps_queue_dequeue_lease): kept, in slot layout,
 * until the lease is acked (consumed), released or expires (both requeue
 * them at the front). Their room in the queue stays reserved meanwhile, so a
 * requeue always fits. */
struct lease {
	struct lease *next;
	uint64_t id;
	char holder[PS_LEASE_HOLDER_MAX + 1];
	int64_t n;
	int64_t deadline_ms;      /* dg_mono_ms() at which it expires */
	int applies_seen;         /* ps_queue_lease_apply: the step's applies so far */
	bool any_dropped;         /*   and whether one of them was dropped */
	char data[];              /* n * example_bytes */
};

/* One queue. Storage is one block of capacity x example_bytes allocated at
 * create (Linux backs only the pages that examples touch, and an impossible
 * allocation fails at create, not in the middle of an enqueue). Each slot
 * holds one example: its components' raw bytes back to back. Queued examples
 * are logical positions 0..size-1 of a ring starting at slot `head`.
 *
 * Locking: `mu` guards every field below it. The registry (struct
 * ps_queues) guards `refs` and the `qs->queues` array; its mutex is always
 * taken before a queue's, never while holding one. */
struct queue {
	char name[DG_VAR_NAME_MAX + 1];
	struct dg_queue_spec spec;
	size_t comp_bytes[DG_QUEUE_MAX_COMPONENTS];   /* bytes of component i of one example */
	size_t comp_off[DG_QUEUE_MAX_COMPONENTS];     /* offset of component i in a slot */
	size_t example_bytes;                         /* sum of comp_bytes */
	int refs;                 /* the registry's (while listed) + each call in flight */

	pthread_mutex_t mu;
	pthread_cond_t not_full;  /* enqueuers wait here for room */
	pthread_cond_t not_empty; /* dequeuers wait here for examples */
	char *slots;              /* owned: capacity * example_bytes */
	int64_t head;             /* slot of logical position 0 */
	int64_t size;             /* examples queued */
	bool closed;
	bool deleted;             /* removed from the registry; waiters leave with DG_ECLOSED */
	uint64_t rng;             /* splitmix64 state, seeded from spec.seed */
	/* Leases: examples handed out and not yet acked; they keep their room. */
	struct lease *leases;     /* owned list, newest first */
	int64_t n_leases;
	int64_t leased;           /* examples under lease */
	uint64_t next_lease;      /* the last lease id given (ids start at 1) */
	/* Counters since create, in examples (expired: leases). */
	int64_t enqueued, dequeued, acked, dropped, requeued, expired;
	/* Per example id (spec.has_ids): times enqueued and times acked as
	 * applied, for the exactly-once check; n_ids slots each. */
	uint32_t *id_enq, *id_ack;
	int64_t n_ids;
	int64_t ids_untracked;    /* ids outside 0..QUEUE_MAX_IDS-1 */
	/* The requeue log: owned FIFO, oldest first; log_ids counts its ids. */
	struct requeue_rec *log_head, *log_tail;
	int64_t log_entries, log_ids, log_evicted;
	uint64_t log_seq;         /* the last entry's seq (seqs start at 1) */
};

struct ps_queues {
	pthread_mutex_t mu;
	pthread_cond_t idle;      /* signalled when a detached queue is freed */
	struct queue **queues;    /* owned array of n listed queues, sorted by name */
	int n, cap;
	int alive;                /* queue objects not yet freed, listed or detached */
};

/* splitmix64 (Steele, Lea & Flood): ten lines, a full 2^64 period, good
 * enough statistics for shuffling, and the same sequence for a seed on every
 * platform (rand_r and random_r are neither portable in sequence nor 64-bit).
 * Hand-written because no library is worth depending on for this. */
static uint64_t rng_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, n), n >= 1, without modulo bias: values below 2^64 mod n are
 * redrawn, so the accepted range is a whole multiple of n. */
static uint64_t rng_below(uint64_t *state, uint64_t n)
{
	uint64_t threshold = (0 - n) % n;
	uint64_t x;

	do
		x = rng_next(state);
	while (x < threshold);
	return x % n;
}

/* The slot of logical position i (0 <= i < capacity). */
static char *slot_at(const struct queue *q, int64_t i)
{
	int64_t s = q->head + i;

	if (s >= q->spec.capacity)
		s -= q->spec.capacity;
	return q->slots + (size_t)s * q->example_bytes;
}

/* Wait on cv (q->mu held) until deadline, a CLOCK_MONOTONIC time (immune to
 * the wall clock being set while a consumer waits): timeout_ms < 0 waits
 * without limit, 0 does not wait at all. Returns false once the deadline has
 * passed: the caller checks its condition once more and then reports
 * DG_ETIMEOUT. */
static bool wait_until(struct queue *q, pthread_cond_t *cv, int64_t timeout_ms,
		       const struct timespec *deadline)
{
	if (timeout_ms == 0)
		return false;
	if (timeout_ms < 0) {
		pthread_cond_wait(cv, &q->mu);
		return true;
	}
	return pthread_cond_timedwait(cv, &q->mu, deadline) != ETIMEDOUT;
}

/* ---- registry ---- */

/* Index of name in the sorted array, or -(insertion point) - 1. Registry mutex held. */
static int find_index(const struct ps_queues *qs, const char *name)
{
	int lo = 0, hi = qs->n - 1;

	while (lo <= hi) {
		int mid = lo + (hi - lo) / 2;
		int c = strcmp(qs->queues[mid]->name, name);
		if (c == 0)
			return mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -lo - 1;
}

static void queue_destroy(struct queue *q)
{
	for (struct lease *l = q->leases, *next; l; l = next) {
		next = l->next;
		free(l);
	}
	for (struct requeue_rec *e = q->log_head, *next; e; e = next) {
		next = e->next;
		free(e);
	}
	free(q->id_enq);
	free(q->id_ack);
	pthread_cond_destroy(&q->not_full);
	pthread_cond_destroy(&q->not_empty);
	pthread_mutex_destroy(&q->mu);
	free(q->slots);
	free(q);
}

/* Drop one reference (registry mutex held); the last one frees the queue and
 * tells ps_queues_free it has one queue less to wait for. */
static void unref_locked(struct ps_queues *qs, struct queue *q)
{
	if (--q->refs > 0)
		return;
	queue_destroy(q);
	qs->alive--;
	pthread_cond_broadcast(&qs->idle);
}

static void queue_put(struct ps_queues *qs, struct queue *q)
{
	pthread_mutex_lock(&qs->mu);
	unref_locked(qs, q);
	pthread_mutex_unlock(&qs->mu);
}

/* *out = a referenced queue by name (release with queue_put). DG_EINVAL for
 * a bad name, DG_ENOTFOUND when there is none (*out NULL). */
static enum dg_status queue_get(struct ps_queues *qs, const char *name, struct queue **out,
				struct dg_err *err)
{
	struct queue *q = NULL;
	int i;

	*out = NULL;
	if (dg_var_name_check(name, err) != DG_OK) {
		dg_err_prefix(err, "queue");
		return DG_EINVAL;
	}
	pthread_mutex_lock(&qs->mu);
	i = find_index(qs, name);
	if (i >= 0) {
		q = qs->queues[i];
		q->refs++;
	}
	pthread_mutex_unlock(&qs->mu);
	if (!q) {
		dg_err_set(err, DG_ENOTFOUND, "queue '%s' not found", name);
		dg_err_hint(err, "create it first (POST /v1/queues/%s); list queues with "
			    "GET /v1/queues", name);
		return DG_ENOTFOUND;
	}
	*out = q;
	return DG_OK;
}

/* Mark q deleted and wake its waiters (registry mutex held, q still listed:
 * the caller removes it from the array and drops the registry's reference). */
static void detach_locked(struct ps_queues *qs, struct queue *q)
{
	pthread_mutex_lock(&q->mu);
	q->deleted = true;
	pthread_cond_broadcast(&q->not_full);
	pthread_cond_broadcast(&q->not_empty);
	pthread_mutex_unlock(&q->mu);
	unref_locked(qs, q);
}

struct ps_queues *ps_queues_new(struct dg_err *err)
{
	struct ps_queues *qs = calloc(1, sizeof *qs);

	if (!qs) {
		dg_err_set(err, DG_ENOMEM, "out of memory creating the queue registry");
		return NULL;
	}
	pthread_mutex_init(&qs->mu, NULL);
	pthread_cond_init(&qs->idle, NULL);
	return qs;
}

void ps_queues_free(struct ps_queues *qs)
{
	if (!qs)
		return;
	pthread_mutex_lock(&qs->mu);
	for (int i = 0; i < qs->n; i++)
		detach_locked(qs, qs->queues[i]);
	qs->n = 0;
	/* Calls still in flight hold references; they wake with DG_ECLOSED and
	 * drop them, and only then may the registry itself go. */
	while (qs->alive > 0)
		pthread_cond_wait(&qs->idle, &qs->mu);
	pthread_mutex_unlock(&qs->mu);
	pthread_cond_destroy(&qs->idle);
	pthread_mutex_destroy(&qs->mu);
	free(qs->queues);
	free(qs);
}

/* ---- create ---- */

/* The most one queue may hold: QUEUE_MAX_BYTES, or half the machine's
 * memory when that is less. */
static uint64_t queue_max_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t half;

	if (pages <= 0 || page <= 0)
		return QUEUE_MAX_BYTES;
	half = (uint64_t)pages / 2 * (uint64_t)page;
	return half < QUEUE_MAX_BYTES ? half : QUEUE_MAX_BYTES;
}

/* Check a spec that did not necessarily come through dg_queue_spec_from_json
 * and compute the layout of one example. DG_ETOOLARGE past queue_max_bytes. */
static enum dg_status layout_spec(const char *name, const struct dg_queue_spec *s,
				  size_t *comp_bytes, size_t *comp_off, size_t *example_bytes,
				  struct dg_err *err)
{
	uint64_t total = 0, max = queue_max_bytes();

	if (s->capacity < 1 || s->min_after_dequeue < 0 || s->min_after_dequeue >= s->capacity) {
		dg_err_set(err, DG_EINVAL, "queue '%s': capacity %lld and min_after_dequeue %lld "
			   "must satisfy 0 <= min_after_dequeue < capacity", name,
			   (long long)s->capacity, (long long)s->min_after_dequeue);
		return DG_EINVAL;
	}
	if (s->n_components < 1 || s->n_components > DG_QUEUE_MAX_COMPONENTS)
		return dg_err_set(err, DG_EINVAL, "queue '%s' has %d components; 1 to %d are "
				  "allowed", name, s->n_components, DG_QUEUE_MAX_COMPONENTS);
	for (int i = 0; i < s->n_components; i++) {
		int64_t numel;
		enum dg_status st;
		if ((unsigned)s->dtype[i] >= DG_DTYPE_COUNT)
			return dg_err_set(err, DG_EDTYPE, "queue '%s' component %d has unknown "
					  "dtype number %d", name, i, (int)s->dtype[i]);
		if ((st = dg_shape_numel(&s->shape[i], &numel, err)) != DG_OK) {
			dg_err_prefix(err, "queue '%s' component %d", name, i);
			return st;
		}
		/* numel <= 2^48 and sizes <= 8, so neither product overflows. */
		comp_off[i] = (size_t)total;
		comp_bytes[i] = (size_t)numel * dg_dtype_size(s->dtype[i]);
		total += comp_bytes[i];
		if (total > max)
			break;
	}
	if (s->has_ids && (s->ids < 0 || s->ids >= s->n_components ||
			   (s->dtype[s->ids] != DG_I64 && s->dtype[s->ids] != DG_I32) ||
			   s->shape[s->ids].ndim != 0))
		return dg_err_set(err, DG_EINVAL, "queue '%s': the id component must be an "
				  "int64 or int32 scalar", name);
	/* total <= 16 * 2^48 * 8 here at most, and capacity <= 2^63: compare by
	 * division so the product is never formed when it would overflow. */
	if (total > max || (total > 0 && (uint64_t)s->capacity > max / total)) {
		dg_err_set(err, DG_ETOOLARGE, "queue '%s' would hold %lld examples of %llu bytes: "
			   "more than the limit of %llu MiB per queue (16 GiB, or half the "
			   "machine's memory)", name, (long long)s->capacity,
			   (unsigned long long)total, (unsigned long long)(max >> 20));
		dg_err_hint(err, "lower the capacity or split the examples over several queues");
		return DG_ETOOLARGE;
	}
	*example_bytes = (size_t)total;
	return DG_OK;
}

/* DG_OK when a and b are the same settings, else DG_EEXIST naming the first
 * difference (a = the existing queue's). */
static enum dg_status same_spec(const char *name, const struct dg_queue_spec *a,
				const struct dg_queue_spec *b, struct dg_err *err)
{
	char x[128], y[128];
	const char *what = NULL;

	if (a->capacity != b->capacity) {
		what = "capacity";
		snprintf(x, sizeof x, "%lld", (long long)a->capacity);
		snprintf(y, sizeof y, "%lld", (long long)b->capacity);
	} else if (a->shuffle != b->shuffle) {
		what = "shuffle";
		snprintf(x, sizeof x, "%s", a->shuffle ? "true" : "false");
		snprintf(y, sizeof y, "%s", b->shuffle ? "true" : "false");
	} else if (a->min_after_dequeue != b->min_after_dequeue) {
		what = "min_after_dequeue";
		snprintf(x, sizeof x, "%lld", (long long)a->min_after_dequeue);
		snprintf(y, sizeof y, "%lld", (long long)b->min_after_dequeue);
	} else if (a->seed != b->seed) {
		what = "seed";
		snprintf(x, sizeof x, "%llu", (unsigned long long)a->seed);
		snprintf(y, sizeof y, "%llu", (unsigned long long)b->seed);
	} else if (a->n_components != b->n_components) {
		what = "number of components";
		snprintf(x, sizeof x, "%d", a->n_components);
		snprintf(y, sizeof y, "%d", b->n_components);
	} else if (a->has_ids != b->has_ids || (a->has_ids && a->ids != b->ids)) {
		what = "ids";
		snprintf(x, sizeof x, "%d", a->has_ids ? a->ids : -1);
		snprintf(y, sizeof y, "%d", b->has_ids ? b->ids : -1);
	}
	for (int i = 0; !what && i < a->n_components; i++) {
		if (a->dtype[i] != b->dtype[i] || !dg_shape_eq(&a->shape[i], &b->shape[i])) {
			char sa[100], sb[100];
			dg_shape_format(&a->shape[i], sa, sizeof sa);
			dg_shape_format(&b->shape[i], sb, sizeof sb);
			what = "a component";
			snprintf(x, sizeof x, "%d as %s %s", i, dg_dtype_name(a->dtype[i]), sa);
			snprintf(y, sizeof y, "%s %s", dg_dtype_name(b->dtype[i]), sb);
		}
	}
	if (!what)
		return DG_OK;
	dg_err_set(err, DG_EEXIST, "queue '%s' exists with %s %s, not %s", name, what, x, y);
	dg_err_hint(err, "use the existing settings, or delete the queue first (DELETE "
		    "/v1/queues/%s)", name);
	return DG_EEXIST;
}

/* A new queue with its storage, holding the registry's reference. */
static struct queue *queue_new(const char *name, const struct dg_queue_spec *spec,
			       const size_t *comp_bytes, const size_t *comp_off,
			       size_t example_bytes, struct dg_err *err)
{
	struct queue *q = calloc(1, sizeof *q);

	/* Bounded by layout_spec to 16 GiB; +1 keeps malloc(0) out of the picture
	 * for queues of empty examples. */
	if (q)
		q->slots = malloc((size_t)spec->capacity * example_bytes + 1);
	if (!q || !q->slots) {
		/* The request asked for more than the server can give now: a 413
		 * the client can act on (a smaller capacity), not a server error. */
		dg_err_set(err, DG_ETOOLARGE, "cannot allocate %llu bytes for queue '%s' of %lld "
			   "examples on this server", (unsigned long long)spec->capacity *
			   example_bytes, name, (long long)spec->capacity);
		dg_err_hint(err, "lower the capacity");
		if (q)
			free(q->slots);
		free(q);
		return NULL;
	}
	snprintf(q->name, sizeof q->name, "%s", name);
	q->spec = *spec;
	memcpy(q->comp_bytes, comp_bytes, sizeof q->comp_bytes);
	memcpy(q->comp_off, comp_off, sizeof q->comp_off);
	q->example_bytes = example_bytes;
	q->rng = spec->seed;
	q->refs = 1;
	pthread_mutex_init(&q->mu, NULL);
	dg_cond_init_mono(&q->not_full);
	dg_cond_init_mono(&q->not_empty);
	return q;
}

/* Insert q at position pos of the sorted array (registry mutex held). */
static enum dg_status insert_locked(struct ps_queues *qs, int pos, struct queue *q,
				    struct dg_err *err)
{
	if (qs->n == qs->cap) {
		int ncap = qs->cap ? qs->cap * 2 : 8;
		struct queue **nq = realloc(qs->queues, (size_t)ncap * sizeof *nq);
		if (!nq)
			return dg_err_set(err, DG_ENOMEM, "out of memory listing queue '%s'",
					  q->name);
		qs->queues = nq;
		qs->cap = ncap;
	}
	memmove(qs->queues + pos + 1, qs->queues + pos, (size_t)(qs->n - pos) * sizeof *qs->queues);
	qs->queues[pos] = q;
	qs->n++;
	qs->alive++;
	return DG_OK;
}

enum dg_status ps_queue_create(struct ps_queues *qs, const char *name,
			       const struct dg_queue_spec *spec, bool *created, struct dg_err *err)
{
	size_t comp_bytes[DG_QUEUE_MAX_COMPONENTS] = { 0 };
	size_t comp_off[DG_QUEUE_MAX_COMPONENTS] = { 0 };
	size_t example_bytes = 0;
	struct queue *q;
	enum dg_status st;
	int i;

	if (created)
		*created = false;
	if ((st = dg_var_name_check(name, err)) != DG_OK) {
		dg_err_prefix(err, "queue");
		return st;
	}
	if ((st = layout_spec(name, spec, comp_bytes, comp_off, &example_bytes, err)) != DG_OK)
		return st;
	pthread_mutex_lock(&qs->mu);
	i = find_index(qs, name);
	if (i >= 0) {
		/* The spec of a queue never changes after create: no queue lock needed. */
		st = same_spec(name, &qs->queues[i]->spec, spec, err);
		pthread_mutex_unlock(&qs->mu);
		return st;
	}
	/* Allocating under the registry lock keeps two racing creates of one name
	 * from both succeeding; creates are rare and malloc does not touch pages. */
	q = queue_new(name, spec, comp_bytes, comp_off, example_bytes, err);
	if (!q) {
		pthread_mutex_unlock(&qs->mu);
		return err ? err->code : DG_ETOOLARGE;
	}
	st = insert_locked(qs, -i - 1, q, err);
	pthread_mutex_unlock(&qs->mu);
	if (st != DG_OK) {
		queue_destroy(q);
		return st;
	}
	if (created)
		*created = true;
	return DG_OK;
}

/* ---- example ids ---- */

/* The id of the example in slot (spec.has_ids). */
static int64_t slot_id(const struct queue *q, const char *slot)
{
	const char *p = slot + q->comp_off[q->spec.ids];

	if (q->spec.dtype[q->spec.ids] == DG_I32) {
		int32_t v;
		memcpy(&v, p, sizeof v);
		return v;
	}
	int64_t v;
	memcpy(&v, p, sizeof v);
	return v;
}

/* Room for the counts of ids up to want-1 (q->mu held); false when out of
 * memory (the ids are then counted as untracked). */
static bool ids_reserve(struct queue *q, int64_t want)
{
	int64_t n = q->n_ids ? q->n_ids : 1024;
	uint32_t *e, *a;

	if (want <= q->n_ids)
		return true;
	while (n < want)
		n *= 2;
	if (n > QUEUE_MAX_IDS)
		n = QUEUE_MAX_IDS;
	if (!(e = realloc(q->id_enq, (size_t)n * sizeof *e)))
		return false;
	q->id_enq = e;
	if (!(a = realloc(q->id_ack, (size_t)n * sizeof *a)))
		return false;
	q->id_ack = a;
	memset(e + q->n_ids, 0, (size_t)(n - q->n_ids) * sizeof *e);
	memset(a + q->n_ids, 0, (size_t)(n - q->n_ids) * sizeof *a);
	q->n_ids = n;
	return true;
}

/* Count one more enqueue (acked false) or applied ack (true) of id. */
static void id_count(struct queue *q, int64_t id, bool acked)
{
	if (id < 0 || id >= QUEUE_MAX_IDS || !ids_reserve(q, id + 1)) {
		q->ids_untracked++;
		return;
	}
	if (acked)
		q->id_ack[id]++;
	else
		q->id_enq[id]++;
}

/* ---- enqueue / dequeue ---- */

/* Copy n examples from the component-major body into logical positions
 * size..size+n-1 (q->mu held, room checked). Component c of example t is at
 * body + n*comp_off[c] + t*comp_bytes[c]. */
static void put_examples(struct queue *q, int64_t n, const char *body)
{
	for (int64_t t = 0; t < n; t++) {
		char *slot = slot_at(q, q->size + t);
		for (int c = 0; c < q->spec.n_components; c++) {
			size_t b = q->comp_bytes[c];
			if (b)   /* a [0]-shaped component; body may be NULL then */
				memcpy(slot + q->comp_off[c],
				       body + (size_t)n * q->comp_off[c] + (size_t)t * b, b);
		}
		if (q->spec.has_ids)
			id_count(q, slot_id(q, slot), false);
	}
	q->size += n;
	q->enqueued += n;
}

/* Move k examples (k <= size) out into the component-major batch at dst, and
 * their slots' bytes to keep (a lease's copy; NULL: none): FIFO takes
 * logical position 0 each time; shuffle picks a uniform position and fills
 * its hole with the last one (swap-remove: O(1) per example, and the queued
 * set stays contiguous). q->mu held. */
static void take_examples(struct queue *q, int64_t k, char *dst, char *keep)
{
	for (int64_t t = 0; t < k; t++) {
		int64_t pos = q->spec.shuffle ? (int64_t)rng_below(&q->rng, (uint64_t)q->size) : 0;
		char *slot = slot_at(q, pos);
		for (int c = 0; c < q->spec.n_components; c++) {
			size_t b = q->comp_bytes[c];
			memcpy(dst + (size_t)k * q->comp_off[c] + (size_t)t * b,
			       slot + q->comp_off[c], b);
		}
		if (keep)
			memcpy(keep + (size_t)t * q->example_bytes, slot, q->example_bytes);
		if (!q->spec.shuffle) {
			q->head = q->head + 1 == q->spec.capacity ? 0 : q->head + 1;
		} else if (pos != q->size - 1) {
			memcpy(slot, slot_at(q, q->size - 1), q->example_bytes);
		}
		q->size--;
	}
	q->dequeued += k;
}

/* Log lease l as ended unapplied (why), evicting the oldest entries past the
 * log's bounds. Out of memory, the entry is counted as evicted. q->mu held. */
static void log_unapplied(struct queue *q, const struct lease *l, enum unapplied why)
{
	int64_t n_ids = q->spec.has_ids ? l->n : 0;
	struct requeue_rec *e = malloc(sizeof *e + (size_t)n_ids * sizeof *e->ids);

	q->log_seq++;
	if (!e) {
		q->log_evicted++;
		return;
	}
	e->next = NULL;
	e->seq = q->log_seq;
	e->lease = l->id;
	memcpy(e->holder, l->holder, sizeof e->holder);
	e->why = why;
	e->n = l->n;
	for (int64_t t = 0; t < n_ids; t++)
		e->ids[t] = slot_id(q, l->data + (size_t)t * q->example_bytes);
	if (q->log_tail)
		q->log_tail->next = e;
	else
		q->log_head = e;
	q->log_tail = e;
	q->log_entries++;
	q->log_ids += n_ids;
	while (q->log_head != e && (q->log_ids > REQUEUE_LOG_MAX_IDS ||
				     q->log_entries > REQUEUE_LOG_MAX_ENTRIES)) {
		struct requeue_rec *old = q->log_head;
		q->log_head = old->next;
		q->log_entries--;
		q->log_ids -= q->spec.has_ids ? old->n : 0;
		q->log_evicted++;
		free(old);
	}
}

/* Put a lease's examples back at the front of the queue (their room was kept),
 * log it (why) and free it; l is already unlinked. q->mu held. */
static void requeue_lease(struct queue *q, struct lease *l, enum unapplied why)
{
	log_unapplied(q, l, why);
	/* Backwards, so that the lease's first example is at the front again. */
	for (int64_t t = l->n - 1; t >= 0; t--) {
		q->head = q->head == 0 ? q->spec.capacity - 1 : q->head - 1;
		memcpy(slot_at(q, 0), l->data + (size_t)t * q->example_bytes, q->example_bytes);
		q->size++;
	}
	q->leased -= l->n;
	q->n_leases--;
	q->requeued += l->n;
	free(l);
	pthread_cond_broadcast(&q->not_empty);
}

/* Requeue every lease whose deadline has passed. q->mu held. */
static void expire_leases(struct queue *q)
{
	int64_t now = dg_mono_ms();

	for (struct lease **pl = &q->leases; *pl;) {
		struct lease *l = *pl;
		if (l->deadline_ms > now) {
			pl = &l->next;
			continue;
		}
		*pl = l->next;
		q->expired++;
		requeue_lease(q, l, UA_EXPIRED);
	}
}

/* The earliest lease deadline, or INT64_MAX. q->mu held. */
static int64_t next_expiry(const struct queue *q)
{
	int64_t t = INT64_MAX;

	for (const struct lease *l = q->leases; l; l = l->next)
		if (l->deadline_ms < t)
			t = l->deadline_ms;
	return t;
}

/* Wait on cv like wait_until, but wake at the next lease expiry too (and
 * requeue what expired): a lease that runs out while consumers wait hands its
 * examples to them at once. */
static bool wait_leases(struct queue *q, pthread_cond_t *cv, int64_t timeout_ms,
			const struct timespec *deadline)
{
	int64_t exp = next_expiry(q);
	bool woke;

	if (exp != INT64_MAX && timeout_ms != 0) {
		struct timespec at = dg_deadline_timespec(dg_deadline_in_ms(exp - dg_mono_ms()));
		bool sooner = timeout_ms < 0 || at.tv_sec < deadline->tv_sec ||
			      (at.tv_sec == deadline->tv_sec && at.tv_nsec < deadline->tv_nsec);
		if (sooner) {
			pthread_cond_timedwait(cv, &q->mu, &at);
			expire_leases(q);
			return true;
		}
	}
	woke = wait_until(q, cv, timeout_ms, deadline);
	expire_leases(q);
	return woke;
}

/* The common refusal of an operation on a closed or deleted queue. */
static enum dg_status closed_error(const struct queue *q, const char *what, struct dg_err *err)
{
	if (q->deleted) {
		dg_err_set(err, DG_ECLOSED, "%s queue '%s': the queue was deleted", what, q->name);
		dg_err_hint(err, "create it again to go on using it");
		return DG_ECLOSED;
	}
	dg_err_set(err, DG_ECLOSED, "%s queue '%s': the queue is closed", what, q->name);
	return DG_ECLOSED;
}

/* Examples there is room for: leased ones keep theirs. q->mu held. */
static int64_t room(const struct queue *q)
{
	return q->spec.capacity - q->size - q->leased;
}

enum dg_status ps_queue_enqueue(struct ps_queues *qs, const char *name, int64_t n,
				const void *body, size_t len, int64_t timeout_ms,
				struct dg_err *err)
{
	struct timespec deadline = dg_deadline_timespec(dg_deadline_in_ms(timeout_ms));
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);

	if (st != DG_OK)
		return st;
	if (n < 1 || n > q->spec.capacity) {
		st = dg_err_set(err, DG_EINVAL, "cannot enqueue %lld examples into queue '%s' of "
				"capacity %lld: it could never fit", (long long)n, name,
				(long long)q->spec.capacity);
		dg_err_hint(err, "enqueue 1 to %lld examples at a time",
			    (long long)q->spec.capacity);
		goto out;
	}
	/* n <= capacity and capacity * example_bytes <= 16 GiB: no overflow. */
	if (len != (size_t)n * q->example_bytes) {
		st = dg_err_set(err, DG_EINVAL, "enqueue of %lld examples into queue '%s' needs "
				"%zu bytes (%zu per example), got %zu", (long long)n, name,
				(size_t)n * q->example_bytes, q->example_bytes, len);
		dg_err_hint(err, "the body is each component's [n, ...shape] batch in order, "
			    "raw little-endian");
		goto out;
	}
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	for (;;) {
		if (q->closed || q->deleted) {
			st = closed_error(q, "enqueue into", err);
			break;
		}
		if (room(q) >= n) {
			/* All n go in under one lock hold: no other enqueue interleaves. */
			put_examples(q, n, body);
			pthread_cond_broadcast(&q->not_empty);
			break;
		}
		if (!wait_leases(q, &q->not_full, timeout_ms, &deadline) && room(q) < n &&
		    !q->closed && !q->deleted) {
			st = dg_err_set(err, DG_ETIMEOUT, "enqueue of %lld examples into queue "
					"'%s' timed out after %lld ms waiting for room (%lld "
					"queued and %lld leased of %lld)", (long long)n, name,
					(long long)timeout_ms, (long long)q->size,
					(long long)q->leased, (long long)q->spec.capacity);
			dg_err_hint(err, "no consumer dequeued in time; retry or raise timeout_ms");
			break;
		}
	}
	pthread_mutex_unlock(&q->mu);
out:
	queue_put(qs, q);
	return st;
}

/* How many examples a dequeue of n may take now: n when it leaves
 * min_after_dequeue queued (or the queue is closed and has n), the rest when
 * closed and allow_smaller, 0 to keep waiting, -1 when closed and it can
 * never succeed. A closed queue with examples under lease is not at its end:
 * a lease that expires or is released brings them back, so a dequeue waits
 * for them rather than end early. q->mu held. */
static int64_t takeable(const struct queue *q, int64_t n, bool allow_smaller)
{
	if (q->deleted)
		return -1;
	if (!q->closed)
		return q->size - n >= q->spec.min_after_dequeue ? n : 0;
	if (q->size >= n)
		return n;
	if (allow_smaller && q->size > 0)
		return q->size;
	return q->leased > 0 ? 0 : -1;
}

enum dg_status ps_queue_dequeue_lease(struct ps_queues *qs, const char *name, int64_t n,
				      int64_t timeout_ms, bool allow_smaller,
				      const struct ps_lease_opts *lo, struct dg_buf *out,
				      int64_t *got, uint64_t *lease_id, struct dg_err *err)
{
	struct timespec deadline = dg_deadline_timespec(dg_deadline_in_ms(timeout_ms));
	struct queue *q;
	struct lease *l = NULL;
	enum dg_status st;
	int64_t k = 0;

	*got = 0;
	if (lease_id)
		*lease_id = 0;
	if ((st = queue_get(qs, name, &q, err)) != DG_OK)
		return st;
	if (n < 1 || n > q->spec.capacity) {
		st = dg_err_set(err, DG_EINVAL, "cannot dequeue %lld examples from queue '%s' of "
				"capacity %lld", (long long)n, name, (long long)q->spec.capacity);
		dg_err_hint(err, "dequeue 1 to %lld examples at a time",
			    (long long)q->spec.capacity);
		goto out;
	}
	if (lo && (lo->lease_ms < 1 || lo->lease_ms > PS_LEASE_MAX_MS ||
		   strlen(lo->holder ? lo->holder : "") > PS_LEASE_HOLDER_MAX)) {
		st = dg_err_set(err, DG_EINVAL, "a lease of queue '%s' lasts 1..%d ms and names a "
				"holder of at most %d bytes", name, PS_LEASE_MAX_MS,
				PS_LEASE_HOLDER_MAX);
		goto out;
	}
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	for (;;) {
		k = takeable(q, n, allow_smaller);
		if (k < 0) {
			k = 0;
			if (q->deleted || q->size == 0)
				st = closed_error(q, "dequeue from", err);
			else
				st = dg_err_set(err, DG_ECLOSED, "dequeue of %lld examples from "
						"queue '%s': the queue is closed and holds "
						"only %lld", (long long)n, name,
						(long long)q->size);
			if (!q->deleted && q->size > 0)
				dg_err_hint(err, "pass allow_smaller=1 to take the rest");
			break;
		}
		if (k > 0) {
			/* Room for the batch (and the lease's copy) before any example
			 * leaves the queue: once they are out nothing may fail, or
			 * they would be lost. Sized to what is taken, so a waiter that
			 * times out allocated nothing. */
			st = dg_buf_reserve(out, (size_t)k * q->example_bytes, err);
			if (st == DG_OK && lo &&
			    !(l = malloc(sizeof *l + (size_t)k * q->example_bytes + 1)))
				st = dg_err_set(err, DG_ENOMEM, "out of memory leasing %lld "
						"examples of queue '%s'", (long long)k, name);
			if (st != DG_OK) {
				k = 0;
				break;
			}
			take_examples(q, k, out->data + out->len, l ? l->data : NULL);
			out->len += (size_t)k * q->example_bytes;
			out->data[out->len] = '\0';   /* dg_buf's invariant */
			if (l) {
				l->applies_seen = 0;
				l->any_dropped = false;
				l->id = ++q->next_lease;
				snprintf(l->holder, sizeof l->holder, "%s",
					 lo->holder ? lo->holder : "");
				l->n = k;
				l->deadline_ms = dg_mono_ms() + lo->lease_ms;
				l->next = q->leases;
				q->leases = l;
				q->leased += k;
				q->n_leases++;
				if (lease_id)
					*lease_id = l->id;
			} else {
				pthread_cond_broadcast(&q->not_full);
			}
			break;
		}
		if (!wait_leases(q, &q->not_empty, timeout_ms, &deadline) &&
		    takeable(q, n, allow_smaller) == 0) {
			st = dg_err_set(err, DG_ETIMEOUT, "dequeue of %lld examples from queue "
					"'%s' timed out after %lld ms (%lld queued, %lld "
					"leased, %lld needed with min_after_dequeue %lld)",
					(long long)n, name, (long long)timeout_ms,
					(long long)q->size, (long long)q->leased,
					(long long)(n + q->spec.min_after_dequeue),
					(long long)q->spec.min_after_dequeue);
			dg_err_hint(err, "producers did not enqueue enough in time; close the "
				    "queue to drain what is left");
			break;
		}
	}
	pthread_mutex_unlock(&q->mu);
	*got = k;
out:
	queue_put(qs, q);
	return st;
}

enum dg_status ps_queue_dequeue(struct ps_queues *qs, const char *name, int64_t n,
				int64_t timeout_ms, bool allow_smaller, struct dg_buf *out,
				int64_t *got, struct dg_err *err)
{
	return ps_queue_dequeue_lease(qs, name, n, timeout_ms, allow_smaller, NULL, out, got,
				      NULL, err);
}

/* ---- leases ---- */

enum dg_status ps_queue_lease_end(struct ps_queues *qs, const char *name, uint64_t lease,
				  enum ps_lease_end how, int64_t *n, struct dg_err *err)
{
	static const char *const verbs[] = { "ack", "drop", "release" };
	struct queue *q;
	struct lease *l = NULL;
	enum dg_status st = queue_get(qs, name, &q, err);

	*n = 0;
	if (st != DG_OK)
		return st;
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	for (struct lease **pl = &q->leases; *pl; pl = &(*pl)->next) {
		if ((*pl)->id == lease) {
			l = *pl;
			*pl = l->next;
			break;
		}
	}
	if (!l) {
		st = dg_err_set(err, DG_ENOTFOUND, "cannot %s lease %llu of queue '%s': it is not "
				"held", verbs[how], (unsigned long long)lease, name);
		dg_err_hint(err, "a lease that expired (or was released) has had its examples "
			    "put back in the queue; leases given so far: 1..%llu",
			    (unsigned long long)q->next_lease);
	} else if (how == PS_LEASE_RELEASE) {
		*n = l->n;
		requeue_lease(q, l, UA_RELEASED);
	} else {
		*n = l->n;
		if (how == PS_LEASE_ACK) {
			q->acked += l->n;
			for (int64_t t = 0; q->spec.has_ids && t < l->n; t++)
				id_count(q, slot_id(q, l->data + (size_t)t * q->example_bytes), true);
		} else {
			q->dropped += l->n;
			log_unapplied(q, l, UA_DROPPED);
		}
		q->leased -= l->n;
		q->n_leases--;
		free(l);
		pthread_cond_broadcast(&q->not_full);
		/* A closed queue whose last lease is gone ends its waiting dequeues. */
		pthread_cond_broadcast(&q->not_empty);
	}
	pthread_mutex_unlock(&q->mu);
	queue_put(qs, q);
	return st;
}

enum dg_status ps_queue_lease_apply(struct ps_queues *qs, const char *name, uint64_t lease,
				    int count, bool dropped, bool requeue_dropped, bool *ended,
				    struct dg_err *err)
{
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);
	enum ps_lease_end how = PS_LEASE_ACK;
	struct lease *l;
	int64_t n;

	*ended = false;
	if (st != DG_OK)
		return st;
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	for (l = q->leases; l && l->id != lease; l = l->next)
		;
	if (!l) {
		st = dg_err_set(err, DG_ENOTFOUND, "lease %llu of queue '%s' is not held",
				(unsigned long long)lease, name);
	} else {
		l->applies_seen++;
		l->any_dropped |= dropped;
		*ended = l->applies_seen >= count;
		if (l->any_dropped)
			how = requeue_dropped ? PS_LEASE_RELEASE : PS_LEASE_DROP;
	}
	pthread_mutex_unlock(&q->mu);
	queue_put(qs, q);
	if (st != DG_OK || !*ended)
		return st;
	/* The step's last apply on this ps: its batch is consumed (or goes back). */
	return ps_queue_lease_end(qs, name, lease, how, &n, err);
}

enum dg_status ps_queue_release_holder(struct ps_queues *qs, const char *name,
				       const char *holder, int64_t *leases, int64_t *n,
				       struct dg_err *err)
{
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);

	*leases = *n = 0;
	if (st != DG_OK)
		return st;
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	for (struct lease **pl = &q->leases; *pl;) {
		struct lease *l = *pl;
		if (strcmp(l->holder, holder) != 0) {
			pl = &l->next;
			continue;
		}
		*pl = l->next;
		(*leases)++;
		*n += l->n;
		requeue_lease(q, l, UA_HOLDER);
	}
	pthread_mutex_unlock(&q->mu);
	queue_put(qs, q);
	return DG_OK;
}

enum dg_status ps_queue_close(struct ps_queues *qs, const char *name, struct dg_err *err)
{
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);

	if (st != DG_OK)
		return st;
	pthread_mutex_lock(&q->mu);
	q->closed = true;
	/* Enqueuers leave with DG_ECLOSED; dequeuers re-check and drain the rest. */
	pthread_cond_broadcast(&q->not_full);
	pthread_cond_broadcast(&q->not_empty);
	pthread_mutex_unlock(&q->mu);
	queue_put(qs, q);
	return DG_OK;
}

enum dg_status ps_queue_delete(struct ps_queues *qs, const char *name, struct dg_err *err)
{
	int i;

	if (dg_var_name_check(name, err) != DG_OK) {
		dg_err_prefix(err, "queue");
		return DG_EINVAL;
	}
	pthread_mutex_lock(&qs->mu);
	i = find_index(qs, name);
	if (i < 0) {
		pthread_mutex_unlock(&qs->mu);
		dg_err_set(err, DG_ENOTFOUND, "queue '%s' not found", name);
		dg_err_hint(err, "list queues with GET /v1/queues");
		return DG_ENOTFOUND;
	}
	/* Waiters hold their own references: they wake with DG_ECLOSED and the
	 * last one out frees the queue. New calls no longer find it (DG_ENOTFOUND). */
	detach_locked(qs, qs->queues[i]);
	memmove(qs->queues + i, qs->queues + i + 1, (size_t)(qs->n - i - 1) * sizeof *qs->queues);
	qs->n--;
	pthread_mutex_unlock(&qs->mu);
	return DG_OK;
}

/* ---- state, list, metrics ---- */

/* The counters of q as JSON members of j. q->mu held. */
static int state_members(struct queue *q, json_t *j)
{
	int64_t ids_done = 0, ids_short = 0, ids_over = 0;

	/* With ids: how many ids were applied as often as they were enqueued,
	 * fewer times (still to come, or lost) and more (applied twice). */
	for (int64_t i = 0; i < q->n_ids; i++) {
		if (!q->id_enq[i] && !q->id_ack[i])
			continue;
		if (q->id_ack[i] == q->id_enq[i])
			ids_done++;
		else if (q->id_ack[i] < q->id_enq[i])
			ids_short++;
		else
			ids_over++;
	}
	return json_object_set_new(j, "name", json_string(q->name)) ||
	       json_object_set_new(j, "size", json_integer(q->size)) ||
	       json_object_set_new(j, "closed", json_boolean(q->closed)) ||
	       json_object_set_new(j, "enqueued", json_integer(q->enqueued)) ||
	       json_object_set_new(j, "dequeued", json_integer(q->dequeued)) ||
	       json_object_set_new(j, "leased", json_integer(q->leased)) ||
	       json_object_set_new(j, "leases", json_integer(q->n_leases)) ||
	       json_object_set_new(j, "acked", json_integer(q->acked)) ||
	       json_object_set_new(j, "dropped", json_integer(q->dropped)) ||
	       json_object_set_new(j, "requeued", json_integer(q->requeued)) ||
	       json_object_set_new(j, "expired", json_integer(q->expired)) ||
	       (q->spec.has_ids &&
		(json_object_set_new(j, "ids_complete", json_integer(ids_done)) ||
		 json_object_set_new(j, "ids_short", json_integer(ids_short)) ||
		 json_object_set_new(j, "ids_over", json_integer(ids_over)) ||
		 json_object_set_new(j, "ids_untracked", json_integer(q->ids_untracked))));
}

enum dg_status ps_queue_state(struct ps_queues *qs, const char *name, json_t **out,
			      struct dg_err *err)
{
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);
	json_t *j;
	int bad;

	*out = NULL;
	if (st != DG_OK)
		return st;
	/* capacity, shuffle, min_after_dequeue, seed, components, ids, then the
	 * state and counters. */
	j = dg_queue_spec_to_json(&q->spec);
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	bad = !j || state_members(q, j);
	pthread_mutex_unlock(&q->mu);
	queue_put(qs, q);
	if (bad) {
		json_decref(j);
		return dg_err_set(err, DG_ENOMEM, "out of memory describing queue '%s'", name);
	}
	*out = j;
	return DG_OK;
}

enum dg_status ps_queue_peek(struct ps_queues *qs, const char *name, int64_t n, json_t **out,
			     struct dg_err *err)
{
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);
	json_t *ids = NULL, *leases = NULL;
	int bad = 0;

	*out = NULL;
	if (st != DG_OK)
		return st;
	ids = json_array();
	leases = json_array();
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	/* Queue order: the front first. A shuffle queue takes uniformly among
	 * them, so these are what is queued, not the order they leave in. */
	for (int64_t i = 0; q->spec.has_ids && i < q->size && i < n && !bad; i++)
		bad = json_array_append_new(ids, json_integer(slot_id(q, slot_at(q, i))));
	for (const struct lease *l = q->leases; l && !bad; l = l->next)
		bad = json_array_append_new(leases, json_pack("{s:I, s:s, s:I, s:I}", "lease",
			(json_int_t)l->id, "holder", l->holder, "examples", (json_int_t)l->n,
			"expires_in_ms", (json_int_t)(l->deadline_ms - dg_mono_ms())));
	*out = json_pack("{s:s, s:I, s:b, s:o, s:o}", "name", q->name, "size",
			 (json_int_t)q->size, "shuffle", q->spec.shuffle, "ids",
			 q->spec.has_ids ? ids : json_null(), "leases", leases);
	pthread_mutex_unlock(&q->mu);
	if (!q->spec.has_ids)
		json_decref(ids);
	queue_put(qs, q);
	if (bad || !*out) {
		json_decref(*out);
		*out = NULL;
		return dg_err_set(err, DG_ENOMEM, "out of memory describing queue '%s'", name);
	}
	return DG_OK;
}

enum dg_status ps_queue_id_counts(struct ps_queues *qs, const char *name, json_t **out,
				  struct dg_err *err)
{
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);
	json_t *enq, *ack;
	int64_t top = 0;
	int bad = 0;

	*out = NULL;
	if (st != DG_OK)
		return st;
	if (!q->spec.has_ids) {
		queue_put(qs, q);
		dg_err_set(err, DG_EINVAL, "queue '%s' has no id component", name);
		dg_err_hint(err, "create it with \"ids\": K naming an int64 scalar component");
		return DG_EINVAL;
	}
	enq = json_array();
	ack = json_array();
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	for (int64_t i = 0; i < q->n_ids; i++)
		if (q->id_enq[i] || q->id_ack[i])
			top = i + 1;
	for (int64_t i = 0; i < top && enq && ack && !bad; i++)
		bad = json_array_append_new(enq, json_integer(q->id_enq[i])) ||
		      json_array_append_new(ack, json_integer(q->id_ack[i]));
	*out = json_pack("{s:s, s:o, s:o, s:I}", "name", q->name, "enqueued", enq, "acked", ack,
			 "untracked", (json_int_t)q->ids_untracked);
	pthread_mutex_unlock(&q->mu);
	queue_put(qs, q);
	if (bad || !*out) {
		json_decref(*out);
		*out = NULL;
		return dg_err_set(err, DG_ENOMEM, "out of memory listing the ids of queue '%s'",
				  name);
	}
	return DG_OK;
}

/* One log entry as JSON (NULL when out of memory). */
static json_t *requeue_json(const struct queue *q, const struct requeue_rec *e)
{
	json_t *ids = q->spec.has_ids ? json_array() : json_null();

	for (int64_t t = 0; ids && q->spec.has_ids && t < e->n; t++)
		if (json_array_append_new(ids, json_integer(e->ids[t]))) {
			json_decref(ids);
			return NULL;
		}
	if (!ids)
		return NULL;
	return json_pack("{s:I, s:I, s:s, s:s, s:I, s:o}", "seq", (json_int_t)e->seq, "lease",
			 (json_int_t)e->lease, "holder", e->holder, "reason",
			 unapplied_names[e->why], "examples", (json_int_t)e->n, "ids", ids);
}

enum dg_status ps_queue_requeues(struct ps_queues *qs, const char *name, const char *prefix,
				 uint64_t after, int64_t max, json_t **out, struct dg_err *err)
{
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);
	size_t plen = prefix ? strlen(prefix) : 0;
	json_t *arr;
	uint64_t last;
	int64_t k = 0;
	bool more = false, bad;

	*out = NULL;
	if (st != DG_OK)
		return st;
	arr = json_array();
	bad = !arr;
	pthread_mutex_lock(&q->mu);
	expire_leases(q);
	last = after;
	for (const struct requeue_rec *e = q->log_head; e && !bad; e = e->next) {
		if (e->seq <= after || (plen && strncmp(e->holder, prefix, plen) != 0))
			continue;
		if (k == max) {
			more = true;
			break;
		}
		json_t *je = requeue_json(q, e);
		bad = !je || json_array_append_new(arr, je);
		last = e->seq;
		k++;
	}
	/* Nothing more to match: the next call can start at the newest entry. */
	if (!more && q->log_seq > last)
		last = q->log_seq;
	if (!bad)
		*out = json_pack("{s:s, s:o, s:I, s:b, s:I, s:I}", "name", q->name, "requeues", arr,
				 "last_seq", (json_int_t)last, "more", more, "evicted",
				 (json_int_t)q->log_evicted, "first_seq",
				 (json_int_t)(q->log_head ? q->log_head->seq : q->log_seq + 1));
	else
		json_decref(arr);
	pthread_mutex_unlock(&q->mu);
	queue_put(qs, q);
	if (!*out)
		return dg_err_set(err, DG_ENOMEM, "out of memory listing the requeues of queue "
				  "'%s'", name);
	return DG_OK;
}

json_t *ps_queue_list(struct ps_queues *qs)
{
	json_t *arr = json_array(), *root = json_object();

	if (!arr || !root || json_object_set(root, "queues", arr))
		goto fail;
	pthread_mutex_lock(&qs->mu);
	for (int i = 0; i < qs->n; i++) {
		struct queue *q = qs->queues[i];
		json_t *e;
		pthread_mutex_lock(&q->mu);
		expire_leases(q);
		e = json_pack("{s:s, s:I, s:I, s:b, s:I}", "name", q->name, "size",
			      (json_int_t)q->size, "capacity", (json_int_t)q->spec.capacity,
			      "closed", q->closed, "leased", (json_int_t)q->leased);
		pthread_mutex_unlock(&q->mu);
		if (json_array_append_new(arr, e)) {
			pthread_mutex_unlock(&qs->mu);
			goto fail;
		}
	}
	pthread_mutex_unlock(&qs->mu);
	json_decref(arr);
	return root;
fail:
	json_decref(arr);
	json_decref(root);
	return NULL;
}

int ps_queue_count(struct ps_queues *qs)
{
	int n;

	pthread_mutex_lock(&qs->mu);
	n = qs->n;
	pthread_mutex_unlock(&qs->mu);
	return n;
}

/* One gauge family of the queues: value(q) under q->mu. Registry mutex held. */
static enum dg_status metric_family(struct ps_queues *qs, struct dg_buf *out, const char *name,
				    const char *help, const char *type, const char *label,
				    int64_t (*value)(const struct queue *q, const char *label),
				    const char *const *labels, int n_labels, struct dg_err *err)
{
	enum dg_status st = dg_buf_printf(out, err, "# HELP %s %s\n# TYPE %s %s\n", name, help,
					  name, type);

	for (int i = 0; st == DG_OK && i < qs->n; i++) {
		struct queue *q = qs->queues[i];
		for (int k = 0; st == DG_OK && k < (n_labels ? n_labels : 1); k++) {
			int64_t v;
			pthread_mutex_lock(&q->mu);
			v = value(q, n_labels ? labels[k] : NULL);
			pthread_mutex_unlock(&q->mu);
			if (n_labels)
				st = dg_buf_printf(out, err, "%s{queue=\"%s\",%s=\"%s\"} %lld\n", name,
						   q->name, label, labels[k], (long long)v);
			else
				st = dg_buf_printf(out, err, "%s{queue=\"%s\"} %lld\n", name,
						   q->name, (long long)v);
		}
	}
	return st;
}

static int64_t q_size(const struct queue *q, const char *l) { (void)l; return q->size; }
static int64_t q_capacity(const struct queue *q, const char *l)
{
	(void)l;
	return q->spec.capacity;
}
static int64_t q_leased(const struct queue *q, const char *l) { (void)l; return q->leased; }
static int64_t q_events(const struct queue *q, const char *l)
{
	return strcmp(l, "enqueued") == 0 ? q->enqueued : strcmp(l, "dequeued") == 0 ? q->dequeued :
	       strcmp(l, "acked") == 0 ? q->acked : strcmp(l, "dropped") == 0 ? q->dropped :
	       q->requeued;
}

enum dg_status ps_queues_metrics(struct ps_queues *qs, struct dg_buf *out, struct dg_err *err)
{
	static const char *const events[] = { "enqueued", "dequeued", "acked", "dropped",
					      "requeued" };
	enum dg_status st;

	/* Queue names are [A-Za-z0-9_./-] (dg_var_name_check), so they need no
	 * escaping inside a Prometheus label value. One family at a time, as the
	 * text format wants all samples of a family together. */
	pthread_mutex_lock(&qs->mu);
	st = metric_family(qs, out, "dg_queue_size", "Examples queued.", "gauge", NULL, q_size,
			   NULL, 0, err);
	if (st == DG_OK)
		st = metric_family(qs, out, "dg_queue_capacity", "Examples a queue holds at most.",
				   "gauge", NULL, q_capacity, NULL, 0, err);
	if (st == DG_OK)
		st = metric_family(qs, out, "dg_queue_leased", "Examples dequeued under a lease "
				   "not yet acked.", "gauge", NULL, q_leased, NULL, 0, err);
	if (st == DG_OK)
		st = metric_family(qs, out, "dg_queue_examples_total", "Examples by what happened "
				   "to them.", "counter", "event", q_events, events, 5, err);
	pthread_mutex_unlock(&qs->mu);
	return st;
}
