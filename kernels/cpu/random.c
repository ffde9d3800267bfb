/* Placeholder table until this family's kernels land (being written now). */
#include "cpu.h"

const struct dg_op_def dg_ops_random[] = { { 0 } };
