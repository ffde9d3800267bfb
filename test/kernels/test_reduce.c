/* Tests of the reductions in kernels/cpu/reduce.c (Sum, Mean, Max, Min, ArgMax)
 * through the registry: hand-computed values for every dtype and axis form,
 * every axis subset of a random 5-d tensor and an 8-d tensor against a naive
 * double reference, empty inputs, NaN, integer wrap-around, errors and their
 * messages, float32 accuracy, and shape inference with unknown dims. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dg/kernels.h"

static const enum dg_dtype all_dtypes[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_U8 };
#define N_DTYPES (int)(sizeof all_dtypes / sizeof all_dtypes[0])

static struct dg_tensor *mk(enum dg_dtype dt, int ndim, const int64_t *dims, const double *v)
{
	struct dg_shape s = dg_shape_make(ndim, dims);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_new(dt, &s, &err);

	cr_assert_not_null(t, "dg_tensor_new: %s", err.msg);
	for (int64_t i = 0; v && i < t->numel; i++)
		dg_tensor_set_f64(t, i, v[i]);
	return t;
}

/* 0, 1, 2, ... in the given shape. */
static struct dg_tensor *arange(enum dg_dtype dt, int ndim, const int64_t *dims)
{
	struct dg_tensor *t = mk(dt, ndim, dims, NULL);

	for (int64_t i = 0; i < t->numel; i++)
		dg_tensor_set_f64(t, i, (double)i);
	return t;
}

/* Run a one-input op with attrs given as JSON text (or NULL). */
static enum dg_status run1(const char *op, const char *attrs, const struct dg_tensor *x,
			   struct dg_tensor **out, struct dg_err *err)
{
	const struct dg_tensor *in[1] = { x };
	json_t *j = attrs ? json_loads(attrs, 0, NULL) : NULL;
	const struct dg_op_def *def = dg_op_find(op);
	enum dg_status st;

	cr_assert_not_null(def, "op %s is not registered", op);
	cr_assert(!attrs || j, "bad JSON in test: %s", attrs);
	st = dg_op_run(def, j, in, 1, out, 1, 0, err);
	json_decref(j);
	return st;
}

/* Run and require success, an output of dtype dt and shape want[0..ndim). */
static struct dg_tensor *ok1(const char *op, const char *attrs, const struct dg_tensor *x,
			     enum dg_dtype dt, int ndim, const int64_t *want)
{
	struct dg_tensor *out = NULL;
	struct dg_err err = { 0 };
	enum dg_status st = run1(op, attrs, x, &out, &err);

	cr_assert_eq(st, DG_OK, "%s %s: %s", op, attrs ? attrs : "", err.msg);
	cr_assert_not_null(out);
	cr_assert_eq(out->dtype, dt, "%s %s: dtype %s", op, attrs ? attrs : "",
		     dg_dtype_name(out->dtype));
	cr_assert_eq(out->shape.ndim, ndim, "%s %s: rank %d, want %d", op, attrs ? attrs : "",
		     out->shape.ndim, ndim);
	for (int i = 0; i < ndim; i++)
		cr_assert_eq(out->shape.dim[i], want[i], "%s %s: dim %d is %lld, want %lld", op,
			     attrs ? attrs : "", i, (long long)out->shape.dim[i],
			     (long long)want[i]);
	return out;
}

/* Compare every element with want[], exactly for integers, within a relative
 * tolerance for floats (NaN matches NaN). */
static void expect_vals(const struct dg_tensor *t, const double *want, double rel,
			const char *what)
{
	for (int64_t i = 0; i < t->numel; i++) {
		double got = dg_tensor_get_f64(t, i);
		if (isnan(want[i])) {
			cr_assert(isnan(got), "%s[%lld]: got %g, want nan", what, (long long)i,
				  got);
		} else if (isinf(want[i])) {
			cr_assert_eq(got, want[i], "%s[%lld]: got %g, want %g", what, (long long)i,
				     got, want[i]);
		} else if (dg_dtype_is_float(t->dtype)) {
			cr_assert(fabs(got - want[i]) <= rel * (1.0 + fabs(want[i])),
				  "%s[%lld]: got %.9g, want %.9g", what, (long long)i, got,
				  want[i]);
		} else {
			cr_assert_eq(got, want[i], "%s[%lld]: got %.17g, want %.17g", what,
				     (long long)i, got, want[i]);
		}
	}
}

/* v as the dtype stores a wrapped integer sum: uint8 keeps it modulo 256. */
static double wrap(enum dg_dtype dt, double v)
{
	return dt == DG_U8 ? fmod(v, 256) : v;
}

/* Run, check shape and values, free. */
static void check1(const char *op, const char *attrs, const struct dg_tensor *x, int ndim,
		   const int64_t *dims, const double *want)
{
	struct dg_tensor *y = ok1(op, attrs, x, x->dtype, ndim, dims);
	char what[160];

	snprintf(what, sizeof what, "%s %s %s", op, dg_dtype_name(x->dtype), attrs ? attrs : "");
	expect_vals(y, want, 1e-6, what);
	dg_tensor_free(y);
}

/* Run, require failure with code and a message containing each of frag[0..n). */
static void expect_err(const char *op, const char *attrs, const struct dg_tensor *x,
		       enum dg_status code, const char *f1, const char *f2)
{
	struct dg_tensor *out = NULL;
	struct dg_err err = { 0 };
	enum dg_status st = run1(op, attrs, x, &out, &err);

	cr_assert_eq(st, code, "%s %s: got %d (%s), want %d", op, attrs ? attrs : "", st,
		     err.msg, code);
	cr_assert_null(out, "%s: output must be NULL on error", op);
	if (f1)
		cr_assert(strstr(err.msg, f1), "message '%s' lacks '%s'", err.msg, f1);
	if (f2)
		cr_assert(strstr(err.msg, f2), "message '%s' lacks '%s'", err.msg, f2);
}

/* --- hand-computed values ------------------------------------------------------ */

Test(reduce, sum_of_a_2x3_matrix_over_each_axis_and_all)
{
	const double v[] = { 1, 2, 3, 4, 5, 6 };
	const int64_t d[] = { 2, 3 }, d3[] = { 3 }, d2[] = { 2 }, d13[] = { 1, 3 },
		      d21[] = { 2, 1 }, d11[] = { 1, 1 };

	for (int k = 0; k < N_DTYPES; k++) {
		struct dg_tensor *x = mk(all_dtypes[k], 2, d, v);
		check1("Sum", "{\"axis\": 0}", x, 1, d3, (double[]){ 5, 7, 9 });
		check1("Sum", "{\"axis\": 1}", x, 1, d2, (double[]){ 6, 15 });
		check1("Sum", "{\"axis\": -1}", x, 1, d2, (double[]){ 6, 15 });
		check1("Sum", "{\"axis\": -2}", x, 1, d3, (double[]){ 5, 7, 9 });
		check1("Sum", "{\"axis\": [0, 1]}", x, 0, NULL, (double[]){ 21 });
		check1("Sum", NULL, x, 0, NULL, (double[]){ 21 });
		check1("Sum", "{\"axis\": null}", x, 0, NULL, (double[]){ 21 });
		check1("Sum", "{\"axis\": 0, \"keepdims\": true}", x, 2, d13,
		       (double[]){ 5, 7, 9 });
		check1("Sum", "{\"axis\": [1], \"keepdims\": true}", x, 2, d21,
		       (double[]){ 6, 15 });
		check1("Sum", "{\"keepdims\": true}", x, 2, d11, (double[]){ 21 });
		check1("Sum", "{\"axis\": 1, \"keep_dims\": true}", x, 2, d21,
		       (double[]){ 6, 15 });
		dg_tensor_free(x);
	}
}

Test(reduce, mean_max_min_of_every_dtype_over_each_axis)
{
	const double v[] = { 1, 5, 3, 4, 2, 6 };
	const int64_t d[] = { 2, 3 }, d3[] = { 3 }, d2[] = { 2 }, d12[] = { 1, 2 };

	for (int k = 0; k < N_DTYPES; k++) {
		struct dg_tensor *x = mk(all_dtypes[k], 2, d, v);
		bool fl = dg_dtype_is_float(all_dtypes[k]);
		check1("Mean", "{\"axis\": 1}", x, 1, d2, (double[]){ 3, 4 });
		check1("Mean", "{\"axis\": 0}", x, 1, d3,
		       fl ? (double[]){ 2.5, 3.5, 4.5 } : (double[]){ 2, 3, 4 });
		check1("Mean", NULL, x, 0, NULL, fl ? (double[]){ 3.5 } : (double[]){ 3 });
		check1("Max", "{\"axis\": 0}", x, 1, d3, (double[]){ 4, 5, 6 });
		check1("Max", "{\"axis\": 1}", x, 1, d2, (double[]){ 5, 6 });
		check1("Max", NULL, x, 0, NULL, (double[]){ 6 });
		check1("Min", "{\"axis\": 0}", x, 1, d3, (double[]){ 1, 2, 3 });
		check1("Min", "{\"axis\": -1}", x, 1, d2, (double[]){ 1, 2 });
		check1("Min", NULL, x, 0, NULL, (double[]){ 1 });
		check1("Min", "{\"axis\": 0, \"keepdims\": true}", x, 2,
		       (int64_t[]){ 1, 3 }, (double[]){ 1, 2, 3 });
		check1("Max", "{\"axis\": 1, \"keepdims\": true}", x, 2, (int64_t[]){ 2, 1 },
		       (double[]){ 5, 6 });
		(void)d12;
		dg_tensor_free(x);
	}
}

Test(reduce, negative_values_and_signed_max_min)
{
	const double v[] = { -3, 7, -9, 2, 0, -1 };
	const int64_t d[] = { 6 };
	const enum dg_dtype sdt[] = { DG_F32, DG_F64, DG_I32, DG_I64 };

	for (int k = 0; k < 4; k++) {
		struct dg_tensor *x = mk(sdt[k], 1, d, v);
		check1("Max", NULL, x, 0, NULL, (double[]){ 7 });
		check1("Min", NULL, x, 0, NULL, (double[]){ -9 });
		check1("Sum", NULL, x, 0, NULL, (double[]){ -4 });
		dg_tensor_free(x);
	}
}

Test(reduce, several_axes_of_a_3d_tensor)
{
	/* x[i,j,k] = 12i + 4j + k, shape [2,3,4]. Over i and k: 32j + 60; over i and j:
	 * 60 + 6k; over j and k: 144i + 66; everything: 276. */
	const int64_t d[] = { 2, 3, 4 };

	for (int k = 0; k < N_DTYPES; k++) {
		struct dg_tensor *x = arange(all_dtypes[k], 3, d);
		const double s02[] = { 60, 92, 124 }, s01[] = { 60, 66, 72, 78 },
			     s12[] = { 66, 210 };
		check1("Sum", "{\"axis\": [0, 2]}", x, 1, (int64_t[]){ 3 }, s02);
		check1("Sum", "{\"axis\": [2, 0]}", x, 1, (int64_t[]){ 3 }, s02);
		check1("Sum", "{\"axis\": [-1, -3]}", x, 1, (int64_t[]){ 3 }, s02);
		check1("Sum", "{\"axis\": [0, 2], \"keepdims\": true}", x, 3,
		       (int64_t[]){ 1, 3, 1 }, s02);
		check1("Sum", "{\"axis\": [0, 1]}", x, 1, (int64_t[]){ 4 }, s01);
		check1("Sum", "{\"axis\": [1, 2]}", x, 1, (int64_t[]){ 2 }, s12);
		check1("Sum", "{\"axis\": [0, 1, 2]}", x, 0, NULL,
		       (double[]){ wrap(all_dtypes[k], 276) });
		/* Max over i and k: i = 1, k = 3 -> 12 + 4j + 3; Min: 4j. */
		check1("Max", "{\"axis\": [0, 2]}", x, 1, (int64_t[]){ 3 },
		       (double[]){ 15, 19, 23 });
		check1("Min", "{\"axis\": [0, 2]}", x, 1, (int64_t[]){ 3 }, (double[]){ 0, 4, 8 });
		check1("Max", "{\"axis\": 1}", x, 2, (int64_t[]){ 2, 4 },
		       (double[]){ 8, 9, 10, 11, 20, 21, 22, 23 });
		if (dg_dtype_is_float(all_dtypes[k]))
			check1("Mean", "{\"axis\": [0, 2]}", x, 1, (int64_t[]){ 3 },
			       (double[]){ 7.5, 11.5, 15.5 });
		else
			check1("Mean", "{\"axis\": [0, 2]}", x, 1, (int64_t[]){ 3 },
			       (double[]){ 7, 11, 15 });
		dg_tensor_free(x);
	}
}

Test(reduce, all_axes_of_1d_to_4d_inputs)
{
	const int64_t shapes[4][4] = { { 5 }, { 2, 3 }, { 2, 3, 4 }, { 2, 3, 2, 2 } };
	const int64_t ones[4] = { 1, 1, 1, 1 };

	for (int r = 1; r <= 4; r++) {
		for (int k = 0; k < N_DTYPES; k++) {
			struct dg_tensor *x = arange(all_dtypes[k], r, shapes[r - 1]);
			double n = (double)x->numel;
			bool fl = dg_dtype_is_float(all_dtypes[k]);
			double sum = wrap(all_dtypes[k], n * (n - 1) / 2);
			check1("Sum", NULL, x, 0, NULL, (double[]){ sum });
			check1("Max", NULL, x, 0, NULL, (double[]){ n - 1 });
			check1("Min", NULL, x, 0, NULL, (double[]){ 0 });
			/* Integer Mean divides the (wrapped) sum and truncates. */
			check1("Mean", NULL, x, 0, NULL,
			       (double[]){ fl ? (n - 1) / 2 : floor(sum / n) });
			check1("Sum", "{\"keepdims\": true}", x, r, ones, (double[]){ sum });
			dg_tensor_free(x);
		}
	}
}

Test(reduce, empty_axis_list_and_size_one_axes_pass_values_through)
{
	const double v[] = { 3, 1, 2 };
	const int64_t d[] = { 3, 1 }, d3[] = { 3 };
	struct dg_tensor *x = mk(DG_F32, 2, d, v);

	check1("Sum", "{\"axis\": []}", x, 2, d, v);
	check1("Max", "{\"axis\": []}", x, 2, d, v);
	check1("Sum", "{\"axis\": 1}", x, 1, d3, v);
	check1("Mean", "{\"axis\": 1}", x, 1, d3, v);
	check1("Min", "{\"axis\": -1, \"keepdims\": true}", x, 2, d, v);
	dg_tensor_free(x);
}

Test(reduce, scalar_input_reduces_to_itself)
{
	struct dg_tensor *x = mk(DG_I32, 0, NULL, (double[]){ 42 });

	check1("Sum", NULL, x, 0, NULL, (double[]){ 42 });
	check1("Max", "{\"axis\": []}", x, 0, NULL, (double[]){ 42 });
	check1("Mean", NULL, x, 0, NULL, (double[]){ 42 });
	expect_err("Sum", "{\"axis\": 0}", x, DG_EINVAL, "axis 0", "rank 0");
	dg_tensor_free(x);
}

/* --- against a naive double reference ---------------------------------------------- */

/* ref[out index] = reduce over the masked axes of x, in double, by walking every
 * input element and dropping the reduced coordinates. */
static void naive_reduce(const struct dg_tensor *x, unsigned mask, const char *op,
			 double *ref, int64_t n_out)
{
	int64_t *cnt = calloc((size_t)n_out, sizeof *cnt);
	int nd = x->shape.ndim;

	cr_assert_not_null(cnt);
	for (int64_t o = 0; o < n_out; o++)
		ref[o] = strcmp(op, "Max") == 0 ? -INFINITY : strcmp(op, "Min") == 0 ? INFINITY : 0;
	for (int64_t i = 0; i < x->numel; i++) {
		int64_t rem = i, o = 0, stride = 1;
		for (int d = nd - 1; d >= 0; d--) {
			int64_t c = rem % x->shape.dim[d];
			rem /= x->shape.dim[d];
			if (!(mask & (1u << d))) {
				o += c * stride;
				stride *= x->shape.dim[d];
			}
		}
		double v = dg_tensor_get_f64(x, i);
		if (strcmp(op, "Max") == 0)
			ref[o] = v > ref[o] ? v : ref[o];
		else if (strcmp(op, "Min") == 0)
			ref[o] = v < ref[o] ? v : ref[o];
		else
			ref[o] += v;
		cnt[o]++;
	}
	if (strcmp(op, "Mean") == 0)
		for (int64_t o = 0; o < n_out; o++)
			ref[o] /= (double)cnt[o];
	free(cnt);
}

/* The "axis" JSON for a mask, e.g. {"axis": [0, 3], "keepdims": true}. */
static void axes_json(unsigned mask, int nd, bool keep, bool negative, char *buf, size_t n)
{
	size_t len = (size_t)snprintf(buf, n, "{\"keepdims\": %s, \"axis\": [",
				      keep ? "true" : "false");
	bool first = true;

	for (int d = 0; d < nd; d++) {
		if (!(mask & (1u << d)))
			continue;
		len += (size_t)snprintf(buf + len, n - len, "%s%d", first ? "" : ", ",
					negative ? d - nd : d);
		first = false;
	}
	snprintf(buf + len, n - len, "]}");
}

static void compare_all_subsets(const struct dg_tensor *x, const char *op, double rel)
{
	int nd = x->shape.ndim;
	double *ref = malloc((size_t)x->numel * sizeof *ref);

	cr_assert_not_null(ref);
	for (unsigned mask = 0; mask < (1u << nd); mask++) {
		char attrs[160];
		struct dg_shape os = { .ndim = 0 };
		bool keep = mask % 3 == 1;
		for (int d = 0; d < nd; d++) {
			if (!(mask & (1u << d)))
				os.dim[os.ndim++] = x->shape.dim[d];
			else if (keep)
				os.dim[os.ndim++] = 1;
		}
		int64_t n_out = 1;
		for (int d = 0; d < os.ndim; d++)
			n_out *= os.dim[d];
		axes_json(mask, nd, keep, mask % 2 == 0, attrs, sizeof attrs);
		naive_reduce(x, mask, op, ref, n_out);
		struct dg_tensor *y = ok1(op, attrs, x, x->dtype, os.ndim, os.dim);
		char what[200];
		snprintf(what, sizeof what, "%s %s %s", op, dg_dtype_name(x->dtype), attrs);
		expect_vals(y, ref, rel, what);
		dg_tensor_free(y);
	}
	free(ref);
}

Test(reduce, every_axis_subset_of_a_random_5d_tensor_matches_a_double_reference)
{
	const int64_t d[] = { 3, 4, 5, 2, 6 };
	const char *ops[] = { "Sum", "Mean", "Max", "Min" };
	struct dg_tensor *xf = mk(DG_F32, 5, d, NULL), *xd = mk(DG_F64, 5, d, NULL);
	struct dg_tensor *xi = mk(DG_I32, 5, d, NULL);

	srand(7);
	for (int64_t i = 0; i < xf->numel; i++) {
		/* Positive floats, so a relative tolerance on sums is meaningful. */
		double v = (double)rand() / RAND_MAX + 0.1;
		dg_tensor_set_f64(xf, i, (float)v);
		dg_tensor_set_f64(xd, i, v);
		dg_tensor_set_f64(xi, i, (double)(rand() % 2001 - 1000));
	}
	for (int k = 0; k < 4; k++) {
		compare_all_subsets(xf, ops[k], 2e-6);
		compare_all_subsets(xd, ops[k], 1e-13);
		if (strcmp(ops[k], "Mean") != 0)
			compare_all_subsets(xi, ops[k], 0);
	}
	dg_tensor_free(xf);
	dg_tensor_free(xd);
	dg_tensor_free(xi);
}

Test(reduce, eight_dimensional_input_matches_a_double_reference)
{
	const int64_t d[] = { 2, 1, 3, 2, 1, 2, 3, 2 };
	struct dg_tensor *x = mk(DG_F64, 8, d, NULL);
	double *ref = malloc(144 * sizeof *ref);
	const unsigned masks[] = { 0xA5, 0x5A, 0x81, 0x7E, 0xFF, 0x01, 0x80, 0x12 };

	for (int64_t i = 0; i < x->numel; i++)
		dg_tensor_set_f64(x, i, (double)((i * 37) % 101) - 50.0);
	for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
		const char *ops[] = { "Sum", "Max", "Min", "Mean" };
		for (int k = 0; k < 4; k++) {
			char attrs[160];
			struct dg_shape os = { .ndim = 0 };
			int64_t n_out = 1;
			for (int a = 0; a < 8; a++)
				if (!(masks[m] & (1u << a))) {
					os.dim[os.ndim++] = d[a];
					n_out *= d[a];
				}
			axes_json(masks[m], 8, false, m % 2 == 1, attrs, sizeof attrs);
			naive_reduce(x, masks[m], ops[k], ref, n_out);
			struct dg_tensor *y = ok1(ops[k], attrs, x, DG_F64, os.ndim, os.dim);
			expect_vals(y, ref, 1e-12, attrs);
			dg_tensor_free(y);
		}
	}
	free(ref);
	dg_tensor_free(x);
}

Test(reduce, float32_sum_of_many_values_is_accurate)
{
	/* 2^20 values: a serial float accumulator would drift by ~1e-3 relative; the
	 * blocked lanes stay within a few 1e-7. Both the flat path and the column path
	 * ([2^18, 4] over axis 0) are checked. */
	const int64_t n = (int64_t)1 << 20, d2[] = { n / 4, 4 };
	struct dg_tensor *x = mk(DG_F32, 1, &n, NULL), *y;
	double want = 0, col[4] = { 0 };
	float *p = x->data;

	for (int64_t i = 0; i < n; i++) {
		p[i] = 0.1f + (float)(i % 1000) * 1e-3f;
		want += p[i];
		col[i % 4] += p[i];
	}
	y = ok1("Sum", NULL, x, DG_F32, 0, NULL);
	cr_assert(fabs(dg_tensor_get_f64(y, 0) - want) <= 1e-6 * want, "sum %.9g, want %.9g",
		  dg_tensor_get_f64(y, 0), want);
	dg_tensor_free(y);
	y = ok1("Mean", NULL, x, DG_F32, 0, NULL);
	cr_assert(fabs(dg_tensor_get_f64(y, 0) - want / (double)n) <= 1e-6 * want / (double)n);
	dg_tensor_free(y);
	x->shape = dg_shape_make(2, d2);
	y = ok1("Sum", "{\"axis\": 0}", x, DG_F32, 1, (int64_t[]){ 4 });
	expect_vals(y, col, 1e-6, "column sums");
	dg_tensor_free(y);
	dg_tensor_free(x);
}

/* --- empty inputs, NaN, integers -------------------------------------------------------- */

Test(reduce, empty_inputs_follow_the_documented_rules)
{
	const int64_t d0[] = { 0 }, d30[] = { 3, 0 }, d03[] = { 0, 3 }, d3[] = { 3 };
	struct dg_tensor *e = mk(DG_F32, 1, d0, NULL), *a = mk(DG_F64, 2, d30, NULL);
	struct dg_tensor *b = mk(DG_I32, 2, d03, NULL), *ai = mk(DG_I64, 2, d30, NULL);
	struct dg_tensor *y;

	check1("Sum", NULL, e, 0, NULL, (double[]){ 0 });
	check1("Mean", NULL, e, 0, NULL, (double[]){ NAN });
	check1("Sum", "{\"axis\": 1}", a, 1, d3, (double[]){ 0, 0, 0 });
	check1("Mean", "{\"axis\": 1}", a, 1, d3, (double[]){ NAN, NAN, NAN });
	check1("Sum", "{\"axis\": 1}", ai, 1, d3, (double[]){ 0, 0, 0 });
	check1("Sum", "{\"axis\": 0}", b, 1, d3, (double[]){ 0, 0, 0 });
	/* Reducing the non-empty axis of [0,3] leaves an empty result: nothing to fail. */
	y = ok1("Max", "{\"axis\": 1}", b, DG_I32, 1, d0);
	dg_tensor_free(y);
	y = ok1("Mean", "{\"axis\": 1}", b, DG_I32, 1, d0);
	dg_tensor_free(y);
	y = ok1("Sum", "{\"axis\": 1, \"keepdims\": true}", b, DG_I32, 2, (int64_t[]){ 0, 1 });
	dg_tensor_free(y);
	expect_err("Max", NULL, e, DG_EINVAL, "cannot take Max over an empty axis", "[0]");
	expect_err("Min", "{\"axis\": 1}", a, DG_EINVAL, "cannot take Min over an empty axis",
		   "[3,0]");
	expect_err("Max", "{\"axis\": 0}", b, DG_EINVAL, "empty axis", NULL);
	expect_err("Mean", "{\"axis\": 1}", ai, DG_EINVAL, "Mean", "empty axis");
	expect_err("ArgMax", "{\"axis\": 1}", a, DG_EINVAL, "ArgMax", "empty axis");
	dg_tensor_free(e);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(ai);
}

Test(reduce, nan_propagates_through_max_min_and_sum)
{
	/* NaN at the start, inside the vector lanes and in the scalar tail. */
	const int64_t n = 37;
	const int64_t pos[] = { 0, 5, 20, 36 };

	for (int dk = 0; dk < 2; dk++) {
		for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
			struct dg_tensor *x = mk(dk ? DG_F64 : DG_F32, 1, &n, NULL);
			for (int64_t i = 0; i < n; i++)
				dg_tensor_set_f64(x, i, (double)(i % 7) - 3.0);
			dg_tensor_set_f64(x, pos[p], NAN);
			check1("Max", NULL, x, 0, NULL, (double[]){ NAN });
			check1("Min", NULL, x, 0, NULL, (double[]){ NAN });
			check1("Sum", NULL, x, 0, NULL, (double[]){ NAN });
			check1("Mean", NULL, x, 0, NULL, (double[]){ NAN });
			dg_tensor_free(x);
		}
	}
	/* Column path: NaN only in column 1 of [3, 2] over axis 0. */
	struct dg_tensor *c = mk(DG_F32, 2, (int64_t[]){ 3, 2 },
				 (double[]){ 1, 2, 5, NAN, -1, 4 });
	check1("Max", "{\"axis\": 0}", c, 1, (int64_t[]){ 2 }, (double[]){ 5, NAN });
	check1("Min", "{\"axis\": 0}", c, 1, (int64_t[]){ 2 }, (double[]){ -1, NAN });
	dg_tensor_free(c);
	/* Infinities are ordinary values. */
	struct dg_tensor *f = mk(DG_F32, 1, (int64_t[]){ 3 }, (double[]){ -INFINITY, 1, INFINITY });
	check1("Max", NULL, f, 0, NULL, (double[]){ INFINITY });
	check1("Min", NULL, f, 0, NULL, (double[]){ -INFINITY });
	check1("Sum", NULL, f, 0, NULL, (double[]){ NAN });
	dg_tensor_free(f);
}

Test(reduce, integer_sums_wrap_around)
{
	struct dg_tensor *a = mk(DG_I32, 1, (int64_t[]){ 2 }, (double[]){ INT32_MAX, 1 });
	struct dg_tensor *b = mk(DG_I32, 1, (int64_t[]){ 2 }, (double[]){ INT32_MIN, -1 });
	struct dg_tensor *c = mk(DG_U8, 1, (int64_t[]){ 2 }, (double[]){ 200, 100 });
	struct dg_tensor *d = mk(DG_I64, 1, (int64_t[]){ 2 }, NULL);
	struct dg_tensor *e = mk(DG_I32, 2, (int64_t[]){ 2, 1 }, (double[]){ INT32_MAX, 2 });
	struct dg_tensor *f = mk(DG_I32, 2, (int64_t[]){ 2, 2 },
				 (double[]){ INT32_MAX, 5, 3, 7 });

	((int64_t *)d->data)[0] = INT64_MAX;
	((int64_t *)d->data)[1] = 1;
	check1("Sum", NULL, a, 0, NULL, (double[]){ INT32_MIN });
	check1("Sum", NULL, b, 0, NULL, (double[]){ INT32_MAX });
	check1("Sum", NULL, c, 0, NULL, (double[]){ 44 });
	struct dg_tensor *y = ok1("Sum", NULL, d, DG_I64, 0, NULL);
	cr_assert_eq(((int64_t *)y->data)[0], INT64_MIN);
	dg_tensor_free(y);
	check1("Sum", "{\"axis\": 0}", e, 1, (int64_t[]){ 1 }, (double[]){ INT32_MIN + 1.0 });
	/* Column path over axis 0 of [2, 2]. */
	check1("Sum", "{\"axis\": 0}", f, 1, (int64_t[]){ 2 }, (double[]){ INT32_MIN + 2.0, 12 });
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(c);
	dg_tensor_free(d);
	dg_tensor_free(e);
	dg_tensor_free(f);
}

Test(reduce, integer_mean_truncates_toward_zero)
{
	struct dg_tensor *a = mk(DG_I32, 1, (int64_t[]){ 2 }, (double[]){ 1, 2 });
	struct dg_tensor *b = mk(DG_I32, 1, (int64_t[]){ 2 }, (double[]){ -1, -2 });
	struct dg_tensor *c = mk(DG_I64, 2, (int64_t[]){ 2, 3 }, (double[]){ 7, 0, 0, -7, 0, 1 });
	struct dg_tensor *d = mk(DG_U8, 1, (int64_t[]){ 2 }, (double[]){ 255, 255 });

	check1("Mean", NULL, a, 0, NULL, (double[]){ 1 });
	check1("Mean", NULL, b, 0, NULL, (double[]){ -1 });
	check1("Mean", "{\"axis\": 1}", c, 1, (int64_t[]){ 2 }, (double[]){ 2, -2 });
	check1("Mean", "{\"axis\": 0}", c, 1, (int64_t[]){ 3 }, (double[]){ 0, 0, 0 });
	/* uint8: the sum wraps first (510 mod 256 = 254), as TensorFlow's does. */
	check1("Mean", NULL, d, 0, NULL, (double[]){ 127 });
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(c);
	dg_tensor_free(d);
}

/* --- errors ----------------------------------------------------------------------------- */

Test(reduce, bad_axes_are_rejected_naming_axis_and_rank)
{
	struct dg_tensor *x = arange(DG_F32, 2, (int64_t[]){ 2, 3 });
	struct dg_tensor *bx = mk(DG_BOOL, 1, (int64_t[]){ 2 }, NULL);

	expect_err("Sum", "{\"axis\": 2}", x, DG_EINVAL, "axis 2", "rank 2");
	expect_err("Mean", "{\"axis\": -3}", x, DG_EINVAL, "axis -3", "rank 2");
	expect_err("Max", "{\"axis\": [0, 5]}", x, DG_EINVAL, "axis 5", "rank 2");
	expect_err("Sum", "{\"axis\": [1, 1]}", x, DG_EINVAL, "axis 1", "twice");
	expect_err("Min", "{\"axis\": [1, -1]}", x, DG_EINVAL, "axis -1", "rank 2");
	expect_err("Sum", "{\"axis\": \"1\"}", x, DG_EINVAL, "attr 'axis'", "string");
	expect_err("Sum", "{\"axis\": [0, 1.5]}", x, DG_EINVAL, "attr 'axis'[1]", NULL);
	expect_err("Sum", "{\"axis\": [0,1,0,1,0,1,0,1,0]}", x, DG_EINVAL, "9 axes", NULL);
	expect_err("Sum", "{\"keepdims\": 1}", x, DG_EINVAL, "keepdims", NULL);
	expect_err("Sum", "{\"keepdims\": true, \"keep_dims\": false}", x, DG_EINVAL,
		   "disagree", NULL);
	expect_err("Sum", "{\"axes\": 1}", x, DG_EINVAL, "axes", NULL);
	expect_err("Sum", NULL, bx, DG_EDTYPE, "Sum", "bool");
	expect_err("ArgMax", NULL, bx, DG_EDTYPE, "ArgMax", "bool");
	dg_tensor_free(x);
	dg_tensor_free(bx);
}

/* --- ArgMax ------------------------------------------------------------------------------ */

Test(reduce, argmax_picks_the_first_of_equal_maxima)
{
	const double v[] = { 1, 5, 5, 7, 2, 7 };
	const int64_t d[] = { 2, 3 };

	for (int k = 0; k < N_DTYPES; k++) {
		struct dg_tensor *x = mk(all_dtypes[k], 2, d, v), *y;
		y = ok1("ArgMax", "{\"axis\": 1}", x, DG_I64, 1, (int64_t[]){ 2 });
		expect_vals(y, (double[]){ 1, 0 }, 0, "argmax axis 1");
		dg_tensor_free(y);
		y = ok1("ArgMax", "{\"axis\": -1, \"output_type\": \"int32\"}", x, DG_I32, 1,
			(int64_t[]){ 2 });
		expect_vals(y, (double[]){ 1, 0 }, 0, "argmax axis -1 int32");
		dg_tensor_free(y);
		y = ok1("ArgMax", NULL, x, DG_I64, 1, (int64_t[]){ 3 });
		expect_vals(y, (double[]){ 1, 0, 1 }, 0, "argmax default axis 0");
		dg_tensor_free(y);
		dg_tensor_free(x);
	}
}

Test(reduce, argmax_of_a_middle_axis_and_of_a_long_row)
{
	/* x[i,j,k] = 12i + 4j + k with j reversed in row i = 1: argmax over j is 2 for
	 * i = 0 and 0 for i = 1. */
	struct dg_tensor *x = arange(DG_F32, 3, (int64_t[]){ 2, 3, 4 }), *y;
	float *p = x->data;
	for (int k = 0; k < 4; k++) {
		float t = p[12 + k];
		p[12 + k] = p[12 + 8 + k];
		p[12 + 8 + k] = t;
	}
	y = ok1("ArgMax", "{\"axis\": 1, \"output_type\": \"int32\"}", x, DG_I32, 2,
		(int64_t[]){ 2, 4 });
	expect_vals(y, (double[]){ 2, 2, 2, 2, 0, 0, 0, 0 }, 0, "argmax middle");
	dg_tensor_free(y);
	dg_tensor_free(x);

	const int64_t n = 1000;
	struct dg_tensor *r = mk(DG_I64, 1, &n, NULL);
	int64_t at = -1;
	for (int64_t i = 0; i < n; i++) {
		((int64_t *)r->data)[i] = (i * 7919) % 1000;   /* a permutation of 0..999 */
		if ((i * 7919) % 1000 == 999)
			at = i;
	}
	cr_assert_eq(at, 321);    /* 321 * 7919 = 2541999 */
	y = ok1("ArgMax", NULL, r, DG_I64, 0, NULL);
	cr_assert_eq(((int64_t *)y->data)[0], 321);
	dg_tensor_free(y);
	dg_tensor_free(r);
}

Test(reduce, argmax_treats_nan_as_the_maximum_first_nan_wins)
{
	struct dg_tensor *x = mk(DG_F64, 2, (int64_t[]){ 2, 4 },
				 (double[]){ 1, NAN, 3, NAN, 9, 2, 8, 1 });
	struct dg_tensor *c = mk(DG_F32, 2, (int64_t[]){ 3, 2 },
				 (double[]){ 1, 5, NAN, 6, 9, NAN });
	struct dg_tensor *y;

	y = ok1("ArgMax", "{\"axis\": 1}", x, DG_I64, 1, (int64_t[]){ 2 });
	expect_vals(y, (double[]){ 1, 0 }, 0, "argmax nan rows");
	dg_tensor_free(y);
	y = ok1("ArgMax", "{\"axis\": 0}", c, DG_I64, 1, (int64_t[]){ 2 });
	expect_vals(y, (double[]){ 1, 2 }, 0, "argmax nan columns");
	dg_tensor_free(y);
	dg_tensor_free(x);
	dg_tensor_free(c);
}

Test(reduce, argmax_rejects_bad_attrs)
{
	struct dg_tensor *x = arange(DG_F32, 2, (int64_t[]){ 2, 3 });
	struct dg_tensor *s = mk(DG_F32, 0, NULL, (double[]){ 1 });

	expect_err("ArgMax", "{\"axis\": 2}", x, DG_EINVAL, "axis 2", "rank 2");
	expect_err("ArgMax", "{\"output_type\": \"float32\"}", x, DG_EDTYPE, "int32 or int64",
		   "float32");
	expect_err("ArgMax", "{\"axis\": [1]}", x, DG_EINVAL, "axis", NULL);
	expect_err("ArgMax", NULL, s, DG_EINVAL, "rank 0", NULL);
	dg_tensor_free(x);
	dg_tensor_free(s);
}

/* --- inference ------------------------------------------------------------------------------ */

/* Run op's infer on one input type; returns the status and fills *out. */
static enum dg_status infer1(const char *op, const char *attrs, enum dg_dtype dt,
			     struct dg_shape in, struct dg_ttype *out, struct dg_err *err)
{
	const struct dg_op_def *def = dg_op_find(op);
	struct dg_ttype t = { .dtype = dt, .shape = in };
	json_t *j = json_loads(attrs ? attrs : "{}", 0, NULL);
	struct dg_infer_ctx c = { .attrs = j, .n_in = 1, .in = &t, .n_out = 1, .out = out,
				  .err = err };
	enum dg_status st;

	cr_assert_not_null(def);
	cr_assert_not_null(j, "bad JSON in test: %s", attrs);
	st = def->infer(&c);
	json_decref(j);
	return st;
}

static void expect_shape(const struct dg_shape *s, const char *want)
{
	char buf[128];

	dg_shape_format(s, buf, sizeof buf);
	cr_assert_str_eq(buf, want);
}

Test(reduce, inference_propagates_unknown_dims_and_rank)
{
	const int64_t d[] = { -1, 3, 4 };
	struct dg_shape s = dg_shape_make(3, d), unk = { .ndim = -1 };
	struct dg_ttype o;
	struct dg_err err = { 0 };

	cr_assert_eq(infer1("Sum", "{\"axis\": 1}", DG_F32, s, &o, &err), DG_OK, "%s", err.msg);
	expect_shape(&o.shape, "[?,4]");
	cr_assert_eq(o.dtype, DG_F32);
	cr_assert_eq(infer1("Mean", "{\"axis\": 1, \"keepdims\": true}", DG_I32, s, &o, &err),
		     DG_OK);
	expect_shape(&o.shape, "[?,1,4]");
	cr_assert_eq(o.dtype, DG_I32);
	cr_assert_eq(infer1("Max", NULL, DG_F64, s, &o, &err), DG_OK);
	expect_shape(&o.shape, "[]");
	cr_assert_eq(infer1("Min", "{\"axis\": [0, -1]}", DG_U8, s, &o, &err), DG_OK);
	expect_shape(&o.shape, "[3]");
	cr_assert_eq(infer1("Sum", NULL, DG_F32, unk, &o, &err), DG_OK);
	expect_shape(&o.shape, "[]");
	cr_assert_eq(infer1("Sum", "{\"axis\": 0}", DG_F32, unk, &o, &err), DG_OK);
	cr_assert_eq(o.shape.ndim, -1);
	cr_assert_eq(infer1("Sum", "{\"keepdims\": true}", DG_F32, unk, &o, &err), DG_OK);
	cr_assert_eq(o.shape.ndim, -1);
	cr_assert_eq(infer1("ArgMax", "{\"axis\": 1}", DG_F32, s, &o, &err), DG_OK);
	expect_shape(&o.shape, "[?,4]");
	cr_assert_eq(o.dtype, DG_I64);
	cr_assert_eq(infer1("ArgMax", "{\"output_type\": \"int32\"}", DG_F32, unk, &o, &err),
		     DG_OK);
	cr_assert_eq(o.shape.ndim, -1);
	cr_assert_eq(o.dtype, DG_I32);
}

Test(reduce, inference_rejects_what_is_certainly_wrong)
{
	struct dg_shape s = dg_shape_make(2, (int64_t[]){ -1, 3 });
	struct dg_shape e = dg_shape_make(2, (int64_t[]){ 2, 0 });
	struct dg_shape eu = dg_shape_make(2, (int64_t[]){ -1, 0 });
	struct dg_shape unk = { .ndim = -1 };
	struct dg_ttype o;
	struct dg_err err = { 0 };

	cr_assert_eq(infer1("Sum", "{\"axis\": 2}", DG_F32, s, &o, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "axis 2") && strstr(err.msg, "rank 2"), "%s", err.msg);
	cr_assert_eq(infer1("Sum", "{\"axis\": [0, -2]}", DG_F32, s, &o, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "twice"), "%s", err.msg);
	cr_assert_eq(infer1("Sum", "{\"axis\": [3, 3]}", DG_F32, unk, &o, &err), DG_EINVAL);
	cr_assert_eq(infer1("Sum", NULL, DG_BOOL, s, &o, &err), DG_EDTYPE);
	cr_assert_eq(infer1("Max", "{\"axis\": 1}", DG_F32, e, &o, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "empty axis"), "%s", err.msg);
	/* The output's size is unknown, so it may be empty: not certainly wrong. */
	cr_assert_eq(infer1("Max", "{\"axis\": 1}", DG_F32, eu, &o, &err), DG_OK);
	cr_assert_eq(infer1("Sum", "{\"axis\": 1}", DG_F32, e, &o, &err), DG_OK);
	cr_assert_eq(infer1("Mean", "{\"axis\": 1}", DG_I32, e, &o, &err), DG_EINVAL);
	cr_assert_eq(infer1("ArgMax", "{\"axis\": 1}", DG_F32, e, &o, &err), DG_EINVAL);
	cr_assert_eq(infer1("ArgMax", "{\"axis\": -3}", DG_F32, s, &o, &err), DG_EINVAL);
}
