/* Array ops for the CPU: slicing (Slice, StridedSlice), joining and splitting
 * (Concat, Split), layout (Reshape, Transpose, ExpandDims, Squeeze), shape
 * queries (Size, Shape), fills (Fill, ZerosLike, OnesLike) and rows by index
 * (Gather and its gradient's UnsortedSegmentSum). Every kernel but the segment
 * sum is a byte copy or a fill, so loops dispatch on the element size (1, 4, 8
 * bytes) rather than the dtype. registry.c collects the table dg_ops_array. */
#include "cpu.h"
#include "grad.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- formatting for messages ------------------------------------------- */

/* Big enough for 8 dims of 2^48 ("[281474976710656,...]") or 16 int64s of
 * an attr list; longer lists are cut with "...". Returned by value so a call
 * can sit inside printf arguments (the temporary lives to the end of the
 * full expression). */
struct text {
	char s[200];
};

static struct text shape_text(const struct dg_shape *s)
{
	struct text t;

	dg_shape_format(s, t.s, sizeof t.s);
	return t;
}

/* "[2,-1,3]": attr lists print -1 as -1, not as the unknown-size '?'. */
static struct text ints_text(const int64_t *v, int n)
{
	struct text t;
	size_t len = 1;

	t.s[0] = '[';
	for (int i = 0; i < n; i++) {
		int w = snprintf(t.s + len, sizeof t.s - len, "%s%lld", i ? "," : "",
				 (long long)v[i]);
		if (w < 0 || (size_t)w >= sizeof t.s - len - 5) {
			snprintf(t.s + len, sizeof t.s - len, ",...]");
			return t;
		}
		len += (size_t)w;
	}
	snprintf(t.s + len, sizeof t.s - len, "]");
	return t;
}

/* --- strides and element-size copy loops -------------------------------- */

/* C-order strides of a known shape, in elements. */
static void contiguous_strides(const struct dg_shape *s, int64_t *str)
{
	int64_t acc = 1;

	for (int k = s->ndim - 1; k >= 0; k--) {
		str[k] = acc;
		acc *= s->dim[k];
	}
}

/* Product of dims [from, to) of a known shape. */
static int64_t dims_prod(const struct dg_shape *s, int from, int to)
{
	int64_t p = 1;

	for (int k = from; k < to; k++)
		p *= s->dim[k];
	return p;
}

/* dst[i] = src[i * stride] for i < n: one row of a strided gather. */
typedef void (*gather_fn)(void *restrict dst, const void *restrict src, int64_t n,
			  int64_t stride);

#define DEF_GATHER(name, T)                                                              \
	static void name(void *restrict dst, const void *restrict src, int64_t n,        \
			 int64_t stride)                                                 \
	{                                                                                \
		T *restrict d = dst;                                                     \
		const T *restrict s = src;                                               \
		for (int64_t i = 0; i < n; i++)                                          \
			d[i] = s[i * stride];                                            \
	}
DEF_GATHER(gather_1, uint8_t)
DEF_GATHER(gather_2, uint16_t)
DEF_GATHER(gather_4, uint32_t)
DEF_GATHER(gather_8, uint64_t)

/* Fill n elements of es bytes with the pattern at val. */
static void fill_pattern(void *dst, const void *val, size_t es, int64_t n)
{
	if (es == 1) {
		memset(dst, *(const uint8_t *)val, (size_t)n);
	} else if (es == 2) {   /* float16, bfloat16 */
		uint16_t v, *restrict d = dst;
		memcpy(&v, val, 2);
		for (int64_t i = 0; i < n; i++)
			d[i] = v;
	} else if (es == 4) {
		uint32_t v, *restrict d = dst;
		memcpy(&v, val, 4);
		for (int64_t i = 0; i < n; i++)
			d[i] = v;
	} else {
		uint64_t v, *restrict d = dst;
		memcpy(&v, val, 8);
		for (int64_t i = 0; i < n; i++)
			d[i] = v;
	}
}

/* A strided view of a source buffer read in the C order of a contiguous
 * output: output element (i0, .., i{nd-1}) is src[off + sum_k i_k * st[k]].
 * Strides are in elements and may be negative (reversed slices). */
struct view {
	int nd;
	int64_t dim[DG_MAX_DIMS];
	int64_t st[DG_MAX_DIMS];
	int64_t off;
};

/* Drop size-1 dims (their stride never matters) and merge a dim into the one
 * outside it when the pair walks memory as one longer dim, so that e.g. a
 * slice of whole trailing rows becomes a single long memcpy. */
static void view_simplify(struct view *v)
{
	int m = 0;

	for (int k = 0; k < v->nd; k++) {
		if (v->dim[k] == 1)
			continue;
		if (m > 0 && v->st[m - 1] == v->st[k] * v->dim[k]) {
			v->dim[m - 1] *= v->dim[k];
			v->st[m - 1] = v->st[k];
		} else {
			v->dim[m] = v->dim[k];
			v->st[m] = v->st[k];
			m++;
		}
	}
	v->nd = m;
}

/* Copy the view into dst (contiguous). Every dim of the view must be >= 1 and
 * every addressed element inside src: the callers' plans guarantee both. */
static void view_copy(void *dst, const void *src, const struct view *v0, size_t es)
{
	struct view v = *v0;
	const char *base;
	char *d = dst;
	int64_t idx[DG_MAX_DIMS] = { 0 };
	int64_t pos = 0, n, s;
	gather_fn g = es == 1 ? gather_1 : es == 2 ? gather_2 : es == 4 ? gather_4 : gather_8;

	view_simplify(&v);
	base = (const char *)src + v.off * (int64_t)es;
	if (v.nd == 0) {
		memcpy(d, base, es);
		return;
	}
	/* The innermost dim is one row (memcpy when contiguous); the outer dims
	 * advance an odometer that keeps pos = sum idx[k] * st[k]. */
	n = v.dim[v.nd - 1];
	s = v.st[v.nd - 1];
	for (;;) {
		if (s == 1)
			memcpy(d, base + pos * (int64_t)es, (size_t)n * es);
		else
			g(d, base + pos * (int64_t)es, n, s);
		d += (size_t)n * es;
		int k = v.nd - 2;
		for (; k >= 0; k--) {
			pos += v.st[k];
			if (++idx[k] < v.dim[k])
				break;
			pos -= v.st[k] * v.dim[k];
			idx[k] = 0;
		}
		if (k < 0)
			return;
	}
}

/* --- shared attr helpers ----------------------------------------------- */

static bool has_attr(struct dg_attrs attrs, const char *key)
{
	return dg_attrs_get(attrs, key) != NULL;
}

static void copy_whole(struct dg_tensor *out, const struct dg_tensor *x)
{
	if (x->nbytes)
		memcpy(out->data, x->data, x->nbytes);
}

/* Reshape, ExpandDims and Squeeze keep the bytes (C order makes them
 * identical) and only relabel the shape that plan computes. */
static enum dg_status relabel_cpu(struct dg_kernel_ctx *c,
				  enum dg_status (*plan)(struct dg_attrs, const struct dg_shape *,
							 struct dg_shape *, struct dg_err *))
{
	struct dg_shape os;
	enum dg_status st = plan(c->attrs, &c->in[0]->shape, &os, c->err);

	if (st != DG_OK)
		return st;
	if (!cpu_out(c, 0, c->in[0]->dtype, &os))
		return c->err ? c->err->code : DG_ENOMEM;
	copy_whole(c->out[0], c->in[0]);
	return DG_OK;
}

static const struct dg_attr_spec no_attrs[] = { { 0 } };

/* --- Slice ------------------------------------------------------------- */

/* y[i0, .., ik] = x[begin0 + i0, .., begink + ik] with y's shape = size (a -1
 * size resolved to "the rest of the dim"). Unlike StridedSlice, begins are
 * never negative and nothing is clamped: an out-of-range window is an error,
 * since a silently shorter result would hide a wrong graph. */

/* Check begin/size against the input shape (dims may be unknown: -1, rank may
 * be unknown) and compute the output shape. begin gets the start per dim. */
static enum dg_status slice_plan(struct dg_attrs attrs, const struct dg_shape *in, int64_t *begin,
				 struct dg_shape *out, struct dg_err *err)
{
	int64_t size[DG_MAX_DIMS];
	int nb, ns;
	enum dg_status st;

	st = dg_attrs_ints(attrs, "begin", true, begin, DG_MAX_DIMS, &nb, err);
	if (st == DG_OK)
		st = dg_attrs_ints(attrs, "size", true, size, DG_MAX_DIMS, &ns, err);
	if (st != DG_OK)
		return st;
	if (nb != ns) {
		return dg_err_set(err, DG_EINVAL,
				"attr 'begin' has %d entries but attr 'size' has %d", nb, ns);
	}
	if (in->ndim >= 0 && nb != in->ndim) {
		dg_err_set(err, DG_EINVAL,
				"attr 'begin' has %d entries but the input %s has rank %d", nb,
				shape_text(in).s, in->ndim);
		dg_err_hint(err, "give one begin and one size per input dimension");
		return DG_EINVAL;
	}
	out->ndim = nb;
	for (int i = 0; i < nb; i++) {
		int64_t d = in->ndim >= 0 ? in->dim[i] : -1;

		if (begin[i] < 0 || (d >= 0 && begin[i] > d)) {
			dg_err_set(err, DG_EINVAL, "begin[%d] = %lld is out of range for dim %d of "
				   "input %s", i, (long long)begin[i], i, shape_text(in).s);
			dg_err_hint(err, "Slice begins must lie in 0..size of their dimension");
			return DG_EINVAL;
		}
		if (size[i] < -1) {
			dg_err_set(err, DG_EINVAL, "size[%d] = %lld is invalid", i,
				   (long long)size[i]);
			dg_err_hint(err, "sizes are >= 0, or -1 for 'to the end of the dimension'");
			return DG_EINVAL;
		}
		if (d < 0) {
			out->dim[i] = size[i];      /* -1 stays unknown */
		} else if (size[i] == -1) {
			out->dim[i] = d - begin[i];
		} else if (size[i] > d - begin[i]) {
			dg_err_set(err, DG_EINVAL,
					"begin[%d] + size[%d] = %lld + %lld runs past dim %d of "
					"input %s", i, i, (long long)begin[i], (long long)size[i],
					i, shape_text(in).s);
			dg_err_hint(err, "use size -1 to take the rest of the dimension");
			return DG_EINVAL;
		} else {
			out->dim[i] = size[i];
		}
	}
	return DG_OK;
}

static enum dg_status slice_infer(struct dg_infer_ctx *c)
{
	int64_t begin[DG_MAX_DIMS];

	c->out[0].dtype = c->in[0].dtype;
	return slice_plan(dg_attrs_of_json(c->attrs), &c->in[0].shape, begin, &c->out[0].shape, c->err);
}

/* Output 0 of shape os = the window of x that starts at begin[k] and takes
 * dims[k] elements every step[k] (NULL: every 1) along input dim k; os is
 * that window's shape with dims dropped or inserted (StridedSlice), so the
 * element counts agree. Shared by Slice and StridedSlice. */
static enum dg_status copy_window(struct dg_kernel_ctx *c, const struct dg_shape *os,
				  const int64_t *dims, const int64_t *begin, const int64_t *step)
{
	const struct dg_tensor *x = c->in[0];
	int64_t str[DG_MAX_DIMS];
	struct view v = { .nd = x->shape.ndim };
	struct dg_tensor *y = cpu_out(c, 0, x->dtype, os);

	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (y->numel == 0)
		return DG_OK;
	/* Walk the window with step * input stride (negative steps go backwards).
	 * A dim of one element never steps, and its step may be anything the
	 * attrs said (up to 2^63): multiplying it could overflow. With two or
	 * more elements |step| <= dim, so the product stays small. */
	contiguous_strides(&x->shape, str);
	for (int k = 0; k < v.nd; k++) {
		int64_t s = step ? step[k] : 1;
		v.dim[k] = dims[k];
		v.st[k] = dims[k] > 1 ? s * str[k] : 0;
		v.off += begin[k] * str[k];
	}
	view_copy(y->data, x->data, &v, dg_dtype_size(x->dtype));
	return DG_OK;
}

/* Checks the actual shape again (inference may have had unknown dims). */
static enum dg_status slice_cpu(struct dg_kernel_ctx *c)
{
	int64_t begin[DG_MAX_DIMS];
	struct dg_shape os;
	enum dg_status st = slice_plan(c->attrs, &c->in[0]->shape, begin, &os, c->err);

	if (st != DG_OK)
		return st;
	return copy_window(c, &os, os.dim, begin, NULL);
}

static const struct dg_attr_spec slice_attrs[] = {
	{ "begin", DG_ATTR_INTS, true, "start index per dimension (0..size)" },
	{ "size", DG_ATTR_INTS, true, "length per dimension; -1 takes the rest" },
	{ 0 },
};

/* --- StridedSlice ------------------------------------------------------- */

/* TensorFlow's algorithm (ValidateStridedSliceOp): the sparse spec (begin,
 * end, strides with masks, one entry per index expression) is expanded into a
 * dense spec with one entry per input dim (the ellipsis, explicit or implied
 * at the end, stands for the dims no index names), each dense dim is
 * canonicalised like Python slicing, and the final shape gathers the
 * processing sizes, dropping shrunk dims and inserting new 1-sized axes. */
#define SS_MAX_SPARSE (2 * DG_MAX_DIMS)
#define SS_NEW_AXIS (-1)
#define SS_SHRINK (-2)

struct ss_plan {
	int64_t begin[DG_MAX_DIMS];   /* canonical start per input dim */
	int64_t stride[DG_MAX_DIMS];
	int64_t size[DG_MAX_DIMS];    /* processing shape (input rank); -1 unknown */
	struct dg_shape out;          /* final shape */
};

struct ss_spec {
	int n;                        /* index expressions given */
	int64_t begin[SS_MAX_SPARSE], end[SS_MAX_SPARSE], stride[SS_MAX_SPARSE];
	int64_t begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_mask;
};

static enum dg_status ss_read_mask(struct dg_attrs attrs, const char *key, int64_t *out,
				   struct dg_err *err)
{
	static const int64_t zero = 0;
	enum dg_status st = dg_attrs_int(attrs, key, &zero, out, err);

	if (st == DG_OK && *out < 0) {
		return dg_err_set(err, DG_EINVAL, "attr '%s' = %lld is negative; it is a bit mask",
				  key, (long long)*out);
	}
	return st;
}

/* Read and check the sparse spec: equal lengths (strides default to 1), at
 * most one ellipsis, no zero step on a real index. */
static enum dg_status ss_read(struct dg_attrs attrs, struct ss_spec *s, struct dg_err *err)
{
	int ne, nst;
	enum dg_status st;

	st = dg_attrs_ints(attrs, "begin", true, s->begin, SS_MAX_SPARSE, &s->n, err);
	if (st == DG_OK)
		st = dg_attrs_ints(attrs, "end", true, s->end, SS_MAX_SPARSE, &ne, err);
	if (st == DG_OK)
		st = dg_attrs_ints(attrs, "strides", false, s->stride, SS_MAX_SPARSE, &nst, err);
	if (st == DG_OK)
		st = ss_read_mask(attrs, "begin_mask", &s->begin_mask, err);
	if (st == DG_OK)
		st = ss_read_mask(attrs, "end_mask", &s->end_mask, err);
	if (st == DG_OK)
		st = ss_read_mask(attrs, "ellipsis_mask", &s->ellipsis_mask, err);
	if (st == DG_OK)
		st = ss_read_mask(attrs, "new_axis_mask", &s->new_axis_mask, err);
	if (st == DG_OK)
		st = ss_read_mask(attrs, "shrink_axis_mask", &s->shrink_mask, err);
	if (st != DG_OK)
		return st;
	if (!has_attr(attrs, "strides")) {
		for (int i = 0; i < s->n; i++)
			s->stride[i] = 1;
		nst = s->n;
	}
	if (ne != s->n || nst != s->n) {
		return dg_err_set(err, DG_EINVAL, "attrs 'begin', 'end' and 'strides' have %d, %d "
				  "and %d entries; they must have the same length", s->n, ne, nst);
	}
	if (s->ellipsis_mask & (s->ellipsis_mask - 1)) {
		return dg_err_set(err, DG_EINVAL, "attr 'ellipsis_mask' = %lld sets more than one "
				  "bit; at most one ellipsis is allowed",
				  (long long)s->ellipsis_mask);
	}
	for (int i = 0; i < s->n; i++) {
		int64_t bit = (int64_t)1 << i;
		if (s->stride[i] == 0 && !(s->ellipsis_mask & bit) && !(s->new_axis_mask & bit)) {
			dg_err_set(err, DG_EINVAL, "strides[%d] is 0", i);
			dg_err_hint(err,
					"a slice step must be non-zero (negative steps go "
					"backwards)");
			return DG_EINVAL;
		}
	}
	return DG_OK;
}

/* Python-style canonical bound c (0: begin, 1: end) of dim size d for a
 * non-masked index x: negative counts from the end, then clamp into the valid
 * range, which is [0, d] going forwards and [-1, d-1] going backwards. */
static int64_t ss_canonical(int64_t x, int c, bool masked, int64_t stride, int64_t d)
{
	int64_t lo = stride > 0 ? 0 : -1, hi = stride > 0 ? d : d - 1;

	if (masked)
		return (stride > 0) == (c == 0) ? lo : hi;
	if (x < 0)
		x += d;
	return x < lo ? lo : x > hi ? hi : x;
}

/* Per input dim k: canonical begin and the processing size. */
static enum dg_status ss_dense_dim(struct ss_plan *p, int k, int64_t b, int64_t e, int64_t s,
				   bool bm, bool em, bool shrink, int64_t d, struct dg_err *err)
{
	int64_t len;

	p->stride[k] = s;
	if (shrink && s <= 0) {
		return dg_err_set(err, DG_EINVAL, "dim %d is indexed (shrink_axis_mask) with "
				  "stride %lld; only stride 1 is allowed there", k, (long long)s);
	}
	if (d < 0) {
		p->begin[k] = 0;
		p->size[k] = shrink ? 1 : -1;
		return DG_OK;
	}
	if (shrink) {
		/* x[i]: one element, no clamping; the end from the spec is ignored. */
		int64_t x = b < 0 ? b + d : b;
		if (x < 0 || x >= d) {
			return dg_err_set(err, DG_EINVAL,
					"index %lld is out of bounds for dim %d of size %lld",
					(long long)b, k, (long long)d);
		}
		p->begin[k] = x;
		p->size[k] = 1;
		return DG_OK;
	}
	p->begin[k] = ss_canonical(b, 0, bm, s, d);
	len = ss_canonical(e, 1, em, s, d) - p->begin[k];
	/* Empty when the interval is degenerate or runs against the stride;
	 * otherwise ceil(len / s), both signs alike. */
	if (len == 0 || (len < 0) != (s < 0))
		p->size[k] = 0;
	else
		p->size[k] = len / s + (len % s != 0);
	return DG_OK;
}

static enum dg_status ss_plan_make(struct dg_attrs attrs, const struct dg_shape *in,
				   struct ss_plan *p, struct dg_err *err)
{
	struct ss_spec s;
	int gather[SS_MAX_SPARSE + DG_MAX_DIMS + 1], ng = 0, full = 0, rank = in->ndim;
	int n_sparse, add_after = 0;
	int64_t ell;
	bool seen = false;
	enum dg_status st = ss_read(attrs, &s, err);

	if (st != DG_OK)
		return st;
	if (rank < 0) {
		p->out.ndim = -1;
		return DG_OK;
	}
	/* New axes after the ellipsis shorten what the ellipsis expands to. */
	for (int i = 0; i < s.n; i++) {
		if (seen && (s.new_axis_mask >> i & 1))
			add_after++;
		if (s.ellipsis_mask >> i & 1)
			seen = true;
	}
	ell = s.ellipsis_mask & (((int64_t)1 << s.n) - 1);
	n_sparse = s.n;
	if (!seen) {
		ell = (int64_t)1 << s.n;      /* implicit ellipsis at the end */
		n_sparse++;
	}
	for (int i = 0; i < n_sparse; i++) {
		if (ell >> i & 1) {
			int next = rank - (n_sparse - i) + 1 + add_after;
			for (next = next < rank ? next : rank; full < next; full++) {
				/* a full range [::1]; cannot fail */
				(void)ss_dense_dim(p, full, 0, 0, 1, true, true, false,
						   in->dim[full], err);
				gather[ng++] = full;
			}
		} else if (s.new_axis_mask >> i & 1) {
			gather[ng++] = SS_NEW_AXIS;
		} else {
			bool shrink = s.shrink_mask >> i & 1;
			if (full == rank) {
				dg_err_set(err, DG_EINVAL,
						"the slice has more indices than the input %s has "
						"dims", shape_text(in).s);
				dg_err_hint(err,
						"count begin/end entries, leaving out new axes and "
						"the ellipsis");
				return DG_EINVAL;
			}
			st = ss_dense_dim(p, full, s.begin[i], s.end[i], s.stride[i],
					  s.begin_mask >> i & 1, s.end_mask >> i & 1, shrink,
					  in->dim[full], err);
			if (st != DG_OK)
				return st;
			gather[ng++] = shrink ? SS_SHRINK : full;
			full++;
		}
	}
	p->out.ndim = 0;
	for (int g = 0; g < ng; g++) {
		if (gather[g] == SS_SHRINK)
			continue;
		if (p->out.ndim == DG_MAX_DIMS) {
			return dg_err_set(err, DG_EINVAL, "the slice would have more than %d dims",
					  DG_MAX_DIMS);
		}
		p->out.dim[p->out.ndim++] = gather[g] == SS_NEW_AXIS ? 1 : p->size[gather[g]];
	}
	return DG_OK;
}

static enum dg_status strided_slice_infer(struct dg_infer_ctx *c)
{
	struct ss_plan p;
	enum dg_status st = ss_plan_make(dg_attrs_of_json(c->attrs), &c->in[0].shape, &p, c->err);

	c->out[0].dtype = c->in[0].dtype;
	c->out[0].shape = p.out;
	return st;
}

/* The plan is rebuilt from the actual shape: bounds clamp against real dims.
 * The output is the processing shape (p.size) reshaped to p.out. */
static enum dg_status strided_slice_cpu(struct dg_kernel_ctx *c)
{
	struct ss_plan p;
	enum dg_status st = ss_plan_make(c->attrs, &c->in[0]->shape, &p, c->err);

	if (st != DG_OK)
		return st;
	return copy_window(c, &p.out, p.size, p.begin, p.stride);
}

static const struct dg_attr_spec strided_slice_attrs[] = {
	{ "begin", DG_ATTR_INTS, true, "start per index (negative counts from the end)" },
	{ "end", DG_ATTR_INTS, true, "stop (exclusive) per index" },
	{ "strides", DG_ATTR_INTS, false, "step per index (non-zero); default all 1" },
	{ "begin_mask", DG_ATTR_INT, false, "bit i: ignore begin[i] (start of the range)" },
	{ "end_mask", DG_ATTR_INT, false, "bit i: ignore end[i] (end of the range)" },
	{ "ellipsis_mask", DG_ATTR_INT, false, "bit i: index i is '...' (at most one)" },
	{ "new_axis_mask", DG_ATTR_INT, false, "bit i: index i inserts a size-1 axis" },
	{ "shrink_axis_mask", DG_ATTR_INT, false, "bit i: index i picks one element, dropping "
	  "the dim" },
	{ 0 },
};

/* --- Concat ------------------------------------------------------------- */

/* y = x0 ++ x1 ++ ... along axis: all inputs share the dtype, the rank and
 * every dim but axis, and y's axis dim is the sum. Ranks must be >= 1. */

/* The rank comes from the first input of known rank; inputs of unknown rank
 * make the axis dim unknown but do not hide mismatches among the others. */
static enum dg_status concat_infer(struct dg_infer_ctx *c)
{
	const struct dg_ttype *ref = NULL;
	int64_t axis;
	int ax, ref_i = 0;
	struct dg_shape *o = &c->out[0].shape;
	enum dg_status st = dg_attrs_int(dg_attrs_of_json(c->attrs), "axis", NULL, &axis, c->err);

	if (st != DG_OK)
		return st;
	c->out[0].dtype = c->in[0].dtype;
	for (int i = 0; i < c->n_in; i++) {
		if (c->in[i].dtype != c->in[0].dtype) {
			return dg_err_set(c->err, DG_EDTYPE, "input %d is %s but input 0 is %s", i,
					  dg_dtype_name(c->in[i].dtype),
					  dg_dtype_name(c->in[0].dtype));
		}
		if (!ref && c->in[i].shape.ndim >= 0) {
			ref = &c->in[i];
			ref_i = i;
		}
	}
	if (!ref) {
		o->ndim = -1;
		return DG_OK;
	}
	st = cpu_axis(axis, ref->shape.ndim, &ax, c->err);
	if (st != DG_OK)
		return st;
	/* Merge: the axis dim sums (unknown if any is), the others must agree
	 * where known. */
	*o = ref->shape;
	o->dim[ax] = 0;
	for (int i = 0; i < c->n_in; i++) {
		const struct dg_shape *s = &c->in[i].shape;
		if (s->ndim < 0) {
			o->dim[ax] = -1;
			continue;
		}
		if (s->ndim != ref->shape.ndim) {
			return dg_err_set(c->err, DG_ESHAPE,
					"input %d has shape %s, of a different rank than input "
					"%d's %s", i, shape_text(s).s, ref_i,
					shape_text(&ref->shape).s);
		}
		for (int k = 0; k < s->ndim; k++) {
			if (k == ax) {
				bool unknown = o->dim[k] < 0 || s->dim[k] < 0;
				o->dim[k] = unknown ? -1 : o->dim[k] + s->dim[k];
			} else if (o->dim[k] < 0) {
				o->dim[k] = s->dim[k];
			} else if (s->dim[k] >= 0 && s->dim[k] != o->dim[k]) {
				dg_err_set(c->err, DG_ESHAPE,
						"input %d has shape %s, which differs from input "
						"%d's %s outside axis %d", i, shape_text(s).s,
						ref_i, shape_text(&ref->shape).s, ax);
				dg_err_hint(c->err,
						"all inputs must have the same sizes except along "
						"the concatenation axis");
				return DG_ESHAPE;
			}
		}
	}
	return DG_OK;
}

/* Actual inputs: same dtype as input 0, same dims outside ax; *os gets y's
 * shape. Messages name the offending input's index and both shapes. */
static enum dg_status concat_check(struct dg_kernel_ctx *c, int ax, struct dg_shape *os)
{
	const struct dg_tensor *x0 = c->in[0];

	*os = x0->shape;
	for (int i = 1; i < c->n_in; i++) {
		const struct dg_tensor *x = c->in[i];
		if (x->dtype != x0->dtype) {
			return dg_err_set(c->err, DG_EDTYPE, "input %d is %s but input 0 is %s", i,
					  dg_dtype_name(x->dtype), dg_dtype_name(x0->dtype));
		}
		bool ok = x->shape.ndim == x0->shape.ndim;
		for (int k = 0; ok && k < x0->shape.ndim; k++)
			ok = k == ax || x->shape.dim[k] == x0->shape.dim[k];
		if (!ok) {
			dg_err_set(c->err, DG_ESHAPE, "input %d has shape %s, which does not match "
				   "input 0's %s outside axis %d", i, shape_text(&x->shape).s,
				   shape_text(&x0->shape).s, ax);
			dg_err_hint(c->err, "all inputs must have the same sizes except along the "
				    "concatenation axis");
			return DG_ESHAPE;
		}
		/* Each dim is <= 2^48 and there are <= 4096 inputs: no overflow;
		 * cpu_out checks the total against DG_MAX_NUMEL. */
		os->dim[ax] += x->shape.dim[ax];
	}
	return DG_OK;
}

static enum dg_status concat_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x0 = c->in[0];
	struct dg_shape os;
	struct dg_tensor *y;
	int64_t axis, outer;
	size_t es = dg_dtype_size(x0->dtype);
	int ax;
	char *d;
	enum dg_status st = dg_attrs_int(c->attrs, "axis", NULL, &axis, c->err);

	if (st == DG_OK)
		st = cpu_axis(axis, x0->shape.ndim, &ax, c->err);
	if (st == DG_OK)
		st = concat_check(c, ax, &os);
	if (st != DG_OK)
		return st;
	y = cpu_out(c, 0, x0->dtype, &os);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (y->numel == 0)
		return DG_OK;
	/* y viewed as [outer, sum of blocks]: for each outer index, input i
	 * contributes one contiguous block of dim_i[ax] * inner elements. */
	outer = dims_prod(&os, 0, ax);
	d = y->data;
	for (int64_t o = 0; o < outer; o++) {
		for (int i = 0; i < c->n_in; i++) {
			const struct dg_tensor *x = c->in[i];
			size_t blk = (size_t)dims_prod(&x->shape, ax, x->shape.ndim) * es;
			memcpy(d, (const char *)x->data + (size_t)o * blk, blk);
			d += blk;
		}
	}
	return DG_OK;
}

static const struct dg_attr_spec concat_attrs[] = {
	{ "axis", DG_ATTR_INT, true, "dimension to join along (negative counts from the end)" },
	{ 0 },
};

/* --- Split -------------------------------------------------------------- */

/* The inverse of Concat: x cut along axis into n parts, output i having
 * sizes[i] there. n comes from the attrs alone (num_outputs callback), so the
 * graph knows the arity before any shape is known. */

/* Number of outputs: num_split, or the length of size_splits (exactly one of
 * the two), within 1..DG_MAX_OUTPUTS. */
static int split_count(struct dg_attrs attrs, struct dg_err *err)
{
	bool has_num = has_attr(attrs, "num_split"), has_sizes = has_attr(attrs, "size_splits");
	int64_t n;

	if (has_num == has_sizes) {
		dg_err_set(err, DG_EINVAL, has_num ? "attrs 'num_split' and 'size_splits' are both "
			   "given" : "missing attr 'num_split' (or 'size_splits')");
		dg_err_hint(err, "give num_split for equal parts or size_splits for given sizes");
		return -1;
	}
	if (has_num) {
		if (dg_attrs_int(attrs, "num_split", NULL, &n, err) != DG_OK)
			return -1;
	} else {
		const json_t *v = dg_attrs_get(attrs, "size_splits");
		if (!json_is_array(v)) {
			dg_err_set(err, DG_EINVAL, "attr 'size_splits' must be an array of "
				   "integers");
			return -1;
		}
		n = (int64_t)json_array_size(v);
	}
	if (n < 1 || n > DG_MAX_OUTPUTS) {
		dg_err_set(err, DG_EINVAL,
				"Split into %lld parts is out of range 1..%d (attr '%s')",
				(long long)n, DG_MAX_OUTPUTS,
				has_num ? "num_split" : "size_splits");
		return -1;
	}
	return (int)n;
}

/* Sizes of the n parts of dim ax of size d (-1: unknown, then sizes may be
 * -1 too). sizes has room for n. */
static enum dg_status split_sizes(struct dg_attrs attrs, int n, int ax, int64_t d, int64_t *sizes,
				  struct dg_err *err)
{
	int m, infer_at = -1;
	int64_t sum = 0;
	enum dg_status st;

	if (has_attr(attrs, "num_split")) {
		if (d >= 0 && d % n != 0) {
			dg_err_set(err, DG_EINVAL,
					"dim %d of size %lld is not divisible by num_split %d", ax,
					(long long)d, n);
			dg_err_hint(err, "use size_splits for unequal parts");
			return DG_EINVAL;
		}
		for (int i = 0; i < n; i++)
			sizes[i] = d < 0 ? -1 : d / n;
		return DG_OK;
	}
	st = dg_attrs_ints(attrs, "size_splits", true, sizes, n, &m, err);
	if (st != DG_OK)
		return st;
	for (int i = 0; i < n; i++) {
		if (sizes[i] < -1 || sizes[i] > DG_MAX_NUMEL) {
			return dg_err_set(err, DG_EINVAL, "size_splits[%d] = %lld is invalid", i,
					  (long long)sizes[i]);
		}
		if (sizes[i] == -1) {
			if (infer_at >= 0) {
				return dg_err_set(err, DG_EINVAL,
						"size_splits has -1 at %d and %d; at most one size "
						"can be inferred", infer_at, i);
			}
			infer_at = i;
		} else {
			sum += sizes[i];
		}
	}
	if (d < 0)
		return DG_OK;
	if (infer_at >= 0 ? sum > d : sum != d) {
		dg_err_set(err, DG_EINVAL, "size_splits sum to %lld but dim %d has size %lld",
			   (long long)sum, ax, (long long)d);
		dg_err_hint(err, "the sizes must add up to the dimension (one may be -1)");
		return DG_EINVAL;
	}
	if (infer_at >= 0)
		sizes[infer_at] = d - sum;
	return DG_OK;
}

/* Shared by infer and kernel: axis of a known rank, sizes (owned, n entries). */
static enum dg_status split_plan(struct dg_attrs attrs, int n_out, const struct dg_shape *in,
				 int *ax, int64_t **sizes, struct dg_err *err)
{
	static const int64_t zero = 0;
	int64_t axis;
	int n = split_count(attrs, err);
	enum dg_status st;

	*sizes = NULL;
	if (n < 0)
		return err ? err->code : DG_EINVAL;
	if (n != n_out) {
		return dg_err_set(err, DG_EINVAL, "Split produces %d outputs but %d were asked for",
				  n, n_out);
	}
	st = dg_attrs_int(attrs, "axis", &zero, &axis, err);
	if (st == DG_OK)
		st = cpu_axis(axis, in->ndim, ax, err);
	if (st != DG_OK)
		return st;
	*sizes = malloc((size_t)n * sizeof **sizes);
	if (!*sizes)
		return dg_err_set(err, DG_ENOMEM, "out of memory for %d split sizes", n);
	st = split_sizes(attrs, n, *ax, in->dim[*ax], *sizes, err);
	if (st != DG_OK) {
		free(*sizes);
		*sizes = NULL;
	}
	return st;
}

static enum dg_status split_infer(struct dg_infer_ctx *c)
{
	int64_t *sizes;
	int ax;
	enum dg_status st;

	for (int i = 0; i < c->n_out; i++) {
		c->out[i].dtype = c->in[0].dtype;
		c->out[i].shape.ndim = -1;
	}
	if (c->in[0].shape.ndim < 0) {
		if (split_count(dg_attrs_of_json(c->attrs), c->err) < 0)
			return c->err ? c->err->code : DG_EINVAL;
		return DG_OK;
	}
	st = split_plan(dg_attrs_of_json(c->attrs), c->n_out, &c->in[0].shape, &ax, &sizes, c->err);
	if (st != DG_OK)
		return st;
	for (int i = 0; i < c->n_out; i++) {
		c->out[i].shape = c->in[0].shape;
		c->out[i].shape.dim[ax] = sizes[i];
	}
	free(sizes);
	return DG_OK;
}

/* All outputs are allocated before any byte moves, so a failure leaves only
 * whole tensors in c->out for the caller to free. */
static enum dg_status split_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0];
	size_t es = dg_dtype_size(x->dtype);
	int64_t *sizes, outer, inner;
	const char *s;
	int ax;
	enum dg_status st = split_plan(c->attrs, c->n_out, &x->shape, &ax, &sizes, c->err);

	if (st != DG_OK)
		return st;
	for (int i = 0; i < c->n_out; i++) {
		struct dg_shape os = x->shape;
		os.dim[ax] = sizes[i];
		if (!cpu_out(c, i, x->dtype, &os)) {
			free(sizes);
			return c->err ? c->err->code : DG_ENOMEM;
		}
	}
	/* x viewed as [outer, dim * inner]: each outer row hands one contiguous
	 * block of sizes[i] * inner elements to output i in turn. */
	outer = dims_prod(&x->shape, 0, ax);
	inner = dims_prod(&x->shape, ax + 1, x->shape.ndim);
	s = x->data;
	for (int64_t o = 0; o < outer && x->numel > 0; o++) {
		for (int i = 0; i < c->n_out; i++) {
			size_t blk = (size_t)(sizes[i] * inner) * es;
			if (blk)
				memcpy((char *)c->out[i]->data + (size_t)o * blk, s, blk);
			s += blk;
		}
	}
	free(sizes);
	return DG_OK;
}

static int split_num_outputs(const json_t *attrs, struct dg_err *err)
{
	return split_count(dg_attrs_of_json(attrs), err);
}

static const struct dg_attr_spec split_attrs[] = {
	{ "axis", DG_ATTR_INT, false, "dimension to split (default 0; negative counts from the "
	  "end)" },
	{ "num_split", DG_ATTR_INT, false, "number of equal parts" },
	{ "size_splits", DG_ATTR_INTS, false, "sizes of the parts (one may be -1); instead of "
	  "num_split" },
	{ 0 },
};

/* --- Reshape ------------------------------------------------------------ */

/* The same elements in the same C order under a new shape; one size may be -1
 * and is then the element count divided by the product of the others. The
 * bytes are copied, not shared: every tensor has exactly one owner. */

/* The target shape for input shape in (possibly partial: the -1 stays
 * unknown until the input's element count is known). */
static enum dg_status reshape_plan(struct dg_attrs attrs, const struct dg_shape *in,
				   struct dg_shape *out, struct dg_err *err)
{
	int64_t want[DG_MAX_DIMS], prod = 1, n_in;
	int n, infer_at = -1;
	enum dg_status st = dg_attrs_ints(attrs, "shape", true, want, DG_MAX_DIMS, &n, err);

	if (st != DG_OK)
		return st;
	for (int i = 0; i < n; i++) {
		if (want[i] < -1) {
			return dg_err_set(err, DG_EINVAL, "attr 'shape' %s has invalid size %lld",
					  ints_text(want, n).s, (long long)want[i]);
		}
		if (want[i] == -1) {
			if (infer_at >= 0) {
				dg_err_set(err, DG_EINVAL, "attr 'shape' %s has more than one -1",
					   ints_text(want, n).s);
				dg_err_hint(err, "at most one size can be inferred");
				return DG_EINVAL;
			}
			infer_at = i;
			continue;
		}
		if (want[i] > 0 && prod > DG_MAX_NUMEL / want[i]) {
			return dg_err_set(err, DG_ETOOLARGE, "attr 'shape' %s has more than 2^48 "
					  "elements", ints_text(want, n).s);
		}
		prod *= want[i];
	}
	*out = dg_shape_make(n, want);
	if (!dg_shape_is_known(in))
		return DG_OK;           /* -1 stays unknown */
	st = dg_shape_numel(in, &n_in, err);
	if (st != DG_OK)
		return st;
	if (infer_at >= 0) {
		if (prod == 0) {
			dg_err_set(err, DG_EINVAL,
					"cannot infer the -1 in shape %s: the other sizes multiply "
					"to 0", ints_text(want, n).s);
			dg_err_hint(err, "give every size explicitly when one of them is 0");
			return DG_EINVAL;
		}
		if (n_in % prod == 0) {
			out->dim[infer_at] = n_in / prod;
			return DG_OK;
		}
	} else if (prod == n_in) {
		return DG_OK;
	}
	dg_err_set(err, DG_ESHAPE, "cannot reshape a tensor of shape %s (%lld elements) into "
		   "shape %s", shape_text(in).s, (long long)n_in, ints_text(want, n).s);
	dg_err_hint(err, "the element counts must match; -1 infers one size");
	return DG_ESHAPE;
}

static enum dg_status reshape_infer(struct dg_infer_ctx *c)
{
	c->out[0].dtype = c->in[0].dtype;
	return reshape_plan(dg_attrs_of_json(c->attrs), &c->in[0].shape, &c->out[0].shape, c->err);
}

static enum dg_status reshape_cpu(struct dg_kernel_ctx *c)
{
	return relabel_cpu(c, reshape_plan);
}

static const struct dg_attr_spec reshape_attrs[] = {
	{ "shape", DG_ATTR_INTS, true, "new shape; one size may be -1 (inferred)" },
	{ 0 },
};

/* --- Transpose ---------------------------------------------------------- */

/* y[i0, .., ir] = x[j] where j[perm[k]] = i[k]: output dim k is input dim
 * perm[k]. The copy first reduces the problem (transpose_reduce), then either
 * copies whole rows (the last axis stays last) or runs tiled 2-d transposes. */

/* perm (default reversed axes) for a rank-r input; r < 0 (unknown) takes the
 * rank from perm when given, *n = -1 when not. */
static enum dg_status transpose_perm(struct dg_attrs attrs, int r, int64_t *perm, int *n,
				     struct dg_err *err)
{
	bool seen[DG_MAX_DIMS] = { false };
	enum dg_status st;

	if (!has_attr(attrs, "perm")) {
		*n = r;
		for (int i = 0; i < r; i++)
			perm[i] = r - 1 - i;
		return DG_OK;
	}
	st = dg_attrs_ints(attrs, "perm", false, perm, DG_MAX_DIMS, n, err);
	if (st != DG_OK)
		return st;
	if (r >= 0 && *n != r) {
		return dg_err_set(err, DG_EINVAL, "attr 'perm' %s has %d entries but the input has "
				  "rank %d", ints_text(perm, *n).s, *n, r);
	}
	for (int i = 0; i < *n; i++) {
		if (perm[i] < 0 || perm[i] >= *n || seen[perm[i]]) {
			dg_err_set(err, DG_EINVAL, "attr 'perm' %s is not a permutation of 0..%d",
				   ints_text(perm, *n).s, *n - 1);
			dg_err_hint(err,
					"list every axis exactly once, e.g. [1,0] for a 2-d "
					"transpose");
			return DG_EINVAL;
		}
		seen[perm[i]] = true;
	}
	return DG_OK;
}

static enum dg_status transpose_infer(struct dg_infer_ctx *c)
{
	const struct dg_shape *in = &c->in[0].shape;
	int64_t perm[DG_MAX_DIMS];
	int n;
	enum dg_status st = transpose_perm(dg_attrs_of_json(c->attrs), in->ndim, perm, &n, c->err);

	/* A refused perm may hold any index: it must not be used. */
	if (st != DG_OK)
		return st;
	c->out[0].dtype = c->in[0].dtype;
	c->out[0].shape.ndim = n;
	for (int i = 0; i < n; i++)
		c->out[0].shape.dim[i] = in->ndim < 0 ? -1 : in->dim[perm[i]];
	return DG_OK;
}

/* out[j * ldo + i] = in[i * ldi + j] for i < rows, j < cols: a 2-d transpose
 * between matrices with leading dimensions ldi and ldo, in TILE x TILE blocks
 * so that both the reads and the writes of a block stay in cache. */
#define TILE 32
typedef void (*tr2d_fn)(void *restrict dst, const void *restrict src, int64_t rows,
			int64_t cols, int64_t ldi, int64_t ldo);
#define DEF_TR2D(name, T)                                                                \
	static void name(void *restrict dst, const void *restrict src, int64_t rows,     \
			 int64_t cols, int64_t ldi, int64_t ldo)                         \
	{                                                                                \
		T *restrict o = dst;                                                     \
		const T *restrict s = src;                                               \
		for (int64_t i0 = 0; i0 < rows; i0 += TILE) {                            \
			int64_t i1 = i0 + TILE < rows ? i0 + TILE : rows;                \
			for (int64_t j0 = 0; j0 < cols; j0 += TILE) {                    \
				int64_t j1 = j0 + TILE < cols ? j0 + TILE : cols;        \
				for (int64_t j = j0; j < j1; j++)                        \
					for (int64_t i = i0; i < i1; i++)                \
						o[j * ldo + i] = s[i * ldi + j];         \
			}                                                                \
		}                                                                        \
	}
DEF_TR2D(tr2d_1, uint8_t)
DEF_TR2D(tr2d_2, uint16_t)
DEF_TR2D(tr2d_4, uint32_t)
DEF_TR2D(tr2d_8, uint64_t)

/* Reduce a transpose to its essence: drop size-1 input axes and merge input
 * axes that stay adjacent and in order in the output (they move as one
 * block). D gets the merged input dims, P the merged perm; returns the rank. */
static int transpose_reduce(const struct dg_shape *in, const int64_t *perm, int64_t *D, int *P)
{
	int newax[DG_MAX_DIMS], pp[DG_MAX_DIMS], pos[DG_MAX_DIMS], rid[DG_MAX_DIMS];
	int64_t dd[DG_MAX_DIMS];
	int m = 0, k = 0, q = 0;

	for (int a = 0; a < in->ndim; a++) {
		newax[a] = in->dim[a] == 1 ? -1 : m;
		if (in->dim[a] != 1)
			dd[m++] = in->dim[a];
	}
	for (int i = 0; i < in->ndim; i++)
		if (newax[perm[i]] >= 0)
			pp[k++] = newax[perm[i]];
	for (int i = 0; i < m; i++)
		pos[pp[i]] = i;
	/* Axis a joins a-1's run when it directly follows a-1 in the output. */
	for (int a = 0; a < m; a++) {
		if (a > 0 && pos[a] == pos[a - 1] + 1) {
			rid[a] = rid[a - 1];
			D[rid[a]] *= dd[a];
		} else {
			rid[a] = q;
			D[q++] = dd[a];
		}
	}
	k = 0;
	for (int i = 0; i < m; i++)
		if (i == 0 || rid[pp[i]] != rid[pp[i - 1]])
			P[k++] = rid[pp[i]];
	return q;
}

/* y = x transposed by perm, on the reduced problem (q dims D, perm P). When
 * the input's last axis stays last, rows are contiguous on both sides and a
 * strided view copies them whole. Otherwise the output's last axis (input
 * axis a) and the input's last axis (output position p) form a 2-d tile
 * problem, repeated for every index of the other output positions. */
static void transpose_copy(void *dst, const void *src, const struct dg_tensor *x,
			   const int64_t *perm, size_t es)
{
	int64_t D[DG_MAX_DIMS], S[DG_MAX_DIMS], OS[DG_MAX_DIMS], idx[DG_MAX_DIMS] = { 0 };
	int64_t soff = 0, doff = 0;
	int P[DG_MAX_DIMS], p = 0, a, k;
	int q = transpose_reduce(&x->shape, perm, D, P);
	struct dg_shape rs = { .ndim = q }, os = { .ndim = q };
	tr2d_fn tr = es == 1 ? tr2d_1 : es == 2 ? tr2d_2 : es == 4 ? tr2d_4 : tr2d_8;

	if (q <= 1) {
		memcpy(dst, src, x->nbytes);          /* the order did not change */
		return;
	}
	for (int i = 0; i < q; i++) {
		rs.dim[i] = D[i];
		os.dim[i] = D[P[i]];
		if (P[i] == q - 1)
			p = i;
	}
	contiguous_strides(&rs, S);
	contiguous_strides(&os, OS);
	if (p == q - 1) {
		struct view v = { .nd = q };
		for (int i = 0; i < q; i++) {
			v.dim[i] = os.dim[i];
			v.st[i] = S[P[i]];
		}
		view_copy(dst, src, &v, es);
		return;
	}
	a = P[q - 1];
	for (;;) {
		tr((char *)dst + doff * (int64_t)es, (const char *)src + soff * (int64_t)es, D[a],
		   D[q - 1], S[a], OS[p]);
		for (k = q - 2; k >= 0; k--) {
			if (k == p)
				continue;
			soff += S[P[k]];
			doff += OS[k];
			if (++idx[k] < os.dim[k])
				break;
			soff -= S[P[k]] * os.dim[k];
			doff -= OS[k] * os.dim[k];
			idx[k] = 0;
		}
		if (k < 0)
			return;
	}
}

/* perm is checked against the actual rank; y's dim i is x's dim perm[i]. */
static enum dg_status transpose_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0];
	int64_t perm[DG_MAX_DIMS];
	struct dg_shape os = { .ndim = x->shape.ndim };
	struct dg_tensor *y;
	int n;
	enum dg_status st = transpose_perm(c->attrs, x->shape.ndim, perm, &n, c->err);

	if (st != DG_OK)
		return st;
	for (int i = 0; i < n; i++)
		os.dim[i] = x->shape.dim[perm[i]];
	y = cpu_out(c, 0, x->dtype, &os);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (y->numel > 0)
		transpose_copy(y->data, x->data, x, perm, dg_dtype_size(x->dtype));
	return DG_OK;
}

static const struct dg_attr_spec transpose_attrs[] = {
	{ "perm", DG_ATTR_INTS, false, "output dim i is input dim perm[i]; default reversed" },
	{ 0 },
};

/* --- ExpandDims, Squeeze ------------------------------------------------ */

/* Both only relabel the shape: C order makes the bytes identical. */

/* y's shape is x's with a 1 inserted at axis; axis -1 appends, like NumPy. */
static enum dg_status expand_dims_plan(struct dg_attrs attrs, const struct dg_shape *in,
				       struct dg_shape *out, struct dg_err *err)
{
	int64_t axis;
	int r = in->ndim;
	enum dg_status st = dg_attrs_int(attrs, "axis", NULL, &axis, err);

	if (st != DG_OK)
		return st;
	if (r < 0) {
		out->ndim = -1;
		return DG_OK;
	}
	if (r == DG_MAX_DIMS) {
		return dg_err_set(err, DG_EINVAL,
				"cannot add a dim to the input %s: at most %d dims are allowed",
				shape_text(in).s, DG_MAX_DIMS);
	}
	if (axis < -r - 1 || axis > r) {
		return dg_err_set(err, DG_EINVAL, "axis %lld is out of range %d..%d for input %s",
				  (long long)axis, -r - 1, r, shape_text(in).s);
	}
	if (axis < 0)
		axis += r + 1;
	out->ndim = r + 1;
	for (int k = 0, j = 0; k <= r; k++)
		out->dim[k] = k == axis ? 1 : in->dim[j++];
	return DG_OK;
}

/* y's shape is x's without the listed size-1 dims (all size-1 dims when the
 * list is absent or empty). An unknown dim named in the list is taken to be 1,
 * and the kernel checks it once the size is known. */
static enum dg_status squeeze_plan(struct dg_attrs attrs, const struct dg_shape *in,
				   struct dg_shape *out, struct dg_err *err)
{
	int64_t axes[DG_MAX_DIMS];
	bool drop[DG_MAX_DIMS] = { false };
	int n;
	enum dg_status st = dg_attrs_ints(attrs, "axis", false, axes, DG_MAX_DIMS, &n, err);

	if (st != DG_OK)
		return st;
	out->ndim = -1;
	if (in->ndim < 0)
		return DG_OK;
	for (int i = 0; i < n; i++) {
		int a;
		st = cpu_axis(axes[i], in->ndim, &a, err);
		if (st != DG_OK)
			return st;
		if (in->dim[a] > 1 || in->dim[a] == 0) {
			return dg_err_set(err, DG_EINVAL,
					"cannot squeeze dim %d of size %lld in shape %s; only "
					"size-1 dims can be removed", a, (long long)in->dim[a],
					shape_text(in).s);
		}
		drop[a] = true;
	}
	/* No axes: every size-1 dim goes; an unknown size might be 1, so the
	 * result rank is unknown then. */
	for (int k = 0; n == 0 && k < in->ndim; k++) {
		if (in->dim[k] < 0)
			return DG_OK;
		drop[k] = in->dim[k] == 1;
	}
	out->ndim = 0;
	for (int k = 0; k < in->ndim; k++)
		if (!drop[k])
			out->dim[out->ndim++] = in->dim[k];
	return DG_OK;
}

static enum dg_status expand_dims_infer(struct dg_infer_ctx *c)
{
	c->out[0].dtype = c->in[0].dtype;
	return expand_dims_plan(dg_attrs_of_json(c->attrs), &c->in[0].shape, &c->out[0].shape, c->err);
}

static enum dg_status squeeze_infer(struct dg_infer_ctx *c)
{
	c->out[0].dtype = c->in[0].dtype;
	return squeeze_plan(dg_attrs_of_json(c->attrs), &c->in[0].shape, &c->out[0].shape, c->err);
}

static enum dg_status expand_dims_cpu(struct dg_kernel_ctx *c)
{
	return relabel_cpu(c, expand_dims_plan);
}

static enum dg_status squeeze_cpu(struct dg_kernel_ctx *c)
{
	return relabel_cpu(c, squeeze_plan);
}

static const struct dg_attr_spec expand_dims_attrs[] = {
	{ "axis", DG_ATTR_INT, true, "where the new size-1 dim goes, in -rank-1..rank" },
	{ 0 },
};

static const struct dg_attr_spec squeeze_attrs[] = {
	{ "axis", DG_ATTR_INTS, false, "size-1 dims to remove; default all of them" },
	{ 0 },
};

/* --- Size, Shape -------------------------------------------------------- */

/* Metadata as tensors: Size is the element count (0-d), Shape the dims (1-d
 * of length rank). out_type int32 (TensorFlow's default) must hold every
 * value: a wrapped count would silently corrupt whatever consumes it. */

/* The attr out_type: int32 by default, int64 allowed, nothing else. */
static enum dg_status out_type(struct dg_attrs attrs, enum dg_dtype *dt, struct dg_err *err)
{
	static const enum dg_dtype def = DG_I32;
	enum dg_status st = dg_attrs_dtype(attrs, "out_type", &def, dt, err);

	if (st == DG_OK && *dt != DG_I32 && *dt != DG_I64) {
		return dg_err_set(err, DG_EDTYPE, "attr 'out_type' is %s; only int32 and int64 are "
				  "allowed", dg_dtype_name(*dt));
	}
	return st;
}

/* DG_ETOOLARGE when v (a count or a dim, never negative) overflows dt. */
static enum dg_status fits(enum dg_dtype dt, int64_t v, const char *what, struct dg_err *err)
{
	if (dt == DG_I32 && v > INT32_MAX) {
		dg_err_set(err, DG_ETOOLARGE, "%s %lld does not fit int32", what, (long long)v);
		dg_err_hint(err, "set attr out_type to int64");
		return DG_ETOOLARGE;
	}
	return DG_OK;
}

static enum dg_status size_infer(struct dg_infer_ctx *c)
{
	int64_t n;
	enum dg_status st = out_type(dg_attrs_of_json(c->attrs), &c->out[0].dtype, c->err);

	c->out[0].shape.ndim = 0;
	if (st != DG_OK || !dg_shape_is_known(&c->in[0].shape))
		return st;
	st = dg_shape_numel(&c->in[0].shape, &n, c->err);
	return st != DG_OK ? st : fits(c->out[0].dtype, n, "element count", c->err);
}

static enum dg_status size_cpu(struct dg_kernel_ctx *c)
{
	static const struct dg_shape scalar = { .ndim = 0 };
	enum dg_dtype dt;
	struct dg_tensor *y;
	int64_t n = c->in[0]->numel;
	enum dg_status st = out_type(c->attrs, &dt, c->err);

	if (st == DG_OK)
		st = fits(dt, n, "element count", c->err);
	if (st != DG_OK)
		return st;
	y = cpu_out(c, 0, dt, &scalar);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	if (dt == DG_I32)
		*(int32_t *)y->data = (int32_t)n;
	else
		*(int64_t *)y->data = n;
	return DG_OK;
}

static enum dg_status shape_infer(struct dg_infer_ctx *c)
{
	const struct dg_shape *in = &c->in[0].shape;
	enum dg_status st = out_type(dg_attrs_of_json(c->attrs), &c->out[0].dtype, c->err);

	c->out[0].shape.ndim = 1;
	c->out[0].shape.dim[0] = in->ndim;    /* -1: [?] for an unknown rank */
	for (int k = 0; st == DG_OK && k < in->ndim; k++)
		st = fits(c->out[0].dtype, in->dim[k], "dimension", c->err);
	return st;
}

static enum dg_status shape_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_shape *in = &c->in[0]->shape;
	struct dg_shape os = { .ndim = 1, .dim = { in->ndim } };
	enum dg_dtype dt;
	struct dg_tensor *y;
	enum dg_status st = out_type(c->attrs, &dt, c->err);

	for (int k = 0; st == DG_OK && k < in->ndim; k++)
		st = fits(dt, in->dim[k], "dimension", c->err);
	if (st != DG_OK)
		return st;
	y = cpu_out(c, 0, dt, &os);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	for (int k = 0; k < in->ndim; k++) {
		if (dt == DG_I32)
			((int32_t *)y->data)[k] = (int32_t)in->dim[k];
		else
			((int64_t *)y->data)[k] = in->dim[k];
	}
	return DG_OK;
}

static const struct dg_attr_spec out_type_attrs[] = {
	{ "out_type", DG_ATTR_DTYPE, false, "int32 (default) or int64" },
	{ 0 },
};

/* --- Fill, ZerosLike, OnesLike ------------------------------------------ */

/* Constant tensors. The value is converted once to the element's bytes and
 * then replicated by fill_pattern, so the loop is the same for every dtype of
 * one size. */

/* The bytes of one element of dt holding the attr 'value'. Integers are read
 * exactly from JSON (int64 beyond 2^53 included); a real must be integral for
 * integer dtypes, and every value must fit its dtype (no silent wrap or
 * saturation). */
static enum dg_status fill_value(struct dg_attrs attrs, enum dg_dtype dt, void *bytes,
				 struct dg_err *err)
{
	const json_t *v = has_attr(attrs, "value") ? dg_attrs_get(attrs, "value") : NULL;
	double d;
	int64_t i;
	enum dg_status st = dg_attrs_float(attrs, "value", NULL, &d, err);

	if (st != DG_OK)
		return st;
	if (dt == DG_F64) {
		memcpy(bytes, &d, 8);
		return DG_OK;
	}
	if (dt == DG_F32) {
		if (fabs(d) > FLT_MAX)
			goto range;
		float f = (float)d;
		memcpy(bytes, &f, 4);
		return DG_OK;
	}
	if (dg_dtype_is_half(dt)) {
		/* A finite value that rounds to inf does not fit (as for float32). */
		uint16_t h = dt == DG_F16 ? dg_f64_to_f16(d) : dg_f64_to_bf16(d);
		if (isfinite(d) && (h & 0x7fff) == (dt == DG_F16 ? 0x7c00 : 0x7f80))
			goto range;
		memcpy(bytes, &h, 2);
		return DG_OK;
	}
	if (json_is_integer(v)) {
		i = json_integer_value(v);
	} else if (d == floor(d) && d >= -0x1p63 && d < 0x1p63) {
		i = (int64_t)d;
	} else {
		dg_err_set(err, DG_EINVAL, "attr 'value' = %g is not an integer, as %s needs", d,
			   dg_dtype_name(dt));
		return DG_EINVAL;
	}
	switch (dt) {
	case DG_I64:
		memcpy(bytes, &i, 8);
		return DG_OK;
	case DG_I32:
		if (i < INT32_MIN || i > INT32_MAX)
			goto range;
		int32_t i32 = (int32_t)i;
		memcpy(bytes, &i32, 4);
		return DG_OK;
	default: /* uint8, bool */
		if (i < 0 || i > (dt == DG_BOOL ? 1 : 255))
			goto range;
		*(uint8_t *)bytes = (uint8_t)i;
		return DG_OK;
	}
range:
	dg_err_set(err, DG_EINVAL, "attr 'value' = %.17g does not fit %s", d, dg_dtype_name(dt));
	if (dt == DG_BOOL)
		dg_err_hint(err, "bool fills take 0 or 1");
	return DG_EINVAL;
}

/* Shared by infer and kernel, so both refuse exactly the same attrs. */
static enum dg_status fill_plan(struct dg_attrs attrs, enum dg_dtype *dt, struct dg_shape *shape,
				uint64_t *bytes, struct dg_err *err)
{
	static const enum dg_dtype def = DG_F32;
	enum dg_status st = dg_attrs_dtype(attrs, "dtype", &def, dt, err);

	if (st == DG_OK)
		st = dg_attrs_shape(attrs, "shape", true, false, shape, err);
	if (st == DG_OK)
		st = fill_value(attrs, *dt, bytes, err);
	return st;
}

static enum dg_status fill_infer(struct dg_infer_ctx *c)
{
	uint64_t bytes;

	return fill_plan(dg_attrs_of_json(c->attrs), &c->out[0].dtype, &c->out[0].shape, &bytes, c->err);
}

static enum dg_status fill_cpu(struct dg_kernel_ctx *c)
{
	enum dg_dtype dt;
	struct dg_shape shape;
	uint64_t bytes;
	struct dg_tensor *y;
	enum dg_status st = fill_plan(c->attrs, &dt, &shape, &bytes, c->err);

	if (st != DG_OK)
		return st;
	y = cpu_out(c, 0, dt, &shape);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	fill_pattern(y->data, &bytes, dg_dtype_size(dt), y->numel);
	return DG_OK;
}

static const struct dg_attr_spec fill_attrs[] = {
	{ "shape", DG_ATTR_SHAPE, true, "shape of the result" },
	{ "value", DG_ATTR_FLOAT, true, "the value of every element (must fit dtype)" },
	{ "dtype", DG_ATTR_DTYPE, false, "element type (default float32)" },
	{ 0 },
};

/* ZerosLike and OnesLike keep x's dtype and (possibly partial) shape. */
static enum dg_status like_infer(struct dg_infer_ctx *c)
{
	c->out[0] = c->in[0];
	return DG_OK;
}

static enum dg_status zeros_like_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0];

	if (!cpu_out_zero(c, 0, x->dtype, &x->shape))
		return c->err ? c->err->code : DG_ENOMEM;
	return DG_OK;
}

static enum dg_status ones_like_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0];
	union {
		float f32;
		double f64;
		int32_t i32;
		int64_t i64;
		uint16_t f16;   /* float16 or bfloat16 bits */
		uint8_t u8;
	} one;
	struct dg_tensor *y = cpu_out(c, 0, x->dtype, &x->shape);

	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	switch (x->dtype) {
	case DG_F32: one.f32 = 1.0f; break;
	case DG_F64: one.f64 = 1.0; break;
	case DG_I32: one.i32 = 1; break;
	case DG_I64: one.i64 = 1; break;
	case DG_F16: one.f16 = 0x3c00; break;
	case DG_BF16: one.f16 = 0x3f80; break;
	default: one.u8 = 1; break;      /* uint8 and bool (true) */
	}
	fill_pattern(y->data, &one, dg_dtype_size(x->dtype), y->numel);
	return DG_OK;
}

/* --- Gather, UnsortedSegmentSum ----------------------------------------- */

/* Rows addressed by an integer tensor: Gather reads the rows of params that
 * indices names, UnsortedSegmentSum adds each row of data into the row its id
 * names. One is the other's gradient (kernels/cpu/grad.c), and the master
 * turns Gather's into a row-wise update of an embedding table, so both check
 * every index: a row outside the table is an error here, never a silent
 * zero or a read past the end. */

static bool is_index_dtype(enum dg_dtype dt)
{
	return dt == DG_I32 || dt == DG_I64;
}

static enum dg_status need_index(enum dg_dtype dt, const char *what, struct dg_err *err)
{
	if (is_index_dtype(dt))
		return DG_OK;
	dg_err_set(err, DG_EDTYPE, "%s are %s; they must be int32 or int64", what,
		   dg_dtype_name(dt));
	dg_err_hint(err, "Cast them to int32 or int64 first");
	return DG_EDTYPE;
}

/* Element i of an int32 or int64 tensor. */
static inline int64_t index_at(const struct dg_tensor *ix, int64_t i)
{
	return ix->dtype == DG_I32 ? ((const int32_t *)ix->data)[i] :
				     ((const int64_t *)ix->data)[i];
}

/* DG_EINVAL for element i (value v) of an index tensor of shape ix, called
 * what, that is outside [0, n): named by its multi-index ("indices[1,2] =
 * 7"), as TensorFlow does, so the offending example can be found in the
 * batch. The caller adds the hint. */
static enum dg_status index_outside(const struct dg_shape *ix, const char *what, int64_t i,
				    int64_t v, int64_t n, const char *limit, struct dg_err *err)
{
	int64_t idx[DG_MAX_DIMS], rest = i;

	for (int k = ix->ndim - 1; k >= 0; k--) {
		idx[k] = rest % ix->dim[k];     /* dims >= 1: ix has element i */
		rest /= ix->dim[k];
	}
	return dg_err_set(err, DG_EINVAL, "%s%s = %lld is not in [0, %lld): %s is %lld", what,
			  ix->ndim ? ints_text(idx, ix->ndim).s : "", (long long)v, (long long)n,
			  limit, (long long)n);
}

enum dg_status cpu_gather_index_err(const struct dg_shape *ix, int64_t i, int64_t v, int64_t rows,
				    struct dg_err *err)
{
	index_outside(ix, "indices", i, v, rows, "params' row count", err);
	dg_err_hint(err, "every index must name a row of params (its dim 0)");
	return DG_EINVAL;
}

enum dg_status cpu_segment_id_err(const struct dg_shape *ix, int64_t i, int64_t v, int64_t num,
				  struct dg_err *err)
{
	index_outside(ix, "segment_ids", i, v, num, "num_segments", err);
	dg_err_hint(err, v < 0 ? "TensorFlow drops rows with a negative id; dg refuses them: "
		    "leave those rows out of data" : "raise num_segments or fix the ids");
	return DG_EINVAL;
}

/* Gather(params, indices): y[i..., j...] = params[indices[i...], j...], so y's
 * shape is indices' followed by params' without dim 0. Only axis 0, the
 * default of tf.gather: the rows of a table, which is what embeddings and the
 * row-wise updates read. Shared by inference and kernel; out gets y's shape
 * (unknown rank when either rank is unknown, unknown dims carried over). */
static enum dg_status gather_plan(struct dg_attrs attrs, const struct dg_ttype *params,
				  const struct dg_ttype *indices, struct dg_shape *out,
				  struct dg_err *err)
{
	static const int64_t zero = 0;
	const struct dg_shape *ps = &params->shape, *is = &indices->shape;
	int64_t axis;
	enum dg_status st = dg_attrs_int(attrs, "axis", &zero, &axis, err);

	if (st != DG_OK)
		return st;
	if (axis != 0) {
		dg_err_set(err, DG_EINVAL, "attr 'axis' is %lld; Gather takes rows only (axis 0)",
			   (long long)axis);
		dg_err_hint(err, "Transpose params so that the dim to index comes first");
		return DG_EINVAL;
	}
	st = need_index(indices->dtype, "the indices", err);
	if (st != DG_OK)
		return st;
	if (ps->ndim == 0) {
		dg_err_set(err, DG_ESHAPE, "params is a scalar; Gather takes rows of a tensor "
			   "of rank >= 1");
		return DG_ESHAPE;
	}
	out->ndim = -1;
	if (ps->ndim < 0 || is->ndim < 0)
		return DG_OK;
	if (is->ndim + ps->ndim - 1 > DG_MAX_DIMS) {
		return dg_err_set(err, DG_ESHAPE, "indices %s and params %s give a result of rank "
				  "%d; at most %d dims are allowed", shape_text(is).s,
				  shape_text(ps).s, is->ndim + ps->ndim - 1, DG_MAX_DIMS);
	}
	*out = *is;
	for (int k = 1; k < ps->ndim; k++)
		out->dim[out->ndim++] = ps->dim[k];
	return DG_OK;
}

static enum dg_status gather_infer(struct dg_infer_ctx *c)
{
	c->out[0].dtype = c->in[0].dtype;
	return gather_plan(dg_attrs_of_json(c->attrs), &c->in[0], &c->in[1], &c->out[0].shape,
			   c->err);
}

/* Rows are contiguous in C order: one memcpy per index, whatever the dtype. */
static enum dg_status gather_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *p = c->in[0], *ix = c->in[1];
	struct dg_ttype tp = cpu_ttype(p), ti = cpu_ttype(ix);
	struct dg_shape os;
	struct dg_tensor *y;
	int64_t rows;
	size_t rb;
	enum dg_status st = gather_plan(c->attrs, &tp, &ti, &os, c->err);

	if (st != DG_OK)
		return st;
	y = cpu_out(c, 0, p->dtype, &os);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	/* From the dims, not nbytes / rows: a table of 0 rows still has a row size. */
	rows = p->shape.dim[0];
	rb = (size_t)dims_prod(&p->shape, 1, p->shape.ndim) * dg_dtype_size(p->dtype);
	for (int64_t i = 0; i < ix->numel; i++) {
		int64_t r = index_at(ix, i);
		if (r < 0 || r >= rows)
			return cpu_gather_index_err(&ix->shape, i, r, rows, c->err);
		if (rb)
			memcpy((char *)y->data + (size_t)i * rb,
			       (const char *)p->data + (size_t)r * rb, rb);
	}
	return DG_OK;
}

static const struct dg_attr_spec gather_attrs[] = {
	{ "axis", DG_ATTR_INT, false, "only 0 (the default): rows; other axes are refused" },
	{ 0 },
};

/* UnsortedSegmentSum(data, segment_ids; num_segments): y[s, j...] = the sum of
 * data[i..., j...] over every i with segment_ids[i...] = s, so segment_ids'
 * shape is a prefix of data's and y's shape is [num_segments] followed by the
 * rest of data's; a segment no id names is 0. TensorFlow's op with
 * num_segments as an attr (the row count must be known when the graph is
 * built, as a table's is). TensorFlow drops rows with a negative id; here any
 * id outside [0, num_segments) is an error: a dropped row is a lost gradient. */
static enum dg_status segment_sum_plan(struct dg_attrs attrs, const struct dg_ttype *data,
				       const struct dg_ttype *ids, int64_t *num,
				       struct dg_shape *out, struct dg_err *err)
{
	const struct dg_shape *ds = &data->shape, *is = &ids->shape;
	enum dg_status st = dg_attrs_int(attrs, "num_segments", NULL, num, err);

	if (st != DG_OK)
		return st;
	if (*num < 0 || *num > DG_MAX_NUMEL) {
		return dg_err_set(err, DG_EINVAL, "attr 'num_segments' must be in 0..2^48, got "
				  "%lld", (long long)*num);
	}
	if (data->dtype != DG_F32 && data->dtype != DG_F64 && !is_index_dtype(data->dtype)) {
		return dg_err_set(err, DG_EDTYPE, "data is %s; UnsortedSegmentSum adds float32, "
				  "float64, int32 or int64", dg_dtype_name(data->dtype));
	}
	st = need_index(ids->dtype, "the segment_ids", err);
	if (st != DG_OK)
		return st;
	out->ndim = -1;
	if (ds->ndim < 0 || is->ndim < 0)
		return DG_OK;
	bool prefix = is->ndim <= ds->ndim;
	for (int k = 0; prefix && k < is->ndim; k++)
		prefix = is->dim[k] < 0 || ds->dim[k] < 0 || is->dim[k] == ds->dim[k];
	if (!prefix) {
		dg_err_set(err, DG_ESHAPE, "segment_ids %s is not a prefix of data's shape %s",
			   shape_text(is).s, shape_text(ds).s);
		dg_err_hint(err, "give one id per row of data: segment_ids' shape is the leading "
			    "dims of data's");
		return DG_ESHAPE;
	}
	if (1 + ds->ndim - is->ndim > DG_MAX_DIMS) {
		return dg_err_set(err, DG_ESHAPE, "scalar segment_ids add a dim to data %s; at "
				  "most %d dims are allowed", shape_text(ds).s, DG_MAX_DIMS);
	}
	out->ndim = 1 + ds->ndim - is->ndim;
	out->dim[0] = *num;
	for (int k = is->ndim; k < ds->ndim; k++)
		out->dim[1 + k - is->ndim] = ds->dim[k];
	return DG_OK;
}

static enum dg_status segment_sum_infer(struct dg_infer_ctx *c)
{
	int64_t num;

	c->out[0].dtype = c->in[0].dtype;
	return segment_sum_plan(dg_attrs_of_json(c->attrs), &c->in[0], &c->in[1], &num,
				&c->out[0].shape, c->err);
}

/* d[0..n) += s[0..n). The integer sums add as unsigned, so an overflow wraps
 * (two's complement, as TensorFlow's kernels do in practice) where a signed
 * add would be undefined. */
typedef void (*add_row_fn)(void *restrict dst, const void *restrict src, int64_t n);

#define DEF_ADD_ROW(name, T)                                                             \
	static void name(void *restrict dst, const void *restrict src, int64_t n)        \
	{                                                                                \
		T *restrict d = dst;                                                     \
		const T *restrict s = src;                                               \
		for (int64_t i = 0; i < n; i++)                                          \
			d[i] += s[i];                                                    \
	}
DEF_ADD_ROW(add_row_f32, float)
DEF_ADD_ROW(add_row_f64, double)
DEF_ADD_ROW(add_row_u32, uint32_t)
DEF_ADD_ROW(add_row_u64, uint64_t)

/* Rows in the order of the ids: each adds into its segment's row of y. */
static enum dg_status segment_sum_cpu(struct dg_kernel_ctx *c)
{
	const struct dg_tensor *x = c->in[0], *ids = c->in[1];
	struct dg_ttype tx = cpu_ttype(x), ti = cpu_ttype(ids);
	struct dg_shape os;
	struct dg_tensor *y;
	int64_t num, inner;
	size_t es = dg_dtype_size(x->dtype);
	add_row_fn add = x->dtype == DG_F32 ? add_row_f32 : x->dtype == DG_F64 ? add_row_f64 :
			 x->dtype == DG_I32 ? add_row_u32 : add_row_u64;
	enum dg_status st = segment_sum_plan(c->attrs, &tx, &ti, &num, &os, c->err);

	if (st != DG_OK)
		return st;
	y = cpu_out_zero(c, 0, x->dtype, &os);
	if (!y)
		return c->err ? c->err->code : DG_ENOMEM;
	inner = dims_prod(&x->shape, ids->shape.ndim, x->shape.ndim);
	for (int64_t i = 0; i < ids->numel; i++) {
		int64_t s = index_at(ids, i);
		if (s < 0 || s >= num)
			return cpu_segment_id_err(&ids->shape, i, s, num, c->err);
		if (inner)
			add((char *)y->data + (size_t)(s * inner) * es,
			    (const char *)x->data + (size_t)(i * inner) * es, inner);
	}
	return DG_OK;
}

static const struct dg_attr_spec segment_sum_attrs[] = {
	{ "num_segments", DG_ATTR_INT, true, "rows of the result (>= 0); every id must be below "
	  "it" },
	{ 0 },
};

/* --- the table ---------------------------------------------------------- */

struct dg_op_def dg_ops_array[] = {
	{ "Slice", 1, 1, 1, NULL, slice_attrs, slice_infer, slice_cpu, NULL, cpu_grad_slice, 0,
	  "x[begin : begin + size] per dimension" },
	{ "StridedSlice", 1, 1, 1, NULL, strided_slice_attrs, strided_slice_infer,
	  strided_slice_cpu, NULL, NULL, 0,
	  "NumPy basic indexing x[b:e:s, ..., i, newaxis] with TensorFlow's masks" },
	{ "Concat", 1, -1, 1, NULL, concat_attrs, concat_infer, concat_cpu, NULL,
	  cpu_grad_concat, 0, "join the inputs along axis" },
	{ "Split", 1, 1, 0, split_num_outputs, split_attrs, split_infer, split_cpu, NULL,
	  cpu_grad_split, 0,
	  "cut x along axis into num_split equal parts or parts of size_splits" },
	{ "Reshape", 1, 1, 1, NULL, reshape_attrs, reshape_infer, reshape_cpu, NULL,
	  cpu_grad_reshape_like, 0, "same elements in C order, new shape" },
	{ "Transpose", 1, 1, 1, NULL, transpose_attrs, transpose_infer, transpose_cpu, NULL,
	  cpu_grad_transpose, 0, "permute the dimensions: out dim i = in dim perm[i]" },
	{ "ExpandDims", 1, 1, 1, NULL, expand_dims_attrs, expand_dims_infer, expand_dims_cpu,
	  NULL, cpu_grad_reshape_like, 0, "insert a size-1 dimension at axis" },
	{ "Squeeze", 1, 1, 1, NULL, squeeze_attrs, squeeze_infer, squeeze_cpu, NULL,
	  cpu_grad_reshape_like, 0, "remove size-1 dimensions" },
	{ "Size", 1, 1, 1, NULL, out_type_attrs, size_infer, size_cpu, NULL, NULL, 0,
	  "number of elements of x, as a scalar" },
	{ "Shape", 1, 1, 1, NULL, out_type_attrs, shape_infer, shape_cpu, NULL, NULL, 0,
	  "the dimensions of x, as a 1-d tensor" },
	{ "Fill", 0, 0, 1, NULL, fill_attrs, fill_infer, fill_cpu, NULL, NULL, DG_OPF_SOURCE,
	  "a tensor of the given shape and dtype with every element = value" },
	{ "ZerosLike", 1, 1, 1, NULL, no_attrs, like_infer, zeros_like_cpu, NULL, NULL, 0,
	  "zeros of x's dtype and shape" },
	{ "OnesLike", 1, 1, 1, NULL, no_attrs, like_infer, ones_like_cpu, NULL, NULL, 0,
	  "ones (true for bool) of x's dtype and shape" },
	{ "Gather", 2, 2, 1, NULL, gather_attrs, gather_infer, gather_cpu, NULL, cpu_grad_gather,
	  0, "the rows of params (input 0) that indices (input 1, int32 or int64) names: shape "
	  "indices' + params' without dim 0; axis 0 only; an index outside [0, rows) is an "
	  "error" },
	{ "UnsortedSegmentSum", 2, 2, 1, NULL, segment_sum_attrs, segment_sum_infer,
	  segment_sum_cpu, NULL, cpu_grad_unsorted_segment_sum, 0,
	  "y[s] = sum of the rows of data (input 0) whose segment_ids (input 1, a prefix of "
	  "data's shape) are s: shape [num_segments] + data's remaining dims; 0 where no id "
	  "is s; an id outside [0, num_segments) is an error (TensorFlow drops negative ids)" },
	{ 0 },
};
