/* `dg checkpoint save [DIR]` and `dg checkpoint restore DIR`. Without DIR,
 * save makes every parameter server write a snapshot in its own data dir now
 * (POST /v1/checkpoint, doc/http-api.md "Checkpoints"), one line per task.
 * With DIR it exports every variable (slots included) into a directory of
 * .npy files and a manifest (ckpt_dir.c), which restore verifies whole and then
 * puts back. The servers are the tasks of job "ps" (every task when there is
 * no such job), as for `dg var`; --server HOST:PORT talks to one server. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_dir.h"
#include "cli.h"
#include "dg/client.h"
#include "dg/clock.h"

#define MAX_REPORTED 20                 /* damaged files listed before "and N more" */

enum { OPT_CLUSTER = 256, OPT_SERVER, OPT_TOKEN, OPT_JSON, OPT_FORCE, OPT_ONLY };

struct ckpt_args {
	const char *sub;                /* "save" or "restore" */
	const char *cluster, *server, *token_file, *dir;
	bool json, force;
	const char **only;              /* --only values (borrowed from argv), n_only */
	int n_only;
};

static const struct option long_opts[] = {
	{ "cluster", required_argument, NULL, OPT_CLUSTER },
	{ "server", required_argument, NULL, OPT_SERVER },
	{ "token-file", required_argument, NULL, OPT_TOKEN },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "force", no_argument, NULL, OPT_FORCE },
	{ "only", required_argument, NULL, OPT_ONLY },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static const char save_help[] =
	"usage: dg checkpoint save [DIR] [--cluster FILE | --server HOST:PORT] [--json]\n"
	"                          [--force] [--token-file F]\n"
	"\n"
	"Without DIR: make every parameter server of the cluster (the tasks of job\n"
	"\"ps\", every task when there is none) write a snapshot of all its variables\n"
	"in its own --data-dir now, so that the gradient applies made so far survive\n"
	"a crash. One line per task:\n"
	"  ps/0: epoch 3, 24 variables, 8.52 MB in 0.18 s\n"
	"A server started without --data-dir keeps variables in memory only and\n"
	"cannot checkpoint: its line says so and the exit status is 16.\n"
	"\n"
	"With DIR: export every variable of every ps, optimizer slots included\n"
	"(w.momentum, w.adam_m, ...), into DIR: NAME.npy per variable ('/' in a name\n"
	"makes subdirectories; bfloat16, which .npy cannot hold, is NAME.raw: its\n"
	"bare little-endian bytes) and manifest.json (dtype, shape, version, task,\n"
	"bytes and CRC-32 of each). It is written into DIR.tmp-XXXXXX and renamed to\n"
	"DIR when complete. One variable is held at a time. Each variable is one\n"
	"version of it, but variables are read one after another: stop training\n"
	"first, or accept that they come from slightly different steps.\n"
	"  saved 24 variables (8.52 MB) from 1 ps to DIR in 0.30 s\n"
	"\n"
	"options:\n"
	"  --cluster FILE     the cluster spec (default: $DG_CLUSTER, then the last\n"
	"                     'dg up')\n"
	"  --server HOST:PORT this one server\n"
	"  --token-file F     send the bearer token in F (first line)\n"
	"  --json             without DIR: each server's reply as a JSON line with\n"
	"                     \"task\"; with DIR: one JSON line of totals\n"
	"  --force            replace DIR when it holds an earlier checkpoint (an\n"
	"                     existing non-empty DIR is refused otherwise)\n"
	"  -h, --help         show this help\n";

static const char restore_help[] =
	"usage: dg checkpoint restore DIR [--cluster FILE | --server HOST:PORT]\n"
	"                             [--only NAME]... [--json] [--token-file F]\n"
	"\n"
	"Put back the variables 'dg checkpoint save DIR' exported. First every file is\n"
	"checked against manifest.json (present, .npy header, dtype, shape, size,\n"
	"CRC-32); if any fails, each failure is listed and nothing is changed. Then\n"
	"each variable is written (PUT, a new version): where it exists in the\n"
	"cluster now, else on the task it was saved from when the cluster has that\n"
	"task, else on the ps holding the fewest bytes; optimizer slots go with their\n"
	"variable. Variables not in the checkpoint are left alone; sync step counters\n"
	"are not part of a checkpoint.\n"
	"  restored 24 variables (8.52 MB) to 1 ps in 0.30 s\n"
	"\n"
	"options:\n"
	"  --cluster FILE     the cluster spec (default: $DG_CLUSTER, then the last\n"
	"                     'dg up')\n"
	"  --server HOST:PORT restore onto this one server\n"
	"  --only NAME        restore NAME only (with its slots); NAME/ restores\n"
	"                     everything under it; repeat it or separate with commas\n"
	"  --token-file F     send the bearer token in F (first line)\n"
	"  --json             one JSON line of totals per task\n"
	"  -h, --help         show this help\n";

static void *client_open(const char *address, const char *token, struct dg_err *err)
{
	return dg_client_new(address, token, err);
}

static void client_close(void *c)
{
	dg_client_free(c);
}

static const struct cli_client_ops client_ops = { client_open, client_close };

/* The servers holding variables: --server, else the tasks of job "ps" of the
 * cluster (every task when it has no "ps" job); ops NULL: addresses only. */
static enum dg_status targets_open(const struct ckpt_args *a, const struct cli_client_ops *ops,
				   struct cli_targets *ts, struct dg_err *err)
{
	const struct cli_target_query q = {
		.cluster = a->cluster, .server = a->server, .job = "ps",
		.token_file = a->token_file,
	};

	return cli_targets_open(&q, ops, ts, err);
}

static void print_json(json_t *j)
{
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

	if (text)
		printf("%s\n", text);
	free(text);
	json_decref(j);
}

/* --- save without DIR: each server's own snapshot ------------------------------ */

/* Print one server's reply (borrowed) as a line for people or as JSON. */
static void print_reply(const struct cli_target *t, json_t *r, bool as_json)
{
	long long vars = (long long)json_integer_value(json_object_get(r, "vars"));
	char size[32];

	if (as_json) {
		json_object_set_new(r, "task", json_string(t->label));
		print_json(json_incref(r));
		return;
	}
	ckpt_format_bytes((double)json_integer_value(json_object_get(r, "bytes")), size,
			  sizeof size);
	printf("%s: epoch %lld, %lld variable%s, %s in %.2f s\n", t->label,
	       (long long)json_integer_value(json_object_get(r, "epoch")), vars,
	       vars == 1 ? "" : "s", size, json_number_value(json_object_get(r, "ms")) / 1000);
}

/* Checkpoint each target in turn, with a client of its own made here so that
 * one bad address fails its line only. Returns the exit code: 0 when all did,
 * else that of the first failure (every target is still tried). */
static int snapshot_all(const struct ckpt_args *a, const struct cli_targets *ts)
{
	int rc = 0;

	for (int i = 0; i < ts->n; i++) {
		const struct cli_target *t = &ts->t[i];
		struct dg_err err = { 0 };
		struct dg_client *c = dg_client_new(t->address, ts->token, &err);
		json_t *reply = NULL;
		enum dg_status st = c ? dg_ps_checkpoint(c, &reply, &err) : err.code;

		if (st == DG_OK) {
			print_reply(t, reply, a->json);
		} else {
			if (strcmp(t->label, t->address))
				dg_err_prefix(&err, "%s (%s): checkpoint failed", t->label,
					      t->address);
			else
				dg_err_prefix(&err, "%s: checkpoint failed", t->label);
			int code = cli_fail(&err);
			if (rc == 0)
				rc = code;
		}
		json_decref(reply);
		dg_client_free(c);
	}
	return rc;
}

static int snapshot_cmd(const struct ckpt_args *a)
{
	struct cli_targets ts;
	struct dg_err err = { 0 };
	int rc;

	/* No clients: snapshot_all makes its own. */
	if (targets_open(a, NULL, &ts, &err) != DG_OK)
		return cli_fail(&err);
	rc = snapshot_all(a, &ts);
	cli_targets_close(&ts);
	return rc;
}

/* --- save DIR: export ---------------------------------------------------------- */

struct var_list {
	struct ckpt_var *v;             /* owned, n of cap */
	int n, cap;
	uint64_t bytes;
};

static int var_cmp(const void *pa, const void *pb)
{
	return strcmp(((const struct ckpt_var *)pa)->name, ((const struct ckpt_var *)pb)->name);
}

/* Export every variable of task t into stage, appending to out. */
static enum dg_status export_task(const struct cli_target *t, const char *stage,
				  struct var_list *out, struct dg_err *err)
{
	struct dg_var_info *list = NULL;
	enum dg_status st;
	int n = 0;

	if ((st = dg_var_list(t->client, NULL, &list, &n, err)) != DG_OK) {
		dg_err_prefix(err, "%s: listing variables", t->label);
		return st;
	}
	for (int k = 0; st == DG_OK && k < n; k++) {
		struct dg_err e = { 0 };
		if (out->n == out->cap) {
			int cap = out->cap ? 2 * out->cap : 64;
			struct ckpt_var *g = realloc(out->v, (size_t)cap * sizeof *g);
			if (!g) {
				st = dg_err_set(err, DG_ENOMEM, "out of memory");
				break;
			}
			out->v = g;
			out->cap = cap;
		}
		st = ckpt_export_var(stage, t->client, list[k].name, t->label, &out->v[out->n], &e);
		if (st == DG_ENOTFOUND) {
			/* Deleted since the listing: not part of this checkpoint. */
			fprintf(stderr, "dg: warning: variable '%s' was deleted from %s during "
				"the save; not saved\n", list[k].name, t->label);
			st = DG_OK;
			continue;
		}
		if (st != DG_OK) {
			*err = e;
			dg_err_prefix(err, "%s: saving variable '%s'", t->label, list[k].name);
			break;
		}
		out->bytes += out->v[out->n++].bytes;
	}
	free(list);
	return st;
}

static void print_saved(const struct ckpt_args *a, const struct var_list *vl, int tasks,
			double secs)
{
	char size[32];

	if (a->json) {
		print_json(json_pack("{s:s, s:i, s:I, s:i, s:I}", "dir", a->dir, "variables",
				     vl->n, "bytes", (json_int_t)vl->bytes, "tasks", tasks,
				     "ms", (json_int_t)(secs * 1000 + 0.5)));
		return;
	}
	ckpt_format_bytes((double)vl->bytes, size, sizeof size);
	printf("saved %d variable%s (%s) from %d ps to %s in %.2f s\n", vl->n,
	       vl->n == 1 ? "" : "s", size, tasks, a->dir, secs);
}

static int export_cmd(const struct ckpt_args *a)
{
	struct cli_targets ts = { 0 };
	struct dg_err err = { 0 };
	struct var_list vl = { 0 };
	json_t *tasks = json_array();
	double t0 = dg_mono_s();
	char *stage = NULL;
	enum dg_status st;

	if ((st = ckpt_dest_check(a->dir, a->force, &err)) != DG_OK ||
	    (st = targets_open(a, &client_ops, &ts, &err)) != DG_OK) {
		json_decref(tasks);
		return cli_fail(&err);
	}
	if (!tasks)
		st = dg_err_set(&err, DG_ENOMEM, "out of memory");
	else if (!(stage = ckpt_stage_new(a->dir, &err)))
		st = err.code;
	for (int i = 0; st == DG_OK && i < ts.n; i++) {
		json_array_append_new(tasks, json_pack("{s:s, s:s}", "task", ts.t[i].label,
						       "address", ts.t[i].address));
		st = export_task(&ts.t[i], stage, &vl, &err);
	}
	if (st == DG_OK) {
		if (vl.n)
			qsort(vl.v, (size_t)vl.n, sizeof *vl.v, var_cmp);
		/* One name on two tasks with different encodings (w.npy, w.raw) got
		 * past the file check: restore would refuse this manifest. */
		for (int i = 1; st == DG_OK && i < vl.n; i++) {
			if (strcmp(vl.v[i - 1].name, vl.v[i].name))
				continue;
			st = dg_err_set(&err, DG_EEXIST, "variable '%s' is on more than one task "
					"(%s and %s)", vl.v[i].name, vl.v[i - 1].task, vl.v[i].task);
			dg_err_hint(&err, "remove the copies with 'dg var rm' on all but one task, "
				    "then save again");
		}
		if (st == DG_OK)
			st = ckpt_manifest_write(stage, vl.v, vl.n, tasks, &err);
	}
	if (st == DG_OK && (st = ckpt_install(stage, a->dir, a->force, &err)) == DG_OK)
		print_saved(a, &vl, ts.n, dg_mono_s() - t0);
	if (st != DG_OK && stage) {
		char hint[sizeof err.hint];
		snprintf(hint, sizeof hint, "%s", err.hint);
		ckpt_remove_tree(stage);
		dg_err_hint(&err, "%s%snothing was written to %s", hint, hint[0] ? "; " : "",
			    a->dir);
	}
	free(stage);
	free(vl.v);
	json_decref(tasks);
	cli_targets_close(&ts);
	return st == DG_OK ? 0 : cli_fail(&err);
}

/* --- restore DIR --------------------------------------------------------------- */

/* the ps's slot names (ps/apply.c, doc/http-api.md) */
static const char *const slot_suffix[] = { ".momentum", ".adam_m", ".adam_v", ".adam_t",
					   ".accum", ".rms", ".rms_momentum" };

/* One variable to restore: which manifest entry, the entry of the variable
 * whose slot it is (itself otherwise), and the task it goes to. */
struct item {
	const struct ckpt_var *v;
	int base;                       /* index into the items */
	int dest;                       /* index into the targets; -1 until placed */
};

struct restore {
	const struct ckpt_args *a;
	const struct ckpt_manifest *m;
	struct cli_targets ts;
	struct item *it;                /* owned, n */
	int n;
	char ***names;                  /* per target: its variables' names, sorted (owned) */
	int *n_names;
	int64_t *load;                  /* per target: bytes held, for placement; NULL until
					 * first needed */
	int *count;                     /* per target: variables restored */
	uint64_t *bytes;                /* per target: their bytes */
};

/* Does --only select name? A value "p/" selects the names under p/; values
 * may be comma-separated. used[k] notes which value matched. */
static bool only_selects(const struct ckpt_args *a, const char *name, bool *used)
{
	bool hit = false;
	int k = 0;

	for (int i = 0; i < a->n_only; i++) {
		for (const char *p = a->only[i]; *p; k++) {
			size_t len = strcspn(p, ",");
			bool match = len && (p[len - 1] == '/'
					     ? strncmp(name, p, len) == 0
					     : strlen(name) == len && strncmp(name, p, len) == 0);
			if (match)
				used[k] = true;
			hit = hit || match;
			p += len + (p[len] == ',');
		}
	}
	return hit;
}

static int only_count(const struct ckpt_args *a)
{
	int k = 0;

	for (int i = 0; i < a->n_only; i++)
		for (const char *p = a->only[i]; *p; k++)
			p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',');
	return k;
}

/* The k-th --only value, for the message about one that matched nothing. */
static void only_value(const struct ckpt_args *a, int want, char *buf, size_t n)
{
	int k = 0;

	for (int i = 0; i < a->n_only; i++) {
		for (const char *p = a->only[i]; *p; k++) {
			size_t len = strcspn(p, ",");
			if (k == want) {
				snprintf(buf, n, "%.*s", (int)len, p);
				return;
			}
			p += len + (p[len] == ',');
		}
	}
	snprintf(buf, n, "?");
}

static int item_cmp(const void *pa, const void *pb)
{
	return strcmp(((const struct item *)pa)->v->name, ((const struct item *)pb)->v->name);
}

static int find_item(const struct restore *r, const char *name)
{
	struct ckpt_var key;
	struct item k = { .v = &key }, *hit;

	snprintf(key.name, sizeof key.name, "%s", name);
	hit = bsearch(&k, r->it, (size_t)r->n, sizeof *r->it, item_cmp);
	return hit ? (int)(hit - r->it) : -1;
}

/* The items: the manifest's variables that --only selects (all without it),
 * sorted by name, each slot pointing at its variable when that is restored. */
static enum dg_status select_items(struct restore *r, struct dg_err *err)
{
	int n_vals = only_count(r->a);
	bool *used = calloc((size_t)n_vals + 1, sizeof *used);
	bool *sel = calloc((size_t)r->m->n + 1, sizeof *sel);
	enum dg_status st = DG_OK;
	char val[DG_VAR_NAME_MAX + 2];

	r->it = calloc((size_t)r->m->n + 1, sizeof *r->it);
	if (!used || !sel || !r->it) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < r->m->n; i++)
		sel[i] = !r->a->n_only || only_selects(r->a, r->m->vars[i].name, used);
	/* Slots of a selected variable come with it. */
	for (int i = 0; r->a->n_only && i < r->m->n; i++) {
		const char *name = r->m->vars[i].name;
		for (size_t s = 0; !sel[i] && s < sizeof slot_suffix / sizeof *slot_suffix; s++) {
			size_t nl = strlen(name), sl = strlen(slot_suffix[s]);
			if (nl <= sl || strcmp(name + nl - sl, slot_suffix[s]))
				continue;
			for (int j = 0; j < r->m->n; j++)
				if (sel[j] && strlen(r->m->vars[j].name) == nl - sl &&
				    !strncmp(r->m->vars[j].name, name, nl - sl))
					sel[i] = true;
		}
	}
	for (int k = 0; k < n_vals; k++) {
		if (used[k])
			continue;
		only_value(r->a, k, val, sizeof val);
		st = dg_err_set(err, DG_ENOTFOUND, "--only %s: no such variable in checkpoint '%s'",
				val, r->a->dir);
		dg_err_hint(err, "the checkpoint's variables are listed in %s/%s", r->a->dir,
			    CKPT_MANIFEST);
		goto out;
	}
	for (int i = 0; i < r->m->n; i++)
		if (sel[i])
			r->it[r->n++] = (struct item){ .v = &r->m->vars[i], .dest = -1 };
	if (r->n)
		qsort(r->it, (size_t)r->n, sizeof *r->it, item_cmp);
	for (int i = 0; i < r->n; i++) {
		const char *name = r->it[i].v->name;
		size_t nl = strlen(name);
		r->it[i].base = i;
		for (size_t s = 0; s < sizeof slot_suffix / sizeof *slot_suffix; s++) {
			size_t sl = strlen(slot_suffix[s]);
			char base[DG_VAR_NAME_MAX + 1];
			int b;
			if (nl <= sl || strcmp(name + nl - sl, slot_suffix[s]))
				continue;
			snprintf(base, sizeof base, "%.*s", (int)(nl - sl), name);
			if ((b = find_item(r, base)) >= 0)
				r->it[i].base = b;
		}
	}
out:
	free(used);
	free(sel);
	return st;
}

/* Check every selected file before changing anything; each failure is
 * printed. Returns the exit code of the first, or 0. */
static int verify_all(const struct restore *r)
{
	int rc = 0, bad = 0;

	for (int i = 0; i < r->n; i++) {
		struct dg_err e = { 0 };
		if (ckpt_load_var(r->a->dir, r->it[i].v, NULL, &e) == DG_OK)
			continue;
		if (++bad <= MAX_REPORTED) {
			int code = cli_fail(&e);
			rc = rc ? rc : code;
		} else if (!rc) {
			rc = dg_status_to_exit(e.code);
		}
	}
	if (bad > MAX_REPORTED)
		fprintf(stderr, "dg: ... and %d more\n", bad - MAX_REPORTED);
	if (bad)
		fprintf(stderr, "dg: checkpoint '%s': %d of %d file%s failed verification; "
			"nothing was restored\n", r->a->dir, bad, r->n, r->n == 1 ? "" : "s");
	return rc;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Each target's variables now (names sorted), and room for the tallies. */
static enum dg_status survey(struct restore *r, struct dg_err *err)
{
	int n = r->ts.n;

	r->names = calloc((size_t)n, sizeof *r->names);
	r->n_names = calloc((size_t)n, sizeof *r->n_names);
	r->count = calloc((size_t)n, sizeof *r->count);
	r->bytes = calloc((size_t)n, sizeof *r->bytes);
	if (!r->names || !r->n_names || !r->count || !r->bytes)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int t = 0; t < n; t++) {
		struct dg_var_info *list;
		int m;
		if (dg_var_list(r->ts.t[t].client, NULL, &list, &m, err) != DG_OK) {
			dg_err_prefix(err, "%s: listing variables", r->ts.t[t].label);
			return err->code;
		}
		r->names[t] = calloc((size_t)m + 1, sizeof **r->names);
		for (int k = 0; r->names[t] && k < m; k++) {
			if (!(r->names[t][k] = strdup(list[k].name)))
				break;
			r->n_names[t]++;
		}
		free(list);
		if (r->n_names[t] != m)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		qsort(r->names[t], (size_t)m, sizeof **r->names, cmp_str_ptr);
	}
	return DG_OK;
}

static bool has_var(const struct restore *r, int t, const char *name)
{
	return r->n_names[t] &&
	       bsearch(&name, r->names[t], (size_t)r->n_names[t], sizeof **r->names, cmp_str_ptr);
}

/* The task holding the fewest bytes, counting what this restore placed. */
static enum dg_status fewest_bytes(struct restore *r, int *dest, struct dg_err *err)
{
	if (!r->load) {
		if (!(r->load = calloc((size_t)r->ts.n, sizeof *r->load)))
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		for (int t = 0; r->ts.n > 1 && t < r->ts.n; t++) {
			json_t *h;
			if (dg_client_health(r->ts.t[t].client, &h, err) != DG_OK) {
				dg_err_prefix(err, "%s", r->ts.t[t].label);
				return err->code;
			}
			r->load[t] = json_integer_value(json_object_get(h, "bytes"));
			json_decref(h);
		}
	}
	*dest = 0;
	for (int t = 1; t < r->ts.n; t++)
		if (r->load[t] < r->load[*dest])
			*dest = t;
	return DG_OK;
}

/* Where each item goes: a variable stays where it is now; else the task it
 * was saved from, when the cluster has it; else the fewest bytes. A slot goes
 * where its variable goes (the ps applies both together). */
static enum dg_status place_all(struct restore *r, struct dg_err *err)
{
	for (int i = 0; i < r->n; i++) {
		struct item *it = &r->it[i];
		if (it->base != i)
			continue;       /* a slot; its variable sorts before it */
		for (int t = 0; it->dest < 0 && t < r->ts.n; t++)
			if (has_var(r, t, it->v->name))
				it->dest = t;
		for (int t = 0; it->dest < 0 && t < r->ts.n; t++)
			if (!strcmp(r->ts.t[t].label, it->v->task))
				it->dest = t;
		if (it->dest < 0) {
			if (fewest_bytes(r, &it->dest, err) != DG_OK)
				return err->code;
			r->load[it->dest] += (int64_t)it->v->bytes;
		}
	}
	for (int i = 0; i < r->n; i++)
		r->it[i].dest = r->it[r->it[i].base].dest;
	return DG_OK;
}

/* Load, check again and PUT one item; remove copies of it on other tasks. */
static enum dg_status restore_one(struct restore *r, const struct item *it, struct dg_err *err)
{
	struct dg_put_opts opts = { .replace = true };
	struct dg_tensor *t = NULL;
	const struct cli_target *dst = &r->ts.t[it->dest];
	enum dg_status st;

	if ((st = ckpt_load_var(r->a->dir, it->v, &t, err)) == DG_OK &&
	    (st = dg_var_put(dst->client, it->v->name, t, &opts, NULL, err)) != DG_OK)
		dg_err_prefix(err, "%s: restoring variable '%s'", dst->label, it->v->name);
	dg_tensor_free(t);
	for (int o = 0; st == DG_OK && o < r->ts.n; o++) {
		struct dg_err e = { 0 };
		if (o == it->dest || !has_var(r, o, it->v->name))
			continue;
		st = dg_var_delete(r->ts.t[o].client, it->v->name, 0, &e);
		if (st == DG_ENOTFOUND)      /* went with its variable's delete */
			st = DG_OK;
		if (st != DG_OK) {
			*err = e;
			dg_err_prefix(err, "%s: removing the old copy of '%s' (restored on %s)",
				      r->ts.t[o].label, it->v->name, dst->label);
		}
	}
	if (st == DG_OK) {
		r->count[it->dest]++;
		r->bytes[it->dest] += it->v->bytes;
	}
	return st;
}

static void print_restored(const struct restore *r, double secs)
{
	uint64_t total = 0;
	int vars = 0, tasks = 0;
	char size[32];

	for (int t = 0; t < r->ts.n; t++) {
		vars += r->count[t];
		total += r->bytes[t];
		tasks += r->count[t] > 0;
		if (r->a->json && r->count[t]) {
			print_json(json_pack("{s:s, s:s, s:i, s:I, s:I}", "dir", r->a->dir, "task",
					     r->ts.t[t].label, "variables", r->count[t], "bytes",
					     (json_int_t)r->bytes[t], "ms",
					     (json_int_t)(secs * 1000 + 0.5)));
		} else if (r->count[t] && r->ts.n > 1) {
			ckpt_format_bytes((double)r->bytes[t], size, sizeof size);
			printf("%s: %d variable%s (%s)\n", r->ts.t[t].label, r->count[t],
			       r->count[t] == 1 ? "" : "s", size);
		}
	}
	if (r->a->json)
		return;
	ckpt_format_bytes((double)total, size, sizeof size);
	printf("restored %d variable%s (%s) to %d ps in %.2f s\n", vars, vars == 1 ? "" : "s",
	       size, tasks, secs);
}

static void restore_deinit(struct restore *r)
{
	for (int t = 0; r->names && t < r->ts.n; t++) {
		for (int k = 0; k < r->n_names[t]; k++)
			free(r->names[t][k]);
		free(r->names[t]);
	}
	free(r->names);
	free(r->n_names);
	free(r->load);
	free(r->count);
	free(r->bytes);
	free(r->it);
	cli_targets_close(&r->ts);
}

static int restore_cmd(const struct ckpt_args *a)
{
	struct ckpt_manifest m;
	struct dg_err err = { 0 };
	struct restore r = { .a = a, .m = &m };
	double t0 = dg_mono_s();
	enum dg_status st;
	int rc, done = 0;

	if (ckpt_manifest_read(a->dir, &m, &err) != DG_OK)
		return cli_fail(&err);
	if ((st = select_items(&r, &err)) != DG_OK) {
		rc = cli_fail(&err);
		goto out;
	}
	if ((rc = verify_all(&r)) != 0)
		goto out;
	if ((st = targets_open(a, &client_ops, &r.ts, &err)) != DG_OK ||
	    (st = survey(&r, &err)) != DG_OK || (st = place_all(&r, &err)) != DG_OK) {
		rc = cli_fail(&err);
		goto out;
	}
	for (; st == DG_OK && done < r.n; done++)
		if ((st = restore_one(&r, &r.it[done], &err)) != DG_OK)
			break;
	if (st != DG_OK) {
		rc = cli_fail(&err);
		fprintf(stderr, "dg: %d of %d variables were restored before the error; run the "
			"restore again once it is fixed\n", done, r.n);
		goto out;
	}
	print_restored(&r, dg_mono_s() - t0);
out:
	restore_deinit(&r);
	ckpt_manifest_deinit(&m);
	return rc;
}

/* --- arguments ----------------------------------------------------------------- */

/* Returns -1 to go on, else the exit code (help printed or usage error). */
static int parse_args(int argc, char **argv, struct ckpt_args *a)
{
	const char *cmd = !strcmp(a->sub, "save") ? "checkpoint save" : "checkpoint restore";
	int c;

	optind = 0;      /* glibc: full re-initialisation, argv[0] is the subcommand */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
		switch (c) {
		case OPT_CLUSTER: a->cluster = optarg; break;
		case OPT_SERVER: a->server = optarg; break;
		case OPT_TOKEN: a->token_file = optarg; break;
		case OPT_JSON: a->json = true; break;
		case OPT_FORCE: a->force = true; break;
		case OPT_ONLY:
			if (!optarg[0] || optarg[0] == ',' || strstr(optarg, ",,") ||
			    optarg[strlen(optarg) - 1] == ',')
				return cli_usage(cmd, "--only '%s': give NAME, NAME/ or NAME,NAME",
						 optarg);
			a->only[a->n_only++] = optarg;
			break;
		case 'h':
			fputs(strcmp(a->sub, "save") ? restore_help : save_help, stdout);
			return 0;
		case ':':
			return cli_usage(cmd, "option '%s' needs a value", argv[optind - 1]);
		default:
			return cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (a->cluster && a->server)
		return cli_usage(cmd, "--cluster and --server exclude each other");
	if (optind < argc)
		a->dir = argv[optind++];
	if (optind < argc)
		return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
	if (!strcmp(a->sub, "restore") && !a->dir)
		return cli_usage(cmd, "missing DIR (a directory 'dg checkpoint save DIR' wrote)");
	if (a->force && (!a->dir || strcmp(a->sub, "save")))
		return cli_usage(cmd, "--force applies to 'dg checkpoint save DIR' only");
	if (a->n_only && strcmp(a->sub, "restore"))
		return cli_usage(cmd, "--only applies to 'dg checkpoint restore' only");
	return -1;
}

/* DIR without trailing slashes (DIR.tmp-XXXXXX must be its sibling); "" and
 * "/" are refused. dir is modified in place. */
static int trim_dir(const char *cmd, char *dir)
{
	size_t n = strlen(dir);

	while (n > 1 && dir[n - 1] == '/')
		dir[--n] = '\0';
	if (!n || !strcmp(dir, "/"))
		return cli_usage(cmd, "DIR '%s' cannot be a checkpoint directory", dir);
	return -1;
}

int cmd_checkpoint(int argc, char **argv)
{
	struct ckpt_args a = { 0 };
	int rc;

	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
			  !strcmp(argv[1], "help"))) {
		fputs(save_help, stdout);
		fputs("\n", stdout);
		fputs(restore_help, stdout);
		return 0;
	}
	if (argc < 2)
		return cli_usage("checkpoint", "missing subcommand (dg checkpoint save|restore)");
	if (strcmp(argv[1], "save") && strcmp(argv[1], "restore"))
		return cli_usage("checkpoint", "unknown subcommand '%s' (there are: save, restore)",
				 argv[1]);
	a.sub = argv[1];
	if (!(a.only = calloc((size_t)argc, sizeof *a.only))) {
		fprintf(stderr, "dg: out of memory\n");
		return dg_status_to_exit(DG_ENOMEM);
	}
	rc = parse_args(argc - 1, argv + 1, &a);
	if (rc < 0 && a.dir)
		rc = trim_dir(!strcmp(a.sub, "save") ? "checkpoint save" : "checkpoint restore",
			      (char *)a.dir);     /* one of argv's strings: ours to change */
	if (rc < 0) {
		if (strcmp(a.sub, "save"))
			rc = restore_cmd(&a);
		else
			rc = a.dir ? export_cmd(&a) : snapshot_cmd(&a);
	}
	free(a.only);
	return rc;
}
