/* Batch normalization (TensorFlow's FusedBatchNorm and its gradient) over the
 * last dimension: channels last, so [N, C] and NHWC [N, H, W, C] both
 * normalise each of the C channels over all the other positions. The
 * statistics are summed in double (a float32 sum over 64x28x28 positions
 * loses digits that the variance's difference then amplifies), one pass
 * per channel over rows of C contiguous values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "dg/graph.h"

static const struct dg_attr_spec bn_attrs[] = {
	{ "epsilon", DG_ATTR_FLOAT, false, "added to the variance (default 0.001)" },
	{ "is_training", DG_ATTR_BOOL, false, "true (default): normalise with the batch's "
	  "statistics; false: with the mean and variance inputs" },
	{ 0 },
};

struct bn {
	double eps;
	bool training;
};

static enum dg_status bn_attrs_of(struct dg_attrs a, int n_in, struct bn *o, struct dg_err *err)
{
	double eps_def = 0.001;
	bool yes = true;
	enum dg_status st = dg_attrs_float(a, "epsilon", &eps_def, &o->eps, err);

	if (st == DG_OK)
		st = dg_attrs_bool(a, "is_training", &yes, &o->training, err);
	if (st != DG_OK)
		return st;
	if (!(o->eps > 0) || !isfinite(o->eps))
		return dg_err_set(err, DG_EINVAL, "attr 'epsilon' must be finite and > 0, got %g",
				  o->eps);
	if (!o->training && n_in != 5) {
		dg_err_set(err, DG_EINVAL, "is_training false needs 5 inputs (x, scale, offset, "
			   "mean, variance), got %d", n_in);
		dg_err_hint(err, "pass the moving mean and variance as inputs 3 and 4");
		return DG_EINVAL;
	}
	return DG_OK;
}

/* x float, rank >= 1; the other inputs [C] of x's dtype, C its last dim.
 * first: the index of x among in (the gradient's dy comes before it). */
static enum dg_status bn_check(const struct dg_ttype *in, int n_in, int first, struct dg_err *err)
{
	const struct dg_ttype *x = &in[first];
	int64_t ch = x->shape.ndim > 0 ? x->shape.dim[x->shape.ndim - 1] : -1;

	if (x->dtype != DG_F32 && x->dtype != DG_F64)
		return dg_err_set(err, DG_EDTYPE, "x is %s; batch normalization takes float32 or "
				  "float64", dg_dtype_name(x->dtype));
	if (x->shape.ndim == 0)
		return dg_err_set(err, DG_ESHAPE, "x is a scalar: it has no channel dimension");
	for (int i = 0; i < n_in; i++) {
		const struct dg_ttype *t = &in[i];
		if (i == first)
			continue;
		if (t->dtype != x->dtype)
			return dg_err_set(err, DG_EDTYPE, "input %d is %s, x %s", i,
					  dg_dtype_name(t->dtype), dg_dtype_name(x->dtype));
		if (first == 1 && i == 0) {     /* the gradient's dy: x's shape */
			bool same = t->shape.ndim < 0 || x->shape.ndim < 0 ||
				    t->shape.ndim == x->shape.ndim;
			for (int k = 0; same && t->shape.ndim > 0 && k < t->shape.ndim; k++)
				same = t->shape.dim[k] < 0 || x->shape.dim[k] < 0 ||
				       t->shape.dim[k] == x->shape.dim[k];
			if (!same)
				return dg_err_set(err, DG_ESHAPE, "dy's shape differs from x's");
			continue;
		}
		if (t->shape.ndim >= 0 && (t->shape.ndim != 1 ||
					   (ch >= 0 && t->shape.dim[0] >= 0 && t->shape.dim[0] != ch))) {
			char s[64];
			dg_shape_format(&t->shape, s, sizeof s);
			dg_err_set(err, DG_ESHAPE, "input %d has shape %s; it must be [%lld], x's "
				   "last (channel) dim", i, s, (long long)ch);
			dg_err_hint(err, "batch normalization is channels last: x [N, C] or "
				    "[N, H, W, C], scale and offset [C]");
			return DG_ESHAPE;
		}
	}
	return DG_OK;
}

static void channel_shape(const struct dg_ttype *x, struct dg_shape *s)
{
	s->ndim = 1;
	s->dim[0] = x->shape.ndim > 0 ? x->shape.dim[x->shape.ndim - 1] : -1;
}

static enum dg_status infer_bn(struct dg_infer_ctx *c)
{
	struct bn o;
	enum dg_status st = bn_attrs_of(dg_attrs_of_json(c->attrs), c->n_in, &o, c->err);

	if (st == DG_OK)
		st = bn_check(c->in, c->n_in, 0, c->err);
	if (st != DG_OK)
		return st;
	c->out[0] = c->in[0];
	for (int k = 1; k < 3; k++) {
		c->out[k].dtype = c->in[0].dtype;
		channel_shape(&c->in[0], &c->out[k].shape);
	}
	return DG_OK;
}

static enum dg_status infer_bn_grad(struct dg_infer_ctx *c)
{
	struct bn o;
	enum dg_status st = bn_attrs_of(dg_attrs_of_json(c->attrs), c->n_in, &o, c->err);

	if (st == DG_OK && o.training && c->n_in != 3)
		st = dg_err_set(c->err, DG_EINVAL, "is_training true takes 3 inputs (dy, x, "
				"scale), got %d", c->n_in);
	if (st == DG_OK)
		st = bn_check(c->in, c->n_in, 1, c->err);
	if (st != DG_OK)
		return st;
	c->out[0] = c->in[1];
	for (int k = 1; k < 3; k++) {
		c->out[k].dtype = c->in[1].dtype;
		channel_shape(&c->in[1], &c->out[k].shape);
	}
	return DG_OK;
}

static double at(const struct dg_tensor *t, int64_t i)
{
	return t->dtype == DG_F32 ? (double)((const float *)t->data)[i]
				  : ((const double *)t->data)[i];
}

static void put(struct dg_tensor *t, int64_t i, double v)
{
	if (t->dtype == DG_F32)
		((float *)t->data)[i] = (float)v;
	else
		((double *)t->data)[i] = v;
}

/* Per-channel mean and (biased) variance of x viewed as [m, ch]: two passes
 * in double. mean and var hold ch doubles. */
static void moments(const struct dg_tensor *x, int64_t m, int64_t ch, double *mean, double *var)
{
	memset(mean, 0, (size_t)ch * sizeof *mean);
	memset(var, 0, (size_t)ch * sizeof *var);
	for (int64_t r = 0; r < m; r++)
		for (int64_t k = 0; k < ch; k++)
			mean[k] += at(x, r * ch + k);
	for (int64_t k = 0; k < ch; k++)
		mean[k] = m ? mean[k] / (double)m : 0;
	for (int64_t r = 0; r < m; r++)
		for (int64_t k = 0; k < ch; k++) {
			double d = at(x, r * ch + k) - mean[k];
			var[k] += d * d;
		}
	for (int64_t k = 0; k < ch; k++)
		var[k] = m ? var[k] / (double)m : 0;
}

/* Checks of the run-time shapes (the inferred ones may have had -1s). */
static enum dg_status bn_run_check(struct dg_kernel_ctx *c, int first, struct bn *o,
				   int64_t *m, int64_t *ch)
{
	struct dg_ttype t[5];
	enum dg_status st = bn_attrs_of(c->attrs, c->n_in, o, c->err);

	for (int i = 0; i < c->n_in; i++)
		t[i] = cpu_ttype(c->in[i]);
	if (st == DG_OK)
		st = bn_check(t, c->n_in, first, c->err);
	if (st != DG_OK)
		return st;
	*ch = t[first].shape.dim[t[first].shape.ndim - 1];
	*m = *ch ? c->in[first]->numel / *ch : 0;
	return DG_OK;
}

/* Outputs 0 (x's shape) and 1, 2 ([ch]), all of x's dtype. */
static enum dg_status bn_outputs(struct dg_kernel_ctx *c, const struct dg_tensor *x, int64_t ch)
{
	struct dg_shape cs = dg_shape_make(1, (int64_t[]){ ch });

	if (!cpu_out(c, 0, x->dtype, &x->shape) || !cpu_out(c, 1, x->dtype, &cs) ||
	    !cpu_out(c, 2, x->dtype, &cs))
		return c->err ? c->err->code : DG_ENOMEM;
	return DG_OK;
}

/* y = (x - mean) / sqrt(var + eps) * scale + offset; outputs 1 and 2: the
 * batch's mean and its variance with Bessel's correction (m / (m - 1)),
 * what TensorFlow returns for the moving averages, or in inference the
 * mean and variance inputs. */
static enum dg_status k_bn(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0], *scale = c->in[1], *offset = c->in[2];
	struct bn o;
	int64_t m, ch;
	double *mean, *var;
	enum dg_status st = bn_run_check(c, 0, &o, &m, &ch);

	if (st != DG_OK)
		return st;
	if ((st = bn_outputs(c, x, ch)) != DG_OK)
		return st;
	mean = malloc((size_t)(2 * ch + 1) * sizeof *mean);
	if (!mean)
		return dg_err_set(c->err, DG_ENOMEM, "out of memory");
	var = mean + ch;
	if (o.training) {
		moments(x, m, ch, mean, var);
	} else {
		for (int64_t k = 0; k < ch; k++) {
			mean[k] = at(c->in[3], k);
			var[k] = at(c->in[4], k);
		}
	}
	for (int64_t k = 0; k < ch; k++) {
		put(c->out[1], k, mean[k]);
		put(c->out[2], k, o.training && m > 1 ? var[k] * (double)m / (double)(m - 1)
						      : var[k]);
		/* var becomes the factor, mean the shift: y = x * a + b */
		double a = at(scale, k) / sqrt(var[k] + o.eps);
		var[k] = a;
		mean[k] = at(offset, k) - mean[k] * a;
	}
	for (int64_t r = 0; r < m; r++)
		for (int64_t k = 0; k < ch; k++)
			put(c->out[0], r * ch + k, at(x, r * ch + k) * var[k] + mean[k]);
	free(mean);
	return DG_OK;
}

/* dx, dscale, doffset of y = xhat * scale + offset with xhat = (x - mean) *
 * inv, inv = 1 / sqrt(var + eps). Training (the statistics are x's own):
 * dx = scale * inv / m * (m dy - sum dy - xhat sum(dy xhat)); inference
 * (given statistics, constants): dx = scale * inv * dy. */
static enum dg_status k_bn_grad(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *dy = c->in[0], *x = c->in[1], *scale = c->in[2];
	struct bn o;
	int64_t m, ch;
	double *mean, *inv, *sdy, *sdyx;
	enum dg_status st = bn_run_check(c, 1, &o, &m, &ch);

	if (st == DG_OK && dy->numel != x->numel)
		st = dg_err_set(c->err, DG_ESHAPE, "dy has %lld elements, x %lld",
				(long long)dy->numel, (long long)x->numel);
	if (st != DG_OK)
		return st;
	if ((st = bn_outputs(c, x, ch)) != DG_OK)
		return st;
	mean = calloc((size_t)(4 * ch + 1), sizeof *mean);
	if (!mean)
		return dg_err_set(c->err, DG_ENOMEM, "out of memory");
	inv = mean + ch;
	sdy = inv + ch;
	sdyx = sdy + ch;
	if (o.training) {
		moments(x, m, ch, mean, inv);
	} else {
		for (int64_t k = 0; k < ch; k++) {
			mean[k] = at(c->in[3], k);
			inv[k] = at(c->in[4], k);
		}
	}
	for (int64_t k = 0; k < ch; k++)
		inv[k] = 1 / sqrt(inv[k] + o.eps);
	for (int64_t r = 0; r < m; r++)
		for (int64_t k = 0; k < ch; k++) {
			double g = at(dy, r * ch + k);
			sdy[k] += g;
			sdyx[k] += g * (at(x, r * ch + k) - mean[k]) * inv[k];
		}
	for (int64_t k = 0; k < ch; k++) {
		put(c->out[1], k, sdyx[k]);
		put(c->out[2], k, sdy[k]);
	}
	for (int64_t r = 0; r < m; r++)
		for (int64_t k = 0; k < ch; k++) {
			double g = at(dy, r * ch + k), s = at(scale, k) * inv[k];
			double xhat = (at(x, r * ch + k) - mean[k]) * inv[k];
			put(c->out[0], r * ch + k,
			    o.training ? s / (double)m * ((double)m * g - sdy[k] - xhat * sdyx[k])
				       : s * g);
		}
	free(mean);
	return DG_OK;
}

/* The gradient of FusedBatchNorm: one FusedBatchNormGrad gives dx, dscale
 * and doffset (outputs 0..2, taken through Identity nodes, since a gradient
 * function hands out output-0 refs). The statistics it outputs have no
 * gradient here: a loss computed from them is refused. */
static enum dg_status grad_bn(struct dg_grad_ctx *c)
{
	const char *in[5] = { c->dout[0], c->in[0], c->in[1], NULL, NULL };
	const json_t *eps = json_object_get(c->attrs, "epsilon");
	const json_t *tr = json_object_get(c->attrs, "is_training");
	json_t *a = json_object();
	int n_in = 3;

	if (c->dout[1] || c->dout[2]) {
		json_decref(a);
		dg_err_set(c->err, DG_EUNSUPPORTED, "FusedBatchNorm's batch mean and variance "
			   "(outputs 1 and 2) have no gradient");
		dg_err_hint(c->err, "use them for the moving averages only, not in the loss");
		return DG_EUNSUPPORTED;
	}
	if (!c->dout[0]) {
		json_decref(a);
		return DG_OK;
	}
	if (tr && json_is_false(tr)) {  /* inference: the given statistics */
		in[3] = c->in[3];
		in[4] = c->in[4];
		n_in = 5;
	}
	if (!a || (eps && json_object_set(a, "epsilon", (json_t *)eps)) ||
	    (tr && json_object_set(a, "is_training", (json_t *)tr))) {
		json_decref(a);
		return dg_err_set(c->err, DG_ENOMEM, "out of memory");
	}
	const char *g = c->add(c, "FusedBatchNormGrad", in, n_in, a);
	if (!g)
		return c->err->code;
	for (int k = 0; k < 3; k++) {
		char ref[DG_GRAPH_MAX_NAME + 16];
		const char *r = ref;
		if (!c->need[k])
			continue;
		if (k == 0) {
			c->din[0] = g;
			continue;
		}
		snprintf(ref, sizeof ref, "%s:%d", g, k);
		if (!(c->din[k] = c->add(c, "Identity", &r, 1, NULL)))
			return c->err->code;
	}
	return DG_OK;
}

struct dg_op_def dg_ops_norm[] = {
	{ .name = "FusedBatchNorm", .min_inputs = 3, .max_inputs = 5, .n_outputs = 3,
	  .attrs = bn_attrs, .infer = infer_bn, .cpu = k_bn, .grad = grad_bn,
	  .doc = "batch normalization over the last (channel) dim: y = (x - mean) / "
		 "sqrt(var + epsilon) * scale + offset; training: x's own mean and variance, "
		 "outputs 1, 2 the batch mean and variance (Bessel-corrected, for moving "
		 "averages); is_training false: the mean and variance inputs 3, 4" },
	{ .name = "FusedBatchNormGrad", .min_inputs = 3, .max_inputs = 5, .n_outputs = 3,
	  .attrs = bn_attrs, .infer = infer_bn_grad, .cpu = k_bn_grad,
	  .doc = "gradient of FusedBatchNorm: (dy, x, scale[, mean, variance]) to dx, dscale, "
		 "doffset" },
	{ 0 },
};
