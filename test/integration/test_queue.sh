#!/usr/bin/env bash
# The queue-fed input pipeline (doc/training.md, "The input pipeline") end to
# end on `dg up --workers 2` and Fashion-MNIST: examples/mlp_queue.json (a
# shuffle queue on ps 0, its feeder there, 2 async replicas, 3 epochs)
#   1. reaches a test accuracy >= 0.85, and every training example's id was
#      applied exactly once per epoch: the queue's per-id counts (3 enqueues,
#      3 acks each), cross-checked with the feeder's enqueues and the job's
#      step ledger (GET /v1/jobs/ID/steps: 180000 examples);
#   2. the same with worker 1 killed with -9 in epoch 2 and not restarted: the
#      job finishes, the ids are still applied exactly once per epoch, the
#      dead replica's leased batch was requeued (its replica_lost event and
#      the queue's requeued count; none when it died between a step's last
#      apply and its next dequeue) and the ledger adds up to 180000;
#   3. sync with 1 backup worker (1 epoch): every dropped example is requeued
#      and applied later (ids exactly once), the ledger says which steps of
#      which replica counted and names each dropped batch's ids, and
#      `dg job show --steps --by-step` sums it per step.
# HOME and XDG_RUNTIME_DIR point into a temp dir.
# Usage: test_queue.sh PATH/TO/dg   (meson passes it)
set -uo pipefail

DG=${1:?usage: test_queue.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(dirname "${BASH_SOURCE[0]}")/../..}
EX=$SRC/examples
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

# A sanitizer build trains ~10x slower, beside the other heavy scripts: there
# the first 12000 training images (an .npy subset), 1 epoch (accuracy >= 0.7,
# the kill at 40% of it) keep the script under a minute.
if [[ -n ${ASAN_OPTIONS:-} ]]; then
	N=12000 EPOCHS=1 MIN_ACC=0.7 KILL_AT=4800 KILL_MAX=12000
else
	N=60000 EPOCHS=3 MIN_ACC=0.85 KILL_AT=75000 KILL_MAX=120000
fi
$PY - "$EX/mlp_queue.json" "$TMP/mlp_queue.json" "$EPOCHS" "$N" "$TMP" <<'EOF'
import gzip, json, sys
d = json.load(open(sys.argv[1]))
e, n, tmp = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t = d["training"]
t["epochs"] = e
steps = e * n // (2 * t["batch"])          # the mean replica's steps of the run
t["lr_schedule"]["every"] = t["lr_schedule"]["every"] * steps // 1407
if n < 60000:
    import numpy as np
    fm = "/usr/share/datasets/fashion-mnist/"
    x = np.frombuffer(gzip.open(fm + "train-images-idx3-ubyte.gz").read()[16:], np.uint8)
    y = np.frombuffer(gzip.open(fm + "train-labels-idx1-ubyte.gz").read()[8:], np.uint8)
    np.save(tmp + "/x.npy", (x.reshape(-1, 784)[:n] / 255.0).astype(np.float32))
    np.save(tmp + "/y.npy", y[:n].astype(np.int32))
    for node in d["nodes"]:
        if node["name"] in ("train_x", "train_y"):
            node["op"] = "NpyReader"
            node["attrs"] = {"path": tmp + ("/x.npy" if node["name"] == "train_x" else "/y.npy")}
json.dump(d, open(sys.argv[2], "w"))
EOF

# No supervisor: worker 1, killed below, must stay down (a replica lost for good).
run up --dir "$TMP/c" --workers 2 --no-supervise
[[ $rc -eq 0 ]] && ok "dg up --workers 2" || not_ok "dg up --workers 2"
PS=127.0.0.1:$(cat "$TMP/c/ps-0.port")
MASTER=127.0.0.1:$(cat "$TMP/c/worker-0.port")

# check_once JOB EPOCHS: the queue's ids, the feeder's enqueues and the job's
# ledger agree that each of the N examples was applied EPOCHS times.
check_once() {
	curl -sf "http://$PS/v1/queues/examples/ids" >"$TMP/ids" &&
		curl -sf "http://$PS/v1/queues/examples" >"$TMP/queue" &&
		curl -sf "http://$MASTER/v1/jobs/$1/steps" >"$TMP/steps" &&
		curl -sf "http://$MASTER/v1/jobs/$1" >"$TMP/job" &&
		curl -sf "http://$MASTER/v1/jobs/$1/events" >"$TMP/events" &&
		$PY - "$TMP" "$2" "$N" <<'EOF' >"$TMP/why" 2>&1
import csv, json, sys
d, epochs, n_ex = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ids = json.load(open(d + "/ids"))
q = json.load(open(d + "/queue"))
job = json.load(open(d + "/job"))
rows = list(csv.DictReader(open(d + "/steps")))
events = [json.loads(l) for l in open(d + "/events") if l.strip()]
fed = [e for e in events if e.get("event") == "feeder" and e.get("state") == "done"]
enq, ack = ids["enqueued"], ids["acked"]
applied = sum(int(r["examples_applied"]) for r in rows)
problems = []
if len(enq) != n_ex or any(n != epochs for n in enq):
    problems.append("the feeder did not enqueue every id %d times" % epochs)
if len(ack) != n_ex or any(n != epochs for n in ack):
    bad = [i for i, n in enumerate(ack) if n != epochs][:5]
    problems.append("ids not acked exactly %d times, e.g. %s" % (epochs, bad))
if q["enqueued"] != n_ex * epochs or q["acked"] != n_ex * epochs or q["leased"]:
    problems.append("queue counts %s" % {k: q[k] for k in ("enqueued", "acked", "leased")})
# A lease that ran out while its step still applied (slow sanitizer builds) is
# requeued and learned again: the ledger then holds that batch twice. Only then.
extra = q["expired"] * 64
if not (n_ex * epochs <= applied <= n_ex * epochs + extra) or \
        job["training"]["examples"] != applied:
    problems.append("ledger %d examples, job %d, %d leases expired" %
                    (applied, job["training"]["examples"], q["expired"]))
if not fed:
    problems.append("no feeder done event")
print("ids x%d, ledger %d rows / %d examples, requeued %d, expired leases %d, ids_over %d" %
      (epochs, len(rows), applied, q["requeued"], q["expired"], q["ids_over"]))
print("; ".join(problems))
sys.exit(1 if problems else 0)
EOF
}

accuracy() {
	sed -n 's/^test_accuracy: //p' "$TMP/out" | tail -n 1
}

# --- 1. the queue-fed MLP ----------------------------------------------------------
run submit "$TMP/mlp_queue.json"
acc=$(accuracy)
if [[ $rc -eq 0 ]] && awk -v x="${acc:-0}" -v m="$MIN_ACC" 'BEGIN { exit !(x >= m) }'; then
	ok "mlp_queue.json, $EPOCHS epochs: test_accuracy $acc (>= $MIN_ACC); \
$(grep -ho '[0-9.]* examples/s' "$TMP/err" | tail -n 1)"
else
	not_ok "mlp_queue.json reaches a test accuracy >= $MIN_ACC (got ${acc:-none})"
fi
if check_once j1 "$EPOCHS"; then
	ok "every example applied exactly once per epoch: $(head -n 1 "$TMP/why")"
else
	cat "$TMP/why"
	not_ok "every example applied exactly once per epoch (ids, feeder, ledger)"
fi

# --- 2. a worker killed with -9 in epoch 2, not restarted ----------------------------
"$DG" submit "$TMP/mlp_queue.json" --retry-ms 1000 >"$TMP/kout" 2>"$TMP/kerr" &
sub=$!
killed=0
# until the job is in epoch 2 (a sanitizer build trains ~10x slower): 300 s at most
for ((i = 0; i < 3000; i++)); do
	kill -0 "$sub" 2>/dev/null || break
	a=$(curl -sf "http://$MASTER/v1/jobs/j2" 2>/dev/null | $PY -c '
import json, sys
print(json.load(sys.stdin)["training"]["input"]["applied"])' 2>/dev/null)
	if [[ -n $a && $a -ge $KILL_AT ]]; then
		kill -9 "$(cat "$TMP/c/worker-1.pid")" && killed=$a
		break
	fi
	sleep 0.1
done
rc=0
wait "$sub" || rc=$?
cp "$TMP/kout" "$TMP/out"
cp "$TMP/kerr" "$TMP/err"
if [[ $rc -eq 0 && $killed -ge $KILL_AT && $killed -lt $KILL_MAX ]]; then
	ok "worker 1 killed with -9 at $killed examples: the job finished"
else
	not_ok "the job finishes with worker 1 killed at $KILL_AT examples (killed at ${killed})"
fi
# The dead replica's leases went back (none when it was killed between a
# step's last apply, which ended its lease, and its next dequeue).
if check_once j2 "$EPOCHS" && grep -q '"replica_lost"' "$TMP/events" && $PY - "$TMP" <<'EOF' \
	>>"$TMP/why"
import csv, json, sys
d = sys.argv[1]
lost = [json.loads(l) for l in open(d + "/events") if '"replica_lost"' in l]
q = json.load(open(d + "/queue"))
n = lost[0]["requeued"] if lost else -1
# The ledger shows the requeue: a row without a step per lease the lost
# replica held, with its ids (the ps's requeue log, read by the master).
r = str(lost[0]["replica"]) if lost else "?"
back = [x for x in csv.DictReader(open(d + "/steps")) if x["step"] == "" and x["lease"]
        and x["replica"] == r]
ids = sum(len(x["ids"].split()) for x in back)
held = sum(int(x["examples_requeued"]) for x in back
           if x["reason"] in ("holder_released", "expired"))
print("the lost replica's leases: %d examples requeued, %d in %d ledger rows with %d ids" %
      (n, held, len(back), ids) if n > 0 else "the lost replica held no lease when it died")
sys.exit(0 if lost and n >= 0 and q["requeued"] >= n and held >= n and ids == held else 1)
EOF
then
	ok "after the kill, every example still applied exactly once per epoch: \
$(head -n 1 "$TMP/why"); $(tail -n 1 "$TMP/why")"
else
	cat "$TMP/why"
	grep replica_lost "$TMP/events"
	not_ok "after the kill: exactly once per epoch, the dead replica's leases back"
fi

# --- 3. sync with 1 backup worker ----------------------------------------------------
run up --dir "$TMP/c" --restart worker/1
[[ $rc -eq 0 ]] && ok "worker 1 restarted (dg up --restart)" || not_ok "dg up --restart worker/1"
$PY - "$TMP/mlp_queue.json" "$TMP/sync.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["training"].update({"mode": "sync", "backup": 1, "epochs": 1})
d["training"].pop("lr_schedule", None)
d["training"]["optimizer"] = {"rule": "sgd", "lr": 0.1}
json.dump(d, open(sys.argv[2], "w"))
EOF
run submit "$TMP/sync.json"
[[ $rc -eq 0 ]] && ok "sync with 1 backup: $(accuracy)" || not_ok "sync with 1 backup worker trains"
if check_once j3 1 && $PY - "$TMP" <<'EOF' >>"$TMP/why" 2>&1
import csv, json, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(d + "/steps")))
q = json.load(open(d + "/queue"))
share = {}
for r in rows:
    n, c = share.get(r["replica"], (0, 0))
    share[r["replica"]] = (n + 1, c + int(r["counted"]))
requeued = sum(int(r["examples_requeued"]) for r in rows)
# Each dropped step names its batch's ids; each of them was applied later:
# the queue acked every id exactly once (check_once), never at its drop.
acked = json.load(open(d + "/ids"))["acked"]
dropped = [r for r in rows if r["step"] and r["counted"] == "0"]
bad = [r["step"] for r in dropped if r["reason"] != "released" or
       len(r["ids"].split()) != int(r["examples_requeued"]) or
       any(acked[int(i)] != 1 for i in r["ids"].split())]
ids = sum(len(r["ids"].split()) for r in dropped)
print("steps counted per replica %s; %d dropped steps requeued %d examples, their %d ids "
      "all applied later" % ({k: "%d/%d" % (c, n) for k, (n, c) in sorted(share.items())},
                             len(dropped), requeued, ids))
if bad:
    print("dropped steps without their ids: %s" % bad[:5])
# The ledger's dropped steps requeued their batches, and the queue saw them back.
sys.exit(0 if requeued > 0 and q["requeued"] >= requeued and ids == requeued and not bad
         else 1)
EOF
then
	ok "sync with 1 backup: every dropped example requeued and applied later: \
$(tail -n 1 "$TMP/why")"
else
	cat "$TMP/why"
	not_ok "sync with 1 backup: dropped examples requeued, every id applied once"
fi
# The per-step view: each step's row names the replicas that counted and
# those dropped, and its sums are the ledger's.
run job show j3 --steps --by-step
cp "$TMP/out" "$TMP/bystep"
if [[ $rc -eq 0 ]] && $PY - "$TMP" <<'EOF' >"$TMP/why" 2>&1
import csv, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(d + "/steps")))
steps = list(csv.DictReader(open(d + "/bystep")))
want = {}
for r in rows:
    if r["step"]:
        c, x = want.setdefault(r["step"], (set(), set()))
        (c if r["counted"] == "1" else x).add(r["replica"])
bad = [t["step"] for t in steps if t["step"] and
       (set(t["replicas_counted"].split()), set(t["replicas_dropped"].split())) !=
       want.get(t["step"])]
tot = lambda rs, k: sum(int(r[k]) for r in rs)
same = all(tot(rows, k) == tot(steps, k) for k in ("examples_applied", "examples_requeued"))
mixed = sum(1 for t in steps if t["replicas_counted"] and t["replicas_dropped"])
print("%d steps, %d with a replica counted and one dropped; sums %s" %
      (len([t for t in steps if t["step"]]), mixed, "equal" if same else "DIFFER"))
if bad:
    print("steps whose replicas differ from the ledger's: %s" % bad[:5])
sys.exit(0 if steps and not bad and same and mixed > 0 else 1)
EOF
then
	ok "dg job show --steps --by-step: $(tail -n 1 "$TMP/why")"
else
	cat "$TMP/why"
	not_ok "dg job show --steps --by-step sums the ledger per step"
fi
run down --dir "$TMP/c"

summary
