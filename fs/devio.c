/* The mount's own reads and writes of /dev/fuse (libfuse3's custom io): plain
 * read(2) and writev(2), except that
 * - the reply to the kernel's INIT request also accepts
 *   FUSE_DIRECT_IO_ALLOW_MMAP, which libfuse 3.14 cannot express (its
 *   capability mask is 32 bits): with it a direct-I/O open can still be mapped
 *   MAP_SHARED, so cold reads need not go through the page cache;
 * - a read reply can be written from the handle's bytes (no copy into
 *   libfuse's buffer);
 * - a write's payload can be received straight where the handle stages it
 *   (no copy out of libfuse's buffer; see dgfs_devio_landing in fs.h). The
 *   kernel copies a request into the buffers of one read(2), so the place
 *   must be chosen before the request is seen: it is the place the file's
 *   previous write predicts (sequential writers hit it every time). */
#define FUSE_USE_VERSION 31
#include <errno.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dg/log.h"
#include "fs.h"

/* Linux 6.6 (protocol 7.39) added it as bit 36 (bit 4 of flags2); the uapi
 * header installed here may be older. */
#ifndef FUSE_DIRECT_IO_ALLOW_MMAP
#define FUSE_DIRECT_IO_ALLOW_MMAP (1ULL << 36)
#endif
#define OPCODE_INIT 26          /* FUSE_INIT of enum fuse_opcode */

/* One mount per process: the INIT request seen and what the kernel offered. */
static _Atomic uint64_t init_unique;            /* 0: no INIT seen yet */
static _Atomic bool init_offered;               /* the kernel offered the flag */
static _Atomic bool io_installed;
static _Atomic bool *dio_flag;                  /* the mount's: cleared if no patch went out */

/* The request this thread read last (it handles it, then reads the next). */
static __thread uint64_t cur_unique;

/* Landings (dgfs_devio_landing). A landing is only safe while no other
 * thread can receive a write into the same bytes, so while one may be used
 * (land_mode: from a write that allows one until a request leaves none
 * pending) one thread at a time reads /dev/fuse: the holder of read_tok.
 * Otherwise (most of the time) threads read as libfuse's would, in
 * parallel, without passing a token (a wake-up per request). A landing is
 * used only once no thread is left inside such a plain read (plain_readers)
 * and no write past it was read meanwhile (valid). Only a file written
 * twice in a row gets one: writes that alternate between files would miss
 * every time, and a miss costs a copy back. */
#define WRITE_HDR (sizeof(struct fuse_in_header) + sizeof(struct fuse_write_in))
static const struct dgfs_landing_ops *land_ops;
static _Atomic bool land_off;                   /* a write it could not parse: never again */
static sem_t read_tok;
static _Atomic bool land_mode;
static _Atomic int plain_readers;
static _Atomic uint64_t last_write_fh;          /* of the write read last */
static struct dgfs_landing pending;             /* guarded by read_tok */
static bool pending_set;
static unsigned others;                         /* requests since the last write (read_tok) */
#define LAND_PATIENCE 16                        /* ... after which a landing goes */
/* The write this thread read last, if its payload landed. */
static __thread struct { uint64_t unique; const void *dst; size_t size; } landed;

/* The request just read: remember its id; look into an INIT. */
static void note_request(const char *buf, ssize_t n)
{
	if (n < (ssize_t)sizeof(struct fuse_in_header))
		return;
	const struct fuse_in_header *in = (const void *)buf;
	cur_unique = in->unique;
	if (in->opcode == OPCODE_INIT && (size_t)n >= sizeof *in +
	    offsetof(struct fuse_init_in, flags2) + sizeof(uint32_t)) {
		struct fuse_init_in ii;
		memcpy(&ii, buf + sizeof *in, offsetof(struct fuse_init_in, flags2) + sizeof(uint32_t));
		bool ext = ii.flags & FUSE_INIT_EXT;
		uint64_t flags = ii.flags | (ext ? (uint64_t)ii.flags2 << 32 : 0);
		atomic_store(&init_offered, ext && (flags & FUSE_DIRECT_IO_ALLOW_MMAP));
		atomic_store(&init_unique, in->unique);
	}
}

/* The write request in buf (n bytes read), if it is one. A write of
 * another shape than this code knows (none comes from Linux 6.x) is not
 * seen(), so landings stop for good: one could cover its bytes. */
static bool write_of(const char *buf, ssize_t n, struct fuse_write_in *wi)
{
	const struct fuse_in_header *in = (const void *)buf;

	if (n < (ssize_t)sizeof *in || in->opcode != FUSE_WRITE)
		return false;
	if (n < (ssize_t)WRITE_HDR || in->total_extlen != 0 || in->len != (uint32_t)n) {
		if (!atomic_exchange(&land_off, true))
			dg_log(DG_LOG_WARN, "fs", "a write request of an unknown shape: writes are "
			       "copied from now on");
		atomic_store(&land_mode, false);
		return false;
	}
	memcpy(wi, buf + sizeof *in, sizeof *wi);
	return true;
}

/* The write just read (fh): may it have a landing (its file was also the
 * one written last)? */
static bool write_again(uint64_t fh)
{
	return atomic_exchange(&last_write_fh, fh) == fh && !atomic_load(&land_off);
}

/* Give back landings outside the token, with cancellation off: put() may
 * free a handle (libfuse cancels threads in here only at exit). */
static void put_all(void **objs, int n)
{
	int old;

	if (n == 0)
		return;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
	for (int i = 0; i < n; i++)
		land_ops->put(objs[i]);
	pthread_setcancelstate(old, NULL);
}

/* A read without the token; a write that would allow a landing turns the
 * landings on (the next readers take the token). */
static ssize_t read_plain(int fd, char *buf, size_t len)
{
	ssize_t n = read(fd, buf, len);
	int e = errno;
	struct fuse_write_in wi;
	struct dgfs_landing next;

	note_request(buf, n);
	/* seen() before leaving plain_readers: a landing checked after that
	 * sees this write's end (valid) */
	if (land_ops && write_of(buf, n, &wi)) {
		bool again = write_again(wi.fh);
		if (land_ops->seen(wi.fh, wi.offset, wi.size, &next)) {
			put_all(&next.obj, 1);
			if (again)
				atomic_store(&land_mode, true);
		}
	}
	errno = e;
	return n;
}

/* One read of /dev/fuse by the holder of read_tok: into the pending
 * landing if it may be used (header and write_in into buf, the next bytes
 * at the landing, any more after them in buf). Landings it is done with go
 * to put[] (*n_put of them), for the caller to give back. */
static ssize_t read_landing(int fd, char *buf, size_t len, void **put, int *n_put)
{
	struct dgfs_landing l = pending;
	size_t ll = 0;
	ssize_t n;

	if (pending_set && !land_ops->valid(&l)) {
		/* a later write of its file was read (read_end only grows) or
		 * the file was released: it can never be used again, and keeping
		 * it would keep the token passing and its staging block alive */
		put[(*n_put)++] = pending.obj;
		pending_set = false;
	}
	/* plain_readers, land_off, then valid(): in this order. A plain reader
	 * leaves plain_readers only after seen() (or after setting land_off),
	 * so once it is seen gone, valid() sees its write's end. */
	if (pending_set && len > WRITE_HDR && atomic_load(&plain_readers) == 0 &&
	    !atomic_load(&land_off) && land_ops->valid(&l)) {
		ll = l.len < len - WRITE_HDR ? l.len : len - WRITE_HDR;
		struct iovec iov[3] = {
			{ buf, WRITE_HDR }, { l.dst, ll }, { buf + WRITE_HDR + ll, len - WRITE_HDR - ll },
		};
		n = readv(fd, iov, iov[2].iov_len ? 3 : 2);
	} else {
		n = read(fd, buf, len);
	}
	if (n < (ssize_t)sizeof(struct fuse_in_header))
		return n;
	int e = errno;
	const struct fuse_in_header *in = (const void *)buf;
	struct fuse_write_in wi;
	bool is_write = write_of(buf, n, &wi);
	bool hit = ll && is_write && wi.fh == l.fh && wi.offset == l.off && wi.size <= ll &&
		   (size_t)n == WRITE_HDR + wi.size;
	if (ll && !hit && (size_t)n > WRITE_HDR)       /* not the expected write: back */
		memcpy(buf + WRITE_HDR, l.dst, (size_t)n - WRITE_HDR < ll ? (size_t)n - WRITE_HDR
									 : ll);
	note_request(buf, n);
	if (hit) {
		landed.unique = in->unique;
		landed.dst = l.dst;
		landed.size = wi.size;
	}
	/* the file's next write is expected where this one ends; a release of
	 * the file expects none, and neither does a writer that paused while
	 * other requests came (they would all pass the token meanwhile) */
	others = is_write ? 0 : others + 1;
	bool drop = is_write || atomic_load(&land_off) || others > LAND_PATIENCE ||
		    (pending_set && in->opcode == FUSE_RELEASE &&
		     (size_t)n >= sizeof *in + sizeof(struct fuse_release_in) &&
		     ((const struct fuse_release_in *)(const void *)(buf + sizeof *in))->fh == l.fh);
	if (drop && pending_set) {
		put[(*n_put)++] = pending.obj;
		pending_set = false;
	}
	if (is_write) {
		struct dgfs_landing next;
		bool again = write_again(wi.fh);
		if (land_ops->seen(wi.fh, wi.offset, wi.size, &next)) {
			if (again) {
				pending = next;
				pending_set = true;
			} else {
				put[(*n_put)++] = next.obj;
			}
		}
	}
	if (!pending_set)
		atomic_store(&land_mode, false);        /* back to parallel reads */
	errno = e;
	return n;
}

static ssize_t io_read(int fd, void *buf, size_t len, void *ud)
{
	(void)ud;
	/* in plain_readers before looking at the mode: a holder of the token
	 * about to use a landing then sees this thread (or this thread sees
	 * the mode, which readers outside the token turn on) */
	atomic_fetch_add(&plain_readers, 1);
	if (!atomic_load(&land_mode)) {
		ssize_t n = read_plain(fd, buf, len);
		atomic_fetch_sub(&plain_readers, 1);
		return n;
	}
	atomic_fetch_sub(&plain_readers, 1);
	/* libfuse cancels its threads (in here too: sem_wait and readv are
	 * cancellation points) only when the session ends, so a token that
	 * leaves with a cancelled thread is never needed again */
	while (sem_wait(&read_tok) != 0)
		;
	if (!atomic_load(&land_mode)) {
		/* the mode went off while this thread waited: read as the others */
		atomic_fetch_add(&plain_readers, 1);
		sem_post(&read_tok);
		ssize_t n = read_plain(fd, buf, len);
		atomic_fetch_sub(&plain_readers, 1);
		return n;
	}
	void *put[2];
	int n_put = 0;
	ssize_t n = read_landing(fd, buf, len, put, &n_put);
	int e = errno;

	sem_post(&read_tok);
	put_all(put, n_put);
	errno = e;
	return n;
}

bool dgfs_devio_landed(const void *dst, size_t size)
{
	bool yes = landed.dst && landed.unique == cur_unique && landed.dst == dst &&
		   landed.size == size;

	landed.dst = NULL;
	return yes;
}

void dgfs_devio_landing_stop(void)
{
	if (land_ops && pending_set)
		land_ops->put(pending.obj);
	pending_set = false;
}

void dgfs_devio_landing(const struct dgfs_landing_ops *ops)
{
	if (!atomic_load(&io_installed) || land_ops)
		return;
	sem_init(&read_tok, 0, 1);
	land_ops = ops;
}

/* Patch the INIT reply: libfuse sends it as the header then fuse_init_out
 * (the first reply of the session, answering init_unique). */
static void patch_init(struct iovec *iov, int count)
{
	uint64_t want = atomic_load(&init_unique);

	if (!want || count < 1 || iov[0].iov_len < sizeof(struct fuse_out_header))
		return;
	struct fuse_out_header *oh = iov[0].iov_base;
	if (oh->unique != want)
		return;
	atomic_store(&init_unique, 0);
	if (oh->error != 0 || !atomic_load(&init_offered) || getenv("DG_MOUNT_NO_DIRECT_MMAP"))
		return;
	if (count != 2 || iov[0].iov_len != sizeof *oh ||
	    iov[1].iov_len < offsetof(struct fuse_init_out, flags2) + sizeof(uint32_t)) {
		/* another libfuse than the one this was written for: without
		 * the flag a direct-I/O open cannot be mapped, so reads must
		 * go through the page cache after all */
		dg_log(DG_LOG_ERROR, "fs", "libfuse's INIT reply has an unknown shape; reads of "
		       "vars/ and npy/ use the page cache");
		if (dio_flag)
			atomic_store(dio_flag, false);
		return;
	}
	struct fuse_init_out *out = iov[1].iov_base;
	out->flags |= FUSE_INIT_EXT;    /* flags2 is read only with it */
	out->flags2 |= (uint32_t)(FUSE_DIRECT_IO_ALLOW_MMAP >> 32);
}

/* A read answered without a copy (dgfs_devio_zero_copy): the reply libfuse
 * sends next from this thread carries zc_len bytes of its buffer zc_out;
 * they are written from zc_src instead. */
static __thread const void *zc_out, *zc_src;
static __thread size_t zc_len;
static __thread uint64_t zc_unique;
static __thread void (*zc_fn)(void *);
static __thread void *zc_arg;

/* The reply went (or another message did: the slot is for one reply only):
 * the source may go now. */
static void zc_done(void)
{
	void (*fn)(void *) = zc_fn;
	void *arg = zc_arg;

	zc_out = zc_src = NULL;
	zc_fn = NULL;
	zc_arg = NULL;
	if (fn)
		fn(arg);
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *ud)
{
	(void)ud;
	if (atomic_load(&init_unique))
		patch_init(iov, count);
	if (zc_out) {
		const struct fuse_out_header *oh = iov[0].iov_base;
		if (count == 2 && iov[0].iov_len == sizeof *oh && oh->unique == zc_unique &&
		    iov[1].iov_base == zc_out && iov[1].iov_len == zc_len) {
			iov[1].iov_base = (void *)zc_src;
		} else {
			/* not the reply's expected shape: libfuse sends its buffer
			 * after all, so it gets the bytes after all */
			bool found = false;
			for (int i = 0; i < count; i++)
				if (iov[i].iov_base == zc_out) {
					memcpy(iov[i].iov_base, zc_src, iov[i].iov_len < zc_len
					       ? iov[i].iov_len : zc_len);
					found = true;
				}
			/* the read's own reply without its buffer: a libfuse that
			 * copied the (unfilled) buffer elsewhere first */
			if (!found && count >= 1 && iov[0].iov_len >= sizeof *oh &&
			    oh->unique == zc_unique)
				dg_log(DG_LOG_ERROR, "fs", "a read reply did not carry the read's "
				       "buffer: this libfuse does not suit the mount's zero-copy "
				       "replies");
		}
	}
	ssize_t n = writev(fd, iov, count);
	int e = errno;  /* libfuse reads it after a failure; done() may free */
	zc_done();      /* one reply only, matched or not */
	errno = e;
	return n;
}

bool dgfs_devio_zero_copy(const void *out, const void *src, size_t n, void (*done)(void *),
			  void *arg)
{
	if (!atomic_load(&io_installed) || n == 0)
		return false;
	zc_done();      /* a slot no reply consumed (none expected) */
	zc_out = out;
	zc_src = src;
	zc_len = n;
	zc_unique = cur_unique;
	zc_fn = done;
	zc_arg = arg;
	return true;
}

int dgfs_devio_install(struct fuse_session *se)
{
	static const struct fuse_custom_io io = { .read = io_read, .writev = io_writev };
	int rc = fuse_session_custom_io(se, &io, fuse_session_fd(se));

	atomic_store(&io_installed, rc == 0);
	return rc;
}

bool dgfs_devio_dio_mmap_offered(_Atomic bool *flag)
{
	dio_flag = flag;
	return atomic_load(&io_installed) && atomic_load(&init_offered) &&
	       !getenv("DG_MOUNT_NO_DIRECT_MMAP");
}

