/* Convolution and pooling over NHWC images, as TensorFlow lays them out:
 * Conv2D (filters HWIO), its gradients Conv2DBackpropInput and
 * Conv2DBackpropFilter, MaxPool2D and AvgPool2D with MaxPool2DGrad and
 * AvgPool2DGrad. float32 and float64. Registered via dg_ops_conv. The
 * geometry and its checks (cpu_conv_geometry, cpu.h) are kernels/cuda's too.
 *
 * Why im2col + GEMM, and why this layout: with NHWC input and HWIO filters,
 * one output pixel's receptive field read in (ky, kx, channel) order is a
 * row of K = KH*KW*C values whose order is exactly the filter's flattened
 * [K, OC] rows, and each (ky, kx) contributes C contiguous input values (one
 * memcpy). So the patches of a block of images form a row-major [rows, K]
 * matrix, and the output block [rows, OC] is already NHWC: one sgemm per
 * block, no transposes, and OpenBLAS does the arithmetic at its GEMM speed.
 * The gradients are the same product turned around: d(input) is dout[rows,
 * OC] x W^T scattered back (col2im), d(filter) is the patches^T x dout,
 * accumulated over the blocks. Blocks are whole images, as many as keep the
 * patch matrix under CONV_COL_BYTES, so memory stays bounded for any batch.
 * A 1x1 filter with stride 1, no dilation or padding needs no patches: the
 * input is the matrix. Threads: the GEMM's, when OpenBLAS has them (a
 * training task runs one a process, where threading the batch would only
 * compete with the other tasks for the same cores). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "blas.h"
#include "cpu.h"

/* The patch matrix of one block of images stays under this. */
#define CONV_COL_BYTES ((size_t)16 << 20)

/* A window attr: [k] (both dims), [kh, kw] or TensorFlow's [1, kh, kw, 1]. */
static enum dg_status read_pair(struct dg_attrs a, const char *key, bool required,
				int64_t def, int64_t *y, int64_t *x, struct dg_err *err)
{
	int64_t v[4];
	int n = 0;
	enum dg_status st;

	*y = *x = def;
	if (!dg_attrs_get(a, key)) {
		if (required)
			return dg_err_set(err, DG_EINVAL, "attr '%s' is required: [k], [kh, kw] "
					  "or [1, kh, kw, 1]", key);
		return DG_OK;
	}
	if ((st = dg_attrs_ints(a, key, false, v, 4, &n, err)) != DG_OK)
		return st;
	if (n == 1) {
		*y = *x = v[0];
	} else if (n == 2) {
		*y = v[0];
		*x = v[1];
	} else if (n == 4 && v[0] == 1 && v[3] == 1) {
		*y = v[1];
		*x = v[2];
	} else {
		return dg_err_set(err, DG_EINVAL, "attr '%s' must be [k], [kh, kw] or [1, kh, kw, "
				  "1] (NHWC: no stride over the batch or channels)", key);
	}
	if (*y < 1 || *x < 1 || *y > INT_MAX || *x > INT_MAX)
		return dg_err_set(err, DG_EINVAL, "attr '%s' must be positive, got [%lld, %lld]",
				  key, (long long)*y, (long long)*x);
	return DG_OK;
}

static enum dg_status read_padding(struct dg_attrs a, bool *same, struct dg_err *err)
{
	const char *p;
	enum dg_status st = dg_attrs_string(a, "padding", NULL, &p, err);

	if (st != DG_OK)
		return st;
	if (strcasecmp(p, "SAME") == 0 || strcasecmp(p, "VALID") == 0) {
		*same = strcasecmp(p, "SAME") == 0;
		return DG_OK;
	}
	return dg_err_set(err, DG_EINVAL, "attr 'padding' must be \"SAME\" or \"VALID\", not "
			  "\"%s\"", p);
}

/* One output dim from in, window k (dilated reach r), stride s; -1 when in is.
 * *pad: the padding before. */
static enum dg_status out_dim(int64_t in, int64_t r, int64_t s, bool same, const char *what,
			      int64_t *out, int64_t *pad, struct dg_err *err)
{
	*pad = 0;
	if (in < 0) {
		*out = -1;
		return DG_OK;
	}
	if (same) {
		*out = (in + s - 1) / s;
		int64_t total = (*out - 1) * s + r - in;
		*pad = total > 0 ? total / 2 : 0;
		return DG_OK;
	}
	if (in < r)
		return dg_err_set(err, DG_ESHAPE, "the input's %s (%lld) is smaller than the "
				  "window's reach (%lld) with VALID padding", what, (long long)in,
				  (long long)r);
	*out = (in - r) / s + 1;
	return DG_OK;
}

static enum dg_status float_dtype(enum dg_dtype dt, const char *what, struct dg_err *err)
{
	if (dt == DG_F32 || dt == DG_F64)
		return DG_OK;
	dg_err_set(err, DG_EDTYPE, "%s must be float32 or float64, got %s", what,
		   dg_dtype_name(dt));
	dg_err_hint(err, "Cast it to float32 first");
	return DG_EDTYPE;
}

/* The geometry of a Conv2D (filter f, HWIO) or a pooling (f NULL: window and
 * channels from attrs) over input x, from the attrs; checks everything that
 * inference and kernels (these and kernels/cuda's) must all refuse. */
enum dg_status cpu_conv_geometry(struct dg_attrs a, const struct dg_ttype *x,
				 const struct dg_ttype *f, struct cpu_conv_geom *g,
				 struct dg_err *err)
{
	const struct dg_shape *xs = &x->shape;
	enum dg_status st;
	char sx[96], sf[96];

	memset(g, 0, sizeof *g);
	g->n = g->h = g->w = g->c = g->kh = g->kw = g->oc = -1;
	if ((st = float_dtype(x->dtype, "the input", err)) != DG_OK)
		return st;
	if (xs->ndim != -1 && xs->ndim != 4) {
		dg_shape_format(xs, sx, sizeof sx);
		dg_err_set(err, DG_ESHAPE, "the input must be NHWC images of rank 4, got %s", sx);
		dg_err_hint(err, "Reshape a batch of flat images to [N, H, W, C] first");
		return DG_ESHAPE;
	}
	if (xs->ndim == 4) {
		g->n = xs->dim[0];
		g->h = xs->dim[1];
		g->w = xs->dim[2];
		g->c = xs->dim[3];
	}
	if ((st = read_padding(a, &g->same, err)) != DG_OK ||
	    (st = read_pair(a, "strides", false, 1, &g->sh, &g->sw, err)) != DG_OK)
		return st;
	if (f) {
		const struct dg_shape *fs = &f->shape;
		if ((st = float_dtype(f->dtype, "the filter", err)) != DG_OK)
			return st;
		if (f->dtype != x->dtype)
			return dg_err_set(err, DG_EDTYPE, "the input is %s and the filter %s",
					  dg_dtype_name(x->dtype), dg_dtype_name(f->dtype));
		if (fs->ndim != -1 && fs->ndim != 4) {
			dg_shape_format(fs, sf, sizeof sf);
			return dg_err_set(err, DG_ESHAPE, "the filter must be HWIO of rank 4 "
					  "([height, width, in channels, out channels]), got %s",
					  sf);
		}
		if (fs->ndim == 4) {
			g->kh = fs->dim[0];
			g->kw = fs->dim[1];
			g->oc = fs->dim[3];
			if (g->c >= 0 && fs->dim[2] >= 0 && fs->dim[2] != g->c) {
				dg_shape_format(xs, sx, sizeof sx);
				dg_shape_format(fs, sf, sizeof sf);
				dg_err_set(err, DG_ESHAPE, "the filter %s takes %lld channels, the "
					   "input %s has %lld", sf, (long long)fs->dim[2], sx,
					   (long long)g->c);
				dg_err_hint(err, "filters are HWIO: [height, width, in, out]");
				return DG_ESHAPE;
			}
		}
		if ((st = read_pair(a, "dilations", false, 1, &g->dh, &g->dw, err)) != DG_OK)
			return st;
		if ((g->dh > 1 || g->dw > 1) && (g->sh > 1 || g->sw > 1))
			return dg_err_set(err, DG_EINVAL, "strides > 1 with dilations > 1 is not "
					  "supported (as in TensorFlow)");
	} else {
		if ((st = read_pair(a, "ksize", true, 1, &g->kh, &g->kw, err)) != DG_OK)
			return st;
		g->oc = g->c;
		g->dh = g->dw = 1;
	}
	if (g->kh == 0 || g->kw == 0 || g->oc == 0)
		return dg_err_set(err, DG_ESHAPE, "the filter has an empty dim");
	int64_t rh = g->kh < 0 ? -1 : (g->kh - 1) * g->dh + 1;
	int64_t rw = g->kw < 0 ? -1 : (g->kw - 1) * g->dw + 1;
	if ((st = out_dim(rh < 0 ? -1 : g->h, rh, g->sh, g->same, "height", &g->oh, &g->pt,
			  err)) != DG_OK ||
	    (st = out_dim(rw < 0 ? -1 : g->w, rw, g->sw, g->same, "width", &g->ow, &g->pl,
			  err)) != DG_OK)
		return st;
	return DG_OK;
}

static void out_type(const struct cpu_conv_geom *g, enum dg_dtype dt, struct dg_ttype *out)
{
	out->dtype = dt;
	out->shape.ndim = 4;
	out->shape.dim[0] = g->n;
	out->shape.dim[1] = g->oh;
	out->shape.dim[2] = g->ow;
	out->shape.dim[3] = g->oc;
}

/* A run-time check that t is exactly the forward output's type (a
 * gradient's dout, MaxPool2DGrad's y). */
enum dg_status cpu_conv_check_out(const struct cpu_conv_geom *g, enum dg_dtype dt,
				  const struct dg_ttype *t, const char *what, struct dg_err *err)
{
	struct dg_ttype want;
	char a[96], b[96];

	out_type(g, dt, &want);
	if (dg_shape_eq(&t->shape, &want.shape) && t->dtype == want.dtype)
		return DG_OK;
	dg_shape_format(&t->shape, a, sizeof a);
	dg_shape_format(&want.shape, b, sizeof b);
	return dg_err_set(err, DG_ESHAPE, "%s is %s %s; the forward output is %s %s", what,
			  dg_dtype_name(t->dtype), a, dg_dtype_name(want.dtype), b);
}

/* The same check of tensor t. */
static enum dg_status same_shape(const struct cpu_conv_geom *g, enum dg_dtype dt,
				 const struct dg_tensor *t, const char *what, struct dg_err *err)
{
	struct dg_ttype tt = cpu_ttype(t);

	return cpu_conv_check_out(g, dt, &tt, what, err);
}

/* BLAS takes ints: rows of a block, K and OC must fit. */
static enum dg_status blas_fits(const struct cpu_conv_geom *g, int64_t rows, struct dg_err *err)
{
	if (rows > INT_MAX || g->kh * g->kw * g->c > INT_MAX || g->oc > INT_MAX)
		return dg_err_set(err, DG_ETOOLARGE, "the convolution's matrices exceed the "
				  "BLAS limit of %d rows or columns", INT_MAX);
	return DG_OK;
}

/* ------------------------------------------------------------------ im2col */

/* Images per block: whole images whose patch matrix fits CONV_COL_BYTES (at
 * least one: one image's patches are what they are). per: one image's patch
 * bytes, checked against overflow. */
static int64_t block_images(const struct cpu_conv_geom *g, size_t per)
{
	int64_t b = per ? (int64_t)(CONV_COL_BYTES / per) : g->n;

	return b < 1 ? 1 : b > g->n ? g->n : b;
}

/* One image's patch matrix in bytes (oh*ow rows of kh*kw*c), or false when
 * the product overflows. */
static bool patch_bytes(const struct cpu_conv_geom *g, size_t esize, size_t *out)
{
	int64_t v = 1;
	const int64_t f[5] = { g->oh, g->ow, g->kh, g->kw, g->c };

	for (int i = 0; i < 5; i++)
		if (__builtin_mul_overflow(v, f[i], &v))
			return false;
	return !__builtin_mul_overflow((size_t)v, esize, out);
}

/* No patches needed: a 1x1 window, stride 1, no padding. */
static bool pointwise(const struct cpu_conv_geom *g)
{
	return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->pt == 0 && g->pl == 0;
}

/* The patches of images [i0, i0 + nb) of x into col [nb*oh*ow, K]. Without
 * dilation a patch row's kw positions are adjacent in the image: one copy
 * of kw * c values when they are all inside it. */
static void im2col(const struct cpu_conv_geom *g, const char *x, int64_t i0, int64_t nb,
		   size_t esize, char *col)
{
	size_t run = (size_t)g->c * esize, row = (size_t)g->kw * run;

	for (int64_t b = i0; b < i0 + nb; b++)
		for (int64_t oy = 0; oy < g->oh; oy++)
			for (int64_t ox = 0; ox < g->ow; ox++)
				for (int64_t ky = 0; ky < g->kh; ky++) {
					int64_t iy = oy * g->sh - g->pt + ky * g->dh;
					int64_t ix0 = ox * g->sw - g->pl;
					if (g->dw == 1 && iy >= 0 && iy < g->h && ix0 >= 0 &&
					    ix0 + g->kw <= g->w) {
						memcpy(col, x + (size_t)(((b * g->h + iy) * g->w +
						       ix0) * g->c) * esize, row);
						col += row;
						continue;
					}
					for (int64_t kx = 0; kx < g->kw; kx++, col += run) {
						int64_t ix = ox * g->sw - g->pl + kx * g->dw;
						if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
							memset(col, 0, run);
						else
							memcpy(col, x + (size_t)(((b * g->h + iy) *
							       g->w + ix) * g->c) * esize, run);
					}
				}
}

/* Add the patch gradients dcol [nb*oh*ow, K] back into dx (images i0..). */
#define DEFINE_COL2IM(T, name)                                                               \
	static void name(const struct cpu_conv_geom *g, const T *dcol, int64_t i0,           \
			 int64_t nb, T *dx)                                                  \
	{                                                                                    \
		for (int64_t b = i0; b < i0 + nb; b++)                                       \
			for (int64_t oy = 0; oy < g->oh; oy++)                               \
				for (int64_t ox = 0; ox < g->ow; ox++)                       \
					for (int64_t ky = 0; ky < g->kh; ky++) {             \
						int64_t iy = oy * g->sh - g->pt + ky * g->dh; \
						for (int64_t kx = 0; kx < g->kw;              \
						     kx++, dcol += g->c) {                   \
							int64_t ix = ox * g->sw - g->pl +    \
								     kx * g->dw;             \
							if (iy < 0 || iy >= g->h || ix < 0 || \
							    ix >= g->w)                      \
								continue;                    \
							T *d = dx + ((b * g->h + iy) * g->w + \
								     ix) * g->c;             \
							for (int64_t k = 0; k < g->c; k++)   \
								d[k] += dcol[k];             \
						}                                            \
					}                                                    \
	}
DEFINE_COL2IM(float, col2im_f32)
DEFINE_COL2IM(double, col2im_f64)

/* c[m, n] = op(a) op(b) (+ c when accumulate), row-major; a is [m, k] or,
 * transposed, [k, m]; b is [k, n] or [n, k]. */
static void gemm(const struct dg_blas *bl, enum dg_dtype dt, bool ta, bool tb, int64_t m,
		 int64_t n, int64_t k, const void *a, const void *b, bool accumulate, void *c)
{
	enum CBLAS_TRANSPOSE tra = ta ? CblasTrans : CblasNoTrans;
	enum CBLAS_TRANSPOSE trb = tb ? CblasTrans : CblasNoTrans;
	int im = (int)m, in = (int)n, ik = (int)k;

	if (dt == DG_F32)
		bl->sgemm(CblasRowMajor, tra, trb, im, in, ik, 1.0f, a, ta ? im : ik, b,
			  tb ? ik : in, accumulate ? 1.0f : 0.0f, c, in);
	else
		bl->dgemm(CblasRowMajor, tra, trb, im, in, ik, 1.0, a, ta ? im : ik, b,
			  tb ? ik : in, accumulate ? 1.0 : 0.0, c, in);
}

/* ------------------------------------------------------------------ Conv2D */

static const struct dg_attr_spec conv_attrs[] = {
	{ "padding", DG_ATTR_STRING, true, "\"SAME\" (output ceil(in / stride)) or \"VALID\" "
					   "(no padding)" },
	{ "strides", DG_ATTR_INTS, false, "[s], [sh, sw] or [1, sh, sw, 1] (default 1)" },
	{ "dilations", DG_ATTR_INTS, false, "[d], [dh, dw] or [1, dh, dw, 1] (default 1)" },
	{ 0 },
};

static enum dg_status conv_infer(struct dg_infer_ctx *c)
{
	struct cpu_conv_geom g;
	enum dg_status st = cpu_conv_geometry(dg_attrs_of_json(c->attrs), &c->in[0], &c->in[1],
					      &g, c->err);

	if (st == DG_OK)
		out_type(&g, c->in[0].dtype, &c->out[0]);
	return st;
}

/* The geometry of kernel c's Conv2D-family call from its input x and filter f. */
static enum dg_status run_geometry(const struct dg_kernel_ctx *c, const struct dg_tensor *x,
				   const struct dg_tensor *f, struct cpu_conv_geom *g)
{
	struct dg_ttype tx = cpu_ttype(x), tf;

	if (f)
		tf = cpu_ttype(f);
	return cpu_conv_geometry(c->attrs, &tx, f ? &tf : NULL, g, c->err);
}

/* What a Conv2D-family kernel needs: its BLAS, the block size and a patch
 * buffer (NULL when pointwise). */
struct conv_run {
	const struct dg_blas *bl;
	size_t esize;
	int64_t block, k;
	char *col;
};

static enum dg_status conv_begin(const struct dg_kernel_ctx *c, const struct cpu_conv_geom *g,
				 enum dg_dtype dt, struct conv_run *r)
{
	enum dg_status st;

	memset(r, 0, sizeof *r);
	if (!(r->bl = dg_blas_get(c->err)))
		return c->err ? c->err->code : DG_EUNSUPPORTED;
	r->esize = dg_dtype_size(dt);
	size_t per;
	if (!patch_bytes(g, r->esize, &per))
		return dg_err_set(c->err, DG_ETOOLARGE, "the convolution's patches are too "
				  "large to hold (%lld x %lld outputs, %lld x %lld x %lld window)",
				  (long long)g->oh, (long long)g->ow, (long long)g->kh,
				  (long long)g->kw, (long long)g->c);
	r->k = g->kh * g->kw * g->c;
	r->block = block_images(g, per);
	if ((st = blas_fits(g, r->block * g->oh * g->ow, c->err)) != DG_OK)
		return st;
	if (pointwise(g))
		return DG_OK;
	if (!(r->col = malloc((size_t)r->block * per)))
		return dg_err_set(c->err, DG_ENOMEM, "out of memory for the patches of %lld "
				  "images", (long long)r->block);
	return DG_OK;
}

/* The patch matrix of images [i0, i0 + nb): r->col, or x itself when pointwise. */
static const char *patches(const struct cpu_conv_geom *g, struct conv_run *r,
			   const struct dg_tensor *x, int64_t i0, int64_t nb)
{
	if (!r->col)
		return (const char *)x->data + (size_t)(i0 * g->h * g->w * g->c) * r->esize;
	im2col(g, x->data, i0, nb, r->esize, r->col);
	return r->col;
}

static bool empty(const struct cpu_conv_geom *g)
{
	return g->n == 0 || g->oh == 0 || g->ow == 0 || g->oc == 0 || g->c == 0;
}

static enum dg_status conv_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0], *f = c->in[1];
	struct cpu_conv_geom g;
	struct dg_ttype ot;
	struct conv_run r;
	struct dg_tensor *y;
	enum dg_status st = run_geometry(c, x, f, &g);

	if (st != DG_OK)
		return st;
	out_type(&g, x->dtype, &ot);
	if (!(y = (empty(&g) ? cpu_out_zero : cpu_out)(c, 0, x->dtype, &ot.shape)))
		return c->err ? c->err->code : DG_ENOMEM;
	if (empty(&g))
		return DG_OK;
	if ((st = conv_begin(c, &g, x->dtype, &r)) != DG_OK)
		return st;
	for (int64_t i0 = 0; i0 < g.n; i0 += r.block) {
		int64_t nb = g.n - i0 < r.block ? g.n - i0 : r.block, rows = nb * g.oh * g.ow;
		gemm(r.bl, x->dtype, false, false, rows, g.oc, r.k, patches(&g, &r, x, i0, nb),
		     f->data, false, (char *)y->data + (size_t)(i0 * g.oh * g.ow * g.oc) * r.esize);
	}
	free(r.col);
	return DG_OK;
}

/* The gradients' inference: Conv2DBackpropInput outputs the input's type,
 * Conv2DBackpropFilter the filter's (input `like`). */
static enum dg_status conv_grad_infer(struct dg_infer_ctx *c, int like)
{
	struct cpu_conv_geom g;
	enum dg_status st = cpu_conv_geometry(dg_attrs_of_json(c->attrs), &c->in[0], &c->in[1],
					      &g, c->err);

	if (st == DG_OK)
		c->out[0] = c->in[like];
	return st;
}

static enum dg_status conv_dinput_infer(struct dg_infer_ctx *c) { return conv_grad_infer(c, 0); }
static enum dg_status conv_dfilter_infer(struct dg_infer_ctx *c) { return conv_grad_infer(c, 1); }

/* What both gradient kernels of (x, filter, dy) do first: the geometry, dy
 * checked against the forward's output, the zeroed output shaped like input
 * `like`, and (unless the convolution is empty: *done) the BLAS and patch
 * buffer in r. */
static enum dg_status conv_grad_begin(struct dg_kernel_ctx *c, int like, struct cpu_conv_geom *g,
				      struct conv_run *r, struct dg_tensor **out, bool *done)
{
	const struct dg_tensor *x = c->in[0], *f = c->in[1], *dy = c->in[2];
	enum dg_status st = run_geometry(c, x, f, g);

	*done = true;
	if (st != DG_OK)
		return st;
	if ((st = same_shape(g, x->dtype, dy, "the output gradient", c->err)) != DG_OK)
		return st;
	if (!(*out = cpu_out_zero(c, 0, x->dtype, &c->in[like]->shape)))
		return c->err ? c->err->code : DG_ENOMEM;
	if (empty(g))
		return DG_OK;
	*done = false;
	return conv_begin(c, g, x->dtype, r);
}

/* Conv2DBackpropInput(x, filter, dy): d(loss)/d(x) = dy W^T scattered back. */
static enum dg_status conv_dinput_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0], *f = c->in[1], *dy = c->in[2];
	struct cpu_conv_geom g;
	struct conv_run r;
	struct dg_tensor *dx;
	bool done;
	enum dg_status st = conv_grad_begin(c, 0, &g, &r, &dx, &done);

	if (st != DG_OK || done)
		return st;
	/* The patch buffer holds the patch gradients here (none when pointwise:
	 * the product lands in dx directly). */
	char *dcol = r.col;
	for (int64_t i0 = 0; i0 < g.n; i0 += r.block) {
		int64_t nb = g.n - i0 < r.block ? g.n - i0 : r.block, rows = nb * g.oh * g.ow;
		const char *d = (const char *)dy->data + (size_t)(i0 * g.oh * g.ow * g.oc) * r.esize;
		char *to = dcol ? dcol : (char *)dx->data + (size_t)(i0 * g.h * g.w * g.c) * r.esize;
		gemm(r.bl, x->dtype, false, true, rows, r.k, g.oc, d, f->data, false, to);
		if (!dcol)
			continue;
		if (x->dtype == DG_F32)
			col2im_f32(&g, (const float *)dcol, i0, nb, dx->data);
		else
			col2im_f64(&g, (const double *)dcol, i0, nb, dx->data);
	}
	free(r.col);
	return DG_OK;
}

/* Conv2DBackpropFilter(x, filter, dy): d(loss)/d(filter) = patches^T dy,
 * accumulated over the blocks. */
static enum dg_status conv_dfilter_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0], *dy = c->in[2];
	struct cpu_conv_geom g;
	struct conv_run r;
	struct dg_tensor *df;
	bool done;
	enum dg_status st = conv_grad_begin(c, 1, &g, &r, &df, &done);

	if (st != DG_OK || done)
		return st;
	for (int64_t i0 = 0; i0 < g.n; i0 += r.block) {
		int64_t nb = g.n - i0 < r.block ? g.n - i0 : r.block, rows = nb * g.oh * g.ow;
		const char *d = (const char *)dy->data + (size_t)(i0 * g.oh * g.ow * g.oc) * r.esize;
		gemm(r.bl, x->dtype, true, false, r.k, g.oc, rows, patches(&g, &r, x, i0, nb), d,
		     i0 > 0, df->data);
	}
	free(r.col);
	return DG_OK;
}

/* ------------------------------------------------------------------ pooling */

static const struct dg_attr_spec pool_attrs[] = {
	{ "ksize", DG_ATTR_INTS, true, "the window: [k], [kh, kw] or [1, kh, kw, 1]" },
	{ "padding", DG_ATTR_STRING, true, "\"SAME\" or \"VALID\"; padded positions never "
					   "count (not in a max, not in an average's divisor)" },
	{ "strides", DG_ATTR_INTS, false, "[s], [sh, sw] or [1, sh, sw, 1] (default 1)" },
	{ 0 },
};

static enum dg_status pool_infer(struct dg_infer_ctx *c)
{
	struct cpu_conv_geom g;
	enum dg_status st = cpu_conv_geometry(dg_attrs_of_json(c->attrs), &c->in[0], NULL, &g,
					      c->err);

	if (st == DG_OK)
		out_type(&g, c->in[0].dtype, &c->out[0]);
	return st;
}

/* The gradient ops take (x, [y,] dy) and output x's type. */
static enum dg_status pool_grad_infer(struct dg_infer_ctx *c)
{
	struct cpu_conv_geom g;
	enum dg_status st = cpu_conv_geometry(dg_attrs_of_json(c->attrs), &c->in[0], NULL, &g,
					      c->err);

	if (st == DG_OK)
		c->out[0] = c->in[0];
	return st;
}

/* The window of output (oy, ox): rows [y0, y1) and columns [x0, x1) of the
 * input, clipped to it (padding excluded). */
static void window(const struct cpu_conv_geom *g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1,
		   int64_t *x0, int64_t *x1)
{
	*y0 = oy * g->sh - g->pt;
	*x0 = ox * g->sw - g->pl;
	*y1 = *y0 + g->kh < g->h ? *y0 + g->kh : g->h;
	*x1 = *x0 + g->kw < g->w ? *x0 + g->kw : g->w;
	*y0 = *y0 < 0 ? 0 : *y0;
	*x0 = *x0 < 0 ? 0 : *x0;
}

/* Each pooled output: its window's max or mean per channel (a SAME window
 * always holds at least one input position). For max, NaN wins. */
#define DEFINE_POOL(T, name)                                                                 \
	static void name(const struct cpu_conv_geom *g, const T *x, bool max, T *y)          \
	{                                                                                    \
		for (int64_t b = 0; b < g->n; b++)                                           \
			for (int64_t oy = 0; oy < g->oh; oy++)                               \
				for (int64_t ox = 0; ox < g->ow; ox++, y += g->c) {          \
					int64_t y0, y1, x0, x1;                              \
					window(g, oy, ox, &y0, &y1, &x0, &x1);               \
					const T *p = x + ((b * g->h + y0) * g->w + x0) * g->c; \
					memcpy(y, p, (size_t)g->c * sizeof(T));              \
					for (int64_t iy = y0; iy < y1; iy++)                 \
						for (int64_t ix = x0; ix < x1; ix++) {       \
							if (iy == y0 && ix == x0)            \
								continue;                    \
							p = x + ((b * g->h + iy) * g->w +    \
								 ix) * g->c;                 \
							for (int64_t k = 0; k < g->c; k++)   \
								y[k] = !max ? y[k] + p[k] :  \
								       p[k] > y[k] ||        \
								       isnan(p[k]) ? p[k] :  \
								       y[k];                 \
						}                                            \
					if (!max) {                                          \
						T n = (T)((y1 - y0) * (x1 - x0));            \
						for (int64_t k = 0; k < g->c; k++)           \
							y[k] /= n;                           \
					}                                                    \
				}                                                            \
	}
DEFINE_POOL(float, pool_f32)
DEFINE_POOL(double, pool_f64)

/* The gradient: each output's dy goes to its window's first maximum (max,
 * as TensorFlow), or evenly to its window's input positions (mean). The
 * window is walked with the channels innermost (contiguous, as in the
 * forward), in loops over restrict pointers without branches that the
 * compiler vectorises: for max, dy goes to the first position equal to the
 * forward's output y (taken[k] counts the hits; a position that is not it
 * gets 0, even for an infinite or NaN dy). A window whose maximum is NaN or
 * infinite (y - y tells them apart from finite values cheaply) takes the
 * scalar path, where NaN wins as in the forward. */
#define DEFINE_POOL_GRAD(T, name)                                                            \
	static T name##_odd(const T *restrict p, int64_t c)                                  \
	{                                                                                    \
		T odd = 0;                                                                   \
		for (int64_t k = 0; k < c; k++)                                              \
			odd += p[k] - p[k];                                                  \
		return odd;                                                                  \
	}                                                                                    \
	static void name##_hit(T *restrict d, T *restrict taken, const T *restrict p,        \
			       const T *restrict best, const T *restrict dy, int64_t c,      \
			       bool set)                                                     \
	{                                                                                    \
		for (int64_t k = 0; k < c; k++) {                                            \
			T hit = (T)((p[k] == best[k]) & (taken[k] == 0));                   \
			d[k] = (set ? 0 : d[k]) + (hit != 0 ? dy[k] : 0);                   \
			taken[k] += hit;                                                     \
		}                                                                            \
	}                                                                                    \
	static void name##_mean(T *restrict d, const T *restrict dy, T inv, int64_t c,       \
				bool set)                                                    \
	{                                                                                    \
		for (int64_t k = 0; k < c; k++)                                              \
			d[k] = (set ? 0 : d[k]) + dy[k] * inv;                               \
	}                                                                                    \
	/* The scalar path of one window (max with NaN or infinity in it). */               \
	static void name##_slow(const struct cpu_conv_geom *g, const T *x, const T *dy,      \
				T *dx, int64_t b, int64_t y0, int64_t y1, int64_t x0,        \
				int64_t x1, bool set)                                        \
	{                                                                                    \
		for (int64_t iy = y0; set && iy < y1; iy++)                                  \
			memset(dx + ((b * g->h + iy) * g->w + x0) * g->c, 0,                 \
			       (size_t)((x1 - x0) * g->c) * sizeof(T));                      \
		for (int64_t k = 0; k < g->c; k++) {                                         \
			int64_t at = -1;                                                     \
			T best = 0;                                                          \
			for (int64_t iy = y0; iy < y1; iy++)                                 \
				for (int64_t ix = x0; ix < x1; ix++) {                       \
					int64_t i = ((b * g->h + iy) * g->w + ix) * g->c + k; \
					if (at < 0 || x[i] > best || (isnan(x[i]) && !isnan(best))) { \
						at = i;                                      \
						best = x[i];                                 \
					}                                                    \
				}                                                            \
			dx[at] += dy[k];                                                     \
		}                                                                            \
	}                                                                                    \
	static void name(const struct cpu_conv_geom *g, const T *x, const T *y, const T *dy, \
			 bool max, T *dx, T *taken, bool set)                                \
	{                                                                                    \
		for (int64_t b = 0; b < g->n; b++)                                           \
			for (int64_t oy = 0; oy < g->oh; oy++)                               \
				for (int64_t ox = 0; ox < g->ow; ox++, dy += g->c) {         \
					int64_t y0, y1, x0, x1;                              \
					T odd = 0;                                           \
					window(g, oy, ox, &y0, &y1, &x0, &x1);               \
					T inv = (T)1 / (T)((y1 - y0) * (x1 - x0));           \
					const T *bp = NULL;                                  \
					if (max) {                                           \
						bp = y + ((b * g->oh + oy) * g->ow + ox) * g->c; \
						odd = name##_odd(bp, g->c);                  \
						memset(taken, 0, (size_t)g->c * sizeof(T));  \
						if (odd != 0 || odd != odd) {                \
							name##_slow(g, x, dy, dx, b, y0, y1, \
								    x0, x1, set);            \
							continue;                            \
						}                                            \
					}                                                    \
					for (int64_t iy = y0; iy < y1; iy++)                 \
						for (int64_t ix = x0; ix < x1; ix++) {       \
							int64_t i = ((b * g->h + iy) * g->w + \
								     ix) * g->c;             \
							if (max)                             \
								name##_hit(dx + i, taken, x + i, \
									   bp, dy, g->c, set); \
							else                                 \
								name##_mean(dx + i, dy, inv, \
									    g->c, set);      \
						}                                            \
				}                                                            \
	}
DEFINE_POOL_GRAD(float, pool_grad_f32)
DEFINE_POOL_GRAD(double, pool_grad_f64)

static enum dg_status pool_run(struct dg_kernel_ctx *c, bool max)
{
	const struct dg_tensor *x = c->in[0];
	struct cpu_conv_geom g;
	struct dg_ttype ot;
	struct dg_tensor *y;
	enum dg_status st = run_geometry(c, x, NULL, &g);

	if (st != DG_OK)
		return st;
	out_type(&g, x->dtype, &ot);
	if (!(y = cpu_out(c, 0, x->dtype, &ot.shape)))
		return c->err ? c->err->code : DG_ENOMEM;
	if (x->dtype == DG_F32)
		pool_f32(&g, x->data, max, y->data);
	else
		pool_f64(&g, x->data, max, y->data);
	return DG_OK;
}

static enum dg_status max_pool_cpu(struct dg_kernel_ctx *c) { return pool_run(c, true); }
static enum dg_status avg_pool_cpu(struct dg_kernel_ctx *c) { return pool_run(c, false); }

/* MaxPool2DGrad(x, y, dy) with the forward's output y (its maxima: not
 * searched again), AvgPool2DGrad(x, dy). */
static enum dg_status pool_grad_run(struct dg_kernel_ctx *c, bool max)
{
	const struct dg_tensor *x = c->in[0], *y = max ? c->in[1] : NULL;
	const struct dg_tensor *dy = c->in[max ? 2 : 1];
	struct cpu_conv_geom g;
	struct dg_tensor *dx;
	enum dg_status st = run_geometry(c, x, NULL, &g);

	if (st != DG_OK)
		return st;
	if ((st = same_shape(&g, x->dtype, dy, "the output gradient", c->err)) != DG_OK ||
	    (y && (st = same_shape(&g, x->dtype, y, "the forward output", c->err)) != DG_OK))
		return st;
	/* Windows that tile the input exactly (each position in one window, the
	 * usual 2x2 stride 2) write dx once: no zeroing, no read-modify-write. */
	bool set = g.pt == 0 && g.pl == 0 && g.sh == g.kh && g.sw == g.kw &&
		   g.oh * g.sh == g.h && g.ow * g.sw == g.w;
	if (!(dx = (set ? cpu_out : cpu_out_zero)(c, 0, x->dtype, &x->shape)))
		return c->err ? c->err->code : DG_ENOMEM;
	/* Per channel: whether the window's maximum was given its dy. */
	double *taken = malloc((size_t)(g.c > 0 ? g.c : 1) * sizeof *taken);
	if (!taken)
		return dg_err_set(c->err, DG_ENOMEM, "out of memory");
	if (x->dtype == DG_F32)
		pool_grad_f32(&g, x->data, y ? y->data : NULL, dy->data, max, dx->data,
			      (float *)taken, set);
	else
		pool_grad_f64(&g, x->data, y ? y->data : NULL, dy->data, max, dx->data, taken,
			      set);
	free(taken);
	return DG_OK;
}

static enum dg_status max_pool_grad_cpu(struct dg_kernel_ctx *c) { return pool_grad_run(c, true); }
static enum dg_status avg_pool_grad_cpu(struct dg_kernel_ctx *c) { return pool_grad_run(c, false); }

/* --------------------------------------------------------------- gradients */

/* Node op(ins) with a copy of the forward node's attrs. */
static const char *add_like(struct dg_grad_ctx *c, const char *op, const char *const *in, int n)
{
	json_t *a = json_deep_copy(c->attrs);

	if (!a) {
		dg_err_set(c->err, DG_ENOMEM, "out of memory");
		return NULL;
	}
	return c->add(c, op, in, n, a);
}

static enum dg_status grad_failed(const struct dg_grad_ctx *c)
{
	return c->err && c->err->code != DG_OK ? c->err->code : DG_EINTERNAL;
}

static enum dg_status conv_grad(struct dg_grad_ctx *c)
{
	const char *in[3] = { c->in[0], c->in[1], c->dout[0] };

	if (c->need[0] && !(c->din[0] = add_like(c, "Conv2DBackpropInput", in, 3)))
		return grad_failed(c);
	if (c->need[1] && !(c->din[1] = add_like(c, "Conv2DBackpropFilter", in, 3)))
		return grad_failed(c);
	return DG_OK;
}

static enum dg_status max_pool_grad(struct dg_grad_ctx *c)
{
	const char *in[3] = { c->in[0], c->out[0], c->dout[0] };

	if (c->need[0] && !(c->din[0] = add_like(c, "MaxPool2DGrad", in, 3)))
		return grad_failed(c);
	return DG_OK;
}

static enum dg_status avg_pool_grad(struct dg_grad_ctx *c)
{
	const char *in[2] = { c->in[0], c->dout[0] };

	if (c->need[0] && !(c->din[0] = add_like(c, "AvgPool2DGrad", in, 2)))
		return grad_failed(c);
	return DG_OK;
}

struct dg_op_def dg_ops_conv[] = {
	{ .name = "Conv2D", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = conv_attrs, .infer = conv_infer, .cpu = conv_cpu, .grad = conv_grad,
	  .doc = "2-D convolution of NHWC images [N,H,W,C] with HWIO filters [KH,KW,C,OC]: "
		 "[N,OH,OW,OC]" },
	{ .name = "Conv2DBackpropInput", .min_inputs = 3, .max_inputs = 3, .n_outputs = 1,
	  .attrs = conv_attrs, .infer = conv_dinput_infer, .cpu = conv_dinput_cpu,
	  .doc = "Conv2D's gradient for its input: (input, filter, output gradient), the "
		 "input giving the shape" },
	{ .name = "Conv2DBackpropFilter", .min_inputs = 3, .max_inputs = 3, .n_outputs = 1,
	  .attrs = conv_attrs, .infer = conv_dfilter_infer, .cpu = conv_dfilter_cpu,
	  .doc = "Conv2D's gradient for its filter: (input, filter, output gradient), the "
		 "filter giving the shape" },
	{ .name = "MaxPool2D", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = pool_attrs, .infer = pool_infer, .cpu = max_pool_cpu, .grad = max_pool_grad,
	  .doc = "the maximum of each window of NHWC images, per channel" },
	{ .name = "AvgPool2D", .min_inputs = 1, .max_inputs = 1, .n_outputs = 1,
	  .attrs = pool_attrs, .infer = pool_infer, .cpu = avg_pool_cpu, .grad = avg_pool_grad,
	  .doc = "the mean of each window of NHWC images, per channel (padding not counted)" },
	{ .name = "MaxPool2DGrad", .min_inputs = 3, .max_inputs = 3, .n_outputs = 1,
	  .attrs = pool_attrs, .infer = pool_grad_infer, .cpu = max_pool_grad_cpu,
	  .doc = "MaxPool2D's gradient: (input, output, output gradient), as TensorFlow's "
		 "MaxPoolGrad; each window's gradient to its first maximum" },
	{ .name = "AvgPool2DGrad", .min_inputs = 2, .max_inputs = 2, .n_outputs = 1,
	  .attrs = pool_attrs, .infer = pool_grad_infer, .cpu = avg_pool_grad_cpu,
	  .doc = "AvgPool2D's gradient: (input, output gradient), spread evenly over each "
		 "window" },
	{ 0 },
};
