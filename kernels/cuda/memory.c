/* Device and pinned host memory for kernels/cuda: a caching allocator per GPU
 * (size classes, free lists, no cudaMalloc per node per step: cudaMalloc and
 * cudaFree synchronise the device and cost tens of microseconds) and a cache of
 * page-locked host blocks for transfers. Also the error translation of
 * cuda_internal.h. Thread-safe: one mutex per GPU, one for the pinned cache. */
#include "cuda_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dg/gpu.h"
#include "dg/log.h"

#define MAX_DEV 64
#define MIN_CLASS_SHIFT 9       /* 512 B: keeps every block 256-byte aligned and reusable */
#define N_CLASSES 22            /* 512 B .. 1 GiB by powers of two */
#define BIG_ROUND ((size_t)2 << 20)

struct block {
	void *p;
	size_t cap;             /* bytes */
	struct block *next;
};

struct pool {
	pthread_mutex_t mu;
	struct block *free[N_CLASSES + 1];      /* [N_CLASSES]: blocks over 1 GiB, any size */
	size_t cached, used;                    /* bytes */
};

static struct pool pools[MAX_DEV];
static pthread_once_t pools_once = PTHREAD_ONCE_INIT;

static void pools_init(void)
{
	for (int i = 0; i < MAX_DEV; i++)
		pthread_mutex_init(&pools[i].mu, NULL);
}

enum dg_status cuda_fail(struct dg_err *err, cudaError_t e, const char *what)
{
	enum dg_status code = e == cudaErrorMemoryAllocation ? DG_ENOMEM : DG_EDEVICE;

	dg_err_set(err, code, "CUDA %s in %s: %s", cudaGetErrorName(e), what,
		   cudaGetErrorString(e));
	if (code == DG_ENOMEM)
		dg_err_hint(err, "the GPU is out of memory: use smaller batches or place "
			    "some nodes on the CPU");
	cudaGetLastError();
	return code;
}

enum dg_status cublas_fail(struct dg_err *err, cublasStatus_t e, const char *what)
{
	return dg_err_set(err, e == CUBLAS_STATUS_ALLOC_FAILED ? DG_ENOMEM : DG_EDEVICE,
			  "cuBLAS %s in %s: %s", cublasGetStatusName(e), what,
			  cublasGetStatusString(e));
}

enum dg_status cuda_set_device(int device, struct dg_err *err)
{
	if (device < 0 || device >= dg_gpu_count() || device >= MAX_DEV)
		return dg_err_set(err, DG_ENOTFOUND, "no GPU %d: %s", device, dg_gpu_describe());
	return DG_CUDA_CHECK(cudaSetDevice(device), err);
}

/* Size class of n bytes and the capacity it rounds to. */
static int class_of(size_t n, size_t *cap)
{
	size_t c = (size_t)1 << MIN_CLASS_SHIFT;

	for (int k = 0; k < N_CLASSES; k++, c <<= 1) {
		if (n <= c) {
			*cap = c;
			return k;
		}
	}
	*cap = (n + BIG_ROUND - 1) / BIG_ROUND * BIG_ROUND;
	return N_CLASSES;
}

/* Take a cached block of exactly cap bytes from list k, or NULL. */
static void *take(struct pool *pl, int k, size_t cap)
{
	for (struct block **pp = &pl->free[k]; *pp; pp = &(*pp)->next) {
		struct block *b = *pp;
		if (b->cap != cap)
			continue;
		void *p = b->p;
		*pp = b->next;
		free(b);
		pl->cached -= cap;
		return p;
	}
	return NULL;
}

static void trim_locked(struct pool *pl)
{
	for (int k = 0; k <= N_CLASSES; k++) {
		while (pl->free[k]) {
			struct block *b = pl->free[k];
			pl->free[k] = b->next;
			cudaFree(b->p);
			pl->cached -= b->cap;
			free(b);
		}
	}
}

enum dg_status dg_cuda_mem_alloc(int device, size_t n, void **out, size_t *cap,
				 struct dg_err *err)
{
	struct pool *pl;
	enum dg_status st;
	cudaError_t e;
	void *p;
	int k;

	*out = NULL;
	*cap = 0;
	if (n == 0)
		return DG_OK;
	st = cuda_set_device(device, err);
	if (st != DG_OK)
		return st;
	pthread_once(&pools_once, pools_init);
	pl = &pools[device];
	k = class_of(n, cap);
	pthread_mutex_lock(&pl->mu);
	p = take(pl, k, *cap);
	if (!p) {
		e = cudaMalloc(&p, *cap);
		if (e == cudaErrorMemoryAllocation) {
			/* Cached blocks of other sizes may be what fills the GPU. */
			cudaGetLastError();
			trim_locked(pl);
			e = cudaMalloc(&p, *cap);
		}
		if (e != cudaSuccess) {
			pthread_mutex_unlock(&pl->mu);
			*cap = 0;
			st = cuda_fail(err, e, "cudaMalloc");
			dg_err_prefix(err, "allocating %zu bytes on GPU %d", n, device);
			return st;
		}
	}
	pl->used += *cap;
	pthread_mutex_unlock(&pl->mu);
	*out = p;
	return DG_OK;
}

void dg_cuda_mem_release(int device, void *p, size_t cap)
{
	struct pool *pl;
	struct block *b;
	size_t c;

	if (!p || device < 0 || device >= MAX_DEV)
		return;
	pthread_once(&pools_once, pools_init);
	pl = &pools[device];
	b = malloc(sizeof *b);
	pthread_mutex_lock(&pl->mu);
	pl->used -= cap;
	if (!b) {
		cudaFree(p);   /* no memory for the list node: give the block back instead */
	} else {
		int k = class_of(cap, &c);
		b->p = p;
		b->cap = cap;
		b->next = pl->free[k];
		pl->free[k] = b;
		pl->cached += cap;
	}
	pthread_mutex_unlock(&pl->mu);
}

void dg_cuda_mem_trim(int device)
{
	pthread_once(&pools_once, pools_init);
	for (int d = 0; d < MAX_DEV && d < dg_gpu_count(); d++) {
		if (device >= 0 && d != device)
			continue;
		if (cudaSetDevice(d) != cudaSuccess) {
			cudaGetLastError();
			continue;
		}
		pthread_mutex_lock(&pools[d].mu);
		trim_locked(&pools[d]);
		pthread_mutex_unlock(&pools[d].mu);
	}
}

size_t dg_cuda_mem_cached_bytes(int device)
{
	size_t n;

	if (device < 0 || device >= MAX_DEV)
		return 0;
	pthread_once(&pools_once, pools_init);
	pthread_mutex_lock(&pools[device].mu);
	n = pools[device].cached;
	pthread_mutex_unlock(&pools[device].mu);
	return n;
}

size_t dg_cuda_mem_used_bytes(int device)
{
	size_t n;

	if (device < 0 || device >= MAX_DEV)
		return 0;
	pthread_once(&pools_once, pools_init);
	pthread_mutex_lock(&pools[device].mu);
	n = pools[device].used;
	pthread_mutex_unlock(&pools[device].mu);
	return n;
}

/* --- pinned host memory ------------------------------------------------------ */

/* Live and free pinned blocks; few (one or two staging buffers per stream), so
 * lists are searched linearly. */
static pthread_mutex_t pin_mu = PTHREAD_MUTEX_INITIALIZER;
static struct block *pin_free, *pin_live;

void *dg_cuda_host_alloc(size_t n, struct dg_err *err)
{
	struct block *b = NULL;
	size_t cap;
	cudaError_t e;

	class_of(n ? n : 1, &cap);
	pthread_mutex_lock(&pin_mu);
	for (struct block **pp = &pin_free; *pp; pp = &(*pp)->next) {
		if ((*pp)->cap == cap) {
			b = *pp;
			*pp = b->next;
			break;
		}
	}
	if (!b) {
		b = malloc(sizeof *b);
		if (!b) {
			pthread_mutex_unlock(&pin_mu);
			dg_err_set(err, DG_ENOMEM, "no memory for a pinned block record");
			return NULL;
		}
		b->cap = cap;
		e = cudaHostAlloc(&b->p, cap, cudaHostAllocPortable);
		if (e != cudaSuccess) {
			free(b);
			pthread_mutex_unlock(&pin_mu);
			cuda_fail(err, e, "cudaHostAlloc");
			dg_err_prefix(err, "pinning %zu host bytes", cap);
			return NULL;
		}
	}
	b->next = pin_live;
	pin_live = b;
	pthread_mutex_unlock(&pin_mu);
	return b->p;
}

void dg_cuda_host_free(void *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&pin_mu);
	for (struct block **pp = &pin_live; *pp; pp = &(*pp)->next) {
		struct block *b = *pp;
		if (b->p != p)
			continue;
		*pp = b->next;
		b->next = pin_free;
		pin_free = b;
		break;
	}
	pthread_mutex_unlock(&pin_mu);
}
