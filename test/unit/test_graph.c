/* Criterion suite "graph": core/src/graph.c parses and validates graph
 * documents against the real op registry: edges, topological order, inferred
 * types, one test per validation error (code + message naming the node), size
 * limits, hostile inputs and a 10^6-node chain. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dg/graph.h"
#include "dg/kernels.h"

static struct dg_graph *parse(const char *json, struct dg_err *err)
{
	return dg_graph_parse(json, strlen(json), dg_op_find, err);
}

/* Parse a document that must fail; check the code and that msg has want. */
static void expect_fail(const char *json, enum dg_status code, const char *want)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = parse(json, &err);

	cr_assert_null(g, "parsed a graph that should fail with: %s", want);
	cr_assert_eq(err.code, code, "code %d (want %d): %s", err.code, code, err.msg);
	cr_assert(strstr(err.msg, want), "message '%s' lacks '%s'", err.msg, want);
}

static const char seed[] =
	"{\"version\": 1, \"nodes\": ["
	"{\"name\": \"x\", \"op\": \"Const\", \"attrs\": {\"value\": 2}},"
	"{\"name\": \"y1\", \"op\": \"Add\", \"inputs\": [\"x\", \"c300\"]},"
	"{\"name\": \"c300\", \"op\": \"Const\", \"attrs\": {\"value\": 300}},"
	"{\"name\": \"c66\", \"op\": \"Const\", \"attrs\": {\"value\": 66}},"
	"{\"name\": \"y2\", \"op\": \"Sub\", \"inputs\": [\"x\", \"c66:0\"],"
	" \"device\": \"/job:local/task:1\"},"
	"{\"name\": \"y\", \"op\": \"Add\", \"inputs\": [\"y1\", \"y2\"]}"
	"], \"fetch\": [\"y\", \"y1:0\"]}";

static int position(const struct dg_graph *g, int node)
{
	for (int k = 0; k < g->n_nodes; k++)
		if (g->order[k] == node)
			return k;
	return -1;
}

Test(graph, valid_graph_has_resolved_edges_topological_order_and_types)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = parse(seed, &err);

	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->n_nodes, 6);
	int x = dg_graph_find(g, "x"), y1 = dg_graph_find(g, "y1"), c300 = dg_graph_find(g, "c300");
	int y2 = dg_graph_find(g, "y2"), y = dg_graph_find(g, "y"), c66 = dg_graph_find(g, "c66");
	cr_assert_eq(x, 0);
	cr_assert_eq(y1, 1);
	cr_assert_eq(c300, 2);
	cr_assert_eq(dg_graph_find(g, "nope"), -1);
	/* Edges point at producers, by index, including a forward reference. */
	cr_assert_eq(g->nodes[y1].n_in, 2);
	cr_assert_eq(g->nodes[y1].in[0].node, x);
	cr_assert_eq(g->nodes[y1].in[1].node, c300);
	cr_assert_eq(g->nodes[y2].in[1].node, c66);
	cr_assert_eq(g->nodes[y2].in[1].index, 0);
	cr_assert_str_eq(g->nodes[y2].device, "/job:local/task:1");
	cr_assert_null(g->nodes[y1].device);
	cr_assert_str_eq(g->nodes[y].op->name, "Add");
	/* Every producer comes before its consumers. */
	for (int v = 0; v < g->n_nodes; v++)
		for (int k = 0; k < g->nodes[v].n_in; k++)
			cr_assert_lt(position(g, g->nodes[v].in[k].node), position(g, v));
	/* Inference: int32 scalars everywhere. */
	for (int v = 0; v < g->n_nodes; v++) {
		cr_assert_eq(g->nodes[v].n_out, 1);
		cr_assert_eq(g->nodes[v].out[0].dtype, DG_I32);
		cr_assert_eq(g->nodes[v].out[0].shape.ndim, 0);
	}
	cr_assert_eq(g->n_fetch, 2);
	cr_assert_eq(g->fetch[0].node, y);
	cr_assert_eq(g->fetch[1].node, y1);
	cr_assert_eq(g->fetch[1].index, 0);
	cr_assert(json_is_object(g->nodes[y].attrs));
	cr_assert_eq(json_object_size(g->nodes[y].attrs), 0);
	dg_graph_free(g);
}

Test(graph, inference_propagates_unknown_dims_from_placeholders)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = parse("{\"nodes\": ["
		"{\"name\": \"p\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [-1, 3]}},"
		"{\"name\": \"q\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"int64\"}},"
		"{\"name\": \"i\", \"op\": \"Identity\", \"inputs\": [\"p\"]},"
		"{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": [[1.5, 2, 3]]}},"
		"{\"name\": \"s\", \"op\": \"Add\", \"inputs\": [\"i\", \"c\"]}]}", &err);

	cr_assert_not_null(g, "%s", err.msg);
	const struct dg_ttype *p = &g->nodes[0].out[0], *q = &g->nodes[1].out[0];
	const struct dg_ttype *i = &g->nodes[2].out[0], *s = &g->nodes[4].out[0];
	cr_assert_eq(p->dtype, DG_F32);
	cr_assert_eq(p->shape.ndim, 2);
	cr_assert_eq(p->shape.dim[0], -1);
	cr_assert_eq(p->shape.dim[1], 3);
	cr_assert_eq(q->dtype, DG_I64);
	cr_assert_eq(q->shape.ndim, -1, "no shape attr means unknown rank");
	cr_assert_eq(i->shape.dim[0], -1);
	cr_assert_eq(s->dtype, DG_F32);
	cr_assert_eq(s->shape.ndim, 2);
	cr_assert_eq(s->shape.dim[1], 3);
	cr_assert_eq(g->n_fetch, 0);
	dg_graph_free(g);
}

Test(graph, const_shape_broadcast_and_dtype_attr_are_inferred_without_data)
{
	struct dg_err err = { 0 };
	/* 2^40 elements: inference must not materialise them. */
	struct dg_graph *g = parse("{\"nodes\": ["
		"{\"name\": \"big\", \"op\": \"Const\", \"attrs\": {\"value\":"
		" {\"dtype\": \"float64\", \"shape\": [1048576, 1048576], \"value\": 0}}},"
		"{\"name\": \"i\", \"op\": \"Const\", "
		"\"attrs\": {\"value\": 7, \"dtype\": \"int64\"}}]}",
		&err);

	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->nodes[0].out[0].dtype, DG_F64);
	cr_assert_eq(g->nodes[0].out[0].shape.dim[1], 1048576);
	cr_assert_eq(g->nodes[1].out[0].dtype, DG_I64);
	dg_graph_free(g);
}

/* The scalar-over-a-shape form is typed without building the tensor, but it
 * must refuse what the kernel refuses: a graph that validates must not fail
 * on its Const at run time. */
Test(graph, const_scalar_over_a_shape_refuses_unknown_keys_at_validation)
{
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": "
		    "{\"value\": {\"shape\": [2], \"value\": 1, \"bogus\": 3}}}]}",
		    DG_EINVAL, "node 'c' (Const): attr 'value': tensor object has unknown key "
		    "'bogus'");
}

/* Shapes with unknown dims skip the element-count check of known shapes, so
 * a Placeholder or Slice can declare sizes near 2^63; ops adding or
 * multiplying them in inference overflowed int64 (Concat reported its own
 * wrapped result as "a bug in the op", Max could misjudge an axis as empty).
 * Every inferred type is now bounded like a tensor's shape. */
Test(graph, inferred_shapes_past_the_element_limit_are_too_large)
{
	expect_fail("{\"nodes\": ["
		    "{\"name\": \"p\", \"op\": \"Placeholder\", "
		    "\"attrs\": {\"shape\": [-1, 4611686018427387904]}},"
		    "{\"name\": \"y\", \"op\": \"Concat\", \"inputs\": [\"p\", \"p\"], "
		    "\"attrs\": {\"axis\": 1}}]}",
		    DG_ETOOLARGE, "node 'p' (Placeholder): output 0 would have shape "
		    "[?,4611686018427387904], more than 2^48 elements");
	expect_fail("{\"nodes\": ["
		    "{\"name\": \"p\", \"op\": \"Placeholder\", "
		    "\"attrs\": {\"shape\": [-1, 4611686018427387904, 4]}},"
		    "{\"name\": \"m\", \"op\": \"Max\", \"inputs\": [\"p\"], "
		    "\"attrs\": {\"axis\": [1, 2]}}]}",
		    DG_ETOOLARGE, "node 'p' (Placeholder)");
	expect_fail("{\"nodes\": ["
		    "{\"name\": \"p\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [-1]}},"
		    "{\"name\": \"s\", \"op\": \"Slice\", \"inputs\": [\"p\"], "
		    "\"attrs\": {\"begin\": [0], \"size\": [9223372036854775807]}}]}",
		    DG_ETOOLARGE, "node 's' (Slice)");
	/* Zeros and unknowns do not count, as for tensors; the bound itself is fine. */
	struct dg_err err = { 0 };
	struct dg_graph *g = parse("{\"nodes\": [{\"name\": \"p\", \"op\": \"Placeholder\", "
				   "\"attrs\": {\"shape\": [-1, 0, 16777216, 16777216]}}]}", &err);
	cr_assert_not_null(g, "%s", err.msg);
	dg_graph_free(g);
}

Test(graph, multi_output_refs_resolve_by_index)
{
	struct dg_err err = { 0 };
	struct dg_edge e;
	struct dg_graph *g = parse("{\"nodes\": ["
		"{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": [1, 2, 3, 4]}},"
		"{\"name\": \"s\", \"op\": \"Split\", \"inputs\": [\"c\"], "
		"\"attrs\": {\"num_split\": 2}},"
		"{\"name\": \"y\", \"op\": \"Add\", \"inputs\": [\"s:1\", \"s\"]}], "
		"\"fetch\": [\"s:1\"]}",
		&err);

	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->nodes[1].n_out, 2);
	cr_assert_eq(g->nodes[2].in[0].index, 1);
	cr_assert_eq(g->nodes[2].in[1].index, 0);
	cr_assert_eq(g->nodes[1].out[1].shape.dim[0], 2);
	cr_assert_eq(dg_graph_ref(g, "s:1", &e, &err), DG_OK);
	cr_assert_eq(e.node, 1);
	cr_assert_eq(e.index, 1);
	cr_assert_eq(dg_graph_ref(g, "s:2", &e, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "has 2 outputs"), "%s", err.msg);
	cr_assert_eq(dg_graph_ref(g, "t", &e, &err), DG_ENOTFOUND);
	cr_assert(strstr(err.msg, "'t'"), "%s", err.msg);
	cr_assert_eq(dg_graph_ref(g, "s:-1", &e, &err), DG_EINVAL);
	cr_assert_eq(dg_graph_ref(g, "", &e, &err), DG_EINVAL);
	dg_graph_free(g);
}

/* --- document-level errors ------------------------------------------------ */

Test(graph, malformed_json_reports_line_and_column)
{
	expect_fail("{\"nodes\": [\n  {\"name\": \"x\",, }]}", DG_EINVAL, "line 2, column");
}

Test(graph, top_level_must_be_an_object)
{
	expect_fail("[1, 2]", DG_EINVAL, "must be a JSON object");
	expect_fail("3", DG_EINVAL, "got an integer");
}

Test(graph, nodes_must_be_present_and_an_array)
{
	expect_fail("{\"fetch\": []}", DG_EINVAL, "no \"nodes\" array");
	expect_fail("{\"nodes\": {\"x\": 1}}", DG_EINVAL, "\"nodes\" must be an array");
}

Test(graph, unknown_top_level_keys_are_refused)
{
	expect_fail("{\"nodes\": [], \"feeds\": []}", DG_EINVAL, "unknown top-level key 'feeds'");
	expect_fail("{\"nodes\": [], \"version\": 2}", DG_EUNSUPPORTED, "version 2");
	expect_fail("{\"nodes\": [], \"doc\": 5}", DG_EINVAL, "\"doc\" must be a string");
}

Test(graph, empty_graph_is_valid)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = parse("{\"nodes\": [], \"doc\": \"nothing\", \"version\": 1}", &err);

	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->n_nodes, 0);
	dg_graph_free(g);
}

Test(graph, duplicate_json_keys_are_refused)
{
	expect_fail("{\"nodes\": [{\"name\": \"a\", \"name\": \"b\", \"op\": \"Const\"}]}",
		    DG_EINVAL, "duplicate");
}

/* --- node-level errors ---------------------------------------------------- */

Test(graph, node_that_is_not_an_object_is_named_by_index)
{
	expect_fail("{\"nodes\": [{\"name\": \"a\", \"op\": \"Const\", \"attrs\": {\"value\": 1}}, "
		    "\"b\"]}", DG_EINVAL, "nodes[1] must be an object, got a string");
	expect_fail("{\"nodes\": [null]}", DG_EINVAL, "nodes[0] must be an object");
}

Test(graph, missing_empty_or_invalid_names_are_refused)
{
	expect_fail("{\"nodes\": [{\"op\": \"Const\"}]}", DG_EINVAL, "nodes[0] has no \"name\"");
	expect_fail("{\"nodes\": [{\"name\": \"\", \"op\": \"Const\"}]}", DG_EINVAL,
		    "nodes[0] has an empty name");
	expect_fail("{\"nodes\": [{\"name\": 7, \"op\": \"Const\"}]}", DG_EINVAL,
		    "\"name\" must be a string");
	expect_fail("{\"nodes\": [{\"name\": \"a:1\", \"op\": \"Const\"}]}", DG_EINVAL,
		    "invalid character ':'");
	expect_fail("{\"nodes\": [{\"name\": \"a b\", \"op\": \"Const\"}]}", DG_EINVAL,
		    "invalid byte 0x20");
}

Test(graph, huge_name_is_refused_as_too_large)
{
	size_t n = 100000;
	char *doc = malloc(n + 64);
	cr_assert_not_null(doc);
	int k = sprintf(doc, "{\"nodes\": [{\"name\": \"");
	memset(doc + k, 'a', n);
	strcpy(doc + k + n, "\", \"op\": \"Const\"}]}");
	expect_fail(doc, DG_ETOOLARGE, "is 100000 bytes");
	free(doc);
}

Test(graph, duplicate_node_names_are_refused)
{
	expect_fail("{\"nodes\": ["
		    "{\"name\": \"x\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		    "{\"name\": \"y\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		    "{\"name\": \"x\", \"op\": \"Const\", \"attrs\": {\"value\": 2}}]}",
		    DG_EINVAL, "node 'x' is defined twice (nodes[0] and nodes[2])");
}

Test(graph, unknown_node_keys_are_refused)
{
	expect_fail("{\"nodes\": [{\"name\": \"x\", \"op\": \"Identity\", \"input\": [\"y\"]}]}",
		    DG_EINVAL, "node 'x' has unknown key 'input'");
}

Test(graph, node_doc_and_device_must_be_strings)
{
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"doc\": 3, "
		    "\"attrs\": {\"value\": 1}}]}", DG_EINVAL, "node 'c' (Const): \"doc\" must be");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"device\": 0, "
		    "\"attrs\": {\"value\": 1}}]}", DG_EINVAL, "node 'c' (Const): \"device\" must");
}

Test(graph, unknown_op_names_the_node_and_suggests_the_closest)
{
	const char *cases[][2] = {
		{ "Ad", "Add" }, { "add", "Add" }, { "Matmul", "MatMul" }, { "Sbu", "Sub" },
		{ "Identityy", "Identity" }, { "placeholder", "Placeholder" },
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char doc[200], want[64];
		struct dg_err err = { 0 };
		snprintf(doc, sizeof doc, "{\"nodes\": [{\"name\": \"n1\", \"op\": \"%s\"}]}",
			 cases[i][0]);
		cr_assert_null(parse(doc, &err));
		cr_assert_eq(err.code, DG_EINVAL);
		snprintf(want, sizeof want, "node 'n1': unknown op '%s'", cases[i][0]);
		cr_assert(strstr(err.msg, want), "%s", err.msg);
		snprintf(want, sizeof want, "did you mean '%s'?", cases[i][1]);
		cr_assert(strstr(err.hint, want), "hint '%s' for %s", err.hint, cases[i][0]);
	}
	struct dg_err err = { 0 };
	cr_assert_null(parse("{\"nodes\": [{\"name\": \"n\", \"op\": \"Qwertyuiop\"}]}", &err));
	cr_assert(strstr(err.hint, "dg ops"), "%s", err.hint);
	cr_assert_null(strstr(err.hint, "did you mean"), "%s", err.hint);
	expect_fail("{\"nodes\": [{\"name\": \"n\"}]}", DG_EINVAL, "node 'n' has no \"op\"");
}

Test(graph, wrong_arity_says_the_expected_count)
{
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		    "{\"name\": \"y\", \"op\": \"Add\", \"inputs\": [\"c\"]}]}",
		    DG_EINVAL, "node 'y' (Add): takes 2 inputs, got 1");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"inputs\": [\"c\"], "
		    "\"attrs\": {\"value\": 1}}]}", DG_EINVAL,
		    "node 'c' (Const): takes 0 inputs, got 1");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Concat\", \"inputs\": [], "
		    "\"attrs\": {\"axis\": 0}}]}",
		    DG_EINVAL, "node 'c' (Concat): takes at least 1 input, got 0");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Identity\", \"inputs\": \"x\"}]}",
		    DG_EINVAL, "\"inputs\" must be an array");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Identity\", \"inputs\": [3]}]}",
		    DG_EINVAL, "input 0 must be a string");
}

Test(graph, attrs_are_checked_against_the_op_schema)
{
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"valu\": 1}}]}",
		    DG_EINVAL, "node 'c' (Const): Const has no attr 'valu'");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\"}]}",
		    DG_EINVAL, "node 'c' (Const): missing required attr 'value'");
	expect_fail("{\"nodes\": [{\"name\": \"p\", \"op\": \"Placeholder\", "
		    "\"attrs\": {\"dtype\": 3}}]}", DG_EINVAL,
		    "node 'p' (Placeholder): attr 'dtype'");
	expect_fail("{\"nodes\": [{\"name\": \"p\", \"op\": \"Placeholder\", "
		    "\"attrs\": [1]}]}", DG_EINVAL, "\"attrs\" must be an object");
}

Test(graph, bad_literals_fail_validation_naming_the_node)
{
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", "
		    "\"attrs\": {\"value\": [[1, 2], [3]]}}]}", DG_ESHAPE, "node 'c' (Const): ");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", "
		    "\"attrs\": {\"value\": 2.5, \"dtype\": \"int32\"}}]}", DG_EINVAL,
		    "node 'c' (Const)");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"dtype\": "
		    "\"int32\", \"value\": {\"dtype\": \"float32\", \"value\": 1}}}]}", DG_EDTYPE,
		    "attr 'dtype' is int32 but the value says float32");
	expect_fail("{\"nodes\": [{\"name\": \"p\", \"op\": \"Placeholder\", "
		    "\"attrs\": {\"dtype\": \"complex64\"}}]}", DG_EDTYPE,
		    "node 'p' (Placeholder)");
}

Test(graph, dangling_input_names_the_missing_node)
{
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		    "{\"name\": \"y\", \"op\": \"Add\", \"inputs\": [\"c\", \"q\"]}]}",
		    DG_EINVAL, "node 'y' (Add): input 1: 'q' names no node in the graph");
}

Test(graph, input_index_out_of_range_says_the_output_count)
{
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		    "{\"name\": \"y\", \"op\": \"Identity\", \"inputs\": [\"c:1\"]}]}",
		    DG_EINVAL, "'c:1' refers to output 1, but 'c' (Const) has 1 output");
}

Test(graph, hostile_output_indexes_are_refused)
{
	const char *refs[] = {
		"c:-1", "c:99999999999999999999", "c:", "c:1a", "c:+1", "c:2147483648",
	};

	for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++) {
		char doc[256];
		snprintf(doc, sizeof doc, "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", "
			 "\"attrs\": {\"value\": 1}}, {\"name\": \"y\", \"op\": \"Identity\", "
			 "\"inputs\": [\"%s\"]}]}", refs[i]);
		expect_fail(doc, DG_EINVAL, "node 'y' (Identity): input 0");
	}
}

Test(graph, cycles_are_reported_with_the_nodes_on_them)
{
	expect_fail("{\"nodes\": [{\"name\": \"a\", \"op\": \"Identity\", \"inputs\": [\"b\"]},"
		    "{\"name\": \"b\", \"op\": \"Identity\", \"inputs\": [\"a\"]}]}",
		    DG_EINVAL, "graph has a cycle: a -> b -> a");
	expect_fail("{\"nodes\": [{\"name\": \"a\", \"op\": \"Identity\", \"inputs\": [\"a\"]}]}",
		    DG_EINVAL, "graph has a cycle: a -> a");
	/* A tail feeding into a three-node loop: only the loop is named. */
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		    "{\"name\": \"t\", \"op\": \"Add\", \"inputs\": [\"c\", \"w\"]},"
		    "{\"name\": \"u\", \"op\": \"Identity\", \"inputs\": [\"t\"]},"
		    "{\"name\": \"w\", \"op\": \"Identity\", \"inputs\": [\"u\"]},"
		    "{\"name\": \"z\", \"op\": \"Identity\", \"inputs\": [\"t\"]}]}",
		    DG_EINVAL, "graph has a cycle: t -> u -> w -> t");
}

Test(graph, inference_errors_are_prefixed_with_the_node)
{
	expect_fail("{\"nodes\": ["
		    "{\"name\": \"a\", \"op\": \"Const\", "
		    "\"attrs\": {\"value\": [[1,2,3],[4,5,6]]}},"
		    "{\"name\": \"b\", \"op\": \"Const\", \"attrs\": {\"value\": [1,2,3,4]}},"
		    "{\"name\": \"y1\", \"op\": \"Add\", \"inputs\": [\"a\", \"b\"]}]}",
		    DG_ESHAPE,
		    "node 'y1' (Add): shapes [2,3] and [4] cannot be broadcast together");
	expect_fail("{\"nodes\": ["
		    "{\"name\": \"a\", \"op\": \"Const\", \"attrs\": {\"value\": 1}},"
		    "{\"name\": \"b\", \"op\": \"Const\", \"attrs\": {\"value\": 1.5}},"
		    "{\"name\": \"y1\", \"op\": \"Add\", \"inputs\": [\"a\", \"b\"]}]}",
		    DG_EDTYPE, "node 'y1' (Add): ");
}

Test(graph, fetch_must_name_existing_outputs)
{
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}}],"
		    " \"fetch\": [\"q\"]}", DG_EINVAL, "\"fetch\"[0]: 'q' names no node");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}}],"
		    " \"fetch\": \"c\"}", DG_EINVAL, "\"fetch\" must be an array");
	expect_fail("{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": {\"value\": 1}}],"
		    " \"fetch\": [\"c:3\"]}", DG_EINVAL, "refers to output 3");
}

/* --- limits ----------------------------------------------------------------- */

Test(graph, deeply_nested_json_is_rejected_without_overflowing_the_stack)
{
	size_t depth = 100000;
	char *doc = malloc(2 * depth + 32);
	cr_assert_not_null(doc);
	int k = sprintf(doc, "{\"nodes\": ");
	memset(doc + k, '[', depth);
	memset(doc + k + depth, ']', depth);
	strcpy(doc + k + 2 * depth, "}");
	expect_fail(doc, DG_ETOOLARGE, "maximum parsing depth");
	free(doc);
}

Test(graph, attrs_nested_deeper_than_the_limit_are_refused)
{
	char doc[1024];
	int k = sprintf(doc, "{\"nodes\": [{\"name\": \"c\", \"op\": \"Const\", \"attrs\": "
			"{\"value\": ");
	for (int i = 0; i < DG_GRAPH_MAX_DEPTH + 2; i++)
		doc[k++] = '[';
	doc[k++] = '1';
	for (int i = 0; i < DG_GRAPH_MAX_DEPTH + 2; i++)
		doc[k++] = ']';
	strcpy(doc + k, "}}]}");
	expect_fail(doc, DG_ETOOLARGE, "node 'c' (Const): attrs nest deeper than 64");
}

Test(graph, more_than_the_node_limit_is_too_large)
{
	struct dg_err err = { 0 };
	json_t *doc = json_object(), *nodes = json_array(), *one = json_object();

	for (int i = 0; i <= DG_GRAPH_MAX_NODES; i++)
		json_array_append(nodes, one);   /* the same object: cheap, never parsed */
	json_object_set_new(doc, "nodes", nodes);
	cr_assert_null(dg_graph_from_json(doc, dg_op_find, &err));
	cr_assert_eq(err.code, DG_ETOOLARGE);
	cr_assert(strstr(err.msg, "1000001 nodes"), "%s", err.msg);
	json_decref(one);
	json_decref(doc);
}

/* A chain c -> n1 -> ... -> n(N-1) of Identity nodes as JSON text. */
static char *chain_doc(int n, bool ring)
{
	char *doc = malloc((size_t)n * 80 + 256);
	size_t k;

	cr_assert_not_null(doc);
	k = (size_t)sprintf(doc, "{\"nodes\": [");
	if (ring)
		k += (size_t)sprintf(doc + k, "{\"name\": \"n0\", \"op\": \"Identity\", "
				     "\"inputs\": [\"n%d\"]}", n - 1);
	else
		k += (size_t)sprintf(doc + k, "{\"name\": \"n0\", \"op\": \"Const\", "
				     "\"attrs\": {\"value\": 1.5}}");
	for (int i = 1; i < n; i++)
		k += (size_t)sprintf(doc + k, ",{\"name\":\"n%d\",\"op\":\"Identity\","
				     "\"inputs\":[\"n%d\"]}", i, i - 1);
	sprintf(doc + k, "], \"fetch\": [\"n%d\"]}", n - 1);
	return doc;
}

Test(graph, million_node_chain_validates_quickly_and_iteratively)
{
	int n = 1000000;
	char *doc = chain_doc(n, false);
	struct dg_err err = { 0 };
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct dg_graph *g = parse(doc, &err);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	free(doc);
	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(g->n_nodes, n);
	for (int k = 0; k < n; k++)
		cr_assert_eq(g->order[k], k);
	cr_assert_eq(g->nodes[n - 1].out[0].dtype, DG_F32);
	cr_assert_eq(g->nodes[n - 1].out[0].shape.ndim, 0);
	cr_assert_eq(g->fetch[0].node, n - 1);
	cr_assert_eq(dg_graph_find(g, "n765432"), 765432);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	cr_log_info("parsed and validated %d nodes in %.2f s", n, s);
	/* Generous bound: sanitizer builds on a shared machine are several times slower. */
	cr_assert_lt(s, 60.0);
	dg_graph_free(g);
}

Test(graph, long_cycle_is_found_iteratively_and_truncated_in_the_message)
{
	char *doc = chain_doc(200000, true);

	expect_fail(doc, DG_EINVAL, "graph has a cycle: n0 -> n1 -> n2 -> ");
	struct dg_err err = { 0 };
	cr_assert_null(parse(doc, &err));
	cr_assert(strstr(err.msg, " -> ..."), "%s", err.msg);
	free(doc);
}

Test(graph, load_names_the_file)
{
	struct dg_err err = { 0 };
	char path[] = "/tmp/dg_test_graph_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "{\"nodes\": 1}", 12), 12);
	close(fd);

	cr_assert_null(dg_graph_load(path, dg_op_find, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	cr_assert(strncmp(err.msg, path, strlen(path)) == 0, "%s", err.msg);
	unlink(path);
	cr_assert_null(dg_graph_load(path, dg_op_find, &err));
	cr_assert_eq(err.code, DG_ENOTFOUND, "%s", err.msg);
	cr_assert(strstr(err.msg, path), "%s", err.msg);
	dg_graph_free(NULL);
}
