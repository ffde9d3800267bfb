/* libFuzzer target: request and reply bodies decoded by the wire codec
 * (dg_wire_decode in core/src/wire.c), as a handler would after reading the
 * headers. Input: a Content-Type line, a Dg-Dtype line and a Dg-Shape line
 * (either may be empty: absent), then the body. The body is decoded copied
 * and, for raw bodies, adopted from an aligned block; both must agree, and a
 * raw result must hold exactly the body's bytes (bools as 0/1). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dg/wire.h"
#include "fuzz.h"

/* The next line of p[0..*n) as a NUL-terminated copy in out; NULL when empty. */
static const char *take_line(const uint8_t **p, size_t *n, char *out, size_t cap)
{
	const uint8_t *nl = memchr(*p, '\n', *n);
	size_t len = nl ? (size_t)(nl - *p) : *n;

	if (len >= cap)
		len = cap - 1;
	memcpy(out, *p, len);
	out[len] = '\0';
	len = nl ? (size_t)(nl - *p) + 1 : *n;
	*p += len;
	*n -= len;
	return out[0] && !memchr(out, '\0', strlen(out)) ? out : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char ct[128], dt[64], sh[160];
	struct dg_err err = { 0 };
	struct dg_wire_desc d;
	enum dg_encoding enc;
	const char *ct_v = take_line(&data, &size, ct, sizeof ct);
	const char *dt_v = take_line(&data, &size, dt, sizeof dt);
	const char *sh_v = take_line(&data, &size, sh, sizeof sh);
	enum dg_status st = dg_wire_content_encoding(ct_v, &enc, &err);

	fuzz_check_err(st == DG_OK, &err);
	if (st != DG_OK)
		return 0;
	st = dg_wire_desc_parse(dt_v, sh_v, &d, &err);
	fuzz_check_err(st == DG_OK, &err);
	if (st != DG_OK)
		return 0;
	struct dg_tensor *t = dg_wire_decode(enc, size ? data : NULL, size, &d, NULL, &err);
	fuzz_check_err(t != NULL, &err);
	if (enc == DG_ENC_RAW) {
		void *block = dg_alloc_aligned(size), *adopt = block;
		FUZZ_ASSERT(block);
		memcpy(block, data, size);
		struct dg_tensor *a = dg_wire_decode(enc, block, size, &d, &adopt, &err);
		FUZZ_ASSERT(!a == !t);
		FUZZ_ASSERT(!a || !size || (adopt == NULL && a->data == block));
		if (a) {
			FUZZ_ASSERT(a->nbytes == size && t->nbytes == size);
			FUZZ_ASSERT(!memcmp(a->data, t->data, size));
			for (size_t i = 0; a->dtype == DG_BOOL && i < size; i++)
				FUZZ_ASSERT(((uint8_t *)a->data)[i] == (data[i] != 0));
		}
		dg_tensor_free(a);
		dg_free_aligned(adopt);
	}
	dg_tensor_free(t);
	return 0;
}
