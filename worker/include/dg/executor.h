/* The worker face of `dg server`: fragments (graphs cut out of a submitted
 * graph by the master, doc/graph-format.md plus the worker ops _Send, _Recv,
 * VarRead, VarApply, VarInit) are registered, then run for a step id (or
 * for a range of steps: worker_run_steps, training); tensors cross tasks
 * through the rendezvous (dg/rendezvous.h) and the routes of the worker group
 * (POST /v1/fragments, /v1/steps/...). */
#ifndef DG_EXECUTOR_H
#define DG_EXECUTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dg/cluster.h"
#include "dg/http.h"
#include "dg/op.h"
#include "dg/rendezvous.h"
#include "dg/task_client.h"

/* Bounds that keep a hostile peer from exhausting a worker. */
#define WORKER_MAX_FRAGMENTS 4096        /* registered at once */
#define WORKER_DEFAULT_TIMEOUT_MS 30000  /* a run's _Recv deadline when none is given */
#define WORKER_MAX_TIMEOUT_MS 3600000
#define WORKER_MAX_RUN_STEPS 4096        /* steps of one multi-step run */
#define WORKER_MAX_COLLECT 64            /* keys collected after each step */
#define WORKER_DEFAULT_IO_THREADS 16     /* I/O threads (started lazily, on demand) */
#define WORKER_MAX_IO_THREADS 256
#define WORKER_MAX_CARRY_BYTES 65536     /* tensor bytes a run carries back in its reply */

struct worker_config {
	const struct dg_cluster *cluster;  /* borrowed, may be NULL; must outlive the worker */
	const char *job;                   /* this task: "worker" (copied) */
	int task;
	const char *address;               /* "host:port" others reach it at (copied); may be
					    * NULL until worker_set_address */
	const char *token;                 /* for outgoing requests (copied); NULL = none */
	bool soft_placement;               /* a device that is missing falls back to the CPU */
	int io_threads;                    /* most threads running VarRead/VarApply/VarInit and
					    * remote _Send; 0: $DG_WORKER_IO_THREADS, else
					    * WORKER_DEFAULT_IO_THREADS; < 0 (or the env var
					    * set to 0): none, they run on the step's thread */
	uint64_t rendezvous_max_bytes;     /* cap on the tensors the rendezvous holds; 0:
					    * $DG_RENDEZVOUS_MAX_MB, else min(4 GiB, memory/4) */
};

struct worker;

/* The worker state (fragments, rendezvous, pooled clients). Owned
 * (worker_free) or NULL with *err set. */
struct worker *worker_new(const struct worker_config *cfg, struct dg_err *err);
/* Set this task's own address (once the port is bound): a _Send whose "to" is
 * this address is delivered in-process. Thread-safe. */
void worker_set_address(struct worker *w, const char *address);
/* This task's own queues (the server program hands them over: worker/ does
 * not link ps/): a feeder (QueueEnqueueMany) whose queue lives on this task
 * enqueues through fn in-process, with the queue's rules, instead of over
 * HTTP. fn(ud, queue, n, body, len, timeout_ms, err) enqueues n examples of
 * a component-major body. Set once, before any run. */
typedef enum dg_status (*worker_local_enqueue_fn)(void *ud, const char *queue, int64_t n,
						   const void *body, size_t len,
						   int64_t timeout_ms, struct dg_err *err);
void worker_set_local_queues(struct worker *w, worker_local_enqueue_fn fn, void *ud);

/* The feeder of a QueueEnqueueMany, outside any graph (dg feed): every
 * example of ins[0..n_in) (each [N, ...], the queue's components but the id
 * one) enqueued into queue on ps once per epoch, with its id, then the queue
 * closed; attrs as the op's (components and ids as the queue's state says,
 * epochs, shuffle, seed, chunk, threads, id_base, close). *stop (may be
 * NULL), when it becomes true, ends it with DG_ECANCELED. *enqueued: the
 * examples enqueued. */
struct worker_feed {
	const char *ps, *token, *queue;
	const json_t *attrs;
	const struct dg_tensor *const *ins;
	int n_in;
	const atomic_bool *stop;
};
enum dg_status worker_feed_queue(const struct worker_feed *f, int64_t *enqueued,
				 struct dg_err *err);
/* Abort every running step (waiters return at once) and refuse new runs.
 * Call before stopping the HTTP server serving the worker group, so that
 * handlers do not sit in waits; worker_free calls it too. Thread-safe. */
void worker_stop(struct worker *w);
/* Stop, then free everything. The HTTP server must be stopped already. NULL ok. */
void worker_free(struct worker *w);

/* The worker routes (ctx = w), borrowed from w, to be served next to the ps
 * routes (ps_server_config.extra_groups). */
const struct dg_route_group *worker_route_group(struct worker *w);
/* The task's rendezvous, borrowed from w (the master takes fetched values). */
struct dg_rendezvous *worker_rendezvous(struct worker *w);
/* Accessors for the master and the CLI (borrowed strings; address may be ""). */
const char *worker_job(const struct worker *w);
int worker_task(const struct worker *w);
bool worker_soft_placement(const struct worker *w);

/* Append the worker's Prometheus metrics (steps run and failed, nodes run,
 * step seconds, fragments held, bytes of step-invariant values cached, tensors
 * and bytes sent in-process and over HTTP, tensors received over HTTP, tensors
 * waiting, I/O threads started) to out. w is a struct
 * worker (void * to fit ps_server_config.extra_metrics). Thread-safe. */
enum dg_status worker_metrics(void *w, struct dg_buf *out, struct dg_err *err);

/* Add the worker ops (_Send, _Recv, VarRead, VarApply, VarInit) to the op
 * registry as layer DG_OPL_WORKER (once; later calls do nothing). Thread-safe. */
void worker_ops_register(void);
/* The op lookup fragments are validated with: the registry's kernel and worker
 * ops (registering the worker ops first). Usable as a dg_op_lookup_fn.
 * Thread-safe. */
const struct dg_op_def *worker_op_find(const char *name);

/* A fragment's lease: an owner (its master, "host:port/nonce") that must
 * renew it (a run, or worker_fragments_renew) within lease_ms, or the task
 * forgets it, its cached tensors with it: a master that died leaves nothing
 * behind. WORKER_LEASE_MIN_MS..WORKER_LEASE_MAX_MS; owner at most
 * WORKER_OWNER_MAX - 1 printable bytes. */
#define WORKER_LEASE_MIN_MS 100
#define WORKER_LEASE_MAX_MS 86400000
#define WORKER_OWNER_MAX 128
struct worker_lease {
	const char *owner;
	int64_t lease_ms;
};

/* Register a fragment (JSON text, doc/graph-format.md). id receives "f<N>"
 * (at least 24 bytes), *n_nodes its size (may be NULL). lease: NULL (kept
 * until removed) or as above. DG_EINVAL and friends naming the node or the
 * lease; DG_ETOOLARGE past WORKER_MAX_FRAGMENTS. Thread-safe. */
enum dg_status worker_fragment_add(struct worker *w, const char *json, size_t len, char *id,
				   size_t id_len, int *n_nodes, const struct worker_lease *lease,
				   struct dg_err *err);
/* Renew the lease of every fragment of owner; the count renewed. */
int worker_fragments_renew(struct worker *w, const char *owner);
/* The same from a decoded document (the master's own task: no JSON text
 * written and read back). The fragment takes a reference to doc, which must
 * not change afterwards. */
enum dg_status worker_fragment_add_doc(struct worker *w, json_t *doc, char *id, size_t id_len,
				       int *n_nodes, struct dg_err *err);
/* Forget a fragment (runs in progress finish first). DG_ENOTFOUND. */
enum dg_status worker_fragment_remove(struct worker *w, const char *id, struct dg_err *err);

/* A multi-step run (worker_run_steps, POST /v1/fragments/ID/run with "steps"). */
struct worker_run_opts {
	uint64_t step;                  /* first step id */
	int64_t steps;                  /* 1..WORKER_MAX_RUN_STEPS */
	int64_t train_step;             /* training step of the first step (>= 0): step i of
					 * the run is training step train_step + i, which the
					 * kernels see as their step (ShardBatch's batch, the
					 * random ops' counter) and VarApply/VarRead use for
					 * lr schedules and sync steps */
	int64_t timeout_ms;             /* per step (_Recv, min_step waits); <= 0: default */
	const char *const *collect;     /* keys collected after each step (borrowed) */
	int n_collect;                  /* 0..WORKER_MAX_COLLECT */
	const char *carry_to;           /* a one-step run's requester (borrowed; NULL: none):
					 * its fragment's carriable _Sends to this address
					 * go into res->carried instead of over HTTP */
};
struct worker_step_result {
	uint64_t step;
	int64_t train_step;
	double ms;
	double *values;                 /* owned, n_collect values (NaN/inf possible) */
	int stale;                      /* sync applies of the step the ps dropped (409) */
};
struct worker_run_result {
	int64_t steps_done;             /* results r[0..steps_done) */
	int nodes_run;                  /* summed over the steps */
	double ms;
	struct worker_step_result *r;   /* owned */
	struct dg_task_carried *carried;        /* owned: with carry_to, what was carried */
	int n_carried;
	bool input_end;                 /* a training run that stopped early, cleanly: a
					 * QueueDequeueMany found its queue closed and
					 * drained (steps_done steps were run) */
};

/* Run fragment id for steps o->step .. o->step + o->steps - 1 back to back,
 * in-process. With o->carry_to and one step, a _Send to that address (not
 * this task's own) that registration found carriable (every _Recv of the
 * fragment, and every VarRead that waits for a sync step, comes before it:
 * once it may run, the fragment waits for nobody) is not sent: its value
 * goes into res->carried, for the requester to deliver, while the tensors
 * carried stay within WORKER_MAX_CARRY_BYTES. Before every step and after every ps request the run checks
 * whether the step was aborted (DELETE /v1/steps/S?count=K,
 * dg_rendezvous_abort_range) and then fails with DG_ECANCELED and the abort's
 * reason. After each step the keys o->collect are taken from this task's
 * rendezvous (values the fragment _Send'ed to its own address): each must be
 * there (else DG_ENOTFOUND) and hold one element of a numeric or bool dtype
 * (else DG_EINVAL), both naming the key. res (caller's memory, filled on
 * success and error: the steps done are kept) is released with
 * worker_run_result_deinit. Errors as worker_run_fragment; a failing step is
 * aborted in this task's rendezvous, later steps do not run. Thread-safe. */
enum dg_status worker_run_steps(struct worker *w, const char *id, const struct worker_run_opts *o,
				struct worker_run_result *res, struct dg_err *err);
/* Free what worker_run_steps put in res (zeroes it). NULL ok. */
void worker_run_result_deinit(struct worker_run_result *res);

/* Run every node of fragment id once for step, in-process (the master runs
 * the fragment placed on its own task this way): worker_run_steps with one
 * step whose training step is the step id.
 * _Recv waits at most timeout_ms (<= 0: the default). *nodes_run (may be NULL)
 * gets the count. A failing node aborts step in this task's rendezvous and the
 * error says "task JOB/I: node 'y' (Add): ...". Thread-safe: several steps of
 * the same or different fragments may run at once. */
enum dg_status worker_run_fragment(struct worker *w, const char *id, uint64_t step,
				   int64_t timeout_ms, int *nodes_run, struct dg_err *err);
/* The contract's name for the master: worker_run_fragment without the count. */
enum dg_status worker_run_fragment_local(struct worker *w, const char *fragment_id,
					 uint64_t step, int64_t timeout_ms, struct dg_err *err);

#endif
