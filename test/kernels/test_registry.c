/* The op registry as a whole: every op the foundation promises is there, every
 * entry is complete, lookup works, and dg_op_run refuses bad arity and attrs
 * before a kernel runs. */
#include <criterion/criterion.h>
#include <string.h>

#include "dg/cuda.h"
#include "dg/gpu.h"
#include "dg/kernels.h"

#include "cpu.h"

static const char *const required_ops[] = {
	"Const", "Placeholder", "Identity", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Square",
	"Sqrt", "Exp", "Log", "Pow", "Maximum", "Minimum", "Relu", "Sigmoid", "Tanh", "MatMul",
	"BatchMatMul", "Sum", "Mean", "Max", "Min", "ArgMax", "Softmax", "LogSoftmax",
	"SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits", "Slice",
	"StridedSlice", "Concat", "Split", "Reshape", "Transpose", "ExpandDims", "Squeeze", "Cast",
	"Size", "Shape", "Equal", "Less", "Greater", "Where", "Fill", "ZerosLike", "OnesLike",
	"RandomUniform", "RandomNormal", "TruncatedNormal", "GlorotUniform", "Gather",
	"UnsortedSegmentSum",
};

Test(registry, every_required_op_is_registered)
{
	for (size_t i = 0; i < sizeof required_ops / sizeof required_ops[0]; i++) {
		const struct dg_op_def *op = dg_op_find(required_ops[i]);
		cr_assert_not_null(op, "op %s is not registered", required_ops[i]);
		cr_assert_str_eq(op->name, required_ops[i]);
	}
}

Test(registry, entries_are_complete_sorted_and_unique)
{
	int n = dg_op_count();

	cr_assert_geq(n, (int)(sizeof required_ops / sizeof required_ops[0]));
	for (int i = 0; i < n; i++) {
		const struct dg_op_def *op = dg_op_at(i);
		cr_assert_not_null(op);
		cr_assert_not_null(op->infer, "%s has no infer function", op->name);
		cr_assert_not_null(op->cpu, "%s has no CPU kernel", op->name);
		cr_assert(op->doc && op->doc[0], "%s has no doc line", op->name);
		cr_assert(op->min_inputs >= 0, "%s", op->name);
		cr_assert(op->max_inputs == -1 || op->max_inputs >= op->min_inputs, "%s", op->name);
		cr_assert(op->n_outputs > 0 || op->num_outputs, "%s has no output count", op->name);
		if (op->flags & DG_OPF_SOURCE)
			cr_assert_eq(op->max_inputs, 0, "source op %s takes inputs", op->name);
		for (const struct dg_attr_spec *a = op->attrs; a && a->name; a++)
			cr_assert(a->doc && a->doc[0], "%s attr %s has no doc", op->name, a->name);
		if (i > 0)
			cr_assert_lt(strcmp(dg_op_at(i - 1)->name, op->name), 0,
				     "registry not sorted or duplicate at %s", op->name);
		cr_assert_eq(dg_op_find(op->name), op);
	}
	cr_assert_null(dg_op_at(n));
	cr_assert_null(dg_op_at(-1));
}

/* The index has a fixed capacity (MAX_OPS in registry.c); an op past it
 * would silently be missing. Every op of every family table is findable. */
Test(registry, every_family_op_is_in_the_index)
{
	const struct dg_op_def *const families[] = {
		dg_ops_basic, dg_ops_eltwise, dg_ops_reduce, dg_ops_nn,
		dg_ops_matmul, dg_ops_array, dg_ops_random, dg_ops_grad, dg_ops_data, dg_ops_conv,
		dg_ops_norm,
	};
	int total = 0;

	for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
		for (const struct dg_op_def *op = families[f]; op->name; op++, total++)
			cr_assert_eq(dg_op_find(op->name), op, "%s is not in the index", op->name);
	}
	cr_assert_eq(dg_op_count(), total);
}

Test(registry, unknown_names_are_not_found)
{
	cr_assert_null(dg_op_find("NoSuchOp"));
	cr_assert_null(dg_op_find("add"));   /* names are case-sensitive */
	cr_assert_null(dg_op_find(""));
	cr_assert_null(dg_op_find(NULL));
}

/* A CUDA build's GPU kernels are in their ops' entries (the executor asks the
 * entry, never a name table); a build without CUDA has none. */
Test(registry, cuda_kernels_are_reachable_from_their_entries)
{
	static const char *const gpu_ops[] = { "Add", "MatMul", "Relu", "Sum", "Softmax",
					       "SparseSoftmaxCrossEntropyWithLogits", "ReluGrad",
					       "GlorotUniform", "Reshape", "Cast" };
	int n_cuda = 0;

	for (int i = 0; i < dg_op_count(); i++) {
		const struct dg_op_def *op = dg_op_at(i);
		n_cuda += op->cuda != NULL;
		cr_assert_eq(dg_cuda_supports(op), op->cuda != NULL, "%s", op->name);
	}
	for (size_t i = 0; i < sizeof gpu_ops / sizeof gpu_ops[0]; i++)
		cr_assert_eq(dg_op_find(gpu_ops[i])->cuda != NULL, dg_gpu_built(), "%s",
			     gpu_ops[i]);
	if (dg_gpu_built())
		cr_assert_gt(n_cuda, 50, "a CUDA build has kernels for most ops");
	else
		cr_assert_eq(n_cuda, 0);
	cr_assert_null(dg_op_find("Placeholder")->cuda);
	cr_assert_null(dg_op_find("IdxReader")->cuda);
}

static enum dg_status infer_nothing(struct dg_infer_ctx *c)
{
	(void)c;
	return DG_OK;
}

static const struct dg_op_def upper_op = {
	.name = "ZzUpperLayerOp", .min_inputs = 1, .max_inputs = 1, .n_outputs = 0,
	.infer = infer_nothing, .doc = "an op of a layer above kernels/",
};
static const struct dg_op_def upper_op_twin = {
	.name = "ZzUpperLayerOp", .min_inputs = 1, .max_inputs = 1, .n_outputs = 0,
	.infer = infer_nothing, .doc = "another op with the same name",
};
static const struct dg_op_def add_twin = {
	.name = "Add", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	.infer = infer_nothing, .doc = "a second Add",
};

Test(registry, a_layer_adds_its_ops_and_each_lookup_sees_its_layers)
{
	struct dg_err err = { 0 };
	int n = dg_op_count();

	cr_assert_eq(dg_op_layer_of(dg_op_find("MatMul")), DG_OPL_KERNEL);
	cr_assert_eq(dg_op_register(DG_OPL_WORKER, &upper_op, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_op_register(DG_OPL_WORKER, &upper_op, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_op_count(), n + 1);
	cr_assert_eq(dg_op_layer_of(&upper_op), DG_OPL_WORKER);
	/* Kernel lookups (dg eval) do not see it; a lookup that accepts the layer does. */
	cr_assert_null(dg_op_find("ZzUpperLayerOp"));
	cr_assert_null(dg_op_find_in("ZzUpperLayerOp", DG_OPL_KERNEL | DG_OPL_MASTER));
	cr_assert_eq(dg_op_find_in("ZzUpperLayerOp", DG_OPL_KERNEL | DG_OPL_WORKER), &upper_op);
	cr_assert_eq(dg_op_find_in("Add", DG_OPL_ALL), dg_op_find("Add"));
	/* Still one sorted index of unique names. */
	for (int i = 1; i < dg_op_count(); i++)
		cr_assert_lt(strcmp(dg_op_at(i - 1)->name, dg_op_at(i)->name), 0);
	cr_assert_eq(dg_op_at(dg_op_count() - 1), &upper_op);
}

Test(registry, a_name_is_registered_once)
{
	struct dg_err err = { 0 };

	cr_assert_eq(dg_op_register(DG_OPL_MASTER, &upper_op, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_op_register(DG_OPL_MASTER, &upper_op_twin, &err), DG_EEXIST);
	cr_assert(strstr(err.msg, "ZzUpperLayerOp"), "%s", err.msg);
	cr_assert_eq(dg_op_register(DG_OPL_WORKER, &upper_op, &err), DG_EEXIST);
	cr_assert_eq(dg_op_register(DG_OPL_WORKER, &add_twin, &err), DG_EEXIST);
	cr_assert_eq(dg_op_register(DG_OPL_KERNEL, &upper_op, &err), DG_EINVAL);
	cr_assert_eq(dg_op_find_in("ZzUpperLayerOp", DG_OPL_ALL), &upper_op);
	cr_assert_eq(dg_op_layer_of(&upper_op_twin), 0);
}

Test(registry, run_refuses_an_op_without_a_kernel)
{
	struct dg_err err = { 0 };
	struct dg_shape s = { .ndim = 1, .dim = { 3 } };
	struct dg_tensor *a = dg_tensor_new(DG_F32, &s, &err);
	const struct dg_tensor *in[] = { a };

	cr_assert_eq(dg_op_register(DG_OPL_WORKER, &upper_op, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_op_run(&upper_op, NULL, in, 1, NULL, 0, 0, &err), DG_EUNSUPPORTED);
	cr_assert(strstr(err.msg, "ZzUpperLayerOp") && strstr(err.msg, "executor"), "%s",
		  err.msg);
	dg_tensor_free(a);
}

Test(registry, run_refuses_wrong_arity_before_the_kernel)
{
	struct dg_err err = { 0 };
	struct dg_shape s = { .ndim = 1, .dim = { 3 } };
	struct dg_tensor *a = dg_tensor_new(DG_F32, &s, &err);
	const struct dg_tensor *in[] = { a };
	struct dg_tensor *out[1];

	cr_assert_not_null(a);
	enum dg_status st = dg_op_run(dg_op_find("Add"), NULL, in, 1, out, 1, 0, &err);
	cr_assert_eq(st, DG_EINVAL);
	cr_assert(strstr(err.msg, "Add") && strstr(err.msg, "inputs"), "%s", err.msg);
	cr_assert_null(out[0]);
	dg_tensor_free(a);
}

Test(registry, run_refuses_unknown_attrs_naming_them)
{
	struct dg_err err = { 0 };
	struct dg_shape s = { .ndim = 1, .dim = { 3 } };
	struct dg_tensor *a = dg_tensor_new(DG_F32, &s, &err);
	const struct dg_tensor *in[] = { a, a };
	struct dg_tensor *out[1];
	json_t *attrs = json_pack("{s:i}", "bogus", 1);

	enum dg_status st = dg_op_run(dg_op_find("Add"), attrs, in, 2, out, 1, 0, &err);
	cr_assert_eq(st, DG_EINVAL);
	cr_assert(strstr(err.msg, "bogus"), "%s", err.msg);
	json_decref(attrs);
	dg_tensor_free(a);
}

Test(registry, run_adds_two_vectors)
{
	struct dg_err err = { 0 };
	struct dg_shape s = { .ndim = 1, .dim = { 3 } };
	float va[] = { 1, 2, 3 }, vb[] = { 10, 20, 30.5f };
	struct dg_tensor *a = dg_tensor_from_data(DG_F32, &s, va, &err);
	struct dg_tensor *b = dg_tensor_from_data(DG_F32, &s, vb, &err);
	const struct dg_tensor *in[] = { a, b };
	struct dg_tensor *out[1];

	cr_assert_eq(dg_op_run(dg_op_find("Add"), NULL, in, 2, out, 1, 0, &err), DG_OK, "%s",
		     err.msg);
	cr_assert(dg_shape_eq(&out[0]->shape, &s));
	cr_assert_float_eq(((float *)out[0]->data)[2], 33.5f, 1e-6);
	dg_tensor_free(out[0]);
	dg_tensor_free(a);
	dg_tensor_free(b);
}

Test(registry, gpu_query_answers_without_a_gpu)
{
	const char *d = dg_gpu_describe();
	int n = dg_gpu_count();

	cr_assert(d && d[0]);
	cr_assert_geq(n, 0);
	if (n == 0) {
		struct dg_gpu_info g;
		struct dg_err err = { 0 };
		cr_assert_eq(dg_gpu_get_info(0, &g, &err), DG_ENOTFOUND);
	}
}
