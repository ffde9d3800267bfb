/* The checkpoint directory of `dg checkpoint save DIR` / `restore DIR`: a
 * variable streamed from its ps into DIR.tmp-XXXXXX/NAME.npy (bfloat16, which
 * .npy cannot hold: NAME.raw), the manifest, the atomic move into place, and on
 * the way back the manifest's checks and each file's check (header, size,
 * CRC-32) before anything is sent to a server. Declared in ckpt_dir.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt_dir.h"
#include "dg/codec.h"
#include "dg_config.h"

#define CHUNK ((size_t)1 << 20)         /* bytes read at a time when checking a file */
#define NPY_HEAD_MAX ((size_t)1 << 16)  /* bytes read for a .npy header (dg writes < 256) */

/* root/rel into buf; DG_EINVAL when it does not fit. */
static enum dg_status path_join(char *buf, size_t n, const char *root, const char *rel,
				struct dg_err *err)
{
	if ((size_t)snprintf(buf, n, "%s/%s", root, rel) >= n)
		return dg_err_set(err, DG_EINVAL, "path '%s/%s' is too long", root, rel);
	return DG_OK;
}

/* mkdir -p of path (borrowed; a copy is cut at each '/'). */
static enum dg_status mkdir_p(const char *path, struct dg_err *err)
{
	char buf[PATH_MAX];
	struct stat sb;

	if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
		return dg_err_set(err, DG_EINVAL, "path '%s' is too long", path);
	for (char *p = buf + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char c = *p;
		*p = '\0';
		if (mkdir(buf, 0777) != 0 && errno != EEXIST)
			return dg_err_set(err, DG_EIO, "cannot create directory '%s': %s", buf,
					  strerror(errno));
		if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
			return dg_err_set(err, DG_EIO, "'%s' exists and is not a directory", buf);
		if (!(*p = c))
			return DG_OK;
	}
}

void ckpt_format_bytes(double b, char *buf, size_t n)
{
	static const char *const unit[] = { "B", "kB", "MB", "GB", "TB" };
	int u = 0;

	while (b >= 1000 && u < 4) {
		b /= 1000;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%.0f %s", b, unit[u]);
	else
		snprintf(buf, n, "%.2f %s", b, unit[u]);
}

/* --- the destination ---------------------------------------------------------- */

enum dest_kind { DEST_ABSENT, DEST_EMPTY, DEST_OLD };

static enum dg_status dest_kind(const char *dir, bool force, enum dest_kind *kind,
				struct dg_err *err)
{
	char path[PATH_MAX];
	struct stat sb;
	struct dirent *de;
	DIR *d;
	bool empty = true;

	if (stat(dir, &sb) != 0) {
		if (errno != ENOENT)
			return dg_err_set(err, DG_EIO, "cannot look at '%s': %s", dir,
					  strerror(errno));
		*kind = DEST_ABSENT;
		return DG_OK;
	}
	if (!S_ISDIR(sb.st_mode))
		return dg_err_set(err, DG_EEXIST, "'%s' exists and is not a directory", dir);
	if (!(d = opendir(dir)))
		return dg_err_set(err, DG_EIO, "cannot read directory '%s': %s", dir,
				  strerror(errno));
	while (empty && (de = readdir(d)))
		empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
	closedir(d);
	*kind = empty ? DEST_EMPTY : DEST_OLD;
	if (empty)
		return DG_OK;
	if (!force) {
		dg_err_set(err, DG_EEXIST, "checkpoint directory '%s' exists and is not empty",
			   dir);
		dg_err_hint(err, "choose a new DIR, or give --force to replace a previous "
			    "checkpoint");
		return DG_EEXIST;
	}
	/* --force replaces an old checkpoint only, never some other directory. */
	if (path_join(path, sizeof path, dir, CKPT_MANIFEST, err) != DG_OK)
		return err->code;
	json_t *j = stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ?
		    json_load_file(path, 0, NULL) : NULL;
	const char *fmt = json_string_value(json_object_get(j, "format"));
	bool ours = fmt && !strcmp(fmt, CKPT_FORMAT);
	json_decref(j);
	if (!ours) {
		dg_err_set(err, DG_EEXIST, "not replacing '%s': it is not a checkpoint (no %s "
			   "with \"format\": \"%s\")", dir, CKPT_MANIFEST, CKPT_FORMAT);
		dg_err_hint(err, "--force replaces only a directory written by 'dg checkpoint save "
			    "DIR'; choose another DIR");
		return DG_EEXIST;
	}
	return DG_OK;
}

enum dg_status ckpt_dest_check(const char *dir, bool force, struct dg_err *err)
{
	enum dest_kind k;

	return dest_kind(dir, force, &k, err);
}

char *ckpt_stage_new(const char *dir, struct dg_err *err)
{
	size_t n = strlen(dir) + 16;
	char *stage = malloc(n), *parent = strdup(dir);

	if (!stage || !parent) {
		dg_err_set(err, DG_ENOMEM, "out of memory");
		goto fail;
	}
	if (mkdir_p(dirname(parent), err) != DG_OK)
		goto fail;
	snprintf(stage, n, "%s.tmp-XXXXXX", dir);
	if (!mkdtemp(stage)) {
		dg_err_set(err, DG_EIO, "cannot create the staging directory '%s': %s", stage,
			   strerror(errno));
		goto fail;
	}
	/* mkdtemp makes it 0700; DIR gets the mode mkdir would give it. */
	mode_t mask = umask(0);
	umask(mask);
	chmod(stage, 0777 & ~mask);
	free(parent);
	return stage;
fail:
	free(stage);
	free(parent);
	return NULL;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

void ckpt_remove_tree(const char *path)
{
	nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int fsync_dir(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	int fd, e = 0;

	(void)sb;
	(void)ftw;
	if (flag != FTW_D && flag != FTW_DP)
		return 0;
	if ((fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return errno;
	if (fsync(fd) != 0)
		e = errno;
	close(fd);
	return e;      /* an errno value stops the walk; nftw returns it */
}

static void fsync_parent(const char *path)
{
	char *copy = strdup(path);
	int fd;

	if (!copy)
		return;
	if ((fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
		fsync(fd);
		close(fd);
	}
	free(copy);
}

enum dg_status ckpt_install(const char *stage, const char *dir, bool force, struct dg_err *err)
{
	enum dest_kind kind;

	if (dest_kind(dir, force, &kind, err) != DG_OK)
		return err->code;
	if (kind != DEST_OLD) {
		/* rename(2) replaces an empty directory. */
		if (rename(stage, dir) != 0)
			return dg_err_set(err, DG_EIO, "renaming '%s' to '%s': %s", stage, dir,
					  strerror(errno));
	} else if (renameat2(AT_FDCWD, stage, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
		fsync_parent(dir);               /* the exchange is durable before ... */
		ckpt_remove_tree(stage);         /* ... the old checkpoint goes */
	} else {
		/* A filesystem without RENAME_EXCHANGE: the old one moves aside first,
		 * so for a moment DIR is absent (never half written). */
		size_t n = strlen(stage) + 8;
		char *old = malloc(n);
		if (!old)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		snprintf(old, n, "%s.old", stage);
		if (rename(dir, old) != 0) {
			dg_err_set(err, DG_EIO, "moving the old '%s' aside: %s", dir,
				   strerror(errno));
			free(old);
			return DG_EIO;
		}
		if (rename(stage, dir) != 0) {
			dg_err_set(err, DG_EIO, "renaming '%s' to '%s': %s", stage, dir,
				   strerror(errno));
			rename(old, dir);
			free(old);
			return DG_EIO;
		}
		fsync_parent(dir);
		ckpt_remove_tree(old);
		free(old);
	}
	fsync_parent(dir);
	return DG_OK;
}

/* --- export ------------------------------------------------------------------- */

/* The streaming GET's sink: the file of one variable. A retried request starts
 * again at offset 0, possibly with a newer version: the file restarts too. */
struct sink {
	int fd;
	const char *path;
	bool started;
	uint64_t data;                  /* data bytes written */
	uint32_t crc;
	struct dg_var_info info;        /* the headers of the reply being written */
	struct dg_err werr;             /* a local failure; DG_OK when none */
};

static bool write_all(struct sink *s, const void *p, size_t n)
{
	for (size_t off = 0; off < n;) {
		ssize_t w = write(s->fd, (const char *)p + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			dg_err_set(&s->werr, DG_EIO, "writing '%s': %s", s->path, strerror(errno));
			return false;
		}
		off += (size_t)w;
	}
	return true;
}

static bool sink_start(struct sink *s, const struct dg_var_info *info)
{
	struct dg_buf h = { 0 };
	bool ok = true;

	if (ftruncate(s->fd, 0) != 0 || lseek(s->fd, 0, SEEK_SET) != 0) {
		dg_err_set(&s->werr, DG_EIO, "truncating '%s': %s", s->path, strerror(errno));
		return false;
	}
	if (info->dtype != DG_BF16) {
		ok = dg_npy_encode_header(info->dtype, &info->shape, &h, &s->werr) == DG_OK &&
		     write_all(s, h.data, h.len);
		dg_buf_deinit(&h);
	}
	s->started = true;
	s->data = 0;
	s->crc = (uint32_t)crc32_z(0, NULL, 0);
	s->info = *info;
	return ok;
}

static bool sink_body(void *ud, const struct dg_var_info *info, uint64_t offset, const void *p,
		      size_t n)
{
	struct sink *s = ud;

	if ((offset == 0 || !s->started) && !sink_start(s, info))
		return false;
	if (offset != s->data) {
		dg_err_set(&s->werr, DG_EINTERNAL, "variable '%s': body bytes out of order "
			   "(offset %" PRIu64 ", %" PRIu64 " written)", info->name, offset,
			   s->data);
		return false;
	}
	if (!write_all(s, p, n))
		return false;
	s->crc = (uint32_t)crc32_z(s->crc, p, n);
	s->data += n;
	return true;
}

/* Stream into the open file s->fd; *info gets the headers of what was written. */
static enum dg_status stream_var(struct dg_client *c, const char *name, struct sink *s,
				 struct dg_err *err)
{
	struct dg_var_info fin;
	enum dg_status st = dg_var_get_stream(c, name, DG_ENC_RAW, sink_body, s, &fin, err);

	if (s->werr.code != DG_OK) {
		*err = s->werr;
		return err->code;
	}
	if (st != DG_OK)
		return st;
	if (!s->started && !sink_start(s, &fin)) {      /* no body: zero elements */
		*err = s->werr;
		return err->code;
	}
	if (s->data != s->info.bytes)
		return dg_err_set(err, DG_EIO, "variable '%s': got %" PRIu64 " bytes, its dtype "
				  "and shape make %" PRIu64, name, s->data, s->info.bytes);
	if (fsync(s->fd) != 0)
		return dg_err_set(err, DG_EIO, "flushing '%s': %s", s->path, strerror(errno));
	return DG_OK;
}

/* A file for a variable whose NAME.npy cannot be one (a name that is a
 * directory of another variable's file, under manifest.json, or too long for
 * the filesystem): part linked as "#/N.ext", the first N free ('#' is in no
 * variable name, so these never meet a NAME.npy). rel gets the name. */
static enum dg_status spare_file(const char *root, const char *part, const char *ext, char *rel,
				 size_t rel_n, struct dg_err *err)
{
	char dir[PATH_MAX], final[PATH_MAX];
	enum dg_status st = path_join(dir, sizeof dir, root, "#", err);

	if (st == DG_OK && mkdir(dir, 0777) != 0 && errno != EEXIST)
		st = dg_err_set(err, DG_EIO, "cannot create directory '%s': %s", dir,
				strerror(errno));
	for (unsigned n = 1; st == DG_OK; n++) {
		snprintf(rel, rel_n, "#/%u.%s", n, ext);
		if ((st = path_join(final, sizeof final, root, rel, err)) != DG_OK)
			break;
		if (link(part, final) == 0)
			return DG_OK;
		if (errno != EEXIST)
			st = dg_err_set(err, DG_EIO, "cannot create '%s': %s", final,
					strerror(errno));
	}
	return st;
}

enum dg_status ckpt_export_var(const char *root, struct dg_client *c, const char *name,
			       const char *task, struct ckpt_var *out, struct dg_err *err)
{
	char part[PATH_MAX], final[PATH_MAX], rel[DG_VAR_NAME_MAX + 8];
	struct sink s = { .fd = -1, .path = part };
	enum dg_status st;
	char *slash;

	/* The name comes from the server: it must not lead out of root. */
	if ((st = dg_var_name_check(name, err)) != DG_OK)
		return st;
	/* NAME.npy, unless that cannot be a file of its own (spare_file) */
	bool spare = strncmp(name, CKPT_MANIFEST "/", strlen(CKPT_MANIFEST) + 1) == 0 ||
		     path_join(part, sizeof part, root, name, NULL) != DG_OK;
	if (!spare && (slash = strrchr(part, '/')) && slash > part + strlen(root)) {
		*slash = '\0';
		spare = mkdir_p(part, NULL) != DG_OK;
		*slash = '/';
	}
	/* '#' is in no variable name, so no file or directory of the checkpoint
	 * has this name, and it stays short whatever the variable's name. */
	if ((st = path_join(part, sizeof part, root, "#part", err)) != DG_OK)
		return st;
	if ((s.fd = open(part, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0)
		return dg_err_set(err, DG_EIO, "cannot create '%s': %s", part, strerror(errno));
	st = stream_var(c, name, &s, err);
	if (close(s.fd) != 0 && st == DG_OK)
		st = dg_err_set(err, DG_EIO, "closing '%s': %s", part, strerror(errno));
	const char *ext = s.info.dtype == DG_BF16 ? "raw" : "npy";
	if (st == DG_OK && !spare) {
		snprintf(rel, sizeof rel, "%s.%s", name, ext);
		if (path_join(final, sizeof final, root, rel, NULL) != DG_OK)
			spare = true;
	}
	/* link(2) refuses an existing name: a regular file there is this name
	 * again (two tasks holding the same variable); a directory there, or a
	 * name too long for the filesystem, sends the file to spare_file. */
	int le = 0;
	if (st == DG_OK && !spare && link(part, final) != 0) {
		struct stat sb;
		le = errno;
		if (le == ENAMETOOLONG || le == ENOTDIR || le == EISDIR ||
		    (le == EEXIST && lstat(final, &sb) == 0 && !S_ISREG(sb.st_mode)))
			spare = true;
	}
	if (st == DG_OK && spare) {
		st = spare_file(root, part, ext, rel, sizeof rel, err);
		le = 0;
	}
	if (st == DG_OK && le) {
		errno = le;
		if (errno == EEXIST) {
			dg_err_set(err, DG_EEXIST, "variable '%s' is on more than one task (again "
				   "on %s)", name, task);
			dg_err_hint(err, "remove the copies with 'dg var rm' on all but one task, "
				    "then save again");
			st = DG_EEXIST;
		} else {
			st = dg_err_set(err, DG_EIO, "cannot create '%s': %s", final,
					strerror(errno));
		}
	}
	unlink(part);
	if (st != DG_OK)
		return st;
	*out = (struct ckpt_var){ .dtype = s.info.dtype, .shape = s.info.shape,
				  .version = s.info.version, .bytes = s.data, .crc = s.crc,
				  .raw = s.info.dtype == DG_BF16 };
	snprintf(out->name, sizeof out->name, "%s", name);
	snprintf(out->task, sizeof out->task, "%s", task);
	snprintf(out->file, sizeof out->file, "%s", rel);
	return DG_OK;
}

static json_t *var_to_json(const struct ckpt_var *v)
{
	json_t *shape = json_array();

	for (int i = 0; shape && i < v->shape.ndim; i++)
		json_array_append_new(shape, json_integer(v->shape.dim[i]));
	return json_pack("{s:s, s:s, s:o, s:I, s:s, s:s, s:s, s:I, s:I}", "name", v->name,
			 "dtype", dg_dtype_name(v->dtype), "shape", shape,
			 "version", (json_int_t)v->version, "task", v->task, "file", v->file,
			 "encoding", v->raw ? "raw" : "npy", "bytes", (json_int_t)v->bytes,
			 "crc32", (json_int_t)v->crc);
}

/* The manifest's text: the header fields indented, then one variable per
 * line (readable, and diff shows what changed between two checkpoints). */
static enum dg_status manifest_text(const struct ckpt_var *vars, int n, json_t *tasks,
				    struct dg_buf *out, struct dg_err *err)
{
	char stamp[32];
	time_t now = time(NULL);
	struct tm tm;
	uint64_t total = 0;
	char *head = NULL;
	enum dg_status st = DG_OK;
	json_t *m;

	gmtime_r(&now, &tm);
	strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
	for (int i = 0; i < n; i++)
		total += vars[i].bytes;
	m = json_pack("{s:s, s:i, s:s, s:I, s:s, s:O, s:i, s:I}", "format", CKPT_FORMAT,
		      "version", CKPT_VERSION, "created", stamp, "created_unix",
		      (json_int_t)now, "dg_version", DG_VERSION, "tasks", tasks,
		      "count", n, "bytes", (json_int_t)total);
	if (!m || !(head = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER)) ||
	    strlen(head) < 2) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory writing the manifest");
		goto out;
	}
	head[strlen(head) - 2] = '\0';         /* "\n}": the object continues below */
	st = dg_buf_printf(out, err, "%s,\n \"variables\": [", head);
	for (int i = 0; st == DG_OK && i < n; i++) {
		json_t *v = var_to_json(&vars[i]);
		char *line = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
		if (line)
			st = dg_buf_printf(out, err, "%s\n  %s", i ? "," : "", line);
		else
			st = dg_err_set(err, DG_ENOMEM, "out of memory writing the manifest");
		free(line);
		json_decref(v);
	}
	if (st == DG_OK)
		st = dg_buf_printf(out, err, "\n ]\n}\n");
out:
	free(head);
	json_decref(m);
	return st;
}

enum dg_status ckpt_manifest_write(const char *root, const struct ckpt_var *vars, int n,
				   json_t *tasks, struct dg_err *err)
{
	char path[PATH_MAX];
	struct dg_buf text = { 0 };
	enum dg_status st;
	int e;

	if ((st = manifest_text(vars, n, tasks, &text, err)) != DG_OK ||
	    (st = path_join(path, sizeof path, root, CKPT_MANIFEST, err)) != DG_OK ||
	    (st = dg_write_file_atomic(path, text.data, text.len, err)) != DG_OK)
		goto out;
	if ((e = nftw(root, fsync_dir, 16, FTW_PHYS)) != 0)
		st = dg_err_set(err, DG_EIO, "flushing the directories under '%s': %s", root,
				e > 0 ? strerror(e) : strerror(errno));
out:
	dg_buf_deinit(&text);
	return st;
}

/* --- the manifest, read back -------------------------------------------------- */

void ckpt_manifest_deinit(struct ckpt_manifest *m)
{
	free(m->vars);
	*m = (struct ckpt_manifest){ 0 };
}

static enum dg_status bad_entry(struct dg_err *err, const char *dir, int i, const char *what)
{
	dg_err_set(err, DG_EINVAL, "%s/%s: variable %d: %s", dir, CKPT_MANIFEST, i, what);
	dg_err_hint(err, "the manifest was changed or damaged; use a checkpoint written by "
		    "'dg checkpoint save DIR'");
	return DG_EINVAL;
}

/* A non-negative JSON integer (below 2^63) or false. */
static bool get_u64(json_t *o, const char *key, uint64_t *out)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

static enum dg_status parse_shape(json_t *a, struct dg_shape *s)
{
	if (!json_is_array(a) || json_array_size(a) > DG_MAX_DIMS)
		return DG_EINVAL;
	s->ndim = (int)json_array_size(a);
	for (int i = 0; i < s->ndim; i++) {
		json_t *d = json_array_get(a, (size_t)i);
		if (!json_is_integer(d) || json_integer_value(d) < 0)
			return DG_EINVAL;
		s->dim[i] = json_integer_value(d);
	}
	return DG_OK;
}

static enum dg_status parse_var(const char *dir, int i, json_t *e, struct ckpt_var *v,
				struct dg_err *err)
{
	const char *name = json_string_value(json_object_get(e, "name"));
	const char *dt = json_string_value(json_object_get(e, "dtype"));
	const char *file = json_string_value(json_object_get(e, "file"));
	const char *enc = json_string_value(json_object_get(e, "encoding"));
	const char *task = json_string_value(json_object_get(e, "task"));
	struct dg_err e2 = { 0 };
	uint64_t crc = 0;
	int64_t numel;
	char msg[320];

	if (!json_is_object(e) || !name || dg_var_name_check(name, &e2) != DG_OK)
		return bad_entry(err, dir, i, e2.msg[0] ? e2.msg : "no \"name\"");
	snprintf(v->name, sizeof v->name, "%s", name);
	snprintf(v->task, sizeof v->task, "%s", task ? task : "");
	if (!dt || dg_dtype_parse(dt, &v->dtype, &e2) != DG_OK ||
	    strcmp(dt, dg_dtype_name(v->dtype)))
		return bad_entry(err, dir, i, "\"dtype\" is not a dtype name such as float32");
	if (parse_shape(json_object_get(e, "shape"), &v->shape) != DG_OK ||
	    dg_shape_numel(&v->shape, &numel, &e2) != DG_OK)
		return bad_entry(err, dir, i, "\"shape\" is not a list of at most 8 sizes");
	if (!get_u64(e, "bytes", &v->bytes) ||
	    v->bytes != (uint64_t)numel * dg_dtype_size(v->dtype))
		return bad_entry(err, dir, i, "\"bytes\" is not numel * the dtype's size");
	if (!get_u64(e, "crc32", &crc) || crc > UINT32_MAX)
		return bad_entry(err, dir, i, "\"crc32\" is not a 32-bit checksum");
	v->crc = (uint32_t)crc;
	if (!get_u64(e, "version", &v->version))
		v->version = 0;
	if (!enc || (strcmp(enc, "npy") && strcmp(enc, "raw")) ||
	    (v->dtype == DG_BF16 && strcmp(enc, "raw")))
		return bad_entry(err, dir, i, "\"encoding\" is not npy, or raw (bfloat16 is raw)");
	v->raw = !strcmp(enc, "raw");
	/* The file stays inside DIR: the same rules as a variable name, or a
	 * spare "#/N.npy" (spare_file). */
	size_t fl = file ? strlen(file) : 0;
	char stem[DG_VAR_NAME_MAX + 1] = "";
	if (fl > 4 && fl - 4 < sizeof stem)
		snprintf(stem, sizeof stem, "%.*s", (int)(fl - 4), file);
	bool spare = stem[0] == '#' && stem[1] == '/' && stem[2] >= '1' && stem[2] <= '9' &&
		     strspn(stem + 2, "0123456789") == strlen(stem + 2) && strlen(stem) < 12;
	if (!file || !stem[0] || strcmp(file + fl - 4, v->raw ? ".raw" : ".npy") ||
	    (!spare && dg_var_name_check(stem, &e2) != DG_OK)) {
		snprintf(msg, sizeof msg, "\"file\" is not a relative path inside the "
			 "checkpoint (%s)", e2.msg);
		return bad_entry(err, dir, i, msg);
	}
	snprintf(v->file, sizeof v->file, "%s", file);
	return DG_OK;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* DG_EINVAL when two entries share a name or a file. */
static enum dg_status check_unique(const char *dir, const struct ckpt_manifest *m,
				   struct dg_err *err)
{
	const char **s = malloc((size_t)(m->n ? m->n : 1) * sizeof *s);
	enum dg_status st = DG_OK;

	if (!s)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (int pass = 0; st == DG_OK && pass < 2; pass++) {
		for (int i = 0; i < m->n; i++)
			s[i] = pass ? m->vars[i].file : m->vars[i].name;
		qsort(s, (size_t)m->n, sizeof *s, cmp_str_ptr);
		for (int i = 1; st == DG_OK && i < m->n; i++) {
			if (strcmp(s[i - 1], s[i]) == 0) {
				st = dg_err_set(err, DG_EINVAL, "%s/%s: %s '%s' appears twice",
						dir, CKPT_MANIFEST, pass ? "file" : "variable",
						s[i]);
			}
		}
	}
	free(s);
	return st;
}

enum dg_status ckpt_manifest_read(const char *dir, struct ckpt_manifest *m, struct dg_err *err)
{
	char path[PATH_MAX];
	json_error_t je;
	json_t *j, *vars;
	enum dg_status st = DG_OK;
	struct stat sb;

	*m = (struct ckpt_manifest){ 0 };
	if ((st = path_join(path, sizeof path, dir, CKPT_MANIFEST, err)) != DG_OK)
		return st;
	if (stat(path, &sb) != 0) {
		dg_err_set(err, errno == ENOENT ? DG_ENOTFOUND : DG_EIO, "no checkpoint in "
			   "'%s': cannot read %s: %s", dir, CKPT_MANIFEST, strerror(errno));
		dg_err_hint(err, "give a directory written by 'dg checkpoint save DIR'");
		return err->code;
	}
	if (!(j = json_load_file(path, 0, &je))) {
		dg_err_set(err, DG_EINVAL, "%s: line %d: %s", path, je.line, je.text);
		return DG_EINVAL;
	}
	vars = json_object_get(j, "variables");
	json_t *ver = json_object_get(j, "version");
	if (!json_is_string(json_object_get(j, "format")) ||
	    strcmp(json_string_value(json_object_get(j, "format")), CKPT_FORMAT) ||
	    !json_is_array(vars)) {
		st = dg_err_set(err, DG_EINVAL, "%s is not a dg checkpoint manifest (no "
				"\"format\": \"%s\" or no \"variables\" list)", path, CKPT_FORMAT);
	} else if (!json_is_integer(ver) || json_integer_value(ver) != CKPT_VERSION) {
		st = dg_err_set(err, DG_EUNSUPPORTED, "%s has format version %"
				JSON_INTEGER_FORMAT "; this dg reads version %d", path,
				json_integer_value(ver), CKPT_VERSION);
		dg_err_hint(err, "restore it with the dg that wrote it");
	} else if (!(m->vars = calloc(json_array_size(vars) + 1, sizeof *m->vars))) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory reading %s", path);
	}
	for (size_t i = 0; st == DG_OK && i < json_array_size(vars); i++) {
		st = parse_var(dir, (int)i, json_array_get(vars, i), &m->vars[i], err);
		m->n += st == DG_OK;
	}
	if (st == DG_OK)
		st = check_unique(dir, m, err);
	json_decref(j);
	if (st != DG_OK)
		ckpt_manifest_deinit(m);
	return st;
}

/* --- one file, checked (and loaded) ------------------------------------------- */

static enum dg_status read_at(int fd, const char *path, void *p, size_t n, off_t off,
			      struct dg_err *err)
{
	for (size_t done = 0; done < n;) {
		ssize_t r = pread(fd, (char *)p + done, n - done, off + (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return dg_err_set(err, DG_EIO, "reading '%s': %s", path,
					  r < 0 ? strerror(errno) : "unexpected end of file");
		done += (size_t)r;
	}
	return DG_OK;
}

/* The .npy header of v's file: *data_off, after checking dtype and shape. */
static enum dg_status check_header(int fd, const char *path, uint64_t size,
				   const struct ckpt_var *v, size_t *data_off, struct dg_err *err)
{
	size_t n = size < NPY_HEAD_MAX ? (size_t)size : NPY_HEAD_MAX;
	char *buf = malloc(n ? n : 1), a[128], b[128];
	enum dg_dtype dt;
	struct dg_shape sh;
	enum dg_status st;

	if (!buf)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	st = read_at(fd, path, buf, n, 0, err);
	if (st == DG_OK && (st = dg_npy_parse_header(buf, n, &dt, &sh, data_off, err)) != DG_OK)
		dg_err_prefix(err, "%s", path);
	free(buf);
	if (st != DG_OK)
		return st;
	if (dt != v->dtype)
		return dg_err_set(err, DG_EDTYPE, "%s holds %s, the manifest says variable '%s' is "
				  "%s", path, dg_dtype_name(dt), v->name, dg_dtype_name(v->dtype));
	if (!dg_shape_eq(&sh, &v->shape)) {
		dg_shape_format(&sh, a, sizeof a);
		dg_shape_format(&v->shape, b, sizeof b);
		return dg_err_set(err, DG_ESHAPE, "%s has shape %s, the manifest says variable "
				  "'%s' is %s", path, a, v->name, b);
	}
	return DG_OK;
}

/* The data at off of v->bytes: into dst when given, else through a scratch
 * buffer; its CRC must be v->crc. */
static enum dg_status check_data(int fd, const char *path, size_t off, const struct ckpt_var *v,
				 void *dst, struct dg_err *err)
{
	void *scratch = dst ? NULL : malloc(v->bytes < CHUNK ? (size_t)v->bytes + 1 : CHUNK);
	uint32_t crc = (uint32_t)crc32_z(0, NULL, 0);
	enum dg_status st = DG_OK;

	if (!dst && !scratch)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (uint64_t done = 0; st == DG_OK && done < v->bytes;) {
		size_t n = v->bytes - done < CHUNK ? (size_t)(v->bytes - done) : CHUNK;
		char *p = dst ? (char *)dst + done : scratch;
		st = read_at(fd, path, p, n, (off_t)(off + done), err);
		crc = (uint32_t)crc32_z(crc, (const Bytef *)p, n);
		done += n;
	}
	free(scratch);
	if (st == DG_OK && crc != v->crc) {
		dg_err_set(err, DG_EIO, "%s: checksum mismatch (crc32 %08x, the manifest says "
			   "%08x): the data of variable '%s' is damaged", path, crc, v->crc,
			   v->name);
		st = DG_EIO;
	}
	return st;
}

enum dg_status ckpt_load_var(const char *dir, const struct ckpt_var *v, struct dg_tensor **out,
			     struct dg_err *err)
{
	char path[PATH_MAX];
	struct dg_tensor *t = NULL;
	struct stat sb;
	size_t off = 0;
	enum dg_status st;
	int fd;

	if (out)
		*out = NULL;
	if ((st = path_join(path, sizeof path, dir, v->file, err)) != DG_OK)
		return st;
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0) {
		dg_err_set(err, errno == ENOENT ? DG_ENOTFOUND : DG_EIO, "file %s of variable '%s' "
			   "%s", path, v->name, errno == ENOENT ? "is missing" : strerror(errno));
		return err->code;
	}
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		st = dg_err_set(err, DG_EIO, "%s (variable '%s') is not a regular file", path,
				v->name);
		goto out;
	}
	if (!v->raw && (st = check_header(fd, path, (uint64_t)sb.st_size, v, &off, err)) != DG_OK) {
		dg_err_hint(err, "the file was changed or damaged after 'dg checkpoint save'; "
			    "restore another checkpoint");
		goto out;
	}
	if ((uint64_t)sb.st_size != off + v->bytes) {
		st = dg_err_set(err, DG_EIO, "%s has %lld bytes, expected %zu (header) + %" PRIu64
				" (data of variable '%s'): the file is truncated or damaged", path,
				(long long)sb.st_size, off, v->bytes, v->name);
		goto out;
	}
	if (out && !(t = dg_tensor_new_uninit(v->dtype, &v->shape, err))) {
		st = err->code;
		goto out;
	}
	st = check_data(fd, path, off, v, t ? t->data : NULL, err);
	if (st == DG_OK && out) {
		*out = t;
		t = NULL;
	}
out:
	dg_tensor_free(t);
	close(fd);
	return st;
}
