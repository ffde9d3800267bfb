/* Elementwise CPU kernels: unary math (Neg .. Tanh), binary arithmetic with NumPy
 * broadcasting (Add .. Minimum), comparisons, Where and Cast. Every (op, dtype)
 * pair is its own typed loop stamped out by a macro, so hot loops hold no switch
 * and no per-element call; broadcasting runs a collapsed N-d iterator whose
 * innermost dimension is one of those tight loops. Registered via dg_ops_eltwise. */
#include "cpu.h"
#include "grad.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Shared checks and error text                                               */

/* cpu_out failed: its code is in c->err, unless the caller passed no carrier. */
static enum dg_status out_failed(const struct dg_kernel_ctx *c)
{
	return c->err ? c->err->code : DG_ENOMEM;
}

static bool dtype_ok(enum dg_dtype dt)
{
	return (unsigned)dt < DG_DTYPE_COUNT;
}

/* Kernels are reachable with raw tensors (dg_op_run, the executor); a missing
 * input is the caller's mistake, reported rather than dereferenced. */
static enum dg_status check_inputs(const struct dg_kernel_ctx *c, int n)
{
	if (c->n_in != n || c->n_out < 1)
		return dg_err_set(c->err, DG_EINVAL,
				  "expected %d inputs and 1 output, got %d and %d", n, c->n_in,
				  c->n_out);
	for (int i = 0; i < n; i++) {
		if (!c->in[i])
			return dg_err_set(c->err, DG_EINVAL, "input %d is missing", i);
		if (!dtype_ok(c->in[i]->dtype))
			return dg_err_set(c->err, DG_EDTYPE, "input %d has invalid dtype code %d",
					  i, (int)c->in[i]->dtype);
	}
	return DG_OK;
}

static enum dg_status unsupported(struct dg_err *err, const char *op, enum dg_dtype dt,
				  const char *hint)
{
	dg_err_set(err, DG_EDTYPE, "%s is not defined for %s", op, dg_dtype_name(dt));
	if (dg_dtype_is_half(dt))
		dg_err_hint(err, "%s is a storage dtype: Cast to float32 first (ops on it: Cast, "
			    "MatMul, Add, Sub, Mul, Relu, Where)", dg_dtype_name(dt));
	else
		dg_err_hint(err, "%s", hint);
	return DG_EDTYPE;
}

static enum dg_status differ(struct dg_err *err, enum dg_dtype a, enum dg_dtype b)
{
	dg_err_set(err, DG_EDTYPE, "dtypes %s and %s differ", dg_dtype_name(a), dg_dtype_name(b));
	dg_err_hint(err, "insert a Cast node so both inputs have the same dtype");
	return DG_EDTYPE;
}

/* ------------------------------------------------------------------------ */
/* Broadcast iterator                                                          */

/* The output is walked as rows of dim[nd-1] elements. Size-1 output dims are
 * dropped and neighbouring dims merged whenever every input steps through them
 * as through one dim, so same shapes become one flat row, scalar-with-tensor
 * one row with a stride-0 side, and [..., N] op [N] rows of N over a reused
 * operand: the fast paths fall out of the collapse. Invariant after init: the
 * innermost stride of every input is 0 (broadcast) or 1 (contiguous). */
#define MAX_BC_IN 3

struct bcast {
	int nd;                                 /* collapsed rank, >= 1 */
	int n_in;
	int64_t dim[DG_MAX_DIMS];               /* collapsed output dims, all > 1 (or one 1) */
	int64_t st[MAX_BC_IN][DG_MAX_DIMS];     /* element strides; 0 on broadcast dims */
	int64_t rows;                           /* product of dim[0 .. nd-2] */
};

/* shapes[k] broadcast to out (checked by dg_shape_broadcast before the call). */
static void bcast_init(struct bcast *bc, const struct dg_shape *out,
		       const struct dg_shape *const *shapes, int n_in)
{
	int64_t cst[MAX_BC_IN][DG_MAX_DIMS];   /* each input's own C-order strides */
	int nd = 0;

	bc->n_in = n_in;
	for (int k = 0; k < n_in; k++) {
		int64_t s = 1;
		for (int j = shapes[k]->ndim - 1; j >= 0; j--) {
			cst[k][j] = s;
			s *= shapes[k]->dim[j];
		}
	}
	for (int i = 0; i < out->ndim; i++) {
		if (out->dim[i] == 1)
			continue;   /* a size-1 dim never moves any offset */
		bc->dim[nd] = out->dim[i];
		for (int k = 0; k < n_in; k++) {
			int j = i - (out->ndim - shapes[k]->ndim);
			bool real = j >= 0 && shapes[k]->dim[j] != 1;
			bc->st[k][nd] = real ? cst[k][j] : 0;
		}
		nd++;
	}
	if (nd == 0) {   /* one element: a row of 1 */
		bc->dim[0] = 1;
		for (int k = 0; k < n_in; k++)
			bc->st[k][0] = 0;
		nd = 1;
	}
	/* Merge dim i into the kept dim w when, for every input, stepping w once
	 * equals stepping i across its whole extent. */
	int w = 0;
	for (int i = 1; i < nd; i++) {
		bool merge = true;
		for (int k = 0; k < n_in; k++)
			merge = merge && bc->st[k][w] == bc->st[k][i] * bc->dim[i];
		if (merge) {
			bc->dim[w] *= bc->dim[i];
		} else {
			w++;
			bc->dim[w] = bc->dim[i];
		}
		for (int k = 0; k < n_in; k++)
			bc->st[k][w] = bc->st[k][i];
	}
	bc->nd = w + 1;
	bc->rows = 1;
	for (int i = 0; i < bc->nd - 1; i++)
		bc->rows *= bc->dim[i];
}

/* Advance the outer index idx by one row, keeping the per-input element
 * offsets off[] in step (odometer over dims nd-2 .. 0). */
static void bcast_next(const struct bcast *bc, int64_t *idx, int64_t *off)
{
	for (int d = bc->nd - 2; d >= 0; d--) {
		for (int k = 0; k < bc->n_in; k++)
			off[k] += bc->st[k][d];
		if (++idx[d] < bc->dim[d])
			return;
		for (int k = 0; k < bc->n_in; k++)
			off[k] -= bc->st[k][d] * bc->dim[d];
		idx[d] = 0;
	}
}

/* ------------------------------------------------------------------------ */
/* Unary ops                                                                   */

typedef void (*un_loop)(int64_t n, const void *x, void *out);

struct un_op {
	const char *name;
	un_loop t[DG_DTYPE_COUNT];   /* NULL: dtype not supported */
	const char *hint;            /* said when the dtype is not supported */
};

/* out[i] = EXPR(x) over n contiguous elements of T. */
#define UN_LOOP(fn, T, EXPR)                                                                 \
	static void fn(int64_t n, const void *px, void *po)                                  \
	{                                                                                    \
		const T *restrict a = px;                                                    \
		T *restrict o = po;                                                          \
		for (int64_t i = 0; i < n; i++) {                                            \
			T x = a[i];                                                          \
			o[i] = (EXPR);                                                       \
		}                                                                            \
	}

/* Signed integer Neg/Abs/Square go through unsigned arithmetic: they wrap like
 * TensorFlow (Neg(INT_MIN) == INT_MIN) instead of hitting C undefined behaviour. */
UN_LOOP(neg_f32, float, -x)
UN_LOOP(neg_f64, double, -x)
UN_LOOP(neg_i32, int32_t, (int32_t)(0u - (uint32_t)x))
UN_LOOP(neg_i64, int64_t, (int64_t)((uint64_t)0 - (uint64_t)x))
UN_LOOP(abs_f32, float, fabsf(x))
UN_LOOP(abs_f64, double, fabs(x))
UN_LOOP(abs_i32, int32_t, x < 0 ? (int32_t)(0u - (uint32_t)x) : x)
UN_LOOP(abs_i64, int64_t, x < 0 ? (int64_t)((uint64_t)0 - (uint64_t)x) : x)
UN_LOOP(square_f32, float, x * x)
UN_LOOP(square_f64, double, x * x)
UN_LOOP(square_i32, int32_t, (int32_t)((uint32_t)x * (uint32_t)x))
UN_LOOP(square_i64, int64_t, (int64_t)((uint64_t)x * (uint64_t)x))
/* Relu keeps NaN (x != x) so a diverging model shows up instead of turning into 0. */
UN_LOOP(relu_f32, float, (x > 0 || x != x) ? x : 0.0f)
UN_LOOP(relu_f64, double, (x > 0 || x != x) ? x : 0.0)
UN_LOOP(relu_i32, int32_t, x > 0 ? x : 0)
UN_LOOP(relu_i64, int64_t, x > 0 ? x : 0)
/* 16-bit floats on their bits: a set sign bit gives +0 unless the value is NaN
 * (exponent all ones, fraction nonzero), exactly what relu_f32 does. */
UN_LOOP(relu_f16, uint16_t, (x & 0x8000) && (x & 0x7fff) <= 0x7c00 ? 0 : x)
UN_LOOP(relu_bf16, uint16_t, (x & 0x8000) && (x & 0x7fff) <= 0x7f80 ? 0 : x)
UN_LOOP(sqrt_f32, float, sqrtf(x))
UN_LOOP(sqrt_f64, double, sqrt(x))
UN_LOOP(exp_f32, float, expf(x))
UN_LOOP(exp_f64, double, exp(x))
UN_LOOP(log_f32, float, logf(x))
UN_LOOP(log_f64, double, log(x))
UN_LOOP(tanh_f32, float, tanhf(x))
UN_LOOP(tanh_f64, double, tanh(x))

/* Sigmoid never evaluates exp of a large positive number: for x < 0 it uses
 * e^x / (1 + e^x), so both tails go smoothly to 0 and 1 and NaN stays NaN. */
static inline float sigmoid_f32(float x)
{
	if (x >= 0)
		return 1.0f / (1.0f + expf(-x));
	float e = expf(x);
	return e / (1.0f + e);
}

static inline double sigmoid_f64(double x)
{
	if (x >= 0)
		return 1.0 / (1.0 + exp(-x));
	double e = exp(x);
	return e / (1.0 + e);
}

UN_LOOP(sigm_f32, float, sigmoid_f32(x))
UN_LOOP(sigm_f64, double, sigmoid_f64(x))

#define HINT_FLOAT "Cast to float32 first"
#define HINT_SIGNED "Cast to int32, int64, float32 or float64 first"
#define UN_NUM(fn) { [DG_F32] = fn##_f32, [DG_F64] = fn##_f64, [DG_I32] = fn##_i32, \
		     [DG_I64] = fn##_i64 }
#define UN_FLT(fn) { [DG_F32] = fn##_f32, [DG_F64] = fn##_f64 }

static const struct un_op op_neg = { "Neg", UN_NUM(neg), HINT_SIGNED };
static const struct un_op op_abs = { "Abs", UN_NUM(abs), HINT_SIGNED };
static const struct un_op op_square = { "Square", UN_NUM(square), HINT_SIGNED };
static const struct un_op op_relu = {
	"Relu",
	{ [DG_F32] = relu_f32, [DG_F64] = relu_f64, [DG_I32] = relu_i32, [DG_I64] = relu_i64,
	  [DG_F16] = relu_f16, [DG_BF16] = relu_bf16 },
	HINT_SIGNED,
};
static const struct un_op op_sqrt = { "Sqrt", UN_FLT(sqrt), HINT_FLOAT };
static const struct un_op op_exp = { "Exp", UN_FLT(exp), HINT_FLOAT };
static const struct un_op op_log = { "Log", UN_FLT(log), HINT_FLOAT };
static const struct un_op op_sigmoid = { "Sigmoid", UN_FLT(sigm), HINT_FLOAT };
static const struct un_op op_tanh = { "Tanh", UN_FLT(tanh), HINT_FLOAT };

static enum dg_status infer_unary(struct dg_infer_ctx *c, const struct un_op *op)
{
	enum dg_dtype dt = c->in[0].dtype;

	if (!dtype_ok(dt) || !op->t[dt])
		return unsupported(c->err, op->name, dt, op->hint);
	c->out[0] = c->in[0];
	return DG_OK;
}

static enum dg_status run_unary(struct dg_kernel_ctx *c, const struct un_op *op)
{
	enum dg_status st = check_inputs(c, 1);
	const struct dg_tensor *x;
	struct dg_tensor *y;

	if (st != DG_OK)
		return st;
	x = c->in[0];
	if (!op->t[x->dtype])
		return unsupported(c->err, op->name, x->dtype, op->hint);
	y = cpu_out(c, 0, x->dtype, &x->shape);
	if (!y)
		return out_failed(c);
	if (y->numel > 0)
		op->t[x->dtype](y->numel, x->data, y->data);
	return DG_OK;
}

/* ------------------------------------------------------------------------ */
/* Binary ops and comparisons                                                  */

/* A binary loop over n output elements: vv reads a[i], b[i]; vs reads a[i],
 * b[0]; sv reads a[0], b[i]. Returns 0, or BAD_* bits for integer errors (the
 * loop finishes its row; the kernel then fails as a whole). */
typedef int (*bin_loop)(int64_t n, const void *a, const void *b, void *out);

struct bin_loops {
	bin_loop vv, vs, sv;
};

struct bin_op {
	const char *name;
	bool to_bool;                           /* comparisons: output is bool */
	struct bin_loops t[DG_DTYPE_COUNT];     /* .vv == NULL: dtype not supported */
	const char *hint;
};

#define BAD_DIV0 1      /* integer division by zero */
#define BAD_DIVOVF 2    /* INT_MIN / -1 */
#define BAD_NEGEXP 4    /* integer Pow with a negative exponent */

/* One loop body, three operand layouts. EXPR sees x, y and may set `bad`. */
#define BIN_LOOP1(fn, TA, TO, EXPR, XI, YI)                                                  \
	static int fn(int64_t n, const void *pa, const void *pb, void *po)                   \
	{                                                                                    \
		const TA *restrict a = pa;                                                   \
		const TA *restrict b = pb;                                                   \
		TO *restrict o = po;                                                         \
		int bad = 0;                                                                 \
		for (int64_t i = 0; i < n; i++) {                                            \
			TA x = a[XI], y = b[YI];                                             \
			o[i] = (TO)(EXPR);                                                   \
		}                                                                            \
		return bad;                                                                  \
	}
#define BIN_LOOPS(fn, TA, TO, EXPR)                                                          \
	BIN_LOOP1(fn##_vv, TA, TO, EXPR, i, i)                                               \
	BIN_LOOP1(fn##_vs, TA, TO, EXPR, i, 0)                                               \
	BIN_LOOP1(fn##_sv, TA, TO, EXPR, 0, i)
#define BL(fn) { fn##_vv, fn##_vs, fn##_sv }

/* Signed add/sub/mul in unsigned: wrap-around like TensorFlow, never C UB. */
#define W32(op) (int32_t)((uint32_t)x op (uint32_t)y)
#define W64(op) (int64_t)((uint64_t)x op (uint64_t)y)

/* Truncating integer division (C semantics, TensorFlow's Div on ints). */
static inline int32_t div_i32(int32_t x, int32_t y, int *bad)
{
	if (y == 0 || (x == INT32_MIN && y == -1)) {
		*bad |= y == 0 ? BAD_DIV0 : BAD_DIVOVF;
		return 0;
	}
	return x / y;
}

static inline int64_t div_i64(int64_t x, int64_t y, int *bad)
{
	if (y == 0 || (x == INT64_MIN && y == -1)) {
		*bad |= y == 0 ? BAD_DIV0 : BAD_DIVOVF;
		return 0;
	}
	return x / y;
}

static inline uint8_t div_u8(uint8_t x, uint8_t y, int *bad)
{
	if (y == 0) {
		*bad |= BAD_DIV0;
		return 0;
	}
	return (uint8_t)(x / y);
}

/* b^e modulo 2^64 by squaring; narrower types truncate the result, which is
 * the same residue as computing in their own width. */
static inline uint64_t upow(uint64_t b, uint64_t e)
{
	uint64_t r = 1;

	while (e) {
		if (e & 1)
			r *= b;
		b *= b;
		e >>= 1;
	}
	return r;
}

static inline int32_t pow_i32(int32_t x, int32_t y, int *bad)
{
	if (y < 0) {
		*bad |= BAD_NEGEXP;
		return 0;
	}
	return (int32_t)(uint32_t)upow((uint64_t)(uint32_t)x, (uint64_t)y);
}

static inline int64_t pow_i64(int64_t x, int64_t y, int *bad)
{
	if (y < 0) {
		*bad |= BAD_NEGEXP;
		return 0;
	}
	return (int64_t)upow((uint64_t)x, (uint64_t)y);
}

BIN_LOOPS(add_f32, float, float, x + y)
BIN_LOOPS(add_f64, double, double, x + y)
BIN_LOOPS(add_i32, int32_t, int32_t, W32(+))
BIN_LOOPS(add_i64, int64_t, int64_t, W64(+))
BIN_LOOPS(add_u8, uint8_t, uint8_t, x + y)
BIN_LOOPS(sub_f32, float, float, x - y)
BIN_LOOPS(sub_f64, double, double, x - y)
BIN_LOOPS(sub_i32, int32_t, int32_t, W32(-))
BIN_LOOPS(sub_i64, int64_t, int64_t, W64(-))
BIN_LOOPS(sub_u8, uint8_t, uint8_t, x - y)
BIN_LOOPS(mul_f32, float, float, x * y)
BIN_LOOPS(mul_f64, double, double, x * y)
BIN_LOOPS(mul_i32, int32_t, int32_t, W32(*))
BIN_LOOPS(mul_i64, int64_t, int64_t, W64(*))
BIN_LOOPS(mul_u8, uint8_t, uint8_t, x * y)
/* 16-bit floats: float32 arithmetic on the widened values (exact inputs),
 * rounded once to the storage dtype. */
#define H16(op) dg_f32_to_f16(dg_f16_to_f32(x) op dg_f16_to_f32(y))
#define BH16(op) dg_f32_to_bf16(dg_bf16_to_f32(x) op dg_bf16_to_f32(y))
BIN_LOOPS(add_f16, uint16_t, uint16_t, H16(+))
BIN_LOOPS(add_bf16, uint16_t, uint16_t, BH16(+))
BIN_LOOPS(sub_f16, uint16_t, uint16_t, H16(-))
BIN_LOOPS(sub_bf16, uint16_t, uint16_t, BH16(-))
BIN_LOOPS(mul_f16, uint16_t, uint16_t, H16(*))
BIN_LOOPS(mul_bf16, uint16_t, uint16_t, BH16(*))
BIN_LOOPS(div_f32, float, float, x / y)
BIN_LOOPS(div_f64, double, double, x / y)
BIN_LOOPS(div_i32, int32_t, int32_t, div_i32(x, y, &bad))
BIN_LOOPS(div_i64, int64_t, int64_t, div_i64(x, y, &bad))
BIN_LOOPS(div_u8, uint8_t, uint8_t, div_u8(x, y, &bad))
BIN_LOOPS(pow_f32, float, float, powf(x, y))
BIN_LOOPS(pow_f64, double, double, pow(x, y))
BIN_LOOPS(pow_i32, int32_t, int32_t, pow_i32(x, y, &bad))
BIN_LOOPS(pow_i64, int64_t, int64_t, pow_i64(x, y, &bad))
BIN_LOOPS(pow_u8, uint8_t, uint8_t, upow(x, y))
/* Float max/min propagate NaN from either side: x != x picks a NaN x, and a
 * NaN y fails x > y and is picked too. */
BIN_LOOPS(max_f32, float, float, (x > y || x != x) ? x : y)
BIN_LOOPS(max_f64, double, double, (x > y || x != x) ? x : y)
BIN_LOOPS(max_i32, int32_t, int32_t, x > y ? x : y)
BIN_LOOPS(max_i64, int64_t, int64_t, x > y ? x : y)
BIN_LOOPS(max_u8, uint8_t, uint8_t, x > y ? x : y)
BIN_LOOPS(min_f32, float, float, (x < y || x != x) ? x : y)
BIN_LOOPS(min_f64, double, double, (x < y || x != x) ? x : y)
BIN_LOOPS(min_i32, int32_t, int32_t, x < y ? x : y)
BIN_LOOPS(min_i64, int64_t, int64_t, x < y ? x : y)
BIN_LOOPS(min_u8, uint8_t, uint8_t, x < y ? x : y)

/* Comparisons: one macro per op over the five numeric dtypes, output bool. */
#define CMP_LOOPS(fn, OP)                                                                    \
	BIN_LOOPS(fn##_f32, float, uint8_t, x OP y)                                          \
	BIN_LOOPS(fn##_f64, double, uint8_t, x OP y)                                         \
	BIN_LOOPS(fn##_i32, int32_t, uint8_t, x OP y)                                        \
	BIN_LOOPS(fn##_i64, int64_t, uint8_t, x OP y)                                        \
	BIN_LOOPS(fn##_u8, uint8_t, uint8_t, x OP y)
CMP_LOOPS(eq, ==)
CMP_LOOPS(ne, !=)
CMP_LOOPS(lt, <)
CMP_LOOPS(le, <=)
CMP_LOOPS(gt, >)
CMP_LOOPS(ge, >=)
/* bool bytes are 0/1 by contract; normalising costs nothing and keeps a stray
 * 2 from comparing unequal to true. */
BIN_LOOPS(eq_b, uint8_t, uint8_t, (x != 0) == (y != 0))
BIN_LOOPS(ne_b, uint8_t, uint8_t, (x != 0) != (y != 0))

#define BIN_NUM(fn) { [DG_F32] = BL(fn##_f32), [DG_F64] = BL(fn##_f64), [DG_I32] = BL(fn##_i32), \
		      [DG_I64] = BL(fn##_i64), [DG_U8] = BL(fn##_u8) }
/* Add, Sub, Mul: the numeric dtypes plus the 16-bit floats. */
#define BIN_NUM_H(fn) { [DG_F32] = BL(fn##_f32), [DG_F64] = BL(fn##_f64), \
			[DG_I32] = BL(fn##_i32), [DG_I64] = BL(fn##_i64), [DG_U8] = BL(fn##_u8), \
			[DG_F16] = BL(fn##_f16), [DG_BF16] = BL(fn##_bf16) }
#define BIN_ALL(fn) { [DG_F32] = BL(fn##_f32), [DG_F64] = BL(fn##_f64), [DG_I32] = BL(fn##_i32), \
		      [DG_I64] = BL(fn##_i64), [DG_U8] = BL(fn##_u8), [DG_BOOL] = BL(fn##_b) }
#define HINT_NUM "Cast bool to int32 or float32 first"

static const struct bin_op op_add = { "Add", false, BIN_NUM_H(add), HINT_NUM };
static const struct bin_op op_sub = { "Sub", false, BIN_NUM_H(sub), HINT_NUM };
static const struct bin_op op_mul = { "Mul", false, BIN_NUM_H(mul), HINT_NUM };
static const struct bin_op op_div = { "Div", false, BIN_NUM(div), HINT_NUM };
static const struct bin_op op_pow = { "Pow", false, BIN_NUM(pow), HINT_NUM };
static const struct bin_op op_max = { "Maximum", false, BIN_NUM(max), HINT_NUM };
static const struct bin_op op_min = { "Minimum", false, BIN_NUM(min), HINT_NUM };
static const struct bin_op op_eq = { "Equal", true, BIN_ALL(eq), HINT_NUM };
static const struct bin_op op_ne = { "NotEqual", true, BIN_ALL(ne), HINT_NUM };
static const struct bin_op op_lt = { "Less", true, BIN_NUM(lt), HINT_NUM };
static const struct bin_op op_le = { "LessEqual", true, BIN_NUM(le), HINT_NUM };
static const struct bin_op op_gt = { "Greater", true, BIN_NUM(gt), HINT_NUM };
static const struct bin_op op_ge = { "GreaterEqual", true, BIN_NUM(ge), HINT_NUM };

static enum dg_status binary_dtype(const struct bin_op *op, enum dg_dtype a, enum dg_dtype b,
				   enum dg_dtype *out, struct dg_err *err)
{
	if (a != b)
		return differ(err, a, b);
	if (!dtype_ok(a) || !op->t[a].vv)
		return unsupported(err, op->name, a, op->hint);
	*out = op->to_bool ? DG_BOOL : a;
	return DG_OK;
}

static enum dg_status infer_binary(struct dg_infer_ctx *c, const struct bin_op *op)
{
	enum dg_status st = binary_dtype(op, c->in[0].dtype, c->in[1].dtype, &c->out[0].dtype,
					 c->err);

	if (st != DG_OK)
		return st;
	return dg_shape_broadcast(&c->in[0].shape, &c->in[1].shape, &c->out[0].shape, c->err);
}

/* Turn the BAD_* bits of a loop into one error naming the op and dtype. */
static enum dg_status binary_fault(int bad, const struct bin_op *op, enum dg_dtype dt,
				   struct dg_err *err)
{
	const char *dn = dg_dtype_name(dt);

	if (bad & BAD_DIV0) {
		dg_err_set(err, DG_EINVAL, "integer division by zero in %s (%s)", op->name, dn);
		dg_err_hint(err, "mask zero divisors with Where, or Cast to float32 (x/0 = inf)");
	} else if (bad & BAD_DIVOVF) {
		dg_err_set(err, DG_EINVAL, "integer overflow in %s: the minimum %s divided by -1 "
			   "has no %s value", op->name, dn, dn);
		dg_err_hint(err, "Cast to a wider dtype (int64 or float64) first");
	} else {
		dg_err_set(err, DG_EINVAL, "negative exponent in integer %s (%s)", op->name, dn);
		dg_err_hint(err, "integers to negative powers are not allowed; Cast the base "
			    "to float32 first");
	}
	return DG_EINVAL;
}

/* Broadcast rows: pick the layout of each row's loop from the innermost
 * strides (0 or 1, see struct bcast). (0,0) only happens for one element. */
static int binary_rows(const struct bin_loops *l, const struct bcast *bc, const char *a,
		       const char *b, char *o, size_t isz, size_t osz)
{
	int64_t idx[DG_MAX_DIMS] = { 0 }, off[MAX_BC_IN] = { 0 };
	int64_t inner = bc->dim[bc->nd - 1];
	int sa = bc->st[0][bc->nd - 1] != 0, sb = bc->st[1][bc->nd - 1] != 0;
	bin_loop fn = sa && sb ? l->vv : sa ? l->vs : sb ? l->sv : NULL;
	int bad = 0;

	for (int64_t r = 0; r < bc->rows && !bad; r++) {
		const char *pa = a + off[0] * (int64_t)isz, *pb = b + off[1] * (int64_t)isz;
		char *po = o + r * inner * (int64_t)osz;
		if (fn) {
			bad = fn(inner, pa, pb, po);
		} else {
			for (int64_t i = 0; i < inner && !bad; i++)
				bad = l->vs(1, pa, pb, po + i * (int64_t)osz);
		}
		bcast_next(bc, idx, off);
	}
	return bad;
}

static enum dg_status run_binary(struct dg_kernel_ctx *c, const struct bin_op *op)
{
	enum dg_status st = check_inputs(c, 2);
	const struct dg_tensor *a, *b;
	struct dg_tensor *o;
	struct dg_shape shape;
	enum dg_dtype odt;
	int bad;

	if (st != DG_OK)
		return st;
	a = c->in[0];
	b = c->in[1];
	st = binary_dtype(op, a->dtype, b->dtype, &odt, c->err);
	if (st == DG_OK)
		st = dg_shape_broadcast(&a->shape, &b->shape, &shape, c->err);
	if (st != DG_OK)
		return st;
	o = cpu_out(c, 0, odt, &shape);
	if (!o)
		return out_failed(c);
	if (o->numel == 0)
		return DG_OK;
	const struct bin_loops *l = &op->t[a->dtype];
	if (dg_shape_eq(&a->shape, &b->shape)) {
		bad = l->vv(o->numel, a->data, b->data, o->data);   /* the flat fast path */
	} else {
		const struct dg_shape *shapes[2] = { &a->shape, &b->shape };
		struct bcast bc;
		bcast_init(&bc, &shape, shapes, 2);
		bad = binary_rows(l, &bc, a->data, b->data, o->data, dg_dtype_size(a->dtype),
				  dg_dtype_size(odt));
	}
	return bad ? binary_fault(bad, op, a->dtype, c->err) : DG_OK;
}

/* ------------------------------------------------------------------------ */
/* Where(cond, x, y)                                                           */

/* out[i] = cond[i*sk] ? x[i*sx] : y[i*sy], strides 0 or 1. */
typedef void (*where_loop)(int64_t n, const uint8_t *k, int64_t sk, const void *x, int64_t sx,
			   const void *y, int64_t sy, void *out);

#define WHERE_LOOP(fn, T)                                                                    \
	static void fn(int64_t n, const uint8_t *restrict k, int64_t sk, const void *px,    \
		       int64_t sx, const void *py, int64_t sy, void *po)                     \
	{                                                                                    \
		const T *restrict x = px;                                                    \
		const T *restrict y = py;                                                    \
		T *restrict o = po;                                                          \
		for (int64_t i = 0; i < n; i++)                                              \
			o[i] = k[i * sk] ? x[i * sx] : y[i * sy];                            \
	}
WHERE_LOOP(where_f32, float)
WHERE_LOOP(where_f64, double)
WHERE_LOOP(where_i32, int32_t)
WHERE_LOOP(where_i64, int64_t)
WHERE_LOOP(where_u8, uint8_t)
WHERE_LOOP(where_u16, uint16_t)

/* Where only moves elements: every dtype, the 16-bit floats as their bits. */
static const where_loop where_t[DG_DTYPE_COUNT] = {
	[DG_F32] = where_f32, [DG_F64] = where_f64, [DG_I32] = where_i32,
	[DG_I64] = where_i64, [DG_U8] = where_u8,   [DG_BOOL] = where_u8,
	[DG_F16] = where_u16, [DG_BF16] = where_u16,
};

static enum dg_status where_dtypes(enum dg_dtype k, enum dg_dtype x, enum dg_dtype y,
				   struct dg_err *err)
{
	if (k != DG_BOOL) {
		dg_err_set(err, DG_EDTYPE, "condition must be bool, got %s", dg_dtype_name(k));
		dg_err_hint(err, "compare with NotEqual(cond, 0) or Cast to bool first");
		return DG_EDTYPE;
	}
	return x == y ? DG_OK : differ(err, x, y);
}

/* cond, x and y broadcast together (three-way). */
static enum dg_status where_shape(const struct dg_shape *k, const struct dg_shape *x,
				  const struct dg_shape *y, struct dg_shape *out,
				  struct dg_err *err)
{
	struct dg_shape kx;
	enum dg_status st = dg_shape_broadcast(k, x, &kx, err);

	if (st != DG_OK)
		return st;
	return dg_shape_broadcast(&kx, y, out, err);
}

static enum dg_status infer_where(struct dg_infer_ctx *c)
{
	enum dg_status st = where_dtypes(c->in[0].dtype, c->in[1].dtype, c->in[2].dtype, c->err);

	if (st != DG_OK)
		return st;
	c->out[0].dtype = c->in[1].dtype;
	return where_shape(&c->in[0].shape, &c->in[1].shape, &c->in[2].shape, &c->out[0].shape,
			   c->err);
}

static enum dg_status k_where(struct dg_kernel_ctx *c)
{
	enum dg_status st = check_inputs(c, 3);
	const struct dg_tensor *k, *x, *y;
	struct dg_shape shape;
	struct dg_tensor *o;

	if (st != DG_OK)
		return st;
	k = c->in[0];
	x = c->in[1];
	y = c->in[2];
	st = where_dtypes(k->dtype, x->dtype, y->dtype, c->err);
	if (st == DG_OK)
		st = where_shape(&k->shape, &x->shape, &y->shape, &shape, c->err);
	if (st != DG_OK)
		return st;
	o = cpu_out(c, 0, x->dtype, &shape);
	if (!o)
		return out_failed(c);
	if (o->numel == 0)
		return DG_OK;

	const struct dg_shape *shapes[3] = { &k->shape, &x->shape, &y->shape };
	int64_t idx[DG_MAX_DIMS] = { 0 }, off[MAX_BC_IN] = { 0 };
	int64_t esz = (int64_t)dg_dtype_size(x->dtype);
	struct bcast bc;
	bcast_init(&bc, &shape, shapes, 3);
	int64_t inner = bc.dim[bc.nd - 1], last = bc.nd - 1;
	where_loop fn = where_t[x->dtype];
	for (int64_t r = 0; r < bc.rows; r++) {
		fn(inner, (const uint8_t *)k->data + off[0], bc.st[0][last] != 0,
		   (const char *)x->data + off[1] * esz, bc.st[1][last] != 0,
		   (const char *)y->data + off[2] * esz, bc.st[2][last] != 0,
		   (char *)o->data + r * inner * esz);
		bcast_next(&bc, idx, off);
	}
	return DG_OK;
}

/* ------------------------------------------------------------------------ */
/* Cast                                                                        */

/* Converts n elements; returns -1, or the index of the first element that has
 * no value in the target dtype (float -> int only). */
typedef int64_t (*cast_loop)(const void *in, void *out, int64_t n);

#define CAST_PLAIN(fn, TS, TD, EXPR)                                                         \
	static int64_t fn(const void *pi, void *po, int64_t n)                               \
	{                                                                                    \
		const TS *restrict a = pi;                                                   \
		TD *restrict o = po;                                                         \
		for (int64_t i = 0; i < n; i++) {                                            \
			TS x = a[i];                                                         \
			o[i] = (TD)(EXPR);                                                   \
		}                                                                            \
		return -1;                                                                   \
	}

/* float -> int: truncate toward zero, then the value must lie in [LO, HI);
 * NaN fails both comparisons. Converting out of range would be C UB. */
#define CAST_CHECKED(fn, TS, TD, LO, HI)                                                     \
	static int64_t fn(const void *pi, void *po, int64_t n)                               \
	{                                                                                    \
		const TS *restrict a = pi;                                                   \
		TD *restrict o = po;                                                         \
		for (int64_t i = 0; i < n; i++) {                                            \
			double t = trunc((double)a[i]);                                      \
			if (!(t >= (LO) && t < (HI)))                                        \
				return i;                                                    \
			o[i] = (TD)t;                                                        \
		}                                                                            \
		return -1;                                                                   \
	}

/* Anything -> bool is x != 0 (NaN is true); bool -> number is 0/1. */
#define CAST_TO_BOOL(S, TS) CAST_PLAIN(S##_b, TS, uint8_t, x != 0)
CAST_TO_BOOL(f32, float)
CAST_TO_BOOL(f64, double)
CAST_TO_BOOL(i32, int32_t)
CAST_TO_BOOL(i64, int64_t)
CAST_TO_BOOL(u8, uint8_t)
CAST_TO_BOOL(b, uint8_t)
CAST_PLAIN(b_f32, uint8_t, float, x != 0)
CAST_PLAIN(b_f64, uint8_t, double, x != 0)
CAST_PLAIN(b_i32, uint8_t, int32_t, x != 0)
CAST_PLAIN(b_i64, uint8_t, int64_t, x != 0)
CAST_PLAIN(b_u8, uint8_t, uint8_t, x != 0)
/* Between floats and from ints to floats: C conversion (IEEE rounding). */
CAST_PLAIN(f32_f32, float, float, x)
CAST_PLAIN(f32_f64, float, double, x)
CAST_PLAIN(f64_f32, double, float, x)
CAST_PLAIN(f64_f64, double, double, x)
CAST_PLAIN(i32_f32, int32_t, float, x)
CAST_PLAIN(i32_f64, int32_t, double, x)
CAST_PLAIN(i64_f32, int64_t, float, x)
CAST_PLAIN(i64_f64, int64_t, double, x)
CAST_PLAIN(u8_f32, uint8_t, float, x)
CAST_PLAIN(u8_f64, uint8_t, double, x)
/* Between ints: two's complement truncation through the unsigned target type,
 * as TensorFlow does (int64 4294967301 -> int32 5, int32 -1 -> uint8 255). */
CAST_PLAIN(i32_i32, int32_t, int32_t, x)
CAST_PLAIN(i32_i64, int32_t, int64_t, x)
CAST_PLAIN(i32_u8, int32_t, uint8_t, (uint8_t)x)
CAST_PLAIN(i64_i32, int64_t, int32_t, (uint32_t)x)
CAST_PLAIN(i64_i64, int64_t, int64_t, x)
CAST_PLAIN(i64_u8, int64_t, uint8_t, (uint8_t)x)
CAST_PLAIN(u8_i32, uint8_t, int32_t, x)
CAST_PLAIN(u8_i64, uint8_t, int64_t, x)
CAST_PLAIN(u8_u8, uint8_t, uint8_t, x)
/* To the 16-bit floats: one rounding from the source's exact value. int32 and
 * uint8 are exact in double/float; int64 goes through i64_to_f64_odd. */
static inline uint16_t b_to_f16(uint8_t x)
{
	return x ? 0x3c00 : 0;
}

static inline uint16_t b_to_bf16(uint8_t x)
{
	return x ? 0x3f80 : 0;
}

/* int64 as double rounded to odd: exact below 2^53; above, the dropped bits
 * are folded into a sticky low bit, so the one rounding to 16 bits that follows
 * (far fewer than 51 bits) is the correct rounding of the integer itself. */
static double i64_to_f64_odd(int64_t x)
{
	uint64_t u = x < 0 ? 0 - (uint64_t)x : (uint64_t)x;
	int k = 0;

	while (u >> 53 >> k)
		k++;
	uint64_t m = (u >> k) | ((u & ((UINT64_C(1) << k) - 1)) != 0);
	double d = ldexp((double)m, k);
	return x < 0 ? -d : d;
}

CAST_PLAIN(f32_f16, float, uint16_t, dg_f32_to_f16(x))
CAST_PLAIN(f32_bf16, float, uint16_t, dg_f32_to_bf16(x))
CAST_PLAIN(f64_f16, double, uint16_t, dg_f64_to_f16(x))
CAST_PLAIN(f64_bf16, double, uint16_t, dg_f64_to_bf16(x))
CAST_PLAIN(i32_f16, int32_t, uint16_t, dg_f64_to_f16(x))
CAST_PLAIN(i32_bf16, int32_t, uint16_t, dg_f64_to_bf16(x))
CAST_PLAIN(i64_f16, int64_t, uint16_t, dg_f64_to_f16(i64_to_f64_odd(x)))
CAST_PLAIN(i64_bf16, int64_t, uint16_t, dg_f64_to_bf16(i64_to_f64_odd(x)))
CAST_PLAIN(u8_f16, uint8_t, uint16_t, dg_f32_to_f16(x))
CAST_PLAIN(u8_bf16, uint8_t, uint16_t, dg_f32_to_bf16(x))
CAST_PLAIN(b_f16, uint8_t, uint16_t, b_to_f16(x))
CAST_PLAIN(b_bf16, uint8_t, uint16_t, b_to_bf16(x))
/* From the 16-bit floats: widening is exact; between the two, one rounding
 * from the exact float32 value; ->bool tests the bits without the sign (NaN
 * is true, -0 false). */
CAST_PLAIN(f16_f32, uint16_t, float, dg_f16_to_f32(x))
CAST_PLAIN(f16_f64, uint16_t, double, dg_f16_to_f32(x))
CAST_PLAIN(f16_f16, uint16_t, uint16_t, x)
CAST_PLAIN(f16_bf16, uint16_t, uint16_t, dg_f32_to_bf16(dg_f16_to_f32(x)))
CAST_PLAIN(f16_b, uint16_t, uint8_t, (x & 0x7fff) != 0)
CAST_PLAIN(bf16_f32, uint16_t, float, dg_bf16_to_f32(x))
CAST_PLAIN(bf16_f64, uint16_t, double, dg_bf16_to_f32(x))
CAST_PLAIN(bf16_f16, uint16_t, uint16_t, dg_f32_to_f16(dg_bf16_to_f32(x)))
CAST_PLAIN(bf16_bf16, uint16_t, uint16_t, x)
CAST_PLAIN(bf16_b, uint16_t, uint8_t, (x & 0x7fff) != 0)

/* Floats to ints: the bounds are exact powers of two in double. */
#define I32_LO (-2147483648.0)
#define I32_HI 2147483648.0
#define I64_LO (-9223372036854775808.0)
#define I64_HI 9223372036854775808.0
CAST_CHECKED(f32_i32, float, int32_t, I32_LO, I32_HI)
CAST_CHECKED(f32_i64, float, int64_t, I64_LO, I64_HI)
CAST_CHECKED(f32_u8, float, uint8_t, 0.0, 256.0)
CAST_CHECKED(f64_i32, double, int32_t, I32_LO, I32_HI)
CAST_CHECKED(f64_i64, double, int64_t, I64_LO, I64_HI)
CAST_CHECKED(f64_u8, double, uint8_t, 0.0, 256.0)

/* 16-bit floats to ints: as CAST_CHECKED on the exact float32 value. */
#define CAST_CHECKED_H(fn, TD, LO, HI, WIDEN)                                                \
	static int64_t fn(const void *pi, void *po, int64_t n)                               \
	{                                                                                    \
		const uint16_t *restrict a = pi;                                             \
		TD *restrict o = po;                                                         \
		for (int64_t i = 0; i < n; i++) {                                            \
			double t = trunc((double)WIDEN(a[i]));                               \
			if (!(t >= (LO) && t < (HI)))                                        \
				return i;                                                    \
			o[i] = (TD)t;                                                        \
		}                                                                            \
		return -1;                                                                   \
	}
CAST_CHECKED_H(f16_i32, int32_t, I32_LO, I32_HI, dg_f16_to_f32)
CAST_CHECKED_H(f16_i64, int64_t, I64_LO, I64_HI, dg_f16_to_f32)
CAST_CHECKED_H(f16_u8, uint8_t, 0.0, 256.0, dg_f16_to_f32)
CAST_CHECKED_H(bf16_i32, int32_t, I32_LO, I32_HI, dg_bf16_to_f32)
CAST_CHECKED_H(bf16_i64, int64_t, I64_LO, I64_HI, dg_bf16_to_f32)
CAST_CHECKED_H(bf16_u8, uint8_t, 0.0, 256.0, dg_bf16_to_f32)

#define CAST_ROW(S) { [DG_F32] = S##_f32, [DG_F64] = S##_f64, [DG_I32] = S##_i32, \
		      [DG_I64] = S##_i64, [DG_U8] = S##_u8, [DG_BOOL] = S##_b,       \
		      [DG_F16] = S##_f16, [DG_BF16] = S##_bf16 }
/* casts[src][dst]: all 64 pairs. */
static const cast_loop casts[DG_DTYPE_COUNT][DG_DTYPE_COUNT] = {
	[DG_F32] = CAST_ROW(f32), [DG_F64] = CAST_ROW(f64), [DG_I32] = CAST_ROW(i32),
	[DG_I64] = CAST_ROW(i64), [DG_U8] = CAST_ROW(u8),   [DG_BOOL] = CAST_ROW(b),
	[DG_F16] = CAST_ROW(f16), [DG_BF16] = CAST_ROW(bf16),
};
_Static_assert(DG_DTYPE_COUNT == 8, "a new dtype needs its row and column in casts[][]");

static const struct dg_attr_spec cast_attrs[] = {
	{ "dtype", DG_ATTR_DTYPE, true,
	  "target dtype (float32, float64, int32, int64, uint8, bool, float16, bfloat16)" },
	{ 0 },
};

static enum dg_status infer_cast(struct dg_infer_ctx *c)
{
	enum dg_status st = dg_attrs_dtype(dg_attrs_of_json(c->attrs), "dtype", NULL, &c->out[0].dtype, c->err);

	if (st != DG_OK)
		return st;
	if (!dtype_ok(c->in[0].dtype))
		return dg_err_set(c->err, DG_EDTYPE, "input has invalid dtype code %d",
				  (int)c->in[0].dtype);
	c->out[0].shape = c->in[0].shape;
	return DG_OK;
}

static enum dg_status k_cast(struct dg_kernel_ctx *c)
{
	enum dg_status st = check_inputs(c, 1);
	const struct dg_tensor *x;
	struct dg_tensor *y;
	enum dg_dtype to;
	int64_t bad;

	if (st != DG_OK)
		return st;
	st = dg_attrs_dtype(c->attrs, "dtype", NULL, &to, c->err);
	if (st != DG_OK)
		return st;
	x = c->in[0];
	y = cpu_out(c, 0, to, &x->shape);
	if (!y)
		return out_failed(c);
	if (y->numel == 0)
		return DG_OK;
	bad = casts[x->dtype][to](x->data, y->data, y->numel);
	if (bad < 0)
		return DG_OK;
	dg_err_set(c->err, DG_EINVAL, "Cast of %s value %.17g (element %lld) to %s: NaN, Inf and "
		   "out-of-range values have no %s value", dg_dtype_name(x->dtype),
		   dg_tensor_get_f64(x, bad), (long long)bad, dg_dtype_name(to), dg_dtype_name(to));
	dg_err_hint(c->err, "replace or clip such values first (Where, Maximum, Minimum)");
	return DG_EINVAL;
}

/* ------------------------------------------------------------------------ */
/* The op table                                                                */

static const struct dg_attr_spec no_attrs[] = { { 0 } };

/* One infer and one kernel per op: the kernel context does not say which op
 * it runs for, so each op gets a two-line wrapper around its descriptor. */
#define UNARY_FNS(op)                                                                        \
	static enum dg_status infer_##op(struct dg_infer_ctx *c)                             \
	{                                                                                    \
		return infer_unary(c, &op_##op);                                             \
	}                                                                                    \
	static enum dg_status k_##op(struct dg_kernel_ctx *c)                                \
	{                                                                                    \
		return run_unary(c, &op_##op);                                               \
	}
#define BINARY_FNS(op)                                                                       \
	static enum dg_status infer_##op(struct dg_infer_ctx *c)                             \
	{                                                                                    \
		return infer_binary(c, &op_##op);                                            \
	}                                                                                    \
	static enum dg_status k_##op(struct dg_kernel_ctx *c)                                \
	{                                                                                    \
		return run_binary(c, &op_##op);                                              \
	}
UNARY_FNS(neg)
UNARY_FNS(abs)
UNARY_FNS(square)
UNARY_FNS(sqrt)
UNARY_FNS(exp)
UNARY_FNS(log)
UNARY_FNS(relu)
UNARY_FNS(sigmoid)
UNARY_FNS(tanh)
BINARY_FNS(add)
BINARY_FNS(sub)
BINARY_FNS(mul)
BINARY_FNS(div)
BINARY_FNS(pow)
BINARY_FNS(max)
BINARY_FNS(min)
BINARY_FNS(eq)
BINARY_FNS(ne)
BINARY_FNS(lt)
BINARY_FNS(le)
BINARY_FNS(gt)
BINARY_FNS(ge)

/* Gradient functions (grad.c) by op; comparisons have none (bool results). */
#define GRAD_neg cpu_grad_neg
#define GRAD_abs cpu_grad_abs
#define GRAD_square cpu_grad_square
#define GRAD_sqrt cpu_grad_sqrt
#define GRAD_exp cpu_grad_exp
#define GRAD_log cpu_grad_log
#define GRAD_relu cpu_grad_relu
#define GRAD_sigmoid cpu_grad_sigmoid
#define GRAD_tanh cpu_grad_tanh
#define GRAD_add cpu_grad_add
#define GRAD_sub cpu_grad_sub
#define GRAD_mul cpu_grad_mul
#define GRAD_div cpu_grad_div
#define GRAD_pow cpu_grad_pow
#define GRAD_max cpu_grad_maximum
#define GRAD_min cpu_grad_minimum
#define GRAD_eq NULL
#define GRAD_ne NULL
#define GRAD_lt NULL
#define GRAD_le NULL
#define GRAD_gt NULL
#define GRAD_ge NULL
#define UNARY(name, op, doc) \
	{ name, 1, 1, 1, NULL, no_attrs, infer_##op, k_##op, NULL, GRAD_##op, 0, doc }
#define BINARY(name, op, doc) \
	{ name, 2, 2, 1, NULL, no_attrs, infer_##op, k_##op, NULL, GRAD_##op, 0, doc }

struct dg_op_def dg_ops_eltwise[] = {
	UNARY("Neg", neg, "-x; signed integers wrap (Neg(INT_MIN) = INT_MIN)"),
	UNARY("Abs", abs, "|x|; signed integers wrap (Abs(INT_MIN) = INT_MIN)"),
	UNARY("Square", square, "x * x; integers wrap around"),
	UNARY("Sqrt", sqrt, "square root of a float tensor (Sqrt(-1) = nan)"),
	UNARY("Exp", exp, "e^x of a float tensor"),
	UNARY("Log", log, "natural logarithm of a float tensor (Log(0) = -inf, Log(-1) = nan)"),
	UNARY("Relu", relu, "max(x, 0); NaN stays NaN; also float16/bfloat16"),
	UNARY("Sigmoid", sigmoid, "1 / (1 + e^-x), stable for large |x|"),
	UNARY("Tanh", tanh, "hyperbolic tangent of a float tensor"),
	BINARY("Add", add, "x + y with NumPy broadcasting; integers wrap around; "
			   "float16/bfloat16 in float32, rounded once"),
	BINARY("Sub", sub, "x - y with NumPy broadcasting; integers wrap around; "
			   "float16/bfloat16 in float32, rounded once"),
	BINARY("Mul", mul, "x * y with NumPy broadcasting; integers wrap around; "
			   "float16/bfloat16 in float32, rounded once"),
	BINARY("Div", div, "x / y with broadcasting; IEEE for floats, integers truncate "
			   "toward zero (division by zero is an error)"),
	BINARY("Pow", pow, "x ^ y with broadcasting; integer exponents must be >= 0, "
			   "integers wrap around"),
	BINARY("Maximum", max, "elementwise max with broadcasting; NaN wins"),
	BINARY("Minimum", min, "elementwise min with broadcasting; NaN wins"),
	BINARY("Equal", eq, "x == y with broadcasting, bool result"),
	BINARY("NotEqual", ne, "x != y with broadcasting, bool result"),
	BINARY("Less", lt, "x < y with broadcasting, bool result"),
	BINARY("LessEqual", le, "x <= y with broadcasting, bool result"),
	BINARY("Greater", gt, "x > y with broadcasting, bool result"),
	BINARY("GreaterEqual", ge, "x >= y with broadcasting, bool result"),
	{ "Where", 3, 3, 1, NULL, no_attrs, infer_where, k_where, NULL, cpu_grad_where, 0,
	  "cond ? x : y elementwise, all three broadcast together; cond is bool" },
	{ "Cast", 1, 1, 1, NULL, cast_attrs, infer_cast, k_cast, NULL, cpu_grad_cast, 0,
	  "convert to attr dtype: float->int truncates toward zero (NaN, Inf, out of range: "
	  "error), int->int wraps (two's complement), x->bool is x != 0, bool->number 0/1, "
	  "to float16/bfloat16 rounds to nearest even (overflow gives inf)" },
	{ 0 },
};
