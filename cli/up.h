/* What `dg up`/`dg down` (cmd_up.c) and the supervisor that restarts a
 * cluster's tasks (up_supervise.c) share: the cluster being started, its
 * files in DIR, and the process helpers. Only the cli uses it. */
#ifndef DG_CLI_UP_H
#define DG_CLI_UP_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>

#include "dg/status.h"

#define MAX_TASKS 64

struct task {
	const char *job;        /* "ps" or "worker" (static strings) */
	int index;
	int port;
	pid_t pid;              /* 0: not started */
};

struct up_ctx {
	char dir[PATH_MAX];             /* absolute */
	char spec[PATH_MAX];            /* DIR/cluster.json */
	char exe[PATH_MAX];
	char token_file[PATH_MAX];      /* absolute, "" when none */
	char *token;                    /* owned */
	struct task t[MAX_TASKS];
	int n;
	pid_t mount_pid;
	char mnt[PATH_MAX];             /* the mount point, "" without --mount */
	char threads[16];               /* --threads of every task */
	char durability[16];            /* --durability of every task */
	char tls_cert[PATH_MAX];        /* absolute --tls-cert/--tls-key of every task, "" */
	char tls_key[PATH_MAX];         /* when the cluster is plain HTTP */
	int max_restarts;               /* the supervisor's restarts of a task per minute */
};

/* ---- cmd_up.c ---- */

/* out (PATH_MAX) = a/b; DG_EINVAL when too long. */
enum dg_status up_join(char *out, const char *a, const char *b, struct dg_err *err);
/* The first line of path without its newline; false when absent or empty. */
bool up_read_line(const char *path, char *out, size_t n);
/* DIR/JOB-I plus suffix ("" when too long). */
void up_task_file(const struct up_ctx *u, const struct task *t, const char *suffix, char *out);
/* Start task t detached (its data dir, port file, log and pid file in DIR);
 * t->pid gets the child. Does not wait for it to answer. */
enum dg_status up_start_task(struct up_ctx *u, struct task *t, struct dg_err *err);
/* Alive and not a zombie. */
bool up_pid_alive(pid_t pid);
/* Alive, with arg on its command line (a pid file outliving its process must
 * not make us signal another). */
bool up_pid_runs_with(pid_t pid, const char *arg);
/* Reap pid if it is our child and exited; true when reaped. */
bool up_reap(pid_t pid, int *wstatus);
/* SIGTERM, then SIGKILL after a while, with a warning. */
void up_stop_pid(pid_t pid, const char *label);
/* Stop DIR's cluster (its supervisor first); quiet: no summary line. */
int up_down_dir(const char *dir, bool quiet);

/* ---- up_supervise.c ---- */

/* Watch the tasks of u (children of this process) and start again one that
 * dies (not after a clean exit): after 100 ms, doubling while it dies within
 * 5 s of its start (up to 5 s), at most u->max_restarts times a minute; past
 * that the task is left down (until
 * `dg up --restart`, which sends SIGUSR1). Each exit and restart is a line
 * on stderr and in the task's log; DIR/supervisor.json holds the counts for
 * `dg status`. Returns on SIGTERM or SIGINT (and SIGHUP in the foreground);
 * foreground: then takes the cluster down. Returns the exit status. */
int up_supervise(struct up_ctx *u, bool foreground);
/* The pid of DIR's live supervisor, or 0. */
pid_t up_supervisor_pid(const char *dir);
/* Stop DIR's supervisor (the tasks keep running) and remove its pid file. */
void up_supervisor_stop(const char *dir);
/* DIR/supervisor.json (owned), or NULL when there is none. */
json_t *up_supervisor_state(const char *dir);

#endif
