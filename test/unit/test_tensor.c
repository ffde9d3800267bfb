/* dtypes, shapes and host tensors (core/src/tensor.c), plus the byte buffers
 * and file helpers of core/src/buf.c that every encoder writes into: parsing
 * and its refusals, broadcasting with unknown dims, allocation and ownership,
 * saturating conversion, and buffer growth limits. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dg/buf.h"
#include "dg/tensor.h"

static struct dg_shape sh(int ndim, int64_t d0, int64_t d1, int64_t d2)
{
	int64_t d[3] = { d0, d1, d2 };

	return dg_shape_make(ndim, d);
}

static void assert_err(enum dg_status st, enum dg_status code, const struct dg_err *err,
		       const char *want)
{
	cr_assert_eq(st, code, "status %s (%s), wanted %s", dg_status_name(st), err->msg,
		     dg_status_name(code));
	cr_assert_not_null(strstr(err->msg, want), "message '%s' lacks '%s'", err->msg, want);
}

/* --- dtypes -------------------------------------------------------------------- */

Test(tensor, dtypes_have_names_sizes_and_kinds)
{
	static const struct {
		enum dg_dtype dt;
		const char *name;
		size_t size;
		bool is_float, is_int;
	} want[] = {
		{ DG_F32, "float32", 4, true, false }, { DG_F64, "float64", 8, true, false },
		{ DG_I32, "int32", 4, false, true },   { DG_I64, "int64", 8, false, true },
		{ DG_U8, "uint8", 1, false, true },    { DG_BOOL, "bool", 1, false, false },
		{ DG_F16, "float16", 2, false, false }, { DG_BF16, "bfloat16", 2, false, false },
	};

	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		cr_assert_str_eq(dg_dtype_name(want[i].dt), want[i].name);
		cr_assert_eq(dg_dtype_size(want[i].dt), want[i].size);
		cr_assert_eq(dg_dtype_is_float(want[i].dt), want[i].is_float);
		cr_assert_eq(dg_dtype_is_int(want[i].dt), want[i].is_int);
		cr_assert_eq(dg_dtype_is_half(want[i].dt), want[i].size == 2);
		enum dg_dtype back;
		cr_assert_eq(dg_dtype_parse(want[i].name, &back, NULL), DG_OK);
		cr_assert_eq(back, want[i].dt);
	}
	cr_assert_str_eq(dg_dtype_name((enum dg_dtype)77), "invalid");
	cr_assert_eq(dg_dtype_size((enum dg_dtype)77), 0);
}

Test(tensor, dtype_aliases_parse_numpy_style)
{
	static const struct {
		const char *s;
		enum dg_dtype dt;
	} want[] = {
		{ "f4", DG_F32 },   { "float", DG_F32 },  { "single", DG_F32 }, { "f8", DG_F64 },
		{ "double", DG_F64 }, { "i4", DG_I32 },   { "int", DG_I32 },    { "i8", DG_I64 },
		{ "long", DG_I64 },  { "u1", DG_U8 },     { "byte", DG_U8 },    { "b1", DG_BOOL },
		{ "?", DG_BOOL },    { "boolean", DG_BOOL }, { "f2", DG_F16 },
		{ "half", DG_F16 },  { "bf16", DG_BF16 },
	};

	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		enum dg_dtype dt = DG_DTYPE_COUNT;
		cr_assert_eq(dg_dtype_parse(want[i].s, &dt, NULL), DG_OK, "%s", want[i].s);
		cr_assert_eq(dt, want[i].dt, "%s", want[i].s);
	}
}

Test(tensor, unknown_dtypes_are_refused_with_the_valid_names)
{
	const char *bad[] = { "float8", "Float32", "", "int8", "f4 ", "complex64" };
	enum dg_dtype dt = DG_F64;
	struct dg_err err = { 0 };

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char want[64];
		snprintf(want, sizeof want, "unknown dtype '%s'", bad[i]);
		assert_err(dg_dtype_parse(bad[i], &dt, &err), DG_EDTYPE, &err, want);
		cr_assert_not_null(strstr(err.hint, "float32, float64, int32, int64, uint8, bool, "
					  "float16, bfloat16"));
		cr_assert_eq(dt, DG_F64, "output changed on failure");
	}
	assert_err(dg_dtype_parse(NULL, &dt, &err), DG_EDTYPE, &err, "(null)");
}

/* --- shapes -------------------------------------------------------------------- */

Test(tensor, shapes_parse_in_every_spelling)
{
	static const struct {
		const char *s;
		int ndim;
		int64_t d0, d1;
	} want[] = {
		{ "[2,3]", 2, 2, 3 }, { "2,3", 2, 2, 3 },    { "2x3", 2, 2, 3 },
		{ "2X3", 2, 2, 3 },   { "(2, 3)", 2, 2, 3 }, { " [ 2 , 3 ] ", 2, 2, 3 },
		{ "", 0, 0, 0 },      { "[]", 0, 0, 0 },     { "  ", 0, 0, 0 },
		{ "[0]", 1, 0, 0 },   { "5", 1, 5, 0 },      { "[7,0]", 2, 7, 0 },
	};

	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		struct dg_shape s;
		struct dg_err err = { 0 };
		cr_assert_eq(dg_shape_parse(want[i].s, &s, &err), DG_OK, "'%s': %s", want[i].s,
			     err.msg);
		cr_assert_eq(s.ndim, want[i].ndim, "'%s'", want[i].s);
		if (s.ndim > 0)
			cr_assert_eq(s.dim[0], want[i].d0);
		if (s.ndim > 1)
			cr_assert_eq(s.dim[1], want[i].d1);
	}
	struct dg_shape s;
	cr_assert_eq(dg_shape_parse("[1,2,3,4,5,6,7,8]", &s, NULL), DG_OK);
	cr_assert_eq(s.ndim, 8);
	cr_assert_eq(s.dim[7], 8);
}

Test(tensor, malformed_shapes_are_refused_with_a_hint)
{
	const char *bad[] = { "[2,3", "2,3]", "2,,3", "2,", "-1", "a", "[2 3]", "[2,3] x", "2.5",
			      "[,]" };
	struct dg_err err = { 0 };
	struct dg_shape s = sh(1, 42, 0, 0);

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_err(dg_shape_parse(bad[i], &s, &err), DG_EINVAL, &err, "cannot parse shape");
		cr_assert_not_null(strstr(err.msg, bad[i]), "%s", err.msg);
		cr_assert_not_null(strstr(err.hint, "[2,3]"), "%s", err.hint);
		cr_assert_eq(s.dim[0], 42, "output changed on failure");
	}
}

Test(tensor, oversized_shapes_are_refused)
{
	struct dg_err err = { 0 };
	struct dg_shape s;

	assert_err(dg_shape_parse("[2147483648,2147483648,2147483648]", &s, &err), DG_ETOOLARGE,
		   &err, "more than 2^48 elements");
	assert_err(dg_shape_parse("[1,1,1,1,1,1,1,1,1]", &s, &err), DG_EINVAL, &err,
		   "more than 8 dimensions");
	assert_err(dg_shape_parse("99999999999999999999", &s, &err), DG_ETOOLARGE, &err,
		   "too large");
	assert_err(dg_shape_parse("281474976710657", &s, &err), DG_ETOOLARGE, &err, "too large");
	cr_assert_eq(dg_shape_parse("281474976710656", &s, &err), DG_OK, "2^48 itself is fine");
}

Test(tensor, shapes_format_with_unknowns)
{
	char buf[64];
	struct dg_shape unknown_rank = { .ndim = -1 };
	struct dg_shape partial = sh(3, -1, 3, 0);

	struct dg_shape m = sh(2, 2, 3, 0);
	cr_assert_eq(dg_shape_format(&m, buf, sizeof buf), 5);
	cr_assert_str_eq(buf, "[2,3]");
	struct dg_shape scalar = { .ndim = 0 };
	dg_shape_format(&scalar, buf, sizeof buf);
	cr_assert_str_eq(buf, "[]");
	dg_shape_format(&partial, buf, sizeof buf);
	cr_assert_str_eq(buf, "[?,3,0]");
	dg_shape_format(&unknown_rank, buf, sizeof buf);
	cr_assert_str_eq(buf, "<unknown>");
}

Test(tensor, shape_format_truncates_and_reports_the_length_it_wanted)
{
	char buf[6];
	struct dg_shape s = sh(3, 1000, 2000, 3);

	cr_assert_eq(dg_shape_format(&s, buf, sizeof buf), 13);   /* "[1000,2000,3]" */
	cr_assert_str_eq(buf, "[1000");
	cr_assert_eq(dg_shape_format(&s, NULL, 0), 13);
}

Test(tensor, numel_counts_and_checks_bounds)
{
	struct dg_err err = { 0 };
	int64_t n = -1;
	struct dg_shape s = sh(3, 2, 3, 4), z = sh(3, 5, 0, 7), scalar = { .ndim = 0 };

	cr_assert_eq(dg_shape_numel(&s, &n, NULL), DG_OK);
	cr_assert_eq(n, 24);
	cr_assert_eq(dg_shape_numel(&z, &n, NULL), DG_OK);
	cr_assert_eq(n, 0);
	cr_assert_eq(dg_shape_numel(&scalar, &n, NULL), DG_OK);
	cr_assert_eq(n, 1);
	struct dg_shape big = sh(3, 1LL << 31, 1LL << 31, 1LL << 31);
	assert_err(dg_shape_numel(&big, &n, &err), DG_ETOOLARGE, &err, "[2147483648,");
	struct dg_shape neg = sh(2, 3, -1, 0);
	assert_err(dg_shape_numel(&neg, &n, &err), DG_EINVAL, &err, "negative dimension");
	struct dg_shape nine = { .ndim = 9 };
	assert_err(dg_shape_numel(&nine, &n, &err), DG_EINVAL, &err, "9 dimensions");
	struct dg_shape max = sh(3, 65536, 65536, 65536);
	cr_assert_eq(dg_shape_numel(&max, &n, NULL), DG_OK);
	cr_assert_eq(n, (int64_t)1 << 48);
}

Test(tensor, a_zero_dim_does_not_excuse_absurd_other_dims)
{
	/* numel is 0, but kernels multiply the other dims together. */
	struct dg_err err = { 0 };
	int64_t n;
	struct dg_shape s = sh(3, 0, 1LL << 40, 1LL << 40);

	assert_err(dg_shape_numel(&s, &n, &err), DG_ETOOLARGE, &err, "2^48");
}

Test(tensor, shape_eq_and_is_known)
{
	struct dg_shape a = sh(2, 2, 3, 0), b = sh(2, 2, 3, 9), c = sh(2, 3, 2, 0);
	struct dg_shape d = sh(3, 2, 3, 1), u = sh(2, -1, 3, 0), r = { .ndim = -1 };

	cr_assert(dg_shape_eq(&a, &b), "dims past ndim are ignored");
	cr_assert_not(dg_shape_eq(&a, &c));
	cr_assert_not(dg_shape_eq(&a, &d));
	cr_assert(dg_shape_is_known(&a));
	cr_assert_not(dg_shape_is_known(&u));
	cr_assert_not(dg_shape_is_known(&r));
}

/* --- broadcasting ----------------------------------------------------------------- */

static void assert_broadcast(struct dg_shape a, struct dg_shape b, const char *want)
{
	struct dg_shape out;
	struct dg_err err = { 0 };
	char buf[64];

	cr_assert_eq(dg_shape_broadcast(&a, &b, &out, &err), DG_OK, "%s", err.msg);
	dg_shape_format(&out, buf, sizeof buf);
	cr_assert_str_eq(buf, want);
	/* Broadcasting is symmetric. */
	cr_assert_eq(dg_shape_broadcast(&b, &a, &out, &err), DG_OK, "%s", err.msg);
	dg_shape_format(&out, buf, sizeof buf);
	cr_assert_str_eq(buf, want);
}

Test(tensor, broadcast_follows_numpy_rules)
{
	struct dg_shape scalar = { .ndim = 0 };

	assert_broadcast(sh(2, 2, 3, 0), sh(1, 3, 0, 0), "[2,3]");
	assert_broadcast(sh(2, 2, 1, 0), sh(2, 1, 3, 0), "[2,3]");
	assert_broadcast(scalar, sh(1, 4, 0, 0), "[4]");
	assert_broadcast(scalar, scalar, "[]");
	assert_broadcast(sh(3, 5, 1, 4), sh(2, 3, 1, 0), "[5,3,4]");
	assert_broadcast(sh(1, 0, 0, 0), sh(1, 1, 0, 0), "[0]");
}

Test(tensor, broadcast_propagates_unknowns)
{
	struct dg_shape rank = { .ndim = -1 };

	assert_broadcast(sh(2, -1, 3, 0), sh(2, 2, 1, 0), "[2,3]");
	assert_broadcast(sh(1, -1, 0, 0), sh(1, 1, 0, 0), "[?]");
	assert_broadcast(sh(1, -1, 0, 0), sh(1, -1, 0, 0), "[?]");
	assert_broadcast(sh(2, -1, 4, 0), sh(1, 4, 0, 0), "[?,4]");
	assert_broadcast(rank, sh(2, 2, 3, 0), "<unknown>");
}

Test(tensor, broadcast_mismatch_names_both_shapes)
{
	struct dg_shape a = sh(2, 2, 3, 0), b = sh(1, 4, 0, 0), z = sh(1, 0, 0, 0),
			two = sh(1, 2, 0, 0);
	struct dg_shape out;
	struct dg_err err = { 0 };

	assert_err(dg_shape_broadcast(&a, &b, &out, &err), DG_ESHAPE, &err,
		   "shapes [2,3] and [4] cannot be broadcast together");
	cr_assert_not_null(strstr(err.hint, "equal or 1"));
	assert_err(dg_shape_broadcast(&z, &two, &out, &err), DG_ESHAPE, &err, "[0] and [2]");
}

/* --- tensors -------------------------------------------------------------------- */

Test(tensor, new_tensors_are_zeroed_aligned_and_sized)
{
	for (int dt = 0; dt < DG_DTYPE_COUNT; dt++) {
		struct dg_shape s = sh(3, 3, 5, 7);
		struct dg_err err = { 0 };
		struct dg_tensor *t = dg_tensor_new((enum dg_dtype)dt, &s, &err);
		cr_assert_not_null(t, "%s", err.msg);
		cr_assert_eq((int)t->dtype, dt);
		cr_assert_eq(t->numel, 105);
		cr_assert_eq(t->nbytes, 105 * dg_dtype_size((enum dg_dtype)dt));
		cr_assert_eq((uintptr_t)t->data % 64, 0);
		for (size_t i = 0; i < t->nbytes; i++)
			cr_assert_eq(((unsigned char *)t->data)[i], 0);
		cr_assert(dg_shape_eq(&t->shape, &s));
		dg_tensor_free(t);
	}
}

Test(tensor, empty_tensors_have_no_bytes)
{
	struct dg_shape s = sh(2, 4, 0, 0);
	struct dg_tensor *t = dg_tensor_new(DG_F64, &s, NULL);

	cr_assert_not_null(t);
	cr_assert_eq(t->numel, 0);
	cr_assert_eq(t->nbytes, 0);
	struct dg_tensor *c = dg_tensor_clone(t, NULL);
	cr_assert_not_null(c);
	cr_assert_eq(c->numel, 0);
	dg_tensor_free(c);
	dg_tensor_free(t);
	dg_tensor_free(NULL);
}

Test(tensor, bad_dtypes_and_shapes_are_refused_at_allocation)
{
	struct dg_err err = { 0 };
	struct dg_shape ok = sh(1, 2, 0, 0), neg = sh(1, -2, 0, 0), unk = { .ndim = -1 };
	struct dg_shape big = sh(3, 1LL << 20, 1LL << 20, 1LL << 20);

	cr_assert_null(dg_tensor_new((enum dg_dtype)9, &ok, &err));
	assert_err(err.code, DG_EDTYPE, &err, "invalid dtype code 9");
	cr_assert_null(dg_tensor_new(DG_F32, &neg, &err));
	assert_err(err.code, DG_EINVAL, &err, "negative");
	cr_assert_null(dg_tensor_new(DG_F32, &unk, &err));
	assert_err(err.code, DG_EINVAL, &err, "dimensions");
	cr_assert_null(dg_tensor_new_uninit(DG_U8, &big, &err));
	assert_err(err.code, DG_ETOOLARGE, &err, "2^48");
}

Test(tensor, from_data_and_clone_copy_the_bytes)
{
	struct dg_shape s = sh(2, 2, 2, 0);
	int32_t v[4] = { 1, -2, 3, INT32_MIN };
	struct dg_tensor *t = dg_tensor_from_data(DG_I32, &s, v, NULL);

	cr_assert_not_null(t);
	v[0] = 99;   /* the tensor owns a copy */
	cr_assert_eq(((int32_t *)t->data)[0], 1);
	cr_assert_eq(((int32_t *)t->data)[3], INT32_MIN);
	struct dg_tensor *c = dg_tensor_clone(t, NULL);
	cr_assert_not_null(c);
	cr_assert_neq(c->data, t->data);
	((int32_t *)t->data)[1] = 5;
	cr_assert_eq(((int32_t *)c->data)[1], -2);
	cr_assert(dg_shape_eq(&c->shape, &t->shape));
	dg_tensor_free(c);
	dg_tensor_free(t);
}

Test(tensor, scalars_hold_the_converted_value)
{
	static const struct {
		enum dg_dtype dt;
		double v, want;
	} cases[] = {
		{ DG_F32, 0.1, (float)0.1 }, { DG_F64, 0.1, 0.1 }, { DG_I32, -7.9, -7 },
		{ DG_I64, 1e15, 1e15 },      { DG_U8, 200, 200 }, { DG_BOOL, 0.5, 1 },
		{ DG_BOOL, 0, 0 },
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct dg_tensor *t = dg_tensor_scalar(cases[i].dt, cases[i].v, NULL);
		cr_assert_not_null(t);
		cr_assert_eq(t->shape.ndim, 0);
		cr_assert_eq(t->numel, 1);
		cr_assert_eq(dg_tensor_get_f64(t, 0), cases[i].want, "%s: %g",
			     dg_dtype_name(cases[i].dt), dg_tensor_get_f64(t, 0));
		dg_tensor_free(t);
	}
}

Test(tensor, set_saturates_out_of_range_values_instead_of_undefined_behaviour)
{
	struct dg_shape s = sh(1, 4, 0, 0);
	struct dg_tensor *i32 = dg_tensor_new(DG_I32, &s, NULL);
	struct dg_tensor *i64 = dg_tensor_new(DG_I64, &s, NULL);
	struct dg_tensor *u8 = dg_tensor_new(DG_U8, &s, NULL);

	double in[4] = { 1e10, -1e10, NAN, -INFINITY };
	for (int i = 0; i < 4; i++) {
		dg_tensor_set_f64(i32, i, in[i]);
		dg_tensor_set_f64(i64, i, in[i] * 1e10);
		dg_tensor_set_f64(u8, i, in[i]);
	}
	const int32_t *a = i32->data;
	const int64_t *b = i64->data;
	const uint8_t *c = u8->data;
	cr_assert(a[0] == INT32_MAX && a[1] == INT32_MIN && a[2] == 0 && a[3] == INT32_MIN);
	cr_assert(b[0] == INT64_MAX && b[1] == INT64_MIN && b[2] == 0 && b[3] == INT64_MIN);
	cr_assert(c[0] == 255 && c[1] == 0 && c[2] == 0 && c[3] == 0);
	dg_tensor_set_f64(i64, 0, 9223372036854775807.0);   /* rounds to 2^63 */
	cr_assert_eq(b[0], INT64_MAX);
	dg_tensor_set_f64(i64, 0, -9223372036854775808.0);
	cr_assert_eq(b[0], INT64_MIN);
	dg_tensor_set_f64(u8, 0, 254.9);
	cr_assert_eq(c[0], 254);
	dg_tensor_free(i32);
	dg_tensor_free(i64);
	dg_tensor_free(u8);
}

Test(tensor, get_and_set_convert_every_dtype)
{
	struct dg_shape s = sh(1, 3, 0, 0);

	for (int dt = 0; dt < DG_DTYPE_COUNT; dt++) {
		struct dg_tensor *t = dg_tensor_new((enum dg_dtype)dt, &s, NULL);
		dg_tensor_set_f64(t, 0, 3);
		dg_tensor_set_f64(t, 2, 1);
		cr_assert_eq(dg_tensor_get_f64(t, 0), dt == DG_BOOL ? 1 : 3);
		cr_assert_eq(dg_tensor_get_f64(t, 1), 0);
		cr_assert_eq(dg_tensor_get_f64(t, 2), 1);
		dg_tensor_free(t);
	}
}

Test(tensor, aligned_allocation_handles_zero_and_absurd_sizes)
{
	void *p = dg_alloc_aligned(0);

	cr_assert_not_null(p);
	cr_assert_eq((uintptr_t)p % 64, 0);
	dg_free_aligned(p);
	p = dg_alloc_aligned(100);
	cr_assert_eq((uintptr_t)p % 64, 0);
	memset(p, 1, 100);
	dg_free_aligned(p);
	cr_assert_null(dg_alloc_aligned(SIZE_MAX));
	cr_assert_null(dg_alloc_aligned(SIZE_MAX - 10));
	dg_free_aligned(NULL);
}

/* --- buffers and files (core/src/buf.c) ------------------------------------------- */

Test(buf, append_and_printf_grow_and_keep_a_terminator)
{
	struct dg_buf b;
	char big[1000];

	dg_buf_init(&b);
	cr_assert_eq(dg_buf_append(&b, "ab", 2, NULL), DG_OK);
	cr_assert_eq(dg_buf_printf(&b, NULL, "%d-%s", 42, "x"), DG_OK);
	cr_assert_eq(b.len, 6);
	cr_assert_str_eq(b.data, "ab42-x");
	/* Longer than printf's stack buffer. */
	memset(big, 'z', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	cr_assert_eq(dg_buf_printf(&b, NULL, "%s!", big), DG_OK);
	cr_assert_eq(b.len, 6 + 999 + 1);
	cr_assert_eq(b.data[b.len - 1], '!');
	cr_assert_eq(b.data[b.len], '\0');
	size_t len;
	char *p = dg_buf_steal(&b, &len);
	cr_assert_eq(len, 1006);
	cr_assert_null(b.data);
	cr_assert_eq(b.len, 0);
	free(p);
	dg_buf_deinit(&b);
}

Test(buf, reserve_refuses_sizes_that_wrap_around)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_buf_append(&b, "abc", 3, NULL), DG_OK);
	assert_err(dg_buf_reserve(&b, SIZE_MAX, &err), DG_ETOOLARGE, &err, "overflow");
	assert_err(dg_buf_reserve(&b, SIZE_MAX - 3, &err), DG_ETOOLARGE, &err, "overflow");
	cr_assert_str_eq(b.data, "abc");   /* unchanged */
	cr_assert_eq(b.len, 3);
	dg_buf_deinit(&b);
}

static void tmpdir(char *dir, size_t n)
{
	snprintf(dir, n, "/tmp/dg-test-buf-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

/* Files in dir other than . and .. */
static int count_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	cr_assert_not_null(d);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

Test(buf, files_write_atomically_and_read_back_within_limits)
{
	char dir[64], path[128];
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	tmpdir(dir, sizeof dir);
	snprintf(path, sizeof path, "%s/f", dir);
	cr_assert_eq(dg_write_file_atomic(path, "hello", 5, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(dg_write_file_atomic(path, "world!", 6, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(count_files(dir), 1, "a temporary file was left behind");
	cr_assert_eq(dg_buf_append(&b, ">", 1, NULL), DG_OK);
	cr_assert_eq(dg_buf_read_file(&b, path, 6, &err), DG_OK, "%s", err.msg);
	cr_assert_str_eq(b.data, ">world!");   /* appended */
	/* Over the limit: refused, and b is left as it was. */
	assert_err(dg_buf_read_file(&b, path, 5, &err), DG_ETOOLARGE, &err, "limit is 5");
	cr_assert_str_eq(b.data, ">world!");
	assert_err(dg_buf_read_file(&b, dir, 100, &err), DG_EINVAL, &err, "is a directory");
	snprintf(path, sizeof path, "%s/missing", dir);
	assert_err(dg_buf_read_file(&b, path, 100, &err), DG_ENOTFOUND, &err, "missing");
	snprintf(path, sizeof path, "%s/no/such/dir/f", dir);
	assert_err(dg_write_file_atomic(path, "x", 1, &err), DG_EIO, &err, "cannot create");
	dg_buf_deinit(&b);
	snprintf(path, sizeof path, "rm -rf '%s'", dir);
	cr_assert_eq(system(path), 0);
}

Test(buf, pipes_without_a_size_are_read_to_the_end)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };
	int fds[2];
	char path[64], chunk[5000];

	cr_assert_eq(pipe(fds), 0);
	memset(chunk, 'q', sizeof chunk);
	cr_assert_eq(write(fds[1], chunk, sizeof chunk), (ssize_t)sizeof chunk);
	close(fds[1]);
	snprintf(path, sizeof path, "/proc/self/fd/%d", fds[0]);
	cr_assert_eq(dg_buf_read_file(&b, path, 1 << 20, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(b.len, sizeof chunk);
	cr_assert_eq(b.data[4999], 'q');
	close(fds[0]);
	dg_buf_deinit(&b);
}

/* The cache of large freed blocks (core/src/alloc.c); off in sanitizer builds,
 * where reuse would hide use-after-free. */
#if defined(__SANITIZE_ADDRESS__)
#define ALLOC_CACHE_ON 0
#else
#define ALLOC_CACHE_ON 1
#endif

Test(alloc, large_freed_blocks_are_reused_for_the_same_size)
{
	if (!ALLOC_CACHE_ON)
		cr_skip_test("the block cache is off under AddressSanitizer");
	dg_alloc_trim();
	char *p = dg_alloc_aligned(4 << 20);
	cr_assert_not_null(p);
	cr_assert_eq((uintptr_t)p % 64, 0);
	memset(p, 7, 4 << 20);
	dg_free_aligned(p);
	cr_assert_eq(dg_alloc_cached_bytes(), (size_t)4 << 20);
	char *q = dg_alloc_aligned((4 << 20) - 100);   /* within 1/8: best fit reuses it */
	cr_assert_eq(q, p);
	cr_assert_eq(dg_alloc_cached_bytes(), 0);
	char *r = dg_alloc_aligned(2 << 20);            /* nothing cached fits */
	cr_assert_neq(r, p);
	dg_free_aligned(q);
	dg_free_aligned(r);
	cr_assert_eq(dg_alloc_cached_bytes(), (size_t)6 << 20);
	char *s = dg_alloc_aligned(3 << 20);            /* 4 MiB is more than 1/8 too big */
	cr_assert_neq(s, q);
	dg_free_aligned(s);
	dg_alloc_trim();
	cr_assert_eq(dg_alloc_cached_bytes(), 0);
}

Test(alloc, blocks_from_128_kib_are_cached_as_a_784_kib_variable_is)
{
	if (!ALLOC_CACHE_ON)
		cr_skip_test("the block cache is off under AddressSanitizer");
	dg_alloc_trim();
	char *p = dg_alloc_aligned(784 * 256 * 4);      /* the MLP's w1 */
	cr_assert_not_null(p);
	dg_free_aligned(p);
	cr_assert_eq(dg_alloc_cached_bytes(), (size_t)784 * 256 * 4);
	cr_assert_eq(dg_alloc_aligned(784 * 256 * 4), p);
	dg_free_aligned(p);
	char *small = dg_alloc_aligned((128 << 10) - 64);       /* below: malloc's */
	dg_free_aligned(small);
	cr_assert_eq(dg_alloc_cached_bytes(), (size_t)784 * 256 * 4);
	dg_alloc_trim();
}

/* The VmFlags line of the mapping of /proc/self/smaps that holds addr, or
 * "" when none is found. */
static void vm_flags_of(uintptr_t addr, char *out, size_t n)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	bool in = false;

	out[0] = '\0';
	if (!f)
		return;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
			in = addr >= lo && addr < hi;
		else if (in && strncmp(line, "VmFlags:", 8) == 0) {
			snprintf(out, n, "%s", line);
			break;
		}
	}
	fclose(f);
}

/* Blocks of 2 MiB and more are advised for transparent huge pages. The
 * advice was given for the block itself, whose start is never page-aligned,
 * so madvise always failed with EINVAL and the advice never took. */
Test(alloc, large_blocks_are_advised_for_huge_pages)
{
	char mode[128] = "", flags[512];
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");

	if (f) {
		if (!fgets(mode, sizeof mode, f))
			mode[0] = '\0';
		fclose(f);
	}
	if (!mode[0] || strstr(mode, "[never]"))
		cr_skip_test("transparent huge pages are not available here");
	char *p = dg_alloc_aligned(8 << 20);
	cr_assert_not_null(p);
	vm_flags_of((uintptr_t)p + (4 << 20), flags, sizeof flags);
	cr_assert(strstr(flags, " hg"), "the block's mapping lacks the huge page advice: %s",
		  flags);
	dg_free_aligned(p);
}

Test(alloc, small_blocks_are_not_cached)
{
	dg_alloc_trim();
	void *p = dg_alloc_aligned(1000);
	cr_assert_not_null(p);
	dg_free_aligned(p);
	cr_assert_eq(dg_alloc_cached_bytes(), 0);
}

Test(alloc, cache_budget_from_the_environment_bounds_what_is_kept)
{
	if (!ALLOC_CACHE_ON)
		cr_skip_test("the block cache is off under AddressSanitizer");
	/* Each Criterion test runs in its own process, so the budget is read fresh. */
	setenv("DG_TENSOR_CACHE_MB", "5", 1);
	void *a = dg_alloc_aligned(4 << 20), *b = dg_alloc_aligned(4 << 20);
	void *c = dg_alloc_aligned(8 << 20);
	dg_free_aligned(a);
	cr_assert_eq(dg_alloc_cached_bytes(), (size_t)4 << 20);
	dg_free_aligned(b);                 /* evicts a: 8 MiB would exceed 5 */
	cr_assert_eq(dg_alloc_cached_bytes(), (size_t)4 << 20);
	dg_free_aligned(c);                 /* larger than the budget: freed */
	cr_assert_leq(dg_alloc_cached_bytes(), (size_t)5 << 20);
	dg_alloc_trim();
}

Test(alloc, zero_budget_disables_the_cache)
{
	setenv("DG_TENSOR_CACHE_MB", "0", 1);
	void *a = dg_alloc_aligned(4 << 20);
	dg_free_aligned(a);
	cr_assert_eq(dg_alloc_cached_bytes(), 0);
}

/* --- float16 and bfloat16 -------------------------------------------------------- */

/* Both narrowing paths (float32 bits, double) on one value. */
static void expect_f16(double v, uint16_t want)
{
	uint16_t a = dg_f64_to_f16(v), b = dg_f32_to_f16((float)v);

	cr_assert_eq(a, want, "f64 %.17g -> 0x%04x, want 0x%04x", v, a, want);
	if ((double)(float)v == v || isnan(v))
		cr_assert_eq(b, want, "f32 %.9g -> 0x%04x, want 0x%04x", v, b, want);
}

static void expect_bf16(double v, uint16_t want)
{
	uint16_t a = dg_f64_to_bf16(v), b = dg_f32_to_bf16((float)v);

	cr_assert_eq(a, want, "f64 %.17g -> 0x%04x, want 0x%04x", v, a, want);
	if ((double)(float)v == v || isnan(v))
		cr_assert_eq(b, want, "f32 %.9g -> 0x%04x, want 0x%04x", v, b, want);
}

Test(half, float16_rounds_to_nearest_even_with_inf_on_overflow)
{
	expect_f16(1.0, 0x3c00);
	expect_f16(-2.0, 0xc000);
	expect_f16(1.0 / 3.0, 0x3555);
	expect_f16(0.1, 0x2e66);
	expect_f16(65504, 0x7bff);          /* the largest float16 */
	expect_f16(65519.99, 0x7bff);       /* below the midpoint to 2^16 */
	expect_f16(65520, 0x7c00);          /* the midpoint: ties to even, which is inf */
	expect_f16(-1e9, 0xfc00);
	expect_f16(1 + 0x1p-11, 0x3c00);    /* tie between 1 and 1+2^-10: even 1 */
	expect_f16(1 + 3 * 0x1p-11, 0x3c02);  /* tie between 0x3c01 and 0x3c02: even */
	expect_f16(1 + 0x1p-11 + 0x1p-20, 0x3c01);  /* just past the tie: up */
	expect_f16(2049, 0x6800);           /* integers above 2048 step by 2 */
	expect_f16(2051, 0x6802);
	expect_f16(-0.0, 0x8000);
	expect_f16(INFINITY, 0x7c00);
	expect_f16(-INFINITY, 0xfc00);
}

Test(half, float16_subnormals_round_right)
{
	expect_f16(0x1p-14, 0x0400);        /* smallest normal */
	expect_f16(0x1p-24, 0x0001);        /* smallest subnormal */
	expect_f16(1023 * 0x1p-24, 0x03ff);  /* largest subnormal */
	expect_f16(0x1p-25, 0x0000);        /* half the smallest: tie to even 0 */
	expect_f16(-0x1p-25, 0x8000);
	expect_f16(0x1p-25 * 1.5, 0x0001);
	expect_f16(3 * 0x1p-25, 0x0002);    /* 1.5 units: tie to even 2 */
	expect_f16(1023.5 * 0x1p-24, 0x0400);  /* rounds up into the smallest normal */
	expect_f16(1e-30, 0x0000);
	cr_assert_eq(dg_f16_to_f32(0x0001), 0x1p-24f);
	cr_assert_eq(dg_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
	cr_assert_eq(dg_f16_to_f32(0x8001), -0x1p-24f);
}

Test(half, nan_stays_a_quiet_nan_and_widening_is_exact)
{
	uint16_t h = dg_f64_to_f16(NAN), b = dg_f64_to_bf16(NAN);

	cr_assert_eq(h & 0x7e00, 0x7e00, "0x%04x is not a quiet NaN", h);
	cr_assert_eq(b & 0x7fc0, 0x7fc0, "0x%04x is not a quiet NaN", b);
	cr_assert(isnan(dg_f16_to_f32(dg_f32_to_f16(NAN))));
	cr_assert(isnan(dg_bf16_to_f32(dg_f32_to_bf16(-NAN))));
	/* a signalling float NaN (quiet bit clear) becomes quiet, never inf */
	float snan;
	uint32_t sbits = 0x7f800001;
	memcpy(&snan, &sbits, 4);
	cr_assert_eq(dg_f32_to_f16(snan) & 0x7e00, 0x7e00);
	cr_assert_eq(dg_f32_to_bf16(snan) & 0x7fc0, 0x7fc0);
	cr_assert_eq(dg_f16_to_f32(0x7bff), 65504.0f);
	cr_assert_eq(dg_f16_to_f32(0x3555), 0.333251953125f);
	cr_assert(isinf(dg_f16_to_f32(0xfc00)) && dg_f16_to_f32(0xfc00) < 0);
	cr_assert(signbit(dg_f16_to_f32(0x8000)));
	cr_assert_eq(dg_bf16_to_f32(0x3f80), 1.0f);
	cr_assert_eq(dg_bf16_to_f32(0x7f7f), 0x1.fep127f);
}

Test(half, bfloat16_rounds_to_nearest_even)
{
	expect_bf16(1.0, 0x3f80);
	expect_bf16(1.00390625, 0x3f80);           /* 1 + 2^-8: tie, even 1 */
	expect_bf16(1.01171875, 0x3f82);           /* 1 + 3*2^-8: tie, even 0x3f82 */
	expect_bf16(1.0 / 3.0, 0x3eab);
	expect_bf16(0x1.fep127, 0x7f7f);           /* the largest bfloat16 */
	expect_bf16(3.4028234663852886e38, 0x7f80);  /* FLT_MAX is past the midpoint */
	expect_bf16(-1e39, 0xff80);
	expect_bf16(0x1p-133, 0x0001);             /* smallest subnormal */
	expect_bf16(0x1p-134, 0x0000);             /* tie to even 0 */
	expect_bf16(-0.0, 0x8000);
	/* One rounding from double: the 2^-40 decides the tie that a detour through
	 * float32 would lose (float32 has no room for it). */
	cr_assert_eq(dg_f64_to_bf16(1.00390625 + 0x1p-40), 0x3f81);
	cr_assert_eq(dg_f32_to_bf16((float)(1.00390625 + 0x1p-40)), 0x3f80);
	cr_assert_eq(dg_f64_to_f16(1 + 0x1p-11 + 0x1p-30), 0x3c01);
	cr_assert_eq(dg_f32_to_f16((float)(1 + 0x1p-11 + 0x1p-30)), 0x3c00);
}

Test(half, every_16_bit_value_round_trips_through_float32_and_double)
{
	for (uint32_t u = 0; u < 0x10000; u++) {
		uint16_t h = (uint16_t)u;
		float f = dg_f16_to_f32(h), b = dg_bf16_to_f32(h);
		bool fnan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff), bnan = (h & 0x7f80) == 0x7f80 &&
									    (h & 0x7f);
		cr_assert_eq(isnan(f), fnan, "float16 0x%04x", h);
		cr_assert_eq(isnan(b), bnan, "bfloat16 0x%04x", h);
		if (!fnan) {
			cr_assert_eq(dg_f32_to_f16(f), h, "float16 0x%04x via float", h);
			cr_assert_eq(dg_f64_to_f16(f), h, "float16 0x%04x via double", h);
		}
		if (!bnan) {
			cr_assert_eq(dg_f32_to_bf16(b), h, "bfloat16 0x%04x via float", h);
			cr_assert_eq(dg_f64_to_bf16(b), h, "bfloat16 0x%04x via double", h);
		}
	}
}

/* The integer-only float32 paths against the double-based rounding, over
 * float32 bit patterns spread across every exponent, plus every midpoint
 * between neighbouring float16 values and its two float neighbours. */
Test(half, float32_fast_paths_agree_with_the_double_rounding)
{
	for (uint64_t u = 0; u < (UINT64_C(1) << 32); u += 65521) {
		uint32_t bits = (uint32_t)u;
		float f;
		memcpy(&f, &bits, 4);
		if (isnan(f))
			continue;
		cr_assert_eq(dg_f32_to_f16(f), dg_f64_to_f16(f), "0x%08x", bits);
		cr_assert_eq(dg_f32_to_bf16(f), dg_f64_to_bf16(f), "0x%08x", bits);
	}
	for (uint32_t h = 0; h < 0x7c00; h++) {
		float mid = (dg_f16_to_f32((uint16_t)h) + dg_f16_to_f32((uint16_t)(h + 1))) / 2;
		float around[3] = { nextafterf(mid, 0), mid, nextafterf(mid, INFINITY) };
		for (int k = 0; k < 3; k++)
			cr_assert_eq(dg_f32_to_f16(around[k]), dg_f64_to_f16(around[k]),
				     "near the midpoint above 0x%04x", h);
	}
}

Test(half, tensors_get_and_set_16_bit_values)
{
	struct dg_err err = { 0 };
	struct dg_shape s = sh(1, 4, 0, 0);

	for (int k = 0; k < 2; k++) {
		enum dg_dtype dt = k ? DG_BF16 : DG_F16;
		struct dg_tensor *t = dg_tensor_new(dt, &s, &err);
		cr_assert_not_null(t, "%s", err.msg);
		cr_assert_eq(t->nbytes, 8);
		dg_tensor_set_f64(t, 0, 1.0 / 3.0);
		dg_tensor_set_f64(t, 1, 1e39);
		dg_tensor_set_f64(t, 2, NAN);
		dg_tensor_set_f64(t, 3, -2.5);
		const uint16_t *b = t->data;
		cr_assert_eq(b[0], k ? 0x3eab : 0x3555);
		cr_assert_eq(b[1], k ? 0x7f80 : 0x7c00);
		cr_assert_eq(dg_tensor_get_f64(t, 0), k ? 0.333984375 : 0.333251953125);
		cr_assert(isinf(dg_tensor_get_f64(t, 1)));
		cr_assert(isnan(dg_tensor_get_f64(t, 2)));
		cr_assert_eq(dg_tensor_get_f64(t, 3), -2.5);
		dg_tensor_free(t);
		struct dg_tensor *c = dg_tensor_scalar(dt, 65504, &err);
		cr_assert_eq(dg_tensor_get_f64(c, 0), k ? 65536.0 : 65504.0);
		dg_tensor_free(c);
	}
}

Test(half, array_conversions_cover_both_formats)
{
	const float in[4] = { 1.0f, -0.5f, 1.0f / 3.0f, 70000.0f };
	uint16_t h[4], b[4];
	float back[4];

	dg_f32_to_half(DG_F16, in, h, 4);
	dg_f32_to_half(DG_BF16, in, b, 4);
	cr_assert_eq(h[0], 0x3c00);
	cr_assert_eq(h[1], 0xb800);
	cr_assert_eq(h[2], 0x3555);
	cr_assert_eq(h[3], 0x7c00);
	cr_assert_eq(b[3], 0x4789);   /* 70000 = 0x4788b800 rounds up */
	dg_half_to_f32(DG_BF16, b, back, 4);
	cr_assert_eq(back[0], 1.0f);
	cr_assert_eq(back[2], 0.333984375f);
	cr_assert_eq(back[3], 70144.0f);
}
