/* A streaming PUT for the mount's replacing writers (doc/filesystem.md,
 * "Writing"): the request starts at the first write at offset 0 and its body
 * is sent from the handle's staging block as the writes fill it, so the
 * transfer overlaps the writer instead of starting at close. The body has a
 * Content-Length of the tensor's nbytes: the ps replaces the value only once
 * that whole body arrived (an aborted upload changes nothing). The HTTP is
 * core's (dg_var_put_stream, dg/client.h: send(2) straight from the staging
 * block on a connection of its own); this file is the mount's part: the
 * thread that runs it, the hand-over of the block's final prefix, and the
 * rules for a writer that pauses too long or gives up. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "dg/client.h"
#include "dg/clock.h"
#include "dg/log.h"
#include "dg/tensor.h"
#include "fs.h"

struct dgfs_upload {
	pthread_mutex_t lock;
	pthread_cond_t cond;            /* avail grew, the writer gave up, or the transfer ended */
	pthread_t th;
	int stop_fd;                    /* an eventfd: readable once aborted */
	struct dgfs *fs;
	int task;
	struct dg_client *c;            /* owned (from the pool) while the upload lives */
	char *name;                     /* owned */
	enum dg_dtype dtype;
	struct dg_shape shape;
	uint64_t if_match;
	const char *data;               /* borrowed: the writer's staging block */
	uint64_t nbytes;
	uint64_t avail;                 /* bytes [0, avail) of data are final */
	bool aborted;                   /* the writer gave up: abort the transfer */
	bool done;                      /* the thread finished */
	bool started;                   /* the thread was created */
	bool stalled;                   /* the writer paused too long */
	long low_speed_s;               /* no byte moved for this long: give up */
	/* the outcome */
	enum dg_status st;
	struct dg_var_put_end end;
	struct dg_err err;
};

/* Connecting: an abort stops the wait. */
static bool upload_aborted(void *ud)
{
	struct dgfs_upload *u = ud;

	pthread_mutex_lock(&u->lock);
	bool stop = u->aborted;
	pthread_mutex_unlock(&u->lock);
	return stop;
}

/* The body, as the writer makes it final: core asks once it sent all of
 * [0, sent). Waits while no more is final, but for low_speed_s at most: a
 * writer that pauses that long ends the stream (the commit then sends the
 * staged bytes in one PUT) instead of holding the ps's connection until the
 * ps drops it, which could fail the commit. Returns sent to give up. Bytes
 * below avail are never written again while the upload lives (the writer
 * aborts it first): core sends them without a lock. */
static uint64_t upload_more(void *ud, uint64_t sent)
{
	struct dgfs_upload *u = ud;
	struct timespec deadline =
		dg_deadline_timespec(dg_deadline_in_ms((int64_t)u->low_speed_s * 1000));

	pthread_mutex_lock(&u->lock);
	while (!u->aborted && u->avail <= sent) {
		if (pthread_cond_timedwait(&u->cond, &u->lock, &deadline) == ETIMEDOUT &&
		    u->avail <= sent) {
			u->stalled = true;
			u->aborted = true;
		}
	}
	uint64_t n = u->aborted ? sent : u->avail;
	pthread_mutex_unlock(&u->lock);
	return n;
}

static void *upload_main(void *arg)
{
	struct dgfs_upload *u = arg;
	const struct dg_var_from from = {
		.more = upload_more, .stop = upload_aborted, .stop_fd = u->stop_fd,
	};
	enum dg_status st = dg_var_put_stream(u->c, u->name, u->dtype, &u->shape, u->data,
					      u->nbytes, u->if_match, &from, u, &u->end, &u->err);

	pthread_mutex_lock(&u->lock);
	u->st = st;
	u->done = true;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	return NULL;
}

struct dgfs_upload *dgfs_upload_start(struct dgfs *fs, int task, const char *name,
				      enum dg_dtype dt, const struct dg_shape *shape,
				      const char *data, uint64_t nbytes, uint64_t if_match,
				      struct dg_err *err)
{
	struct dgfs_upload *u = calloc(1, sizeof *u);

	if (!u) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&u->lock, NULL);
	dg_cond_init_mono(&u->cond);            /* upload_more's deadline is monotonic */
	u->fs = fs;
	u->task = task;
	u->dtype = dt;
	u->shape = *shape;
	u->if_match = if_match;
	u->data = data;
	u->nbytes = nbytes;
	u->low_speed_s = fs->timeout_ms > 1000 ? fs->timeout_ms / 1000 : 1;
	u->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (u->stop_fd < 0 || !(u->name = strdup(name))) {
		dg_err_set(err, DG_ENOMEM, "cannot set up the upload of vars/%s: %s", name,
			   strerror(errno));
		dgfs_upload_abort(u);
		return NULL;
	}
	if (!(u->c = dgfs_client_get(fs, task, err))) {
		dgfs_upload_abort(u);
		return NULL;
	}
	if (pthread_create(&u->th, NULL, upload_main, u) != 0) {
		dg_err_set(err, DG_ENOMEM, "cannot start a thread to upload vars/%s", name);
		dgfs_upload_abort(u);
		return NULL;
	}
	u->started = true;
	return u;
}

/* Let the body go up to avail. */
static void set_avail(struct dgfs_upload *u, uint64_t avail)
{
	pthread_mutex_lock(&u->lock);
	if (avail > u->avail && avail <= u->nbytes) {
		u->avail = avail;
		pthread_cond_broadcast(&u->cond);
	}
	pthread_mutex_unlock(&u->lock);
}

void dgfs_upload_avail(struct dgfs_upload *u, uint64_t avail)
{
	/* The last byte goes only at finish: a complete body would make the ps
	 * apply the value before the writer's close (and a rewrite after that
	 * would make a second version). */
	set_avail(u, avail < u->nbytes ? avail : u->nbytes - 1);
}

bool dgfs_upload_covers(struct dgfs_upload *u, uint64_t off)
{
	pthread_mutex_lock(&u->lock);
	bool fed = off < u->avail;
	pthread_mutex_unlock(&u->lock);
	return fed;
}

/* Stop the thread (if it runs) and free everything. */
static void upload_free(struct dgfs_upload *u, bool started)
{
	if (started)
		pthread_join(u->th, NULL);
	/* the stream had a connection of its own: the client is as it was */
	if (u->c)
		dgfs_client_put(u->fs, u->task, u->c, DG_OK);
	if (u->stop_fd >= 0)
		close(u->stop_fd);
	free(u->name);
	pthread_cond_destroy(&u->cond);
	pthread_mutex_destroy(&u->lock);
	free(u);
}

void dgfs_upload_abort(struct dgfs_upload *u)
{
	if (!u)
		return;
	pthread_mutex_lock(&u->lock);
	u->aborted = true;
	/* wake a send(2) or recv(2) that waits on the ps: the ps sees a body
	 * cut short and changes nothing */
	if (u->stop_fd >= 0 && eventfd_write(u->stop_fd, 1) != 0)
		dg_log(DG_LOG_WARN, "fs", "vars/%s: cannot signal the upload's stop: %s", u->name,
		       strerror(errno));
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	upload_free(u, u->started);
}

enum dg_status dgfs_upload_finish(struct dgfs_upload *u, uint64_t *version, bool *retry,
				  struct dg_err *err)
{
	enum dg_status st;

	*retry = false;
	set_avail(u, u->nbytes);
	pthread_mutex_lock(&u->lock);
	while (!u->done)
		pthread_cond_wait(&u->cond, &u->lock);
	pthread_mutex_unlock(&u->lock);
	st = u->st;
	if (st == DG_OK) {
		*version = u->end.version;
	} else {
		/* the stream broke before the body was complete and the ps did
		 * not answer it: the ps changed nothing; the caller sends the
		 * staged bytes again in one PUT */
		*retry = u->end.sent < u->nbytes && u->end.status < 300;
		*err = u->err;
	}
	upload_free(u, true);
	return st;
}
