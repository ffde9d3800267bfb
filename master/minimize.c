/* The Minimize op (TensorFlow's optimizer.minimize(loss) as one node): in a
 * job of plain steps, each Minimize node is lowered before placement into the
 * gradient of its loss (autodiff.c) and one ApplyGradient per Variable it
 * trains, with its optimizer attrs; the node itself becomes the new versions
 * of those Variables (an int64 vector), so fetching it runs one training step
 * with whatever the job feeds. A training job ("training" section) builds its
 * own applies and refuses it (train_build.c). Neighbours: ops.c (ApplyGradient), submit.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/autodiff.h"
#include "dg/kernels.h"
#include "internal.h"

static const struct dg_attr_spec minimize_attrs[] = {
	{ "variables", DG_ATTR_JSON, false, "names of the Variable nodes to train (default: "
	  "every float Variable the loss depends on)" },
	MASTER_RULE_ATTRS,
	{ NULL, 0, false, NULL },
};

static enum dg_status minimize_infer(struct dg_infer_ctx *c)
{
	const json_t *vars = json_object_get(c->attrs, "variables");
	size_t i;
	json_t *v;
	enum dg_status st;

	if (vars) {
		if (!json_is_array(vars) || json_array_size(vars) == 0)
			return dg_err_set(c->err, DG_EINVAL, "attr 'variables' must be a non-empty "
					  "array of Variable node names");
		json_array_foreach(vars, i, v)
			if (!json_is_string(v))
				return dg_err_set(c->err, DG_EINVAL, "attr 'variables'[%zu] is not a "
						  "string", i);
	}
	/* The rule and its attrs are ApplyGradient's: checked by its inference. */
	if ((st = place_apply_gradient_op()->infer(c)) != DG_OK)
		return st;
	c->out[0].dtype = DG_I64;
	c->out[0].shape.ndim = 1;
	c->out[0].shape.dim[0] = -1;
	return DG_OK;
}

static const struct dg_op_def minimize_def = {
	.name = "Minimize",
	.min_inputs = 1,
	.max_inputs = 1,
	.n_outputs = 1,
	.attrs = minimize_attrs,
	.infer = minimize_infer,
	.flags = DG_OPF_STATEFUL,
	.doc = "one training step of the input loss: its gradient with respect to the "
	       "Variables (attr variables, or all it depends on), applied on their ps with the "
	       "update rule (plain jobs; Python's optimizer.minimize); outputs their new versions",
};

const struct dg_op_def *master_minimize_op(void)
{
	return &minimize_def;
}

/* The first Minimize node of g, or -1. */
static int first_minimize(const struct dg_graph *g)
{
	for (int i = 0; i < g->n_nodes; i++)
		if (g->nodes[i].op == &minimize_def)
			return i;
	return -1;
}

bool master_has_minimize(const struct dg_graph *g)
{
	return first_minimize(g) >= 0;
}

/* The Variables node m trains: attr 'variables' (each a float Variable), else
 * every float Variable its loss reaches. *out owned (names borrowed from g). */
static enum dg_status trained(const struct dg_graph *g, int m, const char ***out, int *n,
			      struct dg_err *err)
{
	const struct dg_node *nd = &g->nodes[m];
	const json_t *list = json_object_get(nd->attrs, "variables");
	const char **w = calloc((size_t)g->n_nodes + 1, sizeof *w);
	bool *need = calloc((size_t)g->n_nodes + 1, sizeof *need);
	int *stack = calloc((size_t)g->n_nodes + 1, sizeof *stack);
	int sp = 0;

	*out = NULL;
	*n = 0;
	if (!w || !need || !stack) {
		free(w);
		free(need);
		free(stack);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	need[nd->in[0].node] = true;
	stack[sp++] = nd->in[0].node;
	while (sp > 0) {
		const struct dg_node *s = &g->nodes[stack[--sp]];
		for (int i = 0; i < s->n_in; i++)
			if (!need[s->in[i].node]) {
				need[s->in[i].node] = true;
				stack[sp++] = s->in[i].node;
			}
	}
	free(stack);
	for (size_t i = 0; list && i < json_array_size(list); i++) {
		const char *name = json_string_value(json_array_get(list, i));
		int v = dg_graph_find(g, name);
		if (v < 0 || !master_is_variable(&g->nodes[v]) ||
		    !dg_dtype_is_float(g->nodes[v].out[0].dtype)) {
			dg_err_set(err, DG_EINVAL, "node '%s' (Minimize): attr 'variables' names "
				   "'%.128s', which is not a float Variable node of the graph",
				   nd->name, name);
			goto fail;
		}
		if (!need[v]) {
			dg_err_set(err, DG_EINVAL, "node '%s' (Minimize): the loss does not depend "
				   "on Variable '%s'", nd->name, name);
			dg_err_hint(err, "train only the Variables the loss is computed from");
			goto fail;
		}
		w[(*n)++] = g->nodes[v].name;
	}
	for (int i = 0; !list && i < g->n_nodes; i++)
		if (need[i] && master_is_variable(&g->nodes[i]) &&
		    dg_dtype_is_float(g->nodes[i].out[0].dtype))
			w[(*n)++] = g->nodes[i].name;
	if (*n == 0) {
		dg_err_set(err, DG_EINVAL, "node '%s' (Minimize): the loss depends on no float "
			   "Variable: there is nothing to train", nd->name);
		dg_err_hint(err, "the loss must be computed from Variable nodes");
		goto fail;
	}
	free(need);
	*out = w;
	return DG_OK;
fail:
	free(need);
	free(w);
	*n = 0;
	return DG_EINVAL;
}

/* The node object named name in doc's "nodes" (borrowed), or NULL. */
static json_t *doc_node(json_t *doc, const char *name)
{
	json_t *nodes = json_object_get(doc, "nodes"), *nd;
	size_t i;

	json_array_foreach(nodes, i, nd)
		if (strcmp(json_string_value(json_object_get(nd, "name")), name) == 0)
			return nd;
	return NULL;
}

/* ApplyGradient "M/apply/VAR" of grad (and rows) with M's optimizer attrs. */
static enum dg_status add_apply(json_t *doc, const struct dg_node *m, const char *var,
				const char *grad, const char *rows, json_t *versions,
				int k, struct dg_err *err)
{
	char name[DG_GRAPH_MAX_NAME * 2 + 32], ver[DG_GRAPH_MAX_NAME + 32];
	json_t *a = json_deep_copy(m->attrs), *in, *nodes = json_object_get(doc, "nodes");

	snprintf(name, sizeof name, "%s/apply/%s", m->name, var);
	snprintf(ver, sizeof ver, "%s/version/%d", m->name, k);
	in = rows ? json_pack("[s,s]", grad, rows) : json_pack("[s]", grad);
	if (!a || !in) {
		json_decref(a);
		json_decref(in);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	json_object_del(a, "variables");
	json_object_set_new(a, "variable", json_string(var));
	/* No device: placement puts an apply with its gradient (place.c). */
	if (json_array_append_new(nodes, json_pack("{s:s, s:s, s:o, s:o}", "name", name, "op",
						   "ApplyGradient", "inputs", in, "attrs", a)) ||
	    json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s], s:{s:i}}", "name", ver,
						   "op", "ExpandDims", "inputs", name, "attrs",
						   "axis", 0)) ||
	    json_array_append_new(versions, json_string(ver)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

/* Lower Minimize node m of g: *doc gets g's document with m's gradient, its
 * applies, and m as the Concat of the new versions. */
static enum dg_status lower_one(const struct dg_graph *g, int m, json_t **doc,
				struct dg_err *err)
{
	const struct dg_node *nd = &g->nodes[m];
	char prefix[DG_GRAPH_MAX_NAME + 16], loss[DG_GRAPH_MAX_NAME + 16];
	char **grads = NULL, **rows = NULL;
	struct dg_autodiff_opts ao = { .prefix = prefix, .lookup = master_op_find,
				       .row_refs = &rows };
	const char **wrt;
	json_t *versions = NULL, *mn;
	int n, kept = 0;
	enum dg_status st;

	*doc = NULL;
	if ((st = trained(g, m, &wrt, &n, err)) != DG_OK)
		return st;
	snprintf(prefix, sizeof prefix, "%s/grad/", nd->name);
	if (nd->in[0].index)
		snprintf(loss, sizeof loss, "%s:%d", g->nodes[nd->in[0].node].name, nd->in[0].index);
	else
		snprintf(loss, sizeof loss, "%s", g->nodes[nd->in[0].node].name);
	st = dg_autodiff_ex(g, loss, wrt, n, &ao, doc, &grads, err);
	if (st != DG_OK) {
		dg_err_prefix(err, "node '%s' (Minimize)", nd->name);
		goto out;
	}
	if (!(versions = json_array())) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	/* A Variable reached only through integer edges has no gradient: untrained. */
	for (int i = 0; st == DG_OK && i < n; i++)
		if (grads[i])
			st = add_apply(*doc, nd, wrt[i], grads[i], rows ? rows[i] : NULL, versions,
				       kept++, err);
	if (st == DG_OK && kept == 0) {
		st = dg_err_set(err, DG_EINVAL, "node '%s' (Minimize): no Variable gets a gradient "
				"from the loss (only through integer values)", nd->name);
	}
	mn = st == DG_OK ? doc_node(*doc, nd->name) : NULL;
	if (st == DG_OK && (!mn || json_object_set_new(mn, "op", json_string("Concat")) ||
			    json_object_set(mn, "inputs", versions) ||
			    json_object_set_new(mn, "attrs", json_pack("{s:i}", "axis", 0))))
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
out:
	json_decref(versions);
	dg_autodiff_free_refs(grads, n);
	dg_autodiff_free_refs(rows, n);
	free(wrt);
	if (st != DG_OK) {
		json_decref(*doc);
		*doc = NULL;
	}
	return st;
}

enum dg_status master_lower_minimize(struct dg_graph **g, struct dg_err *err)
{
	int m;

	while ((m = first_minimize(*g)) >= 0) {
		json_t *doc;
		struct dg_graph *ng;
		enum dg_status st = lower_one(*g, m, &doc, err);

		if (st != DG_OK)
			return st;
		ng = dg_graph_from_json(doc, master_op_find, err);
		json_decref(doc);
		if (!ng) {
			dg_err_prefix(err, "the graph with its Minimize nodes lowered");
			return err ? err->code : DG_EINVAL;
		}
		dg_graph_free(*g);
		*g = ng;
	}
	return DG_OK;
}
