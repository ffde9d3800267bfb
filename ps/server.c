/* The parameter-server face of `dg server` (server.h): opens the store
 * (recovering the data directory), creates the queues and serves the routes of
 * routes.c over core's HTTP server. Stopping is ordered: HTTP first (handlers
 * in long waits notice the stopping flag within PS_WAIT_SLICE_MS), then the
 * queues, then the store (its final checkpoint). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dg/clock.h"
#include "routes.h"

struct ps_server {
	struct ps_ctx ctx;              /* handed to every handler; lives as long as s */
	struct ps_store *store;
	struct ps_queues *queues;
	struct dg_http_server *http;
	char *job;                      /* owned copy of cfg->job */
	char name[96];                  /* "ps/0", for logs */
};

/* Free what start built, in the stop order. NULL members are fine. Returns
 * the final checkpoint's failure. */
static enum dg_status server_free(struct ps_server *s, struct dg_err *err)
{
	enum dg_status st;

	if (!s)
		return DG_OK;
	atomic_store(&s->ctx.stopping, true);
	dg_http_server_free(s->http);
	ps_queues_free(s->queues);
	st = ps_store_close_final(s->store, err);
	free((char *)s->ctx.devices.blas);
	free((char *)s->ctx.devices.gpu);
	free((struct ps_gpu *)s->ctx.devices.gpus);
	free(s->job);
	free(s);
	return st;
}

/* c->devices := a copy of d (NULL: none known). */
static enum dg_status copy_devices(struct ps_ctx *c, const struct ps_devices *d,
				   struct dg_err *err)
{
	struct ps_gpu *gpus = NULL;

	if (!d)
		return DG_OK;
	if (d->n_gpus < 0 || (d->n_gpus > 0 && !d->gpus))
		return dg_err_set(err, DG_EINVAL, "ps_server_start: malformed device description");
	c->has_devices = true;
	c->devices.cuda_built = d->cuda_built;
	if ((d->blas && !(c->devices.blas = strdup(d->blas))) ||
	    (d->gpu && !(c->devices.gpu = strdup(d->gpu))) ||
	    (d->n_gpus > 0 && !(gpus = malloc((size_t)d->n_gpus * sizeof *gpus))))
		return dg_err_set(err, DG_ENOMEM, "out of memory starting the parameter server");
	if (gpus)
		memcpy(gpus, d->gpus, (size_t)d->n_gpus * sizeof *gpus);
	c->devices.gpus = gpus;
	c->devices.n_gpus = d->n_gpus;
	return DG_OK;
}

struct ps_server *ps_server_start(const struct ps_server_config *cfg, struct dg_err *err)
{
	struct ps_store_config sc = { .data_dir = cfg->data_dir,
				      .checkpoint_secs = cfg->checkpoint_secs,
				      .durability = cfg->durability };
	struct dg_http_config hc = { 0 };
	struct ps_server *s = calloc(1, sizeof *s);

	if (!s || !(s->job = strdup(cfg->job ? cfg->job : "ps"))) {
		free(s);
		dg_err_set(err, DG_ENOMEM, "out of memory starting the parameter server");
		return NULL;
	}
	snprintf(s->name, sizeof s->name, "%s/%d", s->job, cfg->task);
	if (!(s->store = ps_store_open(&sc, err)) || !(s->queues = ps_queues_new(err)) ||
	    copy_devices(&s->ctx, cfg->devices, err) != DG_OK)
		goto fail;
	s->ctx.store = s->store;
	s->ctx.queues = s->queues;
	s->ctx.job = s->job;
	s->ctx.task = cfg->task;
	s->ctx.started = dg_mono_s();
	atomic_init(&s->ctx.http, NULL);
	atomic_init(&s->ctx.stopping, false);
	hc.bind = cfg->bind;
	hc.port = cfg->port;
	hc.token = cfg->token;
	hc.max_body = cfg->max_body;
	hc.max_connections = cfg->max_connections;
	hc.request_timeout_s = cfg->request_timeout_s;
	hc.read_timeout_s = cfg->read_timeout_s;
	hc.max_connections_per_client = cfg->max_connections_per_client;
	hc.server_name = s->name;
	hc.tls_cert_pem = cfg->tls_cert_pem;
	hc.tls_key_pem = cfg->tls_key_pem;
	hc.epoch = ps_store_epoch(s->store);
	if (cfg->n_extra_groups < 0 || cfg->n_extra_groups > 15 ||
	    (cfg->n_extra_groups > 0 && !cfg->extra_groups)) {
		dg_err_set(err, DG_EINVAL, "ps_server_start: malformed extra route groups");
		goto fail;
	}
	struct dg_route_group groups[16] = { { ps_routes, ps_n_routes, &s->ctx } };
	for (int i = 0; i < cfg->n_extra_groups; i++)
		groups[1 + i] = cfg->extra_groups[i];
	s->ctx.worker_face = cfg->n_extra_groups > 0;
	s->ctx.extra_metrics = cfg->extra_metrics;
	s->ctx.extra_metrics_ud = cfg->extra_metrics_ud;
	if (!(s->http = dg_http_server_new_groups(&hc, groups, 1 + cfg->n_extra_groups, err)))
		goto fail;
	atomic_store(&s->ctx.http, s->http);
	return s;
fail:
	dg_err_prefix(err, "%s", s->name);
	server_free(s, NULL);
	return NULL;
}

int ps_server_port(const struct ps_server *s)
{
	return dg_http_server_port(s->http);
}

uint64_t ps_server_epoch(const struct ps_server *s)
{
	return ps_store_epoch(s->store);
}

void ps_server_stats(const struct ps_server *s, int64_t *n_vars, int64_t *bytes)
{
	ps_store_stats(s->store, n_vars, bytes);
}

void ps_server_stop(struct ps_server *s)
{
	server_free(s, NULL);
}

enum dg_status ps_server_stop_final(struct ps_server *s, struct dg_err *err)
{
	return server_free(s, err);
}

enum dg_status ps_server_enqueue(void *server, const char *queue, int64_t n, const void *body,
				 size_t len, int64_t timeout_ms, struct dg_err *err)
{
	struct ps_server *s = server;

	return ps_queue_enqueue(s->queues, queue, n, body, len, timeout_ms, err);
}
