/* The evaluator (dg/exec.h): marks the nodes the fetches need, substitutes
 * feeds, runs each needed node's kernel in topological order, frees values after
 * their last reader. GPU-placed nodes run their CUDA kernels (dg/cuda.h) with
 * values kept in device memory between them, here and in fragment runs
 * (dg_exec_gpu); else the CPU (soft placement, said once). Per-run state only:
 * one graph can be run by several threads. */
#include "dg/exec.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dg/cuda.h"
#include "dg/gpu.h"
#include "dg/log.h"

#define MAX_GPUS 16                      /* GPU indices a device string may name */
#define POOL_STREAMS 64                  /* idle streams kept per GPU */
#define DEAD_BYTES_MAX (256u << 20)      /* device bytes a run defers before syncing */

/* Device copies released during a run: freed only after the run's streams have
 * been synchronised, because the caching allocator may hand a freed block to
 * another thread's stream while kernels queued on ours still read it. */
struct gpu_run {
	struct dg_cuda_stream *s[MAX_GPUS];   /* held for the run, from the pool */
	bool broken[MAX_GPUS];                /* a sync failed: do not pool the stream */
	struct dg_cuda_tensor **dead;
	int n_dead, cap_dead;
	size_t dead_bytes;
};

/* Device copies of numbered values and the streams that made them: the state
 * of dg_exec_run's run, and of a fragment run (dg/exec.h). */
struct dg_exec_gpu {
	struct gpu_run gr;
	struct dg_cuda_tensor **dev;     /* per value, owned; NULL when none */
	int n_values;
};

/* Host<->device copies made for values (dg_exec_gpu_copies), process-wide. */
static atomic_uint_fast64_t n_uploads, n_upload_bytes, n_downloads, n_download_bytes;

static void count_copy(atomic_uint_fast64_t *n, atomic_uint_fast64_t *bytes, size_t nbytes)
{
	atomic_fetch_add(n, 1);
	atomic_fetch_add(bytes, nbytes);
}

/* Per-run state. Values are numbered: output k of node v is value base[v] + k. */
struct run {
	const struct dg_graph *g;
	int *base;                       /* n_nodes + 1 entries */
	int n_values;
	struct dg_tensor **val;          /* host values, owned; NULL once freed or while
					  * a value exists only on a GPU */
	struct dg_exec_gpu gx;           /* device copies (gx.dev, n_values entries) */
	const struct dg_tensor **fed;    /* fed values, borrowed; NULL when not fed */
	int *uses;                       /* readers still to come: consumers + fetches */
	unsigned char *needed;           /* per node: must run for the fetches */
	struct dg_edge *fetch;
	int n_fetch;
	struct dg_attr_table **tab;      /* per node, owned: its attrs parsed for the run */
	struct dg_err *err;
};

static struct dg_attrs attrs_of(const struct run *r, int v)
{
	return dg_attr_table_view(r->tab[v]);
}

static int value_of(const struct run *r, struct dg_edge e)
{
	return r->base[e.node] + e.index;
}

bool dg_exec_type_ok(const struct dg_ttype *want, const struct dg_tensor *t, struct dg_err *err)
{
	char a[128], b[128];
	bool ok = want->shape.ndim < 0 || want->shape.ndim == t->shape.ndim;

	if (t->dtype != want->dtype) {
		dg_err_set(err, DG_EDTYPE, "got dtype %s where %s is expected",
			   dg_dtype_name(t->dtype), dg_dtype_name(want->dtype));
		return false;
	}
	for (int i = 0; ok && i < want->shape.ndim; i++)
		if (want->shape.dim[i] >= 0 && want->shape.dim[i] != t->shape.dim[i])
			ok = false;
	if (!ok) {
		dg_shape_format(&t->shape, a, sizeof a);
		dg_shape_format(&want->shape, b, sizeof b);
		dg_err_set(err, DG_ESHAPE, "got shape %s where %s is expected (? = any size)", a,
			   b);
	}
	return ok;
}

static const char *node_label_op(const struct dg_node *n)
{
	return n->op ? n->op->name : "?";
}

/* ------------------------------------------------------------------ GPUs */

/* The GPU a device string names: a "gpu:K" or "device:GPU:K" segment (as
 * worker/place.c reads them), or -1 for the CPU and for strings without one. */
static int device_gpu(const char *dev)
{
	const char *p = dev;

	while (p && *p) {
		const char *seg = *p == '/' ? p + 1 : p, *end = strchr(seg, '/'), *num = NULL;
		size_t len = end ? (size_t)(end - seg) : strlen(seg);
		if (len > 4 && strncmp(seg, "gpu:", 4) == 0)
			num = seg + 4;
		else if (len > 11 && strncmp(seg, "device:GPU:", 11) == 0)
			num = seg + 11;
		if (num) {
			int k = 0;
			for (; num < seg + len; num++) {
				if (*num < '0' || *num > '9' || k >= MAX_GPUS)
					return -1;
				k = k * 10 + (*num - '0');
			}
			return k < MAX_GPUS ? k : -1;
		}
		p = end;
	}
	return -1;
}

/* Soft placement is said once per process for each missing GPU and once per
 * op without a CUDA kernel (a table of the ops already named). */
static pthread_mutex_t said_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct dg_op_def *said_ops[256];
static int n_said_ops;
static atomic_bool said_no_gpu[MAX_GPUS];

static void say_no_gpu(const struct dg_node *n, int k)
{
	if (atomic_exchange(&said_no_gpu[k], true))
		return;
	dg_log(DG_LOG_WARN, "exec", "node '%s' is placed on %s, but GPU %d is not usable here "
	       "(%s): nodes placed on it run on the CPU (soft placement)", n->name, n->device,
	       k, dg_gpu_describe());
}

static void say_cpu_op(const struct dg_node *n, const char *why)
{
	bool said = false;

	pthread_mutex_lock(&said_mu);
	for (int i = 0; i < n_said_ops && !said; i++)
		said = said_ops[i] == n->op;
	if (!said && n_said_ops < (int)(sizeof said_ops / sizeof said_ops[0]))
		said_ops[n_said_ops++] = n->op;
	pthread_mutex_unlock(&said_mu);
	if (!said)
		dg_log((n->op->flags & DG_OPF_SOURCE) ? DG_LOG_DEBUG : DG_LOG_INFO, "exec",
		       "%s nodes placed on a GPU run on the CPU: %s (first: '%s')", n->op->name,
		       why, n->name);
}

/* The GPU node n runs on, or -1 for the CPU: its device names a GPU that this
 * process has and its op has a CUDA kernel. */
static int node_gpu(const struct dg_node *n)
{
	int k = device_gpu(n->device);

	if (k < 0)
		return -1;
	if (!dg_cuda_available() || k >= dg_gpu_count()) {
		say_no_gpu(n, k);
		return -1;
	}
	if (!dg_cuda_supports(n->op) || n->n_out < 1 || n->n_out > 4) {
		say_cpu_op(n, "no CUDA kernel");
		return -1;
	}
	return k;
}

/* Idle streams per GPU, shared by all runs and threads (creating a stream and
 * its cuBLAS handle costs milliseconds). A stream is idle when pooled. */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dg_cuda_stream *pool[MAX_GPUS][POOL_STREAMS];
static int n_pool[MAX_GPUS];

static enum dg_status stream_take(int k, struct dg_cuda_stream **s, struct dg_err *err)
{
	*s = NULL;
	pthread_mutex_lock(&pool_mu);
	if (n_pool[k] > 0)
		*s = pool[k][--n_pool[k]];
	pthread_mutex_unlock(&pool_mu);
	return *s ? DG_OK : dg_cuda_stream_new(k, s, err);
}

static void stream_give(int k, struct dg_cuda_stream *s)
{
	pthread_mutex_lock(&pool_mu);
	if (s && n_pool[k] < POOL_STREAMS) {
		pool[k][n_pool[k]++] = s;
		s = NULL;
	}
	pthread_mutex_unlock(&pool_mu);
	dg_cuda_stream_free(s);
}

/* Checks a device value against inferred types like dg_exec_type_ok. */
static bool dev_type_ok(const struct dg_ttype *want, const struct dg_cuda_tensor *d,
			struct dg_err *err)
{
	struct dg_tensor h = { .dtype = d->dtype, .shape = d->shape, .numel = d->numel,
			       .nbytes = d->nbytes };

	return dg_exec_type_ok(want, &h, err);
}

/* Run n's CUDA kernel on device inputs din[] (borrowed, on s's GPU); dout[]
 * receives owned device outputs checked against n's inference. *fallback is
 * set (and err cleared) when the kernel does not cover these dtypes: the
 * caller then runs the CPU kernel. The caller prefixes errors with the node. */
static enum dg_status gpu_kernel(const struct dg_node *n, struct dg_attrs a,
				 struct dg_cuda_stream *s, const struct dg_cuda_tensor *const *din,
				 struct dg_cuda_tensor **dout, uint64_t step, bool *fallback,
				 struct dg_err *err)
{
	enum dg_status st = dg_cuda_run_attrs(s, n->op, a, din, n->n_in, dout, n->n_out, step,
					      err);

	*fallback = false;
	if (st == DG_EUNSUPPORTED || st == DG_EDTYPE) {
		say_cpu_op(n, err->msg);
		dg_err_clear(err);
		*fallback = true;
		return st;
	}
	for (int o = 0; st == DG_OK && o < n->n_out; o++) {
		if (!dev_type_ok(&n->out[o], dout[o], err)) {
			dg_err_prefix(err, "GPU output %d disagrees with inference (a bug in the "
				      "CUDA kernel)", o);
			st = err->code = DG_EINTERNAL;
		}
	}
	if (st != DG_OK) {
		/* Nothing may still read the outputs once the stream is idle. */
		dg_cuda_stream_sync(s, NULL);
		for (int o = 0; o < n->n_out; o++) {
			dg_cuda_tensor_free(dout[o]);
			dout[o] = NULL;
		}
	}
	return st;
}

/* One node on GPU k with host inputs and outputs (dg_exec_kernel's path, for
 * callers that keep values on the host): upload, run, download, then free the
 * device copies once the downloads have synchronised the stream. */
static enum dg_status gpu_kernel_host(const struct dg_node *n, struct dg_attrs a, int k,
				      const struct dg_tensor *const *ins, struct dg_tensor **outs,
				      uint64_t step, bool *fallback, struct dg_err *err)
{
	struct dg_cuda_tensor *small_in[8], *small_out[4] = { 0 }, **din = small_in;
	struct dg_cuda_stream *s = NULL;
	enum dg_status st;
	bool healthy = true;

	*fallback = false;
	if (n->n_in > 8 && !(din = calloc((size_t)n->n_in, sizeof *din)))
		return dg_err_set(err, DG_ENOMEM, "node '%s': out of memory", n->name);
	for (int i = 0; i < n->n_in; i++)
		din[i] = NULL;
	st = stream_take(k, &s, err);
	for (int i = 0; st == DG_OK && i < n->n_in; i++)
		if (!(din[i] = dg_cuda_upload(s, ins[i], err)))
			st = err->code;
		else
			count_copy(&n_uploads, &n_upload_bytes, ins[i]->nbytes);
	if (st == DG_OK)
		st = gpu_kernel(n, a, s, (const struct dg_cuda_tensor *const *)din, small_out, step,
				fallback, err);
	for (int o = 0; st == DG_OK && o < n->n_out; o++)
		if (!(outs[o] = dg_cuda_download(s, small_out[o], err)))
			st = err->code;
		else
			count_copy(&n_downloads, &n_download_bytes, outs[o]->nbytes);
	if (st != DG_OK && !*fallback) {
		for (int o = 0; o < n->n_out; o++) {
			dg_tensor_free(outs[o]);
			outs[o] = NULL;
		}
		dg_err_prefix(err, "node '%s' (%s)", n->name, n->op->name);
	}
	if (s)
		healthy = dg_cuda_stream_sync(s, NULL) == DG_OK;
	for (int o = 0; o < n->n_out && o < 4; o++)
		dg_cuda_tensor_free(small_out[o]);
	for (int i = 0; i < n->n_in; i++)
		dg_cuda_tensor_free(din[i]);
	if (din != small_in)
		free(din);
	if (s && healthy)
		stream_give(k, s);
	else
		dg_cuda_stream_free(s);
	return st;
}

/* --- a run's device state --- */

static enum dg_status gr_stream(struct gpu_run *gr, int k, struct dg_cuda_stream **s,
				struct dg_err *err)
{
	enum dg_status st = DG_OK;

	if (!gr->s[k])
		st = stream_take(k, &gr->s[k], err);
	*s = gr->s[k];
	return st;
}

/* Wait for every stream of the run, then free the deferred device tensors. */
static void gr_flush(struct gpu_run *gr)
{
	for (int k = 0; k < MAX_GPUS; k++)
		if (gr->s[k] && dg_cuda_stream_sync(gr->s[k], NULL) != DG_OK)
			gr->broken[k] = true;
	for (int i = 0; i < gr->n_dead; i++)
		dg_cuda_tensor_free(gr->dead[i]);
	gr->n_dead = 0;
	gr->dead_bytes = 0;
}

/* Release a device copy: deferred until the next flush (see struct gpu_run). */
static void gr_drop(struct gpu_run *gr, struct dg_cuda_tensor *t)
{
	if (!t)
		return;
	if (gr->n_dead == gr->cap_dead) {
		int cap = gr->cap_dead ? gr->cap_dead * 2 : 32;
		struct dg_cuda_tensor **d = realloc(gr->dead, (size_t)cap * sizeof *d);
		if (!d) {
			gr_flush(gr);           /* no room to defer: make it safe now */
			dg_cuda_tensor_free(t);
			return;
		}
		gr->dead = d;
		gr->cap_dead = cap;
	}
	gr->dead[gr->n_dead++] = t;
	gr->dead_bytes += t->cap;
	if (gr->dead_bytes > DEAD_BYTES_MAX)
		gr_flush(gr);
}

/* End of a run: flush and return healthy streams to the pool. */
static void gr_end(struct gpu_run *gr)
{
	gr_flush(gr);
	free(gr->dead);
	gr->dead = NULL;
	gr->cap_dead = 0;
	for (int k = 0; k < MAX_GPUS; k++) {
		if (!gr->s[k])
			continue;
		if (gr->broken[k])
			dg_cuda_stream_free(gr->s[k]);
		else
			stream_give(k, gr->s[k]);
		gr->s[k] = NULL;
	}
}

/* Fetch refs -> edges; NULL/0 selects the graph's default fetch list. */
static enum dg_status resolve_fetches(struct run *r, const char *const *fetch, int n_fetch)
{
	const struct dg_graph *g = r->g;

	if (!fetch || n_fetch <= 0) {
		if (g->n_fetch <= 0) {
			dg_err_set(r->err, DG_EINVAL, "nothing to fetch: the graph has no "
				   "\"fetch\" list and none was given");
			dg_err_hint(r->err, "name the values to compute, e.g. dg eval GRAPH.json "
				    "--fetch y, or add \"fetch\": [\"y\"] to the graph");
			return DG_EINVAL;
		}
		r->n_fetch = g->n_fetch;
		r->fetch = malloc((size_t)g->n_fetch * sizeof *r->fetch);
		if (!r->fetch)
			return dg_err_set(r->err, DG_ENOMEM, "out of memory");
		memcpy(r->fetch, g->fetch, (size_t)g->n_fetch * sizeof *r->fetch);
		return DG_OK;
	}
	r->n_fetch = n_fetch;
	r->fetch = malloc((size_t)n_fetch * sizeof *r->fetch);
	if (!r->fetch)
		return dg_err_set(r->err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < n_fetch; i++) {
		enum dg_status st = dg_graph_ref(g, fetch[i], &r->fetch[i], r->err);
		if (st != DG_OK) {
			dg_err_prefix(r->err, "fetch");
			return st;
		}
	}
	return DG_OK;
}

static enum dg_status apply_feeds(struct run *r, const struct dg_feed *feeds, int n_feeds)
{
	for (int i = 0; i < n_feeds; i++) {
		struct dg_edge e;
		enum dg_status st = dg_graph_ref(r->g, feeds[i].ref, &e, r->err);
		if (st != DG_OK) {
			dg_err_prefix(r->err, "feed");
			return st;
		}
		const struct dg_node *n = &r->g->nodes[e.node];
		int v = value_of(r, e);
		if (!feeds[i].value)
			return dg_err_set(r->err, DG_EINVAL, "feed '%s': no value given",
					  feeds[i].ref);
		if (r->fed[v]) {
			dg_err_set(r->err, DG_EINVAL, "feed '%s': output %d of node '%s' is fed "
				   "twice", feeds[i].ref, e.index, n->name);
			dg_err_hint(r->err, "give each --feed name once");
			return DG_EINVAL;
		}
		if (!dg_exec_type_ok(&n->out[e.index], feeds[i].value, r->err)) {
			dg_err_prefix(r->err, "feed for node '%s' (%s)", n->name, node_label_op(n));
			if (n->op && (n->op->flags & DG_OPF_FEED))
				dg_err_hint(r->err, "the Placeholder's \"dtype\" and \"shape\" "
					    "attrs declare what it accepts");
			return r->err->code;
		}
		r->fed[v] = feeds[i].value;
	}
	return DG_OK;
}

/* Walk back from the fetches, stopping at fed values, with an explicit stack
 * (graphs may be 10^6 nodes deep). Then count each needed value's readers. */
static enum dg_status mark_needed(struct run *r)
{
	const struct dg_graph *g = r->g;
	int *stack = malloc(((size_t)g->n_nodes + 1) * sizeof *stack);
	int top = 0;

	if (!stack)
		return dg_err_set(r->err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < r->n_fetch; i++) {
		int v = value_of(r, r->fetch[i]);
		if (!r->fed[v] && !r->needed[r->fetch[i].node]) {
			r->needed[r->fetch[i].node] = 1;
			stack[top++] = r->fetch[i].node;
		}
		if (!r->fed[v])
			r->uses[v]++;
	}
	while (top > 0) {
		const struct dg_node *n = &g->nodes[stack[--top]];
		for (int k = 0; k < n->n_in; k++) {
			int v = value_of(r, n->in[k]);
			if (r->fed[v])
				continue;
			r->uses[v]++;
			if (!r->needed[n->in[k].node]) {
				r->needed[n->in[k].node] = 1;
				stack[top++] = n->in[k].node;
			}
		}
	}
	free(stack);
	/* A needed Placeholder has its (only) output needed and unfed. */
	for (int v = 0; v < g->n_nodes; v++) {
		const struct dg_node *n = &g->nodes[v];
		if (r->needed[v] && (n->op->flags & DG_OPF_FEED)) {
			dg_err_set(r->err, DG_EINVAL, "placeholder '%s' must be fed (use --feed "
				   "%s=FILE.npy|VALUE)", n->name, n->name);
			dg_err_hint(r->err, "every Placeholder that a fetched value depends on "
				    "needs a value");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}

/* Release one read of value v; the last read frees it. */
static void release(struct run *r, int v)
{
	if (r->fed[v])
		return;
	if (--r->uses[v] == 0) {
		dg_tensor_free(r->val[v]);
		r->val[v] = NULL;
		gr_drop(&r->gx.gr, r->gx.dev[v]);
		r->gx.dev[v] = NULL;
	}
}

/* A new host copy of value v's device copy (which must exist). NULL with *err
 * set on failure. */
static struct dg_tensor *gx_download(struct dg_exec_gpu *g, int v, struct dg_err *err)
{
	struct dg_cuda_stream *s;
	struct dg_tensor *t;

	if (gr_stream(&g->gr, g->dev[v]->device, &s, err) != DG_OK)
		return NULL;
	if ((t = dg_cuda_download(s, g->dev[v], err)))
		count_copy(&n_downloads, &n_download_bytes, t->nbytes);
	return t;
}

/* The copy of value v on s's GPU: the one kept, or uploaded now (and kept for
 * later GPU readers) from host (borrowed; NULL: from v's copy on another GPU,
 * through a temporary host copy). NULL with *err set on failure. */
static const struct dg_cuda_tensor *gx_dev(struct dg_exec_gpu *g, int v,
					   const struct dg_tensor *host,
					   struct dg_cuda_stream *s, struct dg_err *err)
{
	int k = dg_cuda_stream_device(s);
	struct dg_tensor *tmp = NULL;
	struct dg_cuda_tensor *d;

	if (g->dev[v] && g->dev[v]->device == k)
		return g->dev[v];
	if (!host) {
		if (!g->dev[v]) {
			dg_err_set(err, DG_EINTERNAL, "value %d was read before it was computed",
				   v);
			return NULL;
		}
		if (!(host = tmp = gx_download(g, v, err)))
			return NULL;
	}
	d = dg_cuda_upload(s, host, err);
	dg_tensor_free(tmp);
	if (!d)
		return NULL;
	count_copy(&n_uploads, &n_upload_bytes, d->nbytes);
	gr_drop(&g->gr, g->dev[v]);      /* a copy on another GPU */
	g->dev[v] = d;
	return d;
}

/* The host form of value v (fed, computed, or downloaded now from its device
 * copy, which stays for later GPU readers). NULL with r->err set on failure. */
static const struct dg_tensor *host_of(struct run *r, int v)
{
	if (r->fed[v])
		return r->fed[v];
	if (r->val[v])
		return r->val[v];
	if (!r->gx.dev[v]) {
		dg_err_set(r->err, DG_EINTERNAL, "value %d was read before it was computed", v);
		return NULL;
	}
	r->val[v] = gx_download(&r->gx, v, r->err);
	return r->val[v];
}

/* The copy of value v on s's GPU, uploaded now when there is none (and kept
 * for later GPU readers). NULL with r->err set on failure. */
static const struct dg_cuda_tensor *dev_of(struct run *r, int v, struct dg_cuda_stream *s)
{
	return gx_dev(&r->gx, v, r->fed[v] ? r->fed[v] : r->val[v], s, r->err);
}

/* Node n's CPU kernel (the fallback of GPU nodes too). */
static enum dg_status cpu_kernel(const struct dg_node *n, struct dg_attrs a,
				 const struct dg_tensor *const *ins,
				 struct dg_tensor **outs, uint64_t step, struct dg_err *err)
{
	enum dg_status st;

	memset(outs, 0, (size_t)n->n_out * sizeof *outs);
	if (!n->op->cpu) {
		st = dg_err_set(err, DG_EUNSUPPORTED, "op has no CPU kernel");
	} else {
		struct dg_kernel_ctx c = {
			.attrs = a, .n_in = n->n_in, .in = ins, .n_out = n->n_out,
			.out = outs, .step = step, .err = err,
		};
		st = n->op->cpu(&c);
		if (st != DG_OK && err->code == DG_OK)
			dg_err_set(err, st, "kernel failed");
	}
	/* A kernel that disagrees with its own inference would mislead every
	 * consumer's checks: report it as the bug it is. */
	for (int o = 0; st == DG_OK && o < n->n_out; o++) {
		if (!outs[o]) {
			st = dg_err_set(err, DG_EINTERNAL, "kernel produced no output %d (a bug "
					"in the op)", o);
		} else if (!dg_exec_type_ok(&n->out[o], outs[o], err)) {
			dg_err_prefix(err, "output %d disagrees with inference (a bug in the "
				      "op)", o);
			st = err->code = DG_EINTERNAL;
		}
	}
	if (st != DG_OK) {
		for (int o = 0; o < n->n_out; o++) {
			dg_tensor_free(outs[o]);
			outs[o] = NULL;
		}
		dg_err_prefix(err, "node '%s' (%s)", n->name, n->op->name);
	}
	return st;
}

enum dg_status dg_exec_kernel(const struct dg_node *n, const struct dg_tensor *const *ins,
			      struct dg_tensor **outs, uint64_t step, struct dg_err *err)
{
	return dg_exec_kernel_attrs(n, dg_attrs_of_json(n->attrs), ins, outs, step, err);
}

enum dg_status dg_exec_kernel_attrs(const struct dg_node *n, struct dg_attrs a,
				    const struct dg_tensor *const *ins, struct dg_tensor **outs,
				    uint64_t step, struct dg_err *err)
{
	int k = node_gpu(n);

	memset(outs, 0, (size_t)n->n_out * sizeof *outs);
	if (k >= 0) {
		bool fallback;
		enum dg_status st = gpu_kernel_host(n, a, k, ins, outs, step, &fallback, err);
		if (!fallback)
			return st;
	}
	return cpu_kernel(n, a, ins, outs, step, err);
}

/* ------------------------------------------- fragment runs (dg_exec_gpu) */

struct dg_exec_gpu *dg_exec_gpu_new(int n_values, struct dg_err *err)
{
	struct dg_exec_gpu *g = calloc(1, sizeof *g);

	if (n_values < 0 || !g || !(g->dev = calloc((size_t)n_values + 1, sizeof *g->dev))) {
		free(g);
		dg_err_set(err, DG_ENOMEM, "out of memory for the device copies of %d values",
			   n_values);
		return NULL;
	}
	g->n_values = n_values;
	return g;
}

void dg_exec_gpu_free(struct dg_exec_gpu *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->n_values; i++)
		gr_drop(&g->gr, g->dev[i]);
	gr_end(&g->gr);
	free(g->dev);
	free(g);
}

int dg_exec_node_gpu(const struct dg_node *n)
{
	return node_gpu(n);
}

bool dg_exec_gpu_has(const struct dg_exec_gpu *g, int id)
{
	return g && id >= 0 && id < g->n_values && g->dev[id];
}

void dg_exec_gpu_forget(struct dg_exec_gpu *g, int id)
{
	if (!dg_exec_gpu_has(g, id))
		return;
	gr_drop(&g->gr, g->dev[id]);
	g->dev[id] = NULL;
}

enum dg_status dg_exec_gpu_download(struct dg_exec_gpu *g, int id, struct dg_tensor **out,
				    struct dg_err *err)
{
	*out = NULL;
	if (!dg_exec_gpu_has(g, id))
		return dg_err_set(err, DG_EINTERNAL, "value %d has no device copy", id);
	*out = gx_download(g, id, err);
	return *out ? DG_OK : err->code;
}

enum dg_status dg_exec_gpu_step_end(struct dg_exec_gpu *g, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	if (!g)
		return DG_OK;
	for (int i = 0; i < g->n_values; i++) {
		gr_drop(&g->gr, g->dev[i]);
		g->dev[i] = NULL;
	}
	/* A stream whose work failed is not used again: the next step takes a new one. */
	for (int k = 0; k < MAX_GPUS; k++) {
		struct dg_err e = { 0 };
		if (!g->gr.s[k] || dg_cuda_stream_sync(g->gr.s[k], &e) == DG_OK)
			continue;
		if (st == DG_OK) {
			st = e.code;
			if (err) {
				*err = e;
				dg_err_prefix(err, "GPU %d, at the end of the step", k);
			}
		}
		dg_cuda_stream_free(g->gr.s[k]);
		g->gr.s[k] = NULL;
		g->gr.broken[k] = false;
	}
	gr_flush(&g->gr);
	return st;
}

void dg_exec_gpu_copies(struct dg_exec_gpu_copies *out)
{
	out->uploads = atomic_load(&n_uploads);
	out->upload_bytes = atomic_load(&n_upload_bytes);
	out->downloads = atomic_load(&n_downloads);
	out->download_bytes = atomic_load(&n_download_bytes);
}

/* dg_exec_kernel_ids on the CPU: inputs that exist only in device memory are
 * downloaded into temporaries. */
static enum dg_status cpu_kernel_ids(const struct dg_node *n, struct dg_attrs a,
				     struct dg_exec_gpu *g, const int *in_ids, const struct dg_tensor *const *ins,
				     struct dg_tensor **outs, uint64_t step, struct dg_err *err)
{
	const struct dg_tensor *small_h[8], **h = small_h;
	struct dg_tensor *small_tmp[8], **tmp = small_tmp;
	enum dg_status st = DG_OK;

	if (n->n_in > 8) {
		h = calloc((size_t)n->n_in, sizeof *h);
		tmp = calloc((size_t)n->n_in, sizeof *tmp);
		if (!h || !tmp) {
			free(h);
			free(tmp);
			dg_err_set(err, DG_ENOMEM, "out of memory");
			dg_err_prefix(err, "node '%s' (%s)", n->name, n->op->name);
			return DG_ENOMEM;
		}
	}
	for (int i = 0; i < n->n_in; i++) {
		tmp[i] = NULL;
		h[i] = ins[i];
		if (!h[i] && st == DG_OK) {
			if ((st = dg_exec_gpu_download(g, in_ids[i], &tmp[i], err)) != DG_OK)
				dg_err_prefix(err, "node '%s' (%s): input %d", n->name,
					      n->op->name, i);
			h[i] = tmp[i];
		}
	}
	if (st == DG_OK)
		st = cpu_kernel(n, a, h, outs, step, err);
	for (int i = 0; i < n->n_in; i++)
		dg_tensor_free(tmp[i]);
	if (h != small_h) {
		free(h);
		free(tmp);
	}
	return st;
}

enum dg_status dg_exec_kernel_ids(const struct dg_node *n, struct dg_exec_gpu *g,
				  const int *in_ids, const struct dg_tensor *const *ins,
				  const int *out_ids, struct dg_tensor **outs, uint64_t step,
				  struct dg_err *err)
{
	return dg_exec_kernel_ids_attrs(n, dg_attrs_of_json(n->attrs), g, in_ids, ins, out_ids,
					outs, step, err);
}

enum dg_status dg_exec_kernel_ids_attrs(const struct dg_node *n, struct dg_attrs a,
					struct dg_exec_gpu *g, const int *in_ids,
					const struct dg_tensor *const *ins, const int *out_ids,
					struct dg_tensor **outs, uint64_t step, struct dg_err *err)
{
	const struct dg_cuda_tensor *small_in[8], **din = small_in;
	struct dg_cuda_tensor *dout[4] = { 0 };
	struct dg_cuda_stream *s;
	int k = g ? node_gpu(n) : -1;
	bool fallback = false;
	enum dg_status st;

	memset(outs, 0, (size_t)n->n_out * sizeof *outs);
	if (k < 0)
		return cpu_kernel_ids(n, a, g, in_ids, ins, outs, step, err);
	if (n->n_in > 8 && !(din = calloc((size_t)n->n_in, sizeof *din))) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		dg_err_prefix(err, "node '%s' (%s)", n->name, n->op->name);
		return DG_ENOMEM;
	}
	st = gr_stream(&g->gr, k, &s, err);
	for (int i = 0; st == DG_OK && i < n->n_in; i++)
		if (!(din[i] = gx_dev(g, in_ids[i], ins[i], s, err)))
			st = err->code;
	if (st == DG_OK)
		st = gpu_kernel(n, a, s, din, dout, step, &fallback, err);
	if (din != small_in)
		free(din);
	if (fallback)
		return cpu_kernel_ids(n, a, g, in_ids, ins, outs, step, err);
	if (st != DG_OK) {
		dg_err_prefix(err, "node '%s' (%s)", n->name, n->op->name);
		return st;
	}
	/* node_gpu() allows at most 4 outputs, the size of dout. */
	for (int o = 0; o < n->n_out; o++) {
		gr_drop(&g->gr, g->dev[out_ids[o]]);
		g->dev[out_ids[o]] = dout[o];
	}
	return DG_OK;
}

/* Node v on GPU k: inputs from their device copies (uploaded where a value has
 * none), outputs left on the device. *fallback: run it on the CPU instead. */
static enum dg_status run_node_gpu(struct run *r, int v, int k,
				   const struct dg_cuda_tensor **din, struct dg_cuda_tensor **dout,
				   uint64_t step, bool *fallback)
{
	const struct dg_node *n = &r->g->nodes[v];
	struct dg_cuda_stream *s;
	enum dg_status st = gr_stream(&r->gx.gr, k, &s, r->err);

	*fallback = false;
	for (int i = 0; st == DG_OK && i < n->n_in; i++)
		if (!(din[i] = dev_of(r, value_of(r, n->in[i]), s)))
			st = r->err->code;
	memset(dout, 0, (size_t)n->n_out * sizeof *dout);
	if (st == DG_OK)
		st = gpu_kernel(n, attrs_of(r, v), s, din, dout, step, fallback, r->err);
	if (st != DG_OK) {
		if (!*fallback)
			dg_err_prefix(r->err, "node '%s' (%s)", n->name, n->op->name);
		return st;
	}
	for (int o = 0; o < n->n_out; o++) {
		int ov = r->base[v] + o;
		if (r->fed[ov] || r->uses[ov] == 0)
			gr_drop(&r->gx.gr, dout[o]);     /* overridden by a feed, or unread */
		else
			r->gx.dev[ov] = dout[o];
	}
	return DG_OK;
}

/* Run node v's kernel: gather inputs, call it, check and store its outputs. */
static enum dg_status run_node(struct run *r, int v, const struct dg_tensor **ins,
			       struct dg_tensor **outs, const struct dg_cuda_tensor **din,
			       struct dg_cuda_tensor **dout, uint64_t step)
{
	const struct dg_node *n = &r->g->nodes[v];
	int gpu = node_gpu(n);
	bool fallback = true;
	enum dg_status st;

	if (gpu >= 0) {
		st = run_node_gpu(r, v, gpu, din, dout, step, &fallback);
		if (!fallback && st != DG_OK)
			return st;
	}
	if (fallback) {
		for (int k = 0; k < n->n_in; k++)
			if (!(ins[k] = host_of(r, value_of(r, n->in[k]))))
				return r->err->code;
		st = cpu_kernel(n, attrs_of(r, v), ins, outs, step, r->err);
		if (st != DG_OK)
			return st;
		for (int o = 0; o < n->n_out; o++) {
			int ov = r->base[v] + o;
			if (r->fed[ov] || r->uses[ov] == 0)
				dg_tensor_free(outs[o]);       /* overridden by a feed, or unread */
			else
				r->val[ov] = outs[o];
		}
	}
	for (int k = 0; k < n->n_in; k++)
		release(r, value_of(r, n->in[k]));
	return DG_OK;
}

/* The attr table of every node that runs, parsed once for the run. */
static enum dg_status parse_attrs(struct run *r)
{
	for (int v = 0; v < r->g->n_nodes; v++) {
		const struct dg_node *n = &r->g->nodes[v];
		if (r->needed[v] && !(r->tab[v] = dg_attr_table_new(n->attrs, r->err))) {
			dg_err_prefix(r->err, "node '%s' (%s)", n->name, n->op->name);
			return r->err->code;
		}
	}
	return DG_OK;
}

static enum dg_status execute(struct run *r, uint64_t step, int *nodes_run)
{
	const struct dg_graph *g = r->g;
	int max_in = 1, max_out = 1, count = 0;
	enum dg_status st = DG_OK;

	for (int v = 0; v < g->n_nodes; v++) {
		if (!r->needed[v])
			continue;
		if (g->nodes[v].n_in > max_in)
			max_in = g->nodes[v].n_in;
		if (g->nodes[v].n_out > max_out)
			max_out = g->nodes[v].n_out;
	}
	const struct dg_tensor **ins = malloc((size_t)max_in * sizeof *ins);
	struct dg_tensor **outs = malloc((size_t)max_out * sizeof *outs);
	const struct dg_cuda_tensor **din = malloc((size_t)max_in * sizeof *din);
	struct dg_cuda_tensor **dout = malloc((size_t)max_out * sizeof *dout);
	if (!ins || !outs || !din || !dout)
		st = dg_err_set(r->err, DG_ENOMEM, "out of memory");
	for (int k = 0; st == DG_OK && k < g->n_nodes; k++) {
		int v = g->order[k];
		if (!r->needed[v])
			continue;
		st = run_node(r, v, ins, outs, din, dout, step);
		count++;
	}
	free(ins);
	free(outs);
	free(din);
	free(dout);
	if (nodes_run)
		*nodes_run = count;
	return st;
}

/* Hand each fetched value to the caller: the last reader of a computed value
 * takes it without a copy; repeats and fed values are cloned. */
static enum dg_status hand_over(struct run *r, struct dg_tensor **out)
{
	for (int i = 0; i < r->n_fetch; i++) {
		int v = value_of(r, r->fetch[i]);
		if (!host_of(r, v))
			return r->err->code != DG_OK ? r->err->code : DG_ENOMEM;
		if (r->fed[v]) {
			out[i] = dg_tensor_clone(r->fed[v], r->err);
		} else if (--r->uses[v] == 0) {
			out[i] = r->val[v];
			r->val[v] = NULL;
		} else {
			out[i] = dg_tensor_clone(r->val[v], r->err);
		}
		if (!out[i])
			return r->err->code != DG_OK ? r->err->code : DG_ENOMEM;
	}
	return DG_OK;
}

enum dg_status dg_exec_run(const struct dg_graph *g, const struct dg_feed *feeds, int n_feeds,
			   const char *const *fetch, int n_fetch, struct dg_tensor **out,
			   const struct dg_exec_opts *opts, struct dg_err *err)
{
	struct dg_err local = { 0 };
	struct run r = { .g = g, .err = err ? err : &local };
	int n_out_slots = fetch && n_fetch > 0 ? n_fetch : (g ? g->n_fetch : 0);
	enum dg_status st;

	dg_err_clear(r.err);
	if (!g || !out || n_feeds < 0 || (n_feeds > 0 && !feeds))
		return dg_err_set(r.err, DG_EINVAL, "dg_exec_run: no graph, output array or feeds");
	for (int i = 0; i < n_out_slots; i++)
		out[i] = NULL;
	r.base = malloc(((size_t)g->n_nodes + 1) * sizeof *r.base);
	if (!r.base) {
		st = dg_err_set(r.err, DG_ENOMEM, "out of memory");
		goto out;
	}
	r.base[0] = 0;
	for (int v = 0; v < g->n_nodes; v++) {
		if ((int64_t)r.base[v] + g->nodes[v].n_out > INT_MAX) {
			st = dg_err_set(r.err, DG_ETOOLARGE, "graph has too many node outputs");
			goto out;
		}
		r.base[v + 1] = r.base[v] + g->nodes[v].n_out;
	}
	r.n_values = r.base[g->n_nodes];
	r.val = calloc((size_t)r.n_values + 1, sizeof *r.val);
	r.fed = calloc((size_t)r.n_values + 1, sizeof *r.fed);
	r.uses = calloc((size_t)r.n_values + 1, sizeof *r.uses);
	r.needed = calloc((size_t)g->n_nodes + 1, 1);
	r.gx.dev = calloc((size_t)r.n_values + 1, sizeof *r.gx.dev);
	r.gx.n_values = r.n_values;
	r.tab = calloc((size_t)g->n_nodes + 1, sizeof *r.tab);
	if (!r.val || !r.fed || !r.uses || !r.needed || !r.gx.dev || !r.tab) {
		st = dg_err_set(r.err, DG_ENOMEM, "out of memory for a run of %d nodes",
				g->n_nodes);
		goto out;
	}
	st = resolve_fetches(&r, fetch, n_fetch);
	if (st == DG_OK)
		st = apply_feeds(&r, feeds, n_feeds);
	if (st == DG_OK)
		st = mark_needed(&r);
	if (st == DG_OK)
		st = parse_attrs(&r);
	if (st == DG_OK)
		st = execute(&r, opts ? opts->step : 0, opts ? opts->nodes_run : NULL);
	if (st == DG_OK)
		st = hand_over(&r, out);
	if (st != DG_OK) {
		for (int i = 0; i < n_out_slots; i++) {
			dg_tensor_free(out[i]);
			out[i] = NULL;
		}
	}
out:
	for (int i = 0; r.val && i < r.n_values; i++)
		dg_tensor_free(r.val[i]);
	for (int i = 0; r.gx.dev && i < r.n_values; i++)
		gr_drop(&r.gx.gr, r.gx.dev[i]);
	gr_end(&r.gx.gr);
	free(r.gx.dev);
	free(r.val);
	free(r.fed);
	free(r.uses);
	free(r.needed);
	for (int v = 0; r.tab && v < g->n_nodes; v++)
		dg_attr_table_free(r.tab[v]);
	free(r.tab);
	free(r.base);
	free(r.fetch);
	return st;
}
