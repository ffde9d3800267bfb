#!/usr/bin/env bash
# `dg submit` end to end on a real cluster of three `dg server` processes on
# loopback (1 ps + 2 workers, ports picked first because every server needs
# the final spec): the seed programs, --explain, placement errors, soft
# placement, multi-step progress, .npy output, and a worker killed mid-job:
# restarted at the same address, the master re-runs the step and the job
# completes; with --retry-ms 0 the job fails at once naming the task.
# Usage: test_submit.sh PATH/TO/dg   (meson passes it)
set -euo pipefail

DG=${1:?usage: test_submit.sh PATH/TO/dg}
HERE=$(cd "$(dirname "$0")" && pwd)
EX=${DG_SOURCE_DIR:-$HERE/../..}/examples
SHOW_BYTES=800
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cluster_script_init             # TMP, pid[], spid and the EXIT trap that stops them

# check_err DESC EXPECTED_RC SUBSTRING: exit code and a substring of stderr
# (lib.sh's check_err also wants the "dg: " prefix and an empty stdout).
check_err() {
	if [[ $rc -eq $2 ]] && grep -qF -- "$3" "$TMP/err"; then ok "$1"; else not_ok "$1"; fi
}

# Three free loopback ports: every server needs the final spec.
start_small_cluster
C=(--cluster "$TMP/cluster.json")

# --- the seed program -------------------------------------------------------
run submit "$EX/seed_sum_distributed.json" "${C[@]}"
check_out "seed_sum_distributed prints 238" 0 "238"

run submit "$EX/seed_sum.json" "${C[@]}"
check_out "examples/seed_sum.json prints 238 on a ps+worker cluster" 0 "238"

run submit "$EX/seed_sum_distributed.json" "${C[@]}" --explain
if [[ $rc -eq 0 ]] && grep -qE '^  y1 +/job:worker/task:0 ' "$TMP/out" &&
   grep -qE '^  y2 +/job:worker/task:1 ' "$TMP/out" && [[ "$(tail -n 1 "$TMP/out")" == 238 ]] &&
   grep -qF "key x:0->worker/1" "$TMP/out"; then
	ok "--explain shows y1 on worker/0, y2 on worker/1, the send of x, then 238"
else
	not_ok "--explain shows y1 on worker/0, y2 on worker/1, the send of x, then 238"
fi

run submit "$EX/seed_sum.json" --master "127.0.0.1:$P2" --fetch y1 --fetch y2
check_out "--master another task, two fetches" 0 $'y1:\n302\ny2:\n-64'

run submit "$EX/seed_sum.json" "${C[@]}" --steps 3
if [[ $rc -eq 0 && "$(cat "$TMP/out")" == 238 ]] && grep -qF "dg: step 3/3" "$TMP/err"; then
	ok "--steps 3 prints plain progress lines when stderr is not a terminal"
else
	not_ok "--steps 3 prints plain progress lines when stderr is not a terminal"
fi
run submit "$EX/seed_sum.json" "${C[@]}" --steps 2000
lines=$(grep -c '^dg: step ' "$TMP/err" || true)
if [[ $rc -eq 0 && "$(cat "$TMP/out")" == 238 && $lines -ge 2 && $lines -le 120 ]] &&
   grep -qF "dg: step 2000/2000" "$TMP/err"; then
	ok "--steps 2000 to a non-terminal prints a line per percent or second ($lines), and the last"
else
	not_ok "--steps 2000 to a non-terminal prints a line per percent or second, and the last"
	echo "# $lines lines"
fi

run submit "$EX/seed_sum.json" "${C[@]}" --out "$TMP/o"
if [[ $rc -eq 0 && -s "$TMP/o/y.npy" ]] && grep -qF "wrote $TMP/o/y.npy (int32 [])" "$TMP/out"; then
	ok "--out writes y.npy"
else
	not_ok "--out writes y.npy"
fi

# --- the weighted mean for several splits -------------------------------------
# Debian's interpreter carries python3-numpy; the python3 on PATH may not.
PY=python3
[[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3
HAVE_NUMPY=0
if "$PY" -c 'import numpy' 2>/dev/null; then HAVE_NUMPY=1; fi
"$PY" - "$TMP/x.txt" "$TMP/expect" "$HAVE_NUMPY" <<'PY'
import random, struct, sys
random.seed(7)
xs = [struct.unpack('f', struct.pack('f', random.uniform(-100, 100)))[0] for _ in range(100)]
open(sys.argv[1], 'w').write('[' + ','.join(repr(v) for v in xs) + ']')
if sys.argv[3] == '1':
    import numpy as np
    m = float(np.mean(np.array(xs, dtype=np.float32)))
else:
    m = sum(xs) / len(xs)
open(sys.argv[2], 'w').write(repr(m))
PY
[[ $HAVE_NUMPY -eq 1 ]] || echo "# note: $PY has no numpy: the expected mean is computed in plain Python"
for k in 1 37 50 99; do
	sed -e "s/\"size\": \[37\]/\"size\": [$k]/" -e "s/\"begin\": \[37\]/\"begin\": [$k]/" \
		"$EX/weighted_mean_distributed.json" >"$TMP/wm_$k.json"
	run submit "$TMP/wm_$k.json" "${C[@]}" --feed "x=$(cat "$TMP/x.txt")"
	if [[ $rc -eq 0 ]] && python3 -c '
import sys
got, want = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if abs(got - want) <= 1e-5 * max(1.0, abs(want)) else 1)' "$(cat "$TMP/out")" "$(cat "$TMP/expect")"; then
		ok "weighted mean with split $k/$((100 - k)) equals the mean"
	else
		not_ok "weighted mean with split $k/$((100 - k)) equals the mean (want $(cat "$TMP/expect"))"
	fi
done

# --- placement errors ---------------------------------------------------------
sed 's|/job:worker/task:1|/job:local/task:1|' "$EX/seed_sum.json" >"$TMP/local.json"
run submit "$TMP/local.json" "${C[@]}"
check_err "a device naming a missing job fails clearly" 2 \
	"dg: node 'c66' is placed on /job:local/task:1, but the cluster has no job 'local' (jobs: ps, worker)"

sed 's|"device": "/job:worker/task:0"}|"device": "/job:worker/task:0/gpu:0"}|' \
	"$EX/seed_sum.json" >"$TMP/gpu.json"
run submit "$TMP/gpu.json" "${C[@]}"
check_err "gpu placement on a task without a GPU fails clearly" 16 \
	"but that task has no GPU"
run submit "$TMP/gpu.json" "${C[@]}" --soft-placement
if [[ $rc -eq 0 && "$(cat "$TMP/out")" == 238 ]] && grep -qF "(soft placement)" "$TMP/err" &&
   grep -qF "/job:worker/task:0/gpu:0" "$TMP/err"; then
	ok "--soft-placement runs it on the CPU and says so"
else
	not_ok "--soft-placement runs it on the CPU and says so"
fi

run submit "$EX/seed_sum.json" --bogus
check_err "unknown option is a usage error" 1 "try 'dg submit --help'"
run submit --help
if [[ $rc -eq 0 ]] && grep -qF "usage: dg submit GRAPH.json" "$TMP/out"; then ok "--help"; else not_ok "--help"; fi

# --- a worker killed mid-job and restarted: the step is re-run ---------------
# 10000 steps (2-4 s): the job must still be running when the kill lands, also
# when the machine is loaded and `dg job ls` is slow to answer.
# running_job: the id and steps done of the job running on worker/0 ("" 0 when none).
running_job() {
	"$DG" job ls --json "${C[@]}" 2>/dev/null | python3 -c '
import json, sys
r = [(j["id"], j["steps_done"]) for j in json.load(sys.stdin)["jobs"] if j["state"] == "running"]
print(*(r[0] if r else ("", 0)))'
}
rc=0
"$DG" submit "$EX/seed_sum.json" "${C[@]}" --steps 10000 >"$TMP/rout" 2>"$TMP/rerr" &
spid=$!
jid= done_steps=0
for ((i = 0; i < 400; i++)); do
	read -r jid done_steps < <(running_job)
	[[ -n $jid && $done_steps -ge 20 ]] && break
	sleep 0.05
done
kill -9 "${pid[w1]}"
wait "${pid[w1]}" 2>/dev/null || true
sleep 0.5
rm -f "$TMP/w1.port"
_start_server w1 worker 1
wait_port "$TMP/w1.port" >/dev/null || echo "# worker/1 did not restart: $(cat "$TMP/w1.log")"
wait "$spid" || rc=$?
spid=
cp "$TMP/rout" "$TMP/out"
cp "$TMP/rerr" "$TMP/err"
if [[ $rc -eq 0 && "$(cat "$TMP/out")" == 238 && $done_steps -ge 20 ]] &&
   grep -qE "^dg: step [0-9]+: /job:worker/task:1 was lost \(.*\); retry 1 once it answers again$" \
	"$TMP/err"; then
	ok "a worker killed after step $done_steps and restarted: the step is re-run, 238 printed"
	echo "# $(grep "was lost" "$TMP/err")"
else
	not_ok "a worker killed and restarted: the step is re-run and the job prints 238"
fi
curl -s "http://127.0.0.1:$P1/v1/jobs/$jid/events" >"$TMP/events"
curl -s "http://127.0.0.1:$P1/v1/jobs/$jid" >"$TMP/status"
if python3 - "$TMP/events" "$TMP/status" <<'EOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
st = json.load(open(sys.argv[2]))
retry = [e for e in ev if e["event"] == "retry"]
assert len(retry) >= 1, ev[-3:]
assert retry[0]["task"] == "/job:worker/task:1" and retry[0]["attempt"] == 1, retry
assert 20 < retry[0]["step"] <= 10000, retry
assert st["state"] == "done" and st["steps_done"] == 10000, st
EOF
then
	ok "the job's events have a retry event naming worker/1, and all 10000 steps are done"
else
	not_ok "the job's events have a retry event naming worker/1, and all 10000 steps are done"
fi

# --- with --retry-ms 0 a killed worker fails the job at once ------------------
rc=0
"$DG" submit "$EX/seed_sum.json" "${C[@]}" --steps 100000000 --retry-ms 0 >"$TMP/out" \
	2>"$TMP/err" &
spid=$!
sleep 1
kill -9 "${pid[w1]}"
wait "${pid[w1]}" 2>/dev/null || true
unset 'pid[w1]'
t0=$(date +%s)
wait "$spid" || rc=$?
spid=
t1=$(date +%s)
if [[ $rc -ne 0 && $((t1 - t0)) -le 20 ]] &&
   grep -qF "/job:worker/task:1 (127.0.0.1:$P2)" "$TMP/err" && ! grep -qF "was lost" "$TMP/err"; then
	ok "with --retry-ms 0 a worker killed mid-job fails the job naming the task (in $((t1 - t0)) s)"
	echo "# $(grep -v '^dg: step [0-9]*/' "$TMP/err" | head -n 1)"
else
	not_ok "with --retry-ms 0 a worker killed mid-job fails the job naming the task"
fi
run submit "$EX/seed_sum.json" "${C[@]}" --retry-ms -5
check_err "a negative --retry-ms is a usage error" 1 "--retry-ms '-5' is not from 0 to 3600000"
run submit "$EX/seed_sum.json" "${C[@]}"
check_err "an unreachable task at submit time is reported by address" 10 \
	"task /job:worker/task:1 (127.0.0.1:$P2) does not answer"

# --- the rendezvous cap is a server flag, shown in the metrics -----------------
read -r p3 < <(free_ports 1)
printf '{"worker": ["127.0.0.1:%s"]}\n' "$p3" >"$TMP/one.json"
"$DG" server --cluster "$TMP/one.json" --job worker --task 0 --rendezvous-max-mb 3 \
	--port-file "$TMP/one.port" 2>"$TMP/one.log" &
pid[one]=$!
if wait_port "$TMP/one.port" >/dev/null &&
   curl -sf "http://127.0.0.1:$p3/v1/metrics" >"$TMP/metrics" &&
   grep -qx "dg_worker_rendezvous_limit_bytes 3145728" "$TMP/metrics" &&
   grep -qx "dg_worker_rendezvous_bytes 0" "$TMP/metrics"; then
	ok "--rendezvous-max-mb 3 caps the rendezvous at 3 MiB (dg_worker_rendezvous_limit_bytes)"
else
	not_ok "--rendezvous-max-mb 3 caps the rendezvous at 3 MiB (dg_worker_rendezvous_limit_bytes)"
fi
kill_wait "${pid[one]}"

# --- the servers stop cleanly (SIGTERM), without sanitizer reports -------------
if stop_clean ps w0; then ok "ps and worker/0 stop cleanly without sanitizer reports"; else
	not_ok "ps and worker/0 stop cleanly without sanitizer reports"; fi

summary
