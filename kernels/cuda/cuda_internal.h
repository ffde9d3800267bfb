/* What the C files of kernels/cuda share: the stream object behind struct
 * dg_cuda_stream, the DG_CUDA_TRY family that turns cudaError_t and
 * cublasStatus_t into DG_EDEVICE with the driver's own text, and the op
 * families implemented in C (matmul.c, conv_gemm.c). Included only inside
 * kernels/cuda. */
#ifndef DG_CUDA_INTERNAL_H
#define DG_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "dg/cuda.h"

struct dg_cuda_stream {
	int device;
	cudaStream_t s;
	cublasHandle_t blas;
	unsigned long long *flag;       /* device word for data-dependent errors */
	size_t flag_cap;                /* its allocator block, bytes */
	unsigned long long *flag_host;  /* pinned copy of it */
	void *scratch;                  /* per-stream work memory (reductions, scalars) */
	size_t scratch_cap;             /* its allocator block, bytes */
};

/* DG_EDEVICE naming the failed call and the runtime's text; clears the
 * runtime's last error so the next call starts clean. Returns DG_EDEVICE (DG_ENOMEM for
 * cudaErrorMemoryAllocation). */
enum dg_status cuda_fail(struct dg_err *err, cudaError_t e, const char *what);
enum dg_status cublas_fail(struct dg_err *err, cublasStatus_t e, const char *what);

static inline enum dg_status dg_cuda_check(cudaError_t e, struct dg_err *err, const char *what)
{
	return e == cudaSuccess ? DG_OK : cuda_fail(err, e, what);
}

static inline enum dg_status dg_cublas_check(cublasStatus_t e, struct dg_err *err,
					     const char *what)
{
	return e == CUBLAS_STATUS_SUCCESS ? DG_OK : cublas_fail(err, e, what);
}

/* st = DG_OK or the failure of call, for single-exit functions. */
#define DG_CUDA_CHECK(call, err) dg_cuda_check((call), (err), #call)
#define DG_CUBLAS_CHECK(call, err) dg_cublas_check((call), (err), #call)
/* Return from the enclosing function on failure (only where nothing needs freeing). */
#define DG_CUDA_TRY(call, err)                                                              \
	do {                                                                                \
		enum dg_status st_ = DG_CUDA_CHECK(call, err);                              \
		if (st_ != DG_OK)                                                           \
			return st_;                                                         \
	} while (0)

/* Make device current for the calling thread (the runtime's per-thread state). */
enum dg_status cuda_set_device(int device, struct dg_err *err);

/* At least n bytes of s's own work memory in *p (dispatch.c): valid for work
 * queued on s until the next call, which may sync s to grow it. */
enum dg_status cuda_stream_scratch(struct dg_cuda_stream *s, size_t n, void **p,
				   struct dg_err *err);

/* MatMul (bmm false) and BatchMatMul (bmm true) through cuBLAS: in[0], in[1]
 * on s's GPU, out allocated by the caller with the inferred shape. */
enum dg_status cuda_matmul(struct dg_cuda_stream *s, bool bmm, struct dg_attrs attrs,
			   const struct dg_cuda_tensor *x, const struct dg_cuda_tensor *y,
			   struct dg_cuda_tensor *o, struct dg_err *err);

/* The Conv2D family (conv_gemm.c), by the op's inputs: Conv2D(x, f),
 * Conv2DBackpropInput(x, f, dy) and Conv2DBackpropFilter(x, f, dy) into o,
 * allocated by the caller with the inferred type; dy NULL for the forward. */
enum cuda_conv_kind { CUDA_CONV, CUDA_CONV_DINPUT, CUDA_CONV_DFILTER };
enum dg_status cuda_conv(struct dg_cuda_stream *s, enum cuda_conv_kind kind, struct dg_attrs attrs,
			 const struct dg_cuda_tensor *x, const struct dg_cuda_tensor *f,
			 const struct dg_cuda_tensor *dy, struct dg_cuda_tensor *o,
			 struct dg_err *err);
/* MaxPool2D and AvgPool2D (dy NULL: y = o) and their gradients (dy given; y
 * the forward output for MaxPool2DGrad, NULL for AvgPool2DGrad) into o. */
enum dg_status cuda_pool(struct dg_cuda_stream *s, bool max, struct dg_attrs attrs,
			 const struct dg_cuda_tensor *x, const struct dg_cuda_tensor *y,
			 const struct dg_cuda_tensor *dy, struct dg_cuda_tensor *o,
			 struct dg_err *err);

#endif
