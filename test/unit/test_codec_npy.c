/* The raw and .npy encodings (core/src/codec_npy.c): round trips of every dtype,
 * the exact header numpy writes, files written by real numpy (fixtures made at
 * test time with /usr/bin/python3, skipped without numpy) and numpy reading
 * what dg writes, and one test per malformed input the reader must refuse. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dg/codec.h"

#define PY "/usr/bin/python3"

/* A tensor of dt/shape whose element i is a dtype-appropriate pattern of i. */
static struct dg_tensor *pattern(enum dg_dtype dt, int ndim, const int64_t *dims)
{
	struct dg_shape s = dg_shape_make(ndim, dims);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_new(dt, &s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	for (int64_t i = 0; i < t->numel; i++) {
		switch (dt) {
		case DG_F32: ((float *)t->data)[i] = ((float)i - 2.5f) / 3.0f; break;
		case DG_F64: ((double *)t->data)[i] = ((double)i - 2.5) / 3.0; break;
		case DG_I32: ((int32_t *)t->data)[i] = (int32_t)(i * 7 - 100); break;
		case DG_I64: ((int64_t *)t->data)[i] = i * 1000000007LL - 5; break;
		case DG_U8: ((uint8_t *)t->data)[i] = (uint8_t)(i * 37 % 256); break;
		case DG_BOOL: ((uint8_t *)t->data)[i] = (uint8_t)(i % 3 == 0); break;
		case DG_F16:
		case DG_BF16: ((uint16_t *)t->data)[i] = (uint16_t)(0x3c00 + i * 97); break;
		default: break;
		}
	}
	return t;
}

static void assert_same(const struct dg_tensor *a, const struct dg_tensor *b)
{
	cr_assert_eq(a->dtype, b->dtype, "dtype %d vs %d", a->dtype, b->dtype);
	cr_assert(dg_shape_eq(&a->shape, &b->shape), "shapes differ");
	cr_assert_eq(a->numel, b->numel);
	cr_assert_eq(a->nbytes, b->nbytes);
	if (a->nbytes)
		cr_assert_eq(memcmp(a->data, b->data, a->nbytes), 0, "bytes differ");
}

/* An error with this code whose message contains want. */
static void assert_err(enum dg_status st, enum dg_status code, const struct dg_err *err,
		       const char *want)
{
	cr_assert_eq(st, code, "status %s (%s), wanted %s", dg_status_name(st), err->msg,
		     dg_status_name(code));
	cr_assert_eq(err->code, code);
	cr_assert_not_null(strstr(err->msg, want), "message '%s' lacks '%s'", err->msg, want);
}

/* A .npy image with a hand-written dict: magic, version major.0, the length
 * field, dict padded with spaces to a multiple of 64, '\n', then data. */
static void build_npy(struct dg_buf *b, int major, const char *dict, const void *data,
		      size_t n)
{
	size_t plen = major == 1 ? 10 : 12;
	size_t total = (plen + strlen(dict) + 1 + 63) / 64 * 64;
	size_t hlen = total - plen;
	unsigned char pre[12] = { 0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major, 0 };

	for (size_t i = 0; i < plen - 8; i++)
		pre[8 + i] = (unsigned char)(hlen >> (8 * i));
	dg_buf_init(b);
	cr_assert_eq(dg_buf_append(b, pre, plen, NULL), DG_OK);
	cr_assert_eq(dg_buf_append(b, dict, strlen(dict), NULL), DG_OK);
	for (size_t i = plen + strlen(dict); i < total - 1; i++)
		cr_assert_eq(dg_buf_append(b, " ", 1, NULL), DG_OK);
	cr_assert_eq(dg_buf_append(b, "\n", 1, NULL), DG_OK);
	if (n)
		cr_assert_eq(dg_buf_append(b, data, n, NULL), DG_OK);
}

/* Decode a hand-built image; returns the status and leaves *out (or NULL). */
static enum dg_status decode_dict(int major, const char *dict, const void *data, size_t n,
				  struct dg_tensor **out, struct dg_err *err)
{
	struct dg_buf b;

	build_npy(&b, major, dict, data, n);
	dg_err_clear(err);
	*out = dg_npy_decode(b.data, b.len, err);
	dg_buf_deinit(&b);
	return *out ? DG_OK : err->code;
}

static bool have_numpy(void)
{
	return access(PY, X_OK) == 0 &&
	       system(PY " -c 'import numpy' >/dev/null 2>&1") == 0;
}

static void make_tmpdir(char *dir, size_t n)
{
	snprintf(dir, n, "/tmp/dg-test-npy-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void remove_tmpdir(const char *dir)
{
	char cmd[512];

	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

/* Write text to dir/name. */
static void write_text(const char *dir, const char *name, const char *text)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	cr_assert_eq(fputs(text, f) >= 0, 1);
	cr_assert_eq(fclose(f), 0);
}

/* Run PY dir/script dir; returns its exit status. */
static int run_python(const char *dir, const char *script)
{
	char cmd[1024];
	int rc;

	snprintf(cmd, sizeof cmd, PY " '%s/%s' '%s'", dir, script, dir);
	rc = system(cmd);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* --- names and raw ---------------------------------------------------------- */

Test(codec_npy, encoding_names_and_mime_types_are_stable)
{
	cr_assert_str_eq(dg_encoding_name(DG_ENC_RAW), "raw");
	cr_assert_str_eq(dg_encoding_name(DG_ENC_NPY), "npy");
	cr_assert_str_eq(dg_encoding_name(DG_ENC_TEXT), "text");
	cr_assert_str_eq(dg_encoding_mime(DG_ENC_RAW), "application/octet-stream");
	cr_assert_str_eq(dg_encoding_mime(DG_ENC_NPY), "application/x-npy");
	cr_assert_str_eq(dg_encoding_mime(DG_ENC_TEXT), "text/plain");
	cr_assert_str_eq(dg_encoding_name((enum dg_encoding)99), "invalid");
}

Test(codec_npy, raw_decode_round_trips_every_dtype)
{
	int64_t dims[] = { 2, 3, 4 };

	for (int dt = 0; dt < DG_DTYPE_COUNT; dt++) {
		struct dg_tensor *t = pattern((enum dg_dtype)dt, 3, dims);
		struct dg_err err = { 0 };
		struct dg_tensor *r = dg_raw_decode(t->data, t->nbytes, t->dtype, &t->shape, &err);
		cr_assert_not_null(r, "%s: %s", dg_dtype_name(t->dtype), err.msg);
		cr_assert_eq(r->nbytes, 24 * dg_dtype_size(t->dtype));
		assert_same(t, r);
		dg_tensor_free(r);
		dg_tensor_free(t);
	}
}

Test(codec_npy, raw_decode_accepts_scalars_and_empty_tensors)
{
	struct dg_shape scalar = { .ndim = 0 }, empty = { .ndim = 2, .dim = { 3, 0 } };
	struct dg_err err = { 0 };
	double v = -7.25;
	struct dg_tensor *t = dg_raw_decode(&v, sizeof v, DG_F64, &scalar, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->numel, 1);
	cr_assert_float_eq(((double *)t->data)[0], -7.25, 0);
	dg_tensor_free(t);
	t = dg_raw_decode("", 0, DG_I32, &empty, &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->numel, 0);
	cr_assert_eq(t->nbytes, 0);
	dg_tensor_free(t);
}

Test(codec_npy, raw_decode_rejects_a_wrong_length_naming_both_counts)
{
	struct dg_shape s = { .ndim = 2, .dim = { 2, 3 } };
	struct dg_err err = { 0 };
	char bytes[25] = { 0 };
	struct dg_tensor *t = dg_raw_decode(bytes, 25, DG_F32, &s, &err);

	cr_assert_null(t);
	assert_err(err.code, DG_EINVAL, &err, "25 bytes");
	cr_assert_not_null(strstr(err.msg, "needs 24 bytes"), "%s", err.msg);
	cr_assert_not_null(strstr(err.msg, "[2,3]"), "%s", err.msg);
	t = dg_raw_decode(bytes, 23, DG_F32, &s, &err);
	cr_assert_null(t);
	assert_err(err.code, DG_EINVAL, &err, "23 bytes");
}

Test(codec_npy, raw_decode_rejects_bad_dtype_and_shape)
{
	struct dg_shape neg = { .ndim = 1, .dim = { -2 } };
	struct dg_shape ok = { .ndim = 1, .dim = { 1 } };
	struct dg_err err = { 0 };

	cr_assert_null(dg_raw_decode("abcd", 4, (enum dg_dtype)42, &ok, &err));
	assert_err(err.code, DG_EDTYPE, &err, "dtype");
	cr_assert_null(dg_raw_decode("abcd", 4, DG_F32, &neg, &err));
	assert_err(err.code, DG_EINVAL, &err, "negative");
}

Test(codec_npy, raw_decode_reads_nonzero_bool_bytes_as_true)
{
	struct dg_shape s = { .ndim = 1, .dim = { 4 } };
	struct dg_err err = { 0 };
	const uint8_t bytes[4] = { 0, 1, 2, 255 };
	struct dg_tensor *t = dg_raw_decode(bytes, 4, DG_BOOL, &s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	const uint8_t *b = t->data;
	cr_assert(b[0] == 0 && b[1] == 1 && b[2] == 1 && b[3] == 1);
	dg_tensor_free(t);
}

/* --- header writing ----------------------------------------------------------- */

Test(codec_npy, header_is_exactly_what_numpy_writes_for_float32_2x3)
{
	struct dg_shape s = { .ndim = 2, .dim = { 2, 3 } };
	struct dg_buf b = { 0 };
	const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

	cr_assert_eq(dg_npy_encode_header(DG_F32, &s, &b, NULL), DG_OK);
	cr_assert_eq(b.len, 128);
	cr_assert_eq(memcmp(b.data, "\x93NUMPY\x01\x00", 8), 0);
	cr_assert_eq((unsigned char)b.data[8] | (unsigned char)b.data[9] << 8, 118);
	cr_assert_eq(memcmp(b.data + 10, dict, strlen(dict)), 0);
	for (size_t i = 10 + strlen(dict); i < 127; i++)
		cr_assert_eq(b.data[i], ' ', "byte %zu is not padding", i);
	cr_assert_eq(b.data[127], '\n');
	dg_buf_deinit(&b);
}

Test(codec_npy, header_writes_scalar_and_1d_tuples_the_python_way)
{
	struct dg_shape scalar = { .ndim = 0 }, vec = { .ndim = 1, .dim = { 5 } };
	struct dg_buf b = { 0 };

	cr_assert_eq(dg_npy_encode_header(DG_BOOL, &scalar, &b, NULL), DG_OK);
	cr_assert_not_null(strstr(b.data + 10, "'descr': '|b1'"));
	cr_assert_not_null(strstr(b.data + 10, "'shape': (), }"));
	dg_buf_deinit(&b);
	cr_assert_eq(dg_npy_encode_header(DG_U8, &vec, &b, NULL), DG_OK);
	cr_assert_not_null(strstr(b.data + 10, "'descr': '|u1'"));
	cr_assert_not_null(strstr(b.data + 10, "'shape': (5,), }"));
	dg_buf_deinit(&b);
}

Test(codec_npy, header_size_equals_encoded_header_length_for_many_shapes)
{
	int64_t big = (int64_t)1 << 47;
	struct dg_shape shapes[] = {
		{ .ndim = 0 },
		{ .ndim = 1, .dim = { 0 } },
		{ .ndim = 1, .dim = { 7 } },
		{ .ndim = 2, .dim = { 1000000, 3 } },
		{ .ndim = 3, .dim = { big, 1, 2 } },
		{ .ndim = 8, .dim = { 2, 2, 2, 2, 2, 2, 2, 2 } },
		{ .ndim = 8, .dim = { 1, 1, 1, 1, 1, 1, 1, big } },
	};

	for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
		for (int dt = 0; dt < DG_DTYPE_COUNT; dt++) {
			struct dg_buf b = { 0 };
			if (dt == DG_BF16)
				continue;   /* no .npy form (bfloat16_has_no_npy_form) */
			cr_assert_eq(dg_npy_encode_header((enum dg_dtype)dt, &shapes[k], &b, NULL),
				     DG_OK);
			cr_assert_eq(dg_npy_header_size((enum dg_dtype)dt, &shapes[k]), b.len);
			cr_assert_eq(b.len % 64, 0, "header of %zu bytes", b.len);
			cr_assert_eq(b.data[b.len - 1], '\n');
			/* Our own parser reads it back. */
			enum dg_dtype pdt;
			struct dg_shape ps;
			size_t off;
			struct dg_err err = { 0 };
			cr_assert_eq(dg_npy_parse_header(b.data, b.len, &pdt, &ps, &off, &err),
				     DG_OK, "%s", err.msg);
			cr_assert_eq((int)pdt, (int)dt);
			cr_assert(dg_shape_eq(&ps, &shapes[k]));
			cr_assert_eq(off, b.len);
			dg_buf_deinit(&b);
		}
	}
}

Test(codec_npy, header_of_invalid_dtype_or_shape_is_refused)
{
	struct dg_shape neg = { .ndim = 1, .dim = { -1 } }, ok = { .ndim = 1, .dim = { 1 } };
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_npy_header_size(DG_F32, &neg), 0);
	cr_assert_eq(dg_npy_header_size((enum dg_dtype)9, &ok), 0);
	cr_assert_eq(dg_npy_encode_header(DG_F32, &neg, &b, &err), DG_EINVAL);
	cr_assert_not_null(strstr(err.msg, ".npy header"), "%s", err.msg);
	cr_assert_eq(b.len, 0);
	dg_buf_deinit(&b);
}

/* --- round trips ---------------------------------------------------------------- */

static void npy_round_trip(const struct dg_tensor *t)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_npy_encode(t, &b, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(b.len, dg_npy_header_size(t->dtype, &t->shape) + t->nbytes);
	struct dg_tensor *r = dg_npy_decode(b.data, b.len, &err);
	cr_assert_not_null(r, "%s", err.msg);
	assert_same(t, r);
	dg_tensor_free(r);
	dg_buf_deinit(&b);
}

Test(codec_npy, npy_round_trips_every_dtype_in_several_shapes)
{
	int64_t d1[] = { 5 }, d2[] = { 3, 4 }, d8[] = { 2, 1, 3, 1, 2, 2, 1, 3 },
		d0[] = { 4, 0, 2 };

	for (int dt = 0; dt < DG_DTYPE_COUNT; dt++) {
		if (dt == DG_BF16)
			continue;   /* no .npy form (bfloat16_has_no_npy_form) */
		struct dg_tensor *ts[] = {
			pattern((enum dg_dtype)dt, 0, NULL), pattern((enum dg_dtype)dt, 1, d1),
			pattern((enum dg_dtype)dt, 2, d2),   pattern((enum dg_dtype)dt, 8, d8),
			pattern((enum dg_dtype)dt, 3, d0),
		};
		for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
			npy_round_trip(ts[k]);
			dg_tensor_free(ts[k]);
		}
	}
}

Test(codec_npy, npy_round_trips_special_floats_and_integer_extremes)
{
	struct dg_shape s6 = { .ndim = 1, .dim = { 7 } }, s4 = { .ndim = 1, .dim = { 4 } };
	float f[7] = { NAN, INFINITY, -INFINITY, -0.0f, 1e-45f, FLT_MAX, -FLT_MIN };
	double d[7] = { NAN, INFINITY, -INFINITY, -0.0, 4.9e-324, DBL_MAX, -DBL_MIN };
	int64_t l[4] = { INT64_MIN, INT64_MAX, -1, 0 };
	int32_t i[4] = { INT32_MIN, INT32_MAX, -1, 0 };
	struct dg_tensor *ts[] = {
		dg_tensor_from_data(DG_F32, &s6, f, NULL),
		dg_tensor_from_data(DG_F64, &s6, d, NULL),
		dg_tensor_from_data(DG_I64, &s4, l, NULL),
		dg_tensor_from_data(DG_I32, &s4, i, NULL),
	};

	for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
		cr_assert_not_null(ts[k]);
		npy_round_trip(ts[k]);
		dg_tensor_free(ts[k]);
	}
}

Test(codec_npy, data_starts_on_a_64_byte_boundary)
{
	int64_t d[] = { 3, 5 };
	struct dg_tensor *t = pattern(DG_F64, 2, d);
	struct dg_buf b = { 0 };
	enum dg_dtype dt;
	struct dg_shape s;
	size_t off;

	cr_assert_eq(dg_npy_encode(t, &b, NULL), DG_OK);
	cr_assert_eq(dg_npy_parse_header(b.data, b.len, &dt, &s, &off, NULL), DG_OK);
	cr_assert_eq(off % 64, 0);
	cr_assert_eq(memcmp(b.data + off, t->data, t->nbytes), 0);
	dg_buf_deinit(&b);
	dg_tensor_free(t);
}

Test(codec_npy, files_round_trip_and_missing_files_are_not_found)
{
	char dir[64], path[128];
	int64_t d[] = { 2, 2 };
	struct dg_tensor *t = pattern(DG_I64, 2, d);
	struct dg_err err = { 0 };

	make_tmpdir(dir, sizeof dir);
	snprintf(path, sizeof path, "%s/w.npy", dir);
	cr_assert_eq(dg_npy_write_file(path, t, &err), DG_OK, "%s", err.msg);
	struct dg_tensor *r = dg_npy_read_file(path, &err);
	cr_assert_not_null(r, "%s", err.msg);
	assert_same(t, r);
	dg_tensor_free(r);

	snprintf(path, sizeof path, "%s/none.npy", dir);
	cr_assert_null(dg_npy_read_file(path, &err));
	assert_err(err.code, DG_ENOTFOUND, &err, "none.npy");

	/* A file that is not .npy: the error names the file. */
	write_text(dir, "bad.npy", "hello, world\n");
	snprintf(path, sizeof path, "%s/bad.npy", dir);
	cr_assert_null(dg_npy_read_file(path, &err));
	assert_err(err.code, DG_EINVAL, &err, "not a .npy file");
	cr_assert_not_null(strstr(err.msg, "bad.npy"), "%s", err.msg);
	remove_tmpdir(dir);
	dg_tensor_free(t);
}

/* --- what the reader accepts ---------------------------------------------------- */

Test(codec_npy, reader_accepts_key_order_quotes_whitespace_and_no_trailing_comma)
{
	const float v[3] = { 1.5f, -2.0f, 0.25f };
	const char *dicts[] = {
		"{'shape': (3,), 'descr': '<f4', 'fortran_order': False}",
		"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3,)}",
		"{ 'descr' : '<f4' ,\n 'fortran_order' :False,'shape':( 3 , ) , }",
		"{'descr': 'f4', 'fortran_order': False, 'shape': (3L,), }",
		"{'descr': '=f4', 'fortran_order': False, 'shape': (3,), }",
	};

	for (size_t k = 0; k < sizeof dicts / sizeof dicts[0]; k++) {
		struct dg_tensor *t;
		struct dg_err err = { 0 };
		cr_assert_eq(decode_dict(1, dicts[k], v, sizeof v, &t, &err), DG_OK, "%s: %s",
			     dicts[k], err.msg);
		cr_assert_eq(t->dtype, DG_F32);
		cr_assert_eq(t->shape.ndim, 1);
		cr_assert_eq(t->shape.dim[0], 3);
		cr_assert_float_eq(((float *)t->data)[1], -2.0f, 0);
		dg_tensor_free(t);
	}
}

Test(codec_npy, reader_accepts_every_spelling_of_one_byte_types)
{
	const uint8_t v[2] = { 0, 7 };
	const char *u1[] = { "|u1", "u1", "<u1", "=u1", ">u1" };
	const char *b1[] = { "|b1", "b1", "<b1", "=b1" };
	char dict[128];

	for (size_t k = 0; k < sizeof u1 / sizeof u1[0]; k++) {
		struct dg_tensor *t;
		struct dg_err err = { 0 };
		snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, "
					    "'shape': (2,), }", u1[k]);
		cr_assert_eq(decode_dict(1, dict, v, 2, &t, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(t->dtype, DG_U8);
		cr_assert_eq(((uint8_t *)t->data)[1], 7);
		dg_tensor_free(t);
	}
	for (size_t k = 0; k < sizeof b1 / sizeof b1[0]; k++) {
		struct dg_tensor *t;
		struct dg_err err = { 0 };
		snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, "
					    "'shape': (2,), }", b1[k]);
		cr_assert_eq(decode_dict(1, dict, v, 2, &t, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(t->dtype, DG_BOOL);
		/* 7 is not a valid bool byte: read as true, stored as 1. */
		cr_assert_eq(((uint8_t *)t->data)[0], 0);
		cr_assert_eq(((uint8_t *)t->data)[1], 1);
		dg_tensor_free(t);
	}
}

Test(codec_npy, reader_accepts_versions_2_and_3)
{
	const int32_t v[2] = { -4, 9 };

	for (int major = 2; major <= 3; major++) {
		struct dg_tensor *t;
		struct dg_err err = { 0 };
		cr_assert_eq(decode_dict(major, "{'descr': '<i4', 'fortran_order': False, "
						"'shape': (1, 2), }", v, sizeof v, &t, &err),
			     DG_OK, "%s", err.msg);
		cr_assert_eq(t->dtype, DG_I32);
		cr_assert_eq(t->shape.ndim, 2);
		cr_assert_eq(((int32_t *)t->data)[0], -4);
		cr_assert_eq(((int32_t *)t->data)[1], 9);
		dg_tensor_free(t);
	}
}

Test(codec_npy, reader_accepts_fortran_order_when_the_layout_is_the_same)
{
	const double v[3] = { 1, 2, 3 };
	struct dg_tensor *t;
	struct dg_err err = { 0 };

	cr_assert_eq(decode_dict(1, "{'descr': '<f8', 'fortran_order': True, 'shape': (1, 3), }",
				 v, sizeof v, &t, &err), DG_OK, "%s", err.msg);
	cr_assert_float_eq(((double *)t->data)[2], 3.0, 0);
	dg_tensor_free(t);
}

Test(codec_npy, reader_accepts_exactly_2_to_the_48_elements_in_the_header)
{
	struct dg_buf b;
	enum dg_dtype dt;
	struct dg_shape s;
	size_t off;
	struct dg_err err = { 0 };

	build_npy(&b, 1,
		  "{'descr': '|u1', 'fortran_order': False, 'shape': (65536, 65536, 65536), }",
		  NULL, 0);
	cr_assert_eq(dg_npy_parse_header(b.data, b.len, &dt, &s, &off, &err), DG_OK, "%s", err.msg);
	cr_assert_eq(s.dim[2], 65536);
	/* The data is of course missing: decoding says so without allocating 256 TiB. */
	cr_assert_null(dg_npy_decode(b.data, b.len, &err));
	assert_err(err.code, DG_EINVAL, &err, "281474976710656 bytes");
	dg_buf_deinit(&b);
}

/* --- what the reader refuses: one test per rejection ---------------------------- */

static void assert_dict_refused(const char *dict, enum dg_status code, const char *want)
{
	static const float v[6] = { 0 };
	struct dg_tensor *t;
	struct dg_err err = { 0 };
	enum dg_status st = decode_dict(1, dict, v, sizeof v, &t, &err);

	cr_assert_null(t, "accepted %s", dict);
	assert_err(st, code, &err, want);
}

Test(codec_npy, big_endian_data_is_refused_with_a_conversion_hint)
{
	struct dg_tensor *t;
	struct dg_err err = { 0 };
	static const float v[6] = { 0 };

	decode_dict(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", v, sizeof v,
		    &t, &err);
	cr_assert_null(t);
	assert_err(err.code, DG_EDTYPE, &err, "big-endian");
	cr_assert_not_null(strstr(err.msg, "'>f4'"), "%s", err.msg);
	cr_assert_not_null(strstr(err.hint, "newbyteorder('<')"), "%s", err.hint);
	cr_assert_not_null(strstr(err.hint, "np.ascontiguousarray(a, dtype='<f4')"), "%s",
			   err.hint);
}

Test(codec_npy, fortran_order_is_refused_with_a_hint)
{
	struct dg_tensor *t;
	struct dg_err err = { 0 };
	static const float v[6] = { 0 };

	decode_dict(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", v, sizeof v,
		    &t, &err);
	cr_assert_null(t);
	assert_err(err.code, DG_EINVAL, &err, "Fortran");
	cr_assert_not_null(strstr(err.hint, "np.ascontiguousarray"), "%s", err.hint);
}

Test(codec_npy, object_arrays_are_refused_as_pickles)
{
	assert_dict_refused("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }",
			    DG_EDTYPE, "object array");
	assert_dict_refused("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }",
			    DG_EDTYPE, "pickle");
}

Test(codec_npy, structured_dtypes_are_refused)
{
	assert_dict_refused("{'descr': [('x', '<f4'), ('y', '<i4')], 'fortran_order': False, "
			    "'shape': (3,), }", DG_EDTYPE, "structured");
}

Test(codec_npy, unknown_dtypes_are_named_and_the_supported_ones_listed)
{
	const char *bad[] = { ">f2", "|f2", "<u4", "<c8", "<U5",
			      "|S3", "<M8[ns]", "|V16", "|f4", "" };
	char dict[128];

	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		char want[32];
		snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, "
					    "'shape': (6,), }", bad[k]);
		snprintf(want, sizeof want, bad[k][0] == '>' ? "'%s' is big-endian"
							       : "'%s' is not supported", bad[k]);
		assert_dict_refused(dict, DG_EDTYPE, want);
		if (bad[k][0] == '>')
			continue;
		assert_dict_refused(dict, DG_EDTYPE, "'<f4' (float32)");
	}
}

Test(codec_npy, more_than_8_dimensions_are_refused)
{
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, "
			    "'shape': (1, 1, 1, 1, 1, 1, 1, 1, 6), }", DG_EINVAL,
			    "more than 8 dimensions");
}

Test(codec_npy, negative_dimensions_are_refused)
{
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }",
			    DG_EINVAL, "negative dimension");
}

Test(codec_npy, element_counts_over_2_to_the_48_are_refused)
{
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, "
			    "'shape': (65536, 65536, 65537), }", DG_ETOOLARGE, "2^48");
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, "
			    "'shape': (99999999999999999999999,), }", DG_ETOOLARGE, "2^48");
}

Test(codec_npy, header_length_past_the_end_is_refused)
{
	struct dg_buf b;
	struct dg_err err = { 0 };

	build_npy(&b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", NULL, 0);
	/* Cut the header short: the length field now points past the end. */
	cr_assert_null(dg_npy_decode(b.data, 40, &err));
	assert_err(err.code, DG_EINVAL, &err, "runs past the end");
	/* A 4-byte length near 4 GiB in a version 2 file. */
	b.data[6] = 2;
	b.data[8] = b.data[9] = b.data[10] = b.data[11] = (char)0xff;
	cr_assert_null(dg_npy_decode(b.data, b.len, &err));
	assert_err(err.code, DG_EINVAL, &err, "4294967295");
	dg_buf_deinit(&b);
}

Test(codec_npy, truncated_magic_and_prefix_are_refused)
{
	struct dg_err err = { 0 };

	cr_assert_null(dg_npy_decode("\x93NUM", 4, &err));
	assert_err(err.code, DG_EINVAL, &err, "truncated");
	cr_assert_null(dg_npy_decode(NULL, 0, &err));
	assert_err(err.code, DG_EINVAL, &err, "truncated");
	cr_assert_null(dg_npy_decode("\x93NUMPY\x01\x00\x10", 9, &err));
	assert_err(err.code, DG_EINVAL, &err, "truncated");
	cr_assert_null(dg_npy_decode("\x93NUMPY\x02\x00\x10\x00", 10, &err));
	assert_err(err.code, DG_EINVAL, &err, "truncated");
}

Test(codec_npy, files_that_are_not_npy_are_refused)
{
	struct dg_err err = { 0 };

	cr_assert_null(dg_npy_decode("PK\x03\x04zipfile-bytes", 18, &err));
	assert_err(err.code, DG_EINVAL, &err, "not a .npy file");
	cr_assert_null(dg_npy_decode("1 2 3", 5, &err));
	assert_err(err.code, DG_EINVAL, &err, "not a .npy file");
}

Test(codec_npy, unknown_versions_are_refused)
{
	struct dg_buf b;
	struct dg_err err = { 0 };

	build_npy(&b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", NULL, 0);
	b.data[6] = 4;
	cr_assert_null(dg_npy_decode(b.data, b.len, &err));
	assert_err(err.code, DG_EINVAL, &err, "version 4.0");
	b.data[6] = 1;
	b.data[7] = 1;
	cr_assert_null(dg_npy_decode(b.data, b.len, &err));
	assert_err(err.code, DG_EINVAL, &err, "version 1.1");
	b.data[6] = 0;
	b.data[7] = 0;
	cr_assert_null(dg_npy_decode(b.data, b.len, &err));
	assert_err(err.code, DG_EINVAL, &err, "version 0.0");
	dg_buf_deinit(&b);
}

Test(codec_npy, missing_keys_are_refused_by_name)
{
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, }", DG_EINVAL,
			    "no 'shape' key");
	assert_dict_refused("{'descr': '<f4', 'shape': (6,), }", DG_EINVAL,
			    "no 'fortran_order' key");
	assert_dict_refused("{'fortran_order': False, 'shape': (6,), }", DG_EINVAL,
			    "no 'descr' key");
	assert_dict_refused("{}", DG_EINVAL, "no 'descr' key");
}

Test(codec_npy, duplicate_keys_are_refused)
{
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), "
			    "'descr': '<f4'}", DG_EINVAL, "key 'descr' twice");
}

Test(codec_npy, unknown_keys_are_refused)
{
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), "
			    "'extra': 1}", DG_EINVAL, "unknown key 'extra'");
}

Test(codec_npy, garbage_after_the_dict_is_refused)
{
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), } x",
			    DG_EINVAL, "unexpected bytes after the header dict");
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }}",
			    DG_EINVAL, "unexpected bytes after the header dict");
}

Test(codec_npy, malformed_dict_syntax_is_refused_with_the_position)
{
	assert_dict_refused("['descr', '<f4']", DG_EINVAL, "expected '{'");
	assert_dict_refused("{'descr' '<f4', 'fortran_order': False, 'shape': (6,)}", DG_EINVAL,
			    "expected ':'");
	assert_dict_refused("{'descr': '<f4' 'fortran_order': False, 'shape': (6,)}", DG_EINVAL,
			    "expected ',' or '}'");
	assert_dict_refused("{'descr': '<f4, 'fortran_order': False, 'shape': (6,)}", DG_EINVAL,
			    "malformed .npy header at byte");
	assert_dict_refused("{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}", DG_EINVAL,
			    "True or False");
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': [6]}", DG_EINVAL,
			    "not a list");
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", DG_EINVAL,
			    "(n,)");
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", DG_EINVAL,
			    "expected ',' or ')'");
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)", DG_EINVAL,
			    "expected ',' or '}'");
	assert_dict_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (x,)}", DG_EINVAL,
			    "dimension size");
}

Test(codec_npy, data_shorter_or_longer_than_the_shape_is_refused)
{
	static const float v[7] = { 0 };
	struct dg_tensor *t;
	struct dg_err err = { 0 };
	const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

	decode_dict(1, dict, v, 20, &t, &err);
	cr_assert_null(t);
	assert_err(err.code, DG_EINVAL, &err, "should be 24 bytes");
	cr_assert_not_null(strstr(err.msg, "has 20 bytes"), "%s", err.msg);
	cr_assert_not_null(strstr(err.hint, "truncated"), "%s", err.hint);
	decode_dict(1, dict, v, 28, &t, &err);
	cr_assert_null(t);
	assert_err(err.code, DG_EINVAL, &err, "has 28 bytes");
	cr_assert_not_null(strstr(err.hint, "trailing"), "%s", err.hint);
}

/* --- interoperability with real numpy -------------------------------------------- */

/* numpy writes one file per case plus the raw bytes it holds (a.tobytes()). */
static const char numpy_writer[] =
	"import sys, numpy as np\n"
	"d = sys.argv[1]\n"
	"def save(name, a, version=None):\n"
	"    with open(d + '/' + name + '.npy', 'wb') as f:\n"
	"        np.lib.format.write_array(f, a, version=version)\n"
	"    open(d + '/' + name + '.raw', 'wb').write(a.tobytes())\n"
	"f4 = (np.arange(6, dtype='<f4') - np.float32(2.5)) / np.float32(3)\n"
	"save('f4', f4.reshape(2, 3))\n"
	"save('f8', ((np.arange(24, dtype='<f8') - 2.5) / 3).reshape(2, 3, 4))\n"
	"save('i4', (np.arange(5, dtype='<i4') * 7 - 100))\n"
	"save('i8', np.array([np.iinfo('<i8').min, np.iinfo('<i8').max, -1, 0], dtype='<i8'))\n"
	"save('u1', (np.arange(10, dtype=np.int64) * 37 % 256).astype('|u1').reshape(5, 2))\n"
	"save('b1', np.arange(7) % 3 == 0)\n"
	"save('scalar', np.array(-7.25, dtype='<f8'))\n"
	"save('empty', np.zeros((3, 0), dtype='<f4'))\n"
	"save('d8', np.arange(72, dtype='<i8').reshape(2, 1, 3, 1, 2, 2, 1, 3))\n"
	"save('special', np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, np.finfo('<f4').max],"
	" dtype='<f4'))\n"
	"save('v2', np.arange(4, dtype='<f8'), version=(2, 0))\n"
	"save('v3', np.arange(4, dtype='<i4'), version=(3, 0))\n"
	"save('big', np.full((3,), 1, dtype='>f4'))\n"
	"save('fortran', np.asfortranarray(np.arange(6, dtype='<f4').reshape(2, 3)))\n"
	"save('f2', np.array([1/3, 65504, -0.0, np.inf, 2**-24, 0.1], dtype='<f2'))\n"
	"np.save(d + '/obj.npy', np.array([{'a': 1}, None], dtype=object), allow_pickle=True)\n";

struct np_case {
	const char *name;
	enum dg_dtype dt;
	int ndim;
	int64_t dim[DG_MAX_DIMS];
};

Test(codec_npy, files_written_by_numpy_load_identically)
{
	static const struct np_case cases[] = {
		{ "f4", DG_F32, 2, { 2, 3 } },    { "f8", DG_F64, 3, { 2, 3, 4 } },
		{ "i4", DG_I32, 1, { 5 } },       { "i8", DG_I64, 1, { 4 } },
		{ "u1", DG_U8, 2, { 5, 2 } },     { "b1", DG_BOOL, 1, { 7 } },
		{ "scalar", DG_F64, 0, { 0 } },   { "empty", DG_F32, 2, { 3, 0 } },
		{ "d8", DG_I64, 8, { 2, 1, 3, 1, 2, 2, 1, 3 } },
		{ "special", DG_F32, 1, { 6 } }, { "v2", DG_F64, 1, { 4 } },
		{ "v3", DG_I32, 1, { 4 } },       { "f2", DG_F16, 1, { 6 } },
	};
	char dir[64], path[160];

	if (!have_numpy())
		cr_skip_test("needs " PY " with numpy to write the fixture files");
	make_tmpdir(dir, sizeof dir);
	write_text(dir, "writer.py", numpy_writer);
	cr_assert_eq(run_python(dir, "writer.py"), 0, "the numpy fixture script failed");
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		const struct np_case *c = &cases[k];
		struct dg_err err = { 0 };
		struct dg_buf raw = { 0 };
		snprintf(path, sizeof path, "%s/%s.npy", dir, c->name);
		struct dg_tensor *t = dg_npy_read_file(path, &err);
		cr_assert_not_null(t, "%s: %s", c->name, err.msg);
		cr_assert_eq(t->dtype, c->dt, "%s", c->name);
		cr_assert_eq(t->shape.ndim, c->ndim, "%s", c->name);
		for (int i = 0; i < c->ndim; i++)
			cr_assert_eq(t->shape.dim[i], c->dim[i], "%s dim %d", c->name, i);
		snprintf(path, sizeof path, "%s/%s.raw", dir, c->name);
		cr_assert_eq(dg_buf_read_file(&raw, path, 1 << 20, &err), DG_OK, "%s", err.msg);
		cr_assert_eq(raw.len, t->nbytes, "%s", c->name);
		if (raw.len)
			cr_assert_eq(memcmp(raw.data, t->data, raw.len), 0, "%s bytes", c->name);
		/* Spot checks against values computed here, not by numpy. */
		if (strcmp(c->name, "f4") == 0)
			cr_assert_eq(((float *)t->data)[5], (5.0f - 2.5f) / 3.0f);
		if (strcmp(c->name, "i8") == 0) {
			cr_assert_eq(((int64_t *)t->data)[0], INT64_MIN);
			cr_assert_eq(((int64_t *)t->data)[1], INT64_MAX);
		}
		if (strcmp(c->name, "b1") == 0)
			cr_assert_eq(((uint8_t *)t->data)[3] + ((uint8_t *)t->data)[4], 1);
		if (strcmp(c->name, "scalar") == 0)
			cr_assert_eq(((double *)t->data)[0], -7.25);
		if (strcmp(c->name, "d8") == 0)
			cr_assert_eq(((int64_t *)t->data)[71], 71);
		if (strcmp(c->name, "f2") == 0) {
			/* numpy's float16 rounding equals dg's, bit for bit */
			const uint16_t *h = t->data;
			cr_assert_eq(h[0], 0x3555);
			cr_assert_eq(h[1], 0x7bff);
			cr_assert_eq(h[2], 0x8000);
			cr_assert_eq(h[3], 0x7c00);
			cr_assert_eq(h[4], 0x0001);
			cr_assert_eq(h[5], dg_f64_to_f16(0.1));
		}
		if (strcmp(c->name, "special") == 0) {
			const float *f = t->data;
			cr_assert(isnan(f[0]) && f[1] == INFINITY && f[2] == -INFINITY);
			cr_assert(f[3] == 0 && signbit(f[3]));
			cr_assert_eq(f[4], 1e-45f);
			cr_assert_eq(f[5], FLT_MAX);
		}
		dg_buf_deinit(&raw);
		dg_tensor_free(t);
	}
	/* And what numpy writes that dg must refuse. */
	static const struct {
		const char *name;
		enum dg_status code;
		const char *want;
	} refused[] = {
		{ "big", DG_EDTYPE, "big-endian" },
		{ "fortran", DG_EINVAL, "Fortran" },
		{ "obj", DG_EDTYPE, "object array" },
	};
	for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
		struct dg_err err = { 0 };
		snprintf(path, sizeof path, "%s/%s.npy", dir, refused[k].name);
		cr_assert_null(dg_npy_read_file(path, &err), "%s accepted", refused[k].name);
		assert_err(err.code, refused[k].code, &err, refused[k].want);
	}
	remove_tmpdir(dir);
}

/* numpy checks each file dg wrote against the raw bytes dg wrote beside it. */
static const char numpy_checker[] =
	"import sys, numpy as np\n"
	"d = sys.argv[1]\n"
	"cases = [('f4', '<f4', (2, 3)), ('f8', '<f8', (2, 3, 4)), ('i4', '<i4', (5,)),\n"
	"         ('i8', '<i8', (4,)), ('u1', '|u1', (5, 2)), ('b1', '|b1', (7,)),\n"
	"         ('scalar', '<f8', ()), ('empty', '<f4', (3, 0)),\n"
	"         ('d8', '<i8', (2, 1, 3, 1, 2, 2, 1, 3)), ('special', '<f4', (6,)),\n"
	"         ('f2', '<f2', (3, 4))]\n"
	"for name, descr, shape in cases:\n"
	"    a = np.load(d + '/' + name + '.npy')\n"
	"    m = np.load(d + '/' + name + '.npy', mmap_mode='r')\n"
	"    raw = open(d + '/' + name + '.raw', 'rb').read()\n"
	"    assert a.dtype == np.dtype(descr), (name, a.dtype)\n"
	"    assert a.shape == shape, (name, a.shape)\n"
	"    assert a.tobytes() == raw and m.tobytes() == raw, name\n"
	"i8 = np.load(d + '/i8.npy')\n"
	"assert i8[0] == np.iinfo('<i8').min and i8[1] == np.iinfo('<i8').max\n"
	"s = np.load(d + '/special.npy')\n"
	"assert np.isnan(s[0]) and s[1] == np.inf and s[2] == -np.inf and np.signbit(s[3])\n"
	"assert s[5] == np.finfo('<f4').max\n"
	"f4 = np.load(d + '/f4.npy')\n"
	"assert f4[1, 2] == (np.float32(5) - np.float32(2.5)) / np.float32(3)\n"
	"b1 = np.load(d + '/b1.npy').tolist()\n"
	"assert b1 == [True, False, False, True, False, False, True]\n"
	"f2 = np.load(d + '/f2.npy')\n"
	"assert f2.view('<u2').ravel().tolist() == [0x3c00 + i * 97 for i in range(12)]\n";

Test(codec_npy, numpy_loads_what_dg_writes)
{
	static const struct np_case cases[] = {
		{ "f4", DG_F32, 2, { 2, 3 } },    { "f8", DG_F64, 3, { 2, 3, 4 } },
		{ "i4", DG_I32, 1, { 5 } },       { "i8", DG_I64, 1, { 4 } },
		{ "u1", DG_U8, 2, { 5, 2 } },     { "b1", DG_BOOL, 1, { 7 } },
		{ "scalar", DG_F64, 0, { 0 } },   { "empty", DG_F32, 2, { 3, 0 } },
		{ "d8", DG_I64, 8, { 2, 1, 3, 1, 2, 2, 1, 3 } },
		{ "f2", DG_F16, 2, { 3, 4 } },
	};
	char dir[64], path[160];
	struct dg_err err = { 0 };

	if (!have_numpy())
		cr_skip_test("needs " PY " with numpy to check the files dg writes");
	make_tmpdir(dir, sizeof dir);
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		const struct np_case *c = &cases[k];
		struct dg_tensor *t = pattern(c->dt, c->ndim, c->dim);
		if (strcmp(c->name, "i8") == 0) {
			((int64_t *)t->data)[0] = INT64_MIN;
			((int64_t *)t->data)[1] = INT64_MAX;
		}
		snprintf(path, sizeof path, "%s/%s.npy", dir, c->name);
		cr_assert_eq(dg_npy_write_file(path, t, &err), DG_OK, "%s", err.msg);
		snprintf(path, sizeof path, "%s/%s.raw", dir, c->name);
		cr_assert_eq(dg_write_file_atomic(path, t->data, t->nbytes, &err), DG_OK);
		dg_tensor_free(t);
	}
	struct dg_shape s6 = { .ndim = 1, .dim = { 6 } };
	float f[6] = { NAN, INFINITY, -INFINITY, -0.0f, 1e-45f, FLT_MAX };
	struct dg_tensor *t = dg_tensor_from_data(DG_F32, &s6, f, &err);
	snprintf(path, sizeof path, "%s/special.npy", dir);
	cr_assert_eq(dg_npy_write_file(path, t, &err), DG_OK, "%s", err.msg);
	snprintf(path, sizeof path, "%s/special.raw", dir);
	cr_assert_eq(dg_write_file_atomic(path, t->data, t->nbytes, &err), DG_OK);
	dg_tensor_free(t);
	write_text(dir, "checker.py", numpy_checker);
	cr_assert_eq(run_python(dir, "checker.py"), 0, "numpy could not load what dg wrote");
	remove_tmpdir(dir);
}

/* --- the 16-bit floats ----------------------------------------------------------- */

Test(codec_npy, float16_is_written_as_little_endian_f2)
{
	int64_t d[] = { 2 };
	struct dg_tensor *t = pattern(DG_F16, 1, d);
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_npy_encode(t, &b, &err), DG_OK, "%s", err.msg);
	cr_assert_not_null(strstr(b.data + 10, "'descr': '<f2'"), "%s", b.data + 10);
	size_t hs = dg_npy_header_size(DG_F16, &t->shape);
	cr_assert_eq(hs % 64, 0);
	cr_assert_eq(b.len, hs + 4);
	cr_assert_eq(memcmp(b.data + hs, t->data, 4), 0);
	dg_buf_deinit(&b);
	dg_tensor_free(t);
}

Test(codec_npy, bfloat16_has_no_npy_form)
{
	int64_t d[] = { 3 };
	struct dg_tensor *t = pattern(DG_BF16, 1, d);
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	assert_err(dg_npy_encode(t, &b, &err), DG_EDTYPE, &err, "bfloat16 has no .npy form");
	cr_assert_not_null(strstr(err.hint, "Cast to float32"), "%s", err.hint);
	cr_assert_eq(b.len, 0, "nothing written");
	cr_assert_eq(dg_npy_header_size(DG_BF16, &t->shape), 0);
	assert_err(dg_npy_encode_header(DG_BF16, &t->shape, &b, &err), DG_EDTYPE, &err,
		   "numpy has no bfloat16");
	dg_buf_deinit(&b);
	dg_tensor_free(t);
}

Test(codec_npy, a_numpy_style_f2_header_decodes_to_float16)
{
	uint16_t v[3] = { 0x3c00, 0xc000, 0x7e00 };
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	build_npy(&b, 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", v,
		  sizeof v);
	struct dg_tensor *t = dg_npy_decode(b.data, b.len, &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_F16);
	cr_assert_eq(dg_tensor_get_f64(t, 1), -2.0);
	cr_assert(isnan(dg_tensor_get_f64(t, 2)));
	dg_tensor_free(t);
	dg_buf_deinit(&b);
}
