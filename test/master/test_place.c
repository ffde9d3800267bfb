/* Placement with GPUs (place.h, pure functions): the cost model sends
 * compute-heavy nodes without a device type to a task's GPU, neighbours follow
 * them where that saves host<->device copies, /cpu:0 and small nodes stay, and
 * the choice reaches the fragments ("device": "/gpu:K") and --explain. No GPU
 * is needed: placement only reads place_opts.task_gpu. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "dg/cluster.h"
#include "dg/graph.h"
#include "dg/place.h"
#include "master_test_util.h"

/* ps/0, worker/0, worker/1 (task indices 0, 1, 2); only worker/1 has a GPU. */
static const char cluster3[] =
	"{'ps': ['127.0.0.1:7000'], 'worker': ['127.0.0.1:7010', '127.0.0.1:7011']}";
static const bool gpu_on_w1[3] = { false, false, true };

/* A 1024x1024 float32 Const (4 MiB). */
#define BIG(name) "{'name':'" name "','op':'Const','attrs':{'value':{'dtype':'float32'," \
	"'shape':[1024,1024],'value':0.5}}}"

/* The placement's device for node name ("/job:worker/task:1/gpu:0"). */
static const char *dev(const struct placed *x, const char *name)
{
	static char buf[128];
	int n = dg_graph_find(x->g, name);

	cr_assert_geq(n, 0, "no node %s", name);
	place_node_device(x->c, &x->p, n, buf, sizeof buf);
	return buf;
}

static const char *why(const struct placed *x, const char *name)
{
	return x->p.why[dg_graph_find(x->g, name)];
}

/* The "device" key of node name in the fragment of task t, or NULL. */
static const char *frag_device(const struct partition *part, int t, const char *name)
{
	for (int i = 0; i < part->n_frags; i++) {
		size_t k;
		json_t *n;
		if (part->frags[i].task != t)
			continue;
		json_array_foreach(json_object_get(part->frags[i].doc, "nodes"), k, n)
			if (strcmp(json_string_value(json_object_get(n, "name")), name) == 0)
				return json_string_value(json_object_get(n, "device"));
		cr_assert_fail("node %s is not in the fragment of task %d", name, t);
	}
	cr_assert_fail("no fragment for task %d", t);
	return NULL;
}

/* mm (1024^3 = 2^30 multiply-adds) feeds r, s and sum (each under the
 * threshold alone), a /cpu:0 Square and a node with only small host inputs. */
static const char mlp_like[] = "{'nodes': ["
	BIG("a") "," BIG("b") ","
	"{'name':'mm','op':'MatMul','inputs':['a','b']},"
	"{'name':'r','op':'Relu','inputs':['mm']},"
	"{'name':'c','op':'Const','attrs':{'value':2.0}},"
	"{'name':'s','op':'Mul','inputs':['r','c']},"
	"{'name':'sum','op':'Sum','inputs':['s']},"
	"{'name':'sq','op':'Square','inputs':['mm'],'device':'/cpu:0'},"
	"{'name':'k','op':'Const','attrs':{'value':[1.0,2.0,3.0]}},"
	"{'name':'neg','op':'Neg','inputs':['k']}"
	"], 'fetch': ['sum', 'sq', 'neg']}";

Test(place_gpu, a_heavy_matmul_goes_to_the_task_with_a_gpu_and_neighbours_follow)
{
	struct place_opts o = { .task_gpu = gpu_on_w1 };
	struct placed x;

	placed_init(&x, cluster3, mlp_like, &o);
	cr_assert_str_eq(dev(&x, "mm"), "/job:worker/task:1/gpu:0");
	cr_assert_str_eq(why(&x, "mm"), "gpu");
	/* 4 MiB of input already on the GPU against 4 bytes (c) or none in host memory */
	cr_assert_str_eq(dev(&x, "r"), "/job:worker/task:1/gpu:0");
	cr_assert_str_eq(why(&x, "r"), "gpu-colocated");
	cr_assert_str_eq(dev(&x, "s"), "/job:worker/task:1/gpu:0");
	cr_assert_str_eq(dev(&x, "sum"), "/job:worker/task:1/gpu:0");
	/* the sources stay in host memory, on the task of their consumer */
	cr_assert_str_eq(dev(&x, "a"), "/job:worker/task:1");
	cr_assert_str_eq(dev(&x, "c"), "/job:worker/task:1");
	/* an explicit /cpu:0 stays on the CPU, next to its input */
	cr_assert_str_eq(dev(&x, "sq"), "/job:worker/task:1");
	cr_assert_eq(x.p.gpu[dg_graph_find(x.g, "sq")], -1);
	/* small work with host inputs only: no GPU */
	cr_assert_eq(x.p.gpu[dg_graph_find(x.g, "neg")], -1);
	cr_assert_eq(x.p.gpu[dg_graph_find(x.g, "k")], -1);
	placed_deinit(&x);
}

Test(place_gpu, gpu_nodes_carry_their_gpu_into_the_fragment_and_explain_says_gpu)
{
	struct place_opts o = { .task_gpu = gpu_on_w1 };
	struct placed x;
	struct partition part;
	struct dg_err err = { 0 };

	placed_init(&x, cluster3, mlp_like, &o);
	cr_assert_eq(place_partition(x.g, x.c, &x.p, 1, NULL, 0, NULL, 0, &part, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_str_eq(frag_device(&part, 2, "mm"), "/gpu:0");
	cr_assert_str_eq(frag_device(&part, 2, "r"), "/gpu:0");
	cr_assert_str_eq(frag_device(&part, 2, "sum"), "/gpu:0");
	cr_assert_null(frag_device(&part, 2, "sq"));
	cr_assert_null(frag_device(&part, 2, "a"));
	char *ex = place_explain(x.g, x.c, &x.p, &part);
	cr_assert_not_null(ex);
	cr_assert(strstr(ex, "mm    /job:worker/task:1/gpu:0 gpu\n"), "%s", ex);
	cr_assert(strstr(ex, "r     /job:worker/task:1/gpu:0 gpu-colocated\n"), "%s", ex);
	cr_assert(strstr(ex, "node  mm = MatMul(a, b) on /gpu:0\n"), "%s", ex);
	cr_assert(strstr(ex, "node  sq = Square(mm)\n"), "%s", ex);
	free(ex);
	partition_deinit(&part);
	placed_deinit(&x);
}

Test(place_gpu, without_gpus_nothing_changes)
{
	bool none[3] = { false, false, false };
	struct place_opts o = { .task_gpu = none };
	struct placed x;
	struct placement q;
	struct partition part;
	struct dg_err err = { 0 };

	placed_init(&x, cluster3, mlp_like, NULL);
	cr_assert_eq(place_graph(x.g, x.c, &o, &q, &err), DG_OK, "%s", err.msg);
	for (int n = 0; n < x.g->n_nodes; n++) {
		cr_assert_eq(x.p.gpu[n], -1, "node %s", x.g->nodes[n].name);
		cr_assert_eq(x.p.task[n], q.task[n], "node %s", x.g->nodes[n].name);
		cr_assert_str_eq(x.p.why[n], q.why[n]);
		cr_assert_eq(q.gpu[n], -1);
	}
	/* the heavy MatMul goes to a worker by the CPU cost model, not to the ps */
	cr_assert_str_eq(dev(&x, "mm"), "/job:worker/task:0");
	cr_assert_eq(place_partition(x.g, x.c, &x.p, 1, NULL, 0, NULL, 0, &part, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_null(frag_device(&part, x.p.task[dg_graph_find(x.g, "mm")], "mm"));
	partition_deinit(&part);
	placement_deinit(&q);
	placed_deinit(&x);
}

Test(place_gpu, the_threshold_counts_what_a_reduction_reads)
{
	/* Sum over 2048x2048 (2^22 elements read) is heavy; over 1024x1024 (2^20) not;
	 * Neg of 1024x1024 writes 2^20 elements: not heavy either. */
	const char *graph = "{'nodes': ["
		"{'name':'big','op':'Const','attrs':{'value':{'dtype':'float32',"
		"'shape':[2048,2048],'value':1}}},"
		"{'name':'sbig','op':'Sum','inputs':['big']}," BIG("mid") ","
		"{'name':'smid','op':'Sum','inputs':['mid']},"
		"{'name':'nmid','op':'Neg','inputs':['mid']}]}";
	struct place_opts o = { .task_gpu = gpu_on_w1 };
	struct placed x;

	placed_init(&x, cluster3, graph, &o);
	cr_assert_str_eq(dev(&x, "sbig"), "/job:worker/task:1/gpu:0");
	cr_assert_str_eq(why(&x, "sbig"), "gpu");
	cr_assert_eq(x.p.gpu[dg_graph_find(x.g, "smid")], -1);
	cr_assert_eq(x.p.gpu[dg_graph_find(x.g, "nmid")], -1);
	placed_deinit(&x);
}

Test(place_gpu, an_explicit_task_keeps_its_task_and_uses_its_gpu_only_if_it_has_one)
{
	/* Training replicas are written "/job:worker/task:R": the task is fixed, the
	 * device type is the cost model's. */
	const char *graph = "{'nodes': [" BIG("a") ","
		"{'name':'m0','op':'MatMul','inputs':['a','a'],'device':'/job:worker/task:0'},"
		"{'name':'m1','op':'MatMul','inputs':['a','a'],'device':'/job:worker/task:1'},"
		"{'name':'m2','op':'MatMul','inputs':['a','a'],"
		"'device':'/job:worker/task:1/cpu:0'},"
		"{'name':'m3','op':'MatMul','inputs':['a','a'],"
		"'device':'/job:worker/task:1/device:GPU:1'}], 'fetch': ['m0','m1','m2','m3']}";
	struct place_opts o = { .task_gpu = gpu_on_w1 };
	struct placed x;
	struct partition part;
	struct dg_err err = { 0 };

	placed_init(&x, cluster3, graph, &o);
	cr_assert_str_eq(dev(&x, "m0"), "/job:worker/task:0");
	cr_assert_str_eq(dev(&x, "m1"), "/job:worker/task:1/gpu:0");
	cr_assert_str_eq(dev(&x, "m2"), "/job:worker/task:1");
	cr_assert_str_eq(dev(&x, "m3"), "/job:worker/task:1/gpu:1");
	cr_assert_str_eq(why(&x, "m3"), "explicit");
	cr_assert_eq(place_partition(x.g, x.c, &x.p, 1, NULL, 0, NULL, 0, &part, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_null(frag_device(&part, 1, "m0"));
	cr_assert_str_eq(frag_device(&part, 2, "m1"), "/gpu:0");
	cr_assert_null(frag_device(&part, 2, "m2"));
	cr_assert_str_eq(frag_device(&part, 2, "m3"), "/gpu:1");
	partition_deinit(&part);
	placed_deinit(&x);
}

Test(place_gpu, soft_placement_leaves_no_gpu_in_the_fragment)
{
	const char *graph = "{'nodes': [" BIG("a") ","
		"{'name':'m','op':'MatMul','inputs':['a','a'],"
		"'device':'/job:worker/task:0/gpu:0'}], 'fetch': ['m']}";
	struct place_opts o = { .task_gpu = gpu_on_w1, .soft_placement = true };
	struct placed x;
	struct partition part;
	struct dg_err err = { 0 };

	placed_init(&x, cluster3, graph, &o);
	cr_assert(x.p.soft[dg_graph_find(x.g, "m")]);
	/* asked for worker/0's GPU: soft, so the cost model does not move it to one */
	cr_assert_str_eq(dev(&x, "m"), "/job:worker/task:0");
	cr_assert_eq(place_partition(x.g, x.c, &x.p, 1, NULL, 0, NULL, 0, &part, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_null(frag_device(&part, 1, "m"));
	partition_deinit(&part);
	placed_deinit(&x);
}
