/* Criterion suite "grad": reverse-mode autodiff (worker/autodiff.c) and the
 * gradient functions of kernels/cpu/grad.c. Every differentiable op is checked
 * against central finite differences in float64 on loss = sum(op(...) * r)
 * with a random r, including broadcasting, transposes, axes/keepdims, shared
 * inputs and unknown batch dims; plus tie splitting in Max, unreachable and
 * non-differentiable paths, and linear regression trained to its optimum. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/autodiff.h"
#include "dg/exec.h"
#include "dg/kernels.h"

#define MAX_IN 6

/* One placeholder of the checked graph. */
struct in_spec {
	const char *name;
	int ndim;
	int64_t dim[4];
	double lo, hi;          /* uniform values in [lo, hi), |x| >= away when away > 0 */
	bool wrt;               /* differentiate with respect to it */
	enum dg_dtype dt;       /* 0 (float32) means float64 here: float32 is never fed */
	bool unknown0;          /* declare dim 0 as -1 */
	double away;
};

static uint64_t rng = 88172645463325252ull;

static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

static struct dg_tensor *make(enum dg_dtype dt, int ndim, const int64_t *dim, double lo,
			      double hi, double away)
{
	struct dg_shape s = dg_shape_make(ndim, dim);
	struct dg_tensor *t = dg_tensor_new(dt, &s, NULL);

	cr_assert_not_null(t);
	for (int64_t i = 0; i < t->numel; i++) {
		double v = lo + (hi - lo) * urand();
		if (dt == DG_I32 || dt == DG_I64)
			v = floor(v);
		if (away > 0 && fabs(v) < away)
			v = v < 0 ? -away - urand() : away + urand();
		dg_tensor_set_f64(t, i, v);
	}
	return t;
}

static struct dg_graph *parse(const char *text)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = dg_graph_parse(text, strlen(text), dg_op_find, &err);

	cr_assert_not_null(g, "graph does not parse: %s\n%s", err.msg, text);
	return g;
}

static double eval_scalar(const struct dg_graph *g, const struct dg_feed *f, int n, const char *ref)
{
	struct dg_tensor *out[1] = { 0 };
	struct dg_err err = { 0 };
	const char *fetch[1] = { ref };
	enum dg_status st = dg_exec_run(g, f, n, fetch, 1, out, NULL, &err);
	double v;

	cr_assert_eq(st, DG_OK, "eval %s: %s", ref, err.msg);
	v = dg_tensor_get_f64(out[0], 0);
	dg_tensor_free(out[0]);
	return v;
}

/* The graph: placeholders from ins, the nodes under test (the last one, or any
 * one, named "y"), then loss = Sum(y * r) with r a random placeholder. Checks
 * d loss / d wrt against central differences, |a - n| <= tol * max(1, |n|). */
static void gradcheck_tol(const char *nodes, const struct in_spec *ins, int n_in, double tol)
{
	char text[8192];
	int len = snprintf(text, sizeof text, "{\"nodes\": [");
	struct dg_tensor *val[MAX_IN + 1] = { 0 }, *y[1] = { 0 };
	struct dg_feed feeds[MAX_IN + 1];
	const char *wrt[MAX_IN];
	int n_wrt = 0, wi[MAX_IN];
	struct dg_err err = { 0 };

	cr_assert(n_in <= MAX_IN);
	for (int i = 0; i < n_in; i++) {
		enum dg_dtype dt = ins[i].dt ? ins[i].dt : DG_F64;
		len += snprintf(text + len, sizeof text - (size_t)len,
				"{\"name\": \"%s\", \"op\": \"Placeholder\", \"attrs\": "
				"{\"dtype\": \"%s\", \"shape\": [", ins[i].name,
				dg_dtype_name(dt));
		for (int d = 0; d < ins[i].ndim; d++)
			len += snprintf(text + len, sizeof text - (size_t)len, "%s%lld",
					d ? "," : "", d == 0 && ins[i].unknown0 ? -1LL
						: (long long)ins[i].dim[d]);
		len += snprintf(text + len, sizeof text - (size_t)len, "]}},");
		val[i] = make(dt, ins[i].ndim, ins[i].dim, ins[i].lo, ins[i].hi, ins[i].away);
		feeds[i] = (struct dg_feed){ ins[i].name, val[i] };
		if (ins[i].wrt) {
			wi[n_wrt] = i;
			wrt[n_wrt++] = ins[i].name;
		}
	}
	len += snprintf(text + len, sizeof text - (size_t)len,
			"%s, {\"name\": \"r\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": "
			"\"float64\"}}, {\"name\": \"yr\", \"op\": \"Mul\", \"inputs\": [\"y\", "
			"\"r\"]}, {\"name\": \"loss\", \"op\": \"Sum\", \"inputs\": [\"yr\"]}]}",
			nodes);
	cr_assert_lt(len, (int)sizeof text);
	struct dg_graph *g = parse(text);

	/* r gets y's shape, known only after a forward run. */
	const char *fy[1] = { "y" };
	cr_assert_eq(dg_exec_run(g, feeds, n_in, fy, 1, y, NULL, &err), DG_OK, "y: %s", err.msg);
	val[n_in] = make(DG_F64, y[0]->shape.ndim, y[0]->shape.dim, -1, 1, 0);
	feeds[n_in] = (struct dg_feed){ "r", val[n_in] };
	dg_tensor_free(y[0]);

	json_t *doc = NULL;
	char **refs = NULL;
	enum dg_status st = dg_autodiff(g, "loss", wrt, n_wrt, &doc, &refs, &err);
	cr_assert_eq(st, DG_OK, "autodiff: %s (%s)", err.msg, err.hint);
	struct dg_graph *gg = dg_graph_from_json(doc, dg_op_find, &err);
	cr_assert_not_null(gg, "gradient graph: %s", err.msg);
	struct dg_tensor *grads[MAX_IN] = { 0 };
	for (int k = 0; k < n_wrt; k++)
		cr_assert_not_null(refs[k], "no gradient for %s", wrt[k]);
	st = dg_exec_run(gg, feeds, n_in + 1, (const char *const *)refs, n_wrt, grads, NULL, &err);
	cr_assert_eq(st, DG_OK, "gradients: %s", err.msg);

	for (int k = 0; k < n_wrt; k++) {
		struct dg_tensor *x = val[wi[k]];
		cr_assert_eq(grads[k]->dtype, DG_F64);
		cr_assert(dg_shape_eq(&grads[k]->shape, &x->shape), "gradient of %s has the wrong "
			  "shape", wrt[k]);
		for (int64_t j = 0; j < x->numel; j++) {
			double *p = (double *)x->data + j, x0 = *p, h = 1e-6;
			*p = x0 + h;
			double lp = eval_scalar(g, feeds, n_in + 1, "loss");
			*p = x0 - h;
			double lm = eval_scalar(g, feeds, n_in + 1, "loss");
			*p = x0;
			double num = (lp - lm) / (2 * h), an = ((double *)grads[k]->data)[j];
			cr_assert(fabs(an - num) <= tol * fmax(1.0, fabs(num)),
				  "d loss / d %s[%lld]: autodiff %.12g, numeric %.12g\n%s", wrt[k],
				  (long long)j, an, num, nodes);
		}
	}
	for (int k = 0; k < n_wrt; k++)
		dg_tensor_free(grads[k]);
	for (int i = 0; i <= n_in; i++)
		dg_tensor_free(val[i]);
	dg_autodiff_free_refs(refs, n_wrt);
	json_decref(doc);
	dg_graph_free(gg);
	dg_graph_free(g);
}

static void gradcheck(const char *nodes, const struct in_spec *ins, int n_in)
{
	gradcheck_tol(nodes, ins, n_in, 1e-6);
}

#define N(a) (int)(sizeof(a) / sizeof((a)[0]))
#define X(nm, nd, ...) { .name = nm, .ndim = nd, .dim = { __VA_ARGS__ }, .lo = -1, .hi = 1, \
			 .wrt = true }

/* ------------------------------------------------------------------------ */

static void unary(const char *op, double lo, double hi, double away)
{
	char nodes[256];
	struct in_spec in[] = { { "x", 2, { 2, 3 }, lo, hi, true, 0, false, away } };

	snprintf(nodes, sizeof nodes, "{\"name\": \"y\", \"op\": \"%s\", \"inputs\": [\"x\"]}",
		 op);
	gradcheck(nodes, in, 1);
}

Test(grad, unary_ops_match_finite_differences)
{
	unary("Neg", -1, 1, 0);
	unary("Square", -2, 2, 0);
	unary("Sqrt", 0.5, 2, 0);
	unary("Exp", -1, 1, 0);
	unary("Log", 0.5, 2, 0);
	unary("Abs", -1, 1, 0.1);
	unary("Relu", -1, 1, 0.1);
	unary("Sigmoid", -3, 3, 0);
	unary("Tanh", -2, 2, 0);
	unary("Identity", -1, 1, 0);
}

Test(grad, cast_between_floats_passes_the_gradient_back)
{
	struct in_spec in[] = { X("x", 2, 2, 3) };

	gradcheck("{\"name\": \"y\", \"op\": \"Cast\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"dtype\": \"float64\"}}", in, 1);
	/* Through float32 and back: the values round to float32, the gradient
	 * stays 1 * r. */
	gradcheck_tol("{\"name\": \"c\", \"op\": \"Cast\", \"inputs\": [\"x\"], "
		      "\"attrs\": {\"dtype\": \"float32\"}}, {\"name\": \"y\", \"op\": \"Cast\", "
		      "\"inputs\": [\"c\"], \"attrs\": {\"dtype\": \"float64\"}}", in, 1, 1e-1);
}

/* Binary op over broadcasting shape pairs; lo/hi for a and b. */
static void binary(const char *op, double alo, double ahi, double blo, double bhi, double away)
{
	static const struct {
		int na, nb;
		int64_t a[3], b[3];
	} cases[] = {
		{ 2, 2, { 2, 3 }, { 2, 3 } },
		{ 2, 1, { 2, 3 }, { 3 } },
		{ 2, 2, { 2, 1 }, { 1, 3 } },
		{ 0, 2, { 0 }, { 2, 3 } },
		{ 3, 2, { 2, 3, 4 }, { 3, 1 } },
	};
	char nodes[256];

	snprintf(nodes, sizeof nodes,
		 "{\"name\": \"y\", \"op\": \"%s\", \"inputs\": [\"a\", \"b\"]}", op);
	for (int k = 0; k < N(cases); k++) {
		struct in_spec in[2] = {
			{ "a", cases[k].na, { 0 }, alo, ahi, true, 0, false, away },
			{ "b", cases[k].nb, { 0 }, blo, bhi, true, 0, false, away },
		};
		memcpy(in[0].dim, cases[k].a, sizeof cases[k].a);
		memcpy(in[1].dim, cases[k].b, sizeof cases[k].b);
		gradcheck(nodes, in, 2);
	}
}

Test(grad, broadcasting_binary_ops_reduce_back_to_input_shapes)
{
	binary("Add", -1, 1, -1, 1, 0);
	binary("Sub", -1, 1, -1, 1, 0);
	binary("Mul", -1, 1, -1, 1, 0);
	binary("Div", -1, 1, 0.5, 2, 0);
	binary("Pow", 0.5, 2, -2, 2, 0);
}

Test(grad, maximum_and_minimum_route_to_the_larger_and_smaller)
{
	/* Distinct values: a in [0.1, 1), b in [-1, -0.1) mixed by sign flips. */
	binary("Maximum", -1, 1, -1, 1, 0.05);
	binary("Minimum", -1, 1, -1, 1, 0.05);
}

Test(grad, pow_gradient_of_the_exponent_is_zero_for_nonpositive_base)
{
	/* d(a^b)/db at a = -2, b = 2 is taken as 0 (as TensorFlow); d/da = b a^(b-1) = -4. */
	const char *text = "{\"nodes\": ["
		"{\"name\": \"a\", \"op\": \"Const\", \"attrs\": {\"value\": -2.0, "
		"\"dtype\": \"float64\"}},"
		"{\"name\": \"b\", \"op\": \"Const\", \"attrs\": {\"value\": 2.0, "
		"\"dtype\": \"float64\"}},"
		"{\"name\": \"y\", \"op\": \"Pow\", \"inputs\": [\"a\", \"b\"]}]}";
	struct dg_graph *g = parse(text);
	const char *wrt[2] = { "a", "b" };
	json_t *doc;
	char **refs;
	struct dg_err err = { 0 };

	cr_assert_eq(dg_autodiff(g, "y", wrt, 2, &doc, &refs, &err), DG_OK, "%s", err.msg);
	struct dg_graph *gg = dg_graph_from_json(doc, dg_op_find, &err);
	cr_assert_not_null(gg, "%s", err.msg);
	cr_assert_float_eq(eval_scalar(gg, NULL, 0, refs[0]), -4.0, 1e-12);
	cr_assert_float_eq(eval_scalar(gg, NULL, 0, refs[1]), 0.0, 1e-12);
	dg_graph_free(gg);
	dg_graph_free(g);
	json_decref(doc);
	dg_autodiff_free_refs(refs, 2);
}

Test(grad, where_sends_the_gradient_to_the_chosen_side)
{
	struct in_spec in[] = { X("a", 2, 2, 3), X("b", 1, 3) };

	gradcheck("{\"name\": \"k\", \"op\": \"Const\", "
		  "\"attrs\": {\"value\": [true, false, true]}},"
		  "{\"name\": \"y\", \"op\": \"Where\", \"inputs\": [\"k\", \"a\", \"b\"]}", in, 2);
}

Test(grad, matmul_with_every_transpose_combination)
{
	static const char *attrs[4] = {
		"{}", "{\"transpose_a\": true}", "{\"transpose_b\": true}",
		"{\"transpose_a\": true, \"transpose_b\": true}",
	};
	for (int k = 0; k < 4; k++) {
		bool ta = k & 1, tb = k & 2;
		struct in_spec in[2] = { X("a", 2, 3, 4), X("b", 2, 4, 5) };
		char nodes[256];
		if (ta) {
			in[0].dim[0] = 4;
			in[0].dim[1] = 3;
		}
		if (tb) {
			in[1].dim[0] = 5;
			in[1].dim[1] = 4;
		}
		snprintf(nodes, sizeof nodes, "{\"name\": \"y\", \"op\": \"MatMul\", \"inputs\": "
			 "[\"a\", \"b\"], \"attrs\": %s}", attrs[k]);
		gradcheck(nodes, in, 2);
	}
}

Test(grad, batch_matmul_with_adjoints_and_broadcast_batch_dims)
{
	struct in_spec same[2] = { X("a", 3, 2, 3, 4), X("b", 3, 2, 4, 5) };
	struct in_spec bc[2] = { X("a", 3, 2, 3, 4), X("b", 2, 4, 5) };
	struct in_spec adj[2] = { X("a", 3, 2, 4, 3), X("b", 3, 1, 5, 4) };

	gradcheck("{\"name\": \"y\", \"op\": \"BatchMatMul\", \"inputs\": [\"a\", \"b\"]}",
		  same, 2);
	gradcheck("{\"name\": \"y\", \"op\": \"BatchMatMul\", \"inputs\": [\"a\", \"b\"]}",
		  bc, 2);
	gradcheck("{\"name\": \"y\", \"op\": \"BatchMatMul\", \"inputs\": [\"a\", \"b\"], "
		  "\"attrs\": {\"adj_x\": true, \"adj_y\": true}}", adj, 2);
}

static void reduction(const char *op, const char *attrs)
{
	char nodes[256];
	struct in_spec in[] = { X("x", 3, 2, 3, 4) };

	snprintf(nodes, sizeof nodes, "{\"name\": \"y\", \"op\": \"%s\", \"inputs\": [\"x\"], "
		 "\"attrs\": %s}", op, attrs);
	gradcheck(nodes, in, 1);
}

Test(grad, reductions_over_every_axis_form_with_and_without_keepdims)
{
	static const char *attrs[] = {
		"{}", "{\"axis\": 1}", "{\"axis\": [0, 2]}", "{\"axis\": -1, \"keepdims\": true}",
		"{\"axis\": null, \"keepdims\": true}", "{\"axis\": [1], \"keep_dims\": true}",
	};
	for (int k = 0; k < N(attrs); k++) {
		reduction("Sum", attrs[k]);
		reduction("Mean", attrs[k]);
		reduction("Max", attrs[k]);   /* random values: no ties */
		reduction("Min", attrs[k]);
	}
}

Test(grad, max_splits_the_gradient_evenly_among_tied_maxima)
{
	const char *text = "{\"nodes\": [{\"name\": \"x\", \"op\": \"Const\", \"attrs\": "
		"{\"value\": [[1.0, 3.0, 3.0], [5.0, 2.0, 5.0]], \"dtype\": \"float64\"}},"
		"{\"name\": \"m\", \"op\": \"Max\", \"inputs\": [\"x\"], \"attrs\": {\"axis\": 1}},"
		"{\"name\": \"w\", \"op\": \"Const\", \"attrs\": {\"value\": [2.0, 4.0], "
		"\"dtype\": \"float64\"}},"
		"{\"name\": \"mw\", \"op\": \"Mul\", \"inputs\": [\"m\", \"w\"]},"
		"{\"name\": \"loss\", \"op\": \"Sum\", \"inputs\": [\"mw\"]}]}";
	static const double want[6] = { 0, 1, 1, 2, 0, 2 };
	struct dg_graph *g = parse(text), *gg;
	const char *wrt[1] = { "x" };
	json_t *doc;
	char **refs;
	struct dg_tensor *out[1];
	struct dg_err err = { 0 };

	cr_assert_eq(dg_autodiff(g, "loss", wrt, 1, &doc, &refs, &err), DG_OK, "%s", err.msg);
	gg = dg_graph_from_json(doc, dg_op_find, &err);
	cr_assert_not_null(gg, "%s", err.msg);
	cr_assert_eq(dg_exec_run(gg, NULL, 0, (const char *const *)refs, 1, out, NULL, &err),
		     DG_OK, "%s", err.msg);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(dg_tensor_get_f64(out[0], i), want[i], 1e-12, "element %d", i);
	dg_tensor_free(out[0]);
	dg_graph_free(gg);
	dg_graph_free(g);
	json_decref(doc);
	dg_autodiff_free_refs(refs, 1);
}

Test(grad, softmax_and_log_softmax_along_either_axis)
{
	struct in_spec in[] = { X("x", 2, 3, 4) };

	gradcheck("{\"name\": \"y\", \"op\": \"Softmax\", \"inputs\": [\"x\"]}", in, 1);
	gradcheck("{\"name\": \"y\", \"op\": \"Softmax\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"axis\": 0}}", in, 1);
	gradcheck("{\"name\": \"y\", \"op\": \"LogSoftmax\", \"inputs\": [\"x\"]}", in, 1);
	gradcheck("{\"name\": \"y\", \"op\": \"LogSoftmax\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"axis\": 0}}", in, 1);
}

Test(grad, cross_entropy_with_dense_and_sparse_labels)
{
	/* Dense labels need not sum to 1 for the check: the gradient is exact. */
	struct in_spec dense[] = {
		X("x", 2, 3, 5),
		{ .name = "l", .ndim = 2, .dim = { 3, 5 }, .lo = 0, .hi = 1, .wrt = true },
	};
	struct in_spec sparse[] = {
		X("x", 2, 4, 5),
		{ .name = "l", .ndim = 1, .dim = { 4 }, .lo = 0, .hi = 5, .dt = DG_I32 },
	};
	struct in_spec sparse64[] = {
		X("x", 2, 4, 5),
		{ .name = "l", .ndim = 1, .dim = { 4 }, .lo = 0, .hi = 5, .dt = DG_I64 },
	};

	gradcheck("{\"name\": \"y\", \"op\": \"SoftmaxCrossEntropyWithLogits\", "
		  "\"inputs\": [\"x\", \"l\"]}", dense, 2);
	gradcheck("{\"name\": \"y\", \"op\": \"SparseSoftmaxCrossEntropyWithLogits\", "
		  "\"inputs\": [\"x\", \"l\"]}", sparse, 2);
	gradcheck("{\"name\": \"y\", \"op\": \"SparseSoftmaxCrossEntropyWithLogits\", "
		  "\"inputs\": [\"x\", \"l\"]}", sparse64, 2);
}

Test(grad, slice_concat_and_split)
{
	struct in_spec one[] = { X("x", 3, 3, 4, 2) };
	struct in_spec three[] = { X("a", 2, 2, 3), X("b", 2, 2, 1), X("c", 2, 2, 2) };
	struct in_spec two[] = { X("a", 2, 2, 3), X("c", 2, 2, 2) };

	gradcheck("{\"name\": \"y\", \"op\": \"Slice\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"begin\": [1, 0, 1], \"size\": [2, -1, 1]}}", one, 1);
	gradcheck("{\"name\": \"y\", \"op\": \"Concat\", \"inputs\": [\"a\", \"b\", \"c\"], "
		  "\"attrs\": {\"axis\": 1}}", three, 3);
	gradcheck("{\"name\": \"y\", \"op\": \"Concat\", \"inputs\": [\"a\", \"c\", \"a\"], "
		  "\"attrs\": {\"axis\": -1}}", two, 2);
	/* Output 1 of the split is unused: its part of the gradient is zero. */
	gradcheck("{\"name\": \"s\", \"op\": \"Split\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"axis\": 1, \"num_split\": 2}},"
		  "{\"name\": \"y\", \"op\": \"Mul\", \"inputs\": [\"s\", \"s\"]}", one, 1);
	gradcheck("{\"name\": \"s\", \"op\": \"Split\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"axis\": 0, \"size_splits\": [1, -1]}},"
		  "{\"name\": \"t\", \"op\": \"Square\", \"inputs\": [\"s:1\"]},"
		  "{\"name\": \"y\", \"op\": \"Sum\", \"inputs\": [\"t\"], "
		  "\"attrs\": {\"axis\": 0}}",
		  one, 1);
}

Test(grad, reshape_transpose_expand_dims_and_squeeze)
{
	struct in_spec x[] = { X("x", 3, 2, 3, 4) };
	struct in_spec s[] = { X("x", 3, 2, 1, 3) };

	gradcheck("{\"name\": \"y\", \"op\": \"Reshape\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"shape\": [4, -1]}}", x, 1);
	gradcheck("{\"name\": \"y\", \"op\": \"Transpose\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"perm\": [2, 0, 1]}}", x, 1);
	gradcheck("{\"name\": \"y\", \"op\": \"Transpose\", \"inputs\": [\"x\"]}", x, 1);
	gradcheck("{\"name\": \"y\", \"op\": \"ExpandDims\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"axis\": 1}}", x, 1);
	gradcheck("{\"name\": \"y\", \"op\": \"Squeeze\", \"inputs\": [\"x\"]}", s, 1);
}

Test(grad, gather_adds_the_gradients_of_repeated_rows)
{
	/* 8 indices into 5 rows: some row is read twice or more */
	struct in_spec two[] = {
		X("p", 2, 5, 3),
		{ .name = "i", .ndim = 2, .dim = { 2, 4 }, .lo = 0, .hi = 5, .dt = DG_I32 },
	};
	struct in_spec scalar[] = {
		X("p", 3, 4, 2, 3),
		{ .name = "i", .ndim = 0, .lo = 0, .hi = 4, .dt = DG_I64 },
	};
	struct in_spec table1d[] = {
		X("p", 1, 6),
		{ .name = "i", .ndim = 1, .dim = { 9 }, .lo = 0, .hi = 6, .dt = DG_I64,
		  .unknown0 = true },
	};
	const char *gather = "{\"name\": \"y\", \"op\": \"Gather\", \"inputs\": [\"p\", \"i\"]}";

	gradcheck(gather, two, N(two));
	gradcheck(gather, scalar, N(scalar));
	gradcheck(gather, table1d, N(table1d));
	/* a bag of embeddings: the rows averaged per example */
	gradcheck("{\"name\": \"e\", \"op\": \"Gather\", \"inputs\": [\"p\", \"i\"]},"
		  "{\"name\": \"y\", \"op\": \"Mean\", \"inputs\": [\"e\"], "
		  "\"attrs\": {\"axis\": 1}}", two, N(two));
}

Test(grad, unsorted_segment_sum_sends_each_row_its_segments_gradient)
{
	/* ids in 0..3 of 5 segments: segment 4 (at least) is empty */
	struct in_spec rows[] = {
		X("d", 2, 6, 3),
		{ .name = "s", .ndim = 1, .dim = { 6 }, .lo = 0, .hi = 4, .dt = DG_I32 },
	};
	struct in_spec grid[] = {
		{ .name = "d", .ndim = 3, .dim = { 2, 3, 2 }, .lo = -1, .hi = 1, .wrt = true,
		  .unknown0 = true },
		{ .name = "s", .ndim = 2, .dim = { 2, 3 }, .lo = 0, .hi = 3, .dt = DG_I64,
		  .unknown0 = true },
	};

	gradcheck("{\"name\": \"y\", \"op\": \"UnsortedSegmentSum\", \"inputs\": [\"d\", "
		  "\"s\"], \"attrs\": {\"num_segments\": 5}}", rows, N(rows));
	gradcheck("{\"name\": \"y\", \"op\": \"UnsortedSegmentSum\", \"inputs\": [\"d\", "
		  "\"s\"], \"attrs\": {\"num_segments\": 3}}", grid, N(grid));
}

/* The node of doc named ref (a "name" or "name:0" ref), or NULL. */
static json_t *doc_node(const json_t *doc, const char *ref)
{
	size_t i, n = strcspn(ref, ":");
	json_t *node;

	json_array_foreach(json_object_get(doc, "nodes"), i, node) {
		const char *name = json_string_value(json_object_get(node, "name"));
		if (strlen(name) == n && strncmp(name, ref, n) == 0)
			return node;
	}
	return NULL;
}

/* Input k of a node of doc, as a node of doc. */
static json_t *doc_input(const json_t *doc, const json_t *node, size_t k)
{
	const char *ref = json_string_value(json_array_get(json_object_get(node, "inputs"), k));

	cr_assert_not_null(ref, "no input %zu", k);
	return doc_node(doc, ref);
}

/* The master turns d(table) into a row-wise update when it is exactly
 * UnsortedSegmentSum(Reshape(g; [-1] + rows' dims), Reshape(indices; [-1]);
 * num_segments = rows) (master/autodiff.c, rows_of): check that structure,
 * then the values (each row gets the count of its reads). */
Test(grad, gather_gradient_is_a_segment_sum_of_flattened_rows_and_ids)
{
	const char *text = "{\"nodes\": ["
		"{\"name\": \"p\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": "
		"\"float32\", \"shape\": [7, 2, 3]}},"
		"{\"name\": \"i\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": "
		"\"int64\", \"shape\": [-1, 4]}},"
		"{\"name\": \"e\", \"op\": \"Gather\", \"inputs\": [\"p\", \"i\"]},"
		"{\"name\": \"loss\", \"op\": \"Sum\", \"inputs\": [\"e\"]}]}";
	struct dg_graph *g = parse(text), *gg;
	const char *wrt[1] = { "p" };
	json_t *doc, *uss, *vals, *ids, *shape;
	char **refs;
	struct dg_err err = { 0 };

	cr_assert_eq(dg_autodiff(g, "loss", wrt, 1, &doc, &refs, &err), DG_OK, "%s", err.msg);
	uss = doc_node(doc, refs[0]);
	cr_assert_not_null(uss, "%s", refs[0]);
	cr_assert_str_eq(json_string_value(json_object_get(uss, "op")), "UnsortedSegmentSum");
	cr_assert_eq(json_array_size(json_object_get(uss, "inputs")), 2);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(uss, "attrs"),
							"num_segments")), 7);
	vals = doc_input(doc, uss, 0);
	ids = doc_input(doc, uss, 1);
	cr_assert(vals && ids, "the inputs are gradient nodes");
	cr_assert_str_eq(json_string_value(json_object_get(vals, "op")), "Reshape");
	shape = json_object_get(json_object_get(vals, "attrs"), "shape");
	cr_assert_eq(json_array_size(shape), 3);
	cr_assert(json_integer_value(json_array_get(shape, 0)) == -1 &&
		  json_integer_value(json_array_get(shape, 1)) == 2 &&
		  json_integer_value(json_array_get(shape, 2)) == 3, "values shape [-1,2,3]");
	cr_assert_str_eq(json_string_value(json_object_get(ids, "op")), "Reshape");
	shape = json_object_get(json_object_get(ids, "attrs"), "shape");
	cr_assert(json_array_size(shape) == 1 &&
		  json_integer_value(json_array_get(shape, 0)) == -1, "ids shape [-1]");
	/* the ids are the forward indices themselves, "i" */
	cr_assert_eq(doc_input(doc, ids, 0), doc_node(doc, "i"));

	/* i = [[0, 6, 6, 1]]: rows 0 and 1 read once, row 6 twice */
	gg = dg_graph_from_json(doc, dg_op_find, &err);
	cr_assert_not_null(gg, "%s", err.msg);
	struct dg_shape ps = dg_shape_make(3, (int64_t[]){ 7, 2, 3 });
	struct dg_shape is = dg_shape_make(2, (int64_t[]){ 1, 4 });
	struct dg_tensor *p = dg_tensor_new(DG_F32, &ps, NULL);
	struct dg_tensor *ix = dg_tensor_from_data(DG_I64, &is, (int64_t[]){ 0, 6, 6, 1 }, NULL);
	struct dg_feed f[2] = { { "p", p }, { "i", ix } };
	struct dg_tensor *out[1] = { 0 };
	cr_assert_eq(dg_exec_run(gg, f, 2, (const char *const *)refs, 1, out, NULL, &err), DG_OK,
		     "%s", err.msg);
	for (int64_t k = 0; k < 42; k++) {
		int64_t r = k / 6;
		double want = r == 6 ? 2 : r <= 1 ? 1 : 0;
		cr_assert_float_eq(dg_tensor_get_f64(out[0], k), want, 0, "element %lld",
				   (long long)k);
	}
	dg_tensor_free(out[0]);
	dg_tensor_free(p);
	dg_tensor_free(ix);
	dg_graph_free(gg);
	dg_autodiff_free_refs(refs, 1);
	json_decref(doc);
	dg_graph_free(g);
}

Test(grad, gather_gradient_needs_the_table_size_when_the_graph_is_built)
{
	static const char *const shapes[2] = { "[-1, 3]", "[4, -1]" };
	static const char *const needles[2] = { "row count of params", "params' dim 1" };
	const char *wrt[1] = { "p" };

	for (int k = 0; k < 2; k++) {
		char text[1024];
		json_t *doc = NULL;
		char **refs = NULL;
		struct dg_err err = { 0 };

		snprintf(text, sizeof text, "{\"nodes\": ["
			 "{\"name\": \"p\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": "
			 "\"float64\", \"shape\": %s}},"
			 "{\"name\": \"i\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": "
			 "\"int32\", \"shape\": [2]}},"
			 "{\"name\": \"e\", \"op\": \"Gather\", \"inputs\": [\"p\", \"i\"]},"
			 "{\"name\": \"loss\", \"op\": \"Sum\", \"inputs\": [\"e\"]}]}",
			 shapes[k]);
		struct dg_graph *g = parse(text);
		cr_assert_eq(dg_autodiff(g, "loss", wrt, 1, &doc, &refs, &err), DG_EINVAL,
			     "%s: %s", shapes[k], err.msg);
		cr_assert(strstr(err.msg, needles[k]), "%s", err.msg);
		cr_assert(strstr(err.hint, "full shape"), "%s", err.hint);
		cr_assert_null(doc);
		cr_assert_null(refs);
		dg_graph_free(g);
	}
}

static void conv_case(const char *attrs, int64_t h, int64_t w, int64_t kh, int64_t kw)
{
	char nodes[512];
	struct in_spec in[] = { X("x", 4, 2, h, w, 3), X("f", 4, kh, kw, 3, 4) };

	snprintf(nodes, sizeof nodes, "{\"name\": \"y\", \"op\": \"Conv2D\", \"inputs\": [\"x\", "
		 "\"f\"], \"attrs\": %s}", attrs);
	gradcheck(nodes, in, N(in));
}

Test(grad, conv2d_for_its_input_and_filter_with_every_padding_stride_and_dilation)
{
	conv_case("{\"padding\": \"VALID\"}", 5, 5, 3, 3);
	conv_case("{\"padding\": \"SAME\"}", 5, 4, 3, 2);
	conv_case("{\"padding\": \"SAME\", \"strides\": [2]}", 6, 5, 3, 3);
	conv_case("{\"padding\": \"VALID\", \"strides\": [1, 2, 1, 1]}", 5, 6, 2, 3);
	conv_case("{\"padding\": \"SAME\", \"dilations\": [2, 2]}", 6, 6, 3, 2);
	conv_case("{\"padding\": \"VALID\"}", 3, 3, 1, 1);          /* pointwise: no patches */
	/* an unknown batch dim: the gradients take the run-time shapes */
	struct in_spec in[] = { X("x", 4, 3, 4, 4, 3), X("f", 4, 2, 2, 3, 4) };
	in[0].unknown0 = true;
	gradcheck("{\"name\": \"y\", \"op\": \"Conv2D\", \"inputs\": [\"x\", \"f\"], \"attrs\": "
		  "{\"padding\": \"SAME\", \"strides\": [2]}}", in, N(in));
}

Test(grad, max_and_avg_pooling_with_valid_and_same_windows)
{
	static const char *const attrs[] = {
		"{\"ksize\": [2], \"strides\": [2], \"padding\": \"VALID\"}",
		"{\"ksize\": [3, 2], \"strides\": [2, 1], \"padding\": \"SAME\"}",
		"{\"ksize\": [1, 3, 3, 1], \"strides\": [1, 2, 2, 1], \"padding\": \"SAME\"}",
	};
	char nodes[512];

	for (int i = 0; i < N(attrs); i++)
		for (int m = 0; m < 2; m++) {
			/* values far apart, so that no window has a tie */
			struct in_spec in[] = { X("x", 4, 2, 5, 5, 3) };
			snprintf(nodes, sizeof nodes, "{\"name\": \"y\", \"op\": \"%s\", \"inputs\": "
				 "[\"x\"], \"attrs\": %s}", m ? "MaxPool2D" : "AvgPool2D", attrs[i]);
			gradcheck(nodes, in, N(in));
		}
}

Test(grad, dropout_passes_the_gradient_through_the_same_mask)
{
	struct in_spec in[] = { X("x", 2, 8, 9) };

	gradcheck("{\"name\": \"y\", \"op\": \"Dropout\", \"inputs\": [\"x\"], "
		  "\"attrs\": {\"rate\": 0.4, \"seed\": 9}}", in, N(in));
}

Test(grad, fused_batch_norm_for_x_scale_and_offset_in_training_and_inference)
{
	struct in_spec in[] = { X("x", 4, 3, 2, 2, 3), X("scale", 1, 3), X("offset", 1, 3) };
	struct in_spec in2[] = { X("x", 2, 5, 4), X("scale", 1, 4), X("offset", 1, 4) };
	struct in_spec in3[] = { X("x", 2, 5, 4), X("scale", 1, 4), X("offset", 1, 4),
				 X("mean", 1, 4), X("var", 1, 4) };

	/* NHWC: statistics over 3 x 2 x 2 positions per channel */
	gradcheck("{\"name\": \"y\", \"op\": \"FusedBatchNorm\", \"inputs\": [\"x\", \"scale\", "
		  "\"offset\"]}", in, N(in));
	gradcheck("{\"name\": \"y\", \"op\": \"FusedBatchNorm\", \"inputs\": [\"x\", \"scale\", "
		  "\"offset\"], \"attrs\": {\"epsilon\": 0.01}}", in2, N(in2));
	/* inference: mean and variance are given (the variance kept positive) */
	in3[3].wrt = in3[4].wrt = false;
	in3[4].lo = 0.5;
	in3[4].hi = 2;
	gradcheck("{\"name\": \"y\", \"op\": \"FusedBatchNorm\", \"inputs\": [\"x\", \"scale\", "
		  "\"offset\", \"mean\", \"var\"], \"attrs\": {\"is_training\": false}}", in3,
		  N(in3));
}

Test(grad, the_batch_moments_of_fused_batch_norm_have_no_gradient)
{
	struct dg_graph *g = parse("{\"nodes\": ["
		"{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float64\", "
		"\"shape\": [4, 2]}},"
		"{\"name\": \"s\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float64\", "
		"\"shape\": [2]}},"
		"{\"name\": \"bn\", \"op\": \"FusedBatchNorm\", \"inputs\": [\"x\", \"s\", \"s\"]},"
		"{\"name\": \"loss\", \"op\": \"Sum\", \"inputs\": [\"bn:1\"]}]}");
	const char *wrt[] = { "x" };
	json_t *doc = NULL;
	char **refs = NULL;
	struct dg_err err = { 0 };

	cr_assert_eq(dg_autodiff(g, "loss", wrt, 1, &doc, &refs, &err), DG_EUNSUPPORTED);
	cr_assert(strstr(err.msg, "batch mean and variance (outputs 1 and 2) have no gradient"),
		  "%s", err.msg);
	cr_assert(strstr(err.msg, "'bn'"), "names the node: %s", err.msg);
	dg_graph_free(g);
}

Test(grad, shared_inputs_sum_their_gradients)
{
	struct in_spec x[] = { X("x", 1, 5) };

	/* d(x*x + x) = 2x + 1, checked numerically; also a three-way fan-out. */
	gradcheck("{\"name\": \"xx\", \"op\": \"Mul\", \"inputs\": [\"x\", \"x\"]},"
		  "{\"name\": \"y\", \"op\": \"Add\", \"inputs\": [\"xx\", \"x\"]}", x, 1);
	gradcheck("{\"name\": \"e\", \"op\": \"Exp\", \"inputs\": [\"x\"]},"
		  "{\"name\": \"t\", \"op\": \"Mul\", \"inputs\": [\"e\", \"x\"]},"
		  "{\"name\": \"y\", \"op\": \"Sub\", \"inputs\": [\"t\", \"x\"]}", x, 1);
}

Test(grad, unknown_batch_dims_use_the_run_time_shape_helpers)
{
	/* x: [-1, 3] declared, fed [4, 3]; a two-layer net with bias broadcasting,
	 * Reshape with -1, Mean over the batch. */
	struct in_spec in[] = {
		{ .name = "x", .ndim = 2, .dim = { 4, 3 }, .lo = -1, .hi = 1, .wrt = true,
		  .unknown0 = true },
		X("w", 2, 3, 2), X("b", 1, 2),
	};

	gradcheck("{\"name\": \"h\", \"op\": \"MatMul\", \"inputs\": [\"x\", \"w\"]},"
		  "{\"name\": \"hb\", \"op\": \"Add\", \"inputs\": [\"h\", \"b\"]},"
		  "{\"name\": \"t\", \"op\": \"Tanh\", \"inputs\": [\"hb\"]},"
		  "{\"name\": \"f\", \"op\": \"Reshape\", \"inputs\": [\"t\"], "
		  "\"attrs\": {\"shape\": [-1]}},"
		  "{\"name\": \"y\", \"op\": \"Mean\", \"inputs\": [\"f\"]}", in, 3);
}

Test(grad, mlp_with_relu_and_sparse_cross_entropy)
{
	struct in_spec in[] = {
		{ .name = "x", .ndim = 2, .dim = { 5, 4 }, .lo = -1, .hi = 1, .unknown0 = true },
		X("w1", 2, 4, 6), X("b1", 1, 6), X("w2", 2, 6, 3), X("b2", 1, 3),
		{ .name = "l", .ndim = 1, .dim = { 5 }, .lo = 0, .hi = 3, .dt = DG_I32 },
	};

	gradcheck("{\"name\": \"h\", \"op\": \"MatMul\", \"inputs\": [\"x\", \"w1\"]},"
		  "{\"name\": \"hb\", \"op\": \"Add\", \"inputs\": [\"h\", \"b1\"]},"
		  "{\"name\": \"a\", \"op\": \"Relu\", \"inputs\": [\"hb\"]},"
		  "{\"name\": \"o\", \"op\": \"MatMul\", \"inputs\": [\"a\", \"w2\"]},"
		  "{\"name\": \"ob\", \"op\": \"Add\", \"inputs\": [\"o\", \"b2\"]},"
		  "{\"name\": \"ce\", \"op\": \"SparseSoftmaxCrossEntropyWithLogits\", "
		  "\"inputs\": [\"ob\", \"l\"]},"
		  "{\"name\": \"y\", \"op\": \"Mean\", \"inputs\": [\"ce\"]}", in, 6);
}

/* ------------------------------------------------------------------------ */
/* Structure and errors                                                       */

static const char path_graph[] = "{\"nodes\": ["
	"{\"name\": \"x\", \"op\": \"Placeholder\", "
	"\"attrs\": {\"dtype\": \"float64\", \"shape\": [3]}},"
	"{\"name\": \"z\", \"op\": \"Placeholder\", "
	"\"attrs\": {\"dtype\": \"float64\", \"shape\": [3]}},"
	"{\"name\": \"n\", \"op\": \"Placeholder\", "
	"\"attrs\": {\"dtype\": \"int32\", \"shape\": [3]}},"
	"{\"name\": \"s\", \"op\": \"StridedSlice\", \"inputs\": [\"x\"], \"attrs\": "
	"{\"begin\": [0], \"end\": [2]}},"
	"{\"name\": \"sq\", \"op\": \"Square\", \"inputs\": [\"x\"]},"
	"{\"name\": \"loss\", \"op\": \"Sum\", \"inputs\": [\"sq\"]},"
	"{\"name\": \"loss2\", \"op\": \"Sum\", \"inputs\": [\"s\"]},"
	"{\"name\": \"nl\", \"op\": \"Sum\", \"inputs\": [\"n\"]}"
	"]}";

Test(grad, unreachable_wrt_gets_no_gradient_or_zeros_when_asked)
{
	struct dg_graph *g = parse(path_graph), *gg;
	const char *wrt[2] = { "x", "z" };
	struct dg_autodiff_opts o = { .zeros_for_unreachable = true, .prefix = "d/" };
	json_t *doc;
	char **refs;
	struct dg_err err = { 0 };
	struct dg_tensor *out[1];
	double xv[3] = { 1, 2, 3 };
	struct dg_shape s3 = { .ndim = 1, .dim = { 3 } };
	struct dg_tensor *x = dg_tensor_from_data(DG_F64, &s3, xv, NULL);
	struct dg_feed f[1] = { { "x", x } };

	cr_assert_eq(dg_autodiff(g, "loss", wrt, 2, &doc, &refs, &err), DG_OK, "%s", err.msg);
	cr_assert_not_null(refs[0]);
	cr_assert_null(refs[1], "z does not reach the loss");
	dg_autodiff_free_refs(refs, 2);
	json_decref(doc);

	cr_assert_eq(dg_autodiff_ex(g, "loss", wrt, 2, &o, &doc, &refs, &err), DG_OK, "%s",
		     err.msg);
	cr_assert_not_null(refs[1]);
	cr_assert(strncmp(refs[0], "d/", 2) == 0, "prefix not used: %s", refs[0]);
	gg = dg_graph_from_json(doc, dg_op_find, &err);
	cr_assert_not_null(gg, "%s", err.msg);
	const char *fz[1] = { refs[0] };
	cr_assert_eq(dg_exec_run(gg, f, 1, fz, 1, out, NULL, &err), DG_OK, "%s", err.msg);
	for (int i = 0; i < 3; i++)
		cr_assert_float_eq(dg_tensor_get_f64(out[0], i), 2 * xv[i], 1e-12);
	dg_tensor_free(out[0]);
	struct dg_feed fz2[2] = { { "x", x }, { "z", x } };
	const char *fzz[1] = { refs[1] };
	cr_assert_eq(dg_exec_run(gg, fz2, 2, fzz, 1, out, NULL, &err), DG_OK, "%s", err.msg);
	for (int i = 0; i < 3; i++)
		cr_assert_float_eq(dg_tensor_get_f64(out[0], i), 0.0, 0);
	dg_tensor_free(out[0]);
	dg_graph_free(gg);
	dg_autodiff_free_refs(refs, 2);
	json_decref(doc);
	dg_tensor_free(x);
	dg_graph_free(g);
}

Test(grad, errors_name_the_node_or_ref)
{
	struct dg_graph *g = parse(path_graph);
	const char *x[1] = { "x" }, *n[1] = { "n" }, *bad[1] = { "nope" };
	json_t *doc = NULL;
	char **refs = NULL;
	struct dg_err err = { 0 };

	cr_assert_eq(dg_autodiff(g, "loss2", x, 1, &doc, &refs, &err), DG_EUNSUPPORTED);
	cr_assert(strstr(err.msg, "'s'") && strstr(err.msg, "StridedSlice"), "%s", err.msg);
	cr_assert_null(doc);
	cr_assert_null(refs);
	cr_assert_eq(dg_autodiff(g, "loss", n, 1, &doc, &refs, &err), DG_EDTYPE);
	cr_assert(strstr(err.msg, "int32"), "%s", err.msg);
	cr_assert_eq(dg_autodiff(g, "nl", x, 1, &doc, &refs, &err), DG_EDTYPE);
	cr_assert(strstr(err.msg, "loss"), "%s", err.msg);
	cr_assert_eq(dg_autodiff(g, "loss", bad, 1, &doc, &refs, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "nope"), "%s", err.msg);
	cr_assert_eq(dg_autodiff(g, "missing", x, 1, &doc, &refs, &err), DG_ENOTFOUND);
	cr_assert_null(doc);
	dg_graph_free(g);
}

Test(grad, gradient_nodes_keep_the_forward_device)
{
	const char *text = "{\"nodes\": ["
		"{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float32\", "
		"\"shape\": [2]}},"
		"{\"name\": \"e\", \"op\": \"Exp\", \"inputs\": [\"x\"], "
		"\"device\": \"/job:worker/task:1\"},"
		"{\"name\": \"loss\", \"op\": \"Sum\", \"inputs\": [\"e\"]}], "
		"\"fetch\": [\"loss\"]}";
	struct dg_graph *g = parse(text);
	const char *x[1] = { "x" };
	json_t *doc, *node;
	char **refs;
	size_t i;
	struct dg_err err = { 0 };
	int on_task1 = 0;

	cr_assert_eq(dg_autodiff(g, "loss", x, 1, &doc, &refs, &err), DG_OK, "%s", err.msg);
	json_array_foreach(json_object_get(doc, "nodes"), i, node) {
		const char *name = json_string_value(json_object_get(node, "name"));
		const char *dev = json_string_value(json_object_get(node, "device"));
		if (strncmp(name, "grad/e/", 7) == 0) {
			cr_assert_str_eq(dev, "/job:worker/task:1", "%s", name);
			on_task1++;
		}
	}
	cr_assert_geq(on_task1, 1);
	cr_assert_eq(json_array_size(json_object_get(doc, "fetch")), 1, "fetch list kept");
	dg_autodiff_free_refs(refs, 1);
	json_decref(doc);
	dg_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* End to end: linear regression by gradient descent                         */

Test(grad, linear_regression_converges_to_the_least_squares_optimum)
{
	/* y = X w_true + b_true exactly (no noise): the optimum is w_true, b_true.
	 * loss = mean((X w + b - y)^2); plain gradient descent, updates in C. */
	const char *text = "{\"nodes\": ["
		"{\"name\": \"X\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float64\", "
		"\"shape\": [-1, 3]}},"
		"{\"name\": \"y\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float64\", "
		"\"shape\": [-1, 1]}},"
		"{\"name\": \"w\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float64\", "
		"\"shape\": [3, 1]}},"
		"{\"name\": \"b\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float64\", "
		"\"shape\": [1]}},"
		"{\"name\": \"p\", \"op\": \"MatMul\", \"inputs\": [\"X\", \"w\"]},"
		"{\"name\": \"pb\", \"op\": \"Add\", \"inputs\": [\"p\", \"b\"]},"
		"{\"name\": \"d\", \"op\": \"Sub\", \"inputs\": [\"pb\", \"y\"]},"
		"{\"name\": \"d2\", \"op\": \"Square\", \"inputs\": [\"d\"]},"
		"{\"name\": \"loss\", \"op\": \"Mean\", \"inputs\": [\"d2\"]}]}";
	static const double w_true[3] = { 1.5, -2.0, 0.5 }, b_true = 0.75;
	int64_t xd[2] = { 64, 3 }, yd[2] = { 64, 1 }, wd[2] = { 3, 1 }, bd[1] = { 1 };
	struct dg_tensor *X = make(DG_F64, 2, xd, -1, 1, 0), *Y = make(DG_F64, 2, yd, 0, 0, 0);
	struct dg_tensor *W = make(DG_F64, 2, wd, 0, 0, 0), *B = make(DG_F64, 1, bd, 0, 0, 0);
	struct dg_graph *g = parse(text), *gg;
	const char *wrt[2] = { "w", "b" };
	json_t *doc;
	char **refs;
	struct dg_err err = { 0 };
	double loss = 0;

	for (int i = 0; i < 64; i++) {
		double v = b_true;
		for (int j = 0; j < 3; j++)
			v += ((double *)X->data)[i * 3 + j] * w_true[j];
		((double *)Y->data)[i] = v;
	}
	cr_assert_eq(dg_autodiff(g, "loss", wrt, 2, &doc, &refs, &err), DG_OK, "%s", err.msg);
	gg = dg_graph_from_json(doc, dg_op_find, &err);
	cr_assert_not_null(gg, "%s", err.msg);
	struct dg_feed f[4] = { { "X", X }, { "y", Y }, { "w", W }, { "b", B } };
	const char *fetch[3] = { refs[0], refs[1], "loss" };
	for (int step = 0; step < 500; step++) {
		struct dg_tensor *out[3];
		cr_assert_eq(dg_exec_run(gg, f, 4, fetch, 3, out, NULL, &err), DG_OK, "%s",
			     err.msg);
		for (int j = 0; j < 3; j++)
			((double *)W->data)[j] -= 0.2 * ((double *)out[0]->data)[j];
		((double *)B->data)[0] -= 0.2 * ((double *)out[1]->data)[0];
		loss = dg_tensor_get_f64(out[2], 0);
		for (int k = 0; k < 3; k++)
			dg_tensor_free(out[k]);
	}
	for (int j = 0; j < 3; j++)
		cr_assert_float_eq(((double *)W->data)[j], w_true[j], 1e-6, "w[%d]", j);
	cr_assert_float_eq(((double *)B->data)[0], b_true, 1e-6);
	cr_assert_lt(loss, 1e-12);
	dg_autodiff_free_refs(refs, 2);
	json_decref(doc);
	dg_graph_free(gg);
	dg_graph_free(g);
	dg_tensor_free(X);
	dg_tensor_free(Y);
	dg_tensor_free(W);
	dg_tensor_free(B);
}
