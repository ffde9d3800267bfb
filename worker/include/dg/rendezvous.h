/* The rendezvous of one task: tensors sent to this task for a step wait here,
 * keyed by (step id, key), until the _Recv (or the master's fetch) that wants
 * them takes them. Step ids keep concurrent steps apart; aborting a step
 * releases every waiter with DG_ECANCELED and refuses later traffic for it.
 * What it holds is capped (bytes, all steps together), and a tensor nobody
 * takes is dropped after a maximum age, so no sender can exhaust the task. */
#ifndef DG_RENDEZVOUS_H
#define DG_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dg/tensor.h"

/* Keys: 1..DG_RV_KEY_MAX bytes of [A-Za-z0-9_.:/>-]. */
#define DG_RV_KEY_MAX 512
/* Aborts remembered (each a step or a range of at most DG_RV_ABORTED_KEEP steps;
 * oldest forgotten first). */
#define DG_RV_ABORTED_KEEP 4096

/* Default cap on what one rendezvous holds: at most this, and at most a quarter
 * of the memory this process may use (physical memory or its cgroup's limit). */
#define DG_RV_DEFAULT_MAX_BYTES ((size_t)4 << 30)
/* Default age after which a tensor nobody took is dropped: twice the longest
 * _Recv wait a run may ask for (an hour), so a live step never loses one. */
#define DG_RV_DEFAULT_MAX_AGE_MS ((int64_t)2 * 3600 * 1000)

struct dg_rendezvous_limits {
	/* Bytes held at once, all steps together: each tensor is charged its data
	 * plus its bookkeeping (dg_rendezvous_charge). 0 = no cap. */
	size_t max_bytes;
	/* A tensor not taken this long after its put is dropped and its step
	 * aborted (ms). 0 = never. */
	int64_t max_age_ms;
};

struct dg_rendezvous;

/* The limits a new rendezvous starts with. max_bytes: $DG_RENDEZVOUS_MAX_MB
 * (MiB, decimal; 0 = no cap) when set and well-formed, else the smaller of
 * DG_RV_DEFAULT_MAX_BYTES and a quarter of the memory available (physical
 * memory, or the cgroup's memory.max when lower). max_age_ms:
 * $DG_RENDEZVOUS_MAX_AGE_S (seconds; 0 = never) or DG_RV_DEFAULT_MAX_AGE_MS.
 * A malformed variable is logged (WARN) and the default used. */
void dg_rendezvous_default_limits(struct dg_rendezvous_limits *out);

/* Owned (dg_rendezvous_free) or NULL when out of memory. Starts with
 * dg_rendezvous_default_limits. */
struct dg_rendezvous *dg_rendezvous_new(void);
/* Replace the limits (a `dg server` option would set them this way). Tensors
 * held already stay even when they exceed a lower cap; later puts are checked
 * against it. Thread-safe. */
void dg_rendezvous_set_limits(struct dg_rendezvous *rv, const struct dg_rendezvous_limits *l);
void dg_rendezvous_get_limits(struct dg_rendezvous *rv, struct dg_rendezvous_limits *out);
/* What holding t under key costs against max_bytes: its data bytes plus the
 * tensor and entry records. */
size_t dg_rendezvous_charge(const struct dg_tensor *t, const char *key);
/* Frees the tensors still held. No thread may be waiting (call
 * dg_rendezvous_close first when some might be). NULL is fine. */
void dg_rendezvous_free(struct dg_rendezvous *rv);

/* DG_EINVAL naming key when it is not a valid key (see above). */
enum dg_status dg_rendezvous_key_check(const char *key, struct dg_err *err);

/* Deposit t (takes ownership, also on error) for (step, key) and wake its
 * waiter. DG_ECANCELED when the step was aborted, DG_EEXIST when the key is
 * already waiting to be taken, DG_EUNAVAILABLE after close, DG_ETOOLARGE
 * (naming the limit, what is held and the oldest tensor held) when holding it
 * would pass max_bytes once the tensors older than max_age_ms are dropped.
 * Thread-safe. */
enum dg_status dg_rendezvous_put(struct dg_rendezvous *rv, uint64_t step, const char *key,
				 struct dg_tensor *t, struct dg_err *err);

/* Wait up to timeout_ms (0: just look) for (step, key), remove it and give it
 * to *out (owned). DG_ETIMEOUT naming key and step, DG_ECANCELED ("step 17 was
 * aborted: REASON") when the step is or becomes aborted, DG_EUNAVAILABLE after
 * close. Thread-safe; several threads may wait on different keys. */
enum dg_status dg_rendezvous_take(struct dg_rendezvous *rv, uint64_t step, const char *key,
				  int64_t timeout_ms, struct dg_tensor **out, struct dg_err *err);

/* Like take for whichever of keys[0..n) arrives first (the executor uses it so
 * that one thread never waits on one key while another has arrived). *which
 * gets the index. Errors as take, naming the first key and the count. */
enum dg_status dg_rendezvous_take_any(struct dg_rendezvous *rv, uint64_t step,
				      const char *const *keys, int n, int64_t timeout_ms,
				      int *which, struct dg_tensor **out, struct dg_err *err);

/* Like take_any, but n may be 0 and the wait also ends, with DG_OK, *which =
 * -1 and *out NULL, as soon as woken(ud) is true (called under the
 * rendezvous lock, so it must be quick and must not call the rendezvous).
 * Whoever makes woken(ud) true calls dg_rendezvous_wake afterwards. The
 * executor waits this way for a _Recv or the completion of one of its I/O
 * requests, whichever comes first. DG_ETIMEOUT when neither came in time. */
enum dg_status dg_rendezvous_wait_any(struct dg_rendezvous *rv, uint64_t step,
				      const char *const *keys, int n, int64_t timeout_ms,
				      bool (*woken)(void *ud), void *ud, int *which,
				      struct dg_tensor **out, struct dg_err *err);
/* Wake every waiter so that it re-checks its keys and woken(). Thread-safe. */
void dg_rendezvous_wake(struct dg_rendezvous *rv);

/* DG_OK while step may still run here; DG_ECANCELED ("step 17 was aborted:
 * REASON") once it was aborted; DG_EUNAVAILABLE after close. Thread-safe. */
enum dg_status dg_rendezvous_check(struct dg_rendezvous *rv, uint64_t step, struct dg_err *err);

/* Abort step: drop its tensors, wake its waiters with DG_ECANCELED carrying
 * reason (copied; NULL = "no reason given") and refuse later put/take for it.
 * Idempotent (the first reason stays). Thread-safe. */
void dg_rendezvous_abort(struct dg_rendezvous *rv, uint64_t step, const char *reason);
/* Abort steps first..first+count-1 (count 1..DG_RV_ABORTED_KEEP; larger counts
 * are clamped) in one pass: a multi-step run is aborted this way. */
void dg_rendezvous_abort_range(struct dg_rendezvous *rv, uint64_t first, int64_t count,
			       const char *reason);
/* True when step was aborted (and is still remembered). */
bool dg_rendezvous_is_aborted(struct dg_rendezvous *rv, uint64_t step);
/* The step is over: drop any tensors left for it (not taken). Thread-safe. */
void dg_rendezvous_finish(struct dg_rendezvous *rv, uint64_t step);
/* Shut down: every waiter returns DG_EUNAVAILABLE at once, later calls too.
 * Thread-safe; used before stopping the server that feeds the rendezvous. */
void dg_rendezvous_close(struct dg_rendezvous *rv);
/* Tensors currently held (all steps), for tests and metrics. */
int dg_rendezvous_count(struct dg_rendezvous *rv);
/* Bytes currently charged against max_bytes (all steps), for tests and metrics. */
size_t dg_rendezvous_bytes(struct dg_rendezvous *rv);
/* Tensors dropped so far because nobody took them within max_age_ms. */
uint64_t dg_rendezvous_expired(struct dg_rendezvous *rv);

#endif
