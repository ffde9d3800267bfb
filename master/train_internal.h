/* What the training plan's files share (train.c, train_devices.c). Internal
 * to master/. */
#ifndef MASTER_TRAIN_INTERNAL_H
#define MASTER_TRAIN_INTERNAL_H

#include <jansson.h>

#include "dg/cluster.h"
#include "dg/graph.h"
#include "dg/train.h"

/* The compute tasks in replica groups (doc/training.md, "Devices and replica
 * groups"): replica r owns compute tasks r*group .. r*group+group-1. */
struct train_layout {
	int n_compute;
	int *compute;            /* owned: cluster task index of each compute task */
	int group;               /* tasks per replica */
	int replicas;
};

/* The layout for g under s on c: the group from training.replica_group, else
 * 1 + the highest compute task a node's device names; the replicas from
 * training.replicas, else as many groups as the compute tasks make. Errors
 * (DG_EINVAL) for a node outside the group, a group larger than the compute
 * tasks or not dividing them, more replicas than fit. On error *L still
 * needs train_layout_deinit. */
enum dg_status train_layout_build(const struct dg_graph *g, const struct train_spec *s,
				  const struct dg_cluster *c, struct train_layout *L,
				  struct dg_err *err);
void train_layout_deinit(struct train_layout *L);
/* The compute tasks of c into L (its group and replicas left 0) and *span =
 * 1 + the highest compute task a node's device in g names (1 if none). */
enum dg_status train_layout_span(const struct dg_graph *g, const struct dg_cluster *c,
				 struct train_layout *L, int *span, struct dg_err *err);
/* Cluster task index of compute task k of replica r's group. */
int train_layout_task(const struct train_layout *L, int r, int k);

/* Give every node of doc's "nodes" (but Variables, ApplyGradient and the
 * names in skip, an object; NULL = none) its device in replica r: a device
 * naming compute task k of the cluster moves to task k of r's group; a node
 * without a job, or with only the replica's job, goes to the group's first
 * task ("replica default"); a /gpu:K or /cpu:0 segment is kept; a device
 * naming a ps task, another job or a task the cluster lacks is left for
 * placement to honour or refuse. reasons (an object, may be NULL) gets
 * name -> "replica default" | "colocated" (a grad/ node following its
 * forward op) for place_opts.reasons. */
enum dg_status train_pin(json_t *doc, const struct train_layout *L, const struct dg_cluster *c,
			 int r, const json_t *skip, json_t *reasons, struct dg_err *err);

/* In-graph replication ("towers": K, doc/training.md): the graph with K
 * towers and the refs that replace the spec's loss and metrics. */
struct train_towers {
	json_t *doc;             /* owned: the towers' graph document */
	json_t *reasons;         /* owned: tower node -> "replica default" (no device given) */
	char *loss;              /* owned: "_train/loss", the towers' mean (or sum) */
	char **metrics;          /* owned: "_train/metric_i", the towers' means */
	int n_metrics;
};

/* The towers of g (validated, user names) for s->towers >= 2 on c: tower k's
 * copy of a node on compute task k*span + p for a device naming position p
 * of a tower's span (k*span with no device), Variables shared, ShardBatch
 * shard k (of K; the plan makes it r*K + k of R*K). Errors: more towers than
 * the compute tasks hold (DG_EINVAL). On error *out is empty. */
enum dg_status train_towers_build(const struct dg_graph *g, const struct train_spec *s,
				  const struct dg_cluster *c, struct train_towers *out,
				  struct dg_err *err);
/* The M = s->microbatches >= 2 micro-batch copies of g (same devices, copy m
 * reading rows m*b/M.. of each ShardBatch's batch b, one data pipeline
 * shared), the loss and metrics their means, in the same struct. Errors
 * (DG_EINVAL): M does not divide a batch, no ShardBatch, a batch of unknown
 * rank. On error *out is empty. */
enum dg_status train_micro_build(const struct dg_graph *g, const struct train_spec *s,
				 struct train_towers *out, struct dg_err *err);
void train_towers_deinit(struct train_towers *t);

/* Queue-fed input (train_input.c). train_input_plan: when the loss reads a
 * QueueDequeueMany (need: the nodes the loss needs), fill the plan's queue
 * fields, the batch and the epoch; errors (DG_EINVAL) for two dequeues, a
 * ShardBatch beside one, epochs without a feeder of known size, two feeders;
 * DG_EUNSUPPORTED with towers or micro-batches. Does nothing without one.
 * train_input_replica: replica r's dequeue leased (holder "rR", the batch of
 * the spec) and a "_train/queue_ack" QueueAck after its applies, its two
 * outputs appended to rep->fetch (room for them is the caller's). */
/* DG_EUNSUPPORTED when s asks for towers or micro-batches of a graph that
 * reads a queue (checked before the copies are made). */
enum dg_status train_input_copies(const struct dg_graph *g, const struct train_spec *s,
				  struct dg_err *err);
enum dg_status train_input_plan(const struct dg_graph *g, const bool *need,
				const struct train_spec *s, int R, struct train_plan *out,
				struct dg_err *err);
enum dg_status train_input_replica(const struct train_spec *s, const struct train_plan *p,
				   int r, struct train_replica *rep, struct dg_err *err);

#endif
