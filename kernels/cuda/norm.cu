/* FusedBatchNorm and FusedBatchNormGrad on the GPU, over x viewed [m, ch]
 * (channels last), with the arithmetic of kernels/cpu/norm.c: statistics in
 * double, two passes (mean, then the squared deviations), and each output's
 * expression rounded step by step as the CPU's (no FMA contraction). A sum
 * over m is split in `parts` runs of rows, one thread per (run, channel) so a
 * warp reads adjacent channels, and the runs' partial sums are added in order
 * by one thread per channel: the result does not depend on scheduling. */
#include "cuda_common.cuh"

#include <math.h>

/* Runs of rows per sum: enough threads to fill the GPU (parts * ch near 2^17),
 * at least 16 rows a run, at most 4096 runs for the channel's thread to add. */
static void split(int64_t m, int64_t ch, int64_t *parts, int64_t *per)
{
	int64_t p = (m + 15) / 16, cap = 131072 / ch;

	if (p > cap)
		p = cap;
	if (p > 4096)
		p = 4096;
	if (p < 1)
		p = 1;
	*per = (m + p - 1) / p;
	*parts = *per > 0 ? (m + *per - 1) / *per : 1;
}

/* The scratch: partial sums [2][parts][ch], then the per-channel values
 * [4][ch] (mean, variance or 1/sqrt(var + eps), and the two results). */
extern "C" size_t dgc_bn_scratch(int64_t m, int64_t ch)
{
	int64_t parts, per;

	if (ch <= 0)
		return 0;
	split(m, ch, &parts, &per);
	return (size_t)(2 * parts + 4) * (size_t)ch * sizeof(double);
}

enum { SUM_X, SUM_SQ_DEV, SUM_GRAD };

/* part[p][k] (and part[parts + p][k] for SUM_GRAD) = the sum over run p's rows
 * of: x (SUM_X); (x - mean)^2 (SUM_SQ_DEV); dy, and dy * (x - mean) * inv
 * (SUM_GRAD), the CPU's terms. */
template <typename T, int WHAT>
__global__ void k_bn_part(const T *__restrict__ x, const T *__restrict__ dy,
			  const double *__restrict__ mean, const double *__restrict__ inv,
			  double *__restrict__ part, int64_t m, int64_t ch, int64_t parts,
			  int64_t per)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < parts * ch;
	     t += stride) {
		int64_t p = t / ch, k = t - p * ch;
		int64_t r1 = (p + 1) * per < m ? (p + 1) * per : m;
		double a = 0, b = 0;
		for (int64_t r = p * per; r < r1; r++) {
			double v = (double)x[r * ch + k];
			if (WHAT == SUM_X) {
				a = __dadd_rn(a, v);
			} else if (WHAT == SUM_SQ_DEV) {
				double d = __dsub_rn(v, mean[k]);
				a = __dadd_rn(a, __dmul_rn(d, d));
			} else {
				double g = (double)dy[r * ch + k];
				a = __dadd_rn(a, g);
				b = __dadd_rn(b, __dmul_rn(__dmul_rn(g, __dsub_rn(v, mean[k])),
							   inv[k]));
			}
		}
		part[t] = a;
		if (WHAT == SUM_GRAD)
			part[parts * ch + t] = b;
	}
}

/* The runs of column k of part [parts][ch], added in order. */
__device__ static double runs_sum(const double *part, int64_t parts, int64_t ch, int64_t k)
{
	double s = 0;

	for (int64_t p = 0; p < parts; p++)
		s = __dadd_rn(s, part[p * ch + k]);
	return s;
}

/* val[k] = the sum of column k / m (0 when m is 0): the mean or the biased
 * variance. */
__global__ void k_bn_mean(const double *__restrict__ part, double *__restrict__ val, int64_t m,
			  int64_t ch, int64_t parts)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < ch; k += stride)
		val[k] = m ? runs_sum(part, parts, ch, k) / (double)m : 0;
}

/* The forward's per-channel values: the statistics (x's own in mean and var,
 * or the inputs), outputs 1 and 2, then y = x * a + b with a = scale /
 * sqrt(var + eps) into var and b = offset - mean * a into mean. */
template <typename T>
__global__ void k_bn_coef(const T *__restrict__ scale, const T *__restrict__ offset,
			  const T *__restrict__ mean_in, const T *__restrict__ var_in,
			  double *__restrict__ mean, double *__restrict__ var,
			  T *__restrict__ mean_out, T *__restrict__ var_out, int64_t m, int64_t ch,
			  double eps)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < ch; k += stride) {
		double mu = mean_in ? (double)mean_in[k] : mean[k];
		double v = var_in ? (double)var_in[k] : var[k];
		mean_out[k] = (T)mu;
		var_out[k] = (T)(!var_in && m > 1 ? __ddiv_rn(__dmul_rn(v, (double)m),
							      (double)(m - 1)) : v);
		double a = __ddiv_rn((double)scale[k], sqrt(__dadd_rn(v, eps)));
		var[k] = a;
		mean[k] = __dsub_rn((double)offset[k], __dmul_rn(mu, a));
	}
}

template <typename T>
__global__ void k_bn_apply(const T *__restrict__ x, const double *__restrict__ a,
			   const double *__restrict__ b, T *__restrict__ y, int64_t n, int64_t ch)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t k = e % ch;
		y[e] = (T)__dadd_rn(__dmul_rn((double)x[e], a[k]), b[k]);
	}
}

/* x's moments into mean and var (two passes, as the CPU's moments()). */
template <typename T>
static void moments(const T *x, double *part, double *mean, double *var, int64_t m, int64_t ch,
		    cudaStream_t s)
{
	int64_t parts, per;

	split(m, ch, &parts, &per);
	k_bn_part<T, SUM_X><<<dgc_blocks(parts * ch), DGC_BLOCK, 0, s>>>(
		x, NULL, NULL, NULL, part, m, ch, parts, per);
	k_bn_mean<<<dgc_blocks(ch), DGC_BLOCK, 0, s>>>(part, mean, m, ch, parts);
	k_bn_part<T, SUM_SQ_DEV><<<dgc_blocks(parts * ch), DGC_BLOCK, 0, s>>>(
		x, NULL, mean, NULL, part, m, ch, parts, per);
	k_bn_mean<<<dgc_blocks(ch), DGC_BLOCK, 0, s>>>(part, var, m, ch, parts);
}

template <typename T>
static cudaError_t bn_t(const T *x, const T *scale, const T *offset, const T *mean_in,
			const T *var_in, T *y, T *mean_out, T *var_out, int64_t m, int64_t ch,
			double eps, double *scratch, cudaStream_t s)
{
	int64_t parts, per;

	split(m, ch, &parts, &per);
	double *part = scratch, *mean = part + 2 * parts * ch, *var = mean + ch;
	if (!mean_in)
		moments(x, part, mean, var, m, ch, s);
	k_bn_coef<T><<<dgc_blocks(ch), DGC_BLOCK, 0, s>>>(scale, offset, mean_in, var_in, mean,
							  var, mean_out, var_out, m, ch, eps);
	if (m > 0)
		k_bn_apply<T><<<dgc_blocks(m * ch), DGC_BLOCK, 0, s>>>(x, var, mean, y, m * ch,
								       ch);
	return dgc_launched();
}

extern "C" cudaError_t dgc_bn(int dt, const void *x, const void *scale, const void *offset,
			      const void *mean_in, const void *var_in, void *y, void *mean_out,
			      void *var_out, int64_t m, int64_t ch, double eps, void *scratch,
			      cudaStream_t s)
{
	if (ch <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		return bn_t<float>((const float *)x, (const float *)scale, (const float *)offset,
				   (const float *)mean_in, (const float *)var_in, (float *)y,
				   (float *)mean_out, (float *)var_out, m, ch, eps,
				   (double *)scratch, s);
	if (dt == DGC_F64)
		return bn_t<double>((const double *)x, (const double *)scale,
				    (const double *)offset, (const double *)mean_in,
				    (const double *)var_in, (double *)y, (double *)mean_out,
				    (double *)var_out, m, ch, eps, (double *)scratch, s);
	return cudaErrorInvalidValue;
}

/* inv[k] = 1 / sqrt(var + eps), with the given statistics copied to mean and
 * var first when there are some. */
template <typename T>
__global__ void k_bn_inv(const T *__restrict__ mean_in, const T *__restrict__ var_in,
			 double *__restrict__ mean, double *__restrict__ inv, int64_t ch,
			 double eps)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < ch; k += stride) {
		double v = var_in ? (double)var_in[k] : inv[k];
		if (mean_in)
			mean[k] = (double)mean_in[k];
		inv[k] = __ddiv_rn(1.0, sqrt(__dadd_rn(v, eps)));
	}
}

/* Outputs 1 and 2 (sums of dy * xhat and dy) from the runs of part. */
template <typename T>
__global__ void k_bn_sums(const double *__restrict__ part, double *__restrict__ sdy,
			  double *__restrict__ sdyx, T *__restrict__ dscale,
			  T *__restrict__ doffset, int64_t ch, int64_t parts)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < ch; k += stride) {
		sdy[k] = runs_sum(part, parts, ch, k);
		sdyx[k] = runs_sum(part + parts * ch, parts, ch, k);
		dscale[k] = (T)sdyx[k];
		doffset[k] = (T)sdy[k];
	}
}

/* dx = s / m * (m dy - sum dy - xhat sum(dy xhat)) in training, s dy with given
 * statistics; s = scale * inv, xhat = (x - mean) * inv (the CPU's order). */
template <typename T>
__global__ void k_bn_dx(const T *__restrict__ dy, const T *__restrict__ x,
			const T *__restrict__ scale, const double *__restrict__ mean,
			const double *__restrict__ inv, const double *__restrict__ sdy,
			const double *__restrict__ sdyx, T *__restrict__ dx, int64_t n, int64_t m,
			int64_t ch, int training)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;
	double dm = (double)m;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t k = e % ch;
		double g = (double)dy[e], s = __dmul_rn((double)scale[k], inv[k]);
		double xhat = __dmul_rn(__dsub_rn((double)x[e], mean[k]), inv[k]);
		double d = __dsub_rn(__dsub_rn(__dmul_rn(dm, g), sdy[k]), __dmul_rn(xhat, sdyx[k]));
		dx[e] = (T)(training ? __dmul_rn(__ddiv_rn(s, dm), d) : __dmul_rn(s, g));
	}
}

template <typename T>
static cudaError_t bn_grad_t(const T *dy, const T *x, const T *scale, const T *mean_in,
			     const T *var_in, T *dx, T *dscale, T *doffset, int64_t m, int64_t ch,
			     double eps, double *scratch, cudaStream_t s)
{
	int64_t parts, per;

	split(m, ch, &parts, &per);
	double *part = scratch, *mean = part + 2 * parts * ch, *inv = mean + ch;
	double *sdy = inv + ch, *sdyx = sdy + ch;
	if (!mean_in)
		moments(x, part, mean, inv, m, ch, s);
	k_bn_inv<T><<<dgc_blocks(ch), DGC_BLOCK, 0, s>>>(mean_in, var_in, mean, inv, ch, eps);
	k_bn_part<T, SUM_GRAD><<<dgc_blocks(parts * ch), DGC_BLOCK, 0, s>>>(
		x, dy, mean, inv, part, m, ch, parts, per);
	k_bn_sums<T><<<dgc_blocks(ch), DGC_BLOCK, 0, s>>>(part, sdy, sdyx, dscale, doffset, ch,
							  parts);
	if (m > 0)
		k_bn_dx<T><<<dgc_blocks(m * ch), DGC_BLOCK, 0, s>>>(
			dy, x, scale, mean, inv, sdy, sdyx, dx, m * ch, m, ch, mean_in == NULL);
	return dgc_launched();
}

extern "C" cudaError_t dgc_bn_grad(int dt, const void *dy, const void *x, const void *scale,
				   const void *mean_in, const void *var_in, void *dx,
				   void *dscale, void *doffset, int64_t m, int64_t ch, double eps,
				   void *scratch, cudaStream_t s)
{
	if (ch <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		return bn_grad_t<float>((const float *)dy, (const float *)x, (const float *)scale,
					(const float *)mean_in, (const float *)var_in, (float *)dx,
					(float *)dscale, (float *)doffset, m, ch, eps,
					(double *)scratch, s);
	if (dt == DGC_F64)
		return bn_grad_t<double>((const double *)dy, (const double *)x,
					 (const double *)scale, (const double *)mean_in,
					 (const double *)var_in, (double *)dx, (double *)dscale,
					 (double *)doffset, m, ch, eps, (double *)scratch, s);
	return cudaErrorInvalidValue;
}
