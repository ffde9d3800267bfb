/* The queue-fed input of a training plan (doc/training.md, "The input
 * pipeline"): the loss reads a batch from a QueueDequeueMany of a shared
 * queue instead of its replica's ShardBatch shard. The dequeue is leased
 * (its holder: the replica), a QueueAck after the step's applies ends the
 * lease (a dropped sync update requeues it), and each step collects the
 * examples applied and requeued for the job's ledger. The feeder (the
 * QueueEnqueueMany of that queue) runs once, as its own graph. Neighbours:
 * train.c (the plan), train_build.c and train_run.c (the feeder's run). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/train.h"
#include "internal.h"
#include "train_internal.h"

/* A lease lasts this long by default: a step is much shorter, and a worker
 * lost for good has its leases released by the master before then. */
#define TRAIN_LEASE_MS 60000

static bool op_is(const struct dg_node *nd, const char *op)
{
	return strcmp(nd->op->name, op) == 0;
}

/* The feeder of Queue node q (the one QueueEnqueueMany naming it), -1 when
 * there is none; DG_EINVAL for two. */
static enum dg_status find_feeder(const struct dg_graph *g, int q, int *out, struct dg_err *err)
{
	*out = -1;
	for (int n = 0; n < g->n_nodes; n++) {
		if (!op_is(&g->nodes[n], "QueueEnqueueMany") || master_queue_of(g, n) != q)
			continue;
		if (*out >= 0) {
			dg_err_set(err, DG_EINVAL, "Queue '%s' has two feeders, '%s' and '%s'",
				   g->nodes[q].name, g->nodes[*out].name, g->nodes[n].name);
			dg_err_hint(err, "feed it from one QueueEnqueueMany (attr 'threads' runs "
				    "it in several threads)");
			return DG_EINVAL;
		}
		*out = n;
	}
	return DG_OK;
}

/* The feeder's graph: the whole graph without fetches, the feeder's epochs
 * set from the spec. Owned, or NULL. */
static json_t *feed_doc(const struct dg_graph *g, int feeder, const struct train_spec *s)
{
	json_t *doc = json_deep_copy(g->doc), *n;
	size_t i;

	if (!doc)
		return NULL;
	json_object_del(doc, "training");
	json_object_del(doc, "fetch");
	json_array_foreach(json_object_get(doc, "nodes"), i, n) {
		const char *name = json_string_value(json_object_get(n, "name"));
		json_t *a = json_object_get(n, "attrs");
		if (s->epochs > 0 && name && strcmp(name, g->nodes[feeder].name) == 0 && a &&
		    json_object_set_new(a, "epochs", json_integer(s->epochs))) {
			json_decref(doc);
			return NULL;
		}
	}
	return doc;
}

enum dg_status train_input_copies(const struct dg_graph *g, const struct train_spec *s,
				  struct dg_err *err)
{
	if (s->towers <= 1 && s->microbatches <= 1)
		return DG_OK;
	for (int n = 0; n < g->n_nodes; n++) {
		if (!op_is(&g->nodes[n], "QueueDequeueMany"))
			continue;
		dg_err_set(err, DG_EUNSUPPORTED, "training.%s with a queue-fed input ('%s') is "
			   "not supported yet", s->towers > 1 ? "towers" : "microbatches",
			   g->nodes[n].name);
		dg_err_hint(err, "use replicas (between-graph) with the queue, or ShardBatch "
			    "with towers or micro-batches");
		return DG_EUNSUPPORTED;
	}
	return DG_OK;
}

enum dg_status train_input_plan(const struct dg_graph *g, const bool *need,
				const struct train_spec *s, int R, struct train_plan *out,
				struct dg_err *err)
{
	int dq = -1, shard = -1, q, feeder;
	int64_t batch, n = 0;
	enum dg_status st;

	for (int k = 0; k < g->n_nodes; k++) {
		int v = g->order[k];
		if (!need[v])
			continue;
		if (op_is(&g->nodes[v], "ShardBatch") && shard < 0)
			shard = v;
		if (!op_is(&g->nodes[v], "QueueDequeueMany"))
			continue;
		if (dq >= 0) {
			dg_err_set(err, DG_EINVAL, "training.loss '%s' reads two queues, through "
				   "'%s' and '%s'", s->loss, g->nodes[dq].name, g->nodes[v].name);
			dg_err_hint(err, "a training step reads one QueueDequeueMany");
			return DG_EINVAL;
		}
		dq = v;
	}
	if (dq < 0)
		return DG_OK;
	if (shard >= 0) {
		dg_err_set(err, DG_EINVAL, "training.loss '%s' reads both ShardBatch '%s' and "
			   "QueueDequeueMany '%s'", s->loss, g->nodes[shard].name, g->nodes[dq].name);
		dg_err_hint(err, "batch the data one way: the queue, or static shards");
		return DG_EINVAL;
	}
	if ((q = master_queue_of(g, dq)) < 0)
		return dg_err_set(err, DG_EINVAL, "QueueDequeueMany '%s' names no Queue node",
				  g->nodes[dq].name);
	if ((st = find_feeder(g, q, &feeder, err)) != DG_OK)
		return st;
	if (s->batch > 0)
		batch = s->batch;
	else if (dg_attr_int(g->nodes[dq].attrs, "batch", NULL, &batch, err) != DG_OK)
		return DG_EINVAL;
	if (feeder >= 0) {
		const struct dg_node *fd = &g->nodes[feeder];
		const struct dg_ttype *in = &g->nodes[fd->in[0].node].out[fd->in[0].index];
		n = in->shape.ndim >= 1 && in->shape.dim[0] > 0 ? in->shape.dim[0] : 0;
	}
	if (s->epochs > 0 && feeder < 0) {
		dg_err_set(err, DG_EINVAL, "training.epochs: Queue '%s' has no QueueEnqueueMany "
			   "in the graph to feed it epoch by epoch", g->nodes[q].name);
		dg_err_hint(err, "add a feeder, or give \"steps\" and fill the queue yourself "
			    "(dg feed)");
		return DG_EINVAL;
	}
	if (s->epochs > 0 && n <= 0) {
		dg_err_set(err, DG_EINVAL, "training.epochs: the examples that feeder '%s' "
			   "enqueues are not known when the graph is built",
			   g->nodes[feeder].name);
		dg_err_hint(err, "read them with IdxReader, NpyReader or CsvReader, or give \"steps\"");
		return DG_EINVAL;
	}
	if (!(out->queue = strdup(master_queue_ps_name(&g->nodes[q]))) ||
	    !(out->dequeue = strdup(g->nodes[dq].name)) ||
	    (feeder >= 0 && !(out->feeder = strdup(g->nodes[feeder].name))) ||
	    (feeder >= 0 && !(out->feed_doc = feed_doc(g, feeder, s))))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	out->examples_per_epoch = n;
	out->examples_per_step = batch;
	/* Replicas share the examples: an epoch is the mean replica's share. */
	out->steps_per_epoch = n > 0 ? (n + batch * R - 1) / (batch * R) : 0;
	out->n_extra = 3;
	return DG_OK;
}

/* The node named name in doc's "nodes", or NULL. */
static json_t *doc_node(json_t *doc, const char *name)
{
	json_t *n;
	size_t i;

	json_array_foreach(json_object_get(doc, "nodes"), i, n) {
		const char *nm = json_string_value(json_object_get(n, "name"));
		if (nm && strcmp(nm, name) == 0)
			return n;
	}
	return NULL;
}

enum dg_status train_input_replica(const struct train_spec *s, const struct train_plan *p,
				   int r, struct train_replica *rep, struct dg_err *err)
{
	json_t *dq = doc_node(rep->doc, p->dequeue), *a, *inputs, *ack;
	const json_t *dev;
	char holder[32], lease_ref[DG_GRAPH_MAX_NAME + 16];
	int n_comp;

	if (!dq || !(a = json_object_get(dq, "attrs")))
		return dg_err_set(err, DG_EINTERNAL, "replica %d has no dequeue '%s'", r,
				  p->dequeue);
	n_comp = (int)json_array_size(json_object_get(a, "components"));
	/* The holder is made unique per job when the job starts (train_run.c). */
	snprintf(holder, sizeof holder, "r%d", r);
	if ((s->batch > 0 && json_object_set_new(a, "batch", json_integer(s->batch))) ||
	    json_object_set_new(a, "lease_ms", json_integer(TRAIN_LEASE_MS)) ||
	    /* Waiting at the queue's end for a lease to come back (a lost
	     * replica's) is not a slow step: past the step's own deadline. */
	    json_object_set_new(a, "timeout_ms", json_integer(TRAIN_LEASE_MS + 10000)) ||
	    json_object_set_new(a, "holder", json_string(holder)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	snprintf(lease_ref, sizeof lease_ref, "%s:%d", p->dequeue, n_comp);
	if (!(inputs = json_pack("[s]", lease_ref)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	/* After every apply of the step: their versions say whether each landed. */
	for (int i = 0; i < rep->n_targets; i++)
		if (strncmp(rep->targets[i], "_train/apply/", 13) == 0)
			json_array_append_new(inputs, json_string(rep->targets[i]));
	dev = json_object_get(dq, "device");
	ack = json_pack("{s:s, s:s, s:o, s:{s:s}}", "name", "_train/queue_ack", "op", "QueueAck",
			"inputs", inputs, "attrs", "queue", p->queue);
	if (!ack || (dev && json_object_set(ack, "device", (json_t *)dev)) ||
	    json_array_append_new(json_object_get(rep->doc, "nodes"), ack))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (rep->reasons)
		json_object_set_new(rep->reasons, "_train/queue_ack", json_string("colocated"));
	/* Examples applied, requeued, and the lease (its ids in the ps's log). */
	if (!(rep->fetch[rep->n_fetch] = strdup("_train/queue_ack:0")) ||
	    !(rep->fetch[rep->n_fetch + 1] = strdup("_train/queue_ack:1")) ||
	    !(rep->fetch[rep->n_fetch + 2] = strdup("_train/queue_ack:2")))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	rep->n_fetch += 3;
	return DG_OK;
}
