#!/usr/bin/env bash
# A real `dg ps` driven by curl alone: create a variable, read it in all three
# encodings (raw, .npy, text), partially overwrite it (PATCH), update it
# (apply), read a Range, wait on a version, delete it; numpy loads what
# `curl -H 'Accept: application/x-npy'` returns and curl PUTs what numpy saves;
# a server with --token-file refuses requests without the token; SIGTERM stops
# the server with exit status 0.
# Usage: test_ps_curl.sh PATH/TO/dg   (exit 77 = skipped when curl is missing)
set -uo pipefail

DG=${1:?usage: test_ps_curl.sh PATH/TO/dg}
PY=/usr/bin/python3

if ! command -v curl >/dev/null; then
	echo "skipped: curl not found"
	exit 77
fi

TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do
		kill -9 "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	rm -rf "$TMP"
}
trap cleanup EXIT

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# check DESCRIPTION COMMAND...: run the command, count and report the result.
check() {
	local what=$1
	shift
	if "$@"; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		echo "FAIL - $what"
	fi
}

# start_ps NAME [ARGS...]: start `dg ps` on a free loopback port; sets PID, PORT.
start_ps() {
	local name=$1
	shift
	echo '{"ps": ["127.0.0.1:0"]}' >"$TMP/cluster.json"
	rm -f "$TMP/$name.port"
	"$DG" ps --cluster "$TMP/cluster.json" --port-file "$TMP/$name.port" "$@" \
		2>"$TMP/$name.log" &
	PID=$!
	PIDS+=("$PID")
	PORT=$(wait_port "$TMP/$name.port" 200)
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

check "dg ps starts and writes its port file" start_ps main
check "the ready line names the address, epoch and storage" \
	grep -q "dg: ps/0 serving on 127.0.0.1:$PORT (epoch 1, memory only, 0 variables)" \
	"$TMP/main.log"
check "memory-only mode is warned about" grep -q "no --data-dir" "$TMP/main.log"

# float32 [2,3] = 1 2 3 4 5 6, little-endian.
printf '\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40' >"$TMP/w.bin"
printf '\x00\x00\x80\x40\x00\x00\xa0\x40\x00\x00\xc0\x40' >>"$TMP/w.bin"
code=$(req PUT /v1/vars/model/w -H 'Dg-Dtype: float32' -H 'Dg-Shape: 2,3' \
	--data-binary @"$TMP/w.bin")
check "PUT raw creates the variable (201)" test "$code" = 201
check "PUT answers the version as JSON" grep -q '"version":' "$TMP/body"
version=$(header Dg-Version)

code=$(req GET /v1/vars/model/w)
check "GET raw answers 200" test "$code" = 200
check "GET raw returns the bytes PUT" cmp -s "$TMP/body" "$TMP/w.bin"
check "GET has Dg-Dtype float32" test "$(header Dg-Dtype)" = float32
check "GET has Dg-Shape 2,3" test "$(header Dg-Shape)" = 2,3
check "GET has ETag \"V\"" test "$(header ETag)" = "\"$version\""
check "GET has Dg-Epoch 1" test "$(header Dg-Epoch)" = 1

code=$(req GET /v1/vars/model/w -H 'Accept: text/plain')
check "GET text answers 200" test "$code" = 200
check "GET text is the header line and one row per line" \
	test "$(cat "$TMP/body")" = "$(printf '# float32 [2,3]\n1 2 3\n4 5 6')"

code=$(req GET /v1/vars/model/w -H 'Accept: application/x-npy')
cp "$TMP/body" "$TMP/w.npy"
check "GET npy answers 200" test "$code" = 200
check "GET npy starts with the NumPy magic" \
	test "$(head -c 6 "$TMP/w.npy" | tail -c 5)" = NUMPY
check "GET npy has Content-Type application/x-npy" \
	test "$(header Content-Type)" = application/x-npy

code=$(req PUT /v1/vars/model/w -H 'Content-Type: text/plain' \
	--data-binary $'# float32 [2,3]\n1 2 3\n4 5 6\n')
check "PUT text replaces the value (200)" test "$code" = 200

# 9.0f = 00 00 10 41, written over element 1 (bytes 4..7).
code=$(printf '\x00\x00\x10\x41' | req PATCH /v1/vars/model/w \
	-H 'Content-Range: bytes 4-7/24' --data-binary @-)
check "PATCH of element 1 answers 200" test "$code" = 200
code=$(req GET /v1/vars/model/w -H 'Accept: text/plain')
check "PATCH changed element 1 only" \
	test "$(tail -n 2 "$TMP/body")" = "$(printf '1 9 3\n4 5 6')"
code=$(printf '\x00\x00' | req PATCH /v1/vars/model/w -H 'Content-Range: bytes 2-3/24' \
	--data-binary @-)
check "a misaligned PATCH is refused (400)" test "$code" = 400
check "the refusal is a JSON error" grep -q '"error":{"code":"invalid_argument"' "$TMP/body"

code=$(req GET /v1/vars/model/w -H 'Range: bytes=4-7')
check "GET with Range answers 206" test "$code" = 206
check "the Range reply is element 1" cmp -s "$TMP/body" <(printf '\x00\x00\x10\x41')
check "Content-Range names the part" test "$(header Content-Range)" = "bytes 4-7/24"

# gradient 2.0 everywhere, sgd with lr 0.5: every element drops by 1.
printf '\x00\x00\x00\x40%.0s' 1 2 3 4 5 6 >"$TMP/g.bin"
code=$(req POST '/v1/vars/model/w/apply?rule=sgd&lr=0.5' --data-binary @"$TMP/g.bin")
check "POST apply sgd answers 200" test "$code" = 200
check "the apply reply says applied" grep -q '"applied":true' "$TMP/body"
code=$(req GET /v1/vars/model/w -H 'Accept: text/plain')
check "sgd moved every element by lr*g" \
	test "$(tail -n 2 "$TMP/body")" = "$(printf '0 8 2\n3 4 5')"
version=$(header Dg-Version)

code=$(req PUT /v1/vars/model/w -H "If-Match: \"$((version + 10))\"" \
	--data-binary @"$TMP/w.bin")
check "PUT with a stale If-Match answers 412" test "$code" = 412
code=$(req PUT /v1/vars/model/w -H "If-Match: \"$version\"" --data-binary @"$TMP/w.bin")
check "PUT with the current If-Match answers 200" test "$code" = 200
code=$(req GET "/v1/vars/model/w?min_version=$((version + 5))&timeout_ms=200")
check "a long poll for a future version times out with 304" test "$code" = 304

code=$(req GET /v1/vars)
check "the list names the variable" grep -q '"name":"model/w"' "$TMP/body"
code=$(req DELETE /v1/vars/model/w)
check "DELETE answers 200" test "$code" = 200
code=$(req GET /v1/vars/model/w)
check "GET after DELETE answers 404" test "$code" = 404
check "the 404 is a not_found JSON error" grep -q '"code":"not_found"' "$TMP/body"

code=$(req GET /v1/health)
check "health answers ok" grep -q '"status":"ok"' "$TMP/body"
code=$(req GET /v1/metrics)
check "metrics count requests" grep -q '^dg_http_requests_total' "$TMP/body"

# numpy: loads what curl fetched; curl PUTs what numpy saved.
if [[ -x $PY ]] && "$PY" -c 'import numpy' 2>/dev/null; then
	check "numpy loads the .npy curl fetched" "$PY" -c '
import sys, numpy as np
a = np.load(sys.argv[1])
sys.exit(0 if a.dtype == np.float32 and a.shape == (2, 3) and
         (a == np.array([[1, 2, 3], [4, 5, 6]], np.float32)).all() else 1)' "$TMP/w.npy"
	"$PY" -c 'import sys, numpy as np
np.save(sys.argv[1], np.arange(12, dtype=np.float64).reshape(3, 4) / 7)' "$TMP/np.npy"
	code=$(req PUT /v1/vars/np/x -H 'Content-Type: application/x-npy' \
		--data-binary @"$TMP/np.npy")
	check "curl PUTs a .npy numpy saved (201)" test "$code" = 201
	code=$(req GET /v1/vars/np/x -H 'Accept: application/x-npy')
	check "numpy reads it back bit for bit" "$PY" -c '
import sys, numpy as np
a = np.load(sys.argv[1])
sys.exit(0 if a.dtype == np.float64 and
         (a == np.arange(12, dtype=np.float64).reshape(3, 4) / 7).all() else 1)' "$TMP/body"
else
	echo "note: numpy checks skipped (/usr/bin/python3 with numpy not found)"
fi

kill -TERM "$PID"
wait "$PID"
check "SIGTERM stops the server with exit status 0" test $? = 0
check "no sanitizer report from the server" \
	bash -c "! grep -qE 'Sanitizer|runtime error:' '$TMP/main.log'"

printf 's3cret-token\n' >"$TMP/token"
check "dg ps --token-file starts" start_ps auth --token-file "$TMP/token"
code=$(req GET /v1/health)
check "a request without the token answers 401" test "$code" = 401
check "the 401 is an unauthorized JSON error" grep -q '"code":"unauthorized"' "$TMP/body"
code=$(req GET /v1/health -H 'Authorization: Bearer wrong')
check "a wrong token answers 401" test "$code" = 401
code=$(req GET /v1/health -H 'Authorization: Bearer s3cret-token')
check "the right token answers 200" test "$code" = 200
kill -INT "$PID"
wait "$PID"
check "SIGINT stops the server with exit status 0" test $? = 0

"$DG" ps --cluster /nonexistent/cluster.json 2>"$TMP/err.log"
rc=$?
check "a missing cluster file fails with 'not found' (exit 3)" test "$rc" = 3
check "the error names the file" grep -q /nonexistent/cluster.json "$TMP/err.log"
"$DG" ps --bogus 2>/dev/null
check "an unknown option is a usage error (exit 1)" test $? = 1
check "dg server --help describes --data-dir" bash -c "'$DG' server --help | grep -q data-dir"

summary
