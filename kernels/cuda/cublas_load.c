/* cuBLAS, loaded when the first GPU stream needs it instead of at process
 * start. libcublas's constructors (its kernels registered with the runtime)
 * take about 0.3 s in every process that links it, GPU or not: an empty
 * main() linked with -lcublas ran in 0.32 s, without it in 0.004 s, and every
 * dg command and every restart of a task paid it. cuBLAS offers no lazy
 * loading of its own, so dg links only the CUDA runtime and these are the
 * cuBLAS functions it calls (dispatch.c, matmul.c, memory.c), each resolved
 * once with dlsym from libcublas.so.<CUBLAS_VER_MAJOR>. Their prototypes and
 * the pointers' types come from cublas_v2.h, so a mismatch does not compile.
 * Without the library every call answers CUBLAS_STATUS_NOT_INITIALIZED and
 * cublasGetStatusString says why it could not be loaded. */
#include <dlfcn.h>              /* dladdr: _GNU_SOURCE, set for every file */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

#define STR2(x) #x
#define STR(x) STR2(x)
#define CUBLAS_SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char why[320];           /* why the library is not there; "" when it is */

static struct {
	__typeof__(cublasCreate_v2) *create;
	__typeof__(cublasDestroy_v2) *destroy;
	__typeof__(cublasSetStream_v2) *set_stream;
	__typeof__(cublasSgemm_v2) *sgemm;
	__typeof__(cublasDgemm_v2) *dgemm;
	__typeof__(cublasGemmEx) *gemm_ex;
	__typeof__(cublasSgemmStridedBatched) *sgemm_sb;
	__typeof__(cublasDgemmStridedBatched) *dgemm_sb;
	__typeof__(cublasGemmStridedBatchedEx) *gemm_sb_ex;
	__typeof__(cublasGetStatusName) *status_name;
	__typeof__(cublasGetStatusString) *status_string;
} fn;

static void *sym(void *lib, const char *name, bool *ok)
{
	void *p = dlsym(lib, name);

	if (!p && *ok) {
		snprintf(why, sizeof why, "%s has no %s (another cuBLAS than dg was built "
			 "with?)", CUBLAS_SONAME, name);
		*ok = false;
	}
	return p;
}

/* libcublas by its soname (LD_LIBRARY_PATH, the linker cache), else from the
 * directory the CUDA runtime was loaded from, where the toolkit keeps both. */
static void *open_cublas(void)
{
	void *lib = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
	char first[160], path[512];
	void *addr;
	Dl_info di;

	if (lib)
		return lib;
	snprintf(first, sizeof first, "%s", dlerror());
	/* cudart's own definition (dlsym), not a PLT stub in the executable. */
	addr = dlsym(RTLD_DEFAULT, "cudaGetDeviceCount");
	if (addr && dladdr(addr, &di) && di.dli_fname && strrchr(di.dli_fname, '/')) {
		int dir = (int)(strrchr(di.dli_fname, '/') - di.dli_fname);
		snprintf(path, sizeof path, "%.*s/%s", dir, di.dli_fname, CUBLAS_SONAME);
		if ((lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
			return lib;
	}
	snprintf(why, sizeof why, "cannot load %s: %s", CUBLAS_SONAME, first);
	return NULL;
}

static void load(void)
{
	void *lib = open_cublas();
	bool ok = true;

	if (!lib)
		return;
	/* Casts through void **: ISO C has no conversion from void * to a
	 * function pointer, POSIX guarantees this one works. */
	*(void **)&fn.create = sym(lib, "cublasCreate_v2", &ok);
	*(void **)&fn.destroy = sym(lib, "cublasDestroy_v2", &ok);
	*(void **)&fn.set_stream = sym(lib, "cublasSetStream_v2", &ok);
	*(void **)&fn.sgemm = sym(lib, "cublasSgemm_v2", &ok);
	*(void **)&fn.dgemm = sym(lib, "cublasDgemm_v2", &ok);
	*(void **)&fn.gemm_ex = sym(lib, "cublasGemmEx", &ok);
	*(void **)&fn.sgemm_sb = sym(lib, "cublasSgemmStridedBatched", &ok);
	*(void **)&fn.dgemm_sb = sym(lib, "cublasDgemmStridedBatched", &ok);
	*(void **)&fn.gemm_sb_ex = sym(lib, "cublasGemmStridedBatchedEx", &ok);
	*(void **)&fn.status_name = sym(lib, "cublasGetStatusName", &ok);
	*(void **)&fn.status_string = sym(lib, "cublasGetStatusString", &ok);
	if (!ok) {
		memset(&fn, 0, sizeof fn);
		dlclose(lib);
	}
	/* else: kept open for the process's life, as a linked library would be */
}

static bool loaded(void)
{
	pthread_once(&once, load);
	return fn.create != NULL;
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle)
{
	return loaded() ? fn.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle)
{
	return loaded() ? fn.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
	return loaded() ? fn.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta,
					    cublasOperation_t tb, int m, int n, int k,
					    const float *alpha, const float *a, int lda,
					    const float *b, int ldb, const float *beta, float *c,
					    int ldc)
{
	return loaded() ? fn.sgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
			: CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDgemm_v2(cublasHandle_t h, cublasOperation_t ta,
					    cublasOperation_t tb, int m, int n, int k,
					    const double *alpha, const double *a, int lda,
					    const double *b, int ldb, const double *beta, double *c,
					    int ldc)
{
	return loaded() ? fn.dgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
			: CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t h, cublasOperation_t ta,
					  cublasOperation_t tb, int m, int n, int k,
					  const void *alpha, const void *a, cudaDataType at, int lda,
					  const void *b, cudaDataType bt, int ldb, const void *beta,
					  void *c, cudaDataType ct, int ldc,
					  cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
	return loaded() ? fn.gemm_ex(h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c,
				     ct, ldc, compute, algo)
			: CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
						       cublasOperation_t tb, int m, int n, int k,
						       const float *alpha, const float *a, int lda,
						       long long int sa, const float *b, int ldb,
						       long long int sb, const float *beta,
						       float *c, int ldc, long long int sc,
						       int batch)
{
	return loaded() ? fn.sgemm_sb(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c,
				      ldc, sc, batch)
			: CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
						       cublasOperation_t tb, int m, int n, int k,
						       const double *alpha, const double *a, int lda,
						       long long int sa, const double *b, int ldb,
						       long long int sb, const double *beta,
						       double *c, int ldc, long long int sc,
						       int batch)
{
	return loaded() ? fn.dgemm_sb(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c,
				      ldc, sc, batch)
			: CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
	cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
	const void *alpha, const void *a, cudaDataType at, int lda, long long int sa,
	const void *b, cudaDataType bt, int ldb, long long int sb, const void *beta, void *c,
	cudaDataType ct, int ldc, long long int sc, int batch, cublasComputeType_t compute,
	cublasGemmAlgo_t algo)
{
	return loaded() ? fn.gemm_sb_ex(h, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb,
					beta, c, ct, ldc, sc, batch, compute, algo)
			: CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *CUBLASWINAPI cublasGetStatusName(cublasStatus_t status)
{
	if (loaded())
		return fn.status_name(status);
	return status == CUBLAS_STATUS_NOT_INITIALIZED ? "CUBLAS_STATUS_NOT_INITIALIZED"
						       : "CUBLAS_STATUS_?";
}

const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status)
{
	return loaded() ? fn.status_string(status) : why;
}

enum dg_status dg_cuda_blas_load(struct dg_err *err)
{
	if (loaded())
		return DG_OK;
	return dg_err_set(err, DG_EDEVICE, "%s", why);
}
