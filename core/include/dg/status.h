/* One error taxonomy for all of dg: a code, a message that says what failed and
 * on which object, and a hint that says what to do. The single translation table
 * to HTTP status, errno (FUSE) and CLI exit code lives in core/src/status.c. */
#ifndef DG_STATUS_H
#define DG_STATUS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* Append-only: these numbers travel over HTTP and into scripts. When a code is
 * retired its number stays reserved. */
enum dg_status {
	DG_OK = 0,
	DG_EINVAL = 1,         /* invalid argument: bad input from a user, file or peer */
	DG_ENOTFOUND = 2,      /* no such variable, node, file, op */
	DG_EEXIST = 3,         /* already exists */
	DG_ESHAPE = 4,         /* shape mismatch */
	DG_EDTYPE = 5,         /* dtype mismatch or unsupported dtype for an op */
	DG_ECONFLICT = 6,      /* version conflict (compare-and-set lost) */
	DG_ETOOLARGE = 7,      /* a size limit was exceeded */
	DG_EUNAUTHORIZED = 8,  /* missing or wrong token */
	DG_EUNAVAILABLE = 9,   /* peer unreachable, server shutting down */
	DG_EIO = 10,           /* disk or stream I/O failed */
	DG_ENOMEM = 11,        /* out of memory */
	DG_EINTERNAL = 12,     /* a bug in dg: please report it */
	DG_ETIMEOUT = 13,      /* a deadline passed */
	DG_EDEVICE = 14,       /* accelerator or BLAS failure */
	DG_EUNSUPPORTED = 15,  /* valid request that dg does not do */
	DG_ECANCELED = 16,     /* aborted step or cancelled job */
	DG_ESTALE = 17,        /* a sync gradient for a step already applied: dropped */
	DG_ECLOSED = 18,       /* queue closed (and, for dequeue, too few examples left) */
	DG_ENOSPC = 19,        /* the disk (of a data directory) is full */
	DG_STATUS_COUNT
};

/* The error carrier. Functions take it last; it may be NULL when the caller does
 * not want the text. msg says what failed (naming the object); hint, when not
 * empty, says what to do about it. */
struct dg_err {
	enum dg_status code;
	char msg[256];
	char hint[160];
	/* host:port of the server that could not be reached when that is why it
	 * failed (set by the HTTP client, carried across hops in the JSON error's
	 * "peer"), else "": the master resumes a job once that server is back. */
	char peer[64];
};

/* Fill *err (when not NULL) with code and a printf-style message; clears the
 * hint and the peer. Messages and hints are always valid UTF-8: bytes of the formatted text
 * that are not (a name or header value the user sent, a multi-byte character
 * cut by the size limit) are written as \xNN, so every error can travel as
 * JSON. Returns code, so callers can write `return dg_err_set(err, ...)`. */
enum dg_status dg_err_set(struct dg_err *err, enum dg_status code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
enum dg_status dg_err_setv(struct dg_err *err, enum dg_status code, const char *fmt,
			   va_list ap);

/* Set the hint of an error already set (no-op when err is NULL). */
void dg_err_hint(struct dg_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Name the unreachable server behind err (host:port, or a URL whose scheme
 * is dropped); "" or NULL clears it. No-op when err is NULL. */
void dg_err_peer(struct dg_err *err, const char *addr);

/* Prefix err->msg with "context: " (e.g. the node or file name). No-op when NULL. */
void dg_err_prefix(struct dg_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reset to DG_OK with empty text. */
void dg_err_clear(struct dg_err *err);

/* Is s[0..n) valid UTF-8 (RFC 3629: no overlong forms, surrogates or code
 * points above U+10FFFF; jansson's rule)? */
bool dg_utf8_valid(const char *s, size_t n);

/* Copy s[0..n) into out[0..cap) with every byte that is not part of a valid
 * UTF-8 sequence written as \xNN; stops before a sequence or escape that would
 * not fit, so the result is always valid UTF-8. NUL-terminates (cap > 0);
 * returns the length written. For messages that quote what a user sent. */
size_t dg_utf8_escape(const char *s, size_t n, char *out, size_t cap);

/* Stable snake_case name of a code ("shape_mismatch"), for JSON and logs. */
const char *dg_status_name(enum dg_status code);

/* Parse a name back (for HTTP clients); unknown names give DG_EINTERNAL. */
enum dg_status dg_status_from_name(const char *name);

/* The three faces of one table. */
int dg_status_to_http(enum dg_status code);   /* 200, 400, 404, ... */
int dg_status_to_errno(enum dg_status code);  /* positive errno: EINVAL, ENOENT, ... */
int dg_status_to_exit(enum dg_status code);   /* CLI exit code: 0, 2.. (1 = usage) */

#endif
