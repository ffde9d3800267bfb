/* libFuzzer target: the text decoder (core/src/codec_text.c). The first byte
 * picks what the context knows (nothing, a dtype, a dtype and a shape with
 * one unknown dim) as a PUT to an existing variable or a feed would pass it;
 * the rest is the text. A decoded tensor must encode to text that decodes to
 * the same dtype and shape and encodes to the same text again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dg/codec.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dg_err err = { 0 };
	enum dg_dtype dt;
	struct dg_shape shape = { .ndim = 2, .dim = { -1, 3 } };
	const enum dg_dtype *want_dt = NULL;
	const struct dg_shape *want_shape = NULL;

	if (size < 1)
		return 0;
	dt = (enum dg_dtype)((data[0] >> 2) % DG_DTYPE_COUNT);
	if (data[0] & 1)
		want_dt = &dt;
	if (data[0] & 2)
		want_shape = &shape;
	struct dg_tensor *t = dg_text_decode((const char *)data + 1, size - 1, want_dt, want_shape,
					     &err);
	fuzz_check_err(t != NULL, &err);
	if (t) {
		struct dg_buf a = { 0 }, b = { 0 };
		FUZZ_ASSERT(dg_text_encode(t, &a, &err) == DG_OK);
		struct dg_tensor *back = dg_text_decode(a.data, a.len, NULL, NULL, &err);
		FUZZ_ASSERT(back && back->dtype == t->dtype && dg_shape_eq(&back->shape, &t->shape));
		FUZZ_ASSERT(dg_text_encode(back, &b, &err) == DG_OK);
		FUZZ_ASSERT(a.len == b.len && !memcmp(a.data, b.data, a.len));
		dg_tensor_free(back);
		dg_buf_deinit(&a);
		dg_buf_deinit(&b);
	}
	dg_tensor_free(t);
	return 0;
}
