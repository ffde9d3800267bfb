/* Shared input queues held by a server (the seed's RandomShuffleQueue): many
 * producers enqueue examples, many consumers dequeue disjoint batches, with
 * optional seeded shuffling. In memory only. Thread-safe; enqueue and dequeue
 * block (up to a timeout) on a full or empty queue. */
#ifndef PS_QUEUE_H
#define PS_QUEUE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "dg/buf.h"
#include "dg/client.h"

struct ps_queues;

struct ps_queues *ps_queues_new(struct dg_err *err);
/* Wakes every waiter (they get DG_ECLOSED) and frees. NULL is fine. */
void ps_queues_free(struct ps_queues *qs);

/* Create; an existing queue with identical settings is fine (*created false),
 * with other settings DG_EEXIST. */
enum dg_status ps_queue_create(struct ps_queues *qs, const char *name,
			       const struct dg_queue_spec *spec, bool *created, struct dg_err *err);
/* n examples; body = for each component, its [n, ...shape] batch's raw bytes
 * (length checked exactly). Blocks while there is no room for all n (up to
 * timeout_ms: DG_ETIMEOUT); DG_ECLOSED when closed; n > capacity DG_EINVAL. */
enum dg_status ps_queue_enqueue(struct ps_queues *qs, const char *name, int64_t n,
				const void *body, size_t len, int64_t timeout_ms,
				struct dg_err *err);
/* Up to n examples appended to out in the same layout; *got = how many.
 * Waits until n can be taken while keeping min_after_dequeue queued (ignored
 * once closed). Closed with fewer than n left: the rest when allow_smaller
 * (DG_ECLOSED when none left), else DG_ECLOSED. Timeout: DG_ETIMEOUT. With
 * shuffle, each example taken is uniform among those queued (seeded). */
enum dg_status ps_queue_dequeue(struct ps_queues *qs, const char *name, int64_t n,
				int64_t timeout_ms, bool allow_smaller, struct dg_buf *out,
				int64_t *got, struct dg_err *err);

/* A leased dequeue (doc/http-api.md, "Leases"): the examples stay reserved in
 * the queue until the lease is acked, released, or runs out after lease_ms;
 * the last two put them back at the front. holder tags the lease (a job's
 * replica) for ps_queue_release_holder. */
#define PS_LEASE_MAX_MS 3600000
#define PS_LEASE_HOLDER_MAX 63
struct ps_lease_opts {
	int64_t lease_ms;
	const char *holder;             /* NULL: "" */
};
/* ps_queue_dequeue with lo (NULL: no lease); *lease_id = the lease (0 for none). */
enum dg_status ps_queue_dequeue_lease(struct ps_queues *qs, const char *name, int64_t n,
				      int64_t timeout_ms, bool allow_smaller,
				      const struct ps_lease_opts *lo, struct dg_buf *out,
				      int64_t *got, uint64_t *lease_id, struct dg_err *err);
/* End a lease: ACK (its examples were consumed and applied), DROP (consumed,
 * their update not applied: a sync step's stale gradient) or RELEASE (put
 * them back now). *n = its examples. DG_ENOTFOUND when it is not held. */
enum ps_lease_end { PS_LEASE_ACK, PS_LEASE_DROP, PS_LEASE_RELEASE };
enum dg_status ps_queue_lease_end(struct ps_queues *qs, const char *name, uint64_t lease,
				  enum ps_lease_end how, int64_t *n, struct dg_err *err);
/* One of the count applies of a step that carries lease (POST .../apply with
 * lease=...): when the count-th has come, the lease ends as an ACK, or, when
 * one of them was dropped (a stale sync gradient), a RELEASE (requeue_dropped)
 * or a DROP. *ended says whether it ended. DG_ENOTFOUND when not held. */
enum dg_status ps_queue_lease_apply(struct ps_queues *qs, const char *name, uint64_t lease,
				    int count, bool dropped, bool requeue_dropped, bool *ended,
				    struct dg_err *err);
/* Release every lease of holder; *leases and *n say how many and how many examples. */
enum dg_status ps_queue_release_holder(struct ps_queues *qs, const char *name,
				       const char *holder, int64_t *leases, int64_t *n,
				       struct dg_err *err);
/* {"name","size","shuffle","ids": the first n queued ids (null without an id
 * component),"leases": [{"lease","holder","examples","expires_in_ms"}]} */
enum dg_status ps_queue_peek(struct ps_queues *qs, const char *name, int64_t n, json_t **out,
			     struct dg_err *err);
/* {"name","enqueued": [count per id 0..],"acked": [...],"untracked"}; DG_EINVAL
 * for a queue without ids. */
enum dg_status ps_queue_id_counts(struct ps_queues *qs, const char *name, json_t **out,
				  struct dg_err *err);
/* The requeue log: the leases that ended without their examples applied
 * (released, expired, a holder's released, dropped), oldest first, those
 * after seq `after` whose holder starts with prefix (NULL: any), at most max:
 * {"name","requeues": [{"seq","lease","holder","reason","examples","ids"
 * (null without an id component)}],"last_seq": the seq to pass as after next
 * time,"more": whether max cut the list,"first_seq": the oldest entry kept,
 * "evicted": entries dropped for room so far}. */
enum dg_status ps_queue_requeues(struct ps_queues *qs, const char *name, const char *prefix,
				 uint64_t after, int64_t max, json_t **out, struct dg_err *err);
enum dg_status ps_queue_close(struct ps_queues *qs, const char *name, struct dg_err *err);
enum dg_status ps_queue_delete(struct ps_queues *qs, const char *name, struct dg_err *err);
/* {"capacity","shuffle","min_after_dequeue","seed","components","ids"?,"name","size",
 * "closed","enqueued","dequeued","leased","leases","acked","dropped","requeued",
 * "expired", and with ids "ids_complete","ids_short","ids_over","ids_untracked"} */
enum dg_status ps_queue_state(struct ps_queues *qs, const char *name, json_t **out,
			      struct dg_err *err);
/* {"queues": [{"name","size","capacity","closed"}...]} */
json_t *ps_queue_list(struct ps_queues *qs);
int ps_queue_count(struct ps_queues *qs);
/* dg_queue_size{queue="q"}, dg_queue_capacity{queue="q"} lines. */
enum dg_status ps_queues_metrics(struct ps_queues *qs, struct dg_buf *out, struct dg_err *err);

#endif
