/* In-graph replication from a single-tower graph (doc/training.md, "In-graph
 * replication"): "towers": K copies every node but the Variables K times
 * ("tower_k/<name>"), tower k on the k-th span of the replica's tasks and
 * reading shard k, all sharing the Variables; the loss becomes the mean (or
 * sum) of the towers' losses, so autodiff sums each Variable's gradient over
 * the towers, and that sum is colocated with the Variable (its ps): one apply
 * per variable per step. Pure: the plan (train.c) calls it on documents. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/place.h"
#include "train_internal.h"

#define DEV_MAX 160

/* "tower_k/<node>[:i]" for a ref of a node that is not a Variable of g, else
 * the ref itself. */
static json_t *tower_ref(const struct dg_graph *g, const char *ref, int k)
{
	struct dg_edge e;
	char buf[DG_GRAPH_MAX_NAME + 32];

	if (dg_graph_ref(g, ref, &e, NULL) != DG_OK || g->nodes[e.node].op == place_variable_op())
		return json_string(ref);
	snprintf(buf, sizeof buf, "tower_%d/%s", k, ref);
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
static json_t *tower_node(const struct dg_graph *g, int n, const struct dg_cluster *c,
			  const int *compute, int n_compute, int span, int k, int K,
			  json_t *reasons)
{
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
		if (json_array_append_new(ins, tower_ref(g, json_string_value(in), k)))
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

/* The "_train/<what>" node (owned in *nodes): the mean (or sum) over the
 * towers of ref, on tower 0's first task. Its name in out. */
static enum dg_status combine(const struct dg_graph *g, json_t *nodes, const char *what,
			      const char *ref, int K, bool mean, char *out, size_t len,
			      struct dg_err *err)
{
	struct dg_edge e;
	char prev[DG_GRAPH_MAX_NAME + 48], name[DG_GRAPH_MAX_NAME + 48];
	json_t *r0 = tower_ref(g, ref, 0);

	dg_graph_ref(g, ref, &e, NULL);
	snprintf(prev, sizeof prev, "%s", json_string_value(r0));
	json_decref(r0);
	for (int k = 1; k < K; k++) {
		json_t *rk = tower_ref(g, ref, k);
		snprintf(name, sizeof name, "_train/%s/sum_%d", what, k);
		if (!rk || json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s,s]}", "name",
								  name, "op", "Add", "inputs",
								  prev, json_string_value(rk)))) {
			json_decref(rk);
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		}
		json_decref(rk);
		snprintf(prev, sizeof prev, "%s", name);
	}
	snprintf(out, len, "_train/%s", what);
	if (!mean)
		return json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s]}", "name", out, "op",
							      "Identity", "inputs", prev)) ?
		       dg_err_set(err, DG_ENOMEM, "out of memory") : DG_OK;
	snprintf(name, sizeof name, "_train/%s/scale", what);
	if (json_array_append_new(nodes, json_pack("{s:s, s:s, s:{s:f, s:s}}", "name", name, "op",
						   "Const", "attrs", "value", 1.0 / K, "dtype",
						   dg_dtype_name(g->nodes[e.node].out[e.index].dtype))) ||
	    json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s,s]}", "name", out, "op", "Mul",
						   "inputs", prev, name)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

enum dg_status train_towers_build(const struct dg_graph *g, const struct train_spec *s,
				  const struct dg_cluster *c, struct train_towers *out,
				  struct dg_err *err)
{
	struct train_layout one;
	int K = s->towers, span;
	json_t *nodes;
	char ref[DG_GRAPH_MAX_NAME + 48];
	enum dg_status st;

	memset(out, 0, sizeof *out);
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
	out->doc = json_pack("{s:i, s:[]}", "version", 1, "nodes");
	out->reasons = json_object();
	out->metrics = calloc((size_t)s->n_metrics + 1, sizeof *out->metrics);
	if (!out->doc || !out->reasons || !out->metrics) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	nodes = json_object_get(out->doc, "nodes");
	for (int n = 0; n < g->n_nodes; n++) {
		json_t *src = json_array_get(json_object_get(g->doc, "nodes"), (size_t)n);
		if (g->nodes[n].op == place_variable_op()) {
			if (json_array_append(nodes, src))
				st = dg_err_set(err, DG_ENOMEM, "out of memory");
			continue;
		}
		for (int k = 0; st == DG_OK && k < K; k++) {
			json_t *t = tower_node(g, n, c, one.compute, one.n_compute, span, k, K,
					       out->reasons);
			if (!t || json_array_append_new(nodes, t))
				st = dg_err_set(err, DG_ENOMEM, "out of memory");
		}
	}
	if (st == DG_OK)
		st = combine(g, nodes, "loss", s->loss, K, !s->tower_sum, ref, sizeof ref, err);
	if (st == DG_OK && !(out->loss = strdup(ref)))
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; st == DG_OK && i < s->n_metrics; i++) {
		char what[32];
		snprintf(what, sizeof what, "metric_%d", i);
		st = combine(g, nodes, what, s->metrics[i], K, true, ref, sizeof ref, err);
		if (st == DG_OK && !(out->metrics[i] = strdup(ref)))
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
		out->n_metrics = i + 1;
	}
out:
	train_layout_deinit(&one);
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
