/* The BLAS entry points dg uses, resolved from OpenBLAS at run time (see
 * blas.c for why dg loads it itself). Only kernels/cpu and bench/ use these. */
#ifndef DG_CPU_BLAS_H
#define DG_CPU_BLAS_H

#include <cblas.h>
#include <stdbool.h>

#include "dg/status.h"

struct dg_blas {
	void (*sgemm)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE,
		      const enum CBLAS_TRANSPOSE, const blasint, const blasint, const blasint,
		      const float, const float *, const blasint, const float *, const blasint,
		      const float, float *, const blasint);
	void (*dgemm)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE,
		      const enum CBLAS_TRANSPOSE, const blasint, const blasint, const blasint,
		      const double, const double *, const blasint, const double *, const blasint,
		      const double, double *, const blasint);
	void (*set_num_threads)(int);
	int (*get_num_threads)(void);
	char *(*get_corename)(void);
	char *(*get_config)(void);
};

/* The loaded BLAS, or NULL with *err set (OpenBLAS missing or lacking a
 * symbol). Thread-safe; loads once. */
const struct dg_blas *dg_blas_get(struct dg_err *err);

/* How capable an OpenBLAS core (openblas_get_corename) is: 3 = AVX-512
 * kernels, 2 = AVX2, 1 = older or unknown. dg reloads OpenBLAS with a named
 * core when this is below what CPUID allows. */
int dg_blas_core_level(const char *core);

/* The OPENBLAS_CORETYPE values this CPU can run that dg considers (x86:
 * SkylakeX with AVX-512, Cooperlake with its BF16 too, Haswell with AVX2 and
 * FMA, Zen on AMD CPUs with AVX2), at most max into out; *measure says whether
 * CPUID alone is not conclusive here (not an Intel CPU), so that dg times them. */
int dg_blas_core_candidates(const char **out, int max, bool *measure);

#endif
