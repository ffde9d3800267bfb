/* `dg job ls|show|cancel`: the jobs of the cluster's masters from the shell.
 * A job lives on the task that mastered it (doc/http-api.md, "Jobs (master)"),
 * so ls asks every worker task (job "worker", or every task when there is
 * none) and show/cancel look the ID up on each unless --task names one.
 * --master HOST:PORT talks to one server. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "dg/buf.h"
#include "dg/clock.h"
#include "dg/http.h"
#include "dg/job_client.h"

#define QUERY_TIMEOUT_MS 10000L         /* per request: the answers are small JSON */
#define CANCEL_WAIT_MS 10000            /* how long cancel waits for the job to stop */

enum { OPT_CLUSTER = 256, OPT_MASTER, OPT_TOKEN, OPT_TASK, OPT_JSON, OPT_METRICS, OPT_STEPS,
       OPT_BY_STEP };

struct job_args {
	const char *sub;                /* "ls", "show", "cancel" */
	const char *cluster, *master, *token_file, *task;
	bool json;
	bool metrics;                   /* show --metrics: the training job's CSV */
	bool steps;                     /* show --steps: a queue-fed job's step ledger */
	bool by_step;                   /*   --by-step: one row per step, replicas together */
	char **pos;                     /* positional arguments, borrowed from argv */
	int n_pos;
};

static const struct option long_opts[] = {
	{ "cluster", required_argument, NULL, OPT_CLUSTER },
	{ "master", required_argument, NULL, OPT_MASTER },
	{ "token-file", required_argument, NULL, OPT_TOKEN },
	{ "task", required_argument, NULL, OPT_TASK },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "metrics", no_argument, NULL, OPT_METRICS },
	{ "steps", no_argument, NULL, OPT_STEPS },
	{ "by-step", no_argument, NULL, OPT_BY_STEP },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static const char job_help[] =
	"usage: dg job ls|show|cancel ... [--cluster FILE | --master HOST:PORT]\n"
	"\n"
	"List, inspect and cancel the jobs of a cluster. A job lives on the task that\n"
	"mastered it (the one 'dg submit' sent it to); the commands ask the tasks of\n"
	"job \"worker\" (every task when the cluster has no such job).\n"
	"\n"
	"  ls [--json]                   one line per job: ID TASK STATE STEPS ELAPSED\n"
	"                                ERROR (--json: the jobs as JSON, with \"task\")\n"
	"  show ID [--task J/I] [--json] a job's state, steps, error, placement, timings;\n"
	"                                a training job's summary and metrics table\n"
	"  show ID --metrics             a training job's metrics as CSV (step, time_s,\n"
	"                                epoch, loss, metrics, examples_per_s, evals)\n"
	"  show ID --steps               a queue-fed training job's step ledger as CSV\n"
	"                                (step, replica, counted, examples_applied,\n"
	"                                examples_requeued, ms, lease, reason, ids: the\n"
	"                                ids of a batch not applied), then its totals\n"
	"                                on stderr\n"
	"  show ID --steps --by-step     one row per step: step, replicas_counted,\n"
	"                                replicas_dropped (replica lists), examples\n"
	"                                applied and requeued, ms (the slowest)\n"
	"  cancel ID [--task J/I]        cancel a job and wait (10 s at most) until it\n"
	"                                stops\n"
	"\n"
	"options:\n"
	"  --cluster FILE     the cluster spec (default: $DG_CLUSTER, then the last\n"
	"                     'dg up')\n"
	"  --master HOST:PORT talk to this one server instead of a cluster\n"
	"  --task J/I         the task holding the job, e.g. worker/1 (default: the\n"
	"                     one that knows the ID)\n"
	"  --token-file F     send the bearer token in F (first line)\n"
	"  -h, --help         show this help\n";

/* --- the masters ---------------------------------------------------------------- */

static void *client_open(const char *address, const char *token, struct dg_err *err)
{
	return dg_http_client_new(address, token, QUERY_TIMEOUT_MS, err);
}

static void client_close(void *c)
{
	dg_http_client_free(c);
}

static const struct cli_client_ops client_ops = { client_open, client_close };

/* The servers to ask: --master, else --task's task, else the tasks of job
 * "worker" of the cluster (every task when it has no "worker" job). */
static enum dg_status targets_open(const struct job_args *a, struct cli_targets *ts,
				   struct dg_err *err)
{
	const struct cli_target_query q = {
		.cluster = a->cluster, .server = a->master, .task = a->task, .job = "worker",
		.token_file = a->token_file,
	};

	return cli_targets_open(&q, &client_ops, ts, err);
}

/* The task that knows job id: its index in ts and the job's status (*out,
 * owned). ENOTFOUND when none does; ECONFLICT when several do (IDs are per
 * master); a task that could not answer makes the lookup fail with its error,
 * since the job might be there. */
static enum dg_status find_job(const struct cli_targets *ts, const char *id, int *which,
			       json_t **out, struct dg_err *err)
{
	struct dg_err e, failed = { 0 };
	const char *failed_label = NULL;
	char found[256] = "";
	enum dg_status st;
	int n_found = 0;

	*out = NULL;
	*which = -1;
	for (int i = 0; i < ts->n; i++) {
		json_t *o;
		memset(&e, 0, sizeof e);
		if (dg_job_status(ts->t[i].client, id, &o, &e) != DG_OK) {
			if (e.code != DG_ENOTFOUND && !failed_label) {
				failed = e;
				failed_label = ts->t[i].label;
			}
			continue;
		}
		size_t used = strlen(found);
		snprintf(found + used, sizeof found - used, "%s%s", n_found ? ", " : "",
			 ts->t[i].label);
		if (n_found++ == 0) {
			*out = o;
			*which = i;
		} else {
			json_decref(o);
		}
	}
	if (n_found > 1) {
		json_decref(*out);
		*out = NULL;
		st = dg_err_set(err, DG_ECONFLICT, "job '%s' exists on several tasks: %s", id,
				found);
		dg_err_hint(err, "name one with --task J/I, e.g. --task %s", ts->t[*which].label);
	} else if (n_found == 1) {
		st = DG_OK;
	} else if (failed_label) {
		*err = failed;
		if (ts->n > 1)
			dg_err_prefix(err, "%s", failed_label);
		st = err->code;
	} else {
		char asked[256] = "";
		for (int i = 0; i < ts->n; i++) {
			size_t used = strlen(asked);
			snprintf(asked + used, sizeof asked - used, "%s%s", i ? ", " : "",
				 ts->t[i].label);
		}
		st = dg_err_set(err, DG_ENOTFOUND, "job '%s' not found on %s", id, asked);
		dg_err_hint(err, "list the jobs with: dg job ls");
	}
	return st;
}

/* --- printing --------------------------------------------------------------------- */

static const char *str_or(const json_t *o, const char *key, const char *dflt)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? s : dflt;
}

static long long int_of(const json_t *o, const char *key)
{
	return (long long)json_integer_value(json_object_get(o, key));
}

static double ms_of(const json_t *o, const char *key)
{
	return json_number_value(json_object_get(json_object_get(o, "ms"), key));
}

/* A duration for people: "850 ms", "12.3 s", "4m05s". */
static void fmt_ms(double ms, char *buf, size_t n)
{
	if (ms < 1000)
		snprintf(buf, n, "%.1f ms", ms);
	else if (ms < 60000)
		snprintf(buf, n, "%.1f s", ms / 1000);
	else
		snprintf(buf, n, "%dm%02ds", (int)(ms / 60000), (int)(ms / 1000) % 60);
}

/* The error of a failed or canceled job, "-" when it has none. */
static void fmt_error(const json_t *job, char *buf, size_t n)
{
	const json_t *e = json_object_get(job, "error");

	if (!json_is_object(e))
		snprintf(buf, n, "-");
	else
		snprintf(buf, n, "%s: %s", str_or(e, "code", "?"), str_or(e, "message", ""));
}

static void print_status(const char *label, const json_t *j)
{
	const json_t *e = json_object_get(j, "error"), *v;
	char t1[32], t2[32], t3[32];
	size_t i;

	fmt_ms(ms_of(j, "total"), t1, sizeof t1);
	fmt_ms(ms_of(j, "last_step"), t2, sizeof t2);
	fmt_ms(ms_of(j, "mean_step"), t3, sizeof t3);
	printf("job:        %s\n", str_or(j, "id", "?"));
	printf("task:       %s\n", label);
	printf("state:      %s\n", str_or(j, "state", "?"));
	printf("steps:      %lld/%lld\n", int_of(j, "steps_done"), int_of(j, "steps"));
	if (json_is_object(e)) {
		printf("error:      %s: %s\n", str_or(e, "code", "?"), str_or(e, "message", ""));
		if (str_or(e, "hint", "")[0])
			printf("hint:       %s\n", str_or(e, "hint", ""));
	} else {
		printf("error:      -\n");
	}
	printf("time:       %s total, %s last step, %s mean step\n", t1, t2, t3);
	fputs("fetch:     ", stdout);
	json_array_foreach(json_object_get(j, "fetch"), i, v)
		printf(" %s", json_string_value(v) ? json_string_value(v) : "?");
	fputs(i ? "\n" : " -\n", stdout);
	printf("fragments:  %lld\n", int_of(j, "fragments"));
	json_array_foreach(json_object_get(j, "tasks"), i, v)
		printf("  %-24s %-22s %lld nodes\n", str_or(v, "device", "?"),
		       str_or(v, "address", "?"), int_of(v, "nodes"));
	json_array_foreach(json_object_get(j, "soft"), i, v)
		printf("soft:       %s placed on the CPU (asked for %s)\n", str_or(v, "node", "?"),
		       str_or(v, "device", "?"));
}

static int print_json(json_t *o)
{
	char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	struct dg_err err = { 0 };

	if (!s) {
		dg_err_set(&err, DG_ENOMEM, "out of memory");
		return cli_fail(&err);
	}
	puts(s);
	free(s);
	return 0;
}

/* --- the subcommands ------------------------------------------------------------- */

/* ls: every target's list; a task that does not answer is reported on stderr
 * and makes the exit code its error's, but the others are still listed. */
static int job_ls(const struct job_args *a, const struct cli_targets *ts)
{
	struct dg_err err = { 0 }, first = { 0 };
	json_t *all = json_array();
	int rc = 0;

	if (!all) {
		dg_err_set(&err, DG_ENOMEM, "out of memory");
		return cli_fail(&err);
	}
	for (int i = 0; i < ts->n; i++) {
		json_t *o, *v;
		size_t k;
		memset(&err, 0, sizeof err);
		if (dg_job_list(ts->t[i].client, &o, &err) != DG_OK) {
			dg_err_prefix(&err, "%s", ts->t[i].label);
			if (!first.code)
				first = err;
			fprintf(stderr, "dg: %s\n", err.msg);
			continue;
		}
		json_array_foreach(json_object_get(o, "jobs"), k, v) {
			if (!json_is_object(v))
				continue;
			json_object_set_new(v, "task", json_string(ts->t[i].label));
			json_array_append(all, v);
		}
		json_decref(o);
	}
	if (a->json) {
		json_t *doc = json_pack("{s:O}", "jobs", all);
		rc = doc ? print_json(doc) : 0;
		json_decref(doc);
	} else {
		size_t k;
		json_t *v;
		printf("%-8s %-12s %-9s %-15s %-10s %s\n", "ID", "TASK", "STATE", "STEPS",
		       "ELAPSED", "ERROR");
		json_array_foreach(all, k, v) {
			char steps[48], el[32], e[320];
			snprintf(steps, sizeof steps, "%lld/%lld", int_of(v, "steps_done"),
				 int_of(v, "steps"));
			fmt_ms(ms_of(v, "total"), el, sizeof el);
			fmt_error(v, e, sizeof e);
			printf("%-8s %-12s %-9s %-15s %-10s %s\n", str_or(v, "id", "?"),
			       str_or(v, "task", "?"), str_or(v, "state", "?"), steps, el, e);
		}
	}
	json_decref(all);
	if (first.code) {
		if (first.hint[0])
			fprintf(stderr, "dg: hint: %s\n", first.hint);
		return dg_status_to_exit(first.code);
	}
	return rc;
}

/* A number of the training object, "-" when null. */
static void fmt_num(const json_t *v, const char *fmt, char *buf, size_t n)
{
	if (json_is_number(v))
		snprintf(buf, n, fmt, json_number_value(v));
	else
		snprintf(buf, n, "-");
}

/* The training summary, then the metrics CSV as a table (columns aligned). */
static void print_training(const json_t *tr, const char *csv)
{
	const json_t *v;
	const char *k;
	char a[32], b[32];

	fmt_num(json_object_get(tr, "loss"), "%.6g", a, sizeof a);
	fmt_num(json_object_get(tr, "examples_per_s"), "%.0f", b, sizeof b);
	printf("training:   %s, %lld replica(s)", str_or(tr, "mode", "?"), int_of(tr, "replicas"));
	if (int_of(tr, "replica_group") > 1)
		printf(" of %lld tasks", int_of(tr, "replica_group"));
	if (int_of(tr, "towers") > 1)
		printf(", %lld towers", int_of(tr, "towers"));
	if (int_of(tr, "microbatches") > 1)
		printf(", %lld micro-batches a step", int_of(tr, "microbatches"));
	if (int_of(tr, "backup"))
		printf(", %lld backup(s)", int_of(tr, "backup"));
	printf(", %lld epochs, %lld steps per replica, batch %lld\n", int_of(tr, "epochs"),
	       int_of(tr, "steps"), int_of(tr, "batch"));
	printf("examples:   %lld (%s examples/s), %lld stale applies\n", int_of(tr, "examples"), b,
	       int_of(tr, "stale"));
	printf("loss:       %s", a);
	json_object_foreach((json_t *)json_object_get(tr, "metrics"), k, v) {
		fmt_num(v, "%.6g", a, sizeof a);
		printf("  %s %s", k, a);
	}
	fputs("\neval:      ", stdout);
	if (!json_object_size(json_object_get(tr, "eval")))
		fputs(" -", stdout);
	json_object_foreach((json_t *)json_object_get(tr, "eval"), k, v) {
		fmt_num(v, "%.6g", a, sizeof a);
		printf(" %s %s", k, a);
	}
	fputs("\nmetrics:\n", stdout);
	for (const char *line = csv; line && *line;) {
		const char *nl = strchr(line, '\n'), *end = nl ? nl : line + strlen(line);
		fputs("  ", stdout);
		for (const char *c = line; c < end;) {
			const char *comma = memchr(c, ',', (size_t)(end - c));
			int len = (int)((comma ? comma : end) - c);
			printf("%-13.*s ", len, c);
			c = comma ? comma + 1 : end;
		}
		fputc('\n', stdout);
		line = nl ? nl + 1 : end;
	}
}

/* One step of --by-step: which replicas counted and were dropped (bit r),
 * the examples, the slowest replica's time. */
struct step_sum {
	uint64_t counted, dropped;
	long long applied, requeued;
	double ms;
	bool seen;
};

/* Print a replica set as "0 2" (empty when none). */
static void print_replicas(uint64_t set)
{
	bool first = true;

	for (int r = 0; r < 64; r++)
		if (set >> r & 1) {
			printf("%s%d", first ? "" : " ", r);
			first = false;
		}
}

/* --steps --by-step: the ledger's rows summed per step (for sync replicas, one
 * step of them all; async replicas' t-th steps are not one moment). Rows
 * without a step (a lost replica's leases, the reconciled row) are summed in a
 * last row without a step. */
static int print_by_step(const struct dg_buf *csv)
{
	struct step_sum *s = NULL, rest = { 0 };
	long long n = 0;

	printf("step,replicas_counted,replicas_dropped,examples_applied,examples_requeued,ms\n");
	for (char *line = csv->data, *nl; line && *line; line = nl + 1) {
		long long step, a, q;
		int r, k;
		double ms = 0;
		nl = strchr(line, '\n');
		struct step_sum *t = NULL;
		if (sscanf(line, "%lld,%d,%d,%lld,%lld,%lf", &step, &r, &k, &a, &q, &ms) >= 5 &&
		    step >= 0) {
			if (step >= n) {
				long long m = step + 1 > 2 * n ? step + 1 : 2 * n;
				struct step_sum *p = realloc(s, (size_t)m * sizeof *p);
				if (!p) {
					free(s);
					fprintf(stderr, "dg: out of memory\n");
					return 1;
				}
				memset(p + n, 0, (size_t)(m - n) * sizeof *p);
				s = p;
				n = m;
			}
			t = &s[step];
		} else if (sscanf(line, ",%d,%d,%lld,%lld", &r, &k, &a, &q) == 4) {
			t = &rest;
		}
		if (t) {
			if (r >= 0 && r < 64) {
				t->counted |= (uint64_t)(k != 0) << r;
				t->dropped |= (uint64_t)(k == 0) << r;
			}
			t->applied += a;
			t->requeued += q;
			t->ms = ms > t->ms ? ms : t->ms;
			t->seen = true;
		}
		if (!nl)
			break;
	}
	for (long long i = 0; i <= n; i++) {
		const struct step_sum *t = i < n ? &s[i] : &rest;
		if (!t->seen)
			continue;
		if (i < n)
			printf("%lld", i);
		putchar(',');
		print_replicas(t->counted);
		putchar(',');
		print_replicas(t->dropped);
		printf(",%lld,%lld,", t->applied, t->requeued);
		if (i < n)
			printf("%.3f", t->ms);
		putchar('\n');
	}
	free(s);
	return 0;
}

/* --steps: the ledger as it is on stdout (or per step with by_step); on
 * stderr, per replica, its steps, how many counted, and the examples applied
 * and requeued. */
static int show_steps(struct dg_http_client *c, const char *id, bool by_step)
{
	struct dg_err err = { 0 };
	struct dg_buf csv = { 0 };
	int64_t n[64] = { 0 }, counted[64] = { 0 }, applied = 0, requeued = 0;
	int top = -1;

	if (dg_job_steps(c, id, &csv, &err) != DG_OK) {
		dg_buf_deinit(&csv);
		return cli_fail(&err);
	}
	if (by_step && print_by_step(&csv) != 0) {
		dg_buf_deinit(&csv);
		return 1;
	}
	if (!by_step)
		fwrite(csv.data ? csv.data : "", 1, csv.len, stdout);
	for (char *line = csv.data, *nl; line && *line; line = nl + 1) {
		long long step, a, q;
		int r, k;
		nl = strchr(line, '\n');
		/* step,replica,counted,applied,requeued,...; a reconciled row, and a
		 * lease no step reported, has no step */
		if (sscanf(line, "%lld,%d,%d,%lld,%lld", &step, &r, &k, &a, &q) == 5 ||
		    sscanf(line, ",%d,%d,%lld,%lld", &r, &k, &a, &q) == 4) {
			applied += a;
			requeued += q;
			if (r >= 0 && r < 64 && line[0] != ',') {
				n[r]++;
				counted[r] += k;
				top = r > top ? r : top;
			}
		}
		if (!nl)
			break;
	}
	for (int r = 0; r <= top; r++)
		fprintf(stderr, "dg: replica %d: %lld steps, %lld counted (%.0f%%)\n", r,
			(long long)n[r], (long long)counted[r],
			n[r] ? 100.0 * (double)counted[r] / (double)n[r] : 0.0);
	fprintf(stderr, "dg: %lld examples applied, %lld requeued (dropped steps, leases that "
		"ran out or a lost replica held)\n",
		(long long)applied, (long long)requeued);
	dg_buf_deinit(&csv);
	return 0;
}

static int job_show(const struct job_args *a, const struct cli_targets *ts)
{
	struct dg_err err = { 0 };
	struct dg_buf csv = { 0 };
	const json_t *tr;
	json_t *o;
	int which, rc = 0;

	if (find_job(ts, a->pos[0], &which, &o, &err) != DG_OK)
		return cli_fail(&err);
	if (a->steps) {
		json_decref(o);
		return show_steps(ts->t[which].client, a->pos[0], a->by_step);
	}
	tr = json_object_get(o, "training");
	if ((a->metrics || (!a->json && tr)) &&
	    dg_job_metrics(ts->t[which].client, a->pos[0], &csv, &err) != DG_OK) {
		json_decref(o);
		dg_buf_deinit(&csv);
		return cli_fail(&err);
	}
	if (a->metrics) {
		fwrite(csv.data ? csv.data : "", 1, csv.len, stdout);
	} else if (a->json) {
		rc = print_json(o);
	} else {
		print_status(ts->t[which].label, o);
		if (tr)
			print_training(tr, csv.data);
	}
	json_decref(o);
	dg_buf_deinit(&csv);
	return rc;
}

static bool is_final(const char *state)
{
	return strcmp(state, "done") == 0 || strcmp(state, "failed") == 0 ||
	       strcmp(state, "canceled") == 0;
}

/* cancel: DELETE on the task that knows the job, then poll its status until
 * the running step has been aborted (the master stops it asynchronously). */
static int job_cancel(const struct job_args *a, const struct cli_targets *ts)
{
	struct dg_err err = { 0 };
	json_t *o = NULL;
	int which, rc;

	if (find_job(ts, a->pos[0], &which, &o, &err) != DG_OK)
		return cli_fail(&err);
	const struct cli_target *t = &ts->t[which];
	bool was_final = is_final(str_or(o, "state", ""));
	json_decref(o);
	o = NULL;
	if (dg_job_cancel(t->client, a->pos[0], &o, &err) != DG_OK)
		goto fail;
	for (int waited = 0; !is_final(str_or(o, "state", "")) && waited < CANCEL_WAIT_MS;
	     waited += 50) {
		dg_sleep_ms(50);
		json_decref(o);
		if (dg_job_status(t->client, a->pos[0], &o, &err) != DG_OK)
			goto fail;
	}
	const char *state = str_or(o, "state", "?");
	if (was_final)
		printf("job %s on %s had already ended: %s\n", a->pos[0], t->label, state);
	else if (!is_final(state))
		printf("job %s on %s: cancel asked, still %s after %d s\n", a->pos[0], t->label,
		       state, CANCEL_WAIT_MS / 1000);
	else
		printf("job %s on %s: %s\n", a->pos[0], t->label, state);
	json_decref(o);
	return 0;
fail:
	rc = cli_fail(&err);
	json_decref(o);
	return rc;
}

/* --- entry ---------------------------------------------------------------------- */

/* Returns -1 to go on, else the exit code (help printed or usage error). */
static int parse_args(int argc, char **argv, struct job_args *a)
{
	char cmd[32], job[64];
	int c, index;

	snprintf(cmd, sizeof cmd, "job %s", a->sub);
	optind = 0;      /* glibc: full re-initialisation, argv[0] is the subcommand */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
		switch (c) {
		case 'h': fputs(job_help, stdout); return 0;
		case OPT_CLUSTER: a->cluster = optarg; break;
		case OPT_MASTER: a->master = optarg; break;
		case OPT_TOKEN: a->token_file = optarg; break;
		case OPT_TASK: a->task = optarg; break;
		case OPT_JSON: a->json = true; break;
		case OPT_METRICS: a->metrics = true; break;
		case OPT_STEPS: a->steps = true; break;
		case OPT_BY_STEP: a->by_step = true; break;
		case ':': return cli_usage(cmd, "option '%s' needs a value", argv[optind - 1]);
		default: return cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
		}
	}
	a->pos = argv + optind;
	a->n_pos = argc - optind;
	bool ls = strcmp(a->sub, "ls") == 0;
	if (a->cluster && a->master)
		return cli_usage(cmd, "give --cluster or --master, not both");
	if (a->task && a->master)
		return cli_usage(cmd, "give --task or --master, not both");
	if (a->task && ls)
		return cli_usage(cmd, "--task does not apply to 'dg job ls'");
	if (a->task && !cli_task_parse(a->task, job, sizeof job, &index))
		return cli_usage(cmd, "--task '%s': use JOB/INDEX, e.g. worker/0", a->task);
	if (a->metrics && strcmp(a->sub, "show") != 0)
		return cli_usage(cmd, "--metrics applies to 'dg job show' only");
	if (a->metrics && a->json)
		return cli_usage(cmd, "give --metrics or --json, not both");
	if (a->by_step && !a->steps)
		return cli_usage(cmd, "--by-step goes with --steps");
	if (a->steps && (strcmp(a->sub, "show") != 0 || a->metrics || a->json))
		return cli_usage(cmd, "--steps applies to 'dg job show' alone (not with --metrics "
				 "or --json)");
	if (a->json && strcmp(a->sub, "cancel") == 0)
		return cli_usage(cmd, "--json does not apply to 'dg job cancel'");
	if (!ls && a->n_pos < 1)
		return cli_usage(cmd, "missing the job ID (see 'dg job ls')");
	if (a->n_pos > (ls ? 0 : 1))
		return cli_usage(cmd, "unexpected argument '%s'", a->pos[ls ? 0 : 1]);
	return -1;
}

int cmd_job(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(const struct job_args *a, const struct cli_targets *ts);
	} subs[] = { { "ls", job_ls }, { "show", job_show }, { "cancel", job_cancel } };
	struct job_args a = { 0 };
	struct cli_targets ts;
	struct dg_err err = { 0 };
	int rc;

	if (argc < 2)
		return cli_usage("job", "missing subcommand: ls, show or cancel");
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		fputs(job_help, stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
		if (strcmp(argv[1], subs[i].name) != 0)
			continue;
		a.sub = subs[i].name;
		if ((rc = parse_args(argc - 1, argv + 1, &a)) >= 0)
			return rc;
		if (targets_open(&a, &ts, &err) != DG_OK)
			return cli_fail(&err);
		rc = subs[i].fn(&a, &ts);
		cli_targets_close(&ts);
		return rc;
	}
	if (argv[1][0] == '-')
		return cli_usage("job", "'%s' before the subcommand: options go after it, e.g. "
				 "'dg job ls --cluster FILE'", argv[1]);
	return cli_usage("job", "unknown subcommand '%s' (ls, show, cancel)", argv[1]);
}
