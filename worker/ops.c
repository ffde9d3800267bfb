/* The worker-only ops of fragments (_Send, _Recv, VarRead, VarApply, VarInit,
 * VarGather):
 * their schemas and inference, which check every attr when a fragment is
 * registered. worker_ops_register adds them to the one op registry
 * (kernels/registry.c) as layer DG_OPL_WORKER, and worker_op_find is the
 * registry's view of kernel and worker ops. They have no kernel: the executor
 * (executor.c) runs them, since they need the step, the rendezvous and the
 * network. */
#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "dg/client.h"
#include "dg/kernels.h"
#include "dg/log.h"

enum dg_status worker_check_address(const char *what, const char *addr, struct dg_err *err)
{
	char host[256];
	int port = 0;

	if (dg_split_host_port(addr, host, sizeof host, &port, err) != DG_OK || port <= 0 ||
	    port > 65535 || !host[0]) {
		dg_err_set(err, DG_EINVAL, "attr '%s' must be \"host:port\", got '%.80s'", what,
			   addr);
		return DG_EINVAL;
	}
	return DG_OK;
}

static enum dg_status infer_send(struct dg_infer_ctx *c)
{
	const char *key, *to;

	if (dg_attr_string(c->attrs, "key", NULL, &key, c->err) != DG_OK ||
	    dg_attr_string(c->attrs, "to", NULL, &to, c->err) != DG_OK)
		return c->err->code;
	if (dg_rendezvous_key_check(key, c->err) != DG_OK)
		return c->err->code;
	return worker_check_address("to", to, c->err);
}

/* dtype + shape attrs into out (shape may be partial when allow_unknown). */
static enum dg_status typed_output(struct dg_infer_ctx *c, bool allow_unknown)
{
	if (dg_attr_dtype(c->attrs, "dtype", NULL, &c->out[0].dtype, c->err) != DG_OK)
		return c->err->code;
	return dg_attr_shape(c->attrs, "shape", !allow_unknown, allow_unknown, &c->out[0].shape,
			     c->err);
}

static enum dg_status infer_recv(struct dg_infer_ctx *c)
{
	const char *key;

	if (dg_attr_string(c->attrs, "key", NULL, &key, c->err) != DG_OK ||
	    dg_rendezvous_key_check(key, c->err) != DG_OK)
		return c->err->code;
	return typed_output(c, true);
}

/* "var" and "ps": a valid variable name on a "host:port". */
static enum dg_status check_var(struct dg_infer_ctx *c)
{
	const char *var, *ps;

	if (dg_attr_string(c->attrs, "var", NULL, &var, c->err) != DG_OK ||
	    dg_attr_string(c->attrs, "ps", NULL, &ps, c->err) != DG_OK)
		return c->err->code;
	if (dg_var_name_check(var, c->err) != DG_OK) {
		dg_err_prefix(c->err, "attr 'var'");
		return c->err->code;
	}
	return worker_check_address("ps", ps, c->err);
}

static enum dg_status infer_var_read(struct dg_infer_ctx *c)
{
	int64_t base, none = -1;

	if (check_var(c) != DG_OK ||
	    dg_attr_int(c->attrs, "min_step_base", &none, &base, c->err) != DG_OK)
		return c->err->code;
	if (base < -1)
		return dg_err_set(c->err, DG_EINVAL, "attr 'min_step_base' must be >= 0 (or -1: "
				  "no wait), got %lld", (long long)base);
	return typed_output(c, true);
}

static void version_output(struct dg_infer_ctx *c)
{
	c->out[0].dtype = DG_I64;
	c->out[0].shape.ndim = 0;
}

/* An int attr in lo..hi (def when absent). */
static enum dg_status int_in(struct dg_infer_ctx *c, const char *key, int64_t def, int64_t lo,
			     int64_t hi, int64_t *out)
{
	if (dg_attr_int(c->attrs, key, &def, out, c->err) != DG_OK)
		return c->err->code;
	if (*out < lo || *out > hi)
		return dg_err_set(c->err, DG_EINVAL, "attr '%s' must be %lld..%lld, got %lld", key,
				  (long long)lo, (long long)hi, (long long)*out);
	return DG_OK;
}

/* The training attrs of VarApply: lr schedule and synchronous mode. */
static enum dg_status check_schedule_sync(struct dg_infer_ctx *c)
{
	static const char *const kinds[] = { "constant", "step", "exponential" };
	int64_t every, replicas, backup, replica, base;
	double factor, one = 1;
	const char *kind;
	bool sync, no = false, known = false;

	if (dg_attr_string(c->attrs, "schedule", "constant", &kind, c->err) != DG_OK)
		return c->err->code;
	for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
		known |= strcmp(kind, kinds[i]) == 0;
	if (!known) {
		dg_err_set(c->err, DG_EINVAL, "attr 'schedule' is '%.40s'", kind);
		dg_err_hint(c->err, "schedules: constant, step, exponential");
		return DG_EINVAL;
	}
	if (int_in(c, "every", 1, 1, INT64_MAX, &every) != DG_OK ||
	    dg_attr_float(c->attrs, "factor", &one, &factor, c->err) != DG_OK)
		return c->err->code;
	if (!isfinite(factor) || factor <= 0)
		return dg_err_set(c->err, DG_EINVAL, "attr 'factor' must be a finite number > 0, "
				  "got %g", factor);
	if (dg_attr_bool(c->attrs, "sync", &no, &sync, c->err) != DG_OK ||
	    int_in(c, "replicas", 1, 1, 1 << 20, &replicas) != DG_OK ||
	    int_in(c, "backup", 0, 0, replicas - 1, &backup) != DG_OK ||
	    int_in(c, "replica", -1, -1, replicas - 1, &replica) != DG_OK ||
	    int_in(c, "step_base", 0, 0, INT64_MAX / 2, &base) != DG_OK)
		return c->err->code;
	return DG_OK;
}

static enum dg_status infer_var_apply(struct dg_infer_ctx *c)
{
	static const char *const rules[] = { "assign", "assign_add", "sgd", "momentum", "adam",
					     "adagrad", "rmsprop", "moving_average" };
	static const char *const num[] = { "lr", "momentum", "beta1", "beta2", "eps", "rho",
					   "init", "decay" };
	const char *rule;
	double v;
	bool known = false;

	if (check_var(c) != DG_OK ||
	    dg_attr_string(c->attrs, "rule", NULL, &rule, c->err) != DG_OK)
		return c->err->code;
	for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
		known |= strcmp(rule, rules[i]) == 0;
	if (!known) {
		dg_err_set(c->err, DG_EINVAL, "attr 'rule' is '%.40s'", rule);
		dg_err_hint(c->err, "rules: assign, assign_add, sgd, momentum, adam, adagrad, rmsprop, "
			    "moving_average");
		return DG_EINVAL;
	}
	if (check_schedule_sync(c) != DG_OK)
		return c->err->code;
	if (c->n_in == 2) {
		/* row-wise: input 1 the rows of dim 0 (rank 1), input 0 their values */
		const struct dg_ttype *val = &c->in[0], *ix = &c->in[1];
		if (ix->dtype != DG_I32 && ix->dtype != DG_I64)
			return dg_err_set(c->err, DG_EDTYPE, "row-wise VarApply: the rows (input 1) "
					  "are %s, not int32 or int64", dg_dtype_name(ix->dtype));
		/* the worker sums repeated rows' values in their dtype */
		if (val->dtype != DG_F32 && val->dtype != DG_F64)
			return dg_err_set(c->err, DG_EDTYPE, "row-wise VarApply: the values (input "
					  "0) are %s, not float32 or float64",
					  dg_dtype_name(val->dtype));
		if (ix->shape.ndim != 1 || val->shape.ndim < 1)
			return dg_err_set(c->err, DG_ESHAPE, "row-wise VarApply: the rows (input 1) "
					  "must be a vector and the values (input 0) [n, ...]");
		if (ix->shape.dim[0] >= 0 && val->shape.dim[0] >= 0 &&
		    ix->shape.dim[0] != val->shape.dim[0])
			return dg_err_set(c->err, DG_ESHAPE, "row-wise VarApply: %lld rows but %lld "
					  "rows of values", (long long)ix->shape.dim[0],
					  (long long)val->shape.dim[0]);
	}
	for (size_t i = 0; i < sizeof num / sizeof *num; i++) {
		double zero = 0;
		if (dg_attr_float(c->attrs, num[i], &zero, &v, c->err) != DG_OK)
			return c->err->code;
		if (!isfinite(v) || v < 0)
			return dg_err_set(c->err, DG_EINVAL, "attr '%s' must be a finite number "
					  ">= 0, got %g", num[i], v);
	}
	version_output(c);
	return DG_OK;
}

/* VarGather: Gather(variable, indices) read from the ps, rows only. */
static enum dg_status infer_var_gather(struct dg_infer_ctx *c)
{
	const struct dg_ttype *ix = &c->in[0];
	struct dg_shape vs;
	enum dg_dtype dt;
	int64_t base, none = -1;

	if (check_var(c) != DG_OK ||
	    dg_attr_int(c->attrs, "min_step_base", &none, &base, c->err) != DG_OK ||
	    dg_attr_dtype(c->attrs, "dtype", NULL, &dt, c->err) != DG_OK ||
	    dg_attr_shape(c->attrs, "shape", true, true, &vs, c->err) != DG_OK)
		return c->err->code;
	if (base < -1)
		return dg_err_set(c->err, DG_EINVAL, "attr 'min_step_base' must be >= 0 (or -1: "
				  "no wait), got %lld", (long long)base);
	if (ix->dtype != DG_I32 && ix->dtype != DG_I64)
		return dg_err_set(c->err, DG_EDTYPE, "VarGather: the indices are %s, not int32 or "
				  "int64", dg_dtype_name(ix->dtype));
	if (vs.ndim < 1)
		return dg_err_set(c->err, DG_ESHAPE, "VarGather: the variable is a scalar");
	if (ix->shape.ndim < 0) {
		c->out[0].dtype = dt;
		c->out[0].shape.ndim = -1;
		return DG_OK;
	}
	if (ix->shape.ndim + vs.ndim - 1 > DG_MAX_DIMS)
		return dg_err_set(c->err, DG_ESHAPE, "VarGather: the result would have more than "
				  "%d dims", DG_MAX_DIMS);
	c->out[0].dtype = dt;
	c->out[0].shape = ix->shape;
	for (int i = 1; i < vs.ndim; i++)
		c->out[0].shape.dim[c->out[0].shape.ndim++] = vs.dim[i];
	return DG_OK;
}

static enum dg_status infer_var_init(struct dg_infer_ctx *c)
{
	static const char *const inits[] = { "zeros", "ones", "uniform", "normal", "glorot" };
	const char *init;
	struct dg_shape shape;
	enum dg_dtype dt;
	int64_t numel, seed, zero = 0;
	double scale, one = 1;
	bool known = false, no = false, reset;

	if (check_var(c) != DG_OK ||
	    dg_attr_dtype(c->attrs, "dtype", NULL, &dt, c->err) != DG_OK ||
	    dg_attr_shape(c->attrs, "shape", true, false, &shape, c->err) != DG_OK ||
	    dg_shape_numel(&shape, &numel, c->err) != DG_OK ||
	    dg_attr_string(c->attrs, "init", "zeros", &init, c->err) != DG_OK ||
	    dg_attr_float(c->attrs, "scale", &one, &scale, c->err) != DG_OK ||
	    dg_attr_int(c->attrs, "seed", &zero, &seed, c->err) != DG_OK ||
	    dg_attr_bool(c->attrs, "reset", &no, &reset, c->err) != DG_OK)
		return c->err->code;
	for (size_t i = 0; i < sizeof inits / sizeof *inits; i++)
		known |= strcmp(init, inits[i]) == 0;
	if (!known) {
		dg_err_set(c->err, DG_EINVAL, "attr 'init' is '%.40s'", init);
		dg_err_hint(c->err, "initialisers: zeros, ones, uniform, normal, glorot");
		return DG_EINVAL;
	}
	if (!isfinite(scale))
		return dg_err_set(c->err, DG_EINVAL, "attr 'scale' must be finite");
	version_output(c);
	return DG_OK;
}

static const struct dg_attr_spec send_attrs[] = {
	{ "key", DG_ATTR_STRING, true, "the tensor's name within the step" },
	{ "to", DG_ATTR_STRING, true, "host:port of the receiving task" },
	{ NULL, 0, false, NULL },
};
static const struct dg_attr_spec recv_attrs[] = {
	{ "key", DG_ATTR_STRING, true, "the tensor's name within the step" },
	{ "dtype", DG_ATTR_DTYPE, true, "the expected dtype" },
	{ "shape", DG_ATTR_SHAPE, false, "the expected shape (-1: any size)" },
	{ NULL, 0, false, NULL },
};
static const struct dg_attr_spec var_read_attrs[] = {
	{ "var", DG_ATTR_STRING, true, "variable name" },
	{ "ps", DG_ATTR_STRING, true, "host:port of the ps holding it" },
	{ "dtype", DG_ATTR_DTYPE, true, "the variable's dtype" },
	{ "shape", DG_ATTR_SHAPE, false, "the variable's shape" },
	{ "min_step_base", DG_ATTR_INT, false, "sync: at training step t wait until the "
	  "variable's sync step is min_step_base + t (default -1: no wait)" },
	{ NULL, 0, false, NULL },
};
static const struct dg_attr_spec var_apply_attrs[] = {
	{ "var", DG_ATTR_STRING, true, "variable name" },
	{ "ps", DG_ATTR_STRING, true, "host:port of the ps holding it" },
	{ "rule", DG_ATTR_STRING, true, "assign, assign_add, sgd, momentum, adam, adagrad, "
	  "rmsprop or moving_average" },
	{ "lr", DG_ATTR_FLOAT, false, "learning rate" },
	{ "momentum", DG_ATTR_FLOAT, false, "momentum (momentum, rmsprop)" },
	{ "nesterov", DG_ATTR_BOOL, false, "Nesterov momentum" },
	{ "beta1", DG_ATTR_FLOAT, false, "adam beta1" },
	{ "beta2", DG_ATTR_FLOAT, false, "adam beta2" },
	{ "eps", DG_ATTR_FLOAT, false, "adam/rmsprop epsilon" },
	{ "rho", DG_ATTR_FLOAT, false, "rmsprop decay (default: the ps's 0.9)" },
	{ "init", DG_ATTR_FLOAT, false, "adagrad/rmsprop slot start (default: the ps's)" },
	{ "decay", DG_ATTR_FLOAT, false, "moving_average: w = decay w + (1 - decay) input "
	  "(default 0.99)" },
	{ "schedule", DG_ATTR_STRING, false, "lr at training step t: constant (default), step "
	  "(lr*factor^floor(t/every)), exponential (lr*factor^(t/every))" },
	{ "every", DG_ATTR_INT, false, "schedule period in training steps (default 1)" },
	{ "factor", DG_ATTR_FLOAT, false, "schedule factor (default 1)" },
	{ "sync", DG_ATTR_BOOL, false, "synchronous apply of step step_base + t" },
	{ "replicas", DG_ATTR_INT, false, "sync: replicas per step (default 1)" },
	{ "backup", DG_ATTR_INT, false, "sync: apply after replicas - backup arrivals" },
	{ "replica", DG_ATTR_INT, false, "sync: this replica's id (default -1: anonymous)" },
	{ "step_base", DG_ATTR_INT, false, "sync: the ps step of training step 0" },
	{ NULL, 0, false, NULL },
};
static const struct dg_attr_spec var_gather_attrs[] = {
	{ "var", DG_ATTR_STRING, true, "variable name" },
	{ "ps", DG_ATTR_STRING, true, "host:port of the ps holding it" },
	{ "dtype", DG_ATTR_DTYPE, true, "the variable's dtype" },
	{ "shape", DG_ATTR_SHAPE, true, "the variable's shape (rank >= 1)" },
	{ "min_step_base", DG_ATTR_INT, false, "sync: at training step t wait until the "
	  "variable's sync step is min_step_base + t (default -1: no wait)" },
	{ NULL, 0, false, NULL },
};
static const struct dg_attr_spec var_init_attrs[] = {
	{ "var", DG_ATTR_STRING, true, "variable name" },
	{ "ps", DG_ATTR_STRING, true, "host:port of the ps holding it" },
	{ "dtype", DG_ATTR_DTYPE, true, "dtype" },
	{ "shape", DG_ATTR_SHAPE, true, "shape (fully known)" },
	{ "init", DG_ATTR_STRING, false, "zeros (default), ones, uniform, normal, glorot" },
	{ "scale", DG_ATTR_FLOAT, false, "range, stddev or glorot gain (default 1)" },
	{ "seed", DG_ATTR_INT, false, "random seed (default 0)" },
	{ "reset", DG_ATTR_BOOL, false, "replace the variable even when it exists" },
	{ NULL, 0, false, NULL },
};

static const struct dg_op_def worker_ops[] = {
	{ .name = "_Send", .min_inputs = 1, .max_inputs = 1, .n_outputs = 0,
	  .attrs = send_attrs, .infer = infer_send, .flags = DG_OPF_STATEFUL,
	  .doc = "push the input to another task's rendezvous (worker fragments only)" },
	{ .name = "_Recv", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = recv_attrs, .infer = infer_recv, .flags = DG_OPF_SOURCE | DG_OPF_STATEFUL,
	  .doc = "wait for a tensor sent to this task in this step" },
	{ .name = "VarRead", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = var_read_attrs, .infer = infer_var_read,
	  .flags = DG_OPF_SOURCE | DG_OPF_STATEFUL, .doc = "read a variable from its ps" },
	{ .name = "VarApply", .min_inputs = 1, .max_inputs = 2, .n_outputs = 1,
	  .attrs = var_apply_attrs, .infer = infer_var_apply, .flags = DG_OPF_STATEFUL,
	  .doc = "apply an update rule to a variable on its ps (with input 1, to the rows it "
		 "names: input 0 holds their values); outputs the new version" },
	{ .name = "VarInit", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = var_init_attrs, .infer = infer_var_init,
	  .flags = DG_OPF_SOURCE | DG_OPF_STATEFUL,
	  .doc = "create a variable on its ps unless it exists (or replace it: reset); outputs "
		 "its version" },
	{ .name = "VarGather", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = var_gather_attrs, .infer = infer_var_gather, .flags = DG_OPF_STATEFUL,
	  .doc = "Gather(variable, indices) from its ps: only the rows the indices name travel" },
};
#define N_WORKER_OPS ((int)(sizeof worker_ops / sizeof *worker_ops))

static pthread_once_t registered = PTHREAD_ONCE_INIT;

static void register_ops(void)
{
	struct dg_err err = { 0 };

	for (int i = 0; i < N_WORKER_OPS; i++)
		if (dg_op_register(DG_OPL_WORKER, &worker_ops[i], &err) != DG_OK)
			dg_log(DG_LOG_ERROR, "worker", "%s", err.msg);   /* a name clash: our bug */
	worker_queue_ops_register();
}

void worker_ops_register(void)
{
	pthread_once(&registered, register_ops);
}

const struct dg_op_def *worker_op_find(const char *name)
{
	worker_ops_register();
	return dg_op_find_in(name, DG_OPL_KERNEL | DG_OPL_WORKER);
}

enum worker_opkind worker_op_kind(const struct dg_op_def *op)
{
	if (op < worker_ops || op >= worker_ops + N_WORKER_OPS)
		return worker_queue_op_kind(op);
	return (enum worker_opkind)(WOP_SEND + (op - worker_ops));
}

/* splitmix64: a small, well-mixed generator; reproducible from the seed. */
static uint64_t next_u64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so log() below is finite. */
static double next_unit(uint64_t *s)
{
	return ((double)(next_u64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

struct dg_tensor *worker_init_tensor(const json_t *attrs, struct dg_err *err)
{
	const char *init;
	struct dg_shape shape;
	enum dg_dtype dt;
	int64_t seed, zero = 0;
	double scale, one = 1, limit;
	struct dg_tensor *t;

	if (dg_attr_dtype(attrs, "dtype", NULL, &dt, err) != DG_OK ||
	    dg_attr_shape(attrs, "shape", true, false, &shape, err) != DG_OK ||
	    dg_attr_string(attrs, "init", "zeros", &init, err) != DG_OK ||
	    dg_attr_float(attrs, "scale", &one, &scale, err) != DG_OK ||
	    dg_attr_int(attrs, "seed", &zero, &seed, err) != DG_OK)
		return NULL;
	if (!(t = dg_tensor_new(dt, &shape, err)) || strcmp(init, "zeros") == 0)
		return t;
	uint64_t s = (uint64_t)seed;
	if (strcmp(init, "glorot") == 0) {
		/* The fans as GlorotUniform (and TensorFlow) take them: with the
		 * receptive field of the leading dims (kernels' one rule). */
		limit = scale * dg_glorot_limit_shape(&shape);
	} else {
		limit = scale;
	}
	for (int64_t i = 0; i < t->numel; i++) {
		double v;
		if (strcmp(init, "ones") == 0) {
			v = 1;
		} else if (strcmp(init, "normal") == 0) {
			double u1 = next_unit(&s), u2 = next_unit(&s);
			v = scale * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
		} else {
			v = limit * (2.0 * next_unit(&s) - 1.0);
		}
		dg_tensor_set_f64(t, i, v);
	}
	return t;
}
