/* The training transformation (train.h, doc/training.md): parse a graph's
 * "training" section, then build one replica graph per compute task from the
 * user's forward graph: autodiff of the loss w.r.t. the float Variables it
 * depends on, ApplyGradient nodes that push the gradients to the ps, every
 * computing node pinned to the replica's task, ShardBatch sharded by replica.
 * Pure functions over jansson documents: the master's job loop does the I/O. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/autodiff.h"
#include "dg/place.h"
#include "dg/train.h"
#include "train_internal.h"

/* ------------------------------------------------------------ spec parsing */

/* obj must be a JSON object (NULL: absent) whose every key is in keys; path
 * names obj in the message. */
static enum dg_status check_object(const json_t *obj, const char *path,
				   const char *const *keys, struct dg_err *err)
{
	const char *k;
	json_t *v;
	char list[256];
	size_t off = 0;

	if (!json_is_object(obj))
		return dg_err_set(err, DG_EINVAL, "%s must be an object, got %s", path,
				  dg_json_kind(obj, true));
	json_object_foreach((json_t *)obj, k, v) {
		bool ok = false;
		for (int i = 0; keys[i] && !ok; i++)
			ok = strcmp(keys[i], k) == 0;
		if (ok)
			continue;
		list[0] = '\0';
		for (int i = 0; keys[i] && off + 1 < sizeof list; i++) {
			int w = snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "",
					 keys[i]);
			off += w > 0 ? (size_t)w : 0;
		}
		dg_err_set(err, DG_EINVAL, "%s has unknown key '%.64s'", path, k);
		dg_err_hint(err, "its keys are: %s (see doc/training.md)", list);
		return DG_EINVAL;
	}
	return DG_OK;
}

static enum dg_status get_int(const json_t *obj, const char *path, const char *key,
			      int64_t min, int64_t max, int64_t *out, struct dg_err *err)
{
	json_t *v = json_object_get(obj, key);
	int64_t x;

	if (!v)
		return DG_OK;
	if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
	    fabs(json_real_value(v)) < 9e15)
		x = (int64_t)json_real_value(v);
	else if (json_is_integer(v))
		x = json_integer_value(v);
	else
		return dg_err_set(err, DG_EINVAL, "%s.%s must be an integer, got %s", path, key,
				  dg_json_kind(v, true));
	if (x < min || x > max) {
		dg_err_set(err, DG_EINVAL, "%s.%s is %lld; it must be in %lld..%lld", path, key,
			   (long long)x, (long long)min, (long long)max);
		return DG_EINVAL;
	}
	*out = x;
	return DG_OK;
}

/* A number in the range min..max; open: the bounds themselves are excluded
 * (bit 0: min, bit 1: max). max >= 1e300 means no upper bound. */
static enum dg_status get_num(const json_t *obj, const char *path, const char *key, double min,
			      int open, double max, double *out, struct dg_err *err)
{
	bool min_open = open & 1, max_open = open & 2;
	json_t *v = json_object_get(obj, key);
	double x;

	if (!v)
		return DG_OK;
	if (!json_is_number(v))
		return dg_err_set(err, DG_EINVAL, "%s.%s must be a number, got %s", path, key,
				  dg_json_kind(v, true));
	x = json_number_value(v);
	if (!isfinite(x) || x < min || (min_open && x <= min) || x > max ||
	    (max_open && x >= max)) {
		if (max >= 1e300)
			dg_err_set(err, DG_EINVAL, "%s.%s is %g; it must be %s %g", path, key, x,
				   min_open ? ">" : ">=", min);
		else
			dg_err_set(err, DG_EINVAL, "%s.%s is %g; it must be in %s%g, %g%s", path,
				   key, x, min_open ? "(" : "[", min, max, max_open ? ")" : "]");
		return DG_EINVAL;
	}
	*out = x;
	return DG_OK;
}

static enum dg_status get_bool(const json_t *obj, const char *path, const char *key, bool *out,
			       struct dg_err *err)
{
	json_t *v = json_object_get(obj, key);

	if (!v)
		return DG_OK;
	if (!json_is_boolean(v))
		return dg_err_set(err, DG_EINVAL, "%s.%s must be true or false, got %s", path, key,
				  dg_json_kind(v, true));
	*out = json_is_true(v);
	return DG_OK;
}

/* A string that is one of choices, copied into out (n bytes). */
static enum dg_status get_choice(const json_t *obj, const char *path, const char *key,
				 const char *const *choices, char *out, size_t n,
				 struct dg_err *err)
{
	json_t *v = json_object_get(obj, key);
	const char *s;

	if (!v)
		return DG_OK;
	if (!json_is_string(v))
		return dg_err_set(err, DG_EINVAL, "%s.%s must be a string, got %s", path, key,
				  dg_json_kind(v, true));
	s = json_string_value(v);
	for (int i = 0; choices[i]; i++)
		if (strcmp(s, choices[i]) == 0) {
			snprintf(out, n, "%s", s);
			return DG_OK;
		}
	dg_err_set(err, DG_EINVAL, "%s.%s is '%.64s'", path, key, s);
	dg_err_hint(err, "use %s%s%s%s%s", choices[0], choices[1] ? " or " : "",
		    choices[1] ? choices[1] : "", choices[1] && choices[2] ? " or " : "",
		    choices[1] && choices[2] ? choices[2] : "");
	return DG_EINVAL;
}

/* A non-empty array of non-empty strings into an owned array. */
static enum dg_status get_refs(const json_t *obj, const char *path, const char *key,
			       bool allow_empty, char ***out, int *n_out, struct dg_err *err)
{
	json_t *v = json_object_get(obj, key), *e;
	size_t i;

	if (!v)
		return DG_OK;
	if (!json_is_array(v) || (!allow_empty && json_array_size(v) == 0) ||
	    json_array_size(v) > 4096)
		return dg_err_set(err, DG_EINVAL, "%s.%s must be %sarray of value refs, got %s",
				  path, key, allow_empty ? "an " : "a non-empty ",
				  dg_json_kind(v, true));
	*out = calloc(json_array_size(v) + 1, sizeof **out);
	if (!*out)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	json_array_foreach(v, i, e) {
		if (!json_is_string(e) || !json_string_value(e)[0])
			return dg_err_set(err, DG_EINVAL, "%s.%s[%zu] must be a value ref "
					  "(\"node\" or \"node:k\"), got %s", path, key, i,
					  dg_json_kind(e, true));
		(*out)[i] = strdup(json_string_value(e));
		if (!(*out)[i])
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		*n_out = (int)i + 1;
	}
	return DG_OK;
}

static const char *const top_keys[] = {
	"loss", "metrics", "optimizer", "lr_schedule", "epochs", "steps", "batch", "replicas",
	"mode", "backup", "checkpoint_secs", "eval", "reinit", "replica_group", NULL,
};
static const char *const opt_keys[] = {
	"rule", "lr", "momentum", "nesterov", "beta1", "beta2", "eps", NULL,
};
static const char *const sched_keys[] = { "kind", "every", "factor", NULL };
static const char *const eval_keys[] = { "fetch", "every_epochs", "every_steps", "barrier",
					 NULL };
static const char *const rules[] = { "sgd", "momentum", "adam", NULL };
static const char *const kinds[] = { "constant", "step", "exponential", NULL };
static const char *const modes[] = { "async", "sync", NULL };

/* DG_EINVAL for a required key that is absent, with an example as the hint. */
static enum dg_status missing(struct dg_err *err, const char *key, const char *hint)
{
	dg_err_set(err, DG_EINVAL, "%s is missing", key);
	dg_err_hint(err, "%s", hint);
	return DG_EINVAL;
}

/* A key that only applies to some rule: refused elsewhere so typos surface. */
static enum dg_status only_for(const json_t *opt, const char *key, const char *rule,
			       const char *need, struct dg_err *err)
{
	if (!json_object_get(opt, key) || strcmp(rule, need) == 0)
		return DG_OK;
	dg_err_set(err, DG_EINVAL, "training.optimizer.%s applies to rule %s, not %s", key, need,
		   rule);
	dg_err_hint(err, "remove it or use \"rule\": \"%s\"", need);
	return DG_EINVAL;
}

static enum dg_status parse_optimizer(const json_t *opt, struct train_spec *s, struct dg_err *err)
{
	const char *p = "training.optimizer";
	enum dg_status st;

	if (!opt)
		return missing(err, "training.optimizer",
			       "e.g. \"optimizer\": {\"rule\": \"sgd\", \"lr\": 0.1}");
	if ((st = check_object(opt, p, opt_keys, err)) != DG_OK)
		return st;
	if (!json_object_get(opt, "rule"))
		return missing(err, "training.optimizer.rule", "use sgd, momentum or adam");
	if ((st = get_choice(opt, p, "rule", rules, s->rule, sizeof s->rule, err)) != DG_OK)
		return st;
	if ((st = only_for(opt, "momentum", s->rule, "momentum", err)) != DG_OK ||
	    (st = only_for(opt, "nesterov", s->rule, "momentum", err)) != DG_OK ||
	    (st = only_for(opt, "beta1", s->rule, "adam", err)) != DG_OK ||
	    (st = only_for(opt, "beta2", s->rule, "adam", err)) != DG_OK ||
	    (st = only_for(opt, "eps", s->rule, "adam", err)) != DG_OK)
		return st;
	if (strcmp(s->rule, "adam") == 0) {
		s->lr = 0.001;
		s->beta1 = 0.9;
		s->beta2 = 0.999;
		s->eps = 1e-8;
	} else if (!json_object_get(opt, "lr")) {
		dg_err_set(err, DG_EINVAL, "training.optimizer.lr is missing (rule %s)", s->rule);
		dg_err_hint(err, "give the learning rate, e.g. \"lr\": 0.1");
		return DG_EINVAL;
	}
	if (strcmp(s->rule, "momentum") == 0 && !json_object_get(opt, "momentum")) {
		dg_err_set(err, DG_EINVAL, "training.optimizer.momentum is missing (rule "
			   "momentum)");
		dg_err_hint(err, "e.g. \"momentum\": 0.9");
		return DG_EINVAL;
	}
	if ((st = get_num(opt, p, "lr", 0, 1, 1e300, &s->lr, err)) != DG_OK ||
	    (st = get_num(opt, p, "momentum", 0, 2, 1, &s->momentum, err)) != DG_OK ||
	    (st = get_bool(opt, p, "nesterov", &s->nesterov, err)) != DG_OK ||
	    (st = get_num(opt, p, "beta1", 0, 2, 1, &s->beta1, err)) != DG_OK ||
	    (st = get_num(opt, p, "beta2", 0, 2, 1, &s->beta2, err)) != DG_OK)
		return st;
	return get_num(opt, p, "eps", 0, 1, 1e300, &s->eps, err);
}

static enum dg_status parse_schedule(const json_t *v, struct train_spec *s, struct dg_err *err)
{
	const char *p = "training.lr_schedule";
	enum dg_status st;

	if (!v)
		return DG_OK;
	if ((st = check_object(v, p, sched_keys, err)) != DG_OK)
		return st;
	if (!json_object_get(v, "kind"))
		return missing(err, "training.lr_schedule.kind",
			       "use constant, step or exponential");
	if ((st = get_choice(v, p, "kind", kinds, s->schedule, sizeof s->schedule, err)) != DG_OK)
		return st;
	if (strcmp(s->schedule, "constant") == 0) {
		const char *k = json_object_get(v, "every") ? "every" :
				json_object_get(v, "factor") ? "factor" : NULL;
		if (k) {
			dg_err_set(err, DG_EINVAL, "training.lr_schedule.%s applies to kinds step "
				   "and exponential, not constant", k);
			return DG_EINVAL;
		}
		return DG_OK;
	}
	for (int i = 0; i < 2; i++)
		if (!json_object_get(v, i ? "factor" : "every")) {
			dg_err_set(err, DG_EINVAL, "training.lr_schedule.%s is missing (kind %s)",
				   i ? "factor" : "every", s->schedule);
			dg_err_hint(err, "e.g. {\"kind\": \"%s\", \"every\": 1000, "
				    "\"factor\": 0.5}", s->schedule);
			return DG_EINVAL;
		}
	if ((st = get_int(v, p, "every", 1, INT64_MAX, &s->every, err)) != DG_OK)
		return st;
	return get_num(v, p, "factor", 0, 1, 1e300, &s->factor, err);
}

static enum dg_status parse_eval(const json_t *v, struct train_spec *s, struct dg_err *err)
{
	const char *p = "training.eval";
	enum dg_status st;

	if (!v)
		return DG_OK;
	if ((st = check_object(v, p, eval_keys, err)) != DG_OK)
		return st;
	if (!json_object_get(v, "fetch"))
		return missing(err, "training.eval.fetch",
			       "list the values to evaluate, e.g. [\"test_accuracy\"]");
	if (json_object_get(v, "every_epochs") && json_object_get(v, "every_steps")) {
		dg_err_set(err, DG_EINVAL, "training.eval has both every_epochs and every_steps");
		dg_err_hint(err, "give one of them");
		return DG_EINVAL;
	}
	if ((st = get_refs(v, p, "fetch", false, &s->eval_fetch, &s->n_eval_fetch, err)) != DG_OK)
		return st;
	if ((st = get_int(v, p, "every_epochs", 1, INT64_MAX, &s->eval_every_epochs, err)) != DG_OK)
		return st;
	if ((st = get_bool(v, p, "barrier", &s->eval_barrier, err)) != DG_OK)
		return st;
	return get_int(v, p, "every_steps", 1, INT64_MAX, &s->eval_every_steps, err);
}

enum dg_status train_spec_parse(const json_t *training, struct train_spec *out, struct dg_err *err)
{
	const char *p = "training";
	json_t *v;
	int64_t replicas = 0, backup = 0, group = 0;
	char mode[16] = "async";
	enum dg_status st;

	memset(out, 0, sizeof *out);
	snprintf(out->schedule, sizeof out->schedule, "constant");
	out->every = 1;
	out->factor = 1;
	if ((st = check_object(training, p, top_keys, err)) != DG_OK)
		return st;
	v = json_object_get(training, "loss");
	if (!v) {
		dg_err_set(err, DG_EINVAL, "training.loss is missing");
		dg_err_hint(err, "name the float scalar to minimise, e.g. \"loss\": \"loss\"");
		return DG_EINVAL;
	}
	if (!json_is_string(v) || !json_string_value(v)[0])
		return dg_err_set(err, DG_EINVAL, "training.loss must be a value ref (\"node\" or "
				  "\"node:k\"), got %s", dg_json_kind(v, true));
	if (!(out->loss = strdup(json_string_value(v))))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	if ((st = get_refs(training, p, "metrics", true, &out->metrics, &out->n_metrics,
			   err)) != DG_OK)
		return st;
	if ((st = parse_optimizer(json_object_get(training, "optimizer"), out, err)) != DG_OK ||
	    (st = parse_schedule(json_object_get(training, "lr_schedule"), out, err)) != DG_OK)
		return st;
	if (json_object_get(training, "epochs") && json_object_get(training, "steps")) {
		dg_err_set(err, DG_EINVAL, "training has both epochs and steps");
		dg_err_hint(err, "give one of them");
		return DG_EINVAL;
	}
	if (!json_object_get(training, "epochs") && !json_object_get(training, "steps")) {
		dg_err_set(err, DG_EINVAL, "training needs epochs or steps");
		dg_err_hint(err, "e.g. \"epochs\": 3 (needs a ShardBatch) or \"steps\": 1000");
		return DG_EINVAL;
	}
	if ((st = get_int(training, p, "epochs", 1, 1000000, &out->epochs, err)) != DG_OK ||
	    (st = get_int(training, p, "steps", 1, INT64_MAX / 2, &out->steps, err)) != DG_OK ||
	    (st = get_int(training, p, "batch", 1, INT32_MAX, &out->batch, err)) != DG_OK ||
	    (st = get_int(training, p, "replicas", 0, 65536, &replicas, err)) != DG_OK ||
	    (st = get_int(training, p, "replica_group", 1, 65536, &group, err)) != DG_OK ||
	    (st = get_choice(training, p, "mode", modes, mode, sizeof mode, err)) != DG_OK ||
	    (st = get_int(training, p, "backup", 0, 65535, &backup, err)) != DG_OK ||
	    (st = get_num(training, p, "checkpoint_secs", 0, 0, 1e9, &out->checkpoint_secs,
			  err)) != DG_OK ||
	    (st = parse_eval(json_object_get(training, "eval"), out, err)) != DG_OK ||
	    (st = get_bool(training, p, "reinit", &out->reinit, err)) != DG_OK)
		return st;
	out->replicas = (int)replicas;
	out->replica_group = (int)group;
	out->sync = strcmp(mode, "sync") == 0;
	out->backup = (int)backup;
	if (backup > 0 && !out->sync) {
		dg_err_set(err, DG_EINVAL, "training.backup is %lld but mode is async",
			   (long long)backup);
		dg_err_hint(err, "backup replicas apply to \"mode\": \"sync\" only");
		return DG_EINVAL;
	}
	if (replicas > 0 && backup >= replicas) {
		dg_err_set(err, DG_EINVAL, "training.backup is %lld; it must be less than "
			   "training.replicas (%lld)", (long long)backup, (long long)replicas);
		return DG_EINVAL;
	}
	return DG_OK;
}

static void free_strs(char **v, int n)
{
	for (int i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

void train_spec_deinit(struct train_spec *s)
{
	if (!s)
		return;
	free(s->loss);
	/* the ref arrays are calloc'd with a spare slot and filled in order, so
	 * they are NULL-terminated even when a parse error stopped half-way */
	for (int i = 0; s->metrics && s->metrics[i]; i++)
		free(s->metrics[i]);
	free(s->metrics);
	for (int i = 0; s->eval_fetch && s->eval_fetch[i]; i++)
		free(s->eval_fetch[i]);
	free(s->eval_fetch);
	memset(s, 0, sizeof *s);
}

double train_lr_at(const struct train_spec *s, int64_t t)
{
	double e = s->every > 0 ? (double)s->every : 1;

	if (strcmp(s->schedule, "step") == 0)
		return s->lr * pow(s->factor, floor((double)t / e));
	if (strcmp(s->schedule, "exponential") == 0)
		return s->lr * pow(s->factor, (double)t / e);
	return s->lr;
}

int train_compute_tasks(const struct dg_cluster *c, int *idx)
{
	int n = 0;

	for (int t = 0; t < c->n_tasks; t++)
		if (strcmp(c->tasks[t].job, "ps") != 0)
			idx[n++] = t;
	return n;
}

/* ------------------------------------------------------------ plan building */

/* need[n]: the loss depends on node n (walk of the inputs from the loss). */
static enum dg_status loss_needs(const struct dg_graph *g, int loss, bool *need,
				 struct dg_err *err)
{
	int *stack = malloc(((size_t)g->n_nodes + 1) * sizeof *stack);
	int sp = 0;

	if (!stack)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	need[loss] = true;
	stack[sp++] = loss;
	while (sp > 0) {
		int n = stack[--sp];
		for (int i = 0; i < g->nodes[n].n_in; i++) {
			int s = g->nodes[n].in[i].node;
			if (!need[s]) {
				need[s] = true;
				stack[sp++] = s;
			}
		}
	}
	free(stack);
	return DG_OK;
}

/* Check a training ref: it must name a value of g (prefix: the key). */
static enum dg_status check_ref(const struct dg_graph *g, const char *key, const char *ref,
				struct dg_edge *e, struct dg_err *err)
{
	if (dg_graph_ref(g, ref, e, err) != DG_OK) {
		dg_err_prefix(err, "%s", key);
		return err ? err->code : DG_ENOTFOUND;
	}
	return DG_OK;
}

static enum dg_status check_refs(const struct dg_graph *g, const struct train_spec *s,
				 struct dg_err *err)
{
	struct dg_edge e;
	char key[64];
	enum dg_status st;

	if ((st = check_ref(g, "training.loss", s->loss, &e, err)) != DG_OK)
		return st;
	if (!dg_dtype_is_float(g->nodes[e.node].out[e.index].dtype)) {
		dg_err_set(err, DG_EDTYPE, "training.loss '%s' is %s; the loss must be a float",
			   s->loss, dg_dtype_name(g->nodes[e.node].out[e.index].dtype));
		dg_err_hint(err, "Cast it to float32, or name the float loss value");
		return DG_EDTYPE;
	}
	for (int i = 0; i < s->n_metrics; i++) {
		const struct dg_ttype *t;
		snprintf(key, sizeof key, "training.metrics[%d]", i);
		if ((st = check_ref(g, key, s->metrics[i], &e, err)) != DG_OK)
			return st;
		t = &g->nodes[e.node].out[e.index];
		if (!dg_dtype_is_float(t->dtype) && !dg_dtype_is_int(t->dtype) &&
		    !dg_dtype_is_half(t->dtype)) {
			dg_err_set(err, DG_EDTYPE, "%s '%s' is %s; metrics must be numbers", key,
				   s->metrics[i], dg_dtype_name(t->dtype));
			return DG_EDTYPE;
		}
		if (t->shape.ndim > 0) {
			dg_err_set(err, DG_EINVAL, "%s '%s' has %d dims; metrics must be scalars",
				   key, s->metrics[i], t->shape.ndim);
			dg_err_hint(err, "reduce it, e.g. with Mean");
			return DG_EINVAL;
		}
	}
	for (int i = 0; i < s->n_eval_fetch; i++) {
		snprintf(key, sizeof key, "training.eval.fetch[%d]", i);
		if ((st = check_ref(g, key, s->eval_fetch[i], &e, err)) != DG_OK)
			return st;
	}
	return DG_OK;
}

/* Steps per epoch from the first ShardBatch the loss needs (and the batch of
 * one replica): floor(ceil(n / R) / batch) for replica 0's shard of n examples.
 * *spe stays 0 without a ShardBatch or with an unknown dataset size. */
static enum dg_status epoch_size(const struct dg_graph *g, const bool *need,
				 const struct train_spec *s, int R, int64_t *spe,
				 int64_t *batch_out, struct dg_err *err)
{
	int found = 0;

	*spe = 0;
	*batch_out = 0;
	for (int k = 0; k < g->n_nodes; k++) {
		int n = g->order[k];
		const struct dg_node *nd = &g->nodes[n];
		const struct dg_ttype *in;
		int64_t batch, size, first, last;
		if (!need[n] || strcmp(nd->op->name, "ShardBatch") != 0)
			continue;
		if (s->batch > 0)
			batch = s->batch;
		else if (dg_attr_int(nd->attrs, "batch", NULL, &batch, err) != DG_OK)
			return DG_EINVAL;
		if (found++ > 0)
			continue;   /* the first one sets the epoch */
		*batch_out = batch;
		in = &g->nodes[nd->in[0].node].out[nd->in[0].index];
		size = in->shape.ndim >= 1 ? in->shape.dim[0] : -1;
		if (size < 0 && s->epochs > 0) {
			dg_err_set(err, DG_EINVAL, "training.epochs: the size of the dataset of "
				   "ShardBatch '%s' is not known when the graph is built",
				   nd->name);
			dg_err_hint(err, "read it with IdxReader or NpyReader, or give \"steps\" "
				    "instead of \"epochs\"");
			return DG_EINVAL;
		}
		if (size < 0)
			continue;
		first = (size + R - 1) / R;   /* shard 0 holds the most examples */
		last = size / R;
		if (last < batch) {
			dg_err_set(err, DG_EINVAL, "training.batch: ShardBatch '%s' splits %lld "
				   "examples into %d shards of %lld..%lld, fewer than one batch of "
				   "%lld", nd->name, (long long)size, R, (long long)last,
				   (long long)first, (long long)batch);
			dg_err_hint(err, "use a smaller batch or fewer replicas");
			return DG_EINVAL;
		}
		*spe = first / batch;
	}
	if (found == 0 && s->epochs > 0) {
		dg_err_set(err, DG_EINVAL, "training.epochs needs a ShardBatch in the part of the "
			   "graph the loss '%s' needs", s->loss);
		dg_err_hint(err, "batch the data with ShardBatch, or give \"steps\" instead");
		return DG_EINVAL;
	}
	if (found == 0 && s->batch > 0) {
		dg_err_set(err, DG_EINVAL, "training.batch is given but the loss '%s' needs no "
			   "ShardBatch", s->loss);
		dg_err_hint(err, "remove \"batch\" or batch the data with ShardBatch");
		return DG_EINVAL;
	}
	return DG_OK;
}

/* The ApplyGradient node of variable var for replica r (owned, or NULL). */
static json_t *apply_node(const struct train_spec *s, const char *var, const char *grad,
			  int R, int r)
{
	char name[DG_GRAPH_MAX_NAME + 16];
	json_t *a = json_pack("{s:s, s:s, s:f, s:s, s:b, s:i, s:i, s:i}", "variable", var,
			      "rule", s->rule, "lr", s->lr, "schedule", s->schedule,
			      "sync", s->sync, "replicas", R, "backup", s->backup,
			      "replica", r);

	if (!a)
		return NULL;
	if (strcmp(s->schedule, "constant") != 0) {
		json_object_set_new(a, "every", json_integer(s->every));
		json_object_set_new(a, "factor", json_real(s->factor));
	}
	if (strcmp(s->rule, "momentum") == 0) {
		json_object_set_new(a, "momentum", json_real(s->momentum));
		json_object_set_new(a, "nesterov", json_boolean(s->nesterov));
	} else if (strcmp(s->rule, "adam") == 0) {
		json_object_set_new(a, "beta1", json_real(s->beta1));
		json_object_set_new(a, "beta2", json_real(s->beta2));
		json_object_set_new(a, "eps", json_real(s->eps));
	}
	snprintf(name, sizeof name, "_train/apply/%s", var);
	/* No device: placement puts it with its gradient (place.h), so the
	 * gradient goes from the task that computed it straight to the ps. */
	return json_pack("{s:s, s:s, s:[s], s:o}", "name", name, "op", "ApplyGradient",
			 "inputs", grad, "attrs", a);
}

/* Shard every ShardBatch of doc's "nodes": replica r of R (and batch when > 0). */
static enum dg_status shard_batches(json_t *doc, int r, int R, int64_t batch,
				    struct dg_err *err)
{
	json_t *nodes = json_object_get(doc, "nodes"), *n;
	size_t i;

	json_array_foreach(nodes, i, n) {
		const char *op = json_string_value(json_object_get(n, "op"));
		json_t *a;
		if (!op || strcmp(op, "ShardBatch") != 0)
			continue;
		if (!(a = json_object_get(n, "attrs"))) {
			a = json_object();
			json_object_set_new(n, "attrs", a);
		}
		if (!a || json_object_set_new(a, "shard", json_integer(r)) ||
		    json_object_set_new(a, "num_shards", json_integer(R)) ||
		    (batch > 0 && json_object_set_new(a, "batch", json_integer(batch))))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	return DG_OK;
}

static json_t *refs_json(char *const *refs, int n)
{
	json_t *a = json_array();

	for (int i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_string(refs[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

/* Check a built document the way the master will parse it. */
static enum dg_status check_doc(json_t *doc, const char *what, struct dg_err *err)
{
	struct dg_graph *g = dg_graph_from_json(doc, master_op_find, err);

	if (!g) {
		dg_err_prefix(err, "%s", what);
		return err ? err->code : DG_EINVAL;
	}
	dg_graph_free(g);
	return DG_OK;
}

static enum dg_status build_replica(const struct train_spec *s, const struct dg_cluster *c,
				    const struct train_layout *L, const json_t *ad_doc,
				    char *const *grads, const struct train_plan *p, int r,
				    struct dg_err *err)
{
	struct train_replica *rep = &p->rep[r];
	char what[64];
	json_t *nodes, *fetch;
	enum dg_status st;

	rep->doc = json_deep_copy(ad_doc);
	rep->targets = calloc((size_t)p->n_vars + 1, sizeof *rep->targets);
	rep->fetch = calloc((size_t)s->n_metrics + 2, sizeof *rep->fetch);
	rep->reasons = json_object();
	if (!rep->doc || !rep->targets || !rep->fetch || !rep->reasons)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	rep->n_fetch = s->n_metrics + 1;   /* the capacity: unfilled slots stay NULL */
	json_object_del(rep->doc, "training");
	if ((st = train_pin(rep->doc, L, c, r, NULL, rep->reasons, err)) != DG_OK ||
	    (st = shard_batches(rep->doc, r, p->n_replicas, s->batch, err)) != DG_OK)
		return st;
	nodes = json_object_get(rep->doc, "nodes");
	for (int i = 0; i < p->n_vars; i++) {
		json_t *n = apply_node(s, p->var_nodes[i], grads[i], p->n_replicas, r);
		if (!n || json_array_append_new(nodes, n))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		rep->targets[i] = strdup(json_string_value(json_object_get(n, "name")));
		if (!rep->targets[i])
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		rep->n_targets = i + 1;
	}
	rep->fetch[0] = strdup(s->loss);
	for (int i = 0; rep->fetch[0] && i < s->n_metrics; i++)
		if (!(rep->fetch[i + 1] = strdup(s->metrics[i])))
			break;
	for (int i = 0; i < rep->n_fetch; i++)
		if (!rep->fetch[i])
			return dg_err_set(err, DG_ENOMEM, "out of memory");
	fetch = refs_json(rep->fetch, rep->n_fetch);
	if (!fetch || json_object_set_new(rep->doc, "fetch", fetch))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	snprintf(what, sizeof what, "replica %d's graph", r);
	return check_doc(rep->doc, what, err);
}

static enum dg_status build_eval(const struct dg_graph *g, const struct train_spec *s,
				 const struct dg_cluster *c, const struct train_layout *L,
				 struct train_plan *p, struct dg_err *err)
{
	json_t *fetch;
	enum dg_status st;

	if (s->n_eval_fetch == 0)
		return DG_OK;
	p->eval_doc = json_deep_copy(g->doc);
	if (!p->eval_doc)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	json_object_del(p->eval_doc, "training");
	if ((st = train_pin(p->eval_doc, L, c, 0, NULL, NULL, err)) != DG_OK)
		return st;
	fetch = refs_json(s->eval_fetch, s->n_eval_fetch);
	if (!fetch || json_object_set_new(p->eval_doc, "fetch", fetch))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	return check_doc(p->eval_doc, "training.eval's graph", err);
}

/* The float Variables the loss depends on, in file order; their gradients. */
static enum dg_status trained_vars(const struct dg_graph *g, const struct train_spec *s,
				   const bool *need, struct train_plan *p, json_t **ad_doc,
				   char ***grads, int *n_grads, struct dg_err *err)
{
	const struct dg_op_def *var_op = place_variable_op();
	struct dg_autodiff_opts ao = { .prefix = "grad/", .lookup = master_op_find };
	const char **wrt = calloc((size_t)g->n_nodes + 1, sizeof *wrt);
	int n = 0, kept = 0;
	enum dg_status st;

	if (!wrt)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int i = 0; i < g->n_nodes; i++)
		if (need[i] && g->nodes[i].op == var_op &&
		    dg_dtype_is_float(g->nodes[i].out[0].dtype))
			wrt[n++] = g->nodes[i].name;
	if (n == 0) {
		free(wrt);
		dg_err_set(err, DG_EINVAL, "training.loss '%s' depends on no float Variable: "
			   "there is nothing to train", s->loss);
		dg_err_hint(err, "the loss must be computed from Variable nodes");
		return DG_EINVAL;
	}
	st = dg_autodiff_ex(g, s->loss, wrt, n, &ao, ad_doc, grads, err);
	if (st == DG_OK)
		*n_grads = n;
	if (st != DG_OK) {
		free(wrt);
		dg_err_prefix(err, "training.loss '%s'", s->loss);
		return st;
	}
	/* A Variable reached only through integer edges gets no gradient: not trained. */
	p->var_nodes = calloc((size_t)n + 1, sizeof *p->var_nodes);
	if (!p->var_nodes) {
		free(wrt);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		if (!(*grads)[i])
			continue;
		if (!(p->var_nodes[kept] = strdup(wrt[i]))) {
			free(wrt);
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		}
		(*grads)[kept] = (*grads)[i];
		if (kept != i)
			(*grads)[i] = NULL;
		p->n_vars = ++kept;
	}
	free(wrt);
	if (kept == 0) {
		dg_err_set(err, DG_EINVAL, "training.loss '%s' has no gradient with respect to "
			   "any Variable", s->loss);
		dg_err_hint(err, "the Variables reach the loss only through integer values");
		return DG_EINVAL;
	}
	return DG_OK;
}

/* The layout's replicas into the plan: replica_task, group_task. */
static enum dg_status plan_layout(const struct train_layout *L, struct train_plan *p,
				  struct dg_err *err)
{
	p->n_replicas = L->replicas;
	p->group = L->group;
	p->replica_task = calloc((size_t)L->replicas + 1, sizeof *p->replica_task);
	p->group_task = calloc((size_t)L->replicas * (size_t)L->group + 1,
			       sizeof *p->group_task);
	if (!p->replica_task || !p->group_task)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int r = 0; r < L->replicas; r++) {
		p->replica_task[r] = train_layout_task(L, r, 0);
		for (int k = 0; k < L->group; k++)
			p->group_task[r * L->group + k] = train_layout_task(L, r, k);
	}
	return DG_OK;
}

enum dg_status train_plan_build(const struct dg_graph *g, const struct train_spec *s,
				const struct dg_cluster *c, struct train_plan *out,
				struct dg_err *err)
{
	struct train_layout L;
	bool *need = NULL;
	json_t *ad_doc = NULL;
	char **grads = NULL;
	int n_grads = 0, R;
	struct dg_edge loss;
	enum dg_status st;

	memset(out, 0, sizeof *out);
	if ((st = train_layout_build(g, s, c, &L, err)) != DG_OK ||
	    (st = plan_layout(&L, out, err)) != DG_OK)
		goto out;
	R = L.replicas;
	if (!(need = calloc((size_t)g->n_nodes + 1, sizeof *need))) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	if (s->sync && s->backup >= R) {
		st = dg_err_set(err, DG_EINVAL, "training.backup is %d; it must be less than the "
				"%d replicas", s->backup, R);
		goto out;
	}
	if ((st = check_refs(g, s, err)) != DG_OK)
		goto out;
	dg_graph_ref(g, s->loss, &loss, NULL);
	if ((st = loss_needs(g, loss.node, need, err)) != DG_OK)
		goto out;
	if ((st = epoch_size(g, need, s, R, &out->steps_per_epoch, &out->examples_per_step,
			     err)) != DG_OK)
		goto out;
	out->steps = s->epochs > 0 ? s->epochs * out->steps_per_epoch : s->steps;
	if ((st = trained_vars(g, s, need, out, &ad_doc, &grads, &n_grads, err)) != DG_OK)
		goto out;
	out->rep = calloc((size_t)R, sizeof *out->rep);
	if (!out->rep) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	for (int r = 0; st == DG_OK && r < R; r++)
		st = build_replica(s, c, &L, ad_doc, grads, out, r, err);
	if (st == DG_OK)
		st = build_eval(g, s, c, &L, out, err);
out:
	/* one slot per wrt; the kept ones were moved to the front, NULL behind */
	dg_autodiff_free_refs(grads, n_grads);
	json_decref(ad_doc);
	free(need);
	train_layout_deinit(&L);
	if (st != DG_OK)
		train_plan_deinit(out);
	return st;
}

void train_plan_deinit(struct train_plan *p)
{
	if (!p)
		return;
	for (int r = 0; p->rep && r < p->n_replicas; r++) {
		json_decref(p->rep[r].doc);
		free_strs(p->rep[r].targets, p->n_vars);
		free_strs(p->rep[r].fetch, p->rep[r].n_fetch);
		json_decref(p->rep[r].reasons);
	}
	free(p->rep);
	free(p->replica_task);
	free(p->group_task);
	json_decref(p->eval_doc);
	free_strs(p->var_nodes, p->n_vars);
	memset(p, 0, sizeof *p);
}
