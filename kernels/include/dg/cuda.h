/* The device-side API of dg's CUDA kernels (kernels/cuda/): device tensors, a
 * caching device allocator, pinned host staging, streams, and dg_cuda_run, which
 * runs one registry op on device tensors. This header includes no CUDA header;
 * in builds without CUDA (kernels/cuda/cuda_none.c) every call fails with
 * DG_EUNSUPPORTED and dg_cuda_available() is false. See doc/cuda.md. */
#ifndef DG_CUDA_H
#define DG_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dg/op.h"
#include "dg/tensor.h"

/* true when dg was built with CUDA and at least one GPU is usable. Probes once
 * (dg_gpu_count); thread-safe. */
bool dg_cuda_available(void);

/* Load cuBLAS now (it is opened at its first use, not at process start: see
 * kernels/cuda/cublas_load.c). DG_OK when it loaded with every function dg
 * calls, GPU or not; DG_EDEVICE saying why not; DG_EUNSUPPORTED without CUDA. */
enum dg_status dg_cuda_blas_load(struct dg_err *err);

/* A tensor in device memory: the same metadata as struct dg_tensor, data on GPU
 * `device`. Contents are C-order like host tensors. */
struct dg_cuda_tensor {
	enum dg_dtype dtype;
	struct dg_shape shape;
	int64_t numel;
	size_t nbytes;
	int device;
	void *data;             /* device pointer, owned; NULL when nbytes == 0 */
	size_t cap;             /* bytes of the allocator block behind data */
};

/* A stream on one GPU, with its cuBLAS handle and scratch. Opaque. Work queued
 * on one stream runs in order; a stream is used by one thread at a time. */
struct dg_cuda_stream;

/* Create a stream on GPU device (0 <= device < dg_gpu_count()). Returns DG_OK and
 * an owned stream in *out (free with dg_cuda_stream_free), or DG_EUNSUPPORTED (no
 * CUDA build), DG_ENOTFOUND (no such GPU), DG_EDEVICE (driver text in err). */
enum dg_status dg_cuda_stream_new(int device, struct dg_cuda_stream **out, struct dg_err *err);
/* Waits for queued work, then releases. NULL is fine. */
void dg_cuda_stream_free(struct dg_cuda_stream *s);
/* Block until everything queued on s has finished; DG_EDEVICE on a kernel fault. */
enum dg_status dg_cuda_stream_sync(struct dg_cuda_stream *s, struct dg_err *err);
int dg_cuda_stream_device(const struct dg_cuda_stream *s);

/* A device tensor with uninitialised contents, from the caching allocator of
 * s's GPU. Returns an owned tensor or NULL with *err set (DG_ENOMEM when the GPU
 * is full, after trimming the cache once). */
struct dg_cuda_tensor *dg_cuda_tensor_new(struct dg_cuda_stream *s, enum dg_dtype dt,
					  const struct dg_shape *shape, struct dg_err *err);
/* Return the memory to the allocator's cache. Blocks are reused by later
 * allocations on any stream of the GPU, so the caller frees only after the
 * work reading t was queued on the stream that allocates next, or after a
 * sync (the executor uses one stream per GPU). NULL is fine. */
void dg_cuda_tensor_free(struct dg_cuda_tensor *t);

/* Copy a host tensor to s's GPU through a pinned staging buffer; waits for the
 * copy. Returns an owned device tensor or NULL with *err set. */
struct dg_cuda_tensor *dg_cuda_upload(struct dg_cuda_stream *s, const struct dg_tensor *t,
				      struct dg_err *err);
/* Copy a device tensor back (waits for s first). Returns an owned host tensor
 * or NULL with *err set. */
struct dg_tensor *dg_cuda_download(struct dg_cuda_stream *s, const struct dg_cuda_tensor *t,
				   struct dg_err *err);

/* true when op has a CUDA kernel (for some dtypes; dg_cuda_run answers
 * DG_EDTYPE or DG_EUNSUPPORTED for the rest, and the caller falls back to CPU). */
bool dg_cuda_supports(const struct dg_op_def *op);

/* Run op on device tensors: validates attrs and arity, infers output types with
 * the op's own inference (so CPU and GPU accept the same inputs), allocates
 * out[0..n_out) on s's GPU and queues the kernels on s. Inputs are borrowed and
 * must live on s's GPU; outputs are owned by the caller (on error the
 * function frees what it made and leaves out[] NULL). Ops whose errors depend on
 * the data (Cast of NaN to int, labels out of range) synchronise s to report
 * them. step is the counter of the random ops. Errors are prefixed with the op. */
enum dg_status dg_cuda_run(struct dg_cuda_stream *s, const struct dg_op_def *op,
			   const json_t *attrs, const struct dg_cuda_tensor *const *in, int n_in,
			   struct dg_cuda_tensor **out, int n_out, uint64_t step,
			   struct dg_err *err);
/* The same with the node's attrs view (dg/op.h): the kernel reads the table
 * parsed when the node's fragment was registered (the executor's path). */
enum dg_status dg_cuda_run_attrs(struct dg_cuda_stream *s, const struct dg_op_def *op,
				 struct dg_attrs attrs, const struct dg_cuda_tensor *const *in,
				 int n_in, struct dg_cuda_tensor **out, int n_out, uint64_t step,
				 struct dg_err *err);

/* --- device memory ------------------------------------------------------------
 * The caching allocator: per GPU, freed blocks go to size-class free lists
 * (powers of two from 512 B up to 1 GiB, larger sizes rounded to 2 MiB) and are
 * handed out again without cudaMalloc. Thread-safe. */

/* n bytes on GPU device; *cap receives the block's real size, which must be
 * passed back to dg_cuda_mem_release. n == 0 gives NULL with *cap = 0 and DG_OK. */
enum dg_status dg_cuda_mem_alloc(int device, size_t n, void **out, size_t *cap,
				 struct dg_err *err);
void dg_cuda_mem_release(int device, void *p, size_t cap);
/* Free every cached block of device (all GPUs when device < 0). */
void dg_cuda_mem_trim(int device);
/* Bytes cached (free, kept for reuse) and in use on device. */
size_t dg_cuda_mem_cached_bytes(int device);
size_t dg_cuda_mem_used_bytes(int device);

/* Pinned (page-locked) host memory for transfers, from a cache of its own
 * (cudaHostAlloc is slow). NULL with *err set on failure. Thread-safe. */
void *dg_cuda_host_alloc(size_t n, struct dg_err *err);
void dg_cuda_host_free(void *p);

#endif
