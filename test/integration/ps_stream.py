#!/usr/bin/env python3
"""Stream driver and checker of test_ps_durability.sh (stdlib only).

stream PORT COUNT NVARS LOG: PUT COUNT small tensors over one kept-alive
  connection, variable d/v{seq % NVARS}, value int64 [seq, 3*seq+1] (the second
  element checks the first). Before each request a line "S var seq" is written
  to LOG, after each acknowledged one (200/201) "A var seq version epoch";
  unbuffered, so the log survives a kill of the server (or of this process).
  Stops at the first failed request (the server was killed) with status 3.
check PORT LOG EPOCH_BEFORE: read every variable back from the restarted server
  and print one "PASS - ..." / "FAIL - ..." line per check, then "N M"
  (passed, failed) on the last line.
applies PORT NCLIENTS NVARS LOG: NCLIENTS threads, each on its own kept-alive
  connection, apply assign_add of 1.0 to float64 scalars a/v{i % NVARS} until a
  request fails (the server was killed); "A var version epoch" per acknowledged
  apply and "S var" before each one go to LOG.
versions PORT [--strict] LOG...: after a restart, every variable's version
  must be above every version acknowledged in the LOGs (the runs before), and
  its value at most the applies sent to it; with --strict (the server ran with
  --durability strict) also at least the applies acknowledged: none was lost.
  Prints PASS/FAIL lines and "N M".
"""
import http.client
import json
import os
import struct
import sys


def stream(port, count, nvars, log_path):
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for seq in range(count):
        name = "d/v%d" % (seq % nvars)
        os.write(fd, b"S %s %d\n" % (name.encode(), seq))
        body = struct.pack("<qq", seq, 3 * seq + 1)
        try:
            conn.request("PUT", "/v1/vars/" + name, body=body,
                         headers={"Dg-Dtype": "int64", "Dg-Shape": "2",
                                  "Content-Type": "application/octet-stream"})
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException) as e:
            print("stream: request %d failed: %s" % (seq, e), file=sys.stderr)
            return 3
        if resp.status not in (200, 201):
            print("stream: request %d answered %d" % (seq, resp.status), file=sys.stderr)
            return 3
        os.write(fd, b"A %s %d %s %s\n" % (name.encode(), seq,
                                          resp.getheader("Dg-Version", "0").encode(),
                                          resp.getheader("Dg-Epoch", "0").encode()))
    os.close(fd)
    return 0


def read_log(log_path):
    """sent[var] = set of seqs; acked[var] = (last seq, its version); epochs seen."""
    sent, acked, epochs = {}, {}, set()
    with open(log_path, "rb") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3 or not line.endswith(b"\n"):
                continue    # a line cut by the kill
            var, seq = parts[1].decode(), int(parts[2])
            if parts[0] == b"S":
                sent.setdefault(var, set()).add(seq)
            elif parts[0] == b"A" and len(parts) == 5:
                acked[var] = (seq, int(parts[3]))
                epochs.add(int(parts[4]))
    return sent, acked, epochs


def check(port, log_path, epoch_before):
    sent, acked, epochs = read_log(log_path)
    passed = failed = 0

    def result(ok, what):
        nonlocal passed, failed
        print(("PASS - " if ok else "FAIL - ") + what)
        if ok:
            passed += 1
        else:
            failed += 1

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    n_acked = sum(1 for _ in acked)
    result(n_acked > 0, "some assignments were acknowledged before the kill (%d variables)"
           % n_acked)
    result(epochs == {epoch_before}, "every acknowledgement carried epoch %d" % epoch_before)
    lost = stale_version = bad_value = 0
    epoch_after = 0
    for var in sorted(sent):
        conn.request("GET", "/v1/vars/" + var)
        resp = conn.getresponse()
        body = resp.read()
        epoch_after = int(resp.getheader("Dg-Epoch", "0"))
        if var not in acked:
            # never acknowledged: absent, or a value that was sent
            if resp.status == 200:
                seq, chk = struct.unpack("<qq", body)
                if seq not in sent[var] or chk != 3 * seq + 1:
                    bad_value += 1
            continue
        last_seq, last_version = acked[var]
        if resp.status != 200 or len(body) != 16:
            lost += 1
            print("  %s: status %d, %d bytes after restart" % (var, resp.status, len(body)))
            continue
        seq, chk = struct.unpack("<qq", body)
        if seq < last_seq:
            lost += 1
            print("  %s: holds seq %d, acknowledged %d" % (var, seq, last_seq))
        if seq not in sent[var] or chk != 3 * seq + 1:
            bad_value += 1
            print("  %s: holds [%d, %d], never sent" % (var, seq, chk))
        if int(resp.getheader("Dg-Version", "0")) < last_version:
            stale_version += 1
            print("  %s: version %s < acknowledged %d" % (var, resp.getheader("Dg-Version"),
                                                        last_version))
    result(lost == 0, "every acknowledged assignment survived kill -9 (%d lost)" % lost)
    result(bad_value == 0, "every value read back is one that was sent (%d not)" % bad_value)
    result(stale_version == 0, "no version went backwards (%d did)" % stale_version)
    result(epoch_after > epoch_before, "the epoch increased across the restart (%d -> %d)"
           % (epoch_before, epoch_after))
    # A new write continues above every version handed out before the kill.
    top = max((v for _, v in acked.values()), default=0)
    conn.request("PUT", "/v1/vars/d/after", body=struct.pack("<qq", 1, 4),
                 headers={"Dg-Dtype": "int64", "Dg-Shape": "2"})
    resp = conn.getresponse()
    resp.read()
    new_version = int(resp.getheader("Dg-Version", "0"))
    result(resp.status == 201 and new_version > top,
           "a write after the restart gets version %d > %d" % (new_version, top))
    conn.request("GET", "/v1/vars?prefix=d/")
    listing = json.loads(conn.getresponse().read())
    names = {v["name"] for v in listing["vars"]}
    result(set(acked) <= names, "the list shows every acknowledged variable")
    print("%d %d" % (passed, failed))
    return 0


def applies(port, nclients, nvars, log_path):
    import threading
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    one = struct.pack("<d", 1.0)

    def client(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        i = k
        while True:
            name = "a/v%d" % (i % nvars)
            i += nclients
            os.write(fd, b"S %s\n" % name.encode())
            try:
                conn.request("POST", "/v1/vars/%s/apply?rule=assign_add" % name, body=one,
                             headers={"Content-Type": "application/octet-stream",
                                      "Prefer": "return=minimal"})
                resp = conn.getresponse()
                resp.read()
            except (OSError, http.client.HTTPException):
                return
            if resp.status not in (200, 204):
                return
            os.write(fd, b"A %s %s %s\n" % (name.encode(),
                                            resp.getheader("Dg-Version", "0").encode(),
                                            resp.getheader("Dg-Epoch", "0").encode()))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(nclients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.close(fd)
    return 3


def versions(port, logs, strict=False):
    top, sent, acked = {}, {}, {}
    for log_path in logs:
        with open(log_path, "rb") as f:
            for line in f:
                parts = line.split()
                if not line.endswith(b"\n") or not parts:
                    continue
                if parts[0] == b"S" and len(parts) == 2:
                    sent[parts[1].decode()] = sent.get(parts[1].decode(), 0) + 1
                elif parts[0] == b"A" and len(parts) == 4:
                    var, v = parts[1].decode(), int(parts[2])
                    top[var] = max(top.get(var, 0), v)
                    acked[var] = acked.get(var, 0) + 1
    passed = failed = 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    back = over = lost = 0
    for var in sorted(top):
        conn.request("GET", "/v1/vars/" + var, headers={"Accept": "application/octet-stream"})
        resp = conn.getresponse()
        body = resp.read()
        version = int(resp.getheader("Dg-Version", "0"))
        value = struct.unpack("<d", body)[0] if len(body) == 8 else -1
        if version <= top[var]:
            back += 1
            print("  %s: version %d after the restart, %d acknowledged before" %
                  (var, version, top[var]))
        if value < 0 or value > sent.get(var, 0):
            over += 1
            print("  %s: value %g, %d applies sent" % (var, value, sent.get(var, 0)))
        if strict and value < acked[var]:
            lost += 1
            print("  %s: value %g, %d applies acknowledged" % (var, value, acked[var]))
    checks = [(len(top) > 0, "applies were acknowledged before the kill"),
              (back == 0, "every version is above all acknowledged before the kill "
               "(%d not)" % back),
              (over == 0, "no value counts more applies than were sent (%d does)" % over)]
    if strict:
        checks.append((lost == 0, "every acknowledged apply is in the value (%d variables "
                       "lost some; %d applies acknowledged)" % (lost, sum(acked.values()))))
    for ok, what in checks:
        print(("PASS - " if ok else "FAIL - ") + what)
        passed += ok
        failed += not ok
    print("%d %d" % (passed, failed))
    return 0


def main(argv):
    if len(argv) == 6 and argv[1] == "applies":
        return applies(int(argv[2]), int(argv[3]), int(argv[4]), argv[5])
    if len(argv) >= 5 and argv[1] == "versions" and argv[3] == "--strict":
        return versions(int(argv[2]), argv[4:], strict=True)
    if len(argv) >= 4 and argv[1] == "versions":
        return versions(int(argv[2]), argv[3:])
    if len(argv) == 6 and argv[1] == "stream":
        return stream(int(argv[2]), int(argv[3]), int(argv[4]), argv[5])
    if len(argv) == 5 and argv[1] == "check":
        return check(int(argv[2]), argv[3], int(argv[4]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
