# shellcheck shell=bash
# Shared helpers of the integration scripts, sourced (never run) with
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# after the script has set DG (the dg binary) and TMP (its temp dir). Gives the
# counters (passed, failed, rc), run/ok/not_ok/check_out/check_err, the final
# summary line, free loopback ports and the wait for a server's --port-file.
# SHOW_BYTES (default 600) caps the stdout/stderr shown by a failure.

passed=0
failed=0
rc=0

# run ARGS...: run dg, keeping stdout, stderr and the exit code (rc) without
# tripping set -e. Sanitizer builds: any report is a failure of its own.
run() {
	rc=0
	"$DG" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
	if grep -qE 'Sanitizer|runtime error:' "$TMP/err"; then
		not_ok "dg $* ran without sanitizer reports"
	fi
}

# ok DESC: count and report a passed check.
ok() {
	passed=$((passed + 1))
	echo "ok - $1"
}

# not_ok DESC: count and report a failed check with the last run's output.
not_ok() {
	failed=$((failed + 1))
	echo "FAIL - $1"
	echo "  exit code: $rc"
	echo "  stdout: $(head -c "${SHOW_BYTES:-600}" "$TMP/out")"
	echo "  stderr: $(head -c "${SHOW_BYTES:-600}" "$TMP/err")"
}

# check_out DESC EXPECTED_RC EXPECTED_STDOUT: exit code and exact stdout.
check_out() {
	if [[ $rc -eq $2 && "$(cat "$TMP/out")" == "$3" ]]; then ok "$1"; else not_ok "$1"; fi
}

# check_err DESC EXPECTED_RC SUBSTRING: exit code, "dg: " prefix, substring of
# stderr, nothing on stdout.
check_err() {
	if [[ $rc -eq $2 ]] && head -n 1 "$TMP/err" | grep -q '^dg: ' &&
		grep -qF -- "$3" "$TMP/err" && [[ ! -s "$TMP/out" ]]; then
		ok "$1"
	else
		not_ok "$1"
	fi
}

# summary: the final "N passed, M failed" line; its status is the script's.
summary() {
	echo "$passed passed, $failed failed"
	[[ $failed -eq 0 ]]
}

# free_ports N: N free loopback ports on one line (bound and released: a tiny
# race, acceptable here; for servers that need the final spec before start).
free_ports() {
	python3 -c '
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])' "$1"
}

# wait_port FILE [TRIES] [SLEEP]: wait until a server wrote its --port-file
# (default 100 tries of 0.05 s); prints the port, fails when none came.
wait_port() {
	local i
	for ((i = 0; i < ${2:-100}; i++)); do
		[[ -s $1 ]] && break
		sleep "${3:-0.05}"
	done
	[[ -s $1 ]] && cat "$1"
}

# kill_wait PID...: stop our processes (SIGTERM) and reap them; never fails.
kill_wait() {
	local p
	for p in "$@"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
}

# start_small_cluster: 1 ps + 2 workers of "$DG server" on free loopback ports,
# spec in $TMP/cluster.json, logs in $TMP/{ps,w0,w1}.log. The caller declares
# `declare -A pid=()` (filled here: pid[ps], pid[w0], pid[w1]) and kills them
# in its trap. Exits the script with "0 passed, 1 failed" if one does not start.
start_small_cluster() {
	local p0 p1 p2 name
	read -r p0 p1 p2 < <(free_ports 3)
	printf '{"ps": ["127.0.0.1:%s"], "worker": ["127.0.0.1:%s", "127.0.0.1:%s"]}\n' \
		"$p0" "$p1" "$p2" >"$TMP/cluster.json"
	_start_server ps ps 0
	_start_server w0 worker 0
	_start_server w1 worker 1
	for name in ps w0 w1; do
		if ! wait_port "$TMP/$name.port" >/dev/null; then
			echo "server $name did not start:"; cat "$TMP/$name.log"
			echo "0 passed, 1 failed"; exit 1
		fi
	done
	# The caller reads the ports (messages name addresses).
	# shellcheck disable=SC2034
	P0=$p0 P1=$p1 P2=$p2
}

_start_server() {   # NAME JOB TASK; pid is the caller's associative array
	"$DG" server --cluster "$TMP/cluster.json" --job "$2" --task "$3" \
		--port-file "$TMP/$1.port" 2>"$TMP/$1.log" &
	# shellcheck disable=SC2034
	pid[$1]=$!
}
