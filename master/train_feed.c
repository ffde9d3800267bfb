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

#define LEDGER_HEADER "step,replica,counted,examples_applied,examples_requeued,ms,lease," \
	"reason,ids\n"

/* Rows waiting for this many ids make the replica that added the last of
 * them read the ps's requeue log (which keeps 2^20 ids). */
#define IDS_DUE 65536

/* Entries of the requeue log read per request. */
#define REQUEUES_PER_READ 4096

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

/* Room for one more row in *rows (n, cap); false when out of memory. */
static bool rows_grow(struct ledger_row **rows, int64_t n, int64_t *cap)
{
	struct ledger_row *p;
	int64_t c = *cap ? *cap * 2 : 256;

	if (n < *cap)
		return true;
	if (!(p = realloc(*rows, (size_t)c * sizeof *p)))
		return false;
	*rows = p;
	*cap = c;
	return true;
}

/* Give row w the requeue log's word on its lease (u, whose ids it takes). */
static void row_take(struct train *tr, struct ledger_row *w, struct ledger_row *u)
{
	if (w->requeued > 0)
		tr->ids_wanted -= w->requeued;
	else if (strcmp(u->reason, "dropped") != 0) {
		/* Requeued though the step's QueueAck saw nothing: its lease ran
		 * out while the step ran (its update landed; the batch is learned
		 * again). Counted here, so that the rows add up to the queue's. */
		w->requeued = u->requeued;
		tr->requeued += u->requeued;
	}
	if (strcmp(u->reason, "dropped") == 0)
		w->counted = false;
	w->reason = u->reason;
	free(w->ids);
	w->ids = u->ids;
	w->n_ids = u->n_ids;
	u->ids = NULL;
}

/* The unmatched log entry of lease, or -1. */
static int64_t unmatched_of(const struct train *tr, uint64_t lease)
{
	for (int64_t k = 0; k < tr->n_unmatched; k++)
		if (tr->unmatched[k].lease == lease)
			return k;
	return -1;
}

static void unmatched_remove(struct train *tr, int64_t k)
{
	free(tr->unmatched[k].ids);
	tr->unmatched[k] = tr->unmatched[--tr->n_unmatched];
}

/* A chunk that came back after the job's final read of the requeue log: its
 * lease may already be a row without a step (made from the log entry that
 * matched no row then). The step's row takes that row's reason and ids and
 * the stepless row goes, so that no lease is counted twice. */
static void late_row_merge(struct train *tr, struct ledger_row *w)
{
	for (int64_t k = tr->n_rows - 2; k >= 0; k--) {
		struct ledger_row *u = &tr->rows[k];
		if (u->step >= 0 || u->lease != w->lease)
			continue;
		/* Added when the stepless row was made; the step's own count (or,
		 * for a lease that ran out, row_take) counts it once. */
		tr->requeued -= u->requeued;
		struct ledger_row moved = *u;
		row_take(tr, w, &moved);
		free(moved.ids);
		memmove(u, u + 1, (size_t)(tr->n_rows - 1 - k) * sizeof *u);
		tr->n_rows--;
		return;
	}
}

void train_feed_account_locked(struct train *tr, int r, int64_t t0,
			       const struct dg_task_run_result *c, double ms)
{
	int base = 1 + tr->n_metrics;
	double step_ms = c->steps_done > 0 ? ms / (double)c->steps_done : 0;

	if (!tr->plan.queue)
		return;
	for (int64_t i = 0; i < c->steps_done; i++) {
		double a = c->values[i * tr->n_collect + base];
		double q = c->values[i * tr->n_collect + base + 1];
		double l = c->values[i * tr->n_collect + base + 2];
		int64_t applied = isfinite(a) ? (int64_t)a : 0;
		int64_t requeued = isfinite(q) ? (int64_t)q : 0;
		/* Back after the reconcile: the queue's count had these already. */
		int64_t known = applied < tr->reconciled ? applied : tr->reconciled, k;
		tr->reconciled -= known;
		tr->applied += applied - known;
		tr->requeued += requeued;
		if (!rows_grow(&tr->rows, tr->n_rows, &tr->cap_rows)) {
			/* The counts above stand; the row is lost (said once). */
			dg_log(DG_LOG_ERROR, "master", "out of memory: the step ledger lost a "
			       "row of replica %d", r);
			continue;
		}
		struct ledger_row *w = &tr->rows[tr->n_rows++];
		*w = (struct ledger_row){ .step = t0 + i, .replica = r, .counted = requeued == 0,
					  .applied = applied, .requeued = requeued, .ms = step_ms,
					  .lease = isfinite(l) && l > 0 ? (uint64_t)l : 0 };
		tr->ids_wanted += requeued;
		if (w->lease && (k = unmatched_of(tr, w->lease)) >= 0) {
			row_take(tr, w, &tr->unmatched[k]);
			unmatched_remove(tr, k);
		} else if (w->lease) {
			late_row_merge(tr, w);
		}
	}
}

bool train_feed_ids_due_locked(const struct train *tr)
{
	return tr->plan.queue && tr->ids_wanted >= IDS_DUE && !tr->requeue_reading;
}

/* Log entry e (of this job's replica r) as a row without a step, for
 * tr->unmatched or for the match of a row (*out owns the ids). */
static enum dg_status entry_row(json_t *e, int r, struct ledger_row *out)
{
	static const char *const reasons[] = { "released", "expired", "holder_released",
					       "dropped" };
	const char *why = json_string_value(json_object_get(e, "reason"));
	json_t *ids = json_object_get(e, "ids"), *v;
	size_t i;

	*out = (struct ledger_row){ .step = -1, .replica = r, .ms = NAN,
				    .lease = (uint64_t)json_integer_value(json_object_get(e,
									      "lease")) };
	for (i = 0; i < sizeof reasons / sizeof *reasons; i++)
		if (why && strcmp(why, reasons[i]) == 0)
			out->reason = reasons[i];
	if (!out->reason)
		out->reason = "released";
	if (strcmp(out->reason, "dropped") != 0)
		out->requeued = json_integer_value(json_object_get(e, "examples"));
	if (json_array_size(ids) == 0)
		return DG_OK;
	if (!(out->ids = malloc(json_array_size(ids) * sizeof *out->ids)))
		return DG_ENOMEM;
	json_array_foreach(ids, i, v)
		out->ids[i] = json_integer_value(v);
	out->n_ids = (int64_t)json_array_size(ids);
	return DG_OK;
}

/* The row of lease (searched from the newest: the log follows the steps). */
static struct ledger_row *row_of(struct train *tr, uint64_t lease)
{
	for (int64_t k = tr->n_rows - 1; k >= 0; k--)
		if (tr->rows[k].lease == lease)
			return &tr->rows[k];
	return NULL;
}

/* Entries of one reply into the rows (under m->mu). */
static void take_entries(struct job *j, json_t *list, size_t plen)
{
	struct train *tr = j->tr;
	struct ledger_row u, *w;
	json_t *e;
	size_t i;

	json_array_foreach(list, i, e) {
		const char *h = json_string_value(json_object_get(e, "holder"));
		int r = h && strlen(h) > plen ? atoi(h + plen) : -1;
		if (entry_row(e, r, &u) != DG_OK) {
			dg_log(DG_LOG_ERROR, "master", "job %s: out of memory reading the ids of "
			       "lease %" PRIu64, j->id, u.lease);
			continue;
		}
		if ((w = row_of(tr, u.lease))) {
			row_take(tr, w, &u);
			free(u.ids);
		} else if (rows_grow(&tr->unmatched, tr->n_unmatched, &tr->cap_unmatched)) {
			tr->unmatched[tr->n_unmatched++] = u;
		} else {
			free(u.ids);
		}
	}
}

void train_feed_read_requeues(struct master *m, struct job *j, bool final)
{
	struct train *tr = j->tr;
	struct dg_client *c = NULL;
	struct dg_err err = { 0 };
	char prefix[64];
	uint64_t after;
	bool more = true;

	pthread_mutex_lock(&m->mu);
	if (!tr || !tr->plan.queue || tr->queue_task < 0) {
		pthread_mutex_unlock(&m->mu);
		return;
	}
	/* One reader at a time, or two would take the same entries twice. */
	while (tr->requeue_reading)
		master_wait_locked(m, 1000);
	tr->requeue_reading = true;
	after = tr->requeue_seq;
	pthread_mutex_unlock(&m->mu);
	holder_of(j, 0, prefix, sizeof prefix);
	prefix[strlen(prefix) - 1] = '\0';      /* "JOB/r": every replica's */
	c = dg_client_new(m->cluster->tasks[tr->queue_task].address, m->token, &err);
	while (c && more) {
		json_t *reply = NULL;
		if (dg_queue_requeues(c, tr->plan.queue, prefix, after, REQUEUES_PER_READ, &reply,
				      &err) != DG_OK) {
			dg_log(DG_LOG_WARN, "master", "job %s: the requeue log of queue '%s': %s "
			       "(the ledger's ids wait for the next read)", j->id, tr->plan.queue,
			       err.msg);
			break;
		}
		more = json_is_true(json_object_get(reply, "more"));
		pthread_mutex_lock(&m->mu);
		/* Entries the ps dropped for room before this read: said, not hidden. */
		uint64_t first = (uint64_t)json_integer_value(json_object_get(reply, "first_seq"));
		if (first > after + 1) {
			tr->requeue_evicted += (int64_t)(first - after - 1);
			/* The rows that waited for those entries never get their
			 * ids: stop counting them towards the next read. */
			tr->ids_wanted = 0;
		}
		take_entries(j, json_object_get(reply, "requeues"), strlen(prefix));
		after = (uint64_t)json_integer_value(json_object_get(reply, "last_seq"));
		tr->requeue_seq = after;
		pthread_mutex_unlock(&m->mu);
		json_decref(reply);
	}
	dg_client_free(c);
	pthread_mutex_lock(&m->mu);
	/* The job is over: the leases no step reported (a lost replica's, and
	 * ones that ran out) are rows of their own. */
	for (int64_t k = 0; final && k < tr->n_unmatched; k++) {
		if (!rows_grow(&tr->rows, tr->n_rows, &tr->cap_rows))
			break;
		tr->rows[tr->n_rows++] = tr->unmatched[k];
		tr->requeued += tr->unmatched[k].requeued;
		tr->unmatched[k].ids = NULL;
	}
	for (int64_t k = 0; final && k < tr->n_unmatched; k++)
		free(tr->unmatched[k].ids);
	if (final)
		tr->n_unmatched = 0;
	tr->requeue_reading = false;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
}

/* One row as CSV. */
static enum dg_status row_csv(const struct ledger_row *w, struct dg_buf *out, struct dg_err *err)
{
	enum dg_status st;

	if (w->step >= 0)
		st = dg_buf_printf(out, err, "%" PRId64 ",%d,%d,%" PRId64 ",%" PRId64 ",%.3f,",
				   w->step, w->replica, w->counted, w->applied, w->requeued, w->ms);
	else
		st = dg_buf_printf(out, err, ",%d,0,0,%" PRId64 ",,", w->replica, w->requeued);
	if (st == DG_OK && w->lease)
		st = dg_buf_printf(out, err, "%" PRIu64, w->lease);
	if (st == DG_OK)
		st = dg_buf_printf(out, err, ",%s,", w->reason ? w->reason : "");
	for (int64_t k = 0; st == DG_OK && k < w->n_ids; k++)
		st = dg_buf_printf(out, err, k ? " %" PRId64 : "%" PRId64, w->ids[k]);
	return st == DG_OK ? dg_buf_printf(out, err, "\n") : st;
}

enum dg_status train_feed_ledger_locked(const struct train *tr, struct dg_buf *out,
					struct dg_err *err)
{
	enum dg_status st = dg_buf_printf(out, err, LEDGER_HEADER);

	for (int64_t k = 0; st == DG_OK && k < tr->n_rows; k++)
		st = row_csv(&tr->rows[k], out, err);
	if (st == DG_OK && tr->reconciled > 0)
		st = dg_buf_printf(out, err, ",%d,1,%" PRId64 ",0,,,,\n", tr->reconciled_replica,
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
	return json_pack("{s:s, s:s?, s:I, s:I, s:I, s:I, s:I, s:s}", "queue", tr->plan.queue,
			 "feeder", tr->plan.feeder, "examples_per_epoch",
			 (json_int_t)tr->plan.examples_per_epoch, "applied",
			 (json_int_t)tr->applied, "requeued", (json_int_t)tr->requeued,
			 "requeue_log_missed", (json_int_t)tr->requeue_evicted, "lost_replicas", (json_int_t)tr->lost_replicas, "feeder_state",
			 !tr->feed_g ? "none" : !tr->feed_started && !tr->feed_over ? "waiting" :
			 !tr->feed_over ? "running" : tr->feed_st == DG_OK ? "done" : "failed");
}

void train_feed_free(struct train *tr)
{
	dg_graph_free(tr->feed_g);
	placement_deinit(&tr->feed_pl);
	partition_deinit(&tr->feed_part);
	free(tr->feed_id);
	for (int64_t k = 0; k < tr->n_rows; k++)
		free(tr->rows[k].ids);
	for (int64_t k = 0; k < tr->n_unmatched; k++)
		free(tr->unmatched[k].ids);
	free(tr->rows);
	free(tr->unmatched);
}
