/* Criterion suite "exec": worker/exec.c runs validated graphs through the real
 * registry: the seed program, feeds (of placeholders and of computed values),
 * default and repeated fetches, multi-output nodes, feed errors, kernel errors
 * prefixed with the node, and pruning of what the fetches do not need. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/codec.h"
#include "dg/exec.h"
#include "dg/kernels.h"

static const char seed[] =
	"{\"nodes\": ["
	"{\"name\": \"x\", \"op\": \"Const\", \"attrs\": {\"value\": 2}},"
	"{\"name\": \"c300\", \"op\": \"Const\", \"attrs\": {\"value\": 300}},"
	"{\"name\": \"y1\", \"op\": \"Add\", \"inputs\": [\"x\", \"c300\"]},"
	"{\"name\": \"c66\", \"op\": \"Const\", \"attrs\": {\"value\": 66}},"
	"{\"name\": \"y2\", \"op\": \"Sub\", \"inputs\": [\"x\", \"c66\"]},"
	"{\"name\": \"y\", \"op\": \"Add\", \"inputs\": [\"y1\", \"y2\"]}"
	"], \"fetch\": [\"y\"]}";

/* x: float32 [3] placeholder; y = x * 2; bad = 1 / 0 (int32: a kernel error). */
static const char fed[] =
	"{\"nodes\": ["
	"{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [3]}},"
	"{\"name\": \"two\", \"op\": \"Const\", \"attrs\": {\"value\": 2.0}},"
	"{\"name\": \"y\", \"op\": \"Mul\", \"inputs\": [\"x\", \"two\"]},"
	"{\"name\": \"one\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
	"{\"name\": \"zero\", \"op\": \"Const\", \"attrs\": {\"value\": 0}},"
	"{\"name\": \"bad\", \"op\": \"Div\", \"inputs\": [\"one\", \"zero\"]},"
	"{\"name\": \"unused\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"int64\"}}"
	"], \"fetch\": [\"y\"]}";

static struct dg_graph *load(const char *json)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = dg_graph_parse(json, strlen(json), dg_op_find, &err);

	cr_assert_not_null(g, "graph: %s", err.msg);
	return g;
}

static struct dg_tensor *f32_vec(const float *v, int n)
{
	struct dg_shape s = { .ndim = 1, .dim = { n } };
	struct dg_tensor *t = dg_tensor_from_data(DG_F32, &s, v, NULL);

	cr_assert_not_null(t);
	return t;
}

Test(exec, seed_graph_evaluates_to_238_with_the_default_fetch)
{
	struct dg_graph *g = load(seed);
	struct dg_tensor *out[1];
	struct dg_err err = { 0 };
	int ran = -1;
	struct dg_exec_opts opts = { .nodes_run = &ran };

	cr_assert_eq(dg_exec_run(g, NULL, 0, NULL, 0, out, &opts, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out[0]->dtype, DG_I32);
	cr_assert_eq(out[0]->shape.ndim, 0);
	cr_assert_eq(((int32_t *)out[0]->data)[0], 238);
	cr_assert_eq(ran, 6);
	dg_tensor_free(out[0]);
	dg_graph_free(g);
}

Test(exec, intermediate_and_repeated_fetches_are_separate_owned_tensors)
{
	struct dg_graph *g = load(seed);
	const char *fetch[] = { "y1", "y2:0", "y", "y1" };
	struct dg_tensor *out[4];
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, NULL, 0, fetch, 4, out, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(((int32_t *)out[0]->data)[0], 302);
	cr_assert_eq(((int32_t *)out[1]->data)[0], -64);
	cr_assert_eq(((int32_t *)out[2]->data)[0], 238);
	cr_assert_eq(((int32_t *)out[3]->data)[0], 302);
	cr_assert_neq(out[0], out[3]);
	for (int i = 0; i < 4; i++)
		dg_tensor_free(out[i]);
	dg_graph_free(g);
}

Test(exec, only_nodes_needed_by_the_fetch_run)
{
	struct dg_graph *g = load(seed);
	const char *fetch[] = { "y2" };
	struct dg_tensor *out[1];
	struct dg_err err = { 0 };
	int ran = -1;
	struct dg_exec_opts opts = { .nodes_run = &ran };

	cr_assert_eq(dg_exec_run(g, NULL, 0, fetch, 1, out, &opts, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(((int32_t *)out[0]->data)[0], -64);
	cr_assert_eq(ran, 3, "x, c66 and y2 only; ran %d", ran);
	dg_tensor_free(out[0]);
	dg_graph_free(g);
}

Test(exec, placeholder_feed_flows_through_and_failing_unused_nodes_do_not_run)
{
	struct dg_graph *g = load(fed);
	const float xv[3] = { 1.5f, -2.0f, 4.0f };
	struct dg_tensor *x = f32_vec(xv, 3), *out[1];
	struct dg_feed feeds[] = { { "x", x } };
	struct dg_err err = { 0 };
	int ran = -1;
	struct dg_exec_opts opts = { .nodes_run = &ran };

	/* "bad" divides by zero and "unused" is an unfed placeholder: neither is
	 * needed for y, so the run succeeds. */
	cr_assert_eq(dg_exec_run(g, feeds, 1, NULL, 0, out, &opts, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out[0]->dtype, DG_F32);
	cr_assert_eq(out[0]->shape.dim[0], 3);
	const float *y = out[0]->data;
	cr_assert_float_eq(y[0], 3.0f, 0);
	cr_assert_float_eq(y[1], -4.0f, 0);
	cr_assert_float_eq(y[2], 8.0f, 0);
	cr_assert_eq(ran, 2, "two and y; ran %d", ran);
	dg_tensor_free(out[0]);
	dg_tensor_free(x);
	dg_graph_free(g);
}

Test(exec, kernel_errors_are_prefixed_with_the_node)
{
	struct dg_graph *g = load(fed);
	const char *fetch[] = { "bad" };
	struct dg_tensor *out[1] = { (struct dg_tensor *)1 };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, NULL, 0, fetch, 1, out, NULL, &err), DG_EINVAL);
	cr_assert(strncmp(err.msg, "node 'bad' (Div): ", 18) == 0, "%s", err.msg);
	cr_assert(strstr(err.msg, "division by zero"), "%s", err.msg);
	cr_assert_null(out[0]);
	dg_graph_free(g);
}

Test(exec, unfed_placeholder_is_named_with_the_feed_flag)
{
	struct dg_graph *g = load(fed);
	struct dg_tensor *out[1];
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, NULL, 0, NULL, 0, out, NULL, &err), DG_EINVAL);
	cr_assert_str_eq(err.msg, "placeholder 'x' must be fed (use --feed x=FILE.npy|VALUE)");
	cr_assert_null(out[0]);
	dg_graph_free(g);
}

Test(exec, feed_with_the_wrong_dtype_or_shape_is_refused)
{
	struct dg_graph *g = load(fed);
	struct dg_shape s3 = { .ndim = 1, .dim = { 3 } };
	struct dg_tensor *i32 = dg_tensor_new(DG_I32, &s3, NULL);
	const float v[4] = { 0 };
	struct dg_tensor *f4 = f32_vec(v, 4), *out[1];
	struct dg_feed bad_dtype[] = { { "x", i32 } }, bad_shape[] = { { "x", f4 } };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, bad_dtype, 1, NULL, 0, out, NULL, &err), DG_EDTYPE);
	cr_assert(strstr(err.msg, "node 'x' (Placeholder)"), "%s", err.msg);
	cr_assert(strstr(err.msg, "got dtype int32 where float32 is expected"), "%s", err.msg);
	cr_assert_eq(dg_exec_run(g, bad_shape, 1, NULL, 0, out, NULL, &err), DG_ESHAPE);
	cr_assert(strstr(err.msg, "got shape [4] where [3] is expected"), "%s", err.msg);
	dg_tensor_free(i32);
	dg_tensor_free(f4);
	dg_graph_free(g);
}

Test(exec, feeds_of_unknown_names_or_twice_the_same_value_are_refused)
{
	struct dg_graph *g = load(fed);
	const float v[3] = { 1, 2, 3 };
	struct dg_tensor *x = f32_vec(v, 3), *out[1];
	struct dg_feed unknown[] = { { "q", x } }, twice[] = { { "x", x }, { "x:0", x } };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, unknown, 1, NULL, 0, out, NULL, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "'q'"), "%s", err.msg);
	cr_assert_eq(dg_exec_run(g, twice, 2, NULL, 0, out, NULL, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "fed twice"), "%s", err.msg);
	const char *fetch[] = { "nope:1" };
	cr_assert_eq(dg_exec_run(g, NULL, 0, fetch, 1, out, NULL, &err), DG_ENOTFOUND);
	dg_tensor_free(x);
	dg_graph_free(g);
}

Test(exec, feeding_a_computed_value_overrides_it_and_skips_its_producers)
{
	struct dg_graph *g = load(seed);
	struct dg_tensor *v = dg_tensor_scalar(DG_I32, 1000, NULL), *out[2];
	struct dg_feed feeds[] = { { "y1", v } };
	const char *fetch[] = { "y", "y1" };
	struct dg_err err = { 0 };
	int ran = -1;
	struct dg_exec_opts opts = { .nodes_run = &ran };

	cr_assert_eq(dg_exec_run(g, feeds, 1, fetch, 2, out, &opts, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(((int32_t *)out[0]->data)[0], 1000 - 64);
	cr_assert_eq(((int32_t *)out[1]->data)[0], 1000, "a fed value is fetched as fed");
	cr_assert_neq(out[1], v, "the caller gets a copy, not the borrowed feed");
	cr_assert_eq(ran, 4, "x, c66, y2, y; ran %d", ran);
	dg_tensor_free(out[0]);
	dg_tensor_free(out[1]);
	dg_tensor_free(v);
	dg_graph_free(g);
}

Test(exec, multi_output_nodes_give_each_output_by_index)
{
	struct dg_graph *g = load("{\"nodes\": ["
		"{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": [1, 2, 3, 4, 5, 6]}},"
		"{\"name\": \"s\", \"op\": \"Split\", \"inputs\": [\"c\"], "
		"\"attrs\": {\"num_split\": 3}},"
		"{\"name\": \"sum\", \"op\": \"Add\", \"inputs\": [\"s:0\", \"s:2\"]}]}");
	const char *fetch[] = { "s:2", "sum", "s:1" };
	struct dg_tensor *out[3];
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, NULL, 0, fetch, 3, out, NULL, &err), DG_OK, "%s", err.msg);
	const int32_t *a = out[0]->data, *b = out[1]->data, *c = out[2]->data;
	cr_assert_eq(out[0]->shape.dim[0], 2);
	cr_assert_eq(a[0], 5);
	cr_assert_eq(a[1], 6);
	cr_assert_eq(b[0], 1 + 5);
	cr_assert_eq(b[1], 2 + 6);
	cr_assert_eq(c[0], 3);
	cr_assert_eq(c[1], 4);
	for (int i = 0; i < 3; i++)
		dg_tensor_free(out[i]);
	dg_graph_free(g);
}

Test(exec, nothing_to_fetch_is_an_error)
{
	struct dg_graph *g = load("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", "
				  "\"attrs\": {\"value\": 1}}]}");
	struct dg_tensor *out[1];
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, NULL, 0, NULL, 0, out, NULL, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "nothing to fetch"), "%s", err.msg);
	cr_assert(strstr(err.hint, "--fetch"), "%s", err.hint);
	dg_graph_free(g);
}

Test(exec, unknown_rank_placeholder_accepts_any_shape_and_identity_copies)
{
	struct dg_graph *g = load("{\"nodes\": ["
		"{\"name\": \"b\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"bool\"}},"
		"{\"name\": \"i\", \"op\": \"Identity\", \"inputs\": [\"b\"]}], "
		"\"fetch\": [\"i\"]}");
	struct dg_shape s = { .ndim = 2, .dim = { 2, 2 } };
	struct dg_tensor *b = dg_tensor_new(DG_BOOL, &s, NULL), *out[1];
	struct dg_feed feeds[] = { { "b", b } };
	struct dg_err err = { 0 };

	((uint8_t *)b->data)[1] = 1;
	((uint8_t *)b->data)[2] = 1;
	cr_assert_eq(dg_exec_run(g, feeds, 1, NULL, 0, out, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out[0]->dtype, DG_BOOL);
	cr_assert(dg_shape_eq(&out[0]->shape, &s));
	cr_assert_neq(out[0]->data, b->data);
	cr_assert_eq(memcmp(out[0]->data, "\0\1\1\0", 4), 0);
	dg_tensor_free(out[0]);
	dg_tensor_free(b);
	dg_graph_free(g);
}

Test(exec, const_scalar_spread_over_a_declared_shape)
{
	struct dg_graph *g = load("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": "
		"{\"value\": {\"dtype\": \"float64\", \"shape\": [2, 3], \"value\": 1.25}}}],"
		" \"fetch\": [\"c\"]}");
	struct dg_tensor *out[1];
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, NULL, 0, NULL, 0, out, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out[0]->dtype, DG_F64);
	cr_assert_eq(out[0]->numel, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(((double *)out[0]->data)[i], 1.25, 0);
	dg_tensor_free(out[0]);
	dg_graph_free(g);
}

Test(exec, placeholder_kernel_run_directly_reports_it_was_not_fed)
{
	struct dg_tensor *out[1];
	struct dg_err err = { 0 };

	cr_assert_eq(dg_op_run(dg_op_find("Placeholder"), NULL, NULL, 0, out, 1, 0, &err),
		     DG_EINVAL);
	cr_assert(strstr(err.msg, "placeholder was not fed"), "%s", err.msg);
	cr_assert_null(out[0]);
}

Test(exec, long_chain_frees_intermediates_and_runs_iteratively)
{
	/* 100000 Identity nodes: the walk back from the fetch and the run must not
	 * recurse, and each value is freed after its one reader (LeakSanitizer and
	 * the memory bound check the rest). */
	int n = 100000;
	char *doc = malloc((size_t)n * 64 + 128);
	size_t k = (size_t)sprintf(doc, "{\"nodes\": [{\"name\": \"n0\", \"op\": \"Const\", "
				   "\"attrs\": {\"value\": [1.5, 2.5]}}");
	for (int i = 1; i < n; i++)
		k += (size_t)sprintf(doc + k, ",{\"name\":\"n%d\",\"op\":\"Identity\","
				     "\"inputs\":[\"n%d\"]}", i, i - 1);
	sprintf(doc + k, "]}");
	struct dg_graph *g = load(doc);
	free(doc);
	char last[16];
	snprintf(last, sizeof last, "n%d", n - 1);
	const char *fetch[] = { last };
	struct dg_tensor *out[1];
	struct dg_err err = { 0 };

	cr_assert_eq(dg_exec_run(g, NULL, 0, fetch, 1, out, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(((float *)out[0]->data)[1], 2.5f, 0);
	dg_tensor_free(out[0]);
	dg_graph_free(g);
}

Test(exec, weighted_mean_example_equals_the_plain_mean)
{
	const char *src = getenv("DG_SOURCE_DIR");
	char path[4096];
	struct dg_err err = { 0 };

	snprintf(path, sizeof path, "%s/examples/weighted_mean.json", src ? src : ".");
	struct dg_graph *g = dg_graph_load(path, dg_op_find, &err);
	cr_assert_not_null(g, "%s", err.msg);
	float v[100];
	double sum = 0;
	for (int i = 0; i < 100; i++) {
		v[i] = (float)((i * 37) % 101) / 7.0f;
		sum += v[i];
	}
	struct dg_tensor *x = f32_vec(v, 100), *out[1];
	struct dg_feed feeds[] = { { "x", x } };
	cr_assert_eq(dg_exec_run(g, feeds, 1, NULL, 0, out, NULL, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(out[0]->dtype, DG_F32);
	cr_assert_eq(out[0]->shape.ndim, 0);
	cr_assert_float_eq(((float *)out[0]->data)[0], sum / 100, 1e-5 * fabs(sum / 100));
	dg_tensor_free(out[0]);
	dg_tensor_free(x);
	dg_graph_free(g);
}
