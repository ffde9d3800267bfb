/* Elementwise CUDA kernels: unary math, binary arithmetic and comparisons with
 * broadcasting through struct dgc_walk, Where and Cast. Each expression is the
 * CPU's (kernels/cpu/eltwise.c), so NaN handling and integer wrap-around agree;
 * transcendental functions may differ by an ulp or two (CUDA's libdevice).
 * float16/bfloat16 travel as their uint16_t bits and convert with the
 * cuda_fp16.h/cuda_bf16.h intrinsics. Launched from dispatch.c through
 * cuda_launch.h. */
#include "cuda_common.cuh"

#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* --- the 16-bit floats ------------------------------------------------------- */

/* One class per 16-bit format: widen bits to float (exact), and round any
 * source to bits once, to nearest even (overflow: inf), as dg_f64_to_f16 and
 * friends do on the CPU. */
struct C_f16 {
	static constexpr uint16_t one = 0x3c00;
	static constexpr uint16_t inf = 0x7c00;   /* |bits| above: NaN */
	__device__ static float wide(uint16_t x) { return __half2float(__ushort_as_half(x)); }
	__device__ static uint16_t from(float x) { return __half_as_ushort(__float2half_rn(x)); }
	__device__ static uint16_t from(double x) { return __half_as_ushort(__double2half(x)); }
	__device__ static uint16_t from(int32_t x) { return __half_as_ushort(__int2half_rn(x)); }
	__device__ static uint16_t from(int64_t x)
	{
		return __half_as_ushort(__ll2half_rn((long long)x));
	}
	__device__ static uint16_t from(uint8_t x)
	{
		return __half_as_ushort(__uint2half_rn((unsigned)x));
	}
};
struct C_bf16 {
	static constexpr uint16_t one = 0x3f80;
	static constexpr uint16_t inf = 0x7f80;
	__device__ static float wide(uint16_t x)
	{
		return __bfloat162float(__ushort_as_bfloat16(x));
	}
	__device__ static uint16_t from(float x)
	{
		return __bfloat16_as_ushort(__float2bfloat16_rn(x));
	}
	__device__ static uint16_t from(double x)
	{
		return __bfloat16_as_ushort(__double2bfloat16(x));
	}
	__device__ static uint16_t from(int32_t x)
	{
		return __bfloat16_as_ushort(__int2bfloat16_rn(x));
	}
	__device__ static uint16_t from(int64_t x)
	{
		return __bfloat16_as_ushort(__ll2bfloat16_rn((long long)x));
	}
	__device__ static uint16_t from(uint8_t x)
	{
		return __bfloat16_as_ushort(__uint2bfloat16_rn((unsigned)x));
	}
};

/* --- unary ----------------------------------------------------------------- */

template <typename T> struct U_neg {
	__device__ T operator()(T x) const { return -x; }
};
template <> struct U_neg<int32_t> {
	__device__ int32_t operator()(int32_t x) const { return (int32_t)(0u - (uint32_t)x); }
};
template <> struct U_neg<int64_t> {
	__device__ int64_t operator()(int64_t x) const { return (int64_t)(0ull - (uint64_t)x); }
};
template <typename T> struct U_abs {
	__device__ T operator()(T x) const { return x < 0 ? -x : x; }
};
template <> struct U_abs<float> {
	__device__ float operator()(float x) const { return fabsf(x); }
};
template <> struct U_abs<double> {
	__device__ double operator()(double x) const { return fabs(x); }
};
template <> struct U_abs<int32_t> {
	__device__ int32_t operator()(int32_t x) const
	{
		return x < 0 ? (int32_t)(0u - (uint32_t)x) : x;
	}
};
template <> struct U_abs<int64_t> {
	__device__ int64_t operator()(int64_t x) const
	{
		return x < 0 ? (int64_t)(0ull - (uint64_t)x) : x;
	}
};
template <typename T> struct U_square {
	__device__ T operator()(T x) const { return x * x; }
};
template <> struct U_square<int32_t> {
	__device__ int32_t operator()(int32_t x) const
	{
		return (int32_t)((uint32_t)x * (uint32_t)x);
	}
};
template <> struct U_square<int64_t> {
	__device__ int64_t operator()(int64_t x) const
	{
		return (int64_t)((uint64_t)x * (uint64_t)x);
	}
};
/* Relu keeps NaN (x != x), as on the CPU. */
template <typename T> struct U_relu {
	__device__ T operator()(T x) const { return (x > 0 || x != x) ? x : (T)0; }
};
template <typename T> struct U_sqrt {
	__device__ T operator()(T x) const { return sqrt(x); }
};
template <typename T> struct U_exp {
	__device__ T operator()(T x) const { return exp(x); }
};
template <typename T> struct U_log {
	__device__ T operator()(T x) const { return log(x); }
};
template <typename T> struct U_tanh {
	__device__ T operator()(T x) const { return tanh(x); }
};
/* 16-bit Relu on the bits: a set sign bit gives +0 unless the value is NaN. */
template <typename C> struct U_relu_h {
	__device__ uint16_t operator()(uint16_t x) const
	{
		return (x & 0x8000) && (x & 0x7fff) <= C::inf ? (uint16_t)0 : x;
	}
};
/* Stable for both tails: exp of a large positive number is never taken. */
template <typename T> struct U_sigmoid {
	__device__ T operator()(T x) const
	{
		if (x >= 0)
			return (T)1 / ((T)1 + exp(-x));
		T e = exp(x);
		return e / ((T)1 + e);
	}
};

/* Flat kernels move 16 bytes of input per thread and load (DGC_VEC elements of
 * T): one wide load instead of four narrow ones keeps more bytes in flight per
 * thread, which is what an elementwise kernel is limited by (bench_cuda on an
 * H200: Add of 64 Mi floats went from 0.69 to 1.04 of a device-to-device
 * copy's bandwidth). The n % V tail is done one element per thread. */
template <typename T, typename F>
__global__ void k_unary(const T *__restrict__ x, T *__restrict__ y, int64_t n, F f)
{
	enum { V = DGC_VEC(T) };
	typedef dgc_vec<T, V> VT;
	int64_t stride = (int64_t)gridDim.x * blockDim.x, nv = n / V;
	int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	for (int64_t i = t; i < nv; i += stride) {
		VT v = ((const VT *)x)[i], r;
#pragma unroll
		for (int j = 0; j < V; j++)
			r.v[j] = f(v.v[j]);
		((VT *)y)[i] = r;
	}
	if (t < n - nv * V)
		y[nv * V + t] = f(x[nv * V + t]);
}

template <typename T, typename F>
__global__ void k_unary_1(const T *__restrict__ x, T *__restrict__ y, int64_t n, F f)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = f(x[i]);
}

template <typename T, typename F>
static cudaError_t unary_t(const void *x, void *y, int64_t n, cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	if (dgc_aligned(x, y, y))
		k_unary<T, F><<<dgc_blocks(n / DGC_VEC(T) + 1), DGC_BLOCK, 0, s>>>(
			(const T *)x, (T *)y, n, F());
	else
		k_unary_1<T, F><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>((const T *)x, (T *)y, n, F());
	return dgc_launched();
}

/* Signed ops take every numeric dtype but uint8 and bool; float ops floats. */
template <template <typename> class F> static cudaError_t unary_num(int dt, const void *x,
								   void *y, int64_t n,
								   cudaStream_t s)
{
	switch (dt) {
	case DGC_F32: return unary_t<float, F<float> >(x, y, n, s);
	case DGC_F64: return unary_t<double, F<double> >(x, y, n, s);
	case DGC_I32: return unary_t<int32_t, F<int32_t> >(x, y, n, s);
	case DGC_I64: return unary_t<int64_t, F<int64_t> >(x, y, n, s);
	default: return cudaErrorInvalidValue;
	}
}

template <template <typename> class F> static cudaError_t unary_flt(int dt, const void *x,
								   void *y, int64_t n,
								   cudaStream_t s)
{
	switch (dt) {
	case DGC_F32: return unary_t<float, F<float> >(x, y, n, s);
	case DGC_F64: return unary_t<double, F<double> >(x, y, n, s);
	default: return cudaErrorInvalidValue;
	}
}

static bool unary_is_num(int op)
{
	return op == DGC_NEG || op == DGC_ABS || op == DGC_SQUARE || op == DGC_RELU;
}

extern "C" int dgc_unary_has(int op, int dt)
{
	if (op < DGC_NEG || op > DGC_TANH)
		return 0;
	if (dt == DGC_F16 || dt == DGC_BF16)
		return op == DGC_RELU;
	if (dt == DGC_F32 || dt == DGC_F64)
		return 1;
	return unary_is_num(op) && (dt == DGC_I32 || dt == DGC_I64);
}

extern "C" cudaError_t dgc_unary(int op, int dt, const void *x, void *y, int64_t n,
				 cudaStream_t s)
{
	if (!dgc_unary_has(op, dt))
		return cudaErrorInvalidValue;
	if (dt == DGC_F16)
		return unary_t<uint16_t, U_relu_h<C_f16> >(x, y, n, s);
	if (dt == DGC_BF16)
		return unary_t<uint16_t, U_relu_h<C_bf16> >(x, y, n, s);
	switch (op) {
	case DGC_NEG: return unary_num<U_neg>(dt, x, y, n, s);
	case DGC_ABS: return unary_num<U_abs>(dt, x, y, n, s);
	case DGC_SQUARE: return unary_num<U_square>(dt, x, y, n, s);
	case DGC_RELU: return unary_num<U_relu>(dt, x, y, n, s);
	case DGC_SQRT: return unary_flt<U_sqrt>(dt, x, y, n, s);
	case DGC_EXP: return unary_flt<U_exp>(dt, x, y, n, s);
	case DGC_LOG: return unary_flt<U_log>(dt, x, y, n, s);
	case DGC_SIGMOID: return unary_flt<U_sigmoid>(dt, x, y, n, s);
	default: return unary_flt<U_tanh>(dt, x, y, n, s);
	}
}

/* --- binary ---------------------------------------------------------------- */

/* Integer add/sub/mul wrap around (computed unsigned, as on the CPU). */
template <typename T> struct W {
	typedef T U;
};
template <> struct W<int32_t> {
	typedef uint32_t U;
};
template <> struct W<int64_t> {
	typedef uint64_t U;
};
template <> struct W<uint8_t> {
	typedef uint32_t U;
};

template <typename T> struct B_add {
	typedef T R;
	__device__ R operator()(T x, T y) const
	{
		return (T)((typename W<T>::U)x + (typename W<T>::U)y);
	}
};
template <typename T> struct B_sub {
	typedef T R;
	__device__ R operator()(T x, T y) const
	{
		return (T)((typename W<T>::U)x - (typename W<T>::U)y);
	}
};
template <typename T> struct B_mul {
	typedef T R;
	__device__ R operator()(T x, T y) const
	{
		return (T)((typename W<T>::U)x * (typename W<T>::U)y);
	}
};
template <> struct B_add<float> {
	typedef float R;
	__device__ float operator()(float x, float y) const { return x + y; }
};
template <> struct B_add<double> {
	typedef double R;
	__device__ double operator()(double x, double y) const { return x + y; }
};
template <> struct B_sub<float> {
	typedef float R;
	__device__ float operator()(float x, float y) const { return x - y; }
};
template <> struct B_sub<double> {
	typedef double R;
	__device__ double operator()(double x, double y) const { return x - y; }
};
template <> struct B_mul<float> {
	typedef float R;
	__device__ float operator()(float x, float y) const { return x * y; }
};
template <> struct B_mul<double> {
	typedef double R;
	__device__ double operator()(double x, double y) const { return x * y; }
};
/* 16-bit Add, Sub, Mul: float32 arithmetic on the exact widened values, one
 * rounding back; the CPU computes the same expression, so results match bit
 * for bit. */
template <typename C> struct B_add_h {
	typedef uint16_t R;
	__device__ R operator()(uint16_t x, uint16_t y) const
	{
		return C::from(C::wide(x) + C::wide(y));
	}
};
template <typename C> struct B_sub_h {
	typedef uint16_t R;
	__device__ R operator()(uint16_t x, uint16_t y) const
	{
		return C::from(C::wide(x) - C::wide(y));
	}
};
template <typename C> struct B_mul_h {
	typedef uint16_t R;
	__device__ R operator()(uint16_t x, uint16_t y) const
	{
		return C::from(C::wide(x) * C::wide(y));
	}
};
/* Float Div and Pow only: the integer forms need error reporting (division by
 * zero, negative exponents) and stay on the CPU. */
template <typename T> struct B_div {
	typedef T R;
	__device__ R operator()(T x, T y) const { return x / y; }
};
template <typename T> struct B_pow {
	typedef T R;
	__device__ R operator()(T x, T y) const { return pow(x, y); }
};
/* Float max/min propagate NaN from either side, like the CPU. */
template <typename T> struct B_max {
	typedef T R;
	__device__ R operator()(T x, T y) const { return (x > y || x != x) ? x : y; }
};
template <typename T> struct B_min {
	typedef T R;
	__device__ R operator()(T x, T y) const { return (x < y || x != x) ? x : y; }
};
#define CMP(name, OP)                                                                      \
	template <typename T> struct name {                                                \
		typedef uint8_t R;                                                         \
		__device__ R operator()(T x, T y) const { return (uint8_t)(x OP y); }      \
	};
CMP(B_eq, ==)
CMP(B_ne, !=)
CMP(B_lt, <)
CMP(B_le, <=)
CMP(B_gt, >)
CMP(B_ge, >=)
/* bool bytes are normalised, as on the CPU. */
struct B_eq_bool {
	typedef uint8_t R;
	__device__ R operator()(uint8_t x, uint8_t y) const { return (x != 0) == (y != 0); }
};
struct B_ne_bool {
	typedef uint8_t R;
	__device__ R operator()(uint8_t x, uint8_t y) const { return (x != 0) != (y != 0); }
};

template <typename T, typename F>
__global__ void k_binary_flat(const T *__restrict__ a, const T *__restrict__ b,
			      typename F::R *__restrict__ o, int64_t n, F f)
{
	typedef typename F::R R;
	enum { V = DGC_VEC(T) };
	typedef dgc_vec<T, V> VT;
	typedef dgc_vec<R, V> VR;
	int64_t stride = (int64_t)gridDim.x * blockDim.x, nv = n / V;
	int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	for (int64_t i = t; i < nv; i += stride) {
		VT va = ((const VT *)a)[i], vb = ((const VT *)b)[i];
		VR r;
#pragma unroll
		for (int j = 0; j < V; j++)
			r.v[j] = f(va.v[j], vb.v[j]);
		((VR *)o)[i] = r;
	}
	if (t < n - nv * V)
		o[nv * V + t] = f(a[nv * V + t], b[nv * V + t]);
}

template <typename T, typename F>
__global__ void k_binary_flat_1(const T *__restrict__ a, const T *__restrict__ b,
				typename F::R *__restrict__ o, int64_t n, F f)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		o[i] = f(a[i], b[i]);
}

template <typename T, typename F>
__global__ void k_binary_walk(const T *__restrict__ a, const T *__restrict__ b,
			      typename F::R *__restrict__ o, int64_t n, struct dgc_walk w, F f)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		o[i] = f(a[dgc_offset(w, 0, i)], b[dgc_offset(w, 1, i)]);
}

template <typename T, typename F>
static cudaError_t binary_t(const void *a, const void *b, void *o, int64_t n,
			    const struct dgc_walk *w, cudaStream_t s)
{
	typedef typename F::R R;

	if (n <= 0)
		return cudaSuccess;
	if (w)
		k_binary_walk<T, F><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(const T *)a, (const T *)b, (R *)o, n, *w, F());
	else if (dgc_aligned(a, b, o))
		k_binary_flat<T, F><<<dgc_blocks(n / DGC_VEC(T) + 1), DGC_BLOCK, 0, s>>>(
			(const T *)a, (const T *)b, (R *)o, n, F());
	else
		k_binary_flat_1<T, F><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			(const T *)a, (const T *)b, (R *)o, n, F());
	return dgc_launched();
}

/* Every numeric dtype (float32, float64, int32, int64, uint8). */
template <template <typename> class F>
static cudaError_t binary_num(int dt, const void *a, const void *b, void *o, int64_t n,
			      const struct dgc_walk *w, cudaStream_t s)
{
	switch (dt) {
	case DGC_F32: return binary_t<float, F<float> >(a, b, o, n, w, s);
	case DGC_F64: return binary_t<double, F<double> >(a, b, o, n, w, s);
	case DGC_I32: return binary_t<int32_t, F<int32_t> >(a, b, o, n, w, s);
	case DGC_I64: return binary_t<int64_t, F<int64_t> >(a, b, o, n, w, s);
	case DGC_U8: return binary_t<uint8_t, F<uint8_t> >(a, b, o, n, w, s);
	default: return cudaErrorInvalidValue;
	}
}

template <template <typename> class F>
static cudaError_t binary_flt(int dt, const void *a, const void *b, void *o, int64_t n,
			      const struct dgc_walk *w, cudaStream_t s)
{
	switch (dt) {
	case DGC_F32: return binary_t<float, F<float> >(a, b, o, n, w, s);
	case DGC_F64: return binary_t<double, F<double> >(a, b, o, n, w, s);
	default: return cudaErrorInvalidValue;
	}
}

template <typename C>
static cudaError_t binary_half_c(int op, const void *a, const void *b, void *o, int64_t n,
				 const struct dgc_walk *w, cudaStream_t s)
{
	switch (op) {
	case DGC_ADD: return binary_t<uint16_t, B_add_h<C> >(a, b, o, n, w, s);
	case DGC_SUB: return binary_t<uint16_t, B_sub_h<C> >(a, b, o, n, w, s);
	default: return binary_t<uint16_t, B_mul_h<C> >(a, b, o, n, w, s);
	}
}

static cudaError_t binary_half(int op, bool bf16, const void *a, const void *b, void *o,
			       int64_t n, const struct dgc_walk *w, cudaStream_t s)
{
	return bf16 ? binary_half_c<C_bf16>(op, a, b, o, n, w, s)
		    : binary_half_c<C_f16>(op, a, b, o, n, w, s);
}

extern "C" int dgc_binary_has(int op, int dt)
{
	if (dt == DGC_F16 || dt == DGC_BF16)
		return op == DGC_ADD || op == DGC_SUB || op == DGC_MUL;
	if (op < DGC_ADD || op > DGC_GE || dt < DGC_F32 || dt > DGC_BOOL)
		return 0;
	if (op == DGC_DIV || op == DGC_POW)
		return dt == DGC_F32 || dt == DGC_F64;
	if (dt == DGC_BOOL)
		return op == DGC_EQ || op == DGC_NE;
	return 1;
}

extern "C" cudaError_t dgc_binary(int op, int dt, const void *a, const void *b, void *o,
				  int64_t n, const struct dgc_walk *w, cudaStream_t s)
{
	if (!dgc_binary_has(op, dt))
		return cudaErrorInvalidValue;
	if (dt == DGC_F16 || dt == DGC_BF16)
		return binary_half(op, dt == DGC_BF16, a, b, o, n, w, s);
	if (dt == DGC_BOOL)
		return op == DGC_EQ ? binary_t<uint8_t, B_eq_bool>(a, b, o, n, w, s)
				    : binary_t<uint8_t, B_ne_bool>(a, b, o, n, w, s);
	switch (op) {
	case DGC_ADD: return binary_num<B_add>(dt, a, b, o, n, w, s);
	case DGC_SUB: return binary_num<B_sub>(dt, a, b, o, n, w, s);
	case DGC_MUL: return binary_num<B_mul>(dt, a, b, o, n, w, s);
	case DGC_DIV: return binary_flt<B_div>(dt, a, b, o, n, w, s);
	case DGC_POW: return binary_flt<B_pow>(dt, a, b, o, n, w, s);
	case DGC_MAX: return binary_num<B_max>(dt, a, b, o, n, w, s);
	case DGC_MIN: return binary_num<B_min>(dt, a, b, o, n, w, s);
	case DGC_EQ: return binary_num<B_eq>(dt, a, b, o, n, w, s);
	case DGC_NE: return binary_num<B_ne>(dt, a, b, o, n, w, s);
	case DGC_LT: return binary_num<B_lt>(dt, a, b, o, n, w, s);
	case DGC_LE: return binary_num<B_le>(dt, a, b, o, n, w, s);
	case DGC_GT: return binary_num<B_gt>(dt, a, b, o, n, w, s);
	default: return binary_num<B_ge>(dt, a, b, o, n, w, s);
	}
}

/* --- Where ----------------------------------------------------------------- */

template <typename T>
__global__ void k_where(const uint8_t *__restrict__ k, const T *__restrict__ x,
			const T *__restrict__ y, T *__restrict__ o, int64_t n, struct dgc_walk w)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		o[i] = k[dgc_offset(w, 0, i)] ? x[dgc_offset(w, 1, i)] : y[dgc_offset(w, 2, i)];
}

extern "C" cudaError_t dgc_where(const uint8_t *k, const void *x, const void *y, void *o,
				 int64_t n, const struct dgc_walk *w, int esz, cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	switch (esz) {
	case 1:
		k_where<uint8_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			k, (const uint8_t *)x, (const uint8_t *)y, (uint8_t *)o, n, *w);
		break;
	case 2:
		k_where<uint16_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			k, (const uint16_t *)x, (const uint16_t *)y, (uint16_t *)o, n, *w);
		break;
	case 4:
		k_where<uint32_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			k, (const uint32_t *)x, (const uint32_t *)y, (uint32_t *)o, n, *w);
		break;
	case 8:
		k_where<uint64_t><<<dgc_blocks(n), DGC_BLOCK, 0, s>>>(
			k, (const uint64_t *)x, (const uint64_t *)y, (uint64_t *)o, n, *w);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return dgc_launched();
}

/* --- Cast ------------------------------------------------------------------ */

/* One converter per (source, target) class, matching eltwise.c: to bool is
 * x != 0 (NaN true); from bool 0/1; float to int truncates and must land in
 * [lo, hi) (else 0 and *bad lowered); int to int wraps through the target width. */
template <typename S, typename D>
__global__ void k_cast_plain(const S *__restrict__ x, D *__restrict__ y, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = (D)x[i];
}

template <typename S>
__global__ void k_cast_bool(const S *__restrict__ x, uint8_t *__restrict__ y, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = x[i] != 0;
}

template <typename D>
__global__ void k_cast_from_bool(const uint8_t *__restrict__ x, D *__restrict__ y, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = (D)(x[i] != 0);
}

template <typename S, typename D>
__global__ void k_cast_checked(const S *__restrict__ x, D *__restrict__ y, int64_t n, double lo,
			       double hi, unsigned long long *bad)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
		double t = trunc((double)x[i]);
		if (t >= lo && t < hi) {
			y[i] = (D)t;
		} else {
			y[i] = 0;
			atomicMin(bad, (unsigned long long)i);
		}
	}
}

/* int -> int: two's complement truncation through the unsigned target type. */
template <typename S, typename D, typename UD>
__global__ void k_cast_wrap(const S *__restrict__ x, D *__restrict__ y, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = (D)(UD)x[i];
}

/* To a 16-bit float from any non-bool source S (one rounding, C::from). */
template <typename S, typename C>
__global__ void k_cast_to_half(const S *__restrict__ x, uint16_t *__restrict__ y, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = C::from(x[i]);
}

/* From a 16-bit float to float32/float64 (exact), or to the other 16-bit
 * format (D = uint16_t, one rounding of the exact float32 value). */
template <typename C, typename D>
__global__ void k_cast_from_half(const uint16_t *__restrict__ x, D *__restrict__ y, int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = (D)C::wide(x[i]);
}

template <typename C1, typename C2>
__global__ void k_cast_half_half(const uint16_t *__restrict__ x, uint16_t *__restrict__ y,
				 int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = C2::from(C1::wide(x[i]));
}

/* 16-bit float to int, as k_cast_checked on the exact float32 value. */
template <typename C, typename D>
__global__ void k_cast_half_checked(const uint16_t *__restrict__ x, D *__restrict__ y, int64_t n,
				    double lo, double hi, unsigned long long *bad)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
		double t = trunc((double)C::wide(x[i]));
		if (t >= lo && t < hi) {
			y[i] = (D)t;
		} else {
			y[i] = 0;
			atomicMin(bad, (unsigned long long)i);
		}
	}
}

/* bool -> 16-bit float bits (0 or one), 16-bit float -> bool (bits without
 * the sign nonzero: NaN true, -0 false). */
__global__ void k_cast_bool_bits(const uint8_t *__restrict__ x, uint16_t *__restrict__ y,
				 int64_t n, uint16_t one)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = x[i] ? one : (uint16_t)0;
}

__global__ void k_cast_bits_bool(const uint16_t *__restrict__ x, uint8_t *__restrict__ y,
				 int64_t n)
{
	int64_t stride = (int64_t)gridDim.x * blockDim.x;

	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = (x[i] & 0x7fff) != 0;
}

/* Launch helpers: one grid per conversion, on stream s. */
#define GRID(n) dgc_blocks(n), DGC_BLOCK, 0, s
template <typename S, typename D>
static void l_plain(const S *x, D *y, int64_t n, cudaStream_t s)
{
	k_cast_plain<S, D><<<GRID(n)>>>(x, y, n);
}
template <typename S, typename D, typename UD>
static void l_wrap(const S *x, D *y, int64_t n, cudaStream_t s)
{
	k_cast_wrap<S, D, UD><<<GRID(n)>>>(x, y, n);
}
template <typename S, typename D>
static void l_checked(const S *x, D *y, int64_t n, double lo, double hi,
		      unsigned long long *bad, cudaStream_t s)
{
	k_cast_checked<S, D><<<GRID(n)>>>(x, y, n, lo, hi, bad);
}
template <typename D>
static void l_from_bool(const void *x, void *y, int64_t n, cudaStream_t s)
{
	k_cast_from_bool<D><<<GRID(n)>>>((const uint8_t *)x, (D *)y, n);
}

template <typename S>
static cudaError_t cast_from(int to, const void *x, void *y, int64_t n,
			     unsigned long long *bad, cudaStream_t s, bool s_float)
{
	const S *xs = (const S *)x;
	const double i32_lo = -2147483648.0, i32_hi = 2147483648.0;
	const double i64_lo = -9223372036854775808.0, i64_hi = 9223372036854775808.0;

	switch (to) {
	case DGC_F32: l_plain<S, float>(xs, (float *)y, n, s); break;
	case DGC_F64: l_plain<S, double>(xs, (double *)y, n, s); break;
	case DGC_BOOL: k_cast_bool<S><<<GRID(n)>>>(xs, (uint8_t *)y, n); break;
	case DGC_F16: k_cast_to_half<S, C_f16><<<GRID(n)>>>(xs, (uint16_t *)y, n); break;
	case DGC_BF16: k_cast_to_half<S, C_bf16><<<GRID(n)>>>(xs, (uint16_t *)y, n); break;
	case DGC_I32:
		if (s_float)
			l_checked<S, int32_t>(xs, (int32_t *)y, n, i32_lo, i32_hi, bad, s);
		else
			l_wrap<S, int32_t, uint32_t>(xs, (int32_t *)y, n, s);
		break;
	case DGC_I64:
		if (s_float)
			l_checked<S, int64_t>(xs, (int64_t *)y, n, i64_lo, i64_hi, bad, s);
		else
			l_wrap<S, int64_t, uint64_t>(xs, (int64_t *)y, n, s);
		break;
	case DGC_U8:
		if (s_float)
			l_checked<S, uint8_t>(xs, (uint8_t *)y, n, 0.0, 256.0, bad, s);
		else
			l_wrap<S, uint8_t, uint8_t>(xs, (uint8_t *)y, n, s);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return dgc_launched();
}

/* From a 16-bit float of class C to any dtype. */
template <typename C>
static cudaError_t cast_from_half(int to, const void *x, void *y, int64_t n,
				  unsigned long long *bad, cudaStream_t s)
{
	const uint16_t *xs = (const uint16_t *)x;
	const double i32_lo = -2147483648.0, i32_hi = 2147483648.0;
	const double i64_lo = -9223372036854775808.0, i64_hi = 9223372036854775808.0;

	switch (to) {
	case DGC_F32: k_cast_from_half<C, float><<<GRID(n)>>>(xs, (float *)y, n); break;
	case DGC_F64: k_cast_from_half<C, double><<<GRID(n)>>>(xs, (double *)y, n); break;
	case DGC_F16: k_cast_half_half<C, C_f16><<<GRID(n)>>>(xs, (uint16_t *)y, n); break;
	case DGC_BF16: k_cast_half_half<C, C_bf16><<<GRID(n)>>>(xs, (uint16_t *)y, n); break;
	case DGC_BOOL: k_cast_bits_bool<<<GRID(n)>>>(xs, (uint8_t *)y, n); break;
	case DGC_I32:
		k_cast_half_checked<C, int32_t><<<GRID(n)>>>(xs, (int32_t *)y, n, i32_lo, i32_hi,
							     bad);
		break;
	case DGC_I64:
		k_cast_half_checked<C, int64_t><<<GRID(n)>>>(xs, (int64_t *)y, n, i64_lo, i64_hi,
							     bad);
		break;
	case DGC_U8:
		k_cast_half_checked<C, uint8_t><<<GRID(n)>>>(xs, (uint8_t *)y, n, 0.0, 256.0, bad);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return dgc_launched();
}

extern "C" cudaError_t dgc_cast(int from, int to, const void *x, void *y, int64_t n,
				unsigned long long *bad, cudaStream_t s)
{
	if (n <= 0)
		return cudaSuccess;
	switch (from) {
	case DGC_F32: return cast_from<float>(to, x, y, n, bad, s, true);
	case DGC_F64: return cast_from<double>(to, x, y, n, bad, s, true);
	case DGC_I32: return cast_from<int32_t>(to, x, y, n, bad, s, false);
	case DGC_I64: return cast_from<int64_t>(to, x, y, n, bad, s, false);
	case DGC_U8: return cast_from<uint8_t>(to, x, y, n, bad, s, false);
	case DGC_F16: return cast_from_half<C_f16>(to, x, y, n, bad, s);
	case DGC_BF16: return cast_from_half<C_bf16>(to, x, y, n, bad, s);
	case DGC_BOOL:
		switch (to) {
		case DGC_F32: l_from_bool<float>(x, y, n, s); break;
		case DGC_F64: l_from_bool<double>(x, y, n, s); break;
		case DGC_I32: l_from_bool<int32_t>(x, y, n, s); break;
		case DGC_I64: l_from_bool<int64_t>(x, y, n, s); break;
		case DGC_U8:
		case DGC_BOOL: l_from_bool<uint8_t>(x, y, n, s); break;
		case DGC_F16:
			k_cast_bool_bits<<<GRID(n)>>>((const uint8_t *)x, (uint16_t *)y, n,
						      C_f16::one);
			break;
		case DGC_BF16:
			k_cast_bool_bits<<<GRID(n)>>>((const uint8_t *)x, (uint16_t *)y, n,
						      C_bf16::one);
			break;
		default: return cudaErrorInvalidValue;
		}
		return dgc_launched();
	default:
		return cudaErrorInvalidValue;
	}
}
