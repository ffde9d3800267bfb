/* One step of a job (doc/graph-execution.md): fragments registered on their
 * tasks, feeds put into the rendezvous of the tasks that read them, every
 * fragment run concurrently (one thread and one kept connection per remote
 * fragment), fetches taken from this task's rendezvous. A failing fragment
 * aborts the step on every task at once, so no _Recv is left waiting for its
 * deadline; a step that failed because a task was lost is re-run once it is
 * back. Every task is reached through its interface (task.h). */
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

/* Register fragment f on its task; id receives its id there. */
enum dg_status step_register(struct master *m, const struct place_fragment *f, char *id,
				    struct dg_err *err)
{
	struct mtask *t = m->tasks[f->task];
	enum dg_status st = t->ops->fragment_add(t, f->doc, id, NULL, err);

	if (st != DG_OK)
		dg_err_prefix(err, "registering a fragment on %s", mtask_label(t).s);
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

void step_unregister_all(struct master *m, struct job *j)
{
	for (int r = 0; j->tr && r < j->tr->n_reps; r++) {
		struct replica *rp = &j->tr->reps[r];
		for (int f = 0; rp->frags && f < rp->part.n_frags; f++)
			unregister_one(m, rp->part.frags[f].task, rp->frags[f].id);
		for (int i = 0; rp->init_id && i < rp->part.n_init; i++)
			unregister_one(m, rp->part.init[i].task, rp->init_id[i]);
	}
	for (int i = 0; j->tr && j->tr->feed_id && i < j->tr->feed_part.n_frags; i++)
		unregister_one(m, j->tr->feed_part.frags[i].task, j->tr->feed_id[i]);
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
		dg_err_prefix(&r->err, "%s", mtask_label(t).s);
	/* The first failure releases every other task's waits at once. */
	if (!atomic_exchange(r->failed, true)) {
		snprintf(reason, sizeof reason, "%s", r->err.msg);
		job_abort_step(r->m, r->j, r->step, reason);
	}
	return NULL;
}

/* Run rs[0..n) at once: the last on this thread, the others on the job's
 * runner threads (pool.c), made on the job's first step of several
 * fragments. */
static void run_all(struct master *m, struct job *j, struct runner *rs, int n)
{
	struct mpool *p = NULL;

	if (n > 1) {
		pthread_mutex_lock(&m->mu);
		if (!j->pool)
			j->pool = mpool_new();
		p = j->pool;
		pthread_mutex_unlock(&m->mu);
	}
	mpool_run(p, run_fragment, rs, sizeof *rs, n);
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
			dg_err_prefix(err, "sending feed '%s' to %s", pf->ref, mtask_label(t).s);
	}
	return st;
}

/* Pick the error that explains a failed step (mtask_failure_over). */
static const struct runner *primary_failure(const struct runner *rs, int n)
{
	const struct runner *best = NULL;

	for (int i = 0; i < n; i++)
		if (rs[i].st != DG_OK && (!best || mtask_failure_over(rs[i].st, rs[i].unreachable,
								     best->st, best->unreachable)))
			best = &rs[i];
	return best;
}

/* Run one step of the n fragments frags (registered as ids) with a fresh
 * cluster-unique step id; unless init, put the feeds first and take the
 * fetched values into j->results. conns: per fragment kept connections or
 * NULL. On failure *down (when not NULL) gets the task that was lost if that
 * explains the failure, else stays -1. */
enum dg_status step_run_frags(struct master *m, struct job *j,
				const struct place_fragment *frags, char (*ids)[24], int n,
				struct mtask_conn **conns, bool init, int *down,
				struct dg_err *err)
{
	struct mtask *self = m->tasks[master_self(m)];
	uint64_t step = m->step_base | (atomic_fetch_add(&m->step_counter, 1) + 1);
	struct runner *rs = calloc((size_t)n + 1, sizeof *rs);
	atomic_bool failed = false;
	enum dg_status st = DG_OK;
	int lost = -1;

	if (!rs) {
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
	for (int i = 0; st == DG_OK && i < n; i++)
		rs[i] = (struct runner){ .m = m, .j = j, .f = &frags[i], .step = step,
					 .id = ids[i], .conn = conns ? &conns[i] : NULL,
					 .failed = &failed };
	if (st == DG_OK)
		run_all(m, j, rs, n);
	if (st == DG_OK && atomic_load(&failed)) {
		const struct runner *r = primary_failure(rs, n);
		*err = r->err;
		st = r->st;
		/* The task did not answer, or it could not reach another (a ps). */
		lost = r->unreachable ? r->f->task : master_task_at(m, err->peer);
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
		job_abort_step(m, j, step, err->msg);
	self->ops->finish(self, step, 1);
out:
	pthread_mutex_lock(&m->mu);
	j->cur_step = 0;
	pthread_mutex_unlock(&m->mu);
	free(rs);
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
void master_wait_locked(struct master *m, double ms)
{
	const struct dg_deadline d = { dg_mono_ns() + (int64_t)(ms * 1e6) };
	struct timespec dl = dg_deadline_timespec(d);

	pthread_cond_timedwait(&m->cv, &m->mu, &dl);
}

#define RECOVERED_VARS_MAX 64      /* variables listed in a "recovered" event */

/* Task t (dev) answers again, with health h: the first replica to see it at
 * this epoch tells the job what the task holds now in a "recovered" event:
 * its epoch (a restart moved it on) and, for a task with variables, the
 * version and sync step of each (what a restarted ps recovered from its data
 * dir: applies after its last snapshot are gone; doc/persistence.md). */
static void note_recovered(struct master *m, struct job *j, int t, const char *dev,
			   const json_t *h, double down_ms)
{
	json_int_t epoch = json_integer_value(json_object_get(h, "epoch"));
	json_int_t n_vars = json_integer_value(json_object_get(h, "vars"));
	double cut = json_number_value(json_object_get(h, "snapshot_at"));
	bool first, restarted = false;
	char key[160];

	snprintf(key, sizeof key, "%s@%" JSON_INTEGER_FORMAT, dev, epoch);
	pthread_mutex_lock(&m->mu);
	if (!j->recovered)
		j->recovered = json_object();
	first = j->recovered && !json_object_get(j->recovered, key);
	if (first)
		json_object_set_new(j->recovered, key, json_true());
	/* A restart (a later epoch than the job saw) of a task whose applies
	 * since its snapshot are gone: the replicas of an async job whose steps'
	 * data follow from their step (ShardBatch, not a queue) re-run the steps
	 * after the snapshot's cut. Set before any replica that waited for the
	 * task goes on, so that none runs a chunk first. */
	if (first && epoch > 0 && (uint64_t)epoch > j->task_epoch[t]) {
		j->task_epoch[t] = (uint64_t)epoch;
		restarted = true;
		for (int r = 0; n_vars > 0 && j->tr && !j->tr->plan.queue && !j->tr->spec.sync &&
		     r < j->tr->n_reps; r++) {
			struct replica *rp = &j->tr->reps[r];
			/* Restarted again before a replica went back: the older cut. */
			rp->rewind_at = rp->rewind && rp->rewind_at < cut ? rp->rewind_at : cut;
			rp->rewind = true;
			snprintf(rp->rewind_task, sizeof rp->rewind_task, "%s", dev);
		}
	}
	pthread_mutex_unlock(&m->mu);
	if (!first)
		return;
	json_t *ev = json_pack("{s:s, s:s, s:I, s:I, s:f}", "event", "recovered", "task", dev,
			       "epoch", epoch, "n_vars", n_vars, "down_ms", down_ms);
	json_t *vars = json_array();
	struct dg_var_info *vi = NULL;
	struct dg_err e = { 0 };
	int n = 0;
	struct dg_client *c = n_vars > 0 ? dg_client_new(m->cluster->tasks[t].address, m->token, &e)
					 : NULL;
	if (c && dg_var_list(c, NULL, &vi, &n, &e) == DG_OK)
		for (int i = 0; i < n && i < RECOVERED_VARS_MAX; i++)
			json_array_append_new(vars, json_pack("{s:s, s:I, s:I}", "name", vi[i].name,
							      "version", (json_int_t)vi[i].version,
							      "step", (json_int_t)vi[i].step));
	else if (c)
		dg_log(DG_LOG_WARN, "master", "job %s: listing the variables of %s: %s", j->id, dev,
		       e.msg);
	free(vi);
	dg_client_free(c);
	if (ev && vars)
		json_object_set(ev, "vars", vars);
	json_decref(vars);
	if (ev && restarted)
		json_object_set_new(ev, "snapshot_at", json_real(cut));
	pthread_mutex_lock(&m->mu);
	job_event_locked(m, j, ev);
	pthread_mutex_unlock(&m->mu);
}

/* Step k of the job (a replica's training step when replica >= 0) failed with
 * *err because task t was lost (task_lost). attempt: re-runs of that step so
 * far. Unless retries are off ("retry_ms": 0), used up (JOB_MAX_RETRIES) or
 * the job is stopping: a "retry" event, then wait up to retry_ms for the task
 * to answer GET /v1/health again. DG_OK: the caller re-registers the task's
 * fragments and re-runs the step. Otherwise *err says why not, naming the
 * task (it did not come back, or kept failing); stopping keeps *err. */
enum dg_status step_retry_wait(struct master *m, struct job *j, int t, int64_t k, int attempt,
				 int replica, struct dg_err *err)
{
	double deadline = master_now_ms() + (double)j->retry_ms;
	char dev[128], first[sizeof err->msg];
	const struct mtask_label lb = task_label(m, t);
	const char *label = lb.s;
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
		job_event_locked(m, j, ev);
	}
	pthread_mutex_unlock(&m->mu);
	if (stop)
		return err->code;
	dg_log(DG_LOG_WARN, "master", "job %s: step %" PRId64 " failed because %s was lost (%s); "
	       "waiting up to %" PRId64 " ms for it to come back", j->id, k, label, first,
	       j->retry_ms);
	double t0 = master_now_ms();
	for (;;) {
		json_t *h = NULL;
		if (m->tasks[t]->ops->health(m->tasks[t], JOB_HEALTH_TIMEOUT_MS, &h, &e) == DG_OK) {
			double paused = master_now_ms() - t0;
			note_recovered(m, j, t, dev, h, paused);
			json_decref(h);
			json_t *ev = json_pack("{s:s, s:s, s:I, s:f}", "event", "resumed", "task", dev,
					       "step", (json_int_t)k, "paused_ms", paused);
			pthread_mutex_lock(&m->mu);
			if (ev && replica >= 0)
				json_object_set_new(ev, "replica", json_integer(replica));
			job_event_locked(m, j, ev);
			pthread_mutex_unlock(&m->mu);
			return DG_OK;
		}
		pthread_mutex_lock(&m->mu);
		double left = deadline - master_now_ms();
		if (!job_stopping_locked(m, j, replica) && left > 0)
			master_wait_locked(m, left < JOB_HEALTH_POLL_MS ? left : JOB_HEALTH_POLL_MS);
		stop = job_stopping_locked(m, j, replica);
		pthread_mutex_unlock(&m->mu);
		if (stop)
			return err->code;
		if (master_now_ms() >= deadline)
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
enum dg_status step_reregister(struct master *m, const struct place_fragment *f, char *id,
				 struct mtask_conn **conn, struct dg_err *err)
{
	unregister_one(m, f->task, id);
	mtask_conn_drop(m->tasks[f->task], conn);
	return step_register(m, f, id, err);
}

/* The init fragments once (no retry: they run before any step). */
enum dg_status step_run_init(struct master *m, struct job *j, struct dg_err *err)
{
	return step_run_frags(m, j, j->part.init, j->init_id, j->part.n_init, NULL, true, NULL, err);
}

/* One step (the job's k-th) of the job's step fragments, re-run on a new step
 * id when a task was lost and came back (step_retry_wait), its fragments
 * registered again. */
enum dg_status step_run(struct master *m, struct job *j, int64_t k, struct dg_err *err)
{
	int down = -1;
	enum dg_status st = step_run_frags(m, j, j->part.frags, j->frag_id, j->part.n_frags,
				      j->conns, false, &down, err);

	for (int attempt = 0; st != DG_OK && down >= 0; attempt++) {
		int t = down;
		if ((st = step_retry_wait(m, j, t, k, attempt, -1, err)) != DG_OK)
			return st;
		down = -1;
		for (int i = 0; st == DG_OK && i < j->part.n_frags; i++)
			if (j->part.frags[i].task == t)
				st = step_reregister(m, &j->part.frags[i], j->frag_id[i], &j->conns[i],
						err);
		if (st != DG_OK) {
			/* Lost again while registering: that counts as a failed run. */
			if (st == DG_EUNAVAILABLE)
				down = t;
			continue;
		}
		st = step_run_frags(m, j, j->part.frags, j->frag_id, j->part.n_frags, j->conns,
			       false, &down, err);
	}
	return st;
}

/* {"event":"step","step":k,"of":steps,"ms":ms,"job":ID} (owned), written
 * directly: up to 2048 of a job's steps have one, and a jansson tree cost
 * ~16k instructions a step. */
static char *step_event(const struct job *j, int64_t k, double ms)
{
	struct dg_buf b = { 0 };
	enum dg_status st = dg_buf_printf(&b, NULL, "{\"event\":\"step\",\"step\":%" PRId64
					  ",\"of\":%" PRId64 ",\"ms\":", k, j->steps);

	if (st == DG_OK)
		st = dg_buf_json_real(&b, ms, NULL);
	if (st == DG_OK)
		st = dg_buf_append(&b, ",\"job\":", 7, NULL);
	if (st == DG_OK)
		st = dg_buf_json_string(&b, j->id, NULL);
	if (st == DG_OK)
		st = dg_buf_append(&b, "}", 1, NULL);
	if (st != DG_OK) {
		dg_buf_deinit(&b);
		return NULL;
	}
	return dg_buf_steal(&b, NULL);
}

static bool want_step_event(int64_t k, int64_t steps)
{
	int64_t every = steps / (JOB_MAX_EVENTS / 2);

	return steps <= JOB_MAX_EVENTS / 2 || k == steps || k % (every ? every : 1) == 0;
}

void *job_main(void *arg)
{
	struct job *j = arg;
	struct master *m = j->m;
	struct dg_err err = { 0 };
	enum dg_status st = DG_OK;

	if (j->part.n_init > 0) {
		st = step_run_init(m, j, &err);
		if (st != DG_OK)
			dg_err_prefix(&err, "initialising variables");
	}
	for (int64_t k = 1; st == DG_OK && k <= j->steps; k++) {
		double t0 = master_now_ms();
		st = step_run(m, j, k, &err);
		if (st != DG_OK)
			break;
		double ms = master_now_ms() - t0;
		pthread_mutex_lock(&m->mu);
		j->steps_done = k;
		j->step_ms_last = ms;
		j->step_ms_sum += ms;
		if (want_step_event(k, j->steps))
			job_event_line_locked(m, j, step_event(j, k, ms));
		pthread_mutex_unlock(&m->mu);
	}
	step_unregister_all(m, j);
	job_finish(m, j, st, &err);
	job_thread_done(m, j);
	return NULL;
}
