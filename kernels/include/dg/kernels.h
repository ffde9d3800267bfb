/* The op registry: every op a graph can name, each with its schema,
 * inference, CPU kernel, optional CUDA kernel and gradient slot (struct
 * dg_op_def in dg/op.h) and the layer that runs it; plus the BLAS set-up that
 * picks OpenBLAS's fast kernels for this CPU. kernels/ registers its own ops;
 * the worker and the master add theirs with dg_op_register at start-up. */
#ifndef DG_KERNELS_H
#define DG_KERNELS_H

#include "dg/op.h"

/* Find a kernel op (layer DG_OPL_KERNEL) by name (case-sensitive, TensorFlow
 * spelling); NULL if unknown. Usable as a dg_op_lookup_fn: the ops that run
 * anywhere, e.g. in `dg eval`. Thread-safe. */
const struct dg_op_def *dg_op_find(const char *name);
/* Find an op of one of the layers in mask (DG_OPL_* bits); NULL when unknown
 * or of another layer. Thread-safe. */
const struct dg_op_def *dg_op_find_in(const char *name, unsigned layers);
/* Add op of layer DG_OPL_WORKER or DG_OPL_MASTER (or both: the queue ops,
 * which a submitted graph names and the executor runs) to the registry (op is
 * borrowed and must outlive every lookup: a static table). Registering the
 * same op again does nothing; DG_EEXIST when another op has its name,
 * DG_ETOOLARGE when the index is full. Call at start-up (e.g. under
 * pthread_once, before the layer's first lookup). Thread-safe. */
enum dg_status dg_op_register(unsigned layer, const struct dg_op_def *op,
			      struct dg_err *err);
/* Iterate the registry: index 0..dg_op_count()-1, every op registered so far,
 * sorted by name. Thread-safe (indices shift when a layer registers ops). */
int dg_op_count(void);
const struct dg_op_def *dg_op_at(int i);
/* The layer op was registered with; 0 when it is not in the registry. */
unsigned dg_op_layer_of(const struct dg_op_def *op);

/* Run one op on host tensors outside any graph (tests, benchmarks, the
 * executor). attrs may be NULL (no attrs). Validates attrs and arity, then
 * calls the CPU kernel (DG_EUNSUPPORTED for worker and master ops, which have
 * none); outputs are owned by the caller. Errors are prefixed with the op's
 * name. */
enum dg_status dg_op_run(const struct dg_op_def *op, const json_t *attrs,
			 const struct dg_tensor *const *in, int n_in, struct dg_tensor **out,
			 int n_out, uint64_t step, struct dg_err *err);

/* Load OpenBLAS (once, thread-safe; later calls return the first result). When
 * OPENBLAS_CORETYPE is unset and CPUID shows AVX-512 (or AVX2+FMA) with OS
 * support, dg sets it to SkylakeX (or Haswell) before OpenBLAS initialises: the
 * OpenBLAS of Debian 12 does not recognise newer CPUs and would fall back to
 * slow SSE3 kernels. A value the user set is always respected. Logs the choice
 * once at info level. Call early, before other threads start (it may setenv). */
enum dg_status dg_blas_init(struct dg_err *err);
/* One line describing the BLAS in use, e.g. "OpenBLAS 0.3.21 core SKYLAKEX
 * (OPENBLAS_CORETYPE=SkylakeX set by dg: CPU has AVX-512)". Loads BLAS. */
const char *dg_blas_describe(void);
/* Set the number of BLAS threads (0: OpenBLAS's default). */
void dg_blas_set_threads(int n);

/* The Glorot/Xavier uniform limit sqrt(6 / (fan_in + fan_out)) of a weight
 * shape, the fans taken as TensorFlow takes them (a vector is its own fan in
 * and out; [.., in, out] multiplies both by the leading dims). One rule for
 * the GlorotUniform op (CPU and CUDA) and VarInit's "glorot" (worker). */
double dg_glorot_limit_shape(const struct dg_shape *s);

#endif
