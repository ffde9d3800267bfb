# shellcheck shell=bash
# Shared helpers of the integration scripts, sourced (never run) with
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# after the script has set DG (the dg binary) and TMP (its temp dir). Gives the
# counters (passed, failed, rc), run/ok/not_ok/check_out/check_err, the final
# summary line, free loopback ports, the wait for a server's --port-file and
# the start (and EXIT-trap stop) of a lone `dg ps` or of a small cluster.
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

# check_cmd DESC COMMAND...: run the command; count the check, print it only
# when it fails (the quiet style of the scripts that drive a server with curl).
check_cmd() {
	local what=$1
	shift
	if "$@"; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		echo "FAIL - $what"
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

# ps_script_init: the set-up of scripts that start lone servers with
# need_python3: PY = Debian's python3 (else the first on PATH); exits 77
# (skipped) when there is none.
need_python3() {
	PY=/usr/bin/python3
	[[ -x $PY ]] || PY=$(command -v python3 || true)
	if [[ -z $PY ]]; then
		echo "skipped: python3 not found"
		exit 77
	fi
}

# start_one_ps: a new temp dir in TMP, the PIDS array and the EXIT trap that
# SIGKILLs them all and removes TMP (kept, its path printed, with KEEP_TMP=1).
ps_script_init() {
	TMP=$(mktemp -d)
	PIDS=()
	trap ps_cleanup EXIT
}

# ps_kill_all: kill -9 and reap every process in PIDS.
ps_kill_all() {
	local p
	for p in "${PIDS[@]}"; do
		kill -9 "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
}

ps_cleanup() {
	ps_kill_all
	if [[ -n ${KEEP_TMP:-} ]]; then echo "kept $TMP"; else rm -rf "$TMP"; fi
}

# start_one_ps NAME TRIES [ARGS...]: `$DG ps` alone on a free loopback port
# (spec $TMP/cluster.json, log $TMP/NAME.log) with ARGS; sets PID and PORT,
# appends PID to the caller's PIDS array. Fails when no port file came after
# TRIES waits of 0.05 s.
start_one_ps() {
	local name=$1 tries=$2
	shift 2
	echo '{"ps": ["127.0.0.1:0"]}' >"$TMP/cluster.json"
	rm -f "$TMP/$name.port"
	"$DG" ps --cluster "$TMP/cluster.json" --port-file "$TMP/$name.port" "$@" \
		2>"$TMP/$name.log" &
	PID=$!
	PIDS+=("$PID")
	# The caller reads PORT.
	# shellcheck disable=SC2034
	PORT=$(wait_port "$TMP/$name.port" "$tries")
}

# cluster_script_init: the set-up of scripts that use start_small_cluster: a
# new temp dir in TMP, the pid[] array it fills, spid (a server the script
# starts itself, empty for none) and the EXIT trap that stops them all and
# removes TMP (cluster_cleanup).
cluster_script_init() {
	TMP=$(mktemp -d)
	declare -gA pid=()
	spid=
	trap cluster_cleanup EXIT
}

cluster_cleanup() {
	[[ -n ${spid:-} ]] && kill_wait "$spid"
	kill_wait "${pid[@]}"
	rm -rf "$TMP"
}

# stop_clean NAME...: SIGTERM the servers pid[NAME] and reap them (each leaves
# pid[]); fails when one exits non-zero or its $TMP/NAME.log has a sanitizer
# report, whose start is shown.
stop_clean() {
	local name clean=0
	for name in "$@"; do
		kill "${pid[$name]}" 2>/dev/null || true
		wait "${pid[$name]}" 2>/dev/null || clean=1
		unset "pid[$name]"
		if grep -qE 'Sanitizer|runtime error:' "$TMP/$name.log"; then
			clean=1
			head -c 2000 "$TMP/$name.log"
		fi
	done
	return "$clean"
}

# start_small_cluster: 1 ps + 2 workers of "$DG server" on free loopback ports,
# spec in $TMP/cluster.json, logs in $TMP/{ps,w0,w1}.log. The caller declares
# `declare -A pid=()` (filled here: pid[ps], pid[w0], pid[w1]) and kills them
# in its trap (cluster_script_init does both). Exits the script with
# "0 passed, 1 failed" if one does not start.
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
	# SERVER_EXTRA (an array, may be unset): more options of every server
	"$DG" server --cluster "$TMP/cluster.json" --job "$2" --task "$3" \
		--port-file "$TMP/$1.port" ${SERVER_EXTRA[@]+"${SERVER_EXTRA[@]}"} \
		2>"$TMP/$1.log" &
	# shellcheck disable=SC2034
	pid[$1]=$!
}
