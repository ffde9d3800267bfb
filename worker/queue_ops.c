/* The queue ops of fragments (doc/ops.md, "Queues"): QueueDequeueMany,
 * QueueEnqueueMany, QueueAck, QueueClose and QueueSize, clients of a ps's
 * shared queue (core's dg/client.h). Their schemas and inference are here;
 * the executor (executor.c) runs them through worker_queue_run with a
 * kept-alive client of the queue's ps. They are registered for the worker and
 * the master layers at once: a graph submitted to the master names them (with
 * "queue" naming its Queue node), and the master lowers them into fragments
 * by adding the ps's address ("ps") and the queue's components. */
#include "internal.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dg/client.h"
#include "dg/clock.h"
#include "dg/kernels.h"
#include "dg/log.h"

/* The slice of a blocking queue request: an abort is noticed within it. */
#define QUEUE_SLICE_MS 1000
/* Examples per enqueue request of the feeder, by default. */
#define FEED_CHUNK 1024
#define FEED_MAX_THREADS 16

/* ------------------------------------------------------------ inference */

enum dg_status worker_queue_components(const json_t *attrs, struct dg_queue_spec *spec,
				       struct dg_err *err)
{
	json_t *comps = json_object_get(attrs, "components"), *ids = json_object_get(attrs, "ids");
	json_t *probe;
	enum dg_status st;

	if (!comps) {
		dg_err_set(err, DG_EINVAL, "missing attr 'components'");
		dg_err_hint(err, "in a submitted graph the master copies them from the Queue "
			    "node that attr 'queue' names");
		return DG_EINVAL;
	}
	/* The one rule for components and ids is the queue's own (names.c). */
	probe = json_pack("{s:i, s:O, s:O*}", "capacity", 1, "components", comps, "ids", ids);
	if (!probe)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	st = dg_queue_spec_from_json(probe, spec, err);
	json_decref(probe);
	if (st != DG_OK)
		dg_err_prefix(err, "attr 'components'");
	return st;
}

static int dequeue_num_outputs(const json_t *attrs, struct dg_err *err)
{
	struct dg_queue_spec s;

	if (worker_queue_components(attrs, &s, err) != DG_OK)
		return -1;
	return s.n_components + 1;
}

/* "queue" a valid name; "ps", when there, a "host:port". */
static enum dg_status check_queue(struct dg_infer_ctx *c)
{
	const char *queue, *ps;

	if (dg_attr_string(c->attrs, "queue", NULL, &queue, c->err) != DG_OK ||
	    dg_attr_string(c->attrs, "ps", "", &ps, c->err) != DG_OK)
		return c->err->code;
	if (dg_var_name_check(queue, c->err) != DG_OK) {
		dg_err_prefix(c->err, "attr 'queue'");
		return c->err->code;
	}
	if (ps[0] && worker_check_address("ps", ps, c->err) != DG_OK)
		return c->err->code;
	return DG_OK;
}

static void scalar_i64(struct dg_ttype *t)
{
	t->dtype = DG_I64;
	t->shape.ndim = 0;
}

/* An int attr in lo..hi (def when absent). */
static enum dg_status int_attr(struct dg_infer_ctx *c, const char *key, int64_t def, int64_t lo,
			       int64_t hi, int64_t *out)
{
	if (dg_attr_int(c->attrs, key, &def, out, c->err) != DG_OK)
		return c->err->code;
	if (*out < lo || *out > hi)
		return dg_err_set(c->err, DG_EINVAL, "attr '%s' must be %" PRId64 "..%" PRId64
				  ", got %" PRId64, key, lo, hi, *out);
	return DG_OK;
}

static enum dg_status infer_dequeue(struct dg_infer_ctx *c)
{
	struct dg_queue_spec s;
	int64_t batch, v;
	bool yes = true, smaller;
	const char *holder;

	if (check_queue(c) != DG_OK ||
	    worker_queue_components(c->attrs, &s, c->err) != DG_OK ||
	    int_attr(c, "batch", 0, 1, (int64_t)1 << 31, &batch) != DG_OK ||
	    int_attr(c, "lease_ms", 0, 0, 3600000, &v) != DG_OK ||
	    int_attr(c, "timeout_ms", 0, 0, 3600000, &v) != DG_OK ||
	    dg_attr_bool(c->attrs, "allow_smaller", &yes, &smaller, c->err) != DG_OK ||
	    dg_attr_string(c->attrs, "holder", "", &holder, c->err) != DG_OK)
		return c->err->code;
	if (holder[0] && dg_var_name_check(holder, c->err) != DG_OK) {
		dg_err_prefix(c->err, "attr 'holder'");
		return c->err->code;
	}
	for (int i = 0; i < s.n_components; i++) {
		c->out[i].dtype = s.dtype[i];
		c->out[i].shape.ndim = s.shape[i].ndim + 1;
		/* A short last batch when the queue closes: the batch dim is unknown. */
		c->out[i].shape.dim[0] = smaller ? -1 : batch;
		memcpy(&c->out[i].shape.dim[1], s.shape[i].dim,
		       sizeof s.shape[i].dim[0] * (size_t)s.shape[i].ndim);
	}
	scalar_i64(&c->out[s.n_components]);
	return DG_OK;
}

/* The components an enqueue takes as inputs: all but the id one, which the
 * feeder writes itself. */
static int enqueue_inputs(const struct dg_queue_spec *s)
{
	return s->n_components - (s->has_ids ? 1 : 0);
}

static enum dg_status infer_enqueue(struct dg_infer_ctx *c)
{
	struct dg_queue_spec s;
	int64_t v, n = -1;
	bool yes = true, b;

	if (check_queue(c) != DG_OK ||
	    worker_queue_components(c->attrs, &s, c->err) != DG_OK ||
	    int_attr(c, "epochs", 1, 1, 1000000, &v) != DG_OK ||
	    int_attr(c, "chunk", FEED_CHUNK, 1, 1 << 20, &v) != DG_OK ||
	    int_attr(c, "threads", 1, 1, FEED_MAX_THREADS, &v) != DG_OK ||
	    int_attr(c, "seed", 0, 0, INT64_MAX, &v) != DG_OK ||
	    int_attr(c, "id_base", 0, 0, (int64_t)1 << 48, &v) != DG_OK ||
	    dg_attr_bool(c->attrs, "close", &yes, &b, c->err) != DG_OK ||
	    dg_attr_bool(c->attrs, "shuffle", &yes, &b, c->err) != DG_OK)
		return c->err->code;
	if (c->n_in != enqueue_inputs(&s)) {
		dg_err_set(c->err, DG_EINVAL, "takes %d inputs (the queue's components%s), got %d",
			   enqueue_inputs(&s), s.has_ids ? " but the ids, which it writes" : "",
			   c->n_in);
		return DG_EINVAL;
	}
	for (int i = 0, k = 0; i < s.n_components; i++) {
		const struct dg_ttype *in;
		char want[96], got[96];
		if (s.has_ids && i == s.ids)
			continue;
		in = &c->in[k++];
		if (in->dtype != s.dtype[i])
			return dg_err_set(c->err, DG_EDTYPE, "input %d is %s; queue component %d "
					  "is %s", k - 1, dg_dtype_name(in->dtype), i,
					  dg_dtype_name(s.dtype[i]));
		bool ok = in->shape.ndim == s.shape[i].ndim + 1;
		for (int d = 0; ok && d < s.shape[i].ndim; d++)
			ok = in->shape.dim[d + 1] < 0 || in->shape.dim[d + 1] == s.shape[i].dim[d];
		if (ok && n >= 0 && in->shape.dim[0] >= 0 && in->shape.dim[0] != n)
			return dg_err_set(c->err, DG_ESHAPE, "input %d holds %" PRId64 " examples, "
					  "input 0 %" PRId64, k - 1, in->shape.dim[0], n);
		if (in->shape.ndim < 0)
			ok = true;      /* unknown rank: checked when it runs */
		if (!ok) {
			dg_shape_format(&s.shape[i], want, sizeof want);
			dg_shape_format(&in->shape, got, sizeof got);
			return dg_err_set(c->err, DG_ESHAPE, "input %d has shape %s; it must be "
					  "[N] + %s, a batch of queue component %d", k - 1, got,
					  want, i);
		}
		if (in->shape.ndim > 0 && in->shape.dim[0] >= 0)
			n = in->shape.dim[0];
	}
	scalar_i64(&c->out[0]);
	return DG_OK;
}

static enum dg_status infer_ack(struct dg_infer_ctx *c)
{
	bool yes = true, b;

	if (check_queue(c) != DG_OK ||
	    dg_attr_bool(c->attrs, "requeue_dropped", &yes, &b, c->err) != DG_OK)
		return c->err->code;
	for (int i = 0; i < c->n_in; i++)
		if (c->in[i].dtype != DG_I64 || c->in[i].shape.ndim != 0)
			return dg_err_set(c->err, DG_EDTYPE, "input %d must be an int64 scalar (%s)",
					  i, i == 0 ? "the lease of a QueueDequeueMany" :
					  "the version a VarApply returns");
	scalar_i64(&c->out[0]);
	scalar_i64(&c->out[1]);
	scalar_i64(&c->out[2]);
	return DG_OK;
}

static enum dg_status infer_scalar(struct dg_infer_ctx *c)
{
	if (check_queue(c) != DG_OK)
		return c->err->code;
	scalar_i64(&c->out[0]);
	return DG_OK;
}

static const struct dg_attr_spec dequeue_attrs[] = {
	{ "queue", DG_ATTR_STRING, true, "the queue (in a submitted graph: its Queue node)" },
	{ "ps", DG_ATTR_STRING, false, "host:port of the ps holding it (set by the master)" },
	{ "components", DG_ATTR_JSON, false, "[{\"dtype\", \"shape\"}] of one example (set by "
	  "the master from the Queue node)" },
	{ "ids", DG_ATTR_INT, false, "the id component (set by the master)" },
	{ "batch", DG_ATTR_INT, true, "examples per dequeue" },
	{ "allow_smaller", DG_ATTR_BOOL, false, "a short last batch once the queue is closed "
	  "(default true)" },
	{ "lease_ms", DG_ATTR_INT, false, "lease the batch for this long (0, default: no "
	  "lease; a training plan sets it)" },
	{ "holder", DG_ATTR_STRING, false, "the lease's holder tag" },
	{ "timeout_ms", DG_ATTR_INT, false, "wait at most this long (0, default: the step's "
	  "deadline)" },
	{ NULL, 0, false, NULL },
};
static const struct dg_attr_spec enqueue_attrs[] = {
	{ "queue", DG_ATTR_STRING, true, "the queue (in a submitted graph: its Queue node)" },
	{ "ps", DG_ATTR_STRING, false, "host:port of the ps holding it (set by the master)" },
	{ "components", DG_ATTR_JSON, false, "set by the master from the Queue node" },
	{ "ids", DG_ATTR_INT, false, "the id component, written by the feeder (set by the "
	  "master)" },
	{ "epochs", DG_ATTR_INT, false, "passes over the inputs (default 1)" },
	{ "shuffle", DG_ATTR_BOOL, false, "a new order each epoch (default true)" },
	{ "seed", DG_ATTR_INT, false, "seed of that order (default 0)" },
	{ "chunk", DG_ATTR_INT, false, "examples per enqueue request (default 1024)" },
	{ "threads", DG_ATTR_INT, false, "feeder threads, each with its own connection "
	  "(default 1)" },
	{ "id_base", DG_ATTR_INT, false, "example i's id is id_base + i (default 0)" },
	{ "close", DG_ATTR_BOOL, false, "close the queue after the last epoch (default true)" },
	{ NULL, 0, false, NULL },
};
static const struct dg_attr_spec ack_attrs[] = {
	{ "queue", DG_ATTR_STRING, true, "the queue" },
	{ "ps", DG_ATTR_STRING, false, "host:port of the ps holding it (set by the master)" },
	{ "requeue_dropped", DG_ATTR_BOOL, false, "a dropped (stale) update puts the batch "
	  "back in the queue (default true); false counts it as consumed" },
	{ NULL, 0, false, NULL },
};
static const struct dg_attr_spec plain_attrs[] = {
	{ "queue", DG_ATTR_STRING, true, "the queue" },
	{ "ps", DG_ATTR_STRING, false, "host:port of the ps holding it (set by the master)" },
	{ NULL, 0, false, NULL },
};

static const struct dg_op_def queue_ops[] = {
	{ .name = "QueueDequeueMany", .min_inputs = 0, .max_inputs = 0, .n_outputs = 0,
	  .num_outputs = dequeue_num_outputs, .attrs = dequeue_attrs, .infer = infer_dequeue,
	  .flags = DG_OPF_SOURCE | DG_OPF_STATEFUL,
	  .doc = "a batch of examples from a shared queue: one output per component, then "
		 "the lease (int64)" },
	{ .name = "QueueEnqueueMany", .min_inputs = 1, .max_inputs = DG_QUEUE_MAX_COMPONENTS,
	  .n_outputs = 1, .attrs = enqueue_attrs, .infer = infer_enqueue,
	  .flags = DG_OPF_STATEFUL,
	  .doc = "feed a shared queue: every example of the inputs once per epoch, with its "
		 "id; outputs the examples enqueued" },
	{ .name = "QueueAck", .min_inputs = 1, .max_inputs = -1, .n_outputs = 3,
	  .attrs = ack_attrs, .infer = infer_ack, .flags = DG_OPF_STATEFUL,
	  .doc = "end a dequeue's lease once the updates (inputs 1..) are applied: outputs "
		 "the examples applied and requeued, and the lease" },
	{ .name = "QueueClose", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = plain_attrs, .infer = infer_scalar, .flags = DG_OPF_SOURCE | DG_OPF_STATEFUL,
	  .doc = "close a shared queue: no more enqueues" },
	{ .name = "QueueSize", .min_inputs = 0, .max_inputs = 0, .n_outputs = 1,
	  .attrs = plain_attrs, .infer = infer_scalar, .flags = DG_OPF_SOURCE | DG_OPF_STATEFUL,
	  .doc = "the examples a shared queue holds now" },
};
#define N_QUEUE_OPS ((int)(sizeof queue_ops / sizeof *queue_ops))

void worker_queue_ops_register(void)
{
	struct dg_err err = { 0 };

	for (int i = 0; i < N_QUEUE_OPS; i++)
		if (dg_op_register(DG_OPL_WORKER | DG_OPL_MASTER, &queue_ops[i], &err) != DG_OK)
			dg_log(DG_LOG_ERROR, "worker", "%s", err.msg);   /* a name clash: our bug */
}

enum worker_opkind worker_queue_op_kind(const struct dg_op_def *op)
{
	if (op < queue_ops || op >= queue_ops + N_QUEUE_OPS)
		return WOP_NONE;
	return (enum worker_opkind)(WOP_QUEUE_DEQUEUE + (op - queue_ops));
}

/* ---------------------------------------------------------------- running */

static enum dg_status scalar_out(int64_t v, struct dg_tensor **out, struct dg_err *err)
{
	struct dg_shape s = { 0 };

	if (!(*out = dg_tensor_new(DG_I64, &s, err)))
		return err->code;
	*(int64_t *)(*out)->data = v;
	return DG_OK;
}

/* QueueDequeueMany: wait in slices until the batch comes, the step's
 * deadline passes or the step is aborted. The queue closed and drained is
 * DG_ECLOSED with *end set: the input is at its end. */
static enum dg_status run_dequeue(const struct worker_queue_call *q, struct dg_err *err)
{
	struct dg_queue_lease lease = { 0 };
	int64_t batch, zero = 0, timeout, got;
	uint64_t id = 0;
	bool yes = true, smaller;
	enum dg_status st;
	struct dg_deadline until = q->deadline;

	dg_attrs_int(q->attrs, "batch", &zero, &batch, NULL);
	dg_attrs_int(q->attrs, "lease_ms", &zero, &lease.lease_ms, NULL);
	dg_attrs_int(q->attrs, "timeout_ms", &zero, &timeout, NULL);
	dg_attrs_string(q->attrs, "holder", "", &lease.holder, NULL);
	dg_attrs_bool(q->attrs, "allow_smaller", &yes, &smaller, NULL);
	if (timeout > 0)
		until = dg_deadline_in_ms(timeout);
	for (;;) {
		int64_t left = dg_deadline_left_ms(until);
		if ((st = q->check(q->ud, err)) != DG_OK)
			return st;
		if (left <= 0)
			return dg_err_set(err, DG_ETIMEOUT, "no batch of %" PRId64 " from queue "
					  "'%s' in time", batch, q->queue);
		st = dg_queue_dequeue_lease(q->client, q->queue, batch, left < QUEUE_SLICE_MS ?
					    (long)left : QUEUE_SLICE_MS, smaller,
					    lease.lease_ms > 0 ? &lease : NULL, q->outs,
					    q->n_out - 1, &got, &id, err);
		if (st != DG_ETIMEOUT)
			break;
		dg_err_clear(err);
	}
	if (st == DG_ECLOSED) {
		*q->end = true;
		return st;
	}
	if (st != DG_OK)
		return st;
	return scalar_out((int64_t)id, &q->outs[q->n_out - 1], err);
}

/* QueueAck: ack the lease (input 0) when every update (inputs 1..) was
 * applied; a dropped one (version -1: a stale sync gradient) releases it
 * (requeue_dropped) or drops it. */
static enum dg_status run_ack(const struct worker_queue_call *q, struct dg_err *err)
{
	int64_t lease = *(const int64_t *)q->ins[0]->data, n = 0, applied = 0, requeued = 0;
	bool yes = true, requeue, dropped = false;
	enum dg_lease_end how;
	enum dg_status st;

	dg_attrs_bool(q->attrs, "requeue_dropped", &yes, &requeue, NULL);
	for (int i = 1; i < q->n_in; i++)
		dropped |= *(const int64_t *)q->ins[i]->data < 0;
	how = !dropped ? DG_LEASE_ACK : requeue ? DG_LEASE_RELEASE : DG_LEASE_DROP;
	if (lease > 0 && q->defer && q->lease_examples >= 0) {
		q->defer(q->ud, q->ps, q->queue, (uint64_t)lease, how);
		applied = how == DG_LEASE_ACK ? q->lease_examples : 0;
		requeued = how == DG_LEASE_RELEASE ? q->lease_examples : 0;
	} else if (lease > 0) {
		st = dg_queue_lease_end(q->client, q->queue, (uint64_t)lease, how, &n, err);
		if (st == DG_ENOTFOUND) {
			/* The lease ran out while the step ran: its examples are back
			 * in the queue although this step's update landed. Said, not
			 * failed: failing would not take the update back. */
			dg_log(DG_LOG_WARN, "worker", "queue '%s': lease %" PRId64 " ended before "
			       "its ack (%s); its examples were requeued and will be learned "
			       "again", q->queue, lease, err->msg);
			dg_err_clear(err);
			st = DG_OK;
		}
		if (st != DG_OK)
			return st;
		applied = how == DG_LEASE_ACK ? n : 0;
		requeued = how == DG_LEASE_RELEASE ? n : 0;
	}
	if ((st = scalar_out(applied, &q->outs[0], err)) != DG_OK ||
	    (st = scalar_out(requeued, &q->outs[1], err)) != DG_OK)
		return st;
	/* The lease names the batch in the ps's requeue log (the ledger's ids). */
	return scalar_out(lease, &q->outs[2], err);
}

static enum dg_status run_size(const struct worker_queue_call *q, struct dg_err *err)
{
	json_t *state = NULL;
	json_t *size;
	enum dg_status st = dg_queue_state(q->client, q->queue, &state, err);

	if (st != DG_OK)
		return st;
	size = json_object_get(state, "size");
	st = json_is_integer(size) ? scalar_out(json_integer_value(size), &q->outs[0], err) :
	     dg_err_set(err, DG_EINVAL, "queue '%s': its state has no size", q->queue);
	json_decref(state);
	return st;
}

/* ------------------------------------------------------------ the feeder */

/* What the feeder threads share: the inputs, the order of each epoch, and
 * the first error. */
struct feed {
	const struct worker_queue_call *q;
	struct dg_queue_spec spec;
	int n_in;                       /* inputs: every component but the ids */
	int64_t n;                      /* examples per epoch */
	int64_t epochs, chunk, seed, id_base;
	size_t row[DG_QUEUE_MAX_COMPONENTS];    /* bytes of one example's component */
	int threads;
	bool shuffle;
	pthread_mutex_t mu;
	enum dg_status st;              /* under mu: the first failure */
	struct dg_err err;
	int64_t enqueued;               /* under mu */
};

struct feeder {
	struct feed *f;
	int k;                          /* this thread's index */
	pthread_t th;
};

/* splitmix64, as the queue's own shuffle (ps/queue.c): the order of epoch e
 * is a Fisher-Yates permutation seeded by (seed, e). */
static uint64_t mix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void epoch_order(const struct feed *f, int64_t e, int64_t *perm)
{
	uint64_t s = (uint64_t)f->seed * 0x100000001b3ull ^ (uint64_t)e;

	for (int64_t i = 0; i < f->n; i++)
		perm[i] = i;
	for (int64_t i = f->n - 1; f->shuffle && i > 0; i--) {
		int64_t j = (int64_t)(mix(&s) % (uint64_t)(i + 1)), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
}

static bool feed_failed(struct feed *f)
{
	bool failed;

	pthread_mutex_lock(&f->mu);
	failed = f->st != DG_OK;
	pthread_mutex_unlock(&f->mu);
	return failed;
}

static void feed_fail(struct feed *f, enum dg_status st, const struct dg_err *err)
{
	pthread_mutex_lock(&f->mu);
	if (f->st == DG_OK) {
		f->st = st;
		f->err = *err;
	}
	pthread_mutex_unlock(&f->mu);
}

/* The examples perm[i0..i1) as one enqueue body, component-major (each
 * component's rows back to back, the queue's wire layout), built in body
 * (grown as needed): one copy of each row, straight from the inputs. The id
 * component is written from the example indices. */
static enum dg_status build_chunk(const struct feed *f, const int64_t *perm, int64_t i0,
				  int64_t i1, struct dg_buf *body, struct dg_err *err)
{
	int64_t m = i1 - i0;
	size_t per = 0, off = 0;
	enum dg_status st;

	for (int c = 0; c < f->spec.n_components; c++)
		per += f->row[c];
	body->len = 0;
	if ((st = dg_buf_reserve(body, (size_t)m * per, err)) != DG_OK)
		return st;
	for (int c = 0, k = 0; c < f->spec.n_components; c++) {
		char *dst = body->data + off;
		if (f->spec.has_ids && c == f->spec.ids) {
			for (int64_t t = 0; t < m; t++) {
				int64_t id = f->id_base + perm[i0 + t];
				if (f->spec.dtype[c] == DG_I32) {
					int32_t v = (int32_t)id;
					memcpy(dst + (size_t)t * sizeof v, &v, sizeof v);
				} else {
					memcpy(dst + (size_t)t * sizeof id, &id, sizeof id);
				}
			}
		} else {
			const char *src = f->q->ins[k++]->data;
			for (int64_t t = 0; t < m; t++)
				memcpy(dst + (size_t)t * f->row[c],
				       src + (size_t)perm[i0 + t] * f->row[c], f->row[c]);
		}
		off += (size_t)m * f->row[c];
	}
	body->len = off;
	return DG_OK;
}

/* Enqueue one batch, waiting in slices while the queue is full: in-process
 * when the queue is this task's own, else over c. */
static enum dg_status put_chunk(struct feed *f, struct dg_client *c, int64_t m,
				const struct dg_buf *body, struct dg_err *err)
{
	enum dg_status st;

	for (;;) {
		if ((st = f->q->check(f->q->ud, err)) != DG_OK)
			return st;
		if (feed_failed(f))
			return DG_ECANCELED;
		if (f->q->local_enqueue)
			st = f->q->local_enqueue(f->q->local_ud, f->q->queue, m, body->data,
						 body->len, QUEUE_SLICE_MS, err);
		else
			st = dg_queue_enqueue_body(c, f->q->queue, m, body->data, body->len,
						   QUEUE_SLICE_MS, err);
		if (st != DG_ETIMEOUT)
			return st;
		dg_err_clear(err);
	}
}

static void *feeder_main(void *arg)
{
	struct feeder *fd = arg;
	struct feed *f = fd->f;
	struct dg_err err = { 0 };
	struct dg_buf body;
	struct dg_client *c = fd->k == 0 || f->q->local_enqueue ? f->q->client :
			      dg_client_new(f->q->ps, f->q->token, &err);
	int64_t *perm = malloc((size_t)f->n * sizeof *perm + 1), sent = 0;
	enum dg_status st = DG_OK;

	dg_buf_init(&body);
	if (!c || !perm)
		st = c ? dg_err_set(&err, DG_ENOMEM, "out of memory for the feeder") : err.code;
	for (int64_t e = 0; st == DG_OK && e < f->epochs; e++) {
		epoch_order(f, e, perm);
		/* Thread k sends chunks k, k+T, k+2T, ... of each epoch. */
		for (int64_t i0 = (int64_t)fd->k * f->chunk; st == DG_OK && i0 < f->n;
		     i0 += (int64_t)f->threads * f->chunk) {
			int64_t i1 = i0 + f->chunk < f->n ? i0 + f->chunk : f->n;
			st = build_chunk(f, perm, i0, i1, &body, &err);
			if (st == DG_OK)
				st = put_chunk(f, c, i1 - i0, &body, &err);
			if (st == DG_OK)
				sent += i1 - i0;
		}
	}
	if (st != DG_OK && st != DG_ECANCELED)
		feed_fail(f, st, &err);
	pthread_mutex_lock(&f->mu);
	f->enqueued += sent;
	pthread_mutex_unlock(&f->mu);
	free(perm);
	dg_buf_deinit(&body);
	if (c != f->q->client)
		dg_client_free(c);
	return NULL;
}

/* QueueEnqueueMany: every example of the inputs once per epoch, in threads
 * (thread 0 on the executor's client), then close the queue. */
static enum dg_status run_enqueue(const struct worker_queue_call *q, struct dg_err *err)
{
	struct feed f = { .q = q };
	struct feeder fd[FEED_MAX_THREADS];
	int64_t zero = 0, one = 1, chunk = FEED_CHUNK, threads;
	bool yes = true, close;
	enum dg_status st;
	int started = 0;

	if ((st = worker_queue_components(q->attrs.json, &f.spec, err)) != DG_OK)
		return st;
	dg_attrs_int(q->attrs, "epochs", &one, &f.epochs, NULL);
	dg_attrs_int(q->attrs, "chunk", &chunk, &f.chunk, NULL);
	dg_attrs_int(q->attrs, "threads", &one, &threads, NULL);
	dg_attrs_int(q->attrs, "seed", &zero, &f.seed, NULL);
	dg_attrs_int(q->attrs, "id_base", &zero, &f.id_base, NULL);
	dg_attrs_bool(q->attrs, "shuffle", &yes, &f.shuffle, NULL);
	dg_attrs_bool(q->attrs, "close", &yes, &close, NULL);
	f.n_in = q->n_in;
	f.n = q->ins[0]->shape.ndim > 0 ? q->ins[0]->shape.dim[0] : 0;
	for (int i = 0; i < q->n_in; i++)
		if (q->ins[i]->shape.ndim < 1 || q->ins[i]->shape.dim[0] != f.n)
			return dg_err_set(err, DG_ESHAPE, "input %d does not hold %" PRId64
					  " examples as input 0 does", i, f.n);
	if (f.n < 1)
		return dg_err_set(err, DG_EINVAL, "nothing to feed: input 0 holds no example");
	for (int c = 0, k = 0; c < f.spec.n_components; c++) {
		int64_t numel = 1;
		for (int d = 0; d < f.spec.shape[c].ndim; d++)
			numel *= f.spec.shape[c].dim[d];
		f.row[c] = (size_t)numel * dg_dtype_size(f.spec.dtype[c]);
		if (f.spec.has_ids && c == f.spec.ids)
			continue;
		const struct dg_tensor *in = q->ins[k++];
		if (in->dtype != f.spec.dtype[c] || in->nbytes != (size_t)f.n * f.row[c])
			return dg_err_set(err, DG_ESHAPE, "input %d is not %" PRId64 " examples of "
					  "queue component %d (%s, %zu bytes each)", k - 1, f.n, c,
					  dg_dtype_name(f.spec.dtype[c]), f.row[c]);
	}
	f.threads = (int)(threads < (f.n + f.chunk - 1) / f.chunk ? threads :
			  (f.n + f.chunk - 1) / f.chunk);
	pthread_mutex_init(&f.mu, NULL);
	for (int k = 0; k < f.threads; k++) {
		fd[k] = (struct feeder){ .f = &f, .k = k };
		if (k > 0 && pthread_create(&fd[k].th, NULL, feeder_main, &fd[k]) != 0)
			break;
		started++;
	}
	if (started < f.threads) {
		struct dg_err e = { 0 };
		dg_err_set(&e, DG_ENOMEM, "cannot start %d feeder threads", f.threads);
		feed_fail(&f, e.code, &e);
	} else {
		feeder_main(&fd[0]);
	}
	for (int k = 1; k < started; k++)
		pthread_join(fd[k].th, NULL);
	pthread_mutex_destroy(&f.mu);
	if (f.st != DG_OK) {
		*err = f.err;
		return f.st;
	}
	dg_log(DG_LOG_DEBUG, "worker", "queue '%s': fed %" PRId64 " examples (%" PRId64
	       " epochs of %" PRId64 ")", q->queue, f.enqueued, f.epochs, f.n);
	if (close && (st = dg_queue_close(q->client, q->queue, err)) != DG_OK)
		return st;
	return scalar_out(f.enqueued, &q->outs[0], err);
}

enum dg_status worker_queue_run(enum worker_opkind kind, const struct worker_queue_call *q,
				struct dg_err *err)
{
	enum dg_status st;

	switch (kind) {
	case WOP_QUEUE_DEQUEUE:
		return run_dequeue(q, err);
	case WOP_QUEUE_ENQUEUE:
		return run_enqueue(q, err);
	case WOP_QUEUE_ACK:
		return run_ack(q, err);
	case WOP_QUEUE_CLOSE:
		if ((st = dg_queue_close(q->client, q->queue, err)) != DG_OK)
			return st;
		return scalar_out(1, &q->outs[0], err);
	case WOP_QUEUE_SIZE:
		return run_size(q, err);
	default:
		return dg_err_set(err, DG_EINTERNAL, "not a queue op");
	}
}

/* ------------------------------------------------------------ dg feed */

static enum dg_status feed_check(void *ud, struct dg_err *err)
{
	const atomic_bool *stop = ud;

	if (stop && atomic_load(stop))
		return dg_err_set(err, DG_ECANCELED, "feeding was interrupted");
	return DG_OK;
}

enum dg_status worker_feed_queue(const struct worker_feed *f, int64_t *enqueued,
				 struct dg_err *err)
{
	struct dg_tensor *out = NULL;
	struct dg_client *c = dg_client_new(f->ps, f->token, err);
	enum dg_status st;

	*enqueued = 0;
	if (!c)
		return err ? err->code : DG_ENOMEM;
	struct worker_queue_call q = {
		.client = c, .ps = f->ps, .token = f->token, .queue = f->queue,
		.attrs = dg_attrs_of_json(f->attrs), .ins = f->ins, .n_in = f->n_in, .outs = &out,
		.n_out = 1, .deadline = dg_deadline_in_ms(-1), .check = feed_check,
		.ud = (void *)f->stop, .lease_examples = -1,
	};
	st = run_enqueue(&q, err);
	if (st == DG_OK)
		*enqueued = *(const int64_t *)out->data;
	dg_tensor_free(out);
	dg_client_free(c);
	return st;
}
