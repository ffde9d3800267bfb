/* The worker state and the fragment executor (dg/executor.h). Fragments are
 * validated once at registration, when the per-step plan is precomputed
 * (value numbering, consumer lists, reader counts, the step-invariant part,
 * the order of ops on one variable); a run then walks a ready list: ready
 * kernels run on the run's thread, ps requests and remote _Sends go to a
 * small pool of I/O threads, and only when nothing is ready it waits for
 * whichever comes first, a pending _Recv or an I/O completion, so one thread
 * never blocks on one tensor while another it could use has arrived (no
 * deadlock however the master cut the graph). A one-step run hands the
 * _Sends to its requester that end the fragment back to its caller instead
 * (the run reply carries them). Values are freed after their last reader;
 * step-invariant values are computed once per fragment. */
#include "internal.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/client.h"
#include "dg/clock.h"
#include "dg/exec.h"
#include "dg/task_client.h"
#include "dg/graph.h"
#include "dg/log.h"
#include "dg/wire.h"

/* Per request to another task (a _Send's PUT returns at once on the peer). */
#define SEND_TIMEOUT_MS 120000
/* A sync VarRead's wait for its step is cut into polls of this many ms, so
 * that an abort of the step ends it promptly. */
#define MIN_STEP_POLL_MS 500

struct fragment {
	struct fragment *next;
	struct worker *w;               /* for the cached-bytes gauge */
	char id[24];
	char owner[WORKER_OWNER_MAX];   /* the lease's, "" without one */
	int64_t lease_ms;               /* 0: kept until removed */
	double touched_ms;              /* monotonic: registered, run or renewed; under w->mu */
	struct dg_graph *g;             /* owned */
	int refs;                       /* the registry's + one per running step; under w->mu */
	/* The plan: output k of node v is value base[v] + k. */
	int *base;                      /* n_nodes + 1 */
	int n_values;
	int *uses;                      /* per value: reading input edges */
	int *cons_off;                  /* n_nodes + 1: consumers of v are cons[off[v]..off[v+1]) */
	int *cons;                      /* one entry per input edge, the reading node */
	unsigned char *kind;            /* enum worker_opkind per node */
	struct dg_attr_table **tab;     /* per node, owned: its attrs parsed at registration */
	int n_tab;
	int *recvs;                     /* the _Recv nodes */
	int n_recv;
	int max_in, max_out;
	/* Ordering: pend0[v] = inputs from step-dependent nodes, + 1 when an
	 * earlier op on the same variable (var_next of it is v) must end first. */
	int *pend0;
	int *var_next;                  /* per node: the next op on its variable, or -1 */
	/* A queue-fed step reads its weights once its batch is there (+1 in
	 * pend0 of each VarRead, released when batch_node completes): a batch
	 * that had to be waited for must not find weights that aged meanwhile
	 * (plan_var_order; see also KEPT_MAX_AGE_MS). */
	int batch_node;                 /* the QueueDequeueMany, or -1 */
	int *after_batch;               /* the VarReads it releases */
	int n_after_batch;
	/* When every VarApply of the fragment goes to the ps that holds the
	 * queue, each carries the step's lease and the ps acks it with the last
	 * of them (in the same request as the update: no worker dies between
	 * the two); the QueueAck then sends nothing. 0: the QueueAck acks. */
	int lease_applies;
	/* Per node: it leads to a _Send (plan_urgent). Ready urgent nodes run
	 * before the others, so a value another task waits for leaves first. */
	unsigned char *urgent;
	/* Step-invariant part: nodes whose op is not stateful and whose inputs are
	 * all invariant. The values of it that step-dependent nodes read are
	 * computed by the first step and kept here until the fragment goes. */
	unsigned char *inv;             /* per node */
	int n_inv;
	unsigned char *keep;            /* per value: invariant and read by a dependent node */
	int *inv_uses;                  /* per value: reading edges from invariant nodes */
	struct dg_tensor **cache;       /* per value; owned where keep[] */
	bool cache_ready;               /* under cache_mu */
	uint64_t cached_bytes;
	pthread_mutex_t cache_mu;
	/* Step nodes that run on a GPU (dg_exec_kernel_ids; their values stay in
	 * device memory between them). n_gpu == 0: the CPU path, nothing more. */
	unsigned char *gpu;             /* per node */
	int n_gpu;
	/* Carriable _Sends (plan_carry): every _Recv of the fragment and every
	 * VarRead that waits for a sync step is an ancestor, so once one may
	 * run the step waits for no other task; a one-step run may hand its
	 * value back in the reply to the run's requester. */
	unsigned char *carry;           /* per node */
};

/* A kept-alive connection to a peer, reused across steps and threads. */
struct pooled {
	struct pooled *next;
	bool is_var;                    /* dg_client (VarRead etc.) or dg_http_client (_Send) */
	void *obj;
	char addr[];
};

struct run;

/* One ps request or remote _Send handed to an I/O thread. */
struct io_job {
	struct io_job *next;
	struct run *r;                  /* the run waiting for it (outlives the job) */
	int v;                          /* the node */
	const struct dg_tensor *in;     /* borrowed from the run's values */
	struct dg_tensor *out;          /* owned until the run takes it */
	bool stale;                     /* a sync apply the ps dropped */
	enum dg_status st;
	struct dg_err err;
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
	/* The janitor: forgets fragments whose lease ran out (started with the
	 * first leased fragment). */
	pthread_cond_t jan_cv;          /* under mu */
	pthread_t janitor;
	bool jan_started, jan_quit;
	atomic_uint_fast64_t frags_expired;
	/* The I/O pool: threads started on demand, at most io_max. */
	pthread_mutex_t io_mu;
	pthread_cond_t io_cv;
	struct io_job *io_head, *io_tail;   /* queued jobs; under io_mu */
	int io_queued, io_idle, io_n, io_max;
	bool io_quit;
	pthread_t *io_threads;          /* io_max slots */
	/* Metrics. */
	atomic_uint_fast64_t steps_ok, steps_failed, nodes_run, step_us;
	atomic_uint_fast64_t acks_late;     /* queue acks that failed after their step */
	worker_local_enqueue_fn local_enqueue;  /* this task's own queues, or NULL */
	void *local_enqueue_ud;
	atomic_uint_fast64_t sent_local, sent_http, bytes_local, bytes_http;
	atomic_uint_fast64_t sent_carried, bytes_carried;
	atomic_uint_fast64_t recv_http, bytes_recv_http, cached_bytes;
	/* Tensor bytes of ps requests: [0] pushed (VarApply gradients), [1]
	 * pulled (VarRead values, values an apply returns); [k][1]: to this
	 * task's own ps (no network crossed). */
	atomic_uint_fast64_t ps_bytes[2][2];
};

/* ------------------------------------------------------------- the state */

/* cfg->io_threads, else $DG_WORKER_IO_THREADS, else the default; 0 = none. */
static int io_thread_count(const struct worker_config *cfg)
{
	const char *env = getenv("DG_WORKER_IO_THREADS");
	char *end;
	long n;

	if (cfg->io_threads < 0)
		return 0;
	if (cfg->io_threads > 0)
		return cfg->io_threads < WORKER_MAX_IO_THREADS ? cfg->io_threads :
		       WORKER_MAX_IO_THREADS;
	if (!env || !env[0])
		return WORKER_DEFAULT_IO_THREADS;
	n = strtol(env, &end, 10);
	if (*end != '\0' || n < 0) {
		dg_log(DG_LOG_WARN, "worker", "DG_WORKER_IO_THREADS='%.40s' is not a count >= 0; "
		       "using %d", env, WORKER_DEFAULT_IO_THREADS);
		return WORKER_DEFAULT_IO_THREADS;
	}
	return n < WORKER_MAX_IO_THREADS ? (int)n : WORKER_MAX_IO_THREADS;
}

struct worker *worker_new(const struct worker_config *cfg, struct dg_err *err)
{
	struct worker *w = calloc(1, sizeof *w);
	int io_max = io_thread_count(cfg);

	if (!w || !(w->job = strdup(cfg->job ? cfg->job : "worker")) ||
	    (cfg->token && !(w->token = strdup(cfg->token))) || !(w->rv = dg_rendezvous_new()) ||
	    (io_max > 0 && !(w->io_threads = calloc((size_t)io_max, sizeof *w->io_threads)))) {
		if (w) {
			free(w->job);
			free(w->token);
			dg_rendezvous_free(w->rv);
		}
		free(w);
		dg_err_set(err, DG_ENOMEM, "out of memory creating the worker state");
		return NULL;
	}
	w->cluster = cfg->cluster;
	w->task = cfg->task;
	w->soft_placement = cfg->soft_placement;
	if (cfg->rendezvous_max_bytes) {
		struct dg_rendezvous_limits l;
		dg_rendezvous_get_limits(w->rv, &l);
		l.max_bytes = (size_t)cfg->rendezvous_max_bytes;
		dg_rendezvous_set_limits(w->rv, &l);
	}
	w->io_max = io_max;
	snprintf(w->address, sizeof w->address, "%s", cfg->address ? cfg->address : "");
	pthread_mutex_init(&w->mu, NULL);
	pthread_mutex_init(&w->io_mu, NULL);
	pthread_cond_init(&w->io_cv, NULL);
	dg_cond_init_mono(&w->jan_cv);
	atomic_init(&w->stopping, false);
	w->group = (struct dg_route_group){ worker_routes, worker_n_routes, w };
	return w;
}

void worker_set_local_queues(struct worker *w, worker_local_enqueue_fn fn, void *ud)
{
	w->local_enqueue = fn;
	w->local_enqueue_ud = ud;
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

/* Node v's attrs, as parsed when f was registered. */
static struct dg_attrs attrs_of(const struct fragment *f, int v)
{
	return dg_attr_table_view(f->tab[v]);
}

static void fragment_free(struct fragment *f)
{
	if (!f)
		return;
	for (int i = 0; f->cache && i < f->n_values; i++)
		dg_tensor_free(f->cache[i]);
	if (f->w)
		atomic_fetch_sub(&f->w->cached_bytes, f->cached_bytes);
	pthread_mutex_destroy(&f->cache_mu);
	dg_graph_free(f->g);
	free(f->gpu);
	free(f->carry);
	free(f->base);
	free(f->uses);
	free(f->cons_off);
	free(f->cons);
	free(f->kind);
	for (int i = 0; f->tab && i < f->n_tab; i++)
		dg_attr_table_free(f->tab[i]);
	free(f->tab);
	free(f->recvs);
	free(f->pend0);
	free(f->var_next);
	free(f->after_batch);
	free(f->urgent);
	free(f->inv);
	free(f->keep);
	free(f->inv_uses);
	free(f->cache);
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
	/* The I/O threads finish what is queued (failing fast: stopping is set). */
	pthread_mutex_lock(&w->io_mu);
	w->io_quit = true;
	pthread_cond_broadcast(&w->io_cv);
	pthread_mutex_unlock(&w->io_mu);
	for (int i = 0; i < w->io_n; i++)
		pthread_join(w->io_threads[i], NULL);
	pthread_mutex_lock(&w->mu);
	w->jan_quit = true;
	pthread_cond_broadcast(&w->jan_cv);
	pthread_mutex_unlock(&w->mu);
	if (w->jan_started)
		pthread_join(w->janitor, NULL);
	pthread_cond_destroy(&w->jan_cv);
	for (struct fragment *f = w->frags, *next; f; f = next) {
		next = f->next;
		fragment_free(f);
	}
	for (struct pooled *p = w->pool, *next; p; p = next) {
		next = p->next;
		pooled_free(p);
	}
	dg_rendezvous_free(w->rv);
	pthread_cond_destroy(&w->io_cv);
	pthread_mutex_destroy(&w->io_mu);
	pthread_mutex_destroy(&w->mu);
	free(w->io_threads);
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

static bool is_var_op(int kind)
{
	return kind == WOP_VAR_READ || kind == WOP_VAR_APPLY || kind == WOP_VAR_INIT ||
	       kind == WOP_VAR_GATHER;
}

/* The step-invariant nodes (in topological order, so producers come first)
 * and the values of them that step-dependent nodes read. */
static void plan_invariant(struct fragment *f)
{
	const struct dg_graph *g = f->g;

	for (int k = 0; k < g->n_nodes; k++) {
		int v = g->order[k];
		const struct dg_node *nd = &g->nodes[v];
		bool inv = f->kind[v] == WOP_NONE && !(nd->op->flags & DG_OPF_STATEFUL);
		for (int i = 0; i < nd->n_in && inv; i++)
			inv = f->inv[nd->in[i].node];
		f->inv[v] = inv;
		f->n_inv += inv;
	}
	for (int v = 0; v < g->n_nodes; v++) {
		const struct dg_node *nd = &g->nodes[v];
		for (int i = 0; i < nd->n_in; i++) {
			int iv = f->base[nd->in[i].node] + nd->in[i].index;
			if (!f->inv[nd->in[i].node])
				continue;
			if (f->inv[v])
				f->inv_uses[iv]++;
			else
				f->keep[iv] = 1;
		}
	}
}

/* Ops on one variable (same "ps" and "var") run one after the other in the
 * fragment's topological order (file order among nodes ready together): each
 * waits for the previous one to end. The order never contradicts a data edge,
 * so it adds no cycle. */
static enum dg_status plan_var_order(struct fragment *f, struct dg_err *err)
{
	const struct dg_graph *g = f->g;
	int *last = malloc(((size_t)g->n_nodes + 1) * sizeof *last), n_last = 0;

	for (int v = 0; v < g->n_nodes; v++)
		f->var_next[v] = -1;
	if (!last)
		return dg_err_set(err, DG_ENOMEM, "out of memory planning a fragment of %d nodes",
				  g->n_nodes);
	for (int k = 0; k < g->n_nodes; k++) {
		int v = g->order[k], j;
		if (!is_var_op(f->kind[v]))
			continue;
		const char *var = json_string_value(json_object_get(g->nodes[v].attrs, "var"));
		const char *ps = json_string_value(json_object_get(g->nodes[v].attrs, "ps"));
		for (j = 0; j < n_last; j++) {
			const json_t *a = g->nodes[last[j]].attrs;
			if (strcmp(json_string_value(json_object_get(a, "var")), var) == 0 &&
			    strcmp(json_string_value(json_object_get(a, "ps")), ps) == 0)
				break;
		}
		if (j < n_last) {
			f->var_next[last[j]] = v;
			f->pend0[v]++;
			last[j] = v;
		} else {
			last[n_last++] = v;
		}
	}
	free(last);
	f->batch_node = -1;
	for (int v = 0; v < g->n_nodes && f->batch_node < 0; v++)
		if (f->kind[v] == WOP_QUEUE_DEQUEUE)
			f->batch_node = v;
	if (f->batch_node < 0)
		return DG_OK;
	if (!(f->after_batch = malloc(((size_t)g->n_nodes + 1) * sizeof *f->after_batch)))
		return dg_err_set(err, DG_ENOMEM, "out of memory planning a fragment");
	for (int v = 0; v < g->n_nodes; v++) {
		if (f->kind[v] != WOP_VAR_READ)
			continue;
		f->after_batch[f->n_after_batch++] = v;
		f->pend0[v]++;
	}
	const char *qps = json_string_value(json_object_get(g->nodes[f->batch_node].attrs, "ps"));
	int n_apply = 0, n_acks = 0;
	bool same = qps != NULL;
	for (int v = 0; v < g->n_nodes; v++) {
		if (f->kind[v] == WOP_QUEUE_ACK)
			n_acks++;
		if (f->kind[v] != WOP_VAR_APPLY)
			continue;
		const char *ps = json_string_value(json_object_get(g->nodes[v].attrs, "ps"));
		same &= ps && strcmp(ps, qps) == 0;
		n_apply++;
	}
	f->lease_applies = same && n_apply > 0 && n_acks == 1 ? n_apply : 0;
	return DG_OK;
}

/* Precompute what every run of f needs; refuse what no run could do. */
/* urgent[v]: a _Send is v or is fed by v, through this fragment. The ready
 * list runs such nodes first: a split model's stage then sends what the next
 * stage (or the previous one, in the backward pass) waits for before it
 * computes what only it needs, such as its own weight gradients (measured:
 * bench_train.py --pipeline). */
static void plan_urgent(struct fragment *f)
{
	const struct dg_graph *g = f->g;

	for (int k = g->n_nodes - 1; k >= 0; k--) {
		int v = g->order[k];
		f->urgent[v] = f->kind[v] == WOP_SEND;
		for (int i = f->cons_off[v]; !f->urgent[v] && i < f->cons_off[v + 1]; i++)
			f->urgent[v] = f->urgent[f->cons[i]];
	}
}

static enum dg_status plan_fragment(struct fragment *f, struct dg_err *err)
{
	const struct dg_graph *g = f->g;
	int n = g->n_nodes, n_edges = 0;

	f->base = malloc(((size_t)n + 1) * sizeof *f->base);
	f->cons_off = calloc((size_t)n + 2, sizeof *f->cons_off);
	f->kind = calloc((size_t)n + 1, 1);
	f->recvs = malloc(((size_t)n + 1) * sizeof *f->recvs);
	f->pend0 = calloc((size_t)n + 1, sizeof *f->pend0);
	f->var_next = malloc(((size_t)n + 1) * sizeof *f->var_next);
	f->inv = calloc((size_t)n + 1, 1);
	f->tab = calloc((size_t)n + 1, sizeof *f->tab);
	f->urgent = calloc((size_t)n + 1, 1);
	if (!f->base || !f->cons_off || !f->kind || !f->recvs || !f->pend0 || !f->var_next ||
	    !f->inv || !f->tab || !f->urgent)
		return dg_err_set(err, DG_ENOMEM, "out of memory planning a fragment of %d nodes",
				  n);
	/* Attrs are parsed here, once: every step's kernels and worker ops read
	 * these tables, never the JSON. */
	for (f->n_tab = 0; f->n_tab < n; f->n_tab++) {
		const struct dg_node *nd = &g->nodes[f->n_tab];
		if (!(f->tab[f->n_tab] = dg_attr_table_new(nd->attrs, err))) {
			dg_err_prefix(err, "node '%s' (%s)", nd->name, nd->op->name);
			return err ? err->code : DG_ENOMEM;
		}
	}
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
	f->keep = calloc((size_t)f->n_values + 1, 1);
	f->inv_uses = calloc((size_t)f->n_values + 1, sizeof *f->inv_uses);
	f->cache = calloc((size_t)f->n_values + 1, sizeof *f->cache);
	int *fill = calloc((size_t)n + 1, sizeof *fill);
	if (!f->uses || !f->cons || !fill || !f->keep || !f->inv_uses || !f->cache) {
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
	plan_invariant(f);
	plan_urgent(f);
	for (int v = 0; v < n; v++) {
		const struct dg_node *nd = &g->nodes[v];
		for (int k = 0; k < nd->n_in; k++)
			f->pend0[v] += !f->inv[nd->in[k].node];
	}
	return plan_var_order(f, err);
}

/* Which step nodes run on a GPU: kernels outside the step-invariant part (that
 * part runs once, through dg_exec_kernel) whose device names a usable GPU. */
static enum dg_status plan_gpu(struct fragment *f, struct dg_err *err)
{
	const struct dg_graph *g = f->g;

	if (!(f->gpu = calloc((size_t)g->n_nodes + 1, 1)))
		return dg_err_set(err, DG_ENOMEM, "out of memory planning a fragment of %d nodes",
				  g->n_nodes);
	for (int v = 0; v < g->n_nodes; v++) {
		if (f->kind[v] != WOP_NONE || f->inv[v] || !g->nodes[v].device)
			continue;
		f->gpu[v] = dg_exec_node_gpu(&g->nodes[v]) >= 0;
		f->n_gpu += f->gpu[v];
	}
	return DG_OK;
}

/* Does node v wait for another task or the ps's other clients within a
 * step: a _Recv, or a VarRead of a sync step (min_step_base >= 0)? */
static bool waits(const struct fragment *f, int v)
{
	int64_t base = -1, none = -1;

	if (f->kind[v] == WOP_RECV)
		return true;
	if (f->kind[v] == WOP_VAR_READ || f->kind[v] == WOP_VAR_GATHER)
		dg_attrs_int(attrs_of(f, v), "min_step_base", &none, &base, NULL);
	return base >= 0;
}

/* Which _Sends are carriable (struct fragment): those whose ancestors
 * include every waiting node. Carrying one holds its value until the run
 * ends; since the fragment then needs nothing from anyone, that cannot
 * deadlock, however the rest of the step depends on the value. */
static enum dg_status plan_carry(struct fragment *f, struct dg_err *err)
{
	const struct dg_graph *g = f->g;
	int n = g->n_nodes, n_wait = 0;
	int *stack = malloc(((size_t)n + 1) * sizeof *stack);
	unsigned char *seen = malloc((size_t)n + 1);

	f->carry = calloc((size_t)n + 1, 1);
	if (!stack || !seen || !f->carry) {
		free(stack);
		free(seen);
		return dg_err_set(err, DG_ENOMEM, "out of memory planning a fragment of %d nodes",
				  n);
	}
	for (int v = 0; v < n; v++)
		n_wait += waits(f, v);
	for (int s = 0; s < n; s++) {
		int sp = 0, found = 0;
		if (f->kind[s] != WOP_SEND)
			continue;
		memset(seen, 0, (size_t)n);
		stack[sp++] = s;
		seen[s] = 1;
		while (sp > 0 && found < n_wait) {
			const struct dg_node *nd = &g->nodes[stack[--sp]];
			for (int k = 0; k < nd->n_in; k++) {
				int p = nd->in[k].node;
				if (seen[p])
					continue;
				seen[p] = 1;
				found += waits(f, p);
				stack[sp++] = p;
			}
		}
		f->carry[s] = found == n_wait;
	}
	free(stack);
	free(seen);
	return DG_OK;
}

static enum dg_status lease_check(const struct worker_lease *l, struct dg_err *err)
{
	size_t n = l->owner ? strlen(l->owner) : 0;

	if (n == 0 || n >= WORKER_OWNER_MAX)
		return dg_err_set(err, DG_EINVAL, "a fragment's lease needs an owner of 1..%d "
				  "bytes", WORKER_OWNER_MAX - 1);
	for (size_t i = 0; i < n; i++)
		if (l->owner[i] <= ' ' || l->owner[i] > '~')
			return dg_err_set(err, DG_EINVAL, "a fragment lease's owner has a blank or "
					  "a non-printable byte");
	if (l->lease_ms < WORKER_LEASE_MIN_MS || l->lease_ms > WORKER_LEASE_MAX_MS)
		return dg_err_set(err, DG_EINVAL, "lease_ms=%" PRId64 " is out of %d..%d",
				  l->lease_ms, WORKER_LEASE_MIN_MS, WORKER_LEASE_MAX_MS);
	return DG_OK;
}

/* The janitor's sweep, under mu: fragments whose lease ran out and that no
 * step is running (refs 1) are unlinked onto *gone. */
static void lease_sweep(struct worker *w, double now, struct fragment **gone)
{
	for (struct fragment **pp = &w->frags; *pp;) {
		struct fragment *f = *pp;
		if (f->lease_ms && f->refs == 1 && now - f->touched_ms > (double)f->lease_ms) {
			*pp = f->next;
			w->n_frags--;
			f->next = *gone;
			*gone = f;
		} else {
			pp = &f->next;
		}
	}
}

/* Four sweeps per shortest lease, at most one a second, at least one every
 * 25 ms. */
static void *janitor_main(void *arg)
{
	struct worker *w = arg;

	double last = dg_mono_ms();

	pthread_mutex_lock(&w->mu);
	while (!w->jan_quit) {
		int64_t period = 1000;
		for (struct fragment *f = w->frags; f; f = f->next)
			if (f->lease_ms && f->lease_ms / 4 < period)
				period = f->lease_ms / 4 > 25 ? f->lease_ms / 4 : 25;
		struct timespec dl = dg_deadline_timespec(dg_deadline_in_ms(period));
		pthread_cond_timedwait(&w->jan_cv, &w->mu, &dl);
		if (w->jan_quit)
			break;
		struct fragment *gone = NULL;
		double now = dg_mono_ms();
		/* Woken a whole period late: this process was stopped or starved
		 * (SIGSTOP, a VM pause), not its masters silent. Renewals could not
		 * reach it either: a fresh start for every lease. */
		if (now - last > 2.0 * (double)period + 1000) {
			dg_log(DG_LOG_INFO, "worker", "%s/%d: the fragment janitor was held up "
			       "%.0f ms: every lease starts again", w->job, w->task, now - last);
			for (struct fragment *f = w->frags; f; f = f->next)
				f->touched_ms = now;
		}
		last = now;
		lease_sweep(w, now, &gone);
		pthread_mutex_unlock(&w->mu);
		while (gone) {
			struct fragment *f = gone;
			gone = f->next;
			dg_log(DG_LOG_WARN, "worker", "%s/%d: fragment %s expired: its master %s did "
			       "not renew it within %" PRId64 " ms; forgotten with %" PRIu64
			       " cached bytes", w->job, w->task, f->id, f->owner, f->lease_ms,
			       (uint64_t)f->cached_bytes);
			atomic_fetch_add(&w->frags_expired, 1);
			fragment_free(f);       /* refs was 1: the registry's */
		}
		pthread_mutex_lock(&w->mu);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

/* Under mu. */
static enum dg_status janitor_start(struct worker *w, struct dg_err *err)
{
	if (pthread_create(&w->janitor, NULL, janitor_main, w) != 0)
		return dg_err_set(err, DG_ENOMEM, "cannot start the fragment janitor of %s/%d",
				  w->job, w->task);
	w->jan_started = true;
	return DG_OK;
}

/* Register the fragment of graph g (owned; NULL: it failed to parse, with
 * *err set). */
static enum dg_status fragment_register(struct worker *w, struct dg_graph *g, char *id,
					size_t id_len, int *n_nodes, const struct worker_lease *lease,
					struct dg_err *err)
{
	struct fragment *f;
	enum dg_status st = DG_OK;

	if (lease && (st = lease_check(lease, err)) != DG_OK) {
		dg_graph_free(g);
		return st;
	}
	if (!(f = calloc(1, sizeof *f))) {
		dg_graph_free(g);
		return dg_err_set(err, DG_ENOMEM, "out of memory registering a fragment");
	}
	if (lease) {
		snprintf(f->owner, sizeof f->owner, "%s", lease->owner);
		f->lease_ms = lease->lease_ms;
	}
	pthread_mutex_init(&f->cache_mu, NULL);
	f->w = w;
	if (!(f->g = g))
		st = err && err->code != DG_OK ? err->code : DG_EINVAL;
	else
		st = plan_fragment(f, err);
	if (st == DG_OK)
		st = plan_gpu(f, err);
	if (st == DG_OK)
		st = plan_carry(f, err);
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
		f->touched_ms = dg_mono_ms();
		if (f->lease_ms && !w->jan_started)
			st = janitor_start(w, err);
	}
	if (st == DG_OK) {
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

enum dg_status worker_fragment_add(struct worker *w, const char *json, size_t len, char *id,
				   size_t id_len, int *n_nodes, const struct worker_lease *lease,
				   struct dg_err *err)
{
	struct dg_graph *g = dg_graph_parse(json ? json : "", json ? len : 0, worker_op_find, err);

	return fragment_register(w, g, id, id_len, n_nodes, lease, err);
}

enum dg_status worker_fragment_add_doc(struct worker *w, json_t *doc, char *id, size_t id_len,
				       int *n_nodes, struct dg_err *err)
{
	struct dg_graph *g = dg_graph_from_json(doc, worker_op_find, err);

	return fragment_register(w, g, id, id_len, n_nodes, NULL, err);
}

int worker_fragments_renew(struct worker *w, const char *owner)
{
	double now = dg_mono_ms();
	int n = 0;

	pthread_mutex_lock(&w->mu);
	for (struct fragment *f = w->frags; f; f = f->next) {
		if (f->lease_ms && strcmp(f->owner, owner) == 0) {
			f->touched_ms = now;
			n++;
		}
	}
	pthread_mutex_unlock(&w->mu);
	return n;
}

/* Under mu: drop one reference; the last frees (outside the lock is not
 * needed: freeing touches nothing shared but an atomic gauge). */
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

/* The state of a run, reused from step to step. The run's thread owns every
 * field except the done list (under mu), which I/O threads fill. */
struct run {
	struct worker *w;
	struct fragment *f;
	const struct dg_graph *g;
	uint64_t step;                  /* the step being run */
	int64_t t;                      /* its training step */
	bool id_is_kstep;               /* kernels see the step id, not t (plain runs) */
	int64_t timeout_ms;
	struct dg_deadline deadline;    /* of the step: now + timeout_ms */
	char self[300];                 /* this task's address */
	struct dg_tensor **val;         /* n_values; owned unless f->keep[] (the cache's) */
	int *uses;                      /* readers still to come, per value */
	int *pending;                   /* inputs (and earlier var ops) still to come */
	int *ready;                     /* min-heap of runnable non-_Recv nodes */
	int n_ready;
	int *recvs;                     /* _Recv nodes not yet received */
	int n_recv;
	const struct dg_tensor **ins;
	struct dg_tensor **outs;
	struct dg_exec_gpu *gx;         /* device copies; NULL when no node runs on a GPU */
	int *ids;                       /* with gx: value ids of a node's inputs, then outputs */
	int inflight;                   /* jobs handed to the I/O pool, not yet taken back */
	int count;                      /* nodes run this step */
	int stale;                      /* sync applies dropped this step */
	bool input_end;                 /* a QueueDequeueMany found its queue at its end */
	struct acker *ack;              /* the acks sent after their steps (owned) */
	uint64_t lease;                 /* this step's batch: its lease and examples */
	int64_t lease_n;
	/* Values kept across steps (plan_kept): an async VarApply of a multi-step
	 * run asks the ps for the variable's new value, and the next step's
	 * VarRead of it takes that instead of a GET. Per node; the apply writes
	 * and the read takes in different steps or in var order, never at once. */
	int64_t t_first, t_last;        /* the run's first and last training steps */
	int *kept_src;                  /* per VarRead: the VarApply it takes from, or -1 */
	unsigned char *kept_want;       /* per VarApply: a VarRead takes its value */
	struct dg_tensor **kept;        /* per VarApply: its last value (owned) */
	int64_t *kept_t;                /* per VarApply: the training step of kept */
	int64_t *kept_us;               /* per VarApply: when kept came (dg_mono_us) */
	/* A one-step run's carried _Sends (worker_run_opts.carry_to). */
	const char *carry_to;           /* borrowed; NULL: carry nothing */
	struct dg_task_carried *carried;        /* owned; one slot per node */
	int n_carried;
	size_t carried_bytes;
	pthread_mutex_t mu;
	pthread_cond_t cv;              /* signalled with every job put on done */
	struct io_job *done;            /* under mu */
	atomic_bool has_done;
	struct dg_err *err;
};

/* The ready set is a min-heap of keys: a node's index, plus the node count
 * when it is not urgent, so urgent nodes go first and otherwise independent
 * nodes start in file order. */
static void ready_push(struct run *r, int node)
{
	int i = r->n_ready++, v = node + (r->f->urgent[node] ? 0 : r->g->n_nodes);

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
	return top < r->g->n_nodes ? top : top - r->g->n_nodes;
}

/* A reader of value v is done; the last one frees it (cached values stay). */
static void release(struct run *r, int v)
{
	if (--r->uses[v] == 0) {
		if (!r->f->keep[v])
			dg_tensor_free(r->val[v]);
		r->val[v] = NULL;
		if (r->gx)
			dg_exec_gpu_forget(r->gx, v);
	}
}

/* PUT t to another task's rendezvous. Runs on an I/O thread (or the run's). */
static enum dg_status send_remote(const struct run *r, const char *to, const char *key,
				  const struct dg_tensor *t, struct dg_err *err)
{
	struct pooled *p = pool_take(r->w, false, to, err);
	enum dg_status st;

	if (!p)
		return err->code;
	st = dg_task_tensor_put(p->obj, r->step, key, t, NULL, err);
	if (st != DG_OK)
		dg_err_prefix(err, "sending '%s' to %s", key, to);
	pool_give(r->w, p);
	return st;
}

/* Node n's attrs in this run's fragment: the table parsed at registration. */
static struct dg_attrs node_attrs(const struct run *r, const struct dg_node *n)
{
	return attrs_of(r->f, (int)(n - r->g->nodes));
}

/* A string attr that validation made sure is there ("key", "to", "var", ...). */
static const char *str_attr(const struct run *r, const struct dg_node *n, const char *key)
{
	const char *v = "";

	dg_attrs_string(node_attrs(r, n), key, "", &v, NULL);
	return v;
}

/* _Send to this task: local delivery moves the value when this is its last
 * reader (and it is not a cached one). */
static enum dg_status send_local(struct run *r, const struct dg_node *n, int iv)
{
	const char *key = str_attr(r, n, "key");
	struct dg_tensor *t;

	atomic_fetch_add(&r->w->sent_local, 1);
	atomic_fetch_add(&r->w->bytes_local, r->val[iv]->nbytes);
	if (r->uses[iv] == 1 && !r->f->keep[iv]) {
		t = r->val[iv];
		r->val[iv] = NULL;
	} else if (!(t = dg_tensor_clone(r->val[iv], r->err))) {
		return r->err->code;
	}
	return dg_rendezvous_put(r->w->rv, r->step, key, t, r->err);
}

/* Is node v (with input value iv) a _Send this run carries back? */
static bool carries(const struct run *r, int v, int iv)
{
	const struct dg_tensor *in = r->val[iv];

	return r->carry_to && r->f->carry[v] && in &&
	       in->nbytes <= WORKER_MAX_CARRY_BYTES - r->carried_bytes &&
	       strcmp(str_attr(r, &r->g->nodes[v], "to"), r->carry_to) == 0;
}

/* Keep _Send n's value (moved as send_local does) for the run's reply. */
static enum dg_status carry(struct run *r, const struct dg_node *n, int iv)
{
	struct dg_task_carried *c = &r->carried[r->n_carried];

	if (!(c->key = strdup(str_attr(r, n, "key"))))
		return dg_err_set(r->err, DG_ENOMEM, "out of memory");
	if (r->uses[iv] == 1 && !r->f->keep[iv]) {
		c->t = r->val[iv];
		r->val[iv] = NULL;
	} else if (!(c->t = dg_tensor_clone(r->val[iv], r->err))) {
		free(c->key);
		return r->err->code;
	}
	r->n_carried++;
	r->carried_bytes += c->t->nbytes;
	atomic_fetch_add(&r->w->sent_carried, 1);
	atomic_fetch_add(&r->w->bytes_carried, c->t->nbytes);
	return DG_OK;
}

static struct dg_tensor *version_tensor(int64_t version, struct dg_err *err)
{
	struct dg_shape s = { 0 };
	struct dg_tensor *t = dg_tensor_new(DG_I64, &s, err);

	if (t)
		*(int64_t *)t->data = version;
	return t;
}

/* The learning rate of training step t: lr, lr * F^floor(t/E) ("step") or
 * lr * F^(t/E) ("exponential"). Attrs were checked at registration. */
static double scheduled_lr(struct dg_attrs attrs, int64_t t)
{
	double zero = 0, one = 1, lr, factor;
	int64_t every, one_i = 1;
	const char *kind;

	dg_attrs_float(attrs, "lr", &zero, &lr, NULL);
	dg_attrs_string(attrs, "schedule", "constant", &kind, NULL);
	dg_attrs_float(attrs, "factor", &one, &factor, NULL);
	dg_attrs_int(attrs, "every", &one_i, &every, NULL);
	if (strcmp(kind, "step") == 0)
		return lr * pow(factor, (double)(t / every));
	if (strcmp(kind, "exponential") == 0)
		return lr * pow(factor, (double)t / (double)every);
	return lr;
}

/* qsort order of {int64 row, int64 pos} pairs: by row, then position. */
static int cmp_i64_pair(const void *a, const void *b)
{
	const int64_t *x = a, *y = b;

	if (x[0] != y[0])
		return x[0] < y[0] ? -1 : 1;
	return (x[1] > y[1]) - (x[1] < y[1]);
}

/* Row indices (int32/int64 tensor t) as int64, deduplicated: uniq[0..*nu)
 * ascending and inv[i] the position of element i of t in uniq (both owned).
 * An embedding batch repeats its tokens many times; only distinct rows
 * should cross the network (TensorFlow's unique + gather does the same). */
static enum dg_status unique_rows(const struct dg_tensor *t, int64_t **uniq, int64_t *nu,
				  int64_t **inv, struct dg_err *err)
{
	int64_t n = t->numel, k = 0;
	struct { int64_t row, pos; } *p = malloc((size_t)(n + 1) * sizeof *p);

	*uniq = malloc((size_t)(n + 1) * sizeof **uniq);
	*inv = malloc((size_t)(n + 1) * sizeof **inv);
	if (!p || !*uniq || !*inv) {
		free(p);
		free(*uniq);
		free(*inv);
		*uniq = *inv = NULL;
		return dg_err_set(err, DG_ENOMEM, "out of memory for %lld row indices",
				  (long long)n);
	}
	for (int64_t i = 0; i < n; i++) {
		p[i].row = t->dtype == DG_I32 ? ((const int32_t *)t->data)[i]
					      : ((const int64_t *)t->data)[i];
		p[i].pos = i;
	}
	qsort(p, (size_t)n, sizeof *p, cmp_i64_pair);
	for (int64_t i = 0; i < n; i++) {
		if (i == 0 || p[i].row != p[i - 1].row)
			(*uniq)[k++] = p[i].row;
		(*inv)[p[i].pos] = k - 1;
	}
	free(p);
	*nu = k;
	return DG_OK;
}

/* Input k of node n, which stays alive until n completes (an I/O thread
 * may read it); NULL when it is held on a GPU. */
static const struct dg_tensor *input_value(const struct run *r, const struct dg_node *n, int k)
{
	return r->val[r->f->base[n->in[k].node] + n->in[k].index];
}

/* dst[n] += src[n] for a float gradient row. */
static void row_add(enum dg_dtype dt, size_t n, void *dst, const void *src)
{
	if (dt == DG_F64)
		for (size_t i = 0; i < n; i++)
			((double *)dst)[i] += ((const double *)src)[i];
	else
		for (size_t i = 0; i < n; i++)
			((float *)dst)[i] += ((const float *)src)[i];
}

/* VarApply: the update of training step t; a sync gradient the ps dropped
 * (409 stale) is not an error: *stale is set and the version output is -1.
 * An async apply a VarRead takes from (plan_kept) asks for the new value,
 * unless it is the run's last step, and keeps it for step t+1. */
static enum dg_status var_apply(const struct run *r, struct dg_client *c, const struct dg_node *n,
				const char *var, const struct dg_tensor *g, struct dg_tensor **out,
				bool *stale, uint64_t *pushed, struct dg_err *err)
{
	int v = (int)(n - r->g->nodes);
	struct dg_tensor *value = NULL;
	struct dg_apply a = { .step = -1, .replica = -1 };
	struct dg_apply_result res = { 0 };
	double zero = 0;
	int64_t base, izero = 0, ione = 1, iminus = -1, replicas, backup, *rows = NULL;
	struct dg_tensor *summed = NULL;
	bool no = false, sync;
	enum dg_status st;

	struct dg_attrs at = node_attrs(r, n);

	a.rule = str_attr(r, n, "rule");
	a.lr = scheduled_lr(at, r->t);
	dg_attrs_float(at, "rho", &zero, &a.rho, NULL);
	if (strcmp(a.rule, "moving_average") == 0) {
		double def = 0.99;
		dg_attrs_float(at, "decay", &def, &a.rho, NULL);
	}
	dg_attrs_float(at, "init", &zero, &a.init, NULL);
	dg_attrs_float(at, "momentum", &zero, &a.momentum, NULL);
	dg_attrs_float(at, "beta1", &zero, &a.beta1, NULL);
	dg_attrs_float(at, "beta2", &zero, &a.beta2, NULL);
	dg_attrs_float(at, "eps", &zero, &a.eps, NULL);
	dg_attrs_bool(at, "nesterov", &no, &a.nesterov, NULL);
	dg_attrs_bool(at, "sync", &no, &sync, NULL);
	if (r->f->lease_applies > 0 && r->lease) {
		const struct dg_node *b = &r->g->nodes[r->f->batch_node];
		bool yes = true, requeue = true;
		a.lease_queue = str_attr(r, b, "queue");
		a.lease = r->lease;
		a.lease_count = r->f->lease_applies;
		for (int k = 0; k < r->g->n_nodes; k++)
			if (r->f->kind[k] == WOP_QUEUE_ACK)
				dg_attrs_bool(attrs_of(r->f, k), "requeue_dropped", &yes, &requeue,
					      NULL);
		a.lease_drop = !requeue;
	}
	if (sync) {
		dg_attrs_int(at, "step_base", &izero, &base, NULL);
		dg_attrs_int(at, "replicas", &ione, &replicas, NULL);
		dg_attrs_int(at, "backup", &izero, &backup, NULL);
		dg_attrs_int(at, "replica", &iminus, &a.replica, NULL);
		a.step = base + r->t;
		a.replicas = (int)replicas;
		a.backup = (int)backup;
	}
	dg_tensor_free(r->kept[v]);     /* older than this step: never taken now */
	r->kept[v] = NULL;
	if (n->n_in == 2) {
		/* row-wise: the rows input 1 names, the values of input 0, a
		 * repeated row's values summed here so each row travels once */
		const struct dg_tensor *ix = input_value(r, n, 1);
		int64_t *inv = NULL, nu;
		if (!ix)
			return dg_err_set(err, DG_EINTERNAL, "the rows of a row-wise apply are not "
					  "in host memory");
		if (ix->numel != (g->shape.ndim ? g->shape.dim[0] : -1))
			return dg_err_set(err, DG_ESHAPE, "row-wise apply of '%s': %lld rows, %lld "
					  "rows of values", var, (long long)ix->numel,
					  g->shape.ndim ? (long long)g->shape.dim[0] : -1LL);
		if ((st = unique_rows(ix, &rows, &nu, &inv, err)) != DG_OK)
			return st;
		if (nu < ix->numel) {
			struct dg_shape sh = g->shape;
			size_t rl = ix->numel ? g->numel / (size_t)ix->numel : 0;
			sh.dim[0] = nu;
			if (!(summed = dg_tensor_new(g->dtype, &sh, err))) {
				free(rows);
				free(inv);
				return err->code;
			}
			for (int64_t i = 0; i < ix->numel; i++)
				row_add(g->dtype, rl, (char *)summed->data +
					(size_t)inv[i] * rl * dg_dtype_size(g->dtype),
					(const char *)g->data + (size_t)i * rl * dg_dtype_size(g->dtype));
			g = summed;
		}
		free(inv);
		a.rows = rows;
		a.n_rows = nu;
	}
	*pushed = g->nbytes + (uint64_t)a.n_rows * 8;
	if (r->kept_want[v] && !sync && r->t < r->t_last && !a.rows)
		st = dg_var_apply_value(c, var, &a, g, &res, &value, NULL, err);
	else
		st = dg_var_apply(c, var, &a, g, &res, err);
	if (st == DG_OK && value) {
		r->kept[v] = value;
		r->kept_t[v] = r->t;
		r->kept_us[v] = dg_mono_us();
	} else {
		dg_tensor_free(value);
	}
	if (st == DG_ESTALE && sync) {
		dg_err_clear(err);
		*stale = true;
		res.version = (uint64_t)-1;
		st = DG_OK;
	}
	if (st == DG_OK && !(*out = version_tensor((int64_t)res.version, err)))
		st = err->code;
	free(rows);
	dg_tensor_free(summed);
	return st;
}

/* In a queue-fed fragment, a value an async apply returned is taken by the
 * next step's VarRead only while it is this young: a step that waited longer
 * (for its queue batch) reads the variable again, or it would compute on
 * weights that other replicas have moved on since. Other fragments take it
 * whatever its age (their steps wait for nothing but their own work; a slow
 * build's steps are longer than this). */
#define KEPT_MAX_AGE_US 5000

/* Read var (whole, or the rows uniq names when not NULL); with base >= 0
 * first wait until its sync step reaches base + t (step t-1 applied), in
 * polls that notice an abort of the step. */
static enum dg_status read_at_step(const struct run *r, struct dg_client *c, const char *var,
				   const struct dg_tensor *uniq, int64_t base,
				   struct dg_tensor **out, struct dg_err *err)
{
	enum dg_status st;

	if (base < 0)
		return uniq ? dg_var_get_rows(c, var, uniq, 0, 0, out, NULL, err)
			    : dg_var_get(c, var, out, NULL, err);
	for (;;) {
		int64_t left = dg_deadline_left_ms(r->deadline);
		long poll = left < MIN_STEP_POLL_MS ? (long)left : MIN_STEP_POLL_MS;
		if ((st = dg_rendezvous_check(r->w->rv, r->step, err)) != DG_OK)
			return st;
		if (left <= 0) {
			dg_err_set(err, DG_ETIMEOUT, "it did not reach sync step %" PRId64
				   " within %" PRId64 " ms", base + r->t, r->timeout_ms);
			dg_err_hint(err, "another replica may be slow or gone; raise the step's "
				    "timeout_ms or use backup replicas");
			return DG_ETIMEOUT;
		}
		st = uniq ? dg_var_get_rows(c, var, uniq, base + r->t, poll, out, NULL, err)
			  : dg_var_wait_step(c, var, base + r->t, poll, out, NULL, err);
		if (st != DG_ETIMEOUT)
			return st;
		dg_err_clear(err);
	}
}

/* VarRead; with min_step_base >= 0 it waits until the variable's sync step
 * reaches min_step_base + t (step t-1 applied), in polls that notice an abort.
 * An async one takes the value step t-1's apply kept (var_apply), if any. */
static enum dg_status var_read(const struct run *r, struct dg_client *c, const struct dg_node *n,
			       const char *var, struct dg_tensor **out, struct dg_err *err)
{
	int64_t base, none = -1;
	int src = r->kept_src[n - r->g->nodes];

	dg_attrs_int(node_attrs(r, n), "min_step_base", &none, &base, NULL);
	if (base < 0 && src >= 0 && r->kept[src] && r->kept_t[src] == r->t - 1 &&
	    (r->f->batch_node < 0 || dg_mono_us() - r->kept_us[src] <= KEPT_MAX_AGE_US)) {
		*out = r->kept[src];
		r->kept[src] = NULL;
		return DG_OK;
	}
	return read_at_step(r, c, var, NULL, base, out, err);
}

/* out = Gather(got, inv) shaped indices' shape + got's rows: the distinct
 * rows got ([nu] + rest) put back where the indices named them. */
static enum dg_status expand_rows(const struct dg_tensor *got, const struct dg_tensor *indices,
				  const int64_t *inv, int64_t nu, struct dg_tensor **out,
				  struct dg_err *err)
{
	struct dg_shape sh = indices->shape;
	size_t rb = got->shape.dim[0] ? got->nbytes / (size_t)got->shape.dim[0] : 0;

	if (got->shape.ndim < 1 || got->shape.dim[0] != nu)
		return dg_err_set(err, DG_EIO, "the ps answered %lld rows for %lld asked",
				  got->shape.ndim ? (long long)got->shape.dim[0] : -1LL,
				  (long long)nu);
	if (sh.ndim + got->shape.ndim - 1 > DG_MAX_DIMS)
		return dg_err_set(err, DG_ESHAPE, "the gathered rows would have more than %d dims",
				  DG_MAX_DIMS);
	for (int i = 1; i < got->shape.ndim; i++)
		sh.dim[sh.ndim++] = got->shape.dim[i];
	if (!(*out = dg_tensor_new_uninit(got->dtype, &sh, err)))
		return err->code;
	for (int64_t i = 0; i < indices->numel && rb; i++)
		memcpy((char *)(*out)->data + (size_t)i * rb,
		       (const char *)got->data + (size_t)inv[i] * rb, rb);
	return DG_OK;
}

/* VarGather: the rows indices names, waiting for a sync step as var_read;
 * each distinct row is asked for once. */
static enum dg_status var_gather(const struct run *r, struct dg_client *c, const struct dg_node *n,
				 const char *var, const struct dg_tensor *indices,
				 struct dg_tensor **out, uint64_t *moved, struct dg_err *err)
{
	int64_t base, none = -1;
	enum dg_status st;

	struct dg_tensor *uniq = NULL, *got = NULL;
	int64_t *u = NULL, *inv = NULL, nu;

	dg_attrs_int(node_attrs(r, n), "min_step_base", &none, &base, NULL);
	/* ask for each distinct row once, then expand them here */
	if ((st = unique_rows(indices, &u, &nu, &inv, err)) != DG_OK)
		return st;
	struct dg_shape us = dg_shape_make(1, (int64_t[]){ nu });
	uniq = dg_tensor_from_data(DG_I64, &us, u, err);
	free(u);
	st = uniq ? read_at_step(r, c, var, uniq, base, &got, err) : err->code;
	if (st == DG_OK) {
		moved[0] = uniq->nbytes;        /* the indices sent, the rows received */
		moved[1] = got->nbytes;
		st = expand_rows(got, indices, inv, nu, out, err);
	}
	dg_tensor_free(uniq);
	dg_tensor_free(got);
	free(inv);
	return st;
}

/* VarInit: create the variable unless it exists; with "reset" replace it. */
static enum dg_status var_init(struct dg_client *c, const struct dg_node *n, const char *var,
			       struct dg_tensor **out, struct dg_err *err)
{
	struct dg_var_info info = { 0 };
	struct dg_tensor *t = NULL;
	bool no = false, reset;
	enum dg_status st;

	dg_attr_bool(n->attrs, "reset", &no, &reset, NULL);     /* once per variable */
	if (reset) {
		struct dg_put_opts po = { .replace = true };
		if (!(t = worker_init_tensor(n->attrs, err)))
			st = err->code;
		else
			st = dg_var_put(c, var, t, &po, &info.version, err);
	} else {
		st = dg_var_stat(c, var, &info, err);
		if (st == DG_ENOTFOUND) {
			struct dg_put_opts po = { .create_only = true };
			dg_err_clear(err);
			if (!(t = worker_init_tensor(n->attrs, err)))
				st = err->code;
			else
				st = dg_var_put(c, var, t, &po, &info.version, err);
			if (st == DG_EEXIST || st == DG_ECONFLICT) {     /* created meanwhile */
				dg_err_clear(err);
				st = dg_var_stat(c, var, &info, err);
			}
		}
	}
	if (st == DG_OK && !(*out = version_tensor((int64_t)info.version, err)))
		st = err->code;
	dg_tensor_free(t);
	return st;
}

/* VarRead, VarApply, VarInit: the request(s) to the ps. */
static enum dg_status run_var(const struct run *r, const struct dg_node *n, int kind,
			      const struct dg_tensor *in, struct dg_tensor **out, bool *stale,
			      struct dg_err *err)
{
	const char *var = str_attr(r, n, "var"), *ps = str_attr(r, n, "ps");
	enum dg_status st;
	struct pooled *p = pool_take(r->w, true, ps, err);

	if (!p)
		return err->code;
	int self = strcmp(ps, r->self) == 0;

	if (kind == WOP_VAR_READ) {
		int src = r->kept_src[n - r->g->nodes];
		bool had = src >= 0 && r->kept[src];
		st = var_read(r, p->obj, n, var, out, err);
		if (st == DG_OK && !dg_exec_type_ok(&n->out[0], *out, err))
			st = err->code;
		/* a value var_read took from the last apply was not pulled now */
		if (st == DG_OK && !(had && !r->kept[src]))
			atomic_fetch_add(&r->w->ps_bytes[1][self], (*out)->nbytes);
	} else if (kind == WOP_VAR_GATHER) {
		uint64_t moved[2] = { 0, 0 };
		st = var_gather(r, p->obj, n, var, in, out, moved, err);
		if (st == DG_OK && !dg_exec_type_ok(&n->out[0], *out, err))
			st = err->code;
		atomic_fetch_add(&r->w->ps_bytes[0][self], moved[0]);
		atomic_fetch_add(&r->w->ps_bytes[1][self], moved[1]);
	} else if (kind == WOP_VAR_APPLY) {
		int v = (int)(n - r->g->nodes);
		uint64_t pushed = in->nbytes;
		st = var_apply(r, p->obj, n, var, in, out, stale, &pushed, err);
		atomic_fetch_add(&r->w->ps_bytes[0][self], pushed);
		if (st == DG_OK && r->kept[v])
			atomic_fetch_add(&r->w->ps_bytes[1][self], r->kept[v]->nbytes);
	} else {
		st = var_init(p->obj, n, var, out, err);
	}
	if (st != DG_OK) {
		dg_tensor_free(*out);
		*out = NULL;
		dg_err_prefix(err, "variable '%s' on %s", var, ps);
	}
	pool_give(r->w, p);
	return st;
}

static bool is_queue_op(int kind)
{
	return kind >= WOP_QUEUE_DEQUEUE && kind <= WOP_QUEUE_SIZE;
}

/* worker_queue_call.check: the step may go on. */
static enum dg_status queue_check(void *ud, struct dg_err *err)
{
	const struct run *r = ud;

	if (atomic_load(&r->w->stopping))
		return dg_err_set(err, DG_EUNAVAILABLE, "the task is shutting down");
	return dg_rendezvous_check(r->w->rv, r->step, err);
}

/* The step's batch (dequeue v's outputs in r->outs): its lease and size. */
static void note_lease(struct run *r, int v)
{
	const struct dg_node *n = &r->g->nodes[v];
	const struct dg_tensor *lease = r->outs[n->n_out - 1], *x = r->outs[0];

	r->lease = (uint64_t)*(const int64_t *)lease->data;
	r->lease_n = x->shape.ndim > 0 ? x->shape.dim[0] : 1;
}

/* Acks after their step: a step's QueueAck comes after its applies, and a
 * run of several steps hands it to this thread instead of waiting for it, so
 * the next step starts with the weights its last apply returned, as fresh as
 * a ShardBatch-fed step's (waiting cost an async replica one more update of
 * staleness per step: measured, 0.84 against 0.85 test accuracy on
 * examples/mlp_queue.json). The run's reply waits for every ack: when the
 * master hears of a step, its examples are acked. */
#define ACK_QUEUE 64

struct ack_item {
	const char *ps, *queue;         /* the fragment's attrs: live as long as the run */
	uint64_t lease;
	enum dg_lease_end how;
};

struct acker {
	struct run *r;
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;              /* items added, or room made, or quit */
	struct ack_item items[ACK_QUEUE];
	int head, count;
	bool quit;
};

static void *acker_main(void *arg)
{
	struct acker *a = arg;

	pthread_mutex_lock(&a->mu);
	for (;;) {
		while (a->count == 0 && !a->quit)
			pthread_cond_wait(&a->cv, &a->mu);
		if (a->count == 0)
			break;
		struct ack_item it = a->items[a->head];
		pthread_mutex_unlock(&a->mu);
		struct dg_err err = { 0 };
		struct pooled *p = pool_take(a->r->w, true, it.ps, &err);
		int64_t n;
		enum dg_status st = p ? dg_queue_lease_end(p->obj, it.queue, it.lease, it.how, &n,
							   &err) : err.code;
		if (p)
			pool_give(a->r->w, p);
		if (st != DG_OK) {
			/* Its examples are (or will be) back in the queue though its
			 * update landed: they will be learned again. */
			atomic_fetch_add(&a->r->w->acks_late, 1);
			dg_log(DG_LOG_WARN, "worker", "queue '%s': the ack of lease %" PRIu64
			       " failed (%s); its examples will be learned again", it.queue,
			       it.lease, err.msg);
		}
		pthread_mutex_lock(&a->mu);
		a->head = (a->head + 1) % ACK_QUEUE;
		a->count--;
		pthread_cond_broadcast(&a->cv);
	}
	pthread_mutex_unlock(&a->mu);
	return NULL;
}

/* worker_queue_call.defer: queue the ack (starting the thread on the first). */
static void ack_defer(void *ud, const char *ps, const char *queue, uint64_t lease,
		      enum dg_lease_end how)
{
	struct run *r = ud;
	struct acker *a = r->ack;

	if (!a) {
		if (!(a = calloc(1, sizeof *a)))
			goto now;
		a->r = r;
		pthread_mutex_init(&a->mu, NULL);
		pthread_cond_init(&a->cv, NULL);
		if (pthread_create(&a->th, NULL, acker_main, a) != 0) {
			pthread_cond_destroy(&a->cv);
			pthread_mutex_destroy(&a->mu);
			free(a);
			goto now;
		}
		r->ack = a;
	}
	pthread_mutex_lock(&a->mu);
	while (a->count == ACK_QUEUE)
		pthread_cond_wait(&a->cv, &a->mu);
	a->items[(a->head + a->count) % ACK_QUEUE] =
		(struct ack_item){ .ps = ps, .queue = queue, .lease = lease, .how = how };
	a->count++;
	pthread_cond_broadcast(&a->cv);
	pthread_mutex_unlock(&a->mu);
	return;
now: {
	/* No thread: send it here. */
	struct dg_err err = { 0 };
	struct pooled *p = pool_take(r->w, true, ps, &err);
	int64_t n;
	if (!p || dg_queue_lease_end(p->obj, queue, lease, how, &n, &err) != DG_OK) {
		atomic_fetch_add(&r->w->acks_late, 1);
		dg_log(DG_LOG_WARN, "worker", "queue '%s': the ack of lease %" PRIu64 " failed "
		       "(%s)", queue, lease, err.msg);
	}
	if (p)
		pool_give(r->w, p);
	}
}

/* worker_queue_call.defer when the applies carried the lease: nothing to send. */
static void ack_done(void *ud, const char *ps, const char *queue, uint64_t lease,
		     enum dg_lease_end how)
{
	(void)ud, (void)ps, (void)queue, (void)lease, (void)how;
}

/* Send every queued ack and stop the thread. */
static void acker_finish(struct run *r)
{
	struct acker *a = r->ack;

	if (!a)
		return;
	pthread_mutex_lock(&a->mu);
	a->quit = true;
	pthread_cond_broadcast(&a->cv);
	pthread_mutex_unlock(&a->mu);
	pthread_join(a->th, NULL);
	pthread_cond_destroy(&a->cv);
	pthread_mutex_destroy(&a->mu);
	free(a);
	r->ack = NULL;
}

/* A queue op (queue_ops.c), on the run's thread: a dequeue is a step's first
 * request and its ack its last, so neither has anything to overlap with, and
 * the feeder's enqueue is its fragment's whole work. (Asking for step t+1's
 * batch on a thread of its own while step t computes was tried: on 2 vCPUs
 * it cost 10% more CPU and 15% of the examples/s, A/B in the same run.)
 * Outputs into r->outs. */
static enum dg_status run_queue(struct run *r, int v)
{
	const struct dg_node *n = &r->g->nodes[v];
	const char *ps = str_attr(r, n, "ps"), *queue = str_attr(r, n, "queue");
	struct pooled *p;
	enum dg_status st;

	if (!ps[0]) {
		dg_err_set(r->err, DG_EINVAL, "attr 'ps' is missing: queue ops run in fragments "
			   "the master lowered");
		dg_err_hint(r->err, "submit the graph to a master (dg submit), which places its "
			    "Queue nodes");
		return DG_EINVAL;
	}
	if (!(p = pool_take(r->w, true, ps, r->err)))
		return r->err->code;
	struct worker_queue_call q = {
		.client = p->obj, .ps = ps, .token = r->w->token, .queue = queue,
		.attrs = attrs_of(r->f, v), .ins = r->ins, .n_in = n->n_in, .outs = r->outs,
		.n_out = n->n_out, .deadline = r->deadline, .check = queue_check, .ud = r,
		.end = &r->input_end, .lease_examples = -1,
	};
	if (strcmp(ps, r->self) == 0 && r->w->local_enqueue) {
		q.local_enqueue = r->w->local_enqueue;
		q.local_ud = r->w->local_enqueue_ud;
	}
	/* The ack of this step's own lease: already done by the ps with the
	 * step's last apply (lease_applies), or, in a run of several steps, sent
	 * after the step. */
	if (r->f->kind[v] == WOP_QUEUE_ACK && r->lease &&
	    *(const int64_t *)r->ins[0]->data == (int64_t)r->lease) {
		if (r->f->lease_applies > 0) {
			q.defer = ack_done;
			q.lease_examples = r->lease_n;
		} else if (r->t_last > r->t_first) {
			q.defer = ack_defer;
			q.lease_examples = r->lease_n;
		}
	}
	st = worker_queue_run(r->f->kind[v], &q, r->err);
	for (int o = 0; st == DG_OK && o < n->n_out; o++)
		if (!dg_exec_type_ok(&n->out[o], r->outs[o], r->err))
			st = r->err->code;
	if (st != DG_OK)
		dg_err_prefix(r->err, "queue '%s' on %s", queue, ps);
	pool_give(r->w, p);
	if (st == DG_OK && r->f->kind[v] == WOP_QUEUE_DEQUEUE)
		note_lease(r, v);
	return st;
}

/* True for the nodes that go to the I/O pool: they wait on the network. */
static bool is_io(const struct run *r, int v)
{
	int kind = r->f->kind[v];

	if (is_var_op(kind))
		return true;
	return kind == WOP_SEND && strcmp(str_attr(r, &r->g->nodes[v], "to"), r->self) != 0;
}

/* The network part of an I/O node (ins = the node's input or NULL). */
static enum dg_status run_io(const struct run *r, int v, const struct dg_tensor *in,
			     struct dg_tensor **out, bool *stale, struct dg_err *err)
{
	const struct dg_node *n = &r->g->nodes[v];

	if (atomic_load(&r->w->stopping))
		return dg_err_set(err, DG_EUNAVAILABLE, "the task is shutting down");
	/* a job queued for a step aborted meanwhile (a failed node here, or the
	 * master) must not reach the ps: no apply of a failed step */
	if (dg_rendezvous_check(r->w->rv, r->step, err) != DG_OK)
		return err->code;
	if (r->f->kind[v] == WOP_SEND) {
		atomic_fetch_add(&r->w->sent_http, 1);
		atomic_fetch_add(&r->w->bytes_http, in->nbytes);
		return send_remote(r, str_attr(r, n, "to"), str_attr(r, n, "key"), in, err);
	}
	return run_var(r, n, r->f->kind[v], in, out, stale, err);
}

/* ------------------------------------------------------------ the I/O pool */

/* Hand a finished job back to its run and wake the run's waits. */
static void io_deliver(struct io_job *job)
{
	struct run *r = job->r;
	struct dg_rendezvous *rv = r->w->rv;

	pthread_mutex_lock(&r->mu);
	job->next = r->done;
	r->done = job;
	atomic_store(&r->has_done, true);
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
	/* The job and r may be gone now: only the worker's rendezvous is used. */
	dg_rendezvous_wake(rv);
}

static void *io_main(void *arg)
{
	struct worker *w = arg;

	pthread_mutex_lock(&w->io_mu);
	for (;;) {
		while (!w->io_head && !w->io_quit) {
			w->io_idle++;
			pthread_cond_wait(&w->io_cv, &w->io_mu);
			w->io_idle--;
		}
		struct io_job *job = w->io_head;
		if (!job)
			break;                  /* quitting with nothing queued */
		w->io_head = job->next;
		if (!w->io_head)
			w->io_tail = NULL;
		w->io_queued--;
		pthread_mutex_unlock(&w->io_mu);
		job->st = run_io(job->r, job->v, job->in, &job->out, &job->stale, &job->err);
		io_deliver(job);
		pthread_mutex_lock(&w->io_mu);
	}
	pthread_mutex_unlock(&w->io_mu);
	return NULL;
}

/* Queue node v of r on the I/O pool, starting a thread when every started
 * one is busy (up to io_max). False when the pool cannot take it (no
 * threads, or out of memory): the caller runs it itself. */
static bool io_submit(struct run *r, int v, const struct dg_tensor *in)
{
	struct worker *w = r->w;
	struct io_job *job;
	bool ok = true;

	if (w->io_max == 0 || !(job = calloc(1, sizeof *job)))
		return false;
	job->r = r;
	job->v = v;
	job->in = in;
	pthread_mutex_lock(&w->io_mu);
	if (w->io_queued + 1 > w->io_idle && w->io_n < w->io_max && !w->io_quit) {
		if (pthread_create(&w->io_threads[w->io_n], NULL, io_main, w) == 0)
			w->io_n++;
	}
	if (w->io_n == 0 || w->io_quit) {
		ok = false;
	} else {
		if (w->io_tail)
			w->io_tail->next = job;
		else
			w->io_head = job;
		w->io_tail = job;
		w->io_queued++;
		pthread_cond_signal(&w->io_cv);
	}
	pthread_mutex_unlock(&w->io_mu);
	if (!ok)
		free(job);
	else
		r->inflight++;
	return ok;
}

/* ------------------------------------------------------------ the step loop */

/* Node v is computed and its outputs are in r->outs (taken): store them,
 * release its inputs, and make ready the consumers (and the next op on its
 * variable) that wait for nothing else. */
static void complete(struct run *r, int v)
{
	const struct fragment *f = r->f;
	const struct dg_node *n = &r->g->nodes[v];

	for (int o = 0; o < n->n_out; o++) {
		int ov = f->base[v] + o;
		if (r->uses[ov] == 0) {
			dg_tensor_free(r->outs[o]);
			if (r->gx)
				dg_exec_gpu_forget(r->gx, ov);
		} else {
			r->val[ov] = r->outs[o];        /* NULL: the value is on a GPU */
		}
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
	if (f->var_next[v] >= 0 && --r->pending[f->var_next[v]] == 0)
		ready_push(r, f->var_next[v]);
	for (int i = 0; v == f->batch_node && i < f->n_after_batch; i++)
		if (--r->pending[f->after_batch[i]] == 0)
			ready_push(r, f->after_batch[i]);
	r->count++;
}

static void free_outs(struct run *r, int n_out)
{
	for (int o = 0; o < n_out; o++) {
		dg_tensor_free(r->outs[o]);
		r->outs[o] = NULL;
	}
}

/* Node v on its GPU: inputs from their device copies (uploaded where a value
 * has none), outputs left in device memory unless the kernel fell back to the
 * CPU (dg_exec_kernel_ids). r->ins holds the host inputs or NULL. */
static enum dg_status start_gpu_node(struct run *r, int v)
{
	const struct fragment *f = r->f;
	const struct dg_node *n = &r->g->nodes[v];
	int *in_ids = r->ids, *out_ids = r->ids + f->max_in;
	uint64_t kstep = r->id_is_kstep ? r->step : (uint64_t)r->t;
	enum dg_status st;

	for (int k = 0; k < n->n_in; k++)
		in_ids[k] = f->base[n->in[k].node] + n->in[k].index;
	for (int o = 0; o < n->n_out; o++)
		out_ids[o] = f->base[v] + o;
	st = dg_exec_kernel_ids_attrs(n, attrs_of(f, v), r->gx, in_ids, r->ins, out_ids, r->outs,
				kstep, r->err);
	if (st == DG_OK)
		complete(r, v);
	return st;
}

/* With device copies: node v's inputs in host memory, downloading the values
 * that exist only on a GPU (once: the copy serves later host readers too). */
static enum dg_status host_inputs(struct run *r, int v)
{
	const struct dg_node *n = &r->g->nodes[v];

	for (int k = 0; k < n->n_in; k++) {
		int iv = r->f->base[n->in[k].node] + n->in[k].index;
		if (!r->val[iv] && dg_exec_gpu_has(r->gx, iv) &&
		    dg_exec_gpu_download(r->gx, iv, &r->val[iv], r->err) != DG_OK) {
			dg_err_prefix(r->err, "node '%s' (%s): input %d", n->name, n->op->name, k);
			return r->err->code;
		}
		r->ins[k] = r->val[iv];
	}
	return DG_OK;
}

/* Start node v: run a kernel or a local _Send at once, hand a network op to
 * the I/O pool (or run it here when there is none). */
static enum dg_status start_node(struct run *r, int v)
{
	const struct fragment *f = r->f;
	const struct dg_node *n = &r->g->nodes[v];
	enum dg_status st;
	bool stale = false;
	int iv = 0;

	for (int k = 0; k < n->n_in; k++) {
		iv = f->base[n->in[k].node] + n->in[k].index;
		r->ins[k] = r->val[iv];
	}
	memset(r->outs, 0, (size_t)n->n_out * sizeof *r->outs);
	if (r->gx && f->gpu[v])
		return start_gpu_node(r, v);
	if (r->gx && (st = host_inputs(r, v)) != DG_OK)
		return st;
	if (f->kind[v] == WOP_NONE) {
		uint64_t kstep = r->id_is_kstep ? r->step : (uint64_t)r->t;
		if ((st = dg_exec_kernel_attrs(n, attrs_of(r->f, v), r->ins, r->outs, kstep,
					 r->err)) == DG_OK)
			complete(r, v);
		return st;
	}
	if (is_queue_op(f->kind[v])) {
		st = run_queue(r, v);
	} else if (f->kind[v] == WOP_SEND && carries(r, v, iv)) {
		st = carry(r, n, iv);
		if (st == DG_OK && !r->val[iv])
			r->uses[iv] = 0;                /* moved into the reply */
	} else if (is_io(r, v)) {
		/* The only work left in the step (nothing ready, in flight or to
		 * receive): run it here, rather than wake an I/O thread and wait
		 * for it (two cross-CPU wake-ups, each 100-300 us on a busy VM). */
		bool alone = r->n_ready == 0 && r->inflight == 0 && r->n_recv == 0;
		if (!alone && io_submit(r, v, n->n_in ? r->ins[0] : NULL))
			return DG_OK;
		st = run_io(r, v, n->n_in ? r->ins[0] : NULL, r->outs, &stale, r->err);
		r->stale += stale;
		if (st == DG_OK)
			st = dg_rendezvous_check(r->w->rv, r->step, r->err);
	} else {
		st = send_local(r, n, iv);
		if (st == DG_OK && !r->val[iv])
			r->uses[iv] = 0;                /* moved into the rendezvous */
	}
	if (st != DG_OK) {
		free_outs(r, n->n_out);
		dg_err_prefix(r->err, "node '%s' (%s)", n->name, n->op->name);
		return st;
	}
	complete(r, v);
	return DG_OK;
}

/* Take back the finished I/O jobs: complete their nodes, or keep the first
 * error; then check that the step was not aborted meanwhile. discard (after
 * an error, waiting for the jobs still out): drop their results, keep r->err. */
static enum dg_status drain(struct run *r, bool wait, bool discard)
{
	enum dg_status st = DG_OK;
	struct io_job *list;

	pthread_mutex_lock(&r->mu);
	while (wait && !r->done)
		pthread_cond_wait(&r->cv, &r->mu);
	list = r->done;
	r->done = NULL;
	atomic_store(&r->has_done, false);
	pthread_mutex_unlock(&r->mu);
	if (!list)
		return DG_OK;
	for (struct io_job *job = list, *next; job; job = next) {
		const struct dg_node *n = &r->g->nodes[job->v];
		next = job->next;
		r->inflight--;
		r->stale += job->stale;
		if (discard) {
			dg_tensor_free(job->out);
		} else if (st == DG_OK && job->st == DG_OK) {
			r->outs[0] = job->out;
			complete(r, job->v);
		} else {
			dg_tensor_free(job->out);
			if (st == DG_OK) {
				st = job->st;
				*r->err = job->err;
				dg_err_prefix(r->err, "node '%s' (%s)", n->name, n->op->name);
			}
		}
		free(job);
	}
	if (st == DG_OK && !discard)
		st = dg_rendezvous_check(r->w->rv, r->step, r->err);
	return st;
}

static bool run_woken(void *ud)
{
	struct run *r = ud;

	return atomic_load(&r->has_done);
}

/* Nothing is ready: wait for a pending _Recv or an I/O completion. */
static enum dg_status wait_some(struct run *r)
{
	const char **keys = malloc(((size_t)r->n_recv + 1) * sizeof *keys);
	struct dg_tensor *t = NULL;
	int64_t timeout = r->n_recv > 0 ? dg_deadline_left_ms(r->deadline) : 1000;
	enum dg_status st;
	int which = -1;

	if (!keys)
		return dg_err_set(r->err, DG_ENOMEM, "out of memory waiting for tensors");
	for (int i = 0; i < r->n_recv; i++)
		keys[i] = str_attr(r, &r->g->nodes[r->recvs[i]], "key");
	st = dg_rendezvous_wait_any(r->w->rv, r->step, keys, r->n_recv, timeout,
				    r->inflight > 0 ? run_woken : NULL, r, &which, &t, r->err);
	free(keys);
	if (st == DG_ETIMEOUT && r->n_recv == 0) {      /* only I/O in flight: keep waiting */
		dg_err_clear(r->err);
		return DG_OK;
	}
	if (st != DG_OK) {
		if (r->n_recv == 1 || st != DG_ETIMEOUT) {
			const struct dg_node *n = &r->g->nodes[r->recvs[0]];
			if (r->n_recv > 0)
				dg_err_prefix(r->err, "node '%s' (%s)", n->name, n->op->name);
		}
		return st;
	}
	if (which < 0)
		return DG_OK;                   /* an I/O job finished */
	int v = r->recvs[which];
	const struct dg_node *n = &r->g->nodes[v];
	if (!dg_exec_type_ok(&n->out[0], t, r->err)) {
		dg_tensor_free(t);
		dg_err_prefix(r->err, "node '%s' (%s): received tensor", n->name, n->op->name);
		return r->err->code;
	}
	r->recvs[which] = r->recvs[--r->n_recv];
	r->outs[0] = t;
	complete(r, v);
	return DG_OK;
}

/* One step of the fragment, the step-invariant part already cached. */
static enum dg_status execute(struct run *r)
{
	const struct fragment *f = r->f;
	enum dg_status st = DG_OK;

	r->n_ready = 0;
	r->n_recv = f->n_recv;
	memcpy(r->recvs, f->recvs, (size_t)f->n_recv * sizeof *r->recvs);
	memcpy(r->pending, f->pend0, (size_t)r->g->n_nodes * sizeof *r->pending);
	for (int v = 0; v < r->g->n_nodes; v++)
		if (!f->inv[v] && r->pending[v] == 0 && f->kind[v] != WOP_RECV)
			ready_push(r, v);
	while (st == DG_OK && (r->n_ready > 0 || r->n_recv > 0 || r->inflight > 0)) {
		if (atomic_load(&r->w->stopping)) {
			st = dg_err_set(r->err, DG_EUNAVAILABLE, "the task is shutting down");
			break;
		}
		if (r->inflight > 0 && atomic_load(&r->has_done) &&
		    (st = drain(r, false, false)) != DG_OK)
			break;
		if (r->n_ready > 0)
			st = start_node(r, ready_pop(r));
		else if (r->n_recv > 0 || r->inflight > 0)
			st = wait_some(r);
	}
	/* On error, abort the step before waiting for the jobs still out (they
	 * read this run's values): a queued one then does nothing and a sync
	 * VarRead stops at its next poll, instead of at the step's deadline. */
	if (st != DG_OK && r->inflight > 0)
		dg_rendezvous_abort(r->w->rv, r->step, r->err->msg);
	while (r->inflight > 0)
		drain(r, true, true);
	return st;
}

/* Compute the step-invariant part once per fragment and keep the values
 * that step-dependent nodes read (in topological order; sequential). */
static enum dg_status fill_cache(struct run *r)
{
	struct fragment *f = r->f;
	const struct dg_graph *g = r->g;
	struct dg_tensor **tmp;
	int *left;
	enum dg_status st = DG_OK;

	if (!(tmp = calloc((size_t)f->n_values + 1, sizeof *tmp)) ||
	    !(left = malloc(((size_t)f->n_values + 1) * sizeof *left))) {
		free(tmp);
		return dg_err_set(r->err, DG_ENOMEM, "out of memory for the step-invariant "
				  "values of a fragment");
	}
	memcpy(left, f->inv_uses, (size_t)f->n_values * sizeof *left);
	for (int k = 0; k < g->n_nodes && st == DG_OK; k++) {
		int v = g->order[k];
		const struct dg_node *n = &g->nodes[v];
		if (!f->inv[v])
			continue;
		for (int i = 0; i < n->n_in; i++)
			r->ins[i] = tmp[f->base[n->in[i].node] + n->in[i].index];
		memset(r->outs, 0, (size_t)n->n_out * sizeof *r->outs);
		if ((st = dg_exec_kernel_attrs(n, attrs_of(f, v), r->ins, r->outs, 0, r->err)) != DG_OK)
			break;
		r->count++;
		for (int o = 0; o < n->n_out; o++) {
			tmp[f->base[v] + o] = r->outs[o];
			r->outs[o] = NULL;
		}
		/* Free what no later invariant node reads and no dependent node wants. */
		for (int i = 0; i < n->n_in; i++) {
			int iv = f->base[n->in[i].node] + n->in[i].index;
			if (--left[iv] == 0 && !f->keep[iv]) {
				dg_tensor_free(tmp[iv]);
				tmp[iv] = NULL;
			}
		}
		for (int o = 0; o < n->n_out; o++) {
			int ov = f->base[v] + o;
			if (left[ov] == 0 && !f->keep[ov]) {
				dg_tensor_free(tmp[ov]);
				tmp[ov] = NULL;
			}
		}
	}
	for (int i = 0; i < f->n_values; i++) {
		if (st == DG_OK && f->keep[i]) {
			f->cache[i] = tmp[i];
			f->cached_bytes += tmp[i]->nbytes;
		} else {
			dg_tensor_free(tmp[i]);
		}
	}
	if (st == DG_OK)
		atomic_fetch_add(&r->w->cached_bytes, f->cached_bytes);
	free(tmp);
	free(left);
	return st;
}

/* Make sure the cache is filled (the first step of any run of f does it; a
 * concurrent first step waits for it), then give the cached values to r. */
static enum dg_status use_cache(struct run *r)
{
	struct fragment *f = r->f;
	enum dg_status st = DG_OK;

	if (f->n_inv == 0)
		return DG_OK;
	pthread_mutex_lock(&f->cache_mu);
	if (!f->cache_ready && (st = fill_cache(r)) == DG_OK)
		f->cache_ready = true;
	pthread_mutex_unlock(&f->cache_mu);
	for (int i = 0; st == DG_OK && i < f->n_values; i++)
		if (f->keep[i])
			r->val[i] = f->cache[i];
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
	if (f) {
		f->refs++;
		f->touched_ms = dg_mono_ms();   /* a run renews the lease */
	}
	pthread_mutex_unlock(&w->mu);
	return f;
}

/* Take the collected keys of the step just run into values[]. */
static enum dg_status collect(struct run *r, const struct worker_run_opts *o, double *values)
{
	for (int k = 0; k < o->n_collect; k++) {
		struct dg_tensor *t = NULL;
		enum dg_status st = dg_rendezvous_take(r->w->rv, r->step, o->collect[k], 0, &t,
						       r->err);
		if (st == DG_ETIMEOUT) {
			dg_err_set(r->err, DG_ENOTFOUND, "collect key '%s' was not sent to this "
				   "task in step %" PRIu64, o->collect[k], r->step);
			dg_err_hint(r->err, "collect names keys the fragment _Sends to its own "
				    "address, e.g. \"fetch:loss\"");
			return DG_ENOTFOUND;
		}
		if (st != DG_OK)
			return st;
		if (t->numel != 1) {
			dg_err_set(r->err, DG_EINVAL, "collect key '%s' of step %" PRIu64
				   " holds %s with %" PRId64 " elements, not a scalar",
				   o->collect[k], r->step, dg_dtype_name(t->dtype), t->numel);
			dg_err_hint(r->err, "collect scalars (reduce the value with Sum or Mean)");
			dg_tensor_free(t);
			return DG_EINVAL;
		}
		values[k] = dg_tensor_get_f64(t, 0);
		dg_tensor_free(t);
	}
	return DG_OK;
}

static enum dg_status check_opts(const struct worker_run_opts *o, struct dg_err *err)
{
	if (o->steps < 1 || o->steps > WORKER_MAX_RUN_STEPS)
		return dg_err_set(err, DG_EINVAL, "a run has 1..%d steps, not %" PRId64,
				  WORKER_MAX_RUN_STEPS, o->steps);
	if (o->step > UINT64_MAX - (uint64_t)(o->steps - 1))
		return dg_err_set(err, DG_EINVAL, "steps %" PRIu64 " + %" PRId64 " pass 2^64-1",
				  o->step, o->steps);
	if (o->train_step < 0 || o->train_step > INT64_MAX - o->steps)
		return dg_err_set(err, DG_EINVAL, "train_step must be 0..2^63-1-steps, not %"
				  PRId64, o->train_step);
	if (o->n_collect < 0 || o->n_collect > WORKER_MAX_COLLECT ||
	    (o->n_collect > 0 && !o->collect))
		return dg_err_set(err, DG_EINVAL, "a run collects 0..%d keys, not %d",
				  WORKER_MAX_COLLECT, o->n_collect);
	for (int k = 0; k < o->n_collect; k++) {
		if (dg_rendezvous_key_check(o->collect[k], err) != DG_OK) {
			dg_err_prefix(err, "collect");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}

/* The per-run arrays; false when out of memory. */
static bool run_alloc(struct run *r)
{
	const struct fragment *f = r->f;

	r->val = calloc((size_t)f->n_values + 1, sizeof *r->val);
	r->uses = malloc(((size_t)f->n_values + 1) * sizeof *r->uses);
	r->pending = malloc(((size_t)r->g->n_nodes + 1) * sizeof *r->pending);
	r->ready = malloc(((size_t)r->g->n_nodes + 1) * sizeof *r->ready);
	r->recvs = malloc(((size_t)f->n_recv + 1) * sizeof *r->recvs);
	r->ins = malloc((size_t)f->max_in * sizeof *r->ins);
	r->outs = calloc((size_t)f->max_out, sizeof *r->outs);
	r->kept_src = malloc(((size_t)r->g->n_nodes + 1) * sizeof *r->kept_src);
	r->kept_want = calloc((size_t)r->g->n_nodes + 1, sizeof *r->kept_want);
	r->kept = calloc((size_t)r->g->n_nodes + 1, sizeof *r->kept);
	r->kept_t = calloc((size_t)r->g->n_nodes + 1, sizeof *r->kept_t);
	r->kept_us = calloc((size_t)r->g->n_nodes + 1, sizeof *r->kept_us);
	if (f->n_gpu > 0) {
		r->gx = dg_exec_gpu_new(f->n_values, NULL);
		r->ids = malloc((size_t)(f->max_in + f->max_out) * sizeof *r->ids);
		if (!r->gx || !r->ids)
			return false;
	}
	return r->val && r->uses && r->pending && r->ready && r->recvs && r->ins && r->outs &&
	       r->kept_src && r->kept_want && r->kept && r->kept_t && r->kept_us;
}

/* Free the step's values (not the cached ones) so the arrays can be reused. */
static void run_clear_values(struct run *r)
{
	for (int i = 0; r->val && i < r->f->n_values; i++) {
		if (!r->f->keep[i])
			dg_tensor_free(r->val[i]);
		r->val[i] = NULL;
	}
}

/* Does var op v work on the same variable (ps and var) as w? */
static bool same_var(const struct dg_graph *g, int v, int w)
{
	const json_t *a = g->nodes[v].attrs, *b = g->nodes[w].attrs;

	return strcmp(json_string_value(json_object_get(a, "var")),
		      json_string_value(json_object_get(b, "var"))) == 0 &&
	       strcmp(json_string_value(json_object_get(a, "ps")),
		      json_string_value(json_object_get(b, "ps"))) == 0;
}

/* Pair each async VarRead with the async VarApply whose value it can take in
 * the next step: only when they are the only ops on their variable in the
 * fragment (one read, one apply, no VarInit), so the kept value is the
 * variable after this replica's last update of it. */
static void plan_kept(struct run *r)
{
	const struct dg_graph *g = r->g;
	int64_t base, none = -1;
	bool no = false, sync;

	for (int v = 0; v < g->n_nodes; v++)
		r->kept_src[v] = -1;
	for (int v = 0; v < g->n_nodes; v++) {
		int apply = -1, reads = 0, others = 0;
		if (r->f->kind[v] != WOP_VAR_READ)
			continue;
		dg_attr_int(g->nodes[v].attrs, "min_step_base", &none, &base, NULL);
		if (base >= 0)
			continue;
		for (int w = 0; w < g->n_nodes; w++) {
			if (!is_var_op(r->f->kind[w]) || !same_var(g, v, w))
				continue;
			if (r->f->kind[w] == WOP_VAR_READ)
				reads++;
			else if (r->f->kind[w] == WOP_VAR_APPLY && apply < 0)
				apply = w;
			else
				others++;
		}
		if (apply < 0 || reads != 1 || others != 0)
			continue;
		dg_attr_bool(g->nodes[apply].attrs, "sync", &no, &sync, NULL);
		if (sync)
			continue;
		r->kept_src[v] = apply;
		r->kept_want[apply] = 1;
	}
}

/* One step of a run: abort check, cache, nodes, collected values. */
static enum dg_status run_one(struct run *r, const struct worker_run_opts *o, int64_t i,
			      struct worker_step_result *sr)
{
	enum dg_status st;

	r->step = o->step + (uint64_t)i;
	r->t = o->train_step + i;
	r->deadline = dg_deadline_in_ms(r->timeout_ms);
	r->count = r->stale = 0;
	r->lease = 0;
	sr->step = r->step;
	sr->train_step = r->t;
	if (atomic_load(&r->w->stopping))
		return dg_err_set(r->err, DG_EUNAVAILABLE, "the task is shutting down");
	if ((st = dg_rendezvous_check(r->w->rv, r->step, r->err)) != DG_OK)
		return st;
	memcpy(r->uses, r->f->uses, (size_t)r->f->n_values * sizeof *r->uses);
	if ((st = use_cache(r)) == DG_OK)
		st = execute(r);
	run_clear_values(r);
	if (r->gx) {
		enum dg_status gst = dg_exec_gpu_step_end(r->gx, st == DG_OK ? r->err : NULL);
		if (st == DG_OK)
			st = gst;
	}
	if (st == DG_OK && o->n_collect > 0) {
		if (!(sr->values = calloc((size_t)o->n_collect, sizeof *sr->values)))
			st = dg_err_set(r->err, DG_ENOMEM, "out of memory for collected values");
		else
			st = collect(r, o, sr->values);
	}
	sr->stale = r->stale;
	if (st != DG_OK) {
		free(sr->values);
		sr->values = NULL;
		dg_rendezvous_abort(r->w->rv, r->step, r->err->msg);
	}
	return st;
}

enum dg_status worker_run_steps_mode(struct worker *w, const char *id,
				     const struct worker_run_opts *o, bool id_is_kstep,
				     struct worker_run_result *res, struct dg_err *err)
{
	struct dg_err local = { 0 };
	struct run r = { .w = w, .id_is_kstep = id_is_kstep, .err = err ? err : &local };
	enum dg_status st;
	double t_run = dg_mono_s() * 1e3;

	memset(res, 0, sizeof *res);
	dg_err_clear(r.err);
	if ((st = check_opts(o, r.err)) != DG_OK) {
		dg_err_hint(r.err, "send {\"step\": S, \"steps\": K, \"train_step\": T, "
			    "\"collect\": [\"fetch:loss\"]}");
		return st;
	}
	r.timeout_ms = o->timeout_ms <= 0 ? WORKER_DEFAULT_TIMEOUT_MS :
		       o->timeout_ms > WORKER_MAX_TIMEOUT_MS ? WORKER_MAX_TIMEOUT_MS :
		       o->timeout_ms;
	pthread_mutex_init(&r.mu, NULL);
	pthread_cond_init(&r.cv, NULL);
	atomic_init(&r.has_done, false);
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
	if (!run_alloc(&r) || !(res->r = calloc((size_t)o->steps, sizeof *res->r))) {
		st = dg_err_set(r.err, DG_ENOMEM, "out of memory for a run of %" PRId64 " steps "
				"of %d nodes", o->steps, r.g->n_nodes);
		goto out;
	}
	r.t_first = o->train_step;
	r.t_last = o->train_step + o->steps - 1;
	plan_kept(&r);
	/* Only one-step runs carry: in a run of several steps the requester's
	 * fragment would wait for step 1's values until the last step ended. */
	if (o->steps == 1 && o->carry_to && strcmp(o->carry_to, r.self) != 0) {
		r.carry_to = o->carry_to;
		if (!(r.carried = calloc((size_t)r.g->n_nodes + 1, sizeof *r.carried))) {
			st = dg_err_set(r.err, DG_ENOMEM, "out of memory for a run");
			goto out;
		}
	}
	for (int64_t i = 0; i < o->steps && st == DG_OK; i++) {
		double t0 = dg_mono_s() * 1e3;
		st = run_one(&r, o, i, &res->r[i]);
		res->r[i].ms = dg_mono_s() * 1e3 - t0;
		res->nodes_run += r.count;
		atomic_fetch_add(st == DG_OK ? &w->steps_ok : &w->steps_failed, 1);
		atomic_fetch_add(&w->nodes_run, (uint64_t)r.count);
		atomic_fetch_add(&w->step_us, (uint64_t)(res->r[i].ms * 1000));
		if (st == DG_OK)
			res->steps_done++;
		/* A training run ends early and cleanly where its input queue
		 * ended: the steps before are done, this one never began. */
		if (st != DG_OK && r.input_end && !id_is_kstep) {
			dg_log(DG_LOG_DEBUG, "worker", "run of '%s': input at its end after %"
			       PRId64 " steps (%s)", id ? id : "", res->steps_done, r.err->msg);
			dg_err_clear(r.err);
			res->input_end = true;
			st = DG_OK;
			break;
		}
	}
out:
	acker_finish(&r);
	if (st != DG_OK)
		dg_err_prefix(r.err, "task %s/%d", w->job, w->task);
	if (st == DG_OK && r.n_carried > 0) {
		res->carried = r.carried;
		res->n_carried = r.n_carried;
	} else {
		dg_task_carried_free(r.carried, r.n_carried);
	}
	if (r.f)
		run_clear_values(&r);
	free(r.val);
	free(r.uses);
	free(r.pending);
	free(r.ready);
	free(r.recvs);
	free(r.ins);
	free(r.outs);
	for (int v = 0; r.kept && v < r.g->n_nodes; v++)
		dg_tensor_free(r.kept[v]);
	free(r.kept);
	free(r.kept_t);
	free(r.kept_us);
	free(r.kept_want);
	free(r.kept_src);
	dg_exec_gpu_free(r.gx);
	free(r.ids);
	if (r.f) {
		pthread_mutex_lock(&w->mu);
		fragment_unref_locked(r.f);
		pthread_mutex_unlock(&w->mu);
	}
	pthread_cond_destroy(&r.cv);
	pthread_mutex_destroy(&r.mu);
	res->ms = dg_mono_s() * 1e3 - t_run;
	return st;
}

enum dg_status worker_run_steps(struct worker *w, const char *id, const struct worker_run_opts *o,
				struct worker_run_result *res, struct dg_err *err)
{
	return worker_run_steps_mode(w, id, o, false, res, err);
}

void worker_run_result_deinit(struct worker_run_result *res)
{
	if (!res)
		return;
	for (int64_t i = 0; res->r && i < res->steps_done; i++)
		free(res->r[i].values);
	free(res->r);
	dg_task_carried_free(res->carried, res->n_carried);
	memset(res, 0, sizeof *res);
}

enum dg_status worker_run_fragment(struct worker *w, const char *id, uint64_t step,
				   int64_t timeout_ms, int *nodes_run, struct dg_err *err)
{
	/* The training step (lr schedules, sync steps) of a plain run: the step id
	 * folded into 0..2^62-1; its kernels see the step id itself. */
	struct worker_run_opts o = { .step = step, .steps = 1, .timeout_ms = timeout_ms,
				     .train_step = (int64_t)(step & (((uint64_t)1 << 62) - 1)) };
	struct worker_run_result res;
	enum dg_status st = worker_run_steps_mode(w, id, &o, true, &res, err);

	if (nodes_run)
		*nodes_run = res.nodes_run;
	worker_run_result_deinit(&res);
	return st;
}

enum dg_status worker_run_fragment_local(struct worker *w, const char *fragment_id,
					 uint64_t step, int64_t timeout_ms, struct dg_err *err)
{
	return worker_run_fragment(w, fragment_id, step, timeout_ms, NULL, err);
}

void worker_count_received(struct worker *w, size_t n)
{
	atomic_fetch_add(&w->recv_http, 1);
	atomic_fetch_add(&w->bytes_recv_http, n);
}

enum dg_status worker_metrics(void *vw, struct dg_buf *out, struct dg_err *err)
{
	struct worker *w = vw;
	struct dg_rendezvous_limits rl;
	int n_frags, io_n;

	dg_rendezvous_get_limits(w->rv, &rl);
	pthread_mutex_lock(&w->mu);
	n_frags = w->n_frags;
	pthread_mutex_unlock(&w->mu);
	pthread_mutex_lock(&w->io_mu);
	io_n = w->io_n;
	pthread_mutex_unlock(&w->io_mu);
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
		"# HELP dg_worker_cached_bytes Step-invariant values kept by fragments.\n"
		"# TYPE dg_worker_cached_bytes gauge\n"
		"dg_worker_cached_bytes %" PRIu64 "\n"
		"# HELP dg_worker_io_threads I/O threads started (ps requests, remote sends).\n"
		"# TYPE dg_worker_io_threads gauge\n"
		"dg_worker_io_threads %d\n"
		"# HELP dg_worker_tensors_sent_total Tensors sent by _Send.\n"
		"# TYPE dg_worker_tensors_sent_total counter\n"
		"dg_worker_tensors_sent_total{path=\"local\"} %" PRIu64 "\n"
		"dg_worker_tensors_sent_total{path=\"http\"} %" PRIu64 "\n"
		"dg_worker_tensors_sent_total{path=\"carried\"} %" PRIu64 "\n"
		"# HELP dg_worker_bytes_sent_total Bytes of tensors sent by _Send.\n"
		"# TYPE dg_worker_bytes_sent_total counter\n"
		"dg_worker_bytes_sent_total{path=\"local\"} %" PRIu64 "\n"
		"dg_worker_bytes_sent_total{path=\"http\"} %" PRIu64 "\n"
		"dg_worker_bytes_sent_total{path=\"carried\"} %" PRIu64 "\n"
		"# HELP dg_worker_tensors_received_total Tensors received over HTTP.\n"
		"# TYPE dg_worker_tensors_received_total counter\n"
		"dg_worker_tensors_received_total %" PRIu64 "\n"
		"# HELP dg_worker_bytes_received_total Bytes of tensors received over HTTP.\n"
		"# TYPE dg_worker_bytes_received_total counter\n"
		"dg_worker_bytes_received_total %" PRIu64 "\n"
		"# HELP dg_worker_rendezvous_tensors Tensors waiting to be received.\n"
		"# TYPE dg_worker_rendezvous_tensors gauge\n"
		"dg_worker_rendezvous_tensors %d\n"
		"# HELP dg_worker_rendezvous_bytes Bytes of tensors waiting to be received (with "
		"bookkeeping).\n"
		"# TYPE dg_worker_rendezvous_bytes gauge\n"
		"dg_worker_rendezvous_bytes %zu\n"
		"# HELP dg_worker_rendezvous_limit_bytes Cap on dg_worker_rendezvous_bytes (0: none).\n"
		"# TYPE dg_worker_rendezvous_limit_bytes gauge\n"
		"dg_worker_rendezvous_limit_bytes %zu\n"
		"# HELP dg_worker_rendezvous_expired_total Tensors dropped because nobody took them "
		"in time.\n"
		"# TYPE dg_worker_rendezvous_expired_total counter\n"
		"dg_worker_rendezvous_expired_total %" PRIu64 "\n"
		"# HELP dg_worker_ps_bytes_total Tensor bytes of variable requests: gradients "
		"pushed, values pulled; peer self: this task's own ps.\n"
		"# TYPE dg_worker_ps_bytes_total counter\n"
		"dg_worker_ps_bytes_total{dir=\"push\",peer=\"other\"} %" PRIu64 "\n"
		"dg_worker_ps_bytes_total{dir=\"push\",peer=\"self\"} %" PRIu64 "\n"
		"dg_worker_ps_bytes_total{dir=\"pull\",peer=\"other\"} %" PRIu64 "\n"
		"dg_worker_ps_bytes_total{dir=\"pull\",peer=\"self\"} %" PRIu64 "\n"
		"# HELP dg_worker_queue_acks_failed_total Queue acks sent after their step that "
		"found their lease gone (its examples are learned twice).\n"
		"# TYPE dg_worker_queue_acks_failed_total counter\n"
		"dg_worker_queue_acks_failed_total %" PRIu64 "\n"
		"# HELP dg_worker_fragments_expired_total Fragments forgotten because their "
		"master did not renew their lease (it died).\n"
		"# TYPE dg_worker_fragments_expired_total counter\n"
		"dg_worker_fragments_expired_total %" PRIu64 "\n",
		(uint64_t)atomic_load(&w->steps_ok), (uint64_t)atomic_load(&w->steps_failed),
		(uint64_t)atomic_load(&w->nodes_run), (double)atomic_load(&w->step_us) * 1e-6,
		n_frags, (uint64_t)atomic_load(&w->cached_bytes), io_n,
		(uint64_t)atomic_load(&w->sent_local), (uint64_t)atomic_load(&w->sent_http),
		(uint64_t)atomic_load(&w->sent_carried), (uint64_t)atomic_load(&w->bytes_local),
		(uint64_t)atomic_load(&w->bytes_http), (uint64_t)atomic_load(&w->bytes_carried),
		(uint64_t)atomic_load(&w->recv_http), (uint64_t)atomic_load(&w->bytes_recv_http),
		dg_rendezvous_count(w->rv), dg_rendezvous_bytes(w->rv), rl.max_bytes,
		dg_rendezvous_expired(w->rv),
		(uint64_t)atomic_load(&w->ps_bytes[0][0]), (uint64_t)atomic_load(&w->ps_bytes[0][1]),
		(uint64_t)atomic_load(&w->ps_bytes[1][0]), (uint64_t)atomic_load(&w->ps_bytes[1][1]),
		(uint64_t)atomic_load(&w->acks_late), (uint64_t)atomic_load(&w->frags_expired));
}
