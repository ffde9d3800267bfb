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

/* The geometry of one convolution or pooling over NHWC images (conv.c):
 * input [n, h, w, c], window kh x kw (pooling: oc = c), strides, dilations,
 * output oh x ow, and the padding before the first row and column (SAME pads
 * evenly, the extra one after, as TensorFlow does). -1 where unknown
 * (inference). Shared with kernels/cuda, whose kernels walk the same numbers. */
struct cpu_conv_geom {
	int64_t n, h, w, c;
	int64_t kh, kw, oc;
	int64_t sh, sw, dh, dw;
	int64_t oh, ow, pt, pl;
	bool same;
};

/* The geometry of a Conv2D-family op (filter f, HWIO) or a pooling (f NULL:
 * window and channels from attrs a) over input x, with every check inference
 * and the kernels make (DG_EDTYPE, DG_ESHAPE, DG_EINVAL with the message). */
enum dg_status cpu_conv_geometry(struct dg_attrs a, const struct dg_ttype *x,
				 const struct dg_ttype *f, struct cpu_conv_geom *g,
				 struct dg_err *err);
/* DG_ESHAPE (naming `what`) unless t is exactly the forward output of g in
 * dtype dt: a gradient's dout, MaxPool2DGrad's y. */
enum dg_status cpu_conv_check_out(const struct cpu_conv_geom *g, enum dg_dtype dt,
				  const struct dg_ttype *t, const char *what, struct dg_err *err);

/* The errors of an index outside its range (array.c), for the kernels that
 * check indices on a device too: element i (value v) of indices of shape ix
 * given to Gather, whose params have `rows` rows, or of segment_ids given to
 * UnsortedSegmentSum with num_segments `num`. DG_EINVAL with the message and
 * hint of the CPU kernel. */
enum dg_status cpu_gather_index_err(const struct dg_shape *ix, int64_t i, int64_t v, int64_t rows,
				    struct dg_err *err);
enum dg_status cpu_segment_id_err(const struct dg_shape *ix, int64_t i, int64_t v, int64_t num,
				  struct dg_err *err);

/* One Philox4x32-10 block (Salmon et al. 2011): out = bijection_key(ctr). The
 * counter-based generator behind the random ops (random.c); exposed so tests
 * can check the published known-answer vectors. */
void cpu_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#endif
