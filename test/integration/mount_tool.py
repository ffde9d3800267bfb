#!/usr/bin/env python3
"""Helpers of test_mount.sh (stdlib only: runs without numpy).

npy OUT DTYPE SHAPE V...      write a .npy file (DTYPE f4|f8|i4|i8, SHAPE "3,2")
raw OUT FMT V...              write little-endian values packed with struct FMT
produce FILE CHUNK...         copy FILE to stdout in writes of the given sizes
                              (cycled), each flushed, with short pauses
writers PATH PROCS ITERS N    PROCS processes each write whole float32 [N]
                              tensors of one constant (its index + 1) ITERS
                              times while 2 readers check that every read is
                              one constant; prints counts, exit 1 on a torn
                              read or an errno other than ESTALE
updates HOST:PORT NAME N PATH...  N PUTs of float32 [65536] filled with k
                              (k = 1..N) while one reader per PATH checks each
                              open sees one whole version, never going back
bulk HOST:PORT N EXPECTED     create N variables through the HTTP API (one
                              kept-alive connection); EXPECTED gets lines
                              "vars-relative-path size", sorted
hold PATH DATA READY GO       open PATH read-write (no truncation), create
                              READY, wait for GO to exist, write DATA at 0,
                              close; prints "ok" or the errno name of the
                              failing call ("write ESTALE" / "close ESTALE")
mapread HOST:PORT NAME PATH   reads of PATH (vars/NAME, float32 [2097152]) opened
                              cold, by read() and by mmap(MAP_SHARED), with the
                              kernel's page cache of the file counted (cachestat);
                              prints key=value lines (see test_mount.sh)
pollwait HOST:PORT NAME PATH N  poll(2) on PATH (vars/NAME, open read-only):
                              nothing after 200 ms with no change; then N
                              times a PUT of NAME through HTTP 100 ms into
                              the wait, timing the wake from the PUT's
                              reply; reopen after each. Prints "idle=..."
                              and "wake_ms=MEDIAN,MAX"; exit 1 on a miss
landing HOST:PORT DIR A B     replacing writes of vars A and B (float32
                              [2097152], in DIR/vars) in the patterns that
                              receive payloads in place or must not: aligned
                              and unaligned buffers, two files interleaved,
                              rewrites, reverse order, 4 threads on one file
                              with other requests in between, two processes;
                              prints one "PATTERN ok|BAD why" line each
"""
import errno
import http.client
import multiprocessing as mp
import os
import struct
import sys
import time
from array import array

CHUNK = 1 << 20


def write_npy(out, dtype, shape, values):
    dims = tuple(int(d) for d in shape.split(",") if d != "")
    fmt = {"f4": "f", "f8": "d", "i4": "i", "i8": "q"}[dtype]
    shape_txt = "(" + "".join("%d," % d for d in dims) + ")" if len(dims) == 1 else \
        "(" + ", ".join(str(d) for d in dims) + ")"
    header = "{'descr': '<%s', 'fortran_order': False, 'shape': %s, }" % (dtype, shape_txt)
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    cast = float if fmt in "fd" else int
    body = struct.pack("<%d%s" % (len(values), fmt), *[cast(v) for v in values])
    with open(out, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(body)


def write_raw(out, fmt, values):
    cast = float if fmt[-1] in "fd" else int
    with open(out, "wb") as f:
        f.write(struct.pack("<" + fmt, *[cast(v) for v in values]))


def produce(path, chunks):
    data = open(path, "rb").read()
    sizes = [int(c) for c in chunks]
    off, i = 0, 0
    while off < len(data):
        n = sizes[i % len(sizes)]
        i += 1
        piece = data[off:off + n]
        while piece:
            k = os.write(1, piece)
            piece = piece[k:]
        off += n
        time.sleep(0.002)
    return 0


def read_whole(path):
    """Read a file in 1 MiB reads: returns its bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                break
            parts.append(b)
        return b"".join(parts)
    finally:
        os.close(fd)


def floats_of(path, numel):
    """(constant, problem): the float32 constant filling the file, or a problem text."""
    data = read_whole(path)
    if path.endswith(".npy"):
        if data[:6] != b"\x93NUMPY":
            return None, "no npy magic (%d bytes)" % len(data)
        hlen = struct.unpack("<H", data[8:10])[0]
        data = data[10 + hlen:]
    if len(data) != 4 * numel:
        return None, "%d bytes, want %d" % (len(data), 4 * numel)
    a = array("f")
    a.frombytes(data)
    first = a[0]
    if a.count(first) != numel:
        bad = next(i for i, v in enumerate(a) if v != first)
        return None, "torn: element 0 = %g, element %d = %g" % (first, bad, a[bad])
    return first, None


def writer_proc(path, value, iters, numel, q):
    buf = array("f", [float(value)] * numel).tobytes()
    ok = stale = 0
    other = []
    for _ in range(iters):
        fd = None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            for off in range(0, len(buf), 65536):
                os.write(fd, buf[off:off + 65536])
            f, fd = fd, None
            os.close(f)
            ok += 1
        except OSError as e:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
            if e.errno == errno.ESTALE:
                stale += 1
            else:
                other.append("%s: %s" % (errno.errorcode.get(e.errno, e.errno), e))
    q.put(("w", ok, stale, other))


def reader_proc(path, numel, stop, q, monotonic):
    reads = 0
    problems = []
    last = None
    while not stop.is_set() or reads < 5:
        try:
            v, problem = floats_of(path, numel)
        except OSError as e:
            problems.append("read error %s" % e)
            if len(problems) > 5:
                break
            continue
        reads += 1
        if problem:
            problems.append(problem)
        elif monotonic and last is not None and v < last:
            problems.append("went back from version %g to %g" % (last, v))
        if v is not None:
            last = v
        if len(problems) > 5:
            break
    q.put(("r", path, reads, problems))


def writers(path, procs, iters, numel):
    q = mp.Queue()
    stop = mp.Event()
    ws = [mp.Process(target=writer_proc, args=(path, i + 1, iters, numel, q))
          for i in range(procs)]
    rs = [mp.Process(target=reader_proc, args=(path, numel, stop, q, False)) for _ in range(2)]
    for p in ws + rs:
        p.start()
    results = [q.get(timeout=300) for _ in ws]
    stop.set()
    results += [q.get(timeout=300) for _ in rs]
    for p in ws + rs:
        p.join()
    ok = sum(r[1] for r in results if r[0] == "w")
    stale = sum(r[2] for r in results if r[0] == "w")
    other = [o for r in results if r[0] == "w" for o in r[3]]
    reads = sum(r[2] for r in results if r[0] == "r")
    problems = [p for r in results if r[0] == "r" for p in r[3]]
    try:
        final, fproblem = floats_of(path, numel)
    except OSError as e:
        final, fproblem = None, "final read: %s" % e
    print("writes ok %d, ESTALE %d, other errors %d; reads %d, bad reads %d; final %s"
          % (ok, stale, len(other), reads, len(problems), fproblem or final))
    for line in (other + problems)[:10]:
        print("  " + line)
    good = (not other and not problems and ok > 0 and fproblem is None
            and final in range(1, procs + 1))
    return 0 if good else 1


def put_f32(conn, name, numel, value):
    put_f32_bytes(conn, name, numel, array("f", [float(value)] * numel).tobytes())


def put_f32_bytes(conn, name, numel, body):
    conn.request("PUT", "/v1/vars/" + name, body=body,
                 headers={"Dg-Dtype": "float32", "Dg-Shape": str(numel),
                          "Content-Type": "application/octet-stream"})
    resp = conn.getresponse()
    resp.read()
    if resp.status not in (200, 201):
        raise RuntimeError("PUT %s answered %d" % (name, resp.status))


def updates(addr, name, n, paths):
    host, port = addr.rsplit(":", 1)
    numel = 65536
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    put_f32(conn, name, numel, 1)
    q = mp.Queue()
    stop = mp.Event()
    rs = [mp.Process(target=reader_proc, args=(p, numel, stop, q, True)) for p in paths]
    for p in rs:
        p.start()
    for k in range(2, n + 1):
        put_f32(conn, name, numel, k)
    stop.set()
    results = [q.get(timeout=300) for _ in rs]
    for p in rs:
        p.join()
    bad = 0
    for _, path, reads, problems in results:
        print("%s: %d reads, %d bad" % (os.path.basename(os.path.dirname(path)) + "/" +
                                        os.path.basename(path), reads, len(problems)))
        for line in problems[:5]:
            print("  " + line)
        bad += len(problems) + (reads < 5)
    try:
        last, problem = floats_of(paths[0], numel)
    except OSError as e:
        last, problem = None, "final read: %s" % e
    if problem or last != n:
        print("after the stream: %s (want %d)" % (problem or last, n))
        bad += 1
    return 0 if bad == 0 else 1


def bulk(addr, n, expected):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    lines = []
    for i in range(n):
        # 80% in one flat directory, the rest spread over 20 nested ones
        name = "many/v%05d" % i if i % 5 else "many/sub/k%02d/v%05d" % (i % 20, i)
        numel = i % 13 + 1
        conn.request("PUT", "/v1/vars/" + name, body=struct.pack("<%di" % numel, *range(numel)),
                     headers={"Dg-Dtype": "int32", "Dg-Shape": str(numel),
                              "Content-Type": "application/octet-stream"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 201:
            print("bulk: PUT %s answered %d" % (name, resp.status), file=sys.stderr)
            return 1
        lines.append("%s %d" % (name, 4 * numel))
    with open(expected, "w") as f:
        f.write("\n".join(sorted(lines)) + "\n")
    return 0


def hold(path, data, ready, go):
    payload = open(data, "rb").read()
    fd = os.open(path, os.O_RDWR)
    open(ready, "w").close()
    deadline = time.time() + 60
    while not os.path.exists(go):
        if time.time() > deadline:
            print("timeout waiting for " + go)
            os.close(fd)
            return 1
        time.sleep(0.02)
    step = "write"
    try:
        os.pwrite(fd, payload, 0)
        step = "close"
        os.close(fd)
    except OSError as e:
        if step == "write":
            os.close(fd)
        print("%s %s" % (step, errno.errorcode.get(e.errno, str(e.errno))))
        return 0
    print("ok")
    return 0


def cached_pages(fd):
    """Pages of fd's file in the page cache (cachestat(2), Linux >= 6.5), or -1."""
    import ctypes

    class Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    class Stat(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in
                    ("cache", "dirty", "writeback", "evicted", "recently_evicted")]

    libc = ctypes.CDLL(None, use_errno=True)
    rng, st = Range(0, 0), Stat()
    if libc.syscall(451, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
        return -1
    return st.cache


def var_gets(conn):
    """GETs of /v1/vars/{name} the ps answered so far (its /v1/metrics)."""
    conn.request("GET", "/v1/metrics")
    resp = conn.getresponse()
    n = 0
    for line in resp.read().decode().splitlines():
        if (line.startswith("dg_http_requests_total") and 'method="GET"' in line
                and "vars/{name" in line):
            n += int(float(line.split()[-1]))
    return n


def mapread(addr, name, path):
    import mmap
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    numel = 2097152

    def value(k):
        return array("f", [float(i % 1000 + k) for i in range(numel)]).tobytes()

    def put(k):
        body = value(k)
        put_f32_bytes(conn, name, numel, body)
        return body

    def read_all(fd, start=0):
        out = []
        while True:
            chunk = os.pread(fd, CHUNK, start + sum(len(c) for c in out))
            if not chunk:
                return b"".join(out)
            out.append(chunk)

    # cold: read() of the first MiB, then the page cache, then a shared map
    a = put(1)
    deadline = time.time() + 5          # a new name shows within --attr-timeout
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.05)
    fd = os.open(path, os.O_RDONLY)
    first = os.pread(fd, CHUNK, 0)
    print("cold_read_ok=%s" % (first == a[:CHUNK]))
    print("cold_cached_pages=%d" % cached_pages(fd))
    with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
        print("cold_mmap_ok=%s" % (m[:] == a))
    os.close(fd)
    # a reader of version 2 stays open while version 3 arrives and is mapped
    b = put(2)
    fa = os.open(path, os.O_RDONLY)
    head = os.pread(fa, CHUNK, 0)
    c = put(3)
    fb = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fb, 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            mapped_c = m[:] == c
    except OSError as e:        # ENODEV where reads of another version use the cache
        mapped_c = errno.errorcode.get(e.errno, str(e.errno))
    os.close(fb)
    rest = read_all(fa, CHUNK)
    os.close(fa)
    print("newer_mmap_ok=%s older_read_ok=%s" % (mapped_c, head + rest == b))
    # a repeated read of the unchanged version 3: the same bytes, no GET
    fd = os.open(path, os.O_RDONLY)
    read_all(fd)
    os.close(fd)
    gets = var_gets(conn)
    fd = os.open(path, os.O_RDONLY)
    again = read_all(fd)
    os.close(fd)
    print("repeated_ok=%s repeated_gets=%d" % (again == c, var_gets(conn) - gets))
    return 0


def get_raw(addr, name):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", "/v1/vars/" + name)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


def landing_write(path, data, order, aligned=True, pause=None):
    """Write data to path (O_TRUNC) in CHUNK pieces, in the given order of
    chunk indexes; from a page-aligned buffer, or from one 48 bytes off."""
    import mmap
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        buf = mmap.mmap(-1, CHUNK + 4096)
        for i in order:
            piece = data[i * CHUNK:(i + 1) * CHUNK]
            at = 0 if aligned else 48
            buf[at:at + len(piece)] = piece
            mv = memoryview(buf)[at:at + len(piece)]
            done = 0
            while done < len(piece):
                done += os.pwrite(fd, mv[done:], i * CHUNK + done)
            mv.release()
            if pause:
                pause()
        buf.close()
    finally:
        os.close(fd)


def landing_threads(path, data, nthreads, noise_dir):
    """nthreads threads pwrite interleaved chunks of one open file while
    another thread stats and lists noise_dir."""
    import threading
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    stop = threading.Event()
    errors = []

    def noise():
        while not stop.is_set():
            os.stat(noise_dir)
            os.listdir(noise_dir)

    def work(t):
        try:
            n = len(data) // CHUNK
            for i in range(t, n, nthreads):
                piece = data[i * CHUNK:(i + 1) * CHUNK]
                done = 0
                while done < len(piece):
                    done += os.pwrite(fd, piece[done:], i * CHUNK + done)
        except OSError as e:
            errors.append(e)

    nt = threading.Thread(target=noise)
    nt.start()
    ws = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    stop.set()
    nt.join()
    os.close(fd)
    if errors:
        raise errors[0]


def landing_proc(path, data, q):
    try:
        landing_write(path, data, range(len(data) // CHUNK))
        q.put("ok")
    except OSError as e:
        q.put("errno " + errno.errorcode.get(e.errno, str(e.errno)))


def landing(addr, d, a, b):
    n = 2097152 * 4
    chunks = n // CHUNK
    rnd = [os.urandom(n) for _ in range(4)]
    pa, pb = os.path.join(d, "vars", a), os.path.join(d, "vars", b)
    bad = 0

    def verify(pattern, want):
        nonlocal bad
        msgs = []
        for name, data in want:
            status, body = get_raw(addr, name)
            if status != 200 or body != data:
                diff = next((i for i in range(min(len(body), len(data)))
                             if body[i] != data[i]), min(len(body), len(data)))
                msgs.append("%s: HTTP %d, %d bytes, first difference at byte %d"
                            % (name, status, len(body), diff))
        print(pattern, "ok" if not msgs else "BAD " + "; ".join(msgs))
        bad += bool(msgs)

    seq = list(range(chunks))
    landing_write(pa, rnd[0], seq)
    verify("aligned", [(a, rnd[0])])
    landing_write(pa, rnd[1], seq, aligned=False)
    verify("unaligned", [(a, rnd[1])])
    # two files written turn by turn (both open): each write lands in its own
    fa = os.open(pa, os.O_WRONLY | os.O_TRUNC)
    fb = os.open(pb, os.O_WRONLY | os.O_TRUNC)
    for i in seq:
        os.pwrite(fa, rnd[2][i * CHUNK:(i + 1) * CHUNK], i * CHUNK)
        os.pwrite(fb, rnd[3][i * CHUNK:(i + 1) * CHUNK], i * CHUNK)
    os.close(fa)
    os.close(fb)
    verify("interleaved", [(a, rnd[2]), (b, rnd[3])])
    # forward, back over chunk 2 (new bytes), forward again
    mixed = bytearray(rnd[0])
    mixed[2 * CHUNK:3 * CHUNK] = rnd[1][2 * CHUNK:3 * CHUNK]
    fd = os.open(pa, os.O_WRONLY | os.O_TRUNC)
    for i in range(5):
        os.pwrite(fd, rnd[0][i * CHUNK:(i + 1) * CHUNK], i * CHUNK)
    os.pwrite(fd, rnd[1][2 * CHUNK:3 * CHUNK], 2 * CHUNK)
    for i in range(5, chunks):
        os.pwrite(fd, rnd[0][i * CHUNK:(i + 1) * CHUNK], i * CHUNK)
    os.close(fd)
    verify("rewrite", [(a, bytes(mixed))])
    landing_write(pa, rnd[3], list(reversed(seq)))
    verify("reverse", [(a, rnd[3])])
    # a skip ahead, then the gap: every chunk once
    landing_write(pa, rnd[2], [0, 1, 4, 5, 2, 3, 6, 7])
    verify("skip", [(a, rnd[2])])
    landing_threads(pa, rnd[1], 4, os.path.join(d, "vars"))
    verify("threads", [(a, rnd[1])])
    q = mp.Queue()
    ps = [mp.Process(target=landing_proc, args=(p, r, q))
          for p, r in ((pa, rnd[0]), (pb, rnd[1]))]
    for p in ps:
        p.start()
    outs = [q.get(timeout=120) for _ in ps]
    for p in ps:
        p.join()
    if outs != ["ok", "ok"]:
        print("processes BAD", outs)
        bad += 1
    else:
        verify("processes", [(a, rnd[0]), (b, rnd[1])])
    return 1 if bad else 0


def pollwait(addr, name, path, n):
    import select
    import threading
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port))
    fd = os.open(path, os.O_RDONLY)
    p = select.poll()
    p.register(fd, select.POLLIN)
    idle = p.poll(200)
    print("idle=%s" % ("quiet" if not idle else "woke"))
    waits = []
    for k in range(n):
        done = {}

        def put(k=k):
            time.sleep(0.1)
            put_f32(conn, name, 4, k + 100)
            done["t"] = time.monotonic()
        t = threading.Thread(target=put)
        t.start()
        ev = p.poll(5000)
        woke = time.monotonic()
        t.join()
        if not ev or not ev[0][1] & select.POLLIN:
            print("wake_ms=MISS")
            return 1
        waits.append(max(0.0, (woke - done["t"]) * 1000))
        os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        p = select.poll()
        p.register(fd, select.POLLIN)
    os.close(fd)
    waits.sort()
    print("wake_ms=%.1f,%.1f" % (waits[len(waits) // 2], waits[-1]))
    return 0 if not idle else 1


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, a = argv[1], argv[2:]
    if cmd == "npy":
        write_npy(a[0], a[1], a[2], a[3:])
        return 0
    if cmd == "raw":
        write_raw(a[0], a[1], a[2:])
        return 0
    if cmd == "produce":
        return produce(a[0], a[1:])
    if cmd == "writers":
        return writers(a[0], int(a[1]), int(a[2]), int(a[3]))
    if cmd == "updates":
        return updates(a[0], a[1], int(a[2]), a[3:])
    if cmd == "bulk":
        return bulk(a[0], int(a[1]), a[2])
    if cmd == "hold":
        return hold(a[0], a[1], a[2], a[3])
    if cmd == "mapread":
        return mapread(a[0], a[1], a[2])
    if cmd == "pollwait":
        return pollwait(a[0], a[1], a[2], int(a[3]))
    if cmd == "landing":
        return landing(a[0], a[1], a[2], a[3])
    print("mount_tool: unknown command " + cmd, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
