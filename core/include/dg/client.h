/* The typed client of a dg server's HTTP API (doc/http-api.md): variables,
 * update rules, queues, health. Built on dg/http.h; used by the CLI, the
 * mount and workers. One client object per server per thread (it holds one
 * kept-alive connection). */
#ifndef DG_CLIENT_H
#define DG_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "dg/buf.h"
#include "dg/codec.h"
#include "dg/tensor.h"

#define DG_VAR_NAME_MAX 256             /* bytes */
/* bytes of one segment: NAME.npy, the mount's longest file name for it, must
 * fit a file name of 255 bytes */
#define DG_VAR_SEGMENT_MAX 251
#define DG_QUEUE_MAX_COMPONENTS 16

/* Check a variable (or queue) name: segments of [A-Za-z0-9_.-]+ joined by '/',
 * no empty/"."/".." segment, each at most DG_VAR_SEGMENT_MAX bytes, at most
 * DG_VAR_NAME_MAX bytes in all. DG_EINVAL naming the name (bytes that are not
 * UTF-8 escaped as \xNN) and the rule broken. Shared by client, server and
 * mount: every new name passes it. */
enum dg_status dg_var_name_check(const char *name, struct dg_err *err);
/* The same rule without the segment limit, for names a data directory holds
 * already (written before the limit existed): the server still loads them. */
enum dg_status dg_var_name_check_stored(const char *name, struct dg_err *err);

struct dg_var_info {
	char name[DG_VAR_NAME_MAX + 1];
	enum dg_dtype dtype;
	struct dg_shape shape;
	uint64_t bytes;
	uint64_t version;
	double mtime;                   /* seconds since the Unix epoch */
	int64_t step;                   /* sync step (the step the next synchronous apply
					 * must carry; Dg-Step header); -1 when not reported */
};

/* Settings of a shared queue (POST /v1/queues/NAME). */
struct dg_queue_spec {
	int64_t capacity;               /* examples */
	bool shuffle;
	int64_t min_after_dequeue;
	uint64_t seed;
	int n_components;
	enum dg_dtype dtype[DG_QUEUE_MAX_COMPONENTS];
	struct dg_shape shape[DG_QUEUE_MAX_COMPONENTS];
	bool has_ids;                   /* component ids holds each example's id (an
					 * int64 or int32 scalar) */
	int ids;
};
/* JSON <-> spec (the body format of doc/http-api.md), with validation:
 * capacity >= 1, 0 <= min_after_dequeue < capacity, 1..16 components, "ids"
 * (optional) the index of an int32/int64 scalar component. */
enum dg_status dg_queue_spec_from_json(const json_t *j, struct dg_queue_spec *out,
				       struct dg_err *err);
json_t *dg_queue_spec_to_json(const struct dg_queue_spec *s);

struct dg_client;

/* A client of the server at address ("host:port"); token may be NULL.
 * Connects lazily. Returns owned or NULL with *err set. */
struct dg_client *dg_client_new(const char *address, const char *token, struct dg_err *err);
void dg_client_free(struct dg_client *c);
/* Bound each later request to timeout_ms (0 = 300 s; default 330 s): the
 * mount's --timeout. Not thread-safe with requests on the same client. */
void dg_client_set_timeout(struct dg_client *c, long timeout_ms);
/* The server's epoch seen in the last reply (0 before any). */
uint64_t dg_client_epoch(const struct dg_client *c);

/* GET /v1/health as JSON (owned reference). */
enum dg_status dg_client_health(struct dg_client *c, json_t **out, struct dg_err *err);

/* GET /v1/vars: *out is an owned array (free()) of *n entries. */
enum dg_status dg_var_list(struct dg_client *c, const char *prefix, struct dg_var_info **out,
			   int *n, struct dg_err *err);
/* Where a watch of a server's variables stands (dg_var_watch): zero it to
 * start watching from now. */
struct dg_watch_pos {
	uint64_t seq;                   /* the last position seen */
	uint64_t epoch;                 /* the server's epoch of seq; 0: none yet */
};
/* GET /v1/vars?watch=1: the changes of variables whose name starts with
 * prefix (NULL: all) after *pos, waiting up to timeout_ms for the first.
 * *events gets an owned JSON array of {"seq","name","version","event"
 * ("put", "apply" or "delete"),"time"}; *reset is set when the server could
 * not answer for *pos (it restarted, or the watcher fell too far behind):
 * re-read what you keep. *pos moves on. */
enum dg_status dg_var_watch(struct dg_client *c, const char *prefix, struct dg_watch_pos *pos,
			    long timeout_ms, json_t **events, bool *reset, struct dg_err *err);
/* One event of dg_var_watch as the line `dg var watch` and the mount's
 * events file print: "TIME TASK NAME VERSION EVENT\n", TIME in ISO 8601
 * UTC with milliseconds. Returns its length (snprintf's: truncated at n). */
int dg_watch_event_line(const json_t *ev, const char *task, char *buf, size_t n);
/* HEAD: dtype, shape, version, bytes (name filled). */
enum dg_status dg_var_stat(struct dg_client *c, const char *name, struct dg_var_info *info,
			   struct dg_err *err);
/* GET raw -> owned tensor; info (may be NULL) gets the headers. */
enum dg_status dg_var_get(struct dg_client *c, const char *name, struct dg_tensor **out,
			  struct dg_var_info *info, struct dg_err *err);
/* GET ?rows=ROWS (a list as the ps takes it: "3", "0-99", "7,1,20-29") in
 * an encoding, appended to out; info gets the variable's headers (its
 * Dg-Shape is the rows'). DG_EINVAL for a list with other characters. */
enum dg_status dg_var_get_rows_encoded(struct dg_client *c, const char *name, const char *rows,
				       enum dg_encoding enc, struct dg_buf *out,
				       struct dg_var_info *info, struct dg_err *err);
/* GET in an encoding, appended to out. */
enum dg_status dg_var_get_encoded(struct dg_client *c, const char *name, enum dg_encoding enc,
				  struct dg_buf *out, struct dg_var_info *info, struct dg_err *err);
/* GET in an encoding, streamed: sink receives the body as it arrives, all of
 * one version, with the reply's headers decoded in info (the same for every
 * call; offset restarts at 0 if the request is retried). A sink that returns
 * false aborts the transfer (an error status). sink runs on the caller's
 * thread; *info (may be NULL) gets the headers at the end. */
enum dg_status dg_var_get_stream(struct dg_client *c, const char *name, enum dg_encoding enc,
				 bool (*sink)(void *ud, const struct dg_var_info *info,
					      uint64_t offset, const void *p, size_t n),
				 void *ud, struct dg_var_info *info, struct dg_err *err);
/* GET in an encoding with the body received straight into the caller's
 * memory (dg_http_get_into: no copy out of libcurl's buffer; the mount's
 * cold reads). begin(ud, info, len): the reply's headers as info and the
 * body's length; return a block of at least len bytes, or NULL to give up
 * (DG_ECANCELED). progress(ud, got): bytes [0, got) of it are in; false gives
 * up. stop(ud) (may be NULL) is polled while connecting. *delivered says
 * whether begin was called. Before that, a reply that cannot be received so
 * (chunked, no length, no tensor headers) is DG_EUNSUPPORTED and a transport
 * failure leaves nothing done: take dg_var_get_stream then, which retries and
 * says what went wrong. An HTTP error is returned as any request's is
 * (DG_ENOTFOUND for a variable not on that server). */
struct dg_var_into {
	void *(*begin)(void *ud, const struct dg_var_info *info, uint64_t len);
	bool (*progress)(void *ud, uint64_t got);
	bool (*stop)(void *ud);
};
enum dg_status dg_var_get_into(struct dg_client *c, const char *name, enum dg_encoding enc,
			       const struct dg_var_into *into, void *ud, bool *delivered,
			       struct dg_err *err);
/* PUT a raw tensor whose body is sent from data (nbytes, of dtype dt and
 * shape) as the caller declares it final (dg_http_put_from: no copy; the
 * mount's streaming writes). more, stop and stop_fd are dg_http_put_from's:
 * more(ud, sent) blocks until bytes past sent are final and returns how many
 * are (sent or less gives up: DG_ECANCELED); stop is polled while
 * connecting; stop_fd (-1: none), made readable by another thread, ends a
 * wait on the server at once. if_match 0: unconditional. DG_OK with
 * end->version; else the server's error (end->status its HTTP status) or a
 * transport failure (end->status 0). end->sent: the bytes of the body that
 * went out; below nbytes, the server changed nothing. */
struct dg_var_from {
	uint64_t (*more)(void *ud, uint64_t sent);
	bool (*stop)(void *ud);
	int stop_fd;
};
struct dg_var_put_end {
	uint64_t version;               /* the version made (DG_OK) */
	uint64_t sent;                  /* bytes of the body sent */
	int status;                     /* the reply's HTTP status; 0: no reply */
};
enum dg_status dg_var_put_stream(struct dg_client *c, const char *name, enum dg_dtype dt,
				 const struct dg_shape *shape, const void *data, uint64_t nbytes,
				 uint64_t if_match, const struct dg_var_from *from, void *ud,
				 struct dg_var_put_end *end, struct dg_err *err);
/* GET ?min_version: DG_ETIMEOUT when the version did not arrive in time. */
enum dg_status dg_var_wait(struct dg_client *c, const char *name, uint64_t min_version,
			   long timeout_ms, struct dg_tensor **out, struct dg_var_info *info,
			   struct dg_err *err);

/* GET ?min_step=S: wait until the variable's sync step is at least min_step
 * (a synchronous replica's pull for step S waits for step S-1 to be applied).
 * DG_ETIMEOUT when it did not get there in time. */
enum dg_status dg_var_wait_step(struct dg_client *c, const char *name, int64_t min_step,
				long timeout_ms, struct dg_tensor **out, struct dg_var_info *info,
				struct dg_err *err);

/* POST /v1/checkpoint: write a snapshot of every variable now. *reply (may be
 * NULL) gets the server's JSON reply (owned). DG_EUNSUPPORTED when the server
 * keeps variables in memory only (no --data-dir). */
enum dg_status dg_ps_checkpoint(struct dg_client *c, json_t **reply, struct dg_err *err);

struct dg_put_opts {
	bool replace;                   /* allow another dtype/shape (?replace=1) */
	bool create_only;               /* If-None-Match: * */
	uint64_t if_match;              /* 0: unconditional */
};
/* PUT a tensor (raw). *version (may be NULL) gets the new version. */
enum dg_status dg_var_put(struct dg_client *c, const char *name, const struct dg_tensor *t,
			  const struct dg_put_opts *opts, uint64_t *version, struct dg_err *err);
/* PUT an encoded body (npy/text; raw needs dtype/shape: use dg_var_put). */
enum dg_status dg_var_put_encoded(struct dg_client *c, const char *name, enum dg_encoding enc,
				  const void *body, size_t len, const struct dg_put_opts *opts,
				  uint64_t *version, struct dg_err *err);
/* PATCH raw bytes at byte offset. */
enum dg_status dg_var_patch(struct dg_client *c, const char *name, uint64_t offset,
			    const void *p, size_t n, uint64_t if_match, uint64_t *version,
			    struct dg_err *err);
enum dg_status dg_var_delete(struct dg_client *c, const char *name, uint64_t if_match,
			     struct dg_err *err);

struct dg_apply {
	const char *rule;               /* assign, assign_add, sgd, momentum, adam,
					 * adagrad, rmsprop, moving_average */
	double lr, momentum, beta1, beta2, eps;   /* as the rule needs; 0 = server default */
	double rho, init;               /* rmsprop's decay (moving_average's: its decay);
					 * adagrad's/rmsprop's slot start */
	bool nesterov;
	/* Row-wise: grad holds n_rows rows ([n_rows] + the variable's shape[1:])
	 * for rows rows[i] of its dim 0 (repeats summed by the ps). NULL: dense. */
	const int64_t *rows;
	int64_t n_rows;
	int64_t step;                   /* sync mode: >= 0; async: -1 */
	int replicas;                   /* sync mode */
	int backup;                     /* sync mode: apply after replicas-backup arrivals */
	int64_t replica;                /* sync mode: this replica's id, -1 = anonymous */
	/* A queue-fed step's apply on the ps that holds its queue: this is one of
	 * lease_count applies of the step, and the ps ends the batch's lease with
	 * the last of them (doc/http-api.md, "Leases"). lease 0: none. */
	const char *lease_queue;
	uint64_t lease;
	int lease_count;
	bool lease_drop;                /* a dropped update drops the batch (else requeues) */
};
struct dg_apply_result {
	bool applied;                   /* false: accepted, waiting for other replicas */
	uint64_t version;
	int pending;
	int64_t step;
};
/* POST /v1/vars/NAME/rows: the rows indices (int32/int64, any shape) name,
 * as Gather(variable, indices) gives them: *out (owned) of shape indices'
 * + the variable's shape[1:]; *info (may be NULL) the variable's version.
 * min_step > 0: first wait (at most timeout_ms) until the variable's sync
 * step is at least min_step, as dg_var_wait_step (DG_ETIMEOUT when not). */
enum dg_status dg_var_get_rows(struct dg_client *c, const char *name,
			       const struct dg_tensor *indices, int64_t min_step, long timeout_ms,
			       struct dg_tensor **out, struct dg_var_info *info,
			       struct dg_err *err);
/* POST /apply with grad as a raw body (after the rows' int64 indices when
 * a->rows). DG_ESTALE when a sync gradient was dropped. */
enum dg_status dg_var_apply(struct dg_client *c, const char *name, const struct dg_apply *a,
			    const struct dg_tensor *grad, struct dg_apply_result *res,
			    struct dg_err *err);
/* dg_var_apply that also returns the variable's value after an async apply
 * (a->step < 0; Prefer: return=representation): *value (owned) is that value,
 * or a later one when another apply came in between, and *info (may be NULL)
 * its headers (the version is res->version). *value is NULL when there is
 * none: a sync apply (it behaves as dg_var_apply), or a server that answered
 * without the value. */
enum dg_status dg_var_apply_value(struct dg_client *c, const char *name,
				  const struct dg_apply *a, const struct dg_tensor *grad,
				  struct dg_apply_result *res, struct dg_tensor **value,
				  struct dg_var_info *info, struct dg_err *err);

/* Queues. components[i] is the [n, ...shape_i] batch of component i. */
enum dg_status dg_queue_create(struct dg_client *c, const char *name,
			       const struct dg_queue_spec *spec, struct dg_err *err);
enum dg_status dg_queue_enqueue(struct dg_client *c, const char *name, int64_t n,
				const struct dg_tensor *const *components, int n_components,
				long timeout_ms, struct dg_err *err);
/* n examples whose component-major body (each component's [n, ...shape]
 * batch, in order) the caller built: no copy of it is made. */
enum dg_status dg_queue_enqueue_body(struct dg_client *c, const char *name, int64_t n,
				     const void *body, size_t len, long timeout_ms,
				     struct dg_err *err);
/* *got examples dequeued into owned tensors out[0..n_components). */
enum dg_status dg_queue_dequeue(struct dg_client *c, const char *name, int64_t n,
				long timeout_ms, bool allow_smaller, struct dg_tensor **out,
				int n_components, int64_t *got, struct dg_err *err);
/* A leased dequeue (doc/http-api.md, "Leases"): the examples stay reserved on
 * the ps until dg_queue_lease_end, and go back to the queue's front when the
 * lease runs out after lease_ms. holder (NULL: none) tags it for
 * dg_queue_release_holder. *lease_id = the lease. */
struct dg_queue_lease {
	int64_t lease_ms;
	const char *holder;
};
enum dg_status dg_queue_dequeue_lease(struct dg_client *c, const char *name, int64_t n,
				      long timeout_ms, bool allow_smaller,
				      const struct dg_queue_lease *lease, struct dg_tensor **out,
				      int n_components, int64_t *got, uint64_t *lease_id,
				      struct dg_err *err);
/* End a lease: ACK (consumed and applied), DROP (consumed, not applied),
 * RELEASE (requeue now). *n = its examples. DG_ENOTFOUND when not held. */
enum dg_lease_end { DG_LEASE_ACK, DG_LEASE_DROP, DG_LEASE_RELEASE };
enum dg_status dg_queue_lease_end(struct dg_client *c, const char *name, uint64_t lease,
				  enum dg_lease_end how, int64_t *n, struct dg_err *err);
/* Requeue every lease holder has on the queue; *n = the examples. */
enum dg_status dg_queue_release_holder(struct dg_client *c, const char *name,
				       const char *holder, int64_t *n, struct dg_err *err);
enum dg_status dg_queue_close(struct dg_client *c, const char *name, struct dg_err *err);
enum dg_status dg_queue_delete(struct dg_client *c, const char *name, struct dg_err *err);
/* GET /v1/queues/NAME state (owned JSON). */
enum dg_status dg_queue_state(struct dg_client *c, const char *name, json_t **out,
			      struct dg_err *err);
/* GET /v1/queues/NAME/peek?n=K: the first K queued ids and the leases
 * (owned JSON, doc/http-api.md). */
enum dg_status dg_queue_peek(struct dg_client *c, const char *name, int64_t k, json_t **out,
			     struct dg_err *err);
/* GET /v1/queues/NAME/requeues?prefix=P&after=SEQ&n=K: the leases that ended
 * without their examples applied, after log entry SEQ, of holders starting
 * with P (NULL: any), at most K (owned JSON, doc/http-api.md, "Leases"). */
enum dg_status dg_queue_requeues(struct dg_client *c, const char *name, const char *prefix,
				 uint64_t after, int64_t k, json_t **out, struct dg_err *err);
/* GET /v1/queues: {"queues": [{"name", ...}, ...]} (owned JSON). */
enum dg_status dg_queue_list(struct dg_client *c, json_t **out, struct dg_err *err);

#endif
