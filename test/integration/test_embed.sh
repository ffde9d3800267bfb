#!/usr/bin/env bash
# examples/embed.json (doc/training.md, "Sparse updates") on `dg up --workers
# 2`: the bag-of-embeddings classifier with a [1048576, 32] table trains row
# by row. Checks: the Gather became a VarGather (placement), the test
# accuracy passes a floor, the loss falls, the table's slot is Adagrad's,
# and the tensor bytes the workers moved to and from the ps per step are at
# most (rows touched / rows) x a dense step's + 10%. A sanitizer build trains
# 150 steps a replica instead (the same graph, plan and ops).
# HOME and XDG_RUNTIME_DIR point into a temp dir.
# Usage: test_embed.sh PATH/TO/dg   (meson passes it)
set -uo pipefail

DG=${1:?usage: test_embed.sh PATH/TO/dg}
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
if ! $PY -c 'import numpy' 2>/dev/null; then
	echo "ok - skipped: $PY lacks numpy (apt-get install python3-numpy)"
	summary
	exit 0
fi

if $PY "$SRC/examples/embed_data.py" "$TMP/data" >"$TMP/out" 2>"$TMP/err"; then
	ok "embed_data.py wrote the token files"
else
	not_ok "examples/embed_data.py $TMP/data"
	summary
	exit 1
fi

MIN_ACC=0.80
STEPS=
[[ -n ${ASAN_OPTIONS:-} ]] && MIN_ACC=0.5 && STEPS=150
$PY - "$SRC/examples/embed.json" "$TMP/embed.json" "$TMP/data" "$STEPS" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for n in d["nodes"]:
    if n["op"] == "NpyReader":
        n["attrs"]["path"] = n["attrs"]["path"].replace("/var/tmp/dg-embed", sys.argv[3])
if sys.argv[4]:
    t = d["training"]
    t.pop("epochs")
    t["steps"] = int(sys.argv[4])
    t["eval"] = {"fetch": ["test_accuracy"], "every_steps": int(sys.argv[4])}
json.dump(d, open(sys.argv[2], "w"))
PYEOF

run up --dir "$TMP/c" --workers 2
[[ $rc -eq 0 ]] && ok "dg up --workers 2" || not_ok "dg up --workers 2"
W0=http://127.0.0.1:$(cat "$TMP/c/worker-0.port")
W1=http://127.0.0.1:$(cat "$TMP/c/worker-1.port")

run submit --explain "$TMP/embed.json"
if [[ $rc -eq 0 ]] && grep -q ' e = VarGather' "$TMP/out"; then
	ok "--explain: the lookup of emb is a VarGather"
else
	not_ok "--explain shows a VarGather for the embedding lookup"
fi
acc=$(sed -n 's/^test_accuracy: //p' "$TMP/out" | tail -n 1)
if [[ $rc -eq 0 ]] && $PY -c "import sys; sys.exit(0 if float('$acc') >= $MIN_ACC else 1)" 2>/dev/null; then
	ok "embed.json: test_accuracy $acc (>= $MIN_ACC); $(grep -o 'trained .*' "$TMP/err" | tail -n 1)"
else
	not_ok "embed.json reaches test_accuracy >= $MIN_ACC (got '${acc}')"
fi

# The loss falls: the first train row's against the last one's.
if curl -sf "$W0/v1/jobs/j1/metrics" >"$TMP/m" &&
	$PY - "$TMP/m" <<'PYEOF' >"$TMP/why" 2>&1
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["loss"]]
first, last = float(rows[0]["loss"]), float(rows[-1]["loss"])
print("loss %.3f -> %.3f over %d train rows" % (first, last, len(rows)))
sys.exit(0 if last < 0.8 * first else 1)
PYEOF
then
	ok "the loss falls: $(cat "$TMP/why")"
else
	cat "$TMP/why"
	not_ok "the embedding model's loss falls"
fi

PS=http://127.0.0.1:$(cat "$TMP/c/ps-0.port")
if curl -sf "$PS/v1/vars?prefix=emb" | grep -q '"emb.accum"'; then
	ok "Adagrad's accumulator emb.accum lives beside emb on the ps"
else
	not_ok "emb.accum exists on the ps"
fi

# Bytes per step through the ps: the workers' tensor bytes to and from the
# ps (dg_worker_ps_bytes_total) over the job's steps, against what a dense
# step moves (every variable read and its gradient sent whole) scaled by
# the fraction of the table's rows a batch touches, plus 10%.
curl -sf "$W0/v1/jobs/j1" >"$TMP/job"
{ curl -sf "$W0/v1/metrics"; curl -sf "$W1/v1/metrics"; } >"$TMP/metrics"
if $PY - "$TMP/job" "$TMP/metrics" "$TMP/data/train_tokens.npy" <<'PYEOF' >"$TMP/why" 2>&1
import json, re, sys
import numpy as np
job = json.load(open(sys.argv[1]))
steps = sum(job["training"]["replica_steps"])             # steps of all replicas
moved = sum(float(m.group(1)) for m in re.finditer(
    r'^dg_worker_ps_bytes_total\{[^}]*\} (\S+)$', open(sys.argv[2]).read(), re.M))
tok = np.load(sys.argv[3])
touched = np.mean([len(np.unique(tok[i:i + 64])) for i in range(0, 64 * 200, 64)])
rows, dim = 1048576, 32
dense = 2 * (rows * dim + 32 * 10 + 10) * 4          # read + gradient, every variable
bound = touched / rows * dense * 1.10
per = moved / max(steps, 1)
print("%.0f B a replica's step through the ps over %d steps; bound %.0f (%.0f rows "
      "touched of %d, dense step %d B): %.3f of the bound" % (per, steps, bound, touched,
                                                          rows, dense, per / bound))
sys.exit(0 if steps > 0 and per <= bound else 1)
PYEOF
then
	ok "$(cat "$TMP/why")"
else
	cat "$TMP/why"
	not_ok "bytes per step <= (rows touched / rows) x dense + 10%"
fi
run down --dir "$TMP/c"
summary
