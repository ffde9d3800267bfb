/* The parameter server's HTTP routes (doc/http-api.md): one thin handler per
 * route that parses the request, calls the store (store.h) or the queues
 * (queue.h) and encodes the reply. The MHD side (auth, limits, JSON errors,
 * Dg-Epoch, metrics of each request) is core/src/http_server.c. Raw reads are
 * sent from the store's reference-counted block without a copy. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "dg/clock.h"
#include "dg/codec.h"
#include "dg/log.h"
#include "dg/wire.h"
#include "dg_config.h"
#include "routes.h"
#include "watch.h"

#define DEFAULT_TIMEOUT_MS 30000
#define MAX_EXAMPLES ((int64_t)1 << 31)   /* examples per enqueue/dequeue request */
#define MAX_ROWS ((int64_t)1 << 24)       /* row indices per request */

/* ------------------------------------------------------------ small helpers */

/* The {name...} parameter, checked against the naming rule. what: "variable"
 * or "queue", for the message. */
static enum dg_status name_arg(const struct dg_http_req *r, const char *what, const char **out,
			       struct dg_err *err)
{
	const char *name = dg_http_param(r, "name");
	enum dg_status st = dg_var_name_check(name, err);

	if (st != DG_OK) {
		/* the message quotes the name: the path is cut so that it stays */
		dg_err_prefix(err, "bad %s name in %.48s%s", what, dg_http_path(r),
			      strlen(dg_http_path(r)) > 48 ? "..." : "");
		return st;
	}
	*out = name;
	return DG_OK;
}

/* An integer query parameter in lo..hi; def when absent. */
static enum dg_status query_range(const struct dg_http_req *r, const char *key, int64_t def,
				  int64_t lo, int64_t hi, int64_t *out, struct dg_err *err)
{
	enum dg_status st = dg_http_query_int(r, key, def, out, err);

	if (st != DG_OK)
		return st;
	if (*out < lo || *out > hi) {
		dg_err_set(err, DG_EINVAL, "query parameter %s=%" PRId64 " is outside %" PRId64
			   "..%" PRId64, key, *out, lo, hi);
		return DG_EINVAL;
	}
	return DG_OK;
}

/* A 0/1 query flag: absent = false; "?flag", "1", "true" = true; "0", "false". */
static enum dg_status query_flag(const struct dg_http_req *r, const char *key, bool *out,
				 struct dg_err *err)
{
	const char *v = dg_http_query(r, key);

	*out = false;
	if (!v || !strcmp(v, "0") || !strcasecmp(v, "false"))
		return DG_OK;
	if (!v[0] || !strcmp(v, "1") || !strcasecmp(v, "true")) {
		*out = true;
		return DG_OK;
	}
	dg_err_set(err, DG_EINVAL, "query parameter %s='%.40s' is not 0 or 1", key, v);
	return DG_EINVAL;
}

/* A floating-point query parameter in [lo, hi] (finite); required ones have
 * no default. */
static enum dg_status query_real(const struct dg_http_req *r, const char *key, bool required,
				 double def, double lo, double hi, double *out, struct dg_err *err)
{
	const char *rule = dg_http_query(r, "rule");
	enum dg_status st;

	if (required && !dg_http_query(r, key)) {
		dg_err_set(err, DG_EINVAL, "rule %s needs the query parameter %s", rule, key);
		dg_err_hint(err, "e.g. POST /v1/vars/NAME/apply?rule=%s&%s=0.01", rule, key);
		return DG_EINVAL;
	}
	if ((st = dg_http_query_double(r, key, def, out, err)) != DG_OK)
		return st;
	if (!isfinite(*out) || *out < lo || *out > hi) {
		dg_err_set(err, DG_EINVAL, "query parameter %s=%g is outside [%g, %g]", key, *out,
			   lo, hi);
		return DG_EINVAL;
	}
	return DG_OK;
}

/* Digits [0-9]+ without overflow; returns the end, or NULL. */
static const char *scan_u64(const char *p, uint64_t *out)
{
	uint64_t v = 0;
	const char *start = p;

	for (; *p >= '0' && *p <= '9'; p++) {
		unsigned d = (unsigned)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			return NULL;
		v = v * 10 + d;
	}
	*out = v;
	return p == start ? NULL : p;
}

/* A version in an If-Match header (dg_wire_etag_parse); *out = 0 if absent. */
static enum dg_status if_match_arg(const struct dg_http_req *r, uint64_t *out,
				   struct dg_err *err)
{
	const char *h = dg_http_header(r, "If-Match");

	*out = 0;
	return h ? dg_wire_etag_parse(h, out, err) : DG_OK;
}

/* If-None-Match: * (create only); other values are refused. */
static enum dg_status if_none_match_arg(const struct dg_http_req *r, bool *out,
					struct dg_err *err)
{
	const char *h = dg_http_header(r, "If-None-Match");

	*out = false;
	if (!h)
		return DG_OK;
	while (*h == ' ')
		h++;
	if (h[0] == '*' && (h[1] == '\0' || h[1] == ' ')) {
		*out = true;
		return DG_OK;
	}
	dg_err_set(err, DG_EINVAL, "If-None-Match '%.40s' is not supported on writes", h);
	dg_err_hint(err, "If-None-Match: * creates only; If-Match: \"V\" is compare-and-set");
	return DG_EINVAL;
}

/* Dg-Dtype, Dg-Shape, Dg-Version, ETag and (mtime > 0) Last-Modified. */
static void tensor_headers(struct dg_http_resp *w, enum dg_dtype dt, const struct dg_shape *s,
			   uint64_t version, double mtime)
{
	char buf[64];
	time_t secs = (time_t)mtime;
	struct tm tm;

	dg_wire_add_tensor_headers(w, dt, s);
	dg_wire_add_version_headers(w, version);
	if (mtime > 0 && gmtime_r(&secs, &tm) &&
	    strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm) > 0)
		dg_http_add_header(w, "Last-Modified", buf);
}

/* The tensor headers of a stored value, and Dg-Step: its sync step. */
static void value_headers(struct dg_http_resp *w, const struct ps_value *v)
{
	char buf[24];

	tensor_headers(w, v->dtype, &v->shape, v->version, v->mtime);
	snprintf(buf, sizeof buf, "%" PRId64, v->step);
	dg_http_add_header(w, "Dg-Step", buf);
}

static json_t *shape_json(const struct dg_shape *s)
{
	json_t *a = json_array();

	for (int i = 0; a && i < s->ndim; i++)
		json_array_append_new(a, json_integer(s->dim[i]));
	return a;
}

/* {"name","version","dtype","shape","bytes"}: the reply of writes. */
static json_t *var_json(const char *name, enum dg_dtype dt, const struct dg_shape *s,
			size_t bytes, uint64_t version)
{
	return json_pack("{s:s, s:I, s:s, s:o, s:I}", "name", name, "version",
			 (json_int_t)version, "dtype", dg_dtype_name(dt), "shape", shape_json(s),
			 "bytes", (json_int_t)bytes);
}

/* Send j (owned; NULL means jansson ran out of memory). */
static enum dg_status reply_json(struct dg_http_resp *w, int status, json_t *j, struct dg_err *err)
{
	if (!j)
		return dg_err_set(err, DG_ENOMEM, "out of memory building the JSON reply");
	dg_http_set_json(w, status, j);
	return DG_OK;
}

/* A view of a store value as a tensor (borrowed data, for the encoders). */
static struct dg_tensor value_tensor(const struct ps_value *v)
{
	struct dg_tensor t = { .dtype = v->dtype, .shape = v->shape, .nbytes = v->nbytes,
			       .data = (void *)v->data };

	t.numel = (int64_t)(v->nbytes / dg_dtype_size(v->dtype));
	return t;
}

static void value_release(void *ud)
{
	ps_value_release(ud);
}

/* --------------------------------------------------------------------- rows */

/* ?rows=LIST: row indices and inclusive ranges A-B, comma-separated, in the
 * order given, repeats kept ("3,0-2,3" is 3 0 1 2 3); at most MAX_ROWS.
 * *out owned. */
static enum dg_status rows_arg(const char *s, int64_t **out, int64_t *n, struct dg_err *err)
{
	int64_t *v = NULL, k = 0, cap = 0;
	const char *p = s;

	*out = NULL;
	*n = 0;
	for (;;) {
		uint64_t a, b;
		const char *q = scan_u64(p, &a);
		if (!q)
			goto bad;
		b = a;
		if (*q == '-' && (!(q = scan_u64(q + 1, &b)) || b < a))
			goto bad;
		if (b >= (uint64_t)INT64_MAX || b - a >= (uint64_t)(MAX_ROWS - k)) {
			free(v);
			dg_err_set(err, DG_EINVAL, "rows='%.60s' names more than %" PRId64 " rows "
				   "(or a row past 2^63)", s, MAX_ROWS);
			dg_err_hint(err, "read a large part with Range: bytes=... instead");
			return DG_EINVAL;
		}
		if (k + (int64_t)(b - a) + 1 > cap) {
			cap = k + (int64_t)(b - a) + 1 + cap;
			int64_t *nv = realloc(v, (size_t)cap * sizeof *nv);
			if (!nv) {
				free(v);
				return dg_err_set(err, DG_ENOMEM, "out of memory for rows");
			}
			v = nv;
		}
		for (uint64_t x = a; x <= b; x++)
			v[k++] = (int64_t)x;
		if (!*q)
			break;
		if (*q != ',')
			goto bad;
		p = q + 1;
	}
	*out = v;
	*n = k;
	return DG_OK;
bad:
	free(v);
	dg_err_set(err, DG_EINVAL, "rows='%.60s' is not a list of rows", s);
	dg_err_hint(err, "e.g. rows=3, rows=0-99 (inclusive) or rows=7,1,20-29");
	return DG_EINVAL;
}

/* The dtype and shape of a body of n rows of variable name: Dg-Dtype and
 * Dg-Shape when given, else the variable's dtype and [n] + its shape[1:]. */
static enum dg_status rows_desc(struct ps_ctx *c, const struct dg_http_req *r, const char *name,
				int64_t n, struct dg_wire_desc *d, struct dg_err *err)
{
	struct ps_value *v = NULL;
	enum dg_status st = dg_wire_req_desc(r, d, err);

	if (st != DG_OK || (d->has_dtype && d->has_shape))
		return st;
	if ((st = ps_store_get(c->store, name, &v, err)) != DG_OK)
		return st;
	if (v->shape.ndim < 1) {
		ps_value_release(v);
		dg_err_set(err, DG_ESHAPE, "'%s' is a scalar: it has no rows", name);
		dg_err_hint(err, "update it without rows");
		return DG_ESHAPE;
	}
	if (!d->has_dtype)
		d->dtype = v->dtype;
	if (!d->has_shape) {
		d->shape = v->shape;
		d->shape.dim[0] = n;
	}
	d->has_dtype = d->has_shape = true;
	ps_value_release(v);
	return DG_OK;
}

static void tensor_release(void *ud)
{
	dg_tensor_free(ud);
}

/* Reply with tensor t (taken) in enc: headers of t's dtype and shape with
 * the version, mtime and step of the value v it was read from. */
static enum dg_status send_part(struct dg_http_resp *w, const struct ps_value *v,
				struct dg_tensor *t, enum dg_encoding enc, struct dg_err *err)
{
	char buf[24];
	struct dg_buf *b;
	enum dg_status st;

	tensor_headers(w, t->dtype, &t->shape, v->version, v->mtime);
	snprintf(buf, sizeof buf, "%" PRId64, v->step);
	dg_http_add_header(w, "Dg-Step", buf);
	if (enc == DG_ENC_RAW && t->nbytes > 0) {
		dg_http_set_body_ref(w, dg_encoding_mime(enc), t->data, t->nbytes, tensor_release,
				     t);
		return DG_OK;
	}
	if (!(b = dg_http_body_buf(w, dg_encoding_mime(enc)))) {
		dg_tensor_free(t);
		return dg_err_set(err, DG_ENOMEM, "out of memory encoding a reply");
	}
	st = enc == DG_ENC_NPY ? dg_npy_encode(t, b, err)
	     : enc == DG_ENC_TEXT ? dg_text_encode(t, b, err) : DG_OK;
	dg_tensor_free(t);
	return st;
}

/* ---------------------------------------------------------- request bodies */

/* The dtype and shape a body is read as: Dg-Dtype / Dg-Shape first, the
 * existing variable's for what they leave out. must_exist: a missing
 * variable is DG_ENOTFOUND (apply) when it is looked up. */
static enum dg_status body_desc(struct ps_ctx *c, const struct dg_http_req *r, const char *name,
				bool must_exist, struct dg_wire_desc *d, struct dg_err *err)
{
	struct ps_value *v = NULL;
	enum dg_status st = dg_wire_req_desc(r, d, err);

	if (st != DG_OK || (d->has_dtype && d->has_shape))
		return st;
	st = ps_store_get(c->store, name, &v, err);
	if (st == DG_OK) {
		if (!d->has_dtype)
			d->dtype = v->dtype;
		if (!d->has_shape)
			d->shape = v->shape;
		d->has_dtype = d->has_shape = true;
		ps_value_release(v);
	}
	if (st == DG_ENOTFOUND && !must_exist) {
		dg_err_clear(err);
		st = DG_OK;
	}
	return st;
}

/* The tensor in the request body, in the request's encoding (owned; a raw
 * body is adopted, not copied). must_exist: see body_desc. */
static enum dg_status body_tensor(struct ps_ctx *c, struct dg_http_req *r, const char *name,
				  bool must_exist, struct dg_tensor **out, struct dg_err *err)
{
	struct dg_wire_desc d = { 0 };
	enum dg_encoding enc;
	enum dg_status st;

	*out = NULL;
	if ((st = dg_wire_req_encoding(r, false, &enc, err)) != DG_OK)
		return st;
	if (enc != DG_ENC_NPY && (st = body_desc(c, r, name, must_exist, &d, err)) != DG_OK)
		return st;
	if ((st = dg_wire_req_tensor(r, enc, &d, out, err)) != DG_OK)
		dg_err_prefix(err, "%s body for '%s'", dg_encoding_name(enc), name);
	return st;
}

/* ------------------------------------------------------------ long waits */

/* One slice of a wait: returns DG_ETIMEOUT when nothing happened in slice_ms
 * (and then must have had no effect). */
typedef enum dg_status (*slice_fn)(void *arg, int64_t slice_ms, struct dg_err *err);

/* Run op in slices of PS_WAIT_SLICE_MS until it returns anything but
 * DG_ETIMEOUT, timeout_ms passes (DG_ETIMEOUT naming what) or the server is
 * stopping (DG_EUNAVAILABLE). */
static enum dg_status sliced_wait(struct ps_ctx *c, const char *what, int64_t timeout_ms,
				  slice_fn op, void *arg, struct dg_err *err)
{
	struct dg_deadline deadline = dg_deadline_in_ms(timeout_ms > 0 ? timeout_ms : 0);

	for (;;) {
		int64_t left = dg_deadline_left_ms(deadline);
		int64_t slice = left < PS_WAIT_SLICE_MS ? (left > 0 ? left : 0) : PS_WAIT_SLICE_MS;
		enum dg_status st = op(arg, slice, err);

		if (st == DG_ETIMEOUT && slice >= left) {
			dg_err_set(err, DG_ETIMEOUT, "%s: nothing after %" PRId64 " ms", what,
				   timeout_ms);
			dg_err_hint(err, "retry, or give a longer ?timeout_ms= (at most %d)",
				    PS_MAX_TIMEOUT_MS);
		}
		if (st != DG_ETIMEOUT || slice >= left)
			return st;
		if (atomic_load(&c->stopping))
			return dg_err_set(err, DG_EUNAVAILABLE, "%s: the server is stopping", what);
	}
}

struct var_wait {
	struct ps_store *store;
	const char *name;
	uint64_t min_version;
	int64_t min_step;               /* 0: no step condition */
	struct ps_value **out;          /* the current value after a timeout */
};

static enum dg_status var_wait_slice(void *arg, int64_t slice_ms, struct dg_err *err)
{
	struct var_wait *a = arg;

	ps_value_release(*a->out);
	*a->out = NULL;
	return ps_store_wait_step(a->store, a->name, a->min_version, a->min_step, slice_ms,
				  a->out, err);
}

/* --------------------------------------------------------- variable routes */

/* ------------------------------------------------------------- the watch */

struct watch_out {
	struct dg_buf *b;
	enum dg_status st;
};

static void watch_line(void *ud, const struct ps_watch_event *e)
{
	struct watch_out *o = ud;
	json_t *j = json_pack("{s:I, s:s, s:I, s:s, s:f}", "seq", (json_int_t)e->seq, "name",
			      e->name, "version", (json_int_t)e->version, "event",
			      ps_watch_kind_name(e->kind), "time", e->time);
	char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;

	if (!line || dg_buf_append(o->b, line, strlen(line), NULL) != DG_OK ||
	    dg_buf_append(o->b, "\n", 1, NULL) != DG_OK)
		o->st = DG_ENOMEM;
	free(line);
	json_decref(j);
}

/* GET /v1/vars?watch=1[&after=SEQ][&epoch=E][&prefix=P][&max=N][&timeout_ms=T]:
 * the changes after position SEQ (default: from now), as JSON lines, once
 * there is at least one or after T ms (none); Dg-Count says where to
 * resume. A position this run cannot answer for (fallen out of the log, or
 * of another epoch) gives one line {"event":"reset"}: re-read what you keep. */
static enum dg_status h_var_watch(struct ps_ctx *c, struct dg_http_req *r,
				  struct dg_http_resp *w, struct dg_err *err)
{
	struct ps_watch *wl = ps_store_watch(c->store);
	int64_t after, epoch, max, timeout;
	uint64_t next = 0;
	bool reset = false;
	enum dg_status st;
	char seq[24];

	if ((st = query_range(r, "after", 0, 0, INT64_MAX, &after, err)) != DG_OK ||
	    (st = query_range(r, "epoch", 0, 0, INT64_MAX, &epoch, err)) != DG_OK ||
	    (st = query_range(r, "max", 1000, 1, 100000, &max, err)) != DG_OK ||
	    (st = query_range(r, "timeout_ms", DEFAULT_TIMEOUT_MS, 0, PS_MAX_TIMEOUT_MS,
			      &timeout, err)) != DG_OK)
		return st;
	if (!dg_http_query(r, "after"))
		after = (int64_t)ps_watch_seq(wl);      /* from now */
	struct watch_out o = { .b = dg_http_body_buf(w, "application/x-ndjson"), .st = DG_OK };
	if (!o.b)
		return dg_err_set(err, DG_ENOMEM, "out of memory watching");
	if (epoch && (uint64_t)epoch != ps_store_epoch(c->store)) {
		reset = true;
		next = ps_watch_seq(wl);
	} else {
		/* in slices, so that a stopping server is not held up */
		struct dg_deadline dl = dg_deadline_in_ms(timeout);
		int got;
		for (;;) {
			int64_t left = dg_deadline_left_ms(dl);
			got = ps_watch_read(wl, (uint64_t)after, dg_http_query(r, "prefix"), (int)max,
					    left < PS_WAIT_SLICE_MS ? left : PS_WAIT_SLICE_MS,
					    watch_line, &o, &next, &reset);
			after = (int64_t)next;
			if (got > 0 || reset || left <= PS_WAIT_SLICE_MS ||
			    atomic_load(&c->stopping))
				break;
		}
	}
	if (reset) {
		char line[64];
		int n = snprintf(line, sizeof line, "{\"event\":\"reset\",\"seq\":%" PRIu64 "}\n",
				 next);
		if (dg_buf_append(o.b, line, (size_t)n, NULL) != DG_OK)
			o.st = DG_ENOMEM;
	}
	if (o.st != DG_OK)
		return dg_err_set(err, o.st, "out of memory watching");
	snprintf(seq, sizeof seq, "%" PRIu64, next);
	dg_http_add_header(w, "Dg-Count", seq);
	dg_http_set_status(w, 200);
	return DG_OK;
}

static enum dg_status h_var_list(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				 struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct dg_var_info *v = NULL;
	json_t *list = NULL;
	enum dg_status st;
	bool watch;
	int n = 0;

	if ((st = query_flag(r, "watch", &watch, err)) != DG_OK)
		return st;
	if (watch)
		return h_var_watch(c, r, w, err);
	if (!(list = json_array()))
		return dg_err_set(err, DG_ENOMEM, "out of memory listing variables");
	st = ps_store_list(c->store, dg_http_query(r, "prefix"), &v, &n, err);
	for (int i = 0; st == DG_OK && i < n; i++) {
		json_t *e = var_json(v[i].name, v[i].dtype, &v[i].shape, v[i].bytes, v[i].version);
		if (!e || json_object_set_new(e, "mtime", json_real(v[i].mtime)) ||
		    json_object_set_new(e, "step", json_integer(v[i].step)) ||
		    json_array_append_new(list, e))
			st = dg_err_set(err, DG_ENOMEM, "out of memory listing variables");
	}
	free(v);
	if (st != DG_OK) {
		json_decref(list);
		return st;
	}
	return reply_json(w, 200, json_pack("{s:o}", "vars", list), err);
}

/* Answer v (takes the reference) in enc; with Range (raw only) a part. */
static enum dg_status send_value(struct dg_http_req *r, struct dg_http_resp *w,
				 struct ps_value *v, enum dg_encoding enc, struct dg_err *err);

static enum dg_status h_var_get_rows(struct ps_ctx *c, struct dg_http_req *r,
				     struct dg_http_resp *w, const int64_t *rows, int64_t n_rows,
				     const struct dg_shape *lead, struct dg_err *err);

static enum dg_status h_var_get(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *list = dg_http_query(r, "rows");
	int64_t *rows = NULL, n_rows = 0;
	enum dg_status st;

	if (list && dg_http_header(r, "Range")) {
		dg_err_set(err, DG_EINVAL, "give ?rows= or a Range header, not both");
		dg_err_hint(err, "rows=A-B reads rows A to B; Range reads bytes");
		return DG_EINVAL;
	}
	if (list && (st = rows_arg(list, &rows, &n_rows, err)) != DG_OK)
		return st;
	st = h_var_get_rows(c, r, w, rows, n_rows, NULL, err);
	free(rows);
	return st;
}

/* GET (or HEAD) of a variable, or of rows of it (rows not NULL): [n_rows]
 * + shape[1:], or lead + shape[1:] when lead (of n_rows elements) is given. */
static enum dg_status h_var_get_rows(struct ps_ctx *c, struct dg_http_req *r,
				     struct dg_http_resp *w, const int64_t *rows, int64_t n_rows,
				     const struct dg_shape *lead, struct dg_err *err)
{
	struct ps_value *v = NULL;
	struct dg_tensor *t;
	const char *name;
	enum dg_encoding enc;
	int64_t min_version, min_step, timeout_ms;
	enum dg_status st;

	if ((st = name_arg(r, "variable", &name, err)) != DG_OK ||
	    (st = dg_wire_req_encoding(r, true, &enc, err)) != DG_OK ||
	    (st = query_range(r, "min_version", 0, 0, INT64_MAX, &min_version, err)) != DG_OK ||
	    (st = query_range(r, "min_step", 0, 0, INT64_MAX, &min_step, err)) != DG_OK ||
	    (st = query_range(r, "timeout_ms", DEFAULT_TIMEOUT_MS, 0, PS_MAX_TIMEOUT_MS,
			      &timeout_ms, err)) != DG_OK)
		return st;
	if (min_version > 0 || min_step > 0) {
		struct var_wait a = { c->store, name, (uint64_t)min_version, min_step, &v };
		st = sliced_wait(c, name, timeout_ms, var_wait_slice, &a, err);
	} else {
		st = ps_store_get(c->store, name, &v, err);
	}
	if (st == DG_ETIMEOUT && v) {
		/* The version (or step) did not come: 304 with the current headers. */
		value_headers(w, v);
		dg_http_set_status(w, 304);
		ps_value_release(v);
		dg_err_clear(err);
		return DG_OK;
	}
	if (st != DG_OK) {
		ps_value_release(v);
		return st;
	}
	if (rows) {
		st = ps_value_rows(v, name, rows, n_rows, &t, err);
		if (st == DG_OK && lead && lead->ndim + v->shape.ndim - 1 > DG_MAX_DIMS) {
			st = dg_err_set(err, DG_ESHAPE, "the rows of '%s' would have more than %d "
					"dims", name, DG_MAX_DIMS);
			dg_tensor_free(t);
		} else if (st == DG_OK && lead) {
			struct dg_shape sh = *lead;
			for (int i = 1; i < v->shape.ndim; i++)
				sh.dim[sh.ndim++] = v->shape.dim[i];
			t->shape = sh;
		}
		if (st == DG_OK)
			st = send_part(w, v, t, enc, err);
		ps_value_release(v);
		return st;
	}
	value_headers(w, v);
	return send_value(r, w, v, enc, err);
}

/* POST /v1/vars/NAME/rows: the rows a body of int32/int64 indices names,
 * of shape indices' + the variable's shape[1:] (what Gather gives); the
 * waits of GET (?min_version, ?min_step) work too. */
static enum dg_status h_var_rows(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				 struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct dg_tensor *idx = NULL;
	int64_t *rows = NULL;
	const char *name;
	enum dg_status st;

	if ((st = name_arg(r, "variable", &name, err)) != DG_OK ||
	    (st = dg_wire_req_body(r, &idx, err)) != DG_OK)
		return st;
	if (idx->dtype != DG_I32 && idx->dtype != DG_I64) {
		st = dg_err_set(err, DG_EDTYPE, "the row indices of '%s' are %s", name,
				dg_dtype_name(idx->dtype));
		dg_err_hint(err, "send int32 or int64 indices (Dg-Dtype: int64)");
	} else if (idx->numel > MAX_ROWS) {
		st = dg_err_set(err, DG_EINVAL, "%" PRId64 " row indices for '%s'; at most %" PRId64,
				idx->numel, name, MAX_ROWS);
	} else if (!(rows = malloc((size_t)(idx->numel + 1) * sizeof *rows))) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory for rows");
	}
	for (int64_t i = 0; st == DG_OK && i < idx->numel; i++)
		rows[i] = idx->dtype == DG_I32 ? ((const int32_t *)idx->data)[i]
					       : ((const int64_t *)idx->data)[i];
	if (st == DG_OK)
		st = h_var_get_rows(c, r, w, rows, idx->numel, &idx->shape, err);
	dg_tensor_free(idx);
	free(rows);
	return st;
}

/* Range: bytes=A-B | A- | -N, one range. *sat false: outside the total. */
static enum dg_status parse_range(const char *h, uint64_t total, uint64_t *first,
				  uint64_t *last, bool *sat, struct dg_err *err)
{
	uint64_t a = 0, b = UINT64_MAX;
	const char *p = h;

	if (strncasecmp(p, "bytes=", 6))
		goto bad;
	p += 6;
	if (*p == '-') {                /* suffix: the last b bytes */
		if (!(p = scan_u64(p + 1, &b)) || *p)
			goto bad;
		*sat = b > 0 && total > 0;
		*first = b >= total ? 0 : total - b;
		*last = total - 1;
		return DG_OK;
	}
	if (!(p = scan_u64(p, &a)) || *p++ != '-')
		goto bad;
	if (*p && (!(p = scan_u64(p, &b)) || *p || b < a))
		goto bad;
	*sat = a < total;
	*first = a;
	*last = b >= total ? total - 1 : b;
	return DG_OK;
bad:
	dg_err_set(err, DG_EINVAL, "Range '%.60s' is not one byte range", h);
	dg_err_hint(err, "e.g. Range: bytes=0-1023, bytes=1024- or bytes=-16");
	return DG_EINVAL;
}

static enum dg_status send_range(struct dg_http_resp *w, struct ps_value *v, const char *h,
				 struct dg_err *err)
{
	uint64_t first, last;
	bool sat;
	char cr[96];
	enum dg_status st = parse_range(h, v->nbytes, &first, &last, &sat, err);

	if (st != DG_OK) {
		ps_value_release(v);
		return st;
	}
	if (!sat) {
		snprintf(cr, sizeof cr, "bytes */%zu", v->nbytes);
		dg_http_add_header(w, "Content-Range", cr);
		ps_value_release(v);
		return reply_json(w, 416, json_pack("{s:{s:s, s:s, s:s}}", "error", "code",
						    dg_status_name(DG_EINVAL), "message",
						    "the range is outside the variable's bytes",
						    "hint", "see Content-Range for the size"), err);
	}
	snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%zu", first, last, v->nbytes);
	dg_http_add_header(w, "Content-Range", cr);
	dg_http_set_status(w, 206);
	dg_http_set_body_ref(w, dg_encoding_mime(DG_ENC_RAW), (const char *)v->data + first,
			     (size_t)(last - first + 1), value_release, v);
	return DG_OK;
}

static enum dg_status send_value(struct dg_http_req *r, struct dg_http_resp *w,
				 struct ps_value *v, enum dg_encoding enc, struct dg_err *err)
{
	const char *range = dg_http_header(r, "Range");
	struct dg_buf *b;
	struct dg_tensor t;
	enum dg_status st;

	if (range && enc == DG_ENC_RAW)
		return send_range(w, v, range, err);
	if (range) {
		ps_value_release(v);
		dg_err_set(err, DG_EINVAL, "Range works on the raw encoding only, not %s",
			   dg_encoding_name(enc));
		return DG_EINVAL;
	}
	if (enc == DG_ENC_RAW && v->nbytes > 0) {
		/* No copy: the block stays alive until the server has sent it. */
		dg_http_set_body_ref(w, dg_encoding_mime(enc), v->data, v->nbytes, value_release,
				     v);
		return DG_OK;
	}
	if (!(b = dg_http_body_buf(w, dg_encoding_mime(enc)))) {
		ps_value_release(v);
		return dg_err_set(err, DG_ENOMEM, "out of memory encoding a reply");
	}
	t = value_tensor(v);
	if (enc == DG_ENC_NPY) {
		st = dg_npy_encode_header(v->dtype, &v->shape, b, err);
		if (st == DG_OK)
			st = dg_buf_append(b, v->data, v->nbytes, err);
	} else {
		st = enc == DG_ENC_TEXT ? dg_text_encode(&t, b, err) : DG_OK;
	}
	ps_value_release(v);
	return st;
}

static enum dg_status h_var_put(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct ps_put_opts o = { 0 };
	struct dg_tensor *t = NULL;
	struct dg_shape shape;
	enum dg_dtype dt;
	const char *name;
	uint64_t version = 0;
	size_t nbytes;
	bool created = false;
	enum dg_status st;

	if ((st = name_arg(r, "variable", &name, err)) != DG_OK ||
	    (st = query_flag(r, "replace", &o.replace, err)) != DG_OK ||
	    (st = if_match_arg(r, &o.if_match, err)) != DG_OK ||
	    (st = if_none_match_arg(r, &o.create_only, err)) != DG_OK ||
	    (st = body_tensor(c, r, name, false, &t, err)) != DG_OK)
		return st;
	dt = t->dtype;
	shape = t->shape;
	nbytes = t->nbytes;
	/* The store takes t on every path; acknowledged means durable. */
	if ((st = ps_store_put(c->store, name, t, &o, &version, &created, err)) != DG_OK)
		return st;
	tensor_headers(w, dt, &shape, version, dg_wall_s());
	return reply_json(w, created ? 201 : 200, var_json(name, dt, &shape, nbytes, version), err);
}

/* Content-Range: bytes A-B/TOTAL or bytes A-B/ * (total -1). */
static enum dg_status parse_content_range(const char *h, uint64_t *first, uint64_t *last,
					  int64_t *total, struct dg_err *err)
{
	const char *p = h;
	uint64_t t;

	if (!h) {
		dg_err_set(err, DG_EINVAL, "PATCH needs a Content-Range header");
		dg_err_hint(err, "e.g. Content-Range: bytes 8-15/24 (byte offsets, inclusive)");
		return DG_EINVAL;
	}
	if (strncasecmp(p, "bytes ", 6) || !(p = scan_u64(p + 6, first)) || *p++ != '-' ||
	    !(p = scan_u64(p, last)) || *p++ != '/' || *last < *first)
		goto bad;
	if (p[0] == '*' && p[1] == '\0') {
		*total = -1;
		return DG_OK;
	}
	if (!(p = scan_u64(p, &t)) || *p || t > INT64_MAX)
		goto bad;
	*total = (int64_t)t;
	return DG_OK;
bad:
	dg_err_set(err, DG_EINVAL, "Content-Range '%.60s' is not 'bytes A-B/TOTAL' with A <= B", h);
	dg_err_hint(err, "e.g. Content-Range: bytes 8-15/24 or bytes 8-15/*");
	return DG_EINVAL;
}

/* A Content-Range total, when given, must be the variable's byte size. */
static enum dg_status check_total(struct ps_ctx *c, const char *name, int64_t total,
				  struct dg_err *err)
{
	struct ps_value *v = NULL;
	enum dg_status st;

	if (total < 0 || (st = ps_store_get(c->store, name, &v, err)) != DG_OK)
		return total < 0 ? DG_OK : st;
	if (v->nbytes != (uint64_t)total)
		st = dg_err_set(err, DG_EINVAL, "Content-Range total %" PRId64 " differs from the "
				"%zu bytes of variable '%s'", total, v->nbytes, name);
	ps_value_release(v);
	return st;
}

static enum dg_status h_var_patch(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				  struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name;
	const void *body;
	uint64_t first, last, if_match, version = 0;
	int64_t total;
	enum dg_encoding enc;
	size_t len;
	enum dg_status st;

	if ((st = name_arg(r, "variable", &name, err)) != DG_OK ||
	    (st = if_match_arg(r, &if_match, err)) != DG_OK ||
	    (st = dg_wire_req_encoding(r, false, &enc, err)) != DG_OK ||
	    (st = parse_content_range(dg_http_header(r, "Content-Range"), &first, &last, &total,
				      err)) != DG_OK)
		return st;
	body = dg_http_body(r, &len);
	if (enc != DG_ENC_RAW)
		return dg_err_set(err, DG_EINVAL, "a PATCH body is raw bytes, not %s",
				  dg_encoding_name(enc));
	if (len == 0 || len - 1 != last - first)
		return dg_err_set(err, DG_EINVAL, "PATCH body is %zu bytes but Content-Range "
				  "covers %" PRIu64, len, last - first + 1);
	if ((st = check_total(c, name, total, err)) != DG_OK ||
	    (st = ps_store_patch(c->store, name, first, body, len, if_match, &version, err)) !=
		    DG_OK)
		return st;
	dg_wire_add_version_headers(w, version);
	return reply_json(w, 200, json_pack("{s:s, s:I}", "name", name, "version",
					    (json_int_t)version), err);
}

static enum dg_status h_var_delete(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				   struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name;
	uint64_t if_match;
	enum dg_status st;

	if ((st = name_arg(r, "variable", &name, err)) != DG_OK ||
	    (st = if_match_arg(r, &if_match, err)) != DG_OK ||
	    (st = ps_store_delete(c->store, name, if_match, err)) != DG_OK)
		return st;
	return reply_json(w, 200, json_pack("{s:s, s:b}", "name", name, "deleted", 1), err);
}

/* The rule and its hyper-parameters (doc/http-api.md, POST /apply). sgd,
 * momentum, adagrad and rmsprop need lr, momentum needs momentum; the others
 * have TensorFlow 1.x's defaults. */
static enum dg_status apply_rule_args(const struct dg_http_req *r, struct ps_apply_args *a,
				      struct dg_err *err)
{
	const char *rule = dg_http_query(r, "rule");
	const double below_one = nextafter(1.0, 0.0);
	enum dg_status st;

	if (!rule) {
		dg_err_set(err, DG_EINVAL, "apply needs the query parameter rule");
		dg_err_hint(err, "rules: assign, assign_add, sgd, momentum, adam, adagrad, rmsprop, "
			    "moving_average");
		return DG_EINVAL;
	}
	if ((st = ps_rule_parse(rule, &a->rule, err)) != DG_OK)
		return st;
	if (a->rule == PS_MOVING_AVERAGE) {
		if (dg_http_query(r, "rho")) {
			dg_err_set(err, DG_EINVAL, "rule moving_average takes decay, not rho");
			return DG_EINVAL;
		}
		return query_real(r, "decay", false, 0.99, 0, 1, &a->rho, err);
	}
	/* adam alone has a default learning rate (TensorFlow's 0.001) */
	bool rms = a->rule == PS_RMSPROP, ada = a->rule == PS_ADAGRAD;
	if ((st = query_real(r, "lr", a->rule != PS_ADAM && a->rule >= PS_SGD, 0.001, -DBL_MAX,
			     DBL_MAX, &a->lr, err)) != DG_OK ||
	    (st = query_real(r, "momentum", a->rule == PS_MOMENTUM, 0, -DBL_MAX, DBL_MAX,
			     &a->momentum, err)) != DG_OK ||
	    (st = query_flag(r, "nesterov", &a->nesterov, err)) != DG_OK ||
	    (st = query_real(r, "beta1", false, 0.9, 0, below_one, &a->beta1, err)) != DG_OK ||
	    (st = query_real(r, "beta2", false, 0.999, 0, below_one, &a->beta2, err)) != DG_OK ||
	    (st = query_real(r, "eps", false, rms ? 1e-10 : 1e-8, DBL_MIN, DBL_MAX, &a->eps,
			     err)) != DG_OK ||
	    (st = query_real(r, "rho", false, 0.9, 0, below_one, &a->rho, err)) != DG_OK ||
	    (st = query_real(r, "init", false, ada ? 0.1 : 1.0, DBL_MIN, DBL_MAX, &a->init,
			     err)) != DG_OK)
		return st;
	return DG_OK;
}

/* Synchronous mode: step=S&replicas=N[&backup=K][&replica=R]; async: step -1. */
static enum dg_status apply_sync_args(const struct dg_http_req *r, struct ps_apply_args *a,
				      struct dg_err *err)
{
	int64_t n, k;
	enum dg_status st;

	if ((st = query_range(r, "step", -1, -1, INT64_MAX, &a->step, err)) != DG_OK ||
	    (st = query_range(r, "replicas", 0, 0, 65536, &n, err)) != DG_OK ||
	    (st = query_range(r, "backup", 0, 0, 65535, &k, err)) != DG_OK ||
	    (st = query_range(r, "replica", -1, -1, INT64_MAX, &a->replica, err)) != DG_OK)
		return st;
	a->replicas = (int)n;
	a->backup = (int)k;
	if (a->step < 0 && (dg_http_query(r, "replicas") || dg_http_query(r, "backup") ||
			    dg_http_query(r, "replica"))) {
		dg_err_set(err, DG_EINVAL, "replicas, backup and replica need step=S");
		dg_err_hint(err, "synchronous mode: ?step=S&replicas=N[&backup=K][&replica=R]");
		return DG_EINVAL;
	}
	if (a->step >= 0 && (n < 1 || k >= n))
		return dg_err_set(err, DG_EINVAL, "synchronous apply needs replicas=N >= 1 and "
				  "backup=K < N (got N=%" PRId64 ", K=%" PRId64 ")", n, k);
	return DG_OK;
}

/* Does the request's Prefer header (RFC 7240) hold pref, e.g.
 * "return=minimal" (a reply without a body)? */
static bool prefers(const struct dg_http_req *r, const char *pref)
{
	const char *h = dg_http_header(r, "Prefer");
	size_t n = strlen(pref);

	for (const char *p = h; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] != 0)) {
		p += strspn(p, " \t");
		if (!strncasecmp(p, pref, n) && strchr(",; \t", p[n]))
			return true;
	}
	return false;
}

/* An applied async update with Prefer: return=representation: 200 with the
 * variable's value as a raw body and its headers, as a GET answers (no copy).
 * The value is the one just after the apply, or a later one when another
 * apply came in between (async semantics). *sent false (nothing set) when
 * the variable is gone meanwhile: the caller answers the JSON instead. */
static enum dg_status apply_value_reply(struct ps_ctx *c, const char *name,
					struct dg_http_resp *w, bool *sent, struct dg_err *err)
{
	struct ps_value *v = NULL;
	struct dg_err gone = { 0 };

	*sent = false;
	if (ps_store_get(c->store, name, &v, &gone) != DG_OK)
		return DG_OK;
	if (v->nbytes == 0 && !dg_http_body_buf(w, dg_encoding_mime(DG_ENC_RAW))) {
		ps_value_release(v);
		return dg_err_set(err, DG_ENOMEM, "out of memory for an apply's reply");
	}
	value_headers(w, v);
	dg_http_set_status(w, 200);
	if (v->nbytes == 0)
		ps_value_release(v);
	else
		dg_http_set_body_ref(w, dg_encoding_mime(DG_ENC_RAW), v->data, v->nbytes,
				     value_release, v);
	*sent = true;
	return DG_OK;
}

/* An apply's reply. The small JSON is printed directly (an apply is the
 * hottest route of training; jansson's pack and dump cost more than the
 * update of a small variable). An applied async update with Prefer:
 * return=minimal gets 204 and the version headers alone; with Prefer:
 * return=representation 200 and the new value (apply_value_reply). */
static enum dg_status apply_reply(struct ps_ctx *c, const char *name,
				  const struct dg_http_req *r, struct dg_http_resp *w,
				  const struct ps_apply_args *a, const struct ps_apply_result *res,
				  struct dg_err *err)
{
	struct dg_buf *b;
	bool sent;
	enum dg_status st;

	if (res->applied && a->step < 0 && prefers(r, "return=representation")) {
		st = apply_value_reply(c, name, w, &sent, err);
		if (st != DG_OK || sent)
			return st;
	}
	if (res->applied)
		dg_wire_add_version_headers(w, res->version);
	if (res->applied && a->step < 0 && prefers(r, "return=minimal")) {
		dg_http_set_status(w, 204);
		return DG_OK;
	}
	if (!(b = dg_http_body_buf(w, "application/json")))
		return dg_err_set(err, DG_ENOMEM, "out of memory for an apply's reply");
	dg_http_set_status(w, res->applied ? 200 : 202);
	if (a->step < 0)
		return dg_buf_printf(b, err, "{\"applied\":%s,\"version\":%" PRIu64 "}\n",
				     res->applied ? "true" : "false", res->version);
	if (res->applied)
		return dg_buf_printf(b, err, "{\"applied\":true,\"version\":%" PRIu64
				     ",\"step\":%" PRId64 "}\n", res->version, res->step);
	return dg_buf_printf(b, err, "{\"applied\":false,\"pending\":%d,\"step\":%" PRId64
			     "}\n", res->pending, res->step);
}

/* A row-wise apply's rows and values: ?rows=LIST with a body of the rows'
 * values (any encoding), or ?row_count=N with a raw body of N int64 row
 * indices (little-endian) then the values. Neither: a dense apply (a->rows
 * stays NULL, *g NULL). *rows and *g owned. */
static enum dg_status apply_rows_body(struct ps_ctx *c, struct dg_http_req *r, const char *name,
				      struct ps_apply_args *a, int64_t **rows,
				      struct dg_tensor **g, struct dg_err *err)
{
	const char *list = dg_http_query(r, "rows");
	struct dg_wire_desc d = { 0 };
	enum dg_encoding enc;
	int64_t count = -1, numel;
	const char *body;
	size_t len = 0;
	enum dg_status st;

	*rows = NULL;
	*g = NULL;
	if ((dg_http_query(r, "row_count") &&
	     (st = query_range(r, "row_count", 0, 0, MAX_ROWS, &count, err)) != DG_OK) ||
	    (st = dg_wire_req_encoding(r, false, &enc, err)) != DG_OK)
		return st;
	if (!list && count < 0)
		return DG_OK;
	if (list && count >= 0) {
		dg_err_set(err, DG_EINVAL, "give rows=LIST or row_count=N, not both");
		dg_err_hint(err, "row_count=N: the raw body starts with N int64 row indices");
		return DG_EINVAL;
	}
	if (list) {
		if ((st = rows_arg(list, rows, &a->n_rows, err)) != DG_OK ||
		    (enc != DG_ENC_NPY && (st = rows_desc(c, r, name, a->n_rows, &d, err)) != DG_OK))
			goto fail;
		if ((st = dg_wire_req_tensor(r, enc, &d, g, err)) != DG_OK) {
			dg_err_prefix(err, "%s body for the rows of '%s'", dg_encoding_name(enc), name);
			goto fail;
		}
		a->rows = *rows;
		return DG_OK;
	}
	if (enc != DG_ENC_RAW) {
		dg_err_set(err, DG_EINVAL, "row_count=N takes a raw body, not %s",
			   dg_encoding_name(enc));
		dg_err_hint(err, "or give the rows in the query: rows=LIST");
		return DG_EINVAL;
	}
	body = dg_http_body(r, &len);
	if (len / 8 < (uint64_t)count) {
		dg_err_set(err, DG_EINVAL, "the body has %zu bytes: row_count=%" PRId64 " needs %"
			   PRId64 " bytes of int64 row indices first", len, count, count * 8);
		return DG_EINVAL;
	}
	if ((st = rows_desc(c, r, name, count, &d, err)) != DG_OK ||
	    (st = dg_shape_numel(&d.shape, &numel, err)) != DG_OK)
		return st;
	if ((size_t)numel * dg_dtype_size(d.dtype) != len - (size_t)count * 8) {
		char sh[160];
		dg_shape_format(&d.shape, sh, sizeof sh);
		dg_err_set(err, DG_EINVAL, "the body has %zu bytes of values after %" PRId64 " row "
			   "indices; %s %s takes %zu", len - (size_t)count * 8, count,
			   dg_dtype_name(d.dtype), sh, (size_t)numel * dg_dtype_size(d.dtype));
		return DG_EINVAL;
	}
	*rows = malloc((size_t)(count + 1) * sizeof **rows);
	*g = *rows ? dg_tensor_new_uninit(d.dtype, &d.shape, err) : NULL;
	if (!*g) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory for the rows of '%s'", name);
		goto fail;
	}
	if (count)
		memcpy(*rows, body, (size_t)count * 8);
	if ((*g)->nbytes)
		memcpy((*g)->data, body + count * 8, (*g)->nbytes);
	a->rows = *rows;
	a->n_rows = count;
	return DG_OK;
fail:
	free(*rows);
	*rows = NULL;
	dg_tensor_free(*g);
	*g = NULL;
	return st;
}

static enum dg_status h_var_apply(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				  struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct ps_apply_args a = { 0 };
	struct ps_apply_result res = { 0 };
	struct dg_tensor *g = NULL;
	int64_t *rows = NULL;
	const char *name;
	enum dg_status st;

	const char *lq = dg_http_query(r, "lease_queue");
	int64_t lease = 0, count = 0;
	bool drop = false;

	if ((st = name_arg(r, "variable", &name, err)) != DG_OK ||
	    (st = apply_rule_args(r, &a, err)) != DG_OK ||
	    (st = apply_sync_args(r, &a, err)) != DG_OK ||
	    (st = query_range(r, "lease", 0, 0, INT64_MAX, &lease, err)) != DG_OK ||
	    (st = query_range(r, "lease_count", 1, 1, 65536, &count, err)) != DG_OK ||
	    (st = query_flag(r, "lease_drop", &drop, err)) != DG_OK)
		return st;
	if (!lq != !lease || (lq && dg_var_name_check(lq, err) != DG_OK)) {
		dg_err_set(err, DG_EINVAL, "an apply that ends a queue lease needs lease=ID and "
			   "lease_queue=NAME (a valid queue name)");
		return DG_EINVAL;
	}
	if ((st = apply_rows_body(c, r, name, &a, &rows, &g, err)) != DG_OK)
		return st;
	if (!a.rows && (st = body_tensor(c, r, name, true, &g, err)) != DG_OK)
		return st;
	st = ps_store_apply(c->store, name, &a, g, &res, err);
	dg_tensor_free(g);
	free(rows);
	if (lq && (st == DG_OK || st == DG_ESTALE)) {
		/* The update landed (or was dropped): one of the step's applies that
		 * end its batch's lease here, in the same request, so that no worker
		 * can die between its update and its ack. */
		struct dg_err lerr = { 0 };
		bool ended;
		if (ps_queue_lease_apply(c->queues, lq, (uint64_t)lease, (int)count,
					 st == DG_ESTALE, !drop, &ended, &lerr) != DG_OK)
			dg_log(DG_LOG_WARN, "ps", "apply of '%s': %s", name, lerr.msg);
	}
	if (st != DG_OK)
		return st;
	return apply_reply(c, name, r, w, &a, &res, err);
}

/* ------------------------------------------------------------ queue routes */

/* The arguments of one blocking queue call, run in slices by sliced_wait. */
struct queue_op {
	struct ps_queues *qs;
	const char *name;
	int64_t n;
	const void *body;               /* enqueue */
	size_t len;
	bool allow_smaller;             /* dequeue */
	struct dg_buf *out;             /* dequeue */
	const struct ps_lease_opts *lease;      /* dequeue: NULL for none */
	int64_t got;
	uint64_t lease_id;
};

static enum dg_status enqueue_slice(void *arg, int64_t slice_ms, struct dg_err *err)
{
	struct queue_op *q = arg;

	return ps_queue_enqueue(q->qs, q->name, q->n, q->body, q->len, slice_ms, err);
}

static enum dg_status dequeue_slice(void *arg, int64_t slice_ms, struct dg_err *err)
{
	struct queue_op *q = arg;

	return ps_queue_dequeue_lease(q->qs, q->name, q->n, slice_ms, q->allow_smaller, q->lease,
				      q->out, &q->got, &q->lease_id, err);
}

/* name, n and timeout_ms of an enqueue or dequeue. */
static enum dg_status queue_op_args(const struct dg_http_req *r, struct queue_op *q,
				    int64_t *timeout_ms, struct dg_err *err)
{
	enum dg_status st;

	if ((st = name_arg(r, "queue", &q->name, err)) != DG_OK ||
	    (st = query_range(r, "n", 1, 1, MAX_EXAMPLES, &q->n, err)) != DG_OK ||
	    (st = query_range(r, "timeout_ms", DEFAULT_TIMEOUT_MS, 0, PS_MAX_TIMEOUT_MS,
			      timeout_ms, err)) != DG_OK)
		return st;
	return DG_OK;
}

static enum dg_status h_queue_list(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				   struct dg_err *err)
{
	struct ps_ctx *c = vc;

	return reply_json(w, 200, ps_queue_list(c->queues), err);
}

static enum dg_status h_queue_create(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				     struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct dg_queue_spec spec;
	json_error_t jerr;
	json_t *j, *state = NULL;
	const char *name;
	const void *body;
	size_t len;
	bool created = false;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK)
		return st;
	body = dg_http_body(r, &len);
	if (!(j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &jerr))) {
		dg_err_set(err, DG_EINVAL, "settings of queue '%s': bad JSON at line %d: %s",
			   name, jerr.line, jerr.text);
		dg_err_hint(err, "e.g. {\"capacity\":100,\"components\":[{\"dtype\":\"float32\","
			    "\"shape\":[784]}]}");
		return DG_EINVAL;
	}
	st = dg_queue_spec_from_json(j, &spec, err);
	json_decref(j);
	if (st == DG_OK)
		st = ps_queue_create(c->queues, name, &spec, &created, err);
	if (st == DG_OK)
		st = ps_queue_state(c->queues, name, &state, err);
	if (st != DG_OK)
		return st;
	return reply_json(w, created ? 201 : 200, state, err);
}

static enum dg_status h_queue_state(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				    struct dg_err *err)
{
	struct ps_ctx *c = vc;
	json_t *state = NULL;
	const char *name;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK ||
	    (st = ps_queue_state(c->queues, name, &state, err)) != DG_OK)
		return st;
	return reply_json(w, 200, state, err);
}

static enum dg_status h_queue_enqueue(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				      struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct queue_op q = { .qs = c->queues };
	int64_t timeout_ms;
	char what[320];
	enum dg_status st;

	if ((st = queue_op_args(r, &q, &timeout_ms, err)) != DG_OK)
		return st;
	q.body = dg_http_body(r, &q.len);
	snprintf(what, sizeof what, "queue '%s': enqueue of %" PRId64 " examples", q.name, q.n);
	if ((st = sliced_wait(c, what, timeout_ms, enqueue_slice, &q, err)) != DG_OK)
		return st;
	return reply_json(w, 200, json_pack("{s:s, s:I}", "name", q.name, "enqueued",
					    (json_int_t)q.n), err);
}

static enum dg_status h_queue_dequeue(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				      struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct queue_op q = { .qs = c->queues };
	struct ps_lease_opts lo = { 0 };
	int64_t timeout_ms;
	char what[320], count[24], lease[24];
	enum dg_status st;

	if ((st = queue_op_args(r, &q, &timeout_ms, err)) != DG_OK ||
	    (st = query_flag(r, "allow_smaller", &q.allow_smaller, err)) != DG_OK ||
	    (st = query_range(r, "lease_ms", 0, 0, PS_LEASE_MAX_MS, &lo.lease_ms, err)) != DG_OK)
		return st;
	lo.holder = dg_http_query(r, "holder");
	if (lo.holder && !lo.lease_ms)
		return dg_err_set(err, DG_EINVAL, "query parameter holder needs lease_ms");
	if (lo.holder && (strlen(lo.holder) > PS_LEASE_HOLDER_MAX ||
			  dg_var_name_check(lo.holder, err) != DG_OK)) {
		dg_err_set(err, DG_EINVAL, "query parameter holder must follow the naming rule "
			   "and be at most %d bytes", PS_LEASE_HOLDER_MAX);
		return DG_EINVAL;
	}
	if (lo.lease_ms > 0)
		q.lease = &lo;
	if (!(q.out = dg_http_body_buf(w, dg_encoding_mime(DG_ENC_RAW))))
		return dg_err_set(err, DG_ENOMEM, "out of memory for a dequeue reply");
	snprintf(what, sizeof what, "queue '%s': dequeue of %" PRId64 " examples", q.name, q.n);
	if ((st = sliced_wait(c, what, timeout_ms, dequeue_slice, &q, err)) != DG_OK)
		return st;
	snprintf(count, sizeof count, "%" PRId64, q.got);
	dg_http_add_header(w, "Dg-Count", count);
	if (q.lease_id) {
		snprintf(lease, sizeof lease, "%" PRIu64, q.lease_id);
		dg_http_add_header(w, "Dg-Lease", lease);
	}
	return DG_OK;
}

/* POST .../ack?lease=ID[&drop=1]: the lease's examples were consumed. */
static enum dg_status h_queue_ack(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				  struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name;
	int64_t lease, n;
	bool drop;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK ||
	    (st = query_range(r, "lease", 1, 1, INT64_MAX, &lease, err)) != DG_OK ||
	    (st = query_flag(r, "drop", &drop, err)) != DG_OK)
		return st;
	if (!dg_http_query(r, "lease"))
		return dg_err_set(err, DG_EINVAL, "ack needs the query parameter lease (the "
				  "Dg-Lease of a leased dequeue)");
	if ((st = ps_queue_lease_end(c->queues, name, (uint64_t)lease,
				     drop ? PS_LEASE_DROP : PS_LEASE_ACK, &n, err)) != DG_OK)
		return st;
	return reply_json(w, 200, json_pack("{s:s, s:I, s:I}", "name", name, "lease",
					    (json_int_t)lease, drop ? "dropped" : "acked",
					    (json_int_t)n), err);
}

/* POST .../release?lease=ID or ?holder=H: put leased examples back now. */
static enum dg_status h_queue_release(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				      struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name, *holder = dg_http_query(r, "holder");
	int64_t lease, n = 0, leases = 1;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK ||
	    (st = query_range(r, "lease", 1, 1, INT64_MAX, &lease, err)) != DG_OK)
		return st;
	if (!holder == !dg_http_query(r, "lease"))
		return dg_err_set(err, DG_EINVAL, "release needs one of the query parameters "
				  "lease (one lease) or holder (every lease of a holder)");
	if (holder)
		st = ps_queue_release_holder(c->queues, name, holder, &leases, &n, err);
	else
		st = ps_queue_lease_end(c->queues, name, (uint64_t)lease, PS_LEASE_RELEASE, &n,
					err);
	if (st != DG_OK)
		return st;
	return reply_json(w, 200, json_pack("{s:s, s:I, s:I}", "name", name, "leases",
					    (json_int_t)leases, "requeued", (json_int_t)n), err);
}

static enum dg_status h_queue_peek(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				   struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name;
	json_t *j;
	int64_t n;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK ||
	    (st = query_range(r, "n", 10, 0, 10000, &n, err)) != DG_OK ||
	    (st = ps_queue_peek(c->queues, name, n, &j, err)) != DG_OK)
		return st;
	return reply_json(w, 200, j, err);
}

static enum dg_status h_queue_ids(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				  struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name;
	json_t *j;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK ||
	    (st = ps_queue_id_counts(c->queues, name, &j, err)) != DG_OK)
		return st;
	return reply_json(w, 200, j, err);
}

/* GET .../requeues?prefix=P&after=SEQ&n=K: the requeue log (ps/queue.h). */
static enum dg_status h_queue_requeues(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				       struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name, *prefix = dg_http_query(r, "prefix");
	json_t *j;
	int64_t after, n;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK ||
	    (st = query_range(r, "after", 0, 0, INT64_MAX, &after, err)) != DG_OK ||
	    (st = query_range(r, "n", 1000, 1, 100000, &n, err)) != DG_OK)
		return st;
	if (prefix && strlen(prefix) > PS_LEASE_HOLDER_MAX)
		return dg_err_set(err, DG_EINVAL, "query parameter prefix is longer than a "
				  "holder (%d bytes)", PS_LEASE_HOLDER_MAX);
	if ((st = ps_queue_requeues(c->queues, name, prefix, (uint64_t)after, n, &j, err)) !=
	    DG_OK)
		return st;
	return reply_json(w, 200, j, err);
}

static enum dg_status h_queue_close(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				    struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK ||
	    (st = ps_queue_close(c->queues, name, err)) != DG_OK)
		return st;
	return reply_json(w, 200, json_pack("{s:s, s:b}", "name", name, "closed", 1), err);
}

static enum dg_status h_queue_delete(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				     struct dg_err *err)
{
	struct ps_ctx *c = vc;
	const char *name;
	enum dg_status st;

	if ((st = name_arg(r, "queue", &name, err)) != DG_OK ||
	    (st = ps_queue_delete(c->queues, name, err)) != DG_OK)
		return st;
	return reply_json(w, 200, json_pack("{s:s, s:b}", "name", name, "deleted", 1), err);
}

/* ------------------------------------------------------------ checkpoints */

static enum dg_status h_checkpoint(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				   struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct ps_ckpt_info info;
	enum dg_status st = ps_store_checkpoint_now(c->store, &info, err);

	if (st != DG_OK)
		return st;
	return reply_json(w, 200, json_pack("{s:I, s:I, s:I, s:f}", "epoch",
					    (json_int_t)info.epoch, "vars", (json_int_t)info.vars,
					    "bytes", (json_int_t)info.bytes, "ms", info.ms), err);
}

/* ------------------------------------------------------- health, metrics */

/* The GPUs the server program described (ps_server_config.devices), as health's
 * "gpus" array; NULL when out of memory. */
static json_t *gpus_json(const struct ps_devices *d)
{
	json_t *a = json_array();

	for (int i = 0; a && i < d->n_gpus; i++) {
		const struct ps_gpu *g = &d->gpus[i];
		char cc[24];
		json_t *o;

		snprintf(cc, sizeof cc, "%d.%d", g->cc_major, g->cc_minor);
		o = json_pack("{s:i, s:s, s:I, s:s}", "index", g->index, "name", g->name,
			      "memory_bytes", (json_int_t)g->mem_bytes, "compute_capability", cc);
		if (!o || json_array_append_new(a, o)) {
			json_decref(a);
			a = NULL;
		}
	}
	return a;
}

static enum dg_status h_health(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
			       struct dg_err *err)
{
	struct ps_ctx *c = vc;
	int64_t n_vars = 0, bytes = 0;
	const struct ps_devices *d = &c->devices;
	json_t *gpus = gpus_json(d);
	char why[600];
	bool degraded = ps_store_degraded(c->store, why, sizeof why);

	if (!gpus)
		return dg_err_set(err, DG_ENOMEM, "out of memory listing the GPUs for health");
	ps_store_stats(c->store, &n_vars, &bytes);
	/* "o" steals gpus, also when json_pack fails; "*" leaves out what the server
	 * program did not describe. */
	return reply_json(w, 200, json_pack(
		"{s:s, s:s, s:i, s:I, s:s, s:I, s:I, s:i, s:f, s:s*, s:s*, s:o, s:o*, s:[s,s*], "
		"s:o*, s:s, s:s*}",
		"status", atomic_load(&c->stopping) ? "stopping" : degraded ? "degraded" : "ok",
		"job", c->job,
		"task", c->task, "epoch", (json_int_t)ps_store_epoch(c->store),
		"version", DG_VERSION, "vars", (json_int_t)n_vars, "bytes", (json_int_t)bytes,
		"queues", ps_queue_count(c->queues),
		"uptime_s", dg_mono_s() - c->started,
		"blas", d->blas, "gpu", d->gpu, "gpus", gpus,
		"cuda_built", c->has_devices ? json_boolean(d->cuda_built) : NULL,
		"faces", "ps", c->worker_face ? "worker" : NULL,
		"snapshot_at", ps_store_snapshot_at(c->store) > 0 ?
			       json_real(ps_store_snapshot_at(c->store)) : NULL,
		"durability", ps_durability_name(ps_store_durability(c->store)),
		"degraded", degraded ? why : NULL), err);
}

/* dg_gpus and dg_gpu_memory_bytes{gpu,name}; the name is a label value, so '\\', '"'
 * and newlines in it are escaped as the Prometheus text format requires. */
static enum dg_status metrics_gpus(const struct ps_devices *d, struct dg_buf *b,
				   struct dg_err *err)
{
	int n = d->n_gpus;
	enum dg_status st = dg_buf_printf(b, err,
		"# HELP dg_gpus GPUs this process can use.\n# TYPE dg_gpus gauge\ndg_gpus %d\n"
		"# HELP dg_gpu_memory_bytes Total memory of each GPU, bytes.\n"
		"# TYPE dg_gpu_memory_bytes gauge\n", n);

	for (int i = 0; st == DG_OK && i < n; i++) {
		const struct ps_gpu *g = &d->gpus[i];
		char name[2 * sizeof g->name];
		size_t k = 0;

		for (const char *p = g->name; *p && k + 2 < sizeof name; p++) {
			if (*p == '\\' || *p == '"' || *p == '\n')
				name[k++] = '\\';
			name[k++] = *p == '\n' ? 'n' : *p;
		}
		name[k] = '\0';
		st = dg_buf_printf(b, err, "dg_gpu_memory_bytes{gpu=\"%d\",name=\"%s\"} %zu\n",
				   g->index, name, g->mem_bytes);
	}
	return st;
}

static enum dg_status h_metrics(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				struct dg_err *err)
{
	struct ps_ctx *c = vc;
	struct dg_http_server *http = atomic_load(&c->http);
	struct dg_buf *b = dg_http_body_buf(w, "text/plain; version=0.0.4; charset=utf-8");
	enum dg_status st = DG_OK;

	if (!b)
		return dg_err_set(err, DG_ENOMEM, "out of memory for the metrics");
	if (http)
		st = dg_http_server_metrics(http, b, err);
	if (st == DG_OK)
		st = ps_store_metrics(c->store, b, err);
	if (st == DG_OK)
		st = ps_queues_metrics(c->queues, b, err);
	if (st == DG_OK)
		st = metrics_gpus(&c->devices, b, err);
	if (st == DG_OK && c->extra_metrics)
		st = c->extra_metrics(c->extra_metrics_ud, b, err);
	return st;
}

/* ---------------------------------------------------------- route table */

/* Most specific first: the {name...} routes with a literal suffix come before
 * the bare {name...} ones. doc/http-api.md documents each row (test_routes
 * checks that it does). */
const struct dg_route ps_routes[] = {
	{ "GET", "/v1/health", h_health, "server status as JSON" },
	{ "GET", "/v1/metrics", h_metrics, "Prometheus text metrics" },
	{ "GET", "/v1/vars", h_var_list, "list variables (?prefix=P); ?watch=1: their changes" },
	{ "POST", "/v1/vars/{name...}/apply", h_var_apply, "apply an update rule (?rows=)" },
	{ "POST", "/v1/vars/{name...}/rows", h_var_rows, "read the rows a body of indices names" },
	{ "GET", "/v1/vars/{name...}", h_var_get,
	  "read a variable (Range, ?rows=, ?min_version/step)" },
	{ "HEAD", "/v1/vars/{name...}", h_var_get, "a variable's tensor headers" },
	{ "PUT", "/v1/vars/{name...}", h_var_put, "create or replace a variable" },
	{ "PATCH", "/v1/vars/{name...}", h_var_patch, "write part of a variable" },
	{ "DELETE", "/v1/vars/{name...}", h_var_delete, "delete a variable and its slots" },
	{ "POST", "/v1/checkpoint", h_checkpoint, "write a snapshot of every variable now" },
	{ "GET", "/v1/queues", h_queue_list, "list queues" },
	{ "POST", "/v1/queues/{name...}/enqueue", h_queue_enqueue, "enqueue examples" },
	{ "POST", "/v1/queues/{name...}/dequeue", h_queue_dequeue, "dequeue a batch" },
	{ "POST", "/v1/queues/{name...}/close", h_queue_close, "close a queue" },
	{ "POST", "/v1/queues/{name...}/ack", h_queue_ack, "end a lease: its examples consumed" },
	{ "POST", "/v1/queues/{name...}/release", h_queue_release, "requeue leased examples" },
	{ "GET", "/v1/queues/{name...}/peek", h_queue_peek, "the next ids and the leases" },
	{ "GET", "/v1/queues/{name...}/ids", h_queue_ids, "enqueue and ack counts per id" },
	{ "GET", "/v1/queues/{name...}/requeues", h_queue_requeues,
	  "the leases that ended without their examples applied, with their ids" },
	{ "POST", "/v1/queues/{name...}", h_queue_create, "create a queue" },
	{ "GET", "/v1/queues/{name...}", h_queue_state, "a queue's state" },
	{ "DELETE", "/v1/queues/{name...}", h_queue_delete, "delete a queue" },
};

const int ps_n_routes = (int)(sizeof ps_routes / sizeof ps_routes[0]);
