/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
 * SC 2011; the generator of TensorFlow and cuRAND), the counter layout of the
 * random ops, and the conversions of its words to uniforms and normals. One
 * definition, included by kernels/cpu/random.c and kernels/cuda/random.cu, so
 * the CPU and GPU streams cannot drift apart. Every function is static inline
 * and, under nvcc, __host__ __device__. */
#ifndef DG_KERNELS_PHILOX_H
#define DG_KERNELS_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DG_PHILOX_FN __host__ __device__ static inline
#else
#define DG_PHILOX_FN static inline
#endif

#define DG_PHILOX_M0 0xD2511F53u
#define DG_PHILOX_M1 0xCD9E8D57u
#define DG_PHILOX_W0 0x9E3779B9u   /* golden ratio: the key schedule's bumps */
#define DG_PHILOX_W1 0xBB67AE85u   /* sqrt(3) - 1 */

/* One block: out = bijection_key(ctr), ten rounds. */
DG_PHILOX_FN void dg_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
	uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
	uint32_t k0 = key[0], k1 = key[1];

	for (int r = 0; r < 10; r++) {
		uint64_t p0 = (uint64_t)DG_PHILOX_M0 * c0, p1 = (uint64_t)DG_PHILOX_M1 * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
		uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;

		c0 = n0;
		c1 = (uint32_t)p1;
		c2 = n2;
		c3 = (uint32_t)p0;
		k0 += DG_PHILOX_W0;
		k1 += DG_PHILOX_W1;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

/* Block `block` of attempt `attempt` of the stream (key, step). The 128-bit
 * counter is (block low 32 bits, block bits 32..47 | attempt << 16, step low,
 * step high): tensors hold at most 2^48 elements, so block indices fit 48 bits
 * and the top 16 bits number the re-draws of TruncatedNormal (0 for everything
 * else). */
DG_PHILOX_FN void dg_philox_block(const uint32_t key[2], uint32_t step_lo, uint32_t step_hi,
				  uint64_t block, uint32_t attempt, uint32_t w[4])
{
	uint32_t ctr[4] = {
		(uint32_t)block, (uint32_t)(block >> 32) | attempt << 16, step_lo, step_hi,
	};

	dg_philox4x32_10(ctr, key, w);
}

/* Uniform [0,1) from the top 24 bits of one word (every float32 value k/2^24
 * exactly), or from the top 53 bits of two words (float64). */
DG_PHILOX_FN float dg_philox_u24(uint32_t w)
{
	return (float)(w >> 8) * 0x1p-24f;
}

DG_PHILOX_FN double dg_philox_u53(uint32_t hi, uint32_t lo)
{
	return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

/* Box-Muller: two uniforms in [0,1) to two independent standard normals.
 * 1 - u1 lies in (0, 1], so the log is finite. Computed in double for both
 * dtypes so a float32 result is the correctly rounded double one. On the GPU
 * the double log/sqrt/sin/cos are CUDA's, which may differ from glibc's by an
 * ulp. */
DG_PHILOX_FN void dg_box_muller(double u1, double u2, double *z0, double *z1)
{
	double r = sqrt(-2.0 * log(1.0 - u1)), th = 2.0 * M_PI * u2;

	*z0 = r * cos(th);
	*z1 = r * sin(th);
}

#endif
