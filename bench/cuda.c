/* bench_cuda: dg's CUDA kernels (dg_cuda_run on device tensors, output
 * allocation from the caching allocator included) against baselines measured
 * in the same run on the same GPU: cublasSgemm called directly for MatMul (and
 * cublasGemmEx with float32 accumulation for float16/bfloat16 MatMul) and for
 * Conv2D (the sgemm of its im2col shape on patches already in memory), and
 * cudaMemcpy device-to-device bandwidth for Add and Sum; then one training step
 * of the 784-256-10 MLP (batch 64) run by dg_exec_run on /gpu:0 against the CPU.
 * The one file outside kernels/cuda that includes CUDA headers: its baselines
 * must call CUDA directly. Prints medians and ratios; exits 0 with "skipped"
 * without a GPU. Usage: bench_cuda [--quick] */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "bench_util.h"
#include "dg/cuda.h"
#include "dg/exec.h"
#include "dg/gpu.h"
#include "dg/graph.h"
#include "dg/kernels.h"
#include "../test/cuda/mlp_step.h"

static int failures;

static void die(const char *what, const char *msg)
{
	fprintf(stderr, "bench_cuda: %s: %s\n", what, msg);
	exit(2);
}

static void cuda_ok(cudaError_t e, const char *what)
{
	if (e != cudaSuccess)
		die(what, cudaGetErrorString(e));
}

static void blas_ok(cublasStatus_t e, const char *what)
{
	if (e != CUBLAS_STATUS_SUCCESS)
		die(what, cublasGetStatusString(e));
}

/* A device tensor of dtype dt (float32, float16 or bfloat16) holding uniform
 * values in [-1, 1) (deterministic; the 16-bit ones rounded from float32). */
static struct dg_cuda_tensor *dev_rand(struct dg_cuda_stream *s, enum dg_dtype dt, int ndim,
				       const int64_t *dims, unsigned seed)
{
	struct dg_shape sh = dg_shape_make(ndim, dims);
	struct dg_err err = { 0 };
	struct dg_tensor *h = dg_tensor_new_uninit(DG_F32, &sh, &err), *h16 = NULL;
	struct dg_cuda_tensor *d;

	if (!h)
		die("host tensor", err.msg);
	for (int64_t i = 0; i < h->numel; i++) {
		seed = seed * 1664525u + 1013904223u;
		((float *)h->data)[i] = (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
	}
	if (dt != DG_F32) {
		h16 = dg_tensor_new_uninit(dt, &sh, &err);
		if (!h16)
			die("host tensor", err.msg);
		dg_f32_to_half(dt, h->data, h16->data, h->numel);
	}
	d = dg_cuda_upload(s, h16 ? h16 : h, &err);
	dg_tensor_free(h);
	dg_tensor_free(h16);
	if (!d)
		die("upload", err.msg);
	return d;
}

static struct dg_cuda_tensor *dev_f32(struct dg_cuda_stream *s, int ndim, const int64_t *dims,
				      unsigned seed)
{
	return dev_rand(s, DG_F32, ndim, dims, seed);
}

/* Seconds per run of dg's op (median over reps of batches of `batch` runs). */
static double time_dg(struct dg_cuda_stream *s, const char *opname, const char *js,
		      const struct dg_cuda_tensor *const *in, int n_in, int reps, int batch)
{
	const struct dg_op_def *op = dg_op_find(opname);
	json_t *attrs = json_loads(js, 0, NULL);
	double t[32];
	struct dg_err err = { 0 };

	for (int r = -1; r < reps; r++) {   /* r = -1: warm-up */
		double t0 = bench_now_s();
		for (int b = 0; b < batch; b++) {
			struct dg_cuda_tensor *o = NULL;
			if (dg_cuda_run(s, op, attrs, in, n_in, &o, 1, 0, &err) != DG_OK)
				die(opname, err.msg);
			dg_cuda_tensor_free(o);   /* reuse is ordered on the same stream */
		}
		if (dg_cuda_stream_sync(s, &err) != DG_OK)
			die(opname, err.msg);
		if (r >= 0)
			t[r] = (bench_now_s() - t0) / batch;
	}
	json_decref(attrs);
	return bench_median(t, reps);
}

/* One direct cuBLAS product c = a @ b (row-major, as dg computes it). */
static void direct_gemm(cublasHandle_t h, enum dg_dtype dt, int n, const void *a, const void *b,
			void *c)
{
	const float one = 1.0f, zero = 0.0f;

	if (dt == DG_F32) {
		blas_ok(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, n, a, n, &zero,
				    c, n),
			"cublasSgemm");
		return;
	}
	cudaDataType_t ty = dt == DG_F16 ? CUDA_R_16F : CUDA_R_16BF;
	blas_ok(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, ty, n, a, ty, n, &zero,
			     c, ty, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
		"cublasGemmEx");
}

static void bench_matmul(struct dg_cuda_stream *s, cublasHandle_t h, cudaStream_t cs,
			 enum dg_dtype dt, int64_t n, int reps)
{
	int64_t dims[2] = { n, n };
	struct dg_cuda_tensor *a = dev_rand(s, dt, 2, dims, 1), *b = dev_rand(s, dt, 2, dims, 2);
	const struct dg_cuda_tensor *in[2] = { a, b };
	double t[32], tdg, tref, flop = 2.0 * (double)n * (double)n * (double)n;
	int batch = n <= 1024 ? 200 : dt == DG_F32 ? 1 : 4;   /* >= 2 ms a sample */
	const char *name = dt == DG_F32 ? "f32 " : dt == DG_F16 ? "f16 " : "bf16";
	void *c;

	cuda_ok(cudaMalloc(&c, (size_t)(n * n) * dg_dtype_size(dt)), "cudaMalloc");
	tdg = time_dg(s, "MatMul", "{}", in, 2, reps, batch);
	for (int r = -1; r < reps; r++) {
		double t0 = bench_now_s();
		for (int k = 0; k < batch; k++)
			direct_gemm(h, dt, (int)n, a->data, b->data, c);
		cuda_ok(cudaStreamSynchronize(cs), "sync");
		if (r >= 0)
			t[r] = (bench_now_s() - t0) / batch;
	}
	tref = bench_median(t, reps);
	printf("MatMul %5lld^3 %s  dg %8.3f ms %8.1f GFLOP/s | cuBLAS direct %8.3f ms %8.1f "
	       "GFLOP/s | ratio %.3f%s\n", (long long)n, name, tdg * 1e3, flop / tdg * 1e-9,
	       tref * 1e3, flop / tref * 1e-9, tref / tdg, tref / tdg < 0.9 ? "  (below 0.9)" : "");
	if (tref / tdg < 0.9)
		failures++;
	cudaFree(c);
	dg_cuda_tensor_free(a);
	dg_cuda_tensor_free(b);
}

/* Conv2D forward, 3x3 SAME stride 1 on [n, hw, hw, c] to oc channels, against
 * cublasSgemm of its im2col shape called directly: [M = n*hw*hw, K = 9c] x [K,
 * oc], the product dg computes after building the patches (in blocks of images
 * when they exceed its bound). The ratio sgemm / Conv2D is what the patches
 * cost; target at least 0.5. */
static void bench_conv(struct dg_cuda_stream *s, cublasHandle_t h, cudaStream_t cs, int64_t n,
		       int64_t hw, int64_t c, int64_t oc, int reps)
{
	int64_t xd[4] = { n, hw, hw, c }, fd[4] = { 3, 3, c, oc };
	struct dg_cuda_tensor *x = dev_f32(s, 4, xd, 6), *f = dev_f32(s, 4, fd, 7);
	const struct dg_cuda_tensor *in[2] = { x, f };
	int64_t m = n * hw * hw, k = 9 * c;
	double t[32], tdg, tref, flop = 2.0 * (double)m * (double)k * (double)oc;
	const float one = 1.0f, zero = 0.0f;
	int batch = flop < 2e10 ? 20 : 4;       /* >= 2 ms a sample */
	void *col, *y;

	cuda_ok(cudaMalloc(&col, (size_t)(m * k) * sizeof(float)), "cudaMalloc");
	cuda_ok(cudaMalloc(&y, (size_t)(m * oc) * sizeof(float)), "cudaMalloc");
	/* finite, non-zero patches (0x3c3c3c3c is about 0.0115) */
	cuda_ok(cudaMemsetAsync(col, 0x3c, (size_t)(m * k) * sizeof(float), cs), "cudaMemsetAsync");
	tdg = time_dg(s, "Conv2D", "{\"padding\":\"SAME\"}", in, 2, reps, batch);
	for (int r = -1; r < reps; r++) {
		double t0 = bench_now_s();
		/* row-major y[M, oc] = col[M, K] f[K, oc], as dg calls it */
		for (int b = 0; b < batch; b++)
			blas_ok(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)oc, (int)m, (int)k,
					    &one, f->data, (int)oc, col, (int)k, &zero, y, (int)oc),
				"cublasSgemm");
		cuda_ok(cudaStreamSynchronize(cs), "sync");
		if (r >= 0)
			t[r] = (bench_now_s() - t0) / batch;
	}
	tref = bench_median(t, reps);
	printf("Conv2D [%lld,%lld,%lld,%lld] 3x3x%lld SAME f32  dg %8.3f ms %8.1f GFLOP/s | "
	       "cuBLAS sgemm [%lld,%lld]x[%lld,%lld] %8.3f ms | ratio %.3f%s\n", (long long)n,
	       (long long)hw, (long long)hw, (long long)c, (long long)oc, tdg * 1e3,
	       flop / tdg * 1e-9, (long long)m, (long long)k, (long long)k, (long long)oc,
	       tref * 1e3, tref / tdg, tref / tdg < 0.5 ? "  (below 0.5)" : "");
	if (tref / tdg < 0.5)
		failures++;
	cudaFree(col);
	cudaFree(y);
	dg_cuda_tensor_free(x);
	dg_cuda_tensor_free(f);
}

/* Device-to-device copy of `bytes`: seconds per copy (the bandwidth baseline:
 * one read and one write of every byte). */
static double time_copy(cudaStream_t cs, void *dst, const void *src, size_t bytes, int reps)
{
	double t[32];

	for (int r = -1; r < reps; r++) {
		double t0 = bench_now_s();
		for (int k = 0; k < 10; k++)
			cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cs),
				"cudaMemcpyAsync");
		cuda_ok(cudaStreamSynchronize(cs), "sync");
		if (r >= 0)
			t[r] = (bench_now_s() - t0) / 10;
	}
	return bench_median(t, reps);
}

static void bench_bandwidth(struct dg_cuda_stream *s, cudaStream_t cs, int64_t n, int reps)
{
	int64_t dims[1] = { n }, dims2[2] = { 8192, n / 8192 };
	struct dg_cuda_tensor *a = dev_f32(s, 1, dims, 3), *b = dev_f32(s, 1, dims, 4);
	struct dg_cuda_tensor *m = dev_f32(s, 2, dims2, 5);
	const struct dg_cuda_tensor *ab[2] = { a, b }, *one[1] = { a }, *mm[1] = { m };
	size_t bytes = (size_t)n * 4;
	double tcopy = time_copy(cs, b->data, a->data, bytes, reps);
	double bw_copy = 2.0 * (double)bytes / tcopy;   /* read + write */
	double tadd = time_dg(s, "Add", "{}", ab, 2, reps, 10);
	double bw_add = 3.0 * (double)bytes / tadd;     /* two reads, one write */
	static const char *const sums[][2] = {
		{ "{}", "all" }, { "{\"axis\":1}", "rows [8192,N/8192] axis 1" },
		{ "{\"axis\":0}", "cols [8192,N/8192] axis 0" },
	};

	printf("copy D2D  %lld f32       %8.3f ms  %7.1f GB/s (read+write)\n", (long long)n,
	       tcopy * 1e3, bw_copy * 1e-9);
	printf("Add       %lld f32       %8.3f ms  %7.1f GB/s | ratio to copy %.3f%s\n",
	       (long long)n, tadd * 1e3, bw_add * 1e-9, bw_add / bw_copy,
	       bw_add / bw_copy < 0.7 ? "  (below 0.7)" : "");
	if (bw_add / bw_copy < 0.7)
		failures++;
	for (int i = 0; i < 3; i++) {
		double ts = time_dg(s, "Sum", sums[i][0], i ? mm : one, 1, reps, 10);
		double bw = (double)bytes / ts;               /* one read */
		printf("Sum %-30s %8.3f ms  %7.1f GB/s | ratio to copy %.3f\n", sums[i][1],
		       ts * 1e3, bw * 1e-9, bw / bw_copy);
	}
	dg_cuda_tensor_free(a);
	dg_cuda_tensor_free(b);
	dg_cuda_tensor_free(m);
}

/* The MLP step graph (test/cuda/mlp_step.h, the one the parity test checks)
 * with every node on device dev (NULL: the CPU). */
static struct dg_graph *mlp_graph(const char *dev)
{
	struct dg_err err = { 0 };
	struct dg_graph *g;

	if (mlp_step_graph(dev, &g, NULL, &err) != DG_OK)
		die("MLP step graph", err.msg);
	return g;
}

/* Seconds per step (median) of reps steps; *loss gets the last step's loss.
 * Weights are fed from host memory and the new ones fetched back, as a worker
 * that pulls and pushes variables does. */
static double time_mlp(const struct dg_graph *g, const struct dg_feed *f, int reps, double *loss)
{
	static const char *const fetch[5] = { "loss", "w1_new", "b1_new", "w2_new", "b2_new" };
	struct dg_err err = { 0 };
	double t[64];

	for (int r = -2; r < reps; r++) {   /* two warm-up steps */
		struct dg_tensor *out[5];
		struct dg_exec_opts o = { .step = (uint64_t)(r + 2) };
		double t0 = bench_now_s();
		if (dg_exec_run(g, f, 6, fetch, 5, out, &o, &err) != DG_OK)
			die("MLP step", err.msg);
		if (r >= 0)
			t[r] = bench_now_s() - t0;
		*loss = dg_tensor_get_f64(out[0], 0);
		for (int k = 0; k < 5; k++)
			dg_tensor_free(out[k]);
	}
	return bench_median(t, reps);
}

static void bench_mlp(int reps)
{
	static const int64_t dims[6][2] = { { 64, 784 }, { 64, 0 }, { 784, 256 }, { 256, 0 },
					     { 256, 10 }, { 10, 0 } };
	static const char *const names[6] = { "x", "y", "w1", "b1", "w2", "b2" };
	struct dg_graph *cpu = mlp_graph(NULL), *gpu = mlp_graph("/gpu:0");
	struct dg_tensor *t[6];
	struct dg_feed f[6];
	unsigned seed = 7;
	double lc, lg, tc, tg;

	dg_blas_init(NULL);
	for (int k = 0; k < 6; k++) {
		struct dg_shape sh = dg_shape_make(dims[k][1] ? 2 : 1, dims[k]);
		t[k] = dg_tensor_new_uninit(k == 1 ? DG_I32 : DG_F32, &sh, NULL);
		if (!t[k])
			die("MLP inputs", "out of memory");
		for (int64_t i = 0; i < t[k]->numel; i++) {
			double u;
			seed = seed * 1664525u + 1013904223u;
			u = (double)(seed >> 8) / (double)(1u << 24);
			dg_tensor_set_f64(t[k], i, k == 0 ? u : k == 1 ? floor(u * 10)
							    : (u - 0.5) * 0.1);
		}
		f[k] = (struct dg_feed){ names[k], t[k] };
	}
	tc = time_mlp(cpu, f, reps, &lc);
	tg = time_mlp(gpu, f, reps, &lg);
	printf("MLP 784-256-10 batch 64, one SGD step (forward+backward+update, weights in and "
	       "out through host memory)\n  CPU %8.3f ms/step %9.0f examples/s | GPU %8.3f "
	       "ms/step %9.0f examples/s | speed-up %.2fx | loss cpu %.6f gpu %.6f\n", tc * 1e3,
	       64 / tc, tg * 1e3, 64 / tg, tc / tg, lc, lg);
	if (fabs(lc - lg) > 1e-4 * fabs(lc)) {
		printf("  (GPU loss differs from the CPU's)\n");
		failures++;
	}
	for (int k = 0; k < 6; k++)
		dg_tensor_free(t[k]);
	dg_graph_free(cpu);
	dg_graph_free(gpu);
}

int main(int argc, char **argv)
{
	bool quick = argc > 1 && !strcmp(argv[1], "--quick");
	struct dg_cuda_stream *s = NULL;
	struct dg_err err = { 0 };
	cublasHandle_t h;
	cudaStream_t cs;
	static const int64_t sizes[] = { 1024, 4096, 8192 };

	if (!dg_cuda_available()) {
		printf("skipped: no CUDA device (%s)\n", dg_gpu_describe());
		return 0;
	}
	printf("%s\n", dg_gpu_describe());
	if (dg_cuda_stream_new(0, &s, &err) != DG_OK)
		die("stream", err.msg);
	cuda_ok(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), "cudaStreamCreate");
	blas_ok(cublasCreate(&h), "cublasCreate");
	blas_ok(cublasSetStream(h, cs), "cublasSetStream");
	for (int i = 0; i < 3; i++)
		if (!(quick && sizes[i] == 8192))
			bench_matmul(s, h, cs, DG_F32, sizes[i], quick ? 3 : 7);
	/* float16/bfloat16 storage, float32 accumulation (cublasGemmEx both sides) */
	for (int i = 0; i < 3; i++) {
		if (quick && sizes[i] == 8192)
			continue;
		bench_matmul(s, h, cs, DG_F16, sizes[i], quick ? 3 : 7);
		bench_matmul(s, h, cs, DG_BF16, sizes[i], quick ? 3 : 7);
	}
	/* a mid-network layer, an early wide one (its patches in blocks), a deep one */
	bench_conv(s, h, cs, 32, 28, 128, 128, quick ? 3 : 7);
	if (!quick) {
		bench_conv(s, h, cs, 64, 56, 64, 64, 7);
		bench_conv(s, h, cs, 16, 14, 256, 256, 7);
	}
	bench_bandwidth(s, cs, (int64_t)1 << (quick ? 24 : 26), quick ? 3 : 7);
	bench_mlp(quick ? 10 : 50);
	printf("device memory: %.1f MiB in use, %.1f MiB cached by dg's allocator\n",
	       (double)dg_cuda_mem_used_bytes(0) / (1 << 20),
	       (double)dg_cuda_mem_cached_bytes(0) / (1 << 20));
	cublasDestroy(h);
	cudaStreamDestroy(cs);
	dg_cuda_stream_free(s);
	printf("%s\n", failures ? "some targets missed (see above)" : "all targets met");
	return 0;
}
