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
 * reset: no HTTP answer, or a 2xx answer cut short), or the task answered
 * 404 for the fragment it was
 * asked to run (a restarted task lost its fragments). A node's own error
 * comes as an HTTP answer, and a request that timed out may be a step that
 * is merely slow: neither is a lost task. */
#ifndef DG_TASK_CLIENT_H
#define DG_TASK_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "dg/buf.h"
#include "dg/http.h"
#include "dg/tensor.h"

#define DG_FRAGMENT_ID_MAX 24           /* bytes of a fragment id, with the NUL */

/* POST /v1/fragments with the fragment doc (doc/graph-format.md); id
 * receives the id the task gave it (DG_FRAGMENT_ID_MAX bytes). owner (may be
 * NULL: no lease) and lease_ms: the task forgets the fragment unless owner
 * renews it (a run, or dg_task_fragments_renew) within lease_ms. */
enum dg_status dg_task_fragment_add(struct dg_http_client *c, const json_t *doc, char *id,
				    bool *lost, const char *owner, int64_t lease_ms,
				    struct dg_err *err);
/* POST /v1/fragments/renew?owner=O: *renewed (may be NULL) gets how many. */
enum dg_status dg_task_fragments_renew(struct dg_http_client *c, const char *owner,
				       int64_t *renewed, struct dg_err *err);
/* DELETE /v1/fragments/ID. */
enum dg_status dg_task_fragment_remove(struct dg_http_client *c, const char *id,
				       struct dg_err *err);

/* A step tensor that a one-step run carries back to the task that asked for
 * it, in the run's reply instead of as a PUT of its own: the value of a
 * _Send to the requester that is its fragment's last work (doc/http-api.md,
 * "Carried tensors"). */
struct dg_task_carried {
	char *key;                      /* owned: its rendezvous key there */
	struct dg_tensor *t;            /* owned */
};
/* Free c[0..n) and c itself; NULL is fine. */
void dg_task_carried_free(struct dg_task_carried *c, int n);

/* POST /v1/fragments/ID/run. */
struct dg_task_run {
	uint64_t step;                  /* the first step id */
	int64_t steps;                  /* 1 = one step */
	int64_t train_step;             /* training step of the first step; < 0: a plain
					 * run (kernels see the step id) */
	int64_t timeout_ms;             /* per step (_Recv deadline) */
	const char *const *collect;     /* keys taken after each step (borrowed) */
	int n_collect;
	const char *from;               /* the requester's address, as the fragment's
					 * _Sends name it (borrowed; NULL: not said): a
					 * one-step run may carry tensors back to it */
};
struct dg_task_run_result {
	int64_t steps_done;
	double *values;                 /* owned: steps_done x n_collect, NAN for null */
	int64_t stale;                  /* sync applies dropped by the ps, summed */
	bool input_end;                 /* the run stopped early, cleanly, at the end of
					 * its input queue (steps_done steps ran) */
};
/* Run the fragment; out may be NULL (a plain one-step run collects nothing:
 * its reply is then read only when it carries tensors). out is filled on
 * success; release it with dg_task_run_result_deinit. *carried (owned,
 * dg_task_carried_free; carried may be NULL: they are dropped) gets the
 * tensors the reply carried back, *n_carried their count (0 and NULL when
 * none or on failure). */
enum dg_status dg_task_run(struct dg_http_client *c, const char *id, const struct dg_task_run *run,
			   struct dg_task_run_result *out, struct dg_task_carried **carried,
			   int *n_carried, bool *lost, struct dg_err *err);
void dg_task_run_result_deinit(struct dg_task_run_result *r);

/* The run reply's carried tensors as the worker's run route writes them and
 * dg_task_run reads them, here so that the format lives in one file. A reply
 * that carries any has this Content-Type: its JSON object on one line, with
 * "tensors": [{"key", "dtype", "shape", "bytes"}] (dtype and shape spelt as
 * Dg-Dtype and Dg-Shape), then "\n", then their raw bytes back to back in
 * that order. A reply that carries none is application/json as before. */
#define DG_TASK_RUN_MIME "application/x-dg-run"
/* Append ,"tensors":[...] describing c[0..n) to a JSON object being written. */
enum dg_status dg_task_carried_json(struct dg_buf *out, const struct dg_task_carried *c, int n,
				    struct dg_err *err);
/* Append the bytes of c[0..n), after the JSON's closing "}\n". */
enum dg_status dg_task_carried_data(struct dg_buf *out, const struct dg_task_carried *c, int n,
				    struct dg_err *err);

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
