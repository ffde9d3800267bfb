/* bench_ps: the parameter server's HTTP API against baselines measured in the same
 * run. dg side: a child process `dg server` (memory only) and the typed client
 * (dg_var_get/put/apply, one kept-alive connection per client). Baselines: a plain
 * loopback TCP server (child process, 1 MiB writes, the same request/response
 * exchanges) and, when python3-torch is installed, bench/ps_torch.py (a PyTorch
 * parameter server over torch.distributed.rpc), their runs interleaved with dg's.
 * Also: sgd applies against a server with --durability strict, both on a data dir.
 * Prints medians, ratios and CPU time per operation (bench/README.md has figures). */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "dg/buf.h"
#include "dg/client.h"
#include "dg/tensor.h"

#define N_SIZES 3
static const size_t sizes[N_SIZES] = { 4u << 10, 4u << 20, 64u << 20 };   /* bytes */
static const char *const size_names[N_SIZES] = { "4KiB", "4MiB", "64MiB" };
static const char *const var_names[N_SIZES] = { "bench/v4KiB", "bench/v4MiB", "bench/v64MiB" };
#define SGD_VAR "bench/w"
#define SGD_NUMEL 1024                  /* a 4 KiB float32 weight and gradient */
#define SGD_BYTES (SGD_NUMEL * 4)
/* 2^-10: w starts at 0 and every apply subtracts lr * 1 exactly, so after k applies
 * every element is exactly -k * 2^-10 (for k < 2^24): lost or doubled applies show. */
#define SGD_LR (1.0 / 1024)
#define CHUNK (1u << 20)                /* the socket baseline's write size */
#define MAX_CLIENTS 64

struct opts {
	bool quick;
	bool verbose;                   /* print every run's rate */
	bool strict;                    /* exit 4 when a must-show target is missed */
	int runs;                       /* timed runs per case; the median is printed */
	double target_s;                /* seconds per run (at least min_iters calls) */
	int server_cpu, client_cpu;     /* -1: no pinning */
	int clients[2];                 /* concurrent clients of the sgd cases: 1 and 8 */
	const char *dg_path;            /* the dg binary */
	const char *torch_script;       /* bench/ps_torch.py */
	const char *data_dir;           /* --data-dir for the dg server; NULL = memory */
	bool no_torch;
	const char *only;               /* run only the cases whose label starts with this */
};

static struct opts O;
static int failures;                    /* verification failures: exit status 3 */

/* ----------------------------------------------------------------- small helpers */

/* Pin the calling thread (and the threads and children it creates afterwards). */
static void pin_cpu(int cpu, const char *who)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof set, &set) != 0) {
		fprintf(stderr, "bench_ps: cannot pin the %s to cpu %d: %s\n", who, cpu,
			strerror(errno));
		exit(2);
	}
}

/* The values a variable of n floats starts with (GET checks them) and the values
 * the PUT case writes: both exact in float32 for n <= 2^24. */
static float pattern_at(size_t i)
{
	return (float)i * 0.5f;
}

static float value_at(size_t i)
{
	return -(float)i * 0.25f;
}

static struct dg_tensor *new_vec(size_t nbytes, float (*at)(size_t))
{
	struct dg_err err = { 0 };
	int64_t n = (int64_t)(nbytes / 4);
	struct dg_shape s = dg_shape_make(1, &n);
	struct dg_tensor *t = dg_tensor_new_uninit(DG_F32, &s, &err);
	float *p;

	if (!t) {
		fprintf(stderr, "bench_ps: %s\n", err.msg);
		exit(2);
	}
	p = t->data;
	for (size_t i = 0; i < (size_t)n; i++)
		p[i] = at ? at(i) : 1.0f;
	return t;
}

/* ------------------------------------------------------ plain socket I/O helpers */

static int write_all(int fd, const void *p, size_t n, size_t chunk)
{
	const char *c = p;

	while (n > 0) {
		ssize_t k = send(fd, c, n < chunk ? n : chunk, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n)
{
	char *c = p;

	while (n > 0) {
		ssize_t k = recv(fd, c, n, 0);

		if (k < 0 && errno == EINTR)
			continue;
		if (k == 0)
			errno = 0;              /* the peer closed: sock_fail says so */
		if (k <= 0)
			return -1;
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

static void set_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A listening socket on 127.0.0.1 and a free port; *port gets the port. */
static int listen_loopback(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
		close(fd);
		return -1;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

/* ------------------------------------------- socket baseline: the server process */

/* The exchange of the socket baseline: a 16-byte request, then
 *   GET n:    the server writes the n bytes of its variable of that size (1 MiB writes)
 *   PUT n:    the client writes n bytes (1 MiB writes), the server reads them into the
 *             variable and acks with 8 bytes (a version)
 *   SGD n:    the client writes a 4 KiB gradient with the request (one writev), the
 *             server applies w -= lr*g under a mutex and acks with the new version
 *   READ_W:   the server writes the version and the 4 KiB weight (for verification)
 * The bytes on the wire are the bytes of the dg exchanges minus HTTP's headers. */
enum { SOP_GET = 1, SOP_PUT = 2, SOP_SGD = 3, SOP_READ_W = 4 };
struct sock_req {
	uint32_t op;
	uint32_t pad;
	uint64_t n;                     /* bytes */
};

static struct {
	float *var[N_SIZES];            /* one variable per size, like dg's three */
	float w[SGD_NUMEL];
	uint64_t w_version;
	uint64_t put_version;
	pthread_mutex_t mu;             /* guards w and the versions */
} S = { .mu = PTHREAD_MUTEX_INITIALIZER };

static int size_index(uint64_t n)
{
	for (int k = 0; k < N_SIZES; k++)
		if (n == sizes[k])
			return k;
	return -1;
}

static int sock_serve_one(int fd, const struct sock_req *q, float *g)
{
	int k = size_index(q->n);
	uint64_t ack[1 + SGD_NUMEL / 2];

	switch (q->op) {
	case SOP_GET:
		return k < 0 ? -1 : write_all(fd, S.var[k], sizes[k], CHUNK);
	case SOP_PUT:
		if (k < 0 || read_all(fd, S.var[k], sizes[k]) != 0)
			return -1;
		pthread_mutex_lock(&S.mu);
		ack[0] = ++S.put_version;
		pthread_mutex_unlock(&S.mu);
		return write_all(fd, ack, 8, CHUNK);
	case SOP_SGD:
		if (q->n != SGD_BYTES || read_all(fd, g, SGD_BYTES) != 0)
			return -1;
		pthread_mutex_lock(&S.mu);
		for (int i = 0; i < SGD_NUMEL; i++)
			S.w[i] -= (float)SGD_LR * g[i];
		ack[0] = ++S.w_version;
		pthread_mutex_unlock(&S.mu);
		return write_all(fd, ack, 8, CHUNK);
	case SOP_READ_W:
		pthread_mutex_lock(&S.mu);
		ack[0] = S.w_version;
		memcpy(ack + 1, S.w, SGD_BYTES);
		pthread_mutex_unlock(&S.mu);
		return write_all(fd, ack, sizeof ack, CHUNK);
	default:
		return -1;
	}
}

/* One thread per connection (as libmicrohttpd runs dg's server): serve requests
 * until the client closes or sends something malformed. */
static void *sock_conn_main(void *arg)
{
	int fd = (int)(intptr_t)arg;
	float g[SGD_NUMEL];
	struct sock_req q;

	set_nodelay(fd);
	while (read_all(fd, &q, sizeof q) == 0 && sock_serve_one(fd, &q, g) == 0)
		;
	close(fd);
	return NULL;
}

/* The socket server process: never returns. */
static void sock_server_main(int lfd)
{
	prctl(PR_SET_NAME, "sock-server");      /* tells the sides apart in perf and top */
	pin_cpu(O.server_cpu, "socket server");
	for (int k = 0; k < N_SIZES; k++) {
		S.var[k] = malloc(sizes[k]);
		if (!S.var[k])
			_exit(2);
		for (size_t i = 0; i < sizes[k] / 4; i++)
			S.var[k][i] = pattern_at(i);
	}
	for (;;) {
		pthread_t th;
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			_exit(2);
		}
		if (pthread_create(&th, NULL, sock_conn_main, (void *)(intptr_t)fd) != 0) {
			close(fd);
			continue;
		}
		pthread_detach(th);
	}
}

/* ------------------------------------------------------ the two server processes */

struct servers {
	pid_t sock_pid, dg_pid;
	int sock_port, dg_port;
	char dir[64];                   /* temp dir: cluster.json, port, server.log */
	char dg_addr[32];
};

static pid_t start_sock_server(int *port)
{
	int lfd = listen_loopback(port);
	pid_t pid;

	if (lfd < 0) {
		fprintf(stderr, "bench_ps: socket baseline cannot listen on 127.0.0.1: %s\n",
			strerror(errno));
		exit(2);
	}
	pid = fork();
	if (pid == 0)
		sock_server_main(lfd);
	close(lfd);
	if (pid < 0) {
		fprintf(stderr, "bench_ps: fork: %s\n", strerror(errno));
		exit(2);
	}
	return pid;
}

/* exec `dg server --cluster DIR/cluster.json --job ps --task 0 --port-file DIR/port`,
 * pinned, its output in DIR/server.log. Port 0 in the spec: the server picks a
 * free port and writes it to DIR/port once it serves. */
static void spawn_dg(struct servers *sv, const char *data_dir, const char *durability)
{
	char cluster[128], logp[128], portp[128];
	FILE *f;

	snprintf(cluster, sizeof cluster, "%s/cluster.json", sv->dir);
	snprintf(logp, sizeof logp, "%s/server.log", sv->dir);
	snprintf(portp, sizeof portp, "%s/port", sv->dir);
	f = fopen(cluster, "w");
	if (!f || fprintf(f, "{\"ps\": [\"127.0.0.1:0\"]}\n") < 0 || fclose(f) != 0) {
		fprintf(stderr, "bench_ps: cannot write %s\n", cluster);
		exit(2);
	}
	sv->dg_pid = fork();
	if (sv->dg_pid == 0) {
		int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		const char *argv[16] = { O.dg_path, "server", "--cluster", cluster, "--job", "ps",
					 "--task", "0", "--port-file", portp };
		int n = 10;

		pin_cpu(O.server_cpu, "dg server");
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		if (data_dir) {
			argv[n++] = "--data-dir";
			argv[n++] = data_dir;
		}
		if (durability) {
			argv[n++] = "--durability";
			argv[n++] = durability;
		}
		argv[n] = NULL;
		execv(O.dg_path, (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", O.dg_path, strerror(errno));
		_exit(127);
	}
	if (sv->dg_pid < 0) {
		fprintf(stderr, "bench_ps: fork: %s\n", strerror(errno));
		exit(2);
	}
}

/* The port the server wrote to DIR/port, or 0 while the file is not there. */
static int read_port_file(const struct servers *sv)
{
	char p[128];
	int port = 0;
	FILE *f;

	snprintf(p, sizeof p, "%s/port", sv->dir);
	f = fopen(p, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%d", &port) != 1 || port <= 0 || port > 65535)
		port = 0;
	fclose(f);
	return port;
}

/* Wait until the dg server wrote its port and answers /v1/health (up to 30 s). */
static void wait_dg_ready(struct servers *sv)
{
	struct dg_err err = { 0 };
	struct dg_client *c = NULL;
	char logp[128];
	double t0 = bench_now_s();
	int status;

	snprintf(logp, sizeof logp, "%s/server.log", sv->dir);
	snprintf(err.msg, sizeof err.msg, "no port in %s/port", sv->dir);
	while (bench_now_s() - t0 < 30) {
		json_t *h = NULL;

		if (!c && (sv->dg_port = read_port_file(sv)) > 0) {
			snprintf(sv->dg_addr, sizeof sv->dg_addr, "127.0.0.1:%d", sv->dg_port);
			c = dg_client_new(sv->dg_addr, NULL, &err);
			if (!c)
				break;
		}
		if (c && dg_client_health(c, &h, &err) == DG_OK) {
			json_decref(h);
			dg_client_free(c);
			return;
		}
		if (waitpid(sv->dg_pid, &status, WNOHANG) == sv->dg_pid) {
			fprintf(stderr, "bench_ps: `%s server` exited (status %d); its log:\n",
				O.dg_path, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
			bench_dump_file(logp);
			exit(2);
		}
		usleep(20000);
	}
	fprintf(stderr, "bench_ps: dg server not ready after 30 s: %s\n", err.msg);
	dg_client_free(c);
	bench_dump_file(logp);
	exit(2);
}

/* Stop both servers and remove the temp dir; safe to call again. */
static void stop_servers(struct servers *sv)
{
	char p[128];

	bench_stop_child(sv->dg_pid, 5000);
	bench_stop_child(sv->sock_pid, 5000);
	sv->dg_pid = sv->sock_pid = 0;
	if (!sv->dir[0])
		return;
	snprintf(p, sizeof p, "%s/cluster.json", sv->dir);
	unlink(p);
	snprintf(p, sizeof p, "%s/server.log", sv->dir);
	unlink(p);
	snprintf(p, sizeof p, "%s/port", sv->dir);
	unlink(p);
	rmdir(sv->dir);
	sv->dir[0] = 0;
}

/* ------------------------------------------------------- the two client backends */

/* One client connection of either kind; each thread has its own. */
struct conn {
	struct dg_client *dg;
	int fd;
	void *scratch;                  /* socket GET target when not checking */
};

struct backend {
	const char *name;
	int (*open)(struct conn *c);
	void (*close)(struct conn *c);
	/* GET variable k; check != NULL receives the bytes. */
	int (*get)(struct conn *c, int k, void *check);
	int (*put)(struct conn *c, int k, const struct dg_tensor *v);
	int (*sgd)(struct conn *c, const struct dg_tensor *grad);
	/* The sgd weight and its version. */
	int (*read_w)(struct conn *c, float *w, uint64_t *version);
};

static struct servers SV;
static struct servers *DG = &SV;        /* the dg server the dg backend talks to */

static int dg_fail(const char *what, const struct dg_err *err)
{
	fprintf(stderr, "bench_ps: dg %s failed: %s%s%s\n", what, err->msg,
		err->hint[0] ? "; hint: " : "", err->hint);
	return -1;
}

static int dg_open(struct conn *c)
{
	struct dg_err err = { 0 };

	c->dg = dg_client_new(DG->dg_addr, NULL, &err);
	return c->dg ? 0 : dg_fail("client", &err);
}

static void dg_close(struct conn *c)
{
	dg_client_free(c->dg);
	c->dg = NULL;
}

static int dg_get(struct conn *c, int k, void *check)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	int rc = 0;

	if (dg_var_get(c->dg, var_names[k], &t, NULL, &err) != DG_OK)
		return dg_fail("get", &err);
	if (t->nbytes != sizes[k]) {
		fprintf(stderr, "bench_ps: dg get %s: %zu bytes, expected %zu\n", var_names[k],
			t->nbytes, sizes[k]);
		rc = -1;
	} else if (check) {
		memcpy(check, t->data, t->nbytes);
	}
	dg_tensor_free(t);
	return rc;
}

static int dg_put(struct conn *c, int k, const struct dg_tensor *v)
{
	struct dg_err err = { 0 };

	/* A plain PUT of the same dtype and shape (the variable exists: dg_setup). */
	if (dg_var_put(c->dg, var_names[k], v, NULL, NULL, &err) != DG_OK)
		return dg_fail("put", &err);
	return 0;
}

static int dg_sgd(struct conn *c, const struct dg_tensor *grad)
{
	struct dg_err err = { 0 };
	struct dg_apply a = { .rule = "sgd", .lr = SGD_LR, .step = -1, .replica = -1 };
	struct dg_apply_result res = { 0 };

	if (dg_var_apply(c->dg, SGD_VAR, &a, grad, &res, &err) != DG_OK)
		return dg_fail("apply sgd", &err);
	if (!res.applied) {
		fprintf(stderr, "bench_ps: dg apply sgd: not applied (async apply expected)\n");
		return -1;
	}
	return 0;
}

static int dg_read_w(struct conn *c, float *w, uint64_t *version)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = NULL;
	struct dg_var_info info;
	int rc = 0;

	if (dg_var_get(c->dg, SGD_VAR, &t, &info, &err) != DG_OK)
		return dg_fail("get " SGD_VAR, &err);
	if (t->nbytes != SGD_BYTES)
		rc = -1;
	else
		memcpy(w, t->data, SGD_BYTES);
	*version = info.version;
	dg_tensor_free(t);
	return rc;
}

static int sock_open(struct conn *c)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)SV.sock_port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0) {
		fprintf(stderr, "bench_ps: connect to the socket baseline: %s\n", strerror(errno));
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
		return -1;
	}
	set_nodelay(c->fd);
	return 0;
}

static void sock_close(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	free(c->scratch);
	c->scratch = NULL;
}

static int sock_fail(const char *what)
{
	fprintf(stderr, "bench_ps: socket baseline %s failed: %s\n", what,
		errno ? strerror(errno) : "connection closed");
	return -1;
}

/* GET reads into one preallocated buffer per connection: the ideal case the
 * baseline stands for (dg's client allocates the tensor it returns). */
static int sock_get(struct conn *c, int k, void *check)
{
	struct sock_req q = { .op = SOP_GET, .n = sizes[k] };

	if (!check && !c->scratch) {
		c->scratch = malloc(sizes[N_SIZES - 1]);
		if (!c->scratch)
			return sock_fail("malloc");
		memset(c->scratch, 0, sizes[N_SIZES - 1]);
	}
	if (write_all(c->fd, &q, sizeof q, CHUNK) != 0 ||
	    read_all(c->fd, check ? check : c->scratch, sizes[k]) != 0)
		return sock_fail("get");
	return 0;
}

static int sock_put(struct conn *c, int k, const struct dg_tensor *v)
{
	struct sock_req q = { .op = SOP_PUT, .n = sizes[k] };
	uint64_t ack;

	if (write_all(c->fd, &q, sizeof q, CHUNK) != 0 ||
	    write_all(c->fd, v->data, sizes[k], CHUNK) != 0 || read_all(c->fd, &ack, 8) != 0)
		return sock_fail("put");
	return 0;
}

static int sock_sgd(struct conn *c, const struct dg_tensor *grad)
{
	struct sock_req q = { .op = SOP_SGD, .n = SGD_BYTES };
	struct iovec iov[2] = { { &q, sizeof q }, { grad->data, SGD_BYTES } };
	uint64_t ack;
	ssize_t k = writev(c->fd, iov, 2);

	/* 4 KiB + 16 bytes always fit the socket buffer of an idle connection; a short
	 * write would mean the connection is broken. */
	if (k != (ssize_t)(sizeof q + SGD_BYTES) || read_all(c->fd, &ack, 8) != 0)
		return sock_fail("sgd");
	return 0;
}

static int sock_read_w(struct conn *c, float *w, uint64_t *version)
{
	struct sock_req q = { .op = SOP_READ_W, .n = SGD_BYTES };

	if (write_all(c->fd, &q, sizeof q, CHUNK) != 0 || read_all(c->fd, version, 8) != 0 ||
	    read_all(c->fd, w, SGD_BYTES) != 0)
		return sock_fail("read weight");
	return 0;
}

static const struct backend dg_backend = {
	"dg", dg_open, dg_close, dg_get, dg_put, dg_sgd, dg_read_w,
};
static const struct backend sock_backend = {
	"socket", sock_open, sock_close, sock_get, sock_put, sock_sgd, sock_read_w,
};

/* ---------------------------------------------------------------- torch baseline */

/* A group of bench/ps_torch.py: one ps and n client processes, driven by commands
 * to the leading client (its stdin/stdout are our pipes), so each torch run sits
 * between a dg run and a socket run of the same case. */
static struct {
	pid_t pid;                      /* the launcher; -1: no group */
	int n_clients;
	FILE *in, *out;                 /* commands to, answers from the leader */
	const char *python;             /* NULL: the torch-rpc column is skipped */
	char version[32];
	char why[256];                  /* why the column is skipped */
} T = { .pid = -1 };

/* The first python3 that imports torch.distributed.rpc: $DG_PYTHON, python3 on
 * PATH, /usr/bin/python3 (a pyenv or venv python3 on PATH does not see Debian's
 * python3-torch). Fills T.python and T.version, or T.why. */
static void torch_find(void)
{
	static char py[256];
	const char *cands[3] = { getenv("DG_PYTHON"), "python3", "/usr/bin/python3" };
	char cmd[512];

	if (O.no_torch) {
		snprintf(T.why, sizeof T.why, "--no-torch");
		return;
	}
	if (access(O.torch_script, R_OK) != 0) {
		snprintf(T.why, sizeof T.why, "%s not found (--torch-script)", O.torch_script);
		return;
	}
	for (int i = 0; i < 3 && !T.python; i++) {
		FILE *p;

		T.version[0] = 0;
		if (!cands[i] || !cands[i][0] || strchr(cands[i], '\''))
			continue;
		snprintf(cmd, sizeof cmd, "'%s' -c 'import torch, torch.distributed.rpc; "
			 "print(torch.__version__)' 2>/dev/null", cands[i]);
		p = popen(cmd, "r");
		if (p && fgets(T.version, sizeof T.version, p)) {
			T.version[strcspn(T.version, "\n")] = 0;
			snprintf(py, sizeof py, "%s", cands[i]);
		}
		if (p && pclose(p) == 0 && T.version[0])
			T.python = py;
	}
	if (!T.python)
		snprintf(T.why, sizeof T.why,
			 "python3-torch not installed (apt-get install -y python3-torch)");
}

static void torch_stop(void)
{
	int status;

	if (T.pid < 0)
		return;
	fprintf(T.in, "quit\n");
	fclose(T.in);
	fclose(T.out);
	waitpid(T.pid, &status, 0);
	T.pid = -1;
}

/* Start a group of n clients unless one is running (stopping a group of another size). */
static bool torch_group(int n)
{
	int to[2], from[2];
	char ns[16], ts[32], sc[16], cc[16];

	if (T.pid >= 0 && T.n_clients == n)
		return true;
	torch_stop();
	if (!T.python || pipe2(to, O_CLOEXEC) != 0)
		return false;
	if (pipe2(from, O_CLOEXEC) != 0) {
		close(to[0]);
		close(to[1]);
		return false;
	}
	snprintf(ns, sizeof ns, "%d", n);
	snprintf(ts, sizeof ts, "%g", O.target_s);
	snprintf(sc, sizeof sc, "%d", O.server_cpu);
	snprintf(cc, sizeof cc, "%d", O.client_cpu);
	fflush(stdout);
	T.pid = fork();
	if (T.pid == 0) {
		dup2(to[0], 0);
		dup2(from[1], 1);
		execlp(T.python, T.python, O.torch_script, "--serve", ns, "--target-s", ts,
		       "--server-cpu", sc, "--client-cpu", cc, (char *)NULL);
		_exit(127);
	}
	close(to[0]);
	close(from[1]);
	T.in = fdopen(to[1], "w");
	T.out = fdopen(from[0], "r");
	if (T.pid < 0 || !T.in || !T.out) {
		snprintf(T.why, sizeof T.why, "cannot start %s", O.torch_script);
		T.python = NULL;
		return false;
	}
	T.n_clients = n;
	return true;
}

/* Send one command to a group of n clients and read the answer line into ans.
 * A group that fails or stays silent for 10 minutes is dropped: the column
 * becomes "skipped" and the reason is printed. */
static bool torch_ask(int n, const char *cmd, char *ans, size_t cap)
{
	struct pollfd pfd;

	if (!torch_group(n))
		return false;
	fprintf(T.in, "%s\n", cmd);
	fflush(T.in);
	pfd = (struct pollfd){ .fd = fileno(T.out), .events = POLLIN };
	if (poll(&pfd, 1, 600 * 1000) == 1 && fgets(ans, (int)cap, T.out)) {
		ans[strcspn(ans, "\n")] = 0;
		return true;
	}
	printf("torch-rpc: no answer to '%s'; column skipped from here on\n", cmd);
	kill(T.pid, SIGTERM);
	torch_stop();
	T.python = NULL;
	snprintf(T.why, sizeof T.why, "the torch-rpc group failed (see above)");
	return false;
}

/* One timed torch run: ops/s, or -1 when there is no torch. */
static double torch_rate(int n, const char *cmd)
{
	char ans[256], *end;
	double v;

	if (!torch_ask(n, cmd, ans, sizeof ans))
		return -1;
	v = strtod(ans, &end);
	if (end == ans || v <= 0) {
		printf("WARNING: torch-rpc %s answered '%s'\n", cmd, ans);
		failures++;
		return -1;
	}
	return v;
}

/* A torch check command: "ok" or a WARNING. */
static void torch_check(int n, const char *cmd)
{
	char ans[256];

	if (torch_ask(n, cmd, ans, sizeof ans) && strcmp(ans, "ok") != 0) {
		printf("WARNING: torch-rpc %s: %s\n", cmd, ans);
		failures++;
	}
}

/* ------------------------------------------------------------------- measuring */

static struct dg_tensor *pattern[N_SIZES], *value[N_SIZES], *grad, *zeros_w;

enum op { OP_GET, OP_PUT };

/* One timed run: calls the op until min_iters calls and target_s seconds passed.
 * Returns calls per second (*n: the calls), or -1 after printing the failure. */
static double timed_run(const struct backend *b, struct conn *c, enum op op, int k,
			int min_iters, long *calls)
{
	double t0 = bench_now_s(), el;
	int n = 0;

	for (;;) {
		int rc = op == OP_GET ? b->get(c, k, NULL) : b->put(c, k, value[k]);

		if (rc != 0)
			return -1;
		n++;
		el = bench_now_s() - t0;
		if (n >= min_iters && el >= O.target_s) {
			*calls = n;
			return n / el;
		}
	}
}

/* Compare n floats with the expected function; count and print a mismatch. */
static void verify(const char *who, const char *what, const float *got, size_t n,
		   float (*at)(size_t))
{
	for (size_t i = 0; i < n; i++) {
		if (got[i] != at(i)) {
			printf("WARNING: %s %s: element %zu is %g, expected %g\n", who, what, i,
			       (double)got[i], (double)at(i));
			failures++;
			return;
		}
	}
}

/* Each side's median (ops/s) of one case, the torch-rpc one (-1: none), and the
 * CPU time per operation of each side's client and server (seconds; index 0 dg,
 * 1 socket), summed over the timed runs: unlike rates, CPU time per operation
 * hardly moves when other processes share the machine. */
struct result {
	double dg, sock, torch;
	double cpu_client[2], cpu_server[2];
};

/* CPU seconds of every thread, dead ones included, of this process (client) and
 * of the backend's server process (clock_getcpuclockid). */
struct meter {
	double client, server;
};

static double cpu_clock_s(clockid_t id)
{
	struct timespec ts;

	if (clock_gettime(id, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct meter meter_now(const struct backend *b)
{
	struct meter m = { cpu_clock_s(CLOCK_PROCESS_CPUTIME_ID), 0 };
	pid_t pid = b == &dg_backend ? DG->dg_pid : SV.sock_pid;
	clockid_t id;

	if (clock_getcpuclockid(pid, &id) == 0)
		m.server = cpu_clock_s(id);
	return m;
}

/* Add the CPU time since m0 per operation to the side's totals in r. */
static void meter_add(struct result *r, int side, const struct backend *b, struct meter m0,
		      long ops)
{
	struct meter m1 = meter_now(b);

	r->cpu_client[side] += (m1.client - m0.client) / (double)ops;
	r->cpu_server[side] += (m1.server - m0.server) / (double)ops;
}

/* --verbose: every run's rate of each side. */
static void print_runs(const char *opn, const char *what, double rates[3][64])
{
	static const char *const side[3] = { "dg", "socket", "torch-rpc" };

	if (!O.verbose)
		return;
	for (int s = 0; s < 3; s++) {
		printf("  %s %s %s runs:", side[s], opn, what);
		for (int i = 0; i < O.runs; i++)
			printf(" %.4g", rates[s][i]);
		printf(" op/s\n");
	}
}

/* The GET or PUT case of size k: dg, socket and torch-rpc runs interleaved, then a
 * check that the last GET returned the stored values (or that the PUT stored them). */
static struct result transfer_case(struct conn *cd, struct conn *cs, enum op op, int k)
{
	const struct backend *bs[2] = { &dg_backend, &sock_backend };
	struct conn *cs2[2] = { cd, cs };
	const char *opn = op == OP_GET ? "get" : "put";
	double rates[3][64];
	int min_iters = k == N_SIZES - 1 ? 3 : 10;
	float *check = malloc(sizes[k]);
	struct result r = { .torch = -1 };
	char cmd[64];

	if (!check)
		exit(2);
	for (int s = 0; s < 2; s++)             /* warm-up: connection, heap, page cache */
		for (int i = 0; i < 2; i++)
			if ((op == OP_GET ? bs[s]->get(cs2[s], k, NULL) :
			     bs[s]->put(cs2[s], k, value[k])) != 0)
				exit(2);
	snprintf(cmd, sizeof cmd, "%s %zu", opn, sizes[k]);
	for (int i = 0; i < O.runs; i++) {
		for (int s = 0; s < 2; s++) {
			struct meter m0 = meter_now(bs[s]);
			long calls = 0;

			if ((rates[s][i] = timed_run(bs[s], cs2[s], op, k, min_iters, &calls)) < 0)
				exit(2);
			meter_add(&r, s, bs[s], m0, calls * O.runs);
		}
		rates[2][i] = torch_rate(1, cmd);
	}
	for (int s = 0; s < 2; s++) {
		if (bs[s]->get(cs2[s], k, check) != 0)
			exit(2);
		verify(bs[s]->name, op == OP_GET ? "get" : "get after put", check, sizes[k] / 4,
		       op == OP_GET ? pattern_at : value_at);
	}
	if (rates[2][O.runs - 1] > 0) {
		snprintf(cmd, sizeof cmd, "check %s %zu", opn, sizes[k]);
		torch_check(1, cmd);
		r.torch = bench_median(rates[2], O.runs);
	}
	print_runs(opn, size_names[k], rates);
	free(check);
	r.dg = bench_median(rates[0], O.runs);
	r.sock = bench_median(rates[1], O.runs);
	return r;
}

struct sgd_worker {
	const struct backend *b;
	struct conn c;
	pthread_barrier_t *start;
	atomic_int *stop;
	long count;                     /* applies acknowledged in the timed window */
	int rc;
};

static void *sgd_worker_main(void *arg)
{
	struct sgd_worker *w = arg;

	pthread_setname_np(pthread_self(), w->b == &dg_backend ? "client-dg" : "client-socket");
	pthread_barrier_wait(w->start);
	while (!atomic_load_explicit(w->stop, memory_order_relaxed)) {
		if (w->b->sgd(&w->c, grad) != 0) {
			w->rc = -1;
			break;
		}
		w->count++;
	}
	return NULL;
}

/* One run of n concurrent clients applying sgd for target_s: each client has its
 * own connection (opened and warmed up with one apply before the clock starts) and
 * thread. Returns the total applies per second; *applies counts every apply sent,
 * warm-ups included, for the final check of the weight. */
static double sgd_run(const struct backend *b, int n, long *applies, struct result *r, int side)
{
	struct sgd_worker w[MAX_CLIENTS];
	pthread_t th[MAX_CLIENTS];
	pthread_barrier_t start;
	atomic_int stop = 0;
	struct meter m0;
	double t0, el;
	long total = 0;
	int bad = 0;

	pthread_barrier_init(&start, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++) {
		w[i] = (struct sgd_worker){ .b = b, .start = &start, .stop = &stop, .c.fd = -1 };
		if (b->open(&w[i].c) != 0 || b->sgd(&w[i].c, grad) != 0)
			exit(2);
		(*applies)++;
	}
	for (int i = 0; i < n; i++)
		if (pthread_create(&th[i], NULL, sgd_worker_main, &w[i]) != 0)
			exit(2);
	m0 = meter_now(b);
	pthread_barrier_wait(&start);
	t0 = bench_now_s();
	usleep((useconds_t)(O.target_s * 1e6));
	atomic_store(&stop, 1);
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		total += w[i].count;
		bad |= w[i].rc;
	}
	el = bench_now_s() - t0;
	meter_add(r, side, b, m0, total * O.runs);
	for (int i = 0; i < n; i++)
		b->close(&w[i].c);
	pthread_barrier_destroy(&start);
	if (bad)
		exit(2);
	*applies += total;
	return total / el;
}

/* The weight after `applies` sgd applies of a gradient of ones from zero; its
 * version moved by exactly `applies` from v0 (nothing else changes meanwhile). */
static void verify_w(const struct backend *b, long applies, uint64_t v0)
{
	struct conn c = { .fd = -1 };
	float w[SGD_NUMEL];
	uint64_t version = 0;
	float expect = (float)(-(double)applies * SGD_LR);

	if (b->open(&c) != 0 || b->read_w(&c, w, &version) != 0)
		exit(2);
	b->close(&c);
	if (version != v0 + (uint64_t)applies) {
		printf("WARNING: %s sgd: version %llu after %ld applies from %llu\n", b->name,
		       (unsigned long long)version, applies, (unsigned long long)v0);
		failures++;
	}
	for (int i = 0; i < SGD_NUMEL; i++) {
		if (w[i] != expect) {
			printf("WARNING: %s sgd: w[%d] = %.9g after %ld applies, expected %.9g\n",
			       b->name, i, (double)w[i], applies, (double)expect);
			failures++;
			return;
		}
	}
}

/* ------------------------------------------------------------------- reporting */

/* "2.10 GB/s" for the large transfers, "12.3k/s" (operations) otherwise. */
static const char *fmt_rate(char *buf, size_t n, double ops, size_t bytes)
{
	if (ops < 0)
		snprintf(buf, n, "-");
	else if (bytes >= (1u << 20))
		snprintf(buf, n, "%.2f GB/s", ops * (double)bytes / 1e9);
	else
		snprintf(buf, n, "%.1fk/s", ops / 1e3);
	return buf;
}

/* "12.3 us" or "4.56 ms". */
static const char *fmt_time(char *buf, size_t n, double s)
{
	if (s < 1e-3)
		snprintf(buf, n, "%.1f us", s * 1e6);
	else
		snprintf(buf, n, "%.2f ms", s * 1e3);
	return buf;
}

static void print_line(const char *label, size_t bytes, const struct result *r)
{
	char a[32], b[32], c[32], d[32];

	printf("%s: dg %s  socket %s  ratio %.2f | ", label, fmt_rate(a, sizeof a, r->dg, bytes),
	       fmt_rate(b, sizeof b, r->sock, bytes), r->dg / r->sock);
	if (r->torch > 0)
		printf("torch-rpc %s  ratio %.2f\n", fmt_rate(c, sizeof c, r->torch, bytes),
		       r->dg / r->torch);
	else
		printf("torch-rpc skipped\n");
	printf("    cpu per op: dg client %s server %s | socket client %s server %s\n",
	       fmt_time(a, sizeof a, r->cpu_client[0]), fmt_time(b, sizeof b, r->cpu_server[0]),
	       fmt_time(c, sizeof c, r->cpu_client[1]), fmt_time(d, sizeof d, r->cpu_server[1]));
	fflush(stdout);
}

static int target(const char *what, double got, double need)
{
	bool ok = got >= need;

	if (got < 0)
		printf("  %-44s  n/a (no baseline)\n", what);
	else
		printf("  %-44s  %.2f  %s\n", what, got, ok ? "ok" : "MISSED");
	return got >= 0 && !ok;
}

/* ----------------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: bench_ps [--quick] [--server-cpu N] [--client-cpu M] [--runs R]\n"
		"                [--seconds S] [--dg PATH] [--torch-script PATH] [--no-torch]\n"
		"                [--data-dir DIR] [--only CASE] [--verbose] [--strict]\n"
		"GET/PUT of 4 KiB, 4 MiB, 64 MiB float32 variables and 4 KiB sgd applies from 1\n"
		"and 8 clients: dg vs a plain loopback socket and a PyTorch rpc parameter server;\n"
		"a row-wise sgd of 64 rows of a [1000000, 64] table vs a dense sgd of it;\n"
		"sgd from 8 clients with --durability strict vs snapshot, data dirs under\n"
		"--data-dir (default /var/tmp).\n"
		"Default placement: server on cpu 0, clients on cpu 1 (-1: no pinning).\n"
		"--only 'get 64MiB' (or 'sgd', 'put', 'durability', 'rows'...): only the cases whose label\n"
		"starts so.\n"
		"Exit: 0, 2 setup failed, 3 a result was wrong, 4 --strict and a target missed.\n");
}

/* The build tree's dg: bench_ps lives in BUILD/bench/, dg in BUILD/cli/. The
 * script: BUILD/../bench/ps_torch.py (a build dir in the source tree), else
 * $DG_SOURCE_DIR/bench/ps_torch.py, else ./bench/ps_torch.py. */
static void default_paths(void)
{
	static char exe[PATH_MAX], dg[PATH_MAX + 16], script[PATH_MAX + 32];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	char *slash;

	if (n > 0) {
		exe[n] = 0;
		if ((slash = strrchr(exe, '/')))
			*slash = 0;             /* BUILD/bench */
		snprintf(dg, sizeof dg, "%s/../cli/dg", exe);
		O.dg_path = dg;
		snprintf(script, sizeof script, "%s/../../bench/ps_torch.py", exe);
		O.torch_script = script;
	}
	if (!O.torch_script || access(O.torch_script, R_OK) != 0) {
		const char *src = getenv("DG_SOURCE_DIR");

		if (src) {
			snprintf(script, sizeof script, "%s/bench/ps_torch.py", src);
			O.torch_script = script;
		} else {
			O.torch_script = "bench/ps_torch.py";
		}
	}
	if (!O.dg_path)
		O.dg_path = "dg";
}

static int int_arg(int argc, char **argv, int *i)
{
	char *end;
	long v;

	if (*i + 1 >= argc) {
		fprintf(stderr, "bench_ps: %s needs a value\n", argv[*i]);
		exit(1);
	}
	v = strtol(argv[++*i], &end, 10);
	if (*end || v < -1 || v > 1000) {
		fprintf(stderr, "bench_ps: %s: not a number in -1..1000: %s\n", argv[*i - 1],
			argv[*i]);
		exit(1);
	}
	return (int)v;
}

static const char *str_arg(int argc, char **argv, int *i)
{
	if (*i + 1 >= argc) {
		fprintf(stderr, "bench_ps: %s needs a value\n", argv[*i]);
		exit(1);
	}
	return argv[++*i];
}

static void parse_args(int argc, char **argv)
{
	O = (struct opts){ .server_cpu = 0, .client_cpu = 1, .clients = { 1, 8 } };
	default_paths();
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--quick"))
			O.quick = true;
		else if (!strcmp(a, "--verbose"))
			O.verbose = true;
		else if (!strcmp(a, "--strict"))
			O.strict = true;
		else if (!strcmp(a, "--no-torch"))
			O.no_torch = true;
		else if (!strcmp(a, "--server-cpu"))
			O.server_cpu = int_arg(argc, argv, &i);
		else if (!strcmp(a, "--client-cpu"))
			O.client_cpu = int_arg(argc, argv, &i);
		else if (!strcmp(a, "--runs"))
			O.runs = int_arg(argc, argv, &i);
		else if (!strcmp(a, "--seconds"))
			O.target_s = atof(str_arg(argc, argv, &i));
		else if (!strcmp(a, "--dg"))
			O.dg_path = str_arg(argc, argv, &i);
		else if (!strcmp(a, "--torch-script"))
			O.torch_script = str_arg(argc, argv, &i);
		else if (!strcmp(a, "--only"))
			O.only = str_arg(argc, argv, &i);
		else if (!strcmp(a, "--data-dir"))
			O.data_dir = str_arg(argc, argv, &i);
		else if (!strcmp(a, "--help") || !strcmp(a, "-h"))
			usage(stdout), exit(0);
		else
			usage(stderr), exit(1);
	}
	if (O.runs <= 0)
		O.runs = O.quick ? 3 : 7;
	if (O.runs > 64)
		O.runs = 64;
	if (!(O.target_s > 0 && O.target_s <= 60))
		O.target_s = O.quick ? 0.05 : 0.2;
}

/* Create the dg variables (PUT with ?replace). */
static void dg_setup(struct conn *c)
{
	struct dg_err err = { 0 };
	struct dg_put_opts po = { .replace = true };

	for (int k = 0; k < N_SIZES; k++) {
		if (dg_var_put(c->dg, var_names[k], pattern[k], &po, NULL, &err) != DG_OK) {
			dg_fail("create variable", &err);
			exit(2);
		}
	}
	if (dg_var_put(c->dg, SGD_VAR, zeros_w, &po, NULL, &err) != DG_OK) {
		dg_fail("create " SGD_VAR, &err);
		exit(2);
	}
}

static void make_tensors(void)
{
	for (int k = 0; k < N_SIZES; k++) {
		pattern[k] = new_vec(sizes[k], pattern_at);
		value[k] = new_vec(sizes[k], value_at);
	}
	grad = new_vec(SGD_BYTES, NULL);
	zeros_w = new_vec(SGD_BYTES, NULL);
	memset(zeros_w->data, 0, SGD_BYTES);
}

static void free_tensors(void)
{
	for (int k = 0; k < N_SIZES; k++) {
		dg_tensor_free(pattern[k]);
		dg_tensor_free(value[k]);
	}
	dg_tensor_free(grad);
	dg_tensor_free(zeros_w);
}

/* --only PREFIX: run the cases whose label starts with PREFIX ("get 64MiB", "sgd"). */
static bool wanted(const char *label)
{
	return !O.only || !strncmp(label, O.only, strlen(O.only));
}

/* a / b, or -1 when either side is missing. */
static double ratio(double a, double b)
{
	return a > 0 && b > 0 ? a / b : -1;
}

/* GET and PUT of each size over one kept-alive connection per side. */
static void run_transfers(struct conn *cd, struct conn *cs, struct result *get64)
{
	for (int k = 0; k < N_SIZES; k++) {
		for (int op = OP_GET; op <= OP_PUT; op++) {
			char label[32];
			struct result r;

			snprintf(label, sizeof label, "%s %s", op == OP_GET ? "get" : "put",
				 size_names[k]);
			if (!wanted(label))
				continue;
			r = transfer_case(cd, cs, (enum op)op, k);
			print_line(label, sizes[k], &r);
			if (op == OP_GET && k == N_SIZES - 1)
				*get64 = r;
		}
	}
}

/* sgd applies from 1 and 8 concurrent clients, then the check of the weight. */
static void run_sgd(struct conn *cd, struct conn *cs, struct result sgd[2])
{
	const struct backend *bs[2] = { &dg_backend, &sock_backend };
	struct conn *c[2] = { cd, cs };
	long applies[2] = { 0, 0 };
	uint64_t v0[2] = { 0, 0 };

	/* dg's versions are store-wide: the PUTs before moved them, so the weight's own
	 * version jumps on its next change. Count from the version of a first apply. */
	for (int s = 0; s < 2; s++) {
		if (bs[s]->sgd(c[s], grad) != 0 || bs[s]->read_w(c[s], (float[SGD_NUMEL]){ 0 },
								  &v0[s]) != 0)
			exit(2);
		v0[s]--;
		applies[s] = 1;
	}
	for (int j = 0; j < 2; j++) {
		double rates[3][64];
		char label[32], what[16];

		snprintf(label, sizeof label, "sgd 4KiB x%d", O.clients[j]);
		if (!wanted(label))
			continue;
		sgd[j] = (struct result){ .torch = -1 };
		for (int i = 0; i < O.runs; i++) {
			for (int s = 0; s < 2; s++)
				rates[s][i] = sgd_run(bs[s], O.clients[j], &applies[s], &sgd[j], s);
			/* --quick leaves out the 9-process torch group (~10 s to start). */
			rates[2][i] = O.quick && j > 0 ? -1 : torch_rate(O.clients[j], "sgd");
		}
		if (rates[2][O.runs - 1] > 0) {
			torch_check(O.clients[j], "checkw");
			sgd[j].torch = bench_median(rates[2], O.runs);
		}
		snprintf(what, sizeof what, "4KiB x%d", O.clients[j]);
		print_runs("sgd", what, rates);
		sgd[j].dg = bench_median(rates[0], O.runs);
		sgd[j].sock = bench_median(rates[1], O.runs);
		print_line(label, SGD_BYTES, &sgd[j]);
	}
	for (int s = 0; s < 2; s++)
		verify_w(bs[s], applies[s], v0[s]);
}

/* ------------------------------------------------------------ queue batches */

/* A training batch of the MLP: 64 examples of 784 float32 (200704 bytes). The
 * same bytes come from the same dg server as a variable GET and as a
 * QueueDequeueMany, plain and leased (dequeue with a lease, then its ack:
 * what a queue-fed training step does), each run over QBATCHES batches that
 * an untimed enqueue put there first. */
#define QVAR "bench/batch"
#define QNAME "bench/q"
#define QBATCH 64
#define QFEAT 784
#define QBATCHES 400

static int queue_setup(struct conn *c, struct dg_tensor **batch)
{
	struct dg_queue_spec spec = { .capacity = QBATCH * QBATCHES, .n_components = 1 };
	struct dg_put_opts po = { .replace = true };
	struct dg_shape sh = { .ndim = 2, .dim = { QBATCH, QFEAT } };
	struct dg_err err = { 0 };

	spec.dtype[0] = DG_F32;
	spec.shape[0] = (struct dg_shape){ .ndim = 1, .dim = { QFEAT } };
	if (!(*batch = dg_tensor_new(DG_F32, &sh, &err)))
		return dg_fail("allocate a batch", &err);
	for (int64_t i = 0; i < (*batch)->numel; i++)
		((float *)(*batch)->data)[i] = pattern_at((size_t)i);
	dg_queue_delete(c->dg, QNAME, &err);
	dg_err_clear(&err);
	if (dg_var_put(c->dg, QVAR, *batch, &po, NULL, &err) != DG_OK ||
	    dg_queue_create(c->dg, QNAME, &spec, &err) != DG_OK)
		return dg_fail("set up the queue case", &err);
	return 0;
}

/* One timed run: QBATCHES GETs (what 0), plain dequeues (1) or leased dequeues
 * and their acks (2); batches per second, or -1. */
static double queue_run(struct conn *c, const struct dg_tensor *batch, int what)
{
	const struct dg_tensor *const comps[1] = { batch };
	struct dg_queue_lease lease = { .lease_ms = 60000, .holder = "bench" };
	struct dg_err err = { 0 };
	double t0;

	for (int i = 0; what > 0 && i < QBATCHES; i++)
		if (dg_queue_enqueue(c->dg, QNAME, QBATCH, comps, 1, 10000, &err) != DG_OK)
			return dg_fail("enqueue", &err), -1;
	t0 = bench_now_s();
	for (int i = 0; i < QBATCHES; i++) {
		struct dg_tensor *t = NULL;
		int64_t got, n;
		uint64_t id = 0;
		enum dg_status st = what == 0 ? dg_var_get(c->dg, QVAR, &t, NULL, &err) :
				    dg_queue_dequeue_lease(c->dg, QNAME, QBATCH, 10000, false,
							   what == 2 ? &lease : NULL, &t, 1, &got,
							   &id, &err);
		if (st == DG_OK && what == 2)
			st = dg_queue_lease_end(c->dg, QNAME, id, DG_LEASE_ACK, &n, &err);
		if (st == DG_OK && t->nbytes != batch->nbytes)
			st = dg_err_set(&err, DG_EINTERNAL, "%zu bytes, not %zu", t->nbytes,
					batch->nbytes);
		dg_tensor_free(t);
		if (st != DG_OK)
			return dg_fail(what == 0 ? "get" : "dequeue", &err), -1;
	}
	return QBATCHES / (bench_now_s() - t0);
}

/* GET against dequeue of the same 64 x 784 float32 batch, runs alternating. */
static void run_queue(struct conn *cd, struct result *qr)
{
	double rates[3][64];
	struct dg_tensor *batch = NULL;

	if (!wanted("queue 64x784") || queue_setup(cd, &batch) != 0) {
		dg_tensor_free(batch);
		return;
	}
	for (int i = 0; i < O.runs && i < 64; i++)
		for (int w = 0; w < 3; w++)
			rates[w][i] = queue_run(cd, batch, w);
	dg_tensor_free(batch);
	for (int w = 0; w < 3; w++)
		for (int i = 0; i < O.runs; i++)
			if (rates[w][i] < 0)
				return;
	qr->sock = bench_median(rates[0], O.runs);      /* the GET: the baseline */
	qr->dg = bench_median(rates[1], O.runs);
	qr->torch = bench_median(rates[2], O.runs);     /* leased + ack */
	printf("%-16s %9.0f batches/s dequeue, %9.0f GET of the same bytes: %.2fx; leased "
	       "dequeue + ack %9.0f/s: %.2fx (%d x 200704 B a run, median of %d)\n",
	       "queue 64x784", qr->dg, qr->sock, qr->dg / qr->sock, qr->torch,
	       qr->torch / qr->sock, QBATCHES, O.runs);
	fflush(stdout);
}

/* ------------------------------------------------------------- row-wise apply */

#define ROWS_N 1000000
#define ROWS_D 64
#define ROWS_K 64

/* sgd of ROWS_K random rows of a [ROWS_N, ROWS_D] float32 table against a dense
 * sgd of the whole table (256 MB), both over HTTP on the same dg server:
 * applies per second of each, the ratio in rr->dg (rows) / rr->sock (dense). */
static void run_rows(struct conn *cd, struct result *rr)
{
	struct dg_shape ts = dg_shape_make(2, (int64_t[]){ ROWS_N, ROWS_D });
	struct dg_shape gs = dg_shape_make(2, (int64_t[]){ ROWS_K, ROWS_D });
	struct dg_tensor *t = NULL, *g = NULL;
	struct dg_apply dense = { .rule = "sgd", .lr = SGD_LR, .step = -1, .replica = -1 };
	struct dg_apply rows = dense;
	struct dg_err err = { 0 };
	double rate[2][64];
	int64_t idx[ROWS_K];
	uint64_t seed = 7;

	if (!wanted("rows 64 of 1Mx64"))
		return;
	t = dg_tensor_new(DG_F32, &ts, &err);
	g = dg_tensor_new(DG_F32, &gs, &err);
	if (!t || !g || dg_var_put(cd->dg, "bench/emb", t, NULL, NULL, &err) != DG_OK) {
		dg_fail("put bench/emb", &err);
		goto out;
	}
	for (size_t i = 0; i < (size_t)g->numel; i++)
		((float *)g->data)[i] = 1.0f;
	rows.rows = idx;
	rows.n_rows = ROWS_K;
	for (int r = 0; r < O.runs && r < 64; r++) {
		for (int k = 0; k < 2; k++) {
			const struct dg_tensor *upd = k ? g : t;
			double t0 = bench_now_s(), t1;
			int n = 0;
			do {
				for (int i = 0; i < ROWS_K; i++) {
					seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
					idx[i] = (int64_t)((seed >> 33) % ROWS_N);
				}
				if (dg_var_apply(cd->dg, "bench/emb", k ? &rows : &dense, upd, NULL,
						 &err) != DG_OK) {
					dg_fail("apply bench/emb", &err);
					goto out;
				}
				n++;
				t1 = bench_now_s();
			} while (t1 - t0 < O.target_s / (k ? 1 : 4) || n < (k ? 50 : 2));
			rate[k][r] = n / (t1 - t0);
		}
	}
	rr->sock = bench_median(rate[0], O.runs);
	rr->dg = bench_median(rate[1], O.runs);
	printf("%-16s %9.1f row-wise sgd/s (64 rows), %9.2f dense sgd/s of the 256 MB table: "
	       "%.0fx (median of %d)\n", "rows 64 of 1Mx64", rr->dg, rr->sock, rr->dg / rr->sock,
	       O.runs);
	fflush(stdout);
out:
	dg_var_delete(cd->dg, "bench/emb", 0, NULL);
	dg_tensor_free(t);
	dg_tensor_free(g);
}

/* ----------------------------------------------------------- durability strict */

static size_t to_buf(char *p, size_t size, size_t n, void *ud)
{
	return dg_buf_append(ud, p, size * n, NULL) == DG_OK ? size * n : 0;
}

/* One counter of a dg server's /v1/metrics (a family without labels); -1 when
 * it cannot be read. The typed client has no call for the text format. */
static double dg_metric(const struct servers *sv, const char *family)
{
	char url[96], key[96];
	struct dg_buf b = { 0 };
	double v = -1;
	CURL *h = curl_easy_init();

	snprintf(url, sizeof url, "http://%s/v1/metrics", sv->dg_addr);
	snprintf(key, sizeof key, "\n%s ", family);
	if (h && curl_easy_setopt(h, CURLOPT_URL, url) == CURLE_OK &&
	    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, to_buf) == CURLE_OK &&
	    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b) == CURLE_OK &&
	    curl_easy_perform(h) == CURLE_OK && b.data) {
		const char *p = strstr(b.data, key);
		if (p)
			v = strtod(p + strlen(key), NULL);
	}
	if (h)
		curl_easy_cleanup(h);
	dg_buf_deinit(&b);
	return v;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

/* sgd applies of 8 clients on two dg servers whose data dirs are on the same
 * disk (under --data-dir, else /var/tmp): one with the default durability
 * (snapshot), one with --durability strict; runs alternate. The ratio is what
 * logging and fsyncing every acknowledged apply costs. */
static void run_durability(struct result *dr)
{
	static const char *const mode[2] = { "snapshot", "strict" };
	struct servers ds[2] = { 0 };
	char data[2][96];
	const char *base = O.data_dir ? O.data_dir : "/var/tmp";
	double rates[2][64], fsyncs[2] = { 0, 0 };
	long applies[2] = { 0, 0 };
	uint64_t v0[2] = { 0, 0 };
	int n = O.clients[1];

	if (!wanted("durability"))
		return;
	for (int k = 0; k < 2; k++) {
		struct conn c = { .fd = -1 };
		struct dg_err err = { 0 };
		struct dg_put_opts po = { .replace = true };

		snprintf(ds[k].dir, sizeof ds[k].dir, "/tmp/bench_ps.%s.XXXXXX", mode[k]);
		snprintf(data[k], sizeof data[k], "%s/bench_ps.data.XXXXXX", base);
		if (!mkdtemp(ds[k].dir) || !mkdtemp(data[k])) {
			fprintf(stderr, "bench_ps: mkdtemp under /tmp and %s: %s\n", base,
				strerror(errno));
			exit(2);
		}
		spawn_dg(&ds[k], data[k], mode[k]);
		wait_dg_ready(&ds[k]);
		DG = &ds[k];
		if (dg_open(&c) != 0)
			exit(2);
		if (dg_var_put(c.dg, SGD_VAR, zeros_w, &po, NULL, &err) != DG_OK) {
			dg_fail("create " SGD_VAR, &err);
			exit(2);
		}
		/* versions are store-wide: count from the version of a first apply */
		if (dg_sgd(&c, grad) != 0 || dg_read_w(&c, (float[SGD_NUMEL]){ 0 }, &v0[k]) != 0)
			exit(2);
		v0[k]--;
		applies[k] = 1;
		dg_close(&c);
	}
	for (int i = 0; i < O.runs && i < 64; i++) {
		for (int k = 0; k < 2; k++) {
			struct result scratch = { 0 };
			double f0 = dg_metric(&ds[k], "dg_ps_wal_fsyncs_total");
			long a0 = applies[k];

			DG = &ds[k];
			rates[k][i] = sgd_run(&dg_backend, n, &applies[k], &scratch, 0);
			fsyncs[k] += (dg_metric(&ds[k], "dg_ps_wal_fsyncs_total") - f0) /
				     (double)(applies[k] - a0);
		}
	}
	for (int k = 0; k < 2; k++) {
		DG = &ds[k];
		verify_w(&dg_backend, applies[k], v0[k]);
		stop_servers(&ds[k]);
		nftw(data[k], rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	}
	DG = &SV;
	dr->sock = bench_median(rates[0], O.runs);      /* snapshot: the baseline */
	dr->dg = bench_median(rates[1], O.runs);
	printf("%-16s strict %.1fk/s, snapshot %.1fk/s: %.2fx; %.2f fsyncs per strict apply "
	       "(group commit), data dirs under %s, median of %d\n", "durability 4KiB x8",
	       dr->dg / 1e3, dr->sock / 1e3, dr->dg / dr->sock, fsyncs[1] / O.runs, base, O.runs);
	fflush(stdout);
}

/* The must-show targets of the issue; returns how many were missed. */
static int print_targets(const struct result *get64, const struct result sgd[2],
			 const struct result *qr, const struct result *dr,
			 const struct result *rr)
{
	int missed = 0;

	printf("targets (median ratios):\n");
	missed += target("get 64MiB dg/socket >= 0.5", ratio(get64->dg, get64->sock), 0.5);
	missed += target("get 64MiB dg/torch-rpc >= 1.2", ratio(get64->dg, get64->torch), 1.2);
	missed += target("sgd 4KiB x1 dg/torch-rpc >= 5", ratio(sgd[0].dg, sgd[0].torch), 5);
	missed += target("sgd 4KiB dg x8/x1 > 1 (grows)", ratio(sgd[1].dg, sgd[0].dg), 1.0001);
	missed += target("queue 64x784 dequeue/GET >= 0.8", ratio(qr->dg, qr->sock), 0.8);
	missed += target("durability 4KiB x8 strict/snapshot >= 0.5", ratio(dr->dg, dr->sock),
			 0.5);
	missed += target("rows 64 of 1Mx64 row-wise/dense apply >= 20", ratio(rr->dg, rr->sock),
			 20);
	return missed;
}

static pid_t main_pid;

/* At exit, also after a fatal exit(2): no server or torch process outlives the bench
 * (an orphan would keep the output pipe open). Children never run it (_exit/exec). */
static void cleanup(void)
{
	if (getpid() != main_pid)
		return;
	torch_stop();
	stop_servers(&SV);
}

int main(int argc, char **argv)
{
	struct conn cd = { .fd = -1 }, cs = { .fd = -1 };
	struct result get64 = { -1, -1, -1, { 0 }, { 0 } };
	struct result sgd[2] = { { -1, -1, -1, { 0 }, { 0 } }, { -1, -1, -1, { 0 }, { 0 } } };
	struct result qr = { -1, -1, -1, { 0 }, { 0 } };
	struct result dr = { -1, -1, -1, { 0 }, { 0 } };
	struct result rr = { -1, -1, -1, { 0 }, { 0 } };
	int missed;

	parse_args(argc, argv);
	signal(SIGPIPE, SIG_IGN);
	printf("bench_ps: dg = `%s server` (child process, %s), typed client, one kept-alive "
	       "connection per client\n", O.dg_path, O.data_dir ? "--data-dir" : "memory only");
	printf("placement: server cpu %d, client cpu %d (sched_setaffinity, the same for dg, "
	       "socket and torch-rpc; -1 = not pinned)\n", O.server_cpu, O.client_cpu);
	printf("runs: median of %d runs of >= %.2f s per case\n", O.runs, O.target_s);
	fflush(stdout);
	torch_find();
	if (!T.python)
		printf("torch-rpc: skipped: %s\n", T.why);
	else
		printf("torch-rpc: %s %s, torch %s (TensorPipe over TCP; 1 ps + N client "
		       "processes; runs interleaved with dg's)\n", T.python, O.torch_script,
		       T.version);

	main_pid = getpid();
	atexit(cleanup);
	snprintf(SV.dir, sizeof SV.dir, "/tmp/bench_ps.XXXXXX");
	if (!mkdtemp(SV.dir)) {
		fprintf(stderr, "bench_ps: mkdtemp: %s\n", strerror(errno));
		SV.dir[0] = 0;
		return 2;
	}
	SV.sock_pid = start_sock_server(&SV.sock_port);
	spawn_dg(&SV, O.data_dir, NULL);
	pin_cpu(O.client_cpu, "client");
	wait_dg_ready(&SV);
	make_tensors();
	if (dg_open(&cd) != 0 || sock_open(&cs) != 0)
		exit(2);
	dg_setup(&cd);
	run_transfers(&cd, &cs, &get64);
	run_sgd(&cd, &cs, sgd);
	run_queue(&cd, &qr);
	run_rows(&cd, &rr);
	dg_close(&cd);
	sock_close(&cs);
	run_durability(&dr);
	cleanup();
	free_tensors();

	missed = print_targets(&get64, sgd, &qr, &dr, &rr);
	if (failures) {
		printf("%d verification failure(s): see the WARNING lines\n", failures);
		return 3;
	}
	return O.strict && missed ? 4 : 0;
}
