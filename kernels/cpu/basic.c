/* The basic ops every graph starts from: Const (a JSON tensor literal),
 * Placeholder (a value fed at run time; worker/exec.c substitutes the feed and
 * never runs its kernel) and Identity. registry.c collects dg_ops_basic. */
#include "cpu.h"
#include "grad.h"

#include <string.h>

/* --- Const --------------------------------------------------------------- */

/* The attr dtype (optional) forces the literal's type; a literal object with
 * its own "dtype" must agree with it. *have is false when the attr is absent. */
static enum dg_status const_dtype(struct dg_attrs attrs, enum dg_dtype *dt, bool *have,
				  struct dg_err *err)
{
	const json_t *value = dg_attrs_get(attrs, "value");
	const json_t *own = json_is_object(value) ? json_object_get(value, "dtype") : NULL;
	enum dg_dtype lit;
	enum dg_status st;

	*have = dg_attrs_get(attrs, "dtype") != NULL;
	if (!*have)
		return DG_OK;
	st = dg_attrs_dtype(attrs, "dtype", NULL, dt, err);
	if (st != DG_OK || !own)
		return st;
	st = dg_attr_dtype(value, "dtype", NULL, &lit, err);
	if (st == DG_OK && lit != *dt) {
		dg_err_set(err, DG_EDTYPE, "attr 'dtype' is %s but the value says %s",
			   dg_dtype_name(*dt), dg_dtype_name(lit));
		dg_err_hint(err, "drop one of the two dtypes");
		return DG_EDTYPE;
	}
	return st;
}

/* Type of the literal without materialising it when it is one scalar spread
 * over a declared shape ({"shape": [1000,1000], "value": 0}): that form can
 * describe a huge tensor in a few bytes, and validation must stay cheap. */
static enum dg_status const_type(struct dg_attrs attrs, struct dg_ttype *out, struct dg_err *err)
{
	const json_t *value = dg_attrs_get(attrs, "value");
	enum dg_dtype dt;
	bool have_dt;
	enum dg_status st = const_dtype(attrs, &dt, &have_dt, err);
	struct dg_tensor *t;

	if (st != DG_OK)
		return st;
	if (json_is_object(value) && json_object_get(value, "shape") &&
	    !json_is_array(json_object_get(value, "value"))) {
		/* Every key but "shape", so an unknown key fails here as it would in
		 * the kernel (a graph that validates must not fail on its Const). */
		json_t *scalar = json_object();
		const char *key;
		json_t *v;
		if (!scalar)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		json_object_foreach((json_t *)value, key, v) {
			if (strcmp(key, "shape") == 0)
				continue;
			if (json_object_set(scalar, key, v) != 0) {
				json_decref(scalar);
				return dg_err_set(err, DG_ENOMEM, "out of memory");
			}
		}
		t = dg_json_to_tensor(scalar, have_dt ? &dt : NULL, err);
		json_decref(scalar);
		if (!t)
			return err ? err->code : DG_EINVAL;
		out->dtype = t->dtype;
		dg_tensor_free(t);
		return dg_attr_shape(value, "shape", true, false, &out->shape, err);
	}
	t = dg_json_to_tensor(value, have_dt ? &dt : NULL, err);
	if (!t)
		return err ? err->code : DG_EINVAL;
	out->dtype = t->dtype;
	out->shape = t->shape;
	dg_tensor_free(t);
	return DG_OK;
}

static enum dg_status const_infer(struct dg_infer_ctx *c)
{
	enum dg_status st = const_type(dg_attrs_of_json(c->attrs), &c->out[0], c->err);

	if (st != DG_OK)
		dg_err_prefix(c->err, "attr 'value'");
	return st;
}

static enum dg_status const_cpu(struct dg_kernel_ctx *c)
{
	const json_t *value = dg_attrs_get(c->attrs, "value");
	enum dg_dtype dt;
	bool have_dt;
	enum dg_status st = const_dtype(c->attrs, &dt, &have_dt, c->err);

	if (st != DG_OK)
		return st;
	if (!value)
		return dg_err_set(c->err, DG_EINVAL, "missing required attr 'value'");
	c->out[0] = dg_json_to_tensor(value, have_dt ? &dt : NULL, c->err);
	if (!c->out[0]) {
		dg_err_prefix(c->err, "attr 'value'");
		return c->err ? c->err->code : DG_EINVAL;
	}
	return DG_OK;
}

/* --- Placeholder --------------------------------------------------------- */

static enum dg_status placeholder_infer(struct dg_infer_ctx *c)
{
	const enum dg_dtype f32 = DG_F32;
	enum dg_status st;

	st = dg_attrs_dtype(dg_attrs_of_json(c->attrs), "dtype", &f32, &c->out[0].dtype, c->err);
	if (st != DG_OK)
		return st;
	return dg_attrs_shape(dg_attrs_of_json(c->attrs), "shape", false, true, &c->out[0].shape, c->err);
}

/* Only reached when something runs the op directly: the executor substitutes
 * the fed value and reports an unfed placeholder, by name, before any kernel. */
static enum dg_status placeholder_cpu(struct dg_kernel_ctx *c)
{
	dg_err_set(c->err, DG_EINVAL, "placeholder was not fed");
	dg_err_hint(c->err, "feed it a value, e.g. dg eval GRAPH.json --feed NAME=FILE.npy");
	return DG_EINVAL;
}

/* --- Identity ------------------------------------------------------------ */

static enum dg_status identity_infer(struct dg_infer_ctx *c)
{
	c->out[0] = c->in[0];
	return DG_OK;
}

/* out = copy of in[0], any dtype and shape. */
static enum dg_status identity_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0];
	struct dg_tensor *y = cpu_out(c, 0, x->dtype, &x->shape);

	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (x->nbytes)
		memcpy(y->data, x->data, x->nbytes);
	return DG_OK;
}

/* --- table --------------------------------------------------------------- */

static const struct dg_attr_spec const_attrs[] = {
	{ "value", DG_ATTR_TENSOR, true, "the value: a number, nested arrays, or "
	  "{\"dtype\", \"shape\", \"value\"}" },
	{ "dtype", DG_ATTR_DTYPE, false, "force the literal's dtype (default: int32 for "
	  "integers, float32 for fractions, bool for true/false)" },
	{ 0 },
};

static const struct dg_attr_spec placeholder_attrs[] = {
	{ "dtype", DG_ATTR_DTYPE, false, "dtype of the fed value (default float32)" },
	{ "shape", DG_ATTR_SHAPE, false, "shape of the fed value; -1 for an unknown size, "
	  "null or absent for any shape" },
	{ 0 },
};

static const struct dg_attr_spec no_attrs[] = { { 0 } };

struct dg_op_def dg_ops_basic[] = {
	{ .name = "Const", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = const_attrs, .infer = const_infer, .cpu = const_cpu,
	  .flags = DG_OPF_SOURCE, .doc = "a constant tensor given as a JSON literal" },
	{ .name = "Identity", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = no_attrs, .infer = identity_infer, .cpu = identity_cpu,
	  .grad = cpu_grad_identity,
	  .doc = "returns a copy of its input (any dtype)" },
	{ .name = "Placeholder", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = placeholder_attrs, .infer = placeholder_infer, .cpu = placeholder_cpu,
	  .flags = DG_OPF_SOURCE | DG_OPF_FEED,
	  .doc = "a value fed at run time (dg eval --feed NAME=FILE.npy|VALUE)" },
	{ 0 },
};
