/* The FUSE operations of `dg mount` (doc/filesystem.md): the table and one
 * handler per operation, each parsing the path (paths.c), calling the layer
 * that does the work and answering -errno, in the manner of libfuse's
 * passthrough example. What stat and readdir show is attr.c's; an open file
 * (its GET, its reads) handle.c's; staged writes and their commit (one PUT or
 * PATCH at flush/fsync/release, a compare-and-set on the version seen at
 * open unless -o overwrite) stage.c's; the fetch-or-keep decision of an open
 * and the client pool cache.c's. */
#include "ops.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dg/codec.h"
#include "dg/log.h"
#include "dg/tensor.h"

#define MAX_WRITE ((unsigned)1 << 20)        /* bytes per FUSE write/read request */

static const char *const xattr_names[] = {
	"user.dg.dtype", "user.dg.shape", "user.dg.version", "user.dg.task",
};

static struct dgfs *state(void)
{
	return fuse_get_context()->private_data;
}

static struct dgfs_handle *fh(struct fuse_file_info *fi)
{
	return (struct dgfs_handle *)(uintptr_t)fi->fh;
}

/* --- attributes and directories ------------------------------------------------- */

static int dgfs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	struct dgfs *fs = state();
	struct dgfs_path p;
	int rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (fi && fi->fh && dgfs_view_is_var(p.view)) {
		/* fstat of an open file: the variable's attributes, as a path stat
		 * (the kernel sets the file's size and drops pages from what this
		 * answers, also after a writer's truncate: readers share them);
		 * the handle's own only for a file not committed yet. */
		struct dgfs_handle *h = fh(fi);
		rc = dgfs_stat_var(fs, &p, st);
		if (rc == 0 && S_ISREG(st->st_mode))
			return 0;
		pthread_mutex_lock(&h->lock);
		dgfs_fill_file(fs, st, 0644, h->p.view == DGFS_VARS ? h->info.bytes : h->buf.len,
			  h->info.mtime);
		pthread_mutex_unlock(&h->lock);
		return 0;
	}
	switch (p.view) {
	case DGFS_ROOT:
		dgfs_fill_dir(st);
		return 0;
	case DGFS_CLUSTER:
		dgfs_fill_file(fs, st, 0444, 0, (double)time(NULL));
		return 0;
	case DGFS_EVENTS:
		dgfs_fill_file(fs, st, 0444, dgfs_events_size(fs->watch), (double)time(NULL));
		return 0;
	case DGFS_JOBS:
		return dgfs_stat_jobs(fs, p.name, st);
	case DGFS_ROWS:
		return dgfs_stat_rows(fs, p.name, st);
	case DGFS_QUEUES:
		if (!p.name[0]) {
			dgfs_fill_dir(st);
			return 0;
		}
		if ((rc = dgfs_stat_queue(fs, p.name)) != 0)
			return rc;
		dgfs_fill_file(fs, st, 0444, 0, (double)time(NULL));
		return 0;
	default:
		return dgfs_stat_var(fs, &p, st);
	}
}

static int dgfs_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
			struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	static const char *const top[] = { "cluster", "events", "vars", "text", "npy", "queues",
					   "jobs", "rows" };
	struct dgfs *fs = state();
	struct dgfs_path p;
	struct stat st;
	int rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (p.view == DGFS_CLUSTER || p.view == DGFS_EVENTS)
		return -ENOTDIR;
	filler(buf, ".", NULL, 0, 0);
	filler(buf, "..", NULL, 0, 0);
	if (p.view == DGFS_ROOT) {
		for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
			filler(buf, top[i], NULL, 0, 0);
		return 0;
	}
	if (p.view == DGFS_JOBS)
		return dgfs_readdir_jobs(fs, p.name, buf, filler);
	if (p.view == DGFS_QUEUES)
		return p.name[0] ? -ENOTDIR : dgfs_readdir_queues(fs, buf, filler);
	if (p.view == DGFS_ROWS) {
		/* the lists of rows are named, not listed: a directory of none */
		struct stat st2;
		int r = dgfs_stat_rows(fs, p.name, &st2);
		return r ? r : S_ISDIR(st2.st_mode) ? 0 : -ENOTDIR;
	}
	if (p.name[0]) {
		if ((rc = dgfs_stat_var(fs, &p, &st)) != 0)
			return rc;
		if (!S_ISDIR(st.st_mode))
			return -ENOTDIR;
	}
	return dgfs_readdir_vars(fs, &p, buf, filler, flags);
}

static int dgfs_mkdir(const char *path, mode_t mode)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path p;
	struct stat st;
	int rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (fs->cfg.read_only)
		return -EROFS;
	if (!dgfs_view_is_var(p.view) || !p.name[0])
		return -EPERM;
	if (dg_var_name_check(p.name, &err) != DG_OK)
		return dgfs_fail(path, "mkdir", &err);
	rc = dgfs_stat_var(fs, &p, &st);
	if (rc == 0)
		return -EEXIST;
	if (rc != -ENOENT)
		return rc;
	return dgfs_prefix_add(fs, p.name);
}

static int dgfs_rmdir(const char *path)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path p;
	bool full;
	int rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (fs->cfg.read_only)
		return -EROFS;
	if (!dgfs_view_is_var(p.view) || !p.name[0])
		return -EPERM;
	if (dgfs_list_is_dir(fs, p.name, &full, &err) != DG_OK)
		return dgfs_fail(path, "rmdir", &err);
	if (full)
		return -ENOTEMPTY;
	/* A mkdir'ed prefix with mkdir'ed children is not empty either. */
	pthread_mutex_lock(&fs->lock);
	size_t k = strlen(p.name);
	for (int i = 0; i < fs->n_prefixes && !full; i++)
		full = strncmp(fs->prefixes[i], p.name, k) == 0 && fs->prefixes[i][k] == '/';
	pthread_mutex_unlock(&fs->lock);
	if (full)
		return -ENOTEMPTY;
	return dgfs_prefix_remove(fs, p.name) ? 0 : -ENOENT;
}

/* --- open, create, read, write -------------------------------------------------- */

static int open_generated(struct dgfs *fs, const char *path, const struct dgfs_path *p,
			  struct fuse_file_info *fi)
{
	struct dg_err err = { 0 };
	struct dgfs_handle *h;
	enum dg_status st;

	if ((fi->flags & O_ACCMODE) != O_RDONLY)
		return fs->cfg.read_only ? -EROFS : -EPERM;
	if (!(h = dgfs_handle_new(p)))
		return -ENOMEM;
	if (p->view == DGFS_CLUSTER) {
		st = dgfs_text_cluster(fs, &h->buf, &err);
	} else if (p->view == DGFS_JOBS) {
		char id[DG_VAR_NAME_MAX + 1];
		const char *file = "";
		if (dgfs_jobs_split(p->name, id, sizeof id, &file) != 0 || !file[0]) {
			dgfs_handle_free(h);
			return -ENOENT;
		}
		st = dgfs_job_file(fs, id, file, &h->buf, &err);
	} else if (p->view == DGFS_ROWS) {
		st = dgfs_text_rows(fs, p->name, &h->buf, &err);
	} else {
		st = dgfs_text_queue(fs, p->name, &h->buf, &err);
	}
	if (st != DG_OK) {
		dgfs_handle_free(h);
		return dgfs_fail(path, "open", &err);
	}
	fi->direct_io = 1;
	fi->fh = (uint64_t)(uintptr_t)h;
	return 0;
}

/* Opens whose content is made at open: /cluster, queues/NAME,
 * jobs/ID/FILE, rows/NAME/LIST. */
static bool is_generated(const struct dgfs_path *p)
{
	return p->view == DGFS_CLUSTER || (p->view == DGFS_QUEUES && p->name[0]) ||
	       (p->view == DGFS_JOBS && strchr(p->name, '/')) ||
	       (p->view == DGFS_ROWS && strchr(p->name, '/'));
}

/* What an open of a variable's file may not ask for. 0 or -errno. */
static int open_refused(struct dgfs *fs, const char *path, const struct dgfs_path *p, int flags)
{
	int acc = flags & O_ACCMODE;

	if (!dgfs_view_is_var(p->view) || !p->name[0] || (p->view == DGFS_NPY && !p->npy_suffix))
		return -EISDIR;
	if (acc != O_RDONLY && fs->cfg.read_only)
		return -EROFS;
	if (acc != O_RDONLY && (flags & O_APPEND)) {
		dg_log(DG_LOG_WARN, "fs", "open %s: appending to a tensor is not supported", path);
		return -ENOTSUP;
	}
	return 0;
}

/* events: the log of changes, from the first open on (watch.c starts the
 * streams then). */
static int open_events(struct dgfs *fs, const char *path, const struct dgfs_path *p,
		       struct fuse_file_info *fi)
{
	struct dg_err err = { 0 };
	struct dgfs_handle *h;

	if ((fi->flags & O_ACCMODE) != O_RDONLY)
		return fs->cfg.read_only ? -EROFS : -EPERM;
	if (dgfs_watch_start(fs->watch, &err) != DG_OK)
		return dgfs_fail(path, "open", &err);
	if (!(h = dgfs_handle_new(p)))
		return -ENOMEM;
	h->fs = fs;
	fi->direct_io = 1;
	fi->fh = (uint64_t)(uintptr_t)h;
	return 0;
}

static int dgfs_open(const char *path, struct fuse_file_info *fi)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path p;
	struct dgfs_handle *h;
	bool cached;
	int acc = fi->flags & O_ACCMODE, rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (p.view == DGFS_EVENTS)
		return open_events(fs, path, &p, fi);
	if (is_generated(&p))
		return open_generated(fs, path, &p, fi);
	if ((rc = open_refused(fs, path, &p, fi->flags)) != 0)
		return rc;
	if (!(h = dgfs_handle_new(&p)))
		return -ENOMEM;
	h->fs = fs;
	h->writable = acc != O_RDONLY;
	if (dgfs_handle_start(fs, h, acc, h->writable && (fi->flags & O_TRUNC), &cached,
			      &err) != DG_OK) {
		if (h->page_cache)
			dgfs_cache_close(fs, p.view, p.name);
		dgfs_handle_free(h);
		return dgfs_fail(path, "open", &err);
	}
	if (h->page_cache && !cached) {
		/* Drop the pages of another version now, before any other reader
		 * can rely on them; the kernel never drops them at open (keep_cache
		 * is always set: a direct-I/O open would drop them under readers). */
		fuse_invalidate_path(fuse_get_context()->fuse, path);
		dgfs_cache_ready(fs, p.view, p.name, h->task, h->info.version);
	}
	/* With direct-I/O mmap, h->page_cache means the handle may fill the
	 * page cache through a mapping only (its version is the pages'). */
	fi->direct_io = !h->page_cache || fs->dio_mmap;
	fi->keep_cache = 1;
	fi->fh = (uint64_t)(uintptr_t)h;
	if (h->writable)
		dgfs_cache_writer(fs, p.view, p.name, 1);
	dgfs_open_add(h);
	return 0;
}

static int dgfs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path p;
	struct dgfs_handle *h;
	int rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (fs->cfg.read_only)
		return -EROFS;
	if (p.view == DGFS_VARS) {
		dg_log(DG_LOG_WARN, "fs", "create %s: raw bytes carry no dtype or shape; copy a "
		       ".npy into npy/ or use 'dg var create'", path);
		return -EPERM;
	}
	if (!dgfs_view_is_var(p.view))
		return -EPERM;
	if (p.view == DGFS_NPY && !p.npy_suffix) {
		dg_log(DG_LOG_WARN, "fs", "create %s: names in npy/ end in .npy", path);
		return -EINVAL;
	}
	if (dg_var_name_check(p.name, &err) != DG_OK)
		return dgfs_fail(path, "create", &err);
	if (!(h = dgfs_handle_new(&p)))
		return -ENOMEM;
	h->writable = true;
	h->created = true;
	h->replace = true;
	h->dirty = true;
	snprintf(h->info.name, sizeof h->info.name, "%s", p.name);
	h->info.mtime = (double)time(NULL);
	dgfs_pending_add(fs, p.view, p.name);
	fi->direct_io = 1;
	fi->keep_cache = 1;
	fi->fh = (uint64_t)(uintptr_t)h;
	dgfs_cache_writer(fs, p.view, p.name, 1);
	dgfs_open_add(h);
	return 0;
}

static int dgfs_read(const char *path, char *out, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct dgfs_handle *h = fh(fi);

	if (h->p.view == DGFS_EVENTS) {
		size_t n = dgfs_events_read(state()->watch, out, size, (uint64_t)off);
		pthread_mutex_lock(&h->lock);
		if ((uint64_t)off + n > h->events_read)
			h->events_read = (uint64_t)off + n;
		pthread_mutex_unlock(&h->lock);
		return (int)n;
	}
	/* with direct-I/O mmap, a read without a lock owner is the kernel
	 * filling pages for a mapping (read(2) of a direct-I/O file names one) */
	return dgfs_handle_read(state(), path, fh(fi), out, size, off, fi->lock_owner == 0);
}

static int dgfs_write(const char *path, const char *data, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	struct dgfs_handle *h = fh(fi);

	int rc;

	if (!h->writable)
		return -EBADF;
	rc = dgfs_stage_write(state(), path, h, data, size, off);
	if (rc >= 0) {
		pthread_mutex_lock(&h->lock);
		h->wrote = true;
		pthread_mutex_unlock(&h->lock);
	}
	return rc;
}

/* --- commit, release, truncate ---------------------------------------------------- */

/* The other views of a variable this mount changed: drop the kernel's
 * attributes and pages of them now, not after --attr-timeout. (Not the
 * view being handled: its inode may be busy in this very request.) */
static void invalidate_views(const char *name, int except)
{
	static const struct { int view; const char *fmt; } v[] = {
		{ DGFS_VARS, "/vars/%s" }, { DGFS_TEXT, "/text/%s" }, { DGFS_NPY, "/npy/%s.npy" },
	};
	struct fuse *f = fuse_get_context()->fuse;
	char path[DG_VAR_NAME_MAX + 16];

	for (size_t i = 0; f && i < sizeof v / sizeof v[0]; i++) {
		if (v[i].view == except)
			continue;
		snprintf(path, sizeof path, v[i].fmt, name);
		fuse_invalidate_path(f, path);  /* -ENOENT: the kernel never saw it */
	}
}

/* Commit h's staged change. A flush (any close of a descriptor of it) of a
 * file this handle created, before anything was written, commits nothing:
 * `printf 1 > text/x` opens, dup2s and closes the first descriptor before it
 * writes, and committing there created x empty, so that the text refused to
 * fit it. Release commits what the handle holds in any case (`touch`). */
static int commit_path(struct dgfs *fs, const char *path, struct dgfs_handle *h, const char *what,
		       bool flush)
{
	struct dg_err err = { 0 };
	int rc = 0;

	bool committed = false;

	pthread_mutex_lock(&h->lock);
	if (flush && h->created && !h->wrote) {
		rc = 0;
	} else if (h->spoiled) {
		rc = -EINVAL;           /* reported again by close; nothing commits */
	} else if (h->dirty) {
		if (dgfs_stage_commit(fs, h, &err) != DG_OK)
			rc = dgfs_fail(path, what, &err);
		else
			committed = true;
	}
	pthread_mutex_unlock(&h->lock);
	if (committed)
		invalidate_views(h->p.name, h->p.view);
	return rc;
}

static int dgfs_flush(const char *path, struct fuse_file_info *fi)
{
	return commit_path(state(), path, fh(fi), "commit", true);
}

static int dgfs_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	return commit_path(state(), path, fh(fi), "fsync", false);
}

/* poll(2): an open variable's file is readable once a newer version than the
 * one it was opened at exists; events once it grew past what this open file
 * read; other files at once (watch.c). */
struct newer_ctx {
	struct dgfs *fs;
	struct dgfs_handle *h;
};

static bool var_is_newer(void *ud)
{
	struct newer_ctx *c = ud;
	struct dg_err err = { 0 };
	struct dg_var_info info;
	struct dg_client *cl = dgfs_client_get(c->fs, c->h->task, &err);
	enum dg_status st = cl ? dg_var_stat(cl, c->h->p.name, &info, &err) : err.code;

	dgfs_client_put(c->fs, c->h->task, cl, st);
	/* gone (404) is news too: a read tells what */
	return st == DG_ENOTFOUND || (st == DG_OK && info.version > c->h->info.version);
}

static int dgfs_poll(const char *path, struct fuse_file_info *fi, struct fuse_pollhandle *ph,
		     unsigned *reventsp)
{
	struct dgfs *fs = state();
	struct dgfs_handle *h = fh(fi);
	struct dg_err err = { 0 };
	uint64_t version, read_to;

	if (h->p.view != DGFS_EVENTS && (!dgfs_view_is_var(h->p.view) || h->writable ||
					 !h->p.name[0])) {
		if (ph)
			fuse_pollhandle_destroy(ph);
		*reventsp = POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM;
		return 0;
	}
	if (dgfs_watch_start(fs->watch, &err) != DG_OK) {
		if (ph)
			fuse_pollhandle_destroy(ph);
		return dgfs_fail(path, "poll", &err);
	}
	pthread_mutex_lock(&h->lock);
	version = h->info.version;
	read_to = h->events_read;
	pthread_mutex_unlock(&h->lock);
	if (h->p.view == DGFS_EVENTS)
		return dgfs_watch_poll_events(fs->watch, h, read_to, ph, reventsp);
	struct newer_ctx c = { fs, h };
	return dgfs_watch_poll_var(fs->watch, h, h->task, h->p.name, version, var_is_newer, &c,
				   ph, reventsp);
}

static int dgfs_release(const char *path, struct fuse_file_info *fi)
{
	struct dgfs *fs = state();
	struct dgfs_handle *h = fh(fi);

	dgfs_watch_forget(fs->watch, h);
	if (h->p.view == DGFS_EVENTS) {
		dgfs_handle_put(h);
		return 0;
	}
	atomic_store(&h->released, true);       /* a pending landing of it goes */
	dgfs_open_remove(h);         /* first: writer_find must not find it now */
	commit_path(fs, path, h, "commit at release", false);
	if (fs->dio_mmap && h->page_cache) {
		pthread_mutex_lock(&h->lock);
		dgfs_handle_note_served(h, 0, 0);   /* a complete copy is kept even if not all was read */
		pthread_mutex_unlock(&h->lock);
	}
	if (h->mapped && !h->page_cache)
		fuse_invalidate_path(fuse_get_context()->fuse, path);  /* its pages go */
	if (h->page_cache)
		dgfs_cache_close(fs, h->p.view, h->p.name);
	if (h->writable)
		dgfs_cache_writer(fs, h->p.view, h->p.name, -1);
	dgfs_handle_put(h);          /* freed here, or once a reply in flight was written */
	return 0;
}

static int dgfs_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path p;
	int rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (fs->cfg.read_only)
		return -EROFS;
	if (!dgfs_view_is_var(p.view))
		return -EPERM;
	struct dgfs_handle *h = fi && fi->fh ? fh(fi) : NULL;
	if (!h && size == 0)
		h = dgfs_writer_find(&p);    /* open(O_TRUNC): the kernel sends no handle */
	if (h) {
		if (!h->writable)
			return -EBADF;
		pthread_mutex_lock(&h->lock);
		rc = dgfs_stage_truncate(fs, path, h, size);
		pthread_mutex_unlock(&h->lock);
	} else {
		struct dg_var_info v;
		int task;
		if (dgfs_var_find(fs, p.name, true, &v, &task, &err) != DG_OK)
			return dgfs_fail(path, "truncate", &err);
		rc = p.view == DGFS_VARS && (uint64_t)size == v.bytes ? 0 : -EINVAL;
	}
	if (rc == -EINVAL)
		dg_log(DG_LOG_WARN, "fs", "truncate %s to %lld bytes: a variable's size is its "
		       "shape's", path, (long long)size);
	return rc;
}

/* --- names ------------------------------------------------------------------------- */

static int dgfs_unlink(const char *path)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dg_var_info v;
	struct dgfs_path p;
	int task, rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (fs->cfg.read_only)
		return -EROFS;
	if (!dgfs_view_is_var(p.view))
		return -EPERM;
	if (p.view == DGFS_NPY && !p.npy_suffix)
		return -ENOENT;
	enum dg_status st = dgfs_var_find(fs, p.name, true, &v, &task, &err);
	if (st == DG_OK) {
		struct dg_client *c = dgfs_client_get(fs, task, &err);
		st = c ? dg_var_delete(c, p.name, 0, &err) : err.code;
		dgfs_client_put(fs, task, c, st);
	}
	dgfs_list_invalidate(fs);
	if (st == DG_OK)
		invalidate_views(p.name, p.view);
	return st == DG_OK ? 0 : dgfs_fail(path, "delete", &err);
}

/* Variable from (on task tf) becomes to (on task tt): a copy (one PUT: the
 * destination is replaced atomically), then the delete of from. */
static enum dg_status move_var(struct dgfs *fs, const char *from, int tf, const char *to, int tt,
			       struct dg_err *err)
{
	struct dg_tensor *t = NULL;
	struct dg_var_info v;
	struct dg_client *c = dgfs_client_get(fs, tf, err);
	enum dg_status st = c ? dg_var_get(c, from, &t, &v, err) : err->code;

	dgfs_client_put(fs, tf, c, st);
	if (st == DG_OK) {
		struct dg_put_opts o = { .replace = true };
		c = dgfs_client_get(fs, tt, err);
		st = c ? dg_var_put(c, to, t, &o, NULL, err) : err->code;
		dgfs_client_put(fs, tt, c, st);
	}
	dg_tensor_free(t);
	if (st == DG_OK) {
		c = dgfs_client_get(fs, tf, err);
		st = c ? dg_var_delete(c, from, 0, err) : err->code;
		dgfs_client_put(fs, tf, c, st);
		if (st == DG_ENOTFOUND)
			st = DG_OK;     /* someone else removed it meanwhile: the copy stands */
		dgfs_prefix_forget_parents(fs, to);
	}
	return st;
}

static int dgfs_rename(const char *from, const char *to, unsigned int flags)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path pf, pt;
	struct dg_var_info vf, vt;
	int tf, tt, rc;

	if ((rc = dgfs_path_parse(from, &pf)) || (rc = dgfs_path_parse(to, &pt)))
		return -rc;
	if (fs->cfg.read_only)
		return -EROFS;
	if (flags & RENAME_EXCHANGE)
		return -EINVAL;
	if (!dgfs_view_is_var(pf.view) || pf.view != pt.view || !pf.name[0] || !pt.name[0])
		return -EXDEV;
	if (pf.view == DGFS_NPY && (!pf.npy_suffix || !pt.npy_suffix))
		return -EXDEV;          /* a directory, or a name npy/ cannot show */
	if (dg_var_name_check(pt.name, &err) != DG_OK)
		return dgfs_fail(to, "rename to", &err);
	enum dg_status st = dgfs_var_find(fs, pf.name, true, &vf, &tf, &err);
	if (st == DG_ENOTFOUND) {
		struct stat s;
		return dgfs_stat_var(fs, &pf, &s) == 0 && S_ISDIR(s.st_mode) ? -EXDEV : -ENOENT;
	}
	if (st != DG_OK)
		return dgfs_fail(from, "rename", &err);
	if (strcmp(pf.name, pt.name) == 0)
		return 0;
	struct dg_err e2 = { 0 };
	st = dgfs_var_find(fs, pt.name, true, &vt, &tt, &e2);
	if (st == DG_OK && (flags & RENAME_NOREPLACE))
		return -EEXIST;
	if (st != DG_OK && st != DG_ENOTFOUND)
		return dgfs_fail(to, "rename", &e2);
	st = move_var(fs, pf.name, tf, pt.name, st == DG_ENOTFOUND ? tf : tt, &err);
	dgfs_list_invalidate(fs);
	if (st == DG_OK) {
		invalidate_views(pf.name, pf.view);
		invalidate_views(pt.name, pt.view);
	}
	return st == DG_OK ? 0 : dgfs_fail(from, "rename", &err);
}

/* --- xattrs -------------------------------------------------------------------------- */

static int dgfs_getxattr(const char *path, const char *name, char *value, size_t size)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dg_var_info v;
	struct dgfs_path p;
	char out[DG_VAR_NAME_MAX + 64];
	int which = -1, task;

	for (int i = 0; i < 4; i++)
		if (strcmp(name, xattr_names[i]) == 0)
			which = i;
	/* Unknown names (security.*, system.posix_acl_*) answer without a request. */
	if (which < 0 || dgfs_path_parse(path, &p) || !dgfs_view_is_var(p.view) || !p.name[0] ||
	    (p.view == DGFS_NPY && !p.npy_suffix))
		return -ENODATA;
	enum dg_status st = dgfs_var_find(fs, p.name, which == 2, &v, &task, &err);
	if (st == DG_ENOTFOUND)
		return -ENODATA;
	if (st != DG_OK)
		return dgfs_fail(path, "getxattr", &err);
	switch (which) {
	case 0: snprintf(out, sizeof out, "%s", dg_dtype_name(v.dtype)); break;
	case 1: dg_shape_format(&v.shape, out, sizeof out); break;
	case 2: snprintf(out, sizeof out, "%" PRIu64, v.version); break;
	default: snprintf(out, sizeof out, "%s", fs->tasks[task].label); break;
	}
	size_t n = strlen(out);
	if (size == 0)
		return (int)n;
	if (size < n)
		return -ERANGE;
	memcpy(value, out, n);
	return (int)n;
}

static int dgfs_listxattr(const char *path, char *list, size_t size)
{
	struct dgfs_path p;
	struct stat st;
	size_t need = 0;

	if (dgfs_path_parse(path, &p) || !dgfs_view_is_var(p.view) || !p.name[0])
		return 0;
	if (dgfs_stat_var(state(), &p, &st) != 0 || !S_ISREG(st.st_mode))
		return 0;
	for (int i = 0; i < 4; i++)
		need += strlen(xattr_names[i]) + 1;
	if (size == 0)
		return (int)need;
	if (size < need)
		return -ERANGE;
	for (int i = 0; i < 4; i++) {
		size_t n = strlen(xattr_names[i]) + 1;
		memcpy(list, xattr_names[i], n);
		list += n;
	}
	return (int)need;
}

static int dgfs_setxattr(const char *path, const char *name, const char *value, size_t size,
			 int flags)
{
	return state()->cfg.read_only ? -EROFS : -ENOTSUP;
}

static int dgfs_removexattr(const char *path, const char *name)
{
	return state()->cfg.read_only ? -EROFS : -ENOTSUP;
}

/* --- the rest ------------------------------------------------------------------------ */

/* chmod/chown are accepted and change nothing (sed -i, cp -p and rsync set
 * modes on the files they write); the modes are the mount's. */
static int dgfs_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	return state()->cfg.read_only ? -EROFS : 0;
}

static int dgfs_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	return state()->cfg.read_only ? -EROFS : 0;
}

static int dgfs_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	return 0;       /* touch of an existing file: accepted, changes nothing */
}

static void *dgfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	struct dgfs *fs = state();

	dgfs_attr_init();
	fs->fuse = fuse_get_context()->fuse;    /* watch.c's notifications */
	cfg->attr_timeout = fs->cfg.attr_timeout_s;
	cfg->entry_timeout = fs->cfg.entry_timeout_s;
	cfg->negative_timeout = 0;      /* a variable created elsewhere shows at once */
	cfg->hard_remove = 1;           /* no .fuse_hidden renames of open files */
	cfg->use_ino = 0;
	/* O_TRUNC as a truncate to 0 through the handle, whose reply keeps the
	 * variable's size: atomic O_TRUNC would make the kernel set the file's
	 * size to 0 and drop its pages under concurrent readers. */
	conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
	/* The pages are dropped at open when the version changed (keep_cache),
	 * never under a reader because the mtime did: a reader that relies on
	 * them must be able to finish with the version it opened. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	if (conn->capable & FUSE_CAP_READDIRPLUS)
		conn->want |= FUSE_CAP_READDIRPLUS;
	conn->max_write = MAX_WRITE;
	conn->max_readahead = MAX_WRITE;
	fs->dio_mmap = dgfs_devio_dio_mmap_offered(&fs->dio_mmap);
	if (fs->dio_mmap)
		dg_log(DG_LOG_INFO, "fs", "reads of vars/ and npy/ use direct I/O (the kernel maps "
		       "direct-I/O opens: FUSE_DIRECT_IO_ALLOW_MMAP)");
	else
		dg_log(DG_LOG_WARN, "fs", "the kernel (Linux < 6.6) or libfuse cannot map direct-I/O "
		       "opens (or DG_MOUNT_NO_DIRECT_MMAP is set): reads of vars/ and npy/ use "
		       "the page cache");
	return fs;
}

static const struct fuse_operations dgfs_ops = {
	.init = dgfs_init,
	.getattr = dgfs_getattr,
	.readdir = dgfs_readdir,
	.mkdir = dgfs_mkdir,
	.rmdir = dgfs_rmdir,
	.open = dgfs_open,
	.create = dgfs_create,
	.read = dgfs_read,
	.write = dgfs_write,
	.flush = dgfs_flush,
	.fsync = dgfs_fsync,
	.release = dgfs_release,
	.truncate = dgfs_truncate,
	.unlink = dgfs_unlink,
	.rename = dgfs_rename,
	.getxattr = dgfs_getxattr,
	.listxattr = dgfs_listxattr,
	.setxattr = dgfs_setxattr,
	.removexattr = dgfs_removexattr,
	.chmod = dgfs_chmod,
	.chown = dgfs_chown,
	.utimens = dgfs_utimens,
	.poll = dgfs_poll,
};

const struct fuse_operations *dgfs_operations(void)
{
	return &dgfs_ops;
}
