/* The single-process evaluator (dg/exec.h): marks the nodes the fetches need,
 * substitutes feeds, runs each needed node's CPU kernel in the graph's
 * topological order and frees every intermediate value after its last reader.
 * Per-run state lives here; the validated graph (core/src/graph.c) is only
 * read, so one graph can be run by several threads. */
#include "dg/exec.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Per-run state. Values are numbered: output k of node v is value base[v] + k. */
struct run {
	const struct dg_graph *g;
	int *base;                       /* n_nodes + 1 entries */
	int n_values;
	struct dg_tensor **val;          /* computed values, owned; NULL once freed */
	const struct dg_tensor **fed;    /* fed values, borrowed; NULL when not fed */
	int *uses;                       /* readers still to come: consumers + fetches */
	unsigned char *needed;           /* per node: must run for the fetches */
	struct dg_edge *fetch;
	int n_fetch;
	struct dg_err *err;
};

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
	}
}

enum dg_status dg_exec_kernel(const struct dg_node *n, const struct dg_tensor *const *ins,
			      struct dg_tensor **outs, uint64_t step, struct dg_err *err)
{
	enum dg_status st;

	memset(outs, 0, (size_t)n->n_out * sizeof *outs);
	if (!n->op->cpu) {
		st = dg_err_set(err, DG_EUNSUPPORTED, "op has no CPU kernel");
	} else {
		struct dg_kernel_ctx c = {
			.attrs = n->attrs, .n_in = n->n_in, .in = ins, .n_out = n->n_out,
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

/* Run node v's kernel: gather inputs, call it, check and store its outputs. */
static enum dg_status run_node(struct run *r, int v, const struct dg_tensor **ins,
			       struct dg_tensor **outs, uint64_t step)
{
	const struct dg_node *n = &r->g->nodes[v];
	enum dg_status st;

	for (int k = 0; k < n->n_in; k++) {
		int iv = value_of(r, n->in[k]);
		ins[k] = r->fed[iv] ? r->fed[iv] : r->val[iv];
	}
	st = dg_exec_kernel(n, ins, outs, step, r->err);
	if (st != DG_OK)
		return st;
	for (int o = 0; o < n->n_out; o++) {
		int ov = r->base[v] + o;
		if (r->fed[ov] || r->uses[ov] == 0)
			dg_tensor_free(outs[o]);       /* overridden by a feed, or unread */
		else
			r->val[ov] = outs[o];
	}
	for (int k = 0; k < n->n_in; k++)
		release(r, value_of(r, n->in[k]));
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
	if (!ins || !outs)
		st = dg_err_set(r->err, DG_ENOMEM, "out of memory");
	for (int k = 0; st == DG_OK && k < g->n_nodes; k++) {
		int v = g->order[k];
		if (!r->needed[v])
			continue;
		st = run_node(r, v, ins, outs, step);
		count++;
	}
	free(ins);
	free(outs);
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
	if (!r.val || !r.fed || !r.uses || !r.needed) {
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
	free(r.val);
	free(r.fed);
	free(r.uses);
	free(r.needed);
	free(r.base);
	free(r.fetch);
	return st;
}
