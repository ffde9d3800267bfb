/* The FUSE operations of `dg mount` (doc/filesystem.md): one handler per
 * operation, each resolving the path (paths.c), asking the servers through
 * the client pool and caches (cache.c) and answering -errno. Reads serve one
 * version fetched at open; writes are staged in the handle and committed as
 * one PUT or PATCH at flush/fsync/release (a compare-and-set on the version
 * seen at open unless -o overwrite). */
#define FUSE_USE_VERSION 31
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dg/codec.h"
#include "dg/http.h"
#include "dg/log.h"
#include "dg/tensor.h"
#include "fs.h"

#define TEXT_SIZE_MAX ((uint64_t)16 << 20)   /* raw bytes above which text/ reports size 0 */
#define MAX_WRITE ((unsigned)1 << 20)        /* bytes per FUSE write/read request */
#define STREAM_MIN ((uint64_t)4 << 20)       /* reads of larger values stream in */

static const char *const xattr_names[] = {
	"user.dg.dtype", "user.dg.shape", "user.dg.version", "user.dg.task",
};

struct range {
	uint64_t a, b;                  /* [a, b) bytes */
};

/* An open file. */
struct handle {
	pthread_mutex_t lock;           /* FUSE may call read/write/flush concurrently */
	/* 1 from open to release, +1 per read reply written from its bytes
	 * (serve): the kernel may release the file before that writev returns */
	_Atomic int refs;
	struct dgfs_path p;
	int task;
	struct dg_var_info info;        /* of the version seen at open (then at each commit) */
	bool writable, created, dirty;
	bool replace;                   /* vars/: a whole replacement (O_TRUNC, truncate 0) */
	bool has_base;                  /* vars/: buf holds the version at open */
	bool lazy;                      /* page cache kept: blob serves only what it misses */
	bool page_cache;                /* reads through the page cache (dgfs_cache_open) */
	bool base_pending;              /* text/npy writer: fetch the content before use */
	bool spoiled;                   /* a write failed: nothing of this handle commits */
	bool mapped;                    /* the kernel read pages for a mapping of it */
	uint64_t served;                /* bytes read through this page-cache handle */
	/* vars/: nbytes of raw bytes (base and staged writes); text/npy: the whole
	 * file content (read, or staged); cluster/queues: generated text. */
	struct dg_buf buf;
	/* vars/ writers without a base: the staged bytes (dg_alloc_aligned keeps
	 * large blocks for reuse: no page faults on every 256 MiB write) */
	char *stage;
	/* Where the mount's io may land this writer's payloads (landing_seen):
	 * stage and its size once a large replacing write started; read_end:
	 * the end of every write request of this file read so far. */
	_Atomic(char *) land_base;
	_Atomic uint64_t land_size, read_end;
	_Atomic bool released;          /* its release ran: no write of it follows */
	uint64_t landed;                /* bytes received in place since the last commit */
	struct range *ranges;           /* vars/: written ranges, sorted, merged */
	int n_ranges, cap_ranges;
	/* vars/ replacing writers of large values: the PUT streams from stage
	 * while the writes arrive (upload.c); upload_tried: started once */
	struct dgfs_upload *upload;
	bool upload_tried;
	/* A large read-only value streams into buf on its own thread while
	 * reads are served from what has arrived (one GET: one version). */
	bool streaming, stream_done, closing;
	bool buf_aligned;               /* buf.data is the stream's dg_alloc_aligned block */
	/* A reference to the version's shared bytes: a lazy reader's (taken at
	 * open), or the blob a page-cache reader published its buf as; buf.data
	 * then points into it and is not the handle's to free. */
	struct dgfs_blob *blob;
	bool stream_headers;            /* the reply's headers (h->info) arrived */
	pthread_t stream_th;
	struct dgfs *fs;                /* for the stream's thread */
	pthread_cond_t arrived;         /* avail grew or the stream ended */
	uint64_t avail, expect;         /* bytes of buf filled; bytes the GET must give */
	uint64_t wake_at;               /* avail that a waiting read needs; 0: none waits */
	enum dg_status stream_st;
	struct dg_err stream_err;
	/* the registry of open files of vars/text/npy (see below) */
	pid_t opener;                   /* the thread that opened it */
	bool registered;
	struct handle *next_open;
};

/* Open files of vars/, text/, npy/: the truncate to 0 that the kernel sends
 * right after an open with O_TRUNC, without the file handle, must reach the
 * writer it belongs to (same thread, same file). */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle *open_files;

static void open_add(struct handle *h)
{
	h->opener = fuse_get_context()->pid;
	pthread_mutex_lock(&open_lock);
	h->next_open = open_files;
	open_files = h;
	h->registered = true;
	pthread_mutex_unlock(&open_lock);
}

static void open_remove(struct handle *h)
{
	if (!h->registered)
		return;
	pthread_mutex_lock(&open_lock);
	for (struct handle **pp = &open_files; *pp; pp = &(*pp)->next_open) {
		if (*pp == h) {
			*pp = h->next_open;
			break;
		}
	}
	pthread_mutex_unlock(&open_lock);
}

/* The newest writer of p opened by this thread; it stays valid while the
 * caller (that thread, inside its open syscall) keeps the file open. */
static struct handle *writer_find(const struct dgfs_path *p)
{
	pid_t pid = fuse_get_context()->pid;
	struct handle *found = NULL;

	pthread_mutex_lock(&open_lock);
	for (struct handle *h = open_files; h && !found; h = h->next_open)
		if (h->writable && h->opener == pid && h->p.view == p->view &&
		    strcmp(h->p.name, p->name) == 0)
			found = h;
	pthread_mutex_unlock(&open_lock);
	return found;
}

static struct dgfs *state(void)
{
	return fuse_get_context()->private_data;
}

static struct handle *fh(struct fuse_file_info *fi)
{
	return (struct handle *)(uintptr_t)fi->fh;
}

/* Log the server's message behind an errno: the only place it can be read. */
static int fail(const char *path, const char *what, const struct dg_err *err)
{
	/* a server that did not answer in time is a lost server: EIO */
	int e = err->code == DG_ETIMEOUT ? EIO : dg_status_to_errno(err->code);

	dg_log(e == ENOENT ? DG_LOG_DEBUG : DG_LOG_WARN, "fs", "%s %s: %s%s%s", what, path,
	       err->msg, err->hint[0] ? " (" : "", err->hint[0] ? err->hint : "");
	if (err->hint[0])
		dg_log(DG_LOG_DEBUG, "fs", "hint: %s", err->hint);
	return -(e ? e : EIO);
}

/* --- attributes ---------------------------------------------------------------- */

static time_t mount_time;              /* mtime of the directories */

static void fill_dir(struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_mtime = st->st_atime = st->st_ctime = mount_time;
	st->st_mode = S_IFDIR | 0755;
	st->st_nlink = 2;
	st->st_uid = getuid();
	st->st_gid = getgid();
}

static void fill_file(struct dgfs *fs, struct stat *st, mode_t mode, uint64_t size, double mtime)
{
	memset(st, 0, sizeof *st);
	st->st_mode = S_IFREG | (fs->cfg.read_only ? (mode & 0444) : mode);
	st->st_nlink = 1;
	st->st_size = (off_t)size;
	st->st_blksize = 1 << 20;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_mtim.tv_sec = (time_t)mtime;
	st->st_mtim.tv_nsec = (long)((mtime - (double)(time_t)mtime) * 1e9);
	st->st_atim = st->st_mtim;
	st->st_ctim = st->st_mtim;
}

/* The size of the text view of a variable (fetched once per version). */
static int text_size(struct dgfs *fs, const struct dg_var_info *v, int task, uint64_t *size)
{
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };

	if (v->bytes > TEXT_SIZE_MAX) {
		*size = 0;
		return 0;
	}
	if (dgfs_kv_text_size(fs, v->name, v->version, size))
		return 0;
	struct dg_var_info got;
	struct dg_client *c = dgfs_client_get(fs, task, &err);
	enum dg_status st = c ? dg_var_get_encoded(c, v->name, DG_ENC_TEXT, &b, &got, &err)
			      : err.code;
	dgfs_client_put(fs, task, c, st);
	if (st != DG_OK) {
		dg_buf_deinit(&b);
		return fail(v->name, "text size of", &err);
	}
	dgfs_kv_set_text_size(fs, v->name, got.version, b.len);
	*size = got.version == v->version ? b.len : 0;
	dg_buf_deinit(&b);
	return 0;
}

static int var_stat(struct dgfs *fs, const struct dgfs_path *p, const struct dg_var_info *v,
		    int task, struct stat *st)
{
	uint64_t size = v->bytes;
	int rc;

	/* bfloat16 has no .npy form (doc/encodings.md): no npy/ file for it */
	if (p->view == DGFS_NPY && dg_npy_header_size(v->dtype, &v->shape) == 0)
		return -ENOENT;
	if (p->view == DGFS_NPY)
		size += dg_npy_header_size(v->dtype, &v->shape);
	else if (p->view == DGFS_TEXT && (rc = text_size(fs, v, task, &size)) != 0)
		return rc;
	fill_file(fs, st, 0644, size, v->mtime);
	return 0;
}

static int var_path_stat(struct dgfs *fs, const struct dgfs_path *p, struct stat *st)
{
	struct dg_err err = { 0 };
	struct dg_var_info v;
	int task;
	bool dir;

	if (!p->name[0]) {
		fill_dir(st);
		return 0;
	}
	if (dgfs_pending_has(fs, p->view, p->name) && (p->view != DGFS_NPY || p->npy_suffix)) {
		fill_file(fs, st, 0644, 0, (double)time(NULL));
		return 0;
	}
	enum dg_status s = dgfs_var_find(fs, p->name, false, &v, &task, &err);
	if (s == DG_OK && (p->view != DGFS_NPY || p->npy_suffix))
		return var_stat(fs, p, &v, task, st);
	if (s != DG_OK && s != DG_ENOTFOUND)
		return fail(p->name, "stat", &err);
	if (p->view == DGFS_NPY && p->npy_suffix)
		return -ENOENT;
	if (dgfs_prefix_has(fs, p->name)) {
		fill_dir(st);
		return 0;
	}
	if (dgfs_list_is_dir(fs, p->name, &dir, &err) != DG_OK)
		return fail(p->name, "stat", &err);
	if (!dir)
		return -ENOENT;
	fill_dir(st);
	return 0;
}

/* GET /v1/queues of every task: names appended to out (NUL-separated). */
static enum dg_status queue_names(struct dgfs *fs, struct dg_buf *out, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int t = 0; st == DG_OK && t < fs->n_tasks; t++) {
		struct dg_http_result res;
		struct dg_http_client *h = dg_http_client_new(fs->tasks[t].address, fs->cfg.token,
							      fs->timeout_ms, err);
		if (!h)
			return err->code;
		dg_http_result_init(&res);
		st = dg_http_request(h, "GET", "/v1/queues", NULL, 0, NULL, 0, &res, err);
		if (st == DG_OK) {
			json_error_t je;
			json_t *j = json_loadb(res.body.data, res.body.len, 0, &je);
			json_t *qs = json_object_get(j, "queues"), *q;
			size_t i;
			json_array_foreach(qs, i, q) {
				const char *name = json_string_value(json_object_get(q, "name"));
				if (name && st == DG_OK)
					st = dg_buf_append(out, name, strlen(name) + 1, err);
			}
			json_decref(j);
		}
		dg_http_result_deinit(&res);
		dg_http_client_free(h);
	}
	return st;
}

static int queue_exists(struct dgfs *fs, const char *name)
{
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };
	int rc = -ENOENT;

	if (queue_names(fs, &b, &err) != DG_OK) {
		dg_buf_deinit(&b);
		return fail(name, "list queues for", &err);
	}
	for (size_t off = 0; off < b.len; off += strlen(b.data + off) + 1)
		if (strcmp(b.data + off, name) == 0)
			rc = 0;
	dg_buf_deinit(&b);
	return rc;
}

/* jobs/, jobs/ID/ and jobs/ID/FILE (jobs.c): directories, and read-only
 * files whose size is that of their content now. */
static int jobs_stat(struct dgfs *fs, const char *name, struct stat *st)
{
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };
	char id[DG_VAR_NAME_MAX + 1];
	const char *file;
	int rc;

	if (!name[0]) {
		fill_dir(st);
		return 0;
	}
	if ((rc = dgfs_jobs_split(name, id, sizeof id, &file)) != 0)
		return -rc;
	if (file[0] && !dgfs_job_file_is_known(file))
		return -ENOENT;
	enum dg_status s = dgfs_job_file(fs, id, file[0] ? file : "status", &b, &err);
	if (s == DG_OK) {
		if (file[0])
			fill_file(fs, st, 0444, b.len, (double)time(NULL));
		else
			fill_dir(st);
	}
	dg_buf_deinit(&b);
	return s == DG_OK ? 0 : fail(name, "stat jobs/", &err);
}

static int jobs_readdir(struct dgfs *fs, const char *name, void *buf, fuse_fill_dir_t filler)
{
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };
	char id[DG_VAR_NAME_MAX + 1];
	const char *file;
	int rc, n;

	if (!name[0]) {
		if (dgfs_jobs_list(fs, &b, &err) != DG_OK) {
			dg_buf_deinit(&b);
			return fail("jobs", "list", &err);
		}
		for (size_t o = 0; o < b.len; o += strlen(b.data + o) + 1)
			filler(buf, b.data + o, NULL, 0, 0);
		dg_buf_deinit(&b);
		return 0;
	}
	if ((rc = dgfs_jobs_split(name, id, sizeof id, &file)) != 0)
		return -rc;
	if (file[0])
		return dgfs_job_file_is_known(file) ? -ENOTDIR : -ENOENT;
	if (dgfs_job_exists(fs, id, &err) != DG_OK)
		return fail(name, "list jobs/", &err);
	const char *const *names = dgfs_job_file_names(&n);
	for (int i = 0; i < n; i++) {
		/* metrics.csv only where the master serves it */
		if (strcmp(names[i], "metrics.csv") == 0) {
			struct dg_err e = { 0 };
			enum dg_status s = dgfs_job_file(fs, id, names[i], &b, &e);
			dg_buf_deinit(&b);
			if (s != DG_OK)
				continue;
		}
		filler(buf, names[i], NULL, 0, 0);
	}
	return 0;
}

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
		struct handle *h = fh(fi);
		rc = var_path_stat(fs, &p, st);
		if (rc == 0 && S_ISREG(st->st_mode))
			return 0;
		pthread_mutex_lock(&h->lock);
		fill_file(fs, st, 0644, h->p.view == DGFS_VARS ? h->info.bytes : h->buf.len,
			  h->info.mtime);
		pthread_mutex_unlock(&h->lock);
		return 0;
	}
	switch (p.view) {
	case DGFS_ROOT:
		fill_dir(st);
		return 0;
	case DGFS_CLUSTER:
		fill_file(fs, st, 0444, 0, (double)time(NULL));
		return 0;
	case DGFS_JOBS:
		return jobs_stat(fs, p.name, st);
	case DGFS_QUEUES:
		if (!p.name[0]) {
			fill_dir(st);
			return 0;
		}
		if ((rc = queue_exists(fs, p.name)) != 0)
			return rc;
		fill_file(fs, st, 0444, 0, (double)time(NULL));
		return 0;
	default:
		return var_path_stat(fs, &p, st);
	}
}

/* --- directories ----------------------------------------------------------------- */

static int fill_vars(struct dgfs *fs, const struct dgfs_path *p, void *buf,
		     fuse_fill_dir_t filler, enum fuse_readdir_flags flags)
{
	struct dg_err err = { 0 };
	struct dgfs_var *l = NULL;
	int n = 0;
	size_t plen = strlen(p->name);
	char last_dir[DG_VAR_NAME_MAX + 1] = "";
	char entry[DG_VAR_NAME_MAX + 8];

	if (dgfs_list_get(fs, &l, &n, &err) != DG_OK)
		return fail(p->name[0] ? p->name : "/", "list", &err);
	for (int i = 0; i < n; i++) {
		const char *name = l[i].info.name;
		if (plen && (strncmp(name, p->name, plen) != 0 || name[plen] != '/'))
			continue;
		const char *rest = plen ? name + plen + 1 : name;
		const char *slash = strchr(rest, '/');
		if (slash) {
			/* A subdirectory: entries sharing it are contiguous (sorted). */
			size_t k = (size_t)(slash - rest);
			if (strlen(last_dir) == k && strncmp(last_dir, rest, k) == 0)
				continue;
			memcpy(last_dir, rest, k);
			last_dir[k] = '\0';
			struct stat st;
			fill_dir(&st);
			filler(buf, last_dir, &st, 0, FUSE_FILL_DIR_PLUS);
			continue;
		}
		if (p->view == DGFS_NPY && dg_npy_header_size(l[i].info.dtype,
							      &l[i].info.shape) == 0)
			continue;       /* bfloat16: no .npy form */
		snprintf(entry, sizeof entry, "%s%s", rest, p->view == DGFS_NPY ? ".npy" : "");
		if (p->view == DGFS_TEXT || !(flags & FUSE_READDIR_PLUS)) {
			filler(buf, entry, NULL, 0, 0);
		} else {
			struct stat st;
			var_stat(fs, p, &l[i].info, l[i].task, &st);
			filler(buf, entry, &st, 0, FUSE_FILL_DIR_PLUS);
		}
	}
	free(l);
	/* mkdir'ed prefixes directly under this directory */
	pthread_mutex_lock(&fs->lock);
	for (int i = 0; i < fs->n_prefixes; i++) {
		const char *q = fs->prefixes[i];
		if (plen && (strncmp(q, p->name, plen) != 0 || q[plen] != '/'))
			continue;
		const char *rest = plen ? q + plen + 1 : q;
		size_t k = strcspn(rest, "/");
		snprintf(entry, sizeof entry, "%.*s", (int)k, rest);
		filler(buf, entry, NULL, 0, 0);
	}
	pthread_mutex_unlock(&fs->lock);
	return 0;
}

static int dgfs_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
			struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	static const char *const top[] = { "cluster", "vars", "text", "npy", "queues", "jobs" };
	struct dgfs *fs = state();
	struct dgfs_path p;
	struct stat st;
	int rc = dgfs_path_parse(path, &p);

	if (rc)
		return -rc;
	if (p.view == DGFS_CLUSTER)
		return -ENOTDIR;
	filler(buf, ".", NULL, 0, 0);
	filler(buf, "..", NULL, 0, 0);
	if (p.view == DGFS_ROOT) {
		for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
			filler(buf, top[i], NULL, 0, 0);
		return 0;
	}
	if (p.view == DGFS_JOBS)
		return jobs_readdir(fs, p.name, buf, filler);
	if (p.view == DGFS_QUEUES) {
		struct dg_err err = { 0 };
		struct dg_buf b = { 0 };
		if (p.name[0])
			return -ENOTDIR;
		if (queue_names(fs, &b, &err) != DG_OK) {
			dg_buf_deinit(&b);
			return fail("queues", "list", &err);
		}
		for (size_t o = 0; o < b.len; o += strlen(b.data + o) + 1)
			filler(buf, b.data + o, NULL, 0, 0);
		dg_buf_deinit(&b);
		return 0;
	}
	if (p.name[0]) {
		if ((rc = var_path_stat(fs, &p, &st)) != 0)
			return rc;
		if (!S_ISDIR(st.st_mode))
			return -ENOTDIR;
	}
	return fill_vars(fs, &p, buf, filler, flags);
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
		return fail(path, "mkdir", &err);
	rc = var_path_stat(fs, &p, &st);
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
		return fail(path, "rmdir", &err);
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

/* --- open / read ----------------------------------------------------------------- */

static struct handle *handle_new(const struct dgfs_path *p)
{
	struct handle *h = calloc(1, sizeof *h);

	if (h) {
		atomic_init(&h->refs, 1);
		pthread_mutex_init(&h->lock, NULL);
		pthread_cond_init(&h->arrived, NULL);
		h->p = *p;
	}
	return h;
}

static void handle_free(struct handle *h)
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
static void handle_put(struct handle *h)
{
	if (atomic_fetch_sub(&h->refs, 1) == 1)
		handle_free(h);
}

/* /cluster: the spec, then each task's health. */
static enum dg_status cluster_text(struct dgfs *fs, struct dg_buf *out, struct dg_err *err)
{
	const struct dg_cluster *cl = fs->cfg.cluster;
	int n = cl ? cl->n_tasks : 1;
	enum dg_status st = dg_buf_printf(out, err, "# cluster\n%s\n# tasks\n", fs->cluster_text);

	for (int i = 0; st == DG_OK && i < n; i++) {
		char label[64];
		const char *addr = cl ? cl->tasks[i].address : fs->cfg.server;
		struct dg_err e = { 0 };
		json_t *hj = NULL;
		if (cl)
			snprintf(label, sizeof label, "%s/%d", cl->tasks[i].job,
				 cl->tasks[i].index);
		else
			snprintf(label, sizeof label, "server");
		struct dg_client *c = dg_client_new(addr, fs->cfg.token, &e);
		if (c) {
			dg_client_set_timeout(c, fs->timeout_ms);
			dg_client_health(c, &hj, &e);
		}
		dg_client_free(c);
		if (hj) {
			const char *status = json_string_value(json_object_get(hj, "status"));
			int64_t vars = json_integer_value(json_object_get(hj, "vars"));
			int64_t bytes = json_integer_value(json_object_get(hj, "bytes"));
			int64_t queues = json_integer_value(json_object_get(hj, "queues"));
			int64_t epoch = json_integer_value(json_object_get(hj, "epoch"));
			double up = json_number_value(json_object_get(hj, "uptime_s"));
			st = dg_buf_printf(out, err, "%s %s %s vars=%" PRId64 " bytes=%" PRId64
					   " queues=%" PRId64 " epoch=%" PRId64 " uptime_s=%.1f\n",
					   label, addr, status ? status : "?", vars, bytes, queues,
					   epoch, up);
			json_decref(hj);
		} else {
			st = dg_buf_printf(out, err, "%s %s unreachable: %s\n", label, addr, e.msg);
		}
	}
	return st;
}

/* queues/NAME: "key value" lines of the queue's state. */
static enum dg_status queue_text(struct dgfs *fs, const char *name, struct dg_buf *out,
				 struct dg_err *err)
{
	enum dg_status st = DG_ENOTFOUND;

	for (int t = 0; st == DG_ENOTFOUND && t < fs->n_tasks; t++) {
		json_t *j = NULL, *v;
		const char *k;
		struct dg_client *c = dgfs_client_get(fs, t, err);
		st = c ? dg_queue_state(c, name, &j, err) : err->code;
		dgfs_client_put(fs, t, c, st);
		json_object_foreach(j, k, v) {
			char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
			if (s && st == DG_OK)
				st = dg_buf_printf(out, err, "%s %s\n", k, s);
			free(s);
		}
		if (st == DG_OK)
			st = dg_buf_printf(out, err, "task %s\n", fs->tasks[t].label);
		json_decref(j);
	}
	return st;
}

static enum dg_encoding view_enc(enum dgfs_view v)
{
	return v == DGFS_TEXT ? DG_ENC_TEXT : v == DGFS_NPY ? DG_ENC_NPY : DG_ENC_RAW;
}

/* Fetch the variable's content in the view's encoding into h->buf (one GET:
 * one version; the reply's block is adopted, not copied). */
static enum dg_status fetch(struct dgfs *fs, struct handle *h, struct dg_err *err)
{
	struct dg_client *c = dgfs_client_get(fs, h->task, err);
	enum dg_status st;

	if (h->buf_aligned)
		dg_free_aligned(h->buf.data);
	else
		dg_buf_deinit(&h->buf);
	h->buf_aligned = false;
	dg_buf_init(&h->buf);
	st = c ? dg_var_get_encoded(c, h->p.name, view_enc(h->p.view), &h->buf, &h->info, err)
	       : err->code;
	dgfs_client_put(fs, h->task, c, st);
	return st;
}

/* A lazy reader's read missed the kernel's pages (dropped under memory
 * pressure or by a writer's direct writes): from now on it reads the blob of
 * the version it opened (held since open), never another version. */
static void lazy_load(struct handle *h)
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
static int stream_buf(struct handle *h, size_t n)
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
	struct handle *h = ud;
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
	struct handle *h = ud;
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
	struct handle *h = ud;

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
	struct handle *h = ud;

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
	struct handle *h = arg;
	struct dgfs *fs = h->fs;
	struct dg_err err = { 0 };
	struct dg_var_info v;
	bool delivered = false;
	/* the body straight into h->buf; libcurl (which copies it once more)
	 * for anything but a plain 200, and to say what went wrong */
	enum dg_status st = dgfs_get_direct(fs, h->task, h->p.name, view_enc(h->p.view),
					    &direct_sink, h, &delivered, &err);
	if (st != DG_OK && st != DG_ENOTFOUND && !delivered && !direct_stop(h)) {
		dg_log(DG_LOG_DEBUG, "fs", "GET %s on a plain socket: %s; through libcurl instead",
		       h->p.name, err.msg);
		err = (struct dg_err){ 0 };
		struct dg_client *c = dgfs_client_get(fs, h->task, &err);
		st = c ? dg_var_get_stream(c, h->p.name, view_enc(h->p.view), stream_sink, h, &v,
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
static enum dg_status stream_start(struct dgfs *fs, struct handle *h, uint64_t expect,
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
static void stream_reset(struct handle *h)
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
static enum dg_status fetch_value(struct dgfs *fs, struct handle *h, bool reader,
				  struct dg_err *err)
{
	uint64_t size = h->info.bytes;

	if (h->p.view == DGFS_NPY)
		size += dg_npy_header_size(h->info.dtype, &h->info.shape);
	if (reader && size >= STREAM_MIN)
		return stream_start(fs, h, size, err);
	return fetch(fs, h, err);
}

/* The version of the variable (HEAD) on the task the list named; where it is
 * not there any more, where it is now. */
static enum dg_status stat_at(struct dgfs *fs, struct handle *h, struct dg_err *err)
{
	struct dg_client *c = dgfs_client_get(fs, h->task, err);
	enum dg_status st = c ? dg_var_stat(c, h->p.name, &h->info, err) : err->code;

	dgfs_client_put(fs, h->task, c, st);
	if (st != DG_ENOTFOUND)
		return st;
	dg_err_clear(err);
	return dgfs_var_find(fs, h->p.name, true, &h->info, &h->task, err);
}

static int open_generated(struct dgfs *fs, const char *path, const struct dgfs_path *p,
			  struct fuse_file_info *fi)
{
	struct dg_err err = { 0 };
	struct handle *h;
	enum dg_status st;

	if ((fi->flags & O_ACCMODE) != O_RDONLY)
		return fs->cfg.read_only ? -EROFS : -EPERM;
	if (!(h = handle_new(p)))
		return -ENOMEM;
	if (p->view == DGFS_CLUSTER) {
		st = cluster_text(fs, &h->buf, &err);
	} else if (p->view == DGFS_JOBS) {
		char id[DG_VAR_NAME_MAX + 1];
		const char *file = "";
		if (dgfs_jobs_split(p->name, id, sizeof id, &file) != 0 || !file[0]) {
			handle_free(h);
			return -ENOENT;
		}
		st = dgfs_job_file(fs, id, file, &h->buf, &err);
	} else {
		st = queue_text(fs, p->name, &h->buf, &err);
	}
	if (st != DG_OK) {
		handle_free(h);
		return fail(path, "open", &err);
	}
	fi->direct_io = 1;
	fi->fh = (uint64_t)(uintptr_t)h;
	return 0;
}

static int dgfs_open(const char *path, struct fuse_file_info *fi)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path p;
	struct handle *h;
	int rc = dgfs_path_parse(path, &p);
	int acc = fi->flags & O_ACCMODE;

	if (rc)
		return -rc;
	if (p.view == DGFS_CLUSTER || (p.view == DGFS_QUEUES && p.name[0]) ||
	    (p.view == DGFS_JOBS && strchr(p.name, '/')))
		return open_generated(fs, path, &p, fi);
	if (!dgfs_view_is_var(p.view) || !p.name[0] || (p.view == DGFS_NPY && !p.npy_suffix))
		return -EISDIR;
	if (acc != O_RDONLY && fs->cfg.read_only)
		return -EROFS;
	if (acc != O_RDONLY && (fi->flags & O_APPEND)) {
		dg_log(DG_LOG_WARN, "fs", "open %s: appending to a tensor is not supported", path);
		return -ENOTSUP;
	}
	if (!(h = handle_new(&p)))
		return -ENOMEM;
	h->fs = fs;
	h->writable = acc != O_RDONLY;
	bool trunc = h->writable && (fi->flags & O_TRUNC);
	/* What the handle starts from: readers fetch the value (a reader of the
	 * version whose pages the kernel holds only on a miss); vars/ writers
	 * only if they also read (patches need no base unless they leave gaps);
	 * text/npy writers on their first read or write unless a truncate to 0
	 * (O_TRUNC arrives as one) comes first. */
	bool need = !h->writable || (p.view == DGFS_VARS && acc == O_RDWR && !trunc);
	h->base_pending = h->writable && p.view != DGFS_VARS && !trunc;
	/* A writer's bytes must never reach the page cache (its commit may
	 * fail): writers and text use direct I/O; so do readers while other
	 * readers of another version fill the cache. A reader of the version
	 * the kernel's pages hold (HEAD) fetches only on a miss; the others
	 * join the cache with the version their GET brought. */
	bool cached = false, reader = !h->writable && p.view != DGFS_TEXT, kept = false;
	/* One round trip for a read-only open of a variable the list places:
	 * the GET goes to that task at once, its headers telling the dtype,
	 * shape and version a HEAD would. Only a kept copy of the view (of that
	 * task) needs the version first (HEAD: is the copy still the value?).
	 * Writers (and names the list lacks) find the variable first, on every
	 * task if need be. A 404 from the listed task means the variable moved
	 * or went: search (dgfs_var_find fresh), then GET once more. */
	bool hinted = !h->writable && dgfs_var_hint(fs, p.name, &h->info, &h->task);
	int copy_task = -1;
	bool head = !hinted || (reader && dgfs_cache_kept(fs, p.view, p.name, &copy_task) &&
				copy_task == h->task);
	enum dg_status st = DG_OK;
	if (head)
		st = hinted ? stat_at(fs, h, &err)
			    : dgfs_var_find(fs, p.name, true, &h->info, &h->task, &err);
	if (st == DG_OK && reader && head)
		kept = h->lazy = h->page_cache = dgfs_cache_open(fs, p.view, p.name, h->task,
								 h->info.version, true, &cached,
								 &h->blob);
	/* With direct-I/O mmap every read of vars/ and npy/ reaches the mount:
	 * a reader of the kept version reads that copy (no GET), see
	 * doc/filesystem.md "Reading". */
	if (kept && fs->dio_mmap)
		lazy_load(h);
	if (st == DG_OK && need && !kept) {
		st = fetch_value(fs, h, reader, &err);
		if (st == DG_ENOTFOUND && !head) {
			stream_reset(h);
			dg_err_clear(&err);
			st = dgfs_var_find(fs, p.name, true, &h->info, &h->task, &err);
			if (st == DG_OK)
				st = fetch_value(fs, h, reader, &err);
		}
	}
	if (st == DG_OK && need && !kept && reader)
		h->page_cache = dgfs_cache_open(fs, p.view, p.name, h->task, h->info.version,
						false, &cached, NULL);
	if (st != DG_OK) {
		if (h->page_cache)
			dgfs_cache_close(fs, p.view, p.name);
		handle_free(h);
		return fail(path, "open", &err);
	}
	h->has_base = need;
	if (trunc) {
		h->replace = true;
		h->dirty = true;
		if (p.view != DGFS_VARS)
			h->buf.len = 0;
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
	open_add(h);
	return 0;
}

static int dgfs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path p;
	struct handle *h;
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
		return fail(path, "create", &err);
	if (!(h = handle_new(&p)))
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
	open_add(h);
	return 0;
}

/* Count what a page-cache reader served: once it is every byte, the kernel
 * holds all pages of its version and later readers may rely on them, backed
 * by this handle's complete copy, which it publishes as the version's blob
 * (no copy: buf becomes the blob's). h->lock held. */
static void note_served(struct handle *h, size_t n, uint64_t total)
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
static void note_mapped(const char *path, struct handle *h)
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
static int base_load(const char *path, struct handle *h)
{
	struct dg_err err = { 0 };
	uint64_t v = h->info.version;

	if (!h->base_pending)
		return 0;
	h->base_pending = false;
	if (fetch(state(), h, &err) != DG_OK)
		return fail(path, "read the content of", &err);
	h->info.version = v;
	return 0;
}

static void reply_written(void *arg)
{
	handle_put(arg);
}

/* Answer a read with the n bytes at src: handed to the mount's io, which
 * writes them to the kernel from src (no copy into libfuse's buffer out),
 * for read-only handles, whose bytes never change or move while they are
 * open (a reference keeps them until the reply's writev returned); copied
 * into out for writers. */
static void serve(struct handle *h, char *out, const char *src, size_t n)
{
	if (!h->writable) {
		atomic_fetch_add(&h->refs, 1);
		if (dgfs_devio_zero_copy(out, src, n, reply_written, h))
			return;
		atomic_fetch_sub(&h->refs, 1);
	}
	memcpy(out, src, n);
}

/* vars/ reads of a handle that wrote: the base with the staged ranges over it
 * (both live in h->buf), or the staged bytes alone without a base. */
static int dgfs_read(const char *path, char *out, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct handle *h = fh(fi);
	size_t len;

	pthread_mutex_lock(&h->lock);
	if (fi->lock_owner == 0 && state()->dio_mmap && !h->mapped)
		note_mapped(path, h);
	int rc = base_load(path, h);
	if (rc) {
		pthread_mutex_unlock(&h->lock);
		return rc;
	}
	lazy_load(h);
	if (h->streaming) {
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
			pthread_mutex_unlock(&h->lock);
			return fail(path, "read", &err);
		}
		size_t n = (uint64_t)off < want ? (size_t)(want - (uint64_t)off) : 0;
		if (n)
			serve(h, out, h->buf.data + off, n);
		note_served(h, n, h->expect);
		pthread_mutex_unlock(&h->lock);
		return (int)n;
	}
	len = h->p.view == DGFS_VARS ? (h->has_base || h->replace ? h->info.bytes : 0)
				     : h->buf.len;
	if (h->p.view == DGFS_VARS && !h->has_base && !h->replace && h->writable) {
		pthread_mutex_unlock(&h->lock);
		return -EBADF;          /* opened O_WRONLY */
	}
	if (h->p.view == DGFS_VARS && h->buf.len < len)
		len = h->buf.len;
	size_t n = (uint64_t)off < len ? len - (size_t)off : 0;
	if (n > size)
		n = size;
	if (n)
		serve(h, out, h->buf.data + off, n);
	note_served(h, n, len);
	pthread_mutex_unlock(&h->lock);
	return (int)n;
}

/* --- writes ---------------------------------------------------------------------- */

/* Record [a, b) in the sorted, merged range list (ranges neither overlap nor
 * touch: each is separated from the next by a gap). */
static int range_add(struct handle *h, uint64_t a, uint64_t b)
{
	int i = 0, n = h->n_ranges;

	/* Fast path: sequential writers extend the last range. */
	if (n && h->ranges[n - 1].b == a) {
		h->ranges[n - 1].b = b;
		return 0;
	}
	/* ranges before i end before a; ranges i..j-1 overlap or touch [a, b) */
	while (i < n && h->ranges[i].b < a)
		i++;
	int j = i;
	while (j < n && h->ranges[j].a <= b) {
		if (h->ranges[j].a < a)
			a = h->ranges[j].a;
		if (h->ranges[j].b > b)
			b = h->ranges[j].b;
		j++;
	}
	if (j > i) {
		/* [a, b) replaces ranges i..j-1 */
		h->ranges[i] = (struct range){ a, b };
		memmove(h->ranges + i + 1, h->ranges + j, (size_t)(n - j) * sizeof *h->ranges);
		h->n_ranges = n - (j - i - 1);
		return 0;
	}
	if (n == h->cap_ranges) {
		int cap = h->cap_ranges ? 2 * h->cap_ranges : 8;
		struct range *g = realloc(h->ranges, (size_t)cap * sizeof *g);
		if (!g)
			return -ENOMEM;
		h->ranges = g;
		h->cap_ranges = cap;
	}
	memmove(h->ranges + i + 1, h->ranges + i, (size_t)(n - i) * sizeof *h->ranges);
	h->ranges[i] = (struct range){ a, b };
	h->n_ranges = n + 1;
	return 0;
}

/* The raw bytes a vars/ handle stages into: the base it read, or its stage. */
static char *vars_data(const struct handle *h)
{
	return h->stage ? h->stage : h->buf.data;
}

static uint64_t if_match(struct dgfs *fs, const struct handle *h);

/* Stop the streaming PUT of h (the ps changes nothing); the staged bytes
 * commit with one PUT instead. */
static void upload_drop(struct handle *h)
{
	dgfs_upload_abort(h->upload);
	h->upload = NULL;
}

/* A replacing writer of a large value starts its PUT at its first write at
 * offset 0 and feeds it the written prefix [0, b) of its first range. */
static void upload_feed(struct handle *h, uint64_t off)
{
	if (!h->upload && !h->upload_tried && off == 0 && h->replace && !h->has_base &&
	    h->stage && h->info.bytes >= STREAM_MIN) {
		struct dg_err err = { 0 };
		h->upload_tried = true;
		h->upload = dgfs_upload_start(h->fs, h->task, h->p.name, h->info.dtype,
					      &h->info.shape, h->stage, h->info.bytes,
					      if_match(h->fs, h), &err);
		if (!h->upload)
			dg_log(DG_LOG_DEBUG, "fs", "vars/%s: no streaming PUT (%s); the write "
			       "commits at close", h->p.name, err.msg);
	}
	if (h->upload && h->n_ranges && h->ranges[0].a == 0)
		dgfs_upload_avail(h->upload, h->ranges[0].b);
}

static int write_vars(struct handle *h, const char *data, size_t size, off_t off)
{
	uint64_t end = (uint64_t)off + size;

	if (end > h->info.bytes) {
		dg_log(DG_LOG_WARN, "fs", "write vars/%s: bytes %" PRIu64 "..%" PRIu64 " past the "
		       "end of the tensor (%" PRIu64 " bytes); nothing of this file commits",
		       h->p.name, (uint64_t)off, end, h->info.bytes);
		return -EINVAL;
	}
	if (!h->has_base && !h->stage) {
		/* the staging block, uninitialised outside the written ranges */
		if (!(h->stage = dg_alloc_aligned(h->info.bytes)))
			return -ENOMEM;
	}
	/* bytes the stream may have sent change: it cannot take them back */
	if (h->upload && dgfs_upload_covers(h->upload, (uint64_t)off))
		upload_drop(h);
	int rc = range_add(h, (uint64_t)off, end);
	if (rc)
		return rc;
	if (dgfs_devio_landed(vars_data(h) + off, size))
		h->landed += size;
	else
		memcpy(vars_data(h) + off, data, size);
	h->dirty = true;
	upload_feed(h, (uint64_t)off);
	if (h->replace && h->stage && h->info.bytes >= STREAM_MIN && !atomic_load(&h->land_base)) {
		atomic_store(&h->land_size, h->info.bytes);
		atomic_store(&h->land_base, h->stage);
	}
	return (int)size;
}

/* A write request of fh just arrived (the mount's io, before any handler
 * sees it): the next one is expected right after it, and its payload may
 * land in the staging block there, when nothing was asked to be written
 * there yet. The file is open (its writer waits for the reply), so fh is a
 * live handle. */
static bool landing_seen(uint64_t fhv, uint64_t off, uint32_t size, struct dgfs_landing *next)
{
	struct handle *h = (struct handle *)(uintptr_t)fhv;
	uint64_t end = off + size, prev = atomic_load(&h->read_end);

	while (end > prev && !atomic_compare_exchange_weak(&h->read_end, &prev, end))
		;
	char *base = atomic_load(&h->land_base);
	uint64_t nb = atomic_load(&h->land_size);
	if (!base || end < prev || end >= nb || size == 0)
		return false;
	atomic_fetch_add(&h->refs, 1);
	/* any size: a writer's requests need not all be as large (a buffer
	 * that is not page aligned is sent as 1 MiB less its offset, then the
	 * rest) */
	*next = (struct dgfs_landing){ .fh = fhv, .off = end, .dst = base + end,
				       .len = nb - end < SIZE_MAX ? (size_t)(nb - end) : SIZE_MAX,
				       .obj = h };
	return true;
}

/* Still nothing asked for at l (no write past it was seen since)? */
static bool landing_valid(const struct dgfs_landing *l)
{
	const struct handle *h = l->obj;

	return !atomic_load(&h->released) && atomic_load(&h->read_end) == l->off;
}

static void landing_put(void *obj)
{
	handle_put(obj);
}

static const struct dgfs_landing_ops landing_ops = {
	.seen = landing_seen, .valid = landing_valid, .put = landing_put,
};

const struct dgfs_landing_ops *dgfs_landing_ops(void)
{
	return &landing_ops;
}

/* Room in a text/npy writer's buf for end bytes, growing geometrically
 * (streaming writers append). From 1 MiB on the block comes from
 * dg_alloc_aligned, whose kept large blocks spare a writer the page faults of
 * a fresh buffer (a quarter of the mount's CPU in a cp of a 256 MiB .npy);
 * an npy/ writer of an existing variable gets room for its whole .npy at
 * once, so a same-shape copy never moves the bytes. */
static int whole_reserve(struct handle *h, uint64_t end)
{
	if (end + 1 <= h->buf.cap)
		return 0;
	uint64_t want = end;
	if (h->p.view == DGFS_NPY && h->info.bytes) {
		uint64_t whole = dg_npy_header_size(h->info.dtype, &h->info.shape) + h->info.bytes;
		if (whole > want)
			want = whole;
	}
	if (want < ((uint64_t)1 << 20) && !h->buf_aligned)
		return dg_buf_reserve(&h->buf, end - h->buf.len, NULL) == DG_OK ? 0 : -ENOMEM;
	if (want < 2 * (uint64_t)h->buf.cap)
		want = 2 * (uint64_t)h->buf.cap;
	char *p = dg_alloc_aligned(want + 1);
	if (!p)
		return -ENOMEM;
	if (h->buf.len)
		memcpy(p, h->buf.data, h->buf.len);
	if (h->buf_aligned)
		dg_free_aligned(h->buf.data);
	else
		dg_buf_deinit(&h->buf);
	h->buf.data = p;
	h->buf.cap = want + 1;
	h->buf_aligned = true;
	return 0;
}

static int write_whole(struct handle *h, const char *data, size_t size, off_t off)
{
	uint64_t end = (uint64_t)off + size;

	if (end > ((uint64_t)1 << 36))
		return -EFBIG;
	if (end > h->buf.len) {
		size_t old = h->buf.len;
		if (whole_reserve(h, end) != 0)
			return -ENOMEM;
		h->buf.len = end;
		h->buf.data[end] = '\0';
		memset(h->buf.data + old, 0, (size_t)off > old ? (size_t)off - old : 0);
	}
	memcpy(h->buf.data + off, data, size);
	h->dirty = true;
	return (int)size;
}

static int dgfs_write(const char *path, const char *data, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	struct handle *h = fh(fi);
	int rc;

	if (!h->writable)
		return -EBADF;
	pthread_mutex_lock(&h->lock);
	rc = h->spoiled ? -EINVAL : base_load(path, h);
	if (rc == 0)
		rc = h->p.view == DGFS_VARS ? write_vars(h, data, size, off)
					    : write_whole(h, data, size, off);
	if (rc < 0 && !h->spoiled) {
		/* A tool that stops at this error must not commit what it wrote
		 * before it (dd would leave half a patch): the handle is spoiled. */
		h->spoiled = true;
		h->dirty = false;
		h->n_ranges = 0;
		upload_drop(h);
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* --- commit ------------------------------------------------------------------------ */

static uint64_t if_match(struct dgfs *fs, const struct handle *h)
{
	return fs->cfg.overwrite ? 0 : h->info.version;
}

/* vars/: one PUT (replacement) or one PATCH (the span of the written ranges). */
static enum dg_status commit_vars(struct dgfs *fs, struct handle *h, struct dg_client *c,
				  uint64_t *version, struct dg_err *err)
{
	size_t esz = dg_dtype_size(h->info.dtype);
	uint64_t nb = h->info.bytes;

	if (h->replace && (h->n_ranges != 1 || h->ranges[0].a != 0 || h->ranges[0].b != nb)) {
		uint64_t got = 0;
		for (int i = 0; i < h->n_ranges; i++)
			got += h->ranges[i].b - h->ranges[i].a;
		upload_drop(h);         /* an incomplete body: the ps changes nothing */
		dg_err_set(err, DG_EINVAL, "vars/%s: %" PRIu64 " of the %" PRIu64 " bytes were "
			   "written; a replacing write must write all of them", h->p.name, got, nb);
		return DG_EINVAL;
	}
	for (int i = 0; i < h->n_ranges; i++) {
		if (h->ranges[i].a % esz || h->ranges[i].b % esz) {
			dg_err_set(err, DG_EINVAL, "vars/%s: bytes %" PRIu64 "..%" PRIu64
				   " leave a %s element half-written (elements are %zu bytes)",
				   h->p.name, h->ranges[i].a, h->ranges[i].b,
				   dg_dtype_name(h->info.dtype), esz);
			return DG_EINVAL;
		}
	}
	if (h->replace && h->upload) {
		struct dgfs_upload *u = h->upload;
		bool retry;
		h->upload = NULL;
		enum dg_status st = dgfs_upload_finish(u, version, &retry, err);
		if (!retry)
			return st;
		dg_log(DG_LOG_DEBUG, "fs", "vars/%s: the streaming PUT broke (%s); sending the "
		       "staged bytes in one PUT", h->p.name, err->msg);
		*err = (struct dg_err){ 0 };
	}
	if (h->replace) {
		struct dg_put_opts o = { .if_match = if_match(fs, h) };
		struct dg_tensor t = { .dtype = h->info.dtype, .shape = h->info.shape,
				       .nbytes = nb, .data = vars_data(h) };
		dg_shape_numel(&t.shape, &t.numel, NULL);
		return dg_var_put(c, h->p.name, &t, &o, version, err);
	}
	uint64_t a = h->ranges[0].a, b = h->ranges[h->n_ranges - 1].b;
	if (h->n_ranges > 1 && !h->has_base) {
		/* gaps between ranges: fill them from the version seen at open */
		struct dg_buf base = { 0 };
		struct dg_var_info v;
		enum dg_status st = dg_var_get_encoded(c, h->p.name, DG_ENC_RAW, &base, &v, err);
		if (st == DG_OK && v.version != h->info.version && !fs->cfg.overwrite)
			st = dg_err_set(err, DG_ECONFLICT, "vars/%s changed since it was opened "
					"(version %" PRIu64 ", now %" PRIu64 ")", h->p.name,
					h->info.version, v.version);
		if (st == DG_OK && base.len != nb)
			st = dg_err_set(err, DG_ECONFLICT, "vars/%s changed size", h->p.name);
		for (int i = 0; st == DG_OK && i + 1 < h->n_ranges; i++)
			memcpy(vars_data(h) + h->ranges[i].b, base.data + h->ranges[i].b,
			       h->ranges[i + 1].a - h->ranges[i].b);
		dg_buf_deinit(&base);
		if (st != DG_OK)
			return st;
	}
	return dg_var_patch(c, h->p.name, a, vars_data(h) + a, b - a, if_match(fs, h), version,
			    err);
}

/* npy/: the staged bytes must be one whole .npy. */
static enum dg_status check_npy(const struct handle *h, struct dg_err *err)
{
	enum dg_dtype dt;
	struct dg_shape shape;
	size_t off;
	int64_t numel;
	enum dg_status st = dg_npy_parse_header(h->buf.data ? h->buf.data : "", h->buf.len, &dt,
						&shape, &off, err);

	if (st == DG_OK)
		st = dg_shape_numel(&shape, &numel, err);
	if (st == DG_OK && h->buf.len - off != (uint64_t)numel * dg_dtype_size(dt))
		st = dg_err_set(err, DG_EINVAL, "npy/%s.npy: %zu data bytes after the header, the "
				"header's dtype and shape need %" PRIu64, h->p.name,
				h->buf.len - off, (uint64_t)numel * dg_dtype_size(dt));
	if (st != DG_OK)
		dg_err_prefix(err, "npy/%s.npy is not a whole .npy file", h->p.name);
	return st;
}

static enum dg_status commit(struct dgfs *fs, struct handle *h, struct dg_err *err)
{
	struct dg_client *c = NULL;
	uint64_t version = 0;
	enum dg_status st = DG_OK;

	if (h->p.view == DGFS_NPY)
		st = check_npy(h, err);
	if (st == DG_OK && h->created)
		st = dgfs_place_new(fs, &h->task, err);
	if (st == DG_OK && !(c = dgfs_client_get(fs, h->task, err)))
		st = err->code;
	if (st == DG_OK && h->p.view == DGFS_VARS) {
		st = commit_vars(fs, h, c, &version, err);
		if (st == DG_OK && h->landed)
			dg_log(DG_LOG_DEBUG, "fs", "vars/%s: committed; %" PRIu64 " of its %" PRIu64
			       " bytes were received in place", h->p.name, h->landed,
			       h->info.bytes);
		h->landed = 0;
	} else if (st == DG_OK) {
		struct dg_put_opts o = {
			.replace = h->p.view == DGFS_NPY,
			.create_only = h->created && !fs->cfg.overwrite,
			.if_match = h->created ? 0 : if_match(fs, h),
		};
		st = dg_var_put_encoded(c, h->p.name, view_enc(h->p.view),
					h->buf.data ? h->buf.data : "", h->buf.len, &o, &version,
					err);
	}
	dgfs_client_put(fs, h->task, c, st);
	if (st == DG_ECONFLICT && !err->hint[0])
		dg_err_hint(err, "another writer updated it since it was opened: reopen and write "
			    "again, or mount with -o overwrite");
	/* Success or not, the staged data is spent: a failed commit changes
	 * nothing and is not retried at release. */
	h->dirty = false;
	h->n_ranges = 0;
	if (h->created)
		dgfs_pending_remove(fs, h->p.view, h->p.name);
	if (st == DG_OK) {
		h->info.version = version;
		h->info.mtime = (double)time(NULL);
		h->replace = false;
		dgfs_prefix_forget_parents(fs, h->p.name);
	}
	h->created = false;
	dgfs_list_invalidate(fs);
	return st;
}

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

static int commit_path(struct dgfs *fs, const char *path, struct handle *h, const char *what)
{
	struct dg_err err = { 0 };
	int rc = 0;

	bool committed = false;

	pthread_mutex_lock(&h->lock);
	if (h->spoiled) {
		rc = -EINVAL;           /* reported again by close; nothing commits */
	} else if (h->dirty) {
		if (commit(fs, h, &err) != DG_OK)
			rc = fail(path, what, &err);
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
	return commit_path(state(), path, fh(fi), "commit");
}

static int dgfs_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	return commit_path(state(), path, fh(fi), "fsync");
}

static int dgfs_release(const char *path, struct fuse_file_info *fi)
{
	struct dgfs *fs = state();
	struct handle *h = fh(fi);

	atomic_store(&h->released, true);       /* a pending landing of it goes */
	open_remove(h);         /* first: writer_find must not find it now */
	commit_path(fs, path, h, "commit at release");
	if (fs->dio_mmap && h->page_cache) {
		pthread_mutex_lock(&h->lock);
		note_served(h, 0, 0);   /* a complete copy is kept even if not all was read */
		pthread_mutex_unlock(&h->lock);
	}
	if (h->mapped && !h->page_cache)
		fuse_invalidate_path(fuse_get_context()->fuse, path);  /* its pages go */
	if (h->page_cache)
		dgfs_cache_close(fs, h->p.view, h->p.name);
	if (h->writable)
		dgfs_cache_writer(fs, h->p.view, h->p.name, -1);
	handle_put(h);          /* freed here, or once a reply in flight was written */
	return 0;
}

static int truncate_handle(const char *path, struct handle *h, off_t size)
{
	if (h->p.view == DGFS_VARS) {
		if ((uint64_t)size == h->info.bytes)
			return 0;
		if (size != 0)
			return -EINVAL;
		h->replace = true;
		h->dirty = true;
		h->n_ranges = 0;
		upload_drop(h);         /* the writes start over */
		h->upload_tried = false;
		return 0;
	}
	if (size == 0)
		h->base_pending = false;
	int rc = base_load(path, h);
	if (rc)
		return rc;
	if ((size_t)size > h->buf.len)
		return -EINVAL;
	h->buf.len = (size_t)size;
	if (h->buf.data)
		h->buf.data[size] = '\0';
	h->dirty = true;
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
	struct handle *h = fi && fi->fh ? fh(fi) : NULL;
	if (!h && size == 0)
		h = writer_find(&p);    /* open(O_TRUNC): the kernel sends no handle */
	if (h) {
		if (!h->writable)
			return -EBADF;
		pthread_mutex_lock(&h->lock);
		rc = truncate_handle(path, h, size);
		pthread_mutex_unlock(&h->lock);
	} else {
		struct dg_var_info v;
		int task;
		if (dgfs_var_find(fs, p.name, true, &v, &task, &err) != DG_OK)
			return fail(path, "truncate", &err);
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
	return st == DG_OK ? 0 : fail(path, "delete", &err);
}

static int dgfs_rename(const char *from, const char *to, unsigned int flags)
{
	struct dgfs *fs = state();
	struct dg_err err = { 0 };
	struct dgfs_path pf, pt;
	struct dg_var_info vf, vt;
	struct dg_tensor *t = NULL;
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
		return fail(to, "rename to", &err);
	enum dg_status st = dgfs_var_find(fs, pf.name, true, &vf, &tf, &err);
	if (st == DG_ENOTFOUND) {
		struct stat s;
		return var_path_stat(fs, &pf, &s) == 0 && S_ISDIR(s.st_mode) ? -EXDEV : -ENOENT;
	}
	if (st != DG_OK)
		return fail(from, "rename", &err);
	if (strcmp(pf.name, pt.name) == 0)
		return 0;
	struct dg_err e2 = { 0 };
	st = dgfs_var_find(fs, pt.name, true, &vt, &tt, &e2);
	if (st == DG_OK && (flags & RENAME_NOREPLACE))
		return -EEXIST;
	if (st != DG_OK && st != DG_ENOTFOUND)
		return fail(to, "rename", &e2);
	if (st == DG_ENOTFOUND)
		tt = tf;
	/* copy (one PUT: the destination is replaced atomically), then delete */
	struct dg_client *c = dgfs_client_get(fs, tf, &err);
	st = c ? dg_var_get(c, pf.name, &t, &vf, &err) : err.code;
	dgfs_client_put(fs, tf, c, st);
	if (st == DG_OK) {
		struct dg_put_opts o = { .replace = true };
		c = dgfs_client_get(fs, tt, &err);
		st = c ? dg_var_put(c, pt.name, t, &o, NULL, &err) : err.code;
		dgfs_client_put(fs, tt, c, st);
	}
	dg_tensor_free(t);
	if (st == DG_OK) {
		c = dgfs_client_get(fs, tf, &err);
		st = c ? dg_var_delete(c, pf.name, 0, &err) : err.code;
		dgfs_client_put(fs, tf, c, st);
		if (st == DG_ENOTFOUND)
			st = DG_OK;     /* someone else removed it meanwhile: the copy stands */
		dgfs_prefix_forget_parents(fs, pt.name);
	}
	dgfs_list_invalidate(fs);
	if (st == DG_OK) {
		invalidate_views(pf.name, pf.view);
		invalidate_views(pt.name, pt.view);
	}
	return st == DG_OK ? 0 : fail(from, "rename", &err);
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
		return fail(path, "getxattr", &err);
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
	if (var_path_stat(state(), &p, &st) != 0 || !S_ISREG(st.st_mode))
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

	mount_time = time(NULL);
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
};

const struct fuse_operations *dgfs_operations(void)
{
	return &dgfs_ops;
}
