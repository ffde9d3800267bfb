/* The master's job table and its queries: a job's life (created, running,
 * over), references, its event log (JSON lines, long-polled), and the
 * routes' reads of a job (events, results, metrics CSV, cancel). Neighbours:
 * submit.c creates jobs, step.c and train_run.c run them, job_status.c
 * turns them into JSON, master.c serves the routes. */
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
#include "dg/clock.h"
#include "internal.h"

const char *const job_state_names[] = { "created", "running", "done", "failed", "canceled" };

double master_now_ms(void)
{
	return (double)dg_mono_ns() * 1e-6;
}

int master_self(const struct master *m)
{
	for (int i = 0; i < m->cluster->n_tasks; i++)
		if (m->cluster->tasks[i].index == m->task &&
		    strcmp(m->cluster->tasks[i].job, m->job) == 0)
			return i;
	return -1;
}

int master_task_at(const struct master *m, const char *peer)
{
	for (int i = 0; peer && peer[0] && i < m->cluster->n_tasks; i++)
		if (strcmp(m->cluster->tasks[i].address, peer) == 0)
			return i;
	return -1;
}

void job_free(struct job *j)
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
	mpool_free(j->pool);
	free(j->frag_id);
	free(j->init_id);
	free(j->explain);
	json_decref(j->recovered);
	free(j->task_epoch);
	partition_deinit(&j->part);
	placement_deinit(&j->pl);
	dg_graph_free(j->g);
	free(j);
}

/* Find job id and take a reference (job_put). NULL with DG_ENOTFOUND. */
struct job *job_get(struct master *m, const char *id, struct dg_err *err)
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

void job_put_locked(struct job *j)
{
	if (j && --j->refs == 0)
		job_free(j);
}

void job_put(struct master *m, struct job *j)
{
	pthread_mutex_lock(&m->mu);
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
}

bool job_over(const struct job *j)
{
	return j->state == JOB_DONE || j->state == JOB_FAILED || j->state == JOB_CANCELED;
}

/* Add j to the table (the table holds a reference), evicting the oldest
 * finished job when full. Called with m->mu held. */
enum dg_status job_table_add(struct master *m, struct job *j, struct dg_err *err)
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
void job_event_locked(struct master *m, struct job *j, json_t *v)
{
	char *line;

	if (!v)
		return;
	json_object_set_new(v, "job", json_string(j->id));
	line = json_dumps(v, JSON_COMPACT);
	json_decref(v);
	job_event_line_locked(m, j, line);
}

void job_event_line_locked(struct master *m, struct job *j, char *line)
{
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

json_t *job_err_json(const struct dg_err *e)
{
	return json_pack("{s:s, s:s, s:s}", "code", dg_status_name(e->code), "message", e->msg,
			 "hint", e->hint);
}

void job_thread_done(struct master *m, struct job *j)
{
	pthread_mutex_lock(&m->mu);
	job_put_locked(j);
	m->n_threads--;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
}

/* The job is over: record the final state, its event, and wake waiters. */
void job_finish(struct master *m, struct job *j, enum dg_status st,
		       const struct dg_err *err)
{
	pthread_mutex_lock(&m->mu);
	j->t_finished = master_now_ms();
	if (st == DG_OK) {
		j->state = JOB_DONE;
	} else if (j->cancel) {
		j->state = JOB_CANCELED;
		dg_err_set(&j->err, DG_ECANCELED, "job %s was canceled", j->id);
	} else {
		j->state = JOB_FAILED;
		j->err = *err;
	}
	json_t *ev = json_pack("{s:s, s:I, s:f}", "event", job_state_names[j->state],
			       "steps_done", (json_int_t)j->steps_done,
			       "ms", j->t_finished - j->t_started);
	if (ev && j->state != JOB_DONE)
		json_object_set_new(ev, "error", job_err_json(&j->err));
	job_event_locked(m, j, ev);
	pthread_mutex_unlock(&m->mu);
	if (j->state == JOB_FAILED)
		dg_log(DG_LOG_WARN, "master", "job %s failed: %s", j->id, j->err.msg);
}

/* ------------------------------------------------------------ a job's tasks */

/* Mark in used[] (per cluster task) the tasks the job has fragments on: its
 * step and init fragments, and a training job's replicas. */
void job_tasks(const struct job *j, bool *used)
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
void job_abort_step(struct master *m, struct job *j, uint64_t step, const char *reason)
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

/* Every task the job uses (job_tasks) must answer the health probe: report
 * the first that does not, by address, before anything is registered. */
enum dg_status job_check_used(struct master *m, const struct job *j,
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
		st = dg_err_set(err, DG_EUNAVAILABLE, "%s does not answer: %s", task_label(m, t).s,
				errs[t].msg);
		dg_err_hint(err, "start that task (dg server --job %s --task %d) or check the "
			    "cluster spec", m->cluster->tasks[t].job, m->cluster->tasks[t].index);
	}
	free(used);
	return st;
}

/* The training side of a job: replicas, figures, plan and spec. */
void train_free(struct master *m, struct train *tr)
{
	if (!tr)
		return;
	for (int r = 0; tr->reps && r < tr->n_reps; r++) {
		struct replica *rp = &tr->reps[r];
		for (int f = 0; rp->frags && f < rp->part.n_frags; f++) {
			mtask_conn_drop(m->tasks[rp->part.frags[f].task], &rp->frags[f].conn);
			free(rp->frags[f].collect);
			free(rp->frags[f].collect_idx);
		}
		free(rp->frags);
		mpool_free(rp->pool);
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
	train_feed_free(tr);
	train_plan_deinit(&tr->plan);
	train_spec_deinit(&tr->spec);
	free(tr);
}

/* A number for JSON: null when not finite (jansson refuses NaN and inf). */
json_t *job_num_json(double x)
{
	return isfinite(x) ? json_real(x) : json_null();
}

enum dg_status master_job_events(struct master *m, const char *id, int64_t from,
				 int64_t timeout_ms, struct dg_buf *out, int64_t *next, bool *over,
				 struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	struct timespec dl = dg_deadline_timespec(dg_deadline_in_ms(timeout_ms));
	enum dg_status st = DG_OK;

	if (!j)
		return DG_ENOTFOUND;
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
				id, job_state_names[j->state], name);
	else
		*out = dg_tensor_clone(j->results[i], err);
	if (st == DG_OK && !*out)
		st = err ? err->code : DG_ENOMEM;
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	return st;
}

/* A training job's CSV into out: its metrics, or (steps) its step ledger. */
static enum dg_status job_csv(struct master *m, const char *id, bool steps, struct dg_buf *out,
			      struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	const struct dg_buf *csv;
	enum dg_status st = DG_OK;

	if (!j)
		return DG_ENOTFOUND;
	/* A running job's ledger takes the ids the ps has logged since the last
	 * read (the job's end reads the rest). */
	pthread_mutex_lock(&m->mu);
	bool running = j->state == JOB_RUNNING && j->tr && j->tr->plan.queue;
	pthread_mutex_unlock(&m->mu);
	if (steps && running)
		train_feed_read_requeues(m, j, false);
	pthread_mutex_lock(&m->mu);
	if (!j->tr) {
		st = dg_err_set(err, DG_ENOTFOUND, "job %s is not a training job: it has no %s", id,
				steps ? "step ledger" : "metrics");
		dg_err_hint(err, "its progress is in GET /v1/jobs/%s/events", id);
	} else if (steps && !j->tr->plan.queue) {
		st = dg_err_set(err, DG_ENOTFOUND, "job %s has no step ledger: it is not a "
				"queue-fed training job", id);
		dg_err_hint(err, "its metrics are in GET /v1/jobs/%s/metrics", id);
	}
	csv = j->tr ? &j->tr->csv : NULL;
	if (st == DG_OK && steps)
		st = train_feed_ledger_locked(j->tr, out, err);
	else if (st == DG_OK)
		st = dg_buf_append(out, csv->data ? csv->data : "", csv->len, err);
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	return st;
}

enum dg_status master_job_metrics(struct master *m, const char *id, struct dg_buf *out,
				  struct dg_err *err)
{
	return job_csv(m, id, false, out, err);
}

enum dg_status master_job_steps(struct master *m, const char *id, struct dg_buf *out,
				struct dg_err *err)
{
	return job_csv(m, id, true, out, err);
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
		job_finish(m, j, DG_ECANCELED, NULL);
	else if (step)
		job_abort_step(m, j, step, "job canceled");
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
			job_abort_step(m, j, step, "the master is shutting down");
		job_put(m, j);
	}
}
