/* The C side of kernels/cuda: streams, device tensors, transfers, and
 * dg_cuda_run, which checks an op's arity and attrs, infers its outputs with
 * the op's own inference (kernels/cpu/), allocates them from the caching
 * allocator (memory.c) and calls the launchers of the .cu files (cuda_launch.h)
 * or cuBLAS (matmul.c). Shapes, strides and attrs are worked out here, in C;
 * the kernels only walk what they are given. dg_cuda_kernels, the table of
 * one function per op, is read once by kernels/registry.c, which points each
 * op's entry (.cuda) at its kernel; dg_cuda_run calls the entry. */
#include "cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/cpu.h"
#include "../philox.h"
#include "cuda_kernels.h"
#include "cuda_launch.h"
#include "dg/gpu.h"
#include "dg/kernels.h"
#include "dg/log.h"

bool dg_cuda_available(void)
{
	return dg_gpu_count() > 0;
}

/* --- streams ---------------------------------------------------------------- */

enum dg_status dg_cuda_stream_new(int device, struct dg_cuda_stream **out, struct dg_err *err)
{
	struct dg_cuda_stream *s;
	enum dg_status st;

	*out = NULL;
	st = cuda_set_device(device, err);
	if (st != DG_OK)
		return st;
	s = calloc(1, sizeof *s);
	if (!s)
		return dg_err_set(err, DG_ENOMEM, "no memory for a CUDA stream");
	s->device = device;
	st = DG_CUDA_CHECK(cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking), err);
	if (st == DG_OK)
		st = DG_CUBLAS_CHECK(cublasCreate(&s->blas), err);
	if (st == DG_OK)
		st = DG_CUBLAS_CHECK(cublasSetStream(s->blas, s->s), err);
	if (st == DG_OK)
		st = dg_cuda_mem_alloc(device, sizeof *s->flag, (void **)&s->flag, &s->flag_cap,
				       err);
	if (st == DG_OK) {
		s->flag_host = dg_cuda_host_alloc(sizeof *s->flag_host, err);
		if (!s->flag_host)
			st = err ? err->code : DG_ENOMEM;
	}
	if (st != DG_OK) {
		dg_err_prefix(err, "creating a stream on GPU %d", device);
		dg_cuda_stream_free(s);
		return st;
	}
	*out = s;
	return DG_OK;
}

void dg_cuda_stream_free(struct dg_cuda_stream *s)
{
	if (!s)
		return;
	if (cudaSetDevice(s->device) != cudaSuccess)
		cudaGetLastError();
	if (s->s)
		cudaStreamSynchronize(s->s);
	if (s->blas)
		cublasDestroy(s->blas);
	dg_cuda_mem_release(s->device, s->flag, s->flag_cap);
	dg_cuda_mem_release(s->device, s->scratch, s->scratch_cap);
	dg_cuda_host_free(s->flag_host);
	if (s->s)
		cudaStreamDestroy(s->s);
	cudaGetLastError();
	free(s);
}

enum dg_status dg_cuda_stream_sync(struct dg_cuda_stream *s, struct dg_err *err)
{
	enum dg_status st = cuda_set_device(s->device, err);

	if (st == DG_OK)
		st = DG_CUDA_CHECK(cudaStreamSynchronize(s->s), err);
	return st;
}

int dg_cuda_stream_device(const struct dg_cuda_stream *s)
{
	return s->device;
}

/* The data-dependent error word: reset before a kernel that may lower it, read
 * (with a sync) after. */
static enum dg_status flag_reset(struct dg_cuda_stream *s, struct dg_err *err)
{
	return DG_CUDA_CHECK(cudaMemsetAsync(s->flag, 0xff, sizeof *s->flag, s->s), err);
}

static enum dg_status flag_read(struct dg_cuda_stream *s, unsigned long long *v,
				struct dg_err *err)
{
	enum dg_status st = DG_CUDA_CHECK(cudaMemcpyAsync(s->flag_host, s->flag, sizeof *s->flag,
							  cudaMemcpyDeviceToHost, s->s),
					  err);

	if (st == DG_OK)
		st = DG_CUDA_CHECK(cudaStreamSynchronize(s->s), err);
	*v = st == DG_OK ? *s->flag_host : ~0ull;
	return st;
}

/* At least n bytes of s's own work memory in *p. The block stays with the
 * stream, so work queued on s may use it while later work queues behind: no
 * other stream can be handed it. Growing waits for s before releasing the old
 * block to the shared cache. */
enum dg_status cuda_stream_scratch(struct dg_cuda_stream *s, size_t n, void **p,
				   struct dg_err *err)
{
	enum dg_status st = DG_OK;

	if (n > s->scratch_cap) {
		st = DG_CUDA_CHECK(cudaStreamSynchronize(s->s), err);
		if (st != DG_OK)
			return st;
		dg_cuda_mem_release(s->device, s->scratch, s->scratch_cap);
		s->scratch = NULL;
		s->scratch_cap = 0;
		st = dg_cuda_mem_alloc(s->device, n, &s->scratch, &s->scratch_cap, err);
	}
	*p = s->scratch;
	return st;
}

/* --- device tensors and transfers --------------------------------------------- */

struct dg_cuda_tensor *dg_cuda_tensor_new(struct dg_cuda_stream *s, enum dg_dtype dt,
					  const struct dg_shape *shape, struct dg_err *err)
{
	struct dg_cuda_tensor *t;
	int64_t n;

	if ((unsigned)dt >= DG_DTYPE_COUNT) {
		dg_err_set(err, DG_EDTYPE, "invalid dtype code %d", (int)dt);
		return NULL;
	}
	if (shape->ndim < 0 || shape->ndim > DG_MAX_DIMS) {
		dg_err_set(err, DG_EINVAL, "invalid rank %d for a device tensor", shape->ndim);
		return NULL;
	}
	if (dg_shape_numel(shape, &n, err) != DG_OK)
		return NULL;
	t = calloc(1, sizeof *t);
	if (!t) {
		dg_err_set(err, DG_ENOMEM, "no memory for a device tensor header");
		return NULL;
	}
	t->dtype = dt;
	t->shape = *shape;
	t->numel = n;
	t->nbytes = (size_t)n * dg_dtype_size(dt);
	t->device = s->device;
	if (dg_cuda_mem_alloc(s->device, t->nbytes, &t->data, &t->cap, err) != DG_OK) {
		free(t);
		return NULL;
	}
	return t;
}

void dg_cuda_tensor_free(struct dg_cuda_tensor *t)
{
	if (!t)
		return;
	dg_cuda_mem_release(t->device, t->data, t->cap);
	free(t);
}

struct dg_cuda_tensor *dg_cuda_upload(struct dg_cuda_stream *s, const struct dg_tensor *t,
				      struct dg_err *err)
{
	struct dg_cuda_tensor *d = dg_cuda_tensor_new(s, t->dtype, &t->shape, err);
	void *pin;
	enum dg_status st;

	if (!d || d->nbytes == 0)
		return d;
	pin = dg_cuda_host_alloc(d->nbytes, err);
	if (!pin) {
		dg_cuda_tensor_free(d);
		return NULL;
	}
	/* Pinned staging: the DMA engine reads page-locked memory directly. */
	memcpy(pin, t->data, d->nbytes);
	st = DG_CUDA_CHECK(cudaMemcpyAsync(d->data, pin, d->nbytes, cudaMemcpyHostToDevice, s->s),
			   err);
	if (st == DG_OK)
		st = DG_CUDA_CHECK(cudaStreamSynchronize(s->s), err);
	dg_cuda_host_free(pin);
	if (st != DG_OK) {
		dg_err_prefix(err, "uploading %zu bytes to GPU %d", d->nbytes, s->device);
		dg_cuda_tensor_free(d);
		return NULL;
	}
	return d;
}

struct dg_tensor *dg_cuda_download(struct dg_cuda_stream *s, const struct dg_cuda_tensor *t,
				   struct dg_err *err)
{
	struct dg_tensor *h = dg_tensor_new_uninit(t->dtype, &t->shape, err);
	void *pin;
	enum dg_status st;

	if (!h || t->nbytes == 0)
		return h;
	pin = dg_cuda_host_alloc(t->nbytes, err);
	if (!pin) {
		dg_tensor_free(h);
		return NULL;
	}
	st = DG_CUDA_CHECK(cudaMemcpyAsync(pin, t->data, t->nbytes, cudaMemcpyDeviceToHost, s->s),
			   err);
	if (st == DG_OK)
		st = DG_CUDA_CHECK(cudaStreamSynchronize(s->s), err);
	if (st == DG_OK)
		memcpy(h->data, pin, t->nbytes);
	dg_cuda_host_free(pin);
	if (st != DG_OK) {
		dg_err_prefix(err, "downloading %zu bytes from GPU %d", t->nbytes, s->device);
		dg_tensor_free(h);
		return NULL;
	}
	return h;
}

/* --- walks -------------------------------------------------------------------- */

static void c_strides(const struct dg_shape *s, int64_t *st)
{
	int64_t m = 1;

	for (int i = s->ndim - 1; i >= 0; i--) {
		st[i] = m;
		m *= s->dim[i];
	}
}

/* Drop size-1 dims and merge neighbours every operand steps through as one
 * dim; an empty result becomes one dim of 1. */
static void walk_compact(struct dgc_walk *w, int n_ops)
{
	int nd = 0;

	for (int i = 0; i < w->nd; i++) {
		if (w->dim[i] == 1)
			continue;
		w->dim[nd] = w->dim[i];
		for (int k = 0; k < n_ops; k++)
			w->st[k][nd] = w->st[k][i];
		nd++;
	}
	if (nd == 0) {
		w->nd = 1;
		w->dim[0] = 1;
		for (int k = 0; k < n_ops; k++)
			w->st[k][0] = 0;
		return;
	}
	int o = 0;
	for (int i = 1; i < nd; i++) {
		bool merge = true;
		for (int k = 0; k < n_ops; k++)
			merge = merge && w->st[k][o] == w->st[k][i] * w->dim[i];
		if (merge) {
			w->dim[o] *= w->dim[i];
			for (int k = 0; k < n_ops; k++)
				w->st[k][o] = w->st[k][i];
		} else {
			o++;
			w->dim[o] = w->dim[i];
			for (int k = 0; k < n_ops; k++)
				w->st[k][o] = w->st[k][i];
		}
	}
	w->nd = o + 1;
}

/* Broadcast walk of n operands over output shape out (already checked). */
static void walk_bcast(struct dgc_walk *w, const struct dg_shape *out,
		       const struct dg_shape *const *in, int n)
{
	memset(w, 0, sizeof *w);
	w->nd = out->ndim;
	for (int i = 0; i < out->ndim; i++)
		w->dim[i] = out->dim[i];
	for (int k = 0; k < n; k++) {
		int64_t st[DG_MAX_DIMS];
		c_strides(in[k], st);
		for (int i = 0; i < out->ndim; i++) {
			int j = i - (out->ndim - in[k]->ndim);
			w->st[k][i] = j >= 0 && in[k]->dim[j] != 1 ? st[j] : 0;
		}
	}
	walk_compact(w, n);
}

/* --- the op families ------------------------------------------------------------ */

/* Everything a kernel sees (dg_cuda_kernel_fn of dg/op.h). */
struct dg_cuda_ctx {
	struct dg_cuda_stream *s;
	const struct dg_op_def *op;
	struct dg_attrs attrs;
	const struct dg_cuda_tensor *const *in;
	int n_in;
	struct dg_cuda_tensor **out;
	int n_out;
	uint64_t step;
	struct dg_err *err;
};

static enum dg_status launched(struct dg_cuda_ctx *r, cudaError_t e)
{
	return e == cudaSuccess ? DG_OK : cuda_fail(r->err, e, "kernel launch");
}

static enum dg_status no_kernel(struct dg_cuda_ctx *r, enum dg_dtype dt)
{
	dg_err_set(r->err, DG_EDTYPE, "no CUDA kernel for %s", dg_dtype_name(dt));
	dg_err_hint(r->err, "place this node on the CPU, or Cast to float32");
	return DG_EDTYPE;
}

/* The op codes of the .cu launchers (cuda_launch.h): the order of the
 * wrappers in the kernel table below. */
enum { U_NEG, U_ABS, U_SQUARE, U_RELU, U_SQRT, U_EXP, U_LOG, U_SIGMOID, U_TANH };
enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MAXIMUM, B_MINIMUM, B_EQUAL, B_NOT_EQUAL, B_LESS,
       B_LESS_EQUAL, B_GREATER, B_GREATER_EQUAL };

static enum dg_status run_unary(struct dg_cuda_ctx *r, int op)
{
	const struct dg_cuda_tensor *x = r->in[0];

	if (!dgc_unary_has(op, (int)x->dtype))
		return no_kernel(r, x->dtype);
	return launched(r, dgc_unary(op, (int)x->dtype, x->data, r->out[0]->data, x->numel,
				     r->s->s));
}

static enum dg_status run_binary(struct dg_cuda_ctx *r, int op)
{
	const struct dg_cuda_tensor *a = r->in[0], *b = r->in[1];
	struct dg_cuda_tensor *o = r->out[0];
	struct dgc_walk w;

	if (!dgc_binary_has(op, (int)a->dtype))
		return no_kernel(r, a->dtype);
	if (dg_shape_eq(&a->shape, &b->shape))
		return launched(r, dgc_binary(op, (int)a->dtype, a->data, b->data, o->data,
					      o->numel, NULL, r->s->s));
	const struct dg_shape *shapes[2] = { &a->shape, &b->shape };
	walk_bcast(&w, &o->shape, shapes, 2);
	return launched(r, dgc_binary(op, (int)a->dtype, a->data, b->data, o->data, o->numel, &w,
				      r->s->s));
}

static enum dg_status run_where(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *k = r->in[0], *x = r->in[1], *y = r->in[2];
	struct dg_cuda_tensor *o = r->out[0];
	const struct dg_shape *shapes[3] = { &k->shape, &x->shape, &y->shape };
	struct dgc_walk w;

	walk_bcast(&w, &o->shape, shapes, 3);
	return launched(r, dgc_where(k->data, x->data, y->data, o->data, o->numel, &w,
				     (int)dg_dtype_size(x->dtype), r->s->s));
}

static enum dg_status run_cast(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *x = r->in[0];
	struct dg_cuda_tensor *o = r->out[0];
	/* Only float -> int can fail: to bool, to floats and to 16-bit floats
	 * (overflow gives inf) always have a value. */
	bool checked = (dg_dtype_is_float(x->dtype) || dg_dtype_is_half(x->dtype)) &&
		       dg_dtype_is_int(o->dtype);
	unsigned long long bad;
	enum dg_status st = checked ? flag_reset(r->s, r->err) : DG_OK;

	if (st != DG_OK)
		return st;
	st = launched(r, dgc_cast((int)x->dtype, (int)o->dtype, x->data, o->data, x->numel,
				  r->s->flag, r->s->s));
	if (st != DG_OK || !checked || x->numel == 0)
		return st;
	st = flag_read(r->s, &bad, r->err);
	if (st != DG_OK || bad == ~0ull)
		return st;
	dg_err_set(r->err, DG_EINVAL, "Cast of %s element %llu to %s: NaN, Inf and out-of-range "
		   "values have no %s value", dg_dtype_name(x->dtype), bad,
		   dg_dtype_name(o->dtype), dg_dtype_name(o->dtype));
	dg_err_hint(r->err, "replace or clip such values first (Where, Maximum, Minimum)");
	return DG_EINVAL;
}

/* Reduced-axes mask from attr "axis" (absent or null: all; an int or a list;
 * negative counts from the end). Inference has validated it already. */
static enum dg_status axes_mask(struct dg_cuda_ctx *r, int ndim, unsigned *mask)
{
	const json_t *a = dg_attrs_get(r->attrs, "axis");
	int64_t ax[DG_MAX_DIMS * 4];
	int n = 0;

	*mask = 0;
	if (!a || json_is_null(a)) {
		*mask = ndim ? (1u << ndim) - 1 : 0;
		return DG_OK;
	}
	if (json_is_integer(a)) {
		ax[n++] = json_integer_value(a);
	} else if (json_is_array(a) && json_array_size(a) <= DG_MAX_DIMS * 4) {
		size_t i;
		json_t *v;
		json_array_foreach(a, i, v) {
			if (!json_is_integer(v))
				return dg_err_set(r->err, DG_EINVAL,
						  "attr 'axis' must hold integers");
			ax[n++] = json_integer_value(v);
		}
	} else {
		return dg_err_set(r->err, DG_EINVAL, "attr 'axis' must be an integer or a list");
	}
	for (int i = 0; i < n; i++) {
		int64_t v = ax[i] < 0 ? ax[i] + ndim : ax[i];
		if (v < 0 || v >= ndim)
			return dg_err_set(r->err, DG_EINVAL,
					  "axis %lld is out of range for rank %d", (long long)ax[i],
					  ndim);
		*mask |= 1u << v;
	}
	return DG_OK;
}

/* Reduce x (float) over the dims in mask into o, whose C order is that of x's
 * kept dims (Sum/Mean/Max/Min, and SumToShapeOf). */
static enum dg_status reduce_masked(struct dg_cuda_ctx *r, int op, const struct dg_cuda_tensor *x,
				    struct dg_cuda_tensor *o, unsigned mask)
{
	struct dgc_walk kept = { 0 }, red = { 0 };
	int64_t st_in[DG_MAX_DIMS], count = 1;
	int cols;
	void *scratch = NULL;
	size_t need;
	enum dg_status st;

	if (o->numel == 0)
		return DG_OK;
	c_strides(&x->shape, st_in);
	for (int i = 0; i < x->shape.ndim; i++) {
		struct dgc_walk *w = mask >> i & 1 ? &red : &kept;
		w->dim[w->nd] = x->shape.dim[i];
		w->st[0][w->nd] = st_in[i];
		w->nd++;
		if (mask >> i & 1)
			count *= x->shape.dim[i];
	}
	walk_compact(&kept, 1);
	walk_compact(&red, 1);
	if (count == 0) {
		/* Sum of nothing is 0, a float Mean 0/0 = NaN (all-ones bytes are a NaN
		 * in both float widths); Max and Min have no answer. */
		if (op == DGC_RMAX || op == DGC_RMIN)
			return dg_err_set(r->err, DG_EINVAL, "%s over an empty axis has no value",
					  r->op->name);
		return DG_CUDA_CHECK(cudaMemsetAsync(o->data, op == DGC_RMEAN ? 0xff : 0, o->nbytes,
						     r->s->s),
				     r->err);
	}
	/* Outputs adjacent in memory (reducing outer axes): one thread per output
	 * reads coalesced; otherwise a block per output reads its own run. */
	cols = kept.st[0][kept.nd - 1] == 1 && o->numel > 1;
	need = dgc_reduce_scratch(o->numel, count, cols);
	if (need) {
		st = cuda_stream_scratch(r->s, need, &scratch, r->err);
		if (st != DG_OK)
			return st;
	}
	return launched(r, dgc_reduce(op, (int)x->dtype, x->data, o->data, o->numel, count,
				      &kept, &red, cols, scratch, r->s->s));
}

enum { R_SUM, R_MEAN, R_MAX, R_MIN };   /* reduce_masked's op codes */

static enum dg_status run_reduce(struct dg_cuda_ctx *r, int op)
{
	const struct dg_cuda_tensor *x = r->in[0];
	unsigned mask;
	enum dg_status st;

	if (x->dtype != DG_F32 && x->dtype != DG_F64)
		return no_kernel(r, x->dtype);
	st = axes_mask(r, x->shape.ndim, &mask);
	if (st != DG_OK)
		return st;
	return reduce_masked(r, op, x, r->out[0], mask);
}

/* outer, n, inner of x around axis. */
static void around(const struct dg_shape *s, int axis, int64_t *outer, int64_t *n,
		   int64_t *inner)
{
	*outer = 1;
	*inner = 1;
	for (int i = 0; i < axis; i++)
		*outer *= s->dim[i];
	for (int i = axis + 1; i < s->ndim; i++)
		*inner *= s->dim[i];
	*n = s->dim[axis];
}

static enum dg_status int_axis(struct dg_cuda_ctx *r, int64_t def, int ndim, int *axis)
{
	int64_t a;
	enum dg_status st = dg_attrs_int(r->attrs, "axis", &def, &a, r->err);

	if (st != DG_OK)
		return st;
	if (a < 0)
		a += ndim;
	if (a < 0 || a >= ndim)
		return dg_err_set(r->err, DG_EINVAL, "axis out of range for rank %d", ndim);
	*axis = (int)a;
	return DG_OK;
}

static enum dg_status run_argmax(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *x = r->in[0];
	struct dg_cuda_tensor *o = r->out[0];
	int64_t outer, n, inner;
	int axis = 0;
	enum dg_status st;

	if (x->dtype == DG_BOOL || (unsigned)x->dtype >= DG_DTYPE_COUNT)
		return no_kernel(r, x->dtype);
	st = int_axis(r, 0, x->shape.ndim, &axis);
	if (st != DG_OK || o->numel == 0)
		return st;
	around(&x->shape, axis, &outer, &n, &inner);
	if (n == 0)
		return dg_err_set(r->err, DG_EINVAL, "ArgMax over an empty axis has no value");
	return launched(r, dgc_argmax((int)x->dtype, (int)o->dtype, x->data, o->data, outer, n,
				      inner, r->s->s));
}

static enum dg_status run_softmax(struct dg_cuda_ctx *r, bool log)
{
	const struct dg_cuda_tensor *x = r->in[0];
	int64_t outer, n, inner;
	int axis = 0;
	enum dg_status st = int_axis(r, -1, x->shape.ndim, &axis);

	if (st != DG_OK || x->numel == 0)
		return st;
	around(&x->shape, axis, &outer, &n, &inner);
	return launched(r, dgc_softmax((int)x->dtype, x->data, r->out[0]->data, outer, n, inner,
				       log, r->s->s));
}

/* The end of a sparse-label kernel, launched after flag_reset with status st:
 * read the flag (a sync) and turn the first label outside [0, n) it recorded
 * into DG_EINVAL naming the label's index. */
static enum dg_status labels_checked(struct dg_cuda_ctx *r, enum dg_status st, int64_t n)
{
	unsigned long long bad;

	if (st == DG_OK)
		st = flag_read(r->s, &bad, r->err);
	if (st != DG_OK || bad == ~0ull)
		return st;
	dg_err_set(r->err, DG_EINVAL, "the label at index %llu is outside [0, %lld)", bad,
		   (long long)n);
	dg_err_hint(r->err, "labels are class indices below the logits' last dimension");
	return DG_EINVAL;
}

static enum dg_status run_xent(struct dg_cuda_ctx *r, bool sparse)
{
	const struct dg_cuda_tensor *x = r->in[0], *l = r->in[1];
	struct dg_cuda_tensor *o = r->out[0];
	int64_t n = x->shape.dim[x->shape.ndim - 1];
	enum dg_status st;

	if (o->numel == 0)
		return DG_OK;
	if (!sparse)
		return launched(r, dgc_xent((int)x->dtype, x->data, l->data, o->data, o->numel, n,
					    r->s->s));
	st = flag_reset(r->s, r->err);
	if (st == DG_OK)
		st = launched(r, dgc_sparse_xent((int)x->dtype, (int)l->dtype, x->data, l->data,
						 o->data, o->numel, n, r->s->flag, r->s->s));
	return labels_checked(r, st, n);
}

/* Ops whose output is the input's bytes under another shape. */
static enum dg_status run_copy(struct dg_cuda_ctx *r)
{
	if (r->out[0]->nbytes == 0)
		return DG_OK;
	return DG_CUDA_CHECK(cudaMemcpyAsync(r->out[0]->data, r->in[0]->data, r->out[0]->nbytes,
					     cudaMemcpyDeviceToDevice, r->s->s),
			     r->err);
}

static enum dg_status run_slice(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *x = r->in[0];
	struct dg_cuda_tensor *o = r->out[0];
	int64_t begin[DG_MAX_DIMS], st_in[DG_MAX_DIMS], st_out[DG_MAX_DIMS], off = 0;
	struct dgc_walk w = { .nd = o->shape.ndim };
	int nb;
	enum dg_status st = dg_attrs_ints(r->attrs, "begin", true, begin, DG_MAX_DIMS, &nb,
					 r->err);

	if (st != DG_OK || o->numel == 0)
		return st;
	if (nb != x->shape.ndim || o->shape.ndim != nb)
		return dg_err_set(r->err, DG_EINVAL, "attr 'begin' has %d entries for rank %d", nb,
				  x->shape.ndim);
	c_strides(&x->shape, st_in);
	c_strides(&o->shape, st_out);
	for (int i = 0; i < nb; i++) {
		w.dim[i] = o->shape.dim[i];
		w.st[0][i] = st_out[i];
		w.st[1][i] = st_in[i];
		off += begin[i] * st_in[i];
	}
	walk_compact(&w, 2);
	return launched(r, dgc_copy(o->data, 0, x->data, off, &w, o->numel,
				    (int)dg_dtype_size(x->dtype), r->s->s));
}

static enum dg_status run_transpose(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *x = r->in[0];
	struct dg_cuda_tensor *o = r->out[0];
	int64_t perm[DG_MAX_DIMS], st_in[DG_MAX_DIMS], st_out[DG_MAX_DIMS];
	int nd = x->shape.ndim, np;
	struct dgc_walk w = { .nd = nd };
	enum dg_status st = dg_attrs_ints(r->attrs, "perm", false, perm, DG_MAX_DIMS, &np, r->err);

	if (st != DG_OK || o->numel == 0)
		return st;
	if (np == 0)
		for (int i = 0; i < nd; i++)
			perm[i] = nd - 1 - i;
	else if (np != nd)
		return dg_err_set(r->err, DG_EINVAL, "attr 'perm' has %d entries for rank %d", np,
				  nd);
	c_strides(&x->shape, st_in);
	c_strides(&o->shape, st_out);
	for (int i = 0; i < nd; i++) {
		int64_t p = perm[i] < 0 ? perm[i] + nd : perm[i];
		if (p < 0 || p >= nd)
			return dg_err_set(r->err, DG_EINVAL, "perm[%d] out of range", i);
		w.dim[i] = o->shape.dim[i];
		w.st[0][i] = st_out[i];
		w.st[1][i] = st_in[p];
	}
	if (nd == 0)
		return run_copy(r);
	walk_compact(&w, 2);
	return launched(r, dgc_copy(o->data, 0, x->data, 0, &w, o->numel,
				    (int)dg_dtype_size(x->dtype), r->s->s));
}

static enum dg_status run_concat(struct dg_cuda_ctx *r)
{
	struct dg_cuda_tensor *o = r->out[0];
	int64_t st_out[DG_MAX_DIMS], at = 0;
	int axis = 0;
	enum dg_status st = int_axis(r, 0, o->shape.ndim, &axis);

	if (st != DG_OK || o->numel == 0)
		return st;
	c_strides(&o->shape, st_out);
	for (int k = 0; k < r->n_in && st == DG_OK; k++) {
		const struct dg_cuda_tensor *x = r->in[k];
		int64_t st_in[DG_MAX_DIMS];
		struct dgc_walk w = { .nd = x->shape.ndim };
		c_strides(&x->shape, st_in);
		for (int i = 0; i < x->shape.ndim; i++) {
			w.dim[i] = x->shape.dim[i];
			w.st[0][i] = st_out[i];
			w.st[1][i] = st_in[i];
		}
		walk_compact(&w, 2);
		if (x->numel > 0)
			st = launched(r, dgc_copy(o->data, at * st_out[axis], x->data, 0, &w,
						  x->numel, (int)dg_dtype_size(x->dtype),
						  r->s->s));
		at += x->shape.dim[axis];
	}
	return st;
}

/* The Philox key and counter of kernels/cpu/random.c's rnd_cpu. */
static struct dgc_philox philox_of(uint64_t seed, uint64_t step)
{
	struct dgc_philox g = {
		.key = { (uint32_t)seed, (uint32_t)(seed >> 32) },
		.step_lo = (uint32_t)step,
		.step_hi = (uint32_t)(step >> 32),
	};

	return g;
}

enum rnd_kind { RND_UNIFORM, RND_GLOROT, RND_NORMAL, RND_TRUNCATED };

static enum dg_status run_random(struct dg_cuda_ctx *r, enum rnd_kind kind)
{
	struct dg_cuda_tensor *o = r->out[0];
	const int64_t zero_seed = 0;
	const double zero = 0.0, one = 1.0;
	int64_t seed, ia = 0, ib = 0;
	double a = 0, b = 1;
	unsigned long long bad;
	enum dg_status st = dg_attrs_int(r->attrs, "seed", &zero_seed, &seed, r->err);
	struct dgc_philox g = philox_of((uint64_t)seed, r->step);

	if (st != DG_OK || o->numel == 0)
		return st;
	if (kind == RND_UNIFORM || kind == RND_GLOROT) {
		if (kind == RND_GLOROT) {
			b = dg_glorot_limit(o->shape.dim, o->shape.ndim);   /* philox.h */
			a = -b;
		} else if (o->dtype == DG_I32 || o->dtype == DG_I64) {
			/* Inference checked both are integers with maxval > minval. */
			ia = json_integer_value(dg_attrs_get(r->attrs, "minval"));
			ib = json_integer_value(dg_attrs_get(r->attrs, "maxval"));
		} else {
			st = dg_attrs_float(r->attrs, "minval", &zero, &a, r->err);
			if (st == DG_OK)
				st = dg_attrs_float(r->attrs, "maxval", &one, &b, r->err);
			if (st != DG_OK)
				return st;
		}
		return launched(r, dgc_uniform((int)o->dtype, o->data, o->numel, g, a, b, ia, ib,
					       r->s->s));
	}
	st = dg_attrs_float(r->attrs, "mean", &zero, &a, r->err);
	if (st == DG_OK)
		st = dg_attrs_float(r->attrs, "stddev", &one, &b, r->err);
	if (st == DG_OK)
		st = flag_reset(r->s, r->err);
	if (st == DG_OK)
		st = launched(r, dgc_normal((int)o->dtype, o->data, o->numel, g, a, b,
					    kind == RND_TRUNCATED, r->s->flag, r->s->s));
	if (st != DG_OK || kind != RND_TRUNCATED)
		return st;
	st = flag_read(r->s, &bad, r->err);
	if (st != DG_OK || bad == ~0ull)
		return st;
	return dg_err_set(r->err, DG_EINTERNAL, "TruncatedNormal found no value within 2 stddev "
			  "in 65535 draws (element %llu, seed %lld); the generator is broken", bad,
			  (long long)seed);
}

static enum dg_status run_matmul(struct dg_cuda_ctx *r, bool bmm)
{
	return cuda_matmul(r->s, bmm, r->attrs, r->in[0], r->in[1],
			   r->out[0], r->err);
}

static enum dg_status run_zeros(struct dg_cuda_ctx *r)
{
	if (r->out[0]->nbytes == 0)
		return DG_OK;
	return DG_CUDA_CHECK(cudaMemsetAsync(r->out[0]->data, 0, r->out[0]->nbytes, r->s->s),
			     r->err);
}

/* --- CNN and sparse ops (kernels/cpu/conv.c, norm.c, array.c, nn.c, random.c) ---- */

/* Conv2D(x, f), Conv2DBackpropInput(x, f, dy), Conv2DBackpropFilter(x, f, dy). */
static enum dg_status run_conv(struct dg_cuda_ctx *r, int kind)
{
	return cuda_conv(r->s, (enum cuda_conv_kind)kind, r->attrs, r->in[0], r->in[1],
			 r->n_in > 2 ? r->in[2] : NULL, r->out[0], r->err);
}

/* MaxPool2D(x), AvgPool2D(x). */
static enum dg_status run_pool(struct dg_cuda_ctx *r, bool max)
{
	return cuda_pool(r->s, max, r->attrs, r->in[0], NULL, NULL, r->out[0], r->err);
}

/* MaxPool2DGrad(x, y, dy), AvgPool2DGrad(x, dy). */
static enum dg_status run_pool_grad(struct dg_cuda_ctx *r, bool max)
{
	return cuda_pool(r->s, max, r->attrs, r->in[0], max ? r->in[1] : NULL,
			 r->in[max ? 2 : 1], r->out[0], r->err);
}

/* Element i of the int32 or int64 tensor ix, read back through the stream's
 * pinned word (a sync): the value an index error names. */
static enum dg_status index_at(struct dg_cuda_ctx *r, const struct dg_cuda_tensor *ix, int64_t i,
			       int64_t *v)
{
	size_t es = dg_dtype_size(ix->dtype);
	enum dg_status st = DG_CUDA_CHECK(cudaMemcpyAsync(r->s->flag_host,
							  (const char *)ix->data + (size_t)i * es,
							  es, cudaMemcpyDeviceToHost, r->s->s),
					  r->err);
	int32_t v32;

	if (st == DG_OK)
		st = DG_CUDA_CHECK(cudaStreamSynchronize(r->s->s), r->err);
	if (st != DG_OK)
		return st;
	if (ix->dtype == DG_I32) {
		memcpy(&v32, r->s->flag_host, sizeof v32);
		*v = v32;
	} else {
		memcpy(v, r->s->flag_host, sizeof *v);
	}
	return DG_OK;
}

/* The end of Gather (gather true) or UnsortedSegmentSum, launched after
 * flag_reset and dgc_index_check with status st: read the flag (a sync) and
 * turn the first index outside [0, limit) into the CPU kernel's error, which
 * names its position and value. */
static enum dg_status indices_checked(struct dg_cuda_ctx *r, enum dg_status st,
				      const struct dg_cuda_tensor *ix, bool gather, int64_t limit)
{
	unsigned long long bad;
	int64_t v = 0;

	if (st == DG_OK)
		st = flag_read(r->s, &bad, r->err);
	if (st != DG_OK || bad == ~0ull)
		return st;
	st = index_at(r, ix, (int64_t)bad, &v);
	if (st != DG_OK)
		return st;
	return gather ? cpu_gather_index_err(&ix->shape, (int64_t)bad, v, limit, r->err)
		      : cpu_segment_id_err(&ix->shape, (int64_t)bad, v, limit, r->err);
}

/* Gather(params, indices): rows of params, any dtype. Every index is checked
 * (even when the rows are empty, as the CPU's loop does), so this syncs. */
static enum dg_status run_gather(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *p = r->in[0], *ix = r->in[1];
	int64_t rows = p->shape.dim[0], inner = 1;      /* params has rank >= 1 */
	enum dg_status st;

	for (int k = 1; k < p->shape.ndim; k++)
		inner *= p->shape.dim[k];
	if (ix->numel == 0)
		return DG_OK;
	st = flag_reset(r->s, r->err);
	if (st == DG_OK)
		st = launched(r, dgc_index_check((int)ix->dtype, ix->data, ix->numel, rows,
						 r->s->flag, r->s->s));
	if (st == DG_OK)
		st = launched(r, dgc_gather((int)ix->dtype, p->data, ix->data, r->out[0]->data,
					    ix->numel, inner, rows, (int)dg_dtype_size(p->dtype),
					    r->s->s));
	return indices_checked(r, st, ix, true, rows);
}

/* UnsortedSegmentSum(data, segment_ids; num_segments): zeros, then each row
 * of data added into its segment's; ids checked like Gather's (a sync). */
static enum dg_status run_segment_sum(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *x = r->in[0], *ids = r->in[1];
	struct dg_cuda_tensor *y = r->out[0];
	int64_t num = y->shape.dim[0], inner = 1;       /* y is [num_segments, ...] */
	enum dg_status st = DG_OK;

	for (int k = ids->shape.ndim; k < x->shape.ndim; k++)
		inner *= x->shape.dim[k];
	if (y->nbytes)
		st = DG_CUDA_CHECK(cudaMemsetAsync(y->data, 0, y->nbytes, r->s->s), r->err);
	if (st != DG_OK || ids->numel == 0)
		return st;
	st = flag_reset(r->s, r->err);
	if (st == DG_OK)
		st = launched(r, dgc_index_check((int)ids->dtype, ids->data, ids->numel, num,
						 r->s->flag, r->s->s));
	if (st == DG_OK)
		st = launched(r, dgc_segment_sum((int)x->dtype, (int)ids->dtype, x->data,
						 ids->data, y->data, ids->numel, inner, num,
						 r->s->s));
	return indices_checked(r, st, ids, false, num);
}

/* OneHot(indices): the depth is the output's last dim; an index outside it
 * gives a row of off_value, not an error (the CPU's rule). */
static enum dg_status run_one_hot(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *ix = r->in[0];
	struct dg_cuda_tensor *o = r->out[0];
	const double one = 1, zero = 0;
	double on, off;
	enum dg_status st = dg_attrs_float(r->attrs, "on_value", &one, &on, r->err);

	if (st == DG_OK)
		st = dg_attrs_float(r->attrs, "off_value", &zero, &off, r->err);
	if (st != DG_OK || o->numel == 0)
		return st;
	return launched(r, dgc_one_hot((int)o->dtype, (int)ix->dtype, ix->data, o->data,
				       ix->numel, o->shape.dim[o->shape.ndim - 1], on, off,
				       r->s->s));
}

/* Dropout(x; rate, seed): the CPU's mask of (seed, step, index). */
static enum dg_status run_dropout(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *x = r->in[0];
	double rate = 0;
	int64_t seed = 0;
	enum dg_status st = dg_attrs_float(r->attrs, "rate", NULL, &rate, r->err);

	if (st == DG_OK)
		st = dg_attrs_int(r->attrs, "seed", NULL, &seed, r->err);
	if (st != DG_OK || x->numel == 0)
		return st;
	return launched(r, dgc_dropout((int)x->dtype, x->data, r->out[0]->data, x->numel,
				       philox_of((uint64_t)seed, r->step), rate, r->s->s));
}

/* FusedBatchNorm(x, scale, offset[, mean, variance]) and FusedBatchNormGrad(dy,
 * x, scale[, mean, variance]): x [..., ch] is [m, ch]; inference has checked
 * the inputs (and that is_training false comes with 5). */
static enum dg_status run_bn(struct dg_cuda_ctx *r, bool grad)
{
	const struct dg_cuda_tensor *x = r->in[grad ? 1 : 0];
	int64_t ch = x->shape.dim[x->shape.ndim - 1], m = ch ? x->numel / ch : 0;
	const double eps_def = 0.001;
	const bool yes = true;
	const void *mean = NULL, *var = NULL;
	double eps;
	bool training;
	void *scratch = NULL;
	enum dg_status st = dg_attrs_float(r->attrs, "epsilon", &eps_def, &eps, r->err);

	if (st == DG_OK)
		st = dg_attrs_bool(r->attrs, "is_training", &yes, &training, r->err);
	if (st != DG_OK || ch == 0)
		return st;
	if (!training) {
		mean = r->in[3]->data;
		var = r->in[4]->data;
	}
	st = cuda_stream_scratch(r->s, dgc_bn_scratch(m, ch), &scratch, r->err);
	if (st != DG_OK)
		return st;
	if (!grad)
		return launched(r, dgc_bn((int)x->dtype, x->data, r->in[1]->data, r->in[2]->data,
					  mean, var, r->out[0]->data, r->out[1]->data,
					  r->out[2]->data, m, ch, eps, scratch, r->s->s));
	return launched(r, dgc_bn_grad((int)x->dtype, r->in[0]->data, x->data, r->in[2]->data,
				       mean, var, r->out[0]->data, r->out[1]->data,
				       r->out[2]->data, m, ch, eps, scratch, r->s->s));
}

/* --- gradient helpers (kernels/cpu/grad.c) --------------------------------------- */

static enum dg_status shape_pair_err(struct dg_cuda_ctx *r, const char *fmt, const struct dg_shape *a,
				     const struct dg_shape *b)
{
	char sa[96], sb[96];

	dg_shape_format(a, sa, sizeof sa);
	dg_shape_format(b, sb, sizeof sb);
	return dg_err_set(r->err, DG_ESHAPE, fmt, sa, sb);
}

static bool is_f(enum dg_dtype dt)
{
	return dt == DG_F32 || dt == DG_F64;
}

/* ReluGrad(g, x), SigmoidGrad(g, y), TanhGrad(g, y): same shapes, float. */
enum { G_RELU, G_SIGMOID, G_TANH };     /* dgc_ew_grad's op codes */

static enum dg_status run_grad_ew(struct dg_cuda_ctx *r, int op)
{
	const struct dg_cuda_tensor *g = r->in[0], *v = r->in[1];

	if (!is_f(g->dtype))
		return no_kernel(r, g->dtype);
	if (!dg_shape_eq(&g->shape, &v->shape))
		return shape_pair_err(r, "shapes %s and %s differ", &g->shape, &v->shape);
	return launched(r, dgc_ew_grad(op, (int)g->dtype, g->data,
				       v->data, r->out[0]->data, g->numel, r->s->s));
}

/* SparseSoftmaxCrossEntropyGrad(logits [..., C], labels [...]); labels are
 * checked on the device, so this synchronises like the sparse loss. */
static enum dg_status run_sparse_grad(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *x = r->in[0], *l = r->in[1];
	int64_t rows = l->numel, n;
	enum dg_status st;

	if (!is_f(x->dtype))
		return no_kernel(r, x->dtype);
	if (x->shape.ndim < 1 || l->shape.ndim != x->shape.ndim - 1 ||
	    memcmp(l->shape.dim, x->shape.dim, sizeof(int64_t) * (size_t)l->shape.ndim) != 0)
		return shape_pair_err(r, "logits %s and labels %s do not match (labels are "
				      "logits' shape without the class axis)", &x->shape,
				      &l->shape);
	n = x->shape.dim[x->shape.ndim - 1];
	if (rows > 0 && n == 0)
		return dg_err_set(r->err, DG_EINVAL, "logits have 0 classes");
	if (rows == 0)
		return DG_OK;
	st = flag_reset(r->s, r->err);
	if (st == DG_OK)
		st = launched(r, dgc_sparse_xent_grad((int)x->dtype, (int)l->dtype, x->data,
						      l->data, r->out[0]->data, rows, n,
						      r->s->flag, r->s->s));
	return labels_checked(r, st, n);
}

/* SumToShapeOf(x, like): a Sum of x over the dims along which like (aligned on
 * the right) broadcasts to x; like's C order is that of x's other dims. */
static enum dg_status run_sum_to(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *x = r->in[0], *like = r->in[1];
	int off = x->shape.ndim - like->shape.ndim;
	unsigned mask = 0;

	if (!is_f(x->dtype))
		return no_kernel(r, x->dtype);
	if (off < 0)
		return shape_pair_err(r, "%s has more dims than %s", &like->shape, &x->shape);
	for (int j = 0; j < x->shape.ndim; j++) {
		int64_t d = j >= off ? like->shape.dim[j - off] : 1;
		if (d != 1 && d != x->shape.dim[j])
			return shape_pair_err(r, "%s does not broadcast to %s", &like->shape,
					      &x->shape);
		if (d == 1)
			mask |= 1u << j;
	}
	return reduce_masked(r, DGC_RSUM, x, r->out[0], mask);
}

/* A float scalar of dtype dt in the stream's scratch, for broadcasting. */
static enum dg_status scalar_on_device(struct dg_cuda_ctx *r, enum dg_dtype dt, double v, void **p)
{
	float f = (float)v;
	enum dg_status st = cuda_stream_scratch(r->s, sizeof v, p, r->err);

	/* Pageable source: the call returns once the bytes are staged. */
	if (st == DG_OK)
		st = DG_CUDA_CHECK(cudaMemcpyAsync(*p, dt == DG_F32 ? (void *)&f : (void *)&v,
						   dg_dtype_size(dt), cudaMemcpyHostToDevice,
						   r->s->s),
				   r->err);
	return st;
}

/* UnreduceLike(g, like; axis, mean): g broadcast over like's shape along the
 * reduced axes, times 1/count when mean (1 otherwise: exact). */
static enum dg_status run_unreduce(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *g = r->in[0], *like = r->in[1];
	struct dg_cuda_tensor *o = r->out[0];
	struct dg_shape keep = like->shape;
	struct dgc_walk w = { .nd = like->shape.ndim };
	int64_t st_keep[DG_MAX_DIMS], count = 1, kn = 1;
	const bool no = false;
	bool mean = false;
	unsigned mask;
	void *sc = NULL;
	enum dg_status st;

	if (!is_f(g->dtype))
		return no_kernel(r, g->dtype);
	st = axes_mask(r, like->shape.ndim, &mask);
	if (st == DG_OK)
		st = dg_attrs_bool(r->attrs, "mean", &no, &mean, r->err);
	if (st != DG_OK)
		return st;
	for (int i = 0; i < keep.ndim; i++) {
		if (mask >> i & 1) {
			count *= keep.dim[i];
			keep.dim[i] = 1;
		}
		kn *= keep.dim[i];
	}
	if (kn != g->numel)
		return shape_pair_err(r, "gradient %s does not match the reduction of %s",
				      &g->shape, &like->shape);
	if (o->numel == 0)
		return DG_OK;
	c_strides(&keep, st_keep);
	for (int i = 0; i < w.nd; i++) {
		w.dim[i] = like->shape.dim[i];
		w.st[0][i] = keep.dim[i] == 1 ? 0 : st_keep[i];
		w.st[1][i] = 0;
	}
	if (w.nd == 0)
		w = (struct dgc_walk){ .nd = 1, .dim = { 1 } };
	walk_compact(&w, 2);
	st = scalar_on_device(r, g->dtype, mean && count > 0 ? 1.0 / (double)count : 1.0, &sc);
	if (st == DG_OK)
		st = launched(r, dgc_binary(DGC_MUL, (int)g->dtype, g->data, sc, o->data, o->numel,
					    &w, r->s->s));
	return st;
}

/* SliceGrad(g, like; begin): zeros of like's shape with g copied in at begin. */
static enum dg_status run_slice_grad(struct dg_cuda_ctx *r)
{
	const struct dg_cuda_tensor *g = r->in[0], *like = r->in[1];
	struct dg_cuda_tensor *o = r->out[0];
	int64_t begin[DG_MAX_DIMS], st_g[DG_MAX_DIMS], st_o[DG_MAX_DIMS], off = 0;
	struct dgc_walk w = { .nd = g->shape.ndim };
	int nb = 0;
	enum dg_status st = dg_attrs_ints(r->attrs, "begin", true, begin, DG_MAX_DIMS, &nb,
					 r->err);

	if (st != DG_OK)
		return st;
	if (g->shape.ndim != like->shape.ndim || nb != g->shape.ndim)
		return shape_pair_err(r, "slice gradient %s does not fit %s (rank or begin "
				      "differ)", &g->shape, &like->shape);
	for (int d = 0; d < nb; d++)
		if (begin[d] < 0 || begin[d] + g->shape.dim[d] > like->shape.dim[d])
			return shape_pair_err(r, "slice gradient %s does not fit in %s at begin",
					      &g->shape, &like->shape);
	if (o->nbytes > 0)
		st = DG_CUDA_CHECK(cudaMemsetAsync(o->data, 0, o->nbytes, r->s->s), r->err);
	if (st != DG_OK || g->numel == 0)
		return st;
	c_strides(&g->shape, st_g);
	c_strides(&like->shape, st_o);
	for (int d = 0; d < nb; d++) {
		w.dim[d] = g->shape.dim[d];
		w.st[0][d] = st_o[d];
		w.st[1][d] = st_g[d];
		off += begin[d] * st_o[d];
	}
	if (w.nd == 0)
		w = (struct dgc_walk){ .nd = 1, .dim = { 1 } };
	walk_compact(&w, 2);
	return launched(r, dgc_copy(o->data, off, g->data, 0, &w, g->numel,
				    (int)dg_dtype_size(g->dtype), r->s->s));
}

/* ReshapeLike(x, like): x's bytes in like's shape. */
static enum dg_status run_reshape_like(struct dg_cuda_ctx *r)
{
	if (r->in[0]->numel != r->in[1]->numel)
		return shape_pair_err(r, "cannot reshape %s to %s: element counts differ",
				      &r->in[0]->shape, &r->in[1]->shape);
	return run_copy(r);
}

/* OnesLike: 1 in x's dtype (true for bool) in every element. */
static enum dg_status run_ones(struct dg_cuda_ctx *r)
{
	struct dg_cuda_tensor *o = r->out[0];
	uint64_t bits = 1;             /* int32, int64, uint8, bool */
	uint32_t u;
	float f = 1.0f;
	double d = 1.0;

	if (o->dtype == DG_F16) {
		bits = 0x3c00;
	} else if (o->dtype == DG_BF16) {
		bits = 0x3f80;
	} else if (o->dtype == DG_F32) {
		memcpy(&u, &f, sizeof u);
		bits = u;
	} else if (o->dtype == DG_F64) {
		memcpy(&bits, &d, sizeof bits);
	}
	return launched(r, dgc_fill(o->data, o->numel, (int)dg_dtype_size(o->dtype), bits,
				    r->s->s));
}

/* One function per op, so that the registry's entry points straight at the
 * kernel (no name is compared when a node runs): the families above take the
 * launcher's op code, and these wrappers fix it. */
#define KERNEL_OF(fn, family, arg)                                                          \
	static enum dg_status fn(struct dg_cuda_ctx *r)                                     \
	{                                                                                   \
		return family(r, arg);                                                      \
	}
KERNEL_OF(k_neg, run_unary, U_NEG)
KERNEL_OF(k_abs, run_unary, U_ABS)
KERNEL_OF(k_square, run_unary, U_SQUARE)
KERNEL_OF(k_relu, run_unary, U_RELU)
KERNEL_OF(k_sqrt, run_unary, U_SQRT)
KERNEL_OF(k_exp, run_unary, U_EXP)
KERNEL_OF(k_log, run_unary, U_LOG)
KERNEL_OF(k_sigmoid, run_unary, U_SIGMOID)
KERNEL_OF(k_tanh, run_unary, U_TANH)
KERNEL_OF(k_add, run_binary, B_ADD)
KERNEL_OF(k_sub, run_binary, B_SUB)
KERNEL_OF(k_mul, run_binary, B_MUL)
KERNEL_OF(k_div, run_binary, B_DIV)
KERNEL_OF(k_pow, run_binary, B_POW)
KERNEL_OF(k_maximum, run_binary, B_MAXIMUM)
KERNEL_OF(k_minimum, run_binary, B_MINIMUM)
KERNEL_OF(k_equal, run_binary, B_EQUAL)
KERNEL_OF(k_not_equal, run_binary, B_NOT_EQUAL)
KERNEL_OF(k_less, run_binary, B_LESS)
KERNEL_OF(k_less_equal, run_binary, B_LESS_EQUAL)
KERNEL_OF(k_greater, run_binary, B_GREATER)
KERNEL_OF(k_greater_equal, run_binary, B_GREATER_EQUAL)
KERNEL_OF(k_sum, run_reduce, R_SUM)
KERNEL_OF(k_mean, run_reduce, R_MEAN)
KERNEL_OF(k_max, run_reduce, R_MAX)
KERNEL_OF(k_min, run_reduce, R_MIN)
KERNEL_OF(k_softmax, run_softmax, false)
KERNEL_OF(k_log_softmax, run_softmax, true)
KERNEL_OF(k_xent, run_xent, false)
KERNEL_OF(k_sparse_xent, run_xent, true)
KERNEL_OF(k_matmul, run_matmul, false)
KERNEL_OF(k_batch_matmul, run_matmul, true)
KERNEL_OF(k_random_uniform, run_random, RND_UNIFORM)
KERNEL_OF(k_glorot_uniform, run_random, RND_GLOROT)
KERNEL_OF(k_random_normal, run_random, RND_NORMAL)
KERNEL_OF(k_truncated_normal, run_random, RND_TRUNCATED)
KERNEL_OF(k_relu_grad, run_grad_ew, G_RELU)
KERNEL_OF(k_sigmoid_grad, run_grad_ew, G_SIGMOID)
KERNEL_OF(k_tanh_grad, run_grad_ew, G_TANH)
KERNEL_OF(k_conv, run_conv, CUDA_CONV)
KERNEL_OF(k_conv_dinput, run_conv, CUDA_CONV_DINPUT)
KERNEL_OF(k_conv_dfilter, run_conv, CUDA_CONV_DFILTER)
KERNEL_OF(k_max_pool, run_pool, true)
KERNEL_OF(k_avg_pool, run_pool, false)
KERNEL_OF(k_max_pool_grad, run_pool_grad, true)
KERNEL_OF(k_avg_pool_grad, run_pool_grad, false)
KERNEL_OF(k_bn, run_bn, false)
KERNEL_OF(k_bn_grad, run_bn, true)
#undef KERNEL_OF

const struct dg_cuda_kernel_entry dg_cuda_kernels[] = {
	{ "Neg", k_neg }, { "Abs", k_abs }, { "Square", k_square }, { "Relu", k_relu },
	{ "Sqrt", k_sqrt }, { "Exp", k_exp }, { "Log", k_log }, { "Sigmoid", k_sigmoid },
	{ "Tanh", k_tanh },
	{ "Add", k_add }, { "Sub", k_sub }, { "Mul", k_mul }, { "Div", k_div }, { "Pow", k_pow },
	{ "Maximum", k_maximum }, { "Minimum", k_minimum }, { "Equal", k_equal },
	{ "NotEqual", k_not_equal }, { "Less", k_less }, { "LessEqual", k_less_equal },
	{ "Greater", k_greater }, { "GreaterEqual", k_greater_equal },
	{ "Where", run_where }, { "Cast", run_cast },
	{ "Sum", k_sum }, { "Mean", k_mean }, { "Max", k_max }, { "Min", k_min },
	{ "ArgMax", run_argmax },
	{ "Softmax", k_softmax }, { "LogSoftmax", k_log_softmax },
	{ "SoftmaxCrossEntropyWithLogits", k_xent },
	{ "SparseSoftmaxCrossEntropyWithLogits", k_sparse_xent },
	{ "MatMul", k_matmul }, { "BatchMatMul", k_batch_matmul },
	{ "Slice", run_slice }, { "Concat", run_concat }, { "Transpose", run_transpose },
	{ "Reshape", run_copy }, { "Identity", run_copy }, { "ExpandDims", run_copy },
	{ "Squeeze", run_copy }, { "ZerosLike", run_zeros }, { "OnesLike", run_ones },
	{ "RandomUniform", k_random_uniform }, { "RandomNormal", k_random_normal },
	{ "TruncatedNormal", k_truncated_normal }, { "GlorotUniform", k_glorot_uniform },
	{ "ReluGrad", k_relu_grad }, { "SigmoidGrad", k_sigmoid_grad },
	{ "TanhGrad", k_tanh_grad },
	{ "SparseSoftmaxCrossEntropyGrad", run_sparse_grad }, { "SumToShapeOf", run_sum_to },
	{ "UnreduceLike", run_unreduce }, { "SliceGrad", run_slice_grad },
	{ "ReshapeLike", run_reshape_like },
	{ "Conv2D", k_conv }, { "Conv2DBackpropInput", k_conv_dinput },
	{ "Conv2DBackpropFilter", k_conv_dfilter }, { "MaxPool2D", k_max_pool },
	{ "AvgPool2D", k_avg_pool }, { "MaxPool2DGrad", k_max_pool_grad },
	{ "AvgPool2DGrad", k_avg_pool_grad },
	{ "Gather", run_gather }, { "UnsortedSegmentSum", run_segment_sum },
	{ "OneHot", run_one_hot }, { "Dropout", run_dropout },
	{ "FusedBatchNorm", k_bn }, { "FusedBatchNormGrad", k_bn_grad },
	{ NULL, NULL },
};

bool dg_cuda_supports(const struct dg_op_def *op)
{
	return op && op->cuda;
}

/* Arity, attrs and output types through the op's own checks (which read the
 * JSON: inference has no table). */
static enum dg_status infer_outputs(const struct dg_op_def *op, const json_t *attrs,
				    const struct dg_cuda_tensor *const *in, int n_in,
				    struct dg_ttype *ot, int n_out, struct dg_err *err)
{
	struct dg_ttype it[DG_MAX_DIMS * 2];
	int max_in = op->max_inputs < 0 ? DG_MAX_INPUTS : op->max_inputs;
	struct dg_ttype *big = NULL, *itp = it;
	enum dg_status st;

	if (n_in < op->min_inputs || n_in > max_in || op->n_outputs < 1 || n_out != op->n_outputs)
		return dg_err_set(err, DG_EINVAL, "takes %d..%d inputs and %d outputs, got %d and "
				  "%d", op->min_inputs, max_in, op->n_outputs, n_in, n_out);
	st = dg_attr_validate(op, attrs, err);
	if (st != DG_OK)
		return st;
	if (n_in > (int)(sizeof it / sizeof it[0])) {
		big = malloc(sizeof *big * (size_t)n_in);
		if (!big)
			return dg_err_set(err, DG_ENOMEM, "no memory for %d input types", n_in);
		itp = big;
	}
	for (int i = 0; i < n_in; i++) {
		if (!in[i]) {
			free(big);
			return dg_err_set(err, DG_EINVAL, "input %d is missing", i);
		}
		itp[i].dtype = in[i]->dtype;
		itp[i].shape = in[i]->shape;
	}
	struct dg_infer_ctx c = { .attrs = attrs, .n_in = n_in, .in = itp, .n_out = n_out,
				  .out = ot, .err = err };
	st = op->infer(&c);
	free(big);
	return st;
}

enum dg_status dg_cuda_run(struct dg_cuda_stream *s, const struct dg_op_def *op,
			   const json_t *attrs, const struct dg_cuda_tensor *const *in, int n_in,
			   struct dg_cuda_tensor **out, int n_out, uint64_t step,
			   struct dg_err *err)
{
	return dg_cuda_run_attrs(s, op, dg_attrs_of_json(attrs), in, n_in, out, n_out, step, err);
}

enum dg_status dg_cuda_run_attrs(struct dg_cuda_stream *s, const struct dg_op_def *op,
				 struct dg_attrs attrs, const struct dg_cuda_tensor *const *in,
				 int n_in, struct dg_cuda_tensor **out, int n_out, uint64_t step,
				 struct dg_err *err)
{
	dg_cuda_kernel_fn f = op ? op->cuda : NULL;
	json_t *empty = NULL;
	struct dg_ttype ot[4];
	enum dg_status st;

	for (int i = 0; i < n_out; i++)
		out[i] = NULL;
	if (!s || !op)
		return dg_err_set(err, DG_EINVAL, "dg_cuda_run needs a stream and an op");
	if (!f) {
		dg_err_set(err, DG_EUNSUPPORTED, "%s has no CUDA kernel", op->name);
		dg_err_hint(err, "place this node on the CPU (doc/cuda.md lists the GPU ops)");
		return DG_EUNSUPPORTED;
	}
	if (n_out < 1 || n_out > 4)
		return dg_err_set(err, DG_EINVAL, "%s: %d outputs requested", op->name, n_out);
	if (!attrs.json)
		attrs.json = empty = json_object();
	for (int i = 0; i < n_in; i++) {
		if (in[i] && in[i]->device != s->device) {
			st = dg_err_set(err, DG_EINVAL,
					"input %d is on GPU %d, the stream on GPU %d", i,
					in[i]->device, s->device);
			goto out;
		}
	}
	st = infer_outputs(op, attrs.json, in, n_in, ot, n_out, err);
	if (st == DG_OK)
		st = cuda_set_device(s->device, err);
	for (int i = 0; st == DG_OK && i < n_out; i++) {
		out[i] = dg_cuda_tensor_new(s, ot[i].dtype, &ot[i].shape, err);
		if (!out[i])
			st = err ? err->code : DG_ENOMEM;
	}
	if (st == DG_OK) {
		struct dg_cuda_ctx r = { s, op, attrs, in, n_in, out, n_out, step, err };
		st = f(&r);
	}
out:
	if (st != DG_OK) {
		for (int i = 0; i < n_out; i++) {
			dg_cuda_tensor_free(out[i]);
			out[i] = NULL;
		}
		dg_err_prefix(err, "%s on GPU %d", op->name, s->device);
	}
	json_decref(empty);
	return st;
}
