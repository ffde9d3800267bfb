/* Softmax, LogSoftmax and the two softmax cross-entropy losses, for the CPU.
 * All work row by row over a class axis: subtract the row's max, exponentiate,
 * sum, then scale (softmax) or subtract log(sum) (log-softmax, losses). float32
 * uses a vectorisable exp (exp_neg_f32 below); float64 uses libm's exp. Table
 * dg_ops_nn -> registry.c. */
#include "cpu.h"
#include "grad.h"

#include <math.h>
#include <string.h>

/* --- row helpers ------------------------------------------------------------- */

/* e^x for x <= 0 (a logit minus its row's max), written so the compiler can
 * vectorise loops over it: Cody-Waite reduction x = k ln2 + r with |r| <= ln2/2,
 * Cephes' degree-6 polynomial for e^r, and 2^(k+64) built in the exponent bits
 * (k from the 1.5*2^23 rounding trick, so no float-to-int conversion), then one
 * exact-or-rounding multiply by 2^-64 so results below FLT_MIN come out as the
 * right denormals. Checked against glibc's expf on every float in [-110, 0]:
 * never more than 1 ulp apart. x <= -104 (e^x rounds to 0) and NaN give 0;
 * callers never pass NaN (rows whose max is not finite are handled apart). The
 * clamp and the zeroing are bit masks, not branches: with -ftrapping-math (the
 * default) GCC will not if-convert these float selects, and the loop would stay
 * scalar. */
static inline float exp_neg_f32(float x)
{
	const float magic = 12582912.0f;        /* 1.5 * 2^23: adding it rounds to an integer */
	const uint32_t lo_bits = 0xC2D00000u;   /* -104.0f */
	uint32_t keep = 0u - (uint32_t)(x > -104.0f);   /* all ones where x > -104 */
	uint32_t xb, kb, eb;
	float t, kf, r, p, scale;

	memcpy(&xb, &x, sizeof xb);
	xb = (xb & keep) | (lo_bits & ~keep);
	memcpy(&t, &xb, sizeof t);              /* t = max(x, -104); NaN -> -104 */
	kf = t * 1.44269504088896341f + magic;
	memcpy(&kb, &kf, sizeof kb);
	kf -= magic;                            /* k = round(t / ln2), in [-150, 0] */
	r = t - kf * 0.693359375f;              /* ln2 split in two: k * hi is exact */
	r = r - kf * -2.12194440e-4f;
	p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	/* kb's low bits hold k + 0x400000; 2^(k+64) = (k + 64 + 127) << 23, always a
	 * normal float; +0 where x was not above -104. */
	eb = ((kb - 0x4B400000u + 127u + 64u) << 23) & keep;
	memcpy(&scale, &eb, sizeof scale);
	return p * scale * 5.42101086242752217e-20f;    /* * 2^-64 */
}

/* Row sums and maxima come from reduce.c (cpu_sum_*, cpu_max_*): the same
 * blocked lanes, so softmax sums (in [1, n], dividing every output) keep the
 * error of one block however long the row, and any NaN makes the max NaN. */

/* y[i] = e^(x[i] - m) for a finite m; returns the sum of the y. */
static float exp_store_f32(const float *restrict x, float *restrict y, int64_t n, float m)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = exp_neg_f32(x[i] - m);
	return cpu_sum_f32(y, n);
}

static double exp_store_f64(const double *restrict x, double *restrict y, int64_t n, double m)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = exp(x[i] - m);
	return cpu_sum_f64(y, n);
}

/* One contiguous row of n >= 1 classes. A row whose max is not finite (it holds a
 * NaN or +inf, or is all -inf) gives NaN everywhere, as the max-subtracted math
 * does: inf - inf and -inf - -inf are NaN. */
#define DEF_SOFTMAX_ROW(T, SUF, LOG)                                                       \
	static void softmax_row_##SUF(const T *restrict x, T *restrict y, int64_t n,       \
				      bool log_form)                                       \
	{                                                                                  \
		T m = cpu_max_##SUF(x, n);                                                 \
		if (!isfinite(m)) {                                                        \
			for (int64_t i = 0; i < n; i++)                                    \
				y[i] = (T)NAN;                                             \
			return;                                                            \
		}                                                                          \
		T s = exp_store_##SUF(x, y, n, m);                                         \
		if (log_form) {                                                            \
			T ls = LOG(s);                                                     \
			for (int64_t i = 0; i < n; i++)                                    \
				y[i] = (x[i] - m) - ls;                                    \
		} else {                                                                   \
			T inv = (T)1 / s;                                                  \
			for (int64_t i = 0; i < n; i++)                                    \
				y[i] *= inv;                                               \
		}                                                                          \
	}

DEF_SOFTMAX_ROW(float, f32, logf)
DEF_SOFTMAX_ROW(double, f64, log)

/* Softmax over the middle axis of x [outer, n, inner] (inner > 1): the column
 * maxima and sums live in m and s (inner each), and every pass walks rows in
 * memory order so the inner loops are contiguous. */
#define DEF_SOFTMAX_COLS(T, SUF, EXP, LOG)                                                 \
	static void softmax_cols_##SUF(const T *restrict x, T *restrict y, int64_t n,      \
				       int64_t inner, bool log_form, T *restrict m,        \
				       T *restrict s)                                      \
	{                                                                                  \
		memcpy(m, x, (size_t)inner * sizeof(T));                                   \
		for (int64_t r = 1; r < n; r++)                                            \
			for (int64_t j = 0; j < inner; j++) {                              \
				T v = x[r * inner + j];                                    \
				m[j] = ((v > m[j]) | (v != v)) ? v : m[j];                 \
			}                                                                  \
		for (int64_t j = 0; j < inner; j++)                                        \
			s[j] = 0;                                                          \
		for (int64_t r = 0; r < n; r++)                                            \
			for (int64_t j = 0; j < inner; j++) {                              \
				T e = EXP(x[r * inner + j] - m[j]);                        \
				y[r * inner + j] = e;                                      \
				s[j] += e;                                                 \
			}                                                                  \
		for (int64_t j = 0; j < inner; j++)                                        \
			s[j] = log_form ? LOG(s[j]) : (T)1 / s[j];                         \
		for (int64_t r = 0; r < n; r++)                                            \
			for (int64_t j = 0; j < inner; j++) {                              \
				int64_t i = r * inner + j;                                 \
				y[i] = log_form ? (x[i] - m[j]) - s[j] : y[i] * s[j];      \
			}                                                                  \
		for (int64_t j = 0; j < inner; j++) {                                      \
			if (isfinite(m[j]))                                                \
				continue;                                                  \
			for (int64_t r = 0; r < n; r++)                                    \
				y[r * inner + j] = (T)NAN;                                 \
		}                                                                          \
	}

DEF_SOFTMAX_COLS(float, f32, exp_neg_f32, logf)
DEF_SOFTMAX_COLS(double, f64, exp, log)

/* log(sum(e^x)) of a row of n >= 1, in double; NaN when the row's max is not
 * finite. Used by the losses, which then subtract the labelled logits. */
static double row_lse_f32(const float *restrict x, int64_t n)
{
	float m = cpu_max_f32(x, n);
	float buf[256];     /* exps land here a chunk at a time, so the exp loop vectorises */
	double s = 0;

	if (!isfinite(m))
		return NAN;
	for (int64_t i = 0; i < n; i += 256) {
		int64_t w = n - i < 256 ? n - i : 256;
		s += exp_store_f32(x + i, buf, w, m);
	}
	return (double)m + log(s);
}

static double row_lse_f64(const double *restrict x, int64_t n)
{
	double m = cpu_max_f64(x, n), s = 0;

	if (!isfinite(m))
		return NAN;
	for (int64_t i = 0; i < n; i++)
		s += exp(x[i] - m);
	return m + log(s);
}

/* --- shared checks -------------------------------------------------------------- */

static enum dg_status need_float(const char *op, const char *what, enum dg_dtype dt,
				 struct dg_err *err)
{
	if (dg_dtype_is_float(dt))
		return DG_OK;
	dg_err_set(err, DG_EDTYPE, "%s needs float32 or float64 %s, got %s", op, what,
		   dg_dtype_name(dt));
	dg_err_hint(err, "Cast the %s to float32 first", what);
	return DG_EDTYPE;
}

/* Are two (possibly partial) shapes compatible: same rank and equal dims where
 * both are known? Unknown rank is compatible with anything. */
static bool shapes_compatible(const struct dg_shape *a, const struct dg_shape *b)
{
	if (a->ndim < 0 || b->ndim < 0)
		return true;
	if (a->ndim != b->ndim)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->dim[i] >= 0 && b->dim[i] >= 0 && a->dim[i] != b->dim[i])
			return false;
	return true;
}

static enum dg_status shape_mismatch(const char *what, const struct dg_shape *logits,
				     const struct dg_shape *labels, const char *hint,
				     struct dg_err *err)
{
	char a[128], b[128];

	dg_shape_format(logits, a, sizeof a);
	dg_shape_format(labels, b, sizeof b);
	dg_err_set(err, DG_ESHAPE, "%s: logits %s and labels %s", what, a, b);
	dg_err_hint(err, "%s", hint);
	return DG_ESHAPE;
}

/* --- Softmax / LogSoftmax --------------------------------------------------------- */

static const struct dg_attr_spec softmax_attrs[] = {
	{ "axis", DG_ATTR_INT, false, "class axis (negative counts from the end); default -1" },
	{ 0 },
};

static enum dg_status softmax_axis(struct dg_attrs attrs, int ndim, int *axis, struct dg_err *err)
{
	const int64_t last = -1;
	int64_t a;

	if (dg_attrs_int(attrs, "axis", &last, &a, err) != DG_OK)
		return DG_EINVAL;
	if (cpu_axis(a, ndim, axis, err) != DG_OK) {
		if (ndim == 0)
			dg_err_hint(err, "softmax needs at least one axis; a scalar has none");
		else
			dg_err_hint(err, "axes of a rank-%d tensor are %d..%d", ndim, -ndim,
				    ndim - 1);
		return DG_EINVAL;
	}
	return DG_OK;
}

static enum dg_status infer_softmax_common(struct dg_infer_ctx *c, const char *op)
{
	const struct dg_ttype *x = &c->in[0];
	int axis;

	if (need_float(op, "logits", x->dtype, c->err) != DG_OK)
		return DG_EDTYPE;
	if (x->shape.ndim >= 0 && softmax_axis(dg_attrs_of_json(c->attrs), x->shape.ndim, &axis, c->err) != DG_OK)
		return DG_EINVAL;
	c->out[0] = *x;
	return DG_OK;
}

static enum dg_status infer_softmax(struct dg_infer_ctx *c)
{
	return infer_softmax_common(c, "Softmax");
}

static enum dg_status infer_log_softmax(struct dg_infer_ctx *c)
{
	return infer_softmax_common(c, "LogSoftmax");
}

static enum dg_status softmax_kernel(struct dg_kernel_ctx *c, const char *op, bool log_form)
{
	const struct dg_tensor *x = c->in[0];
	struct dg_tensor *y;
	int axis;
	int64_t outer = 1, n, inner = 1;
	void *m = NULL, *s = NULL;

	if (need_float(op, "logits", x->dtype, c->err) != DG_OK)
		return DG_EDTYPE;
	if (softmax_axis(c->attrs, x->shape.ndim, &axis, c->err) != DG_OK)
		return DG_EINVAL;
	y = cpu_out(c, 0, x->dtype, &x->shape);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (x->numel == 0)
		return DG_OK;
	n = x->shape.dim[axis];
	for (int i = 0; i < axis; i++)
		outer *= x->shape.dim[i];
	for (int i = axis + 1; i < x->shape.ndim; i++)
		inner *= x->shape.dim[i];
	if (inner == 1) {
		/* Contiguous rows: the common [batch, classes] case. */
		for (int64_t o = 0; o < outer; o++) {
			if (x->dtype == DG_F32)
				softmax_row_f32((const float *)x->data + o * n,
						(float *)y->data + o * n, n, log_form);
			else
				softmax_row_f64((const double *)x->data + o * n,
						(double *)y->data + o * n, n, log_form);
		}
		return DG_OK;
	}
	m = dg_alloc_aligned((size_t)inner * dg_dtype_size(x->dtype));
	s = dg_alloc_aligned((size_t)inner * dg_dtype_size(x->dtype));
	if (!m || !s) {
		dg_free_aligned(m);
		dg_free_aligned(s);
		return dg_err_set(c->err, DG_ENOMEM, "no memory for %s scratch of %lld columns",
				  op, (long long)inner);
	}
	for (int64_t o = 0; o < outer; o++) {
		int64_t off = o * n * inner;
		if (x->dtype == DG_F32)
			softmax_cols_f32((const float *)x->data + off, (float *)y->data + off, n,
					 inner, log_form, m, s);
		else
			softmax_cols_f64((const double *)x->data + off, (double *)y->data + off,
					 n, inner, log_form, m, s);
	}
	dg_free_aligned(m);
	dg_free_aligned(s);
	return DG_OK;
}

static enum dg_status k_softmax(struct dg_kernel_ctx *c)
{
	return softmax_kernel(c, "Softmax", false);
}

static enum dg_status k_log_softmax(struct dg_kernel_ctx *c)
{
	return softmax_kernel(c, "LogSoftmax", true);
}

/* --- cross-entropy losses ----------------------------------------------------------- */

/* logits [..., C] -> loss shape [...] (partial shapes allowed). */
static struct dg_shape drop_last(const struct dg_shape *s)
{
	struct dg_shape o = *s;

	if (o.ndim > 0)
		o.ndim--;
	return o;
}

/* The checks both losses make, over (possibly partial) types, so inference
 * and the kernels refuse exactly the same inputs: float logits with a class
 * axis, and labels of the logits' dtype and shape (dense) or int32/int64
 * class indices shaped like the logits without the class axis (sparse). */
static enum dg_status xent_check(const struct dg_ttype *x, const struct dg_ttype *l, bool sparse,
				 struct dg_err *err)
{
	const char *op = sparse ? "SparseSoftmaxCrossEntropyWithLogits"
				: "SoftmaxCrossEntropyWithLogits";
	struct dg_shape want;

	if (need_float(op, "logits", x->dtype, err) != DG_OK)
		return DG_EDTYPE;
	if (sparse && l->dtype != DG_I32 && l->dtype != DG_I64) {
		dg_err_set(err, DG_EDTYPE, "%s needs int32 or int64 labels, got %s", op,
			   dg_dtype_name(l->dtype));
		dg_err_hint(err, "labels are class indices; Cast them to int32");
		return DG_EDTYPE;
	}
	if (!sparse && l->dtype != x->dtype) {
		return dg_err_set(err, DG_EDTYPE, "%s: labels are %s but logits are %s", op,
				  dg_dtype_name(l->dtype), dg_dtype_name(x->dtype));
	}
	if (x->shape.ndim == 0 || (!sparse && l->shape.ndim == 0))
		return shape_mismatch("logits need a class axis", &x->shape, &l->shape,
				      sparse ? "pass logits shaped [batch, classes]"
					     : "pass logits and labels shaped [batch, classes]",
				      err);
	if (!sparse && !shapes_compatible(&x->shape, &l->shape))
		return shape_mismatch("labels must have the logits' shape", &x->shape,
				      &l->shape, "labels are per-class probabilities, "
				      "shaped like the logits", err);
	want = drop_last(&x->shape);
	if (sparse && !shapes_compatible(&want, &l->shape))
		return shape_mismatch("labels must have the logits' shape without the class "
				      "axis", &x->shape, &l->shape,
				      "logits [N, C] take labels [N]", err);
	return DG_OK;
}

/* a with its unknown rank or dims taken from b (the two are compatible). */
static struct dg_shape merge_known(const struct dg_shape *a, const struct dg_shape *b)
{
	struct dg_shape s = a->ndim >= 0 ? *a : *b;

	for (int i = 0; s.ndim >= 0 && b->ndim >= 0 && i < s.ndim; i++)
		if (s.dim[i] < 0)
			s.dim[i] = b->dim[i];
	return s;
}

static enum dg_status infer_xent(struct dg_infer_ctx *c)
{
	const struct dg_ttype *x = &c->in[0], *l = &c->in[1];
	enum dg_status st = xent_check(x, l, false, c->err);

	if (st != DG_OK)
		return st;
	struct dg_shape s = merge_known(&x->shape, &l->shape);
	c->out[0].dtype = x->dtype;
	c->out[0].shape = drop_last(&s);
	return DG_OK;
}

static enum dg_status infer_sparse_xent(struct dg_infer_ctx *c)
{
	const struct dg_ttype *x = &c->in[0], *l = &c->in[1];
	enum dg_status st = xent_check(x, l, true, c->err);

	if (st != DG_OK)
		return st;
	struct dg_shape want = drop_last(&x->shape);
	c->out[0].dtype = x->dtype;
	c->out[0].shape = merge_known(&want, &l->shape);
	return DG_OK;
}

/* loss[r] = -sum_c labels[r,c] * (x[r,c] - lse_r) = sum_c labels * (lse_r - x),
 * accumulated in double. 0 * inf (a zero label on a -inf logit) is NaN, as in
 * TensorFlow. C == 0 gives 0 (an empty sum). */
#define DEF_XENT(T, SUF)                                                                   \
	static void xent_##SUF(const T *restrict x, const T *restrict lab, T *restrict loss, \
			       int64_t rows, int64_t n)                                    \
	{                                                                                  \
		for (int64_t r = 0; r < rows; r++) {                                       \
			const T *xr = x + r * n, *lr = lab + r * n;                        \
			double lse, acc = 0;                                               \
			if (n == 0) {                                                      \
				loss[r] = 0;                                               \
				continue;                                                  \
			}                                                                  \
			lse = row_lse_##SUF(xr, n);                                        \
			for (int64_t i = 0; i < n; i++)                                    \
				acc += (double)lr[i] * (lse - (double)xr[i]);              \
			loss[r] = (T)acc;                                                  \
		}                                                                          \
	}

DEF_XENT(float, f32)
DEF_XENT(double, f64)

static enum dg_status k_xent(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0], *l = c->in[1];
	struct dg_ttype xt = cpu_ttype(x), lt = cpu_ttype(l);
	struct dg_shape os;
	struct dg_tensor *y;
	int64_t n;
	enum dg_status st = xent_check(&xt, &lt, false, c->err);

	if (st != DG_OK)
		return st;
	os = drop_last(&x->shape);
	n = x->shape.dim[x->shape.ndim - 1];
	y = cpu_out(c, 0, x->dtype, &os);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (y->numel == 0)
		return DG_OK;
	if (x->dtype == DG_F32)
		xent_f32(x->data, l->data, y->data, y->numel, n);
	else
		xent_f64(x->data, l->data, y->data, y->numel, n);
	return DG_OK;
}

/* Label i as int64 from an int32 or int64 tensor. */
static int64_t label_at(const struct dg_tensor *l, int64_t i)
{
	return l->dtype == DG_I32 ? ((const int32_t *)l->data)[i] : ((const int64_t *)l->data)[i];
}

static enum dg_status k_sparse_xent(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0], *l = c->in[1];
	struct dg_ttype xt = cpu_ttype(x), lt = cpu_ttype(l);
	struct dg_shape os;
	struct dg_tensor *y;
	int64_t n;
	enum dg_status st = xent_check(&xt, &lt, true, c->err);

	if (st != DG_OK)
		return st;
	os = drop_last(&x->shape);
	n = x->shape.dim[x->shape.ndim - 1];
	/* Check every label before computing anything. */
	for (int64_t i = 0; i < l->numel; i++) {
		int64_t k = label_at(l, i);
		if (k < 0 || k >= n) {
			dg_err_set(c->err, DG_EINVAL,
				   "label %lld at index %lld is outside [0, %lld)", (long long)k,
				   (long long)i, (long long)n);
			dg_err_hint(c->err, "labels are class indices below the logits' last "
				    "dimension");
			return DG_EINVAL;
		}
	}
	y = cpu_out(c, 0, x->dtype, &os);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	for (int64_t r = 0; r < y->numel; r++) {
		int64_t k = label_at(l, r);
		if (x->dtype == DG_F32) {
			const float *xr = (const float *)x->data + r * n;
			((float *)y->data)[r] = (float)(row_lse_f32(xr, n) - (double)xr[k]);
		} else {
			const double *xr = (const double *)x->data + r * n;
			((double *)y->data)[r] = row_lse_f64(xr, n) - xr[k];
		}
	}
	return DG_OK;
}

/* --- OneHot ------------------------------------------------------------------------- */

/* OneHot(indices): indices' shape + [depth] (axis -1, the only one: what a
 * cross-entropy wants), on_value where the last index equals the position,
 * off_value elsewhere; an index outside [0, depth) gives a row of off_value,
 * as TensorFlow. */
static const struct dg_attr_spec one_hot_attrs[] = {
	{ "depth", DG_ATTR_INT, true, "the number of classes (size of the new last dim)" },
	{ "on_value", DG_ATTR_FLOAT, false, "value at the index (default 1)" },
	{ "off_value", DG_ATTR_FLOAT, false, "value elsewhere (default 0)" },
	{ "dtype", DG_ATTR_DTYPE, false, "float32 (default) or float64" },
	{ 0 },
};

struct one_hot {
	int64_t depth;
	double on, off;
	enum dg_dtype dt;
};

static enum dg_status one_hot_attrs_of(struct dg_attrs a, struct one_hot *o, struct dg_err *err)
{
	static const double one = 1, zero = 0;
	static const enum dg_dtype f32 = DG_F32;
	enum dg_status st;

	if ((st = dg_attrs_int(a, "depth", NULL, &o->depth, err)) != DG_OK ||
	    (st = dg_attrs_float(a, "on_value", &one, &o->on, err)) != DG_OK ||
	    (st = dg_attrs_float(a, "off_value", &zero, &o->off, err)) != DG_OK ||
	    (st = dg_attrs_dtype(a, "dtype", &f32, &o->dt, err)) != DG_OK)
		return st;
	if (o->depth < 1 || o->depth > ((int64_t)1 << 31))
		return dg_err_set(err, DG_EINVAL, "attr 'depth' must be in 1..2^31, got %lld",
				  (long long)o->depth);
	if (o->dt != DG_F32 && o->dt != DG_F64)
		return dg_err_set(err, DG_EDTYPE, "attr 'dtype': OneHot makes float32 or float64, "
				  "not %s", dg_dtype_name(o->dt));
	return DG_OK;
}

static enum dg_status one_hot_check(const struct dg_ttype *in, struct dg_err *err)
{
	if (in->dtype != DG_I32 && in->dtype != DG_I64)
		return dg_err_set(err, DG_EDTYPE, "OneHot's indices must be int32 or int64, got %s",
				  dg_dtype_name(in->dtype));
	if (in->shape.ndim >= DG_MAX_DIMS)
		return dg_err_set(err, DG_ESHAPE, "OneHot adds a dim to rank %d indices; at most "
				  "%d dims", in->shape.ndim, DG_MAX_DIMS);
	return DG_OK;
}

static enum dg_status infer_one_hot(struct dg_infer_ctx *c)
{
	struct one_hot o;
	enum dg_status st = one_hot_attrs_of(dg_attrs_of_json(c->attrs), &o, c->err);

	if (st == DG_OK)
		st = one_hot_check(&c->in[0], c->err);
	if (st != DG_OK)
		return st;
	c->out[0].dtype = o.dt;
	c->out[0].shape = c->in[0].shape;
	if (c->out[0].shape.ndim >= 0)
		c->out[0].shape.dim[c->out[0].shape.ndim++] = o.depth;
	return DG_OK;
}

static enum dg_status k_one_hot(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0];
	struct dg_ttype tx = cpu_ttype(x);
	struct one_hot o;
	struct dg_shape s = x->shape;
	struct dg_tensor *y;
	enum dg_status st = one_hot_attrs_of(c->attrs, &o, c->err);

	if (st == DG_OK)
		st = one_hot_check(&tx, c->err);
	if (st != DG_OK)
		return st;
	s.dim[s.ndim++] = o.depth;
	if (!(y = cpu_out(c, 0, o.dt, &s)))
		return c->err ? c->err->code : DG_ENOMEM;
	for (int64_t i = 0; i < x->numel; i++) {
		int64_t k = x->dtype == DG_I32 ? ((const int32_t *)x->data)[i] :
			    ((const int64_t *)x->data)[i];
		for (int64_t j = 0; j < o.depth; j++) {
			double v = j == k ? o.on : o.off;
			if (o.dt == DG_F32)
				((float *)y->data)[i * o.depth + j] = (float)v;
			else
				((double *)y->data)[i * o.depth + j] = v;
		}
	}
	return DG_OK;
}

/* --- the table ------------------------------------------------------------------------ */

static const struct dg_attr_spec no_attrs[] = { { 0 } };

struct dg_op_def dg_ops_nn[] = {
	{ .name = "Softmax", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = softmax_attrs, .infer = infer_softmax, .cpu = k_softmax,
	  .grad = cpu_grad_softmax,
	  .doc = "e^x / sum(e^x) along an axis, max-subtracted; rows with NaN/+inf or all "
		 "-inf give NaN" },
	{ .name = "LogSoftmax", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = softmax_attrs, .infer = infer_log_softmax, .cpu = k_log_softmax,
	  .grad = cpu_grad_log_softmax,
	  .doc = "x - log(sum(e^x)) along an axis, max-subtracted" },
	{ .name = "SoftmaxCrossEntropyWithLogits", .min_inputs = 2, .max_inputs = 2,
	  .n_outputs = 1, .attrs = no_attrs, .infer = infer_xent, .cpu = k_xent,
	  .grad = cpu_grad_xent,
	  .doc = "loss[...] = -sum(labels * log_softmax(logits)) over the last axis" },
	{ .name = "SparseSoftmaxCrossEntropyWithLogits", .min_inputs = 2, .max_inputs = 2,
	  .n_outputs = 1, .attrs = no_attrs, .infer = infer_sparse_xent, .cpu = k_sparse_xent,
	  .grad = cpu_grad_sparse_xent,
	  .doc = "loss[...] = -log_softmax(logits)[..., label] for int class labels" },
	{ .name = "OneHot", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = one_hot_attrs, .infer = infer_one_hot, .cpu = k_one_hot,
	  .doc = "indices [...] to [..., depth]: on_value at each index, off_value elsewhere "
		 "(an index outside [0, depth): a row of off_value)" },
	{ 0 },
};
