/* The typed client of a task's worker routes (doc/http-api.md, "Executor
 * and master"): fragments (register, remove, run one step or a range of
 * steps), the step tensors of its rendezvous (put, take) and aborts. It
 * lives beside the variable client (dg/client.h) and is the only code that
 * builds these requests: the master's remote tasks and the executor's
 * remote _Send call it. Each call takes the dg_http_client to send on (one
 * kept-alive connection, used by one thread at a time).
 *
 * "lost" (may be NULL) says whether a failure means the task itself is gone,
 * so that a retry once it is back may help: the connection failed (refused,
 * reset: no HTTP answer), or the task answered 404 for the fragment it was
 * asked to run (a restarted task lost its fragments). A node's own error
 * comes as an HTTP answer, and a request that timed out may be a step that
 * is merely slow: neither is a lost task. */
#ifndef DG_TASK_CLIENT_H
#define DG_TASK_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "dg/http.h"
#include "dg/tensor.h"

#define DG_FRAGMENT_ID_MAX 24           /* bytes of a fragment id, with the NUL */

/* POST /v1/fragments with the fragment doc (doc/graph-format.md); id
 * receives the id the task gave it (DG_FRAGMENT_ID_MAX bytes). */
enum dg_status dg_task_fragment_add(struct dg_http_client *c, const json_t *doc, char *id,
				    bool *lost, struct dg_err *err);
/* DELETE /v1/fragments/ID. */
enum dg_status dg_task_fragment_remove(struct dg_http_client *c, const char *id,
				       struct dg_err *err);

/* POST /v1/fragments/ID/run. */
struct dg_task_run {
	uint64_t step;                  /* the first step id */
	int64_t steps;                  /* 1 = one step */
	int64_t train_step;             /* training step of the first step; < 0: a plain
					 * run (kernels see the step id) */
	int64_t timeout_ms;             /* per step (_Recv deadline) */
	const char *const *collect;     /* keys taken after each step (borrowed) */
	int n_collect;
};
struct dg_task_run_result {
	int64_t steps_done;
	double *values;                 /* owned: steps_done x n_collect, NAN for null */
	int64_t stale;                  /* sync applies dropped by the ps, summed */
};
/* Run the fragment; out may be NULL (a plain one-step run collects nothing).
 * out is filled on success; release it with dg_task_run_result_deinit. */
enum dg_status dg_task_run(struct dg_http_client *c, const char *id, const struct dg_task_run *run,
			   struct dg_task_run_result *out, bool *lost, struct dg_err *err);
void dg_task_run_result_deinit(struct dg_task_run_result *r);

/* PUT /v1/steps/S/tensors/KEY: t, raw with its Dg-Dtype and Dg-Shape. */
enum dg_status dg_task_tensor_put(struct dg_http_client *c, uint64_t step, const char *key,
				  const struct dg_tensor *t, bool *lost, struct dg_err *err);
/* GET /v1/steps/S/tensors/KEY?timeout_ms=T: take the tensor (owned). */
enum dg_status dg_task_tensor_take(struct dg_http_client *c, uint64_t step, const char *key,
				   int64_t timeout_ms, struct dg_tensor **out, struct dg_err *err);
/* DELETE /v1/steps/S[?count=K]&reason=R: abort steps S..S+K-1 there; the
 * reason is percent-encoded and cut to fit a request line. */
enum dg_status dg_task_abort(struct dg_http_client *c, uint64_t step, int64_t count,
			     const char *reason, struct dg_err *err);
/* GET /v1/health: does the task answer? *out (out may be NULL) gets the
 * reply (owned). */
enum dg_status dg_task_health(struct dg_http_client *c, json_t **out, struct dg_err *err);

#endif
