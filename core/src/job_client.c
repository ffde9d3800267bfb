/* The typed client of the job routes (dg/job_client.h). Neighbours: dg/http.h
 * below (the transport), the CLI's submit/job/status and the mount's jobs/
 * above, master/master.c on the other side of the wire. */
#include "dg/job_client.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/codec.h"

/* "/v1/jobs/" + escaped id (+ tail): into path (cleared first). */
static enum dg_status job_path(struct dg_buf *path, const char *id, const char *tail,
			       struct dg_err *err)
{
	enum dg_status st;

	path->len = 0;
	if ((st = dg_buf_printf(path, err, "/v1/jobs/")) != DG_OK ||
	    (st = dg_http_escape_path(id ? id : "", path, err)) != DG_OK)
		return st;
	return tail[0] ? dg_buf_append(path, tail, strlen(tail), err) : DG_OK;
}

/* One request on path; res is initialised here and left for the caller. */
static enum dg_status request(struct dg_http_client *c, const char *method, const char *path,
			      const struct dg_http_header *h, int nh, const void *body,
			      size_t len, struct dg_http_result *res, struct dg_err *err)
{
	dg_http_result_init(res);
	return dg_http_request(c, method, path, h, nh, body, len, res, err);
}

/* The reply as a JSON object (owned), or NULL with *err set. */
static json_t *reply_object(struct dg_http_client *c, const char *method, const char *path,
			    const struct dg_http_result *res, struct dg_err *err)
{
	json_t *j = json_loadb(res->body.data ? res->body.data : "", res->body.len, 0, NULL);

	if (json_is_object(j))
		return j;
	json_decref(j);
	dg_err_set(err, DG_EIO, "%s %s on %s: the answer is not a JSON object", method, path,
		   dg_http_client_url(c));
	dg_err_hint(err, "is this address a dg server of this version?");
	return NULL;
}

/* method path (no body); *out the JSON object of the answer (out may be NULL). */
static enum dg_status call_json(struct dg_http_client *c, const char *method, const char *path,
				json_t **out, struct dg_err *err)
{
	struct dg_http_result res;
	enum dg_status st = request(c, method, path, NULL, 0, NULL, 0, &res, err);

	if (out)
		*out = NULL;
	if (st == DG_OK && out && !(*out = reply_object(c, method, path, &res, err)))
		st = DG_EIO;
	dg_http_result_deinit(&res);
	return st;
}

enum dg_status dg_job_submit(struct dg_http_client *c, const json_t *body, json_t **reply,
			     struct dg_err *err)
{
	static const struct dg_http_header h[] = { { "Content-Type", "application/json" } };
	char *text = json_dumps(body, JSON_COMPACT);
	struct dg_http_result res;
	enum dg_status st;

	*reply = NULL;
	if (!text)
		return dg_err_set(err, DG_ENOMEM, "out of memory encoding the job");
	st = request(c, "POST", "/v1/jobs", h, 1, text, strlen(text), &res, err);
	free(text);
	if (st == DG_OK && !(*reply = reply_object(c, "POST", "/v1/jobs", &res, err)))
		st = DG_EIO;
	dg_http_result_deinit(&res);
	return st;
}

enum dg_status dg_job_feed(struct dg_http_client *c, const char *id, const char *name,
			   const struct dg_tensor *t, struct dg_err *err)
{
	static const struct dg_http_header h[] = { { "Content-Type", "application/x-npy" } };
	struct dg_buf path = { 0 }, npy = { 0 };
	struct dg_http_result res;
	enum dg_status st = job_path(&path, id, "/feeds/", err);

	if (st == DG_OK)
		st = dg_http_escape_path(name, &path, err);
	if (st == DG_OK)
		st = dg_npy_encode(t, &npy, err);
	if (st == DG_OK) {
		st = request(c, "PUT", path.data, h, 1, npy.data, npy.len, &res, err);
		dg_http_result_deinit(&res);
	}
	dg_buf_deinit(&npy);
	dg_buf_deinit(&path);
	return st;
}

enum dg_status dg_job_start(struct dg_http_client *c, const char *id, struct dg_err *err)
{
	struct dg_buf path = { 0 };
	enum dg_status st = job_path(&path, id, "/start", err);

	if (st == DG_OK)
		st = call_json(c, "POST", path.data, NULL, err);
	dg_buf_deinit(&path);
	return st;
}

enum dg_status dg_job_status(struct dg_http_client *c, const char *id, json_t **out,
			     struct dg_err *err)
{
	struct dg_buf path = { 0 };
	enum dg_status st = job_path(&path, id, "", err);

	*out = NULL;
	if (st == DG_OK)
		st = call_json(c, "GET", path.data, out, err);
	dg_buf_deinit(&path);
	return st;
}

enum dg_status dg_job_list(struct dg_http_client *c, json_t **out, struct dg_err *err)
{
	return call_json(c, "GET", "/v1/jobs", out, err);
}

enum dg_status dg_job_cancel(struct dg_http_client *c, const char *id, json_t **out,
			     struct dg_err *err)
{
	struct dg_buf path = { 0 };
	enum dg_status st = job_path(&path, id, "", err);

	if (out)
		*out = NULL;
	if (st == DG_OK)
		st = call_json(c, "DELETE", path.data, out, err);
	dg_buf_deinit(&path);
	return st;
}

enum dg_status dg_job_events(struct dg_http_client *c, const char *id, int64_t from,
			     int64_t timeout_ms, struct dg_buf *out, int64_t *next,
			     struct dg_err *err)
{
	struct dg_buf path = { 0 };
	struct dg_http_result res;
	enum dg_status st = job_path(&path, id, "/events", err);

	if (next)
		*next = -1;
	if (st == DG_OK)
		st = dg_buf_printf(&path, err, "?from=%" PRId64 "&timeout_ms=%" PRId64, from,
				   timeout_ms);
	if (st != DG_OK) {
		dg_buf_deinit(&path);
		return st;
	}
	st = request(c, "GET", path.data, NULL, 0, NULL, 0, &res, err);
	if (st == DG_OK && next)
		*next = res.dg_count;
	if (st == DG_OK)
		st = dg_buf_append(out, res.body.data ? res.body.data : "", res.body.len, err);
	dg_http_result_deinit(&res);
	dg_buf_deinit(&path);
	return st;
}

/* GET /v1/jobs/ID/TAIL's body appended to out. */
static enum dg_status get_text(struct dg_http_client *c, const char *id, const char *tail,
			       struct dg_buf *out, struct dg_err *err)
{
	struct dg_buf path = { 0 };
	struct dg_http_result res;
	enum dg_status st = job_path(&path, id, tail, err);

	if (st == DG_OK) {
		st = request(c, "GET", path.data, NULL, 0, NULL, 0, &res, err);
		if (st == DG_OK)
			st = dg_buf_append(out, res.body.data ? res.body.data : "", res.body.len,
					   err);
		dg_http_result_deinit(&res);
	}
	dg_buf_deinit(&path);
	return st;
}

enum dg_status dg_job_metrics(struct dg_http_client *c, const char *id, struct dg_buf *out,
			      struct dg_err *err)
{
	return get_text(c, id, "/metrics", out, err);
}

enum dg_status dg_job_steps(struct dg_http_client *c, const char *id, struct dg_buf *out,
			    struct dg_err *err)
{
	return get_text(c, id, "/steps", out, err);
}

enum dg_status dg_job_result(struct dg_http_client *c, const char *id, const char *name,
			     struct dg_tensor **out, struct dg_err *err)
{
	static const struct dg_http_header h[] = { { "Accept", "application/x-npy" } };
	struct dg_buf path = { 0 };
	struct dg_http_result res;
	enum dg_status st = job_path(&path, id, "/results/", err);

	*out = NULL;
	if (st == DG_OK)
		st = dg_http_escape_path(name, &path, err);
	if (st == DG_OK) {
		st = request(c, "GET", path.data, h, 1, NULL, 0, &res, err);
		if (st == DG_OK &&
		    !(*out = dg_npy_decode(res.body.data ? res.body.data : "", res.body.len, err)))
			st = err ? err->code : DG_EINVAL;
		dg_http_result_deinit(&res);
	}
	dg_buf_deinit(&path);
	return st;
}
