/* Printing fetched values, shared by `dg eval` and `dg submit`: the text
 * encoding without its "# dtype [shape]" line (unless asked), "NAME:" lines
 * when there are several, or DIR/NAME.npy files with --out (doc/graph-format.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "dg/codec.h"

/* mkdir -p: create each missing component of dir. */
static enum dg_status make_dirs(const char *dir, struct dg_err *err)
{
	char *p = strdup(dir);
	struct stat sb;
	enum dg_status st = DG_OK;

	if (!p)
		return dg_err_set(err, DG_ENOMEM, "out of memory");
	for (char *s = p + 1; ; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char saved = *s;
		*s = '\0';
		if (mkdir(p, 0755) != 0 && errno != EEXIST) {
			st = dg_err_set(err, errno == ENOENT ? DG_ENOTFOUND : DG_EIO,
					"cannot create directory '%s': %s", p, strerror(errno));
			break;
		}
		*s = saved;
		if (saved == '\0')
			break;
	}
	if (st == DG_OK && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
		st = dg_err_set(err, DG_EINVAL, "--out '%s' is not a directory", dir);
	free(p);
	return st;
}

static char file_char(char c)
{
	return c == '/' || c == ':' ? '_' : c;
}

/* DIR/NAME.npy with '/' and ':' in NAME replaced by '_'. Owned (free()). */
static char *npy_path(const char *dir, const char *name)
{
	size_t dl = strlen(dir);
	char *path = malloc(dl + strlen(name) + 6);

	if (!path)
		return NULL;
	while (dl > 1 && dir[dl - 1] == '/')
		dl--;
	memcpy(path, dir, dl);
	char *q = path + dl;
	if (dl == 0 || dir[dl - 1] != '/')
		*q++ = '/';
	for (const char *s = name; *s; s++)
		*q++ = file_char(*s);
	strcpy(q, ".npy");
	return path;
}

/* Print one value: text body, without the "# dtype [shape]" line unless asked. */
static enum dg_status print_value(const struct dg_tensor *t, bool header, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	enum dg_status st = dg_text_encode(t, &b, err);
	const char *p = b.data ? b.data : "";
	size_t len = b.len;

	if (st == DG_OK && !header && len > 0 && p[0] == '#') {
		const char *nl = memchr(p, '\n', len);
		size_t skip = nl ? (size_t)(nl - p) + 1 : len;
		p += skip;
		len -= skip;
	}
	if (st == DG_OK && len && fwrite(p, 1, len, stdout) != len)
		st = dg_err_set(err, DG_EIO, "writing to standard output failed");
	dg_buf_deinit(&b);
	return st;
}

enum dg_status cli_write_values(const char *out_dir, bool header, char **names,
				struct dg_tensor **vals, int n, struct dg_err *err)
{
	enum dg_status st = DG_OK;

	if (out_dir)
		st = make_dirs(out_dir, err);
	for (int i = 0; st == DG_OK && i < n; i++) {
		if (!out_dir) {
			if (n > 1)
				printf("%s:\n", names[i]);
			st = print_value(vals[i], header, err);
			continue;
		}
		char *path = npy_path(out_dir, names[i]);
		char shape[128];
		if (!path)
			return dg_err_set(err, DG_ENOMEM, "out of memory");
		st = dg_npy_write_file(path, vals[i], err);
		if (st == DG_OK) {
			dg_shape_format(&vals[i]->shape, shape, sizeof shape);
			printf("wrote %s (%s %s)\n", path, dg_dtype_name(vals[i]->dtype), shape);
		}
		free(path);
	}
	return st;
}

/* Two different fetches must not land in the same DIR/NAME.npy. */
enum dg_status cli_check_out_names(char **names, int n, struct dg_err *err)
{
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < i; j++) {
			const char *x = names[i], *y = names[j];
			size_t k = 0;
			while (x[k] && y[k] && file_char(x[k]) == file_char(y[k]))
				k++;
			if (x[k] || y[k] || strcmp(x, y) == 0)
				continue;
			dg_err_set(err, DG_EINVAL, "fetches '%s' and '%s' would both be written to "
				   "the same .npy file", y, x);
			dg_err_hint(err, "fetch one of them in a separate run");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}
