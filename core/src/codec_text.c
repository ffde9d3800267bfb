/* The text encoding of a tensor (dg/codec.h): a "# dtype [shape]" line, then
 * one row of the last dimension per line, with numbers that read back to the
 * same bits. Written for people and shell scripts (the mount's text/ view, the
 * CLI's output and --feed); the decoder ignores layout and only counts numbers. */
#include "dg/codec.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* --- encoding --------------------------------------------------------------- */

/* Longest element: "-2.2250738585072014e-308" is 24 bytes; a separator and a
 * newline or a blank line fit in the slack. */
#define ELEM_MAX 32

/* Text is staged in a local buffer and appended in large pieces: no per-element
 * allocation or buffer call. */
struct out {
	struct dg_buf *b;
	struct dg_err *err;
	enum dg_status st;
	size_t n;
	char buf[16384];
};

static void out_flush(struct out *o)
{
	if (o->n && o->st == DG_OK)
		o->st = dg_buf_append(o->b, o->buf, o->n, o->err);
	o->n = 0;
}

/* Make room for one element plus separators. */
static inline void out_room(struct out *o)
{
	if (o->n > sizeof o->buf - ELEM_MAX - 4)
		out_flush(o);
}

static inline void out_char(struct out *o, char c)
{
	o->buf[o->n++] = c;
}

/* Unsigned decimal, written right to left. */
static inline int fmt_u64(char *s, uint64_t v)
{
	char tmp[24];
	int n = 0;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (int i = 0; i < n; i++)
		s[i] = tmp[n - 1 - i];
	return n;
}

/* Signed decimal; the magnitude is taken in unsigned so INT64_MIN is fine. */
static inline int fmt_i64(char *s, int64_t v)
{
	if (v < 0) {
		s[0] = '-';
		return 1 + fmt_u64(s + 1, 0 - (uint64_t)v);
	}
	return fmt_u64(s, (uint64_t)v);
}

/* nan, inf, -inf: spelled out (printf would write "-nan" for some NaNs). */
static inline int fmt_special(char *s, double x)
{
	const char *w = isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
	int n = (int)strlen(w);

	memcpy(s, w, (size_t)n);
	return n;
}

/* Shortest round-trip formatting. The contract: the shortest of %.{lo}g ..
 * %.{hi}g that reads back to the same bits (lo..hi = 6..9 for float32, 15..17
 * for float64). The reference implementation below calls snprintf and
 * strtof/strtod once per precision (about 1 us per element); the fast path
 * computes the same digits with long double arithmetic and falls back to the
 * reference whenever its error bound cannot decide a rounding. */
static int fmt_float_ref(char *s, double x, bool single)
{
	int lo = single ? 6 : 15, hi = single ? 9 : 17, n = 0;

	for (int p = lo; p <= hi; p++) {
		n = snprintf(s, ELEM_MAX, "%.*g", p, x);
		if (p == hi)
			break;
		if (single) {
			float y = strtof(s, NULL), xf = (float)x;
			if (memcmp(&y, &xf, sizeof y) == 0)
				break;
		} else {
			double y = strtod(s, NULL);
			if (memcmp(&y, &x, sizeof y) == 0)
				break;
		}
	}
	return n;
}

/* Write the n significant digits d (d[0] != '0') with decimal exponent e10 as
 * "%.{prec}g" does: fixed notation when -4 <= e10 < prec, else d.ddde+XX;
 * trailing zeros and a bare '.' dropped. */
static int write_g(char *s, bool neg, const char *d, int n, int e10, int prec)
{
	int k = 0;

	while (n > 1 && d[n - 1] == '0')
		n--;
	if (neg)
		s[k++] = '-';
	if (e10 < -4 || e10 >= prec) {
		s[k++] = d[0];
		if (n > 1) {
			s[k++] = '.';
			memcpy(s + k, d + 1, (size_t)n - 1);
			k += n - 1;
		}
		s[k++] = 'e';
		s[k++] = e10 < 0 ? '-' : '+';
		int a = e10 < 0 ? -e10 : e10;
		if (a < 10)
			s[k++] = '0';
		k += fmt_u64(s + k, (uint64_t)a);
	} else if (e10 < 0) {
		/* 0.000ddd */
		s[k++] = '0';
		s[k++] = '.';
		for (int i = 0; i < -e10 - 1; i++)
			s[k++] = '0';
		memcpy(s + k, d, (size_t)n);
		k += n;
	} else {
		/* ddd.ddd: e10 + 1 integer digits, zero-filled past n */
		for (int i = 0; i <= e10; i++)
			s[k++] = i < n ? d[i] : '0';
		if (n > e10 + 1) {
			s[k++] = '.';
			memcpy(s + k, d + e10 + 1, (size_t)(n - e10 - 1));
			k += n - e10 - 1;
		}
	}
	s[k] = '\0';
	return k;
}

#if LDBL_MANT_DIG >= 64
/* Powers of ten as long double: 10^0..10^27 are exact (5^27 < 2^64); the
 * steps of 10^28 are rounded once by the compiler. 10^k for |k| <= 363 then
 * costs at most two more roundings. */
static const long double p10_lo[28] = {
	1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,
	1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
	1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L,
};
static const long double p10_hi[13] = {
	1e0L,	1e28L,	1e56L,	1e84L,	1e112L, 1e140L, 1e168L,
	1e196L, 1e224L, 1e252L, 1e280L, 1e308L, 1e336L,
};

/* x * 10^k; relative error below 4 * 2^-64 for |k| <= 363. */
static long double scale10(long double x, int k)
{
	if (k >= 0)
		return x * p10_hi[k / 28] * p10_lo[k % 28];
	k = -k;
	return x / p10_hi[k / 28] / p10_lo[k % 28];
}

/* 10^0..10^19 as integers, for the digit arithmetic. */
static const uint64_t p10u[20] = {
	1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
	100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL,
	10000000000000ULL, 100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
	100000000000000000ULL, 1000000000000000000ULL, 10000000000000000000ULL,
};

/* floor(n * log10(2)) for |n| < 1650, in integers (78913 / 2^18 ~ log10 2). */
static int floor_log10_pow2(int n)
{
	long v = (long)n * 78913;

	return (int)(v >= 0 ? v / 262144 : -((-v + 262143) / 262144));
}

/* The exponent of the first significant digit of a > 0 (floor(log10 a)),
 * from the binary exponent (which gives it exactly or one low) and one
 * correction. Near a power of ten rounding may still leave it off by one;
 * round_to_digits then refuses and the reference decides. */
static int decimal_exponent(long double a)
{
	int b;

	frexpl(a, &b);   /* a in [2^(b-1), 2^b) */
	int e = floor_log10_pow2(b - 1);
	if (scale10(a, -e - 1) >= 1.0L)
		e++;
	return e;
}

/* a (> 0) correctly rounded to p significant digits: *q in [10^(p-1), 10^p)
 * and *e10 the exponent of its first digit (a carry to 10^p bumps it). False
 * when a lies so near a rounding tie, or e so near a power of ten, that the
 * error bound of scale10 cannot decide. llrintl rounds in the current mode
 * without the x87 control-word switches a cast to an integer costs. */
static bool round_to_digits(long double a, int e, int p, uint64_t *q, int *e10)
{
	long double y = scale10(a, p - 1 - e);

	if (y < p10_lo[p - 1] || y >= p10_lo[p])
		return false;
	long long r = llrintl(y);
	long double fr = y - (long double)r;   /* exact: y < 2^57 */
	if (fabsl(fabsl(fr) - 0.5L) <= y * 1e-18L)
		return false;
	*q = (uint64_t)r;
	*e10 = e;
	if (*q == p10u[p]) {   /* 9.99..97 rounded up to 10.0..0 */
		*q = p10u[p - 1];
		(*e10)++;
	}
	return true;
}

/* Does the decimal c read back as the value whose rounding interval is
 * (lo_b, hi_b)? 1 yes, 0 no, -1 too close to a boundary to call (ties at the
 * boundary itself included: the reference decides those). */
static int reads_back(long double c, long double lo_b, long double hi_b)
{
	long double tol = c * 1e-18L;

	if (fabsl(c - lo_b) <= tol || fabsl(c - hi_b) <= tol)
		return -1;
	return c > lo_b && c < hi_b;
}

/* The error bounds above assume a real 64-bit long double mantissa; an
 * emulator (valgrind computes x87 in double precision) would break them, so
 * check the arithmetic once and otherwise always use the reference. */
static bool long_double_is_exact(void)
{
	static _Atomic int ok = -1;   /* -1: not checked yet */
	int v = ok;

	if (v < 0) {
		volatile long double one = 1.0L, tiny = 0x1p-63L;
		v = one + tiny != one;
		ok = v;
	}
	return v;
}

/* The fast path: -1 when it cannot decide (the caller uses the reference). */
static int fmt_float_fast(char *s, double x, bool single)
{
	int lo = single ? 6 : 15, hi = single ? 9 : 17;
	bool neg = signbit(x);
	long double a = fabsl((long double)x), lo_b, hi_b;
	char d[24];
	uint64_t q;
	int e, e10;

	if (x == 0)
		return write_g(s, neg, "0", 1, 0, hi);
	if (!long_double_is_exact())
		return -1;
	/* The rounding interval of |x| among its neighbours (midpoints are
	 * exact in long double). The top neighbour of the largest value is as
	 * far as the bottom one. */
	if (single) {
		float f = (float)a, dn = nextafterf(f, 0), up = nextafterf(f, INFINITY);
		lo_b = ((long double)f + dn) / 2;
		hi_b = isinf(up) ? (long double)f + ((long double)f - dn) / 2
				 : ((long double)f + up) / 2;
	} else {
		double f = (double)a, dn = nextafter(f, 0), up = nextafter(f, INFINITY);
		lo_b = ((long double)f + dn) / 2;
		hi_b = isinf(up) ? (long double)f + ((long double)f - dn) / 2
				 : ((long double)f + up) / 2;
	}
	e = decimal_exponent(a);
	for (int p = lo; p <= hi; p++) {
		if (!round_to_digits(a, e, p, &q, &e10))
			return -1;
		/* hi digits always read back; shorter ones must be checked. */
		if (p < hi) {
			int ok = reads_back(scale10((long double)q, e10 - p + 1), lo_b, hi_b);
			if (ok < 0)
				return -1;
			if (!ok)
				continue;
		}
		fmt_u64(d, q);   /* exactly p digits */
		return write_g(s, neg, d, p, e10, p);
	}
	return -1;   /* not reached: p == hi returns */
}
#else
static int fmt_float_fast(char *s, double x, bool single)
{
	(void)s;
	(void)x;
	(void)single;
	return -1;
}
#endif

static int fmt_float(char *s, double x, bool single)
{
	int n;

	if (!isfinite(x))
		return fmt_special(s, x);
	n = fmt_float_fast(s, x, single);
	return n >= 0 ? n : fmt_float_ref(s, x, single);
}

static inline int fmt_f32(char *s, float x)
{
	return fmt_float(s, x, true);
}

static inline int fmt_f64(char *s, double x)
{
	return fmt_float(s, x, false);
}

/* A 16-bit float: the fewest significant digits (1 .. hi: 5 for float16's 11
 * significant bits, 4 for bfloat16's 8) that read back to the same bits, laid
 * out as %.{hi}g would (fixed notation for exponents -4 .. hi-1), so 1000 is
 * "1000" and not "1e+03". Text of 16-bit tensors is small; snprintf is fine. */
static int fmt_half(char *s, uint16_t h, bool bf16)
{
	double x = bf16 ? dg_bf16_to_f32(h) : dg_f16_to_f32(h);
	int hi = bf16 ? 4 : 5;
	char e[ELEM_MAX], d[8];

	if (!isfinite(x))
		return fmt_special(s, x);
	if (x == 0)
		return write_g(s, signbit(x), "0", 1, 0, hi);
	for (int p = 1; p <= hi; p++) {
		/* "d.ddde-XX": p digits and the decimal exponent */
		snprintf(e, sizeof e, "%.*e", p - 1, fabs(x));
		double y = strtod(e, NULL);
		if (p < hi && (bf16 ? dg_f64_to_bf16(y) : dg_f64_to_f16(y)) != (h & 0x7fff))
			continue;
		int n = 0;
		for (const char *c = e; *c && *c != 'e'; c++)
			if (*c != '.')
				d[n++] = *c;
		return write_g(s, signbit(x), d, n, atoi(strchr(e, 'e') + 1), hi);
	}
	return 0;   /* not reached: p == hi returns */
}

static inline int fmt_f16(char *s, uint16_t h)
{
	return fmt_half(s, h, false);
}

static inline int fmt_bf16(char *s, uint16_t h)
{
	return fmt_half(s, h, true);
}

static inline int fmt_i32(char *s, int32_t v)
{
	return fmt_i64(s, v);
}

static inline int fmt_u8(char *s, uint8_t v)
{
	return fmt_u64(s, v);
}

static inline int fmt_bool(char *s, uint8_t v)
{
	s[0] = v ? '1' : '0';
	return 1;
}

/* One function per dtype: elements x[0..n) separated by single spaces. */
#define DEFINE_PUT_ROW(name, T, fmt)                                       \
	static void name(struct out *o, const T *restrict x, int64_t n)   \
	{                                                                  \
		for (int64_t j = 0; j < n; j++) {                          \
			out_room(o);                                       \
			if (j)                                             \
				out_char(o, ' ');                          \
			o->n += (size_t)fmt(o->buf + o->n, x[j]);          \
		}                                                          \
	}

DEFINE_PUT_ROW(put_row_f32, float, fmt_f32)
DEFINE_PUT_ROW(put_row_f64, double, fmt_f64)
DEFINE_PUT_ROW(put_row_i32, int32_t, fmt_i32)
DEFINE_PUT_ROW(put_row_i64, int64_t, fmt_i64)
DEFINE_PUT_ROW(put_row_u8, uint8_t, fmt_u8)
DEFINE_PUT_ROW(put_row_bool, uint8_t, fmt_bool)
DEFINE_PUT_ROW(put_row_f16, uint16_t, fmt_f16)
DEFINE_PUT_ROW(put_row_bf16, uint16_t, fmt_bf16)

static void put_row(struct out *o, enum dg_dtype dt, const void *row, int64_t n)
{
	switch (dt) {
	case DG_F32: put_row_f32(o, row, n); break;
	case DG_F64: put_row_f64(o, row, n); break;
	case DG_I32: put_row_i32(o, row, n); break;
	case DG_I64: put_row_i64(o, row, n); break;
	case DG_U8: put_row_u8(o, row, n); break;
	case DG_BOOL: put_row_bool(o, row, n); break;
	case DG_F16: put_row_f16(o, row, n); break;
	case DG_BF16: put_row_bf16(o, row, n); break;
	default: break;
	}
}

enum dg_status dg_text_encode(const struct dg_tensor *t, struct dg_buf *out, struct dg_err *err)
{
	char sh[160];
	enum dg_status st;
	int nd = t->shape.ndim;

	if ((unsigned)t->dtype >= DG_DTYPE_COUNT || nd < 0 || nd > DG_MAX_DIMS)
		return dg_err_set(err, DG_EINVAL, "cannot write an invalid tensor as text");
	dg_shape_format(&t->shape, sh, sizeof sh);
	st = dg_buf_printf(out, err, "# %s %s\n", dg_dtype_name(t->dtype), sh);
	if (st != DG_OK || t->numel == 0)
		return st;

	struct out *o = malloc(sizeof *o);
	if (!o)
		return dg_err_set(err, DG_ENOMEM, "out of memory encoding a tensor as text");
	o->b = out;
	o->err = err;
	o->st = DG_OK;
	o->n = 0;
	/* rows of the last dimension; for rank >= 3 a blank line after every
	 * block of dim[nd-2] rows (one 2-d slice), except the last. */
	int64_t rowlen = nd ? t->shape.dim[nd - 1] : 1;
	int64_t nrows = t->numel / rowlen;
	int64_t block = nd >= 3 ? t->shape.dim[nd - 2] : 0;
	size_t rowbytes = (size_t)rowlen * dg_dtype_size(t->dtype);
	for (int64_t r = 0; r < nrows && o->st == DG_OK; r++) {
		if (block && r && r % block == 0) {
			out_room(o);
			out_char(o, '\n');
		}
		put_row(o, t->dtype, (const char *)t->data + (size_t)r * rowbytes, rowlen);
		out_room(o);
		out_char(o, '\n');
	}
	out_flush(o);
	st = o->st;
	free(o);
	return st;
}

/* --- decoding --------------------------------------------------------------- */

/* Longest token we parse: far more digits than any float needs. */
#define TOKEN_MAX 512

/* Outcome of parsing one token into one element. */
enum tok_res { TOK_OK, TOK_BAD, TOK_RANGE };

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* strtof/strtod into one element. ERANGE also flags denormal results, which
 * are fine; only overflow (a finite spelling that became inf) is refused.
 * float32 parses with strtof itself: rounding through double first could
 * round twice. */
#define DEFINE_PARSE_FLOAT(name, T, strto)                \
	static enum tok_res name(const char *s, void *dst) \
	{                                                  \
		char *end;                                 \
		errno = 0;                                 \
		T v = strto(s, &end);                      \
		if (end == s || *end)                      \
			return TOK_BAD;                    \
		if (errno == ERANGE && isinf(v))           \
			return TOK_RANGE;                  \
		memcpy(dst, &v, sizeof v);                 \
		return TOK_OK;                             \
	}

DEFINE_PARSE_FLOAT(parse_f32, float, strtof)
DEFINE_PARSE_FLOAT(parse_f64, double, strtod)

/* 16-bit floats parse through double and round once more; a finite spelling
 * that rounds to inf is out of range, as for float32. (Decimal -> double ->
 * 16 bits can differ from a direct rounding only for inputs within 2^-53 of
 * a 16-bit midpoint, i.e. more than 16 significant digits.) */
static enum tok_res parse_half(const char *s, void *dst, bool bf16)
{
	double v;
	enum tok_res r = parse_f64(s, &v);
	uint16_t h;

	if (r != TOK_OK)
		return r;
	h = bf16 ? dg_f64_to_bf16(v) : dg_f64_to_f16(v);
	if (isfinite(v) && (h & 0x7fff) == (bf16 ? 0x7f80 : 0x7c00))
		return TOK_RANGE;
	memcpy(dst, &h, sizeof h);
	return TOK_OK;
}

static enum tok_res parse_f16(const char *s, void *dst)
{
	return parse_half(s, dst, false);
}

static enum tok_res parse_bf16(const char *s, void *dst)
{
	return parse_half(s, dst, true);
}

/* Whole decimal integers only ("2.0" and "1e3" are not integers); the range
 * is checked by the caller's bounds. */
static enum tok_res parse_int(const char *s, long long lo, long long hi, long long *v)
{
	char *end;

	if (!((*s >= '0' && *s <= '9') || ((*s == '-' || *s == '+') && s[1] >= '0' && s[1] <= '9')))
		return TOK_BAD;
	errno = 0;
	*v = strtoll(s, &end, 10);
	if (*end)
		return TOK_BAD;
	if (errno == ERANGE || *v < lo || *v > hi)
		return TOK_RANGE;
	return TOK_OK;
}

static enum tok_res parse_i32(const char *s, void *dst)
{
	long long v;
	enum tok_res r = parse_int(s, INT32_MIN, INT32_MAX, &v);
	int32_t x = (int32_t)v;

	if (r == TOK_OK)
		memcpy(dst, &x, sizeof x);
	return r;
}

static enum tok_res parse_i64(const char *s, void *dst)
{
	long long v;
	enum tok_res r = parse_int(s, INT64_MIN, INT64_MAX, &v);
	int64_t x = v;

	if (r == TOK_OK)
		memcpy(dst, &x, sizeof x);
	return r;
}

static enum tok_res parse_u8(const char *s, void *dst)
{
	long long v;
	enum tok_res r = parse_int(s, 0, 255, &v);

	if (r == TOK_OK)
		*(uint8_t *)dst = (uint8_t)v;
	return r;
}

static enum tok_res parse_bool(const char *s, void *dst)
{
	uint8_t *b = dst;

	if (strcmp(s, "1") == 0 || strcasecmp(s, "true") == 0)
		*b = 1;
	else if (strcmp(s, "0") == 0 || strcasecmp(s, "false") == 0)
		*b = 0;
	else
		return TOK_BAD;
	return TOK_OK;
}

typedef enum tok_res (*parse_fn)(const char *s, void *dst);

static const parse_fn parsers[DG_DTYPE_COUNT] = {
	[DG_F32] = parse_f32, [DG_F64] = parse_f64, [DG_I32] = parse_i32,
	[DG_I64] = parse_i64, [DG_U8] = parse_u8,   [DG_BOOL] = parse_bool,
	[DG_F16] = parse_f16, [DG_BF16] = parse_bf16,
};

static const char *const range_text[DG_DTYPE_COUNT] = {
	[DG_F32] = "about -3.4e38 to 3.4e38 (or inf)",
	[DG_F64] = "about -1.8e308 to 1.8e308 (or inf)",
	[DG_I32] = "-2147483648 to 2147483647",
	[DG_I64] = "-9223372036854775808 to 9223372036854775807",
	[DG_U8] = "0 to 255",
	[DG_BOOL] = "0 and 1",
	[DG_F16] = "-65504 to 65504 (or inf)",
	[DG_BF16] = "about -3.39e38 to 3.39e38 (or inf)",
};

/* A token fit for a message: at most 40 bytes, non-printables as '?'. */
static void show_token(const char *tok, size_t len, char *out, size_t cap)
{
	size_t k = 0;

	for (size_t i = 0; i < len && k + 4 < cap && k < 40; i++)
		out[k++] = tok[i] >= 0x20 && tok[i] < 0x7f ? tok[i] : '?';
	if (len > 40 && k + 4 < cap) {
		memcpy(out + k, "...", 3);
		k += 3;
	}
	out[k] = '\0';
}

static enum dg_status bad_token(const char *tok, size_t len, long line, enum dg_dtype dt,
				enum tok_res r, struct dg_err *err)
{
	char shown[64];

	show_token(tok, len, shown, sizeof shown);
	if (r == TOK_RANGE) {
		dg_err_set(err, DG_EINVAL, "text line %ld: '%s' is out of range for %s", line,
			   shown, dg_dtype_name(dt));
		dg_err_hint(err, "%s values are %s", dg_dtype_name(dt), range_text[dt]);
		return DG_EINVAL;
	}
	dg_err_set(err, DG_EINVAL, "text line %ld: '%s' is not a valid %s", line, shown,
		   dg_dtype_name(dt));
	if (memchr(tok, ',', len))
		dg_err_hint(err, "separate numbers with spaces, not commas");
	else if (dt == DG_BOOL)
		dg_err_hint(err, "bool values are 0, 1, true or false");
	else if (dg_dtype_is_int(dt))
		dg_err_hint(err, "%s values are whole numbers from %s", dg_dtype_name(dt),
			    range_text[dt]);
	else
		dg_err_hint(err, "write decimal numbers such as 1.5 or -2e-3, or nan, inf, -inf");
	return DG_EINVAL;
}

/* The header line "# dtype [shape]" (text after '#', without the newline).
 * The shape part may be absent; then *has_shape stays false. */
static enum dg_status parse_header(const char *p, size_t len, long lno, enum dg_dtype *dt,
				   struct dg_shape *shape, bool *has_shape, struct dg_err *err)
{
	char line[256];
	size_t i = 0, k;
	enum dg_status st;

	if (len >= sizeof line) {
		dg_err_set(err, DG_EINVAL, "text line %ld: the header line is %zu bytes long", lno,
			   len);
		dg_err_hint(err, "the first line is '# DTYPE [SHAPE]', e.g. '# float32 [2,3]'");
		return DG_EINVAL;
	}
	memcpy(line, p, len);
	line[len] = '\0';
	while (line[i] && is_space(line[i]))
		i++;
	k = i;
	while (line[k] && !is_space(line[k]))
		k++;
	if (k == i) {
		dg_err_set(err, DG_EINVAL, "text line %ld: the header '#' names no dtype", lno);
		dg_err_hint(err, "the first line is '# DTYPE [SHAPE]', e.g. '# float32 [2,3]'; "
				 "put comments on later lines");
		return DG_EINVAL;
	}
	char *rest = line[k] ? line + k + 1 : line + k;
	line[k] = '\0';
	st = dg_dtype_parse(line + i, dt, err);
	if (st != DG_OK) {
		dg_err_prefix(err, "text line %ld (header)", lno);
		return st;
	}
	/* Trim the shape text; empty means "not given". */
	while (*rest && is_space(*rest))
		rest++;
	size_t rl = strlen(rest);
	while (rl && is_space(rest[rl - 1]))
		rest[--rl] = '\0';
	if (rl == 0)
		return DG_OK;
	st = dg_shape_parse(rest, shape, err);
	if (st != DG_OK) {
		dg_err_prefix(err, "text line %ld (header)", lno);
		return st;
	}
	*has_shape = true;
	return DG_OK;
}

/* Scan the numbers of p[0..len), starting on line `line`, appending each as
 * one element of dt to vals. *count gets the number of elements. */
static enum dg_status scan_numbers(const char *p, size_t len, long line, enum dg_dtype dt,
				   struct dg_buf *vals, int64_t *count, struct dg_err *err)
{
	char tok[TOKEN_MAX + 1];
	size_t es = dg_dtype_size(dt);
	parse_fn parse = parsers[dt];
	size_t i = 0;
	int64_t n = 0;
	enum dg_status st;

	while (i < len) {
		char c = p[i];
		if (c == '\n') {
			line++;
			i++;
			continue;
		}
		if (is_space(c)) {
			i++;
			continue;
		}
		if (c == '#') {
			/* A comment runs to the end of the line. */
			while (i < len && p[i] != '\n')
				i++;
			continue;
		}
		size_t start = i;
		while (i < len && !is_space(p[i]))
			i++;
		size_t tl = i - start;
		if (tl > TOKEN_MAX) {
			char shown[64];
			show_token(p + start, tl, shown, sizeof shown);
			dg_err_set(err, DG_EINVAL, "text line %ld: token '%s' is %zu bytes long",
				   line, shown, tl);
			dg_err_hint(err, "numbers are separated by spaces or newlines");
			return DG_EINVAL;
		}
		memcpy(tok, p + start, tl);
		tok[tl] = '\0';
		if (vals->cap - vals->len < es + 1) {
			st = dg_buf_reserve(vals, vals->len + es, err);   /* at least doubles */
			if (st != DG_OK)
				return st;
		}
		enum tok_res r = parse(tok, vals->data + vals->len);
		if (r != TOK_OK)
			return bad_token(p + start, tl, line, dt, r, err);
		vals->len += es;
		n++;
	}
	*count = n;
	return DG_OK;
}

/* The shape of count elements when no header gave one: want (one unknown dim
 * may be inferred), else a scalar for one number, else 1-d. */
static enum dg_status pick_shape(const struct dg_shape *want, int64_t count,
				 struct dg_shape *out, struct dg_err *err)
{
	char sh[160];
	int unknown = -1;
	int64_t known = 1;

	if (!want || want->ndim < 0) {
		out->ndim = count == 1 ? 0 : 1;
		out->dim[0] = count;
		return DG_OK;
	}
	if (want->ndim > DG_MAX_DIMS)
		return dg_err_set(err, DG_EINVAL, "text: shape has %d dimensions; at most %d are "
						  "allowed", want->ndim, DG_MAX_DIMS);
	*out = *want;
	for (int i = 0; i < want->ndim; i++) {
		if (want->dim[i] >= 0) {
			/* Once past the element limit no count can match. */
			if (want->dim[i] > 0 && known > DG_MAX_NUMEL / want->dim[i])
				known = DG_MAX_NUMEL + 1;
			else
				known *= want->dim[i];
			continue;
		}
		if (unknown >= 0) {
			dg_shape_format(want, sh, sizeof sh);
			return dg_err_set(err, DG_ESHAPE,
					  "text has %lld numbers; shape %s has more "
					  "than one unknown size to infer",
					  (long long)count, sh);
		}
		unknown = i;
	}
	if (unknown >= 0 && known > 0 && count % known == 0) {
		out->dim[unknown] = count / known;
		return DG_OK;
	}
	if (unknown >= 0 && known == 0 && count == 0) {
		out->dim[unknown] = 0;    /* any size fits; 0 is the natural one */
		return DG_OK;
	}
	if (unknown < 0 && known == count)
		return DG_OK;
	dg_shape_format(want, sh, sizeof sh);
	dg_err_set(err, DG_ESHAPE, "text has %lld numbers but shape %s needs %s%lld",
		   (long long)count, sh, unknown >= 0 ? "a multiple of " : "", (long long)known);
	dg_err_hint(err, "write exactly the tensor's elements, in C order");
	return DG_ESHAPE;
}

struct dg_tensor *dg_text_decode(const char *p, size_t len, const enum dg_dtype *want_dt,
				 const struct dg_shape *want_shape, struct dg_err *err)
{
	enum dg_dtype dt = want_dt ? *want_dt : DG_F64;
	struct dg_shape shape = { .ndim = 0 };
	bool has_shape = false;
	struct dg_buf vals = { 0 };
	struct dg_tensor *t = NULL;
	size_t off = 0;
	int64_t count = 0, numel = 0;
	long line = 1;

	if ((unsigned)dt >= DG_DTYPE_COUNT) {
		dg_err_set(err, DG_EDTYPE, "text: invalid dtype code %d", (int)dt);
		return NULL;
	}
	/* The header is the first line that is not blank, when it starts with '#'. */
	size_t h0 = 0;
	long hline = 1;
	while (h0 < len && is_space(p[h0]))
		hline += p[h0++] == '\n';
	if (h0 < len && p[h0] == '#') {
		const char *nl = memchr(p + h0, '\n', len - h0);
		size_t he = nl ? (size_t)(nl - p) : len;
		if (parse_header(p + h0 + 1, he - h0 - 1, hline, &dt, &shape, &has_shape,
				 err) != DG_OK)
			return NULL;
		off = nl ? he + 1 : len;
		line = hline + 1;
	}
	if (has_shape && dg_shape_numel(&shape, &numel, err) != DG_OK)
		return NULL;
	/* Reserve for the elements the header promises, but never more than the
	 * text could hold (one digit and one separator each), so a lying header
	 * cannot make us allocate much beyond the input. Without a header, start
	 * small and let the buffer double. */
	int64_t guess = (int64_t)((len - off) / 2 + 1);
	if (has_shape && numel < guess)
		guess = numel;
	else if (!has_shape && guess > 4096)
		guess = 4096;
	if (dg_buf_reserve(&vals, (size_t)guess * dg_dtype_size(dt), err) != DG_OK)
		goto out;
	if (scan_numbers(p + off, len - off, line, dt, &vals, &count, err) != DG_OK)
		goto out;
	if (has_shape && count != numel) {
		char sh[160];
		dg_shape_format(&shape, sh, sizeof sh);
		dg_err_set(err, DG_EINVAL,
			   "text header says %s %s (%lld elements) but %lld numbers "
			   "were found",
			   dg_dtype_name(dt), sh, (long long)numel, (long long)count);
		dg_err_hint(err, "fix the shape on the first line or the numbers below it");
		goto out;
	}
	if (!has_shape && pick_shape(want_shape, count, &shape, err) != DG_OK)
		goto out;
	t = dg_tensor_from_data(dt, &shape, vals.data, err);
out:
	dg_buf_deinit(&vals);
	return t;
}
