/* MatMul and BatchMatMul: float32/float64 matrix products through the sgemm and
 * dgemm that blas.c loads. Transposes are passed to BLAS (no copies), outputs are
 * allocated uninitialised and written with beta = 0. Shapes that BLAS cannot take
 * (dims over INT_MAX) or need not see (empty dims) are handled here. float16 and
 * bfloat16 inputs are widened to float32, multiplied by sgemm (float32
 * accumulation) and the result rounded once to the input dtype. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "blas.h"
#include "cpu.h"
#include "grad.h"

static const struct dg_attr_spec matmul_attrs[] = {
	{ "transpose_a", DG_ATTR_BOOL, false, "multiply by a's transpose (a is [K,M])" },
	{ "transpose_b", DG_ATTR_BOOL, false, "multiply by b's transpose (b is [N,K])" },
	{ 0 },
};

static const struct dg_attr_spec bmm_attrs[] = {
	{ "adj_x", DG_ATTR_BOOL, false, "use the adjoint (transpose) of each x matrix" },
	{ "adj_y", DG_ATTR_BOOL, false, "use the adjoint (transpose) of each y matrix" },
	{ 0 },
};

/* Which attr names an op uses for its two transposes (for messages). */
struct names {
	const char *op, *ta, *tb;
};
static const struct names mm_names = { "MatMul", "transpose_a", "transpose_b" };
static const struct names bmm_names = { "BatchMatMul", "adj_x", "adj_y" };

/* The dims of one product: out[M,N] = op(a)[M,K] @ op(b)[K,N]. -1 = unknown. */
struct mnk {
	int64_t m, k_a, k_b, n;
};

static enum dg_status read_flags(struct dg_attrs attrs, const struct names *nm, bool *ta,
				 bool *tb, struct dg_err *err)
{
	static const bool no = false;
	enum dg_status st = dg_attrs_bool(attrs, nm->ta, &no, ta, err);

	if (st == DG_OK)
		st = dg_attrs_bool(attrs, nm->tb, &no, tb, err);
	return st;
}

static bool product_dtype(enum dg_dtype dt)
{
	return dg_dtype_is_float(dt) || dg_dtype_is_half(dt);
}

/* Both inputs of one float dtype: float32, float64, float16 or bfloat16. */
static enum dg_status check_dtypes(enum dg_dtype a, enum dg_dtype b, struct dg_err *err)
{
	enum dg_dtype bad = !product_dtype(a) ? a : b;

	if (!product_dtype(a) || !product_dtype(b)) {
		dg_err_set(err, DG_EDTYPE, "matrix products support float32, float64, float16 "
			   "and bfloat16, got %s", dg_dtype_name(bad));
		dg_err_hint(err, "Cast the inputs to float32 first");
		return DG_EDTYPE;
	}
	if (a != b) {
		dg_err_set(err, DG_EDTYPE, "mixed dtypes %s and %s", dg_dtype_name(a),
			   dg_dtype_name(b));
		dg_err_hint(err, "Cast one input so both have the same dtype (e.g. float32)");
		return DG_EDTYPE;
	}
	return DG_OK;
}

/* The last two dims of a (known-rank, >= 2) shape as rows/cols of op(matrix). */
static void mat_dims(const struct dg_shape *s, bool t, int64_t *rows, int64_t *cols)
{
	int64_t r = s->dim[s->ndim - 2], c = s->dim[s->ndim - 1];

	*rows = t ? c : r;
	*cols = t ? r : c;
}

static enum dg_status rank_error(const struct dg_shape *a, const struct dg_shape *b,
				 const struct names *nm, struct dg_err *err)
{
	char sa[96], sb[96];

	dg_shape_format(a, sa, sizeof sa);
	dg_shape_format(b, sb, sizeof sb);
	if (nm == &mm_names) {
		dg_err_set(err, DG_ESHAPE, "MatMul needs rank-2 inputs, got %s x %s", sa, sb);
		dg_err_hint(err, "use BatchMatMul for batches; Reshape a vector to [1,K] or [K,1]");
	} else {
		dg_err_set(err, DG_ESHAPE, "BatchMatMul needs inputs of rank >= 2, got %s x %s",
			   sa, sb);
		dg_err_hint(err, "Reshape a vector to [1,K] or [K,1]");
	}
	return DG_ESHAPE;
}

static enum dg_status inner_error(const struct dg_shape *a, const struct dg_shape *b,
				  const struct mnk *d, bool ta, bool tb, const struct names *nm,
				  struct dg_err *err)
{
	char sa[96], sb[96];

	dg_shape_format(a, sa, sizeof sa);
	dg_shape_format(b, sb, sizeof sb);
	dg_err_set(err, DG_ESHAPE, "inner dimensions differ: %s x %s (%lld vs %lld with %s=%s, "
		   "%s=%s)", sa, sb, (long long)d->k_a, (long long)d->k_b, nm->ta,
		   ta ? "true" : "false", nm->tb, tb ? "true" : "false");
	dg_err_hint(err, "the columns of the first input must equal the rows of the second; "
		    "set %s/%s to transpose, or swap the inputs", nm->ta, nm->tb);
	return DG_ESHAPE;
}

/* M, N and K go to BLAS as int (blasint); lda/ldb/ldc are among them. */
static enum dg_status check_blas_limits(const struct mnk *d, struct dg_err *err)
{
	const int64_t dims[3] = { d->m, d->n, d->k_a };

	for (int i = 0; i < 3; i++) {
		if (dims[i] > INT_MAX) {
			dg_err_set(err, DG_ETOOLARGE, "matrix dimension %lld exceeds the BLAS "
				   "limit of %d", (long long)dims[i], INT_MAX);
			dg_err_hint(err, "split the product into blocks of at most 2^31-1 rows "
				    "and columns");
			return DG_ETOOLARGE;
		}
	}
	return DG_OK;
}

/* Status after cpu_out/cpu_out_zero returned NULL (err may be NULL). */
static enum dg_status out_status(const struct dg_kernel_ctx *c)
{
	return c->err && c->err->code != DG_OK ? c->err->code : DG_ENOMEM;
}

/* The checks every product makes, over (possibly partial) types, so that
 * inference and kernels refuse the same inputs: the transpose flags, float
 * dtypes, ranks (2 for MatMul, at least 2 for BatchMatMul; -1 unknown passes)
 * and equal inner dims where both are known. d gets M, K (of each side) and
 * N of op(a) @ op(b), -1 where unknown. */
static enum dg_status product_check(struct dg_attrs attrs, const struct names *nm,
				    const struct dg_ttype *a, const struct dg_ttype *b, bool *ta,
				    bool *tb, struct mnk *d, struct dg_err *err)
{
	const struct dg_shape *sa = &a->shape, *sb = &b->shape;
	bool batched = nm == &bmm_names;
	enum dg_status st = read_flags(attrs, nm, ta, tb, err);

	if (st == DG_OK)
		st = check_dtypes(a->dtype, b->dtype, err);
	if (st != DG_OK)
		return st;
	if ((sa->ndim != -1 && (batched ? sa->ndim < 2 : sa->ndim != 2)) ||
	    (sb->ndim != -1 && (batched ? sb->ndim < 2 : sb->ndim != 2)))
		return rank_error(sa, sb, nm, err);
	d->m = d->k_a = d->k_b = d->n = -1;
	if (sa->ndim != -1)
		mat_dims(sa, *ta, &d->m, &d->k_a);
	if (sb->ndim != -1)
		mat_dims(sb, *tb, &d->k_b, &d->n);
	if (d->k_a >= 0 && d->k_b >= 0 && d->k_a != d->k_b)
		return inner_error(sa, sb, d, *ta, *tb, nm, err);
	return DG_OK;
}

/* One product out[M,N] = op(a) @ op(b) with BLAS: op(a) is a[M,K] (lda = K) or
 * a[K,M]^T (lda = M); op(b) is b[K,N] (ldb = N) or b[N,K]^T (ldb = K). All of
 * m, n, k are in 1..INT_MAX (checked by the callers). */
static void gemm(const struct dg_blas *bl, enum dg_dtype dt, bool ta, bool tb, int64_t m,
		 int64_t n, int64_t k, const void *a, const void *b, void *out)
{
	enum CBLAS_TRANSPOSE tra = ta ? CblasTrans : CblasNoTrans;
	enum CBLAS_TRANSPOSE trb = tb ? CblasTrans : CblasNoTrans;
	int im = (int)m, in = (int)n, ik = (int)k;

	if (dt == DG_F32)
		bl->sgemm(CblasRowMajor, tra, trb, im, in, ik, 1.0f, a, ta ? im : ik, b,
			  tb ? ik : in, 0.0f, out, in);
	else
		bl->dgemm(CblasRowMajor, tra, trb, im, in, ik, 1.0, a, ta ? im : ik, b,
			  tb ? ik : in, 0.0, out, in);
}

/* A float32 copy of a 16-bit float tensor, or NULL with *err set. */
static struct dg_tensor *widen(const struct dg_tensor *t, struct dg_err *err)
{
	struct dg_tensor *w = dg_tensor_new_uninit(DG_F32, &t->shape, err);

	if (w)
		dg_half_to_f32(t->dtype, t->data, w->data, t->numel);
	return w;
}

/* Run the float32 kernel fn on widened copies of c's two 16-bit inputs and
 * store its result rounded to their dtype in c->out[0]. The caller has checked
 * the dtypes and shapes (fn checks them again on the copies). */
static enum dg_status via_f32(struct dg_kernel_ctx *c, dg_kernel_fn fn)
{
	enum dg_dtype dt = c->in[0]->dtype;
	struct dg_tensor *wa = widen(c->in[0], c->err), *wb = NULL, *wo = NULL;
	enum dg_status st = DG_ENOMEM;

	if (wa)
		wb = widen(c->in[1], c->err);
	if (!wb)
		goto out;
	const struct dg_tensor *win[2] = { wa, wb };
	struct dg_kernel_ctx fc = *c;
	fc.in = win;
	fc.n_out = 1;
	fc.out = &wo;
	st = fn(&fc);
	if (st != DG_OK)
		goto out;
	struct dg_tensor *y = cpu_out(c, 0, dt, &wo->shape);
	if (!y) {
		st = out_status(c);
		goto out;
	}
	dg_f32_to_half(dt, wo->data, y->data, wo->numel);
out:
	if (st == DG_ENOMEM && c->err && c->err->code == DG_OK)
		dg_err_set(c->err, DG_ENOMEM, "out of memory widening %s inputs to float32",
			   dg_dtype_name(dt));
	dg_tensor_free(wa);
	dg_tensor_free(wb);
	dg_tensor_free(wo);
	return st;
}

/* --- MatMul ---------------------------------------------------------------- */

static enum dg_status matmul_infer(struct dg_infer_ctx *c)
{
	struct mnk d;
	bool ta, tb;
	enum dg_status st = product_check(dg_attrs_of_json(c->attrs), &mm_names, &c->in[0], &c->in[1], &ta, &tb,
					  &d, c->err);

	if (st != DG_OK)
		return st;
	c->out[0].dtype = c->in[0].dtype;
	c->out[0].shape.ndim = 2;
	c->out[0].shape.dim[0] = d.m;
	c->out[0].shape.dim[1] = d.n;
	return DG_OK;
}

/* out[M,N] = op(a)[M,K] @ op(b)[K,N] */
static enum dg_status matmul_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *a = c->in[0], *b = c->in[1];
	struct dg_ttype at = cpu_ttype(a), bt = cpu_ttype(b);
	const struct dg_blas *bl;
	struct dg_shape os = { .ndim = 2 };
	int64_t numel;
	struct mnk d;
	bool ta, tb;
	enum dg_status st = product_check(c->attrs, &mm_names, &at, &bt, &ta, &tb, &d, c->err);

	if (st == DG_OK)
		st = check_blas_limits(&d, c->err);
	if (st != DG_OK)
		return st;
	if (dg_dtype_is_half(a->dtype))
		return via_f32(c, matmul_cpu);
	os.dim[0] = d.m;
	os.dim[1] = d.n;
	st = dg_shape_numel(&os, &numel, c->err);
	if (st != DG_OK)
		return st;
	/* Empty products never reach BLAS (it rejects lda = 0); K = 0 sums nothing. */
	if (numel == 0 || d.k_a == 0)
		return cpu_out_zero(c, 0, a->dtype, &os) ? DG_OK : out_status(c);
	bl = dg_blas_get(c->err);
	if (!bl)
		return DG_EDEVICE;
	if (!cpu_out(c, 0, a->dtype, &os))
		return out_status(c);
	gemm(bl, a->dtype, ta, tb, d.m, d.n, d.k_a, a->data, b->data, c->out[0]->data);
	return DG_OK;
}

/* --- BatchMatMul ----------------------------------------------------------- */

/* The batch part (all but the last two dims) of a rank >= 2 shape. */
static struct dg_shape batch_of(const struct dg_shape *s)
{
	return dg_shape_make(s->ndim - 2, s->dim);
}

/* Broadcast the batch dims of x and y into *bo; on mismatch an error naming both
 * full shapes (dg_shape_broadcast's own message would show only the batch parts). */
static enum dg_status batch_broadcast(const struct dg_shape *x, const struct dg_shape *y,
				      struct dg_shape *bo, struct dg_err *err)
{
	struct dg_shape bx = batch_of(x), by = batch_of(y);
	char sx[96], sy[96], tx[96], ty[96];

	if (dg_shape_broadcast(&bx, &by, bo, NULL) == DG_OK)
		return DG_OK;
	dg_shape_format(&bx, tx, sizeof tx);
	dg_shape_format(&by, ty, sizeof ty);
	dg_shape_format(x, sx, sizeof sx);
	dg_shape_format(y, sy, sizeof sy);
	dg_err_set(err, DG_ESHAPE, "batch dimensions %s and %s cannot be broadcast together: "
		   "%s x %s", tx, ty, sx, sy);
	dg_err_hint(err, "aligned from the right, each pair of batch sizes must be equal or 1");
	return DG_ESHAPE;
}

static enum dg_status bmm_infer(struct dg_infer_ctx *c)
{
	const struct dg_shape *x = &c->in[0].shape, *y = &c->in[1].shape;
	struct dg_shape *os = &c->out[0].shape;
	struct mnk d;
	bool ta, tb;
	enum dg_status st = product_check(dg_attrs_of_json(c->attrs), &bmm_names, &c->in[0], &c->in[1], &ta, &tb,
					  &d, c->err);

	if (st != DG_OK)
		return st;
	c->out[0].dtype = c->in[0].dtype;
	/* Without both ranks the output rank (batch broadcast) is unknown. */
	if (x->ndim == -1 || y->ndim == -1) {
		os->ndim = -1;
		return DG_OK;
	}
	st = batch_broadcast(x, y, os, c->err);
	if (st != DG_OK)
		return st;
	os->dim[os->ndim++] = d.m;
	os->dim[os->ndim++] = d.n;
	return DG_OK;
}

/* Per output batch dim, the step (in matrices) of one input's batch index:
 * 0 where that input broadcasts (size 1 or missing on the left). */
static void batch_strides(const struct dg_shape *bs, const struct dg_shape *bo, int64_t *st)
{
	int off = bo->ndim - bs->ndim;
	int64_t acc = 1;

	for (int i = bo->ndim - 1; i >= 0; i--) {
		int j = i - off;

		st[i] = (j < 0 || bs->dim[j] == 1) ? 0 : acc;
		if (j >= 0)
			acc *= bs->dim[j];
	}
}

/* out[b..., M,N] = op(x[b..., :, :]) @ op(y[b..., :, :]) for every output batch
 * index b (numpy matmul broadcasting). nb >= 1 and m, n, k >= 1. */
static void bmm_loop(const struct dg_blas *bl, const struct dg_tensor *x,
		     const struct dg_tensor *y, struct dg_tensor *out, const struct dg_shape *bo,
		     int64_t nb, const struct mnk *d, bool ta, bool tb)
{
	struct dg_shape bx = batch_of(&x->shape), by = batch_of(&y->shape);
	int64_t sx[DG_MAX_DIMS], sy[DG_MAX_DIMS], idx[DG_MAX_DIMS] = { 0 };
	size_t es = dg_dtype_size(x->dtype);
	size_t xsz = (size_t)(d->m * d->k_a) * es, ysz = (size_t)(d->k_a * d->n) * es;
	size_t osz = (size_t)(d->m * d->n) * es;
	const char *xb = x->data, *yb = y->data;
	char *ob = out->data;
	int64_t ox = 0, oy = 0;             /* current x / y matrix index */

	batch_strides(&bx, bo, sx);
	batch_strides(&by, bo, sy);
	for (int64_t i = 0; i < nb; i++) {
		gemm(bl, x->dtype, ta, tb, d->m, d->n, d->k_a, xb + (size_t)ox * xsz,
		     yb + (size_t)oy * ysz, ob + (size_t)i * osz);
		/* Odometer over the output batch dims, moving ox/oy along. */
		for (int j = bo->ndim - 1; j >= 0; j--) {
			ox += sx[j];
			oy += sy[j];
			if (++idx[j] < bo->dim[j])
				break;
			ox -= sx[j] * bo->dim[j];
			oy -= sy[j] * bo->dim[j];
			idx[j] = 0;
		}
	}
}

/* out[b..., M,N] = op(x)[b..., M,K] @ op(y)[b..., K,N] with broadcast batches */
static enum dg_status bmm_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0], *y = c->in[1];
	struct dg_ttype xt = cpu_ttype(x), yt = cpu_ttype(y);
	const struct dg_blas *bl;
	struct dg_shape bo, os;
	int64_t numel, nb, nby;
	struct mnk d;
	bool ta, tb;
	enum dg_status st = product_check(c->attrs, &bmm_names, &xt, &yt, &ta, &tb, &d, c->err);

	if (st == DG_OK)
		st = batch_broadcast(&x->shape, &y->shape, &bo, c->err);
	if (st == DG_OK)
		st = check_blas_limits(&d, c->err);
	if (st != DG_OK)
		return st;
	if (dg_dtype_is_half(x->dtype))
		return via_f32(c, bmm_cpu);
	os = bo;
	os.dim[os.ndim++] = d.m;
	os.dim[os.ndim++] = d.n;
	/* A zero dim anywhere lets the other dims be huge: count the output first. */
	st = dg_shape_numel(&os, &numel, c->err);
	if (st != DG_OK)
		return st;
	if (numel == 0 || d.k_a == 0)
		return cpu_out_zero(c, 0, x->dtype, &os) ? DG_OK : out_status(c);
	/* Now M, N, K >= 1, so the batch counts are at most the element counts. */
	nb = numel / (d.m * d.n);
	nby = y->numel / (d.k_a * d.n);
	bl = dg_blas_get(c->err);
	if (!bl)
		return DG_EDEVICE;
	if (!cpu_out(c, 0, x->dtype, &os))
		return out_status(c);
	/* One y matrix for all batches and x rows contiguous: fold the batch into M,
	 * x as [nb*M, K] (one large GEMM beats nb small ones). */
	if (nby == 1 && !ta && nb <= INT_MAX / d.m)
		gemm(bl, x->dtype, false, tb, nb * d.m, d.n, d.k_a, x->data, y->data,
		     c->out[0]->data);
	else
		bmm_loop(bl, x, y, c->out[0], &bo, nb, &d, ta, tb);
	return DG_OK;
}

struct dg_op_def dg_ops_matmul[] = {
	{
		.name = "MatMul", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
		.attrs = matmul_attrs, .infer = matmul_infer, .cpu = matmul_cpu,
		.grad = cpu_grad_matmul,
		.doc = "matrix product of two rank-2 float tensors (OpenBLAS gemm; float16 and "
		       "bfloat16 accumulate in float32)",
	},
	{
		.name = "BatchMatMul", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
		.attrs = bmm_attrs, .infer = bmm_infer, .cpu = bmm_cpu,
		.grad = cpu_grad_batch_matmul,
		.doc = "batched matrix product with numpy broadcasting of batch dims",
	},
	{ 0 },
};
