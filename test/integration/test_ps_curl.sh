#!/usr/bin/env bash
# A real `dg ps` driven by curl alone: create a variable, read it in all three
# encodings (raw, .npy, text), partially overwrite it (PATCH), update it
# (apply), read a Range, wait on a version, delete it; numpy loads what
# `curl -H 'Accept: application/x-npy'` returns and curl PUTs what numpy saves;
# a server with --token-file refuses requests without the token; SIGTERM stops
# the server with exit status 0.
# Usage: test_ps_curl.sh PATH/TO/dg   (exit 77 = skipped when curl is missing;
# KEEP_TMP=1 keeps the logs for a look afterwards)
set -uo pipefail

DG=${1:?usage: test_ps_curl.sh PATH/TO/dg}
PY=/usr/bin/python3

if ! command -v curl >/dev/null; then
	echo "skipped: curl not found"
	exit 77
fi

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ps_script_init          # TMP, PIDS and the EXIT trap that kills them

# start_ps NAME [ARGS...]: start `dg ps` on a free loopback port; sets PID, PORT.
start_ps() {
	start_one_ps "$1" 200 "${@:2}"
}

# req METHOD PATH [CURL ARGS...]: body to $TMP/body, headers to $TMP/head;
# prints the status code.
req() {
	local method=$1 path=$2
	shift 2
	curl -sS -X "$method" -o "$TMP/body" -D "$TMP/head" -w '%{http_code}' "$@" \
		"http://127.0.0.1:$PORT$path"
}

# header NAME: the value of a response header of the last req.
header() {
	grep -i "^$1:" "$TMP/head" | head -n 1 | cut -d' ' -f2- | tr -d '\r'
}

check_cmd "dg ps starts and writes its port file" start_ps main
check_cmd "the ready line names the address, epoch and storage" \
	grep -q "dg: ps/0 serving on 127.0.0.1:$PORT (epoch 1, memory only, 0 variables)" \
	"$TMP/main.log"
check_cmd "memory-only mode is warned about" grep -q "no --data-dir" "$TMP/main.log"

# float32 [2,3] = 1 2 3 4 5 6, little-endian.
printf '\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40' >"$TMP/w.bin"
printf '\x00\x00\x80\x40\x00\x00\xa0\x40\x00\x00\xc0\x40' >>"$TMP/w.bin"
code=$(req PUT /v1/vars/model/w -H 'Dg-Dtype: float32' -H 'Dg-Shape: 2,3' \
	--data-binary @"$TMP/w.bin")
check_cmd "PUT raw creates the variable (201)" test "$code" = 201
check_cmd "PUT answers the version as JSON" grep -q '"version":' "$TMP/body"
version=$(header Dg-Version)

code=$(req GET /v1/vars/model/w)
check_cmd "GET raw answers 200" test "$code" = 200
check_cmd "GET raw returns the bytes PUT" cmp -s "$TMP/body" "$TMP/w.bin"
check_cmd "GET has Dg-Dtype float32" test "$(header Dg-Dtype)" = float32
check_cmd "GET has Dg-Shape 2,3" test "$(header Dg-Shape)" = 2,3
check_cmd "GET has ETag \"V\"" test "$(header ETag)" = "\"$version\""
check_cmd "GET has Dg-Epoch 1" test "$(header Dg-Epoch)" = 1

code=$(req GET /v1/vars/model/w -H 'Accept: text/plain')
check_cmd "GET text answers 200" test "$code" = 200
check_cmd "GET text is the header line and one row per line" \
	test "$(cat "$TMP/body")" = "$(printf '# float32 [2,3]\n1 2 3\n4 5 6')"

code=$(req GET /v1/vars/model/w -H 'Accept: application/x-npy')
cp "$TMP/body" "$TMP/w.npy"
check_cmd "GET npy answers 200" test "$code" = 200
check_cmd "GET npy starts with the NumPy magic" \
	test "$(head -c 6 "$TMP/w.npy" | tail -c 5)" = NUMPY
check_cmd "GET npy has Content-Type application/x-npy" \
	test "$(header Content-Type)" = application/x-npy

code=$(req PUT /v1/vars/model/w -H 'Content-Type: text/plain' \
	--data-binary $'# float32 [2,3]\n1 2 3\n4 5 6\n')
check_cmd "PUT text replaces the value (200)" test "$code" = 200

# 9.0f = 00 00 10 41, written over element 1 (bytes 4..7).
code=$(printf '\x00\x00\x10\x41' | req PATCH /v1/vars/model/w \
	-H 'Content-Range: bytes 4-7/24' --data-binary @-)
check_cmd "PATCH of element 1 answers 200" test "$code" = 200
code=$(req GET /v1/vars/model/w -H 'Accept: text/plain')
check_cmd "PATCH changed element 1 only" \
	test "$(tail -n 2 "$TMP/body")" = "$(printf '1 9 3\n4 5 6')"
code=$(printf '\x00\x00' | req PATCH /v1/vars/model/w -H 'Content-Range: bytes 2-3/24' \
	--data-binary @-)
check_cmd "a misaligned PATCH is refused (400)" test "$code" = 400
check_cmd "the refusal is a JSON error" grep -q '"error":{"code":"invalid_argument"' "$TMP/body"

code=$(req GET /v1/vars/model/w -H 'Range: bytes=4-7')
check_cmd "GET with Range answers 206" test "$code" = 206
check_cmd "the Range reply is element 1" cmp -s "$TMP/body" <(printf '\x00\x00\x10\x41')
check_cmd "Content-Range names the part" test "$(header Content-Range)" = "bytes 4-7/24"

# gradient 2.0 everywhere, sgd with lr 0.5: every element drops by 1.
printf '\x00\x00\x00\x40%.0s' 1 2 3 4 5 6 >"$TMP/g.bin"
code=$(req POST '/v1/vars/model/w/apply?rule=sgd&lr=0.5' --data-binary @"$TMP/g.bin")
check_cmd "POST apply sgd answers 200" test "$code" = 200
check_cmd "the apply reply says applied" grep -q '"applied":true' "$TMP/body"
code=$(req GET /v1/vars/model/w -H 'Accept: text/plain')
check_cmd "sgd moved every element by lr*g" \
	test "$(tail -n 2 "$TMP/body")" = "$(printf '0 8 2\n3 4 5')"
version=$(header Dg-Version)

code=$(req PUT /v1/vars/model/w -H "If-Match: \"$((version + 10))\"" \
	--data-binary @"$TMP/w.bin")
check_cmd "PUT with a stale If-Match answers 412" test "$code" = 412
code=$(req PUT /v1/vars/model/w -H "If-Match: \"$version\"" --data-binary @"$TMP/w.bin")
check_cmd "PUT with the current If-Match answers 200" test "$code" = 200
code=$(req GET "/v1/vars/model/w?min_version=$((version + 5))&timeout_ms=200")
check_cmd "a long poll for a future version times out with 304" test "$code" = 304

code=$(req GET /v1/vars)
check_cmd "the list names the variable" grep -q '"name":"model/w"' "$TMP/body"
code=$(req DELETE /v1/vars/model/w)
check_cmd "DELETE answers 200" test "$code" = 200
code=$(req GET /v1/vars/model/w)
check_cmd "GET after DELETE answers 404" test "$code" = 404
check_cmd "the 404 is a not_found JSON error" grep -q '"code":"not_found"' "$TMP/body"

code=$(req GET /v1/health)
check_cmd "health answers ok" grep -q '"status":"ok"' "$TMP/body"
check_cmd "health describes the devices dg server computes on (blas, gpu, gpus, cuda_built)" \
	"$PY" -c 'import json, sys
h = json.load(open(sys.argv[1]))
assert isinstance(h["blas"], str) and h["blas"], h
assert isinstance(h["gpu"], str) and h["gpu"], h
assert isinstance(h["gpus"], list) and isinstance(h["cuda_built"], bool), h' "$TMP/body"
code=$(req GET /v1/metrics)
check_cmd "metrics count the GPUs" grep -q '^dg_gpus [0-9]' "$TMP/body"
check_cmd "metrics count requests" grep -q '^dg_http_requests_total' "$TMP/body"

# numpy: loads what curl fetched; curl PUTs what numpy saved.
if [[ -x $PY ]] && "$PY" -c 'import numpy' 2>/dev/null; then
	check_cmd "numpy loads the .npy curl fetched" "$PY" -c '
import sys, numpy as np
a = np.load(sys.argv[1])
sys.exit(0 if a.dtype == np.float32 and a.shape == (2, 3) and
         (a == np.array([[1, 2, 3], [4, 5, 6]], np.float32)).all() else 1)' "$TMP/w.npy"
	"$PY" -c 'import sys, numpy as np
np.save(sys.argv[1], np.arange(12, dtype=np.float64).reshape(3, 4) / 7)' "$TMP/np.npy"
	code=$(req PUT /v1/vars/np/x -H 'Content-Type: application/x-npy' \
		--data-binary @"$TMP/np.npy")
	check_cmd "curl PUTs a .npy numpy saved (201)" test "$code" = 201
	code=$(req GET /v1/vars/np/x -H 'Accept: application/x-npy')
	check_cmd "numpy reads it back bit for bit" "$PY" -c '
import sys, numpy as np
a = np.load(sys.argv[1])
sys.exit(0 if a.dtype == np.float64 and
         (a == np.arange(12, dtype=np.float64).reshape(3, 4) / 7).all() else 1)' "$TMP/body"
else
	echo "note: numpy checks skipped (/usr/bin/python3 with numpy not found)"
fi

kill -TERM "$PID"
wait "$PID"
check_cmd "SIGTERM stops the server with exit status 0" test $? = 0
check_cmd "no sanitizer report from the server" \
	bash -c "! grep -qE 'Sanitizer|runtime error:' '$TMP/main.log'"

printf 's3cret-token\n' >"$TMP/token"
chmod 644 "$TMP/token"
timeout 10 "$DG" ps --cluster "$TMP/cluster.json" --port 0 --token-file "$TMP/token" \
	>"$TMP/open.out" 2>"$TMP/open.err"
check_cmd "a token file others may read (0644) is refused, with the chmod to fix it" \
	bash -c "grep -q 'token file $TMP/token may be read by others (mode 0644)' '$TMP/open.err' &&
		 grep -q 'hint: chmod 600 $TMP/token' '$TMP/open.err'"
chmod 600 "$TMP/token"
check_cmd "dg ps --token-file starts" start_ps auth --token-file "$TMP/token"
code=$(req GET /v1/health)
check_cmd "a request without the token answers 401" test "$code" = 401
check_cmd "the 401 is an unauthorized JSON error" grep -q '"code":"unauthorized"' "$TMP/body"
code=$(req GET /v1/health -H 'Authorization: Bearer wrong')
check_cmd "a wrong token answers 401" test "$code" = 401
code=$(req GET /v1/health -H 'Authorization: Bearer s3cret-token')
check_cmd "the right token answers 200" test "$code" = 200
kill -INT "$PID"
wait "$PID"
check_cmd "SIGINT stops the server with exit status 0" test $? = 0

"$DG" ps --cluster /nonexistent/cluster.json 2>"$TMP/err.log"
rc=$?
check_cmd "a missing cluster file fails with 'not found' (exit 3)" test "$rc" = 3
check_cmd "the error names the file" grep -q /nonexistent/cluster.json "$TMP/err.log"
"$DG" ps --bogus 2>/dev/null
check_cmd "an unknown option is a usage error (exit 1)" test $? = 1
check_cmd "dg server --help describes --data-dir" bash -c "'$DG' server --help | grep -q data-dir"

summary
