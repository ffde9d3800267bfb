/* Helpers shared by the CPU kernel families (kernels/cpu/ files): output
 * allocation, axis normalisation and the op-table symbols that registry.c
 * collects. Nothing here is visible outside kernels/. */
#ifndef DG_CPU_H
#define DG_CPU_H

#include "dg/kernels.h"

/* Op tables, each terminated by an entry with name == NULL. One per family
 * file: eltwise.c, reduce.c, nn.c, matmul.c, array.c, random.c, basic.c.
 * Writable only so that registry.c can set the .cuda slots once, before its
 * index is first read; everything else sees them through const pointers. */
extern struct dg_op_def dg_ops_basic[];    /* Const, Placeholder, Identity */
extern struct dg_op_def dg_ops_eltwise[];  /* unary, binary, compare, Where, Cast */
extern struct dg_op_def dg_ops_reduce[];   /* Sum, Mean, Max, Min, ArgMax */
extern struct dg_op_def dg_ops_nn[];       /* Softmax, LogSoftmax, cross-entropy, OneHot */
extern struct dg_op_def dg_ops_matmul[];   /* MatMul, BatchMatMul */
extern struct dg_op_def dg_ops_array[];    /* Slice .. Squeeze, Size, Shape, Fill, Gather, ... */
extern struct dg_op_def dg_ops_random[];   /* seeded initialisers, Dropout */
extern struct dg_op_def dg_ops_grad[];     /* gradient helpers (grad.c) */
extern struct dg_op_def dg_ops_conv[];     /* Conv2D, pooling, their gradients */
extern struct dg_op_def dg_ops_norm[];     /* FusedBatchNorm and its gradient */
extern struct dg_op_def dg_ops_data[];     /* IdxReader, NpyReader, CsvReader (data.c) */

/* Allocate output i of the kernel (uninitialised contents); on failure sets
 * c->err and returns NULL. The tensor is stored in c->out[i]. */
struct dg_tensor *cpu_out(struct dg_kernel_ctx *c, int i, enum dg_dtype dt,
			  const struct dg_shape *shape);
/* Same, zero-filled. */
struct dg_tensor *cpu_out_zero(struct dg_kernel_ctx *c, int i, enum dg_dtype dt,
			       const struct dg_shape *shape);

/* The type of an actual tensor, for the checks a kernel shares with its
 * op's inference (which sees possibly partial types). */
static inline struct dg_ttype cpu_ttype(const struct dg_tensor *t)
{
	struct dg_ttype tt = { .dtype = t->dtype, .shape = t->shape };

	return tt;
}

/* Normalise axis (negative counts from the end) for a rank-ndim value.
 * DG_EINVAL naming the axis and rank when out of range. */
enum dg_status cpu_axis(int64_t axis, int ndim, int *out, struct dg_err *err);

/* Sum and maximum of a contiguous run x[0..n), shared by the reductions
 * (reduce.c) and the softmax family (nn.c). The float sums run independent
 * lanes over blocks of 1024 elements and add each block into double lanes, so
 * the rounding error stays that of one block however long the run; n may be 0
 * (sum 0). The maxima need n >= 1 and are NaN when any element is NaN. */
float cpu_sum_f32(const float *x, int64_t n);
double cpu_sum_f64(const double *x, int64_t n);
float cpu_max_f32(const float *x, int64_t n);
double cpu_max_f64(const double *x, int64_t n);

/* One Philox4x32-10 block (Salmon et al. 2011): out = bijection_key(ctr). The
 * counter-based generator behind the random ops (random.c); exposed so tests
 * can check the published known-answer vectors. */
void cpu_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#endif
