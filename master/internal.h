/* Shared between master.c (routes, master state) and jobs.c (job table, step
 * driver): the master struct and the job functions the routes call. Not a
 * public header: only these two files include it. */
#ifndef MASTER_INTERNAL_H
#define MASTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>

#include "dg/buf.h"
#include "dg/master.h"
#include "dg/place.h"
#include "task.h"

struct job;

struct master {
	const struct dg_cluster *cluster;   /* borrowed */
	char *job;                          /* owned: this task's job */
	int task;                           /* index within the job */
	char *token;                        /* owned; NULL = none */
	bool soft_placement;
	struct worker *w;                   /* borrowed */
	struct mtask **tasks;               /* owned: per cluster task, its interface */
	struct dg_route_group group;
	pthread_mutex_t mu;                 /* guards jobs[], every job's mutable fields */
	pthread_cond_t cv;                  /* broadcast on any job event */
	struct job **jobs;                  /* owned array of MASTER_MAX_JOBS slots */
	int n_jobs;
	uint64_t next_job;
	uint64_t step_base;                 /* random high bits of this master's step ids */
	atomic_uint_fast64_t step_counter;
	bool closing;
	int n_threads;                      /* job threads running (detached) */
};

/* This task's index in cluster->tasks, or -1. */
int master_self(const struct master *m);

/* Create a job from a POST /v1/jobs body (borrowed): parse, place and
 * partition; start it unless the body says "start": false. *id receives the
 * job id (at least 16 bytes). Errors: DG_EINVAL and friends naming the node,
 * feed or fetch; DG_EUNAVAILABLE naming the address of a task that does not
 * answer. Thread-safe. */
enum dg_status master_job_submit(struct master *m, const json_t *body, char *id, size_t id_len,
				 struct dg_err *err);
/* Upload feed name of a created job (takes ownership of t, also on error). */
enum dg_status master_job_feed(struct master *m, const char *id, const char *name,
			       struct dg_tensor *t, struct dg_err *err);
/* Start a created job: health of its tasks, fragment registration, then the
 * steps in a thread of the job's own. */
enum dg_status master_job_start(struct master *m, const char *id, struct dg_err *err);
/* Status JSON (owned) or NULL with DG_ENOTFOUND. */
json_t *master_job_status(struct master *m, const char *id, bool full, struct dg_err *err);
/* All jobs' short status (owned). */
json_t *master_job_list(struct master *m);
/* Events from index from on (JSON lines appended to out), waiting up to
 * timeout_ms for one when there is none and the job is not over. *next gets
 * the index to ask from next time; *over whether the job has finished. */
enum dg_status master_job_events(struct master *m, const char *id, int64_t from,
				 int64_t timeout_ms, struct dg_buf *out, int64_t *next, bool *over,
				 struct dg_err *err);
/* A clone (owned) of fetched value name from the job's last step. */
enum dg_status master_job_result(struct master *m, const char *id, const char *name,
				 struct dg_tensor **out, struct dg_err *err);
/* The metrics CSV of a training job (doc/http-api.md, "Jobs") appended to
 * out. DG_ENOTFOUND for an unknown job or one without "training". */
enum dg_status master_job_metrics(struct master *m, const char *id, struct dg_buf *out,
				  struct dg_err *err);
/* Cancel: abort the running step on every task. DG_ENOTFOUND. */
enum dg_status master_job_cancel(struct master *m, const char *id, struct dg_err *err);
/* Join and free every job (master_free). */
void master_jobs_free(struct master *m);

#endif
