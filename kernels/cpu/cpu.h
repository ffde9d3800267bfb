/* Helpers shared by the CPU kernel families (kernels/cpu/ files): output
 * allocation, axis normalisation and the op-table symbols that registry.c
 * collects. Nothing here is visible outside kernels/. */
#ifndef DG_CPU_H
#define DG_CPU_H

#include "dg/kernels.h"

/* Op tables, each terminated by an entry with name == NULL. One per family
 * file: eltwise.c, reduce.c, nn.c, matmul.c, array.c, random.c, basic.c. */
extern const struct dg_op_def dg_ops_basic[];    /* Const, Placeholder, Identity */
extern const struct dg_op_def dg_ops_eltwise[];  /* unary, binary, compare, Where, Cast */
extern const struct dg_op_def dg_ops_reduce[];   /* Sum, Mean, Max, Min, ArgMax */
extern const struct dg_op_def dg_ops_nn[];       /* Softmax, LogSoftmax, cross-entropy */
extern const struct dg_op_def dg_ops_matmul[];   /* MatMul, BatchMatMul */
extern const struct dg_op_def dg_ops_array[];    /* Slice .. Squeeze, Size, Shape, Fill, ... */
extern const struct dg_op_def dg_ops_random[];   /* seeded initialisers */

/* Allocate output i of the kernel (uninitialised contents); on failure sets
 * c->err and returns NULL. The tensor is stored in c->out[i]. */
struct dg_tensor *cpu_out(struct dg_kernel_ctx *c, int i, enum dg_dtype dt,
			  const struct dg_shape *shape);
/* Same, zero-filled. */
struct dg_tensor *cpu_out_zero(struct dg_kernel_ctx *c, int i, enum dg_dtype dt,
			       const struct dg_shape *shape);

/* Normalise axis (negative counts from the end) for a rank-ndim value.
 * DG_EINVAL naming the axis and rank when out of range. */
enum dg_status cpu_axis(int64_t axis, int ndim, int *out, struct dg_err *err);

/* One Philox4x32-10 block (Salmon et al. 2011): out = bijection_key(ctr). The
 * counter-based generator behind the random ops (random.c); exposed so tests
 * can check the published known-answer vectors. */
void cpu_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#endif
