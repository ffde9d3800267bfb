/* Helpers shared by the CPU kernel families. */
#include "cpu.h"

struct dg_tensor *cpu_out(struct dg_kernel_ctx *c, int i, enum dg_dtype dt,
			  const struct dg_shape *shape)
{
	c->out[i] = dg_tensor_new_uninit(dt, shape, c->err);
	return c->out[i];
}

struct dg_tensor *cpu_out_zero(struct dg_kernel_ctx *c, int i, enum dg_dtype dt,
			       const struct dg_shape *shape)
{
	c->out[i] = dg_tensor_new(dt, shape, c->err);
	return c->out[i];
}

enum dg_status cpu_axis(int64_t axis, int ndim, int *out, struct dg_err *err)
{
	int64_t a = axis < 0 ? axis + ndim : axis;

	if (a < 0 || a >= ndim || ndim == 0) {
		return dg_err_set(err, DG_EINVAL, "axis %lld is out of range for rank %d",
				  (long long)axis, ndim);
	}
	*out = (int)a;
	return DG_OK;
}
