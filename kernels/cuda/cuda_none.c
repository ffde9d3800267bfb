/* dg/cuda.h in a build without CUDA: no device is ever available and every call
 * that would touch one says so (DG_EUNSUPPORTED with the build hint), so callers
 * need no #ifdef. kernels/cuda/dispatch.c and memory.c replace this file in
 * CUDA builds. */
#include "dg/cuda.h"

#include "cuda_kernels.h"
#include "dg/gpu.h"

const struct dg_cuda_kernel_entry dg_cuda_kernels[] = { { NULL, NULL } };

static enum dg_status not_built(struct dg_err *err)
{
	dg_err_set(err, DG_EUNSUPPORTED, "%s", dg_gpu_describe());
	dg_err_hint(err, "place nodes on the CPU, or rebuild with -Dcuda=enabled");
	return DG_EUNSUPPORTED;
}

bool dg_cuda_available(void)
{
	return false;
}

enum dg_status dg_cuda_blas_load(struct dg_err *err)
{
	return dg_err_set(err, DG_EUNSUPPORTED, "dg was built without CUDA");
}

enum dg_status dg_cuda_stream_new(int device, struct dg_cuda_stream **out, struct dg_err *err)
{
	(void)device;
	*out = NULL;
	return not_built(err);
}

void dg_cuda_stream_free(struct dg_cuda_stream *s)
{
	(void)s;
}

enum dg_status dg_cuda_stream_sync(struct dg_cuda_stream *s, struct dg_err *err)
{
	(void)s;
	return not_built(err);
}

int dg_cuda_stream_device(const struct dg_cuda_stream *s)
{
	(void)s;
	return -1;
}

struct dg_cuda_tensor *dg_cuda_tensor_new(struct dg_cuda_stream *s, enum dg_dtype dt,
					  const struct dg_shape *shape, struct dg_err *err)
{
	(void)s, (void)dt, (void)shape;
	not_built(err);
	return NULL;
}

void dg_cuda_tensor_free(struct dg_cuda_tensor *t)
{
	(void)t;
}

struct dg_cuda_tensor *dg_cuda_upload(struct dg_cuda_stream *s, const struct dg_tensor *t,
				      struct dg_err *err)
{
	(void)s, (void)t;
	not_built(err);
	return NULL;
}

struct dg_tensor *dg_cuda_download(struct dg_cuda_stream *s, const struct dg_cuda_tensor *t,
				   struct dg_err *err)
{
	(void)s, (void)t;
	not_built(err);
	return NULL;
}

bool dg_cuda_supports(const struct dg_op_def *op)
{
	return op && op->cuda;   /* never set without CUDA */
}

enum dg_status dg_cuda_run(struct dg_cuda_stream *s, const struct dg_op_def *op,
			   const json_t *attrs, const struct dg_cuda_tensor *const *in, int n_in,
			   struct dg_cuda_tensor **out, int n_out, uint64_t step,
			   struct dg_err *err)
{
	(void)s, (void)op, (void)attrs, (void)in, (void)n_in, (void)step;
	for (int i = 0; i < n_out; i++)
		out[i] = NULL;
	return not_built(err);
}

enum dg_status dg_cuda_mem_alloc(int device, size_t n, void **out, size_t *cap,
				 struct dg_err *err)
{
	(void)device, (void)n;
	*out = NULL;
	*cap = 0;
	return not_built(err);
}

void dg_cuda_mem_release(int device, void *p, size_t cap)
{
	(void)device, (void)p, (void)cap;
}

void dg_cuda_mem_trim(int device)
{
	(void)device;
}

size_t dg_cuda_mem_cached_bytes(int device)
{
	(void)device;
	return 0;
}

size_t dg_cuda_mem_used_bytes(int device)
{
	(void)device;
	return 0;
}

void *dg_cuda_host_alloc(size_t n, struct dg_err *err)
{
	(void)n;
	not_built(err);
	return NULL;
}

void dg_cuda_host_free(void *p)
{
	(void)p;
}

enum dg_status dg_cuda_run_attrs(struct dg_cuda_stream *s, const struct dg_op_def *op,
				 struct dg_attrs attrs, const struct dg_cuda_tensor *const *in,
				 int n_in, struct dg_cuda_tensor **out, int n_out, uint64_t step,
				 struct dg_err *err)
{
	return dg_cuda_run(s, op, attrs.json, in, n_in, out, n_out, step, err);
}
