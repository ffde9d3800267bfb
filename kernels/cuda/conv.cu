/* Convolution and pooling over NHWC images on the GPU, with the geometry of
 * kernels/cpu/conv.c: im2col, whose patch matrix cuBLAS multiplies by the
 * filter (conv_gemm.c), col2im for the input's gradient, and MaxPool2D and
 * AvgPool2D with their gradients. Every gradient is a gather, one thread per
 * input element summing the entries that read it in the CPU's order (output
 * pixels ascending): no atomics, no zeroing, each element written once. Sums
 * are rounded step by step (no FMA contraction), as the CPU does them. */
#include "cuda_common.cuh"

#include <math.h>

/* Rows of the patch matrix one thread fills in a run: the first row's
 * (image, oy, ox) is divided out, the next ones are stepped to. */
#define IM2COL_RUN 8

__device__ static inline float add_rn(float a, float b)
{
	return __fadd_rn(a, b);
}

__device__ static inline double add_rn(double a, double b)
{
	return __dadd_rn(a, b);
}

__device__ static inline float mul_rn(float a, float b)
{
	return __fmul_rn(a, b);
}

__device__ static inline double mul_rn(double a, double b)
{
	return __dmul_rn(a, b);
}

/* col [rows, K] (K = kh*kw*c) of images i0..: thread x is one column k (a
 * (ky, kx, channel) tap, decoded once), so a warp reads and writes adjacent
 * channels; threads y take runs of IM2COL_RUN rows. */
template <typename T>
__global__ void k_im2col(const T *__restrict__ x, T *__restrict__ col, struct dgc_conv g,
			 int64_t i0, int64_t rows)
{
	int64_t kk = g.kh * g.kw * g.c;
	int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	int64_t step = (int64_t)gridDim.y * blockDim.y * IM2COL_RUN;

	if (k >= kk)
		return;
	int64_t c = k % g.c, q = k / g.c, kx = q % g.kw, ky = q / g.kw;
	/* input row and column of output pixel (oy, ox)'s tap: oy * sh + ry, ox * sw + rx */
	int64_t ry = ky * g.dh - g.pt, rx = kx * g.dw - g.pl;

	for (int64_t r0 = ((int64_t)blockIdx.y * blockDim.y + threadIdx.y) * IM2COL_RUN;
	     r0 < rows; r0 += step) {
		int64_t ox = r0 % g.ow, t = r0 / g.ow, oy = t % g.oh, b = i0 + t / g.oh;
		int64_t end = r0 + IM2COL_RUN < rows ? r0 + IM2COL_RUN : rows;
		for (int64_t r = r0; r < end; r++) {
			int64_t iy = oy * g.sh + ry, ix = ox * g.sw + rx;
			bool in = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
			col[r * kk + k] = in ? x[((b * g.h + iy) * g.w + ix) * g.c + c] : (T)0;
			if (++ox == g.ow) {
				ox = 0;
				if (++oy == g.oh) {
					oy = 0;
					b++;
				}
			}
		}
	}
}

/* A 2-d launch of at most 65535 * 8 blocks (the grid-stride loops cover the
 * rest): gx blocks of 32 along x, and blocks of 8 along y for ny items. */
static dim3 grid_2d(int64_t gx, int64_t ny)
{
	int64_t gy = (ny + 7) / 8, cap = 65535 * 8 / gx;

	if (gy > 65535)
		gy = 65535;
	if (gy > cap)
		gy = cap;
	return dim3((unsigned)gx, (unsigned)(gy < 1 ? 1 : gy), 1);
}

extern "C" cudaError_t dgc_im2col(int dt, const struct dgc_conv *g, const void *x, int64_t i0,
				  int64_t nb, void *col, cudaStream_t s)
{
	int64_t kk = g->kh * g->kw * g->c, rows = nb * g->oh * g->ow;
	dim3 block(32, 8);

	if (kk <= 0 || rows <= 0)
		return cudaSuccess;
	/* kk <= INT_MAX (the glue checks it for cuBLAS): at most 2^26 blocks on x */
	dim3 grid = grid_2d((kk + 31) / 32, (rows + IM2COL_RUN - 1) / IM2COL_RUN);
	if (dt == DGC_F32)
		k_im2col<float><<<grid, block, 0, s>>>((const float *)x, (float *)col, *g, i0,
							rows);
	else if (dt == DGC_F64)
		k_im2col<double><<<grid, block, 0, s>>>((const double *)x, (double *)col, *g, i0,
							 rows);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}

/* The output positions o (ascending) whose window tap t reads input
 * position i along one dim: i = o * s - pad + t * d, 0 <= o < on, 0 <= t < kn.
 * Walked by t descending (o ascending) over the taps that land inside the
 * output, so a window far larger than the image (a pooling's ksize) costs
 * no more than the image. Calls f(o, t) for each. */
template <typename F>
__device__ static inline void taps(int64_t i, int64_t pad, int64_t s, int64_t d, int64_t kn,
				   int64_t on, F f)
{
	int64_t top = i + pad, low = top - (on - 1) * s;   /* o >= 0 and o < on */
	int64_t hi = d == 1 ? top : top / d;
	int64_t lo = low <= 0 ? 0 : d == 1 ? low : (low + d - 1) / d;

	if (hi > kn - 1)
		hi = kn - 1;
	for (int64_t t = hi; t >= lo; t--) {
		int64_t num = top - t * d;       /* in [0, (on - 1) * s] */
		if (s == 1) {
			f(num, t);
		} else if (num % s == 0) {
			f(num / s, t);
		}
	}
}

/* dx of images i0.. (n elements from i0's first) from the patch gradients
 * dcol of the same images: element (b, iy, ix, c) sums dcol[row (b, oy, ox),
 * tap (ky, kx, c)] over the taps that read it, output pixels ascending as in
 * kernels/cpu/conv.c's col2im. */
template <typename T>
__global__ void k_col2im(const T *__restrict__ dcol, T *__restrict__ dx, struct dgc_conv g,
			 int64_t i0, int64_t n)
{
	int64_t kk = g.kh * g.kw * g.c, stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t c = e % g.c, p = e / g.c, ix = p % g.w, t = p / g.w, iy = t % g.h;
		const T *d = dcol + (t / g.h) * g.oh * g.ow * kk + c;
		T acc = 0;
		taps(iy, g.pt, g.sh, g.dh, g.kh, g.oh, [&](int64_t oy, int64_t ky) {
			taps(ix, g.pl, g.sw, g.dw, g.kw, g.ow, [&](int64_t ox, int64_t kx) {
				int64_t row = oy * g.ow + ox, tap = ky * g.kw + kx;
				acc = add_rn(acc, d[row * kk + tap * g.c]);
			});
		});
		dx[i0 * g.h * g.w * g.c + e] = acc;
	}
}

extern "C" cudaError_t dgc_col2im(int dt, const struct dgc_conv *g, const void *dcol,
				  int64_t i0, int64_t nb, void *dx, cudaStream_t s)
{
	int64_t n = nb * g->h * g->w * g->c;

	if (n <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		k_col2im<float><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((const float *)dcol,
								     (float *)dx, *g, i0, n);
	else if (dt == DGC_F64)
		k_col2im<double><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((const double *)dcol,
								      (double *)dx, *g, i0, n);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}

/* --- pooling --------------------------------------------------------------------- */

/* The window of output (oy, ox) clipped to the input: rows [y0, y1), columns
 * [x0, x1) (kernels/cpu/conv.c's window(); never empty for a valid geometry). */
struct window {
	int64_t y0, y1, x0, x1;
};

__device__ static inline struct window window_of(const struct dgc_conv &g, int64_t oy,
						 int64_t ox)
{
	struct window w;

	w.y0 = oy * g.sh - g.pt;
	w.x0 = ox * g.sw - g.pl;
	w.y1 = w.y0 + g.kh < g.h ? w.y0 + g.kh : g.h;
	w.x1 = w.x0 + g.kw < g.w ? w.x0 + g.kw : g.w;
	w.y0 = w.y0 < 0 ? 0 : w.y0;
	w.x0 = w.x0 < 0 ? 0 : w.x0;
	return w;
}

/* One thread per output (b, oy, ox, c): the window's max (NaN wins) or mean,
 * starting from its first position and adding in the CPU's order. */
template <typename T>
__global__ void k_pool(const T *__restrict__ x, T *__restrict__ y, struct dgc_conv g, int max,
		       int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t c = e % g.c, p = e / g.c, ox = p % g.ow, t = p / g.ow, oy = t % g.oh;
		const T *xb = x + (t / g.oh) * g.h * g.w * g.c + c;
		struct window w = window_of(g, oy, ox);
		T v = xb[(w.y0 * g.w + w.x0) * g.c];
		for (int64_t iy = w.y0; iy < w.y1; iy++)
			for (int64_t ix = w.x0; ix < w.x1; ix++) {
				if (iy == w.y0 && ix == w.x0)
					continue;
				T q = xb[(iy * g.w + ix) * g.c];
				if (!max)
					v = add_rn(v, q);
				else if (q > v || isnan(q))
					v = q;
			}
		y[e] = max ? v : v / (T)((w.y1 - w.y0) * (w.x1 - w.x0));
	}
}

extern "C" cudaError_t dgc_pool(int dt, const struct dgc_conv *g, const void *x, void *y,
				int max, cudaStream_t s)
{
	int64_t n = g->n * g->oh * g->ow * g->c;

	if (n <= 0)
		return cudaSuccess;
	if (dt == DGC_F32)
		k_pool<float><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((const float *)x, (float *)y,
								   *g, max, n);
	else if (dt == DGC_F64)
		k_pool<double><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((const double *)x,
								    (double *)y, *g, max, n);
	else
		return cudaErrorInvalidValue;
	return dgc_launched();
}

/* Which input position (iy * w + ix of its image; -1: none) gets output
 * (b, oy, ox, c)'s gradient: the window's first position equal to the
 * forward's output y, as the CPU's vectorised path; where y is NaN or
 * infinite, the CPU's scalar path: the first maximum of x, NaN winning. (The
 * CPU takes the scalar path for a whole window when any channel's y is not
 * finite; with y the forward's output both paths pick the same position.) */
template <typename T>
__global__ void k_max_pool_arg(const T *__restrict__ x, const T *__restrict__ y,
			       int64_t *__restrict__ arg, struct dgc_conv g, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t c = e % g.c, p = e / g.c, ox = p % g.ow, t = p / g.ow, oy = t % g.oh;
		const T *xb = x + (t / g.oh) * g.h * g.w * g.c + c;
		struct window w = window_of(g, oy, ox);
		T want = y[e], best = 0;
		bool finite = isfinite(want);
		int64_t at = -1;
		for (int64_t iy = w.y0; iy < w.y1; iy++)
			for (int64_t ix = w.x0; ix < w.x1; ix++) {
				T q = xb[(iy * g.w + ix) * g.c];
				bool first = at < 0, nan_over = isnan(q) && !isnan(best);
				bool take = finite ? first && q == want
						   : first || q > best || nan_over;
				if (take) {
					at = iy * g.w + ix;
					best = q;
				}
			}
		arg[e] = at;
	}
}

/* dx element (b, iy, ix, c): the sum over the windows holding it (output
 * pixels ascending, the CPU's order) of dy where the window chose it (max,
 * from arg) or dy / the window's size (mean: the CPU's dy * (1 / size)). */
template <typename T>
__global__ void k_pool_grad(int max, const int64_t *__restrict__ arg, const T *__restrict__ dy,
			    T *__restrict__ dx, struct dgc_conv g, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t c = e % g.c, p = e / g.c, ix = p % g.w, t = p / g.w, iy = t % g.h;
		int64_t base = (t / g.h) * g.oh * g.ow * g.c + c, at = iy * g.w + ix;
		T acc = 0;
		taps(iy, g.pt, g.sh, 1, g.kh, g.oh, [&](int64_t oy, int64_t) {
			taps(ix, g.pl, g.sw, 1, g.kw, g.ow, [&](int64_t ox, int64_t) {
				int64_t o = base + (oy * g.ow + ox) * g.c;
				if (max) {
					if (arg[o] == at)
						acc = add_rn(acc, dy[o]);
					return;
				}
				struct window w = window_of(g, oy, ox);
				T inv = (T)1 / (T)((w.y1 - w.y0) * (w.x1 - w.x0));
				acc = add_rn(acc, mul_rn(dy[o], inv));
			});
		});
		dx[e] = acc;
	}
}

extern "C" cudaError_t dgc_pool_grad(int dt, const struct dgc_conv *g, const void *x,
				     const void *y, const void *dy, void *dx, int max,
				     int64_t *arg, cudaStream_t s)
{
	int64_t n_out = g->n * g->oh * g->ow * g->c, n_in = g->n * g->h * g->w * g->c;

	if (n_in <= 0)
		return cudaSuccess;
	if (dt != DGC_F32 && dt != DGC_F64)
		return cudaErrorInvalidValue;
	if (max && n_out > 0) {
		if (dt == DGC_F32)
			k_max_pool_arg<float><<<dgc_blocks(n_out), DGC_BLOCK, 0, s>>>(
				(const float *)x, (const float *)y, arg, *g, n_out);
		else
			k_max_pool_arg<double><<<dgc_blocks(n_out), DGC_BLOCK, 0, s>>>(
				(const double *)x, (const double *)y, arg, *g, n_out);
		cudaError_t e = dgc_launched();
		if (e != cudaSuccess)
			return e;
	}
	if (dt == DGC_F32)
		k_pool_grad<float><<<dgc_blocks(n_in), DGC_BLOCK, 0, s>>>(
			max, arg, (const float *)dy, (float *)dx, *g, n_in);
	else
		k_pool_grad<double><<<dgc_blocks(n_in), DGC_BLOCK, 0, s>>>(
			max, arg, (const double *)dy, (double *)dx, *g, n_in);
	return dgc_launched();
}
