/* The worker face of `dg server`: fragments (graphs cut out of a submitted
 * graph by the master, doc/graph-format.md plus the worker ops _Send, _Recv,
 * VarRead, VarApply, VarInit) are registered, then run once per step with a
 * step id; tensors cross tasks through the rendezvous (dg/rendezvous.h) and
 * the routes of the worker group (POST /v1/fragments, /v1/steps/...). */
#ifndef DG_EXECUTOR_H
#define DG_EXECUTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dg/cluster.h"
#include "dg/http.h"
#include "dg/op.h"
#include "dg/rendezvous.h"

/* Bounds that keep a hostile peer from exhausting a worker. */
#define WORKER_MAX_FRAGMENTS 4096        /* registered at once */
#define WORKER_DEFAULT_TIMEOUT_MS 30000  /* a run's _Recv deadline when none is given */
#define WORKER_MAX_TIMEOUT_MS 3600000

struct worker_config {
	const struct dg_cluster *cluster;  /* borrowed, may be NULL; must outlive the worker */
	const char *job;                   /* this task: "worker" (copied) */
	int task;
	const char *address;               /* "host:port" others reach it at (copied); may be
					    * NULL until worker_set_address */
	const char *token;                 /* for outgoing requests (copied); NULL = none */
	bool soft_placement;               /* a device that is missing falls back to the CPU */
};

struct worker;

/* The worker state (fragments, rendezvous, pooled clients). Owned
 * (worker_free) or NULL with *err set. */
struct worker *worker_new(const struct worker_config *cfg, struct dg_err *err);
/* Set this task's own address (once the port is bound): a _Send whose "to" is
 * this address is delivered in-process. Thread-safe. */
void worker_set_address(struct worker *w, const char *address);
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
 * step seconds, fragments held, tensors and bytes sent in-process and over
 * HTTP, tensors received over HTTP, tensors waiting) to out. w is a struct
 * worker (void * to fit ps_server_config.extra_metrics). Thread-safe. */
enum dg_status worker_metrics(void *w, struct dg_buf *out, struct dg_err *err);

/* The op lookup fragments are validated with: the worker ops first, then the
 * registry (dg_op_find). Usable as a dg_op_lookup_fn. Thread-safe. */
const struct dg_op_def *worker_op_find(const char *name);

/* Register a fragment (JSON text, doc/graph-format.md). id receives "f<N>"
 * (at least 24 bytes), *n_nodes its size (may be NULL). DG_EINVAL and friends
 * naming the node; DG_ETOOLARGE past WORKER_MAX_FRAGMENTS. Thread-safe. */
enum dg_status worker_fragment_add(struct worker *w, const char *json, size_t len, char *id,
				   size_t id_len, int *n_nodes, struct dg_err *err);
/* Forget a fragment (runs in progress finish first). DG_ENOTFOUND. */
enum dg_status worker_fragment_remove(struct worker *w, const char *id, struct dg_err *err);

/* Run every node of fragment id once for step, in-process (the master runs
 * the fragment placed on its own task this way; the HTTP route calls it too).
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
