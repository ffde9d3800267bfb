/* Private to the parameter server: the context every route handler receives
 * (store, queues, the HTTP server for its metrics, the server's identity, the
 * devices it reports and a stopping flag) and the route table of
 * doc/http-api.md. server.c builds the
 * context and serves the table; routes.c holds the handlers. */
#ifndef PS_ROUTES_H
#define PS_ROUTES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dg/http.h"
#include "queue.h"
#include "server.h"
#include "store.h"

/* Long waits (min_version polls, blocking enqueue/dequeue) run in slices of
 * this many ms and give up with DG_EUNAVAILABLE once stopping is set, so that
 * stopping the server never waits for a client's timeout. */
#define PS_WAIT_SLICE_MS 100
/* Upper bound of every timeout_ms query parameter (ms). */
#define PS_MAX_TIMEOUT_MS 300000

struct ps_ctx {
	struct ps_store *store;         /* borrowed from the server */
	struct ps_queues *queues;       /* borrowed from the server */
	/* Set right after the HTTP server starts; a request served before that
	 * (possible: the server listens inside dg_http_server_new) sees NULL and
	 * /v1/metrics then omits the HTTP part. */
	_Atomic(struct dg_http_server *) http;
	const char *job;                /* "ps" */
	int task;
	double started;                 /* CLOCK_MONOTONIC seconds at start (uptime) */
	atomic_bool stopping;           /* set by ps_server_stop before the HTTP stop */
	bool worker_face;               /* worker routes served too: health says so */
	enum dg_status (*extra_metrics)(void *ud, struct dg_buf *out, struct dg_err *err);
	void *extra_metrics_ud;         /* both from ps_server_config */
	bool has_devices;               /* ps_server_config.devices was given */
	struct ps_devices devices;      /* its copy: strings and gpus owned by the server */
};

/* The routes, most specific first (doc/http-api.md lists each). */
extern const struct dg_route ps_routes[];
extern const int ps_n_routes;

#endif
