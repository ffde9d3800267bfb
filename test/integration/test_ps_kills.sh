#!/usr/bin/env bash
# Ten kill -9s of a `dg ps` with a data directory while 8 clients apply
# (assign_add, which is not logged: a crash loses the applies since the last
# snapshot): after every restart each variable's version is above every
# version acknowledged before any kill (versions never go back, though values
# may), no value counts more applies than were sent, and the epoch counts the
# restarts. Then five more kills of a server with --durability strict (a new
# data directory): there every acknowledged apply is in the final value (the
# sum check). Processes and directories are cleaned up on every exit path.
# Usage: test_ps_kills.sh PATH/TO/dg   (exit 77 = skipped without python3)
set -uo pipefail

DG=${1:?usage: test_ps_kills.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
STREAM=$SRC/test/integration/ps_stream.py
KILLS=10
NVARS=4
CLIENTS=8

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_python3
ps_script_init          # TMP, PIDS and the EXIT trap that kills them

DATA=$TMP/data
DURABILITY=snapshot
start_ps() {
	start_one_ps "$1" 400 --data-dir "$DATA" --checkpoint-secs 1 --durability "$DURABILITY"
}

# kill_runs KILLS [--strict]: create the variables, then KILLS kill -9s during
# applies, each followed by a restart and the checks of ps_stream.py versions.
kill_runs() {
	local kills=$1 strict=${2:-} k n log p f
	local logs=()
	check_cmd "dg ps starts with a data directory ($DURABILITY)" start_ps "run${DURABILITY}0"
	for i in $(seq 0 $((NVARS - 1))); do
		curl -sf -X PUT -H 'Dg-Dtype: float64' -H 'Dg-Shape: []' \
			-H 'Content-Type: application/octet-stream' \
			--data-binary @<("$PY" -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<d", 0))') \
			"http://127.0.0.1:$PORT/v1/vars/a/v$i" >/dev/null ||
			echo "FAIL - creating a/v$i"
	done

	logs=()
	for k in $(seq 1 "$kills"); do
		log=$TMP/applies.$DURABILITY.$k.log
		logs+=("$log")
		"$PY" "$STREAM" applies "$PORT" "$CLIENTS" "$NVARS" "$log" &
		SPID=$!
		PIDS+=("$SPID")
		# The kill comes after the first acknowledged apply (python's clients may
		# take a while to start on a loaded machine), at most 10 s on.
		for _ in $(seq 1 200); do
			grep -q '^A ' "$log" 2>/dev/null && break
			sleep 0.05
		done
		# Kill somewhere between 0.3 and 1.5 s into the applies: across snapshots
		# (every second) and between them.
		sleep "$(printf '0.%d' $((RANDOM % 9 + 3)))"
		[[ $((RANDOM % 2)) = 1 ]] && sleep 0.6
		kill -9 "$PID"
		wait "$PID" 2>/dev/null
		wait "$SPID"
		n=$(grep -c '^A ' "$log")
		check_cmd "$DURABILITY run $k: applies were acknowledged before the kill ($n)" test "$n" -gt 0
		check_cmd "$DURABILITY run $k: dg ps restarts on the data directory" start_ps "run$DURABILITY$k"
		check_cmd "$DURABILITY run $k: the restart is epoch $((k + 1))" \
			grep -qF "(epoch $((k + 1)), data dir $DATA" "$TMP/run$DURABILITY$k.log"
		"$PY" "$STREAM" versions "$PORT" $strict "${logs[@]}" >"$TMP/report.$DURABILITY.$k"
		grep '^FAIL\|^  ' "$TMP/report.$DURABILITY.$k" | sed "s/^/$DURABILITY run $k: /"
		read -r p f < <(tail -n 1 "$TMP/report.$DURABILITY.$k")
		passed=$((passed + ${p:-0}))
		failed=$((failed + ${f:-1}))
	done
}

kill_runs "$KILLS"
# strict: a new data directory (epochs from 1), every acknowledged apply kept
kill -TERM "$PID"
wait "$PID"
DATA=$TMP/data.strict
DURABILITY=strict
kill_runs 5 --strict

kill -TERM "$PID"
wait "$PID"
check_cmd "SIGTERM stops the last server with exit status 0" test $? = 0
check_cmd "no sanitizer report from the servers" \
	bash -c "! cat '$TMP'/run*.log | grep -qE 'Sanitizer|runtime error:'"

summary
