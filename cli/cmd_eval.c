/* `dg eval GRAPH.json`: load and validate a graph, parse --feed values, run it
 * in this process with worker/exec.c (jobs and tasks of devices are ignored;
 * /gpu:K nodes run on that GPU when there is one) and
 * print each fetched value in the text encoding, or write DIR/NAME.npy files
 * with --out. The output format is documented in doc/graph-format.md. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dg/exec.h"
#include "dg/kernels.h"

static const char usage_text[] =
	"usage: dg eval GRAPH.json [--feed NAME=VALUE]... [--fetch NAME]... [--out DIR] "
	"[--header]\n"
	"\n"
	"Run a graph in this process (jobs and tasks of device strings are ignored;\n"
	"a node on /gpu:K runs on that GPU when this machine has it, else on the\n"
	"CPU) and print each fetched value as text, one row of the last dimension\n"
	"per line.\n"
	"\n"
	"  --feed NAME=VALUE  give node output NAME (\"node\" or \"node:k\") a value:\n"
	"                     FILE.npy, FILE.txt (dg's text encoding) or a JSON\n"
	"                     literal such as 2, [1,2,3], nan, typed as NAME's dtype\n"
	"  --fetch NAME       compute NAME (repeatable; default: the graph's \"fetch\")\n"
	"  -o, --out DIR      write DIR/NAME.npy for each fetch instead of printing it\n"
	"                     ('/' and ':' in NAME become '_'; DIR is created)\n"
	"  --header           print the \"# dtype [shape]\" line before each value\n"
	"  -h, --help         show this help\n"
	"\n"
	"With several fetches, each value is preceded by a line \"NAME:\".\n"
	"Exit status: 0 success, 1 usage error, 2 invalid graph or value, 3 file or\n"
	"name not found, 5 shape mismatch, 6 dtype mismatch (doc/graph-format.md).\n";

struct eval_args {
	const char *graph;
	const char **feeds;      /* the NAME=VALUE strings, borrowed from argv */
	int n_feeds;
	const char **fetch;      /* borrowed from argv */
	int n_fetch;
	const char *out_dir;
	bool header;
};

enum { OPT_FEED = 256, OPT_FETCH, OPT_HEADER };

static const struct option long_opts[] = {
	{ "feed", required_argument, NULL, OPT_FEED },
	{ "fetch", required_argument, NULL, OPT_FETCH },
	{ "out", required_argument, NULL, 'o' },
	{ "header", no_argument, NULL, OPT_HEADER },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* Returns -1 to go on, else the exit code (help printed or usage error). */
static int parse_args(int argc, char **argv, struct eval_args *a)
{
	int c;

	a->feeds = calloc((size_t)argc + 1, sizeof *a->feeds);
	a->fetch = calloc((size_t)argc + 1, sizeof *a->fetch);
	if (!a->feeds || !a->fetch) {
		fprintf(stderr, "dg: out of memory\n");
		return dg_status_to_exit(DG_ENOMEM);
	}
	optind = 0;      /* glibc: full re-initialisation, argv[0] is the command */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":ho:", long_opts, NULL)) != -1) {
		switch (c) {
		case OPT_FEED:
			if (!strchr(optarg, '=') || optarg[0] == '=')
				return cli_usage("eval", "--feed '%s' is not NAME=VALUE", optarg);
			a->feeds[a->n_feeds++] = optarg;
			break;
		case OPT_FETCH:
			if (!optarg[0])
				return cli_usage("eval", "--fetch needs a node name");
			a->fetch[a->n_fetch++] = optarg;
			break;
		case 'o':
			if (!optarg[0])
				return cli_usage("eval", "--out needs a directory");
			a->out_dir = optarg;
			break;
		case OPT_HEADER: a->header = true; break;
		case 'h': fputs(usage_text, stdout); return 0;
		case ':': return cli_usage("eval", "option '%s' needs a value", argv[optind - 1]);
		default: return cli_usage("eval", "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return cli_usage("eval", "missing GRAPH.json");
	a->graph = argv[optind++];
	if (optind < argc)
		return cli_usage("eval", "unexpected argument '%s' (options go before or after "
				 "GRAPH.json; feeds use --feed NAME=VALUE)", argv[optind]);
	return -1;
}

/* "node" or "node:k" for a default fetch. */
static void edge_name(const struct dg_graph *g, struct dg_edge e, char *buf, size_t n)
{
	if (e.index == 0)
		snprintf(buf, n, "%s", g->nodes[e.node].name);
	else
		snprintf(buf, n, "%s:%d", g->nodes[e.node].name, e.index);
}

static int run_eval(const struct eval_args *a)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = NULL;
	struct dg_feed *feeds = NULL;
	struct dg_tensor **vals = NULL;
	char **names = NULL;
	int n = 0, rc = 0;
	enum dg_status st = DG_OK;

	g = dg_graph_load(a->graph, dg_op_find, &err);
	if (!g)
		return cli_fail(&err);
	n = a->n_fetch > 0 ? a->n_fetch : g->n_fetch;
	feeds = calloc((size_t)a->n_feeds + 1, sizeof *feeds);
	vals = calloc((size_t)n + 1, sizeof *vals);
	names = calloc((size_t)n + 1, sizeof *names);
	if (!feeds || !vals || !names) {
		st = dg_err_set(&err, DG_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		char buf[DG_GRAPH_MAX_NAME + 16];
		if (a->n_fetch == 0)
			edge_name(g, g->fetch[i], buf, sizeof buf);
		names[i] = strdup(a->n_fetch > 0 ? a->fetch[i] : buf);
		if (!names[i]) {
			st = dg_err_set(&err, DG_ENOMEM, "out of memory");
			goto out;
		}
	}
	if (a->out_dir && (st = cli_check_out_names(names, n, &err)) != DG_OK)
		goto out;
	for (int i = 0; i < a->n_feeds; i++) {
		char *ref;
		struct dg_tensor *t;
		st = cli_feed_parse(g, a->feeds[i], &ref, &t, &err);
		if (st != DG_OK)
			goto out;
		feeds[i].ref = ref;
		feeds[i].value = t;
	}
	st = dg_exec_run(g, feeds, a->n_feeds, a->n_fetch > 0 ? a->fetch : NULL, a->n_fetch,
			 vals, NULL, &err);
	if (st == DG_OK)
		st = cli_write_values(a->out_dir, a->header, names, vals, n, &err);
out:
	if (st != DG_OK)
		rc = cli_fail(&err);
	for (int i = 0; feeds && i < a->n_feeds; i++) {
		free((char *)feeds[i].ref);
		dg_tensor_free((struct dg_tensor *)feeds[i].value);
	}
	for (int i = 0; i < n; i++) {
		if (vals)
			dg_tensor_free(vals[i]);
		if (names)
			free(names[i]);
	}
	free(feeds);
	free(vals);
	free(names);
	dg_graph_free(g);
	return rc;
}

int cmd_eval(int argc, char **argv)
{
	struct eval_args a = { 0 };
	int rc = parse_args(argc, argv, &a);

	if (rc < 0)
		rc = run_eval(&a);
	free(a.feeds);
	free(a.fetch);
	return rc;
}
