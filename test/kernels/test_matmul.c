/* Tests of MatMul and BatchMatMul (kernels/cpu/matmul.c) through the registry,
 * and of the OpenBLAS loading in kernels/cpu/blas.c: hand-computed products,
 * every transpose, empty dims, batch broadcasting, errors and their messages,
 * a random case against a naive loop in double, and the core-type choice. */
#include <criterion/criterion.h>

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dg/kernels.h"
#include "blas.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* OPENBLAS_CORETYPE as the process started (before any test could load BLAS). */
static int coretype_was_set;

__attribute__((constructor)) static void note_env(void)
{
	coretype_was_set = getenv("OPENBLAS_CORETYPE") != NULL;
}

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

/* Run op on (a, b) with attrs given as JSON text (or NULL); returns the status. */
static enum dg_status run2(const char *op, const char *attrs, const struct dg_tensor *a,
			   const struct dg_tensor *b, struct dg_tensor **out, struct dg_err *err)
{
	const struct dg_tensor *in[2] = { a, b };
	json_t *j = attrs ? json_loads(attrs, 0, NULL) : NULL;
	enum dg_status st;

	cr_assert(!attrs || j, "bad JSON in test: %s", attrs);
	st = dg_op_run(dg_op_find(op), j, in, 2, out, 1, 0, err);
	json_decref(j);
	return st;
}

/* Run and require success; the output's shape must be want[0..ndim). */
static struct dg_tensor *ok2(const char *op, const char *attrs, const struct dg_tensor *a,
			     const struct dg_tensor *b, int ndim, const int64_t *want)
{
	struct dg_tensor *out = NULL;
	struct dg_err err = { 0 };
	enum dg_status st = run2(op, attrs, a, b, &out, &err);

	cr_assert_eq(st, DG_OK, "%s failed: %s", op, err.msg);
	cr_assert_eq(out->shape.ndim, ndim);
	for (int i = 0; i < ndim; i++)
		cr_assert_eq(out->shape.dim[i], want[i], "dim %d: %lld vs %lld", i,
			     (long long)out->shape.dim[i], (long long)want[i]);
	return out;
}

static void expect_values(const struct dg_tensor *t, const double *want, int64_t n, double eps)
{
	cr_assert_eq(t->numel, n);
	for (int64_t i = 0; i < n; i++)
		cr_assert_float_eq(dg_tensor_get_f64(t, i), want[i], eps, "element %lld: %g vs %g",
				   (long long)i, dg_tensor_get_f64(t, i), want[i]);
}

/* a = [[1,2,3],[4,5,6]], b = [[7,8],[9,10],[11,12]], a @ b = [[58,64],[139,154]];
 * the transposed storages hold the same matrices. */
static const double A23[] = { 1, 2, 3, 4, 5, 6 }, A32T[] = { 1, 4, 2, 5, 3, 6 };
static const double B32[] = { 7, 8, 9, 10, 11, 12 }, B23T[] = { 7, 9, 11, 8, 10, 12 };
static const double AB[] = { 58, 64, 139, 154 };
static const int64_t S23[] = { 2, 3 }, S32[] = { 3, 2 }, S22[] = { 2, 2 };

Test(matmul, product_of_2x3_and_3x2_is_hand_computed)
{
	struct dg_tensor *a = mk(DG_F32, 2, S23, A23), *b = mk(DG_F32, 2, S32, B32);
	struct dg_tensor *o = ok2("MatMul", NULL, a, b, 2, S22);

	cr_assert_eq(o->dtype, DG_F32);
	expect_values(o, AB, 4, 0);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(o);
}

Test(matmul, transpose_a_multiplies_by_the_stored_matrix_transposed)
{
	struct dg_tensor *a = mk(DG_F32, 2, S32, A32T), *b = mk(DG_F32, 2, S32, B32);
	struct dg_tensor *o = ok2("MatMul", "{\"transpose_a\": true}", a, b, 2, S22);

	expect_values(o, AB, 4, 0);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(o);
}

Test(matmul, transpose_b_multiplies_by_the_stored_matrix_transposed)
{
	struct dg_tensor *a = mk(DG_F32, 2, S23, A23), *b = mk(DG_F32, 2, S23, B23T);
	struct dg_tensor *o = ok2("MatMul", "{\"transpose_b\": true, \"transpose_a\": false}", a,
				  b, 2, S22);

	expect_values(o, AB, 4, 0);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(o);
}

Test(matmul, both_transposes_give_the_same_product)
{
	struct dg_tensor *a = mk(DG_F32, 2, S32, A32T), *b = mk(DG_F32, 2, S23, B23T);
	struct dg_tensor *o = ok2("MatMul", "{\"transpose_a\": true, \"transpose_b\": true}", a,
				  b, 2, S22);

	expect_values(o, AB, 4, 0);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(o);
}

Test(matmul, float64_non_square_product_keeps_double_precision)
{
	/* [2,3] @ [3,4]; the 1e-9 terms survive only if the math is done in double. */
	static const double a_v[] = { 0.5, -1, 2, 1e-9, 3, 0.25 };
	static const double b_v[] = { 1, 0, 2, -1, 0.1, 1, 0, 4, 3, -2, 1, 0.5 };
	/* row 0: 0.5*col - 1*row1 + 2*row2 of b; row 1: 1e-9*row0 + 3*row1 + 0.25*row2 */
	static const double want[] = {
		0.5 - 0.1 + 6, -1 - 4, 1 + 0 + 2, -0.5 - 4 + 1,
		1e-9 + 0.3 + 0.75, 3 - 0.5, 2e-9 + 0.25, -1e-9 + 12 + 0.125,
	};
	static const int64_t sa[] = { 2, 3 }, sb[] = { 3, 4 }, so[] = { 2, 4 };
	struct dg_tensor *a = mk(DG_F64, 2, sa, a_v), *b = mk(DG_F64, 2, sb, b_v);
	struct dg_tensor *o = ok2("MatMul", NULL, a, b, 2, so);

	cr_assert_eq(o->dtype, DG_F64);
	expect_values(o, want, 8, 1e-12);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(o);
}

Test(matmul, row_times_column_is_a_dot_product_and_column_times_row_an_outer_product)
{
	static const double r[] = { 1, 2, 3, 4 }, col[] = { 5, 6, 7, 8 };
	/* outer[i][j] = col[i] * r[j] */
	static const double outer[] = { 5, 10, 15, 20, 6, 12, 18, 24, 7, 14, 21, 28,
					8, 16, 24, 32 };
	static const int64_t s14[] = { 1, 4 }, s41[] = { 4, 1 }, s11[] = { 1, 1 };
	static const int64_t s44[] = { 4, 4 };
	struct dg_tensor *a = mk(DG_F32, 2, s14, r), *b = mk(DG_F32, 2, s41, col);
	struct dg_tensor *dot = ok2("MatMul", NULL, a, b, 2, s11);
	struct dg_tensor *out = ok2("MatMul", NULL, b, a, 2, s44);

	cr_assert_float_eq(dg_tensor_get_f64(dot, 0), 70.0, 0);
	expect_values(out, outer, 16, 0);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(dot);
	dg_tensor_free(out);
}

Test(matmul, empty_m_or_n_gives_an_empty_result_and_empty_k_gives_zeros)
{
	static const int64_t s03[] = { 0, 3 }, s34[] = { 3, 4 }, s04[] = { 0, 4 };
	static const int64_t s20[] = { 2, 0 }, s05[] = { 0, 5 }, s25[] = { 2, 5 };
	static const int64_t s30[] = { 3, 0 }, s23[] = { 2, 3 }, s20o[] = { 2, 0 };
	static const double zeros[10] = { 0 };
	struct dg_tensor *a = mk(DG_F32, 2, s03, NULL), *b = mk(DG_F32, 2, s34, NULL);
	struct dg_tensor *o = ok2("MatMul", NULL, a, b, 2, s04);
	struct dg_tensor *c = mk(DG_F64, 2, s20, NULL), *d = mk(DG_F64, 2, s05, NULL);
	struct dg_tensor *z = ok2("MatMul", NULL, c, d, 2, s25);
	struct dg_tensor *e = mk(DG_F32, 2, s23, A23), *f = mk(DG_F32, 2, s30, NULL);
	struct dg_tensor *n0 = ok2("MatMul", NULL, e, f, 2, s20o);

	cr_assert_eq(o->numel, 0);
	cr_assert_eq(z->dtype, DG_F64);
	expect_values(z, zeros, 10, 0);
	cr_assert_eq(n0->numel, 0);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_tensor_free(o);
	dg_tensor_free(c);
	dg_tensor_free(d);
	dg_tensor_free(z);
	dg_tensor_free(e);
	dg_tensor_free(f);
	dg_tensor_free(n0);
}

/* --- errors ------------------------------------------------------------------ */

static void expect_error(const char *op, const char *attrs, const struct dg_tensor *a,
			 const struct dg_tensor *b, enum dg_status code, const char *in_msg,
			 const char *in_hint)
{
	struct dg_tensor *out = NULL;
	struct dg_err err = { 0 };
	enum dg_status st = run2(op, attrs, a, b, &out, &err);

	cr_assert_eq(st, code, "%s: got %d (%s), want %d", op, st, err.msg, code);
	cr_assert_eq(err.code, code);
	cr_assert_null(out, "no output on error");
	cr_assert(strstr(err.msg, in_msg), "message '%s' lacks '%s'", err.msg, in_msg);
	cr_assert(strncmp(err.msg, op, strlen(op)) == 0, "message '%s' names the op", err.msg);
	if (in_hint)
		cr_assert(strstr(err.hint, in_hint), "hint '%s' lacks '%s'", err.hint, in_hint);
}

Test(matmul, inner_dimension_mismatch_names_both_shapes_and_the_transpose_attrs)
{
	static const int64_t s45[] = { 4, 5 };
	struct dg_tensor *a = mk(DG_F32, 2, S23, A23), *b = mk(DG_F32, 2, s45, NULL);

	expect_error("MatMul", NULL, a, b, DG_ESHAPE, "inner dimensions differ: [2,3] x [4,5]",
		     "transpose_a/transpose_b");
	/* With transpose_a, a is 3x2: K=2 against 4 still differs. */
	expect_error("MatMul", "{\"transpose_a\": true}", a, b, DG_ESHAPE,
		     "(2 vs 4 with transpose_a=true", NULL);
	dg_tensor_free(a);
	dg_tensor_free(b);
}

Test(matmul, integer_and_mixed_dtypes_are_refused_with_a_cast_hint)
{
	struct dg_tensor *ai = mk(DG_I32, 2, S23, A23), *bi = mk(DG_I32, 2, S32, B32);
	struct dg_tensor *a = mk(DG_F32, 2, S23, A23), *b64 = mk(DG_F64, 2, S32, B32);

	expect_error("MatMul", NULL, ai, bi, DG_EDTYPE, "got int32", "Cast");
	expect_error("MatMul", NULL, a, bi, DG_EDTYPE, "got int32", "Cast");
	expect_error("MatMul", NULL, a, b64, DG_EDTYPE, "mixed dtypes float32 and float64",
		     "Cast");
	expect_error("BatchMatMul", NULL, a, b64, DG_EDTYPE, "mixed dtypes", "Cast");
	dg_tensor_free(ai);
	dg_tensor_free(bi);
	dg_tensor_free(a);
	dg_tensor_free(b64);
}

Test(matmul, wrong_ranks_are_shape_errors)
{
	static const int64_t s3[] = { 3 }, s223[] = { 2, 2, 3 };
	struct dg_tensor *v = mk(DG_F32, 1, s3, NULL), *m = mk(DG_F32, 2, S32, B32);
	struct dg_tensor *t3 = mk(DG_F32, 3, s223, NULL);

	expect_error("MatMul", NULL, t3, m, DG_ESHAPE, "rank-2 inputs, got [2,2,3] x [3,2]",
		     "BatchMatMul");
	expect_error("BatchMatMul", NULL, v, m, DG_ESHAPE, "rank >= 2, got [3] x [3,2]", NULL);
	dg_tensor_free(v);
	dg_tensor_free(m);
	dg_tensor_free(t3);
}

Test(matmul, bad_attrs_are_refused)
{
	struct dg_tensor *a = mk(DG_F32, 2, S23, A23), *b = mk(DG_F32, 2, S32, B32);
	struct dg_tensor *out = NULL;
	struct dg_err err = { 0 };

	cr_assert_eq(run2("MatMul", "{\"transpose_c\": true}", a, b, &out, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "transpose_c"), "%s", err.msg);
	cr_assert_eq(run2("MatMul", "{\"transpose_a\": 1}", a, b, &out, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "transpose_a"), "%s", err.msg);
	cr_assert_eq(run2("BatchMatMul", "{\"transpose_a\": true}", a, b, &out, &err),
		     DG_EINVAL);
	cr_assert_null(out);
	dg_tensor_free(a);
	dg_tensor_free(b);
}

Test(matmul, dimensions_beyond_int_max_are_too_large_for_blas)
{
	/* Shape-only fakes: both are empty (a zero dim), so no data is needed, yet the
	 * result [2^31, 1] would hold 2^31 zeros: refused before any allocation. */
	struct dg_tensor a = { .dtype = DG_F32, .shape = { 2, { (int64_t)1 << 31, 0 } } };
	struct dg_tensor b = { .dtype = DG_F32, .shape = { 2, { 0, 1 } } };

	expect_error("MatMul", NULL, &a, &b, DG_ETOOLARGE, "2147483648", NULL);
	expect_error("BatchMatMul", NULL, &a, &b, DG_ETOOLARGE, "BLAS limit", NULL);
}

/* --- BatchMatMul --------------------------------------------------------------- */

/* Naive reference for one matrix: out[M,N] = op(a) @ op(b) in double. */
static void ref_mm(const double *a, const double *b, double *out, int64_t m, int64_t n,
		   int64_t k, bool ta, bool tb)
{
	for (int64_t i = 0; i < m; i++)
		for (int64_t j = 0; j < n; j++) {
			double s = 0;
			for (int64_t p = 0; p < k; p++)
				s += a[ta ? p * m + i : i * k + p] * b[tb ? j * k + p : p * n + j];
			out[i * n + j] = s;
		}
}

Test(matmul, batch_matmul_with_equal_batches_multiplies_each_pair)
{
	/* x[0] = A, x[1] = 2A; y[0] = B, y[1] = identity-padded [[1,0],[0,1],[0,0]]. */
	static const double x_v[] = { 1, 2, 3, 4, 5, 6, 2, 4, 6, 8, 10, 12 };
	static const double y_v[] = { 7, 8, 9, 10, 11, 12, 1, 0, 0, 1, 0, 0 };
	static const double want[] = { 58, 64, 139, 154, 2, 4, 8, 10 };
	static const int64_t sx[] = { 2, 2, 3 }, sy[] = { 2, 3, 2 }, so[] = { 2, 2, 2 };
	struct dg_tensor *x = mk(DG_F32, 3, sx, x_v), *y = mk(DG_F32, 3, sy, y_v);
	struct dg_tensor *o = ok2("BatchMatMul", NULL, x, y, 3, so);

	expect_values(o, want, 8, 0);
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_tensor_free(o);
}

Test(matmul, batch_matmul_by_a_rank2_rhs_folds_the_batch_into_m)
{
	static const double x_v[] = { 1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 0, 1 };
	/* x[1] rows pick rows 0 and 2 of B. */
	static const double want[] = { 58, 64, 139, 154, 7, 8, 11, 12 };
	static const int64_t sx[] = { 2, 2, 3 }, so[] = { 2, 2, 2 };
	struct dg_tensor *x = mk(DG_F64, 3, sx, x_v), *y = mk(DG_F64, 2, S32, B32);
	struct dg_tensor *o = ok2("BatchMatMul", NULL, x, y, 3, so);
	/* adj_y: y stored transposed, same result through the same folded path. */
	struct dg_tensor *yt = mk(DG_F64, 2, S23, B23T);
	struct dg_tensor *o2 = ok2("BatchMatMul", "{\"adj_y\": true}", x, yt, 3, so);

	expect_values(o, want, 8, 0);
	expect_values(o2, want, 8, 0);
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_tensor_free(yt);
	dg_tensor_free(o);
	dg_tensor_free(o2);
}

Test(matmul, batch_matmul_broadcasts_batch_dims_like_numpy)
{
	/* x [2,1,2,2] x y [3,2,2] -> [2,3,2,2]: out[i,j] = x[i,0] @ y[j]. */
	static const int64_t sx[] = { 2, 1, 2, 2 }, sy[] = { 3, 2, 2 }, so[] = { 2, 3, 2, 2 };
	double xv[8], yv[12], want[24];
	struct dg_tensor *x, *y, *o;

	for (int i = 0; i < 8; i++)
		xv[i] = i + 1;
	for (int i = 0; i < 12; i++)
		yv[i] = (i % 5) - 2;
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 3; j++)
			ref_mm(xv + 4 * i, yv + 4 * j, want + 4 * (3 * i + j), 2, 2, 2, false,
			       false);
	/* One entry by hand: x[1,0] = [[5,6],[7,8]], y[2] = [[1,2],[-2,-1]];
	 * out[1,2][0][0] = 5*1 + 6*-2 = -7. */
	cr_assert_float_eq(want[4 * 5], -7.0, 0);
	x = mk(DG_F32, 4, sx, xv);
	y = mk(DG_F32, 3, sy, yv);
	o = ok2("BatchMatMul", NULL, x, y, 4, so);
	expect_values(o, want, 24, 0);
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_tensor_free(o);
}

Test(matmul, batch_matmul_broadcasts_a_single_lhs_over_rhs_batches_with_adjoints)
{
	/* x [1,3,2] (adj_x: each is the transpose of a [2,3]) x y [3,2,3] (adj_y). */
	static const int64_t sx[] = { 1, 3, 2 }, sy[] = { 3, 2, 3 }, so[] = { 3, 2, 2 };
	double yv[18], want[12];
	struct dg_tensor *x, *y, *o;

	for (int i = 0; i < 18; i++)
		yv[i] = 0.5 * i - 3;
	for (int j = 0; j < 3; j++)
		ref_mm(A32T, yv + 6 * j, want + 4 * j, 2, 2, 3, true, true);
	/* Hand check of out[0]: A @ Y0^T with Y0 = [[-3,-2.5,-2],[-1.5,-1,-0.5]]:
	 * [1,2,3].[-3,-2.5,-2] = -14. */
	cr_assert_float_eq(want[0], -14.0, 0);
	x = mk(DG_F32, 3, sx, A32T);
	y = mk(DG_F32, 3, sy, yv);
	o = ok2("BatchMatMul", "{\"adj_x\": true, \"adj_y\": true}", x, y, 3, so);
	expect_values(o, want, 12, 1e-6);
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_tensor_free(o);
}

Test(matmul, batch_matmul_with_an_empty_batch_or_empty_k)
{
	static const int64_t sx[] = { 0, 2, 3 }, so[] = { 0, 2, 2 };
	static const int64_t sx2[] = { 2, 2, 0 }, sy2[] = { 0, 4 }, so2[] = { 2, 2, 4 };
	static const double zeros[16] = { 0 };
	struct dg_tensor *x = mk(DG_F32, 3, sx, NULL), *y = mk(DG_F32, 2, S32, B32);
	struct dg_tensor *o = ok2("BatchMatMul", NULL, x, y, 3, so);
	struct dg_tensor *x2 = mk(DG_F32, 3, sx2, NULL), *y2 = mk(DG_F32, 2, sy2, NULL);
	struct dg_tensor *o2 = ok2("BatchMatMul", NULL, x2, y2, 3, so2);

	cr_assert_eq(o->numel, 0);
	expect_values(o2, zeros, 16, 0);
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_tensor_free(o);
	dg_tensor_free(x2);
	dg_tensor_free(y2);
	dg_tensor_free(o2);
}

Test(matmul, batch_matmul_errors_name_the_full_shapes)
{
	static const int64_t sx[] = { 2, 2, 3 }, sy[] = { 3, 3, 2 }, sy2[] = { 2, 4, 2 };
	struct dg_tensor *x = mk(DG_F32, 3, sx, NULL), *y = mk(DG_F32, 3, sy, NULL);
	struct dg_tensor *y2 = mk(DG_F32, 3, sy2, NULL);

	expect_error("BatchMatMul", NULL, x, y, DG_ESHAPE,
		     "batch dimensions [2] and [3] cannot be broadcast together: [2,2,3] x [3,3,2]",
		     NULL);
	expect_error("BatchMatMul", NULL, x, y2, DG_ESHAPE,
		     "inner dimensions differ: [2,2,3] x [2,4,2]", "adj_x/adj_y");
	dg_tensor_free(x);
	dg_tensor_free(y);
	dg_tensor_free(y2);
}

/* --- random case against a naive loop ----------------------------------------- */

Test(matmul, random_67x45x89_matches_a_naive_triple_loop_for_every_transpose)
{
	const int64_t m = 67, k = 45, n = 89;
	double *a = malloc(sizeof(double) * m * k), *b = malloc(sizeof(double) * k * n);
	double *want = malloc(sizeof(double) * m * n);
	unsigned seed = 12345;

	cr_assert(a && b && want);
	for (int64_t i = 0; i < m * k; i++)
		a[i] = (double)(rand_r(&seed) % 2001 - 1000) / 256.0;
	for (int64_t i = 0; i < k * n; i++)
		b[i] = (double)(rand_r(&seed) % 2001 - 1000) / 256.0;
	ref_mm(a, b, want, m, n, k, false, false);
	for (int t = 0; t < 4; t++) {
		bool ta = t & 1, tb = t & 2;
		int64_t sa[2] = { ta ? k : m, ta ? m : k }, sb[2] = { tb ? n : k, tb ? k : n };
		int64_t so[2] = { m, n };
		char attrs[64];

		snprintf(attrs, sizeof attrs, "{\"transpose_a\": %s, \"transpose_b\": %s}",
			 ta ? "true" : "false", tb ? "true" : "false");
		/* The same values stored in the layout the flags say. */
		for (int dt = 0; dt < 2; dt++) {
			enum dg_dtype dtype = dt ? DG_F64 : DG_F32;
			struct dg_tensor *ta_t = mk(dtype, 2, sa, NULL);
			struct dg_tensor *tb_t = mk(dtype, 2, sb, NULL);
			struct dg_tensor *o;

			for (int64_t i = 0; i < m; i++)
				for (int64_t p = 0; p < k; p++)
					dg_tensor_set_f64(ta_t, ta ? p * m + i : i * k + p,
							  a[i * k + p]);
			for (int64_t p = 0; p < k; p++)
				for (int64_t j = 0; j < n; j++)
					dg_tensor_set_f64(tb_t, tb ? j * k + p : p * n + j,
							  b[p * n + j]);
			o = ok2("MatMul", attrs, ta_t, tb_t, 2, so);
			/* Inputs are multiples of 2^-8 below 4: products are exact and
			 * every partial sum fits 53 bits, so double is exact; float32
			 * rounds each of the 45 sums by at most 2^-15 (|sum| < 2^10). */
			expect_values(o, want, m * n, dt ? 0 : 2e-3);
			dg_tensor_free(ta_t);
			dg_tensor_free(tb_t);
			dg_tensor_free(o);
		}
	}
	free(a);
	free(b);
	free(want);
}

/* --- inference ------------------------------------------------------------------ */

static enum dg_status infer2(const char *op, const char *attrs, struct dg_ttype x,
			     struct dg_ttype y, struct dg_ttype *out, struct dg_err *err)
{
	struct dg_ttype in[2] = { x, y };
	json_t *j = json_loads(attrs ? attrs : "{}", 0, NULL);
	struct dg_infer_ctx c = { .attrs = j, .n_in = 2, .in = in, .n_out = 1, .out = out,
				  .err = err };
	enum dg_status st = dg_op_find(op)->infer(&c);

	json_decref(j);
	return st;
}

static struct dg_ttype tt(enum dg_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2)
{
	struct dg_ttype t = { .dtype = dt, .shape = { .ndim = ndim } };

	t.shape.dim[0] = d0;
	t.shape.dim[1] = d1;
	t.shape.dim[2] = d2;
	return t;
}

Test(matmul, inference_propagates_unknown_dims_and_rank)
{
	struct dg_ttype out;
	struct dg_err err = { 0 };

	cr_assert_eq(infer2("MatMul", "{\"transpose_b\": true}", tt(DG_F32, 2, -1, 3, 0),
			    tt(DG_F32, 2, 7, -1, 0), &out, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out.dtype, DG_F32);
	cr_assert_eq(out.shape.ndim, 2);
	cr_assert_eq(out.shape.dim[0], -1);
	cr_assert_eq(out.shape.dim[1], 7);
	cr_assert_eq(infer2("MatMul", NULL, tt(DG_F64, -1, 0, 0, 0), tt(DG_F64, 2, 3, 5, 0),
			    &out, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out.dtype, DG_F64);
	cr_assert_eq(out.shape.ndim, 2);
	cr_assert_eq(out.shape.dim[0], -1);
	cr_assert_eq(out.shape.dim[1], 5);
	/* BatchMatMul: [-1,4,3] x [3,-1] -> [-1,4,-1]; unknown rank -> unknown rank. */
	cr_assert_eq(infer2("BatchMatMul", NULL, tt(DG_F32, 3, -1, 4, 3),
			    tt(DG_F32, 2, 3, -1, 0), &out, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out.shape.ndim, 3);
	cr_assert_eq(out.shape.dim[0], -1);
	cr_assert_eq(out.shape.dim[1], 4);
	cr_assert_eq(out.shape.dim[2], -1);
	cr_assert_eq(infer2("BatchMatMul", NULL, tt(DG_F32, -1, 0, 0, 0),
			    tt(DG_F32, 3, 2, 3, 4), &out, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out.shape.ndim, -1);
}

Test(matmul, inference_rejects_what_is_certainly_wrong)
{
	struct dg_ttype out;
	struct dg_err err = { 0 };

	cr_assert_eq(infer2("MatMul", NULL, tt(DG_F32, 2, -1, 3, 0), tt(DG_F32, 2, 4, -1, 0),
			    &out, &err), DG_ESHAPE);
	cr_assert(strstr(err.msg, "inner dimensions differ: [?,3] x [4,?]"), "%s", err.msg);
	cr_assert_eq(infer2("MatMul", NULL, tt(DG_I64, 2, 2, 3, 0), tt(DG_I64, 2, 3, 4, 0),
			    &out, &err), DG_EDTYPE);
	cr_assert_eq(infer2("MatMul", NULL, tt(DG_F32, 3, 2, 3, 4), tt(DG_F32, -1, 0, 0, 0),
			    &out, &err), DG_ESHAPE);
	cr_assert_eq(infer2("BatchMatMul", NULL, tt(DG_F32, 3, 2, 2, 3),
			    tt(DG_F32, 3, 5, 3, 2), &out, &err), DG_ESHAPE);
	cr_assert(strstr(err.msg, "[2] and [5] cannot be broadcast"), "%s", err.msg);
}

/* --- BLAS loading ------------------------------------------------------------------ */

/* Our own check, independent of blas.c: AVX-512 F/DQ/CD/BW/VL plus OS support. */
static bool cpu_has_avx512(void)
{
#if defined(__x86_64__) || defined(__i386__)
	unsigned a, b, c, d;
	uint32_t lo, hi;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
		return false;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	if ((lo & 0xe6) != 0xe6)
		return false;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return false;
	return (b & bit_AVX512F) && (b & bit_AVX512DQ) && (b & bit_AVX512CD) &&
	       (b & bit_AVX512BW) && (b & bit_AVX512VL);
#else
	return false;
#endif
}

Test(matmul, blas_describe_names_openblas_and_its_core)
{
	struct dg_err err = { 0 };

	cr_assert_eq(dg_blas_init(&err), DG_OK, "%s", err.msg);
	const char *s = dg_blas_describe();
	cr_assert(strncmp(s, "OpenBLAS 0.", 11) == 0, "%s", s);
	cr_assert(strstr(s, " core "), "%s", s);
	cr_assert(strstr(s, "OPENBLAS_CORETYPE=") || strstr(s, "detected by OpenBLAS"), "%s", s);
}

Test(matmul, blas_runs_an_avx512_core_on_avx512_cpus_unless_the_user_chose)
{
	struct dg_err err = { 0 };
	const struct dg_blas *bl = dg_blas_get(&err);
	const char *d;

	cr_assert_not_null(bl, "%s", err.msg);
	d = dg_blas_describe();
	if (coretype_was_set) {
		cr_assert(strstr(d, "set by user"), "%s", d);
	} else if (cpu_has_avx512()) {
		/* OpenBLAS's own pick when it knows the CPU, else SkylakeX chosen by dg. */
		cr_assert_eq(dg_blas_core_level(bl->get_corename()), 3, "core %s: %s",
			     bl->get_corename(), d);
		cr_assert(strstr(d, "detected by OpenBLAS") || strstr(d, "SkylakeX chosen by dg"),
			  "%s", d);
	} else {
		cr_assert_lt(dg_blas_core_level(bl->get_corename()), 3, "no AVX-512, yet core %s",
			     bl->get_corename());
	}
}

Test(matmul, core_levels_rank_openblas_cores)
{
	cr_assert_eq(dg_blas_core_level("SkylakeX"), 3);
	cr_assert_eq(dg_blas_core_level("COOPERLAKE"), 3);
	cr_assert_eq(dg_blas_core_level("Haswell"), 2);
	cr_assert_eq(dg_blas_core_level("Zen"), 2);
	cr_assert_eq(dg_blas_core_level("Prescott"), 1);
	cr_assert_eq(dg_blas_core_level("Sandybridge"), 1);
	cr_assert_eq(dg_blas_core_level(""), 1);
	cr_assert_eq(dg_blas_core_level(NULL), 1);
}

Test(matmul, blas_thread_count_can_be_set_and_restored)
{
	const struct dg_blas *bl = dg_blas_get(NULL);
	int start;

	cr_assert_not_null(bl);
	start = bl->get_num_threads();
	dg_blas_set_threads(1);
	cr_assert_eq(bl->get_num_threads(), 1);
	dg_blas_set_threads(0);
	cr_assert_eq(bl->get_num_threads(), start);
}

/* --- float16 and bfloat16: float32 accumulation ------------------------------ */

/* 4096 products of ones: a float16 accumulator would stop at 2048 (2048 + 1
 * rounds back to 2048); float32 accumulation gets 4096, exact in float16. */
Test(matmul, float16_products_accumulate_in_float32)
{
	int64_t sa[] = { 1, 4096 }, sb[] = { 4096, 1 }, s11[] = { 1, 1 };
	struct dg_tensor *a = mk(DG_F16, 2, sa, NULL), *b = mk(DG_F16, 2, sb, NULL), *o;

	for (int64_t i = 0; i < 4096; i++) {
		dg_tensor_set_f64(a, i, 1.0);
		dg_tensor_set_f64(b, i, 1.0);
	}
	o = ok2("MatMul", NULL, a, b, 2, s11);
	cr_assert_eq(o->dtype, DG_F16);
	cr_assert_eq(((uint16_t *)o->data)[0], 0x6c00, "got %g", dg_tensor_get_f64(o, 0));
	dg_tensor_free(o);
	dg_tensor_free(a);
	dg_tensor_free(b);
}

/* The result is rounded once to the input dtype: 1/3 (0x3555) * 3 = 1 - 2^-12,
 * the midpoint of 0x3bff and 1.0, ties to even 1.0; a @ b of the shared A23/B32
 * matrices is exact in both formats. */
Test(matmul, half_results_round_once_to_the_input_dtype)
{
	int64_t s11[] = { 1, 1 };
	struct dg_tensor *a = mk(DG_F16, 2, s11, (double[]){ 1.0 / 3 });
	struct dg_tensor *b = mk(DG_F16, 2, s11, (double[]){ 3 }), *o;

	o = ok2("MatMul", NULL, a, b, 2, s11);
	cr_assert_eq(((uint16_t *)o->data)[0], 0x3c00);
	dg_tensor_free(o);
	dg_tensor_free(a);
	dg_tensor_free(b);
	for (int k = 0; k < 2; k++) {
		enum dg_dtype dt = k ? DG_BF16 : DG_F16;
		struct dg_tensor *x = mk(dt, 2, S23, A23), *y = mk(dt, 2, S32, B32);
		struct dg_tensor *yt = mk(dt, 2, S23, B23T), *xt = mk(dt, 2, S32, A32T);
		o = ok2("MatMul", NULL, x, y, 2, S22);
		cr_assert_eq(o->dtype, dt);
		expect_values(o, AB, 4, 0);
		dg_tensor_free(o);
		o = ok2("MatMul", "{\"transpose_a\": true, \"transpose_b\": true}", xt, yt, 2, S22);
		expect_values(o, AB, 4, 0);
		dg_tensor_free(o);
		dg_tensor_free(x);
		dg_tensor_free(y);
		dg_tensor_free(xt);
		dg_tensor_free(yt);
	}
}

/* [2,2,2] @ [2,2] with a broadcast y, and [1,2,2] @ [3,2,2] with a broadcast x. */
Test(matmul, batch_matmul_takes_half_inputs_with_broadcast_batches)
{
	int64_t s222[] = { 2, 2, 2 }, s122[] = { 1, 2, 2 }, s322[] = { 3, 2, 2 };
	const double x[] = { 1, 2, 3, 4, 5, 6, 7, 8 }, e[] = { 1, 0, 0, 1 };
	struct dg_tensor *a = mk(DG_BF16, 3, s222, x), *b = mk(DG_BF16, 2, S22, e), *o;

	o = ok2("BatchMatMul", NULL, a, b, 3, s222);
	cr_assert_eq(o->dtype, DG_BF16);
	expect_values(o, x, 8, 0);
	dg_tensor_free(o);
	dg_tensor_free(a);
	dg_tensor_free(b);
	const double y[] = { 1, 0, 0, 1, 0, 1, 1, 0, 2, 0, 0, 2 };
	const double w[] = { 1, 2, 3, 4, 2, 1, 4, 3, 2, 4, 6, 8 };
	a = mk(DG_F16, 3, s122, x);
	b = mk(DG_F16, 3, s322, y);
	o = ok2("BatchMatMul", NULL, a, b, 3, s322);
	expect_values(o, w, 12, 0);
	dg_tensor_free(o);
	dg_tensor_free(a);
	dg_tensor_free(b);
}

Test(matmul, half_products_refuse_mixed_and_integer_dtypes)
{
	int64_t s11[] = { 1, 1 };
	struct dg_tensor *h = mk(DG_F16, 2, s11, NULL), *f = mk(DG_F32, 2, s11, NULL);
	struct dg_tensor *bh = mk(DG_BF16, 2, s11, NULL), *i = mk(DG_I32, 2, s11, NULL);

	expect_error("MatMul", NULL, h, f, DG_EDTYPE, "mixed dtypes float16 and float32", "Cast");
	expect_error("MatMul", NULL, h, bh, DG_EDTYPE, "mixed dtypes float16 and bfloat16", NULL);
	expect_error("BatchMatMul", NULL, i, i, DG_EDTYPE,
		     "support float32, float64, float16 and bfloat16, got int32", "Cast");
	dg_tensor_free(h);
	dg_tensor_free(f);
	dg_tensor_free(bh);
	dg_tensor_free(i);
}
