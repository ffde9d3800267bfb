/* The CUDA kernels by op name, as kernels/registry.c reads them once when it
 * builds its index, to set each op's .cuda slot: dispatch.c's table in CUDA
 * builds, an empty one (cuda_none.c) otherwise. No CUDA type appears here, so
 * registry.c includes it in every build. */
#ifndef DG_CUDA_KERNELS_H
#define DG_CUDA_KERNELS_H

#include "dg/op.h"

struct dg_cuda_kernel_entry {
	const char *op;                 /* a kernel op's name */
	dg_cuda_kernel_fn run;
};

/* Terminated by { NULL, NULL }. */
extern const struct dg_cuda_kernel_entry dg_cuda_kernels[];

#endif
