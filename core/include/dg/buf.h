/* A growable byte buffer: the owned result type of encoders and the upload
 * buffer of the HTTP layer. */
#ifndef DG_BUF_H
#define DG_BUF_H

#include <stddef.h>

#include "dg/status.h"

struct dg_buf {
	char *data;   /* owned; always NUL-terminated when data != NULL (not counted in len) */
	size_t len;
	size_t cap;
};

/* A zeroed struct dg_buf is a valid empty buffer. */
void dg_buf_init(struct dg_buf *b);
/* Release the bytes and reset to empty. */
void dg_buf_deinit(struct dg_buf *b);
/* Make room for n more bytes. DG_ENOMEM on failure (buffer unchanged). */
enum dg_status dg_buf_reserve(struct dg_buf *b, size_t n, struct dg_err *err);
enum dg_status dg_buf_append(struct dg_buf *b, const void *p, size_t n, struct dg_err *err);
enum dg_status dg_buf_printf(struct dg_buf *b, struct dg_err *err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* JSON text for hot paths that write a small object of a fixed shape every
 * step (a run request and its reply, a step event) without building a
 * jansson tree, which costs ~10x more. A real as jansson's compact dump
 * writes it ("%.17g", ".0" added to an integral value; null when not
 * finite); a string (UTF-8) quoted and escaped (", \ and control characters). */
enum dg_status dg_buf_json_real(struct dg_buf *b, double x, struct dg_err *err);
enum dg_status dg_buf_json_string(struct dg_buf *b, const char *s, struct dg_err *err);
/* Take the bytes out: returns data (owned by the caller, free()) and resets b. */
char *dg_buf_steal(struct dg_buf *b, size_t *len);

/* Read a whole file into b (appending). DG_ENOTFOUND / DG_EIO name the path;
 * files larger than limit bytes give DG_ETOOLARGE. On error b is left unchanged. */
enum dg_status dg_buf_read_file(struct dg_buf *b, const char *path, size_t limit,
				struct dg_err *err);
/* Write n bytes to path via a temporary file in the same directory, fsync and
 * rename, so readers see the old or the new file, never a torn one. Mode 0644
 * (less the umask). */
enum dg_status dg_write_file_atomic(const char *path, const void *p, size_t n,
				    struct dg_err *err);
/* The same with the file's mode (0600 for a private file). */
enum dg_status dg_write_file_atomic_mode(const char *path, const void *p, size_t n, int mode,
					 struct dg_err *err);

#endif
