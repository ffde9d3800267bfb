/* The job table and the step driver of the master: a submitted graph is
 * placed and partitioned (place.c), its fragments registered on their tasks
 * (in-process for this task, POST /v1/fragments for the others), and each step
 * runs every fragment concurrently (one thread and one HTTP client per remote
 * fragment), with feeds put into the tasks' rendezvous first and fetches taken
 * from this task's rendezvous afterwards. A failing fragment aborts the step
 * on every task at once, so no _Recv is left waiting for its deadline; a
 * step that failed because a task was lost is re-run once it is back. A
 * training job (doc/training.md) runs one thread per replica instead, each
 * running its fragment in chunks of steps, and a coordinator (train_main). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/buf.h"
#include "dg/client.h"
#include "dg/exec.h"
#include "dg/log.h"
#include "dg/train.h"
#include "internal.h"

enum job_state { JOB_CREATED, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELED };

static const char *const state_names[] = { "created", "running", "done", "failed", "canceled" };

#define JOB_MAX_EVENTS 4096        /* step events are thinned beyond this */
#define JOB_RUN_SLACK_MS 10000     /* HTTP deadline of a run = its _Recv deadline + this */
#define JOB_EXPLAIN_MAX_NODES 10000  /* larger graphs get a per-task summary */
#define JOB_TRAIN_EVENT_MS 500     /* at most one train event this often (and per epoch) */
#define JOB_CHUNK_MS 100           /* a replica's chunk of steps aims at this long */
#define JOB_TRAIN_POLL_MS 200      /* the training coordinator looks around this often */
#define JOB_RETRY_MS 30000         /* default "retry_ms": wait this long for a lost task */
#define JOB_MAX_RETRY_MS 3600000
#define JOB_MAX_RETRIES 3          /* re-runs of one step (or a replica's chunk) at most */
#define JOB_HEALTH_POLL_MS 200     /* a lost task's health is asked this often */
#define JOB_HEALTH_TIMEOUT_MS 1000 /* per health request while waiting for it */

struct train;

struct job {
	struct master *m;              /* borrowed */
	struct train *tr;              /* owned; NULL for a job without "training" */
	char id[16];
	int refs;                      /* guarded by m->mu, like every field below that changes */
	enum job_state state;
	int64_t steps, steps_done;
	int64_t timeout_ms;            /* _Recv deadline of each run */
	int64_t retry_ms;              /* wait for a lost task this long; 0 = fail at once */
	struct dg_graph *g;
	struct placement pl;
	struct partition part;
	char *explain;                 /* owned */
	struct dg_tensor **feeds;      /* per part.feeds entry; NULL until given */
	struct dg_tensor **results;    /* per fetch: the last step's values */
	struct dg_err err;             /* why the job failed */
	char **events;                 /* owned JSON lines */
	int n_events, cap_events;
	bool cancel;
	uint64_t cur_step;             /* 0 between steps */
	char (*frag_id)[24];           /* per part.frags: id on its task, "" = not registered */
	char (*init_id)[24];           /* per part.init */
	struct mtask_conn **conns;     /* per part.frags: used only by that fragment's runner */
	double t_created, t_started, t_finished, step_ms_sum, step_ms_last;   /* ms */
};

/* One replica of a training job (doc/training.md, "Replication"): its graph
 * placed and cut into one step fragment on its compute task, run in chunks of
 * steps by a thread of its own (train_replica_main). */
struct replica {
	int task;                      /* cluster task index */
	struct dg_graph *g;
	struct placement pl;
	struct partition part;         /* frags[0]: the step fragment; init: VarInit */
	char frag_id[24];              /* "" = not registered */
	char (*init_id)[24];           /* per part.init; registered for replica 0 only */
	struct mtask_conn *conn;       /* used only by the replica's thread */
	/* Guarded by m->mu: */
	int64_t done;                  /* training steps run */
	uint64_t cur_step;             /* first step id of the chunk in flight; 0 = none */
	int64_t cur_count;
	bool finished;                 /* its thread is over (st, err say how) */
	enum dg_status st;
	struct dg_err err;
};

/* The training side of a job: spec, plan, replicas, and the running figures
 * the events, the status and the metrics CSV are made of (guarded by m->mu). */
struct train {
	struct train_spec spec;
	struct train_plan plan;
	struct replica *reps;          /* plan.n_replicas */
	int n_reps;
	int n_collect;                 /* loss + metrics */
	const char **collect;          /* borrowed from reps[r].part.fetch_keys (same for all r) */
	int n_vars;                    /* trained variables */
	char **var_name;               /* owned: name on the ps */
	int *var_task;                 /* cluster task holding it */
	int64_t *var_base;             /* sync step when training started */
	int64_t steps;                 /* per replica */
	int64_t spe;                   /* steps per epoch; 0 = no epochs */
	int64_t epochs;                /* 0 when there are no epochs */
	int64_t eval_every;            /* replica 0 steps between evals; 0 = only at the end */
	int64_t evaluated;             /* async: the last eval boundary (steps) evaluated */
	bool stop;                     /* replicas leave at their next chunk */
	char stop_reason[256];         /* why, for the aborts of the chunks in flight */
	bool failed;                   /* a replica failed: the others were aborted */
	double t0;                     /* ms when the replicas started */
	double sum_loss, *sum_metric;  /* since the last train event */
	int64_t n_agg;
	double loss, *metric;          /* last train event's values (NAN: none yet) */
	double *eval;                  /* per eval fetch: last eval's value (NAN: none) */
	bool have_eval;
	int64_t stale;
	double last_event_ms;
	int64_t last_event_step;       /* its mean step (rows have increasing steps) */
	bool final_reported;           /* the last train row is out: no more after it */
	double chunk_ms_sum;           /* time of the chunks done, all replicas: with the
					* steps done it gives the mean step time */
	int64_t epochs_reported;       /* epochs whose end had a train event */
	double examples_per_s;
	struct dg_buf csv;             /* GET /v1/jobs/ID/metrics */
};

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int master_self(const struct master *m)
{
	for (int i = 0; i < m->cluster->n_tasks; i++)
		if (m->cluster->tasks[i].index == m->task &&
		    strcmp(m->cluster->tasks[i].job, m->job) == 0)
			return i;
	return -1;
}

/* "task /job:worker/task:1 (127.0.0.1:2223)" */
static const char *task_label(const struct master *m, int t)
{
	return m->tasks[t]->label;
}

/* ------------------------------------------------------------ the table */

static void train_free(struct master *m, struct train *tr);

static void job_free(struct job *j)
{
	if (!j)
		return;
	train_free(j->m, j->tr);
	for (int i = 0; j->feeds && i < j->part.n_feeds; i++)
		dg_tensor_free(j->feeds[i]);
	for (int i = 0; j->results && i < j->part.n_fetch; i++)
		dg_tensor_free(j->results[i]);
	for (int i = 0; j->conns && i < j->part.n_frags; i++)
		mtask_conn_drop(j->m->tasks[j->part.frags[i].task], &j->conns[i]);
	for (int i = 0; i < j->n_events; i++)
		free(j->events[i]);
	free(j->events);
	free(j->feeds);
	free(j->results);
	free(j->conns);
	free(j->frag_id);
	free(j->init_id);
	free(j->explain);
	partition_deinit(&j->part);
	placement_deinit(&j->pl);
	dg_graph_free(j->g);
	free(j);
}

/* Find job id and take a reference (job_put). NULL with DG_ENOTFOUND. */
static struct job *job_get(struct master *m, const char *id, struct dg_err *err)
{
	struct job *j = NULL;

	pthread_mutex_lock(&m->mu);
	for (int i = 0; i < m->n_jobs && !j; i++)
		if (strcmp(m->jobs[i]->id, id) == 0)
			j = m->jobs[i];
	if (j)
		j->refs++;
	pthread_mutex_unlock(&m->mu);
	if (!j) {
		dg_err_set(err, DG_ENOTFOUND, "job '%.64s' not found on this master", id);
		dg_err_hint(err, "list jobs with: curl http://HOST:PORT/v1/jobs");
	}
	return j;
}

static void job_put_locked(struct job *j)
{
	if (j && --j->refs == 0)
		job_free(j);
}

static void job_put(struct master *m, struct job *j)
{
	pthread_mutex_lock(&m->mu);
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
}

static bool job_over(const struct job *j)
{
	return j->state == JOB_DONE || j->state == JOB_FAILED || j->state == JOB_CANCELED;
}

/* Add j to the table (the table holds a reference), evicting the oldest
 * finished job when full. Called with m->mu held. */
static enum dg_status table_add(struct master *m, struct job *j, struct dg_err *err)
{
	if (m->closing)
		return dg_err_set(err, DG_EUNAVAILABLE, "this server is shutting down; submit the "
				  "job to another task");
	if (m->n_jobs == MASTER_MAX_JOBS) {
		int victim = -1;
		for (int i = 0; i < m->n_jobs && victim < 0; i++)
			if (job_over(m->jobs[i]))
				victim = i;
		if (victim < 0) {
			dg_err_set(err, DG_ETOOLARGE, "%d jobs are running or waiting on this "
				   "master", MASTER_MAX_JOBS);
			dg_err_hint(err, "wait for some to finish or cancel them");
			return DG_ETOOLARGE;
		}
		job_put_locked(m->jobs[victim]);
		memmove(&m->jobs[victim], &m->jobs[victim + 1],
			(size_t)(m->n_jobs - victim - 1) * sizeof *m->jobs);
		m->n_jobs--;
	}
	snprintf(j->id, sizeof j->id, "j%" PRIu64, ++m->next_job);
	j->refs++;
	m->jobs[m->n_jobs++] = j;
	return DG_OK;
}

/* Append one JSON line (takes v) to the job's log and wake the long-polls.
 * Called with m->mu held. */
static void add_event_locked(struct master *m, struct job *j, json_t *v)
{
	char *line;

	if (!v)
		return;
	json_object_set_new(v, "job", json_string(j->id));
	line = json_dumps(v, JSON_COMPACT);
	json_decref(v);
	if (!line)
		return;
	if (j->n_events == j->cap_events) {
		int cap = j->cap_events ? j->cap_events * 2 : 16;
		char **e = realloc(j->events, (size_t)cap * sizeof *e);
		if (!e) {
			free(line);
			return;
		}
		j->events = e;
		j->cap_events = cap;
	}
	j->events[j->n_events++] = line;
	pthread_cond_broadcast(&m->cv);
}

static json_t *err_json(const struct dg_err *e)
{
	return json_pack("{s:s, s:s, s:s}", "code", dg_status_name(e->code), "message", e->msg,
			 "hint", e->hint);
}

/* The job is over: record the final state, its event, and wake waiters. */
static void finish_job(struct master *m, struct job *j, enum dg_status st,
		       const struct dg_err *err)
{
	pthread_mutex_lock(&m->mu);
	j->t_finished = now_ms();
	if (st == DG_OK) {
		j->state = JOB_DONE;
	} else if (j->cancel) {
		j->state = JOB_CANCELED;
		dg_err_set(&j->err, DG_ECANCELED, "job %s was canceled", j->id);
	} else {
		j->state = JOB_FAILED;
		j->err = *err;
	}
	json_t *ev = json_pack("{s:s, s:I, s:f}", "event", state_names[j->state],
			       "steps_done", (json_int_t)j->steps_done,
			       "ms", j->t_finished - j->t_started);
	if (ev && j->state != JOB_DONE)
		json_object_set_new(ev, "error", err_json(&j->err));
	add_event_locked(m, j, ev);
	pthread_mutex_unlock(&m->mu);
	if (j->state == JOB_FAILED)
		dg_log(DG_LOG_WARN, "master", "job %s failed: %s", j->id, j->err.msg);
}

/* ------------------------------------------------------------ requests */

/* Mark in used[] (per cluster task) the tasks the job has fragments on: its
 * step and init fragments, and a training job's replicas. */
static void job_tasks(const struct job *j, bool *used)
{
	for (int i = 0; i < j->part.n_frags; i++)
		used[j->part.frags[i].task] = true;
	for (int i = 0; i < j->part.n_init; i++)
		used[j->part.init[i].task] = true;
	for (int r = 0; j->tr && r < j->tr->n_reps; r++) {
		const struct partition *p = &j->tr->reps[r].part;
		for (int i = 0; i < p->n_frags; i++)
			used[p->frags[i].task] = true;
		for (int i = 0; i < p->n_init; i++)
			used[p->init[i].task] = true;
	}
}

/* Abort step on every task in the job's fragments and in this task's
 * rendezvous. Best effort: a task that is down has nothing to release. */
static void abort_everywhere(struct master *m, struct job *j, uint64_t step, const char *reason)
{
	int self = master_self(m);
	bool *used = calloc((size_t)m->cluster->n_tasks + 1, sizeof *used);

	if (self >= 0)
		m->tasks[self]->ops->abort(m->tasks[self], step, 1, reason);
	if (!used)
		return;
	job_tasks(j, used);
	for (int t = 0; t < m->cluster->n_tasks; t++)
		if (used[t] && t != self)
			m->tasks[t]->ops->abort(m->tasks[t], step, 1, reason);
	free(used);
}

/* Register fragment f on its task; id receives its id there. */
static enum dg_status register_frag(struct master *m, const struct place_fragment *f, char *id,
				    struct dg_err *err)
{
	struct mtask *t = m->tasks[f->task];
	enum dg_status st = t->ops->fragment_add(t, f->doc, id, NULL, err);

	if (st != DG_OK)
		dg_err_prefix(err, "registering a fragment on %s", t->label);
	return st;
}

/* Remove fragment id (registered on task t); best effort. */
static void unregister_one(struct master *m, int t, char *id)
{
	if (!id[0])
		return;
	m->tasks[t]->ops->fragment_remove(m->tasks[t], id);
	id[0] = '\0';
}

static void unregister_all(struct master *m, struct job *j)
{
	for (int r = 0; j->tr && r < j->tr->n_reps; r++) {
		struct replica *rp = &j->tr->reps[r];
		if (rp->part.n_frags > 0)
			unregister_one(m, rp->part.frags[0].task, rp->frag_id);
		for (int i = 0; rp->init_id && i < rp->part.n_init; i++)
			unregister_one(m, rp->part.init[i].task, rp->init_id[i]);
	}
	for (int i = 0; i < j->part.n_frags; i++)
		unregister_one(m, j->part.frags[i].task, j->frag_id[i]);
	for (int i = 0; i < j->part.n_init; i++)
		unregister_one(m, j->part.init[i].task, j->init_id[i]);
}

/* ------------------------------------------------------------ one step */

struct runner {
	struct master *m;
	struct job *j;
	const struct place_fragment *f;
	const char *id;
	struct mtask_conn **conn;         /* this fragment's kept connection; NULL = make one */
	uint64_t step;
	atomic_bool *failed;
	bool unreachable;                 /* the task is lost (dg/task_client.h): died or
					   * restarted */
	enum dg_status st;
	struct dg_err err;
};

static void *run_fragment(void *arg)
{
	struct runner *r = arg;
	struct mtask *t = r->m->tasks[r->f->task];
	const struct dg_task_run run = { .step = r->step, .steps = 1, .train_step = -1,
					 .timeout_ms = r->j->timeout_ms };
	char reason[300];

	r->st = t->ops->run(t, r->conn, r->id, &run, NULL, &r->unreachable, &r->err);
	if (r->st == DG_OK)
		return NULL;
	/* Name the task unless the executor already did ("task worker/1: node ..."). */
	if (strncmp(r->err.msg, "task ", 5) != 0)
		dg_err_prefix(&r->err, "%s", t->label);
	/* The first failure releases every other task's waits at once. */
	if (!atomic_exchange(r->failed, true)) {
		snprintf(reason, sizeof reason, "%s", r->err.msg);
		abort_everywhere(r->m, r->j, r->step, reason);
	}
	return NULL;
}

/* Put the job's feeds for step into the rendezvous of the tasks that read
 * them. *down gets a task that is lost when that is why it failed. */
static enum dg_status put_feeds(struct master *m, struct job *j, uint64_t step, int *down,
				struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int i = 0; st == DG_OK && i < j->part.n_feeds; i++) {
		const struct place_feed *pf = &j->part.feeds[i];
		bool lost = false;
		if (pf->task < 0)
			continue;
		struct mtask *t = m->tasks[pf->task];
		st = t->ops->tensor_put(t, step, pf->key, j->feeds[i], &lost, err);
		if (lost)
			*down = pf->task;
		if (st != DG_OK && !t->local)
			dg_err_prefix(err, "sending feed '%s' to %s", pf->ref, t->label);
	}
	return st;
}

/* Pick the error that explains a failed step: a task that stopped answering
 * first (the others only failed to reach it), then a node's own failure
 * rather than the cancellations it caused elsewhere. */
static const struct runner *primary_failure(const struct runner *rs, int n)
{
	const struct runner *best = NULL;

	for (int i = 0; i < n; i++) {
		if (rs[i].st == DG_OK)
			continue;
		if (!best || (!best->unreachable && rs[i].unreachable) ||
		    (!best->unreachable && best->st == DG_ECANCELED && rs[i].st != DG_ECANCELED))
			best = &rs[i];
	}
	return best;
}

/* Run one step of the n fragments frags (registered as ids) with a fresh
 * cluster-unique step id; unless init, put the feeds first and take the
 * fetched values into j->results. conns: per fragment kept connections or
 * NULL. On failure *down (when not NULL) gets the task that was lost if that
 * explains the failure, else stays -1. */
static enum dg_status run_frags(struct master *m, struct job *j,
				const struct place_fragment *frags, char (*ids)[24], int n,
				struct mtask_conn **conns, bool init, int *down,
				struct dg_err *err)
{
	struct mtask *self = m->tasks[master_self(m)];
	uint64_t step = m->step_base | (atomic_fetch_add(&m->step_counter, 1) + 1);
	struct runner *rs = calloc((size_t)n + 1, sizeof *rs);
	pthread_t *th = calloc((size_t)n + 1, sizeof *th);
	bool *started = calloc((size_t)n + 1, sizeof *started);
	atomic_bool failed = false;
	enum dg_status st = DG_OK;
	int lost = -1;

	if (!rs || !th || !started) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	pthread_mutex_lock(&m->mu);
	j->cur_step = step;
	if (j->cancel)
		st = dg_err_set(err, DG_ECANCELED, "job %s was canceled", j->id);
	pthread_mutex_unlock(&m->mu);
	if (st == DG_OK && !init)
		st = put_feeds(m, j, step, &lost, err);
	for (int i = 0; st == DG_OK && i < n; i++) {
		rs[i] = (struct runner){ .m = m, .j = j, .f = &frags[i], .step = step,
					 .id = ids[i], .conn = conns ? &conns[i] : NULL,
					 .failed = &failed };
		/* The last fragment runs on this thread: one thread fewer per step. */
		if (i == n - 1)
			run_fragment(&rs[i]);
		else if (pthread_create(&th[i], NULL, run_fragment, &rs[i]) == 0)
			started[i] = true;
		else
			run_fragment(&rs[i]);
	}
	for (int i = 0; i < n; i++)
		if (started[i])
			pthread_join(th[i], NULL);
	if (st == DG_OK && atomic_load(&failed)) {
		const struct runner *r = primary_failure(rs, n);
		*err = r->err;
		st = r->st;
		if (r->unreachable)
			lost = r->f->task;
	}
	for (int i = 0; st == DG_OK && !init && i < j->part.n_fetch; i++) {
		struct dg_tensor *t = NULL;
		st = self->ops->tensor_take(self, step, j->part.fetch_keys[i], 5000, &t, err);
		if (st != DG_OK) {
			dg_err_prefix(err, "taking fetched value");
			break;
		}
		pthread_mutex_lock(&m->mu);
		dg_tensor_free(j->results[i]);
		j->results[i] = t;
		pthread_mutex_unlock(&m->mu);
	}
	if (st != DG_OK && !atomic_load(&failed))
		abort_everywhere(m, j, step, err->msg);
	self->ops->finish(self, step, 1);
out:
	pthread_mutex_lock(&m->mu);
	j->cur_step = 0;
	pthread_mutex_unlock(&m->mu);
	free(rs);
	free(th);
	free(started);
	if (down)
		*down = st != DG_OK ? lost : -1;
	return st;
}

/* Whether the job is stopping for replica (or for the job's own steps and
 * evals when replica < 0): canceled, the master closing, or, for a replica,
 * the replicas told to stop. Called with m->mu held. */
static bool job_stopping_locked(const struct master *m, const struct job *j, int replica)
{
	return j->cancel || m->closing || (replica >= 0 && j->tr && j->tr->stop);
}

/* Wait on m->cv (held) for up to ms milliseconds. */
static void wait_locked(struct master *m, double ms)
{
	struct timespec dl;
	long long ns = (long long)(ms * 1e6);

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += (time_t)(ns / 1000000000);
	dl.tv_nsec += (long)(ns % 1000000000);
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&m->cv, &m->mu, &dl);
}

/* Step k of the job (a replica's training step when replica >= 0) failed with
 * *err because task t was lost (task_lost). attempt: re-runs of that step so
 * far. Unless retries are off ("retry_ms": 0), used up (JOB_MAX_RETRIES) or
 * the job is stopping: a "retry" event, then wait up to retry_ms for the task
 * to answer GET /v1/health again. DG_OK: the caller re-registers the task's
 * fragments and re-runs the step. Otherwise *err says why not, naming the
 * task (it did not come back, or kept failing); stopping keeps *err. */
static enum dg_status retry_wait(struct master *m, struct job *j, int t, int64_t k, int attempt,
				 int replica, struct dg_err *err)
{
	double deadline = now_ms() + (double)j->retry_ms;
	char dev[128], first[sizeof err->msg];
	const char *label = task_label(m, t);
	const char *why = err->msg;
	struct dg_err e = { 0 };
	bool stop;

	if (j->retry_ms == 0)
		return err->code;
	place_device_name(m->cluster, t, dev, sizeof dev);
	/* The step's error usually starts with the label already: say it once. */
	if (strncmp(why, label, strlen(label)) == 0 && strncmp(why + strlen(label), ": ", 2) == 0)
		why += strlen(label) + 2;
	snprintf(first, sizeof first, "%s", why);
	if (attempt >= JOB_MAX_RETRIES) {
		dg_err_set(err, DG_EUNAVAILABLE, "%s kept failing: step %" PRId64 " failed %d "
			   "times; the last time: %s", label, k, attempt + 1, first);
		dg_err_hint(err, "look at that task's log (it keeps dying or restarting)");
		return DG_EUNAVAILABLE;
	}
	pthread_mutex_lock(&m->mu);
	stop = job_stopping_locked(m, j, replica);
	if (!stop) {
		json_t *ev = json_pack("{s:s, s:s, s:I, s:i, s:s}", "event", "retry", "task", dev,
				       "step", (json_int_t)k, "attempt", attempt + 1, "error",
				       first);
		if (ev && replica >= 0)
			json_object_set_new(ev, "replica", json_integer(replica));
		add_event_locked(m, j, ev);
	}
	pthread_mutex_unlock(&m->mu);
	if (stop)
		return err->code;
	dg_log(DG_LOG_WARN, "master", "job %s: step %" PRId64 " failed because %s was lost (%s); "
	       "waiting up to %" PRId64 " ms for it to come back", j->id, k, label, first,
	       j->retry_ms);
	for (;;) {
		if (m->tasks[t]->ops->health(m->tasks[t], JOB_HEALTH_TIMEOUT_MS, NULL, &e) ==
		    DG_OK)
			return DG_OK;
		pthread_mutex_lock(&m->mu);
		double left = deadline - now_ms();
		if (!job_stopping_locked(m, j, replica) && left > 0)
			wait_locked(m, left < JOB_HEALTH_POLL_MS ? left : JOB_HEALTH_POLL_MS);
		stop = job_stopping_locked(m, j, replica);
		pthread_mutex_unlock(&m->mu);
		if (stop)
			return err->code;
		if (now_ms() >= deadline)
			break;
	}
	dg_err_set(err, DG_EUNAVAILABLE, "%s did not come back within %" PRId64 " ms after step "
		   "%" PRId64 " failed: %s", label, j->retry_ms, k, first);
	dg_err_hint(err, "restart it at the same address (dg server --job %s --task %d), or "
		    "give the job a longer retry_ms", m->cluster->tasks[t].job,
		    m->cluster->tasks[t].index);
	return DG_EUNAVAILABLE;
}

/* Register fragment f again on task t after the task was lost: the old id
 * (removed first: a task that only dropped a connection still has it) is
 * replaced in id, and the kept connection (it is dead) dropped. conn may be
 * NULL. */
static enum dg_status reregister(struct master *m, const struct place_fragment *f, char *id,
				 struct mtask_conn **conn, struct dg_err *err)
{
	unregister_one(m, f->task, id);
	mtask_conn_drop(m->tasks[f->task], conn);
	return register_frag(m, f, id, err);
}

/* The init fragments once (no retry: they run before any step). */
static enum dg_status run_init(struct master *m, struct job *j, struct dg_err *err)
{
	return run_frags(m, j, j->part.init, j->init_id, j->part.n_init, NULL, true, NULL, err);
}

/* One step (the job's k-th) of the job's step fragments, re-run on a new step
 * id when a task was lost and came back (retry_wait), its fragments
 * registered again. */
static enum dg_status run_step(struct master *m, struct job *j, int64_t k, struct dg_err *err)
{
	int down = -1;
	enum dg_status st = run_frags(m, j, j->part.frags, j->frag_id, j->part.n_frags,
				      j->conns, false, &down, err);

	for (int attempt = 0; st != DG_OK && down >= 0; attempt++) {
		int t = down;
		if ((st = retry_wait(m, j, t, k, attempt, -1, err)) != DG_OK)
			return st;
		down = -1;
		for (int i = 0; st == DG_OK && i < j->part.n_frags; i++)
			if (j->part.frags[i].task == t)
				st = reregister(m, &j->part.frags[i], j->frag_id[i], &j->conns[i],
						err);
		if (st != DG_OK) {
			/* Lost again while registering: that counts as a failed run. */
			if (st == DG_EUNAVAILABLE)
				down = t;
			continue;
		}
		st = run_frags(m, j, j->part.frags, j->frag_id, j->part.n_frags, j->conns,
			       false, &down, err);
	}
	return st;
}

static bool want_step_event(int64_t k, int64_t steps)
{
	int64_t every = steps / (JOB_MAX_EVENTS / 2);

	return steps <= JOB_MAX_EVENTS / 2 || k == steps || k % (every ? every : 1) == 0;
}

static void *job_main(void *arg)
{
	struct job *j = arg;
	struct master *m = j->m;
	struct dg_err err = { 0 };
	enum dg_status st = DG_OK;

	if (j->part.n_init > 0) {
		st = run_init(m, j, &err);
		if (st != DG_OK)
			dg_err_prefix(&err, "initialising variables");
	}
	for (int64_t k = 1; st == DG_OK && k <= j->steps; k++) {
		double t0 = now_ms();
		st = run_step(m, j, k, &err);
		if (st != DG_OK)
			break;
		double ms = now_ms() - t0;
		pthread_mutex_lock(&m->mu);
		j->steps_done = k;
		j->step_ms_last = ms;
		j->step_ms_sum += ms;
		if (want_step_event(k, j->steps))
			add_event_locked(m, j, json_pack("{s:s, s:I, s:I, s:f}", "event", "step",
							 "step", (json_int_t)k, "of",
							 (json_int_t)j->steps, "ms", ms));
		pthread_mutex_unlock(&m->mu);
	}
	unregister_all(m, j);
	finish_job(m, j, st, &err);
	/* Last touch of m: master_free waits for n_threads to reach 0. */
	pthread_mutex_lock(&m->mu);
	job_put_locked(j);
	m->n_threads--;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

/* ------------------------------------------------------------ training: run */

/* A number for JSON: null when not finite (jansson refuses NaN and inf). */
static json_t *num_json(double x)
{
	return isfinite(x) ? json_real(x) : json_null();
}

/* A CSV cell: empty when not finite. */
static void csv_num(struct dg_buf *b, double x, bool comma)
{
	if (comma)
		dg_buf_printf(b, NULL, ",");
	if (isfinite(x))
		dg_buf_printf(b, NULL, "%.9g", x);
}

/* The 1-based epoch a replica that ran done steps is in (the one just
 * finished at a boundary); 0 without epochs. */
static int64_t train_epoch(const struct train *tr, int64_t done)
{
	int64_t e;

	if (tr->spe <= 0)
		return 0;
	e = (done + tr->spe - 1) / tr->spe;
	if (e < 1)
		e = 1;
	return tr->epochs > 0 && e > tr->epochs ? tr->epochs : e;
}

/* Training steps done, summed over the replicas, and their mean. Locked. */
static int64_t train_done_locked(const struct train *tr, int64_t *mean)
{
	int64_t sum = 0;

	for (int r = 0; r < tr->n_reps; r++)
		sum += tr->reps[r].done;
	*mean = tr->n_reps ? sum / tr->n_reps : 0;
	return sum;
}

/* A "train" event and a metrics row, at most every JOB_TRAIN_EVENT_MS, at each
 * epoch's end (of the mean replica progress) and when forced (the last one).
 * The loss and metrics are the means over the steps since the previous event,
 * all replicas together. Called with m->mu held. */
static void train_event_locked(struct master *m, struct job *j, bool force)
{
	struct train *tr = j->tr;
	double now = now_ms(), elapsed, xps;
	int64_t mean, sum = train_done_locked(tr, &mean), examples;
	int64_t ep_done = tr->spe > 0 ? mean / tr->spe : 0;
	bool epoch_end = tr->spe > 0 && ep_done > tr->epochs_reported;
	json_t *ev, *metrics;

	if (job_over(j) || tr->final_reported ||
	    (!force && !epoch_end && now - tr->last_event_ms < JOB_TRAIN_EVENT_MS))
		return;
	/* One row per step: the steps since an event at this same mean step are
	 * reported with the next one, and none after the final row (a straggler's
	 * chunk, with backups). */
	if (force)
		tr->final_reported = true;
	if (mean <= tr->last_event_step || (tr->n_agg == 0 && !force))
		return;
	if (tr->n_agg > 0) {
		tr->loss = tr->sum_loss / (double)tr->n_agg;
		for (int i = 0; i < tr->n_collect - 1; i++)
			tr->metric[i] = tr->sum_metric[i] / (double)tr->n_agg;
	}
	tr->sum_loss = 0;
	for (int i = 0; i < tr->n_collect - 1; i++)
		tr->sum_metric[i] = 0;
	tr->n_agg = 0;
	if (epoch_end)
		tr->epochs_reported = ep_done;
	tr->last_event_ms = now;
	tr->last_event_step = mean;
	elapsed = (now - tr->t0) / 1e3;
	examples = sum * tr->plan.examples_per_step;
	xps = elapsed > 0 ? (double)examples / elapsed : 0.0;
	tr->examples_per_s = xps;
	j->steps_done = mean;
	metrics = json_object();
	for (int i = 0; i < tr->n_collect - 1; i++)
		json_object_set_new(metrics, tr->spec.metrics[i], num_json(tr->metric[i]));
	ev = json_pack("{s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:I, s:o, s:o, s:o}",
		       "event", "train", "epoch", (json_int_t)train_epoch(tr, mean),
		       "epochs", (json_int_t)tr->epochs, "step", (json_int_t)mean,
		       "steps", (json_int_t)tr->steps, "loss", num_json(tr->loss),
		       "metrics", metrics, "examples", (json_int_t)examples,
		       "examples_per_s", num_json(xps), "elapsed_s", num_json(elapsed),
		       "eta_s", mean > 0 ? num_json(elapsed * (double)(tr->steps - mean) /
						    (double)mean) : json_null());
	add_event_locked(m, j, ev);
	dg_buf_printf(&tr->csv, NULL, "%" PRId64 ",%.3f,%" PRId64, mean, elapsed,
		      train_epoch(tr, mean));
	csv_num(&tr->csv, tr->loss, true);
	for (int i = 0; i < tr->n_collect - 1; i++)
		csv_num(&tr->csv, tr->metric[i], true);
	csv_num(&tr->csv, xps, true);
	for (int i = 0; i < j->part.n_fetch; i++)
		dg_buf_printf(&tr->csv, NULL, ",");
	dg_buf_printf(&tr->csv, NULL, "\n");
}

/* Run the eval fragments once (a one-step run like an ordinary job's: the
 * fetched values land in j->results) and report them for epoch (replica 0's)
 * at the mean replica step, like the train events (the CSV's steps grow). */
static enum dg_status train_eval(struct master *m, struct job *j, int64_t epoch,
				 struct dg_err *err)
{
	struct train *tr = j->tr;
	enum dg_status st;
	int64_t step;
	json_t *vals;

	if (j->part.n_frags == 0)
		return DG_OK;
	pthread_mutex_lock(&m->mu);
	train_done_locked(tr, &step);
	pthread_mutex_unlock(&m->mu);
	if ((st = run_step(m, j, step, err)) != DG_OK) {
		dg_err_prefix(err, "evaluating");
		return st;
	}
	pthread_mutex_lock(&m->mu);
	train_done_locked(tr, &step);
	vals = json_object();
	for (int i = 0; i < j->part.n_fetch; i++) {
		const struct dg_tensor *t = j->results[i];
		/* Only one-element values make a number; larger ones stay in results. */
		tr->eval[i] = t && t->numel == 1 ? dg_tensor_get_f64(t, 0) : NAN;
		json_object_set_new(vals, j->part.fetch_keys[i] + 6, num_json(tr->eval[i]));
	}
	tr->have_eval = true;
	add_event_locked(m, j, json_pack("{s:s, s:I, s:I, s:o}", "event", "eval", "epoch",
					 (json_int_t)epoch, "step", (json_int_t)step, "values",
					 vals));
	dg_buf_printf(&tr->csv, NULL, "%" PRId64 ",%.3f,%" PRId64 ",", step,
		      (now_ms() - tr->t0) / 1e3, epoch);
	for (int i = 0; i < tr->n_collect - 1; i++)
		dg_buf_printf(&tr->csv, NULL, ",");
	dg_buf_printf(&tr->csv, NULL, ",");
	for (int i = 0; i < j->part.n_fetch; i++)
		csv_num(&tr->csv, tr->eval[i], true);
	dg_buf_printf(&tr->csv, NULL, "\n");
	pthread_mutex_unlock(&m->mu);
	return DG_OK;
}

/* Run steps step..step+k-1 (training steps t0...) of the replica's fragment
 * on its task, over the replica's kept connection. *lost: the failure was the
 * task's loss. */
static enum dg_status run_chunk(struct master *m, struct job *j, struct replica *rp,
				const char *id, uint64_t step, int64_t k, int64_t t0,
				struct dg_task_run_result *c, bool *lost, struct dg_err *err)
{
	const struct train *tr = j->tr;
	const struct dg_task_run run = { .step = step, .steps = k, .train_step = t0,
					 .timeout_ms = j->timeout_ms, .collect = tr->collect,
					 .n_collect = tr->n_collect };
	struct mtask *t = m->tasks[rp->task];

	return t->ops->run(t, &rp->conn, id, &run, c, lost, err);
}

/* Abort the chunk in flight on task t (steps step..step+count-1). Best effort. */
static void abort_chunk(struct master *m, int t, uint64_t step, int64_t count,
			const char *reason)
{
	m->tasks[t]->ops->abort(m->tasks[t], step, count, reason);
}

/* Steps for the replica's next chunk: k (adapted to ~JOB_CHUNK_MS), cut at
 * its last step, at epoch ends (so each epoch ends with an event) and at the
 * next eval (replica 0; every replica of an async job with eval.barrier, see
 * train_eval_barrier). */
static int64_t chunk_size(const struct train *tr, int r, int64_t done, int64_t k)
{
	int64_t n = k < tr->steps - done ? k : tr->steps - done;

	if (tr->spe > 0 && n > tr->spe - done % tr->spe)
		n = tr->spe - done % tr->spe;
	if ((r == 0 || (!tr->spec.sync && tr->spec.eval_barrier)) && tr->eval_every > 0 &&
	    n > tr->eval_every - done % tr->eval_every)
		n = tr->eval_every - done % tr->eval_every;
	return n < 1 ? 1 : n;
}

/* Async with eval.barrier: replica r is at eval boundary done (a multiple of
 * eval_every). Every
 * replica waits there until replica 0 has evaluated it, and replica 0
 * evaluates once every other replica reached it (or finished, or the job
 * stops), so the eval sees exactly done steps of every replica, as a sync
 * job's does. Without it (the default: the wait costs examples/s) the others
 * train on during the eval: the epoch-1 eval of examples/mlp.json (2 workers)
 * sees 1.1-1.3 epochs. */
static enum dg_status train_eval_barrier(struct master *m, struct job *j, int r, int64_t done,
					 struct dg_err *err)
{
	struct train *tr = j->tr;
	enum dg_status st = DG_OK;
	bool go = false, stop = false;

	pthread_mutex_lock(&m->mu);
	while (!go && !(stop = j->cancel || tr->stop)) {
		go = r == 0 || tr->evaluated >= done || tr->reps[0].finished;
		for (int q = 1; r == 0 && q < tr->n_reps; q++)
			if (!tr->reps[q].finished && tr->reps[q].done < done)
				go = false;
		if (!go)
			wait_locked(m, JOB_TRAIN_POLL_MS);
	}
	pthread_mutex_unlock(&m->mu);
	if (r != 0 || stop)
		return DG_OK;
	st = train_eval(m, j, train_epoch(tr, done), err);
	pthread_mutex_lock(&m->mu);
	tr->evaluated = done;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	return st;
}

struct replica_arg {
	struct job *j;
	int r;
};

/* The replica's step fragment registered again on its task after it was
 * lost (reregister); id (the thread's copy) and rp->frag_id get the new id. */
static enum dg_status replica_reregister(struct master *m, struct replica *rp, char *id,
					 struct dg_err *err)
{
	enum dg_status st = reregister(m, &rp->part.frags[0], id, &rp->conn, err);

	pthread_mutex_lock(&m->mu);
	snprintf(rp->frag_id, sizeof rp->frag_id, "%s", id);
	pthread_mutex_unlock(&m->mu);
	return st;
}

/* One replica: chunks of steps until it ran tr->steps, the job stops, or a
 * chunk fails. Holds a job reference and counts in m->n_threads (a replica
 * left behind on a stopped task ends when its request times out). */
static void *train_replica_main(void *arg)
{
	struct replica_arg *a = arg;
	struct job *j = a->j;
	struct master *m = j->m;
	struct train *tr = j->tr;
	struct replica *rp = &tr->reps[a->r];
	int r = a->r, attempt = 0;
	int64_t k = 1, done = 0;
	enum dg_status st = DG_OK;
	struct dg_err err = { 0 };
	char id[24];

	free(a);
	snprintf(id, sizeof id, "%s", rp->frag_id);
	while (st == DG_OK && done < tr->steps) {
		int64_t n = chunk_size(tr, r, done, k);
		uint64_t step = m->step_base |
				(atomic_fetch_add(&m->step_counter, (uint64_t)n) + 1);
		struct dg_task_run_result c = { 0 };
		bool stop, lost = false;
		double t0;

		pthread_mutex_lock(&m->mu);
		stop = j->cancel || tr->stop;
		if (!stop) {
			rp->cur_step = step;
			rp->cur_count = n;
		}
		pthread_mutex_unlock(&m->mu);
		if (stop)
			break;
		t0 = now_ms();
		st = run_chunk(m, j, rp, id, step, n, done, &c, &lost, &err);
		double ms = now_ms() - t0;
		pthread_mutex_lock(&m->mu);
		rp->cur_step = 0;
		rp->done += c.steps_done;
		for (int64_t i = 0; i < c.steps_done; i++) {
			tr->sum_loss += c.values[i * tr->n_collect];
			for (int v = 1; v < tr->n_collect; v++)
				tr->sum_metric[v - 1] += c.values[i * tr->n_collect + v];
		}
		tr->n_agg += c.steps_done;
		tr->stale += c.stale;
		if (c.steps_done > 0) {
			/* A replica's step time: its chunk's time over its steps. */
			j->step_ms_last = ms / (double)c.steps_done;
			tr->chunk_ms_sum += ms;
		}
		train_event_locked(m, j, false);
		pthread_cond_broadcast(&m->cv);         /* replica 0 may wait for this step */
		pthread_mutex_unlock(&m->mu);
		done += c.steps_done;
		dg_task_run_result_deinit(&c);
		if (st != DG_OK && lost) {
			/* The task was lost: once it is back, register the fragment
			 * again and run on from the last step done (ShardBatch makes a
			 * step's data a function of its training step). */
			if ((st = retry_wait(m, j, rp->task, done, attempt++, r, &err)) == DG_OK &&
			    (st = replica_reregister(m, rp, id, &err)) == DG_OK)
				continue;
		}
		if (st != DG_OK)
			break;
		attempt = 0;
		/* Aim at JOB_CHUNK_MS per chunk, growing at most 4x at a time. */
		double want = (double)JOB_CHUNK_MS * (double)n / (ms > 0.01 ? ms : 0.01);
		k = want > (double)(4 * n) ? 4 * n : (int64_t)want;
		k = k < 1 ? 1 : k > WORKER_MAX_RUN_STEPS ? WORKER_MAX_RUN_STEPS : k;
		if (tr->eval_every > 0 && done < tr->steps && done % tr->eval_every == 0) {
			if (!tr->spec.sync && tr->spec.eval_barrier)
				st = train_eval_barrier(m, j, r, done, &err);
			else if (r == 0)
				st = train_eval(m, j, train_epoch(tr, done), &err);
		}
	}
	if (st != DG_OK && strncmp(err.msg, "task ", 5) != 0) {
		dg_err_prefix(&err, "replica %d on %s", r, task_label(m, rp->task));
	} else if (st != DG_OK) {
		dg_err_prefix(&err, "replica %d", r);
	}
	pthread_mutex_lock(&m->mu);
	rp->finished = true;
	rp->st = st;
	rp->err = err;
	job_put_locked(j);
	m->n_threads--;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

/* POST /v1/checkpoint to every ps task; an event per snapshot. */
static enum dg_status train_checkpoint(struct master *m, struct job *j, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int t = 0; st == DG_OK && t < m->cluster->n_tasks; t++) {
		struct dg_client *c;
		json_t *reply = NULL;
		if (strcmp(m->cluster->tasks[t].job, "ps") != 0)
			continue;
		if (!(c = dg_client_new(m->cluster->tasks[t].address, m->token, err)))
			return err ? err->code : DG_ENOMEM;
		st = dg_ps_checkpoint(c, &reply, err);
		dg_client_free(c);
		if (st != DG_OK) {
			dg_err_prefix(err, "checkpoint of ps %s", m->cluster->tasks[t].address);
			break;
		}
		pthread_mutex_lock(&m->mu);
		add_event_locked(m, j, json_pack("{s:s, s:s, s:O?}", "event", "checkpoint", "ps",
						 m->cluster->tasks[t].address, "snapshot", reply));
		pthread_mutex_unlock(&m->mu);
		json_decref(reply);
	}
	return st;
}

/* The sync step of every trained variable into steps[] (-1: not reported),
 * from GET /v1/vars of each ps task holding one (HEAD does not give it to
 * the client). DG_ENOTFOUND naming a variable that is not there. */
static enum dg_status var_steps(struct master *m, const struct train *tr, int64_t *steps,
				struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int v = 0; v < tr->n_vars; v++)
		steps[v] = INT64_MIN;
	for (int v = 0; st == DG_OK && v < tr->n_vars; v++) {
		struct dg_var_info *vars = NULL;
		int n = 0, t = tr->var_task[v];
		const char *addr = m->cluster->tasks[t].address;
		struct dg_client *c;
		if (steps[v] != INT64_MIN)
			continue;   /* listed with an earlier variable of the same task */
		if (!(c = dg_client_new(addr, m->token, err)))
			return err ? err->code : DG_ENOMEM;
		st = dg_var_list(c, "", &vars, &n, err);
		dg_client_free(c);
		if (st != DG_OK)
			dg_err_prefix(err, "listing the variables of ps %s", addr);
		for (int i = 0; st == DG_OK && i < n; i++)
			for (int u = v; u < tr->n_vars; u++)
				if (tr->var_task[u] == t &&
				    strcmp(vars[i].name, tr->var_name[u]) == 0)
					steps[u] = vars[i].step;
		free(vars);
		if (st == DG_OK && steps[v] == INT64_MIN) {
			dg_err_set(err, DG_ENOTFOUND, "variable '%s' is not on ps %s",
				   tr->var_name[v], addr);
			return DG_ENOTFOUND;
		}
	}
	return st;
}

/* Whether every trained variable reached its sync step base + steps (sync
 * with backups: the job is complete without the slow replicas). */
static bool train_vars_reached(struct master *m, const struct train *tr)
{
	int64_t *steps = calloc((size_t)tr->n_vars + 1, sizeof *steps);
	bool ok = steps && var_steps(m, tr, steps, NULL) == DG_OK;

	for (int v = 0; ok && v < tr->n_vars; v++)
		ok = steps[v] >= tr->var_base[v] + tr->steps;
	free(steps);
	return ok;
}

/* Whether v is the JSON string s. */
static bool str_is(const json_t *v, const char *s)
{
	return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

/* Set attrs[key] = value on every node of doc whose op is op, by "var". */
static void patch_nodes(json_t *doc, const char *op, const char *key, const struct train *tr)
{
	size_t i;
	json_t *n;

	json_array_foreach(json_object_get(doc, "nodes"), i, n) {
		json_t *attrs = json_object_get(n, "attrs");
		const char *var = json_string_value(json_object_get(attrs, "var"));
		if (!var || !str_is(json_object_get(n, "op"), op))
			continue;
		for (int v = 0; v < tr->n_vars; v++)
			if (strcmp(tr->var_name[v], var) == 0)
				json_object_set_new(attrs, key,
						    json_integer((json_int_t)tr->var_base[v]));
	}
}

/* Initialise the variables (replica 0's VarInit fragments, reset when the
 * spec says reinit; then the eval's, which create only what is missing),
 * read each variable's sync step, and register the replica and eval
 * fragments (with the sync step bases patched in when sync). */
static enum dg_status train_setup(struct master *m, struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;
	struct replica *rp0 = &tr->reps[0];
	enum dg_status st = DG_OK;
	size_t i;
	json_t *n;

	for (int f = 0; tr->spec.reinit && f < rp0->part.n_init; f++)
		json_array_foreach(json_object_get(rp0->part.init[f].doc, "nodes"), i, n)
			if (str_is(json_object_get(n, "op"), "VarInit"))
				json_object_set_new(json_object_get(n, "attrs"), "reset",
						    json_true());
	for (int f = 0; st == DG_OK && f < rp0->part.n_init; f++)
		st = register_frag(m, &rp0->part.init[f], rp0->init_id[f], err);
	if (st == DG_OK && rp0->part.n_init > 0)
		st = run_frags(m, j, rp0->part.init, rp0->init_id, rp0->part.n_init, NULL, true,
			       NULL, err);
	for (int f = 0; st == DG_OK && f < j->part.n_init; f++)
		st = register_frag(m, &j->part.init[f], j->init_id[f], err);
	if (st == DG_OK && j->part.n_init > 0)
		st = run_init(m, j, err);
	if (st != DG_OK) {
		dg_err_prefix(err, "initialising variables");
		return st;
	}
	if ((st = var_steps(m, tr, tr->var_base, err)) != DG_OK)
		return st;
	for (int v = 0; tr->spec.sync && v < tr->n_vars; v++) {
		if (tr->var_base[v] >= 0)
			continue;
		dg_err_set(err, DG_EUNSUPPORTED, "ps %s does not report the sync step of "
			   "variable '%s'", m->cluster->tasks[tr->var_task[v]].address,
			   tr->var_name[v]);
		dg_err_hint(err, "run every task with the same dg version");
		return DG_EUNSUPPORTED;
	}
	for (int r = 0; st == DG_OK && r < tr->n_reps; r++) {
		struct replica *rp = &tr->reps[r];
		if (tr->spec.sync) {
			patch_nodes(rp->part.frags[0].doc, "VarApply", "step_base", tr);
			patch_nodes(rp->part.frags[0].doc, "VarRead", "min_step_base", tr);
		}
		st = register_frag(m, &rp->part.frags[0], rp->frag_id, err);
	}
	for (int f = 0; st == DG_OK && f < j->part.n_frags; f++)
		st = register_frag(m, &j->part.frags[f], j->frag_id[f], err);
	return st;
}

/* Start one thread per replica. */
static enum dg_status train_start_replicas(struct master *m, struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;
	pthread_attr_t attr;
	enum dg_status st = DG_OK;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_mutex_lock(&m->mu);
	tr->t0 = now_ms();
	tr->last_event_ms = tr->t0;
	for (int r = 0; r < tr->n_reps; r++) {
		struct replica_arg *a = malloc(sizeof *a);
		pthread_t th;
		if (!a) {
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
		} else {
			*a = (struct replica_arg){ j, r };
			j->refs++;
			m->n_threads++;
			if (pthread_create(&th, &attr, train_replica_main, a) != 0) {
				j->refs--;
				m->n_threads--;
				free(a);
				st = dg_err_set(err, DG_ENOMEM, "cannot start a thread for "
						"replica %d of job %s", r, j->id);
			}
		}
		if (st != DG_OK) {
			/* The replicas not started count as finished with this error. */
			for (int q = r; q < tr->n_reps; q++) {
				tr->reps[q].finished = true;
				tr->reps[q].st = st;
				tr->reps[q].err = *err;
			}
			tr->stop = true;
			break;
		}
	}
	pthread_mutex_unlock(&m->mu);
	pthread_attr_destroy(&attr);
	return st;
}

/* Wait until the replicas are done (or, sync with backups, enough of them and
 * every variable reached its last step), one failed, or the job was canceled;
 * checkpoint every checkpoint_secs meanwhile. Then stop the replicas still
 * running and abort their chunks in flight. */
static enum dg_status train_wait(struct master *m, struct job *j, enum dg_status st,
				 struct dg_err *err)
{
	struct train *tr = j->tr;
	double next_ckpt = tr->spec.checkpoint_secs > 0 ?
			   now_ms() + tr->spec.checkpoint_secs * 1e3 : 0;
	const char *reason = "the training job stopped";
	int n = tr->n_reps;

	pthread_mutex_lock(&m->mu);
	while (st == DG_OK) {
		int ok = 0, bad = -1;
		for (int r = 0; r < n; r++) {
			if (tr->reps[r].finished && tr->reps[r].st == DG_OK)
				ok++;
			else if (tr->reps[r].finished && bad < 0)
				bad = r;
		}
		if (j->cancel) {
			st = dg_err_set(err, DG_ECANCELED, "job %s was canceled", j->id);
			reason = "job canceled";
			break;
		}
		if (bad >= 0) {
			*err = tr->reps[bad].err;
			st = tr->reps[bad].st;
			reason = err->msg;
			break;
		}
		if (ok == n)
			break;
		if (tr->spec.sync && tr->spec.backup > 0 && ok >= n - tr->spec.backup) {
			pthread_mutex_unlock(&m->mu);
			bool reached = train_vars_reached(m, tr);
			pthread_mutex_lock(&m->mu);
			if (reached) {
				reason = "the job finished without this replica (a backup)";
				break;
			}
		}
		if (next_ckpt > 0 && now_ms() >= next_ckpt) {
			pthread_mutex_unlock(&m->mu);
			st = train_checkpoint(m, j, err);
			pthread_mutex_lock(&m->mu);
			next_ckpt = now_ms() + tr->spec.checkpoint_secs * 1e3;
			if (st != DG_OK) {
				reason = err->msg;
				break;
			}
			continue;
		}
		double wait_ms = JOB_TRAIN_POLL_MS;
		if (next_ckpt > 0 && next_ckpt - now_ms() < wait_ms)
			wait_ms = next_ckpt - now_ms() > 1 ? next_ckpt - now_ms() : 1;
		wait_locked(m, wait_ms);
	}
	tr->stop = true;
	tr->failed = st != DG_OK;
	snprintf(tr->stop_reason, sizeof tr->stop_reason, "%s", reason);
	pthread_mutex_unlock(&m->mu);
	return st;
}

/* Abort the chunks still in flight (replicas left behind, or all of them
 * after a failure), after the job is over: a stopped task's DELETE waits for
 * its timeout and must not delay the job's end. */
static void train_abort_inflight(struct master *m, struct job *j)
{
	struct train *tr = j->tr;
	int n = tr->n_reps;
	uint64_t *steps = calloc((size_t)n + 1, sizeof *steps);
	int64_t *counts = calloc((size_t)n + 1, sizeof *counts);

	pthread_mutex_lock(&m->mu);
	for (int r = 0; steps && counts && r < n; r++) {
		steps[r] = tr->reps[r].finished ? 0 : tr->reps[r].cur_step;
		counts[r] = tr->reps[r].cur_count;
	}
	pthread_mutex_unlock(&m->mu);
	for (int r = 0; steps && counts && r < n; r++)
		if (steps[r])
			abort_chunk(m, tr->reps[r].task, steps[r], counts[r], tr->stop_reason);
	free(steps);
	free(counts);
}

/* The thread of a training job: set up, run the replicas, evaluate and
 * checkpoint at the end, clean up. */
static void *train_main(void *arg)
{
	struct job *j = arg;
	struct master *m = j->m;
	struct train *tr = j->tr;
	struct dg_err err = { 0 };
	enum dg_status st = train_setup(m, j, &err);

	if (st == DG_OK)
		st = train_start_replicas(m, j, &err);
	st = train_wait(m, j, st, &err);
	if (st == DG_OK) {
		pthread_mutex_lock(&m->mu);
		train_event_locked(m, j, true);
		pthread_mutex_unlock(&m->mu);
		st = train_eval(m, j, tr->epochs, &err);
	}
	if (st == DG_OK && tr->spec.checkpoint_secs > 0)
		st = train_checkpoint(m, j, &err);
	finish_job(m, j, st, &err);
	/* After the job is over: a replica left on a stopped task must not hold
	 * the job's end up while its DELETEs wait. */
	train_abort_inflight(m, j);
	unregister_all(m, j);
	pthread_mutex_lock(&m->mu);
	job_put_locked(j);
	m->n_threads--;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

/* ------------------------------------------------------------ submit */

/* Probe every task's health: reach[t] gets whether it answered (errs[t] why
 * not), bytes[t] the bytes it holds, gpu[t] whether it reports a GPU (a
 * non-empty "gpus" array: what place.c needs for /gpu:K devices). */
static void probe_tasks(struct master *m, int64_t *bytes, bool *gpu, enum dg_status *reach,
			struct dg_err *errs)
{
	for (int t = 0; t < m->cluster->n_tasks; t++) {
		json_t *h = NULL;
		reach[t] = m->tasks[t]->ops->health(m->tasks[t], 3000, &h, &errs[t]);
		bytes[t] = json_integer_value(json_object_get(h, "bytes"));
		gpu[t] = json_array_size(json_object_get(h, "gpus")) > 0;
		json_decref(h);
	}
}

/* Every task the job uses (job_tasks) must answer the health probe: report
 * the first that does not, by address, before anything is registered. */
static enum dg_status check_used(struct master *m, const struct job *j,
				 const enum dg_status *reach, const struct dg_err *errs,
				 struct dg_err *err)
{
	bool *used = calloc((size_t)m->cluster->n_tasks + 1, sizeof *used);
	enum dg_status st = DG_OK;

	if (!used)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	job_tasks(j, used);
	for (int t = 0; st == DG_OK && t < m->cluster->n_tasks; t++) {
		if (!used[t] || reach[t] == DG_OK || m->tasks[t]->local)
			continue;
		st = dg_err_set(err, DG_EUNAVAILABLE, "%s does not answer: %s", task_label(m, t),
				errs[t].msg);
		dg_err_hint(err, "start that task (dg server --job %s --task %d) or check the "
			    "cluster spec", m->cluster->tasks[t].job, m->cluster->tasks[t].index);
	}
	free(used);
	return st;
}

/* The names of the body's "feeds" (object) and "upload" (array), in order. */
static enum dg_status feed_names(const json_t *body, const char ***names, int *n,
				 struct dg_err *err)
{
	const json_t *feeds = json_object_get(body, "feeds"), *up = json_object_get(body, "upload");
	const char *k;
	json_t *v;
	size_t i;

	*n = 0;
	*names = calloc(json_object_size(feeds) + json_array_size(up) + 1, sizeof **names);
	if (!*names)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (feeds && !json_is_object(feeds))
		return dg_err_set(err, DG_EINVAL, "job \"feeds\" must be an object of NAME: value");
	if (up && !json_is_array(up))
		return dg_err_set(err, DG_EINVAL, "job \"upload\" must be an array of names");
	json_object_foreach((json_t *)feeds, k, v)
		(*names)[(*n)++] = k;
	json_array_foreach(up, i, v) {
		if (!json_is_string(v))
			return dg_err_set(err, DG_EINVAL, "job \"upload\"[%zu] must be a string",
					  i);
		(*names)[(*n)++] = json_string_value(v);
	}
	return DG_OK;
}

static enum dg_status fetch_names(const json_t *body, const char ***names, int *n,
				  struct dg_err *err)
{
	const json_t *f = json_object_get(body, "fetch");
	json_t *v;
	size_t i;

	*n = 0;
	*names = calloc(json_array_size(f) + 1, sizeof **names);
	if (!*names)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (f && !json_is_array(f))
		return dg_err_set(err, DG_EINVAL, "job \"fetch\" must be an array of names");
	json_array_foreach(f, i, v) {
		if (!json_is_string(v))
			return dg_err_set(err, DG_EINVAL, "job \"fetch\"[%zu] must be a string", i);
		(*names)[(*n)++] = json_string_value(v);
	}
	return DG_OK;
}

/* A feed value for fed node ref, checked against its inferred type. */
static enum dg_status check_feed(const struct job *j, int i, const struct dg_tensor *t,
				 struct dg_err *err)
{
	struct dg_edge e;

	if (dg_graph_ref(j->g, j->part.feeds[i].ref, &e, err) != DG_OK)
		return err ? err->code : DG_EINVAL;
	if (!dg_exec_type_ok(&j->g->nodes[e.node].out[0], t, err)) {
		dg_err_prefix(err, "feed '%s'", j->part.feeds[i].ref);
		return err ? err->code : DG_EINVAL;
	}
	return DG_OK;
}

static enum dg_status literal_feeds(struct job *j, const json_t *body, struct dg_err *err)
{
	const json_t *feeds = json_object_get(body, "feeds");
	int i = 0;
	const char *k;
	json_t *v;

	json_object_foreach((json_t *)feeds, k, v) {
		struct dg_edge e;
		(void)k;
		if (dg_graph_ref(j->g, j->part.feeds[i].ref, &e, err) != DG_OK)
			return err ? err->code : DG_EINVAL;
		j->feeds[i] = dg_json_to_tensor(v, &j->g->nodes[e.node].out[0].dtype, err);
		if (!j->feeds[i]) {
			dg_err_prefix(err, "feed '%s'", j->part.feeds[i].ref);
			return err ? err->code : DG_EINVAL;
		}
		if (check_feed(j, i, j->feeds[i], err) != DG_OK)
			return err ? err->code : DG_EINVAL;
		i++;
	}
	return DG_OK;
}

/* The job's integer key, when given, into *out: from lo (said with lo_note)
 * to hi, else DG_EINVAL naming the key and the range. */
static enum dg_status int_key(const json_t *body, const char *key, int64_t lo, int64_t hi,
			      const char *lo_note, int64_t *out, struct dg_err *err)
{
	const json_t *v = json_object_get(body, key);

	if (!v)
		return DG_OK;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return dg_err_set(err, DG_EINVAL, "job \"%s\" must be an integer from %" PRId64
				  "%s to %" PRId64, key, lo, lo_note, hi);
	*out = json_integer_value(v);
	return DG_OK;
}

static enum dg_status job_options(struct job *j, const json_t *body, struct place_opts *po,
				  bool soft_default, struct dg_err *err)
{
	const json_t *v;
	const char *s;

	j->steps = 1;
	j->timeout_ms = WORKER_DEFAULT_TIMEOUT_MS;
	j->retry_ms = JOB_RETRY_MS;
	po->soft_placement = soft_default;
	if (int_key(body, "steps", 1, MASTER_MAX_STEPS, "", &j->steps, err) != DG_OK ||
	    int_key(body, "timeout_ms", 1, WORKER_MAX_TIMEOUT_MS, "", &j->timeout_ms,
		    err) != DG_OK ||
	    int_key(body, "retry_ms", 0, JOB_MAX_RETRY_MS, " (no retry)", &j->retry_ms,
		    err) != DG_OK)
		return DG_EINVAL;
	if ((v = json_object_get(body, "soft_placement"))) {
		if (!json_is_boolean(v))
			return dg_err_set(err, DG_EINVAL, "job \"soft_placement\" must be a "
					  "boolean");
		po->soft_placement = json_is_true(v);
	}
	if ((v = json_object_get(body, "vars"))) {
		s = json_string_value(v);
		if (s && strcmp(s, "bytes") == 0)
			po->vars = PLACE_VARS_BYTES;
		else if (s && strcmp(s, "round_robin") == 0)
			po->vars = PLACE_VARS_ROUND_ROBIN;
		else
			return dg_err_set(err, DG_EINVAL, "job \"vars\" must be \"bytes\" or "
					  "\"round_robin\"");
	}
	return DG_OK;
}

/* For graphs too large to list node by node: one line per fragment. Owned. */
static char *explain_summary(const struct master *m, const struct job *j)
{
	struct dg_buf b;
	char dev[128];

	dg_buf_init(&b);
	dg_buf_printf(&b, NULL, "%d nodes: too many to list; per task:\n", j->g->n_nodes);
	for (int i = 0; i < j->part.n_frags; i++) {
		place_device_name(m->cluster, j->part.frags[i].task, dev, sizeof dev);
		dg_buf_printf(&b, NULL, "fragment %s (%s): %d nodes\n", dev,
			      m->cluster->tasks[j->part.frags[i].task].address,
			      j->part.frags[i].n_nodes);
	}
	return b.data ? dg_buf_steal(&b, NULL) : NULL;
}

/* ------------------------------------------------------------ training: build */

static void train_free(struct master *m, struct train *tr)
{
	if (!tr)
		return;
	for (int r = 0; tr->reps && r < tr->n_reps; r++) {
		struct replica *rp = &tr->reps[r];
		mtask_conn_drop(m->tasks[rp->task], &rp->conn);
		free(rp->init_id);
		partition_deinit(&rp->part);
		placement_deinit(&rp->pl);
		dg_graph_free(rp->g);
	}
	free(tr->reps);
	for (int v = 0; tr->var_name && v < tr->n_vars; v++)
		free(tr->var_name[v]);
	free(tr->var_name);
	free(tr->var_task);
	free(tr->var_base);
	free(tr->sum_metric);
	free(tr->metric);
	free(tr->eval);
	dg_buf_deinit(&tr->csv);
	train_plan_deinit(&tr->plan);
	train_spec_deinit(&tr->spec);
	free(tr);
}

/* The variables that exist now: name -> cluster task index, from GET /v1/vars
 * on every ps task that answered the health probe. Owned. */
static json_t *probe_vars(struct master *m, const enum dg_status *reach)
{
	json_t *o = json_object();

	for (int t = 0; o && t < m->cluster->n_tasks; t++) {
		struct dg_var_info *vars = NULL;
		int n = 0;
		if (strcmp(m->cluster->tasks[t].job, "ps") != 0 || reach[t] != DG_OK)
			continue;
		struct dg_client *c = dg_client_new(m->cluster->tasks[t].address, m->token, NULL);
		if (c && dg_var_list(c, "", &vars, &n, NULL) == DG_OK)
			for (int i = 0; i < n; i++)
				json_object_set_new(o, vars[i].name, json_integer(t));
		free(vars);
		dg_client_free(c);
	}
	return o;
}

/* Place and cut replica r's graph: one step fragment on its task (targets:
 * the ApplyGradient nodes; fetches sent to that task itself). */
static enum dg_status build_replica(struct master *m, struct train *tr, int r,
				    const struct place_opts *po, struct dg_err *err)
{
	const struct train_replica *tp = &tr->plan.rep[r];
	struct replica *rp = &tr->reps[r];
	struct partition_opts ppo = { 0 };
	enum dg_status st;

	rp->task = tr->plan.replica_task[r];
	if (!(rp->g = dg_graph_from_json(tp->doc, master_op_find, err))) {
		dg_err_prefix(err, "replica %d's graph", r);
		return err ? err->code : DG_EINVAL;
	}
	if ((st = place_graph(rp->g, m->cluster, po, &rp->pl, err)) != DG_OK)
		return st;
	ppo.fetch = (const char *const *)tp->fetch;
	ppo.n_fetch = tp->n_fetch;
	ppo.targets = (const char *const *)tp->targets;
	ppo.n_targets = tp->n_targets;
	ppo.fetch_local = true;
	ppo.master_task = master_self(m);
	st = place_partition_ex(rp->g, m->cluster, &rp->pl, &ppo, &rp->part, err);
	if (st != DG_OK)
		return st;
	if (rp->part.n_frags != 1 || rp->part.frags[0].task != rp->task) {
		dg_err_set(err, DG_EINVAL, "replica %d of the training graph should run on %s "
			   "alone, but its nodes span %d tasks", r, task_label(m, rp->task),
			   rp->part.n_frags);
		dg_err_hint(err, "only Variables may be placed off the replica's task");
		return DG_EINVAL;
	}
	if (rp->part.n_fetch != tp->n_fetch)
		return dg_err_set(err, DG_EINTERNAL, "replica %d: %d fetch keys for %d fetches",
				  r, rp->part.n_fetch, tp->n_fetch);
	return DG_OK;
}

/* The trained variables (name on the ps, task) from replica 0's placement. */
static enum dg_status train_vars(struct train *tr, struct dg_err *err)
{
	const struct replica *rp = &tr->reps[0];

	tr->n_vars = tr->plan.n_vars;
	tr->var_name = calloc((size_t)tr->n_vars + 1, sizeof *tr->var_name);
	tr->var_task = calloc((size_t)tr->n_vars + 1, sizeof *tr->var_task);
	tr->var_base = calloc((size_t)tr->n_vars + 1, sizeof *tr->var_base);
	if (!tr->var_name || !tr->var_task || !tr->var_base)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int v = 0; v < tr->n_vars; v++) {
		int n = dg_graph_find(rp->g, tr->plan.var_nodes[v]);
		const char *name;
		if (n < 0)
			return dg_err_set(err, DG_EINTERNAL, "trained variable '%s' is not in "
					  "replica 0's graph", tr->plan.var_nodes[v]);
		if (dg_attr_string(rp->g->nodes[n].attrs, "var", rp->g->nodes[n].name, &name,
				   err) != DG_OK)
			return DG_EINVAL;
		if (!(tr->var_name[v] = strdup(name)))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		tr->var_task[v] = rp->pl.task[n];
	}
	return DG_OK;
}

/* The header of the metrics CSV and the running figures. */
static enum dg_status train_figures(struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;
	int nm = tr->n_collect - 1;

	tr->sum_metric = calloc((size_t)nm + 1, sizeof *tr->sum_metric);
	tr->metric = calloc((size_t)nm + 1, sizeof *tr->metric);
	tr->eval = calloc((size_t)j->part.n_fetch + 1, sizeof *tr->eval);
	if (!tr->sum_metric || !tr->metric || !tr->eval)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	tr->loss = NAN;
	for (int i = 0; i < nm; i++)
		tr->metric[i] = NAN;
	for (int i = 0; i < j->part.n_fetch; i++)
		tr->eval[i] = NAN;
	dg_buf_init(&tr->csv);
	dg_buf_printf(&tr->csv, NULL, "step,time_s,epoch,loss");
	for (int i = 0; i < nm; i++)
		dg_buf_printf(&tr->csv, NULL, ",%s", tr->spec.metrics[i]);
	dg_buf_printf(&tr->csv, NULL, ",examples_per_s");
	for (int i = 0; i < j->part.n_fetch; i++)
		dg_buf_printf(&tr->csv, NULL, ",%s", j->part.fetch_keys[i] + 6);
	return dg_buf_printf(&tr->csv, err, "\n");
}

/* Explain text: replica 0 (the others are alike) and the eval. Owned. */
static char *train_explain(const struct master *m, const struct job *j)
{
	const struct replica *rp = &j->tr->reps[0];
	struct dg_buf b;
	char *part;

	dg_buf_init(&b);
	dg_buf_printf(&b, NULL, "training: %d replica(s), %" PRId64 " steps each, %s\n",
		      j->tr->n_reps, j->tr->steps, j->tr->spec.sync ? "sync" : "async");
	dg_buf_printf(&b, NULL, "replica 0 (the others differ in task and shard only):\n");
	part = rp->g->n_nodes <= JOB_EXPLAIN_MAX_NODES ?
	       place_explain(rp->g, m->cluster, &rp->pl, &rp->part) : NULL;
	dg_buf_printf(&b, NULL, "%s", part ? part : "(too many nodes to list)\n");
	free(part);
	if (j->g) {
		part = j->g->n_nodes <= JOB_EXPLAIN_MAX_NODES ?
		       place_explain(j->g, m->cluster, &j->pl, &j->part) : NULL;
		dg_buf_printf(&b, NULL, "eval:\n%s", part ? part : "(too many nodes to list)\n");
		free(part);
	}
	return b.data ? dg_buf_steal(&b, NULL) : NULL;
}

/* A training job: the "training" section (the job's key, else the graph's)
 * parsed, the plan built (master/train.c), each replica placed and cut, the
 * eval graph placed and cut like an ordinary one-step job (j->g, j->part: its
 * fetched values are the job's results). */
static enum dg_status train_build(struct master *m, struct job *j, const json_t *body,
				  struct place_opts *po, const enum dg_status *reach,
				  const struct dg_err *errs, struct dg_err *err)
{
	const json_t *graph = json_object_get(body, "graph");
	const json_t *section = json_object_get(body, "training");
	json_t *gdoc = json_copy((json_t *)graph), *existing = NULL;
	struct dg_graph *ug = NULL;
	struct train *tr = calloc(1, sizeof *tr);
	enum dg_status st = DG_OK;

	if (!section)
		section = json_object_get(graph, "training");
	if (!gdoc || !tr) {
		free(tr);
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	j->tr = tr;
	if (json_object_get(body, "feeds") || json_object_get(body, "upload") ||
	    json_object_get(body, "fetch") || json_object_get(body, "steps")) {
		st = dg_err_set(err, DG_EINVAL, "a training job takes no \"feeds\", \"upload\", "
				"\"fetch\" or \"steps\"");
		dg_err_hint(err, "read data with IdxReader/NpyReader; set training.steps or "
			    "training.eval.fetch instead (doc/training.md)");
		goto out;
	}
	if ((st = train_spec_parse(section, &tr->spec, err)) != DG_OK)
		goto out;
	json_object_del(gdoc, "training");
	if (!(ug = dg_graph_from_json(gdoc, master_op_find, err))) {
		st = err ? err->code : DG_EINVAL;
		goto out;
	}
	if ((st = train_plan_build(ug, &tr->spec, m->cluster, &tr->plan, err)) != DG_OK)
		goto out;
	if (!(tr->reps = calloc((size_t)tr->plan.n_replicas + 1, sizeof *tr->reps))) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	tr->n_reps = tr->plan.n_replicas;
	if (!(existing = probe_vars(m, reach))) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	po->existing = existing;
	for (int r = 0; st == DG_OK && r < tr->n_reps; r++) {
		st = build_replica(m, tr, r, po, err);
		/* Every replica (and the eval) uses the variables where replica 0 put them. */
		for (int n = 0; st == DG_OK && r == 0 && n < tr->reps[0].g->n_nodes; n++) {
			const struct dg_node *nd = &tr->reps[0].g->nodes[n];
			const char *var;
			if (strcmp(nd->op->name, "Variable") == 0 &&
			    dg_attr_string(nd->attrs, "var", nd->name, &var, err) == DG_OK)
				json_object_set_new(existing, var,
						    json_integer(tr->reps[0].pl.task[n]));
		}
	}
	if (st != DG_OK)
		goto out;
	tr->collect = (const char **)tr->reps[0].part.fetch_keys;
	tr->n_collect = tr->reps[0].part.n_fetch;
	if (tr->n_collect < 1) {
		st = dg_err_set(err, DG_EINTERNAL, "the training plan collects no loss");
		goto out;
	}
	tr->reps[0].init_id = calloc((size_t)tr->reps[0].part.n_init + 1,
				     sizeof *tr->reps[0].init_id);
	if (!tr->reps[0].init_id) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if ((st = train_vars(tr, err)) != DG_OK)
		goto out;
	if (tr->plan.eval_doc) {
		if (!(j->g = dg_graph_from_json(tr->plan.eval_doc, master_op_find, err))) {
			dg_err_prefix(err, "the eval graph");
			st = err ? err->code : DG_EINVAL;
			goto out;
		}
		if ((st = place_graph(j->g, m->cluster, po, &j->pl, err)) != DG_OK ||
		    (st = place_partition(j->g, m->cluster, &j->pl, master_self(m), NULL, 0,
					  (const char *const *)tr->spec.eval_fetch,
					  tr->spec.n_eval_fetch, &j->part, err)) != DG_OK)
			goto out;
	}
	tr->steps = tr->plan.steps;
	tr->spe = tr->plan.steps_per_epoch;
	tr->epochs = tr->spec.epochs > 0 ? tr->spec.epochs :
		     tr->spe > 0 ? (tr->steps + tr->spe - 1) / tr->spe : 0;
	tr->eval_every = tr->spec.eval_every_steps > 0 ? tr->spec.eval_every_steps :
			 tr->spec.eval_every_epochs > 0 ? tr->spec.eval_every_epochs * tr->spe : 0;
	j->steps = tr->steps;
	if ((st = train_figures(j, err)) != DG_OK)
		goto out;
	j->explain = train_explain(m, j);
	if (!j->explain) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	st = check_used(m, j, reach, errs, err);
out:
	po->existing = NULL;
	json_decref(existing);
	json_decref(gdoc);
	dg_graph_free(ug);
	return st;
}

/* The per-feed, per-fetch and per-fragment arrays of j->part. */
static enum dg_status job_arrays(struct job *j, struct dg_err *err)
{
	j->feeds = calloc((size_t)j->part.n_feeds + 1, sizeof *j->feeds);
	j->results = calloc((size_t)j->part.n_fetch + 1, sizeof *j->results);
	j->conns = calloc((size_t)j->part.n_frags + 1, sizeof *j->conns);
	j->frag_id = calloc((size_t)j->part.n_frags + 1, sizeof *j->frag_id);
	j->init_id = calloc((size_t)j->part.n_init + 1, sizeof *j->init_id);
	if (!j->feeds || !j->results || !j->conns || !j->frag_id || !j->init_id)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

/* Parse, place and partition body into j. */
static enum dg_status job_build(struct master *m, struct job *j, const json_t *body,
				struct dg_err *err)
{
	static const char *const keys[] = { "graph", "fetch", "feeds", "upload", "steps",
					    "timeout_ms", "retry_ms", "soft_placement", "vars",
					    "start", "training" };
	const char **feeds = NULL, **fetch = NULL, *k;
	int n_feeds = 0, n_fetch = 0, nt = m->cluster->n_tasks;
	struct place_opts po = { 0 };
	int64_t *bytes = calloc((size_t)nt + 1, sizeof *bytes);
	bool *gpu = calloc((size_t)nt + 1, sizeof *gpu);
	enum dg_status *reach = calloc((size_t)nt + 1, sizeof *reach);
	struct dg_err *errs = calloc((size_t)nt + 1, sizeof *errs);
	enum dg_status st = DG_OK;
	json_t *v;

	if (!bytes || !gpu || !reach || !errs) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if (!json_is_object(body) || !json_is_object(json_object_get(body, "graph"))) {
		st = dg_err_set(err, DG_EINVAL, "a job is a JSON object with a \"graph\" object");
		dg_err_hint(err, "see doc/http-api.md, section Executor and master");
		goto out;
	}
	json_object_foreach((json_t *)body, k, v) {
		bool known = false;
		for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
			known |= strcmp(k, keys[i]) == 0;
		if (!known) {
			st = dg_err_set(err, DG_EINVAL, "unknown job key '%.64s'", k);
			goto out;
		}
	}
	if ((st = job_options(j, body, &po, m->soft_placement, err)) != DG_OK)
		goto out;
	if (json_object_get(body, "training") ||
	    json_object_get(json_object_get(body, "graph"), "training")) {
		probe_tasks(m, bytes, gpu, reach, errs);
		po.task_bytes = bytes;
		po.task_gpu = gpu;
		if ((st = train_build(m, j, body, &po, reach, errs, err)) == DG_OK)
			st = job_arrays(j, err);
		goto out;
	}
	j->g = dg_graph_from_json(json_object_get(body, "graph"), master_op_find, err);
	if (!j->g) {
		st = err ? err->code : DG_EINVAL;
		goto out;
	}
	if ((st = feed_names(body, &feeds, &n_feeds, err)) != DG_OK ||
	    (st = fetch_names(body, &fetch, &n_fetch, err)) != DG_OK)
		goto out;
	probe_tasks(m, bytes, gpu, reach, errs);
	po.task_bytes = bytes;
	po.task_gpu = gpu;
	if ((st = place_graph(j->g, m->cluster, &po, &j->pl, err)) != DG_OK)
		goto out;
	st = place_partition(j->g, m->cluster, &j->pl, master_self(m), feeds, n_feeds, fetch,
			     n_fetch, &j->part, err);
	if (st != DG_OK)
		goto out;
	j->explain = j->g->n_nodes <= JOB_EXPLAIN_MAX_NODES ?
		     place_explain(j->g, m->cluster, &j->pl, &j->part) : explain_summary(m, j);
	if (!j->explain) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if ((st = job_arrays(j, err)) != DG_OK)
		goto out;
	if ((st = literal_feeds(j, body, err)) != DG_OK)
		goto out;
	st = check_used(m, j, reach, errs, err);
out:
	free(feeds);
	free(fetch);
	free(bytes);
	free(gpu);
	free(reach);
	free(errs);
	return st;
}

enum dg_status master_job_submit(struct master *m, const json_t *body, char *id, size_t id_len,
				 struct dg_err *err)
{
	struct job *j = calloc(1, sizeof *j);
	const json_t *start = json_object_get(body, "start");
	enum dg_status st;

	if (!j)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	j->m = m;
	j->t_created = now_ms();
	if (master_self(m) < 0) {
		st = dg_err_set(err, DG_EINVAL, "this server (/job:%s/task:%d) is not in its own "
				"cluster spec, so it cannot be a master", m->job, m->task);
		job_free(j);
		return st;
	}
	st = job_build(m, j, body, err);
	if (st != DG_OK) {
		job_free(j);
		return st;
	}
	pthread_mutex_lock(&m->mu);
	st = table_add(m, j, err);
	if (st == DG_OK) {
		snprintf(id, id_len, "%s", j->id);
		add_event_locked(m, j, json_pack("{s:s, s:i, s:I}", "event", "created", "fragments",
						 j->part.n_frags + (j->tr ? j->tr->n_reps : 0),
						 "steps", (json_int_t)j->steps));
	}
	pthread_mutex_unlock(&m->mu);
	if (st != DG_OK) {
		job_free(j);
		return st;
	}
	if (start && !json_is_true(start))
		return DG_OK;
	return master_job_start(m, id, err);
}

enum dg_status master_job_feed(struct master *m, const char *id, const char *name,
			       struct dg_tensor *t, struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	enum dg_status st = DG_OK;
	int i;

	if (!j) {
		dg_tensor_free(t);
		return DG_ENOTFOUND;
	}
	for (i = 0; i < j->part.n_feeds; i++)
		if (strcmp(j->part.feeds[i].ref, name) == 0)
			break;
	if (i == j->part.n_feeds) {
		st = dg_err_set(err, DG_ENOTFOUND, "job %s has no feed '%.64s'", id, name);
		dg_err_hint(err, "name the feed in the job's \"upload\" list when creating it");
	} else {
		st = check_feed(j, i, t, err);
	}
	pthread_mutex_lock(&m->mu);
	if (st == DG_OK && j->state != JOB_CREATED)
		st = dg_err_set(err, DG_ECONFLICT, "job %s is %s; feeds are uploaded before it "
				"starts", id, state_names[j->state]);
	if (st == DG_OK) {
		dg_tensor_free(j->feeds[i]);
		j->feeds[i] = t;
		t = NULL;
	}
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	dg_tensor_free(t);
	return st;
}

enum dg_status master_job_start(struct master *m, const char *id, struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	enum dg_status st = DG_OK;
	bool claimed = false;

	if (!j)
		return DG_ENOTFOUND;
	pthread_mutex_lock(&m->mu);
	if (j->state != JOB_CREATED)
		st = dg_err_set(err, DG_ECONFLICT, "job %s is already %s", id,
				state_names[j->state]);
	for (int i = 0; st == DG_OK && i < j->part.n_feeds; i++)
		if (!j->feeds[i] && j->part.feeds[i].task >= 0) {
			st = dg_err_set(err, DG_EINVAL, "job %s: feed '%s' was not uploaded", id,
					j->part.feeds[i].ref);
			dg_err_hint(err, "PUT /v1/jobs/%s/feeds/%s first", id,
				    j->part.feeds[i].ref);
		}
	if (st == DG_OK) {
		j->state = JOB_RUNNING;   /* claims the job: a second start is refused */
		j->t_started = now_ms();
		claimed = true;
	}
	pthread_mutex_unlock(&m->mu);
	/* A training job registers its fragments in its thread (train_setup):
	 * after the variables are initialised and their sync steps read. */
	for (int i = 0; st == DG_OK && !j->tr && i < j->part.n_init; i++)
		st = register_frag(m, &j->part.init[i], j->init_id[i], err);
	for (int i = 0; st == DG_OK && !j->tr && i < j->part.n_frags; i++)
		st = register_frag(m, &j->part.frags[i], j->frag_id[i], err);
	if (st == DG_OK) {
		pthread_t th;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_mutex_lock(&m->mu);
		j->refs++;   /* the thread's reference, dropped by job_main */
		m->n_threads++;
		if (pthread_create(&th, &attr, j->tr ? train_main : job_main, j) == 0) {
			add_event_locked(m, j, json_pack("{s:s}", "event", "started"));
		} else {
			j->refs--;
			m->n_threads--;
			st = dg_err_set(err, DG_ENOMEM, "cannot start a thread for job %s", id);
		}
		pthread_mutex_unlock(&m->mu);
		pthread_attr_destroy(&attr);
		if (st != DG_OK) {
			unregister_all(m, j);
			finish_job(m, j, st, err);
		}
	} else if (claimed) {
		unregister_all(m, j);
		finish_job(m, j, st, err);
	}
	job_put(m, j);
	return st;
}

/* ------------------------------------------------------------ queries */

/* The "training" object of a job's status. Called with m->mu held. */
static json_t *train_json_locked(const struct job *j)
{
	const struct train *tr = j->tr;
	json_t *metrics = json_object(), *eval = json_object(), *done = json_array();
	int64_t mean, sum = train_done_locked(tr, &mean);

	for (int i = 0; i < tr->n_collect - 1; i++)
		json_object_set_new(metrics, tr->spec.metrics[i], num_json(tr->metric[i]));
	for (int i = 0; tr->have_eval && i < j->part.n_fetch; i++)
		json_object_set_new(eval, j->part.fetch_keys[i] + 6, num_json(tr->eval[i]));
	for (int r = 0; r < tr->n_reps; r++)
		json_array_append_new(done, json_integer(tr->reps[r].done));
	return json_pack("{s:I, s:I, s:I, s:i, s:s, s:i, s:I, s:o, s:I, s:o, s:o, s:o, s:I, "
			 "s:o}",
			 "epochs", (json_int_t)tr->epochs, "steps", (json_int_t)tr->steps,
			 "steps_per_epoch", (json_int_t)tr->spe, "replicas", tr->n_reps,
			 "mode", tr->spec.sync ? "sync" : "async", "backup", tr->spec.backup,
			 "examples", (json_int_t)(sum * tr->plan.examples_per_step),
			 "examples_per_s", num_json(tr->examples_per_s),
			 "batch", (json_int_t)tr->plan.examples_per_step,
			 "loss", num_json(tr->loss), "metrics", metrics, "eval", eval,
			 "stale", (json_int_t)tr->stale, "replica_steps", done);
}

static json_t *job_json_locked(const struct master *m, const struct job *j, bool full)
{
	double end = j->t_finished > 0 ? j->t_finished : now_ms();
	double mean = j->steps_done ? j->step_ms_sum / (double)j->steps_done : 0.0;
	int64_t sum = 0, mean_done;

	/* A training job: the mean step time of its replicas (a chunk's time over
	 * its steps), as last_step is the last chunk's. */
	if (j->tr && (sum = train_done_locked(j->tr, &mean_done)) > 0)
		mean = j->tr->chunk_ms_sum / (double)sum;
	json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:i, s:{s:f, s:f, s:f}}",
			      "id", j->id, "state", state_names[j->state],
			      "steps", (json_int_t)j->steps,
			      "steps_done", (json_int_t)j->steps_done,
			      "fragments", j->part.n_frags + (j->tr ? j->tr->n_reps : 0),
			      "ms", "total", j->t_started > 0 ? end - j->t_started : 0.0,
			      "last_step", j->step_ms_last, "mean_step", mean);
	char dev[128];

	if (!o)
		return NULL;
	json_object_set_new(o, "error", j->state == JOB_FAILED || j->state == JOB_CANCELED ?
			    err_json(&j->err) : json_null());
	if (j->tr)
		json_object_set_new(o, "training", train_json_locked(j));
	if (!full)
		return o;
	json_t *fetch = json_array(), *feeds = json_array(), *tasks = json_array();
	json_t *place = json_object();
	for (int i = 0; i < j->part.n_fetch; i++)
		json_array_append_new(fetch, json_string(j->part.fetch_keys[i] + 6));
	for (int i = 0; i < j->part.n_feeds; i++)
		json_array_append_new(feeds, json_pack("{s:s, s:b}", "name", j->part.feeds[i].ref,
						       "given", j->feeds[i] != NULL));
	/* A training job shows its replicas' fragments, then the eval's; its
	 * placement is replica 0's (the others differ in task only). */
	for (int r = 0; j->tr && r < j->tr->n_reps; r++) {
		const struct place_fragment *f = &j->tr->reps[r].part.frags[0];
		place_device_name(m->cluster, f->task, dev, sizeof dev);
		json_array_append_new(tasks, json_pack("{s:s, s:s, s:i, s:i}", "device", dev,
						       "address",
						       m->cluster->tasks[f->task].address,
						       "nodes", f->n_nodes, "replica", r));
	}
	for (int i = 0; i < j->part.n_frags; i++) {
		int t = j->part.frags[i].task;
		place_device_name(m->cluster, t, dev, sizeof dev);
		json_array_append_new(tasks, json_pack("{s:s, s:s, s:i}", "device", dev, "address",
						       m->cluster->tasks[t].address,
						       "nodes", j->part.frags[i].n_nodes));
	}
	const struct dg_graph *g = j->tr ? j->tr->reps[0].g : j->g;
	const struct placement *pl = j->tr ? &j->tr->reps[0].pl : &j->pl;
	json_t *soft = json_array();
	for (int n = 0; n < g->n_nodes; n++)
		if (pl->soft[n])
			json_array_append_new(soft, json_pack("{s:s, s:s}", "node",
							      g->nodes[n].name, "device",
							      g->nodes[n].device));
	json_object_set_new(o, "soft", soft);
	/* The whole map only for graphs a person would read; explain has the rest. */
	for (int n = 0; n < g->n_nodes && n < 10000; n++) {
		place_node_device(m->cluster, pl, n, dev, sizeof dev);
		json_object_set_new(place, g->nodes[n].name, json_string(dev));
	}
	json_object_set_new(o, "fetch", fetch);
	json_object_set_new(o, "feeds", feeds);
	json_object_set_new(o, "tasks", tasks);
	json_object_set_new(o, "placement", place);
	json_object_set_new(o, "explain", json_string(j->explain ? j->explain : ""));
	return o;
}

json_t *master_job_status(struct master *m, const char *id, bool full, struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	json_t *o;

	if (!j)
		return NULL;
	pthread_mutex_lock(&m->mu);
	o = job_json_locked(m, j, full);
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	if (!o)
		dg_err_set(err, DG_ENOMEM, "out of memory");
	return o;
}

json_t *master_job_list(struct master *m)
{
	json_t *a = json_array();

	pthread_mutex_lock(&m->mu);
	for (int i = 0; a && i < m->n_jobs; i++)
		json_array_append_new(a, job_json_locked(m, m->jobs[i], false));
	pthread_mutex_unlock(&m->mu);
	return a;
}

enum dg_status master_job_events(struct master *m, const char *id, int64_t from,
				 int64_t timeout_ms, struct dg_buf *out, int64_t *next, bool *over,
				 struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	struct timespec dl;
	enum dg_status st = DG_OK;

	if (!j)
		return DG_ENOTFOUND;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (timeout_ms % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&m->mu);
	if (from < 0)
		from = 0;
	while (from >= j->n_events && !job_over(j) && !m->closing)
		if (pthread_cond_timedwait(&m->cv, &m->mu, &dl) != 0)
			break;
	for (int64_t i = from; st == DG_OK && i < j->n_events; i++)
		st = dg_buf_printf(out, err, "%s\n", j->events[i]);
	*next = j->n_events > from ? j->n_events : from;
	*over = job_over(j) && *next >= j->n_events;
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	return st;
}

enum dg_status master_job_result(struct master *m, const char *id, const char *name,
				 struct dg_tensor **out, struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	enum dg_status st = DG_OK;
	int i;

	*out = NULL;
	if (!j)
		return DG_ENOTFOUND;
	pthread_mutex_lock(&m->mu);
	for (i = 0; i < j->part.n_fetch; i++)
		if (strcmp(j->part.fetch_keys[i] + 6, name) == 0)
			break;
	if (i == j->part.n_fetch)
		st = dg_err_set(err, DG_ENOTFOUND, "job %s fetches no '%.64s'", id, name);
	else if (!j->results[i])
		st = dg_err_set(err, j->state == JOB_RUNNING || j->state == JOB_CREATED ?
				DG_ECONFLICT : DG_ENOTFOUND, "job %s (%s) has no value of '%s' yet",
				id, state_names[j->state], name);
	else
		*out = dg_tensor_clone(j->results[i], err);
	if (st == DG_OK && !*out)
		st = err ? err->code : DG_ENOMEM;
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	return st;
}

enum dg_status master_job_metrics(struct master *m, const char *id, struct dg_buf *out,
				  struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	enum dg_status st;

	if (!j)
		return DG_ENOTFOUND;
	pthread_mutex_lock(&m->mu);
	if (!j->tr) {
		st = dg_err_set(err, DG_ENOTFOUND, "job %s is not a training job: it has no "
				"metrics", id);
		dg_err_hint(err, "its progress is in GET /v1/jobs/%s/events", id);
	} else {
		st = dg_buf_append(out, j->tr->csv.data ? j->tr->csv.data : "", j->tr->csv.len,
				   err);
	}
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	return st;
}

enum dg_status master_job_cancel(struct master *m, const char *id, struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	uint64_t step;
	bool created;

	if (!j)
		return DG_ENOTFOUND;
	pthread_mutex_lock(&m->mu);
	j->cancel = true;
	step = j->cur_step;
	created = j->state == JOB_CREATED;
	pthread_cond_broadcast(&m->cv);   /* a training job's coordinator stops its replicas */
	pthread_mutex_unlock(&m->mu);
	if (created)
		finish_job(m, j, DG_ECANCELED, NULL);
	else if (step)
		abort_everywhere(m, j, step, "job canceled");
	job_put(m, j);
	return DG_OK;
}

void master_jobs_free(struct master *m)
{
	master_cancel_all(m);
	pthread_mutex_lock(&m->mu);
	while (m->n_threads > 0)
		pthread_cond_wait(&m->cv, &m->mu);
	for (int i = 0; i < m->n_jobs; i++)
		job_put_locked(m->jobs[i]);
	m->n_jobs = 0;
	pthread_mutex_unlock(&m->mu);
}

void master_cancel_all(struct master *m)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->mu);
	m->closing = true;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	for (;;) {
		struct job *j = NULL;
		uint64_t step = 0;
		/* One job at a time, without the lock held across the aborts. */
		pthread_mutex_lock(&m->mu);
		for (int i = 0; i < m->n_jobs && !j; i++)
			if (!m->jobs[i]->cancel && !job_over(m->jobs[i]))
				j = m->jobs[i];
		if (j) {
			j->cancel = true;
			j->refs++;
			step = j->cur_step;
		}
		pthread_mutex_unlock(&m->mu);
		if (!j)
			break;
		if (step)
			abort_everywhere(m, j, step, "the master is shutting down");
		job_put(m, j);
	}
}
