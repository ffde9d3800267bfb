/* Softmax, LogSoftmax and the two softmax cross-entropies on the GPU. One
 * thread per row (x viewed [outer, n, inner], a row is the n classes of one
 * (outer, inner) pair): max, then the sum of exponentials in double, then the
 * outputs. A row whose max is not finite gives NaN, as in kernels/cpu/nn.c.
 * Simple rather than fast: the class axis of a training step is short. And
 * OneHot, one thread per output element. */
#include "cuda_common.cuh"

#include <math.h>

/* Max of a row with NaN winning; the row has n >= 1 elements at stride st. */
template <typename T> __device__ static T row_max(const T *p, int64_t n, int64_t st)
{
	T m = p[0];

	for (int64_t r = 1; r < n; r++) {
		T v = p[r * st];
		m = (v > m || v != v) ? v : m;
	}
	return m;
}

/* log(sum(e^x)) of a row in double; NaN when the max is not finite. */
template <typename T> __device__ static double row_lse(const T *p, int64_t n, int64_t st)
{
	T m = row_max(p, n, st);
	double s = 0;

	if (!isfinite((double)m))
		return NAN;
	for (int64_t r = 0; r < n; r++)
		s += exp((double)p[r * st] - (double)m);
	return (double)m + log(s);
}

template <typename T>
__global__ void k_softmax(const T *__restrict__ x, T *__restrict__ y, int64_t outer, int64_t n,
			  int64_t inner, int log_form)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * inner;
	     t += stride) {
		int64_t o = t / inner, j = t - o * inner, base = o * n * inner + j;
		const T *p = x + base;
		T *q = y + base;
		T m = row_max(p, n, inner);
		double s = 0;
		if (!isfinite((double)m)) {
			for (int64_t r = 0; r < n; r++)
				q[r * inner] = (T)NAN;
			continue;
		}
		for (int64_t r = 0; r < n; r++)
			s += exp((double)p[r * inner] - (double)m);
		if (log_form) {
			double ls = log(s);
			for (int64_t r = 0; r < n; r++)
				q[r * inner] = (T)(((double)p[r * inner] - (double)m) - ls);
		} else {
			for (int64_t r = 0; r < n; r++)
				q[r * inner] = (T)(exp((double)p[r * inner] - (double)m) / s);
		}
	}
}

extern "C" cudaError_t dgc_softmax(int dt, const void *x, void *y, int64_t outer, int64_t n,
				   int64_t inner, int log_form, cudaStream_t s)
{
	int64_t rows = outer * inner;

	if (rows <= 0 || n <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		k_softmax<float><<<dgc_blocks(rows), DGC_BLOCK, 0, s>>>(
			(const float *)x, (float *)y, outer, n, inner, log_form);
	else if (dt == DGC_F64)
		k_softmax<double><<<dgc_blocks(rows), DGC_BLOCK, 0, s>>>(
			(const double *)x, (double *)y, outer, n, inner, log_form);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}

/* loss[r] = sum_c lab * (lse - x); n == 0 gives 0 (an empty sum). */
template <typename T>
__global__ void k_xent(const T *__restrict__ x, const T *__restrict__ lab, T *__restrict__ loss,
		       int64_t rows, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride) {
		const T *p = x + r * n, *l = lab + r * n;
		double lse, acc = 0;
		if (n == 0) {
			loss[r] = 0;
			continue;
		}
		lse = row_lse(p, n, 1);
		for (int64_t c = 0; c < n; c++)
			acc += (double)l[c] * (lse - (double)p[c]);
		loss[r] = (T)acc;
	}
}

extern "C" cudaError_t dgc_xent(int dt, const void *x, const void *lab, void *loss, int64_t rows,
				int64_t n, cudaStream_t s)
{
	if (rows <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		k_xent<float><<<dgc_blocks(rows), DGC_BLOCK, 0, s>>>(
			(const float *)x, (const float *)lab, (float *)loss, rows, n);
	else if (dt == DGC_F64)
		k_xent<double><<<dgc_blocks(rows), DGC_BLOCK, 0, s>>>(
			(const double *)x, (const double *)lab, (double *)loss, rows, n);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}

template <typename T, typename L>
__global__ void k_sparse_xent(const T *__restrict__ x, const L *__restrict__ lab,
			      T *__restrict__ loss, int64_t rows, int64_t n,
			      unsigned long long *bad)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += stride) {
		int64_t k = (int64_t)lab[r];
		const T *p = x + r * n;
		if (k < 0 || k >= n) {
			loss[r] = (T)NAN;
			atomicMin(bad, (unsigned long long)r);
			continue;
		}
		loss[r] = (T)(row_lse(p, n, 1) - (double)p[k]);
	}
}

template <typename T>
static cudaError_t sparse_t(int ldt, const void *x, const void *lab, void *loss, int64_t rows,
			    int64_t n, unsigned long long *bad, cudaStream_t s)
{
	if (ldt == DGC_I32)
		k_sparse_xent<T, int32_t><<<dgc_blocks(rows), DGC_BLOCK, 0, s>>>(
			(const T *)x, (const int32_t *)lab, (T *)loss, rows, n, bad);
	else
		k_sparse_xent<T, int64_t><<<dgc_blocks(rows), DGC_BLOCK, 0, s>>>(
			(const T *)x, (const int64_t *)lab, (T *)loss, rows, n, bad);
	return dgc_launched();
}

extern "C" cudaError_t dgc_sparse_xent(int dt, int ldt, const void *x, const void *lab,
				       void *loss, int64_t rows, int64_t n,
				       unsigned long long *bad, cudaStream_t s)
{
	if (rows <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		return sparse_t<float>(ldt, x, lab, loss, rows, n, bad, s);
	if (dt == DGC_F64)
		return sparse_t<double>(ldt, x, lab, loss, rows, n, bad, s);
	return cudaErrorInvalidValue;
}

/* The CPU's values: on and off rounded once from double to T. */
template <typename T, typename I>
__global__ void k_one_hot(const I *__restrict__ ix, T *__restrict__ y, int64_t n, int64_t depth,
			  T on, T off)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t i = e / depth;
		y[e] = (int64_t)ix[i] == e - i * depth ? on : off;
	}
}

template <typename T>
static void one_hot_t(int idt, const void *ix, void *y, int64_t n, int64_t depth, double on,
		      double off, cudaStream_t s)
{
	if (idt == DGC_I32)
		k_one_hot<T, int32_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(const int32_t *)ix, (T *)y, n, depth, (T)on, (T)off);
	else
		k_one_hot<T, int64_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(const int64_t *)ix, (T *)y, n, depth, (T)on, (T)off);
}

extern "C" cudaError_t dgc_one_hot(int dt, int idt, const void *ix, void *y, int64_t n,
				   int64_t depth, double on, double off, cudaStream_t s)
{
	int64_t total = n * depth;

	if (total <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		one_hot_t<float>(idt, ix, y, total, depth, on, off, s);
	else if (dt == DGC_F64)
		one_hot_t<double>(idt, ix, y, total, depth, on, off, s);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}
