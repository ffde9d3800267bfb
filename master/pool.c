/* A job's runner threads (pool.h): every fragment of a step but the last runs
 * on one of these, kept for the job's life. Creating a thread per step cost
 * ~20k instructions, a tenth of the master's share of a 2-task step
 * (bench/README.md, bench_graph). Slot i belongs to thread i: its go is
 * posted with work, the pool's done is posted back. Neighbours: step.c (its
 * user), job.c (frees it with the job). */
#include "pool.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>

struct slot {
	struct mpool *pool;
	pthread_t th;
	sem_t go;
	void *(*fn)(void *);
	void *arg;                      /* NULL fn: leave */
};

struct mpool {
	pthread_mutex_t use;            /* one mpool_run at a time */
	sem_t done;
	int n;                          /* slots with a thread */
	struct slot **slot;
};

static void wait_sem(sem_t *s)
{
	while (sem_wait(s) != 0)
		;                       /* EINTR */
}

static void *slot_main(void *arg)
{
	struct slot *s = arg;

	for (;;) {
		wait_sem(&s->go);
		if (!s->fn)
			return NULL;
		s->fn(s->arg);
		sem_post(&s->pool->done);
	}
}

struct mpool *mpool_new(void)
{
	struct mpool *p = calloc(1, sizeof *p);

	if (!p)
		return NULL;
	pthread_mutex_init(&p->use, NULL);
	sem_init(&p->done, 0, 0);
	return p;
}

/* At least n threads, or as many as could be made; returns the count. */
static int grow(struct mpool *p, int n)
{
	struct slot **grown;

	if (n <= p->n || !(grown = realloc(p->slot, (size_t)n * sizeof *grown)))
		return p->n;
	p->slot = grown;
	while (p->n < n) {
		struct slot *s = calloc(1, sizeof *s);
		if (!s)
			break;
		s->pool = p;
		sem_init(&s->go, 0, 0);
		if (pthread_create(&s->th, NULL, slot_main, s) != 0) {
			sem_destroy(&s->go);
			free(s);
			break;
		}
		p->slot[p->n++] = s;
	}
	return p->n;
}

void mpool_run(struct mpool *p, void *(*fn)(void *), void *args, size_t size, int n)
{
	char *a = args;
	int on_pool = 0;

	if (p && n > 1) {
		pthread_mutex_lock(&p->use);
		on_pool = grow(p, n - 1);
		on_pool = on_pool < n - 1 ? on_pool : n - 1;
		for (int i = 0; i < on_pool; i++) {
			p->slot[i]->fn = fn;
			p->slot[i]->arg = a + (size_t)i * size;
			sem_post(&p->slot[i]->go);
		}
	}
	for (int i = on_pool; i < n; i++)
		fn(a + (size_t)i * size);
	for (int i = 0; i < on_pool; i++)
		wait_sem(&p->done);
	if (p && n > 1)
		pthread_mutex_unlock(&p->use);
}

void mpool_free(struct mpool *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->n; i++) {
		p->slot[i]->fn = NULL;
		sem_post(&p->slot[i]->go);
		pthread_join(p->slot[i]->th, NULL);
		sem_destroy(&p->slot[i]->go);
		free(p->slot[i]);
	}
	free(p->slot);
	sem_destroy(&p->done);
	pthread_mutex_destroy(&p->use);
	free(p);
}
