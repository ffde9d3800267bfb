/* The open file of `dg mount` (ops.h): its life (a reference per read reply
 * in flight), the registry of open writers (the handle-less truncate of an
 * O_TRUNC open finds its writer), and the read path: the GET of a version
 * at open (large values stream in on their own thread, through core's
 * dg_var_get_into (peer.c) or libcurl), the kept copy a reader may use (cache.c
 * decides), and serving reads from the handle's bytes without a copy
 * (devio.c). Write staging is stage.c's. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/codec.h"
#include "dg/log.h"
#include "ops.h"

/* Log the server's message behind an errno: the only place it can be read. */
int dgfs_fail(const char *path, const char *what, const struct dg_err *err)
{
	/* a server that did not answer in time is a lost server: EIO */
	int e = err->code == DG_ETIMEOUT ? EIO : dg_status_to_errno(err->code);

	dg_log(e == ENOENT ? DG_LOG_DEBUG : DG_LOG_WARN, "fs", "%s %s: %s%s%s", what, path,
	       err->msg, err->hint[0] ? " (" : "", err->hint[0] ? err->hint : "");
	if (err->hint[0])
		dg_log(DG_LOG_DEBUG, "fs", "hint: %s", err->hint);
	return -(e ? e : EIO);
}

/* --- the registry of open files --------------------------------------------- */

/* Open files of vars/, text/, npy/: the truncate to 0 that the kernel sends
 * right after an open with O_TRUNC, without the file handle, must reach the
 * writer it belongs to (same thread, same file). */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct dgfs_handle *open_files;

void dgfs_open_add(struct dgfs_handle *h)
{
	h->opener = fuse_get_context()->pid;
	pthread_mutex_lock(&open_lock);
	h->next_open = open_files;
	open_files = h;
	h->registered = true;
	pthread_mutex_unlock(&open_lock);
}

void dgfs_open_remove(struct dgfs_handle *h)
{
	if (!h->registered)
		return;
	pthread_mutex_lock(&open_lock);
	for (struct dgfs_handle **pp = &open_files; *pp; pp = &(*pp)->next_open) {
		if (*pp == h) {
			*pp = h->next_open;
			break;
		}
	}
	pthread_mutex_unlock(&open_lock);
}

/* The newest writer of p opened by this thread; it stays valid while the
 * caller (that thread, inside its open syscall) keeps the file open. */
struct dgfs_handle *dgfs_writer_find(const struct dgfs_path *p)
{
	pid_t pid = fuse_get_context()->pid;
	struct dgfs_handle *found = NULL;

	pthread_mutex_lock(&open_lock);
	for (struct dgfs_handle *h = open_files; h && !found; h = h->next_open)
		if (h->writable && h->opener == pid && h->p.view == p->view &&
		    strcmp(h->p.name, p->name) == 0)
			found = h;
	pthread_mutex_unlock(&open_lock);
	return found;
}

/* --- life ------------------------------------------------------------------- */

struct dgfs_handle *dgfs_handle_new(const struct dgfs_path *p)
{
	struct dgfs_handle *h = calloc(1, sizeof *h);

	if (h) {
		atomic_init(&h->refs, 1);
		pthread_mutex_init(&h->lock, NULL);
		pthread_cond_init(&h->arrived, NULL);
		h->p = *p;
	}
	return h;
}

void dgfs_handle_free(struct dgfs_handle *h)
{
	if (!h)
		return;
	if (h->streaming) {
		pthread_mutex_lock(&h->lock);
		h->closing = true;      /* the sink aborts the transfer */
		pthread_mutex_unlock(&h->lock);
		pthread_join(h->stream_th, NULL);
	}
	dgfs_upload_abort(h->upload);
	pthread_cond_destroy(&h->arrived);
	pthread_mutex_destroy(&h->lock);
	if (h->blob)
		dgfs_blob_put(h->blob);
	else if (h->buf_aligned)
		dg_free_aligned(h->buf.data);
	else
		dg_buf_deinit(&h->buf);
	dg_free_aligned(h->stage);
	free(h->ranges);
	free(h);
}

/* Drop a reference; the last frees the handle. */
void dgfs_handle_put(struct dgfs_handle *h)
{
	if (atomic_fetch_sub(&h->refs, 1) == 1)
		dgfs_handle_free(h);
}


/* --- the GET at open ----------------------------------------------------------- */

enum dg_encoding dgfs_view_enc(enum dgfs_view v)
{
	return v == DGFS_TEXT ? DG_ENC_TEXT : v == DGFS_NPY ? DG_ENC_NPY : DG_ENC_RAW;
}

/* Fetch the variable's content in the view's encoding into h->buf (one GET:
 * one version; the reply's block is adopted, not copied). */
static enum dg_status fetch(struct dgfs *fs, struct dgfs_handle *h, struct dg_err *err)
{
	struct dg_client *c = dgfs_client_get(fs, h->task, err);
	enum dg_status st;

	if (h->buf_aligned)
		dg_free_aligned(h->buf.data);
	else
		dg_buf_deinit(&h->buf);
	h->buf_aligned = false;
	dg_buf_init(&h->buf);
	st = c ? dg_var_get_encoded(c, h->p.name, dgfs_view_enc(h->p.view), &h->buf, &h->info, err)
	       : err->code;
	dgfs_client_put(fs, h->task, c, st);
	return st;
}

/* A lazy reader's read missed the kernel's pages (dropped under memory
 * pressure or by a writer's direct writes): from now on it reads the blob of
 * the version it opened (held since open), never another version. */
static void lazy_load(struct dgfs_handle *h)
{
	if (!h->lazy)
		return;
	h->lazy = false;
	h->buf.data = h->blob->data;
	h->buf.len = h->blob->len;
	h->buf.cap = h->blob->len;
}

/* Size a streaming reader's buf for n bytes before any byte arrived. The
 * block comes from dg_alloc_aligned, which keeps large freed blocks: a fresh
 * 256 MiB realloc per cold open cost a page fault per 4 KiB (~30% of the
 * mount's CPU in a cold read). Only the stream uses this buf (a streaming
 * handle is never lazy and never written), so nothing reallocates it. */
static int stream_buf(struct dgfs_handle *h, size_t n)
{
	if (h->buf.data && !h->buf_aligned)
		dg_buf_deinit(&h->buf);
	if (!h->buf.data || n + 1 > h->buf.cap) {
		char *p = n + 1 > n ? dg_alloc_aligned(n + 1) : NULL;
		if (!p)
			return -ENOMEM;
		if (h->buf_aligned)
			dg_free_aligned(h->buf.data);
		h->buf.data = p;
		h->buf.cap = n + 1;
		h->buf_aligned = true;
	}
	h->buf.len = n;
	h->buf.data[n] = '\0';
	return 0;
}

/* The stream's sink: bytes at offset into buf. Only the stream writes
 * beyond avail and readers only read below it, so the copy needs no lock. */
static bool stream_sink(void *ud, const struct dg_var_info *info, uint64_t offset,
			const void *p, size_t n)
{
	struct dgfs_handle *h = ud;
	bool ok = true;

	pthread_mutex_lock(&h->lock);
	if (!h->stream_headers) {
		/* The version (and size) this handle will show: open waits for it.
		 * No reader has seen a byte yet, so the buffer may still change. */
		uint64_t expect = info->bytes;
		if (h->p.view == DGFS_NPY)
			expect += dg_npy_header_size(info->dtype, &info->shape);
		if (expect != h->expect)
			ok = stream_buf(h, expect) == 0;
		h->expect = expect;
		h->info = *info;
		h->stream_headers = true;
		pthread_cond_broadcast(&h->arrived);
	}
	/* a retried request (offset back to 0) may be another version: refuse */
	ok = ok && !h->closing && offset == h->avail && offset + n <= h->expect;
	pthread_mutex_unlock(&h->lock);
	if (!ok)
		return false;
	memcpy(h->buf.data + offset, p, n);
	pthread_mutex_lock(&h->lock);
	h->avail = offset + n;
	/* wake the readers only once the first of them can go on: the body
	 * arrives in many small pieces, a read waits for up to 1 MiB */
	if (h->wake_at && h->avail >= h->wake_at) {
		h->wake_at = 0;
		pthread_cond_broadcast(&h->arrived);
	}
	pthread_mutex_unlock(&h->lock);
	return true;
}

/* dgfs_get_direct's sink: the body is received into h->buf itself. Only the
 * stream writes beyond avail and readers only read below it (as above). */
static void *direct_begin(void *ud, const struct dg_var_info *info, uint64_t len)
{
	struct dgfs_handle *h = ud;
	void *dst = NULL;
	uint64_t expect = info->bytes;

	if (h->p.view == DGFS_NPY)
		expect += dg_npy_header_size(info->dtype, &info->shape);
	pthread_mutex_lock(&h->lock);
	if (len == expect && !h->closing && (expect == h->expect || stream_buf(h, expect) == 0)) {
		h->expect = expect;
		h->info = *info;
		h->stream_headers = true;
		dst = h->buf.data;
		pthread_cond_broadcast(&h->arrived);
	}
	pthread_mutex_unlock(&h->lock);
	return dst;
}

static bool direct_progress(void *ud, uint64_t avail)
{
	struct dgfs_handle *h = ud;

	pthread_mutex_lock(&h->lock);
	bool ok = !h->closing;
	h->avail = avail;
	if (h->wake_at && h->avail >= h->wake_at) {
		h->wake_at = 0;
		pthread_cond_broadcast(&h->arrived);
	}
	pthread_mutex_unlock(&h->lock);
	return ok;
}

static bool direct_stop(void *ud)
{
	struct dgfs_handle *h = ud;

	pthread_mutex_lock(&h->lock);
	bool stop = h->closing;
	pthread_mutex_unlock(&h->lock);
	return stop;
}

static const struct dgfs_direct_sink direct_sink = {
	.begin = direct_begin, .progress = direct_progress, .stop = direct_stop,
};

static void *stream_main(void *arg)
{
	struct dgfs_handle *h = arg;
	struct dgfs *fs = h->fs;
	struct dg_err err = { 0 };
	struct dg_var_info v;
	bool delivered = false;
	/* the body straight into h->buf; libcurl (which copies it once more)
	 * for anything but a plain 200, and to say what went wrong */
	enum dg_status st = dgfs_get_direct(fs, h->task, h->p.name, dgfs_view_enc(h->p.view),
					    &direct_sink, h, &delivered, &err);
	if (st != DG_OK && st != DG_ENOTFOUND && !delivered && !direct_stop(h)) {
		dg_log(DG_LOG_DEBUG, "fs", "GET %s on a plain socket: %s; through libcurl instead",
		       h->p.name, err.msg);
		err = (struct dg_err){ 0 };
		struct dg_client *c = dgfs_client_get(fs, h->task, &err);
		st = c ? dg_var_get_stream(c, h->p.name, dgfs_view_enc(h->p.view), stream_sink, h, &v,
					   &err) : err.code;
		dgfs_client_put(fs, h->task, c, st);
	}
	pthread_mutex_lock(&h->lock);
	if (st == DG_OK && h->avail != h->expect)
		st = dg_err_set(&err, DG_EIO, "%s changed size while it was read (%" PRIu64 " of %"
				PRIu64 " bytes); reopen it", h->p.name, h->avail, h->expect);
	if (st != DG_OK && h->closing)
		st = dg_err_set(&err, DG_ECANCELED, "closed");
	h->stream_st = st;
	h->stream_err = err;
	h->stream_done = true;
	pthread_cond_broadcast(&h->arrived);
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

/* Start streaming a value of expect bytes into h->buf. */
static enum dg_status stream_start(struct dgfs *fs, struct dgfs_handle *h, uint64_t expect,
				   struct dg_err *err)
{
	if (stream_buf(h, expect) != 0)
		return dg_err_set(err, DG_ENOMEM, "out of memory for %" PRIu64 " bytes of %s",
				  expect, h->p.name);
	h->expect = expect;
	h->avail = 0;
	h->fs = fs;
	if (pthread_create(&h->stream_th, NULL, stream_main, h) != 0)
		return dg_err_set(err, DG_ENOMEM, "cannot start a thread to read %s", h->p.name);
	h->streaming = true;
	/* open answers with the version the GET brings, not the HEAD's */
	enum dg_status st = DG_OK;
	pthread_mutex_lock(&h->lock);
	while (!h->stream_headers && !h->stream_done)
		pthread_cond_wait(&h->arrived, &h->lock);
	if (!h->stream_headers) {
		st = h->stream_st != DG_OK ? h->stream_st : DG_EIO;
		if (err)
			*err = h->stream_err;
	}
	pthread_mutex_unlock(&h->lock);
	return st;
}

/* Undo a stream_start whose GET failed before its headers arrived (its
 * thread ended), so that the handle can fetch again. */
static void stream_reset(struct dgfs_handle *h)
{
	if (!h->streaming)
		return;
	pthread_join(h->stream_th, NULL);
	h->streaming = h->stream_done = h->stream_headers = false;
	h->stream_st = DG_OK;
	h->stream_err = (struct dg_err){ 0 };
	h->avail = h->expect = 0;
	if (h->buf_aligned)
		dg_free_aligned(h->buf.data);
	h->buf_aligned = false;
	dg_buf_init(&h->buf);
}

/* A reader's GET of the value into h (h->info then describes it). h->info
 * before it gives the size expected (from a HEAD, or the list's as a hint):
 * values that large stream in; a wrong guess costs speed, not correctness
 * (the stream sizes its buffer from the reply's headers). */
static enum dg_status fetch_value(struct dgfs *fs, struct dgfs_handle *h, bool reader,
				  struct dg_err *err)
{
	uint64_t size = h->info.bytes;

	if (h->p.view == DGFS_NPY)
		size += dg_npy_header_size(h->info.dtype, &h->info.shape);
	if (reader && size >= STREAM_MIN)
		return stream_start(fs, h, size, err);
	return fetch(fs, h, err);
}

/* What the handle starts from (the value part of dgfs_open): readers fetch
 * the value (a reader of the version whose pages the kernel holds only on a
 * miss); vars/ writers only if they also read (patches need no base unless
 * they leave gaps); text/npy writers on their first read or write unless a
 * truncate to 0 (O_TRUNC arrives as one) comes first. Whether a kept copy
 * serves it is the cache's call (dgfs_cache_open_lookup). */
enum dg_status dgfs_handle_start(struct dgfs *fs, struct dgfs_handle *h, int acc, bool trunc,
				 bool *cached, struct dg_err *err)
{
	const struct dgfs_path *p = &h->p;
	bool need = !h->writable || (p->view == DGFS_VARS && acc == O_RDWR && !trunc);
	/* A writer's bytes must never reach the page cache (its commit may
	 * fail): writers and text use direct I/O; so do readers while other
	 * readers of another version fill the cache. A reader of the version
	 * the kernel's pages hold (HEAD) fetches only on a miss; the others
	 * join the cache with the version their GET brought. */
	bool reader = !h->writable && p->view != DGFS_TEXT, head, kept;
	enum dg_status st;

	h->base_pending = h->writable && p->view != DGFS_VARS && !trunc;
	*cached = false;
	st = dgfs_cache_open_lookup(fs, p->view, p->name, h->writable, reader, &h->info, &h->task,
				    &head, &kept, cached, &h->blob, err);
	h->lazy = h->page_cache = kept;
	/* With direct-I/O mmap every read of vars/ and npy/ reaches the mount:
	 * a reader of the kept version reads that copy (no GET), see
	 * doc/filesystem.md "Reading". */
	if (kept && fs->dio_mmap)
		lazy_load(h);
	if (st == DG_OK && need && !kept) {
		st = fetch_value(fs, h, reader, err);
		if (st == DG_ENOTFOUND && !head) {
			/* the variable moved or went since the list: find it, GET again */
			stream_reset(h);
			dg_err_clear(err);
			st = dgfs_var_find(fs, p->name, true, &h->info, &h->task, err);
			if (st == DG_OK)
				st = fetch_value(fs, h, reader, err);
		}
	}
	if (st == DG_OK && need && !kept && reader)
		h->page_cache = dgfs_cache_open(fs, p->view, p->name, h->task, h->info.version,
						false, cached, NULL);
	if (st != DG_OK)
		return st;
	h->has_base = need;
	if (trunc) {
		h->replace = true;
		h->dirty = true;
		if (p->view != DGFS_VARS)
			h->buf.len = 0;
	}
	return DG_OK;
}

/* --- reads ------------------------------------------------------------------ */

/* Count what a page-cache reader served: once it is every byte, the kernel
 * holds all pages of its version and later readers may rely on them, backed
 * by this handle's complete copy, which it publishes as the version's blob
 * (no copy: buf becomes the blob's). h->lock held. */
void dgfs_handle_note_served(struct dgfs_handle *h, size_t n, uint64_t total)
{
	if (!h->page_cache)
		return;         /* (h->fs is set for vars/text/npy handles only) */
	if (h->fs->dio_mmap) {
		/* Direct I/O: the pages play no part; once the handle's copy is
		 * complete it becomes the version's kept copy, which the next
		 * readers of that version read instead of fetching it again. */
		if (h->blob || !h->buf.data ||
		    (h->streaming && h->avail != h->expect))
			return;
		h->blob = dgfs_blob_new(h->buf.data, h->buf.len, h->buf_aligned,
					h->info.version);
		if (h->blob)
			dgfs_cache_full(h->fs, h->p.view, h->p.name, h->task, h->info.version,
					h->blob);
		return;
	}
	if (!h->page_cache || h->lazy || n == 0 || h->served >= total)
		return;
	h->served += n;
	if (h->served < total)
		return;
	if (!h->blob && h->buf.data && (!h->streaming || h->avail == h->expect))
		h->blob = dgfs_blob_new(h->buf.data, h->buf.len, h->buf_aligned,
					h->info.version);
	dgfs_cache_full(h->fs, h->p.view, h->p.name, h->task, h->info.version, h->blob);
}

/* With direct-I/O mmap, a read without a lock owner is the kernel filling
 * the page cache for a mapping of h (read(2) of a direct-I/O file always
 * names one). Those pages are shared by every open of the file: they are of
 * one version only while h's version is the one the registered readers
 * (h->page_cache) share. A handle outside that rule (a reader of another
 * version opened meanwhile, a writer, text/) is still served, and the
 * pages are dropped at its release; see doc/filesystem.md. h->lock held. */
static void note_mapped(const char *path, struct dgfs_handle *h)
{
	h->mapped = true;
	if (h->page_cache)
		return;
	dg_log(DG_LOG_WARN, "fs", "%s is mapped by a handle %s: mappings of other handles of "
	       "this file opened meanwhile may see its pages", path,
	       h->writable ? "open for writing (its staged bytes reach the page cache)"
			   : "that reads another version than the other open handles");
}

/* A text/npy writer's starting content, fetched when first needed. The
 * version seen at open stays the one commits compare against: a change in
 * between is a concurrent update (ESTALE). */
int dgfs_handle_base_load(struct dgfs *fs, const char *path, struct dgfs_handle *h)
{
	struct dg_err err = { 0 };
	uint64_t v = h->info.version;

	if (!h->base_pending)
		return 0;
	h->base_pending = false;
	if (fetch(fs, h, &err) != DG_OK)
		return dgfs_fail(path, "read the content of", &err);
	h->info.version = v;
	return 0;
}

static void reply_written(void *arg)
{
	dgfs_handle_put(arg);
}

/* Answer a read with the n bytes at src: handed to the mount's io, which
 * writes them to the kernel from src (no copy into libfuse's buffer out),
 * for read-only handles, whose bytes never change or move while they are
 * open (a reference keeps them until the reply's writev returned); copied
 * into out for writers. */
static void serve(struct dgfs_handle *h, char *out, const char *src, size_t n)
{
	if (!h->writable) {
		atomic_fetch_add(&h->refs, 1);
		if (dgfs_devio_zero_copy(out, src, n, reply_written, h))
			return;
		atomic_fetch_sub(&h->refs, 1);
	}
	memcpy(out, src, n);
}

/* A read of a streaming handle: waits until the bytes it asks for arrived
 * (or the stream ended). h->lock held. */
static int read_streaming(const char *path, struct dgfs_handle *h, char *out, size_t size,
			  off_t off)
{
	uint64_t want = (uint64_t)off + size < h->expect ? (uint64_t)off + size : h->expect;

	while (!h->stream_done && h->avail < want) {
		/* every waiter sets it again after a wake */
		if (!h->wake_at || want < h->wake_at)
			h->wake_at = want;
		pthread_cond_wait(&h->arrived, &h->lock);
	}
	if (h->avail < want || (h->stream_done && h->stream_st != DG_OK &&
				h->stream_st != DG_ECANCELED && h->avail < h->expect)) {
		struct dg_err err = h->stream_err;
		return dgfs_fail(path, "read", &err);
	}
	size_t n = (uint64_t)off < want ? (size_t)(want - (uint64_t)off) : 0;
	if (n)
		serve(h, out, h->buf.data + off, n);
	dgfs_handle_note_served(h, n, h->expect);
	return (int)n;
}

/* vars/ reads of a handle that wrote: the base with the staged ranges over it
 * (both live in h->buf), or the staged bytes alone without a base. h->lock held. */
static int read_locked(struct dgfs *fs, const char *path, struct dgfs_handle *h, char *out,
		       size_t size, off_t off, bool kernel_fill)
{
	size_t len;

	if (kernel_fill && fs->dio_mmap && !h->mapped)
		note_mapped(path, h);
	int rc = dgfs_handle_base_load(fs, path, h);
	if (rc)
		return rc;
	lazy_load(h);
	if (h->streaming)
		return read_streaming(path, h, out, size, off);
	len = h->p.view == DGFS_VARS ? (h->has_base || h->replace ? h->info.bytes : 0)
				     : h->buf.len;
	if (h->p.view == DGFS_VARS && !h->has_base && !h->replace && h->writable)
		return -EBADF;          /* opened O_WRONLY */
	if (h->p.view == DGFS_VARS && h->buf.len < len)
		len = h->buf.len;
	size_t n = (uint64_t)off < len ? len - (size_t)off : 0;
	if (n > size)
		n = size;
	if (n)
		serve(h, out, h->buf.data + off, n);
	dgfs_handle_note_served(h, n, len);
	return (int)n;
}

int dgfs_handle_read(struct dgfs *fs, const char *path, struct dgfs_handle *h, char *out,
		     size_t size, off_t off, bool kernel_fill)
{
	pthread_mutex_lock(&h->lock);
	int rc = read_locked(fs, path, h, out, size, off, kernel_fill);
	pthread_mutex_unlock(&h->lock);
	return rc;
}
