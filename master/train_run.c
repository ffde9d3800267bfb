/* A training run (doc/training.md): one thread per replica, each running
 * its step fragment in chunks of steps on its task (task.h), and a
 * coordinator (train_main) that waits for them, evaluates, checkpoints and
 * reports train events and the metrics CSV. Neighbours: train_build.c (what
 * it runs), step.c (evals are plain steps), job.c (events). */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/buf.h"
#include "dg/clock.h"
#include "dg/client.h"
#include "dg/exec.h"
#include "dg/log.h"
#include "dg/train.h"
#include "internal.h"

/* A CSV cell: empty when not finite. */
static void csv_num(struct dg_buf *b, double x, bool comma)
{
	if (comma)
		dg_buf_printf(b, NULL, ",");
	if (isfinite(x))
		dg_buf_printf(b, NULL, "%.9g", x);
}

/* The 1-based epoch a replica that ran done steps is in (the one just
 * finished at a boundary); 0 without epochs. */
static int64_t train_epoch(const struct train *tr, int64_t done)
{
	int64_t e;

	if (tr->spe <= 0)
		return 0;
	e = (done + tr->spe - 1) / tr->spe;
	if (e < 1)
		e = 1;
	return tr->epochs > 0 && e > tr->epochs ? tr->epochs : e;
}

/* The epoch of the job now: queue-fed, the one its applied examples are in
 * (the last at the end); else train_epoch of the mean replica's steps. */
static int64_t train_epoch_now(const struct train *tr, int64_t mean)
{
	int64_t n = tr->plan.examples_per_epoch, e;

	if (!tr->plan.queue)
		return train_epoch(tr, mean);
	if (n <= 0)
		return 0;
	e = tr->applied / n + (tr->applied % n ? 1 : 0);
	if (e < 1)
		e = 1;
	return tr->epochs > 0 && e > tr->epochs ? tr->epochs : e;
}

/* Training steps done, summed over the replicas, and their mean. Locked. */
int64_t train_done_locked(const struct train *tr, int64_t *mean)
{
	int64_t sum = 0;

	for (int r = 0; r < tr->n_reps; r++)
		sum += tr->reps[r].done;
	*mean = tr->n_reps ? sum / tr->n_reps : 0;
	return sum;
}

/* A "train" event and a metrics row, at most every JOB_TRAIN_EVENT_MS, at each
 * epoch's end (of the mean replica progress) and when forced (the last one).
 * The loss and metrics are the means over the steps since the previous event,
 * all replicas together. Called with m->mu held. */
static void train_event_locked(struct master *m, struct job *j, bool force)
{
	struct train *tr = j->tr;
	double now = master_now_ms(), elapsed, xps;
	int64_t mean, sum = train_done_locked(tr, &mean), examples;
	int64_t n_ep = tr->plan.examples_per_epoch;
	/* Queue-fed, an epoch is over when its examples were applied. */
	int64_t ep_done = tr->plan.queue ? (n_ep > 0 ? tr->applied / n_ep : 0) :
			  tr->spe > 0 ? mean / tr->spe : 0;
	bool epoch_end = (tr->spe > 0 || (tr->plan.queue && n_ep > 0)) &&
			 ep_done > tr->epochs_reported;
	json_t *ev, *metrics;

	if (job_over(j) || tr->final_reported ||
	    (!force && !epoch_end && now - tr->last_event_ms < JOB_TRAIN_EVENT_MS))
		return;
	/* One row per step: the steps since an event at this same mean step are
	 * reported with the next one, and none after the final row (a straggler's
	 * chunk, with backups). */
	if (force)
		tr->final_reported = true;
	if (mean <= tr->last_event_step || (tr->n_agg == 0 && !force))
		return;
	if (tr->n_agg > 0) {
		tr->loss = tr->sum_loss / (double)tr->n_agg;
		for (int i = 0; i < tr->n_metrics; i++)
			tr->metric[i] = tr->sum_metric[i] / (double)tr->n_agg;
	}
	tr->sum_loss = 0;
	for (int i = 0; i < tr->n_metrics; i++)
		tr->sum_metric[i] = 0;
	tr->n_agg = 0;
	if (epoch_end)
		tr->epochs_reported = ep_done;
	tr->last_event_ms = now;
	tr->last_event_step = mean;
	elapsed = (now - tr->t0) / 1e3;
	(void)sum;
	examples = train_examples_locked(tr);
	xps = elapsed > 0 ? (double)examples / elapsed : 0.0;
	tr->examples_per_s = xps;
	j->steps_done = mean;
	metrics = json_object();
	for (int i = 0; i < tr->n_metrics; i++)
		json_object_set_new(metrics, tr->spec.metrics[i], job_num_json(tr->metric[i]));
	ev = json_pack("{s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:I, s:o, s:o, s:o}",
		       "event", "train", "epoch", (json_int_t)train_epoch_now(tr, mean),
		       "epochs", (json_int_t)tr->epochs, "step", (json_int_t)mean,
		       "steps", (json_int_t)tr->steps, "loss", job_num_json(tr->loss),
		       "metrics", metrics, "examples", (json_int_t)examples,
		       "examples_per_s", job_num_json(xps), "elapsed_s", job_num_json(elapsed),
		       "eta_s", mean > 0 ? job_num_json(elapsed * (double)(tr->steps - mean) /
						    (double)mean) : json_null());
	job_event_locked(m, j, ev);
	dg_buf_printf(&tr->csv, NULL, "%" PRId64 ",%.3f,%" PRId64, mean, elapsed,
		      train_epoch_now(tr, mean));
	csv_num(&tr->csv, tr->loss, true);
	for (int i = 0; i < tr->n_metrics; i++)
		csv_num(&tr->csv, tr->metric[i], true);
	csv_num(&tr->csv, xps, true);
	for (int i = 0; i < j->part.n_fetch; i++)
		dg_buf_printf(&tr->csv, NULL, ",");
	dg_buf_printf(&tr->csv, NULL, "\n");
}

/* Run the eval fragments once (a one-step run like an ordinary job's: the
 * fetched values land in j->results) and report them for epoch (replica 0's)
 * at the mean replica step, like the train events (the CSV's steps grow). */
static enum dg_status train_eval(struct master *m, struct job *j, int64_t epoch,
				 struct dg_err *err)
{
	struct train *tr = j->tr;
	enum dg_status st;
	int64_t step;
	json_t *vals;

	if (j->part.n_frags == 0)
		return DG_OK;
	pthread_mutex_lock(&m->mu);
	train_done_locked(tr, &step);
	pthread_mutex_unlock(&m->mu);
	if ((st = step_run(m, j, step, err)) != DG_OK) {
		dg_err_prefix(err, "evaluating");
		return st;
	}
	pthread_mutex_lock(&m->mu);
	train_done_locked(tr, &step);
	vals = json_object();
	for (int i = 0; i < j->part.n_fetch; i++) {
		const struct dg_tensor *t = j->results[i];
		/* Only one-element values make a number; larger ones stay in results. */
		tr->eval[i] = t && t->numel == 1 ? dg_tensor_get_f64(t, 0) : NAN;
		json_object_set_new(vals, j->part.fetch_keys[i] + 6, job_num_json(tr->eval[i]));
	}
	tr->have_eval = true;
	job_event_locked(m, j, json_pack("{s:s, s:I, s:I, s:o}", "event", "eval", "epoch",
					 (json_int_t)epoch, "step", (json_int_t)step, "values",
					 vals));
	dg_buf_printf(&tr->csv, NULL, "%" PRId64 ",%.3f,%" PRId64 ",", step,
		      (master_now_ms() - tr->t0) / 1e3, epoch);
	for (int i = 0; i < tr->n_metrics; i++)
		dg_buf_printf(&tr->csv, NULL, ",");
	dg_buf_printf(&tr->csv, NULL, ",");
	for (int i = 0; i < j->part.n_fetch; i++)
		csv_num(&tr->csv, tr->eval[i], true);
	dg_buf_printf(&tr->csv, NULL, "\n");
	pthread_mutex_unlock(&m->mu);
	return DG_OK;
}

/* One fragment's part of a chunk (run_chunk). */
struct chunk_part {
	struct master *m;
	struct replica *rp;
	int f;                            /* index in rp->part.frags */
	struct dg_task_run run;
	struct dg_task_run_result res;
	atomic_bool *failed;
	bool lost;
	enum dg_status st;
	struct dg_err err;
};

static void *run_part(void *arg)
{
	struct chunk_part *p = arg;
	const struct replica *rp = p->rp;
	struct mtask *t = p->m->tasks[rp->part.frags[p->f].task];

	p->st = t->ops->run(t, &p->rp->frags[p->f].conn, rp->frags[p->f].id, &p->run, &p->res,
			    &p->lost, &p->err);
	/* A part that ended at its queue's end leaves the others waiting for the
	 * step it did not run: they are aborted from there on. */
	if (p->st == DG_OK && p->res.input_end && rp->part.n_frags > 1 &&
	    p->res.steps_done < p->run.steps) {
		for (int g = 0; g < rp->part.n_frags; g++) {
			struct mtask *o = p->m->tasks[rp->part.frags[g].task];
			if (g != p->f)
				o->ops->abort(o, p->run.step + (uint64_t)p->res.steps_done,
					      p->run.steps - p->res.steps_done,
					      "the input queue is at its end");
		}
		return NULL;
	}
	if (p->st == DG_OK || rp->part.n_frags == 1 || atomic_exchange(p->failed, true))
		return NULL;
	/* The first failure releases the other tasks' _Recv waits of the chunk. */
	for (int g = 0; g < rp->part.n_frags; g++) {
		struct mtask *o = p->m->tasks[rp->part.frags[g].task];
		if (g != p->f)
			o->ops->abort(o, p->run.step, p->run.steps, p->err.msg);
	}
	return NULL;
}

/* The failure that explains a failed chunk (mtask_failure_over). */
static const struct chunk_part *chunk_failure(const struct chunk_part *ps, int n)
{
	const struct chunk_part *best = NULL;

	for (int i = 0; i < n; i++)
		if (ps[i].st != DG_OK &&
		    (!best || mtask_failure_over(ps[i].st, ps[i].lost, best->st, best->lost)))
			best = &ps[i];
	return best;
}

/* The parts' results as one: the steps every part did, their collected
 * values in the order of tr->collect, the stale gradients summed. */
static enum dg_status merge_parts(const struct train *tr, const struct replica *rp,
				  const struct chunk_part *ps, struct dg_task_run_result *c,
				  struct dg_err *err)
{
	int nc = tr->n_collect, ended = -1;

	c->steps_done = ps[0].res.steps_done;
	for (int f = 0; f < rp->part.n_frags; f++) {
		if (ps[f].res.steps_done < c->steps_done)
			c->steps_done = ps[f].res.steps_done;
		c->stale += ps[f].res.stale;
		if (ps[f].st == DG_OK && ps[f].res.input_end)
			ended = f;
	}
	/* At the queue's end the part that dequeues says how many steps ran;
	 * the others' values of those steps are lost with their aborted run. */
	if (ended >= 0) {
		c->steps_done = ps[ended].res.steps_done;
		c->input_end = true;
	}
	if (c->steps_done <= 0)
		return DG_OK;
	if (!(c->values = calloc((size_t)c->steps_done * (size_t)nc + 1, sizeof *c->values)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int64_t i = 0; i < c->steps_done * nc; i++)
		c->values[i] = NAN;
	for (int f = 0; f < rp->part.n_frags; f++) {
		const struct rep_frag *rf = &rp->frags[f];
		for (int64_t i = 0; i < c->steps_done && i < ps[f].res.steps_done; i++)
			for (int k = 0; k < rf->n_collect; k++)
				c->values[i * nc + rf->collect_idx[k]] =
					ps[f].res.values[i * rf->n_collect + k];
	}
	return DG_OK;
}

/* Run steps step..step+k-1 (training steps t0...) of the replica's
 * fragments, on their tasks at once (a replica of several tasks: the others
 * on the replica's runner threads), each over its kept connection and
 * collecting the loss and metrics its task computes. On failure *lost_task
 * gets the task whose loss explains it (else -1) and *c the steps every
 * fragment did. */
static enum dg_status run_chunk(struct master *m, struct job *j, struct replica *rp,
				uint64_t step, int64_t k, int64_t t0,
				struct dg_task_run_result *c, int *lost_task, struct dg_err *err)
{
	const struct train *tr = j->tr;
	int n = rp->part.n_frags;
	struct chunk_part one, *ps = n == 1 ? &one : calloc((size_t)n, sizeof *ps);
	atomic_bool failed = false;
	enum dg_status st = DG_OK;

	*lost_task = -1;
	if (!ps)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int f = 0; f < n; f++)
		ps[f] = (struct chunk_part){
			.m = m, .rp = rp, .f = f, .failed = &failed,
			.run = { .step = step, .steps = k, .train_step = t0,
				 .timeout_ms = j->timeout_ms, .collect = rp->frags[f].collect,
				 .n_collect = rp->frags[f].n_collect } };
	if (n > 1 && !rp->pool) {
		pthread_mutex_lock(&m->mu);
		rp->pool = mpool_new();
		pthread_mutex_unlock(&m->mu);
	}
	mpool_run(rp->pool, run_part, ps, sizeof *ps, n);
	if (n == 1) {
		*c = one.res;
		st = one.st;
		if (st != DG_OK) {
			*err = one.err;
			*lost_task = one.lost ? rp->part.frags[0].task : master_task_at(m, err->peer);
		}
		return st;
	}
	const struct chunk_part *bad = chunk_failure(ps, n);
	for (int f = 0; bad && f < n; f++)
		if (ps[f].st == DG_OK && ps[f].res.input_end)
			bad = NULL;     /* the others were aborted at the queue's end */
	if (bad) {
		*err = bad->err;
		st = bad->st;
		/* The task did not answer, or it could not reach another (a ps). */
		*lost_task = bad->lost ? rp->part.frags[bad->f].task : master_task_at(m, err->peer);
	}
	enum dg_status mst = merge_parts(tr, rp, ps, c, err);
	for (int f = 0; f < n; f++)
		dg_task_run_result_deinit(&ps[f].res);
	free(ps);
	return st != DG_OK ? st : mst;
}

/* Abort the chunk in flight on task t (steps step..step+count-1). Best effort. */
static void abort_chunk(struct master *m, int t, uint64_t step, int64_t count,
			const char *reason)
{
	m->tasks[t]->ops->abort(m->tasks[t], step, count, reason);
}

/* Steps for the replica's next chunk: k (adapted to ~JOB_CHUNK_MS), cut at
 * its last step, at epoch ends (so each epoch ends with an event) and at the
 * next eval (replica 0; every replica of an async job with eval.barrier, see
 * train_eval_barrier). */
static int64_t chunk_size(const struct train *tr, int r, int64_t done, int64_t k)
{
	int64_t n = k < tr->steps - done ? k : tr->steps - done;

	if (tr->spe > 0 && n > tr->spe - done % tr->spe)
		n = tr->spe - done % tr->spe;
	if ((r == 0 || (!tr->spec.sync && tr->spec.eval_barrier)) && tr->eval_every > 0 &&
	    n > tr->eval_every - done % tr->eval_every)
		n = tr->eval_every - done % tr->eval_every;
	return n < 1 ? 1 : n;
}

/* Async with eval.barrier: replica r is at eval boundary done (a multiple of
 * eval_every). Every
 * replica waits there until replica 0 has evaluated it, and replica 0
 * evaluates once every other replica reached it (or finished, or the job
 * stops), so the eval sees exactly done steps of every replica, as a sync
 * job's does. Without it (the default: the wait costs examples/s) the others
 * train on during the eval: the epoch-1 eval of examples/mlp.json (2 workers)
 * sees 1.1-1.3 epochs. */
static enum dg_status train_eval_barrier(struct master *m, struct job *j, int r, int64_t done,
					 struct dg_err *err)
{
	struct train *tr = j->tr;
	enum dg_status st = DG_OK;
	bool go = false, stop = false;

	pthread_mutex_lock(&m->mu);
	while (!go && !(stop = j->cancel || tr->stop)) {
		go = r == 0 || tr->evaluated >= done || tr->reps[0].finished;
		for (int q = 1; r == 0 && q < tr->n_reps; q++)
			if (!tr->reps[q].finished && tr->reps[q].done < done)
				go = false;
		if (!go)
			master_wait_locked(m, JOB_TRAIN_POLL_MS);
	}
	pthread_mutex_unlock(&m->mu);
	if (r != 0 || stop)
		return DG_OK;
	st = train_eval(m, j, train_epoch(tr, done), err);
	pthread_mutex_lock(&m->mu);
	tr->evaluated = done;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	return st;
}

struct replica_arg {
	struct job *j;
	int r;
};

/* The replica's step fragments on task t registered again after t was lost
 * (step_reregister); their ids are replaced under m->mu (the status and the
 * unregistering read them). */
static enum dg_status replica_reregister(struct master *m, struct replica *rp, int t,
					 struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int f = 0; st == DG_OK && f < rp->part.n_frags; f++) {
		char id[24];
		if (rp->part.frags[f].task != t)
			continue;
		pthread_mutex_lock(&m->mu);
		snprintf(id, sizeof id, "%s", rp->frags[f].id);
		pthread_mutex_unlock(&m->mu);
		st = step_reregister(m, &rp->part.frags[f], id, &rp->frags[f].conn, err);
		pthread_mutex_lock(&m->mu);
		snprintf(rp->frags[f].id, sizeof rp->frags[f].id, "%s", id);
		pthread_mutex_unlock(&m->mu);
	}
	return st;
}

/* What chunk c of replica rp (ms long) brought: its steps, the loss and
 * metric sums of the next train event, stale gradients, the step time. */
static void account_chunk(struct master *m, struct job *j, struct replica *rp,
			  const struct dg_task_run_result *c, double ms)
{
	struct train *tr = j->tr;
	bool due;

	pthread_mutex_lock(&m->mu);
	rp->cur_step = 0;
	train_feed_account_locked(tr, (int)(rp - tr->reps), rp->done, c, ms);
	rp->done += c->steps_done;
	if (c->steps_done > 0) {
		rp->marks[rp->next_mark] = (struct rep_mark){ dg_wall_s(), rp->done };
		rp->next_mark = (rp->next_mark + 1) % REP_MARKS;
		if (rp->n_marks < REP_MARKS)
			rp->n_marks++;
	}
	for (int64_t i = 0; i < c->steps_done; i++) {
		tr->sum_loss += c->values[i * tr->n_collect];
		for (int v = 1; v <= tr->n_metrics; v++)
			tr->sum_metric[v - 1] += c->values[i * tr->n_collect + v];
	}
	tr->n_agg += c->steps_done;
	tr->stale += c->stale;
	if (c->steps_done > 0) {
		/* A replica's step time: its chunk's time over its steps. */
		j->step_ms_last = ms / (double)c->steps_done;
		tr->chunk_ms_sum += ms;
	}
	train_event_locked(m, j, false);
	pthread_cond_broadcast(&m->cv);         /* replica 0 may wait for this step */
	due = train_feed_ids_due_locked(tr);
	pthread_mutex_unlock(&m->mu);
	/* Rows wait for many ids: read them before the ps's bounded log drops them. */
	if (due)
		train_feed_read_requeues(m, j, false);
}

/* A ps the replica trains restarted from a snapshot cut at rewind_at (see
 * note_recovered): the applies of its later steps are gone. Go back to the
 * last chunk end before the cut (every step below it had applied by then;
 * the steps up to the cut are re-run too, a few gradients twice), or to the
 * start when no mark is that old. Returns the steps done from now on. */
static int64_t replica_rewind(struct master *m, struct job *j, struct replica *rp, int64_t done)
{
	int64_t to = 0;
	bool found = false;

	pthread_mutex_lock(&m->mu);
	if (!rp->rewind) {
		pthread_mutex_unlock(&m->mu);
		return done;
	}
	rp->rewind = false;
	for (int i = 0; i < rp->n_marks && !found; i++) {
		const struct rep_mark *k = &rp->marks[(rp->next_mark - 1 - i + 2 * REP_MARKS) %
						      REP_MARKS];
		if (k->at <= rp->rewind_at) {
			to = k->done;
			found = true;
		}
	}
	/* No mark is that old (or the ps had no snapshot): from the start. */
	if (to > done)
		to = done;
	/* The marks past the new position describe steps that will run again. */
	while (rp->n_marks > 0 &&
	       rp->marks[(rp->next_mark - 1 + REP_MARKS) % REP_MARKS].done > to) {
		rp->next_mark = (rp->next_mark - 1 + REP_MARKS) % REP_MARKS;
		rp->n_marks--;
	}
	rp->done = to;
	job_event_locked(m, j, json_pack("{s:s, s:i, s:s, s:I, s:I, s:f}", "event", "rewound",
					 "replica", (int)(rp - j->tr->reps), "task", rp->rewind_task,
					 "from", (json_int_t)done, "to", (json_int_t)to,
					 "snapshot_at", rp->rewind_at));
	pthread_mutex_unlock(&m->mu);
	dg_log(DG_LOG_WARN, "master", "job %s: replica %d goes back from step %" PRId64 " to %"
	       PRId64 ": %s lost the applies after its snapshot", j->id, (int)(rp - j->tr->reps),
	       done, to, rp->rewind_task);
	return to;
}

/* Async replica rp ran its steps: it stays (idle) while another one runs
 * (the job ends when all have anyway), since a ps that restarts meanwhile
 * takes back its applies after its snapshot, this replica's too. True when that happened (rp->rewind: run
 * again from there); false once every replica is idle or finished, or the
 * job stops. */
static bool replica_linger(struct master *m, struct job *j, struct replica *rp)
{
	struct train *tr = j->tr;
	bool again = false;

	pthread_mutex_lock(&m->mu);
	rp->idle = true;
	pthread_cond_broadcast(&m->cv);
	for (;;) {
		bool busy = false;
		for (int q = 0; q < tr->n_reps; q++)
			busy |= !tr->reps[q].idle && !tr->reps[q].finished;
		if ((again = rp->rewind) || !busy || j->cancel || tr->stop)
			break;
		master_wait_locked(m, JOB_HEALTH_POLL_MS);
	}
	rp->idle = !again;
	pthread_mutex_unlock(&m->mu);
	return again;
}

/* The next chunk's steps after n steps took ms: aim at JOB_CHUNK_MS per
 * chunk, growing at most 4x at a time. */
static int64_t next_chunk(int64_t n, double ms)
{
	double want = (double)JOB_CHUNK_MS * (double)n / (ms > 0.01 ? ms : 0.01);
	int64_t k = want > (double)(4 * n) ? 4 * n : (int64_t)want;

	return k < 1 ? 1 : k > WORKER_MAX_RUN_STEPS ? WORKER_MAX_RUN_STEPS : k;
}

/* Queue-fed replica r's task t is lost for good (err says why): its leases
 * go back to the queue at once, so that the other replicas learn its
 * examples, and the job goes on without it. False when it was the last
 * replica (the job then fails with err). */
static bool replica_lost(struct master *m, struct job *j, int r, int t, struct dg_err *err)
{
	struct train *tr = j->tr;
	struct dg_err rerr = { 0 };
	int64_t n = 0;
	int alive = 0;
	enum dg_status st = train_feed_release(m, j, r, &n, &rerr);

	pthread_mutex_lock(&m->mu);
	for (int q = 0; q < tr->n_reps; q++)
		alive += q != r && !(tr->reps[q].finished && tr->reps[q].st != DG_OK);
	alive -= (int)tr->lost_replicas;
	job_event_locked(m, j, json_pack("{s:s, s:i, s:s, s:o, s:I, s:s?}", "event",
					 "replica_lost", "replica", r, "task",
					 task_label(m, t).s, "error", job_err_json(err),
					 "requeued", (json_int_t)n, "release_error",
					 st == DG_OK ? NULL : rerr.msg));
	pthread_mutex_unlock(&m->mu);
	dg_log(DG_LOG_WARN, "master", "job %s: replica %d lost with %s; %" PRId64 " leased "
	       "examples requeued, %d replica(s) go on", j->id, r, task_label(m, t).s, n, alive);
	return alive > 0;
}

/* Queue-fed evals: replica 0 evaluates when the examples applied cross the
 * next eval boundary (every_epochs x the epoch's examples, or every_steps x
 * the batches of all replicas). */
static enum dg_status queue_evals(struct master *m, struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;
	int64_t per = tr->spec.eval_every_epochs > 0 ?
		      tr->spec.eval_every_epochs * tr->plan.examples_per_epoch :
		      tr->spec.eval_every_steps * tr->plan.examples_per_step * tr->n_reps;
	int64_t applied, next;
	enum dg_status st = DG_OK;

	if (per <= 0)
		return DG_OK;
	pthread_mutex_lock(&m->mu);
	applied = tr->applied;
	next = (tr->evaluated + 1) * per;
	pthread_mutex_unlock(&m->mu);
	if (applied < next || (tr->plan.examples_per_epoch > 0 && tr->epochs > 0 &&
			       next >= tr->epochs * tr->plan.examples_per_epoch))
		return DG_OK;   /* the last one is the job's final eval */
	st = train_eval(m, j, tr->plan.examples_per_epoch > 0 ?
			applied / tr->plan.examples_per_epoch : 0, err);
	pthread_mutex_lock(&m->mu);
	tr->evaluated = applied / per;
	pthread_mutex_unlock(&m->mu);
	return st;
}

/* One replica: chunks of steps until it ran tr->steps, the job stops, or a
 * chunk fails. Holds a job reference and counts in m->n_threads (a replica
 * left behind on a stopped task ends when its request times out). */
static void *train_replica_main(void *arg)
{
	struct replica_arg *a = arg;
	struct job *j = a->j;
	struct master *m = j->m;
	struct train *tr = j->tr;
	struct replica *rp = &tr->reps[a->r];
	int r = a->r, attempt = 0;
	int64_t k = 1, done = 0;
	enum dg_status st = DG_OK;
	struct dg_err err = { 0 };
	int lost = -1;
	/* Queue-fed with epochs: every replica runs until the queue's end. */
	bool to_end = tr->plan.queue && tr->spec.epochs > 0;
	bool gone = false;

	free(a);
again:
	while (st == DG_OK && (done = replica_rewind(m, j, rp, done), done < tr->steps || to_end)) {
		int64_t n = tr->plan.queue ? (to_end || k < tr->steps - done ? k : tr->steps - done) :
			    chunk_size(tr, r, done, k);
		uint64_t step = m->step_base |
				(atomic_fetch_add(&m->step_counter, (uint64_t)n) + 1);
		struct dg_task_run_result c = { 0 };
		bool stop;
		double t0;

		pthread_mutex_lock(&m->mu);
		stop = j->cancel || tr->stop;
		if (!stop) {
			rp->cur_step = step;
			rp->cur_count = n;
		}
		pthread_mutex_unlock(&m->mu);
		if (stop)
			break;
		t0 = master_now_ms();
		st = run_chunk(m, j, rp, step, n, done, &c, &lost, &err);
		double ms = master_now_ms() - t0;
		bool end = st == DG_OK && c.input_end;
		account_chunk(m, j, rp, &c, ms);
		done += c.steps_done;
		dg_task_run_result_deinit(&c);
		if (st != DG_OK && lost >= 0) {
			/* A task was lost: once it is back, register its fragments
			 * again and run on from the last step every fragment did
			 * (ShardBatch makes a step's data a function of its training
			 * step). */
			if ((st = step_retry_wait(m, j, lost, done, attempt++, r, &err)) == DG_OK &&
			    (st = replica_reregister(m, rp, lost, &err)) == DG_OK)
				continue;
			/* Queue-fed and async: the others learn its examples. */
			if (tr->plan.queue && !tr->spec.sync && st != DG_ECANCELED &&
			    replica_lost(m, j, r, lost, &err)) {
				st = DG_OK;
				gone = true;
				break;
			}
		}
		if (st != DG_OK || end)
			break;
		attempt = 0;
		k = next_chunk(n, ms);
		if (tr->plan.queue) {
			if (r == 0 && (st = queue_evals(m, j, &err)) != DG_OK)
				break;
			continue;
		}
		if (tr->eval_every > 0 && done < tr->steps && done % tr->eval_every == 0) {
			if (!tr->spec.sync && tr->spec.eval_barrier)
				st = train_eval_barrier(m, j, r, done, &err);
			else if (r == 0)
				st = train_eval(m, j, train_epoch(tr, done), &err);
		}
	}
	/* Done, but a ps restart may still take back steps it applied. */
	if (st == DG_OK && !gone && !to_end && !tr->spec.sync && replica_linger(m, j, rp))
		goto again;
	if (st != DG_OK && strncmp(err.msg, "task ", 5) != 0) {
		dg_err_prefix(&err, "replica %d on %s", r,
			      task_label(m, lost >= 0 ? lost : rp->task).s);
	} else if (st != DG_OK) {
		dg_err_prefix(&err, "replica %d", r);
	}
	pthread_mutex_lock(&m->mu);
	rp->finished = true;
	rp->st = st;
	rp->err = err;
	if (gone) {
		tr->lost_replicas++;
		rp->lost = true;
	}
	job_put_locked(j);
	m->n_threads--;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

/* A ps restarted (note_recovered asked the replicas to go back) when a
 * replica had already ended: its applies after the ps's snapshot are gone and
 * nobody will make them again. DG_EUNAVAILABLE saying so, else DG_OK. */
static enum dg_status train_lost_after_end(struct master *m, struct job *j, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	pthread_mutex_lock(&m->mu);
	for (int r = 0; r < j->tr->n_reps && st == DG_OK; r++) {
		const struct replica *rp = &j->tr->reps[r];
		if (rp->rewind && rp->finished) {
			st = dg_err_set(err, DG_EUNAVAILABLE, "%s restarted after replica %d had "
					"finished: the applies after its snapshot are lost",
					rp->rewind_task, r);
			dg_err_hint(err, "run the job again (its variables are as the ps recovered "
				    "them), or give it a checkpoint_secs");
		}
	}
	pthread_mutex_unlock(&m->mu);
	return st;
}

/* POST /v1/checkpoint to every ps task; an event per snapshot. A ps that is
 * down is waited for (retry_ms), as a replica waits for it. */
static enum dg_status train_checkpoint(struct master *m, struct job *j, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int t = 0; st == DG_OK && t < m->cluster->n_tasks; t++) {
		struct dg_client *c;
		json_t *reply = NULL;
		if (strcmp(m->cluster->tasks[t].job, "ps") != 0)
			continue;
		if (!(c = dg_client_new(m->cluster->tasks[t].address, m->token, err)))
			return err ? err->code : DG_ENOMEM;
		st = dg_ps_checkpoint(c, &reply, err);
		if (st != DG_OK && master_task_at(m, err->peer) == t) {
			/* The ps is down: wait for it as the replicas do, then snapshot
			 * what it has (the replicas go back to its own last snapshot). */
			int64_t mean;
			pthread_mutex_lock(&m->mu);
			train_done_locked(j->tr, &mean);
			pthread_mutex_unlock(&m->mu);
			if ((st = step_retry_wait(m, j, t, mean, 0, -1, err)) == DG_OK)
				st = train_lost_after_end(m, j, err);
			if (st == DG_OK)
				st = dg_ps_checkpoint(c, &reply, err);
		}
		dg_client_free(c);
		if (st != DG_OK) {
			dg_err_prefix(err, "checkpoint of ps %s", m->cluster->tasks[t].address);
			break;
		}
		pthread_mutex_lock(&m->mu);
		job_event_locked(m, j, json_pack("{s:s, s:s, s:O?}", "event", "checkpoint", "ps",
						 m->cluster->tasks[t].address, "snapshot", reply));
		pthread_mutex_unlock(&m->mu);
		json_decref(reply);
	}
	return st;
}

/* The sync step of every trained variable into steps[] (-1: not reported),
 * from GET /v1/vars of each ps task holding one (HEAD does not give it to
 * the client). DG_ENOTFOUND naming a variable that is not there. */
static enum dg_status var_steps(struct master *m, const struct train *tr, int64_t *steps,
				struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int v = 0; v < tr->n_vars; v++)
		steps[v] = INT64_MIN;
	for (int v = 0; st == DG_OK && v < tr->n_vars; v++) {
		struct dg_var_info *vars = NULL;
		int n = 0, t = tr->var_task[v];
		const char *addr = m->cluster->tasks[t].address;
		struct dg_client *c;
		if (steps[v] != INT64_MIN)
			continue;   /* listed with an earlier variable of the same task */
		if (!(c = dg_client_new(addr, m->token, err)))
			return err ? err->code : DG_ENOMEM;
		st = dg_var_list(c, "", &vars, &n, err);
		dg_client_free(c);
		if (st != DG_OK)
			dg_err_prefix(err, "listing the variables of ps %s", addr);
		for (int i = 0; st == DG_OK && i < n; i++)
			for (int u = v; u < tr->n_vars; u++)
				if (tr->var_task[u] == t &&
				    strcmp(vars[i].name, tr->var_name[u]) == 0)
					steps[u] = vars[i].step;
		free(vars);
		if (st == DG_OK && steps[v] == INT64_MIN) {
			dg_err_set(err, DG_ENOTFOUND, "variable '%s' is not on ps %s",
				   tr->var_name[v], addr);
			return DG_ENOTFOUND;
		}
	}
	return st;
}

/* Whether every trained variable reached its sync step base + steps (sync
 * with backups: the job is complete without the slow replicas). */
static bool train_vars_reached(struct master *m, const struct train *tr)
{
	int64_t *steps = calloc((size_t)tr->n_vars + 1, sizeof *steps);
	bool ok = steps && var_steps(m, tr, steps, NULL) == DG_OK;

	for (int v = 0; ok && v < tr->n_vars; v++)
		ok = steps[v] >= tr->var_base[v] + tr->steps;
	free(steps);
	return ok;
}

/* Whether v is the JSON string s. */
static bool str_is(const json_t *v, const char *s)
{
	return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

/* Set attrs[key] = value on every node of doc whose op is op, by "var". */
static void patch_nodes(json_t *doc, const char *op, const char *key, const struct train *tr)
{
	size_t i;
	json_t *n;

	json_array_foreach(json_object_get(doc, "nodes"), i, n) {
		json_t *attrs = json_object_get(n, "attrs");
		const char *var = json_string_value(json_object_get(attrs, "var"));
		if (!var || !str_is(json_object_get(n, "op"), op))
			continue;
		for (int v = 0; v < tr->n_vars; v++)
			if (strcmp(tr->var_name[v], var) == 0)
				json_object_set_new(attrs, key,
						    json_integer((json_int_t)tr->var_base[v]));
	}
}

/* Initialise the variables (replica 0's VarInit fragments, reset when the
 * spec says reinit; then the eval's, which create only what is missing),
 * read each variable's sync step, and register the replica and eval
 * fragments (with the sync step bases patched in when sync). */
enum dg_status train_setup(struct master *m, struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;
	struct replica *rp0 = &tr->reps[0];
	enum dg_status st = DG_OK;
	size_t i;
	json_t *n;

	for (int f = 0; tr->spec.reinit && f < rp0->part.n_init; f++)
		json_array_foreach(json_object_get(rp0->part.init[f].doc, "nodes"), i, n)
			if (str_is(json_object_get(n, "op"), "VarInit"))
				json_object_set_new(json_object_get(n, "attrs"), "reset",
						    json_true());
	for (int f = 0; st == DG_OK && f < rp0->part.n_init; f++)
		st = step_register(m, &rp0->part.init[f], rp0->init_id[f], err);
	if (st == DG_OK && rp0->part.n_init > 0)
		st = step_run_frags(m, j, rp0->part.init, rp0->init_id, rp0->part.n_init, NULL, true,
			       NULL, err);
	for (int f = 0; st == DG_OK && f < j->part.n_init; f++)
		st = step_register(m, &j->part.init[f], j->init_id[f], err);
	if (st == DG_OK && j->part.n_init > 0)
		st = step_run_init(m, j, err);
	if (st != DG_OK) {
		dg_err_prefix(err, "initialising variables");
		return st;
	}
	if ((st = var_steps(m, tr, tr->var_base, err)) != DG_OK)
		return st;
	for (int v = 0; tr->spec.sync && v < tr->n_vars; v++) {
		if (tr->var_base[v] >= 0)
			continue;
		dg_err_set(err, DG_EUNSUPPORTED, "ps %s does not report the sync step of "
			   "variable '%s'", m->cluster->tasks[tr->var_task[v]].address,
			   tr->var_name[v]);
		dg_err_hint(err, "run every task with the same dg version");
		return DG_EUNSUPPORTED;
	}
	if ((st = train_feed_setup(m, j, err)) != DG_OK)
		return st;
	if (tr->spec.sync && tr->spec.backup > 0 && !tr->plan.queue) {
		/* Backups drop the slowest replicas' gradients at every step: with
		 * static shards that is the same shard's data, again and again. */
		const char *w = "sync backups with static shards (ShardBatch) drop the slowest "
				"replicas' shards systematically: their examples are learned "
				"less; feed the replicas from a queue (doc/training.md, \"The "
				"input pipeline\") to have dropped batches requeued";
		dg_log(DG_LOG_WARN, "master", "job %s: %s", j->id, w);
		pthread_mutex_lock(&m->mu);
		job_event_locked(m, j, json_pack("{s:s, s:s}", "event", "warning", "message", w));
		pthread_mutex_unlock(&m->mu);
	}
	for (int r = 0; st == DG_OK && r < tr->n_reps; r++) {
		struct replica *rp = &tr->reps[r];
		for (int f = 0; st == DG_OK && f < rp->part.n_frags; f++) {
			if (tr->spec.sync) {
				patch_nodes(rp->part.frags[f].doc, "VarApply", "step_base", tr);
				patch_nodes(rp->part.frags[f].doc, "VarRead", "min_step_base", tr);
				patch_nodes(rp->part.frags[f].doc, "VarGather", "min_step_base", tr);
			}
			st = step_register(m, &rp->part.frags[f], rp->frags[f].id, err);
		}
	}
	for (int f = 0; st == DG_OK && f < j->part.n_frags; f++)
		st = step_register(m, &j->part.frags[f], j->frag_id[f], err);
	return st;
}

/* Start one thread per replica. */
static enum dg_status train_start_replicas(struct master *m, struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;
	pthread_attr_t attr;
	enum dg_status st = DG_OK;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_mutex_lock(&m->mu);
	tr->t0 = master_now_ms();
	tr->last_event_ms = tr->t0;
	for (int r = 0; r < tr->n_reps; r++) {
		struct replica_arg *a = malloc(sizeof *a);
		pthread_t th;
		if (!a) {
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
		} else {
			*a = (struct replica_arg){ j, r };
			j->refs++;
			m->n_threads++;
			if (pthread_create(&th, &attr, train_replica_main, a) != 0) {
				j->refs--;
				m->n_threads--;
				free(a);
				st = dg_err_set(err, DG_ENOMEM, "cannot start a thread for "
						"replica %d of job %s", r, j->id);
			}
		}
		if (st != DG_OK) {
			/* The replicas not started count as finished with this error. */
			for (int q = r; q < tr->n_reps; q++) {
				tr->reps[q].finished = true;
				tr->reps[q].st = st;
				tr->reps[q].err = *err;
			}
			tr->stop = true;
			break;
		}
	}
	pthread_mutex_unlock(&m->mu);
	pthread_attr_destroy(&attr);
	return st;
}

/* Wait until the replicas are done (or, sync with backups, enough of them and
 * every variable reached its last step), one failed, or the job was canceled;
 * checkpoint every checkpoint_secs meanwhile. Then stop the replicas still
 * running and abort their chunks in flight. */
static enum dg_status train_wait(struct master *m, struct job *j, enum dg_status st,
				 struct dg_err *err)
{
	struct train *tr = j->tr;
	double next_ckpt = tr->spec.checkpoint_secs > 0 ?
			   master_now_ms() + tr->spec.checkpoint_secs * 1e3 : 0;
	const char *reason = "the training job stopped";
	int n = tr->n_reps;

	pthread_mutex_lock(&m->mu);
	while (st == DG_OK) {
		int ok = 0, bad = -1;
		for (int r = 0; r < n; r++) {
			if (tr->reps[r].finished && tr->reps[r].st == DG_OK)
				ok++;
			else if (tr->reps[r].finished && bad < 0)
				bad = r;
		}
		if (j->cancel) {
			st = dg_err_set(err, DG_ECANCELED, "job %s was canceled", j->id);
			reason = "job canceled";
			break;
		}
		if (bad >= 0) {
			*err = tr->reps[bad].err;
			st = tr->reps[bad].st;
			reason = err->msg;
			break;
		}
		if (tr->feed_over && tr->feed_st != DG_OK) {
			*err = tr->feed_err;
			st = tr->feed_st;
			reason = err->msg;
			break;
		}
		if (ok == n && tr->lost_replicas >= n) {
			st = dg_err_set(err, DG_EUNAVAILABLE, "job %s: every replica was lost",
					j->id);
			reason = err->msg;
			break;
		}
		if (ok == n)
			break;
		if (tr->spec.sync && tr->spec.backup > 0 && ok >= n - tr->spec.backup) {
			pthread_mutex_unlock(&m->mu);
			bool reached = train_vars_reached(m, tr);
			pthread_mutex_lock(&m->mu);
			if (reached) {
				reason = "the job finished without this replica (a backup)";
				break;
			}
		}
		if (next_ckpt > 0 && master_now_ms() >= next_ckpt) {
			pthread_mutex_unlock(&m->mu);
			st = train_checkpoint(m, j, err);
			pthread_mutex_lock(&m->mu);
			next_ckpt = master_now_ms() + tr->spec.checkpoint_secs * 1e3;
			if (st != DG_OK) {
				reason = err->msg;
				break;
			}
			continue;
		}
		double wait_ms = JOB_TRAIN_POLL_MS;
		if (next_ckpt > 0 && next_ckpt - master_now_ms() < wait_ms)
			wait_ms = next_ckpt - master_now_ms() > 1 ? next_ckpt - master_now_ms() : 1;
		master_wait_locked(m, wait_ms);
	}
	tr->stop = true;
	tr->failed = st != DG_OK;
	snprintf(tr->stop_reason, sizeof tr->stop_reason, "%s", reason);
	pthread_mutex_unlock(&m->mu);
	return st;
}

/* Abort the chunks still in flight (replicas left behind, or all of them
 * after a failure), after the job is over: a stopped task's DELETE waits for
 * its timeout and must not delay the job's end. */
static void train_abort_inflight(struct master *m, struct job *j)
{
	struct train *tr = j->tr;
	int n = tr->n_reps;
	uint64_t *steps = calloc((size_t)n + 1, sizeof *steps);
	int64_t *counts = calloc((size_t)n + 1, sizeof *counts);

	pthread_mutex_lock(&m->mu);
	for (int r = 0; steps && counts && r < n; r++) {
		steps[r] = tr->reps[r].finished ? 0 : tr->reps[r].cur_step;
		counts[r] = tr->reps[r].cur_count;
	}
	pthread_mutex_unlock(&m->mu);
	for (int r = 0; steps && counts && r < n; r++)
		for (int f = 0; steps[r] && f < tr->reps[r].part.n_frags; f++)
			abort_chunk(m, tr->reps[r].part.frags[f].task, steps[r], counts[r],
				    tr->stop_reason);
	free(steps);
	free(counts);
}

/* The thread of a training job: set up, run the replicas, evaluate and
 * checkpoint at the end, clean up. */
void *train_main(void *arg)
{
	struct job *j = arg;
	struct master *m = j->m;
	struct train *tr = j->tr;
	struct dg_err err = { 0 };
	enum dg_status st = train_setup(m, j, &err);

	if (st == DG_OK)
		st = train_start_replicas(m, j, &err);
	if (st == DG_OK)
		st = train_feed_start(m, j, &err);
	st = train_wait(m, j, st, &err);
	/* The queue is at its end (or the job stops): the feeder is done, or is
	 * stopped here. */
	train_feed_stop(m, j, tr->stop_reason);
	if (st == DG_OK)
		train_feed_reconcile(m, j);
	/* The ids of every lease that went back, on their rows (a failed job's
	 * ps may be the one that is gone: not waited for). */
	if (st == DG_OK)
		train_feed_read_requeues(m, j, true);
	if (st == DG_OK) {
		pthread_mutex_lock(&m->mu);
		train_event_locked(m, j, true);
		pthread_mutex_unlock(&m->mu);
		st = train_eval(m, j, tr->epochs, &err);
	}
	if (st == DG_OK && tr->spec.checkpoint_secs > 0)
		st = train_checkpoint(m, j, &err);
	job_finish(m, j, st, &err);
	/* After the job is over: a replica left on a stopped task must not hold
	 * the job's end up while its DELETEs wait. */
	train_abort_inflight(m, j);
	step_unregister_all(m, j);
	job_thread_done(m, j);
	return NULL;
}
