/* The typed client of a dg server (doc/http-api.md) on top of dg/http.h:
 * builds escaped paths and query strings, sends tensors raw with their
 * Dg-Dtype/Dg-Shape headers, turns replies back into tensors and dg_var_info,
 * and tracks the server's epoch. One kept-alive connection per client, used by
 * one thread at a time; the path and enqueue buffers are reused across calls. */
#include "dg/client.h"
#include "dg/clock.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/http.h"
#include "dg/wire.h"

/* Per request. Long polls and queue waits may last 300 s on the server, so the
 * transport allows a little more than that before it gives up. */
#define CLIENT_TIMEOUT_MS 330000L
#define QUEUE_CACHE 4                   /* queue layouts remembered per client */
#define RES_KEEP ((size_t)1 << 20)      /* reply blocks up to this size are kept */

/* What a dequeue reply means: the components of one queue. */
struct queue_layout {
	char name[DG_VAR_NAME_MAX + 1];         /* "" = unused slot */
	int n;
	enum dg_dtype dtype[DG_QUEUE_MAX_COMPONENTS];
	struct dg_shape shape[DG_QUEUE_MAX_COMPONENTS];   /* of one example */
	size_t example_bytes[DG_QUEUE_MAX_COMPONENTS];    /* bytes of one example */
};

struct dg_client {
	struct dg_http_client *http;
	uint64_t epoch;                 /* Dg-Epoch of the last reply that had one */
	struct dg_buf path;             /* the path + query of the request being built */
	struct dg_buf body;             /* enqueue bodies of several components; row-wise applies */
	struct dg_http_result res;      /* the reply; its body block is reused */
	struct queue_layout queues[QUEUE_CACHE];
	int queue_next;                 /* round-robin slot to replace */
};

struct dg_client *dg_client_new(const char *address, const char *token, struct dg_err *err)
{
	struct dg_client *c;

	if (!address || !address[0]) {
		dg_err_set(err, DG_EINVAL, "empty server address");
		dg_err_hint(err, "give HOST:PORT, e.g. localhost:2222");
		return NULL;
	}
	c = calloc(1, sizeof *c);
	if (!c) {
		dg_err_set(err, DG_ENOMEM, "out of memory creating a client of %s", address);
		return NULL;
	}
	dg_http_result_init(&c->res);
	c->http = dg_http_client_new(address, token, CLIENT_TIMEOUT_MS, err);
	if (!c->http) {
		free(c);
		return NULL;
	}
	return c;
}

void dg_client_free(struct dg_client *c)
{
	if (!c)
		return;
	dg_http_client_free(c->http);
	dg_buf_deinit(&c->path);
	dg_buf_deinit(&c->body);
	dg_http_result_deinit(&c->res);
	free(c);
}

void dg_client_set_timeout(struct dg_client *c, long timeout_ms)
{
	dg_http_client_set_timeout(c->http, timeout_ms);
}

uint64_t dg_client_epoch(const struct dg_client *c)
{
	return c ? c->epoch : 0;
}

/* --- building requests ------------------------------------------------------ */

/* c->path = a fixed path. The buffer keeps its capacity, so steady-state calls
 * do not allocate. */
static enum dg_status path_plain(struct dg_client *c, const char *path, struct dg_err *err)
{
	c->path.len = 0;
	return dg_buf_append(&c->path, path, strlen(path), err);
}

/* c->path = head + escaped(name) + tail, after checking the name (NULL and ""
 * are refused like any other bad name). */
static enum dg_status path_set(struct dg_client *c, const char *head, const char *name,
			       const char *tail, struct dg_err *err)
{
	enum dg_status st;

	if ((st = dg_var_name_check(name ? name : "", err)) != DG_OK ||
	    (st = path_plain(c, head, err)) != DG_OK ||
	    (st = dg_http_escape_path(name, &c->path, err)) != DG_OK)
		return st;
	return dg_buf_append(&c->path, tail, strlen(tail), err);
}

/* '?' before the first query parameter, '&' before the others. */
static char query_sep(const struct dg_client *c)
{
	return memchr(c->path.data, '?', c->path.len) ? '&' : '?';
}

static enum dg_status query_double(struct dg_client *c, const char *key, double v,
				   struct dg_err *err)
{
	/* %.17g: the server reads back exactly the double the caller gave. */
	return dg_buf_printf(&c->path, err, "%c%s=%.17g", query_sep(c), key, v);
}

static enum dg_status query_int(struct dg_client *c, const char *key, int64_t v,
				struct dg_err *err)
{
	return dg_buf_printf(&c->path, err, "%c%s=%" PRId64, query_sep(c), key, v);
}

static enum dg_status query_uint(struct dg_client *c, const char *key, uint64_t v,
				 struct dg_err *err)
{
	return dg_buf_printf(&c->path, err, "%c%s=%" PRIu64, query_sep(c), key, v);
}

/* A string value that follows the naming rule (dg_var_name_check), so that
 * it needs no escaping in a query. */
static enum dg_status query_str(struct dg_client *c, const char *key, const char *v,
				struct dg_err *err)
{
	if (dg_var_name_check(v ? v : "", err) != DG_OK) {
		dg_err_prefix(err, "query parameter %s", key);
		return DG_EINVAL;
	}
	return dg_buf_printf(&c->path, err, "%c%s=%s", query_sep(c), key, v);
}

/* --- sending and reading replies -------------------------------------------- */

/* The reply of the next request: c->res with every field cleared but the body
 * block, so small replies (4 KiB tensors, JSON) reuse one block. */
static struct dg_http_result *res_begin(struct dg_client *c)
{
	struct dg_buf keep = c->res.body;

	dg_http_result_init(&c->res);
	c->res.body = keep;
	c->res.body.len = 0;
	return &c->res;
}

/* After a reply is consumed: a large block goes back to the system instead of
 * being held by an idle client. */
static void res_end(struct dg_client *c)
{
	size_t n;

	if (c->res.body.cap > RES_KEEP)
		dg_buf_deinit(&c->res.body);
	/* An aligned body not adopted (an error reply, a bad length): large
	 * blocks go to the allocator's cache, where the next GET finds them. */
	dg_free_aligned(dg_http_result_take_aligned(&c->res, &n));
}

/* A dg code for an HTTP error status that came without a dg JSON error body
 * (a proxy, or a server that is not dg). */
static enum dg_status code_of_http(int status)
{
	switch (status) {
	case 401: case 403: return DG_EUNAUTHORIZED;
	case 404: return DG_ENOTFOUND;
	case 409: return DG_EEXIST;
	case 410: return DG_ECLOSED;
	case 412: return DG_ECONFLICT;
	case 413: return DG_ETOOLARGE;
	case 501: return DG_EUNSUPPORTED;
	case 503: return DG_EUNAVAILABLE;
	case 504: return DG_ETIMEOUT;
	case 507: return DG_ENOMEM;
	default: return status < 500 ? DG_EINVAL : DG_EINTERNAL;
	}
}

/* One request on c->path. Transport failures and dg JSON errors come back from
 * the HTTP layer as they are (DG_ESTALE, DG_ENOTFOUND, ... with the server's
 * message and hint); any other status >= 400 becomes an error here. The epoch
 * is taken from every reply that has one, errors included. */
static enum dg_status send_req(struct dg_client *c, const char *method,
			       const struct dg_http_header *h, int nh, const void *body,
			       size_t len, struct dg_http_result *res, struct dg_err *err)
{
	enum dg_status st = dg_http_request(c->http, method, c->path.data, h, nh, body, len, res,
					    err);

	if (res->dg_epoch)
		c->epoch = res->dg_epoch;
	if (st != DG_OK || res->status < 400)
		return st;
	st = code_of_http(res->status);
	dg_err_set(err, st, "%s %s on %s answered HTTP %d", method, c->path.data,
		   dg_http_client_url(c->http), res->status);
	return st;
}

/* A reply status other than the ones the route documents is a peer error. */
static enum dg_status unexpected(struct dg_client *c, const char *method,
				 const struct dg_http_result *res, struct dg_err *err)
{
	dg_err_set(err, DG_EINVAL, "%s %s on %s: unexpected HTTP status %d", method,
		   c->path.data, dg_http_client_url(c->http), res->status);
	return DG_EINVAL;
}

static enum dg_status reply_json(struct dg_client *c, const struct dg_http_result *res,
				 json_t **out, struct dg_err *err)
{
	json_error_t je;

	*out = json_loadb(res->body.data ? res->body.data : "", res->body.len, 0, &je);
	if (*out)
		return DG_OK;
	dg_err_set(err, DG_EINVAL, "reply to %s from %s is not JSON: %s", c->path.data,
		   dg_http_client_url(c->http), je.text);
	return DG_EINVAL;
}

/* Dg-Dtype, Dg-Shape and Dg-Version of a variable reply into info. */
static enum dg_status info_from_headers(struct dg_client *c, const char *name,
					const struct dg_http_result *res,
					struct dg_var_info *info, struct dg_err *err)
{
	struct dg_var_info v = { 0 };
	int64_t numel;
	enum dg_status st;

	if (!res->dg_dtype[0]) {
		dg_err_set(err, DG_EINVAL, "reply for variable '%s' from %s has no Dg-Dtype header",
			   name, dg_http_client_url(c->http));
		return DG_EINVAL;
	}
	if ((st = dg_wire_dtype_parse(res->dg_dtype, &v.dtype, err)) != DG_OK ||
	    (st = dg_wire_shape_parse(res->dg_shape, &v.shape, err)) != DG_OK ||
	    (st = dg_shape_numel(&v.shape, &numel, err)) != DG_OK) {
		dg_err_prefix(err, "reply for variable '%s' from %s", name,
			      dg_http_client_url(c->http));
		return st;
	}
	snprintf(v.name, sizeof v.name, "%s", name);
	v.bytes = (uint64_t)numel * dg_dtype_size(v.dtype);
	v.version = res->dg_version;
	v.step = res->dg_step;
	*info = v;
	return DG_OK;
}

/* --- health and variables --------------------------------------------------- */

enum dg_status dg_client_health(struct dg_client *c, json_t **out, struct dg_err *err)
{
	struct dg_http_result *res;
	enum dg_status st;

	*out = NULL;
	res = res_begin(c);
	st = path_plain(c, "/v1/health", err);
	if (st == DG_OK)
		st = send_req(c, "GET", NULL, 0, NULL, 0, res, err);
	if (st == DG_OK)
		st = reply_json(c, res, out, err);
	res_end(c);
	return st;
}

/* One entry of GET /v1/vars. */
static enum dg_status list_entry(const json_t *e, struct dg_var_info *v, struct dg_err *err)
{
	const char *name = json_string_value(json_object_get(e, "name"));
	const char *dt = json_string_value(json_object_get(e, "dtype"));
	const json_t *shape = json_object_get(e, "shape"), *d;
	size_t i;
	enum dg_status st;

	if (!name || strlen(name) > DG_VAR_NAME_MAX || !dt || !json_is_array(shape) ||
	    json_array_size(shape) > DG_MAX_DIMS)
		return dg_err_set(err, DG_EINVAL, "variable list entry lacks a valid name, dtype "
				  "or shape");
	memset(v, 0, sizeof *v);
	snprintf(v->name, sizeof v->name, "%s", name);
	if ((st = dg_dtype_parse(dt, &v->dtype, err)) != DG_OK)
		return st;
	json_array_foreach(shape, i, d) {
		if (!json_is_integer(d) || json_integer_value(d) < 0)
			return dg_err_set(err, DG_EINVAL, "variable '%s': bad shape in list", name);
		v->shape.dim[i] = json_integer_value(d);
	}
	v->shape.ndim = (int)json_array_size(shape);
	v->bytes = (uint64_t)json_integer_value(json_object_get(e, "bytes"));
	v->version = (uint64_t)json_integer_value(json_object_get(e, "version"));
	v->mtime = json_number_value(json_object_get(e, "mtime"));
	/* servers before sync steps were listed leave it out */
	v->step = json_is_integer(json_object_get(e, "step")) ?
		  json_integer_value(json_object_get(e, "step")) : -1;
	return DG_OK;
}

enum dg_status dg_var_watch(struct dg_client *c, const char *prefix, struct dg_watch_pos *pos,
			    long timeout_ms, json_t **events, bool *reset, struct dg_err *err)
{
	struct dg_http_result *res = res_begin(c);
	json_t *list = NULL;
	enum dg_status st;

	*events = NULL;
	*reset = false;
	st = path_plain(c, "/v1/vars?watch=1", err);
	if (st == DG_OK && pos->epoch)
		st = dg_buf_printf(&c->path, err, "&after=%" PRIu64 "&epoch=%" PRIu64, pos->seq,
				   pos->epoch);
	if (st == DG_OK)
		st = query_int(c, "timeout_ms", timeout_ms, err);
	if (st == DG_OK && prefix && prefix[0]) {
		st = dg_buf_append(&c->path, "&prefix=", 8, err);
		if (st == DG_OK)
			st = dg_http_escape_path(prefix, &c->path, err);
	}
	if (st == DG_OK)
		st = send_req(c, "GET", NULL, 0, NULL, 0, res, err);
	if (st == DG_OK && (res->dg_count < 0 || !res->dg_epoch))
		st = dg_err_set(err, DG_EINVAL, "watch reply from %s has no Dg-Count or Dg-Epoch",
				dg_http_client_url(c->http));
	if (st == DG_OK && !(list = json_array()))
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
	/* One JSON object a line; a reset line says what to re-read. */
	for (size_t at = 0; st == DG_OK && at < res->body.len;) {
		const char *line = res->body.data + at;
		const char *nl = memchr(line, '\n', res->body.len - at);
		size_t len = nl ? (size_t)(nl - line) : res->body.len - at;
		json_error_t je;
		json_t *e = len ? json_loadb(line, len, 0, &je) : NULL;
		const char *ev = json_string_value(json_object_get(e, "event"));

		at += len + 1;
		if (!len)
			continue;
		if (!ev) {
			st = dg_err_set(err, DG_EINVAL, "watch reply from %s: a line that is not "
					"an event", dg_http_client_url(c->http));
		} else if (strcmp(ev, "reset") == 0) {
			*reset = true;
		} else if (json_array_append(list, e)) {
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
		}
		json_decref(e);
	}
	if (st == DG_OK) {
		pos->seq = (uint64_t)res->dg_count;
		pos->epoch = res->dg_epoch;
		*events = list;
		list = NULL;
	}
	json_decref(list);
	res_end(c);
	return st;
}

int dg_watch_event_line(const json_t *ev, const char *task, char *buf, size_t n)
{
	char when[32];
	const char *name = json_string_value(json_object_get(ev, "name"));
	const char *kind = json_string_value(json_object_get(ev, "event"));
	double t = json_number_value(json_object_get(ev, "time"));

	dg_iso8601_ms((int64_t)(t * 1000.0), when, sizeof when);
	return snprintf(buf, n, "%s %s %s %" JSON_INTEGER_FORMAT " %s\n", when, task,
			name ? name : "?", json_integer_value(json_object_get(ev, "version")),
			kind ? kind : "?");
}

enum dg_status dg_var_list(struct dg_client *c, const char *prefix, struct dg_var_info **out,
			   int *n, struct dg_err *err)
{
	struct dg_http_result *res;
	json_t *j = NULL, *vars, *e;
	struct dg_var_info *v = NULL;
	size_t i;
	enum dg_status st;

	*out = NULL;
	*n = 0;
	res = res_begin(c);
	st = path_plain(c, "/v1/vars", err);
	if (st == DG_OK && prefix && prefix[0]) {
		/* A prefix need not be a whole name ("mod" lists "model/w"): escaped,
		 * not checked. */
		st = dg_buf_append(&c->path, "?prefix=", 8, err);
		if (st == DG_OK)
			st = dg_http_escape_path(prefix, &c->path, err);
	}
	if (st == DG_OK)
		st = send_req(c, "GET", NULL, 0, NULL, 0, res, err);
	if (st == DG_OK)
		st = reply_json(c, res, &j, err);
	res_end(c);
	if (st != DG_OK)
		return st;
	vars = json_object_get(j, "vars");
	if (!json_is_array(vars)) {
		json_decref(j);
		return dg_err_set(err, DG_EINVAL, "variable list from %s has no \"vars\" array",
				  dg_http_client_url(c->http));
	}
	if (json_array_size(vars) > 0) {
		v = calloc(json_array_size(vars), sizeof *v);
		if (!v) {
			json_decref(j);
			return dg_err_set(err, DG_ENOMEM, "out of memory listing %zu variables",
					  json_array_size(vars));
		}
	}
	json_array_foreach(vars, i, e) {
		if ((st = list_entry(e, &v[i], err)) != DG_OK) {
			dg_err_prefix(err, "list from %s", dg_http_client_url(c->http));
			free(v);
			json_decref(j);
			return st;
		}
	}
	*n = (int)json_array_size(vars);
	*out = v;
	json_decref(j);
	return DG_OK;
}

enum dg_status dg_var_stat(struct dg_client *c, const char *name, struct dg_var_info *info,
			   struct dg_err *err)
{
	struct dg_http_result *res;
	enum dg_status st;

	res = res_begin(c);
	st = path_set(c, "/v1/vars/", name, "", err);
	if (st == DG_OK)
		st = send_req(c, "HEAD", NULL, 0, NULL, 0, res, err);
	if (st == DG_OK && res->status != 200)
		st = unexpected(c, "HEAD", res, err);
	if (st == DG_OK)
		st = info_from_headers(c, name, res, info, err);
	res_end(c);
	return st;
}

/* A variable reply -> owned tensor, decoded by its Content-Type and tensor
 * headers (dg_wire_decode). A body received with aligned_body becomes the
 * tensor's data without a copy. */
static enum dg_status decode_var(struct dg_client *c, const char *name,
				 struct dg_http_result *res, struct dg_tensor **out,
				 struct dg_var_info *info, struct dg_err *err)
{
	struct dg_var_info v;
	struct dg_wire_desc d;
	enum dg_encoding enc;
	void *block = NULL;
	const void *body = res->body.data;
	size_t len = res->body.len;
	enum dg_status st = info_from_headers(c, name, res, &v, err);

	if (st == DG_OK)
		st = dg_wire_content_encoding(res->content_type[0] ? res->content_type : NULL,
					      &enc, err);
	if (st != DG_OK)
		return st;
	if (res->aligned_body && (res->aligned || res->body.len == 0))
		body = block = dg_http_result_take_aligned(res, &len);
	d = (struct dg_wire_desc){ .has_dtype = true, .has_shape = true, .dtype = v.dtype,
				   .shape = v.shape };
	*out = dg_wire_decode(enc, body, len, &d, &block, err);
	dg_free_aligned(block);         /* not adopted (a bad length, npy, text) */
	if (!*out) {
		dg_err_prefix(err, "variable '%s' from %s", name, dg_http_client_url(c->http));
		return err ? err->code : DG_EINVAL;
	}
	if (info)
		*info = v;
	return DG_OK;
}

static const struct dg_http_header accept_raw = { "Accept", "application/octet-stream" };

enum dg_status dg_var_get(struct dg_client *c, const char *name, struct dg_tensor **out,
			  struct dg_var_info *info, struct dg_err *err)
{
	struct dg_http_result *res;
	enum dg_status st;

	*out = NULL;
	res = res_begin(c);
	res->aligned_body = true;       /* the body becomes the tensor's data */
	st = path_set(c, "/v1/vars/", name, "", err);
	if (st == DG_OK)
		st = send_req(c, "GET", &accept_raw, 1, NULL, 0, res, err);
	if (st == DG_OK && res->status != 200)
		st = unexpected(c, "GET", res, err);
	if (st == DG_OK)
		st = decode_var(c, name, res, out, info, err);
	res_end(c);
	return st;
}

enum dg_status dg_var_get_rows(struct dg_client *c, const char *name,
			       const struct dg_tensor *indices, int64_t min_step, long timeout_ms,
			       struct dg_tensor **out, struct dg_var_info *info,
			       struct dg_err *err)
{
	struct dg_http_header h[4];
	struct dg_wire_scratch ws;
	struct dg_http_result *res;
	enum dg_status st;

	*out = NULL;
	if (!indices || (indices->dtype != DG_I32 && indices->dtype != DG_I64))
		return dg_err_set(err, DG_EDTYPE, "the row indices of '%s' must be int32 or int64",
				  name ? name : "");
	dg_wire_request_headers(indices->dtype, &indices->shape, &ws, h);
	h[3] = accept_raw;
	res = res_begin(c);
	res->aligned_body = true;       /* the body becomes the tensor's data */
	st = path_set(c, "/v1/vars/", name, "/rows", err);
	if (st == DG_OK && min_step > 0)
		st = query_int(c, "min_step", min_step, err);
	if (st == DG_OK && min_step > 0)
		st = query_int(c, "timeout_ms", timeout_ms < 0 ? 0 : timeout_ms, err);
	if (st == DG_OK)
		st = send_req(c, "POST", h, 4, indices->data, indices->nbytes, res, err);
	if (st == DG_OK && res->status == 304) {
		dg_err_set(err, DG_ETIMEOUT, "variable '%s' did not reach step %" PRId64 " within "
			   "%ld ms on %s", name, min_step, timeout_ms, dg_http_client_url(c->http));
		dg_err_hint(err, "check that every replica sends its updates, or wait longer");
		st = DG_ETIMEOUT;
	} else if (st == DG_OK && res->status != 200) {
		st = unexpected(c, "POST", res, err);
	}
	if (st == DG_OK)
		st = decode_var(c, name, res, out, info, err);
	res_end(c);
	return st;
}

/* The Accept value of a GET in encoding enc; NULL with *err for an unknown one. */
static const char *accept_of(enum dg_encoding enc, struct dg_err *err)
{
	if ((unsigned)enc > DG_ENC_TEXT) {
		dg_err_set(err, DG_EINVAL, "unknown encoding %d", (int)enc);
		return NULL;
	}
	return dg_encoding_mime(enc);
}

/* GET of a variable (rows: ?rows= of it, or NULL) in an encoding. */
static enum dg_status get_encoded(struct dg_client *c, const char *name, const char *rows,
				  enum dg_encoding enc, struct dg_buf *out, struct dg_var_info *info,
				  struct dg_err *err)
{
	struct dg_http_header h = { "Accept", NULL };
	struct dg_http_result *res;
	struct dg_var_info v;
	enum dg_status st;

	if ((h.value = accept_of(enc, err)) == NULL)
		return DG_EINVAL;
	/* the list goes into the URL as it is: digits, commas and dashes only */
	if (rows && (!rows[0] || strlen(rows) > 4096 ||
		     strspn(rows, "0123456789,-") != strlen(rows))) {
		dg_err_set(err, DG_EINVAL, "'%.60s' is not a list of rows", rows);
		dg_err_hint(err, "e.g. 3, 0-99 (inclusive) or 7,1,20-29");
		return DG_EINVAL;
	}
	res = res_begin(c);
	st = path_set(c, "/v1/vars/", name, "", err);
	if (st == DG_OK && rows)
		st = dg_buf_printf(&c->path, err, "%crows=%s", query_sep(c), rows);
	if (st == DG_OK)
		st = send_req(c, "GET", &h, 1, NULL, 0, res, err);
	if (st == DG_OK && res->status != 200)
		st = unexpected(c, "GET", res, err);
	if (st == DG_OK)
		st = info_from_headers(c, name, res, &v, err);
	if (st == DG_OK && !out->data) {
		/* An empty caller buffer adopts the reply's block: no copy of a
		 * large body. */
		*out = res->body;
		dg_buf_init(&res->body);
	} else if (st == DG_OK) {
		st = dg_buf_append(out, res->body.data, res->body.len, err);
	}
	if (st == DG_OK && info)
		*info = v;
	res_end(c);
	return st;
}

enum dg_status dg_var_get_encoded(struct dg_client *c, const char *name, enum dg_encoding enc,
				  struct dg_buf *out, struct dg_var_info *info, struct dg_err *err)
{
	return get_encoded(c, name, NULL, enc, out, info, err);
}

enum dg_status dg_var_get_rows_encoded(struct dg_client *c, const char *name, const char *rows,
				       enum dg_encoding enc, struct dg_buf *out,
				       struct dg_var_info *info, struct dg_err *err)
{
	return get_encoded(c, name, rows, enc, out, info, err);
}

/* dg_var_get_stream's adapter: decodes the headers before the first byte. */
struct stream {
	struct dg_client *c;
	const char *name;
	bool (*sink)(void *ud, const struct dg_var_info *info, uint64_t offset, const void *p,
		     size_t n);
	void *ud;
	bool have_info;
	struct dg_var_info info;
};

static bool stream_body(void *ud, uint64_t offset, const void *p, size_t n)
{
	struct stream *s = ud;

	/* offset 0 again: a retried request, whose reply may be a newer value. */
	if (!s->have_info || offset == 0) {
		if (info_from_headers(s->c, s->name, &s->c->res, &s->info, NULL) != DG_OK)
			return false;
		s->have_info = true;
	}
	return s->sink(s->ud, &s->info, offset, p, n);
}

enum dg_status dg_var_get_stream(struct dg_client *c, const char *name, enum dg_encoding enc,
				 bool (*sink)(void *ud, const struct dg_var_info *info,
					      uint64_t offset, const void *p, size_t n),
				 void *ud, struct dg_var_info *info, struct dg_err *err)
{
	struct dg_http_header h = { "Accept", NULL };
	struct stream s = { .c = c, .name = name, .sink = sink, .ud = ud };
	struct dg_http_result *res;
	enum dg_status st;

	if ((h.value = accept_of(enc, err)) == NULL)
		return DG_EINVAL;
	res = res_begin(c);
	res->sink = stream_body;
	res->sink_ud = &s;
	st = path_set(c, "/v1/vars/", name, "", err);
	if (st == DG_OK)
		st = send_req(c, "GET", &h, 1, NULL, 0, res, err);
	if (st == DG_OK && res->status != 200)
		st = unexpected(c, "GET", res, err);
	if (st == DG_OK && info)
		st = info_from_headers(c, name, res, info, err);
	res->sink = NULL;
	res->sink_ud = NULL;
	res_end(c);
	return st;
}

/* dg_var_get_into's adapter: the reply's headers as a dg_var_info. */
struct into {
	struct dg_client *c;
	const char *name;
	const struct dg_var_into *into;
	void *ud;
	bool bad_headers;               /* begin refused: no tensor headers */
};

static void *into_begin(void *ud, const struct dg_http_result *res, uint64_t len)
{
	struct into *a = ud;
	struct dg_var_info v;

	if (info_from_headers(a->c, a->name, res, &v, NULL) != DG_OK) {
		a->bad_headers = true;
		return NULL;
	}
	return a->into->begin(a->ud, &v, len);
}

static bool into_progress(void *ud, uint64_t got)
{
	struct into *a = ud;

	return a->into->progress(a->ud, got);
}

static bool into_stop(void *ud)
{
	struct into *a = ud;

	return a->into->stop && a->into->stop(a->ud);
}

enum dg_status dg_var_get_into(struct dg_client *c, const char *name, enum dg_encoding enc,
			       const struct dg_var_into *into, void *ud, bool *delivered,
			       struct dg_err *err)
{
	static const struct dg_http_into adapter = {
		.begin = into_begin, .progress = into_progress, .stop = into_stop,
	};
	struct dg_http_header h = { "Accept", NULL };
	struct into a = { .c = c, .name = name, .into = into, .ud = ud };
	struct dg_http_result *res;
	enum dg_status st;

	*delivered = false;
	if ((h.value = accept_of(enc, err)) == NULL)
		return DG_EINVAL;
	res = res_begin(c);
	st = path_set(c, "/v1/vars/", name, "", err);
	if (st == DG_OK)
		st = dg_http_get_into(c->http, c->path.data, &h, 1, &adapter, &a, res, delivered,
				      err);
	if (res->dg_epoch)
		c->epoch = res->dg_epoch;
	if (a.bad_headers) {
		/* the caller's begin was not called: nothing was received */
		*delivered = false;
		st = dg_err_set(err, DG_EUNSUPPORTED, "the reply for variable '%s' from %s has no "
				"tensor headers", name, dg_http_client_url(c->http));
	}
	res_end(c);
	return st;
}

/* GET ?KEY=V&timeout_ms=T (KEY min_version or min_step, V >= 0): the value
 * once the condition holds, DG_ETIMEOUT (info from the 304's headers) when
 * it did not in time. */
static enum dg_status wait_get(struct dg_client *c, const char *name, const char *key,
			       uint64_t min, long timeout_ms, struct dg_tensor **out,
			       struct dg_var_info *info, struct dg_err *err)
{
	struct dg_http_result *res;
	struct dg_var_info v;
	enum dg_status st;

	*out = NULL;
	if (timeout_ms < 0)
		return dg_err_set(err, DG_EINVAL, "wait for variable '%s': negative timeout %ld ms",
				  name, timeout_ms);
	res = res_begin(c);
	res->aligned_body = true;       /* the body becomes the tensor's data */
	st = path_set(c, "/v1/vars/", name, "", err);
	if (st == DG_OK)
		st = query_uint(c, key, min, err);
	if (st == DG_OK)
		st = query_int(c, "timeout_ms", timeout_ms, err);
	if (st == DG_OK)
		st = send_req(c, "GET", &accept_raw, 1, NULL, 0, res, err);
	if (st == DG_OK && res->status == 304) {
		/* Not modified: the headers describe the current version. */
		st = info_from_headers(c, name, res, &v, err);
		if (st == DG_OK && info)
			*info = v;
		if (st == DG_OK) {
			dg_err_set(err, DG_ETIMEOUT, "variable '%s' did not reach %s %" PRIu64
				   " within %ld ms on %s (it is at version %" PRIu64 ")", name,
				   strcmp(key, "min_step") ? "version" : "step", min, timeout_ms,
				   dg_http_client_url(c->http), v.version);
			dg_err_hint(err, "check that every replica sends its updates, or wait "
				    "longer");
			st = DG_ETIMEOUT;
		}
	} else if (st == DG_OK && res->status != 200) {
		st = unexpected(c, "GET", res, err);
	} else if (st == DG_OK) {
		st = decode_var(c, name, res, out, info, err);
	}
	res_end(c);
	return st;
}

enum dg_status dg_var_wait(struct dg_client *c, const char *name, uint64_t min_version,
			   long timeout_ms, struct dg_tensor **out, struct dg_var_info *info,
			   struct dg_err *err)
{
	return wait_get(c, name, "min_version", min_version, timeout_ms, out, info, err);
}

enum dg_status dg_var_wait_step(struct dg_client *c, const char *name, int64_t min_step,
				long timeout_ms, struct dg_tensor **out, struct dg_var_info *info,
				struct dg_err *err)
{
	if (min_step < 0) {
		*out = NULL;
		return dg_err_set(err, DG_EINVAL, "wait for variable '%s': negative step %" PRId64,
				  name ? name : "", min_step);
	}
	return wait_get(c, name, "min_step", (uint64_t)min_step, timeout_ms, out, info, err);
}

enum dg_status dg_ps_checkpoint(struct dg_client *c, json_t **reply, struct dg_err *err)
{
	struct dg_http_result *res;
	json_t *j = NULL;
	enum dg_status st;

	if (reply)
		*reply = NULL;
	res = res_begin(c);
	st = path_plain(c, "/v1/checkpoint", err);
	if (st == DG_OK)
		st = send_req(c, "POST", NULL, 0, NULL, 0, res, err);
	if (st == DG_OK && res->status != 200)
		st = unexpected(c, "POST", res, err);
	if (st == DG_OK)
		st = reply_json(c, res, &j, err);
	res_end(c);
	if (st == DG_OK && reply)
		*reply = j;
	else
		json_decref(j);
	return st;
}

/* The version of a PUT/PATCH reply: Dg-Version, else the JSON "version". */
static uint64_t reply_version(const struct dg_http_result *res)
{
	json_t *j;
	uint64_t v;

	if (res->dg_version)
		return res->dg_version;
	j = json_loadb(res->body.data ? res->body.data : "", res->body.len, 0, NULL);
	v = (uint64_t)json_integer_value(json_object_get(j, "version"));
	json_decref(j);
	return v;
}

/* PUT c->path with the conditional headers of opts added to h[0..nh). */
static enum dg_status put_body(struct dg_client *c, struct dg_http_header *h, int nh,
			       const void *body, size_t len, const struct dg_put_opts *opts,
			       uint64_t *version, struct dg_err *err)
{
	struct dg_http_result *res;
	char tag[DG_WIRE_VERSION_LEN];
	enum dg_status st = DG_OK;

	if (opts && opts->if_match) {
		dg_wire_etag_format(opts->if_match, tag);
		h[nh++] = (struct dg_http_header){ "If-Match", tag };
	}
	if (opts && opts->create_only)
		h[nh++] = (struct dg_http_header){ "If-None-Match", "*" };
	if (opts && opts->replace)
		st = dg_buf_append(&c->path, "?replace=1", 10, err);
	res = res_begin(c);
	if (st == DG_OK)
		st = send_req(c, "PUT", h, nh, body, len, res, err);
	if (st == DG_OK && version)
		*version = reply_version(res);
	res_end(c);
	return st;
}

enum dg_status dg_var_put(struct dg_client *c, const char *name, const struct dg_tensor *t,
			  const struct dg_put_opts *opts, uint64_t *version, struct dg_err *err)
{
	struct dg_http_header h[5];
	struct dg_wire_scratch ws;
	enum dg_status st;

	if (!t)
		return dg_err_set(err, DG_EINVAL, "put of variable '%s' without a tensor",
				  name ? name : "");
	if ((st = path_set(c, "/v1/vars/", name, "", err)) != DG_OK)
		return st;
	int nh = dg_wire_request_headers(t->dtype, &t->shape, &ws, h);
	return put_body(c, h, nh, t->data, t->nbytes, opts, version, err);
}

enum dg_status dg_var_put_stream(struct dg_client *c, const char *name, enum dg_dtype dt,
				 const struct dg_shape *shape, const void *data, uint64_t nbytes,
				 uint64_t if_match, const struct dg_var_from *from, void *ud,
				 struct dg_var_put_end *end, struct dg_err *err)
{
	struct dg_http_header h[4];
	struct dg_wire_scratch ws;
	struct dg_http_result *res;
	char tag[DG_WIRE_VERSION_LEN];
	enum dg_status st;

	*end = (struct dg_var_put_end){ 0 };
	if (!shape || !from)
		return dg_err_set(err, DG_EINVAL, "streaming put of variable '%s' without a shape "
				  "or a source", name ? name : "");
	if ((st = path_set(c, "/v1/vars/", name, "", err)) != DG_OK)
		return st;
	const struct dg_http_from hf = { from->more, from->stop, from->stop_fd };
	int nh = dg_wire_request_headers(dt, shape, &ws, h);
	if (if_match) {
		dg_wire_etag_format(if_match, tag);
		h[nh++] = (struct dg_http_header){ "If-Match", tag };
	}
	res = res_begin(c);
	st = dg_http_put_from(c->http, c->path.data, h, nh, data, nbytes, &hf, ud, res, &end->sent,
			      err);
	end->status = res->status;
	if (res->dg_epoch)
		c->epoch = res->dg_epoch;
	if (st == DG_OK && (res->status < 200 || res->status >= 300))
		st = unexpected(c, "PUT", res, err);
	if (st == DG_OK)
		end->version = reply_version(res);
	res_end(c);
	return st;
}

enum dg_status dg_var_put_encoded(struct dg_client *c, const char *name, enum dg_encoding enc,
				  const void *body, size_t len, const struct dg_put_opts *opts,
				  uint64_t *version, struct dg_err *err)
{
	struct dg_http_header h[3];
	enum dg_status st;

	if (enc != DG_ENC_NPY && enc != DG_ENC_TEXT) {
		dg_err_set(err, DG_EINVAL, "put of variable '%s': encoded puts take npy or text",
			   name ? name : "");
		dg_err_hint(err, "send raw bytes with dg_var_put, which adds the dtype and shape");
		return DG_EINVAL;
	}
	if ((st = path_set(c, "/v1/vars/", name, "", err)) != DG_OK)
		return st;
	h[0] = (struct dg_http_header){ "Content-Type", dg_encoding_mime(enc) };
	return put_body(c, h, 1, body, len, opts, version, err);
}

enum dg_status dg_var_patch(struct dg_client *c, const char *name, uint64_t offset,
			    const void *p, size_t n, uint64_t if_match, uint64_t *version,
			    struct dg_err *err)
{
	struct dg_http_header h[3];
	struct dg_http_result *res;
	char range[96], tag[DG_WIRE_VERSION_LEN];
	int nh = 2;
	enum dg_status st;

	if (n == 0 || offset > UINT64_MAX - n)
		return dg_err_set(err, DG_EINVAL, "patch of variable '%s': %zu bytes at offset %"
				  PRIu64 " is not a byte range", name ? name : "", n, offset);
	if ((st = path_set(c, "/v1/vars/", name, "", err)) != DG_OK)
		return st;
	snprintf(range, sizeof range, "bytes %" PRIu64 "-%" PRIu64 "/*", offset,
		 offset + n - 1);
	h[0] = (struct dg_http_header){ "Content-Type", "application/octet-stream" };
	h[1] = (struct dg_http_header){ "Content-Range", range };
	if (if_match) {
		dg_wire_etag_format(if_match, tag);
		h[nh++] = (struct dg_http_header){ "If-Match", tag };
	}
	res = res_begin(c);
	st = send_req(c, "PATCH", h, nh, p, n, res, err);
	if (st == DG_OK && version)
		*version = reply_version(res);
	res_end(c);
	return st;
}

enum dg_status dg_var_delete(struct dg_client *c, const char *name, uint64_t if_match,
			     struct dg_err *err)
{
	struct dg_http_header h = { "If-Match", NULL };
	struct dg_http_result *res;
	char tag[DG_WIRE_VERSION_LEN];
	enum dg_status st;

	if ((st = path_set(c, "/v1/vars/", name, "", err)) != DG_OK)
		return st;
	dg_wire_etag_format(if_match, tag);
	h.value = tag;
	res = res_begin(c);
	st = send_req(c, "DELETE", &h, if_match ? 1 : 0, NULL, 0, res, err);
	res_end(c);
	return st;
}

/* --- update rules ----------------------------------------------------------- */

/* rule=... and only the parameters that rule reads (0 = the server's default). */
static enum dg_status apply_query(struct dg_client *c, const struct dg_apply *a,
				  struct dg_err *err)
{
	static const char *const rules[] = { "assign", "assign_add", "sgd", "momentum", "adam",
					     "adagrad", "rmsprop", "moving_average" };
	const char *r = a->rule;
	enum dg_status st = DG_EINVAL;

	for (size_t i = 0; r && i < sizeof rules / sizeof rules[0]; i++)
		if (strcmp(r, rules[i]) == 0)
			st = DG_OK;
	if (st != DG_OK) {
		dg_err_set(err, DG_EINVAL, "unknown update rule '%.40s'", r ? r : "(null)");
		dg_err_hint(err, "rules: assign, assign_add, sgd, momentum, adam, adagrad, rmsprop, "
			    "moving_average");
		return st;
	}
	st = dg_buf_printf(&c->path, err, "?rule=%s", r);
	bool mom = strcmp(r, "momentum") == 0, adam = strcmp(r, "adam") == 0;
	bool ada = strcmp(r, "adagrad") == 0, rms = strcmp(r, "rmsprop") == 0;
	if (st == DG_OK && (mom || adam || ada || rms || strcmp(r, "sgd") == 0) && a->lr != 0)
		st = query_double(c, "lr", a->lr, err);
	if (st == DG_OK && (mom || rms) && a->momentum != 0)
		st = query_double(c, "momentum", a->momentum, err);
	if (st == DG_OK && rms && a->rho != 0)
		st = query_double(c, "rho", a->rho, err);
	if (st == DG_OK && strcmp(r, "moving_average") == 0)
		st = query_double(c, "decay", a->rho, err);   /* 0 is a valid decay */
	if (st == DG_OK && (ada || rms) && a->init != 0)
		st = query_double(c, "init", a->init, err);
	if (st == DG_OK && rms && a->eps != 0)
		st = query_double(c, "eps", a->eps, err);
	if (st == DG_OK && a->rows)
		st = query_int(c, "row_count", a->n_rows, err);
	if (st == DG_OK && mom && a->nesterov)
		st = query_int(c, "nesterov", 1, err);
	if (st == DG_OK && adam && a->beta1 != 0)
		st = query_double(c, "beta1", a->beta1, err);
	if (st == DG_OK && adam && a->beta2 != 0)
		st = query_double(c, "beta2", a->beta2, err);
	if (st == DG_OK && adam && a->eps != 0)
		st = query_double(c, "eps", a->eps, err);
	if (st == DG_OK && a->lease && a->lease_queue) {
		st = query_uint(c, "lease", a->lease, err);
		if (st == DG_OK)
			st = query_str(c, "lease_queue", a->lease_queue, err);
		if (st == DG_OK)
			st = query_int(c, "lease_count", a->lease_count, err);
		if (st == DG_OK && a->lease_drop)
			st = query_int(c, "lease_drop", 1, err);
	}
	if (st != DG_OK || a->step < 0)
		return st;
	/* Synchronous mode. */
	st = query_int(c, "step", a->step, err);
	if (st == DG_OK)
		st = query_int(c, "replicas", a->replicas, err);
	if (st == DG_OK && a->backup > 0)
		st = query_int(c, "backup", a->backup, err);
	if (st == DG_OK && a->replica >= 0)
		st = query_int(c, "replica", a->replica, err);
	return st;
}

/* 200 {"applied":true,"version":V[,"step":S]}, 202 {"applied":false,
 * "pending":n,"step":S}, or 204 with Dg-Version alone (an async apply sent
 * with Prefer: return=minimal). body/len: the JSON, wherever it was received. */
static void apply_reply(const struct dg_http_result *res, const char *body, size_t len,
			struct dg_apply_result *out)
{
	if (res->status == 204) {
		*out = (struct dg_apply_result){ .applied = true, .version = res->dg_version,
						 .step = -1 };
		return;
	}
	json_t *j = json_loadb(body ? body : "", len, 0, NULL);
	json_t *applied = json_object_get(j, "applied"), *step = json_object_get(j, "step");

	out->applied = applied ? json_is_true(applied) : res->status == 200;
	out->version = (uint64_t)json_integer_value(json_object_get(j, "version"));
	if (!out->version)
		out->version = res->dg_version;
	out->pending = (int)json_integer_value(json_object_get(j, "pending"));
	out->step = step ? json_integer_value(step) : -1;
	json_decref(j);
}

/* dg_var_apply and dg_var_apply_value (value NULL: the former). */
static enum dg_status var_apply(struct dg_client *c, const char *name, const struct dg_apply *a,
				const struct dg_tensor *grad, struct dg_apply_result *res,
				struct dg_tensor **value, struct dg_var_info *info,
				struct dg_err *err)
{
	struct dg_http_header h[4];
	struct dg_http_result *r;
	struct dg_wire_scratch ws;
	enum dg_status st;
	/* Only an async apply can answer with the value (a sync one may wait). */
	bool want = value && a && a->step < 0;
	const void *body = grad ? grad->data : NULL;
	size_t len = grad ? grad->nbytes : 0;

	if (value)
		*value = NULL;
	if (!a || !grad)
		return dg_err_set(err, DG_EINVAL, "apply to variable '%s' without a rule or a "
				  "gradient", name ? name : "");
	if (a->rows && (a->n_rows < 0 || grad->shape.ndim < 1 || grad->shape.dim[0] != a->n_rows))
		return dg_err_set(err, DG_ESHAPE, "row-wise apply to '%s': %lld rows but the "
				  "update's dim 0 is %lld", name ? name : "", (long long)a->n_rows,
				  grad->shape.ndim > 0 ? (long long)grad->shape.dim[0] : -1LL);
	if ((st = path_set(c, "/v1/vars/", name, "/apply", err)) != DG_OK ||
	    (st = apply_query(c, a, err)) != DG_OK)
		return st;
	if (a->rows) {
		/* one body: the int64 row indices, then the values (the ps takes
		 * both from one request; the rows touched are few, the copy small) */
		size_t ib = (size_t)a->n_rows * 8;
		c->body.len = 0;
		if ((st = dg_buf_append(&c->body, a->rows, ib, err)) != DG_OK ||
		    (st = dg_buf_append(&c->body, grad->data, grad->nbytes, err)) != DG_OK)
			return st;
		body = c->body.data;
		len = c->body.len;
	}
	dg_wire_request_headers(grad->dtype, &grad->shape, &ws, h);
	/* An async apply needs only the new version: the server answers 204
	 * with Dg-Version and no JSON to build or parse. Asked for the value,
	 * it answers 200 with the raw value, as a GET does. */
	h[3] = (struct dg_http_header){ "Prefer", want ? "return=representation" :
					"return=minimal" };
	r = res_begin(c);
	r->aligned_body = want;         /* the body becomes the value's data */
	st = send_req(c, "POST", h, a->step < 0 ? 4 : 3, body, len, r, err);
	if (st == DG_OK && r->status != 200 && r->status != 202 && r->status != 204)
		st = unexpected(c, "POST", r, err);
	if (st == DG_OK && want && r->status == 200 && r->dg_dtype[0]) {
		/* The value: its headers give the new version. */
		struct dg_var_info v;
		st = decode_var(c, name, r, value, &v, err);
		if (st == DG_OK && res)
			*res = (struct dg_apply_result){ .applied = true, .version = v.version,
							 .step = -1 };
		if (st == DG_OK && info)
			*info = v;
	} else if (st == DG_OK && res) {
		/* JSON or 204 (a server that does not send the value). */
		if (want && r->aligned)
			apply_reply(r, r->aligned, r->aligned_len, res);
		else
			apply_reply(r, r->body.data, r->body.len, res);
	}
	res_end(c);
	return st;
}

enum dg_status dg_var_apply(struct dg_client *c, const char *name, const struct dg_apply *a,
			    const struct dg_tensor *grad, struct dg_apply_result *res,
			    struct dg_err *err)
{
	return var_apply(c, name, a, grad, res, NULL, NULL, err);
}

enum dg_status dg_var_apply_value(struct dg_client *c, const char *name,
				  const struct dg_apply *a, const struct dg_tensor *grad,
				  struct dg_apply_result *res, struct dg_tensor **value,
				  struct dg_var_info *info, struct dg_err *err)
{
	return var_apply(c, name, a, grad, res, value, info, err);
}

/* --- queues ----------------------------------------------------------------- */

static struct queue_layout *layout_find(struct dg_client *c, const char *name)
{
	for (int i = 0; i < QUEUE_CACHE; i++)
		if (c->queues[i].name[0] && strcmp(c->queues[i].name, name) == 0)
			return &c->queues[i];
	return NULL;
}

static void layout_forget(struct dg_client *c, const char *name)
{
	struct queue_layout *l = layout_find(c, name);

	if (l)
		l->name[0] = '\0';
}

/* Remember a queue's components (replacing its old entry or the oldest). */
static struct queue_layout *layout_store(struct dg_client *c, const char *name, int n,
					 const enum dg_dtype *dt, const struct dg_shape *shape)
{
	struct queue_layout *l = layout_find(c, name);

	if (!l) {
		l = &c->queues[c->queue_next];
		c->queue_next = (c->queue_next + 1) % QUEUE_CACHE;
	}
	snprintf(l->name, sizeof l->name, "%s", name);
	l->n = n;
	for (int i = 0; i < n; i++) {
		int64_t numel = 1;
		l->dtype[i] = dt[i];
		l->shape[i] = shape[i];
		/* Shapes came through dg_shape_numel on the server: no overflow. */
		for (int d = 0; d < shape[i].ndim; d++)
			numel *= shape[i].dim[d];
		l->example_bytes[i] = (size_t)numel * dg_dtype_size(dt[i]);
	}
	return l;
}

/* The "components" of a queue state -> dtypes and shapes (with checks: the
 * reply is input from a peer). */
static enum dg_status parse_components(const json_t *comps, enum dg_dtype *dt,
				       struct dg_shape *shape, int *n, struct dg_err *err)
{
	const json_t *e, *d;
	size_t i, k;
	enum dg_status st;

	if (!json_is_array(comps) || json_array_size(comps) < 1 ||
	    json_array_size(comps) > DG_QUEUE_MAX_COMPONENTS)
		return dg_err_set(err, DG_EINVAL, "queue state has no valid \"components\"");
	json_array_foreach(comps, i, e) {
		const json_t *sh = json_object_get(e, "shape");
		st = dg_dtype_parse(json_string_value(json_object_get(e, "dtype")), &dt[i], err);
		if (st != DG_OK)
			return st;
		if (!json_is_array(sh) || json_array_size(sh) > DG_MAX_DIMS)
			return dg_err_set(err, DG_EINVAL, "queue component %zu has no valid shape",
					  i);
		shape[i].ndim = (int)json_array_size(sh);
		json_array_foreach(sh, k, d) {
			if (!json_is_integer(d) || json_integer_value(d) < 0)
				return dg_err_set(err, DG_EINVAL, "queue component %zu has a bad "
						  "dimension", i);
			shape[i].dim[k] = json_integer_value(d);
		}
		int64_t numel;
		if ((st = dg_shape_numel(&shape[i], &numel, err)) != DG_OK)
			return st;
	}
	*n = (int)json_array_size(comps);
	return DG_OK;
}

/* The layout of a queue: cached, or fetched with GET /v1/queues/NAME. */
static enum dg_status layout_get(struct dg_client *c, const char *name, bool refresh,
				 struct queue_layout **out, struct dg_err *err)
{
	enum dg_dtype dt[DG_QUEUE_MAX_COMPONENTS];
	struct dg_shape shape[DG_QUEUE_MAX_COMPONENTS];
	json_t *j;
	int n = 0;
	enum dg_status st;

	*out = refresh ? NULL : layout_find(c, name);
	if (*out)
		return DG_OK;
	if ((st = dg_queue_state(c, name, &j, err)) != DG_OK)
		return st;
	st = parse_components(json_object_get(j, "components"), dt, shape, &n, err);
	json_decref(j);
	if (st != DG_OK) {
		dg_err_prefix(err, "queue '%s' on %s", name, dg_http_client_url(c->http));
		return st;
	}
	*out = layout_store(c, name, n, dt, shape);
	return DG_OK;
}

enum dg_status dg_queue_create(struct dg_client *c, const char *name,
			       const struct dg_queue_spec *spec, struct dg_err *err)
{
	struct dg_http_header h = { "Content-Type", "application/json" };
	struct dg_http_result *res;
	json_t *j;
	char *text;
	enum dg_status st;

	if (!spec || spec->n_components < 1 || spec->n_components > DG_QUEUE_MAX_COMPONENTS)
		return dg_err_set(err, DG_EINVAL, "queue '%s' needs 1 to %d components",
				  name ? name : "", DG_QUEUE_MAX_COMPONENTS);
	if ((st = path_set(c, "/v1/queues/", name, "", err)) != DG_OK)
		return st;
	j = dg_queue_spec_to_json(spec);
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!text)
		return dg_err_set(err, DG_ENOMEM, "out of memory encoding queue '%s'", name);
	res = res_begin(c);
	st = send_req(c, "POST", &h, 1, text, strlen(text), res, err);
	res_end(c);
	free(text);
	if (st == DG_OK)
		layout_store(c, name, spec->n_components, spec->dtype, spec->shape);
	return st;
}

/* Check the batches against a known layout before anything is sent. */
static enum dg_status check_batches(const struct queue_layout *l, const char *name, int64_t n,
				    const struct dg_tensor *const *comp, int n_comp,
				    struct dg_err *err)
{
	char got[128], want[128];

	if (n_comp != l->n)
		return dg_err_set(err, DG_EINVAL, "queue '%s' has %d components, got %d", name,
				  l->n, n_comp);
	for (int i = 0; i < n_comp; i++) {
		struct dg_shape s = { .ndim = l->shape[i].ndim + 1 };
		s.dim[0] = n;
		memcpy(&s.dim[1], l->shape[i].dim, sizeof s.dim[0] * (size_t)l->shape[i].ndim);
		if (comp[i]->dtype != l->dtype[i])
			return dg_err_set(err, DG_EDTYPE, "queue '%s' component %d is %s, got %s",
					  name, i, dg_dtype_name(l->dtype[i]),
					  dg_dtype_name(comp[i]->dtype));
		if (!dg_shape_eq(&s, &comp[i]->shape)) {
			dg_shape_format(&s, want, sizeof want);
			dg_shape_format(&comp[i]->shape, got, sizeof got);
			return dg_err_set(err, DG_ESHAPE, "queue '%s' component %d: a batch of %"
					  PRId64 " needs shape %s, got %s", name, i, n, want, got);
		}
	}
	return DG_OK;
}

enum dg_status dg_queue_enqueue(struct dg_client *c, const char *name, int64_t n,
				const struct dg_tensor *const *components, int n_components,
				long timeout_ms, struct dg_err *err)
{
	struct dg_http_header h = { "Content-Type", "application/octet-stream" };
	struct dg_http_result *res;
	const struct queue_layout *l;
	const void *body;
	size_t len = 0;
	enum dg_status st;

	if (n < 1 || n_components < 1 || n_components > DG_QUEUE_MAX_COMPONENTS || !components)
		return dg_err_set(err, DG_EINVAL, "enqueue to '%s': %" PRId64 " examples of %d "
				  "components is not a batch", name ? name : "", n, n_components);
	for (int i = 0; i < n_components; i++) {
		if (!components[i] || components[i]->shape.ndim < 1 ||
		    components[i]->shape.dim[0] != n)
			return dg_err_set(err, DG_ESHAPE, "enqueue to '%s': component %d is not a "
					  "batch of %" PRId64 " examples", name ? name : "", i, n);
		len += components[i]->nbytes;
	}
	if ((l = name ? layout_find(c, name) : NULL) &&
	    (st = check_batches(l, name, n, components, n_components, err)) != DG_OK)
		return st;
	if ((st = path_set(c, "/v1/queues/", name, "/enqueue", err)) != DG_OK ||
	    (st = query_int(c, "n", n, err)) != DG_OK ||
	    (timeout_ms >= 0 && (st = query_int(c, "timeout_ms", timeout_ms, err)) != DG_OK))
		return st;
	/* Component-major body: batch 0's bytes, then batch 1's, ... One
	 * component is sent from the tensor itself. */
	body = components[0]->data;
	if (n_components > 1) {
		c->body.len = 0;
		for (int i = 0; st == DG_OK && i < n_components; i++)
			st = dg_buf_append(&c->body, components[i]->data, components[i]->nbytes,
					   err);
		if (st != DG_OK)
			return st;
		body = c->body.data;
	}
	res = res_begin(c);
	st = send_req(c, "POST", &h, 1, body, len, res, err);
	res_end(c);
	return st;
}

enum dg_status dg_queue_enqueue_body(struct dg_client *c, const char *name, int64_t n,
				     const void *body, size_t len, long timeout_ms,
				     struct dg_err *err)
{
	struct dg_http_header h = { "Content-Type", "application/octet-stream" };
	struct dg_http_result *res;
	enum dg_status st;

	if (n < 1)
		return dg_err_set(err, DG_EINVAL, "enqueue to '%s': %" PRId64 " is not a batch",
				  name ? name : "", n);
	if ((st = path_set(c, "/v1/queues/", name, "/enqueue", err)) != DG_OK ||
	    (st = query_int(c, "n", n, err)) != DG_OK ||
	    (timeout_ms >= 0 && (st = query_int(c, "timeout_ms", timeout_ms, err)) != DG_OK))
		return st;
	res = res_begin(c);
	st = send_req(c, "POST", &h, 1, body, len, res, err);
	res_end(c);
	return st;
}

/* Split a dequeue body of got examples into out[0..l->n). False when the
 * length does not match the layout. */
static bool split_fits(const struct queue_layout *l, int64_t got, size_t len)
{
	size_t per = 0;

	for (int i = 0; i < l->n; i++)
		per += l->example_bytes[i];
	return got >= 0 && (per == 0 ? len == 0 : (len % per == 0 && len / per == (size_t)got));
}

static enum dg_status split_batch(const struct queue_layout *l, const char *name, int64_t got,
				  const char *p, struct dg_tensor **out, struct dg_err *err)
{
	for (int i = 0; i < l->n; i++) {
		struct dg_shape s = { .ndim = l->shape[i].ndim + 1 };
		s.dim[0] = got;
		memcpy(&s.dim[1], l->shape[i].dim, sizeof s.dim[0] * (size_t)l->shape[i].ndim);
		out[i] = dg_tensor_new_uninit(l->dtype[i], &s, err);
		if (!out[i]) {
			for (int k = 0; k < i; k++) {
				dg_tensor_free(out[k]);
				out[k] = NULL;
			}
			dg_err_prefix(err, "dequeue from '%s'", name);
			return err ? err->code : DG_ENOMEM;
		}
		if (out[i]->nbytes) {
			memcpy(out[i]->data, p, out[i]->nbytes);
			p += out[i]->nbytes;
		}
	}
	return DG_OK;
}

enum dg_status dg_queue_dequeue(struct dg_client *c, const char *name, int64_t n,
				long timeout_ms, bool allow_smaller, struct dg_tensor **out,
				int n_components, int64_t *got, struct dg_err *err)
{
	return dg_queue_dequeue_lease(c, name, n, timeout_ms, allow_smaller, NULL, out,
				      n_components, got, NULL, err);
}

enum dg_status dg_queue_dequeue_lease(struct dg_client *c, const char *name, int64_t n,
				      long timeout_ms, bool allow_smaller,
				      const struct dg_queue_lease *lease, struct dg_tensor **out,
				      int n_components, int64_t *got, uint64_t *lease_id,
				      struct dg_err *err)
{
	struct dg_http_result *res;
	struct queue_layout *l;
	int64_t count;
	enum dg_status st;

	for (int i = 0; out && i < n_components; i++)
		out[i] = NULL;
	*got = 0;
	if (lease_id)
		*lease_id = 0;
	if (n < 1 || !out)
		return dg_err_set(err, DG_EINVAL, "dequeue from '%s': %" PRId64 " is not a batch "
				  "size", name ? name : "", n);
	if ((st = dg_var_name_check(name ? name : "", err)) != DG_OK)
		return st;
	if ((st = layout_get(c, name, false, &l, err)) != DG_OK)
		return st;
	/* A stale cache entry (the queue was recreated) is refreshed before the
	 * caller is told it asked for the wrong number of components. */
	if (l->n != n_components && (st = layout_get(c, name, true, &l, err)) != DG_OK)
		return st;
	if (l->n != n_components)
		return dg_err_set(err, DG_EINVAL, "queue '%s' has %d components, the caller "
				  "takes %d", name, l->n, n_components);
	if ((st = path_set(c, "/v1/queues/", name, "/dequeue", err)) != DG_OK ||
	    (st = query_int(c, "n", n, err)) != DG_OK ||
	    (timeout_ms >= 0 && (st = query_int(c, "timeout_ms", timeout_ms, err)) != DG_OK) ||
	    (allow_smaller && (st = query_int(c, "allow_smaller", 1, err)) != DG_OK) ||
	    (lease && (st = query_int(c, "lease_ms", lease->lease_ms, err)) != DG_OK) ||
	    (lease && lease->holder && lease->holder[0] &&
	     (st = query_str(c, "holder", lease->holder, err)) != DG_OK))
		return st;
	res = res_begin(c);
	st = send_req(c, "POST", NULL, 0, NULL, 0, res, err);
	count = res->dg_count >= 0 ? res->dg_count : n;
	if (st == DG_OK && lease && !res->dg_lease)
		st = dg_err_set(err, DG_EINVAL, "dequeue from '%s' on %s: the reply names no lease "
				"(Dg-Lease)", name, dg_http_client_url(c->http));
	if (st == DG_OK && lease_id)
		*lease_id = res->dg_lease;
	if (st == DG_OK && (count > n || !split_fits(l, count, res->body.len))) {
		/* The examples are already taken: re-read the layout once (the
		 * queue may have been recreated) before calling the reply bad. The
		 * body leaves c->res first, which the state request reuses. */
		struct dg_buf body = res->body;
		dg_buf_init(&res->body);
		st = layout_get(c, name, true, &l, err);
		if (st == DG_OK && (count > n || l->n != n_components ||
				    !split_fits(l, count, body.len)))
			st = dg_err_set(err, DG_EINVAL, "dequeue from '%s' on %s: %zu bytes for %"
					PRId64 " examples do not match the queue's components",
					name, dg_http_client_url(c->http), body.len, count);
		if (st == DG_OK)
			st = split_batch(l, name, count, body.data, out, err);
		dg_buf_deinit(&body);
	} else if (st == DG_OK) {
		st = split_batch(l, name, count, res->body.data, out, err);
	}
	if (st == DG_OK)
		*got = count;
	res_end(c);
	return st;
}

/* The request on c->path (set) with no body, its 2xx reply's JSON into *out. */
static enum dg_status req_json(struct dg_client *c, const char *method, json_t **out,
			       struct dg_err *err)
{
	struct dg_http_result *res = res_begin(c);
	enum dg_status st = send_req(c, method, NULL, 0, NULL, 0, res, err);

	if (st == DG_OK)
		st = reply_json(c, res, out, err);
	res_end(c);
	return st;
}

/* Integer member key of j, or 0. */
static int64_t json_int_of(const json_t *j, const char *key)
{
	const json_t *v = json_object_get(j, key);

	return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

enum dg_status dg_queue_lease_end(struct dg_client *c, const char *name, uint64_t lease,
				  enum dg_lease_end how, int64_t *n, struct dg_err *err)
{
	static const char *const suffix[] = { "/ack", "/ack", "/release" };
	static const char *const count[] = { "acked", "dropped", "requeued" };
	json_t *j = NULL;
	enum dg_status st;

	*n = 0;
	if ((unsigned)how > DG_LEASE_RELEASE || !lease)
		return dg_err_set(err, DG_EINVAL, "queue '%s': no lease to end", name ? name : "");
	if ((st = path_set(c, "/v1/queues/", name, suffix[how], err)) != DG_OK ||
	    (st = query_uint(c, "lease", lease, err)) != DG_OK ||
	    (how == DG_LEASE_DROP && (st = query_int(c, "drop", 1, err)) != DG_OK) ||
	    (st = req_json(c, "POST", &j, err)) != DG_OK)
		return st;
	*n = json_int_of(j, count[how]);
	json_decref(j);
	return DG_OK;
}

enum dg_status dg_queue_release_holder(struct dg_client *c, const char *name,
				       const char *holder, int64_t *n, struct dg_err *err)
{
	json_t *j = NULL;
	enum dg_status st;

	*n = 0;
	if ((st = path_set(c, "/v1/queues/", name, "/release", err)) != DG_OK ||
	    (st = query_str(c, "holder", holder, err)) != DG_OK ||
	    (st = req_json(c, "POST", &j, err)) != DG_OK)
		return st;
	*n = json_int_of(j, "requeued");
	json_decref(j);
	return DG_OK;
}

enum dg_status dg_queue_close(struct dg_client *c, const char *name, struct dg_err *err)
{
	struct dg_http_result *res;
	enum dg_status st;

	if ((st = path_set(c, "/v1/queues/", name, "/close", err)) != DG_OK)
		return st;
	res = res_begin(c);
	st = send_req(c, "POST", NULL, 0, NULL, 0, res, err);
	res_end(c);
	return st;
}

enum dg_status dg_queue_delete(struct dg_client *c, const char *name, struct dg_err *err)
{
	struct dg_http_result *res;
	enum dg_status st;

	if ((st = path_set(c, "/v1/queues/", name, "", err)) != DG_OK)
		return st;
	layout_forget(c, name);
	res = res_begin(c);
	st = send_req(c, "DELETE", NULL, 0, NULL, 0, res, err);
	res_end(c);
	return st;
}

enum dg_status dg_queue_state(struct dg_client *c, const char *name, json_t **out,
			      struct dg_err *err)
{
	enum dg_status st;

	*out = NULL;
	if ((st = path_set(c, "/v1/queues/", name, "", err)) != DG_OK)
		return st;
	return req_json(c, "GET", out, err);
}

enum dg_status dg_queue_peek(struct dg_client *c, const char *name, int64_t k, json_t **out,
			     struct dg_err *err)
{
	enum dg_status st;

	*out = NULL;
	if ((st = path_set(c, "/v1/queues/", name, "/peek", err)) != DG_OK ||
	    (st = query_int(c, "n", k, err)) != DG_OK)
		return st;
	return req_json(c, "GET", out, err);
}

enum dg_status dg_queue_requeues(struct dg_client *c, const char *name, const char *prefix,
				 uint64_t after, int64_t k, json_t **out, struct dg_err *err)
{
	enum dg_status st;

	*out = NULL;
	if ((st = path_set(c, "/v1/queues/", name, "/requeues", err)) != DG_OK ||
	    (prefix && (st = query_str(c, "prefix", prefix, err)) != DG_OK) ||
	    (st = query_uint(c, "after", after, err)) != DG_OK ||
	    (st = query_int(c, "n", k, err)) != DG_OK)
		return st;
	return req_json(c, "GET", out, err);
}

enum dg_status dg_queue_list(struct dg_client *c, json_t **out, struct dg_err *err)
{
	enum dg_status st;

	*out = NULL;
	if ((st = path_plain(c, "/v1/queues", err)) != DG_OK)
		return st;
	return req_json(c, "GET", out, err);
}
