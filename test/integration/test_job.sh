#!/usr/bin/env bash
# `dg job ls|show|cancel` end to end on a real cluster of three `dg server`
# processes on loopback (1 ps + 2 workers): a submitted job is listed and
# shown, a long job is cancelled, IDs known to two masters need --task,
# unknown IDs and usage errors fail clearly, a dead task is reported.
# Usage: test_job.sh PATH/TO/dg   (meson passes it)
set -euo pipefail

DG=${1:?usage: test_job.sh PATH/TO/dg}
HERE=$(cd "$(dirname "$0")" && pwd)
EX=${DG_SOURCE_DIR:-$HERE/../..}/examples
SHOW_BYTES=800
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cluster_script_init             # TMP, pid[], spid and the EXIT trap that stops them

# Three free loopback ports: every server needs the final spec.
start_small_cluster
C=(--cluster "$TMP/cluster.json")

# check DESC CONDITION...: ok when the command (run with eval) succeeds.
check() {
	local desc=$1
	shift
	if eval "$@"; then ok "$desc"; else not_ok "$desc"; fi
}

# --- a finished job ------------------------------------------------------------
run submit "$EX/seed_sum.json" "${C[@]}"
check_out "submit examples/seed_sum.json prints 238" 0 "238"

run job ls "${C[@]}"
check "job ls: a header, then j1 on worker/0 done with 1/1 steps and no error" \
	'[[ $rc -eq 0 && $(wc -l <"$TMP/out") -eq 2 ]] &&
	 head -n 1 "$TMP/out" | grep -qE "^ID +TASK +STATE +STEPS +ELAPSED +ERROR$" &&
	 grep -qE "^j1 +worker/0 +done +1/1 +[0-9.]+ ms +-$" "$TMP/out"'

run job ls "${C[@]}" --json
check "job ls --json: one job with task, state and steps" \
	'[[ $rc -eq 0 ]] && python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
j = d[\"jobs\"]
assert len(j) == 1, j
assert (j[0][\"id\"], j[0][\"task\"], j[0][\"state\"], j[0][\"steps_done\"]) == \
	(\"j1\", \"worker/0\", \"done\", 1), j[0]
" "$TMP/out"'

run job show j1 "${C[@]}"
check "job show j1: state done, 1/1 steps, no error, worker/0, two fragments" \
	'[[ $rc -eq 0 ]] && grep -qx "state: *done" "$TMP/out" &&
	 grep -qx "steps: *1/1" "$TMP/out" && grep -qx "error: *-" "$TMP/out" &&
	 grep -qx "task: *worker/0" "$TMP/out" && grep -qx "fragments: *2" "$TMP/out" &&
	 grep -qx "fetch: *y" "$TMP/out" &&
	 grep -qE "^  /job:worker/task:1 +127.0.0.1:$P2 +[0-9]+ nodes$" "$TMP/out"'

run job show j1 --json --master "127.0.0.1:$P1"
check "job show --json --master: the raw status with the placement" \
	'[[ $rc -eq 0 ]] && python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d[\"state\"] == \"done\" and d[\"steps\"] == 1, d
assert d[\"placement\"][\"y2\"] == \"/job:worker/task:1\", d[\"placement\"]
" "$TMP/out"'

run job show j1 "${C[@]}" --task worker/1
check_err "job show --task on a task without it exits 3" 3 "job 'j1' not found on worker/1"

# --- the same ID on two masters ------------------------------------------------
run submit "$EX/seed_sum.json" --master "127.0.0.1:$P2" --steps 2
check_out "a job submitted to worker/1 prints 238" 0 "238"
run job show j1 "${C[@]}"
check_err "j1 on both workers needs --task (exit 7)" 7 \
	"job 'j1' exists on several tasks: worker/0, worker/1"
run job show j1 "${C[@]}" --task worker/1
check "job show j1 --task worker/1 shows its 2 steps" \
	'[[ $rc -eq 0 ]] && grep -qx "steps: *2/2" "$TMP/out" && grep -qx "task: *worker/1" "$TMP/out"'
run job ls "${C[@]}"
check "job ls merges both workers" \
	'[[ $rc -eq 0 ]] && grep -qE "^j1 +worker/0 +done +1/1 " "$TMP/out" &&
	 grep -qE "^j1 +worker/1 +done +2/2 " "$TMP/out"'

# --- cancelling a long job -----------------------------------------------------
"$DG" submit "$EX/seed_sum.json" "${C[@]}" --steps 100000 >"$TMP/sub.out" 2>"$TMP/sub.err" &
spid=$!
running=0
for ((i = 0; i < 100; i++)); do
	run job ls "${C[@]}"
	if grep -qE "^j2 +worker/0 +running " "$TMP/out"; then running=1; break; fi
	sleep 0.1
done
check "job ls shows the long job j2 running" '[[ $running -eq 1 ]]'
run job cancel j2 "${C[@]}"
check_out "job cancel j2 waits for the job to stop" 0 "job j2 on worker/0: canceled"
src=0
wait "$spid" || src=$?
spid=
check "the submit of the cancelled job fails and says so" \
	'[[ $src -ne 0 ]] && grep -qi "cancel" "$TMP/sub.err"'
run job show j2 "${C[@]}"
check "job show j2: state canceled, fewer than 100000 steps, an error" \
	'[[ $rc -eq 0 ]] && grep -qx "state: *canceled" "$TMP/out" &&
	 grep -qE "^steps: *[0-9]+/100000$" "$TMP/out" && ! grep -qx "steps: *100000/100000" "$TMP/out" &&
	 grep -qE "^error: *canceled: " "$TMP/out"'
run job cancel j1 "${C[@]}" --task worker/0
check_out "cancelling a finished job says it had ended" 0 \
	"job j1 on worker/0 had already ended: done"

# --- errors and help -----------------------------------------------------------
run job show j999 "${C[@]}"
check_err "an unknown ID exits 3 with a clear message" 3 "job 'j999' not found on worker/0, worker/1"
if grep -qF "dg: hint: list the jobs with: dg job ls" "$TMP/err"; then
	ok "the unknown ID's hint names dg job ls"; else not_ok "the unknown ID's hint names dg job ls"; fi
run job cancel j999 "${C[@]}"
check_err "cancel of an unknown ID exits 3" 3 "job 'j999' not found on"
run job show j999 --master "127.0.0.1:$P1"
check_err "--master with an unknown ID exits 3" 3 "job 'j999' not found on 127.0.0.1:$P1"
run job --help
check "job --help prints the usage" \
	'[[ $rc -eq 0 ]] && grep -qF "usage: dg job ls|show|cancel" "$TMP/out"'
run job show --help
check "job show --help prints the usage" '[[ $rc -eq 0 ]] && grep -qF -- "--task J/I" "$TMP/out"'
run help job
check "dg help job prints the usage" '[[ $rc -eq 0 ]] && grep -qF "usage: dg job" "$TMP/out"'
run job
check_err "no subcommand is a usage error" 1 "missing subcommand"
run job frob
check_err "an unknown subcommand is a usage error" 1 "unknown subcommand 'frob'"
run job show "${C[@]}"
check_err "show without an ID is a usage error" 1 "missing the job ID"
run job show j1 "${C[@]}" --task worker
check_err "a malformed --task is a usage error" 1 "--task 'worker': use JOB/INDEX"
run job ls "${C[@]}" --bogus
check_err "an unknown option is a usage error" 1 "try 'dg job ls --help'"
run job show j1 --task worker/7 "${C[@]}"
check_err "--task naming a missing task fails" 3 "worker"

# --- a task that does not answer ----------------------------------------------
kill_wait "${pid[w1]}"
unset 'pid[w1]'
run job ls "${C[@]}"
check "job ls still lists worker/0's jobs and exits 10 naming worker/1" \
	'[[ $rc -eq 10 ]] && grep -qE "^j2 +worker/0 +canceled " "$TMP/out" &&
	 grep -qF "dg: worker/1: " "$TMP/err"'

# --- the servers stop cleanly (SIGTERM), without sanitizer reports -------------
check "ps and worker/0 stop cleanly without sanitizer reports" 'stop_clean ps w0'

summary
