/* The master's HTTP routes (POST /v1/jobs and friends, doc/http-api.md
 * "Executor and master") and its state: thin handlers that parse the request,
 * call the job table (jobs.c) and encode the reply. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "dg/buf.h"
#include "dg/clock.h"
#include "dg/log.h"
#include "dg/codec.h"
#include "dg/wire.h"
#include "internal.h"

#define EVENTS_MAX_WAIT_MS 60000

static enum dg_status reply_status(struct master *m, const char *id, int code,
				   struct dg_http_resp *w, struct dg_err *err)
{
	json_t *o = master_job_status(m, id, true, err);

	if (!o)
		return err ? err->code : DG_ENOTFOUND;
	dg_http_set_json(w, code, o);
	return DG_OK;
}

static enum dg_status h_submit(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			       struct dg_err *err)
{
	struct master *m = ctx;
	size_t len = 0;
	const void *body = dg_http_body(r, &len);
	json_error_t je;
	json_t *doc = json_loadb(body ? body : "", len, 0, &je);
	char id[16];
	enum dg_status st;

	if (!doc) {
		dg_err_set(err, DG_EINVAL, "job is not valid JSON: %s (line %d, column %d)",
			   je.text, je.line, je.column);
		return DG_EINVAL;
	}
	st = master_job_submit(m, doc, id, sizeof id, err);
	json_decref(doc);
	if (st != DG_OK)
		return st;
	return reply_status(m, id, 201, w, err);
}

static enum dg_status h_list(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			     struct dg_err *err)
{
	(void)r;
	(void)err;
	dg_http_set_json(w, 200, json_pack("{s:o}", "jobs", master_job_list(ctx)));
	return DG_OK;
}

static enum dg_status h_status(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			       struct dg_err *err)
{
	return reply_status(ctx, dg_http_param(r, "id"), 200, w, err);
}

static enum dg_status h_cancel(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			       struct dg_err *err)
{
	enum dg_status st = master_job_cancel(ctx, dg_http_param(r, "id"), err);

	return st != DG_OK ? st : reply_status(ctx, dg_http_param(r, "id"), 200, w, err);
}

static enum dg_status h_start(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			      struct dg_err *err)
{
	enum dg_status st = master_job_start(ctx, dg_http_param(r, "id"), err);

	return st != DG_OK ? st : reply_status(ctx, dg_http_param(r, "id"), 200, w, err);
}

static enum dg_status h_feed(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			     struct dg_err *err)
{
	struct dg_tensor *t = NULL;
	enum dg_status st = dg_wire_req_body(r, &t, err);

	if (st != DG_OK)
		return st;
	st = master_job_feed(ctx, dg_http_param(r, "id"), dg_http_param(r, "name"),
					    t, err);
	if (st == DG_OK)
		dg_http_set_status(w, 204);
	return st;
}

static enum dg_status h_events(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			       struct dg_err *err)
{
	int64_t from, wait_ms, next = 0;
	bool over = false;
	char buf[32];
	enum dg_status st;

	if ((st = dg_http_query_int(r, "from", 0, &from, err)) != DG_OK ||
	    (st = dg_http_query_int(r, "timeout_ms", 10000, &wait_ms, err)) != DG_OK)
		return st;
	if (wait_ms < 0 || wait_ms > EVENTS_MAX_WAIT_MS)
		return dg_err_set(err, DG_EINVAL, "timeout_ms must be from 0 to %d",
				  EVENTS_MAX_WAIT_MS);
	st = master_job_events(ctx, dg_http_param(r, "id"), from, wait_ms,
			       dg_http_body_buf(w, "application/x-ndjson"), &next, &over, err);
	if (st != DG_OK)
		return st;
	snprintf(buf, sizeof buf, "%" PRId64, next);
	dg_http_add_header(w, "Dg-Count", buf);
	dg_http_add_header(w, "Dg-Job-Over", over ? "1" : "0");
	return DG_OK;
}

/* The fetched value: raw (Dg-Dtype, Dg-Shape) unless ?format= or Accept asks
 * for .npy or text. */
static enum dg_status h_result(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			       struct dg_err *err)
{
	struct dg_tensor *t = NULL;
	enum dg_encoding enc;
	enum dg_status st = dg_wire_req_encoding(r, true, &enc, err);

	if (st == DG_OK)
		st = master_job_result(ctx, dg_http_param(r, "id"), dg_http_param(r, "name"), &t,
				       err);
	if (st != DG_OK)
		return st;
	if (enc == DG_ENC_NPY) {
		st = dg_npy_encode(t, dg_http_body_buf(w, dg_encoding_mime(enc)), err);
	} else if (enc == DG_ENC_TEXT) {
		st = dg_text_encode(t, dg_http_body_buf(w, dg_encoding_mime(enc)), err);
	} else {
		dg_wire_add_tensor_headers(w, t->dtype, &t->shape);
		st = dg_buf_append(dg_http_body_buf(w, dg_encoding_mime(DG_ENC_RAW)), t->data,
				   t->nbytes, err);
	}
	dg_tensor_free(t);
	return st;
}

static enum dg_status h_steps(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
			      struct dg_err *err)
{
	return master_job_steps(ctx, dg_http_param(r, "id"), dg_http_body_buf(w, "text/csv"),
				err);
}

static enum dg_status h_metrics(void *ctx, struct dg_http_req *r, struct dg_http_resp *w,
				struct dg_err *err)
{
	return master_job_metrics(ctx, dg_http_param(r, "id"), dg_http_body_buf(w, "text/csv"),
				  err);
}

static const struct dg_route master_routes[] = {
	{ "POST", "/v1/jobs", h_submit, "submit a graph: place, partition, run (JSON job)" },
	{ "GET", "/v1/jobs", h_list, "list the jobs of this master" },
	{ "GET", "/v1/jobs/{id}", h_status, "a job's state, steps, error, placement, timings" },
	{ "DELETE", "/v1/jobs/{id}", h_cancel, "cancel a job (aborts its step on every task)" },
	{ "POST", "/v1/jobs/{id}/start", h_start, "start a job created with \"start\": false" },
	{ "PUT", "/v1/jobs/{id}/feeds/{name...}", h_feed, "upload a feed (raw or .npy)" },
	{ "GET", "/v1/jobs/{id}/events", h_events, "progress as JSON lines (long poll)" },
	{ "GET", "/v1/jobs/{id}/results/{name...}", h_result, "a fetched value (raw/npy/text)" },
	{ "GET", "/v1/jobs/{id}/metrics", h_metrics, "a training job's metrics and evals (CSV)" },
	{ "GET", "/v1/jobs/{id}/steps", h_steps, "a queue-fed training job's step ledger (CSV)" },
};

/* The task interface of every cluster task: this one's own, the others
 * remote. */
/* Every lease_ms / 4: renew the fragments this master registered on each
 * other task (one request per task that holds any). A task that does not
 * answer is tried again next time; its fragments outlive a few misses. */
static void *renew_main(void *arg)
{
	struct master *m = arg;

	int64_t period = m->lease.lease_ms / 4;
	/* each task's request within its share of a period, so that stuck tasks
	 * cannot make a round outlast the others' leases */
	long share = (long)(period / (m->cluster->n_tasks > 1 ? m->cluster->n_tasks - 1 : 1));
	struct dg_deadline next = dg_deadline_in_ms(period);

	if (share < 100)
		share = 100;
	pthread_mutex_lock(&m->ren_mu);
	while (!m->ren_quit) {
		struct timespec dl = dg_deadline_timespec(next);
		while (!m->ren_quit &&
		       pthread_cond_timedwait(&m->ren_cv, &m->ren_mu, &dl) != ETIMEDOUT)
			;
		if (m->ren_quit)
			break;
		next = dg_deadline_in_ms(period);       /* from the round's start */
		pthread_mutex_unlock(&m->ren_mu);
		for (int t = 0; t < m->cluster->n_tasks; t++) {
			struct dg_err e = { 0 };
			if (m->tasks[t] && m->tasks[t]->ops->renew &&
			    m->tasks[t]->ops->renew(m->tasks[t], share, &e) != DG_OK)
				dg_log(DG_LOG_DEBUG, "master", "renewing the fragments on %s: %s",
				       m->cluster->tasks[t].address, e.msg);
		}
		pthread_mutex_lock(&m->ren_mu);
	}
	pthread_mutex_unlock(&m->ren_mu);
	return NULL;
}

static enum dg_status tasks_new(struct master *m, struct dg_err *err)
{
	int self = master_self(m);

	m->tasks = calloc((size_t)m->cluster->n_tasks + 1, sizeof *m->tasks);
	if (!m->tasks)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (self >= 0 && !(m->tasks[self] = mtask_local_new(m->cluster, self, m->w, m->token,
							     err)))
		return err ? err->code : DG_ENOMEM;
	for (int t = 0; t < m->cluster->n_tasks; t++) {
		if (t == self)
			continue;
		m->tasks[t] = mtask_remote_new(m->cluster, t, m->token,
					       self >= 0 ? m->tasks[self] : NULL, &m->lease, err);
		if (!m->tasks[t])
			return err ? err->code : DG_ENOMEM;
	}
	return DG_OK;
}

struct master *master_new(const struct master_config *cfg, struct worker *w,
			  struct dg_err *err)
{
	struct master *m = calloc(1, sizeof *m);
	uint64_t r = 0;

	if (!m)
		return dg_err_set(err, DG_ENOMEM, "out of memory"), NULL;
	m->cluster = cfg->cluster;
	m->job = strdup(cfg->job ? cfg->job : "worker");
	m->task = cfg->task;
	m->token = cfg->token ? strdup(cfg->token) : NULL;
	m->soft_placement = cfg->soft_placement;
	m->w = w;
	m->jobs = calloc(MASTER_MAX_JOBS, sizeof *m->jobs);
	if (!m->job || (cfg->token && !m->token) || !m->jobs || !cfg->cluster || !w) {
		free(m->job);
		free(m->token);
		free(m->jobs);
		free(m);
		return dg_err_set(err, cfg->cluster && w ? DG_ENOMEM : DG_EINVAL,
				  "master_new: needs a cluster and a worker"), NULL;
	}
	/* Step ids: 22 random bits per master above a 40-bit counter, so steps of
	 * masters on different tasks (and restarts) do not collide; below 2^63
	 * because JSON integers (jansson) are signed 64-bit. */
	if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
		r = (uint64_t)time(NULL) * 2654435761u;
	m->step_base = (r & 0x3fffff0000000000ull) | ((uint64_t)1 << 62);
	pthread_mutex_init(&m->mu, NULL);
	dg_cond_init_mono(&m->cv);      /* its timed waits take monotonic deadlines */
	pthread_mutex_init(&m->ren_mu, NULL);
	dg_cond_init_mono(&m->ren_cv);
	/* the owner names this run of this master: a restarted one renews
	 * nothing of its predecessor's */
	m->lease.lease_ms = cfg->fragment_lease_ms > 0 ? cfg->fragment_lease_ms :
			    MASTER_FRAGMENT_LEASE_MS;
	int self = master_self(m);
	snprintf(m->lease.owner, sizeof m->lease.owner, "%s/%016" PRIx64,
		 self >= 0 ? m->cluster->tasks[self].address : "master", r ^ (uint64_t)getpid());
	m->group = (struct dg_route_group){ master_routes,
					    (int)(sizeof master_routes / sizeof master_routes[0]),
					    m };
	if (tasks_new(m, err) != DG_OK) {
		master_free(m);
		return NULL;
	}
	if (pthread_create(&m->renewer, NULL, renew_main, m) != 0) {
		dg_err_set(err, DG_ENOMEM, "cannot start the master's lease renewer");
		master_free(m);
		return NULL;
	}
	m->ren_started = true;
	return m;
}

const struct dg_route_group *master_route_group(struct master *m)
{
	return &m->group;
}

void master_free(struct master *m)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->ren_mu);
	m->ren_quit = true;
	pthread_cond_broadcast(&m->ren_cv);
	pthread_mutex_unlock(&m->ren_mu);
	if (m->ren_started)
		pthread_join(m->renewer, NULL);
	master_jobs_free(m);
	for (int t = 0; m->tasks && t < m->cluster->n_tasks; t++)
		mtask_free(m->tasks[t]);
	free(m->tasks);
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	pthread_cond_destroy(&m->ren_cv);
	pthread_mutex_destroy(&m->ren_mu);
	free(m->jobs);
	free(m->job);
	free(m->token);
	free(m);
}
