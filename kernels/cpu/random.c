/* Seeded random initialisers for the CPU: RandomUniform, RandomNormal,
 * TruncatedNormal and GlorotUniform, and Dropout. Values come from Philox4x32-10 (Salmon et
 * al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), defined once
 * in kernels/philox.h for this file and kernels/cuda/random.cu because no
 * Debian C library offers a counter-based RNG with a stable, documented
 * stream. Value i of a tensor depends only on (seed, step, i): no thread or
 * device order matters. */
#include "cpu.h"
#include "../philox.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* --- Philox4x32-10 ------------------------------------------------------- */

void cpu_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
	dg_philox4x32_10(ctr, key, out);
}

/* The stream of one kernel run: the key and step of dg_philox_block(). */
struct stream {
	uint32_t key[2];
	uint32_t step_lo, step_hi;
};

static void stream_block(const struct stream *g, uint64_t block, uint32_t attempt, uint32_t w[4])
{
	dg_philox_block(g->key, g->step_lo, g->step_hi, block, attempt, w);
}

/* --- attrs --------------------------------------------------------------- */

enum rkind { R_UNIFORM, R_NORMAL, R_TRUNCATED, R_GLOROT };

struct rnd {
	enum rkind kind;
	struct dg_shape shape;
	enum dg_dtype dt;
	uint64_t seed;
	double a, b;          /* uniform: [a, b); normals: mean a, stddev b */
	int64_t ia, ib;       /* integer uniform: [ia, ib) */
};

/* An integer bound of an integer RandomUniform: required, a JSON integer,
 * within the dtype. */
static enum dg_status int_bound(struct dg_attrs attrs, const char *key, enum dg_dtype dt,
				int64_t *out, struct dg_err *err)
{
	const json_t *v = dg_attrs_get(attrs, key);

	if (!v) {
		dg_err_set(err, DG_EINVAL, "missing attr '%s', required for an %s RandomUniform",
			   key, dg_dtype_name(dt));
		dg_err_hint(err, "integer ranges have no default: give minval and maxval");
		return DG_EINVAL;
	}
	if (!json_is_integer(v)) {
		return dg_err_set(err, DG_EINVAL, "attr '%s' must be an integer for dtype %s", key,
				  dg_dtype_name(dt));
	}
	*out = json_integer_value(v);
	if (dt == DG_I32 && (*out < INT32_MIN || *out > INT32_MAX)) {
		return dg_err_set(err, DG_EINVAL, "attr '%s' = %lld does not fit int32", key,
				  (long long)*out);
	}
	return DG_OK;
}

/* minval/maxval: integers without defaults for int dtypes; numbers defaulting
 * to [0, 1) for floats. An empty or non-finite range is refused rather than
 * producing values outside it. */
static enum dg_status uniform_attrs(struct dg_attrs attrs, struct rnd *r, struct dg_err *err)
{
	static const double zero = 0.0, one = 1.0;
	enum dg_status st;

	if (r->dt == DG_I32 || r->dt == DG_I64) {
		st = int_bound(attrs, "minval", r->dt, &r->ia, err);
		if (st == DG_OK)
			st = int_bound(attrs, "maxval", r->dt, &r->ib, err);
		if (st == DG_OK && r->ib <= r->ia) {
			return dg_err_set(err, DG_EINVAL, "maxval %lld must be greater than minval "
					  "%lld", (long long)r->ib, (long long)r->ia);
		}
		return st;
	}
	st = dg_attrs_float(attrs, "minval", &zero, &r->a, err);
	if (st == DG_OK)
		st = dg_attrs_float(attrs, "maxval", &one, &r->b, err);
	if (st != DG_OK)
		return st;
	if (!(r->b > r->a)) {
		return dg_err_set(err, DG_EINVAL, "maxval %g must be greater than minval %g", r->b,
				  r->a);
	}
	/* The bounds and the span must be finite in the output type (or values
	 * overflow), and the bounds distinct there (or the range is empty). */
	if (!isfinite(r->b - r->a) || (r->dt == DG_F32 && (fabs(r->a) > FLT_MAX ||
	    fabs(r->b) > FLT_MAX || r->b - r->a > FLT_MAX))) {
		return dg_err_set(err, DG_EINVAL, "range [%g, %g) is too wide for %s", r->a, r->b,
				  dg_dtype_name(r->dt));
	}
	if (r->dt == DG_F32 && !((float)r->a < (float)r->b)) {
		return dg_err_set(err, DG_EINVAL, "range [%.9g, %.9g) is empty in float32", r->a,
				  r->b);
	}
	return DG_OK;
}

/* mean and stddev (>= 0); for float32 both must be float32 numbers, so that
 * the float arithmetic of the generator cannot start from an overflow. */
static enum dg_status normal_attrs(struct dg_attrs attrs, struct rnd *r, struct dg_err *err)
{
	static const double zero = 0.0, one = 1.0;
	enum dg_status st = dg_attrs_float(attrs, "mean", &zero, &r->a, err);

	if (st == DG_OK)
		st = dg_attrs_float(attrs, "stddev", &one, &r->b, err);
	if (st != DG_OK)
		return st;
	if (r->b < 0)
		return dg_err_set(err, DG_EINVAL, "stddev %g is negative", r->b);
	if (r->dt == DG_F32 && (fabs(r->a) > FLT_MAX || r->b > FLT_MAX)) {
		return dg_err_set(err, DG_EINVAL, "mean %g or stddev %g does not fit float32", r->a,
				  r->b);
	}
	return DG_OK;
}

double dg_glorot_limit_shape(const struct dg_shape *s)
{
	return dg_glorot_limit(s->dim, s->ndim);
}

/* Glorot/Xavier limit of the weight shape (philox.h; see the op's doc line). */
static void glorot_limit(struct rnd *r)
{
	r->b = dg_glorot_limit(r->shape.dim, r->shape.ndim);
	r->a = -r->b;
}

/* Everything a kernel needs from the attrs, checked. Shared by infer and
 * kernel so a graph that validates never fails here at run time. */
static enum dg_status rnd_parse(struct dg_attrs attrs, enum rkind kind, struct rnd *r,
				struct dg_err *err)
{
	static const enum dg_dtype def_dt = DG_F32;
	static const int64_t def_seed = 0;
	int64_t seed;
	bool int_ok = kind == R_UNIFORM;
	enum dg_status st;

	r->kind = kind;
	st = dg_attrs_shape(attrs, "shape", true, false, &r->shape, err);
	if (st == DG_OK)
		st = dg_attrs_dtype(attrs, "dtype", &def_dt, &r->dt, err);
	if (st == DG_OK)
		st = dg_attrs_int(attrs, "seed", &def_seed, &seed, err);
	if (st != DG_OK)
		return st;
	r->seed = (uint64_t)seed;
	if (!dg_dtype_is_float(r->dt) && !(int_ok && (r->dt == DG_I32 || r->dt == DG_I64))) {
		dg_err_set(err, DG_EDTYPE, "cannot draw %s values", dg_dtype_name(r->dt));
		dg_err_hint(err, int_ok ? "use float32, float64, int32 or int64"
				: "use float32 or float64");
		return DG_EDTYPE;
	}
	switch (kind) {
	case R_UNIFORM: return uniform_attrs(attrs, r, err);
	case R_GLOROT: glorot_limit(r); return DG_OK;
	default: return normal_attrs(attrs, r, err);
	}
}

/* --- generators: one per (distribution, dtype) --------------------------- */

/* Each fills y[0..n) block by block; a block is one Philox call (4 words). */

/* Four values per block, each from one word; scaled in float32 arithmetic. */
static void uniform_f32(float *restrict y, int64_t n, const struct stream *g, double a, double b)
{
	float lo = (float)a, hi = (float)b, span = (float)(b - a);
	uint32_t w[4];

	for (int64_t i0 = 0; i0 < n; i0 += 4) {
		stream_block(g, (uint64_t)i0 / 4, 0, w);
		for (int j = 0; j < 4 && i0 + j < n; j++)
			y[i0 + j] = dg_rand_uniform_f32(w[j], lo, hi, span);
	}
}

/* Two values per block, each from 53 bits (two words). */
static void uniform_f64(double *restrict y, int64_t n, const struct stream *g, double a, double b)
{
	uint32_t w[4];

	for (int64_t i0 = 0; i0 < n; i0 += 2) {
		stream_block(g, (uint64_t)i0 / 2, 0, w);
		for (int j = 0; j < 2 && i0 + j < n; j++)
			y[i0 + j] = dg_rand_uniform_f64(w[2 * j], w[2 * j + 1], a, b);
	}
}

/* Integers in [lo, hi), two per block (64 bits each; philox.h). */
#define DEF_UNIFORM_INT(name, T)                                                         \
	static void name(T *restrict y, int64_t n, const struct stream *g, int64_t lo,   \
			 int64_t hi)                                                     \
	{                                                                                \
		uint64_t span = (uint64_t)hi - (uint64_t)lo;                             \
		uint32_t w[4];                                                           \
		for (int64_t i0 = 0; i0 < n; i0 += 2) {                                  \
			stream_block(g, (uint64_t)i0 / 2, 0, w);                         \
			for (int j = 0; j < 2 && i0 + j < n; j++)                        \
				y[i0 + j] = (T)dg_rand_uniform_int(w[2 * j], w[2 * j + 1], \
								  lo, span);             \
		}                                                                        \
	}
DEF_UNIFORM_INT(uniform_i32, int32_t)
DEF_UNIFORM_INT(uniform_i64, int64_t)

/* mean + sd * z for each element, block by block (dg_rand_normal_block: the
 * truncation rule is philox.h's). Returns false only if 65535 attempts all
 * fail: probability 0.0455^65535, but reported rather than faked. */
static bool normal_z(const struct stream *g, int64_t n, bool f64, bool truncated, void *y,
		     double mean, double sd)
{
	int per = f64 ? 2 : 4;
	double z[4];

	for (int64_t i0 = 0; i0 < n; i0 += per) {
		int m = dg_rand_normal_block(g->key, g->step_lo, g->step_hi, (uint64_t)(i0 / per),
					     f64, truncated, z);
		if (m < 0)
			return false;
		for (int j = 0; j < m && i0 + j < n; j++) {
			if (f64)
				((double *)y)[i0 + j] = dg_rand_scale_f64(mean, sd, z[j]);
			else
				((float *)y)[i0 + j] = dg_rand_scale_f32(mean, sd, z[j]);
		}
	}
	return true;
}

/* --- infer and kernels ----------------------------------------------------- */

static enum dg_status rnd_infer(struct dg_infer_ctx *c, enum rkind kind)
{
	struct rnd r;
	enum dg_status st = rnd_parse(dg_attrs_of_json(c->attrs), kind, &r, c->err);

	if (st != DG_OK)
		return st;
	c->out[0].dtype = r.dt;
	c->out[0].shape = r.shape;
	return DG_OK;
}

/* Key = the 64-bit seed, counter = (block, step): a later step of the same
 * graph draws fresh values, a rerun of the same step the same ones. */
static enum dg_status rnd_cpu(struct dg_kernel_ctx *c, enum rkind kind)
{
	struct rnd r;
	struct stream g;
	struct dg_tensor *y;
	enum dg_status st = rnd_parse(c->attrs, kind, &r, c->err);

	if (st != DG_OK)
		return st;
	y = cpu_out(c, 0, r.dt, &r.shape);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	g.key[0] = (uint32_t)r.seed;
	g.key[1] = (uint32_t)(r.seed >> 32);
	g.step_lo = (uint32_t)c->step;
	g.step_hi = (uint32_t)(c->step >> 32);
	if (kind == R_UNIFORM || kind == R_GLOROT) {
		switch (r.dt) {
		case DG_F32: uniform_f32(y->data, y->numel, &g, r.a, r.b); break;
		case DG_F64: uniform_f64(y->data, y->numel, &g, r.a, r.b); break;
		case DG_I32: uniform_i32(y->data, y->numel, &g, r.ia, r.ib); break;
		default: uniform_i64(y->data, y->numel, &g, r.ia, r.ib); break;
		}
		return DG_OK;
	}
	if (!normal_z(&g, y->numel, r.dt == DG_F64, kind == R_TRUNCATED, y->data, r.a, r.b)) {
		return dg_err_set(c->err, DG_EINTERNAL, "TruncatedNormal found no value within 2 "
				  "stddev in 65535 draws (seed %llu); the generator is broken",
				  (unsigned long long)r.seed);
	}
	return DG_OK;
}

static enum dg_status uniform_infer(struct dg_infer_ctx *c)
{
	return rnd_infer(c, R_UNIFORM);
}

static enum dg_status normal_infer(struct dg_infer_ctx *c)
{
	return rnd_infer(c, R_NORMAL);
}

static enum dg_status truncated_infer(struct dg_infer_ctx *c)
{
	return rnd_infer(c, R_TRUNCATED);
}

static enum dg_status glorot_infer(struct dg_infer_ctx *c)
{
	return rnd_infer(c, R_GLOROT);
}

static enum dg_status uniform_cpu(struct dg_kernel_ctx *c)
{
	return rnd_cpu(c, R_UNIFORM);
}

static enum dg_status normal_cpu(struct dg_kernel_ctx *c)
{
	return rnd_cpu(c, R_NORMAL);
}

static enum dg_status truncated_cpu(struct dg_kernel_ctx *c)
{
	return rnd_cpu(c, R_TRUNCATED);
}

static enum dg_status glorot_cpu(struct dg_kernel_ctx *c)
{
	return rnd_cpu(c, R_GLOROT);
}

/* --- Dropout -------------------------------------------------------------- */

/* Element i is kept when the 24-bit uniform of word i % 4 of Philox block
 * i / 4 (key = seed, counter = step) is at least rate, and scaled by 1 / (1 -
 * rate). The mask is a function of (seed, step, i) alone: the gradient, run
 * in the same step, recomputes the same mask, so no mask travels between
 * the forward and the backward pass. */
static const struct dg_attr_spec dropout_spec[] = {
	{ "rate", DG_ATTR_FLOAT, true, "the fraction of elements zeroed, in [0, 1)" },
	{ "seed", DG_ATTR_INT, true, "64-bit Philox key, the step is the counter: required, "
				     "since two Dropouts of one shape and seed share a mask" },
	{ 0 },
};

static enum dg_status dropout_attrs(struct dg_attrs a, double *rate, uint64_t *seed,
				    struct dg_err *err)
{
	int64_t s;
	enum dg_status st = dg_attrs_float(a, "rate", NULL, rate, err);

	if (st == DG_OK)
		st = dg_attrs_int(a, "seed", NULL, &s, err);
	if (st != DG_OK)
		return st;
	if (!(*rate >= 0 && *rate < 1))
		return dg_err_set(err, DG_EINVAL, "attr 'rate' must be in [0, 1), got %g", *rate);
	*seed = (uint64_t)s;
	return DG_OK;
}

static enum dg_status dropout_infer(struct dg_infer_ctx *c)
{
	double rate = 0;
	uint64_t seed = 0;
	enum dg_status st = dropout_attrs(dg_attrs_of_json(c->attrs), &rate, &seed, c->err);

	if (st != DG_OK)
		return st;
	if (c->in[0].dtype != DG_F32 && c->in[0].dtype != DG_F64)
		return dg_err_set(c->err, DG_EDTYPE, "Dropout takes float32 or float64, got %s",
				  dg_dtype_name(c->in[0].dtype));
	c->out[0] = c->in[0];
	return DG_OK;
}

static enum dg_status dropout_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0];
	struct stream g;
	struct dg_tensor *y;
	double rate = 0;
	uint64_t seed = 0;
	uint32_t w[4];
	enum dg_status st = dropout_attrs(c->attrs, &rate, &seed, c->err);

	if (st != DG_OK)
		return st;
	if (x->dtype != DG_F32 && x->dtype != DG_F64)
		return dg_err_set(c->err, DG_EDTYPE, "Dropout takes float32 or float64, got %s",
				  dg_dtype_name(x->dtype));
	if (!(y = cpu_out(c, 0, x->dtype, &x->shape)))
		return c->err ? c->err->code : DG_ENOMEM;
	g.key[0] = (uint32_t)seed;
	g.key[1] = (uint32_t)(seed >> 32);
	g.step_lo = (uint32_t)c->step;
	g.step_hi = (uint32_t)(c->step >> 32);
	float rf = (float)rate;
	double scale = 1.0 / (1.0 - rate);
	for (int64_t i0 = 0; i0 < x->numel; i0 += 4) {
		stream_block(&g, (uint64_t)i0 / 4, 0, w);
		for (int j = 0; j < 4 && i0 + j < x->numel; j++) {
			bool keep = dg_philox_u24(w[j]) >= rf;
			if (x->dtype == DG_F32)
				((float *)y->data)[i0 + j] = keep ? (float)(((const float *)x->data)
							     [i0 + j] * scale) : 0.0f;
			else
				((double *)y->data)[i0 + j] = keep ? ((const double *)x->data)
							      [i0 + j] * scale : 0.0;
		}
	}
	return DG_OK;
}

/* d(Dropout(x))/dx applied to g is Dropout(g): the same mask and scale. */
static enum dg_status dropout_grad(struct dg_grad_ctx *c)
{
	json_t *a = json_deep_copy(c->attrs);
	const char *in[1] = { c->dout[0] };

	if (!a)
		return dg_err_set(c->err, DG_ENOMEM, "out of memory");
	if (!(c->din[0] = c->add(c, "Dropout", in, 1, a)))
		return c->err && c->err->code != DG_OK ? c->err->code : DG_EINTERNAL;
	return DG_OK;
}

#define COMMON_ATTRS                                                                     \
	{ "shape", DG_ATTR_SHAPE, true, "shape of the result" },                        \
	{ "dtype", DG_ATTR_DTYPE, false, "element type (default float32)" },              \
	{ "seed", DG_ATTR_INT, false, "64-bit Philox key (default 0); the step is the counter" }

static const struct dg_attr_spec uniform_spec[] = {
	COMMON_ATTRS,
	{ "minval", DG_ATTR_FLOAT, false, "low end, included (default 0; required for ints)" },
	{ "maxval", DG_ATTR_FLOAT, false, "high end, excluded (default 1; required for ints)" },
	{ 0 },
};

static const struct dg_attr_spec normal_spec[] = {
	COMMON_ATTRS,
	{ "mean", DG_ATTR_FLOAT, false, "mean (default 0)" },
	{ "stddev", DG_ATTR_FLOAT, false, "standard deviation (default 1)" },
	{ 0 },
};

static const struct dg_attr_spec glorot_spec[] = {
	COMMON_ATTRS,
	{ 0 },
};

#define RND_FLAGS (DG_OPF_SOURCE | DG_OPF_STATEFUL)

struct dg_op_def dg_ops_random[] = {
	{ "RandomUniform", 0, 0, 1, NULL, uniform_spec, uniform_infer, uniform_cpu, NULL, NULL,
	  RND_FLAGS, "uniform in [minval, maxval); float32/64, or int32/64 with integer bounds" },
	{ "RandomNormal", 0, 0, 1, NULL, normal_spec, normal_infer, normal_cpu, NULL, NULL,
	  RND_FLAGS, "normal(mean, stddev) by Box-Muller" },
	{ "TruncatedNormal", 0, 0, 1, NULL, normal_spec, truncated_infer, truncated_cpu, NULL,
	  NULL, RND_FLAGS, "normal(mean, stddev) re-drawn until within 2 stddev of the mean" },
	{ "GlorotUniform", 0, 0, 1, NULL, glorot_spec, glorot_infer, glorot_cpu, NULL, NULL,
	  RND_FLAGS, "uniform in +-sqrt(6 / (fan_in + fan_out)); fans from [.., in, out]" },
	{ .name = "Dropout", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = dropout_spec, .infer = dropout_infer, .cpu = dropout_cpu,
	  .grad = dropout_grad, .flags = DG_OPF_STATEFUL,
	  .doc = "training-time dropout: each element zeroed with probability rate, the rest "
		 "scaled by 1/(1-rate); the mask is a function of (seed, step, index), the "
		 "same in the step's gradient. Leave it out of the eval graph" },
	{ 0 },
};
