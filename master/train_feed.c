/* The queue-fed side of a training run (doc/training.md, "The input
 * pipeline"): the queue created on its ps, the replicas' leases named after
 * the job, the feeder run once on its task(s) in a thread of its own, the
 * leases of a replica lost for good handed back, and the per-step ledger
 * that the job's example counts come from. Neighbours: train_input.c (the
 * plan's side), train_build.c (the feeder placed and cut), train_run.c (the
 * run that calls these). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/buf.h"
#include "dg/client.h"
#include "dg/log.h"
#include "internal.h"
#include "pool.h"

/* The feeder's run waits this long per step for its _Recvs (a feeder of one
 * task has none; its enqueues wait for room as long as the job runs). */
#define FEED_TIMEOUT_MS 3600000

/* At the job's end, chunks still in flight (a sync job's backup replica
 * that the job finished without) are given this long to come back before
 * the ledger is reconciled: at the queue's end a live replica's run ends at
 * its next dequeue, milliseconds later. */
#define RECONCILE_WAIT_MS 2000

#define LEDGER_HEADER "step,replica,counted,examples_applied,examples_requeued,ms\n"

/* A replica's lease holder: "JOB/rR" (the naming rule, so that it travels
 * in a query unescaped). */
static void holder_of(const struct job *j, int r, char *out, size_t n)
{
	snprintf(out, n, "%s/r%d", j->id, r);
}

/* Set attr "holder" of every QueueDequeueMany of doc. */
static void patch_holder(json_t *doc, const char *holder)
{
	json_t *n;
	size_t i;

	json_array_foreach(json_object_get(doc, "nodes"), i, n) {
		const char *op = json_string_value(json_object_get(n, "op"));
		json_t *a = json_object_get(n, "attrs");
		if (op && a && strcmp(op, "QueueDequeueMany") == 0)
			json_object_set_new(a, "holder", json_string(holder));
	}
}

enum dg_status train_feed_setup(struct master *m, struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;
	const struct replica *rp0 = &tr->reps[0];
	enum dg_status st;
	int q;

	if (!tr->plan.queue)
		return DG_OK;
	q = dg_graph_find(rp0->g, tr->plan.queue);
	/* A job that feeds its queue starts it afresh; one fed from outside
	 * (dg feed) uses what is there, creating it when it is missing. */
	if ((st = master_queue_create(m, &rp0->g->nodes[q], tr->queue_task, tr->feed_g != NULL,
				      err)) != DG_OK)
		return st;
	for (int r = 0; r < tr->n_reps; r++) {
		char holder[64];
		holder_of(j, r, holder, sizeof holder);
		for (int f = 0; f < tr->reps[r].part.n_frags; f++)
			patch_holder(tr->reps[r].part.frags[f].doc, holder);
	}
	for (int f = 0; f < tr->feed_part.n_frags; f++)
		if ((st = step_register(m, &tr->feed_part.frags[f], tr->feed_id[f], err)) != DG_OK)
			return st;
	return DG_OK;
}

/* ------------------------------------------------------------ the feeder */

struct feed_part {
	struct master *m;
	struct job *j;
	int f;
	uint64_t step;
	atomic_bool *failed;
	enum dg_status st;
	struct dg_err err;
};

static void *feed_part_main(void *arg)
{
	struct feed_part *p = arg;
	struct train *tr = p->j->tr;
	struct mtask *t = p->m->tasks[tr->feed_part.frags[p->f].task];
	const struct dg_task_run run = { .step = p->step, .steps = 1, .train_step = -1,
					 .timeout_ms = FEED_TIMEOUT_MS };
	bool lost = false;

	p->st = t->ops->run(t, NULL, tr->feed_id[p->f], &run, NULL, &lost, &p->err);
	if (p->st != DG_OK && !atomic_exchange(p->failed, true))
		job_abort_step(p->m, p->j, p->step, p->err.msg);
	return NULL;
}

/* The feeder's thread: its fragments run as one step, the queue fed every
 * epoch and closed; how it ended is kept for train_wait. */
static void *feed_main(void *arg)
{
	struct job *j = arg;
	struct master *m = j->m;
	struct train *tr = j->tr;
	int n = tr->feed_part.n_frags;
	struct feed_part *ps = calloc((size_t)n + 1, sizeof *ps);
	uint64_t step = m->step_base | (atomic_fetch_add(&m->step_counter, 1) + 1);
	atomic_bool failed = false;
	enum dg_status st = DG_OK;
	struct dg_err err = { 0 };
	double t0 = master_now_ms();

	if (!ps)
		st = dg_err_set(&err, DG_ENOMEM, "out of memory");
	pthread_mutex_lock(&m->mu);
	tr->feed_step = step;
	if (st == DG_OK)
		job_event_locked(m, j, json_pack("{s:s, s:s, s:s}", "event", "feeder", "state",
						 "started", "queue", tr->plan.queue));
	pthread_mutex_unlock(&m->mu);
	for (int f = 0; st == DG_OK && f < n; f++)
		ps[f] = (struct feed_part){ .m = m, .j = j, .f = f, .step = step,
					    .failed = &failed };
	if (st == DG_OK) {
		/* At once: a fragment's _Recv waits for another's _Send. */
		struct mpool *pool = n > 1 ? mpool_new() : NULL;
		mpool_run(pool, feed_part_main, ps, sizeof *ps, n);
		mpool_free(pool);
	}
	for (int f = 0; st == DG_OK && f < n; f++) {
		if (ps[f].st != DG_OK) {
			st = ps[f].st;
			err = ps[f].err;
			dg_err_prefix(&err, "the feeder of queue '%s'", tr->plan.queue);
		}
	}
	m->tasks[master_self(m)]->ops->finish(m->tasks[master_self(m)], step, 1);
	free(ps);
	pthread_mutex_lock(&m->mu);
	tr->feed_step = 0;
	tr->feed_over = true;
	tr->feed_st = st;
	tr->feed_err = err;
	job_event_locked(m, j, st == DG_OK ?
			 json_pack("{s:s, s:s, s:s, s:f}", "event", "feeder", "state", "done",
				   "queue", tr->plan.queue, "s", (master_now_ms() - t0) / 1e3) :
			 json_pack("{s:s, s:s, s:s, s:o}", "event", "feeder", "state", "failed",
				   "queue", tr->plan.queue, "error", job_err_json(&err)));
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

enum dg_status train_feed_start(struct master *m, struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;

	if (!tr->feed_g)
		return DG_OK;
	if (pthread_create(&tr->feed_th, NULL, feed_main, j) != 0)
		return dg_err_set(err, DG_ENOMEM, "cannot start the feeder's thread");
	tr->feed_started = true;
	return DG_OK;
}

void train_feed_stop(struct master *m, struct job *j, const char *reason)
{
	struct train *tr = j->tr;
	uint64_t step;

	if (!tr->feed_started)
		return;
	pthread_mutex_lock(&m->mu);
	step = tr->feed_over ? 0 : tr->feed_step;
	pthread_mutex_unlock(&m->mu);
	if (step)
		job_abort_step(m, j, step, reason);
	pthread_join(tr->feed_th, NULL);
	tr->feed_started = false;
}

/* ------------------------------------------------------------ lost replicas */

enum dg_status train_feed_release(struct master *m, struct job *j, int r, int64_t *n,
				  struct dg_err *err)
{
	struct train *tr = j->tr;
	char holder[64];
	struct dg_client *c;
	enum dg_status st;

	*n = 0;
	if (!tr->plan.queue)
		return DG_OK;
	holder_of(j, r, holder, sizeof holder);
	if (!(c = dg_client_new(m->cluster->tasks[tr->queue_task].address, m->token, err)))
		return err ? err->code : DG_ENOMEM;
	st = dg_queue_release_holder(c, tr->plan.queue, holder, n, err);
	dg_client_free(c);
	return st;
}

/* ------------------------------------------------------------ the ledger */

/* Whether a replica still runs a chunk (under m->mu; none starts once
 * tr->stop is set). */
static bool chunk_in_flight_locked(const struct train *tr)
{
	for (int r = 0; r < tr->n_reps; r++)
		if (!tr->reps[r].finished && tr->reps[r].cur_step)
			return true;
	return false;
}

void train_feed_reconcile(struct master *m, struct job *j)
{
	struct train *tr = j->tr;
	struct dg_client *c;
	json_t *state = NULL;
	int64_t acked, lost = -1, n_lost = 0;

	if (!tr->plan.queue || !tr->feed_g)
		return;         /* a queue fed from outside may hold other jobs' counts */
	/* A sync job with backups ends once one replica met the queue's end:
	 * another one's last chunk may still be on its way back with steps the
	 * queue already acked. Counted here too, they would be counted twice;
	 * it comes back at once, so wait for it (account_chunk signals m->cv). */
	pthread_mutex_lock(&m->mu);
	double until = master_now_ms() + RECONCILE_WAIT_MS;
	while (chunk_in_flight_locked(tr) && master_now_ms() < until)
		master_wait_locked(m, until - master_now_ms());
	pthread_mutex_unlock(&m->mu);
	if (!(c = dg_client_new(m->cluster->tasks[tr->queue_task].address, m->token, NULL)))
		return;
	if (dg_queue_state(c, tr->plan.queue, &state, NULL) == DG_OK &&
	    json_is_integer(json_object_get(state, "acked"))) {
		acked = json_integer_value(json_object_get(state, "acked"));
		pthread_mutex_lock(&m->mu);
		for (int r = 0; r < tr->n_reps; r++)
			if (tr->reps[r].lost) {
				lost = r;
				n_lost++;
			}
		if (acked > tr->applied) {
			/* A replica lost for good applied (and acked) steps whose
			 * chunk never came back: its leases say so. A chunk that
			 * does come back later takes its examples out of this row
			 * (train_feed_account_locked). */
			int64_t more = acked - tr->applied;
			tr->reconciled = more;
			tr->reconciled_replica = n_lost == 1 ? (int)lost : -1;
			tr->applied = acked;
			job_event_locked(m, j, json_pack("{s:s, s:I, s:i}", "event",
							 "ledger_reconciled", "examples",
							 (json_int_t)more, "replica",
							 n_lost == 1 ? (int)lost : -1));
		}
		pthread_mutex_unlock(&m->mu);
	}
	json_decref(state);
	dg_client_free(c);
}

void train_feed_account_locked(struct train *tr, int r, int64_t t0,
			       const struct dg_task_run_result *c, double ms)
{
	int base = 1 + tr->n_metrics;
	double step_ms = c->steps_done > 0 ? ms / (double)c->steps_done : 0;

	if (!tr->plan.queue)
		return;
	if (!tr->ledger.data)
		dg_buf_printf(&tr->ledger, NULL, LEDGER_HEADER);
	for (int64_t i = 0; i < c->steps_done; i++) {
		double a = c->values[i * tr->n_collect + base];
		double q = c->values[i * tr->n_collect + base + 1];
		int64_t applied = isfinite(a) ? (int64_t)a : 0;
		int64_t requeued = isfinite(q) ? (int64_t)q : 0;
		/* Back after the reconcile: the queue's count had these already. */
		int64_t known = applied < tr->reconciled ? applied : tr->reconciled;
		tr->reconciled -= known;
		tr->applied += applied - known;
		tr->requeued += requeued;
		dg_buf_printf(&tr->ledger, NULL, "%" PRId64 ",%d,%d,%" PRId64 ",%" PRId64 ",%.3f\n",
			      t0 + i, r, requeued == 0 ? 1 : 0, applied, requeued, step_ms);
	}
}

enum dg_status train_feed_ledger_locked(const struct train *tr, struct dg_buf *out,
					struct dg_err *err)
{
	enum dg_status st = DG_OK;

	if (tr->ledger.data)
		st = dg_buf_append(out, tr->ledger.data, tr->ledger.len, err);
	else if (tr->reconciled > 0)
		st = dg_buf_printf(out, err, LEDGER_HEADER);
	if (st == DG_OK && tr->reconciled > 0)
		st = dg_buf_printf(out, err, ",%d,1,%" PRId64 ",0,\n", tr->reconciled_replica,
				   tr->reconciled);
	return st;
}

int64_t train_examples_locked(const struct train *tr)
{
	int64_t mean, sum = train_done_locked(tr, &mean);

	return tr->plan.queue ? tr->applied : sum * tr->plan.examples_per_step;
}

json_t *train_feed_json_locked(const struct train *tr)
{
	if (!tr->plan.queue)
		return json_null();
	return json_pack("{s:s, s:s?, s:I, s:I, s:I, s:I, s:s}", "queue", tr->plan.queue,
			 "feeder", tr->plan.feeder, "examples_per_epoch",
			 (json_int_t)tr->plan.examples_per_epoch, "applied",
			 (json_int_t)tr->applied, "requeued", (json_int_t)tr->requeued,
			 "lost_replicas", (json_int_t)tr->lost_replicas, "feeder_state",
			 !tr->feed_g ? "none" : !tr->feed_started && !tr->feed_over ? "waiting" :
			 !tr->feed_over ? "running" : tr->feed_st == DG_OK ? "done" : "failed");
}

void train_feed_free(struct train *tr)
{
	dg_graph_free(tr->feed_g);
	placement_deinit(&tr->feed_pl);
	partition_deinit(&tr->feed_part);
	free(tr->feed_id);
	dg_buf_deinit(&tr->ledger);
}
