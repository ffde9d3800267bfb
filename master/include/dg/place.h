/* Placement and partitioning for the master: pure functions from a validated
 * graph and a cluster spec to one task per node, then to one fragment (a graph
 * document in the format of doc/graph-format.md) per task, with _Send/_Recv
 * pairs on crossing edges, VarRead/VarInit for variables, feed and fetch keys.
 * No I/O: the master (master.c, jobs.c) ships what these functions build. */
#ifndef DG_PLACE_H
#define DG_PLACE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "dg/cluster.h"
#include "dg/graph.h"

/* The user-level op "Variable" (attrs var, dtype, shape, init, scale, seed):
 * a tensor held by a ps task. Only the master knows it; fragments carry
 * VarInit/VarRead instead. */
const struct dg_op_def *place_variable_op(void);
/* The master-level op "ApplyGradient" (one input: the gradient; attrs
 * variable = the Variable node's name, rule, lr, momentum, nesterov, beta1,
 * beta2, eps, schedule, every, factor, sync, replicas, backup, replica;
 * output: int64 scalar, the variable's new version). Placed with its gradient;
 * partitioning turns it into a VarApply on the Variable's ps (doc/training.md). */
const struct dg_op_def *place_apply_gradient_op(void);
/* Add the master's ops (Variable, ApplyGradient) to the one op registry
 * (dg_op_register, layer master); once, thread-safe. */
void master_ops_register(void);
/* The lookup the master parses submitted graphs with: the kernel and master
 * ops of the registry (registering the master's first). Thread-safe. */
const struct dg_op_def *master_op_find(const char *name);
/* Before a submitted graph document is parsed: give every queue op node
 * (QueueDequeueMany, ...) the "components" and "ids" of the Queue node its
 * attr "queue" names (changed in place). DG_EINVAL naming the node when it
 * names no Queue or its own components differ. */
enum dg_status master_queue_expand(json_t *graph, struct dg_err *err);
bool master_graph_has_queue_ops(const json_t *graph);

enum place_vars {
	PLACE_VARS_BYTES = 0,        /* fewest bytes first (VariableDeviceChooser), the default */
	PLACE_VARS_ROUND_ROBIN,
};

struct place_opts {
	bool soft_placement;         /* gpu on a task without one: CPU instead of an error */
	enum place_vars vars;
	const int64_t *task_bytes;   /* per cluster task: bytes it holds now; NULL = all 0 */
	const bool *task_gpu;        /* per cluster task: has a GPU; NULL = none has */
	const json_t *existing;      /* object: ps var name -> cluster task index (integer) of
				      * the task already holding it; such a Variable is placed
				      * there whatever its device says. NULL = none */
	const json_t *reasons;       /* object: node name -> "replica default" | "colocated":
				      * why a node's device was filled in by the training plan
				      * (shown instead of "explicit"). NULL = none */
	const json_t *colocate;      /* object: node name -> name of the node whose task it
				      * runs on (placed earlier: a Variable, or an input),
				      * unless its own device names a task. NULL = none */
};

struct placement {
	int n_nodes;
	int *task;                   /* owned; per node: index into cluster->tasks */
	const char **why;            /* owned array of static strings: "explicit", "cost",
				      * "gpu" (a compute-heavy node sent to a GPU), "gpu-colocated"
				      * (a neighbour following its inputs onto the GPU), ... */
	bool *soft;                  /* owned; per node: asked for a GPU, moved to the CPU */
	int *gpu;                    /* owned; per node: the GPU index of its task it runs on,
				      * -1 = the CPU */
};

/* A node whose estimated work (element operations: elements read or written,
 * times the inner dimension for MatMul/BatchMatMul/Conv2D) reaches this goes
 * to a GPU when a task it may run on has one and its device names neither
 * /cpu nor /gpu (doc/graph-execution.md, Placement). */
#define PLACE_GPU_MIN_WORK ((double)(1 << 22))

/* Place every node of g (borrowed) on a task of c. Rules (doc/graph-execution.md):
 * explicit devices first, partial specs filled in, Variables on the ps tasks,
 * the rest by a cost model with colocation; compute-heavy nodes without a device
 * type go to a GPU of a task that has one (opts->task_gpu), and their neighbours
 * follow them there where that saves host<->device copies (out->gpu). On DG_OK
 * *out is filled (release with
 * placement_deinit). Errors name the node and its device: DG_EINVAL for a job or
 * task the cluster lacks or a malformed device; DG_EUNSUPPORTED for a GPU no task
 * has (unless opts->soft_placement). Thread-safe (no shared state). */
enum dg_status place_graph(const struct dg_graph *g, const struct dg_cluster *c,
			   const struct place_opts *opts, struct placement *out,
			   struct dg_err *err);
void placement_deinit(struct placement *p);

struct place_fragment {
	int task;                    /* index into cluster->tasks */
	json_t *doc;                 /* owned: {"version":1,"nodes":[...]} */
	int n_nodes;
};

struct place_feed {
	char *ref;                   /* owned, as given ("x" or "x:0") */
	int task;                    /* task whose rendezvous gets it; -1: no fetch needs it */
	char *key;                   /* owned: "feed:<node>" */
};

struct partition {
	int n_frags;
	struct place_fragment *frags;   /* owned; the step fragments, by task index */
	int n_init;
	struct place_fragment *init;    /* owned; VarInit fragments, run once before step 1 */
	int n_feeds;
	struct place_feed *feeds;       /* owned; in the order given */
	int n_fetch;
	char **fetch_keys;              /* owned; "fetch:<ref>", delivered to master_task */
};

/* Cut g into fragments following p. Only nodes the fetches need are kept.
 * feeds/fetch are refs "node" or "node:k" (fetch NULL/0 = the graph's fetch
 * list); a fed node becomes a _Recv of "feed:<node>" on its task; every
 * fetched value gets a _Send of "fetch:<ref>" to master_task; every tensor that
 * crosses tasks is sent once per destination task ("<node>:<k>-><job>/<index>")
 * however many consumers read it there. Errors: DG_ENOTFOUND / DG_EINVAL for
 * bad refs, a needed Placeholder not fed, a fed node with several outputs.
 * On DG_OK *out is owned by the caller (partition_deinit). */
enum dg_status place_partition(const struct dg_graph *g, const struct dg_cluster *c,
			       const struct placement *p, int master_task,
			       const char *const *feeds, int n_feeds,
			       const char *const *fetch, int n_fetch,
			       struct partition *out, struct dg_err *err);

struct partition_opts {
	int master_task;             /* receives the fetches (unless fetch_local) */
	const char *const *feeds;    /* as place_partition */
	int n_feeds;
	const char *const *fetch;    /* NULL/0: the graph's fetch list, unless n_targets > 0 */
	int n_fetch;
	const char *const *targets;  /* nodes to run without fetching them (ApplyGradient) */
	int n_targets;
	bool fetch_local;            /* a fetched value's _Send goes to the producing task's
				      * own address (key "fetch:<ref>"), so that task's worker
				      * collects it; a fetched Variable is read on master_task */
};

/* place_partition with targets and local fetches. Targets are node names
 * (refs to output 0 allowed); they and what they need are kept, nothing is
 * sent for them. An ApplyGradient becomes a VarApply (var and ps from its
 * Variable's placement, the other attrs copied) and keeps its Variable's
 * VarInit. With targets, an empty fetch list means no fetches. Errors as
 * place_partition, plus DG_ENOTFOUND for an unknown target and DG_EINVAL for
 * an ApplyGradient whose "variable" is not a Variable node of g. */
enum dg_status place_partition_ex(const struct dg_graph *g, const struct dg_cluster *c,
				  const struct placement *p, const struct partition_opts *o,
				  struct partition *out, struct dg_err *err);
void partition_deinit(struct partition *part);

/* The job and task a device string names: *job points into buf (a copy of
 * dev, n bytes) or is NULL when none is named, *task is -1 when none is.
 * false: dev is not a device name (or does not fit in buf). */
bool place_device_task(const char *dev, char *buf, size_t n, const char **job, int *task);

/* The device string of task t: "/job:worker/task:1". Writes into buf. */
void place_device_name(const struct dg_cluster *c, int t, char *buf, size_t n);
/* The device of node n under p: its task's name, plus "/gpu:K" when p puts it
 * on a GPU ("/job:worker/task:0/gpu:0"). Writes into buf. */
void place_node_device(const struct dg_cluster *c, const struct placement *p, int n,
		       char *buf, size_t len);
/* Human-readable placement (node -> device, with why) and fragments (nodes,
 * sends, recvs). Owned string (free()) or NULL on out of memory. */
char *place_explain(const struct dg_graph *g, const struct dg_cluster *c,
		    const struct placement *p, const struct partition *part);

#endif
