/* The supervisor of a `dg up` cluster: the process that started the tasks
 * stays their parent, reaps one that dies and starts it again, at its
 * address with its data dir, as dg up started it. A restart is not a loop:
 * the first comes 100 ms after the exit; a task that dies again within
 * QUICK_DEATH_MS of its start waits twice as long as the last time (up to
 * BACKOFF_MAX_MS), and one that died u->max_restarts times within a minute is
 * left down and said so (its log says why; `dg up --restart JOB/I` asks the
 * supervisor to try again). A clean exit (status 0: someone stopped it) is
 * not restarted. DIR/supervisor.pid names the supervisor (dg down stops it
 * before the tasks, so that it does not restart what dg down stops) and
 * DIR/supervisor.json its counts, which `dg status` shows. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "dg/buf.h"
#include "dg/clock.h"
#include "up.h"

#define RESTART_WINDOW_MS 60000
#define QUICK_DEATH_MS 5000     /* dead this soon after a start: a crash loop, back off */
#define BACKOFF_FIRST_MS 100
#define BACKOFF_MAX_MS 5000
#define SUPERVISOR_STOP_MS 5000

/* What the supervisor knows of one task beyond struct task. */
struct watch {
	int restarts;                           /* since dg up */
	int64_t *recent;                        /* u->max_restarts dg_mono_ms of the last
						 * restarts, a ring (owned) */
	int next;                               /* the ring's next slot */
	int64_t started_ms;                     /* dg_mono_ms of its last (re)start */
	int backoff;                            /* doublings of the next delay */
	int64_t due_ms;                         /* restart at this dg_mono_ms; 0: none due */
	bool given_up;
	bool stopped;                           /* exited cleanly: not restarted */
	char last_exit[64];                     /* "signal 9 (Killed)", "code 3", "" */
	double last_exit_at;                    /* wall seconds; 0: never */
};

static int recent_restarts(const struct up_ctx *u, const struct watch *w, int64_t now)
{
	int n = 0;

	for (int i = 0; i < u->max_restarts; i++)
		n += w->recent[i] && now - w->recent[i] < RESTART_WINDOW_MS;
	return n;
}

static void describe_exit(int ws, char *out, size_t cap)
{
	if (WIFEXITED(ws))
		snprintf(out, cap, "code %d", WEXITSTATUS(ws));
	else if (WIFSIGNALED(ws))
		snprintf(out, cap, "signal %d (%s)", WTERMSIG(ws), strsignal(WTERMSIG(ws)));
	else
		snprintf(out, cap, "status 0x%x", (unsigned)ws);
}

/* A line on our stderr (DIR/supervisor.log once detached) and, when t is
 * set, in the task's own log, where its user looks first. */
static void note(const struct up_ctx *u, const struct task *t, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void note(const struct up_ctx *u, const struct task *t, const char *fmt, ...)
{
	char line[512], stamp[32], path[PATH_MAX];
	time_t now = time(NULL);
	struct tm tm;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
	fprintf(stderr, "%s dg up: %s\n", stamp, line);
	fflush(stderr);
	if (!t)
		return;
	up_task_file(u, t, ".log", path);
	FILE *f = path[0] ? fopen(path, "a") : NULL;
	if (f) {
		fprintf(f, "%s dg up: %s\n", stamp, line);
		fclose(f);
	}
}

static void write_state(const struct up_ctx *u, const struct watch *w)
{
	char path[PATH_MAX];
	json_t *tasks = json_array();
	json_t *o = json_pack("{s:i, s:o}", "pid", (int)getpid(), "tasks", tasks);
	char *text;

	for (int i = 0; tasks && i < u->n; i++) {
		char name[80];
		snprintf(name, sizeof name, "%s/%d", u->t[i].job, u->t[i].index);
		json_array_append_new(tasks, json_pack(
			"{s:s, s:i, s:i, s:s, s:f, s:b, s:b}", "task", name, "pid",
			(int)u->t[i].pid, "restarts", w[i].restarts, "last_exit", w[i].last_exit,
			"last_exit_at", w[i].last_exit_at, "given_up", w[i].given_up, "stopped",
			w[i].stopped));
	}
	text = o ? json_dumps(o, JSON_INDENT(1)) : NULL;
	json_decref(o);
	if (text && up_join(path, u->dir, "supervisor.json", NULL) == DG_OK)
		dg_write_file_atomic_mode(path, text, strlen(text), 0600, NULL);
	free(text);
}

/* A child exited: say how, and plan its restart (or give up on it). */
static void on_exit_of(struct up_ctx *u, struct watch *w, struct task *t, int ws)
{
	char name[80], pidf[PATH_MAX];
	int64_t now = dg_mono_ms();
	int recent = recent_restarts(u, w, now);

	snprintf(name, sizeof name, "%s/%d", t->job, t->index);
	describe_exit(ws, w->last_exit, sizeof w->last_exit);
	w->last_exit_at = dg_wall_s();
	up_task_file(u, t, ".pid", pidf);
	if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
		w->stopped = true;
		unlink(pidf);
		note(u, t, "%s (pid %d) exited cleanly; not restarting it (dg up --restart %s "
		     "starts it)", name, (int)t->pid, name);
	} else if (recent >= u->max_restarts) {
		w->given_up = true;
		unlink(pidf);
		note(u, t, "%s (pid %d) exited with %s, %d times within a minute; not "
		     "restarting it: see its log, then dg up --restart %s", name, (int)t->pid,
		     w->last_exit, recent + 1, name);
	} else {
		/* A task that ran a while starts over quickly; a crash loop backs off. */
		w->backoff = now - w->started_ms >= QUICK_DEATH_MS ? 0 :
			     w->backoff < 16 ? w->backoff + 1 : 16;
		int64_t delay = (int64_t)BACKOFF_FIRST_MS << (w->backoff ? w->backoff - 1 : 0);
		if (delay > BACKOFF_MAX_MS)
			delay = BACKOFF_MAX_MS;
		w->due_ms = now + delay;
		note(u, t, "%s (pid %d) exited with %s; restarting it in %lld ms", name,
		     (int)t->pid, w->last_exit, (long long)delay);
	}
	t->pid = 0;
}

static void restart_due(struct up_ctx *u, struct watch *w)
{
	int64_t now = dg_mono_ms();

	for (int i = 0; i < u->n; i++) {
		struct task *t = &u->t[i];
		struct dg_err err = { 0 };
		if (!w[i].due_ms || w[i].due_ms > now || t->pid)
			continue;
		w[i].due_ms = 0;
		w[i].recent[w[i].next] = now;
		w[i].next = (w[i].next + 1) % u->max_restarts;
		w[i].restarts++;
		w[i].started_ms = now;
		if (up_start_task(u, t, &err) != DG_OK) {
			/* Counts as a restart: a start that keeps failing ends in giving up. */
			if (recent_restarts(u, &w[i], now) >= u->max_restarts) {
				w[i].given_up = true;
				note(u, t, "cannot restart %s/%d: %s; not trying again (%d tries "
				     "within a minute): dg up --restart %s/%d when fixed", t->job,
				     t->index, err.msg, u->max_restarts, t->job, t->index);
			} else {
				w[i].due_ms = now + BACKOFF_MAX_MS;
				note(u, t, "cannot restart %s/%d: %s", t->job, t->index, err.msg);
			}
			continue;
		}
		note(u, t, "restarted %s/%d (pid %d; restart %d)", t->job, t->index, (int)t->pid,
		     w[i].restarts);
	}
}

/* SIGUSR1 (dg up --restart): every task that is down and not due is due now,
 * its recent restarts forgotten. */
static void retry_down(struct up_ctx *u, struct watch *w)
{
	for (int i = 0; i < u->n; i++) {
		if (u->t[i].pid || w[i].due_ms)
			continue;
		memset(w[i].recent, 0, (size_t)u->max_restarts * sizeof *w[i].recent);
		w[i].backoff = 0;
		w[i].given_up = w[i].stopped = false;
		w[i].due_ms = dg_mono_ms();
	}
}

int up_supervise(struct up_ctx *u, bool foreground)
{
	struct watch *w = calloc((size_t)u->n + 1, sizeof *w);
	sigset_t set;
	int rc = 0;

	bool oom = !w;
	for (int i = 0; !oom && i < u->n; i++) {
		oom = !(w[i].recent = calloc((size_t)u->max_restarts, sizeof *w[i].recent));
		w[i].started_ms = dg_mono_ms();
	}
	if (oom) {
		for (int i = 0; w && i < u->n; i++)
			free(w[i].recent);
		free(w);
		fprintf(stderr, "dg: out of memory supervising the cluster\n");
		return dg_status_to_exit(DG_ENOMEM);
	}
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);     /* taken by sigtimedwait from now on */
	if (foreground) {
		printf("in the foreground, supervising: ^C stops the cluster\n");
		fflush(stdout);
	}
	write_state(u, w);
	for (;;) {
		int64_t now = dg_mono_ms(), next = now + 60000;
		for (int i = 0; i < u->n; i++)
			if (w[i].due_ms && w[i].due_ms < next)
				next = w[i].due_ms;
		int64_t wait = next > now ? next - now : 0;
		struct timespec ts = { .tv_sec = wait / 1000, .tv_nsec = (wait % 1000) * 1000000 };
		int sig = sigtimedwait(&set, NULL, &ts);
		if (sig == SIGTERM || sig == SIGINT || (sig == SIGHUP && foreground))
			break;
		if (sig == SIGUSR1)
			retry_down(u, w);
		int ws;
		for (pid_t p; (p = waitpid(-1, &ws, WNOHANG)) > 0;) {
			for (int i = 0; i < u->n; i++)
				if (u->t[i].pid == p)
					on_exit_of(u, &w[i], &u->t[i], ws);
			if (p == u->mount_pid) {
				char how[64];
				describe_exit(ws, how, sizeof how);
				note(u, NULL, "the mount (pid %d) exited with %s; not restarting it",
				     (int)p, how);
				u->mount_pid = 0;
			}
		}
		restart_due(u, w);
		write_state(u, w);
	}
	for (int i = 0; i < u->n; i++)
		free(w[i].recent);
	free(w);
	if (foreground) {
		char path[PATH_MAX];
		/* Ours: gone first, or up_down_dir would stop its supervisor, us. */
		if (up_join(path, u->dir, "supervisor.pid", NULL) == DG_OK)
			unlink(path);
		rc = up_down_dir(u->dir, false);
	}
	return rc;
}

pid_t up_supervisor_pid(const char *dir)
{
	char path[PATH_MAX], line[32];
	pid_t pid;

	if (up_join(path, dir, "supervisor.pid", NULL) != DG_OK || !up_read_line(path, line,
										  sizeof line))
		return 0;
	pid = (pid_t)strtol(line, NULL, 10);
	/* Its command line is the dg up that forked it. */
	return pid > 0 && up_pid_runs_with(pid, "up") ? pid : 0;
}

void up_supervisor_stop(const char *dir)
{
	char path[PATH_MAX];
	pid_t pid = up_supervisor_pid(dir);

	if (pid > 0 && kill(pid, SIGTERM) == 0) {
		struct dg_deadline d = dg_deadline_in_ms(SUPERVISOR_STOP_MS);
		while (!dg_deadline_expired(d) && up_pid_alive(pid))
			dg_sleep_ms(10);
		if (up_pid_alive(pid))
			up_stop_pid(pid, "the supervisor of dg up");
	}
	if (up_join(path, dir, "supervisor.pid", NULL) == DG_OK)
		unlink(path);
}

json_t *up_supervisor_state(const char *dir)
{
	char path[PATH_MAX];

	if (up_join(path, dir, "supervisor.json", NULL) != DG_OK)
		return NULL;
	return json_load_file(path, 0, NULL);
}
