/* The elementwise kernel family (kernels/cpu/eltwise.c) through the registry:
 * every op on every supported dtype against hand-computed values, broadcasting
 * (fast paths and the general N-d iterator against an index-arithmetic
 * reference), IEEE and integer edge cases, Cast's 6x6 table, and inference. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/kernels.h"

/* ------------------------------------------------------------------------ */
/* Helpers: build tensors, run an op, check results                         */

static struct dg_shape shp(const char *s)
{
	struct dg_shape out;
	struct dg_err err = { 0 };

	cr_assert_eq(dg_shape_parse(s, &out, &err), DG_OK, "shape '%s': %s", s, err.msg);
	return out;
}

/* A tensor of dtype dt and shape s holding raw elements copied from data. */
static struct dg_tensor *raw(enum dg_dtype dt, const char *s, const void *data)
{
	struct dg_shape sh = shp(s);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_from_data(dt, &sh, data, &err);

	cr_assert_not_null(t, "%s", err.msg);
	return t;
}

/* A tensor of dtype dt whose elements are v converted (values must fit dt). */
static struct dg_tensor *vals(enum dg_dtype dt, const char *s, const double *v)
{
	struct dg_shape sh = shp(s);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_new(dt, &sh, &err);

	cr_assert_not_null(t, "%s", err.msg);
	for (int64_t i = 0; i < t->numel; i++)
		dg_tensor_set_f64(t, i, v[i]);
	return t;
}

static struct dg_tensor *scalar(enum dg_dtype dt, double v)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_scalar(dt, v, &err);

	cr_assert_not_null(t, "%s", err.msg);
	return t;
}

/* Run op on n inputs (taking ownership of them) with attrs JSON text or NULL. */
static enum dg_status runv(const char *name, const char *attrs, int n, struct dg_tensor **in,
			   struct dg_tensor **out, struct dg_err *err)
{
	const struct dg_op_def *op = dg_op_find(name);
	json_t *a = NULL;
	enum dg_status st;

	cr_assert_not_null(op, "op %s is not registered", name);
	if (attrs) {
		a = json_loads(attrs, 0, NULL);
		cr_assert_not_null(a, "bad attrs JSON %s", attrs);
	}
	st = dg_op_run(op, a, (const struct dg_tensor *const *)in, n, out, 1, 0, err);
	json_decref(a);
	for (int i = 0; i < n; i++)
		dg_tensor_free(in[i]);
	return st;
}

static struct dg_tensor *okv(const char *name, const char *attrs, int n, struct dg_tensor **in)
{
	struct dg_err err = { 0 };
	struct dg_tensor *out = NULL;
	enum dg_status st = runv(name, attrs, n, in, &out, &err);

	cr_assert_eq(st, DG_OK, "%s failed: %s (%s)", name, err.msg, err.hint);
	cr_assert_not_null(out);
	return out;
}

static enum dg_status failv(const char *name, const char *attrs, int n, struct dg_tensor **in,
			    struct dg_err *err)
{
	struct dg_tensor *out = NULL;
	enum dg_status st = runv(name, attrs, n, in, &out, err);

	cr_assert_neq(st, DG_OK, "%s unexpectedly succeeded", name);
	cr_assert_null(out, "%s left an output behind on error", name);
	cr_assert_eq(err->code, st);
	return st;
}

#define NT(...) ((int)(sizeof((struct dg_tensor *[]){ __VA_ARGS__ }) / sizeof(struct dg_tensor *)))
#define TS(...) ((struct dg_tensor *[]){ __VA_ARGS__ })
/* OK(op, attrs, inputs...) -> output; FAIL(op, attrs, &err, inputs...) -> status. The
 * input list sits in sizeof (not evaluated) once and in the call once. */
#define OK(name, attrs, ...) okv(name, attrs, NT(__VA_ARGS__), TS(__VA_ARGS__))
#define FAIL(name, attrs, err, ...) failv(name, attrs, NT(__VA_ARGS__), TS(__VA_ARGS__), err)

static double tol(enum dg_dtype dt)
{
	return dt == DG_F32 ? 1e-6 : dt == DG_F64 ? 1e-13 : 0;
}

/* Check dtype, shape and elements (NaN matches NaN; floats within a relative
 * tolerance; everything else exactly), then free t. */
static void expect(struct dg_tensor *t, enum dg_dtype dt, const char *s, const double *v)
{
	struct dg_shape sh = shp(s);
	char got[128], want[128];

	cr_assert_eq(t->dtype, dt, "dtype %s, expected %s", dg_dtype_name(t->dtype),
		     dg_dtype_name(dt));
	dg_shape_format(&t->shape, got, sizeof got);
	dg_shape_format(&sh, want, sizeof want);
	cr_assert(dg_shape_eq(&t->shape, &sh), "shape %s, expected %s", got, want);
	for (int64_t i = 0; i < t->numel; i++) {
		double x = dg_tensor_get_f64(t, i);
		if (isnan(v[i])) {
			cr_assert(isnan(x), "[%lld] = %.17g, expected nan", (long long)i, x);
		} else if (x != v[i]) {
			double d = fabs(x - v[i]), m = fabs(v[i]) > 1 ? fabs(v[i]) : 1;
			cr_assert(d <= tol(dt) * m, "%s [%lld] = %.17g, expected %.17g",
				  dg_dtype_name(dt), (long long)i, x, v[i]);
		}
	}
	dg_tensor_free(t);
}

static void expect_i64(struct dg_tensor *t, const char *s, const int64_t *v)
{
	struct dg_shape sh = shp(s);

	cr_assert_eq(t->dtype, DG_I64);
	cr_assert(dg_shape_eq(&t->shape, &sh));
	for (int64_t i = 0; i < t->numel; i++)
		cr_assert_eq(((int64_t *)t->data)[i], v[i], "[%lld] = %lld, expected %lld",
			     (long long)i, (long long)((int64_t *)t->data)[i], (long long)v[i]);
	dg_tensor_free(t);
}

static void expect_i32(struct dg_tensor *t, const char *s, const int32_t *v)
{
	struct dg_shape sh = shp(s);

	cr_assert_eq(t->dtype, DG_I32);
	cr_assert(dg_shape_eq(&t->shape, &sh));
	for (int64_t i = 0; i < t->numel; i++)
		cr_assert_eq(((int32_t *)t->data)[i], v[i], "[%lld] = %d, expected %d",
			     (long long)i, ((int32_t *)t->data)[i], v[i]);
	dg_tensor_free(t);
}

static void expect_msg(const struct dg_err *err, const char *part)
{
	cr_assert(strstr(err->msg, part), "message '%s' lacks '%s'", err->msg, part);
}

static void expect_hint(const struct dg_err *err, const char *part)
{
	cr_assert(strstr(err->hint, part), "hint '%s' lacks '%s'", err->hint, part);
}

/* Flat index into a right-aligned broadcast input for output element i: the
 * textbook definition, independent of the kernel's collapsed iterator. */
static int64_t bidx(const struct dg_shape *in, const struct dg_shape *out, int64_t i)
{
	int64_t r = 0, stride = 1;

	for (int d = out->ndim - 1; d >= 0; d--) {
		int64_t c = i % out->dim[d];
		int j = d - (out->ndim - in->ndim);
		i /= out->dim[d];
		if (j >= 0) {
			if (in->dim[j] != 1)
				r += c * stride;
			stride *= in->dim[j];
		}
	}
	return r;
}

/* Deterministic values in [-10, 10). */
static double lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return (double)(*s >> 8) / (double)(1u << 24) * 20.0 - 10.0;
}

static struct dg_tensor *random_t(enum dg_dtype dt, const char *s, uint32_t seed)
{
	struct dg_shape sh = shp(s);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_new(dt, &sh, &err);

	cr_assert_not_null(t, "%s", err.msg);
	for (int64_t i = 0; i < t->numel; i++)
		dg_tensor_set_f64(t, i, dt == DG_F32 || dt == DG_F64 ? lcg(&seed)
								     : floor(lcg(&seed) * 100));
	return t;
}

static const enum dg_dtype signed_dts[] = { DG_F32, DG_F64, DG_I32, DG_I64 };
static const enum dg_dtype numeric_dts[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_U8 };
static const enum dg_dtype all_dts[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_U8, DG_BOOL };
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------------------ */
/* Registry entries                                                            */

Test(eltwise, every_elementwise_op_is_registered_with_one_output)
{
	static const char *const names[] = {
		"Neg", "Abs", "Square", "Sqrt", "Exp", "Log", "Relu", "Sigmoid", "Tanh", "Add",
		"Sub", "Mul", "Div", "Pow", "Maximum", "Minimum", "Equal", "NotEqual", "Less",
		"LessEqual", "Greater", "GreaterEqual", "Where", "Cast",
	};

	for (size_t i = 0; i < N_OF(names); i++) {
		const struct dg_op_def *op = dg_op_find(names[i]);
		cr_assert_not_null(op, "%s missing", names[i]);
		cr_assert_eq(op->n_outputs, 1, "%s", names[i]);
		cr_assert_not_null(op->infer);
		cr_assert_not_null(op->cpu);
		cr_assert(op->doc && op->doc[0]);
	}
}

Test(eltwise, unknown_attrs_are_refused)
{
	struct dg_err err = { 0 };
	double one = 1;

	cr_assert_eq(FAIL("Add", "{\"alpha\": 1}", &err, vals(DG_F32, "[]", &one),
			  vals(DG_F32, "[]", &one)), DG_EINVAL);
	expect_msg(&err, "alpha");
}

/* ------------------------------------------------------------------------ */
/* Unary ops                                                                   */

Test(eltwise, neg_abs_square_relu_match_hand_values_on_every_signed_dtype)
{
	static const double x[] = { -3, 0, 4, -1, 7, -12 };
	static const double neg[] = { 3, 0, -4, 1, -7, 12 };
	static const double abs_[] = { 3, 0, 4, 1, 7, 12 };
	static const double sq[] = { 9, 0, 16, 1, 49, 144 };
	static const double relu[] = { 0, 0, 4, 0, 7, 0 };

	for (size_t d = 0; d < N_OF(signed_dts); d++) {
		enum dg_dtype dt = signed_dts[d];
		expect(OK("Neg", NULL, vals(dt, "2,3", x)), dt, "2,3", neg);
		expect(OK("Abs", NULL, vals(dt, "2,3", x)), dt, "2,3", abs_);
		expect(OK("Square", NULL, vals(dt, "2,3", x)), dt, "2,3", sq);
		expect(OK("Relu", NULL, vals(dt, "2,3", x)), dt, "2,3", relu);
	}
}

Test(eltwise, float_unary_ops_keep_fractions_infinities_and_nan)
{
	const double x[] = { -1.5, 2.5, -INFINITY, NAN };

	for (int f = 0; f < 2; f++) {
		enum dg_dtype dt = f ? DG_F64 : DG_F32;
		expect(OK("Neg", NULL, vals(dt, "4", x)), dt, "4",
		       (double[]){ 1.5, -2.5, INFINITY, NAN });
		expect(OK("Abs", NULL, vals(dt, "4", x)), dt, "4",
		       (double[]){ 1.5, 2.5, INFINITY, NAN });
		expect(OK("Square", NULL, vals(dt, "4", x)), dt, "4",
		       (double[]){ 2.25, 6.25, INFINITY, NAN });
		expect(OK("Relu", NULL, vals(dt, "4", x)), dt, "4",
		       (double[]){ 0, 2.5, 0, NAN });
	}
}

Test(eltwise, signed_integer_unary_ops_wrap_like_tensorflow)
{
	const int32_t x32[] = { INT32_MIN, 65536, 46341, INT32_MAX };
	const int64_t x64[] = { INT64_MIN, (int64_t)1 << 32, 3037000500, INT64_MAX };

	expect_i32(OK("Neg", NULL, raw(DG_I32, "4", x32)), "4",
		   (int32_t[]){ INT32_MIN, -65536, -46341, -INT32_MAX });
	expect_i32(OK("Abs", NULL, raw(DG_I32, "4", x32)), "4",
		   (int32_t[]){ INT32_MIN, 65536, 46341, INT32_MAX });
	expect_i32(OK("Square", NULL, raw(DG_I32, "4", x32)), "4",
		   (int32_t[]){ 0, 0, -2147479015, 1 });
	expect_i64(OK("Neg", NULL, raw(DG_I64, "4", x64)), "4",
		   (int64_t[]){ INT64_MIN, -((int64_t)1 << 32), -3037000500, -INT64_MAX });
	expect_i64(OK("Abs", NULL, raw(DG_I64, "4", x64)), "4",
		   (int64_t[]){ INT64_MIN, (int64_t)1 << 32, 3037000500, INT64_MAX });
	expect_i64(OK("Square", NULL, raw(DG_I64, "4", x64)), "4",
		   (int64_t[]){ 0, 0, -9223372036709301616, 1 });
}

Test(eltwise, sqrt_exp_log_tanh_follow_ieee_on_both_float_dtypes)
{
	for (int f = 0; f < 2; f++) {
		enum dg_dtype dt = f ? DG_F64 : DG_F32;
		expect(OK("Sqrt", NULL, vals(dt, "5", (double[]){ 4, 2, 0, -1, INFINITY })), dt,
		       "5", (double[]){ 2, 1.4142135623730951, 0, NAN, INFINITY });
		expect(OK("Exp", NULL, vals(dt, "5", (double[]){ 0, 1, -INFINITY, NAN, -1 })),
		       dt, "5", (double[]){ 1, 2.718281828459045, 0, NAN, 0.36787944117144233 });
		expect(OK("Log", NULL, vals(dt, "5", (double[]){ 1, M_E, 0, -1, 10 })), dt, "5",
		       (double[]){ 0, 1, -INFINITY, NAN, 2.302585092994046 });
		expect(OK("Tanh", NULL, vals(dt, "5", (double[]){ 0, 1, -20, 20, NAN })), dt, "5",
		       (double[]){ 0, 0.7615941559557649, -1, 1, NAN });
	}
}

Test(eltwise, sigmoid_is_exact_and_stable_for_large_magnitudes)
{
	const double x[] = { 0, 2, -2, 100, -100, 1000, -1000, NAN };
	struct dg_tensor *t;

	expect(OK("Sigmoid", NULL, vals(DG_F64, "8", x)), DG_F64, "8",
	       (double[]){ 0.5, 0.8807970779778823, 0.11920292202211755, 1,
			   3.720075976020836e-44, 1, 0, NAN });
	/* float32: e^-100 is subnormal there, so only its size is checked. */
	t = OK("Sigmoid", NULL, vals(DG_F32, "8", x));
	const float *y = t->data;
	cr_assert_float_eq(y[0], 0.5f, 1e-7);
	cr_assert_float_eq(y[1], 0.880797f, 1e-6);
	cr_assert_float_eq(y[2], 0.119203f, 1e-6);
	cr_assert_eq(y[3], 1.0f);
	cr_assert(y[4] > 0 && y[4] < 1e-40f, "sigmoid(-100) = %g", y[4]);
	cr_assert_eq(y[5], 1.0f);
	cr_assert_eq(y[6], 0.0f);
	cr_assert(isnan(y[7]));
	dg_tensor_free(t);
}

Test(eltwise, unary_ops_refuse_unsupported_dtypes)
{
	struct dg_err err = { 0 };

	cr_assert_eq(FAIL("Sqrt", NULL, &err, scalar(DG_I32, 4)), DG_EDTYPE);
	expect_msg(&err, "Sqrt is not defined for int32");
	expect_hint(&err, "Cast to float32 first");
	cr_assert_eq(FAIL("Log", NULL, &err, scalar(DG_I64, 4)), DG_EDTYPE);
	cr_assert_eq(FAIL("Exp", NULL, &err, scalar(DG_BOOL, 1)), DG_EDTYPE);
	cr_assert_eq(FAIL("Sigmoid", NULL, &err, scalar(DG_U8, 1)), DG_EDTYPE);
	cr_assert_eq(FAIL("Tanh", NULL, &err, scalar(DG_I32, 1)), DG_EDTYPE);
	cr_assert_eq(FAIL("Neg", NULL, &err, scalar(DG_BOOL, 1)), DG_EDTYPE);
	expect_msg(&err, "bool");
	cr_assert_eq(FAIL("Abs", NULL, &err, scalar(DG_U8, 1)), DG_EDTYPE);
	cr_assert_eq(FAIL("Relu", NULL, &err, scalar(DG_U8, 1)), DG_EDTYPE);
	cr_assert_eq(FAIL("Square", NULL, &err, scalar(DG_BOOL, 1)), DG_EDTYPE);
}

Test(eltwise, unary_ops_on_empty_tensors_give_empty_outputs)
{
	struct dg_tensor *t = OK("Exp", NULL, raw(DG_F32, "0,4", NULL));

	expect(t, DG_F32, "0,4", NULL);
	t = OK("Neg", NULL, raw(DG_I64, "3,0", NULL));
	expect(t, DG_I64, "3,0", NULL);
}

/* ------------------------------------------------------------------------ */
/* Binary arithmetic                                                           */

Test(eltwise, binary_arithmetic_matches_hand_values_on_every_numeric_dtype)
{
	static const double a[] = { 6, 7, 2, 9, 0, 3 };
	static const double b[] = { 3, 2, 2, 1, 5, 3 };

	for (size_t d = 0; d < N_OF(numeric_dts); d++) {
		enum dg_dtype dt = numeric_dts[d];
		bool fl = dt == DG_F32 || dt == DG_F64;
		expect(OK("Add", NULL, vals(dt, "2,3", a), vals(dt, "2,3", b)), dt, "2,3",
		       (double[]){ 9, 9, 4, 10, 5, 6 });
		expect(OK("Sub", NULL, vals(dt, "2,3", a), vals(dt, "2,3", b)), dt, "2,3",
		       (double[]){ 3, 5, 0, 8, dt == DG_U8 ? 251 : -5, 0 });
		expect(OK("Mul", NULL, vals(dt, "2,3", a), vals(dt, "2,3", b)), dt, "2,3",
		       (double[]){ 18, 14, 4, 9, 0, 9 });
		expect(OK("Div", NULL, vals(dt, "2,3", a), vals(dt, "2,3", b)), dt, "2,3",
		       (double[]){ 2, fl ? 3.5 : 3, 1, 9, 0, 1 });
		expect(OK("Pow", NULL, vals(dt, "2,3", a), vals(dt, "2,3", b)), dt, "2,3",
		       (double[]){ 216, 49, 4, 9, 0, 27 });
		expect(OK("Maximum", NULL, vals(dt, "2,3", a), vals(dt, "2,3", b)), dt, "2,3",
		       (double[]){ 6, 7, 2, 9, 5, 3 });
		expect(OK("Minimum", NULL, vals(dt, "2,3", a), vals(dt, "2,3", b)), dt, "2,3",
		       (double[]){ 3, 2, 2, 1, 0, 3 });
	}
}

Test(eltwise, integer_div_truncates_toward_zero)
{
	const double a[] = { -7, 7, -7, 7, -1, 0 };
	const double b[] = { 2, -2, -2, 2, 3, -4 };

	for (int w = 0; w < 2; w++) {
		enum dg_dtype dt = w ? DG_I64 : DG_I32;
		expect(OK("Div", NULL, vals(dt, "6", a), vals(dt, "6", b)), dt, "6",
		       (double[]){ -3, -3, 3, 3, 0, 0 });
	}
	expect(OK("Div", NULL, vals(DG_U8, "3", (double[]){ 255, 7, 1 }),
		  vals(DG_U8, "3", (double[]){ 16, 7, 2 })), DG_U8, "3", (double[]){ 15, 1, 0 });
}

Test(eltwise, float_div_follows_ieee)
{
	for (int f = 0; f < 2; f++) {
		enum dg_dtype dt = f ? DG_F64 : DG_F32;
		expect(OK("Div", NULL, vals(dt, "5", (double[]){ 1, -1, 0, 6, INFINITY }),
			  vals(dt, "5", (double[]){ 0, 0, 0, 4, INFINITY })),
		       dt, "5", (double[]){ INFINITY, -INFINITY, NAN, 1.5, NAN });
	}
}

Test(eltwise, integer_add_sub_mul_wrap_around)
{
	expect_i32(OK("Add", NULL, raw(DG_I32, "2", (int32_t[]){ INT32_MAX, INT32_MIN }),
		      raw(DG_I32, "2", (int32_t[]){ 1, -1 })),
		   "2", (int32_t[]){ INT32_MIN, INT32_MAX });
	expect_i32(OK("Sub", NULL, raw(DG_I32, "2", (int32_t[]){ INT32_MIN, INT32_MAX }),
		      raw(DG_I32, "2", (int32_t[]){ 1, -1 })),
		   "2", (int32_t[]){ INT32_MAX, INT32_MIN });
	expect_i32(OK("Mul", NULL, raw(DG_I32, "2", (int32_t[]){ 65536, INT32_MIN }),
		      raw(DG_I32, "2", (int32_t[]){ 65536, -1 })),
		   "2", (int32_t[]){ 0, INT32_MIN });
	expect_i64(OK("Add", NULL, raw(DG_I64, "2", (int64_t[]){ INT64_MAX, INT64_MIN }),
		      raw(DG_I64, "2", (int64_t[]){ 1, -1 })),
		   "2", (int64_t[]){ INT64_MIN, INT64_MAX });
	expect_i64(OK("Sub", NULL, raw(DG_I64, "1", (int64_t[]){ INT64_MIN }),
		      raw(DG_I64, "1", (int64_t[]){ 1 })),
		   "1", (int64_t[]){ INT64_MAX });
	expect_i64(OK("Mul", NULL, raw(DG_I64, "2", (int64_t[]){ (int64_t)1 << 32, INT64_MIN }),
		      raw(DG_I64, "2", (int64_t[]){ (int64_t)1 << 32, -1 })),
		   "2", (int64_t[]){ 0, INT64_MIN });
	expect(OK("Add", NULL, vals(DG_U8, "1", (double[]){ 200 }),
		  vals(DG_U8, "1", (double[]){ 100 })), DG_U8, "1", (double[]){ 44 });
	expect(OK("Sub", NULL, vals(DG_U8, "1", (double[]){ 3 }),
		  vals(DG_U8, "1", (double[]){ 5 })), DG_U8, "1", (double[]){ 254 });
	expect(OK("Mul", NULL, vals(DG_U8, "1", (double[]){ 16 }),
		  vals(DG_U8, "1", (double[]){ 17 })), DG_U8, "1", (double[]){ 16 });
}

Test(eltwise, integer_division_by_zero_is_an_error)
{
	struct dg_err err = { 0 };

	cr_assert_eq(FAIL("Div", NULL, &err, vals(DG_I32, "3", (double[]){ 1, 2, 3 }),
			  vals(DG_I32, "3", (double[]){ 1, 0, 1 })), DG_EINVAL);
	expect_msg(&err, "integer division by zero in Div");
	cr_assert_eq(FAIL("Div", NULL, &err, vals(DG_I64, "2", (double[]){ 1, 2 }),
			  vals(DG_I64, "2", (double[]){ 0, 1 })), DG_EINVAL);
	expect_msg(&err, "int64");
	cr_assert_eq(FAIL("Div", NULL, &err, vals(DG_U8, "2", (double[]){ 1, 2 }),
			  scalar(DG_U8, 0)), DG_EINVAL);
	expect_msg(&err, "division by zero");
	/* the broadcast path finds it too, in the middle of a row */
	cr_assert_eq(FAIL("Div", NULL, &err, vals(DG_I32, "2,1", (double[]){ 4, 5 }),
			  vals(DG_I32, "3", (double[]){ 1, 0, 2 })), DG_EINVAL);
	expect_msg(&err, "division by zero");
}

Test(eltwise, integer_min_divided_by_minus_one_is_an_error)
{
	struct dg_err err = { 0 };

	cr_assert_eq(FAIL("Div", NULL, &err, raw(DG_I32, "2", (int32_t[]){ 4, INT32_MIN }),
			  raw(DG_I32, "2", (int32_t[]){ 2, -1 })), DG_EINVAL);
	expect_msg(&err, "overflow in Div");
	cr_assert_eq(FAIL("Div", NULL, &err, raw(DG_I64, "1", (int64_t[]){ INT64_MIN }),
			  scalar(DG_I64, -1)), DG_EINVAL);
	expect_msg(&err, "int64");
	/* the same values one step away are fine */
	expect_i32(OK("Div", NULL, raw(DG_I32, "2", (int32_t[]){ INT32_MIN, INT32_MIN + 1 }),
		      raw(DG_I32, "2", (int32_t[]){ 1, -1 })),
		   "2", (int32_t[]){ INT32_MIN, INT32_MAX });
}

Test(eltwise, integer_pow_squares_exactly_and_wraps)
{
	expect_i32(OK("Pow", NULL, raw(DG_I32, "6", (int32_t[]){ 2, -2, 0, 3, 2, -1 }),
		      raw(DG_I32, "6", (int32_t[]){ 10, 3, 0, 4, 31, 5 })),
		   "6", (int32_t[]){ 1024, -8, 1, 81, INT32_MIN, -1 });
	expect_i64(OK("Pow", NULL, raw(DG_I64, "3", (int64_t[]){ 3, 2, -3 }),
		      raw(DG_I64, "3", (int64_t[]){ 40, 62, 3 })),
		   "3", (int64_t[]){ -6289078614652622815, (int64_t)1 << 62, -27 });
	expect(OK("Pow", NULL, vals(DG_U8, "3", (double[]){ 2, 3, 255 }),
		  vals(DG_U8, "3", (double[]){ 8, 5, 2 })), DG_U8, "3", (double[]){ 0, 243, 1 });
}

Test(eltwise, integer_pow_with_a_negative_exponent_is_an_error)
{
	struct dg_err err = { 0 };

	cr_assert_eq(FAIL("Pow", NULL, &err, vals(DG_I32, "2", (double[]){ 2, 2 }),
			  vals(DG_I32, "2", (double[]){ 1, -1 })), DG_EINVAL);
	expect_msg(&err, "negative exponent");
	expect_msg(&err, "Pow");
	cr_assert_eq(FAIL("Pow", NULL, &err, scalar(DG_I64, 1),
			  vals(DG_I64, "2", (double[]){ 3, -2 })), DG_EINVAL);
	expect_hint(&err, "Cast");
}

Test(eltwise, float_pow_matches_libm)
{
	for (int f = 0; f < 2; f++) {
		enum dg_dtype dt = f ? DG_F64 : DG_F32;
		expect(OK("Pow", NULL, vals(dt, "6", (double[]){ 2, -8, 0, 4, 1, NAN }),
			  vals(dt, "6", (double[]){ 0.5, 1.0 / 3, -1, 0.5, NAN, 0 })),
		       dt, "6", (double[]){ 1.4142135623730951, NAN, INFINITY, 2, 1, 1 });
	}
}

Test(eltwise, nan_and_inf_propagate_through_binary_ops)
{
	for (int f = 0; f < 2; f++) {
		enum dg_dtype dt = f ? DG_F64 : DG_F32;
		const double a[] = { NAN, 1, INFINITY, -INFINITY, NAN };
		const double b[] = { 1, NAN, 1, 1, NAN };
		expect(OK("Add", NULL, vals(dt, "5", a), vals(dt, "5", b)), dt, "5",
		       (double[]){ NAN, NAN, INFINITY, -INFINITY, NAN });
		expect(OK("Maximum", NULL, vals(dt, "5", a), vals(dt, "5", b)), dt, "5",
		       (double[]){ NAN, NAN, INFINITY, 1, NAN });
		expect(OK("Minimum", NULL, vals(dt, "5", a), vals(dt, "5", b)), dt, "5",
		       (double[]){ NAN, NAN, 1, -INFINITY, NAN });
		expect(OK("Sub", NULL, vals(dt, "1", (double[]){ INFINITY }),
			  vals(dt, "1", (double[]){ INFINITY })), dt, "1", (double[]){ NAN });
		expect(OK("Mul", NULL, vals(dt, "1", (double[]){ INFINITY }), scalar(dt, 0)), dt,
		       "1", (double[]){ NAN });
		/* a scalar NaN on either side reaches every element (vs and sv loops) */
		expect(OK("Maximum", NULL, vals(dt, "3", (double[]){ 1, 2, 3 }), scalar(dt, NAN)),
		       dt, "3", (double[]){ NAN, NAN, NAN });
		expect(OK("Minimum", NULL, scalar(dt, NAN), vals(dt, "3", (double[]){ 1, 2, 3 })),
		       dt, "3", (double[]){ NAN, NAN, NAN });
	}
}

Test(eltwise, binary_ops_refuse_bool_and_mixed_dtypes)
{
	struct dg_err err = { 0 };

	cr_assert_eq(FAIL("Add", NULL, &err, scalar(DG_BOOL, 1), scalar(DG_BOOL, 0)), DG_EDTYPE);
	expect_msg(&err, "Add is not defined for bool");
	cr_assert_eq(FAIL("Mul", NULL, &err, scalar(DG_BOOL, 1), scalar(DG_BOOL, 0)), DG_EDTYPE);
	cr_assert_eq(FAIL("Maximum", NULL, &err, scalar(DG_BOOL, 1), scalar(DG_BOOL, 0)),
		     DG_EDTYPE);
	cr_assert_eq(FAIL("Add", NULL, &err, scalar(DG_F32, 1), scalar(DG_I32, 1)), DG_EDTYPE);
	expect_msg(&err, "dtypes float32 and int32 differ");
	expect_hint(&err, "insert a Cast node");
	cr_assert_eq(FAIL("Less", NULL, &err, scalar(DG_I64, 1), scalar(DG_I32, 1)), DG_EDTYPE);
	expect_msg(&err, "dtypes int64 and int32 differ");
}

/* ------------------------------------------------------------------------ */
/* Broadcasting                                                                */

Test(eltwise, broadcast_matrix_with_row)
{
	expect(OK("Add", NULL, vals(DG_F32, "2,3", (double[]){ 1, 2, 3, 4, 5, 6 }),
		  vals(DG_F32, "3", (double[]){ 10, 20, 30 })),
	       DG_F32, "2,3", (double[]){ 11, 22, 33, 14, 25, 36 });
	expect(OK("Sub", NULL, vals(DG_I32, "3", (double[]){ 10, 20, 30 }),
		  vals(DG_I32, "2,3", (double[]){ 1, 2, 3, 4, 5, 6 })),
	       DG_I32, "2,3", (double[]){ 9, 18, 27, 6, 15, 24 });
}

Test(eltwise, broadcast_column_with_row_gives_outer_result_in_operand_order)
{
	expect(OK("Add", NULL, vals(DG_F64, "2,1", (double[]){ 1, 2 }),
		  vals(DG_F64, "1,3", (double[]){ 10, 20, 30 })),
	       DG_F64, "2,3", (double[]){ 11, 21, 31, 12, 22, 32 });
	expect(OK("Sub", NULL, vals(DG_I64, "2,1", (double[]){ 1, 2 }),
		  vals(DG_I64, "1,3", (double[]){ 10, 20, 30 })),
	       DG_I64, "2,3", (double[]){ -9, -19, -29, -8, -18, -28 });
	expect(OK("Sub", NULL, vals(DG_I64, "1,3", (double[]){ 10, 20, 30 }),
		  vals(DG_I64, "2,1", (double[]){ 1, 2 })),
	       DG_I64, "2,3", (double[]){ 9, 19, 29, 8, 18, 28 });
}

Test(eltwise, broadcast_rank3_with_rank2)
{
	/* [4,1,3] + [2,1] -> [4,2,3]: out[i,j,k] = a[i,0,k] + b[j,0] */
	double a[12], want[24];
	for (int i = 0; i < 12; i++)
		a[i] = i;
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 2; j++)
			for (int k = 0; k < 3; k++)
				want[(i * 2 + j) * 3 + k] = a[i * 3 + k] + (j ? 100 : 200);
	expect(OK("Add", NULL, vals(DG_F32, "4,1,3", a),
		  vals(DG_F32, "2,1", (double[]){ 200, 100 })), DG_F32, "4,2,3", want);
}

Test(eltwise, broadcast_scalar_on_either_side)
{
	expect(OK("Sub", NULL, scalar(DG_F32, 10), vals(DG_F32, "3", (double[]){ 1, 2, 3 })),
	       DG_F32, "3", (double[]){ 9, 8, 7 });
	expect(OK("Sub", NULL, vals(DG_F32, "3", (double[]){ 1, 2, 3 }), scalar(DG_F32, 10)),
	       DG_F32, "3", (double[]){ -9, -8, -7 });
	expect(OK("Div", NULL, vals(DG_I32, "3", (double[]){ 7, 8, -9 }), scalar(DG_I32, 2)),
	       DG_I32, "3", (double[]){ 3, 4, -4 });
	expect(OK("Div", NULL, scalar(DG_F64, 1), vals(DG_F64, "2,2", (double[]){ 1, 2, 4, 8 })),
	       DG_F64, "2,2", (double[]){ 1, 0.5, 0.25, 0.125 });
	/* a one-element tensor of rank 1 broadcasts like a scalar */
	expect(OK("Pow", NULL, vals(DG_I64, "4", (double[]){ 1, 2, 3, 4 }),
		  vals(DG_I64, "1", (double[]){ 2 })),
	       DG_I64, "4", (double[]){ 1, 4, 9, 16 });
	/* scalar with scalar stays 0-d */
	expect(OK("Mul", NULL, scalar(DG_U8, 6), scalar(DG_U8, 7)), DG_U8, "[]",
	       (double[]){ 42 });
	/* [1,1] with [] gives [1,1] */
	expect(OK("Add", NULL, vals(DG_F32, "1,1", (double[]){ 2 }), scalar(DG_F32, 3)), DG_F32,
	       "1,1", (double[]){ 5 });
}

Test(eltwise, broadcast_with_a_zero_sized_dim_gives_an_empty_output)
{
	expect(OK("Add", NULL, raw(DG_F32, "0,3", NULL), vals(DG_F32, "3", (double[]){ 1, 2, 3 })),
	       DG_F32, "0,3", NULL);
	expect(OK("Mul", NULL, raw(DG_I32, "0", NULL), vals(DG_I32, "1", (double[]){ 1 })),
	       DG_I32, "0", NULL);
	expect(OK("Less", NULL, raw(DG_F64, "2,0", NULL), vals(DG_F64, "2,1", (double[]){ 1, 2 })),
	       DG_BOOL, "2,0", NULL);
	/* no division happens, so no division-by-zero error either */
	expect(OK("Div", NULL, raw(DG_I32, "0,2", NULL), vals(DG_I32, "2", (double[]){ 0, 0 })),
	       DG_I32, "0,2", NULL);
}

Test(eltwise, broadcast_of_incompatible_shapes_is_a_shape_error)
{
	struct dg_err err = { 0 };

	cr_assert_eq(FAIL("Add", NULL, &err, raw(DG_F32, "2,3", (float[6]){ 0 }),
			  raw(DG_F32, "2", (float[2]){ 0 })), DG_ESHAPE);
	expect_msg(&err, "shapes [2,3] and [2] cannot be broadcast together");
	cr_assert_eq(FAIL("Equal", NULL, &err, raw(DG_I32, "0", NULL),
			  raw(DG_I32, "2", (int32_t[2]){ 0 })), DG_ESHAPE);
	expect_msg(&err, "shapes [0] and [2]");
	cr_assert_eq(FAIL("Maximum", NULL, &err, raw(DG_U8, "4,1,3", (uint8_t[12]){ 0 }),
			  raw(DG_U8, "2,2", (uint8_t[4]){ 0 })), DG_ESHAPE);
}

/* The general iterator (several outer dims, broadcasts in the middle) against
 * the index-arithmetic definition. */
static void check_general_broadcast(const char *sa, const char *sb, const char *so)
{
	struct dg_shape as = shp(sa), bs = shp(sb), os = shp(so);
	struct dg_tensor *a = random_t(DG_F64, sa, 1), *b = random_t(DG_F64, sb, 2);
	struct dg_tensor *sub, *mx;
	const double *pa = a->data, *pb = b->data;
	double *want_sub, *want_max;
	int64_t n;

	cr_assert_eq(dg_shape_numel(&os, &n, NULL), DG_OK);
	want_sub = malloc((size_t)n * sizeof *want_sub);
	want_max = malloc((size_t)n * sizeof *want_max);
	for (int64_t i = 0; i < n; i++) {
		double x = pa[bidx(&as, &os, i)], y = pb[bidx(&bs, &os, i)];
		want_sub[i] = x - y;
		want_max[i] = x > y ? x : y;
	}
	struct dg_tensor *a2 = dg_tensor_clone(a, NULL), *b2 = dg_tensor_clone(b, NULL);
	sub = OK("Sub", NULL, a, b);
	mx = OK("Maximum", NULL, a2, b2);
	expect(sub, DG_F64, so, want_sub);
	expect(mx, DG_F64, so, want_max);
	free(want_sub);
	free(want_max);
}

Test(eltwise, general_nd_broadcast_matches_index_reference)
{
	check_general_broadcast("2,1,3,1", "1,4,1,5", "2,4,3,5");
	check_general_broadcast("3,1,5", "4,1", "3,4,5");
	check_general_broadcast("4,1", "3,1,5", "3,4,5");
	check_general_broadcast("2,3,1,4", "3,2,4", "2,3,2,4");
	check_general_broadcast("1,6,1", "5,1,7", "5,6,7");
	check_general_broadcast("2,1,2,1,2,1,2", "1,2,1,2,1,2,1", "2,2,2,2,2,2,2");
}

/* ------------------------------------------------------------------------ */
/* Comparisons                                                                 */

Test(eltwise, comparisons_match_hand_values_on_every_numeric_dtype)
{
	static const double a[] = { 1, 2, 3 }, b[] = { 2, 2, 2 };
	static const struct {
		const char *op;
		double want[3];
	} cases[] = {
		{ "Equal", { 0, 1, 0 } },   { "NotEqual", { 1, 0, 1 } },
		{ "Less", { 1, 0, 0 } },    { "LessEqual", { 1, 1, 0 } },
		{ "Greater", { 0, 0, 1 } }, { "GreaterEqual", { 0, 1, 1 } },
	};

	for (size_t d = 0; d < N_OF(numeric_dts); d++)
		for (size_t c = 0; c < N_OF(cases); c++)
			expect(OK(cases[c].op, NULL, vals(numeric_dts[d], "3", a),
				  vals(numeric_dts[d], "3", b)), DG_BOOL, "3", cases[c].want);
}

Test(eltwise, comparisons_with_nan_are_false_except_not_equal)
{
	const double a[] = { NAN, NAN, 1 }, b[] = { NAN, 1, NAN };

	for (int f = 0; f < 2; f++) {
		enum dg_dtype dt = f ? DG_F64 : DG_F32;
		expect(OK("Equal", NULL, vals(dt, "3", a), vals(dt, "3", b)), DG_BOOL, "3",
		       (double[]){ 0, 0, 0 });
		expect(OK("NotEqual", NULL, vals(dt, "3", a), vals(dt, "3", b)), DG_BOOL, "3",
		       (double[]){ 1, 1, 1 });
		expect(OK("Less", NULL, vals(dt, "3", a), vals(dt, "3", b)), DG_BOOL, "3",
		       (double[]){ 0, 0, 0 });
		expect(OK("GreaterEqual", NULL, vals(dt, "3", a), vals(dt, "3", b)), DG_BOOL, "3",
		       (double[]){ 0, 0, 0 });
	}
}

Test(eltwise, equal_and_not_equal_accept_bool_but_ordering_does_not)
{
	struct dg_err err = { 0 };
	const double a[] = { 0, 1, 1, 0 }, b[] = { 0, 0, 1, 1 };

	expect(OK("Equal", NULL, vals(DG_BOOL, "4", a), vals(DG_BOOL, "4", b)), DG_BOOL, "4",
	       (double[]){ 1, 0, 1, 0 });
	expect(OK("NotEqual", NULL, vals(DG_BOOL, "4", a), vals(DG_BOOL, "4", b)), DG_BOOL, "4",
	       (double[]){ 0, 1, 0, 1 });
	cr_assert_eq(FAIL("Less", NULL, &err, vals(DG_BOOL, "4", a), vals(DG_BOOL, "4", b)),
		     DG_EDTYPE);
	expect_msg(&err, "Less is not defined for bool");
	cr_assert_eq(FAIL("GreaterEqual", NULL, &err, scalar(DG_BOOL, 1), scalar(DG_BOOL, 1)),
		     DG_EDTYPE);
}

Test(eltwise, comparisons_broadcast)
{
	expect(OK("Greater", NULL, vals(DG_F32, "2,3", (double[]){ 1, 2, 3, 4, 5, 6 }),
		  scalar(DG_F32, 2.5)), DG_BOOL, "2,3", (double[]){ 0, 0, 1, 1, 1, 1 });
	expect(OK("LessEqual", NULL, vals(DG_I32, "3,1", (double[]){ 1, 2, 3 }),
		  vals(DG_I32, "3", (double[]){ 1, 2, 3 })),
	       DG_BOOL, "3,3", (double[]){ 1, 1, 1, 0, 1, 1, 0, 0, 1 });
}

/* ------------------------------------------------------------------------ */
/* Where                                                                       */

Test(eltwise, where_selects_elementwise_on_every_dtype)
{
	const double k[] = { 1, 0, 1, 0 };

	for (size_t d = 0; d < N_OF(all_dts); d++) {
		enum dg_dtype dt = all_dts[d];
		bool b = dt == DG_BOOL;
		const double *x = b ? (double[]){ 1, 1, 0, 0 } : (double[]){ 1, 2, 3, 4 };
		const double *y = b ? (double[]){ 0, 1, 1, 0 } : (double[]){ 50, 60, 70, 80 };
		expect(OK("Where", NULL, vals(DG_BOOL, "2,2", k), vals(dt, "2,2", x),
			  vals(dt, "2,2", y)),
		       dt, "2,2", b ? (double[]){ 1, 1, 0, 0 } : (double[]){ 1, 60, 3, 80 });
	}
}

Test(eltwise, where_broadcasts_condition_and_branches_three_ways)
{
	/* cond [2,1], x [3], y [] -> [2,3] */
	expect(OK("Where", NULL, vals(DG_BOOL, "2,1", (double[]){ 1, 0 }),
		  vals(DG_F32, "3", (double[]){ 1, 2, 3 }), scalar(DG_F32, 9)),
	       DG_F32, "2,3", (double[]){ 1, 2, 3, 9, 9, 9 });
	/* cond [3], x [2,1], y [1,3] -> [2,3] */
	expect(OK("Where", NULL, vals(DG_BOOL, "3", (double[]){ 0, 1, 0 }),
		  vals(DG_I64, "2,1", (double[]){ 100, 200 }),
		  vals(DG_I64, "1,3", (double[]){ 1, 2, 3 })),
	       DG_I64, "2,3", (double[]){ 1, 100, 3, 1, 200, 3 });
	/* scalar cond picks a whole branch */
	expect(OK("Where", NULL, scalar(DG_BOOL, 0), vals(DG_U8, "2", (double[]){ 1, 2 }),
		  vals(DG_U8, "2", (double[]){ 3, 4 })), DG_U8, "2", (double[]){ 3, 4 });
	/* empty */
	expect(OK("Where", NULL, raw(DG_BOOL, "0,2", NULL), scalar(DG_F64, 1), scalar(DG_F64, 2)),
	       DG_F64, "0,2", NULL);
}

Test(eltwise, where_refuses_bad_condition_mixed_branches_and_bad_shapes)
{
	struct dg_err err = { 0 };

	cr_assert_eq(FAIL("Where", NULL, &err, scalar(DG_I32, 1), scalar(DG_F32, 1),
			  scalar(DG_F32, 2)), DG_EDTYPE);
	expect_msg(&err, "condition must be bool, got int32");
	cr_assert_eq(FAIL("Where", NULL, &err, scalar(DG_BOOL, 1), scalar(DG_F32, 1),
			  scalar(DG_F64, 2)), DG_EDTYPE);
	expect_msg(&err, "dtypes float32 and float64 differ");
	cr_assert_eq(FAIL("Where", NULL, &err, raw(DG_BOOL, "2", (uint8_t[2]){ 0 }),
			  raw(DG_F32, "3", (float[3]){ 0 }), scalar(DG_F32, 2)), DG_ESHAPE);
	expect_msg(&err, "cannot be broadcast together");
	cr_assert_eq(FAIL("Where", NULL, &err, raw(DG_BOOL, "3", (uint8_t[3]){ 0 }),
			  raw(DG_F32, "3", (float[3]){ 0 }), raw(DG_F32, "2,2", (float[4]){ 0 })),
		     DG_ESHAPE);
}

/* ------------------------------------------------------------------------ */
/* Cast                                                                        */

Test(eltwise, cast_converts_between_all_dtype_pairs)
{
	const double v[] = { 0, 1, 5, 100 }, vb[] = { 0, 1, 1, 0 };

	for (size_t s = 0; s < N_OF(all_dts); s++) {
		for (size_t d = 0; d < N_OF(all_dts); d++) {
			enum dg_dtype from = all_dts[s], to = all_dts[d];
			const double *in = from == DG_BOOL ? vb : v;
			double want[4];
			char attrs[64];
			for (int i = 0; i < 4; i++)
				want[i] = to == DG_BOOL ? in[i] != 0 : in[i];
			snprintf(attrs, sizeof attrs, "{\"dtype\": \"%s\"}", dg_dtype_name(to));
			expect(OK("Cast", attrs, vals(from, "2,2", in)), to, "2,2", want);
		}
	}
}

Test(eltwise, cast_float_to_int_truncates_toward_zero)
{
	const double x[] = { 2.7, -2.7, 0.5, -0.5, 1e9, -0.99 };

	for (int f = 0; f < 2; f++) {
		enum dg_dtype dt = f ? DG_F64 : DG_F32;
		expect(OK("Cast", "{\"dtype\": \"int32\"}", vals(dt, "6", x)), DG_I32, "6",
		       (double[]){ 2, -2, 0, 0, 1e9, 0 });
		expect(OK("Cast", "{\"dtype\": \"int64\"}", vals(dt, "6", x)), DG_I64, "6",
		       (double[]){ 2, -2, 0, 0, 1e9, 0 });
		expect(OK("Cast", "{\"dtype\": \"uint8\"}",
			  vals(dt, "4", (double[]){ 255.9, -0.99, 0.5, 17.2 })),
		       DG_U8, "4", (double[]){ 255, 0, 0, 17 });
	}
	/* the exact ends of the ranges are fine */
	expect_i32(OK("Cast", "{\"dtype\": \"int32\"}",
		      vals(DG_F64, "3", (double[]){ -2147483648.0, 2147483647.0, -2147483648.9 })),
		   "3", (int32_t[]){ INT32_MIN, INT32_MAX, INT32_MIN });
	expect_i64(OK("Cast", "{\"dtype\": \"int64\"}",
		      vals(DG_F64, "2", (double[]){ -9223372036854775808.0, 9007199254740993.0 })),
		   "2", (int64_t[]){ INT64_MIN, 9007199254740992 });
}

Test(eltwise, cast_float_to_int_refuses_nan_inf_and_out_of_range)
{
	static const struct {
		enum dg_dtype from;
		const char *to;
		double v;
		const char *part;
	} cases[] = {
		{ DG_F32, "int32", NAN, "nan" },
		{ DG_F64, "int32", NAN, "nan" },
		{ DG_F32, "int64", INFINITY, "inf" },
		{ DG_F64, "uint8", -INFINITY, "-inf" },
		{ DG_F64, "int32", 2147483648.0, "2147483648" },
		{ DG_F64, "int32", -2147483649.0, "-2147483649" },
		{ DG_F32, "uint8", 256, "256" },
		{ DG_F32, "uint8", -1, "-1" },
		{ DG_F64, "int64", 9223372036854775808.0, "9.22" },
		{ DG_F32, "int64", -1e19, "e+18" },
	};

	for (size_t i = 0; i < N_OF(cases); i++) {
		struct dg_err err = { 0 };
		char attrs[64];
		snprintf(attrs, sizeof attrs, "{\"dtype\": \"%s\"}", cases[i].to);
		cr_assert_eq(FAIL("Cast", attrs, &err,
				  vals(cases[i].from, "3", (double[]){ 1, 2, cases[i].v })),
			     DG_EINVAL, "case %zu", i);
		expect_msg(&err, cases[i].part);
		expect_msg(&err, cases[i].to);
		expect_msg(&err, "element 2");
	}
}

Test(eltwise, cast_between_ints_wraps_like_tensorflow)
{
	expect_i32(OK("Cast", "{\"dtype\": \"int32\"}",
		      raw(DG_I64, "4", (int64_t[]){ 4294967301, 2147483648, -1, -4294967296 })),
		   "4", (int32_t[]){ 5, INT32_MIN, -1, 0 });
	expect(OK("Cast", "{\"dtype\": \"uint8\"}",
		  raw(DG_I32, "3", (int32_t[]){ -1, 263, 255 })), DG_U8, "3",
	       (double[]){ 255, 7, 255 });
	expect(OK("Cast", "{\"dtype\": \"uint8\"}", raw(DG_I64, "2", (int64_t[]){ -1, 256 })),
	       DG_U8, "2", (double[]){ 255, 0 });
	expect_i64(OK("Cast", "{\"dtype\": \"int64\"}",
		      raw(DG_I32, "2", (int32_t[]){ INT32_MIN, -5 })), "2",
		   (int64_t[]){ INT32_MIN, -5 });
	expect(OK("Cast", "{\"dtype\": \"int32\"}", raw(DG_U8, "2", (uint8_t[]){ 200, 0 })),
	       DG_I32, "2", (double[]){ 200, 0 });
}

Test(eltwise, cast_to_bool_is_nonzero_and_from_bool_is_zero_or_one)
{
	expect(OK("Cast", "{\"dtype\": \"bool\"}",
		  vals(DG_F32, "5", (double[]){ NAN, -0.0, 0.5, 0, -INFINITY })),
	       DG_BOOL, "5", (double[]){ 1, 0, 1, 0, 1 });
	expect(OK("Cast", "{\"dtype\": \"bool\"}", raw(DG_I32, "3", (int32_t[]){ 2, 0, -1 })),
	       DG_BOOL, "3", (double[]){ 1, 0, 1 });
	expect(OK("Cast", "{\"dtype\": \"bool\"}",
		  raw(DG_I64, "2", (int64_t[]){ (int64_t)1 << 40, 0 })), DG_BOOL, "2",
	       (double[]){ 1, 0 });
	expect(OK("Cast", "{\"dtype\": \"bool\"}", raw(DG_U8, "2", (uint8_t[]){ 255, 0 })),
	       DG_BOOL, "2", (double[]){ 1, 0 });
	expect(OK("Cast", "{\"dtype\": \"float64\"}", vals(DG_BOOL, "2", (double[]){ 1, 0 })),
	       DG_F64, "2", (double[]){ 1, 0 });
}

Test(eltwise, cast_between_floats_rounds_like_ieee)
{
	struct dg_tensor *t = OK("Cast", "{\"dtype\": \"float32\"}",
				 vals(DG_F64, "3", (double[]){ 0.1, 1e40, -1e40 }));

	cr_assert_eq(((float *)t->data)[0], 0.1f);
	cr_assert(isinf(((float *)t->data)[1]) && ((float *)t->data)[1] > 0);
	cr_assert(isinf(((float *)t->data)[2]) && ((float *)t->data)[2] < 0);
	dg_tensor_free(t);
	t = OK("Cast", "{\"dtype\": \"float64\"}",
	       raw(DG_I64, "1", (int64_t[]){ 9007199254740993 }));
	cr_assert_eq(((double *)t->data)[0], 9007199254740992.0);
	dg_tensor_free(t);
	expect(OK("Cast", "{\"dtype\": \"float64\"}", vals(DG_F32, "2", (double[]){ 0.5, NAN })),
	       DG_F64, "2", (double[]){ 0.5, NAN });
}

Test(eltwise, cast_requires_a_valid_dtype_attr)
{
	struct dg_err err = { 0 };

	cr_assert_eq(FAIL("Cast", NULL, &err, scalar(DG_F32, 1)), DG_EINVAL);
	expect_msg(&err, "dtype");
	cr_assert_eq(FAIL("Cast", "{\"dtype\": \"float8\"}", &err, scalar(DG_F32, 1)), DG_EDTYPE);
	cr_assert_eq(FAIL("Cast", "{\"dtype\": 3}", &err, scalar(DG_F32, 1)), DG_EINVAL);
	/* empty inputs need no values, so nothing can be out of range */
	expect(OK("Cast", "{\"dtype\": \"uint8\"}", raw(DG_F32, "0,5", NULL)), DG_U8, "0,5", NULL);
}

/* ------------------------------------------------------------------------ */
/* Large tensors against reference loops                                     */

#define BIG 1000000

Test(eltwise, large_flat_ops_match_reference_loops)
{
	struct dg_tensor *a = random_t(DG_F32, "1000000", 7), *b = random_t(DG_F32, "1000000", 8);
	struct dg_tensor *a2 = dg_tensor_clone(a, NULL), *b2 = dg_tensor_clone(b, NULL);
	struct dg_tensor *a3 = dg_tensor_clone(a, NULL);
	float *ra = malloc(BIG * sizeof *ra), *rb = malloc(BIG * sizeof *rb);
	struct dg_tensor *sum, *prod, *sig;

	memcpy(ra, a->data, BIG * sizeof *ra);
	memcpy(rb, b->data, BIG * sizeof *rb);
	sum = OK("Add", NULL, a, b);
	prod = OK("Mul", NULL, a2, b2);
	sig = OK("Sigmoid", NULL, a3);
	cr_assert_eq(sum->numel, BIG);
	for (int64_t i = 0; i < BIG; i++) {
		cr_assert_eq(((float *)sum->data)[i], ra[i] + rb[i], "Add [%lld]", (long long)i);
		cr_assert_eq(((float *)prod->data)[i], ra[i] * rb[i], "Mul [%lld]", (long long)i);
		double s = 1 / (1 + exp(-(double)ra[i]));
		cr_assert(fabs(((float *)sig->data)[i] - s) < 1e-6, "Sigmoid [%lld]", (long long)i);
	}
	dg_tensor_free(sum);
	dg_tensor_free(prod);
	dg_tensor_free(sig);
	free(ra);
	free(rb);
}

Test(eltwise, large_int32_add_wraps_like_the_unsigned_reference)
{
	struct dg_shape s = shp("1000000");
	struct dg_tensor *a = dg_tensor_new(DG_I32, &s, NULL), *b = dg_tensor_new(DG_I32, &s, NULL);
	int32_t *pa = a->data, *pb = b->data, *ra = malloc(BIG * 4), *rb = malloc(BIG * 4);
	uint32_t seed = 3;

	for (int64_t i = 0; i < BIG; i++) {
		seed = seed * 1664525u + 1013904223u;
		ra[i] = pa[i] = (int32_t)seed;
		seed = seed * 1664525u + 1013904223u;
		rb[i] = pb[i] = (int32_t)seed;
	}
	struct dg_tensor *o = OK("Add", NULL, a, b);
	for (int64_t i = 0; i < BIG; i++)
		cr_assert_eq(((int32_t *)o->data)[i], (int32_t)((uint32_t)ra[i] + (uint32_t)rb[i]));
	dg_tensor_free(o);
	free(ra);
	free(rb);
}

Test(eltwise, large_row_and_column_broadcasts_match_reference_loops)
{
	struct dg_tensor *m = random_t(DG_F32, "1000,1000", 11), *r = random_t(DG_F32, "1000", 12);
	struct dg_tensor *c = random_t(DG_F64, "1000,1", 13), *w = random_t(DG_F64, "1,1000", 14);
	float *rm = malloc(BIG * sizeof *rm), rr[1000];
	double rc[1000], rw[1000];

	memcpy(rm, m->data, BIG * sizeof *rm);
	memcpy(rr, r->data, sizeof rr);
	memcpy(rc, c->data, sizeof rc);
	memcpy(rw, w->data, sizeof rw);
	struct dg_tensor *mr = OK("Mul", NULL, m, r);
	struct dg_tensor *cw = OK("Sub", NULL, c, w);
	for (int i = 0; i < 1000; i++) {
		for (int j = 0; j < 1000; j++) {
			cr_assert_eq(((float *)mr->data)[i * 1000 + j], rm[i * 1000 + j] * rr[j]);
			cr_assert_eq(((double *)cw->data)[i * 1000 + j], rc[i] - rw[j]);
		}
	}
	dg_tensor_free(mr);
	dg_tensor_free(cw);
	free(rm);
}

Test(eltwise, large_where_and_cast_match_reference_loops)
{
	struct dg_tensor *x = random_t(DG_F64, "1000,1000", 21);
	struct dg_tensor *x2 = dg_tensor_clone(x, NULL), *x3 = dg_tensor_clone(x, NULL);
	double *rx = malloc(BIG * sizeof *rx);

	memcpy(rx, x->data, BIG * sizeof *rx);
	struct dg_tensor *k = OK("Greater", NULL, x, scalar(DG_F64, 0));
	struct dg_tensor *rel = OK("Where", NULL, k, x2, scalar(DG_F64, 0));
	struct dg_tensor *ci = OK("Cast", "{\"dtype\": \"int32\"}", x3);
	for (int64_t i = 0; i < BIG; i++) {
		cr_assert_eq(((double *)rel->data)[i], rx[i] > 0 ? rx[i] : 0);
		cr_assert_eq(((int32_t *)ci->data)[i], (int32_t)rx[i]);
	}
	dg_tensor_free(rel);
	dg_tensor_free(ci);
	free(rx);
}

/* ------------------------------------------------------------------------ */
/* Inference                                                                   */

static struct dg_ttype tt(enum dg_dtype dt, int ndim, const int64_t *dims)
{
	struct dg_ttype t = { .dtype = dt, .shape = { .ndim = ndim } };

	for (int i = 0; i < ndim; i++)
		t.shape.dim[i] = dims[i];
	return t;
}

#define TT(dt, ...) tt(dt, (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), \
		       (int64_t[]){ __VA_ARGS__ })
#define TT_SCALAR(dt) tt(dt, 0, NULL)
#define TT_UNKNOWN(dt) tt(dt, -1, NULL)

/* Run op's infer on inputs; returns the status, *out the single output. */
static enum dg_status infer(const char *name, const char *attrs, int n,
			    const struct dg_ttype *in, struct dg_ttype *out, struct dg_err *err)
{
	const struct dg_op_def *op = dg_op_find(name);
	json_t *a = json_loads(attrs ? attrs : "{}", 0, NULL);
	struct dg_infer_ctx c = {
		.attrs = a, .n_in = n, .in = in, .n_out = 1, .out = out, .err = err,
	};
	enum dg_status st;

	cr_assert_not_null(op);
	memset(out, 0, sizeof *out);
	st = op->infer(&c);
	json_decref(a);
	return st;
}

static void expect_tt(const struct dg_ttype *t, enum dg_dtype dt, int ndim, const int64_t *dims)
{
	cr_assert_eq(t->dtype, dt, "dtype %s", dg_dtype_name(t->dtype));
	cr_assert_eq(t->shape.ndim, ndim);
	for (int i = 0; i < ndim; i++)
		cr_assert_eq(t->shape.dim[i], dims[i], "dim %d = %lld", i,
			     (long long)t->shape.dim[i]);
}

Test(eltwise, infer_binary_broadcasts_known_and_unknown_dims)
{
	struct dg_err err = { 0 };
	struct dg_ttype out;

	cr_assert_eq(infer("Add", NULL, 2, (struct dg_ttype[]){ TT(DG_F32, 2, -1), TT(DG_F32, 3) },
			   &out, &err), DG_OK, "%s", err.msg);
	expect_tt(&out, DG_F32, 2, (int64_t[]){ 2, 3 });
	cr_assert_eq(infer("Mul", NULL, 2,
			   (struct dg_ttype[]){ TT(DG_I64, -1, 3), TT(DG_I64, 4, 1) }, &out, &err),
		     DG_OK);
	expect_tt(&out, DG_I64, 2, (int64_t[]){ 4, 3 });
	cr_assert_eq(infer("Sub", NULL, 2, (struct dg_ttype[]){ TT(DG_F64, -1), TT(DG_F64, -1) },
			   &out, &err), DG_OK);
	expect_tt(&out, DG_F64, 1, (int64_t[]){ -1 });
	cr_assert_eq(infer("Div", NULL, 2,
			   (struct dg_ttype[]){ TT_UNKNOWN(DG_F32), TT(DG_F32, 3) }, &out, &err),
		     DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
	cr_assert_eq(out.dtype, DG_F32);
	cr_assert_eq(infer("Pow", NULL, 2,
			   (struct dg_ttype[]){ TT_SCALAR(DG_U8), TT(DG_U8, 5, -1, 1) }, &out,
			   &err), DG_OK);
	expect_tt(&out, DG_U8, 3, (int64_t[]){ 5, -1, 1 });
}

Test(eltwise, infer_binary_rejects_what_is_certainly_wrong)
{
	struct dg_err err = { 0 };
	struct dg_ttype out;

	cr_assert_eq(infer("Add", NULL, 2, (struct dg_ttype[]){ TT(DG_F32, 2, 3), TT(DG_F32, 4) },
			   &out, &err), DG_ESHAPE);
	expect_msg(&err, "shapes [2,3] and [4] cannot be broadcast together");
	cr_assert_eq(infer("Add", NULL, 2, (struct dg_ttype[]){ TT(DG_F32, -1, 3), TT(DG_F32, 4) },
			   &out, &err), DG_ESHAPE);
	cr_assert_eq(infer("Maximum", NULL, 2, (struct dg_ttype[]){ TT(DG_F32, 2), TT(DG_F64, 2) },
			   &out, &err), DG_EDTYPE);
	expect_msg(&err, "dtypes float32 and float64 differ");
	cr_assert_eq(infer("Add", NULL, 2, (struct dg_ttype[]){ TT(DG_BOOL, 2), TT(DG_BOOL, 2) },
			   &out, &err), DG_EDTYPE);
}

Test(eltwise, infer_comparisons_give_bool)
{
	struct dg_err err = { 0 };
	struct dg_ttype out;

	cr_assert_eq(infer("Less", NULL, 2, (struct dg_ttype[]){ TT(DG_I32, -1, 1), TT(DG_I32, 7) },
			   &out, &err), DG_OK);
	expect_tt(&out, DG_BOOL, 2, (int64_t[]){ -1, 7 });
	cr_assert_eq(infer("Equal", NULL, 2,
			   (struct dg_ttype[]){ TT(DG_BOOL, 3), TT_SCALAR(DG_BOOL) }, &out, &err),
		     DG_OK);
	expect_tt(&out, DG_BOOL, 1, (int64_t[]){ 3 });
	cr_assert_eq(infer("Greater", NULL, 2,
			   (struct dg_ttype[]){ TT(DG_BOOL, 3), TT(DG_BOOL, 3) }, &out, &err),
		     DG_EDTYPE);
}

Test(eltwise, infer_unary_keeps_type_and_refuses_ints_for_float_math)
{
	struct dg_err err = { 0 };
	struct dg_ttype out;

	cr_assert_eq(infer("Tanh", NULL, 1, (struct dg_ttype[]){ TT(DG_F64, -1, 4) }, &out, &err),
		     DG_OK);
	expect_tt(&out, DG_F64, 2, (int64_t[]){ -1, 4 });
	cr_assert_eq(infer("Neg", NULL, 1, (struct dg_ttype[]){ TT_UNKNOWN(DG_I64) }, &out, &err),
		     DG_OK);
	cr_assert_eq(out.shape.ndim, -1);
	cr_assert_eq(out.dtype, DG_I64);
	cr_assert_eq(infer("Sqrt", NULL, 1, (struct dg_ttype[]){ TT(DG_I32, 2) }, &out, &err),
		     DG_EDTYPE);
	expect_hint(&err, "Cast to float32 first");
	cr_assert_eq(infer("Abs", NULL, 1, (struct dg_ttype[]){ TT(DG_BOOL, 2) }, &out, &err),
		     DG_EDTYPE);
}

Test(eltwise, infer_where_broadcasts_three_ways_and_checks_dtypes)
{
	struct dg_err err = { 0 };
	struct dg_ttype out;

	cr_assert_eq(infer("Where", NULL, 3,
			   (struct dg_ttype[]){ TT(DG_BOOL, -1, 1), TT(DG_I32, 3),
						TT_SCALAR(DG_I32) }, &out, &err),
		     DG_OK, "%s", err.msg);
	expect_tt(&out, DG_I32, 2, (int64_t[]){ -1, 3 });
	cr_assert_eq(infer("Where", NULL, 3,
			   (struct dg_ttype[]){ TT(DG_BOOL, 2, 1), TT(DG_F32, 1, 3),
						TT(DG_F32, 4, 1, 1) }, &out, &err), DG_OK);
	expect_tt(&out, DG_F32, 3, (int64_t[]){ 4, 2, 3 });
	cr_assert_eq(infer("Where", NULL, 3,
			   (struct dg_ttype[]){ TT(DG_F32, 2), TT(DG_F32, 2), TT(DG_F32, 2) },
			   &out, &err), DG_EDTYPE);
	cr_assert_eq(infer("Where", NULL, 3,
			   (struct dg_ttype[]){ TT(DG_BOOL, 2), TT(DG_F32, 3), TT(DG_F32, 2) },
			   &out, &err), DG_ESHAPE);
}

Test(eltwise, infer_cast_takes_the_attr_dtype_and_keeps_the_shape)
{
	struct dg_err err = { 0 };
	struct dg_ttype out;

	cr_assert_eq(infer("Cast", "{\"dtype\": \"int64\"}", 1,
			   (struct dg_ttype[]){ TT(DG_F32, -1, 2) }, &out, &err), DG_OK);
	expect_tt(&out, DG_I64, 2, (int64_t[]){ -1, 2 });
	cr_assert_eq(infer("Cast", "{\"dtype\": \"bool\"}", 1,
			   (struct dg_ttype[]){ TT_UNKNOWN(DG_U8) }, &out, &err), DG_OK);
	cr_assert_eq(out.dtype, DG_BOOL);
	cr_assert_eq(out.shape.ndim, -1);
	cr_assert_eq(infer("Cast", NULL, 1, (struct dg_ttype[]){ TT(DG_F32, 2) }, &out, &err),
		     DG_EINVAL);
	cr_assert_eq(infer("Cast", "{\"dtype\": \"complex64\"}", 1,
			   (struct dg_ttype[]){ TT(DG_F32, 2) }, &out, &err), DG_EDTYPE);
}

/* ------------------------------------------------------------------------ */
/* float16 and bfloat16                                                       */

/* A 16-bit tensor of shape s from raw bits. */
static struct dg_tensor *bits16(enum dg_dtype dt, const char *s, const uint16_t *v)
{
	return raw(dt, s, v);
}

static void expect_bits16(struct dg_tensor *t, enum dg_dtype dt, const char *s,
			  const uint16_t *v)
{
	struct dg_shape sh = shp(s);

	cr_assert_eq(t->dtype, dt, "dtype %s", dg_dtype_name(t->dtype));
	cr_assert(dg_shape_eq(&t->shape, &sh));
	for (int64_t i = 0; i < t->numel; i++)
		cr_assert_eq(((uint16_t *)t->data)[i], v[i], "%s [%lld] = 0x%04x, expected 0x%04x",
			     dg_dtype_name(dt), (long long)i, ((uint16_t *)t->data)[i], v[i]);
	dg_tensor_free(t);
}

Test(eltwise, cast_to_float16_rounds_to_nearest_even_and_overflows_to_inf)
{
	float f[] = { 1.0f / 3, 65520, 65519, -1e9f, 0x1p-25f, 3 * 0x1p-25f, -0.0f, 0.1f };

	expect_bits16(OK("Cast", "{\"dtype\": \"float16\"}", raw(DG_F32, "8", f)), DG_F16, "8",
		      (uint16_t[]){ 0x3555, 0x7c00, 0x7bff, 0xfc00, 0, 2, 0x8000, 0x2e66 });
	/* float64 rounds once: 1 + 2^-11 + 2^-30 is past the tie */
	expect_bits16(OK("Cast", "{\"dtype\": \"half\"}",
			 vals(DG_F64, "3",
			      (double[]){ 1 + 0x1p-11, 1 + 0x1p-11 + 0x1p-30, 1e300 })),
		      DG_F16, "3", (uint16_t[]){ 0x3c00, 0x3c01, 0x7c00 });
	int32_t i[] = { 2049, 2051, 65519, 65520, -70000 };
	expect_bits16(OK("Cast", "{\"dtype\": \"float16\"}", raw(DG_I32, "5", i)), DG_F16, "5",
		      (uint16_t[]){ 0x6800, 0x6802, 0x7bff, 0x7c00, 0xfc00 });
	uint8_t u[] = { 0, 255 }, b[] = { 1, 0 };
	expect_bits16(OK("Cast", "{\"dtype\": \"float16\"}", raw(DG_U8, "2", u)), DG_F16, "2",
		      (uint16_t[]){ 0, 0x5bf8 });
	expect_bits16(OK("Cast", "{\"dtype\": \"float16\"}", raw(DG_BOOL, "2", b)), DG_F16, "2",
		      (uint16_t[]){ 0x3c00, 0 });
	expect_bits16(OK("Cast", "{\"dtype\": \"bfloat16\"}", raw(DG_BOOL, "2", b)), DG_BF16, "2",
		      (uint16_t[]){ 0x3f80, 0 });
}

Test(eltwise, cast_to_bfloat16_ties_to_even_from_every_source)
{
	expect_bits16(OK("Cast", "{\"dtype\": \"bf16\"}",
			 vals(DG_F64, "4", (double[]){ 1.00390625, 1.01171875,
						       1.00390625 + 0x1p-40, 1.0 / 3 })),
		      DG_BF16, "4", (uint16_t[]){ 0x3f80, 0x3f82, 0x3f81, 0x3eab });
	float f[] = { 1.00390625f, 3.4028234663852886e38f, NAN };
	struct dg_tensor *t = OK("Cast", "{\"dtype\": \"bfloat16\"}", raw(DG_F32, "3", f));
	cr_assert_eq(((uint16_t *)t->data)[0], 0x3f80);
	cr_assert_eq(((uint16_t *)t->data)[1], 0x7f80);   /* FLT_MAX rounds up to inf */
	cr_assert(isnan(dg_tensor_get_f64(t, 2)));
	dg_tensor_free(t);
	/* int64: 2^56 + 2^48 + 1 is just past a bfloat16 tie; through a plain double
	 * the +1 would vanish and the tie go to even (0x5b80). */
	int64_t i[] = { (INT64_C(1) << 56) + (INT64_C(1) << 48) + 1,
			(INT64_C(1) << 56) + (INT64_C(1) << 48), INT64_MIN, -3 };
	expect_bits16(OK("Cast", "{\"dtype\": \"bfloat16\"}", raw(DG_I64, "4", i)), DG_BF16, "4",
		      (uint16_t[]){ 0x5b81, 0x5b80, 0xdf00, 0xc040 });
	expect_bits16(OK("Cast", "{\"dtype\": \"float16\"}", raw(DG_I64, "1", i)), DG_F16, "1",
		      (uint16_t[]){ 0x7c00 });
}

Test(eltwise, cast_from_16_bit_floats_is_exact_or_checked)
{
	/* 2.75 -3.5 65504 -0 2^-24 nan */
	uint16_t h[] = { 0x4180, 0xc300, 0x7bff, 0x8000, 0x0001, 0x7e00 };
	struct dg_err err = { 0 };

	expect(OK("Cast", "{\"dtype\": \"float32\"}", bits16(DG_F16, "6", h)), DG_F32, "6",
	       (double[]){ 2.75, -3.5, 65504, 0, 0x1p-24, NAN });
	expect(OK("Cast", "{\"dtype\": \"float64\"}", bits16(DG_F16, "6", h)), DG_F64, "6",
	       (double[]){ 2.75, -3.5, 65504, 0, 0x1p-24, NAN });
	expect_i32(OK("Cast", "{\"dtype\": \"int32\"}", bits16(DG_F16, "5", h)), "5",
		   (int32_t[]){ 2, -3, 65504, 0, 0 });
	/* bfloat16 2^62 fits int64; 2^63 (0x5f00) does not */
	expect_i64(OK("Cast", "{\"dtype\": \"int64\"}",
		      bits16(DG_BF16, "1", (uint16_t[]){ 0x5e80 })),
		   "1", (int64_t[]){ INT64_C(1) << 62 });
	cr_assert_eq(FAIL("Cast", "{\"dtype\": \"int64\"}", &err,
			  bits16(DG_BF16, "1", (uint16_t[]){ 0x5f00 })), DG_EINVAL);
	expect_msg(&err, "Cast of bfloat16 value 9.2233720368547758e+18");
	cr_assert_eq(FAIL("Cast", "{\"dtype\": \"uint8\"}", &err,
			  vals(DG_F16, "2", (double[]){ 255.9, 300 })), DG_EINVAL);
	expect_msg(&err, "value 300 (element 1)");
	cr_assert_eq(FAIL("Cast", "{\"dtype\": \"int32\"}", &err, bits16(DG_F16, "6", h)),
		     DG_EINVAL);
	expect_msg(&err, "value nan (element 5)");
	/* -0 is false, NaN and the smallest subnormal true */
	expect(OK("Cast", "{\"dtype\": \"bool\"}", bits16(DG_F16, "6", h)), DG_BOOL, "6",
	       (double[]){ 1, 1, 1, 0, 1, 1 });
	/* between the formats: one rounding of the exact value */
	expect_bits16(OK("Cast", "{\"dtype\": \"bfloat16\"}", bits16(DG_F16, "2",
			 (uint16_t[]){ 0x3555, 0x7bff })), DG_BF16, "2",
		      (uint16_t[]){ 0x3eab, 0x4780 });
	expect_bits16(OK("Cast", "{\"dtype\": \"float16\"}", bits16(DG_BF16, "3",
			 (uint16_t[]){ 0x7f7f, 0x3f80, 0x0001 })), DG_F16, "3",
		      (uint16_t[]){ 0x7c00, 0x3c00, 0x0000 });
}

Test(eltwise, cast_covers_all_64_dtype_pairs)
{
	static const enum dg_dtype dts[] = { DG_F32, DG_F64, DG_I32, DG_I64,
					     DG_U8,  DG_BOOL, DG_F16, DG_BF16 };

	cr_assert_eq(N_OF(dts), DG_DTYPE_COUNT);
	for (size_t a = 0; a < N_OF(dts); a++) {
		for (size_t b = 0; b < N_OF(dts); b++) {
			char js[64];
			bool from_bool = dts[a] == DG_BOOL, to_bool = dts[b] == DG_BOOL;
			bool to_int = dts[b] != DG_BOOL && !dg_dtype_is_float(dts[b]) &&
				      !dg_dtype_is_half(dts[b]);
			bool from_int = dts[a] != DG_BOOL && !dg_dtype_is_float(dts[a]) &&
					!dg_dtype_is_half(dts[a]);
			const double in[4] = { 0, 1, 7, from_int || from_bool ? 3 : 2.5 };
			double want[4];
			for (int i = 0; i < 4; i++) {
				double v = from_bool ? (in[i] != 0) : in[i];
				want[i] = to_bool ? (v != 0) : to_int ? trunc(v) : v;
			}
			snprintf(js, sizeof js, "{\"dtype\": \"%s\"}", dg_dtype_name(dts[b]));
			expect(OK("Cast", js, vals(dts[a], "4", in)), dts[b], "4", want);
		}
	}
}

Test(eltwise, add_sub_mul_on_16_bit_floats_round_once_from_float32)
{
	/* 1 + 2^-11: the tie goes to even 1; 2048 + 1 the same; 65504 + 16 =
	 * 65520 overflows to inf; 0.5 + 0.25 is exact */
	expect_bits16(OK("Add", NULL, vals(DG_F16, "4", (double[]){ 1, 2048, 65504, 0.5 }),
			 vals(DG_F16, "4", (double[]){ 0x1p-11, 1, 16, 0.25 })),
		      DG_F16, "4", (uint16_t[]){ 0x3c00, 0x6800, 0x7c00, 0x3a00 });
	expect(OK("Sub", NULL, vals(DG_F16, "2", (double[]){ 5, -0.5 }),
		  vals(DG_F16, "2", (double[]){ 2.25, 0.5 })), DG_F16, "2", (double[]){ 2.75, -1 });
	/* 300 * 300 = 90000 is past 65504; 1/3 * 3 = 1 - 2^-12, a tie: even 1 */
	expect(OK("Mul", NULL, vals(DG_F16, "2", (double[]){ 300, 1.0 / 3 }),
		  vals(DG_F16, "2", (double[]){ 300, 3 })), DG_F16, "2", (double[]){ INFINITY, 1 });
	/* bfloat16: 1 + 2^-8 ties to 1; 256 + 1 = 257 ties to 256; broadcasting
	 * a scalar */
	expect(OK("Add", NULL, vals(DG_BF16, "3", (double[]){ 1, 256, 3 }),
		  vals(DG_BF16, "", (double[]){ 0x1p-8 })), DG_BF16, "3",
	       (double[]){ 1, 256, 3 });
	expect(OK("Mul", NULL, vals(DG_BF16, "2,2", (double[]){ 1, 2, 3, 4 }),
		  vals(DG_BF16, "2", (double[]){ 10, -0.5 })), DG_BF16, "2,2",
	       (double[]){ 10, -1, 30, -2 });
	expect(OK("Sub", NULL, vals(DG_BF16, "2,1", (double[]){ 1, 2 }),
		  vals(DG_BF16, "1,3", (double[]){ 1, 2, 3 })), DG_BF16, "2,3",
	       (double[]){ 0, -1, -2, 1, 0, -1 });
}

Test(eltwise, relu_and_where_on_16_bit_floats_work_on_the_bits)
{
	/* -1, -0, a negative NaN, 2, -inf, the smallest subnormal */
	uint16_t h[] = { 0xbc00, 0x8000, 0xfe00, 0x4000, 0xfc00, 0x0001 };
	uint16_t b[] = { 0xbf80, 0x8000, 0xffc0, 0x4000, 0xff80, 0x0001 };
	uint8_t k[] = { 1, 0 };

	expect_bits16(OK("Relu", NULL, bits16(DG_F16, "6", h)), DG_F16, "6",
		      (uint16_t[]){ 0, 0, 0xfe00, 0x4000, 0, 0x0001 });
	expect_bits16(OK("Relu", NULL, bits16(DG_BF16, "6", b)), DG_BF16, "6",
		      (uint16_t[]){ 0, 0, 0xffc0, 0x4000, 0, 0x0001 });
	expect_bits16(OK("Where", NULL, raw(DG_BOOL, "2", k), bits16(DG_F16, "2", h),
			 bits16(DG_F16, "2,2", (uint16_t[]){ 1, 2, 3, 4 })),
		      DG_F16, "2,2", (uint16_t[]){ 0xbc00, 2, 0xbc00, 4 });
}

Test(eltwise, ops_without_16_bit_kernels_refuse_them_with_a_cast_hint)
{
	struct dg_err err = { 0 };
	struct dg_ttype out;
	struct dg_ttype in[2] = { TT(DG_F16, 3), TT(DG_F16, 3) };

	cr_assert_eq(FAIL("Sqrt", NULL, &err, vals(DG_F16, "1", (double[]){ 4 })), DG_EDTYPE);
	expect_msg(&err, "Sqrt is not defined for float16");
	expect_hint(&err, "Cast to float32");
	cr_assert_eq(FAIL("Div", NULL, &err, vals(DG_BF16, "1", (double[]){ 4 }),
			  vals(DG_BF16, "1", (double[]){ 2 })), DG_EDTYPE);
	expect_msg(&err, "Div is not defined for bfloat16");
	expect_hint(&err, "storage dtype");
	cr_assert_eq(FAIL("Sum", NULL, &err, vals(DG_F16, "2", (double[]){ 1, 2 })), DG_EDTYPE);
	expect_msg(&err, "Sum does not take float16 tensors");
	expect_hint(&err, "Cast to float32");
	cr_assert_eq(FAIL("Softmax", NULL, &err, vals(DG_BF16, "2", (double[]){ 1, 2 })),
		     DG_EDTYPE);
	expect_msg(&err, "got bfloat16");
	/* at graph validation (inference), before any kernel runs */
	cr_assert_eq(infer("Less", NULL, 2, in, &out, &err), DG_EDTYPE);
	expect_msg(&err, "Less is not defined for float16");
	cr_assert_eq(infer("Add", NULL, 2, in, &out, &err), DG_OK);
	cr_assert_eq(out.dtype, DG_F16);
	in[1] = TT(DG_F32, 3);
	cr_assert_eq(infer("Add", NULL, 2, in, &out, &err), DG_EDTYPE);
	expect_msg(&err, "dtypes float16 and float32 differ");
}
