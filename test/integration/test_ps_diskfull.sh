#!/usr/bin/env bash
# A `dg ps` whose data directory's disk fills up (a tmpfs of 16 MiB the test
# mounts for itself): writes are refused with 507 disk_full in JSON, reads go
# on, /v1/health says degraded and why, dg_ps_disk_full says 1; once room is
# made on that disk the server takes writes again and its health comes back to
# ok by itself; a SIGTERM whose final snapshot cannot be written exits 20 (not
# 0), and a restart serves every acknowledged write. The mount is undone on
# every exit path.
# Usage: test_ps_diskfull.sh PATH/TO/dg   (exit 77 = skipped: cannot mount a tmpfs)
set -uo pipefail

DG=${1:?usage: test_ps_diskfull.sh PATH/TO/dg}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ps_script_init          # TMP, PIDS and the EXIT trap that kills them

DISK=$TMP/disk
mkdir -p "$DISK"
if ! mount -t tmpfs -o size=16m,mode=0700 dg-test-disk "$DISK" 2>"$TMP/mount.err"; then
	echo "SKIP: cannot mount a tmpfs for the full disk ($(head -c 200 "$TMP/mount.err")): needs root"
	exit 77
fi
cleanup_disk() {
	ps_kill_all             # they hold files on the disk
	umount "$DISK" 2>/dev/null || umount -l "$DISK" 2>/dev/null
	ps_cleanup
}
trap cleanup_disk EXIT

URL=
put_var() {   # NAME BYTES-FILE: prints the HTTP status, the body to $TMP/body
	curl -s -o "$TMP/body" -w '%{http_code}' -X PUT -H 'Dg-Dtype: float32' \
		-H "Dg-Shape: $(($(stat -c %s "$2") / 4))" \
		-H 'Content-Type: application/octet-stream' --data-binary @"$2" "$URL/v1/vars/$1"
}
health() { curl -s "$URL/v1/health"; }
metric() { curl -s "$URL/v1/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }

# 12 MiB kept by a file the test removes later (a snapshot then fits: it needs
# room for a whole copy); the ps fills the rest
dd if=/dev/zero of="$DISK/room" bs=1M count=12 status=none
start_one_ps run0 400 --data-dir "$DISK/data" --checkpoint-secs 1
URL=http://127.0.0.1:$PORT
check_cmd "dg ps starts on the small disk" test -n "$PORT"

head -c 262144 /dev/urandom >"$TMP/v.bin"
code=201
n=0
while [[ $code = 201 && $n -lt 40 ]]; do
	code=$(put_var "v$n" "$TMP/v.bin")
	[[ $code = 201 ]] && n=$((n + 1))
done
check_cmd "PUTs fill the disk, then one is refused with 507 (after $n)" test "$code" = 507
check_cmd "the refusal is JSON disk_full that names the data directory" \
	python3 -c "
import json, sys
e = json.load(open('$TMP/body'))['error']
sys.exit(not (e['code'] == 'disk_full' and
              e['message'].startswith(\"the disk of '$DISK/data' is full\") and
              'free space' in e['hint']))"
check_cmd "reads go on: a variable written before is served" \
	bash -c "curl -sf -o '$TMP/get' '$URL/v1/vars/v0' && cmp -s '$TMP/get' '$TMP/v.bin'"
health >"$TMP/h.json"
check_cmd "/v1/health says degraded: the disk is full" \
	python3 -c "
import json, sys
h = json.load(open('$TMP/h.json'))
sys.exit(not (h['status'] == 'degraded' and 'disk of the data directory is full' in h['degraded']))"
check_cmd "dg_ps_disk_full is 1" test "$(metric dg_ps_disk_full)" = 1
code=$(put_var "v$n" "$TMP/v.bin")
check_cmd "a PUT while the disk is full is refused again (507), nothing half-made" \
	bash -c "test $code = 507 && test \$(curl -s -o /dev/null -w '%{http_code}' '$URL/v1/vars/v$n') = 404"

# make room: the server takes writes again and its health comes back by itself
rm -f "$DISK/room"
code=$(put_var "v$n" "$TMP/v.bin")
check_cmd "with room made, the same PUT succeeds (201)" test "$code" = 201
ok_again=false
for _ in $(seq 1 100); do
	health >"$TMP/h.json"
	grep -q '"status":"ok"' "$TMP/h.json" && { ok_again=true; break; }
	sleep 0.1
done
check_cmd "/v1/health is ok again within 10 s, no restart" $ok_again
check_cmd "dg_ps_disk_full is 0 again" test "$(metric dg_ps_disk_full)" = 0
check_cmd "dg_ps_checkpoint_failures_total is exported" \
	bash -c "[[ \$(curl -s '$URL/v1/metrics' | grep -c '^dg_ps_checkpoint_failures_total ') = 1 ]]"

# a SIGTERM whose final snapshot finds the disk full exits 20 and says why
dd if=/dev/zero of="$DISK/fill" bs=64k status=none 2>/dev/null
python3 -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<65536f", *([1.0] * 65536)))' \
	>"$TMP/g.bin"
code=$(curl -s -o "$TMP/body" -w '%{http_code}' -X POST \
	-H 'Content-Type: application/octet-stream' --data-binary @"$TMP/g.bin" \
	"$URL/v1/vars/v0/apply?rule=sgd&lr=0.5")
check_cmd "an sgd apply (not logged by default) is acknowledged on the full disk ($code)" \
	test "$code" = 200
kill -TERM "$PID"
wait "$PID"
rc=$?
check_cmd "SIGTERM with a final snapshot that cannot be written exits 20 ($rc)" test $rc = 20
check_cmd "and says that the final snapshot failed on a full disk" \
	grep -q "final snapshot.*No space left on device" "$TMP/run0.log"

rm -f "$DISK/fill"
start_one_ps run1 400 --data-dir "$DISK/data" --checkpoint-secs 1
URL=http://127.0.0.1:$PORT
# (v0's sgd apply is gone with the failed snapshot: the default durability)
check_cmd "the restart serves every acknowledged PUT ($((n + 1)))" \
	bash -c "for i in \$(seq 0 $n); do curl -sf -o '$TMP/get' '$URL/v1/vars/v'\$i &&
		 cmp -s '$TMP/get' '$TMP/v.bin' || exit 1; done"
check_cmd "no sanitizer report from the servers" \
	bash -c "! cat '$TMP'/run*.log | grep -qE 'Sanitizer|runtime error:'"
summary
