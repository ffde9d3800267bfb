/* Building a training job (doc/training.md): the training section parsed,
 * the plan built (train.c: autodiff and the replicas' graphs), each replica
 * placed and cut into one step fragment on its task, the trained variables
 * and the job's figures (steps, epochs, evals). Neighbours: submit.c (its
 * caller), train_run.c (what runs the result). */
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

/* ------------------------------------------------------------ the table */


/* ------------------------------------------------------------ training: build */

/* The fragment of rp holding the _Send of fetch key `key` (fetch_local: on
 * the task that produces the value), or -1. */
static int fetch_fragment(const struct replica *rp, const char *key)
{
	for (int f = 0; f < rp->part.n_frags; f++) {
		size_t i;
		json_t *n;
		json_array_foreach(json_object_get(rp->part.frags[f].doc, "nodes"), i, n) {
			const json_t *a = json_object_get(n, "attrs");
			const char *k = json_string_value(json_object_get(a, "key"));
			const char *op = json_string_value(json_object_get(n, "op"));
			if (k && op && strcmp(op, "_Send") == 0 && strcmp(k, key) == 0)
				return f;
		}
	}
	return -1;
}

/* Which fragment of rp collects which of the loss and metrics (they may be
 * computed on different tasks of a replica's group). */
static enum dg_status split_collect(struct replica *rp, int r, struct dg_err *err)
{
	int n = rp->part.n_fetch;

	if (!(rp->frags = calloc((size_t)rp->part.n_frags + 1, sizeof *rp->frags)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int f = 0; f < rp->part.n_frags; f++) {
		rp->frags[f].collect = calloc((size_t)n + 1, sizeof *rp->frags[f].collect);
		rp->frags[f].collect_idx = calloc((size_t)n + 1, sizeof *rp->frags[f].collect_idx);
		if (!rp->frags[f].collect || !rp->frags[f].collect_idx)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		int f = fetch_fragment(rp, rp->part.fetch_keys[i]);
		struct rep_frag *rf;
		if (f < 0)
			return dg_err_set(err, DG_EINTERNAL, "replica %d: no fragment sends %s", r,
					  rp->part.fetch_keys[i]);
		rf = &rp->frags[f];
		rf->collect[rf->n_collect] = rp->part.fetch_keys[i];
		rf->collect_idx[rf->n_collect++] = i;
	}
	return DG_OK;
}

/* Place and cut replica r's graph: one step fragment on each task it uses
 * (targets: the ApplyGradient nodes; fetches sent to the producing task). */
static enum dg_status build_replica(struct master *m, struct train *tr, int r,
				    const struct place_opts *po, struct dg_err *err)
{
	const struct train_replica *tp = &tr->plan.rep[r];
	struct replica *rp = &tr->reps[r];
	struct partition_opts ppo = { 0 };
	struct place_opts o = *po;
	enum dg_status st;

	rp->task = tr->plan.replica_task[r];
	if (!(rp->g = dg_graph_from_json(tp->doc, master_op_find, err))) {
		dg_err_prefix(err, "replica %d's graph", r);
		return err ? err->code : DG_EINVAL;
	}
	o.reasons = tp->reasons;
	o.colocate = tp->colocate;
	if ((st = place_graph(rp->g, m->cluster, &o, &rp->pl, err)) != DG_OK)
		return st;
	ppo.fetch = (const char *const *)tp->fetch;
	ppo.n_fetch = tp->n_fetch;
	ppo.targets = (const char *const *)tp->targets;
	ppo.n_targets = tp->n_targets;
	ppo.fetch_local = true;
	ppo.master_task = master_self(m);
	st = place_partition_ex(rp->g, m->cluster, &rp->pl, &ppo, &rp->part, err);
	if (st != DG_OK)
		return st;
	if (rp->part.n_fetch != tp->n_fetch)
		return dg_err_set(err, DG_EINTERNAL, "replica %d: %d fetch keys for %d fetches",
				  r, rp->part.n_fetch, tp->n_fetch);
	return split_collect(rp, r, err);
}

/* The trained variables (name on the ps, task) from replica 0's placement. */
static enum dg_status train_vars(struct train *tr, struct dg_err *err)
{
	const struct replica *rp = &tr->reps[0];

	tr->n_vars = tr->plan.n_vars;
	tr->var_name = calloc((size_t)tr->n_vars + 1, sizeof *tr->var_name);
	tr->var_task = calloc((size_t)tr->n_vars + 1, sizeof *tr->var_task);
	tr->var_base = calloc((size_t)tr->n_vars + 1, sizeof *tr->var_base);
	if (!tr->var_name || !tr->var_task || !tr->var_base)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int v = 0; v < tr->n_vars; v++) {
		int n = dg_graph_find(rp->g, tr->plan.var_nodes[v]);
		const char *name;
		if (n < 0)
			return dg_err_set(err, DG_EINTERNAL, "trained variable '%s' is not in "
					  "replica 0's graph", tr->plan.var_nodes[v]);
		if (dg_attr_string(rp->g->nodes[n].attrs, "var", rp->g->nodes[n].name, &name,
				   err) != DG_OK)
			return DG_EINVAL;
		if (!(tr->var_name[v] = strdup(name)))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		tr->var_task[v] = rp->pl.task[n];
	}
	return DG_OK;
}

/* The header of the metrics CSV and the running figures. */
static enum dg_status train_figures(struct job *j, struct dg_err *err)
{
	struct train *tr = j->tr;
	int nm = tr->n_metrics;

	tr->sum_metric = calloc((size_t)nm + 1, sizeof *tr->sum_metric);
	tr->metric = calloc((size_t)nm + 1, sizeof *tr->metric);
	tr->eval = calloc((size_t)j->part.n_fetch + 1, sizeof *tr->eval);
	if (!tr->sum_metric || !tr->metric || !tr->eval)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	tr->loss = NAN;
	for (int i = 0; i < nm; i++)
		tr->metric[i] = NAN;
	for (int i = 0; i < j->part.n_fetch; i++)
		tr->eval[i] = NAN;
	dg_buf_init(&tr->csv);
	dg_buf_printf(&tr->csv, NULL, "step,time_s,epoch,loss");
	for (int i = 0; i < nm; i++)
		dg_buf_printf(&tr->csv, NULL, ",%s", tr->spec.metrics[i]);
	dg_buf_printf(&tr->csv, NULL, ",examples_per_s");
	for (int i = 0; i < j->part.n_fetch; i++)
		dg_buf_printf(&tr->csv, NULL, ",%s", j->part.fetch_keys[i] + 6);
	return dg_buf_printf(&tr->csv, err, "\n");
}

/* Explain text: replica 0 (the others are alike) and the eval. Owned. */
static char *train_explain(const struct master *m, const struct job *j)
{
	const struct replica *rp = &j->tr->reps[0];
	struct dg_buf b;
	char *part;

	dg_buf_init(&b);
	dg_buf_printf(&b, NULL, "training: %d replica(s) of %d task(s), %" PRId64 " steps "
		      "each, %s\n", j->tr->n_reps, j->tr->plan.group, j->tr->steps,
		      j->tr->spec.sync ? "sync" : "async");
	dg_buf_printf(&b, NULL, "replica 0 (replica r runs on the tasks of group r and its "
		      "shard; devices shift with the group):\n");
	part = rp->g->n_nodes <= JOB_EXPLAIN_MAX_NODES ?
	       place_explain(rp->g, m->cluster, &rp->pl, &rp->part) : NULL;
	dg_buf_printf(&b, NULL, "%s", part ? part : "(too many nodes to list)\n");
	free(part);
	if (j->g) {
		part = j->g->n_nodes <= JOB_EXPLAIN_MAX_NODES ?
		       place_explain(j->g, m->cluster, &j->pl, &j->part) : NULL;
		dg_buf_printf(&b, NULL, "eval:\n%s", part ? part : "(too many nodes to list)\n");
		free(part);
	}
	return b.data ? dg_buf_steal(&b, NULL) : NULL;
}

/* A training job: the "training" section (the job's key, else the graph's)
 * parsed, the plan built (master/train.c), each replica placed and cut, the
 * eval graph placed and cut like an ordinary one-step job (j->g, j->part: its
 * fetched values are the job's results). */
/* Every replica placed and cut (build_replica); existing (the variables that
 * exist, po->existing) gains replica 0's placement, which the others and the
 * eval use. Then what every replica collects and replica 0's init ids. */
static enum dg_status build_replicas(struct master *m, struct train *tr, struct place_opts *po,
				     json_t *existing, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	if (!(tr->reps = calloc((size_t)tr->plan.n_replicas + 1, sizeof *tr->reps)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	tr->n_reps = tr->plan.n_replicas;
	for (int r = 0; st == DG_OK && r < tr->n_reps; r++) {
		st = build_replica(m, tr, r, po, err);
		for (int n = 0; st == DG_OK && r == 0 && n < tr->reps[0].g->n_nodes; n++) {
			const struct dg_node *nd = &tr->reps[0].g->nodes[n];
			const char *var;
			char key[DG_GRAPH_MAX_NAME + 8];
			if (strcmp(nd->op->name, "Variable") == 0 &&
			    dg_attr_string(nd->attrs, "var", nd->name, &var, err) == DG_OK)
				json_object_set_new(existing, var,
						    json_integer(tr->reps[0].pl.task[n]));
			if (master_is_queue(nd)) {
				snprintf(key, sizeof key, "queue:%s", master_queue_ps_name(nd));
				json_object_set_new(existing, key,
						    json_integer(tr->reps[0].pl.task[n]));
			}
		}
	}
	if (st != DG_OK)
		return st;
	tr->collect = (const char **)tr->reps[0].part.fetch_keys;
	tr->n_collect = tr->reps[0].part.n_fetch;
	tr->n_metrics = tr->n_collect - 1 - tr->plan.n_extra;
	if (tr->n_collect < 1)
		return dg_err_set(err, DG_EINTERNAL, "the training plan collects no loss");
	tr->reps[0].init_id = calloc((size_t)tr->reps[0].part.n_init + 1,
				     sizeof *tr->reps[0].init_id);
	if (!tr->reps[0].init_id)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

/* The queue's task (replica 0's placement of it) and the feeder's graph
 * placed (its Queue where replica 0 put it: po->existing) and cut, its
 * target the feeder node. */
static enum dg_status build_feeder(struct master *m, struct train *tr,
				   const struct place_opts *po, struct dg_err *err)
{
	const struct replica *rp = &tr->reps[0];
	const char *target;
	int q;
	enum dg_status st;

	tr->queue_task = -1;
	if (!tr->plan.queue)
		return DG_OK;
	if ((q = dg_graph_find(rp->g, tr->plan.queue)) < 0 || rp->pl.task[q] < 0)
		return dg_err_set(err, DG_EINTERNAL, "queue '%s' is not placed", tr->plan.queue);
	tr->queue_task = rp->pl.task[q];
	if (strcmp(m->cluster->tasks[tr->queue_task].job, "ps") != 0)
		dg_log(DG_LOG_INFO, "master", "queue '%s' is held by %s, not a ps task",
		       tr->plan.queue, task_label(m, tr->queue_task).s);
	if (!tr->plan.feed_doc)
		return DG_OK;
	if (!(tr->feed_g = dg_graph_from_json(tr->plan.feed_doc, master_op_find, err))) {
		dg_err_prefix(err, "the feeder's graph");
		return err ? err->code : DG_EINVAL;
	}
	if ((st = place_graph(tr->feed_g, m->cluster, po, &tr->feed_pl, err)) != DG_OK)
		return st;
	target = tr->plan.feeder;
	struct partition_opts ppo = { .targets = &target, .n_targets = 1,
				      .master_task = master_self(m) };
	if ((st = place_partition_ex(tr->feed_g, m->cluster, &tr->feed_pl, &ppo, &tr->feed_part,
				     err)) != DG_OK)
		return st;
	if (!(tr->feed_id = calloc((size_t)tr->feed_part.n_frags + 1, sizeof *tr->feed_id)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return DG_OK;
}

/* The eval graph (when the plan has one) placed and cut as the job's own
 * steps: j->g, j->pl, j->part. */
static enum dg_status build_eval(struct master *m, struct job *j, const struct place_opts *po,
				 struct dg_err *err)
{
	const struct train *tr = j->tr;
	enum dg_status st;

	if (!tr->plan.eval_doc)
		return DG_OK;
	if (!(j->g = dg_graph_from_json(tr->plan.eval_doc, master_op_find, err))) {
		dg_err_prefix(err, "the eval graph");
		return err ? err->code : DG_EINVAL;
	}
	if ((st = place_graph(j->g, m->cluster, po, &j->pl, err)) != DG_OK)
		return st;
	return place_partition(j->g, m->cluster, &j->pl, master_self(m), NULL, 0,
			       (const char *const *)tr->spec.eval_fetch, tr->spec.n_eval_fetch,
			       &j->part, err);
}

/* Steps, epochs and the eval interval from the plan and the spec. */
static void train_counts(struct job *j)
{
	struct train *tr = j->tr;

	tr->steps = tr->plan.steps;
	tr->spe = tr->plan.steps_per_epoch;
	tr->epochs = tr->spec.epochs > 0 ? tr->spec.epochs :
		     tr->spe > 0 ? (tr->steps + tr->spe - 1) / tr->spe : 0;
	tr->eval_every = tr->spec.eval_every_steps > 0 ? tr->spec.eval_every_steps :
			 tr->spec.eval_every_epochs > 0 ? tr->spec.eval_every_epochs * tr->spe : 0;
	j->steps = tr->steps;
}

/* The spec and the plan (autodiff, the replicas' graphs: train.c) of the
 * body's training section; the graph's own "training" when the body has
 * none. A training job takes no feeds, fetches or step count of its own. */
static enum dg_status build_plan(struct master *m, struct train *tr, const json_t *body,
				 struct dg_err *err)
{
	const json_t *graph = json_object_get(body, "graph");
	const json_t *section = json_object_get(body, "training");
	json_t *gdoc;
	struct dg_graph *ug;
	enum dg_status st;

	if (json_object_get(body, "feeds") || json_object_get(body, "upload") ||
	    json_object_get(body, "fetch") || json_object_get(body, "steps")) {
		st = dg_err_set(err, DG_EINVAL, "a training job takes no \"feeds\", \"upload\", "
				"\"fetch\" or \"steps\"");
		dg_err_hint(err, "read data with IdxReader/NpyReader/CsvReader; set training.steps or "
			    "training.eval.fetch instead (doc/training.md)");
		return st;
	}
	if (!section)
		section = json_object_get(graph, "training");
	if ((st = train_spec_parse(section, &tr->spec, err)) != DG_OK)
		return st;
	if (!(gdoc = json_copy((json_t *)graph)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	json_object_del(gdoc, "training");
	ug = dg_graph_from_json(gdoc, master_op_find, err);
	json_decref(gdoc);
	if (!ug)
		return err ? err->code : DG_EINVAL;
	if (master_has_minimize(ug)) {
		dg_graph_free(ug);
		dg_err_set(err, DG_EINVAL, "a training job's graph has a Minimize node: the "
			   "training section differentiates its loss itself");
		dg_err_hint(err, "remove the Minimize node, or submit it without \"training\" "
			    "to run one step of it");
		return DG_EINVAL;
	}
	st = train_plan_build(ug, &tr->spec, m->cluster, &tr->plan, err);
	dg_graph_free(ug);
	return st;
}

enum dg_status train_build(struct master *m, struct job *j, const json_t *body,
			   struct place_opts *po, const enum dg_status *reach,
			   const struct dg_err *errs, struct dg_err *err)
{
	json_t *existing;
	enum dg_status st;

	if (!(j->tr = calloc(1, sizeof *j->tr)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if ((st = build_plan(m, j->tr, body, err)) != DG_OK)
		return st;
	if (!(existing = master_probe_existing(m, reach)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	po->existing = existing;
	if ((st = build_replicas(m, j->tr, po, existing, err)) == DG_OK &&
	    (st = train_vars(j->tr, err)) == DG_OK &&
	    (st = build_feeder(m, j->tr, po, err)) == DG_OK)
		st = build_eval(m, j, po, err);
	po->existing = NULL;
	json_decref(existing);
	if (st != DG_OK)
		return st;
	train_counts(j);
	if ((st = train_figures(j, err)) != DG_OK)
		return st;
	if (!(j->explain = train_explain(m, j)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return job_check_used(m, j, reach, errs, err);
}
