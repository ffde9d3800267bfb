/* The worker group of `dg server`'s routes: fragments (register, delete, run
 * one or several steps) and the step tensors of the rendezvous (put, take,
 * abort one step or a range). Each handler parses the request, calls
 * executor.c or the rendezvous, and encodes the reply; ctx is the struct
 * worker. */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dg/codec.h"
#include "dg/task_client.h"
#include "dg/wire.h"

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
	const char *owner = dg_http_query(r, "owner"), *lease_s = dg_http_query(r, "lease_ms");
	uint64_t lease_ms = 0;
	enum dg_status st = DG_OK;

	/* ?owner=O&lease_ms=L: forgotten unless O renews it within L ms */
	if (!owner != !lease_s)
		return dg_err_set(err, DG_EINVAL, "a fragment lease needs both owner and lease_ms");
	if (lease_s)
		st = parse_u64("lease_ms", lease_s, &lease_ms, err);
	const struct worker_lease lease = { owner, lease_ms > INT64_MAX ? INT64_MAX :
					    (int64_t)lease_ms };
	if (st == DG_OK)
		st = worker_fragment_add(vc, body, body ? len : 0, id, sizeof id, &n,
					 owner ? &lease : NULL, err);
	if (st != DG_OK)
		return st;
	return reply_json(w, 201, json_pack("{s:s, s:i}", "id", id, "nodes", n), err);
}

static enum dg_status h_fragments_renew(void *vc, struct dg_http_req *r,
					struct dg_http_resp *w, struct dg_err *err)
{
	const char *owner = dg_http_query(r, "owner");

	if (!owner || !*owner)
		return dg_err_set(err, DG_EINVAL, "renew needs ?owner=O (the owner the fragments "
				  "were registered with)");
	return reply_json(w, 200, json_pack("{s:i}", "renewed", worker_fragments_renew(vc, owner)),
			  err);
}

static enum dg_status h_fragment_delete(void *vc, struct dg_http_req *r,
					struct dg_http_resp *w, struct dg_err *err)
{
	enum dg_status st = worker_fragment_remove(vc, dg_http_param(r, "id"), err);

	if (st == DG_OK)
		dg_http_set_status(w, 204);
	return st;
}

/* An optional integer member in lo..hi (*out keeps its default when absent). */
static enum dg_status json_int_in(const json_t *j, const char *key, int64_t lo, int64_t hi,
				  int64_t *out, struct dg_err *err)
{
	const json_t *v = json_object_get(j, key);

	if (!v)
		return DG_OK;
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return dg_err_set(err, DG_EINVAL, "\"%s\" must be an integer %" PRId64 "..%" PRId64,
				  key, lo, hi);
	*out = json_integer_value(v);
	return DG_OK;
}

/* {"step": S, "timeout_ms": T, "steps": K, "train_step": T0, "collect": [...],
 * "from": ADDR}: step required. The collect keys and from are borrowed from *j
 * (the caller frees it); *plain is true without "train_step" (kernels see the
 * step id). */
static enum dg_status run_args(struct dg_http_req *r, json_t **j, struct worker_run_opts *o,
			       const char **keys, bool *plain, struct dg_err *err)
{
	size_t len;
	const char *body = dg_http_body(r, &len);
	json_error_t je;
	json_t *js, *jc, *jf;
	int64_t step = -1;
	enum dg_status st = DG_OK;

	*j = body ? json_loadb(body, len, 0, &je) : NULL;
	js = json_object_get(*j, "step");
	jc = json_object_get(*j, "collect");
	jf = json_object_get(*j, "from");
	*o = (struct worker_run_opts){ .steps = 1, .timeout_ms = WORKER_DEFAULT_TIMEOUT_MS,
				       .collect = keys };
	*plain = !json_object_get(*j, "train_step");
	if (!json_is_object(*j)) {
		st = dg_err_set(err, DG_EINVAL, "the run request is not a JSON object%s%s",
				*j || !body ? "" : ": ", *j || !body ? "" : je.text);
	} else if (!json_is_integer(js) || (step = json_integer_value(js)) < 0) {
		st = dg_err_set(err, DG_EINVAL, "the run request needs \"step\": an integer >= 0");
	} else if (json_int_in(*j, "timeout_ms", 1, WORKER_MAX_TIMEOUT_MS, &o->timeout_ms,
			       err) != DG_OK ||
		   json_int_in(*j, "steps", 1, WORKER_MAX_RUN_STEPS, &o->steps, err) != DG_OK ||
		   json_int_in(*j, "train_step", 0, INT64_MAX / 2, &o->train_step, err) != DG_OK) {
		st = DG_EINVAL;
	} else if (jc && (!json_is_array(jc) || json_array_size(jc) > WORKER_MAX_COLLECT)) {
		st = dg_err_set(err, DG_EINVAL, "\"collect\" must be an array of at most %d keys",
				WORKER_MAX_COLLECT);
	} else if (jf && !json_is_string(jf)) {
		st = dg_err_set(err, DG_EINVAL, "\"from\" must be the requester's address, a "
				"string");
	}
	for (size_t i = 0; st == DG_OK && i < json_array_size(jc); i++) {
		if (!(keys[i] = json_string_value(json_array_get(jc, i))))
			st = dg_err_set(err, DG_EINVAL, "\"collect\"[%zu] is not a string", i);
		o->n_collect = (int)i + 1;
	}
	if (st != DG_OK) {
		dg_err_hint(err, "send {\"step\": 17, \"timeout_ms\": 30000} or, for several "
			    "steps, {\"step\": 17, \"steps\": 100, \"train_step\": 0, "
			    "\"collect\": [\"fetch:loss\"]}");
		json_decref(*j);
		*j = NULL;
		return st;
	}
	o->step = (uint64_t)step;
	o->carry_to = json_string_value(jf);
	if (*plain)             /* as worker_run_fragment: the step id, folded */
		o->train_step = (int64_t)(o->step & (((uint64_t)1 << 62) - 1));
	return DG_OK;
}

/* {"step", "steps", "nodes_run", "ms", "results": [{"step", "train_step",
 * "ms", "values": {KEY: x | null}, "stale"}, ...], "input_end": true (when
 * the run stopped early at the end of its input queue)} of a run, into out, and
 * the tensors it carried ("tensors" and their bytes after the JSON's line,
 * dg/task_client.h). Written directly: a training chunk's reply is sent
 * every ~100 ms, a plain run's at every step, and a jansson tree cost a
 * tenth of a 2-task step. */
static enum dg_status run_reply(const struct worker_run_opts *o,
				const struct worker_run_result *res, struct dg_buf *out,
				struct dg_err *err)
{
	enum dg_status st = dg_buf_printf(out, err, "{\"step\":%" PRIu64 ",\"steps\":%" PRId64
					  ",\"nodes_run\":%d,\"ms\":", o->step, o->steps,
					  res->nodes_run);

	if (st == DG_OK)
		st = dg_buf_json_real(out, res->ms, err);
	if (st == DG_OK)
		st = dg_buf_append(out, ",\"results\":[", 12, err);
	for (int64_t i = 0; st == DG_OK && i < res->steps_done; i++) {
		const struct worker_step_result *sr = &res->r[i];
		st = dg_buf_printf(out, err, "%s{\"step\":%" PRIu64 ",\"train_step\":%" PRId64
				   ",\"ms\":", i ? "," : "", sr->step, sr->train_step);
		if (st == DG_OK)
			st = dg_buf_json_real(out, sr->ms, err);
		if (st == DG_OK)
			st = dg_buf_append(out, ",\"values\":{", 11, err);
		for (int k = 0; st == DG_OK && k < o->n_collect; k++) {
			if (k)
				st = dg_buf_append(out, ",", 1, err);
			if (st == DG_OK)
				st = dg_buf_json_string(out, o->collect[k], err);
			if (st == DG_OK)
				st = dg_buf_append(out, ":", 1, err);
			if (st == DG_OK)
				st = dg_buf_json_real(out, sr->values[k], err);
		}
		if (st == DG_OK)
			st = dg_buf_printf(out, err, "},\"stale\":%d}", sr->stale);
	}
	if (st == DG_OK)
		st = dg_buf_append(out, "]", 1, err);
	if (st == DG_OK && res->input_end)
		st = dg_buf_append(out, ",\"input_end\":true", 17, err);
	if (st == DG_OK && res->n_carried > 0)
		st = dg_task_carried_json(out, res->carried, res->n_carried, err);
	if (st == DG_OK)
		st = dg_buf_append(out, "}\n", 2, err);
	if (st == DG_OK && res->n_carried > 0)
		st = dg_task_carried_data(out, res->carried, res->n_carried, err);
	return st;
}

static enum dg_status h_fragment_run(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				     struct dg_err *err)
{
	const char *keys[WORKER_MAX_COLLECT];
	struct worker_run_opts o;
	struct worker_run_result res;
	bool plain;
	json_t *j;
	enum dg_status st = run_args(r, &j, &o, keys, &plain, err);

	if (st != DG_OK)
		return st;
	st = worker_run_steps_mode(vc, dg_http_param(r, "id"), &o, plain, &res, err);
	if (st == DG_OK)
		st = run_reply(&o, &res, dg_http_body_buf(w, res.n_carried > 0 ? DG_TASK_RUN_MIME :
							  "application/json"), err);
	worker_run_result_deinit(&res);
	json_decref(j);
	return st;
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
	if ((st = dg_wire_req_body(r, &t, err)) != DG_OK) {
		dg_err_prefix(err, "tensor '%s' of step %" PRIu64, key, step);
		return st;
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
	dg_wire_add_tensor_headers(w, t->dtype, &t->shape);
	dg_http_set_body_ref(w, dg_encoding_mime(DG_ENC_RAW), t->data, t->nbytes, tensor_release,
			     t);
	return DG_OK;
}

static enum dg_status h_step_abort(void *vc, struct dg_http_req *r, struct dg_http_resp *w,
				   struct dg_err *err)
{
	const char *reason = dg_http_query(r, "reason");
	uint64_t step;
	int64_t count;
	enum dg_status st;

	if ((st = step_arg(r, &step, err)) != DG_OK ||
	    (st = dg_http_query_int(r, "count", 1, &count, err)) != DG_OK)
		return st;
	if (count < 1 || count > WORKER_MAX_RUN_STEPS)
		return dg_err_set(err, DG_EINVAL, "count must be 1..%d, not %" PRId64,
				  WORKER_MAX_RUN_STEPS, count);
	dg_rendezvous_abort_range(worker_rendezvous(vc), step, count, reason);
	dg_http_set_status(w, 204);
	return DG_OK;
}

const struct dg_route worker_routes[] = {
	{ "POST", "/v1/fragments", h_fragment_add,
	  "register a fragment (graph JSON; ?owner=O&lease_ms=L: forgotten unless renewed)" },
	{ "POST", "/v1/fragments/renew", h_fragments_renew,
	  "renew the lease of every fragment of ?owner=O" },
	{ "POST", "/v1/fragments/{id}/run", h_fragment_run,
	  "run a fragment for a step (or \"steps\" steps, collecting values)" },
	{ "DELETE", "/v1/fragments/{id}", h_fragment_delete, "forget a fragment" },
	{ "PUT", "/v1/steps/{step}/tensors/{key...}", h_tensor_put, "send a step's tensor here" },
	{ "GET", "/v1/steps/{step}/tensors/{key...}", h_tensor_get,
	  "wait for a step's tensor and take it (?timeout_ms)" },
	{ "DELETE", "/v1/steps/{step}", h_step_abort,
	  "abort a step (?reason=TEXT, ?count=K: steps step..step+K-1)" },
};
const int worker_n_routes = (int)(sizeof worker_routes / sizeof *worker_routes);
