/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
 * SC 2011; the generator of TensorFlow and cuRAND), the counter layout of the
 * random ops, the conversions of its words to uniforms and normals, the
 * scaling of each element, TruncatedNormal's re-draw rule and GlorotUniform's
 * limit. One definition, included by kernels/cpu/random.c and
 * kernels/cuda/random.cu (the limit also by kernels/cuda/dispatch.c), so the
 * CPU and GPU streams cannot drift apart. Every function is static inline
 * and, under nvcc, __host__ __device__; in device code the scaling uses
 * CUDA's round-to-nearest intrinsics so nvcc cannot fuse it into an fma that
 * the CPU does not do (ISO C, -std=c11: gcc does not contract either). */
#ifndef DG_KERNELS_PHILOX_H
#define DG_KERNELS_PHILOX_H

#include <math.h>
#include <stdbool.h>
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

/* ---- one element of each distribution ---- */

/* Uniform float32 in [lo, hi) from one word: lo + u * span in float
 * arithmetic (span = hi - lo); rounding that lands on hi is pulled back below
 * it, keeping the interval half-open. */
DG_PHILOX_FN float dg_rand_uniform_f32(uint32_t w, float lo, float hi, float span)
{
#ifdef __CUDA_ARCH__
	float v = __fadd_rn(lo, __fmul_rn(dg_philox_u24(w), span));
#else
	float v = lo + dg_philox_u24(w) * span;
#endif
	return v < hi ? v : nextafterf(hi, lo);
}

/* Uniform float64 in [a, b) from two words (53 bits). */
DG_PHILOX_FN double dg_rand_uniform_f64(uint32_t w_hi, uint32_t w_lo, double a, double b)
{
#ifdef __CUDA_ARCH__
	double v = __dadd_rn(a, __dmul_rn(dg_philox_u53(w_hi, w_lo), b - a));
#else
	double v = a + dg_philox_u53(w_hi, w_lo) * (b - a);
#endif
	return v < b ? v : nextafter(b, a);
}

/* Integer in [lo, lo + span): 64 random bits modulo the span (computed
 * unsigned, so spans up to 2^64 - 1 work); the modulo bias is below
 * span / 2^64. */
DG_PHILOX_FN int64_t dg_rand_uniform_int(uint32_t w_hi, uint32_t w_lo, int64_t lo, uint64_t span)
{
	uint64_t bits = (uint64_t)w_hi << 32 | w_lo;

	return (int64_t)((uint64_t)lo + bits % span);
}

/* mean + sd * z, in the output's arithmetic. */
DG_PHILOX_FN float dg_rand_scale_f32(double mean, double sd, double z)
{
#ifdef __CUDA_ARCH__
	return __fadd_rn((float)mean, __fmul_rn((float)sd, (float)z));
#else
	return (float)mean + (float)sd * (float)z;
#endif
}

DG_PHILOX_FN double dg_rand_scale_f64(double mean, double sd, double z)
{
#ifdef __CUDA_ARCH__
	return __dadd_rn(mean, __dmul_rn(sd, z));
#else
	return mean + sd * z;
#endif
}

/* ---- normals, one Philox block at a time ---- */

/* The standard normals of one block's words: 4 (from 24-bit uniforms) for
 * float32, 2 (from 53-bit uniforms) for float64. Returns how many. */
DG_PHILOX_FN int dg_rand_normals(const uint32_t w[4], bool f64, double z[4])
{
	if (f64) {
		dg_box_muller(dg_philox_u53(w[0], w[1]), dg_philox_u53(w[2], w[3]), &z[0], &z[1]);
		return 2;
	}
	dg_box_muller(dg_philox_u24(w[0]), dg_philox_u24(w[1]), &z[0], &z[1]);
	dg_box_muller(dg_philox_u24(w[2]), dg_philox_u24(w[3]), &z[2], &z[3]);
	return 4;
}

/* The normals of block `block` of the stream (key, step): z gets 4 (float32)
 * or 2 (float64) values; returns that count. When truncated, element j whose
 * z lies beyond 2 is re-drawn from element j of the block's next attempt
 * (TensorFlow's rule, made counter-based); if 65535 attempts all fail
 * (probability 0.0455^65535) it returns -1, z then holding what it had. */
DG_PHILOX_FN int dg_rand_normal_block(const uint32_t key[2], uint32_t step_lo, uint32_t step_hi,
				      uint64_t block, bool f64, bool truncated, double z[4])
{
	uint32_t w[4];
	double zt[4];
	int m, left = 0;

	dg_philox_block(key, step_lo, step_hi, block, 0, w);
	m = dg_rand_normals(w, f64, z);
	for (int j = 0; truncated && j < m; j++)
		left += fabs(z[j]) > 2.0;
	for (uint32_t att = 1; left > 0; att++) {
		if (att > 0xffff)
			return -1;
		dg_philox_block(key, step_lo, step_hi, block, att, w);
		dg_rand_normals(w, f64, zt);
		for (int j = 0; j < m; j++) {
			if (fabs(z[j]) > 2.0 && fabs(zt[j]) <= 2.0) {
				z[j] = zt[j];
				left--;
			}
		}
	}
	return m;
}

/* ---- GlorotUniform ---- */

/* The Glorot/Xavier limit sqrt(6 / (fan_in + fan_out)) of a weight shape: a
 * vector is its own fan in and out; [.., in, out] multiplies both by the
 * receptive field (the product of the leading dims); a scalar has fans 1. Zero
 * fans mean zero elements: nothing is drawn, the limit (0) is moot. */
DG_PHILOX_FN double dg_glorot_limit(const int64_t *dim, int ndim)
{
	double fan_in = 1, fan_out = 1, receptive = 1;

	if (ndim == 1) {
		fan_in = fan_out = (double)dim[0];
	} else if (ndim >= 2) {
		for (int k = 0; k < ndim - 2; k++)
			receptive *= (double)dim[k];
		fan_in = (double)dim[ndim - 2] * receptive;
		fan_out = (double)dim[ndim - 1] * receptive;
	}
	return fan_in + fan_out > 0 ? sqrt(6.0 / (fan_in + fan_out)) : 0.0;
}

#endif
