/* The fused gradient helpers of kernels/cpu/grad.c on the GPU: ReluGrad,
 * SigmoidGrad, TanhGrad (one flat elementwise pass over g and the forward value)
 * and SparseSoftmaxCrossEntropyGrad (one thread per row, like nn.cu). The
 * reshaping helpers (SumToShapeOf, UnreduceLike, SliceGrad, ReshapeLike) reuse
 * the reduce, binary and copy launchers from dispatch.c. Expressions are the
 * CPU's, with products rounded separately (no FMA contraction). */
#include "cuda_common.cuh"

#include <math.h>

/* Relu passes g where x > 0; sigmoid' = y (1 - y); tanh' = 1 - y^2 (from y). */
__device__ static inline float ew_grad(int op, float g, float y)
{
	if (op == DGC_GRELU)
		return y > 0 ? g : 0.0f;
	if (op == DGC_GSIGMOID)
		return __fmul_rn(__fmul_rn(g, y), __fsub_rn(1.0f, y));
	return __fmul_rn(g, __fsub_rn(1.0f, __fmul_rn(y, y)));
}

__device__ static inline double ew_grad(int op, double g, double y)
{
	if (op == DGC_GRELU)
		return y > 0 ? g : 0.0;
	if (op == DGC_GSIGMOID)
		return __dmul_rn(__dmul_rn(g, y), __dsub_rn(1.0, y));
	return __dmul_rn(g, __dsub_rn(1.0, __dmul_rn(y, y)));
}

template <typename T>
__global__ void k_ew_grad(int op, const T *__restrict__ g, const T *__restrict__ v,
			  T *__restrict__ o, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		o[i] = ew_grad(op, g[i], v[i]);
}

extern "C" cudaError_t dgc_ew_grad(int op, int dt, const void *g, const void *v, void *o,
				   int64_t n, cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		k_ew_grad<float><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			op, (const float *)g, (const float *)v, (float *)o, n);
	else if (dt == DGC_F64)
		k_ew_grad<double><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			op, (const double *)g, (const double *)v, (double *)o, n);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}

/* o[r, :] = softmax(x[r, :]) - one_hot(label[r]) for rows of n classes. The max
 * ignores NaN and the sum is in double, as the CPU's loop; a label outside
 * [0, n) fills its row with NaN and lowers *bad to the row. */
template <typename T, typename L>
__global__ void k_sparse_xent_grad(const T *__restrict__ x, const L *__restrict__ lab,
				   T *__restrict__ o, int64_t rows, int64_t n,
				   unsigned long long *bad)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride) {
		const T *p = x + r * n;
		T *q = o + r * n;
		int64_t k = (int64_t)lab[r];
		double m = -INFINITY, sum = 0;
		if (k < 0 || k >= n) {
			for (int64_t c = 0; c < n; c++)
				q[c] = (T)NAN;
			atomicMin(bad, (unsigned long long)r);
			continue;
		}
		for (int64_t c = 0; c < n; c++)
			m = (double)p[c] > m ? (double)p[c] : m;
		for (int64_t c = 0; c < n; c++)
			sum += exp((double)p[c] - m);
		for (int64_t c = 0; c < n; c++)
			q[c] = (T)(exp((double)p[c] - m) / sum);
		q[k] = q[k] - (T)1;
	}
}

template <typename T>
static cudaError_t sparse_grad_t(int ldt, const void *x, const void *lab, void *o, int64_t rows,
				 int64_t n, unsigned long long *bad, cudaStream_t s)
{
	if (ldt == DGC_I32)
		k_sparse_xent_grad<T, int32_t><<<dgc_blocks(rows), DGC_BLOCK, 0, s>>>(
			(const T *)x, (const int32_t *)lab, (T *)o, rows, n, bad);
	else
		k_sparse_xent_grad<T, int64_t><<<dgc_blocks(rows), DGC_BLOCK, 0, s>>>(
			(const T *)x, (const int64_t *)lab, (T *)o, rows, n, bad);
	return dgc_launched();
}

extern "C" cudaError_t dgc_sparse_xent_grad(int dt, int ldt, const void *x, const void *lab,
					    void *o, int64_t rows, int64_t n,
					    unsigned long long *bad, cudaStream_t s)
{
	if (rows <= 0 || n <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		return sparse_grad_t<float>(ldt, x, lab, o, rows, n, bad, s);
	if (dt == DGC_F64)
		return sparse_grad_t<double>(ldt, x, lab, o, rows, n, bad, s);
	return cudaErrorInvalidValue;
}
