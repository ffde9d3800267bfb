#!/usr/bin/env bash
# A cluster served over TLS (dg server --tls-cert/--tls-key, one self-signed
# certificate for 127.0.0.1 the test makes with openssl) and a bearer token:
# https answers, plain HTTP does not; dg commands reach it with --ca (or
# $DG_CA) and say what to do without it or with the wrong CA; the workers and
# the ps talk https among themselves (a dg submit runs); the mount reads and
# writes through --ca; a key file others may read, a key without its
# certificate and a CA file that is no certificate are refused.
# Usage: test_tls.sh PATH/TO/dg   (exit 77 = skipped without openssl)
set -uo pipefail

DG=${1:?usage: test_tls.sh PATH/TO/dg}
SRC=${DG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if ! command -v openssl >/dev/null; then
	echo "SKIP: openssl is not installed (apt-get install openssl)"
	exit 77
fi
cluster_script_init
MNT=
mount_cleanup() {
	[[ -n $MNT ]] && { fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null; }
	cluster_cleanup
}
trap mount_cleanup EXIT

cert() {   # NAME: NAME.pem and NAME.key, a self-signed certificate for 127.0.0.1
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-keyout "$TMP/$1.key" -out "$TMP/$1.pem" -days 2 -subj /CN=localhost \
		-addext "subjectAltName=IP:127.0.0.1,DNS:localhost" 2>"$TMP/openssl.err" &&
		chmod 600 "$TMP/$1.key"
}
cert cluster || { cat "$TMP/openssl.err"; echo "0 passed, 1 failed"; exit 1; }
cert other
head -c 24 /dev/urandom | base64 >"$TMP/token"
chmod 600 "$TMP/token"
TOK=$(cat "$TMP/token")

# --- bad input first: nothing may start ---------------------------------------
echo '{"ps": ["127.0.0.1:0"]}' >"$TMP/one.json"
cp "$TMP/cluster.key" "$TMP/open.key"
chmod 644 "$TMP/open.key"
run ps --cluster "$TMP/one.json" --tls-cert "$TMP/cluster.pem" --tls-key "$TMP/open.key"
check_err "a TLS key others may read is refused with the chmod hint" 2 "chmod 600 $TMP/open.key"
run ps --cluster "$TMP/one.json" --tls-cert "$TMP/cluster.pem"
check_err "--tls-cert without --tls-key is a usage error" 1 "--tls-cert and --tls-key go together"
run ps --cluster "$TMP/one.json" --tls-cert "$TMP/token" --tls-key "$TMP/cluster.key"
check_err "a certificate file that is not PEM is refused" 2 "is not PEM"
run var ls --server 127.0.0.1:1 --ca "$TMP/cluster.key"
check_err "--ca naming a key, not a certificate, is refused" 2 "is not a PEM file of certificates"
run var ls --server 127.0.0.1:1 --ca "$TMP/nope.pem"
check_err "--ca naming a missing file says so" 3 "cannot read the CA file"

# --- the cluster: 1 ps + 2 workers, TLS and a token -------------------------------
SERVER_EXTRA=(--tls-cert "$TMP/cluster.pem" --tls-key "$TMP/cluster.key" --token-file "$TMP/token")
start_small_cluster
C=(--cluster "$TMP/cluster.json" --token-file "$TMP/token")

curl -s --cacert "$TMP/cluster.pem" -H "Authorization: Bearer $TOK" \
	"https://127.0.0.1:$P0/v1/health" >"$TMP/out"
rc=$?
check_out "https answers /v1/health" 0 "$(cat "$TMP/out")"
grep -q '"status":"ok"' "$TMP/out" && ok "its health is ok" || not_ok "its health is ok"
rc=0
curl -s -m 5 -o /dev/null "http://127.0.0.1:$P0/v1/health" || rc=$?
[[ $rc -ne 0 ]] && ok "plain HTTP gets no answer (curl exit $rc)" ||
	not_ok "plain HTTP gets no answer"
echo | openssl s_client -connect "127.0.0.1:$P0" -CAfile "$TMP/cluster.pem" \
	-verify_return_error >"$TMP/s_client" 2>&1
grep -q "Verify return code: 0 (ok)" "$TMP/s_client" &&
	ok "openssl s_client verifies the server's certificate against the CA" ||
	not_ok "openssl s_client verifies the server's certificate against the CA"

run var put w --value '[1, 2, 3]' --dtype float32 "${C[@]}" --ca "$TMP/cluster.pem"
check_err_free() { [[ $rc -eq 0 ]] && ok "$1" || not_ok "$1"; }
check_err_free "dg var put --ca over https"
run var get w "${C[@]}" --ca "$TMP/cluster.pem"
check_out "dg var get --ca reads it back" 0 "# float32 [3]
1 2 3"
DG_CA=$TMP/cluster.pem run var ls "${C[@]}"
check_out "DG_CA works as --ca" 0 "w"
# an .npy of 2^21 float32 (8 MiB), written without numpy
python3 -c '
import struct, sys
n = 2 << 20
h = "{\x27descr\x27: \x27<f4\x27, \x27fortran_order\x27: False, \x27shape\x27: (%d,), }" % n
h += " " * (127 - 10 - len(h)) + "\n"
sys.stdout.buffer.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() +
                        struct.pack("<%df" % n, *range(n)))' >"$TMP/big.npy"
run var put big "$TMP/big.npy" "${C[@]}" --ca "$TMP/cluster.pem"
check_err_free "an 8 MiB variable goes up over https"
run var get big --format npy -o "$TMP/big2.npy" "${C[@]}" --ca "$TMP/cluster.pem"
cmp -s "$TMP/big.npy" "$TMP/big2.npy" && [[ $rc -eq 0 ]] &&
	ok "and comes back the same" || not_ok "and comes back the same"

run var ls "${C[@]}"
check_err "without --ca: exit 10 and the hint to give it" 10 "give --ca FILE"
run var ls "${C[@]}" --ca "$TMP/other.pem"
check_err "with another CA: the certificate check fails, exit 10" 10 "TLS failed"

# --- the workers and the ps among themselves ----------------------------------------
run submit "$SRC/examples/seed_sum.json" "${C[@]}" --ca "$TMP/cluster.pem"
check_out "dg submit runs the seed program across the TLS cluster" 0 "238"

# --- the mount ----------------------------------------------------------------------
if [[ -e /dev/fuse ]] && command -v fusermount3 >/dev/null; then
	MNT=$TMP/mnt
	mkdir -p "$MNT"
	"$DG" mount "$MNT" "${C[@]}" --ca "$TMP/cluster.pem" 2>"$TMP/mount.log" &
	mpid=$!
	for _ in $(seq 1 100); do [[ -e $MNT/vars ]] && break; sleep 0.05; done
	[[ "$(tail -n 1 "$MNT/text/w" 2>/dev/null)" == "1 2 3" ]] &&
		ok "the mount reads a variable over https" ||
		{ rc=1; not_ok "the mount reads a variable over https"; }
	cmp -s "$MNT/npy/big.npy" "$TMP/big.npy" &&
		ok "a cold 8 MiB read through the mount comes over https" ||
		{ rc=1; not_ok "a cold 8 MiB read through the mount comes over https"; }
	cp "$TMP/big.npy" "$MNT/npy/big2.npy" 2>"$TMP/err" &&
		run var get big2 --format npy -o "$TMP/big3.npy" "${C[@]}" --ca "$TMP/cluster.pem" &&
		cmp -s "$TMP/big.npy" "$TMP/big3.npy" &&
		ok "cp of 8 MiB into the mount streams it up over https" ||
		{ rc=1; not_ok "cp of 8 MiB into the mount streams it up over https"; }
	# a DELETE, then a streamed PUT on the mount's kept client: still a PUT
	rm "$MNT/vars/big2" && cp "$TMP/big.npy" "$MNT/npy/big3.npy" 2>"$TMP/err" &&
		run var get big3 --format npy -o "$TMP/big4.npy" "${C[@]}" --ca "$TMP/cluster.pem" &&
		cmp -s "$TMP/big.npy" "$TMP/big4.npy" &&
		ok "after an rm, a cp through the mount is still a PUT over https" ||
		{ rc=1; not_ok "after an rm, a cp through the mount is still a PUT over https"; }
	fusermount3 -u "$MNT"
	wait "$mpid" && ok "the mount exits 0" || { rc=1; not_ok "the mount exits 0"; }
	MNT=
else
	echo "skip - the mount checks: no /dev/fuse"
fi

stop_clean ps w0 w1 && ok "the servers stop cleanly, no sanitizer report" ||
	not_ok "the servers stop cleanly, no sanitizer report"

# --- dg up: every task with the certificate, a restart too -----------------------------
U=$TMP/up
run up --dir "$U" --ps 1 --workers 1 --no-supervise --tls-cert "$TMP/cluster.pem" \
	--tls-key "$TMP/cluster.key"
[[ $rc -eq 0 ]] && ok "dg up --tls-cert/--tls-key starts a TLS cluster" ||
	not_ok "dg up --tls-cert/--tls-key starts a TLS cluster"
run status --cluster "$U/cluster.json" --ca "$TMP/cluster.pem"
[[ $rc -eq 0 ]] && grep -qE '^ *worker/0 .* yes' "$TMP/out" &&
	ok "dg status --ca reaches every task" || not_ok "dg status --ca reaches every task"
run status --cluster "$U/cluster.json"
[[ $rc -ne 0 ]] && grep -qF -- "--ca" "$TMP/err" && ok "dg status without --ca says to give it" ||
	not_ok "dg status without --ca says to give it"
kill -9 "$(cut -d' ' -f1 "$U/worker-0.pid")"
sleep 0.3
run up --restart worker/0 --dir "$U"
[[ $rc -eq 0 ]] && tr '\0' ' ' <"/proc/$(cut -d' ' -f1 "$U/worker-0.pid")/cmdline" |
	grep -qF -- "--tls-cert $TMP/cluster.pem" &&
	ok "dg up --restart starts the task with TLS again" ||
	not_ok "dg up --restart starts the task with TLS again"
run down --dir "$U"
[[ $rc -eq 0 ]] && ok "dg down stops the TLS cluster" || not_ok "dg down stops the TLS cluster"
summary
