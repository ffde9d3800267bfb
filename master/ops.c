/* The master's own ops (doc/ops.md): Variable (a variable on a ps task, read
 * by the replicas that use it) and the ops that update it on its ps
 * (ApplyGradient, AssignMovingAverage, Assign, AssignAdd), their schemas and shape inference, and the graph questions placement
 * and partitioning ask about them. Neighbours: place.c and partition.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/buf.h"
#include "dg/kernels.h"
#include "dg/log.h"
#include "dg/place.h"
#include "internal.h"

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
	MASTER_RULE_ATTRS,
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
	if (strcmp(rule, "sgd") && strcmp(rule, "momentum") && strcmp(rule, "adam") &&
	    strcmp(rule, "adagrad") && strcmp(rule, "rmsprop")) {
		dg_err_set(c->err, DG_EINVAL, "attr 'rule' is '%.64s'", rule);
		dg_err_hint(c->err, "use sgd, momentum, adam, adagrad or rmsprop");
		return DG_EINVAL;
	}
	if (c->n_in == 2 && (c->in[1].dtype != DG_I32 && c->in[1].dtype != DG_I64))
		return dg_err_set(c->err, DG_EDTYPE, "the rows (input 1) are %s; they must be "
				  "int32 or int64", dg_dtype_name(c->in[1].dtype));
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
	.max_inputs = 2,
	.n_outputs = 1,
	.attrs = apply_attrs,
	.infer = apply_infer,
	.flags = DG_OPF_STATEFUL,
	.doc = "apply the input gradient to a Variable with an update rule on its ps (with "
	       "input 1, a row-wise gradient: input 0 the values of the rows input 1 names); "
	       "outputs the new version (training jobs)",
};

/* ---------------------------------------------------- AssignMovingAverage op */

static const struct dg_attr_spec ema_attrs[] = {
	{ "variable", DG_ATTR_STRING, true, "the Variable node averaged (not trained)" },
	{ "decay", DG_ATTR_FLOAT, false, "variable = decay variable + (1 - decay) input "
	  "(default 0.99)" },
	{ NULL, 0, false, NULL },
};

static enum dg_status ema_infer(struct dg_infer_ctx *c)
{
	double def = 0.99, decay;
	enum dg_status st = dg_attr_float(c->attrs, "decay", &def, &decay, c->err);

	if (st != DG_OK)
		return st;
	if (!(decay >= 0 && decay <= 1))
		return dg_err_set(c->err, DG_EINVAL, "attr 'decay' is %g; it must be in [0, 1]",
				  decay);
	if (!dg_dtype_is_float(c->in[0].dtype))
		return dg_err_set(c->err, DG_EDTYPE, "the value is %s; it must be a float",
				  dg_dtype_name(c->in[0].dtype));
	c->out[0].dtype = DG_I64;
	c->out[0].shape.ndim = 0;
	return DG_OK;
}

/* Run on every training step like the gradients' applies (batch norm's
 * moving mean and variance); partitioned as a VarApply of rule
 * moving_average, placed like an ApplyGradient (with its input). */
static const struct dg_op_def ema_def = {
	.name = "AssignMovingAverage",
	.min_inputs = 1,
	.max_inputs = 1,
	.n_outputs = 1,
	.attrs = ema_attrs,
	.infer = ema_infer,
	.flags = DG_OPF_STATEFUL,
	.doc = "update a Variable on its ps to decay * itself + (1 - decay) * the input (an "
	       "exponential moving average, e.g. of FusedBatchNorm's batch moments); a "
	       "training job runs it every step; outputs the new version",
};

/* ------------------------------------------------------ Assign, AssignAdd */

static const struct dg_attr_spec assign_attrs[] = {
	{ "variable", DG_ATTR_STRING, true, "the Variable node written" },
	{ NULL, 0, false, NULL },
};

/* The value's dtype and shape are checked against the Variable's by
 * master_check_apply, like a gradient's. */
static enum dg_status assign_infer(struct dg_infer_ctx *c)
{
	c->out[0].dtype = DG_I64;
	c->out[0].shape.ndim = 0;
	return DG_OK;
}

/* TensorFlow's tf.assign and tf.assign_add (Python's initialisers run them);
 * partitioned as a VarApply of rule assign or assign_add, placed like an
 * ApplyGradient (with its input). */
static const struct dg_op_def assign_def = {
	.name = "Assign",
	.min_inputs = 1,
	.max_inputs = 1,
	.n_outputs = 1,
	.attrs = assign_attrs,
	.infer = assign_infer,
	.flags = DG_OPF_STATEFUL,
	.doc = "write the input into a Variable on its ps (its dtype and shape); outputs "
	       "the variable's new version",
};

static const struct dg_op_def assign_add_def = {
	.name = "AssignAdd",
	.min_inputs = 1,
	.max_inputs = 1,
	.n_outputs = 1,
	.attrs = assign_attrs,
	.infer = assign_infer,
	.flags = DG_OPF_STATEFUL,
	.doc = "add the input to a Variable on its ps (its dtype and shape); outputs the "
	       "variable's new version",
};

/* The ps rule an apply node of the master runs (VarApply's attr 'rule'), or
 * NULL for ApplyGradient, whose attrs carry it. */
const char *master_apply_rule(const struct dg_node *n)
{
	if (n->op == &ema_def)
		return "moving_average";
	if (n->op == &assign_def)
		return "assign";
	if (n->op == &assign_add_def)
		return "assign_add";
	return NULL;
}

const struct dg_op_def *place_apply_gradient_op(void)
{
	return &apply_def;
}

static pthread_once_t registered = PTHREAD_ONCE_INIT;

static void register_ops(void)
{
	const struct dg_op_def *ops[] = { &variable_def, &apply_def, &ema_def, &assign_def,
					   &assign_add_def, master_minimize_op(), master_queue_op() };
	struct dg_err err = { 0 };

	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
		if (dg_op_register(DG_OPL_MASTER, ops[i], &err) != DG_OK)
			dg_log(DG_LOG_ERROR, "master", "%s", err.msg);   /* a name clash: our bug */
}

void master_ops_register(void)
{
	pthread_once(&registered, register_ops);
	worker_ops_register();          /* the queue ops serve the master's graphs too */
}

const struct dg_op_def *master_op_find(const char *name)
{
	master_ops_register();
	return dg_op_find_in(name, DG_OPL_KERNEL | DG_OPL_MASTER);
}

bool master_is_variable(const struct dg_node *n)
{
	return n->op == &variable_def;
}

bool master_is_apply(const struct dg_node *n)
{
	return n->op == &apply_def || n->op == &ema_def || n->op == &assign_def ||
	       n->op == &assign_add_def;
}

/* The Variable node an ApplyGradient updates, or -1 with *err set. */
int master_apply_target(const struct dg_graph *g, int n, struct dg_err *err)
{
	const struct dg_node *nd = &g->nodes[n];
	const char *var = json_string_value(json_object_get(nd->attrs, "variable"));
	int v = var ? dg_graph_find(g, var) : -1;

	if (v < 0 || !master_is_variable(&g->nodes[v])) {
		dg_err_set(err, DG_EINVAL, "node '%s' (%s): attr 'variable' '%.128s' is not a "
			   "Variable node of the graph", nd->name, nd->op->name, var ? var : "");
		dg_err_hint(err, "name the Variable node the gradient belongs to");
		return -1;
	}
	return v;
}

/* The gradient must have the Variable's dtype and (where known) shape. */
enum dg_status master_check_apply(const struct dg_graph *g, int n, struct dg_err *err)
{
	const struct dg_node *nd = &g->nodes[n];
	int v = master_apply_target(g, n, err);
	const struct dg_ttype *gt, *vt;

	if (v < 0)
		return DG_EINVAL;
	gt = &g->nodes[nd->in[0].node].out[nd->in[0].index];
	vt = &g->nodes[v].out[0];
	if (gt->dtype != vt->dtype) {
		dg_err_set(err, DG_EDTYPE, "node '%s' (%s): the input is %s but variable '%s' is "
			   "%s", nd->name, nd->op->name, dg_dtype_name(gt->dtype),
			   g->nodes[v].name, dg_dtype_name(vt->dtype));
		return DG_EDTYPE;
	}
	bool rows = nd->n_in == 2;      /* values [n] + shape[1:] */
	bool ok = gt->shape.ndim < 0 || (gt->shape.ndim == vt->shape.ndim && (!rows || vt->shape.ndim));
	for (int i = rows ? 1 : 0; ok && gt->shape.ndim > 0 && i < gt->shape.ndim; i++)
		ok = gt->shape.dim[i] < 0 || gt->shape.dim[i] == vt->shape.dim[i];
	if (!ok) {
		dg_err_set(err, DG_ESHAPE, "node '%s' (%s): the input's shape does not match "
			   "variable '%s'", nd->name, nd->op->name, g->nodes[v].name);
		dg_err_hint(err, rows ? "row-wise: the values must be [n] + the variable's shape "
				   "without its first dim" : "the gradient must have the variable's "
				   "shape");
		return DG_ESHAPE;
	}
	return DG_OK;
}

