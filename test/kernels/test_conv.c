/* Criterion suite "conv": Conv2D and the 2-D poolings (kernels/cpu/conv.c):
 * the forward pass against a direct loop over the definition (float32 and
 * float64, every padding, stride and dilation, blocks of images larger than
 * the patch buffer), shape inference with unknown dims, and the errors for
 * bad ranks, channels, dtypes, attrs and windows. The gradients are checked
 * by finite differences in test_grad.c and against PyTorch in
 * test/integration/conv_torch.py. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dg/exec.h"
#include "dg/kernels.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

static struct dg_tensor *rand_tensor(enum dg_dtype dt, int64_t a, int64_t b, int64_t c,
				     int64_t d)
{
	int64_t dim[4] = { a, b, c, d };
	struct dg_shape s = dg_shape_make(4, dim);
	struct dg_tensor *t = dg_tensor_new(dt, &s, NULL);

	cr_assert_not_null(t);
	for (int64_t i = 0; i < t->numel; i++)
		dg_tensor_set_f64(t, i, urand());
	return t;
}

static enum dg_status run(const char *op, const char *attrs, const struct dg_tensor **in, int n,
			  struct dg_tensor **out, struct dg_err *err)
{
	json_t *j = json_loads(attrs, 0, NULL);
	enum dg_status st;

	cr_assert_not_null(j, "bad JSON in test: %s", attrs);
	st = dg_op_run(dg_op_find(op), j, in, n, out, 1, 0, err);
	json_decref(j);
	return st;
}

/* TensorFlow's padding before, for one dim. */
static int64_t pad_before(int64_t in, int64_t k, int64_t s, int64_t d, bool same, int64_t *out)
{
	int64_t r = (k - 1) * d + 1;

	if (!same) {
		*out = (in - r) / s + 1;
		return 0;
	}
	*out = (in + s - 1) / s;
	int64_t total = (*out - 1) * s + r - in;
	return total > 0 ? total / 2 : 0;
}

/* y[b,oy,ox,o] = sum over ky,kx,c of x[b, oy*s - p + ky*d, ...] f[ky,kx,c,o]. */
static void check_conv(enum dg_dtype dt, int64_t n, int64_t h, int64_t w, int64_t c,
		       int64_t kh, int64_t kw, int64_t oc, int64_t s, int64_t d, bool same)
{
	struct dg_tensor *x = rand_tensor(dt, n, h, w, c), *f = rand_tensor(dt, kh, kw, c, oc);
	const struct dg_tensor *in[2] = { x, f };
	struct dg_tensor *y = NULL;
	struct dg_err err = { 0 };
	char attrs[160];
	int64_t oh, ow, pt = pad_before(h, kh, s, d, same, &oh), pl = pad_before(w, kw, s, d, same,
										   &ow);

	snprintf(attrs, sizeof attrs, "{\"padding\": \"%s\", \"strides\": [%lld], "
		 "\"dilations\": [%lld]}", same ? "SAME" : "VALID", (long long)s, (long long)d);
	cr_assert_eq(run("Conv2D", attrs, in, 2, &y, &err), DG_OK, "%s: %s", attrs, err.msg);
	cr_assert_eq(y->shape.ndim, 4);
	cr_assert(y->shape.dim[0] == n && y->shape.dim[1] == oh && y->shape.dim[2] == ow &&
		  y->shape.dim[3] == oc, "%s: output [%lld,%lld,%lld,%lld]", attrs,
		  (long long)y->shape.dim[0], (long long)y->shape.dim[1],
		  (long long)y->shape.dim[2], (long long)y->shape.dim[3]);
	for (int64_t b = 0; b < n; b++)
		for (int64_t oy = 0; oy < oh; oy++)
			for (int64_t ox = 0; ox < ow; ox++)
				for (int64_t o = 0; o < oc; o++) {
					double sum = 0;
					for (int64_t ky = 0; ky < kh; ky++)
						for (int64_t kx = 0; kx < kw; kx++)
							for (int64_t k = 0; k < c; k++) {
								int64_t iy = oy * s - pt + ky * d;
								int64_t ix = ox * s - pl + kx * d;
								if (iy < 0 || iy >= h || ix < 0 ||
								    ix >= w)
									continue;
								sum += dg_tensor_get_f64(x,
									((b * h + iy) * w + ix) * c + k) *
									dg_tensor_get_f64(f,
									((ky * kw + kx) * c + k) * oc + o);
							}
					double got = dg_tensor_get_f64(y, ((b * oh + oy) * ow + ox) *
									  oc + o);
					cr_assert(fabs(got - sum) <= (dt == DG_F32 ? 1e-4 : 1e-12) *
						  (1 + fabs(sum)), "%s [%lld,%lld,%lld,%lld]: %g, "
						  "want %g", attrs, (long long)b, (long long)oy,
						  (long long)ox, (long long)o, got, sum);
				}
	dg_tensor_free(x);
	dg_tensor_free(f);
	dg_tensor_free(y);
}

Test(conv, conv2d_matches_the_definition_for_every_padding_stride_and_dilation)
{
	for (int same = 0; same < 2; same++) {
		check_conv(DG_F64, 2, 7, 6, 3, 3, 3, 4, 1, 1, same);
		check_conv(DG_F64, 2, 7, 6, 3, 3, 2, 4, 2, 1, same);
		check_conv(DG_F64, 1, 9, 9, 2, 3, 3, 2, 1, 2, same);
		check_conv(DG_F32, 3, 6, 6, 5, 1, 1, 3, 1, 1, same);
		check_conv(DG_F32, 2, 8, 8, 1, 5, 5, 6, 3, 1, same);
	}
}

Test(conv, a_batch_larger_than_the_patch_buffer_runs_in_blocks)
{
	/* 100 images of 32x32x8 with a 5x5 filter: 100 x 1024 x 200 x 4 bytes of
	 * patches = 80 MB, five blocks of the 16 MiB buffer. */
	check_conv(DG_F32, 100, 32, 32, 8, 5, 5, 2, 1, 1, true);
}

static void check_pool(const char *op, int64_t k, int64_t s, bool same)
{
	struct dg_tensor *x = rand_tensor(DG_F64, 2, 7, 6, 3);
	const struct dg_tensor *in[1] = { x };
	struct dg_tensor *y = NULL;
	struct dg_err err = { 0 };
	char attrs[160];
	bool max = strcmp(op, "MaxPool2D") == 0;
	int64_t oh, ow, pt = pad_before(7, k, s, 1, same, &oh), pl = pad_before(6, k, s, 1, same,
										  &ow);

	snprintf(attrs, sizeof attrs, "{\"ksize\": [%lld], \"strides\": [%lld], \"padding\": "
		 "\"%s\"}", (long long)k, (long long)s, same ? "SAME" : "VALID");
	cr_assert_eq(run(op, attrs, in, 1, &y, &err), DG_OK, "%s %s: %s", op, attrs, err.msg);
	cr_assert(y->shape.dim[1] == oh && y->shape.dim[2] == ow);
	for (int64_t b = 0; b < 2; b++)
		for (int64_t oy = 0; oy < oh; oy++)
			for (int64_t ox = 0; ox < ow; ox++)
				for (int64_t c = 0; c < 3; c++) {
					double acc = max ? -INFINITY : 0;
					int cnt = 0;
					for (int64_t iy = oy * s - pt; iy < oy * s - pt + k; iy++)
						for (int64_t ix = ox * s - pl; ix < ox * s - pl + k;
						     ix++) {
							if (iy < 0 || iy >= 7 || ix < 0 || ix >= 6)
								continue;
							double v = dg_tensor_get_f64(x, ((b * 7 + iy) *
										 6 + ix) * 3 + c);
							acc = max ? fmax(acc, v) : acc + v;
							cnt++;
						}
					if (!max)
						acc /= cnt;
					double got = dg_tensor_get_f64(y, ((b * oh + oy) * ow + ox) *
									  3 + c);
					cr_assert(fabs(got - acc) < 1e-12, "%s %s: %g, want %g", op,
						  attrs, got, acc);
				}
	dg_tensor_free(x);
	dg_tensor_free(y);
}

Test(conv, pooling_matches_the_definition_and_never_counts_padding)
{
	for (int same = 0; same < 2; same++) {
		check_pool("MaxPool2D", 2, 2, same);
		check_pool("MaxPool2D", 3, 1, same);
		check_pool("AvgPool2D", 2, 2, same);
		check_pool("AvgPool2D", 3, 2, same);
	}
}

/* The graph of one node over Placeholders of the given shapes ("?" = -1). */
static struct dg_graph *graph(const char *op, const char *xshape, const char *fshape,
			      const char *attrs, struct dg_err *err)
{
	char text[1024];

	snprintf(text, sizeof text, "{\"nodes\": [{\"name\": \"x\", \"op\": \"Placeholder\", "
		 "\"attrs\": {\"dtype\": \"float32\", \"shape\": %s}},"
		 "{\"name\": \"f\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": "
		 "\"float32\", \"shape\": %s}},"
		 "{\"name\": \"y\", \"op\": \"%s\", \"inputs\": [\"x\"%s], \"attrs\": %s}]}",
		 xshape, fshape, op, strncmp(op, "Conv", 4) == 0 ? ", \"f\"" : "", attrs);
	return dg_graph_parse(text, strlen(text), dg_op_find, err);
}

static void infers(const char *op, const char *xs, const char *fs, const char *attrs,
		   int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = graph(op, xs, fs, attrs, &err);

	cr_assert_not_null(g, "%s %s: %s", op, attrs, err.msg);
	const struct dg_shape *s = &g->nodes[2].out[0].shape;
	cr_assert(s->ndim == 4 && s->dim[0] == d0 && s->dim[1] == d1 && s->dim[2] == d2 &&
		  s->dim[3] == d3, "%s %s: [%lld,%lld,%lld,%lld]", op, attrs,
		  (long long)s->dim[0], (long long)s->dim[1], (long long)s->dim[2],
		  (long long)s->dim[3]);
	dg_graph_free(g);
}

static void refuses(const char *op, const char *xs, const char *fs, const char *attrs,
		    const char *want)
{
	struct dg_err err = { 0 };
	struct dg_graph *g = graph(op, xs, fs, attrs, &err);

	cr_assert_null(g, "%s %s %s %s: accepted", op, xs, fs, attrs);
	cr_assert(strstr(err.msg, want), "%s %s: want '%s' in: %s", op, attrs, want, err.msg);
}

Test(conv, inference_gives_the_output_shape_with_unknown_dims)
{
	infers("Conv2D", "[-1, 28, 28, 1]", "[5, 5, 1, 32]", "{\"padding\": \"SAME\"}",
	       -1, 28, 28, 32);
	infers("Conv2D", "[8, 28, 28, 1]", "[5, 5, 1, 32]", "{\"padding\": \"VALID\"}",
	       8, 24, 24, 32);
	infers("Conv2D", "[8, 28, 27, 1]", "[3, 3, 1, 4]", "{\"padding\": \"SAME\", "
	       "\"strides\": [1, 2, 2, 1]}", 8, 14, 14, 4);
	infers("Conv2D", "[8, -1, 10, 1]", "[3, 3, 1, 4]", "{\"padding\": \"VALID\", "
	       "\"dilations\": [2]}", 8, -1, 6, 4);
	infers("MaxPool2D", "[-1, 28, 28, 32]", "[1]", "{\"ksize\": [2], \"strides\": [2], "
	       "\"padding\": \"VALID\"}", -1, 14, 14, 32);
	infers("AvgPool2D", "[4, 7, 7, 3]", "[1]", "{\"ksize\": [3], \"strides\": [2], "
	       "\"padding\": \"SAME\"}", 4, 4, 4, 3);
}

Test(conv, bad_shapes_dtypes_and_attrs_are_refused_naming_the_problem)
{
	refuses("Conv2D", "[28, 28, 1]", "[5, 5, 1, 32]", "{\"padding\": \"SAME\"}", "rank 4");
	refuses("Conv2D", "[8, 28, 28, 1]", "[5, 5, 32]", "{\"padding\": \"SAME\"}", "HWIO");
	refuses("Conv2D", "[8, 28, 28, 3]", "[5, 5, 1, 32]", "{\"padding\": \"SAME\"}",
		"takes 1 channels, the input");
	refuses("Conv2D", "[8, 4, 4, 1]", "[5, 5, 1, 32]", "{\"padding\": \"VALID\"}",
		"smaller than the window's reach");
	refuses("Conv2D", "[8, 28, 28, 1]", "[5, 5, 1, 32]", "{}", "padding");
	refuses("Conv2D", "[8, 28, 28, 1]", "[5, 5, 1, 32]", "{\"padding\": \"FULL\"}",
		"\"SAME\" or \"VALID\"");
	refuses("Conv2D", "[8, 28, 28, 1]", "[5, 5, 1, 32]", "{\"padding\": \"SAME\", "
		"\"strides\": [0]}", "positive");
	refuses("Conv2D", "[8, 28, 28, 1]", "[5, 5, 1, 32]", "{\"padding\": \"SAME\", "
		"\"strides\": [2, 1, 1, 1]}", "no stride over the batch");
	refuses("Conv2D", "[8, 28, 28, 1]", "[5, 5, 1, 32]", "{\"padding\": \"SAME\", "
		"\"strides\": [1, 2, 3]}", "[kh, kw]");
	refuses("Conv2D", "[8, 28, 28, 1]", "[5, 5, 1, 32]", "{\"padding\": \"SAME\", "
		"\"strides\": [2], \"dilations\": [2]}", "not supported");
	refuses("MaxPool2D", "[8, 28, 28, 1]", "[1]", "{\"padding\": \"SAME\"}", "ksize");
	refuses("MaxPool2D", "[8, 1, 28, 1]", "[1]", "{\"ksize\": [2], \"padding\": "
		"\"VALID\"}", "smaller than the window's reach");

	/* integer images and mixed dtypes */
	const char *text = "{\"nodes\": [{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": "
		"{\"dtype\": \"int32\", \"shape\": [1, 4, 4, 1]}}, {\"name\": \"y\", \"op\": "
		"\"MaxPool2D\", \"inputs\": [\"x\"], \"attrs\": {\"ksize\": [2], \"padding\": "
		"\"VALID\"}}]}";
	struct dg_err err = { 0 };
	cr_assert_null(dg_graph_parse(text, strlen(text), dg_op_find, &err));
	cr_assert(strstr(err.msg, "float32 or float64"), "%s", err.msg);
	text = "{\"nodes\": [{\"name\": \"x\", \"op\": \"Placeholder\", \"attrs\": {\"dtype\": "
		"\"float32\", \"shape\": [1, 4, 4, 1]}}, {\"name\": \"f\", \"op\": \"Placeholder\", "
		"\"attrs\": {\"dtype\": \"float64\", \"shape\": [2, 2, 1, 1]}}, {\"name\": \"y\", "
		"\"op\": \"Conv2D\", \"inputs\": [\"x\", \"f\"], \"attrs\": {\"padding\": "
		"\"VALID\"}}]}";
	cr_assert_null(dg_graph_parse(text, strlen(text), dg_op_find, &err));
	cr_assert(strstr(err.msg, "float32 and the filter float64"), "%s", err.msg);
}

Test(conv, a_gradient_of_the_wrong_shape_is_refused_at_run_time)
{
	struct dg_tensor *x = rand_tensor(DG_F32, 2, 6, 6, 1), *f = rand_tensor(DG_F32, 3, 3, 1, 2);
	struct dg_tensor *dy = rand_tensor(DG_F32, 2, 5, 5, 2), *out = NULL;
	const struct dg_tensor *in[3] = { x, f, dy };
	struct dg_err err = { 0 };

	cr_assert_eq(run("Conv2DBackpropInput", "{\"padding\": \"SAME\"}", in, 3, &out, &err),
		     DG_ESHAPE);
	cr_assert(strstr(err.msg, "the output gradient is float32 [2,5,5,2]"), "%s", err.msg);
	cr_assert_eq(run("Conv2DBackpropFilter", "{\"padding\": \"SAME\"}", in, 3, &out, &err),
		     DG_ESHAPE);
	const struct dg_tensor *pin[3] = { x, dy, dy };
	cr_assert_eq(run("MaxPool2DGrad", "{\"ksize\": [2], \"padding\": \"SAME\"}", pin, 3, &out,
			 &err), DG_ESHAPE);
	dg_tensor_free(x);
	dg_tensor_free(f);
	dg_tensor_free(dy);
}

Test(conv, max_pool_gradient_goes_to_the_first_maximum_a_nan_or_an_infinity)
{
	/* one image 2x2, 3 channels, one 2x2 window: channel 0 has a tie (first
	 * wins), channel 1 a NaN (it wins, as in the forward), channel 2 +inf */
	const float xv[12] = { 1, 5, -INFINITY, 3, NAN, 2, 3, 7, INFINITY, 0, 1, 4 };
	const float dyv[3] = { 10, 20, 30 };
	int64_t xd[4] = { 1, 2, 2, 3 }, yd[4] = { 1, 1, 1, 3 };
	struct dg_shape xs = dg_shape_make(4, xd), ys = dg_shape_make(4, yd);
	struct dg_tensor *x = dg_tensor_from_data(DG_F32, &xs, xv, NULL);
	struct dg_tensor *dy = dg_tensor_from_data(DG_F32, &ys, dyv, NULL), *dx = NULL, *y = NULL;
	const struct dg_tensor *in[3] = { x, NULL, dy };
	struct dg_err err = { 0 };

	cr_assert_not_null(x);
	cr_assert_eq(run("MaxPool2D", "{\"ksize\": [2], \"padding\": \"VALID\"}", in, 1, &y, &err),
		     DG_OK);
	cr_assert(((float *)y->data)[0] == 3 && isnan(((float *)y->data)[1]) &&
		  isinf(((float *)y->data)[2]));
	in[1] = y;
	cr_assert_eq(run("MaxPool2DGrad", "{\"ksize\": [2], \"padding\": \"VALID\"}", in, 3, &dx,
			 &err), DG_OK, "%s", err.msg);
	const float *d = dx->data;
	const float want[12] = { 0, 0, 0, 10, 20, 0, 0, 0, 30, 0, 0, 0 };
	for (int i = 0; i < 12; i++)
		cr_assert_eq(d[i], want[i], "dx[%d] = %g, want %g", i, d[i], want[i]);
	/* an infinite dy goes to the maximum only: 0, not NaN, elsewhere */
	dg_tensor_free(dx);
	dx = NULL;
	((float *)dy->data)[0] = INFINITY;
	cr_assert_eq(run("MaxPool2DGrad", "{\"ksize\": [2], \"padding\": \"VALID\"}", in, 3, &dx,
			 &err), DG_OK, "%s", err.msg);
	d = dx->data;
	cr_assert(isinf(d[3]) && d[0] == 0 && d[6] == 0 && d[9] == 0, "%g %g %g %g", d[0], d[3],
		  d[6], d[9]);
	dg_tensor_free(x);
	dg_tensor_free(dy);
	dg_tensor_free(dx);
	dg_tensor_free(y);
}
