/* Private to the worker face: which worker op a node is (ops.c), and the route
 * table of the worker group (routes.c, handlers get the struct worker). */
#ifndef WORKER_INTERNAL_H
#define WORKER_INTERNAL_H

#include "dg/client.h"
#include "dg/clock.h"
#include "dg/executor.h"

enum worker_opkind {
	WOP_NONE = 0,      /* a registry op: run its kernel */
	WOP_SEND,
	WOP_RECV,
	WOP_VAR_READ,
	WOP_VAR_APPLY,
	WOP_VAR_INIT,
	WOP_VAR_GATHER,
	WOP_QUEUE_DEQUEUE,       /* queue_ops.c, in the order of its table */
	WOP_QUEUE_ENQUEUE,
	WOP_QUEUE_ACK,
	WOP_QUEUE_CLOSE,
	WOP_QUEUE_SIZE,
};

/* The kind of op, by identity with the definitions of ops.c and queue_ops.c. */
enum worker_opkind worker_op_kind(const struct dg_op_def *op);

/* "host:port" with a port in 1..65535, else DG_EINVAL naming attr what. */
enum dg_status worker_check_address(const char *what, const char *addr, struct dg_err *err);

/* The queue ops (queue_ops.c): registered for the worker and master layers. */
void worker_queue_ops_register(void);
enum worker_opkind worker_queue_op_kind(const struct dg_op_def *op);
/* A node's "components" (and "ids") as a queue spec (capacity 1). */
enum dg_status worker_queue_components(const json_t *attrs, struct dg_queue_spec *spec,
				       struct dg_err *err);

/* One run of a queue op by the executor. */
struct worker_queue_call {
	struct dg_client *client;       /* kept-alive client of the queue's ps */
	const char *ps;                 /* its address, and the token, for more */
	const char *token;              /*   connections (the feeder's threads) */
	const char *queue;
	struct dg_attrs attrs;          /* the node's (json set) */
	const struct dg_tensor *const *ins;
	int n_in;
	struct dg_tensor **outs;        /* n_out, NULL: filled on success */
	int n_out;
	struct dg_deadline deadline;    /* the step's */
	/* DG_OK while the step may go on (not aborted, the task not stopping). */
	enum dg_status (*check)(void *ud, struct dg_err *err);
	void *ud;
	bool *end;                      /* set by a dequeue that found the queue at its end */
	/* QueueAck: when defer is set and the lease's examples are known
	 * (lease_examples >= 0), the ack is handed to defer (which sends it after
	 * the step, before the run replies) and the outputs say what it will do. */
	void (*defer)(void *ud, const char *ps, const char *queue, uint64_t lease,
		      enum dg_lease_end how);
	int64_t lease_examples;
	/* The enqueue of this task's own queue, in-process (NULL: over HTTP). */
	worker_local_enqueue_fn local_enqueue;
	void *local_ud;
};
enum dg_status worker_queue_run(enum worker_opkind kind, const struct worker_queue_call *q,
				struct dg_err *err);

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
