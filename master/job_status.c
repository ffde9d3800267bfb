/* A job as JSON (GET /v1/jobs, GET /v1/jobs/ID): state, steps, timings,
 * error, placement, and a training job's figures. Neighbours: job.c (the
 * table it reads under m->mu), master.c (the routes that reply with it). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/buf.h"
#include "dg/client.h"
#include "dg/exec.h"
#include "dg/log.h"
#include "dg/train.h"
#include "internal.h"

/* ------------------------------------------------------------ queries */

/* The "training" object of a job's status. Called with m->mu held. */
static json_t *train_json_locked(const struct job *j)
{
	const struct train *tr = j->tr;
	json_t *metrics = json_object(), *eval = json_object(), *done = json_array();
	int64_t mean, sum = train_done_locked(tr, &mean);

	for (int i = 0; i < tr->n_metrics; i++)
		json_object_set_new(metrics, tr->spec.metrics[i], job_num_json(tr->metric[i]));
	for (int i = 0; tr->have_eval && i < j->part.n_fetch; i++)
		json_object_set_new(eval, j->part.fetch_keys[i] + 6, job_num_json(tr->eval[i]));
	for (int r = 0; r < tr->n_reps; r++)
		json_array_append_new(done, json_integer(tr->reps[r].done));
	(void)sum;
	return json_pack("{s:I, s:I, s:I, s:i, s:s, s:i, s:I, s:o, s:I, s:o, s:o, s:o, s:I, "
			 "s:o, s:i, s:i, s:i, s:o}",
			 "epochs", (json_int_t)tr->epochs, "steps", (json_int_t)tr->steps,
			 "steps_per_epoch", (json_int_t)tr->spe, "replicas", tr->n_reps,
			 "mode", tr->spec.sync ? "sync" : "async", "backup", tr->spec.backup,
			 "examples", (json_int_t)train_examples_locked(tr),
			 "examples_per_s", job_num_json(tr->examples_per_s),
			 "batch", (json_int_t)tr->plan.examples_per_step,
			 "loss", job_num_json(tr->loss), "metrics", metrics, "eval", eval,
			 "stale", (json_int_t)tr->stale, "replica_steps", done,
			 "replica_group", tr->plan.group,
			 "towers", tr->spec.towers > 1 ? tr->spec.towers : 1,
			 "microbatches", tr->spec.microbatches > 1 ? tr->spec.microbatches : 1,
			 "input", train_feed_json_locked(tr));
}


static json_t *job_json_locked(const struct master *m, const struct job *j, bool full)
{
	double end = j->t_finished > 0 ? j->t_finished : master_now_ms();
	double mean = j->steps_done ? j->step_ms_sum / (double)j->steps_done : 0.0;
	int64_t sum = 0, mean_done;

	/* A training job: the mean step time of its replicas (a chunk's time over
	 * its steps), as last_step is the last chunk's. */
	if (j->tr && (sum = train_done_locked(j->tr, &mean_done)) > 0)
		mean = j->tr->chunk_ms_sum / (double)sum;
	json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:i, s:{s:f, s:f, s:f}}",
			      "id", j->id, "state", job_state_names[j->state],
			      "steps", (json_int_t)j->steps,
			      "steps_done", (json_int_t)j->steps_done,
			      "fragments", j->part.n_frags + (j->tr ? j->tr->n_reps : 0),
			      "ms", "total", j->t_started > 0 ? end - j->t_started : 0.0,
			      "last_step", j->step_ms_last, "mean_step", mean);
	char dev[128];

	if (!o)
		return NULL;
	json_object_set_new(o, "error", j->state == JOB_FAILED || j->state == JOB_CANCELED ?
			    job_err_json(&j->err) : json_null());
	if (j->tr)
		json_object_set_new(o, "training", train_json_locked(j));
	if (!full)
		return o;
	json_t *fetch = json_array(), *feeds = json_array(), *tasks = json_array();
	json_t *place = json_object();
	for (int i = 0; i < j->part.n_fetch; i++)
		json_array_append_new(fetch, json_string(j->part.fetch_keys[i] + 6));
	for (int i = 0; i < j->part.n_feeds; i++)
		json_array_append_new(feeds, json_pack("{s:s, s:b}", "name", j->part.feeds[i].ref,
						       "given", j->feeds[i] != NULL));
	/* A training job shows its replicas' fragments, then the eval's; its
	 * placement is replica 0's (the others differ in task only). */
	for (int r = 0; j->tr && r < j->tr->n_reps; r++)
		for (int i = 0; i < j->tr->reps[r].part.n_frags; i++) {
			const struct place_fragment *f = &j->tr->reps[r].part.frags[i];
			place_device_name(m->cluster, f->task, dev, sizeof dev);
			json_array_append_new(tasks, json_pack("{s:s, s:s, s:i, s:i}", "device",
							       dev, "address",
							       m->cluster->tasks[f->task].address,
							       "nodes", f->n_nodes, "replica", r));
		}
	for (int i = 0; i < j->part.n_frags; i++) {
		int t = j->part.frags[i].task;
		place_device_name(m->cluster, t, dev, sizeof dev);
		json_array_append_new(tasks, json_pack("{s:s, s:s, s:i}", "device", dev, "address",
						       m->cluster->tasks[t].address,
						       "nodes", j->part.frags[i].n_nodes));
	}
	const struct dg_graph *g = j->tr ? j->tr->reps[0].g : j->g;
	const struct placement *pl = j->tr ? &j->tr->reps[0].pl : &j->pl;
	json_t *soft = json_array();
	for (int n = 0; n < g->n_nodes; n++)
		if (pl->soft[n])
			json_array_append_new(soft, json_pack("{s:s, s:s}", "node",
							      g->nodes[n].name, "device",
							      g->nodes[n].device));
	json_object_set_new(o, "soft", soft);
	/* Where its queues are (their ps names): a Python Session deletes its
	 * own when it closes. */
	json_t *queues = json_array();
	for (int n = 0; n < g->n_nodes; n++)
		if (master_is_queue(&g->nodes[n]) && pl->task[n] >= 0)
			json_array_append_new(queues, json_pack(
				"{s:s, s:s, s:s}", "node", g->nodes[n].name, "name",
				master_queue_ps_name(&g->nodes[n]), "address",
				m->cluster->tasks[pl->task[n]].address));
	json_object_set_new(o, "queues", queues);
	/* The whole map only for graphs a person would read; explain has the rest. */
	for (int n = 0; n < g->n_nodes && n < 10000; n++) {
		place_node_device(m->cluster, pl, n, dev, sizeof dev);
		json_object_set_new(place, g->nodes[n].name, json_string(dev));
	}
	json_object_set_new(o, "fetch", fetch);
	json_object_set_new(o, "feeds", feeds);
	json_object_set_new(o, "tasks", tasks);
	json_object_set_new(o, "placement", place);
	json_object_set_new(o, "explain", json_string(j->explain ? j->explain : ""));
	return o;
}

json_t *master_job_status(struct master *m, const char *id, bool full, struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	json_t *o;

	if (!j)
		return NULL;
	pthread_mutex_lock(&m->mu);
	o = job_json_locked(m, j, full);
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	if (!o)
		dg_err_set(err, DG_ENOMEM, "out of memory");
	return o;
}

json_t *master_job_list(struct master *m)
{
	json_t *a = json_array();

	pthread_mutex_lock(&m->mu);
	for (int i = 0; a && i < m->n_jobs; i++)
		json_array_append_new(a, job_json_locked(m, m->jobs[i], false));
	pthread_mutex_unlock(&m->mu);
	return a;
}
