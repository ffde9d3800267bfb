/* Copies of a graph inside one step. In-graph replication (doc/training.md,
 * "In-graph replication"): "towers": K copies every node but the Variables K times
 * ("tower_k/<name>"), tower k on the k-th span of the replica's tasks and
 * reading shard k, all sharing the Variables; the loss becomes the mean (or
 * sum) of the towers' losses, so autodiff sums each Variable's gradient over
 * the towers, and that sum is colocated with the Variable (its ps): one apply
 * per variable per step. Micro-batches ("Pipelining"): "microbatches": M
 * copies the model M times on the same tasks, copy m reading rows m of M of
 * the step's batch, the loss their mean, so a split model's stages work on
 * different micro-batches at once and one apply follows. Pure: the plan
 * (train.c) calls it on documents. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/place.h"
#include "train_internal.h"

#define DEV_MAX 160

/* How a graph is copied: tower_k/ or micro_k/ names, the nodes all copies
 * share (Variables; for micro-batches also the data they are cut from). */
struct copier {
	const struct dg_graph *g;
	const char *fmt;                /* "tower_%d/" or "micro_%d/" */
	const bool *shared;             /* per node of g */
	bool slice_batches;             /* micro-batches: ShardBatch outputs are sliced */
};

/* Copy k's ref for a ref of g: a shared node's ref is itself (a ShardBatch's
 * output i, with slice_batches: copy k's slice "micro_k/<node>/part_i"), any
 * other node's is prefixed. Owned. */
static json_t *copy_ref(const struct copier *cp, const char *ref, int k)
{
	struct dg_edge e;
	char pre[32], buf[DG_GRAPH_MAX_NAME + 64];

	if (dg_graph_ref(cp->g, ref, &e, NULL) != DG_OK)
		return json_string(ref);
	snprintf(pre, sizeof pre, cp->fmt, k);
	if (cp->shared[e.node] && cp->slice_batches &&
	    strcmp(cp->g->nodes[e.node].op->name, "ShardBatch") == 0) {
		snprintf(buf, sizeof buf, "%s%s/part_%d", pre, cp->g->nodes[e.node].name, e.index);
		return json_string(buf);
	}
	if (cp->shared[e.node])
		return json_string(ref);
	snprintf(buf, sizeof buf, "%s%s", pre, ref);
	return json_string(buf);
}

/* The position of job/task among the compute tasks, or -1. */
static int position(const struct dg_cluster *c, const int *compute, int n_compute,
		    const char *job, int task)
{
	for (int p = 0; p < n_compute; p++)
		if (strcmp(c->tasks[compute[p]].job, job) == 0 && c->tasks[compute[p]].index == task)
			return p;
	return -1;
}

/* The device of node n in tower k: compute task k*span + p for a device
 * naming compute position p, k*span for none or the job alone (*dflt), a
 * /gpu:K or /cpu:0 segment kept. A device placement must judge (a ps task,
 * another job, a task the cluster lacks, not a device name) stays as it is. */
static void tower_device(const struct dg_graph *g, int n, const struct dg_cluster *c,
			 const int *compute, int n_compute, int span, int k, char *dev,
			 size_t len, bool *dflt)
{
	static const char *const segs[] = { "/gpu:", "/device:GPU:", "/cpu:", "/device:CPU:" };
	const char *orig = g->nodes[n].device, *job = NULL, *seg = NULL;
	int first = compute[k * span], task = -1, p = 0;
	char buf[DEV_MAX];

	*dflt = true;
	for (size_t i = 0; orig && !seg && i < sizeof segs / sizeof *segs; i++)
		seg = strstr(orig, segs[i]);
	if (orig && orig[0] && !place_device_task(orig, buf, sizeof buf, &job, &task)) {
		snprintf(dev, len, "%s", orig);
		*dflt = false;
		return;
	}
	if (job && !(task < 0 && strcmp(job, c->tasks[first].job) == 0)) {
		*dflt = false;
		p = task >= 0 ? position(c, compute, n_compute, job, task) : -1;
		if (p < 0) {
			snprintf(dev, len, "%s", orig);
			return;
		}
	}
	place_device_name(c, compute[k * span + p], dev, len);
	if (seg)
		snprintf(dev + strlen(dev), len - strlen(dev), "%.*s",
			 (int)(strcspn(seg + 1, "/") + 1), seg);
}

/* Tower k's copy of node n (owned), or NULL when out of memory. */
static json_t *tower_node(const struct copier *cp, int n, const struct dg_cluster *c,
			  const int *compute, int n_compute, int span, int k, int K,
			  json_t *reasons)
{
	const struct dg_graph *g = cp->g;
	const struct dg_node *nd = &g->nodes[n];
	json_t *src = json_array_get(json_object_get(g->doc, "nodes"), (size_t)n);
	json_t *node = json_deep_copy(src), *ins = json_array(), *in;
	char name[DG_GRAPH_MAX_NAME + 32], dev[DEV_MAX];
	bool dflt;
	size_t i;

	if (!node || !ins)
		goto fail;
	snprintf(name, sizeof name, "tower_%d/%s", k, nd->name);
	json_array_foreach(json_object_get(src, "inputs"), i, in)
		if (json_array_append_new(ins, copy_ref(cp, json_string_value(in), k)))
			goto fail;
	tower_device(g, n, c, compute, n_compute, span, k, dev, sizeof dev, &dflt);
	if (json_object_set_new(node, "name", json_string(name)) ||
	    json_object_set_new(node, "inputs", ins) ||
	    json_object_set_new(node, "device", json_string(dev)))
		goto fail_node;
	if (dflt && json_object_set_new(reasons, name, json_string("replica default")))
		goto fail_node;
	if (strcmp(nd->op->name, "ShardBatch") == 0) {
		json_t *a = json_object_get(node, "attrs");
		if (!a && json_object_set_new(node, "attrs", a = json_object()))
			goto fail_node;
		/* the plan makes it shard r*K + k of R*K (train.c, shard_batches) */
		if (json_object_set_new(a, "shard", json_integer(k)) ||
		    json_object_set_new(a, "num_shards", json_integer(K)))
			goto fail_node;
	}
	return node;
fail:
	json_decref(ins);
fail_node:
	json_decref(node);
	return NULL;
}

/* The "_train/<what>" node (appended to nodes): the mean (or sum) over the
 * K copies of ref, with the device of copy 0's node. Its name in out. */
static enum dg_status combine(const struct copier *cp, json_t *nodes, const char *what,
			      const char *ref, int K, bool mean, char *out, size_t len,
			      struct dg_err *err)
{
	struct dg_edge e;
	char prev[DG_GRAPH_MAX_NAME + 64], name[DG_GRAPH_MAX_NAME + 64], node0[DG_GRAPH_MAX_NAME + 64];
	json_t *r0 = copy_ref(cp, ref, 0), *n, *dev = NULL;
	size_t i;

	dg_graph_ref(cp->g, ref, &e, NULL);
	snprintf(prev, sizeof prev, "%s", json_string_value(r0));
	json_decref(r0);
	snprintf(node0, sizeof node0, "%s", prev);
	node0[strcspn(node0, ":")] = '\0';
	json_array_foreach(nodes, i, n)
		if (strcmp(json_string_value(json_object_get(n, "name")), node0) == 0)
			dev = json_object_get(n, "device");
	for (int k = 1; k < K; k++) {
		json_t *rk = copy_ref(cp, ref, k);
		snprintf(name, sizeof name, "_train/%s/sum_%d", what, k);
		if (!rk || json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s,s], s:O?}", "name",
								  name, "op", "Add", "inputs",
								  prev, json_string_value(rk),
								  "device", dev))) {
			json_decref(rk);
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		}
		json_decref(rk);
		snprintf(prev, sizeof prev, "%s", name);
	}
	snprintf(out, len, "_train/%s", what);
	if (!mean)
		return json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s], s:O?}", "name", out,
							      "op", "Identity", "inputs", prev,
							      "device", dev)) ?
		       dg_err_set(err, DG_ENOMEM, "out of memory") : DG_OK;
	snprintf(name, sizeof name, "_train/%s/scale", what);
	if (json_array_append_new(nodes, json_pack("{s:s, s:s, s:{s:f, s:s}, s:O?}", "name", name,
						   "op", "Const", "attrs", "value", 1.0 / K,
						   "dtype",
						   dg_dtype_name(cp->g->nodes[e.node].out[e.index].dtype),
						   "device", dev)) ||
	    json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s,s], s:O?}", "name", out, "op",
						   "Mul", "inputs", prev, name, "device", dev)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

/* The loss and the metrics over the copies (combine), into out. */
static enum dg_status combine_all(const struct copier *cp, const struct train_spec *s, int K,
				  bool mean, json_t *nodes, struct train_towers *out,
				  struct dg_err *err)
{
	char ref[DG_GRAPH_MAX_NAME + 64];
	enum dg_status st = combine(cp, nodes, "loss", s->loss, K, mean, ref, sizeof ref, err);

	if (st == DG_OK && !(out->loss = strdup(ref)))
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; st == DG_OK && i < s->n_metrics; i++) {
		char what[32];
		snprintf(what, sizeof what, "metric_%d", i);
		st = combine(cp, nodes, what, s->metrics[i], K, true, ref, sizeof ref, err);
		if (st == DG_OK && !(out->metrics[i] = strdup(ref)))
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
		out->n_metrics = i + 1;
	}
	return st;
}

/* An empty result with room for the metrics. */
static enum dg_status result_init(const struct train_spec *s, struct train_towers *out,
				  struct dg_err *err)
{
	out->doc = json_pack("{s:i, s:[]}", "version", 1, "nodes");
	out->reasons = json_object();
	out->metrics = calloc((size_t)s->n_metrics + 1, sizeof *out->metrics);
	if (!out->doc || !out->reasons || !out->metrics)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

enum dg_status train_towers_build(const struct dg_graph *g, const struct train_spec *s,
				  const struct dg_cluster *c, struct train_towers *out,
				  struct dg_err *err)
{
	struct train_layout one;
	int K = s->towers, span;
	bool *shared = calloc((size_t)g->n_nodes + 1, sizeof *shared);
	struct copier cp = { .g = g, .fmt = "tower_%d/", .shared = shared };
	json_t *nodes;
	enum dg_status st;

	memset(out, 0, sizeof *out);
	if (!shared)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if ((st = train_layout_span(g, c, &one, &span, err)) != DG_OK)
		goto out;
	if ((int64_t)K * span > one.n_compute) {
		st = dg_err_set(err, DG_EINVAL, "training.towers is %d (of %d task%s each) but the "
				"cluster has %d compute task%s", K, span, span == 1 ? "" : "s",
				one.n_compute, one.n_compute == 1 ? "" : "s");
		dg_err_hint(err, "use at most %d towers, or start more workers",
			    one.n_compute / span);
		goto out;
	}
	if ((st = result_init(s, out, err)) != DG_OK)
		goto out;
	nodes = json_object_get(out->doc, "nodes");
	for (int n = 0; n < g->n_nodes; n++)
		shared[n] = g->nodes[n].op == place_variable_op();
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++) {
		json_t *src = json_array_get(json_object_get(g->doc, "nodes"), (size_t)n);
		if (shared[n]) {
			if (json_array_append(nodes, src))
				st = dg_err_set(err, DG_ENOMEM, "out of memory");
			continue;
		}
		for (int k = 0; st == DG_OK && k < K; k++) {
			json_t *t = tower_node(&cp, n, c, one.compute, one.n_compute, span, k, K,
					       out->reasons);
			if (!t || json_array_append_new(nodes, t))
				st = dg_err_set(err, DG_ENOMEM, "out of memory");
		}
	}
	if (st == DG_OK)
		st = combine_all(&cp, s, K, !s->tower_sum, nodes, out, err);
out:
	free(shared);
	train_layout_deinit(&one);
	if (st != DG_OK)
		train_towers_deinit(out);
	return st;
}

/* ------------------------------------------------------------ micro-batches */

/* shared[n]: a Variable, a ShardBatch or what a ShardBatch reads (the data
 * pipeline runs once per step; the micro-batches slice its batch). */
static void mark_shared_data(const struct dg_graph *g, bool *shared)
{
	for (int i = g->n_nodes - 1; i >= 0; i--) {
		int n = g->order[i];
		const struct dg_node *nd = &g->nodes[n];
		if (nd->op == place_variable_op() || strcmp(nd->op->name, "ShardBatch") == 0)
			shared[n] = true;
		if (shared[n] && nd->op != place_variable_op())
			for (int k = 0; k < nd->n_in; k++)
				shared[nd->in[k].node] = true;
	}
}

/* The batch of ShardBatch n (the spec's when given). */
static enum dg_status batch_of(const struct dg_graph *g, int n, const struct train_spec *s,
			       int64_t *batch, struct dg_err *err)
{
	if (s->batch > 0) {
		*batch = s->batch;
		return DG_OK;
	}
	return dg_attr_int(g->nodes[n].attrs, "batch", NULL, batch, err);
}

/* Micro-batch m's slices of ShardBatch n's outputs: "micro_m/<n>/part_i",
 * rows m*mb .. m*mb+mb-1, on the ShardBatch's device. */
static enum dg_status slices(const struct dg_graph *g, int n, int m, int64_t mb,
			     json_t *nodes, struct dg_err *err)
{
	const struct dg_node *nd = &g->nodes[n];

	for (int i = 0; i < nd->n_out; i++) {
		int nd_rank = nd->out[i].shape.ndim;
		char name[DG_GRAPH_MAX_NAME + 64], in[DG_GRAPH_MAX_NAME + 16];
		json_t *begin = json_array(), *size = json_array();
		if (!begin || !size) {
			json_decref(begin);
			json_decref(size);
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		}
		for (int d = 0; d < nd_rank; d++) {
			json_array_append_new(begin, json_integer(d == 0 ? m * mb : 0));
			json_array_append_new(size, json_integer(d == 0 ? mb : -1));
		}
		snprintf(name, sizeof name, "micro_%d/%s/part_%d", m, nd->name, i);
		snprintf(in, sizeof in, "%s:%d", nd->name, i);
		if (json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s], s:{s:o, s:o}, s:s?}",
							   "name", name, "op", "Slice", "inputs",
							   in, "attrs", "begin", begin, "size",
							   size, "device", nd->device)))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	return DG_OK;
}

/* Check that every ShardBatch the copies read can be cut into M slices of
 * known rank; *mb gets the micro-batch of the first. */
static enum dg_status micro_size(const struct dg_graph *g, const struct train_spec *s,
				 int64_t *mb, struct dg_err *err)
{
	int M = s->microbatches;

	*mb = 0;
	for (int n = 0; n < g->n_nodes; n++) {
		const struct dg_node *nd = &g->nodes[n];
		int64_t batch;
		if (strcmp(nd->op->name, "ShardBatch") != 0)
			continue;
		if (batch_of(g, n, s, &batch, err) != DG_OK)
			return DG_EINVAL;
		if (batch % M != 0) {
			dg_err_set(err, DG_EINVAL, "training.microbatches is %d but ShardBatch '%s' "
				   "makes batches of %lld: the micro-batches must divide it", M,
				   nd->name, (long long)batch);
			dg_err_hint(err, "use a divisor of the batch, or change training.batch");
			return DG_EINVAL;
		}
		for (int i = 0; i < nd->n_out; i++)
			if (nd->out[i].shape.ndim < 1)
				return dg_err_set(err, DG_EINVAL, "training.microbatches: the rank of "
						  "ShardBatch '%s' output %d is not known when the "
						  "graph is built", nd->name, i);
		if (*mb == 0)
			*mb = batch / M;
	}
	if (*mb == 0) {
		dg_err_set(err, DG_EINVAL, "training.microbatches needs a ShardBatch to cut into "
			   "micro-batches");
		dg_err_hint(err, "batch the data with ShardBatch");
		return DG_EINVAL;
	}
	return DG_OK;
}

/* Micro-batch m's copy of node n (appended), on n's own device. */
static enum dg_status micro_node(const struct copier *cp, int n, int m, json_t *nodes,
				 struct dg_err *err)
{
	json_t *src = json_array_get(json_object_get(cp->g->doc, "nodes"), (size_t)n);
	json_t *node = json_deep_copy(src), *ins = json_array(), *in;
	char name[DG_GRAPH_MAX_NAME + 32];
	size_t i;

	if (!node || !ins)
		goto fail;
	snprintf(name, sizeof name, "micro_%d/%s", m, cp->g->nodes[n].name);
	json_array_foreach(json_object_get(src, "inputs"), i, in)
		if (json_array_append_new(ins, copy_ref(cp, json_string_value(in), m)))
			goto fail;
	if (json_object_set_new(node, "inputs", ins)) {
		ins = NULL;
		goto fail;
	}
	ins = NULL;
	if (json_object_set_new(node, "name", json_string(name)) ||
	    json_array_append_new(nodes, node))
		goto fail;
	return DG_OK;
fail:
	json_decref(ins);
	json_decref(node);
	return dg_err_set(err, DG_ENOMEM, "out of memory");
}

enum dg_status train_micro_build(const struct dg_graph *g, const struct train_spec *s,
				 struct train_towers *out, struct dg_err *err)
{
	int M = s->microbatches;
	bool *shared = calloc((size_t)g->n_nodes + 1, sizeof *shared);
	struct copier cp = { .g = g, .fmt = "micro_%d/", .shared = shared, .slice_batches = true };
	int64_t mb;
	json_t *nodes, *src = json_object_get(g->doc, "nodes");
	enum dg_status st;

	memset(out, 0, sizeof *out);
	if (!shared)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if ((st = micro_size(g, s, &mb, err)) != DG_OK || (st = result_init(s, out, err)) != DG_OK)
		goto out;
	mark_shared_data(g, shared);
	nodes = json_object_get(out->doc, "nodes");
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++) {
		json_t *copy;
		if (!shared[n])
			continue;
		/* the slices are cut from the batch the plan will give it */
		copy = json_deep_copy(json_array_get(src, (size_t)n));
		if (copy && s->batch > 0 && strcmp(g->nodes[n].op->name, "ShardBatch") == 0 &&
		    json_object_set_new(json_object_get(copy, "attrs"), "batch",
					json_integer(s->batch))) {
			json_decref(copy);
			copy = NULL;
		}
		if (!copy || json_array_append_new(nodes, copy))
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	/* Micro-batch by micro-batch: the executor runs ready nodes in file
	 * order, so a stage finishes micro-batch m (and sends it on) before it
	 * starts m + 1, and the next stage works on m meanwhile (GPipe). */
	for (int m = 0; st == DG_OK && m < M; m++) {
		for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
			if (strcmp(g->nodes[n].op->name, "ShardBatch") == 0)
				st = slices(g, n, m, mb, nodes, err);
		for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
			if (!shared[n])
				st = micro_node(&cp, n, m, nodes, err);
	}
	if (st == DG_OK)
		st = combine_all(&cp, s, M, true, nodes, out, err);
out:
	free(shared);
	if (st != DG_OK)
		train_towers_deinit(out);
	return st;
}

void train_towers_deinit(struct train_towers *t)
{
	if (!t)
		return;
	json_decref(t->doc);
	json_decref(t->reasons);
	free(t->loss);
	for (int i = 0; t->metrics && i < t->n_metrics; i++)
		free(t->metrics[i]);
	free(t->metrics);
	memset(t, 0, sizeof *t);
}
