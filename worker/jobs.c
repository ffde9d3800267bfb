/* The job table and the step driver of the master: a submitted graph is
 * placed and partitioned (place.c), its fragments registered on their tasks
 * (in-process for this task, POST /v1/fragments for the others), and each step
 * runs every fragment concurrently (one thread and one HTTP client per remote
 * fragment), with feeds put into the tasks' rendezvous first and fetches taken
 * from this task's rendezvous afterwards. A failing fragment aborts the step
 * on every task at once, so no _Recv is left waiting for its deadline. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/buf.h"
#include "dg/client.h"
#include "dg/exec.h"
#include "dg/log.h"
#include "master_internal.h"

enum job_state { JOB_CREATED, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELED };

static const char *const state_names[] = { "created", "running", "done", "failed", "canceled" };

#define JOB_MAX_EVENTS 4096        /* step events are thinned beyond this */
#define JOB_RUN_SLACK_MS 10000     /* HTTP deadline of a run = its _Recv deadline + this */
#define JOB_EXPLAIN_MAX_NODES 10000  /* larger graphs get a per-task summary */

struct job {
	struct master *m;              /* borrowed */
	char id[16];
	int refs;                      /* guarded by m->mu, like every field below that changes */
	enum job_state state;
	int64_t steps, steps_done;
	int64_t timeout_ms;            /* _Recv deadline of each run */
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
	struct dg_http_client **clients; /* per part.frags: used only by that fragment's runner */
	double t_created, t_started, t_finished, step_ms_sum, step_ms_last;   /* ms */
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
static void task_label(const struct master *m, int t, char *buf, size_t n)
{
	snprintf(buf, n, "task /job:%s/task:%d (%s)", m->cluster->tasks[t].job,
		 m->cluster->tasks[t].index, m->cluster->tasks[t].address);
}

/* ------------------------------------------------------------ the table */

static void job_free(struct job *j)
{
	if (!j)
		return;
	for (int i = 0; j->feeds && i < j->part.n_feeds; i++)
		dg_tensor_free(j->feeds[i]);
	for (int i = 0; j->results && i < j->part.n_fetch; i++)
		dg_tensor_free(j->results[i]);
	for (int i = 0; j->clients && i < j->part.n_frags; i++)
		dg_http_client_free(j->clients[i]);
	for (int i = 0; i < j->n_events; i++)
		free(j->events[i]);
	free(j->events);
	free(j->feeds);
	free(j->results);
	free(j->clients);
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

/* One HTTP request to task t with a client made for it (slow path: health,
 * registration, abort); res may be NULL. */
static enum dg_status task_request(struct master *m, int t, const char *method, const char *path,
				   const struct dg_http_header *h, int nh, const void *body,
				   size_t len, long timeout_ms, struct dg_http_result *res,
				   struct dg_err *err)
{
	struct dg_http_result local;
	struct dg_http_client *c = dg_http_client_new(m->cluster->tasks[t].address, m->token,
						      timeout_ms, err);
	enum dg_status st;

	if (!c)
		return err ? err->code : DG_ENOMEM;
	dg_http_result_init(&local);
	st = dg_http_request(c, method, path, h, nh, body, len, res ? res : &local, err);
	dg_http_result_deinit(&local);
	dg_http_client_free(c);
	return st;
}

/* Abort step on every task in the job's fragments (and this task's
 * rendezvous). Best effort: a task that is down has nothing to release. */
static void abort_everywhere(struct master *m, struct job *j, uint64_t step, const char *reason)
{
	int self = master_self(m);
	char path[200];
	struct dg_buf q = { 0 };

	dg_rendezvous_abort(worker_rendezvous(m->w), step, reason);
	dg_buf_printf(&q, NULL, "/v1/steps/%" PRIu64 "?reason=", step);
	for (const char *s = reason; *s && q.len < 180; s++)
		dg_buf_printf(&q, NULL, (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
			      (*s >= '0' && *s <= '9') ? "%c" : "%%%02X", (unsigned char)*s);
	snprintf(path, sizeof path, "%s", q.data ? q.data : "/");
	dg_buf_deinit(&q);
	for (int i = 0; i < j->part.n_frags; i++) {
		int t = j->part.frags[i].task;
		if (t != self)
			task_request(m, t, "DELETE", path, NULL, 0, NULL, 0, 2000, NULL, NULL);
	}
	for (int i = 0; i < j->part.n_init; i++) {
		int t = j->part.init[i].task;
		if (t != self)
			task_request(m, t, "DELETE", path, NULL, 0, NULL, 0, 2000, NULL, NULL);
	}
}

/* Register fragment f on its task; id receives its id there. */
static enum dg_status register_frag(struct master *m, const struct place_fragment *f, char *id,
				    struct dg_err *err)
{
	char *text = json_dumps(f->doc, JSON_COMPACT);
	struct dg_http_header h[] = { { "Content-Type", "application/json" } };
	struct dg_http_result res;
	enum dg_status st;
	char label[200];

	if (!text)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	dg_http_result_init(&res);
	if (f->task == master_self(m)) {
		st = worker_fragment_add(m->w, text, strlen(text), id, 24, NULL, err);
	} else {
		st = task_request(m, f->task, "POST", "/v1/fragments", h, 1, text, strlen(text),
				  30000, &res, err);
		json_t *reply = st == DG_OK ? json_loadb(res.body.data ? res.body.data : "",
							 res.body.len, 0, NULL) : NULL;
		const char *s = json_string_value(json_object_get(reply, "id"));
		if (st == DG_OK && (!s || strlen(s) >= 24))
			st = dg_err_set(err, DG_EINTERNAL, "POST /v1/fragments answered without "
					"an id");
		if (st == DG_OK)
			snprintf(id, 24, "%s", s);
		json_decref(reply);
	}
	if (st != DG_OK) {
		task_label(m, f->task, label, sizeof label);
		dg_err_prefix(err, "registering a fragment on %s", label);
	}
	dg_http_result_deinit(&res);
	free(text);
	return st;
}

static void unregister_all(struct master *m, struct job *j)
{
	char path[64];
	int self = master_self(m);

	for (int pass = 0; pass < 2; pass++) {
		int n = pass ? j->part.n_init : j->part.n_frags;
		for (int i = 0; i < n; i++) {
			const struct place_fragment *f = pass ? &j->part.init[i]
							      : &j->part.frags[i];
			char *id = pass ? j->init_id[i] : j->frag_id[i];
			if (!id[0])
				continue;
			if (f->task == self) {
				worker_fragment_remove(m->w, id, NULL);
			} else {
				snprintf(path, sizeof path, "/v1/fragments/%s", id);
				task_request(m, f->task, "DELETE", path, NULL, 0, NULL, 0, 5000,
					     NULL, NULL);
			}
			id[0] = '\0';
		}
	}
}

/* ------------------------------------------------------------ one step */

struct runner {
	struct master *m;
	struct job *j;
	const struct place_fragment *f;
	const char *id;
	struct dg_http_client **client;   /* this fragment's kept client; NULL = make one */
	uint64_t step;
	atomic_bool *failed;
	bool unreachable;                 /* the run request got no HTTP answer: the task died */
	enum dg_status st;
	struct dg_err err;
};

static enum dg_status run_remote(struct runner *r)
{
	char path[64], body[96];
	struct dg_http_header h[] = { { "Content-Type", "application/json" } };
	struct dg_http_result res;
	struct dg_http_client *own = NULL, *c;
	enum dg_status st;

	c = r->client ? *r->client : NULL;
	if (!c) {
		c = dg_http_client_new(r->m->cluster->tasks[r->f->task].address, r->m->token,
				       (long)(r->j->timeout_ms + JOB_RUN_SLACK_MS), &r->err);
		if (!c)
			return r->err.code;
		if (r->client)
			*r->client = c;
		else
			own = c;
	}
	snprintf(path, sizeof path, "/v1/fragments/%s/run", r->id);
	snprintf(body, sizeof body, "{\"step\": %" PRIu64 ", \"timeout_ms\": %" PRId64 "}",
		 r->step, r->j->timeout_ms);
	dg_http_result_init(&res);
	st = dg_http_request(c, "POST", path, h, 1, body, strlen(body), &res, &r->err);
	r->unreachable = st != DG_OK && res.status == 0;
	dg_http_result_deinit(&res);
	dg_http_client_free(own);
	return st;
}

static void *run_fragment(void *arg)
{
	struct runner *r = arg;
	char label[200], reason[300];

	if (r->f->task == master_self(r->m))
		r->st = worker_run_fragment_local(r->m->w, r->id, r->step, r->j->timeout_ms,
						  &r->err);
	else
		r->st = run_remote(r);
	if (r->st == DG_OK)
		return NULL;
	/* Name the task unless the executor already did ("task worker/1: node ..."). */
	if (strncmp(r->err.msg, "task ", 5) != 0) {
		task_label(r->m, r->f->task, label, sizeof label);
		dg_err_prefix(&r->err, "%s", label);
	}
	/* The first failure releases every other task's waits at once. */
	if (!atomic_exchange(r->failed, true)) {
		snprintf(reason, sizeof reason, "%s", r->err.msg);
		abort_everywhere(r->m, r->j, r->step, reason);
	}
	return NULL;
}

/* Put the job's feeds for step into the rendezvous of the tasks that read them. */
static enum dg_status put_feeds(struct master *m, struct job *j, uint64_t step,
				struct dg_err *err)
{
	int self = master_self(m);
	enum dg_status st = DG_OK;

	for (int i = 0; st == DG_OK && i < j->part.n_feeds; i++) {
		const struct place_feed *pf = &j->part.feeds[i];
		const struct dg_tensor *t = j->feeds[i];
		char path[DG_RV_KEY_MAX + 64], shape[200] = "";
		if (pf->task < 0)
			continue;
		if (pf->task == self) {
			struct dg_tensor *c = dg_tensor_clone(t, err);
			st = c ? dg_rendezvous_put(worker_rendezvous(m->w), step, pf->key, c, err)
			       : DG_ENOMEM;
			continue;
		}
		for (int d = 0; d < t->shape.ndim; d++)
			snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%" PRId64,
				 d ? "," : "", t->shape.dim[d]);
		struct dg_http_header h[] = { { "Content-Type", "application/octet-stream" },
					      { "Dg-Dtype", dg_dtype_name(t->dtype) },
					      { "Dg-Shape", t->shape.ndim ? shape : "[]" } };
		snprintf(path, sizeof path, "/v1/steps/%" PRIu64 "/tensors/%s", step, pf->key);
		st = task_request(m, pf->task, "PUT", path, h, 3, t->data, t->nbytes, 60000, NULL,
				  err);
		if (st != DG_OK) {
			char label[200];
			task_label(m, pf->task, label, sizeof label);
			dg_err_prefix(err, "sending feed '%s' to %s", pf->ref, label);
		}
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

/* Run one step of frags (the job's step fragments, or its init fragments)
 * with a fresh cluster-unique step id; with fetch, take the fetched values. */
static enum dg_status run_step(struct master *m, struct job *j, bool init, struct dg_err *err)
{
	const struct place_fragment *frags = init ? j->part.init : j->part.frags;
	int n = init ? j->part.n_init : j->part.n_frags;
	uint64_t step = m->step_base | (atomic_fetch_add(&m->step_counter, 1) + 1);
	struct runner *rs = calloc((size_t)n + 1, sizeof *rs);
	pthread_t *th = calloc((size_t)n + 1, sizeof *th);
	bool *started = calloc((size_t)n + 1, sizeof *started);
	atomic_bool failed = false;
	enum dg_status st = DG_OK;

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
		st = put_feeds(m, j, step, err);
	for (int i = 0; st == DG_OK && i < n; i++) {
		rs[i] = (struct runner){ .m = m, .j = j, .f = &frags[i], .step = step,
					 .id = init ? j->init_id[i] : j->frag_id[i],
					 .client = init ? NULL : &j->clients[i],
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
	}
	for (int i = 0; st == DG_OK && !init && i < j->part.n_fetch; i++) {
		struct dg_tensor *t = NULL;
		st = dg_rendezvous_take(worker_rendezvous(m->w), step, j->part.fetch_keys[i], 5000,
					&t, err);
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
	dg_rendezvous_finish(worker_rendezvous(m->w), step);
out:
	pthread_mutex_lock(&m->mu);
	j->cur_step = 0;
	pthread_mutex_unlock(&m->mu);
	free(rs);
	free(th);
	free(started);
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
		st = run_step(m, j, true, &err);
		if (st != DG_OK)
			dg_err_prefix(&err, "initialising variables");
	}
	for (int64_t k = 1; st == DG_OK && k <= j->steps; k++) {
		double t0 = now_ms();
		st = run_step(m, j, false, &err);
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

/* ------------------------------------------------------------ submit */

/* Probe every task's health (bytes held, reachable). reach[t] gets the
 * status, msgs[t] the error text. */
static void probe_tasks(struct master *m, int64_t *bytes, enum dg_status *reach,
			struct dg_err *errs)
{
	for (int t = 0; t < m->cluster->n_tasks; t++) {
		struct dg_http_result res;
		dg_http_result_init(&res);
		reach[t] = task_request(m, t, "GET", "/v1/health", NULL, 0, NULL, 0, 3000, &res,
					&errs[t]);
		if (reach[t] == DG_OK) {
			json_t *h = json_loadb(res.body.data ? res.body.data : "", res.body.len, 0,
					       NULL);
			bytes[t] = json_integer_value(json_object_get(h, "bytes"));
			json_decref(h);
		}
		dg_http_result_deinit(&res);
	}
}

/* Every task the job uses must answer: report the first that does not, by
 * address, before anything is registered. */
static enum dg_status check_used(struct master *m, const struct job *j,
				 const enum dg_status *reach, const struct dg_err *errs,
				 struct dg_err *err)
{
	char label[200];

	for (int pass = 0; pass < 2; pass++) {
		int n = pass ? j->part.n_init : j->part.n_frags;
		for (int i = 0; i < n; i++) {
			int t = pass ? j->part.init[i].task : j->part.frags[i].task;
			if (reach[t] == DG_OK || t == master_self(m))
				continue;
			task_label(m, t, label, sizeof label);
			dg_err_set(err, DG_EUNAVAILABLE, "%s does not answer: %s", label,
				   errs[t].msg);
			dg_err_hint(err, "start that task (dg server --job %s --task %d) or check "
				    "the cluster spec", m->cluster->tasks[t].job,
				    m->cluster->tasks[t].index);
			return DG_EUNAVAILABLE;
		}
	}
	return DG_OK;
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

static enum dg_status job_options(struct job *j, const json_t *body, struct place_opts *po,
				  bool soft_default, struct dg_err *err)
{
	const json_t *v;
	const char *s;

	j->steps = 1;
	j->timeout_ms = WORKER_DEFAULT_TIMEOUT_MS;
	po->soft_placement = soft_default;
	if ((v = json_object_get(body, "steps"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 ||
		    json_integer_value(v) > MASTER_MAX_STEPS)
			return dg_err_set(err, DG_EINVAL, "job \"steps\" must be an integer from 1 "
					  "to %lld", MASTER_MAX_STEPS);
		j->steps = json_integer_value(v);
	}
	if ((v = json_object_get(body, "timeout_ms"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 ||
		    json_integer_value(v) > WORKER_MAX_TIMEOUT_MS)
			return dg_err_set(err, DG_EINVAL, "job \"timeout_ms\" must be an integer "
					  "from 1 to %d", WORKER_MAX_TIMEOUT_MS);
		j->timeout_ms = json_integer_value(v);
	}
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

/* Parse, place and partition body into j. */
static enum dg_status job_build(struct master *m, struct job *j, const json_t *body,
				struct dg_err *err)
{
	static const char *const keys[] = { "graph", "fetch", "feeds", "upload", "steps",
					    "timeout_ms", "soft_placement", "vars", "start" };
	const char **feeds = NULL, **fetch = NULL, *k;
	int n_feeds = 0, n_fetch = 0, nt = m->cluster->n_tasks;
	struct place_opts po = { 0 };
	int64_t *bytes = calloc((size_t)nt + 1, sizeof *bytes);
	enum dg_status *reach = calloc((size_t)nt + 1, sizeof *reach);
	struct dg_err *errs = calloc((size_t)nt + 1, sizeof *errs);
	enum dg_status st = DG_OK;
	json_t *v;

	if (!bytes || !reach || !errs) {
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
	j->g = dg_graph_from_json(json_object_get(body, "graph"), master_op_find, err);
	if (!j->g) {
		st = err ? err->code : DG_EINVAL;
		goto out;
	}
	if ((st = feed_names(body, &feeds, &n_feeds, err)) != DG_OK ||
	    (st = fetch_names(body, &fetch, &n_fetch, err)) != DG_OK)
		goto out;
	probe_tasks(m, bytes, reach, errs);
	po.task_bytes = bytes;
	if ((st = place_graph(j->g, m->cluster, &po, &j->pl, err)) != DG_OK)
		goto out;
	st = place_partition(j->g, m->cluster, &j->pl, master_self(m), feeds, n_feeds, fetch,
			     n_fetch, &j->part, err);
	if (st != DG_OK)
		goto out;
	j->explain = j->g->n_nodes <= JOB_EXPLAIN_MAX_NODES ?
		     place_explain(j->g, m->cluster, &j->pl, &j->part) : explain_summary(m, j);
	j->feeds = calloc((size_t)j->part.n_feeds + 1, sizeof *j->feeds);
	j->results = calloc((size_t)j->part.n_fetch + 1, sizeof *j->results);
	j->clients = calloc((size_t)j->part.n_frags + 1, sizeof *j->clients);
	j->frag_id = calloc((size_t)j->part.n_frags + 1, sizeof *j->frag_id);
	j->init_id = calloc((size_t)j->part.n_init + 1, sizeof *j->init_id);
	if (!j->explain || !j->feeds || !j->results || !j->clients || !j->frag_id || !j->init_id) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if ((st = literal_feeds(j, body, err)) != DG_OK)
		goto out;
	st = check_used(m, j, reach, errs, err);
out:
	free(feeds);
	free(fetch);
	free(bytes);
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
						 j->part.n_frags, "steps", (json_int_t)j->steps));
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
	for (int i = 0; st == DG_OK && i < j->part.n_init; i++)
		st = register_frag(m, &j->part.init[i], j->init_id[i], err);
	for (int i = 0; st == DG_OK && i < j->part.n_frags; i++)
		st = register_frag(m, &j->part.frags[i], j->frag_id[i], err);
	if (st == DG_OK) {
		pthread_t th;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_mutex_lock(&m->mu);
		j->refs++;   /* the thread's reference, dropped by job_main */
		m->n_threads++;
		if (pthread_create(&th, &attr, job_main, j) == 0) {
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

static json_t *job_json_locked(const struct master *m, const struct job *j, bool full)
{
	double end = j->t_finished > 0 ? j->t_finished : now_ms();
	double mean = j->steps_done ? j->step_ms_sum / (double)j->steps_done : 0.0;
	json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:i, s:{s:f, s:f, s:f}}",
			      "id", j->id, "state", state_names[j->state],
			      "steps", (json_int_t)j->steps,
			      "steps_done", (json_int_t)j->steps_done,
			      "fragments", j->part.n_frags,
			      "ms", "total", j->t_started > 0 ? end - j->t_started : 0.0,
			      "last_step", j->step_ms_last, "mean_step", mean);
	char dev[128];

	if (!o)
		return NULL;
	json_object_set_new(o, "error", j->state == JOB_FAILED || j->state == JOB_CANCELED ?
			    err_json(&j->err) : json_null());
	if (!full)
		return o;
	json_t *fetch = json_array(), *feeds = json_array(), *tasks = json_array();
	json_t *place = json_object();
	for (int i = 0; i < j->part.n_fetch; i++)
		json_array_append_new(fetch, json_string(j->part.fetch_keys[i] + 6));
	for (int i = 0; i < j->part.n_feeds; i++)
		json_array_append_new(feeds, json_pack("{s:s, s:b}", "name", j->part.feeds[i].ref,
						       "given", j->feeds[i] != NULL));
	for (int i = 0; i < j->part.n_frags; i++) {
		int t = j->part.frags[i].task;
		place_device_name(m->cluster, t, dev, sizeof dev);
		json_array_append_new(tasks, json_pack("{s:s, s:s, s:i}", "device", dev, "address",
						       m->cluster->tasks[t].address,
						       "nodes", j->part.frags[i].n_nodes));
	}
	json_t *soft = json_array();
	for (int n = 0; n < j->g->n_nodes; n++)
		if (j->pl.soft[n])
			json_array_append_new(soft, json_pack("{s:s, s:s}", "node",
							      j->g->nodes[n].name, "device",
							      j->g->nodes[n].device));
	json_object_set_new(o, "soft", soft);
	/* The whole map only for graphs a person would read; explain has the rest. */
	for (int n = 0; n < j->g->n_nodes && n < 10000; n++) {
		place_device_name(m->cluster, j->pl.task[n], dev, sizeof dev);
		json_object_set_new(place, j->g->nodes[n].name, json_string(dev));
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
