#!/bin/sh
# dg set-up for a fresh Debian 12 machine: installs what is missing (apt-get, as
# root or through sudo), builds, then runs the main job or every test.
#   ./setup.sh demo    install + build + run the main job
#   ./setup.sh test    install + build (release and sanitizer builds) + run every test
#   ./setup.sh deps    install only;   ./setup.sh build   install + build only
set -eu
cd "$(dirname "$0")"

# Every package dg needs to build, test and run its demo. Keep in step with
# meson.build (dependencies) and README.md (Build options). clang and
# libclang-rt-14-dev (libFuzzer's runtime, which clang does not pull in without
# recommends) build the fuzz targets (doc/fuzzing.md). python3-torch: the
# convolution tests compare with PyTorch's (test/integration/conv_torch.py),
# and bench/train's baselines are PyTorch. iproute2: the Python seed programs'
# test runs them on their own ports in a private network namespace (ip link).
PACKAGES="gcc pkg-config meson ninja-build python3 libjansson-dev libopenblas-dev
libopenblas0-pthread libmicrohttpd-dev libcurl4-openssl-dev libfuse3-dev fuse3 zlib1g-dev
libcriterion-dev dataset-fashion-mnist python3-numpy python3-torch attr curl clang
libclang-rt-14-dev openssl iproute2"

say() { printf '==> %s\n' "$*"; }

install_deps() {
	missing=""
	for p in $PACKAGES; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			missing="$missing $p"
		fi
	done
	if [ -z "$missing" ]; then
		say "all packages present"
		return
	fi
	say "installing:$missing"
	if [ "$(id -u)" -eq 0 ]; then
		SUDO=""
	elif command -v sudo >/dev/null 2>&1; then
		SUDO="sudo"
	else
		echo "setup.sh: need root or sudo to install:$missing" >&2
		exit 1
	fi
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
	# shellcheck disable=SC2086
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
}

# configure DIR [meson options...]: set up once, reconfigure when it exists.
configure() {
	dir=$1
	shift
	if [ -f "$dir/build.ninja" ]; then
		meson setup --reconfigure "$dir" "$@" >/dev/null
	else
		meson setup "$dir" "$@"
	fi
}

# The test builds (and so CI, .ci/run) treat every compiler warning as an error.
# warning_level is meson.build's default too, but named here because a build
# directory configured before keeps the level it was made with.
STRICT="-Dwarning_level=3 -Dwerror=true"

# build [meson options...]: the release build in build/, and the Python
# package (python/dg) made importable by Debian's python3 from this tree.
build() {
	say "building (build/)"
	configure build "$@"
	ninja -C build
	python_path
}

# A .pth file in Debian's python3 module path that points at python/, so that
# /usr/bin/python3 -c 'import dg' works after a build (as pip install -e
# would); without root or sudo, the PYTHONPATH line to use instead.
python_path() {
	site=$(/usr/bin/python3 -c 'import site; print([p for p in site.getsitepackages() if p.startswith("/usr/local/")][0])' 2>/dev/null) || site=""
	pth="$site/dg-source.pth"
	if [ -n "$site" ] && [ "$(cat "$pth" 2>/dev/null)" = "$PWD/python" ]; then
		return
	fi
	if [ -n "$site" ] && { [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; }; then
		SUDO=""
		[ "$(id -u)" -eq 0 ] || SUDO="sudo"
		$SUDO mkdir -p "$site"
		echo "$PWD/python" | $SUDO tee "$pth" >/dev/null
		say "python3 imports dg from $PWD/python ($pth)"
	else
		say "to import dg in python3: export PYTHONPATH=$PWD/python"
	fi
}

demo() {
	dg=$PWD/build/cli/dg
	say "dg --version"
	$dg --version
	say "one graph in one process: x = 2; y1 = x + 300; y2 = x - 66; y = y1 + y2"
	echo "\$ dg eval examples/seed_sum.json"
	$dg eval examples/seed_sum.json

	# A local cluster: 1 parameter server + 2 workers on free loopback ports,
	# kept away from the user's own default cluster by a private runtime dir.
	run=$(mktemp -d)
	mnt="$run/mnt"
	mkdir -p "$mnt"
	export XDG_RUNTIME_DIR="$run"
	trap '$dg down --dir "$run/cluster" >/dev/null 2>&1; rm -rf "$run"' EXIT
	mount_opt=""
	if [ -e /dev/fuse ] && command -v fusermount3 >/dev/null 2>&1; then
		mount_opt="--mount $mnt"
	fi
	say "dg up: a local cluster (1 ps + 2 workers)"
	# shellcheck disable=SC2086
	$dg up --dir "$run/cluster" $mount_opt

	# The main job: the MLP 784-256-10 on Fashion-MNIST, one replica per
	# worker (each on half of the training set), weights on the ps, 3 epochs.
	say "training examples/mlp.json on Fashion-MNIST (2 replicas, SGD, 3 epochs)"
	echo "\$ dg submit examples/mlp.json"
	$dg submit examples/mlp.json >"$run/submit.out"
	cat "$run/submit.out"
	acc=$(awk '$1 == "test_accuracy:" { print $2 }' "$run/submit.out")
	if [ -z "$acc" ] || ! awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.84) }'; then
		echo "setup.sh: demo FAILED: test accuracy '${acc:-none}' is below 0.84" >&2
		exit 1
	fi
	say "test accuracy $acc >= 0.84: ok"

	if [ -n "$mount_opt" ]; then
		say "the trained weights, as files of the mount at $mnt"
		echo "\$ ls -l $mnt/vars"
		ls -l "$mnt/vars"
		echo "\$ od -A d -t f4 -N 32 $mnt/vars/w1     # the first 8 floats of w1 [784,256]"
		od -A d -t f4 -N 32 "$mnt/vars/w1"
		echo "\$ getfattr -d $mnt/vars/w1"
		getfattr -d "$mnt/vars/w1"
	else
		say "no FUSE here (/dev/fuse or fusermount3 missing): the trained weights through dg var"
		$dg var ls --long
	fi
	say "dg status"
	$dg status
	say "dg down"
	$dg down --dir "$run/cluster"
}

run_tests() {
	say "building the sanitizer configuration (build-asan/: address + undefined)"
	# shellcheck disable=SC2086
	configure build-asan -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false \
		-Dbench=false $STRICT
	ninja -C build-asan
	status=0
	say "every test suite (build/)"
	meson test -C build --num-processes 2 --print-errorlogs || status=1
	say "unit, kernels and integration suites under AddressSanitizer + UBSan (build-asan/)"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		meson test -C build-asan --num-processes 2 --print-errorlogs || status=1
	logs="build/meson-logs/testlog.json build-asan/meson-logs/testlog.json"
	fuzz_ran=0
	run_fuzz || status=1
	if [ "$fuzz_ran" -eq 1 ]; then
		logs="$logs build-fuzz/meson-logs/testlog.json"
	fi
	# shellcheck disable=SC2086
	python3 tools/test_summary.py $logs || status=1
	return $status
}

# The libFuzzer targets (test/fuzz, doc/fuzzing.md), each for DG_FUZZ_SECONDS
# (default 30) over its committed corpus, in build-fuzz/ (clang, ASan + UBSan,
# libFuzzer's instrumentation: a configuration of its own, so build/ and
# build-asan/ stay gcc builds). Skipped with a message where clang cannot link
# -fsanitize=fuzzer; false only when a target failed.
run_fuzz() {
	if ! command -v clang >/dev/null 2>&1 ||
		! printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n' |
		clang -fsanitize=fuzzer -x c - -o /tmp/dg-fuzz-probe.$$ >/dev/null 2>&1; then
		say "fuzz targets skipped: clang cannot link -fsanitize=fuzzer (apt-get install clang libclang-rt-14-dev)"
		rm -f /tmp/dg-fuzz-probe.$$
		return 0
	fi
	rm -f /tmp/dg-fuzz-probe.$$
	say "fuzz targets for ${DG_FUZZ_SECONDS:-30} s each (build-fuzz/: clang, libFuzzer, address + undefined)"
	fuzz_ran=1
	(CC=clang && export CC && configure build-fuzz -Dfuzz=true $STRICT \
		-Dfuzz_seconds="${DG_FUZZ_SECONDS:-30}" -Dbuildtype=debugoptimized \
		-Db_sanitize=address,undefined -Db_lundef=false -Dtests=false -Dbench=false \
		-Dcuda=disabled) || { fuzz_ran=0; return 1; }
	ninja -C build-fuzz fuzz || { fuzz_ran=0; return 1; }
	meson test -C build-fuzz --suite fuzz --num-processes 2 --print-errorlogs
}

case "${1:-}" in
deps) install_deps ;;
build) install_deps; build ;;
demo) install_deps; build; demo ;;
test)
	install_deps
	# shellcheck disable=SC2086
	build $STRICT
	run_tests
	;;
*)
	echo "usage: ./setup.sh demo|test|build|deps" >&2
	exit 1
	;;
esac
