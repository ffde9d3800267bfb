/* The op registry: one sorted index of every op a graph can name, each with
 * the layer that runs it (dg/op.h, enum dg_op_layer). The kernel families of
 * kernels/cpu are indexed here on first use, each op's CUDA kernel set from
 * kernels/cuda's table in CUDA builds; the layers above add their own
 * tables at start-up through dg_op_register (worker/ops.c: _Send, _Recv, the
 * Var* ops; the master: Variable, ApplyGradient), so nothing in kernels/ calls
 * up and every lookup, whatever layers it accepts, reads this one index. Also
 * dg_op_run, the one place that checks arity and attrs before a kernel runs
 * outside a graph. */
#include "dg/kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cuda/cuda_kernels.h"
#include "dg/log.h"

static struct dg_op_def *const families[] = {
	dg_ops_basic, dg_ops_eltwise, dg_ops_reduce, dg_ops_nn,
	dg_ops_matmul, dg_ops_array, dg_ops_random, dg_ops_grad, dg_ops_data, dg_ops_conv,
	dg_ops_norm,
};

#define MAX_OPS 256

struct entry {
	const struct dg_op_def *def;
	unsigned layer;                 /* DG_OPL_* bits */
};

/* Sorted by name. Written under the write lock: the kernel families once,
 * then each op a layer registers (start-up, rare); read under the read lock
 * by lookups (graph validation, not the step path). */
static struct entry index_[MAX_OPS];
static int n_index;
static pthread_rwlock_t index_mu = PTHREAD_RWLOCK_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int by_name(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	return strcmp(x->def->name, y->def->name);
}

static const struct entry *search(const char *name);

/* Point each kernel op that has a GPU kernel at it (CUDA builds; the table is
 * empty otherwise). Runs once, before the index is first read, so the slots
 * never change under a reader. */
static void set_cuda_kernels(void)
{
	for (const struct dg_cuda_kernel_entry *k = dg_cuda_kernels; k->op; k++) {
		const struct entry *e = search(k->op);
		if (!e || e->layer != DG_OPL_KERNEL) {
			dg_log(DG_LOG_ERROR, "kernels", "CUDA kernel for unknown op '%s'", k->op);
			continue;
		}
		for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
			for (struct dg_op_def *op = families[f]; op->name; op++)
				if (op == e->def)
					op->cuda = k->run;
	}
}

static void build_index(void)
{
	pthread_rwlock_wrlock(&index_mu);
	for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
		for (const struct dg_op_def *op = families[f]; op->name; op++)
			if (n_index < MAX_OPS)
				index_[n_index++] = (struct entry){ op, DG_OPL_KERNEL };
	qsort(index_, (size_t)n_index, sizeof index_[0], by_name);
	set_cuda_kernels();
	pthread_rwlock_unlock(&index_mu);
}

/* Binary search; the caller holds the lock. */
static const struct entry *search(const char *name)
{
	int lo = 0, hi = n_index - 1;

	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		int c = strcmp(name, index_[mid].def->name);
		if (c == 0)
			return &index_[mid];
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return NULL;
}

const struct dg_op_def *dg_op_find_in(const char *name, unsigned layers)
{
	const struct dg_op_def *op = NULL;
	const struct entry *e;

	pthread_once(&once, build_index);
	if (!name)
		return NULL;
	pthread_rwlock_rdlock(&index_mu);
	e = search(name);
	if (e && (e->layer & layers))
		op = e->def;
	pthread_rwlock_unlock(&index_mu);
	return op;
}

const struct dg_op_def *dg_op_find(const char *name)
{
	return dg_op_find_in(name, DG_OPL_KERNEL);
}

enum dg_status dg_op_register(unsigned layer, const struct dg_op_def *op,
			      struct dg_err *err)
{
	enum dg_status st = DG_OK;
	const struct entry *e;

	/* One op may serve both upper layers (the queue ops: named in a submitted
	 * graph, run by the executor). */
	if (!op || !op->name || !op->name[0] || !layer ||
	    (layer & ~(unsigned)(DG_OPL_WORKER | DG_OPL_MASTER)))
		return dg_err_set(err, DG_EINVAL, "dg_op_register needs a named op of the worker "
				  "or master layer");
	pthread_once(&once, build_index);
	pthread_rwlock_wrlock(&index_mu);
	e = search(op->name);
	if (e && (e->def != op || e->layer != layer)) {
		st = dg_err_set(err, DG_EEXIST, "op '%s' is already registered", op->name);
	} else if (!e && n_index >= MAX_OPS) {
		st = dg_err_set(err, DG_ETOOLARGE, "the op registry is full (%d ops)", MAX_OPS);
	} else if (!e) {
		/* Insertion keeps the index sorted without a full sort. */
		int i = n_index;
		while (i > 0 && strcmp(index_[i - 1].def->name, op->name) > 0) {
			index_[i] = index_[i - 1];
			i--;
		}
		index_[i] = (struct entry){ op, layer };
		n_index++;
	}
	pthread_rwlock_unlock(&index_mu);
	return st;
}

int dg_op_count(void)
{
	int n;

	pthread_once(&once, build_index);
	pthread_rwlock_rdlock(&index_mu);
	n = n_index;
	pthread_rwlock_unlock(&index_mu);
	return n;
}

const struct dg_op_def *dg_op_at(int i)
{
	const struct dg_op_def *op = NULL;

	pthread_once(&once, build_index);
	pthread_rwlock_rdlock(&index_mu);
	if (i >= 0 && i < n_index)
		op = index_[i].def;
	pthread_rwlock_unlock(&index_mu);
	return op;
}

unsigned dg_op_layer_of(const struct dg_op_def *op)
{
	unsigned layer = 0;
	const struct entry *e;

	pthread_once(&once, build_index);
	if (!op || !op->name)
		return 0;
	pthread_rwlock_rdlock(&index_mu);
	e = search(op->name);
	if (e && e->def == op)
		layer = e->layer;
	pthread_rwlock_unlock(&index_mu);
	return layer;
}

enum dg_status dg_op_run(const struct dg_op_def *op, const json_t *attrs,
			 const struct dg_tensor *const *in, int n_in, struct dg_tensor **out,
			 int n_out, uint64_t step, struct dg_err *err)
{
	enum dg_status st;
	int max_in = op->max_inputs < 0 ? DG_MAX_INPUTS : op->max_inputs;
	json_t *empty = NULL;

	for (int i = 0; i < n_out; i++)
		out[i] = NULL;
	if (!op->cpu)
		return dg_err_set(err, DG_EUNSUPPORTED, "%s has no kernel: only a %s runs it",
				  op->name, dg_op_layer_of(op) == DG_OPL_MASTER ? "dg submit" :
				  "worker's executor");
	if (n_in < op->min_inputs || n_in > max_in) {
		st = dg_err_set(err, DG_EINVAL, "%s takes %d..%d inputs, got %d", op->name,
				op->min_inputs, max_in, n_in);
		return st;
	}
	if (!attrs)
		attrs = empty = json_object();
	st = dg_attr_validate(op, attrs, err);
	if (st == DG_OK) {
		int want = op->n_outputs;
		if (op->num_outputs)
			want = op->num_outputs(attrs, err);
		if (want < 0) {
			st = err ? err->code : DG_EINVAL;
		} else if (want != n_out) {
			st = dg_err_set(err, DG_EINVAL, "%s produces %d outputs; caller expects %d",
					op->name, want, n_out);
		}
	}
	if (st == DG_OK) {
		struct dg_kernel_ctx c = {
			/* A JSON view: one call, nothing to parse ahead of. */
			.attrs = dg_attrs_of_json(attrs), .n_in = n_in, .in = in,
			.n_out = n_out, .out = out,
			.step = step, .err = err,
		};
		st = op->cpu(&c);
		if (st != DG_OK) {
			for (int i = 0; i < n_out; i++) {
				dg_tensor_free(out[i]);
				out[i] = NULL;
			}
		}
	}
	if (st != DG_OK)
		dg_err_prefix(err, "%s", op->name);
	json_decref(empty);
	return st;
}
