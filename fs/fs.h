/* Private header of the FUSE filesystem (`dg mount`, doc/filesystem.md): the
 * mount's configuration and state, path parsing (paths.c), the caches and the
 * client pool (cache.c), the FUSE table (ops.c) and the loop (main.c). The
 * mount is a client of the servers' HTTP API (dg/client.h) and nothing else. */
#ifndef DG_FS_H
#define DG_FS_H

#include <pthread.h>
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
};

/* --- paths.c ---------------------------------------------------------------- */

enum dgfs_view {
	DGFS_ROOT,                      /* "/" */
	DGFS_CLUSTER,                   /* "/cluster" */
	DGFS_VARS, DGFS_TEXT, DGFS_NPY, /* "/vars/...", "/text/...", "/npy/..." */
	DGFS_QUEUES,                    /* "/queues/..." */
	DGFS_JOBS,                      /* "/jobs/..." */
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

/* --- cache.c ---------------------------------------------------------------- */

/* Build the state from cfg (copied; cluster borrowed until dgfs_state_free).
 * Returns owned or NULL with *err. */
struct dgfs *dgfs_state_new(const struct dgfs_config *cfg, struct dg_err *err);
void dgfs_state_free(struct dgfs *fs);
double dgfs_now(void);          /* monotonic seconds */

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

/* Locate a variable: from the list when fresh, else by asking every task.
 * DG_ENOTFOUND when no task has it. *info and *task are filled. */
enum dg_status dgfs_var_find(struct dgfs *fs, const char *name, bool fresh_needed,
			     struct dg_var_info *info, int *task, struct dg_err *err);
/* A copy of the variable list (refreshed when older than the TTL); owned
 * (free()) array of *n. */
enum dg_status dgfs_list_get(struct dgfs *fs, struct dgfs_var **out, int *n,
			     struct dg_err *err);
/* Is name a directory of the (fresh) list: some variable named "name/..."? */
enum dg_status dgfs_list_is_dir(struct dgfs *fs, const char *name, bool *dir,
			       struct dg_err *err);
/* Forget the list (after this mount changed something). */
void dgfs_list_invalidate(struct dgfs *fs);
/* The task a new variable goes to: the one holding the fewest bytes. */
enum dg_status dgfs_place_new(struct dgfs *fs, int *task, struct dg_err *err);

/* mkdir'ed prefixes. */
bool dgfs_prefix_has(struct dgfs *fs, const char *name);
int dgfs_prefix_add(struct dgfs *fs, const char *name);       /* 0 or -errno */
bool dgfs_prefix_remove(struct dgfs *fs, const char *name);
/* Forget prefixes that name (a new variable) now makes real. */
void dgfs_prefix_forget_parents(struct dgfs *fs, const char *name);

/* The kernel's page cache of a file is shared by all its open handles, so it
 * may serve a reader only while every handle filling it reads one version.
 * dgfs_cache_open: true when a reader of version may use the page cache
 * (then *keep says whether the pages already there are of that version, and
 * dgfs_cache_close must follow at release); false: read with direct I/O.
 * With only_cached, it succeeds only when the pages are of that version and
 * all there (dgfs_cache_full: a reader of that version read every byte).
 * version must be the one the handle's data is of (from its GET). When
 * *keep is false the caller drops the kernel's pages of the file and then
 * calls dgfs_cache_ready (until then other readers cannot rely on them). */
bool dgfs_cache_open(struct dgfs *fs, int view, const char *name, uint64_t version,
		     bool only_cached, bool *keep);
void dgfs_cache_ready(struct dgfs *fs, int view, const char *name, uint64_t version);
/* A writer opens (+1) or is released (-1): while one is open no reader
 * relies on pages it did not fetch itself (writes drop pages). */
void dgfs_cache_writer(struct dgfs *fs, int view, const char *name, int delta);
void dgfs_cache_full(struct dgfs *fs, int view, const char *name, uint64_t version);
void dgfs_cache_close(struct dgfs *fs, int view, const char *name);
/* The text size at a version (text/ getattr). */
bool dgfs_kv_text_size(struct dgfs *fs, const char *name, uint64_t version, uint64_t *size);
void dgfs_kv_set_text_size(struct dgfs *fs, const char *name, uint64_t version, uint64_t size);

/* Pending creations (files created in this mount, not committed yet): getattr
 * shows them as empty files until their handle commits or is released. */
void dgfs_pending_add(struct dgfs *fs, int view, const char *name);
void dgfs_pending_remove(struct dgfs *fs, int view, const char *name);
bool dgfs_pending_has(struct dgfs *fs, int view, const char *name);

/* --- ops.c ------------------------------------------------------------------ */

struct fuse_operations;
/* The FUSE table of the mount. */
const struct fuse_operations *dgfs_operations(void);

/* --- main.c ----------------------------------------------------------------- */

/* Mount cfg->mountpoint and serve until unmounted (fusermount3 -u, SIGTERM,
 * SIGINT, SIGHUP). Detaches unless cfg->foreground once the mount is up.
 * Returns 0 after a clean unmount, else non-zero with *err set (errors before
 * the mount is up are the caller's to print). */
int dgfs_run(const struct dgfs_config *cfg, struct dg_err *err);

#endif
