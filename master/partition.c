/* Partitioning (place.h): the cut of a placed graph into per-task
 * fragments with one _Send/_Recv pair per tensor per destination task, and
 * the --explain text of a placement. Pure: no I/O. Neighbours: place.c
 * (what it cuts), ops.c (the master's ops). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/buf.h"
#include "dg/kernels.h"
#include "dg/log.h"
#include "dg/place.h"
#include "internal.h"

/* ---------------------------------------------------------- partitioning */

struct frag_build {
	json_t *nodes;               /* array of node objects */
	json_t *names;               /* object used as a set of the names above */
};

struct cutter {
	const struct dg_graph *g;
	const struct dg_cluster *c;
	const struct placement *p;
	int master;
	bool fetch_local;            /* fetch _Sends go to the producing task itself */
	struct frag_build *main;     /* per task */
	struct frag_build *init;     /* per task */
	bool *fed;                   /* per node */
};

static enum dg_status add_node(struct frag_build *f, const char *name, const char *op,
			       json_t *inputs, json_t *attrs, struct dg_err *err)
{
	json_t *n = json_pack("{s:s, s:s}", "name", name, "op", op);

	if (!f->nodes)
		f->nodes = json_array();
	if (!f->names)
		f->names = json_object();
	if (!n || !f->nodes || !f->names) {
		json_decref(n);
		json_decref(inputs);
		json_decref(attrs);
		return dg_err_set(err, DG_ENOMEM, "out of memory building a fragment");
	}
	if (inputs)
		json_object_set_new(n, "inputs", inputs);
	if (attrs)
		json_object_set_new(n, "attrs", attrs);
	json_array_append_new(f->nodes, n);
	json_object_set_new(f->names, name, json_true());
	return DG_OK;
}

static bool has_node(const struct frag_build *f, const char *name)
{
	return f->names && json_object_get(f->names, name);
}

static json_t *shape_json(const struct dg_shape *s)
{
	json_t *a;

	if (s->ndim < 0)
		return json_null();
	a = json_array();
	for (int i = 0; a && i < s->ndim; i++)
		json_array_append_new(a, json_integer(s->dim[i]));
	return a;
}

static void edge_ref(const struct dg_graph *g, struct dg_edge e, char *buf, size_t n)
{
	if (e.index == 0)
		snprintf(buf, n, "%s", g->nodes[e.node].name);
	else
		snprintf(buf, n, "%s:%d", g->nodes[e.node].name, e.index);
}

#define REF_MAX (DG_GRAPH_MAX_NAME * 2 + 64)

/* The name, in task t's fragment, of a node holding value e: the producer
 * itself, a VarRead of a variable, or a _Recv of a value sent once from the
 * producer's task (the _Send is added then). Writes it into out. */
static enum dg_status value_on(struct cutter *ct, int t, struct dg_edge e, char *out,
			       struct dg_err *err)
{
	const struct dg_node *nd = &ct->g->nodes[e.node];
	const struct dg_ttype *ty = &nd->out[e.index];
	int src = ct->p->task[e.node];
	char key[REF_MAX], send[REF_MAX + 16], ref[REF_MAX];
	const char *var;
	enum dg_status st;

	if (master_is_variable(nd)) {
		snprintf(out, REF_MAX, "_read/%s", nd->name);
		if (has_node(&ct->main[t], out))
			return DG_OK;
		if (dg_attr_string(nd->attrs, "var", nd->name, &var, err) != DG_OK)
			return DG_EINVAL;
		return add_node(&ct->main[t], out, "VarRead", NULL,
				json_pack("{s:s, s:s, s:s, s:o}", "var", var, "ps",
					  ct->c->tasks[src].address, "dtype",
					  dg_dtype_name(ty->dtype), "shape",
					  shape_json(&ty->shape)),
				err);
	}
	edge_ref(ct->g, e, ref, sizeof ref);
	if (src == t) {
		snprintf(out, REF_MAX, "%s", ref);
		return DG_OK;
	}
	snprintf(out, REF_MAX, "_recv/%s/%d", nd->name, e.index);
	if (has_node(&ct->main[t], out))
		return DG_OK;   /* one transfer per tensor per destination task */
	snprintf(key, sizeof key, "%s:%d->%s/%d", nd->name, e.index, ct->c->tasks[t].job,
		 ct->c->tasks[t].index);
	snprintf(send, sizeof send, "_send/%s/%d/%s/%d", nd->name, e.index, ct->c->tasks[t].job,
		 ct->c->tasks[t].index);
	st = add_node(&ct->main[src], send, "_Send", json_pack("[s]", ref),
		      json_pack("{s:s, s:s}", "key", key, "to", ct->c->tasks[t].address), err);
	if (st != DG_OK)
		return st;
	return add_node(&ct->main[t], out, "_Recv", NULL,
			json_pack("{s:s, s:s, s:o}", "key", key, "dtype", dg_dtype_name(ty->dtype),
				  "shape", shape_json(&ty->shape)), err);
}

/* Mark what the fetches and targets need, walking inputs backwards; fed nodes
 * stop the walk. An ApplyGradient also needs its Variable (for its VarInit). */
static enum dg_status mark_needed(struct cutter *ct, const struct dg_edge *fetch, int n_fetch,
				  bool *need, struct dg_err *err)
{
	int *stack = malloc(((size_t)ct->g->n_nodes + 1) * sizeof *stack);
	int sp = 0;

	if (!stack)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < n_fetch; i++)
		if (!need[fetch[i].node]) {
			need[fetch[i].node] = true;
			stack[sp++] = fetch[i].node;
		}
	while (sp > 0) {
		int n = stack[--sp];
		if (ct->fed[n])
			continue;
		if (master_is_apply(&ct->g->nodes[n])) {
			int v = master_apply_target(ct->g, n, err);
			if (v < 0) {
				free(stack);
				return DG_EINVAL;
			}
			if (!need[v]) {
				need[v] = true;
				stack[sp++] = v;
			}
		}
		for (int i = 0; i < ct->g->nodes[n].n_in; i++) {
			int s = ct->g->nodes[n].in[i].node;
			if (!need[s]) {
				need[s] = true;
				stack[sp++] = s;
			}
		}
	}
	free(stack);
	return DG_OK;
}

/* Queue op n on its task (inputs taken): "ps" is the task that holds its
 * Queue, "queue" that Queue's name there (master_queue_ps_name). */
static enum dg_status cut_queue_op(struct cutter *ct, int n, json_t *inputs, struct dg_err *err)
{
	const struct dg_node *nd = &ct->g->nodes[n];
	int q = master_queue_of(ct->g, n);
	json_t *a;

	if (q < 0 || ct->p->task[q] < 0) {
		json_decref(inputs);
		return dg_err_set(err, DG_EINVAL, "node '%s' (%s): attr 'queue' names no placed "
				  "Queue node", nd->name, nd->op->name);
	}
	if (!(a = json_deep_copy(nd->attrs)) ||
	    json_object_set_new(a, "ps", json_string(ct->c->tasks[ct->p->task[q]].address)) ||
	    json_object_set_new(a, "queue", json_string(master_queue_ps_name(&ct->g->nodes[q])))) {
		json_decref(a);
		json_decref(inputs);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	return add_node(&ct->main[ct->p->task[n]], nd->name, nd->op->name, inputs, a, err);
}

/* ApplyGradient (or AssignMovingAverage, Assign, AssignAdd: master_apply_rule) n as a
 * VarApply on its task (inputs taken): the Variable's ps var name and
 * address, the other attrs as given. */
static enum dg_status cut_apply(struct cutter *ct, int n, json_t *inputs, struct dg_err *err)
{
	const struct dg_node *nd = &ct->g->nodes[n];
	int v = master_apply_target(ct->g, n, err);
	const char *var;
	json_t *a;

	if (v < 0 || dg_attr_string(ct->g->nodes[v].attrs, "var", ct->g->nodes[v].name, &var,
				    err) != DG_OK) {
		json_decref(inputs);
		return DG_EINVAL;
	}
	a = json_deep_copy(nd->attrs);
	if (!a) {
		json_decref(inputs);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	json_object_del(a, "variable");
	json_object_set_new(a, "var", json_string(var));
	if (master_apply_rule(nd))
		json_object_set_new(a, "rule", json_string(master_apply_rule(nd)));
	json_object_set_new(a, "ps", json_string(ct->c->tasks[ct->p->task[v]].address));
	return add_node(&ct->main[ct->p->task[n]], nd->name, "VarApply", inputs, a, err);
}

/* Gather(Variable, indices) n as a VarGather on its task (inputs: the
 * indices' ref, taken): only the rows the indices name leave the ps. */
static enum dg_status cut_gather(struct cutter *ct, int n, json_t *inputs, struct dg_err *err)
{
	const struct dg_node *nd = &ct->g->nodes[n], *vn = &ct->g->nodes[nd->in[0].node];
	const char *var;
	json_t *in = json_array();

	if (!in || json_array_append(in, json_array_get(inputs, 1))) {
		json_decref(in);
		json_decref(inputs);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	json_decref(inputs);
	if (dg_attr_string(vn->attrs, "var", vn->name, &var, err) != DG_OK) {
		json_decref(in);
		return DG_EINVAL;
	}
	return add_node(&ct->main[ct->p->task[n]], nd->name, "VarGather", in,
			json_pack("{s:s, s:s, s:s, s:o}", "var", var, "ps",
				  ct->c->tasks[ct->p->task[nd->in[0].node]].address, "dtype",
				  dg_dtype_name(vn->out[0].dtype), "shape",
				  shape_json(&vn->out[0].shape)), err);
}

/* Is node n a Gather of a Variable's rows (run as a VarGather)? */
static bool gathers_variable(const struct cutter *ct, int n)
{
	const struct dg_node *nd = &ct->g->nodes[n];

	return strcmp(nd->op->name, "Gather") == 0 && nd->n_in == 2 &&
	       master_is_variable(&ct->g->nodes[nd->in[0].node]) &&
	       !(ct->p->gpu && ct->p->gpu[n] >= 0);
}

/* Node n of the graph, as it appears in its task's fragments. */
static enum dg_status cut_node(struct cutter *ct, int n, struct dg_err *err)
{
	const struct dg_node *nd = &ct->g->nodes[n];
	int t = ct->p->task[n];
	char name[REF_MAX];
	enum dg_status st = DG_OK;

	if (ct->fed[n]) {
		snprintf(name, sizeof name, "feed:%s", nd->name);
		return add_node(&ct->main[t], nd->name, "_Recv", NULL,
				json_pack("{s:s, s:s, s:o}", "key", name, "dtype",
					  dg_dtype_name(nd->out[0].dtype), "shape",
					  shape_json(&nd->out[0].shape)), err);
	}
	if (master_is_variable(nd)) {
		json_t *a = json_deep_copy(nd->attrs);
		if (!a)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		if (!json_object_get(a, "var"))
			json_object_set_new(a, "var", json_string(nd->name));
		json_object_set_new(a, "ps", json_string(ct->c->tasks[t].address));
		if (!json_object_get(a, "dtype"))
			json_object_set_new(a, "dtype", json_string("float32"));
		return add_node(&ct->init[t], nd->name, "VarInit", NULL, a, err);
	}
	if (nd->op->flags & DG_OPF_FEED) {
		dg_err_set(err, DG_EINVAL, "placeholder '%s' must be fed", nd->name);
		dg_err_hint(err, "use --feed %s=FILE.npy|VALUE", nd->name);
		return DG_EINVAL;
	}
	json_t *inputs = json_array();
	bool gather = gathers_variable(ct, n);
	if (!inputs)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; st == DG_OK && i < nd->n_in; i++) {
		if (gather && i == 0) {         /* the variable: read by VarGather */
			json_array_append_new(inputs, json_null());
			continue;
		}
		st = value_on(ct, t, nd->in[i], name, err);
		if (st == DG_OK)
			json_array_append_new(inputs, json_string(name));
	}
	if (st != DG_OK) {
		json_decref(inputs);
		return st;
	}
	if (master_is_apply(nd))
		return cut_apply(ct, n, inputs, err);
	if (gather)
		return cut_gather(ct, n, inputs, err);
	if (master_is_queue_op(nd))
		return cut_queue_op(ct, n, inputs, err);
	st = add_node(&ct->main[t], nd->name, nd->op->name, inputs, json_incref(nd->attrs), err);
	/* A GPU placement travels with the node: the task's executor runs it on that
	 * GPU (worker/exec.c); a soft-placed node stays on the CPU. */
	if (st == DG_OK && ct->p->gpu && ct->p->gpu[n] >= 0) {
		char dev[32];
		json_t *last = json_array_get(ct->main[t].nodes,
					      json_array_size(ct->main[t].nodes) - 1);
		snprintf(dev, sizeof dev, "/gpu:%d", ct->p->gpu[n]);
		json_object_set_new(last, "device", json_string(dev));
	}
	return st;
}

static enum dg_status finish_frags(struct frag_build *fb, int nt, struct place_fragment **out,
				   int *n_out, struct dg_err *err)
{
	int n = 0;

	*out = calloc((size_t)nt + 1, sizeof **out);
	if (!*out)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int t = 0; t < nt; t++) {
		if (!fb[t].nodes)
			continue;
		(*out)[n].task = t;
		(*out)[n].n_nodes = (int)json_array_size(fb[t].nodes);
		(*out)[n].doc = json_pack("{s:i, s:O}", "version", 1, "nodes", fb[t].nodes);
		if (!(*out)[n].doc)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		n++;
	}
	*n_out = n;
	return DG_OK;
}

static enum dg_status resolve_feeds(struct cutter *ct, const char *const *feeds, int n_feeds,
				    struct partition *out, struct dg_err *err)
{
	out->feeds = calloc((size_t)n_feeds + 1, sizeof *out->feeds);
	if (!out->feeds)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	out->n_feeds = n_feeds;
	for (int i = 0; i < n_feeds; i++) {
		struct dg_edge e;
		const struct dg_node *nd;
		if (dg_graph_ref(ct->g, feeds[i], &e, err) != DG_OK) {
			dg_err_prefix(err, "feed '%s'", feeds[i]);
			return err ? err->code : DG_EINVAL;
		}
		nd = &ct->g->nodes[e.node];
		if (nd->n_out != 1 || master_is_variable(nd)) {
			dg_err_set(err, DG_EUNSUPPORTED, "feed '%s': node '%s' (%s) cannot be "
				   "fed in a distributed job", feeds[i], nd->name, nd->op->name);
			dg_err_hint(err, "feed Placeholders or other nodes with one output");
			return DG_EUNSUPPORTED;
		}
		if (ct->fed[e.node]) {
			dg_err_set(err, DG_EINVAL, "feed '%s' is given twice", feeds[i]);
			return DG_EINVAL;
		}
		ct->fed[e.node] = true;
		out->feeds[i].ref = strdup(feeds[i]);
		out->feeds[i].key = malloc(strlen(nd->name) + 6);
		out->feeds[i].task = -1;
		if (!out->feeds[i].ref || !out->feeds[i].key)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		sprintf(out->feeds[i].key, "feed:%s", nd->name);
	}
	return DG_OK;
}

static enum dg_status cut(struct cutter *ct, const struct partition_opts *o,
			  struct partition *out, struct dg_err *err)
{
	const struct dg_graph *g = ct->g;
	const char *const *feeds = o->feeds, *const *fetch = o->fetch;
	int n_feeds = o->n_feeds, n_fetch = o->n_fetch, nt = o->targets ? o->n_targets : 0;
	int nf = n_fetch > 0 || nt > 0 ? n_fetch : g->n_fetch;
	/* fe: the fetches, then the targets (walked for need, never sent) */
	struct dg_edge *fe = calloc((size_t)(nf + nt) + 1, sizeof *fe);
	bool *need = calloc((size_t)g->n_nodes + 1, sizeof *need);
	enum dg_status st = DG_OK;

	if (!fe || !need) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if (nf + nt == 0) {
		st = dg_err_set(err, DG_EINVAL, "nothing to fetch");
		dg_err_hint(err, "name outputs with --fetch NAME or the graph's \"fetch\" list");
		goto out;
	}
	for (int i = 0; i < nf; i++) {
		if (n_fetch == 0) {
			fe[i] = g->fetch[i];
		} else if ((st = dg_graph_ref(g, fetch[i], &fe[i], err)) != DG_OK) {
			dg_err_prefix(err, "fetch '%s'", fetch[i]);
			goto out;
		}
	}
	for (int i = 0; i < nt; i++) {
		if ((st = dg_graph_ref(g, o->targets[i], &fe[nf + i], err)) != DG_OK) {
			dg_err_prefix(err, "target '%s'", o->targets[i]);
			goto out;
		}
	}
	if ((st = resolve_feeds(ct, feeds, n_feeds, out, err)) != DG_OK)
		goto out;
	if ((st = mark_needed(ct, fe, nf + nt, need, err)) != DG_OK)
		goto out;
	for (int i = 0; i < n_feeds; i++) {
		struct dg_edge e;
		dg_graph_ref(g, feeds[i], &e, NULL);
		out->feeds[i].task = need[e.node] ? ct->p->task[e.node] : -1;
	}
	for (int i = 0; st == DG_OK && i < g->n_nodes; i++)
		if (need[g->order[i]])
			st = cut_node(ct, g->order[i], err);
	out->fetch_keys = calloc((size_t)nf + 1, sizeof *out->fetch_keys);
	if (st == DG_OK && !out->fetch_keys)
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	if (st == DG_OK)
		out->n_fetch = nf;
	for (int i = 0; st == DG_OK && i < nf; i++) {
		char ref[REF_MAX], val[REF_MAX], key[REF_MAX + 8], name[64];
		int src = master_is_variable(&g->nodes[fe[i].node]) ? ct->master : ct->p->task[fe[i].node];
		int dst = ct->fetch_local ? src : ct->master;
		edge_ref(g, fe[i], ref, sizeof ref);
		snprintf(key, sizeof key, "fetch:%s", n_fetch > 0 ? fetch[i] : ref);
		snprintf(name, sizeof name, "_fetch/%d", i);
		out->fetch_keys[i] = strdup(key);
		if (!out->fetch_keys[i])
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
		if (st == DG_OK)
			st = value_on(ct, src, fe[i], val, err);
		if (st == DG_OK)
			st = add_node(&ct->main[src], name, "_Send", json_pack("[s]", val),
				      json_pack("{s:s, s:s}", "key", key, "to",
						ct->c->tasks[dst].address), err);
	}
	if (st == DG_OK)
		st = finish_frags(ct->main, ct->c->n_tasks, &out->frags, &out->n_frags, err);
	if (st == DG_OK)
		st = finish_frags(ct->init, ct->c->n_tasks, &out->init, &out->n_init, err);
out:
	free(fe);
	free(need);
	return st;
}

enum dg_status place_partition(const struct dg_graph *g, const struct dg_cluster *c,
			       const struct placement *p, int master_task,
			       const char *const *feeds, int n_feeds,
			       const char *const *fetch, int n_fetch,
			       struct partition *out, struct dg_err *err)
{
	struct partition_opts o = {
		.master_task = master_task, .feeds = feeds, .n_feeds = n_feeds,
		.fetch = fetch, .n_fetch = n_fetch,
	};

	return place_partition_ex(g, c, p, &o, out, err);
}

enum dg_status place_partition_ex(const struct dg_graph *g, const struct dg_cluster *c,
				  const struct placement *p, const struct partition_opts *o,
				  struct partition *out, struct dg_err *err)
{
	int master_task = o->master_task;
	struct cutter ct = {
		.g = g, .c = c, .p = p, .master = master_task, .fetch_local = o->fetch_local,
	};
	enum dg_status st;

	memset(out, 0, sizeof *out);
	if (master_task < 0 || master_task >= c->n_tasks || p->n_nodes != g->n_nodes)
		return dg_err_set(err, DG_EINVAL, "partition: master task %d or placement does not "
				  "fit the cluster and graph", master_task);
	ct.main = calloc((size_t)c->n_tasks + 1, sizeof *ct.main);
	ct.init = calloc((size_t)c->n_tasks + 1, sizeof *ct.init);
	ct.fed = calloc((size_t)g->n_nodes + 1, sizeof *ct.fed);
	if (!ct.main || !ct.init || !ct.fed)
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	else
		st = cut(&ct, o, out, err);
	for (int t = 0; t < c->n_tasks; t++) {
		if (ct.main) {
			json_decref(ct.main[t].nodes);
			json_decref(ct.main[t].names);
		}
		if (ct.init) {
			json_decref(ct.init[t].nodes);
			json_decref(ct.init[t].names);
		}
	}
	free(ct.main);
	free(ct.init);
	free(ct.fed);
	if (st != DG_OK)
		partition_deinit(out);
	return st;
}

void partition_deinit(struct partition *part)
{
	if (!part)
		return;
	for (int i = 0; part->frags && i < part->n_frags; i++)
		json_decref(part->frags[i].doc);
	for (int i = 0; part->init && i < part->n_init; i++)
		json_decref(part->init[i].doc);
	for (int i = 0; part->feeds && i < part->n_feeds; i++) {
		free(part->feeds[i].ref);
		free(part->feeds[i].key);
	}
	for (int i = 0; part->fetch_keys && i < part->n_fetch; i++)
		free(part->fetch_keys[i]);
	free(part->frags);
	free(part->init);
	free(part->feeds);
	free(part->fetch_keys);
	memset(part, 0, sizeof *part);
}

/* ---------------------------------------------------------------- explain */

static void explain_frag(struct dg_buf *b, const struct dg_cluster *c,
			 const struct place_fragment *f, const char *what)
{
	char dev[128];
	size_t i;
	json_t *n;

	place_device_name(c, f->task, dev, sizeof dev);
	dg_buf_printf(b, NULL, "%s %s (%s): %d node%s\n", what, dev, c->tasks[f->task].address,
		      f->n_nodes, f->n_nodes == 1 ? "" : "s");
	json_array_foreach(json_object_get(f->doc, "nodes"), i, n) {
		const char *op = json_string_value(json_object_get(n, "op"));
		const char *name = json_string_value(json_object_get(n, "name"));
		json_t *attrs = json_object_get(n, "attrs"), *in = json_object_get(n, "inputs");
		const char *key = json_string_value(json_object_get(attrs, "key"));
		if (strcmp(op, "_Send") == 0) {
			dg_buf_printf(b, NULL, "  send  %s -> %s  key %s\n",
				      json_string_value(json_array_get(in, 0)),
				      json_string_value(json_object_get(attrs, "to")), key);
			continue;
		}
		if (strcmp(op, "_Recv") == 0) {
			dg_buf_printf(b, NULL, "  recv  %s  key %s\n", name, key);
			continue;
		}
		dg_buf_printf(b, NULL, "  node  %s = %s(", name, op);
		for (size_t k = 0; k < json_array_size(in); k++)
			dg_buf_printf(b, NULL, "%s%s", k ? ", " : "",
				      json_string_value(json_array_get(in, k)));
		if (strncmp(op, "Var", 3) == 0)
			dg_buf_printf(b, NULL, "%son ps %s", json_array_size(in) ? "; " : "",
				      json_string_value(json_object_get(attrs, "ps")));
		const char *on = json_string_value(json_object_get(n, "device"));
		dg_buf_printf(b, NULL, ")%s%s\n", on ? " on " : "", on ? on : "");
	}
}

char *place_explain(const struct dg_graph *g, const struct dg_cluster *c,
		    const struct placement *p, const struct partition *part)
{
	struct dg_buf b;
	char dev[128];
	int w = 4;

	dg_buf_init(&b);
	for (int n = 0; n < g->n_nodes; n++)
		if ((int)strlen(g->nodes[n].name) > w && strlen(g->nodes[n].name) < 40)
			w = (int)strlen(g->nodes[n].name);
	dg_buf_printf(&b, NULL, "placement:\n");
	for (int n = 0; n < g->n_nodes; n++) {
		place_node_device(c, p, n, dev, sizeof dev);
		dg_buf_printf(&b, NULL, "  %-*s  %-24s %s%s%s\n", w, g->nodes[n].name, dev,
			      p->why[n] ? p->why[n] : "",
			      p->soft[n] ? "; soft placement: asked for " : "",
			      p->soft[n] ? g->nodes[n].device : "");
		if (p->soft[n])
			dg_buf_printf(&b, NULL, "  %-*s  (no GPU there: runs on the CPU)\n", w, "");
	}
	for (int i = 0; part && i < part->n_init; i++)
		explain_frag(&b, c, &part->init[i], "init fragment");
	for (int i = 0; part && i < part->n_frags; i++)
		explain_frag(&b, c, &part->frags[i], "fragment");
	if (!b.data)
		return NULL;
	return dg_buf_steal(&b, NULL);
}

