/* The typed client of a master's job routes (doc/http-api.md, "Executor and
 * master"): submit, feed, start, status, list, events, results, metrics,
 * cancel. Beside the variable client (dg/client.h) and the worker routes'
 * client (dg/task_client.h), it is the only code that builds these
 * requests: `dg submit`, `dg job`, `dg status` and the mount's jobs/ call
 * it. Each call takes the dg_http_client of the master (one kept-alive
 * connection, used by one thread at a time). Job ids are percent-encoded
 * here. */
#ifndef DG_JOB_CLIENT_H
#define DG_JOB_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "dg/buf.h"
#include "dg/http.h"
#include "dg/tensor.h"

/* POST /v1/jobs with body (a job object); *reply gets the status JSON (owned). */
enum dg_status dg_job_submit(struct dg_http_client *c, const json_t *body, json_t **reply,
			     struct dg_err *err);
/* PUT /v1/jobs/ID/feeds/NAME: t as .npy. */
enum dg_status dg_job_feed(struct dg_http_client *c, const char *id, const char *name,
			   const struct dg_tensor *t, struct dg_err *err);
/* POST /v1/jobs/ID/start. */
enum dg_status dg_job_start(struct dg_http_client *c, const char *id, struct dg_err *err);
/* GET /v1/jobs/ID: the status JSON object (owned). */
enum dg_status dg_job_status(struct dg_http_client *c, const char *id, json_t **out,
			     struct dg_err *err);
/* GET /v1/jobs: {"jobs": [...]} (owned). */
enum dg_status dg_job_list(struct dg_http_client *c, json_t **out, struct dg_err *err);
/* DELETE /v1/jobs/ID: the status JSON after the cancel (owned; out may be NULL). */
enum dg_status dg_job_cancel(struct dg_http_client *c, const char *id, json_t **out,
			     struct dg_err *err);
/* GET /v1/jobs/ID/events?from=F&timeout_ms=T: the JSON lines appended to
 * out; *next (may be NULL) the index to ask from next time (-1 when the
 * server did not say). */
enum dg_status dg_job_events(struct dg_http_client *c, const char *id, int64_t from,
			     int64_t timeout_ms, struct dg_buf *out, int64_t *next,
			     struct dg_err *err);
/* GET /v1/jobs/ID/metrics: the CSV appended to out. */
enum dg_status dg_job_metrics(struct dg_http_client *c, const char *id, struct dg_buf *out,
			      struct dg_err *err);
/* GET /v1/jobs/ID/steps: a queue-fed training job's step ledger CSV, appended. */
enum dg_status dg_job_steps(struct dg_http_client *c, const char *id, struct dg_buf *out,
			    struct dg_err *err);
/* GET /v1/jobs/ID/results/NAME: the fetched value (owned, sent as .npy). */
enum dg_status dg_job_result(struct dg_http_client *c, const char *id, const char *name,
			     struct dg_tensor **out, struct dg_err *err);

#endif
