/* One task of the cluster as the master drives it: a small ops table with
 * two implementations, the master's own task (direct calls into worker/)
 * and a remote task (the typed client of the worker routes,
 * dg/task_client.h). The step driver, training runs and registration call
 * only these ops, so no code of master/ decides "this task or another" or
 * builds a request. Internal to master/. */
#ifndef MASTER_TASK_H
#define MASTER_TASK_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dg/cluster.h"
#include "dg/executor.h"
#include "dg/task_client.h"

struct mtask;
/* A kept connection to one task, used by one thread at a time (a fragment's
 * runner, a replica's thread); NULL until the first run makes it. */
struct mtask_conn;

/* Every op may fail with *err set; "lost" (may be NULL) as in
 * dg/task_client.h: the failure means the task itself is gone. */
/* The lease of the fragments a master registers on other tasks (worker/
 * executor.h): its owner string and period. Borrowed by the remote tasks. */
struct mtask_lease {
	char owner[128];                /* "host:port/nonce" of this master's run */
	int64_t lease_ms;
};

struct mtask_ops {
	/* Register the fragment doc (borrowed); id gets DG_FRAGMENT_ID_MAX bytes. */
	enum dg_status (*fragment_add)(struct mtask *t, const json_t *doc, char *id, bool *lost,
				       struct dg_err *err);
	/* Forget fragment id; best effort. */
	void (*fragment_remove)(struct mtask *t, const char *id);
	/* Run fragment id for run->steps steps (a plain one-step run when
	 * run->train_step < 0), over *conn (made on first use; conn NULL: a
	 * connection for this call only). out may be NULL. A failed multi-step
	 * run leaves nothing of its steps behind on the task. */
	enum dg_status (*run)(struct mtask *t, struct mtask_conn **conn, const char *id,
			      const struct dg_task_run *run, struct dg_task_run_result *out,
			      bool *lost, struct dg_err *err);
	/* Put a copy of v into the task's rendezvous as (step, key). */
	enum dg_status (*tensor_put)(struct mtask *t, uint64_t step, const char *key,
				     const struct dg_tensor *v, bool *lost, struct dg_err *err);
	/* Take (step, key) from the task's rendezvous, waiting up to timeout_ms. */
	enum dg_status (*tensor_take)(struct mtask *t, uint64_t step, const char *key,
				      int64_t timeout_ms, struct dg_tensor **out,
				      struct dg_err *err);
	/* Done with step..step+count-1 of this task's rendezvous: what a run left
	 * there is released (a remote task's runs release their own). */
	void (*finish)(struct mtask *t, uint64_t step, int64_t count);
	/* Abort steps step..step+count-1 there (waiters return at once); best effort. */
	void (*abort)(struct mtask *t, uint64_t step, int64_t count, const char *reason);
	/* Does the task answer its health route within timeout_ms? *out (out
	 * may be NULL) gets its health JSON (owned: bytes held, GPUs). */
	enum dg_status (*health)(struct mtask *t, long timeout_ms, json_t **out,
				 struct dg_err *err);
	void (*conn_free)(struct mtask_conn *c);
	void (*free)(struct mtask *t);
	/* Renew the leases of the fragments registered there (NULL: the
	 * master's own task, which dies with it). */
	enum dg_status (*renew)(struct mtask *t, long timeout_ms, struct dg_err *err);
};

struct mtask {
	const struct mtask_ops *ops;
	const struct dg_cluster *cl;    /* borrowed: its address is read at each use */
	int index;                      /* in cluster->tasks */
	bool local;                     /* the master's own task */
};

/* "task /job:worker/task:1 (127.0.0.1:2223)", by value: use .s within the
 * expression, or keep the struct. */
struct mtask_label {
	char s[200];
};

static inline struct mtask_label mtask_label(const struct mtask *t)
{
	struct mtask_label l;
	const struct dg_task_addr *ts = &t->cl->tasks[t->index];

	snprintf(l.s, sizeof l.s, "task /job:%s/task:%d (%s)", ts->job, ts->index, ts->address);
	return l;
}

/* The master's own task: w (borrowed) runs its fragments and owns the
 * rendezvous that fetched values arrive in. Its health JSON comes from its
 * own server's health route (what the server composes: ps bytes, GPUs), with
 * token (copied; NULL = none). */
struct mtask *mtask_local_new(const struct dg_cluster *cl, int index, struct worker *w,
			      const char *token, struct dg_err *err);
/* Task index of cl (borrowed, must outlive the task), reached over HTTP
 * with token (copied; NULL = none). home (borrowed, may be NULL) is the
 * master's own task: a one-step run names it as the requester, and the
 * tensors the run carries back (dg/task_client.h) are put into its
 * rendezvous before run returns. */
struct mtask *mtask_remote_new(const struct dg_cluster *cl, int index, const char *token,
			       struct mtask *home, const struct mtask_lease *lease,
			       struct dg_err *err);

static inline void mtask_free(struct mtask *t)
{
	if (t)
		t->ops->free(t);
}

/* Whether a failed run (st, lost) explains a step's failure better than the
 * one picked so far (best_st, best_lost): a task that stopped answering first
 * (the others only failed to reach it), then a node's own failure rather than
 * the cancellations it caused elsewhere. */
static inline bool mtask_failure_over(enum dg_status st, bool lost, enum dg_status best_st,
				      bool best_lost)
{
	return (!best_lost && lost) ||
	       (!best_lost && best_st == DG_ECANCELED && st != DG_ECANCELED);
}

/* Free *c (NULL fine) and clear it: the connection died with its task. */
static inline void mtask_conn_drop(struct mtask *t, struct mtask_conn **c)
{
	if (c && *c) {
		t->ops->conn_free(*c);
		*c = NULL;
	}
}

#endif
