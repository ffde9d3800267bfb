/* MatMul and BatchMatMul on the GPU through cuBLAS (sgemm/dgemm and their
 * strided-batched forms; float16 and bfloat16 through cublasGemmEx with float32
 * accumulation, CUBLAS_COMPUTE_32F, and the output in the input dtype). cuBLAS
 * is column-major; a row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T, which is the same
 * memory, so no operand is ever copied or transposed. Batch dims broadcast like
 * kernels/cpu/matmul.c: one strided-batched call when every operand's batch
 * is either whole or a single matrix, else one gemm per output matrix. */
#include "cuda_internal.h"

#include <limits.h>
#include <string.h>

/* One gemm geometry: C[M,N] = op(A) [M,K] * op(B) [K,N], all row-major. */
struct geom {
	int m, n, k;
	bool ta, tb;
};

/* The 16-bit products: alpha and beta are float (the compute type), A, B and
 * C all of type ty. */
static enum dg_status gemm_ex(struct dg_cuda_stream *s, cudaDataType_t ty, const struct geom *g,
			      const void *a, const void *b, void *c, long long sa, long long sb,
			      long long sc, int batch, struct dg_err *err)
{
	cublasOperation_t opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	int lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
	const float one = 1.0f, zero = 0.0f;

	if (batch == 1)
		return DG_CUBLAS_CHECK(cublasGemmEx(s->blas, opb, opa, g->n, g->m, g->k, &one, b,
						    ty, ldb, a, ty, lda, &zero, c, ty, g->n,
						    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
				       err);
	return DG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(s->blas, opb, opa, g->n, g->m, g->k,
							  &one, b, ty, ldb, sb, a, ty, lda, sa,
							  &zero, c, ty, g->n, sc, batch,
							  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
			       err);
}

/* C^T[N,M] = op(B)^T[N,K] op(A)^T[K,M] in column-major terms. */
static enum dg_status gemm(struct dg_cuda_stream *s, enum dg_dtype dt, const struct geom *g,
			   const void *a, const void *b, void *c, long long sa, long long sb,
			   long long sc, int batch, struct dg_err *err)
{
	cublasOperation_t opa = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t opb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	int lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;

	if (dt == DG_F16 || dt == DG_BF16)
		return gemm_ex(s, dt == DG_F16 ? CUDA_R_16F : CUDA_R_16BF, g, a, b, c, sa, sb, sc,
			       batch, err);
	if (dt == DG_F64) {
		const double one = 1.0, zero = 0.0;
		if (batch == 1)
			return DG_CUBLAS_CHECK(cublasDgemm(s->blas, opb, opa, g->n, g->m, g->k,
							   &one, b, ldb, a, lda, &zero, c, g->n),
					       err);
		return DG_CUBLAS_CHECK(cublasDgemmStridedBatched(s->blas, opb, opa, g->n, g->m,
								 g->k, &one, b, ldb, sb, a, lda,
								 sa, &zero, c, g->n, sc, batch),
				       err);
	}
	const float one = 1.0f, zero = 0.0f;
	if (batch == 1)
		return DG_CUBLAS_CHECK(cublasSgemm(s->blas, opb, opa, g->n, g->m, g->k, &one, b,
						   ldb, a, lda, &zero, c, g->n),
				       err);
	return DG_CUBLAS_CHECK(cublasSgemmStridedBatched(s->blas, opb, opa, g->n, g->m, g->k,
							 &one, b, ldb, sb, a, lda, sa, &zero, c,
							 g->n, sc, batch),
			       err);
}

static bool fits_int(int64_t v)
{
	return v >= 0 && v <= INT_MAX;
}

/* Number of matrices in t (product of its dims before the last two). */
static int64_t batch_count(const struct dg_shape *s)
{
	int64_t n = 1;

	for (int i = 0; i < s->ndim - 2; i++)
		n *= s->dim[i];
	return n;
}

/* Element offset of output batch index b into operand t's matrices (matrix
 * size msz), broadcasting size-1 and missing batch dims. */
static int64_t batch_offset(const struct dg_shape *out, const struct dg_shape *t, int64_t b,
			    int64_t msz)
{
	int ob = out->ndim - 2, tb = t->ndim - 2;
	int64_t off = 0, stride = msz;

	for (int i = ob - 1; i >= 0; i--) {
		int64_t idx = b % out->dim[i];
		int j = i - (ob - tb);
		b /= out->dim[i];
		if (j < 0)
			continue;
		if (t->dim[j] != 1)
			off += idx * stride;
		stride *= t->dim[j];
	}
	return off;
}

/* Operand t (tb matrices) is one matrix for every batch, or has exactly the
 * output's batch dims (missing leading dims count as 1): a fixed stride. */
static bool whole_or_one(const struct dg_shape *out, const struct dg_shape *t, int64_t tb)
{
	if (tb == 1)
		return true;
	for (int i = 0; i < out->ndim - 2; i++) {
		int j = i - (out->ndim - t->ndim);
		if ((j >= 0 ? t->dim[j] : 1) != out->dim[i])
			return false;
	}
	return true;
}

enum dg_status cuda_matmul(struct dg_cuda_stream *s, bool bmm, struct dg_attrs attrs,
			   const struct dg_cuda_tensor *x, const struct dg_cuda_tensor *y,
			   struct dg_cuda_tensor *o, struct dg_err *err)
{
	const bool no = false;
	bool ta, tb;
	enum dg_dtype dt = x->dtype;
	int xr = x->shape.ndim, yr = y->shape.ndim, orank = o->shape.ndim;
	int64_t m, n, k, nbatch, xb, yb;
	size_t es = dg_dtype_size(dt);
	struct geom g;
	enum dg_status st;

	if (x->dtype != y->dtype || !(dg_dtype_is_float(dt) || dg_dtype_is_half(dt)))
		return dg_err_set(err, DG_EDTYPE, "cuBLAS products take float32, float64, float16 "
				  "or bfloat16, got %s and %s", dg_dtype_name(x->dtype),
				  dg_dtype_name(y->dtype));
	st = dg_attrs_bool(attrs, bmm ? "adj_x" : "transpose_a", &no, &ta, err);
	if (st == DG_OK)
		st = dg_attrs_bool(attrs, bmm ? "adj_y" : "transpose_b", &no, &tb, err);
	if (st != DG_OK)
		return st;
	if (xr < 2 || yr < 2 || orank < 2)
		return dg_err_set(err, DG_ESHAPE, "matrix products need rank >= 2 operands");
	m = o->shape.dim[orank - 2];
	n = o->shape.dim[orank - 1];
	k = ta ? x->shape.dim[xr - 2] : x->shape.dim[xr - 1];
	if (o->numel == 0)
		return DG_OK;
	if (k == 0)     /* an empty sum: zeros (gemm with k = 0 is not portable) */
		return DG_CUDA_CHECK(cudaMemsetAsync(o->data, 0, o->nbytes, s->s), err);
	nbatch = o->numel / (m * n);
	if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(nbatch)) {
		dg_err_set(err, DG_EUNSUPPORTED,
			   "matrix dims or batch count over INT_MAX do not fit cuBLAS");
		dg_err_hint(err, "place this node on the CPU");
		return DG_EUNSUPPORTED;
	}
	g = (struct geom){ (int)m, (int)n, (int)k, ta, tb };
	xb = batch_count(&x->shape);
	yb = batch_count(&y->shape);
	/* Whole batches or single matrices: one strided call (stride 0 broadcasts). */
	if (whole_or_one(&o->shape, &x->shape, xb) && whole_or_one(&o->shape, &y->shape, yb))
		return gemm(s, dt, &g, x->data, y->data, o->data, xb > 1 ? m * k : 0,
			    yb > 1 ? k * n : 0, m * n, (int)nbatch, err);
	for (int64_t b = 0; b < nbatch; b++) {
		const char *pa = (const char *)x->data +
				 batch_offset(&o->shape, &x->shape, b, m * k) * (int64_t)es;
		const char *pb = (const char *)y->data +
				 batch_offset(&o->shape, &y->shape, b, k * n) * (int64_t)es;
		st = gemm(s, dt, &g, pa, pb, (char *)o->data + b * m * n * (int64_t)es, 0, 0, 0,
			  1, err);
		if (st != DG_OK)
			return st;
	}
	return DG_OK;
}
