/* The seeded initialisers on the GPU, value for value the stream of
 * kernels/cpu/random.c: Philox4x32-10 of kernels/philox.h keyed by the seed,
 * counter (block, attempt, step), one thread per Philox block. Uniforms are
 * bit-identical to the CPU's; normals go through CUDA's double log/sqrt/sin/cos, which may
 * differ from glibc's by an ulp before rounding to the output type. */
#include "cuda_common.cuh"
#include "../philox.h"

#include <math.h>

/* The counter layout of stream_block() in kernels/cpu/random.c. */
__device__ static void philox(const struct dgc_philox &g, uint64_t block, uint32_t attempt,
			      uint32_t w[4])
{
	dg_philox_block(g.key, g.step_lo, g.step_hi, block, attempt, w);
}

/* Four float32 values per block, scaled in float arithmetic like the CPU
 * (__fmul_rn/__fadd_rn keep nvcc from fusing them into an fma). */
__global__ void k_uniform_f32(float *y, int64_t n, struct dgc_philox g, float lo, float hi,
			      float span)
{
	int64_t nb = (n + 3) / 4, stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
		uint32_t w[4];
		philox(g, (uint64_t)b, 0, w);
		for (int j = 0; j < 4 && b * 4 + j < n; j++) {
			float v = __fadd_rn(lo, __fmul_rn(dg_philox_u24(w[j]), span));
			y[b * 4 + j] = v < hi ? v : nextafterf(hi, lo);
		}
	}
}

__global__ void k_uniform_f64(double *y, int64_t n, struct dgc_philox g, double a, double b_)
{
	int64_t nb = (n + 1) / 2, stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
		uint32_t w[4];
		philox(g, (uint64_t)b, 0, w);
		for (int j = 0; j < 2 && b * 2 + j < n; j++) {
			double u = dg_philox_u53(w[2 * j], w[2 * j + 1]);
			double v = __dadd_rn(a, __dmul_rn(u, b_ - a));
			y[b * 2 + j] = v < b_ ? v : nextafter(b_, a);
		}
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
		for (int j = 0; j < 2 && b * 2 + j < n; j++) {
			uint64_t bits = (uint64_t)w[2 * j] << 32 | w[2 * j + 1];
			y[b * 2 + j] = (T)(int64_t)((uint64_t)lo + bits % span);
		}
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

/* Standard normals of one block: 4 (24-bit uniforms) for float32, 2 (53-bit)
 * for float64. Returns how many. */
__device__ static int normals_block(const struct dgc_philox &g, uint64_t block, uint32_t att,
				    bool f64, double z[4])
{
	uint32_t w[4];

	philox(g, block, att, w);
	if (f64) {
		dg_box_muller(dg_philox_u53(w[0], w[1]), dg_philox_u53(w[2], w[3]), &z[0],
			      &z[1]);
		return 2;
	}
	dg_box_muller(dg_philox_u24(w[0]), dg_philox_u24(w[1]), &z[0], &z[1]);
	dg_box_muller(dg_philox_u24(w[2]), dg_philox_u24(w[3]), &z[2], &z[3]);
	return 4;
}

/* normal_z of random.c, one thread per block: element j of a block beyond 2
 * stddev takes element j of the next attempt that lies within. */
template <typename T>
__global__ void k_normal(T *y, int64_t n, struct dgc_philox g, double mean, double sd,
			 int truncated, unsigned long long *bad)
{
	const bool f64 = sizeof(T) == 8;
	const int per = f64 ? 2 : 4;
	int64_t nb = (n + per - 1) / per, stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += stride) {
		double z[4], zt[4];
		int m = normals_block(g, (uint64_t)b, 0, f64, z), left = 0;
		for (int j = 0; truncated && j < m; j++)
			left += fabs(z[j]) > 2.0;
		for (uint32_t att = 1; left > 0; att++) {
			if (att > 0xffff) {
				atomicMin(bad, (unsigned long long)(b * per));
				break;
			}
			normals_block(g, (uint64_t)b, att, f64, zt);
			for (int j = 0; j < m; j++) {
				if (fabs(z[j]) > 2.0 && fabs(zt[j]) <= 2.0) {
					z[j] = zt[j];
					left--;
				}
			}
		}
		for (int j = 0; j < m && b * per + j < n; j++) {
			if (f64)
				y[b * per + j] = (T)__dadd_rn(mean, __dmul_rn(sd, z[j]));
			else
				y[b * per + j] = (T)__fadd_rn((float)mean,
							      __fmul_rn((float)sd, (float)z[j]));
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
