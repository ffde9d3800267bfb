/* The host launchers of the .cu files, callable from C (dispatch.c, conv_gemm.c)
 * and defined in C++ (eltwise.cu, reduce.cu, nn.cu, array.cu, random.cu,
 * grad.cu, conv.cu, norm.cu). Plain types only: the C glue checks shapes and
 * attrs and turns the returned cudaError_t into DG_EDEVICE (DG_CUDA_TRY in
 * cuda_internal.h). Every launcher queues work on stream s and returns
 * without waiting. */
#ifndef DG_CUDA_LAUNCH_H
#define DG_CUDA_LAUNCH_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DGC_MAX_DIMS 8

/* dtype codes: the numbers of enum dg_dtype (dg/tensor.h). */
enum { DGC_F32 = 0, DGC_F64 = 1, DGC_I32 = 2, DGC_I64 = 3, DGC_U8 = 4, DGC_BOOL = 5,
       DGC_F16 = 6, DGC_BF16 = 7 };

/* An N-d walk over a C-order output of dims dim[0..nd), reading up to three
 * operands with element strides st[k][..] (0 on broadcast dims). nd >= 1. */
struct dgc_walk {
	int nd;
	int64_t dim[DGC_MAX_DIMS];
	int64_t st[3][DGC_MAX_DIMS];
};

enum dgc_unary { DGC_NEG, DGC_ABS, DGC_SQUARE, DGC_RELU, DGC_SQRT, DGC_EXP, DGC_LOG,
		 DGC_SIGMOID, DGC_TANH };
enum dgc_binary { DGC_ADD, DGC_SUB, DGC_MUL, DGC_DIV, DGC_POW, DGC_MAX, DGC_MIN,
		  DGC_EQ, DGC_NE, DGC_LT, DGC_LE, DGC_GT, DGC_GE };

/* y[i] = f(x[i]) for n elements. Returns cudaErrorInvalidValue for a pair
 * (op, dt) without a kernel (the glue checks the table first). float16 and
 * bfloat16: Relu only (on the bits, as the CPU). */
cudaError_t dgc_unary(int op, int dt, const void *x, void *y, int64_t n, cudaStream_t s);
/* o = a op b; w == NULL: same shapes, n elements flat; else w walks o (st[0] for
 * a, st[1] for b). Comparisons write bool bytes. float16 and bfloat16: Add, Sub
 * and Mul in float32, rounded once to the dtype (bit-identical to the CPU). */
cudaError_t dgc_binary(int op, int dt, const void *a, const void *b, void *o, int64_t n,
		       const struct dgc_walk *w, cudaStream_t s);
/* Which (op, dtype) pairs dgc_unary/dgc_binary implement. */
int dgc_unary_has(int op, int dt);
int dgc_binary_has(int op, int dt);
/* o = k ? x : y over walk w (st[0] cond, st[1] x, st[2] y); esz = 1, 2, 4 or 8. */
cudaError_t dgc_where(const uint8_t *k, const void *x, const void *y, void *o, int64_t n,
		      const struct dgc_walk *w, int esz, cudaStream_t s);
/* Convert n elements from dtype `from` to `to` (the CPU's rules). Float-to-int
 * values without a target value (NaN, Inf, out of range) store 0 and lower
 * *bad (device memory, preset to UINT64_MAX by the caller) to their index.
 * To float16/bfloat16: one round-to-nearest-even from the source value
 * (cuda_fp16.h/cuda_bf16.h intrinsics), overflow gives inf. */
cudaError_t dgc_cast(int from, int to, const void *x, void *y, int64_t n,
		     unsigned long long *bad, cudaStream_t s);

/* General strided copy of esz-byte elements (esz = 1, 2, 4 or 8): for each index of dims dim[0..nd)
 * (C order), dst[dst_off + sum idx*st[0]] = src[src_off + sum idx*st[1]], in
 * elements. n = product of dims. Slice, Transpose, Concat and broadcasts. */
cudaError_t dgc_copy(void *dst, int64_t dst_off, const void *src, int64_t src_off,
		     const struct dgc_walk *w, int64_t n, int esz, cudaStream_t s);

/* Whether each of the n indices ix (int32 when idt is DGC_I32, else int64) lies
 * in [0, limit): the smallest position of one outside lowers *bad. */
cudaError_t dgc_index_check(int idt, const void *ix, int64_t n, int64_t limit,
			    unsigned long long *bad, cudaStream_t s);
/* Gather: y[i, j] = p[ix[i], j] for i < n_ix, j < inner, of esz-byte elements
 * (esz = 1, 2, 4 or 8); an index outside [0, rows) leaves its row of y
 * unwritten (dgc_index_check reports it). */
cudaError_t dgc_gather(int idt, const void *p, const void *ix, void *y, int64_t n_ix,
		       int64_t inner, int64_t rows, int esz, cudaStream_t s);
/* UnsortedSegmentSum: y[ids[i], j] += x[i, j] for i < n_ids, j < inner, into y
 * zeroed by the caller; dt float32, float64, int32 or int64 (integers wrap).
 * Atomic adds: float sums come in any order. ids outside [0, num) are skipped
 * (dgc_index_check reports them). */
cudaError_t dgc_segment_sum(int dt, int idt, const void *x, const void *ids, void *y,
			    int64_t n_ids, int64_t inner, int64_t num, cudaStream_t s);

/* dst[0..n) = the low esz bytes of pattern (esz = 1, 2, 4 or 8), e.g. OnesLike. */
cudaError_t dgc_fill(void *dst, int64_t n, int esz, uint64_t pattern, cudaStream_t s);

enum dgc_reduce { DGC_RSUM, DGC_RMEAN, DGC_RMAX, DGC_RMIN };
/* y[o] = reduce over r of x[koff(o) + roff(r)], o < n_out, r < count: kept
 * describes the output dims with their input strides (st[0]), red the reduced
 * dims with theirs (st[0]). cols != 0 picks the column form (one thread per
 * output; for kept dims whose innermost stride is 1), else one block per output.
 * Float dtypes only; sums and means accumulate in double. scratch: device memory
 * of at least dgc_reduce_scratch(n_out, count, cols) bytes (may be NULL when
 * that is 0). count >= 1. */
cudaError_t dgc_reduce(int op, int dt, const void *x, void *y, int64_t n_out, int64_t count,
		       const struct dgc_walk *kept, const struct dgc_walk *red, int cols,
		       void *scratch, cudaStream_t s);
size_t dgc_reduce_scratch(int64_t n_out, int64_t count, int cols);
/* ArgMax of x viewed [outer, n, inner] into y[outer, inner] (int32 when ot ==
 * DGC_I32, else int64); n >= 1; first index wins ties, first NaN wins. */
cudaError_t dgc_argmax(int dt, int ot, const void *x, void *y, int64_t outer, int64_t n,
		       int64_t inner, cudaStream_t s);

/* Softmax (log_form 0) or LogSoftmax (1) of x viewed [outer, n, inner] along n. */
cudaError_t dgc_softmax(int dt, const void *x, void *y, int64_t outer, int64_t n,
			int64_t inner, int log_form, cudaStream_t s);
/* loss[r] = sum_c lab[r,c] * (lse_r - x[r,c]) for rows r < rows of n classes. */
cudaError_t dgc_xent(int dt, const void *x, const void *lab, void *loss, int64_t rows,
		     int64_t n, cudaStream_t s);
/* loss[r] = lse_r - x[r, label[r]]; labels int32 (ldt DGC_I32) or int64. A label
 * outside [0, n) stores NaN and lowers *bad to its row. */
cudaError_t dgc_sparse_xent(int dt, int ldt, const void *x, const void *lab, void *loss,
			    int64_t rows, int64_t n, unsigned long long *bad, cudaStream_t s);

/* OneHot: y[i, j] = j == ix[i] ? on : off for i < n, j < depth, y float32 or
 * float64 (dt), indices int32 (idt DGC_I32) or int64; an index outside [0,
 * depth) gives a row of off. */
cudaError_t dgc_one_hot(int dt, int idt, const void *ix, void *y, int64_t n, int64_t depth,
			double on, double off, cudaStream_t s);

/* The fused gradient helpers of grad.cu: o = f(g, v) over n elements of float
 * dtype dt, with v the forward input (ReluGrad) or output (Sigmoid, Tanh). */
enum dgc_grad { DGC_GRELU, DGC_GSIGMOID, DGC_GTANH };
cudaError_t dgc_ew_grad(int op, int dt, const void *g, const void *v, void *o, int64_t n,
			cudaStream_t s);
/* o[r, :] = softmax(x[r, :]) - one_hot(lab[r]) for rows of n >= 1 classes; labels
 * int32 (ldt DGC_I32) or int64. A label outside [0, n) fills its row with NaN and
 * lowers *bad to the row. */
cudaError_t dgc_sparse_xent_grad(int dt, int ldt, const void *x, const void *lab, void *o,
				 int64_t rows, int64_t n, unsigned long long *bad,
				 cudaStream_t s);

/* The Philox4x32-10 stream of kernels/cpu/random.c, value for value. key from
 * the seed, step the counter's high half. */
struct dgc_philox {
	uint32_t key[2];
	uint32_t step_lo, step_hi;
};
/* Uniform in [a, b) for float dtypes, [ia, ib) for int32/int64. */
cudaError_t dgc_uniform(int dt, void *y, int64_t n, struct dgc_philox g, double a, double b,
			int64_t ia, int64_t ib, cudaStream_t s);
/* mean + sd * z; truncated: re-draw as the CPU does. A block that exhausts its
 * 65535 attempts lowers *bad to its first element index. */
cudaError_t dgc_normal(int dt, void *y, int64_t n, struct dgc_philox g, double mean, double sd,
		       int truncated, unsigned long long *bad, cudaStream_t s);

/* Dropout of n elements (float32 or float64): y[i] = x[i] / (1 - rate) where
 * the 24-bit uniform of word i % 4 of Philox block i / 4 is at least
 * (float)rate, else 0 (kernels/cpu/random.c's mask, bit for bit). */
cudaError_t dgc_dropout(int dt, const void *x, void *y, int64_t n, struct dgc_philox g,
			double rate, cudaStream_t s);

/* The geometry of a convolution or pooling, kernels/cpu/cpu.h's struct
 * cpu_conv_geom: input [n, h, w, c] (NHWC), window kh x kw with dilations dh,
 * dw and strides sh, sw, output [n, oh, ow, oc], and pt rows and pl columns
 * of padding before the first. */
struct dgc_conv {
	int64_t n, h, w, c;
	int64_t kh, kw, oc;
	int64_t sh, sw, dh, dw;
	int64_t oh, ow, pt, pl;
};
/* The patch matrix of images [i0, i0 + nb) of x (float32 or float64 dt): col
 * [nb*oh*ow, kh*kw*c], one row per output pixel in (ky, kx, channel) order, 0
 * where a tap falls in the padding. kh*kw*c <= INT_MAX. */
cudaError_t dgc_im2col(int dt, const struct dgc_conv *g, const void *x, int64_t i0, int64_t nb,
		       void *col, cudaStream_t s);
/* Images [i0, i0 + nb) of dx (every element written) from their patch
 * gradients dcol [nb*oh*ow, kh*kw*c]: each element the sum of the entries of
 * the taps that read it. */
cudaError_t dgc_col2im(int dt, const struct dgc_conv *g, const void *dcol, int64_t i0,
		       int64_t nb, void *dx, cudaStream_t s);
/* MaxPool2D (max != 0; NaN wins) or AvgPool2D (padding not counted) of x into
 * y [n, oh, ow, c]. */
cudaError_t dgc_pool(int dt, const struct dgc_conv *g, const void *x, void *y, int max,
		     cudaStream_t s);
/* The gradient dx (x's shape, every element written) of a pooling from dy [n,
 * oh, ow, c]: MaxPool2DGrad when max (arg: device memory for n*oh*ow*c
 * positions; x and the forward output y are read), each window's dy to its
 * first maximum; AvgPool2DGrad otherwise (x, y and arg unused), spread
 * evenly. */
cudaError_t dgc_pool_grad(int dt, const struct dgc_conv *g, const void *x, const void *y,
			  const void *dy, void *dx, int max, int64_t *arg, cudaStream_t s);

/* FusedBatchNorm over x viewed [m, ch] (ch >= 1; float32 or float64 dt):
 * mean_in and var_in NULL: x's own moments (in double), var_out Bessel-
 * corrected; else the given statistics, copied out. y = (x - mean) /
 * sqrt(var + eps) * scale + offset. scratch: device memory of at least
 * dgc_bn_scratch(m, ch) bytes. */
size_t dgc_bn_scratch(int64_t m, int64_t ch);
cudaError_t dgc_bn(int dt, const void *x, const void *scale, const void *offset,
		   const void *mean_in, const void *var_in, void *y, void *mean_out, void *var_out,
		   int64_t m, int64_t ch, double eps, void *scratch, cudaStream_t s);
/* FusedBatchNormGrad: dx, dscale (sum of dy * xhat) and doffset (sum of dy)
 * of y = xhat * scale + offset; statistics as in dgc_bn. Same scratch. */
cudaError_t dgc_bn_grad(int dt, const void *dy, const void *x, const void *scale,
			const void *mean_in, const void *var_in, void *dx, void *dscale,
			void *doffset, int64_t m, int64_t ch, double eps, void *scratch,
			cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
