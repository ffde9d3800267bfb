/* Runner threads kept for a job's life (pool.c). Internal to master/. */
#ifndef MASTER_POOL_H
#define MASTER_POOL_H

#include <stddef.h>

struct mpool;

/* An empty pool (threads are made by the first mpool_run that needs them).
 * Owned (mpool_free) or NULL when out of memory. */
struct mpool *mpool_new(void);
/* Run fn on args[0..n) (each `size` bytes) at once and return when all are
 * done: the last on the calling thread, the others on the pool's threads;
 * where threads cannot be made (or p is NULL) those run on the calling
 * thread too, one after the other. One mpool_run at a time per pool (others
 * wait). */
void mpool_run(struct mpool *p, void *(*fn)(void *), void *args, size_t size, int n);
/* Stop the threads (idle: no mpool_run in progress) and free. NULL is fine. */
void mpool_free(struct mpool *p);

#endif
