/* The 784-256-10 MLP training step as one dg graph, shared by the GPU parity
 * test (test/cuda/test_parity.c) and bench_cuda (bench/cuda.c) so the step the
 * test proves equal on CPU and GPU is the step the bench times. A header of
 * static inline code because the two link into different executables and
 * meson builds neither a library for test helpers. */
#ifndef DG_TEST_MLP_STEP_H
#define DG_TEST_MLP_STEP_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "dg/autodiff.h"
#include "dg/graph.h"
#include "dg/kernels.h"

/* Placeholders x [64,784] float32, y [64] int32 (labels 0..9), w1 [784,256],
 * b1 [256], w2 [256,10], b2 [10]; loss = mean softmax cross-entropy. */
static const char mlp_step_fwd[] =
	"{\"version\": 1, \"nodes\": ["
	"{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"float32\", "
	"\"shape\": [64, 784]}},"
	"{\"name\": \"y\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": \"int32\", "
	"\"shape\": [64]}},"
	"{\"name\": \"w1\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [784, 256]}},"
	"{\"name\": \"b1\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [256]}},"
	"{\"name\": \"w2\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [256, 10]}},"
	"{\"name\": \"b2\", \"op\": \"Placeholder\", \"attrs\": {\"shape\": [10]}},"
	"{\"name\": \"z1\", \"op\": \"MatMul\", \"inputs\": [\"x\", \"w1\"]},"
	"{\"name\": \"a1\", \"op\": \"Add\", \"inputs\": [\"z1\", \"b1\"]},"
	"{\"name\": \"h1\", \"op\": \"Relu\", \"inputs\": [\"a1\"]},"
	"{\"name\": \"z2\", \"op\": \"MatMul\", \"inputs\": [\"h1\", \"w2\"]},"
	"{\"name\": \"logits\", \"op\": \"Add\", \"inputs\": [\"z2\", \"b2\"]},"
	"{\"name\": \"ce\", \"op\": \"SparseSoftmaxCrossEntropyWithLogits\", "
	"\"inputs\": [\"logits\", \"y\"]},"
	"{\"name\": \"loss\", \"op\": \"Mean\", \"inputs\": [\"ce\"]},"
	"{\"name\": \"lr\", \"op\": \"Const\", \"attrs\": {\"value\": 0.1}}]}";

/* The weights, in the order of the gradient refs. */
static const char *const mlp_step_wrt[4] = { "w1", "b1", "w2", "b2" };

/* The MLP forward, autodiff's backward and one SGD step (lr 0.1):
 * "<w>_step" = grad * lr, "<w>_new" = w - "<w>_step" for each weight. Every
 * node gets device dev (NULL: none, the CPU). *out: the owned step graph.
 * refs (NULL: not wanted): the 4 gradient value refs in mlp_step_wrt order,
 * owned (dg_autodiff_free_refs(*refs, 4)). On error *out is NULL, nothing is
 * kept and *err says what failed. */
static inline enum dg_status mlp_step_graph(const char *dev, struct dg_graph **out,
					    char ***refs, struct dg_err *err)
{
	struct dg_graph *g = dg_graph_parse(mlp_step_fwd, strlen(mlp_step_fwd), dg_op_find, err);
	json_t *doc = NULL, *nodes, *node;
	char **grads = NULL;
	enum dg_status st = DG_OK;
	size_t i;

	*out = NULL;
	if (!g)
		return err->code;
	if ((st = dg_autodiff(g, "loss", mlp_step_wrt, 4, &doc, &grads, err)) != DG_OK)
		goto done;
	nodes = json_object_get(doc, "nodes");
	for (int k = 0; k < 4 && st == DG_OK; k++) {
		char name[32], scaled[32];
		snprintf(name, sizeof name, "%s_new", mlp_step_wrt[k]);
		snprintf(scaled, sizeof scaled, "%s_step", mlp_step_wrt[k]);
		if (!grads[k]) {
			st = dg_err_set(err, DG_EINVAL, "the MLP's loss has no gradient for %s",
					mlp_step_wrt[k]);
		} else if (json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s, s]}", "name",
						  scaled, "op", "Mul", "inputs", grads[k], "lr")) ||
			   json_array_append_new(nodes, json_pack("{s:s, s:s, s:[s, s]}", "name",
						  name, "op", "Sub", "inputs", mlp_step_wrt[k],
						  scaled))) {
			st = dg_err_set(err, DG_ENOMEM, "out of memory adding %s's update", name);
		}
	}
	if (st != DG_OK)
		goto done;
	json_array_foreach(nodes, i, node) {
		json_object_del(node, "device");
		if (dev && json_object_set_new(node, "device", json_string(dev))) {
			st = dg_err_set(err, DG_ENOMEM, "out of memory placing the MLP on %s", dev);
			goto done;
		}
	}
	if (!(*out = dg_graph_from_json(doc, dg_op_find, err)))
		st = err->code;
done:
	if (st == DG_OK && refs) {
		*refs = grads;
		grads = NULL;
	}
	dg_autodiff_free_refs(grads, 4);
	json_decref(doc);
	dg_graph_free(g);
	return st;
}

/* |a - b| <= rel * max|cpu| elementwise (gradients have entries near zero):
 * the CPU value c against the GPU value g. */
static inline void mlp_expect_close(const struct dg_tensor *c, const struct dg_tensor *g,
				    double rel, const char *what)
{
	double mx = 0;

	cr_assert(dg_shape_eq(&c->shape, &g->shape), "%s: shapes differ", what);
	for (int64_t i = 0; i < c->numel; i++)
		mx = fmax(mx, fabs(dg_tensor_get_f64(c, i)));
	for (int64_t i = 0; i < c->numel; i++) {
		double a = dg_tensor_get_f64(c, i), b = dg_tensor_get_f64(g, i);
		cr_assert(fabs(a - b) <= rel * mx, "%s: element %lld cpu %.9g gpu %.9g (max %.3g)",
			  what, (long long)i, a, b, mx);
	}
}

#endif
