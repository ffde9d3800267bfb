/* The three encodings of a tensor, shared by HTTP, FUSE and the CLI:
 *  - raw: the elements' bytes, little-endian C order; dtype and shape travel
 *    beside it (headers, xattrs, flags);
 *  - npy: NumPy's .npy format (versions 1.0, 2.0, 3.0 read; 1.0 written when the
 *    header fits, else 2.0);
 *  - text: a "# dtype [shape]" line, then one row of the last dimension per line,
 *    numbers that round-trip exactly.
 * Every decoder checks every length against the bytes it was given and rejects
 * what it cannot represent with a message naming the problem. */
#ifndef DG_CODEC_H
#define DG_CODEC_H

#include <stddef.h>

#include "dg/buf.h"
#include "dg/tensor.h"

enum dg_encoding { DG_ENC_RAW = 0, DG_ENC_NPY = 1, DG_ENC_TEXT = 2 };

/* "raw", "npy", "text". */
const char *dg_encoding_name(enum dg_encoding enc);
/* MIME types used by HTTP: application/octet-stream, application/x-npy, text/plain. */
const char *dg_encoding_mime(enum dg_encoding enc);

/* --- raw --- */
/* A tensor of dt/shape from exactly numel*size bytes (DG_EINVAL naming the
 * expected and actual byte counts otherwise). Returns owned or NULL. */
struct dg_tensor *dg_raw_decode(const void *p, size_t len, enum dg_dtype dt,
				const struct dg_shape *shape, struct dg_err *err);

/* --- npy --- */
/* The header (magic, version, length, dict, padding to a multiple of 64 bytes,
 * '\n') for a tensor of dt/shape, appended to out. The data follows it. */
enum dg_status dg_npy_encode_header(enum dg_dtype dt, const struct dg_shape *shape,
				    struct dg_buf *out, struct dg_err *err);
/* Header length dg_npy_encode_header would produce (for st_size of npy views). */
size_t dg_npy_header_size(enum dg_dtype dt, const struct dg_shape *shape);
/* Parse the header at the start of p[0..len). On success *dt, *shape and
 * *data_off (offset of the first element) are set and the data length is the
 * caller's to check. Rejects: bad magic, unknown version, truncated header,
 * big-endian or unknown or object dtypes, fortran_order True, malformed dict,
 * negative/oversized dims. DG_EINVAL, DG_EDTYPE, or DG_ETOOLARGE for shapes over
 * DG_MAX_NUMEL. */
enum dg_status dg_npy_parse_header(const void *p, size_t len, enum dg_dtype *dt,
				   struct dg_shape *shape, size_t *data_off, struct dg_err *err);
/* Whole file image -> tensor. Data length must match the header exactly. */
struct dg_tensor *dg_npy_decode(const void *p, size_t len, struct dg_err *err);
/* Tensor -> whole file image, appended to out. */
enum dg_status dg_npy_encode(const struct dg_tensor *t, struct dg_buf *out, struct dg_err *err);
struct dg_tensor *dg_npy_read_file(const char *path, struct dg_err *err);
enum dg_status dg_npy_write_file(const char *path, const struct dg_tensor *t, struct dg_err *err);

/* --- text --- */
/* Append the text form of t to out. Floats use the shortest "%.*g" that reads
 * back to the same bits (nan, inf, -inf spelled so); bools as 0 and 1.
 * Rows of the last dimension on one line,
 * separated by single spaces; a blank line between blocks of higher dims. */
enum dg_status dg_text_encode(const struct dg_tensor *t, struct dg_buf *out, struct dg_err *err);
/* Parse text. With a "# dtype [shape]" header the element count must match the
 * shape exactly; without one, want_dt/want_shape (may be NULL) supply them, and
 * with neither the result is a 1-d float64 tensor of the numbers found (or a
 * scalar for a single number). A header overrides want_dt/want_shape; want_shape
 * may have one unknown (-1) dim, inferred from the count. A count mismatch is
 * DG_EINVAL against the header, DG_ESHAPE against want_shape. Errors name the
 * line and the token. */
struct dg_tensor *dg_text_decode(const char *p, size_t len, const enum dg_dtype *want_dt,
				 const struct dg_shape *want_shape, struct dg_err *err);

#endif
