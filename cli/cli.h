/* Shared declarations of the `dg` command: the subcommands main.c dispatches
 * to, the one way diagnostics are printed (stderr, "dg: " prefix, exit code
 * from dg_status_to_exit) and --feed parsing (feed.c). */
#ifndef DG_CLI_H
#define DG_CLI_H

#include "dg/graph.h"

/* Subcommands: argv[0] is the command's name; each returns the exit code. */
int cmd_eval(int argc, char **argv);
int cmd_ops(int argc, char **argv);
int cmd_server(int argc, char **argv);   /* cmd_server.c: dg server, dg ps */
int cmd_var(int argc, char **argv);      /* cmd_var.c: dg var ls|get|put|create|rm */
int cmd_submit(int argc, char **argv);   /* cmd_submit.c: dg submit GRAPH.json */
int cmd_mount(int argc, char **argv);    /* cmd_mount.c: dg mount MOUNTPOINT */
int cmd_up(int argc, char **argv);       /* cmd_up.c: dg up, dg down, dg status */
int cmd_down(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_job(int argc, char **argv);      /* cmd_job.c: dg job ls|show|cancel */
int cmd_checkpoint(int argc, char **argv);   /* cmd_checkpoint.c: dg checkpoint save */
/* Whether this dg has the subcommand name (main.c's table): e.g. `mount` is
 * absent from a build without FUSE. Thread-safe (reads a constant table). */
bool cli_command_exists(const char *name);

/* The cluster a client command talks to: --cluster FILE when given, else
 * $DG_CLUSTER, else the cluster.json of the last `dg up` (later issue). Owned
 * (dg_cluster_free) or NULL with *err set, naming where it looked. */
struct dg_cluster;
struct dg_cluster *cli_cluster_load(const char *flag_path, struct dg_err *err);
/* Read a token file (first line, trimmed); owned string or NULL with *err. */
char *cli_token_load(const char *path, struct dg_err *err);

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
