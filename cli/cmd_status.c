/* `dg status`: every task of a cluster asked for its health (and a master's
 * jobs), as a table or JSON. */
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dg/client.h"
#include "dg/clock.h"
#include "dg/cluster.h"
#include "dg/http.h"
#include "dg/job_client.h"
#include "dg/task_client.h"
#include "up.h"

#define STATUS_TIMEOUT_MS 5000  /* per request: a hung task must not hang it */

/* What one task said. */
struct task_status {
	char name[96];
	const char *address;    /* borrowed from the cluster */
	bool up;
	bool refused;           /* answered 401: up, but we lack the token */
	char why[256];          /* when !up */
	char hint[160];         /* the error's hint, when it had one */
	json_t *health;         /* owned */
	json_t *jobs;           /* owned, NULL when the task has no jobs API */
	json_t *sup;            /* borrowed: dg up's supervisor's entry, or NULL */
};

static void probe(struct task_status *s, const char *token)
{
	struct dg_err err = { 0 };
	struct dg_http_client *c = dg_http_client_new(s->address, token, STATUS_TIMEOUT_MS, &err);

	if (c && dg_task_health(c, &s->health, &err) == DG_OK) {
		s->up = true;
	} else {
		s->refused = err.code == DG_EUNAUTHORIZED;
		snprintf(s->why, sizeof s->why, "%s", err.msg);
		snprintf(s->hint, sizeof s->hint, "%s", err.hint);
	}
	/* The master's job list; a task without it (404 until the master lands,
	 * 401/403 stay errors of health) is simply not listed. */
	if (s->up)
		dg_job_list(c, &s->jobs, NULL);
	dg_http_client_free(c);
}

static void fmt_bytes(char *out, size_t n, double b)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int u = 0;

	while (b >= 1024 && u < 4) {
		b /= 1024;
		u++;
	}
	snprintf(out, n, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

static void fmt_uptime(char *out, size_t n, double s)
{
	long t = (long)s;

	if (t < 60)
		snprintf(out, n, "%lds", t);
	else if (t < 3600)
		snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
	else
		snprintf(out, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
}

static void print_jobs(const struct task_status *s)
{
	json_t *list = json_is_array(s->jobs) ? s->jobs : json_object_get(s->jobs, "jobs");
	size_t i;
	json_t *j;

	if (!json_is_array(list) || json_array_size(list) == 0)
		return;
	printf("jobs on %s:\n", s->name);
	json_array_foreach(list, i, j) {
		const char *id = json_string_value(json_object_get(j, "id"));
		const char *state = json_string_value(json_object_get(j, "state"));
		json_t *steps = json_object_get(j, "steps"), *done = json_object_get(j, "steps_done");

		printf("  %-20s %-10s", id ? id : "?", state ? state : "?");
		if (json_is_integer(steps) && json_is_integer(done))
			printf(" step %lld/%lld", json_integer_value(done), json_integer_value(steps));
		printf("\n");
	}
}

/* One line for a task that dg up's supervisor restarted or gave up on. */
static void print_restarts(const struct task_status *s)
{
	const char *last = json_string_value(json_object_get(s->sup, "last_exit"));
	double at = json_number_value(json_object_get(s->sup, "last_exit_at"));
	json_int_t n = json_integer_value(json_object_get(s->sup, "restarts"));
	char ago[32] = "";

	if (!s->sup || !last || !last[0])
		return;
	fmt_uptime(ago, sizeof ago, dg_wall_s() - at);
	printf("%s: restarted %lld time%s by dg up; last exit: %s, %s ago%s\n", s->name,
	       (long long)n, n == 1 ? "" : "s", last, ago,
	       json_is_true(json_object_get(s->sup, "given_up"))
	       ? "; given up (too many exits): dg up --restart after a look at its log"
	       : json_is_true(json_object_get(s->sup, "stopped")) ? "; exited cleanly, not restarted"
	       : "");
}

static void print_table(const struct task_status *s, int n)
{
	printf("%-12s %-22s %-4s %6s %6s %10s %6s %8s %8s\n", "TASK", "ADDRESS", "UP", "EPOCH",
	       "VARS", "BYTES", "QUEUES", "UPTIME", "RESTARTS");
	for (int i = 0; i < n; i++) {
		char bytes[32] = "-", up[32] = "-", restarts[16] = "-";
		if (s[i].sup)
			snprintf(restarts, sizeof restarts, "%lld",
				 json_integer_value(json_object_get(s[i].sup, "restarts")));
		if (!s[i].up) {
			printf("%-12s %-22s %-4s %6s %6s %10s %6s %8s %8s\n", s[i].name,
			       s[i].address, s[i].refused ? "401" : "no", "-", "-", "-", "-", "-",
			       restarts);
			continue;
		}
		fmt_bytes(bytes, sizeof bytes,
			  json_number_value(json_object_get(s[i].health, "bytes")));
		fmt_uptime(up, sizeof up,
			   json_number_value(json_object_get(s[i].health, "uptime_s")));
		printf("%-12s %-22s %-4s %6lld %6lld %10s %6lld %8s %8s\n", s[i].name,
		       s[i].address, "yes", json_integer_value(json_object_get(s[i].health, "epoch")),
		       json_integer_value(json_object_get(s[i].health, "vars")), bytes,
		       json_integer_value(json_object_get(s[i].health, "queues")), up, restarts);
	}
	for (int i = 0; i < n; i++)
		print_restarts(&s[i]);
	for (int i = 0; i < n; i++)
		print_jobs(&s[i]);
}

static int print_json(const struct task_status *s, int n, int n_up)
{
	json_t *arr = json_array(), *root;
	char *text;

	for (int i = 0; i < n; i++) {
		json_t *o = json_pack("{s:s, s:s, s:b, s:b}", "task", s[i].name, "address",
				      s[i].address, "reachable", s[i].up, "unauthorized",
				      s[i].refused);
		if (o && s[i].up)
			json_object_set(o, "health", s[i].health);
		else if (o)
			json_object_set_new(o, "error", json_string(s[i].why));
		if (o && s[i].jobs)
			json_object_set(o, "jobs", s[i].jobs);
		if (o && s[i].sup)
			json_object_set(o, "supervisor", s[i].sup);
		json_array_append_new(arr, o);
	}
	root = json_pack("{s:o, s:i, s:i}", "tasks", arr, "reachable", n_up, "total", n);
	text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
	json_decref(root);
	if (!text) {
		fprintf(stderr, "dg: out of memory\n");
		return dg_status_to_exit(DG_ENOMEM);
	}
	printf("%s\n", text);
	free(text);
	return 0;
}

/* The state of dg up's supervisor when the spec is DIR/cluster.json of a
 * dg up (owned), or NULL. */
static json_t *supervisor_state(const char *cluster)
{
	char file[4096], real[PATH_MAX], *slash;

	if (!cli_cluster_file(cluster, file, sizeof file) || !realpath(file, real) ||
	    !(slash = strrchr(real, '/')) || strcmp(slash + 1, "cluster.json") != 0)
		return NULL;
	*slash = '\0';
	return up_supervisor_state(real);
}

static json_t *supervisor_entry(json_t *state, const char *task)
{
	size_t i;
	json_t *e;

	json_array_foreach(json_object_get(state, "tasks"), i, e) {
		const char *name = json_string_value(json_object_get(e, "task"));
		if (name && strcmp(name, task) == 0)
			return e;
	}
	return NULL;
}

static const char status_usage[] =
	"usage: dg status [--cluster FILE] [--token-file F] [--json]\n"
	"\n"
	"Ask every task of the cluster (--cluster, else $DG_CLUSTER, else the last\n"
	"`dg up`) for its health: address, reachable, epoch, variables, bytes,\n"
	"queues, uptime, restarts by dg up's supervisor (one line per restarted\n"
	"task: how it last exited), and the jobs of tasks that run a master. --json prints\n"
	"{\"tasks\": [...], \"reachable\": N, \"total\": M}.\n"
	"Exit status: 0 when every task answers, 10 when one is unreachable (named\n"
	"on stderr), 9 when all run but some refuse without a token.\n";

int cmd_status(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "cluster", required_argument, NULL, 'c' },
		{ "token-file", required_argument, NULL, 'T' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *cluster = NULL, *token_file = NULL;
	struct dg_err err = { 0 };
	struct dg_cluster *cl;
	struct task_status *s;
	struct dg_buf down = { 0 };
	json_t *sup = NULL;
	char *token = NULL;
	bool json = false;
	int c, n_up = 0, n_refused = 0, rc = 0;

	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'c': cluster = optarg; break;
		case 'T': token_file = optarg; break;
		case 'j': json = true; break;
		case 'h': fputs(status_usage, stdout); return 0;
		case ':': return cli_usage(argv[0], "%s needs a value", argv[optind - 1]);
		default: return cli_usage(argv[0], "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return cli_usage(argv[0], "unexpected argument '%s'", argv[optind]);
	if (token_file && !(token = cli_token_load(token_file, &err)))
		return cli_fail(&err);
	if (!(cl = cli_cluster_load(cluster, &err))) {
		free(token);
		return cli_fail(&err);
	}
	if (!(s = calloc((size_t)cl->n_tasks + 1, sizeof *s))) {
		dg_err_set(&err, DG_ENOMEM, "out of memory");
		rc = cli_fail(&err);
		goto out;
	}
	sup = supervisor_state(cluster);
	for (int i = 0; i < cl->n_tasks; i++) {
		snprintf(s[i].name, sizeof s[i].name, "%s/%d", cl->tasks[i].job,
			 cl->tasks[i].index);
		s[i].sup = supervisor_entry(sup, s[i].name);
		s[i].address = cl->tasks[i].address;
		probe(&s[i], token);
		if (s[i].up)
			n_up++;
		else if (s[i].refused)
			n_refused++;
		else
			dg_buf_printf(&down, NULL, "%s%s (%s)", down.len ? ", " : "", s[i].name,
				      s[i].address);
	}
	rc = json ? print_json(s, cl->n_tasks, n_up) : (print_table(s, cl->n_tasks), 0);
	if (rc == 0 && n_up + n_refused < cl->n_tasks) {
		dg_err_set(&err, DG_EUNAVAILABLE, "%d of %d tasks unreachable: %s",
			   cl->n_tasks - n_up - n_refused, cl->n_tasks, down.data ? down.data : "");
		for (int i = 0; i < cl->n_tasks; i++)
			if (!s[i].up && !s[i].refused) {
				/* the first one's hint says what to do (e.g. give --ca),
				 * else its message says what happened */
				dg_err_hint(&err, "%s: %s", s[i].name,
					    s[i].hint[0] ? s[i].hint : s[i].why);
				break;
			}
		rc = cli_fail(&err);
	} else if (rc == 0 && n_refused) {
		/* Running, but they want a token: not the same problem as a dead task. */
		dg_err_set(&err, DG_EUNAUTHORIZED, "%d of %d tasks refused the request without a "
			   "valid token", n_refused, cl->n_tasks);
		dg_err_hint(&err, "pass --token-file F (the file given to dg up --token-file)");
		rc = cli_fail(&err);
	}
	for (int i = 0; i < cl->n_tasks; i++) {
		json_decref(s[i].health);
		json_decref(s[i].jobs);
	}
	free(s);
out:
	json_decref(sup);
	dg_buf_deinit(&down);
	dg_cluster_free(cl);
	free(token);
	return rc;
}
