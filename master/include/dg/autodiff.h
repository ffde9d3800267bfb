/* Reverse-mode automatic differentiation over the graph IR: from a loss node,
 * build the backward graph (each op's gradient function in the registry adds
 * its nodes, see struct dg_grad_ctx in dg/op.h) and return a new graph
 * document holding the forward nodes plus the gradient nodes. The master and
 * the tests call it; the result runs like any graph (dg_exec_run). */
#ifndef DG_AUTODIFF_H
#define DG_AUTODIFF_H

#include <stdbool.h>

#include <jansson.h>

#include "dg/graph.h"

struct dg_autodiff_opts {
	const char *prefix;           /* prefix of the new node names; NULL: "grad/" */
	bool zeros_for_unreachable;   /* a wrt the loss does not depend on gets
				       * ZerosLike(wrt) instead of no gradient (NULL) */
	dg_op_lookup_fn lookup;       /* validates the result; NULL: dg_op_find. Pass
				       * the lookup g was parsed with (e.g. the
				       * worker's, which knows VarRead) */
	/* Non-NULL: gradients may come back row-wise (TensorFlow's
	 * IndexedSlices). A wrt whose every contribution is an
	 * UnsortedSegmentSum(values, rows) (what Gather's gradient is) gets
	 * grad_refs[i] = the values ([n] + wrt's shape[1:]) and (*row_refs)[i]
	 * = the rows (int vector), those of several contributions
	 * concatenated; the others get (*row_refs)[i] NULL. Owned as grad_refs
	 * (dg_autodiff_free_refs). */
	char ***row_refs;
};

/* Differentiate loss_ref ("node" or "node:k" of g, a float tensor) with
 * respect to wrt[0..n_wrt) (node outputs, typically Variable reads or
 * Placeholders). The loss's gradient is seeded with OnesLike(loss), so a
 * non-scalar loss means the sum of its elements. Gradients of values used
 * several times are summed (chained Add); broadcasting binary ops reduce their
 * gradients back to their input shapes.
 *
 * On DG_OK, *out_doc is an owned new document (json_decref): g's document
 * with the gradient nodes appended to "nodes" (each placed on the device of
 * the forward node it differentiates), valid under dg_graph_from_json; and
 * *grad_refs an owned array of n_wrt owned strings (dg_autodiff_free_refs):
 * the ref of d(loss)/d(wrt[i]), or NULL when the loss does not depend on it
 * (unless opts->zeros_for_unreachable). On error both are NULL and *err says
 * what failed: DG_ENOTFOUND / DG_EINVAL for a bad ref, DG_EDTYPE for a
 * non-float loss or wrt, DG_EUNSUPPORTED naming the node whose op has no
 * gradient on the path from a wrt to the loss. g is borrowed, not modified.
 * Thread-safe for distinct outputs. err may be NULL. */
enum dg_status dg_autodiff(const struct dg_graph *g, const char *loss_ref,
			   const char *const *wrt, int n_wrt, json_t **out_doc, char ***grad_refs,
			   struct dg_err *err);
/* Same with options (opts may be NULL). */
enum dg_status dg_autodiff_ex(const struct dg_graph *g, const char *loss_ref,
			      const char *const *wrt, int n_wrt,
			      const struct dg_autodiff_opts *opts, json_t **out_doc,
			      char ***grad_refs, struct dg_err *err);
/* Free what dg_autodiff returned in grad_refs (NULL is fine). */
void dg_autodiff_free_refs(char **refs, int n);

#endif
