/* Reverse-mode autodiff (worker/include/dg/autodiff.h): walks a validated
 * graph backwards from the loss in reverse topological order, sums the
 * gradient contributions each value receives, and calls each op's gradient
 * function (kernels/cpu/grad.c) through a struct dg_grad_ctx whose add()
 * appends JSON nodes to a copy of the graph document. The result is checked
 * with dg_graph_from_json before it is returned. */
#include "dg/autodiff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/kernels.h"

/* Refs handed out by the builder: owned here, freed together at the end. */
struct pool {
	char **v;
	int n, cap;
};

/* The gradient contributions one value has received so far. */
struct contrib {
	const char **v;    /* refs from the pool */
	int n, cap;
	const char *sum;   /* their sum, once taken */
	bool summed;
};

struct builder {
	const struct dg_graph *g;
	json_t *nodes;             /* the new document's "nodes" (borrowed) */
	const char *prefix;
	const char *fwd;           /* forward node being differentiated: names the new nodes */
	const char *device;        /* its device, given to the new nodes; NULL: none */
	long counter;              /* makes new names unique */
	dg_op_lookup_fn lookup;    /* ops of the result (gradient ops are all registry ops) */
	struct pool pool;
	int *base;                 /* base[n]: index of node n's output 0 in acc */
	struct contrib *acc;       /* one per node output */
	struct dg_err *err;
};

static const char *pool_add(struct builder *b, char *s)
{
	if (!s)
		goto oom;
	if (b->pool.n == b->pool.cap) {
		int cap = b->pool.cap ? 2 * b->pool.cap : 64;
		char **v = realloc(b->pool.v, (size_t)cap * sizeof *v);
		if (!v)
			goto oom;
		b->pool.v = v;
		b->pool.cap = cap;
	}
	b->pool.v[b->pool.n++] = s;
	return s;
oom:
	free(s);
	dg_err_set(b->err, DG_ENOMEM, "out of memory building the gradient graph");
	return NULL;
}

static const char *ref_of(struct builder *b, struct dg_edge e)
{
	const char *name = b->g->nodes[e.node].name;
	char *s;

	if (e.index == 0)
		s = strdup(name);
	else if (asprintf(&s, "%s:%d", name, e.index) < 0)
		s = NULL;
	return pool_add(b, s);
}

/* A fresh node name: <prefix><forward node>/<Op>_<k>, or <prefix><Op>_<k> when
 * that would pass the name limit; never one of the forward graph's names. */
static char *new_name(struct builder *b, const char *op)
{
	char buf[DG_GRAPH_MAX_NAME + 64];

	for (;;) {
		int len = snprintf(buf, sizeof buf, "%s%s/%s_%ld", b->prefix, b->fwd, op,
				   b->counter++);
		if (len < 0 || len > DG_GRAPH_MAX_NAME)
			snprintf(buf, sizeof buf, "%s%s_%ld", b->prefix, op, b->counter++);
		if (dg_graph_find(b->g, buf) < 0)
			return strdup(buf);
	}
}

/* dg_grad_ctx.add: append {"name", "op", "inputs", "attrs", "device"}. */
static const char *ctx_add(struct dg_grad_ctx *c, const char *op, const char *const *in,
			   int n_in, json_t *attrs)
{
	struct builder *b = c->builder;
	json_t *node = NULL, *inputs = json_array();
	const char *name = NULL;

	if (!attrs)
		attrs = json_object();
	if (!b->lookup(op)) {
		dg_err_set(b->err, DG_EINTERNAL, "gradient of node '%s' uses unknown op %s",
			   b->fwd, op);
		goto out;
	}
	for (int i = 0; i < n_in; i++) {
		if (!in[i]) {
			dg_err_set(b->err, DG_EINTERNAL, "gradient of node '%s': input %d of %s "
				   "is missing", b->fwd, i, op);
			goto out;
		}
		json_array_append_new(inputs, json_string(in[i]));
	}
	name = pool_add(b, new_name(b, op));
	if (!name)
		goto out;
	node = json_pack("{s:s, s:s, s:O, s:O}", "name", name, "op", op, "inputs", inputs,
			 "attrs", attrs);
	if (node && b->device)
		json_object_set_new(node, "device", json_string(b->device));
	if (!node || json_array_append_new(b->nodes, node) != 0) {
		dg_err_set(b->err, DG_ENOMEM, "out of memory building the gradient graph");
		name = NULL;
	}
out:
	json_decref(inputs);
	json_decref(attrs);
	return name;
}

static enum dg_status contrib_add(struct builder *b, struct contrib *a, const char *ref)
{
	if (a->n == a->cap) {
		int cap = a->cap ? 2 * a->cap : 4;
		const char **v = realloc(a->v, (size_t)cap * sizeof *v);
		if (!v)
			return dg_err_set(b->err, DG_ENOMEM, "out of memory building the gradient "
					  "graph");
		a->v = v;
		a->cap = cap;
	}
	a->v[a->n++] = ref;
	return DG_OK;
}

/* The total gradient of output k of node n: its contributions added up
 * (chained Add, left to right); NULL when none. Taken once, then cached: by
 * then every consumer has been processed (reverse topological order). */
static enum dg_status contrib_sum(struct builder *b, struct dg_grad_ctx *c, int n, int k,
				  const char **out)
{
	struct contrib *a = &b->acc[b->base[n] + k];
	const char *s;

	if (!a->summed) {
		s = a->n > 0 ? a->v[0] : NULL;
		b->fwd = b->g->nodes[n].name;
		b->device = b->g->nodes[n].device;
		for (int i = 1; i < a->n; i++) {
			const char *in[2] = { s, a->v[i] };
			s = ctx_add(c, "Add", in, 2, NULL);
			if (!s)
				return b->err->code;
		}
		a->sum = s;
		a->summed = true;
	}
	*out = a->sum;
	return DG_OK;
}

static bool is_float(enum dg_dtype dt)
{
	return dt == DG_F32 || dt == DG_F64;
}

static bool edge_eq(struct dg_edge a, struct dg_edge b)
{
	return a.node == b.node && a.index == b.index;
}

/* Resolve the refs and check they are float values. */
static enum dg_status resolve(const struct dg_graph *g, const char *ref, const char *what,
			      struct dg_edge *e, struct dg_err *err)
{
	enum dg_status st;
	enum dg_dtype dt;

	if (!ref)
		return dg_err_set(err, DG_EINVAL, "no %s given", what);
	st = dg_graph_ref(g, ref, e, err);
	if (st != DG_OK) {
		dg_err_prefix(err, "%s", what);
		return st;
	}
	dt = g->nodes[e->node].out[e->index].dtype;
	if (!is_float(dt)) {
		dg_err_set(err, DG_EDTYPE, "%s '%s' is %s; gradients exist for float32 and "
			   "float64 values only", what, ref, dg_dtype_name(dt));
		dg_err_hint(err, "Cast it to float32 first");
		return DG_EDTYPE;
	}
	return DG_OK;
}

/* reach[n]: node n consumes, through float edges, a wrt value or the output
 * of a node that does. Only those nodes can pass a gradient to a wrt. */
static void mark_reach(const struct dg_graph *g, const struct dg_edge *wrt, int n_wrt,
		       bool *reach)
{
	for (int i = 0; i < g->n_nodes; i++) {
		int n = g->order[i];
		const struct dg_node *nd = &g->nodes[n];
		for (int j = 0; j < nd->n_in && !reach[n]; j++) {
			struct dg_edge e = nd->in[j];
			bool w = false;
			for (int k = 0; k < n_wrt && !w; k++)
				w = edge_eq(e, wrt[k]);
			reach[n] = is_float(g->nodes[e.node].out[e.index].dtype) &&
				   (w || reach[e.node]);
		}
	}
}

/* Differentiate node n: sum its output gradients, call its op's gradient
 * function, and file the input gradients it returns. */
/* Call node n's gradient function with c (refs, need, dout and din already
 * set): the node's attrs and types filled in, input types taken from the
 * producers' inferred outputs, the new nodes tagged with n's name and
 * device. */
static enum dg_status call_grad(struct builder *b, int n, struct dg_grad_ctx *c)
{
	const struct dg_node *nd = &b->g->nodes[n];
	struct dg_ttype *it = calloc((size_t)nd->n_in + 1, sizeof *it);
	enum dg_status st;

	if (!it)
		return dg_err_set(b->err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < nd->n_in; i++)
		it[i] = b->g->nodes[nd->in[i].node].out[nd->in[i].index];
	c->node = nd->name;
	c->attrs = nd->attrs;
	c->n_in = nd->n_in;
	c->in_type = it;
	c->n_out = nd->n_out;
	c->out_type = nd->out;
	b->fwd = nd->name;
	b->device = nd->device;
	st = nd->op->grad(c);
	free(it);
	c->in_type = NULL;
	if (st != DG_OK)
		dg_err_prefix(b->err, "gradient of node '%s' (%s)", nd->name, nd->op->name);
	return st;
}

static enum dg_status grad_node(struct builder *b, int n, const struct dg_edge *wrt, int n_wrt,
				const bool *reach)
{
	const struct dg_node *nd = &b->g->nodes[n];
	struct dg_grad_ctx c = { 0 };
	const char **dout = calloc((size_t)nd->n_out + 1, sizeof *dout);
	const char **in = calloc((size_t)nd->n_in + 1, sizeof *in);
	const char **din = calloc((size_t)nd->n_in + 1, sizeof *din);
	const char **out = calloc((size_t)nd->n_out + 1, sizeof *out);
	bool *need = calloc((size_t)nd->n_in + 1, sizeof *need);
	enum dg_status st = DG_OK;
	bool any = false;

	c.builder = b;
	c.add = ctx_add;
	c.err = b->err;
	if (!dout || !in || !din || !out || !need) {
		st = dg_err_set(b->err, DG_ENOMEM, "out of memory building the gradient graph");
		goto out;
	}
	for (int k = 0; k < nd->n_out && st == DG_OK; k++) {
		st = contrib_sum(b, &c, n, k, &dout[k]);
		any = any || dout[k];
	}
	if (st != DG_OK || !any)
		goto out;
	if (!nd->op->grad) {
		st = dg_err_set(b->err, DG_EUNSUPPORTED, "node '%s' (%s) lies between a wrt "
				"value and the loss, but %s has no gradient", nd->name,
				nd->op->name, nd->op->name);
		dg_err_hint(b->err, "dg ops lists the ops; differentiable ones are in "
			    "doc/training.md");
		goto out;
	}
	for (int i = 0; i < nd->n_in && st == DG_OK; i++) {
		struct dg_edge e = nd->in[i];
		bool w = false;
		for (int k = 0; k < n_wrt && !w; k++)
			w = edge_eq(e, wrt[k]);
		need[i] = is_float(b->g->nodes[e.node].out[e.index].dtype) && (w || reach[e.node]);
		if (!(in[i] = ref_of(b, e)))
			st = b->err->code;
	}
	for (int k = 0; k < nd->n_out && st == DG_OK; k++)
		if (!(out[k] = ref_of(b, (struct dg_edge){ n, k })))
			st = b->err->code;
	if (st != DG_OK)
		goto out;
	c.in = in;
	c.need = need;
	c.out = out;
	c.dout = dout;
	c.din = din;
	if ((st = call_grad(b, n, &c)) != DG_OK)
		goto out;
	for (int i = 0; i < nd->n_in && st == DG_OK; i++)
		if (din[i] && need[i])
			st = contrib_add(b, &b->acc[b->base[nd->in[i].node] + nd->in[i].index],
					 din[i]);
out:
	free(dout);
	free(in);
	free(din);
	free(out);
	free(need);
	return st;
}

void dg_autodiff_free_refs(char **refs, int n)
{
	for (int i = 0; refs && i < n; i++)
		free(refs[i]);
	free(refs);
}

/* The node of the new document named ref (no ":k"), or NULL. */
static json_t *doc_node(const struct builder *b, const char *ref)
{
	json_t *n;
	size_t i;

	if (strchr(ref, ':'))
		return NULL;
	json_array_foreach(b->nodes, i, n)
		if (strcmp(json_string_value(json_object_get(n, "name")), ref) == 0)
			return n;
	return NULL;
}

/* Is every contribution to value e an UnsortedSegmentSum(values, rows)? Then
 * *vals and *rows get the row-wise gradient: the one pair, or each
 * concatenated along dim 0 (rows as int64). *vals NULL: no. */
static enum dg_status rows_of(struct builder *b, struct dg_grad_ctx *c, struct dg_edge e,
			      const char **vals, const char **rows)
{
	const struct contrib *a = &b->acc[b->base[e.node] + e.index];
	const char **vs = calloc((size_t)a->n + 1, sizeof *vs);
	const char **rs = calloc((size_t)a->n + 1, sizeof *rs);
	enum dg_status st = DG_OK;

	*vals = *rows = NULL;
	if (a->n == 0)
		goto out;
	if (!vs || !rs) {
		st = dg_err_set(b->err, DG_ENOMEM, "out of memory");
		goto out;
	}
	for (int k = 0; k < a->n; k++) {
		json_t *n = doc_node(b, a->v[k]), *in = json_object_get(n, "inputs");
		if (!n || strcmp(json_string_value(json_object_get(n, "op")),
				 "UnsortedSegmentSum") != 0 || json_array_size(in) != 2)
			goto out;
		if (!(vs[k] = pool_add(b, strdup(json_string_value(json_array_get(in, 0))))) ||
		    !(rs[k] = pool_add(b, strdup(json_string_value(json_array_get(in, 1)))))) {
			st = b->err->code;
			goto out;
		}
	}
	if (a->n == 1) {
		*vals = vs[0];
		*rows = rs[0];
		goto out;
	}
	b->fwd = b->g->nodes[e.node].name;     /* "grad/<var>/...": the variable's sum */
	b->device = b->g->nodes[e.node].device;
	for (int k = 0; k < a->n; k++) {
		rs[k] = ctx_add(c, "Cast", &rs[k], 1, json_pack("{s:s}", "dtype", "int64"));
		if (!rs[k]) {
			st = b->err->code;
			goto out;
		}
	}
	*vals = ctx_add(c, "Concat", vs, a->n, json_pack("{s:i}", "axis", 0));
	*rows = *vals ? ctx_add(c, "Concat", rs, a->n, json_pack("{s:i}", "axis", 0)) : NULL;
	if (!*rows) {
		*vals = NULL;
		st = b->err->code;
	}
out:
	free(vs);
	free(rs);
	return st;
}

/* The backward pass proper, on a builder whose document is set up. */
static enum dg_status backward(struct builder *b, struct dg_edge loss, const struct dg_edge *wrt,
			       int n_wrt, const char *const *wrt_refs, bool zeros, char **res,
			       char **rows)
{
	const struct dg_graph *g = b->g;
	bool *reach = calloc((size_t)g->n_nodes + 1, sizeof *reach);
	struct dg_grad_ctx c = { .builder = b, .add = ctx_add, .err = b->err };
	enum dg_status st = DG_OK;
	const char *seed, *lref;

	if (!reach)
		return dg_err_set(b->err, DG_ENOMEM, "out of memory");
	mark_reach(g, wrt, n_wrt, reach);
	b->fwd = g->nodes[loss.node].name;
	b->device = g->nodes[loss.node].device;
	lref = ref_of(b, loss);
	/* A scalar loss is seeded with a constant 1, not OnesLike(loss): the
	 * backward pass then does not wait for the loss's value, so the parts of
	 * a loss summed over micro-batches (or towers) start their backward as
	 * soon as their own forward is done. */
	if (lref && g->nodes[loss.node].out[loss.index].shape.ndim == 0)
		seed = ctx_add(&c, "Const", NULL, 0,
			       json_pack("{s:f, s:s}", "value", 1.0, "dtype",
					 dg_dtype_name(g->nodes[loss.node].out[loss.index].dtype)));
	else
		seed = lref ? ctx_add(&c, "OnesLike", &lref, 1, NULL) : NULL;
	if (!seed)
		st = b->err->code;
	else
		st = contrib_add(b, &b->acc[b->base[loss.node] + loss.index], seed);
	for (int i = g->n_nodes - 1; i >= 0 && st == DG_OK; i--)
		if (reach[g->order[i]])
			st = grad_node(b, g->order[i], wrt, n_wrt, reach);
	for (int i = 0; i < n_wrt && st == DG_OK; i++) {
		const char *r = NULL, *rr = NULL;
		if (rows && (st = rows_of(b, &c, wrt[i], &r, &rr)) != DG_OK)
			break;
		if (rr) {
			if (!(res[i] = strdup(r)) || !(rows[i] = strdup(rr)))
				st = dg_err_set(b->err, DG_ENOMEM, "out of memory");
			continue;
		}
		st = contrib_sum(b, &c, wrt[i].node, wrt[i].index, &r);
		if (st == DG_OK && !r && zeros) {
			b->fwd = g->nodes[wrt[i].node].name;
			b->device = g->nodes[wrt[i].node].device;
			r = ctx_add(&c, "ZerosLike", &wrt_refs[i], 1, NULL);
			if (!r)
				st = b->err->code;
		}
		if (st == DG_OK && r && !(res[i] = strdup(r)))
			st = dg_err_set(b->err, DG_ENOMEM, "out of memory");
	}
	free(reach);
	return st;
}

enum dg_status dg_autodiff_ex(const struct dg_graph *g, const char *loss_ref,
			      const char *const *wrt_refs, int n_wrt,
			      const struct dg_autodiff_opts *opts, json_t **out_doc,
			      char ***grad_refs, struct dg_err *err)
{
	struct dg_err local = { 0 };
	struct builder b = { .g = g, .err = err ? err : &local };
	struct dg_edge loss, *wrt = NULL;
	char **res = NULL, **rows = NULL;
	json_t *doc = NULL;
	struct dg_graph *check = NULL;
	enum dg_status st;
	int total = 0;

	*out_doc = NULL;
	*grad_refs = NULL;
	b.prefix = opts && opts->prefix ? opts->prefix : "grad/";
	b.lookup = opts && opts->lookup ? opts->lookup : dg_op_find;
	if (n_wrt < 0 || (n_wrt > 0 && !wrt_refs))
		return dg_err_set(b.err, DG_EINVAL, "bad wrt list (%d entries)", n_wrt);
	st = resolve(g, loss_ref, "loss", &loss, b.err);
	wrt = calloc((size_t)n_wrt + 1, sizeof *wrt);
	res = calloc((size_t)n_wrt + 1, sizeof *res);
	if (opts && opts->row_refs) {
		*opts->row_refs = NULL;
		rows = calloc((size_t)n_wrt + 1, sizeof *rows);
		if (!rows)
			st = st == DG_OK ? dg_err_set(b.err, DG_ENOMEM, "out of memory") : st;
	}
	b.base = calloc((size_t)g->n_nodes + 1, sizeof *b.base);
	if (st == DG_OK && (!wrt || !res || !b.base))
		st = dg_err_set(b.err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < n_wrt && st == DG_OK; i++)
		st = resolve(g, wrt_refs[i], "wrt", &wrt[i], b.err);
	for (int n = 0; n < g->n_nodes && st == DG_OK; n++) {
		b.base[n] = total;
		total += g->nodes[n].n_out;
	}
	if (st == DG_OK && !(b.acc = calloc((size_t)total + 1, sizeof *b.acc)))
		st = dg_err_set(b.err, DG_ENOMEM, "out of memory");
	if (st == DG_OK) {
		doc = json_deep_copy(g->doc);
		b.nodes = doc ? json_object_get(doc, "nodes") : NULL;
		if (!json_is_array(b.nodes))
			st = dg_err_set(b.err, DG_EINVAL, "the graph document has no node list");
	}
	if (st == DG_OK)
		st = backward(&b, loss, wrt, n_wrt, wrt_refs, opts && opts->zeros_for_unreachable,
			      res, rows);
	if (st == DG_OK) {
		/* A gradient function that built something invalid is our bug; say so
		 * here, naming the node, rather than when the graph runs. */
		check = dg_graph_from_json(doc, b.lookup, b.err);
		if (!check) {
			st = b.err->code;
			dg_err_prefix(b.err, "gradient graph is invalid (a bug in dg)");
		}
		dg_graph_free(check);
	}
	for (int i = 0; i < b.pool.n; i++)
		free(b.pool.v[i]);
	free(b.pool.v);
	for (int i = 0; b.acc && i < total; i++)
		free(b.acc[i].v);
	free(b.acc);
	free(b.base);
	free(wrt);
	if (st != DG_OK) {
		json_decref(doc);
		dg_autodiff_free_refs(res, n_wrt);
		dg_autodiff_free_refs(rows, n_wrt);
		return st;
	}
	*out_doc = doc;
	*grad_refs = res;
	if (rows)
		*opts->row_refs = rows;
	return DG_OK;
}

enum dg_status dg_autodiff(const struct dg_graph *g, const char *loss_ref,
			   const char *const *wrt, int n_wrt, json_t **out_doc, char ***grad_refs,
			   struct dg_err *err)
{
	return dg_autodiff_ex(g, loss_ref, wrt, n_wrt, NULL, out_doc, grad_refs, err);
}
