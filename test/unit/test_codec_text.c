/* The text encoding (core/src/codec_text.c): the exact layout the encoder
 * writes, exact round trips of every dtype (including NaN, inf, -0, denormals,
 * FLT_MAX and int64 extremes, and many random bit patterns), and the decoder's
 * tolerance of layout and its errors that name the line and the token. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/codec.h"

/* Encode t; the caller frees the returned string. */
static char *encode(const struct dg_tensor *t)
{
	struct dg_buf b = { 0 };
	struct dg_err err = { 0 };

	cr_assert_eq(dg_text_encode(t, &b, &err), DG_OK, "%s", err.msg);
	return dg_buf_steal(&b, NULL);
}

static struct dg_tensor *from(enum dg_dtype dt, int ndim, const int64_t *dims, const void *v)
{
	struct dg_shape s = dg_shape_make(ndim, dims);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_from_data(dt, &s, v, &err);

	cr_assert_not_null(t, "%s", err.msg);
	return t;
}

static void assert_encodes_as(const struct dg_tensor *t, const char *want)
{
	char *got = encode(t);

	cr_assert_str_eq(got, want);
	free(got);
}

/* Decode all of s with no context. */
static struct dg_tensor *decode(const char *s, struct dg_err *err)
{
	dg_err_clear(err);
	return dg_text_decode(s, strlen(s), NULL, NULL, err);
}

static void assert_err(const struct dg_err *err, enum dg_status code, const char *want)
{
	cr_assert_eq(err->code, code, "code %s (%s), wanted %s", dg_status_name(err->code),
		     err->msg, dg_status_name(code));
	cr_assert_not_null(strstr(err->msg, want), "message '%s' lacks '%s'", err->msg, want);
}

static void assert_refused(const char *s, enum dg_status code, const char *want)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode(s, &err);

	cr_assert_null(t, "accepted: %s", s);
	assert_err(&err, code, want);
}

/* Bitwise equality, except that any NaN equals any NaN (text spells them all
 * "nan"; payloads and sign are not kept). */
static void assert_same_values(const struct dg_tensor *a, const struct dg_tensor *b)
{
	cr_assert_eq(a->dtype, b->dtype);
	cr_assert(dg_shape_eq(&a->shape, &b->shape), "shapes differ");
	for (int64_t i = 0; i < a->numel; i++) {
		if (a->dtype == DG_F32 && isnan(((float *)a->data)[i])) {
			cr_assert(isnan(((float *)b->data)[i]), "element %lld", (long long)i);
			continue;
		}
		if (a->dtype == DG_F64 && isnan(((double *)a->data)[i])) {
			cr_assert(isnan(((double *)b->data)[i]), "element %lld", (long long)i);
			continue;
		}
		size_t es = dg_dtype_size(a->dtype);
		cr_assert_eq(memcmp((char *)a->data + i * (int64_t)es,
				    (char *)b->data + i * (int64_t)es, es),
			     0, "element %lld differs", (long long)i);
	}
}

/* Encode then decode with no context: the header alone must carry it all. */
static void round_trip(const struct dg_tensor *t)
{
	char *s = encode(t);
	struct dg_err err = { 0 };
	struct dg_tensor *r = dg_text_decode(s, strlen(s), NULL, NULL, &err);

	cr_assert_not_null(r, "%s\n%s", err.msg, s);
	assert_same_values(t, r);
	dg_tensor_free(r);
	free(s);
}

/* --- the encoder's layout ------------------------------------------------------- */

Test(codec_text, matrix_is_one_row_per_line_under_the_header)
{
	int64_t d[] = { 2, 3 };
	float v[] = { 1, 2.5f, -3, 0.1f, NAN, INFINITY };
	struct dg_tensor *t = from(DG_F32, 2, d, v);

	assert_encodes_as(t, "# float32 [2,3]\n1 2.5 -3\n0.1 nan inf\n");
	dg_tensor_free(t);
}

Test(codec_text, rank_3_puts_a_blank_line_between_2d_blocks)
{
	int64_t d[] = { 2, 2, 2 };
	int32_t v[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	struct dg_tensor *t = from(DG_I32, 3, d, v);

	assert_encodes_as(t, "# int32 [2,2,2]\n0 1\n2 3\n\n4 5\n6 7\n");
	dg_tensor_free(t);
}

Test(codec_text, rank_4_separates_every_2d_block)
{
	int64_t d[] = { 2, 2, 1, 2 };
	uint8_t v[] = { 0, 1, 2, 3, 4, 5, 6, 255 };
	struct dg_tensor *t = from(DG_U8, 4, d, v);

	assert_encodes_as(t, "# uint8 [2,2,1,2]\n0 1\n\n2 3\n\n4 5\n\n6 255\n");
	dg_tensor_free(t);
}

Test(codec_text, scalar_is_one_number_and_vector_one_line)
{
	double x = -7.25;
	int64_t d[] = { 4 };
	uint8_t b[] = { 1, 0, 0, 1 };
	struct dg_tensor *s = from(DG_F64, 0, NULL, &x);
	struct dg_tensor *v = from(DG_BOOL, 1, d, b);

	assert_encodes_as(s, "# float64 []\n-7.25\n");
	assert_encodes_as(v, "# bool [4]\n1 0 0 1\n");
	dg_tensor_free(s);
	dg_tensor_free(v);
}

Test(codec_text, empty_tensor_is_the_header_alone)
{
	int64_t d[] = { 3, 0 };
	struct dg_tensor *t = from(DG_F32, 2, d, NULL);

	assert_encodes_as(t, "# float32 [3,0]\n");
	dg_tensor_free(t);
}

Test(codec_text, floats_use_the_shortest_exact_spelling)
{
	int64_t d[] = { 9 };
	float f[] = { 0.1f,   1.0f / 3.0f, 16777216.0f, FLT_MAX, -0.0f,
		      1e-45f, 100.0f,      1e10f,       -2.5e-5f };
	double g[] = { 0.1, 1.0 / 3.0,         1e300,  DBL_MAX, -0.0, 4.9e-324,
		       0.3, 123456789012345.0, 2.0 / 3 };
	struct dg_tensor *tf = from(DG_F32, 1, d, f), *tg = from(DG_F64, 1, d, g);

	assert_encodes_as(tf, "# float32 [9]\n0.1 0.33333334 16777216 3.4028235e+38 -0 1.4013e-45 "
			      "100 1e+10 -2.5e-05\n");
	assert_encodes_as(tg,
			  "# float64 [9]\n0.1 0.3333333333333333 1e+300 "
			  "1.7976931348623157e+308 -0 4.94065645841247e-324 0.3 123456789012345 "
			  "0.6666666666666666\n");
	dg_tensor_free(tf);
	dg_tensor_free(tg);
}

Test(codec_text, integers_are_written_in_full)
{
	int64_t d[] = { 4 };
	int64_t l[] = { INT64_MIN, INT64_MAX, 0, -1 };
	int32_t i[] = { INT32_MIN, INT32_MAX, 10, -10 };
	struct dg_tensor *tl = from(DG_I64, 1, d, l), *ti = from(DG_I32, 1, d, i);

	assert_encodes_as(tl, "# int64 [4]\n-9223372036854775808 9223372036854775807 0 -1\n");
	assert_encodes_as(ti, "# int32 [4]\n-2147483648 2147483647 10 -10\n");
	dg_tensor_free(tl);
	dg_tensor_free(ti);
}

Test(codec_text, long_rows_are_not_truncated)
{
	/* Far more than the encoder's staging buffer in one row. */
	int64_t d[] = { 20000 };
	struct dg_shape s = dg_shape_make(1, d);
	struct dg_tensor *t = dg_tensor_new(DG_F64, &s, NULL);

	for (int64_t i = 0; i < t->numel; i++)
		((double *)t->data)[i] = (double)i / 7.0;
	char *txt = encode(t);
	size_t spaces = 0;
	for (char *p = txt; *p; p++)
		spaces += *p == ' ';
	cr_assert_eq(spaces, 2 + 19999);   /* two in the header, one between neighbours */
	round_trip(t);
	free(txt);
	dg_tensor_free(t);
}

/* --- round trips ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t next_u64(void)
{
	/* splitmix64: a deterministic spread of bit patterns */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

Test(codec_text, every_dtype_round_trips_in_every_rank)
{
	int64_t dims[DG_MAX_DIMS] = { 2, 1, 3, 1, 2, 2, 1, 3 };

	for (int dt = 0; dt < DG_DTYPE_COUNT; dt++) {
		for (int nd = 0; nd <= DG_MAX_DIMS; nd++) {
			struct dg_shape s = dg_shape_make(nd, dims);
			struct dg_tensor *t = dg_tensor_new((enum dg_dtype)dt, &s, NULL);
			for (int64_t i = 0; i < t->numel; i++)
				dg_tensor_set_f64(t, i, (double)(i * 5 % 11) - 3.0);
			round_trip(t);
			dg_tensor_free(t);
		}
	}
}

Test(codec_text, empty_tensors_and_scalars_round_trip)
{
	int64_t d[] = { 2, 0, 3 };

	for (int dt = 0; dt < DG_DTYPE_COUNT; dt++) {
		struct dg_shape s = dg_shape_make(3, d);
		struct dg_tensor *t = dg_tensor_new((enum dg_dtype)dt, &s, NULL);
		round_trip(t);
		dg_tensor_free(t);
		t = dg_tensor_scalar((enum dg_dtype)dt, 1, NULL);
		round_trip(t);
		dg_tensor_free(t);
	}
}

Test(codec_text, special_floats_round_trip_with_their_sign)
{
	int64_t d[] = { 10 };
	float f[] = { NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 1e-45f, -FLT_MIN, FLT_MAX,
		      FLT_TRUE_MIN * 3, -FLT_MAX };
	double g[] = { NAN, INFINITY, -INFINITY, -0.0, 0.0, 4.9e-324, -DBL_MIN, DBL_MAX,
		       DBL_TRUE_MIN * 12345, -DBL_MAX };
	struct dg_tensor *tf = from(DG_F32, 1, d, f), *tg = from(DG_F64, 1, d, g);
	struct dg_err err = { 0 };

	round_trip(tf);
	round_trip(tg);
	/* -0 keeps its sign. */
	char *s = encode(tf);
	struct dg_tensor *r = decode(s, &err);
	cr_assert(signbit(((float *)r->data)[3]) && ((float *)r->data)[3] == 0);
	cr_assert(!signbit(((float *)r->data)[4]));
	dg_tensor_free(r);
	free(s);
	dg_tensor_free(tf);
	dg_tensor_free(tg);
}

Test(codec_text, random_bit_patterns_round_trip_exactly)
{
	int64_t d[] = { 4000 };
	struct dg_shape s = dg_shape_make(1, d);
	struct dg_tensor *tf = dg_tensor_new(DG_F32, &s, NULL);
	struct dg_tensor *tg = dg_tensor_new(DG_F64, &s, NULL);
	struct dg_tensor *tl = dg_tensor_new(DG_I64, &s, NULL);
	struct dg_tensor *ti = dg_tensor_new(DG_I32, &s, NULL);

	for (int64_t i = 0; i < s.dim[0]; i++) {
		uint64_t u = next_u64();
		uint32_t w = (uint32_t)u;
		memcpy((float *)tf->data + i, &w, 4);      /* every exponent, NaNs included */
		memcpy((double *)tg->data + i, &u, 8);
		memcpy((int64_t *)tl->data + i, &u, 8);
		memcpy((int32_t *)ti->data + i, &w, 4);
	}
	round_trip(tf);
	round_trip(tg);
	round_trip(tl);
	round_trip(ti);
	dg_tensor_free(tf);
	dg_tensor_free(tg);
	dg_tensor_free(tl);
	dg_tensor_free(ti);
}

Test(codec_text, typical_weights_round_trip_exactly)
{
	int64_t d[] = { 64, 64 };
	struct dg_shape s = dg_shape_make(2, d);
	struct dg_tensor *tf = dg_tensor_new(DG_F32, &s, NULL);
	struct dg_tensor *tg = dg_tensor_new(DG_F64, &s, NULL);

	for (int64_t i = 0; i < tf->numel; i++) {
		double x = ((double)(next_u64() >> 11) / 9007199254740992.0 - 0.5) * 0.2;
		((float *)tf->data)[i] = (float)x;
		((double *)tg->data)[i] = x;
	}
	round_trip(tf);
	round_trip(tg);
	dg_tensor_free(tf);
	dg_tensor_free(tg);
}

/* --- the decoder -------------------------------------------------------------------- */

Test(codec_text, header_gives_dtype_and_shape_and_layout_is_ignored)
{
	const char *s =
		"# int32 [2,3]\n1 2\n\n  3\t4\r\n# a comment line\n5 6   # trailing comment\n";
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode(s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_I32);
	cr_assert_eq(t->shape.ndim, 2);
	cr_assert_eq(t->shape.dim[0], 2);
	cr_assert_eq(t->shape.dim[1], 3);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(((int32_t *)t->data)[i], i + 1);
	dg_tensor_free(t);
}

Test(codec_text, header_may_follow_blank_lines_and_use_other_shape_spellings)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode("\n\n#  f8   2x2  \n1 2 3 4", &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_F64);
	cr_assert_eq(t->shape.ndim, 2);
	cr_assert_float_eq(((double *)t->data)[3], 4.0, 0);
	dg_tensor_free(t);
}

Test(codec_text, header_without_shape_gives_a_vector_of_that_dtype)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode("# uint8\n1 2 255\n", &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_U8);
	cr_assert_eq(t->shape.ndim, 1);
	cr_assert_eq(t->shape.dim[0], 3);
	cr_assert_eq(((uint8_t *)t->data)[2], 255);
	dg_tensor_free(t);
}

Test(codec_text, without_context_numbers_form_a_float64_vector_or_scalar)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode("1.5 -2\n3e2\n", &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_F64);
	cr_assert_eq(t->shape.ndim, 1);
	cr_assert_eq(t->shape.dim[0], 3);
	cr_assert_float_eq(((double *)t->data)[2], 300.0, 0);
	dg_tensor_free(t);
	t = decode("  42\n", &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->shape.ndim, 0);
	cr_assert_float_eq(((double *)t->data)[0], 42.0, 0);
	dg_tensor_free(t);
	t = decode("", &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->shape.ndim, 1);
	cr_assert_eq(t->shape.dim[0], 0);
	dg_tensor_free(t);
}

Test(codec_text, context_supplies_dtype_and_shape_without_a_header)
{
	enum dg_dtype dt = DG_I64;
	struct dg_shape s = { .ndim = 2, .dim = { 2, 2 } };
	struct dg_err err = { 0 };
	const char *txt = "9223372036854775807 -9223372036854775808\n0 7\n";
	struct dg_tensor *t = dg_text_decode(txt, strlen(txt), &dt, &s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_I64);
	cr_assert(dg_shape_eq(&t->shape, &s));
	cr_assert_eq(((int64_t *)t->data)[0], INT64_MAX);
	cr_assert_eq(((int64_t *)t->data)[1], INT64_MIN);
	cr_assert_eq(((int64_t *)t->data)[3], 7);
	dg_tensor_free(t);
	/* The wrong count for the context's shape. */
	t = dg_text_decode("1 2 3", 5, &dt, &s, &err);
	cr_assert_null(t);
	assert_err(&err, DG_ESHAPE, "3 numbers");
	cr_assert_not_null(strstr(err.msg, "[2,2] needs 4"), "%s", err.msg);
}

Test(codec_text, context_shape_may_leave_one_size_to_infer)
{
	struct dg_shape s = { .ndim = 2, .dim = { -1, 3 } };
	struct dg_shape two = { .ndim = 2, .dim = { -1, -1 } };
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_text_decode("1 2 3 4 5 6", 11, NULL, &s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->shape.dim[0], 2);
	cr_assert_eq(t->shape.dim[1], 3);
	dg_tensor_free(t);
	cr_assert_null(dg_text_decode("1 2 3 4", 7, NULL, &s, &err));
	assert_err(&err, DG_ESHAPE, "a multiple of 3");
	cr_assert_null(dg_text_decode("1 2 3 4", 7, NULL, &two, &err));
	assert_err(&err, DG_ESHAPE, "more than one unknown");
}

Test(codec_text, header_wins_over_context)
{
	enum dg_dtype dt = DG_I32;
	struct dg_shape s = { .ndim = 1, .dim = { 5 } };
	struct dg_err err = { 0 };
	const char *txt = "# float32 [2]\n0.5 1\n";
	struct dg_tensor *t = dg_text_decode(txt, strlen(txt), &dt, &s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->dtype, DG_F32);
	cr_assert_eq(t->shape.dim[0], 2);
	dg_tensor_free(t);
}

Test(codec_text, only_the_given_length_is_read)
{
	struct dg_err err = { 0 };
	/* Not NUL-terminated where it ends: "1 2 3" cut after "1 2". */
	struct dg_tensor *t = dg_text_decode("1 2 3", 3, NULL, NULL, &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(t->shape.dim[0], 2);
	cr_assert_float_eq(((double *)t->data)[1], 2.0, 0);
	dg_tensor_free(t);
}

Test(codec_text, every_spelling_of_nan_and_inf_is_accepted)
{
	const char *s = "# float32 [8]\nnan NaN NAN inf Inf +inf -Infinity -INF\n";
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode(s, &err);

	cr_assert_not_null(t, "%s", err.msg);
	const float *f = t->data;
	cr_assert(isnan(f[0]) && isnan(f[1]) && isnan(f[2]));
	cr_assert(f[3] == INFINITY && f[4] == INFINITY && f[5] == INFINITY);
	cr_assert(f[6] == -INFINITY && f[7] == -INFINITY);
	dg_tensor_free(t);
	t = decode("# float64 [3]\n-nan INFINITY -inf\n", &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert(isnan(((double *)t->data)[0]) && ((double *)t->data)[2] == -INFINITY);
	dg_tensor_free(t);
}

Test(codec_text, denormals_are_read_not_refused)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode("# float32 [2]\n1e-45 -1.17549421e-38\n", &err);

	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(((float *)t->data)[0], FLT_TRUE_MIN);
	cr_assert(fpclassify(((float *)t->data)[1]) == FP_SUBNORMAL);
	dg_tensor_free(t);
	t = decode("# float64 []\n4.9e-324\n", &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(((double *)t->data)[0], DBL_TRUE_MIN);
	dg_tensor_free(t);
}

Test(codec_text, bools_read_from_digits_and_words)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode("# bool [6]\n0 1 true false True FALSE\n", &err);

	cr_assert_not_null(t, "%s", err.msg);
	const uint8_t want[6] = { 0, 1, 1, 0, 1, 0 };
	cr_assert_eq(memcmp(t->data, want, 6), 0);
	dg_tensor_free(t);
	assert_refused("# bool [2]\n1 2\n", DG_EINVAL, "'2' is not a valid bool");
	assert_refused("# bool [1]\nyes\n", DG_EINVAL, "'yes' is not a valid bool");
}

Test(codec_text, count_that_disagrees_with_the_header_is_refused)
{
	struct dg_err err = { 0 };

	cr_assert_null(decode("# float32 [2,3]\n1 2 3\n4 5\n", &err));
	assert_err(&err, DG_EINVAL, "(6 elements) but 5 numbers");
	cr_assert_null(decode("# float32 []\n1 2\n", &err));
	assert_err(&err, DG_EINVAL, "(1 elements) but 2 numbers");
	cr_assert_null(decode("# int32 [3,0]\n1\n", &err));
	assert_err(&err, DG_EINVAL, "(0 elements) but 1 numbers");
}

Test(codec_text, bad_tokens_are_named_with_their_line)
{
	struct dg_err err = { 0 };

	cr_assert_null(decode("# int32 [3]\n1 2\nx\n", &err));
	assert_err(&err, DG_EINVAL, "text line 3: 'x' is not a valid int32");
	cr_assert_null(decode("1.5\n2..5\n", &err));
	assert_err(&err, DG_EINVAL, "text line 2: '2..5' is not a valid float64");
	cr_assert_null(decode("1,2,3\n", &err));
	assert_err(&err, DG_EINVAL, "'1,2,3'");
	cr_assert_not_null(strstr(err.hint, "commas"), "%s", err.hint);
	/* NUL and control bytes are shown as '?' */
	cr_assert_null(dg_text_decode("1 a\0b 2", 7, NULL, NULL, &err));
	assert_err(&err, DG_EINVAL, "'a?b'");
}

Test(codec_text, integers_must_be_whole_and_in_range)
{
	assert_refused("# int32 [1]\n2147483648\n", DG_EINVAL,
		       "'2147483648' is out of range for int32");
	assert_refused("# int32 [1]\n-2147483649\n", DG_EINVAL, "out of range for int32");
	assert_refused("# uint8 [1]\n256\n", DG_EINVAL, "'256' is out of range for uint8");
	assert_refused("# uint8 [1]\n-1\n", DG_EINVAL, "'-1' is out of range for uint8");
	assert_refused("# int64 [1]\n9223372036854775808\n", DG_EINVAL, "out of range for int64");
	assert_refused("# int64 [1]\n-9223372036854775809\n", DG_EINVAL, "out of range for int64");
	assert_refused("# int32 [1]\n2.0\n", DG_EINVAL, "'2.0' is not a valid int32");
	assert_refused("# int32 [1]\n1e3\n", DG_EINVAL, "'1e3' is not a valid int32");
	assert_refused("# int64 [1]\n0x10\n", DG_EINVAL, "'0x10' is not a valid int64");
	assert_refused("# int32 [1]\n-\n", DG_EINVAL, "'-' is not a valid int32");

	struct dg_err err = { 0 };
	struct dg_tensor *t = decode("# int32 [3]\n+5 -2147483648 2147483647\n", &err);
	cr_assert_not_null(t, "%s", err.msg);
	cr_assert_eq(((int32_t *)t->data)[0], 5);
	cr_assert_eq(((int32_t *)t->data)[1], INT32_MIN);
	cr_assert_eq(((int32_t *)t->data)[2], INT32_MAX);
	dg_tensor_free(t);
}

Test(codec_text, float_overflow_is_refused)
{
	assert_refused("# float32 [1]\n1e39\n", DG_EINVAL, "'1e39' is out of range for float32");
	assert_refused("1e309\n", DG_EINVAL, "'1e309' is out of range for float64");
	assert_refused("# float32 [1]\n1.5f\n", DG_EINVAL, "'1.5f' is not a valid float32");
}

Test(codec_text, bad_headers_are_refused_on_their_line)
{
	struct dg_err err = { 0 };

	cr_assert_null(decode("# flaot32 [2]\n1 2\n", &err));
	assert_err(&err, DG_EDTYPE, "text line 1 (header): unknown dtype 'flaot32'");
	cr_assert_not_null(strstr(err.hint, "float32"), "%s", err.hint);
	cr_assert_null(decode("\n# float32 [2,x]\n1 2\n", &err));
	assert_err(&err, DG_EINVAL, "text line 2 (header): cannot parse shape");
	cr_assert_null(decode("#\n1 2\n", &err));
	assert_err(&err, DG_EINVAL, "names no dtype");
	cr_assert_null(decode("# float32 [1,1,1,1,1,1,1,1,1]\n1\n", &err));
	assert_err(&err, DG_EINVAL, "more than 8 dimensions");
	cr_assert_null(decode("# uint8 [65536,65536,65537]\n1\n", &err));
	assert_err(&err, DG_ETOOLARGE, "2^48");
}

Test(codec_text, huge_tokens_and_header_lines_are_refused)
{
	char big[2000];
	struct dg_err err = { 0 };

	memset(big, '1', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	cr_assert_null(decode(big, &err));
	assert_err(&err, DG_EINVAL, "text line 1: token '1111");
	cr_assert_not_null(strstr(err.msg, "1999 bytes long"), "%s", err.msg);
	big[0] = '#';
	cr_assert_null(decode(big, &err));
	assert_err(&err, DG_EINVAL, "header line is 1998 bytes long");
}

Test(codec_text, a_lying_header_does_not_allocate_its_claim)
{
	struct dg_err err = { 0 };

	/* 2^47 float64 would be 1 PiB: the count check must come first. */
	cr_assert_null(decode("# float64 [140737488355328]\n1 2 3\n", &err));
	assert_err(&err, DG_EINVAL, "(140737488355328 elements) but 3 numbers");
}

/* The contract spelled out with printf itself: the shortest of %.6g..%.9g
 * (float32) or %.15g..%.17g (float64) that reads back to the same bits. The
 * encoder computes this faster; it must agree token for token. */
static void reference(char *s, double x, bool single)
{
	int lo = single ? 6 : 15, hi = single ? 9 : 17;

	if (isnan(x)) {
		strcpy(s, "nan");
		return;
	}
	if (isinf(x)) {
		strcpy(s, x > 0 ? "inf" : "-inf");
		return;
	}
	for (int p = lo; p <= hi; p++) {
		snprintf(s, 40, "%.*g", p, x);
		/* == cannot tell -0 from 0; signbit's nonzero value varies by type. */
		if (single ? strtof(s, NULL) == (float)x && !signbit(strtof(s, NULL)) == !signbit(x)
			   : strtod(s, NULL) == x && !signbit(strtod(s, NULL)) == !signbit(x))
			return;
	}
}

static void assert_tokens_match_reference(const struct dg_tensor *t)
{
	char *txt = encode(t);
	char *save = NULL, want[48];
	char *tok = strtok_r(strchr(txt, '\n') + 1, " \n", &save);

	for (int64_t i = 0; i < t->numel; i++, tok = strtok_r(NULL, " \n", &save)) {
		double x = t->dtype == DG_F32 ? ((float *)t->data)[i] : ((double *)t->data)[i];
		reference(want, x, t->dtype == DG_F32);
		cr_assert_not_null(tok);
		cr_assert_str_eq(tok, want, "element %lld (%a): %s vs %s", (long long)i, x, tok,
				 want);
	}
	free(txt);
}

Test(codec_text, float_spellings_equal_the_printf_reference)
{
	int64_t d[] = { 30000 };
	struct dg_shape s = dg_shape_make(1, d);
	struct dg_tensor *tf = dg_tensor_new(DG_F32, &s, NULL);
	struct dg_tensor *tg = dg_tensor_new(DG_F64, &s, NULL);

	for (int64_t i = 0; i < s.dim[0]; i++) {
		uint64_t u = next_u64();
		uint32_t w = (uint32_t)(u >> 32);
		double typical = ((double)(u >> 11) / 9007199254740992.0 - 0.5) * 0.2;
		/* Thirds: bit patterns of every exponent, typical weights, and
		 * short decimals (which hit exact rounding ties). */
		if (i % 3 == 0) {
			memcpy((float *)tf->data + i, &w, 4);
			memcpy((double *)tg->data + i, &u, 8);
		} else if (i % 3 == 1) {
			((float *)tf->data)[i] = (float)typical;
			((double *)tg->data)[i] = typical;
		} else {
			double dec = (double)(int64_t)(u % 2000001 - 1000000) / 1024.0;
			((float *)tf->data)[i] = (float)dec;
			((double *)tg->data)[i] = dec * 1e-7;
		}
	}
	assert_tokens_match_reference(tf);
	assert_tokens_match_reference(tg);
	dg_tensor_free(tf);
	dg_tensor_free(tg);
}

/* --- the 16-bit floats ----------------------------------------------------------- */

Test(codec_text, float16_prints_the_fewest_digits_that_read_back)
{
	int64_t d[] = { 2, 5 };
	uint16_t v[] = { 0x3555, 0x7bff, 0x8000, 0x7c00, 0x7e00,
			 0x0001, 0x0400, 0x2e66, 0x63d0, 0xbc00 };
	struct dg_tensor *t = from(DG_F16, 2, d, v);

	/* 1/3 = 0.333251953125 and 65504 print as 0.3333 and 65500 (as numpy
	 * prints them): the nearest float16 of each is the value itself. 2^-24,
	 * 2^-14 in exponent form as %g would; 0.1; 1000 without an exponent. */
	assert_encodes_as(t, "# float16 [2,5]\n0.3333 65500 -0 inf nan\n"
			     "6e-08 6.104e-05 0.1 1000 -1\n");
	dg_tensor_free(t);
}

Test(codec_text, bfloat16_prints_at_most_4_digits)
{
	int64_t d[] = { 4 };
	uint16_t v[] = { 0x3eab, 0x7f7f, 0x4789, 0x3f80 };
	struct dg_tensor *t = from(DG_BF16, 1, d, v);

	/* 70144 (0x4789) is the bfloat16 nearest 70000: "7e+04" reads back */
	assert_encodes_as(t, "# bfloat16 [4]\n0.334 3.39e+38 7e+04 1\n");
	dg_tensor_free(t);
}

/* Every one of the 65536 bit patterns of both formats goes through text and
 * comes back with the same bits (NaNs as NaN). */
Test(codec_text, every_16_bit_value_round_trips)
{
	int64_t d[] = { 256, 256 };

	for (int k = 0; k < 2; k++) {
		enum dg_dtype dt = k ? DG_BF16 : DG_F16;
		struct dg_shape s = dg_shape_make(2, d);
		struct dg_tensor *t = dg_tensor_new(dt, &s, NULL);
		uint16_t *h = t->data;
		for (uint32_t u = 0; u < 0x10000; u++)
			h[u] = (uint16_t)u;
		char *text = encode(t);
		struct dg_err err = { 0 };
		struct dg_tensor *r = dg_text_decode(text, strlen(text), NULL, NULL, &err);
		cr_assert_not_null(r, "%s", err.msg);
		cr_assert_eq(r->dtype, dt);
		for (uint32_t u = 0; u < 0x10000; u++) {
			double a = dg_tensor_get_f64(t, u), b = dg_tensor_get_f64(r, u);
			if (isnan(a))
				cr_assert(isnan(b), "%s 0x%04x", dg_dtype_name(dt), u);
			else
				cr_assert_eq(((uint16_t *)r->data)[u], u, "%s 0x%04x came back "
					     "as 0x%04x", dg_dtype_name(dt), u,
					     ((uint16_t *)r->data)[u]);
		}
		dg_tensor_free(r);
		dg_tensor_free(t);
		free(text);
	}
}

Test(codec_text, float16_parses_with_one_rounding_and_refuses_overflow)
{
	struct dg_err err = { 0 };
	struct dg_tensor *t = decode("# float16 [5]\n0.1 65519 1.00048828125 -1e-9 -inf\n", &err);

	cr_assert_not_null(t, "%s", err.msg);
	const uint16_t *h = t->data;
	cr_assert_eq(h[0], 0x2e66);
	cr_assert_eq(h[1], 0x7bff);
	cr_assert_eq(h[2], 0x3c00);   /* the tie between 1 and 1+2^-10: even */
	cr_assert_eq(h[3], 0x8000);
	cr_assert_eq(h[4], 0xfc00);
	dg_tensor_free(t);
	cr_assert_null(decode("# float16 [2]\n1 65520\n", &err));
	assert_err(&err, DG_EINVAL, "'65520' is out of range for float16");
	cr_assert_not_null(strstr(err.hint, "65504"), "%s", err.hint);
	assert_refused("# bfloat16 [1]\n1e39\n", DG_EINVAL, "out of range for bfloat16");
	assert_refused("# float16 [1]\nx1\n", DG_EINVAL, "'x1' is not a valid float16");
}
