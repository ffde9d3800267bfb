/* bench_kernels: dg's CPU kernels, run through the op registry (dg_op_run on dg
 * tensors, output allocation included), against a baseline measured in the same
 * run: cblas_sgemm called directly for MatMul (same library and core, through
 * dg_blas_get), plain C loops for Add, Sum and Softmax, and PyTorch's CPU kernels
 * (bench/conv_torch.py) for Conv2D and MaxPool2D. Prints the median of
 * several timed repetitions per case and the ratio (> 1: dg is faster).
 * Usage: bench_kernels [--quick] [--threads N]   (bench/README.md has figures) */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include "bench_util.h"
#include "blas.h"
#include "dg/kernels.h"

struct opts {
	int reps;          /* timed repetitions per case (after WARMUP runs) */
	int threads;       /* OpenBLAS threads for both sides of MatMul */
	int quick;         /* --quick: fewer reps, no 2048 */
};

static int failures;       /* results that disagree with the baseline */
static volatile double sink; /* baseline results go here so no loop is dead code */

/* Uniform in [-1, 1), deterministic. */
static void fill(float *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		p[i] = (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
	}
}

static struct dg_tensor *new_f32(int ndim, const int64_t *dims, unsigned seed)
{
	struct dg_shape s = dg_shape_make(ndim, dims);
	struct dg_err err = { 0 };
	struct dg_tensor *t = dg_tensor_new_uninit(DG_F32, &s, &err);

	if (!t) {
		fprintf(stderr, "bench_kernels: %s\n", err.msg);
		exit(2);
	}
	fill(t->data, (size_t)t->numel, seed);
	return t;
}

/* --- the dg side: one registry run, output freed ----------------------------- */

struct dg_case {
	const struct dg_op_def *op;
	json_t *attrs;
	const struct dg_tensor *in[3];
	int n_in;
};

/* Runs the op once; returns its output (owned) or NULL after printing why. */
static struct dg_tensor *dg_once(const struct dg_case *c)
{
	struct dg_tensor *out = NULL;
	struct dg_err err = { 0 };

	if (dg_op_run(c->op, c->attrs, c->in, c->n_in, &out, 1, 0, &err) != DG_OK) {
		printf("skipped: %s failed: %s\n", c->op->name, err.msg);
		return NULL;
	}
	return out;
}

/* Warm-up runs of the dg side before timing. A new output size takes a few
 * runs to settle in glibc's heap (the first blocks come from fresh pages, ~3 us
 * per 4 KiB page fault in a VM); a worker runs the same shapes every step, so
 * the steady state is what matters. Blocks over glibc's mmap limit (32 MiB)
 * never settle: see bench/README.md. */
#define WARMUP 5

static double time_dg(const struct dg_case *c)
{
	double t0 = bench_now_s();
	struct dg_tensor *out = dg_once(c);

	dg_tensor_free(out);
	return bench_now_s() - t0;
}

/* Looks the op up; prints the skip line when it is not registered. */
static const struct dg_op_def *need_op(const char *label, const char *name)
{
	const struct dg_op_def *op = dg_op_find(name);

	if (!op)
		printf("%s: skipped: op %s not registered\n", label, name);
	return op;
}

/* Max |x - y| / (1 + |y|) over n floats. */
static double max_rel_diff(const float *x, const float *y, size_t n)
{
	double m = 0;

	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)x[i] - (double)y[i]) / (1.0 + fabs((double)y[i]));
		if (isnan(d))
			return INFINITY;
		if (d > m)
			m = d;
	}
	return m;
}

static void check(const char *label, double diff, double tol)
{
	if (diff > tol) {
		printf("  WARNING: %s: dg and baseline differ (max rel diff %.3g > %.3g)\n", label,
		       diff, tol);
		failures++;
	}
}

/* --- baselines: separate, never inlined, results used ------------------------- */

__attribute__((noinline)) static void base_add(const float *restrict a,
					       const float *restrict b, float *restrict c,
					       size_t n)
{
	for (size_t i = 0; i < n; i++)
		c[i] = a[i] + b[i];
}

/* What a careful C programmer writes for a fast float sum: 16 independent float
 * lanes (the compiler vectorises them; one serial accumulator would be bound by
 * the add latency), combined in double at the end. */
__attribute__((noinline)) static double base_sum(const float *restrict a, size_t n)
{
	float lane[16] = { 0 };
	double s = 0;
	size_t body = n - n % 16;

	for (size_t i = 0; i < body; i += 16)
		for (int j = 0; j < 16; j++)
			lane[j] += a[i + j];
	for (size_t i = body; i < n; i++)
		s += a[i];
	for (int j = 0; j < 16; j++)
		s += lane[j];
	return s;
}

/* Softmax over the last axis of x[rows, cols]: max, exp and sum, normalise. */
__attribute__((noinline)) static void base_softmax(const float *restrict x,
						   float *restrict y, size_t rows, size_t cols)
{
	for (size_t r = 0; r < rows; r++) {
		const float *xr = x + r * cols;
		float *yr = y + r * cols;
		float mx = xr[0], s = 0;

		for (size_t j = 1; j < cols; j++)
			mx = xr[j] > mx ? xr[j] : mx;
		for (size_t j = 0; j < cols; j++) {
			yr[j] = expf(xr[j] - mx);
			s += yr[j];
		}
		float inv = 1.0f / s;
		for (size_t j = 0; j < cols; j++)
			yr[j] *= inv;
	}
}

/* --- cases ------------------------------------------------------------------- */

/* One case: the dg op and its inputs, plus the baseline over the same data. */
struct bench {
	const char *label;
	struct dg_case dg;
	struct dg_tensor *t[2];        /* owned inputs */
	float *out;                    /* baseline output (preallocated, reused) */
	size_t n_out;                  /* its element count */
	double result;                 /* baseline scalar result (Sum) */
	int64_t n;                     /* problem size: MatMul side, element count */
	const struct dg_blas *bl;
	void (*base)(struct bench *b); /* one baseline run */
	double tol;                    /* max rel diff dg vs baseline */
	double md, mb;                 /* median seconds: dg, baseline */
};

static void run_matmul_base(struct bench *b)
{
	int n = (int)b->n;

	b->bl->sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, b->t[0]->data,
		     n, b->t[1]->data, n, 0.0f, b->out, n);
}

static void run_add_base(struct bench *b)
{
	base_add(b->t[0]->data, b->t[1]->data, b->out, b->n_out);
}

static void run_sum_base(struct bench *b)
{
	b->result = base_sum(b->t[0]->data, (size_t)b->t[0]->numel);
}

static void run_softmax_base(struct bench *b)
{
	const struct dg_shape *s = &b->t[0]->shape;

	base_softmax(b->t[0]->data, b->out, (size_t)s->dim[0], (size_t)s->dim[1]);
}

/* Check dg against the baseline once, warm up, then time both sides
 * interleaved (so drift in clock or load hits both alike). Returns false
 * (after printing why) when the dg side cannot run. */
static bool measure(const struct opts *o, struct bench *b)
{
	double td[64], tb[64];
	struct dg_tensor *ref;

	printf("%s: ", b->label);
	fflush(stdout);
	if (b->n_out && !b->out) {
		printf("skipped: out of memory for the baseline\n");
		return false;
	}
	ref = dg_once(&b->dg);
	if (!ref)
		return false;
	b->base(b);
	if (b->n_out)
		check(b->label, max_rel_diff(ref->data, b->out, b->n_out), b->tol);
	else
		check(b->label, fabs(dg_tensor_get_f64(ref, 0) - b->result) /
		      (1.0 + fabs(b->result)), b->tol);
	dg_tensor_free(ref);
	for (int i = 1; i < WARMUP; i++)
		time_dg(&b->dg);
	for (int r = 0; r < o->reps; r++) {
		double t0;

		td[r] = time_dg(&b->dg);
		t0 = bench_now_s();
		b->base(b);
		tb[r] = bench_now_s() - t0;
		sink += b->n_out ? b->out[(size_t)r * 4099 % b->n_out] : b->result;
	}
	b->md = bench_median(td, o->reps);
	b->mb = bench_median(tb, o->reps);
	return true;
}

static void bench_free(struct bench *b)
{
	dg_tensor_free(b->t[0]);
	dg_tensor_free(b->t[1]);
	dg_free_aligned(b->out);
}

/* dg's MatMul GFLOP/s (0 when skipped). */
static double bench_matmul(const struct opts *o, int64_t n)
{
	const int64_t dims[2] = { n, n };
	const double flop = 2.0 * (double)n * (double)n * (double)n;
	char label[64];
	struct bench b = { .label = label, .n = n, .base = run_matmul_base, .tol = 1e-5 };

	double gflops = 0;

	snprintf(label, sizeof label, "matmul %lld f32", (long long)n);
	b.dg.op = need_op(label, "MatMul");
	b.bl = dg_blas_get(NULL);
	if (!b.dg.op)
		return 0;
	if (!b.bl) {
		printf("%s: skipped: %s\n", label, dg_blas_describe());
		return 0;
	}
	b.t[0] = new_f32(2, dims, 1);
	b.t[1] = new_f32(2, dims, 2);
	b.n_out = (size_t)(n * n);
	b.out = dg_alloc_aligned(b.n_out * sizeof(float));
	b.dg.in[0] = b.t[0];
	b.dg.in[1] = b.t[1];
	b.dg.n_in = 2;
	if (measure(o, &b)) {
		gflops = flop / b.md / 1e9;
		printf("dg %.1f GFLOP/s  openblas %.1f GFLOP/s  ratio %.3f (median of %d)\n",
		       gflops, flop / b.mb / 1e9, b.mb / b.md, o->reps);
	}
	bench_free(&b);
	return gflops;
}

/* --core-probe REPS (run by bench_cores in a child whose OPENBLAS_CORETYPE is
 * the core to time): "CORENAME GFLOPS" of cblas_sgemm 1024 on one thread, the
 * median of REPS after one warm-up. OpenBLAS reads the core type once, when
 * it loads, hence a process per core. */
static int core_probe(int reps)
{
	const int64_t n = 1024, dims[2] = { n, n };
	const struct dg_blas *bl = dg_blas_get(NULL);
	struct dg_tensor *a = new_f32(2, dims, 1), *b = new_f32(2, dims, 2);
	float *c = dg_alloc_aligned((size_t)(n * n) * sizeof(float));
	double t[64];

	if (!bl || !a || !b || !c)
		return 1;
	bl->set_num_threads(1);
	for (int r = -1; r < reps; r++) {
		double t0 = bench_now_s();
		bl->sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f,
			  a->data, (int)n, b->data, (int)n, 0.0f, c, (int)n);
		if (r >= 0)
			t[r] = bench_now_s() - t0;
	}
	printf("%s %.2f\n", bl->get_corename(), 2.0 * (double)(n * n * n) /
	       bench_median(t, reps) / 1e9);
	dg_tensor_free(a);
	dg_tensor_free(b);
	dg_free_aligned(c);
	return 0;
}

/* cblas_sgemm 1024 on one thread under OpenBLAS's own core and under every
 * core dg considers for this CPU (dg_blas_core_candidates), each in a child
 * process, against dg's MatMul 1024 measured above with the core dg runs:
 * the target is 0.95 of the fastest. */
static void bench_cores(const struct opts *o, double dg_gflops, const char *user_core)
{
	const char *cand[8], *names[9];
	bool measure;
	int n = dg_blas_core_candidates(cand, 8, &measure);
	double best = 0;
	char best_name[48] = "", reps[16];

	if (o->threads != 1 || dg_gflops <= 0) {
		printf("core types: skipped (one thread only, and needs the matmul 1024 case)\n");
		return;
	}
	if (user_core) {
		printf("core types: skipped: OPENBLAS_CORETYPE=%s is set, so dg runs that core\n",
		       user_core);
		return;
	}
	names[0] = NULL;   /* OpenBLAS's own pick */
	for (int i = 0; i < n; i++)
		names[i + 1] = cand[i];
	snprintf(reps, sizeof reps, "%d", o->reps);
	printf("core types (cblas_sgemm 1024, one thread, median of %d, a process each):\n",
	       o->reps);
	for (int i = 0; i <= n; i++) {
		int fd[2];
		char buf[128] = "", core[48] = "";
		double g = 0;
		pid_t pid;
		ssize_t got;
		if (pipe(fd) != 0)
			return;
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			dup2(fd[1], 1);
			close(fd[0]);
			close(fd[1]);
			if (names[i])
				setenv("OPENBLAS_CORETYPE", names[i], 1);
			else
				unsetenv("OPENBLAS_CORETYPE");   /* dg's own choice may be set here */
			setenv("DG_BLAS_PROBE", "0", 1);   /* OpenBLAS's own pick stays its own */
			execl("/proc/self/exe", "bench_kernels", "--core-probe", reps, (char *)NULL);
			_exit(127);
		}
		close(fd[1]);
		got = pid > 0 ? read(fd[0], buf, sizeof buf - 1) : -1;
		close(fd[0]);
		if (pid > 0)
			waitpid(pid, NULL, 0);
		if (got > 0)
			buf[got] = '\0';
		if (got <= 0 || sscanf(buf, "%47s %lf", core, &g) != 2) {
			printf("  %-22s failed\n", names[i] ? names[i] : "(OpenBLAS's own)");
			continue;
		}
		printf("  %-22s core %-12s %7.1f GFLOP/s\n", names[i] ? names[i] :
		       "(OpenBLAS's own)", core, g);
		if (g > best) {
			best = g;
			snprintf(best_name, sizeof best_name, "%s", core);
		}
	}
	if (best > 0)
		printf("matmul 1024 f32, one thread: dg %.1f GFLOP/s = %.3f of the fastest core "
		       "(%s, %.1f) (target >= 0.95: %s)\n", dg_gflops, dg_gflops / best, best_name,
		       best, dg_gflops >= 0.95 * best ? "met" : "MISSED");
	(void)measure;
}

/* Print a memory-bound case: times, bandwidth over bytes moved, ratio. */
static void print_bw(const struct opts *o, const struct bench *b, double bytes)
{
	printf("dg %.2f ms (%.1f GB/s)  loop %.2f ms (%.1f GB/s)  ratio %.3f (median of %d)\n",
	       b->md * 1e3, bytes / b->md / 1e9, b->mb * 1e3, bytes / b->mb / 1e9,
	       b->mb / b->md, o->reps);
}

static void bench_add(const struct opts *o)
{
	const int64_t n = (int64_t)1 << 24;
	struct bench b = { .label = "add 2^24 f32", .n = n, .base = run_add_base, .tol = 0 };

	b.dg.op = need_op(b.label, "Add");
	if (!b.dg.op)
		return;
	b.t[0] = new_f32(1, &n, 3);
	b.t[1] = new_f32(1, &n, 4);
	b.n_out = (size_t)n;
	b.out = dg_alloc_aligned(b.n_out * sizeof(float));
	b.dg.in[0] = b.t[0];
	b.dg.in[1] = b.t[1];
	b.dg.n_in = 2;
	if (measure(o, &b))
		print_bw(o, &b, 3.0 * (double)n * sizeof(float));   /* 2 reads + 1 write */
	bench_free(&b);
}

static void bench_sum(const struct opts *o)
{
	const int64_t n = (int64_t)1 << 24;
	/* 2^24 values in [-1,1): |sum| ~ 2^12, float lanes vs dg's order differ slightly. */
	struct bench b = { .label = "sum 2^24 f32", .n = n, .base = run_sum_base, .tol = 1e-3 };

	b.dg.op = need_op(b.label, "Sum");
	if (!b.dg.op)
		return;
	b.t[0] = new_f32(1, &n, 5);
	b.dg.in[0] = b.t[0];
	b.dg.n_in = 1;                 /* no attrs: all axes, a 0-d result */
	if (measure(o, &b))
		print_bw(o, &b, (double)n * sizeof(float));
	bench_free(&b);
}

static void bench_softmax(const struct opts *o)
{
	const int64_t dims[2] = { 4096, 1000 };
	struct bench b = { .label = "softmax [4096,1000] f32", .base = run_softmax_base,
			   .tol = 1e-5 };

	b.dg.op = need_op(b.label, "Softmax");
	if (!b.dg.op)
		return;
	b.t[0] = new_f32(2, dims, 6);
	b.n_out = (size_t)(dims[0] * dims[1]);
	b.out = dg_alloc_aligned(b.n_out * sizeof(float));
	b.dg.in[0] = b.t[0];
	b.dg.n_in = 1;                 /* default axis: the last */
	if (measure(o, &b))
		printf("dg %.2f ms  loop %.2f ms  ratio %.3f (median of %d)\n", b.md * 1e3,
		       b.mb * 1e3, b.mb / b.md, o->reps);
	bench_free(&b);
}

/* --- convolution and pooling against PyTorch ---------------------------------- */

/* bench/conv_torch.py next to the source tree (BUILD/../bench/, else
 * $DG_SOURCE_DIR/bench/, else ./bench/), or NULL. */
static const char *conv_torch_script(void)
{
	static char path[4096 + 64];
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	const char *src = getenv("DG_SOURCE_DIR");

	if (n > 0) {
		exe[n] = 0;
		char *slash = strrchr(exe, '/');
		if (slash)
			*slash = 0;
		snprintf(path, sizeof path, "%s/../../bench/conv_torch.py", exe);
		if (access(path, R_OK) == 0)
			return path;
	}
	snprintf(path, sizeof path, "%s/bench/conv_torch.py", src ? src : ".");
	return access(path, R_OK) == 0 ? path : NULL;
}

#define CONV_CASES 6

/* The torch medians by line label ("LABEL PASS SECONDS"), appended to t[case][k]. */
struct torch_times {
	double t[CONV_CASES][8];
	int n[CONV_CASES];
	char why[256];
};

static const char *const conv_labels[CONV_CASES] = {
	"conv [64,28,28,1]x[5,5,1,32] fwd", "conv [64,28,28,1]x[5,5,1,32] bwd",
	"conv [64,14,14,32]x[5,5,32,64] fwd", "conv [64,14,14,32]x[5,5,32,64] bwd",
	"maxpool [64,28,28,32] 2x2 fwd", "maxpool [64,28,28,32] 2x2 bwd",
};

/* One run of the torch script; false (why set) when it cannot run. */
static bool torch_pass(const struct opts *o, const char *script, struct torch_times *tt)
{
	char cmd[8192], line[512];
	bool done = false;
	FILE *p;

	snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' --threads %d --reps %d 2>&1", script,
		 o->threads, o->reps);
	if (!(p = popen(cmd, "r"))) {
		snprintf(tt->why, sizeof tt->why, "cannot run /usr/bin/python3");
		return false;
	}
	while (fgets(line, sizeof line, p)) {
		line[strcspn(line, "\n")] = 0;
		if (strcmp(line, "done") == 0)
			done = true;
		if (strncmp(line, "skipped: ", 9) == 0)
			snprintf(tt->why, sizeof tt->why, "%.200s", line + 9);
		for (int k = 0; k < CONV_CASES; k++) {
			size_t len = strlen(conv_labels[k]);
			if (strncmp(line, conv_labels[k], len) == 0 && line[len] == ' ' &&
			    tt->n[k] < 8)
				tt->t[k][tt->n[k]++] = atof(line + len + 1);
		}
	}
	pclose(p);
	if (!done && !tt->why[0])
		snprintf(tt->why, sizeof tt->why, "%s did not finish", script);
	return done;
}

/* Median seconds of fn's dg ops (summed per repetition when two). */
static double time_ops(const struct opts *o, const struct dg_case *a, const struct dg_case *b)
{
	double t[64];

	for (int i = 0; i < WARMUP; i++) {
		time_dg(a);
		if (b)
			time_dg(b);
	}
	for (int r = 0; r < o->reps; r++)
		t[r] = time_dg(a) + (b ? time_dg(b) : 0);
	return bench_median(t, o->reps);
}

/* One case: dg's forward and backward medians (0 when it cannot run). */
static void conv_case(const struct opts *o, const char *fwd_op, const char *bwd_in,
		      const char *bwd_f, json_t *attrs, struct dg_tensor *x, struct dg_tensor *f,
		      double *fwd, double *bwd)
{
	struct dg_case c = { .op = dg_op_find(fwd_op), .attrs = attrs, .in = { x, f },
			     .n_in = f ? 2 : 1 };
	struct dg_tensor *y, *dy;

	*fwd = *bwd = 0;
	if (!c.op || !(y = dg_once(&c)))
		return;
	dy = new_f32(4, y->shape.dim, 9);
	dg_tensor_free(y);
	*fwd = time_ops(o, &c, NULL);
	/* Conv2DBackpropInput/Filter take (x, f, dy); MaxPool2DGrad (x, y, dy). */
	struct dg_case ci = { .op = dg_op_find(bwd_in), .attrs = attrs, .in = { x, f, dy },
			      .n_in = 3 };
	struct dg_tensor *yk = NULL;
	if (!f && !(ci.in[1] = yk = dg_once(&c)))
		ci.op = NULL;
	struct dg_case cf = { .op = bwd_f ? dg_op_find(bwd_f) : NULL, .attrs = attrs,
			      .in = { x, f, dy }, .n_in = 3 };
	struct dg_tensor *g = ci.op ? dg_once(&ci) : NULL;
	if (g) {
		dg_tensor_free(g);
		*bwd = time_ops(o, &ci, cf.op ? &cf : NULL);
	}
	dg_tensor_free(yk);
	dg_tensor_free(dy);
}

/* Conv2D forward and backward (both gradients) on the two convolutions of a
 * LeNet on Fashion-MNIST, and a 2x2 max pool, against PyTorch's CPU kernels
 * in the same run (its script before and after dg's timing; the median of
 * its two medians). Targets (issue 18): conv 0.7x, max pool 0.8x. */
static void bench_conv(const struct opts *o)
{
	static const int64_t xs[3][4] = { { 64, 28, 28, 1 }, { 64, 14, 14, 32 }, { 64, 28, 28, 32 } };
	static const int64_t fs[2][4] = { { 5, 5, 1, 32 }, { 5, 5, 32, 64 } };
	const char *script = conv_torch_script();
	struct torch_times tt = { 0 };
	double dgt[CONV_CASES];
	bool have_torch = script && torch_pass(o, script, &tt);

	if (!script)
		snprintf(tt.why, sizeof tt.why, "bench/conv_torch.py not found (DG_SOURCE_DIR)");
	for (int k = 0; k < 3; k++) {
		bool pool = k == 2;
		json_t *attrs = pool ? json_pack("{s:[i], s:[i], s:s}", "ksize", 2, "strides", 2,
						 "padding", "VALID")
				     : json_pack("{s:s}", "padding", "SAME");
		struct dg_tensor *x = new_f32(4, xs[k], 7), *f = pool ? NULL : new_f32(4, fs[k], 8);
		conv_case(o, pool ? "MaxPool2D" : "Conv2D",
			  pool ? "MaxPool2DGrad" : "Conv2DBackpropInput",
			  pool ? NULL : "Conv2DBackpropFilter", attrs, x, f, &dgt[2 * k],
			  &dgt[2 * k + 1]);
		dg_tensor_free(x);
		dg_tensor_free(f);
		json_decref(attrs);
	}
	if (have_torch)
		have_torch = torch_pass(o, script, &tt);
	for (int k = 0; k < CONV_CASES; k++) {
		double target = k >= 4 ? 0.8 : 0.7;
		printf("%s: dg %.2f ms", conv_labels[k], dgt[k] * 1e3);
		if (!have_torch || tt.n[k] == 0) {
			printf("  torch: skipped: %s\n", tt.why[0] ? tt.why : "no figure");
			continue;
		}
		double tm = bench_median(tt.t[k], tt.n[k]);
		printf("  torch %.2f ms  ratio %.3f (target %.1f: %s; median of %d, torch's of "
		       "%d passes)\n", tm * 1e3, dgt[k] > 0 ? tm / dgt[k] : 0, target,
		       dgt[k] > 0 && tm / dgt[k] >= target ? "met" : "MISSED", o->reps, tt.n[k]);
	}
}

static int usage(void)
{
	fprintf(stderr, "usage: bench_kernels [--quick] [--threads N]\n"
		"  --quick      3 repetitions and no 2048 MatMul (CI smoke)\n"
		"  --threads N  OpenBLAS threads for both MatMul sides (default 1)\n");
	return 1;
}

int main(int argc, char **argv)
{
	struct opts o = { .reps = 9, .threads = 1 };
	struct dg_err err = { 0 };

	/* The user's core, read before dg loads BLAS (which may set its own). */
	const char *user_core = getenv("OPENBLAS_CORETYPE") ? strdup(getenv("OPENBLAS_CORETYPE")) : NULL;
	double mm1024;

	if (argc == 3 && strcmp(argv[1], "--core-probe") == 0)
		return core_probe(atoi(argv[2]) > 0 && atoi(argv[2]) <= 64 ? atoi(argv[2]) : 9);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0) {
			o.quick = 1;
			o.reps = 3;
		} else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
			char *end;
			long v;

			errno = 0;
			v = strtol(argv[++i], &end, 10);
			if (errno || *end || v < 1 || v > 1024)
				return usage();
			o.threads = (int)v;
		} else {
			return usage();
		}
	}
	/* Load BLAS before anything else: it may set OPENBLAS_CORETYPE. */
	if (dg_blas_init(&err) != DG_OK)
		fprintf(stderr, "bench_kernels: %s (%s)\n", err.msg, err.hint);
	printf("blas: %s\n", dg_blas_describe());
	dg_blas_set_threads(o.threads);
	printf("threads: %d (OpenBLAS, both sides of MatMul); other ops single-threaded\n",
	       o.threads);
	bench_matmul(&o, 512);
	mm1024 = bench_matmul(&o, 1024);
	if (!o.quick)
		bench_matmul(&o, 2048);
	bench_cores(&o, mm1024, user_core);
	bench_add(&o);
	bench_sum(&o);
	bench_softmax(&o);
	bench_conv(&o);
	return failures ? 3 : 0;
}
