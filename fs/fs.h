/* Private header of the FUSE filesystem (`dg mount`, doc/filesystem.md): the
 * mount's configuration and state, path parsing (paths.c), the caches and the
 * client pool (cache.c), the FUSE table (ops.c, whose layers ops.h declares)
 * and the loop (main.c). The
 * mount is a client of the servers' HTTP API (dg/client.h) and nothing else. */
#ifndef DG_FS_H
#define DG_FS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dg/client.h"
#include "dg/cluster.h"

/* What `dg mount` asks for (cli/cmd_mount.c fills it). Strings are borrowed. */
struct dgfs_config {
	const char *mountpoint;
	struct dg_cluster *cluster;     /* borrowed; NULL with server */
	const char *server;             /* --server HOST:PORT, or NULL */
	const char *token;              /* bearer token or NULL */
	double timeout_s;               /* per request */
	double attr_timeout_s, entry_timeout_s;
	bool foreground, debug, read_only, overwrite;
	const char *fuse_opts;          /* other -o options for FUSE, or NULL */
};

/* A server holding variables (a task of job "ps", or --server). */
struct dgfs_task {
	char label[64];                 /* "ps/0", or the address with --server */
	char *address;                  /* owned */
	double down_until;              /* monotonic s: after a timeout, fail fast until */
};

/* One variable as listed (plus the task holding it). */
struct dgfs_var {
	struct dg_var_info info;
	int task;
};

/* The mount's state, shared by every FUSE thread. */
struct dgfs {
	struct dgfs_config cfg;
	struct dgfs_task *tasks;        /* owned, n_tasks */
	int n_tasks;
	char *cluster_text;             /* owned: the spec as JSON (for /cluster) */
	/* The master whose jobs jobs/ shows (as `dg submit` picks it): task 0
	 * of job "worker", else the first task not in job ps, else the first
	 * task; the --server. */
	char *master;                   /* owned address */
	struct dgfs_jobcache *jobs;     /* owned (jobs.c) */
	long timeout_ms;
	double list_ttl_s;              /* reuse of the variable list */

	pthread_mutex_t refresh_lock;   /* one list refresh at a time */
	pthread_mutex_t lock;           /* guards everything below */
	struct dgfs_pool *pool;         /* owned: idle clients per task */
	struct dgfs_var *list;          /* owned snapshot, sorted by name */
	int n_list;
	double list_time;               /* monotonic seconds; 0 = none */
	struct dgfs_kv **kv;            /* owned hash buckets: per-name memory (cache.c) */
	char **prefixes;                /* owned: mkdir'ed name prefixes */
	int n_prefixes;
	uint64_t blob_bytes;            /* bytes of the blobs the per-name memory holds */
	uint64_t blob_budget;           /* ... at most (older ones are dropped) */
	uint64_t blob_seq;              /* publication counter (oldest first) */
	/* The kernel maps direct-I/O opens (devio.c): readers of vars/ and
	 * npy/ use direct I/O and the page cache only through mmap. */
	_Atomic bool dio_mmap;
	struct dgfs_watch *watch;       /* owned (watch.c) */
	struct fuse *fuse;              /* the mount's, for notifications from watch.c */
};

/* --- paths.c ---------------------------------------------------------------- */

enum dgfs_view {
	DGFS_ROOT,                      /* "/" */
	DGFS_CLUSTER,                   /* "/cluster" */
	DGFS_VARS, DGFS_TEXT, DGFS_NPY, /* "/vars/...", "/text/...", "/npy/..." */
	DGFS_QUEUES,                    /* "/queues/..." */
	DGFS_JOBS,                      /* "/jobs/..." */
	DGFS_ROWS,                      /* "/rows/NAME/LIST": some rows, as text */
	DGFS_EVENTS,                    /* "/events": a line per change (watch.c) */
};

struct dgfs_path {
	enum dgfs_view view;
	/* The variable (or queue) name the path stands for under its view; "" for
	 * the view's own directory. For npy/ the ".npy" suffix is removed and
	 * npy_suffix says whether it was there. */
	char name[DG_VAR_NAME_MAX + 1];
	bool npy_suffix;
};

/* Split a FUSE path. ENOENT (positive errno) for paths outside the tree or
 * names too long; 0 otherwise. Names are not checked against the variable
 * name rule here (dg_var_name_check at creation does that). */
int dgfs_path_parse(const char *path, struct dgfs_path *out);
/* Is this view one of vars/, text/, npy/? */
bool dgfs_view_is_var(enum dgfs_view v);
/* rows/ names "NAME/LIST": the variable (var, n bytes) and the list of rows
 * (*list, into name: digits, commas and dashes, as GET ?rows= takes it).
 * false when the last component is no such list. */
bool dgfs_rows_split(const char *name, char *var, size_t n, const char **list);

/* --- watch.c ---------------------------------------------------------------- */

struct dgfs_watch;
struct dgfs_handle;
struct fuse_pollhandle;
struct dgfs_watch *dgfs_watch_new(struct dgfs *fs);       /* NULL: out of memory */
/* Stop the streams (before the FUSE session goes: they notify it). */
void dgfs_watch_stop(struct dgfs_watch *w);
void dgfs_watch_free(struct dgfs_watch *w);               /* stops first; NULL is fine */
/* Start the streams of every task (once; later calls wait for the first). */
enum dg_status dgfs_watch_start(struct dgfs_watch *w, struct dg_err *err);
/* `events`: its size, and up to size bytes of it from off (the oldest kept
 * bytes for an off that fell out of what is kept). */
uint64_t dgfs_events_size(struct dgfs_watch *w);
size_t dgfs_events_read(struct dgfs_watch *w, char *out, size_t size, uint64_t off);
/* FUSE poll of `events` (key: its open file, which read up to read_to). */
int dgfs_watch_poll_events(struct dgfs_watch *w, const struct dgfs_handle *key,
			   uint64_t read_to, struct fuse_pollhandle *ph, unsigned *revents);
/* FUSE poll of a variable's open file (key), opened at version of name on
 * task: readable once a newer version exists; newer(ud) asks the ps (the
 * first poll of the file, and after its stream restarted). */
int dgfs_watch_poll_var(struct dgfs_watch *w, const struct dgfs_handle *key, int task,
			const char *name, uint64_t version, bool (*newer)(void *ud), void *ud,
			struct fuse_pollhandle *ph, unsigned *revents);
/* The open file key closed: forget its poll. */
void dgfs_watch_forget(struct dgfs_watch *w, const struct dgfs_handle *key);

/* --- cache.c ---------------------------------------------------------------- */

/* Build the state from cfg (copied; cluster borrowed until dgfs_state_free).
 * Returns owned or NULL with *err. */
struct dgfs *dgfs_state_new(const struct dgfs_config *cfg, struct dg_err *err);
void dgfs_state_free(struct dgfs *fs);

/* A client of task i for this thread: borrowed until dgfs_client_put. NULL
 * with *err set when out of memory or while the task is marked down. */
struct dg_client *dgfs_client_get(struct dgfs *fs, int task, struct dg_err *err);
/* Give it back with the status of its request: a transport failure drops
 * the client (the next request opens a new connection); one that failed after
 * about --timeout also makes requests to that task fail at once for --timeout
 * seconds (one deadline per operation, not per request). c may be NULL. */
void dgfs_client_put(struct dgfs *fs, int task, struct dg_client *c, enum dg_status st);
/* True for statuses that mean the connection may be broken. */
bool dgfs_status_is_transport(enum dg_status st);

/* Locate a variable: from the list (refreshed when older than the TTL), or
 * with fresh_needed by asking every task (HEAD; the list's entry then names
 * the task found). DG_ENOTFOUND when no task has it. *info and *task are
 * filled. */
enum dg_status dgfs_var_find(struct dgfs *fs, const char *name, bool fresh_needed,
			     struct dg_var_info *info, int *task, struct dg_err *err);
/* Where the variable list, of any age and without refreshing it, says name
 * is: *task and *info (as listed: a hint of the size, not a version to
 * trust). False when the list has no such name. A reader asks that task
 * directly; its 404 means the variable moved or went (then dgfs_var_find
 * with fresh_needed says where it is now). */
bool dgfs_var_hint(struct dgfs *fs, const char *name, struct dg_var_info *info, int *task);
/* A copy of the variable list (refreshed when older than the TTL); owned
 * (free()) array of *n. */
enum dg_status dgfs_list_get(struct dgfs *fs, struct dgfs_var **out, int *n,
			     struct dg_err *err);
/* Is name a directory of the (fresh) list: some variable named "name/..."? */
enum dg_status dgfs_list_is_dir(struct dgfs *fs, const char *name, bool *dir,
			       struct dg_err *err);
/* Forget the list (after this mount changed something). */
void dgfs_list_invalidate(struct dgfs *fs);
/* The task a new variable goes to: the one holding the fewest bytes (core's
 * dg_cluster_pick_fewest_bytes over each task's health). */
enum dg_status dgfs_place_new(struct dgfs *fs, int *task, struct dg_err *err);

/* mkdir'ed prefixes. */
bool dgfs_prefix_has(struct dgfs *fs, const char *name);
int dgfs_prefix_add(struct dgfs *fs, const char *name);       /* 0 or -errno */
bool dgfs_prefix_remove(struct dgfs *fs, const char *name);
/* Forget prefixes that name (a new variable) now makes real. */
void dgfs_prefix_forget_parents(struct dgfs *fs, const char *name);

/* A version's bytes shared by the handles that read it (refcounted; the
 * last dgfs_blob_put frees them). The reader that filled the page cache with
 * a whole version publishes its copy (dgfs_cache_full); readers that rely on
 * those pages (lazy) hold a reference, so a page the kernel dropped is read
 * from it: a reader always sees the version it opened, never EIO because the
 * variable changed meanwhile. */
struct dgfs_blob {
	char *data;                     /* owned: malloc'ed, or dg_alloc_aligned */
	size_t len;
	uint64_t version;
	bool aligned;
	_Atomic int refs;
};
/* Wrap data (takes ownership, one reference) or NULL when out of memory
 * (then data stays the caller's). */
struct dgfs_blob *dgfs_blob_new(char *data, size_t len, bool aligned, uint64_t version);
void dgfs_blob_get(struct dgfs_blob *b);
void dgfs_blob_put(struct dgfs_blob *b);        /* NULL is fine */

/* The kernel's page cache of a file is shared by all its open handles, so it
 * may serve a reader only while every handle filling it reads one version.
 * dgfs_cache_open: true when a reader of version may use the page cache
 * (then *keep says whether the pages already there are of that version, and
 * dgfs_cache_close must follow at release); false: read with direct I/O.
 * With only_cached, it succeeds only when the pages are of that version and
 * all there (dgfs_cache_full: a reader of that version read every byte).
 * version must be the one the handle's data is of (from its GET), task the
 * task it came from (versions count per ps: a variable deleted and created
 * on another task may come back with a version its pages have). When
 * *keep is false the caller drops the kernel's pages of the file and then
 * calls dgfs_cache_ready (until then other readers cannot rely on them).
 * With only_cached it also needs the version's published blob and gives the
 * caller a reference (*blob; NULL otherwise). */
bool dgfs_cache_open(struct dgfs *fs, int view, const char *name, int task, uint64_t version,
		     bool only_cached, bool *keep, struct dgfs_blob **blob);
void dgfs_cache_ready(struct dgfs *fs, int view, const char *name, int task, uint64_t version);
/* Does the mount keep a copy of (view, name) that dgfs_cache_open with
 * only_cached could serve if its version is still the variable's? Then
 * *task is the task it came from: a reader of that task asks for the
 * version (HEAD) instead of the value. */
bool dgfs_cache_kept(struct dgfs *fs, int view, const char *name, int *task);
/* A writer opens (+1) or is released (-1): while one is open no reader
 * relies on pages it did not fetch itself (writes drop pages). */
void dgfs_cache_writer(struct dgfs *fs, int view, const char *name, int delta);
/* A reader of version read every byte through the page cache: the pages are
 * all there, and blob (its copy, borrowed: the memory takes its own
 * reference when it keeps it, within fs->blob_budget) backs them. */
void dgfs_cache_full(struct dgfs *fs, int view, const char *name, int task, uint64_t version,
		     struct dgfs_blob *blob);
void dgfs_cache_close(struct dgfs *fs, int view, const char *name);
/* The fetch-or-keep decision of an open of (view, name) (doc/filesystem.md
 * "Reading"): where the variable is, and for a reader whether the kept copy
 * serves it. A read-only open of a listed variable takes *info and *task from
 * the list (*head false: no request made; the caller's GET will tell the
 * version, and a 404 then means it moved); otherwise, or when a kept copy of
 * that task may serve it, the version is asked first (*head true). *kept: the
 * copy serves the reader (dgfs_cache_open with only_cached: *cached, *blob;
 * dgfs_cache_close at release). */
enum dg_status dgfs_cache_open_lookup(struct dgfs *fs, int view, const char *name, bool writable,
				      bool reader, struct dg_var_info *info, int *task, bool *head,
				      bool *kept, bool *cached, struct dgfs_blob **blob,
				      struct dg_err *err);
/* The text size at a version (text/ getattr). */
bool dgfs_kv_text_size(struct dgfs *fs, const char *name, uint64_t version, uint64_t *size);
void dgfs_kv_set_text_size(struct dgfs *fs, const char *name, uint64_t version, uint64_t size);

/* Pending creations (files created in this mount, not committed yet): getattr
 * shows them as empty files until their handle commits or is released. */
void dgfs_pending_add(struct dgfs *fs, int view, const char *name);
void dgfs_pending_remove(struct dgfs *fs, int view, const char *name);
bool dgfs_pending_has(struct dgfs *fs, int view, const char *name);

/* --- jobs.c ----------------------------------------------------------------- */

struct dgfs_jobcache *dgfs_jobcache_new(void);          /* owned or NULL */
void dgfs_jobcache_free(struct dgfs_jobcache *jc);
/* Split the name under jobs/ ("ID" or "ID/FILE"): ENOENT (positive) when it
 * is deeper or the id does not fit id_size; *file is "" for the directory. */
int dgfs_jobs_split(const char *name, char *id, size_t id_size, const char **file);
/* The files of a job directory (status, log, placement, metrics.csv). */
const char *const *dgfs_job_file_names(int *n);
bool dgfs_job_file_is_known(const char *file);
/* The master's job ids, appended to ids NUL-separated (none without a
 * master, or when the master has no job routes). */
enum dg_status dgfs_jobs_list(struct dgfs *fs, struct dg_buf *ids, struct dg_err *err);
/* The content of jobs/ID/FILE appended to out, fetched from the master or
 * reused for half a second. DG_ENOTFOUND for an unknown job or file (also
 * metrics.csv from a master without that route). */
enum dg_status dgfs_job_file(struct dgfs *fs, const char *id, const char *file,
			     struct dg_buf *out, struct dg_err *err);
/* DG_OK when the master knows job id. */
enum dg_status dgfs_job_exists(struct dgfs *fs, const char *id, struct dg_err *err);

/* --- peer.c ----------------------------------------------------------------- */

/* Where dgfs_get_direct puts a body. begin: the headers are in (info, the
 * body's length): return a buffer of at least len bytes, or NULL to give up.
 * progress: bytes [0, avail) of it are in; false gives up. stop: polled while
 * connecting; true gives up (may be NULL). */
struct dgfs_direct_sink {
	void *(*begin)(void *ud, const struct dg_var_info *info, uint64_t len);
	bool (*progress)(void *ud, uint64_t avail);
	bool (*stop)(void *ud);
};
/* GET vars/NAME of task in encoding enc received straight into the sink's
 * buffer (dg_var_get_into: no libcurl buffer to copy out of). *delivered says
 * whether begin was called. Before that, a 404 is DG_ENOTFOUND (the variable
 * is not on that task), and any other failure (a reply that is not a 2xx with
 * Content-Length and the tensor headers: DG_EUNSUPPORTED; an HTTP error; a
 * connection failure) leaves nothing done: the caller then takes the libcurl
 * path (dg_var_get_stream), which says what went wrong. */
enum dg_status dgfs_get_direct(struct dgfs *fs, int task, const char *name,
			       enum dg_encoding enc, const struct dgfs_direct_sink *sink,
			       void *ud, bool *delivered, struct dg_err *err);

/* --- upload.c --------------------------------------------------------------- */

/* A PUT of vars/NAME whose nbytes-long body is read from data (borrowed: the
 * writer's staging block, which must outlive the upload) as the writer
 * declares its prefix final with dgfs_upload_avail: core's
 * dg_var_put_stream, run on a thread of its own with a client of task's
 * pool. Owned (finish or abort frees it) or NULL with *err. if_match 0:
 * unconditional. */
struct dgfs_upload;
struct dgfs_upload *dgfs_upload_start(struct dgfs *fs, int task, const char *name,
				      enum dg_dtype dt, const struct dg_shape *shape,
				      const char *data, uint64_t nbytes, uint64_t if_match,
				      struct dg_err *err);
/* Bytes [0, avail) of data are final: the upload may send them (all but the
 * last byte of the body: that one goes at dgfs_upload_finish, so the ps can
 * never apply the value before the commit). */
void dgfs_upload_avail(struct dgfs_upload *u, uint64_t avail);
/* Was byte off declared final (a write there must abort the upload)? */
bool dgfs_upload_covers(struct dgfs_upload *u, uint64_t off);
/* The whole body is final: wait for the reply and free u. DG_OK with
 * *version; or the ps's error; or *retry set when the stream broke before
 * the body was complete (the ps changed nothing: send it again). */
enum dg_status dgfs_upload_finish(struct dgfs_upload *u, uint64_t *version, bool *retry,
				  struct dg_err *err);
/* Abort the transfer (the ps changes nothing) and free u. NULL is fine. */
void dgfs_upload_abort(struct dgfs_upload *u);

/* --- devio.c --------------------------------------------------------------- */

struct fuse_session;
/* Read and write /dev/fuse through the mount's own io (after fuse_mount,
 * before the loop), whose INIT reply also accepts the kernel's offer of
 * FUSE_DIRECT_IO_ALLOW_MMAP (Linux >= 6.6). 0 or -errno (then libfuse's own
 * io stays). */
int dgfs_devio_install(struct fuse_session *se);
/* In the init handler (before the reply goes out): will the reply accept
 * direct-I/O mmap (the io is installed, the kernel offered it, and
 * DG_MOUNT_NO_DIRECT_MMAP is not set)? *flag (the mount's dio_mmap) is
 * cleared if the reply then cannot be patched (an unknown libfuse). */
bool dgfs_devio_dio_mmap_offered(_Atomic bool *flag);
/* In a read handler: answer with the n bytes at src without copying them
 * into libfuse's buffer out: the reply that libfuse sends next from this
 * thread (the read's: [header, out, n], checked) is written from src, and
 * done(arg) runs once that writev(2) returned (src must stay valid and
 * unchanged until then: the kernel may release the file before writev
 * returns). false (nothing done, done not called: copy) when the mount's io
 * is not installed. */
bool dgfs_devio_zero_copy(const void *out, const void *src, size_t n, void (*done)(void *),
			  void *arg);

/* Writes received in place. The mount's io shows every write request to
 * seen() as it arrives. seen() may answer where the next write to the same
 * file should land: a later read of /dev/fuse then receives a payload that
 * matches (same fh, that offset, at most len bytes) straight at dst, with no
 * copy out of libfuse's buffer (dgfs_devio_landed tells the write handler).
 * Any other request that arrives there is moved back into libfuse's buffer,
 * so dst..dst+len must hold nothing anyone needs: bytes past every write
 * seen for that file, which the handler never shows before a write covers
 * them; valid() says the landing still is that (no write past it was seen
 * since). While a landing may be used, requests are read one at a time (a
 * token passes between libfuse's threads); otherwise in parallel. obj is a
 * reference that keeps dst alive until put(obj). */
struct dgfs_landing {
	uint64_t fh;                    /* the file's handle (fuse_file_info.fh) */
	uint64_t off;                   /* the offset the next write must have */
	char *dst;                      /* where its payload goes */
	size_t len;                     /* at most this many bytes */
	void *obj;                      /* put(obj) when the landing is spent */
};
struct dgfs_landing_ops {
	/* A write request of fh, [off, off + size), just read. true with *next
	 * filled (a reference taken) to expect the next one at *next. */
	bool (*seen)(uint64_t fh, uint64_t off, uint32_t size, struct dgfs_landing *next);
	bool (*valid)(const struct dgfs_landing *l);
	void (*put)(void *obj);
};
/* Install ops (once, before the loop; with the io installed). */
void dgfs_devio_landing(const struct dgfs_landing_ops *ops);
/* In a write handler: is its payload of size bytes already at dst (it
 * landed there, so the handler must not copy it)? */
bool dgfs_devio_landed(const void *dst, size_t size);
/* After the loop ended: give back the landing still expected. */
void dgfs_devio_landing_stop(void);

/* --- ops.c, stage.c (the handlers and their layers: ops.h) ---------------------- */

struct fuse_operations;
/* The FUSE table of the mount (ops.c). */
const struct fuse_operations *dgfs_operations(void);
/* The landings of vars/ writers (dgfs_devio_landing; stage.c). */
const struct dgfs_landing_ops *dgfs_landing_ops(void);

/* --- main.c ----------------------------------------------------------------- */

/* Mount cfg->mountpoint and serve until unmounted (fusermount3 -u, SIGTERM,
 * SIGINT, SIGHUP). Detaches unless cfg->foreground once the mount is up.
 * Returns 0 after a clean unmount, else non-zero with *err set (errors before
 * the mount is up are the caller's to print). */
int dgfs_run(const struct dgfs_config *cfg, struct dg_err *err);

#endif
