/* The raw and .npy encodings of a tensor (dg/codec.h), plus the encoding names.
 * The .npy reader parses NumPy's header dict with a small strict parser of the
 * Python literal subset numpy writes; it never evaluates anything and checks
 * every length against the bytes it was given. Used by HTTP, FUSE and the CLI. */
#include "dg/codec.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Raw bytes are little-endian; dg runs on little-endian hosts only. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "dg assumes a little-endian host");

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64
/* Bytes before the dict: magic, 2 version bytes, then a 2 (v1) or 4 (v2, v3)
 * byte little-endian header length. */
#define NPY_PREFIX_V1 10
#define NPY_PREFIX_V2 12

/* bfloat16 has no entry: numpy has no bfloat16 dtype, and writing its bits
 * under another descr ('<u2', '<V2') would hand numpy users numbers that are
 * not the values. Encoding a bfloat16 tensor is refused (npy_refuse_bf16). */
static const char *const descr_of[DG_DTYPE_COUNT] = {
	[DG_F32] = "<f4", [DG_F64] = "<f8", [DG_I32] = "<i4",
	[DG_I64] = "<i8", [DG_U8] = "|u1",  [DG_BOOL] = "|b1", [DG_F16] = "<f2",
};

#define SUPPORTED_DESCRS "'<f4' (float32), '<f8' (float64), '<i4' (int32), '<i8' (int64), " \
	"'|u1' (uint8), '|b1' (bool), '<f2' (float16)"

static enum dg_status npy_refuse_bf16(struct dg_err *err)
{
	dg_err_set(err, DG_EDTYPE, "bfloat16 has no .npy form: numpy has no bfloat16 dtype");
	dg_err_hint(err, "Cast to float32 first, or read the raw bytes (2 per element, the "
		    "top half of a float32)");
	return DG_EDTYPE;
}

const char *dg_encoding_name(enum dg_encoding enc)
{
	switch (enc) {
	case DG_ENC_RAW: return "raw";
	case DG_ENC_NPY: return "npy";
	case DG_ENC_TEXT: return "text";
	}
	return "invalid";
}

const char *dg_encoding_mime(enum dg_encoding enc)
{
	switch (enc) {
	case DG_ENC_RAW: return "application/octet-stream";
	case DG_ENC_NPY: return "application/x-npy";
	case DG_ENC_TEXT: return "text/plain";
	}
	return "application/octet-stream";
}

/* bool bytes other than 0/1 (a `dd` into a bool variable, a C program's
 * bytes) are read as true, so every bool tensor holds only 0 and 1. */
static void normalise_bool(struct dg_tensor *t)
{
	uint8_t *b = t->data;

	for (int64_t i = 0; i < t->numel; i++)
		b[i] = b[i] != 0;
}

struct dg_tensor *dg_raw_decode(const void *p, size_t len, enum dg_dtype dt,
				const struct dg_shape *shape, struct dg_err *err)
{
	struct dg_tensor *t;
	int64_t numel;
	char sh[128];

	if ((unsigned)dt >= DG_DTYPE_COUNT) {
		dg_err_set(err, DG_EDTYPE, "raw data: invalid dtype code %d", (int)dt);
		return NULL;
	}
	if (dg_shape_numel(shape, &numel, err) != DG_OK)
		return NULL;
	/* numel <= 2^48 and sizes <= 8: the product cannot overflow. */
	size_t want = (size_t)numel * dg_dtype_size(dt);
	if (len != want) {
		dg_shape_format(shape, sh, sizeof sh);
		dg_err_set(err, DG_EINVAL,
			   "raw data is %zu bytes but a %s tensor of shape %s needs %zu bytes", len,
			   dg_dtype_name(dt), sh, want);
		dg_err_hint(err, "send exactly elements x %zu bytes, or fix the dtype/shape",
			    dg_dtype_size(dt));
		return NULL;
	}
	t = dg_tensor_from_data(dt, shape, p, err);
	if (t && dt == DG_BOOL)
		normalise_bool(t);
	return t;
}

/* --- npy header writing ----------------------------------------------------- */

/* The dict numpy itself writes, e.g. "{'descr': '<f4', 'fortran_order': False,
 * 'shape': (2, 3), }". Returns its length, or -1 for an invalid dtype/shape.
 * buf must hold at least 256 bytes: 8 dims of at most 15 digits fit easily. */
static int format_dict(enum dg_dtype dt, const struct dg_shape *shape, char *buf, size_t n)
{
	int len, w;

	if ((unsigned)dt >= DG_DTYPE_COUNT || !descr_of[dt] || shape->ndim < 0 ||
	    shape->ndim > DG_MAX_DIMS)
		return -1;
	len = snprintf(buf, n, "{'descr': '%s', 'fortran_order': False, 'shape': (",
		       descr_of[dt]);
	for (int i = 0; i < shape->ndim; i++) {
		if (shape->dim[i] < 0)
			return -1;
		/* A 1-tuple needs its trailing comma: "(5,)". */
		w = snprintf(buf + len, n - (size_t)len, "%s%lld%s", i ? ", " : "",
			     (long long)shape->dim[i], shape->ndim == 1 ? "," : "");
		len += w;
	}
	w = snprintf(buf + len, n - (size_t)len, "), }");
	len += w;
	return (size_t)len < n ? len : -1;
}

/* Total header bytes (prefix + dict + padding + '\n') for a dict of dict_len
 * bytes, and the version that holds it: 1.0 while the header length fits the
 * 2-byte field, 2.0 beyond. */
static size_t header_total(size_t dict_len, int *major)
{
	size_t total = (NPY_PREFIX_V1 + dict_len + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;

	if (total - NPY_PREFIX_V1 <= 65535) {
		*major = 1;
		return total;
	}
	*major = 2;
	return (NPY_PREFIX_V2 + dict_len + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
}

size_t dg_npy_header_size(enum dg_dtype dt, const struct dg_shape *shape)
{
	char dict[256];
	int major;
	int n = format_dict(dt, shape, dict, sizeof dict);

	return n < 0 ? 0 : header_total((size_t)n, &major);
}

enum dg_status dg_npy_encode_header(enum dg_dtype dt, const struct dg_shape *shape,
				    struct dg_buf *out, struct dg_err *err)
{
	char dict[256];
	char prefix[NPY_PREFIX_V2];
	int major;
	int n = format_dict(dt, shape, dict, sizeof dict);
	enum dg_status st;

	if (dt == DG_BF16)
		return npy_refuse_bf16(err);
	if (n < 0) {
		char sh[128];
		dg_shape_format(shape, sh, sizeof sh);
		return dg_err_set(err, DG_EINVAL,
				  "cannot write a .npy header for dtype %s shape %s",
				  dg_dtype_name(dt), sh);
	}
	size_t total = header_total((size_t)n, &major);
	size_t plen = major == 1 ? NPY_PREFIX_V1 : NPY_PREFIX_V2;
	size_t hlen = total - plen;   /* dict + padding + '\n' */

	memcpy(prefix, NPY_MAGIC, NPY_MAGIC_LEN);
	prefix[6] = (char)major;
	prefix[7] = 0;
	for (size_t i = 0; i < plen - 8; i++)
		prefix[8 + i] = (char)((hlen >> (8 * i)) & 0xff);
	st = dg_buf_reserve(out, total, err);
	if (st != DG_OK)
		return st;
	/* Cannot fail after the reserve. */
	dg_buf_append(out, prefix, plen, NULL);
	dg_buf_append(out, dict, (size_t)n, NULL);
	memset(out->data + out->len, ' ', hlen - (size_t)n - 1);
	out->len += hlen - (size_t)n - 1;
	out->data[out->len++] = '\n';
	out->data[out->len] = '\0';
	return DG_OK;
}

/* --- npy header parsing ----------------------------------------------------- */

/* A cursor over the header dict s[0..n). base is the file offset of s[0], so
 * messages can point at the byte in the file. */
struct hp {
	const char *s;
	size_t n, i;
	size_t base;          /* bytes */
	struct dg_err *err;
};

static void skip_ws(struct hp *h)
{
	while (h->i < h->n && (h->s[h->i] == ' ' || h->s[h->i] == '\t' || h->s[h->i] == '\n' ||
			       h->s[h->i] == '\r'))
		h->i++;
}

static enum dg_status syntax(struct hp *h, const char *what)
{
	char near[24];
	size_t k = 0;

	/* Show the next few bytes, non-printables as '?'. */
	for (size_t j = h->i; j < h->n && k < sizeof near - 1 && k < 16; j++, k++)
		near[k] = h->s[j] >= 0x20 && h->s[j] < 0x7f ? h->s[j] : '?';
	near[k] = '\0';
	dg_err_set(h->err, DG_EINVAL, "malformed .npy header at byte %zu: %s (near \"%s\")",
		   h->base + h->i, what, h->i < h->n ? near : "end of header");
	dg_err_hint(h->err, "the header must be a dict like {'descr': '<f4', 'fortran_order': "
			    "False, 'shape': (2, 3), }; write files with numpy.save");
	return DG_EINVAL;
}

/* Expect character c (after whitespace). */
static bool eat(struct hp *h, char c)
{
	skip_ws(h);
	if (h->i < h->n && h->s[h->i] == c) {
		h->i++;
		return true;
	}
	return false;
}

/* A quoted string ('...' or "..."), no escapes (numpy writes none). out gets at
 * most cap-1 bytes; longer strings are malformed for our purposes. */
static enum dg_status parse_str(struct hp *h, char *out, size_t cap)
{
	size_t k = 0;
	char q;

	skip_ws(h);
	if (h->i >= h->n || (h->s[h->i] != '\'' && h->s[h->i] != '"'))
		return syntax(h, "expected a quoted string");
	q = h->s[h->i++];
	while (h->i < h->n && h->s[h->i] != q) {
		char c = h->s[h->i];
		if (c == '\\' || c == '\n' || k + 1 >= cap)
			return syntax(h, "unsupported or overlong string");
		out[k++] = c;
		h->i++;
	}
	if (h->i >= h->n)
		return syntax(h, "unterminated string");
	h->i++;
	out[k] = '\0';
	return DG_OK;
}

/* Map a descr string to a dtype, or explain why not. */
static enum dg_status parse_descr(const char *d, enum dg_dtype *dt, struct dg_err *err)
{
	static const struct {
		const char *code;
		enum dg_dtype dt;
	} codes[] = {
		{ "f4", DG_F32 }, { "f8", DG_F64 }, { "i4", DG_I32 },
		{ "i8", DG_I64 }, { "u1", DG_U8 },  { "b1", DG_BOOL }, { "f2", DG_F16 },
	};
	char order = '=';
	const char *c = d;

	if (*c == '<' || *c == '>' || *c == '=' || *c == '|')
		order = *c++;
	if (*c == 'O') {
		dg_err_set(err, DG_EDTYPE,
			   ".npy dtype '%s' is an object array (pickled Python objects); dg does "
			   "not load pickles", d);
		dg_err_hint(err,
			    "convert to a numeric array first, e.g. np.asarray(a, dtype='<f4')");
		return DG_EDTYPE;
	}
	for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
		if (strcmp(c, codes[i].code) != 0)
			continue;
		/* Byte order does not matter for one-byte types; '|' (not applicable)
		 * makes no sense for wider ones. '=' is native: little-endian here. */
		if (dg_dtype_size(codes[i].dt) > 1 && order == '>') {
			dg_err_set(
				err, DG_EDTYPE,
				".npy dtype '%s' is big-endian; dg reads little-endian data only",
				d);
			dg_err_hint(err, "save a.astype(a.dtype.newbyteorder('<')) or "
					 "np.ascontiguousarray(a, dtype='<%s')", c);
			return DG_EDTYPE;
		}
		if (dg_dtype_size(codes[i].dt) > 1 && order == '|')
			break;
		*dt = codes[i].dt;
		return DG_OK;
	}
	dg_err_set(err, DG_EDTYPE, ".npy dtype '%s' is not supported; dg reads %s", d,
		   SUPPORTED_DESCRS);
	dg_err_hint(err, "convert before saving, e.g. np.save(path, a.astype('<f4'))");
	return DG_EDTYPE;
}

/* The shape tuple: "()", "(5,)", "(2, 3)", "(2, 3,)". Python 2 files may spell
 * ints with an 'L' suffix. "(5)" is the int 5 in Python, not a tuple. */
static enum dg_status parse_shape(struct hp *h, struct dg_shape *shape)
{
	int nd = 0;
	bool comma = false;

	if (!eat(h, '(')) {
		skip_ws(h);
		if (h->i < h->n && h->s[h->i] == '[')
			return syntax(h, "'shape' must be a tuple like (2, 3), not a list");
		return syntax(h, "expected '(' to start the 'shape' tuple");
	}
	for (;;) {
		skip_ws(h);
		if (h->i < h->n && h->s[h->i] == ')')
			break;
		if (nd > 0 && !comma)
			return syntax(h, "expected ',' or ')' in the 'shape' tuple");
		if (h->i < h->n && h->s[h->i] == '-') {
			dg_err_set(h->err, DG_EINVAL,
				   ".npy header has a negative dimension in its shape (byte %zu)",
				   h->base + h->i);
			dg_err_hint(h->err, "the file is corrupt; write it again with numpy.save");
			return DG_EINVAL;
		}
		if (h->i >= h->n || h->s[h->i] < '0' || h->s[h->i] > '9')
			return syntax(h, "expected a dimension size in the 'shape' tuple");
		if (nd == DG_MAX_DIMS) {
			dg_err_set(h->err, DG_EINVAL,
				   ".npy shape has more than %d dimensions; dg supports at most %d",
				   DG_MAX_DIMS, DG_MAX_DIMS);
			dg_err_hint(h->err, "reshape the array to at most %d dimensions",
				    DG_MAX_DIMS);
			return DG_EINVAL;
		}
		int64_t v = 0;
		while (h->i < h->n && h->s[h->i] >= '0' && h->s[h->i] <= '9') {
			v = v * 10 + (h->s[h->i++] - '0');
			if (v > DG_MAX_NUMEL) {
				dg_err_set(h->err, DG_ETOOLARGE,
					   ".npy shape has a dimension over 2^48 elements");
				return DG_ETOOLARGE;
			}
		}
		if (h->i < h->n && (h->s[h->i] == 'L' || h->s[h->i] == 'l'))
			h->i++;
		shape->dim[nd++] = v;
		comma = eat(h, ',');
	}
	h->i++;   /* ')' */
	if (nd == 1 && !comma)
		return syntax(h, "a 1-d shape is written (n,) with a comma; (n) is not a tuple");
	shape->ndim = nd;
	return DG_OK;
}

static enum dg_status parse_bool(struct hp *h, bool *out)
{
	skip_ws(h);
	if (h->n - h->i >= 4 && memcmp(h->s + h->i, "True", 4) == 0) {
		h->i += 4;
		*out = true;
		return DG_OK;
	}
	if (h->n - h->i >= 5 && memcmp(h->s + h->i, "False", 5) == 0) {
		h->i += 5;
		*out = false;
		return DG_OK;
	}
	return syntax(h, "'fortran_order' must be True or False");
}

/* One "key: value" entry; seen[] catches duplicates. */
static enum dg_status parse_entry(struct hp *h, bool seen[3], char *descr, size_t descr_cap,
				  bool *fortran, struct dg_shape *shape)
{
	static const char *const keys[3] = { "descr", "fortran_order", "shape" };
	char key[32];
	size_t at;
	int k;
	enum dg_status st;

	skip_ws(h);
	at = h->base + h->i;
	st = parse_str(h, key, sizeof key);
	if (st != DG_OK)
		return st;
	for (k = 0; k < 3 && strcmp(key, keys[k]) != 0; k++)
		;
	if (k == 3) {
		dg_err_set(h->err, DG_EINVAL, ".npy header has unknown key '%s' (byte %zu)", key,
			   at);
		dg_err_hint(h->err, "a .npy header has exactly the keys 'descr', 'fortran_order' "
				    "and 'shape'");
		return DG_EINVAL;
	}
	if (seen[k]) {
		dg_err_set(h->err, DG_EINVAL, ".npy header has key '%s' twice (byte %zu)", key, at);
		dg_err_hint(h->err, "the file is corrupt; write it again with numpy.save");
		return DG_EINVAL;
	}
	seen[k] = true;
	if (!eat(h, ':'))
		return syntax(h, "expected ':' after a key");
	skip_ws(h);
	switch (k) {
	case 0:
		/* A list here is a structured dtype: [('x', '<f4'), ...]. */
		if (h->i < h->n && h->s[h->i] == '[') {
			dg_err_set(h->err, DG_EDTYPE, ".npy file holds a structured (record) "
						      "dtype; dg supports only %s",
				   SUPPORTED_DESCRS);
			dg_err_hint(h->err, "save each field as its own array");
			return DG_EDTYPE;
		}
		return parse_str(h, descr, descr_cap);
	case 1: return parse_bool(h, fortran);
	default: return parse_shape(h, shape);
	}
}

/* The dict and what follows it, up to the end of the header. */
static enum dg_status parse_dict(struct hp *h, char *descr, size_t descr_cap, bool *fortran,
				 struct dg_shape *shape)
{
	static const char *const keys[3] = { "descr", "fortran_order", "shape" };
	bool seen[3] = { false, false, false };
	enum dg_status st;

	if (!eat(h, '{'))
		return syntax(h, "expected '{' to start the header dict");
	for (;;) {
		if (eat(h, '}'))
			break;
		st = parse_entry(h, seen, descr, descr_cap, fortran, shape);
		if (st != DG_OK)
			return st;
		/* A comma may follow every entry, including the last. */
		if (!eat(h, ',')) {
			if (eat(h, '}'))
				break;
			return syntax(h, "expected ',' or '}' after an entry");
		}
	}
	/* Only padding (spaces, the final '\n') may follow the dict. */
	skip_ws(h);
	if (h->i < h->n)
		return syntax(h, "unexpected bytes after the header dict");
	for (int k = 0; k < 3; k++) {
		if (!seen[k]) {
			dg_err_set(h->err, DG_EINVAL, ".npy header has no '%s' key", keys[k]);
			dg_err_hint(h->err, "a .npy header needs 'descr', 'fortran_order' and "
					    "'shape'; write files with numpy.save");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}

/* Fortran order is C order when at most one dim is larger than 1. */
static bool layout_is_trivial(const struct dg_shape *s)
{
	int big = 0;

	for (int i = 0; i < s->ndim; i++)
		big += s->dim[i] > 1;
	return big <= 1;
}

/* Magic, version and header length: the fixed prefix. */
static enum dg_status parse_prefix(const unsigned char *b, size_t len, size_t *plen,
				   size_t *hlen, struct dg_err *err)
{
	size_t m = len < NPY_MAGIC_LEN ? len : NPY_MAGIC_LEN;

	/* A prefix of the magic (or nothing) is a truncated file, anything else
	 * is not .npy at all. */
	if (m > 0 && memcmp(b, NPY_MAGIC, m) != 0) {
		dg_err_set(err, DG_EINVAL, "not a .npy file: it does not start with \\x93NUMPY");
		dg_err_hint(err,
			    "write the file with numpy.save, or send raw bytes or text instead");
		return DG_EINVAL;
	}
	if (len < NPY_PREFIX_V1) {
		dg_err_set(err, DG_EINVAL, ".npy file is truncated: %zu bytes, shorter than the "
					   "%d-byte magic, version and header length", len,
			   NPY_PREFIX_V1);
		return DG_EINVAL;
	}
	if (b[6] < 1 || b[6] > 3 || b[7] != 0) {
		dg_err_set(err, DG_EINVAL, ".npy format version %u.%u is not supported; dg reads "
					   "1.0, 2.0 and 3.0", b[6], b[7]);
		dg_err_hint(err, "write the file with numpy.save");
		return DG_EINVAL;
	}
	if (b[6] == 1) {
		*plen = NPY_PREFIX_V1;
		*hlen = (size_t)b[8] | (size_t)b[9] << 8;
	} else {
		if (len < NPY_PREFIX_V2) {
			dg_err_set(err, DG_EINVAL,
				   ".npy file is truncated: %zu bytes, shorter than "
				   "its %d-byte prefix",
				   len, NPY_PREFIX_V2);
			return DG_EINVAL;
		}
		*plen = NPY_PREFIX_V2;
		*hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 |
			(size_t)b[11] << 24;
	}
	if (*hlen > len - *plen) {
		dg_err_set(err, DG_EINVAL, ".npy header length %zu runs past the end of the data "
					   "(%zu bytes in all)", *hlen, len);
		dg_err_hint(err, "the file is truncated or corrupt");
		return DG_EINVAL;
	}
	return DG_OK;
}

enum dg_status dg_npy_parse_header(const void *p, size_t len, enum dg_dtype *dt,
				   struct dg_shape *shape, size_t *data_off, struct dg_err *err)
{
	const unsigned char *b = p;
	size_t plen = 0, hlen = 0;
	char descr[64];
	bool fortran = false;
	struct dg_shape sh = { .ndim = 0 };
	enum dg_dtype d;
	int64_t numel;
	enum dg_status st;

	st = parse_prefix(b, len, &plen, &hlen, err);
	if (st != DG_OK)
		return st;
	struct hp h = { .s = (const char *)b + plen, .n = hlen, .i = 0, .base = plen, .err = err };
	st = parse_dict(&h, descr, sizeof descr, &fortran, &sh);
	if (st != DG_OK)
		return st;
	st = parse_descr(descr, &d, err);
	if (st != DG_OK)
		return st;
	if (fortran && !layout_is_trivial(&sh)) {
		dg_err_set(err, DG_EINVAL, ".npy data is in Fortran (column-major) order; dg reads "
					   "C order only");
		dg_err_hint(err, "save np.ascontiguousarray(a) instead");
		return DG_EINVAL;
	}
	st = dg_shape_numel(&sh, &numel, err);
	if (st != DG_OK) {
		dg_err_prefix(err, ".npy header");
		return st;
	}
	*dt = d;
	*shape = sh;
	*data_off = plen + hlen;
	return DG_OK;
}

struct dg_tensor *dg_npy_decode(const void *p, size_t len, struct dg_err *err)
{
	enum dg_dtype dt;
	struct dg_shape shape;
	size_t off, want;
	int64_t numel;
	struct dg_tensor *t;
	char sh[128];

	if (dg_npy_parse_header(p, len, &dt, &shape, &off, err) != DG_OK)
		return NULL;
	/* Check the length before allocating: a corrupt header must not make us
	 * reserve memory the bytes cannot fill. The header parse bounded numel. */
	if (dg_shape_numel(&shape, &numel, err) != DG_OK)
		return NULL;
	want = (size_t)numel * dg_dtype_size(dt);
	if (len - off != want) {
		dg_shape_format(&shape, sh, sizeof sh);
		dg_err_set(err, DG_EINVAL, ".npy data of a %s %s array should be %zu bytes, but "
					   "the file has %zu bytes after the header",
			   dg_dtype_name(dt), sh, want, len - off);
		dg_err_hint(err, len - off < want ? "the file is truncated"
						  : "the file has trailing bytes; save it again");
		return NULL;
	}
	t = dg_tensor_new_uninit(dt, &shape, err);
	if (!t)
		return NULL;
	if (t->nbytes)
		memcpy(t->data, (const char *)p + off, t->nbytes);
	if (dt == DG_BOOL)
		normalise_bool(t);
	return t;
}

enum dg_status dg_npy_encode(const struct dg_tensor *t, struct dg_buf *out, struct dg_err *err)
{
	size_t hs = dg_npy_header_size(t->dtype, &t->shape);
	enum dg_status st;

	/* One reservation for header and data: no regrowth for big tensors. */
	if (hs && t->nbytes <= SIZE_MAX - hs) {
		st = dg_buf_reserve(out, hs + t->nbytes, err);
		if (st != DG_OK)
			return st;
	}
	st = dg_npy_encode_header(t->dtype, &t->shape, out, err);
	if (st != DG_OK)
		return st;
	return dg_buf_append(out, t->data, t->nbytes, err);
}

struct dg_tensor *dg_npy_read_file(const char *path, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	struct dg_tensor *t = NULL;

	if (dg_buf_read_file(&b, path, (size_t)1 << 40, err) == DG_OK) {
		t = dg_npy_decode(b.data ? b.data : "", b.len, err);
		if (!t)
			dg_err_prefix(err, "'%s'", path);
	}
	dg_buf_deinit(&b);
	return t;
}

enum dg_status dg_npy_write_file(const char *path, const struct dg_tensor *t, struct dg_err *err)
{
	struct dg_buf b = { 0 };
	enum dg_status st = dg_npy_encode(t, &b, err);

	if (st == DG_OK)
		st = dg_write_file_atomic(path, b.data, b.len, err);
	dg_buf_deinit(&b);
	return st;
}
