/* Conv2D, its two gradients and the 2-D poolings on the GPU, as
 * kernels/cpu/conv.c does them on the CPU and with its geometry
 * (cpu_conv_geometry: the same checks, the same padding): the patches of a
 * block of images (im2col, conv.cu) times the filter's [K, OC] matrix in one
 * cuBLAS gemm, whose [rows, OC] product is already the NHWC output. The input's
 * gradient is dy W^T gathered back (col2im), the filter's patches^T dy summed
 * over the blocks (beta 1). Blocks are whole images whose patches fit
 * COL_BYTES, held in the stream's work memory, so memory stays bounded for
 * any batch; a pointwise convolution (1x1, stride 1, no padding) multiplies
 * the input itself. Poolings are the direct kernels of conv.cu. */
#include "cuda_internal.h"

#include <limits.h>
#include <string.h>

#include "../cpu/cpu.h"
#include "cuda_launch.h"

/* The patch matrix of one block of images stays under this (a few hundred
 * thousand rows of a 3x3x64 window: gemms that large run at cuBLAS's speed). */
#define COL_BYTES ((size_t)128 << 20)

static struct dgc_conv dgc_of(const struct cpu_conv_geom *g)
{
	struct dgc_conv d = {
		g->n, g->h, g->w, g->c, g->kh, g->kw, g->oc, g->sh, g->sw, g->dh, g->dw,
		g->oh, g->ow, g->pt, g->pl,
	};

	return d;
}

static struct dg_ttype ttype_of(const struct dg_cuda_tensor *t)
{
	struct dg_ttype tt = { .dtype = t->dtype, .shape = t->shape };

	return tt;
}

/* The geometry of x (and filter f, NULL for a pooling) from attrs; inference
 * has passed these very shapes, so this does not fail in practice. */
static enum dg_status geometry_of(struct dg_attrs attrs, const struct dg_cuda_tensor *x,
				  const struct dg_cuda_tensor *f, struct cpu_conv_geom *g,
				  struct dg_err *err)
{
	struct dg_ttype tx = ttype_of(x), tf;

	if (f)
		tf = ttype_of(f);
	return cpu_conv_geometry(attrs, &tx, f ? &tf : NULL, g, err);
}

/* The CPU kernel's run-time check of dy (or MaxPool2DGrad's y): exactly the
 * forward output's type. */
static enum dg_status check_out(const struct cpu_conv_geom *g, enum dg_dtype dt,
				const struct dg_cuda_tensor *t, const char *what,
				struct dg_err *err)
{
	struct dg_ttype tt = ttype_of(t);

	return cpu_conv_check_out(g, dt, &tt, what, err);
}

/* c[m, n] = op(a) op(b) (+ c when acc), all row-major: a is [m, k] or, with
 * ta, [k, m]; b is [k, n] or, with tb, [n, k]. As in matmul.c, cuBLAS
 * computes the column-major c^T = op(b)^T op(a)^T, the same memory. */
static enum dg_status gemm(struct dg_cuda_stream *s, enum dg_dtype dt, bool ta, bool tb,
			   int64_t m, int64_t n, int64_t k, const void *a, const void *b, bool acc,
			   void *c, struct dg_err *err)
{
	cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	int im = (int)m, in = (int)n, ik = (int)k, lda = ta ? im : ik, ldb = tb ? ik : in;

	if (dt == DG_F64) {
		const double one = 1.0, beta = acc ? 1.0 : 0.0;
		return DG_CUBLAS_CHECK(cublasDgemm(s->blas, opb, opa, in, im, ik, &one, b, ldb, a,
						   lda, &beta, c, in),
				       err);
	}
	const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
	return DG_CUBLAS_CHECK(cublasSgemm(s->blas, opb, opa, in, im, ik, &one, b, ldb, a, lda,
					   &beta, c, in),
			       err);
}

/* No patches needed: a 1x1 window, stride 1, no padding. */
static bool pointwise(const struct cpu_conv_geom *g)
{
	return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->pt == 0 && g->pl == 0;
}

static bool empty(const struct cpu_conv_geom *g)
{
	return g->n == 0 || g->oh == 0 || g->ow == 0 || g->oc == 0 || g->c == 0;
}

/* How a convolution runs: images per block, the patch width K, and the
 * patch buffer (NULL when pointwise). */
struct conv_plan {
	int64_t block, kk;
	void *col;
};

/* The CPU kernel's limits (conv.c's conv_begin: one image's patches must be
 * countable, cuBLAS's dims ints), then the block and its buffer. */
static enum dg_status plan_of(struct dg_cuda_stream *s, const struct cpu_conv_geom *g,
			      size_t esize, struct conv_plan *p, struct dg_err *err)
{
	const int64_t f[5] = { g->oh, g->ow, g->kh, g->kw, g->c };
	int64_t v = 1;
	size_t per;

	memset(p, 0, sizeof *p);
	for (int i = 0; i < 5; i++)
		if (__builtin_mul_overflow(v, f[i], &v))
			v = -1;
	if (v < 0 || __builtin_mul_overflow((size_t)v, esize, &per))
		return dg_err_set(err, DG_ETOOLARGE, "the convolution's patches are too "
				  "large to hold (%lld x %lld outputs, %lld x %lld x %lld window)",
				  (long long)g->oh, (long long)g->ow, (long long)g->kh,
				  (long long)g->kw, (long long)g->c);
	p->kk = g->kh * g->kw * g->c;
	if (g->oh * g->ow > INT_MAX || p->kk > INT_MAX || g->oc > INT_MAX)
		return dg_err_set(err, DG_ETOOLARGE, "the convolution's matrices exceed the "
				  "BLAS limit of %d rows or columns", INT_MAX);
	/* Pointwise: as many images as cuBLAS's int rows allow; else as many as
	 * COL_BYTES of patches hold, at least one. */
	p->block = pointwise(g) ? INT_MAX / (g->oh * g->ow) : (int64_t)(COL_BYTES / per);
	p->block = p->block < 1 ? 1 : p->block > g->n ? g->n : p->block;
	if (pointwise(g))
		return DG_OK;
	return cuda_stream_scratch(s, (size_t)p->block * per, &p->col, err);
}

/* Conv2D: y[rows, OC] = patches[rows, K] W[K, OC], block by block. */
static enum dg_status conv_forward(struct dg_cuda_stream *s, const struct cpu_conv_geom *g,
				   const struct conv_plan *p, const struct dg_cuda_tensor *x,
				   const struct dg_cuda_tensor *f, struct dg_cuda_tensor *y,
				   struct dg_err *err)
{
	struct dgc_conv d = dgc_of(g);
	int64_t es = (int64_t)dg_dtype_size(x->dtype);
	enum dg_status st = DG_OK;

	for (int64_t i0 = 0; i0 < g->n && st == DG_OK; i0 += p->block) {
		int64_t nb = g->n - i0 < p->block ? g->n - i0 : p->block, rows = nb * g->oh * g->ow;
		const void *a = (const char *)x->data + i0 * g->h * g->w * g->c * es;
		if (p->col) {
			st = DG_CUDA_CHECK(dgc_im2col((int)x->dtype, &d, x->data, i0, nb, p->col,
						      s->s), err);
			a = p->col;
		}
		if (st == DG_OK)
			st = gemm(s, x->dtype, false, false, rows, g->oc, p->kk, a, f->data, false,
				  (char *)y->data + i0 * g->oh * g->ow * g->oc * es, err);
	}
	return st;
}

/* Conv2DBackpropInput: dpatches[rows, K] = dy[rows, OC] W^T, gathered into
 * dx (pointwise: the product is dx). */
static enum dg_status conv_dinput(struct dg_cuda_stream *s, const struct cpu_conv_geom *g,
				  const struct conv_plan *p, const struct dg_cuda_tensor *f,
				  const struct dg_cuda_tensor *dy, struct dg_cuda_tensor *dx,
				  struct dg_err *err)
{
	struct dgc_conv d = dgc_of(g);
	int64_t es = (int64_t)dg_dtype_size(dx->dtype);
	enum dg_status st = DG_OK;

	for (int64_t i0 = 0; i0 < g->n && st == DG_OK; i0 += p->block) {
		int64_t nb = g->n - i0 < p->block ? g->n - i0 : p->block, rows = nb * g->oh * g->ow;
		void *to = p->col ? p->col : (char *)dx->data + i0 * g->h * g->w * g->c * es;
		st = gemm(s, dx->dtype, false, true, rows, p->kk, g->oc,
			  (const char *)dy->data + i0 * g->oh * g->ow * g->oc * es, f->data, false,
			  to, err);
		if (st == DG_OK && p->col)
			st = DG_CUDA_CHECK(dgc_col2im((int)dx->dtype, &d, p->col, i0, nb, dx->data,
						      s->s), err);
	}
	return st;
}

/* Conv2DBackpropFilter: dW[K, OC] = sum over the blocks of patches^T dy. */
static enum dg_status conv_dfilter(struct dg_cuda_stream *s, const struct cpu_conv_geom *g,
				   const struct conv_plan *p, const struct dg_cuda_tensor *x,
				   const struct dg_cuda_tensor *dy, struct dg_cuda_tensor *df,
				   struct dg_err *err)
{
	struct dgc_conv d = dgc_of(g);
	int64_t es = (int64_t)dg_dtype_size(x->dtype);
	enum dg_status st = DG_OK;

	for (int64_t i0 = 0; i0 < g->n && st == DG_OK; i0 += p->block) {
		int64_t nb = g->n - i0 < p->block ? g->n - i0 : p->block, rows = nb * g->oh * g->ow;
		const void *a = (const char *)x->data + i0 * g->h * g->w * g->c * es;
		if (p->col) {
			st = DG_CUDA_CHECK(dgc_im2col((int)x->dtype, &d, x->data, i0, nb, p->col,
						      s->s), err);
			a = p->col;
		}
		if (st == DG_OK)
			st = gemm(s, x->dtype, true, false, p->kk, g->oc, rows, a,
				  (const char *)dy->data + i0 * g->oh * g->ow * g->oc * es, i0 > 0,
				  df->data, err);
	}
	return st;
}

enum dg_status cuda_conv(struct dg_cuda_stream *s, enum cuda_conv_kind kind, struct dg_attrs attrs,
			 const struct dg_cuda_tensor *x, const struct dg_cuda_tensor *f,
			 const struct dg_cuda_tensor *dy, struct dg_cuda_tensor *o,
			 struct dg_err *err)
{
	struct cpu_conv_geom g;
	struct conv_plan p;
	enum dg_status st = geometry_of(attrs, x, f, &g, err);

	if (st == DG_OK && dy)
		st = check_out(&g, x->dtype, dy, "the output gradient", err);
	if (st != DG_OK)
		return st;
	/* An empty convolution sums nothing: zeros (the filter's gradient of an
	 * empty batch is a whole filter of them). */
	if (empty(&g))
		return o->nbytes ? DG_CUDA_CHECK(cudaMemsetAsync(o->data, 0, o->nbytes, s->s), err)
				 : DG_OK;
	st = plan_of(s, &g, dg_dtype_size(x->dtype), &p, err);
	if (st != DG_OK)
		return st;
	switch (kind) {
	case CUDA_CONV: return conv_forward(s, &g, &p, x, f, o, err);
	case CUDA_CONV_DINPUT: return conv_dinput(s, &g, &p, f, dy, o, err);
	default: return conv_dfilter(s, &g, &p, x, dy, o, err);
	}
}

enum dg_status cuda_pool(struct dg_cuda_stream *s, bool max, struct dg_attrs attrs,
			 const struct dg_cuda_tensor *x, const struct dg_cuda_tensor *y,
			 const struct dg_cuda_tensor *dy, struct dg_cuda_tensor *o,
			 struct dg_err *err)
{
	struct cpu_conv_geom g;
	struct dgc_conv d;
	void *arg = NULL;
	enum dg_status st = geometry_of(attrs, x, NULL, &g, err);

	if (st == DG_OK && dy)
		st = check_out(&g, x->dtype, dy, "the output gradient", err);
	if (st == DG_OK && dy && y)
		st = check_out(&g, x->dtype, y, "the forward output", err);
	if (st != DG_OK || o->numel == 0)
		return st;
	d = dgc_of(&g);
	if (!dy)
		return DG_CUDA_CHECK(dgc_pool((int)x->dtype, &d, x->data, o->data, max, s->s), err);
	/* MaxPool2DGrad: the position each window chose, one int64 per output
	 * (there is one: a non-empty input has windows) */
	if (max)
		st = cuda_stream_scratch(s, (size_t)dy->numel * sizeof(int64_t), &arg, err);
	if (st != DG_OK)
		return st;
	return DG_CUDA_CHECK(dgc_pool_grad((int)x->dtype, &d, x->data, y ? y->data : NULL,
					   dy->data, o->data, max, arg, s->s),
			     err);
}
