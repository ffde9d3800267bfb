#!/bin/sh
# The one prepared check for a lent GPU machine (issue 7): the CUDA suites (op
# parity, float16 and bfloat16 included: Cast, Add/Sub/Mul/Relu bit for bit,
# MatMul through cublasGemmEx within an ulp; gradient helpers, GPU-placed graphs
# and the MLP training step through worker/exec.c), the MLP step fragment on the
# GPU through the worker's executor (test_place_gpu), bench_cuda (kernels,
# MatMul f32/f16/bf16 against cuBLAS called directly, Add and Sum against a
# device-to-device copy, the MLP step GPU vs CPU), then bench_fs where
# /dev/fuse exists and bench_train where python3 has numpy and torch, all
# printed. Two ways:
#   tools/gpu_check.sh [build-dir]        configure a fresh -Dcuda=enabled build
#                                         there, build it, run the suites, the
#                                         whole suite and the benchmarks (needs
#                                         dg's build dependencies; ~8 min on 16 cores)
#   tools/gpu_check.sh --bundle FILE      run from what tools/gpu_bundle.sh packed
#                                         on a machine that has them (the lent
#                                         machines have CUDA but not dg's
#                                         libraries, and no mirror): ~1 min
# Run from the repo root. The logs go to $OUT when it is set, else to a new
# /tmp/gpu_check.* folder.
set -u
JOBS=$(nproc 2>/dev/null || echo 4)
L=${OUT:-$(mktemp -d /tmp/gpu_check.XXXXXX)}   # the logs
step() { printf '\n===== %s (%s) =====\n' "$1" "$(date +%T)"; }
log() { tee "$L/$1"; }
fail=0
export PATH=/usr/local/cuda/bin:$PATH

step "machine"
nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv 2>&1 || true
nvcc --version 2>/dev/null | tail -2
echo "$(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "${1:-}" = "--bundle" ]; then
	[ -r "${2:-}" ] || { echo "gpu_check: --bundle needs a file from tools/gpu_bundle.sh" >&2; exit 2; }
	X=$(mktemp -d)
	trap 'rm -rf "$X"' EXIT
	tar -C "$X" -xJf "$2" || exit 1
	export LD_LIBRARY_PATH="$X/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	P=$X/bin
	missing=$(ldd "$P/test_parity" "$P/dg" | grep 'not found' | sort -u)
	[ -z "$missing" ] || { echo "gpu_check: libraries missing: $missing" >&2; exit 1; }
	# bench_train reads Fashion-MNIST where Debian puts it.
	if [ -d "$X/data" ] && [ ! -e /usr/share/datasets/fashion-mnist ] &&
	   mkdir -p /usr/share/datasets/fashion-mnist 2>/dev/null; then
		cp "$X"/data/*.gz /usr/share/datasets/fashion-mnist/
	fi
	PARITY=$P/test_parity PLACE=$P/test_place_gpu BCUDA=$P/bench_cuda DG=$P/dg
	BFS="$P/bench_fs --dg $P/dg --minimal $P/bench_fs_minimal"
	PATH=$P:$PATH
else
	B=${1:-build-gpu}
	step "configure $B (-Dcuda=enabled)"
	rm -rf "$B"
	meson setup "$B" -Dcuda=enabled -Dbuildtype=release || exit 1
	step "build (-j$JOBS)"
	ninja -C "$B" -j"$JOBS" || exit 1
	PARITY=$B/test/test_parity PLACE=$B/test/test_place_gpu BCUDA=$B/bench/bench_cuda
	DG=$B/cli/dg BFS=$B/bench/bench_fs
fi
"$DG" --version

step "CUDA parity (test_parity: suites cuda, cuda_exec)"
# One line per test (a SKIP here means the GPU was not seen), plus the
# executor's soft-placement notes (ops that ran on the CPU inside GPU-placed graphs).
DG_LOG=info timeout 300 "$PARITY" --verbose --short-filename --jobs=4 2>&1 | log parity.log |
	grep -E '^\[(PASS|FAIL|SKIP|----|====)\]|exec:' | head -120
grep -q 'Failing: 0 | Crashing: 0' "$L/parity.log" || fail=1

step "GPU placement through the worker's executor (test_place_gpu)"
# The MLP step placed by the master (all on /gpu:0, and by the cost model), cut
# into a fragment and run by the executor with values resident on the GPU.
DG_LOG=info timeout 120 "$PLACE" --verbose --short-filename --jobs=2 2>&1 | log place_gpu.log |
	grep -E '^\[(PASS|FAIL|SKIP|----|====)\]|exec:' | head -40
timeout 120 "$PLACE" --jobs=2 >/dev/null 2>&1 || fail=1

if [ -n "${B:-}" ]; then
	step "whole suite"
	meson test -C "$B" --num-processes "$JOBS" --print-errorlogs || fail=1
fi

step "bench_cuda"
# (sh has no pipefail: the status goes through a file)
{ timeout 240 "$BCUDA" 2>&1; echo $? >"$L/bench_cuda.rc"; } | log bench_cuda.log
[ "$(cat "$L/bench_cuda.rc")" = 0 ] || fail=1

if [ -e /dev/fuse ]; then
	step "bench_fs"
	timeout 180 $BFS --quick 2>&1 | log bench_fs.log
fi

if python3 -c 'import numpy, torch' 2>/dev/null && [ -d /usr/share/datasets/fashion-mnist ]; then
	step "bench_train (one seed)"
	PYTHONUNBUFFERED=1 timeout 240 python3 bench/train/bench_train.py --dg "$DG" --seeds 1 2>&1 |
		log bench_train.log
fi

step "done: $([ $fail = 0 ] && echo 'all passed' || echo 'FAILURES above'); logs in $L"
exit $fail
