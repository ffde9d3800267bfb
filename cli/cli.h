/* Shared declarations of the `dg` command: the subcommands main.c dispatches
 * to, the one way diagnostics are printed (stderr, "dg: " prefix, exit code
 * from dg_status_to_exit) and --feed parsing (feed.c). */
#ifndef DG_CLI_H
#define DG_CLI_H

#include "dg/graph.h"

/* Subcommands: argv[0] is the command's name; each returns the exit code. */
int cmd_eval(int argc, char **argv);
int cmd_ops(int argc, char **argv);
int cmd_server(int argc, char **argv);   /* cmd_server.c: dg server (main.c: dg ps, dg worker) */
int cmd_var(int argc, char **argv);      /* cmd_var.c: dg var ls|get|put|create|rm */
int cmd_submit(int argc, char **argv);   /* cmd_submit.c: dg submit GRAPH.json */
int cmd_mount(int argc, char **argv);    /* cmd_mount.c: dg mount MOUNTPOINT */
int cmd_up(int argc, char **argv);       /* cmd_up.c: dg up, dg down */
int cmd_down(int argc, char **argv);
int cmd_status(int argc, char **argv);   /* cmd_status.c */
int cmd_job(int argc, char **argv);      /* cmd_job.c: dg job ls|show|cancel */
int cmd_checkpoint(int argc, char **argv);   /* cmd_checkpoint.c: dg checkpoint save|restore */
int cmd_feed(int argc, char **argv);     /* cmd_feed.c: dg feed QUEUE FILE... */
/* The cluster a client command talks to: --cluster FILE when given, else
 * $DG_CLUSTER, else the cluster.json of the last `dg up` (later issue). Owned
 * (dg_cluster_free) or NULL with *err set, naming where it looked. */
struct dg_cluster;
struct dg_cluster *cli_cluster_load(const char *flag_path, struct dg_err *err);
/* The file cli_cluster_load(flag_path) would read, into out; false when the
 * spec is $DG_CLUSTER's text or there is none. */
bool cli_cluster_file(const char *flag_path, char *out, size_t cap);
/* Read a PEM file (a TLS certificate chain, or a private key: then refused
 * when its group or others may read it, like a token file); the owned,
 * NUL-terminated text or NULL with *err. */
char *cli_pem_load(const char *path, bool private_key, struct dg_err *err);
/* Read a token file (first line, trimmed); owned string or NULL with *err. */
char *cli_token_load(const char *path, struct dg_err *err);

/* The servers a client command talks to (dg var, dg job, dg checkpoint): one
 * per task it asks, each with a label for messages and, when opened with
 * client ops, that command's own client (struct dg_client for variables,
 * struct dg_http_client for jobs; void * so one list serves both). */
struct cli_client_ops {
	void *(*open)(const char *address, const char *token, struct dg_err *err);
	void (*close)(void *client);
};

struct cli_target {
	char label[64];         /* "ps/1", or the address given with --server/--master */
	char *address;          /* owned, "host:port" */
	void *client;           /* owned (ops->close); NULL when opened without ops */
};

struct cli_targets {
	struct cli_target *t;   /* owned, n entries, n >= 1 after a successful open */
	int n;
	char *token;            /* --token-file's token (owned), or NULL */
	const struct cli_client_ops *ops;   /* borrowed; NULL: no clients */
};

/* Which servers: server (--server or --master HOST:PORT) alone when given;
 * else the cluster's task "J/I" when task is given (cli_task_parse must have
 * accepted it); else the tasks of job `job` ("ps", "worker") of the cluster,
 * or every task when it has no such job (or job is NULL). The cluster comes
 * from cli_cluster_load(cluster); the token, read first, from token_file.
 * Every field may be NULL. */
struct cli_target_query {
	const char *cluster, *server, *task, *job, *token_file;
};

/* Fill *ts (caller's memory) from q, opening one client per target with ops
 * (NULL: addresses only). On error *ts is empty and *err says why (token
 * file, cluster spec, unknown task or a client that could not be made). */
enum dg_status cli_targets_open(const struct cli_target_query *q,
				const struct cli_client_ops *ops, struct cli_targets *ts,
				struct dg_err *err);
/* Free the clients, the list and the token; *ts is left empty. */
void cli_targets_close(struct cli_targets *ts);
/* Split "worker/1" into job (at most job_len - 1 bytes, into job) and index.
 * Returns false when s is not JOB/INDEX with 0 <= INDEX <= 1000000. */
bool cli_task_parse(const char *s, char *job, size_t job_len, int *index);
/* Whether s ends with suffix, ignoring ASCII case (".npy", ".NPY"). */
bool cli_ends_with(const char *s, const char *suffix);
/* JSON has no NaN or infinity: the bare words nan, inf and infinity (any case,
 * optional sign) outside JSON strings become the "nan", "inf", "-inf" strings
 * dg_json_to_tensor reads. Returns a malloc'd copy or NULL (no memory). */
char *cli_quote_nonfinite(const char *s);

/* `dg var watch` (var_watch.c): print each change of the watched variables
 * of the targets' tasks until count lines (0: no limit) or timeout_ms
 * (0: none). Returns the exit status. */
struct var_watch_args {
	char **names;                   /* exact names; none: every variable */
	int n_names;
	const char *prefix;             /* also names starting with this; NULL: none */
	int64_t count;
	int64_t timeout_ms;
};
int var_watch_run(struct cli_targets *ts, const struct var_watch_args *a);

/* Print "dg: MSG" and, when err has one, "dg: hint: HINT" to stderr. Returns
 * dg_status_to_exit(err->code). */
int cli_fail(const struct dg_err *err);

/* A usage error: prints "dg: MSG" and "try 'dg CMD --help'" to stderr and
 * returns 1. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse one --feed argument "NAME=VALUE" against g. NAME is "node" or
 * "node:k"; VALUE is a .npy file, a .txt file (text encoding) or a JSON tensor
 * literal (2, [1,2], nan, -inf), read as the dtype the graph infers for NAME,
 * so --feed x=2 gives a float32 2 for a float32 placeholder. On success *ref
 * (malloc'd NAME, free()) and *value (dg_tensor_free) are owned by the caller;
 * on error both are NULL and *err names the flag. */
enum dg_status cli_feed_parse(const struct dg_graph *g, const char *arg, char **ref,
			      struct dg_tensor **value, struct dg_err *err);

/* Print fetched values (output.c, shared by eval and submit): with out_dir
 * NULL, each value as text (a "NAME:" line first when n > 1; header adds the
 * "# dtype [shape]" line); else DIR/NAME.npy files ('/' and ':' become '_',
 * DIR created) and one "wrote ..." line each. names and vals are borrowed. */
enum dg_status cli_write_values(const char *out_dir, bool header, char **names,
				struct dg_tensor **vals, int n, struct dg_err *err);
/* DG_EINVAL when two names would be written to the same .npy file. */
enum dg_status cli_check_out_names(char **names, int n, struct dg_err *err);

#endif
