#!/usr/bin/env bash
# End-to-end checks of the dg binary's local commands: `dg eval` on the
# examples (printing, --fetch, --header, --feed, --out), its documented exit
# codes and "dg: " diagnostics, `dg help`, `dg --version` and `dg ops`.
# Usage: test_eval_cli.sh PATH/TO/dg   (meson passes it; DG_SOURCE_DIR optional)
set -euo pipefail

DG=${1:?usage: test_eval_cli.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
EX=$SRC/examples
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

SHOW_BYTES=400
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- dg eval: printing ---------------------------------------------------------
run eval "$EX/seed_sum.json"
if [[ $rc -eq 0 ]] && printf '238\n' | cmp -s - "$TMP/out"; then
	ok "seed_sum prints exactly 238"
else
	not_ok "seed_sum prints exactly 238"
fi

run eval "$EX/seed_sum.json" --fetch y1
check_out "--fetch y1 prints 302" 0 "302"

run eval --fetch y2 "$EX/seed_sum.json"
check_out "options before the graph work too (y2 = -64)" 0 "-64"

run eval "$EX/seed_sum.json" --fetch y1 --fetch y2:0
check_out "several fetches are labelled NAME:" 0 "$(printf 'y1:\n302\ny2:0:\n-64')"

run eval "$EX/seed_sum.json" --header
check_out "--header prints the dtype and shape line" 0 "$(printf '# int32 []\n238')"

# --- dg eval: feeds ------------------------------------------------------------
cat >"$TMP/scale.json" <<'EOF'
{"nodes": [
  {"name": "x", "op": "Placeholder", "attrs": {"dtype": "float32", "shape": [-1]}},
  {"name": "k", "op": "Const", "attrs": {"value": 1.5}},
  {"name": "y", "op": "Mul", "inputs": ["x", "k"]}
], "fetch": ["y"]}
EOF
run eval "$TMP/scale.json" --feed 'x=[2, 4, -1]'
check_out "a JSON literal feed is typed as the placeholder (float32)" 0 "3 6 -1.5"

run eval "$TMP/scale.json" --feed 'x=[1, nan, -inf]'
check_out "nan and -inf are accepted in literal feeds" 0 "1.5 nan -inf"

printf '1 2\n3\n' >"$TMP/x.txt"
run eval "$TMP/scale.json" --feed "x=$TMP/x.txt"
check_out "a .txt feed is read with the text codec" 0 "1.5 3 4.5"

run eval "$EX/seed_sum.json" --feed x=10
check_out "feeding a Const overrides it (10+300 + 10-66)" 0 "254"

run eval "$EX/weighted_mean.json" --feed "x=[$(seq -s, 0 99)]"
check_out "weighted_mean of 0..99 is 49.5" 0 "49.5"

# --- dg eval: --out -------------------------------------------------------------
run eval "$EX/seed_sum.json" --fetch y --fetch y1:0 --out "$TMP/o/deep"
if [[ $rc -eq 0 && "$(cat "$TMP/out")" == "$(printf 'wrote %s (int32 [])\nwrote %s (int32 [])' \
	"$TMP/o/deep/y.npy" "$TMP/o/deep/y1_0.npy")" ]] &&
	[[ "$(head -c 6 "$TMP/o/deep/y.npy" | tail -c 5)" == "NUMPY" ]]; then
	ok "--out creates the directory and writes one .npy per fetch"
else
	not_ok "--out creates the directory and writes one .npy per fetch"
fi

run eval "$TMP/scale.json" --feed "x=$TMP/o/deep/y.npy"
check_err "a .npy feed of the wrong dtype exits 6" 6 "got dtype int32 where float32"

# --- dg eval: errors and exit codes -------------------------------------------
printf '{"nodes": [\n  {"name": "x",, }]}\n' >"$TMP/bad.json"
run eval "$TMP/bad.json"
check_err "malformed JSON exits 2 naming the file and line" 2 \
	"$TMP/bad.json: graph is not valid JSON"

printf '{"nodes": [{"name": "x", "op": "Ad"}]}\n' >"$TMP/badop.json"
run eval "$TMP/badop.json"
if [[ $rc -eq 2 ]] && grep -qF "dg: hint: did you mean 'Add'?" "$TMP/err"; then
	ok "unknown op exits 2 with a suggestion on a hint line"
else
	not_ok "unknown op exits 2 with a suggestion on a hint line"
fi

run eval "$TMP/does-not-exist.json"
check_err "a missing graph file exits 3" 3 "does-not-exist.json"

run eval "$EX/weighted_mean.json"
check_err "an unfed placeholder exits 2 and names --feed" 2 \
	"placeholder 'x' must be fed (use --feed x=FILE.npy|VALUE)"

run eval "$EX/weighted_mean.json" --feed 'x=[1, 2, 3]'
check_err "a feed of the wrong shape exits 5" 5 "got shape [3] where [100] is expected"

run eval "$TMP/scale.json" --feed 'x=hello'
check_err "a feed that is neither file nor literal exits 2 naming the flag" 2 "--feed x=hello"

run eval "$TMP/scale.json" --feed 'q=1'
check_err "a feed of an unknown node exits 3" 3 "'q' names no node"

run eval "$TMP/scale.json" --feed "x=$TMP/missing.npy"
check_err "a missing .npy feed exits 3" 3 "missing.npy"

run eval "$EX/seed_sum.json" --fetch nope
check_err "fetching an unknown node exits 3" 3 "'nope' names no node"

# --- usage errors: exit 1 -------------------------------------------------------
run eval
check_err "dg eval without a graph is a usage error" 1 "try 'dg eval --help'"

run eval "$EX/seed_sum.json" --bogus
check_err "an unknown option is a usage error" 1 "unknown option '--bogus'"

run eval "$EX/seed_sum.json" --feed novalue
check_err "--feed without NAME=VALUE is a usage error" 1 "try 'dg eval --help'"

run nope
check_err "an unknown command exits 1" 1 "dg: unknown command 'nope'"
if grep -qx "try 'dg help'" "$TMP/err"; then ok "unknown command says try 'dg help'"; else
	not_ok "unknown command says try 'dg help'"; fi

# --- help, version, ops ---------------------------------------------------------
run --help
if [[ $rc -eq 0 ]] && grep -q '^  eval ' "$TMP/out" && grep -q '^  ops ' "$TMP/out"; then
	ok "dg --help lists the commands"
else
	not_ok "dg --help lists the commands"
fi

run help
if [[ $rc -eq 0 ]] && grep -q '^  eval ' "$TMP/out"; then ok "dg help lists the commands"; else
	not_ok "dg help lists the commands"; fi

run eval --help
if [[ $rc -eq 0 ]] && grep -q '^usage: dg eval GRAPH.json' "$TMP/out"; then
	ok "dg eval --help prints the usage"
else
	not_ok "dg eval --help prints the usage"
fi

run help eval
if [[ $rc -eq 0 ]] && grep -q -- '--feed NAME=VALUE' "$TMP/out"; then ok "dg help eval"; else
	not_ok "dg help eval"; fi

run --version
if [[ $rc -eq 0 && "$(head -n 1 "$TMP/out")" == "dg 0.1.0" && $(wc -l <"$TMP/out") -eq 3 ]] &&
	sed -n 2p "$TMP/out" | grep -q '^OpenBLAS .* core ' && sed -n 3p "$TMP/out" | grep -q '^CUDA'; then
	ok "dg --version prints the version, the BLAS line and the CUDA line"
else
	not_ok "dg --version prints the version, the BLAS line and the CUDA line"
fi

# Choosing OpenBLAS's core by timing (kernels/cpu/blas.c): forced with
# DG_BLAS_PROBE=1, cached in DG_BLAS_CACHE. Only where the CPU has a core to
# time (x86 with AVX2: Haswell at least); the user's OPENBLAS_CORETYPE is kept
# out of these runs, and its own check comes last.
blas_line() {   # env assignments...: dg --version's BLAS line into $TMP/blas
	rc=0
	env -u OPENBLAS_CORETYPE "$@" "$DG" --version >"$TMP/out" 2>"$TMP/err" || rc=$?
	sed -n 2p "$TMP/out" >"$TMP/blas"
}
if grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo; then
	C=$TMP/blas-core
	blas_line DG_BLAS_PROBE=1 DG_BLAS_CACHE="$C"
	first=$(sed 's/.* core \([A-Z0-9]*\) .*/\1/' "$TMP/blas")
	if [[ $rc -eq 0 ]] && grep -q "measured .* GFLOP/s, cached in $C)" "$TMP/blas" &&
		head -c 15 "$C" | grep -q $'^dg-blas-core 1\t' && [[ $(stat -c %a "$C") == 600 ]]; then
		ok "DG_BLAS_PROBE=1 times the cores and writes the cache (mode 600)"
	else
		not_ok "DG_BLAS_PROBE=1 times the cores and writes the cache (mode 600): $(cat "$TMP/blas")"
	fi
	cp "$C" "$TMP/cache-before"
	blas_line DG_BLAS_PROBE=1 DG_BLAS_CACHE="$C"
	if [[ $rc -eq 0 && $(sed 's/.* core \([A-Z0-9]*\) .*/\1/' "$TMP/blas") == "$first" ]] &&
		grep -q "cached in $C)" "$TMP/blas" && cmp -s "$C" "$TMP/cache-before"; then
		ok "a second process reads the cache: the same core, no new timing"
	else
		not_ok "a second process reads the cache: $(cat "$TMP/blas") (first: $first)"
	fi
	chmod 666 "$C"
	blas_line DG_BLAS_PROBE=1 DG_BLAS_CACHE="$C"
	if [[ $rc -eq 0 ]] && grep -q "GFLOP/s, not cached)" "$TMP/blas" &&
		cmp -s "$C" "$TMP/cache-before"; then
		ok "a cache file others can write is neither read nor written"
	else
		not_ok "a cache file others can write is neither read nor written: $(cat "$TMP/blas")"
	fi
	blas_line DG_BLAS_PROBE=0 DG_BLAS_CACHE="$TMP/unused"
	if [[ $rc -eq 0 ]] && ! grep -q measured "$TMP/blas" && [[ ! -e "$TMP/unused" ]]; then
		ok "DG_BLAS_PROBE=0 keeps the CPUID rule and no cache"
	else
		not_ok "DG_BLAS_PROBE=0 keeps the CPUID rule and no cache: $(cat "$TMP/blas")"
	fi
	# the cache as the first run wrote it (C is group-writable now): a hit
	cp "$TMP/cache-before" "$TMP/cache-again"
	chmod 600 "$TMP/cache-again"
	rc=0
	OPENBLAS_CORETYPE=Haswell DG_BLAS_CORE_BY_DG=Haswell DG_BLAS_PROBE=1 \
		DG_BLAS_CACHE="$TMP/cache-again" \
		"$DG" --version >"$TMP/out" 2>"$TMP/err" || rc=$?
	if [[ $rc -eq 0 ]] && ! sed -n 2p "$TMP/out" | grep -q 'set by user' &&
		sed -n 2p "$TMP/out" | grep -q "core $first "; then
		ok "a core a parent dg chose is chosen again, not taken as the user's"
	else
		not_ok "a core a parent dg chose is chosen again, not taken as the user's"
	fi
	rc=0
	OPENBLAS_CORETYPE=Haswell DG_BLAS_PROBE=1 DG_BLAS_CACHE="$TMP/unused" "$DG" --version \
		>"$TMP/out" 2>"$TMP/err" || rc=$?
	if [[ $rc -eq 0 ]] && sed -n 2p "$TMP/out" | grep -q 'core HASWELL (OPENBLAS_CORETYPE=Haswell set by user)' &&
		[[ ! -e "$TMP/unused" ]]; then
		ok "a core the user set is kept, never timed"
	else
		not_ok "a core the user set is kept, never timed"
	fi
else
	echo "ok - # SKIP OpenBLAS core timing: this CPU has no AVX2 and FMA core to time"
fi

run ops --markdown
if [[ $rc -eq 0 ]] && cmp -s "$TMP/out" "$SRC/doc/ops.md"; then
	ok "doc/ops.md is what 'dg ops --markdown' prints"
else
	not_ok "doc/ops.md is what 'dg ops --markdown' prints (regenerate: dg ops --markdown > doc/ops.md)"
fi

run ops
if [[ $rc -eq 0 ]] && grep -q '^Const$' "$TMP/out" && grep -q '^Placeholder$' "$TMP/out" &&
	grep -q 'attr value ' "$TMP/out"; then
	ok "dg ops lists ops with their attrs"
else
	not_ok "dg ops lists ops with their attrs"
fi

run ops --markdown Identity
if [[ $rc -eq 0 && "$(head -n 1 "$TMP/out")" == "# Ops" ]] &&
	grep -q '^## Identity$' "$TMP/out"; then
	ok "dg ops --markdown prints Markdown"
else
	not_ok "dg ops --markdown prints Markdown"
fi

run ops Nope
check_err "dg ops of an unknown op exits 3" 3 "unknown op 'Nope'"

summary
