/* The training plan (train.h, doc/training.md): one replica graph per
 * replica from the user's forward graph (its towers first, train_towers.c):
 * autodiff of the loss w.r.t. the float Variables it depends on,
 * ApplyGradient nodes that push the gradients to the ps, every computing
 * node given its device in the replica's group (train_devices.c), ShardBatch
 * sharded by replica and tower. The spec is parsed in train_spec.c. Pure
 * functions over jansson documents: the master's job loop does the I/O. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/autodiff.h"
#include "dg/place.h"
#include "dg/train.h"
#include "train_internal.h"

static void free_strs(char **v, int n)
{
	for (int i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

int train_compute_tasks(const struct dg_cluster *c, int *idx)
{
	int n = 0;

	for (int t = 0; t < c->n_tasks; t++)
		if (strcmp(c->tasks[t].job, "ps") != 0)
			idx[n++] = t;
	return n;
}

/* ------------------------------------------------------------ plan building */

/* need[n]: the loss depends on node n (walk of the inputs from the loss). */
static enum dg_status loss_needs(const struct dg_graph *g, int loss, bool *need,
				 struct dg_err *err)
{
	int *stack = malloc(((size_t)g->n_nodes + 1) * sizeof *stack);
	int sp = 0;

	if (!stack)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	need[loss] = true;
	stack[sp++] = loss;
	while (sp > 0) {
		int n = stack[--sp];
		for (int i = 0; i < g->nodes[n].n_in; i++) {
			int s = g->nodes[n].in[i].node;
			if (!need[s]) {
				need[s] = true;
				stack[sp++] = s;
			}
		}
	}
	free(stack);
	return DG_OK;
}

/* Check a training ref: it must name a value of g (prefix: the key). */
static enum dg_status check_ref(const struct dg_graph *g, const char *key, const char *ref,
				struct dg_edge *e, struct dg_err *err)
{
	if (dg_graph_ref(g, ref, e, err) != DG_OK) {
		dg_err_prefix(err, "%s", key);
		return err ? err->code : DG_ENOTFOUND;
	}
	return DG_OK;
}

static enum dg_status check_refs(const struct dg_graph *g, const struct train_spec *s,
				 struct dg_err *err)
{
	struct dg_edge e;
	char key[64];
	enum dg_status st;

	if ((st = check_ref(g, "training.loss", s->loss, &e, err)) != DG_OK)
		return st;
	if (!dg_dtype_is_float(g->nodes[e.node].out[e.index].dtype)) {
		dg_err_set(err, DG_EDTYPE, "training.loss '%s' is %s; the loss must be a float",
			   s->loss, dg_dtype_name(g->nodes[e.node].out[e.index].dtype));
		dg_err_hint(err, "Cast it to float32, or name the float loss value");
		return DG_EDTYPE;
	}
	for (int i = 0; i < s->n_metrics; i++) {
		const struct dg_ttype *t;
		snprintf(key, sizeof key, "training.metrics[%d]", i);
		if ((st = check_ref(g, key, s->metrics[i], &e, err)) != DG_OK)
			return st;
		t = &g->nodes[e.node].out[e.index];
		if (!dg_dtype_is_float(t->dtype) && !dg_dtype_is_int(t->dtype) &&
		    !dg_dtype_is_half(t->dtype)) {
			dg_err_set(err, DG_EDTYPE, "%s '%s' is %s; metrics must be numbers", key,
				   s->metrics[i], dg_dtype_name(t->dtype));
			return DG_EDTYPE;
		}
		if (t->shape.ndim > 0) {
			dg_err_set(err, DG_EINVAL, "%s '%s' has %d dims; metrics must be scalars",
				   key, s->metrics[i], t->shape.ndim);
			dg_err_hint(err, "reduce it, e.g. with Mean");
			return DG_EINVAL;
		}
	}
	for (int i = 0; i < s->n_eval_fetch; i++) {
		snprintf(key, sizeof key, "training.eval.fetch[%d]", i);
		if ((st = check_ref(g, key, s->eval_fetch[i], &e, err)) != DG_OK)
			return st;
	}
	return DG_OK;
}

/* Steps per epoch from the first ShardBatch the loss needs (and the batch of
 * one replica): floor(ceil(n / R) / batch) for replica 0's shard of n examples.
 * *spe stays 0 without a ShardBatch or with an unknown dataset size. */
static enum dg_status epoch_size(const struct dg_graph *g, const bool *need,
				 const struct train_spec *s, int R, int64_t *spe,
				 int64_t *batch_out, struct dg_err *err)
{
	int found = 0;

	*spe = 0;
	*batch_out = 0;
	for (int k = 0; k < g->n_nodes; k++) {
		int n = g->order[k];
		const struct dg_node *nd = &g->nodes[n];
		const struct dg_ttype *in;
		int64_t batch, size, first, last;
		if (!need[n] || strcmp(nd->op->name, "ShardBatch") != 0)
			continue;
		if (s->batch > 0)
			batch = s->batch;
		else if (dg_attr_int(nd->attrs, "batch", NULL, &batch, err) != DG_OK)
			return DG_EINVAL;
		if (found++ > 0)
			continue;   /* the first one sets the epoch */
		*batch_out = batch;
		in = &g->nodes[nd->in[0].node].out[nd->in[0].index];
		size = in->shape.ndim >= 1 ? in->shape.dim[0] : -1;
		if (size < 0 && s->epochs > 0) {
			dg_err_set(err, DG_EINVAL, "training.epochs: the size of the dataset of "
				   "ShardBatch '%s' is not known when the graph is built",
				   nd->name);
			dg_err_hint(err, "read it with IdxReader, NpyReader or CsvReader, or give \"steps\" "
				    "instead of \"epochs\"");
			return DG_EINVAL;
		}
		if (size < 0)
			continue;
		first = (size + R - 1) / R;   /* shard 0 holds the most examples */
		last = size / R;
		if (last < batch) {
			dg_err_set(err, DG_EINVAL, "training.batch: ShardBatch '%s' splits %lld "
				   "examples into %d shards of %lld..%lld, fewer than one batch of "
				   "%lld", nd->name, (long long)size, R, (long long)last,
				   (long long)first, (long long)batch);
			dg_err_hint(err, "use a smaller batch or fewer replicas");
			return DG_EINVAL;
		}
		*spe = first / batch;
	}
	if (found == 0 && s->epochs > 0) {
		dg_err_set(err, DG_EINVAL, "training.epochs needs a ShardBatch in the part of the "
			   "graph the loss '%s' needs", s->loss);
		dg_err_hint(err, "batch the data with ShardBatch, or give \"steps\" instead");
		return DG_EINVAL;
	}
	if (found == 0 && s->batch > 0) {
		dg_err_set(err, DG_EINVAL, "training.batch is given but the loss '%s' needs no "
			   "ShardBatch", s->loss);
		dg_err_hint(err, "remove \"batch\" or batch the data with ShardBatch");
		return DG_EINVAL;
	}
	return DG_OK;
}

/* The ApplyGradient node of variable var for replica r (owned, or NULL);
 * rows (not NULL): a row-wise gradient, grad the values of those rows. */
static json_t *apply_node(const struct train_spec *s, const char *var, const char *grad,
			  const char *rows, int R, int r)
{
	char name[DG_GRAPH_MAX_NAME + 16];
	json_t *a = json_pack("{s:s, s:s, s:f, s:s, s:b, s:i, s:i, s:i}", "variable", var,
			      "rule", s->rule, "lr", s->lr, "schedule", s->schedule,
			      "sync", s->sync, "replicas", R, "backup", s->backup,
			      "replica", r);

	if (!a)
		return NULL;
	if (strcmp(s->schedule, "constant") != 0) {
		json_object_set_new(a, "every", json_integer(s->every));
		json_object_set_new(a, "factor", json_real(s->factor));
	}
	if (strcmp(s->rule, "momentum") == 0) {
		json_object_set_new(a, "momentum", json_real(s->momentum));
		json_object_set_new(a, "nesterov", json_boolean(s->nesterov));
	} else if (strcmp(s->rule, "adam") == 0) {
		json_object_set_new(a, "beta1", json_real(s->beta1));
		json_object_set_new(a, "beta2", json_real(s->beta2));
		json_object_set_new(a, "eps", json_real(s->eps));
	} else if (strcmp(s->rule, "adagrad") == 0) {
		json_object_set_new(a, "init", json_real(s->init));
	} else if (strcmp(s->rule, "rmsprop") == 0) {
		json_object_set_new(a, "momentum", json_real(s->momentum));
		json_object_set_new(a, "rho", json_real(s->rho));
		json_object_set_new(a, "eps", json_real(s->eps));
		json_object_set_new(a, "init", json_real(s->init));
	}
	snprintf(name, sizeof name, "_train/apply/%s", var);
	/* No device: placement puts it with its gradient (place.h), so the
	 * gradient goes from the task that computed it straight to the ps. */
	if (rows)
		return json_pack("{s:s, s:s, s:[s,s], s:o}", "name", name, "op", "ApplyGradient",
				 "inputs", grad, rows, "attrs", a);
	return json_pack("{s:s, s:s, s:[s], s:o}", "name", name, "op", "ApplyGradient",
			 "inputs", grad, "attrs", a);
}

/* Shard every ShardBatch of doc's "nodes": replica r of R (and batch when > 0);
 * with K towers, tower k's (its shard attr, from train_towers_build) reads
 * shard r*K + k of R*K. */
static enum dg_status shard_batches(json_t *doc, int r, int R, int K, int64_t batch,
				    struct dg_err *err)
{
	json_t *nodes = json_object_get(doc, "nodes"), *n;
	size_t i;

	json_array_foreach(nodes, i, n) {
		const char *op = json_string_value(json_object_get(n, "op"));
		json_t *a;
		if (!op || strcmp(op, "ShardBatch") != 0)
			continue;
		if (!(a = json_object_get(n, "attrs"))) {
			a = json_object();
			json_object_set_new(n, "attrs", a);
		}
		json_int_t k = K > 1 ? json_integer_value(json_object_get(a, "shard")) : 0;
		if (!a || json_object_set_new(a, "shard", json_integer((json_int_t)r * K + k)) ||
		    json_object_set_new(a, "num_shards", json_integer((json_int_t)R * K)) ||
		    (batch > 0 && json_object_set_new(a, "batch", json_integer(batch))))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	return DG_OK;
}

static json_t *refs_json(char *const *refs, int n)
{
	json_t *a = json_array();

	for (int i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_string(refs[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

/* Check a built document the way the master will parse it. */
static enum dg_status check_doc(json_t *doc, const char *what, struct dg_err *err)
{
	struct dg_graph *g = dg_graph_from_json(doc, master_op_find, err);

	if (!g) {
		dg_err_prefix(err, "%s", what);
		return err ? err->code : DG_EINVAL;
	}
	dg_graph_free(g);
	return DG_OK;
}

/* A step of a replica must see the applies of its previous step. An apply
 * that runs on another task than a reader of its Variable (colocated on the
 * ps, or its gradient computed elsewhere: apply_waits) is in a fragment that
 * reader's task does not wait for, so its next step's VarRead could read the
 * value before it: every task of the group waits for the applied versions
 * ("_train/applied", their sum, sent to each task as "_train/wait/k", a
 * target), as a TensorFlow step ends when all its ops did. */
static enum dg_status wait_for_applies(const struct train_layout *L, const struct dg_cluster *c,
				       const struct train_plan *p, int r, const bool *wait,
				       struct train_replica *rep, json_t *nodes, struct dg_err *err)
{
	char prev[DG_GRAPH_MAX_NAME + 32] = "", name[DG_GRAPH_MAX_NAME + 32];
	char dev[160];

	for (int v = 0; v < p->n_vars; v++) {
		char apply[DG_GRAPH_MAX_NAME + 16];
		snprintf(apply, sizeof apply, "_train/apply/%s", p->var_nodes[v]);
		if (!wait[v])
			continue;
		if (!prev[0]) {
			snprintf(prev, sizeof prev, "%s", apply);
			continue;
		}
		snprintf(name, sizeof name, "_train/applied/%s", p->var_nodes[v]);
		if (json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s,s]}", "name", name,
							   "op", "Add", "inputs", prev, apply)))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		snprintf(prev, sizeof prev, "%s", name);
	}
	if (!prev[0])
		return DG_OK;
	if (json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s]}", "name", "_train/applied",
						   "op", "Identity", "inputs", prev)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int k = 0; k < L->group; k++) {
		snprintf(name, sizeof name, "_train/wait/%d", k);
		place_device_name(c, train_layout_task(L, r, k), dev, sizeof dev);
		if (json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s], s:s}", "name", name,
							   "op", "Identity", "inputs",
							   "_train/applied", "device", dev)) ||
		    !(rep->targets[rep->n_targets] = strdup(name)))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		rep->n_targets++;
	}
	return DG_OK;
}

/* Every AssignMovingAverage of the graph (batch norm's moving mean and
 * variance) runs each step, like the applies: a target of the replica. */
static enum dg_status moving_average_targets(struct train_replica *rep, const json_t *nodes,
					     struct dg_err *err)
{
	json_t *n;
	size_t i;

	json_array_foreach(nodes, i, n) {
		const char *op = json_string_value(json_object_get(n, "op"));
		if (!op || strcmp(op, "AssignMovingAverage") != 0)
			continue;
		if (!(rep->targets[rep->n_targets] =
			      strdup(json_string_value(json_object_get(n, "name")))))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		rep->n_targets++;
	}
	return DG_OK;
}

static enum dg_status build_replica(const struct train_spec *s, const struct dg_cluster *c,
				    const struct train_layout *L, const json_t *ad_doc,
				    char *const *grads, char *const *rows,
				    const struct train_towers *tw, json_t *colocate, const bool *wait,
				    const struct train_plan *p, int r, struct dg_err *err)
{
	struct train_replica *rep = &p->rep[r];
	char what[64];
	json_t *nodes, *fetch;
	enum dg_status st;

	rep->doc = json_deep_copy(ad_doc);
	rep->targets = calloc((size_t)p->n_vars + (size_t)L->group +
			      json_array_size(json_object_get(ad_doc, "nodes")) + 1,
			      sizeof *rep->targets);
	rep->fetch = calloc((size_t)s->n_metrics + 2 + (size_t)p->n_extra, sizeof *rep->fetch);
	rep->reasons = tw && tw->reasons ? json_deep_copy(tw->reasons) : json_object();
	rep->colocate = json_incref(colocate);
	if (!rep->doc || !rep->targets || !rep->fetch || !rep->reasons)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	rep->n_fetch = s->n_metrics + 1;   /* the capacity: unfilled slots stay NULL */
	json_object_del(rep->doc, "training");
	if ((st = train_pin(rep->doc, L, c, r, colocate, rep->reasons, err)) != DG_OK ||
	    (st = shard_batches(rep->doc, r, p->n_replicas, s->towers > 1 ? s->towers : 1,
				s->batch, err)) != DG_OK)
		return st;
	nodes = json_object_get(rep->doc, "nodes");
	for (int i = 0; i < p->n_vars; i++) {
		json_t *n = apply_node(s, p->var_nodes[i], grads[i], rows[i], p->n_replicas, r);
		if (!n || json_array_append_new(nodes, n))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		rep->targets[i] = strdup(json_string_value(json_object_get(n, "name")));
		if (!rep->targets[i])
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		rep->n_targets = i + 1;
	}
	if ((st = moving_average_targets(rep, nodes, err)) != DG_OK)
		return st;
	if (L->group > 1 && (st = wait_for_applies(L, c, p, r, wait, rep, nodes, err)) != DG_OK)
		return st;
	rep->fetch[0] = strdup(s->loss);
	for (int i = 0; rep->fetch[0] && i < s->n_metrics; i++)
		if (!(rep->fetch[i + 1] = strdup(s->metrics[i])))
			break;
	for (int i = 0; i < rep->n_fetch; i++)
		if (!rep->fetch[i])
			return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (p->queue && (st = train_input_replica(s, p, r, rep, err)) != DG_OK)
		return st;
	fetch = refs_json(rep->fetch, rep->n_fetch);
	if (!fetch || json_object_set_new(rep->doc, "fetch", fetch))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	snprintf(what, sizeof what, "replica %d's graph", r);
	return check_doc(rep->doc, what, err);
}

static enum dg_status build_eval(const struct dg_graph *g, const struct train_spec *s,
				 const struct dg_cluster *c, const struct train_layout *L,
				 struct train_plan *p, struct dg_err *err)
{
	json_t *fetch;
	enum dg_status st;

	if (s->n_eval_fetch == 0)
		return DG_OK;
	p->eval_doc = json_deep_copy(g->doc);
	if (!p->eval_doc)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	json_object_del(p->eval_doc, "training");
	if ((st = train_pin(p->eval_doc, L, c, 0, NULL, NULL, err)) != DG_OK)
		return st;
	fetch = refs_json(s->eval_fetch, s->n_eval_fetch);
	if (!fetch || json_object_set_new(p->eval_doc, "fetch", fetch))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return check_doc(p->eval_doc, "training.eval's graph", err);
}

/* The float Variables the loss depends on, in file order; their gradients. */
static enum dg_status trained_vars(const struct dg_graph *g, const struct train_spec *s,
				   const bool *need, struct train_plan *p, json_t **ad_doc,
				   char ***grads, char ***rows, int *n_grads, struct dg_err *err)
{
	const struct dg_op_def *var_op = place_variable_op();
	/* an embedding read only through Gather gets a row-wise gradient */
	struct dg_autodiff_opts ao = { .prefix = "grad/", .lookup = master_op_find,
				       .row_refs = rows };
	const char **wrt = calloc((size_t)g->n_nodes + 1, sizeof *wrt);
	int n = 0, kept = 0;
	enum dg_status st;

	if (!wrt)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < g->n_nodes; i++)
		if (need[i] && g->nodes[i].op == var_op &&
		    dg_dtype_is_float(g->nodes[i].out[0].dtype))
			wrt[n++] = g->nodes[i].name;
	if (n == 0) {
		free(wrt);
		dg_err_set(err, DG_EINVAL, "training.loss '%s' depends on no float Variable: "
			   "there is nothing to train", s->loss);
		dg_err_hint(err, "the loss must be computed from Variable nodes");
		return DG_EINVAL;
	}
	st = dg_autodiff_ex(g, s->loss, wrt, n, &ao, ad_doc, grads, err);
	if (st == DG_OK)
		*n_grads = n;
	if (st != DG_OK) {
		free(wrt);
		dg_err_prefix(err, "training.loss '%s'", s->loss);
		return st;
	}
	/* A Variable reached only through integer edges gets no gradient: not trained. */
	p->var_nodes = calloc((size_t)n + 1, sizeof *p->var_nodes);
	if (!p->var_nodes) {
		free(wrt);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		if (!(*grads)[i])
			continue;
		if (!(p->var_nodes[kept] = strdup(wrt[i]))) {
			free(wrt);
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		}
		(*grads)[kept] = (*grads)[i];
		(*rows)[kept] = (*rows)[i];
		if (kept != i)
			(*grads)[i] = (*rows)[i] = NULL;
		p->n_vars = ++kept;
	}
	free(wrt);
	if (kept == 0) {
		dg_err_set(err, DG_EINVAL, "training.loss '%s' has no gradient with respect to "
			   "any Variable", s->loss);
		dg_err_hint(err, "the Variables reach the loss only through integer values");
		return DG_EINVAL;
	}
	return DG_OK;
}

/* The layout's replicas into the plan: replica_task, group_task. */
static enum dg_status plan_layout(const struct train_layout *L, struct train_plan *p,
				  struct dg_err *err)
{
	p->n_replicas = L->replicas;
	p->group = L->group;
	p->replica_task = calloc((size_t)L->replicas + 1, sizeof *p->replica_task);
	p->group_task = calloc((size_t)L->replicas * (size_t)L->group + 1,
			       sizeof *p->group_task);
	if (!p->replica_task || !p->group_task)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int r = 0; r < L->replicas; r++) {
		p->replica_task[r] = train_layout_task(L, r, 0);
		for (int k = 0; k < L->group; k++)
			p->group_task[r * L->group + k] = train_layout_task(L, r, k);
	}
	return DG_OK;
}

/* Whether name is one of Variable var's gradient sum nodes ("grad/<var>/...",
 * autodiff's chained Add of the contributions of var's consumers). */
static bool is_sum_of(const char *name, const char *var)
{
	size_t len = strlen(var);

	return strncmp(name, "grad/", 5) == 0 && strncmp(name + 5, var, len) == 0 &&
	       name[5 + len] == '/';
}

/* Whether the contributions summed into var's gradient come from nodes of
 * more than one device (towers, or a variable used on several tasks); else
 * *one gets their one device ("" = none; borrowed from dev_of). */
static bool sums_across_devices(const json_t *ad_doc, const json_t *dev_of, const char *var,
				const char **one)
{
	const char *first = NULL;
	json_t *n, *in;
	size_t i, k;

	*one = "";
	json_array_foreach(json_object_get(ad_doc, "nodes"), i, n) {
		const char *name = json_string_value(json_object_get(n, "name"));
		if (!name || !is_sum_of(name, var))
			continue;
		json_array_foreach(json_object_get(n, "inputs"), k, in) {
			char src[DG_GRAPH_MAX_NAME + 16];
			const char *d;
			snprintf(src, sizeof src, "%s", json_string_value(in));
			if (is_sum_of(src, var))
				continue;
			src[strcspn(src, ":")] = '\0';
			d = json_string_value(json_object_get(dev_of, src));
			if (!first)
				first = d ? d : "";
			else if (strcmp(first, d ? d : "") != 0)
				return true;
		}
	}
	*one = first ? first : "";
	return false;
}

/* node name -> its device ("" = none) for the nodes of doc. Owned. */
static json_t *devices_of(const json_t *doc)
{
	json_t *o = json_object(), *n;
	size_t i;

	json_array_foreach(json_object_get(doc, "nodes"), i, n) {
		const char *name = json_string_value(json_object_get(n, "name"));
		const char *dev = json_string_value(json_object_get(n, "device"));
		if (o && name && json_object_set_new(o, name, json_string(dev ? dev : ""))) {
			json_decref(o);
			return NULL;
		}
	}
	return o;
}

/* Where each trained Variable's gradient is summed (autodiff's chained Add
 * "grad/<var>/...", which carries the Variable's own device). Parts from
 * several devices (towers, or a variable used on several tasks): the sum is
 * colocated with the Variable, on its ps, with the ApplyGradient (whose
 * VarApply then stays on that task), so each device's part goes there once
 * and one apply follows: those go into *colocate (node -> Variable; owned,
 * NULL when none). Parts from one device: the sum runs there, beside them
 * (ad_doc's nodes get that device), and the apply with it. */
static enum dg_status place_sums(json_t *ad_doc, const struct train_plan *p, json_t **colocate,
				 struct dg_err *err)
{
	json_t *o = json_object(), *dev_of = devices_of(ad_doc), *n;
	size_t i;

	*colocate = NULL;
	if (!o || !dev_of) {
		json_decref(o);
		json_decref(dev_of);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	for (int v = 0; v < p->n_vars; v++) {
		const char *var = p->var_nodes[v], *one;
		char apply[DG_GRAPH_MAX_NAME + 16];
		bool across = sums_across_devices(ad_doc, dev_of, var, &one);
		json_array_foreach(json_object_get(ad_doc, "nodes"), i, n) {
			const char *name = json_string_value(json_object_get(n, "name"));
			if (!name || !is_sum_of(name, var))
				continue;
			if (across)
				json_object_set_new(o, name, json_string(var));
			else if (one[0])
				json_object_set_new(n, "device", json_string(one));
		}
		snprintf(apply, sizeof apply, "_train/apply/%s", var);
		if (across)
			json_object_set_new(o, apply, json_string(var));
	}
	json_decref(dev_of);
	if (json_object_size(o) > 0)
		*colocate = o;
	else
		json_decref(o);
	return DG_OK;
}

/* wait[v]: the apply of trained Variable v may run on another task than one
 * that reads it (colocated on the ps, or its gradient computed on another
 * device than a reader's), so the group waits for it (wait_for_applies). */
static enum dg_status apply_waits(const json_t *ad_doc, char *const *grads,
				  const json_t *colocate, const struct train_plan *p, bool *wait,
				  struct dg_err *err)
{
	json_t *dev_of = devices_of(ad_doc), *n, *in;
	size_t i, k;

	if (!dev_of)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int v = 0; v < p->n_vars; v++) {
		char apply[DG_GRAPH_MAX_NAME + 16], gnode[DG_GRAPH_MAX_NAME + 16];
		const char *gdev;
		snprintf(apply, sizeof apply, "_train/apply/%s", p->var_nodes[v]);
		wait[v] = colocate && json_object_get(colocate, apply);
		snprintf(gnode, sizeof gnode, "%s", grads[v]);
		gnode[strcspn(gnode, ":")] = '\0';
		gdev = json_string_value(json_object_get(dev_of, gnode));
		json_array_foreach(json_object_get(ad_doc, "nodes"), i, n) {
			const char *dev = json_string_value(json_object_get(n, "device"));
			json_array_foreach(json_object_get(n, "inputs"), k, in) {
				const char *ref = json_string_value(in);
				size_t len = strlen(p->var_nodes[v]);
				if (!ref || strncmp(ref, p->var_nodes[v], len) != 0 ||
				    (ref[len] && ref[len] != ':'))
					continue;
				if (strcmp(dev ? dev : "", gdev ? gdev : "") != 0)
					wait[v] = true;
			}
		}
	}
	json_decref(dev_of);
	return DG_OK;
}

/* The copies inside a step: the micro-batches (s->microbatches >= 2) of g,
 * then the towers (s->towers >= 2) of that. *gt (owned) is the result, *ts a
 * copy of the spec whose loss and metrics are the copies' means (borrowed
 * from mb or tw). */
static enum dg_status copies(const struct dg_graph *g, const struct train_spec *s,
			     const struct dg_cluster *c, struct train_towers *mb,
			     struct train_towers *tw, struct dg_graph **gt,
			     struct train_spec *ts, struct dg_err *err)
{
	enum dg_status st;

	*ts = *s;
	if (s->microbatches > 1) {
		if ((st = train_micro_build(g, s, mb, err)) != DG_OK)
			return st;
		if (!(*gt = dg_graph_from_json(mb->doc, master_op_find, err))) {
			dg_err_prefix(err, "the graph of %d micro-batches", s->microbatches);
			return err ? err->code : DG_EINVAL;
		}
		ts->loss = mb->loss;
		ts->metrics = mb->metrics;
	}
	if (s->towers > 1) {
		struct dg_graph *gm = *gt;
		st = train_towers_build(gm ? gm : g, ts, c, tw, err);
		dg_graph_free(gm);
		*gt = NULL;
		if (st != DG_OK)
			return st;
		if (!(*gt = dg_graph_from_json(tw->doc, master_op_find, err))) {
			dg_err_prefix(err, "the graph of %d towers", s->towers);
			return err ? err->code : DG_EINVAL;
		}
		ts->loss = tw->loss;
		ts->metrics = tw->metrics;
	}
	return DG_OK;
}

enum dg_status train_plan_build(const struct dg_graph *g, const struct train_spec *s,
				const struct dg_cluster *c, struct train_plan *out,
				struct dg_err *err)
{
	struct train_layout L = { 0 };
	struct train_towers tw = { 0 }, mb = { 0 };
	struct train_spec ts;
	struct dg_graph *gt = NULL;
	const struct dg_graph *pg = g;   /* the graph the replicas are made of */
	const struct train_spec *ps = s;
	bool *need = NULL, *wait = NULL;
	json_t *ad_doc = NULL, *colocate = NULL;
	char **grads = NULL, **rows = NULL;
	int n_grads = 0, R, K = s->towers > 1 ? s->towers : 1;
	struct dg_edge loss;
	enum dg_status st;

	memset(out, 0, sizeof *out);
	if ((st = check_refs(g, s, err)) != DG_OK || (st = train_input_copies(g, s, err)) != DG_OK)
		goto out;
	if ((K > 1 || s->microbatches > 1) &&
	    (st = copies(g, s, c, &mb, &tw, &gt, &ts, err)) != DG_OK)
		goto out;
	if (gt) {
		pg = gt;
		ps = &ts;
	}
	if ((st = train_layout_build(pg, ps, c, &L, err)) != DG_OK ||
	    (st = plan_layout(&L, out, err)) != DG_OK)
		goto out;
	R = L.replicas;
	if (!(need = calloc((size_t)pg->n_nodes + 1, sizeof *need))) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if (s->sync && s->backup >= R) {
		st = dg_err_set(err, DG_EINVAL, "training.backup is %d; it must be less than the "
				"%d replicas", s->backup, R);
		goto out;
	}
	dg_graph_ref(pg, ps->loss, &loss, NULL);
	if ((st = loss_needs(pg, loss.node, need, err)) != DG_OK)
		goto out;
	if ((st = train_input_plan(pg, need, ps, R, out, err)) != DG_OK)
		goto out;
	if (!out->queue && (st = epoch_size(pg, need, ps, R * K, &out->steps_per_epoch,
					    &out->examples_per_step, err)) != DG_OK)
		goto out;
	if (!out->queue)
		out->examples_per_step *= K;
	out->steps = s->epochs > 0 ? s->epochs * out->steps_per_epoch : s->steps;
	if ((st = trained_vars(pg, ps, need, out, &ad_doc, &grads, &rows, &n_grads, err)) != DG_OK)
		goto out;
	if ((st = place_sums(ad_doc, out, &colocate, err)) != DG_OK)
		goto out;
	if (!(wait = calloc((size_t)out->n_vars + 1, sizeof *wait))) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if ((st = apply_waits(ad_doc, grads, colocate, out, wait, err)) != DG_OK)
		goto out;
	out->rep = calloc((size_t)R, sizeof *out->rep);
	if (!out->rep) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	for (int r = 0; st == DG_OK && r < R; r++)
		st = build_replica(ps, c, &L, ad_doc, grads, rows, K > 1 ? &tw : NULL, colocate, wait,
				   out, r, err);
	if (st == DG_OK)
		st = build_eval(g, s, c, &L, out, err);
out:
	/* one slot per wrt; the kept ones were moved to the front, NULL behind */
	dg_autodiff_free_refs(grads, n_grads);
	dg_autodiff_free_refs(rows, n_grads);
	json_decref(ad_doc);
	json_decref(colocate);
	free(wait);
	free(need);
	train_layout_deinit(&L);
	dg_graph_free(gt);
	train_towers_deinit(&tw);
	train_towers_deinit(&mb);
	if (st != DG_OK)
		train_plan_deinit(out);
	return st;
}

void train_plan_deinit(struct train_plan *p)
{
	if (!p)
		return;
	for (int r = 0; p->rep && r < p->n_replicas; r++) {
		json_decref(p->rep[r].doc);
		free_strs(p->rep[r].targets, p->rep[r].n_targets);
		free_strs(p->rep[r].fetch, p->rep[r].n_fetch);
		json_decref(p->rep[r].reasons);
		json_decref(p->rep[r].colocate);
	}
	free(p->rep);
	free(p->replica_task);
	free(p->group_task);
	json_decref(p->eval_doc);
	free_strs(p->var_nodes, p->n_vars);
	free(p->queue);
	free(p->dequeue);
	free(p->feeder);
	json_decref(p->feed_doc);
	memset(p, 0, sizeof *p);
}
