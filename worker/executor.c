/* The worker state and the fragment executor (dg/executor.h). Fragments are
 * validated once at registration, when the per-step plan is precomputed
 * (value numbering, consumer lists, reader counts); a run then walks a ready
 * list: every ready registry or worker op first, and only when none is left
 * it waits for whichever pending _Recv arrives first, so one thread never
 * blocks on one tensor while another it could use has arrived (no deadlock
 * however the master cut the graph). Values are freed after their last reader. */
#include "internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/client.h"
#include "dg/exec.h"
#include "dg/graph.h"
#include "dg/log.h"

/* Per request to another task (a _Send's PUT returns at once on the peer). */
#define SEND_TIMEOUT_MS 120000

struct fragment {
	struct fragment *next;
	char id[24];
	struct dg_graph *g;             /* owned */
	int refs;                       /* the registry's + one per running step; under mu */
	/* The plan: output k of node v is value base[v] + k. */
	int *base;                      /* n_nodes + 1 */
	int n_values;
	int *uses;                      /* per value: reading input edges */
	int *cons_off;                  /* n_nodes + 1: consumers of v are cons[off[v]..off[v+1]) */
	int *cons;                      /* one entry per input edge, the reading node */
	unsigned char *kind;            /* enum worker_opkind per node */
	int *recvs;                     /* the _Recv nodes */
	int n_recv;
	int max_in, max_out;
};

/* A kept-alive connection to a peer, reused across steps and threads. */
struct pooled {
	struct pooled *next;
	bool is_var;                    /* dg_client (VarRead etc.) or dg_http_client (_Send) */
	void *obj;
	char addr[];
};

struct worker {
	const struct dg_cluster *cluster;
	char *job;
	int task;
	char *token;
	bool soft_placement;
	char address[300];              /* under mu */
	struct dg_rendezvous *rv;
	struct dg_route_group group;
	pthread_mutex_t mu;
	struct fragment *frags;         /* under mu */
	int n_frags;
	uint64_t next_id;
	struct pooled *pool;            /* under mu */
	atomic_bool stopping;
	/* Metrics. */
	atomic_uint_fast64_t steps_ok, steps_failed, nodes_run, step_us;
	atomic_uint_fast64_t sent_local, sent_http, bytes_local, bytes_http;
	atomic_uint_fast64_t recv_http, bytes_recv_http;
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------- the state */

struct worker *worker_new(const struct worker_config *cfg, struct dg_err *err)
{
	struct worker *w = calloc(1, sizeof *w);

	if (!w || !(w->job = strdup(cfg->job ? cfg->job : "worker")) ||
	    (cfg->token && !(w->token = strdup(cfg->token))) || !(w->rv = dg_rendezvous_new())) {
		if (w) {
			free(w->job);
			free(w->token);
		}
		free(w);
		dg_err_set(err, DG_ENOMEM, "out of memory creating the worker state");
		return NULL;
	}
	w->cluster = cfg->cluster;
	w->task = cfg->task;
	w->soft_placement = cfg->soft_placement;
	snprintf(w->address, sizeof w->address, "%s", cfg->address ? cfg->address : "");
	pthread_mutex_init(&w->mu, NULL);
	atomic_init(&w->stopping, false);
	w->group = (struct dg_route_group){ worker_routes, worker_n_routes, w };
	return w;
}

void worker_set_address(struct worker *w, const char *address)
{
	pthread_mutex_lock(&w->mu);
	snprintf(w->address, sizeof w->address, "%s", address ? address : "");
	pthread_mutex_unlock(&w->mu);
}

void worker_stop(struct worker *w)
{
	if (!w)
		return;
	atomic_store(&w->stopping, true);
	dg_rendezvous_close(w->rv);
}

static void fragment_free(struct fragment *f)
{
	if (!f)
		return;
	dg_graph_free(f->g);
	free(f->base);
	free(f->uses);
	free(f->cons_off);
	free(f->cons);
	free(f->kind);
	free(f->recvs);
	free(f);
}

static void pooled_free(struct pooled *p)
{
	if (p->is_var)
		dg_client_free(p->obj);
	else
		dg_http_client_free(p->obj);
	free(p);
}

void worker_free(struct worker *w)
{
	if (!w)
		return;
	worker_stop(w);
	for (struct fragment *f = w->frags, *next; f; f = next) {
		next = f->next;
		fragment_free(f);
	}
	for (struct pooled *p = w->pool, *next; p; p = next) {
		next = p->next;
		pooled_free(p);
	}
	dg_rendezvous_free(w->rv);
	pthread_mutex_destroy(&w->mu);
	free(w->job);
	free(w->token);
	free(w);
}

const struct dg_route_group *worker_route_group(struct worker *w)
{
	return &w->group;
}

struct dg_rendezvous *worker_rendezvous(struct worker *w)
{
	return w->rv;
}

const char *worker_job(const struct worker *w)
{
	return w->job;
}

int worker_task(const struct worker *w)
{
	return w->task;
}

bool worker_soft_placement(const struct worker *w)
{
	return w->soft_placement;
}

/* A pooled connection to addr (or a new one). Owned by the caller until
 * given back with pool_give. */
static struct pooled *pool_take(struct worker *w, bool is_var, const char *addr,
				struct dg_err *err)
{
	struct pooled *p = NULL;
	size_t n = strlen(addr);

	pthread_mutex_lock(&w->mu);
	for (struct pooled **pp = &w->pool; *pp; pp = &(*pp)->next) {
		if ((*pp)->is_var == is_var && strcmp((*pp)->addr, addr) == 0) {
			p = *pp;
			*pp = p->next;
			break;
		}
	}
	pthread_mutex_unlock(&w->mu);
	if (p)
		return p;
	if (!(p = calloc(1, sizeof *p + n + 1))) {
		dg_err_set(err, DG_ENOMEM, "out of memory connecting to %s", addr);
		return NULL;
	}
	memcpy(p->addr, addr, n + 1);
	p->is_var = is_var;
	p->obj = is_var ? (void *)dg_client_new(addr, w->token, err) :
		 (void *)dg_http_client_new(addr, w->token, SEND_TIMEOUT_MS, err);
	if (!p->obj) {
		free(p);
		return NULL;
	}
	return p;
}

static void pool_give(struct worker *w, struct pooled *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&w->mu);
	p->next = w->pool;
	w->pool = p;
	pthread_mutex_unlock(&w->mu);
}

/* ------------------------------------------------------------ fragments */

/* Precompute what every run of f needs; refuse what no run could do. */
static enum dg_status plan_fragment(struct fragment *f, struct dg_err *err)
{
	const struct dg_graph *g = f->g;
	int n = g->n_nodes, n_edges = 0;

	f->base = malloc(((size_t)n + 1) * sizeof *f->base);
	f->cons_off = calloc((size_t)n + 2, sizeof *f->cons_off);
	f->kind = calloc((size_t)n + 1, 1);
	f->recvs = malloc(((size_t)n + 1) * sizeof *f->recvs);
	if (!f->base || !f->cons_off || !f->kind || !f->recvs)
		return dg_err_set(err, DG_ENOMEM, "out of memory planning a fragment of %d nodes",
				  n);
	f->base[0] = 0;
	f->max_in = f->max_out = 1;
	for (int v = 0; v < n; v++) {
		const struct dg_node *nd = &g->nodes[v];
		if (nd->op->flags & DG_OPF_FEED) {
			dg_err_set(err, DG_EINVAL, "node '%s' (%s): a fragment cannot hold a "
				   "Placeholder", nd->name, nd->op->name);
			dg_err_hint(err, "the master sends fed values with _Send/_Recv");
			return DG_EINVAL;
		}
		if ((int64_t)f->base[v] + nd->n_out > INT32_MAX / 2 ||
		    (int64_t)n_edges + nd->n_in > INT32_MAX / 2)
			return dg_err_set(err, DG_ETOOLARGE, "fragment has too many edges");
		f->base[v + 1] = f->base[v] + nd->n_out;
		n_edges += nd->n_in;
		f->kind[v] = (unsigned char)worker_op_kind(nd->op);
		if (f->kind[v] == WOP_RECV)
			f->recvs[f->n_recv++] = v;
		if (nd->n_in > f->max_in)
			f->max_in = nd->n_in;
		if (nd->n_out > f->max_out)
			f->max_out = nd->n_out;
		for (int k = 0; k < nd->n_in; k++)
			f->cons_off[nd->in[k].node + 1]++;
	}
	f->n_values = f->base[n];
	f->uses = calloc((size_t)f->n_values + 1, sizeof *f->uses);
	f->cons = malloc(((size_t)n_edges + 1) * sizeof *f->cons);
	int *fill = calloc((size_t)n + 1, sizeof *fill);
	if (!f->uses || !f->cons || !fill) {
		free(fill);
		return dg_err_set(err, DG_ENOMEM, "out of memory planning a fragment of %d nodes",
				  n);
	}
	for (int v = 0; v < n; v++)
		f->cons_off[v + 1] += f->cons_off[v];
	for (int v = 0; v < n; v++) {
		const struct dg_node *nd = &g->nodes[v];
		for (int k = 0; k < nd->n_in; k++) {
			int p = nd->in[k].node;
			f->cons[f->cons_off[p] + fill[p]++] = v;
			f->uses[f->base[p] + nd->in[k].index]++;
		}
	}
	free(fill);
	return DG_OK;
}

enum dg_status worker_fragment_add(struct worker *w, const char *json, size_t len, char *id,
				   size_t id_len, int *n_nodes, struct dg_err *err)
{
	struct fragment *f = calloc(1, sizeof *f);
	enum dg_status st = DG_OK;

	if (!f)
		return dg_err_set(err, DG_ENOMEM, "out of memory registering a fragment");
	if (!(f->g = dg_graph_parse(json ? json : "", json ? len : 0, worker_op_find, err)))
		st = err && err->code != DG_OK ? err->code : DG_EINVAL;
	else
		st = plan_fragment(f, err);
	if (st != DG_OK) {
		dg_err_prefix(err, "fragment");
		fragment_free(f);
		return st;
	}
	pthread_mutex_lock(&w->mu);
	if (w->n_frags >= WORKER_MAX_FRAGMENTS) {
		st = dg_err_set(err, DG_ETOOLARGE, "task %s/%d already holds %d fragments", w->job,
				w->task, w->n_frags);
		dg_err_hint(err, "delete fragments no longer needed (DELETE /v1/fragments/ID)");
	} else {
		snprintf(f->id, sizeof f->id, "f%" PRIu64, ++w->next_id);
		f->refs = 1;
		f->next = w->frags;
		w->frags = f;
		w->n_frags++;
		snprintf(id, id_len, "%s", f->id);
		if (n_nodes)
			*n_nodes = f->g->n_nodes;
	}
	pthread_mutex_unlock(&w->mu);
	if (st != DG_OK)
		fragment_free(f);
	return st;
}

/* Under mu: drop one reference; the last frees (outside the lock is not
 * needed: freeing touches nothing shared). */
static void fragment_unref_locked(struct fragment *f)
{
	if (--f->refs == 0)
		fragment_free(f);
}

enum dg_status worker_fragment_remove(struct worker *w, const char *id, struct dg_err *err)
{
	struct fragment *f = NULL;

	pthread_mutex_lock(&w->mu);
	for (struct fragment **pp = &w->frags; *pp; pp = &(*pp)->next) {
		if (strcmp((*pp)->id, id) == 0) {
			f = *pp;
			*pp = f->next;
			w->n_frags--;
			fragment_unref_locked(f);
			break;
		}
	}
	pthread_mutex_unlock(&w->mu);
	if (!f) {
		dg_err_set(err, DG_ENOTFOUND, "fragment '%.40s' not found on task %s/%d", id,
			   w->job, w->task);
		dg_err_hint(err, "register it first with POST /v1/fragments");
		return DG_ENOTFOUND;
	}
	return DG_OK;
}

/* ------------------------------------------------------------------ runs */

struct run {
	struct worker *w;
	struct fragment *f;
	const struct dg_graph *g;
	uint64_t step;
	int64_t deadline;               /* now_ms() clock */
	char self[300];                 /* this task's address */
	struct dg_tensor **val;         /* n_values, owned */
	int *uses;                      /* readers still to come, per value */
	int *pending;                   /* inputs not yet computed, per node */
	int *ready;                     /* min-heap of runnable non-_Recv nodes */
	int n_ready;
	const struct dg_tensor **ins;
	struct dg_tensor **outs;
	struct dg_err *err;
};

/* The ready set is a min-heap of node indices: independent nodes run in
 * file order, so stateful ops (VarInit before VarApply) keep the order the
 * fragment lists them in. */
static void ready_push(struct run *r, int v)
{
	int i = r->n_ready++;

	while (i > 0 && r->ready[(i - 1) / 2] > v) {
		r->ready[i] = r->ready[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	r->ready[i] = v;
}

static int ready_pop(struct run *r)
{
	int top = r->ready[0], last = r->ready[--r->n_ready], i = 0;

	for (;;) {
		int c = 2 * i + 1;
		if (c >= r->n_ready)
			break;
		if (c + 1 < r->n_ready && r->ready[c + 1] < r->ready[c])
			c++;
		if (r->ready[c] >= last)
			break;
		r->ready[i] = r->ready[c];
		i = c;
	}
	if (r->n_ready > 0)
		r->ready[i] = last;
	return top;
}

static void release(struct run *r, int v)
{
	if (--r->uses[v] == 0) {
		dg_tensor_free(r->val[v]);
		r->val[v] = NULL;
	}
}

static enum dg_status send_remote(struct run *r, const char *to, const char *key,
				  const struct dg_tensor *t)
{
	struct dg_buf path = { 0 };
	struct dg_http_result res;
	char shape[200], step[32];
	size_t off = 0;
	enum dg_status st;
	struct pooled *p = pool_take(r->w, false, to, r->err);

	if (!p)
		return r->err->code;
	if (t->shape.ndim == 0)
		snprintf(shape, sizeof shape, "[]");
	else
		shape[0] = '\0';
	for (int i = 0; i < t->shape.ndim; i++)
		off += (size_t)snprintf(shape + off, sizeof shape - off, "%s%" PRId64,
					i ? "," : "", t->shape.dim[i]);
	snprintf(step, sizeof step, "%" PRIu64, r->step);
	struct dg_http_header h[] = {
		{ "Dg-Dtype", dg_dtype_name(t->dtype) },
		{ "Dg-Shape", shape },
		{ "Content-Type", "application/octet-stream" },
	};
	dg_http_result_init(&res);
	st = dg_buf_printf(&path, r->err, "/v1/steps/%s/tensors/", step);
	if (st == DG_OK)
		st = dg_http_escape_path(key, &path, r->err);
	if (st == DG_OK)
		st = dg_http_request(p->obj, "PUT", path.data, h, 3, t->data, t->nbytes, &res,
				     r->err);
	if (st != DG_OK)
		dg_err_prefix(r->err, "sending '%s' to %s", key, to);
	dg_http_result_deinit(&res);
	dg_buf_deinit(&path);
	pool_give(r->w, p);
	return st;
}

/* _Send: local delivery moves the value when this is its last reader. */
static enum dg_status run_send(struct run *r, const struct dg_node *n, int iv)
{
	const char *key = json_string_value(json_object_get(n->attrs, "key"));
	const char *to = json_string_value(json_object_get(n->attrs, "to"));
	struct dg_tensor *t;

	if (strcmp(to, r->self) != 0) {
		atomic_fetch_add(&r->w->sent_http, 1);
		atomic_fetch_add(&r->w->bytes_http, r->val[iv]->nbytes);
		return send_remote(r, to, key, r->val[iv]);
	}
	atomic_fetch_add(&r->w->sent_local, 1);
	atomic_fetch_add(&r->w->bytes_local, r->val[iv]->nbytes);
	if (r->uses[iv] == 1) {
		t = r->val[iv];
		r->val[iv] = NULL;
	} else if (!(t = dg_tensor_clone(r->val[iv], r->err))) {
		return r->err->code;
	}
	return dg_rendezvous_put(r->w->rv, r->step, key, t, r->err);
}

static struct dg_tensor *version_tensor(uint64_t version, struct dg_err *err)
{
	struct dg_shape s = { 0 };
	struct dg_tensor *t = dg_tensor_new(DG_I64, &s, err);

	if (t)
		*(int64_t *)t->data = (int64_t)version;
	return t;
}

/* VarRead, VarApply, VarInit: one request (two for VarInit) to the ps. */
static enum dg_status run_var(struct run *r, const struct dg_node *n, int kind,
			      const struct dg_tensor *in, struct dg_tensor **out)
{
	const char *var = json_string_value(json_object_get(n->attrs, "var"));
	const char *ps = json_string_value(json_object_get(n->attrs, "ps"));
	struct dg_var_info info;
	struct dg_tensor *t = NULL;
	enum dg_status st;
	struct pooled *p = pool_take(r->w, true, ps, r->err);

	if (!p)
		return r->err->code;
	if (kind == WOP_VAR_READ) {
		st = dg_var_get(p->obj, var, out, NULL, r->err);
		if (st == DG_OK && !dg_exec_type_ok(&n->out[0], *out, r->err))
			dg_err_prefix(r->err, "variable '%s' on %s", var, ps);
		st = r->err->code;
	} else if (kind == WOP_VAR_APPLY) {
		struct dg_apply a = { .step = -1, .replica = -1 };
		struct dg_apply_result res = { 0 };
		double zero = 0;
		bool no = false;
		a.rule = json_string_value(json_object_get(n->attrs, "rule"));
		dg_attr_float(n->attrs, "lr", &zero, &a.lr, NULL);
		dg_attr_float(n->attrs, "momentum", &zero, &a.momentum, NULL);
		dg_attr_float(n->attrs, "beta1", &zero, &a.beta1, NULL);
		dg_attr_float(n->attrs, "beta2", &zero, &a.beta2, NULL);
		dg_attr_float(n->attrs, "eps", &zero, &a.eps, NULL);
		dg_attr_bool(n->attrs, "nesterov", &no, &a.nesterov, NULL);
		st = dg_var_apply(p->obj, var, &a, in, &res, r->err);
		if (st == DG_OK && !(*out = version_tensor(res.version, r->err)))
			st = r->err->code;
	} else {
		st = dg_var_stat(p->obj, var, &info, r->err);
		if (st == DG_ENOTFOUND) {
			struct dg_put_opts po = { .create_only = true };
			dg_err_clear(r->err);
			if (!(t = worker_init_tensor(n->attrs, r->err)))
				st = r->err->code;
			else
				st = dg_var_put(p->obj, var, t, &po, &info.version, r->err);
			if (st == DG_EEXIST || st == DG_ECONFLICT) {     /* created meanwhile */
				dg_err_clear(r->err);
				st = dg_var_stat(p->obj, var, &info, r->err);
			}
		}
		if (st == DG_OK && !(*out = version_tensor(info.version, r->err)))
			st = r->err->code;
	}
	if (st != DG_OK && kind != WOP_VAR_READ)
		dg_err_prefix(r->err, "variable '%s' on %s", var, ps);
	dg_tensor_free(t);
	pool_give(r->w, p);
	return st;
}

/* The node became computed: store its outputs, release its inputs, and make
 * consumers whose inputs are all there ready. outs[] is taken. */
static void complete(struct run *r, int v)
{
	const struct fragment *f = r->f;
	const struct dg_node *n = &r->g->nodes[v];

	for (int o = 0; o < n->n_out; o++) {
		int ov = f->base[v] + o;
		if (r->uses[ov] == 0)
			dg_tensor_free(r->outs[o]);
		else
			r->val[ov] = r->outs[o];
		r->outs[o] = NULL;
	}
	for (int k = 0; k < n->n_in; k++) {
		int iv = f->base[n->in[k].node] + n->in[k].index;
		if (r->uses[iv] > 0)
			release(r, iv);
	}
	for (int i = f->cons_off[v]; i < f->cons_off[v + 1]; i++)
		if (--r->pending[f->cons[i]] == 0)
			ready_push(r, f->cons[i]);
}

static enum dg_status run_node(struct run *r, int v)
{
	const struct fragment *f = r->f;
	const struct dg_node *n = &r->g->nodes[v];
	enum dg_status st;
	int iv = 0;

	for (int k = 0; k < n->n_in; k++) {
		iv = f->base[n->in[k].node] + n->in[k].index;
		r->ins[k] = r->val[iv];
	}
	memset(r->outs, 0, (size_t)n->n_out * sizeof *r->outs);
	switch (f->kind[v]) {
	case WOP_NONE:
		return dg_exec_kernel(n, r->ins, r->outs, r->step, r->err);
	case WOP_SEND:
		st = run_send(r, n, iv);
		if (st == DG_OK && !r->val[iv])
			r->uses[iv] = 0;                /* moved into the rendezvous */
		break;
	default:
		st = run_var(r, n, f->kind[v], n->n_in ? r->ins[0] : NULL, r->outs);
		break;
	}
	if (st != DG_OK) {
		for (int o = 0; o < n->n_out; o++) {
			dg_tensor_free(r->outs[o]);
			r->outs[o] = NULL;
		}
		dg_err_prefix(r->err, "node '%s' (%s)", n->name, n->op->name);
	}
	return st;
}

/* Wait for whichever pending _Recv arrives first and complete it. */
static enum dg_status take_recv(struct run *r, int *recvs, int *n_recv)
{
	const char **keys = malloc((size_t)*n_recv * sizeof *keys);
	struct dg_tensor *t = NULL;
	enum dg_status st;
	int which = 0;

	if (!keys)
		return dg_err_set(r->err, DG_ENOMEM, "out of memory waiting for tensors");
	for (int i = 0; i < *n_recv; i++)
		keys[i] = json_string_value(json_object_get(r->g->nodes[recvs[i]].attrs, "key"));
	st = dg_rendezvous_take_any(r->w->rv, r->step, keys, *n_recv, r->deadline - now_ms(),
				    &which, &t, r->err);
	free(keys);
	if (st != DG_OK) {
		if (*n_recv == 1 || st != DG_ETIMEOUT) {
			const struct dg_node *n = &r->g->nodes[recvs[0]];
			dg_err_prefix(r->err, "node '%s' (%s)", n->name, n->op->name);
		}
		return st;
	}
	int v = recvs[which];
	const struct dg_node *n = &r->g->nodes[v];
	if (!dg_exec_type_ok(&n->out[0], t, r->err)) {
		dg_tensor_free(t);
		dg_err_prefix(r->err, "node '%s' (%s): received tensor", n->name, n->op->name);
		return r->err->code;
	}
	recvs[which] = recvs[--*n_recv];
	r->outs[0] = t;
	complete(r, v);
	return DG_OK;
}

static enum dg_status execute(struct run *r, int *count)
{
	const struct fragment *f = r->f;
	int n_recv = f->n_recv;
	int *recvs = malloc(((size_t)f->n_recv + 1) * sizeof *recvs);
	enum dg_status st = DG_OK;

	if (!recvs)
		return dg_err_set(r->err, DG_ENOMEM, "out of memory starting a step");
	memcpy(recvs, f->recvs, (size_t)f->n_recv * sizeof *recvs);
	for (int v = 0; v < r->g->n_nodes; v++) {
		r->pending[v] = r->g->nodes[v].n_in;
		if (r->pending[v] == 0 && f->kind[v] != WOP_RECV)
			ready_push(r, v);
	}
	while (st == DG_OK && (r->n_ready > 0 || n_recv > 0)) {
		if (atomic_load(&r->w->stopping)) {
			st = dg_err_set(r->err, DG_EUNAVAILABLE, "the task is shutting down");
			break;
		}
		if (r->n_ready == 0) {
			if ((st = take_recv(r, recvs, &n_recv)) == DG_OK)
				++*count;
			continue;
		}
		int v = ready_pop(r);
		if ((st = run_node(r, v)) == DG_OK) {
			complete(r, v);
			++*count;
		}
	}
	free(recvs);
	return st;
}

/* Find id and take a reference (under mu), or NULL. */
static struct fragment *fragment_get(struct worker *w, const char *id)
{
	struct fragment *f;

	pthread_mutex_lock(&w->mu);
	for (f = w->frags; f; f = f->next)
		if (strcmp(f->id, id) == 0)
			break;
	if (f)
		f->refs++;
	pthread_mutex_unlock(&w->mu);
	return f;
}

enum dg_status worker_run_fragment(struct worker *w, const char *id, uint64_t step,
				   int64_t timeout_ms, int *nodes_run, struct dg_err *err)
{
	struct dg_err local = { 0 };
	struct run r = { .w = w, .step = step, .err = err ? err : &local };
	enum dg_status st = DG_OK;
	int count = 0;

	dg_err_clear(r.err);
	if (timeout_ms <= 0)
		timeout_ms = WORKER_DEFAULT_TIMEOUT_MS;
	if (timeout_ms > WORKER_MAX_TIMEOUT_MS)
		timeout_ms = WORKER_MAX_TIMEOUT_MS;
	int64_t t0 = now_ms();
	r.deadline = t0 + timeout_ms;
	if (!(r.f = fragment_get(w, id ? id : ""))) {
		dg_err_set(r.err, DG_ENOTFOUND, "fragment '%.40s' not found", id ? id : "");
		dg_err_hint(r.err, "register it first with POST /v1/fragments");
		st = DG_ENOTFOUND;
		goto out;
	}
	r.g = r.f->g;
	pthread_mutex_lock(&w->mu);
	memcpy(r.self, w->address, sizeof r.self);
	pthread_mutex_unlock(&w->mu);
	if (atomic_load(&w->stopping)) {
		st = dg_err_set(r.err, DG_EUNAVAILABLE, "the task is shutting down");
		goto out;
	}
	if (dg_rendezvous_is_aborted(w->rv, step)) {
		st = dg_err_set(r.err, DG_ECANCELED, "step %" PRIu64 " was aborted before it "
				"started here", step);
		goto out;
	}
	r.val = calloc((size_t)r.f->n_values + 1, sizeof *r.val);
	r.uses = malloc(((size_t)r.f->n_values + 1) * sizeof *r.uses);
	r.pending = malloc(((size_t)r.g->n_nodes + 1) * sizeof *r.pending);
	r.ready = malloc(((size_t)r.g->n_nodes + 1) * sizeof *r.ready);
	r.ins = malloc((size_t)r.f->max_in * sizeof *r.ins);
	r.outs = calloc((size_t)r.f->max_out, sizeof *r.outs);
	if (!r.val || !r.uses || !r.pending || !r.ready || !r.ins || !r.outs) {
		st = dg_err_set(r.err, DG_ENOMEM, "out of memory for a step of %d nodes",
				r.g->n_nodes);
		goto out;
	}
	memcpy(r.uses, r.f->uses, (size_t)r.f->n_values * sizeof *r.uses);
	st = execute(&r, &count);
	if (st != DG_OK)
		dg_rendezvous_abort(w->rv, step, r.err->msg);
out:
	if (st != DG_OK)
		dg_err_prefix(r.err, "task %s/%d", w->job, w->task);
	for (int i = 0; r.val && i < r.f->n_values; i++)
		dg_tensor_free(r.val[i]);
	free(r.val);
	free(r.uses);
	free(r.pending);
	free(r.ready);
	free(r.ins);
	free(r.outs);
	if (r.f) {
		pthread_mutex_lock(&w->mu);
		fragment_unref_locked(r.f);
		pthread_mutex_unlock(&w->mu);
	}
	if (nodes_run)
		*nodes_run = count;
	atomic_fetch_add(st == DG_OK ? &w->steps_ok : &w->steps_failed, 1);
	atomic_fetch_add(&w->nodes_run, (uint64_t)count);
	atomic_fetch_add(&w->step_us, (uint64_t)(now_ms() - t0) * 1000);
	return st;
}

void worker_count_received(struct worker *w, size_t n)
{
	atomic_fetch_add(&w->recv_http, 1);
	atomic_fetch_add(&w->bytes_recv_http, n);
}

enum dg_status worker_metrics(void *vw, struct dg_buf *out, struct dg_err *err)
{
	struct worker *w = vw;
	int n_frags;

	pthread_mutex_lock(&w->mu);
	n_frags = w->n_frags;
	pthread_mutex_unlock(&w->mu);
	return dg_buf_printf(out, err,
		"# HELP dg_worker_steps_total Fragment runs (steps) on this task.\n"
		"# TYPE dg_worker_steps_total counter\n"
		"dg_worker_steps_total{result=\"ok\"} %" PRIu64 "\n"
		"dg_worker_steps_total{result=\"error\"} %" PRIu64 "\n"
		"# HELP dg_worker_nodes_run_total Nodes run by fragment runs.\n"
		"# TYPE dg_worker_nodes_run_total counter\n"
		"dg_worker_nodes_run_total %" PRIu64 "\n"
		"# HELP dg_worker_step_seconds_total Time spent in fragment runs.\n"
		"# TYPE dg_worker_step_seconds_total counter\n"
		"dg_worker_step_seconds_total %.3f\n"
		"# HELP dg_worker_fragments Fragments registered on this task.\n"
		"# TYPE dg_worker_fragments gauge\n"
		"dg_worker_fragments %d\n"
		"# HELP dg_worker_tensors_sent_total Tensors sent by _Send.\n"
		"# TYPE dg_worker_tensors_sent_total counter\n"
		"dg_worker_tensors_sent_total{path=\"local\"} %" PRIu64 "\n"
		"dg_worker_tensors_sent_total{path=\"http\"} %" PRIu64 "\n"
		"# HELP dg_worker_bytes_sent_total Bytes of tensors sent by _Send.\n"
		"# TYPE dg_worker_bytes_sent_total counter\n"
		"dg_worker_bytes_sent_total{path=\"local\"} %" PRIu64 "\n"
		"dg_worker_bytes_sent_total{path=\"http\"} %" PRIu64 "\n"
		"# HELP dg_worker_tensors_received_total Tensors received over HTTP.\n"
		"# TYPE dg_worker_tensors_received_total counter\n"
		"dg_worker_tensors_received_total %" PRIu64 "\n"
		"# HELP dg_worker_bytes_received_total Bytes of tensors received over HTTP.\n"
		"# TYPE dg_worker_bytes_received_total counter\n"
		"dg_worker_bytes_received_total %" PRIu64 "\n"
		"# HELP dg_worker_rendezvous_tensors Tensors waiting to be received.\n"
		"# TYPE dg_worker_rendezvous_tensors gauge\n"
		"dg_worker_rendezvous_tensors %d\n",
		(uint64_t)atomic_load(&w->steps_ok), (uint64_t)atomic_load(&w->steps_failed),
		(uint64_t)atomic_load(&w->nodes_run), (double)atomic_load(&w->step_us) * 1e-6,
		n_frags, (uint64_t)atomic_load(&w->sent_local),
		(uint64_t)atomic_load(&w->sent_http),
		(uint64_t)atomic_load(&w->bytes_local), (uint64_t)atomic_load(&w->bytes_http),
		(uint64_t)atomic_load(&w->recv_http), (uint64_t)atomic_load(&w->bytes_recv_http),
		dg_rendezvous_count(w->rv));
}

enum dg_status worker_run_fragment_local(struct worker *w, const char *fragment_id,
					 uint64_t step, int64_t timeout_ms, struct dg_err *err)
{
	return worker_run_fragment(w, fragment_id, step, timeout_ms, NULL, err);
}
