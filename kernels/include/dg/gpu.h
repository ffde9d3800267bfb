/* What GPUs this process can use. Built from kernels/cuda/cuda_device.c when
 * dg is configured with CUDA, else from kernels/gpu_none.c; callers never
 * include a CUDA header. A CUDA build runs on machines without a GPU or
 * driver: the count is then 0 and dg_gpu_describe says why. */
#ifndef DG_GPU_H
#define DG_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "dg/status.h"

struct dg_gpu_info {
	int index;
	char name[128];
	size_t mem_bytes;       /* total device memory, bytes */
	int cc_major;           /* compute capability */
	int cc_minor;
};

/* true when dg was built with CUDA kernels. */
bool dg_gpu_built(void);
/* Number of usable GPUs (0 when none, no driver, or no CUDA build). Probes
 * once; thread-safe. */
int dg_gpu_count(void);
/* Properties of GPU i (0 <= i < dg_gpu_count()); DG_ENOTFOUND otherwise. */
enum dg_status dg_gpu_get_info(int i, struct dg_gpu_info *out, struct dg_err *err);
/* One line for `dg --version` and health, e.g. "CUDA 13.0: 1 GPU: NVIDIA H200
 * (139.8 GiB, cc 9.0)" or "CUDA 13.0 runtime: no GPU (no CUDA-capable device
 * is detected)" or "CUDA: not built". Static storage. */
const char *dg_gpu_describe(void);

#endif
