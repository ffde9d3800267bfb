/* The two implementations of the master's task interface (task.h): the
 * master's own task, through direct calls into worker/ (executor and
 * rendezvous), and a remote task, through the typed client of the worker
 * routes (dg/task_client.h). Neighbours: jobs.c and training (their
 * callers), worker/ and core/ below. */
#include "task.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "dg/rendezvous.h"

#define TASK_RUN_SLACK_MS 10000         /* HTTP deadline of a run = its _Recv deadline + this */
#define TASK_REGISTER_MS 30000
#define TASK_REMOVE_MS 5000
#define TASK_ABORT_MS 2000
#define TASK_PUT_MS 60000

/* What both kinds keep: the token for requests (the address is the
 * cluster's, read at each request: a cluster may be given its ports after
 * the master was made). */
struct task_common {
	struct mtask base;
	char *token;                    /* owned; NULL = none */
};

static enum dg_status common_init(struct task_common *t, const struct dg_cluster *cl, int index,
				  const char *token, struct dg_err *err)
{
	t->base.cl = cl;
	t->base.index = index;
	if (token && !(t->token = strdup(token)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

/* A client for one slow-path request (registration, abort, health). */
static struct dg_http_client *client_for(struct mtask *t, long timeout_ms, struct dg_err *err)
{
	const struct task_common *c = (const struct task_common *)t;

	return dg_http_client_new(t->cl->tasks[t->index].address, c->token, timeout_ms, err);
}

/* GET /v1/health of the task's server (both kinds: see mtask_local_new). */
static enum dg_status http_health(struct mtask *t, long timeout_ms, json_t **out,
				  struct dg_err *err)
{
	struct dg_http_client *c = client_for(t, timeout_ms, err);
	enum dg_status st;

	if (out)
		*out = NULL;
	if (!c)
		return err ? err->code : DG_ENOMEM;
	st = dg_task_health(c, out, err);
	dg_http_client_free(c);
	return st;
}

static void common_free(struct mtask *t)
{
	if (t)
		free(((struct task_common *)t)->token);
	free(t);
}

/* ------------------------------------------------------------ this task */

struct local_task {
	struct task_common c;
	struct worker *w;               /* borrowed */
};

static struct worker *worker_of(struct mtask *t)
{
	return ((struct local_task *)t)->w;
}

/* The fragment's document itself, not its text: the worker's graph takes a
 * reference to it (partition.c does not change a fragment once cut). */
static enum dg_status local_fragment_add(struct mtask *t, const json_t *doc, char *id, bool *lost,
					 struct dg_err *err)
{
	if (lost)
		*lost = false;
	return worker_fragment_add_doc(worker_of(t), (json_t *)doc, id, DG_FRAGMENT_ID_MAX, NULL,
				       err);
}

static void local_fragment_remove(struct mtask *t, const char *id)
{
	worker_fragment_remove(worker_of(t), id, NULL);
}

static void local_finish(struct mtask *t, uint64_t step, int64_t count)
{
	for (int64_t i = 0; i < count; i++)
		dg_rendezvous_finish(worker_rendezvous(worker_of(t)), step + (uint64_t)i);
}

/* A multi-step run in-process: worker_run_steps, its results as the remote
 * run's. A failed run leaves what its steps put in the rendezvous (the run
 * takes only the collected keys): dropped here. */
static enum dg_status local_run_steps(struct mtask *t, const char *id,
				      const struct dg_task_run *run,
				      struct dg_task_run_result *out, struct dg_err *err)
{
	struct worker_run_opts o = { .step = run->step, .steps = run->steps,
				     .train_step = run->train_step, .timeout_ms = run->timeout_ms,
				     .collect = run->collect, .n_collect = run->n_collect };
	struct worker_run_result res = { 0 };
	enum dg_status st = worker_run_steps(worker_of(t), id, &o, &res, err);
	struct dg_task_run_result r = { 0 };

	r.values = calloc((size_t)(res.steps_done * run->n_collect) + 1, sizeof *r.values);
	if (!r.values && st == DG_OK)
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int64_t i = 0; r.values && i < res.steps_done; i++) {
		for (int v = 0; v < run->n_collect; v++)
			r.values[i * run->n_collect + v] = res.r[i].values ? res.r[i].values[v] : NAN;
		r.stale += res.r[i].stale;
	}
	r.steps_done = r.values ? res.steps_done : 0;
	r.input_end = res.input_end;
	worker_run_result_deinit(&res);
	if (st != DG_OK)
		local_finish(t, run->step, run->steps);
	if (out)
		*out = r;
	else
		dg_task_run_result_deinit(&r);
	return st;
}

static enum dg_status local_run(struct mtask *t, struct mtask_conn **conn, const char *id,
				const struct dg_task_run *run, struct dg_task_run_result *out,
				bool *lost, struct dg_err *err)
{
	if (lost)
		*lost = false;
	if (run->train_step >= 0 || run->steps != 1 || run->n_collect > 0)
		return local_run_steps(t, id, run, out, err);
	if (out)
		*out = (struct dg_task_run_result){ 0 };
	return worker_run_fragment_local(worker_of(t), id, run->step, run->timeout_ms, err);
}

static enum dg_status local_tensor_put(struct mtask *t, uint64_t step, const char *key,
				       const struct dg_tensor *v, bool *lost, struct dg_err *err)
{
	struct dg_tensor *c = dg_tensor_clone(v, err);

	if (lost)
		*lost = false;
	return c ? dg_rendezvous_put(worker_rendezvous(worker_of(t)), step, key, c, err)
		 : DG_ENOMEM;
}

static enum dg_status local_tensor_take(struct mtask *t, uint64_t step, const char *key,
					int64_t timeout_ms, struct dg_tensor **out,
					struct dg_err *err)
{
	return dg_rendezvous_take(worker_rendezvous(worker_of(t)), step, key, timeout_ms, out, err);
}

static void local_abort(struct mtask *t, uint64_t step, int64_t count, const char *reason)
{
	struct dg_rendezvous *rv = worker_rendezvous(worker_of(t));

	if (count > 1)
		dg_rendezvous_abort_range(rv, step, count, reason);
	else
		dg_rendezvous_abort(rv, step, reason);
}

/* The master runs on it: it answers, but what its health says (the bytes its
 * store holds, its GPUs) is composed by its server. */
static enum dg_status local_health(struct mtask *t, long timeout_ms, json_t **out,
				   struct dg_err *err)
{
	return out ? http_health(t, timeout_ms, out, err) : DG_OK;
}

static void local_conn_free(struct mtask_conn *c)
{
}

static const struct mtask_ops local_ops = {
	.fragment_add = local_fragment_add,
	.fragment_remove = local_fragment_remove,
	.run = local_run,
	.tensor_put = local_tensor_put,
	.tensor_take = local_tensor_take,
	.finish = local_finish,
	.abort = local_abort,
	.health = local_health,
	.conn_free = local_conn_free,
	.free = common_free,
};

struct mtask *mtask_local_new(const struct dg_cluster *cl, int index, struct worker *w,
			      const char *token, struct dg_err *err)
{
	struct local_task *t = calloc(1, sizeof *t);

	if (!t) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	t->c.base.ops = &local_ops;
	t->c.base.local = true;
	t->w = w;
	if (common_init(&t->c, cl, index, token, err) != DG_OK) {
		common_free(&t->c.base);
		return NULL;
	}
	return &t->c.base;
}

/* ------------------------------------------------------------ another task */

struct mtask_conn {
	struct dg_http_client *http;
};

struct remote_task {
	struct task_common c;
	struct mtask *home;             /* borrowed: the master's own task, or NULL */
	const struct mtask_lease *lease;    /* borrowed, or NULL: fragments kept for good */
	atomic_bool holds;              /* a leased fragment was registered here */
};

/* Deliver what a one-step run carried back (dg/task_client.h) into the home
 * task's rendezvous, as the PUTs they replace would have; frees c[0..n). */
static enum dg_status home_put(struct mtask *home, uint64_t step, struct dg_task_carried *c,
			       int n, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	if (!home) {            /* only a run that named its requester gets any */
		dg_task_carried_free(c, n);
		return dg_err_set(err, DG_EINTERNAL, "the task carried tensors back to a run that "
				  "did not name its requester");
	}
	struct dg_rendezvous *rv = worker_rendezvous(worker_of(home));
	for (int i = 0; i < n && st == DG_OK; i++) {
		st = dg_rendezvous_put(rv, step, c[i].key, c[i].t, err);
		c[i].t = NULL;                  /* taken, also on error */
		if (st != DG_OK)
			dg_err_prefix(err, "tensor '%s' carried back in the reply", c[i].key);
	}
	dg_task_carried_free(c, n);
	return st;
}

static enum dg_status remote_fragment_add(struct mtask *t, const json_t *doc, char *id,
					  bool *lost, struct dg_err *err)
{
	struct dg_http_client *c = client_for(t, TASK_REGISTER_MS, err);
	enum dg_status st;

	if (lost)
		*lost = false;
	if (!c)
		return err ? err->code : DG_ENOMEM;
	const struct mtask_lease *l = ((struct remote_task *)t)->lease;
	st = dg_task_fragment_add(c, doc, id, lost, l ? l->owner : NULL, l ? l->lease_ms : 0, err);
	if (st == DG_OK && l)
		atomic_store(&((struct remote_task *)t)->holds, true);
	dg_http_client_free(c);
	return st;
}

static enum dg_status remote_renew(struct mtask *t, long timeout_ms, struct dg_err *err)
{
	struct remote_task *r = (struct remote_task *)t;
	struct dg_http_client *c;
	enum dg_status st;

	if (!r->lease || !atomic_load(&r->holds))
		return DG_OK;
	if (!(c = client_for(t, timeout_ms > 5000 ? 5000 : timeout_ms, err)))
		return err ? err->code : DG_ENOMEM;
	st = dg_task_fragments_renew(c, r->lease->owner, NULL, err);
	dg_http_client_free(c);
	return st;
}

static void remote_fragment_remove(struct mtask *t, const char *id)
{
	struct dg_http_client *c = client_for(t, TASK_REMOVE_MS, NULL);

	if (c)
		dg_task_fragment_remove(c, id, NULL);
	dg_http_client_free(c);
}

/* A one-step run names the home task as its requester, so that the _Sends
 * to it that end their fragment come back in the reply (no PUT, no wake-up
 * of a server thread there): put into its rendezvous before returning, they
 * reach its _Recvs and fetches as a PUT's would. */
static enum dg_status remote_run(struct mtask *t, struct mtask_conn **conn, const char *id,
				 const struct dg_task_run *run, struct dg_task_run_result *out,
				 bool *lost, struct dg_err *err)
{
	struct dg_http_client *http = conn && *conn ? (*conn)->http : NULL;
	struct mtask *home = ((struct remote_task *)t)->home;
	struct dg_task_run req = *run;
	struct dg_task_carried *carried = NULL;
	int n_carried = 0;
	enum dg_status st;

	if (lost)
		*lost = false;
	if (!http && !(http = client_for(t, (long)(run->timeout_ms + TASK_RUN_SLACK_MS), err)))
		return err ? err->code : DG_ENOMEM;
	if (conn && !*conn) {
		if (!(*conn = malloc(sizeof **conn))) {
			dg_http_client_free(http);
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		}
		(*conn)->http = http;
	}
	if (home && run->steps == 1)
		req.from = t->cl->tasks[home->index].address;
	st = dg_task_run(http, id, &req, out, &carried, &n_carried, lost, err);
	if (!conn)
		dg_http_client_free(http);
	if (n_carried > 0 && (st = home_put(home, run->step, carried, n_carried, err)) != DG_OK &&
	    out)
		dg_task_run_result_deinit(out);
	return st;
}

static enum dg_status remote_tensor_put(struct mtask *t, uint64_t step, const char *key,
					const struct dg_tensor *v, bool *lost, struct dg_err *err)
{
	struct dg_http_client *c = client_for(t, TASK_PUT_MS, err);
	enum dg_status st;

	if (lost)
		*lost = false;
	if (!c)
		return err ? err->code : DG_ENOMEM;
	st = dg_task_tensor_put(c, step, key, v, lost, err);
	dg_http_client_free(c);
	return st;
}

static enum dg_status remote_tensor_take(struct mtask *t, uint64_t step, const char *key,
					 int64_t timeout_ms, struct dg_tensor **out,
					 struct dg_err *err)
{
	struct dg_http_client *c = client_for(t, (long)(timeout_ms + TASK_RUN_SLACK_MS), err);
	enum dg_status st;

	*out = NULL;
	if (!c)
		return err ? err->code : DG_ENOMEM;
	st = dg_task_tensor_take(c, step, key, timeout_ms, out, err);
	dg_http_client_free(c);
	return st;
}

static void remote_finish(struct mtask *t, uint64_t step, int64_t count)
{
}

static void remote_abort(struct mtask *t, uint64_t step, int64_t count, const char *reason)
{
	struct dg_http_client *c = client_for(t, TASK_ABORT_MS, NULL);

	if (c)
		dg_task_abort(c, step, count, reason, NULL);
	dg_http_client_free(c);
}

static void remote_conn_free(struct mtask_conn *c)
{
	if (c)
		dg_http_client_free(c->http);
	free(c);
}

static const struct mtask_ops remote_ops = {
	.fragment_add = remote_fragment_add,
	.fragment_remove = remote_fragment_remove,
	.run = remote_run,
	.tensor_put = remote_tensor_put,
	.tensor_take = remote_tensor_take,
	.finish = remote_finish,
	.abort = remote_abort,
	.health = http_health,
	.conn_free = remote_conn_free,
	.free = common_free,
	.renew = remote_renew,
};

struct mtask *mtask_remote_new(const struct dg_cluster *cl, int index, const char *token,
			       struct mtask *home, const struct mtask_lease *lease,
			       struct dg_err *err)
{
	struct remote_task *t = calloc(1, sizeof *t);

	if (!t) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	t->c.base.ops = &remote_ops;
	t->home = home && home->local ? home : NULL;
	t->lease = lease;
	if (common_init(&t->c, cl, index, token, err) != DG_OK) {
		common_free(&t->c.base);
		return NULL;
	}
	return &t->c.base;
}
