#!/bin/sh
# The one prepared check for a lent GPU machine (issue 7): configure a fresh
# build with -Dcuda=enabled, build, run the CUDA suites (op parity, float16 and
# bfloat16 included: Cast, Add/Sub/Mul/Relu bit for bit, MatMul through
# cublasGemmEx within an ulp; gradient helpers, GPU-placed graphs and the MLP
# training step through worker/exec.c),
# the MLP step fragment on the GPU through the worker's executor (test_place_gpu),
# then the whole suite, then bench_cuda (kernels, MatMul f32/f16/bf16 against
# cuBLAS called directly, and the MLP step, GPU vs CPU),
# printing everything. Sized for ~8 minutes on 16 cores.
# Usage: tools/gpu_check.sh [build-dir]   (default build-gpu; run from the repo root)
set -u
B=${1:-build-gpu}
JOBS=$(nproc 2>/dev/null || echo 4)
step() { printf '\n===== %s (%s) =====\n' "$1" "$(date +%T)"; }
fail=0

step "machine"
nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv 2>&1 || true
/usr/local/cuda/bin/nvcc --version | tail -2
export PATH=/usr/local/cuda/bin:$PATH

step "configure $B (-Dcuda=enabled)"
rm -rf "$B"
meson setup "$B" -Dcuda=enabled -Dbuildtype=release || exit 1

step "build (-j$JOBS)"
ninja -C "$B" -j"$JOBS" || exit 1
"$B"/cli/dg --version

step "meson test --suite cuda"
meson test -C "$B" --suite cuda --print-errorlogs --timeout-multiplier 2 || fail=1
# Criterion's own report: one line per test of suites cuda and cuda_exec (a
# SKIP here means the GPU was not seen), plus the executor's soft-placement
# notes (ops that ran on the CPU inside GPU-placed graphs).
DG_LOG=info "$B"/test/test_parity --verbose --short-filename --jobs=1 2>&1 |
	grep -E '^\[(PASS|FAIL|SKIP|----|====)\]|exec:' | head -120

step "GPU placement through the worker's executor (test_place_gpu)"
# The MLP step placed by the master (all on /gpu:0, and by the cost model), cut
# into a fragment and run by the executor with values resident on the GPU.
meson test -C "$B" place_gpu place --print-errorlogs || fail=1
DG_LOG=info "$B"/test/test_place_gpu --verbose --short-filename --jobs=1 2>&1 |
	grep -E '^\[(PASS|FAIL|SKIP|----|====)\]|exec:' | head -40

step "whole suite"
meson test -C "$B" --num-processes "$JOBS" --print-errorlogs || fail=1

step "bench_cuda"
timeout 240 "$B"/bench/bench_cuda || fail=1

step "done: $([ $fail = 0 ] && echo 'all passed' || echo 'FAILURES above')"
exit $fail
