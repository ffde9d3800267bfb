/* The single-process evaluator: runs the part of a validated graph that the
 * fetches need, in topological order, through the op registry's kernels.
 * Used by `dg eval`; workers run their fragments' kernels through dg_exec_kernel.
 * Feeds are substituted for node outputs. A node whose device names a GPU
 * (".../gpu:K") runs its CUDA kernel when the GPU and kernel exist, else on the
 * CPU; in dg_exec_run values stay on the GPU between GPU nodes. */
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
 * inferred output types. On error outs[] is all NULL and *err (not NULL) is
 * prefixed "node 'y' (Add): ".
 * Shared by dg_exec_run and the worker's fragment executor. Thread-safe. */
enum dg_status dg_exec_kernel(const struct dg_node *n, const struct dg_tensor *const *ins,
			      struct dg_tensor **outs, uint64_t step, struct dg_err *err);

/* True when the tensor t may be fed for a value of inferred type want: same
 * dtype, same rank when the rank is known, equal sizes where known. On false,
 * *err (DG_EDTYPE or DG_ESHAPE) says why, without naming the node. */
bool dg_exec_type_ok(const struct dg_ttype *want, const struct dg_tensor *t,
		     struct dg_err *err);

#endif
