/* Growable byte buffers and whole-file helpers (read with a size limit; write
 * through a temporary name, fsync and rename). */
#include "dg/buf.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void dg_buf_init(struct dg_buf *b)
{
	b->data = NULL;
	b->len = 0;
	b->cap = 0;
}

void dg_buf_deinit(struct dg_buf *b)
{
	free(b->data);
	dg_buf_init(b);
}

enum dg_status dg_buf_reserve(struct dg_buf *b, size_t n, struct dg_err *err)
{
	/* +1 keeps room for the NUL terminator; refuse sizes that wrap around. */
	if (n > SIZE_MAX - 1 - b->len)
		return dg_err_set(err, DG_ETOOLARGE, "buffer size overflow");
	size_t need = b->len + n + 1;

	if (need <= b->cap)
		return DG_OK;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap = cap > SIZE_MAX / 2 ? need : cap * 2;
	char *p = realloc(b->data, cap);
	if (!p)
		return dg_err_set(err, DG_ENOMEM, "out of memory growing a buffer to %zu bytes", cap);
	b->data = p;
	b->cap = cap;
	b->data[b->len] = '\0';       /* buf.h promises a terminated buffer once allocated */
	return DG_OK;
}

enum dg_status dg_buf_append(struct dg_buf *b, const void *p, size_t n, struct dg_err *err)
{
	enum dg_status st = dg_buf_reserve(b, n, err);

	if (st != DG_OK)
		return st;
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = '\0';
	return DG_OK;
}

enum dg_status dg_buf_printf(struct dg_buf *b, struct dg_err *err, const char *fmt, ...)
{
	va_list ap;
	enum dg_status st;
	char small[256];

	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	if (n < 0)
		return dg_err_set(err, DG_EINTERNAL, "bad format string");
	st = dg_buf_reserve(b, (size_t)n, err);
	if (st != DG_OK)
		return st;
	if ((size_t)n < sizeof small) {
		memcpy(b->data + b->len, small, (size_t)n + 1);
	} else {
		va_start(ap, fmt);
		vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
		va_end(ap);
	}
	b->len += (size_t)n;
	return DG_OK;
}

enum dg_status dg_buf_json_real(struct dg_buf *b, double x, struct dg_err *err)
{
	char s[40];
	int n;

	if (!isfinite(x))
		return dg_buf_append(b, "null", 4, err);
	n = snprintf(s, sizeof s - 2, "%.17g", x);
	char *e = strchr(s, 'e');
	if (!e && !strchr(s, '.')) {
		memcpy(s + n, ".0", 3);
		n += 2;
	} else if (e) {
		/* "1e+300" -> "1e300", "2.5e-07" -> "2.5e-7", as jansson writes it */
		char *d = e + 1, *p = d;
		if (*p == '-')
			*d++ = *p++;
		else if (*p == '+')
			p++;
		while (*p == '0' && p[1])
			p++;
		memmove(d, p, strlen(p) + 1);
		n = (int)strlen(s);
	}
	return dg_buf_append(b, s, (size_t)n, err);
}

enum dg_status dg_buf_json_string(struct dg_buf *b, const char *s, struct dg_err *err)
{
	enum dg_status st = dg_buf_append(b, "\"", 1, err);
	const char *run = s;

	for (; st == DG_OK && *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		st = dg_buf_append(b, run, (size_t)(s - run), err);
		if (st == DG_OK)
			st = c == '"' || c == '\\' ? dg_buf_printf(b, err, "\\%c", c)
						   : dg_buf_printf(b, err, "\\u%04x", c);
		run = s + 1;
	}
	if (st == DG_OK)
		st = dg_buf_append(b, run, (size_t)(s - run), err);
	return st == DG_OK ? dg_buf_append(b, "\"", 1, err) : st;
}

char *dg_buf_steal(struct dg_buf *b, size_t *len)
{
	char *p = b->data;

	if (len)
		*len = b->len;
	dg_buf_init(b);
	return p;
}

enum dg_status dg_buf_read_file(struct dg_buf *b, const char *path, size_t limit,
				struct dg_err *err)
{
	enum dg_status st = DG_OK;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		return dg_err_set(err, errno == ENOENT ? DG_ENOTFOUND : DG_EIO, "cannot open '%s': %s",
				  path, strerror(errno));
	}
	struct stat sb;
	size_t start = b->len;   /* the limit counts this file's bytes only */
	bool regular = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
	if (!regular && fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		st = dg_err_set(err, DG_EINVAL, "'%s' is a directory, not a file", path);
		goto out;
	}
	if (regular && (uint64_t)sb.st_size > limit) {
		st = dg_err_set(err, DG_ETOOLARGE, "'%s' is %lld bytes; the limit is %zu", path,
				(long long)sb.st_size, limit);
		goto out;
	}
	/* Size the buffer once for a regular file (plus a spare byte to see EOF)
	 * instead of doubling through it. */
	if (regular && sb.st_size > 0) {
		st = dg_buf_reserve(b, (size_t)sb.st_size + 1, err);
		if (st != DG_OK)
			goto out;
	}
	for (;;) {
		if (b->cap - b->len <= 1) {   /* no room left besides the NUL */
			st = dg_buf_reserve(b, 65536, err);
			if (st != DG_OK)
				goto out;
		}
		ssize_t n = read(fd, b->data + b->len, b->cap - b->len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			st = dg_err_set(err, DG_EIO, "reading '%s': %s", path, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		b->len += (size_t)n;
		b->data[b->len] = '\0';
		if (b->len - start > limit) {
			st = dg_err_set(err, DG_ETOOLARGE, "'%s' is larger than the limit of %zu bytes",
					path, limit);
			goto out;
		}
	}
out:
	close(fd);
	if (st != DG_OK && b->data) {
		b->len = start;   /* leave b as it was, not half a file */
		b->data[start] = '\0';
	}
	return st;
}

static atomic_uint tmp_seq;

enum dg_status dg_write_file_atomic(const char *path, const void *p, size_t n, struct dg_err *err)
{
	return dg_write_file_atomic_mode(path, p, n, 0644, err);
}

enum dg_status dg_write_file_atomic_mode(const char *path, const void *p, size_t n, int mode,
					 struct dg_err *err)
{
	enum dg_status st = DG_OK;
	size_t plen = strlen(path);
	char *tmp = malloc(plen + 32);
	char *dir = strdup(path);
	int fd = -1;

	if (!tmp || !dir) {
		st = dg_err_set(err, DG_ENOMEM, "out of memory");
		goto out;
	}
	/* pid + a per-process counter: two threads (or processes) writing the same
	 * path never share a temporary file; O_EXCL makes sure of it. */
	snprintf(tmp, plen + 32, "%s.tmp.%ld.%u", path, (long)getpid(),
		 atomic_fetch_add(&tmp_seq, 1u));
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
	if (fd < 0) {
		st = dg_err_set(err, DG_EIO, "cannot create '%s': %s", tmp, strerror(errno));
		goto out;
	}
	for (size_t off = 0; off < n;) {
		ssize_t w = write(fd, (const char *)p + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			st = dg_err_set(err, DG_EIO, "writing '%s': %s", tmp, strerror(errno));
			goto out;
		}
		off += (size_t)w;
	}
	if (fsync(fd) != 0) {
		st = dg_err_set(err, DG_EIO, "flushing '%s': %s", tmp, strerror(errno));
		goto out;
	}
	int rc = close(fd);
	fd = -1;
	if (rc != 0) {
		st = dg_err_set(err, DG_EIO, "closing '%s': %s", tmp, strerror(errno));
		goto out;
	}
	if (rename(tmp, path) != 0) {
		st = dg_err_set(err, DG_EIO, "renaming '%s' to '%s': %s", tmp, path, strerror(errno));
		goto out;
	}
	/* Make the rename itself durable. */
	int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
out:
	if (fd >= 0)
		close(fd);
	if (st != DG_OK && tmp)
		unlink(tmp);
	free(tmp);
	free(dir);
	return st;
}
