/* Device helpers shared by the .cu files of kernels/cuda: launch geometry and
 * the N-d index walk of struct dgc_walk. Kernels are grid-stride loops over
 * int64 indices, so any element count works with a bounded grid and odd sizes
 * need no special tail handling. */
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

/* Offset of output element i in operand k of walk w (elements). */
__device__ static inline int64_t dgc_offset(const struct dgc_walk &w, int k, int64_t i)
{
	int64_t off = 0;

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
