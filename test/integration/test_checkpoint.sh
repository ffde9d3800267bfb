#!/usr/bin/env bash
# `dg checkpoint save DIR` / `dg checkpoint restore DIR` end to end against real
# parameter servers on loopback ports: every dtype (bfloat16 as raw bytes), a
# name with '/', optimizer slots; the files checked with numpy; values changed
# and deleted, then restored; a restore into a second, fresh server; --only;
# damaged checkpoints refused with nothing changed; DIR refused unless --force;
# slots following their variable across two ps tasks; `dg ps` / `dg worker`.
# Usage: test_checkpoint.sh PATH/TO/dg   (exit 77 = skipped without numpy)
# shellcheck disable=SC2016   # check's conditions are eval'ed: single quotes on purpose
set -uo pipefail

DG=${1:?usage: test_checkpoint.sh PATH/TO/dg}
PY=/usr/bin/python3
if ! [[ -x $PY ]] || ! $PY -c 'import numpy' 2>/dev/null; then
	echo "skipped: /usr/bin/python3 with numpy not found"
	exit 77
fi

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ps_script_init          # TMP, PIDS and the EXIT trap that kills them

# check DESC CONDITION: count a check whose condition is a shell expression.
check() {
	if eval "$2"; then ok "$1"; else not_ok "$1"; fi
}

# curl_apply PORT NAME QUERY: POST a float32 gradient of 2s shaped [2,3].
curl_apply() {
	curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$1/v1/vars/$2/apply?$3" \
		-H 'Content-Type: application/x-npy' --data-binary @"$TMP/g.npy"
}

# snapshot C DIR NAME...: each variable as .npy (bfloat16: raw) under DIR.
snapshot() {
	local c=$1 dir=$2 name fmt
	shift 2
	for name in "$@"; do
		fmt=npy
		[[ $name == bf ]] && fmt=raw
		mkdir -p "$(dirname "$dir/$name")"
		"$DG" var get "$name" --cluster "$c" --format $fmt -o "$dir/$name.$fmt" || return 1
	done
}

# same_as DIR_A DIR_B NAME...: the snapshots agree byte for byte.
same_as() {
	local a=$1 b=$2 name fmt
	shift 2
	for name in "$@"; do
		fmt=npy
		[[ $name == bf ]] && fmt=raw
		cmp -s "$a/$name.$fmt" "$b/$name.$fmt" || { echo "  $name differs"; return 1; }
	done
}

VARS=(bf h model/layer1/b n w w.momentum)

# --- dg ps / dg worker -------------------------------------------------------------
run ps --help
check "dg ps --help says it is dg server --job ps" \
	'[[ $rc -eq 0 ]] && grep -qF "short for '"'"'dg server --job ps'"'"'" "$TMP/out" &&
	 grep -q "^usage: dg server" "$TMP/out"'
run worker --help
check "dg worker --help says it is dg server --job worker" \
	'[[ $rc -eq 0 ]] && grep -qF "dg server --job worker" "$TMP/out"'
run worker --job ps --cluster "$TMP/none.json"
check_err "dg worker with --job ps is a usage error" 1 \
	"'dg worker' runs a task of job 'worker', not 'ps'"
run ps --job=worker
check_err "dg ps with --job=worker is a usage error" 1 "not 'worker'"

# --- a ps with variables -------------------------------------------------------------
start_one_ps a 200 --data-dir "$TMP/data-a"
PA=$PORT
[[ -n $PA ]] || { cat "$TMP/a.log"; echo "0 passed, 1 failed"; exit 1; }
printf '{"ps": ["127.0.0.1:%s"]}\n' "$PA" >"$TMP/a.json"
A=(--cluster "$TMP/a.json")

"$DG" var put w "${A[@]}" --value '[[1,2,3],[4,5,6.5]]' >/dev/null
"$DG" var put n "${A[@]}" --value '[-3,9007199254740993]' --dtype int64 >/dev/null
"$DG" var put model/layer1/b "${A[@]}" --value '[0.25,-1]' --dtype float64 >/dev/null
"$DG" var put h "${A[@]}" --value '[0.5,-2,65504]' --dtype float16 >/dev/null
"$DG" var put bf "${A[@]}" --value '[1.5,-3,1e30]' --dtype bfloat16 >/dev/null
$PY -c "import numpy as np; np.save('$TMP/g.npy', np.full((2,3), 2, np.float32))"
check "a momentum apply makes the slot w.momentum" \
	'[[ $(curl_apply "$PA" w "rule=momentum&lr=0.5&momentum=0.9") == 200 ]]'

run checkpoint save "$TMP/ck" "${A[@]}"
check "save DIR exports every variable, slots included" \
	'[[ $rc -eq 0 ]] && grep -q "^saved 6 variables (.*) from 1 ps to $TMP/ck in " "$TMP/out"'
check "the files are NAME.npy, subdirectories for '/', NAME.raw for bfloat16" \
	'[[ -f $TMP/ck/w.npy && -f $TMP/ck/w.momentum.npy && -f $TMP/ck/model/layer1/b.npy &&
	   -f $TMP/ck/bf.raw && -f $TMP/ck/manifest.json ]]'
check "no staging directory is left behind" '! compgen -G "$TMP/ck.tmp-*" >/dev/null'

snapshot "$TMP/a.json" "$TMP/ref" "${VARS[@]}"
# numpy: each .npy equals `dg var get`, the manifest's dtype/shape/bytes/crc32
# describe the data, and the raw file holds the bfloat16 bits.
run_py() {
	$PY - "$TMP/ck" "$TMP/ref" <<'EOF'
import json, sys, zlib
import numpy as np
ck, ref = sys.argv[1], sys.argv[2]
m = json.load(open(f"{ck}/manifest.json"))
assert m["format"] == "dg-checkpoint" and m["version"] == 1, m
assert [t["task"] for t in m["tasks"]] == ["ps/0"], m["tasks"]
names = [v["name"] for v in m["variables"]]
assert names == sorted(["bf", "h", "model/layer1/b", "n", "w", "w.momentum"]), names
for v in m["variables"]:
    path = f"{ck}/{v['file']}"
    if v["dtype"] == "bfloat16":
        assert v["encoding"] == "raw" and v["file"] == "bf.raw", v
        data = open(path, "rb").read()
        assert data == open(f"{ref}/bf.raw", "rb").read()
        f = (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
        assert f[0] == 1.5 and f[1] == -3 and abs(f[2] / 1e30 - 1) < 1e-2, f
    else:
        a = np.load(path)
        b = np.load(f"{ref}/{v['name']}.npy")
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), v["name"]
        assert str(a.dtype) == v["dtype"] and list(a.shape) == v["shape"], v
        data = a.tobytes()
    assert len(data) == v["bytes"] and zlib.crc32(data) == v["crc32"], v["name"]
    assert v["task"] == "ps/0" and v["version"] >= 1, v
w = np.load(f"{ck}/w.npy")
assert w.tolist() == [[0, 1, 2], [3, 4, 5.5]], w          # after sgd-like momentum step
assert np.load(f"{ck}/w.momentum.npy").tolist() == [[2] * 3] * 2
assert np.load(f"{ck}/n.npy").tolist() == [-3, 9007199254740993]
assert np.load(f"{ck}/h.npy").tolist() == [0.5, -2, 65504]
assert np.load(f"{ck}/model/layer1/b.npy").dtype == np.float64
EOF
}
check "numpy reads every file as dg var get does; sizes and crc32 match" 'run_py'

run checkpoint save "$TMP/ck" "${A[@]}"
check_err "an existing non-empty DIR is refused" 4 "exists and is not empty"
mkdir -p "$TMP/other" && echo keep >"$TMP/other/notes.txt"
run checkpoint save "$TMP/other" "${A[@]}" --force
check_err "--force does not replace a directory that is not a checkpoint" 4 "is not a checkpoint"
check "and that directory is untouched" '[[ $(cat "$TMP/other/notes.txt") == keep ]]'
echo '{"name": "some web app"}' >"$TMP/other/manifest.json"
run checkpoint save "$TMP/other" "${A[@]}" --force
check_err "--force does not replace a directory whose manifest.json is not a checkpoint's" 4 \
	"is not a checkpoint"
check "and that directory is untouched too" \
	'[[ $(cat "$TMP/other/notes.txt") == keep && -f $TMP/other/manifest.json ]]'
run checkpoint save "$TMP/ck" "${A[@]}" --force --json
check "--force replaces an earlier checkpoint; --json gives the totals" \
	'[[ $rc -eq 0 ]] && grep -q "\"variables\":6," "$TMP/out" && run_py'
run checkpoint restore "$TMP/ck" "${A[@]}" --force
check_err "restore refuses --force (it applies to save DIR)" 1 "--force applies to"
mkdir -p "$TMP/empty"
run checkpoint save "$TMP/empty/" "${A[@]}"
check "an empty DIR (given with a trailing slash) is used" \
	'[[ $rc -eq 0 && -f $TMP/empty/manifest.json ]]'

run checkpoint save "${A[@]}"
check "save without DIR still snapshots each ps in its data dir" \
	'[[ $rc -eq 0 ]] && grep -q "^ps/0: epoch 1, 6 variables, " "$TMP/out"'

# --- change, delete, restore ------------------------------------------------------------
"$DG" var put w "${A[@]}" --value '[[0,0,0],[0,0,0]]' >/dev/null
"$DG" var put bf "${A[@]}" --value '[7,7,7]' >/dev/null
"$DG" var rm model/layer1/b "${A[@]}" >/dev/null
curl_apply "$PA" w "rule=momentum&lr=0.5&momentum=0.9" >/dev/null
"$DG" var put h "${A[@]}" --value '[1,2]' --replace >/dev/null
run checkpoint restore "$TMP/ck" "${A[@]}"
check "restore puts back every variable" \
	'[[ $rc -eq 0 ]] && grep -q "^restored 6 variables (.*) to 1 ps in " "$TMP/out"'
snapshot "$TMP/a.json" "$TMP/after" "${VARS[@]}"
check "every value, dtype and shape is back (changed, deleted, reshaped, slot)" \
	'same_as "$TMP/ref" "$TMP/after" "${VARS[@]}"'

# --- a fresh server of another cluster ---------------------------------------------------
start_one_ps b 200
PB=$PORT
printf '{"ps": ["127.0.0.1:%s"]}\n' "$PB" >"$TMP/b.json"
run checkpoint restore "$TMP/ck" --server "127.0.0.1:$PB"
check "restore into a fresh ps of another cluster" \
	'[[ $rc -eq 0 ]] && grep -q "^restored 6 variables" "$TMP/out"'
snapshot "$TMP/b.json" "$TMP/fresh" "${VARS[@]}"
check "the fresh ps holds the same values" 'same_as "$TMP/ref" "$TMP/fresh" "${VARS[@]}"'
# m = 0.9*2 + 2 = 3.8, w -= 0.5*m: only right if the slot came back with 2s.
next_step_ok() {
	[[ $(curl_apply "$PB" w "rule=momentum&lr=0.5&momentum=0.9") == 200 ]] &&
		"$DG" var get w --cluster "$TMP/b.json" --format npy -o "$TMP/w-next.npy" &&
		$PY -c "
import numpy as np
w = np.load('$TMP/w-next.npy')
want = np.array([[0, 1, 2], [3, 4, 5.5]], np.float32) - np.float32(0.5) * np.float32(3.8)
assert np.allclose(w, want, rtol=1e-6), w"
}
check "a restored slot drives the next momentum apply like the original" next_step_ok

"$DG" var rm w n "${A[@]}" >/dev/null
run checkpoint restore "$TMP/ck" "${A[@]}" --only w --only model/,n
check "--only restores the names given, a NAME/ prefix and the variable's slots" \
	'[[ $rc -eq 0 ]] && grep -q "^restored 4 variables" "$TMP/out"'
snapshot "$TMP/a.json" "$TMP/only" w w.momentum n
check "the --only variables have their saved values" \
	'same_as "$TMP/ref" "$TMP/only" w w.momentum n'
run checkpoint restore "$TMP/ck" "${A[@]}" --only nope
check_err "--only with a name not in the checkpoint exits 3" 3 "--only nope: no such variable"

# --- damaged checkpoints: nothing changes -------------------------------------------------
"$DG" var put w "${A[@]}" --value '[[9,9,9],[9,9,9]]' >/dev/null
snapshot "$TMP/a.json" "$TMP/before-bad" "${VARS[@]}"
cp -r "$TMP/ck" "$TMP/bad1"
truncate -s -4 "$TMP/bad1/model/layer1/b.npy"
run checkpoint restore "$TMP/bad1" "${A[@]}"
check_err "a truncated .npy fails the restore (exit 11) naming the file" 11 \
	"bad1/model/layer1/b.npy has"
check "the message says the file is truncated and nothing was restored" \
	'grep -q "truncated or damaged" "$TMP/err" && grep -q "nothing was restored" "$TMP/err"'
cp -r "$TMP/ck" "$TMP/bad2"
$PY - "$TMP/bad2/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["variables"][1]["file"] = "not/there.npy"
json.dump(m, open(sys.argv[1], "w"))
EOF
run checkpoint restore "$TMP/bad2" "${A[@]}"
check_err "a manifest naming a missing file fails the restore (exit 3)" 3 \
	"bad2/not/there.npy of variable 'h' is missing"
cp -r "$TMP/ck" "$TMP/bad3"
$PY -c "import numpy as np; np.save('$TMP/bad3/n.npy', np.array([1.0, 2.0]))"
run checkpoint restore "$TMP/bad3" "${A[@]}"
check_err "a file of another dtype than the manifest's fails (exit 6)" 6 \
	"holds float64, the manifest says variable 'n' is int64"
cp -r "$TMP/ck" "$TMP/bad4"
$PY -c "
import numpy as np
a = np.load('$TMP/bad4/w.npy'); a[0, 0] += 1; np.save('$TMP/bad4/w.npy', a)"
run checkpoint restore "$TMP/bad4" "${A[@]}"
check_err "changed data fails the checksum (exit 11)" 11 "checksum mismatch"
run checkpoint restore "$TMP/nowhere" "${A[@]}"
check_err "a directory without a manifest exits 3" 3 "no checkpoint in"
snapshot "$TMP/a.json" "$TMP/after-bad" "${VARS[@]}"
check "none of the failed restores changed a variable" \
	'same_as "$TMP/before-bad" "$TMP/after-bad" "${VARS[@]}"'

# --- two ps tasks: placement and slots --------------------------------------------------
read -r q0 q1 < <(free_ports 2)
printf '{"ps": ["127.0.0.1:%s", "127.0.0.1:%s"]}\n' "$q0" "$q1" >"$TMP/two.json"
for i in 0 1; do
	"$DG" ps --cluster "$TMP/two.json" --task $i --port-file "$TMP/two$i.port" \
		2>"$TMP/two$i.log" &
	PIDS+=($!)
done
wait_port "$TMP/two0.port" >/dev/null && wait_port "$TMP/two1.port" >/dev/null
T=(--cluster "$TMP/two.json")
"$DG" var create big "${T[@]}" --shape 1000 >/dev/null     # ps/0: fewest bytes, the first
"$DG" var put x "${T[@]}" --value '[[1,2,3],[4,5,6.5]]' >/dev/null   # ps/1 now
curl_apply "$q1" x "rule=momentum&lr=0.5&momentum=0.9" >/dev/null
run checkpoint save "$TMP/ck2" "${T[@]}"
check "save of two ps tasks" \
	'[[ $rc -eq 0 ]] && grep -q "^saved 3 variables (.*) from 2 ps" "$TMP/out"'
check "the manifest names each variable's task" \
	'grep -q "\"name\":\"x.momentum\".*\"task\":\"ps/1\"" "$TMP/ck2/manifest.json" &&
	 grep -q "\"name\":\"big\".*\"task\":\"ps/0\"" "$TMP/ck2/manifest.json"'
"$DG" var rm x "${T[@]}" >/dev/null
"$DG" var put x --server "127.0.0.1:$q0" --value '[0]' >/dev/null
"$DG" var put x.momentum --server "127.0.0.1:$q1" --value '[0]' >/dev/null
run checkpoint restore "$TMP/ck2" "${T[@]}"
check "restore onto two tasks prints one line per task" \
	'[[ $rc -eq 0 ]] && grep -q "^ps/0: 3 variables" "$TMP/out" &&
	 grep -q "^restored 3 variables (.*) to 1 ps" "$TMP/out"'
run var ls -l "${T[@]}"
check "x is replaced where it is now, its slot follows it, the stray copy is gone" \
	'[[ $(grep -c "^x " "$TMP/out") -eq 1 && $(grep -c "^x.momentum " "$TMP/out") -eq 1 ]] &&
	 grep -q "^x .*ps/0$" "$TMP/out" && grep -q "^x.momentum .*ps/0$" "$TMP/out"'
run var get x.momentum "${T[@]}"
check_out "the slot has its saved value" 0 "$(printf '# float32 [2,3]\n2 2 2\n2 2 2')"

# names whose NAME.npy cannot be a file of its own go to #/N.npy
"$DG" var put a "${T[@]}" --value '[1,2]' >/dev/null
"$DG" var put a.npy/b "${T[@]}" --value '[3]' >/dev/null
"$DG" var put manifest.json/x "${T[@]}" --value '[4]' >/dev/null
run checkpoint save "$TMP/ck3" "${T[@]}"
check "names that collide as files (a and a.npy/b, manifest.json/x) still save" \
	'[[ $rc -eq 0 ]] && grep -q "\"file\":\"#/1.npy\"" "$TMP/ck3/manifest.json" &&
	 grep -q "\"file\":\"#/2.npy\"" "$TMP/ck3/manifest.json"'
"$DG" var rm a "${T[@]}" >/dev/null
"$DG" var put a.npy/b "${T[@]}" --value '[0]' >/dev/null
"$DG" var put manifest.json/x "${T[@]}" --value '[0]' >/dev/null
run checkpoint restore "$TMP/ck3" "${T[@]}"
vals=$(for v in a a.npy/b manifest.json/x; do "$DG" var get "$v" "${T[@]}" | tail -n 1; done |
	tr '\n' ' ')
check "  ... and restore them (a = 1 2, a.npy/b = 3, manifest.json/x = 4)" \
	'[[ $rc -eq 0 && $vals == "1 2 3 4 " ]]'

for f in "$TMP"/*.log; do
	if grep -qE 'Sanitizer|runtime error:' "$f"; then
		failed=$((failed + 1))
		echo "FAIL - sanitizer report in $f"
		head -c 2000 "$f"
	fi
done
summary
