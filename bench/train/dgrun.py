"""Small helpers shared by bench/train's scripts: one HTTP request to a dg server, and
the CPU time of the server processes."""
import json
import os
import urllib.error
import urllib.request


def http(method, url, body=None, timeout=60):
    """(status, body bytes) of one request; JSON-encodes body when it is not bytes."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def cpu_s(pids):
    """CPU seconds (user + system, all threads) the processes pids have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])     # utime, stime (fields 14, 15)
    return total / tick
