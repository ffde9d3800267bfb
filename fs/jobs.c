/* The jobs/ tree of the mount (doc/filesystem.md, "jobs/"): the jobs of the
 * cluster's master (GET /v1/jobs) as directories jobs/ID/ holding status,
 * log, placement and metrics.csv, read-only files made from one request each.
 * Contents are kept for a short time (JOB_TTL_S) so that a getattr and the
 * open that follows it agree on the size, while a running job's files still
 * change from one `cat` to the next. Neighbours: ops.c calls it, cache.c
 * creates and frees its cache with the mount's state; it calls only core (the
 * typed job client, the clock), never back into cache.c. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "dg/clock.h"
#include "dg/http.h"
#include "dg/job_client.h"
#include "dg/log.h"
#include "fs.h"

#define JOB_TTL_S 0.5                   /* reuse of a fetched job file */
#define JOB_CACHE_MAX 64                /* job files kept at once */
#define EVENT_PAGES_MAX 1000            /* events requests per log (a server paging them) */

/* One fetched file of a job. */
struct dgfs_jobfile {
	char key[DG_VAR_NAME_MAX + 32]; /* "ID/FILE" */
	struct dg_buf body;
	double at;                      /* monotonic seconds of the fetch */
};

struct dgfs_jobcache {
	pthread_mutex_t lock;
	struct dgfs_jobfile files[JOB_CACHE_MAX];
	int n;
};

static const char *const job_files[] = { "status", "log", "placement", "metrics.csv",
					 "steps.csv" };

struct dgfs_jobcache *dgfs_jobcache_new(void)
{
	struct dgfs_jobcache *jc = calloc(1, sizeof *jc);

	if (jc)
		pthread_mutex_init(&jc->lock, NULL);
	return jc;
}

void dgfs_jobcache_free(struct dgfs_jobcache *jc)
{
	if (!jc)
		return;
	for (int i = 0; i < jc->n; i++)
		dg_buf_deinit(&jc->files[i].body);
	pthread_mutex_destroy(&jc->lock);
	free(jc);
}

bool dgfs_job_file_is_known(const char *file)
{
	for (size_t i = 0; i < sizeof job_files / sizeof job_files[0]; i++)
		if (strcmp(file, job_files[i]) == 0)
			return true;
	return false;
}

/* A client of the master for one file (NULL with *err set: no master, out
 * of memory). */
static struct dg_http_client *master_client(struct dgfs *fs, struct dg_err *err)
{
	if (!fs->master) {
		dg_err_set(err, DG_ENOTFOUND, "the cluster has no master (no task outside job ps)");
		return NULL;
	}
	return dg_http_client_new(fs->master, fs->cfg.token, fs->timeout_ms, err);
}

enum dg_status dgfs_jobs_list(struct dgfs *fs, struct dg_buf *ids, struct dg_err *err)
{
	struct dg_http_client *h;
	json_t *j = NULL, *job;
	enum dg_status st;
	size_t i;

	if (!fs->master)
		return DG_OK;           /* only ps tasks: no job can exist */
	if (!(h = master_client(fs, err)))
		return err ? err->code : DG_ENOMEM;
	st = dg_job_list(h, &j, err);
	dg_http_client_free(h);
	if (st == DG_ENOTFOUND)
		return DG_OK;   /* a `dg ps` (no master routes) has no jobs */
	if (st != DG_OK) {
		dg_err_prefix(err, "master %s", fs->master);
		return st;
	}
	if (!json_is_array(json_object_get(j, "jobs")))
		st = dg_err_set(err, DG_EIO, "master %s: GET /v1/jobs did not answer a job list",
				fs->master);
	json_array_foreach(json_object_get(j, "jobs"), i, job) {
		const char *id = json_string_value(json_object_get(job, "id"));
		/* an id must be one path component */
		if (st == DG_OK && id && id[0] && !strchr(id, '/') && strlen(id) <= DG_VAR_NAME_MAX)
			st = dg_buf_append(ids, id, strlen(id) + 1, err);
	}
	json_decref(j);
	return st;
}

/* The job's events from 0 without waiting, following the next index until
 * the master has nothing more (it may page a long log). */
static enum dg_status fetch_log(struct dg_http_client *h, const char *id, struct dg_buf *out,
				struct dg_err *err)
{
	int64_t from = 0;

	for (int page = 0; page < EVENT_PAGES_MAX; page++) {
		int64_t next = -1;
		size_t before = out->len;
		enum dg_status st = dg_job_events(h, id, from, 0, out, &next, err);
		if (st != DG_OK)
			return st;
		if (next <= from || out->len == before)
			break;
		from = next;
	}
	return DG_OK;
}

/* status (indented JSON) or placement (the explain text) of job id. */
static enum dg_status fetch_status(struct dg_http_client *h, const char *id, const char *file,
				   struct dg_buf *out, struct dg_err *err)
{
	json_t *j = NULL;
	enum dg_status st = dg_job_status(h, id, &j, err);

	if (st != DG_OK)
		return st;
	if (strcmp(file, "status") == 0) {
		/* indented: read by people with cat, by scripts with a JSON parser */
		char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		st = s ? dg_buf_printf(out, err, "%s\n", s)
		       : dg_err_set(err, DG_ENOMEM, "out of memory");
		free(s);
	} else {
		const char *ex = json_string_value(json_object_get(j, "explain"));
		size_t n = ex ? strlen(ex) : 0;
		st = dg_buf_append(out, ex ? ex : "", n, err);
		if (st == DG_OK && n && ex[n - 1] != '\n')
			st = dg_buf_append(out, "\n", 1, err);
	}
	json_decref(j);
	return st;
}

/* Fetch FILE of job id into out, one client for the file. */
static enum dg_status fetch_file(struct dgfs *fs, const char *id, const char *file,
				 struct dg_buf *out, struct dg_err *err)
{
	struct dg_http_client *h = master_client(fs, err);
	enum dg_status st;

	if (!h)
		return err ? err->code : DG_ENOMEM;
	if (strcmp(file, "log") == 0)
		st = fetch_log(h, id, out, err);
	else if (strcmp(file, "metrics.csv") == 0)
		st = dg_job_metrics(h, id, out, err);
	else if (strcmp(file, "steps.csv") == 0)
		st = dg_job_steps(h, id, out, err);
	else
		st = fetch_status(h, id, file, out, err);
	dg_http_client_free(h);
	if (st != DG_OK)
		dg_err_prefix(err, "master %s", fs->master);
	return st;
}

/* The cached entry of key, when fresh. jc->lock held. */
static struct dgfs_jobfile *cache_find(struct dgfs_jobcache *jc, const char *key, double now)
{
	for (int i = 0; i < jc->n; i++)
		if (strcmp(jc->files[i].key, key) == 0 && now - jc->files[i].at <= JOB_TTL_S)
			return &jc->files[i];
	return NULL;
}

/* Keep a copy of body under key, replacing the entry of key or the oldest. */
static void cache_store(struct dgfs_jobcache *jc, const char *key, const struct dg_buf *body,
			double at)
{
	struct dg_buf copy = { 0 };

	if (dg_buf_append(&copy, body->data ? body->data : "", body->len, NULL) != DG_OK)
		return;         /* not kept: the next read fetches again */
	pthread_mutex_lock(&jc->lock);
	int slot = -1;
	for (int i = 0; i < jc->n && slot < 0; i++)
		if (strcmp(jc->files[i].key, key) == 0)
			slot = i;
	if (slot < 0 && jc->n < JOB_CACHE_MAX)
		slot = jc->n++;
	for (int i = 0; slot < 0 && i < jc->n; i++)
		if (slot < 0 || jc->files[i].at < jc->files[slot].at)
			slot = i;
	if (slot < 0)
		slot = 0;
	dg_buf_deinit(&jc->files[slot].body);
	snprintf(jc->files[slot].key, sizeof jc->files[slot].key, "%s", key);
	jc->files[slot].body = copy;
	jc->files[slot].at = at;
	pthread_mutex_unlock(&jc->lock);
}

enum dg_status dgfs_job_file(struct dgfs *fs, const char *id, const char *file,
			     struct dg_buf *out, struct dg_err *err)
{
	char key[sizeof ((struct dgfs_jobfile *)0)->key];
	double now = dg_mono_s();
	enum dg_status st;

	if (!dgfs_job_file_is_known(file))
		return dg_err_set(err, DG_ENOTFOUND, "jobs/%s has no file '%s'", id, file);
	snprintf(key, sizeof key, "%s/%s", id, file);
	pthread_mutex_lock(&fs->jobs->lock);
	struct dgfs_jobfile *hit = cache_find(fs->jobs, key, now);
	st = hit ? dg_buf_append(out, hit->body.data ? hit->body.data : "", hit->body.len, err)
		 : DG_OK;
	pthread_mutex_unlock(&fs->jobs->lock);
	if (hit || st != DG_OK)
		return st;
	st = fetch_file(fs, id, file, out, err);
	if (st == DG_OK)
		cache_store(fs->jobs, key, out, now);
	return st;
}

enum dg_status dgfs_job_exists(struct dgfs *fs, const char *id, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	enum dg_status st = dgfs_job_file(fs, id, "status", &b, err);

	dg_buf_deinit(&b);
	return st;
}

int dgfs_jobs_split(const char *name, char *id, size_t id_size, const char **file)
{
	const char *slash = strchr(name, '/');
	size_t n = slash ? (size_t)(slash - name) : strlen(name);

	if (n == 0 || n >= id_size)
		return ENOENT;
	memcpy(id, name, n);
	id[n] = '\0';
	*file = slash ? slash + 1 : "";
	if (strchr(*file, '/'))
		return ENOENT;  /* jobs/ID/FILE is as deep as the tree goes */
	return 0;
}

const char *const *dgfs_job_file_names(int *n)
{
	*n = (int)(sizeof job_files / sizeof job_files[0]);
	return job_files;
}
