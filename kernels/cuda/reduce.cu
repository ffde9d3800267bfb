/* Reductions on the GPU: Sum, Mean, Max and Min over any set of axes, and
 * ArgMax along one axis. dispatch.c describes the kept and reduced dims as two
 * walks; each output element is reduced by one or more thread blocks (split
 * when there are few outputs, so a full reduction still fills the GPU), and
 * split partials are combined by a second kernel: in order by one thread per
 * output, or for 128 partials or more by a block in a fixed tree (deterministic
 * either way). Float32 sums and
 * means accumulate in double, like the CPU's double lanes (kernels/cpu/reduce.c). */
#include "cuda_common.cuh"

#include <math.h>

#define MAX_SPLIT 1024
#define RED_UNROLL 8
#define JOIN_BLOCK_SPLIT 128   /* partials per output from which a block joins them */

template <typename T> struct R_sum {
	typedef double A;
	__device__ static A init() { return 0.0; }
	__device__ static A load(T v) { return (double)v; }
	__device__ static A join(A a, A b) { return a + b; }
};
/* NaN wins: a NaN accumulator stays (nothing compares greater than it and b
 * is not NaN), a NaN b is taken. */
template <typename T> struct R_max {
	typedef T A;
	__device__ static A init() { return (T)-INFINITY; }
	__device__ static A load(T v) { return v; }
	__device__ static A join(A a, A b) { return (b > a || b != b) ? b : a; }
};
template <typename T> struct R_min {
	typedef T A;
	__device__ static A init() { return (T)INFINITY; }
	__device__ static A load(T v) { return v; }
	__device__ static A join(A a, A b) { return (b < a || b != b) ? b : a; }
};

/* The join of every thread's acc in the block, in a fixed tree order; every
 * thread gets it, and sh may be reused as soon as this returns. */
template <typename R>
__device__ static typename R::A block_join(typename R::A *sh, typename R::A acc)
{
	typename R::A v;

	sh[threadIdx.x] = acc;
	__syncthreads();
	for (int w = DGC_BLOCK / 2; w > 0; w /= 2) {
		if ((int)threadIdx.x < w)
			sh[threadIdx.x] = R::join(sh[threadIdx.x], sh[threadIdx.x + w]);
		__syncthreads();
	}
	v = sh[0];
	__syncthreads();   /* everyone has read sh[0] before sh is written again */
	return v;
}

/* Block b reduces part (b % split) of output b / split. With split == 1 it
 * writes y (divided by count for Mean), else partials part[b]. */
template <typename T, typename R>
__global__ void k_reduce(const T *__restrict__ x, T *__restrict__ y,
			 typename R::A *__restrict__ part, int64_t n_out, int64_t count,
			 int64_t split, struct dgc_walk kept, struct dgc_walk red, int mean)
{
	typedef typename R::A A;
	__shared__ A sh[DGC_BLOCK];
	int64_t chunk = (count + split - 1) / split;

	for (int64_t b = blockIdx.x; b < n_out * split; b += gridDim.x) {
		int64_t o = b / split, sp = b - o * split;
		int64_t r0 = sp * chunk, r1 = r0 + chunk < count ? r0 + chunk : count;
		int64_t base = dgc_offset(kept, 0, o);
		const int64_t bd = blockDim.x;
		int64_t r = r0 + threadIdx.x;
		A acc = R::init();
		/* RED_UNROLL loads issued before their joins, in the same order as
		 * one at a time: a thread keeps that many reads in flight, and a
		 * reduction is limited by reads in flight (bench_cuda on an H200,
		 * Sum all: 0.24 of a copy's bandwidth with one, 0.45 with four). */
		for (; r + (RED_UNROLL - 1) * bd < r1; r += RED_UNROLL * bd) {
			T v[RED_UNROLL];
#pragma unroll
			for (int j = 0; j < RED_UNROLL; j++)
				v[j] = x[base + dgc_offset(red, 0, r + j * bd)];
#pragma unroll
			for (int j = 0; j < RED_UNROLL; j++)
				acc = R::join(acc, R::load(v[j]));
		}
		for (; r < r1; r += bd)
			acc = R::join(acc, R::load(x[base + dgc_offset(red, 0, r)]));
		acc = block_join<R>(sh, acc);
		if (threadIdx.x == 0) {
			if (split == 1)
				y[o] = mean ? (T)(acc / (A)count) : (T)acc;
			else
				part[b] = acc;
		}
	}
}

/* y[o] = join of part[o * split .. + split), one block per output: for long
 * partial lists (a whole-tensor Sum has 1024), where one thread reading them
 * all took longer than the main pass (bench_cuda on an H200, Sum all: 0.48 of
 * a copy's bandwidth with k_reduce_join). */
template <typename T, typename R>
__global__ void k_reduce_join_block(const typename R::A *__restrict__ part, T *__restrict__ y,
				    int64_t n_out, int64_t count, int64_t split, int mean)
{
	typedef typename R::A A;
	__shared__ A sh[DGC_BLOCK];

	for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
		const A *p = part + o * split;
		A acc = R::init();
		for (int64_t k = threadIdx.x; k < split; k += blockDim.x)
			acc = R::join(acc, p[k]);
		acc = block_join<R>(sh, acc);
		if (threadIdx.x == 0)
			y[o] = mean ? (T)(acc / (A)count) : (T)acc;
	}
}

/* y[o] = join of part[o * split .. + split), in order. */
template <typename T, typename R>
__global__ void k_reduce_join(const typename R::A *__restrict__ part, T *__restrict__ y,
			      int64_t n_out, int64_t count, int64_t split, int mean)
{
	typedef typename R::A A;
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < n_out; o += stride) {
		const A *p = part + o * split;
		A acc = R::init();
		int64_t k = 0;
		for (; k + 3 < split; k += 4) {   /* four reads in flight, same order */
			A v0 = p[k], v1 = p[k + 1], v2 = p[k + 2], v3 = p[k + 3];
			acc = R::join(R::join(R::join(R::join(acc, v0), v1), v2), v3);
		}
		for (; k < split; k++)
			acc = R::join(acc, p[k]);
		y[o] = mean ? (T)(acc / (A)count) : (T)acc;
	}
}

/* Column form, for outputs contiguous in x (the kept dims end with stride 1,
 * e.g. Sum over axis 0 of [batch, features]): one thread per output and chunk
 * of the reduced range, so a warp reads 32 neighbouring elements at a time.
 * Block b covers outputs (b % ob) * DGC_BLOCK + tid of chunk b / ob. */
template <typename T, typename R>
__global__ void k_reduce_cols(const T *__restrict__ x, T *__restrict__ y,
			      typename R::A *__restrict__ part, int64_t n_out, int64_t count,
			      int64_t split, struct dgc_walk kept, struct dgc_walk red, int mean)
{
	typedef typename R::A A;
	int64_t ob = (n_out + DGC_BLOCK - 1) / DGC_BLOCK, chunk = (count + split - 1) / split;

	for (int64_t b = blockIdx.x; b < ob * split; b += gridDim.x) {
		int64_t sp = b / ob, o = (b - sp * ob) * DGC_BLOCK + threadIdx.x;
		int64_t r0 = sp * chunk, r1 = r0 + chunk < count ? r0 + chunk : count;
		if (o >= n_out)
			continue;
		int64_t base = dgc_offset(kept, 0, o);
		A acc = R::init();
		/* One read at a time: unrolling four here measured slower (0.77 ->
		 * 0.63 of a copy), the many threads of this form keep enough in
		 * flight. */
		for (int64_t r = r0; r < r1; r++)
			acc = R::join(acc, R::load(x[base + dgc_offset(red, 0, r)]));
		if (split == 1)
			y[o] = mean ? (T)(acc / (A)count) : (T)acc;
		else
			part[o * split + sp] = acc;
	}
}

/* Chunks per output in the column form: about 2^19 threads in all, each with
 * at least 16 elements. */
static int64_t split_cols(int64_t n_out, int64_t count)
{
	int64_t want = ((int64_t)1 << 19) / n_out, most = (count + 15) / 16;

	if (want > most)
		want = most;
	if (want > MAX_SPLIT)
		want = MAX_SPLIT;
	return want < 1 ? 1 : want;
}

/* Blocks per output: enough that about 2048 blocks run in all, each with at
 * least 4 elements per thread; 1 when the outputs alone fill the GPU. */
static int64_t split_for(int64_t n_out, int64_t count)
{
	int64_t want, most;

	if (n_out >= 2048)
		return 1;
	want = (2048 + n_out - 1) / n_out;
	most = (count + DGC_BLOCK * 4 - 1) / (DGC_BLOCK * 4);
	if (want > most)
		want = most;
	if (want > MAX_SPLIT)
		want = MAX_SPLIT;
	return want < 1 ? 1 : want;
}

extern "C" size_t dgc_reduce_scratch(int64_t n_out, int64_t count, int cols)
{
	int64_t split = cols ? split_cols(n_out, count) : split_for(n_out, count);

	return split > 1 ? (size_t)(n_out * split) * sizeof(double) : 0;
}

template <typename T, typename R>
static cudaError_t reduce_t(const void *x, void *y, int64_t n_out, int64_t count,
			    const struct dgc_walk *kept, const struct dgc_walk *red, int cols,
			    void *scratch, int mean, cudaStream_t s)
{
	int64_t split = cols ? split_cols(n_out, count) : split_for(n_out, count);
	int64_t blocks = cols ? (n_out + DGC_BLOCK - 1) / DGC_BLOCK * split : n_out * split;
	unsigned grid = (unsigned)(blocks > 65535 * 8 ? 65535 * 8 : blocks);
	cudaError_t e;

	if (n_out <= 0)
		return cudaSuccess;
	if (split > 1 && !scratch)
		return cudaErrorInvalidValue;
	if (cols)
		k_reduce_cols<T, R><<<grid, DGC_BLOCK, 0, s>>>((const T *)x, (T *)y,
							     (typename R::A *)scratch, n_out,
							     count, split, *kept, *red, mean);
	else
		k_reduce<T, R><<<grid, DGC_BLOCK, 0, s>>>((const T *)x, (T *)y,
							  (typename R::A *)scratch, n_out, count,
							  split, *kept, *red, mean);
	e = dgc_launched();
	if (e != cudaSuccess || split == 1)
		return e;
	if (split >= JOIN_BLOCK_SPLIT)
		k_reduce_join_block<T, R><<<(unsigned)(n_out < 65535 * 8 ? n_out : 65535 * 8),
					    DGC_BLOCK, 0, s>>>((const typename R::A *)scratch,
							       (T *)y, n_out, count, split, mean);
	else
		k_reduce_join<T, R><<<dgc_blocks(n_out), DGC_BLOCK, 0, s>>>(
			(const typename R::A *)scratch, (T *)y, n_out, count, split, mean);
	return dgc_launched();
}

template <typename T>
static cudaError_t reduce_dt(int op, const void *x, void *y, int64_t n_out, int64_t count,
			     const struct dgc_walk *kept, const struct dgc_walk *red, int cols,
			     void *scratch, cudaStream_t s)
{
	switch (op) {
	case DGC_RSUM:
		return reduce_t<T, R_sum<T> >(x, y, n_out, count, kept, red, cols, scratch, 0, s);
	case DGC_RMEAN:
		return reduce_t<T, R_sum<T> >(x, y, n_out, count, kept, red, cols, scratch, 1, s);
	case DGC_RMAX:
		return reduce_t<T, R_max<T> >(x, y, n_out, count, kept, red, cols, scratch, 0, s);
	case DGC_RMIN:
		return reduce_t<T, R_min<T> >(x, y, n_out, count, kept, red, cols, scratch, 0, s);
	default:
		return cudaErrorInvalidValue;
	}
}

extern "C" cudaError_t dgc_reduce(int op, int dt, const void *x, void *y, int64_t n_out,
				  int64_t count, const struct dgc_walk *kept,
				  const struct dgc_walk *red, int cols, void *scratch,
				  cudaStream_t s)
{
	if (count < 1)
		return cudaErrorInvalidValue;
	if (dt == DGC_F32)
		return reduce_dt<float>(op, x, y, n_out, count, kept, red, cols, scratch, s);
	if (dt == DGC_F64)
		return reduce_dt<double>(op, x, y, n_out, count, kept, red, cols, scratch, s);
	return cudaErrorInvalidValue;
}

/* --- ArgMax ------------------------------------------------------------------ */

/* One thread per (outer, inner) pair scans n elements (stride inner): the CPU's
 * rule, first index wins ties, the first NaN wins and ends the scan. */
template <typename T, typename I>
__global__ void k_argmax(const T *__restrict__ x, I *__restrict__ y, int64_t outer, int64_t n,
			 int64_t inner)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * inner;
	     t += stride) {
		int64_t o = t / inner, j = t - o * inner;
		const T *p = x + o * n * inner + j;
		T b = p[0];
		int64_t best = 0;
		for (int64_t r = 1; r < n && b == b; r++) {
			T v = p[r * inner];
			if (v > b || v != v) {
				b = v;
				best = r;
			}
		}
		y[t] = (I)best;
	}
}

template <typename T>
static cudaError_t argmax_t(int ot, const void *x, void *y, int64_t outer, int64_t n,
			    int64_t inner, cudaStream_t s)
{
	int64_t m = outer * inner;

	if (m <= 0)
		return cudaSuccess;
	if (ot == DGC_I32)
		k_argmax<T, int32_t><<<dgc_blocks(m), DGC_BLOCK, 0, s>>>((const T *)x,
									(int32_t *)y, outer, n,
									inner);
	else
		k_argmax<T, int64_t><<<dgc_blocks(m), DGC_BLOCK, 0, s>>>((const T *)x,
									(int64_t *)y, outer, n,
									inner);
	return dgc_launched();
}

extern "C" cudaError_t dgc_argmax(int dt, int ot, const void *x, void *y, int64_t outer,
				  int64_t n, int64_t inner, cudaStream_t s)
{
	if (n < 1)
		return cudaErrorInvalidValue;
	switch (dt) {
	case DGC_F32: return argmax_t<float>(ot, x, y, outer, n, inner, s);
	case DGC_F64: return argmax_t<double>(ot, x, y, outer, n, inner, s);
	case DGC_I32: return argmax_t<int32_t>(ot, x, y, outer, n, inner, s);
	case DGC_I64: return argmax_t<int64_t>(ot, x, y, outer, n, inner, s);
	case DGC_U8: return argmax_t<uint8_t>(ot, x, y, outer, n, inner, s);
	default: return cudaErrorInvalidValue;
	}
}
