/* GPU placement end to end in one process: the master's placement and
 * partition of the MLP training step (test/cuda/mlp_step.h) give a fragment
 * whose nodes carry "/gpu:0", and the worker's executor runs it for two steps,
 * keeping values in device memory between GPU nodes. Compared with the same
 * step placed on the CPU; without a GPU the placed fragment must give the CPU's
 * bits (soft placement) and the GPU-only checks skip. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/mlp_step.h"
#include "dg/cluster.h"
#include "dg/cuda.h"
#include "dg/exec.h"
#include "dg/executor.h"
#include "dg/gpu.h"
#include "dg/place.h"
#include "dg/rendezvous.h"

#define SELF "127.0.0.1:7010"
#define N_FEEDS 6
#define N_FETCH 5

static const char *const feed_names[N_FEEDS] = { "x", "y", "w1", "b1", "w2", "b2" };
static const char *const fetch_names[N_FETCH] = { "loss", "w1_new", "b1_new", "w2_new",
						  "b2_new" };

/* x in [0, 1), labels 0..9, weights U(-0.05, 0.05), biases U(-0.01, 0.01), from
 * a fixed linear congruential generator. */
static struct dg_tensor *feed_value(int k)
{
	static const char *const shapes[N_FEEDS] = { "64,784", "64", "784,256", "256",
						     "256,10", "10" };
	struct dg_shape s;
	struct dg_err err = { 0 };
	uint64_t rng = 0x9E3779B97F4A7C15ull + (uint64_t)k;

	cr_assert_eq(dg_shape_parse(shapes[k], &s, &err), DG_OK, "%s", err.msg);
	struct dg_tensor *t = dg_tensor_new(k == 1 ? DG_I32 : DG_F32, &s, &err);
	cr_assert_not_null(t, "%s", err.msg);
	for (int64_t i = 0; i < t->numel; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		double u = (double)(rng >> 11) / 9007199254740992.0;
		dg_tensor_set_f64(t, i, k == 0 ? u : k == 1 ? floor(u * 10) :
				  k % 2 ? (u - 0.5) * 0.02 : (u - 0.5) * 0.1);
	}
	return t;
}

struct mlp_run {
	struct dg_tensor *out[N_FETCH];     /* step 2's fetches */
	int gpu_nodes;                      /* fragment nodes with a "device" */
	struct dg_exec_gpu_copies copies;   /* host<->device copies made by step 2 */
};

/* Place the MLP step (every node on dev; NULL: none) on a one-task cluster
 * whose task has a GPU when has_gpu, cut it, register the fragment with a
 * worker and run steps 1 and 2 with the same feeds. */
static void run_mlp(const char *dev, bool has_gpu, struct mlp_run *res)
{
	static const char spec[] = "{\"worker\": [\"" SELF "\"]}";
	struct dg_err err = { 0 };
	struct dg_cluster *c = dg_cluster_parse(spec, strlen(spec), &err);
	struct worker_config wc = { .job = "worker", .task = 0, .address = SELF };
	struct worker *w = worker_new(&wc, &err);
	struct place_opts po = { .task_gpu = &has_gpu };
	struct dg_graph *g;
	struct placement p;
	struct partition part;
	char id[24];

	cr_assert_not_null(c, "%s", err.msg);
	cr_assert_not_null(w, "%s", err.msg);
	cr_assert_eq(mlp_step_graph(dev, &g, NULL, &err), DG_OK, "MLP graph: %s", err.msg);
	cr_assert_eq(place_graph(g, c, &po, &p, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(place_partition(g, c, &p, 0, feed_names, N_FEEDS, fetch_names, N_FETCH,
				     &part, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(part.n_frags, 1);
	size_t i;
	json_t *n;
	res->gpu_nodes = 0;
	json_array_foreach(json_object_get(part.frags[0].doc, "nodes"), i, n)
		res->gpu_nodes += json_object_get(n, "device") != NULL;
	char *text = json_dumps(part.frags[0].doc, JSON_COMPACT);
	cr_assert_not_null(text);
	cr_assert_eq(worker_fragment_add(w, text, strlen(text), id, sizeof id, NULL, NULL, &err),
		     DG_OK, "%s", err.msg);
	free(text);
	struct dg_rendezvous *rv = worker_rendezvous(w);
	for (uint64_t step = 1; step <= 2; step++) {
		struct dg_exec_gpu_copies before, after;
		for (int k = 0; k < N_FEEDS; k++)
			cr_assert_eq(dg_rendezvous_put(rv, step, part.feeds[k].key, feed_value(k),
						       &err), DG_OK, "%s", err.msg);
		dg_exec_gpu_copies(&before);
		cr_assert_eq(worker_run_fragment(w, id, step, 30000, NULL, &err), DG_OK,
			     "%s: %s", dev ? dev : "cpu", err.msg);
		dg_exec_gpu_copies(&after);
		res->copies = (struct dg_exec_gpu_copies){
			after.uploads - before.uploads, after.upload_bytes - before.upload_bytes,
			after.downloads - before.downloads,
			after.download_bytes - before.download_bytes,
		};
		for (int k = 0; k < N_FETCH; k++) {
			struct dg_tensor *t = NULL;
			cr_assert_eq(dg_rendezvous_take(rv, step, part.fetch_keys[k], 0, &t, &err),
				     DG_OK, "%s", err.msg);
			if (step == 2)
				res->out[k] = t;
			else
				dg_tensor_free(t);
		}
	}
	partition_deinit(&part);
	placement_deinit(&p);
	dg_graph_free(g);
	worker_free(w);
	dg_cluster_free(c);
}

static void free_run(struct mlp_run *r)
{
	for (int k = 0; k < N_FETCH; k++)
		dg_tensor_free(r->out[k]);
}

static void expect_same_bits(const struct mlp_run *a, const struct mlp_run *b)
{
	for (int k = 0; k < N_FETCH; k++) {
		cr_assert_eq(a->out[k]->nbytes, b->out[k]->nbytes, "%s", fetch_names[k]);
		cr_assert_eq(memcmp(a->out[k]->data, b->out[k]->data, a->out[k]->nbytes), 0,
			     "%s differs", fetch_names[k]);
	}
}

/* The cost model, given a task with a GPU, put the heavy MatMul and what follows
 * it there; an explicit "/gpu:0" put every node there. */
static void run_three(struct mlp_run *cpu, struct mlp_run *gpu, struct mlp_run *cost)
{
	run_mlp(NULL, false, cpu);
	/* 10 classes and small weights: the loss is near log(10) */
	cr_assert_float_eq(dg_tensor_get_f64(cpu->out[0], 0), log(10.0), 0.1, "loss %g",
			   dg_tensor_get_f64(cpu->out[0], 0));
	cr_assert_eq(cpu->gpu_nodes, 0);
	cr_assert_eq(cpu->copies.uploads + cpu->copies.downloads, 0);
	run_mlp("/gpu:0", true, gpu);
	run_mlp(NULL, true, cost);
	cr_assert_gt(cost->gpu_nodes, 10, "%d nodes on the GPU", cost->gpu_nodes);
	cr_assert_gt(gpu->gpu_nodes, cost->gpu_nodes);
}

Test(place_gpu_exec, mlp_step_fragment_placed_on_a_missing_gpu_gives_the_cpu_bits)
{
	struct mlp_run cpu, gpu, cost;

	if (dg_cuda_available())
		cr_skip_test("a GPU is present (%s): the GPU test covers it", dg_gpu_describe());
	run_three(&cpu, &gpu, &cost);
	/* Soft placement in the worker: the CPU kernels, the CPU's bits, no copies. */
	expect_same_bits(&cpu, &gpu);
	expect_same_bits(&cpu, &cost);
	cr_assert_eq(gpu.copies.uploads + gpu.copies.downloads, 0);
	cr_assert_eq(cost.copies.uploads + cost.copies.downloads, 0);
	free_run(&cpu);
	free_run(&gpu);
	free_run(&cost);
}

Test(place_gpu_exec, mlp_step_fragment_on_the_gpu_equals_the_cpu_step)
{
	struct mlp_run cpu, gpu, cost;

	if (!dg_cuda_available())
		cr_skip_test("no CUDA device: %s", dg_gpu_describe());
	run_three(&cpu, &gpu, &cost);
	cr_assert_float_eq(dg_tensor_get_f64(gpu.out[0], 0), dg_tensor_get_f64(cpu.out[0], 0),
			   1e-5 * log(10.0));
	cr_assert_float_eq(dg_tensor_get_f64(cost.out[0], 0), dg_tensor_get_f64(cpu.out[0], 0),
			   1e-5 * log(10.0));
	for (int k = 1; k < N_FETCH; k++) {
		mlp_expect_close(cpu.out[k], gpu.out[k], 1e-5, fetch_names[k]);
		mlp_expect_close(cpu.out[k], cost.out[k], 1e-5, fetch_names[k]);
	}
	/* Every node on the GPU: the only host copies are the five fetched values,
	 * whatever the ~40 nodes between them exchange. */
	cr_assert_eq(gpu.copies.downloads, N_FETCH, "%llu downloads",
		     (unsigned long long)gpu.copies.downloads);
	cr_assert_eq(gpu.copies.download_bytes, 4 * (1 + 784 * 256 + 256 + 256 * 10 + 10));
	/* Uploads: the six fed values once each, plus the step's constants. */
	cr_assert_geq(gpu.copies.uploads, N_FEEDS);
	cr_assert_geq(gpu.copies.upload_bytes, 4 * (64 * 784 + 64 + 784 * 256 + 256 + 2560 + 10));
	cr_assert_lt(gpu.copies.upload_bytes, 4 * (64 * 784 + 64 + 784 * 256 + 256 + 2560 + 10) +
		     4096);
	free_run(&cpu);
	free_run(&gpu);
	free_run(&cost);
}

/* The device-residency API with or without a GPU: a node placed on /gpu:0 gives
 * b = a^2 either as a device copy (GPU) or as a host tensor (CPU fallback), and
 * reading a value that exists nowhere is an internal error naming the node. */
Test(place_gpu_exec, numbered_values_give_the_same_result_on_either_device)
{
	static const char text[] = "{\"nodes\": [{\"name\": \"a\", \"op\": \"Const\", \"attrs\": "
		"{\"value\": {\"dtype\": \"float32\", \"shape\": [2, 2], \"value\": [1, 2, 3, 4]}}},"
		"{\"name\": \"b\", \"op\": \"Square\", \"inputs\": [\"a\"], \"device\": \"/gpu:0\"}]}";
	struct dg_err err = { 0 };
	struct dg_graph *gr = dg_graph_parse(text, strlen(text), dg_op_find, &err);
	struct dg_tensor *a[1], *b[1], *h = NULL;
	const struct dg_node *nb;
	int in_id[1] = { 0 }, out_id[1] = { 1 };

	cr_assert_not_null(gr, "%s", err.msg);
	nb = &gr->nodes[dg_graph_find(gr, "b")];
	cr_assert_eq(dg_exec_node_gpu(nb), dg_cuda_available() ? 0 : -1);
	struct dg_exec_gpu *g = dg_exec_gpu_new(2, &err);
	cr_assert_not_null(g, "%s", err.msg);
	cr_assert_eq(dg_exec_kernel(&gr->nodes[dg_graph_find(gr, "a")], NULL, a, 0, &err), DG_OK,
		     "%s", err.msg);
	cr_assert_eq(dg_exec_kernel_ids(nb, g, in_id, (const struct dg_tensor *const *)a, out_id,
					b, 0, &err), DG_OK, "%s", err.msg);
	if (b[0]) {
		cr_assert_not(dg_exec_gpu_has(g, 1));
		h = b[0];
	} else {
		cr_assert(dg_exec_gpu_has(g, 1));
		cr_assert_eq(dg_exec_gpu_download(g, 1, &h, &err), DG_OK, "%s", err.msg);
		cr_assert(dg_exec_gpu_has(g, 1), "the device copy stays after a download");
	}
	for (int i = 0; i < 4; i++)
		cr_assert_float_eq(dg_tensor_get_f64(h, i), (double)((i + 1) * (i + 1)), 0);
	dg_tensor_free(h);
	/* Value 1 as the input, forgotten and with no host form: nowhere to read it. */
	dg_exec_gpu_forget(g, 1);
	cr_assert_not(dg_exec_gpu_has(g, 1));
	const struct dg_tensor *none[1] = { 0 };
	cr_assert_eq(dg_exec_kernel_ids(nb, g, out_id, none, out_id, b, 0, &err), DG_EINTERNAL);
	cr_assert_null(b[0]);
	cr_assert(strstr(err.msg, "node 'b' (Square)"), "%s", err.msg);
	cr_assert_eq(dg_exec_gpu_step_end(g, &err), DG_OK, "%s", err.msg);
	dg_exec_gpu_free(g);
	dg_tensor_free(a[0]);
	dg_graph_free(gr);
}
