#!/bin/sh
# Packs what tools/gpu_check.sh --bundle needs into one tar.xz, for a GPU
# machine that has the CUDA driver and toolkit but none of dg's libraries
# (libmicrohttpd, jansson, Criterion, OpenBLAS, libfuse3, libcurl) and no
# package mirror to install them from. Built here, run there: the binaries of a
# CUDA build (-Dcuda=enabled or auto with nvcc found), the shared libraries they
# load beyond glibc and libstdc++ (which the target must have, as new or newer),
# OpenBLAS (dg dlopen()s it), fusermount3, and with --data the Fashion-MNIST
# files bench_train reads. The CUDA runtime (libcudart) is packed; cuBLAS is
# not: dg opens the target's.
# Usage: tools/gpu_bundle.sh [--data] [build-dir] [out.tar.xz]
#        (default build, gpu-bundle.tar.xz; run from the repo root)
set -eu
data=0
if [ "${1:-}" = "--data" ]; then data=1; shift; fi
B=${1:-build}
OUTF=${2:-gpu-bundle.tar.xz}
die() { echo "gpu_bundle: $*" >&2; exit 1; }
grep -q "CUDA kernels *: yes" "$B/meson-logs/meson-log.txt" 2>/dev/null ||
	die "$B is not a CUDA build (meson setup $B -Dcuda=enabled)"
ninja -C "$B" >/dev/null || die "ninja -C $B failed"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin" "$T/lib"
bins="$B/test/test_parity $B/test/test_place_gpu $B/bench/bench_cuda $B/cli/dg
      $B/bench/bench_fs $B/bench/bench_fs_minimal"
cp $bins "$T/bin/"
if command -v fusermount3 >/dev/null; then cp "$(command -v fusermount3)" "$T/bin/"; fi
# glibc, the compiler's runtime and the driver (libcuda) come from the target.
keep() {
	case "$1" in
	libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|ld-linux*|\
	libgcc_s.so*|libstdc++.so*|linux-vdso*|libcuda.so*) return 1 ;;
	esac
	return 0
}
ob=$(ldconfig -p | awk '/libopenblas\.so\.0 .*x86-64/ {print $NF; exit}')
[ -n "$ob" ] || die "no libopenblas.so.0 in the linker cache"
for f in $bins "$ob"; do ldd "$f"; done | awk 'NF >= 3 && $3 ~ /^\// {print $1, $3}' |
	sort -u | while read -r name path; do
		if keep "$name"; then cp -L "$path" "$T/lib/$name"; fi
	done
cp -L "$ob" "$T/lib/libopenblas.so.0"
if [ $data = 1 ]; then
	mkdir -p "$T/data"
	cp /usr/share/datasets/fashion-mnist/*.gz "$T/data/" || die "no Fashion-MNIST to pack"
fi
tar -C "$T" -cf - . | xz -T0 -6 > "$OUTF"
echo "gpu_bundle: $OUTF ($(du -h "$OUTF" | cut -f1)): $(ls "$T/bin" | wc -l) programs, $(ls "$T/lib" | wc -l) libraries$([ $data = 1 ] && echo ', Fashion-MNIST')"
