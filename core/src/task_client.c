/* The typed client of the worker routes (dg/task_client.h): request bodies
 * and paths built once here, replies parsed back into C values. Neighbours:
 * dg/http.h below it (the transport), the master's remote tasks and the
 * executor's remote _Send above it, worker/routes.c on the other side of
 * the wire. */
#include "dg/task_client.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/buf.h"
#include "dg/codec.h"
#include "dg/wire.h"

#define PATH_MAX_LEN 256                /* DELETE /v1/steps/S?...&reason=... */

/* Whether st (with the reply res) says the task itself is gone. */
static bool is_lost(enum dg_status st, const struct dg_http_result *res,
		    const struct dg_err *err)
{
	if (st == DG_OK)
		return false;
	/* No reply, or a reply cut short (a 2xx whose transfer failed: the task
	 * died while it answered) */
	if (res->status == 0 || res->status / 100 == 2)
		return st == DG_EUNAVAILABLE;
	return res->status == 404 && err && strstr(err->msg, "fragment '") &&
	       strstr(err->msg, "' not found");
}

static json_t *reply_json(struct dg_http_client *c, const char *what,
			  const struct dg_http_result *res, struct dg_err *err)
{
	json_error_t je;
	json_t *j = json_loadb(res->body.data ? res->body.data : "", res->body.len, 0, &je);

	if (!j)
		dg_err_set(err, DG_EINVAL, "reply to %s from %s is not JSON: %s", what,
			   dg_http_client_url(c), je.text);
	return j;
}

/* "/v1/fragments[/renew]?owner=O[&lease_ms=L]" into path. */
static enum dg_status lease_path(struct dg_buf *path, const char *base, const char *owner,
				 int64_t lease_ms, struct dg_err *err)
{
	enum dg_status st = dg_buf_printf(path, err, "%s", base);

	if (st == DG_OK && owner) {
		st = dg_buf_printf(path, err, "?owner=");
		if (st == DG_OK)
			st = dg_http_escape_path(owner, path, err);
		if (st == DG_OK && lease_ms > 0)
			st = dg_buf_printf(path, err, "&lease_ms=%" PRId64, lease_ms);
	}
	return st;
}

enum dg_status dg_task_fragment_add(struct dg_http_client *c, const json_t *doc, char *id,
				    bool *lost, const char *owner, int64_t lease_ms,
				    struct dg_err *err)
{
	static const struct dg_http_header h[] = { { "Content-Type", "application/json" } };
	char *text = json_dumps(doc, JSON_COMPACT);
	struct dg_http_result res;
	struct dg_buf path = { 0 };
	json_t *reply = NULL;
	enum dg_status st;

	if (lost)
		*lost = false;
	if (!text)
		return dg_err_set(err, DG_ENOMEM, "out of memory encoding a fragment");
	dg_http_result_init(&res);
	st = lease_path(&path, "/v1/fragments", owner, lease_ms, err);
	if (st == DG_OK)
		st = dg_http_request(c, "POST", path.data, h, 1, text, strlen(text), &res, err);
	if (lost)
		*lost = is_lost(st, &res, err);
	if (st == DG_OK && (reply = reply_json(c, "POST /v1/fragments", &res, err)) == NULL)
		st = DG_EINVAL;
	const char *s = json_string_value(json_object_get(reply, "id"));
	if (st == DG_OK && (!s || strlen(s) >= DG_FRAGMENT_ID_MAX))
		st = dg_err_set(err, DG_EINTERNAL, "POST /v1/fragments answered without an id");
	if (st == DG_OK)
		snprintf(id, DG_FRAGMENT_ID_MAX, "%s", s);
	json_decref(reply);
	dg_http_result_deinit(&res);
	dg_buf_deinit(&path);
	free(text);
	return st;
}

enum dg_status dg_task_fragments_renew(struct dg_http_client *c, const char *owner,
				       int64_t *renewed, struct dg_err *err)
{
	struct dg_http_result res;
	struct dg_buf path = { 0 };
	json_t *reply = NULL;
	enum dg_status st = lease_path(&path, "/v1/fragments/renew", owner, 0, err);

	dg_http_result_init(&res);
	if (st == DG_OK)
		st = dg_http_request(c, "POST", path.data, NULL, 0, NULL, 0, &res, err);
	if (st == DG_OK && (reply = reply_json(c, "POST /v1/fragments/renew", &res, err)) == NULL)
		st = DG_EINVAL;
	if (st == DG_OK && renewed)
		*renewed = json_integer_value(json_object_get(reply, "renewed"));
	json_decref(reply);
	dg_http_result_deinit(&res);
	dg_buf_deinit(&path);
	return st;
}

enum dg_status dg_task_fragment_remove(struct dg_http_client *c, const char *id,
				       struct dg_err *err)
{
	char path[64];
	struct dg_http_result res;
	enum dg_status st;

	snprintf(path, sizeof path, "/v1/fragments/%.*s", DG_FRAGMENT_ID_MAX, id);
	dg_http_result_init(&res);
	st = dg_http_request(c, "DELETE", path, NULL, 0, NULL, 0, &res, err);
	dg_http_result_deinit(&res);
	return st;
}

/* The run request's body (worker/routes.c, run_args), written directly: it
 * is sent at every step of a job (jansson cost ~10x more). */
static enum dg_status run_body(const struct dg_task_run *run, struct dg_buf *out,
			       struct dg_err *err)
{
	enum dg_status st = dg_buf_printf(out, err, "{\"step\":%" PRIu64 ",\"timeout_ms\":%"
					  PRId64, run->step, run->timeout_ms);

	if (st == DG_OK && run->steps != 1)
		st = dg_buf_printf(out, err, ",\"steps\":%" PRId64, run->steps);
	if (st == DG_OK && run->train_step >= 0)
		st = dg_buf_printf(out, err, ",\"train_step\":%" PRId64, run->train_step);
	if (st == DG_OK && run->n_collect > 0)
		st = dg_buf_append(out, ",\"collect\":[", 12, err);
	for (int i = 0; st == DG_OK && i < run->n_collect; i++) {
		if (i)
			st = dg_buf_append(out, ",", 1, err);
		if (st == DG_OK)
			st = dg_buf_json_string(out, run->collect[i], err);
	}
	if (st == DG_OK && run->n_collect > 0)
		st = dg_buf_append(out, "]", 1, err);
	if (st == DG_OK && run->from) {
		st = dg_buf_append(out, ",\"from\":", 8, err);
		if (st == DG_OK)
			st = dg_buf_json_string(out, run->from, err);
	}
	return st == DG_OK ? dg_buf_append(out, "}", 1, err) : st;
}

/* "results": [{"values": {KEY: x | null}, "stale": n}, ...] into out. */
static enum dg_status run_results(const json_t *reply, const struct dg_task_run *run,
				  const char *path, struct dg_task_run_result *out,
				  struct dg_err *err)
{
	const json_t *results = json_object_get(reply, "results");
	size_t n = json_array_size(results);

	if (!json_is_array(results))
		return dg_err_set(err, DG_EINTERNAL, "POST %s answered without \"results\"", path);
	out->values = calloc(n * (size_t)run->n_collect + 1, sizeof *out->values);
	if (!out->values)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const json_t *ri = json_array_get(results, i);
		const json_t *vals = json_object_get(ri, "values");
		for (int v = 0; v < run->n_collect; v++) {
			const json_t *x = json_object_get(vals, run->collect[v]);
			out->values[(int64_t)i * run->n_collect + v] = json_is_number(x) ?
								       json_number_value(x) : NAN;
		}
		out->stale += json_integer_value(json_object_get(ri, "stale"));
	}
	out->steps_done = (int64_t)n;
	out->input_end = json_is_true(json_object_get(reply, "input_end"));
	return DG_OK;
}

/* The "tensors" of a reply that carries some (dg/task_client.h) into out:
 * each entry's dtype, shape and bytes checked against what is left of the
 * data data[0..len) before any is copied. */
static enum dg_status run_carried(struct dg_http_client *c, const json_t *reply,
				  const char *data, size_t len, const char *path,
				  struct dg_task_carried **out, int *n_out, struct dg_err *err)
{
	const json_t *list = json_object_get(reply, "tensors");
	size_t n = json_array_size(list), off = 0;

	if (!json_is_array(list) || n == 0 || n > INT32_MAX / 2)
		return dg_err_set(err, DG_EINTERNAL, "POST %s answered %s without \"tensors\"",
				  path, DG_TASK_RUN_MIME);
	if (!(*out = calloc(n, sizeof **out)))
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const json_t *e = json_array_get(list, i);
		const char *key = json_string_value(json_object_get(e, "key"));
		const json_t *jb = json_object_get(e, "bytes");
		struct dg_wire_desc d;
		json_int_t nb = json_integer_value(jb);
		enum dg_status st = dg_wire_desc_parse(
			json_string_value(json_object_get(e, "dtype")),
			json_string_value(json_object_get(e, "shape")), &d, err);
		if (st == DG_OK && !key)
			st = dg_err_set(err, DG_EINVAL, "it has no \"key\"");
		else if (st == DG_OK && (!json_is_integer(jb) || nb < 0))
			st = dg_err_set(err, DG_EINVAL, "its \"bytes\" is not a count");
		else if (st == DG_OK && (uint64_t)nb > len - off)
			st = dg_err_set(err, DG_EINVAL, "it has %" JSON_INTEGER_FORMAT " bytes, but "
					"the reply has %zu left", nb, len - off);
		struct dg_task_carried *ci = &(*out)[*n_out];
		if (st == DG_OK && !(ci->key = strdup(key)))
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
		if (st == DG_OK && !(ci->t = dg_wire_decode(DG_ENC_RAW, data + off, (size_t)nb, &d,
							    NULL, err))) {
			free(ci->key);
			ci->key = NULL;
			st = err ? err->code : DG_EINVAL;
		}
		if (st != DG_OK) {
			dg_err_prefix(err, "tensor %zu ('%.64s') carried in the reply to POST %s "
				      "from %s", i, key ? key : "", path, dg_http_client_url(c));
			return st;
		}
		(*n_out)++;
		off += (size_t)nb;
	}
	return off == len ? DG_OK : dg_err_set(err, DG_EINVAL, "the reply to POST %s has %zu "
					       "bytes after its carried tensors", path, len - off);
}

/* A run's reply into out (may be NULL) and *carried: JSON as such, or the
 * JSON line and the tensors after it (DG_TASK_RUN_MIME). */
static enum dg_status read_run_reply(struct dg_http_client *c, const struct dg_task_run *run,
				     const char *path, const struct dg_http_result *res,
				     struct dg_task_run_result *out, struct dg_task_carried **carried,
				     int *n_carried, struct dg_err *err)
{
	const char *body = res->body.data ? res->body.data : "";
	size_t len = res->body.len, nl = len;
	bool carry = strncmp(res->content_type, DG_TASK_RUN_MIME, sizeof DG_TASK_RUN_MIME - 1) == 0;
	json_error_t je;
	enum dg_status st;

	if (carry) {
		const char *p = memchr(body, '\n', len);
		if (!p)
			return dg_err_set(err, DG_EINVAL, "the reply to POST %s from %s has no "
					  "line end after its JSON", path, dg_http_client_url(c));
		nl = (size_t)(p - body);
	}
	json_t *reply = json_loadb(body, nl, 0, &je);
	if (!reply)
		return dg_err_set(err, DG_EINVAL, "reply to %s from %s is not JSON: %s", path,
				  dg_http_client_url(c), je.text);
	st = out ? run_results(reply, run, path, out, err) : DG_OK;
	if (st == DG_OK && carry)
		st = run_carried(c, reply, body + nl + 1, len - nl - 1, path, carried, n_carried,
				 err);
	json_decref(reply);
	return st;
}

enum dg_status dg_task_run(struct dg_http_client *c, const char *id, const struct dg_task_run *run,
			   struct dg_task_run_result *out, struct dg_task_carried **carried,
			   int *n_carried, bool *lost, struct dg_err *err)
{
	static const struct dg_http_header h[] = { { "Content-Type", "application/json" } };
	char path[64];
	struct dg_buf body = { 0 };
	struct dg_http_result res;
	struct dg_task_carried *cv = NULL;
	int nc = 0;
	enum dg_status st;

	if (lost)
		*lost = false;
	if (out)
		*out = (struct dg_task_run_result){ 0 };
	if ((st = run_body(run, &body, err)) != DG_OK) {
		dg_buf_deinit(&body);
		return st;
	}
	snprintf(path, sizeof path, "/v1/fragments/%.*s/run", DG_FRAGMENT_ID_MAX, id);
	dg_http_result_init(&res);
	st = dg_http_request(c, "POST", path, h, 1, body.data, body.len, &res, err);
	if (lost)
		*lost = is_lost(st, &res, err);
	dg_buf_deinit(&body);
	/* Without out, the reply is read only when it carries tensors. */
	bool carry = strncmp(res.content_type, DG_TASK_RUN_MIME, sizeof DG_TASK_RUN_MIME - 1) == 0;
	if (st == DG_OK && (out || carry))
		st = read_run_reply(c, run, path, &res, out, &cv, &nc, err);
	dg_http_result_deinit(&res);
	if (st != DG_OK && out)
		dg_task_run_result_deinit(out);
	if (st != DG_OK || !carried) {
		dg_task_carried_free(cv, nc);
		cv = NULL;
		nc = 0;
	}
	if (carried)
		*carried = cv;
	if (n_carried)
		*n_carried = nc;
	return st;
}

void dg_task_run_result_deinit(struct dg_task_run_result *r)
{
	if (!r)
		return;
	free(r->values);
	*r = (struct dg_task_run_result){ 0 };
}

void dg_task_carried_free(struct dg_task_carried *c, int n)
{
	for (int i = 0; c && i < n; i++) {
		free(c[i].key);
		dg_tensor_free(c[i].t);
	}
	free(c);
}

enum dg_status dg_task_carried_json(struct dg_buf *out, const struct dg_task_carried *c, int n,
				    struct dg_err *err)
{
	enum dg_status st = dg_buf_append(out, ",\"tensors\":[", 12, err);
	char shape[DG_WIRE_SHAPE_LEN];

	for (int i = 0; st == DG_OK && i < n; i++) {
		dg_wire_shape_format(&c[i].t->shape, shape);
		st = dg_buf_append(out, i ? ",{\"key\":" : "{\"key\":", i ? 8 : 7, err);
		if (st == DG_OK)
			st = dg_buf_json_string(out, c[i].key, err);
		if (st == DG_OK)
			st = dg_buf_printf(out, err, ",\"dtype\":\"%s\",\"shape\":\"%s\","
					   "\"bytes\":%zu}", dg_dtype_name(c[i].t->dtype), shape,
					   c[i].t->nbytes);
	}
	return st == DG_OK ? dg_buf_append(out, "]", 1, err) : st;
}

enum dg_status dg_task_carried_data(struct dg_buf *out, const struct dg_task_carried *c, int n,
				    struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int i = 0; st == DG_OK && i < n; i++)
		st = dg_buf_append(out, c[i].t->data, c[i].t->nbytes, err);
	return st;
}

/* "/v1/steps/S/tensors/" + the escaped key. */
static enum dg_status tensor_path(struct dg_buf *path, uint64_t step, const char *key,
				  struct dg_err *err)
{
	enum dg_status st = dg_buf_printf(path, err, "/v1/steps/%" PRIu64 "/tensors/", step);

	return st == DG_OK ? dg_http_escape_path(key, path, err) : st;
}

enum dg_status dg_task_tensor_put(struct dg_http_client *c, uint64_t step, const char *key,
				  const struct dg_tensor *t, bool *lost, struct dg_err *err)
{
	struct dg_buf path = { 0 };
	struct dg_http_result res;
	struct dg_wire_scratch ws;
	struct dg_http_header h[3];
	enum dg_status st;
	int nh = dg_wire_request_headers(t->dtype, &t->shape, &ws, h);

	if (lost)
		*lost = false;
	dg_http_result_init(&res);
	st = tensor_path(&path, step, key, err);
	if (st == DG_OK)
		st = dg_http_request(c, "PUT", path.data, h, nh, t->data, t->nbytes, &res, err);
	if (lost)
		*lost = is_lost(st, &res, err);
	dg_http_result_deinit(&res);
	dg_buf_deinit(&path);
	return st;
}

enum dg_status dg_task_tensor_take(struct dg_http_client *c, uint64_t step, const char *key,
				   int64_t timeout_ms, struct dg_tensor **out, struct dg_err *err)
{
	struct dg_buf path = { 0 };
	struct dg_http_result res;
	struct dg_wire_desc d;
	enum dg_encoding enc;
	enum dg_status st;

	*out = NULL;
	dg_http_result_init(&res);
	res.aligned_body = true;        /* the body becomes the tensor's data */
	st = tensor_path(&path, step, key, err);
	if (st == DG_OK)
		st = dg_buf_printf(&path, err, "?timeout_ms=%" PRId64, timeout_ms);
	if (st == DG_OK)
		st = dg_http_request(c, "GET", path.data, NULL, 0, NULL, 0, &res, err);
	if (st == DG_OK &&
	    ((st = dg_wire_desc_parse(res.dg_dtype[0] ? res.dg_dtype : NULL,
				      res.dg_shape[0] ? res.dg_shape : NULL, &d, err)) != DG_OK ||
	     (st = dg_wire_content_encoding(res.content_type[0] ? res.content_type : NULL, &enc,
					    err)) != DG_OK))
		dg_err_prefix(err, "tensor '%s' of step %" PRIu64 " from %s", key, step,
			      dg_http_client_url(c));
	if (st == DG_OK) {
		/* by the reply's encoding; a raw body's block is adopted, not copied */
		size_t n = res.body.len;
		const void *body = res.body.data;
		void *block = NULL;
		if (res.aligned || res.body.len == 0)
			body = block = dg_http_result_take_aligned(&res, &n);
		*out = dg_wire_decode(enc, body, n, &d, &block, err);
		dg_free_aligned(block);         /* not adopted: a bad length */
		if (!*out)
			st = err ? err->code : DG_EINVAL;
	}
	dg_http_result_deinit(&res);
	dg_buf_deinit(&path);
	return st;
}

enum dg_status dg_task_abort(struct dg_http_client *c, uint64_t step, int64_t count,
			     const char *reason, struct dg_err *err)
{
	struct dg_buf q = { 0 };
	struct dg_http_result res;
	enum dg_status st;

	if (count > 1)
		st = dg_buf_printf(&q, err, "/v1/steps/%" PRIu64 "?count=%" PRId64 "&reason=", step,
				   count);
	else
		st = dg_buf_printf(&q, err, "/v1/steps/%" PRIu64 "?reason=", step);
	/* An escape is 3 bytes: stop while it still fits. */
	for (const char *s = reason ? reason : ""; st == DG_OK && *s && q.len + 4 < PATH_MAX_LEN;
	     s++)
		st = dg_buf_printf(&q, err, (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
				   (*s >= '0' && *s <= '9') ? "%c" : "%%%02X",
				   (unsigned char)*s);
	dg_http_result_init(&res);
	if (st == DG_OK)
		st = dg_http_request(c, "DELETE", q.data, NULL, 0, NULL, 0, &res, err);
	dg_http_result_deinit(&res);
	dg_buf_deinit(&q);
	return st;
}

enum dg_status dg_task_health(struct dg_http_client *c, json_t **out, struct dg_err *err)
{
	struct dg_http_result res;
	enum dg_status st;

	if (out)
		*out = NULL;
	dg_http_result_init(&res);
	st = dg_http_request(c, "GET", "/v1/health", NULL, 0, NULL, 0, &res, err);
	if (st == DG_OK && out && !(*out = reply_json(c, "GET /v1/health", &res, err)))
		st = DG_EINVAL;
	dg_http_result_deinit(&res);
	return st;
}
