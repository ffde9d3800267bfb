/* What `dg mount` shows without opening anything (ops.h): the attributes
 * getattr answers (a variable's size in each view, directories from the
 * variable list and mkdir'ed prefixes, queues, jobs/), the entries readdir
 * lists, and the content of the generated read-only files (cluster,
 * queues/NAME). Asks the servers through cache.c and jobs.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dg/codec.h"
#include "dg/http.h"
#include "ops.h"

#define TEXT_SIZE_MAX ((uint64_t)16 << 20)   /* raw bytes above which text/ reports size 0 */

/* --- attributes ---------------------------------------------------------------- */

static time_t mount_time;              /* mtime of the directories */

void dgfs_attr_init(void)
{
	mount_time = time(NULL);
}

void dgfs_fill_dir(struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_mtime = st->st_atime = st->st_ctime = mount_time;
	st->st_mode = S_IFDIR | 0755;
	st->st_nlink = 2;
	st->st_uid = getuid();
	st->st_gid = getgid();
}

void dgfs_fill_file(struct dgfs *fs, struct stat *st, mode_t mode, uint64_t size,
		    double mtime)
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
		return dgfs_fail(v->name, "text size of", &err);
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
	dgfs_fill_file(fs, st, 0644, size, v->mtime);
	return 0;
}

int dgfs_stat_var(struct dgfs *fs, const struct dgfs_path *p, struct stat *st)
{
	struct dg_err err = { 0 };
	struct dg_var_info v;
	int task;
	bool dir;

	if (!p->name[0]) {
		dgfs_fill_dir(st);
		return 0;
	}
	if (dgfs_pending_has(fs, p->view, p->name) && (p->view != DGFS_NPY || p->npy_suffix)) {
		dgfs_fill_file(fs, st, 0644, 0, (double)time(NULL));
		return 0;
	}
	enum dg_status s = dgfs_var_find(fs, p->name, false, &v, &task, &err);
	if (s == DG_OK && (p->view != DGFS_NPY || p->npy_suffix))
		return var_stat(fs, p, &v, task, st);
	if (s != DG_OK && s != DG_ENOTFOUND)
		return dgfs_fail(p->name, "stat", &err);
	if (p->view == DGFS_NPY && p->npy_suffix)
		return -ENOENT;
	if (dgfs_prefix_has(fs, p->name)) {
		dgfs_fill_dir(st);
		return 0;
	}
	if (dgfs_list_is_dir(fs, p->name, &dir, &err) != DG_OK)
		return dgfs_fail(p->name, "stat", &err);
	if (!dir)
		return -ENOENT;
	dgfs_fill_dir(st);
	return 0;
}

int dgfs_stat_rows(struct dgfs *fs, const char *name, struct stat *st)
{
	struct dgfs_path p = { .view = DGFS_VARS };
	struct dg_err err = { 0 };
	struct dg_var_info v;
	const char *list;
	int task;

	if (strlen(name) < sizeof p.name)
		strcpy(p.name, name);
	/* NAME itself (a variable, or a directory of them) is a directory */
	if (!name[0] || dgfs_stat_var(fs, &p, st) == 0) {
		dgfs_fill_dir(st);
		return 0;
	}
	if (!dgfs_rows_split(name, p.name, sizeof p.name, &list))
		return -ENOENT;
	enum dg_status s = dgfs_var_find(fs, p.name, false, &v, &task, &err);
	if (s != DG_OK)
		return s == DG_ENOTFOUND ? -ENOENT : dgfs_fail(name, "stat rows/", &err);
	dgfs_fill_file(fs, st, 0444, 0, v.mtime);
	return 0;
}

enum dg_status dgfs_text_rows(struct dgfs *fs, const char *name, struct dg_buf *out,
			      struct dg_err *err)
{
	char var[DG_VAR_NAME_MAX + 1];
	const char *list;
	struct dg_var_info v;
	int task;
	enum dg_status st;

	if (!dgfs_rows_split(name, var, sizeof var, &list))
		return dg_err_set(err, DG_ENOTFOUND, "rows/%s names no rows", name);
	if ((st = dgfs_var_find(fs, var, false, &v, &task, err)) != DG_OK)
		return st;
	struct dg_client *c = dgfs_client_get(fs, task, err);
	st = c ? dg_var_get_rows_encoded(c, var, list, DG_ENC_TEXT, out, NULL, err) : err->code;
	dgfs_client_put(fs, task, c, st);
	return st;
}

/* GET /v1/queues of every task: names appended to out (NUL-separated). */
static enum dg_status queue_names(struct dgfs *fs, struct dg_buf *out, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	for (int t = 0; st == DG_OK && t < fs->n_tasks; t++) {
		struct dg_client *c = dg_client_new(fs->tasks[t].address, fs->cfg.token, err);
		json_t *j = NULL, *q;
		size_t i;
		if (!c)
			return err->code;
		dg_client_set_timeout(c, fs->timeout_ms);
		st = dg_queue_list(c, &j, err);
		json_array_foreach(json_object_get(j, "queues"), i, q) {
			const char *name = json_string_value(json_object_get(q, "name"));
			if (name && st == DG_OK)
				st = dg_buf_append(out, name, strlen(name) + 1, err);
		}
		json_decref(j);
		dg_client_free(c);
	}
	return st;
}

int dgfs_stat_queue(struct dgfs *fs, const char *name)
{
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };
	int rc = -ENOENT;

	if (queue_names(fs, &b, &err) != DG_OK) {
		dg_buf_deinit(&b);
		return dgfs_fail(name, "list queues for", &err);
	}
	for (size_t off = 0; off < b.len; off += strlen(b.data + off) + 1)
		if (strcmp(b.data + off, name) == 0)
			rc = 0;
	dg_buf_deinit(&b);
	return rc;
}

/* Each of the NUL-separated names in b (freed here) as a directory entry. */
static int fill_names(struct dg_buf *b, void *buf, fuse_fill_dir_t filler)
{
	for (size_t o = 0; o < b->len; o += strlen(b->data + o) + 1)
		filler(buf, b->data + o, NULL, 0, 0);
	dg_buf_deinit(b);
	return 0;
}

/* jobs/, jobs/ID/ and jobs/ID/FILE (jobs.c): directories, and read-only
 * files whose size is that of their content now. */
int dgfs_stat_jobs(struct dgfs *fs, const char *name, struct stat *st)
{
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };
	char id[DG_VAR_NAME_MAX + 1];
	const char *file;
	int rc;

	if (!name[0]) {
		dgfs_fill_dir(st);
		return 0;
	}
	if ((rc = dgfs_jobs_split(name, id, sizeof id, &file)) != 0)
		return -rc;
	if (file[0] && !dgfs_job_file_is_known(file))
		return -ENOENT;
	enum dg_status s = dgfs_job_file(fs, id, file[0] ? file : "status", &b, &err);
	if (s == DG_OK) {
		if (file[0])
			dgfs_fill_file(fs, st, 0444, b.len, (double)time(NULL));
		else
			dgfs_fill_dir(st);
	}
	dg_buf_deinit(&b);
	return s == DG_OK ? 0 : dgfs_fail(name, "stat jobs/", &err);
}

int dgfs_readdir_jobs(struct dgfs *fs, const char *name, void *buf,
		      fuse_fill_dir_t filler)
{
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };
	char id[DG_VAR_NAME_MAX + 1];
	const char *file;
	int rc, n;

	if (!name[0]) {
		if (dgfs_jobs_list(fs, &b, &err) != DG_OK) {
			dg_buf_deinit(&b);
			return dgfs_fail("jobs", "list", &err);
		}
		return fill_names(&b, buf, filler);
	}
	if ((rc = dgfs_jobs_split(name, id, sizeof id, &file)) != 0)
		return -rc;
	if (file[0])
		return dgfs_job_file_is_known(file) ? -ENOTDIR : -ENOENT;
	if (dgfs_job_exists(fs, id, &err) != DG_OK)
		return dgfs_fail(name, "list jobs/", &err);
	const char *const *names = dgfs_job_file_names(&n);
	for (int i = 0; i < n; i++) {
		/* metrics.csv and steps.csv only where the master serves them */
		if (strcmp(names[i], "metrics.csv") == 0 || strcmp(names[i], "steps.csv") == 0) {
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

/* queues/: the queues of every task. */
int dgfs_readdir_queues(struct dgfs *fs, void *buf, fuse_fill_dir_t filler)
{
	struct dg_err err = { 0 };
	struct dg_buf b = { 0 };

	if (queue_names(fs, &b, &err) != DG_OK) {
		dg_buf_deinit(&b);
		return dgfs_fail("queues", "list", &err);
	}
	return fill_names(&b, buf, filler);
}

/* --- directories ------------------------------------------------------------- */

/* vars/, text/, npy/ (or a prefix of them): the listed variables and the
 * mkdir'ed prefixes directly under it. */
int dgfs_readdir_vars(struct dgfs *fs, const struct dgfs_path *p, void *buf,
		     fuse_fill_dir_t filler, enum fuse_readdir_flags flags)
{
	struct dg_err err = { 0 };
	struct dgfs_var *l = NULL;
	int n = 0;
	size_t plen = strlen(p->name);
	char last_dir[DG_VAR_NAME_MAX + 1] = "";
	char entry[DG_VAR_NAME_MAX + 8];

	if (dgfs_list_get(fs, &l, &n, &err) != DG_OK)
		return dgfs_fail(p->name[0] ? p->name : "/", "list", &err);
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
			dgfs_fill_dir(&st);
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

/* --- generated files ----------------------------------------------------------- */

/* /cluster: the spec, then each task's health. */
enum dg_status dgfs_text_cluster(struct dgfs *fs, struct dg_buf *out,
				 struct dg_err *err)
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
enum dg_status dgfs_text_queue(struct dgfs *fs, const char *name, struct dg_buf *out,
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
		/* What comes next and who holds what: the first queued ids and the
		 * leases (a file cannot also be a directory holding a peek file). */
		j = NULL;
		if (st == DG_OK && (c = dgfs_client_get(fs, t, err)) != NULL) {
			enum dg_status ps = dg_queue_peek(c, name, 10, &j, err);
			dgfs_client_put(fs, t, c, ps);
			if (ps != DG_OK)
				dg_err_clear(err);      /* an older server: the state alone */
		}
		if (st == DG_OK && j) {
			char *ids = json_dumps(json_object_get(j, "ids"), JSON_ENCODE_ANY |
					       JSON_COMPACT);
			char *leases = json_dumps(json_object_get(j, "leases"), JSON_ENCODE_ANY |
						  JSON_COMPACT);
			if (ids && leases)
				st = dg_buf_printf(out, err, "next_ids %s\nlease_list %s\n", ids,
						   leases);
			free(ids);
			free(leases);
		}
		json_decref(j);
	}
	return st;
}
