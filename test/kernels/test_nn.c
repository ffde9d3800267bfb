/* Tests of Softmax, LogSoftmax and the softmax cross-entropy losses
 * (kernels/cpu/nn.c) through the registry: hand-computed values, identities
 * (rows sum to 1, LogSoftmax = log Softmax, axis 0 = transposed last axis, sparse
 * = dense with one-hot labels), huge logits, non-finite rows, a double-precision
 * reference, errors with their messages, and shape inference. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dg/kernels.h"

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

/* Uniform values in [lo, hi), reproducible. */
static struct dg_tensor *rnd(enum dg_dtype dt, int ndim, const int64_t *dims, double lo,
			     double hi, unsigned seed)
{
	struct dg_tensor *t = mk(dt, ndim, dims, NULL);

	srand(seed);
	for (int64_t i = 0; i < t->numel; i++)
		dg_tensor_set_f64(t, i, lo + (hi - lo) * rand() / ((double)RAND_MAX + 1));
	return t;
}

static enum dg_status run(const char *op, const char *attrs, const struct dg_tensor *a,
			  const struct dg_tensor *b, struct dg_tensor **out, struct dg_err *err)
{
	const struct dg_tensor *in[2] = { a, b };
	json_t *j = attrs ? json_loads(attrs, 0, NULL) : NULL;
	const struct dg_op_def *def = dg_op_find(op);
	enum dg_status st;

	cr_assert_not_null(def, "op %s is not registered", op);
	cr_assert(!attrs || j, "bad JSON in test: %s", attrs);
	st = dg_op_run(def, j, in, b ? 2 : 1, out, 1, 0, err);
	json_decref(j);
	return st;
}

/* Run, require success and an output of x's dtype with shape want[0..ndim). */
static struct dg_tensor *ok(const char *op, const char *attrs, const struct dg_tensor *a,
			    const struct dg_tensor *b, int ndim, const int64_t *want)
{
	struct dg_tensor *out = NULL;
	struct dg_err err = { 0 };
	enum dg_status st = run(op, attrs, a, b, &out, &err);

	cr_assert_eq(st, DG_OK, "%s %s: %s", op, attrs ? attrs : "", err.msg);
	cr_assert_eq(out->dtype, a->dtype);
	cr_assert_eq(out->shape.ndim, ndim, "%s: rank %d, want %d", op, out->shape.ndim, ndim);
	for (int i = 0; i < ndim; i++)
		cr_assert_eq(out->shape.dim[i], want[i], "%s: dim %d is %lld, want %lld", op, i,
			     (long long)out->shape.dim[i], (long long)want[i]);
	return out;
}

static void expect_vals(const struct dg_tensor *t, const double *want, double tol,
			const char *what)
{
	for (int64_t i = 0; i < t->numel; i++) {
		double got = dg_tensor_get_f64(t, i);
		if (isnan(want[i]))
			cr_assert(isnan(got), "%s[%lld]: got %g, want nan", what, (long long)i,
				  got);
		else if (isinf(want[i]))
			cr_assert_eq(got, want[i], "%s[%lld]: got %g, want %g", what, (long long)i,
				     got, want[i]);
		else
			cr_assert(fabs(got - want[i]) <= tol * (1.0 + fabs(want[i])),
				  "%s[%lld]: got %.9g, want %.9g", what, (long long)i, got,
				  want[i]);
	}
}

static void expect_err(const char *op, const char *attrs, const struct dg_tensor *a,
		       const struct dg_tensor *b, enum dg_status code, const char *f1,
		       const char *f2)
{
	struct dg_tensor *out = NULL;
	struct dg_err err = { 0 };
	enum dg_status st = run(op, attrs, a, b, &out, &err);

	cr_assert_eq(st, code, "%s: got %d (%s), want %d", op, st, err.msg, code);
	cr_assert_null(out);
	if (f1)
		cr_assert(strstr(err.msg, f1), "message '%s' lacks '%s'", err.msg, f1);
	if (f2)
		cr_assert(strstr(err.msg, f2), "message '%s' lacks '%s'", err.msg, f2);
}

/* --- Softmax / LogSoftmax --------------------------------------------------------- */

Test(nn, softmax_and_log_softmax_of_small_rows_match_hand_values)
{
	/* softmax(1,2,3) = e^i / (e + e^2 + e^3); log-softmax = i - 3.40760596. */
	const double v[] = { 1, 2, 3, 0, 0, 0 };
	const int64_t d[] = { 2, 3 };
	const double sm[] = { 0.0900305732, 0.244728471, 0.665240956, 1. / 3, 1. / 3, 1. / 3 };
	const double lsm[] = { -2.40760596, -1.40760596, -0.407605964, -1.09861229, -1.09861229,
			       -1.09861229 };

	for (int k = 0; k < 2; k++) {
		struct dg_tensor *x = mk(k ? DG_F64 : DG_F32, 2, d, v), *y;
		y = ok("Softmax", NULL, x, NULL, 2, d);
		expect_vals(y, sm, 1e-7, "softmax");
		dg_tensor_free(y);
		y = ok("LogSoftmax", "{\"axis\": -1}", x, NULL, 2, d);
		expect_vals(y, lsm, 1e-7, "log_softmax");
		dg_tensor_free(y);
		y = ok("Softmax", "{\"axis\": 0}", x, NULL, 2, d);
		/* Columns (1,0), (2,0), (3,0): e^a / (e^a + 1). */
		expect_vals(y, (double[]){ 0.731058579, 0.880797078, 0.952574127, 0.268941421,
					   0.119202922, 0.0474258732 }, 1e-7, "softmax axis 0");
		dg_tensor_free(y);
		dg_tensor_free(x);
	}
}

Test(nn, softmax_rows_sum_to_one_and_log_softmax_is_its_log)
{
	const int64_t d[] = { 37, 129 };

	for (int k = 0; k < 2; k++) {
		struct dg_tensor *x = rnd(k ? DG_F64 : DG_F32, 2, d, -20, 20, 3);
		struct dg_tensor *s = ok("Softmax", NULL, x, NULL, 2, d);
		struct dg_tensor *l = ok("LogSoftmax", NULL, x, NULL, 2, d);
		for (int64_t r = 0; r < d[0]; r++) {
			double sum = 0;
			for (int64_t c = 0; c < d[1]; c++) {
				double p = dg_tensor_get_f64(s, r * d[1] + c);
				double lp = dg_tensor_get_f64(l, r * d[1] + c);
				cr_assert(p >= 0 && p <= 1, "p = %g", p);
				sum += p;
				/* Where p is not tiny, log(p) and lp agree to float precision. */
				if (p > 1e-30)
					cr_assert(fabs(log(p) - lp) <= 1e-5 * (1 + fabs(lp)),
						  "log %g vs %g", log(p), lp);
			}
			cr_assert(fabs(sum - 1) <= (k ? 1e-14 : 1e-6), "row %lld sums to %.9g",
				  (long long)r, sum);
		}
		dg_tensor_free(s);
		dg_tensor_free(l);
		dg_tensor_free(x);
	}
}

/* softmax / log-softmax of one row in double, for reference. */
static void ref_row(const double *x, int64_t n, int64_t stride, double *sm, double *lsm)
{
	double m = -INFINITY, s = 0;

	for (int64_t i = 0; i < n; i++)
		m = fmax(m, x[i * stride]);
	for (int64_t i = 0; i < n; i++)
		s += exp(x[i * stride] - m);
	for (int64_t i = 0; i < n; i++) {
		sm[i * stride] = exp(x[i * stride] - m) / s;
		lsm[i * stride] = x[i * stride] - m - log(s);
	}
}

Test(nn, float32_softmax_matches_a_double_reference)
{
	/* Logits spread over [-60, 60] so that exps span many binades, including
	 * denormal results. The float path rounds x - max to float (an absolute error
	 * up to ulp(|x - max|) / 2, i.e. a relative error of e^(x - max) near
	 * |x - max| * 6e-8) and then adds a few ulps: the tolerance says so. */
	const int64_t d[] = { 16, 1000 };
	struct dg_tensor *x = rnd(DG_F32, 2, d, -60, 60, 11), *s, *l;
	double *xd = malloc(16000 * sizeof *xd), *sm = malloc(16000 * sizeof *sm);
	double *lsm = malloc(16000 * sizeof *lsm);

	for (int64_t i = 0; i < x->numel; i++)
		xd[i] = dg_tensor_get_f64(x, i);
	for (int64_t r = 0; r < d[0]; r++)
		ref_row(xd + r * d[1], d[1], 1, sm + r * d[1], lsm + r * d[1]);
	s = ok("Softmax", NULL, x, NULL, 2, d);
	l = ok("LogSoftmax", NULL, x, NULL, 2, d);
	for (int64_t i = 0; i < x->numel; i++) {
		double p = dg_tensor_get_f64(s, i), lp = dg_tensor_get_f64(l, i);
		double tol = sm[i] * 6e-8 * (fabs(lsm[i]) + 10);
		cr_assert(fabs(p - sm[i]) <= tol + 1e-44, "softmax[%lld] %.9g vs %.9g",
			  (long long)i, p, sm[i]);
		cr_assert(fabs(lp - lsm[i]) <= 1e-6 * (1 + fabs(lsm[i])),
			  "log_softmax[%lld] %.9g vs %.9g", (long long)i, lp, lsm[i]);
	}
	dg_tensor_free(s);
	dg_tensor_free(l);
	dg_tensor_free(x);
	free(xd);
	free(sm);
	free(lsm);
}

Test(nn, large_logits_do_not_overflow)
{
	const double v[] = { 1000, -1000, 0, 1000, 1000, 990 };
	const int64_t d[] = { 2, 3 };

	for (int k = 0; k < 2; k++) {
		struct dg_tensor *x = mk(k ? DG_F64 : DG_F32, 2, d, v), *y;
		y = ok("Softmax", NULL, x, NULL, 2, d);
		/* Row 2: e^-10 / (2 + e^-10) = 2.26994e-5; the others (1 - that) / 2. */
		expect_vals(y, (double[]){ 1, 0, 0, 0.49998865, 0.49998865, 2.26994496e-5 }, 1e-6,
			    "softmax");
		dg_tensor_free(y);
		y = ok("LogSoftmax", NULL, x, NULL, 2, d);
		expect_vals(y, (double[]){ 0, -2000, -1000, -0.69316988, -0.69316988,
					   -10.69316988 }, 1e-6, "log_softmax");
		dg_tensor_free(y);
		dg_tensor_free(x);
	}
}

Test(nn, non_finite_rows_follow_the_max_subtracted_math)
{
	/* Row 0 all -inf: -inf - -inf = NaN. Row 1 holds NaN. Row 2 holds +inf:
	 * inf - inf = NaN. Row 3: a -inf entry in a finite row gets 0 / -inf. */
	const double v[] = { -INFINITY, -INFINITY, 1, NAN, INFINITY, 1, 0, -INFINITY };
	const int64_t d[] = { 4, 2 };
	const double want_sm[] = { NAN, NAN, NAN, NAN, NAN, NAN, 1, 0 };
	const double want_lsm[] = { NAN, NAN, NAN, NAN, NAN, NAN, 0, -INFINITY };

	for (int k = 0; k < 2; k++) {
		struct dg_tensor *x = mk(k ? DG_F64 : DG_F32, 2, d, v), *y;
		y = ok("Softmax", NULL, x, NULL, 2, d);
		expect_vals(y, want_sm, 0, "softmax non-finite rows");
		dg_tensor_free(y);
		y = ok("LogSoftmax", NULL, x, NULL, 2, d);
		expect_vals(y, want_lsm, 0, "log_softmax non-finite rows");
		dg_tensor_free(y);
		/* The same along axis 0 (the column path): transpose to [2, 4]. */
		double t[8];
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < 2; j++)
				t[j * 4 + i] = v[i * 2 + j];
		struct dg_tensor *xt = mk(k ? DG_F64 : DG_F32, 2, (int64_t[]){ 2, 4 }, t);
		y = ok("Softmax", "{\"axis\": 0}", xt, NULL, 2, (int64_t[]){ 2, 4 });
		expect_vals(y, (double[]){ NAN, NAN, NAN, 1, NAN, NAN, NAN, 0 }, 0,
			    "softmax axis 0 non-finite");
		dg_tensor_free(y);
		dg_tensor_free(xt);
		dg_tensor_free(x);
	}
}

Test(nn, softmax_over_axis_0_equals_the_transposed_last_axis)
{
	const int64_t d[] = { 7, 5 }, dt[] = { 5, 7 };

	for (int k = 0; k < 2; k++) {
		enum dg_dtype ty = k ? DG_F64 : DG_F32;
		struct dg_tensor *x = rnd(ty, 2, d, -5, 5, 21), *xt = mk(ty, 2, dt, NULL);
		for (int i = 0; i < 7; i++)
			for (int j = 0; j < 5; j++)
				dg_tensor_set_f64(xt, j * 7 + i, dg_tensor_get_f64(x, i * 5 + j));
		for (int lg = 0; lg < 2; lg++) {
			const char *op = lg ? "LogSoftmax" : "Softmax";
			struct dg_tensor *a = ok(op, "{\"axis\": 0}", x, NULL, 2, d);
			struct dg_tensor *b = ok(op, NULL, xt, NULL, 2, dt);
			for (int i = 0; i < 7; i++)
				for (int j = 0; j < 5; j++) {
					double p = dg_tensor_get_f64(a, i * 5 + j);
					double q = dg_tensor_get_f64(b, j * 7 + i);
					cr_assert(fabs(p - q) <= 1e-6 * (1 + fabs(q)),
						  "%s [%d,%d]: %.9g vs %.9g", op, i, j, p, q);
				}
			dg_tensor_free(a);
			dg_tensor_free(b);
		}
		dg_tensor_free(x);
		dg_tensor_free(xt);
	}
}

Test(nn, softmax_over_a_middle_axis_of_a_4d_tensor_matches_a_reference)
{
	const int64_t d[] = { 2, 3, 6, 5 };
	struct dg_tensor *x = rnd(DG_F64, 4, d, -8, 8, 5), *s, *l;
	double xd[180], sm[180], lsm[180];

	for (int i = 0; i < 180; i++)
		xd[i] = dg_tensor_get_f64(x, i);
	/* Axis 2 (size 6, stride 5) for each of the 2*3 outer and 5 inner positions. */
	for (int o = 0; o < 6; o++)
		for (int j = 0; j < 5; j++)
			ref_row(xd + o * 30 + j, 6, 5, sm + o * 30 + j, lsm + o * 30 + j);
	s = ok("Softmax", "{\"axis\": 2}", x, NULL, 4, d);
	l = ok("LogSoftmax", "{\"axis\": -2}", x, NULL, 4, d);
	expect_vals(s, sm, 1e-13, "softmax axis 2");
	expect_vals(l, lsm, 1e-13, "log_softmax axis 2");
	dg_tensor_free(s);
	dg_tensor_free(l);
	dg_tensor_free(x);
}

Test(nn, softmax_of_1d_and_empty_inputs)
{
	struct dg_tensor *x = mk(DG_F32, 1, (int64_t[]){ 2 }, (double[]){ 0, 0 }), *y;
	struct dg_tensor *e = mk(DG_F32, 2, (int64_t[]){ 0, 4 }, NULL);
	struct dg_tensor *e2 = mk(DG_F64, 2, (int64_t[]){ 3, 0 }, NULL);

	y = ok("Softmax", NULL, x, NULL, 1, (int64_t[]){ 2 });
	expect_vals(y, (double[]){ 0.5, 0.5 }, 0, "softmax 1-d");
	dg_tensor_free(y);
	y = ok("Softmax", NULL, e, NULL, 2, (int64_t[]){ 0, 4 });
	dg_tensor_free(y);
	y = ok("LogSoftmax", "{\"axis\": 0}", e2, NULL, 2, (int64_t[]){ 3, 0 });
	dg_tensor_free(y);
	dg_tensor_free(x);
	dg_tensor_free(e);
	dg_tensor_free(e2);
}

Test(nn, softmax_rejects_ints_scalars_and_bad_axes)
{
	struct dg_tensor *i = mk(DG_I32, 1, (int64_t[]){ 3 }, NULL);
	struct dg_tensor *s = mk(DG_F32, 0, NULL, (double[]){ 1 });
	struct dg_tensor *x = mk(DG_F32, 2, (int64_t[]){ 2, 3 }, NULL);

	expect_err("Softmax", NULL, i, NULL, DG_EDTYPE, "float32 or float64", "int32");
	expect_err("LogSoftmax", NULL, s, NULL, DG_EINVAL, "axis -1", "rank 0");
	expect_err("Softmax", "{\"axis\": 2}", x, NULL, DG_EINVAL, "axis 2", "rank 2");
	expect_err("Softmax", "{\"axis\": \"last\"}", x, NULL, DG_EINVAL, "axis", NULL);
	expect_err("Softmax", "{\"dim\": 1}", x, NULL, DG_EINVAL, "dim", NULL);
	dg_tensor_free(i);
	dg_tensor_free(s);
	dg_tensor_free(x);
}

/* --- cross-entropy ------------------------------------------------------------------- */

Test(nn, cross_entropy_matches_hand_values)
{
	/* log-softmax(1,2,3) = (-2.40760596, -1.40760596, -0.40760596). */
	const double x[] = { 1, 2, 3, 1, 2, 3, 1, 2, 3 };
	const double lab[] = { 0, 0, 1, 0.5, 0.5, 0, 1, 1, 0 };
	const int64_t d[] = { 3, 3 };

	for (int k = 0; k < 2; k++) {
		enum dg_dtype ty = k ? DG_F64 : DG_F32;
		struct dg_tensor *a = mk(ty, 2, d, x), *b = mk(ty, 2, d, lab), *y;
		y = ok("SoftmaxCrossEntropyWithLogits", NULL, a, b, 1, (int64_t[]){ 3 });
		/* The third row's labels are not normalised: no check, as in TensorFlow. */
		expect_vals(y, (double[]){ 0.407605964, 1.90760596, 3.81521192 }, 1e-7, "xent");
		dg_tensor_free(y);
		dg_tensor_free(a);
		dg_tensor_free(b);
	}
}

Test(nn, cross_entropy_of_other_ranks)
{
	/* Rank 1: a scalar loss. Rank 3 [2,1,2]: classes on the last axis. */
	struct dg_tensor *a = mk(DG_F32, 1, (int64_t[]){ 2 }, (double[]){ 0, 0 });
	struct dg_tensor *b = mk(DG_F32, 1, (int64_t[]){ 2 }, (double[]){ 1, 0 });
	struct dg_tensor *c = mk(DG_F64, 3, (int64_t[]){ 2, 1, 2 },
				 (double[]){ 1000, -1000, 0, 0 });
	struct dg_tensor *e = mk(DG_F64, 3, (int64_t[]){ 2, 1, 2 },
				 (double[]){ 0, 1, 0.25, 0.75 });
	struct dg_tensor *y;

	y = ok("SoftmaxCrossEntropyWithLogits", NULL, a, b, 0, NULL);
	expect_vals(y, (double[]){ 0.693147181 }, 1e-7, "xent rank 1");
	dg_tensor_free(y);
	y = ok("SoftmaxCrossEntropyWithLogits", NULL, c, e, 2, (int64_t[]){ 2, 1 });
	expect_vals(y, (double[]){ 2000, 0.693147181 }, 1e-9, "xent rank 3, large logits");
	dg_tensor_free(y);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(c);
	dg_tensor_free(e);
}

Test(nn, sparse_cross_entropy_equals_dense_with_one_hot_labels)
{
	const int64_t n = 50, cls = 10, d[] = { n, cls };

	for (int k = 0; k < 4; k++) {
		enum dg_dtype ty = k & 1 ? DG_F64 : DG_F32, lt = k & 2 ? DG_I64 : DG_I32;
		struct dg_tensor *x = rnd(ty, 2, d, -30, 30, 9 + (unsigned)k);
		struct dg_tensor *oh = mk(ty, 2, d, NULL), *lab = mk(lt, 1, &n, NULL);
		for (int64_t r = 0; r < n; r++) {
			int64_t c = (r * 7 + k) % cls;
			dg_tensor_set_f64(lab, r, (double)c);
			dg_tensor_set_f64(oh, r * cls + c, 1);
		}
		struct dg_tensor *ys = ok("SparseSoftmaxCrossEntropyWithLogits", NULL, x, lab, 1,
					  &n);
		struct dg_tensor *yd = ok("SoftmaxCrossEntropyWithLogits", NULL, x, oh, 1, &n);
		for (int64_t r = 0; r < n; r++) {
			double s = dg_tensor_get_f64(ys, r), dd = dg_tensor_get_f64(yd, r);
			/* Also against -log_softmax in double. */
			double m = -INFINITY, sum = 0, xr[10];
			for (int c = 0; c < cls; c++) {
				xr[c] = dg_tensor_get_f64(x, r * cls + c);
				m = fmax(m, xr[c]);
			}
			for (int c = 0; c < cls; c++)
				sum += exp(xr[c] - m);
			double want = m + log(sum) - xr[(r * 7 + k) % cls];
			cr_assert(fabs(s - dd) <= 1e-6 * (1 + dd), "row %lld: %g vs %g",
				  (long long)r, s, dd);
			cr_assert(fabs(s - want) <= 1e-6 * (1 + want), "row %lld: %g vs %g",
				  (long long)r, s, want);
		}
		dg_tensor_free(ys);
		dg_tensor_free(yd);
		dg_tensor_free(x);
		dg_tensor_free(oh);
		dg_tensor_free(lab);
	}
}

Test(nn, sparse_cross_entropy_of_higher_rank_and_empty_batches)
{
	/* logits [2,2,3], labels [2,2]. */
	const double x[] = { 1, 2, 3, 1, 2, 3, 0, 0, 0, 5, 5, -1000 };
	struct dg_tensor *a = mk(DG_F32, 3, (int64_t[]){ 2, 2, 3 }, x);
	struct dg_tensor *l = mk(DG_I64, 2, (int64_t[]){ 2, 2 }, (double[]){ 2, 0, 1, 1 });
	struct dg_tensor *e = mk(DG_F32, 2, (int64_t[]){ 0, 3 }, NULL);
	struct dg_tensor *el = mk(DG_I32, 1, (int64_t[]){ 0 }, NULL), *y;

	y = ok("SparseSoftmaxCrossEntropyWithLogits", NULL, a, l, 2, (int64_t[]){ 2, 2 });
	expect_vals(y, (double[]){ 0.407605964, 2.40760596, 1.09861229, 0.693147181 }, 1e-7,
		    "sparse xent rank 3");
	dg_tensor_free(y);
	y = ok("SparseSoftmaxCrossEntropyWithLogits", NULL, e, el, 1, (int64_t[]){ 0 });
	dg_tensor_free(y);
	dg_tensor_free(a);
	dg_tensor_free(l);
	dg_tensor_free(e);
	dg_tensor_free(el);
}

Test(nn, cross_entropy_over_zero_classes)
{
	/* Dense: an empty sum is 0. Sparse: no label can be inside [0, 0). */
	struct dg_tensor *x = mk(DG_F32, 2, (int64_t[]){ 2, 0 }, NULL);
	struct dg_tensor *l = mk(DG_I32, 1, (int64_t[]){ 2 }, NULL), *y;

	y = ok("SoftmaxCrossEntropyWithLogits", NULL, x, x, 1, (int64_t[]){ 2 });
	expect_vals(y, (double[]){ 0, 0 }, 0, "xent of no classes");
	dg_tensor_free(y);
	expect_err("SparseSoftmaxCrossEntropyWithLogits", NULL, x, l, DG_EINVAL,
		   "label 0 at index 0 is outside [0, 0)", NULL);
	dg_tensor_free(x);
	dg_tensor_free(l);
}

Test(nn, sparse_cross_entropy_rejects_labels_outside_the_classes)
{
	struct dg_tensor *x = mk(DG_F32, 2, (int64_t[]){ 5, 10 }, NULL);
	struct dg_tensor *l = mk(DG_I32, 1, (int64_t[]){ 5 }, (double[]){ 0, 9, 3, 12, 1 });
	struct dg_tensor *n = mk(DG_I64, 1, (int64_t[]){ 5 }, (double[]){ 0, -1, 3, 4, 1 });

	expect_err("SparseSoftmaxCrossEntropyWithLogits", NULL, x, l, DG_EINVAL,
		   "label 12 at index 3 is outside [0, 10)", NULL);
	expect_err("SparseSoftmaxCrossEntropyWithLogits", NULL, x, n, DG_EINVAL,
		   "label -1 at index 1 is outside [0, 10)", NULL);
	dg_tensor_free(x);
	dg_tensor_free(l);
	dg_tensor_free(n);
}

Test(nn, cross_entropy_rejects_mismatched_shapes_and_dtypes)
{
	struct dg_tensor *x = mk(DG_F32, 2, (int64_t[]){ 2, 3 }, NULL);
	struct dg_tensor *l24 = mk(DG_F32, 2, (int64_t[]){ 2, 4 }, NULL);
	struct dg_tensor *l23d = mk(DG_F64, 2, (int64_t[]){ 2, 3 }, NULL);
	struct dg_tensor *s3 = mk(DG_I32, 1, (int64_t[]){ 3 }, NULL);
	struct dg_tensor *sf = mk(DG_F32, 1, (int64_t[]){ 2 }, NULL);
	struct dg_tensor *sc = mk(DG_F32, 0, NULL, NULL);
	struct dg_tensor *xi = mk(DG_I32, 2, (int64_t[]){ 2, 3 }, NULL);
	const char *dense = "SoftmaxCrossEntropyWithLogits";
	const char *sparse = "SparseSoftmaxCrossEntropyWithLogits";

	expect_err(dense, NULL, x, l24, DG_ESHAPE, "[2,3]", "[2,4]");
	expect_err(dense, NULL, x, l23d, DG_EDTYPE, "float64", "float32");
	expect_err(dense, NULL, sc, sc, DG_ESHAPE, "class axis", NULL);
	expect_err(dense, NULL, xi, xi, DG_EDTYPE, "int32", NULL);
	expect_err(sparse, NULL, x, s3, DG_ESHAPE, "[2,3]", "[3]");
	expect_err(sparse, NULL, x, sf, DG_EDTYPE, "int32 or int64", "float32");
	expect_err(sparse, NULL, sc, s3, DG_ESHAPE, "class axis", NULL);
	expect_err(dense, NULL, x, NULL, DG_EINVAL, "inputs", NULL);
	dg_tensor_free(x);
	dg_tensor_free(l24);
	dg_tensor_free(l23d);
	dg_tensor_free(s3);
	dg_tensor_free(sf);
	dg_tensor_free(sc);
	dg_tensor_free(xi);
}

/* --- inference -------------------------------------------------------------------------- */

static enum dg_status infer(const char *op, const char *attrs, struct dg_ttype *in, int n_in,
			    struct dg_ttype *out, struct dg_err *err)
{
	const struct dg_op_def *def = dg_op_find(op);
	json_t *j = json_loads(attrs ? attrs : "{}", 0, NULL);
	struct dg_infer_ctx c = { .attrs = j, .n_in = n_in, .in = in, .n_out = 1, .out = out,
				  .err = err };
	enum dg_status st;

	cr_assert_not_null(def);
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

Test(nn, inference_handles_unknown_dims_and_rank)
{
	struct dg_ttype x = { DG_F32, dg_shape_make(2, (int64_t[]){ -1, 10 }) };
	struct dg_ttype lab = { DG_F32, dg_shape_make(2, (int64_t[]){ 32, -1 }) };
	struct dg_ttype sl = { DG_I64, dg_shape_make(1, (int64_t[]){ -1 }) };
	struct dg_ttype unk = { DG_F32, { .ndim = -1 } };
	struct dg_ttype in[2], o;
	struct dg_err err = { 0 };

	cr_assert_eq(infer("Softmax", NULL, &x, 1, &o, &err), DG_OK, "%s", err.msg);
	expect_shape(&o.shape, "[?,10]");
	cr_assert_eq(infer("LogSoftmax", "{\"axis\": 0}", &unk, 1, &o, &err), DG_OK);
	cr_assert_eq(o.shape.ndim, -1);
	cr_assert_eq(infer("Softmax", "{\"axis\": 2}", &x, 1, &o, &err), DG_EINVAL);
	in[0] = x;
	in[1] = lab;
	cr_assert_eq(infer("SoftmaxCrossEntropyWithLogits", NULL, in, 2, &o, &err), DG_OK,
		     "%s", err.msg);
	expect_shape(&o.shape, "[32]");
	cr_assert_eq(o.dtype, DG_F32);
	in[1] = unk;
	cr_assert_eq(infer("SoftmaxCrossEntropyWithLogits", NULL, in, 2, &o, &err), DG_OK);
	expect_shape(&o.shape, "[?]");
	in[1] = sl;
	cr_assert_eq(infer("SparseSoftmaxCrossEntropyWithLogits", NULL, in, 2, &o, &err), DG_OK,
		     "%s", err.msg);
	expect_shape(&o.shape, "[?]");
	in[0] = unk;
	cr_assert_eq(infer("SparseSoftmaxCrossEntropyWithLogits", NULL, in, 2, &o, &err), DG_OK);
	expect_shape(&o.shape, "[?]");
	/* Certainly wrong: labels [32, 11] against logits [?, 10]; int labels for the
	 * dense form; labels of rank 2 for logits of rank 2 in the sparse form. */
	in[0] = x;
	in[1] = (struct dg_ttype){ DG_F32, dg_shape_make(2, (int64_t[]){ 32, 11 }) };
	cr_assert_eq(infer("SoftmaxCrossEntropyWithLogits", NULL, in, 2, &o, &err), DG_ESHAPE);
	cr_assert(strstr(err.msg, "[?,10]") && strstr(err.msg, "[32,11]"), "%s", err.msg);
	in[1] = (struct dg_ttype){ DG_I32, dg_shape_make(2, (int64_t[]){ 32, 10 }) };
	cr_assert_eq(infer("SoftmaxCrossEntropyWithLogits", NULL, in, 2, &o, &err), DG_EDTYPE);
	cr_assert_eq(infer("SparseSoftmaxCrossEntropyWithLogits", NULL, in, 2, &o, &err),
		     DG_ESHAPE);
}

Test(nn, one_hot_puts_on_value_at_each_index_and_off_elsewhere)
{
	const int64_t d2[2] = { 2, 3 };
	const double idx[6] = { 0, 2, 1, -1, 3, 2 };
	struct dg_tensor *x = mk(DG_I32, 2, d2, idx), *y = NULL;
	struct dg_err err = { 0 };

	cr_assert_eq(run("OneHot", "{\"depth\": 3}", x, NULL, &y, &err), DG_OK, "%s", err.msg);
	cr_assert(y->dtype == DG_F32 && y->shape.ndim == 3 && y->shape.dim[2] == 3);
	/* -1 and 3 are outside [0, 3): rows of off_value */
	const double want[18] = { 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 };
	expect_vals(y, want, 0, "one_hot");
	dg_tensor_free(y);
	cr_assert_eq(run("OneHot", "{\"depth\": 3, \"on_value\": 0.9, \"off_value\": 0.05, "
			 "\"dtype\": \"float64\"}", x, NULL, &y, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(y->dtype, DG_F64);
	cr_assert_float_eq(dg_tensor_get_f64(y, 0), 0.9, 1e-15);
	cr_assert_float_eq(dg_tensor_get_f64(y, 1), 0.05, 1e-15);
	dg_tensor_free(y);
	/* errors: depth, dtype of the indices and of the output */
	cr_assert_eq(run("OneHot", "{\"depth\": 0}", x, NULL, &y, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "depth"), "%s", err.msg);
	cr_assert_eq(run("OneHot", "{\"depth\": 3, \"dtype\": \"int32\"}", x, NULL, &y, &err),
		     DG_EDTYPE);
	struct dg_tensor *f = mk(DG_F32, 2, d2, idx);
	cr_assert_eq(run("OneHot", "{\"depth\": 3}", f, NULL, &y, &err), DG_EDTYPE);
	cr_assert(strstr(err.msg, "int32 or int64"), "%s", err.msg);
	dg_tensor_free(f);
	dg_tensor_free(x);
}

/* --- FusedBatchNorm ------------------------------------------------------------------ */

/* Run op with n inputs and 3 outputs; the status. */
static enum dg_status run3(const char *op, const char *attrs, const struct dg_tensor *const *in,
			   int n, struct dg_tensor **out, struct dg_err *err)
{
	json_t *j = attrs ? json_loads(attrs, 0, NULL) : NULL;
	enum dg_status st = dg_op_run(dg_op_find(op), j, in, n, out, 3, 0, err);

	json_decref(j);
	return st;
}

Test(nn, fused_batch_norm_normalises_each_channel_and_returns_the_batch_moments)
{
	const int64_t xd[2] = { 4, 2 }, cd[1] = { 2 };
	const double xv[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	struct dg_tensor *x = mk(DG_F32, 2, xd, xv), *sc = mk(DG_F32, 1, cd, (double[]){ 1, 2 });
	struct dg_tensor *of = mk(DG_F32, 1, cd, (double[]){ 0, 1 });
	struct dg_tensor *out[3] = { 0 };
	struct dg_err err = { 0 };
	double inv = 1 / sqrt(5 + 0.001), y[8];

	cr_assert_eq(run3("FusedBatchNorm", NULL, (const struct dg_tensor *[]){ x, sc, of }, 3,
			  out, &err), DG_OK, "%s", err.msg);
	/* channel 0: 1 3 5 7 (mean 4, biased variance 5); channel 1: 2 4 6 8 */
	for (int i = 0; i < 8; i++)
		y[i] = (xv[i] - (i % 2 ? 5 : 4)) * inv * (i % 2 ? 2 : 1) + (i % 2 ? 1 : 0);
	expect_vals(out[0], y, 1e-6, "y");
	expect_vals(out[1], (double[]){ 4, 5 }, 1e-7, "batch mean");
	expect_vals(out[2], (double[]){ 20.0 / 3, 20.0 / 3 }, 1e-6, "batch variance (m-1)");
	for (int k = 0; k < 3; k++)
		dg_tensor_free(out[k]);
	/* inference: the given moments, passed through as outputs 1 and 2 */
	struct dg_tensor *mean = mk(DG_F32, 1, cd, (double[]){ 0, 1 });
	struct dg_tensor *var = mk(DG_F32, 1, cd, (double[]){ 4, 1 });
	cr_assert_eq(run3("FusedBatchNorm", "{\"is_training\": false, \"epsilon\": 1e-9}",
			  (const struct dg_tensor *[]){ x, sc, of, mean, var }, 5, out, &err), DG_OK,
		     "%s", err.msg);
	expect_vals(out[0], (double[]){ 0.5, 3, 1.5, 7, 2.5, 11, 3.5, 15 }, 1e-6, "inference y");
	expect_vals(out[2], (double[]){ 4, 1 }, 0, "variance passed through");
	for (int k = 0; k < 3; k++)
		dg_tensor_free(out[k]);
	dg_tensor_free(mean);
	dg_tensor_free(var);
	dg_tensor_free(x);
	dg_tensor_free(sc);
	dg_tensor_free(of);
}

Test(nn, fused_batch_norm_of_nhwc_float64_matches_a_reference)
{
	const int64_t xd[4] = { 3, 4, 5, 6 }, cd[1] = { 6 };
	struct dg_tensor *x = rnd(DG_F64, 4, xd, -3, 5, 11), *sc = rnd(DG_F64, 1, cd, 0.5, 2, 12);
	struct dg_tensor *of = rnd(DG_F64, 1, cd, -1, 1, 13), *out[3] = { 0 };
	struct dg_err err = { 0 };

	cr_assert_eq(run3("FusedBatchNorm", NULL, (const struct dg_tensor *[]){ x, sc, of }, 3,
			  out, &err), DG_OK, "%s", err.msg);
	for (int k = 0; k < 6; k++) {
		double s = 0, ss = 0, m = 60;
		for (int r = 0; r < 60; r++)
			s += dg_tensor_get_f64(x, r * 6 + k);
		for (int r = 0; r < 60; r++)
			ss += pow(dg_tensor_get_f64(x, r * 6 + k) - s / m, 2);
		cr_assert_float_eq(dg_tensor_get_f64(out[1], k), s / m, 1e-12);
		cr_assert_float_eq(dg_tensor_get_f64(out[2], k), ss / (m - 1), 1e-11);
		/* y of each channel: mean offset, standard deviation scale (eps aside) */
		double ys = 0, yss = 0;
		for (int r = 0; r < 60; r++)
			ys += dg_tensor_get_f64(out[0], r * 6 + k);
		for (int r = 0; r < 60; r++)
			yss += pow(dg_tensor_get_f64(out[0], r * 6 + k) - ys / m, 2);
		cr_assert_float_eq(ys / m, dg_tensor_get_f64(of, k), 1e-12);
		cr_assert_float_eq(sqrt(yss / m), dg_tensor_get_f64(sc, k), 1e-3);
	}
	for (int k = 0; k < 3; k++)
		dg_tensor_free(out[k]);
	dg_tensor_free(x);
	dg_tensor_free(sc);
	dg_tensor_free(of);
}

Test(nn, fused_batch_norm_refuses_bad_inputs_naming_them)
{
	const int64_t xd[2] = { 4, 3 }, cd[1] = { 3 }, c2[1] = { 2 };
	struct dg_tensor *x = mk(DG_F32, 2, xd, NULL), *sc = mk(DG_F32, 1, cd, NULL);
	struct dg_tensor *s2 = mk(DG_F32, 1, c2, NULL), *xi = mk(DG_I32, 2, xd, NULL);
	struct dg_tensor *sd = mk(DG_F64, 1, cd, NULL), *out[3] = { 0 };
	struct dg_err err = { 0 };
	static const struct {
		const char *attrs, *msg;
		int which;      /* 0: scale [2]; 1: int x; 2: float64 scale; 3: 3 inputs */
	} bad[] = {
		{ NULL, "input 1 has shape [2]; it must be [3]", 0 },
		{ NULL, "x is int32", 1 },
		{ NULL, "input 1 is float64, x float32", 2 },
		{ "{\"is_training\": false}", "is_training false needs 5 inputs", 3 },
		{ "{\"epsilon\": 0}", "attr 'epsilon' must be finite and > 0", 3 },
	};

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		const struct dg_tensor *in[3] = { bad[i].which == 1 ? xi : x,
						  bad[i].which == 0 ? s2 : bad[i].which == 2 ? sd : sc,
						  sc };
		cr_assert_neq(run3("FusedBatchNorm", bad[i].attrs, in, 3, out, &err), DG_OK,
			      "case %zu accepted", i);
		cr_assert(strstr(err.msg, bad[i].msg), "case %zu: '%s' lacks '%s'", i, err.msg,
			  bad[i].msg);
		cr_assert_null(out[0]);
	}
	dg_tensor_free(x);
	dg_tensor_free(sc);
	dg_tensor_free(s2);
	dg_tensor_free(xi);
	dg_tensor_free(sd);
}
