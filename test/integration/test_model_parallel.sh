#!/usr/bin/env bash
# The three ways to distribute one model (doc/training.md), end to end through
# `dg up` and `dg submit` on Fashion-MNIST: examples/mlp_model_parallel.json
# (layer 1 on worker 0, layer 2 on worker 1), examples/mlp_in_graph.json (two
# towers), examples/mlp_seed_split.json (the seeds' two-slice program, towers
# written by hand) each reach a test accuracy >= 0.85 on 2 workers, and the
# model-parallel one on 4 workers runs as 2 replicas of 2 tasks; their devices
# show in --explain. HOME and XDG_RUNTIME_DIR point into a temp dir.
# Usage: test_model_parallel.sh PATH/TO/dg   (meson passes it)
set -uo pipefail

DG=${1:?usage: test_model_parallel.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(dirname "${BASH_SOURCE[0]}")/../..}
EX=$SRC/examples
TMP=$(mktemp -d)
export HOME=$TMP/home XDG_RUNTIME_DIR=$TMP/run
unset DG_CLUSTER TF_CONFIG
mkdir -p "$HOME" "$XDG_RUNTIME_DIR"
FMNIST=/usr/share/datasets/fashion-mnist

cleanup() {
	"$DG" down --dir "$TMP/c2" >/dev/null 2>&1
	"$DG" down --dir "$TMP/c4" >/dev/null 2>&1
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

# accuracy_at_least MIN: the submit's last stdout line is "test_accuracy: X", X >= MIN.
accuracy_at_least() {
	local x
	x=$(sed -n 's/^test_accuracy: //p' "$TMP/out" | tail -n 1)
	[[ -n $x ]] && awk -v x="$x" -v m="$1" 'BEGIN { exit !(x >= m) }'
}

# --- 2 workers ---------------------------------------------------------------------
run up --dir "$TMP/c2" --workers 2
[[ $rc -eq 0 ]] && ok "dg up --workers 2" || not_ok "dg up --workers 2"

for ex in mlp_model_parallel mlp_in_graph mlp_seed_split; do
	run submit "$EX/$ex.json"
	if [[ $rc -eq 0 ]] && accuracy_at_least 0.85; then
		ok "$ex.json on 2 workers: $(tail -n 1 "$TMP/out") (>= 0.85); $(grep -ho \
			'[0-9.]* examples/s' "$TMP/err" | tail -n 1)"
	else
		not_ok "$ex.json on 2 workers reaches a test accuracy >= 0.85"
	fi
done
# (after the accuracy runs: it trains again, from the variables they left)
run submit "$EX/mlp_model_parallel.json" --explain
if [[ $rc -eq 0 ]] && grep -q "1 replica(s) of 2 task(s)" "$TMP/out" &&
	grep -qE "h1_mm +/job:worker/task:0 +explicit" "$TMP/out" &&
	grep -qE "logits_mm +/job:worker/task:1 +explicit" "$TMP/out" &&
	grep -qE "batch +/job:worker/task:0 +replica default" "$TMP/out"; then
	ok "--explain of the model-parallel MLP: layer 1 on worker 0, layer 2 on worker 1"
else
	not_ok "--explain of the model-parallel MLP: layer 1 on worker 0, layer 2 on worker 1"
fi

run down --dir "$TMP/c2"

# --- 4 workers: 2 replicas of 2 tasks ----------------------------------------------
run up --dir "$TMP/c4" --workers 4
[[ $rc -eq 0 ]] && ok "dg up --workers 4" || not_ok "dg up --workers 4"
run submit "$EX/mlp_model_parallel.json" --json
if [[ $rc -eq 0 ]] && /usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
t = s["training"]
acc = s["results"]["test_accuracy"] if "results" in s else t["eval"]["test_accuracy"]
reps = sorted({(x["replica"], x["device"]) for x in s["tasks"] if "replica" in x})
ok = (t["replicas"] == 2 and acc >= 0.85 and
      reps == [(0, "/job:worker/task:0"), (0, "/job:worker/task:1"),
               (1, "/job:worker/task:2"), (1, "/job:worker/task:3")])
print("replicas", t["replicas"], "test_accuracy", acc, reps)
sys.exit(0 if ok else 1)' "$TMP/out" >"$TMP/why" 2>&1; then
	ok "mlp_model_parallel.json on 4 workers: 2 replicas x 2 tasks, $(cat "$TMP/why")"
else
	cat "$TMP/why"
	not_ok "mlp_model_parallel.json on 4 workers: 2 replicas of workers 0+1 and 2+3, >= 0.85"
fi
run down --dir "$TMP/c4"

summary
