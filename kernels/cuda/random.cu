/* The seeded initialisers and Dropout on the GPU, value for value the stream of
 * kernels/cpu/random.c: Philox4x32-10 of kernels/philox.h keyed by the seed,
 * counter (block, attempt, step), one thread per Philox block; every element's
 * math (uniforms, normals, truncation, scaling) is philox.h's, shared with the
 * CPU. Uniforms are bit-identical to the CPU's; normals go through CUDA's
 * double log/sqrt/sin/cos, which may differ from glibc's by an ulp before
 * rounding to the output type. */
#include "cuda_common.cuh"
#include "../philox.h"

#include <math.h>

/* The counter layout of stream_block() in kernels/cpu/random.c. */
__device__ static void philox(const struct dgc_philox &g, uint64_t block, uint32_t attempt,
			      uint32_t w[4])
{
	dg_philox_block(g.key, g.step_lo, g.step_hi, block, attempt, w);
}

/* Four float32 values per block, scaled in float arithmetic like the CPU. */
__global__ void k_uniform_f32(float *y, int64_t n, struct dgc_philox g, float lo, float hi,
			      float span)
{
	int64_t nb = (n + 3) / 4, stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
		uint32_t w[4];
		philox(g, (uint64_t)b, 0, w);
		for (int j = 0; j < 4 && b * 4 + j < n; j++)
			y[b * 4 + j] = dg_rand_uniform_f32(w[j], lo, hi, span);
	}
}

__global__ void k_uniform_f64(double *y, int64_t n, struct dgc_philox g, double a, double b_)
{
	int64_t nb = (n + 1) / 2, stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
		uint32_t w[4];
		philox(g, (uint64_t)b, 0, w);
		for (int j = 0; j < 2 && b * 2 + j < n; j++)
			y[b * 2 + j] = dg_rand_uniform_f64(w[2 * j], w[2 * j + 1], a, b_);
	}
}

template <typename T>
__global__ void k_uniform_int(T *y, int64_t n, struct dgc_philox g, int64_t lo, int64_t hi)
{
	int64_t nb = (n + 1) / 2, stride = (int64_t)gridDim.x * blockDim.x;
	uint64_t span = (uint64_t)hi - (uint64_t)lo;

	for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
		uint32_t w[4];
		philox(g, (uint64_t)b, 0, w);
		for (int j = 0; j < 2 && b * 2 + j < n; j++)
			y[b * 2 + j] = (T)dg_rand_uniform_int(w[2 * j], w[2 * j + 1], lo, span);
	}
}

extern "C" cudaError_t dgc_uniform(int dt, void *y, int64_t n, struct dgc_philox g, double a,
				   double b, int64_t ia, int64_t ib, cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	switch (dt) {
	case DGC_F32:
		k_uniform_f32<<<dgc_blocks((n + 3) / 4), DGC_BLOCK, 0, s>>>(
			(float *)y, n, g, (float)a, (float)b, (float)(b - a));
		break;
	case DGC_F64:
		k_uniform_f64<<<dgc_blocks((n + 1) / 2), DGC_BLOCK, 0, s>>>((double *)y, n, g, a,
									     b);
		break;
	case DGC_I32:
		k_uniform_int<int32_t><<<dgc_blocks((n + 1) / 2), DGC_BLOCK, 0, s>>>(
			(int32_t *)y, n, g, ia, ib);
		break;
	case DGC_I64:
		k_uniform_int<int64_t><<<dgc_blocks((n + 1) / 2), DGC_BLOCK, 0, s>>>(
			(int64_t *)y, n, g, ia, ib);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return dgc_launched();
}

/* normal_z of random.c, one thread per block (dg_rand_normal_block: element j
 * of a block beyond 2 stddev takes element j of the next attempt that lies
 * within). A block that exhausts its attempts lowers *bad and is written as
 * it stands. */
template <typename T>
__global__ void k_normal(T *y, int64_t n, struct dgc_philox g, double mean, double sd,
			 int truncated, unsigned long long *bad)
{
	const bool f64 = sizeof(T) == 8;
	const int per = f64 ? 2 : 4;
	int64_t nb = (n + per - 1) / per, stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
		double z[4];
		int m = dg_rand_normal_block(g.key, g.step_lo, g.step_hi, (uint64_t)b, f64,
					     truncated, z);
		if (m < 0) {
			atomicMin(bad, (unsigned long long)(b * per));
			m = per;
		}
		for (int j = 0; j < m && b * per + j < n; j++) {
			if (f64)
				y[b * per + j] = (T)dg_rand_scale_f64(mean, sd, z[j]);
			else
				y[b * per + j] = (T)dg_rand_scale_f32(mean, sd, z[j]);
		}
	}
}

extern "C" cudaError_t dgc_normal(int dt, void *y, int64_t n, struct dgc_philox g, double mean,
				  double sd, int truncated, unsigned long long *bad,
				  cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		k_normal<float><<<dgc_blocks((n + 3) / 4), DGC_BLOCK, 0, s>>>(
			(float *)y, n, g, mean, sd, truncated, bad);
	else if (dt == DGC_F64)
		k_normal<double><<<dgc_blocks((n + 1) / 2), DGC_BLOCK, 0, s>>>(
			(double *)y, n, g, mean, sd, truncated, bad);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}

/* Dropout: one thread per Philox block of four elements, both dtypes (the
 * CPU's loop). The scaling is the CPU's: x widened to double, times the
 * double 1 / (1 - rate), rounded once to T. */
template <typename T>
__global__ void k_dropout(const T *__restrict__ x, T *__restrict__ y, int64_t n,
			  struct dgc_philox g, float rate, double scale)
{
	int64_t nb = (n + 3) / 4, stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
		uint32_t w[4];
		philox(g, (uint64_t)b, 0, w);
		for (int j = 0; j < 4 && b * 4 + j < n; j++) {
			bool keep = dg_philox_u24(w[j]) >= rate;
			y[b * 4 + j] = keep ? (T)__dmul_rn((double)x[b * 4 + j], scale) : (T)0;
		}
	}
}

extern "C" cudaError_t dgc_dropout(int dt, const void *x, void *y, int64_t n,
				   struct dgc_philox g, double rate, cudaStream_t s)
{
	double scale = 1.0 / (1.0 - rate);

	if (n <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		k_dropout<float><<<dgc_blocks((n + 3) / 4), DGC_BLOCK, 0, s>>>(
			(const float *)x, (float *)y, n, g, (float)rate, scale);
	else if (dt == DGC_F64)
		k_dropout<double><<<dgc_blocks((n + 3) / 4), DGC_BLOCK, 0, s>>>(
			(const double *)x, (double *)y, n, g, (float)rate, scale);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}
