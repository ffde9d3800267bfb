#!/usr/bin/env bash
# Distributed training end to end (doc/training.md) on 1 ps + 3 workers of
# `dg server` on loopback: a linear regression y = X w* + b* read with
# NpyReader + ShardBatch is trained by 2 replicas async and sync and reaches
# numpy's least-squares optimum; sync with 3 replicas and 1 backup finishes
# while one worker is SIGSTOPped; bad training sections, checkpoints without a
# data dir, a killed worker and a cancel fail clearly; a worker killed and
# restarted at the same address is retried and the job completes; the metrics
# (dg job show --metrics) and the events have one train row per step, the
# status a replica's step times. Usage: test_train.sh PATH/TO/dg   (meson passes it)
set -euo pipefail

DG=${1:?usage: test_train.sh PATH/TO/dg}
PY=/usr/bin/python3                     # Debian's python3 has numpy
TMP=$(mktemp -d)
declare -A pid=()
spid=
stopped=

cleanup() {
	[[ -n $stopped ]] && kill -CONT "$stopped" 2>/dev/null
	[[ -n $spid ]] && kill_wait "$spid"
	kill_wait "${pid[@]}"
	rm -rf "$TMP"
}
trap cleanup EXIT
SHOW_BYTES=1200
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! $PY -c 'import numpy' 2>/dev/null; then
	echo "ok - skipped: $PY has no numpy"
	summary
	exit 0
fi

# --- 1 ps + 3 workers ------------------------------------------------------------
read -r p0 p1 p2 p3 < <(free_ports 4)
printf '{"ps": ["127.0.0.1:%s"], "worker": ["127.0.0.1:%s", "127.0.0.1:%s", "127.0.0.1:%s"]}\n' \
	"$p0" "$p1" "$p2" "$p3" >"$TMP/cluster.json"
_start_server ps ps 0
_start_server w0 worker 0
_start_server w1 worker 1
_start_server w2 worker 2
for name in ps w0 w1 w2; do
	if ! wait_port "$TMP/$name.port" >/dev/null; then
		echo "server $name did not start:"; cat "$TMP/$name.log"
		echo "0 passed, 1 failed"; exit 1
	fi
done
C=(--cluster "$TMP/cluster.json")
MASTER=127.0.0.1:$p1

check() {
	local desc=$1
	shift
	if eval "$@"; then ok "$desc"; else not_ok "$desc"; fi
}

# --- the data and the graphs -----------------------------------------------------
# The kill tests train retry.json long enough that the job still runs when
# the kill lands: 900 epochs (28800 steps per replica, 7-20 s; 300 epochs took
# 2.4 s on an idle machine, and a replica could be done first); a sanitizer
# build is ~10x slower, and 300 epochs keep the script in its time there.
if [[ -n ${ASAN_OPTIONS:-} ]]; then RETRY_EPOCHS=300; else RETRY_EPOCHS=900; fi
RETRY_STEPS=$((RETRY_EPOCHS * 32))
# 1024 examples of 4 features; the optimum of the mean squared error is numpy's
# least squares (with noise, not exactly w*, b*).
$PY - "$TMP" "$RETRY_EPOCHS" <<'EOF'
import json, sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(7)
X = rng.normal(size=(1024, 4)).astype(np.float32)
w = np.array([[1.5], [-2.0], [0.5], [3.0]], np.float32)
Y = (X @ w + 0.7 + 0.01 * rng.normal(size=(1024, 1))).astype(np.float32)
np.save(d + "/x.npy", X)
np.save(d + "/y.npy", Y)
A = np.hstack([X, np.ones((1024, 1), np.float32)]).astype(np.float64)
np.save(d + "/opt.npy", np.linalg.lstsq(A, Y.astype(np.float64), rcond=None)[0].ravel())
nodes = [
    {"name": "X", "op": "NpyReader", "attrs": {"path": d + "/x.npy"}},
    {"name": "Y", "op": "NpyReader", "attrs": {"path": d + "/y.npy"}},
    {"name": "batch", "op": "ShardBatch", "inputs": ["X", "Y"], "attrs": {"batch": 16, "seed": 1}},
    {"name": "w", "op": "Variable", "attrs": {"var": "lr/w", "shape": [4, 1], "init": "zeros"}},
    {"name": "b", "op": "Variable", "attrs": {"var": "lr/b", "shape": [1], "init": "zeros"}},
    {"name": "p0", "op": "MatMul", "inputs": ["batch:0", "w"]},
    {"name": "p", "op": "Add", "inputs": ["p0", "b"]},
    {"name": "diff", "op": "Sub", "inputs": ["p", "batch:1"]},
    {"name": "sq", "op": "Square", "inputs": ["diff"]},
    {"name": "loss", "op": "Mean", "inputs": ["sq"]},
    {"name": "absd", "op": "Abs", "inputs": ["diff"]},
    {"name": "mae", "op": "Mean", "inputs": ["absd"]},
    {"name": "fp0", "op": "MatMul", "inputs": ["X", "w"]},
    {"name": "fp", "op": "Add", "inputs": ["fp0", "b"]},
    {"name": "fd", "op": "Sub", "inputs": ["fp", "Y"]},
    {"name": "fsq", "op": "Square", "inputs": ["fd"]},
    {"name": "full_mse", "op": "Mean", "inputs": ["fsq"]},
]
base = {"loss": "loss", "metrics": ["mae"], "optimizer": {"rule": "sgd", "lr": 0.05},
        "epochs": 10, "replicas": 2, "mode": "async", "reinit": True,
        "eval": {"fetch": ["full_mse"], "every_epochs": 5}}
def graph(name, **over):
    t = dict(base)
    t.update(over)
    json.dump({"version": 1, "nodes": nodes, "training": t}, open(d + "/" + name, "w"))
graph("async.json")
graph("sync.json", mode="sync")
# long enough to SIGSTOP a worker in the middle: 180 epochs (60 under a
# sanitizer): with 60 the job could end before the SIGSTOP landed
graph("backup.json", mode="sync", replicas=3, backup=1, epochs=int(sys.argv[2]) // 5,
      eval={"fetch": ["full_mse"], "every_steps": 1000})
graph("long.json", epochs=100000)
graph("retry.json", epochs=int(sys.argv[2]), eval={"fetch": ["full_mse"]})
graph("bad.json", optimizer={"rule": "sgd", "lr": 0.1, "bogus": 1})
graph("badloss.json", loss="nosuchnode")
graph("ckpt.json", checkpoint_secs=1)
EOF

# weights_ok: lr/w and lr/b as stored on the ps are within 0.02 of the optimum.
weights_ok() {
	"$DG" var get lr/w --format npy -o "$TMP/w.npy" "${C[@]}" >/dev/null 2>&1 &&
		"$DG" var get lr/b --format npy -o "$TMP/b.npy" "${C[@]}" >/dev/null 2>&1 &&
		$PY - "$TMP" <<'EOF'
import sys
import numpy as np
d = sys.argv[1]
got = np.concatenate([np.load(d + "/w.npy").ravel(), np.load(d + "/b.npy").ravel()])
opt = np.load(d + "/opt.npy")
err = np.abs(got - opt).max()
print("max |weights - least squares| =", err, file=sys.stderr)
sys.exit(0 if err < 0.02 else 1)
EOF
}

# job_json ID: the job's status JSON into $TMP/job.json.
job_json() {
	"$DG" job show "$1" --json "${C[@]}" >"$TMP/job.json" 2>/dev/null
}

# jq_py EXPR: print EXPR of the status in $TMP/job.json (j; t: its "training").
jq_py() {
	$PY -c "import json,sys; j=json.load(open(sys.argv[1])); t=j.get('training', {})
print($1)" "$TMP/job.json"
}

# --- async and sync reach the optimum ----------------------------------------------
run submit "$TMP/async.json" "${C[@]}"
check "async training of 2 replicas exits 0" '[[ $rc -eq 0 ]]'
check "the final eval is printed as NAME: VALUE with a small error" \
	'grep -qE "^full_mse: [0-9.e+-]+$" "$TMP/out" &&
	 $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) < 3e-4 else 1)" \
		"$(sed -n "s/^full_mse: //p" "$TMP/out")"'
check "stderr has epoch lines, an eval line and the summary" \
	'grep -q "^dg: epoch 10/10 step 320/320 loss " "$TMP/err" &&
	 grep -q "^dg: eval after epoch 5: full_mse " "$TMP/err" &&
	 grep -qE "^dg: trained 10 epochs \(320 steps x 2 replicas, 10240 examples\) in" "$TMP/err"'
check "async: the weights on the ps are numpy's least squares" weights_ok
job_json j1
e='t["mode"], t["replicas"], t["examples"], t["replica_steps"]'
check "the status has the training summary" '[[ "$(jq_py "$e")" == "async 2 10240 [320, 320]" ]]'

run job show j1 --metrics "${C[@]}"
header=step,time_s,epoch,loss,mae,examples_per_s,full_mse
check "job show --metrics prints the CSV header" \
	'[[ $rc -eq 0 && "$(head -n 1 "$TMP/out")" == "$header" ]]'
check "the metrics rows have increasing steps, the last at 320 with an eval" \
	'awk -F, "NR > 1 { if (\$1 < last) bad = 1; last = \$1; if (\$7 != \"\") ev = \$1 }
		END { exit !(bad == 0 && last == 320 && ev == 320 && NR > 4) }" "$TMP/out"'
check "train rows carry a loss and examples/s, eval rows the eval value" \
	'awk -F, "NR > 1 && \$4 != \"\" && \$6 != \"\" { t++ } NR > 1 && \$7 != \"\" { e++ }
		END { exit !(t >= 3 && e == 2) }" "$TMP/out"'
check "train rows have strictly increasing steps (the last one is not repeated)" \
	'awk -F, "NR > 1 && \$4 != \"\" { if (n && \$1 <= last) bad = 1; last = \$1; n++ }
		END { exit !(bad == 0 && n >= 3) }" "$TMP/out"'
curl -s "http://$MASTER/v1/jobs/j1/events" >"$TMP/events"
check "train events have strictly increasing steps, the last at 320, once" \
	'$PY -c "import json, sys
s = [e[\"step\"] for e in map(json.loads, open(sys.argv[1])) if e[\"event\"] == \"train\"]
sys.exit(0 if s == sorted(set(s)) and s[-1] == 320 else 1)" "$TMP/events"'
job_json j1
e='0 < j["ms"]["last_step"] and 0 < j["ms"]["mean_step"] and
	j["ms"]["mean_step"] * 320 <= j["ms"]["total"]'
check "the status has a replica's step times: 0 < last, 0 < mean, mean x 320 steps <= total" \
	'[[ "$(jq_py "$e")" == True ]]'
run job show j1 "${C[@]}"
check "job show prints the training summary and the table" \
	'grep -q "^training:   async, 2 replica(s), 10 epochs, 320 steps per replica, batch 16" \
		"$TMP/out" && grep -q "^metrics:" "$TMP/out"'

run submit "$TMP/sync.json" "${C[@]}" --json
check "sync training of 2 replicas exits 0 and --json prints the status" \
	'[[ $rc -eq 0 ]] && cp "$TMP/out" "$TMP/job.json" &&
	 [[ "$(jq_py "j[\"state\"], t[\"mode\"], t[\"stale\"]")" == "done sync 0" ]]'
check "sync: the weights on the ps are numpy's least squares" weights_ok
curl -s "http://127.0.0.1:$p0/v1/vars" >"$TMP/vars.json"
check "sync: every variable's sync step advanced by the 320 steps" \
	'$PY -c "import json,sys; v=json.load(open(sys.argv[1]))[\"vars\"];
sys.exit(0 if sorted(x[\"step\"] for x in v) == [320, 320] else 1)" "$TMP/vars.json"'

# --- sync with a backup finishes without a stopped worker ---------------------------
"$DG" submit "$TMP/backup.json" "${C[@]}" >"$TMP/bout" 2>"$TMP/berr" &
spid=$!
for ((i = 0; i < 200; i++)); do
	"$DG" job show j3 --json "${C[@]}" >"$TMP/job.json" 2>/dev/null &&
		[[ "$(jq_py "min(t.get(\"replica_steps\", [0]))")" -gt 20 ]] &&
		break
	sleep 0.05
done
kill -STOP "${pid[w2]}"
stopped=${pid[w2]}
t0=$(date +%s)
brc=0
wait "$spid" || brc=$?
spid=
kill -CONT "$stopped"
stopped=
rc=$brc
cp "$TMP/bout" "$TMP/out"
cp "$TMP/berr" "$TMP/err"
check "sync with 1 backup of 3 replicas finishes while worker 2 is stopped" \
	'[[ $rc -eq 0 && $(( $(date +%s) - t0 )) -lt 60 ]]'
job_json j3
e='[s == t["steps"] for s in t["replica_steps"]]'
check "the stopped replica ran fewer steps than the others, which ran them all" \
	'[[ "$(jq_py "$e")" == "[True, True, False]" ]]'
check "the backup job still reaches the optimum" weights_ok

# --- errors --------------------------------------------------------------------------
run submit "$TMP/bad.json" "${C[@]}"
check_err "an unknown optimizer key is refused naming it" 2 "bogus"
$PY -c "import json,sys; print(json.dumps({'graph': json.load(open(sys.argv[1]))}))" \
	"$TMP/bad.json" >"$TMP/badjob.json"
code=$(curl -s -o "$TMP/body" -w '%{http_code}' -X POST --data-binary @"$TMP/badjob.json" \
	"http://$MASTER/v1/jobs" || true)
rc=0
check "a graph's training section with an unknown key: 400 naming it" \
	'[[ $code == 400 ]] && grep -q bogus "$TMP/body"'
run submit "$TMP/badloss.json" "${C[@]}"
check_err "a loss that is not a node is refused naming it" 3 "nosuchnode"
run submit "$TMP/async.json" --steps 5 "${C[@]}"
check_err "--steps does not apply to a training graph" 1 "do not apply to a training graph"
run submit "$TMP/ckpt.json" "${C[@]}"
check "checkpoints on a ps without --data-dir fail the job naming the ps" \
	'[[ $rc -ne 0 ]] && grep -q "checkpoint of ps 127.0.0.1:$p0" "$TMP/err"'

# collect_job: wait for the dg submit in the background (spid); its status in
# rc, its --json output in out and job.json, its stderr in err.
collect_job() {
	rc=0
	wait "$spid" || rc=$?
	spid=
	cp "$TMP/rout" "$TMP/out"
	cp "$TMP/rout" "$TMP/job.json"
	cp "$TMP/rerr" "$TMP/err"
}

# wait_replica_steps N: until the running job's every replica ran more than N
# steps (20 s at most).
wait_replica_steps() {
	for ((i = 0; i < 400; i++)); do
		"$DG" job ls --json "${C[@]}" 2>/dev/null >"$TMP/ls.json" &&
			$PY -c '
import json, sys
r = [j for j in json.load(open(sys.argv[1]))["jobs"] if j["state"] == "running"]
sys.exit(0 if r and min(r[0].get("training", {}).get("replica_steps", [0])) > int(sys.argv[2])
	 else 1)' "$TMP/ls.json" "$1" && return 0
		sleep 0.05
	done
	return 1
}

# --- a worker killed and restarted: its replica runs on from its last step --------
"$DG" submit "$TMP/retry.json" "${C[@]}" --json >"$TMP/rout" 2>"$TMP/rerr" &
spid=$!
wait_replica_steps 100
kill -KILL "${pid[w1]}"
wait "${pid[w1]}" 2>/dev/null || true
sleep 0.5
rm -f "$TMP/w1.port"
_start_server w1 worker 1
wait_port "$TMP/w1.port" >/dev/null || echo "# worker/1 did not restart: $(cat "$TMP/w1.log")"
collect_job
check "a worker killed and restarted: the training job completes with every step of both replicas" \
	'[[ $rc -eq 0 && "$(jq_py "j[\"state\"], t[\"replica_steps\"]")" == "done [$RETRY_STEPS, $RETRY_STEPS]" ]]'
check "dg submit says replica 1 was lost and retried" \
	'grep -qE "^dg: replica 1, step [0-9]+: /job:worker/task:1 was lost \(.*\); retry 1 once" \
		"$TMP/err"'
curl -s "http://$MASTER/v1/jobs/$(jq_py 'j["id"]')/events" >"$TMP/events"
check "the job's events have a retry event of replica 1 on worker/1 at the step it had reached" \
	'$PY -c "import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
r = [e for e in ev if e[\"event\"] == \"retry\"]
sys.exit(0 if r and r[0][\"task\"] == \"/job:worker/task:1\" and r[0][\"replica\"] == 1 and
	 r[0][\"attempt\"] == 1 and 100 < r[0][\"step\"] < $RETRY_STEPS else 1)" "$TMP/events"'
check "the retried job still reaches the optimum" weights_ok

# --- a ps killed and restarted from its data dir: the job pauses, goes back, ends --
# The ps is restarted with a data dir (snapshots every second) at its address;
# killed with -9 mid-job, it comes back from its last snapshot (the applies
# after it are gone): the replicas wait for it, re-run the steps after the
# snapshot's cut, and the job still reaches the optimum.
kill_wait "${pid[ps]}"
rm -f "$TMP/ps.port"
start_ps_dir() {
	"$DG" server --cluster "$TMP/cluster.json" --job ps --task 0 --data-dir "$TMP/psdata" \
		--checkpoint-secs 1 --port-file "$TMP/ps.port" 2>>"$TMP/ps.log" &
	pid[ps]=$!
	wait_port "$TMP/ps.port" >/dev/null || echo "# ps/0 did not start: $(tail -3 "$TMP/ps.log")"
}
start_ps_dir
"$DG" submit "$TMP/retry.json" "${C[@]}" --json >"$TMP/rout" 2>"$TMP/rerr" &
spid=$!
wait_replica_steps 2500
kill -KILL "${pid[ps]}"
wait "${pid[ps]}" 2>/dev/null || true
rm -f "$TMP/ps.port"
sleep 0.3
start_ps_dir
collect_job
check "a ps killed and restarted: the training job completes every step of both replicas" \
	'[[ $rc -eq 0 && "$(jq_py "j[\"state\"], t[\"replica_steps\"]")" == "done [$RETRY_STEPS, $RETRY_STEPS]" ]]'
check "dg submit says the ps was lost, is back at epoch 2 with its variables, replicas resume" \
	'grep -qE "^dg: replica [01], step [0-9]+: /job:ps/task:0 was lost" "$TMP/err" &&
	 grep -qE "^dg: /job:ps/task:0 is back \(epoch 2\); 2 variables as it recovered them: lr/b version [0-9]+ step 0, lr/w version" "$TMP/err" &&
	 grep -qE "^dg: replica [01] resumes at step [0-9]+ after" "$TMP/err"'
curl -s "http://$MASTER/v1/jobs/$(jq_py 'j["id"]')/events" >"$TMP/events"
check "the events: one recovered (epoch 2, its snapshot's time), both replicas rewound to before it" \
	'$PY -c "import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
rec = [e for e in ev if e[\"event\"] == \"recovered\"]
rw = {e[\"replica\"]: e for e in ev if e[\"event\"] == \"rewound\"}
ok = (len(rec) == 1 and rec[0][\"epoch\"] == 2 and rec[0][\"snapshot_at\"] > 0 and
      len(rec[0][\"vars\"]) == 2 and sorted(rw) == [0, 1] and
      all(0 <= e[\"to\"] < e[\"from\"] and e[\"task\"] == \"/job:ps/task:0\" for e in rw.values()))
if not ok:
    print(\"# recovered:\", rec, \"rewound:\", list(rw.values()))
sys.exit(0 if ok else 1)" "$TMP/events"'
check "the job that lost a ps's applies still reaches the optimum" weights_ok

# --- cancel and a dead worker ---------------------------------------------------------
"$DG" submit "$TMP/long.json" "${C[@]}" >"$TMP/lout" 2>"$TMP/lerr" &
spid=$!
id=
for ((i = 0; i < 200; i++)); do
	[[ -n $id ]] && break
	sleep 0.05
	id=$("$DG" job ls --json "${C[@]}" 2>/dev/null | $PY -c '
import json, sys
r = [j["id"] for j in json.load(sys.stdin)["jobs"] if j["state"] == "running"]
print(r[0] if r else "")')
done
run job cancel "$id" "${C[@]}"
lrc=0
wait "$spid" || lrc=$?
spid=
job_json "$id"
check "a long training job is canceled: dg submit fails, the job is canceled" \
	'[[ $lrc -ne 0 && "$(jq_py "j[\"state\"]")" == canceled ]] && grep -q canceled "$TMP/lerr"'

"$DG" submit "$TMP/long.json" "${C[@]}" --retry-ms 1000 >"$TMP/lout" 2>"$TMP/lerr" &
spid=$!
# Kill once the replicas are stepping (a sanitizer build may still be
# registering fragments after a second, and then fails for that instead).
for ((i = 0; i < 300; i++)); do
	kill -0 "$spid" 2>/dev/null || break
	done_steps=$("$DG" job ls --json "${C[@]}" 2>/dev/null | $PY -c '
import json, sys
r = [sum(j.get("training", {}).get("replica_steps", [0])) for j in json.load(sys.stdin)["jobs"]
     if j["state"] == "running"]
print(r[-1] if r else 0)' 2>/dev/null)
	[[ ${done_steps:-0} -gt 0 ]] && break
	sleep 0.1
done
kill -KILL "${pid[w1]}"
wait "${pid[w1]}" 2>/dev/null || true
lrc=0
wait "$spid" || lrc=$?
spid=
rc=$lrc
cp "$TMP/lout" "$TMP/out"
cp "$TMP/lerr" "$TMP/err"
check "a killed worker that does not come back fails the training job naming its task" \
	'[[ $rc -ne 0 ]] &&
	 grep -qF "task /job:worker/task:1 (127.0.0.1:$p2) did not come back within 1000 ms" "$TMP/err"'

# Sanitizer builds: the servers (the master's job threads included) stop
# cleanly, with no leak or UB report in their logs.
kill_wait "${pid[@]}"
pid=()
rc=0
check "the servers stop without sanitizer reports" \
	'! grep -qE "Sanitizer|runtime error:" "$TMP"/ps.log "$TMP"/w0.log "$TMP"/w2.log'

# --- a master that dies leaves nothing behind: fragment leases -------------------------
# A cluster whose master renews its fragments' leases every 0.5 s (2 s leases).
read -r q0 q1 q2 < <(free_ports 3)
printf '{"ps": ["127.0.0.1:%s"], "worker": ["127.0.0.1:%s", "127.0.0.1:%s"]}\n' \
	"$q0" "$q1" "$q2" >"$TMP/cluster.json"
SERVER_EXTRA=(--fragment-lease-s 2)
_start_server lps ps 0
_start_server lw0 worker 0
_start_server lw1 worker 1
for name in lps lw0 lw1; do
	wait_port "$TMP/$name.port" >/dev/null || echo "# $name did not start: $(cat "$TMP/$name.log")"
done
W1=http://127.0.0.1:$q2
wmetric() { curl -s "$W1/v1/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
rc=0
before="$(wmetric dg_worker_fragments) $(wmetric dg_worker_cached_bytes)"
"$DG" submit "$TMP/retry.json" "${C[@]}" >"$TMP/rout" 2>"$TMP/rerr" &
spid=$!
wait_replica_steps 100
sleep 3         # past a whole lease with the master alive: nothing may expire
check "with its master alive, a job's fragments outlive their 2 s lease on worker/1" \
	'[[ $(wmetric dg_worker_fragments) -ge 1 && $(wmetric dg_worker_fragments_expired_total) == 0 ]] &&
	 kill -0 $spid'
kill -KILL "${pid[lw0]}"
wait "${pid[lw0]}" 2>/dev/null || true
unset "pid[lw0]"
wait "$spid" 2>/dev/null || true      # dg submit fails: its master is gone
spid=
gone=false
for ((i = 0; i < 100; i++)); do
	[[ "$(wmetric dg_worker_fragments) $(wmetric dg_worker_cached_bytes)" == "$before" &&
	   $(wmetric dg_worker_rendezvous_bytes) == 0 ]] && { gone=true; break; }
	sleep 0.1
done
check "the master killed: worker/1 forgets its fragments and cached tensors within 10 s ($before)" \
	'$gone && [[ $(wmetric dg_worker_fragments_expired_total) -ge 1 ]]'
check "worker/1 logs why" 'grep -q "did not renew it within 2000 ms" "$TMP/lw1.log"'
# The lease at the HTTP level: renewed, kept; not renewed, forgotten; bad ones refused.
frag='{"version": 1, "nodes": [{"name": "c", "op": "Const", "attrs": {"value": 1.0}}]}'
fid=$(curl -s -X POST -H 'Content-Type: application/json' --data "$frag" \
	"$W1/v1/fragments?owner=test-owner&lease_ms=600" | $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')
for ((i = 0; i < 10; i++)); do
	curl -s -X POST "$W1/v1/fragments/renew?owner=test-owner" >"$TMP/renew"
	sleep 0.15
done
check "a fragment renewed every 0.15 s outlives its 0.6 s lease" \
	'grep -q "\"renewed\": *1" "$TMP/renew" &&
	 [[ $(curl -s -o /dev/null -w "%{http_code}" -X DELETE "$W1/v1/fragments/$fid") == 204 ]]'
fid=$(curl -s -X POST -H 'Content-Type: application/json' --data "$frag" \
	"$W1/v1/fragments?owner=test-owner&lease_ms=300" | $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')
sleep 1.5
check "one not renewed is gone after its lease" \
	'[[ $(curl -s -o /dev/null -w "%{http_code}" -X DELETE "$W1/v1/fragments/$fid") == 404 ]]'
check "a lease of 5 ms, or an owner without lease_ms, is a 400" \
	'[[ $(curl -s -o /dev/null -w "%{http_code}" -X POST --data "$frag" \
		"$W1/v1/fragments?owner=o&lease_ms=5") == 400 &&
	   $(curl -s -o /dev/null -w "%{http_code}" -X POST --data "$frag" \
		"$W1/v1/fragments?owner=o") == 400 ]]'
kill_wait "${pid[@]}"
pid=()
check "the lease cluster stops without sanitizer reports" \
	'! grep -qE "Sanitizer|runtime error:" "$TMP"/lps.log "$TMP"/lw1.log'

summary
