#!/usr/bin/env bash
# The seed's second program against numpy: for every split point k in 1..99,
# the size-weighted mean of x[:k] and x[k:] computed by `dg eval` on a copy of
# examples/weighted_mean.json equals np.mean(x) within 1e-6 (relative), and the
# .npy that `dg eval --out` writes loads in numpy with the same value.
# Usage: test_numpy.sh PATH/TO/dg   (exit 77 = skipped when numpy is missing)
set -euo pipefail

DG=${1:?usage: test_numpy.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
HERE=$SRC/test/integration
PY=/usr/bin/python3

if ! [[ -x $PY ]] || ! "$PY" -c 'import numpy' 2>/dev/null; then
	echo "skipped: /usr/bin/python3 with numpy not found"
	exit 77
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0

"$PY" "$HERE/weighted_mean.py" gen "$SRC/examples/weighted_mean.json" "$TMP"
for k in $(seq 1 99); do
	if ! "$DG" eval "$TMP/g_$k.json" --feed "x=$TMP/x_$k.npy" >"$TMP/out_$k.txt" \
		2>"$TMP/err"; then
		failed=$((failed + 1))
		echo "FAIL - split $k: dg eval failed: $(cat "$TMP/err")"
	fi
	if ! "$DG" eval "$TMP/g_$k.json" --feed "x=$TMP/x_$k.npy" --out "$TMP/npy_$k" \
		>"$TMP/wrote" 2>"$TMP/err"; then
		failed=$((failed + 1))
		echo "FAIL - split $k: dg eval --out failed: $(cat "$TMP/err")"
	fi
	if grep -qE 'Sanitizer|runtime error:' "$TMP/err"; then
		failed=$((failed + 1))
		echo "FAIL - split $k: sanitizer report: $(cat "$TMP/err")"
	fi
done

"$PY" "$HERE/weighted_mean.py" check "$TMP" >"$TMP/report"
grep -v '^[0-9]* [0-9]*$' "$TMP/report" || true
read -r p f < <(tail -n 1 "$TMP/report")
passed=$((passed + p))
failed=$((failed + f))

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
