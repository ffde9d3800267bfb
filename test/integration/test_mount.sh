#!/usr/bin/env bash
# `dg mount` end to end (issue 4): a real `dg ps` on a loopback port, the cluster
# mounted in a temporary directory, driven with the shell tools a user would
# use (ls, od, cat, dd, cp, sed -i, getfattr, rm), numpy, concurrent writers and
# readers (mount_tool.py), streaming writes of large values, direct-I/O reads
# that can still be mapped (and the page-cache fallback), 10,000 variables,
# one request per read-only open and a variable that moved to another ps,
# jobs/ of a cluster of dg servers, a stopped and a restarted ps.
# Usage: test_mount.sh PATH/TO/dg   (exit 77 = skipped: no /dev/fuse or fusermount3)
set -uo pipefail

DG=${1:?usage: test_mount.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
HERE=$SRC/test/integration
TOOL=$HERE/mount_tool.py

if ! [[ -c /dev/fuse ]] || ! command -v fusermount3 >/dev/null; then
	echo "skipped: /dev/fuse or fusermount3 is missing (apt-get install fuse3)"
	exit 77
fi
if [[ -x /usr/bin/python3 ]]; then PY=/usr/bin/python3; else PY=$(command -v python3 || true); fi
if [[ -z $PY ]]; then
	echo "skipped: python3 is missing (the helpers of this test need it)"
	exit 77
fi
if ! "$DG" mount --help >/dev/null 2>&1; then
	echo "skipped: this dg has no 'dg mount' (built without fuse3?)"
	exit 77
fi
HAVE_NUMPY=false
if "$PY" -c 'import numpy' 2>/dev/null; then HAVE_NUMPY=true; fi

TMP=$(mktemp -d)
pids=()                 # servers
declare -A mpid         # mountpoint -> pid of its `dg mount -f`

cleanup() {
	local m p
	for m in "${!mpid[@]}"; do
		fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true
	done
	for m in "${!mpid[@]}"; do
		kill "${mpid[$m]}" 2>/dev/null || true
		wait "${mpid[$m]}" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		kill -CONT "$p" 2>/dev/null || true
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	# never rm -rf through a live mount: it would delete the variables behind it
	for m in "${!mpid[@]}"; do
		if mountpoint -q "$m"; then
			echo "cleanup: $m is still mounted; leaving $TMP" >&2
			return
		fi
	done
	rm -rf "$TMP"
}
trap cleanup EXIT

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
: >"$TMP/out"
: >"$TMP/err"

check() {     # check DESC CONDITION-RESULT(0/1)
	if [[ $2 -eq 0 ]]; then ok "$1"; else not_ok "$1"; fi
}

# sh CMD: run a shell command line (in the mount, with a time limit so that a
# hang fails the test instead of blocking it), keeping rc, stdout and stderr.
sh() {
	rc=0
	(cd "$M" && timeout -k 5 60 bash -c "$1") >"$TMP/out" 2>"$TMP/err" || rc=$?
}

# dgr ARGS: run dg against the main ps.
dgr() {
	rc=0
	"$DG" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# start_ps NAME PORT ARGS...: start `dg ps` on PORT (0: pick one) and wait for
# its --port-file; sets PORT and PS_PID. Not run in $(...): the pid must reach
# cleanup.
start_ps() {
	local name=$1 port=$2
	shift 2
	rm -f "$TMP/$name.port"
	printf '{"ps": ["127.0.0.1:%s"]}\n' "$port" >"$TMP/$name.spec.json"
	"$DG" ps --cluster "$TMP/$name.spec.json" --port-file "$TMP/$name.port" "$@" \
		>>"$TMP/$name.log" 2>&1 &
	PS_PID=$!
	pids+=("$PS_PID")
	if PORT=$(wait_port "$TMP/$name.port" 150 0.1); then
		return 0
	fi
	echo "ps $name did not start:" >&2
	cat "$TMP/$name.log" >&2
	exit 1
}

# mount_dg MOUNTPOINT CLUSTER ARGS...: `dg mount -f` in the background; waits
# until the mount is there. Returns 1 (after printing the log) when it is not.
mount_dg() {
	local mnt=$1 cluster=$2 log
	shift 2
	mkdir -p "$mnt"
	log="$TMP/mount.$(basename "$mnt").log"
	"$DG" mount "$mnt" --cluster "$cluster" -f "$@" >>"$log" 2>&1 &
	mpid[$mnt]=$!
	for _ in $(seq 1 100); do
		if mountpoint -q "$mnt"; then
			return 0
		fi
		if ! kill -0 "${mpid[$mnt]}" 2>/dev/null; then
			break
		fi
		sleep 0.1
	done
	echo "dg mount $mnt did not come up:" >&2
	cat "$log" >&2
	return 1
}

# unmount_dg MOUNTPOINT: fusermount3 -u, then the process must exit 0 within 10 s.
unmount_dg() {
	local mnt=$1 p=${mpid[$1]} st=0
	fusermount3 -u "$mnt" || return 1
	for _ in $(seq 1 100); do
		kill -0 "$p" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$p" 2>/dev/null; then
		echo "  dg mount (pid $p) still runs 10 s after fusermount3 -u" >&2
		return 1
	fi
	wait "$p" || st=$?
	unset "mpid[$mnt]"
	return $st
}

# snap NAME: remember a variable's raw bytes and version (from the ps, not the
# mount); unchanged NAME: 0 when both are still the same.
fetch() {   # fetch NAME FILE: raw bytes to FILE.bin, headers to FILE.hdr
	curl -s -o "$2.bin" -D "$2.hdr" "http://127.0.0.1:$PA/v1/vars/$1"
}
version_in() { tr -d '\r' <"$1.hdr" | awk -F': ' 'tolower($1) == "dg-version" { print $2 }'; }
snap() { fetch "$1" "$TMP/snap.$1"; }
unchanged() {
	fetch "$1" "$TMP/now.$1"
	cmp -s "$TMP/snap.$1.bin" "$TMP/now.$1.bin" &&
		[[ $(version_in "$TMP/snap.$1") == "$(version_in "$TMP/now.$1")" ]]
}
version_of() { fetch "$1" "$TMP/v.$1" && version_in "$TMP/v.$1"; }
# commits: successful PUT + PATCH requests the ps has answered (versions are one
# counter per ps, so a variable's version may jump by more than one per write)
commits() {
	curl -s "http://127.0.0.1:$PA/v1/metrics" | awk '/^dg_http_requests_total/ &&
		/vars\/\{name/ && /method="(PUT|PATCH)"/ && /code="20[01]"/ { n += $NF }
		END { print n + 0 }'
}
# wait_visible NAME: a variable made outside the mount shows up within the list
# cache time (--attr-timeout, 1 s by default); 0 when vars/NAME exists within 3 s.
wait_visible() {
	for _ in $(seq 1 30); do
		[[ -e $M/vars/$1 ]] && return 0
		sleep 0.1
	done
	return 1
}

# bad_write DESC VAR CMD ERRTEXT: CMD fails, its stderr shows ERRTEXT, VAR keeps
# its bytes and version.
bad_write() {
	snap "$2"
	sh "$3"
	if [[ $rc -ne 0 ]] && grep -qiF -- "$4" "$TMP/err" && unchanged "$2"; then
		ok "$1"
	else
		if ! unchanged "$2"; then echo "  the variable changed"; fi
		not_ok "$1"
	fi
}

# --- the ps and the mount ----------------------------------------------------------
mkdir -p "$TMP/data"
start_ps a 0 --data-dir "$TMP/data"
PA=$PORT
PA_PID=$PS_PID
printf '{"ps": ["127.0.0.1:%s"]}\n' "$PA" >"$TMP/cluster.json"
C=(--cluster "$TMP/cluster.json")

# w1: float32 [4,8], element i = i/2
{
	echo '# float32 [4,8]'
	for r in 0 1 2 3; do
		for c in 0 1 2 3 4 5 6 7; do
			printf '%s ' "$(awk -v i=$((r * 8 + c)) 'BEGIN { print i / 2 }')"
		done
		echo
	done
} | sed 's/ $//' >"$TMP/w1.txt"
dgr var put w1 "$TMP/w1.txt" "${C[@]}"
dgr var create layer1/w "${C[@]}" --shape 3 --init ones
"$PY" "$TOOL" raw "$TMP/patch.bin" 3f 100 101 102
"$PY" "$TOOL" raw "$TMP/short.bin" 2f 1 2
"$PY" "$TOOL" raw "$TMP/long.bin" 33f $(seq 1 33)
"$PY" "$TOOL" raw "$TMP/full.bin" 32f $(seq 0 -1 -31)
"$PY" "$TOOL" raw "$TMP/full2.bin" 32f $(seq 200 231)
"$PY" "$TOOL" npy "$TMP/w2.npy" f8 3,2 1.5 2.5 3.5 4.5 5.5 6.5
"$PY" "$TOOL" npy "$TMP/w3.npy" f4 4 7 8 9 10

M=$TMP/mnt
if ! mount_dg "$M" "$TMP/cluster.json" --timeout 2; then
	rc=1
	not_ok "dg mount -f comes up"
	echo "$passed passed, $failed failed"
	exit 1
fi
ok "dg mount -f mounts the cluster"

# --- browsing -------------------------------------------------------------------
sh 'ls'
check "the root lists cluster, events, vars, text, npy, queues, jobs, rows" \
	"$([[ $(tr '\n' ' ' <"$TMP/out") == "cluster events jobs npy queues rows text vars " ]]; echo $?)"

sh 'ls -l vars'
check "ls -l vars: w1 is a 128-byte file (nbytes of float32 [4,8]), layer1 a directory" \
	"$(grep -qE '^-.* 128 .* w1$' "$TMP/out" && grep -qE '^d.* layer1$' "$TMP/out"; echo $?)"
sh 'stat -c %s vars/layer1/w'
check "a name with '/' is a path: vars/layer1/w has 12 bytes" \
	"$([[ $rc -eq 0 && $(cat "$TMP/out") == 12 ]]; echo $?)"

sh 'od -A d -t f4 vars/w1 | head'
check "od -A d -t f4 vars/w1 | head shows the first values" \
	"$([[ $rc -eq 0 && $(head -n 1 "$TMP/out" | tr -s ' ') == '0000000 0 0.5 1 1.5' &&
		$(wc -l <"$TMP/out") -eq 9 ]]; echo $?)"
sh 'od -A n -v -t f4 vars/w1'
want=$(seq 0 31 | awk '{ print $1 / 2 }' | tr '\n' ' ')
check "od reads all 32 values of vars/w1" \
	"$([[ $(tr -s ' \n' '  ' <"$TMP/out" | sed 's/^ //') == "$want" ]]; echo $?)"

dgr var get w1 "${C[@]}"
cp "$TMP/out" "$TMP/w1.get"
sh 'cat text/w1'
check "cat text/w1 prints the text encoding (as dg var get)" \
	"$([[ $rc -eq 0 && $(cat "$TMP/out") == "$(cat "$TMP/w1.get")" &&
		$(head -n 1 "$TMP/out") == '# float32 [4,8]' ]]; echo $?)"
sh 'echo $(stat -c %s text/w1) $(cat text/w1 | wc -c) \
	$(stat -c %s npy/w1.npy) $(cat npy/w1.npy | wc -c)'
check "text/ and npy/ report their true sizes in stat" \
	"$(read -r a b c d <"$TMP/out"
		[[ $rc -eq 0 && $a == "$b" && $c == "$d" && $c -gt 128 ]]; echo $?)"

# rows/NAME/LIST: some rows of a variable as text, without its whole value
sh 'cat rows/w1/3,0-1'
check "cat rows/w1/3,0-1 prints rows 3, 0 and 1 of w1 as text" \
	"$([[ $rc -eq 0 && $(head -n 1 "$TMP/out") == '# float32 [3,8]' &&
		$(sed -n 2p "$TMP/out") == "$(sed -n 5p "$TMP/w1.get")" &&
		$(sed -n 3p "$TMP/out") == "$(sed -n 2p "$TMP/w1.get")" ]]; echo $?)"
sh 'stat -c %F rows rows/w1 rows/layer1 rows/w1/2; cat rows/layer1/w/0'
check "rows/, rows/w1 and rows/layer1 are directories, rows/w1/2 a file; names with '/' work" \
	"$([[ $rc -eq 0 && $(head -n 3 "$TMP/out" | sort -u) == directory &&
		$(sed -n 4p "$TMP/out") == 'regular empty file' &&
		$(sed -n 5p "$TMP/out") == '# float32 [1]' ]]; echo $?)"
sh 'cat rows/w1/4'
check "a row out of range is EINVAL" \
	"$([[ $rc -ne 0 ]] && grep -q 'Invalid argument' "$TMP/err"; echo $?)"
sh 'cat rows/nope/1 || true; echo x > rows/w1/0'
check "rows of a missing variable are ENOENT; rows/ is read-only" \
	"$([[ $rc -ne 0 ]] && grep -q 'No such file' "$TMP/err" &&
		grep -qE 'Operation not permitted|Read-only' "$TMP/err"; echo $?)"

sh 'getfattr -d vars/w1'
v=$(version_of w1)
check "getfattr -d vars/w1 shows user.dg.dtype, shape, version, task" \
	"$(grep -qx 'user.dg.dtype="float32"' "$TMP/out" &&
		grep -qE '^user.dg.shape="\[?4,8\]?"$' "$TMP/out" &&
		grep -qx "user.dg.version=\"$v\"" "$TMP/out" &&
		grep -qE '^user.dg.task=".*(ps/0|127.0.0.1).*"$' "$TMP/out"; echo $?)"
t0=$(now)
sh 'getfattr -n user.dg.nope vars/w1'
t=$(elapsed "$t0")
check "an unknown xattr answers ENODATA (No such attribute) in ${t}s" \
	"$([[ $rc -ne 0 ]] && grep -qF 'No such attribute' "$TMP/err" &&
		awk -v t="$t" 'BEGIN { exit !(t < 2) }'; echo $?)"

sh 'cat cluster'
check "cat cluster shows the ps address" "$(grep -qF "127.0.0.1:$PA" "$TMP/out"; echo $?)"
curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
	"http://127.0.0.1:$PA/v1/queues/q" \
	-d '{"capacity":10,"components":[{"dtype":"float32","shape":[2]}]}'
sh 'cat queues/q'
check "cat queues/q shows the queue's state" \
	"$([[ $rc -eq 0 ]] && grep -q 'capacity' "$TMP/out" && grep -qw '10' "$TMP/out"; echo $?)"

# --- dd conv=notrunc into part of a tensor ---------------------------------------
n0=$(commits)
sh 'dd if="'"$TMP"'/patch.bin" of=vars/w1 bs=4 seek=10 conv=notrunc status=none'
fetch w1 "$TMP/after"
"$PY" - "$TMP/after.bin" >"$TMP/vals" <<'EOF'
import struct, sys
d = open(sys.argv[1], "rb").read()
print(" ".join("%g" % v for v in struct.unpack("<%df" % (len(d) // 4), d)))
EOF
want=$(seq 0 31 | awk '{ v = $1 / 2; if ($1 >= 10 && $1 <= 12) v = $1 + 90; printf "%s ", v }' |
	sed 's/ $//')
check "dd bs=4 seek=10 conv=notrunc changes elements 10-12 and nothing else" \
	"$([[ $rc -eq 0 && $(cat "$TMP/vals") == "$want" ]]; echo $?)"
n1=$(commits)
check "  ... in one commit (PUT/PATCH requests: $((n1 - n0)))" \
	"$([[ $n1 -eq $((n0 + 1)) ]]; echo $?)"
sh 'od -A n -t f4 -j 36 -N 20 vars/w1'
check "  ... and a read through the mount sees the new values" \
	"$([[ $(tr -s ' \n' '  ' <"$TMP/out" | sed 's/^ //;s/ $//') == '4.5 100 101 102 6.5' ]]
		echo $?)"

# --- 16-bit floats --------------------------------------------------------------------
dgr var create h16 "${C[@]}" --shape 3 --dtype float16 --init ones
dgr var create b16 "${C[@]}" --shape 3 --dtype bfloat16 --init ones
wait_visible h16 && wait_visible b16
sh 'stat -c %s vars/h16 vars/b16; od -A n -t x2 vars/h16 vars/b16; cat text/b16'
check "float16 and bfloat16 variables are 2 bytes per element, raw and in text" \
	"$([[ $rc -eq 0 && $(tr -s ' \n' '  ' <"$TMP/out") == \
		"6 6 3c00 3c00 3c00 3f80 3f80 3f80 # bfloat16 [3] 1 1 1 " ]]; echo $?)"
sh "ls npy; $PY -c 'import numpy as np; a = np.load(\"npy/h16.npy\"); print(a.dtype, a.tolist())'"
check "npy/ has h16.npy (numpy float16) and no b16.npy (numpy has no bfloat16)" \
	"$([[ $rc -eq 0 ]] && grep -qx h16.npy "$TMP/out" && ! grep -q b16 "$TMP/out" &&
		grep -qx 'float16 \[1.0, 1.0, 1.0\]' "$TMP/out"; echo $?)"
sh 'test -e npy/b16.npy'
check "  ... and npy/b16.npy does not exist" "$([[ $rc -ne 0 ]]; echo $?)"
dgr var rm h16 "${C[@]}"
dgr var rm b16 "${C[@]}"

# --- cp of a .npy creates, and replaces ----------------------------------------------
sh 'cp "'"$TMP"'/w2.npy" npy/'
dgr var get w2 "${C[@]}"
W2_TEXT=$(printf '# float64 [3,2]\n1.5 2.5\n3.5 4.5\n5.5 6.5')
check "cp w2.npy npy/ creates w2 (float64 [3,2])" \
	"$([[ $rc -eq 0 && $(cat "$TMP/out") == "$W2_TEXT" ]]; echo $?)"
sh 'ls vars; stat -c %s vars/w2'
check "  ... and vars/w2 appears with 48 bytes" \
	"$(grep -qx w2 "$TMP/out" && [[ $(tail -n 1 "$TMP/out") == 48 ]]; echo $?)"
sh 'cp "'"$TMP"'/w3.npy" npy/w2.npy'
dgr var get w2 "${C[@]}"
check "cp of another .npy over npy/w2.npy replaces it (float32 [4])" \
	"$([[ $rc -eq 0 && $(cat "$TMP/out") == "$(printf '# float32 [4]\n7 8 9 10')" ]]; echo $?)"

# --- numpy -----------------------------------------------------------------------
if $HAVE_NUMPY; then
	sh "$PY -c 'import numpy as np; print(np.load(\"$M/npy/w1.npy\"))'"
	check "python3 -c 'import numpy as np; print(np.load(\"npy/w1.npy\"))' prints it" \
		"$([[ $rc -eq 0 ]] && grep -qF '0.5' "$TMP/out" &&
			grep -qF '102.' "$TMP/out"; echo $?)"
	sh "$PY -c '
import numpy as np
e = np.arange(32, dtype=np.float32).reshape(4, 8) / 2
e.flat[10:13] = [100, 101, 102]
a = np.load(\"$M/npy/w1.npy\")
assert a.dtype == np.float32 and a.shape == (4, 8) and (a == e).all(), a
b = np.fromfile(\"$M/vars/w1\", dtype=\"<f4\")
assert b.shape == (32,) and (b == e.ravel()).all(), b
np.save(\"$TMP/w4.npy\", np.linspace(0, 1, 5))
print(\"same\")'"
	check "np.load(npy/w1.npy) and np.fromfile(vars/w1) give the variable's values" \
		"$([[ $rc -eq 0 && $(cat "$TMP/out") == same ]]; echo $?)"
	sh "cp $TMP/w4.npy npy/w4.npy &&
		$PY -c 'import numpy as np; print(np.load(\"npy/w4.npy\").tolist())'"
	check "a .npy saved by numpy copies in and loads back" \
		"$([[ $rc -eq 0 && $(cat "$TMP/out") == '[0.0, 0.25, 0.5, 0.75, 1.0]' ]]; echo $?)"
else
	echo "skip - numpy checks: /usr/bin/python3 has no numpy (apt-get install python3-numpy)"
fi

# --- bad writes: each fails with a clear error and changes nothing -----------------
bad_write "a write of the wrong total size (8 of 128 bytes) fails at close" w1 \
	'cat "'"$TMP"'/short.bin" > vars/w1' "Invalid argument"
bad_write "cp of a file of the wrong size fails" w1 \
	'cp "'"$TMP"'/short.bin" vars/w1' "Invalid argument"
bad_write "a write longer than the tensor (132 bytes) fails at write()" w1 \
	'cat "'"$TMP"'/long.bin" > vars/w1' "Invalid argument"
bad_write "dd past the end (one 12-byte write at 120) fails" w1 \
	'dd if="'"$TMP"'/patch.bin" of=vars/w1 bs=12 seek=10 conv=notrunc status=none' \
	"Invalid argument"
bad_write "dd whose last element is past the end (bs=4 seek=30) changes nothing" w1 \
	'dd if="'"$TMP"'/patch.bin" of=vars/w1 bs=4 seek=30 conv=notrunc status=none' \
	"Invalid argument"
bad_write "half an element (2 bytes at 40) fails at close" w1 \
	'dd if="'"$TMP"'/patch.bin" of=vars/w1 bs=1 seek=40 count=2 conv=notrunc status=none' \
	"Invalid argument"
printf '1 2 3\n' >"$TMP/three.txt"
bad_write "text with the wrong count (3 of 32 numbers) fails" w1 \
	'cat "'"$TMP"'/three.txt" > text/w1' "Invalid argument"
{ seq 1 31; echo 'x1'; } | tr '\n' ' ' >"$TMP/badnum.txt"
bad_write "text with a bad number fails" w1 \
	'cat "'"$TMP"'/badnum.txt" > text/w1' "Invalid argument"
bad_write "an append (>>) fails with ENOTSUP" w1 'cat "'"$TMP"'/patch.bin" >> vars/w1' \
	"Operation not supported"
bad_write "truncate to another size fails with EINVAL" w1 'truncate -s 64 vars/w1' \
	"Invalid argument"
bad_write "a file that is not a .npy copied into npy/w1.npy fails with EINVAL" w1 \
	'cp "'"$TMP"'/full.bin" npy/w1.npy' "Invalid argument"
printf '# float32 [32]\n%s\n' "$(seq 1 32 | tr '\n' ' ')" >"$TMP/othershape.txt"
bad_write "text whose header names another shape fails with EINVAL" w1 \
	'cat "'"$TMP"'/othershape.txt" > text/w1' "Invalid argument"
bad_write "a new file in vars/ (raw bytes carry no dtype) fails with EPERM" w1 \
	'cp "'"$TMP"'/full.bin" vars/w1new' "Operation not permitted"
# a name segment of 252 bytes: its npy/NAME.npy (256 bytes) could not exist
long=$(printf 'a%.0s' $(seq 252))
printf '# float32 [1]\n7\n' >"$TMP/one.txt"
bad_write "a 252-byte name segment in text/ fails with EINVAL" w1 \
	"cp $TMP/one.txt text/$long" "Invalid argument"
bad_write "and as a directory in npy/ (mkdir) fails with EINVAL" w1 \
	"mkdir npy/$long" "Invalid argument"
sh "cp $TMP/one.txt text/${long:4} && cat npy/${long:4}.npy >/dev/null && cat text/${long:4}"
check "a 248-byte one works in text/ and npy/ (NAME.npy is 252 bytes)" \
	"$([[ $rc -eq 0 && $(tail -n 1 "$TMP/out") == 7 ]]; echo $?)"
dgr var rm "${long:4}" "${C[@]}"

# A shell redirection dup2s and closes the new file's first descriptor before
# it writes: that close must not create the variable empty.
sh "printf '7 8 9\\n' > text/shellnew && cat text/shellnew"
check "printf > text/NEW creates the variable from the text (float64 [3] 7 8 9)" \
	"$([[ $rc -eq 0 && $(head -n 1 "$TMP/out") == '# float64 [3]' &&
	      $(tail -n 1 "$TMP/out") == '7 8 9' ]]; echo $?)"
dgr var rm shellnew "${C[@]}"

# --- streaming writes of odd chunk sizes -------------------------------------------------
n0=$(commits)
sh "$PY $TOOL produce $TMP/full.bin 7 13 5 1 | cat > vars/w1"
fetch w1 "$TMP/after"
check "producer | cat > vars/w1 in chunks of 7, 13, 5, 1 bytes writes the tensor" \
	"$([[ $rc -eq 0 ]] && cmp -s "$TMP/after.bin" "$TMP/full.bin"; echo $?)"
n1=$(commits)
check "  ... in one commit (PUT/PATCH requests: $((n1 - n0)))" \
	"$([[ $n1 -eq $((n0 + 1)) ]]; echo $?)"
dgr var create big "${C[@]}" --shape 100000
wait_visible big
check "a variable made with dg var create appears in the mount within 3 s" $?
head -c 400000 /dev/urandom >"$TMP/big.bin"
sh "$PY $TOOL produce $TMP/big.bin 4093 65537 333 | cat > vars/big"
fetch big "$TMP/after"
check "a 400 KB tensor streamed in odd chunks (4093, 65537, 333) arrives whole" \
	"$([[ $rc -eq 0 ]] && cmp -s "$TMP/after.bin" "$TMP/big.bin"; echo $?)"
head -c 800000 /dev/urandom >"$TMP/big2.bin"
bad_write "cat of 800 KB into a 400 KB tensor fails and commits none of the chunks that fit" \
	big 'cat "'"$TMP"'/big2.bin" > vars/big' "Invalid argument"

# --- large values: the PUT streams while the writes arrive --------------------------------
# (8 MiB: above the size where a replacing writer's PUT starts at its first write)
dgr var create huge "${C[@]}" --shape 2097152
wait_visible huge
head -c 8388608 /dev/urandom >"$TMP/huge.bin"
head -c 8388608 /dev/urandom >"$TMP/huge2.bin"
n0=$(commits)
sh 'cat "'"$TMP"'/huge.bin" > vars/huge'
fetch huge "$TMP/after"
n1=$(commits)
check "cat of 8 MiB into vars/huge: the value arrives whole, in one PUT ($((n1 - n0)))" \
	"$([[ $rc -eq 0 && $n1 -eq $((n0 + 1)) ]] && cmp -s "$TMP/after.bin" "$TMP/huge.bin"; echo $?)"
sh "$PY $TOOL produce $TMP/huge2.bin 4093 65537 333 | cat > vars/huge"
fetch huge "$TMP/after"
check "8 MiB streamed in odd chunks (4093, 65537, 333) arrives whole" \
	"$([[ $rc -eq 0 ]] && cmp -s "$TMP/after.bin" "$TMP/huge2.bin"; echo $?)"
# payloads received in place (fs/devio.c): every pattern of replacing writes
# of large values, each checked over HTTP, on a mount that logs how many
# bytes of each commit were received in place
dgr var create huge_b "${C[@]}" --shape 2097152
wait_visible huge_b
ML=$TMP/mnt_land
if DG_LOG=debug mount_dg "$ML" "$TMP/cluster.json" --timeout 20; then
	sh "$PY $TOOL landing 127.0.0.1:$PA $ML huge huge_b"
	for pat in aligned unaligned interleaved rewrite reverse skip threads processes; do
		check "writes received in place, pattern $pat: the values arrive whole" \
			"$([[ $rc -eq 0 ]] && grep -qx "$pat ok" "$TMP/out"; echo $?)"
	done
	[[ $rc -eq 0 ]] || cat "$TMP/out" "$TMP/err"
	# a sequential writer lands all but its first few writes (the second
	# turns landings on, the third sets the first one, threads that were
	# already waiting take one each: up to libfuse's 10 workers, more when
	# a woken reader loses its request to another and waits again): of 64
	# writes of 1 MiB, at least 32
	head -c 67108864 /dev/urandom >"$TMP/land64.bin"
	dgr var create huge_c "${C[@]}" --shape 16777216
	wait_visible huge_c
	sh 'dd if="'"$TMP"'/land64.bin" of="'"$ML"'/vars/huge_c" bs=1M status=none'
	fetch huge_c "$TMP/after"
	landed=$(sed -n 's/.*vars\/huge_c: committed; \([0-9]*\) of its.*/\1/p' \
		"$TMP/mount.mnt_land.log" | tail -1)
	check "dd of 64 MiB in 1 MiB writes: the value arrives whole, ${landed:-0} bytes received in place (>= 32 MiB)" \
		"$([[ $rc -eq 0 && ${landed:-0} -ge 33554432 ]] && cmp -s "$TMP/after.bin" "$TMP/land64.bin"; echo $?)"
	dgr var rm huge_c "${C[@]}" >/dev/null
	unmount_dg "$ML"
	check "fusermount3 -u of the mount that received writes in place: its process exits 0" $?
else
	not_ok "dg mount with DG_LOG=debug comes up"
fi
# a new version put over HTTP: the mount's next read of it is cold and
# streams the body (raw and .npy) straight into the handle's buffer
curl -s -o /dev/null -X PUT -H 'Content-Type: application/octet-stream' \
	--data-binary @"$TMP/huge.bin" "http://127.0.0.1:$PA/v1/vars/huge"
sh 'cmp vars/huge "'"$TMP"'/huge.bin" && '"$PY"' -c "import numpy as np, sys
a = np.load(\"npy/huge.npy\")
sys.exit(0 if a.dtype == np.float32 and a.shape == (2097152,) and
	a.tobytes() == open(sys.argv[1], \"rb\").read() else 1)" "'"$TMP"'/huge.bin"'
check "a cold 8 MiB read streams the new version: vars/huge and npy/huge.npy are its bytes" "$rc"
n0=$(commits)
bad_write "6 MB of an 8 MiB tensor: EINVAL at close, the started PUT changes nothing" \
	huge 'head -c 6000000 "'"$TMP"'/huge.bin" > vars/huge' "Invalid argument"
check "  ... and the ps applied no PUT" "$([[ $(commits) -eq $n0 ]]; echo $?)"
# every byte written, not closed yet: the ps has not applied it (the body's
# last byte goes at close), then close commits it
sh "$PY"' -c "import http.client, os, sys, time
a = open(sys.argv[1], \"rb\").read()
def version():
	c = http.client.HTTPConnection(\"127.0.0.1\", int(sys.argv[2]))
	c.request(\"HEAD\", \"/v1/vars/huge\")
	return c.getresponse().getheader(\"Dg-Version\")
v0 = version()
fd = os.open(\"vars/huge\", os.O_WRONLY | os.O_TRUNC)
n = 0
while n < len(a):
	n += os.write(fd, a[n:])
time.sleep(0.5)
v1 = version()
os.close(fd)
v2 = version()
print(v0 == v1, v2 != v1, open(\"vars/huge\", \"rb\").read() == a)" '"$TMP/huge.bin $PA"
check "a streaming write is applied at close, not when its last byte is written" \
	"$([[ $rc -eq 0 && $(cat "$TMP/out") == "True True True" ]]; echo $?)"
# a writer that pauses longer than --timeout (2 s) halfway: the stream gives up
# waiting for it (it would hold the ps's connection), and close commits the
# staged bytes with one PUT
n0=$(commits)
sh "$PY"' -c "import os, sys, time
a = open(sys.argv[1], \"rb\").read()
fd = os.open(\"vars/huge\", os.O_WRONLY | os.O_TRUNC)
os.write(fd, a[:len(a) // 2])
time.sleep(3.5)
os.write(fd, a[len(a) // 2:])
os.close(fd)
print(open(\"vars/huge\", \"rb\").read() == a)" '"$TMP/huge2.bin"
n1=$(commits)
check "a streaming writer that pauses past --timeout still commits its value, in one PUT" \
	"$([[ $rc -eq 0 && $(cat "$TMP/out") == True && $n1 -eq $((n0 + 1)) ]]; echo $?)"
# pwrite order and rewrites: the second half first; then all of it, then 4 KiB
# at 0 again (bytes the stream may have sent: it gives way to one PUT at close)
sh "$PY"' -c "import os, sys
a, b = open(sys.argv[1], \"rb\").read(), open(sys.argv[2], \"rb\").read()
h = len(a) // 2
fd = os.open(\"vars/huge\", os.O_WRONLY | os.O_TRUNC)
os.pwrite(fd, a[h:], h); os.pwrite(fd, a[:h], 0); os.close(fd)
ok1 = open(\"vars/huge\", \"rb\").read() == a
fd = os.open(\"vars/huge\", os.O_WRONLY | os.O_TRUNC)
os.pwrite(fd, b, 0); os.pwrite(fd, a[:4096], 0); os.close(fd)
ok2 = open(\"vars/huge\", \"rb\").read() == a[:4096] + b[4096:]
print(ok1, ok2)" '"$TMP/huge.bin $TMP/huge2.bin"
fetch huge "$TMP/after"
check "out of order writes (second half first) and a rewrite of offset 0 commit what was written" \
	"$([[ $rc -eq 0 && $(cat "$TMP/out") == "True True" ]] &&
		cmp -s <(head -c 4096 "$TMP/huge.bin"; tail -c +4097 "$TMP/huge2.bin") \
		"$TMP/after.bin"; echo $?)"
# another update while the stream runs (over HTTP from the same process: a
# fork would close the descriptor in the child, which commits): the commit is
# refused (ESTALE) and the other value stays
sh "$PY"' -c "import errno, http.client, os, sys
a, b = open(sys.argv[1], \"rb\").read(), open(sys.argv[2], \"rb\").read()
fd = os.open(\"vars/huge\", os.O_WRONLY | os.O_TRUNC)
os.write(fd, a[:len(a) // 2])
c = http.client.HTTPConnection(\"127.0.0.1\", int(sys.argv[3]))
c.request(\"PUT\", \"/v1/vars/huge\", b, {\"Dg-Dtype\": \"float32\", \"Dg-Shape\": \"2097152\"})
assert c.getresponse().status in (200, 201, 204)
os.write(fd, a[len(a) // 2:])
try:
	os.close(fd)
	print(\"closed\")
except OSError as e:
	print(errno.errorcode[e.errno])" '"$TMP/huge.bin $TMP/huge2.bin $PA"
fetch huge "$TMP/after"
check "an update by another client during a streaming write: ESTALE at close, its value stays" \
	"$([[ $(cat "$TMP/out") == ESTALE ]] && cmp -s "$TMP/after.bin" "$TMP/huge2.bin"; echo $?)"
# large .npy copies into npy/ of an existing variable: its own shape (the
# buffer sized for it at once), a smaller one, and a larger one of another
# dtype (the buffer grows past that size)
if $HAVE_NUMPY; then
	dgr var create npybig "${C[@]}" --shape 2097152
	wait_visible npybig
	sh "$PY"' -c "import numpy as np, shutil, sys, urllib.request
rng = np.random.default_rng(7)
res = []
for dt, n in ((np.float32, 2097152), (np.float32, 786432), (np.float64, 1572864)):
	a = rng.standard_normal(n).astype(dt)
	np.save(sys.argv[1], a)
	shutil.copyfile(sys.argv[1], \"npy/npybig.npy\")
	r = urllib.request.urlopen(\"http://127.0.0.1:%s/v1/vars/npybig\" % sys.argv[2])
	res.append(r.headers[\"Dg-Dtype\"] == np.dtype(dt).name and r.read() == a.tobytes())
print(*res)" '"$TMP/big.npy $PA"
	check "cp of 8, 3 and 12 MiB .npy files over npy/npybig.npy: each value arrives whole" \
		"$([[ $rc -eq 0 && $(cat "$TMP/out") == "True True True" ]]; echo $?)"
	[[ $rc -eq 0 ]] || cat "$TMP/out" "$TMP/err"
	dgr var rm npybig "${C[@]}" >/dev/null
fi

# --- rename over a variable (sed -i, mv) -----------------------------------------------------
dgr var ls "${C[@]}"
cp "$TMP/out" "$TMP/names.before"
sh "sed -i '2s/^[^ ]*/42/' text/w1"
dgr var get w1 "${C[@]}"
check "sed -i on text/w1 replaces the variable (element 0 = 42)" \
	"$([[ $(sed -n 2p "$TMP/out" | awk '{ print $1, $2 }') == '42 -1' ]]; echo $?)"
dgr var ls "${C[@]}"
check "  ... and leaves no temporary variable behind" \
	"$(cmp -s "$TMP/out" "$TMP/names.before"; echo $?)"
sh 'cp "'"$TMP"'/w2.npy" npy/tmpw.npy && mv npy/tmpw.npy npy/w2.npy'
dgr var get w2 "${C[@]}"
check "mv npy/tmpw.npy npy/w2.npy replaces w2" \
	"$([[ $(cat "$TMP/out") == "$W2_TEXT" ]]; echo $?)"
dgr var get tmpw "${C[@]}"
check "  ... and tmpw is gone" "$([[ $rc -eq 3 ]]; echo $?)"

# --- mkdir ---------------------------------------------------------------------------
sh 'mkdir vars/pre && test -d vars/pre && ls vars'
check "mkdir vars/pre makes a directory" "$([[ $rc -eq 0 ]] && grep -qx pre "$TMP/out"; echo $?)"
dgr var create pre/x "${C[@]}" --shape 2
wait_visible pre/x
sh 'stat -c %s vars/pre/x'
check "  ... that holds variables named pre/..." "$([[ $(cat "$TMP/out") == 8 ]]; echo $?)"
sh 'mkdir vars/empty && rmdir vars/empty && ! test -e vars/empty'
check "rmdir of an empty prefix directory" "$([[ $rc -eq 0 ]]; echo $?)"

# --- concurrent writers and readers -----------------------------------------------------------
dgr var create c "${C[@]}" --shape 65536
dgr var create r "${C[@]}" --shape 65536
wait_visible c && wait_visible r
sh "$PY $TOOL writers $M/vars/c 8 10 65536"
echo "  writers: $(head -n 1 "$TMP/out")"
check "8 concurrent writers of whole tensors never leave a torn tensor" "$rc"
sh "$PY $TOOL updates 127.0.0.1:$PA r 200 $M/vars/r $M/npy/r.npy $M/vars/r"
sed 's/^/  /' "$TMP/out"
check "readers during 200 updates always see one whole version, never an older one" "$rc"

# A reader that relies on the kernel's pages of the version it opened (a
# repeated read), whose pages are dropped (POSIX_FADV_DONTNEED here, memory
# pressure in life) after the variable changed: it still reads that whole
# version (the mount keeps the bytes behind the pages), and a new open the new one.
sh "$PY"' -c "import http.client, os, sys
a, b = open(sys.argv[1], \"rb\").read(), open(sys.argv[2], \"rb\").read()
def put(v):
	c = http.client.HTTPConnection(\"127.0.0.1\", int(sys.argv[3]))
	c.request(\"PUT\", \"/v1/vars/huge\", v, {\"Dg-Dtype\": \"float32\", \"Dg-Shape\": \"2097152\"})
	assert c.getresponse().status in (200, 201, 204)
put(a)
assert open(\"vars/huge\", \"rb\").read() == a
fd = os.open(\"vars/huge\", os.O_RDONLY)
first = os.pread(fd, 4096, 0)
put(b)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
rest = b\"\"
while True:
	chunk = os.pread(fd, 1 << 20, 4096 + len(rest))
	if not chunk:
		break
	rest += chunk
os.close(fd)
print(first + rest == a, open(\"vars/huge\", \"rb\").read() == b)" '"$TMP/huge.bin $TMP/huge2.bin $PA"
check "a repeated reader whose pages were dropped after an update still reads its whole version" \
	"$([[ $rc -eq 0 && $(cat "$TMP/out") == "True True" ]]; echo $?)"

# --- direct I/O reads, mapped (doc/filesystem.md "Reading") -----------------------------
# Linux >= 6.6 maps direct-I/O opens when the mount asks for it (the mount's own
# INIT reply); then cold reads bypass the page cache and mmap still works.
kv=$(uname -r | awk -F. '{ printf "%d", $1 * 1000 + $2 }')
mlog="$TMP/mount.$(basename "$M").log"
if ((kv >= 6006)); then DIO=true; else DIO=false; fi
check "direct-I/O reads on Linux >= 6.6; before, one warning at start: reads use the page cache" \
	"$( { $DIO && ! grep -qF "use the page cache" "$mlog"; } ||
		{ ! $DIO && grep -qF "use the page cache" "$mlog"; }; echo $?)"
sh "$PY $TOOL mapread 127.0.0.1:$PA mapped $M/vars/mapped"
sed 's/^/  /' "$TMP/out"
check "a cold read of 8 MiB and mmap(MAP_SHARED) of the same open both read its version" \
	"$([[ $rc -eq 0 ]] && grep -qx 'cold_read_ok=True' "$TMP/out" &&
		grep -qx 'cold_mmap_ok=True' "$TMP/out"; echo $?)"
if $DIO; then
	check "a cold read() is direct I/O: no page of the file is in the kernel's cache after it" \
		"$(grep -qx 'cold_cached_pages=0' "$TMP/out"; echo $?)"
	check "an update mapped while a reader of the older version reads: each sees its own" \
		"$(grep -qx 'newer_mmap_ok=True older_read_ok=True' "$TMP/out"; echo $?)"
	check "a repeated read of an unchanged version is served from the mount's copy (no GET)" \
		"$(grep -qx 'repeated_ok=True repeated_gets=0' "$TMP/out"; echo $?)"
	if $HAVE_NUMPY; then
		"$DG" var put mapped2 "$TMP/w1.txt" "${C[@]}" >/dev/null
		wait_visible mapped2
		sh "$PY"' -c "import numpy as np
m = np.memmap(\"vars/mapped2\", dtype=np.float32, mode=\"r\", shape=(4, 8))
print(float(m[3, 7]), float(m.sum()))"'
		check "np.memmap of a variable opened cold (direct I/O) reads its values" \
			"$([[ $rc -eq 0 && $(cat "$TMP/out") == "15.5 248.0" ]]; echo $?)"
	fi
	# The fallback, as on kernels before 6.6: page-cache reads, mmap as before.
	MP=$TMP/mnt_pc
	if DG_MOUNT_NO_DIRECT_MMAP=1 mount_dg "$MP" "$TMP/cluster.json" --timeout 2; then
		sh "$PY $TOOL mapread 127.0.0.1:$PA mapped $MP/vars/mapped"
		sed 's/^/  /' "$TMP/out"
		check "DG_MOUNT_NO_DIRECT_MMAP=1: cold reads fill the page cache and mmap reads them" \
			"$([[ $rc -eq 0 ]] && grep -qF "use the page cache" "$TMP/mount.mnt_pc.log" &&
				grep -qx 'cold_read_ok=True' "$TMP/out" &&
				grep -qx 'cold_mmap_ok=True' "$TMP/out" &&
				! grep -qx 'cold_cached_pages=0' "$TMP/out" &&
				grep -q '^repeated_ok=True' "$TMP/out"; echo $?)"
		unmount_dg "$MP"
		check "fusermount3 -u of the page-cache mount: its process exits 0" $?
	else
		not_ok "dg mount with DG_MOUNT_NO_DIRECT_MMAP=1 comes up"
	fi
fi

# --- ESTALE: the variable changed between open and close -------------------------------
hold_stale() {   # hold_stale MOUNT: prints what the holder saw
	rm -f "$TMP/ready" "$TMP/go"
	"$PY" "$TOOL" hold "$1/vars/w1" "$TMP/full2.bin" "$TMP/ready" "$TMP/go" \
		>"$TMP/hold.out" 2>&1 &
	local hp=$!
	for _ in $(seq 1 100); do [[ -e $TMP/ready ]] && break; sleep 0.1; done
	"$DG" var put w1 "$TMP/full.bin" --dtype float32 --shape 4,8 "${C[@]}" >/dev/null
	touch "$TMP/go"
	wait "$hp"
}
hold_stale "$M"
fetch w1 "$TMP/after"
cp "$TMP/hold.out" "$TMP/out"
check "a write to a handle opened before another update fails with ESTALE" \
	"$(grep -qE '^(write|close) ESTALE$' "$TMP/hold.out" &&
		cmp -s "$TMP/after.bin" "$TMP/full.bin"; echo $?)"
exec 3>"$M/vars/w1"
"$DG" var put w1 "$TMP/full2.bin" --dtype float32 --shape 4,8 "${C[@]}" >/dev/null
rc=0
timeout 30 cat "$TMP/full.bin" >&3 2>"$TMP/err" || rc=$?
exec 3>&-
fetch w1 "$TMP/after"
check "exec 3> vars/w1; dg var put; cat >&3; exec 3>&-: the newer value stays" \
	"$(cmp -s "$TMP/after.bin" "$TMP/full2.bin"; echo $?)"

# --- -o overwrite --------------------------------------------------------------------
MO=$TMP/mnt_over
if mount_dg "$MO" "$TMP/cluster.json" -o overwrite --timeout 2; then
	hold_stale "$MO"
	fetch w1 "$TMP/after"
	check "with -o overwrite the held write wins" \
		"$([[ $(cat "$TMP/hold.out") == ok ]] && cmp -s "$TMP/after.bin" "$TMP/full2.bin"
			echo $?)"
	rc=0
	"$PY" "$TOOL" writers "$MO/vars/c" 8 10 65536 >"$TMP/out" 2>"$TMP/err" || rc=$?
	echo "  writers: $(head -n 1 "$TMP/out")"
	check "8 writers with -o overwrite: no ESTALE, no torn tensor" \
		"$([[ $rc -eq 0 ]] && grep -qF 'ESTALE 0,' "$TMP/out"; echo $?)"
	unmount_dg "$MO"
	check "fusermount3 -u of the overwrite mount: its process exits 0" $?
else
	not_ok "dg mount -o overwrite comes up"
fi

# --- -o ro ------------------------------------------------------------------------------
MR=$TMP/mnt_ro
if mount_dg "$MR" "$TMP/cluster.json" -o ro --timeout 2; then
	snap w1
	rc=0
	(cd "$MR" && timeout 30 bash -c 'od -A n -t f4 -N 8 vars/w1; cat text/w1 >/dev/null') \
		>"$TMP/out" 2>"$TMP/err" || rc=$?
	check "-o ro: reads work" \
		"$([[ $rc -eq 0 && $(tr -s ' \n' '  ' <"$TMP/out") == ' 200 201 ' ]]; echo $?)"
	for cmd in 'cp "'"$TMP"'/full.bin" vars/w1' 'rm vars/w1' 'mkdir vars/d' \
		'cp "'"$TMP"'/w3.npy" npy/new.npy' 'echo 1 > text/w1' \
		'dd if="'"$TMP"'/patch.bin" of=vars/w1 bs=4 seek=1 conv=notrunc' \
		'mv npy/w2.npy npy/w9.npy'; do
		rc=0
		(cd "$MR" && timeout 30 bash -c "$cmd") >"$TMP/out" 2>"$TMP/err" || rc=$?
		check "-o ro refuses '$cmd' (Read-only file system)" \
			"$([[ $rc -ne 0 ]] && grep -qF 'Read-only file system' "$TMP/err" &&
				unchanged w1; echo $?)"
	done
	p=${mpid[$MR]}
	kill -TERM "$p"
	for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	st=0
	if kill -0 "$p" 2>/dev/null; then st=1; else wait "$p" || st=$?; fi
	check "SIGTERM unmounts and ends dg mount (exit $st)" \
		"$([[ $st -eq 0 ]] && ! mountpoint -q "$MR"; echo $?)"
	[[ $st -eq 0 ]] && unset "mpid[$MR]"
else
	not_ok "dg mount -o ro comes up"
fi

# --- 10,000 variables --------------------------------------------------------------------
start_ps b 0
PB=$PORT
printf '{"ps": ["127.0.0.1:%s"]}\n' "$PB" >"$TMP/cluster_b.json"
t0=$(now)
rc=0
"$PY" "$TOOL" bulk "127.0.0.1:$PB" 10000 "$TMP/expected" >"$TMP/out" 2>"$TMP/err" || rc=$?
echo "  created 10,000 variables through the HTTP API in $(elapsed "$t0")s"
MB=$TMP/mnt_b
if [[ $rc -eq 0 ]] && mount_dg "$MB" "$TMP/cluster_b.json"; then
	t0=$(now)
	rc=0
	(cd "$MB/vars" && LC_ALL=C timeout 120 ls -lR --time-style=+%s many) \
		>"$TMP/lslR" 2>"$TMP/err" || rc=$?
	t=$(elapsed "$t0")
	awk '/:$/ { dir = substr($0, 1, length($0) - 1); next }
		/^-/ { print dir "/" $7, $5 }' "$TMP/lslR" | LC_ALL=C sort >"$TMP/listed"
	LC_ALL=C sort "$TMP/expected" >"$TMP/expected.sorted"
	check "ls -lR of 10,000 variables lists exactly their names and sizes (${t}s)" \
		"$([[ $rc -eq 0 ]] && cmp -s "$TMP/listed" "$TMP/expected.sorted"; echo $?)"
	[[ $rc -ne 0 ]] || cmp "$TMP/listed" "$TMP/expected.sorted" | head -3
	unmount_dg "$MB"
	check "fusermount3 -u of the 10,000-variable mount: its process exits 0" $?
else
	not_ok "10,000 variables created and mounted"
fi

# --- a reader's open: one request; a variable that moved to another ps ------------------
# doc/filesystem.md "Reading": a reader of a variable the list places sends one
# GET to its task (no HEAD first); a kept copy costs one HEAD (and a GET when
# the version changed); a variable deleted and created on another ps between two
# opens (the list, kept --attr-timeout 60 s, still names the old task) is
# searched for and read right, even when its version there equals the copy's.
start_ps c 0
PC=$PORT
start_ps d 0
PD=$PORT
printf '{"ps": ["127.0.0.1:%s", "127.0.0.1:%s"]}\n' "$PC" "$PD" >"$TMP/cluster_cd.json"
# vreq PORT: "GET200 GET304 GET404 HEAD": requests of vars/NAME the ps answered
vreq() {
	curl -s "http://127.0.0.1:$1/v1/metrics" | awk '/^dg_http_requests_total/ &&
		/vars\/\{name/ { if (/method="GET"/ && /code="200"/) g += $NF
			if (/method="GET"/ && /code="304"/) n += $NF
			if (/method="GET"/ && /code="404"/) f += $NF
			if (/method="HEAD"/) h += $NF }
		END { printf "%d %d %d %d\n", g, n, f, h }'
}
# delta BEFORE AFTER: the difference of two vreq lines
delta() {
	awk -v a="$1" -v b="$2" 'BEGIN { split(a, x); split(b, y)
		printf "%d %d %d %d\n", y[1] - x[1], y[2] - x[2], y[3] - x[3], y[4] - x[4] }'
}
# put_raw PORT NAME FILE SHAPE: PUT a float32 value from raw bytes; prints its version
put_raw() {
	curl -s -D - -o /dev/null -X PUT -H 'Content-Type: application/octet-stream' \
		-H 'Dg-Dtype: float32' -H "Dg-Shape: $4" --data-binary "@$3" \
		"http://127.0.0.1:$1/v1/vars/$2" | tr -d '\r' |
		awk -F': ' 'tolower($1) == "dg-version" { print $2 }'
}
"$PY" "$TOOL" raw "$TMP/mv1.bin" 2f 1 2
"$PY" "$TOOL" raw "$TMP/mv2.bin" 2f 3 4
"$PY" "$TOOL" raw "$TMP/mv3.bin" 3f 7 8 9
# 4.4 MB values: they stream in (>= 4 MiB)
"$PY" -c 'import struct, sys
n = 1100000
for k in (1, 2):
    open("%s/big%d.bin" % (sys.argv[1], k), "wb").write(
        struct.pack("<%df" % n, *(float((i * k) % 1000) for i in range(n))))' "$TMP"
put_raw "$PD" mv "$TMP/mv1.bin" 2 >/dev/null
put_raw "$PD" big "$TMP/big1.bin" 1100000 >/dev/null
MV=$TMP/mnt_cd
if mount_dg "$MV" "$TMP/cluster_cd.json" --attr-timeout 60 --timeout 2; then
	ls "$MV/vars" >/dev/null
	r0=$(vreq "$PD") c0=$(vreq "$PC")
	od -A n -t f4 "$MV/vars/mv" >"$TMP/out" 2>"$TMP/err"
	r1=$(vreq "$PD") c1=$(vreq "$PC")
	check "a cold open of vars/mv (2nd ps): one GET, no HEAD, no request to the 1st ps" \
		"$([[ $(tr -s ' \n' '  ' <"$TMP/out") == ' 1 2 ' && $(delta "$r0" "$r1") == '1 0 0 0' &&
			$(delta "$c0" "$c1") == '0 0 0 0' ]]; echo $?)"
	od -A n -t f4 "$MV/vars/mv" >"$TMP/out" 2>"$TMP/err"
	r2=$(vreq "$PD")
	check "  ... a repeated open reads the kept copy after one HEAD" \
		"$([[ $(tr -s ' \n' '  ' <"$TMP/out") == ' 1 2 ' && $(delta "$r1" "$r2") == '0 0 0 1' ]]
			echo $?)"
	mv_v=$(put_raw "$PD" mv "$TMP/mv2.bin" 2)
	r2=$(vreq "$PD")
	od -A n -t f4 "$MV/vars/mv" >"$TMP/out" 2>"$TMP/err"
	r3=$(vreq "$PD")
	check "  ... after an update, a HEAD and a GET bring the new value" \
		"$([[ $(tr -s ' \n' '  ' <"$TMP/out") == ' 3 4 ' && $(delta "$r2" "$r3") == '1 0 0 1' ]]
			echo $?)"
	# the same name on the 1st ps, at the version of the mount's copy where the
	# counters allow it (versions count per ps): the copy must not be served
	curl -s -o /dev/null -X DELETE "http://127.0.0.1:$PD/v1/vars/mv"
	for _ in $(seq 1 20); do
		v=$(put_raw "$PC" pad "$TMP/mv1.bin" 2)
		[[ -n $v && $((v + 1)) -lt ${mv_v:-0} ]] || break
	done
	v=$(put_raw "$PC" mv "$TMP/mv3.bin" 3)
	od -A n -t f4 "$MV/vars/mv" >"$TMP/out" 2>"$TMP/err"
	check "mv deleted, created on the 1st ps (version $v, the copy's $mv_v): vars/mv reads it" \
		"$([[ $(tr -s ' \n' '  ' <"$TMP/out") == ' 7 8 9 ' ]]; echo $?)"
	rc=0
	"$PY" -c 'import numpy as np, sys; print(np.load(sys.argv[1]).tolist())' \
		"$MV/npy/mv.npy" >"$TMP/out" 2>"$TMP/err" || rc=$?
	check "  ... and so does npy/mv.npy" \
		"$( ! $HAVE_NUMPY || [[ $rc -eq 0 && $(cat "$TMP/out") == '[7.0, 8.0, 9.0]' ]]
			echo $?)"
	curl -s -o /dev/null -X DELETE "http://127.0.0.1:$PC/v1/vars/mv"
	rc=0
	cat "$MV/vars/mv" >/dev/null 2>"$TMP/err" || rc=$?
	check "  ... deleted from both: No such file or directory" \
		"$([[ $rc -ne 0 ]] && grep -qF 'No such file' "$TMP/err"; echo $?)"
	# a value that streams, moved before the mount read it: the stream's GET
	# to the listed ps answers 404, the mount searches and streams it again
	curl -s -o /dev/null -X DELETE "http://127.0.0.1:$PD/v1/vars/big"
	put_raw "$PC" big "$TMP/big2.bin" 1100000 >/dev/null
	rc=0
	cmp "$MV/vars/big" "$TMP/big2.bin" 2>"$TMP/err" || rc=$?
	check "a streamed value moved to the other ps between list and open reads right" \
		"$([[ $rc -eq 0 ]]; echo $?)"
	r0=$(vreq "$PC")
	cmp "$MV/vars/big" "$TMP/big2.bin" 2>"$TMP/err" || rc=$?
	r1=$(vreq "$PC")
	put_raw "$PC" big "$TMP/big1.bin" 1100000 >/dev/null
	cmp "$MV/vars/big" "$TMP/big1.bin" 2>"$TMP/err" || rc=$?
	check "  ... read again: the kept copy after one HEAD, then the update" \
		"$([[ $rc -eq 0 && $(delta "$r0" "$r1") == '0 0 0 1' ]]; echo $?)"
	unmount_dg "$MV"
	check "fusermount3 -u of the two-ps mount: its process exits 0" $?
else
	not_ok "a mount of two ps comes up"
fi

# --- jobs/: the jobs of the cluster's master ---------------------------------------------
# A cluster of `dg server`s (1 ps + 2 workers; ports picked first: every server
# needs the final spec), mounted; jobs submitted with dg submit show up as
# jobs/ID/ with status, log and placement, read-only files of their true size.
read -r j0 j1 j2 < <(free_ports 3)
printf '{"ps": ["127.0.0.1:%s"], "worker": ["127.0.0.1:%s", "127.0.0.1:%s"]}\n' \
	"$j0" "$j1" "$j2" >"$TMP/jcluster.json"
jobs_up=true
for spec in ps:0 worker:0 worker:1; do
	"$DG" server --cluster "$TMP/jcluster.json" --job "${spec%:*}" --task "${spec#*:}" \
		--port-file "$TMP/j.${spec/:/}.port" >>"$TMP/j.${spec/:/}.log" 2>&1 &
	pids+=("$!")
done
for spec in ps0 worker0 worker1; do
	wait_port "$TMP/j.$spec.port" 150 0.1 >/dev/null || jobs_up=false
done
MJ=$TMP/mnt_j
# jf FILE: a file of the (only) job, through the mount
jf() { cat "$MJ/jobs/$J/$1"; }
if $jobs_up && mount_dg "$MJ" "$TMP/jcluster.json"; then
	rc=0
	ls -A "$MJ/jobs" >"$TMP/out" 2>"$TMP/err" || rc=$?
	check "jobs/ of a master without jobs is an empty directory" \
		"$([[ $rc -eq 0 && ! -s $TMP/out ]]; echo $?)"
	rc=0
	"$DG" submit "$SRC/examples/seed_sum.json" --cluster "$TMP/jcluster.json" \
		>"$TMP/out" 2>"$TMP/err" || rc=$?
	J=$(ls "$MJ/jobs" 2>/dev/null)
	check "dg submit seed_sum.json prints 238 and jobs/ lists its job ($J)" \
		"$([[ $rc -eq 0 && $(cat "$TMP/out") == 238 && $J =~ ^[A-Za-z0-9_-]+$ ]]; echo $?)"
	ls "$MJ/jobs/$J" >"$TMP/out" 2>"$TMP/err"
	check "jobs/$J/ holds log, placement and status (no metrics.csv: not a training job)" \
		"$(tr '\n' ' ' <"$TMP/out" | grep -qx 'log placement status '; echo $?)"
	jf status >"$TMP/status.json" 2>"$TMP/err"
	check "jobs/$J/status is the job's status JSON: done, 1 of 1 steps, 2 fragments" \
		"$("$PY" -c 'import json, sys
s = json.load(open(sys.argv[1]))
ok = s["id"] == sys.argv[2] and s["state"] == "done" and s["steps_done"] == 1
ok = ok and s["fragments"] == 2 and s["placement"]["y2"] == "/job:worker/task:1"
sys.exit(0 if ok else 1)' "$TMP/status.json" "$J"; echo $?)"
	jf log >"$TMP/log.jsonl" 2>"$TMP/err"
	check "jobs/$J/log holds the event lines created, started, step, done of that job" \
		"$("$PY" -c 'import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
ok = [e["event"] for e in ev] == ["created", "started", "step", "done"]
ok = ok and all(e["job"] == sys.argv[2] for e in ev) and ev[-1]["steps_done"] == 1
sys.exit(0 if ok else 1)' "$TMP/log.jsonl" "$J"; echo $?)"
	jf placement >"$TMP/out" 2>"$TMP/err"
	check "jobs/$J/placement is the explain text (y2 on worker/1, the fetch of y)" \
		"$(grep -qE '^  y2 +/job:worker/task:1 ' "$TMP/out" &&
			grep -qF 'key fetch:y' "$TMP/out"; echo $?)"
	sizes_ok=0
	for f in status log placement; do
		[[ $(stat -c %s "$MJ/jobs/$J/$f") -eq $(jf "$f" | wc -c) ]] || sizes_ok=1
		[[ $(stat -c %A "$MJ/jobs/$J/$f") == -r--r--r-- ]] || sizes_ok=1
	done
	check "status, log and placement are read-only files of their true size" "$sizes_ok"
	rc=0
	(cd "$MJ" && timeout 30 bash -c "echo x > jobs/$J/status") >"$TMP/out" 2>"$TMP/err" ||
		rc=$?
	check "writing jobs/$J/status fails (Operation not permitted)" \
		"$([[ $rc -ne 0 ]] && grep -qF 'Operation not permitted' "$TMP/err"; echo $?)"
	rc=0
	ls "$MJ/jobs/nope" "$MJ/jobs/$J/nope" >"$TMP/out" 2>"$TMP/err" || rc=$?
	check "jobs/nope and jobs/$J/nope: No such file or directory" \
		"$([[ $rc -ne 0 && $(grep -c 'No such file' "$TMP/err") -eq 2 ]]; echo $?)"
	# a running job: its status file changes from running to done (cache 0.5 s)
	# 6000 steps (~1-2 s): 1500 could end before the mount's 0.5 s cache showed
	# the job running once dg's processes started 0.3 s sooner (cuBLAS loaded lazily)
	"$DG" submit "$SRC/examples/seed_sum.json" --cluster "$TMP/jcluster.json" \
		--steps 6000 >"$TMP/long.out" 2>&1 &
	sub=$!
	K=
	seen_running=false
	for _ in $(seq 1 100); do
		for d in "$MJ"/jobs/*; do [[ ${d##*/} != "$J" ]] && K=${d##*/}; done
		if [[ -n $K ]] && grep -qF '"state": "running"' "$MJ/jobs/$K/status" 2>/dev/null
		then
			seen_running=true
			break
		fi
		sleep 0.05
	done
	wait "$sub"
	sleep 0.6
	check "a running job's status file shows running, then done once it ended" \
		"$($seen_running && grep -qF '"state": "done"' "$MJ/jobs/$K/status" &&
			grep -qF '"steps_done": 6000' "$MJ/jobs/$K/status"; echo $?)"
	# a training job (contract: doc/training.md): its metrics.csv
	cat >"$TMP/train.json" <<-'EOF'
	{"version": 1, "nodes": [
	 {"name": "w", "op": "Variable", "attrs": {"shape": [2], "dtype": "float32", "init": "zeros"}},
	 {"name": "x", "op": "Const", "attrs": {"value": [1, 2], "dtype": "float32"}},
	 {"name": "y", "op": "Const", "attrs": {"value": [3, 6], "dtype": "float32"}},
	 {"name": "p", "op": "Mul", "inputs": ["w", "x"]},
	 {"name": "e", "op": "Sub", "inputs": ["p", "y"]},
	 {"name": "s", "op": "Square", "inputs": ["e"]},
	 {"name": "loss", "op": "Sum", "inputs": ["s"]}],
	 "training": {"loss": "loss", "optimizer": {"rule": "sgd", "lr": 0.05}, "steps": 40}}
	EOF
	rc=0
	"$DG" submit "$TMP/train.json" --cluster "$TMP/jcluster.json" >"$TMP/out" 2>"$TMP/err" ||
		rc=$?
	T=
	for d in "$MJ"/jobs/*; do [[ ${d##*/} != "$J" && ${d##*/} != "$K" ]] && T=${d##*/}; done
	rc2=0
	cat "$MJ/jobs/$T/metrics.csv" >"$TMP/metrics.csv" 2>>"$TMP/err" || rc2=$?
	check "a training job's folder lists metrics.csv: step,time_s,epoch,loss,... up to step 40" \
		"$([[ $rc -eq 0 && $rc2 -eq 0 && -n $T ]] &&
			ls "$MJ/jobs/$T" | grep -qx metrics.csv &&
			head -n 1 "$TMP/metrics.csv" | grep -q '^step,time_s,epoch,loss' &&
			[[ $(tail -n 1 "$TMP/metrics.csv" | cut -d, -f1) == 40 ]] &&
			[[ $(stat -c %s "$MJ/jobs/$T/metrics.csv") -eq $(wc -c <"$TMP/metrics.csv") ]]; \
			echo $?)"
	rc=0
	cat "$MJ/jobs/$J/metrics.csv" >"$TMP/out" 2>"$TMP/err" || rc=$?
	check "metrics.csv of a job that is not a training job: No such file or directory" \
		"$([[ $rc -ne 0 ]] && grep -qF 'No such file' "$TMP/err"; echo $?)"
	unmount_dg "$MJ"
	check "fusermount3 -u of the jobs mount: its process exits 0" $?
else
	not_ok "a cluster of dg servers starts and is mounted"
fi

# --- watching: events and poll(2) (doc/filesystem.md "Watching") ------------------------
dgr var put watched "${C[@]}" --value '[1,2,3,4]' --dtype float32
sh 'cat events >/dev/null'      # the first open starts the streams
timeout 10 tail -n 0 -f "$M/events" >"$TMP/tail.out" 2>"$TMP/tail.err" &
tail_pid=$!
sleep 0.5
dgr var put watched "${C[@]}" --value '[5,6,7,8]' --dtype float32
dgr var put watched "${C[@]}" --value '[9,9,9,9]' --dtype float32
for _ in $(seq 1 60); do
	[[ $(grep -c ' watched ' "$TMP/tail.out") -ge 2 ]] && break
	sleep 0.05
done
kill "$tail_pid" 2>/dev/null
wait "$tail_pid" 2>/dev/null
check "tail -f events shows each update: time, task, name, version, put" \
	"$([[ $(grep -cE '^20[0-9-]{8}T[0-9:.]{12}Z ps/0 watched [0-9]+ put$' \
		"$TMP/tail.out") -eq 2 ]]; echo $?)"
sh 'test "$(stat -c %s events)" -eq "$(cat events | wc -c)" && grep -q " watched " events'
check "events is a file whose size is what it holds" $rc
sh 'echo x >events'
check "events cannot be written (EPERM)" "$([[ $rc -ne 0 ]]; echo $?)"
"$PY" "$TOOL" pollwait "127.0.0.1:$PA" watched "$M/vars/watched" 5 >"$TMP/out" 2>"$TMP/err"
rc=$?
wake=$(sed -n 's/^wake_ms=//p' "$TMP/out")
check "poll(2) on vars/watched: quiet without a change, wakes at each PUT ($wake ms median,max)" \
	"$([[ $rc -eq 0 ]] && grep -qx 'idle=quiet' "$TMP/out" &&
		awk -v m="${wake%%,*}" 'BEGIN { exit !(m < 50) }'; echo $?)"

# --- a stopped ps: EIO within the deadline, then the mount works again -------------------
kill -STOP "$PA_PID"
# timed inside the shell (bash's time of cat alone): starting timeout and
# bash on a loaded machine is not the mount's time
sh 'TIMEFORMAT=%R; { time cat vars/w1 >/dev/null 2>"'"$TMP"'/cat.err"; } 2>"'"$TMP"'/cat.time"'
t=$(cat "$TMP/cat.time")
# doc/filesystem.md: "a lost server gives EIO after at most this [--timeout]" (+1 s slack)
check "a stopped (SIGSTOP) ps: cat vars/w1 fails with EIO in ${t}s (--timeout 2), no hang" \
	"$([[ $rc -ne 0 && $rc -ne 124 ]] && grep -qF 'Input/output error' "$TMP/cat.err" &&
		awk -v t="$t" 'BEGIN { exit !(t < 3) }'; echo $?)"
kill -CONT "$PA_PID"
works_again() {
	for _ in $(seq 1 40); do
		sh 'cmp vars/w1 "'"$TMP"'/full2.bin"'
		[[ $rc -eq 0 ]] && return 0
		sleep 0.25
	done
	return 1
}
works_again
check "after SIGCONT the mount reads the variable again" $?

kill -TERM "$PA_PID"
wait "$PA_PID"
t0=$(now)
sh 'cat vars/w1 >/dev/null'
t=$(elapsed "$t0")
check "a ps that is gone: cat vars/w1 fails with EIO in ${t}s" \
	"$([[ $rc -ne 0 && $rc -ne 124 ]] && grep -qF 'Input/output error' "$TMP/err" &&
		awk -v t="$t" 'BEGIN { exit !(t < 15) }'; echo $?)"
start_ps a "$PA" --data-dir "$TMP/data"
PA_PID=$PS_PID
works_again
check "the mount reconnects by itself when the ps is back on its port" $?

# --- rm ----------------------------------------------------------------------------
sh 'rm vars/w1 && ! test -e vars/w1'
dgr var get w1 "${C[@]}"
check "rm vars/w1 deletes the variable" "$([[ $rc -eq 3 ]]; echo $?)"
sh 'rm vars/nothere'
check "rm of a missing variable: No such file or directory" \
	"$([[ $rc -ne 0 ]] && grep -qF 'No such file' "$TMP/err"; echo $?)"

# --- unmount -----------------------------------------------------------------------
mp=${mpid[$M]}
unmount_dg "$M"
st=$?
rc=$st
check "fusermount3 -u: dg mount exits 0 and no process is left" \
	"$([[ $st -eq 0 ]] && ! kill -0 "$mp" 2>/dev/null && ! mountpoint -q "$M"; echo $?)"
if grep -lE 'Sanitizer|runtime error:' "$TMP"/*.log; then
	rc=1
	not_ok "no sanitizer reports in the logs of dg mount and dg ps"
else
	ok "no sanitizer reports in the logs of dg mount and dg ps"
fi

summary
