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

#include "dg/clock.h"
#include "queue.h"

/* Bound on the bytes one queue may hold (capacity x example size), so that a
 * create request cannot reserve the machine's memory by accident. */
#define QUEUE_MAX_BYTES ((uint64_t)16 << 30)

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

/* Check a spec that did not necessarily come through dg_queue_spec_from_json
 * and compute the layout of one example. DG_ETOOLARGE past QUEUE_MAX_BYTES. */
static enum dg_status layout_spec(const char *name, const struct dg_queue_spec *s,
				  size_t *comp_bytes, size_t *comp_off, size_t *example_bytes,
				  struct dg_err *err)
{
	uint64_t total = 0;

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
		if (total > QUEUE_MAX_BYTES)
			break;
	}
	/* total <= 16 * 2^48 * 8 here at most, and capacity <= 2^63: compare by
	 * division so the product is never formed when it would overflow. */
	if (total > QUEUE_MAX_BYTES ||
	    (total > 0 && (uint64_t)s->capacity > QUEUE_MAX_BYTES / total)) {
		dg_err_set(err, DG_ETOOLARGE, "queue '%s' would hold %lld examples of %llu bytes: "
			   "more than the limit of 16 GiB per queue", name,
			   (long long)s->capacity, (unsigned long long)total);
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
		dg_err_set(err, DG_ENOMEM, "out of memory allocating %llu bytes for queue '%s'",
			   (unsigned long long)spec->capacity * example_bytes, name);
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
		return DG_ENOMEM;
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
	}
	q->size += n;
}

/* Move k examples (k <= size) out into the component-major batch at dst:
 * FIFO takes logical position 0 each time; shuffle picks a uniform position
 * and fills its hole with the last one (swap-remove: O(1) per example, and
 * the queued set stays contiguous). q->mu held. */
static void take_examples(struct queue *q, int64_t k, char *dst)
{
	for (int64_t t = 0; t < k; t++) {
		int64_t pos = q->spec.shuffle ? (int64_t)rng_below(&q->rng, (uint64_t)q->size) : 0;
		char *slot = slot_at(q, pos);
		for (int c = 0; c < q->spec.n_components; c++) {
			size_t b = q->comp_bytes[c];
			memcpy(dst + (size_t)k * q->comp_off[c] + (size_t)t * b,
			       slot + q->comp_off[c], b);
		}
		if (!q->spec.shuffle) {
			q->head = q->head + 1 == q->spec.capacity ? 0 : q->head + 1;
		} else if (pos != q->size - 1) {
			memcpy(slot, slot_at(q, q->size - 1), q->example_bytes);
		}
		q->size--;
	}
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
	for (;;) {
		if (q->closed || q->deleted) {
			st = closed_error(q, "enqueue into", err);
			break;
		}
		if (q->spec.capacity - q->size >= n) {
			/* All n go in under one lock hold: no other enqueue interleaves. */
			put_examples(q, n, body);
			pthread_cond_broadcast(&q->not_empty);
			break;
		}
		if (!wait_until(q, &q->not_full, timeout_ms, &deadline) &&
		    q->spec.capacity - q->size < n && !q->closed && !q->deleted) {
			st = dg_err_set(err, DG_ETIMEOUT, "enqueue of %lld examples into queue "
					"'%s' timed out after %lld ms waiting for room (%lld "
					"of %lld queued)", (long long)n, name,
					(long long)timeout_ms, (long long)q->size,
					(long long)q->spec.capacity);
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
 * never succeed. q->mu held. */
static int64_t takeable(const struct queue *q, int64_t n, bool allow_smaller)
{
	if (q->deleted)
		return -1;
	if (!q->closed)
		return q->size - n >= q->spec.min_after_dequeue ? n : 0;
	if (q->size >= n)
		return n;
	return allow_smaller && q->size > 0 ? q->size : -1;
}

enum dg_status ps_queue_dequeue(struct ps_queues *qs, const char *name, int64_t n,
				int64_t timeout_ms, bool allow_smaller, struct dg_buf *out,
				int64_t *got, struct dg_err *err)
{
	struct timespec deadline = dg_deadline_timespec(dg_deadline_in_ms(timeout_ms));
	struct queue *q;
	enum dg_status st;
	int64_t k = 0;

	*got = 0;
	if ((st = queue_get(qs, name, &q, err)) != DG_OK)
		return st;
	if (n < 1 || n > q->spec.capacity) {
		st = dg_err_set(err, DG_EINVAL, "cannot dequeue %lld examples from queue '%s' of "
				"capacity %lld", (long long)n, name, (long long)q->spec.capacity);
		dg_err_hint(err, "dequeue 1 to %lld examples at a time",
			    (long long)q->spec.capacity);
		goto out;
	}
	pthread_mutex_lock(&q->mu);
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
			/* Room for the batch before any example leaves the queue: once
			 * they are out nothing may fail, or they would be lost. Sized
			 * to what is taken, so a waiter that times out allocated nothing. */
			st = dg_buf_reserve(out, (size_t)k * q->example_bytes, err);
			if (st != DG_OK) {
				k = 0;
				break;
			}
			take_examples(q, k, out->data + out->len);
			out->len += (size_t)k * q->example_bytes;
			out->data[out->len] = '\0';   /* dg_buf's invariant */
			pthread_cond_broadcast(&q->not_full);
			break;
		}
		if (!wait_until(q, &q->not_empty, timeout_ms, &deadline) &&
		    takeable(q, n, allow_smaller) == 0) {
			st = dg_err_set(err, DG_ETIMEOUT, "dequeue of %lld examples from queue "
					"'%s' timed out after %lld ms (%lld queued, %lld "
					"needed with min_after_dequeue %lld)", (long long)n, name,
					(long long)timeout_ms, (long long)q->size,
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

enum dg_status ps_queue_state(struct ps_queues *qs, const char *name, json_t **out,
			      struct dg_err *err)
{
	struct queue *q;
	enum dg_status st = queue_get(qs, name, &q, err);
	json_t *j;
	int64_t size;
	bool closed;

	*out = NULL;
	if (st != DG_OK)
		return st;
	pthread_mutex_lock(&q->mu);
	size = q->size;
	closed = q->closed;
	pthread_mutex_unlock(&q->mu);
	/* capacity, shuffle, min_after_dequeue, seed, components, in that order. */
	j = dg_queue_spec_to_json(&q->spec);
	if (!j || json_object_set_new(j, "name", json_string(q->name)) ||
	    json_object_set_new(j, "size", json_integer(size)) ||
	    json_object_set_new(j, "closed", json_boolean(closed))) {
		json_decref(j);
		queue_put(qs, q);
		return dg_err_set(err, DG_ENOMEM, "out of memory describing queue '%s'", name);
	}
	queue_put(qs, q);
	*out = j;
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
		e = json_pack("{s:s, s:I, s:I, s:b}", "name", q->name, "size", (json_int_t)q->size,
			      "capacity", (json_int_t)q->spec.capacity, "closed", q->closed);
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

enum dg_status ps_queues_metrics(struct ps_queues *qs, struct dg_buf *out, struct dg_err *err)
{
	enum dg_status st;

	/* Queue names are [A-Za-z0-9_./-] (dg_var_name_check), so they need no
	 * escaping inside a Prometheus label value. One family at a time, as the
	 * text format wants all samples of a family together. */
	pthread_mutex_lock(&qs->mu);
	st = dg_buf_printf(out, err, "# HELP dg_queue_size Examples queued.\n"
			   "# TYPE dg_queue_size gauge\n");
	for (int i = 0; st == DG_OK && i < qs->n; i++) {
		struct queue *q = qs->queues[i];
		int64_t size;
		pthread_mutex_lock(&q->mu);
		size = q->size;
		pthread_mutex_unlock(&q->mu);
		st = dg_buf_printf(out, err, "dg_queue_size{queue=\"%s\"} %lld\n", q->name,
				   (long long)size);
	}
	if (st == DG_OK)
		st = dg_buf_printf(out, err, "# HELP dg_queue_capacity Examples a queue holds at "
				   "most.\n# TYPE dg_queue_capacity gauge\n");
	for (int i = 0; st == DG_OK && i < qs->n; i++)
		st = dg_buf_printf(out, err, "dg_queue_capacity{queue=\"%s\"} %lld\n",
				   qs->queues[i]->name, (long long)qs->queues[i]->spec.capacity);
	pthread_mutex_unlock(&qs->mu);
	return st;
}
