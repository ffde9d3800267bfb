#!/usr/bin/env bash
# `dg up`, `dg status` and `dg down` end to end: a local cluster of real
# servers on loopback ports picked by dg up, used through the recorded spec
# (no --cluster), a refused second up, a killed task seen by status and
# started again by dg up --restart, a clean
# down (no process left), an idempotent down, data and a higher epoch after
# a second up, a failed start that leaves nothing running. HOME and
# XDG_RUNTIME_DIR point into a temp dir: the user's own files are never touched.
# Usage: test_up.sh PATH/TO/dg   (meson passes it)
set -uo pipefail

DG=${1:?usage: test_up.sh PATH/TO/dg}
TMP=$(mktemp -d)
export HOME=$TMP/home XDG_RUNTIME_DIR=$TMP/run
unset DG_CLUSTER TF_CONFIG
mkdir -p "$HOME" "$XDG_RUNTIME_DIR"
C=$TMP/c

# Every process whose command line names DIR (default: our temp dir) is one we
# started (the servers get --data-dir $TMP/...): killed on any exit.
our_pids() {
	local f p dir=${1:-$TMP/} line
	for f in /proc/[0-9]*/cmdline; do
		p=${f#/proc/}
		p=${p%/cmdline}
		[[ $p == "$$" || $p == "$BASHPID" ]] && continue
		line=$(tr '\0' ' ' 2>/dev/null <"$f") || continue
		[[ $line == *"$dir"* ]] && echo "$p"
	done
}
cleanup() {
	local p
	mountpoint -q "$TMP/mnt" 2>/dev/null && fusermount3 -u "$TMP/mnt"
	for p in $(our_pids); do
		kill -9 "$p" 2>/dev/null
	done
	[[ -n ${KEEP_TMP:-} ]] && echo "kept $TMP" || rm -rf "$TMP"
}
trap cleanup EXIT

SHOW_BYTES=800
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# check DESC COMMAND...: passes when the command succeeds.
check() {
	local what=$1
	shift
	if "$@"; then ok "$what"; else not_ok "$what"; fi
}
out_has() { grep -qF -- "$1" "$TMP/out"; }
err_has() { grep -qF -- "$1" "$TMP/err"; }
# A pid that runs and is not a zombie.
# The stat file is read once: a zombie reaped between two reads is gone, not
# alive (a second read that fails must not count as "not a zombie").
alive() {
	local s
	s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	s=${s##*) }
	[[ -n $s && ${s:0:1} != Z && ${s:0:1} != X ]]
}
# none_alive PID...: no pid runs; a survivor's stat line goes to stderr.
none_alive() {
	local p
	for p in "$@"; do
		alive "$p" && { cat "/proc/$p/stat" >&2; return 1; }
	done
	return 0
}
# Column COL of the status table row of task TASK (BYTES takes two: "0 B").
col() { awk -v t="$1" -v c="$2" '$1 == t { print $c }' "$TMP/out"; }

# --- up -------------------------------------------------------------------------
# Without the supervisor: the killed task below stays down for dg up --restart.
# Strict durability: every task gets it, a restarted one too.
run up --dir "$C" --no-supervise --durability strict
check "dg up starts 1 ps and 2 workers" test $rc = 0
check "dg up lists every task with its address" \
	bash -c "grep -qE '^  ps/0 +127\.0\.0\.1:[0-9]+' '$TMP/out' &&
		 grep -qE '^  worker/1 +127\.0\.0\.1:[0-9]+' '$TMP/out'"
check "dg up says how to go on" \
	bash -c "grep -qF 'dg status' '$TMP/out' && grep -qF 'dg down' '$TMP/out'"
check "the spec has one ps and two worker addresses" python3 -c "
import json, sys
c = json.load(open('$C/cluster.json'))
sys.exit(not (len(c['ps']) == 1 and len(c['worker']) == 2 and
              all(a.startswith('127.0.0.1:') for a in c['ps'] + c['worker'])))"
check "the spec is linked where dg commands look for it" \
	test "$(readlink "$XDG_RUNTIME_DIR/dg/cluster.json")" = "$C/cluster.json"
check "nothing written under HOME while XDG_RUNTIME_DIR is set" test ! -e "$HOME/.dg"
pids=()
for t in ps-0 worker-0 worker-1; do
	pids+=("$(cat "$C/$t.pid" 2>/dev/null)")
done
check "each task has a live pid and a log" \
	bash -c "for p in ${pids[*]}; do [[ -r /proc/\$p/stat ]] || exit 1; done;
		 test -s '$C/ps-0.log' -a -s '$C/worker-1.log'"

run status
check "dg status exits 0 with every task reachable" test $rc = 0
check "dg status shows 3 tasks, all up" \
	test "$(col ps/0 3) $(col worker/0 3) $(col worker/1 3)" = "yes yes yes"
check "the first start is epoch 1" test "$(col ps/0 4)" = 1

# --- the recorded cluster serves the var commands (no --cluster) ------------------
run var create w --shape 2,3 --init ones
check "dg var create through the recorded cluster" \
	bash -c "test $rc = 0 && grep -qF 'created w: float32 [2,3], init ones' '$TMP/out'"
run var get w
check "dg var get reads it back" \
	test "$(cat "$TMP/out")" = "$(printf '# float32 [2,3]\n1 1 1\n1 1 1')"
run status --json
check "dg status --json counts the variable and every task" python3 -c "
import json, sys
s = json.load(open('$TMP/out'))
t = {x['task']: x for x in s['tasks']}
sys.exit(not (s['reachable'] == 3 and s['total'] == 3 and t['ps/0']['health']['vars'] == 1
              and t['ps/0']['health']['bytes'] == 24 and t['worker/1']['reachable']
              and all(x['health']['durability'] == 'strict' for x in s['tasks'])))"

# --- a graph through the recorded cluster, when this dg has `submit` ------------------
SRC=${DG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
if "$DG" help submit >/dev/null 2>&1 && [[ -f $SRC/examples/seed_sum.json ]]; then
	run submit "$SRC/examples/seed_sum.json"
	check "dg submit of the seed program on the dg up cluster prints 238" \
		test "$rc $(cat "$TMP/out")" = "0 238"
	run status
	check "dg status lists the finished job" \
		bash -c "test $rc = 0 && grep -qE '^  j[0-9]+ +done' '$TMP/out'"
fi

# --- a second up on a running DIR is refused -----------------------------------
run up --dir "$C"
check "dg up on a running cluster exits 4 and says how to stop it" \
	bash -c "test $rc = 4 && grep -qF 'already running in $C' '$TMP/err' &&
		 grep -qF 'dg down --dir $C' '$TMP/err'"
check "the refused up left the running servers alone" \
	bash -c "for p in ${pids[*]}; do [[ -r /proc/\$p/stat ]] || exit 1; done"

# --- bad arguments ----------------------------------------------------------------
run up --ps 0 --dir "$TMP/other"
check "dg up --ps 0 is a usage error" bash -c "test $rc = 1 && grep -qF -- '--ps' '$TMP/err'"
run up --durability always --dir "$TMP/other"
check "dg up --durability always is a usage error naming both modes" \
	bash -c "test $rc = 1 && grep -qF \"unknown durability 'always'\" '$TMP/err' &&
		 grep -qF strict '$TMP/err'"
# Every dg has the mount (fuse3 is a required dependency of the build).
"$DG" help mount >/dev/null 2>&1 && test_mount=1

# --- a killed task --------------------------------------------------------------
kill -9 "${pids[2]}"
for _ in $(seq 1 100); do
	alive "${pids[2]}" || break
	sleep 0.05
done
run status
check "dg status exits 10 when a task is down" test $rc = 10
check "dg status names the unreachable task" \
	bash -c "grep -qF 'worker/1' '$TMP/err' && test '$(col worker/1 3)' = no &&
		 test '$(col ps/0 3)' = yes"

# --- dg up --restart: the one task that died, as dg up started it ------------------
run up --restart worker/1
check "dg up --restart worker/1 starts it again at its address" \
	bash -c "test $rc = 0 && grep -qF 'restarted worker/1 (pid' '$TMP/out'"
pids+=("$(cut -d' ' -f1 "$C/worker-1.pid")")
run status
check "dg status then shows every task up again, worker/1 in epoch 2" \
	bash -c "test $rc = 0 && test '$(col worker/1 3)' = yes && test '$(col worker/1 4)' = 2"
check "the restarted worker/1 has the cluster's durability (strict)" \
	bash -c "tr '\\0' ' ' <'/proc/$(cut -d' ' -f1 "$C/worker-1.pid")/cmdline' |
		 grep -qF -- '--durability strict'"
run up --restart worker/1
check "dg up --restart of a running task exits 4 and says so" \
	bash -c "test $rc = 4 && grep -qF 'worker/1 is running (pid' '$TMP/err'"
run up --restart worker/9
check "dg up --restart of a task the cluster lacks names the tasks it has" \
	bash -c "test $rc = 3 && grep -qF \"no task 'worker/9' (tasks: ps/0, worker/0, worker/1)\" '$TMP/err'"
run up --restart ps/0 --workers 3
check "dg up --restart with other options is a usage error" \
	bash -c "test $rc = 1 && grep -qF -- '--restart takes only --dir' '$TMP/err'"

# --- down -------------------------------------------------------------------------
run down
check "dg down (no --dir: the last dg up) stops the live tasks" \
	bash -c "test $rc = 0 && grep -qF 'stopped 3 tasks of $C' '$TMP/out'"
# Gone: no /proc entry, or dead but not reaped (Z, X), as dg down decides; a
# survivor's state is printed.
check "no server of the cluster is left" none_alive "${pids[@]}"
check "dg down removed the pid and port files and the link" \
	bash -c "! ls '$C'/*.pid '$C'/*.port >/dev/null 2>&1 &&
		 test ! -e '$XDG_RUNTIME_DIR/dg/cluster.json' &&
		 test ! -L '$XDG_RUNTIME_DIR/dg/cluster.json'"
check "dg down kept the data dirs and logs" test -d "$C/ps-0" -a -s "$C/ps-0.log"
check "the servers stopped without sanitizer reports" \
	bash -c "! cat '$C'/*.log | grep -qE 'Sanitizer|runtime error:'"
run down --dir "$C"
check "dg down again is fine and says nothing runs" \
	bash -c "test $rc = 0 && grep -qF 'no cluster running in $C' '$TMP/out'"
run status
check "dg status without a cluster says how to start one" \
	bash -c "test $rc = 3 && grep -qF 'dg up' '$TMP/err'"

# --- the data survives a second up on the same DIR --------------------------------
run up --dir "$C"
check "dg up again on the same DIR" test $rc = 0
run status
check "the second start is epoch 2 on every task (3 on worker/1, restarted once)" \
	test "$rc $(col ps/0 4) $(col worker/0 4) $(col worker/1 4) $(col ps/0 5)" = "0 2 2 3 1"
run var get w
check "the variable survived down and up" \
	test "$(cat "$TMP/out")" = "$(printf '# float32 [2,3]\n1 1 1\n1 1 1')"

# --- a second cluster in the default DIR becomes the last dg up ------------------
run up --ps 2 --workers 1
check "dg up without --dir uses \$XDG_RUNTIME_DIR/dg/cluster" \
	bash -c "test $rc = 0 && test -s '$XDG_RUNTIME_DIR/dg/cluster/ps-1.pid'"
run status
check "dg status now shows the newer cluster: ps/0, ps/1, worker/0" \
	test "$rc $(col ps/1 3) $(col worker/0 3) $(col worker/1 3)" = "0 yes yes "
run down
check "dg down stops the last one" \
	bash -c "test $rc = 0 &&
		 grep -qF 'stopped 3 tasks of $XDG_RUNTIME_DIR/dg/cluster' '$TMP/out'"
run down --dir "$C"
check "dg down --dir stops the first one" \
	bash -c "test $rc = 0 && grep -qF 'stopped 3 tasks of $C' '$TMP/out'"

# --- --mount: the variables as files while the cluster runs; down unmounts --------
if [[ -n ${test_mount:-} && -e /dev/fuse ]] && command -v fusermount3 >/dev/null; then
	mkdir -p "$TMP/mnt"
	run up --dir "$TMP/m" --mount "$TMP/mnt"
	if [[ $rc -ne 0 ]] && grep -qi fuse "$TMP/m/mount.log" 2>/dev/null; then
		echo "ok - # skip: FUSE is not usable here: $(tail -n 1 "$TMP/m/mount.log")"
		"$DG" down --dir "$TMP/m" >/dev/null 2>&1
	else
		check "dg up --mount mounts the variables" \
			bash -c "test $rc = 0 && mountpoint -q '$TMP/mnt' &&
				 grep -qF 'variables mounted at $TMP/mnt' '$TMP/out'"
		mpid=$(cat "$TMP/m/mount.pid" 2>/dev/null)
		run var create v --shape 3 --init ones
		check "a variable created through the cluster is a file of the mount" \
			test "$(cat "$TMP/mnt/text/v" 2>/dev/null)" = \
			"$(printf '# float32 [3]\n1 1 1')"
		run down
		mgone=no
		[[ -n $mpid ]] && ! alive "$mpid" && mgone=yes
		check "dg down unmounts and the mount process exits" \
			bash -c "test $rc = 0 && grep -qF 'unmounted $TMP/mnt' '$TMP/out' &&
				 ! mountpoint -q '$TMP/mnt' && test $mgone = yes &&
				 test ! -e '$TMP/m/mount.pid'"
		check "the mount logged no sanitizer report" \
			bash -c "! grep -qE 'Sanitizer|runtime error:' '$TMP/m/mount.log'"
	fi
fi

# --- --token-file: every task wants the token; status says so ------------------------
echo "tok-$RANDOM$RANDOM" >"$TMP/token"
chmod 600 "$TMP/token"
run up --dir "$TMP/t" --token-file "$TMP/token" --ps 2 --workers 0
check "dg up --token-file waits for tasks that need a token" test $rc = 0
check "--workers 0 leaves the worker job out of the spec" \
	python3 -c "import json, sys; sys.exit(set(json.load(open('$TMP/t/cluster.json'))) != {'ps'})"
run status --token-file "$TMP/token"
check "dg status --token-file reaches every task" \
	test "$rc $(col ps/0 3) $(col ps/1 3)" = "0 yes yes"
run status
check "dg status without the token exits 9 and says to pass it" \
	bash -c "test $rc = 9 && grep -qF -- '--token-file' '$TMP/err' &&
		 test '$(col ps/0 3)' = 401"
run down
check "dg down stops the token cluster" \
	bash -c "test $rc = 0 && grep -qF 'stopped 2 tasks of $TMP/t' '$TMP/out'"

# --- the supervisor: a task that dies is started again --------------------------
S=$TMP/s
# wait_new FILE OLD: until FILE names a live pid other than OLD (5 s at most).
wait_new() {
	local p
	for _ in $(seq 1 100); do
		p=$(cat "$1" 2>/dev/null)
		[[ -n $p && $p != "$2" ]] && alive "$p" && return 0
		sleep 0.05
	done
	return 1
}
run up --dir "$S" --workers 1
check "dg up starts a supervisor (DIR/supervisor.pid)" \
	bash -c "test $rc = 0 && test -s '$S/supervisor.pid'"
sup=$(cat "$S/supervisor.pid")
old=$(cat "$S/ps-0.pid")
kill -9 "$old"
wait_new "$S/ps-0.pid" "$old"
for _ in $(seq 1 100); do "$DG" status >/dev/null 2>&1 && break; sleep 0.05; done
run status
check "the supervisor restarted the killed ps/0: up, epoch 2, 1 restart" \
	test "$rc $(col ps/0 3) $(col ps/0 4) $(col ps/0 10) $(col worker/0 10)" = "0 yes 2 1 0"
check "dg status says how it last exited" \
	out_has "ps/0: restarted 1 time by dg up; last exit: signal 9 (Killed)"
check "the exit and the restart are logged by the supervisor and in the task's log" \
	bash -c "grep -qF 'ps/0 (pid $old) exited with signal 9 (Killed); restarting it' \
		 '$S/supervisor.log' && grep -qF 'restarted ps/0 (pid' '$S/ps-0.log'"
# Five more deaths within the minute: the supervisor gives up on it.
for _ in 1 2 3 4 5; do
	old=$(cat "$S/ps-0.pid" 2>/dev/null)
	[[ -n $old ]] && kill -9 "$old"
	wait_new "$S/ps-0.pid" "$old"
done
sleep 0.3
run status
check "after 6 exits within a minute ps/0 stays down, said so, pid file gone" \
	bash -c "test $rc = 10 && test '$(col ps/0 3)' = no && test ! -e '$S/ps-0.pid' &&
		 grep -qF 'given up' '$TMP/out' &&
		 grep -qF '6 times within a minute; not restarting it' '$S/supervisor.log'"
run up --restart ps/0 --dir "$S"
check "dg up --restart asks the supervisor, which starts it again" \
	bash -c "test $rc = 0 && grep -qF 'through the supervisor (pid $sup)' '$TMP/out'"
run status
check "then ps/0 is up again" test "$rc $(col ps/0 3)" = "0 yes"
w=$(cat "$S/worker-0.pid")
kill -TERM "$w"
for _ in $(seq 1 100); do alive "$w" || break; sleep 0.05; done
sleep 0.3
run status
check "a task that exits cleanly (SIGTERM) is not restarted" \
	bash -c "test $rc = 10 && test '$(col worker/0 3)' = no &&
		 grep -qF 'exited cleanly, not restarted' '$TMP/out'"
run down --dir "$S"
sup_left=no
alive "$sup" && sup_left=yes
check "dg down stops the supervisor first, then the tasks" \
	bash -c "test $rc = 0 && test $sup_left = no && test ! -e '$S/supervisor.pid' &&
		 test -z '$(our_pids "$S/")'"

# --- --foreground: ^C takes the cluster down ---------------------------------------
"$DG" up --dir "$TMP/fg" --workers 1 --foreground >"$TMP/fg.out" 2>"$TMP/fg.err" &
fg_pid=$!
for _ in $(seq 1 200); do
	grep -qF 'in the foreground' "$TMP/fg.out" 2>/dev/null && break
	sleep 0.05
done
fg_tasks=$(cat "$TMP/fg"/*.pid 2>/dev/null | tr '\n' ' ')
run status
check "dg up --foreground serves until interrupted" test "$rc $(col worker/0 3)" = "0 yes"
kill -INT "$fg_pid"
fg_rc=0
wait "$fg_pid" || fg_rc=$?
fg_left=
for p in $fg_tasks; do alive "$p" && fg_left+="$p "; done
check "^C stops a foreground dg up with exit 0 and no task left" \
	bash -c "test $fg_rc = 0 -a -n '$fg_tasks' -a -z '$fg_left' &&
		 grep -qF 'stopped 2 tasks of $TMP/fg' '$TMP/fg.out' &&
		 ! ls '$TMP/fg'/*.pid 2>/dev/null"

# --- a task that cannot start: reported with its log, nothing left running ----------
mkdir -p "$TMP/bad"
echo "not a directory" >"$TMP/bad/worker-0"      # worker/0's data dir
run up --dir "$TMP/bad"
check "dg up names the task that failed and its log" \
	bash -c "test $rc = 10 && grep -qF 'worker/0 exited' '$TMP/err' &&
		 grep -qF '$TMP/bad/worker-0.log' '$TMP/err'"
sleep 0.2
left=$(our_pids "$TMP/bad/")
check "a failed dg up stops the tasks it started" \
	bash -c "! ls '$TMP/bad'/*.pid >/dev/null 2>&1 && test -z '$left'"
check "a failed dg up does not link its spec" test ! -e "$XDG_RUNTIME_DIR/dg/cluster.json"

left=$(our_pids)
check "no process of the test is left" test -z "$left"
summary
