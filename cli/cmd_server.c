/* `dg server` and `dg ps`: run one task of a cluster. Parses the options,
 * finds this task's address in the cluster spec (--cluster, TF_CONFIG, or
 * where `dg up` left it), starts the parameter server (ps/server.h), prints
 * one ready line, and on SIGTERM/SIGINT stops cleanly (final checkpoint) and
 * exits 0. Signals are blocked before any thread starts and taken by sigwait. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "cli.h"
#include "dg/buf.h"
#include "dg/cluster.h"
#include "dg/executor.h"
#include "dg/gpu.h"
#include "dg/kernels.h"
#include "dg/log.h"
#include "dg/master.h"
#include "server.h"

#define MAX_GPUS 64             /* GPUs health lists (more than any machine has today) */

static const char usage_text[] =
	"usage: dg server --cluster CLUSTER.json --job NAME --task I [OPTIONS]\n"
	"       dg ps [--cluster CLUSTER.json] [--task I] [OPTIONS]   (--job ps)\n"
	"       dg worker [--cluster CLUSTER.json] [--task I] [OPTIONS]   (--job worker)\n"
	"\n"
	"Run task I of job NAME of a cluster. Every task serves both faces on its\n"
	"own address from the cluster spec (port 0 there picks a free port): a\n"
	"parameter server holding variables and queues (doc/http-api.md), and a\n"
	"worker that runs graph fragments (POST /v1/fragments, /v1/steps/...).\n"
	"Stops cleanly (checkpoint, exit 0) on SIGTERM or SIGINT; when that final\n"
	"snapshot fails (a full disk: exit 20), the exit status says so.\n"
	"\n"
	"  --cluster FILE         TensorFlow cluster spec {\"ps\": [\"host:port\"], ...};\n"
	"                         default: TF_CONFIG (cluster and task), else\n"
	"                         $DG_CLUSTER, else the spec `dg up` wrote\n"
	"  --job NAME             this task's job (default: TF_CONFIG's; fixed by dg ps\n"
	"                         and dg worker)\n"
	"  --task I               this task's index in the job (default: TF_CONFIG's, 0)\n"
	"  --data-dir DIR         keep variables in DIR (snapshot + write-ahead log);\n"
	"                         without it they live in memory only\n"
	"  --token-file F         refuse requests without 'Authorization: Bearer TOKEN'\n"
	"                         (TOKEN: F's first line)\n"
	"  --tls-cert F           serve HTTPS with the certificate (chain) in PEM file F\n"
	"  --tls-key F            ... and its private key (PEM, mode 0600); this task's\n"
	"                         own requests to the others then go over https too,\n"
	"                         verified against --ca (default: F of --tls-cert, for\n"
	"                         a cluster sharing one self-signed certificate)\n"
	"  --bind ADDR            listen on ADDR (0.0.0.0: every interface); default:\n"
	"                         the address of the spec's host (localhost: 127.0.0.1)\n"
	"  --checkpoint-secs N    snapshot applies at least every N s (default 5)\n"
	"  --durability MODE      what an acknowledged gradient apply survives:\n"
	"                         snapshot (default: the next snapshot, so a kill -9\n"
	"                         loses up to --checkpoint-secs of applies) or strict\n"
	"                         (logged and fsync'ed before the reply; needs --data-dir)\n"
	"  --max-body BYTES       largest request body, suffix K, M or G (default 2G)\n"
	"  --max-connections N    concurrent connections (default 256)\n"
	"  --max-connections-per-client N\n"
	"                         connections from one client address (default 128)\n"
	"  --rendezvous-max-mb N  MiB of step tensors a task holds for receivers\n"
	"                         (default: min(4096, memory/4); also $DG_RENDEZVOUS_MAX_MB)\n"
	"  --read-timeout S       time to send a request's headers, and a body's base\n"
	"                         time (+1 s per 64 KiB); a trickle cannot extend it\n"
	"                         (default 20)\n"
	"  --request-timeout S    idle time of a connection, seconds (default 300)\n"
	"  --port-file F          write the bound port to F once serving (atomic)\n"
	"  --soft-placement       run ops placed on a missing device (gpu) on the CPU\n"
	"  --fragment-lease-s N   as a master: the other tasks forget the fragments of\n"
	"                         its jobs N s after it stopped renewing them (it died);\n"
	"                         renewed every N/4 s (default 60)\n"
	"  --threads N            threads of each matrix product (OpenBLAS); default:\n"
	"                         OpenBLAS's own (OPENBLAS_NUM_THREADS, else every CPU)\n"
	"  -h, --help             show this help\n"
	"\n"
	"Prints one line when ready: 'dg: ps/0 serving on 127.0.0.1:2222 (epoch 3, ...)'.\n"
	"Exit status: 0 after a clean stop, 1 usage error, else the code of the\n"
	"error (doc/errors.md), e.g. 11 when the port is taken or DIR unusable.\n";

struct server_args {
	const char *cluster, *job, *data_dir, *token_file, *bind, *port_file;
	const char *tls_cert, *tls_key;
	int task;                       /* -1: not given */
	unsigned checkpoint_secs, max_connections, request_timeout_s, threads;
	unsigned read_timeout_s, per_client, lease_s;
	size_t max_body;
	uint64_t rendezvous_max_mb;     /* 0: the default */
	bool soft_placement;
	enum ps_durability durability;
};

enum {
	OPT_CLUSTER = 256, OPT_JOB, OPT_TASK, OPT_DATA_DIR, OPT_TOKEN_FILE, OPT_BIND,
	OPT_CHECKPOINT, OPT_MAX_BODY, OPT_MAX_CONN, OPT_REQ_TIMEOUT, OPT_PORT_FILE,
	OPT_SOFT_PLACEMENT, OPT_THREADS, OPT_RV_MAX_MB, OPT_READ_TIMEOUT, OPT_PER_CLIENT,
	OPT_DURABILITY, OPT_TLS_CERT, OPT_TLS_KEY, OPT_LEASE,
};

static const struct option long_opts[] = {
	{ "cluster", required_argument, NULL, OPT_CLUSTER },
	{ "job", required_argument, NULL, OPT_JOB },
	{ "task", required_argument, NULL, OPT_TASK },
	{ "data-dir", required_argument, NULL, OPT_DATA_DIR },
	{ "token-file", required_argument, NULL, OPT_TOKEN_FILE },
	{ "bind", required_argument, NULL, OPT_BIND },
	{ "checkpoint-secs", required_argument, NULL, OPT_CHECKPOINT },
	{ "durability", required_argument, NULL, OPT_DURABILITY },
	{ "tls-cert", required_argument, NULL, OPT_TLS_CERT },
	{ "fragment-lease-s", required_argument, NULL, OPT_LEASE },
	{ "tls-key", required_argument, NULL, OPT_TLS_KEY },
	{ "max-body", required_argument, NULL, OPT_MAX_BODY },
	{ "max-connections", required_argument, NULL, OPT_MAX_CONN },
	{ "request-timeout", required_argument, NULL, OPT_REQ_TIMEOUT },
	{ "read-timeout", required_argument, NULL, OPT_READ_TIMEOUT },
	{ "max-connections-per-client", required_argument, NULL, OPT_PER_CLIENT },
	{ "port-file", required_argument, NULL, OPT_PORT_FILE },
	{ "soft-placement", no_argument, NULL, OPT_SOFT_PLACEMENT },
	{ "threads", required_argument, NULL, OPT_THREADS },
	{ "rendezvous-max-mb", required_argument, NULL, OPT_RV_MAX_MB },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* A decimal count in lo..hi, with an optional K/M/G (binary) suffix when
 * sized. false when malformed or out of range. */
static bool parse_count(const char *s, bool sized, uint64_t lo, uint64_t hi, uint64_t *out)
{
	static const char suffixes[] = "KkMmGg";     /* pairs: 2^10, 2^20, 2^30 */
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	if (s[0] < '0' || s[0] > '9')
		return false;
	v = strtoull(s, &end, 10);
	if (sized && *end && !end[1]) {
		const char *sfx = strchr(suffixes, *end);
		shift = sfx ? 10u * (1u + (unsigned)(sfx - suffixes) / 2u) : 0;
		end += shift ? 1 : 0;
	}
	if (errno || *end || (shift && v > (hi >> shift)))
		return false;
	*out = (uint64_t)v << shift;
	return *out >= lo && *out <= hi;
}

/* optarg as a number for flag: -1 when fine, else a usage error's exit code. */
static int num_arg(const char *cmd, const char *flag, bool sized, uint64_t lo, uint64_t hi,
		   uint64_t *v)
{
	if (parse_count(optarg, sized, lo, hi, v))
		return -1;
	return cli_usage(cmd, "%s '%s' is not %s%" PRIu64 "..%" PRIu64, flag, optarg,
			 sized ? "a size (suffix K, M or G allowed) in " : "", lo, hi);
}

/* Returns -1 to go on, else the exit code (help printed or usage error). */
static int parse_args(int argc, char **argv, struct server_args *a)
{
	const char *cmd = argv[0];
	uint64_t v;
	int c, rc;

	optind = 0;      /* glibc: full re-initialisation, argv[0] is the command */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
		switch (c) {
		case OPT_CLUSTER: a->cluster = optarg; break;
		case OPT_JOB: a->job = optarg; break;
		case OPT_DATA_DIR: a->data_dir = optarg; break;
		case OPT_TOKEN_FILE: a->token_file = optarg; break;
		case OPT_BIND: a->bind = optarg; break;
		case OPT_TLS_CERT: a->tls_cert = optarg; break;
		case OPT_TLS_KEY: a->tls_key = optarg; break;
		case OPT_PORT_FILE: a->port_file = optarg; break;
		case OPT_SOFT_PLACEMENT: a->soft_placement = true; break;
		case OPT_TASK:
			if ((rc = num_arg(cmd, "--task", false, 0, 1000000, &v)) >= 0)
				return rc;
			a->task = (int)v;
			break;
		case OPT_DURABILITY: {
			struct dg_err e = { 0 };
			if (ps_durability_parse(optarg, &a->durability, &e) != DG_OK)
				return cli_usage(cmd, "--durability: %s (%s)", e.msg, e.hint);
			break;
		}
		case OPT_LEASE:
			if ((rc = num_arg(cmd, "--fragment-lease-s", false, 1, 86400, &v)) >= 0)
				return rc;
			a->lease_s = (unsigned)v;
			break;
		case OPT_CHECKPOINT:
			if ((rc = num_arg(cmd, "--checkpoint-secs", false, 1, 86400, &v)) >= 0)
				return rc;
			a->checkpoint_secs = (unsigned)v;
			break;
		case OPT_MAX_BODY:
			if ((rc = num_arg(cmd, "--max-body", true, 1, (uint64_t)1 << 46, &v)) >= 0)
				return rc;
			a->max_body = (size_t)v;
			break;
		case OPT_MAX_CONN:
			if ((rc = num_arg(cmd, "--max-connections", false, 1, 65536, &v)) >= 0)
				return rc;
			a->max_connections = (unsigned)v;
			break;
		case OPT_REQ_TIMEOUT:
			if ((rc = num_arg(cmd, "--request-timeout", false, 1, 86400, &v)) >= 0)
				return rc;
			a->request_timeout_s = (unsigned)v;
			break;
		case OPT_READ_TIMEOUT:
			if ((rc = num_arg(cmd, "--read-timeout", false, 1, 86400, &v)) >= 0)
				return rc;
			a->read_timeout_s = (unsigned)v;
			break;
		case OPT_PER_CLIENT:
			if ((rc = num_arg(cmd, "--max-connections-per-client", false, 1, 65536,
					  &v)) >= 0)
				return rc;
			a->per_client = (unsigned)v;
			break;
		case OPT_THREADS:
			if ((rc = num_arg(cmd, "--threads", false, 1, 1024, &v)) >= 0)
				return rc;
			a->threads = (unsigned)v;
			break;
		case OPT_RV_MAX_MB:
			if ((rc = num_arg(cmd, "--rendezvous-max-mb", false, 1, (uint64_t)1 << 30,
					  &v)) >= 0)
				return rc;
			a->rendezvous_max_mb = v;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		case ':':
			return cli_usage(cmd, "%s needs a value", argv[optind - 1]);
		default:
			return cli_usage(cmd, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return cli_usage(cmd, "unexpected argument '%s'", argv[optind]);
	if (!a->tls_cert != !a->tls_key)
		return cli_usage(cmd, "--tls-cert and --tls-key go together");
	if (a->durability == PS_DURABILITY_STRICT && !a->data_dir)
		return cli_usage(cmd, "--durability strict needs --data-dir DIR (a memory-only "
				 "server keeps nothing across a restart)");
	return -1;
}

/* The cluster, plus the task TF_CONFIG names (*tf_job owned, or NULL). */
static struct dg_cluster *load_cluster(const struct server_args *a, char **tf_job, int *tf_index,
				       struct dg_err *err)
{
	const char *tf = getenv("TF_CONFIG");
	struct dg_cluster *c;

	*tf_job = NULL;
	*tf_index = -1;
	if (a->cluster || !tf || !tf[0])
		return cli_cluster_load(a->cluster, err);
	if (!(c = dg_cluster_from_tf_config(tf, tf_job, tf_index, err)))
		dg_err_prefix(err, "TF_CONFIG");
	return c;
}

/* The address to listen on when --bind is absent: the spec host's own
 * address, numeric, IPv4 first (so "localhost" is 127.0.0.1). A loopback host
 * keeps the task private to this machine; a spec that names another host says
 * the task is reached there, so it listens on that address only; every
 * interface ("0.0.0.0", "::") only when the spec or --bind says so. */
static enum dg_status default_bind(const char *host, char *out, size_t n, struct dg_err *err)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL, *pick = NULL;
	int rc = getaddrinfo(host, NULL, &hints, &res);

	if (rc != 0) {
		dg_err_set(err, DG_EINVAL, "cannot resolve the host '%s' of this task: %s", host,
			   gai_strerror(rc));
		dg_err_hint(err, "fix the cluster spec, or give --bind ADDR");
		return DG_EINVAL;
	}
	for (struct addrinfo *p = res; p; p = p->ai_next) {
		if (!pick || (p->ai_family == AF_INET && pick->ai_family != AF_INET))
			pick = p;
	}
	rc = pick ? getnameinfo(pick->ai_addr, pick->ai_addrlen, out, (socklen_t)n, NULL, 0,
				NI_NUMERICHOST) : EAI_NONAME;
	freeaddrinfo(res);
	if (rc != 0) {
		dg_err_set(err, DG_EINVAL, "no address for the host '%s' of this task", host);
		dg_err_hint(err, "give --bind ADDR");
		return DG_EINVAL;
	}
	return DG_OK;
}

/* Everything the server needs from the cluster spec: job, index, bind, port,
 * the host others reach it at, and the spec itself (owned, for the worker). */
struct task_place {
	char job[128];
	int index;
	char bind[256];
	char host[256];
	int port;
	struct dg_cluster *cluster;
};

static enum dg_status find_task(const struct server_args *a, bool is_ps, struct task_place *t,
				struct dg_err *err)
{
	struct dg_cluster *c;
	const struct dg_task_addr *ta;
	char *tf_job = NULL, *host = t->host;
	int tf_index;
	enum dg_status st = DG_OK;

	if (!(c = load_cluster(a, &tf_job, &tf_index, err)))
		return err->code;
	snprintf(t->job, sizeof t->job, "%s",
		 a->job ? a->job : tf_job ? tf_job : is_ps ? "ps" : "");
	t->index = a->task >= 0 ? a->task : tf_index >= 0 ? tf_index : 0;
	if (!t->job[0]) {
		st = dg_err_set(err, DG_EINVAL, "which task is this? no --job and no task in "
				"TF_CONFIG");
		dg_err_hint(err, "e.g. dg server --cluster c.json --job ps --task 0");
	} else if (!(ta = dg_cluster_task(c, t->job, t->index, err))) {
		st = err->code;
	} else if ((st = dg_split_host_port(ta->address, host, sizeof t->host, &t->port, err)) ==
		   DG_OK) {
		if (a->bind)
			snprintf(t->bind, sizeof t->bind, "%s", a->bind);
		else
			st = default_bind(host, t->bind, sizeof t->bind, err);
	}
	free(tf_job);
	if (st == DG_OK)
		t->cluster = c;
	else
		dg_cluster_free(c);
	return st;
}

static enum dg_status write_port_file(const char *path, int port, struct dg_err *err)
{
	char buf[16];
	int n = snprintf(buf, sizeof buf, "%d\n", port);

	return dg_write_file_atomic(path, buf, (size_t)n, err);
}

/* Stop in order: running jobs and steps first (so that no handler sits in a
 * wait), then the HTTP server and the store, then the master and worker state. */
/* Stop every face; 0, or the exit code of a failed final snapshot (said on
 * stderr: a supervisor or script must not take the stop for a clean one). */
static int stop_all(struct ps_server *s, struct master *ms, struct worker *wk)
{
	struct dg_err err = { 0 };

	master_cancel_all(ms);
	worker_stop(wk);
	enum dg_status st = ps_server_stop_final(s, &err);
	master_free(ms);
	worker_free(wk);
	if (st == DG_OK)
		return 0;
	dg_err_prefix(&err, "stopping: final snapshot");
	return cli_fail(&err);
}

/* What this process computes on, for the ps face's health and metrics (ps/
 * links no kernels). gpus has room for n_max; a GPU whose properties cannot be
 * read is left out (d->gpu still names the cause). */
static void describe_devices(struct ps_devices *d, struct ps_gpu *gpus, int n_max)
{
	int n = dg_gpu_count();

	*d = (struct ps_devices){ .blas = dg_blas_describe(), .gpu = dg_gpu_describe(),
				  .cuda_built = dg_gpu_built(), .gpus = gpus };
	for (int i = 0; i < n && d->n_gpus < n_max; i++) {
		struct dg_gpu_info g;
		struct dg_err e = { 0 };
		struct ps_gpu *o = &gpus[d->n_gpus];

		if (dg_gpu_get_info(i, &g, &e) != DG_OK)
			continue;
		*o = (struct ps_gpu){ .index = g.index, .mem_bytes = g.mem_bytes,
				      .cc_major = g.cc_major, .cc_minor = g.cc_minor };
		snprintf(o->name, sizeof o->name, "%s", g.name);
		d->n_gpus++;
	}
}

/* Start, announce, wait for a stop signal, stop. Returns the exit code. */
static int serve(const struct server_args *a, const struct task_place *t, const char *token,
		 const char *cert, const char *key,
		 const sigset_t *stop_set)
{
	struct worker_config wc = {
		.cluster = t->cluster, .job = t->job, .task = t->index, .token = token,
		.soft_placement = a->soft_placement, .rendezvous_max_bytes = a->rendezvous_max_mb << 20,
	};
	if (a->threads)
		dg_blas_set_threads((int)a->threads);
	struct ps_server_config cfg = {
		.job = t->job, .task = t->index, .bind = t->bind, .port = t->port,
		.data_dir = a->data_dir, .token = token, .checkpoint_secs = a->checkpoint_secs,
		.durability = a->durability, .tls_cert_pem = cert, .tls_key_pem = key,
		.max_body = a->max_body, .max_connections = a->max_connections,
		.request_timeout_s = a->request_timeout_s, .read_timeout_s = a->read_timeout_s,
		.max_connections_per_client = a->per_client,
	};
	struct master_config mc = {
		.cluster = t->cluster, .job = t->job, .task = t->index, .token = token,
		.soft_placement = a->soft_placement, .fragment_lease_ms = (int64_t)a->lease_s * 1000,
	};
	struct dg_err err = { 0 };
	struct worker *wk = worker_new(&wc, &err);
	struct master *ms = NULL;
	struct ps_server *s = NULL;
	struct dg_route_group groups[2];
	struct ps_gpu gpus[MAX_GPUS];
	struct ps_devices devices;
	int64_t n_vars = 0, bytes = 0;
	int sig = 0, port;
	char self[300];

	if (!wk)
		return cli_fail(&err);
	if (!(ms = master_new(&mc, wk, &err))) {
		worker_free(wk);
		return cli_fail(&err);
	}
	groups[0] = *worker_route_group(wk);
	groups[1] = *master_route_group(ms);
	cfg.extra_groups = groups;
	cfg.n_extra_groups = 2;
	cfg.extra_metrics = worker_metrics;
	cfg.extra_metrics_ud = wk;
	describe_devices(&devices, gpus, MAX_GPUS);
	cfg.devices = &devices;
	if (!(s = ps_server_start(&cfg, &err))) {
		master_free(ms);
		worker_free(wk);
		return cli_fail(&err);
	}
	port = ps_server_port(s);
	snprintf(self, sizeof self, "%s%s%s:%d", strchr(t->host, ':') ? "[" : "", t->host,
		 strchr(t->host, ':') ? "]" : "", port);
	worker_set_address(wk, self);
	/* A spec's port 0 picks a free port: this task's own entry (which the
	 * master places on and sends ps addresses from) becomes the bound address,
	 * so a one-task cluster on port 0 (Python's create_local_server) can
	 * address itself. Before the port is announced, so before any job. */
	if (t->port == 0 &&
	    dg_cluster_set_address(t->cluster, t->job, t->index, self, &err) != DG_OK) {
		stop_all(s, ms, wk);
		return cli_fail(&err);
	}
	worker_set_local_queues(wk, ps_server_enqueue, s);
	if (a->port_file && write_port_file(a->port_file, port, &err) != DG_OK) {
		stop_all(s, ms, wk);
		return cli_fail(&err);
	}
	ps_server_stats(s, &n_vars, &bytes);
	fprintf(stderr, "dg: %s/%d serving on %s%s%s:%d (epoch %llu, %s%s%s, %lld variables)\n",
		t->job, t->index, strchr(t->bind, ':') ? "[" : "", t->bind,
		strchr(t->bind, ':') ? "]" : "", port, (unsigned long long)ps_server_epoch(s),
		a->data_dir ? "data dir " : "memory only", a->data_dir ? a->data_dir : "",
		a->durability == PS_DURABILITY_STRICT ? ", durability strict" : "",
		(long long)n_vars);
	fflush(stderr);
	while (sigwait(stop_set, &sig) != 0)
		;
	dg_log(DG_LOG_INFO, "server", "%s/%d: signal %d, stopping", t->job, t->index, sig);
	return stop_all(s, ms, wk);
}

int cmd_server(int argc, char **argv)
{
	struct server_args a = { .task = -1 };
	struct task_place t = { 0 };
	struct dg_err err = { 0 };
	sigset_t stop_set;
	char *token = NULL, *cert = NULL, *key = NULL;
	int rc;

	if ((rc = parse_args(argc, argv, &a)) >= 0)
		return rc;
	if (find_task(&a, strcmp(argv[0], "ps") == 0, &t, &err) != DG_OK)
		return cli_fail(&err);
	if ((a.token_file && !(token = cli_token_load(a.token_file, &err))) ||
	    (a.tls_cert && (!(cert = cli_pem_load(a.tls_cert, false, &err)) ||
			    !(key = cli_pem_load(a.tls_key, true, &err)))) ||
	    /* this task's own requests (to the ps, the workers) go over https too;
	     * a --ca given to dg (or $DG_CA) was applied before */
	    (a.tls_cert && !dg_http_tls_enabled() &&
	     dg_http_tls_ca(a.tls_cert, &err) != DG_OK)) {
		free(token);
		free(cert);
		free(key);
		dg_cluster_free(t.cluster);
		return cli_fail(&err);
	}
	if (!a.data_dir)
		fprintf(stderr, "dg: warning: no --data-dir: variables live in memory only and are "
			"lost when the server stops\n");
	/* Before any thread exists, so that every thread inherits the mask and
	 * only sigwait below takes SIGTERM/SIGINT. */
	sigemptyset(&stop_set);
	sigaddset(&stop_set, SIGTERM);
	sigaddset(&stop_set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
	signal(SIGPIPE, SIG_IGN);
	dg_log_set_timestamps(1);
	rc = serve(&a, &t, token, cert, key, &stop_set);
	free(token);
	free(cert);
	free(key);
	dg_cluster_free(t.cluster);
	return rc;
}
