/* The one data-movement kernel of the array ops: a strided N-d copy. dispatch.c
 * expresses Slice (a window of the input), Transpose (permuted strides), Concat
 * (each input into its window of the output) and broadcasts as a walk with a
 * destination and a source stride per dim; Reshape is a plain device copy. */
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
