/* Criterion suite 'cuda': every op with a CUDA kernel (kernels/cuda) against
 * its CPU kernel (dg_op_run) on the same random inputs (fixed seeds), for each
 * covered dtype, with broadcasting shapes, empty tensors and sizes that are not
 * multiples of the block size; data-dependent errors must match too. Plus the
 * allocator and transfers, and (suite cuda_exec) graphs placed on /gpu:0 run by
 * worker/exec.c, up to an MLP training step. GPU tests skip where none is present. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dg/autodiff.h"
#include "dg/cuda.h"
#include "dg/exec.h"
#include "dg/gpu.h"
#include "dg/graph.h"
#include "dg/kernels.h"
#include "mlp_step.h"

static struct dg_cuda_stream *S;

static void setup(void)
{
	struct dg_err err = { 0 };

	if (!dg_cuda_available())
		return;
	cr_assert_eq(dg_cuda_stream_new(0, &S, &err), DG_OK, "stream: %s", err.msg);
}

static void teardown(void)
{
	dg_cuda_stream_free(S);
	S = NULL;
}

TestSuite(cuda, .init = setup, .fini = teardown, .timeout = 240);

/* cuBLAS is opened at its first use: it must load, with every function dg
 * calls, also on a machine without a GPU (the toolkit was there to build). */
Test(cuda, cublas_loads_on_first_use_with_every_function_dg_calls)
{
	struct dg_err err = { 0 };
	enum dg_status st = dg_cuda_blas_load(&err);

	if (st == DG_EUNSUPPORTED)
		cr_skip_test("%s", err.msg);
	cr_assert_eq(st, DG_OK, "%s", err.msg);
}

#define NEED_GPU()                                                                           \
	do {                                                                                 \
		if (!dg_cuda_available())                                                    \
			cr_skip_test("no CUDA device: %s", dg_gpu_describe());               \
	} while (0)

/* --- inputs ------------------------------------------------------------------ */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * 0x1p-53;
}

/* Value kinds: what a test needs its inputs to be. */
enum gen { G_ANY, G_POS, G_SMALLINT, G_TIES, G_PROB, G_BOOL };

static struct dg_tensor *mk(enum dg_dtype dt, const char *shape, enum gen g)
{
	struct dg_err err = { 0 };
	struct dg_shape s;
	struct dg_tensor *t;

	cr_assert_eq(dg_shape_parse(shape, &s, &err), DG_OK, "%s: %s", shape, err.msg);
	t = dg_tensor_new(dt, &s, &err);
	cr_assert_not_null(t, "%s", err.msg);
	for (int64_t i = 0; i < t->numel; i++) {
		double u = urand(), v;
		switch (g) {
		case G_POS: v = 0.25 + 2.0 * u; break;
		case G_SMALLINT: v = floor(u * 11) - 5; break;
		case G_TIES: v = floor(u * 7) * 0.5 - 1.5; break;
		case G_PROB: v = u; break;
		case G_BOOL: v = u < 0.5; break;
		default: v = (u - 0.5) * 8.0; break;
		}
		if (dt == DG_U8)
			v = floor(u * 40);
		else if (dg_dtype_is_int(dt) && g == G_ANY)
			v = floor((u - 0.5) * 2000);
		else if (dt == DG_BOOL)
			v = u < 0.5;
		dg_tensor_set_f64(t, i, v);
	}
	return t;
}

static json_t *attrs_of(const char *js)
{
	json_error_t je;
	json_t *a = json_loads(js ? js : "{}", 0, &je);

	cr_assert_not_null(a, "bad test JSON %s: %s", js, je.text);
	return a;
}

/* --- comparing ------------------------------------------------------------------ */

struct tol {
	double rel, abs;
};

static const struct tol ELT = { 1e-5, 1e-6 };     /* float32 elementwise; f64 uses 1e-12 */
static const struct tol RED = { 1e-4, 1e-5 };     /* float32 reductions, matmul; f64 1e-10 */
static const struct tol EXACT = { 0, 0 };
/* 16-bit products: both sides accumulate in float32 (in different orders) and
 * round once to the output dtype, which may then differ by an ulp: 2^-11
 * relative for float16, 2^-8 for bfloat16. */
static const struct tol HALF_MM = { 1e-3, 1e-2 };
static const struct tol BF16_MM = { 1e-2, 1e-2 };

static struct tol mm_tol(enum dg_dtype dt)
{
	return dt == DG_F16 ? HALF_MM : dt == DG_BF16 ? BF16_MM : RED;
}

static void expect_close(const struct dg_tensor *c, const struct dg_tensor *g, struct tol t,
			 const char *what)
{
	char sc[64], sg[64];

	if (c->dtype == DG_F64 && t.rel > 0) {
		t.rel = t.rel >= 1e-4 ? 1e-10 : 1e-12;
		t.abs = t.abs > 0 ? 1e-12 : 0;
	}
	dg_shape_format(&c->shape, sc, sizeof sc);
	dg_shape_format(&g->shape, sg, sizeof sg);
	cr_assert_eq(c->dtype, g->dtype, "%s: dtype cpu %s gpu %s", what, dg_dtype_name(c->dtype),
		     dg_dtype_name(g->dtype));
	cr_assert(dg_shape_eq(&c->shape, &g->shape), "%s: shape cpu %s gpu %s", what, sc, sg);
	for (int64_t i = 0; i < c->numel; i++) {
		double a = dg_tensor_get_f64(c, i), b = dg_tensor_get_f64(g, i);
		if (isnan(a) || isnan(b)) {
			cr_assert(isnan(a) && isnan(b), "%s %s: element %lld cpu %.17g gpu %.17g",
				  what, sc, (long long)i, a, b);
			continue;
		}
		if (a == b)
			continue;   /* also equal infinities */
		cr_assert(fabs(a - b) <= t.abs + t.rel * fabs(a),
			  "%s %s %s: element %lld cpu %.17g gpu %.17g (rel %.3g)", what, sc,
			  dg_dtype_name(c->dtype), (long long)i, a, b, fabs(a - b) / fabs(a));
	}
}

/* Run op on the CPU and the GPU with the same inputs (borrowed) and compare
 * its n_out outputs; when the CPU refuses, the GPU must refuse with the same
 * code. */
static void parity_n(const char *opname, const char *js, struct dg_tensor *const *in, int n_in,
		     int n_out, uint64_t step, struct tol t)
{
	const struct dg_op_def *op = dg_op_find(opname);
	json_t *a = attrs_of(js);
	struct dg_err ec = { 0 }, eg = { 0 };
	struct dg_tensor *cpu[4] = { 0 }, *back = NULL;
	struct dg_cuda_tensor *din[8] = { 0 }, *gout[4] = { 0 };
	char what[256];
	enum dg_status sc, sg;

	cr_assert_not_null(op, "op %s is not registered", opname);
	cr_assert(dg_cuda_supports(op), "%s has no CUDA kernel", opname);
	cr_assert(n_out >= 1 && n_out <= 4);
	snprintf(what, sizeof what, "%s %s", opname, js ? js : "{}");
	for (int i = 0; i < n_in; i++) {
		din[i] = dg_cuda_upload(S, in[i], &eg);
		cr_assert_not_null(din[i], "%s: upload %d: %s", what, i, eg.msg);
	}
	sc = dg_op_run(op, a, (const struct dg_tensor *const *)in, n_in, cpu, n_out, step, &ec);
	sg = dg_cuda_run(S, op, a, (const struct dg_cuda_tensor *const *)din, n_in, gout, n_out,
			 step, &eg);
	if (sc != DG_OK) {
		cr_assert_eq(sg, sc, "%s: cpu failed %d (%s), gpu gave %d (%s)", what, sc, ec.msg,
			     sg, eg.msg);
		for (int k = 0; k < n_out; k++)
			cr_assert_null(gout[k]);
	} else {
		cr_assert_eq(sg, DG_OK, "%s: gpu failed: %s", what, eg.msg);
		cr_assert_eq(dg_cuda_stream_sync(S, &eg), DG_OK, "%s: %s", what, eg.msg);
		for (int k = 0; k < n_out; k++) {
			back = dg_cuda_download(S, gout[k], &eg);
			cr_assert_not_null(back, "%s: download: %s", what, eg.msg);
			expect_close(cpu[k], back, t, what);
			dg_tensor_free(back);
		}
	}
	for (int k = 0; k < n_out; k++) {
		dg_tensor_free(cpu[k]);
		dg_cuda_tensor_free(gout[k]);
	}
	for (int i = 0; i < n_in; i++)
		dg_cuda_tensor_free(din[i]);
	json_decref(a);
}

static void parity(const char *opname, const char *js, struct dg_tensor *const *in, int n_in,
		   uint64_t step, struct tol t)
{
	parity_n(opname, js, in, n_in, 1, step, t);
}

static void parity1(const char *op, const char *js, enum dg_dtype dt, const char *shape,
		    enum gen g, struct tol t)
{
	struct dg_tensor *x = mk(dt, shape, g);

	parity(op, js, &x, 1, 0, t);
	dg_tensor_free(x);
}

static void parity2(const char *op, const char *js, enum dg_dtype dt, const char *sa,
		    const char *sb, enum gen g, struct tol t)
{
	struct dg_tensor *in[2] = { mk(dt, sa, g), mk(dt, sb, g) };

	parity(op, js, in, 2, 0, t);
	dg_tensor_free(in[0]);
	dg_tensor_free(in[1]);
}

static const enum dg_dtype FLOATS[] = { DG_F32, DG_F64 };
/* The dtypes of the products: the floats and the 16-bit storage floats. */
static const enum dg_dtype MM_DTS[] = { DG_F32, DG_F64, DG_F16, DG_BF16 };
#define N_MM (sizeof MM_DTS / sizeof MM_DTS[0])

/* Odd sizes on purpose: 1, a prime, one past a block, several grid-strides. */
static const char *const SHAPES1[] = { "0", "1", "7,13", "257", "1025", "3,0,5", "600011",
				       "2,3,4,5,6,1,1,7" };
#define NS1 (sizeof SHAPES1 / sizeof SHAPES1[0])

/* --- elementwise -------------------------------------------------------------------- */

Test(cuda, unary_ops_match_cpu_on_every_dtype_and_size)
{
	static const char *const flt[] = { "Sqrt", "Exp", "Log", "Sigmoid", "Tanh" };
	static const char *const num[] = { "Neg", "Abs", "Square", "Relu" };
	static const enum dg_dtype ndt[] = { DG_F32, DG_F64, DG_I32, DG_I64 };

	NEED_GPU();
	for (size_t s = 0; s < NS1; s++) {
		for (size_t o = 0; o < 5; o++)
			for (int d = 0; d < 2; d++)
				parity1(flt[o], NULL, FLOATS[d], SHAPES1[s],
					o == 0 || o == 2 ? G_POS : G_ANY, ELT);
		for (size_t o = 0; o < 4; o++)
			for (int d = 0; d < 4; d++)
				parity1(num[o], NULL, ndt[d], SHAPES1[s], G_ANY, ELT);
	}
}

Test(cuda, unary_ops_keep_nan_and_infinities_like_cpu)
{
	static const char *const ops[] = { "Neg", "Abs", "Square", "Relu", "Sqrt", "Exp", "Log",
					   "Sigmoid", "Tanh" };
	static const double special[] = { NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e30, -1e30,
					  100.0, -100.0 };

	NEED_GPU();
	for (int d = 0; d < 2; d++) {
		struct dg_tensor *x = mk(FLOATS[d], "9", G_ANY);
		for (int i = 0; i < 9; i++)
			dg_tensor_set_f64(x, i, special[i]);
		for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
			parity(ops[o], NULL, &x, 1, 0, ELT);
		dg_tensor_free(x);
	}
}

/* Shape pairs that broadcast in every way the walk has to handle. */
static const char *const BC[][2] = {
	{ "33,65", "33,65" }, { "33,65", "65" }, { "65", "33,65" }, { "33,1", "1,65" },
	{ "", "4,5" }, { "4,5", "" }, { "2,1,3,1,5", "4,1,6,1" }, { "0,3", "3" }, { "0,3", "1,3" },
	{ "3,1,2,1,2,1,2,3", "1,2,1,2,1,2,1" }, { "1025", "1" }, { "7,1,1", "1,1,9" },
	{ "600011", "600011" },
};
#define NBC (sizeof BC / sizeof BC[0])

Test(cuda, binary_arithmetic_matches_cpu_with_broadcasting)
{
	static const char *const ops[] = { "Add", "Sub", "Mul", "Div", "Pow", "Maximum",
					   "Minimum" };
	static const enum dg_dtype dts[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_U8 };

	NEED_GPU();
	for (size_t b = 0; b < NBC; b++) {
		for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
			for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
				bool flt_only = !strcmp(ops[o], "Div") || !strcmp(ops[o], "Pow");
				if (flt_only && !dg_dtype_is_float(dts[d]))
					continue;   /* integer Div/Pow: CPU only */
				parity2(ops[o], NULL, dts[d], BC[b][0], BC[b][1],
					flt_only ? G_POS : G_ANY, ELT);
			}
		}
	}
}

/* Add, Sub, Mul and Relu on the 16-bit floats: float32 math rounded once on
 * both sides, so the results agree bit for bit; the other ops refuse them
 * at inference on both sides alike. */
Test(cuda, half_elementwise_ops_match_cpu_bit_for_bit)
{
	static const char *const ops[] = { "Add", "Sub", "Mul" };
	static const enum dg_dtype dts[] = { DG_F16, DG_BF16 };

	NEED_GPU();
	for (size_t d = 0; d < 2; d++) {
		for (size_t b = 0; b < NBC; b++)
			for (size_t o = 0; o < 3; o++)
				parity2(ops[o], NULL, dts[d], BC[b][0], BC[b][1], G_ANY, EXACT);
		for (size_t s = 0; s < NS1; s++)
			parity1("Relu", NULL, dts[d], SHAPES1[s], G_ANY, EXACT);
		/* overflow to inf, NaN through Relu, ties */
		struct dg_tensor *in[2] = { mk(dts[d], "4", G_ANY), mk(dts[d], "4", G_ANY) };
		const double a[] = { 65504, NAN, 1, -2 }, b2[] = { 65504, 1, 0x1p-11, -0.0 };
		for (int i = 0; i < 4; i++) {
			dg_tensor_set_f64(in[0], i, a[i]);
			dg_tensor_set_f64(in[1], i, b2[i]);
		}
		parity("Mul", NULL, in, 2, 0, EXACT);
		parity("Add", NULL, in, 2, 0, EXACT);
		parity("Relu", NULL, in, 1, 0, EXACT);
		parity("Sqrt", NULL, in, 1, 0, EXACT);   /* both refuse: DG_EDTYPE */
		parity("Div", NULL, in, 2, 0, EXACT);
		dg_tensor_free(in[0]);
		dg_tensor_free(in[1]);
	}
}

Test(cuda, comparisons_match_cpu_including_ties_and_bool)
{
	static const char *const ops[] = { "Equal", "NotEqual", "Less", "LessEqual", "Greater",
					   "GreaterEqual" };
	static const enum dg_dtype dts[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_U8 };

	NEED_GPU();
	for (size_t b = 0; b < NBC; b++) {
		for (size_t o = 0; o < 6; o++)
			for (size_t d = 0; d < 5; d++)
				parity2(ops[o], NULL, dts[d], BC[b][0], BC[b][1], G_TIES, EXACT);
		parity2("Equal", NULL, DG_BOOL, BC[b][0], BC[b][1], G_BOOL, EXACT);
		parity2("NotEqual", NULL, DG_BOOL, BC[b][0], BC[b][1], G_BOOL, EXACT);
	}
}

Test(cuda, integer_div_and_pow_are_refused_for_cpu_fallback)
{
	struct dg_tensor *in[2];
	struct dg_cuda_tensor *d[2], *o = NULL;
	struct dg_err err = { 0 };

	NEED_GPU();
	in[0] = mk(DG_I32, "5", G_ANY);
	in[1] = mk(DG_I32, "5", G_ANY);
	d[0] = dg_cuda_upload(S, in[0], &err);
	d[1] = dg_cuda_upload(S, in[1], &err);
	cr_assert(d[0] && d[1], "%s", err.msg);
	cr_assert_eq(dg_cuda_run(S, dg_op_find("Div"), NULL, (const struct dg_cuda_tensor **)d, 2,
				 &o, 1, 0, &err), DG_EDTYPE);
	cr_assert_null(o);
	cr_assert_not_null(strstr(err.msg, "no CUDA kernel for int32"), "%s", err.msg);
	dg_cuda_tensor_free(d[0]);
	dg_cuda_tensor_free(d[1]);
	dg_tensor_free(in[0]);
	dg_tensor_free(in[1]);
}

Test(cuda, binary_shape_mismatch_fails_like_cpu)
{
	NEED_GPU();
	parity2("Add", NULL, DG_F32, "3,4", "5", G_ANY, ELT);
	parity2("Mul", NULL, DG_F64, "2,3", "3,2", G_ANY, ELT);
}

Test(cuda, where_matches_cpu_for_every_dtype_and_broadcast)
{
	static const char *const sh[][3] = {
		{ "40,33", "40,33", "40,33" }, { "33", "40,33", "" }, { "40,1", "1,33", "40,33" },
		{ "", "5", "5" }, { "0,2", "2", "1" }, { "2,1,3,1", "1,4,1,5", "3,1" },
		{ "600011", "600011", "1" },
	};
	static const enum dg_dtype dts[] = { DG_F32, DG_F64, DG_I32, DG_I64,
					     DG_U8,  DG_BOOL, DG_F16, DG_BF16 };

	NEED_GPU();
	for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
		for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
			struct dg_tensor *in[3] = { mk(DG_BOOL, sh[s][0], G_BOOL),
						    mk(dts[d], sh[s][1], G_ANY),
						    mk(dts[d], sh[s][2], G_ANY) };
			parity("Where", NULL, in, 3, 0, EXACT);
			for (int i = 0; i < 3; i++)
				dg_tensor_free(in[i]);
		}
	}
}

Test(cuda, cast_matches_cpu_for_all_64_dtype_pairs)
{
	NEED_GPU();
	for (int from = 0; from < DG_DTYPE_COUNT; from++) {
		for (int to = 0; to < DG_DTYPE_COUNT; to++) {
			char js[64];
			/* Values every target can hold: floats in [0, 40) with fractions. */
			struct dg_tensor *x = mk((enum dg_dtype)from, "1031", G_PROB);
			for (int64_t i = 0; i < x->numel; i++)
				dg_tensor_set_f64(x, i, from == DG_BOOL ? (double)(i % 2)
							: (double)(i % 40) + 0.75 * (i % 3));
			snprintf(js, sizeof js, "{\"dtype\":\"%s\"}",
				 dg_dtype_name((enum dg_dtype)to));
			parity("Cast", js, &x, 1, 0, EXACT);
			dg_tensor_free(x);
		}
	}
}

/* Rounding to the 16-bit floats at the hard places: ties (to even), values
 * past the largest finite one (inf), subnormals, NaN, -0, and integers whose
 * low bits decide a bfloat16 tie. Both sides round correctly: bit for bit. */
Test(cuda, cast_to_16_bit_floats_rounds_like_cpu_at_ties_and_overflow)
{
	static const double v[] = { 1.0 / 3, 65519, 65520, -1e9, 0x1p-25, 3 * 0x1p-25,
				    1 + 0x1p-11, 1 + 3 * 0x1p-11, 1.00390625, 1.01171875,
				    1 + 0x1p-11 + 0x1p-30, 3.4028234663852886e38, NAN,
				    -INFINITY, -0.0, 1e-40, 0x1p-133, 2049, 2051, 0.1 };
	static const enum dg_dtype src[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_F16, DG_BF16 };
	const int n = (int)(sizeof v / sizeof v[0]);

	NEED_GPU();
	for (size_t s = 0; s < sizeof src / sizeof src[0]; s++) {
		for (int to = DG_F16; to <= DG_BF16; to++) {
			struct dg_tensor *x = mk(src[s], "20", G_ANY);
			for (int i = 0; i < n; i++) {
				if (dg_dtype_is_int(src[s]))   /* ties of int -> 16 bits */
					dg_tensor_set_f64(x, i, (double)(2049 + 2 * i) *
								(src[s] == DG_I64 ? 0x1p40 : 1));
				else
					dg_tensor_set_f64(x, i, v[i]);
			}
			if (src[s] == DG_I64)   /* 2^56 + 2^48 + 1: just past a bfloat16 tie */
				((int64_t *)x->data)[0] =
					(INT64_C(1) << 56) + (INT64_C(1) << 48) + 1;
			parity("Cast", to == DG_F16 ? "{\"dtype\":\"float16\"}"
						  : "{\"dtype\":\"bfloat16\"}", &x, 1, 0, EXACT);
			dg_tensor_free(x);
		}
	}
}

Test(cuda, cast_wraps_integers_and_refuses_nan_like_cpu)
{
	struct dg_tensor *x;

	NEED_GPU();
	x = mk(DG_I64, "4", G_ANY);
	dg_tensor_set_f64(x, 0, 4294967301.0);
	dg_tensor_set_f64(x, 1, -1);
	dg_tensor_set_f64(x, 2, 300);
	dg_tensor_set_f64(x, 3, -2147483649.0);
	parity("Cast", "{\"dtype\":\"int32\"}", &x, 1, 0, EXACT);
	parity("Cast", "{\"dtype\":\"uint8\"}", &x, 1, 0, EXACT);
	dg_tensor_free(x);
	x = mk(DG_F32, "1000", G_ANY);
	dg_tensor_set_f64(x, 777, NAN);
	parity("Cast", "{\"dtype\":\"int32\"}", &x, 1, 0, EXACT);   /* both DG_EINVAL */
	dg_tensor_set_f64(x, 777, 1e20);
	parity("Cast", "{\"dtype\":\"int64\"}", &x, 1, 0, EXACT);
	parity("Cast", "{\"dtype\":\"bool\"}", &x, 1, 0, EXACT);
	dg_tensor_free(x);
}

/* --- reductions ---------------------------------------------------------------------- */

struct rcase {
	const char *shape, *attrs;
};

static const struct rcase RC[] = {
	{ "600011", "{}" }, { "1", "{\"axis\":0}" }, { "37,129", "{\"axis\":0}" },
	{ "37,129", "{\"axis\":1}" }, { "37,129", "{\"axis\":[0,1]}" },
	{ "37,129", "{\"axis\":-1,\"keepdims\":true}" }, { "5,6,7,8", "{\"axis\":[0,2]}" },
	{ "5,6,7,8", "{\"axis\":[1,3],\"keep_dims\":true}" }, { "5,6,7,8", "{\"axis\":3}" },
	{ "5,6,7,8", "{\"axis\":null}" }, { "4,0,3", "{\"axis\":1}" }, { "0,5", "{\"axis\":1}" },
	{ "3,1,4", "{\"axis\":[1]}" }, { "", "{}" }, { "2,1,3,1,2,1,3,2", "{\"axis\":[0,3,6]}" },
	{ "4097,3", "{\"axis\":0}" }, { "3,70001", "{\"axis\":1}" },
};

Test(cuda, sum_mean_max_min_match_cpu_over_axes)
{
	static const char *const ops[] = { "Sum", "Mean", "Max", "Min" };

	NEED_GPU();
	for (size_t c = 0; c < sizeof RC / sizeof RC[0]; c++)
		for (int o = 0; o < 4; o++)
			for (int d = 0; d < 2; d++)
				parity1(ops[o], RC[c].attrs, FLOATS[d], RC[c].shape,
					o < 2 ? G_POS : G_ANY, o < 2 ? RED : EXACT);
}

Test(cuda, max_and_min_propagate_nan_like_cpu)
{
	NEED_GPU();
	for (int d = 0; d < 2; d++) {
		struct dg_tensor *x = mk(FLOATS[d], "6,1000", G_ANY);
		dg_tensor_set_f64(x, 2500, NAN);
		dg_tensor_set_f64(x, 10, INFINITY);
		parity("Max", "{\"axis\":1}", &x, 1, 0, EXACT);
		parity("Min", "{\"axis\":0}", &x, 1, 0, EXACT);
		parity("Max", "{}", &x, 1, 0, EXACT);
		parity("Sum", "{\"axis\":1}", &x, 1, 0, RED);
		dg_tensor_free(x);
	}
}

Test(cuda, argmax_matches_cpu_with_ties_and_nan)
{
	static const char *const at[] = { "{}", "{\"axis\":1}", "{\"axis\":-1}",
					   "{\"axis\":0,\"output_type\":\"int32\"}" };
	static const enum dg_dtype dts[] = { DG_F32, DG_F64, DG_I32, DG_I64, DG_U8 };

	NEED_GPU();
	for (size_t d = 0; d < 5; d++) {
		for (size_t a = 0; a < 4; a++) {
			parity1("ArgMax", at[a], dts[d], "37,129", G_TIES, EXACT);
			parity1("ArgMax", at[a], dts[d], "3,5,7", G_TIES, EXACT);
			parity1("ArgMax", at[a], dts[d], "0,4", G_TIES, EXACT);
		}
		parity1("ArgMax", "{}", dts[d], "100003", G_ANY, EXACT);
	}
	struct dg_tensor *x = mk(DG_F32, "4,9", G_TIES);
	dg_tensor_set_f64(x, 5, NAN);
	dg_tensor_set_f64(x, 7, NAN);
	dg_tensor_set_f64(x, 20, NAN);
	parity("ArgMax", "{\"axis\":1}", &x, 1, 0, EXACT);
	parity("ArgMax", "{\"axis\":0}", &x, 1, 0, EXACT);
	dg_tensor_free(x);
}

/* --- nn ------------------------------------------------------------------------------- */

Test(cuda, softmax_and_log_softmax_match_cpu_on_any_axis)
{
	static const struct rcase sc[] = {
		{ "64,10", "{}" }, { "3,17,5", "{\"axis\":1}" }, { "2,3,4", "{\"axis\":0}" },
		{ "1,1", "{}" }, { "0,10", "{}" }, { "7", "{\"axis\":-1}" }, { "5,3001", "{}" },
		{ "4097,3", "{\"axis\":1}" },
	};

	NEED_GPU();
	for (size_t c = 0; c < sizeof sc / sizeof sc[0]; c++) {
		for (int d = 0; d < 2; d++) {
			parity1("Softmax", sc[c].attrs, FLOATS[d], sc[c].shape, G_ANY, ELT);
			parity1("LogSoftmax", sc[c].attrs, FLOATS[d], sc[c].shape, G_ANY, ELT);
		}
	}
	for (int d = 0; d < 2; d++) {
		struct dg_tensor *x = mk(FLOATS[d], "4,5", G_ANY);
		dg_tensor_set_f64(x, 1, NAN);
		dg_tensor_set_f64(x, 7, INFINITY);
		for (int i = 10; i < 15; i++)
			dg_tensor_set_f64(x, i, -INFINITY);
		dg_tensor_set_f64(x, 16, -INFINITY);
		parity("Softmax", NULL, &x, 1, 0, ELT);
		parity("LogSoftmax", NULL, &x, 1, 0, ELT);
		dg_tensor_free(x);
	}
}

Test(cuda, cross_entropies_match_cpu)
{
	static const char *const sh[][2] = { { "64,10", "64" }, { "3,4,7", "3,4" },
					     { "1,1", "1" }, { "0,5", "0" }, { "5,1001", "5" } };

	NEED_GPU();
	for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
		for (int d = 0; d < 2; d++) {
			struct dg_tensor *in[2] = { mk(FLOATS[d], sh[s][0], G_ANY),
						    mk(FLOATS[d], sh[s][0], G_PROB) };
			parity("SoftmaxCrossEntropyWithLogits", NULL, in, 2, 0, RED);
			dg_tensor_free(in[1]);
			for (int l = 0; l < 2; l++) {
				int64_t n = in[0]->shape.dim[in[0]->shape.ndim - 1];
				in[1] = mk(l ? DG_I64 : DG_I32, sh[s][1], G_PROB);
				for (int64_t i = 0; i < in[1]->numel; i++)
					dg_tensor_set_f64(in[1], i, (double)((i * 7 + 3) % n));
				parity("SparseSoftmaxCrossEntropyWithLogits", NULL, in, 2, 0, RED);
				if (in[1]->numel > 0) {
					/* out of range: both refuse with DG_EINVAL */
					dg_tensor_set_f64(in[1], in[1]->numel - 1, (double)n);
					parity("SparseSoftmaxCrossEntropyWithLogits", NULL,
					       in, 2, 0, RED);
				}
				dg_tensor_free(in[1]);
			}
			dg_tensor_free(in[0]);
		}
	}
}

/* --- matmul ---------------------------------------------------------------------------- */

Test(cuda, matmul_matches_cpu_for_all_transposes)
{
	static const int64_t mnk[][3] = { { 1, 1, 1 }, { 17, 33, 65 }, { 128, 256, 64 },
					  { 5, 7, 0 }, { 0, 4, 3 }, { 300, 1, 513 } };
	static const char *const at[] = {
		"{}", "{\"transpose_a\":true}", "{\"transpose_b\":true}",
		"{\"transpose_a\":true,\"transpose_b\":true}",
	};

	NEED_GPU();
	for (size_t c = 0; c < sizeof mnk / sizeof mnk[0]; c++) {
		for (int t = 0; t < 4; t++) {
			for (size_t d = 0; d < N_MM; d++) {
				char sa[64], sb[64];
				int64_t m = mnk[c][0], n = mnk[c][1], k = mnk[c][2];
				bool ta = t & 1, tb = t & 2;
				snprintf(sa, sizeof sa, "%lld,%lld", (long long)(ta ? k : m),
					 (long long)(ta ? m : k));
				snprintf(sb, sizeof sb, "%lld,%lld", (long long)(tb ? n : k),
					 (long long)(tb ? k : n));
				struct dg_tensor *in[2] = { mk(MM_DTS[d], sa, G_ANY),
							    mk(MM_DTS[d], sb, G_ANY) };
				parity("MatMul", at[t], in, 2, 0, mm_tol(MM_DTS[d]));
				dg_tensor_free(in[0]);
				dg_tensor_free(in[1]);
			}
		}
	}
}

Test(cuda, batch_matmul_matches_cpu_with_broadcast_batches)
{
	static const char *const sh[][2] = {
		{ "3,17,9", "3,9,5" }, { "2,1,4,6", "3,6,5" }, { "4,6", "2,3,6,5" },
		{ "2,3,4,6", "6,5" }, { "1,4,6", "3,6,5" }, { "2,3,4,6", "2,1,6,5" },
		{ "0,4,6", "0,6,5" }, { "5,4,0", "5,0,3" },
	};

	NEED_GPU();
	for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
		for (size_t d = 0; d < N_MM; d++) {
			parity2("BatchMatMul", NULL, MM_DTS[d], sh[s][0], sh[s][1], G_ANY,
				mm_tol(MM_DTS[d]));
		}
	}
	/* adj_x / adj_y: [2,9,17] is x transposed, [2,5,9] y transposed. */
	parity2("BatchMatMul", "{\"adj_x\":true}", DG_F32, "2,9,17", "2,9,5", G_ANY, RED);
	parity2("BatchMatMul", "{\"adj_y\":true}", DG_F32, "2,17,9", "2,5,9", G_ANY, RED);
	parity2("BatchMatMul", "{\"adj_x\":true,\"adj_y\":true}", DG_F64, "3,1,9,17", "2,5,9",
		G_ANY, RED);
}

/* --- array ------------------------------------------------------------------------------ */

static const enum dg_dtype ALL[] = { DG_F32, DG_F64, DG_I32, DG_I64,
				     DG_U8,  DG_BOOL, DG_F16, DG_BF16 };
#define N_ALL (sizeof ALL / sizeof ALL[0])

Test(cuda, slice_transpose_reshape_and_friends_match_cpu)
{
	static const struct rcase sl[] = {
		{ "10,20", "{\"begin\":[2,3],\"size\":[5,-1]}" },
		{ "10,20", "{\"begin\":[0,0],\"size\":[10,20]}" },
		{ "4,5,6", "{\"begin\":[1,0,2],\"size\":[2,5,3]}" },
		{ "7", "{\"begin\":[7],\"size\":[0]}" },
		{ "600011", "{\"begin\":[3],\"size\":[-1]}" },
	};
	static const struct rcase tr[] = {
		{ "10,20", "{}" }, { "4,5,6", "{\"perm\":[1,2,0]}" },
		{ "4,5,6", "{\"perm\":[0,2,1]}" },
		{ "7", "{}" }, { "", "{}" }, { "2,3,1,2,3,2,1,2", "{\"perm\":[7,0,6,1,5,2,4,3]}" },
		{ "0,3", "{}" }, { "513,257", "{}" },
	};

	NEED_GPU();
	for (size_t d = 0; d < N_ALL; d++) {
		for (size_t c = 0; c < sizeof sl / sizeof sl[0]; c++)
			parity1("Slice", sl[c].attrs, ALL[d], sl[c].shape, G_ANY, EXACT);
		for (size_t c = 0; c < sizeof tr / sizeof tr[0]; c++)
			parity1("Transpose", tr[c].attrs, ALL[d], tr[c].shape, G_ANY, EXACT);
		parity1("Reshape", "{\"shape\":[5,-1]}", ALL[d], "10,6", G_ANY, EXACT);
		parity1("Reshape", "{\"shape\":[0,3]}", ALL[d], "0", G_ANY, EXACT);
		parity1("ExpandDims", "{\"axis\":1}", ALL[d], "3,4", G_ANY, EXACT);
		parity1("Squeeze", "{}", ALL[d], "3,1,4,1", G_ANY, EXACT);
		parity1("Identity", NULL, ALL[d], "1025", G_ANY, EXACT);
		parity1("ZerosLike", NULL, ALL[d], "1025", G_ANY, EXACT);
	}
	parity1("Slice", "{\"begin\":[8],\"size\":[5]}", DG_F32, "10", G_ANY, EXACT);
}

Test(cuda, concat_matches_cpu_on_every_axis)
{
	static const char *const sh[][3] = {
		{ "2,3", "4,3", "1,3" }, { "3,2", "3,5", "3,0" }, { "2,3,4", "2,1,4", "2,7,4" },
		{ "5", "0", "1025" },
	};
	static const char *const ax[] = { "{\"axis\":0}", "{\"axis\":1}", "{\"axis\":1}",
					  "{\"axis\":-1}" };

	NEED_GPU();
	for (size_t s = 0; s < 4; s++) {
		for (size_t d = 0; d < N_ALL; d++) {
			struct dg_tensor *in[3] = { mk(ALL[d], sh[s][0], G_ANY),
						    mk(ALL[d], sh[s][1], G_ANY),
						    mk(ALL[d], sh[s][2], G_ANY) };
			parity("Concat", ax[s], in, 3, 0, EXACT);
			parity("Concat", ax[s], in, 1, 0, EXACT);
			for (int i = 0; i < 3; i++)
				dg_tensor_free(in[i]);
		}
	}
}

/* --- random ------------------------------------------------------------------------------ */

Test(cuda, initialisers_draw_the_cpu_stream)
{
	static const char *const cases[][2] = {
		{ "RandomUniform", "{\"shape\":[1001],\"seed\":7}" },
		{ "RandomUniform", "{\"shape\":[3,333],\"seed\":-5,\"minval\":-2,\"maxval\":3.5}" },
		{ "RandomUniform", "{\"shape\":[1001],\"dtype\":\"float64\",\"seed\":7}" },
		{ "RandomUniform", "{\"shape\":[1001],\"dtype\":\"int32\",\"minval\":-9,"
				   "\"maxval\":1000}" },
		{ "RandomUniform", "{\"shape\":[999],\"dtype\":\"int64\",\"minval\":-9000000000,"
				   "\"maxval\":9000000000,\"seed\":3}" },
		{ "RandomUniform", "{\"shape\":[0]}" },
		{ "GlorotUniform", "{\"shape\":[784,257],\"seed\":42}" },
		{ "GlorotUniform", "{\"shape\":[3,3,16,33],\"dtype\":\"float64\",\"seed\":1}" },
		{ "RandomUniform", "{\"shape\":[600011],\"seed\":123456789012}" },
	};
	static const char *const normals[][2] = {
		{ "RandomNormal", "{\"shape\":[1001],\"seed\":7}" },
		{ "RandomNormal", "{\"shape\":[1001],\"seed\":7,\"mean\":3,\"stddev\":0.5}" },
		{ "RandomNormal", "{\"shape\":[1001],\"dtype\":\"float64\",\"seed\":9}" },
		{ "TruncatedNormal", "{\"shape\":[4099],\"seed\":11}" },
		{ "TruncatedNormal", "{\"shape\":[4099],\"dtype\":\"float64\",\"stddev\":2}" },
		{ "RandomNormal", "{\"shape\":[600011],\"seed\":5}" },
	};
	static const uint64_t steps[] = { 0, 1, 4294967297ull };

	NEED_GPU();
	for (size_t st = 0; st < 3; st++) {
		for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
			parity(cases[c][0], cases[c][1], NULL, 0, steps[st], EXACT);
		for (size_t c = 0; c < sizeof normals / sizeof normals[0]; c++)
			parity(normals[c][0], normals[c][1], NULL, 0, steps[st], ELT);
	}
}

/* --- memory and transfers ------------------------------------------------------------------ */

Test(cuda, upload_download_round_trips_every_dtype)
{
	NEED_GPU();
	for (size_t d = 0; d < N_ALL; d++) {
		static const char *const sh[] = { "", "0", "1", "3,1025" };
		for (int s = 0; s < 4; s++) {
			struct dg_err err = { 0 };
			struct dg_tensor *x = mk(ALL[d], sh[s], G_ANY), *y;
			struct dg_cuda_tensor *g = dg_cuda_upload(S, x, &err);
			cr_assert_not_null(g, "%s", err.msg);
			cr_assert_eq(g->numel, x->numel);
			y = dg_cuda_download(S, g, &err);
			cr_assert_not_null(y, "%s", err.msg);
			cr_assert(dg_shape_eq(&x->shape, &y->shape));
			cr_assert_eq(y->nbytes, x->nbytes);
			if (x->nbytes)   /* empty tensors have no data pointer */
				cr_assert_eq(memcmp(x->data, y->data, x->nbytes), 0,
					     "bytes differ");
			dg_tensor_free(y);
			dg_cuda_tensor_free(g);
			dg_tensor_free(x);
		}
	}
}

Test(cuda, allocator_reuses_freed_blocks)
{
	struct dg_err err = { 0 };
	void *p, *q;
	size_t cap, cap2, cached;

	NEED_GPU();
	dg_cuda_mem_trim(0);
	cr_assert_eq(dg_cuda_mem_alloc(0, 1000000, &p, &cap, &err), DG_OK, "%s", err.msg);
	cr_assert_geq(cap, 1000000);
	cr_assert_eq(cap, (size_t)1 << 20, "1e6 bytes round to the 1 MiB class, got %zu", cap);
	dg_cuda_mem_release(0, p, cap);
	cached = dg_cuda_mem_cached_bytes(0);
	cr_assert_geq(cached, cap);
	cr_assert_eq(dg_cuda_mem_alloc(0, 900000, &q, &cap2, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(q, p, "same class: the cached block comes back");
	cr_assert_eq(dg_cuda_mem_cached_bytes(0), cached - cap);
	dg_cuda_mem_release(0, q, cap2);
	dg_cuda_mem_trim(0);
	cr_assert_eq(dg_cuda_mem_cached_bytes(0), 0);
	cr_assert_eq(dg_cuda_mem_alloc(0, 0, &p, &cap, &err), DG_OK);
	cr_assert_null(p);
	cr_assert_eq(cap, 0);
}

Test(cuda, unknown_op_and_wrong_device_are_refused)
{
	struct dg_err err = { 0 };
	struct dg_cuda_tensor *o = NULL;

	NEED_GPU();
	cr_assert_not(dg_cuda_supports(dg_op_find("Placeholder")));
	cr_assert_eq(dg_cuda_run(S, dg_op_find("Placeholder"), NULL, NULL, 0, &o, 1, 0, &err),
		     DG_EUNSUPPORTED);
	cr_assert_null(o);
	cr_assert_not_null(strstr(err.msg, "no CUDA kernel"), "%s", err.msg);
	struct dg_cuda_stream *bad = NULL;
	cr_assert_eq(dg_cuda_stream_new(dg_gpu_count(), &bad, &err), DG_ENOTFOUND);
	cr_assert_null(bad);
}

/* Runs everywhere: a build without a GPU must say so, not crash. */
Test(cuda, no_gpu_is_reported_cleanly)
{
	struct dg_err err = { 0 };
	struct dg_cuda_stream *s = NULL;

	if (dg_cuda_available())
		cr_skip_test("a GPU is present: %s", dg_gpu_describe());
	cr_assert_neq(dg_cuda_stream_new(0, &s, &err), DG_OK);
	cr_assert_null(s);
	cr_assert_neq(err.msg[0], '\0');
	cr_assert_eq(dg_gpu_count(), 0);
}

/* --- gradient helpers (kernels/cpu/grad.c) ------------------------------------------- */

Test(cuda, fused_gradients_match_cpu)
{
	static const char *const ops[] = { "ReluGrad", "SigmoidGrad", "TanhGrad" };

	NEED_GPU();
	for (size_t s = 0; s < NS1; s++)
		for (size_t o = 0; o < 3; o++)
			for (int d = 0; d < 2; d++)
				parity2(ops[o], NULL, FLOATS[d], SHAPES1[s], SHAPES1[s],
					o == 0 ? G_TIES : G_PROB, ELT);
	/* shapes that differ are refused by both (DG_ESHAPE) */
	parity2("ReluGrad", NULL, DG_F32, "3,4", "4,3", G_ANY, ELT);
}

Test(cuda, sparse_cross_entropy_gradient_matches_cpu_and_checks_labels)
{
	static const char *const sh[][2] = { { "64,10", "64" }, { "3,4,7", "3,4" },
					     { "1,1", "1" }, { "0,5", "0" }, { "5,1001", "5" } };

	NEED_GPU();
	for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
		for (int d = 0; d < 2; d++) {
			for (int l = 0; l < 2; l++) {
				struct dg_tensor *in[2] = { mk(FLOATS[d], sh[s][0], G_ANY),
							    mk(l ? DG_I64 : DG_I32, sh[s][1],
							       G_PROB) };
				int64_t n = in[0]->shape.dim[in[0]->shape.ndim - 1];
				for (int64_t i = 0; i < in[1]->numel; i++)
					dg_tensor_set_f64(in[1], i, (double)((i * 5 + 1) % n));
				parity("SparseSoftmaxCrossEntropyGrad", NULL, in, 2, 0, RED);
				if (in[1]->numel > 0) {
					dg_tensor_set_f64(in[1], 0, -1.0);    /* both: DG_EINVAL */
					parity("SparseSoftmaxCrossEntropyGrad", NULL, in, 2, 0,
					       RED);
				}
				dg_tensor_free(in[0]);
				dg_tensor_free(in[1]);
			}
		}
	}
}

Test(cuda, sum_to_shape_of_reverses_every_broadcast_like_cpu)
{
	/* x's shape, then the shape it is summed down to ("" is a scalar). */
	static const char *const sh[][2] = {
		{ "64,10", "10" }, { "64,10", "1,10" }, { "64,10", "64,1" }, { "64,10", "" },
		{ "2,3,4,5", "3,1,5" }, { "2,3,4,5", "2,3,4,5" }, { "7,1,9", "9" },
		{ "0,3", "3" }, { "3,0", "3,1" }, { "257,1025", "1025" }, { "4,5", "2,5" },
		{ "5", "3,5" },
	};

	NEED_GPU();
	for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
		for (int d = 0; d < 2; d++)
			parity2("SumToShapeOf", NULL, FLOATS[d], sh[s][0], sh[s][1], G_ANY, RED);
}

Test(cuda, unreduce_like_spreads_gradients_like_cpu)
{
	/* g's shape, like's shape, attrs */
	static const char *const cs[][3] = {
		{ "", "64", "{}" }, { "", "64", "{\"mean\": true}" },
		{ "10", "64,10", "{\"axis\": 0, \"mean\": true}" },
		{ "1,10", "64,10", "{\"axis\": [0], \"keepdims\": true}" },
		{ "64", "64,10", "{\"axis\": -1}" },
		{ "2,5", "2,3,4,5", "{\"axis\": [1, 2], \"mean\": true}" },
		{ "", "0,3", "{\"mean\": true}" }, { "3", "4,5", "{\"axis\": 0}" },
	};

	NEED_GPU();
	for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++)
		for (int d = 0; d < 2; d++)
			parity2("UnreduceLike", cs[c][2], FLOATS[d], cs[c][0], cs[c][1], G_ANY,
				ELT);
}

Test(cuda, slice_grad_reshape_like_and_ones_like_match_cpu)
{
	NEED_GPU();
	for (size_t d = 0; d < sizeof ALL / sizeof ALL[0]; d++) {
		parity2("SliceGrad", "{\"begin\": [1, 2]}", ALL[d], "2,3", "4,6", G_ANY, EXACT);
		parity2("SliceGrad", "{\"begin\": [0, 0, 1]}", ALL[d], "2,3,4", "2,3,5", G_ANY,
			EXACT);
		parity2("SliceGrad", "{\"begin\": [3]}", ALL[d], "0", "3", G_ANY, EXACT);
		parity2("SliceGrad", "{\"begin\": [3, 0]}", ALL[d], "2,3", "4,6", G_ANY, EXACT);
		parity2("ReshapeLike", NULL, ALL[d], "6,4", "2,3,4", G_ANY, EXACT);
		parity2("ReshapeLike", NULL, ALL[d], "6,4", "5,5", G_ANY, EXACT);
		for (size_t s = 0; s < NS1; s++)
			parity1("OnesLike", NULL, ALL[d], SHAPES1[s], G_ANY, EXACT);
	}
}

/* --- CNN and sparse ops (conv.c, norm.c, array.c, nn.c, random.c) ---------------------- */

/* A tensor of t's shape (another dtype allowed), values of kind g. */
static struct dg_tensor *mk_like(enum dg_dtype dt, const struct dg_shape *shape, enum gen g)
{
	char s[128];

	dg_shape_format(shape, s, sizeof s);
	return mk(dt, s, g);
}

/* The CPU's output of op on in (NULL when the CPU refuses): the forward
 * value a gradient test needs (its shape, or MaxPool2DGrad's y). */
static struct dg_tensor *cpu_value(const char *opname, const char *js, struct dg_tensor *const *in,
				   int n_in)
{
	json_t *a = attrs_of(js);
	struct dg_tensor *y = NULL;
	enum dg_status st = dg_op_run(dg_op_find(opname), a, (const struct dg_tensor *const *)in,
				      n_in, &y, 1, 0, NULL);

	json_decref(a);
	return st == DG_OK ? y : NULL;
}

/* Both sides refuse op on in with the same code, message and hint (after
 * each side's prefix, "op:" or "op on GPU k:"): the data-dependent errors. */
static void refused_alike(const char *opname, const char *js, struct dg_tensor *const *in,
			  int n_in)
{
	const struct dg_op_def *op = dg_op_find(opname);
	json_t *a = attrs_of(js);
	struct dg_err ec = { 0 }, eg = { 0 };
	struct dg_tensor *cpu = NULL;
	struct dg_cuda_tensor *din[4] = { 0 }, *gout = NULL;
	enum dg_status sc, sg;

	for (int i = 0; i < n_in; i++) {
		din[i] = dg_cuda_upload(S, in[i], &eg);
		cr_assert_not_null(din[i], "%s: upload %d: %s", opname, i, eg.msg);
	}
	sc = dg_op_run(op, a, (const struct dg_tensor *const *)in, n_in, &cpu, 1, 0, &ec);
	sg = dg_cuda_run(S, op, a, (const struct dg_cuda_tensor *const *)din, n_in, &gout, 1, 0,
			 &eg);
	cr_assert_neq(sc, DG_OK, "%s %s: the CPU accepted the case", opname, js);
	cr_assert_eq(sg, sc, "%s: cpu %d (%s), gpu %d (%s)", opname, sc, ec.msg, sg, eg.msg);
	cr_assert_null(gout);
	/* the same text after "Gather: " (CPU) and "Gather on GPU 0: " */
	cr_assert(strstr(ec.msg, ": ") && strstr(eg.msg, ": "), "%s: %s | %s", opname, ec.msg,
		  eg.msg);
	cr_assert_str_eq(strstr(eg.msg, ": "), strstr(ec.msg, ": "), "%s: messages differ",
			 opname);
	cr_assert_str_eq(eg.hint, ec.hint, "%s: hints differ", opname);
	dg_tensor_free(cpu);
	for (int i = 0; i < n_in; i++)
		dg_cuda_tensor_free(din[i]);
	json_decref(a);
}

/* Conv2D and both its gradients on x [xs] and filter [fs]: values in [0, 1)
 * (sums without cancellation, so the relative tolerance holds), dy of the
 * forward's shape. Where the CPU refuses the forward, the gradients are run
 * with x as dy: both sides refuse them too. */
static void conv_case(const char *js, enum dg_dtype dt, const char *xs, const char *fs)
{
	struct dg_tensor *in[3] = { mk(dt, xs, G_PROB), mk(dt, fs, G_PROB), NULL };
	struct dg_tensor *y = cpu_value("Conv2D", js, in, 2);

	parity("Conv2D", js, in, 2, 0, RED);
	in[2] = y ? mk_like(dt, &y->shape, G_PROB) : mk_like(dt, &in[0]->shape, G_PROB);
	parity("Conv2DBackpropInput", js, in, 3, 0, RED);
	parity("Conv2DBackpropFilter", js, in, 3, 0, RED);
	for (int i = 0; i < 3; i++)
		dg_tensor_free(in[i]);
	dg_tensor_free(y);
}

/* x shape, filter shape, attrs: strides, SAME/VALID, dilations, pointwise,
 * windows larger than the image, empty batches and channels, and the CPU's
 * refusals (a VALID window larger than the image; strides with dilations). */
static const char *const CONV[][3] = {
	{ "2,9,11,3", "3,3,3,5", "{\"padding\":\"SAME\"}" },
	{ "2,9,11,3", "3,3,3,5", "{\"padding\":\"VALID\",\"strides\":[2,2]}" },
	{ "3,10,7,4", "2,3,4,6", "{\"padding\":\"SAME\",\"strides\":[1,2,3,1]}" },
	{ "1,17,16,2", "4,4,2,3", "{\"padding\":\"SAME\",\"strides\":[3]}" },
	{ "2,12,13,2", "3,2,2,4", "{\"padding\":\"VALID\",\"dilations\":[2,3]}" },
	{ "1,8,9,3", "3,3,3,2", "{\"padding\":\"SAME\",\"dilations\":[2]}" },
	{ "2,5,6,7", "1,1,7,3", "{\"padding\":\"VALID\"}" },
	{ "2,5,6,7", "1,1,7,3", "{\"padding\":\"SAME\"}" },
	{ "2,7,7,3", "1,1,3,4", "{\"padding\":\"SAME\",\"strides\":2}" },
	{ "1,3,4,2", "5,5,2,3", "{\"padding\":\"SAME\"}" },
	{ "1,1,1,1", "1,1,1,1", "{\"padding\":\"VALID\"}" },
	{ "0,5,5,3", "3,3,3,2", "{\"padding\":\"SAME\"}" },
	{ "2,5,5,0", "3,3,0,2", "{\"padding\":\"SAME\"}" },
	{ "1,2,2,1", "3,3,1,1", "{\"padding\":\"VALID\"}" },
	{ "1,9,9,1", "3,3,1,1", "{\"padding\":\"SAME\",\"strides\":2,\"dilations\":2}" },
};

Test(cuda, conv2d_and_its_gradients_match_cpu)
{
	NEED_GPU();
	for (size_t c = 0; c < sizeof CONV / sizeof CONV[0]; c++)
		for (int d = 0; d < 2; d++)
			conv_case(CONV[c][2], FLOATS[d], CONV[c][0], CONV[c][1]);
}

/* 30 images of 64x64x32 with a 3x3 window: 4.7 MB of patches each, so the
 * GPU's 128 MiB blocks split the batch (28 + 2 images): the filter's
 * gradient adds blocks, the input's gathers each block's patches back. */
Test(cuda, conv2d_gradients_add_up_over_blocks_of_images)
{
	NEED_GPU();
	conv_case("{\"padding\":\"SAME\"}", DG_F32, "30,64,64,32", "3,3,32,4");
}

Test(cuda, conv2d_gradients_refuse_a_wrong_dy_like_cpu)
{
	struct dg_tensor *in[3] = { mk(DG_F32, "2,6,6,3", G_PROB), mk(DG_F32, "3,3,3,4", G_PROB),
				    mk(DG_F32, "2,6,6,5", G_PROB) };

	NEED_GPU();
	parity("Conv2DBackpropInput", "{\"padding\":\"SAME\"}", in, 3, 0, RED);
	parity("Conv2DBackpropFilter", "{\"padding\":\"SAME\"}", in, 3, 0, RED);
	dg_tensor_free(in[2]);
	in[2] = mk(DG_F64, "2,6,6,4", G_PROB);     /* the right shape, another dtype */
	parity("Conv2DBackpropFilter", "{\"padding\":\"SAME\"}", in, 3, 0, RED);
	for (int i = 0; i < 3; i++)
		dg_tensor_free(in[i]);
}

/* Pooling windows: tiling (2x2 stride 2), overlapping (3x3 stride 1 and 2),
 * uneven, larger than the image (SAME), the whole image, odd sizes. */
static const char *const POOL[][2] = {
	{ "2,8,6,3", "{\"ksize\":2,\"strides\":2,\"padding\":\"VALID\"}" },
	{ "2,9,7,3", "{\"ksize\":3,\"strides\":2,\"padding\":\"SAME\"}" },
	{ "3,7,5,2", "{\"ksize\":[1,3,3,1],\"strides\":[1,1,1,1],\"padding\":\"SAME\"}" },
	{ "1,11,10,5", "{\"ksize\":[2,3],\"strides\":[1,2],\"padding\":\"VALID\"}" },
	{ "2,3,4,2", "{\"ksize\":5,\"padding\":\"SAME\"}" },
	{ "2,5,7,3", "{\"ksize\":[5,7],\"padding\":\"VALID\"}" },
	{ "1,13,13,1", "{\"ksize\":3,\"strides\":3,\"padding\":\"SAME\"}" },
	{ "0,4,4,2", "{\"ksize\":2,\"padding\":\"SAME\"}" },
	{ "2,3,3,2", "{\"ksize\":4,\"padding\":\"VALID\"}" },
};

/* MaxPool2D, AvgPool2D and their gradients on x; MaxPool2DGrad gets the
 * CPU's forward output as y (and, as a second case, an unrelated y, which
 * neither side finds in the windows). */
static void pool_case(const char *js, struct dg_tensor *x)
{
	struct dg_tensor *y = cpu_value("MaxPool2D", js, &x, 1);
	struct dg_tensor *dy = mk_like(x->dtype, y ? &y->shape : &x->shape, G_ANY);
	struct dg_tensor *in[3] = { x, y ? y : dy, dy };

	parity("MaxPool2D", js, &x, 1, 0, EXACT);
	parity("AvgPool2D", js, &x, 1, 0, ELT);
	parity("MaxPool2DGrad", js, in, 3, 0, ELT);
	in[1] = dy;
	parity("AvgPool2DGrad", js, in, 2, 0, ELT);
	in[1] = mk_like(x->dtype, &dy->shape, G_ANY);
	parity("MaxPool2DGrad", js, in, 3, 0, ELT);
	dg_tensor_free(in[1]);
	dg_tensor_free(dy);
	dg_tensor_free(y);
}

Test(cuda, max_and_avg_pooling_and_gradients_match_cpu)
{
	NEED_GPU();
	for (size_t c = 0; c < sizeof POOL / sizeof POOL[0]; c++) {
		for (int d = 0; d < 2; d++) {
			/* ties: the first maximum of a window gets the gradient */
			struct dg_tensor *x = mk(FLOATS[d], POOL[c][0], G_TIES);
			pool_case(POOL[c][1], x);
			dg_tensor_free(x);
			x = mk(FLOATS[d], POOL[c][0], G_ANY);
			pool_case(POOL[c][1], x);
			dg_tensor_free(x);
		}
	}
}

/* NaN wins a window, infinities are maxima like any other (the CPU's scalar
 * path of the gradient); a wrong dy or y is refused by both. */
Test(cuda, pooling_handles_nan_and_infinities_like_cpu)
{
	static const char js[] = "{\"ksize\":3,\"strides\":2,\"padding\":\"SAME\"}";

	NEED_GPU();
	for (int d = 0; d < 2; d++) {
		struct dg_tensor *x = mk(FLOATS[d], "2,9,9,3", G_TIES);
		dg_tensor_set_f64(x, 5, NAN);
		dg_tensor_set_f64(x, 40, INFINITY);
		dg_tensor_set_f64(x, 41, -INFINITY);
		dg_tensor_set_f64(x, 100, INFINITY);
		dg_tensor_set_f64(x, 103, INFINITY);
		dg_tensor_set_f64(x, 300, NAN);
		dg_tensor_set_f64(x, 303, NAN);
		pool_case(js, x);
		dg_tensor_free(x);
	}
	struct dg_tensor *in[3] = { mk(DG_F32, "2,9,9,3", G_ANY), mk(DG_F32, "2,5,5,3", G_ANY),
				    mk(DG_F32, "2,5,4,3", G_ANY) };
	parity("MaxPool2DGrad", js, in, 3, 0, ELT);
	parity("AvgPool2DGrad", js, (struct dg_tensor *[]){ in[0], in[2] }, 2, 0, ELT);
	parity("MaxPool2DGrad", js, (struct dg_tensor *[]){ in[0], in[2], in[1] }, 3, 0, ELT);
	for (int i = 0; i < 3; i++)
		dg_tensor_free(in[i]);
}

/* An int32 or int64 tensor of shape s with the values v[i % nv]. */
static struct dg_tensor *mk_ints(enum dg_dtype dt, const char *s, const int64_t *v, int nv)
{
	struct dg_tensor *t = mk(dt, s, G_PROB);

	for (int64_t i = 0; i < t->numel; i++)
		dg_tensor_set_f64(t, i, (double)v[i % nv]);
	return t;
}

Test(cuda, gather_matches_cpu_for_every_dtype_and_index_type)
{
	/* params, indices: rows, 1-d params, empty rows, scalar and empty indices */
	static const char *const sh[][2] = {
		{ "7,5", "9" }, { "10", "4,3" }, { "4,3,2", "2,3" }, { "6,0", "5" }, { "5,3", "" },
		{ "5,3", "0" }, { "3,1025", "2,2" }, { "1,1", "1" },
	};
	static const int64_t good[] = { 2, 0, 4, 1, 0, 3, 0, 1, 2, 0 };

	NEED_GPU();
	for (size_t c = 0; c < sizeof sh / sizeof sh[0]; c++) {
		for (size_t d = 0; d < N_ALL; d++) {
			for (int l = 0; l < 2; l++) {
				struct dg_tensor *in[2] = { mk(ALL[d], sh[c][0], G_ANY), NULL };
				int64_t rows = in[0]->shape.dim[0], v[10];
				for (int i = 0; i < 10; i++)
					v[i] = good[i] % rows;
				in[1] = mk_ints(l ? DG_I64 : DG_I32, sh[c][1], v, 10);
				parity("Gather", NULL, in, 2, 0, EXACT);
				dg_tensor_free(in[0]);
				dg_tensor_free(in[1]);
			}
		}
	}
}

/* Any index outside [0, rows) is refused by both, naming the first one (by
 * its position in indices) and its value; also when rows are empty. */
Test(cuda, gather_refuses_indices_outside_params_like_cpu)
{
	static const char *const sh[][2] = { { "7,5", "3,4" }, { "6,0", "5" }, { "0,3", "2" } };

	NEED_GPU();
	for (size_t c = 0; c < 3; c++) {
		for (int l = 0; l < 2; l++) {
			struct dg_tensor *in[2] = { mk(DG_F32, sh[c][0], G_ANY), NULL };
			int64_t rows = in[0]->shape.dim[0];
			int64_t v[] = { 0, 1, rows, -1, rows + 5, 0 };
			in[1] = mk_ints(l ? DG_I64 : DG_I32, sh[c][1], rows ? v : v + 2, 4);
			refused_alike("Gather", NULL, in, 2);
			dg_tensor_free(in[1]);
			int64_t neg[] = { 0, -3, 1 };
			in[1] = mk_ints(l ? DG_I64 : DG_I32, sh[c][1], neg, 3);
			refused_alike("Gather", NULL, in, 2);
			dg_tensor_free(in[0]);
			dg_tensor_free(in[1]);
		}
	}
	struct dg_tensor *in[2] = { mk(DG_F32, "4,3", G_ANY), mk_ints(DG_I64, "2",
				    (const int64_t[]){ 1, INT64_C(1) << 40 }, 2) };
	refused_alike("Gather", NULL, in, 2);
	dg_tensor_free(in[0]);
	dg_tensor_free(in[1]);
}

Test(cuda, unsorted_segment_sum_matches_cpu)
{
	/* data, segment_ids, num_segments */
	static const struct { const char *x, *ids; int num; } cs[] = {
		{ "7,5", "7", 4 }, { "3,4,2", "3,4", 5 }, { "6", "6", 3 }, { "5,0", "5", 3 },
		{ "0,3", "0", 2 }, { "0", "0", 0 }, { "9,1025", "9", 2 }, { "4097", "4097", 7 },
	};
	static const enum dg_dtype dts[] = { DG_F32, DG_F64, DG_I32, DG_I64 };

	NEED_GPU();
	for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
		char js[64];
		snprintf(js, sizeof js, "{\"num_segments\":%d}", cs[c].num);
		for (size_t d = 0; d < 4; d++) {
			for (int l = 0; l < 2; l++) {
				int64_t v[7];
				for (int i = 0; i < 7; i++)
					v[i] = cs[c].num ? (i * 5 + 2) % cs[c].num : 0;
				/* floats in [0, 1): atomic adds in any order stay within RED */
				struct dg_tensor *in[2] = {
					mk(dts[d], cs[c].x, dg_dtype_is_float(dts[d]) ? G_PROB
										 : G_ANY),
					mk_ints(l ? DG_I64 : DG_I32, cs[c].ids, v, 7),
				};
				parity("UnsortedSegmentSum", js, in, 2, 0,
				       dg_dtype_is_float(dts[d]) ? RED : EXACT);
				dg_tensor_free(in[0]);
				dg_tensor_free(in[1]);
			}
		}
	}
}

/* An id outside [0, num_segments): refused by both, negative ids with
 * TensorFlow's note in the hint; also for rows of nothing. */
Test(cuda, unsorted_segment_sum_refuses_ids_outside_like_cpu)
{
	static const char *const sh[][2] = { { "6,3", "6" }, { "2,3,4", "2,3" }, { "4,0", "4" } };
	static const int64_t big[] = { 0, 1, 3, 2, 0, 5 }, neg[] = { 0, 2, -1, 1, 0, 0 };

	NEED_GPU();
	for (size_t c = 0; c < 3; c++) {
		for (int l = 0; l < 2; l++) {
			enum dg_dtype it = l ? DG_I64 : DG_I32;
			struct dg_tensor *in[2] = { mk(DG_F32, sh[c][0], G_ANY),
						    mk_ints(it, sh[c][1], big, 6) };
			refused_alike("UnsortedSegmentSum", "{\"num_segments\":3}", in, 2);
			dg_tensor_free(in[1]);
			in[1] = mk_ints(it, sh[c][1], neg, 6);
			refused_alike("UnsortedSegmentSum", "{\"num_segments\":3}", in, 2);
			dg_tensor_free(in[0]);
			dg_tensor_free(in[1]);
		}
	}
}

Test(cuda, one_hot_matches_cpu_including_indices_outside_depth)
{
	static const char *const sh[] = { "7", "3,4", "", "0", "1000" };
	static const char *const at[] = {
		"{\"depth\":5}", "{\"depth\":5,\"on_value\":2.5,\"off_value\":-1}",
		"{\"depth\":1,\"dtype\":\"float64\"}", "{\"depth\":7,\"dtype\":\"float64\","
		"\"on_value\":0.1,\"off_value\":1e-40}",
	};
	static const int64_t v[] = { 0, 4, -1, 2, 5, 1, 3, 1000000, 6 };

	NEED_GPU();
	for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
		for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
			for (int l = 0; l < 2; l++) {
				struct dg_tensor *x = mk_ints(l ? DG_I64 : DG_I32, sh[s], v, 9);
				parity("OneHot", at[a], &x, 1, 0, EXACT);
				dg_tensor_free(x);
			}
		}
	}
	struct dg_tensor *f = mk(DG_F32, "3", G_ANY);   /* float indices: both refuse */
	parity("OneHot", "{\"depth\":3}", &f, 1, 0, EXACT);
	dg_tensor_free(f);
}

/* The mask is the CPU's bit for bit: the same Philox words for every element,
 * every step and seed; kept values scaled exactly as the CPU does. */
Test(cuda, dropout_keeps_exactly_the_cpu_elements)
{
	static const char *const at[] = {
		"{\"rate\":0.5,\"seed\":7}", "{\"rate\":0,\"seed\":1}",
		"{\"rate\":0.9,\"seed\":-5}", "{\"rate\":0.1,\"seed\":123456789012}",
		"{\"rate\":0.999999,\"seed\":3}",
	};
	static const uint64_t steps[] = { 0, 1, 4294967297ull };

	NEED_GPU();
	for (size_t s = 0; s < NS1; s++) {
		for (int d = 0; d < 2; d++) {
			struct dg_tensor *x = mk(FLOATS[d], SHAPES1[s], G_ANY);
			for (size_t a = 0; a < sizeof at / sizeof at[0]; a++)
				for (size_t st = 0; st < 3; st++)
					parity("Dropout", at[a], &x, 1, steps[st], EXACT);
			dg_tensor_free(x);
		}
	}
	parity1("Dropout", "{\"rate\":1,\"seed\":1}", DG_F32, "5", G_ANY, EXACT);  /* refused */
	parity1("Dropout", "{\"rate\":0.5,\"seed\":1}", DG_I32, "5", G_ANY, EXACT);
}

/* FusedBatchNorm(x, scale, offset[, mean, var]) with its three outputs, and
 * FusedBatchNormGrad(dy, x, scale[, mean, var]) with its three. */
static void bn_case(const char *js, enum dg_dtype dt, const char *xs, bool given)
{
	struct dg_tensor *x = mk(dt, xs, G_ANY);
	struct dg_shape cs = dg_shape_make(1, (int64_t[]){ x->shape.ndim ?
						 x->shape.dim[x->shape.ndim - 1] : 1 });
	struct dg_tensor *in[5] = { x, mk_like(dt, &cs, G_POS), mk_like(dt, &cs, G_ANY),
				    mk_like(dt, &cs, G_ANY), mk_like(dt, &cs, G_POS) };
	struct dg_tensor *g[5] = { mk_like(dt, &x->shape, G_ANY), x, in[1], in[3], in[4] };

	parity_n("FusedBatchNorm", js, in, given ? 5 : 3, 3, 0, RED);
	parity_n("FusedBatchNormGrad", js, g, given ? 5 : 3, 3, 0, RED);
	for (int i = 0; i < 5; i++)
		dg_tensor_free(in[i]);
	dg_tensor_free(g[0]);
}

Test(cuda, fused_batch_norm_and_its_gradient_match_cpu)
{
	/* NHWC and [N, C]; one row (no Bessel correction); no rows; no channels */
	static const char *const sh[] = { "64,10", "4,5,6,7", "1,3", "0,4", "5,0", "2,3,3,129",
					  "20000,3" };

	NEED_GPU();
	for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
		for (int d = 0; d < 2; d++) {
			bn_case("{}", FLOATS[d], sh[s], false);
			bn_case("{\"epsilon\":1e-5,\"is_training\":true}", FLOATS[d], sh[s], false);
			bn_case("{\"is_training\":false}", FLOATS[d], sh[s], true);
			bn_case("{\"is_training\":false,\"epsilon\":0.1}", FLOATS[d], sh[s], true);
		}
	}
	bn_case("{\"is_training\":false}", DG_F32, "4,3", false);     /* refused: 3 inputs */
	bn_case("{\"epsilon\":0}", DG_F32, "4,3", false);             /* refused: epsilon */
	struct dg_tensor *in[3] = { mk(DG_F32, "4,3", G_ANY), mk(DG_F32, "4", G_POS),
				    mk(DG_F32, "3", G_ANY) };
	parity_n("FusedBatchNorm", NULL, in, 3, 3, 0, RED);           /* refused: scale [4] */
	for (int i = 0; i < 3; i++)
		dg_tensor_free(in[i]);
}

/* --- the executor on GPU placements (worker/exec.c) ------------------------------------ */

TestSuite(cuda_exec, .timeout = 240);

static struct dg_graph *parse_graph(const char *js)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = dg_graph_parse(js, strlen(js), dg_op_find, &err);

	cr_assert_not_null(g, "%s", err.msg);
	return g;
}

/* Placement forms the executor reads: /gpu:K, /device:GPU:K with a job and task
 * in front, a GPU this machine lacks (soft placement) and plain CPU nodes. */
static const char mixed_graph[] =
	"{\"version\": 1, \"nodes\": ["
	"{\"name\": \"a\", \"op\": \"Const\", \"attrs\": {\"value\": [[1, 2], [3, 4]], "
	"\"dtype\": \"float32\"}, \"device\": \"/gpu:0\"},"
	"{\"name\": \"b\", \"op\": \"Const\", \"attrs\": {\"value\": [[5], [6]], "
	"\"dtype\": \"float32\"}},"
	"{\"name\": \"m\", \"op\": \"MatMul\", \"inputs\": [\"a\", \"b\"], "
	"\"device\": \"/job:worker/task:0/device:GPU:0\"},"
	"{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 20.0}},"
	"{\"name\": \"d\", \"op\": \"Sub\", \"inputs\": [\"m\", \"c\"], \"device\": \"/gpu:0\"},"
	"{\"name\": \"r\", \"op\": \"Relu\", \"inputs\": [\"d\"], "
	"\"device\": \"/job:worker/task:0/gpu:7\"},"
	"{\"name\": \"s\", \"op\": \"Sum\", \"inputs\": [\"r\"], \"device\": \"/gpu:0\"},"
	"{\"name\": \"n\", \"op\": \"Neg\", \"inputs\": [\"m\"], \"device\": \"/cpu:0\"}"
	"]}";

Test(cuda_exec, gpu_placed_nodes_compute_the_hand_checked_values)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = parse_graph(mixed_graph);
	const char *fetch[] = { "m", "r", "s", "n", "m" };
	struct dg_tensor *out[5];

	/* m = [[17], [39]], d = m - 20, r = relu(d) = [[0], [19]], s = 19, n = -m */
	cr_assert_eq(dg_exec_run(g, NULL, 0, fetch, 5, out, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(dg_tensor_get_f64(out[0], 0), 17.0, 1e-6);
	cr_assert_float_eq(dg_tensor_get_f64(out[0], 1), 39.0, 1e-6);
	cr_assert_float_eq(dg_tensor_get_f64(out[1], 0), 0.0, 1e-6);
	cr_assert_float_eq(dg_tensor_get_f64(out[1], 1), 19.0, 1e-6);
	cr_assert_float_eq(dg_tensor_get_f64(out[2], 0), 19.0, 1e-6);
	cr_assert_float_eq(dg_tensor_get_f64(out[3], 1), -39.0, 1e-6);
	cr_assert_float_eq(dg_tensor_get_f64(out[4], 1), 39.0, 1e-6);
	cr_assert_eq(out[0]->shape.ndim, 2);
	cr_assert_eq(out[2]->shape.ndim, 0);
	for (int i = 0; i < 5; i++)
		dg_tensor_free(out[i]);
	dg_graph_free(g);
}

Test(cuda_exec, gpu_errors_name_the_node_like_the_cpu)
{
	static const char js[] =
		"{\"version\": 1, \"nodes\": ["
		"{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float32\", "
		"\"shape\": [2, 3]}},"
		"{\"name\": \"l\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"int32\", "
		"\"shape\": [2]}},"
		"{\"name\": \"ce\", \"op\": \"SparseSoftmaxCrossEntropyWithLogits\", "
		"\"inputs\": [\"x\", \"l\"], \"device\": \"/gpu:0\"}]}";
	struct dg_err err = { 0 };
	struct dg_graph *g = parse_graph(js);
	struct dg_shape sx = { .ndim = 2, .dim = { 2, 3 } }, sl = { .ndim = 1, .dim = { 2 } };
	struct dg_tensor *x = dg_tensor_new(DG_F32, &sx, NULL);
	struct dg_tensor *l = dg_tensor_new(DG_I32, &sl, NULL);
	struct dg_feed f[2] = { { "x", x }, { "l", l } };
	const char *fetch[] = { "ce" };
	struct dg_tensor *out[1] = { 0 };

	((int32_t *)l->data)[1] = 3;    /* outside 0..2 */
	cr_assert_eq(dg_exec_run(g, f, 2, fetch, 1, out, NULL, &err), DG_EINVAL);
	cr_assert_null(out[0]);
	cr_assert_not_null(strstr(err.msg, "node 'ce'"), "%s", err.msg);
	((int32_t *)l->data)[1] = 2;
	/* uniform logits: each row's loss is log(3) */
	cr_assert_eq(dg_exec_run(g, f, 2, fetch, 1, out, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(dg_tensor_get_f64(out[0], 0), log(3.0), 1e-6);
	cr_assert_float_eq(dg_tensor_get_f64(out[0], 1), log(3.0), 1e-6);
	dg_tensor_free(out[0]);
	dg_tensor_free(x);
	dg_tensor_free(l);
	dg_graph_free(g);
}

Test(cuda_exec, exec_kernel_runs_a_gpu_node_like_the_cpu)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = parse_graph(mixed_graph);
	const struct dg_node *m = &g->nodes[dg_graph_find(g, "m")];
	struct dg_tensor *in[2] = { NULL, NULL }, *out = NULL;
	const char *fetch[] = { "a", "b" };

	cr_assert_eq(dg_exec_run(g, NULL, 0, fetch, 2, in, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_exec_kernel(m, (const struct dg_tensor *const *)in, &out, 0, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(out->numel, 2);
	cr_assert_float_eq(dg_tensor_get_f64(out, 0), 17.0, 1e-6);
	cr_assert_float_eq(dg_tensor_get_f64(out, 1), 39.0, 1e-6);
	dg_tensor_free(out);
	dg_tensor_free(in[0]);
	dg_tensor_free(in[1]);
	dg_graph_free(g);
}

/* Feeds of the MLP: x in [0, 1), labels 0..9, weights U(-0.05, 0.05), biases
 * U(-0.01, 0.01), from the file's fixed generator. */
static void mlp_feeds(struct dg_tensor **t, struct dg_feed *f)
{
	static const char *const names[6] = { "x", "y", "w1", "b1", "w2", "b2" };
	static const char *const shapes[6] = { "64,784", "64", "784,256", "256", "256,10", "10" };

	rng = 0x2545F4914F6CDD1Dull;
	for (int k = 0; k < 6; k++) {
		t[k] = mk(k == 1 ? DG_I32 : DG_F32, shapes[k], G_PROB);
		for (int64_t i = 0; i < t[k]->numel; i++) {
			double u = urand();
			double v = k == 0 ? u : k == 1 ? floor(u * 10) : k % 2 ? (u - 0.5) * 0.02
									  : (u - 0.5) * 0.1;
			dg_tensor_set_f64(t[k], i, v);
		}
		f[k] = (struct dg_feed){ names[k], t[k] };
	}
}

/* Run the step graph for dev; out[0] loss, out[1..4] new weights, out[5..8] grads. */
static void mlp_run(const char *dev, struct dg_tensor **out)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t[6];
	struct dg_feed f[6];
	char **refs = NULL;
	struct dg_graph *g;
	const char *fetch[9] = { "loss", "w1_new", "b1_new", "w2_new", "b2_new" };
	struct dg_exec_opts o = { .step = 1 };

	cr_assert_eq(mlp_step_graph(dev, &g, &refs, &err), DG_OK, "MLP graph: %s", err.msg);
	for (int k = 0; k < 4; k++)
		fetch[5 + k] = refs[k];
	mlp_feeds(t, f);
	cr_assert_eq(dg_exec_run(g, f, 6, fetch, 9, out, &o, &err), DG_OK, "%s: %s",
		     dev ? dev : "cpu", err.msg);
	for (int k = 0; k < 6; k++)
		dg_tensor_free(t[k]);
	dg_autodiff_free_refs(refs, 4);
	dg_graph_free(g);
}

static const char *const MLP_OUT[9] = { "loss", "w1_new", "b1_new", "w2_new", "b2_new",
					"grad w1", "grad b1", "grad w2", "grad b2" };

Test(cuda_exec, mlp_training_step_on_the_gpu_equals_the_cpu_step)
{
	struct dg_tensor *cpu[9], *gpu[9];
	size_t used0;

	NEED_GPU();
	mlp_run(NULL, cpu);
	/* A first run creates the pooled stream (its flag and work memory stay in use). */
	mlp_run("/job:worker/task:0/gpu:0", gpu);
	for (int k = 0; k < 9; k++)
		dg_tensor_free(gpu[k]);
	used0 = dg_cuda_mem_used_bytes(0);
	mlp_run("/job:worker/task:0/gpu:0", gpu);
	/* the run returned every device block it used to the cache */
	cr_assert_eq(dg_cuda_mem_used_bytes(0), used0, "%zu bytes still in use, %zu before",
		     dg_cuda_mem_used_bytes(0), used0);
	cr_assert_gt(dg_cuda_mem_cached_bytes(0), 64 * 784 * sizeof(float), "no GPU memory used");
	/* 10 classes and small weights: the loss is near log(10) */
	cr_assert_float_eq(dg_tensor_get_f64(cpu[0], 0), log(10.0), 0.1);
	cr_assert_float_eq(dg_tensor_get_f64(gpu[0], 0), dg_tensor_get_f64(cpu[0], 0),
			   1e-5 * log(10.0));
	for (int k = 1; k < 9; k++)
		mlp_expect_close(cpu[k], gpu[k], k < 5 ? 1e-5 : 1e-4, MLP_OUT[k]);
	for (int k = 0; k < 9; k++) {
		dg_tensor_free(cpu[k]);
		dg_tensor_free(gpu[k]);
	}
}

/* Without a GPU the same placements fall back to the CPU kernels: identical bits. */
Test(cuda_exec, mlp_step_placed_on_a_missing_gpu_runs_on_the_cpu)
{
	struct dg_tensor *cpu[9], *soft[9];

	if (dg_cuda_available())
		cr_skip_test("a GPU is present (%s): covered by the GPU step test",
			     dg_gpu_describe());
	mlp_run(NULL, cpu);
	mlp_run("/gpu:0", soft);
	cr_assert_float_eq(dg_tensor_get_f64(cpu[0], 0), log(10.0), 0.1, "loss %g",
			   dg_tensor_get_f64(cpu[0], 0));
	for (int k = 0; k < 9; k++) {
		cr_assert_eq(cpu[k]->nbytes, soft[k]->nbytes, "%s", MLP_OUT[k]);
		cr_assert_eq(memcmp(cpu[k]->data, soft[k]->data, cpu[k]->nbytes), 0, "%s",
			     MLP_OUT[k]);
		dg_tensor_free(cpu[k]);
		dg_tensor_free(soft[k]);
	}
}
