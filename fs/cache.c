/* The mount's memory: a pool of HTTP clients per ps task (a dg_client serves
 * one thread at a time), the variable list shared by getattr and readdir
 * (refreshed after --attr-timeout), mkdir'ed prefixes, and per-name facts
 * (the version of the last open, the text size at a version, pending
 * creations). Everything here is guarded by fs->lock; network calls never
 * run under it. */
#include <errno.h>
#include <jansson.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dg/clock.h"
#include "dg/cluster.h"
#include "dg/log.h"
#include "fs.h"

#define KV_BUCKETS 4096
#define POOL_KEEP 16                    /* idle clients kept per task */
#define BLOB_BUDGET_MAX ((uint64_t)4 << 30) /* bytes of published blobs kept, at most */

struct dgfs_pool {
	struct dg_client *idle[POOL_KEEP];
	int n;
};

struct dgfs_kv {
	struct dgfs_kv *next;
	int view;
	uint64_t cache_version;         /* the version the kernel's pages may hold; 0 = none */
	int cache_task;                 /* ... of the variable on this task (versions count
					 * per ps: a variable that moved may repeat one) */
	int cache_users;                /* open handles that read through the page cache */
	int writers;                    /* open writers (their writes drop pages) */
	bool cache_full;                /* every page of cache_version was read into it */
	struct dgfs_blob *blob;         /* a reference: the bytes of cache_version, or NULL */
	uint64_t blob_seq;              /* when it was published */
	uint64_t text_version, text_size;
	int pending;                    /* uncommitted creations of this name */
	char name[];
};

/* --- state ------------------------------------------------------------------ */

static enum dg_status add_task(struct dgfs *fs, const char *label, const char *address,
			       struct dg_err *err)
{
	struct dgfs_task *t = &fs->tasks[fs->n_tasks];

	snprintf(t->label, sizeof t->label, "%s", label);
	t->address = strdup(address);
	if (!t->address)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	fs->n_tasks++;
	return DG_OK;
}

/* The tasks holding variables (the placement rule of DESIGN.md, as dg var)
 * and the spec's text for /cluster. */
static enum dg_status tasks_init(struct dgfs *fs, struct dg_err *err)
{
	const struct dg_cluster *cl = fs->cfg.cluster;
	int cap = cl ? cl->n_tasks : 1;
	enum dg_status st = DG_OK;
	json_t *spec = json_object();

	fs->tasks = calloc((size_t)(cap > 0 ? cap : 1), sizeof *fs->tasks);
	if (!fs->tasks || !spec) {
		json_decref(spec);
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	if (!cl) {
		st = add_task(fs, fs->cfg.server, fs->cfg.server, err);
		json_object_set_new(spec, "server", json_string(fs->cfg.server));
		fs->master = strdup(fs->cfg.server);
		if (st == DG_OK && !fs->master)
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
	} else {
		bool has_ps = dg_cluster_job_size(cl, "ps") > 0;
		for (int i = 0; st == DG_OK && i < cl->n_tasks; i++) {
			const struct dg_task_addr *ta = &cl->tasks[i];
			json_t *job = json_object_get(spec, ta->job);
			char label[64];
			if (!job) {
				job = json_array();
				json_object_set_new(spec, ta->job, job);
			}
			json_array_append_new(job, json_string(ta->address));
			if (has_ps && strcmp(ta->job, "ps") != 0)
				continue;
			snprintf(label, sizeof label, "%s/%d", ta->job, ta->index);
			st = add_task(fs, label, ta->address, err);
		}
		if (st == DG_OK && fs->n_tasks == 0)
			st = dg_err_set(err, DG_EINVAL, "the cluster has no tasks");
		/* the master of jobs/: as `dg submit` picks it */
		const struct dg_task_addr *m = NULL;
		for (int i = 0; i < cl->n_tasks && !m; i++)
			if (strcmp(cl->tasks[i].job, "worker") == 0 && cl->tasks[i].index == 0)
				m = &cl->tasks[i];
		for (int i = 0; i < cl->n_tasks && !m; i++)
			if (strcmp(cl->tasks[i].job, "ps") != 0)
				m = &cl->tasks[i];
		if (!m && cl->n_tasks > 0)
			m = &cl->tasks[0];      /* a `dg server` of job ps is a master too */
		if (st == DG_OK && m && !(fs->master = strdup(m->address)))
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	if (st == DG_OK) {
		fs->cluster_text = json_dumps(spec, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (!fs->cluster_text)
			st = dg_err_set(err, DG_ENOMEM, "out of memory");
	}
	json_decref(spec);
	return st;
}

struct dgfs *dgfs_state_new(const struct dgfs_config *cfg, struct dg_err *err)
{
	struct dgfs *fs = calloc(1, sizeof *fs);

	if (!fs) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	fs->cfg = *cfg;
	fs->timeout_ms = (long)(cfg->timeout_s * 1000.0);
	/* published blobs: an eighth of the memory, at most 4 GiB */
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	fs->blob_budget = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 8 : 0;
	if (fs->blob_budget == 0 || fs->blob_budget > BLOB_BUDGET_MAX)
		fs->blob_budget = BLOB_BUDGET_MAX;
	fs->list_ttl_s = cfg->attr_timeout_s;
	pthread_mutex_init(&fs->lock, NULL);
	pthread_mutex_init(&fs->refresh_lock, NULL);
	if (tasks_init(fs, err) != DG_OK)
		goto fail;
	fs->pool = calloc((size_t)fs->n_tasks, sizeof *fs->pool);
	fs->kv = calloc(KV_BUCKETS, sizeof *fs->kv);
	fs->jobs = dgfs_jobcache_new();
	fs->watch = dgfs_watch_new(fs);
	if (!fs->pool || !fs->kv || !fs->jobs || !fs->watch) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		goto fail;
	}
	return fs;
fail:
	dgfs_state_free(fs);
	return NULL;
}

void dgfs_state_free(struct dgfs *fs)
{
	if (!fs)
		return;
	dgfs_watch_free(fs->watch);
	for (int i = 0; fs->pool && i < fs->n_tasks; i++)
		for (int k = 0; k < fs->pool[i].n; k++)
			dg_client_free(fs->pool[i].idle[k]);
	for (int i = 0; i < fs->n_tasks; i++)
		free(fs->tasks[i].address);
	for (int b = 0; fs->kv && b < KV_BUCKETS; b++) {
		struct dgfs_kv *e = fs->kv[b];
		while (e) {
			struct dgfs_kv *next = e->next;
			dgfs_blob_put(e->blob);
			free(e);
			e = next;
		}
	}
	for (int i = 0; i < fs->n_prefixes; i++)
		free(fs->prefixes[i]);
	free(fs->prefixes);
	free(fs->kv);
	free(fs->pool);
	free(fs->tasks);
	free(fs->list);
	free(fs->cluster_text);
	free(fs->master);
	dgfs_jobcache_free(fs->jobs);
	pthread_mutex_destroy(&fs->lock);
	pthread_mutex_destroy(&fs->refresh_lock);
	free(fs);
}

/* --- clients ------------------------------------------------------------------ */

/* When this thread took its client: a request that failed after about
 * --timeout is a server that hangs (each get is followed by its put on the
 * same thread). */
static __thread double got_at;

struct dg_client *dgfs_client_get(struct dgfs *fs, int task, struct dg_err *err)
{
	struct dg_client *c = NULL;
	double now = dg_mono_s();

	got_at = now;
	pthread_mutex_lock(&fs->lock);
	double down = fs->tasks[task].down_until;
	if (now >= down && fs->pool[task].n > 0)
		c = fs->pool[task].idle[--fs->pool[task].n];
	pthread_mutex_unlock(&fs->lock);
	if (now < down) {
		/* It just let a request time out: the next ones fail at once
		 * instead of each waiting --timeout again (one deadline per
		 * operation, not per request). */
		dg_err_set(err, DG_EUNAVAILABLE, "%s (%s) did not answer within %.1f s; retrying "
			   "in %.1f s", fs->tasks[task].label, fs->tasks[task].address,
			   fs->timeout_ms / 1000.0, down - now);
		return NULL;
	}
	if (c)
		return c;
	c = dg_client_new(fs->tasks[task].address, fs->cfg.token, err);
	if (c)
		dg_client_set_timeout(c, fs->timeout_ms);
	return c;
}

void dgfs_client_put(struct dgfs *fs, int task, struct dg_client *c, enum dg_status st)
{
	bool ok = !dgfs_status_is_transport(st);

	if (!c)
		return;
	pthread_mutex_lock(&fs->lock);
	double now = dg_mono_s();
	if (!ok && now - got_at >= 0.9 * fs->timeout_ms / 1000.0)
		fs->tasks[task].down_until = now + fs->timeout_ms / 1000.0;
	if (ok && fs->pool[task].n < POOL_KEEP) {
		fs->pool[task].idle[fs->pool[task].n++] = c;
		c = NULL;
	}
	pthread_mutex_unlock(&fs->lock);
	dg_client_free(c);
}

bool dgfs_status_is_transport(enum dg_status st)
{
	return st == DG_EUNAVAILABLE || st == DG_ETIMEOUT || st == DG_EIO || st == DG_EINTERNAL;
}

/* --- the variable list --------------------------------------------------------- */

static int var_cmp(const void *pa, const void *pb)
{
	const struct dgfs_var *a = pa, *b = pb;

	return strcmp(a->info.name, b->info.name);
}

/* Fetch the list from every task (one GET /v1/vars each). A task that fails
 * fails the whole list: a partial list would show variables as deleted. */
static enum dg_status list_fetch(struct dgfs *fs, struct dgfs_var **out, int *n,
				 struct dg_err *err)
{
	struct dgfs_var *all = NULL;
	int n_all = 0;
	enum dg_status st = DG_OK;

	for (int t = 0; st == DG_OK && t < fs->n_tasks; t++) {
		struct dg_var_info *vi = NULL;
		int k = 0;
		struct dg_client *c = dgfs_client_get(fs, t, err);
		if (!c)
			st = err->code;
		else
			st = dg_var_list(c, NULL, &vi, &k, err);
		dgfs_client_put(fs, t, c, st);
		if (st != DG_OK) {
			dg_err_prefix(err, "%s", fs->tasks[t].label);
			break;
		}
		struct dgfs_var *grown = realloc(all, (size_t)(n_all + k + 1) * sizeof *all);
		if (!grown) {
			free(vi);
			st = dg_err_set(err, DG_ENOMEM, "out of memory listing variables");
			break;
		}
		all = grown;
		for (int i = 0; i < k; i++) {
			all[n_all].info = vi[i];
			all[n_all++].task = t;
		}
		free(vi);
	}
	if (st != DG_OK) {
		free(all);
		return st;
	}
	qsort(all, (size_t)n_all, sizeof *all, var_cmp);
	*out = all;
	*n = n_all;
	return DG_OK;
}

static bool list_fresh_locked(struct dgfs *fs)
{
	return fs->list_time > 0 && dg_mono_s() - fs->list_time <= fs->list_ttl_s;
}

/* Make the list fresh: one thread fetches, the others wait for it. */
static enum dg_status list_refresh(struct dgfs *fs, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	pthread_mutex_lock(&fs->refresh_lock);
	pthread_mutex_lock(&fs->lock);
	bool fresh = list_fresh_locked(fs);
	pthread_mutex_unlock(&fs->lock);
	if (!fresh) {
		struct dgfs_var *l = NULL;
		int n = 0;
		double t0 = dg_mono_s();
		st = list_fetch(fs, &l, &n, err);
		if (st == DG_OK) {
			pthread_mutex_lock(&fs->lock);
			free(fs->list);
			fs->list = l;
			fs->n_list = n;
			fs->list_time = t0;
			pthread_mutex_unlock(&fs->lock);
		}
	}
	pthread_mutex_unlock(&fs->refresh_lock);
	return st;
}

enum dg_status dgfs_list_get(struct dgfs *fs, struct dgfs_var **out, int *n, struct dg_err *err)
{
	enum dg_status st = list_refresh(fs, err);

	if (st != DG_OK)
		return st;
	pthread_mutex_lock(&fs->lock);
	*n = fs->n_list;
	*out = malloc((size_t)(fs->n_list + 1) * sizeof **out);
	if (*out)
		memcpy(*out, fs->list, (size_t)fs->n_list * sizeof **out);
	pthread_mutex_unlock(&fs->lock);
	if (!*out)
		return dg_err_set(err, DG_ENOMEM, "out of memory listing variables");
	return DG_OK;
}

enum dg_status dgfs_list_is_dir(struct dgfs *fs, const char *name, bool *dir,
			       struct dg_err *err)
{
	enum dg_status st = list_refresh(fs, err);
	size_t len = strlen(name);

	if (st != DG_OK)
		return st;
	pthread_mutex_lock(&fs->lock);
	/* binary search for the first name >= name + "/" */
	int lo = 0, hi = fs->n_list;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		const char *m = fs->list[mid].info.name;
		int c = strncmp(m, name, len);
		if (c < 0 || (c == 0 && (unsigned char)m[len] < '/'))
			lo = mid + 1;
		else
			hi = mid;
	}
	*dir = lo < fs->n_list && strncmp(fs->list[lo].info.name, name, len) == 0 &&
	       fs->list[lo].info.name[len] == '/';
	pthread_mutex_unlock(&fs->lock);
	return DG_OK;
}

void dgfs_list_invalidate(struct dgfs *fs)
{
	pthread_mutex_lock(&fs->lock);
	fs->list_time = 0;
	pthread_mutex_unlock(&fs->lock);
}

/* The list's entry of name, of any age, or NULL. fs->lock held. */
static struct dgfs_var *list_find_locked(struct dgfs *fs, const char *name)
{
	struct dgfs_var key;

	if (!fs->list)
		return NULL;
	snprintf(key.info.name, sizeof key.info.name, "%s", name);
	return bsearch(&key, fs->list, (size_t)fs->n_list, sizeof *fs->list, var_cmp);
}

/* Ask every task (HEAD) for name. */
static enum dg_status find_remote(struct dgfs *fs, const char *name, struct dg_var_info *info,
				  int *task, struct dg_err *err)
{
	struct dg_err first = { 0 };

	for (int t = 0; t < fs->n_tasks; t++) {
		struct dg_err e = { 0 };
		enum dg_status st;
		struct dg_client *c = dgfs_client_get(fs, t, &e);
		st = c ? dg_var_stat(c, name, info, &e) : e.code;
		dgfs_client_put(fs, t, c, st);
		if (st == DG_OK) {
			*task = t;
			return DG_OK;
		}
		if (st != DG_ENOTFOUND && first.code == DG_OK) {
			first = e;
			dg_err_prefix(&first, "%s", fs->tasks[t].label);
		}
	}
	if (first.code != DG_OK) {
		if (err)
			*err = first;
		return first.code;
	}
	return dg_err_set(err, DG_ENOTFOUND, "variable '%s' not found on any ps task", name);
}

enum dg_status dgfs_var_find(struct dgfs *fs, const char *name, bool fresh_needed,
			     struct dg_var_info *info, int *task, struct dg_err *err)
{
	if (fresh_needed) {
		enum dg_status st = find_remote(fs, name, info, task, err);
		if (st != DG_OK)
			return st;
		/* a variable that moved: later readers ask its new task first
		 * (dgfs_var_hint); the listed size and mtime stay until the
		 * list is fetched again */
		pthread_mutex_lock(&fs->lock);
		struct dgfs_var *hit = list_find_locked(fs, name);
		if (hit)
			hit->task = *task;
		pthread_mutex_unlock(&fs->lock);
		return DG_OK;
	}
	enum dg_status st = list_refresh(fs, err);
	if (st != DG_OK)
		return st;
	pthread_mutex_lock(&fs->lock);
	struct dgfs_var *hit = list_find_locked(fs, name);
	if (hit) {
		*info = hit->info;
		*task = hit->task;
	}
	pthread_mutex_unlock(&fs->lock);
	if (!hit)
		return dg_err_set(err, DG_ENOTFOUND, "variable '%s' not found", name);
	return DG_OK;
}

bool dgfs_var_hint(struct dgfs *fs, const char *name, struct dg_var_info *info, int *task)
{
	pthread_mutex_lock(&fs->lock);
	struct dgfs_var *hit = list_find_locked(fs, name);
	if (hit) {
		*info = hit->info;
		*task = hit->task;
	}
	pthread_mutex_unlock(&fs->lock);
	return hit != NULL;
}

enum dg_status dgfs_place_new(struct dgfs *fs, int *task, struct dg_err *err)
{
	enum dg_status st = DG_OK;
	int64_t *bytes;

	*task = 0;
	if (fs->n_tasks <= 1)
		return DG_OK;
	if (!(bytes = calloc((size_t)fs->n_tasks, sizeof *bytes)))
		return dg_err_set(err, DG_ENOMEM, "out of memory placing a new variable");
	for (int t = 0; t < fs->n_tasks && st == DG_OK; t++) {
		json_t *h = NULL;
		struct dg_client *c = dgfs_client_get(fs, t, err);
		st = c ? dg_client_health(c, &h, err) : err->code;
		dgfs_client_put(fs, t, c, st);
		if (st != DG_OK) {
			dg_err_prefix(err, "place a new variable: %s", fs->tasks[t].label);
			break;
		}
		bytes[t] = json_integer_value(json_object_get(h, "bytes"));
		json_decref(h);
	}
	if (st == DG_OK)
		*task = dg_cluster_pick_fewest_bytes(bytes, NULL, fs->n_tasks);
	free(bytes);
	return st;
}

/* --- prefixes ------------------------------------------------------------------ */

static bool is_under(const char *s, const char *dir)
{
	size_t n = strlen(dir);

	return strncmp(s, dir, n) == 0 && s[n] == '/';
}

bool dgfs_prefix_has(struct dgfs *fs, const char *name)
{
	bool found = false;

	pthread_mutex_lock(&fs->lock);
	for (int i = 0; i < fs->n_prefixes && !found; i++)
		found = strcmp(fs->prefixes[i], name) == 0 || is_under(fs->prefixes[i], name);
	pthread_mutex_unlock(&fs->lock);
	return found;
}

int dgfs_prefix_add(struct dgfs *fs, const char *name)
{
	int rc = 0;
	char *copy = strdup(name);

	pthread_mutex_lock(&fs->lock);
	char **grown = copy ? realloc(fs->prefixes, (size_t)(fs->n_prefixes + 1) * sizeof *grown)
			    : NULL;
	if (!grown) {
		free(copy);
		rc = -ENOMEM;
	} else {
		fs->prefixes = grown;
		fs->prefixes[fs->n_prefixes++] = copy;
	}
	pthread_mutex_unlock(&fs->lock);
	return rc;
}

bool dgfs_prefix_remove(struct dgfs *fs, const char *name)
{
	bool found = false;

	pthread_mutex_lock(&fs->lock);
	for (int i = 0; i < fs->n_prefixes; i++) {
		if (strcmp(fs->prefixes[i], name) == 0) {
			free(fs->prefixes[i]);
			fs->prefixes[i] = fs->prefixes[--fs->n_prefixes];
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&fs->lock);
	return found;
}

void dgfs_prefix_forget_parents(struct dgfs *fs, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	for (int i = 0; i < fs->n_prefixes;) {
		if (is_under(name, fs->prefixes[i])) {
			free(fs->prefixes[i]);
			fs->prefixes[i] = fs->prefixes[--fs->n_prefixes];
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&fs->lock);
}

/* --- per-name facts -------------------------------------------------------------- */

/* The entry of (view, name), created when create is set. fs->lock held. */
static struct dgfs_kv *kv_lookup(struct dgfs *fs, int view, const char *name, bool create)
{
	uint64_t h = 1469598103934665603ull ^ (uint64_t)view;

	for (const char *p = name; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	struct dgfs_kv **slot = &fs->kv[h % KV_BUCKETS];
	for (struct dgfs_kv *e = *slot; e; e = e->next)
		if (e->view == view && strcmp(e->name, name) == 0)
			return e;
	if (!create)
		return NULL;
	size_t n = strlen(name);
	struct dgfs_kv *e = calloc(1, sizeof *e + n + 1);
	if (!e)
		return NULL;
	e->view = view;
	memcpy(e->name, name, n + 1);
	e->next = *slot;
	*slot = e;
	return e;
}

struct dgfs_blob *dgfs_blob_new(char *data, size_t len, bool aligned, uint64_t version)
{
	struct dgfs_blob *b = calloc(1, sizeof *b);

	if (b) {
		b->data = data;
		b->len = len;
		b->aligned = aligned;
		b->version = version;
		atomic_init(&b->refs, 1);
	}
	return b;
}

void dgfs_blob_get(struct dgfs_blob *b)
{
	atomic_fetch_add(&b->refs, 1);
}

void dgfs_blob_put(struct dgfs_blob *b)
{
	if (!b || atomic_fetch_sub(&b->refs, 1) != 1)
		return;
	if (b->aligned)
		dg_free_aligned(b->data);
	else
		free(b->data);
	free(b);
}

/* Forget e's pages (no version) and its blob; the blob to put after the
 * lock (its memory may be large to unmap) is returned. fs->lock held. */
static struct dgfs_blob *kv_forget(struct dgfs *fs, struct dgfs_kv *e)
{
	struct dgfs_blob *b = e->blob;

	e->cache_version = 0;
	e->cache_full = false;
	if (b)
		fs->blob_bytes -= b->len;
	e->blob = NULL;
	return b;
}

bool dgfs_cache_open(struct dgfs *fs, int view, const char *name, int task, uint64_t version,
		     bool only_cached, bool *keep, struct dgfs_blob **blob)
{
	struct dgfs_blob *drop = NULL;
	bool use = false;

	*keep = false;
	if (blob)
		*blob = NULL;
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, true);
	bool same = e && e->cache_version == version && e->cache_task == task;
	if (e && only_cached && (!same || e->writers > 0 ||
				 !e->cache_full || !e->blob || e->blob->version != version ||
				 !blob)) {
		e = NULL;
	} else if (e && only_cached) {
		/* the pages are all there, and the blob backs any the kernel drops */
		*keep = true;
		dgfs_blob_get(e->blob);
		*blob = e->blob;
		use = true;
	} else if (e && e->cache_users == 0) {
		/* nobody fills the cache: keep it if it holds this version; else
		 * the caller drops it (dgfs_cache_ready follows), and until then
		 * the pages are of no version another reader could rely on */
		*keep = same;
		if (!*keep)
			drop = kv_forget(fs, e);
		use = true;
	} else if (same) {
		*keep = true;
		use = true;
	}
	if (use)
		e->cache_users++;
	pthread_mutex_unlock(&fs->lock);
	dgfs_blob_put(drop);
	return use;
}

void dgfs_cache_writer(struct dgfs *fs, int view, const char *name, int delta)
{
	struct dgfs_blob *drop = NULL;

	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, delta > 0);
	if (e) {
		e->writers += delta;
		if (delta > 0)
			drop = kv_forget(fs, e);
	}
	pthread_mutex_unlock(&fs->lock);
	dgfs_blob_put(drop);
}

void dgfs_cache_ready(struct dgfs *fs, int view, const char *name, int task, uint64_t version)
{
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, false);
	if (e && e->cache_version == 0) {
		e->cache_version = version;
		e->cache_task = task;
	}
	pthread_mutex_unlock(&fs->lock);
}

bool dgfs_cache_kept(struct dgfs *fs, int view, const char *name, int *task)
{
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, false);
	/* the conditions of dgfs_cache_open's only_cached, but the version */
	bool kept = e && e->cache_full && e->writers == 0 && e->blob &&
		    e->blob->version == e->cache_version;
	if (kept)
		*task = e->cache_task;
	pthread_mutex_unlock(&fs->lock);
	return kept;
}

/* The entry holding the oldest published blob, other than keep. fs->lock held. */
static struct dgfs_kv *oldest_blob(struct dgfs *fs, const struct dgfs_kv *keep)
{
	struct dgfs_kv *old = NULL;

	for (int b = 0; b < KV_BUCKETS; b++)
		for (struct dgfs_kv *e = fs->kv[b]; e; e = e->next)
			if (e->blob && e != keep && (!old || e->blob_seq < old->blob_seq))
				old = e;
	return old;
}

/* Blobs to put once fs->lock is released (the last put frees a large block). */
struct drops {
	struct dgfs_blob *stack[8], **b;
	int n, cap;
};

/* Take b into d; false (nothing taken) when out of memory. */
static bool drops_add(struct drops *d, struct dgfs_blob *b)
{
	if (d->n == d->cap) {
		int cap = 2 * d->cap;
		struct dgfs_blob **g = d->b == d->stack ? malloc((size_t)cap * sizeof *g)
						       : realloc(d->b, (size_t)cap * sizeof *g);
		if (!g)
			return false;
		if (d->b == d->stack)
			memcpy(g, d->stack, sizeof d->stack);
		d->b = g;
		d->cap = cap;
	}
	d->b[d->n++] = b;
	return true;
}

void dgfs_cache_full(struct dgfs *fs, int view, const char *name, int task, uint64_t version,
		     struct dgfs_blob *blob)
{
	struct drops d = { .n = 0, .cap = 8 };

	d.b = d.stack;
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, false);
	/* only a blob of the pages' version backs them; one larger than the
	 * whole budget is not kept (later readers fetch instead of relying on
	 * pages nothing backs) */
	if (e && e->cache_version == version && e->cache_task == task && e->writers == 0 && blob &&
	    blob->version == version && blob->len <= fs->blob_budget) {
		if (e->blob != blob && (!e->blob || drops_add(&d, e->blob))) {
			if (e->blob)
				fs->blob_bytes -= e->blob->len;
			dgfs_blob_get(blob);
			e->blob = blob;
			fs->blob_bytes += blob->len;
			e->blob_seq = ++fs->blob_seq;
		}
		e->cache_full = true;
		/* within the budget: the oldest go, as many as it takes (their
		 * pages stay, but new readers fetch: nothing backs them any more) */
		while (fs->blob_bytes > fs->blob_budget) {
			struct dgfs_kv *old = oldest_blob(fs, e);
			if (!old || !drops_add(&d, old->blob))
				break;
			fs->blob_bytes -= old->blob->len;
			old->blob = NULL;
			old->cache_full = false;
		}
	}
	pthread_mutex_unlock(&fs->lock);
	for (int i = 0; i < d.n; i++)
		dgfs_blob_put(d.b[i]);
	if (d.b != d.stack)
		free(d.b);
}

void dgfs_cache_close(struct dgfs *fs, int view, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, false);
	if (e && e->cache_users > 0)
		e->cache_users--;
	pthread_mutex_unlock(&fs->lock);
}

bool dgfs_kv_text_size(struct dgfs *fs, const char *name, uint64_t version, uint64_t *size)
{
	bool hit = false;

	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, DGFS_TEXT, name, false);
	if (e && e->text_version == version && version != 0) {
		*size = e->text_size;
		hit = true;
	}
	pthread_mutex_unlock(&fs->lock);
	return hit;
}

void dgfs_kv_set_text_size(struct dgfs *fs, const char *name, uint64_t version, uint64_t size)
{
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, DGFS_TEXT, name, true);
	if (e) {
		e->text_version = version;
		e->text_size = size;
	}
	pthread_mutex_unlock(&fs->lock);
}

void dgfs_pending_add(struct dgfs *fs, int view, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, true);
	if (e)
		e->pending++;
	pthread_mutex_unlock(&fs->lock);
}

void dgfs_pending_remove(struct dgfs *fs, int view, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, false);
	if (e && e->pending > 0)
		e->pending--;
	pthread_mutex_unlock(&fs->lock);
}

bool dgfs_pending_has(struct dgfs *fs, int view, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	struct dgfs_kv *e = kv_lookup(fs, view, name, false);
	bool has = e && e->pending > 0;
	pthread_mutex_unlock(&fs->lock);
	return has;
}

/* --- what an open starts from ------------------------------------------------------ */

/* The version of the variable (HEAD) on the task the list named; where it is
 * not there any more, where it is now. */
static enum dg_status stat_at(struct dgfs *fs, const char *name, struct dg_var_info *info,
			      int *task, struct dg_err *err)
{
	struct dg_client *c = dgfs_client_get(fs, *task, err);
	enum dg_status st = c ? dg_var_stat(c, name, info, err) : err->code;

	dgfs_client_put(fs, *task, c, st);
	if (st != DG_ENOTFOUND)
		return st;
	dg_err_clear(err);
	return dgfs_var_find(fs, name, true, info, task, err);
}

enum dg_status dgfs_cache_open_lookup(struct dgfs *fs, int view, const char *name, bool writable,
				      bool reader, struct dg_var_info *info, int *task, bool *head,
				      bool *kept, bool *cached, struct dgfs_blob **blob,
				      struct dg_err *err)
{
	/* One round trip for a read-only open of a variable the list places:
	 * the GET goes to that task at once, its headers telling the dtype,
	 * shape and version a HEAD would. Only a kept copy of the view (of that
	 * task) needs the version first (HEAD: is the copy still the value?).
	 * Writers (and names the list lacks) find the variable first, on every
	 * task if need be. A 404 from the listed task means the variable moved
	 * or went: search (dgfs_var_find fresh), then GET once more. */
	bool hinted = !writable && dgfs_var_hint(fs, name, info, task);
	int copy_task = -1;
	enum dg_status st = DG_OK;

	*head = !hinted || (reader && dgfs_cache_kept(fs, view, name, &copy_task) &&
			    copy_task == *task);
	*kept = false;
	if (*head)
		st = hinted ? stat_at(fs, name, info, task, err)
			    : dgfs_var_find(fs, name, true, info, task, err);
	if (st == DG_OK && reader && *head)
		*kept = dgfs_cache_open(fs, view, name, *task, info->version, true, cached, blob);
	return st;
}
