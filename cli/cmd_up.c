/* `dg up` and `dg down`: a whole local cluster on free loopback ports. `up`
 * writes DIR/cluster.json, starts one detached `dg server` per task (pid, port
 * file and log in DIR), waits for each to answer /v1/health and links the spec
 * where cli_cluster_load (common.c) finds it; `down` stops what the pid files
 * name. `dg status` is in cmd_status.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "up.h"
#include "dg/buf.h"
#include "dg/client.h"
#include "dg/clock.h"
#include "dg/cluster.h"
#include "dg/http.h"
#include "store.h"

#define READY_WAIT_MS 20000     /* a server recovering a big data dir may take a while */
#define STOP_WAIT_MS 15000      /* SIGTERM -> exit includes the final checkpoint */
#define KILL_WAIT_MS 3000
#define MOUNT_WAIT_MS 10000
#define START_ATTEMPTS 3        /* a picked port taken before its server bound it: retry */


/* ------------------------------------------------------------- small helpers */

/* path = a/b with a bounds check (paths longer than PATH_MAX are refused). */
enum dg_status up_join(char *out, const char *a, const char *b, struct dg_err *err)
{
	int n = snprintf(out, PATH_MAX, "%s/%s", a, b);

	if (n < 0 || n >= PATH_MAX)
		return dg_err_set(err, DG_EINVAL, "path too long: %s/%s", a, b);
	return DG_OK;
}

/* mkdir -p with mode 0700 for the parts it creates (the state is private). */
static enum dg_status mkdir_p(const char *path, struct dg_err *err)
{
	char tmp[PATH_MAX];

	if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
		return dg_err_set(err, DG_EINVAL, "path too long: %s", path);
	for (char *p = tmp + 1; ; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char c = *p;
		*p = '\0';
		if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
			dg_err_set(err, DG_EIO, "cannot create directory %s: %s", tmp,
				   strerror(errno));
			return DG_EIO;
		}
		*p = c;
		if (!c)
			break;
	}
	return DG_OK;
}

/* Where `dg up` links the spec of the cluster it started: the first place
 * cli_cluster_load looks after --cluster and $DG_CLUSTER. */
static enum dg_status pointer_path(char *out, struct dg_err *err)
{
	const char *run = getenv("XDG_RUNTIME_DIR"), *home = getenv("HOME");

	if (run && run[0])
		return up_join(out, run, "dg/cluster.json", err);
	if (home && home[0])
		return up_join(out, home, ".dg/cluster.json", err);
	dg_err_set(err, DG_EINVAL, "neither $XDG_RUNTIME_DIR nor $HOME is set");
	dg_err_hint(err, "set HOME, or pass --dir DIR");
	return DG_EINVAL;
}

/* The default state directory, next to the pointer. */
static enum dg_status default_dir(char *out, struct dg_err *err)
{
	const char *run = getenv("XDG_RUNTIME_DIR"), *home = getenv("HOME");

	if (run && run[0])
		return up_join(out, run, "dg/cluster", err);
	if (home && home[0])
		return up_join(out, home, ".dg/cluster", err);
	dg_err_set(err, DG_EINVAL, "no --dir, and neither $XDG_RUNTIME_DIR nor $HOME is set");
	dg_err_hint(err, "pass --dir DIR");
	return DG_EINVAL;
}

/* Read a small text file (pid, port, path): first line, trimmed, into out.
 * false when absent or empty. */
bool up_read_line(const char *path, char *out, size_t n)
{
	FILE *f = fopen(path, "r");
	bool ok;

	if (!f)
		return false;
	ok = fgets(out, (int)n, f) != NULL;
	fclose(f);
	if (ok)
		out[strcspn(out, "\r\n")] = '\0';
	return ok && out[0];
}

static enum dg_status write_text(const char *path, const char *text, struct dg_err *err)
{
	return dg_write_file_atomic(path, text, strlen(text), err);
}

/* ------------------------------------------------------------------ processes */

/* Alive and not a zombie. Our detached servers are reparented when `dg up`
 * exits; a reaper that is slow (or absent, in some containers) leaves zombies
 * behind that kill(pid, 0) would still report. */
bool up_pid_alive(pid_t pid)
{
	char path[64], buf[512], *rp;
	FILE *f;
	size_t n;

	if (pid <= 0)
		return false;
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	if (!(f = fopen(path, "r")))
		return access("/proc/self/stat", F_OK) != 0 &&
		       (kill(pid, 0) == 0 || errno == EPERM);   /* no /proc */
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	rp = strrchr(buf, ')');      /* the command name may hold spaces and parens */
	return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* Whether pid is alive and its command line has the argument arg (the task's
 * data dir, or the mount point): a pid file outliving its process must not
 * make us signal whatever process got the number since. */
bool up_pid_runs_with(pid_t pid, const char *arg)
{
	char path[64], buf[8192];
	FILE *f;
	size_t n;

	if (!up_pid_alive(pid))
		return false;
	snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
	if (!(f = fopen(path, "r")))
		return true;            /* no /proc: trust the pid */
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
		if (strcmp(buf + i, arg) == 0)
			return true;
	return false;
}

/* Reap pid when it is our child (the failure paths of `dg up`); harmless
 * otherwise. Returns true when it was reaped. */
bool up_reap(pid_t pid, int *wstatus)
{
	int ws = 0;

	if (waitpid(pid, &ws, WNOHANG) == pid) {
		if (wstatus)
			*wstatus = ws;
		return true;
	}
	return false;
}

/* SIGTERM, wait up to STOP_WAIT_MS, then SIGKILL with a warning. */
void up_stop_pid(pid_t pid, const char *label)
{
	struct dg_deadline deadline = dg_deadline_in_ms(STOP_WAIT_MS);

	if (kill(pid, SIGTERM) != 0)
		return;
	while (!dg_deadline_expired(deadline)) {
		if (up_reap(pid, NULL) || !up_pid_alive(pid))
			return;
		dg_sleep_ms(20);
	}
	fprintf(stderr, "dg: warning: %s (pid %d) did not stop within %d s of SIGTERM; killing "
		"it (its last checkpoint may be older)\n", label, (int)pid, STOP_WAIT_MS / 1000);
	kill(pid, SIGKILL);
	deadline = dg_deadline_in_ms(KILL_WAIT_MS);
	while (!dg_deadline_expired(deadline) && !up_reap(pid, NULL) && up_pid_alive(pid))
		dg_sleep_ms(20);
}

/* Start argv detached: its own session (a ^C at the terminal does not reach
 * it), stdin /dev/null, stdout+stderr appended to log, no other fd of ours,
 * no blocked signal. *pid gets the child. An exec failure is written to the
 * log and the child exits 127, which the readiness wait reports. */
static enum dg_status spawn(char *const argv[], const char *log, pid_t *pid, struct dg_err *err)
{
	int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	sigset_t none;
	pid_t p;

	if (fd < 0)
		return dg_err_set(err, DG_EIO, "cannot open log %s: %s", log, strerror(errno));
	fflush(NULL);
	p = fork();
	if (p < 0) {
		close(fd);
		return dg_err_set(err, DG_EIO, "cannot start %s: fork: %s", argv[1],
				  strerror(errno));
	}
	if (p == 0) {
		int null = open("/dev/null", O_RDONLY);
		setsid();
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		if (null < 0 || dup2(null, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(127);
		closefrom(3);
		execv(argv[0], argv);
		dprintf(2, "dg: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(fd);
	*pid = p;
	return DG_OK;
}

/* This executable, so the servers run the same dg as `dg up`. */
static enum dg_status self_exe(char *out, struct dg_err *err)
{
	ssize_t n = readlink("/proc/self/exe", out, PATH_MAX - 1);

	if (n <= 0)
		return dg_err_set(err, DG_EIO, "cannot find the dg executable (/proc/self/exe): %s",
				  strerror(errno));
	out[n] = '\0';
	return DG_OK;
}

/* ------------------------------------------------------------ cluster state */

/* A running task found from DIR's pid files. */
struct live {
	char name[64];          /* "ps-0" */
	pid_t pid;
};

/* The tasks of DIR whose pid file names a live server of that task (its data
 * dir on the command line). Returns the count (<= max). */
static int find_live(const char *dir, struct live *out, int max)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)) && n < max) {
		size_t len = strlen(e->d_name);
		char path[PATH_MAX], data[PATH_MAX], line[32];
		pid_t pid;

		if (len < 5 || len >= sizeof out->name + 4 || strcmp(e->d_name + len - 4, ".pid") ||
		    strcmp(e->d_name, "mount.pid") == 0)
			continue;
		snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)(len - 4), e->d_name);
		if (up_join(path, dir, e->d_name, NULL) || up_join(data, dir, out[n].name, NULL) ||
		    !up_read_line(path, line, sizeof line))
			continue;
		pid = (pid_t)strtol(line, NULL, 10);
		if (up_pid_runs_with(pid, data))
			out[n++].pid = pid;
	}
	closedir(d);
	return n;
}

/* Pick n distinct free loopback ports: all sockets are bound at once so the
 * kernel cannot hand out one port twice, then closed for the servers to take.
 * Another process may grab one in between; start_all retries then. */
static enum dg_status pick_ports(struct task *t, int n, struct dg_err *err)
{
	int fds[MAX_TASKS], i;
	enum dg_status st = DG_OK;

	for (i = 0; i < n; i++) {
		struct sockaddr_in a = { .sin_family = AF_INET,
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t al = sizeof a;
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) != 0 ||
		    getsockname(fds[i], (struct sockaddr *)&a, &al) != 0) {
			st = dg_err_set(err, DG_EIO, "cannot pick a free loopback port: %s",
					strerror(errno));
			if (fds[i] >= 0)
				close(fds[i]);
			break;
		}
		t[i].port = ntohs(a.sin_port);
	}
	while (i-- > 0)
		close(fds[i]);
	return st;
}

/* DIR/cluster.json: {"ps": ["127.0.0.1:P", ...], "worker": [...]}. */
static enum dg_status write_spec(const char *path, const struct task *t, int n,
				 struct dg_err *err)
{
	json_t *root = json_object(), *ps = json_array(), *wk = json_array();
	enum dg_status st = DG_ENOMEM;
	char *text = NULL, addr[32];
	size_t len;

	if (!root || !ps || !wk)
		goto out;
	for (int i = 0; i < n; i++) {
		snprintf(addr, sizeof addr, "127.0.0.1:%d", t[i].port);
		if (json_array_append_new(strcmp(t[i].job, "ps") ? wk : ps, json_string(addr)))
			goto out;
	}
	/* --workers 0: no "worker" job at all (a spec's job needs a task). */
	if (json_object_set(root, "ps", ps) ||
	    (json_array_size(wk) && json_object_set(root, "worker", wk)) ||
	    !(text = json_dumps(root, JSON_INDENT(2))))
		goto out;
	len = strlen(text);
	text[len] = '\n';      /* over the NUL: the length is passed, not the string */
	st = dg_write_file_atomic(path, text, len + 1, err);
out:
	if (st == DG_ENOMEM)
		dg_err_set(err, DG_ENOMEM, "out of memory writing %s", path);
	free(text);
	json_decref(root);
	json_decref(ps);
	json_decref(wk);
	return st;
}

/* --------------------------------------------------------------------- dg up */

static volatile sig_atomic_t interrupted;      /* SIGINT/SIGTERM while dg up starts */

static void on_interrupt(int sig)
{
	interrupted = sig;
}

/* DG_ECANCELED when dg up was interrupted (a wait loop then gives up). */
static enum dg_status check_interrupt(struct dg_err *err)
{
	if (!interrupted)
		return DG_OK;
	return dg_err_set(err, DG_ECANCELED, "interrupted by signal %d; stopping the tasks "
			  "started so far", (int)interrupted);
}

struct up_args {
	int n_ps, n_workers;
	int threads;                    /* 0: CPUs / workers */
	const char *dir, *mount, *token_file;
	const char *restart;            /* --restart JOB/I: that task alone */
	const char *durability;         /* --durability MODE of every task; NULL: snapshot */
	const char *tls_cert, *tls_key; /* --tls-cert/--tls-key of every task */
	bool foreground, sized;         /* sized: --ps, --workers or --threads given */
	bool no_supervise;              /* --no-supervise: nobody restarts a task */
	int max_restarts;               /* --max-restarts: per task and minute */
};

static const char up_usage[] =
	"usage: dg up [--ps N] [--workers M] [--dir DIR] [--mount DIR] [--token-file F]\n"
	"             [--threads T] [--durability MODE] [--tls-cert F --tls-key K]\n"
	"             [--foreground] [--no-supervise] [--max-restarts N]\n"
	"       dg up --restart JOB/I [--dir DIR]\n"
	"\n"
	"Start a whole local cluster on free loopback ports: N parameter-server tasks\n"
	"(job ps) and M worker tasks (job worker), each a `dg server` running in the\n"
	"background with its data dir, log, pid and port files in DIR. The spec is\n"
	"written to DIR/cluster.json and becomes the default cluster of every dg\n"
	"command ($XDG_RUNTIME_DIR/dg/cluster.json, else ~/.dg/cluster.json, links\n"
	"to it) until `dg down`. Variables survive a `dg down` and the next `dg up`\n"
	"of the same DIR.\n"
	"\n"
	"A supervisor (a background dg up, DIR/supervisor.pid and .log) restarts a\n"
	"task that dies: 100 ms after the exit, doubling while it dies within 5 s of\n"
	"its start (a crash loop, up to 5 s), at most --max-restarts times a minute\n"
	"(default 5); each exit and restart is logged with its status or\n"
	"signal, in DIR/supervisor.log and the task's log, and `dg status` counts\n"
	"them. A task that exits with status 0 (stopped on purpose) is not restarted.\n"
	"\n"
	"  --ps N            parameter-server tasks (default 1)\n"
	"  --workers M       worker tasks (default 2)\n"
	"  --dir DIR         state directory (default $XDG_RUNTIME_DIR/dg/cluster,\n"
	"                    else ~/.dg/cluster)\n"
	"  --mount DIR       also mount the variables at DIR (`dg mount`)\n"
	"  --token-file F    every task requires the bearer token in F\n"
	"  --threads T       threads of each task's matrix products (default:\n"
	"                    $OPENBLAS_NUM_THREADS when set, else the CPUs divided\n"
	"                    among the workers, at least 1), so that workers training\n"
	"                    side by side do not oversubscribe them\n"
	"  --durability MODE what an acknowledged gradient apply survives on every\n"
	"                    task: snapshot (default) or strict (see dg server --help)\n"
	"  --tls-cert F, --tls-key K\n"
	"                    every task serves HTTPS with this certificate and key\n"
	"                    (PEM); other dg commands then need --ca F (or DG_CA=F)\n"
	"  --foreground      stay in the foreground, supervising; ^C (or SIGTERM)\n"
	"                    takes the cluster down\n"
	"  --no-supervise    no supervisor: a task that dies stays down (with\n"
	"                    --foreground: takes the cluster down)\n"
	"  --max-restarts N  restarts of one task within a minute before the\n"
	"                    supervisor gives up on it (1..1000, default 5)\n"
	"  --restart JOB/I   start again the one task of DIR's cluster that died\n"
	"                    (e.g. ps/0), at its address, with its data dir and the\n"
	"                    settings of the dg up that started the cluster (without\n"
	"                    --dir: the cluster of the last dg up, as dg down); a\n"
	"                    running supervisor starts it (and forgets its count)\n"
	"  -h, --help        show this help\n"
	"\n"
	"Exit status: 0 when every task answers, 4 when DIR already has a running\n"
	"cluster (--restart: that task runs), 10 when a task failed to start (its log\n"
	"is named), 16 when --mount is asked of a dg without the mount command.\n";

/* Returns -1 to go on, else the exit code. */
static int up_parse(int argc, char **argv, struct up_args *a)
{
	static const struct option opts[] = {
		{ "ps", required_argument, NULL, 'p' },
		{ "workers", required_argument, NULL, 'w' },
		{ "dir", required_argument, NULL, 'd' },
		{ "mount", required_argument, NULL, 'm' },
		{ "token-file", required_argument, NULL, 'T' },
		{ "threads", required_argument, NULL, 't' },
		{ "durability", required_argument, NULL, 'D' },
		{ "tls-cert", required_argument, NULL, 'C' },
		{ "tls-key", required_argument, NULL, 'K' },
		{ "foreground", no_argument, NULL, 'f' },
		{ "no-supervise", no_argument, NULL, 'S' },
		{ "max-restarts", required_argument, NULL, 'R' },
		{ "restart", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	char *end;
	long v;

	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
		case 'w':
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || *end || optarg[0] < '0' || optarg[0] > '9' ||
			    v < (c == 'p' ? 1 : 0) || v > MAX_TASKS / 2)
				return cli_usage(argv[0], "%s '%s' is not a count in %d..%d",
						 c == 'p' ? "--ps" : "--workers", optarg,
						 c == 'p' ? 1 : 0, MAX_TASKS / 2);
			*(c == 'p' ? &a->n_ps : &a->n_workers) = (int)v;
			a->sized = true;
			break;
		case 't':
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || *end || optarg[0] < '0' || optarg[0] > '9' || v < 1 || v > 1024)
				return cli_usage(argv[0], "--threads '%s' is not a count in 1..1024",
						 optarg);
			a->threads = (int)v;
			a->sized = true;
			break;
		case 'D': {
			struct dg_err e = { 0 };
			enum ps_durability d;
			if (ps_durability_parse(optarg, &d, &e) != DG_OK)
				return cli_usage(argv[0], "--durability: %s (%s)", e.msg, e.hint);
			a->durability = optarg;
			break;
		}
		case 'C': a->tls_cert = optarg; break;
		case 'K': a->tls_key = optarg; break;
		case 'd': a->dir = optarg; break;
		case 'm': a->mount = optarg; break;
		case 'T': a->token_file = optarg; break;
		case 'f': a->foreground = true; break;
		case 'S': a->no_supervise = true; break;
		case 'R':
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || *end || optarg[0] < '0' || optarg[0] > '9' || v < 1 || v > 1000)
				return cli_usage(argv[0], "--max-restarts '%s' is not a count in "
						 "1..1000", optarg);
			a->max_restarts = (int)v;
			break;
		case 'r': a->restart = optarg; break;
		case 'h': fputs(up_usage, stdout); return 0;
		case ':': return cli_usage(argv[0], "%s needs a value", argv[optind - 1]);
		default: return cli_usage(argv[0], "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return cli_usage(argv[0], "unexpected argument '%s'", argv[optind]);
	if (!a->tls_cert != !a->tls_key)
		return cli_usage(argv[0], "--tls-cert and --tls-key go together");
	if (a->restart && (a->sized || a->mount || a->token_file || a->foreground ||
			   a->durability || a->tls_cert || a->no_supervise || a->max_restarts))
		return cli_usage(argv[0], "--restart takes only --dir: the task gets the settings "
				 "of the dg up that started the cluster");
	return -1;
}

/* Everything `dg up` works with. */

/* DIR/JOB-I plus suffix. up_run refuses a DIR too long for these. */
void up_task_file(const struct up_ctx *u, const struct task *t, const char *suffix,
		      char *out)
{
	int n = snprintf(out, PATH_MAX, "%s/%s-%d%s", u->dir, t->job, t->index, suffix);

	if (n < 0 || n >= PATH_MAX)
		out[0] = '\0';
}

enum dg_status up_start_task(struct up_ctx *u, struct task *t, struct dg_err *err)
{
	char data[PATH_MAX], port[PATH_MAX], log[PATH_MAX], pidf[PATH_MAX], idx[16], line[32];
	char *argv[24];
	int k = 0;
	enum dg_status st;

	up_task_file(u, t, "", data);
	up_task_file(u, t, ".port", port);
	up_task_file(u, t, ".log", log);
	up_task_file(u, t, ".pid", pidf);
	snprintf(idx, sizeof idx, "%d", t->index);
	unlink(port);           /* a stale one would not say this start is serving */
	argv[k++] = u->exe;
	argv[k++] = (char *)"server";
	argv[k++] = (char *)"--cluster";
	argv[k++] = u->spec;
	argv[k++] = (char *)"--job";
	argv[k++] = (char *)t->job;
	argv[k++] = (char *)"--task";
	argv[k++] = idx;
	argv[k++] = (char *)"--data-dir";
	argv[k++] = data;
	argv[k++] = (char *)"--port-file";
	argv[k++] = port;
	argv[k++] = (char *)"--threads";
	argv[k++] = u->threads;
	argv[k++] = (char *)"--durability";
	argv[k++] = u->durability;
	if (u->tls_cert[0]) {
		argv[k++] = (char *)"--tls-cert";
		argv[k++] = u->tls_cert;
		argv[k++] = (char *)"--tls-key";
		argv[k++] = u->tls_key;
	}
	if (u->token_file[0]) {
		argv[k++] = (char *)"--token-file";
		argv[k++] = u->token_file;
	}
	argv[k] = NULL;
	if ((st = spawn(argv, log, &t->pid, err)) != DG_OK)
		return st;
	snprintf(line, sizeof line, "%d\n", (int)t->pid);
	if ((st = write_text(pidf, line, err)) != DG_OK) {
		up_stop_pid(t->pid, "a new server");
		t->pid = 0;
	}
	return st;
}

/* Stop the tasks we started (failure paths, --foreground) and remove their
 * pid and port files. */
static void stop_started(struct up_ctx *u)
{
	char path[PATH_MAX], label[64];

	for (int i = 0; i < u->n; i++) {
		snprintf(label, sizeof label, "%s/%d", u->t[i].job, u->t[i].index);
		if (u->t[i].pid)
			up_stop_pid(u->t[i].pid, label);
		u->t[i].pid = 0;        /* the files also of a task that exited by itself */
		up_task_file(u, &u->t[i], ".pid", path);
		unlink(path);
		up_task_file(u, &u->t[i], ".port", path);
		unlink(path);
	}
}

/* Whether the log of a task that exited says its port was taken. */
static bool log_says_port_taken(const struct up_ctx *u, const struct task *t)
{
	char path[PATH_MAX];
	struct dg_buf b = { 0 };
	bool taken = false;

	up_task_file(u, t, ".log", path);
	if (dg_buf_read_file(&b, path, 1 << 20, NULL) == DG_OK &&
	    dg_buf_append(&b, "", 1, NULL) == DG_OK)
		taken = strstr(b.data, "Address already in use") != NULL;
	dg_buf_deinit(&b);
	return taken;
}

/* Poll /v1/health of task t until it answers as that task. *port_taken says a
 * retry with other ports may help. */
static enum dg_status wait_ready(struct up_ctx *u, struct task *t,
				 struct dg_deadline deadline, bool *port_taken, struct dg_err *err)
{
	char addr[32], log[PATH_MAX];
	struct dg_client *c;
	enum dg_status st = DG_OK;
	int ws;

	snprintf(addr, sizeof addr, "127.0.0.1:%d", t->port);
	up_task_file(u, t, ".log", log);
	if (!(c = dg_client_new(addr, u->token, err)))
		return err->code;
	for (;;) {
		json_t *h = NULL;
		struct dg_err herr = { 0 };
		if (dg_client_health(c, &h, &herr) == DG_OK) {
			const char *job = json_string_value(json_object_get(h, "job"));
			bool same = job && strcmp(job, t->job) == 0 &&
				    json_integer_value(json_object_get(h, "task")) == t->index;
			json_decref(h);
			if (same)
				break;
		}
		if (up_reap(t->pid, &ws)) {
			t->pid = 0;
			*port_taken = log_says_port_taken(u, t);
			st = dg_err_set(err, DG_EUNAVAILABLE, "%s/%d exited with %s %d before it "
					"was ready", t->job, t->index,
					WIFEXITED(ws) ? "code" : "signal",
					WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
			dg_err_hint(err, "see its log: %s", log);
			break;
		}
		if ((st = check_interrupt(err)) != DG_OK)
			break;
		if (dg_deadline_expired(deadline)) {
			st = dg_err_set(err, DG_EUNAVAILABLE, "%s/%d (pid %d) did not answer on %s "
					"within %d s: %s", t->job, t->index, (int)t->pid, addr,
					READY_WAIT_MS / 1000, herr.msg);
			dg_err_hint(err, "see its log: %s", log);
			break;
		}
		dg_sleep_ms(25);
	}
	dg_client_free(c);
	return st;
}

/* Pick ports, write the spec, start every task, wait for all; on a port
 * race, start over with new ports. On failure nothing is left running. */
static enum dg_status start_all(struct up_ctx *u, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int attempt = 1; attempt <= START_ATTEMPTS; attempt++) {
		bool port_taken = false;
		struct dg_deadline deadline;

		if ((st = pick_ports(u->t, u->n, err)) != DG_OK ||
		    (st = write_spec(u->spec, u->t, u->n, err)) != DG_OK)
			return st;
		for (int i = 0; i < u->n && st == DG_OK; i++)
			st = up_start_task(u, &u->t[i], err);
		deadline = dg_deadline_in_ms(READY_WAIT_MS);
		for (int i = 0; i < u->n && st == DG_OK; i++)
			st = wait_ready(u, &u->t[i], deadline, &port_taken, err);
		if (st == DG_OK)
			return DG_OK;
		stop_started(u);
		if (!port_taken)
			break;
		fprintf(stderr, "dg: a picked port was taken before its server bound it; "
			"retrying with new ports\n");
	}
	return st;
}

/* Link the pointer (where cli_cluster_load looks) to DIR/cluster.json,
 * atomically replacing an older one. */
static enum dg_status link_pointer(const struct up_ctx *u, struct dg_err *err)
{
	char ptr[PATH_MAX], tmp[PATH_MAX + 32], parent[PATH_MAX];
	enum dg_status st;

	if ((st = pointer_path(ptr, err)) != DG_OK)
		return st;
	snprintf(parent, sizeof parent, "%s", ptr);
	*strrchr(parent, '/') = '\0';
	if ((st = mkdir_p(parent, err)) != DG_OK)
		return st;
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", ptr, (int)getpid());
	unlink(tmp);
	if (symlink(u->spec, tmp) != 0 || rename(tmp, ptr) != 0) {
		st = dg_err_set(err, DG_EIO, "cannot link %s to %s: %s", ptr, u->spec,
				strerror(errno));
		unlink(tmp);
	}
	return st;
}

/* Whether path is a mount point (another device than its parent). */
static bool is_mounted(const char *path)
{
	char parent[PATH_MAX + 4];
	struct stat a, b;

	snprintf(parent, sizeof parent, "%s/..", path);
	return stat(path, &a) == 0 && stat(parent, &b) == 0 && a.st_dev != b.st_dev;
}

/* `dg mount DIR --cluster SPEC` in the background, waiting for the mount to
 * appear. A mount that daemonises itself (exit 0, mounted) leaves no pid. */
static enum dg_status start_mount(struct up_ctx *u, const char *mnt_arg, struct dg_err *err)
{
	char mnt[PATH_MAX], log[PATH_MAX], pidf[PATH_MAX], pathf[PATH_MAX], line[32];
	char *argv[12];
	int k = 0, ws;
	struct dg_deadline deadline = dg_deadline_in_ms(MOUNT_WAIT_MS);
	enum dg_status st;

	if (!realpath(mnt_arg, mnt))
		return dg_err_set(err, DG_ENOTFOUND, "--mount %s: %s", mnt_arg, strerror(errno));
	if ((st = up_join(log, u->dir, "mount.log", err)) ||
	    (st = up_join(pidf, u->dir, "mount.pid", err)) ||
	    (st = up_join(pathf, u->dir, "mount.path", err)))
		return st;
	argv[k++] = u->exe;
	argv[k++] = (char *)"mount";
	argv[k++] = mnt;
	argv[k++] = (char *)"--foreground";     /* its pid is the one to wait for */
	argv[k++] = (char *)"--cluster";
	argv[k++] = u->spec;
	if (u->token_file[0]) {
		argv[k++] = (char *)"--token-file";
		argv[k++] = u->token_file;
	}
	if (u->tls_cert[0]) {
		argv[k++] = (char *)"--ca";
		argv[k++] = u->tls_cert;
	}
	argv[k] = NULL;
	/* The path first: `dg down` unmounts it even if we die right after. */
	if ((st = dg_write_file_atomic(pathf, mnt, strlen(mnt), err)) != DG_OK ||
	    (st = spawn(argv, log, &u->mount_pid, err)) != DG_OK)
		return st;
	snprintf(line, sizeof line, "%d\n", (int)u->mount_pid);
	if ((st = write_text(pidf, line, err)) != DG_OK)
		return st;
	while (!is_mounted(mnt)) {
		if (up_reap(u->mount_pid, &ws)) {
			u->mount_pid = 0;
			unlink(pidf);
			if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && is_mounted(mnt))
				break;
			dg_err_set(err, DG_EUNAVAILABLE, "dg mount %s exited with %s %d", mnt,
				   WIFEXITED(ws) ? "code" : "signal",
				   WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
			dg_err_hint(err, "see its log: %s", log);
			return DG_EUNAVAILABLE;
		}
		if ((st = check_interrupt(err)) != DG_OK)
			return st;
		if (dg_deadline_expired(deadline)) {
			dg_err_set(err, DG_ETIMEOUT, "dg mount %s did not mount within %d s", mnt,
				   MOUNT_WAIT_MS / 1000);
			dg_err_hint(err, "see its log: %s", log);
			return DG_ETIMEOUT;
		}
		dg_sleep_ms(25);
	}
	snprintf(u->mnt, sizeof u->mnt, "%s", mnt);
	return DG_OK;
}

static void print_up(const struct up_ctx *u)
{
	printf("cluster up in %s (%d tasks):\n", u->dir, u->n);
	for (int i = 0; i < u->n; i++) {
		char name[48];
		snprintf(name, sizeof name, "%s/%d", u->t[i].job, u->t[i].index);
		printf("  %-10s 127.0.0.1:%-6d pid %-8d log %s/%s-%d.log\n", name, u->t[i].port,
		       (int)u->t[i].pid, u->dir, u->t[i].job, u->t[i].index);
	}
	if (u->mnt[0])
		printf("  variables mounted at %s (log %s/mount.log)\n", u->mnt, u->dir);
	printf("spec: %s (the default cluster of dg commands until 'dg down')\n"
	       "next:\n"
	       "  dg status                                  tasks, health, variables\n"
	       "  dg var create w --shape 2,3 --init ones    then: dg var ls, dg var get w\n"
	       "  dg submit examples/seed_sum.json           run a graph on the cluster\n"
	       "  dg down                                    stop it (data stays in DIR)\n",
	       u->spec);
	fflush(stdout);
}

/* --foreground: wait for ^C / SIGTERM, or a task exiting; then take it down. */
static int foreground(struct up_ctx *u)
{
	sigset_t set;
	int sig = 0, rc = 0;

	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGCHLD);
	sigprocmask(SIG_BLOCK, &set, NULL);     /* from now on taken by sigwait */
	printf("in the foreground: ^C stops the cluster\n");
	fflush(stdout);
	while (!interrupted) {
		bool gone = false;
		if (sigwait(&set, &sig) != 0)
			continue;
		if (sig != SIGCHLD)
			break;
		for (int i = 0; i < u->n; i++) {
			int ws;
			if (u->t[i].pid && up_reap(u->t[i].pid, &ws)) {
				fprintf(stderr, "dg: %s/%d exited (%s %d); stopping the cluster\n"
					"dg: hint: see its log: %s/%s-%d.log\n", u->t[i].job,
					u->t[i].index, WIFEXITED(ws) ? "code" : "signal",
					WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws), u->dir,
					u->t[i].job, u->t[i].index);
				u->t[i].pid = 0;
				gone = true;
			}
		}
		if (u->mount_pid && up_reap(u->mount_pid, NULL)) {
			fprintf(stderr, "dg: the mount exited; stopping the cluster\n");
			u->mount_pid = 0;
			gone = true;
		}
		if (gone) {
			rc = dg_status_to_exit(DG_EUNAVAILABLE);
			break;
		}
	}
	int drc = up_down_dir(u->dir, false);
	return rc ? rc : drc;
}

/* The DIR of the last `dg up` (the link to DIR/cluster.json), into out;
 * false when there is none. */
static bool last_up_dir(char *out)
{
	char ptr[PATH_MAX], target[PATH_MAX];
	ssize_t n;

	if (pointer_path(ptr, NULL) != DG_OK ||
	    (n = readlink(ptr, target, sizeof target - 1)) <= 0 || target[0] != '/')
		return false;
	target[n] = '\0';
	*strrchr(target, '/') = '\0';   /* the DIR of DIR/cluster.json */
	snprintf(out, PATH_MAX, "%s", target);
	return true;
}

/* What a task's command line needs beyond the spec, kept in DIR/up.json for
 * `dg up --restart`: the --threads and --durability of every task and the
 * token file. */
static enum dg_status save_settings(const struct up_ctx *u, struct dg_err *err)
{
	char path[PATH_MAX], *text;
	json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s}", "threads", u->threads, "token_file",
			      u->token_file, "durability", u->durability, "tls_cert", u->tls_cert,
			      "tls_key", u->tls_key);
	enum dg_status st;

	if (!o || !(text = json_dumps(o, 0))) {
		json_decref(o);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	json_decref(o);
	if ((st = up_join(path, u->dir, "up.json", err)) == DG_OK)
		st = dg_write_file_atomic_mode(path, text, strlen(text), 0600, err);
	free(text);
	return st;
}

static enum dg_status load_settings(struct up_ctx *u, struct dg_err *err)
{
	char path[PATH_MAX];
	json_t *o;
	const char *threads, *token, *durability, *cert, *key;

	if (up_join(path, u->dir, "up.json", err) != DG_OK)
		return err->code;
	if (!(o = json_load_file(path, 0, NULL))) {
		dg_err_set(err, DG_ENOTFOUND, "%s holds no settings of the dg up that started its "
			   "cluster (an older dg up, or not a dg up directory)", u->dir);
		dg_err_hint(err, "restart the whole cluster: dg down --dir %s; dg up --dir %s",
			    u->dir, u->dir);
		return DG_ENOTFOUND;
	}
	threads = json_string_value(json_object_get(o, "threads"));
	token = json_string_value(json_object_get(o, "token_file"));
	durability = json_string_value(json_object_get(o, "durability"));
	cert = json_string_value(json_object_get(o, "tls_cert"));
	key = json_string_value(json_object_get(o, "tls_key"));
	snprintf(u->threads, sizeof u->threads, "%s", threads ? threads : "1");
	snprintf(u->token_file, sizeof u->token_file, "%s", token ? token : "");
	snprintf(u->durability, sizeof u->durability, "%s", durability ? durability : "snapshot");
	snprintf(u->tls_cert, sizeof u->tls_cert, "%s", cert && key ? cert : "");
	snprintf(u->tls_key, sizeof u->tls_key, "%s", cert && key ? key : "");
	json_decref(o);
	if (u->token_file[0] && !(u->token = cli_token_load(u->token_file, err)))
		return err->code;
	/* this dg up's own requests (is the restarted task up?) go over https */
	if (u->tls_cert[0] && !dg_http_tls_enabled() && dg_http_tls_ca(u->tls_cert, err) != DG_OK)
		return err->code;
	return DG_OK;
}

/* The task of DIR's cluster that `--restart name` names ("JOB/I"), or an
 * error listing the tasks. */
static enum dg_status restart_target(struct up_ctx *u, const struct dg_cluster *c,
				     const char *name, struct task *t, struct dg_err *err)
{
	char list[512] = "";
	size_t off = 0;

	for (int i = 0; i < c->n_tasks; i++) {
		const struct dg_task_addr *a = &c->tasks[i];
		char label[96];
		const char *colon = strrchr(a->address, ':');
		snprintf(label, sizeof label, "%s/%d", a->job, a->index);
		if (strcmp(label, name) == 0 && colon) {
			t->job = a->job;
			t->index = a->index;
			t->port = atoi(colon + 1);
			return DG_OK;
		}
		if (off + strlen(label) + 3 < sizeof list)
			off += (size_t)snprintf(list + off, sizeof list - off, "%s%s",
						off ? ", " : "", label);
	}
	dg_err_set(err, DG_ENOTFOUND, "the cluster of %s has no task '%s' (tasks: %s)", u->dir,
		   name, list);
	dg_err_hint(err, "name a task as JOB/I, e.g. worker/1");
	return DG_ENOTFOUND;
}

/* --restart with a live supervisor: it starts the task (its own child, which
 * it goes on watching); we wait for the pid file to name it and for it to
 * answer. */
static int restart_by_supervisor(struct up_ctx *u, struct task *t, pid_t sup, const char *name)
{
	struct dg_deadline d = dg_deadline_in_ms(READY_WAIT_MS);
	struct dg_err err = { 0 };
	char pidf[PATH_MAX], data[PATH_MAX], line[32];
	bool port_taken = false;

	up_task_file(u, t, ".pid", pidf);
	up_task_file(u, t, "", data);
	if (kill(sup, SIGUSR1) != 0) {
		dg_err_set(&err, DG_EIO, "cannot signal the supervisor (pid %d): %s", (int)sup,
			   strerror(errno));
		return cli_fail(&err);
	}
	while (!(up_read_line(pidf, line, sizeof line) &&
		 up_pid_runs_with(t->pid = (pid_t)atoi(line), data))) {
		if (dg_deadline_expired(d)) {
			dg_err_set(&err, DG_EUNAVAILABLE, "the supervisor (pid %d) did not start %s "
				   "within %d s", (int)sup, name, READY_WAIT_MS / 1000);
			dg_err_hint(&err, "see %s/supervisor.log and %s.log", u->dir, data);
			return cli_fail(&err);
		}
		dg_sleep_ms(20);
	}
	if (wait_ready(u, t, d, &port_taken, &err) != DG_OK)
		return cli_fail(&err);
	printf("restarted %s (pid %d) on 127.0.0.1:%d through the supervisor (pid %d), log "
	       "%s.log\n", name, (int)t->pid, t->port, (int)sup, data);
	return 0;
}

/* dg up --restart JOB/I: that task, if it is not running, started again as
 * dg up started it (same address, data dir, --threads, token). */
static int up_restart(struct up_ctx *u, const char *name)
{
	struct dg_err err = { 0 };
	struct dg_cluster *c;
	struct task t = { 0 };
	char pidf[PATH_MAX], data[PATH_MAX], line[32];
	bool port_taken = false;
	pid_t sup;
	int rc = 0;

	if (up_join(u->spec, u->dir, "cluster.json", &err) != DG_OK || self_exe(u->exe, &err) != DG_OK)
		return cli_fail(&err);
	if (!(c = dg_cluster_load(u->spec, &err))) {
		dg_err_prefix(&err, "no cluster to restart a task of in %s", u->dir);
		dg_err_hint(&err, "start one with: dg up --dir %s", u->dir);
		return cli_fail(&err);
	}
	if (restart_target(u, c, name, &t, &err) != DG_OK || load_settings(u, &err) != DG_OK) {
		rc = cli_fail(&err);
		goto out;
	}
	up_task_file(u, &t, ".pid", pidf);
	up_task_file(u, &t, "", data);
	if (up_read_line(pidf, line, sizeof line) && up_pid_runs_with((pid_t)atoi(line), data)) {
		dg_err_set(&err, DG_EEXIST, "%s is running (pid %d); nothing to restart", name,
			   atoi(line));
		dg_err_hint(&err, "dg status shows its health; dg down --dir %s stops the cluster",
			    u->dir);
		rc = cli_fail(&err);
		goto out;
	}
	if ((sup = up_supervisor_pid(u->dir)) > 0) {
		rc = restart_by_supervisor(u, &t, sup, name);
		goto out;
	}
	if (up_start_task(u, &t, &err) != DG_OK ||
	    wait_ready(u, &t, dg_deadline_in_ms(READY_WAIT_MS), &port_taken, &err) != DG_OK) {
		if (port_taken)
			dg_err_hint(&err, "another process holds its port %d now", t.port);
		if (t.pid)
			up_stop_pid(t.pid, name);
		rc = cli_fail(&err);
		goto out;
	}
	printf("restarted %s (pid %d) on 127.0.0.1:%d, log %s.log\n", name, (int)t.pid, t.port,
	       data);
out:
	dg_cluster_free(c);
	return rc;
}

static int up_start(struct up_ctx *u, const struct up_args *a);
static int up_start_supervised(struct up_ctx *u, const struct up_args *a);

static int up_run(struct up_ctx *u, const struct up_args *a)
{
	struct dg_err err = { 0 };
	struct live live[MAX_TASKS];
	int n_live, rc;

	if (strlen(u->dir) > PATH_MAX - 64)
		return cli_usage("up", "--dir %s: path too long", u->dir);
	if (mkdir_p(u->dir, &err) != DG_OK || self_exe(u->exe, &err) != DG_OK ||
	    up_join(u->spec, u->dir, "cluster.json", &err) != DG_OK)
		return cli_fail(&err);
	if ((n_live = find_live(u->dir, live, MAX_TASKS)) > 0) {
		dg_err_set(&err, DG_EEXIST, "a cluster is already running in %s (%s, pid %d%s)",
			   u->dir, live[0].name, (int)live[0].pid, n_live > 1 ? ", ..." : "");
		dg_err_hint(&err, "stop it with 'dg down --dir %s', or choose another --dir",
			    u->dir);
		return cli_fail(&err);
	}
	/* A supervisor left from an earlier cluster whose tasks are all gone
	 * would restart them beside ours: stop it. Its counts are not ours. */
	up_supervisor_stop(u->dir);
	char sup_state[PATH_MAX];
	if (up_join(sup_state, u->dir, "supervisor.json", NULL) == DG_OK)
		unlink(sup_state);
	for (int i = 0; i < a->n_ps + a->n_workers; i++) {
		u->t[i].job = i < a->n_ps ? "ps" : "worker";
		u->t[i].index = i < a->n_ps ? i : i - a->n_ps;
	}
	u->n = a->n_ps + a->n_workers;
	u->max_restarts = a->max_restarts ? a->max_restarts : 5;
	snprintf(u->durability, sizeof u->durability, "%s",
		 a->durability ? a->durability : "snapshot");
	const char *env_threads = getenv("OPENBLAS_NUM_THREADS");
	long env_n = env_threads ? strtol(env_threads, NULL, 10) : 0;
	if (a->threads > 0) {
		snprintf(u->threads, sizeof u->threads, "%d", a->threads);
	} else if (env_n >= 1 && env_n <= 1024) {
		/* The user's own OpenBLAS setting, which --threads would override. */
		snprintf(u->threads, sizeof u->threads, "%ld", env_n);
	} else {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		long per = a->n_workers > 0 && cpus > 0 ? cpus / a->n_workers : cpus;
		snprintf(u->threads, sizeof u->threads, "%ld", per < 1 ? 1 : per > 1024 ? 1024 : per);
	}
	if (a->foreground) {
		if ((rc = up_start(u, a)) != 0)
			return rc;
		if (a->no_supervise)
			return foreground(u);
		/* The pid file, so that dg down and dg up --restart find us too; gone
		 * before up_supervise's own down (which would stop its supervisor). */
		char path[PATH_MAX], line[32];
		snprintf(line, sizeof line, "%d\n", (int)getpid());
		if (up_join(path, u->dir, "supervisor.pid", &err) != DG_OK ||
		    write_text(path, line, &err) != DG_OK) {
			rc = cli_fail(&err);
			up_down_dir(u->dir, true);
			return rc;
		}
		return up_supervise(u, true);
	}
	return a->no_supervise ? up_start(u, a) : up_start_supervised(u, a);
}

/* Start the tasks, save the settings, link the spec, mount; print the cluster.
 * On failure nothing is left running. Returns the exit status. */
static int up_start(struct up_ctx *u, const struct up_args *a)
{
	struct dg_err err = { 0 };
	int rc;

	if (start_all(u, &err) != DG_OK)
		return cli_fail(&err);
	if (save_settings(u, &err) != DG_OK || link_pointer(u, &err) != DG_OK ||
	    (a->mount && start_mount(u, a->mount, &err) != DG_OK)) {
		rc = cli_fail(&err);
		up_down_dir(u->dir, true);
		return rc;
	}
	if (check_interrupt(&err) != DG_OK) {     /* a ^C while linking or printing */
		rc = cli_fail(&err);
		up_down_dir(u->dir, true);
		return rc;
	}
	print_up(u);
	return 0;
}

/* dg up with a supervisor: a child process starts the cluster (so that the
 * tasks are its children, which it alone can reap and restart), reports the
 * outcome to us through a pipe, detaches (its own session, output to
 * DIR/supervisor.log) and supervises; we exit with its outcome. Its output
 * until the report is ours (the same terminal). */
static int up_start_supervised(struct up_ctx *u, const struct up_args *a)
{
	struct dg_err err = { 0 };
	char path[PATH_MAX], line[32];
	unsigned char b;
	int pfd[2], rc, ws;
	ssize_t n;

	if (pipe2(pfd, O_CLOEXEC) != 0) {
		dg_err_set(&err, DG_EIO, "cannot start the supervisor: pipe: %s", strerror(errno));
		return cli_fail(&err);
	}
	fflush(NULL);
	pid_t sup = fork();
	if (sup < 0) {
		dg_err_set(&err, DG_EIO, "cannot start the supervisor: fork: %s", strerror(errno));
		close(pfd[0]);
		close(pfd[1]);
		return cli_fail(&err);
	}
	if (sup > 0) {
		close(pfd[1]);
		do
			n = read(pfd[0], &b, 1);
		while (n < 0 && errno == EINTR);    /* a ^C reaches the child too: it reports */
		close(pfd[0]);
		if (n == 1)
			return b;
		waitpid(sup, &ws, 0);
		dg_err_set(&err, DG_EIO, "the supervisor exited (%s %d) before the cluster was up",
			   WIFEXITED(ws) ? "code" : "signal",
			   WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
		return cli_fail(&err);
	}
	close(pfd[0]);
	rc = up_start(u, a);
	snprintf(line, sizeof line, "%d\n", (int)getpid());
	if (rc == 0 && (up_join(path, u->dir, "supervisor.pid", &err) != DG_OK ||
			write_text(path, line, &err) != DG_OK)) {
		rc = cli_fail(&err);
		up_down_dir(u->dir, true);
	}
	fflush(NULL);
	b = (unsigned char)rc;
	signal(SIGPIPE, SIG_IGN);       /* dg up gone (killed): supervise all the same */
	if (write(pfd[1], &b, 1) != 1 && rc == 0)
		fprintf(stderr, "dg: dg up exited before the supervisor's report; supervising\n");
	if (rc != 0)
		_exit(rc);
	close(pfd[1]);
	/* Detach: no terminal, output to DIR/supervisor.log. */
	int null = open("/dev/null", O_RDWR);
	int log = up_join(path, u->dir, "supervisor.log", NULL) == DG_OK
		  ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
	setsid();
	if (null >= 0)
		dup2(null, 0);
	if (log >= 0) {
		dup2(log, 1);
		dup2(log, 2);
	}
	if (null > 2)
		close(null);
	if (log > 2)
		close(log);
	rc = up_supervise(u, false);
	if (up_join(path, u->dir, "supervisor.pid", NULL) == DG_OK)
		unlink(path);
	fflush(NULL);
	_exit(rc);
}

int cmd_up(int argc, char **argv)
{
	struct up_args a = { .n_ps = 1, .n_workers = 2 };
	struct dg_err err = { 0 };
	struct up_ctx *u;
	char dflt[PATH_MAX];
	sigset_t set;
	int rc;

	if ((rc = up_parse(argc, argv, &a)) >= 0)
		return rc;
	if (!(u = calloc(1, sizeof *u))) {
		dg_err_set(&err, DG_ENOMEM, "out of memory");
		return cli_fail(&err);
	}
	rc = -1;
	/* The absolute, resolved DIR: the servers' command lines carry it, and
	 * `dg down` recognises its tasks by it. */
	if (!a.dir && a.restart && last_up_dir(dflt))
		a.dir = dflt;           /* --restart: the last dg up's, as dg down */
	if (!a.dir && default_dir(dflt, &err) != DG_OK)
		rc = cli_fail(&err);
	else if (!a.restart && mkdir_p(a.dir ? a.dir : dflt, &err) != DG_OK)
		rc = cli_fail(&err);
	else if (!realpath(a.dir ? a.dir : dflt, u->dir))
		rc = cli_usage(argv[0], "--dir %s: %s", a.dir ? a.dir : dflt, strerror(errno));
	if (rc < 0 && a.restart) {
		rc = up_restart(u, a.restart);
		free(u->token);
		free(u);
		return rc;
	}
	if (rc < 0 && a.tls_cert) {
		char *key = NULL, *cert = NULL;
		if (!realpath(a.tls_cert, u->tls_cert) || !realpath(a.tls_key, u->tls_key))
			rc = cli_usage(argv[0], "--tls-cert %s / --tls-key %s: %s", a.tls_cert,
				       a.tls_key, strerror(errno));
		/* refused here, as each task would refuse them, before anything starts;
		 * then this dg up's own requests (is each task up?) go over https */
		else if (!(key = cli_pem_load(u->tls_key, true, &err)) ||
			 !(cert = cli_pem_load(u->tls_cert, false, &err)) ||
			 (!dg_http_tls_enabled() && dg_http_tls_ca(u->tls_cert, &err) != DG_OK))
			rc = cli_fail(&err);
		free(key);
		free(cert);
	}
	if (rc < 0 && a.token_file) {
		if (!realpath(a.token_file, u->token_file))
			rc = cli_usage(argv[0], "--token-file %s: %s", a.token_file,
				       strerror(errno));
		else if (!(u->token = cli_token_load(u->token_file, &err)))
			rc = cli_fail(&err);
	}
	if (rc < 0) {
		/* A ^C during the start sets a flag the waits check, so that the
		 * tasks started so far are stopped rather than left half a cluster.
		 * SIGCHLD is blocked before any child exists so that --foreground's
		 * sigwait sees a task that died at any time (children unblock it). */
		struct sigaction sa = { .sa_handler = on_interrupt };
		sigemptyset(&sa.sa_mask);
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		sigemptyset(&set);
		sigaddset(&set, SIGCHLD);
		sigprocmask(SIG_BLOCK, &set, NULL);
		rc = up_run(u, &a);
	}
	free(u->token);
	free(u);
	return rc;
}

/* ------------------------------------------------------------------- dg down */

/* Unmount what `dg up --mount` mounted and wait for its process. */
static void down_mount(const char *dir)
{
	char pathf[PATH_MAX], pidf[PATH_MAX], mnt[PATH_MAX], line[32];
	pid_t pid = 0;

	if (up_join(pathf, dir, "mount.path", NULL) || up_join(pidf, dir, "mount.pid", NULL) ||
	    !up_read_line(pathf, mnt, sizeof mnt))
		return;
	if (up_read_line(pidf, line, sizeof line))
		pid = (pid_t)strtol(line, NULL, 10);
	if (is_mounted(mnt)) {
		char *argv[] = { (char *)"fusermount3", (char *)"-u", mnt, NULL };
		pid_t p = fork();
		int ws = 0;
		if (p == 0) {
			execvp(argv[0], argv);
			argv[0] = (char *)"fusermount";
			execvp(argv[0], argv);
			_exit(127);
		}
		if (p < 0 || waitpid(p, &ws, 0) != p || !WIFEXITED(ws) || WEXITSTATUS(ws))
			fprintf(stderr, "dg: warning: fusermount3 -u %s failed; unmount it by hand "
				"(is a process using it?)\n", mnt);
		else
			printf("unmounted %s\n", mnt);
	}
	if (pid > 0 && up_pid_runs_with(pid, mnt)) {
		struct dg_deadline deadline = dg_deadline_in_ms(STOP_WAIT_MS);
		while (!dg_deadline_expired(deadline) && up_pid_alive(pid))
			dg_sleep_ms(20);
		if (up_pid_alive(pid))
			up_stop_pid(pid, "dg mount");
	}
	unlink(pidf);
	unlink(pathf);
}

/* Remove the pointer if it links to (or is a copy of) this cluster's spec. */
static void down_pointer(const char *dir)
{
	char ptr[PATH_MAX], spec[PATH_MAX], target[PATH_MAX];
	ssize_t n;

	if (pointer_path(ptr, NULL) != DG_OK || up_join(spec, dir, "cluster.json", NULL))
		return;
	n = readlink(ptr, target, sizeof target - 1);
	if (n > 0) {
		target[n] = '\0';
		if (strcmp(target, spec) == 0)
			unlink(ptr);
	}
}

/* Stop the cluster of dir. quiet: a failed `dg up` cleaning up after itself. */
int up_down_dir(const char *dir, bool quiet)
{
	struct live live[MAX_TASKS];
	char path[PATH_MAX];
	int n;

	up_supervisor_stop(dir);        /* first: it would restart what we stop */
	down_mount(dir);
	n = find_live(dir, live, MAX_TASKS);
	for (int i = 0; i < n; i++)
		kill(live[i].pid, SIGTERM);     /* all at once: they checkpoint in parallel */
	for (int i = 0; i < n; i++) {
		char label[80];
		snprintf(label, sizeof label, "task %.60s", live[i].name);
		up_stop_pid(live[i].pid, label);
	}
	/* Every pid and port file, also those of tasks that died on their own. */
	DIR *d = opendir(dir);
	for (struct dirent *e; d && (e = readdir(d));) {
		size_t len = strlen(e->d_name);
		if ((len > 4 && !strcmp(e->d_name + len - 4, ".pid")) ||
		    (len > 5 && !strcmp(e->d_name + len - 5, ".port")))
			if (!up_join(path, dir, e->d_name, NULL))
				unlink(path);
	}
	if (d)
		closedir(d);
	down_pointer(dir);
	if (!quiet) {
		if (n)
			printf("stopped %d task%s of %s (data and logs kept there)\n", n,
			       n == 1 ? "" : "s", dir);
		else
			printf("no cluster running in %s\n", dir);
	}
	return 0;
}

static const char down_usage[] =
	"usage: dg down [--dir DIR]\n"
	"\n"
	"Stop the cluster `dg up` started in DIR (default: the one the last `dg up`\n"
	"linked, else $XDG_RUNTIME_DIR/dg/cluster or ~/.dg/cluster): SIGTERM to each\n"
	"task (each writes a checkpoint and exits), SIGKILL after 15 s; unmount a\n"
	"mount `dg up --mount` made; remove the pid and port files, keeping the data\n"
	"dirs and logs. Nothing running is not an error.\n";

int cmd_down(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dir", required_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char dir[PATH_MAX], ptr[PATH_MAX];
	const char *flag = NULL;
	struct dg_err err = { 0 };
	int c;

	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'd': flag = optarg; break;
		case 'h': fputs(down_usage, stdout); return 0;
		case ':': return cli_usage(argv[0], "%s needs a value", argv[optind - 1]);
		default: return cli_usage(argv[0], "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return cli_usage(argv[0], "unexpected argument '%s'", argv[optind]);
	if (flag) {
		if (!realpath(flag, dir)) {
			printf("no cluster running in %s (%s)\n", flag, strerror(errno));
			return 0;
		}
	} else if (last_up_dir(dir)) {
		/* the last dg up's */
	} else if (default_dir(ptr, &err) != DG_OK) {
		return cli_fail(&err);
	} else if (!realpath(ptr, dir)) {
		printf("no cluster running in %s\n", ptr);
		return 0;
	}
	return up_down_dir(dir, false);
}
