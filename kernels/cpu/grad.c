/* Reverse-mode gradients: one function per differentiable op that appends the
 * nodes computing d(loss)/d(inputs) to the graph worker/autodiff.c builds, and
 * the helper ops those nodes use where a shape is only known at run time
 * (SumToShapeOf, ReshapeLike, UnreduceLike, SliceGrad) or where a fused kernel
 * beats a chain of elementwise nodes (ReluGrad, SigmoidGrad, TanhGrad,
 * SparseSoftmaxCrossEntropyGrad). Registered via dg_ops_grad. */
#include "grad.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* ======================================================================== */
/* Helper op kernels                                                          */

static const struct dg_attr_spec no_attrs[] = { { 0 } };

static enum dg_status need_float(enum dg_dtype dt, const char *what, struct dg_err *err)
{
	if (dt == DG_F32 || dt == DG_F64)
		return DG_OK;
	dg_err_set(err, DG_EDTYPE, "%s must be float32 or float64, got %s", what,
		   (unsigned)dt < DG_DTYPE_COUNT ? dg_dtype_name(dt) : "an invalid dtype");
	dg_err_hint(err, "gradients are computed for float tensors only");
	return DG_EDTYPE;
}

static enum dg_status check_in(const struct dg_kernel_ctx *c, int n)
{
	if (c->n_in != n || c->n_out != 1)
		return dg_err_set(c->err, DG_EINVAL, "expected %d inputs and 1 output, got %d "
				  "and %d", n, c->n_in, c->n_out);
	for (int i = 0; i < n; i++)
		if (!c->in[i] || (unsigned)c->in[i]->dtype >= DG_DTYPE_COUNT)
			return dg_err_set(c->err, DG_EINVAL, "input %d is missing or invalid", i);
	return DG_OK;
}

static enum dg_status out_failed(const struct dg_kernel_ctx *c)
{
	return c->err ? c->err->code : DG_ENOMEM;
}

/* "x: [2,3] does not broadcast to [4,3]"-style text for shape errors. */
static enum dg_status shape_err(struct dg_err *err, const char *fmt, const struct dg_shape *a,
				const struct dg_shape *b)
{
	char sa[96], sb[96];

	dg_shape_format(a, sa, sizeof sa);
	dg_shape_format(b, sb, sizeof sb);
	return dg_err_set(err, DG_ESHAPE, fmt, sa, sb);
}

/* Walk a big shape in C order together with the offset into a small shape
 * that broadcasts to it (small aligned on the right; its size-1 and missing
 * dims get stride 0). */
struct walk {
	int nd;
	int64_t dim[DG_MAX_DIMS];
	int64_t st[DG_MAX_DIMS];     /* element stride into the small tensor */
};

/* DG_ESHAPE unless small broadcasts to big (sizes equal or 1, rank <= big's). */
static enum dg_status walk_init(struct walk *w, const struct dg_shape *big,
				const struct dg_shape *small, struct dg_err *err)
{
	int64_t s = 1;
	int off = big->ndim - small->ndim;

	if (off < 0)
		return shape_err(err, "%s has more dims than %s", small, big);
	for (int j = big->ndim - 1; j >= 0; j--) {
		int k = j - off;
		int64_t d = k >= 0 ? small->dim[k] : 1;
		if (d != 1 && d != big->dim[j])
			return shape_err(err, "%s does not broadcast to %s", small, big);
		w->dim[j] = big->dim[j];
		w->st[j] = d == 1 ? 0 : s;
		s *= d;
	}
	w->nd = big->ndim;
	if (w->nd == 0) {
		w->nd = 1;
		w->dim[0] = 1;
		w->st[0] = 0;
	}
	return DG_OK;
}

/* Advance the outer index (dims 0..nd-2) by one row, keeping off in step. */
static void walk_next(const struct walk *w, int64_t *idx, int64_t *off)
{
	for (int d = w->nd - 2; d >= 0; d--) {
		*off += w->st[d];
		if (++idx[d] < w->dim[d])
			return;
		*off -= w->st[d] * w->dim[d];
		idx[d] = 0;
	}
}

/* o (small, zeroed) += x (big); or o (big) = x (small) * scale. */
#define DEF_WALK(T, SUF)                                                                     \
	static void sum_to_##SUF(const struct walk *w, const T *x, T *o, int64_t n)          \
	{                                                                                    \
		int64_t idx[DG_MAX_DIMS] = { 0 }, off = 0;                                   \
		int64_t inner = w->dim[w->nd - 1], ist = w->st[w->nd - 1];                   \
		for (int64_t base = 0; base < n; base += inner) {                            \
			for (int64_t k = 0; k < inner; k++)                                  \
				o[off + k * ist] += x[base + k];                             \
			walk_next(w, idx, &off);                                             \
		}                                                                            \
	}                                                                                    \
	static void bcast_##SUF(const struct walk *w, const T *x, T *o, int64_t n, T scale)  \
	{                                                                                    \
		int64_t idx[DG_MAX_DIMS] = { 0 }, off = 0;                                   \
		int64_t inner = w->dim[w->nd - 1], ist = w->st[w->nd - 1];                   \
		for (int64_t base = 0; base < n; base += inner) {                            \
			for (int64_t k = 0; k < inner; k++)                                  \
				o[base + k] = x[off + k * ist] * scale;                      \
			walk_next(w, idx, &off);                                             \
		}                                                                            \
	}
DEF_WALK(float, f32)
DEF_WALK(double, f64)

static enum dg_status infer_like(struct dg_infer_ctx *c)
{
	enum dg_status st = need_float(c->in[0].dtype, "the gradient", c->err);

	if (st != DG_OK)
		return st;
	c->out[0].dtype = c->in[0].dtype;
	c->out[0].shape = c->in[1].shape;
	return DG_OK;
}

/* SumToShapeOf(x, like): x summed over the dims along which like's shape was
 * broadcast to x's, giving like's shape. The reverse of NumPy broadcasting. */
static enum dg_status k_sum_to(struct dg_kernel_ctx *c)
{
	enum dg_status st = check_in(c, 2);
	struct walk w;
	struct dg_tensor *o;

	if (st == DG_OK)
		st = need_float(c->in[0]->dtype, "the gradient", c->err);
	if (st == DG_OK)
		st = walk_init(&w, &c->in[0]->shape, &c->in[1]->shape, c->err);
	if (st != DG_OK)
		return st;
	o = cpu_out_zero(c, 0, c->in[0]->dtype, &c->in[1]->shape);
	if (!o)
		return out_failed(c);
	if (c->in[0]->dtype == DG_F32)
		sum_to_f32(&w, c->in[0]->data, o->data, c->in[0]->numel);
	else
		sum_to_f64(&w, c->in[0]->data, o->data, c->in[0]->numel);
	return DG_OK;
}

/* ReshapeLike(x, like): x's elements in like's shape (any dtype). */
static enum dg_status infer_reshape_like(struct dg_infer_ctx *c)
{
	c->out[0].dtype = c->in[0].dtype;
	c->out[0].shape = c->in[1].shape;
	return DG_OK;
}

static enum dg_status k_reshape_like(struct dg_kernel_ctx *c)
{
	enum dg_status st = check_in(c, 2);
	const struct dg_tensor *x, *like;

	if (st != DG_OK)
		return st;
	x = c->in[0];
	like = c->in[1];
	if (x->numel != like->numel)
		return shape_err(c->err, "cannot reshape %s to %s: element counts differ",
				 &x->shape, &like->shape);
	c->out[0] = dg_tensor_from_data(x->dtype, &like->shape, x->data, c->err);
	return c->out[0] ? DG_OK : out_failed(c);
}

/* Reduced-axis mask for a rank-ndim value from attr "axis" (absent or null:
 * all; an integer; a list). */
static enum dg_status axes_of(struct dg_attrs attrs, int ndim, unsigned *mask, struct dg_err *err)
{
	const json_t *v = dg_attrs_get(attrs, "axis");
	int64_t ax[DG_MAX_DIMS];
	int n = 0;

	*mask = 0;
	if (!v || json_is_null(v)) {
		*mask = ndim > 0 ? (1u << ndim) - 1 : 0;
		return DG_OK;
	}
	if (json_is_integer(v)) {
		ax[n++] = json_integer_value(v);
	} else {
		size_t i;
		json_t *e;
		if (!json_is_array(v) || json_array_size(v) > DG_MAX_DIMS)
			return dg_err_set(err, DG_EINVAL, "attr 'axis' must be an integer, a list "
					  "of at most %d integers or null", DG_MAX_DIMS);
		json_array_foreach(v, i, e) {
			if (!json_is_integer(e))
				return dg_err_set(err, DG_EINVAL, "attr 'axis'[%zu] must be an "
						  "integer", i);
			ax[n++] = json_integer_value(e);
		}
	}
	for (int i = 0; i < n; i++) {
		int a;
		enum dg_status st = cpu_axis(ax[i], ndim, &a, err);
		if (st != DG_OK)
			return st;
		*mask |= 1u << a;
	}
	return DG_OK;
}

/* UnreduceLike(g, like; axis, keepdims, mean): g, the gradient of a reduction
 * of like over axis, spread back over like's shape (divided by the number of
 * reduced elements when mean). g may have keepdims' shape or not. */
static const struct dg_attr_spec unreduce_attrs[] = {
	{ "axis", DG_ATTR_AXES, false, "the reduction's axes (absent or null: all)" },
	{ "keepdims", DG_ATTR_BOOL, false, "accepted for symmetry with the reduction; g may "
					   "have either form" },
	{ "mean", DG_ATTR_BOOL, false, "divide by the number of reduced elements (Mean)" },
	{ 0 },
};

static enum dg_status k_unreduce(struct dg_kernel_ctx *c)
{
	enum dg_status st = check_in(c, 2);
	const struct dg_tensor *g, *like;
	struct dg_shape keep;
	unsigned mask;
	int64_t count = 1;
	bool mean = false, no = false;
	struct walk w;
	struct dg_tensor *o;

	if (st != DG_OK)
		return st;
	g = c->in[0];
	like = c->in[1];
	st = need_float(g->dtype, "the gradient", c->err);
	if (st == DG_OK)
		st = axes_of(c->attrs, like->shape.ndim, &mask, c->err);
	if (st == DG_OK)
		st = dg_attrs_bool(c->attrs, "mean", &no, &mean, c->err);
	if (st != DG_OK)
		return st;
	keep = like->shape;
	for (int i = 0; i < keep.ndim; i++)
		if (mask & (1u << i)) {
			count *= keep.dim[i];
			keep.dim[i] = 1;
		}
	{
		int64_t kn = 1;
		for (int i = 0; i < keep.ndim; i++)
			kn *= keep.dim[i];
		if (kn != g->numel)
			return shape_err(c->err, "gradient %s does not match the reduction of %s",
					 &g->shape, &like->shape);
	}
	st = walk_init(&w, &like->shape, &keep, c->err);
	if (st != DG_OK)
		return st;
	o = cpu_out(c, 0, g->dtype, &like->shape);
	if (!o)
		return out_failed(c);
	double scale = mean && count > 0 ? 1.0 / (double)count : 1.0;
	if (g->dtype == DG_F32)
		bcast_f32(&w, g->data, o->data, o->numel, (float)scale);
	else
		bcast_f64(&w, g->data, o->data, o->numel, scale);
	return DG_OK;
}

/* SliceGrad(g, like; begin): zeros of like's shape with g written at begin. */
static const struct dg_attr_spec slice_grad_attrs[] = {
	{ "begin", DG_ATTR_INTS, true, "where the slice started, per dimension" },
	{ 0 },
};

static enum dg_status k_slice_grad(struct dg_kernel_ctx *c)
{
	enum dg_status st = check_in(c, 2);
	int64_t begin[DG_MAX_DIMS];
	const struct dg_tensor *g, *like;
	struct dg_tensor *o;
	int nb = 0;

	if (st == DG_OK)
		st = dg_attrs_ints(c->attrs, "begin", true, begin, DG_MAX_DIMS, &nb, c->err);
	if (st != DG_OK)
		return st;
	g = c->in[0];
	like = c->in[1];
	if (g->shape.ndim != like->shape.ndim || nb != g->shape.ndim)
		return shape_err(c->err, "slice gradient %s does not fit %s (rank or begin differ)",
				 &g->shape, &like->shape);
	for (int d = 0; d < nb; d++)
		if (begin[d] < 0 || begin[d] + g->shape.dim[d] > like->shape.dim[d])
			return shape_err(c->err, "slice gradient %s does not fit in %s at begin",
					 &g->shape, &like->shape);
	o = cpu_out_zero(c, 0, g->dtype, &like->shape);
	if (!o)
		return out_failed(c);
	if (g->numel == 0)
		return DG_OK;
	/* Copy g row by row (rows along the last dim) into o at begin. */
	size_t esz = dg_dtype_size(g->dtype);
	int nd = g->shape.ndim;
	int64_t ost[DG_MAX_DIMS], idx[DG_MAX_DIMS] = { 0 }, s = 1;
	for (int d = nd - 1; d >= 0; d--) {
		ost[d] = s;
		s *= like->shape.dim[d];
	}
	int64_t inner = nd > 0 ? g->shape.dim[nd - 1] : 1;
	for (int64_t base = 0; base < g->numel; base += inner) {
		int64_t off = 0;
		for (int d = 0; d < nd; d++)
			off += (begin[d] + idx[d]) * ost[d];
		memcpy((char *)o->data + (size_t)off * esz,
		       (const char *)g->data + (size_t)base * esz, (size_t)inner * esz);
		for (int d = nd - 2; d >= 0; d--) {
			if (++idx[d] < g->shape.dim[d])
				break;
			idx[d] = 0;
		}
	}
	return DG_OK;
}

/* Fused elementwise gradients: out = f(g, v) with g and v of one shape. */
#define DEF_EW(name, T, SUF, EXPR)                                                           \
	static void name##_##SUF(int64_t n, const T *restrict g, const T *restrict v,        \
				 T *restrict o)                                              \
	{                                                                                    \
		for (int64_t i = 0; i < n; i++) {                                            \
			T y = v[i];                                                          \
			o[i] = (EXPR);                                                       \
		}                                                                            \
	}
/* Relu passes the gradient where x > 0 (0 at x == 0, as TensorFlow). */
DEF_EW(relu_g, float, f32, y > 0 ? g[i] : 0.0f)
DEF_EW(relu_g, double, f64, y > 0 ? g[i] : 0.0)
/* From the outputs: sigmoid' = y (1 - y), tanh' = 1 - y^2. */
DEF_EW(sigm_g, float, f32, g[i] * y * (1.0f - y))
DEF_EW(sigm_g, double, f64, g[i] * y * (1.0 - y))
DEF_EW(tanh_g, float, f32, g[i] * (1.0f - y * y))
DEF_EW(tanh_g, double, f64, g[i] * (1.0 - y * y))

static enum dg_status infer_ew(struct dg_infer_ctx *c)
{
	enum dg_status st = need_float(c->in[0].dtype, "the gradient", c->err);

	if (st != DG_OK)
		return st;
	if (c->in[1].dtype != c->in[0].dtype)
		return dg_err_set(c->err, DG_EDTYPE, "dtypes %s and %s differ",
				  dg_dtype_name(c->in[0].dtype), dg_dtype_name(c->in[1].dtype));
	c->out[0] = c->in[0];
	if (c->out[0].shape.ndim < 0)
		c->out[0].shape = c->in[1].shape;
	return DG_OK;
}

static enum dg_status run_ew(struct dg_kernel_ctx *c,
			     void (*f32)(int64_t, const float *, const float *, float *),
			     void (*f64)(int64_t, const double *, const double *, double *))
{
	enum dg_status st = check_in(c, 2);
	const struct dg_tensor *g, *v;
	struct dg_tensor *o;

	if (st == DG_OK)
		st = need_float(c->in[0]->dtype, "the gradient", c->err);
	if (st != DG_OK)
		return st;
	g = c->in[0];
	v = c->in[1];
	if (g->dtype != v->dtype)
		return dg_err_set(c->err, DG_EDTYPE, "dtypes %s and %s differ",
				  dg_dtype_name(g->dtype), dg_dtype_name(v->dtype));
	if (!dg_shape_eq(&g->shape, &v->shape))
		return shape_err(c->err, "shapes %s and %s differ", &g->shape, &v->shape);
	o = cpu_out(c, 0, g->dtype, &g->shape);
	if (!o)
		return out_failed(c);
	if (g->dtype == DG_F32)
		f32(g->numel, g->data, v->data, o->data);
	else
		f64(g->numel, g->data, v->data, o->data);
	return DG_OK;
}

static enum dg_status k_relu_grad(struct dg_kernel_ctx *c)
{
	return run_ew(c, relu_g_f32, relu_g_f64);
}

static enum dg_status k_sigmoid_grad(struct dg_kernel_ctx *c)
{
	return run_ew(c, sigm_g_f32, sigm_g_f64);
}

static enum dg_status k_tanh_grad(struct dg_kernel_ctx *c)
{
	return run_ew(c, tanh_g_f32, tanh_g_f64);
}

/* SparseSoftmaxCrossEntropyGrad(logits [..., C], labels [...]) = softmax(logits)
 * - one_hot(labels): the gradient of the sparse cross-entropy per unit loss. */
#define DEF_SPARSE_G(T, SUF)                                                                 \
	static void sparse_g_##SUF(const T *x, T *o, int64_t rows, int64_t n_cls,            \
				   const int64_t *lab)                                       \
	{                                                                                    \
		for (int64_t r = 0; r < rows; r++) {                                         \
			const T *xr = x + r * n_cls;                                         \
			T *orow = o + r * n_cls;                                             \
			double m = -INFINITY, s = 0;                                         \
			for (int64_t k = 0; k < n_cls; k++)                                  \
				m = xr[k] > m ? xr[k] : m;                                   \
			for (int64_t k = 0; k < n_cls; k++)                                  \
				s += exp((double)xr[k] - m);                                 \
			for (int64_t k = 0; k < n_cls; k++)                                  \
				orow[k] = (T)(exp((double)xr[k] - m) / s);                   \
			orow[lab[r]] -= 1;                                                   \
		}                                                                            \
	}
DEF_SPARSE_G(float, f32)
DEF_SPARSE_G(double, f64)

static enum dg_status infer_sparse_g(struct dg_infer_ctx *c)
{
	enum dg_status st = need_float(c->in[0].dtype, "logits", c->err);

	if (st != DG_OK)
		return st;
	if (c->in[1].dtype != DG_I32 && c->in[1].dtype != DG_I64)
		return dg_err_set(c->err, DG_EDTYPE, "labels must be int32 or int64, got %s",
				  dg_dtype_name(c->in[1].dtype));
	c->out[0] = c->in[0];
	return DG_OK;
}

static enum dg_status k_sparse_g(struct dg_kernel_ctx *c)
{
	enum dg_status st = check_in(c, 2);
	const struct dg_tensor *x, *l;
	struct dg_tensor *o;
	int64_t *lab = NULL, rows, n_cls;

	if (st == DG_OK)
		st = need_float(c->in[0]->dtype, "logits", c->err);
	if (st != DG_OK)
		return st;
	x = c->in[0];
	l = c->in[1];
	if (l->dtype != DG_I32 && l->dtype != DG_I64)
		return dg_err_set(c->err, DG_EDTYPE, "labels must be int32 or int64, got %s",
				  dg_dtype_name(l->dtype));
	if (x->shape.ndim < 1 || l->shape.ndim != x->shape.ndim - 1 ||
	    memcmp(l->shape.dim, x->shape.dim, sizeof(int64_t) * (size_t)l->shape.ndim) != 0)
		return shape_err(c->err, "logits %s and labels %s do not match (labels are "
				 "logits' shape without the class axis)", &x->shape, &l->shape);
	n_cls = x->shape.dim[x->shape.ndim - 1];
	rows = l->numel;
	if (rows > 0 && n_cls == 0)
		return dg_err_set(c->err, DG_EINVAL, "logits have 0 classes");
	lab = dg_alloc_aligned((size_t)(rows > 0 ? rows : 1) * sizeof *lab);
	if (!lab)
		return dg_err_set(c->err, DG_ENOMEM, "out of memory for %lld labels",
				  (long long)rows);
	for (int64_t r = 0; r < rows; r++) {
		lab[r] = l->dtype == DG_I32 ? ((const int32_t *)l->data)[r]
					    : ((const int64_t *)l->data)[r];
		if (lab[r] < 0 || lab[r] >= n_cls) {
			dg_err_set(c->err, DG_EINVAL, "label %lld (element %lld) is outside "
				   "0..%lld", (long long)lab[r], (long long)r,
				   (long long)(n_cls - 1));
			dg_free_aligned(lab);
			return DG_EINVAL;
		}
	}
	o = cpu_out(c, 0, x->dtype, &x->shape);
	if (o) {
		if (x->dtype == DG_F32)
			sparse_g_f32(x->data, o->data, rows, n_cls, lab);
		else
			sparse_g_f64(x->data, o->data, rows, n_cls, lab);
	}
	dg_free_aligned(lab);
	return o ? DG_OK : out_failed(c);
}

struct dg_op_def dg_ops_grad[] = {
	{ .name = "SumToShapeOf", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = no_attrs, .infer = infer_like, .cpu = k_sum_to,
	  .doc = "gradient helper: x summed over the dims along which like's shape broadcasts "
		 "to x's; result has like's shape" },
	{ .name = "ReshapeLike", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = no_attrs, .infer = infer_reshape_like, .cpu = k_reshape_like,
	  .doc = "gradient helper: x's elements in the shape of like (taken at run time)" },
	{ .name = "UnreduceLike", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = unreduce_attrs, .infer = infer_like, .cpu = k_unreduce,
	  .doc = "gradient helper: g (a reduction of like over axis) repeated over like's "
		 "shape, / count when mean" },
	{ .name = "SliceGrad", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = slice_grad_attrs, .infer = infer_reshape_like, .cpu = k_slice_grad,
	  .doc = "gradient helper: zeros of like's shape with g written at begin" },
	{ .name = "ReluGrad", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = no_attrs, .infer = infer_ew, .cpu = k_relu_grad,
	  .doc = "gradient helper: g where x > 0, else 0 (inputs g, x)" },
	{ .name = "SigmoidGrad", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = no_attrs, .infer = infer_ew, .cpu = k_sigmoid_grad,
	  .doc = "gradient helper: g * y * (1 - y) for y = Sigmoid(x) (inputs g, y)" },
	{ .name = "TanhGrad", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = no_attrs, .infer = infer_ew, .cpu = k_tanh_grad,
	  .doc = "gradient helper: g * (1 - y^2) for y = Tanh(x) (inputs g, y)" },
	{ .name = "SparseSoftmaxCrossEntropyGrad", .min_inputs = 2, .max_inputs = 2,
	  .n_outputs = 1, .attrs = no_attrs, .infer = infer_sparse_g, .cpu = k_sparse_g,
	  .doc = "gradient helper: softmax(logits) - one_hot(labels) over the last axis" },
	{ 0 },
};

/* ======================================================================== */
/* Gradient builders                                                          */

/* Every add failure has set c->err; grad functions return its code. */
static enum dg_status failed(const struct dg_grad_ctx *c)
{
	return c->err && c->err->code != DG_OK ? c->err->code : DG_EINTERNAL;
}

#define TRY(x)                                                                               \
	do {                                                                                 \
		if (!(x))                                                                    \
			return failed(c);                                                    \
	} while (0)

static const char *op1(struct dg_grad_ctx *c, const char *op, const char *a, json_t *attrs)
{
	const char *in[1] = { a };

	return c->add(c, op, in, 1, attrs);
}

static const char *op2(struct dg_grad_ctx *c, const char *op, const char *a, const char *b,
		       json_t *attrs)
{
	const char *in[2] = { a, b };

	return c->add(c, op, in, 2, attrs);
}

static const char *op3(struct dg_grad_ctx *c, const char *op, const char *a, const char *b,
		       const char *d, json_t *attrs)
{
	const char *in[3] = { a, b, d };

	return c->add(c, op, in, 3, attrs);
}

/* A scalar Const of dtype dt. */
static const char *cst(struct dg_grad_ctx *c, double v, enum dg_dtype dt)
{
	return c->add(c, "Const", NULL, 0,
		      json_pack("{s:f, s:s}", "value", v, "dtype", dg_dtype_name(dt)));
}

static bool is_float(enum dg_dtype dt)
{
	return dt == DG_F32 || dt == DG_F64;
}

/* g (the gradient of output 0) reduced to input i's shape: itself when the
 * static shapes already agree, else SumToShapeOf(g, input i). */
static const char *unbroadcast(struct dg_grad_ctx *c, const char *g, int i)
{
	const struct dg_shape *in = &c->in_type[i].shape, *out = &c->out_type[0].shape;

	if (!g)
		return NULL;
	if (dg_shape_is_known(in) && dg_shape_is_known(out) && dg_shape_eq(in, out))
		return g;
	return op2(c, "SumToShapeOf", g, c->in[i], NULL);
}

/* A gradient t computed with input i's shape, except for dims along which i
 * was broadcast: t itself when same, else SumToShapeOf(t, input i). */
static const char *reduce_to(struct dg_grad_ctx *c, const char *t, int i, bool same)
{
	return same ? t : op2(c, "SumToShapeOf", t, c->in[i], NULL);
}

/* Both inputs have the same fully known shape. */
static bool same_inputs(const struct dg_grad_ctx *c)
{
	return dg_shape_is_known(&c->in_type[0].shape) && dg_shape_is_known(&c->in_type[1].shape) &&
	       dg_shape_eq(&c->in_type[0].shape, &c->in_type[1].shape);
}

/* Batch dims (all but the last two) of both inputs known and equal. */
static bool same_batch(const struct dg_grad_ctx *c)
{
	const struct dg_shape *a = &c->in_type[0].shape, *b = &c->in_type[1].shape;

	if (a->ndim < 2 || a->ndim != b->ndim)
		return false;
	for (int d = 0; d < a->ndim - 2; d++)
		if (a->dim[d] < 0 || a->dim[d] != b->dim[d])
			return false;
	return true;
}

/* Input i wants a gradient (float, reached from a wrt). */
static bool want(const struct dg_grad_ctx *c, int i)
{
	return c->need[i] && is_float(c->in_type[i].dtype);
}

enum dg_status cpu_grad_identity(struct dg_grad_ctx *c)
{
	c->din[0] = c->dout[0];
	return DG_OK;
}

enum dg_status cpu_grad_neg(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op1(c, "Neg", c->dout[0], NULL));
	return DG_OK;
}

/* d|x| = sign(x), built as (x > 0) - (x < 0): 0 at x == 0, as TensorFlow. */
enum dg_status cpu_grad_abs(struct dg_grad_ctx *c)
{
	enum dg_dtype dt = c->in_type[0].dtype;
	const char *zero, *pos, *neg, *sign;

	TRY(zero = cst(c, 0, dt));
	TRY(pos = op2(c, "Greater", c->in[0], zero, NULL));
	TRY(neg = op2(c, "Less", c->in[0], zero, NULL));
	TRY(pos = op1(c, "Cast", pos, json_pack("{s:s}", "dtype", dg_dtype_name(dt))));
	TRY(neg = op1(c, "Cast", neg, json_pack("{s:s}", "dtype", dg_dtype_name(dt))));
	TRY(sign = op2(c, "Sub", pos, neg, NULL));
	TRY(c->din[0] = op2(c, "Mul", c->dout[0], sign, NULL));
	return DG_OK;
}

enum dg_status cpu_grad_square(struct dg_grad_ctx *c)
{
	const char *two, *t;

	TRY(two = cst(c, 2, c->in_type[0].dtype));
	TRY(t = op2(c, "Mul", c->in[0], two, NULL));
	TRY(c->din[0] = op2(c, "Mul", c->dout[0], t, NULL));
	return DG_OK;
}

/* d sqrt(x) = 0.5 / y. */
enum dg_status cpu_grad_sqrt(struct dg_grad_ctx *c)
{
	const char *half, *t;

	TRY(half = cst(c, 0.5, c->in_type[0].dtype));
	TRY(t = op2(c, "Mul", c->dout[0], half, NULL));
	TRY(c->din[0] = op2(c, "Div", t, c->out[0], NULL));
	return DG_OK;
}

enum dg_status cpu_grad_exp(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op2(c, "Mul", c->dout[0], c->out[0], NULL));
	return DG_OK;
}

enum dg_status cpu_grad_log(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op2(c, "Div", c->dout[0], c->in[0], NULL));
	return DG_OK;
}

enum dg_status cpu_grad_relu(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op2(c, "ReluGrad", c->dout[0], c->in[0], NULL));
	return DG_OK;
}

enum dg_status cpu_grad_sigmoid(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op2(c, "SigmoidGrad", c->dout[0], c->out[0], NULL));
	return DG_OK;
}

enum dg_status cpu_grad_tanh(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op2(c, "TanhGrad", c->dout[0], c->out[0], NULL));
	return DG_OK;
}

enum dg_status cpu_grad_add(struct dg_grad_ctx *c)
{
	if (want(c, 0))
		TRY(c->din[0] = unbroadcast(c, c->dout[0], 0));
	if (want(c, 1))
		TRY(c->din[1] = unbroadcast(c, c->dout[0], 1));
	return DG_OK;
}

enum dg_status cpu_grad_sub(struct dg_grad_ctx *c)
{
	const char *n;

	if (want(c, 0))
		TRY(c->din[0] = unbroadcast(c, c->dout[0], 0));
	if (want(c, 1)) {
		TRY(n = op1(c, "Neg", c->dout[0], NULL));
		TRY(c->din[1] = unbroadcast(c, n, 1));
	}
	return DG_OK;
}

enum dg_status cpu_grad_mul(struct dg_grad_ctx *c)
{
	const char *t;

	if (want(c, 0)) {
		TRY(t = op2(c, "Mul", c->dout[0], c->in[1], NULL));
		TRY(c->din[0] = unbroadcast(c, t, 0));
	}
	if (want(c, 1)) {
		TRY(t = op2(c, "Mul", c->dout[0], c->in[0], NULL));
		TRY(c->din[1] = unbroadcast(c, t, 1));
	}
	return DG_OK;
}

/* d(a/b)/da = 1/b; d(a/b)/db = -(a/b)/b = -y/b. */
enum dg_status cpu_grad_div(struct dg_grad_ctx *c)
{
	const char *t;

	if (want(c, 0)) {
		TRY(t = op2(c, "Div", c->dout[0], c->in[1], NULL));
		TRY(c->din[0] = unbroadcast(c, t, 0));
	}
	if (want(c, 1)) {
		TRY(t = op2(c, "Mul", c->dout[0], c->out[0], NULL));
		TRY(t = op2(c, "Div", t, c->in[1], NULL));
		TRY(t = op1(c, "Neg", t, NULL));
		TRY(c->din[1] = unbroadcast(c, t, 1));
	}
	return DG_OK;
}

/* d(a^b)/da = b a^(b-1); d(a^b)/db = y log(a), taken as 0 where a <= 0 (as
 * TensorFlow: the real power is not differentiable in b there). */
enum dg_status cpu_grad_pow(struct dg_grad_ctx *c)
{
	enum dg_dtype dt = c->in_type[0].dtype;
	const char *t, *one, *zero, *pos, *loga, *zl;

	if (want(c, 0)) {
		TRY(one = cst(c, 1, dt));
		TRY(t = op2(c, "Sub", c->in[1], one, NULL));
		TRY(t = op2(c, "Pow", c->in[0], t, NULL));
		TRY(t = op2(c, "Mul", t, c->in[1], NULL));
		TRY(t = op2(c, "Mul", c->dout[0], t, NULL));
		TRY(c->din[0] = unbroadcast(c, t, 0));
	}
	if (want(c, 1)) {
		TRY(zero = cst(c, 0, dt));
		TRY(pos = op2(c, "Greater", c->in[0], zero, NULL));
		/* log of a where a > 0, else of 1: no NaN reaches the Where. */
		TRY(one = cst(c, 1, dt));
		TRY(t = op3(c, "Where", pos, c->in[0], one, NULL));
		TRY(loga = op1(c, "Log", t, NULL));
		TRY(zl = op1(c, "ZerosLike", loga, NULL));
		TRY(loga = op3(c, "Where", pos, loga, zl, NULL));
		TRY(t = op2(c, "Mul", c->dout[0], c->out[0], NULL));
		TRY(t = op2(c, "Mul", t, loga, NULL));
		TRY(c->din[1] = unbroadcast(c, t, 1));
	}
	return DG_OK;
}

/* Maximum/Minimum: the gradient goes to a where a >= b (<= for Minimum) and
 * to b elsewhere, so a tie goes to a, as TensorFlow does. */
static enum dg_status grad_select(struct dg_grad_ctx *c, const char *cmp)
{
	const char *mask, *zero, *t;

	TRY(mask = op2(c, cmp, c->in[0], c->in[1], NULL));
	TRY(zero = op1(c, "ZerosLike", c->dout[0], NULL));
	if (want(c, 0)) {
		TRY(t = op3(c, "Where", mask, c->dout[0], zero, NULL));
		TRY(c->din[0] = unbroadcast(c, t, 0));
	}
	if (want(c, 1)) {
		TRY(t = op3(c, "Where", mask, zero, c->dout[0], NULL));
		TRY(c->din[1] = unbroadcast(c, t, 1));
	}
	return DG_OK;
}

enum dg_status cpu_grad_maximum(struct dg_grad_ctx *c)
{
	return grad_select(c, "GreaterEqual");
}

enum dg_status cpu_grad_minimum(struct dg_grad_ctx *c)
{
	return grad_select(c, "LessEqual");
}

/* Where(cond, x, y): x's gradient where cond holds, y's elsewhere. */
enum dg_status cpu_grad_where(struct dg_grad_ctx *c)
{
	const char *zero, *t;

	TRY(zero = op1(c, "ZerosLike", c->dout[0], NULL));
	if (want(c, 1)) {
		TRY(t = op3(c, "Where", c->in[0], c->dout[0], zero, NULL));
		TRY(c->din[1] = unbroadcast(c, t, 1));
	}
	if (want(c, 2)) {
		TRY(t = op3(c, "Where", c->in[0], zero, c->dout[0], NULL));
		TRY(c->din[2] = unbroadcast(c, t, 2));
	}
	return DG_OK;
}

/* Cast between floats: the gradient cast back to the input's dtype. */
enum dg_status cpu_grad_cast(struct dg_grad_ctx *c)
{
	enum dg_dtype from = c->in_type[0].dtype, to = c->out_type[0].dtype;

	if (!is_float(from) || !is_float(to))
		return DG_OK;   /* through ints or bools nothing flows */
	if (from == to) {
		c->din[0] = c->dout[0];
		return DG_OK;
	}
	TRY(c->din[0] = op1(c, "Cast", c->dout[0],
			    json_pack("{s:s}", "dtype", dg_dtype_name(from))));
	return DG_OK;
}

/* {"axis": <the forward axis or null>, "keepdims": k, "mean": m}. */
static json_t *unreduce_attrs_of(const json_t *fwd, bool mean)
{
	const json_t *axis = json_object_get(fwd, "axis");
	bool keep = json_is_true(json_object_get(fwd, "keepdims")) ||
		    json_is_true(json_object_get(fwd, "keep_dims"));

	return json_pack("{s:O?, s:b, s:b}", "axis", axis, "keepdims", keep, "mean", mean);
}

enum dg_status cpu_grad_sum(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op2(c, "UnreduceLike", c->dout[0], c->in[0],
			    unreduce_attrs_of(c->attrs, false)));
	return DG_OK;
}

enum dg_status cpu_grad_mean(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op2(c, "UnreduceLike", c->dout[0], c->in[0],
			    unreduce_attrs_of(c->attrs, true)));
	return DG_OK;
}

/* Max (and Min): the gradient goes to the positions equal to the result,
 * split evenly among ties (TensorFlow's rule since 1.x: each of k maxima gets
 * g / k). */
enum dg_status cpu_grad_max(struct dg_grad_ctx *c)
{
	enum dg_dtype dt = c->in_type[0].dtype;
	const char *yfull, *gfull, *mask, *cnt, *t;
	const json_t *axis = dg_attrs_get(dg_attrs_of_json(c->attrs), "axis");

	TRY(yfull = op2(c, "UnreduceLike", c->out[0], c->in[0],
			unreduce_attrs_of(c->attrs, false)));
	TRY(gfull = op2(c, "UnreduceLike", c->dout[0], c->in[0],
			unreduce_attrs_of(c->attrs, false)));
	TRY(mask = op2(c, "Equal", c->in[0], yfull, NULL));
	TRY(mask = op1(c, "Cast", mask, json_pack("{s:s}", "dtype", dg_dtype_name(dt))));
	TRY(cnt = op1(c, "Sum", mask, json_pack("{s:O?, s:b}", "axis", axis, "keepdims", 1)));
	TRY(t = op2(c, "Div", mask, cnt, NULL));
	TRY(c->din[0] = op2(c, "Mul", t, gfull, NULL));
	return DG_OK;
}

static json_t *axis_keep(const json_t *fwd)
{
	const json_t *axis = json_object_get(fwd, "axis");
	json_int_t a = json_is_integer(axis) ? json_integer_value(axis) : -1;

	return json_pack("{s:[I], s:b}", "axis", a, "keepdims", 1);
}

/* y = softmax(x): dx = y * (g - sum(g * y, axis)). */
enum dg_status cpu_grad_softmax(struct dg_grad_ctx *c)
{
	const char *gy, *s, *t;

	TRY(gy = op2(c, "Mul", c->dout[0], c->out[0], NULL));
	TRY(s = op1(c, "Sum", gy, axis_keep(c->attrs)));
	TRY(t = op2(c, "Sub", c->dout[0], s, NULL));
	TRY(c->din[0] = op2(c, "Mul", t, c->out[0], NULL));
	return DG_OK;
}

/* y = log_softmax(x): dx = g - exp(y) * sum(g, axis). */
enum dg_status cpu_grad_log_softmax(struct dg_grad_ctx *c)
{
	const char *s, *e, *t;

	TRY(s = op1(c, "Sum", c->dout[0], axis_keep(c->attrs)));
	TRY(e = op1(c, "Softmax", c->in[0], json_deep_copy(c->attrs)));
	TRY(t = op2(c, "Mul", e, s, NULL));
	TRY(c->din[0] = op2(c, "Sub", c->dout[0], t, NULL));
	return DG_OK;
}

/* loss = -sum(labels * log_softmax(x)) over the last axis:
 * dx = g[..., None] * (softmax(x) * sum(labels) - labels), which is softmax - labels
 * for labels that sum to 1; dlabels = g[..., None] * -log_softmax(x). */
enum dg_status cpu_grad_xent(struct dg_grad_ctx *c)
{
	const char *ge, *t, *sm, *sl;

	TRY(ge = op1(c, "ExpandDims", c->dout[0], json_pack("{s:i}", "axis", -1)));
	if (want(c, 0)) {
		TRY(sm = op1(c, "Softmax", c->in[0], NULL));
		TRY(sl = op1(c, "Sum", c->in[1], axis_keep(NULL)));
		TRY(sm = op2(c, "Mul", sm, sl, NULL));
		TRY(t = op2(c, "Sub", sm, c->in[1], NULL));
		TRY(t = op2(c, "Mul", ge, t, NULL));
		TRY(c->din[0] = reduce_to(c, t, 0, same_inputs(c)));
	}
	if (want(c, 1)) {
		TRY(t = op1(c, "LogSoftmax", c->in[0], NULL));
		TRY(t = op1(c, "Neg", t, NULL));
		TRY(t = op2(c, "Mul", ge, t, NULL));
		TRY(c->din[1] = reduce_to(c, t, 1, same_inputs(c)));
	}
	return DG_OK;
}

enum dg_status cpu_grad_sparse_xent(struct dg_grad_ctx *c)
{
	const char *ge, *t;

	if (!want(c, 0))
		return DG_OK;
	TRY(ge = op1(c, "ExpandDims", c->dout[0], json_pack("{s:i}", "axis", -1)));
	TRY(t = op2(c, "SparseSoftmaxCrossEntropyGrad", c->in[0], c->in[1], NULL));
	TRY(c->din[0] = op2(c, "Mul", ge, t, NULL));
	return DG_OK;
}

/* out = op(a, ta) @ op(b, tb). With g = d out: for plain a @ b, da = g b^T and
 * db = a^T g; the transposed forms follow by transposing those products. */
static enum dg_status grad_mm(struct dg_grad_ctx *c, const char *op, const char *ka,
			      const char *kb)
{
	bool ta = json_is_true(dg_attrs_get(dg_attrs_of_json(c->attrs), ka));
	bool tb = json_is_true(dg_attrs_get(dg_attrs_of_json(c->attrs), kb));
	const char *g = c->dout[0], *a = c->in[0], *b = c->in[1], *t;
	bool same = strcmp(op, "MatMul") == 0 || same_batch(c);

	if (want(c, 0)) {
		if (!ta)
			t = op2(c, op, g, b, json_pack("{s:b, s:b}", ka, 0, kb, !tb));
		else
			t = op2(c, op, b, g, json_pack("{s:b, s:b}", ka, tb, kb, 1));
		TRY(t);
		TRY(c->din[0] = reduce_to(c, t, 0, same));
	}
	if (want(c, 1)) {
		if (!tb)
			t = op2(c, op, a, g, json_pack("{s:b, s:b}", ka, !ta, kb, 0));
		else
			t = op2(c, op, g, a, json_pack("{s:b, s:b}", ka, 1, kb, ta));
		TRY(t);
		TRY(c->din[1] = reduce_to(c, t, 1, same));
	}
	return DG_OK;
}

enum dg_status cpu_grad_matmul(struct dg_grad_ctx *c)
{
	return grad_mm(c, "MatMul", "transpose_a", "transpose_b");
}

enum dg_status cpu_grad_batch_matmul(struct dg_grad_ctx *c)
{
	return grad_mm(c, "BatchMatMul", "adj_x", "adj_y");
}

enum dg_status cpu_grad_slice(struct dg_grad_ctx *c)
{
	const json_t *begin = dg_attrs_get(dg_attrs_of_json(c->attrs), "begin");

	TRY(c->din[0] = op2(c, "SliceGrad", c->dout[0], c->in[0],
			    json_pack("{s:O}", "begin", begin)));
	return DG_OK;
}

/* Concat: input i's gradient is the slice of g it filled. Needs each input's
 * size along the axis at graph-build time. */
enum dg_status cpu_grad_concat(struct dg_grad_ctx *c)
{
	int64_t axis = 0, off = 0;
	enum dg_status st = dg_attrs_int(dg_attrs_of_json(c->attrs), "axis", NULL, &axis, c->err);
	int rank = c->out_type[0].shape.ndim, ax;

	if (st != DG_OK)
		return st;
	if (rank < 0)
		return dg_err_set(c->err, DG_EUNSUPPORTED, "the gradient of Concat needs a known "
				  "rank");
	st = cpu_axis(axis, rank, &ax, c->err);
	if (st != DG_OK)
		return st;
	for (int i = 0; i < c->n_in; i++) {
		int64_t n = c->in_type[i].shape.ndim == rank ? c->in_type[i].shape.dim[ax] : -1;
		if (n < 0) {
			dg_err_set(c->err, DG_EUNSUPPORTED, "the gradient of Concat needs input "
				   "%d's size along axis %d, which is unknown", i, ax);
			dg_err_hint(c->err, "give the Placeholder feeding it a full shape");
			return DG_EUNSUPPORTED;
		}
		if (want(c, i)) {
			json_t *b = json_array(), *s = json_array();
			for (int d = 0; d < rank; d++) {
				json_array_append_new(b, json_integer(d == ax ? off : 0));
				json_array_append_new(s, json_integer(d == ax ? n : -1));
			}
			TRY(c->din[i] = op1(c, "Slice", c->dout[0],
					    json_pack("{s:o, s:o}", "begin", b, "size", s)));
		}
		off += n;
	}
	return DG_OK;
}

/* Split: the output gradients joined again; an output that no gradient
 * reaches contributes zeros. */
enum dg_status cpu_grad_split(struct dg_grad_ctx *c)
{
	const json_t *axis = dg_attrs_get(dg_attrs_of_json(c->attrs), "axis");
	const char **parts = calloc((size_t)c->n_out, sizeof *parts);
	enum dg_status st = DG_OK;

	if (!parts)
		return dg_err_set(c->err, DG_ENOMEM, "out of memory for %d parts", c->n_out);
	for (int k = 0; k < c->n_out && st == DG_OK; k++) {
		parts[k] = c->dout[k] ? c->dout[k] : op1(c, "ZerosLike", c->out[k], NULL);
		if (!parts[k])
			st = failed(c);
	}
	if (st == DG_OK) {
		c->din[0] = c->add(c, "Concat", parts, c->n_out,
				   json_pack("{s:I}", "axis", json_is_integer(axis)
							    ? json_integer_value(axis) : 0));
		if (!c->din[0])
			st = failed(c);
	}
	free(parts);
	return st;
}

enum dg_status cpu_grad_reshape_like(struct dg_grad_ctx *c)
{
	TRY(c->din[0] = op2(c, "ReshapeLike", c->dout[0], c->in[0], NULL));
	return DG_OK;
}

/* Transpose by perm: the gradient goes back through the inverse permutation. */
enum dg_status cpu_grad_transpose(struct dg_grad_ctx *c)
{
	int64_t perm[DG_MAX_DIMS];
	int n = 0;
	enum dg_status st = dg_attrs_ints(dg_attrs_of_json(c->attrs), "perm", false, perm, DG_MAX_DIMS, &n, c->err);
	json_t *attrs = json_object();

	if (st != DG_OK) {
		json_decref(attrs);
		return st;
	}
	if (n > 0) {   /* absent perm reverses, which is its own inverse */
		int64_t inv[DG_MAX_DIMS];
		json_t *a = json_array();
		for (int i = 0; i < n; i++)
			if (perm[i] >= 0 && perm[i] < n)
				inv[perm[i]] = i;
		for (int i = 0; i < n; i++)
			json_array_append_new(a, json_integer(inv[i]));
		json_object_set_new(attrs, "perm", a);
	}
	TRY(c->din[0] = op1(c, "Transpose", c->dout[0], attrs));
	return DG_OK;
}

/* Gather(params, indices): every output row goes back to the row of params it
 * was read from, rows read twice adding up. Emitted as exactly these three
 * nodes, because the master recognises the last one (master/autodiff.c,
 * rows_of) and turns it into a row-wise update of the table instead of a
 * dense one:
 *   ids  = Reshape(indices; shape [-1])
 *   vals = Reshape(g; shape [-1] + params' dims after 0)
 *   d(params) = UnsortedSegmentSum(vals, ids; num_segments = params' dim 0)
 * so input 0 of the UnsortedSegmentSum holds one value row per id of input 1.
 * The shapes go into attrs, so params' shape must be known when the graph is
 * built; it is for a Variable, the usual params. indices get no gradient. */
enum dg_status cpu_grad_gather(struct dg_grad_ctx *c)
{
	const struct dg_shape *ps = &c->in_type[0].shape;
	const char *ids, *vals;
	json_t *shape;

	if (!want(c, 0))
		return DG_OK;
	if (ps->ndim < 1 || ps->dim[0] < 0) {
		dg_err_set(c->err, DG_EINVAL, "the gradient of Gather needs the row count of "
			   "params (its dim 0), which is unknown when the graph is built");
		dg_err_hint(c->err, "training needs the table size: give the Variable or "
			    "Placeholder feeding params a full shape");
		return DG_EINVAL;
	}
	for (int k = 1; k < ps->ndim; k++) {
		if (ps->dim[k] < 0) {
			dg_err_set(c->err, DG_EINVAL, "the gradient of Gather needs the size of "
				   "params' dim %d, unknown when the graph is built", k);
			dg_err_hint(c->err, "give the Variable or Placeholder feeding params a "
				    "full shape");
			return DG_EINVAL;
		}
	}
	TRY(ids = op1(c, "Reshape", c->in[1], json_pack("{s:[i]}", "shape", -1)));
	shape = json_array();
	json_array_append_new(shape, json_integer(-1));
	for (int k = 1; k < ps->ndim; k++)
		json_array_append_new(shape, json_integer(ps->dim[k]));
	TRY(vals = op1(c, "Reshape", c->dout[0], json_pack("{s:o}", "shape", shape)));
	TRY(c->din[0] = op2(c, "UnsortedSegmentSum", vals, ids,
			    json_pack("{s:I}", "num_segments", (json_int_t)ps->dim[0])));
	return DG_OK;
}

/* UnsortedSegmentSum(data, ids): data row i went into output row ids[i], so its
 * gradient is that row of g, Gather(g, ids), of data's shape (ids' shape +
 * the rest of data's). Exact: the forward refused every id outside the rows
 * of g. The ids get no gradient. */
enum dg_status cpu_grad_unsorted_segment_sum(struct dg_grad_ctx *c)
{
	if (want(c, 0))
		TRY(c->din[0] = op2(c, "Gather", c->dout[0], c->in[1], NULL));
	return DG_OK;
}
