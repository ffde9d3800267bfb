#!/usr/bin/env bash
# kill -9 of a `dg ps` with a data directory in the middle of a stream of
# 10,000 acknowledged assignments (ps_stream.py: one kept-alive connection,
# PUTs of int64 [seq, 3*seq+1] over 50 variables), then a restart on the same
# directory: every acknowledged value is there (or a later one that was sent),
# no version went backwards, the epoch increased. Processes and directories
# are cleaned up on every exit path.
# Usage: test_ps_durability.sh PATH/TO/dg   (exit 77 = skipped without python3;
# KEEP_TMP=1 keeps the logs and the data directory for a look afterwards)
set -uo pipefail

DG=${1:?usage: test_ps_durability.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
STREAM=$SRC/test/integration/ps_stream.py
COUNT=10000
NVARS=50

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_python3
ps_script_init          # TMP, PIDS and the EXIT trap that kills them

# start_ps NAME: `dg ps` on a free port with the data dir; sets PID and PORT.
start_ps() {
	start_one_ps "$1" 400 --data-dir "$TMP/data" --checkpoint-secs 1
}

acks() {
	local n
	n=$(grep -c '^A ' "$TMP/stream.log" 2>/dev/null)
	echo "${n:-0}"
}

check_cmd "dg ps starts with a data directory" start_ps first
check_cmd "the first start of a data directory is epoch 1" \
	grep -q "(epoch 1, data dir $TMP/data, 0 variables)" "$TMP/first.log"
check_cmd "the data directory it created is private (0700)" \
	test "$(stat -c %a "$TMP/data")" = 700

"$PY" "$STREAM" stream "$PORT" "$COUNT" "$NVARS" "$TMP/stream.log" 2>"$TMP/stream.err" &
STREAM_PID=$!
PIDS+=("$STREAM_PID")
# Kill at a random point of the stream, once that many writes are acknowledged.
target=$((RANDOM % (COUNT - 1000) + 500))
for i in $(seq 1 6000); do
	[[ $(acks) -ge $target ]] && break
	kill -0 "$STREAM_PID" 2>/dev/null || break
	sleep 0.01
done
kill -9 "$PID"
wait "$PID" 2>/dev/null
wait "$STREAM_PID"
stream_rc=$?
n_acked=$(acks)
echo "killed the server after $n_acked acknowledged assignments (target $target of $COUNT)"
check_cmd "the kill came in the middle of the stream" \
	test "$stream_rc" = 3 -a "$n_acked" -ge "$target" -a "$n_acked" -lt "$COUNT"

check_cmd "every file in the data directory is private (0600)" \
	bash -c "! find '$TMP/data' -type f ! -perm 600 | grep -q ."
check_cmd "dg ps restarts on the same data directory" start_ps second
check_cmd "the restart says epoch 2 and how many variables it recovered" \
	grep -q "(epoch 2, data dir $TMP/data, $NVARS variables)" "$TMP/second.log"
"$PY" "$STREAM" check "$PORT" "$TMP/stream.log" 1 >"$TMP/report"
grep -v '^[0-9]* [0-9]*$' "$TMP/report" | grep -v '^PASS' || true
read -r p f < <(tail -n 1 "$TMP/report")
passed=$((passed + ${p:-0}))
failed=$((failed + ${f:-1}))

kill -TERM "$PID"
wait "$PID"
check_cmd "SIGTERM stops the restarted server with exit status 0" test $? = 0
check_cmd "a clean stop leaves a snapshot" bash -c "ls '$TMP/data' | grep -q ."
check_cmd "no sanitizer report from the servers" \
	bash -c "! cat '$TMP/first.log' '$TMP/second.log' | grep -qE 'Sanitizer|runtime error:'"

summary
