/* The master face of `dg server`: any task accepts a graph (POST /v1/jobs),
 * places and partitions it (dg/place.h), registers the fragments on the tasks,
 * and drives steps (feeds into rendezvous, every fragment run concurrently,
 * fetches taken from this task's rendezvous). Routes in doc/http-api.md
 * ("Executor and master"); rules in doc/graph-execution.md. */
#ifndef DG_MASTER_H
#define DG_MASTER_H

#include <stdbool.h>

#include "dg/cluster.h"
#include "dg/executor.h"
#include "dg/http.h"

#define MASTER_MAX_JOBS 256            /* kept in the table; oldest finished ones go first */
#define MASTER_MAX_STEPS 1000000000LL  /* per job */

struct master_config {
	const struct dg_cluster *cluster;  /* borrowed; must outlive the master */
	const char *job;                   /* this task (copied) */
	int task;
	const char *token;                 /* for requests to the other tasks (copied); NULL ok */
	bool soft_placement;               /* default for jobs that do not say */
	int64_t fragment_lease_ms;         /* lease of its fragments on other tasks: they
					    * are forgotten this long after it died;
					    * 0 = MASTER_FRAGMENT_LEASE_MS */
};
#define MASTER_FRAGMENT_LEASE_MS 60000

struct master;

/* The master state of one task. w (borrowed, must outlive the master) runs
 * the fragments placed on this task and owns the rendezvous the fetches
 * arrive in. Owned (master_free) or NULL with *err set (DG_EINVAL when the
 * task is not in the cluster). */
struct master *master_new(const struct master_config *cfg, struct worker *w,
			  struct dg_err *err);
/* The master routes (ctx = m), borrowed from m. */
const struct dg_route_group *master_route_group(struct master *m);
/* Cancel every running job and wake every event long-poll; later submissions
 * are refused. Call before stopping the HTTP server. Thread-safe. */
void master_cancel_all(struct master *m);
/* Cancel, join the job threads, free. The HTTP server serving the master
 * group must be stopped already. NULL is fine. */
void master_free(struct master *m);

#endif
