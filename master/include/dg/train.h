/* Distributed training, the master's side (doc/training.md): the "training"
 * section of a graph document parsed into a train_spec, and the pure graph
 * transformation that turns a forward graph into one replica graph per compute
 * task (forward + backward + one ApplyGradient per trained Variable), plus the
 * step counts the training loop (jobs.c) needs. No I/O. */
#ifndef DG_TRAIN_H
#define DG_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "dg/cluster.h"
#include "dg/graph.h"

struct train_spec {
	char *loss; char **metrics; int n_metrics;          /* refs */
	char rule[16]; double lr, momentum, beta1, beta2, eps, rho, init; bool nesterov;
	char schedule[16]; int64_t every; double factor;   /* "constant" | "step" | "exponential" */
	int64_t epochs, steps;                              /* as given (0 = not given) */
	int64_t batch;                                      /* 0 = as in the graph */
	int replicas;                                       /* 0 = as many as fit */
	int replica_group;                                  /* compute tasks per replica;
							     * 0 = from the devices */
	int towers;                                         /* in-graph copies; 0/1 = none */
	bool tower_sum;                                     /* "aggregate": "sum" */
	int microbatches;                                   /* per step; 0/1 = none */
	bool sync; int backup;
	double checkpoint_secs;
	char **eval_fetch; int n_eval_fetch; int64_t eval_every_epochs, eval_every_steps;
	bool eval_barrier;                                  /* async: replicas wait at evals */
	bool reinit;
};

/* Parse the "training" object (borrowed) of a graph document or job into *out
 * (zeroed first; release with train_spec_deinit, also after an error). Fills
 * the documented defaults (adam: lr 0.001, beta1 0.9, beta2 0.999, eps 1e-8;
 * schedule "constant", every 1, factor 1; mode async). Errors are DG_EINVAL
 * naming the key ("training.optimizer.lr must be > 0, got -1"): unknown keys at
 * any level, wrong JSON kinds, both or neither of epochs/steps, values out of
 * range, momentum without "momentum", backup outside sync. err may be NULL. */
enum dg_status train_spec_parse(const json_t *training, struct train_spec *out, struct dg_err *err);
void train_spec_deinit(struct train_spec *s);   /* NULL is fine; zeroes *s */

struct train_replica {
	json_t *doc;              /* owned: the replica's graph document: forward + backward +
	                           * ApplyGradient nodes; every non-Variable node has
	                           * device = that replica's task */
	char **targets; int n_targets;   /* owned: the ApplyGradient node names */
	char **fetch; int n_fetch;       /* owned: loss then metrics refs (collected per step) */
	json_t *colocate;                /* owned object or NULL: node -> the Variable it runs
	                                  * with (the towers' gradient sums), for
	                                  * place_opts.colocate */
	json_t *reasons;                 /* owned object: node -> why the plan put it where
	                                  * it is ("replica default", "colocated"), for
	                                  * place_opts.reasons */
};

struct train_plan {
	int n_replicas;
	int group;                /* compute tasks per replica (its group) */
	int *replica_task;        /* owned: cluster task index of each replica's first task */
	int *group_task;          /* owned: n_replicas x group cluster task indices */
	struct train_replica *rep;/* owned, n_replicas */
	int64_t steps_per_epoch;  /* 0 when the graph has no ShardBatch (then "epochs" is
	                           * an error); queue-fed: ceil(examples per epoch /
	                           * (batch x replicas)), the mean replica's share */
	int64_t steps;            /* per replica, total (queue-fed with epochs: the mean
	                           * replica's, a guide: replicas run to the queue's end) */
	int64_t examples_per_step;/* the batch of one replica (0 if unknown) */
	json_t *eval_doc;         /* owned or NULL: graph for the eval fetches (on replica
	                           * 0's task) */
	char **var_nodes; int n_vars;    /* owned: Variable node names trained */
	/* Queue-fed input (doc/training.md, "The input pipeline"): the loss reads a
	 * QueueDequeueMany instead of a ShardBatch. */
	char *queue;              /* owned: its Queue node, or NULL (sharded input) */
	char *dequeue;            /* owned: the QueueDequeueMany node */
	char *feeder;             /* owned: the QueueEnqueueMany that feeds it, or NULL
	                           * (the queue is fed from outside: dg feed) */
	json_t *feed_doc;         /* owned or NULL: the graph the feeder runs, fetching
	                           * nothing, its target the feeder */
	int64_t examples_per_epoch; /* what the feeder enqueues per epoch (0: unknown) */
	int n_extra;              /* values each step collects after the loss and
	                           * metrics: 3 with a queue (examples applied,
	                           * requeued, the lease) */
};

/* g: the validated user graph (parsed with master_op_find); c: the cluster.
 * Builds the replica graphs of doc/training.md ("Replication", "Devices and
 * replica groups"): the compute tasks (tasks not in job "ps", cluster order)
 * make groups of `group`; replica r runs replica 0's layout (the graph's own
 * devices) shifted by r groups, a node without a device on its group's first
 * task (a /gpu:K or /cpu:0 segment of a device is kept); each ShardBatch gets
 * shard = r, num_shards = R (and batch when s->batch); autodiff of s->loss
 * w.r.t. every float Variable it depends on, then "_train/apply/<var node>"
 * ApplyGradient nodes. Each replica doc is checked with dg_graph_from_json
 * (master_op_find) and has "fetch" = loss then metrics. eval_doc (when
 * s->n_eval_fetch) is the forward graph laid out as replica 0 with "fetch" =
 * the eval refs. Errors (DG_EINVAL / DG_ENOTFOUND / DG_EDTYPE /
 * DG_EUNSUPPORTED) name the training key or node: unknown loss/metric/eval
 * ref, a loss that reaches no float Variable, more replicas than fit, a
 * group that does not divide the compute tasks, a node outside its group,
 * backup >= replicas, epochs without a ShardBatch of known size, a
 * shard smaller than one batch. On DG_OK *out is owned (train_plan_deinit);
 * on error *out is empty. All arguments borrowed. err may be NULL. */
enum dg_status train_plan_build(const struct dg_graph *g, const struct train_spec *s,
				const struct dg_cluster *c, struct train_plan *out,
				struct dg_err *err);
void train_plan_deinit(struct train_plan *p);   /* NULL is fine; zeroes *p */

/* The compute tasks of c (not job "ps"), in cluster order: fills idx (room for
 * c->n_tasks) and returns their count. */
int train_compute_tasks(const struct dg_cluster *c, int *idx);

/* The learning rate at training step t (0-based) under s's schedule:
 * constant lr; step lr * factor^floor(t/every); exponential lr * factor^(t/every). */
double train_lr_at(const struct train_spec *s, int64_t t);

#endif
