/* Device helpers shared by the .cu files of kernels/cuda: launch geometry and
 * the N-d index walk of struct dgc_walk. Kernels are grid-stride loops over
 * int64 indices, so any element count works with a bounded grid (the flat
 * elementwise kernels, which move 16-byte vectors, finish the n % V tail one
 * element per thread). */
#ifndef DG_CUDA_COMMON_CUH
#define DG_CUDA_COMMON_CUH

#include <stdint.h>

#include <cuda_runtime.h>

#include "cuda_launch.h"

#define DGC_BLOCK 256

/* Blocks for n elements: enough to fill the GPU several times over, never more
 * than the 1-d grid limit of every architecture we build for. */
static inline unsigned dgc_blocks(int64_t n)
{
	int64_t b = (n + DGC_BLOCK - 1) / DGC_BLOCK;

	if (b < 1)
		b = 1;
	return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
}

/* V elements of T moved as one load or store of V * sizeof(T) bytes (a power
 * of two: 16 for the 16 bytes of input DGC_VEC gives a thread). */
template <typename T, int V> struct alignas(V * sizeof(T)) dgc_vec {
	T v[V];
};
#define DGC_VEC(T) (sizeof(T) >= 16 ? 1 : 16 / (int)sizeof(T))

/* Whether the flat kernels may use 16-byte vectors on these operands (the
 * output of a comparison is bool bytes, so 4-byte aligned for a float input:
 * 16 covers every case). cudaMalloc gives 256; views into a tensor may not. */
static inline bool dgc_aligned(const void *a, const void *b, const void *o)
{
	return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)o) & 15) == 0;
}

/* Offset of output element i in operand k of walk w (elements). One dim, the
 * common case after walk_compact, needs no division. */
__device__ static inline int64_t dgc_offset(const struct dgc_walk &w, int k, int64_t i)
{
	int64_t off = 0;

	if (w.nd == 1)
		return i * w.st[k][0];

	for (int d = w.nd - 1; d >= 0; d--) {
		int64_t n = w.dim[d];
		int64_t q = i / n;
		off += (i - q * n) * w.st[k][d];
		i = q;
	}
	return off;
}

/* The last error of a launch (configuration errors show up here; faults inside
 * the kernel show up at the next synchronisation). */
static inline cudaError_t dgc_launched(void)
{
	return cudaGetLastError();
}

#endif
