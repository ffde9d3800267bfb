/* Shared by the files of master/: the master struct, the job functions the
 * routes call (master.c), and what the job files share: the job, replica and
 * training structs and the functions one file of them calls in another.
 * Not a public header. */
#ifndef MASTER_INTERNAL_H
#define MASTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>

#include "dg/buf.h"
#include "dg/master.h"
#include "dg/place.h"
#include "dg/train.h"
#include "pool.h"
#include "task.h"

struct job;

struct master {
	const struct dg_cluster *cluster;   /* borrowed */
	char *job;                          /* owned: this task's job */
	int task;                           /* index within the job */
	char *token;                        /* owned; NULL = none */
	bool soft_placement;
	struct worker *w;                   /* borrowed */
	struct mtask **tasks;               /* owned: per cluster task, its interface */
	struct dg_route_group group;
	pthread_mutex_t mu;                 /* guards jobs[], every job's mutable fields */
	pthread_cond_t cv;                  /* broadcast on any job event */
	struct job **jobs;                  /* owned array of MASTER_MAX_JOBS slots */
	int n_jobs;
	uint64_t next_job;
	uint64_t step_base;                 /* random high bits of this master's step ids */
	atomic_uint_fast64_t step_counter;
	bool closing;
	int n_threads;                      /* job threads running (detached) */
	/* The lease of fragments on other tasks, renewed by a thread of its own
	 * every lease_ms / 4 (doc/faults.md: a dead master leaves nothing). */
	struct mtask_lease lease;
	pthread_mutex_t ren_mu;
	pthread_cond_t ren_cv;
	bool ren_quit, ren_started;
	pthread_t renewer;
};

/* This task's index in cluster->tasks, or -1. */
int master_self(const struct master *m);
/* The task at address peer (a struct dg_err's peer: the server a failed
 * request could not reach), or -1. */
int master_task_at(const struct master *m, const char *peer);

/* Create a job from a POST /v1/jobs body (borrowed): parse, place and
 * partition; start it unless the body says "start": false. *id receives the
 * job id (at least 16 bytes). Errors: DG_EINVAL and friends naming the node,
 * feed or fetch; DG_EUNAVAILABLE naming the address of a task that does not
 * answer. Thread-safe. */
enum dg_status master_job_submit(struct master *m, const json_t *body, char *id, size_t id_len,
				 struct dg_err *err);
/* Upload feed name of a created job (takes ownership of t, also on error). */
enum dg_status master_job_feed(struct master *m, const char *id, const char *name,
			       struct dg_tensor *t, struct dg_err *err);
/* Start a created job: health of its tasks, fragment registration, then the
 * steps in a thread of the job's own. */
enum dg_status master_job_start(struct master *m, const char *id, struct dg_err *err);
/* Status JSON (owned) or NULL with DG_ENOTFOUND. */
json_t *master_job_status(struct master *m, const char *id, bool full, struct dg_err *err);
/* All jobs' short status (owned). */
json_t *master_job_list(struct master *m);
/* Events from index from on (JSON lines appended to out), waiting up to
 * timeout_ms for one when there is none and the job is not over. *next gets
 * the index to ask from next time; *over whether the job has finished. */
enum dg_status master_job_events(struct master *m, const char *id, int64_t from,
				 int64_t timeout_ms, struct dg_buf *out, int64_t *next, bool *over,
				 struct dg_err *err);
/* A clone (owned) of fetched value name from the job's last step. */
enum dg_status master_job_result(struct master *m, const char *id, const char *name,
				 struct dg_tensor **out, struct dg_err *err);
/* The metrics CSV of a training job (doc/http-api.md, "Jobs") appended to
 * out. DG_ENOTFOUND for an unknown job or one without "training". */
enum dg_status master_job_metrics(struct master *m, const char *id, struct dg_buf *out,
				  struct dg_err *err);
/* The per-step ledger CSV of a queue-fed training job (doc/http-api.md,
 * "Jobs") appended to out. DG_ENOTFOUND for an unknown job or another kind. */
enum dg_status master_job_steps(struct master *m, const char *id, struct dg_buf *out,
				struct dg_err *err);
/* Cancel: abort the running step on every task. DG_ENOTFOUND. */
enum dg_status master_job_cancel(struct master *m, const char *id, struct dg_err *err);
/* Join and free every job (master_free). */
void master_jobs_free(struct master *m);

/* ------------------------------------------------ the master's ops (ops.c) */

/* Whether node n is a Variable / an update of one on its ps (ApplyGradient,
 * AssignMovingAverage, Assign, AssignAdd); the ps rule of such an update
 * other than ApplyGradient (whose attr carries it), else NULL. */
bool master_is_variable(const struct dg_node *n);
bool master_is_apply(const struct dg_node *n);
const char *master_apply_rule(const struct dg_node *n);
/* The Minimize op (minimize.c); whether g has one; g replaced by itself with
 * each Minimize lowered to its loss's gradient, an ApplyGradient per trained
 * Variable and the Concat of their new versions (jobs of plain steps). */
const struct dg_op_def *master_minimize_op(void);
bool master_has_minimize(const struct dg_graph *g);
enum dg_status master_lower_minimize(struct dg_graph **g, struct dg_err *err);
/* The Variable node the ApplyGradient node n updates, or -1 with *err set. */
int master_apply_target(const struct dg_graph *g, int n, struct dg_err *err);
/* ApplyGradient node n's gradient has its Variable's dtype and known shape. */
enum dg_status master_check_apply(const struct dg_graph *g, int n, struct dg_err *err);

/* ------------------------------------------------ queues (queue.c) */

const struct dg_op_def *master_queue_op(void);
/* A Queue node (held by a ps task, like a Variable); a node of a queue op
 * (QueueDequeueMany, QueueEnqueueMany, QueueAck, QueueClose, QueueSize). */
bool master_is_queue(const struct dg_node *n);
bool master_is_queue_op(const struct dg_node *n);
/* What exists on the ps tasks that answered the health probe (reach[t] ==
 * DG_OK): variable name -> cluster task index, and "queue:NAME" -> task for
 * queues (place_opts.existing). Owned; NULL when out of memory. */
json_t *master_probe_existing(struct master *m, const enum dg_status *reach);
/* A Queue node's queue's name on its ps: attr shared_name, else its name. */
const char *master_queue_ps_name(const struct dg_node *qn);
/* The Queue node that queue op n names in attr "queue", or -1. */
int master_queue_of(const struct dg_graph *g, int n);
/* The bytes a Queue node's queue holds when full (placement by bytes). */
int64_t master_queue_bytes(const struct dg_node *n);
/* master_queue_expand and master_graph_has_queue_ops: dg/place.h. */
/* Create Queue node qn's queue on cluster task `task` (fresh: delete what is
 * there first). */
enum dg_status master_queue_create(struct master *m, const struct dg_node *qn, int task,
				   bool fresh, struct dg_err *err);

/* The update rule's attrs, shared by ApplyGradient (ops.c) and Minimize
 * (minimize.c), whose inference is ApplyGradient's. */
#define MASTER_RULE_ATTRS \
	{ "rule", DG_ATTR_STRING, true, "sgd, momentum, adam, adagrad or rmsprop" }, \
	{ "lr", DG_ATTR_FLOAT, false, "learning rate (> 0)" }, \
	{ "momentum", DG_ATTR_FLOAT, false, "momentum (rules momentum, rmsprop)" }, \
	{ "nesterov", DG_ATTR_BOOL, false, "Nesterov momentum" }, \
	{ "beta1", DG_ATTR_FLOAT, false, "adam beta1" }, \
	{ "beta2", DG_ATTR_FLOAT, false, "adam beta2" }, \
	{ "eps", DG_ATTR_FLOAT, false, "adam/rmsprop epsilon" }, \
	{ "rho", DG_ATTR_FLOAT, false, "rmsprop decay" }, \
	{ "init", DG_ATTR_FLOAT, false, "adagrad/rmsprop accumulator start" }

/* ------------------------------------------------ jobs (job.c and the files it names) */

enum job_state { JOB_CREATED, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELED };
extern const char *const job_state_names[];

#define JOB_MAX_EVENTS 4096        /* step events are thinned beyond this */
#define JOB_EXPLAIN_MAX_NODES 10000  /* larger graphs get a per-task summary */
#define JOB_TRAIN_EVENT_MS 500     /* at most one train event this often (and per epoch) */
#define JOB_CHUNK_MS 100           /* a replica's chunk of steps aims at this long */
#define JOB_TRAIN_POLL_MS 200      /* the training coordinator looks around this often */
#define JOB_RETRY_MS 30000         /* default "retry_ms": wait this long for a lost task */
#define JOB_MAX_RETRY_MS 3600000
#define JOB_MAX_RETRIES 3          /* re-runs of one step (or a replica's chunk) at most */
#define JOB_HEALTH_POLL_MS 50      /* a lost task's health is asked this often */
#define JOB_HEALTH_TIMEOUT_MS 1000 /* per health request while waiting for it */

struct job {
	struct master *m;              /* borrowed */
	struct train *tr;              /* owned; NULL for a job without "training" */
	char id[16];
	int refs;                      /* guarded by m->mu, like every field below that changes */
	enum job_state state;
	int64_t steps, steps_done;
	int64_t timeout_ms;            /* _Recv deadline of each run */
	int64_t retry_ms;              /* wait for a lost task this long; 0 = fail at once */
	struct dg_graph *g;
	struct placement pl;
	struct partition part;
	char *explain;                 /* owned */
	struct dg_tensor **feeds;      /* per part.feeds entry; NULL until given */
	struct dg_tensor **results;    /* per fetch: the last step's values */
	struct dg_err err;             /* why the job failed */
	char **events;                 /* owned JSON lines */
	int n_events, cap_events;
	bool cancel;
	uint64_t cur_step;             /* 0 between steps */
	char (*frag_id)[24];           /* per part.frags: id on its task, "" = not registered */
	char (*init_id)[24];           /* per part.init */
	struct mtask_conn **conns;     /* per part.frags: used only by that fragment's runner */
	struct mpool *pool;            /* owned: runner threads of its steps; NULL until used */
	double t_created, t_started, t_finished, step_ms_sum, step_ms_last;   /* ms */
	uint64_t *task_epoch;          /* owned, per cluster task: its epoch at submit, then
					* at its last recovery (a newer one: it restarted) */
	json_t *recovered;             /* owned, may be NULL: "task@epoch" keys of the
					* "recovered" events sent (one per restart) */
};

#define REP_MARKS 1024            /* chunk ends a replica remembers (~50 s of chunks) */

/* One replica of a training job (doc/training.md, "Replication"): its graph
 * placed and cut into one step fragment on its compute task, run in chunks of
 * steps by a thread of its own (train_replica_main). */
/* One step fragment of a replica (a replica spans the tasks of its group). */
struct rep_frag {
	char id[24];                   /* "" = not registered */
	struct mtask_conn *conn;       /* used only by the replica's thread */
	const char **collect;          /* owned array of borrowed part.fetch_keys: the loss
					* and metrics this fragment's task produces */
	int *collect_idx;              /* owned: their indices in train.collect */
	int n_collect;
};

struct replica {
	int task;                      /* cluster task index of its group's first task */
	struct dg_graph *g;
	struct placement pl;
	struct partition part;         /* frags: its step fragments, one per task;
					* init: VarInit */
	struct rep_frag *frags;        /* owned, per part.frags */
	char (*init_id)[24];           /* per part.init; registered for replica 0 only */
	struct mpool *pool;            /* runner threads for a replica of several fragments */
	/* Guarded by m->mu: */
	int64_t done;                  /* training steps run */
	uint64_t cur_step;             /* first step id of the chunk in flight; 0 = none */
	int64_t cur_count;
	bool finished;                 /* its thread is over (st, err say how) */
	bool lost;                     /* queue-fed: its task was lost for good, the others
					* went on (st is DG_OK) */
	/* (wall time, done) at the end of its recent chunks, a ring: every step
	 * below done had applied by then. A restarted ps that lost the applies
	 * after its snapshot's cut rewinds the replica to the last entry before
	 * the cut (train_replica_main). */
	struct rep_mark { double at; int64_t done; } marks[REP_MARKS];
	int n_marks, next_mark;
	bool idle;                     /* ran its steps; waits for the others (a ps restart
					* may still send it back: replica_linger) */
	bool rewind;                   /* a ps restarted: rewind to the mark before rewind_at */
	double rewind_at;              /* its snapshot's cut (wall s; 0: it had none) */
	char rewind_task[128];         /* the ps, for the event */
	enum dg_status st;
	struct dg_err err;
};

/* The training side of a job: spec, plan, replicas, and the running figures
 * the events, the status and the metrics CSV are made of (guarded by m->mu). */
struct train {
	struct train_spec spec;
	struct train_plan plan;
	struct replica *reps;          /* plan.n_replicas */
	int n_reps;
	int n_collect;                 /* loss + metrics (+ plan.n_extra): a step's values */
	int n_metrics;                 /* the metrics among them, after the loss */
	const char **collect;          /* borrowed from reps[r].part.fetch_keys (same for all r) */
	int n_vars;                    /* trained variables */
	char **var_name;               /* owned: name on the ps */
	int *var_task;                 /* cluster task holding it */
	int64_t *var_base;             /* sync step when training started */
	int64_t steps;                 /* per replica */
	int64_t spe;                   /* steps per epoch; 0 = no epochs */
	int64_t epochs;                /* 0 when there are no epochs */
	int64_t eval_every;            /* replica 0 steps between evals; 0 = only at the end */
	int64_t evaluated;             /* async: the last eval boundary (steps) evaluated */
	bool stop;                     /* replicas leave at their next chunk */
	char stop_reason[256];         /* why, for the aborts of the chunks in flight */
	bool failed;                   /* a replica failed: the others were aborted */
	double t0;                     /* ms when the replicas started */
	double sum_loss, *sum_metric;  /* since the last train event */
	int64_t n_agg;
	double loss, *metric;          /* last train event's values (NAN: none yet) */
	double *eval;                  /* per eval fetch: last eval's value (NAN: none) */
	bool have_eval;
	int64_t stale;
	double last_event_ms;
	int64_t last_event_step;       /* its mean step (rows have increasing steps) */
	bool final_reported;           /* the last train row is out: no more after it */
	double chunk_ms_sum;           /* time of the chunks done, all replicas: with the
					* steps done it gives the mean step time */
	int64_t epochs_reported;       /* epochs whose end had a train event */
	double examples_per_s;
	struct dg_buf csv;             /* GET /v1/jobs/ID/metrics */
	/* Queue-fed input (plan.queue; train_input.c, train_feed.c). */
	int queue_task;                /* cluster task holding the queue; -1 without one */
	struct dg_graph *feed_g;       /* the feeder's graph, placed and cut (NULL: none) */
	struct placement feed_pl;
	struct partition feed_part;
	char (*feed_id)[24];           /* per feed_part.frags: registered ids */
	pthread_t feed_th;
	bool feed_started, feed_over;  /* its thread; whether it ended (feed_st says how) */
	uint64_t feed_step;            /* its run's step id while it runs, 0 */
	enum dg_status feed_st;
	struct dg_err feed_err;
	int64_t applied, requeued;     /* examples, from every step's QueueAck */
	int64_t lost_replicas;         /* replicas whose task was lost for good */
	/* GET /v1/jobs/ID/steps: the per-step rows (train_feed.c), and the
	 * entries of the ps's requeue log read so far that matched no row yet
	 * (their step's chunk is still out; at the job's end, rows of their own). */
	struct ledger_row *rows;
	int64_t n_rows, cap_rows;
	struct ledger_row *unmatched;
	int64_t n_unmatched, cap_unmatched;
	uint64_t requeue_seq;          /* the ps's log read up to this entry */
	int64_t ids_wanted;            /* examples requeued by rows that have no ids yet */
	bool requeue_reading;          /* a thread reads the log (others wait, m->cv) */
	int64_t requeue_evicted;       /* log entries the ps dropped before we read them */
	/* The reconciled row (train_feed_reconcile): examples the queue acked
	 * that no chunk had reported; a chunk that comes back later takes its
	 * examples out of it. Served after the rows while > 0. */
	int64_t reconciled;
	int reconciled_replica;
};

/* One row of a queue-fed job's step ledger: a replica's step (step -1: a
 * lease that ended with no step of its own, a lost replica's), what its
 * QueueAck said, and from the ps's requeue log why and which example ids
 * went back (or were dropped). */
struct ledger_row {
	int64_t step;
	int replica;
	bool counted;
	int64_t applied, requeued;
	double ms;                     /* NAN: none */
	uint64_t lease;                /* 0: unknown */
	const char *reason;            /* static; NULL until the log names it */
	int64_t *ids, n_ids;           /* owned */
};

/* "task /job:worker/task:1 (127.0.0.1:2223)" */
static inline struct mtask_label task_label(const struct master *m, int t)
{
	return mtask_label(m->tasks[t]);
}

/* job.c: the table. */
/* Monotonic milliseconds. */
double master_now_ms(void);
/* Add j to the table (which takes a reference); m->mu held. */
enum dg_status job_table_add(struct master *m, struct job *j, struct dg_err *err);
/* Find job id and take a reference (job_put). NULL with DG_ENOTFOUND. */
struct job *job_get(struct master *m, const char *id, struct dg_err *err);
void job_put(struct master *m, struct job *j);
void job_put_locked(struct job *j);
void job_free(struct job *j);
void train_free(struct master *m, struct train *tr);
bool job_over(const struct job *j);
/* Mark in used[] (per cluster task) the tasks the job has fragments on. */
void job_tasks(const struct job *j, bool *used);
/* Abort step on every task of the job and in this task's rendezvous. */
void job_abort_step(struct master *m, struct job *j, uint64_t step, const char *reason);
/* Every task the job uses must have answered the health probe (reach[]). */
enum dg_status job_check_used(struct master *m, const struct job *j,
			      const enum dg_status *reach, const struct dg_err *errs,
			      struct dg_err *err);
/* Append one event (takes v) to the job's log and wake long-polls; m->mu held. */
void job_event_locked(struct master *m, struct job *j, json_t *v);
/* The same with the event already a JSON line (owned; NULL is dropped). */
void job_event_line_locked(struct master *m, struct job *j, char *line);
/* {"code", "message", "hint"} of e (owned). */
json_t *job_err_json(const struct dg_err *e);
/* A number for JSON: null when not finite. */
json_t *job_num_json(double x);
/* A job thread's last touch of m: its job reference dropped, the thread
 * counted out (master_free waits for n_threads to reach 0), waiters woken. */
void job_thread_done(struct master *m, struct job *j);
/* The job is over: its final state and event, waiters woken. */
void job_finish(struct master *m, struct job *j, enum dg_status st, const struct dg_err *err);

/* step.c: one step of a job, on every task it uses. */
/* Register fragment f on its task; id receives its id there. */
enum dg_status step_register(struct master *m, const struct place_fragment *f, char *id,
			     struct dg_err *err);
/* f registered again after its task was lost: the old id replaced, the kept
 * connection (dead) dropped; conn may be NULL. */
enum dg_status step_reregister(struct master *m, const struct place_fragment *f, char *id,
			       struct mtask_conn **conn, struct dg_err *err);
void step_unregister_all(struct master *m, struct job *j);
/* One step of the n fragments frags (registered as ids) on a fresh step id;
 * unless init, feeds put first and fetches taken into j->results. On failure
 * *down (when not NULL) gets a task whose loss explains it, else -1. */
enum dg_status step_run_frags(struct master *m, struct job *j,
			      const struct place_fragment *frags, char (*ids)[24], int n,
			      struct mtask_conn **conns, bool init, int *down,
			      struct dg_err *err);
/* The init fragments, once. */
enum dg_status step_run_init(struct master *m, struct job *j, struct dg_err *err);
/* The job's k-th step, re-run when a task was lost and came back. */
enum dg_status step_run(struct master *m, struct job *j, int64_t k, struct dg_err *err);
/* Task t was lost at step k (of replica, or of the job's own steps when < 0):
 * wait up to retry_ms for it to answer again. DG_OK: register and re-run. */
enum dg_status step_retry_wait(struct master *m, struct job *j, int t, int64_t k, int attempt,
			       int replica, struct dg_err *err);
/* Wait on m->cv (m->mu held) for up to ms milliseconds. */
void master_wait_locked(struct master *m, double ms);
/* The thread of a job without "training" (takes the job reference). */
void *job_main(void *arg);

/* train_build.c */
/* The training side of job j from the body's "training" section. */
enum dg_status train_build(struct master *m, struct job *j, const json_t *body,
			   struct place_opts *po, const enum dg_status *reach,
			   const struct dg_err *errs, struct dg_err *err);

/* train_feed.c: the queue-fed side of a run (doc/training.md, "The input
 * pipeline"). setup: the queue created (afresh when the job feeds it), the
 * replicas' leases named "JOB/rR", the feeder's fragments registered. start:
 * the feeder's thread (none without a feeder); stop: its step aborted (when
 * still running, with reason) and the thread joined. release: every lease
 * of replica r back in the queue, *n examples. account_locked: a chunk's
 * QueueAck values into the job's counts and its ledger. */
enum dg_status train_feed_setup(struct master *m, struct job *j, struct dg_err *err);
enum dg_status train_feed_start(struct master *m, struct job *j, struct dg_err *err);
void train_feed_stop(struct master *m, struct job *j, const char *reason);
enum dg_status train_feed_release(struct master *m, struct job *j, int r, int64_t *n,
				  struct dg_err *err);
void train_feed_account_locked(struct train *tr, int r, int64_t t0,
			       const struct dg_task_run_result *c, double ms);
/* At the end of a job that fed its queue, once the chunks in flight came
 * back (a sync job's backup left behind; bounded): the queue's acked count
 * is the truth; what a lost replica applied but never reported is added to
 * the ledger as one row without a step (and a "ledger_reconciled" event). */
void train_feed_reconcile(struct master *m, struct job *j);
/* Read the ps's requeue log of this job's leases since the last read (outside
 * m->mu; one reader at a time) and put each entry's ids on its row. With
 * final (the job's end), entries that matched no row become rows of their own. */
void train_feed_read_requeues(struct master *m, struct job *j, bool final);
/* Whether rows wait for so many ids that the log should be read now (before
 * the ps's bounded log drops them). */
bool train_feed_ids_due_locked(const struct train *tr);
/* The ledger CSV into out: its rows, then the reconciled row, if any. */
enum dg_status train_feed_ledger_locked(const struct train *tr, struct dg_buf *out,
					struct dg_err *err);
/* Examples trained: from the ledger when queue-fed, else steps x batch. */
int64_t train_examples_locked(const struct train *tr);
/* The "input" object of the status: queue, feeder, counts; null without a queue. */
json_t *train_feed_json_locked(const struct train *tr);
void train_feed_free(struct train *tr);

/* train_run.c */
/* Initialise the variables, read their sync steps, register the replica and
 * eval fragments. */
enum dg_status train_setup(struct master *m, struct job *j, struct dg_err *err);
/* The coordinator thread of a training job (takes the job reference). */
void *train_main(void *arg);
/* Training steps done, summed over the replicas, and their mean; m->mu held. */
int64_t train_done_locked(const struct train *tr, int64_t *mean);

#endif
