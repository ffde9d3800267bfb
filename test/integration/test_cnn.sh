#!/usr/bin/env bash
# examples/cnn.json (doc/training.md, "A CNN") on `dg up --workers 2`: the
# LeNet-like CNN (Conv2D, MaxPool2D, Reshape, Dropout, Adam) reaches a test
# accuracy >= 0.90 on Fashion-MNIST, and its loss falls. A sanitizer build
# (~10x slower) trains 150 steps a replica instead and checks that the loss
# falls and the accuracy passes 0.6: the same graph, plan and ops, in a minute.
# HOME and XDG_RUNTIME_DIR point into a temp dir.
# Usage: test_cnn.sh PATH/TO/dg   (meson passes it)
set -uo pipefail

DG=${1:?usage: test_cnn.sh PATH/TO/dg}
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

GRAPH=$SRC/examples/cnn.json
MIN_ACC=0.90
if [[ -n ${ASAN_OPTIONS:-} ]]; then
	MIN_ACC=0.6
	$PY - "$GRAPH" "$TMP/cnn.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["training"]
t.pop("epochs")
t["steps"] = 150
t["eval"] = {"fetch": ["test_accuracy"], "every_steps": 150}
json.dump(d, open(sys.argv[2], "w"))
PYEOF
	GRAPH=$TMP/cnn.json
fi

run up --dir "$TMP/c" --workers 2
[[ $rc -eq 0 ]] && ok "dg up --workers 2" || not_ok "dg up --workers 2"

run submit "$GRAPH"
acc=$(sed -n 's/^test_accuracy: //p' "$TMP/out" | tail -n 1)
if [[ $rc -eq 0 ]] && $PY -c "import sys; sys.exit(0 if float('$acc') >= $MIN_ACC else 1)" 2>/dev/null; then
	ok "cnn.json: test_accuracy $acc (>= $MIN_ACC); $(grep -o 'trained .*' "$TMP/err" | tail -n 1)"
else
	not_ok "cnn.json reaches test_accuracy >= $MIN_ACC (got '${acc}')"
fi

# The loss falls: the first train row's against the last one's.
if curl -sf "http://127.0.0.1:$(cat "$TMP/c/worker-0.port")/v1/jobs/j1/metrics" >"$TMP/m" &&
	$PY - "$TMP/m" <<'PYEOF' >"$TMP/why" 2>&1
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["loss"]]
first, last = float(rows[0]["loss"]), float(rows[-1]["loss"])
print("loss %.3f -> %.3f over %d train rows" % (first, last, len(rows)))
sys.exit(0 if last < 0.7 * first else 1)
PYEOF
then
	ok "the loss falls: $(cat "$TMP/why")"
else
	cat "$TMP/why"
	not_ok "the CNN's loss falls"
fi
run down --dir "$TMP/c"
summary
