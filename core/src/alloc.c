/* The allocator behind every tensor's bytes: 64-byte aligned blocks, and a
 * small cache of large freed blocks. Why a cache: glibc returns blocks above
 * its mmap threshold (at most 32 MiB) to the kernel on free, so a kernel that
 * writes a fresh 64 MiB output every step pays ~16k page faults each time,
 * which costs more than the arithmetic (measured: Add over 2^24 floats ran at
 * 0.2x a plain loop). Graph steps allocate the same sizes again and again, so
 * keeping a bounded number of freed large blocks and handing them back out
 * (best fit within 1/8 of the request) removes the faults, as TensorFlow's and
 * PyTorch's caching allocators do. Blocks from 128 KiB on are cached (glibc's
 * default mmap threshold; below it malloc's heap serves them warm). With the
 * cache from 1 MiB only, a ps that restarted during training (a fresh heap)
 * wrote each copy-on-write apply of a 784 KiB variable into new pages: its CPU
 * per training step went from 0.47 to 0.88 ms (perf: page faults in the
 * apply and its memcpy), and back to 0.45 with 128 KiB. Small blocks go to
 * malloc as usual. Sanitizer builds skip the cache so use-after-free stays
 * detectable. */
#include "dg/tensor.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HDR 64                                  /* block header: keeps alignment */
#define CACHE_MIN ((size_t)128 << 10)           /* bytes; smaller blocks are not cached */
#define HUGE_MIN ((size_t)2 << 20)              /* bytes; ask for transparent huge pages */
#define CACHE_SLOTS 64
#define CACHE_DEFAULT_MB 1024

#if defined(__SANITIZE_ADDRESS__)
#define CACHE_ENABLED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CACHE_ENABLED 0
#endif
#endif
#ifndef CACHE_ENABLED
#define CACHE_ENABLED 1
#endif

struct slot {
	char *base;     /* start of the allocation (header included) */
	size_t size;    /* usable bytes after the header */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct slot cache[CACHE_SLOTS];
static int n_cached;
static size_t cached_bytes;
static size_t cache_limit = SIZE_MAX;   /* SIZE_MAX: not yet read from the environment */

/* DG_TENSOR_CACHE_MB bounds the bytes held for reuse (0 disables). Caller holds lock. */
static size_t limit_locked(void)
{
	if (cache_limit == SIZE_MAX) {
		const char *e = getenv("DG_TENSOR_CACHE_MB");
		char *end;
		unsigned long long mb = e ? strtoull(e, &end, 10) : CACHE_DEFAULT_MB;
		if (e && (*end || end == e))
			mb = CACHE_DEFAULT_MB;
		cache_limit = mb > (SIZE_MAX >> 21) ? SIZE_MAX - 1 : (size_t)mb << 20;
		if (!CACHE_ENABLED)
			cache_limit = 0;
	}
	return cache_limit;
}

/* The cached block that best fits n bytes (size in [n, n + n/8]), removed from
 * the cache; NULL if none. */
static char *take_cached(size_t n)
{
	int best = -1;

	pthread_mutex_lock(&lock);
	for (int i = 0; i < n_cached; i++) {
		size_t s = cache[i].size;
		if (s >= n && s - n <= n / 8 && (best < 0 || s < cache[best].size))
			best = i;
	}
	char *base = NULL;
	if (best >= 0) {
		base = cache[best].base;
		cached_bytes -= cache[best].size;
		cache[best] = cache[--n_cached];
	}
	pthread_mutex_unlock(&lock);
	return base;
}

/* Ask for transparent huge pages over the whole pages inside [p, p + n).
 * madvise wants a page-aligned start, and malloc's blocks never are (their
 * header comes first), so passing the block itself always failed with
 * EINVAL. Advice only: errors are fine. */
static void advise_huge(void *p, size_t n)
{
	long ps = sysconf(_SC_PAGESIZE);
	uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
	uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1);
	uintptr_t end = ((uintptr_t)p + n) & ~(page - 1);

	if (end > start)
		madvise((void *)start, end - start, MADV_HUGEPAGE);
}

void *dg_alloc_aligned(size_t n)
{
	/* aligned_alloc wants a multiple of the alignment; 0 still gets a unique block. */
	size_t rounded = (n + 63) & ~(size_t)63;
	char *base;

	if (rounded < n || rounded > SIZE_MAX - HDR)
		return NULL;
	if (rounded == 0)
		rounded = 64;
	if (rounded >= CACHE_MIN && (base = take_cached(rounded)) != NULL)
		return base + HDR;
	base = aligned_alloc(64, HDR + rounded);
	if (!base)
		return NULL;
	memcpy(base, &rounded, sizeof rounded);
	if (rounded >= HUGE_MIN)
		advise_huge(base, HDR + rounded);
	return base + HDR;
}

void dg_free_aligned(void *p)
{
	char *base;
	size_t size;

	if (!p)
		return;
	base = (char *)p - HDR;
	memcpy(&size, base, sizeof size);
	if (size >= CACHE_MIN) {
		pthread_mutex_lock(&lock);
		size_t limit = limit_locked();
		/* Make room by dropping the oldest entries; a block larger than the whole
		 * budget is simply freed. */
		while (n_cached > 0 && size <= limit &&
		       (n_cached == CACHE_SLOTS || cached_bytes + size > limit)) {
			cached_bytes -= cache[0].size;
			free(cache[0].base);
			memmove(cache, cache + 1, sizeof cache[0] * (size_t)--n_cached);
		}
		if (size <= limit && cached_bytes + size <= limit) {
			cache[n_cached].base = base;
			cache[n_cached].size = size;
			n_cached++;
			cached_bytes += size;
			base = NULL;
		}
		pthread_mutex_unlock(&lock);
	}
	free(base);
}

void dg_alloc_trim(void)
{
	pthread_mutex_lock(&lock);
	for (int i = 0; i < n_cached; i++)
		free(cache[i].base);
	n_cached = 0;
	cached_bytes = 0;
	pthread_mutex_unlock(&lock);
}

size_t dg_alloc_cached_bytes(void)
{
	pthread_mutex_lock(&lock);
	size_t n = cached_bytes;
	pthread_mutex_unlock(&lock);
	return n;
}
