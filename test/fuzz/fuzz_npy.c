/* libFuzzer target: the .npy decoder (core/src/codec_npy.c). Any input either
 * decodes to a tensor that encodes and decodes back to the same dtype, shape
 * and bytes, or is refused with a message; nothing crashes, leaks or reads
 * past the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dg/codec.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dg_err err = { 0 };
	struct dg_shape shape;
	enum dg_dtype dt;
	size_t off;
	struct dg_tensor *t = dg_npy_decode(data, size, &err);

	fuzz_check_err(t != NULL, &err);
	if (dg_npy_parse_header(data, size, &dt, &shape, &off, &err) == DG_OK)
		FUZZ_ASSERT(off <= size);
	else
		FUZZ_ASSERT(!t);
	if (t) {
		struct dg_buf out = { 0 };
		FUZZ_ASSERT(dg_npy_encode(t, &out, &err) == DG_OK);
		struct dg_tensor *back = dg_npy_decode(out.data, out.len, &err);
		FUZZ_ASSERT(back && back->dtype == t->dtype && dg_shape_eq(&back->shape, &t->shape));
		FUZZ_ASSERT(back->nbytes == t->nbytes && !memcmp(back->data, t->data, t->nbytes));
		dg_tensor_free(back);
		dg_buf_deinit(&out);
	}
	dg_tensor_free(t);
	return 0;
}
