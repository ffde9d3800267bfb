#!/usr/bin/env bash
# `dg var ls|get|put|create|rm|watch` end to end against real parameter servers on
# loopback ports: one ps, then a cluster of two ps tasks (fewest-bytes
# placement, lookup across tasks), a token-protected server of a cluster
# without a "ps" job, and bad inputs with their exit codes and messages.
# Usage: test_ps_cli.sh PATH/TO/dg   (meson passes it)
set -euo pipefail

DG=${1:?usage: test_ps_cli.sh PATH/TO/dg}
TMP=$(mktemp -d)
pids=()

wpids=()         # dg var watch runs (not servers: not in the SIGTERM check)
cleanup() {
	kill_wait "${pids[@]}" "${wpids[@]}"
	rm -rf "$TMP"
}
trap cleanup EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# check_has DESC EXPECTED_RC SUBSTRING: exit code and a substring of stdout.
check_has() {
	if [[ $rc -eq $2 ]] && grep -qF -- "$3" "$TMP/out"; then ok "$1"; else not_ok "$1"; fi
}

# start_server NAME SPEC_JSON ARGS...: starts `dg server` on port 0 (the spec
# says so), waits for its --port-file and sets PORT. Not run in $(...): the
# server's pid must reach cleanup.
start_server() {
	local name=$1 spec=$2
	shift 2
	printf '%s\n' "$spec" >"$TMP/$name.spec.json"
	"$DG" server --cluster "$TMP/$name.spec.json" --port-file "$TMP/$name.port" "$@" \
		>"$TMP/$name.log" 2>&1 &
	pids+=($!)
	if PORT=$(wait_port "$TMP/$name.port" 100 0.1); then
		return 0
	fi
	echo "server $name did not start:" >&2
	cat "$TMP/$name.log" >&2
	exit 1
}

# --- one ps ----------------------------------------------------------------------
start_server one '{"ps": ["127.0.0.1:0"]}' --job ps --task 0
P0=$PORT
printf '{"ps": ["127.0.0.1:%s"]}\n' "$P0" >"$TMP/one.json"
C=(--cluster "$TMP/one.json")

run var ls "${C[@]}"
check_out "ls of an empty server prints nothing" 0 ""

run var create w "${C[@]}" --shape 2,3 --init ones
check_has "create --init ones reports the variable and its task" 0 \
	"created w: float32 [2,3], init ones"
check_has "create names the ps task" 0 "on ps/0"

run var get w "${C[@]}"
check_out "get prints text with the dtype/shape line" 0 "$(printf '# float32 [2,3]\n1 1 1\n1 1 1')"

run var create w "${C[@]}" --shape 4
check_err "create of an existing name exits 4" 4 "variable 'w' already exists on ps/0"

run var put w "${C[@]}" --value '[[1,2,3],[4,5,6.5]]'
check_has "put --value writes a literal typed as the variable" 0 "wrote w: float32 [2,3]"
run var get w "${C[@]}"
check_out "get shows the literal" 0 "$(printf '# float32 [2,3]\n1 2 3\n4 5 6.5')"

run var put w "${C[@]}" --value '[1,2,3,4,5,6]'
run var get w "${C[@]}"
check_out "a flat literal of the same count takes the variable's shape" 0 \
	"$(printf '# float32 [2,3]\n1 2 3\n4 5 6')"

run var put w "${C[@]}" --value '["nan",inf,3,-Infinity,"inf",6]'
check_has "put --value takes nan and inf, bare or as JSON strings" 0 "wrote w: float32 [2,3]"
run var get w "${C[@]}"
check_out "get shows the non-finite values" 0 "$(printf '# float32 [2,3]\nnan inf 3\n-inf inf 6')"

run var put w "${C[@]}" --value '[1,2]'
check_err "another shape without --replace exits 5" 5 "not [2,3]"
run var put w "${C[@]}" --value '[1,2]' --replace
check_has "--replace changes the shape" 0 "float32 [2]"

run var get w "${C[@]}" --format npy -o "$TMP/w.npy"
if [[ $rc -eq 0 ]] && head -c 6 "$TMP/w.npy" | grep -q 'NUMPY'; then
	ok "get --format npy -o writes a .npy file"
else
	not_ok "get --format npy -o writes a .npy file"
fi
run var put w2 "$TMP/w.npy" "${C[@]}"
check_has "put FILE.npy creates a new variable" 0 "created w2: float32 [2]"
run var get w2 "${C[@]}"
check_out "the .npy round trip keeps the values" 0 "$(printf '# float32 [2]\n1 2')"

run var get w "${C[@]}" --format raw -o "$TMP/w.raw"
if [[ $rc -eq 0 && $(stat -c %s "$TMP/w.raw") -eq 8 ]]; then
	ok "get --format raw writes the 8 bytes of a float32 [2]"
else
	not_ok "get --format raw writes the 8 bytes of a float32 [2]"
fi
run var put w3 "$TMP/w.raw" "${C[@]}" --dtype int32 --shape 2
check_has "put of a raw file with --dtype/--shape" 0 "created w3: int32 [2]"
run var get w3 "${C[@]}"
check_out "raw bytes are reinterpreted, not converted (1.0f = 0x3f800000)" 0 \
	"$(printf '# int32 [2]\n1065353216 1073741824')"
run var put w4 "$TMP/w.raw" "${C[@]}"
check_err "a raw file for a new variable needs --dtype and --shape" 2 "give --dtype and --shape"

printf '1.5 2.5\n-3 4\n' >"$TMP/v.txt"
run var put v "$TMP/v.txt" "${C[@]}"
check_has "put of headerless text makes a 1-d float32" 0 "created v: float32 [4]"
run var get v "${C[@]}"
check_out "text round trip" 0 "$(printf '# float32 [4]\n1.5 2.5 -3 4')"
run var create m "${C[@]}" --shape 2,3 --dtype float64
printf '1 2 3 4\n5 6.25\n' >"$TMP/m.txt"
run var put m "$TMP/m.txt" "${C[@]}"
run var get m "${C[@]}"
check_out "headerless text for an existing variable takes its dtype and shape" 0 \
	"$(printf '# float64 [2,3]\n1 2 3\n4 5 6.25')"
run var rm m "${C[@]}"
printf '# float64 [3]\n0.1 0.2 0.3\n' >"$TMP/d.txt"
run var put d "$TMP/d.txt" "${C[@]}"
check_has "a text header sets dtype and shape" 0 "created d: float64 [3]"
run var get d "${C[@]}"
check_out "float64 text round-trips exactly" 0 "$(printf '# float64 [3]\n0.1 0.2 0.3')"

run var ls "${C[@]}"
check_out "ls lists names sorted" 0 "$(printf 'd\nv\nw\nw2\nw3')"
run var ls w "${C[@]}"
check_out "ls PREFIX filters" 0 "$(printf 'w\nw2\nw3')"
run var ls "${C[@]}" --long
header='^NAME +DTYPE +SHAPE +BYTES +VERSION +MTIME +TASK$'
if [[ $rc -eq 0 ]] && head -n 1 "$TMP/out" | grep -qE "$header" &&
	grep -qE '^v +float32 +\[4\] +16 +[0-9]+ +20[0-9-]+T[0-9:]+Z +ps/0$' "$TMP/out"; then
	ok "ls --long prints columns with bytes, mtime and task"
else
	not_ok "ls --long prints columns with bytes, mtime and task"
fi

version=$(grep -E '^v ' "$TMP/out" | awk '{print $5}')
run var put v "${C[@]}" --value '[0,0,0,0]' --if-version $((version + 7))
check_err "--if-version with a stale version exits 7" 7 "dg: "
run var put v "${C[@]}" --value '[0,0,0,0]' --if-version "$version"
check_has "--if-version with the current version writes" 0 "wrote v: float32 [4]"

run var get nothere "${C[@]}"
check_err "get of a missing variable exits 3" 3 "variable 'nothere' not found on ps/0"
if grep -qF 'dg: hint: list variables with: dg var ls' "$TMP/err"; then
	ok "not found comes with a hint"
else
	not_ok "not found comes with a hint"
fi
run var get 'bad/../name' "${C[@]}"
check_err "a bad name exits 2" 2 "'..'"
# a segment the mount could not show as NAME.npy (252 + 4 > 255 bytes)
long=$(printf 'a%.0s' $(seq 252))
run var create "m/$long" "${C[@]}" --shape 2
check_err "create of a 252-byte name segment exits 2" 2 "has a segment of 252 bytes; at most 251"
run var put "$long" "${C[@]}" --value '[1]'
check_err "put of a 252-byte name segment exits 2" 2 "at most 251"
run var create "m/${long:1}" "${C[@]}" --shape 2
check_has "create of a 251-byte name segment works" 0 "on ps/0"
run var rm "m/${long:1}" "${C[@]}"
check_has "and rm of it" 0 "removed m/"

# Random inits: deterministic per seed, inside their bounds.
run var create g1 "${C[@]}" --shape 2,3 --init glorot --seed 5
check_has "create --init glorot prints the seed" 0 "init glorot, seed 5"
run var create g2 "${C[@]}" --shape 2,3 --init glorot --seed 5
run var get g1 "${C[@]}"
cp "$TMP/out" "$TMP/g1"
run var get g2 "${C[@]}"
if cmp -s "$TMP/out" "$TMP/g1" && ! grep -q '^0 0 0$' "$TMP/g1"; then
	ok "the same seed gives the same glorot values"
else
	not_ok "the same seed gives the same glorot values"
fi
# limit = sqrt(6 / (2 + 3)) = 1.0954
if tail -n +2 "$TMP/g1" | tr ' ' '\n' | awk '{ if ($1 > 1.0955 || $1 < -1.0955) bad = 1 }
	END { exit bad }'; then
	ok "glorot values lie within +-sqrt(6/(fan_in+fan_out))"
else
	not_ok "glorot values lie within +-sqrt(6/(fan_in+fan_out))"
fi
run var create u "${C[@]}" --shape 1000 --init uniform --scale 0.5 --seed 1
run var get u "${C[@]}"
if tail -n +2 "$TMP/out" | tr ' ' '\n' | awk 'NF { n++; if ($1 >= 0.5 || $1 < -0.5) bad = 1;
	if ($1 < 0) neg++ } END { exit bad || n != 1000 || neg < 400 || neg > 600 }'; then
	ok "uniform --scale 0.5 draws 1000 values in [-0.5, 0.5), about half negative"
else
	not_ok "uniform --scale 0.5 draws 1000 values in [-0.5, 0.5), about half negative"
fi
run var create ui "${C[@]}" --shape 3 --dtype int32 --init normal
check_err "random inits need a float dtype (exit 6)" 6 "draws float32 or float64 values, not int32"
run var create z "${C[@]}" --shape '' --dtype int64
check_has "create of a scalar with zeros" 0 "created z: int64 []"
run var get z "${C[@]}"
check_out "the scalar reads back as 0" 0 "$(printf '# int64 []\n0')"

# rm
run var rm w2 w3 "${C[@]}"
check_out "rm removes several names" 0 "$(printf 'removed w2 from ps/0\nremoved w3 from ps/0')"
run var rm w2 d "${C[@]}"
if [[ $rc -eq 3 ]] && grep -qF "removed d from ps/0" "$TMP/out" &&
	grep -qF "variable 'w2' not found" "$TMP/err"; then
	ok "rm goes on after a missing name and exits 3"
else
	not_ok "rm goes on after a missing name and exits 3"
fi

# Binary formats are not written to a terminal (script(1) gives dg one).
if command -v script >/dev/null; then
	rc=0
	script -qec "$DG var get u --format npy ${C[*]}" /dev/null >"$TMP/out" 2>&1 || rc=$?
	if [[ $rc -eq 2 ]] && grep -qF "not writing npy bytes of variable 'u' to a terminal" \
		"$TMP/out" && grep -qF 'give -o FILE' "$TMP/out"; then
		ok "get --format npy refuses to write to a terminal (exit 2)"
	else
		not_ok "get --format npy refuses to write to a terminal (exit 2)"
	fi
else
	echo "skip - script(1) is missing: terminal refusal not tested"
fi

# --server talks to one server without a cluster file.
run var ls --server "127.0.0.1:$P0" u
check_out "--server HOST:PORT lists that server" 0 "u"
run var ls --server 127.0.0.1:1
check_err "an unreachable server exits 10" 10 "127.0.0.1:1"

# --- usage errors -----------------------------------------------------------------
run ps --durability strict
check_err "dg ps --durability strict without --data-dir is a usage error" 1 \
	"--durability strict needs --data-dir DIR"
run ps --durability always
check_err "an unknown durability is a usage error naming both" 1 \
	"unknown durability 'always' (use snapshot"
run var
check_err "dg var without a subcommand is a usage error" 1 "missing subcommand"
run var frob
check_err "an unknown subcommand is a usage error" 1 "unknown subcommand 'frob'"
run var get "${C[@]}"
check_err "get without NAME is a usage error" 1 "try 'dg var get --help'"
run var get w --seed 3 "${C[@]}"
check_err "an option of another subcommand is refused" 1 "--seed does not apply to 'dg var get'"
run var get w --format xml "${C[@]}"
check_err "an unknown format is a usage error" 1 "--format 'xml'"
run var put w "${C[@]}"
check_err "put without FILE or --value is a usage error" 1 "missing FILE or --value"
run var put w "$TMP/w.npy" --dtype float32 "${C[@]}"
check_err "--dtype with a .npy file is a usage error" 1 "carries its own dtype"
run var create q "${C[@]}"
check_err "create without --shape is a usage error" 1 "missing --shape"
run var create q --shape 2 --init fancy "${C[@]}"
check_err "an unknown init is a usage error" 1 "--init 'fancy'"
run var ls --cluster "$TMP/one.json" --server "127.0.0.1:$P0"
check_err "--cluster and --server together are a usage error" 1 "not both"
run var ls --cluster "$TMP/missing.json"
check_err "a missing cluster file exits 3" 3 "missing.json"
for sub in ls get put create rm; do
	run var "$sub" --help
	check_has "dg var $sub --help" 0 "usage: dg var $sub"
done
run var --help
check_has "dg var --help lists the subcommands" 0 "create NAME --shape S"
run help var
check_has "dg help var" 0 "usage: dg var"

# --- two ps tasks: placement by fewest bytes, lookup across tasks ------------------
SPEC2='{"ps": ["127.0.0.1:0", "127.0.0.1:0"]}'
start_server two0 "$SPEC2" --job ps --task 0
PA=$PORT
start_server two1 "$SPEC2" --job ps --task 1
PB=$PORT
printf '{"ps": ["127.0.0.1:%s", "127.0.0.1:%s"], "worker": ["127.0.0.1:1"]}\n' "$PA" "$PB" \
	>"$TMP/two.json"
C2=(--cluster "$TMP/two.json")

run var create big "${C2[@]}" --shape 1000
check_has "with two empty ps tasks the first gets the variable" 0 "on ps/0"
run var create small "${C2[@]}" --shape 10
check_has "the next variable goes to the ps with fewer bytes" 0 "on ps/1"
run var create small2 "${C2[@]}" --shape 10
check_has "and the next one too (40 < 4000 bytes)" 0 "on ps/1"
run var put new "${C2[@]}" --value '[1,2,3]'
check_has "put of a new variable follows the same rule" 0 "created new: int32 [3], version"
check_has "  ... on ps/1" 0 "on ps/1"
run var ls --server "127.0.0.1:$PB"
check_out "ps/1 holds what was placed on it" 0 "$(printf 'new\nsmall\nsmall2')"
run var ls "${C2[@]}" --long
names=$(tail -n +2 "$TMP/out" | awk '{print $1}' | tr '\n' ' ')
if [[ $rc -eq 0 ]] && grep -qE '^big .* ps/0$' "$TMP/out" &&
	grep -qE '^small .* ps/1$' "$TMP/out" && [[ $names == "big new small small2 " ]]; then
	ok "ls merges the ps tasks, sorted, with a TASK column (worker tasks are not asked)"
else
	not_ok "ls merges the ps tasks, sorted, with a TASK column (worker tasks are not asked)"
fi
run var put small "${C2[@]}" --value '[9,9,9,9,9,9,9,9,9,9]'
check_has "put of an existing name writes where it lives" 0 "wrote small: float32 [10]"
check_has "  ... on ps/1" 0 "on ps/1"
run var get big "${C2[@]}" --format raw -o "$TMP/big.raw"
if [[ $rc -eq 0 && $(stat -c %s "$TMP/big.raw") -eq 4000 ]]; then
	ok "get finds a variable on ps/0"
else
	not_ok "get finds a variable on ps/0"
fi
run var create big "${C2[@]}" --shape 3
check_err "create refuses a name held by another task" 4 "already exists on ps/0"
run var rm small2 "${C2[@]}"
check_out "rm finds the task holding the name" 0 "removed small2 from ps/1"
run var get small2 "${C2[@]}"
check_err "not found on any of the ps tasks" 3 "not found on any of the 2 ps tasks"

# --- dg var watch: the changes of both ps tasks, as they happen ----------------------
# wait_for FILE TEXT: up to 10 s for TEXT in FILE.
wait_for() {
	local i
	for ((i = 0; i < 200; i++)); do
		grep -qF -- "$2" "$1" 2>/dev/null && return 0
		sleep 0.05
	done
	return 1
}
"$DG" var watch small big --prefix n --count 3 --timeout 30 "${C2[@]}" \
	>"$TMP/watch.out" 2>"$TMP/watch.err" &
wpid=$!
wpids+=($wpid)
wait_for "$TMP/watch.err" "dg: watching 2 tasks (ps/0, ps/1)" &&
	ok "dg var watch says which tasks it watches" || not_ok "dg var watch says which tasks it watches"
"$DG" var put other "${C2[@]}" --value '[1]' >/dev/null       # not watched
"$DG" var put small "${C2[@]}" --value '[1,1,1,1,1,1,1,1,1,1]' >/dev/null
"$DG" var create nx "${C2[@]}" --shape 2 >/dev/null
"$DG" var rm big "${C2[@]}" >/dev/null
wrc=0
wait "$wpid" || wrc=$?
if [[ $wrc -eq 0 && $(wc -l <"$TMP/watch.out") -eq 3 ]] &&
	grep -qE '^20[0-9-]{8}T[0-9:.]{12}Z ps/1 small [0-9]+ put$' "$TMP/watch.out" &&
	grep -qE ' ps/[01] nx [0-9]+ put$' "$TMP/watch.out" &&
	grep -qE ' ps/0 big [0-9]+ delete$' "$TMP/watch.out" && ! grep -q other "$TMP/watch.out"; then
	ok "three lines: the put of small, the new nx (--prefix), the delete of big; exit 0"
else
	not_ok "three lines: the put of small, the new nx (--prefix), the delete of big; exit 0"
	cat "$TMP/watch.out" "$TMP/watch.err"
fi
run var watch zzz --count 1 --timeout 0.3 "${C2[@]}"
check_err "fewer lines than --count within --timeout: exit 14" 14 "0 of 1 changes in 0.3 s"
run var watch --count 0 "${C2[@]}"
check_err "--count 0 is a usage error" 1 "--count '0' is not a positive integer"
run var watch 'a b' "${C2[@]}"
check_err "a bad name is refused" 2 "variable name 'a b'"

# A watched server that restarts (kill -9, same port, its data dir): the
# watcher says changes may have been missed there, and goes on.
start_server wr '{"ps": ["127.0.0.1:0"]}' --job ps --task 0 --data-dir "$TMP/wr.data"
PW=$PORT
wr_pid=${pids[-1]}
unset 'pids[-1]'        # killed below: not in the SIGTERM check
"$DG" var watch --server "127.0.0.1:$PW" --count 1 --timeout 60 \
	>"$TMP/watch2.out" 2>"$TMP/watch2.err" &
wpid=$!
wpids+=($wpid)
wait_for "$TMP/watch2.err" "dg: watching 1 task"
exec 3>&2 2>/dev/null   # bash's "Killed" notice of the reaped server
kill -9 "$wr_pid"
wait "$wr_pid" || true
exec 2>&3 3>&-
rm -f "$TMP/wr2.port"
start_server wr2 "{\"ps\": [\"127.0.0.1:$PW\"]}" --job ps --task 0 --data-dir "$TMP/wr.data"
wait_for "$TMP/watch2.err" "answers again"
"$DG" var put after --server "127.0.0.1:$PW" --value '[2]' >/dev/null
wrc=0
wait "$wpid" || wrc=$?
if [[ $wrc -eq 0 ]] && grep -qF "restarted or its change log moved on (epoch 2)" "$TMP/watch2.err" &&
	grep -qE ' after [0-9]+ put$' "$TMP/watch2.out"; then
	ok "after a restart: changes may have been missed (epoch 2), then the new put"
else
	not_ok "after a restart: changes may have been missed (epoch 2), then the new put"
	cat "$TMP/watch2.out" "$TMP/watch2.err"
fi

# --- a token server in a cluster without a "ps" job ---------------------------------
echo "tok-$$-secret" >"$TMP/token"
chmod 600 "$TMP/token"
start_server tok '{"worker": ["127.0.0.1:0"]}' --job worker --task 0 \
	--token-file "$TMP/token"
PT=$PORT
printf '{"worker": ["127.0.0.1:%s"]}\n' "$PT" >"$TMP/tok.json"
run var create t --cluster "$TMP/tok.json" --shape 2
check_err "without the token the server refuses (exit 9)" 9 "dg: "
run var create t --cluster "$TMP/tok.json" --token-file "$TMP/token" --shape 2 --init ones
check_has "with --token-file it works, on the worker task" 0 "on worker/0"
run var get t --cluster "$TMP/tok.json" --token-file "$TMP/token"
check_out "and reads back" 0 "$(printf '# float32 [2]\n1 1')"

# --- the servers stop cleanly on SIGTERM, without sanitizer reports -------------
clean=true
for p in "${pids[@]}"; do
	kill -TERM "$p" 2>/dev/null || true
	wait "$p" || { clean=false; echo "  server pid $p exited with $?"; }
done
pids=()
if grep -lE 'Sanitizer|runtime error:' "$TMP"/*.log; then
	clean=false
fi
rc=0
: >"$TMP/out"
: >"$TMP/err"
if $clean; then ok "every server exited 0 on SIGTERM with a clean log"; else
	not_ok "every server exited 0 on SIGTERM with a clean log"; fi

summary
