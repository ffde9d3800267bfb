/* libFuzzer target: the wire codec's header parsing (core/src/wire.c) and the
 * name rule it is used with. The input is lines; each parser gets every line
 * (as a request's or a reply's header value would reach it): Dg-Dtype and
 * Dg-Shape (a parsed shape formats and parses back to itself), the numbers
 * of Dg-Version/Dg-Step/Content-Length, If-Match, Content-Type, Accept,
 * ?format=, a variable name, and the UTF-8 escaping of error messages. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dg/client.h"
#include "dg/wire.h"
#include "fuzz.h"

static void one_value(const char *v, size_t n)
{
	struct dg_err err = { 0 };
	struct dg_shape s, back;
	struct dg_wire_desc d;
	enum dg_dtype dt;
	enum dg_encoding enc;
	uint64_t u;
	char buf[DG_WIRE_SHAPE_LEN], esc[64];
	enum dg_status st;

	st = dg_wire_dtype_parse(v, &dt, &err);
	fuzz_check_err(st == DG_OK, &err);
	FUZZ_ASSERT(st != DG_OK || (unsigned)dt < DG_DTYPE_COUNT);
	st = dg_wire_shape_parse(v, &s, &err);
	fuzz_check_err(st == DG_OK, &err);
	if (st == DG_OK) {
		dg_wire_shape_format(&s, buf);
		FUZZ_ASSERT(dg_wire_shape_parse(buf, &back, &err) == DG_OK);
		FUZZ_ASSERT(dg_shape_eq(&s, &back));
	}
	if (dg_wire_u64_parse(v, n, &u)) {
		uint64_t e = 0;
		dg_wire_version_format(u, buf);
		FUZZ_ASSERT(dg_wire_u64_parse(buf, strlen(buf), &e) && e == u);
		dg_wire_etag_format(u, buf);
		st = dg_wire_etag_parse(buf, &e, &err);
		FUZZ_ASSERT(u == 0 ? st == DG_ECONFLICT : (st == DG_OK && e == u));
	}
	st = dg_wire_etag_parse(v, &u, &err);
	fuzz_check_err(st == DG_OK, &err);
	st = dg_wire_content_encoding(v, &enc, &err);
	fuzz_check_err(st == DG_OK, &err);
	FUZZ_ASSERT((unsigned)dg_wire_accept_encoding(v) <= DG_ENC_TEXT);
	st = dg_wire_format_encoding(v, &enc, &err);
	fuzz_check_err(st == DG_OK, &err);
	st = dg_wire_desc_parse(v, v, &d, &err);
	fuzz_check_err(st == DG_OK, &err);
	st = dg_var_name_check(v, &err);
	fuzz_check_err(st == DG_OK, &err);
	FUZZ_ASSERT(st != DG_OK || dg_var_name_check_stored(v, NULL) == DG_OK);
	size_t k = dg_utf8_escape(v, n, esc, sizeof esc);
	FUZZ_ASSERT(k < sizeof esc && esc[k] == '\0' && dg_utf8_valid(esc, k));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *copy = malloc(size + 1);

	if (!copy)
		return 0;
	memcpy(copy, data, size);
	copy[size] = '\0';
	for (char *line = copy, *next; line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		one_value(line, strlen(line));
	}
	free(copy);
	return 0;
}
