/* bench_graph: distributed graph execution (issue 5) against baselines measured in
 * the same run. Starts a 2-task cluster (two pinned `dg server` child processes on
 * loopback ports it picks) and measures: (1) the seed program through `dg submit`
 * against `dg eval` of the same file (whole processes, fork+exec both); (2) the
 * per-step time of a 2-fragment graph with a 4-byte crossing tensor against the same
 * graph on one task; (3) a 64 MiB tensor crossing tasks against a loopback socket;
 * (4, --overlap) an MLP training step with its ps requests on the worker's I/O pool
 * against the same step with them one after the other. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "dg/autodiff.h"
#include "dg/buf.h"
#include "dg/client.h"
#include "dg/executor.h"
#include "dg/graph.h"
#include "dg/http.h"
#include "dg/status.h"

#define MAX_RUNS 256
#define BIG_NUMEL 16777216              /* 64 MiB of float32 */
#define BIG_BYTES ((size_t)BIG_NUMEL * 4)
#define CHUNK (1u << 20)                /* the socket baseline's write size */
#define JOB_WAIT_S 300.0

struct opts {
	bool quick;
	bool strict;                    /* exit 4 when a target is missed */
	bool overlap;                   /* case 4 only */
	bool steps_only;                /* case 2 only */
	int runs;                       /* process runs of case 1 */
	int steps;                      /* steps per job of case 2 */
	int jobs;                       /* jobs per side of cases 2 and 3 */
	int big_steps;                  /* steps per job of case 3 */
	int task_cpu[2];                /* -1: not pinned */
	int client_cpu;
	const char *dg_path;
	const char *seed_path;
};

static struct opts O;
static char tmpdir[PATH_MAX];
static volatile pid_t server_pid[2];
static char addr[2][32];
static char spec_path[PATH_MAX + 16];
static int missed;                      /* targets missed (--strict: exit 4) */

/* ----------------------------------------------------------------- small helpers */

static void pin_cpu(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof set, &set) != 0)
		fprintf(stderr, "bench_graph: cannot pin to cpu %d: %s\n", cpu, strerror(errno));
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(p);
	return 0;
}

/* Stop both servers and remove the temp dir; safe to call twice. */
static void cleanup(void)
{
	for (int i = 0; i < 2; i++) {
		bench_stop_child(server_pid[i], 5000);
		server_pid[i] = 0;
	}
	if (tmpdir[0])
		nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	tmpdir[0] = 0;
}

/* SIGINT/SIGTERM: kill the servers, remove the temp dir with `rm -rf` (fork, execve
 * and waitpid are async-signal-safe; nftw is not) and leave. The servers also get
 * SIGTERM from PR_SET_PDEATHSIG if the bench dies otherwise. */
static void on_signal(int sig)
{
	static char *const env[] = { 0 };
	pid_t pid;

	for (int i = 0; i < 2; i++)
		if (server_pid[i] > 0) {
			kill(server_pid[i], SIGKILL);
			waitpid(server_pid[i], NULL, 0);
		}
	if (tmpdir[0] && (pid = fork()) == 0) {
		char *const argv[] = { (char *)"rm", (char *)"-rf", tmpdir, NULL };

		execve("/bin/rm", argv, env);
		_exit(127);
	} else if (tmpdir[0] && pid > 0) {
		waitpid(pid, NULL, 0);
	}
	_exit(128 + sig);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "bench_graph: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	cleanup();
	exit(2);
}

/* --------------------------------------------------------------------- cluster */

/* Two free loopback ports: both bound at once so they differ. */
static void pick_ports(int port[2])
{
	int fd[2];

	for (int i = 0; i < 2; i++) {
		struct sockaddr_in a = { .sin_family = AF_INET,
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t al = sizeof a;

		fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd[i] < 0 || bind(fd[i], (struct sockaddr *)&a, sizeof a) != 0 ||
		    getsockname(fd[i], (struct sockaddr *)&a, &al) != 0)
			die("cannot pick a loopback port: %s", strerror(errno));
		port[i] = ntohs(a.sin_port);
	}
	close(fd[0]);
	close(fd[1]);
}

static pid_t spawn_server(int task)
{
	char idx[8], portf[PATH_MAX + 16], logf[PATH_MAX + 16];
	pid_t pid;

	snprintf(idx, sizeof idx, "%d", task);
	snprintf(portf, sizeof portf, "%s/port-%d", tmpdir, task);
	snprintf(logf, sizeof logf, "%s/worker-%d.log", tmpdir, task);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(logf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		const char *argv[] = { O.dg_path, "server", "--cluster", spec_path, "--job",
				       "worker", "--task", idx, "--port-file", portf, NULL };

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		pin_cpu(O.task_cpu[task]);      /* as `taskset -c N dg server ...` */
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(O.dg_path, (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", O.dg_path, strerror(errno));
		_exit(127);
	}
	return pid;
}

/* GET /v1/health on task i: true when it answers. */
static bool healthy(int i)
{
	struct dg_err err = { 0 };
	struct dg_http_result r;
	struct dg_http_client *c = dg_http_client_new(addr[i], NULL, 1000, &err);
	bool ok;

	if (!c)
		return false;
	dg_http_result_init(&r);
	ok = dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &r, &err) == DG_OK;
	dg_http_result_deinit(&r);
	dg_http_client_free(c);
	return ok;
}

/* Start the 2-task cluster {"worker": [a0, a1]}; a port taken by someone else
 * between picking and binding makes a server exit: retried up to 3 times. */
static void start_cluster(void)
{
	for (int attempt = 0; attempt < 3; attempt++) {
		int port[2], status;
		bool up[2] = { false, false }, failed = false;
		double t0 = bench_now_s();
		FILE *f;

		pick_ports(port);
		for (int i = 0; i < 2; i++)
			snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", port[i]);
		f = fopen(spec_path, "w");
		if (!f || fprintf(f, "{\"worker\": [\"%s\", \"%s\"]}\n", addr[0], addr[1]) < 0 ||
		    fclose(f) != 0)
			die("cannot write %s", spec_path);
		for (int i = 0; i < 2; i++)
			server_pid[i] = spawn_server(i);
		while (!(up[0] && up[1]) && !failed && bench_now_s() - t0 < 30) {
			for (int i = 0; i < 2; i++) {
				if (!up[i])
					up[i] = healthy(i);
				if (waitpid(server_pid[i], &status, WNOHANG) == server_pid[i]) {
					char logf[PATH_MAX + 16];

					snprintf(logf, sizeof logf, "%s/worker-%d.log", tmpdir, i);
					fprintf(stderr, "bench_graph: task %d exited "
						"(status %d):\n", i,
						WIFEXITED(status) ? WEXITSTATUS(status) : -1);
					bench_dump_file(logf);
					server_pid[i] = 0;
					failed = true;
				}
			}
			usleep(20000);
		}
		if (up[0] && up[1])
			return;
		for (int i = 0; i < 2; i++) {
			bench_stop_child(server_pid[i], 5000);
			server_pid[i] = 0;
		}
	}
	die("the 2-task cluster did not start (logs above)");
}

/* ------------------------------------------------- case 1: whole-process latency */

/* fork+exec argv (pinned to the client cpu), stdout into out; returns seconds from
 * fork to exit, or -1 when it failed (its stderr is printed). */
static double run_process(const char *const *argv, char *out, size_t cap)
{
	int pfd[2], status;
	size_t n = 0;
	ssize_t k;
	double t0;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC) != 0)
		die("pipe: %s", strerror(errno));
	t0 = bench_now_s();
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		dup2(pfd[1], 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	while ((k = read(pfd[0], out + n, cap - 1 - n)) > 0 || (k < 0 && errno == EINTR))
		if (k > 0 && (n += (size_t)k) >= cap - 1)
			break;
	out[n] = 0;
	close(pfd[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "bench_graph: `%s %s` failed (status %d)\n", argv[0], argv[1],
			WIFEXITED(status) ? WEXITSTATUS(status) : -1);
		return -1;
	}
	return bench_now_s() - t0;
}

static void case_seed(void)
{
	const char *sub[] = { O.dg_path, "submit", O.seed_path, "--cluster", spec_path, NULL };
	const char *ev[] = { O.dg_path, "eval", O.seed_path, NULL };
	const char *help[] = { O.dg_path, "eval", "--help", NULL };
	double ts[MAX_RUNS], te[MAX_RUNS], th[MAX_RUNS];
	char out[4096];

	for (int r = -2; r < O.runs; r++) {     /* two warm-up runs */
		double a = run_process(sub, out, sizeof out);

		if (a < 0 || strcmp(out, "238\n") != 0)
			die("dg submit %s printed '%.*s', not 238", O.seed_path,
			    (int)strcspn(out, "\n"), out);
		double b = run_process(ev, out, sizeof out);

		if (b < 0 || strcmp(out, "238\n") != 0)
			die("dg eval %s printed '%.*s', not 238", O.seed_path,
			    (int)strcspn(out, "\n"), out);
		double c = run_process(help, out, sizeof out);

		if (c < 0 || strncmp(out, "usage:", 6) != 0)
			die("dg eval --help printed no usage");
		if (r >= 0) {
			ts[r] = a;
			te[r] = b;
			th[r] = c;
		}
	}
	double ms = 1e3 * bench_median(ts, O.runs), me = 1e3 * bench_median(te, O.runs);
	double mh = 1e3 * bench_median(th, O.runs);

	printf("seed latency (whole process, fork+exec): dg submit %.2f ms  dg eval %.2f ms  "
	       "ratio %.2f (median of %d)\n", ms, me, ms / me, O.runs);
	printf("    process start alone (dg eval --help, runs nothing): %.2f ms; "
	       "submit - eval = %.2f ms\n", mh, ms - me);
}

/* --------------------------------------------------------------- the jobs API */

static struct dg_http_client *master;

/* A graph of nodes as "name op device [input...]" built with jansson. */
static json_t *node(const char *name, const char *op, int task, json_t *attrs,
		    const char *in0, const char *in1)
{
	char dev[32];
	json_t *n = json_object(), *ins = json_array();

	snprintf(dev, sizeof dev, "/job:worker/task:%d", task);
	json_object_set_new(n, "name", json_string(name));
	json_object_set_new(n, "op", json_string(op));
	json_object_set_new(n, "device", json_string(dev));
	if (in0)
		json_array_append_new(ins, json_string(in0));
	if (in1)
		json_array_append_new(ins, json_string(in1));
	json_object_set_new(n, "inputs", ins);
	if (attrs)
		json_object_set_new(n, "attrs", attrs);
	return n;
}

/* Case 2's graph: y = a + c with a (float32 scalar, 4 bytes) on task ta, c and y
 * on task 0: one crossing tensor when ta = 1, none when ta = 0. y = 3.5. */
static json_t *small_graph(int ta)
{
	json_t *nodes = json_array();

	json_array_append_new(nodes, node("a", "Const", ta,
					  json_pack("{s:f, s:s}", "value", 1.5, "dtype", "float32"),
					  NULL, NULL));
	json_array_append_new(nodes, node("c", "Const", 0,
					  json_pack("{s:f, s:s}", "value", 2.0, "dtype", "float32"),
					  NULL, NULL));
	json_array_append_new(nodes, node("y", "Add", 0, NULL, "a", "c"));
	return json_pack("{s:i, s:o}", "version", 1, "nodes", nodes);
}

/* Case 3's graph: t = Fill([2^24], 1) on task tf, y = Sum(t) on task 0 = 2^24. */
static json_t *big_graph(int tf)
{
	json_t *nodes = json_array();

	json_array_append_new(nodes, node("t", "Fill", tf,
					  json_pack("{s:[i], s:f, s:s}", "shape", BIG_NUMEL,
						    "value", 1.0, "dtype", "float32"),
					  NULL, NULL));
	json_array_append_new(nodes, node("y", "Sum", 0, NULL, "t", NULL));
	return json_pack("{s:i, s:o}", "version", 1, "nodes", nodes);
}

struct job_result {
	double step_ms[4096];           /* from the step events */
	int n_steps;
	double wall_s;                  /* POST to the final event, seen by the client */
	double total_ms;                /* the job's own "ms.total" */
	float y;                        /* the fetched value of the last step */
};

static void http_or_die(const char *method, const char *path, const void *body, size_t len,
			struct dg_http_result *r)
{
	struct dg_err err = { 0 };
	struct dg_http_header h = { "Content-Type", "application/json" };

	dg_http_result_init(r);
	if (dg_http_request(master, method, path, body ? &h : NULL, body ? 1 : 0, body, len, r,
			    &err) != DG_OK) {
		dg_http_result_deinit(r);
		die("%s %s: %s%s%s", method, path, err.msg, err.hint[0] ? " (" : "",
		    err.hint[0] ? err.hint : "");
	}
}

/* Submit graph (taken) for steps steps, wait for it through the event stream and
 * collect the per-step times and the fetched y. Dies when the job fails. */
static void run_job(json_t *graph, int steps, struct job_result *jr)
{
	json_t *doc = json_pack("{s:o, s:[s], s:i}", "graph", graph, "fetch", "y", "steps", steps);
	char *body = json_dumps(doc, JSON_COMPACT), id[64], path[160];
	struct dg_http_result r;
	json_t *st;
	bool over = false;
	int64_t from = 0;
	double t0;

	json_decref(doc);
	if (!body)
		die("out of memory");
	memset(jr, 0, sizeof *jr);
	t0 = bench_now_s();
	http_or_die("POST", "/v1/jobs", body, strlen(body), &r);
	free(body);
	st = json_loadb(r.body.data, r.body.len, 0, NULL);
	dg_http_result_deinit(&r);
	if (!st || !json_is_string(json_object_get(st, "id")))
		die("POST /v1/jobs: no job id in the answer");
	snprintf(id, sizeof id, "%s", json_string_value(json_object_get(st, "id")));
	json_decref(st);
	while (!over) {
		char *line, *save = NULL;

		if (bench_now_s() - t0 > JOB_WAIT_S) {
			snprintf(path, sizeof path, "/v1/jobs/%s", id);
			http_or_die("DELETE", path, NULL, 0, &r);
			dg_http_result_deinit(&r);
			die("job %s did not finish in %.0f s (canceled)", id, JOB_WAIT_S);
		}
		snprintf(path, sizeof path, "/v1/jobs/%s/events?from=%lld&timeout_ms=10000", id,
			 (long long)from);
		http_or_die("GET", path, NULL, 0, &r);
		if (r.dg_count >= 0)
			from = r.dg_count;
		for (line = r.body.data ? strtok_r(r.body.data, "\n", &save) : NULL; line;
		     line = strtok_r(NULL, "\n", &save)) {
			json_t *e = json_loads(line, 0, NULL);
			const char *kind = json_string_value(json_object_get(e, "event"));

			if (kind && strcmp(kind, "step") == 0 && jr->n_steps < 4096)
				jr->step_ms[jr->n_steps++] =
					json_number_value(json_object_get(e, "ms"));
			else if (kind && strcmp(kind, "done") == 0)
				over = true;
			else if (kind && (!strcmp(kind, "failed") || !strcmp(kind, "canceled"))) {
				char *s = json_dumps(e, JSON_COMPACT);

				fprintf(stderr, "bench_graph: job %s: %s\n", id, s ? s : kind);
				free(s);
				json_decref(e);
				dg_http_result_deinit(&r);
				die("job %s %s", id, kind);
			}
			json_decref(e);
		}
		dg_http_result_deinit(&r);
	}
	jr->wall_s = bench_now_s() - t0;
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	http_or_die("GET", path, NULL, 0, &r);
	st = json_loadb(r.body.data, r.body.len, 0, NULL);
	dg_http_result_deinit(&r);
	jr->total_ms = json_number_value(json_object_get(json_object_get(st, "ms"), "total"));
	json_decref(st);
	snprintf(path, sizeof path, "/v1/jobs/%s/results/y", id);
	http_or_die("GET", path, NULL, 0, &r);
	if (r.body.len != 4 || strcmp(r.dg_dtype, "float32") != 0) {
		dg_http_result_deinit(&r);
		die("job %s: result y is not one float32", id);
	}
	memcpy(&jr->y, r.body.data, 4);
	dg_http_result_deinit(&r);
}

/* ------------------------------------------------ case 2: per-step overhead */

static struct job_result JR;

struct pong_ctx {
	int lfd;
	int n;
};

/* The round-trip baseline's echo side: 4 bytes in, 4 bytes out, n times. */
static void *pong_main(void *arg)
{
	struct pong_ctx *p = arg;
	int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC), one = 1;
	uint32_t v;

	pin_cpu(O.task_cpu[1]);
	if (fd < 0)
		return NULL;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	for (int i = 0; i < p->n; i++)
		if (recv(fd, &v, 4, MSG_WAITALL) != 4 || send(fd, &v, 4, MSG_NOSIGNAL) != 4)
			break;
	close(fd);
	return NULL;
}

/* Median ms of n round trips of 4 bytes over one loopback TCP connection, the two
 * ends on the cpus of task 0 and task 1: the floor of one request and its reply. */
static double round_trip_baseline(int n)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	struct pong_ctx p = { .n = n };
	static double t[4096];
	pthread_t th;
	int fd, one = 1;

	p.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (p.lfd < 0 || bind(p.lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
	    listen(p.lfd, 4) != 0 || getsockname(p.lfd, (struct sockaddr *)&a, &al) != 0)
		die("round-trip baseline: %s", strerror(errno));
	if (pthread_create(&th, NULL, pong_main, &p) != 0)
		die("round-trip baseline: cannot start its thread");
	pin_cpu(O.task_cpu[0]);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
		die("round-trip baseline: connect: %s", strerror(errno));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	for (int i = 0; i < n; i++) {
		uint32_t v = (uint32_t)i, w = 0;
		double t0 = bench_now_s();

		if (send(fd, &v, 4, MSG_NOSIGNAL) != 4 || recv(fd, &w, 4, MSG_WAITALL) != 4 ||
		    w != v)
			die("round-trip baseline: exchange %d failed", i);
		t[i] = 1e3 * (bench_now_s() - t0);
	}
	close(fd);
	pthread_join(th, NULL);
	close(p.lfd);
	pin_cpu(O.client_cpu);
	return bench_median(t, n);
}

/* The mean and the 90th percentile of a job's step times. */
static void step_stats(const struct job_result *jr, double *mean, double *p90)
{
	static double s[4096];
	double sum = 0;

	memcpy(s, jr->step_ms, (size_t)jr->n_steps * sizeof s[0]);
	qsort(s, (size_t)jr->n_steps, sizeof s[0], bench_cmp_double);
	for (int i = 0; i < jr->n_steps; i++)
		sum += s[i];
	*mean = sum / jr->n_steps;
	*p90 = s[(jr->n_steps * 9) / 10 < jr->n_steps ? (jr->n_steps * 9) / 10 : jr->n_steps - 1];
}

static void case_steps(void)
{
	double cross[64], local[64], wall_c[64], wall_l[64], mean_c[64], p90_c[64], rtt[64];

	for (int j = 0; j < O.jobs; j++) {
		run_job(small_graph(1), O.steps, &JR);
		if (JR.y != 3.5f || JR.n_steps != O.steps)
			die("2-task job: y = %g after %d step events, want 3.5 after %d", JR.y,
			    JR.n_steps, O.steps);
		cross[j] = bench_median(JR.step_ms, JR.n_steps);
		step_stats(&JR, &mean_c[j], &p90_c[j]);
		wall_c[j] = 1e3 * JR.wall_s / O.steps;
		run_job(small_graph(0), O.steps, &JR);
		if (JR.y != 3.5f || JR.n_steps != O.steps)
			die("1-task job: y = %g, want 3.5", JR.y);
		local[j] = bench_median(JR.step_ms, JR.n_steps);
		wall_l[j] = 1e3 * JR.wall_s / O.steps;
		rtt[j] = round_trip_baseline(O.steps);
	}
	double c = bench_median(cross, O.jobs), l = bench_median(local, O.jobs);
	double rt = bench_median(rtt, O.jobs);

	printf("step, 4-byte crossing tensor (jobs of %d steps, median step of each job, median "
	       "of %d jobs):\n", O.steps, O.jobs);
	printf("    2 tasks (2 fragments) %.3f ms  1 task (1 fragment) %.3f ms  ratio %.2f\n"
	       "    job wall time / steps: 2 tasks %.3f ms  1 task %.3f ms\n", c, l, c / l,
	       bench_median(wall_c, O.jobs), bench_median(wall_l, O.jobs));
	printf("    2 tasks: mean step %.3f ms, 90th percentile %.3f ms (medians over the jobs)\n",
	       bench_median(mean_c, O.jobs), bench_median(p90_c, O.jobs));
	printf("    loopback TCP round trip, 4 bytes, cpu %d <-> cpu %d: %.3f ms (median of %d); "
	       "2-task step / round trip %.1f\n", O.task_cpu[0], O.task_cpu[1], rt, O.steps,
	       c / rt);
	printf("    target: 2-task step < 1 ms: %s\n", c < 1.0 ? "met" : "MISSED");
	missed += c >= 1.0;
}

/* ---------------------------------------------- case 3: 64 MiB crossing tensor */

struct sock_ctx {
	int lfd;
	int runs;
	const char *src;
};

/* The baseline's sender: for each run, accept, write 64 MiB in 1 MiB writes, close. */
static void *sock_sender(void *arg)
{
	struct sock_ctx *s = arg;

	pin_cpu(O.task_cpu[1]);
	for (int r = 0; r < s->runs; r++) {
		int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC), one = 1;
		size_t off = 0;

		if (fd < 0)
			return NULL;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		while (off < BIG_BYTES) {
			size_t n = BIG_BYTES - off < CHUNK ? BIG_BYTES - off : CHUNK;
			ssize_t k = send(fd, s->src + off, n, MSG_NOSIGNAL);

			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				break;
			off += (size_t)k;
		}
		close(fd);
	}
	return NULL;
}

/* Median seconds of runs transfers of 64 MiB over loopback TCP (connect to last
 * byte received into a reused buffer), sender thread on task 1's cpu, receiver on
 * task 0's. */
static double socket_baseline(int runs)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	struct sock_ctx s = { .runs = runs };
	char *src = malloc(BIG_BYTES), *dst = malloc(BIG_BYTES);
	double t[64];
	pthread_t th;

	if (!src || !dst)
		die("out of memory for the socket baseline");
	memset(src, 0x5a, BIG_BYTES);
	memset(dst, 0, BIG_BYTES);
	s.src = src;
	s.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s.lfd < 0 || bind(s.lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
	    listen(s.lfd, 4) != 0 || getsockname(s.lfd, (struct sockaddr *)&a, &al) != 0)
		die("socket baseline: %s", strerror(errno));
	if (pthread_create(&th, NULL, sock_sender, &s) != 0)
		die("socket baseline: cannot start its thread");
	pin_cpu(O.task_cpu[0]);
	for (int r = 0; r < runs; r++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
		size_t got = 0;
		double t0 = bench_now_s();

		if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
			die("socket baseline: connect: %s", strerror(errno));
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		while (got < BIG_BYTES) {
			ssize_t k = recv(fd, dst + got, BIG_BYTES - got, 0);

			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				break;
			got += (size_t)k;
		}
		t[r] = bench_now_s() - t0;
		close(fd);
		if (got != BIG_BYTES || dst[got - 1] != 0x5a)
			die("socket baseline: received %zu of %zu bytes", got, BIG_BYTES);
	}
	pthread_join(th, NULL);
	close(s.lfd);
	free(src);
	free(dst);
	pin_cpu(O.client_cpu);
	return bench_median(t, runs);
}

static void case_big(void)
{
	double cross[64], local[64], sock[64];

	for (int j = 0; j < O.jobs; j++) {
		run_job(big_graph(1), O.big_steps, &JR);
		if (JR.y != 16777216.0f || JR.n_steps != O.big_steps)
			die("2-task 64 MiB job: y = %g, want 16777216", JR.y);
		cross[j] = bench_median(JR.step_ms, JR.n_steps);
		run_job(big_graph(0), O.big_steps, &JR);
		if (JR.y != 16777216.0f)
			die("1-task 64 MiB job: y = %g, want 16777216", JR.y);
		local[j] = bench_median(JR.step_ms, JR.n_steps);
		sock[j] = socket_baseline(O.big_steps);
	}
	double c = bench_median(cross, O.jobs), l = bench_median(local, O.jobs);
	double s = 1e3 * bench_median(sock, O.jobs);
	double x = c - l, mib = (double)BIG_BYTES / (1 << 20);

	printf("64 MiB float32 crossing tasks (Fill on task 1, Sum on task 0; jobs of %d steps, "
	       "median step, median of %d jobs):\n", O.big_steps, O.jobs);
	printf("    step 2 tasks %.1f ms  1 task %.1f ms  crossing %.1f ms (%.2f GB/s)\n", c, l, x,
	       x > 0 ? mib * 1.048576e-3 / (x * 1e-3) : 0.0);
	printf("    loopback socket 64 MiB in 1 MiB writes: %.1f ms (%.2f GB/s)\n", s,
	       mib * 1.048576e-3 / (s * 1e-3));
	printf("    ratio crossing / socket throughput %.2f  (target >= 0.5: %s)\n",
	       x > 0 ? s / x : 0.0, x > 0 && s / x >= 0.5 ? "met" : "MISSED");
	missed += !(x > 0 && s / x >= 0.5);
}

/* ------------------------------------- case 4 (--overlap): I/O overlap in a training step */

/* One MLP training step as a fragment run in this process by a struct worker:
 * pull w1 [784,256], b1 [256], w2 [256,10], b2 [10] (float32) from task 1's ps,
 * forward + backward on a 64-batch (constant data: step-invariant, cached) and
 * push 4 sgd applies. Median step time with the I/O pool against without
 * (io_threads -1: every request on the run's thread, one after the other). */
static const char *const OV_VARS[4] = { "ov/w1", "ov/b1", "ov/w2", "ov/b2" };
static const int64_t OV_SHAPE[4][2] = { { 784, 256 }, { 256, 0 }, { 256, 10 }, { 10, 0 } };

static void ov_put_vars(void)
{
	struct dg_err err = { 0 };
	struct dg_client *c = dg_client_new(addr[1], NULL, &err);

	if (!c)
		die("client for %s: %s", addr[1], err.msg);
	for (int k = 0; k < 4; k++) {
		struct dg_shape s = { OV_SHAPE[k][1] ? 2 : 1, { OV_SHAPE[k][0], OV_SHAPE[k][1] } };
		struct dg_tensor *t = dg_tensor_new(DG_F32, &s, &err);
		struct dg_put_opts po = { .replace = true };
		if (!t)
			die("tensor: %s", err.msg);
		for (int64_t i = 0; i < t->numel; i++)          /* small, varied weights */
			((float *)t->data)[i] = (float)((i * 7919 % 1000) - 500) * 1e-4f;
		if (dg_var_put(c, OV_VARS[k], t, &po, NULL, &err) != DG_OK)
			die("put %s: %s", OV_VARS[k], err.msg);
		dg_tensor_free(t);
	}
	dg_client_free(c);
}

/* The forward graph, its gradients (dg_autodiff_ex), the applies and the
 * loss sent to the worker's own address; owned JSON text. */
static char *ov_fragment(const char *self)
{
	char doc[4096], ps[64];
	struct dg_err err = { 0 };
	json_t *out = NULL;
	char **grads = NULL;

	snprintf(ps, sizeof ps, "%s", addr[1]);
	snprintf(doc, sizeof doc, "{\"version\": 1, \"nodes\": ["
		 "{\"name\": \"x\", \"op\": \"Fill\", \"attrs\": {\"shape\": [64, 784], "
		 "\"value\": 0.5}},"
		 "{\"name\": \"yf\", \"op\": \"Fill\", \"attrs\": {\"shape\": [64], \"value\": 3}},"
		 "{\"name\": \"y\", \"op\": \"Cast\", \"inputs\": [\"yf\"], "
		 "\"attrs\": {\"dtype\": \"int32\"}},"
		 "{\"name\": \"w1\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"ov/w1\", \"ps\": "
		 "\"%s\", \"dtype\": \"float32\", \"shape\": [784, 256]}},"
		 "{\"name\": \"b1\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"ov/b1\", \"ps\": "
		 "\"%s\", \"dtype\": \"float32\", \"shape\": [256]}},"
		 "{\"name\": \"w2\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"ov/w2\", \"ps\": "
		 "\"%s\", \"dtype\": \"float32\", \"shape\": [256, 10]}},"
		 "{\"name\": \"b2\", \"op\": \"VarRead\", \"attrs\": {\"var\": \"ov/b2\", \"ps\": "
		 "\"%s\", \"dtype\": \"float32\", \"shape\": [10]}},"
		 "{\"name\": \"h1_mm\", \"op\": \"MatMul\", \"inputs\": [\"x\", \"w1\"]},"
		 "{\"name\": \"h1_pre\", \"op\": \"Add\", \"inputs\": [\"h1_mm\", \"b1\"]},"
		 "{\"name\": \"h1\", \"op\": \"Relu\", \"inputs\": [\"h1_pre\"]},"
		 "{\"name\": \"lg_mm\", \"op\": \"MatMul\", \"inputs\": [\"h1\", \"w2\"]},"
		 "{\"name\": \"lg\", \"op\": \"Add\", \"inputs\": [\"lg_mm\", \"b2\"]},"
		 "{\"name\": \"xent\", \"op\": \"SparseSoftmaxCrossEntropyWithLogits\", "
		 "\"inputs\": [\"lg\", \"y\"]},"
		 "{\"name\": \"loss\", \"op\": \"Mean\", \"inputs\": [\"xent\"]},"
		 "{\"name\": \"send_loss\", \"op\": \"_Send\", \"inputs\": [\"loss\"], "
		 "\"attrs\": {\"key\": \"fetch:loss\", \"to\": \"%s\"}}]}", ps, ps, ps, ps, self);
	struct dg_graph *g = dg_graph_parse(doc, strlen(doc), worker_op_find, &err);
	static const char *const wrt[4] = { "w1", "b1", "w2", "b2" };
	struct dg_autodiff_opts ao = { .lookup = worker_op_find };
	if (!g || dg_autodiff_ex(g, "loss", wrt, 4, &ao, &out, &grads, &err) != DG_OK)
		die("overlap fragment: %s", err.msg);
	json_t *nodes = json_object_get(out, "nodes");
	for (int k = 0; k < 4; k++) {
		json_t *n = json_pack("{s:s+, s:s, s:[s], s:{s:s, s:s, s:s, s:f}}", "name",
				      "apply_", wrt[k], "op", "VarApply", "inputs", grads[k],
				      "attrs", "var", OV_VARS[k], "ps", ps, "rule", "sgd",
				      "lr", 0.01);
		if (!n || json_array_append_new(nodes, n))
			die("out of memory");
	}
	char *text = json_dumps(out, JSON_COMPACT);
	json_decref(out);
	dg_autodiff_free_refs(grads, 4);
	dg_graph_free(g);
	return text;
}

/* Median ms per step of steps steps (after 10 warm-up steps). */
static double ov_median(int io_threads, int steps, double *loss)
{
	struct worker_config wc = { .job = "bench", .task = 0, .address = "127.0.0.1:9",
				    .io_threads = io_threads };
	static const char *const keys[1] = { "fetch:loss" };
	struct worker_run_opts o = { .step = 1, .steps = 1, .collect = keys, .n_collect = 1 };
	struct worker_run_result res;
	struct dg_err err = { 0 };
	struct worker *w = worker_new(&wc, &err);
	char id[24];
	double *ms = malloc((size_t)steps * sizeof *ms);
	char *frag = ov_fragment("127.0.0.1:9");

	if (!w || !ms || worker_fragment_add(w, frag, strlen(frag), id, sizeof id, NULL, NULL, &err))
		die("overlap worker: %s", err.msg);
	for (int i = -10; i < steps; i++) {
		o.step++;
		o.train_step++;
		if (worker_run_steps(w, id, &o, &res, &err) != DG_OK)
			die("overlap step: %s", err.msg);
		if (i >= 0)
			ms[i] = res.r[0].ms;
		*loss = res.r[0].values[0];
		worker_run_result_deinit(&res);
	}
	double m = bench_median(ms, steps);
	free(ms);
	free(frag);
	worker_free(w);
	return m;
}

static void case_overlap(void)
{
	int steps = O.quick ? 50 : 400;
	double loss[2], m[2];

	for (int rep = 0; rep < 2; rep++) {     /* alternate, so drift hits both sides */
		/* Both sides start from the same weights: equal losses at the end say
		 * the pool changed nothing but the time. */
		ov_put_vars();
		m[0] = ov_median(0, steps, &loss[0]);
		ov_put_vars();
		m[1] = ov_median(-1, steps, &loss[1]);
		printf("MLP training step (pull 4 vars 784x256/256/256x10/10, fwd+bwd batch 64, "
		       "4 sgd applies; ps = task 1, run in-process, median of %d steps):\n"
		       "    I/O pool %.3f ms  no pool (DG_WORKER_IO_THREADS=0) %.3f ms  "
		       "speed-up %.2fx  (loss %.4f / %.4f)\n", steps, m[0], m[1], m[1] / m[0],
		       loss[0], loss[1]);
	}
}

/* ------------------------------------------------------------------------ main */

static void usage(void)
{
	fprintf(stderr,
		"usage: bench_graph [--quick] [--strict] [--dg PATH] [--seed GRAPH.json]\n"
		"                   [--runs N] [--steps N] [--jobs N] [--task-cpus A,B]\n"
		"                   [--client-cpu C] [--overlap | --steps-only]\n"
		"  --quick         a smoke run of a few seconds (fewer runs, steps and jobs)\n"
		"  --strict        exit 4 when a target is missed\n"
		"  --runs N        processes of each kind for the seed latency (default 21)\n"
		"  --steps N       steps per job of the per-step case (default 2000)\n"
		"  --jobs N        jobs per side of the step and 64 MiB cases (default 3)\n"
		"  --task-cpus A,B pin task 0 to cpu A and task 1 to cpu B (default 0,1; -1: no)\n"
		"  --client-cpu C  pin the bench and the processes it runs (default 0; -1: no)\n"
		"  --steps-only    run only the per-step case (for A/B runs and profiles)\n"
		"  --overlap       only case 4: a training step's ps requests on the worker's I/O\n"
		"                  pool against one after the other\n");
	exit(1);
}

static int int_arg(int argc, char **argv, int *i, int lo, int hi)
{
	char *end;
	long v;

	if (*i + 1 >= argc)
		usage();
	v = strtol(argv[++*i], &end, 10);
	if (*end || v < lo || v > hi)
		usage();
	return (int)v;
}

int main(int argc, char **argv)
{
	static char exe[PATH_MAX], dg[PATH_MAX + 16], seed[PATH_MAX + 32];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	struct dg_err err = { 0 };
	char *slash, home[PATH_MAX + 16];

	O = (struct opts){ .runs = 21, .steps = 2000, .jobs = 3, .big_steps = 5,
			   .task_cpu = { 0, ncpu > 1 ? 1 : 0 }, .client_cpu = 0,
			   .dg_path = "dg", .seed_path = "examples/seed_sum.json" };
	if (n > 0) {
		exe[n] = 0;
		if ((slash = strrchr(exe, '/')))
			*slash = 0;             /* BUILD/bench */
		snprintf(dg, sizeof dg, "%s/../cli/dg", exe);
		O.dg_path = dg;
		snprintf(seed, sizeof seed, "%s/../../examples/seed_sum.json", exe);
		if (access(seed, R_OK) == 0)
			O.seed_path = seed;
	}
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick")) {
			O.quick = true;
			O.runs = 5;
			O.steps = 300;
			O.jobs = 1;
			O.big_steps = 3;
		} else if (!strcmp(argv[i], "--strict")) {
			O.strict = true;
		} else if (!strcmp(argv[i], "--overlap")) {
			O.overlap = true;
		} else if (!strcmp(argv[i], "--steps-only")) {
			O.steps_only = true;
		} else if (!strcmp(argv[i], "--dg") && i + 1 < argc) {
			O.dg_path = argv[++i];
		} else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
			O.seed_path = argv[++i];
		} else if (!strcmp(argv[i], "--runs")) {
			O.runs = int_arg(argc, argv, &i, 1, MAX_RUNS);
		} else if (!strcmp(argv[i], "--steps")) {
			O.steps = int_arg(argc, argv, &i, 1, 2048);
		} else if (!strcmp(argv[i], "--jobs")) {
			O.jobs = int_arg(argc, argv, &i, 1, 64);
		} else if (!strcmp(argv[i], "--client-cpu")) {
			O.client_cpu = int_arg(argc, argv, &i, -1, 1023);
		} else if (!strcmp(argv[i], "--task-cpus") && i + 1 < argc) {
			if (sscanf(argv[++i], "%d,%d", &O.task_cpu[0], &O.task_cpu[1]) != 2)
				usage();
		} else {
			usage();
		}
	}
	if (access(O.dg_path, X_OK) != 0) {
		fprintf(stderr, "bench_graph: no dg binary at %s (--dg PATH)\n", O.dg_path);
		return 2;
	}
	if (access(O.seed_path, R_OK) != 0) {
		fprintf(stderr, "bench_graph: cannot read %s (--seed FILE)\n", O.seed_path);
		return 2;
	}
	snprintf(tmpdir, sizeof tmpdir, "/tmp/bench_graph.XXXXXX");
	if (!mkdtemp(tmpdir)) {
		fprintf(stderr, "bench_graph: mkdtemp: %s\n", strerror(errno));
		return 2;
	}
	/* Nothing of the user's: no `dg up` pointer is read or written. */
	snprintf(home, sizeof home, "%s/home", tmpdir);
	mkdir(home, 0700);
	setenv("HOME", home, 1);
	setenv("XDG_RUNTIME_DIR", home, 1);
	unsetenv("DG_CLUSTER");
	snprintf(spec_path, sizeof spec_path, "%s/cluster.json", tmpdir);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGPIPE, SIG_IGN);
	pin_cpu(O.client_cpu);
	start_cluster();
	printf("bench_graph: dg %s, 2-task cluster worker/0 %s (cpu %d), worker/1 %s (cpu %d); "
	       "bench and its processes on cpu %d%s\n", O.dg_path, addr[0], O.task_cpu[0], addr[1],
	       O.task_cpu[1], O.client_cpu, O.quick ? "; --quick" : "");
	fflush(stdout);
	master = dg_http_client_new(addr[0], NULL, 0, &err);
	if (!master)
		die("client for %s: %s", addr[0], err.msg);
	if (O.overlap) {
		case_overlap();
	} else if (O.steps_only) {
		case_steps();
	} else {
		case_seed();
		fflush(stdout);
		case_steps();
		fflush(stdout);
		case_big();
	}
	dg_http_client_free(master);
	cleanup();
	return O.strict && missed ? 4 : 0;
}
