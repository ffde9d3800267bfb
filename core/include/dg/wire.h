/* The wire codec of a tensor over HTTP (doc/http-api.md, "Tensor headers" and
 * "Encodings"): formatting and parsing the Dg-Dtype, Dg-Shape and Dg-Version
 * headers (and the ETag that carries the version), choosing a body's encoding
 * from Content-Type, Accept or ?format=, and decoding a request or reply body
 * (raw bytes described by the headers, .npy, text) into a tensor. The ps and
 * worker routes, the master, the clients and the mount all go through it, so
 * each rule lives here once. The encoders and decoders themselves are
 * dg/codec.h; the transport is dg/http.h. */
#ifndef DG_WIRE_H
#define DG_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dg/codec.h"
#include "dg/http.h"
#include "dg/tensor.h"

/* Bytes of a formatted Dg-Shape, NUL included: 8 dims of at most 15 digits. */
#define DG_WIRE_SHAPE_LEN 160
/* Bytes of a formatted Dg-Version (20 digits) or ETag ("V"), NUL included. */
#define DG_WIRE_VERSION_LEN 24

/* --------------------------------------------------------- header values */

/* Dg-Shape of s: "2,3"; "[]" for a scalar (an empty header value is dropped
 * by some HTTP stacks and reads like a missing header). buf holds at least
 * DG_WIRE_SHAPE_LEN bytes. */
void dg_wire_shape_format(const struct dg_shape *s, char *buf);
/* A Dg-Dtype value: a dtype name or alias (doc/encodings.md). DG_EDTYPE or
 * DG_EINVAL naming the header and the value (bytes that are not UTF-8
 * escaped). v may be NULL (missing): DG_EINVAL. */
enum dg_status dg_wire_dtype_parse(const char *v, enum dg_dtype *out, struct dg_err *err);
/* A Dg-Shape value: "2,3", "[2,3]", "2x3"; "[]" or "" is a scalar. Refuses
 * negatives, more than DG_MAX_DIMS dims and more than DG_MAX_NUMEL elements,
 * naming the header. */
enum dg_status dg_wire_shape_parse(const char *v, struct dg_shape *out, struct dg_err *err);
/* Dg-Version (and Dg-Step, Dg-Count, Dg-Epoch) values: decimal digits only,
 * v[0..n) (surrounding spaces and tabs allowed), no overflow. false when it is
 * not such a number; *out is untouched then. */
bool dg_wire_u64_parse(const char *v, size_t n, uint64_t *out);
/* Dg-Version: the decimal number. buf holds DG_WIRE_VERSION_LEN bytes. */
void dg_wire_version_format(uint64_t version, char *buf);
/* ETag and If-Match: the version quoted, "\"7\"". */
void dg_wire_etag_format(uint64_t version, char *buf);
/* An If-Match value: "V" or V. 0 never matches (versions start at 1): it is
 * DG_ECONFLICT, not "unconditional". Anything else is DG_EINVAL naming it. */
enum dg_status dg_wire_etag_parse(const char *v, uint64_t *out, struct dg_err *err);

/* What a body's headers (or its context: the variable it replaces, the
 * placeholder it feeds) say about it. */
struct dg_wire_desc {
	bool has_dtype, has_shape;
	enum dg_dtype dtype;
	struct dg_shape shape;
};

/* Dg-Dtype and Dg-Shape values (either may be NULL: absent) as a desc. */
enum dg_status dg_wire_desc_parse(const char *dtype, const char *shape,
				  struct dg_wire_desc *out, struct dg_err *err);

/* The headers of a raw tensor sent in a request: Content-Type, Dg-Dtype,
 * Dg-Shape. The values point into scratch (and the dtype table), so scratch
 * must outlive the request. Returns the count written to h (3). */
struct dg_wire_scratch {
	char shape[DG_WIRE_SHAPE_LEN];
};
int dg_wire_request_headers(enum dg_dtype dt, const struct dg_shape *s,
			    struct dg_wire_scratch *scratch, struct dg_http_header *h);

/* ------------------------------------------------------------- encodings */

/* ?format=raw|npy|text. DG_EINVAL naming the value otherwise. */
enum dg_status dg_wire_format_encoding(const char *format, enum dg_encoding *out,
				       struct dg_err *err);
/* The encoding of a body by its Content-Type: application/octet-stream (and
 * a missing type, and application/x-www-form-urlencoded, what curl -d sends)
 * is raw; application/x-npy (or application/npy) npy; text/plain text;
 * parameters after ';' are ignored. Any other type is DG_EINVAL naming it. */
enum dg_status dg_wire_content_encoding(const char *content_type, enum dg_encoding *out,
					struct dg_err *err);
/* The encoding a reply should use by Accept: the first type of the list that
 * dg speaks (the wildcards of any type and of any application/ type mean
 * raw, that of any text/ type text); raw when none is or Accept is NULL. */
enum dg_encoding dg_wire_accept_encoding(const char *accept);

/* --------------------------------------------------------------- bodies */

/* Decode body[0..len) in encoding enc. npy is self-describing; text uses its
 * "# dtype [shape]" line, else what d knows, else reads a float64 vector; raw
 * needs both d->dtype and d->shape (DG_EINVAL naming Dg-Dtype and Dg-Shape)
 * and exactly their bytes. Bool bytes other than 0 and 1 read as true (1).
 * adopt: when not NULL and *adopt == body (a dg_alloc_aligned block the caller
 * owns), a raw body becomes the tensor's data without a copy and *adopt is set
 * to NULL; otherwise the bytes are copied. d may be NULL (nothing known).
 * Returns an owned tensor or NULL with *err set. */
struct dg_tensor *dg_wire_decode(enum dg_encoding enc, const void *body, size_t len,
				 const struct dg_wire_desc *d, void **adopt, struct dg_err *err);

/* ---------------------------------------------------- server-side helpers */

/* The tensor headers of a request (Dg-Dtype, Dg-Shape). */
enum dg_status dg_wire_req_desc(const struct dg_http_req *r, struct dg_wire_desc *out,
				struct dg_err *err);
/* The encoding of a request's body (reading false: ?format=, else
 * Content-Type) or of its reply (reading true: ?format=, else Accept). */
enum dg_status dg_wire_req_encoding(const struct dg_http_req *r, bool reading,
				    enum dg_encoding *out, struct dg_err *err);
/* The request's body decoded as dg_wire_decode does, a raw body adopted from
 * the request (no copy). *out is owned; NULL with *err on failure. */
enum dg_status dg_wire_req_tensor(struct dg_http_req *r, enum dg_encoding enc,
				  const struct dg_wire_desc *d, struct dg_tensor **out,
				  struct dg_err *err);
/* The request's body as a tensor on its own: its encoding from ?format=,
 * else Content-Type, raw described by its Dg-Dtype and Dg-Shape (a step's
 * tensor, a job's feed). dg_wire_req_tensor with what the request says. */
enum dg_status dg_wire_req_body(struct dg_http_req *r, struct dg_tensor **out,
				struct dg_err *err);
/* Add Dg-Dtype and Dg-Shape to a reply. */
void dg_wire_add_tensor_headers(struct dg_http_resp *w, enum dg_dtype dt,
				const struct dg_shape *s);
/* Add Dg-Version and ETag: "V" to a reply. */
void dg_wire_add_version_headers(struct dg_http_resp *w, uint64_t version);

#endif
