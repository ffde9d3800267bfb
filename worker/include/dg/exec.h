/* The single-process evaluator (`dg eval`): runs what the fetches need of a
 * graph through the op registry's kernels, feeds substituted for node outputs.
 * Nodes placed on ".../gpu:K" run their CUDA kernels when the GPU and kernel
 * exist, else on the CPU, values staying on the GPU between GPU nodes. Workers
 * run fragments' nodes through dg_exec_kernel and dg_exec_kernel_ids. */
#ifndef DG_EXEC_H
#define DG_EXEC_H

#include <stdint.h>

#include "dg/graph.h"

/* One fed value: ref names any node output ("node" or "node:k"); feeding a
 * node that is not a Placeholder overrides what it computes. Both fields are
 * borrowed for the duration of the call. */
struct dg_feed {
	const char *ref;
	const struct dg_tensor *value;
};

/* Optional knobs and counters; a NULL pointer means all defaults. */
struct dg_exec_opts {
	uint64_t step;        /* passed to kernels (seeded random ops); 0 for one evaluation */
	int *nodes_run;       /* when not NULL, receives the number of kernels that ran */
};

/* Evaluate fetch[0..n_fetch) ("node" or "node:k") of g, a graph from
 * dg_graph_parse/_load (borrowed, not modified: several threads may run the
 * same graph at once). fetch == NULL or n_fetch == 0 means the graph's default
 * fetch list (g->fetch, g->n_fetch entries).
 *
 * out is the caller's array with one slot per fetch (n_fetch, or g->n_fetch by
 * default). On DG_OK every slot holds an owned tensor (dg_tensor_free each);
 * fetching the same value twice gives two tensors. On error every slot is NULL
 * and *err says what failed, naming the node:
 *  - DG_ENOTFOUND: a feed or fetch names no node;
 *  - DG_EINVAL: a malformed ref, a value fed twice, a needed Placeholder not
 *    fed ("placeholder 'x' must be fed (use --feed x=FILE.npy|VALUE)"), or
 *    nothing to fetch;
 *  - DG_EDTYPE / DG_ESHAPE: a feed whose dtype differs from the node's, or
 *    whose shape conflicts with its declared (inferred) shape;
 *  - any kernel error, prefixed "node 'y' (Add): ".
 * Only nodes the fetches need run; an intermediate value is freed as soon as
 * its last consumer has run. Sequential; err may be NULL. */
enum dg_status dg_exec_run(const struct dg_graph *g, const struct dg_feed *feeds, int n_feeds,
			   const char *const *fetch, int n_fetch, struct dg_tensor **out,
			   const struct dg_exec_opts *opts, struct dg_err *err);

/* Run node n's kernel once (its CUDA kernel when n->device names a usable GPU
 * and the op has one for these dtypes, else the CPU kernel): ins[0..n->n_in)
 * borrowed, outs[0..n->n_out) receives owned tensors, each checked against n's
 * inferred output types. a is n's attrs view: the table its caller parsed
 * once (dg_attr_table_new of n->attrs, when the fragment was registered), so
 * the kernel reads no JSON. On error outs[] is all NULL and *err (not NULL) is
 * prefixed "node 'y' (Add): ".
 * Shared by dg_exec_run and the worker's fragment executor. Thread-safe. */
enum dg_status dg_exec_kernel_attrs(const struct dg_node *n, struct dg_attrs a,
				    const struct dg_tensor *const *ins, struct dg_tensor **outs,
				    uint64_t step, struct dg_err *err);
/* The same reading n->attrs as JSON (callers without a table: tests). */
enum dg_status dg_exec_kernel(const struct dg_node *n, const struct dg_tensor *const *ins,
			      struct dg_tensor **outs, uint64_t step, struct dg_err *err);

/* --- device residency for callers that number their values (the worker's
 * fragment executor). A struct dg_exec_gpu holds, per value id 0..n_values-1,
 * at most one device copy, and one stream per GPU it used; values computed on a
 * GPU stay there until the caller downloads or forgets them, so consecutive GPU
 * nodes exchange no host copies. One thread uses it at a time. Without a
 * usable GPU nothing here is needed: dg_exec_node_gpu says -1 for every node. */
struct dg_exec_gpu;

/* The GPU node n runs on, or -1 for the CPU: its device names a GPU
 * (".../gpu:K") that this process has, and its op has a CUDA kernel. Says once
 * per process when the GPU is missing (soft placement). Thread-safe. */
int dg_exec_node_gpu(const struct dg_node *n);

/* Owned state for values 0..n_values-1 (dg_exec_gpu_free), or NULL with *err
 * set (DG_ENOMEM). Allocates no device memory. */
struct dg_exec_gpu *dg_exec_gpu_new(int n_values, struct dg_err *err);
/* Wait for the streams, free every device copy, give the streams back. NULL ok. */
void dg_exec_gpu_free(struct dg_exec_gpu *g);

/* dg_exec_kernel_attrs for numbered values. Input i is value in_ids[i]: its device
 * copy when g has one on n's GPU, else ins[i] (borrowed host tensor; may be
 * NULL when the value exists only on a GPU) uploaded now and kept under
 * in_ids[i]. When n runs on its GPU, output o stays in device memory under
 * out_ids[o] (replacing any copy there) and outs[o] is NULL. When it runs on the
 * CPU (no GPU for it, g NULL, or dtypes its CUDA kernel lacks) outs[o] are owned
 * host tensors as from dg_exec_kernel, inputs only on a GPU being downloaded
 * into temporaries. Errors as dg_exec_kernel (outs all NULL, "node 'y' (Add):"). */
enum dg_status dg_exec_kernel_ids_attrs(const struct dg_node *n, struct dg_attrs a,
					struct dg_exec_gpu *g, const int *in_ids,
					const struct dg_tensor *const *ins, const int *out_ids,
					struct dg_tensor **outs, uint64_t step, struct dg_err *err);
/* The same reading n->attrs as JSON (callers without a table: tests). */
enum dg_status dg_exec_kernel_ids(const struct dg_node *n, struct dg_exec_gpu *g,
				  const int *in_ids, const struct dg_tensor *const *ins,
				  const int *out_ids, struct dg_tensor **outs, uint64_t step,
				  struct dg_err *err);
/* Whether value id has a device copy in g (false for g NULL). */
bool dg_exec_gpu_has(const struct dg_exec_gpu *g, int id);
/* A new host copy (owned, *out) of value id's device copy, which stays. Waits
 * for the work producing it. DG_EINTERNAL when there is no copy; DG_EDEVICE. */
enum dg_status dg_exec_gpu_download(struct dg_exec_gpu *g, int id, struct dg_tensor **out,
				    struct dg_err *err);
/* The value's last reader is done: its device copy is released (the memory
 * is reused after the next synchronisation). No-op without a copy. */
void dg_exec_gpu_forget(struct dg_exec_gpu *g, int id);
/* End of a step: forget every copy and synchronise. A GPU whose queued work
 * failed gives its error (DG_EDEVICE, prefixed "GPU K, at the end of the
 * step"; err may be NULL) and a fresh stream next time. NULL g: DG_OK. */
enum dg_status dg_exec_gpu_step_end(struct dg_exec_gpu *g, struct dg_err *err);

/* Host<->device copies of values made by this process so far (dg_exec_run,
 * dg_exec_kernel and dg_exec_kernel_ids), for tests and benchmarks. */
struct dg_exec_gpu_copies {
	uint64_t uploads, upload_bytes;
	uint64_t downloads, download_bytes;
};
void dg_exec_gpu_copies(struct dg_exec_gpu_copies *out);

/* True when the tensor t may be fed for a value of inferred type want: same
 * dtype, same rank when the rank is known, equal sizes where known. On false,
 * *err (DG_EDTYPE or DG_ESHAPE) says why, without naming the node. */
bool dg_exec_type_ok(const struct dg_ttype *want, const struct dg_tensor *t,
		     struct dg_err *err);

#endif
