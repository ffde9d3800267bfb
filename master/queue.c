/* Queues in submitted graphs (doc/training.md, "The input pipeline"): the
 * Queue op that declares a shared queue (held by a ps task, like a
 * Variable), the pass that gives each queue op the components of the Queue
 * its attr "queue" names, and the questions placement, partitioning and the
 * training plan ask about them. The queue ops themselves are the worker's
 * (worker/queue_ops.c). Neighbours: ops.c (the other master ops), place.c,
 * partition.c, train.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/client.h"
#include "dg/kernels.h"
#include "dg/log.h"
#include "internal.h"

static const struct dg_attr_spec queue_attrs[] = {
	{ "capacity", DG_ATTR_INT, true, "examples it holds at most" },
	{ "min_after_dequeue", DG_ATTR_INT, false, "examples a dequeue leaves queued until "
	  "the queue closes (default 0)" },
	{ "shuffle", DG_ATTR_BOOL, false, "dequeue uniformly at random (RandomShuffleQueue; "
	  "default false)" },
	{ "seed", DG_ATTR_INT, false, "seed of the shuffle (default 0)" },
	{ "components", DG_ATTR_JSON, true, "[{\"dtype\", \"shape\"}] of one example" },
	{ "ids", DG_ATTR_INT, false, "the component holding each example's id (an int64 or "
	  "int32 scalar)" },
	{ "shared_name", DG_ATTR_STRING, false, "the queue's name on its ps (default: the "
	  "node's; Python gives a session's own queues a name of their own)" },
	{ NULL, 0, false, NULL },
};

/* The node's attrs are a queue's settings (doc/http-api.md): one rule; and
 * shared_name a name a queue can have. */
static enum dg_status queue_infer(struct dg_infer_ctx *c)
{
	struct dg_queue_spec s;
	const char *shared = json_string_value(json_object_get(c->attrs, "shared_name"));
	enum dg_status st;

	if (shared && (st = dg_var_name_check(shared, c->err)) != DG_OK) {
		dg_err_prefix(c->err, "attr 'shared_name'");
		return st;
	}
	/* shared_name is the node's, not the queue settings' */
	json_t *a = json_deep_copy(c->attrs);
	if (!a)
		return dg_err_set(c->err, DG_ENOMEM, "out of memory");
	json_object_del(a, "shared_name");
	st = dg_queue_spec_from_json(a, &s, c->err);
	json_decref(a);
	return st;
}

static const struct dg_op_def queue_def = {
	.name = "Queue",
	.min_inputs = 0,
	.max_inputs = 0,
	.n_outputs = 0,
	.attrs = queue_attrs,
	.infer = queue_infer,
	.flags = DG_OPF_SOURCE | DG_OPF_STATEFUL,
	.doc = "a shared queue of examples held by a ps task (RandomShuffleQueue); queue ops "
	       "name it in attr 'queue' (dg submit only)",
};

const struct dg_op_def *master_queue_op(void)
{
	return &queue_def;
}

bool master_is_queue(const struct dg_node *n)
{
	return n->op == &queue_def;
}

const char *master_queue_ps_name(const struct dg_node *qn)
{
	const char *shared = json_string_value(json_object_get(qn->attrs, "shared_name"));

	return shared ? shared : qn->name;
}

bool master_is_queue_op(const struct dg_node *n)
{
	const char *name = n->op->name;

	return (dg_op_layer_of(n->op) & DG_OPL_WORKER) && strncmp(name, "Queue", 5) == 0 &&
	       !master_is_queue(n);
}

int master_queue_of(const struct dg_graph *g, int n)
{
	const char *q = json_string_value(json_object_get(g->nodes[n].attrs, "queue"));
	int k = q ? dg_graph_find(g, q) : -1;

	return k >= 0 && master_is_queue(&g->nodes[k]) ? k : -1;
}

int64_t master_queue_bytes(const struct dg_node *n)
{
	struct dg_queue_spec s;
	int64_t per = 0, numel;

	if (dg_queue_spec_from_json(n->attrs, &s, NULL) != DG_OK)
		return 0;
	for (int i = 0; i < s.n_components; i++)
		if (dg_shape_numel(&s.shape[i], &numel, NULL) == DG_OK)
			per += numel * (int64_t)dg_dtype_size(s.dtype[i]);
	return per > 0 && s.capacity > INT64_MAX / per ? INT64_MAX : s.capacity * per;
}

/* ------------------------------------------------------ the expand pass */

/* A node's op name, or "". */
static const char *op_of(const json_t *node)
{
	const char *op = json_string_value(json_object_get(node, "op"));

	return op ? op : "";
}

static bool names_queue_op(const char *op)
{
	return strcmp(op, "QueueDequeueMany") == 0 || strcmp(op, "QueueEnqueueMany") == 0 ||
	       strcmp(op, "QueueAck") == 0 || strcmp(op, "QueueClose") == 0 ||
	       strcmp(op, "QueueSize") == 0;
}

/* The Queue node named name in nodes, or NULL. */
static const json_t *find_queue(const json_t *nodes, const char *name)
{
	size_t i;
	json_t *n;

	json_array_foreach(nodes, i, n) {
		const char *nm = json_string_value(json_object_get(n, "name"));
		if (nm && strcmp(nm, name) == 0)
			return strcmp(op_of(n), "Queue") == 0 ? n : NULL;
	}
	return NULL;
}

/* Check that queue op node n names a Queue; give an enqueue or dequeue the
 * components and ids of that Queue. */
static enum dg_status expand_node(const json_t *nodes, json_t *n, struct dg_err *err)
{
	const char *name = json_string_value(json_object_get(n, "name"));
	json_t *attrs = json_object_get(n, "attrs");
	const char *q = json_string_value(json_object_get(attrs, "queue"));
	const json_t *qn, *qa, *comps, *ids;

	if (!q)     /* validation reports the missing attr, naming the node */
		return DG_OK;
	if (!(qn = find_queue(nodes, q))) {
		dg_err_set(err, DG_EINVAL, "node '%s' (%s): attr 'queue' is '%.128s', which is not "
			   "a Queue node of the graph", name ? name : "?", op_of(n), q);
		dg_err_hint(err, "declare it: {\"name\": \"%.64s\", \"op\": \"Queue\", \"attrs\": "
			    "{\"capacity\": ..., \"components\": [...]}}", q);
		return DG_EINVAL;
	}
	if (strcmp(op_of(n), "QueueDequeueMany") != 0 && strcmp(op_of(n), "QueueEnqueueMany") != 0)
		return DG_OK;   /* QueueSize, QueueClose, QueueAck: the name is all they need */
	qa = json_object_get(qn, "attrs");
	comps = json_object_get(qa, "components");
	ids = json_object_get(qa, "ids");
	if (json_object_get(attrs, "components") &&
	    !json_equal(json_object_get(attrs, "components"), (json_t *)comps)) {
		dg_err_set(err, DG_EINVAL, "node '%s' (%s): its attr 'components' differs from "
			   "those of Queue '%s'", name ? name : "?", op_of(n), q);
		dg_err_hint(err, "leave 'components' out: the master copies the Queue's");
		return DG_EINVAL;
	}
	if (comps && json_object_set(attrs, "components", (json_t *)comps))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (ids && json_object_set(attrs, "ids", (json_t *)ids))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

enum dg_status master_queue_expand(json_t *graph, struct dg_err *err)
{
	json_t *nodes = json_object_get(graph, "nodes"), *n;
	enum dg_status st = DG_OK;
	size_t i;

	json_array_foreach(nodes, i, n) {
		if (st == DG_OK && json_is_object(json_object_get(n, "attrs")) &&
		    names_queue_op(op_of(n)))
			st = expand_node(nodes, n, err);
	}
	return st;
}

bool master_graph_has_queue_ops(const json_t *graph)
{
	const json_t *n;
	size_t i;

	json_array_foreach(json_object_get(graph, "nodes"), i, n)
		if (names_queue_op(op_of(n)))
			return true;
	return false;
}

/* ------------------------------------------------------ on the ps */

enum dg_status master_queue_create(struct master *m, const struct dg_node *qn, int task,
				   bool fresh, struct dg_err *err)
{
	const char *addr = m->cluster->tasks[task].address;
	struct dg_queue_spec s;
	struct dg_client *c;
	enum dg_status st;

	const char *name = master_queue_ps_name(qn);
	json_t *a = json_deep_copy(qn->attrs);

	if (!a)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	json_object_del(a, "shared_name");
	st = dg_queue_spec_from_json(a, &s, err);
	json_decref(a);
	if (st != DG_OK)
		return st;
	if (!(c = dg_client_new(addr, m->token, err)))
		return err ? err->code : DG_ENOMEM;
	if (fresh) {
		/* A job that feeds the queue starts it empty and open: what an
		 * earlier job left (closed, counted) must not end this one. */
		st = dg_queue_delete(c, name, err);
		if (st == DG_ENOTFOUND) {
			dg_err_clear(err);
			st = DG_OK;
		}
	}
	if (st == DG_OK)
		st = dg_queue_create(c, name, &s, err);
	if (st != DG_OK)
		dg_err_prefix(err, "creating queue '%s' on %s", name, addr);
	dg_client_free(c);
	return st;
}
