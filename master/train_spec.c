/* The "training" section of a graph document parsed into a train_spec
 * (train.h, doc/training.md "The training section"), every key at every
 * level checked, and the learning-rate schedule. Pure. Neighbour: train.c
 * (the plan built from the spec). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	char list[256];
	size_t len = 0;
	for (int i = 0; choices[i] && len < sizeof list; i++)
		len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
					i == 0 ? "" : choices[i + 1] ? ", " : " or ", choices[i]);
	dg_err_hint(err, "use %s", list);
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
	"mode", "backup", "checkpoint_secs", "eval", "reinit", "replica_group", "towers",
	"aggregate", "microbatches", NULL,
};
static const char *const opt_keys[] = {
	"rule", "lr", "momentum", "nesterov", "beta1", "beta2", "eps", "rho", "init", NULL,
};
static const char *const sched_keys[] = { "kind", "every", "factor", NULL };
static const char *const eval_keys[] = { "fetch", "every_epochs", "every_steps", "barrier",
					 NULL };
static const char *const rules[] = { "sgd", "momentum", "adam", "adagrad", "rmsprop", NULL };
static const char *const kinds[] = { "constant", "step", "exponential", NULL };
static const char *const modes[] = { "async", "sync", NULL };
static const char *const aggregates[] = { "mean", "sum", NULL };

/* DG_EINVAL for a required key that is absent, with an example as the hint. */
static enum dg_status missing(struct dg_err *err, const char *key, const char *hint)
{
	dg_err_set(err, DG_EINVAL, "%s is missing", key);
	dg_err_hint(err, "%s", hint);
	return DG_EINVAL;
}

/* A key that only applies to some rules (need, or also need2 when not NULL):
 * refused elsewhere so typos surface. */
static enum dg_status only_for(const json_t *opt, const char *key, const char *rule,
			       const char *need, const char *need2, struct dg_err *err)
{
	if (!json_object_get(opt, key) || strcmp(rule, need) == 0 ||
	    (need2 && strcmp(rule, need2) == 0))
		return DG_OK;
	dg_err_set(err, DG_EINVAL, "training.optimizer.%s applies to rule %s%s%s, not %s", key,
		   need, need2 ? " and " : "", need2 ? need2 : "", rule);
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
		return missing(err, "training.optimizer.rule",
			       "use sgd, momentum, adam, adagrad or rmsprop");
	if ((st = get_choice(opt, p, "rule", rules, s->rule, sizeof s->rule, err)) != DG_OK)
		return st;
	if ((st = only_for(opt, "momentum", s->rule, "momentum", "rmsprop", err)) != DG_OK ||
	    (st = only_for(opt, "nesterov", s->rule, "momentum", NULL, err)) != DG_OK ||
	    (st = only_for(opt, "beta1", s->rule, "adam", NULL, err)) != DG_OK ||
	    (st = only_for(opt, "beta2", s->rule, "adam", NULL, err)) != DG_OK ||
	    (st = only_for(opt, "eps", s->rule, "adam", "rmsprop", err)) != DG_OK ||
	    (st = only_for(opt, "rho", s->rule, "rmsprop", NULL, err)) != DG_OK ||
	    (st = only_for(opt, "init", s->rule, "adagrad", "rmsprop", err)) != DG_OK)
		return st;
	/* TensorFlow 1.x's defaults */
	if (strcmp(s->rule, "adagrad") == 0)
		s->init = 0.1;
	if (strcmp(s->rule, "rmsprop") == 0) {
		s->rho = 0.9;
		s->eps = 1e-10;
		s->init = 1.0;
	}
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
	    (st = get_num(opt, p, "beta2", 0, 2, 1, &s->beta2, err)) != DG_OK ||
	    /* 0 is refused: the workers' requests send rho only when it is not 0 */
	    (st = get_num(opt, p, "rho", 0, 3, 1, &s->rho, err)) != DG_OK ||
	    (st = get_num(opt, p, "init", 0, 1, 1e300, &s->init, err)) != DG_OK)
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
	int64_t replicas = 0, backup = 0, group = 0, towers = 0, micro = 0;
	char mode[16] = "async", agg[8] = "mean";
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
	    (st = get_int(training, p, "towers", 1, 4096, &towers, err)) != DG_OK ||
	    (st = get_int(training, p, "microbatches", 1, 4096, &micro, err)) != DG_OK ||
	    (st = get_choice(training, p, "aggregate", aggregates, agg, sizeof agg, err)) != DG_OK ||
	    (st = get_choice(training, p, "mode", modes, mode, sizeof mode, err)) != DG_OK ||
	    (st = get_int(training, p, "backup", 0, 65535, &backup, err)) != DG_OK ||
	    (st = get_num(training, p, "checkpoint_secs", 0, 0, 1e9, &out->checkpoint_secs,
			  err)) != DG_OK ||
	    (st = parse_eval(json_object_get(training, "eval"), out, err)) != DG_OK ||
	    (st = get_bool(training, p, "reinit", &out->reinit, err)) != DG_OK)
		return st;
	out->replicas = (int)replicas;
	out->replica_group = (int)group;
	out->towers = (int)towers;
	out->microbatches = (int)micro;
	out->tower_sum = strcmp(agg, "sum") == 0;
	if (json_object_get(training, "aggregate") && towers < 2) {
		dg_err_set(err, DG_EINVAL, "training.aggregate applies to towers, but "
			   "training.towers is %lld", (long long)towers);
		dg_err_hint(err, "give \"towers\": K (K >= 2), or remove \"aggregate\"");
		return DG_EINVAL;
	}
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

