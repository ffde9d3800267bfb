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
	[DG_F16] = { "float16", 2 }, [DG_BF16] = { "bfloat16", 2 },
};

static const struct {
	const char *alias;
	enum dg_dtype dt;
} aliases[] = {
	{ "f4", DG_F32 },     { "float", DG_F32 },   { "single", DG_F32 }, { "f8", DG_F64 },
	{ "double", DG_F64 }, { "i4", DG_I32 },      { "int", DG_I32 },    { "i8", DG_I64 },
	{ "long", DG_I64 },   { "u1", DG_U8 },       { "byte", DG_U8 },    { "b1", DG_BOOL },
	{ "?", DG_BOOL },     { "boolean", DG_BOOL },    { "f2", DG_F16 },     { "half", DG_F16 },
	{ "bf16", DG_BF16 },
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

bool dg_dtype_is_half(enum dg_dtype dt)
{
	return dt == DG_F16 || dt == DG_BF16;
}

/* --- 16-bit floats ----------------------------------------------------------
 * float16: 1 sign, 5 exponent (bias 15), 10 fraction bits; bfloat16: 1 sign,
 * 8 exponent (bias 127), 7 fraction bits. Both have subnormals, inf and NaN. */

static uint32_t f32_bits(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof u);
	return u;
}

static float f32_from_bits(uint32_t u)
{
	float x;

	memcpy(&x, &u, sizeof x);
	return x;
}

/* a (finite, >= 0) rounded to nearest-even in a format of mbits fraction
 * bits and ebits exponent bits; the bits without sign, inf on overflow.
 * With e the binade of a (clamped to emin, where subnormals share the
 * quantum), q = a * 2^(mbits - e) is exact (a power-of-two scaling) and rint
 * rounds it once. The encoding is then ((e - emin) << mbits) + q for normals
 * and subnormals alike, and a carry of q into 2^(mbits+1) lands on the next
 * binade by itself. */
static uint16_t round_f64(double a, int mbits, int ebits)
{
	int emin = 2 - (1 << (ebits - 1));
	uint64_t inf = (uint64_t)((1 << ebits) - 1) << mbits;
	int e;

	if (a == 0)
		return 0;
	frexp(a, &e);
	e -= 1;   /* a in [2^e, 2^(e+1)) */
	if (e < emin)
		e = emin;
	if (e > 1 << ebits)
		return (uint16_t)inf;   /* far past the largest finite value */
	uint64_t q = (uint64_t)rint(ldexp(a, mbits - e));
	uint64_t bits = ((uint64_t)(e - emin) << mbits) + q;
	return (uint16_t)(bits >= inf ? inf : bits);
}

uint16_t dg_f64_to_f16(double x)
{
	uint16_t sign = signbit(x) ? 0x8000 : 0;

	if (isnan(x))
		return sign | 0x7e00;
	if (isinf(x))
		return sign | 0x7c00;
	return sign | round_f64(fabs(x), 10, 5);
}

uint16_t dg_f64_to_bf16(double x)
{
	uint16_t sign = signbit(x) ? 0x8000 : 0;

	if (isnan(x))
		return sign | 0x7fc0;
	if (isinf(x))
		return sign | 0x7f80;
	return sign | round_f64(fabs(x), 7, 8);
}

/* Integer-only float32 -> float16 (the hot path of Cast and the half kernels);
 * agrees bit for bit with dg_f64_to_f16 on every float (the unit tests check). */
uint16_t dg_f32_to_f16(float f)
{
	uint32_t x = f32_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);

	x &= 0x7fffffff;
	if (x > 0x7f800000)   /* NaN: quiet, top payload bits kept */
		return sign | 0x7e00 | (uint16_t)((x >> 13) & 0x3ff);
	if (x >= 0x477ff000)   /* >= 65520, the midpoint of 65504 and 2^16: inf */
		return sign | 0x7c00;
	if (x >= 0x38800000) {   /* >= 2^-14: a normal float16 */
		/* Rebias the exponent (127 -> 15) and round the 13 dropped bits to
		 * even; a carry moves into the exponent, staying below inf (above). */
		uint32_t r = x - 0x38000000;
		r += 0xfff + ((r >> 13) & 1);
		return sign | (uint16_t)(r >> 13);
	}
	if (x <= 0x33000000)   /* <= 2^-25: the tie at 2^-25 goes to even 0 */
		return sign;
	/* Subnormal: value = m * 2^(e-150); in units of 2^-24 that is m >> (126-e),
	 * shift 14..24, rounded to nearest even by the dropped bits. */
	uint32_t e = x >> 23, m = (x & 0x7fffff) | 0x800000;
	uint32_t sh = 126 - e, q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return sign | (uint16_t)q;
}

float dg_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;

	if (e == 0x1f)
		return f32_from_bits(sign | 0x7f800000 | (m << 13));
	if (e == 0) {   /* zero or subnormal: m * 2^-24, exact in float */
		float v = (float)m * 0x1p-24f;
		return sign ? -v : v;
	}
	return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

/* bfloat16 is float32's top half: round the low 16 bits to even (a carry into
 * the exponent is right, up to inf), NaN kept quiet. */
uint16_t dg_f32_to_bf16(float f)
{
	uint32_t x = f32_bits(f);

	if ((x & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((x >> 16) | 0x40);
	x += 0x7fff + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

float dg_bf16_to_f32(uint16_t h)
{
	return f32_from_bits((uint32_t)h << 16);
}

void dg_half_to_f32(enum dg_dtype dt, const uint16_t *in, float *out, int64_t n)
{
	if (dt == DG_F16) {
		for (int64_t i = 0; i < n; i++)
			out[i] = dg_f16_to_f32(in[i]);
	} else if (dt == DG_BF16) {
		for (int64_t i = 0; i < n; i++)
			out[i] = dg_bf16_to_f32(in[i]);
	}
}

void dg_f32_to_half(enum dg_dtype dt, const float *in, uint16_t *out, int64_t n)
{
	if (dt == DG_F16) {
		for (int64_t i = 0; i < n; i++)
			out[i] = dg_f32_to_f16(in[i]);
	} else if (dt == DG_BF16) {
		for (int64_t i = 0; i < n; i++)
			out[i] = dg_f32_to_bf16(in[i]);
	}
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
	dg_err_hint(err, "use one of float32, float64, int32, int64, uint8, bool, float16, "
		    "bfloat16");
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
	case DG_F16: return dg_f16_to_f32(((const uint16_t *)t->data)[i]);
	case DG_BF16: return dg_bf16_to_f32(((const uint16_t *)t->data)[i]);
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
	case DG_F16: ((uint16_t *)t->data)[i] = dg_f64_to_f16(v); break;
	case DG_BF16: ((uint16_t *)t->data)[i] = dg_f64_to_bf16(v); break;
	default: break;
	}
}
