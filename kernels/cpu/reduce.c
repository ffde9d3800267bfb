/* Reductions over any set of axes (Sum, Mean, Max, Min) and ArgMax, for the CPU.
 * A reduction views its input as [outer, n, inner] after dropping size-1 dims and
 * merging neighbouring axes that are all reduced or all kept; an axis set that
 * stays split after that (axes 0 and 2 of a 3-d tensor) runs as successive
 * single-segment reductions, innermost first. Table dg_ops_reduce -> registry.c. */
#include "cpu.h"
#include "grad.h"

#include <math.h>
#include <string.h>

enum rkind { RK_SUM, RK_MEAN, RK_MAX, RK_MIN };

static const char *const rk_name[] = { "Sum", "Mean", "Max", "Min" };

/* y[outer, inner] = reduce over n of x[outer, n, inner]; n >= 1 for Max/Min. */
typedef void (*reduce3_fn)(const void *x, void *y, int64_t outer, int64_t n, int64_t inner);

/* --- Sum -------------------------------------------------------------------- */

#define SUM_BLOCK 1024    /* elements per lane block: 1024 / LANES serial adds per lane */
#define COL_CHUNK 256     /* output columns accumulated at once by column reductions */

/* Float sums of a contiguous run: LANES independent accumulators (the compiler
 * maps them onto vector registers) over blocks of SUM_BLOCK elements; after each
 * block the lanes are added into LANES double lanes (vector converts and adds),
 * which fold into one total at the end. The rounding error stays that of one
 * block (~64 float adds per lane) whatever n is, where a single serial float
 * accumulator loses about n ulps and runs at one add per add latency. */
#define DEF_SUM_FLOAT(T, SUF, LANES)                                                       \
	static T sum_row_##SUF(const T *restrict x, int64_t n)                             \
	{                                                                                  \
		double dacc[LANES] = { 0 }, total = 0.0;                                   \
		int64_t i = 0;                                                             \
		while (n - i >= (LANES)) {                                                 \
			T acc[LANES] = { 0 };                                              \
			int64_t left = n - i;                                              \
			int64_t end = i + (left >= SUM_BLOCK ? SUM_BLOCK                   \
							     : left / (LANES) * (LANES));  \
			for (; i < end; i += (LANES))                                      \
				for (int l = 0; l < (LANES); l++)                          \
					acc[l] += x[i + l];                                \
			for (int l = 0; l < (LANES); l++)                                  \
				dacc[l] += (double)acc[l];                                 \
		}                                                                          \
		for (int l = 0; l < (LANES); l++)                                          \
			total += dacc[l];                                                  \
		for (; i < n; i++)                                                         \
			total += (double)x[i];                                             \
		return (T)total;                                                           \
	}                                                                                  \
	/* y[j] = sum_r x[r, j] for x [n, inner]: rows are added into a chunk of           \
	 * double accumulators, so the inner loop is contiguous and vectorises. */         \
	static void sum_col_##SUF(const T *restrict x, T *restrict y, int64_t n,           \
				  int64_t inner)                                           \
	{                                                                                  \
		double acc[COL_CHUNK];                                                     \
		for (int64_t j0 = 0; j0 < inner; j0 += COL_CHUNK) {                        \
			int64_t w = inner - j0 < COL_CHUNK ? inner - j0 : COL_CHUNK;       \
			for (int64_t j = 0; j < w; j++)                                    \
				acc[j] = 0.0;                                              \
			for (int64_t r = 0; r < n; r++) {                                  \
				const T *restrict row = x + r * inner + j0;                \
				for (int64_t j = 0; j < w; j++)                            \
					acc[j] += (double)row[j];                          \
			}                                                                  \
			for (int64_t j = 0; j < w; j++)                                    \
				y[j0 + j] = (T)acc[j];                                     \
		}                                                                          \
	}

/* Integer sums wrap around like TensorFlow's: add in the unsigned type of the same
 * width (defined modulo 2^bits, and associative, so the compiler vectorises it)
 * and convert back (GCC defines that conversion as modulo). */
#define DEF_SUM_INT(T, U, SUF)                                                             \
	static T sum_row_##SUF(const T *restrict x, int64_t n)                             \
	{                                                                                  \
		U acc = 0;                                                                 \
		for (int64_t i = 0; i < n; i++)                                            \
			acc = (U)(acc + (U)x[i]);                                          \
		return (T)acc;                                                             \
	}                                                                                  \
	static void sum_col_##SUF(const T *restrict x, T *restrict y, int64_t n,           \
				  int64_t inner)                                           \
	{                                                                                  \
		for (int64_t j = 0; j < inner; j++)                                        \
			y[j] = 0;                                                          \
		for (int64_t r = 0; r < n; r++) {                                          \
			const T *restrict row = x + r * inner;                             \
			for (int64_t j = 0; j < inner; j++)                                \
				y[j] = (T)(U)((U)y[j] + (U)row[j]);                        \
		}                                                                          \
	}

DEF_SUM_FLOAT(float, f32, 16)
DEF_SUM_FLOAT(double, f64, 8)
DEF_SUM_INT(int32_t, uint32_t, i32)
DEF_SUM_INT(int64_t, uint64_t, i64)
DEF_SUM_INT(uint8_t, uint8_t, u8)

/* --- Max / Min ---------------------------------------------------------------- */

/* "v replaces the running best a": NaN is sticky (a NaN v always replaces, and
 * once a is NaN no comparison with it is true), so any NaN makes the result NaN.
 * For integer types v != v is false and folds away. */
#define BETTER_MAX(v, a) (((v) > (a)) | ((v) != (v)))
#define BETTER_MIN(v, a) (((v) < (a)) | ((v) != (v)))

/* Max/Min of a contiguous run (n >= 1) with LANES independent running values,
 * and the column form y[j] = best_r x[r, j] of x [n, inner]. */
#define DEF_BEST(OP, BETTER, T, SUF, LANES)                                                \
	static T OP##_row_##SUF(const T *restrict x, int64_t n)                            \
	{                                                                                  \
		T acc[LANES];                                                              \
		int64_t i = 0;                                                             \
		for (int l = 0; l < (LANES); l++)                                          \
			acc[l] = x[0];                                                     \
		/* Not unrolled: as a LANES-iteration loop GCC if-converts and             \
		 * vectorises the select; fully unrolled it stays scalar branches. */      \
		for (; i + (LANES) <= n; i += (LANES))                                     \
			_Pragma("GCC unroll 1")                                            \
			for (int l = 0; l < (LANES); l++) {                                \
				T v = x[i + l];                                            \
				acc[l] = BETTER(v, acc[l]) ? v : acc[l];                   \
			}                                                                  \
		T best = acc[0];                                                           \
		for (int l = 1; l < (LANES); l++)                                          \
			best = BETTER(acc[l], best) ? acc[l] : best;                       \
		for (; i < n; i++)                                                         \
			best = BETTER(x[i], best) ? x[i] : best;                           \
		return best;                                                               \
	}                                                                                  \
	static void OP##_col_##SUF(const T *restrict x, T *restrict y, int64_t n,          \
				   int64_t inner)                                          \
	{                                                                                  \
		memcpy(y, x, (size_t)inner * sizeof(T));                                   \
		for (int64_t r = 1; r < n; r++) {                                          \
			const T *restrict row = x + r * inner;                             \
			for (int64_t j = 0; j < inner; j++)                                \
				y[j] = BETTER(row[j], y[j]) ? row[j] : y[j];               \
		}                                                                          \
	}

DEF_BEST(max, BETTER_MAX, float, f32, 16)
DEF_BEST(max, BETTER_MAX, double, f64, 8)
DEF_BEST(max, BETTER_MAX, int32_t, i32, 16)
DEF_BEST(max, BETTER_MAX, int64_t, i64, 8)
DEF_BEST(max, BETTER_MAX, uint8_t, u8, 32)
DEF_BEST(min, BETTER_MIN, float, f32, 16)
DEF_BEST(min, BETTER_MIN, double, f64, 8)
DEF_BEST(min, BETTER_MIN, int32_t, i32, 16)
DEF_BEST(min, BETTER_MIN, int64_t, i64, 8)
DEF_BEST(min, BETTER_MIN, uint8_t, u8, 32)

/* The row forms other families use (cpu.h): softmax sums and maxima. */
float cpu_sum_f32(const float *x, int64_t n)
{
	return sum_row_f32(x, n);
}

double cpu_sum_f64(const double *x, int64_t n)
{
	return sum_row_f64(x, n);
}

float cpu_max_f32(const float *x, int64_t n)
{
	return max_row_f32(x, n);
}

double cpu_max_f64(const double *x, int64_t n)
{
	return max_row_f64(x, n);
}

/* [outer, n, inner] -> [outer, inner]: rows when inner == 1 (this is also the
 * all-axes flat case with outer == 1), column accumulation otherwise. */
#define DEF_REDUCE3(OP, T, SUF)                                                            \
	static void OP##3_##SUF(const void *vx, void *vy, int64_t outer, int64_t n,        \
				int64_t inner)                                             \
	{                                                                                  \
		const T *x = vx;                                                           \
		T *y = vy;                                                                 \
		for (int64_t o = 0; o < outer; o++) {                                      \
			if (inner == 1)                                                    \
				y[o] = OP##_row_##SUF(x + o * n, n);                       \
			else                                                               \
				OP##_col_##SUF(x + o * n * inner, y + o * inner, n, inner); \
		}                                                                          \
	}

#define DEF_REDUCE3_ALL(T, SUF) DEF_REDUCE3(sum, T, SUF) DEF_REDUCE3(max, T, SUF)          \
	DEF_REDUCE3(min, T, SUF)

DEF_REDUCE3_ALL(float, f32)
DEF_REDUCE3_ALL(double, f64)
DEF_REDUCE3_ALL(int32_t, i32)
DEF_REDUCE3_ALL(int64_t, i64)
DEF_REDUCE3_ALL(uint8_t, u8)

/* Indexed by enum rkind (Mean sums, then divides) and dtype; NULL: unsupported. */
static const reduce3_fn reduce3[4][DG_DTYPE_COUNT] = {
	[RK_SUM] = { [DG_F32] = sum3_f32, [DG_F64] = sum3_f64, [DG_I32] = sum3_i32,
		     [DG_I64] = sum3_i64, [DG_U8] = sum3_u8 },
	[RK_MEAN] = { [DG_F32] = sum3_f32, [DG_F64] = sum3_f64, [DG_I32] = sum3_i32,
		      [DG_I64] = sum3_i64, [DG_U8] = sum3_u8 },
	[RK_MAX] = { [DG_F32] = max3_f32, [DG_F64] = max3_f64, [DG_I32] = max3_i32,
		     [DG_I64] = max3_i64, [DG_U8] = max3_u8 },
	[RK_MIN] = { [DG_F32] = min3_f32, [DG_F64] = min3_f64, [DG_I32] = min3_i32,
		     [DG_I64] = min3_i64, [DG_U8] = min3_u8 },
};

/* Mean = sum / count in the tensor's own type. Integer division truncates toward
 * zero; count >= 1, so neither division by zero nor INT_MIN / -1 can occur. */
static void mean_divide(struct dg_tensor *y, int64_t count)
{
	int64_t m = y->numel;

	switch (y->dtype) {
	case DG_F32: {
		float *p = y->data;
		/* In double: (float)count would round counts above 2^24. */
		for (int64_t i = 0; i < m; i++)
			p[i] = (float)((double)p[i] / (double)count);
		break;
	}
	case DG_F64: {
		double *p = y->data;
		for (int64_t i = 0; i < m; i++)
			p[i] = p[i] / (double)count;
		break;
	}
	case DG_I32: {
		int32_t *p = y->data;
		for (int64_t i = 0; i < m; i++)
			p[i] = (int32_t)((int64_t)p[i] / count);
		break;
	}
	case DG_I64: {
		int64_t *p = y->data;
		for (int64_t i = 0; i < m; i++)
			p[i] = p[i] / count;
		break;
	}
	case DG_U8: {
		uint8_t *p = y->data;
		for (int64_t i = 0; i < m; i++)
			p[i] = (uint8_t)(p[i] / count);
		break;
	}
	default:
		break;
	}
}

/* --- attrs: axis and keepdims ------------------------------------------------ */

/* The "axis" attr as written: all == true when absent or null (reduce every
 * axis); otherwise n raw (not yet normalised) axes, n == 0 for [] (reduce none). */
struct axes_attr {
	bool all;
	int n;
	int64_t v[DG_MAX_DIMS];
};

static enum dg_status read_axes(struct dg_attrs attrs, struct axes_attr *a, struct dg_err *err)
{
	const json_t *v = dg_attrs_get(attrs, "axis");
	size_t i;
	json_t *e;

	a->all = false;
	a->n = 0;
	if (!v || json_is_null(v)) {
		a->all = true;
		return DG_OK;
	}
	if (json_is_integer(v)) {
		a->v[a->n++] = json_integer_value(v);
		return DG_OK;
	}
	if (!json_is_array(v)) {
		dg_err_set(err, DG_EINVAL, "attr 'axis' must be an integer, a list of integers "
			   "or null, got %s", dg_json_kind(v, true));
		dg_err_hint(err, "e.g. \"axis\": 1 or \"axis\": [0, 2]; leave it out for all "
			    "axes");
		return DG_EINVAL;
	}
	if (json_array_size(v) > DG_MAX_DIMS) {
		return dg_err_set(err, DG_EINVAL, "attr 'axis' lists %zu axes; a tensor has at "
				  "most %d", json_array_size(v), DG_MAX_DIMS);
	}
	json_array_foreach(v, i, e) {
		if (!json_is_integer(e)) {
			return dg_err_set(err, DG_EINVAL, "attr 'axis'[%zu] must be an integer, "
					  "got %s", i, dg_json_kind(e, true));
		}
		a->v[a->n++] = json_integer_value(e);
	}
	return DG_OK;
}

/* Normalise the axes for a rank-ndim value into a bit mask (bit i: axis i is
 * reduced). Out-of-range and repeated axes are DG_EINVAL naming axis and rank. */
static enum dg_status axes_mask(const struct axes_attr *a, int ndim, unsigned *mask,
				struct dg_err *err)
{
	*mask = 0;
	if (a->all) {
		*mask = (1u << ndim) - 1;
		return DG_OK;
	}
	for (int i = 0; i < a->n; i++) {
		int ax;
		if (cpu_axis(a->v[i], ndim, &ax, err) != DG_OK) {
			if (ndim == 0)
				dg_err_hint(err, "a scalar has no axes; leave 'axis' out");
			else
				dg_err_hint(err, "axes of a rank-%d tensor are %d..%d", ndim, -ndim,
					    ndim - 1);
			return DG_EINVAL;
		}
		if (*mask & (1u << ax)) {
			return dg_err_set(err, DG_EINVAL, "axis %lld is listed twice (both name "
					  "axis %d of rank %d)", (long long)a->v[i], ax, ndim);
		}
		*mask |= 1u << ax;
	}
	return DG_OK;
}

/* "keepdims" (and TensorFlow's older "keep_dims"), default false. */
static enum dg_status read_keepdims(struct dg_attrs attrs, bool *keep, struct dg_err *err)
{
	const bool no = false;
	bool a, b;

	if (dg_attrs_bool(attrs, "keepdims", &no, &a, err) != DG_OK ||
	    dg_attrs_bool(attrs, "keep_dims", &no, &b, err) != DG_OK)
		return DG_EINVAL;
	if (dg_attrs_get(attrs, "keepdims") && dg_attrs_get(attrs, "keep_dims") &&
	    a != b)
		return dg_err_set(err, DG_EINVAL, "attrs 'keepdims' and 'keep_dims' disagree");
	*keep = a || b;
	return DG_OK;
}

/* Output shape of reducing in over mask: reduced dims become 1 (keep) or vanish.
 * *count = product of the reduced dims, -1 when one of them is unknown. */
static struct dg_shape reduced_shape(const struct dg_shape *in, unsigned mask, bool keep,
				     int64_t *count)
{
	struct dg_shape out = { .ndim = 0 };

	*count = 1;
	for (int i = 0; i < in->ndim; i++) {
		if (!(mask & (1u << i))) {
			out.dim[out.ndim++] = in->dim[i];
			continue;
		}
		if (keep)
			out.dim[out.ndim++] = 1;
		if (*count >= 0)
			*count = in->dim[i] < 0 ? -1 : *count * in->dim[i];
	}
	return out;
}

static bool reduce_dtype_ok(enum dg_dtype dt)
{
	return dt == DG_F32 || dt == DG_F64 || dt == DG_I32 || dt == DG_I64 || dt == DG_U8;
}

static enum dg_status bad_dtype(const char *op, enum dg_dtype dt, struct dg_err *err)
{
	dg_err_set(err, DG_EDTYPE, "%s does not take %s tensors", op, dg_dtype_name(dt));
	if (dg_dtype_is_half(dt))
		dg_err_hint(err, "%s is a storage dtype: Cast to float32 first", dg_dtype_name(dt));
	else
		dg_err_hint(err, "supported: float32, float64, int32, int64, uint8; Cast bool first");
	return DG_EDTYPE;
}

/* The reduction has nothing to reduce but somewhere to put a result: Max, Min,
 * ArgMax and integer Mean have no value for it. */
static enum dg_status empty_axis(const char *op, const struct dg_shape *in, struct dg_err *err)
{
	char s[128];

	dg_shape_format(in, s, sizeof s);
	dg_err_set(err, DG_EINVAL, "cannot take %s over an empty axis (input shape %s)", op, s);
	dg_err_hint(err, "%s", strcmp(op, "Mean") == 0 ?
		    "an integer Mean of no elements divides by zero; check the input's size" :
		    "the reduced axes have size 0; check the input's shape");
	return DG_EINVAL;
}

/* Must the reduced set be non-empty for op on dt? */
static bool needs_elements(enum rkind k, enum dg_dtype dt)
{
	return k == RK_MAX || k == RK_MIN || (k == RK_MEAN && dg_dtype_is_int(dt));
}

/* The dtype and the attrs as written, checked alike by inference and kernel
 * (the axes are normalised once the rank is known). */
static enum dg_status reduce_args(enum rkind k, enum dg_dtype dt, struct dg_attrs attrs,
				  struct axes_attr *a, bool *keep, struct dg_err *err)
{
	if (!reduce_dtype_ok(dt))
		return bad_dtype(rk_name[k], dt, err);
	if (read_axes(attrs, a, err) != DG_OK || read_keepdims(attrs, keep, err) != DG_OK)
		return DG_EINVAL;
	return DG_OK;
}

static enum dg_status infer_reduce(struct dg_infer_ctx *c, enum rkind k)
{
	const struct dg_ttype *x = &c->in[0];
	struct axes_attr a;
	bool keep;
	unsigned mask;
	int64_t count;
	enum dg_status st = reduce_args(k, x->dtype, dg_attrs_of_json(c->attrs), &a, &keep, c->err);

	if (st != DG_OK)
		return st;
	c->out[0].dtype = x->dtype;
	if (x->shape.ndim < 0) {
		/* Unknown rank: only "all axes, dropped" has a known (scalar) result; a
		 * literally repeated axis is wrong whatever the rank. */
		for (int i = 0; i < a.n; i++)
			for (int j = 0; j < i; j++)
				if (a.v[i] == a.v[j])
					return dg_err_set(c->err, DG_EINVAL, "axis %lld is listed "
							  "twice", (long long)a.v[i]);
		c->out[0].shape.ndim = a.all && !keep ? 0 : -1;
		return DG_OK;
	}
	if (axes_mask(&a, x->shape.ndim, &mask, c->err) != DG_OK)
		return DG_EINVAL;
	c->out[0].shape = reduced_shape(&x->shape, mask, keep, &count);
	if (count == 0 && needs_elements(k, x->dtype)) {
		int64_t n;
		/* Certainly wrong only when the output certainly has elements. */
		if (dg_shape_is_known(&c->out[0].shape) &&
		    dg_shape_numel(&c->out[0].shape, &n, NULL) == DG_OK && n > 0)
			return empty_axis(rk_name[k], &x->shape, c->err);
	}
	return DG_OK;
}

/* --- the reduction driver ---------------------------------------------------- */

/* The input's dims with size-1 dims dropped and runs of all-reduced or all-kept
 * dims merged, so segments alternate between kept and reduced. */
struct segs {
	int n;
	int64_t size[DG_MAX_DIMS];
	bool red[DG_MAX_DIMS];
};

static void plan_segments(const struct dg_shape *s, unsigned mask, struct segs *g)
{
	g->n = 0;
	for (int i = 0; i < s->ndim; i++) {
		bool r = (mask >> i) & 1u;
		if (s->dim[i] == 1)
			continue;
		if (g->n > 0 && g->red[g->n - 1] == r) {
			g->size[g->n - 1] *= s->dim[i];
		} else {
			g->size[g->n] = s->dim[i];
			g->red[g->n] = r;
			g->n++;
		}
	}
}

/* Remove segment k (just reduced); its kept neighbours become one segment. */
static void drop_segment(struct segs *g, int k)
{
	if (k > 0 && k + 1 < g->n) {
		g->size[k - 1] *= g->size[k + 1];
		memmove(&g->size[k], &g->size[k + 2], (size_t)(g->n - k - 2) * sizeof g->size[0]);
		memmove(&g->red[k], &g->red[k + 2], (size_t)(g->n - k - 2) * sizeof g->red[0]);
		g->n -= 2;
	} else {
		memmove(&g->size[k], &g->size[k + 1], (size_t)(g->n - k - 1) * sizeof g->size[0]);
		memmove(&g->red[k], &g->red[k + 1], (size_t)(g->n - k - 1) * sizeof g->red[0]);
		g->n -= 1;
	}
}

/* Reduce x (numel > 0, reduced count > 0) into y over the segments of g: one
 * [outer, n, inner] pass per reduced segment, innermost first, through at most
 * two temporaries; the last pass writes y. */
static enum dg_status run_segments(reduce3_fn fn, const struct dg_tensor *x,
				   struct dg_tensor *y, struct segs *g, struct dg_err *err)
{
	size_t es = dg_dtype_size(x->dtype);
	const void *src = x->data;
	void *owned = NULL;       /* the temporary src points into, if any */
	int n_red = 0;

	for (int i = 0; i < g->n; i++)
		n_red += g->red[i];
	if (n_red == 0) {
		/* Nothing but size-1 axes reduced: the values pass through. */
		memcpy(y->data, x->data, x->nbytes);
		return DG_OK;
	}
	while (n_red > 0) {
		int k = g->n - 1;
		int64_t outer = 1, inner = 1;
		void *dst;

		while (!g->red[k])
			k--;
		for (int i = 0; i < k; i++)
			outer *= g->size[i];
		for (int i = k + 1; i < g->n; i++)
			inner *= g->size[i];
		if (n_red == 1) {
			dst = y->data;
		} else {
			dst = dg_alloc_aligned((size_t)(outer * inner) * es);
			if (!dst) {
				dg_free_aligned(owned);
				return dg_err_set(err, DG_ENOMEM, "no memory for a reduction "
						  "temporary of %lld elements",
						  (long long)(outer * inner));
			}
		}
		fn(src, dst, outer, g->size[k], inner);
		dg_free_aligned(owned);
		owned = dst == y->data ? NULL : dst;
		src = dst;
		drop_segment(g, k);
		n_red--;
	}
	return DG_OK;
}

static enum dg_status reduce_kernel(struct dg_kernel_ctx *c, enum rkind k)
{
	const struct dg_tensor *x = c->in[0];
	struct axes_attr a;
	struct segs g;
	struct dg_tensor *y;
	struct dg_shape oshape;
	bool keep;
	unsigned mask;
	int64_t count;
	enum dg_status st = reduce_args(k, x->dtype, c->attrs, &a, &keep, c->err);

	if (st != DG_OK)
		return st;
	if (axes_mask(&a, x->shape.ndim, &mask, c->err) != DG_OK)
		return DG_EINVAL;
	oshape = reduced_shape(&x->shape, mask, keep, &count);
	y = cpu_out(c, 0, x->dtype, &oshape);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (y->numel == 0)
		return DG_OK;
	if (count == 0) {
		/* An empty set under each output element: Sum is 0, a float Mean 0/0 = NaN,
		 * the rest have no answer. */
		if (needs_elements(k, x->dtype))
			return empty_axis(rk_name[k], &x->shape, c->err);
		memset(y->data, 0, y->nbytes);
		if (k == RK_MEAN)
			for (int64_t i = 0; i < y->numel; i++)
				dg_tensor_set_f64(y, i, NAN);
		return DG_OK;
	}
	plan_segments(&x->shape, mask, &g);
	if (run_segments(reduce3[k][x->dtype], x, y, &g, c->err) != DG_OK)
		return DG_ENOMEM;
	if (k == RK_MEAN && count > 1)
		mean_divide(y, count);
	return DG_OK;
}

static enum dg_status infer_sum(struct dg_infer_ctx *c) { return infer_reduce(c, RK_SUM); }
static enum dg_status infer_mean(struct dg_infer_ctx *c) { return infer_reduce(c, RK_MEAN); }
static enum dg_status infer_max(struct dg_infer_ctx *c) { return infer_reduce(c, RK_MAX); }
static enum dg_status infer_min(struct dg_infer_ctx *c) { return infer_reduce(c, RK_MIN); }
static enum dg_status k_sum(struct dg_kernel_ctx *c) { return reduce_kernel(c, RK_SUM); }
static enum dg_status k_mean(struct dg_kernel_ctx *c) { return reduce_kernel(c, RK_MEAN); }
static enum dg_status k_max(struct dg_kernel_ctx *c) { return reduce_kernel(c, RK_MAX); }
static enum dg_status k_min(struct dg_kernel_ctx *c) { return reduce_kernel(c, RK_MIN); }

/* --- ArgMax -------------------------------------------------------------------- */

/* Index of the largest element of x[0..n), n >= 1. Ties: the first wins. NaN
 * counts as larger than everything, so the first NaN wins (and ends the scan). */
#define DEF_ARGMAX_ROW(T, SUF)                                                             \
	static int64_t argmax_row_##SUF(const T *restrict x, int64_t n)                    \
	{                                                                                  \
		int64_t best = 0;                                                          \
		T b = x[0];                                                                \
		if (b != b)                                                                \
			return 0;                                                          \
		for (int64_t i = 1; i < n; i++) {                                          \
			T v = x[i];                                                        \
			if (v > b || v != v) {                                             \
				b = v;                                                     \
				best = i;                                                  \
				if (v != v)                                                \
					break;                                             \
			}                                                                  \
		}                                                                          \
		return best;                                                               \
	}

/* y[outer, inner] = argmax over n of x[outer, n, inner], indices of type IT. With
 * inner > 1 the rows are walked in memory order, each element compared with the
 * best so far of its column (found through the index already stored in y). */
#define DEF_ARGMAX(T, SUF, IT, ISUF)                                                       \
	static void argmax_##SUF##_##ISUF(const void *vx, void *vy, int64_t outer,         \
					  int64_t n, int64_t inner)                        \
	{                                                                                  \
		const T *x = vx;                                                           \
		IT *y = vy;                                                                \
		for (int64_t o = 0; o < outer; o++) {                                      \
			const T *xo = x + o * n * inner;                                   \
			IT *yo = y + o * inner;                                            \
			if (inner == 1) {                                                  \
				yo[0] = (IT)argmax_row_##SUF(xo, n);                       \
				continue;                                                  \
			}                                                                  \
			for (int64_t j = 0; j < inner; j++)                                \
				yo[j] = 0;                                                 \
			for (int64_t r = 1; r < n; r++) {                                  \
				const T *row = xo + r * inner;                             \
				for (int64_t j = 0; j < inner; j++) {                      \
					T b = xo[(int64_t)yo[j] * inner + j], v = row[j];  \
					if (b == b && (v > b || v != v))                   \
						yo[j] = (IT)r;                             \
				}                                                          \
			}                                                                  \
		}                                                                          \
	}

#define DEF_ARGMAX_ALL(T, SUF) DEF_ARGMAX_ROW(T, SUF) DEF_ARGMAX(T, SUF, int32_t, i32)     \
	DEF_ARGMAX(T, SUF, int64_t, i64)

DEF_ARGMAX_ALL(float, f32)
DEF_ARGMAX_ALL(double, f64)
DEF_ARGMAX_ALL(int32_t, i32)
DEF_ARGMAX_ALL(int64_t, i64)
DEF_ARGMAX_ALL(uint8_t, u8)

/* [input dtype][0: int32 output, 1: int64 output] */
static const reduce3_fn argmax3[DG_DTYPE_COUNT][2] = {
	[DG_F32] = { argmax_f32_i32, argmax_f32_i64 },
	[DG_F64] = { argmax_f64_i32, argmax_f64_i64 },
	[DG_I32] = { argmax_i32_i32, argmax_i32_i64 },
	[DG_I64] = { argmax_i64_i32, argmax_i64_i64 },
	[DG_U8] = { argmax_u8_i32, argmax_u8_i64 },
};

/* Read and check ArgMax's attrs against a rank (-1: unknown, axis unchecked). */
static enum dg_status argmax_attrs(struct dg_attrs attrs, int ndim, int *axis,
				   enum dg_dtype *ot, struct dg_err *err)
{
	const int64_t zero = 0;
	const enum dg_dtype i64 = DG_I64;
	int64_t a;

	if (dg_attrs_int(attrs, "axis", &zero, &a, err) != DG_OK ||
	    dg_attrs_dtype(attrs, "output_type", &i64, ot, err) != DG_OK)
		return err ? err->code : DG_EINVAL;
	if (*ot != DG_I32 && *ot != DG_I64) {
		dg_err_set(err, DG_EDTYPE, "ArgMax output_type must be int32 or int64, not %s",
			   dg_dtype_name(*ot));
		return DG_EDTYPE;
	}
	*axis = -1;
	if (ndim >= 0 && cpu_axis(a, ndim, axis, err) != DG_OK) {
		if (ndim == 0)
			dg_err_hint(err, "ArgMax needs at least one axis; a scalar has none");
		else
			dg_err_hint(err, "axes of a rank-%d tensor are %d..%d", ndim, -ndim,
				    ndim - 1);
		return DG_EINVAL;
	}
	return DG_OK;
}

static enum dg_status infer_argmax(struct dg_infer_ctx *c)
{
	const struct dg_ttype *x = &c->in[0];
	enum dg_dtype ot;
	int axis;
	struct dg_shape *o = &c->out[0].shape;

	if (!reduce_dtype_ok(x->dtype))
		return bad_dtype("ArgMax", x->dtype, c->err);
	if (argmax_attrs(dg_attrs_of_json(c->attrs), x->shape.ndim, &axis, &ot, c->err) != DG_OK)
		return c->err ? c->err->code : DG_EINVAL;
	c->out[0].dtype = ot;
	if (x->shape.ndim < 0) {
		o->ndim = -1;
		return DG_OK;
	}
	o->ndim = 0;
	for (int i = 0; i < x->shape.ndim; i++)
		if (i != axis)
			o->dim[o->ndim++] = x->shape.dim[i];
	if (x->shape.dim[axis] == 0 && dg_shape_is_known(o)) {
		int64_t n;
		if (dg_shape_numel(o, &n, NULL) == DG_OK && n > 0)
			return empty_axis("ArgMax", &x->shape, c->err);
	}
	return DG_OK;
}

static enum dg_status k_argmax(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0];
	enum dg_dtype ot;
	int axis;
	int64_t outer = 1, n, inner = 1;
	struct dg_shape oshape = { .ndim = 0 };
	struct dg_tensor *y;

	if (!reduce_dtype_ok(x->dtype))
		return bad_dtype("ArgMax", x->dtype, c->err);
	if (argmax_attrs(c->attrs, x->shape.ndim, &axis, &ot, c->err) != DG_OK)
		return c->err ? c->err->code : DG_EINVAL;
	n = x->shape.dim[axis];
	for (int i = 0; i < x->shape.ndim; i++) {
		if (i == axis)
			continue;
		oshape.dim[oshape.ndim++] = x->shape.dim[i];
		if (i < axis)
			outer *= x->shape.dim[i];
		else
			inner *= x->shape.dim[i];
	}
	if (ot == DG_I32 && n > INT32_MAX) {
		dg_err_set(c->err, DG_EINVAL, "axis %d has %lld elements; indices do not fit "
			   "int32", axis, (long long)n);
		dg_err_hint(c->err, "use \"output_type\": \"int64\"");
		return DG_EINVAL;
	}
	y = cpu_out(c, 0, ot, &oshape);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (y->numel == 0)
		return DG_OK;
	if (n == 0)
		return empty_axis("ArgMax", &x->shape, c->err);
	argmax3[x->dtype][ot == DG_I64](x->data, y->data, outer, n, inner);
	return DG_OK;
}

/* --- the table ------------------------------------------------------------------ */

static const struct dg_attr_spec reduce_attrs[] = {
	{ "axis", DG_ATTR_AXES, false,
	  "axis or list of axes to reduce (negative counts from the end); absent or null: all" },
	{ "keepdims", DG_ATTR_BOOL, false, "keep reduced axes as size 1 (default false)" },
	{ "keep_dims", DG_ATTR_BOOL, false, "TensorFlow's older spelling of keepdims" },
	{ 0 },
};

static const struct dg_attr_spec argmax_attrs_spec[] = {
	{ "axis", DG_ATTR_INT, false, "axis to search (negative counts from the end); default 0" },
	{ "output_type", DG_ATTR_DTYPE, false, "int64 (default) or int32" },
	{ 0 },
};

struct dg_op_def dg_ops_reduce[] = {
	{ .name = "Sum", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = reduce_attrs, .infer = infer_sum, .cpu = k_sum,
	  .grad = cpu_grad_sum,
	  .doc = "sum over axes; integers wrap around; the sum of nothing is 0" },
	{ .name = "Mean", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = reduce_attrs, .infer = infer_mean, .cpu = k_mean,
	  .grad = cpu_grad_mean,
	  .doc = "mean over axes; integers: wrapped sum / count, truncated; empty: NaN "
		 "(floats) or an error (integers)" },
	{ .name = "Max", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = reduce_attrs, .infer = infer_max, .cpu = k_max,
	  .grad = cpu_grad_max,
	  .doc = "maximum over axes; any NaN gives NaN; an empty axis is an error" },
	{ .name = "Min", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = reduce_attrs, .infer = infer_min, .cpu = k_min,
	  .grad = cpu_grad_max,
	  .doc = "minimum over axes; any NaN gives NaN; an empty axis is an error" },
	{ .name = "ArgMax", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = argmax_attrs_spec, .infer = infer_argmax, .cpu = k_argmax,
	  .doc = "index of the largest value along an axis; first wins ties; NaN counts as "
		 "largest" },
	{ 0 },
};
