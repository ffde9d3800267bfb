/* dtypes, shapes and host tensors: the value type every part of dg passes
 * around. A tensor owns one contiguous, 64-byte aligned block of C-order,
 * little-endian elements; it has exactly one owner, who frees it. */
#ifndef DG_TENSOR_H
#define DG_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dg/status.h"

/* Append-only: numbers travel in headers and files. */
enum dg_dtype {
	DG_F32 = 0,
	DG_F64 = 1,
	DG_I32 = 2,
	DG_I64 = 3,
	DG_U8 = 4,
	DG_BOOL = 5,   /* one byte, 0 or 1 */
	DG_F16 = 6,    /* IEEE 754 binary16 ("float16", numpy '<f2') */
	DG_BF16 = 7,   /* bfloat16: the top 16 bits of a float32 */
	DG_DTYPE_COUNT
};

#define DG_MAX_DIMS 8
/* Upper bound on elements of any tensor (2^48): keeps byte counts far from
 * overflow for every dtype and refuses absurd shapes before any allocation. */
#define DG_MAX_NUMEL ((int64_t)1 << 48)

/* Name used in JSON, headers and text ("float32", "int64", "bool", "float16",
 * "bfloat16"). */
const char *dg_dtype_name(enum dg_dtype dt);
/* Bytes per element. */
size_t dg_dtype_size(enum dg_dtype dt);
/* float32 and float64: the dtypes every float kernel computes in. The 16-bit
 * floats are not included: they are storage dtypes (dg_dtype_is_half). */
bool dg_dtype_is_float(enum dg_dtype dt);
bool dg_dtype_is_int(enum dg_dtype dt);   /* int32, int64, uint8 (not bool) */
/* float16 and bfloat16: stored, sent, cast and fed like any dtype; the few ops
 * that compute on them (Cast, MatMul, Add/Sub/Mul, Relu) convert to float32,
 * compute there and round once to the 16-bit dtype. Other ops refuse them at
 * validation with a hint to Cast to float32. */
bool dg_dtype_is_half(enum dg_dtype dt);
/* Parse a dtype name: the canonical names above plus numpy-style aliases
 * ("f4", "float", "double", "i8", "int", "long", "u1", "?", "f2", "half",
 * "bf16"). Unknown names give DG_EDTYPE with a hint listing the valid names. */
enum dg_status dg_dtype_parse(const char *s, enum dg_dtype *out, struct dg_err *err);

/* Conversions of one 16-bit float (its bits). Narrowing rounds to nearest,
 * ties to even, overflows to inf (float16: |x| >= 65520), keeps subnormals and
 * the sign of zero, and turns NaN into a quiet NaN. Widening is exact. The f64
 * forms round once from double (no double rounding through float32). */
uint16_t dg_f32_to_f16(float x);
uint16_t dg_f64_to_f16(double x);
float dg_f16_to_f32(uint16_t h);
uint16_t dg_f32_to_bf16(float x);
uint16_t dg_f64_to_bf16(double x);
float dg_bf16_to_f32(uint16_t h);
/* Arrays of n elements between float32 and dt (float16 or bfloat16; any other
 * dt is the caller's bug and does nothing). For kernels that compute in float32. */
void dg_half_to_f32(enum dg_dtype dt, const uint16_t *in, float *out, int64_t n);
void dg_f32_to_half(enum dg_dtype dt, const float *in, uint16_t *out, int64_t n);

/* A shape: ndim in 0..DG_MAX_DIMS (0 = scalar). In shape *inference* (graph
 * validation) ndim == -1 means unknown rank and dim[i] == -1 an unknown size;
 * tensors always have fully known shapes. */
struct dg_shape {
	int ndim;
	int64_t dim[DG_MAX_DIMS];
};

/* Build a shape from an array (ndim <= DG_MAX_DIMS is the caller's contract). */
struct dg_shape dg_shape_make(int ndim, const int64_t *dims);
/* Element count with overflow and DG_MAX_NUMEL checks; dims must be >= 0.
 * Returns DG_ETOOLARGE or DG_EINVAL with a message naming the shape. */
enum dg_status dg_shape_numel(const struct dg_shape *s, int64_t *out, struct dg_err *err);
bool dg_shape_eq(const struct dg_shape *a, const struct dg_shape *b);
/* True when every dim is known (ndim >= 0 and no -1). */
bool dg_shape_is_known(const struct dg_shape *s);
/* "[2,3]", "[]" for a scalar, "[?,3]" for unknown dims, "<unknown>" for unknown
 * rank. Always NUL-terminates; returns the length it wanted (snprintf-style). */
int dg_shape_format(const struct dg_shape *s, char *buf, size_t n);
/* Parse "2,3", "[2,3]", "2x3", "" or "[]" (scalar). Rejects negatives, more than
 * DG_MAX_DIMS dims, and element counts over DG_MAX_NUMEL. */
enum dg_status dg_shape_parse(const char *s, struct dg_shape *out, struct dg_err *err);

/* NumPy broadcasting of two shapes (ranks aligned on the right; sizes equal or
 * 1). Unknown dims (-1) broadcast to unknown. DG_ESHAPE on mismatch. */
enum dg_status dg_shape_broadcast(const struct dg_shape *a, const struct dg_shape *b,
				  struct dg_shape *out, struct dg_err *err);

struct dg_tensor {
	enum dg_dtype dtype;
	struct dg_shape shape;
	int64_t numel;
	size_t nbytes;
	void *data;         /* owned, 64-byte aligned; NULL only when nbytes == 0 */
};

/* A zero-filled tensor. Returns an owned tensor (free with dg_tensor_free) or
 * NULL with *err set (DG_ENOMEM, DG_ETOOLARGE, DG_EINVAL). shape is borrowed. */
struct dg_tensor *dg_tensor_new(enum dg_dtype dt, const struct dg_shape *shape,
				struct dg_err *err);
/* Like dg_tensor_new, contents undefined: for outputs a kernel overwrites whole. */
struct dg_tensor *dg_tensor_new_uninit(enum dg_dtype dt, const struct dg_shape *shape,
				       struct dg_err *err);
/* A tensor holding a copy of nbytes = numel * size bytes from src. */
struct dg_tensor *dg_tensor_from_data(enum dg_dtype dt, const struct dg_shape *shape,
				      const void *src, struct dg_err *err);
/* A tensor around data, a block from dg_alloc_aligned of nbytes bytes that must
 * equal numel * size (no copy). On success the tensor owns data; on failure
 * (NULL with *err set: DG_EINVAL naming the sizes, DG_ENOMEM, DG_EDTYPE) the
 * caller still owns it. data may be NULL only when nbytes is 0. */
struct dg_tensor *dg_tensor_adopt(enum dg_dtype dt, const struct dg_shape *shape, void *data,
				  size_t nbytes, struct dg_err *err);
/* A 0-d tensor of dt holding v converted (bool: v != 0). */
struct dg_tensor *dg_tensor_scalar(enum dg_dtype dt, double v, struct dg_err *err);
/* Deep copy. */
struct dg_tensor *dg_tensor_clone(const struct dg_tensor *t, struct dg_err *err);
/* NULL is fine. */
void dg_tensor_free(struct dg_tensor *t);

/* Element i converted to double (int64 beyond 2^53 loses precision: for tests
 * and messages, not for data paths; float16/bfloat16 are exact). */
double dg_tensor_get_f64(const struct dg_tensor *t, int64_t i);
/* Store v converted to the tensor's dtype at element i (integer dtypes saturate
 * to their range, NaN stores 0; float16/bfloat16 round as dg_f64_to_f16). */
void dg_tensor_set_f64(struct dg_tensor *t, int64_t i, double v);

/* 64-byte aligned allocation for tensor-sized buffers; free with dg_free_aligned
 * (never with free()). Returns NULL on failure (n == 0 gives a valid unique
 * pointer). Blocks of 1 MiB and more are kept for reuse when freed, up to
 * DG_TENSOR_CACHE_MB (default 1024; 0 disables): graph steps allocate the same
 * sizes repeatedly and fresh large blocks cost a page fault per 4 KiB. Thread-safe. */
void *dg_alloc_aligned(size_t n);
void dg_free_aligned(void *p);
/* Release every cached block to the system (e.g. under memory pressure). */
void dg_alloc_trim(void);
/* Bytes currently held in the cache. */
size_t dg_alloc_cached_bytes(void);

#endif
