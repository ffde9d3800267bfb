/* The wire codec (dg/wire.h): the tensor headers (Dg-Dtype, Dg-Shape,
 * Dg-Version, ETag) written and read, the encoding of a body chosen from its
 * media type, and a body decoded into a tensor. The servers' handlers
 * (ps/routes.c, worker/routes.c, the master), the clients (client.c, the
 * mount's fs/peer.c and fs/upload.c) and the executor's sends all call it:
 * no other file spells these headers' formats. Pure string and codec work on
 * top of dg/codec.h, plus thin helpers over dg/http.h's request and reply. */
#include "dg/wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MIME_RAW "application/octet-stream"

/* ---------------------------------------------------------- header values */

void dg_wire_shape_format(const struct dg_shape *s, char *buf)
{
	size_t off = 0;

	if (s->ndim <= 0) {
		memcpy(buf, "[]", 3);
		return;
	}
	buf[0] = '\0';
	for (int i = 0; i < s->ndim && i < DG_MAX_DIMS && off < DG_WIRE_SHAPE_LEN; i++)
		off += (size_t)snprintf(buf + off, DG_WIRE_SHAPE_LEN - off, "%s%" PRId64,
					i ? "," : "", s->dim[i]);
}

enum dg_status dg_wire_dtype_parse(const char *v, enum dg_dtype *out, struct dg_err *err)
{
	enum dg_status st;

	if (!v)
		return dg_err_set(err, DG_EINVAL, "no Dg-Dtype header");
	if ((st = dg_dtype_parse(v, out, err)) != DG_OK)
		dg_err_prefix(err, "Dg-Dtype header");
	return st;
}

enum dg_status dg_wire_shape_parse(const char *v, struct dg_shape *out, struct dg_err *err)
{
	enum dg_status st;

	if (!v)
		return dg_err_set(err, DG_EINVAL, "no Dg-Shape header");
	if ((st = dg_shape_parse(v, out, err)) != DG_OK)
		dg_err_prefix(err, "Dg-Shape header");
	return st;
}

/* Decimal digits v[0..n), at least one, without overflow. */
static bool digits(const char *v, size_t n, uint64_t *out)
{
	uint64_t x = 0;

	if (n == 0)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned d = (unsigned)(unsigned char)v[i] - '0';
		if (d > 9 || x > (UINT64_MAX - d) / 10)
			return false;
		x = x * 10 + d;
	}
	*out = x;
	return true;
}

/* Trim spaces and tabs around v[*a..*n). */
static void trim(const char *v, size_t *a, size_t *n)
{
	while (*a < *n && (v[*a] == ' ' || v[*a] == '\t'))
		(*a)++;
	while (*n > *a && (v[*n - 1] == ' ' || v[*n - 1] == '\t'))
		(*n)--;
}

bool dg_wire_u64_parse(const char *v, size_t n, uint64_t *out)
{
	size_t a = 0;

	trim(v, &a, &n);
	return digits(v + a, n - a, out);
}

void dg_wire_version_format(uint64_t version, char *buf)
{
	snprintf(buf, DG_WIRE_VERSION_LEN, "%" PRIu64, version);
}

void dg_wire_etag_format(uint64_t version, char *buf)
{
	snprintf(buf, DG_WIRE_VERSION_LEN, "\"%" PRIu64 "\"", version);
}

enum dg_status dg_wire_etag_parse(const char *v, uint64_t *out, struct dg_err *err)
{
	size_t a = 0, n = v ? strlen(v) : 0;

	trim(v ? v : "", &a, &n);
	if (n - a >= 2 && v[a] == '"' && v[n - 1] == '"') {
		a++;
		n--;
	}
	if (!digits(v ? v + a : "", n - a, out)) {
		dg_err_set(err, DG_EINVAL, "If-Match '%.40s' is not a version", v ? v : "");
		dg_err_hint(err, "send the ETag of a GET, e.g. If-Match: \"7\"");
		return DG_EINVAL;
	}
	if (*out == 0)
		return dg_err_set(err, DG_ECONFLICT, "If-Match version 0 never matches");
	return DG_OK;
}

enum dg_status dg_wire_desc_parse(const char *dtype, const char *shape,
				  struct dg_wire_desc *out, struct dg_err *err)
{
	enum dg_status st;

	*out = (struct dg_wire_desc){ .dtype = DG_F32 };
	if (dtype && (st = dg_wire_dtype_parse(dtype, &out->dtype, err)) != DG_OK)
		return st;
	if (shape && (st = dg_wire_shape_parse(shape, &out->shape, err)) != DG_OK)
		return st;
	out->has_dtype = dtype != NULL;
	out->has_shape = shape != NULL;
	return DG_OK;
}

int dg_wire_request_headers(enum dg_dtype dt, const struct dg_shape *s,
			    struct dg_wire_scratch *scratch, struct dg_http_header *h)
{
	dg_wire_shape_format(s, scratch->shape);
	h[0] = (struct dg_http_header){ "Content-Type", MIME_RAW };
	h[1] = (struct dg_http_header){ "Dg-Dtype", dg_dtype_name(dt) };
	h[2] = (struct dg_http_header){ "Dg-Shape", scratch->shape };
	return 3;
}

/* -------------------------------------------------------------- encodings */

/* Does the media type s[0..n) (spaces around it ignored) equal mime? */
static bool media_is(const char *s, size_t n, const char *mime)
{
	while (n && (*s == ' ' || *s == '\t')) {
		s++;
		n--;
	}
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
		n--;
	return n == strlen(mime) && strncasecmp(s, mime, n) == 0;
}

/* The encoding named by one media type, or -1. any: accept wildcards. */
static int media_encoding(const char *s, size_t n, bool any)
{
	if (media_is(s, n, MIME_RAW))
		return DG_ENC_RAW;
	if (media_is(s, n, "application/x-npy") || media_is(s, n, "application/npy"))
		return DG_ENC_NPY;
	if (media_is(s, n, "text/plain") || (any && media_is(s, n, "text/*")))
		return DG_ENC_TEXT;
	if (any && (media_is(s, n, "*/*") || media_is(s, n, "application/*")))
		return DG_ENC_RAW;
	return -1;
}

enum dg_status dg_wire_format_encoding(const char *format, enum dg_encoding *out,
				       struct dg_err *err)
{
	for (int i = DG_ENC_RAW; format && i <= DG_ENC_TEXT; i++) {
		if (!strcmp(format, dg_encoding_name((enum dg_encoding)i))) {
			*out = (enum dg_encoding)i;
			return DG_OK;
		}
	}
	dg_err_set(err, DG_EINVAL, "format='%.40s' is not an encoding", format ? format : "");
	dg_err_hint(err, "formats: raw, npy, text");
	return DG_EINVAL;
}

enum dg_status dg_wire_content_encoding(const char *content_type, enum dg_encoding *out,
					struct dg_err *err)
{
	size_t n = content_type ? strcspn(content_type, ";") : 0;
	int e;

	*out = DG_ENC_RAW;
	if (!content_type || media_is(content_type, n, "application/x-www-form-urlencoded"))
		return DG_OK;
	if ((e = media_encoding(content_type, n, false)) < 0) {
		dg_err_set(err, DG_EINVAL, "Content-Type '%.60s' is not a tensor encoding",
			   content_type);
		dg_err_hint(err, "use application/octet-stream, application/x-npy or text/plain "
			    "(or ?format=raw|npy|text)");
		return DG_EINVAL;
	}
	*out = (enum dg_encoding)e;
	return DG_OK;
}

enum dg_encoding dg_wire_accept_encoding(const char *accept)
{
	for (const char *p = accept; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
		int e = media_encoding(p, strcspn(p, ",;"), true);
		if (e >= 0)
			return (enum dg_encoding)e;
	}
	return DG_ENC_RAW;
}

/* ----------------------------------------------------------------- bodies */

/* A raw body adopted as the data of a dt/shape tensor (block from
 * dg_alloc_aligned, owned by the caller until this succeeds). */
static struct dg_tensor *adopt_raw(void *block, size_t len, enum dg_dtype dt,
				   const struct dg_shape *shape, struct dg_err *err)
{
	struct dg_tensor *t = dg_tensor_adopt(dt, shape, len ? block : NULL, len, err);

	if (t && dt == DG_BOOL) {
		/* as dg_raw_decode: every bool tensor holds only 0 and 1 */
		uint8_t *b = t->data;
		for (size_t i = 0; i < len; i++)
			b[i] = b[i] != 0;
	}
	return t;
}

struct dg_tensor *dg_wire_decode(enum dg_encoding enc, const void *body, size_t len,
				 const struct dg_wire_desc *d, void **adopt, struct dg_err *err)
{
	static const struct dg_wire_desc none = { 0 };
	struct dg_tensor *t;

	if (!d)
		d = &none;
	if (!body)
		len = 0;
	switch (enc) {
	case DG_ENC_NPY:
		return dg_npy_decode(body ? body : "", len, err);
	case DG_ENC_TEXT:
		return dg_text_decode(body ? body : "", len, d->has_dtype ? &d->dtype : NULL,
				      d->has_shape ? &d->shape : NULL, err);
	case DG_ENC_RAW:
		break;
	default:
		dg_err_set(err, DG_EINVAL, "unknown encoding %d", (int)enc);
		return NULL;
	}
	if (!d->has_dtype || !d->has_shape) {
		dg_err_set(err, DG_EINVAL, "a raw body needs the Dg-Dtype and Dg-Shape headers "
			   "(%s missing)", !d->has_dtype && !d->has_shape ? "both"
			   : !d->has_dtype ? "Dg-Dtype" : "Dg-Shape");
		dg_err_hint(err, "e.g. -H 'Dg-Dtype: float32' -H 'Dg-Shape: 2,3', or send .npy "
			    "(Content-Type: application/x-npy)");
		return NULL;
	}
	if (adopt && *adopt && *adopt == body) {
		t = adopt_raw(*adopt, len, d->dtype, &d->shape, err);
		if (t && len)
			*adopt = NULL;
		return t;
	}
	return dg_raw_decode(body ? body : "", len, d->dtype, &d->shape, err);
}

/* ----------------------------------------------------- server-side helpers */

enum dg_status dg_wire_req_desc(const struct dg_http_req *r, struct dg_wire_desc *out,
				struct dg_err *err)
{
	return dg_wire_desc_parse(dg_http_header(r, "Dg-Dtype"), dg_http_header(r, "Dg-Shape"),
				  out, err);
}

enum dg_status dg_wire_req_encoding(const struct dg_http_req *r, bool reading,
				    enum dg_encoding *out, struct dg_err *err)
{
	const char *f = dg_http_query(r, "format");

	*out = DG_ENC_RAW;
	if (f)
		return dg_wire_format_encoding(f, out, err);
	if (reading) {
		*out = dg_wire_accept_encoding(dg_http_header(r, "Accept"));
		return DG_OK;
	}
	return dg_wire_content_encoding(dg_http_header(r, "Content-Type"), out, err);
}

enum dg_status dg_wire_req_tensor(struct dg_http_req *r, enum dg_encoding enc,
				  const struct dg_wire_desc *d, struct dg_tensor **out,
				  struct dg_err *err)
{
	size_t len = 0;
	const void *body = dg_http_body(r, &len);
	void *block = NULL;

	/* Only a raw body whose length is right is taken from the request (the
	 * server owns it until then); any other is decoded from where it is. */
	if (enc == DG_ENC_RAW && body && d && d->has_dtype && d->has_shape) {
		int64_t numel;
		if (dg_shape_numel(&d->shape, &numel, NULL) == DG_OK &&
		    (size_t)numel * dg_dtype_size(d->dtype) == len)
			block = dg_http_body_take(r, &len);
		body = block ? block : body;
	}
	*out = dg_wire_decode(enc, body, len, d, block ? &block : NULL, err);
	dg_free_aligned(block);         /* not adopted (a failure): the block is ours */
	if (!*out)
		return err && err->code != DG_OK ? err->code : DG_EINVAL;
	return DG_OK;
}

enum dg_status dg_wire_req_body(struct dg_http_req *r, struct dg_tensor **out,
				struct dg_err *err)
{
	struct dg_wire_desc d;
	enum dg_encoding enc;
	enum dg_status st;

	*out = NULL;
	if ((st = dg_wire_req_encoding(r, false, &enc, err)) != DG_OK ||
	    (st = dg_wire_req_desc(r, &d, err)) != DG_OK)
		return st;
	return dg_wire_req_tensor(r, enc, &d, out, err);
}

void dg_wire_add_tensor_headers(struct dg_http_resp *w, enum dg_dtype dt,
				const struct dg_shape *s)
{
	char shape[DG_WIRE_SHAPE_LEN];

	dg_wire_shape_format(s, shape);
	dg_http_add_header(w, "Dg-Dtype", dg_dtype_name(dt));
	dg_http_add_header(w, "Dg-Shape", shape);
}

void dg_wire_add_version_headers(struct dg_http_resp *w, uint64_t version)
{
	char buf[DG_WIRE_VERSION_LEN];

	dg_wire_version_format(version, buf);
	dg_http_add_header(w, "Dg-Version", buf);
	dg_wire_etag_format(version, buf);
	dg_http_add_header(w, "ETag", buf);
}
