/* dtypes, shapes and host tensors. Tensor bytes live in one 64-byte aligned
 * block (vector loads, and later pinned/cached device staging, want it). */
#include "dg/tensor.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	const char *name;
	size_t size;
} dtypes[DG_DTYPE_COUNT] = {
	[DG_F32] = { "float32", 4 }, [DG_F64] = { "float64", 8 }, [DG_I32] = { "int32", 4 },
	[DG_I64] = { "int64", 8 },   [DG_U8] = { "uint8", 1 },    [DG_BOOL] = { "bool", 1 },
};

static const struct {
	const char *alias;
	enum dg_dtype dt;
} aliases[] = {
	{ "f4", DG_F32 },     { "float", DG_F32 },   { "single", DG_F32 }, { "f8", DG_F64 },
	{ "double", DG_F64 }, { "i4", DG_I32 },      { "int", DG_I32 },    { "i8", DG_I64 },
	{ "long", DG_I64 },   { "u1", DG_U8 },       { "byte", DG_U8 },    { "b1", DG_BOOL },
	{ "?", DG_BOOL },     { "boolean", DG_BOOL },
};

const char *dg_dtype_name(enum dg_dtype dt)
{
	return (unsigned)dt < DG_DTYPE_COUNT ? dtypes[dt].name : "invalid";
}

size_t dg_dtype_size(enum dg_dtype dt)
{
	return (unsigned)dt < DG_DTYPE_COUNT ? dtypes[dt].size : 0;
}

bool dg_dtype_is_float(enum dg_dtype dt)
{
	return dt == DG_F32 || dt == DG_F64;
}

bool dg_dtype_is_int(enum dg_dtype dt)
{
	return dt == DG_I32 || dt == DG_I64 || dt == DG_U8;
}

enum dg_status dg_dtype_parse(const char *s, enum dg_dtype *out, struct dg_err *err)
{
	for (int i = 0; s && i < DG_DTYPE_COUNT; i++) {
		if (strcmp(s, dtypes[i].name) == 0) {
			*out = (enum dg_dtype)i;
			return DG_OK;
		}
	}
	for (size_t i = 0; s && i < sizeof aliases / sizeof aliases[0]; i++) {
		if (strcmp(s, aliases[i].alias) == 0) {
			*out = aliases[i].dt;
			return DG_OK;
		}
	}
	dg_err_set(err, DG_EDTYPE, "unknown dtype '%.64s'", s ? s : "(null)");
	dg_err_hint(err, "use one of float32, float64, int32, int64, uint8, bool");
	return DG_EDTYPE;
}

struct dg_shape dg_shape_make(int ndim, const int64_t *dims)
{
	struct dg_shape s = { .ndim = ndim };

	for (int i = 0; i < ndim && i < DG_MAX_DIMS; i++)
		s.dim[i] = dims[i];
	return s;
}

enum dg_status dg_shape_numel(const struct dg_shape *s, int64_t *out, struct dg_err *err)
{
	char buf[200];
	int64_t n = 1;
	bool zero = false;

	if (s->ndim < 0 || s->ndim > DG_MAX_DIMS) {
		return dg_err_set(err, DG_EINVAL, "shape has %d dimensions; at most %d are allowed",
				  s->ndim, DG_MAX_DIMS);
	}
	for (int i = 0; i < s->ndim; i++) {
		if (s->dim[i] < 0) {
			dg_shape_format(s, buf, sizeof buf);
			return dg_err_set(err, DG_EINVAL, "shape %s has a negative dimension", buf);
		}
		if (s->dim[i] == 0)
			zero = true;
	}
	/* Multiply with the bound checked at every step. A zero anywhere makes the
	 * count 0, but the product of the other dims must still be bounded: kernels
	 * multiply outer sizes together and must not overflow ([0,2^40,2^40]). */
	for (int i = 0; i < s->ndim; i++) {
		if (s->dim[i] == 0)
			continue;
		if (s->dim[i] > DG_MAX_NUMEL / n) {
			dg_shape_format(s, buf, sizeof buf);
			return dg_err_set(err, DG_ETOOLARGE,
					  "shape %s has more than 2^48 elements", buf);
		}
		n *= s->dim[i];
	}
	*out = zero ? 0 : n;
	return DG_OK;
}

bool dg_shape_eq(const struct dg_shape *a, const struct dg_shape *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->dim[i] != b->dim[i])
			return false;
	return true;
}

bool dg_shape_is_known(const struct dg_shape *s)
{
	if (s->ndim < 0)
		return false;
	for (int i = 0; i < s->ndim; i++)
		if (s->dim[i] < 0)
			return false;
	return true;
}

int dg_shape_format(const struct dg_shape *s, char *buf, size_t n)
{
	size_t len = 0;
	int w;

	if (n > 0)
		buf[0] = '\0';
	if (s->ndim < 0)
		return snprintf(buf, n, "<unknown>");
	w = snprintf(buf, n, "[");
	len += (size_t)w;
	for (int i = 0; i < s->ndim && i < DG_MAX_DIMS; i++) {
		const char *sep = i ? "," : "";
		if (s->dim[i] < 0)
			w = snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "%s?", sep);
		else
			w = snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "%s%lld",
				     sep, (long long)s->dim[i]);
		len += (size_t)w;
	}
	w = snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "]");
	return (int)(len + (size_t)w);
}

enum dg_status dg_shape_parse(const char *s, struct dg_shape *out, struct dg_err *err)
{
	struct dg_shape sh = { .ndim = 0 };
	const char *p = s;
	int64_t numel;

	while (isspace((unsigned char)*p))
		p++;
	bool bracket = *p == '[' || *p == '(';
	if (bracket)
		p++;
	for (;;) {
		while (isspace((unsigned char)*p))
			p++;
		if (*p == '\0' || *p == ']' || *p == ')')
			break;
		if (!isdigit((unsigned char)*p))
			goto bad;
		if (sh.ndim == DG_MAX_DIMS) {
			return dg_err_set(err, DG_EINVAL,
					  "shape '%.64s' has more than %d dimensions", s,
					  DG_MAX_DIMS);
		}
		errno = 0;
		char *end;
		long long v = strtoll(p, &end, 10);
		if (errno == ERANGE || v > DG_MAX_NUMEL)
			return dg_err_set(err, DG_ETOOLARGE, "dimension in shape '%.64s' is too large", s);
		sh.dim[sh.ndim++] = v;
		p = end;
		while (isspace((unsigned char)*p))
			p++;
		if (*p == ',' || *p == 'x' || *p == 'X') {
			p++;
			while (isspace((unsigned char)*p))
				p++;
			if (*p == '\0' || *p == ']' || *p == ')')
				goto bad;   /* trailing separator */
		} else if (*p != '\0' && *p != ']' && *p != ')') {
			goto bad;
		}
	}
	if (bracket != (*p == ']' || *p == ')'))
		goto bad;
	if (*p)
		p++;
	while (isspace((unsigned char)*p))
		p++;
	if (*p)
		goto bad;
	enum dg_status st = dg_shape_numel(&sh, &numel, err);
	if (st != DG_OK)
		return st;
	*out = sh;
	return DG_OK;
bad:
	dg_err_set(err, DG_EINVAL, "cannot parse shape '%.64s'", s);
	dg_err_hint(err, "write dimensions separated by commas, e.g. 2,3 or [2,3]; [] is a scalar");
	return DG_EINVAL;
}

enum dg_status dg_shape_broadcast(const struct dg_shape *a, const struct dg_shape *b,
				  struct dg_shape *out, struct dg_err *err)
{
	struct dg_shape r;
	char sa[128], sb[128];

	if (a->ndim < 0 || b->ndim < 0) {
		r.ndim = -1;
		*out = r;
		return DG_OK;
	}
	r.ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
	for (int i = 0; i < r.ndim; i++) {
		int ia = a->ndim - r.ndim + i, ib = b->ndim - r.ndim + i;
		int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
		if (da == db)
			r.dim[i] = da;
		else if (da == 1)
			r.dim[i] = db;
		else if (db == 1)
			r.dim[i] = da;
		else if (da < 0 || db < 0)
			r.dim[i] = da < 0 ? db : da;   /* unknown must equal the known size */
		else
			goto bad;
	}
	*out = r;
	return DG_OK;
bad:
	dg_shape_format(a, sa, sizeof sa);
	dg_shape_format(b, sb, sizeof sb);
	dg_err_set(err, DG_ESHAPE, "shapes %s and %s cannot be broadcast together", sa, sb);
	dg_err_hint(err, "aligned from the right, each pair of sizes must be equal or 1");
	return DG_ESHAPE;
}

static struct dg_tensor *tensor_alloc(enum dg_dtype dt, const struct dg_shape *shape,
				      bool zero, struct dg_err *err)
{
	struct dg_tensor *t;
	int64_t numel;

	if ((unsigned)dt >= DG_DTYPE_COUNT) {
		dg_err_set(err, DG_EDTYPE, "invalid dtype code %d", (int)dt);
		return NULL;
	}
	if (dg_shape_numel(shape, &numel, err) != DG_OK)
		return NULL;
	t = calloc(1, sizeof *t);
	if (!t)
		goto oom;
	t->dtype = dt;
	t->shape = *shape;
	t->numel = numel;
	t->nbytes = (size_t)numel * dtypes[dt].size;
	t->data = dg_alloc_aligned(t->nbytes);
	if (!t->data)
		goto oom;
	if (zero)
		memset(t->data, 0, t->nbytes);
	return t;
oom:
	free(t);
	dg_err_set(err, DG_ENOMEM, "out of memory allocating a %s tensor of %lld elements",
		   dtypes[dt].name, (long long)numel);
	return NULL;
}

struct dg_tensor *dg_tensor_new(enum dg_dtype dt, const struct dg_shape *shape, struct dg_err *err)
{
	return tensor_alloc(dt, shape, true, err);
}

struct dg_tensor *dg_tensor_new_uninit(enum dg_dtype dt, const struct dg_shape *shape,
				       struct dg_err *err)
{
	return tensor_alloc(dt, shape, false, err);
}

struct dg_tensor *dg_tensor_from_data(enum dg_dtype dt, const struct dg_shape *shape,
				      const void *src, struct dg_err *err)
{
	struct dg_tensor *t = tensor_alloc(dt, shape, false, err);

	if (t && t->nbytes)
		memcpy(t->data, src, t->nbytes);
	return t;
}

struct dg_tensor *dg_tensor_adopt(enum dg_dtype dt, const struct dg_shape *shape, void *data,
				  size_t nbytes, struct dg_err *err)
{
	struct dg_tensor *t;
	int64_t numel;
	char sh[128];

	if ((unsigned)dt >= DG_DTYPE_COUNT) {
		dg_err_set(err, DG_EDTYPE, "invalid dtype code %d", (int)dt);
		return NULL;
	}
	if (dg_shape_numel(shape, &numel, err) != DG_OK)
		return NULL;
	/* numel <= DG_MAX_NUMEL and sizes <= 8: the product cannot overflow. */
	size_t want = (size_t)numel * dtypes[dt].size;
	if (nbytes != want || (!data && nbytes)) {
		dg_shape_format(shape, sh, sizeof sh);
		dg_err_set(err, DG_EINVAL, "raw data is %zu bytes but a %s tensor of shape %s "
			   "needs %zu bytes", nbytes, dtypes[dt].name, sh, want);
		dg_err_hint(err, "send exactly elements x %zu bytes, or fix the dtype/shape",
			    dtypes[dt].size);
		return NULL;
	}
	t = calloc(1, sizeof *t);
	/* An empty tensor still gets a block of its own, as tensor_alloc gives. */
	void *own = data ? data : dg_alloc_aligned(0);
	if (!t || !own) {
		free(t);
		if (own != data)
			dg_free_aligned(own);
		dg_err_set(err, DG_ENOMEM, "out of memory allocating a %s tensor of %lld elements",
			   dtypes[dt].name, (long long)numel);
		return NULL;
	}
	t->dtype = dt;
	t->shape = *shape;
	t->numel = numel;
	t->nbytes = nbytes;
	t->data = own;
	return t;
}

struct dg_tensor *dg_tensor_scalar(enum dg_dtype dt, double v, struct dg_err *err)
{
	struct dg_shape s = { .ndim = 0 };
	struct dg_tensor *t = tensor_alloc(dt, &s, false, err);

	if (t)
		dg_tensor_set_f64(t, 0, v);
	return t;
}

struct dg_tensor *dg_tensor_clone(const struct dg_tensor *t, struct dg_err *err)
{
	return dg_tensor_from_data(t->dtype, &t->shape, t->data, err);
}

void dg_tensor_free(struct dg_tensor *t)
{
	if (!t)
		return;
	dg_free_aligned(t->data);
	free(t);
}

double dg_tensor_get_f64(const struct dg_tensor *t, int64_t i)
{
	switch (t->dtype) {
	case DG_F32: return ((const float *)t->data)[i];
	case DG_F64: return ((const double *)t->data)[i];
	case DG_I32: return ((const int32_t *)t->data)[i];
	case DG_I64: return (double)((const int64_t *)t->data)[i];
	case DG_U8: return ((const uint8_t *)t->data)[i];
	case DG_BOOL: return ((const uint8_t *)t->data)[i] != 0;
	default: return NAN;
	}
}

/* double -> integer of range [lo, hi], truncating toward zero. C leaves
 * out-of-range conversions undefined, so saturate (NaN gives 0). */
static double clamp_int(double v, double lo, double hi)
{
	if (isnan(v))
		return 0;
	return v < lo ? lo : v > hi ? hi : v;
}

void dg_tensor_set_f64(struct dg_tensor *t, int64_t i, double v)
{
	switch (t->dtype) {
	case DG_F32: ((float *)t->data)[i] = (float)v; break;
	case DG_F64: ((double *)t->data)[i] = v; break;
	case DG_I32: ((int32_t *)t->data)[i] = (int32_t)clamp_int(v, INT32_MIN, INT32_MAX); break;
	case DG_I64:
		/* 2^63 itself is not an int64; the largest double below it is. */
		if (v >= 9223372036854775808.0)
			((int64_t *)t->data)[i] = INT64_MAX;
		else
			((int64_t *)t->data)[i] = (int64_t)clamp_int(v, -0x1p63, 0x1p63);
		break;
	case DG_U8: ((uint8_t *)t->data)[i] = (uint8_t)clamp_int(v, 0, 255); break;
	case DG_BOOL: ((uint8_t *)t->data)[i] = v != 0; break;
	default: break;
	}
}
