/* The wire codec (core/src/wire.c): the tensor headers written and read back,
 * the encodings chosen from media types, and bodies decoded by encoding with
 * the rules doc/http-api.md and doc/encodings.md state. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "dg/wire.h"

Test(wire, shape_header_is_csv_and_a_scalar_is_brackets)
{
	char buf[DG_WIRE_SHAPE_LEN];
	struct dg_shape s = dg_shape_make(2, (int64_t[]){ 2, 3 }), back;
	struct dg_shape big = dg_shape_make(8, (int64_t[]){ 1, 1, 1, 1, 1, 1, 1, 281474976710656 });

	dg_wire_shape_format(&s, buf);
	cr_assert_str_eq(buf, "2,3");
	dg_wire_shape_format(&(struct dg_shape){ 0 }, buf);
	cr_assert_str_eq(buf, "[]");
	cr_assert_eq(dg_wire_shape_parse("[]", &back, NULL), DG_OK);
	cr_assert_eq(back.ndim, 0);
	cr_assert_eq(dg_wire_shape_parse("", &back, NULL), DG_OK);     /* curl -H 'Dg-Shape;' */
	cr_assert_eq(back.ndim, 0);
	dg_wire_shape_format(&big, buf);
	cr_assert_str_eq(buf, "1,1,1,1,1,1,1,281474976710656");
	cr_assert_eq(dg_wire_shape_parse(buf, &back, NULL), DG_OK);
	cr_assert(dg_shape_eq(&back, &big));
}

Test(wire, bad_header_values_are_refused_naming_the_header)
{
	struct dg_err err = { 0 };
	struct dg_shape s;
	enum dg_dtype dt;

	cr_assert_eq(dg_wire_dtype_parse("complex64", &dt, &err), DG_EDTYPE);
	cr_assert(strstr(err.msg, "Dg-Dtype"), "%s", err.msg);
	cr_assert_eq(dg_wire_shape_parse("-1,6", &s, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "Dg-Shape"), "%s", err.msg);
	cr_assert_eq(dg_wire_shape_parse("4611686018427387904", &s, &err), DG_ETOOLARGE);
	cr_assert_eq(dg_wire_dtype_parse(NULL, &dt, &err), DG_EINVAL);
	/* bytes that are not UTF-8 come back escaped */
	cr_assert_eq(dg_wire_dtype_parse("\xff\xfe", &dt, &err), DG_EDTYPE);
	cr_assert(strstr(err.msg, "'\\xff\\xfe'"), "%s", err.msg);
	cr_assert(dg_utf8_valid(err.msg, strlen(err.msg)));
}

Test(wire, numbers_are_digits_only_without_overflow)
{
	uint64_t v = 7;

	cr_assert(dg_wire_u64_parse("18446744073709551615", 20, &v));
	cr_assert_eq(v, UINT64_MAX);
	cr_assert_not(dg_wire_u64_parse("18446744073709551616", 20, &v));
	cr_assert(dg_wire_u64_parse(" 42\t", 4, &v));
	cr_assert_eq(v, 42);
	cr_assert_not(dg_wire_u64_parse("-1", 2, &v));
	cr_assert_not(dg_wire_u64_parse("+1", 2, &v));
	cr_assert_not(dg_wire_u64_parse("1 2", 3, &v));
	cr_assert_not(dg_wire_u64_parse("", 0, &v));
	cr_assert_not(dg_wire_u64_parse("0x10", 4, &v));
	cr_assert_eq(v, 42, "a refused value leaves *out alone");
}

Test(wire, etags_round_trip_and_zero_never_matches)
{
	char buf[DG_WIRE_VERSION_LEN];
	uint64_t v;
	struct dg_err err = { 0 };

	dg_wire_etag_format(UINT64_MAX, buf);
	cr_assert_str_eq(buf, "\"18446744073709551615\"");
	cr_assert_eq(dg_wire_etag_parse(buf, &v, NULL), DG_OK);
	cr_assert_eq(v, UINT64_MAX);
	cr_assert_eq(dg_wire_etag_parse(" 12 ", &v, NULL), DG_OK);
	cr_assert_eq(v, 12);
	cr_assert_eq(dg_wire_etag_parse("\"0\"", &v, &err), DG_ECONFLICT);
	cr_assert_eq(dg_wire_etag_parse("\" 7\"", &v, &err), DG_EINVAL);
	cr_assert_eq(dg_wire_etag_parse("\"\"", &v, &err), DG_EINVAL);
	cr_assert_eq(dg_wire_etag_parse("\"", &v, &err), DG_EINVAL);
	cr_assert_eq(dg_wire_etag_parse("W/\"7\"", &v, &err), DG_EINVAL);
	dg_wire_version_format(9, buf);
	cr_assert_str_eq(buf, "9");
}

Test(wire, encodings_follow_the_documented_media_types)
{
	enum dg_encoding e;
	struct dg_err err = { 0 };

	cr_assert_eq(dg_wire_content_encoding(NULL, &e, NULL), DG_OK);
	cr_assert_eq(e, DG_ENC_RAW);
	cr_assert_eq(dg_wire_content_encoding("application/x-www-form-urlencoded", &e, NULL), 0);
	cr_assert_eq(e, DG_ENC_RAW);
	cr_assert_eq(dg_wire_content_encoding("Application/X-NPY; foo=1", &e, NULL), DG_OK);
	cr_assert_eq(e, DG_ENC_NPY);
	cr_assert_eq(dg_wire_content_encoding("text/plain; charset=utf-8", &e, NULL), DG_OK);
	cr_assert_eq(e, DG_ENC_TEXT);
	cr_assert_eq(dg_wire_content_encoding("application/x-npyz", &e, &err), DG_EINVAL);
	cr_assert_eq(dg_wire_content_encoding("image/png", &e, &err), DG_EINVAL);
	cr_assert(strstr(err.msg, "image/png"), "%s", err.msg);
	cr_assert_eq(dg_wire_content_encoding("*/*", &e, &err), DG_EINVAL, "no wildcard writes");
	cr_assert_eq(dg_wire_accept_encoding(NULL), DG_ENC_RAW);
	cr_assert_eq(dg_wire_accept_encoding("image/png, text/*;q=0.5, application/x-npy"),
		     DG_ENC_TEXT);
	cr_assert_eq(dg_wire_accept_encoding("image/png"), DG_ENC_RAW);
	cr_assert_eq(dg_wire_format_encoding("npy", &e, NULL), DG_OK);
	cr_assert_eq(e, DG_ENC_NPY);
	cr_assert_eq(dg_wire_format_encoding("NPY", &e, &err), DG_EINVAL);
}

Test(wire, raw_bodies_need_both_headers_and_exactly_their_bytes)
{
	static const float f[6] = { 1, 2, 3, 4, 5, 6 };
	struct dg_wire_desc d;
	struct dg_err err = { 0 };
	struct dg_tensor *t;

	cr_assert_eq(dg_wire_desc_parse("float32", NULL, &d, NULL), DG_OK);
	cr_assert_null(dg_wire_decode(DG_ENC_RAW, f, sizeof f, &d, NULL, &err));
	cr_assert(strstr(err.msg, "Dg-Shape"), "%s", err.msg);
	cr_assert_null(dg_wire_decode(DG_ENC_RAW, f, sizeof f, NULL, NULL, &err));
	cr_assert_eq(err.code, DG_EINVAL);
	cr_assert_eq(dg_wire_desc_parse("float32", "2,3", &d, NULL), DG_OK);
	cr_assert_null(dg_wire_decode(DG_ENC_RAW, f, 20, &d, NULL, &err));
	cr_assert(strstr(err.msg, "20 bytes"), "%s", err.msg);
	t = dg_wire_decode(DG_ENC_RAW, f, sizeof f, &d, NULL, &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(memcmp(t->data, f, sizeof f), 0);
	dg_tensor_free(t);
	/* a scalar and an empty tensor */
	cr_assert_eq(dg_wire_desc_parse("float32", "[]", &d, NULL), DG_OK);
	t = dg_wire_decode(DG_ENC_RAW, f, 4, &d, NULL, &err);
	cr_assert(t && t->shape.ndim == 0 && t->numel == 1);
	dg_tensor_free(t);
	cr_assert_eq(dg_wire_desc_parse("int64", "0,3", &d, NULL), DG_OK);
	t = dg_wire_decode(DG_ENC_RAW, NULL, 0, &d, NULL, &err);
	cr_assert(t && t->numel == 0, "%s", err.msg);
	dg_tensor_free(t);
}

Test(wire, raw_bool_bytes_read_as_zero_or_one_copied_or_adopted)
{
	static const uint8_t b[4] = { 0, 1, 2, 255 };
	struct dg_wire_desc d;
	struct dg_tensor *t;
	void *block = dg_alloc_aligned(sizeof b);

	cr_assert_eq(dg_wire_desc_parse("bool", "4", &d, NULL), DG_OK);
	t = dg_wire_decode(DG_ENC_RAW, b, sizeof b, &d, NULL, NULL);
	cr_assert_eq(memcmp(t->data, (uint8_t[]){ 0, 1, 1, 1 }, 4), 0);
	dg_tensor_free(t);
	memcpy(block, b, sizeof b);
	void *adopt = block;
	t = dg_wire_decode(DG_ENC_RAW, block, sizeof b, &d, &adopt, NULL);
	cr_assert_null(adopt, "the block became the tensor's");
	cr_assert_eq(t->data, block);
	cr_assert_eq(memcmp(t->data, (uint8_t[]){ 0, 1, 1, 1 }, 4), 0);
	dg_tensor_free(t);
}

Test(wire, a_failed_adoption_leaves_the_block_with_the_caller)
{
	struct dg_wire_desc d;
	void *block = dg_alloc_aligned(8), *adopt = block;

	cr_assert_eq(dg_wire_desc_parse("float32", "3", &d, NULL), DG_OK);
	cr_assert_null(dg_wire_decode(DG_ENC_RAW, block, 8, &d, &adopt, NULL));
	cr_assert_eq(adopt, block);
	dg_free_aligned(block);
}

Test(wire, npy_and_text_bodies_describe_themselves_or_take_the_headers)
{
	struct dg_shape three = dg_shape_make(1, (int64_t[]){ 3 });
	struct dg_tensor *src = dg_tensor_new(DG_I32, &three, NULL);
	struct dg_buf npy = { 0 };
	struct dg_wire_desc d;
	struct dg_err err = { 0 };
	struct dg_tensor *t;

	cr_assert_eq(dg_npy_encode(src, &npy, NULL), DG_OK);
	/* npy wins over headers that disagree */
	cr_assert_eq(dg_wire_desc_parse("float64", "7", &d, NULL), DG_OK);
	t = dg_wire_decode(DG_ENC_NPY, npy.data, npy.len, &d, NULL, &err);
	cr_assert(t && t->dtype == DG_I32 && t->numel == 3, "%s", err.msg);
	dg_tensor_free(t);
	cr_assert_null(dg_wire_decode(DG_ENC_NPY, npy.data, npy.len - 1, NULL, NULL, &err));
	cr_assert_null(dg_wire_decode(DG_ENC_NPY, NULL, 0, NULL, NULL, &err));
	/* text: the headers give dtype and shape when the body has no header line */
	cr_assert_eq(dg_wire_desc_parse("int32", "2", &d, NULL), DG_OK);
	t = dg_wire_decode(DG_ENC_TEXT, "4 5", 3, &d, NULL, &err);
	cr_assert(t && t->dtype == DG_I32 && t->numel == 2, "%s", err.msg);
	dg_tensor_free(t);
	t = dg_wire_decode(DG_ENC_TEXT, "4 5 6", 5, NULL, NULL, &err);
	cr_assert(t && t->dtype == DG_F64 && t->numel == 3, "%s", err.msg);
	dg_tensor_free(t);
	cr_assert_null(dg_wire_decode(DG_ENC_TEXT, "4 5 6", 5, &d, NULL, &err));
	cr_assert_null(dg_wire_decode((enum dg_encoding)7, "x", 1, NULL, NULL, &err));
	dg_buf_deinit(&npy);
	dg_tensor_free(src);
}
