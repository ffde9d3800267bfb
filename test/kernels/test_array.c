/* Criterion suite for the array ops of kernels/cpu/array.c, run through the
 * registry (dg_op_run) with hand-computed expectations: slicing with NumPy
 * semantics, Concat/Split, Reshape/Transpose/ExpandDims/Squeeze round trips,
 * Size/Shape, fills, shape inference with unknowns, and every error path. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/kernels.h"

/* SH(2,3) expands to "ndim, dims" arguments (SH0 for a scalar: ISO C has no
 * empty array); VALS(1,2) to "values, count". */
#define SH0 0, NULL
#define SH(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), \
		(const int64_t[]){ __VA_ARGS__ }
#define VALS(...) (const double[]){ __VA_ARGS__ }, \
		(int64_t)(sizeof((double[]){ __VA_ARGS__ }) / sizeof(double))

static json_t *attrs_of(const char *s)
{
	json_error_t e;
	json_t *j;

	if (!s)
		return NULL;
	j = json_loads(s, 0, &e);
	cr_assert_not_null(j, "bad test JSON %s: %s", s, e.text);
	return j;
}

static enum dg_status run(const char *op, const char *attrs, const struct dg_tensor *const *in,
			  int n_in, struct dg_tensor **out, int n_out, struct dg_err *err)
{
	const struct dg_op_def *d = dg_op_find(op);
	json_t *a;
	enum dg_status st;

	cr_assert_not_null(d, "op %s is not registered", op);
	a = attrs_of(attrs);
	st = dg_op_run(d, a, in, n_in, out, n_out, 0, err);
	json_decref(a);
	return st;
}

/* One input (or none when x is NULL), one output, must succeed. */
static struct dg_tensor *run1(const char *op, const char *attrs, const struct dg_tensor *x)
{
	struct dg_err err = { 0 };
	struct dg_tensor *y = NULL;
	const struct dg_tensor *in[1] = { x };
	enum dg_status st = run(op, attrs, in, x ? 1 : 0, &y, 1, &err);

	cr_assert_eq(st, DG_OK, "%s %s failed: %s", op, attrs ? attrs : "", err.msg);
	cr_assert_not_null(y);
	return y;
}

/* Must fail with code and a message containing needle; no output left. */
static void fails1(const char *op, const char *attrs, const struct dg_tensor *x,
		   enum dg_status code, const char *needle)
{
	struct dg_err err = { 0 };
	struct dg_tensor *y = NULL;
	const struct dg_tensor *in[1] = { x };
	enum dg_status st = run(op, attrs, in, x ? 1 : 0, &y, 1, &err);

	cr_assert_eq(st, code, "%s %s: want code %d, got %d (%s)", op, attrs ? attrs : "",
		     code, st, err.msg);
	cr_assert_null(y);
	cr_assert_not_null(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
	cr_assert_not_null(strstr(err.msg, op), "message '%s' does not name %s", err.msg, op);
}

static struct dg_tensor *mk(enum dg_dtype dt, int ndim, const int64_t *dims, const void *data)
{
	struct dg_shape s = dg_shape_make(ndim, dims);
	struct dg_err err = { 0 };
	struct dg_tensor *t = data ? dg_tensor_from_data(dt, &s, data, &err)
				   : dg_tensor_new(dt, &s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	return t;
}

/* Elements 0, 1, 2, ... (mod 256 for uint8, mod 2 for bool). */
static struct dg_tensor *iota(enum dg_dtype dt, int ndim, const int64_t *dims)
{
	struct dg_tensor *t = mk(dt, ndim, dims, NULL);

	for (int64_t i = 0; i < t->numel; i++)
		dg_tensor_set_f64(t, i, dt == DG_U8 ? i % 256 : dt == DG_BOOL ? i % 2 : (double)i);
	return t;
}

static void expect_shape(const struct dg_tensor *t, int ndim, const int64_t *dims)
{
	struct dg_shape want = dg_shape_make(ndim, dims);
	char a[128], b[128];

	dg_shape_format(&t->shape, a, sizeof a);
	dg_shape_format(&want, b, sizeof b);
	cr_assert(dg_shape_eq(&t->shape, &want), "shape %s, want %s", a, b);
}

static void expect_vals(const struct dg_tensor *t, const double *v, int64_t n)
{
	cr_assert_eq(t->numel, n, "numel %lld, want %lld", (long long)t->numel, (long long)n);
	for (int64_t i = 0; i < n; i++)
		cr_assert_eq(dg_tensor_get_f64(t, i), v[i], "element %lld is %g, want %g",
			     (long long)i, dg_tensor_get_f64(t, i), v[i]);
}

static bool same_bytes(const struct dg_tensor *a, const struct dg_tensor *b)
{
	return a->dtype == b->dtype && dg_shape_eq(&a->shape, &b->shape) &&
	       a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0;
}

/* Inference of a one-input (or no-input), one-output op. */
static enum dg_status infer1(const char *op, const char *attrs, const struct dg_ttype *in,
			     struct dg_ttype *out, struct dg_err *err)
{
	const struct dg_op_def *d = dg_op_find(op);
	json_t *a = attrs_of(attrs ? attrs : "{}");
	struct dg_infer_ctx c = {
		.attrs = a, .n_in = in ? 1 : 0, .in = in, .n_out = 1, .out = out, .err = err,
	};
	enum dg_status st;

	cr_assert_not_null(d);
	st = d->infer(&c);
	json_decref(a);
	return st;
}

static struct dg_ttype tt(enum dg_dtype dt, int ndim, const int64_t *dims)
{
	struct dg_ttype t = { .dtype = dt, .shape = dg_shape_make(ndim, dims) };
	return t;
}

static void expect_tshape(const struct dg_ttype *t, int ndim, const int64_t *dims)
{
	struct dg_shape want = dg_shape_make(ndim, dims);
	char a[128], b[128];

	dg_shape_format(&t->shape, a, sizeof a);
	dg_shape_format(&want, b, sizeof b);
	cr_assert(dg_shape_eq(&t->shape, &want), "inferred %s, want %s", a, b);
}

/* Reference transpose by index arithmetic, element by element. */
static void naive_transpose(const struct dg_tensor *x, const int64_t *perm, struct dg_tensor *y)
{
	int r = x->shape.ndim;
	int64_t xs[DG_MAX_DIMS], idx[DG_MAX_DIMS];

	xs[r - 1] = 1;
	for (int k = r - 2; k >= 0; k--)
		xs[k] = xs[k + 1] * x->shape.dim[k + 1];
	for (int64_t o = 0; o < y->numel; o++) {
		int64_t rem = o, src = 0;
		for (int k = r - 1; k >= 0; k--) {
			idx[k] = rem % y->shape.dim[k];
			rem /= y->shape.dim[k];
		}
		for (int k = 0; k < r; k++)
			src += idx[k] * xs[perm[k]];
		dg_tensor_set_f64(y, o, dg_tensor_get_f64(x, src));
	}
}

/* --- Slice --------------------------------------------------------------- */

Test(array, slice_takes_a_window_of_a_float32_matrix)
{
	struct dg_tensor *x = iota(DG_F32, SH(3, 4));
	struct dg_tensor *y = run1("Slice", "{\"begin\":[1,1],\"size\":[2,-1]}", x);

	expect_shape(y, SH(2, 3));
	expect_vals(y, VALS(5, 6, 7, 9, 10, 11));
	dg_tensor_free(x);
	dg_tensor_free(y);
}

Test(array, slice_of_int64_3d_and_uint8_1d_and_bool_4d)
{
	struct dg_tensor *x = iota(DG_I64, SH(2, 3, 4));
	struct dg_tensor *y = run1("Slice", "{\"begin\":[0,1,2],\"size\":[2,2,1]}", x);

	expect_shape(y, SH(2, 2, 1));
	expect_vals(y, VALS(6, 10, 18, 22));   /* i*12 + j*4 + 2, i in 0..1, j in 1..2 */
	dg_tensor_free(x);
	dg_tensor_free(y);

	x = iota(DG_U8, SH(5));
	y = run1("Slice", "{\"begin\":[3],\"size\":[-1]}", x);
	expect_vals(y, VALS(3, 4));
	dg_tensor_free(x);
	dg_tensor_free(y);

	x = iota(DG_BOOL, SH(2, 2, 2, 3));      /* element i holds i % 2 */
	y = run1("Slice", "{\"begin\":[1,0,1,1],\"size\":[1,2,1,2]}", x);
	expect_shape(y, SH(1, 2, 1, 2));
	expect_vals(y, VALS(0, 1, 0, 1));       /* elements 16,17 and 22,23 */
	dg_tensor_free(x);
	dg_tensor_free(y);
}

Test(array, slice_with_zero_size_gives_an_empty_tensor)
{
	struct dg_tensor *x = iota(DG_F64, SH(3, 4));
	struct dg_tensor *y = run1("Slice", "{\"begin\":[3,0],\"size\":[-1,4]}", x);

	expect_shape(y, SH(0, 4));
	cr_assert_eq(y->numel, 0);
	dg_tensor_free(x);
	dg_tensor_free(y);
}

Test(array, slice_of_an_8d_tensor_matches_index_arithmetic)
{
	struct dg_tensor *x = iota(DG_I32, SH(2, 2, 2, 2, 2, 2, 2, 3));
	struct dg_tensor *y = run1("Slice", "{\"begin\":[1,0,1,0,1,0,1,1],"
				   "\"size\":[1,1,1,1,1,1,1,2]}", x);

	/* strides 192,96,48,24,12,6,3,1: 192+48+12+3+1 = 256 */
	expect_shape(y, SH(1, 1, 1, 1, 1, 1, 1, 2));
	expect_vals(y, VALS(256, 257));
	dg_tensor_free(x);
	dg_tensor_free(y);
}

Test(array, slice_rejects_bad_begin_and_size)
{
	struct dg_tensor *x = iota(DG_F32, SH(2, 3));

	fails1("Slice", "{\"begin\":[0],\"size\":[1]}", x, DG_EINVAL,
	       "'begin' has 1 entries but the input [2,3] has rank 2");
	fails1("Slice", "{\"begin\":[0,0],\"size\":[1]}", x, DG_EINVAL,
	       "'begin' has 2 entries but attr 'size' has 1");
	fails1("Slice", "{\"begin\":[0,5],\"size\":[1,1]}", x, DG_EINVAL,
	       "begin[1] = 5 is out of range for dim 1");
	fails1("Slice", "{\"begin\":[-1,0],\"size\":[1,1]}", x, DG_EINVAL,
	       "begin[0] = -1 is out of range for dim 0");
	fails1("Slice", "{\"begin\":[1,1],\"size\":[1,3]}", x, DG_EINVAL,
	       "begin[1] + size[1] = 1 + 3 runs past dim 1 of input [2,3]");
	fails1("Slice", "{\"begin\":[0,0],\"size\":[1,-2]}", x, DG_EINVAL, "size[1] = -2");
	fails1("Slice", "{\"begin\":[0,0]}", x, DG_EINVAL, "missing required attr 'size'");
	fails1("Slice", "{\"begin\":[0,0],\"size\":[1,1],\"strides\":[1,1]}", x, DG_EINVAL,
	       "has no attr 'strides'");
	dg_tensor_free(x);
}

Test(array, slice_infers_sizes_and_keeps_unknowns)
{
	struct dg_ttype in = tt(DG_F32, SH(-1, 5)), out;
	struct dg_err err = { 0 };

	cr_assert_eq(infer1("Slice", "{\"begin\":[1,2],\"size\":[-1,-1]}", &in, &out, &err),
		     DG_OK, "%s", err.msg);
	expect_tshape(&out, SH(-1, 3));
	cr_assert_eq(out.dtype, DG_F32);
	in.shape.ndim = -1;
	cr_assert_eq(infer1("Slice", "{\"begin\":[1,2],\"size\":[4,-1]}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(4, -1));
	in = tt(DG_F32, SH(-1, 5));
	cr_assert_eq(infer1("Slice", "{\"begin\":[0,4],\"size\":[1,2]}", &in, &out, &err),
		     DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "runs past dim 1"), "%s", err.msg);
}

/* --- StridedSlice ---------------------------------------------------------- */

Test(array, strided_slice_reverses_like_numpy_double_colon_minus_one)
{
	struct dg_tensor *x = iota(DG_I32, SH(6));
	struct dg_tensor *y = run1("StridedSlice", "{\"begin\":[0],\"end\":[0],\"strides\":[-1],"
				   "\"begin_mask\":1,\"end_mask\":1}", x);

	expect_vals(y, VALS(5, 4, 3, 2, 1, 0));    /* x[::-1] */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[1],\"end\":[-1],\"strides\":[2]}", x);
	expect_vals(y, VALS(1, 3));                /* x[1:-1:2] */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[5],\"end\":[1],\"strides\":[-1]}", x);
	expect_vals(y, VALS(5, 4, 3, 2));          /* x[5:1:-1] */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[-2],\"end\":[0],\"end_mask\":1}", x);
	expect_vals(y, VALS(4, 5));                /* x[-2:] */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[-100],\"end\":[100],\"strides\":[3]}", x);
	expect_vals(y, VALS(0, 3));                /* x[-100:100:3], clamped */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[10],\"end\":[20]}", x);
	expect_shape(y, SH(0));                    /* x[10:20] */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[1],\"end\":[4],\"strides\":[-1]}", x);
	expect_shape(y, SH(0));                    /* x[1:4:-1] runs against the step */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[-1],\"end\":[-7],\"strides\":[-2]}", x);
	expect_vals(y, VALS(5, 3, 1));             /* x[-1:-7:-2] */
	dg_tensor_free(y);
	dg_tensor_free(x);
}

Test(array, strided_slice_shrinks_a_column_like_x_colon_comma_zero)
{
	struct dg_tensor *x = iota(DG_F32, SH(3, 4));
	struct dg_tensor *y = run1("StridedSlice", "{\"begin\":[0,0],\"end\":[0,1],"
				   "\"strides\":[1,1],\"begin_mask\":1,\"end_mask\":1,"
				   "\"shrink_axis_mask\":2}", x);

	expect_shape(y, SH(3));
	expect_vals(y, VALS(0, 4, 8));             /* x[:, 0] */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[-1],\"end\":[0],\"shrink_axis_mask\":1}", x);
	expect_shape(y, SH(4));
	expect_vals(y, VALS(8, 9, 10, 11));        /* x[-1] */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[0,1],\"end\":[0,3],\"strides\":[-2,1],"
				   "\"begin_mask\":1,\"end_mask\":1}", x);
	expect_shape(y, SH(2, 2));
	expect_vals(y, VALS(9, 10, 1, 2));         /* x[::-2, 1:3] */
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[1,2],\"end\":[2,3],\"shrink_axis_mask\":3}", x);
	expect_shape(y, SH0);
	expect_vals(y, VALS(6));                   /* x[1, 2] */
	dg_tensor_free(y);
	dg_tensor_free(x);
}

Test(array, strided_slice_handles_ellipsis_and_new_axes)
{
	struct dg_tensor *x = iota(DG_I64, SH(2, 3, 4));
	struct dg_tensor *y = run1("StridedSlice", "{\"begin\":[0,1],\"end\":[0,2],"
				   "\"ellipsis_mask\":1,\"shrink_axis_mask\":2}", x);

	expect_shape(y, SH(2, 3));                 /* x[..., 1]: i*12 + j*4 + 1 */
	expect_vals(y, VALS(1, 5, 9, 13, 17, 21));
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[0,0,1,0],\"end\":[0,0,3,0],\"begin_mask\":1,"
				   "\"end_mask\":1,\"new_axis_mask\":2,\"ellipsis_mask\":8}", x);
	expect_shape(y, SH(2, 1, 2, 4));           /* x[:, newaxis, 1:3, ...] */
	expect_vals(y, VALS(4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23));
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[0,0,0],\"end\":[0,0,0],\"begin_mask\":1,"
				   "\"end_mask\":1,\"new_axis_mask\":2,\"ellipsis_mask\":4}", x);
	expect_shape(y, SH(2, 1, 3, 4));           /* x[:, newaxis, ...] */
	cr_assert_eq(memcmp(y->data, x->data, x->nbytes), 0);
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[0,0,0],\"end\":[0,0,1],\"new_axis_mask\":1,"
				   "\"ellipsis_mask\":2,\"shrink_axis_mask\":4}", x);
	expect_shape(y, SH(1, 2, 3));              /* x[newaxis, ..., 0] */
	expect_vals(y, VALS(0, 4, 8, 12, 16, 20));
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[0,-1],\"end\":[0,0],\"ellipsis_mask\":1,"
				   "\"new_axis_mask\":0,\"shrink_axis_mask\":2}", x);
	expect_shape(y, SH(2, 3));                 /* x[..., -1] */
	expect_vals(y, VALS(3, 7, 11, 15, 19, 23));
	dg_tensor_free(y);
	dg_tensor_free(x);
}

Test(array, strided_slice_of_a_4d_float64_mixes_index_step_and_reverse)
{
	struct dg_tensor *x = iota(DG_F64, SH(2, 3, 2, 2));
	/* x[1, ::2, :, -1]: 12 + j*4 + k*2 + 1 for j in {0, 2}, k in {0, 1} */
	struct dg_tensor *y = run1("StridedSlice", "{\"begin\":[1,0,0,-1],\"end\":[2,0,0,0],"
				   "\"strides\":[1,2,1,1],\"begin_mask\":6,\"end_mask\":6,"
				   "\"shrink_axis_mask\":9}", x);

	expect_shape(y, SH(2, 2));
	expect_vals(y, VALS(13, 15, 21, 23));
	dg_tensor_free(y);
	/* x[::-1, 1, ::-1, :]: i in {1,0}, j = 1, k in {1,0}, l in {0,1} */
	y = run1("StridedSlice", "{\"begin\":[0,1,0,0],\"end\":[0,2,0,0],"
				   "\"strides\":[-1,1,-1,1],\"begin_mask\":13,\"end_mask\":13,"
				   "\"shrink_axis_mask\":2}", x);
	expect_shape(y, SH(2, 2, 2));
	expect_vals(y, VALS(18, 19, 16, 17, 6, 7, 4, 5));
	dg_tensor_free(y);
	dg_tensor_free(x);
}

Test(array, strided_slice_rejects_bad_specs)
{
	struct dg_tensor *x = iota(DG_I32, SH(6));
	struct dg_tensor *m = iota(DG_I32, SH(2, 3));

	fails1("StridedSlice", "{\"begin\":[0],\"end\":[3],\"strides\":[0]}", x, DG_EINVAL,
	       "strides[0] is 0");
	fails1("StridedSlice", "{\"begin\":[6],\"end\":[7],\"shrink_axis_mask\":1}", x,
	       DG_EINVAL, "index 6 is out of bounds for dim 0 of size 6");
	fails1("StridedSlice", "{\"begin\":[-7],\"end\":[0],\"shrink_axis_mask\":1}", x,
	       DG_EINVAL, "index -7 is out of bounds");
	fails1("StridedSlice", "{\"begin\":[0,0],\"end\":[1,1],\"ellipsis_mask\":3}", x,
	       DG_EINVAL, "more than one bit");
	fails1("StridedSlice", "{\"begin\":[0,0],\"end\":[1,1]}", x, DG_EINVAL,
	       "more indices than the input [6] has dims");
	fails1("StridedSlice", "{\"begin\":[0,0],\"end\":[1]}", m, DG_EINVAL,
	       "have 2, 1 and 2 entries");
	fails1("StridedSlice", "{\"begin\":[0],\"end\":[1],\"begin_mask\":-1}", x, DG_EINVAL,
	       "'begin_mask' = -1 is negative");
	fails1("StridedSlice", "{\"begin\":[2],\"end\":[3],\"strides\":[-1],"
	       "\"shrink_axis_mask\":1}", x, DG_EINVAL, "only stride 1");
	fails1("StridedSlice", "{\"begin\":[0,0,0,0,0,0,0,0,0],\"end\":[0,0,0,0,0,0,0,0,0],"
	       "\"new_axis_mask\":510}", x, DG_EINVAL, "more than 8 dims");
	fails1("StridedSlice", "{\"end\":[1]}", x, DG_EINVAL, "missing required attr 'begin'");
	dg_tensor_free(x);
	dg_tensor_free(m);
}

Test(array, strided_slice_infers_unknown_dims_and_rank)
{
	struct dg_ttype in = tt(DG_F32, SH(-1, 4, 5)), out;
	struct dg_err err = { 0 };

	/* x[0, 1:3, ::2] with dim 0 unknown: the shrink still removes it */
	cr_assert_eq(infer1("StridedSlice", "{\"begin\":[0,1,0],\"end\":[1,3,0],"
			    "\"strides\":[1,1,2],\"end_mask\":4,\"shrink_axis_mask\":1}",
			    &in, &out, &err), DG_OK, "%s", err.msg);
	expect_tshape(&out, SH(2, 3));
	cr_assert_eq(infer1("StridedSlice", "{\"begin\":[1],\"end\":[3]}", &in, &out, &err),
		     DG_OK);
	expect_tshape(&out, SH(-1, 4, 5));
	in.shape.ndim = -1;
	cr_assert_eq(infer1("StridedSlice", "{\"begin\":[1],\"end\":[3]}", &in, &out, &err),
		     DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
	cr_assert_eq(infer1("StridedSlice", "{\"begin\":[1],\"end\":[3],\"strides\":[0]}", &in,
			    &out, &err), DG_EINVAL);
}

/* A step larger than the dim leaves one element, whatever its size: the
 * kernel must not multiply 2^62 by the row stride (signed overflow, which
 * UBSan reports). */
Test(array, strided_slice_with_a_huge_step_takes_one_element)
{
	struct dg_tensor *x = iota(DG_F32, SH(4, 4));
	struct dg_tensor *y = run1("StridedSlice", "{\"begin\":[0,0],\"end\":[4,4],"
				   "\"strides\":[4611686018427387904,1]}", x);

	expect_shape(y, SH(1, 4));
	expect_vals(y, VALS(0, 1, 2, 3));
	dg_tensor_free(y);
	y = run1("StridedSlice", "{\"begin\":[3,1],\"end\":[0,4],\"end_mask\":1,"
		 "\"strides\":[-9223372036854775807,9223372036854775807]}", x);
	expect_shape(y, SH(1, 1));
	expect_vals(y, VALS(13));
	dg_tensor_free(y);
	dg_tensor_free(x);
}

/* --- Concat ---------------------------------------------------------------- */

Test(array, concat_joins_float32_matrices_on_either_axis)
{
	struct dg_tensor *a = iota(DG_F32, SH(2, 2)), *b = iota(DG_F32, SH(2, 3)), *y = NULL;
	struct dg_tensor *c = iota(DG_F32, SH(1, 2));
	const struct dg_tensor *in[2] = { a, b };
	struct dg_err err = { 0 };

	cr_assert_eq(run("Concat", "{\"axis\":1}", in, 2, &y, 1, &err), DG_OK, "%s", err.msg);
	expect_shape(y, SH(2, 5));
	expect_vals(y, VALS(0, 1, 0, 1, 2, 2, 3, 3, 4, 5));
	dg_tensor_free(y);
	cr_assert_eq(run("Concat", "{\"axis\":-1}", in, 2, &y, 1, &err), DG_OK, "%s", err.msg);
	expect_shape(y, SH(2, 5));
	dg_tensor_free(y);
	in[1] = c;
	cr_assert_eq(run("Concat", "{\"axis\":0}", in, 2, &y, 1, &err), DG_OK, "%s", err.msg);
	expect_shape(y, SH(3, 2));
	expect_vals(y, VALS(0, 1, 2, 3, 0, 1));
	dg_tensor_free(y);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(c);
}

Test(array, concat_joins_int64_3d_bool_1d_and_a_single_input)
{
	struct dg_tensor *a = iota(DG_I64, SH(2, 1, 2)), *b = iota(DG_I64, SH(2, 2, 2)), *y = NULL;
	const struct dg_tensor *in[3] = { a, b };
	struct dg_err err = { 0 };
	uint8_t t[] = { 1, 0 }, f[] = { 0 }, u[] = { 1, 1, 0 };

	cr_assert_eq(run("Concat", "{\"axis\":1}", in, 2, &y, 1, &err), DG_OK, "%s", err.msg);
	expect_shape(y, SH(2, 3, 2));
	expect_vals(y, VALS(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 6, 7));
	dg_tensor_free(y);
	dg_tensor_free(a);
	dg_tensor_free(b);

	in[0] = a = mk(DG_BOOL, SH(2), t);
	in[1] = b = mk(DG_BOOL, SH(1), f);
	struct dg_tensor *c = mk(DG_BOOL, SH(3), u);
	in[2] = c;
	cr_assert_eq(run("Concat", "{\"axis\":0}", in, 3, &y, 1, &err), DG_OK, "%s", err.msg);
	expect_vals(y, VALS(1, 0, 0, 1, 1, 0));
	dg_tensor_free(y);
	cr_assert_eq(run("Concat", "{\"axis\":0}", in, 1, &y, 1, &err), DG_OK, "%s", err.msg);
	cr_assert(same_bytes(y, a));
	dg_tensor_free(y);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(c);
}

Test(array, concat_rejects_mismatched_inputs_and_axes)
{
	struct dg_tensor *a = iota(DG_F32, SH(2, 3)), *b = iota(DG_I32, SH(2, 3));
	struct dg_tensor *c = iota(DG_F32, SH(3, 4)), *d = iota(DG_F32, SH(6));
	struct dg_tensor *s = iota(DG_F32, SH0), *y = NULL;
	const struct dg_tensor *in[2] = { a, b };
	struct dg_err err = { 0 };

	cr_assert_eq(run("Concat", "{\"axis\":0}", in, 2, &y, 1, &err), DG_EDTYPE);
	cr_assert_not_null(strstr(err.msg, "input 1 is int32 but input 0 is float32"), "%s",
			   err.msg);
	in[1] = c;
	cr_assert_eq(run("Concat", "{\"axis\":0}", in, 2, &y, 1, &err), DG_ESHAPE);
	cr_assert_not_null(strstr(err.msg, "input 1 has shape [3,4], which does not match input "
				  "0's [2,3] outside axis 0"), "%s", err.msg);
	in[1] = d;
	cr_assert_eq(run("Concat", "{\"axis\":0}", in, 2, &y, 1, &err), DG_ESHAPE);
	cr_assert_not_null(strstr(err.msg, "input 1 has shape [6]"), "%s", err.msg);
	in[1] = a;
	cr_assert_eq(run("Concat", "{\"axis\":2}", in, 2, &y, 1, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "axis 2 is out of range for rank 2"), "%s", err.msg);
	cr_assert_eq(run("Concat", NULL, in, 2, &y, 1, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "missing required attr 'axis'"), "%s", err.msg);
	in[0] = in[1] = s;
	cr_assert_eq(run("Concat", "{\"axis\":0}", in, 2, &y, 1, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "out of range for rank 0"), "%s", err.msg);
	cr_assert_null(y);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(c);
	dg_tensor_free(d);
	dg_tensor_free(s);
}

Test(array, concat_infers_summed_axis_and_merged_unknowns)
{
	const struct dg_op_def *op = dg_op_find("Concat");
	struct dg_ttype in[3] = {
		tt(DG_F32, SH(2, -1)), tt(DG_F32, SH(3, 4)), tt(DG_F32, SH(5, -1)),
	};
	struct dg_ttype out;
	struct dg_err err = { 0 };
	json_t *a = attrs_of("{\"axis\":0}");
	struct dg_infer_ctx c = { .attrs = a, .n_in = 3, .in = in, .n_out = 1, .out = &out,
				  .err = &err };

	cr_assert_eq(op->infer(&c), DG_OK, "%s", err.msg);
	expect_tshape(&out, SH(10, 4));
	in[2] = tt(DG_F32, SH(-1, 4));
	cr_assert_eq(op->infer(&c), DG_OK, "%s", err.msg);
	expect_tshape(&out, SH(-1, 4));
	in[2].shape.ndim = -1;
	cr_assert_eq(op->infer(&c), DG_OK, "%s", err.msg);
	expect_tshape(&out, SH(-1, 4));
	in[2] = tt(DG_F32, SH(1, 5));
	cr_assert_eq(op->infer(&c), DG_ESHAPE);
	cr_assert_not_null(strstr(err.msg, "input 2 has shape [1,5]"), "%s", err.msg);
	in[2] = tt(DG_F64, SH(1, 4));
	cr_assert_eq(op->infer(&c), DG_EDTYPE);
	in[0].shape.ndim = in[1].shape.ndim = in[2].shape.ndim = -1;
	in[2].dtype = DG_F32;
	cr_assert_eq(op->infer(&c), DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
	json_decref(a);
}

/* --- Split ----------------------------------------------------------------- */

Test(array, split_cuts_equal_parts_of_float32_and_int32)
{
	struct dg_tensor *x = iota(DG_F32, SH(6)), *y[3] = { 0 };
	const struct dg_tensor *in[1] = { x };
	struct dg_err err = { 0 };

	cr_assert_eq(run("Split", "{\"num_split\":3}", in, 1, y, 3, &err), DG_OK, "%s", err.msg);
	expect_vals(y[0], VALS(0, 1));
	expect_vals(y[1], VALS(2, 3));
	expect_vals(y[2], VALS(4, 5));
	for (int i = 0; i < 3; i++)
		dg_tensor_free(y[i]);
	dg_tensor_free(x);

	in[0] = x = iota(DG_I32, SH(2, 4));
	cr_assert_eq(run("Split", "{\"axis\":-1,\"num_split\":2}", in, 1, y, 2, &err), DG_OK,
		     "%s", err.msg);
	expect_shape(y[0], SH(2, 2));
	expect_vals(y[0], VALS(0, 1, 4, 5));
	expect_vals(y[1], VALS(2, 3, 6, 7));
	dg_tensor_free(y[0]);
	dg_tensor_free(y[1]);
	dg_tensor_free(x);
}

Test(array, split_by_size_splits_infers_the_minus_one)
{
	struct dg_tensor *x = iota(DG_U8, SH(2, 6)), *y[3] = { 0 };
	const struct dg_tensor *in[1] = { x };
	struct dg_err err = { 0 };

	cr_assert_eq(run("Split", "{\"axis\":1,\"size_splits\":[1,-1,2]}", in, 1, y, 3, &err),
		     DG_OK, "%s", err.msg);
	expect_shape(y[0], SH(2, 1));
	expect_shape(y[1], SH(2, 3));
	expect_shape(y[2], SH(2, 2));
	expect_vals(y[0], VALS(0, 6));
	expect_vals(y[1], VALS(1, 2, 3, 7, 8, 9));
	expect_vals(y[2], VALS(4, 5, 10, 11));
	for (int i = 0; i < 3; i++)
		dg_tensor_free(y[i]);
	cr_assert_eq(run("Split", "{\"axis\":1,\"size_splits\":[0,6]}", in, 1, y, 2, &err), DG_OK);
	expect_shape(y[0], SH(2, 0));
	cr_assert(same_bytes(y[1], x));
	dg_tensor_free(y[0]);
	dg_tensor_free(y[1]);
	dg_tensor_free(x);
}

Test(array, split_counts_outputs_from_attrs)
{
	const struct dg_op_def *op = dg_op_find("Split");
	struct dg_err err = { 0 };
	json_t *a = attrs_of("{\"num_split\":3}"), *b = attrs_of("{\"size_splits\":[1,2,3,-1]}");
	json_t *c = attrs_of("{\"num_split\":5000}"), *d = attrs_of("{}");
	json_t *e = attrs_of("{\"num_split\":2,\"size_splits\":[1,1]}");
	json_t *f = attrs_of("{\"num_split\":0}");

	cr_assert_not_null(op->num_outputs);
	cr_assert_eq(op->num_outputs(a, &err), 3);
	cr_assert_eq(op->num_outputs(b, &err), 4);
	cr_assert_eq(op->num_outputs(c, &err), -1);
	cr_assert_not_null(strstr(err.msg, "5000 parts is out of range 1..4096"), "%s", err.msg);
	cr_assert_eq(op->num_outputs(d, &err), -1);
	cr_assert_not_null(strstr(err.msg, "missing attr 'num_split'"), "%s", err.msg);
	cr_assert_eq(op->num_outputs(e, &err), -1);
	cr_assert_not_null(strstr(err.msg, "both"), "%s", err.msg);
	cr_assert_eq(op->num_outputs(f, &err), -1);
	json_decref(a);
	json_decref(b);
	json_decref(c);
	json_decref(d);
	json_decref(e);
	json_decref(f);
}

Test(array, split_rejects_bad_parts)
{
	struct dg_tensor *x = iota(DG_F32, SH(7)), *y[3] = { 0 };
	const struct dg_tensor *in[1] = { x };
	struct dg_err err = { 0 };

	cr_assert_eq(run("Split", "{\"num_split\":3}", in, 1, y, 3, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "dim 0 of size 7 is not divisible by num_split 3"),
			   "%s", err.msg);
	cr_assert_eq(run("Split", "{\"size_splits\":[3,3]}", in, 1, y, 2, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "size_splits sum to 6 but dim 0 has size 7"), "%s",
			   err.msg);
	cr_assert_eq(run("Split", "{\"size_splits\":[-1,-1]}", in, 1, y, 2, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "at most one size can be inferred"), "%s", err.msg);
	cr_assert_eq(run("Split", "{\"size_splits\":[4,4,-1]}", in, 1, y, 3, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "sum to 8 but dim 0 has size 7"), "%s", err.msg);
	cr_assert_eq(run("Split", "{\"size_splits\":[-2,9]}", in, 1, y, 2, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "size_splits[0] = -2 is invalid"), "%s", err.msg);
	cr_assert_eq(run("Split", "{\"num_split\":7}", in, 1, y, 3, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "produces 7 outputs; caller expects 3"), "%s", err.msg);
	cr_assert_eq(run("Split", "{\"num_split\":1,\"axis\":1}", in, 1, y, 1, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "axis 1 is out of range for rank 1"), "%s", err.msg);
	for (int i = 0; i < 3; i++)
		cr_assert_null(y[i]);
	dg_tensor_free(x);
}

Test(array, split_then_concat_is_the_identity_on_4d_float64)
{
	struct dg_tensor *x = iota(DG_F64, SH(2, 3, 7, 2)), *y[3] = { 0 }, *z = NULL;
	const struct dg_tensor *in[3] = { x };
	struct dg_err err = { 0 };

	for (int64_t i = 0; i < x->numel; i++)
		((double *)x->data)[i] = (double)(i * 37 % 101) / 7.0;
	cr_assert_eq(run("Split", "{\"axis\":2,\"size_splits\":[2,4,1]}", in, 1, y, 3, &err),
		     DG_OK, "%s", err.msg);
	expect_shape(y[1], SH(2, 3, 4, 2));
	for (int i = 0; i < 3; i++)
		in[i] = y[i];
	cr_assert_eq(run("Concat", "{\"axis\":-2}", in, 3, &z, 1, &err), DG_OK, "%s", err.msg);
	cr_assert(same_bytes(z, x));
	for (int i = 0; i < 3; i++)
		dg_tensor_free(y[i]);
	dg_tensor_free(z);
	dg_tensor_free(x);
}

Test(array, split_infers_parts_with_unknown_dims)
{
	const struct dg_op_def *op = dg_op_find("Split");
	struct dg_ttype in = tt(DG_I64, SH(4, -1)), out[3];
	struct dg_err err = { 0 };
	json_t *a = attrs_of("{\"axis\":1,\"size_splits\":[2,-1,3]}");
	json_t *b = attrs_of("{\"axis\":0,\"num_split\":3}");
	struct dg_infer_ctx c = { .attrs = a, .n_in = 1, .in = &in, .n_out = 3, .out = out,
				  .err = &err };

	cr_assert_eq(op->infer(&c), DG_OK, "%s", err.msg);
	expect_tshape(&out[0], SH(4, 2));
	expect_tshape(&out[1], SH(4, -1));
	expect_tshape(&out[2], SH(4, 3));
	cr_assert_eq(out[1].dtype, DG_I64);
	c.attrs = b;
	cr_assert_eq(op->infer(&c), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "size 4 is not divisible by num_split 3"), "%s",
			   err.msg);
	in.shape.ndim = -1;
	cr_assert_eq(op->infer(&c), DG_OK);
	cr_assert_eq(out[2].shape.ndim, -1);
	json_decref(a);
	json_decref(b);
}

/* --- Reshape --------------------------------------------------------------- */

Test(array, reshape_keeps_the_elements_and_infers_minus_one)
{
	struct dg_tensor *x = iota(DG_I32, SH(2, 3)), *y, *z;

	y = run1("Reshape", "{\"shape\":[3,-1]}", x);
	expect_shape(y, SH(3, 2));
	expect_vals(y, VALS(0, 1, 2, 3, 4, 5));
	z = run1("Reshape", "{\"shape\":[2,3]}", y);
	cr_assert(same_bytes(z, x));
	dg_tensor_free(y);
	dg_tensor_free(z);
	y = run1("Reshape", "{\"shape\":[]}", (z = iota(DG_F32, SH(1, 1))));
	expect_shape(y, SH0);
	dg_tensor_free(y);
	dg_tensor_free(z);
	dg_tensor_free(x);

	x = iota(DG_F64, SH(16));
	y = run1("Reshape", "{\"shape\":[1,2,1,2,1,2,1,-1]}", x);
	expect_shape(y, SH(1, 2, 1, 2, 1, 2, 1, 2));
	cr_assert_eq(memcmp(y->data, x->data, x->nbytes), 0);
	dg_tensor_free(y);
	dg_tensor_free(x);
}

Test(array, reshape_rejects_count_mismatches_and_bad_shapes)
{
	struct dg_tensor *x = iota(DG_F32, SH(2, 3)), *e = iota(DG_F32, SH(0, 3));

	fails1("Reshape", "{\"shape\":[4]}", x, DG_ESHAPE,
	       "cannot reshape a tensor of shape [2,3] (6 elements) into shape [4]");
	fails1("Reshape", "{\"shape\":[4,-1]}", x, DG_ESHAPE, "into shape [4,-1]");
	fails1("Reshape", "{\"shape\":[-1,-1]}", x, DG_EINVAL, "has more than one -1");
	fails1("Reshape", "{\"shape\":[-1,0]}", e, DG_EINVAL, "cannot infer the -1");
	fails1("Reshape", "{\"shape\":[-3,-2]}", x, DG_EINVAL, "invalid size -3");
	fails1("Reshape", "{\"shape\":[1,1,1,1,1,1,1,1,6]}", x, DG_EINVAL, "at most 8 allowed");
	fails1("Reshape", "{\"shape\":[65536,65536,65536,65536]}", x, DG_ETOOLARGE, "2^48");
	fails1("Reshape", "{}", x, DG_EINVAL, "missing required attr 'shape'");
	dg_tensor_free(x);
	dg_tensor_free(e);
}

Test(array, reshape_infers_known_counts_and_keeps_unknowns)
{
	struct dg_ttype in = tt(DG_F32, SH(4, 6)), out;
	struct dg_err err = { 0 };

	cr_assert_eq(infer1("Reshape", "{\"shape\":[-1,8]}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(3, 8));
	cr_assert_eq(infer1("Reshape", "{\"shape\":[5,5]}", &in, &out, &err), DG_ESHAPE);
	in = tt(DG_F32, SH(-1, 6));
	cr_assert_eq(infer1("Reshape", "{\"shape\":[-1,2,3]}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(-1, 2, 3));
	in.shape.ndim = -1;
	cr_assert_eq(infer1("Reshape", "{\"shape\":[6,4]}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(6, 4));
}

/* --- Transpose ------------------------------------------------------------- */

Test(array, transpose_of_small_matrices_in_every_element_size)
{
	enum dg_dtype dts[] = { DG_I32, DG_F64, DG_U8, DG_BOOL, DG_I64, DG_F32 };

	for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
		struct dg_tensor *x = iota(dts[k], SH(2, 3));
		struct dg_tensor *y = run1("Transpose", NULL, x);
		expect_shape(y, SH(3, 2));
		if (dts[k] == DG_BOOL)
			expect_vals(y, VALS(0, 1, 1, 0, 0, 1));
		else
			expect_vals(y, VALS(0, 3, 1, 4, 2, 5));
		dg_tensor_free(x);
		dg_tensor_free(y);
	}
}

Test(array, transpose_of_1000x777_matches_a_naive_loop)
{
	struct dg_tensor *x = mk(DG_F32, SH(1000, 777), NULL), *y;
	const float *xs;
	const float *ys;

	for (int64_t i = 0; i < x->numel; i++)
		((float *)x->data)[i] = (float)(i * 7919 % 100003) - 5.0f;
	y = run1("Transpose", "{\"perm\":[1,0]}", x);
	expect_shape(y, SH(777, 1000));
	xs = x->data;
	ys = y->data;
	for (int64_t i = 0; i < 1000; i++)
		for (int64_t j = 0; j < 777; j++)
			if (ys[j * 1000 + i] != xs[i * 777 + j])
				cr_assert_fail("y[%lld][%lld] = %g, want %g", (long long)j,
					       (long long)i, ys[j * 1000 + i], xs[i * 777 + j]);
	dg_tensor_free(x);
	dg_tensor_free(y);
}

Test(array, transpose_matches_naive_index_arithmetic_up_to_8d)
{
	static const struct {
		int nd;
		int64_t dims[8], perm[8];
		enum dg_dtype dt;
	} cases[] = {
		{ 3, { 2, 3, 4 }, { 2, 1, 0 }, DG_I32 },           /* default-like reversal */
		{ 3, { 5, 6, 7 }, { 0, 2, 1 }, DG_F64 },           /* batched 2-d */
		{ 4, { 2, 3, 4, 5 }, { 0, 2, 1, 3 }, DG_U8 },      /* inner rows stay whole */
		{ 4, { 3, 1, 4, 2 }, { 3, 1, 0, 2 }, DG_I64 },     /* a size-1 dim */
		{ 4, { 2, 3, 4, 5 }, { 2, 3, 0, 1 }, DG_F32 },     /* merges to 2-d */
		{ 4, { 3, 4, 5, 6 }, { 3, 1, 0, 2 }, DG_U8 },      /* 2-d tiles, 2 outer dims */
		{ 5, { 2, 3, 2, 3, 2 }, { 4, 2, 0, 3, 1 }, DG_F64 },
		{ 3, { 3, 40, 50 }, { 2, 0, 1 }, DG_F32 },         /* tiles with remainders */
		{ 8, { 2, 3, 2, 2, 3, 2, 2, 3 }, { 7, 0, 6, 1, 5, 2, 4, 3 }, DG_F32 },
		{ 8, { 2, 3, 2, 2, 3, 2, 2, 3 }, { 1, 0, 3, 2, 5, 4, 6, 7 }, DG_I64 },
	};

	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		struct dg_tensor *x = iota(cases[k].dt, cases[k].nd, cases[k].dims), *y, *want;
		char attrs[128];
		struct dg_shape os = { .ndim = cases[k].nd };
		int len = snprintf(attrs, sizeof attrs, "{\"perm\":[");

		for (int i = 0; i < cases[k].nd; i++) {
			len += snprintf(attrs + len, sizeof attrs - (size_t)len, "%s%lld",
					i ? "," : "", (long long)cases[k].perm[i]);
			os.dim[i] = cases[k].dims[cases[k].perm[i]];
		}
		snprintf(attrs + len, sizeof attrs - (size_t)len, "]}");
		y = run1("Transpose", attrs, x);
		want = mk(cases[k].dt, os.ndim, os.dim, NULL);
		naive_transpose(x, cases[k].perm, want);
		cr_assert(same_bytes(y, want), "case %zu (%s) differs from the naive transpose", k,
			  attrs);
		dg_tensor_free(x);
		dg_tensor_free(y);
		dg_tensor_free(want);
	}
}

Test(array, transpose_twice_with_the_inverse_perm_is_the_identity)
{
	struct dg_tensor *x = iota(DG_F32, SH(3, 4, 5, 6)), *y, *z;

	y = run1("Transpose", "{\"perm\":[2,0,3,1]}", x);
	expect_shape(y, SH(5, 3, 6, 4));
	/* inverse of [2,0,3,1]: axis 0 came from 1, 1 from 3, 2 from 0, 3 from 2 */
	z = run1("Transpose", "{\"perm\":[1,3,0,2]}", y);
	cr_assert(same_bytes(z, x));
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_tensor_free(z);
}

Test(array, transpose_rejects_non_permutations)
{
	struct dg_tensor *x = iota(DG_F32, SH(2, 3));

	fails1("Transpose", "{\"perm\":[0,0]}", x, DG_EINVAL, "[0,0] is not a permutation of 0..1");
	fails1("Transpose", "{\"perm\":[0,2]}", x, DG_EINVAL, "not a permutation");
	fails1("Transpose", "{\"perm\":[-1,0]}", x, DG_EINVAL, "not a permutation");
	fails1("Transpose", "{\"perm\":[0,1,2]}", x, DG_EINVAL,
	       "'perm' [0,1,2] has 3 entries but the input has rank 2");
	fails1("Transpose", "{\"perm\":[]}", x, DG_EINVAL, "has 0 entries");
	dg_tensor_free(x);
}

Test(array, transpose_infers_dims_and_rank_from_perm)
{
	struct dg_ttype in = tt(DG_U8, SH(2, -1, 4)), out;
	struct dg_err err = { 0 };

	cr_assert_eq(infer1("Transpose", NULL, &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(4, -1, 2));
	cr_assert_eq(infer1("Transpose", "{\"perm\":[1,2,0]}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(-1, 4, 2));
	in.shape.ndim = -1;
	cr_assert_eq(infer1("Transpose", "{\"perm\":[1,0]}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(-1, -1));
	cr_assert_eq(infer1("Transpose", NULL, &in, &out, &err), DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
}

/* A refused perm holds arbitrary indices; inference must stop at the error
 * instead of reading the input dims they name (the input is on the heap, as
 * in graph validation, so ASan sees a stray read). */
Test(array, transpose_infer_refuses_a_bad_perm_without_using_it)
{
	struct dg_ttype *in = malloc(sizeof *in), out;
	struct dg_err err = { 0 };

	cr_assert_not_null(in);
	*in = tt(DG_F32, SH(2, 3));
	cr_assert_eq(infer1("Transpose", "{\"perm\":[0,1,1099511627776]}", in, &out, &err),
		     DG_EINVAL);
	cr_assert(strstr(err.msg, "has 3 entries but the input has rank 2"), "%s", err.msg);
	cr_assert_eq(infer1("Transpose", "{\"perm\":[-3,0]}", in, &out, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "not a permutation"), "%s", err.msg);
	cr_assert_eq(infer1("Transpose", "{\"perm\":[1,1099511627776]}", in, &out, &err),
		     DG_EINVAL);
	free(in);
}

/* --- ExpandDims, Squeeze --------------------------------------------------- */

Test(array, expand_dims_then_squeeze_round_trips)
{
	struct dg_tensor *x = iota(DG_I64, SH(2, 3)), *y, *z;

	y = run1("ExpandDims", "{\"axis\":1}", x);
	expect_shape(y, SH(2, 1, 3));
	expect_vals(y, VALS(0, 1, 2, 3, 4, 5));
	z = run1("Squeeze", "{\"axis\":[1]}", y);
	cr_assert(same_bytes(z, x));
	dg_tensor_free(y);
	dg_tensor_free(z);
	y = run1("ExpandDims", "{\"axis\":-1}", x);
	expect_shape(y, SH(2, 3, 1));
	z = run1("Squeeze", "{\"axis\":[-1]}", y);
	cr_assert(same_bytes(z, x));
	dg_tensor_free(y);
	dg_tensor_free(z);
	y = run1("ExpandDims", "{\"axis\":-3}", x);
	expect_shape(y, SH(1, 2, 3));
	dg_tensor_free(y);
	dg_tensor_free(x);
}

Test(array, squeeze_without_axes_removes_every_size_one_dim)
{
	struct dg_tensor *x = iota(DG_F32, SH(1, 2, 1, 3, 1)), *y;

	y = run1("Squeeze", NULL, x);
	expect_shape(y, SH(2, 3));
	expect_vals(y, VALS(0, 1, 2, 3, 4, 5));
	dg_tensor_free(y);
	y = run1("Squeeze", "{\"axis\":[0,-1]}", x);
	expect_shape(y, SH(2, 1, 3));
	dg_tensor_free(y);
	dg_tensor_free(x);
	x = iota(DG_BOOL, SH(1, 1));
	y = run1("Squeeze", NULL, x);
	expect_shape(y, SH0);
	dg_tensor_free(y);
	dg_tensor_free(x);
}

Test(array, expand_dims_and_squeeze_reject_bad_axes)
{
	struct dg_tensor *x = iota(DG_F32, SH(2, 1, 3));
	struct dg_tensor *e = iota(DG_F32, SH(1, 1, 1, 1, 1, 1, 1, 1));

	fails1("ExpandDims", "{\"axis\":4}", x, DG_EINVAL, "axis 4 is out of range -4..3");
	fails1("ExpandDims", "{\"axis\":-5}", x, DG_EINVAL, "axis -5 is out of range");
	fails1("ExpandDims", "{\"axis\":0}", e, DG_EINVAL, "at most 8 dims");
	fails1("ExpandDims", NULL, x, DG_EINVAL, "missing required attr 'axis'");
	fails1("Squeeze", "{\"axis\":[0]}", x, DG_EINVAL,
	       "cannot squeeze dim 0 of size 2 in shape [2,1,3]");
	fails1("Squeeze", "{\"axis\":[3]}", x, DG_EINVAL, "axis 3 is out of range for rank 3");
	dg_tensor_free(x);
	dg_tensor_free(e);
}

Test(array, expand_dims_and_squeeze_infer_with_unknowns)
{
	struct dg_ttype in = tt(DG_F32, SH(-1, 1, 3)), out;
	struct dg_err err = { 0 };

	cr_assert_eq(infer1("ExpandDims", "{\"axis\":0}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(1, -1, 1, 3));
	cr_assert_eq(infer1("Squeeze", "{\"axis\":[1]}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(-1, 3));
	cr_assert_eq(infer1("Squeeze", "{\"axis\":[0]}", &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(1, 3));          /* an unknown dim squeezed must be 1 */
	cr_assert_eq(infer1("Squeeze", NULL, &in, &out, &err), DG_OK);
	cr_assert_eq(out.shape.ndim, -1);       /* might or might not drop dim 0 */
	cr_assert_eq(infer1("Squeeze", "{\"axis\":[2]}", &in, &out, &err), DG_EINVAL);
	in.shape.ndim = -1;
	cr_assert_eq(infer1("ExpandDims", "{\"axis\":0}", &in, &out, &err), DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
}

/* --- Size, Shape ----------------------------------------------------------- */

Test(array, size_and_shape_report_counts_in_int32_or_int64)
{
	struct dg_tensor *x = iota(DG_U8, SH(2, 3, 4)), *y;

	y = run1("Size", NULL, x);
	cr_assert_eq(y->dtype, DG_I32);
	expect_shape(y, SH0);
	expect_vals(y, VALS(24));
	dg_tensor_free(y);
	y = run1("Size", "{\"out_type\":\"int64\"}", x);
	cr_assert_eq(y->dtype, DG_I64);
	expect_vals(y, VALS(24));
	dg_tensor_free(y);
	y = run1("Shape", NULL, x);
	cr_assert_eq(y->dtype, DG_I32);
	expect_shape(y, SH(3));
	expect_vals(y, VALS(2, 3, 4));
	dg_tensor_free(y);
	y = run1("Shape", "{\"out_type\":\"int64\"}", x);
	cr_assert_eq(y->dtype, DG_I64);
	expect_vals(y, VALS(2, 3, 4));
	dg_tensor_free(y);
	dg_tensor_free(x);
	x = iota(DG_F32, SH0);
	y = run1("Shape", NULL, x);
	expect_shape(y, SH(0));
	dg_tensor_free(y);
	y = run1("Size", NULL, x);
	expect_vals(y, VALS(1));
	dg_tensor_free(y);
	dg_tensor_free(x);
}

Test(array, size_and_shape_refuse_values_int32_cannot_hold)
{
	struct dg_tensor *e = iota(DG_F32, SH(0, 3000000000)), *y;
	/* Size reads only the element count: a header without data stands in for
	 * a 4 GiB tensor. */
	struct dg_tensor big = { .dtype = DG_U8, .shape = { .ndim = 2, .dim = { 65536, 65536 } },
				 .numel = (int64_t)1 << 32, .nbytes = 0, .data = NULL };
	struct dg_ttype in = tt(DG_U8, SH(65536, 65536)), out;
	struct dg_err err = { 0 };

	fails1("Shape", NULL, e, DG_ETOOLARGE, "dimension 3000000000 does not fit int32");
	y = run1("Shape", "{\"out_type\":\"int64\"}", e);
	expect_vals(y, VALS(0, 3000000000));
	dg_tensor_free(y);
	fails1("Size", NULL, &big, DG_ETOOLARGE, "element count 4294967296 does not fit int32");
	y = run1("Size", "{\"out_type\":\"int64\"}", &big);
	expect_vals(y, VALS(4294967296.0));
	dg_tensor_free(y);
	fails1("Size", "{\"out_type\":\"float32\"}", e, DG_EDTYPE, "only int32 and int64");
	cr_assert_eq(infer1("Size", NULL, &in, &out, &err), DG_ETOOLARGE);
	cr_assert_eq(infer1("Size", "{\"out_type\":\"int64\"}", &in, &out, &err), DG_OK);
	cr_assert_eq(out.dtype, DG_I64);
	expect_tshape(&out, SH0);
	dg_tensor_free(e);
}

Test(array, shape_of_unknown_rank_infers_a_vector_of_unknown_length)
{
	struct dg_ttype in = tt(DG_F32, SH(-1, 5)), out;
	struct dg_err err = { 0 };

	cr_assert_eq(infer1("Shape", NULL, &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(2));
	in.shape.ndim = -1;
	cr_assert_eq(infer1("Shape", NULL, &in, &out, &err), DG_OK);
	expect_tshape(&out, SH(-1));
	cr_assert_eq(infer1("Size", NULL, &in, &out, &err), DG_OK);
	expect_tshape(&out, SH0);
	cr_assert_eq(out.dtype, DG_I32);
}

/* --- Fill, ZerosLike, OnesLike --------------------------------------------- */

Test(array, fill_makes_constant_tensors_of_each_dtype)
{
	struct dg_tensor *y = run1("Fill", "{\"shape\":[2,3],\"value\":1.5}", NULL);

	cr_assert_eq(y->dtype, DG_F32);
	expect_shape(y, SH(2, 3));
	expect_vals(y, VALS(1.5, 1.5, 1.5, 1.5, 1.5, 1.5));
	dg_tensor_free(y);
	y = run1("Fill", "{\"shape\":[3],\"value\":9007199254740993,\"dtype\":\"int64\"}", NULL);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(((int64_t *)y->data)[i], 9007199254740993LL);   /* 2^53 + 1, exact */
	dg_tensor_free(y);
	y = run1("Fill", "{\"shape\":[2],\"value\":-7,\"dtype\":\"int32\"}", NULL);
	expect_vals(y, VALS(-7, -7));
	dg_tensor_free(y);
	y = run1("Fill", "{\"shape\":[2,1,2],\"value\":255,\"dtype\":\"uint8\"}", NULL);
	expect_vals(y, VALS(255, 255, 255, 255));
	dg_tensor_free(y);
	y = run1("Fill", "{\"shape\":[],\"value\":1,\"dtype\":\"bool\"}", NULL);
	expect_shape(y, SH0);
	cr_assert_eq(((uint8_t *)y->data)[0], 1);
	dg_tensor_free(y);
	y = run1("Fill", "{\"shape\":[2],\"value\":0.1,\"dtype\":\"float64\"}", NULL);
	expect_vals(y, VALS(0.1, 0.1));
	dg_tensor_free(y);
	y = run1("Fill", "{\"shape\":[2],\"value\":3.0,\"dtype\":\"int64\"}", NULL);
	expect_vals(y, VALS(3, 3));
	dg_tensor_free(y);
	y = run1("Fill", "{\"shape\":[0,5],\"value\":3}", NULL);
	cr_assert_eq(y->numel, 0);
	dg_tensor_free(y);
}

Test(array, fill_rejects_values_that_do_not_fit)
{
	fails1("Fill", "{\"shape\":[2],\"value\":256,\"dtype\":\"uint8\"}", NULL, DG_EINVAL,
	       "'value' = 256 does not fit uint8");
	fails1("Fill", "{\"shape\":[2],\"value\":2.5,\"dtype\":\"int32\"}", NULL, DG_EINVAL,
	       "2.5 is not an integer");
	fails1("Fill", "{\"shape\":[2],\"value\":3000000000,\"dtype\":\"int32\"}", NULL,
	       DG_EINVAL, "does not fit int32");
	fails1("Fill", "{\"shape\":[2],\"value\":2,\"dtype\":\"bool\"}", NULL, DG_EINVAL,
	       "does not fit bool");
	fails1("Fill", "{\"shape\":[2],\"value\":1e39}", NULL, DG_EINVAL, "does not fit float32");
	fails1("Fill", "{\"shape\":[-1],\"value\":1}", NULL, DG_EINVAL, "invalid size -1");
	fails1("Fill", "{\"value\":1}", NULL, DG_EINVAL, "missing required attr 'shape'");
	fails1("Fill", "{\"shape\":[2]}", NULL, DG_EINVAL, "missing required attr 'value'");
	fails1("Fill", "{\"shape\":[2],\"value\":\"x\"}", NULL, DG_EINVAL, "must be a number");
	fails1("Fill", "{\"shape\":[2],\"value\":1,\"dtype\":\"complex\"}", NULL, DG_EDTYPE,
	       "unknown dtype 'complex'");
	cr_assert_eq(dg_op_find("Fill")->flags & DG_OPF_SOURCE, DG_OPF_SOURCE);
}

Test(array, fill_infers_dtype_and_shape_from_attrs)
{
	struct dg_ttype out;
	struct dg_err err = { 0 };

	cr_assert_eq(infer1("Fill", "{\"shape\":[4,2],\"value\":7,\"dtype\":\"int64\"}", NULL,
			    &out, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out.dtype, DG_I64);
	expect_tshape(&out, SH(4, 2));
}

Test(array, zeros_like_and_ones_like_match_dtype_and_shape)
{
	enum dg_dtype dts[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_U8, DG_BOOL, DG_F16, DG_BF16 };

	for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
		struct dg_tensor *x = iota(dts[k], SH(2, 1, 3)), *z, *o;
		struct dg_ttype in = tt(dts[k], SH(-1, 3)), out;
		struct dg_err err = { 0 };

		for (int64_t i = 0; i < x->numel; i++)
			dg_tensor_set_f64(x, i, 1 + i % 2);   /* make zeros a real change */
		z = run1("ZerosLike", NULL, x);
		o = run1("OnesLike", NULL, x);
		cr_assert_eq(z->dtype, dts[k]);
		cr_assert_eq(o->dtype, dts[k]);
		expect_shape(z, SH(2, 1, 3));
		expect_shape(o, SH(2, 1, 3));
		expect_vals(z, VALS(0, 0, 0, 0, 0, 0));
		expect_vals(o, VALS(1, 1, 1, 1, 1, 1));
		cr_assert_eq(infer1("OnesLike", NULL, &in, &out, &err), DG_OK);
		cr_assert_eq(out.dtype, dts[k]);
		expect_tshape(&out, SH(-1, 3));
		dg_tensor_free(x);
		dg_tensor_free(z);
		dg_tensor_free(o);
	}
	/* bool ones are the byte 1, floats are 1.0 bit for bit */
	struct dg_tensor *b = iota(DG_BOOL, SH(3)), *f = iota(DG_F32, SH(1)), *y;
	y = run1("OnesLike", NULL, b);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(((uint8_t *)y->data)[i], 1);
	dg_tensor_free(y);
	y = run1("OnesLike", NULL, f);
	cr_assert_eq(((float *)y->data)[0], 1.0f);
	dg_tensor_free(y);
	fails1("ZerosLike", "{\"dtype\":\"int32\"}", b, DG_EINVAL, "has no attr 'dtype'");
	dg_tensor_free(b);
	dg_tensor_free(f);
}

/* --- float16 and bfloat16 as storage ------------------------------------------ */

Test(array, fill_rounds_to_16_bit_floats_and_refuses_overflow)
{
	struct dg_tensor *y = run1("Fill", "{\"shape\":[2],\"value\":0.1,\"dtype\":\"float16\"}",
				   NULL);

	cr_assert_eq(y->dtype, DG_F16);
	cr_assert_eq(((uint16_t *)y->data)[0], 0x2e66);
	cr_assert_eq(((uint16_t *)y->data)[1], 0x2e66);
	dg_tensor_free(y);
	y = run1("Fill", "{\"shape\":[1],\"value\":-1.5,\"dtype\":\"bfloat16\"}", NULL);
	cr_assert_eq(((uint16_t *)y->data)[0], 0xbfc0);
	dg_tensor_free(y);
	fails1("Fill", "{\"shape\":[2],\"value\":65520,\"dtype\":\"float16\"}", NULL, DG_EINVAL,
	       "'value' = 65520 does not fit float16");
	fails1("Fill", "{\"shape\":[2],\"value\":1e39,\"dtype\":\"bfloat16\"}", NULL, DG_EINVAL,
	       "does not fit bfloat16");
}

/* Ops that only move elements take the 16-bit floats like any 2-byte dtype:
 * the bits come through unchanged. */
Test(array, data_movement_ops_carry_16_bit_floats_bit_for_bit)
{
	for (int k = 0; k < 2; k++) {
		enum dg_dtype dt = k ? DG_BF16 : DG_F16;
		uint16_t v[6] = { 0x3c00, 0x7e00, 0x8000, 0x0001, 0xfc00, 0x3555 };
		struct dg_tensor *x = mk(dt, SH(2, 3), v), *y, *c;
		const struct dg_tensor *two[2];
		struct dg_err err = { 0 };

		y = run1("Transpose", NULL, x);
		cr_assert_eq(y->dtype, dt);
		expect_shape(y, SH(3, 2));
		const uint16_t *t = y->data;
		cr_assert(t[0] == 0x3c00 && t[1] == 0x0001 && t[2] == 0x7e00 && t[3] == 0xfc00 &&
			  t[4] == 0x8000 && t[5] == 0x3555);
		dg_tensor_free(y);
		y = run1("Slice", "{\"begin\":[1,1],\"size\":[1,2]}", x);
		cr_assert(((uint16_t *)y->data)[0] == 0xfc00 && ((uint16_t *)y->data)[1] == 0x3555);
		dg_tensor_free(y);
		y = run1("Reshape", "{\"shape\":[6]}", x);
		cr_assert_eq(memcmp(y->data, v, sizeof v), 0);
		dg_tensor_free(y);
		two[0] = x;
		two[1] = x;
		cr_assert_eq(run("Concat", "{\"axis\":0}", two, 2, &c, 1, &err), DG_OK, "%s",
			     err.msg);
		expect_shape(c, SH(4, 3));
		cr_assert_eq(memcmp((uint16_t *)c->data + 6, v, sizeof v), 0);
		dg_tensor_free(c);
		dg_tensor_free(x);
	}
}

/* --- Gather, UnsortedSegmentSum ------------------------------------------------ */

/* Two inputs, one output, must succeed. */
static struct dg_tensor *run2(const char *op, const char *attrs, const struct dg_tensor *a,
			      const struct dg_tensor *b)
{
	struct dg_err err = { 0 };
	struct dg_tensor *y = NULL;
	const struct dg_tensor *in[2] = { a, b };
	enum dg_status st = run(op, attrs, in, 2, &y, 1, &err);

	cr_assert_eq(st, DG_OK, "%s %s failed: %s", op, attrs ? attrs : "", err.msg);
	cr_assert_not_null(y);
	return y;
}

/* Must fail with code, a message containing needle and a hint containing
 * hint (when not NULL); no output left. */
static void fails2(const char *op, const char *attrs, const struct dg_tensor *a,
		   const struct dg_tensor *b, enum dg_status code, const char *needle,
		   const char *hint)
{
	struct dg_err err = { 0 };
	struct dg_tensor *y = NULL;
	const struct dg_tensor *in[2] = { a, b };
	enum dg_status st = run(op, attrs, in, 2, &y, 1, &err);

	cr_assert_eq(st, code, "%s %s: want code %d, got %d (%s)", op, attrs ? attrs : "",
		     code, st, err.msg);
	cr_assert_null(y);
	cr_assert_not_null(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
	cr_assert_not_null(strstr(err.msg, op), "message '%s' does not name %s", err.msg, op);
	if (hint)
		cr_assert_not_null(strstr(err.hint, hint), "hint '%s' lacks '%s'", err.hint, hint);
}

/* Inference of a two-input, one-output op. */
static enum dg_status infer2(const char *op, const char *attrs, struct dg_ttype a,
			     struct dg_ttype b, struct dg_ttype *out, struct dg_err *err)
{
	struct dg_ttype in[2] = { a, b };
	const struct dg_op_def *d = dg_op_find(op);
	json_t *j = attrs_of(attrs ? attrs : "{}");
	struct dg_infer_ctx c = {
		.attrs = j, .n_in = 2, .in = in, .n_out = 1, .out = out, .err = err,
	};
	enum dg_status st;

	cr_assert_not_null(d);
	st = d->infer(&c);
	json_decref(j);
	return st;
}

Test(array, gather_picks_rows_of_a_float32_matrix_repeats_included)
{
	int32_t i1[] = { 3, 1, 3 };
	int64_t i2[] = { 0, 3, 3, 0 };
	struct dg_tensor *p = iota(DG_F32, SH(4, 3)), *ix = mk(DG_I32, SH(3), i1);
	struct dg_tensor *y = run2("Gather", NULL, p, ix);

	cr_assert_eq(y->dtype, DG_F32);
	expect_shape(y, SH(3, 3));
	expect_vals(y, VALS(9, 10, 11, 3, 4, 5, 9, 10, 11));
	dg_tensor_free(y);
	dg_tensor_free(ix);
	/* 2-d int64 indices: shape [2,2] + [3] */
	ix = mk(DG_I64, SH(2, 2), i2);
	y = run2("Gather", "{\"axis\":0}", p, ix);
	expect_shape(y, SH(2, 2, 3));
	expect_vals(y, VALS(0, 1, 2, 9, 10, 11, 9, 10, 11, 0, 1, 2));
	dg_tensor_free(y);
	dg_tensor_free(ix);
	dg_tensor_free(p);
}

Test(array, gather_with_a_scalar_index_drops_the_row_dim)
{
	int64_t two = 2;
	int32_t four = 4;
	struct dg_tensor *p = iota(DG_F64, SH(4, 3)), *ix = mk(DG_I64, SH0, &two);
	struct dg_tensor *y = run2("Gather", NULL, p, ix);

	expect_shape(y, SH(3));
	expect_vals(y, VALS(6, 7, 8));
	dg_tensor_free(y);
	dg_tensor_free(ix);
	dg_tensor_free(p);
	/* a 1-d table and a scalar index: a scalar */
	p = iota(DG_I64, SH(5));
	ix = mk(DG_I32, SH0, &four);
	y = run2("Gather", NULL, p, ix);
	cr_assert_eq(y->dtype, DG_I64);
	expect_shape(y, SH0);
	expect_vals(y, VALS(4));
	dg_tensor_free(y);
	dg_tensor_free(ix);
	dg_tensor_free(p);
}

Test(array, gather_copies_rows_of_any_dtype_bit_for_bit)
{
	uint16_t h[6] = { 0x3c00, 0x7e00, 0x8000, 0x0001, 0xfc00, 0x3555 };
	uint8_t b[6] = { 1, 0, 0, 1, 1, 1 };
	int32_t i[] = { 2, 0 };
	struct dg_tensor *ix = mk(DG_I32, SH(2), i);
	struct dg_tensor *p = mk(DG_F16, SH(3, 2), h), *y = run2("Gather", NULL, p, ix);
	const uint16_t *t = y->data;

	cr_assert_eq(y->dtype, DG_F16);
	cr_assert(t[0] == 0xfc00 && t[1] == 0x3555 && t[2] == 0x3c00 && t[3] == 0x7e00);
	dg_tensor_free(y);
	dg_tensor_free(p);
	p = mk(DG_BOOL, SH(3, 1, 2), b);
	y = run2("Gather", NULL, p, ix);
	expect_shape(y, SH(2, 1, 2));
	expect_vals(y, VALS(1, 1, 1, 0));
	dg_tensor_free(y);
	dg_tensor_free(p);
	p = iota(DG_U8, SH(3, 0));      /* rows of no bytes */
	y = run2("Gather", NULL, p, ix);
	expect_shape(y, SH(2, 0));
	dg_tensor_free(y);
	dg_tensor_free(p);
	dg_tensor_free(ix);
}

Test(array, gather_with_empty_indices_gives_an_empty_result)
{
	struct dg_tensor *p = iota(DG_F32, SH(4, 3)), *ix = mk(DG_I64, SH(0), NULL);
	struct dg_tensor *y = run2("Gather", NULL, p, ix);

	expect_shape(y, SH(0, 3));
	dg_tensor_free(y);
	dg_tensor_free(ix);
	ix = mk(DG_I32, SH(2, 0), NULL);
	y = run2("Gather", NULL, p, ix);
	expect_shape(y, SH(2, 0, 3));
	dg_tensor_free(y);
	dg_tensor_free(p);
	/* a table of no rows is fine as long as nothing is read from it */
	p = iota(DG_F32, SH(0, 3));
	y = run2("Gather", NULL, p, ix);
	expect_shape(y, SH(2, 0, 3));
	dg_tensor_free(y);
	dg_tensor_free(ix);
	dg_tensor_free(p);
}

Test(array, gather_refuses_an_index_outside_the_rows_naming_value_and_position)
{
	int32_t i2[] = { 0, 1, 4, 2 };
	int64_t neg[] = { 1, -1 }, nine = 9, zero = 0;
	struct dg_tensor *p = iota(DG_F32, SH(4, 3)), *ix = mk(DG_I32, SH(2, 2), i2);

	fails2("Gather", NULL, p, ix, DG_EINVAL,
	       "indices[1,0] = 4 is not in [0, 4): params' row count is 4", "row of params");
	dg_tensor_free(ix);
	ix = mk(DG_I64, SH(2), neg);
	fails2("Gather", NULL, p, ix, DG_EINVAL, "indices[1] = -1 is not in [0, 4)", NULL);
	dg_tensor_free(ix);
	ix = mk(DG_I64, SH0, &nine);
	fails2("Gather", NULL, p, ix, DG_EINVAL, "indices = 9 is not in [0, 4)", NULL);
	dg_tensor_free(ix);
	dg_tensor_free(p);
	p = iota(DG_F32, SH(0, 3));
	ix = mk(DG_I64, SH(1), &zero);
	fails2("Gather", NULL, p, ix, DG_EINVAL, "indices[0] = 0 is not in [0, 0)", NULL);
	dg_tensor_free(ix);
	dg_tensor_free(p);
}

Test(array, gather_refuses_bad_dtypes_ranks_and_axes)
{
	float fi[] = { 0 };
	int32_t i[] = { 0 };
	struct dg_tensor *p = iota(DG_F32, SH(4, 3)), *ix = mk(DG_I32, SH(1), i);
	struct dg_tensor *fx = mk(DG_F32, SH(1), fi), *s = iota(DG_F32, SH0);
	struct dg_tensor *deep = mk(DG_I32, SH(1, 1, 1, 1, 1, 1), i);
	struct dg_tensor *p4 = iota(DG_F32, SH(1, 1, 1, 2));

	fails2("Gather", NULL, p, fx, DG_EDTYPE, "the indices are float32; they must be int32 or "
	       "int64", "Cast");
	fails2("Gather", NULL, s, ix, DG_ESHAPE, "params is a scalar", NULL);
	fails2("Gather", "{\"axis\":1}", p, ix, DG_EINVAL, "attr 'axis' is 1; Gather takes rows "
	       "only (axis 0)", "Transpose");
	fails2("Gather", "{\"axis\":-2}", p, ix, DG_EINVAL, "attr 'axis' is -2", NULL);
	fails2("Gather", "{\"batch_dims\":1}", p, ix, DG_EINVAL, "batch_dims", NULL);
	fails2("Gather", NULL, p4, deep, DG_ESHAPE, "give a result of rank 9; at most 8", NULL);
	dg_tensor_free(p);
	dg_tensor_free(ix);
	dg_tensor_free(fx);
	dg_tensor_free(s);
	dg_tensor_free(deep);
	dg_tensor_free(p4);
}

Test(array, gather_infers_shapes_with_unknown_dims_and_ranks)
{
	struct dg_ttype out, unknown = tt(DG_F32, SH(1));
	struct dg_err err = { 0 };

	unknown.shape.ndim = -1;
	cr_assert_eq(infer2("Gather", NULL, tt(DG_F64, SH(-1, 3)), tt(DG_I64, SH(2, -1)), &out,
			    &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out.dtype, DG_F64);
	expect_tshape(&out, SH(2, -1, 3));
	cr_assert_eq(infer2("Gather", NULL, tt(DG_F32, SH(5, -1)), tt(DG_I32, SH0), &out, &err),
		     DG_OK, "%s", err.msg);
	expect_tshape(&out, SH(-1));
	cr_assert_eq(infer2("Gather", NULL, unknown, tt(DG_I32, SH(2)), &out, &err), DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
	unknown.dtype = DG_I64;
	cr_assert_eq(infer2("Gather", NULL, tt(DG_F32, SH(5, 2)), unknown, &out, &err), DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
	cr_assert_eq(infer2("Gather", NULL, tt(DG_F32, SH(5, 2)), tt(DG_U8, SH(2)), &out, &err),
		     DG_EDTYPE);
	cr_assert_eq(infer2("Gather", NULL, tt(DG_F32, SH0), tt(DG_I32, SH(2)), &out, &err),
		     DG_ESHAPE);
	cr_assert_eq(infer2("Gather", "{\"axis\":1}", tt(DG_F32, SH(5, 2)), tt(DG_I32, SH(2)),
			    &out, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, "axis"), "%s", err.msg);
}

Test(array, unsorted_segment_sum_adds_rows_into_their_segments)
{
	int32_t ids[] = { 2, 0, 2, 0 };
	struct dg_tensor *x = iota(DG_F32, SH(4, 2)), *s = mk(DG_I32, SH(4), ids);
	struct dg_tensor *y = run2("UnsortedSegmentSum", "{\"num_segments\":4}", x, s);

	/* rows [0,1] [2,3] [4,5] [6,7]: segment 0 = rows 1 + 3, 2 = rows 0 + 2, 1 and 3 empty */
	cr_assert_eq(y->dtype, DG_F32);
	expect_shape(y, SH(4, 2));
	expect_vals(y, VALS(8, 10, 0, 0, 4, 6, 0, 0));
	dg_tensor_free(y);
	dg_tensor_free(s);
	dg_tensor_free(x);
}

Test(array, unsorted_segment_sum_takes_2d_int64_ids_and_scalar_ids)
{
	int64_t ids[] = { 1, 1, 0, 1 }, one = 1;
	struct dg_tensor *x = iota(DG_F64, SH(2, 2, 3)), *s = mk(DG_I64, SH(2, 2), ids);
	struct dg_tensor *y = run2("UnsortedSegmentSum", "{\"num_segments\":2}", x, s);

	/* segment 0 = x[1,0]; segment 1 = x[0,0] + x[0,1] + x[1,1] */
	expect_shape(y, SH(2, 3));
	expect_vals(y, VALS(6, 7, 8, 12, 15, 18));
	dg_tensor_free(y);
	dg_tensor_free(s);
	dg_tensor_free(x);
	/* ids of data's whole shape: one element per id */
	x = iota(DG_F64, SH(2, 2));
	s = mk(DG_I64, SH(2, 2), ids);
	y = run2("UnsortedSegmentSum", "{\"num_segments\":3}", x, s);
	expect_shape(y, SH(3));
	expect_vals(y, VALS(2, 4, 0));
	dg_tensor_free(y);
	dg_tensor_free(s);
	dg_tensor_free(x);
	/* a scalar id: the whole of data is one row */
	x = iota(DG_F32, SH(2));
	s = mk(DG_I64, SH0, &one);
	y = run2("UnsortedSegmentSum", "{\"num_segments\":3}", x, s);
	expect_shape(y, SH(3, 2));
	expect_vals(y, VALS(0, 0, 0, 1, 0, 0));
	dg_tensor_free(y);
	dg_tensor_free(s);
	dg_tensor_free(x);
}

Test(array, unsorted_segment_sum_of_integers_wraps_like_twos_complement)
{
	int32_t d32[] = { INT32_MAX, 1, -5 }, ids[] = { 0, 0, 1 };
	int64_t d64[] = { INT64_MAX, 1, 7 };
	struct dg_tensor *s = mk(DG_I32, SH(3), ids);
	struct dg_tensor *x = mk(DG_I32, SH(3), d32);
	struct dg_tensor *y = run2("UnsortedSegmentSum", "{\"num_segments\":2}", x, s);

	cr_assert_eq(y->dtype, DG_I32);
	cr_assert_eq(((int32_t *)y->data)[0], INT32_MIN);
	cr_assert_eq(((int32_t *)y->data)[1], -5);
	dg_tensor_free(y);
	dg_tensor_free(x);
	x = mk(DG_I64, SH(3), d64);
	y = run2("UnsortedSegmentSum", "{\"num_segments\":2}", x, s);
	cr_assert_eq(y->dtype, DG_I64);
	cr_assert_eq(((int64_t *)y->data)[0], INT64_MIN);
	cr_assert_eq(((int64_t *)y->data)[1], 7);
	dg_tensor_free(y);
	dg_tensor_free(x);
	dg_tensor_free(s);
}

Test(array, unsorted_segment_sum_with_no_ids_gives_zeros)
{
	struct dg_tensor *x = iota(DG_F32, SH(0, 3)), *s = mk(DG_I32, SH(0), NULL);
	struct dg_tensor *y = run2("UnsortedSegmentSum", "{\"num_segments\":2}", x, s);

	expect_shape(y, SH(2, 3));
	expect_vals(y, VALS(0, 0, 0, 0, 0, 0));
	dg_tensor_free(y);
	y = run2("UnsortedSegmentSum", "{\"num_segments\":0}", x, s);
	expect_shape(y, SH(0, 3));
	dg_tensor_free(y);
	dg_tensor_free(s);
	dg_tensor_free(x);
}

Test(array, unsorted_segment_sum_refuses_ids_outside_the_segments)
{
	int32_t neg[] = { 0, -1, 2 }, big[] = { 0, 1, 3 };
	int64_t zero = 0;
	struct dg_tensor *x = iota(DG_F32, SH(3, 2)), *s = mk(DG_I32, SH(3), neg);
	const char *a = "{\"num_segments\":3}";

	/* TensorFlow would drop row 1; a dropped row is a lost gradient */
	fails2("UnsortedSegmentSum", a, x, s, DG_EINVAL,
	       "segment_ids[1] = -1 is not in [0, 3): num_segments is 3", "TensorFlow drops");
	dg_tensor_free(s);
	s = mk(DG_I32, SH(3), big);
	fails2("UnsortedSegmentSum", a, x, s, DG_EINVAL, "segment_ids[2] = 3 is not in [0, 3)",
	       "raise num_segments");
	dg_tensor_free(s);
	dg_tensor_free(x);
	x = iota(DG_F32, SH(1));
	s = mk(DG_I64, SH(1), &zero);
	fails2("UnsortedSegmentSum", "{\"num_segments\":0}", x, s, DG_EINVAL,
	       "segment_ids[0] = 0 is not in [0, 0)", NULL);
	dg_tensor_free(s);
	dg_tensor_free(x);
}

Test(array, unsorted_segment_sum_refuses_bad_shapes_dtypes_and_attrs)
{
	int32_t ids[] = { 0, 0, 0 };
	float fids[] = { 0, 0, 0 };
	struct dg_tensor *x = iota(DG_F32, SH(3, 2)), *s = mk(DG_I32, SH(3), ids);
	struct dg_tensor *s2 = mk(DG_I32, SH(2), ids), *s3 = mk(DG_I32, SH(3, 2, 1), NULL);
	struct dg_tensor *fs = mk(DG_F32, SH(3), fids), *b = iota(DG_BOOL, SH(3, 2));
	struct dg_tensor *x8 = iota(DG_F32, SH(1, 1, 1, 1, 1, 1, 1, 2)), *s0 = mk(DG_I32, SH0, ids);
	const char *a = "{\"num_segments\":2}";

	fails2("UnsortedSegmentSum", a, x, s2, DG_ESHAPE,
	       "segment_ids [2] is not a prefix of data's shape [3,2]", "one id per row");
	fails2("UnsortedSegmentSum", a, x, s3, DG_ESHAPE, "segment_ids [3,2,1] is not a prefix",
	       NULL);
	fails2("UnsortedSegmentSum", a, x, fs, DG_EDTYPE, "the segment_ids are float32", "Cast");
	fails2("UnsortedSegmentSum", a, b, s, DG_EDTYPE, "data is bool; UnsortedSegmentSum adds "
	       "float32, float64, int32 or int64", NULL);
	fails2("UnsortedSegmentSum", a, x8, s0, DG_ESHAPE, "at most 8 dims", NULL);
	fails2("UnsortedSegmentSum", NULL, x, s, DG_EINVAL, "missing required attr "
	       "'num_segments'", NULL);
	fails2("UnsortedSegmentSum", "{\"num_segments\":-1}", x, s, DG_EINVAL,
	       "attr 'num_segments' must be in 0..2^48, got -1", NULL);
	fails2("UnsortedSegmentSum", "{\"num_segments\":1.5}", x, s, DG_EINVAL, "num_segments",
	       NULL);
	dg_tensor_free(x);
	dg_tensor_free(s);
	dg_tensor_free(s2);
	dg_tensor_free(s3);
	dg_tensor_free(fs);
	dg_tensor_free(b);
	dg_tensor_free(x8);
	dg_tensor_free(s0);
}

Test(array, unsorted_segment_sum_infers_shapes_with_unknown_dims_and_ranks)
{
	struct dg_ttype out, unknown = tt(DG_I32, SH(1));
	struct dg_err err = { 0 };
	const char *a = "{\"num_segments\":5}";

	unknown.shape.ndim = -1;
	cr_assert_eq(infer2("UnsortedSegmentSum", a, tt(DG_F64, SH(-1, 4)), tt(DG_I64, SH(-1)),
			    &out, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out.dtype, DG_F64);
	expect_tshape(&out, SH(5, 4));
	cr_assert_eq(infer2("UnsortedSegmentSum", a, tt(DG_F32, SH(2, -1, 3)), tt(DG_I32, SH(2, 7)),
			    &out, &err), DG_OK, "%s", err.msg);
	expect_tshape(&out, SH(5, 3));
	cr_assert_eq(infer2("UnsortedSegmentSum", a, tt(DG_F32, SH(2, 3)), unknown, &out, &err),
		     DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
	unknown.dtype = DG_F32;
	cr_assert_eq(infer2("UnsortedSegmentSum", a, unknown, tt(DG_I32, SH(2)), &out, &err),
		     DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
	cr_assert_eq(infer2("UnsortedSegmentSum", a, tt(DG_F32, SH(2, 3)), tt(DG_I32, SH(3)),
			    &out, &err), DG_ESHAPE);
	cr_assert_eq(infer2("UnsortedSegmentSum", NULL, tt(DG_F32, SH(2, 3)), tt(DG_I32, SH(2)),
			    &out, &err), DG_EINVAL);
	cr_assert_eq(infer2("UnsortedSegmentSum", a, tt(DG_U8, SH(2, 3)), tt(DG_I32, SH(2)),
			    &out, &err), DG_EDTYPE);
}

/* The gradient pair: UnsortedSegmentSum(Gather(p, i), i) adds each picked row
 * once per time it was picked, so row r is p[r] times its count in i. */
Test(array, segment_sum_of_a_gather_scales_rows_by_their_counts)
{
	int32_t i[] = { 1, 3, 1, 1 };
	struct dg_tensor *p = iota(DG_F32, SH(4, 2)), *ix = mk(DG_I32, SH(2, 2), i);
	struct dg_tensor *g = run2("Gather", NULL, p, ix);
	struct dg_tensor *y = run2("UnsortedSegmentSum", "{\"num_segments\":4}", g, ix);

	expect_shape(y, SH(4, 2));
	expect_vals(y, VALS(0, 0, 6, 9, 0, 0, 6, 7));
	dg_tensor_free(y);
	dg_tensor_free(g);
	dg_tensor_free(ix);
	dg_tensor_free(p);
}
