/* Where the nodes of a training graph run (doc/training.md, "Devices and
 * replica groups"): the compute tasks split into groups of G, one group per
 * replica; replica 0 runs where the graph's devices say, replica r is the
 * same layout shifted by r groups (TensorFlow's replica_device_setter, which
 * builds each worker's graph with its own task, written once); a node without
 * a device goes to the first task of its replica's group. Pure: the plan
 * (train.c) calls it on jansson documents. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/place.h"
#include "train_internal.h"

#define DEV_MAX 160

/* The position in L->compute of the task job/task names, or -1. */
static int compute_position(const struct train_layout *L, const struct dg_cluster *c,
			    const char *job, int task)
{
	for (int k = 0; k < L->n_compute; k++) {
		const struct dg_task_addr *t = &c->tasks[L->compute[k]];
		if (strcmp(t->job, job) == 0 && t->index == task)
			return k;
	}
	return -1;
}

/* feed[n]: node n is a queue's feeder (QueueEnqueueMany) or is read only by
 * feeders: it runs once, on the feeder's own task, not in a replica, so its
 * device says nothing of the replicas' layout. false when out of memory. */
static bool feeder_nodes(const struct dg_graph *g, bool *feed)
{
	int *uses = calloc((size_t)g->n_nodes + 1, sizeof *uses);
	int *fed = calloc((size_t)g->n_nodes + 1, sizeof *fed);

	if (!uses || !fed) {
		free(uses);
		free(fed);
		return false;
	}
	for (int m = 0; m < g->n_nodes; m++)
		for (int i = 0; i < g->nodes[m].n_in; i++)
			uses[g->nodes[m].in[i].node]++;
	/* Consumers before producers: each node's readers are decided first. */
	for (int k = g->n_nodes - 1; k >= 0; k--) {
		int n = g->order[k];
		feed[n] = strcmp(g->nodes[n].op->name, "QueueEnqueueMany") == 0 ||
			  (uses[n] > 0 && fed[n] == uses[n]);
		for (int i = 0; feed[n] && i < g->nodes[n].n_in; i++)
			fed[g->nodes[n].in[i].node]++;
	}
	free(uses);
	free(fed);
	return true;
}

/* The highest compute position a node's device names (-1: none), with the
 * node that names it; a feeder's nodes do not count. A device that is not a
 * device name, or names a task the cluster lacks, is left to placement,
 * which names the node. */
static int highest_position(const struct dg_graph *g, const struct train_layout *L,
			    const struct dg_cluster *c, int *node)
{
	bool *feed = calloc((size_t)g->n_nodes + 1, sizeof *feed);
	int hi = -1;

	if (feed && !feeder_nodes(g, feed)) {
		free(feed);
		feed = NULL;
	}
	for (int n = 0; n < g->n_nodes; n++) {
		char buf[DEV_MAX];
		const char *job;
		int task, p;
		if ((feed && feed[n]) || !g->nodes[n].device ||
		    !place_device_task(g->nodes[n].device, buf, sizeof buf, &job, &task) ||
		    !job || task < 0 || (p = compute_position(L, c, job, task)) <= hi)
			continue;
		hi = p;
		*node = n;
	}
	free(feed);
	return hi;
}

enum dg_status train_layout_span(const struct dg_graph *g, const struct dg_cluster *c,
				 struct train_layout *L, int *span, struct dg_err *err)
{
	int node = -1;

	memset(L, 0, sizeof *L);
	if (!(L->compute = calloc((size_t)c->n_tasks + 1, sizeof *L->compute)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	L->n_compute = train_compute_tasks(c, L->compute);
	if (L->n_compute == 0) {
		dg_err_set(err, DG_EINVAL, "training: the cluster has no compute task (only job "
			   "\"ps\")");
		dg_err_hint(err, "add a worker job to the cluster spec");
		return DG_EINVAL;
	}
	*span = highest_position(g, L, c, &node) + 1;
	if (*span < 1)
		*span = 1;
	return DG_OK;
}

enum dg_status train_layout_build(const struct dg_graph *g, const struct train_spec *s,
				  const struct dg_cluster *c, struct train_layout *L,
				  struct dg_err *err)
{
	int hi, node = -1, span;
	enum dg_status st = train_layout_span(g, c, L, &span, err);

	if (st != DG_OK)
		return st;
	hi = highest_position(g, L, c, &node);
	L->group = s->replica_group > 0 ? s->replica_group : hi + 1 > 1 ? hi + 1 : 1;
	if (hi >= L->group) {
		dg_err_set(err, DG_EINVAL, "node '%s' is placed on %s, compute task %d of the "
			   "cluster, but training.replica_group is %d: a replica's nodes may name "
			   "compute tasks 0..%d", g->nodes[node].name, g->nodes[node].device, hi,
			   L->group, L->group - 1);
		dg_err_hint(err, "raise replica_group, or place the node within the first group");
		return DG_EINVAL;
	}
	if (L->group > L->n_compute) {
		dg_err_set(err, DG_EINVAL, "training.replica_group is %d but the cluster has %d "
			   "compute task%s", L->group, L->n_compute, L->n_compute == 1 ? "" : "s");
		dg_err_hint(err, "start more workers, or use a smaller group");
		return DG_EINVAL;
	}
	if (s->replicas > 0) {
		L->replicas = s->replicas;
	} else if (L->n_compute % L->group != 0) {
		dg_err_set(err, DG_EINVAL, "the %d compute tasks do not divide into replica groups "
			   "of %d (%s)", L->n_compute, L->group, s->replica_group > 0 ?
			   "training.replica_group" : "the tasks the graph's devices name");
		dg_err_hint(err, "run a multiple of %d workers, or give \"replicas\" to leave "
			    "the rest idle", L->group);
		return DG_EINVAL;
	} else {
		L->replicas = L->n_compute / L->group;
	}
	if ((int64_t)L->replicas * L->group > L->n_compute) {
		if (L->group == 1)
			dg_err_set(err, DG_EINVAL, "training.replicas is %d but the cluster has "
				   "%d compute task%s", L->replicas, L->n_compute,
				   L->n_compute == 1 ? "" : "s");
		else
			dg_err_set(err, DG_EINVAL, "training.replicas is %d in groups of %d: "
				   "that needs %d compute tasks, the cluster has %d", L->replicas,
				   L->group, L->replicas * L->group, L->n_compute);
		dg_err_hint(err, "use at most %d replicas, or 0 for as many as fit",
			    L->n_compute / L->group);
		return DG_EINVAL;
	}
	return DG_OK;
}

void train_layout_deinit(struct train_layout *L)
{
	if (!L)
		return;
	free(L->compute);
	memset(L, 0, sizeof *L);
}

int train_layout_task(const struct train_layout *L, int r, int k)
{
	return L->compute[r * L->group + k];
}

/* "/job:J/task:I" of task t plus the device segment ("/gpu:K",
 * "/device:GPU:K", "/cpu:0", "/device:CPU:0") of orig, if any. */
static void device_on(const struct dg_cluster *c, int t, const char *orig, char *buf, size_t n)
{
	static const char *const segs[] = { "/gpu:", "/device:GPU:", "/cpu:", "/device:CPU:" };
	const char *g = NULL;

	for (size_t i = 0; orig && !g && i < sizeof segs / sizeof *segs; i++)
		g = strstr(orig, segs[i]);
	place_device_name(c, t, buf, n);
	if (g) {
		size_t len = strcspn(g + 1, "/") + 1, used = strlen(buf);
		if (used + len < n) {
			memcpy(buf + used, g, len);
			buf[used + len] = '\0';
		}
	}
}

/* Node n's device in replica r, into dev; *why: the reason placement should
 * show (NULL: "explicit", as placement says; or the device is kept as it is). */
static bool replica_device(const struct train_layout *L, const struct dg_cluster *c, int r,
			   const char *name, const char *orig, char *dev, size_t n,
			   const char **why)
{
	char buf[DEV_MAX];
	const char *job;
	int task, p;

	*why = NULL;
	if (orig && orig[0] && !place_device_task(orig, buf, sizeof buf, &job, &task))
		return false;       /* not a device name: placement says so */
	if (!orig || !orig[0] || !job) {
		device_on(c, train_layout_task(L, r, 0), orig, dev, n);
		*why = "replica default";
		return true;
	}
	if (task < 0 && strcmp(c->tasks[train_layout_task(L, r, 0)].job, job) == 0) {
		/* "/job:worker": the replica's task of that job, as the setter merges */
		device_on(c, train_layout_task(L, r, 0), orig, dev, n);
		*why = "replica default";
		return true;
	}
	if (task < 0 || (p = compute_position(L, c, job, task)) < 0)
		return false;       /* another job, a ps task, or a task not in the cluster */
	device_on(c, train_layout_task(L, r, p), orig, dev, n);
	if (strncmp(name, "grad/", 5) == 0)
		*why = "colocated";     /* with the forward op it differentiates */
	return true;
}

enum dg_status train_pin(json_t *doc, const struct train_layout *L, const struct dg_cluster *c,
			 int r, const json_t *skip, json_t *reasons, struct dg_err *err)
{
	json_t *n;
	size_t i;

	json_array_foreach(json_object_get(doc, "nodes"), i, n) {
		const char *op = json_string_value(json_object_get(n, "op"));
		const char *name = json_string_value(json_object_get(n, "name"));
		const char *why;
		char dev[DEV_MAX];
		if (!op || !name || strcmp(op, "Variable") == 0 || strcmp(op, "ApplyGradient") == 0 ||
		    strcmp(op, "Queue") == 0 || (skip && json_object_get(skip, name)))
			continue;
		if (!replica_device(L, c, r, name, json_string_value(json_object_get(n, "device")),
				    dev, sizeof dev, &why))
			continue;
		if (json_object_set_new(n, "device", json_string(dev)) ||
		    (why && reasons && json_object_set_new(reasons, name, json_string(why))))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	return DG_OK;
}
