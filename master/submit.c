/* Submitting a job (POST /v1/jobs): the body's options, feeds and fetches,
 * placement and partitioning (place.c), a health probe of every task it
 * uses, then the job in the table (job.c), started in a thread of its own
 * (step.c or train_run.c) unless it waits for uploaded feeds. */
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

/* ------------------------------------------------------------ submit */

/* Probe every task's health: reach[t] gets whether it answered (errs[t] why
 * not), bytes[t] the bytes it holds, gpu[t] whether it reports a GPU (a
 * non-empty "gpus" array: what place.c needs for /gpu:K devices), epoch[t]
 * its epoch (a later one means it restarted). */
static void probe_tasks(struct master *m, int64_t *bytes, bool *gpu, enum dg_status *reach,
			struct dg_err *errs, uint64_t *epoch)
{
	for (int t = 0; t < m->cluster->n_tasks; t++) {
		json_t *h = NULL;
		reach[t] = m->tasks[t]->ops->health(m->tasks[t], 3000, &h, &errs[t]);
		bytes[t] = json_integer_value(json_object_get(h, "bytes"));
		epoch[t] = (uint64_t)json_integer_value(json_object_get(h, "epoch"));
		gpu[t] = json_array_size(json_object_get(h, "gpus")) > 0;
		json_decref(h);
	}
}

/* The names of the body's "feeds" (object) and "upload" (array), in order. */
static enum dg_status feed_names(const json_t *body, const char ***names, int *n,
				 struct dg_err *err)
{
	const json_t *feeds = json_object_get(body, "feeds"), *up = json_object_get(body, "upload");
	const char *k;
	json_t *v;
	size_t i;

	*n = 0;
	*names = calloc(json_object_size(feeds) + json_array_size(up) + 1, sizeof **names);
	if (!*names)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (feeds && !json_is_object(feeds))
		return dg_err_set(err, DG_EINVAL, "job \"feeds\" must be an object of NAME: value");
	if (up && !json_is_array(up))
		return dg_err_set(err, DG_EINVAL, "job \"upload\" must be an array of names");
	json_object_foreach((json_t *)feeds, k, v)
		(*names)[(*n)++] = k;
	json_array_foreach(up, i, v) {
		if (!json_is_string(v))
			return dg_err_set(err, DG_EINVAL, "job \"upload\"[%zu] must be a string",
					  i);
		(*names)[(*n)++] = json_string_value(v);
	}
	return DG_OK;
}

static enum dg_status fetch_names(const json_t *body, const char ***names, int *n,
				  struct dg_err *err)
{
	const json_t *f = json_object_get(body, "fetch");
	json_t *v;
	size_t i;

	*n = 0;
	*names = calloc(json_array_size(f) + 1, sizeof **names);
	if (!*names)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if (f && !json_is_array(f))
		return dg_err_set(err, DG_EINVAL, "job \"fetch\" must be an array of names");
	json_array_foreach(f, i, v) {
		if (!json_is_string(v))
			return dg_err_set(err, DG_EINVAL, "job \"fetch\"[%zu] must be a string", i);
		(*names)[(*n)++] = json_string_value(v);
	}
	return DG_OK;
}

/* A feed value for fed node ref, checked against its inferred type. */
static enum dg_status check_feed(const struct job *j, int i, const struct dg_tensor *t,
				 struct dg_err *err)
{
	struct dg_edge e;

	if (dg_graph_ref(j->g, j->part.feeds[i].ref, &e, err) != DG_OK)
		return err ? err->code : DG_EINVAL;
	if (!dg_exec_type_ok(&j->g->nodes[e.node].out[0], t, err)) {
		dg_err_prefix(err, "feed '%s'", j->part.feeds[i].ref);
		return err ? err->code : DG_EINVAL;
	}
	return DG_OK;
}

static enum dg_status literal_feeds(struct job *j, const json_t *body, struct dg_err *err)
{
	const json_t *feeds = json_object_get(body, "feeds");
	int i = 0;
	const char *k;
	json_t *v;

	json_object_foreach((json_t *)feeds, k, v) {
		struct dg_edge e;
		(void)k;
		if (dg_graph_ref(j->g, j->part.feeds[i].ref, &e, err) != DG_OK)
			return err ? err->code : DG_EINVAL;
		j->feeds[i] = dg_json_to_tensor(v, &j->g->nodes[e.node].out[0].dtype, err);
		if (!j->feeds[i]) {
			dg_err_prefix(err, "feed '%s'", j->part.feeds[i].ref);
			return err ? err->code : DG_EINVAL;
		}
		if (check_feed(j, i, j->feeds[i], err) != DG_OK)
			return err ? err->code : DG_EINVAL;
		i++;
	}
	return DG_OK;
}

/* The job's integer key, when given, into *out: from lo (said with lo_note)
 * to hi, else DG_EINVAL naming the key and the range. */
static enum dg_status int_key(const json_t *body, const char *key, int64_t lo, int64_t hi,
			      const char *lo_note, int64_t *out, struct dg_err *err)
{
	const json_t *v = json_object_get(body, key);

	if (!v)
		return DG_OK;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return dg_err_set(err, DG_EINVAL, "job \"%s\" must be an integer from %" PRId64
				  "%s to %" PRId64, key, lo, lo_note, hi);
	*out = json_integer_value(v);
	return DG_OK;
}

static enum dg_status job_options(struct job *j, const json_t *body, struct place_opts *po,
				  bool soft_default, struct dg_err *err)
{
	const json_t *v;
	const char *s;

	j->steps = 1;
	j->timeout_ms = WORKER_DEFAULT_TIMEOUT_MS;
	j->retry_ms = JOB_RETRY_MS;
	po->soft_placement = soft_default;
	if (int_key(body, "steps", 1, MASTER_MAX_STEPS, "", &j->steps, err) != DG_OK ||
	    int_key(body, "timeout_ms", 1, WORKER_MAX_TIMEOUT_MS, "", &j->timeout_ms,
		    err) != DG_OK ||
	    int_key(body, "retry_ms", 0, JOB_MAX_RETRY_MS, " (no retry)", &j->retry_ms,
		    err) != DG_OK)
		return DG_EINVAL;
	if ((v = json_object_get(body, "soft_placement"))) {
		if (!json_is_boolean(v))
			return dg_err_set(err, DG_EINVAL, "job \"soft_placement\" must be a "
					  "boolean");
		po->soft_placement = json_is_true(v);
	}
	if ((v = json_object_get(body, "vars"))) {
		s = json_string_value(v);
		if (s && strcmp(s, "bytes") == 0)
			po->vars = PLACE_VARS_BYTES;
		else if (s && strcmp(s, "round_robin") == 0)
			po->vars = PLACE_VARS_ROUND_ROBIN;
		else
			return dg_err_set(err, DG_EINVAL, "job \"vars\" must be \"bytes\" or "
					  "\"round_robin\"");
	}
	return DG_OK;
}

/* For graphs too large to list node by node: one line per fragment. Owned. */
static char *explain_summary(const struct master *m, const struct job *j)
{
	struct dg_buf b;
	char dev[128];

	dg_buf_init(&b);
	dg_buf_printf(&b, NULL, "%d nodes: too many to list; per task:\n", j->g->n_nodes);
	for (int i = 0; i < j->part.n_frags; i++) {
		place_device_name(m->cluster, j->part.frags[i].task, dev, sizeof dev);
		dg_buf_printf(&b, NULL, "fragment %s (%s): %d nodes\n", dev,
			      m->cluster->tasks[j->part.frags[i].task].address,
			      j->part.frags[i].n_nodes);
	}
	return b.data ? dg_buf_steal(&b, NULL) : NULL;
}

/* The per-feed, per-fetch and per-fragment arrays of j->part. */
static enum dg_status job_arrays(struct job *j, struct dg_err *err)
{
	j->feeds = calloc((size_t)j->part.n_feeds + 1, sizeof *j->feeds);
	j->results = calloc((size_t)j->part.n_fetch + 1, sizeof *j->results);
	j->conns = calloc((size_t)j->part.n_frags + 1, sizeof *j->conns);
	j->frag_id = calloc((size_t)j->part.n_frags + 1, sizeof *j->frag_id);
	j->init_id = calloc((size_t)j->part.n_init + 1, sizeof *j->init_id);
	if (!j->feeds || !j->results || !j->conns || !j->frag_id || !j->init_id)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

/* Parse, place and partition body into j. */
/* The body is an object with a "graph" object and only known keys. */
static enum dg_status check_keys(const json_t *body, struct dg_err *err)
{
	static const char *const keys[] = { "graph", "fetch", "feeds", "upload", "steps",
					    "timeout_ms", "retry_ms", "soft_placement", "vars",
					    "start", "training" };
	const char *k;
	json_t *v;

	if (!json_is_object(body) || !json_is_object(json_object_get(body, "graph"))) {
		dg_err_set(err, DG_EINVAL, "a job is a JSON object with a \"graph\" object");
		dg_err_hint(err, "see doc/http-api.md, section Executor and master");
		return DG_EINVAL;
	}
	json_object_foreach((json_t *)body, k, v) {
		bool known = false;
		for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
			known |= strcmp(k, keys[i]) == 0;
		if (!known)
			return dg_err_set(err, DG_EINVAL, "unknown job key '%.64s'", k);
	}
	return DG_OK;
}

json_t *master_probe_existing(struct master *m, const enum dg_status *reach)
{
	json_t *o = json_object();

	/* where variables live: the ps tasks, or every task without a ps job */
	bool has_ps = dg_cluster_job_size(m->cluster, "ps") > 0;

	for (int t = 0; o && t < m->cluster->n_tasks; t++) {
		struct dg_var_info *vars = NULL;
		int n = 0;
		if ((has_ps && strcmp(m->cluster->tasks[t].job, "ps") != 0) || reach[t] != DG_OK)
			continue;
		struct dg_client *c = dg_client_new(m->cluster->tasks[t].address, m->token, NULL);
		json_t *queues = NULL, *q;
		size_t k;
		if (c && dg_var_list(c, "", &vars, &n, NULL) == DG_OK)
			for (int i = 0; i < n; i++)
				json_object_set_new(o, vars[i].name, json_integer(t));
		/* Queues as "queue:NAME" (place.c): a queue fed from outside stays
		 * where it is. */
		if (c && dg_queue_list(c, &queues, NULL) == DG_OK)
			json_array_foreach(json_object_get(queues, "queues"), k, q) {
				char key[DG_VAR_NAME_MAX + 8];
				const char *name = json_string_value(json_object_get(q, "name"));
				snprintf(key, sizeof key, "queue:%s", name ? name : "");
				if (name)
					json_object_set_new(o, key, json_integer(t));
			}
		json_decref(queues);
		free(vars);
		dg_client_free(c);
	}
	return o;
}

/* A job of plain steps: the graph placed and cut with the body's feeds and
 * fetches, its explanation, its literal feeds. */
static enum dg_status build_steps(struct master *m, struct job *j, const json_t *body,
				  struct place_opts *po, const enum dg_status *reach,
				  const struct dg_err *errs, struct dg_err *err)
{
	const char **feeds = NULL, **fetch = NULL;
	int n_feeds = 0, n_fetch = 0;
	enum dg_status st;

	/* Variables and queues that exist stay where they are: a later step of
	 * the same Session must find what an earlier one wrote, whatever the
	 * bytes on each ps say now. */
	bool stateful = false;
	for (int n = 0; n < j->g->n_nodes && !stateful; n++)
		stateful = master_is_variable(&j->g->nodes[n]) || master_is_queue(&j->g->nodes[n]);
	json_t *existing = NULL;
	if (stateful && !(existing = master_probe_existing(m, reach)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	po->existing = existing;
	if ((st = feed_names(body, &feeds, &n_feeds, err)) != DG_OK ||
	    (st = fetch_names(body, &fetch, &n_fetch, err)) != DG_OK ||
	    (st = place_graph(j->g, m->cluster, po, &j->pl, err)) != DG_OK ||
	    (st = place_partition(j->g, m->cluster, &j->pl, master_self(m), feeds, n_feeds, fetch,
				  n_fetch, &j->part, err)) != DG_OK)
		goto out;
	j->explain = j->g->n_nodes <= JOB_EXPLAIN_MAX_NODES ?
		     place_explain(j->g, m->cluster, &j->pl, &j->part) : explain_summary(m, j);
	if (!j->explain) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if ((st = job_arrays(j, err)) == DG_OK && (st = literal_feeds(j, body, err)) == DG_OK)
		st = job_check_used(m, j, reach, errs, err);
out:
	po->existing = NULL;
	json_decref(existing);
	free(feeds);
	free(fetch);
	return st;
}

static enum dg_status job_build(struct master *m, struct job *j, const json_t *body,
				struct dg_err *err)
{
	int nt = m->cluster->n_tasks;
	struct place_opts po = { 0 };
	int64_t *bytes = calloc((size_t)nt + 1, sizeof *bytes);
	bool *gpu = calloc((size_t)nt + 1, sizeof *gpu);
	enum dg_status *reach = calloc((size_t)nt + 1, sizeof *reach);
	struct dg_err *errs = calloc((size_t)nt + 1, sizeof *errs);
	bool training = json_object_get(body, "training") ||
			json_object_get(json_object_get(body, "graph"), "training");
	enum dg_status st;

	j->task_epoch = calloc((size_t)nt + 1, sizeof *j->task_epoch);
	if (!bytes || !gpu || !reach || !errs || !j->task_epoch)
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	else
		st = check_keys(body, err);
	if (st == DG_OK)
		st = job_options(j, body, &po, m->soft_placement, err);
	if (st == DG_OK && !training &&
	    !(j->g = dg_graph_from_json(json_object_get(body, "graph"), master_op_find, err)))
		st = err ? err->code : DG_EINVAL;
	if (st == DG_OK && !training && master_has_minimize(j->g))
		st = master_lower_minimize(&j->g, err);
	if (st == DG_OK) {
		/* The graph is valid: now ask every task what it holds and has. */
		probe_tasks(m, bytes, gpu, reach, errs, j->task_epoch);
		po.task_bytes = bytes;
		po.task_gpu = gpu;
		if (training && (st = train_build(m, j, body, &po, reach, errs, err)) == DG_OK)
			st = job_arrays(j, err);
		else if (!training)
			st = build_steps(m, j, body, &po, reach, errs, err);
	}
	free(bytes);
	free(gpu);
	free(reach);
	free(errs);
	return st;
}

enum dg_status master_job_submit(struct master *m, const json_t *body, char *id, size_t id_len,
				 struct dg_err *err)
{
	struct job *j = calloc(1, sizeof *j);
	const json_t *start = json_object_get(body, "start");
	json_t *expanded = NULL;
	enum dg_status st;

	if (!j)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	j->m = m;
	j->t_created = master_now_ms();
	if (master_self(m) < 0) {
		st = dg_err_set(err, DG_EINVAL, "this server (/job:%s/task:%d) is not in its own "
				"cluster spec, so it cannot be a master", m->job, m->task);
		job_free(j);
		return st;
	}
	/* Queue ops take their components from the Queue they name: a copy of
	 * the body with them filled in, only when there are queue ops. */
	if (master_graph_has_queue_ops(json_object_get(body, "graph"))) {
		if (!(expanded = json_deep_copy(body))) {
			job_free(j);
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		}
		if ((st = master_queue_expand(json_object_get(expanded, "graph"), err)) != DG_OK) {
			json_decref(expanded);
			job_free(j);
			return st;
		}
		body = expanded;
	}
	st = job_build(m, j, body, err);
	json_decref(expanded);
	expanded = NULL;
	body = NULL;
	if (st != DG_OK) {
		job_free(j);
		return st;
	}
	pthread_mutex_lock(&m->mu);
	st = job_table_add(m, j, err);
	if (st == DG_OK) {
		snprintf(id, id_len, "%s", j->id);
		job_event_locked(m, j, json_pack("{s:s, s:i, s:I}", "event", "created", "fragments",
						 j->part.n_frags + (j->tr ? j->tr->n_reps : 0),
						 "steps", (json_int_t)j->steps));
	}
	pthread_mutex_unlock(&m->mu);
	if (st != DG_OK) {
		job_free(j);
		return st;
	}
	if (start && !json_is_true(start))
		return DG_OK;
	return master_job_start(m, id, err);
}

enum dg_status master_job_feed(struct master *m, const char *id, const char *name,
			       struct dg_tensor *t, struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	enum dg_status st = DG_OK;
	int i;

	if (!j) {
		dg_tensor_free(t);
		return DG_ENOTFOUND;
	}
	for (i = 0; i < j->part.n_feeds; i++)
		if (strcmp(j->part.feeds[i].ref, name) == 0)
			break;
	if (i == j->part.n_feeds) {
		st = dg_err_set(err, DG_ENOTFOUND, "job %s has no feed '%.64s'", id, name);
		dg_err_hint(err, "name the feed in the job's \"upload\" list when creating it");
	} else {
		st = check_feed(j, i, t, err);
	}
	pthread_mutex_lock(&m->mu);
	if (st == DG_OK && j->state != JOB_CREATED)
		st = dg_err_set(err, DG_ECONFLICT, "job %s is %s; feeds are uploaded before it "
				"starts", id, job_state_names[j->state]);
	if (st == DG_OK) {
		dg_tensor_free(j->feeds[i]);
		j->feeds[i] = t;
		t = NULL;
	}
	job_put_locked(j);
	pthread_mutex_unlock(&m->mu);
	dg_tensor_free(t);
	return st;
}

enum dg_status master_job_start(struct master *m, const char *id, struct dg_err *err)
{
	struct job *j = job_get(m, id, err);
	enum dg_status st = DG_OK;
	bool claimed = false;

	if (!j)
		return DG_ENOTFOUND;
	pthread_mutex_lock(&m->mu);
	if (j->state != JOB_CREATED)
		st = dg_err_set(err, DG_ECONFLICT, "job %s is already %s", id,
				job_state_names[j->state]);
	for (int i = 0; st == DG_OK && i < j->part.n_feeds; i++)
		if (!j->feeds[i] && j->part.feeds[i].task >= 0) {
			st = dg_err_set(err, DG_EINVAL, "job %s: feed '%s' was not uploaded", id,
					j->part.feeds[i].ref);
			dg_err_hint(err, "PUT /v1/jobs/%s/feeds/%s first", id,
				    j->part.feeds[i].ref);
		}
	if (st == DG_OK) {
		j->state = JOB_RUNNING;   /* claims the job: a second start is refused */
		j->t_started = master_now_ms();
		claimed = true;
	}
	pthread_mutex_unlock(&m->mu);
	/* A plain job's queues exist before its fragments run: created on their
	 * ps when missing, kept (with what they hold) when there with the same
	 * settings, so that one job enqueues and a later one dequeues. A
	 * training job creates its queue in its thread (train_feed.c). */
	for (int n = 0; st == DG_OK && !j->tr && n < j->g->n_nodes; n++)
		if (master_is_queue(&j->g->nodes[n]))
			st = master_queue_create(m, &j->g->nodes[n], j->pl.task[n], false, err);
	/* A training job registers its fragments in its thread (train_setup):
	 * after the variables are initialised and their sync steps read. */
	for (int i = 0; st == DG_OK && !j->tr && i < j->part.n_init; i++)
		st = step_register(m, &j->part.init[i], j->init_id[i], err);
	for (int i = 0; st == DG_OK && !j->tr && i < j->part.n_frags; i++)
		st = step_register(m, &j->part.frags[i], j->frag_id[i], err);
	if (st == DG_OK) {
		pthread_t th;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_mutex_lock(&m->mu);
		j->refs++;   /* the thread's reference, dropped by job_main */
		m->n_threads++;
		if (pthread_create(&th, &attr, j->tr ? train_main : job_main, j) == 0) {
			job_event_locked(m, j, json_pack("{s:s}", "event", "started"));
		} else {
			j->refs--;
			m->n_threads--;
			st = dg_err_set(err, DG_ENOMEM, "cannot start a thread for job %s", id);
		}
		pthread_mutex_unlock(&m->mu);
		pthread_attr_destroy(&attr);
		if (st != DG_OK) {
			step_unregister_all(m, j);
			job_finish(m, j, st, err);
		}
	} else if (claimed) {
		step_unregister_all(m, j);
		job_finish(m, j, st, err);
	}
	job_put(m, j);
	return st;
}
