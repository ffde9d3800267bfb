/* The data movement of the array ops: a strided N-d copy, and the rows that
 * an index tensor names. dispatch.c expresses Slice (a window of the input),
 * Transpose (permuted strides), Concat (each input into its window of the
 * output) and broadcasts as a walk with a destination and a source stride per
 * dim; Reshape is a plain device copy. Gather copies rows, UnsortedSegmentSum
 * adds rows atomically; both leave index checking to dgc_index_check, whose
 * flag dispatch.c reads to refuse what the CPU refuses. */
#include "cuda_common.cuh"

template <typename T>
__global__ void k_copy(T *__restrict__ dst, const T *__restrict__ src, int64_t n,
		       struct dgc_walk w)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		dst[dgc_offset(w, 0, i)] = src[dgc_offset(w, 1, i)];
}

extern "C" cudaError_t dgc_copy(void *dst, int64_t dst_off, const void *src, int64_t src_off,
				const struct dgc_walk *w, int64_t n, int esz, cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	switch (esz) {
	case 1:
		k_copy<uint8_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(uint8_t *)dst + dst_off, (const uint8_t *)src + src_off, n, *w);
		break;
	case 2:
		k_copy<uint16_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(uint16_t *)dst + dst_off, (const uint16_t *)src + src_off, n, *w);
		break;
	case 4:
		k_copy<uint32_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(uint32_t *)dst + dst_off, (const uint32_t *)src + src_off, n, *w);
		break;
	case 8:
		k_copy<uint64_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(uint64_t *)dst + dst_off, (const uint64_t *)src + src_off, n, *w);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return dgc_launched();
}

/* Every element set to the esz-byte pattern (OnesLike). */
template <typename T> __global__ void k_fill(T *__restrict__ dst, int64_t n, T v)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		dst[i] = v;
}

extern "C" cudaError_t dgc_fill(void *dst, int64_t n, int esz, uint64_t pattern, cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	switch (esz) {
	case 1:
		k_fill<uint8_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((uint8_t *)dst, n,
								    (uint8_t)pattern);
		break;
	case 2:
		k_fill<uint16_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((uint16_t *)dst, n,
								     (uint16_t)pattern);
		break;
	case 4:
		k_fill<uint32_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((uint32_t *)dst, n,
								     (uint32_t)pattern);
		break;
	case 8:
		k_fill<uint64_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((uint64_t *)dst, n, pattern);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return dgc_launched();
}

/* --- rows addressed by indices -------------------------------------------------- */

template <typename I>
__global__ void k_index_check(const I *__restrict__ ix, int64_t n, int64_t limit,
			      unsigned long long *bad)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
		int64_t v = (int64_t)ix[i];
		if (v < 0 || v >= limit)
			atomicMin(bad, (unsigned long long)i);
	}
}

extern "C" cudaError_t dgc_index_check(int idt, const void *ix, int64_t n, int64_t limit,
				       unsigned long long *bad, cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	if (idt == DGC_I32)
		k_index_check<int32_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((const int32_t *)ix, n,
									   limit, bad);
	else
		k_index_check<int64_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((const int64_t *)ix, n,
									   limit, bad);
	return dgc_launched();
}

/* One thread per element of y: consecutive threads copy along a row. */
template <typename T, typename I>
__global__ void k_gather(const T *__restrict__ p, const I *__restrict__ ix, T *__restrict__ y,
			 int64_t n, int64_t inner, int64_t rows)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t i = e / inner, r = (int64_t)ix[i];
		if (r >= 0 && r < rows)
			y[e] = p[r * inner + (e - i * inner)];
	}
}

template <typename T>
static void gather_t(int idt, const void *p, const void *ix, void *y, int64_t n, int64_t inner,
		     int64_t rows, cudaStream_t s)
{
	if (idt == DGC_I32)
		k_gather<T, int32_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(const T *)p, (const int32_t *)ix, (T *)y, n, inner, rows);
	else
		k_gather<T, int64_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(const T *)p, (const int64_t *)ix, (T *)y, n, inner, rows);
}

extern "C" cudaError_t dgc_gather(int idt, const void *p, const void *ix, void *y, int64_t n_ix,
				  int64_t inner, int64_t rows, int esz, cudaStream_t s)
{
	int64_t n = n_ix * inner;

	if (n <= 0)
		return cudaSuccess;
	switch (esz) {
	case 1: gather_t<uint8_t>(idt, p, ix, y, n, inner, rows, s); break;
	case 2: gather_t<uint16_t>(idt, p, ix, y, n, inner, rows, s); break;
	case 4: gather_t<uint32_t>(idt, p, ix, y, n, inner, rows, s); break;
	case 8: gather_t<uint64_t>(idt, p, ix, y, n, inner, rows, s); break;
	default: return cudaErrorInvalidValue;
	}
	return dgc_launched();
}

/* The atomic add of each dtype: the integers as unsigned, so they wrap as
 * the CPU's sums do. */
__device__ static inline void add_to(float *d, float v)
{
	atomicAdd(d, v);
}

__device__ static inline void add_to(double *d, double v)
{
	atomicAdd(d, v);
}

__device__ static inline void add_to(int32_t *d, int32_t v)
{
	atomicAdd((unsigned int *)d, (unsigned int)v);
}

__device__ static inline void add_to(int64_t *d, int64_t v)
{
	atomicAdd((unsigned long long *)d, (unsigned long long)v);
}

template <typename T, typename I>
__global__ void k_segment_sum(const T *__restrict__ x, const I *__restrict__ ids, T *y,
			      int64_t n, int64_t inner, int64_t num)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
		int64_t i = e / inner, r = (int64_t)ids[i];
		if (r >= 0 && r < num)
			add_to(&y[r * inner + (e - i * inner)], x[e]);
	}
}

template <typename T>
static void segment_sum_t(int idt, const void *x, const void *ids, void *y, int64_t n,
			  int64_t inner, int64_t num, cudaStream_t s)
{
	if (idt == DGC_I32)
		k_segment_sum<T, int32_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(const T *)x, (const int32_t *)ids, (T *)y, n, inner, num);
	else
		k_segment_sum<T, int64_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(const T *)x, (const int64_t *)ids, (T *)y, n, inner, num);
}

extern "C" cudaError_t dgc_segment_sum(int dt, int idt, const void *x, const void *ids, void *y,
				       int64_t n_ids, int64_t inner, int64_t num, cudaStream_t s)
{
	int64_t n = n_ids * inner;

	if (n <= 0)
		return cudaSuccess;
	switch (dt) {
	case DGC_F32: segment_sum_t<float>(idt, x, ids, y, n, inner, num, s); break;
	case DGC_F64: segment_sum_t<double>(idt, x, ids, y, n, inner, num, s); break;
	case DGC_I32: segment_sum_t<int32_t>(idt, x, ids, y, n, inner, num, s); break;
	case DGC_I64: segment_sum_t<int64_t>(idt, x, ids, y, n, inner, num, s); break;
	default: return cudaErrorInvalidValue;
	}
	return dgc_launched();
}
