/* Placement and partitioning (place.h): device strings, the rules that pick a
 * task per node (explicit, partial, variables on ps tasks, a cost model with
 * colocation for the rest, compute-heavy nodes and their neighbours on a
 * task's GPU when it has one) and the cut into per-task fragments with one
 * _Send/_Recv pair per tensor per destination task. Pure: no I/O, no globals
 * beyond the constant Variable op definition. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/buf.h"
#include "dg/kernels.h"
#include "dg/log.h"
#include "dg/place.h"

/* ------------------------------------------------------------- Variable op */

static const struct dg_attr_spec variable_attrs[] = {
	{ "var", DG_ATTR_STRING, false, "variable name on the ps (default: the node's name)" },
	{ "dtype", DG_ATTR_DTYPE, false, "element type (default float32)" },
	{ "shape", DG_ATTR_SHAPE, true, "fully known shape" },
	{ "init", DG_ATTR_STRING, false, "zeros (default), ones, uniform, normal, glorot" },
	{ "scale", DG_ATTR_FLOAT, false, "scale of the random initialisers" },
	{ "seed", DG_ATTR_INT, false, "seed of the random initialisers" },
	{ NULL, 0, false, NULL },
};

static enum dg_status variable_infer(struct dg_infer_ctx *c)
{
	enum dg_dtype f32 = DG_F32;
	const char *init;
	enum dg_status st;

	st = dg_attr_dtype(c->attrs, "dtype", &f32, &c->out[0].dtype, c->err);
	if (st == DG_OK)
		st = dg_attr_shape(c->attrs, "shape", true, false, &c->out[0].shape, c->err);
	if (st == DG_OK)
		st = dg_attr_string(c->attrs, "init", "zeros", &init, c->err);
	if (st != DG_OK)
		return st;
	if (strcmp(init, "zeros") && strcmp(init, "ones") && strcmp(init, "uniform") &&
	    strcmp(init, "normal") && strcmp(init, "glorot")) {
		dg_err_set(c->err, DG_EINVAL, "attr 'init' is '%.64s'", init);
		dg_err_hint(c->err, "use zeros, ones, uniform, normal or glorot");
		return DG_EINVAL;
	}
	return DG_OK;
}

static const struct dg_op_def variable_def = {
	.name = "Variable",
	.min_inputs = 0,
	.max_inputs = 0,
	.n_outputs = 1,
	.attrs = variable_attrs,
	.infer = variable_infer,
	.flags = DG_OPF_SOURCE | DG_OPF_STATEFUL,
	.doc = "a tensor held by a ps task, read by the nodes that use it (dg submit only)",
};

const struct dg_op_def *place_variable_op(void)
{
	return &variable_def;
}

/* --------------------------------------------------------- ApplyGradient op */

static const struct dg_attr_spec apply_attrs[] = {
	{ "variable", DG_ATTR_STRING, true, "the Variable node the gradient updates" },
	{ "rule", DG_ATTR_STRING, true, "sgd, momentum or adam" },
	{ "lr", DG_ATTR_FLOAT, false, "learning rate (> 0)" },
	{ "momentum", DG_ATTR_FLOAT, false, "momentum (rule momentum)" },
	{ "nesterov", DG_ATTR_BOOL, false, "Nesterov momentum" },
	{ "beta1", DG_ATTR_FLOAT, false, "adam beta1" },
	{ "beta2", DG_ATTR_FLOAT, false, "adam beta2" },
	{ "eps", DG_ATTR_FLOAT, false, "adam epsilon" },
	{ "schedule", DG_ATTR_STRING, false, "constant (default), step or exponential" },
	{ "every", DG_ATTR_INT, false, "schedule period in training steps (>= 1)" },
	{ "factor", DG_ATTR_FLOAT, false, "schedule decay factor (> 0)" },
	{ "sync", DG_ATTR_BOOL, false, "synchronous replicas (the ps aggregates each step)" },
	{ "replicas", DG_ATTR_INT, false, "number of replicas (sync)" },
	{ "backup", DG_ATTR_INT, false, "backup replicas: a step needs replicas - backup (sync)" },
	{ "replica", DG_ATTR_INT, false, "this replica's index (sync)" },
	{ NULL, 0, false, NULL },
};

/* Check the attrs that do not depend on the graph; the Variable named by
 * "variable" and the gradient's type against it are checked by place_graph. */
static enum dg_status apply_infer(struct dg_infer_ctx *c)
{
	const char *rule, *sched;
	double lr, factor, one = 1, def_lr = 0.01;
	int64_t every, replicas, backup, replica, i1 = 1, i0 = 0;
	enum dg_status st;

	st = dg_attr_string(c->attrs, "rule", NULL, &rule, c->err);
	if (st == DG_OK)
		st = dg_attr_string(c->attrs, "schedule", "constant", &sched, c->err);
	if (st == DG_OK)
		st = dg_attr_float(c->attrs, "lr", &def_lr, &lr, c->err);
	if (st == DG_OK)
		st = dg_attr_float(c->attrs, "factor", &one, &factor, c->err);
	if (st == DG_OK)
		st = dg_attr_int(c->attrs, "every", &i1, &every, c->err);
	if (st == DG_OK)
		st = dg_attr_int(c->attrs, "replicas", &i1, &replicas, c->err);
	if (st == DG_OK)
		st = dg_attr_int(c->attrs, "backup", &i0, &backup, c->err);
	if (st == DG_OK)
		st = dg_attr_int(c->attrs, "replica", &i0, &replica, c->err);
	if (st != DG_OK)
		return st;
	if (strcmp(rule, "sgd") && strcmp(rule, "momentum") && strcmp(rule, "adam")) {
		dg_err_set(c->err, DG_EINVAL, "attr 'rule' is '%.64s'", rule);
		dg_err_hint(c->err, "use sgd, momentum or adam");
		return DG_EINVAL;
	}
	if (strcmp(rule, "momentum") == 0 && !json_object_get(c->attrs, "momentum"))
		return dg_err_set(c->err, DG_EINVAL, "rule momentum needs attr 'momentum'");
	if (strcmp(sched, "constant") && strcmp(sched, "step") && strcmp(sched, "exponential")) {
		dg_err_set(c->err, DG_EINVAL, "attr 'schedule' is '%.64s'", sched);
		dg_err_hint(c->err, "use constant, step or exponential");
		return DG_EINVAL;
	}
	if (!(lr > 0) || !(factor > 0) || every < 1)
		return dg_err_set(c->err, DG_EINVAL, "attrs lr %g, factor %g, every %lld: each "
				  "must be > 0", lr, factor, (long long)every);
	if (replicas < 1 || backup < 0 || backup >= replicas || replica < 0 || replica >= replicas)
		return dg_err_set(c->err, DG_EINVAL, "attrs replicas %lld, backup %lld, replica "
				  "%lld: need 0 <= backup < replicas and 0 <= replica < replicas",
				  (long long)replicas, (long long)backup, (long long)replica);
	if (!dg_dtype_is_float(c->in[0].dtype))
		return dg_err_set(c->err, DG_EDTYPE, "the gradient is %s; it must be a float",
				  dg_dtype_name(c->in[0].dtype));
	c->out[0].dtype = DG_I64;
	c->out[0].shape.ndim = 0;
	return DG_OK;
}

static const struct dg_op_def apply_def = {
	.name = "ApplyGradient",
	.min_inputs = 1,
	.max_inputs = 1,
	.n_outputs = 1,
	.attrs = apply_attrs,
	.infer = apply_infer,
	.flags = DG_OPF_STATEFUL,
	.doc = "apply the input gradient to a Variable with an update rule on its ps; outputs "
	       "the new version (training jobs)",
};

const struct dg_op_def *place_apply_gradient_op(void)
{
	return &apply_def;
}

const struct dg_op_def *master_op_find(const char *name)
{
	if (name && strcmp(name, "Variable") == 0)
		return &variable_def;
	if (name && strcmp(name, "ApplyGradient") == 0)
		return &apply_def;
	return dg_op_find(name);
}

static bool is_variable(const struct dg_node *n)
{
	return n->op == &variable_def;
}

static bool is_apply(const struct dg_node *n)
{
	return n->op == &apply_def;
}

/* The Variable node an ApplyGradient updates, or -1 with *err set. */
static int apply_target(const struct dg_graph *g, int n, struct dg_err *err)
{
	const struct dg_node *nd = &g->nodes[n];
	const char *var = json_string_value(json_object_get(nd->attrs, "variable"));
	int v = var ? dg_graph_find(g, var) : -1;

	if (v < 0 || !is_variable(&g->nodes[v])) {
		dg_err_set(err, DG_EINVAL, "node '%s' (ApplyGradient): attr 'variable' '%.128s' "
			   "is not a Variable node of the graph", nd->name, var ? var : "");
		dg_err_hint(err, "name the Variable node the gradient belongs to");
		return -1;
	}
	return v;
}

/* The gradient must have the Variable's dtype and (where known) shape. */
static enum dg_status check_apply(const struct dg_graph *g, int n, struct dg_err *err)
{
	const struct dg_node *nd = &g->nodes[n];
	int v = apply_target(g, n, err);
	const struct dg_ttype *gt, *vt;

	if (v < 0)
		return DG_EINVAL;
	gt = &g->nodes[nd->in[0].node].out[nd->in[0].index];
	vt = &g->nodes[v].out[0];
	if (gt->dtype != vt->dtype) {
		dg_err_set(err, DG_EDTYPE, "node '%s' (ApplyGradient): the gradient is %s but "
			   "variable '%s' is %s", nd->name, dg_dtype_name(gt->dtype),
			   g->nodes[v].name, dg_dtype_name(vt->dtype));
		return DG_EDTYPE;
	}
	bool ok = gt->shape.ndim < 0 || gt->shape.ndim == vt->shape.ndim;
	for (int i = 0; ok && gt->shape.ndim > 0 && i < gt->shape.ndim; i++)
		ok = gt->shape.dim[i] < 0 || gt->shape.dim[i] == vt->shape.dim[i];
	if (!ok) {
		dg_err_set(err, DG_ESHAPE, "node '%s' (ApplyGradient): the gradient's shape does "
			   "not match variable '%s'", nd->name, g->nodes[v].name);
		dg_err_hint(err, "the gradient must have the variable's shape");
		return DG_ESHAPE;
	}
	return DG_OK;
}

/* ------------------------------------------------------------ device specs */

struct dev_spec {
	const char *job;     /* points into a copy owned by the caller, NULL = any */
	int task;            /* -1 = any */
	bool gpu;
	int gpu_index;
	bool cpu;            /* a cpu segment: the node stays off the GPUs */
};

static bool parse_index(const char *s, int *out)
{
	char *end;
	long v;

	if (!*s)
		return false;
	v = strtol(s, &end, 10);
	if (*end || v < 0 || v > 1 << 20)
		return false;
	*out = (int)v;
	return true;
}

/* Parse TensorFlow's device string in buf (modified in place). */
static bool parse_device(char *buf, struct dev_spec *d)
{
	char *save = NULL;

	d->job = NULL;
	d->task = -1;
	d->gpu = false;
	d->gpu_index = 0;
	d->cpu = false;
	if (buf[0] != '/' && buf[0] != '\0')
		return false;
	for (char *seg = strtok_r(buf, "/", &save); seg; seg = strtok_r(NULL, "/", &save)) {
		int ix;
		if (strncmp(seg, "job:", 4) == 0 && seg[4])
			d->job = seg + 4;
		else if (strncmp(seg, "task:", 5) == 0 && parse_index(seg + 5, &ix))
			d->task = ix;
		else if (strncmp(seg, "replica:", 8) == 0 && parse_index(seg + 8, &ix))
			continue;
		else if ((strncmp(seg, "cpu:", 4) == 0 && parse_index(seg + 4, &ix)) ||
			 (strncmp(seg, "device:CPU:", 11) == 0 && parse_index(seg + 11, &ix)))
			d->gpu = false, d->cpu = true;
		else if (strncmp(seg, "gpu:", 4) == 0 && parse_index(seg + 4, &ix))
			d->gpu = true, d->cpu = false, d->gpu_index = ix;
		else if (strncmp(seg, "device:GPU:", 11) == 0 && parse_index(seg + 11, &ix))
			d->gpu = true, d->cpu = false, d->gpu_index = ix;
		else
			return false;
	}
	return true;
}

/* "ps, worker" */
static void job_list(const struct dg_cluster *c, char *buf, size_t n)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < c->n_tasks && off + 1 < n; i++) {
		if (i > 0 && strcmp(c->tasks[i - 1].job, c->tasks[i].job) == 0)
			continue;
		int w = snprintf(buf + off, n - off, "%s%s", off ? ", " : "", c->tasks[i].job);
		off += w > 0 ? (size_t)w : 0;
	}
}

void place_device_name(const struct dg_cluster *c, int t, char *buf, size_t n)
{
	snprintf(buf, n, "/job:%s/task:%d", c->tasks[t].job, c->tasks[t].index);
}

void place_node_device(const struct dg_cluster *c, const struct placement *p, int n,
		       char *buf, size_t len)
{
	if (p->gpu && p->gpu[n] >= 0)
		snprintf(buf, len, "/job:%s/task:%d/gpu:%d", c->tasks[p->task[n]].job,
			 c->tasks[p->task[n]].index, p->gpu[n]);
	else
		place_device_name(c, p->task[n], buf, len);
}

/* ------------------------------------------------------------- placement */

struct placer {
	const struct dg_graph *g;
	const struct dg_cluster *c;
	const struct place_opts *o;
	struct placement *p;
	struct dev_spec *spec;       /* per node */
	char **spec_buf;             /* per node: owned copy of the device string, parsed */
	double *load;                /* per task: estimated work placed so far (element ops) */
	double *gpu_load;            /* per task: the same for its GPU, divided by GPU_SPEEDUP */
	double *bytes;               /* per task: bytes of variables held */
	bool *deferred;              /* per node: a source that follows its first consumer */
	int n_ps;                    /* tasks of job "ps" */
	int rr;                      /* round-robin counter for variables */
};

static bool task_has_gpu(const struct placer *pl, int t)
{
	return pl->o && pl->o->task_gpu && pl->o->task_gpu[t];
}

static double numel_est(const struct dg_shape *s)
{
	double n = 1;

	for (int i = 0; i < s->ndim; i++)
		n *= s->dim[i] < 0 ? 1 : (double)s->dim[i];
	return n;
}

static double edge_bytes(const struct dg_graph *g, struct dg_edge e)
{
	const struct dg_ttype *t = &g->nodes[e.node].out[e.index];

	return numel_est(&t->shape) * (double)dg_dtype_size(t->dtype);
}

/* Estimated work of a node in element operations: its outputs' elements, times
 * the inner dimension for matrix products. Crude, but it only has to spread
 * independent work and let transfers dominate when tensors are large. */
static double work_est(const struct dg_graph *g, int n)
{
	const struct dg_node *nd = &g->nodes[n];
	double w = 0;

	for (int k = 0; k < nd->n_out; k++)
		w += numel_est(&nd->out[k].shape);
	if (strstr(nd->op->name, "MatMul") && nd->n_in > 0) {
		const struct dg_shape *a = &g->nodes[nd->in[0].node].out[nd->in[0].index].shape;
		if (a->ndim >= 1 && a->dim[a->ndim - 1] > 0)
			w *= (double)a->dim[a->ndim - 1];
	}
	return w + 1;
}

/* How much faster a GPU is taken to be than a task's CPU for work the cost
 * model sends there: it only has to make a GPU task's queue look short. */
#define GPU_SPEEDUP 16.0

static const struct dg_shape *in_shape(const struct dg_graph *g, int n, int i)
{
	struct dg_edge e = g->nodes[n].in[i];

	return &g->nodes[e.node].out[e.index].shape;
}

/* Work of node n for the GPU decision (compare PLACE_GPU_MIN_WORK): elements
 * read or written, whichever is more (a reduction reads much more than it
 * writes); for MatMul/BatchMatMul the output's elements times the inner
 * dimension, for Conv2D times the filter's kh * kw * cin (HWIO). */
static double gpu_work(const struct dg_graph *g, int n)
{
	const struct dg_node *nd = &g->nodes[n];
	double out = 0, in = 0;
	bool no = false, ta = false;

	for (int k = 0; k < nd->n_out; k++)
		out += numel_est(&nd->out[k].shape);
	for (int i = 0; i < nd->n_in; i++)
		in += numel_est(in_shape(g, n, i));
	if (strstr(nd->op->name, "MatMul") && nd->n_in >= 2) {
		const struct dg_shape *a = in_shape(g, n, 0);
		dg_attr_bool(nd->attrs, strcmp(nd->op->name, "MatMul") == 0 ? "transpose_a" :
			     "adj_x", &no, &ta, NULL);
		int k = a->ndim >= 2 && ta ? a->ndim - 2 : a->ndim - 1;
		if (k >= 0 && a->dim[k] > 0)
			return out * (double)a->dim[k];
	}
	if (strcmp(nd->op->name, "Conv2D") == 0 && nd->n_in >= 2) {
		const struct dg_shape *f = in_shape(g, n, 1);
		if (f->ndim == 4)
			return out * numel_est(f) / (f->dim[3] > 0 ? (double)f->dim[3] : 1);
	}
	return in > out ? in : out;
}

/* May the cost model choose the device of node n (CPU or GPU)? Not when its
 * device names one (or soft placement moved it), and not for what only a
 * CPU runs: sources (they follow their consumer and are computed once per
 * fragment when constant), stateful ops (readers, ShardBatch, random ops),
 * Variables and ApplyGradient (requests to a ps). An op without a CUDA kernel
 * that still lands on a GPU runs on its task's CPU (worker/exec.c). */
static bool device_free(const struct placer *pl, int n)
{
	const struct dg_node *nd = &pl->g->nodes[n];

	return !pl->spec[n].cpu && !pl->spec[n].gpu && !pl->p->soft[n] && nd->n_in > 0 &&
	       !(nd->op->flags & (DG_OPF_SOURCE | DG_OPF_STATEFUL | DG_OPF_FEED)) &&
	       !is_variable(nd) && !is_apply(nd);
}

/* May node n run on task t? Its spec's job/task/gpu must match; without a job,
 * variables go to the ps tasks (when the job exists) and computation to the
 * other tasks (when there are any). */
static bool allowed(const struct placer *pl, int n, int t)
{
	const struct dev_spec *d = &pl->spec[n];
	const struct dg_task_addr *a = &pl->c->tasks[t];
	bool is_ps = strcmp(a->job, "ps") == 0;

	if (d->job && strcmp(d->job, a->job) != 0)
		return false;
	if (d->task >= 0 && d->task != a->index)
		return false;
	if (!d->job && is_variable(&pl->g->nodes[n]) && pl->n_ps > 0 && !is_ps)
		return false;
	if (!d->job && !is_variable(&pl->g->nodes[n]) && is_ps && pl->n_ps < pl->c->n_tasks)
		return false;
	if (d->gpu && !pl->p->soft[n] && !task_has_gpu(pl, t))
		return false;
	return true;
}

static int least_loaded(const struct placer *pl, int n)
{
	int best = -1;

	for (int t = 0; t < pl->c->n_tasks; t++)
		if (allowed(pl, n, t) && (best < 0 || pl->load[t] < pl->load[best]))
			best = t;
	return best;
}

/* Check the node's spec against the cluster: unknown job or task is DG_EINVAL,
 * a GPU that no matching task has is DG_EUNSUPPORTED unless soft placement. */
static enum dg_status check_spec(struct placer *pl, int n, struct dg_err *err)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	struct dev_spec *d = &pl->spec[n];
	char jobs[160];

	job_list(pl->c, jobs, sizeof jobs);
	if (d->job && dg_cluster_job_size(pl->c, d->job) == 0) {
		dg_err_set(err, DG_EINVAL, "node '%s' is placed on %s, but the cluster has no job "
			   "'%.64s' (jobs: %s)", nd->name, nd->device, d->job, jobs);
		const char *eg = pl->c->tasks[0].job;
		for (int t = 0; t < pl->c->n_tasks; t++)
			if (strcmp(pl->c->tasks[t].job, "ps") != 0) {
				eg = pl->c->tasks[t].job;
				break;
			}
		dg_err_hint(err, "use a job of the cluster (e.g. /job:%s/task:0) or leave the "
			    "device out to let the master place the node", eg);
		return DG_EINVAL;
	}
	if (d->task >= 0) {
		const char *job = d->job ? d->job : NULL;
		int size = job ? dg_cluster_job_size(pl->c, job) : 0;
		bool found = false;
		for (int t = 0; t < pl->c->n_tasks; t++)
			found |= (!job || strcmp(job, pl->c->tasks[t].job) == 0) &&
				 pl->c->tasks[t].index == d->task;
		if (!found) {
			if (job)
				dg_err_set(err, DG_EINVAL, "node '%s' is placed on %s, but job "
					   "'%s' has %d task%s (0..%d)", nd->name, nd->device,
					   job, size, size == 1 ? "" : "s", size - 1);
			else
				dg_err_set(err, DG_EINVAL, "node '%s' is placed on %s, but no "
					   "job of the cluster (%s) has that task", nd->name,
					   nd->device, jobs);
			dg_err_hint(err, "the cluster spec lists the tasks of each job");
			return DG_EINVAL;
		}
	}
	if (!d->gpu)
		return DG_OK;
	for (int t = 0; t < pl->c->n_tasks; t++)
		if (allowed(pl, n, t))
			return DG_OK;
	if (pl->o && pl->o->soft_placement) {
		pl->p->soft[n] = true;
		dg_log(DG_LOG_WARN, "master", "node '%s' is placed on %s, but there is no GPU "
		       "there: running it on the CPU (soft placement)", nd->name, nd->device);
		return DG_OK;
	}
	if (d->job && d->task >= 0)
		dg_err_set(err, DG_EUNSUPPORTED, "node '%s' is placed on %s, but that task has "
			   "no GPU", nd->name, nd->device);
	else
		dg_err_set(err, DG_EUNSUPPORTED, "node '%s' is placed on %s, but no task of the "
			   "cluster that fits has a GPU", nd->name, nd->device);
	dg_err_hint(err, "use /cpu:0, or run with --soft-placement to fall back to the CPU");
	return DG_EUNSUPPORTED;
}

/* The task that already holds node n's variable (place_opts.existing), or -1. */
static int existing_task(const struct placer *pl, int n)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	const char *var = json_string_value(json_object_get(nd->attrs, "var"));
	json_t *v;

	if (!pl->o || !json_is_object(pl->o->existing))
		return -1;
	v = json_object_get(pl->o->existing, var ? var : nd->name);
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) >= pl->c->n_tasks)
		return -1;
	return (int)json_integer_value(v);
}

static void place_variable(struct placer *pl, int n)
{
	int best = -1, count = 0, pick;
	int have = existing_task(pl, n);

	if (have >= 0) {
		/* Its value lives there: placing it elsewhere would start a second copy. */
		pl->p->task[n] = have;
		pl->bytes[have] += edge_bytes(pl->g, (struct dg_edge){ n, 0 });
		pl->p->why[n] = "existing";
		return;
	}

	for (int t = 0; t < pl->c->n_tasks; t++) {
		if (!allowed(pl, n, t))
			continue;
		count++;
		if (best < 0 || pl->bytes[t] < pl->bytes[best])
			best = t;
	}
	if (pl->o && pl->o->vars == PLACE_VARS_ROUND_ROBIN && count > 1) {
		pick = pl->rr++ % count;
		for (int t = 0; t < pl->c->n_tasks; t++)
			if (allowed(pl, n, t) && pick-- == 0) {
				best = t;
				break;
			}
	}
	pl->p->task[n] = best;
	pl->bytes[best] += edge_bytes(pl->g, (struct dg_edge){ n, 0 });
	pl->p->why[n] = count == 1 && pl->spec[n].job ? "explicit" : "variable";
}

/* Bytes that must cross into task t for node n's inputs (each distinct value
 * counted once; sources not yet placed will follow their consumer: free). */
static double transfer_cost(const struct placer *pl, int n, int t)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	double b = 0;

	for (int i = 0; i < nd->n_in; i++) {
		struct dg_edge e = nd->in[i];
		bool seen = false;
		for (int j = 0; j < i && !seen; j++)
			seen = nd->in[j].node == e.node && nd->in[j].index == e.index;
		if (seen || pl->p->task[e.node] < 0 || pl->p->task[e.node] == t)
			continue;
		b += edge_bytes(pl->g, e);
	}
	return b;
}

/* Node n (device free, on a task with a GPU) follows its inputs onto that GPU
 * when more of their bytes are there than in host memory: it then saves the
 * download, and its GPU readers the upload. Ties stay on the CPU. */
static void follow_to_gpu(struct placer *pl, int n, double w)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	int t = pl->p->task[n], k = -1;
	double on_gpu = 0, on_host = 0;

	if (!task_has_gpu(pl, t) || !device_free(pl, n))
		return;
	for (int i = 0; i < nd->n_in; i++) {
		struct dg_edge e = nd->in[i];
		bool seen = false;
		for (int j = 0; j < i && !seen; j++)
			seen = nd->in[j].node == e.node && nd->in[j].index == e.index;
		if (seen)
			continue;
		if (pl->p->task[e.node] == t && pl->p->gpu[e.node] >= 0) {
			on_gpu += edge_bytes(pl->g, e);
			if (k < 0)
				k = pl->p->gpu[e.node];
		} else {
			on_host += edge_bytes(pl->g, e);
		}
	}
	if (k < 0 || !(on_gpu > on_host))
		return;
	pl->p->gpu[n] = k;
	pl->p->why[n] = "gpu-colocated";
	pl->load[t] -= w;
	pl->gpu_load[t] += w / GPU_SPEEDUP;
}

static void place_compute(struct placer *pl, int n)
{
	const struct dg_node *nd = &pl->g->nodes[n];
	double w = work_est(pl->g, n), best_cost = 0;
	int best = -1, count = 0;
	bool to_gpu = false;

	/* A compute-heavy node goes to a GPU whenever a task it may run on has one:
	 * only such tasks compete, by their GPU's queue and the transfers. */
	if (device_free(pl, n) && gpu_work(pl->g, n) >= PLACE_GPU_MIN_WORK)
		for (int t = 0; t < pl->c->n_tasks && !to_gpu; t++)
			to_gpu = allowed(pl, n, t) && task_has_gpu(pl, t);
	for (int t = 0; t < pl->c->n_tasks; t++) {
		if (!allowed(pl, n, t) || (to_gpu && !task_has_gpu(pl, t)))
			continue;
		double cost = (to_gpu ? pl->gpu_load[t] + w / GPU_SPEEDUP : pl->load[t] + w) +
			      transfer_cost(pl, n, t);
		count++;
		if (best < 0 || cost < best_cost)
			best = t, best_cost = cost;
	}
	pl->p->task[n] = best;
	if (to_gpu) {
		pl->gpu_load[best] += w / GPU_SPEEDUP;
		pl->p->gpu[n] = 0;
		pl->p->why[n] = "gpu";
	} else {
		pl->load[best] += w;
		pl->p->why[n] = count == 1 && pl->spec[n].job && pl->spec[n].task >= 0 ?
				"explicit" :
				transfer_cost(pl, n, best) <
				transfer_cost(pl, n, least_loaded(pl, n)) ? "colocated" : "cost";
		follow_to_gpu(pl, n, w);
	}
	/* Unplaced sources feeding n follow it, so their values need no transfer. */
	for (int i = 0; i < nd->n_in; i++) {
		int s = nd->in[i].node;
		if (!pl->deferred[s] || pl->p->task[s] >= 0)
			continue;
		pl->p->task[s] = allowed(pl, s, best) ? best : least_loaded(pl, s);
		pl->p->why[s] = pl->p->task[s] == best ? "colocated" : "cost";
		pl->load[pl->p->task[s]] += work_est(pl->g, s);
	}
}

/* An ApplyGradient runs where its gradient is computed: the gradient then
 * travels once, straight to the ps, instead of to another worker first. */
static void place_with_gradient(struct placer *pl, int n)
{
	int t = pl->p->task[pl->g->nodes[n].in[0].node];

	if (!allowed(pl, n, t)) {
		place_compute(pl, n);
		return;
	}
	pl->p->task[n] = t;
	pl->p->why[n] = "colocated";
	pl->load[t] += 1;
}

static enum dg_status placer_init(struct placer *pl, struct dg_err *err)
{
	const struct dg_graph *g = pl->g;
	int nt = pl->c->n_tasks;

	pl->p->n_nodes = g->n_nodes;
	pl->p->task = malloc(((size_t)g->n_nodes + 1) * sizeof *pl->p->task);
	pl->p->why = calloc((size_t)g->n_nodes + 1, sizeof *pl->p->why);
	pl->p->soft = calloc((size_t)g->n_nodes + 1, sizeof *pl->p->soft);
	pl->p->gpu = malloc(((size_t)g->n_nodes + 1) * sizeof *pl->p->gpu);
	pl->spec = calloc((size_t)g->n_nodes + 1, sizeof *pl->spec);
	pl->spec_buf = calloc((size_t)g->n_nodes + 1, sizeof *pl->spec_buf);
	pl->deferred = calloc((size_t)g->n_nodes + 1, sizeof *pl->deferred);
	pl->load = calloc((size_t)nt + 1, sizeof *pl->load);
	pl->gpu_load = calloc((size_t)nt + 1, sizeof *pl->gpu_load);
	pl->bytes = calloc((size_t)nt + 1, sizeof *pl->bytes);
	if (!pl->p->task || !pl->p->why || !pl->p->soft || !pl->p->gpu || !pl->spec ||
	    !pl->spec_buf || !pl->deferred || !pl->load || !pl->gpu_load || !pl->bytes)
		return dg_err_set(err, DG_ENOMEM, "out of memory placing %d nodes", g->n_nodes);
	for (int n = 0; n < g->n_nodes; n++)
		pl->p->task[n] = pl->p->gpu[n] = -1;
	for (int t = 0; t < nt; t++)
		pl->bytes[t] = pl->o && pl->o->task_bytes ? (double)pl->o->task_bytes[t] : 0;
	pl->n_ps = dg_cluster_job_size(pl->c, "ps");
	for (int n = 0; n < g->n_nodes; n++) {
		const struct dg_node *nd = &g->nodes[n];
		pl->spec[n].task = -1;
		if (!nd->device || !nd->device[0])
			continue;
		pl->spec_buf[n] = strdup(nd->device);
		if (!pl->spec_buf[n])
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		if (!parse_device(pl->spec_buf[n], &pl->spec[n])) {
			dg_err_set(err, DG_EINVAL, "node '%s': device '%.128s' is not a device "
				   "name", nd->name, nd->device);
			dg_err_hint(err, "write /job:NAME/task:I, optionally followed by /cpu:0 or "
				    "/gpu:K (or /device:GPU:K)");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}

static void placer_deinit(struct placer *pl)
{
	for (int n = 0; pl->spec_buf && n < pl->g->n_nodes; n++)
		free(pl->spec_buf[n]);
	free(pl->spec_buf);
	free(pl->spec);
	free(pl->deferred);
	free(pl->load);
	free(pl->gpu_load);
	free(pl->bytes);
}

enum dg_status place_graph(const struct dg_graph *g, const struct dg_cluster *c,
			   const struct place_opts *opts, struct placement *out,
			   struct dg_err *err)
{
	struct placer pl = { .g = g, .c = c, .o = opts, .p = out };
	enum dg_status st;

	memset(out, 0, sizeof *out);
	if (c->n_tasks == 0)
		return dg_err_set(err, DG_EINVAL, "the cluster has no tasks to place the graph on");
	st = placer_init(&pl, err);
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
		st = check_spec(&pl, n, err);
	/* An explicit GPU holds (its task has one, or soft placement moved it). */
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
		if (pl.spec[n].gpu && !out->soft[n])
			out->gpu[n] = pl.spec[n].gpu_index;
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
		if (is_apply(&g->nodes[n]))
			st = check_apply(g, n, err);
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++)
		if (is_variable(&g->nodes[n]))
			place_variable(&pl, n);
	/* Computation in topological order, so every input's task is known (or
	 * deferred) when its consumer is placed. */
	for (int i = 0; st == DG_OK && i < g->n_nodes; i++) {
		int n = g->order[i];
		const struct dev_spec *d = &pl.spec[n];
		if (is_variable(&g->nodes[n]))
			continue;
		if (g->nodes[n].n_in == 0 && !(d->job && d->task >= 0))
			pl.deferred[n] = true;
		else if (is_apply(&g->nodes[n]) && !(d->job && d->task >= 0) &&
			 out->task[g->nodes[n].in[0].node] >= 0)
			place_with_gradient(&pl, n);
		else
			place_compute(&pl, n);
	}
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++) {
		if (out->task[n] >= 0 || is_variable(&g->nodes[n]))
			continue;
		out->task[n] = least_loaded(&pl, n);
		out->why[n] = "cost";
		pl.load[out->task[n]] += work_est(g, n);
	}
	for (int n = 0; st == DG_OK && n < g->n_nodes; n++) {
		if (out->task[n] < 0) {
			st = dg_err_set(err, DG_EINVAL, "node '%s': no task of the cluster "
					"fits its device '%s'", g->nodes[n].name,
					g->nodes[n].device ? g->nodes[n].device : "");
		}
	}
	placer_deinit(&pl);
	if (st != DG_OK)
		placement_deinit(out);
	return st;
}

void placement_deinit(struct placement *p)
{
	if (!p)
		return;
	free(p->task);
	free(p->why);
	free(p->soft);
	free(p->gpu);
	memset(p, 0, sizeof *p);
}

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

	if (is_variable(nd)) {
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
		if (is_apply(&ct->g->nodes[n])) {
			int v = apply_target(ct->g, n, err);
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

/* ApplyGradient n as a VarApply on its task (inputs taken): the Variable's
 * ps var name and address, the other attrs as given. */
static enum dg_status cut_apply(struct cutter *ct, int n, json_t *inputs, struct dg_err *err)
{
	const struct dg_node *nd = &ct->g->nodes[n];
	int v = apply_target(ct->g, n, err);
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
	json_object_set_new(a, "ps", json_string(ct->c->tasks[ct->p->task[v]].address));
	return add_node(&ct->main[ct->p->task[n]], nd->name, "VarApply", inputs, a, err);
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
	if (is_variable(nd)) {
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
	if (!inputs)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; st == DG_OK && i < nd->n_in; i++) {
		st = value_on(ct, t, nd->in[i], name, err);
		if (st == DG_OK)
			json_array_append_new(inputs, json_string(name));
	}
	if (st != DG_OK) {
		json_decref(inputs);
		return st;
	}
	if (is_apply(nd))
		return cut_apply(ct, n, inputs, err);
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
		if (nd->n_out != 1 || is_variable(nd)) {
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
		int src = is_variable(&g->nodes[fe[i].node]) ? ct->master : ct->p->task[fe[i].node];
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
