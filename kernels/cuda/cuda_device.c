/* The GPU query of a CUDA build: counts devices and reads their properties
 * through the CUDA runtime. It must not fail on machines without a GPU or
 * driver: every runtime error becomes "no GPU" plus the runtime's own text. */
#include "dg/gpu.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "dg/log.h"

#define MAX_GPUS 64

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int n_gpus;
static struct dg_gpu_info gpus[MAX_GPUS];
static char line[512];

static void probe(void)
{
	int rt = 0, count = 0;
	size_t len;

	cudaRuntimeGetVersion(&rt);
	len = (size_t)snprintf(line, sizeof line, "CUDA %d.%d runtime", rt / 1000, rt % 1000 / 10);
	cudaError_t e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count <= 0) {
		snprintf(line + len, sizeof line - len, ": no GPU (%s)",
			 e != cudaSuccess ? cudaGetErrorString(e) : "no device");
		/* Clear the sticky error so later calls start clean. */
		cudaGetLastError();
		return;
	}
	for (int i = 0; i < count && n_gpus < MAX_GPUS; i++) {
		struct cudaDeviceProp p;
		if (cudaGetDeviceProperties(&p, i) != cudaSuccess)
			continue;
		struct dg_gpu_info *g = &gpus[n_gpus++];
		g->index = i;
		snprintf(g->name, sizeof g->name, "%.127s", p.name);
		g->mem_bytes = p.totalGlobalMem;
		g->cc_major = p.major;
		g->cc_minor = p.minor;
	}
	len += (size_t)snprintf(line + len, sizeof line - len, ": %d GPU%s", n_gpus,
				n_gpus == 1 ? "" : "s");
	for (int i = 0; i < n_gpus && len < sizeof line; i++)
		len += (size_t)snprintf(line + len, sizeof line - len, "%s %s (%.1f GiB, cc %d.%d)",
					i ? ";" : ":", gpus[i].name,
					(double)gpus[i].mem_bytes / (1 << 30), gpus[i].cc_major,
					gpus[i].cc_minor);
	dg_log(DG_LOG_INFO, "cuda", "%s", line);
}

bool dg_gpu_built(void)
{
	return true;
}

int dg_gpu_count(void)
{
	pthread_once(&once, probe);
	return n_gpus;
}

enum dg_status dg_gpu_get_info(int i, struct dg_gpu_info *out, struct dg_err *err)
{
	pthread_once(&once, probe);
	if (i < 0 || i >= n_gpus)
		return dg_err_set(err, DG_ENOTFOUND, "no GPU %d: this machine has %d", i, n_gpus);
	*out = gpus[i];
	return DG_OK;
}

const char *dg_gpu_describe(void)
{
	pthread_once(&once, probe);
	return line;
}
