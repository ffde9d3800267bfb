#!/usr/bin/env bash
# examples/mlp_bn.json (doc/training.md, "Batch normalization") on `dg up
# --workers 2`: the MLP with FusedBatchNorm trains, its AssignMovingAverage
# nodes move the non-trained bn_mean and bn_var on the ps every step, and
# the test forward pass that normalises with them reaches an accuracy floor.
# A sanitizer build trains 150 steps a replica instead.
# Usage: test_bn.sh PATH/TO/dg   (meson passes it)
set -uo pipefail

DG=${1:?usage: test_bn.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(dirname "${BASH_SOURCE[0]}")/../..}
TMP=$(mktemp -d)
export HOME=$TMP/home XDG_RUNTIME_DIR=$TMP/run
unset DG_CLUSTER TF_CONFIG
mkdir -p "$HOME" "$XDG_RUNTIME_DIR"
FMNIST=/usr/share/datasets/fashion-mnist
PY=/usr/bin/python3

cleanup() {
	"$DG" down --dir "$TMP/c" >/dev/null 2>&1
	rm -rf "$TMP"
}
trap cleanup EXIT
SHOW_BYTES=1500
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ! -e $FMNIST/train-images-idx3-ubyte.gz ]]; then
	echo "ok - skipped: $FMNIST is absent (apt-get install dataset-fashion-mnist)"
	summary
	exit 0
fi

GRAPH=$SRC/examples/mlp_bn.json
MIN_ACC=0.83
if [[ -n ${ASAN_OPTIONS:-} ]]; then
	MIN_ACC=0.6
	$PY - "$GRAPH" "$TMP/bn.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["training"]
t.pop("epochs")
t["steps"] = 150
t["eval"] = {"fetch": ["test_accuracy"], "every_steps": 150}
json.dump(d, open(sys.argv[2], "w"))
PYEOF
	GRAPH=$TMP/bn.json
fi

run up --dir "$TMP/c" --workers 2
[[ $rc -eq 0 ]] && ok "dg up --workers 2" || not_ok "dg up --workers 2"
PS=http://127.0.0.1:$(cat "$TMP/c/ps-0.port")

run submit --explain "$GRAPH"
acc=$(sed -n 's/^test_accuracy: //p' "$TMP/out" | tail -n 1)
if [[ $rc -eq 0 ]] && $PY -c "import sys; sys.exit(0 if float('$acc') >= $MIN_ACC else 1)" 2>/dev/null; then
	ok "mlp_bn.json: test_accuracy $acc (>= $MIN_ACC) with the moving averages"
else
	not_ok "mlp_bn.json reaches test_accuracy >= $MIN_ACC (got '${acc}')"
fi
if grep -q 'bn_mean_update = VarApply(bn:1;' "$TMP/out" &&
	grep -q 'bn_var_update = VarApply(bn:2;' "$TMP/out"; then
	ok "--explain: each AssignMovingAverage is a VarApply of the batch moment"
else
	not_ok "--explain shows the moving averages as VarApply nodes"
fi

# The averages moved from their start (zeros, ones), are finite, the
# variances positive; no optimizer slot was made for them (not trained).
curl -sf -H 'Accept: text/plain' "$PS/v1/vars/bn_mean" >"$TMP/mean"
curl -sf -H 'Accept: text/plain' "$PS/v1/vars/bn_var" >"$TMP/var"
curl -sf "$PS/v1/vars" >"$TMP/vars"
if $PY - "$TMP/mean" "$TMP/var" "$TMP/vars" <<'PYEOF' >"$TMP/why" 2>&1
import json, math, sys
def vals(p):
    return [float(x) for l in open(p) if not l.startswith("#") for x in l.split()]
m, v = vals(sys.argv[1]), vals(sys.argv[2])
names = [x["name"] for x in json.load(open(sys.argv[3]))["vars"]]
assert len(m) == len(v) == 256, (len(m), len(v))
assert all(math.isfinite(x) for x in m + v)
assert max(abs(x) for x in m) > 0.01, "bn_mean did not move"
assert all(x > 0 for x in v) and max(abs(x - 1) for x in v) > 0.01, "bn_var did not move"
assert not [n for n in names if n.startswith("bn_mean.") or n.startswith("bn_var.")], names
print("bn_mean in [%.3f, %.3f], bn_var in [%.3f, %.3f]" % (min(m), max(m), min(v), max(v)))
PYEOF
then
	ok "the moving averages moved: $(cat "$TMP/why")"
else
	cat "$TMP/why"
	not_ok "bn_mean and bn_var hold moving averages"
fi
run down --dir "$TMP/c"
summary
