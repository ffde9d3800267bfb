/* The `dg` command: a table of subcommands (name, function, one line of help),
 * dispatch, `dg help` and `dg --version`. Each subcommand lives in its own
 * cli/cmd_*.c file; the diagnostics they print go through common.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dg/gpu.h"
#include "dg/http.h"
#include "dg/kernels.h"
#include "dg_config.h"

static int cmd_help(int argc, char **argv);
static int cmd_ps(int argc, char **argv);
static int cmd_worker(int argc, char **argv);

static const struct cli_cmd {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
} cmds[] = {
	{ "eval", cmd_eval, "run a graph in this process and print what it fetches" },
	{ "ops", cmd_ops, "list the ops graphs can use, with their inputs and attrs" },
	{ "server", cmd_server, "run a task of a cluster (parameter server, worker, master)" },
	{ "ps", cmd_ps, "short for 'dg server --job ps'" },
	{ "worker", cmd_worker, "short for 'dg server --job worker'" },
	{ "var", cmd_var, "list, read, write, create and delete variables" },
	{ "submit", cmd_submit, "run a graph on the cluster and print what it fetches" },
	{ "mount", cmd_mount, "mount the cluster's variables as files" },
	{ "up", cmd_up, "start a local cluster in the background (ps and worker tasks)" },
	{ "down", cmd_down, "stop the cluster 'dg up' started" },
	{ "status", cmd_status, "health of every task of the cluster" },
	{ "job", cmd_job, "list, show and cancel jobs on the cluster's masters" },
	{ "feed", cmd_feed, "fill a shared queue from .npy or IDX files, epoch by epoch" },
	{ "checkpoint", cmd_checkpoint, "snapshot every ps now, or save/restore all variables "
	  "to/from a directory" },
	{ "help", cmd_help, "show this list; 'dg help CMD' shows a command's options" },
};

#define N_CMDS ((int)(sizeof cmds / sizeof cmds[0]))

static void print_commands(FILE *f)
{
	fputs("usage: dg COMMAND [ARGS]...\n\n"
	      "dg runs dataflow graphs (JSON, see doc/graph-format.md) in one process or\n"
	      "on a cluster of parameter servers and workers, and trains them.\n\n"
	      "commands:\n", f);
	for (int i = 0; i < N_CMDS; i++)
		fprintf(f, "  %-6s  %s\n", cmds[i].name, cmds[i].help);
	fputs("\n'dg COMMAND --help' describes a command; 'dg --version' prints the version.\n"
	      "Every command takes --ca FILE (default $DG_CA): the servers use TLS (dg server\n"
	      "--tls-cert); reach them over https, verified against the PEM certificate FILE.\n",
	      f);
}

static const struct cli_cmd *find_cmd(const char *name)
{
	for (int i = 0; i < N_CMDS; i++)
		if (strcmp(cmds[i].name, name) == 0)
			return &cmds[i];
	return NULL;
}

/* The job a --job argument names: "--job V", "--job=V" or an abbreviation
 * getopt_long takes ("--jo V"); *skip is 1 when V is the next argument. NULL
 * when arg is not --job (or its value is missing: cmd_server says so). */
static const char *job_flag_value(char **argv, int i, int argc, int *skip)
{
	const char *a = argv[i] + 2;
	size_t n = strcspn(a, "=");

	*skip = 0;
	if (strncmp(argv[i], "--", 2) || n == 0 || n > 3 || strncmp(a, "job", n))
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (i + 1 >= argc)
		return NULL;
	*skip = 1;
	return argv[i + 1];
}

/* dg ps ARGS and dg worker ARGS: dg server --job JOB ARGS, under their own
 * name (usage messages say 'dg worker'). A --job naming another job is
 * refused; --job JOB itself is accepted. */
static int server_as(const char *job, int argc, char **argv)
{
	char job_opt[] = "--job", job_val[16];
	char **av;
	int rc, skip;

	for (int i = 1; i < argc && strcmp(argv[i], "--"); i += 1 + skip) {
		const char *v = job_flag_value(argv, i, argc, &skip);
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			printf("dg %s is short for 'dg server --job %s' (another --job is "
			       "refused).\n\n", argv[0], job);
		if (v && strcmp(v, job))
			return cli_usage(argv[0], "'dg %s' runs a task of job '%s', not '%s' "
					 "(use 'dg server --job %s')", argv[0], job, v, v);
	}
	if (!(av = calloc((size_t)argc + 3, sizeof *av))) {
		fprintf(stderr, "dg: out of memory\n");
		return dg_status_to_exit(DG_ENOMEM);
	}
	snprintf(job_val, sizeof job_val, "%s", job);
	av[0] = argv[0];
	av[1] = job_opt;
	av[2] = job_val;
	for (int i = 1; i < argc; i++)
		av[i + 2] = argv[i];
	rc = cmd_server(argc + 2, av);
	free(av);
	return rc;
}

static int cmd_ps(int argc, char **argv)
{
	return server_as("ps", argc, argv);
}

static int cmd_worker(int argc, char **argv)
{
	return server_as("worker", argc, argv);
}

/* The CA of TLS clusters, for every command: --ca FILE (or --ca=FILE)
 * anywhere before a "--", taken out of argv, else $DG_CA. Every client of
 * the command (and a server's own requests) then speaks https to host:port
 * addresses. Returns -1 to go on, else the exit code. */
static int take_ca(int *argc, char **argv)
{
	const char *ca = NULL;
	struct dg_err err = { 0 };
	int out = 1;

	for (int i = 1; i < *argc; i++) {
		if (!strcmp(argv[i], "--")) {
			while (i < *argc)
				argv[out++] = argv[i++];
			break;
		}
		if (!strcmp(argv[i], "--ca")) {
			if (i + 1 >= *argc)
				return cli_usage(argv[0], "--ca needs a FILE (the PEM certificate "
						 "that signed the servers')");
			ca = argv[++i];
		} else if (!strncmp(argv[i], "--ca=", 5)) {
			ca = argv[i] + 5;
		} else {
			argv[out++] = argv[i];
		}
	}
	*argc = out;
	argv[out] = NULL;
	if (!ca && (ca = getenv("DG_CA")) && !*ca)
		ca = NULL;
	if (ca && dg_http_tls_ca(ca, &err) != DG_OK) {
		dg_err_prefix(&err, "--ca");
		return cli_fail(&err);
	}
	return -1;
}

/* dg help [CMD]: the table, or CMD's own --help. */
static int cmd_help(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "help") != 0) {
		const struct cli_cmd *c = find_cmd(argv[1]);
		char help_flag[] = "--help";
		char *sub[] = { argv[1], help_flag, NULL };
		if (!c) {
			fprintf(stderr, "dg: unknown command '%s'\ntry 'dg help'\n", argv[1]);
			return 1;
		}
		return c->fn(2, sub);
	}
	print_commands(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	const struct cli_cmd *c;
	int rc;

	/* Before any thread exists: it may set OPENBLAS_CORETYPE. A missing BLAS
	 * only matters to MatMul, which reports it when it runs. */
	dg_blas_init(NULL);
	if ((rc = take_ca(&argc, argv)) >= 0)
		return rc;
	if (argc < 2) {
		print_commands(stderr);
		return 1;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
		return cmd_help(1, argv + 1);
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
		printf("dg %s\n%s\n%s\n", DG_VERSION, dg_blas_describe(), dg_gpu_describe());
		return fflush(stdout) == 0 ? 0 : 11;
	}
	c = find_cmd(argv[1]);
	if (!c) {
		fprintf(stderr, "dg: unknown command '%s'\ntry 'dg help'\n", argv[1]);
		return 1;
	}
	rc = c->fn(argc - 1, argv + 1);
	if (fflush(stdout) != 0 && rc == 0) {
		fprintf(stderr, "dg: writing to standard output failed\n");
		rc = dg_status_to_exit(DG_EIO);
	}
	return rc;
}
