/* The worker group of `dg server`'s routes: fragments (register, delete, run
 * one step) and the step tensors of the rendezvous (put, take, abort). Each
 * handler parses the request, calls executor.c or the rendezvous, and encodes
 * the reply; ctx is the struct worker. */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/codec.h"

static enum dg_status reply_json(struct dg_http_resp *w, int status, json_t *j,
				 struct dg_err *err)
{
	if (!j)
		return dg_err_set(err, DG_ENOMEM, "out of memory building the JSON reply");
	dg_http_set_json(w, status, j);
	return DG_OK;
}

/* A decimal uint64 (no sign, no spaces). */
static enum dg_status parse_u64(const char *what, const char *s, uint64_t *out,
				struct dg_err *err)
{
	char *end;

	errno = 0;
	if (!s || s[0] < '0' || s[0] > '9' ||
	    (*out = strtoull(s, &end, 10), errno != 0 || *end != '\0')) {
		dg_err_set(err, DG_EINVAL, "%s '%.40s' is not a number 0..2^64-1", what,
			   s ? s : "");
		return DG_EINVAL;
	}
	return DG_OK;
}

static enum dg_status step_arg(struct dg_http_req *r, uint64_t *step, struct dg_err *err)
{
	return parse_u64("step", dg_http_param(r, "step"), step, err);
}

static enum dg_status h_fragment_add(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				     struct dg_err *err)
{
	size_t len;
	const char *body = dg_http_body(r, &len);
	char id[24];
	int n = 0;
	enum dg_status st = worker_fragment_add(vc, body, body ? len : 0, id, sizeof id, &n, err);

	if (st != DG_OK)
		return st;
	return reply_json(w, 201, json_pack("{s:s, s:i}", "id", id, "nodes", n), err);
}

static enum dg_status h_fragment_delete(void *vc, struct dg_http_req *r,
					struct dg_http_resp *w, struct dg_err *err)
{
	enum dg_status st = worker_fragment_remove(vc, dg_http_param(r, "id"), err);

	if (st == DG_OK)
		dg_http_set_status(w, 204);
	return st;
}

/* {"step": S, "timeout_ms": T}: step required, timeout optional. */
static enum dg_status run_args(struct dg_http_req *r, uint64_t *step, int64_t *timeout_ms,
			       struct dg_err *err)
{
	size_t len;
	const char *body = dg_http_body(r, &len);
	json_error_t je;
	json_t *j = body ? json_loadb(body, len, 0, &je) : NULL;
	json_t *js = json_object_get(j, "step"), *jt = json_object_get(j, "timeout_ms");
	enum dg_status st = DG_OK;

	*timeout_ms = WORKER_DEFAULT_TIMEOUT_MS;
	if (!json_is_object(j)) {
		st = dg_err_set(err, DG_EINVAL, "the run request is not a JSON object%s%s",
				j || !body ? "" : ": ", j || !body ? "" : je.text);
	} else if (!json_is_integer(js) || json_integer_value(js) < 0) {
		st = dg_err_set(err, DG_EINVAL, "the run request needs \"step\": an integer >= 0");
	} else if (jt && (!json_is_integer(jt) || json_integer_value(jt) <= 0 ||
			  json_integer_value(jt) > WORKER_MAX_TIMEOUT_MS)) {
		st = dg_err_set(err, DG_EINVAL, "\"timeout_ms\" must be an integer 1..%d",
				WORKER_MAX_TIMEOUT_MS);
	} else {
		*step = (uint64_t)json_integer_value(js);
		if (jt)
			*timeout_ms = json_integer_value(jt);
	}
	if (st != DG_OK)
		dg_err_hint(err, "send {\"step\": 17, \"timeout_ms\": 30000}");
	json_decref(j);
	return st;
}

static enum dg_status h_fragment_run(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				     struct dg_err *err)
{
	struct timespec a, b;
	uint64_t step = 0;
	int64_t timeout_ms;
	int n = 0;
	enum dg_status st = run_args(r, &step, &timeout_ms, err);

	if (st != DG_OK)
		return st;
	clock_gettime(CLOCK_MONOTONIC, &a);
	st = worker_run_fragment(vc, dg_http_param(r, "id"), step, timeout_ms, &n, err);
	clock_gettime(CLOCK_MONOTONIC, &b);
	if (st != DG_OK)
		return st;
	double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6;
	return reply_json(w, 200, json_pack("{s:I, s:i, s:f}", "step", (json_int_t)step,
					    "nodes_run", n, "ms", ms), err);
}

/* The body as a tensor: npy by Content-Type, else raw described by Dg-Dtype
 * and Dg-Shape (the body block is adopted, not copied). */
static struct dg_tensor *body_tensor(struct dg_http_req *r, struct dg_err *err)
{
	const char *ct = dg_http_header(r, "Content-Type");
	const char *hd = dg_http_header(r, "Dg-Dtype"), *hs = dg_http_header(r, "Dg-Shape");
	struct dg_shape shape;
	struct dg_tensor *t;
	enum dg_dtype dt;
	int64_t numel;
	size_t len;
	const void *body = dg_http_body(r, &len);

	if (ct && strncmp(ct, "application/x-npy", 17) == 0)
		return dg_npy_decode(body, body ? len : 0, err);
	if (!hd || !hs) {
		dg_err_set(err, DG_EINVAL, "a raw tensor needs the Dg-Dtype and Dg-Shape headers");
		dg_err_hint(err, "or send .npy with Content-Type: application/x-npy");
		return NULL;
	}
	if (dg_dtype_parse(hd, &dt, err) != DG_OK || dg_shape_parse(hs, &shape, err) != DG_OK ||
	    dg_shape_numel(&shape, &numel, err) != DG_OK)
		return NULL;
	if ((body ? len : 0) != (size_t)numel * dg_dtype_size(dt)) {
		dg_err_set(err, DG_EINVAL, "raw body is %zu bytes but a %s [%s] tensor has %zu",
			   body ? len : 0, dg_dtype_name(dt), hs,
			   (size_t)numel * dg_dtype_size(dt));
		return NULL;
	}
	if (!(t = calloc(1, sizeof *t))) {
		dg_err_set(err, DG_ENOMEM, "out of memory receiving a tensor");
		return NULL;
	}
	t->dtype = dt;
	t->shape = shape;
	t->numel = numel;
	t->nbytes = (size_t)numel * dg_dtype_size(dt);
	t->data = t->nbytes ? dg_http_body_take(r, &len) : NULL;
	if (!t->data && t->nbytes) {
		free(t);
		dg_err_set(err, DG_EINTERNAL, "request body vanished");
		return NULL;
	}
	return t;
}

static enum dg_status h_tensor_put(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				   struct dg_err *err)
{
	const char *key = dg_http_param(r, "key");
	struct dg_tensor *t;
	uint64_t step;
	enum dg_status st;

	if ((st = step_arg(r, &step, err)) != DG_OK ||
	    (st = dg_rendezvous_key_check(key, err)) != DG_OK)
		return st;
	if (dg_rendezvous_is_aborted(worker_rendezvous(vc), step))     /* before decoding */
		return dg_err_set(err, DG_ECANCELED, "step %" PRIu64 " was aborted: tensor '%s' "
				  "is not wanted any more", step, key);
	if (!(t = body_tensor(r, err))) {
		dg_err_prefix(err, "tensor '%s' of step %" PRIu64, key, step);
		return err->code;
	}
	worker_count_received(vc, t->nbytes);
	if ((st = dg_rendezvous_put(worker_rendezvous(vc), step, key, t, err)) == DG_OK)
		dg_http_set_status(w, 204);
	return st;
}

static void tensor_release(void *ud)
{
	dg_tensor_free(ud);
}

static enum dg_status h_tensor_get(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				   struct dg_err *err)
{
	const char *key = dg_http_param(r, "key");
	struct dg_tensor *t = NULL;
	uint64_t step;
	int64_t timeout_ms;
	char shape[200];
	size_t off = 0;
	enum dg_status st;

	if ((st = step_arg(r, &step, err)) != DG_OK ||
	    (st = dg_http_query_int(r, "timeout_ms", WORKER_DEFAULT_TIMEOUT_MS, &timeout_ms,
				    err)) != DG_OK)
		return st;
	if (timeout_ms < 0 || timeout_ms > WORKER_MAX_TIMEOUT_MS)
		return dg_err_set(err, DG_EINVAL, "timeout_ms must be 0..%d",
				  WORKER_MAX_TIMEOUT_MS);
	if ((st = dg_rendezvous_take(worker_rendezvous(vc), step, key, timeout_ms, &t, err)) !=
	    DG_OK)
		return st;
	snprintf(shape, sizeof shape, "[]");
	for (int i = 0; i < t->shape.ndim; i++)
		off += (size_t)snprintf(shape + off, sizeof shape - off, "%s%" PRId64,
					i ? "," : "", t->shape.dim[i]);
	dg_http_add_header(w, "Dg-Dtype", dg_dtype_name(t->dtype));
	dg_http_add_header(w, "Dg-Shape", shape);
	dg_http_set_body_ref(w, dg_encoding_mime(DG_ENC_RAW), t->data, t->nbytes, tensor_release,
			     t);
	return DG_OK;
}

static enum dg_status h_step_abort(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				   struct dg_err *err)
{
	const char *reason = dg_http_query(r, "reason");
	uint64_t step;
	enum dg_status st;

	if ((st = step_arg(r, &step, err)) != DG_OK)
		return st;
	dg_rendezvous_abort(worker_rendezvous(vc), step, reason);
	dg_http_set_status(w, 204);
	return DG_OK;
}

const struct dg_route worker_routes[] = {
	{ "POST", "/v1/fragments", h_fragment_add, "register a fragment (graph JSON)" },
	{ "POST", "/v1/fragments/{id}/run", h_fragment_run, "run a fragment once for a step" },
	{ "DELETE", "/v1/fragments/{id}", h_fragment_delete, "forget a fragment" },
	{ "PUT", "/v1/steps/{step}/tensors/{key...}", h_tensor_put, "send a step's tensor here" },
	{ "GET", "/v1/steps/{step}/tensors/{key...}", h_tensor_get,
	  "wait for a step's tensor and take it (?timeout_ms)" },
	{ "DELETE", "/v1/steps/{step}", h_step_abort, "abort a step (?reason=TEXT)" },
};
const int worker_n_routes = (int)(sizeof worker_routes / sizeof *worker_routes);
