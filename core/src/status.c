/* The error carrier and the one table that maps each dg_status to its name, its
 * HTTP status, its errno (FUSE) and its CLI exit code. Every boundary uses these
 * functions; no other file switches on codes to translate them. */
#include "dg/status.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const struct {
	const char *name;
	int http;
	int errnum;
	int exit;       /* 1 is reserved for usage errors in the CLI */
} table[DG_STATUS_COUNT] = {
	[DG_OK] = { "ok", 200, 0, 0 },
	[DG_EINVAL] = { "invalid_argument", 400, EINVAL, 2 },
	[DG_ENOTFOUND] = { "not_found", 404, ENOENT, 3 },
	[DG_EEXIST] = { "exists", 409, EEXIST, 4 },
	[DG_ESHAPE] = { "shape_mismatch", 400, EINVAL, 5 },
	[DG_EDTYPE] = { "dtype_mismatch", 400, EINVAL, 6 },
	[DG_ECONFLICT] = { "conflict", 412, ESTALE, 7 },
	[DG_ETOOLARGE] = { "too_large", 413, EFBIG, 8 },
	[DG_EUNAUTHORIZED] = { "unauthorized", 401, EACCES, 9 },
	[DG_EUNAVAILABLE] = { "unavailable", 503, EIO, 10 },
	[DG_EIO] = { "io_error", 500, EIO, 11 },
	[DG_ENOMEM] = { "out_of_memory", 507, ENOMEM, 12 },
	[DG_EINTERNAL] = { "internal", 500, EIO, 13 },
	[DG_ETIMEOUT] = { "timeout", 504, ETIMEDOUT, 14 },
	[DG_EDEVICE] = { "device_error", 500, EIO, 15 },
	[DG_EUNSUPPORTED] = { "unsupported", 501, ENOTSUP, 16 },
	[DG_ECANCELED] = { "canceled", 409, ECANCELED, 17 },
	[DG_ESTALE] = { "stale", 409, ESTALE, 18 },
	[DG_ECLOSED] = { "closed", 410, EPIPE, 19 },
	[DG_ENOSPC] = { "disk_full", 507, ENOSPC, 20 },
};

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1), or 0 when s[0]
 * does not start one: the rule of RFC 3629, which is jansson's, so that a
 * message that passes here can always be sent as JSON (no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	size_t len;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		len = 2;
		cp = s[0] & 0x1f;
	} else if (s[0] >= 0xe0 && s[0] <= 0xef) {
		len = 3;
		cp = s[0] & 0x0f;
	} else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		len = 4;
		cp = s[0] & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
	    (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
		return 0;
	return len;
}

bool dg_utf8_valid(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;

	for (size_t i = 0, k; i < n; i += k)
		if (!(k = utf8_seq(p + i, n - i)))
			return false;
	return true;
}

size_t dg_utf8_escape(const char *s, size_t n, char *out, size_t cap)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)s;
	size_t o = 0;

	if (cap == 0)
		return 0;
	for (size_t i = 0, k; i < n; i += k) {
		k = utf8_seq(p + i, n - i);
		size_t need = k ? k : 4;
		if (o + need >= cap)
			break;          /* whole sequences or escapes only: never half of one */
		if (k) {
			memcpy(out + o, p + i, k);
		} else {
			k = 1;
			out[o] = '\\';
			out[o + 1] = 'x';
			out[o + 2] = hex[p[i] >> 4];
			out[o + 3] = hex[p[i] & 15];
		}
		o += need;
	}
	out[o] = '\0';
	return o;
}

/* Make the NUL-terminated text in buf[0..cap) valid UTF-8 in place, bytes that
 * are not escaped as \xNN (cut to fit). Messages quote names, headers and
 * tokens the user sent; a stray byte must not make the error unsendable. */
static void text_fix(char *buf, size_t cap)
{
	size_t n = strnlen(buf, cap - 1);
	char tmp[512];

	if (dg_utf8_valid(buf, n))
		return;
	if (cap > sizeof tmp)
		cap = sizeof tmp;
	dg_utf8_escape(buf, n, tmp, cap);
	memcpy(buf, tmp, strlen(tmp) + 1);
}

/* A code outside the table (a peer speaking a newer protocol) reads as internal. */
static enum dg_status clamp(enum dg_status code)
{
	return (unsigned)code < DG_STATUS_COUNT ? code : DG_EINTERNAL;
}

enum dg_status dg_err_setv(struct dg_err *err, enum dg_status code, const char *fmt, va_list ap)
{
	if (err) {
		err->code = code;
		vsnprintf(err->msg, sizeof err->msg, fmt, ap);
		text_fix(err->msg, sizeof err->msg);
		err->hint[0] = '\0';
		err->peer[0] = '\0';
	}
	return code;
}

void dg_err_peer(struct dg_err *err, const char *addr)
{
	const char *p = addr ? strstr(addr, "://") : NULL;

	if (!err)
		return;
	snprintf(err->peer, sizeof err->peer, "%s", p ? p + 3 : addr ? addr : "");
	text_fix(err->peer, sizeof err->peer);
}

enum dg_status dg_err_set(struct dg_err *err, enum dg_status code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	dg_err_setv(err, code, fmt, ap);
	va_end(ap);
	return code;
}

void dg_err_hint(struct dg_err *err, const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return;
	va_start(ap, fmt);
	vsnprintf(err->hint, sizeof err->hint, fmt, ap);
	va_end(ap);
	text_fix(err->hint, sizeof err->hint);
}

void dg_err_prefix(struct dg_err *err, const char *fmt, ...)
{
	char old[sizeof err->msg];
	char pre[sizeof err->msg];
	va_list ap;
	int n;

	if (!err)
		return;
	memcpy(old, err->msg, sizeof old);
	old[sizeof old - 1] = '\0';
	/* Format into a scratch buffer: the arguments may point into err->msg. */
	va_start(ap, fmt);
	n = vsnprintf(pre, sizeof pre, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	/* "prefix: old", truncated to fit; the prefix alone when it fills msg. */
	size_t cap = sizeof err->msg - 1, k = strnlen(pre, cap), ol = strlen(old);
	memcpy(err->msg, pre, k);
	if (k + 2 < cap) {
		err->msg[k++] = ':';
		err->msg[k++] = ' ';
		if (ol > cap - k)
			ol = cap - k;
		memcpy(err->msg + k, old, ol);
		k += ol;
	}
	err->msg[k] = '\0';
	text_fix(err->msg, sizeof err->msg);
}

void dg_err_clear(struct dg_err *err)
{
	if (err) {
		err->code = DG_OK;
		err->msg[0] = '\0';
		err->hint[0] = '\0';
	}
}

const char *dg_status_name(enum dg_status code)
{
	return table[clamp(code)].name;
}

enum dg_status dg_status_from_name(const char *name)
{
	for (int i = 0; i < DG_STATUS_COUNT; i++)
		if (name && strcmp(table[i].name, name) == 0)
			return (enum dg_status)i;
	return DG_EINTERNAL;
}

int dg_status_to_http(enum dg_status code)
{
	return table[clamp(code)].http;
}

int dg_status_to_errno(enum dg_status code)
{
	return table[clamp(code)].errnum;
}

int dg_status_to_exit(enum dg_status code)
{
	return table[clamp(code)].exit;
}
