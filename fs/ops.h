/* Private to the FUSE handlers of `dg mount` (ops.c): the open file (struct
 * dgfs_handle) and the layers the handlers call: the handle's life and read
 * path (handle.c), write staging and commits (stage.c), and what stat,
 * readdir and the generated files show (attr.c). Below them all: the state,
 * caches and client pool of fs.h (cache.c). None of these files calls ops.c. */
#ifndef DG_FS_OPS_H
#define DG_FS_OPS_H

#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "dg/buf.h"
#include "fs.h"

#define STREAM_MIN ((uint64_t)4 << 20)       /* reads and writes of larger values stream */

struct dgfs_range {
	uint64_t a, b;                  /* [a, b) bytes */
};

/* An open file. */
struct dgfs_handle {
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
	bool wrote;                     /* a write(2) reached it: a flush may commit */
	bool mapped;                    /* the kernel read pages for a mapping of it */
	uint64_t served;                /* bytes read through this page-cache handle */
	uint64_t events_read;           /* events: the end of what it read (poll) */
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
	struct dgfs_range *ranges;           /* vars/: written ranges, sorted, merged */
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
	struct dgfs_handle *next_open;
};

/* --- handle.c ------------------------------------------------------------------ */

/* Log the server's message behind an errno (the only place it can be read)
 * and return the -errno a handler answers. */
int dgfs_fail(const char *path, const char *what, const struct dg_err *err);

/* A new handle of p (one reference), or NULL when out of memory. */
struct dgfs_handle *dgfs_handle_new(const struct dgfs_path *p);
/* Free it now (a handle no reply holds yet); NULL is fine. */
void dgfs_handle_free(struct dgfs_handle *h);
/* Drop a reference; the last frees the handle. */
void dgfs_handle_put(struct dgfs_handle *h);

/* The registry of open files of vars/, text/, npy/ (see handle.c). */
void dgfs_open_add(struct dgfs_handle *h);
void dgfs_open_remove(struct dgfs_handle *h);
struct dgfs_handle *dgfs_writer_find(const struct dgfs_path *p);

/* The encoding of a view's files. */
enum dg_encoding dgfs_view_enc(enum dgfs_view v);
/* The value part of an open of h (h->fs and h->writable set): what it
 * starts from, fetched or kept, and O_TRUNC (trunc). *cached: the kernel's
 * pages are of h's version already. On failure the caller frees h. */
enum dg_status dgfs_handle_start(struct dgfs *fs, struct dgfs_handle *h, int acc, bool trunc,
				 bool *cached, struct dg_err *err);
/* A text/npy writer's starting content, fetched when first needed (h->lock
 * held). 0 or -errno. */
int dgfs_handle_base_load(struct dgfs *fs, const char *path, struct dgfs_handle *h);
/* A read of h: bytes served into out (or from the handle's own bytes,
 * without a copy); kernel_fill: the kernel fills pages for a mapping. */
int dgfs_handle_read(struct dgfs *fs, const char *path, struct dgfs_handle *h, char *out,
		     size_t size, off_t off, bool kernel_fill);
/* A page-cache reader served n more bytes of total (h->lock held). */
void dgfs_handle_note_served(struct dgfs_handle *h, size_t n, uint64_t total);

/* --- stage.c ------------------------------------------------------------------ */

/* A write of writer h: staged (h->lock taken); a failure spoils the handle. */
int dgfs_stage_write(struct dgfs *fs, const char *path, struct dgfs_handle *h, const char *data,
		     size_t size, off_t off);
/* A truncate of writer h to size (h->lock held). 0 or -errno. */
int dgfs_stage_truncate(struct dgfs *fs, const char *path, struct dgfs_handle *h, off_t size);
/* Commit what h staged (h->lock held). */
enum dg_status dgfs_stage_commit(struct dgfs *fs, struct dgfs_handle *h, struct dg_err *err);

/* --- attr.c ------------------------------------------------------------------- */

/* At mount: the directories' mtime is now. */
void dgfs_attr_init(void);
void dgfs_fill_dir(struct stat *st);
void dgfs_fill_file(struct dgfs *fs, struct stat *st, mode_t mode, uint64_t size,
		    double mtime);
/* The stat of a path of vars/, text/, npy/ (a variable or a directory),
 * queues/NAME (0 or -ENOENT) and jobs/... 0 or -errno. */
int dgfs_stat_var(struct dgfs *fs, const struct dgfs_path *p, struct stat *st);
int dgfs_stat_queue(struct dgfs *fs, const char *name);
int dgfs_stat_jobs(struct dgfs *fs, const char *name, struct stat *st);
/* rows/: the directory, NAME (a directory when NAME is a variable or a
 * prefix of some) and NAME/LIST (a read-only file, size 0: made at open). */
int dgfs_stat_rows(struct dgfs *fs, const char *name, struct stat *st);
/* The entries of a directory, to filler. 0 or -errno. */
int dgfs_readdir_vars(struct dgfs *fs, const struct dgfs_path *p, void *buf,
		      fuse_fill_dir_t filler, enum fuse_readdir_flags flags);
int dgfs_readdir_queues(struct dgfs *fs, void *buf, fuse_fill_dir_t filler);
int dgfs_readdir_jobs(struct dgfs *fs, const char *name, void *buf,
		      fuse_fill_dir_t filler);
/* The content of /cluster and of queues/NAME, appended to out. */
enum dg_status dgfs_text_cluster(struct dgfs *fs, struct dg_buf *out, struct dg_err *err);
enum dg_status dgfs_text_queue(struct dgfs *fs, const char *name, struct dg_buf *out,
			       struct dg_err *err);
/* The content of rows/NAME/LIST: those rows of NAME as text (GET ?rows=). */
enum dg_status dgfs_text_rows(struct dgfs *fs, const char *name, struct dg_buf *out,
			      struct dg_err *err);

#endif
