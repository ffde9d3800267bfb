/* `dg submit GRAPH.json`: send a graph to a master (task 0 of the cluster's
 * worker job by default), upload the feeds, follow the job's event stream
 * (a progress bar on a terminal, plain lines otherwise) and print the fetched
 * values as `dg eval` does (output.c), or write .npy files with --out. A graph
 * with a "training" section is a training job (doc/training.md): epochs, loss,
 * metrics and evals are followed, the last eval's values printed. The jobs API
 * it speaks is in doc/http-api.md ("Executor and master"). */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "dg/clock.h"
#include "dg/cluster.h"
#include "dg/codec.h"
#include "dg/http.h"
#include "dg/job_client.h"
#include "dg/place.h"

#define SUBMIT_LINE_S 2.0              /* a plain progress line this often (not a tty) */
#define SUBMIT_STEP_LINE_S 1.0         /* a plain step line at most this often, or per percent */

static const char usage_text[] =
	"usage: dg submit GRAPH.json [--cluster FILE | --master HOST:PORT] [--feed NAME=VALUE]...\n"
	"                 [--fetch NAME]... [--out DIR] [--steps N] [--explain]\n"
	"                 [--soft-placement] [--retry-ms MS] [--timeout-ms T]\n"
	"                 [--token-file FILE] [--header] [--json]\n"
	"\n"
	"Run a graph on the cluster: the master places its nodes on the tasks\n"
	"(devices such as /job:worker/task:1 first), cuts it into one fragment per\n"
	"task, and runs it; the fetched values are printed as text, one row of the\n"
	"last dimension per line (as dg eval does).\n"
	"\n"
	"A graph with a \"training\" section (doc/training.md) is trained instead:\n"
	"progress goes to stderr (a bar on a terminal, a line every 2 s and per\n"
	"epoch otherwise), the last evaluation's values to stdout as NAME: VALUE\n"
	"lines, then a summary line on stderr. --feed, --fetch and --steps do not\n"
	"apply to training graphs.\n"
	"\n"
	"  --cluster FILE     the cluster spec (default: $DG_CLUSTER, then the last 'dg up')\n"
	"  --master HOST:PORT the server to submit to (default: task 0 of job 'worker')\n"
	"  --feed NAME=VALUE  feed NAME: FILE.npy, FILE.txt or a JSON literal (2, [1,2])\n"
	"  --fetch NAME       fetch NAME (repeatable; default: the graph's \"fetch\")\n"
	"  -o, --out DIR      write DIR/NAME.npy for each fetch instead of printing it\n"
	"  --steps N          run N steps (default 1); values of the last step are fetched\n"
	"  --explain          print the placement and the fragments first\n"
	"  --soft-placement   run nodes placed on a missing GPU on the CPU instead of failing\n"
	"  --timeout-ms T     how long a task waits for a tensor from another (default 30000)\n"
	"  --retry-ms MS      a task lost mid-step: wait this long for it to come back, then\n"
	"                     re-run the step (default 30000; 0: fail at once)\n"
	"  --token-file FILE  bearer token for servers started with one\n"
	"  --header           print the \"# dtype [shape]\" line before each value\n"
	"  --json             print the job's final status JSON instead of the values\n"
	"  -h, --help         show this help\n"
	"\n"
	"Exit status: 0 success, 1 usage error, otherwise the error's code (doc/errors.md):\n"
	"2 invalid graph or placement, 3 not found, 10 a task is unreachable, ...\n";

struct submit_args {
	const char *graph, *cluster, *master, *out_dir, *token_file;
	const char **feeds, **fetch;     /* borrowed from argv */
	int n_feeds, n_fetch;
	long long steps, timeout_ms, retry_ms;
	bool explain, soft, header, json, steps_given;
};

enum { OPT_FEED = 256, OPT_FETCH, OPT_CLUSTER, OPT_MASTER, OPT_STEPS, OPT_EXPLAIN, OPT_SOFT,
       OPT_TOKEN, OPT_HEADER, OPT_TIMEOUT, OPT_JSON, OPT_RETRY };

static const struct option long_opts[] = {
	{ "feed", required_argument, NULL, OPT_FEED },
	{ "fetch", required_argument, NULL, OPT_FETCH },
	{ "cluster", required_argument, NULL, OPT_CLUSTER },
	{ "master", required_argument, NULL, OPT_MASTER },
	{ "out", required_argument, NULL, 'o' },
	{ "steps", required_argument, NULL, OPT_STEPS },
	{ "explain", no_argument, NULL, OPT_EXPLAIN },
	{ "soft-placement", no_argument, NULL, OPT_SOFT },
	{ "token-file", required_argument, NULL, OPT_TOKEN },
	{ "header", no_argument, NULL, OPT_HEADER },
	{ "timeout-ms", required_argument, NULL, OPT_TIMEOUT },
	{ "retry-ms", required_argument, NULL, OPT_RETRY },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static bool parse_count(const char *s, long long max, long long *out)
{
	char *end;
	long long v = strtoll(s, &end, 10);

	if (!*s || *end || v < 1 || v > max)
		return false;
	*out = v;
	return true;
}

/* Returns -1 to go on, else the exit code (help printed or usage error). */
static int parse_args(int argc, char **argv, struct submit_args *a)
{
	int c;

	a->feeds = calloc((size_t)argc + 1, sizeof *a->feeds);
	a->fetch = calloc((size_t)argc + 1, sizeof *a->fetch);
	a->steps = 1;
	a->timeout_ms = 30000;
	a->retry_ms = -1;   /* the master's default */
	if (!a->feeds || !a->fetch) {
		fprintf(stderr, "dg: out of memory\n");
		return dg_status_to_exit(DG_ENOMEM);
	}
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":ho:", long_opts, NULL)) != -1) {
		switch (c) {
		case OPT_FEED:
			if (!strchr(optarg, '=') || optarg[0] == '=')
				return cli_usage("submit", "--feed '%s' is not NAME=VALUE", optarg);
			a->feeds[a->n_feeds++] = optarg;
			break;
		case OPT_FETCH:
			if (!optarg[0])
				return cli_usage("submit", "--fetch needs a node name");
			a->fetch[a->n_fetch++] = optarg;
			break;
		case OPT_CLUSTER: a->cluster = optarg; break;
		case OPT_MASTER: a->master = optarg; break;
		case 'o': a->out_dir = optarg; break;
		case OPT_STEPS:
			if (!parse_count(optarg, 1000000000LL, &a->steps))
				return cli_usage("submit", "--steps '%s' is not a count from 1 to "
						 "1000000000", optarg);
			a->steps_given = true;
			break;
		case OPT_TIMEOUT:
			if (!parse_count(optarg, 3600000LL, &a->timeout_ms))
				return cli_usage("submit", "--timeout-ms '%s' is not from 1 "
						 "to 3600000", optarg);
			break;
		case OPT_RETRY:
			if (strcmp(optarg, "0") == 0)
				a->retry_ms = 0;
			else if (!parse_count(optarg, 3600000LL, &a->retry_ms))
				return cli_usage("submit", "--retry-ms '%s' is not from 0 to "
						 "3600000", optarg);
			break;
		case OPT_EXPLAIN: a->explain = true; break;
		case OPT_SOFT: a->soft = true; break;
		case OPT_TOKEN: a->token_file = optarg; break;
		case OPT_HEADER: a->header = true; break;
		case OPT_JSON: a->json = true; break;
		case 'h': fputs(usage_text, stdout); return 0;
		case ':': return cli_usage("submit", "option '%s' needs a value", argv[optind - 1]);
		default: return cli_usage("submit", "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return cli_usage("submit", "missing GRAPH.json");
	a->graph = argv[optind++];
	if (optind < argc)
		return cli_usage("submit", "unexpected argument '%s'", argv[optind]);
	if (a->cluster && a->master)
		return cli_usage("submit", "give --cluster or --master, not both");
	return -1;
}

/* The master's address: --master, else task 0 of job "worker" (else of the
 * first job that is not "ps", else the first task) of the cluster. Owned. */
static char *pick_master(const struct submit_args *a, struct dg_err *err)
{
	struct dg_cluster *c;
	const struct dg_task_addr *pick = NULL;
	char *addr;

	if (a->master)
		return strdup(a->master);
	if (!(c = cli_cluster_load(a->cluster, err)))
		return NULL;
	for (int i = 0; i < c->n_tasks && !pick; i++)
		if (strcmp(c->tasks[i].job, "worker") == 0 && c->tasks[i].index == 0)
			pick = &c->tasks[i];
	for (int i = 0; i < c->n_tasks && !pick; i++)
		if (strcmp(c->tasks[i].job, "ps") != 0)
			pick = &c->tasks[i];
	if (!pick && c->n_tasks > 0)
		pick = &c->tasks[0];
	addr = pick ? strdup(pick->address) : NULL;
	if (!pick)
		dg_err_set(err, DG_EINVAL, "the cluster spec has no tasks");
	dg_cluster_free(c);
	return addr;
}

struct session {
	struct dg_http_client *c;
	char id[32];
	const struct submit_args *a;
	json_t *doc;                     /* the graph document as read (with "training") */
	bool training;
	int64_t spe;                     /* training: steps per epoch (0: none) */
	double last_line;                /* not a terminal: last progress line (s) */
	int64_t last_pct;                /* steps, not a terminal: its percent (-1: none) */
	bool bar;                        /* a progress bar is on the terminal's last line */
};

/* POST /v1/jobs; prints --explain; upload feeds; start. */
static enum dg_status create_job(struct session *s, const struct dg_graph *g, char **refs,
				 struct dg_tensor **vals, struct dg_err *err)
{
	const struct submit_args *a = s->a;
	/* A training job's steps come from its "training" section. */
	json_t *body = s->training ?
		       json_pack("{s:O, s:I, s:b}", "graph", s->doc, "timeout_ms",
				 (json_int_t)a->timeout_ms, "soft_placement", a->soft) :
		       json_pack("{s:O, s:I, s:I, s:b, s:b}", "graph", g->doc, "steps",
				 (json_int_t)a->steps, "timeout_ms", (json_int_t)a->timeout_ms,
				 "soft_placement", a->soft, "start", a->n_feeds == 0);
	json_t *fetch = json_array(), *up = json_array(), *st_json = NULL;
	enum dg_status st = DG_OK;

	for (int i = 0; i < a->n_fetch; i++)
		json_array_append_new(fetch, json_string(a->fetch[i]));
	for (int i = 0; i < a->n_feeds; i++)
		json_array_append_new(up, json_string(refs[i]));
	if (a->n_fetch)
		json_object_set(body, "fetch", fetch);
	if (a->n_feeds)
		json_object_set(body, "upload", up);
	if (a->retry_ms >= 0)
		json_object_set_new(body, "retry_ms", json_integer((json_int_t)a->retry_ms));
	json_decref(fetch);
	json_decref(up);
	if (!body)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	st = dg_job_submit(s->c, body, &st_json, err);
	json_decref(body);
	if (st != DG_OK)
		return st;
	snprintf(s->id, sizeof s->id, "%s", json_string_value(json_object_get(st_json, "id")) ?
		 json_string_value(json_object_get(st_json, "id")) : "");
	s->spe = json_integer_value(json_object_get(json_object_get(st_json, "training"),
						    "steps_per_epoch"));
	if (a->explain)
		fputs(json_string_value(json_object_get(st_json, "explain")) ?
		      json_string_value(json_object_get(st_json, "explain")) : "", stdout);
	json_decref(st_json);
	for (int i = 0; st == DG_OK && i < a->n_feeds; i++)
		if ((st = dg_job_feed(s->c, s->id, refs[i], vals[i], err)) != DG_OK)
			dg_err_prefix(err, "uploading feed '%s'", refs[i]);
	if (st == DG_OK && a->n_feeds)
		st = dg_job_start(s->c, s->id, err);
	return st;
}

/* A step event: the bar on a terminal; otherwise a line, at most one per
 * second or per percent of the steps (and the last step's), so a log of a
 * long job stays short. */
static void progress(struct session *s, json_t *ev, bool tty)
{
	const struct submit_args *a = s->a;
	int64_t k = json_integer_value(json_object_get(ev, "step"));
	double ms = json_real_value(json_object_get(ev, "ms"));
	int width = 30, done = (int)((double)width * (double)k / (double)a->steps);

	if (a->steps <= 1)
		return;
	if (!tty) {
		int64_t pct = k * 100 / a->steps;
		double now = dg_mono_s();
		if (k != a->steps && pct == s->last_pct && now - s->last_line < SUBMIT_STEP_LINE_S)
			return;
		s->last_pct = pct;
		s->last_line = now;
		fprintf(stderr, "dg: step %" PRId64 "/%lld (%.3f ms)\n", k, a->steps, ms);
		return;
	}
	fputs("\r[", stderr);
	for (int i = 0; i < width; i++)
		fputc(i < done ? '#' : '.', stderr);
	fprintf(stderr, "] %" PRId64 "/%lld  %.3f ms/step", k, a->steps, ms);
	if (k == a->steps)
		fputc('\n', stderr);
	fflush(stderr);
}

/* "48.2k" for rates of people-sized precision. */
static void fmt_rate(double x, char *buf, size_t n)
{
	if (!isfinite(x) || x < 0)
		snprintf(buf, n, "-");
	else if (x >= 1e6)
		snprintf(buf, n, "%.1fM", x / 1e6);
	else if (x >= 1e3)
		snprintf(buf, n, "%.1fk", x / 1e3);
	else
		snprintf(buf, n, "%.0f", x);
}

/* x for a progress line: prec decimals, or prec significant digits when
 * that would print a small value as 0.000. */
static void fmt_val(double x, int prec, char *buf, size_t n)
{
	if (x != 0 && fabs(x) < 0.01)
		snprintf(buf, n, "%.*g", prec, x);
	else
		snprintf(buf, n, "%.*f", prec, x);
}

/* The loss and metrics of a train event: " loss 0.412  accuracy 0.861" with
 * prec digits after the point, sep between the items. */
static void fmt_losses(const json_t *ev, int prec, const char *sep, char *buf, size_t n)
{
	const json_t *v = json_object_get(ev, "loss");
	const char *k;
	char x[48] = "-";
	size_t len;

	if (json_is_number(v))
		fmt_val(json_number_value(v), prec, x, sizeof x);
	snprintf(buf, n, "loss %s", x);
	json_object_foreach((json_t *)json_object_get(ev, "metrics"), k, v) {
		len = strlen(buf);
		snprintf(x, sizeof x, "-");
		if (json_is_number(v))
			fmt_val(json_number_value(v), prec, x, sizeof x);
		snprintf(buf + len, n - len, "%s%s %s", sep, k, x);
	}
}

/* A train event: the bar on a terminal, else a line about every
 * SUBMIT_LINE_S seconds and at each epoch's end. */
static void train_progress(struct session *s, const json_t *ev, bool tty)
{
	int64_t step = json_integer_value(json_object_get(ev, "step"));
	int64_t steps = json_integer_value(json_object_get(ev, "steps"));
	int64_t epoch = json_integer_value(json_object_get(ev, "epoch"));
	int64_t epochs = json_integer_value(json_object_get(ev, "epochs"));
	double xps = json_number_value(json_object_get(ev, "examples_per_s"));
	const json_t *eta = json_object_get(ev, "eta_s");
	bool epoch_end = s->spe > 0 && step > 0 && step % s->spe == 0;
	char losses[512], rate[32], ep[64] = "";
	int width = 20, done = steps > 0 ? (int)((double)width * (double)step / (double)steps) : 0;

	if (epochs > 0)
		snprintf(ep, sizeof ep, "epoch %" PRId64 "/%" PRId64 " ", epoch, epochs);
	if (!tty) {
		if (step == 0 ||
		    (!epoch_end && step < steps && dg_mono_s() - s->last_line < SUBMIT_LINE_S))
			return;
		s->last_line = dg_mono_s();
		fmt_losses(ev, 4, " ", losses, sizeof losses);
		fprintf(stderr, "dg: %sstep %" PRId64 "/%" PRId64 " %s %.0f ex/s\n", ep, step,
			steps, losses, xps);
		return;
	}
	fmt_losses(ev, 3, "  ", losses, sizeof losses);
	fmt_rate(xps, rate, sizeof rate);
	fprintf(stderr, "\r\033[K%s[", ep);
	for (int i = 0; i < width; i++)
		fputc(i < done ? '=' : i == done ? '>' : ' ', stderr);
	fprintf(stderr, "] %" PRId64 "/%" PRId64 "  %s  %s ex/s", step, steps, losses, rate);
	if (json_is_number(eta))
		fprintf(stderr, "  ETA %d:%02d", (int)(json_number_value(eta) / 60),
			(int)json_number_value(eta) % 60);
	s->bar = true;
	fflush(stderr);
}

/* An eval event: "dg: eval after epoch 1: test_accuracy 0.8312". */
static void eval_line(struct session *s, const json_t *ev, bool tty)
{
	int64_t epoch = json_integer_value(json_object_get(ev, "epoch"));
	const char *k;
	json_t *v;

	if (tty && s->bar)
		fputs("\r\033[K", stderr);
	if (epoch > 0)
		fprintf(stderr, "dg: eval after epoch %" PRId64 ":", epoch);
	else
		fprintf(stderr, "dg: eval after step %" PRId64 ":",
			(int64_t)json_integer_value(json_object_get(ev, "step")));
	json_object_foreach(json_object_get(ev, "values"), k, v) {
		char x[48];
		if (json_is_number(v)) {
			fmt_val(json_number_value(v), 4, x, sizeof x);
			fprintf(stderr, " %s %s", k, x);
		} else
			fprintf(stderr, " %s (not a scalar)", k);
	}
	fputc('\n', stderr);
	s->bar = false;
}

/* A warning, or a replica lost for good (queue-fed jobs go on without it),
 * on its own line. */
static void fault_line(struct session *s, const json_t *ev, const char *kind)
{
	if (s->bar) {
		fputc('\n', stderr);
		s->bar = false;
	}
	if (strcmp(kind, "warning") == 0) {
		fprintf(stderr, "dg: warning: %s\n",
			json_string_value(json_object_get(ev, "message")));
		return;
	}
	fprintf(stderr, "dg: replica %lld lost (%s): %lld leased examples requeued; the others "
		"go on\n", (long long)json_integer_value(json_object_get(ev, "replica")),
		json_string_value(json_object_get(json_object_get(ev, "error"), "message")),
		(long long)json_integer_value(json_object_get(ev, "requeued")));
}

/* A task back after a fault: "dg: /job:ps/task:0 is back (epoch 3) after
 * 0.4 s, 4 variables as it recovered them: w1 version 2097153 step 0, ...";
 * a replica going on: "dg: replica 1 resumes at step 655 after 0.4 s". */
static void back_line(struct session *s, const json_t *ev, const char *kind, bool tty)
{
	const char *task = json_string_value(json_object_get(ev, "task"));

	if (tty && s->bar)
		fputs("\r\033[K", stderr);
	s->bar = false;
	if (strcmp(kind, "rewound") == 0) {
		fprintf(stderr, "dg: replica %" PRId64 " goes back from step %" PRId64 " to %" PRId64
			": %s lost the applies after its last snapshot\n",
			(int64_t)json_integer_value(json_object_get(ev, "replica")),
			(int64_t)json_integer_value(json_object_get(ev, "from")),
			(int64_t)json_integer_value(json_object_get(ev, "to")), task ? task : "a ps");
		return;
	}
	if (strcmp(kind, "resumed") == 0) {
		const json_t *rep = json_object_get(ev, "replica");
		char who[48] = "the job";
		if (rep)
			snprintf(who, sizeof who, "replica %" PRId64, (int64_t)json_integer_value(rep));
		fprintf(stderr, "dg: %s resumes at step %" PRId64 " after %.2f s\n", who,
			(int64_t)json_integer_value(json_object_get(ev, "step")),
			json_number_value(json_object_get(ev, "paused_ms")) / 1e3);
		return;
	}
	const json_t *vars = json_object_get(ev, "vars");
	fprintf(stderr, "dg: %s is back (epoch %" PRId64 ")", task ? task : "a task",
		(int64_t)json_integer_value(json_object_get(ev, "epoch")));
	if (json_array_size(vars)) {
		size_t i;
		const json_t *v;
		fprintf(stderr, "; %" PRId64 " variables as it recovered them:",
			(int64_t)json_integer_value(json_object_get(ev, "n_vars")));
		json_array_foreach(vars, i, v) {
			if (i == 4) {
				fputs(" ...", stderr);
				break;
			}
			fprintf(stderr, "%s %s version %" PRId64 " step %" PRId64, i ? "," : "",
				json_string_value(json_object_get(v, "name")),
				(int64_t)json_integer_value(json_object_get(v, "version")),
				(int64_t)json_integer_value(json_object_get(v, "step")));
		}
	}
	fputc('\n', stderr);
}

/* A retry event: "dg: step 12: /job:worker/task:1 was lost (...); retry 1
 * once it answers again" ("replica 1, step 12" for a training replica). */
static void retry_line(struct session *s, const json_t *ev, bool tty)
{
	const json_t *rep = json_object_get(ev, "replica");
	char who[48] = "";

	if (tty && s->bar)
		fputs("\r\033[K", stderr);
	if (tty && s->a->steps > 1 && !s->training)
		fputc('\n', stderr);   /* below the step bar */
	if (rep)
		snprintf(who, sizeof who, "replica %" PRId64 ", ", (int64_t)json_integer_value(rep));
	fprintf(stderr, "dg: %sstep %" PRId64 ": %s was lost (%s); retry %" PRId64 " once it "
		"answers again\n", who, (int64_t)json_integer_value(json_object_get(ev, "step")),
		json_string_value(json_object_get(ev, "task")) ?
		json_string_value(json_object_get(ev, "task")) : "a task",
		json_string_value(json_object_get(ev, "error")) ?
		json_string_value(json_object_get(ev, "error")) : "",
		(int64_t)json_integer_value(json_object_get(ev, "attempt")));
	s->bar = false;
}

/* Follow the events until the job is over. DG_OK when it is done; else the
 * job's error (code from its name). */
static enum dg_status follow(struct session *s, struct dg_err *err)
{
	bool tty = isatty(2), over = false;
	int64_t from = 0, next;
	struct dg_buf lines = { 0 };
	enum dg_status st = DG_OK;

	while (st == DG_OK && !over) {
		lines.len = 0;
		if ((st = dg_job_events(s->c, s->id, from, 10000, &lines, &next, err)) != DG_OK ||
		    (st = dg_buf_append(&lines, "", 1, err)) != DG_OK)
			break;
		if (next >= 0)
			from = next;
		for (char *line = lines.data, *nl; line && *line; line = nl + 1) {
			json_t *ev;
			const char *kind;
			if (!(nl = strchr(line, '\n')))
				break;
			ev = json_loadb(line, (size_t)(nl - line), 0, NULL);
			kind = json_string_value(json_object_get(ev, "event"));
			if (kind && strcmp(kind, "step") == 0) {
				progress(s, ev, tty);
			} else if (kind && strcmp(kind, "train") == 0) {
				train_progress(s, ev, tty);
			} else if (kind && strcmp(kind, "eval") == 0) {
				eval_line(s, ev, tty);
			} else if (kind && strcmp(kind, "retry") == 0) {
				retry_line(s, ev, tty);
			} else if (kind && (strcmp(kind, "recovered") == 0 ||
					    strcmp(kind, "resumed") == 0 ||
					    strcmp(kind, "rewound") == 0)) {
				back_line(s, ev, kind, tty);
			} else if (kind && (strcmp(kind, "warning") == 0 ||
					    strcmp(kind, "replica_lost") == 0)) {
				fault_line(s, ev, kind);
			} else if (kind && (strcmp(kind, "failed") == 0 ||
					    strcmp(kind, "canceled") == 0)) {
				json_t *e = json_object_get(ev, "error");
				enum dg_status code = dg_status_from_name(
					json_string_value(json_object_get(e, "code")));
				dg_err_set(err, code, "job %s %s: %s", s->id, kind,
					   json_string_value(json_object_get(e, "message")));
				if (json_string_length(json_object_get(e, "hint")))
					dg_err_hint(err, "%s",
						    json_string_value(json_object_get(e, "hint")));
				st = code;
				over = true;
			} else if (kind && strcmp(kind, "done") == 0) {
				over = true;
			}
			json_decref(ev);
		}
	}
	dg_buf_deinit(&lines);
	if (s->bar) {
		fputc('\n', stderr);
		s->bar = false;
	}
	return st;
}

/* Say which nodes soft placement moved to the CPU. */
static enum dg_status report_soft(struct session *s, json_t **fetch, struct dg_err *err)
{
	enum dg_status st;
	json_t *o, *v;
	size_t i;

	if ((st = dg_job_status(s->c, s->id, &o, err)) != DG_OK)
		return st;
	json_array_foreach(json_object_get(o, "soft"), i, v)
		fprintf(stderr, "dg: node '%s' is placed on %s, but there is no GPU there: it ran "
			"on the CPU (soft placement)\n",
			json_string_value(json_object_get(v, "node")),
			json_string_value(json_object_get(v, "device")));
	*fetch = json_incref(json_object_get(o, "fetch"));
	json_decref(o);
	return *fetch ? DG_OK : dg_err_set(err, DG_EINTERNAL, "job status without \"fetch\"");
}

static enum dg_status get_results(struct session *s, json_t *fetch, struct dg_err *err)
{
	int n = (int)json_array_size(fetch);
	char **names = calloc((size_t)n + 1, sizeof *names);
	struct dg_tensor **vals = calloc((size_t)n + 1, sizeof *vals);
	enum dg_status st = names && vals ? DG_OK : dg_err_set(err, DG_ENOMEM, "out of memory");

	for (int i = 0; st == DG_OK && i < n; i++) {
		names[i] = (char *)json_string_value(json_array_get(fetch, (size_t)i));
		st = dg_job_result(s->c, s->id, names[i], &vals[i], err);
	}
	if (st == DG_OK && s->a->out_dir)
		st = cli_check_out_names(names, n, err);
	if (st == DG_OK)
		st = cli_write_values(s->a->out_dir, s->a->header, names, vals, n, err);
	for (int i = 0; vals && i < n; i++)
		dg_tensor_free(vals[i]);
	free(vals);
	free(names);
	return st;
}

/* The end of a training job: the last eval's values on stdout ("NAME: VALUE";
 * values of more than one element as dg eval prints them), or the status JSON
 * with --json; then the summary line on stderr. */
static enum dg_status training_report(struct session *s, struct dg_err *err)
{
	json_t *o = NULL, *fetch, *v;
	const json_t *tr, *eval;
	enum dg_status st = dg_job_status(s->c, s->id, &o, err);
	size_t i;

	if (st != DG_OK)
		return st;
	tr = json_object_get(o, "training");
	eval = json_object_get(tr, "eval");
	fetch = json_object_get(o, "fetch");
	if (s->a->json) {
		char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		if (text)
			puts(text);
		free(text);
		st = text ? DG_OK : dg_err_set(err, DG_ENOMEM, "out of memory");
	} else if (s->a->out_dir) {
		st = get_results(s, fetch, err);
	} else {
		json_array_foreach(fetch, i, v) {
			const char *name = json_string_value(v);
			const json_t *x = json_object_get(eval, name ? name : "");
			if (!name)
				continue;
			if (json_is_number(x)) {
				printf("%s: %.6g\n", name, json_number_value(x));
				continue;
			}
			json_t *one = json_pack("[s]", name);
			printf("%s:\n", name);
			fflush(stdout);
			st = one ? get_results(s, one, err) : DG_ENOMEM;
			json_decref(one);
			if (st != DG_OK)
				break;
		}
	}
	if (st == DG_OK) {
		double secs = json_number_value(json_object_get(json_object_get(o, "ms"), "total"))
			      / 1e3;
		long long ex = (long long)json_integer_value(json_object_get(tr, "examples"));
		long long epochs = (long long)json_integer_value(json_object_get(tr, "epochs"));
		char what[64] = "";
		if (epochs > 0)
			snprintf(what, sizeof what, "%lld epoch%s ", epochs,
				 epochs == 1 ? "" : "s");
		fprintf(stderr, "dg: trained %s(%lld steps x %lld replica%s, %lld examples) in "
			"%.1f s: %.0f examples/s\n", what,
			(long long)json_integer_value(json_object_get(tr, "steps")),
			(long long)json_integer_value(json_object_get(tr, "replicas")),
			json_integer_value(json_object_get(tr, "replicas")) == 1 ? "" : "s", ex,
			secs, secs > 0 ? (double)ex / secs : 0.0);
	}
	json_decref(o);
	return st;
}

/* Load the graph file: a training graph's "training" section is kept in
 * s->doc for the master and left out of the local validation (g). */
static struct dg_graph *load_graph(struct session *s, const char *path, struct dg_err *err)
{
	json_error_t je;
	json_t *copy;
	struct dg_graph *g;

	s->doc = json_load_file(path, 0, &je);
	if (!s->doc || !json_is_object(s->doc) ||
	    (!json_object_get(s->doc, "training") && !master_graph_has_queue_ops(s->doc)))
		return dg_graph_load(path, master_op_find, err);   /* with its messages */
	s->training = json_object_get(s->doc, "training") != NULL;
	/* Queue ops are checked as the master will: with their Queue's components. */
	if (!(copy = json_deep_copy(s->doc))) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	json_object_del(copy, "training");
	if (master_queue_expand(copy, err) != DG_OK) {
		json_decref(copy);
		dg_err_prefix(err, "%s", path);
		return NULL;
	}
	g = dg_graph_from_json(copy, master_op_find, err);
	json_decref(copy);
	if (!g)
		dg_err_prefix(err, "%s", path);
	return g;
}

static int run_submit(const struct submit_args *a)
{
	struct dg_err err = { 0 };
	struct session s = { .a = a, .last_pct = -1 };
	struct dg_graph *g = NULL;
	char **refs = calloc((size_t)a->n_feeds + 1, sizeof *refs), *master = NULL, *token = NULL;
	struct dg_tensor **vals = calloc((size_t)a->n_feeds + 1, sizeof *vals);
	json_t *fetch = NULL;
	enum dg_status st = DG_OK;

	if (!refs || !vals)
		st = dg_err_set(&err, DG_ENOMEM, "out of memory");
	/* Validate here first: errors come back at once, and --feed values are
	 * read with the dtypes the graph declares. */
	if (st == DG_OK && !(g = load_graph(&s, a->graph, &err)))
		st = err.code;
	if (st == DG_OK && s.training && (a->n_feeds || a->n_fetch || a->steps_given)) {
		json_decref(s.doc);
		dg_graph_free(g);
		free(refs);
		free(vals);
		return cli_usage("submit", "--feed, --fetch and --steps do not apply to a training "
				 "graph (its \"training\" section says what to run)");
	}
	for (int i = 0; st == DG_OK && i < a->n_feeds; i++)
		st = cli_feed_parse(g, a->feeds[i], &refs[i], &vals[i], &err);
	if (st == DG_OK && a->token_file && !(token = cli_token_load(a->token_file, &err)))
		st = err.code;
	if (st == DG_OK && !(master = pick_master(a, &err)))
		st = err.code ? err.code : dg_err_set(&err, DG_ENOMEM, "out of memory");
	if (st == DG_OK && !(s.c = dg_http_client_new(master, token, a->timeout_ms + 60000, &err)))
		st = err.code;
	if (st == DG_OK)
		st = create_job(&s, g, refs, vals, &err);
	if (st == DG_OK)
		st = follow(&s, &err);
	if (st == DG_OK)
		st = report_soft(&s, &fetch, &err);
	if (st == DG_OK && s.training) {
		st = training_report(&s, &err);
	} else if (st == DG_OK && a->json) {
		json_t *o = NULL;
		if ((st = dg_job_status(s.c, s.id, &o, &err)) == DG_OK) {
			char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
			if (text)
				puts(text);
			free(text);
		}
		json_decref(o);
	} else if (st == DG_OK) {
		st = get_results(&s, fetch, &err);
	}
	for (int i = 0; i < a->n_feeds; i++) {
		if (refs)
			free(refs[i]);
		if (vals)
			dg_tensor_free(vals[i]);
	}
	free(refs);
	free(vals);
	free(master);
	free(token);
	json_decref(fetch);
	json_decref(s.doc);
	dg_http_client_free(s.c);
	dg_graph_free(g);
	return st == DG_OK ? 0 : cli_fail(&err);
}

int cmd_submit(int argc, char **argv)
{
	struct submit_args a = { 0 };
	int rc = parse_args(argc, argv, &a);

	if (rc < 0)
		rc = run_submit(&a);
	free(a.feeds);
	free(a.fetch);
	return rc;
}
