/* The parameter-server face of `dg server`: a store, queues and an HTTP
 * server with the routes of doc/http-api.md. The CLI (cli/cmd_server.c) and
 * the integration tests start it through these three functions. */
#ifndef PS_SERVER_H
#define PS_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "dg/http.h"
#include "dg/status.h"
#include "store.h"

/* One GPU of the process, as health's "gpus" and /v1/metrics show it. */
struct ps_gpu {
	int index;
	char name[128];
	size_t mem_bytes;               /* total device memory, bytes */
	int cc_major, cc_minor;         /* compute capability */
};

/* What the process computes on, for GET /v1/health ("blas", "gpu", "gpus",
 * "cuda_built") and /v1/metrics (dg_gpus, dg_gpu_memory_bytes). ps/ links no
 * kernels: the server program (cli/cmd_server.c) fills this from kernels/.
 * Everything is borrowed; ps_server_start copies it. */
struct ps_devices {
	const char *blas;               /* the BLAS in use, one line */
	const char *gpu;                /* the GPUs or why there are none, one line */
	bool cuda_built;                /* dg has CUDA kernels */
	int n_gpus;
	const struct ps_gpu *gpus;      /* n_gpus entries */
};

struct ps_server_config {
	const char *job;                /* "ps" */
	int task;
	const char *bind;               /* NULL = 127.0.0.1 */
	int port;                       /* 0 = pick a free one */
	const char *data_dir;           /* NULL = memory only */
	const char *token;              /* NULL = no auth */
	unsigned checkpoint_secs;       /* 0 = 5 */
	enum ps_durability durability;  /* of applies; strict needs data_dir */
	const char *tls_cert_pem, *tls_key_pem;   /* HTTPS (dg_http_config); NULL: HTTP */
	size_t max_body;                /* 0 = 2 GiB */
	unsigned max_connections;       /* 0 = 256 */
	unsigned request_timeout_s;     /* 0 = 300 */
	unsigned read_timeout_s;        /* 0 = 20 */
	unsigned max_connections_per_client;    /* 0 = 128 */
	/* More route tables served by the same HTTP server after the ps routes
	 * (the worker and master faces of `dg server`); borrowed, may be NULL. */
	const struct dg_route_group *extra_groups;
	int n_extra_groups;
	/* Appends more Prometheus text to GET /v1/metrics (the worker's); NULL =
	 * none. Called from handler threads: must be thread-safe. */
	enum dg_status (*extra_metrics)(void *ud, struct dg_buf *out, struct dg_err *err);
	void *extra_metrics_ud;
	/* The devices health and metrics describe; NULL: none known (health then
	 * has no "blas", "gpu" or "cuda_built", its "gpus" is [] and dg_gpus 0). */
	const struct ps_devices *devices;
};

struct ps_server;

/* Open the store (recovering data_dir), start serving. Owned or NULL. */
struct ps_server *ps_server_start(const struct ps_server_config *cfg, struct dg_err *err);
int ps_server_port(const struct ps_server *s);
/* The store's restart counter (Dg-Epoch). */
uint64_t ps_server_epoch(const struct ps_server *s);
/* Number of variables and their bytes (slots included). */
void ps_server_stats(const struct ps_server *s, int64_t *n_vars, int64_t *bytes);
/* Stop serving, checkpoint, free. NULL is fine. */
void ps_server_stop(struct ps_server *s);
/* The same, returning the failure of the store's final checkpoint. */
enum dg_status ps_server_stop_final(struct ps_server *s, struct dg_err *err);
/* Enqueue n examples (a component-major body) into queue of server s (a
 * struct ps_server *), in-process: the worker's local enqueue
 * (worker_set_local_queues), for a feeder on the task that holds its queue. */
enum dg_status ps_server_enqueue(void *s, const char *queue, int64_t n, const void *body,
				 size_t len, int64_t timeout_ms, struct dg_err *err);

#endif
