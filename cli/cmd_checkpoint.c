/* `dg checkpoint save`: make every parameter server of a cluster write a
 * snapshot of its variables now (POST /v1/checkpoint, doc/http-api.md
 * "Checkpoints"), one line per task. The servers holding variables are the
 * tasks of job "ps" (every task when there is no such job), as for `dg var`;
 * --server HOST:PORT talks to one server. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dg/client.h"

enum { OPT_CLUSTER = 256, OPT_SERVER, OPT_TOKEN, OPT_JSON };

struct ckpt_args {
	const char *cluster, *server, *token_file;
	bool json;
};

static const struct option long_opts[] = {
	{ "cluster", required_argument, NULL, OPT_CLUSTER },
	{ "server", required_argument, NULL, OPT_SERVER },
	{ "token-file", required_argument, NULL, OPT_TOKEN },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static const char ckpt_help[] =
	"usage: dg checkpoint save [--cluster FILE | --server HOST:PORT] [--json]\n"
	"\n"
	"Make every parameter server of the cluster (the tasks of job \"ps\", every task\n"
	"when there is none) write a snapshot of all its variables now, so that the\n"
	"gradient applies made so far survive a crash. One line per task:\n"
	"  ps/0: epoch 3, 24 variables, 8.52 MB in 0.18 s\n"
	"A server started without --data-dir keeps variables in memory only and\n"
	"cannot checkpoint: its line says so and the exit status is 16.\n"
	"\n"
	"options:\n"
	"  --cluster FILE     the cluster spec (default: $DG_CLUSTER, then the last\n"
	"                     'dg up')\n"
	"  --server HOST:PORT checkpoint this one server\n"
	"  --token-file F     send the bearer token in F (first line)\n"
	"  --json             print each server's reply as a JSON line with \"task\"\n"
	"  -h, --help         show this help\n";

/* "8.52 MB", "512 B": the snapshot's size for people. */
static void format_bytes(double b, char *buf, size_t n)
{
	static const char *const unit[] = { "B", "kB", "MB", "GB", "TB" };
	int u = 0;

	while (b >= 1000 && u < 4) {
		b /= 1000;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%.0f %s", b, unit[u]);
	else
		snprintf(buf, n, "%.2f %s", b, unit[u]);
}

/* Print one server's reply (borrowed) as a line for people or as JSON. */
static void print_reply(const struct cli_target *t, json_t *r, bool as_json)
{
	long long vars = (long long)json_integer_value(json_object_get(r, "vars"));
	char size[32];

	if (as_json) {
		char *text;
		json_object_set_new(r, "task", json_string(t->label));
		text = json_dumps(r, JSON_COMPACT);
		if (text)
			printf("%s\n", text);
		free(text);
		return;
	}
	format_bytes((double)json_integer_value(json_object_get(r, "bytes")), size, sizeof size);
	printf("%s: epoch %lld, %lld variable%s, %s in %.2f s\n", t->label,
	       (long long)json_integer_value(json_object_get(r, "epoch")), vars,
	       vars == 1 ? "" : "s", size, json_number_value(json_object_get(r, "ms")) / 1000);
}

/* Checkpoint each target in turn, with a client of its own made here so that
 * one bad address fails its line only. Returns the exit code: 0 when all did,
 * else that of the first failure (every target is still tried). */
static int save_all(const struct ckpt_args *a, const struct cli_targets *ts)
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

static int parse_args(int argc, char **argv, struct ckpt_args *a)
{
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+h", long_opts, NULL)) != -1) {
		switch (c) {
		case OPT_CLUSTER: a->cluster = optarg; break;
		case OPT_SERVER: a->server = optarg; break;
		case OPT_TOKEN: a->token_file = optarg; break;
		case OPT_JSON: a->json = true; break;
		case 'h':
			fputs(ckpt_help, stdout);
			return 0;
		default:
			return cli_usage("checkpoint", "unknown or incomplete option '%s'",
					 argv[optind - 1]);
		}
	}
	if (a->cluster && a->server)
		return cli_usage("checkpoint", "--cluster and --server exclude each other");
	return -1;
}

int cmd_checkpoint(int argc, char **argv)
{
	struct ckpt_args a = { 0 };
	struct cli_targets ts;
	struct dg_err err = { 0 };
	int rc;

	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		fputs(ckpt_help, stdout);
		return 0;
	}
	if (argc < 2)
		return cli_usage("checkpoint", "missing subcommand (dg checkpoint save)");
	if (strcmp(argv[1], "save") != 0)
		return cli_usage("checkpoint", "unknown subcommand '%s' (there is: save)", argv[1]);
	if ((rc = parse_args(argc - 1, argv + 1, &a)) >= 0)
		return rc;
	if (optind < argc - 1)
		return cli_usage("checkpoint", "unexpected argument '%s'", argv[optind + 1]);
	/* The servers holding variables: --server, else the tasks of job "ps" of the
	 * cluster (every task when it has no "ps" job). No clients: save_all's own. */
	const struct cli_target_query q = {
		.cluster = a.cluster, .server = a.server, .job = "ps", .token_file = a.token_file,
	};
	if (cli_targets_open(&q, NULL, &ts, &err) != DG_OK)
		return cli_fail(&err);
	rc = save_all(&a, &ts);
	cli_targets_close(&ts);
	return rc;
}
