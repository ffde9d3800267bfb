/* Shared by the libFuzzer targets of test/fuzz/: a check that aborts (so
 * libFuzzer reports the input) and the invariants of a refusal. */
#ifndef DG_FUZZ_H
#define DG_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dg/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_ASSERT(c)                                                              \
	do {                                                                        \
		if (!(c)) {                                                         \
			fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, \
				__LINE__, #c);                                      \
			abort();                                                    \
		}                                                                   \
	} while (0)

/* A refusal (ok false) has a code that is not DG_OK, never an out-of-memory
 * or internal code for what is only bad input, and a message that is valid
 * UTF-8 (it travels as JSON). */
static inline void fuzz_check_err(int ok, const struct dg_err *err)
{
	if (ok)
		return;
	FUZZ_ASSERT(err->code != DG_OK);
	FUZZ_ASSERT(err->code != DG_ENOMEM && err->code != DG_EINTERNAL);
	FUZZ_ASSERT(err->msg[0] != '\0');
	FUZZ_ASSERT(dg_utf8_valid(err->msg, strlen(err->msg)));
	FUZZ_ASSERT(dg_utf8_valid(err->hint, strlen(err->hint)));
}

#endif
