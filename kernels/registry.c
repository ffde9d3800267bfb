/* The op registry: the family tables of kernels/cpu collected into one sorted
 * index, looked up by name (binary search), and dg_op_run, the one place that
 * checks arity and attrs before a kernel runs outside a graph. */
#include "dg/kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"

static const struct dg_op_def *const families[] = {
	dg_ops_basic, dg_ops_eltwise, dg_ops_reduce, dg_ops_nn,
	dg_ops_matmul, dg_ops_array, dg_ops_random, dg_ops_grad, dg_ops_data,
};

#define MAX_OPS 256
static const struct dg_op_def *sorted[MAX_OPS];
static int n_sorted;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int by_name(const void *a, const void *b)
{
	const struct dg_op_def *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

static void build_index(void)
{
	for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
		for (const struct dg_op_def *op = families[f]; op->name; op++)
			if (n_sorted < MAX_OPS)
				sorted[n_sorted++] = op;
	qsort(sorted, (size_t)n_sorted, sizeof sorted[0], by_name);
}

const struct dg_op_def *dg_op_find(const char *name)
{
	int lo = 0, hi;

	pthread_once(&once, build_index);
	if (!name)
		return NULL;
	hi = n_sorted - 1;
	while (lo <= hi) {
		int mid = (lo + hi) / 2;
		int c = strcmp(name, sorted[mid]->name);
		if (c == 0)
			return sorted[mid];
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return NULL;
}

int dg_op_count(void)
{
	pthread_once(&once, build_index);
	return n_sorted;
}

const struct dg_op_def *dg_op_at(int i)
{
	pthread_once(&once, build_index);
	return i >= 0 && i < n_sorted ? sorted[i] : NULL;
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
			.attrs = attrs, .n_in = n_in, .in = in, .n_out = n_out, .out = out,
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
