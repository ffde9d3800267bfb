/* Gradient functions of the differentiable ops (kernels/cpu/grad.c), named
 * here so each family's op table (eltwise.c, reduce.c, ...) can point its
 * .grad slot at them (the helper ops' table, dg_ops_grad, is in cpu.h). The graph
 * walk that calls them is worker/autodiff.c. Internal to kernels/. */
#ifndef DG_CPU_GRAD_H
#define DG_CPU_GRAD_H

#include "dg/op.h"

/* Each builds d(loss)/d(inputs) of one op through c->add (see dg/op.h).
 * Returns DG_OK, or the error of the failed add / DG_EUNSUPPORTED (a shape
 * the gradient needs is unknown) with c->err set. Not thread-safe per ctx. */
enum dg_status cpu_grad_identity(struct dg_grad_ctx *c);
enum dg_status cpu_grad_neg(struct dg_grad_ctx *c);
enum dg_status cpu_grad_abs(struct dg_grad_ctx *c);
enum dg_status cpu_grad_square(struct dg_grad_ctx *c);
enum dg_status cpu_grad_sqrt(struct dg_grad_ctx *c);
enum dg_status cpu_grad_exp(struct dg_grad_ctx *c);
enum dg_status cpu_grad_log(struct dg_grad_ctx *c);
enum dg_status cpu_grad_relu(struct dg_grad_ctx *c);
enum dg_status cpu_grad_sigmoid(struct dg_grad_ctx *c);
enum dg_status cpu_grad_tanh(struct dg_grad_ctx *c);
enum dg_status cpu_grad_add(struct dg_grad_ctx *c);
enum dg_status cpu_grad_sub(struct dg_grad_ctx *c);
enum dg_status cpu_grad_mul(struct dg_grad_ctx *c);
enum dg_status cpu_grad_div(struct dg_grad_ctx *c);
enum dg_status cpu_grad_pow(struct dg_grad_ctx *c);
enum dg_status cpu_grad_maximum(struct dg_grad_ctx *c);
enum dg_status cpu_grad_minimum(struct dg_grad_ctx *c);
enum dg_status cpu_grad_where(struct dg_grad_ctx *c);
enum dg_status cpu_grad_cast(struct dg_grad_ctx *c);
enum dg_status cpu_grad_sum(struct dg_grad_ctx *c);
enum dg_status cpu_grad_mean(struct dg_grad_ctx *c);
enum dg_status cpu_grad_max(struct dg_grad_ctx *c);     /* also Min */
enum dg_status cpu_grad_softmax(struct dg_grad_ctx *c);
enum dg_status cpu_grad_log_softmax(struct dg_grad_ctx *c);
enum dg_status cpu_grad_xent(struct dg_grad_ctx *c);
enum dg_status cpu_grad_sparse_xent(struct dg_grad_ctx *c);
enum dg_status cpu_grad_matmul(struct dg_grad_ctx *c);
enum dg_status cpu_grad_batch_matmul(struct dg_grad_ctx *c);
enum dg_status cpu_grad_slice(struct dg_grad_ctx *c);
enum dg_status cpu_grad_concat(struct dg_grad_ctx *c);
enum dg_status cpu_grad_split(struct dg_grad_ctx *c);
enum dg_status cpu_grad_reshape_like(struct dg_grad_ctx *c);   /* Reshape, ExpandDims, Squeeze */
enum dg_status cpu_grad_transpose(struct dg_grad_ctx *c);
/* DG_EINVAL when params' shape is unknown: the table size goes into an attr. */
enum dg_status cpu_grad_gather(struct dg_grad_ctx *c);
enum dg_status cpu_grad_unsorted_segment_sum(struct dg_grad_ctx *c);

#endif
