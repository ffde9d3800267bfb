/* The byte buffer's JSON writers (core/include/dg/buf.h): what they write
 * parses back with jansson to the same value, reals are written as
 * jansson's compact dump writes them (so a hand-written reply reads the same
 * as a jansson one), non-finite reals are null, and strings are escaped. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "dg/buf.h"

/* The text jansson writes for the real x in an array, without the brackets. */
static void jansson_real(double x, char *out, size_t n)
{
	json_t *a = json_pack("[f]", x);
	char *s = json_dumps(a, JSON_COMPACT);

	cr_assert_not_null(s);
	snprintf(out, n, "%.*s", (int)strlen(s) - 2, s + 1);
	free(s);
	json_decref(a);
}

Test(buf, reals_are_written_as_jansson_writes_them)
{
	const double xs[] = { 0.0, 1.0, -2.0, 0.1, 0.447, 1e300, -1e-300, 123456789.0,
			      3.141592653589793, 1e16, 2.5e-7, 4503599627370497.0 };

	for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
		struct dg_buf b = { 0 };
		char want[64];
		cr_assert_eq(dg_buf_json_real(&b, xs[i], NULL), DG_OK);
		jansson_real(xs[i], want, sizeof want);
		cr_assert_str_eq(b.data, want, "%.17g: dg '%s', jansson '%s'", xs[i], b.data, want);
		json_t *back = json_loadb(b.data, b.len, JSON_DECODE_ANY, NULL);
		cr_assert(json_is_real(back), "'%s' is read back as a real", b.data);
		cr_assert_eq(json_real_value(back), xs[i]);
		json_decref(back);
		dg_buf_deinit(&b);
	}
}

Test(buf, non_finite_reals_are_null)
{
	const double xs[] = { NAN, INFINITY, -INFINITY };

	for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
		struct dg_buf b = { 0 };
		cr_assert_eq(dg_buf_json_real(&b, xs[i], NULL), DG_OK);
		cr_assert_str_eq(b.data, "null");
		dg_buf_deinit(&b);
	}
}

Test(buf, strings_are_quoted_and_escaped_and_read_back)
{
	const char *ss[] = { "", "fetch:loss", "a\"b", "back\\slash", "tab\there",
			     "nl\nand\x01ctl", "caf\xc3\xa9" };

	for (size_t i = 0; i < sizeof ss / sizeof ss[0]; i++) {
		struct dg_buf b = { 0 };
		cr_assert_eq(dg_buf_json_string(&b, ss[i], NULL), DG_OK);
		cr_assert_eq(b.data[0], '"');
		json_t *back = json_loadb(b.data, b.len, JSON_DECODE_ANY, NULL);
		cr_assert(json_is_string(back), "'%s' is read back as a string", b.data);
		cr_assert_str_eq(json_string_value(back), ss[i]);
		json_decref(back);
		dg_buf_deinit(&b);
	}
}

Test(buf, writers_append)
{
	struct dg_buf b = { 0 };

	cr_assert_eq(dg_buf_printf(&b, NULL, "{\"k\":"), DG_OK);
	cr_assert_eq(dg_buf_json_string(&b, "v", NULL), DG_OK);
	cr_assert_eq(dg_buf_printf(&b, NULL, ",\"x\":"), DG_OK);
	cr_assert_eq(dg_buf_json_real(&b, 2.0, NULL), DG_OK);
	cr_assert_eq(dg_buf_printf(&b, NULL, "}"), DG_OK);
	cr_assert_str_eq(b.data, "{\"k\":\"v\",\"x\":2.0}");
	dg_buf_deinit(&b);
}
