/* Private to the worker face: which worker op a node is (ops.c), and the route
 * table of the worker group (routes.c, handlers get the struct worker). */
#ifndef WORKER_INTERNAL_H
#define WORKER_INTERNAL_H

#include "dg/executor.h"

enum worker_opkind {
	WOP_NONE = 0,      /* a registry op: run its kernel */
	WOP_SEND,
	WOP_RECV,
	WOP_VAR_READ,
	WOP_VAR_APPLY,
	WOP_VAR_INIT,
};

/* The kind of op, by identity with the definitions of ops.c. */
enum worker_opkind worker_op_kind(const struct dg_op_def *op);

/* The tensor a VarInit node describes (attrs already validated): zeros, ones,
 * uniform [-scale, scale], normal (stddev scale) or glorot (uniform, limit
 * scale*sqrt(6/(fan_in+fan_out))), reproducible from seed. Owned or NULL. */
struct dg_tensor *worker_init_tensor(const json_t *attrs, struct dg_err *err);

/* worker_run_steps; id_is_kstep: kernels see the step id (a plain run, as
 * before training runs existed: POST run without "train_step") instead of the
 * training step. */
enum dg_status worker_run_steps_mode(struct worker *w, const char *id,
				     const struct worker_run_opts *o, bool id_is_kstep,
				     struct worker_run_result *res, struct dg_err *err);

/* Count a tensor of n bytes received over HTTP (for worker_metrics). */
void worker_count_received(struct worker *w, size_t n);

extern const struct dg_route worker_routes[];
extern const int worker_n_routes;

#endif
