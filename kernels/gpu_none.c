/* The GPU query of a build without CUDA: no GPUs, and a description that says
 * how to get them. kernels/cuda/cuda_device.c replaces this file in CUDA builds. */
#include "dg/gpu.h"

bool dg_gpu_built(void)
{
	return false;
}

int dg_gpu_count(void)
{
	return 0;
}

enum dg_status dg_gpu_get_info(int i, struct dg_gpu_info *out, struct dg_err *err)
{
	(void)out;
	return dg_err_set(err, DG_ENOTFOUND, "no GPU %d: dg was built without CUDA", i);
}

const char *dg_gpu_describe(void)
{
	return "CUDA: not built (configure with -Dcuda=enabled and the CUDA toolkit)";
}
