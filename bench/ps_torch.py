#!/usr/bin/env python3
"""PyTorch baseline of bench_ps: a parameter server over torch.distributed.rpc.

One "ps" process (rank 0) holds float32 tensors; N client processes call rpc_sync to
fetch them (get), replace them (put) and apply sgd (w -= lr*g) to a 4 KiB weight.
TensorPipe is restricted to its TCP transport ("uv") and the "basic" channel, so the
bytes cross a loopback TCP socket like dg's HTTP (no shared memory, no CMA). Every
process is pinned with os.sched_setaffinity (ps on --server-cpu, clients on
--client-cpu) and runs torch with one intra-op thread (OMP/OpenBLAS/MKL too).

bench_ps drives one group (ps + N clients) at a time through `--serve N`: commands on
stdin, one answer line per command on stdout, so it can interleave torch's runs with
dg's and the socket's (the machine's load then hits all three alike):
  get BYTES | put BYTES   one timed run (>= --min-iters calls and --target-s seconds;
                          2 warm-up calls when the case changes); answers ops/s
  sgd                     one timed window of all N clients applying sgd together;
                          answers the total applies/s
  check get|put BYTES     the variable holds the pattern | the value put; "ok"/"bad ..."
  checkw                  w == -lr * (applies so far) and version == 1 + applies
  quit                    shut the group down
Run alone (python3 bench/ps_torch.py [--quick] [--server-cpu N] [--client-cpu M]) it
drives the groups itself and prints one JSON line per case with the rate of each run.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

SIZES = [4 << 10, 4 << 20, 64 << 20]   # bytes of float32 variables
SGD_BYTES = 4 << 10                     # the sgd weight and gradient
SGD_LR = 2.0 ** -10                     # exact in float32: w stays exact over many applies


def pin(cpu):
    """Pin this process (and the threads it starts later) to one CPU; -1: no pinning."""
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})


def single_thread_env():
    """One thread for every math library, set before torch is imported."""
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = "1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_options(rpc, port):
    # TCP only: the uv transport (libuv sockets) and the basic channel (tensor bytes
    # through that transport). The defaults would pick shared memory and CMA on one
    # host, which is not the network path this baseline stands for.
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=16, init_method=f"tcp://127.0.0.1:{port}",
        _transports=["uv"], _channels=["basic"], rpc_timeout=300)


# --------------------------------------------------------------------------- ps side
# These functions run in the ps process, called by rpc from the clients. The store is
# a dict of tensors; a lock makes put and sgd atomic, like dg's store. get returns the
# stored tensor itself (no copy: TensorPipe serialises it after the call returns), put
# adopts the received tensor (no copy): both the cheapest choices for torch.
_vars = {}
_version = {}
_lock = threading.Lock()
_cv = threading.Condition()
_cmd = ("", 0)          # the leader's current command for the other clients, and its id
_reports = {}           # command id -> [(applies, seconds)] of each client
_barrier = None


def ps_create(name, numel, zeros):
    import torch
    with _lock:
        _vars[name] = torch.zeros(numel) if zeros else \
            torch.arange(numel, dtype=torch.float32) * 0.5
        _version[name] = 1
    return numel


def ps_get(name):
    return _vars[name]


def ps_put(name, t):
    with _lock:
        old = _vars[name]
        if t.dtype != old.dtype or t.shape != old.shape:
            raise ValueError(f"put {name}: shape {tuple(t.shape)} != {tuple(old.shape)}")
        _vars[name] = t
        _version[name] += 1
        return _version[name]


def ps_sgd(name, grad, lr):
    with _lock:
        w = _vars[name]
        if grad.shape != w.shape:
            raise ValueError(f"sgd {name}: shape {tuple(grad.shape)} != {tuple(w.shape)}")
        w.add_(grad, alpha=-lr)
        _version[name] += 1
        return _version[name]


def ps_checkw():
    """The weight started at 0 and every apply subtracted lr*1 exactly."""
    import torch
    with _lock:
        applies = _version["w"] - 1
        w = _vars["w"]
        expect = -SGD_LR * applies
        if not torch.all(w == expect):
            return f"bad: w[0] = {w[0].item()} after {applies} applies, expected {expect}"
        return "ok"


def ps_post(cmd, cid):
    """The leader publishes a command for the other clients."""
    global _cmd
    with _cv:
        _cmd = (cmd, cid)
        _cv.notify_all()
    return True


def ps_next(last):
    """A follower waits for the command after `last`."""
    with _cv:
        _cv.wait_for(lambda: _cmd[1] > last)
        return _cmd


def ps_arrive():
    """Barrier of the concurrent clients: every client starts a timed window together."""
    _barrier.wait()
    return True


def ps_report(cid, n, el, n_clients, wait):
    """A client's applies in window cid; the leader (wait=True) gets the totals once
    every client has reported: (sum of applies, longest window)."""
    with _cv:
        _reports.setdefault(cid, []).append((n, el))
        _cv.notify_all()
        if not wait:
            return None
        _cv.wait_for(lambda: len(_reports[cid]) == n_clients)
        r = _reports.pop(cid)
        return sum(x[0] for x in r), max(x[1] for x in r)


# ----------------------------------------------------------------------- client side
def timed_run(fn, target_s, min_iters):
    """Calls/s of one run: fn at least min_iters times and for at least target_s s."""
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - t0
        if n >= min_iters and el >= target_s:
            return n / el


def sgd_window(rpc, grad, target_s):
    rpc.rpc_sync("ps", ps_arrive)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < target_s:
        rpc.rpc_sync("ps", ps_sgd, args=("w", grad, SGD_LR))
        n += 1
    return n, time.perf_counter() - t0


class Leader:
    """Rank 1: runs bench_ps's commands, answers on stdout."""

    def __init__(self, args, rpc, torch):
        self.a, self.rpc, self.torch = args, rpc, torch
        self.last_case = None
        self.cid = 0
        self.grad = torch.ones(SGD_BYTES // 4)
        self.values = {s: torch.arange(s // 4, dtype=torch.float32) * -0.25 for s in SIZES}
        for s in SIZES:
            rpc.rpc_sync("ps", ps_create, args=(f"v{s}", s // 4, False))
        rpc.rpc_sync("ps", ps_create, args=("w", SGD_BYTES // 4, True))

    def call(self, op, size):
        if op == "get":
            return self.rpc.rpc_sync("ps", ps_get, args=(f"v{size}",))
        return self.rpc.rpc_sync("ps", ps_put, args=(f"v{size}", self.values[size]))

    def transfer(self, op, size):
        if (op, size) != self.last_case:            # warm-up: connection, allocator
            self.last_case = (op, size)
            for _ in range(2):
                self.call(op, size)
        min_iters = 3 if size >= (64 << 20) else 10
        return timed_run(lambda: self.call(op, size), self.a.target_s, min_iters)

    def check(self, op, size):
        got = self.rpc.rpc_sync("ps", ps_get, args=(f"v{size}",))
        want = self.values[size] if op == "put" else \
            self.torch.arange(size // 4, dtype=self.torch.float32) * 0.5
        return "ok" if self.torch.equal(got, want) else f"bad: {op} v{size} holds other values"

    def sgd(self):
        self.cid += 1
        self.rpc.rpc_sync("ps", ps_post, args=("sgd", self.cid))
        n, el = sgd_window(self.rpc, self.grad, self.a.target_s)
        total, el = self.rpc.rpc_sync("ps", ps_report,
                                      args=(self.cid, n, el, self.a.world - 1, True))
        return total / el

    def serve(self):
        for line in sys.stdin:
            w = line.split()
            if not w:
                continue
            if w[0] == "quit":
                break
            if w[0] in ("get", "put"):
                out = f"{self.transfer(w[0], int(w[1])):.6g}"
            elif w[0] == "sgd":
                out = f"{self.sgd():.6g}"
            elif w[0] == "check":
                out = self.check(w[1], int(w[2]))
            elif w[0] == "checkw":
                out = self.rpc.rpc_sync("ps", ps_checkw)
            else:
                out = f"bad: unknown command {w[0]}"
            print(out, flush=True)
        self.cid += 1
        self.rpc.rpc_sync("ps", ps_post, args=("quit", self.cid))


def follow(args, rpc, torch):
    """Ranks 2..N: take part in each sgd window the leader starts."""
    grad = torch.ones(SGD_BYTES // 4)
    last = 0
    while True:
        cmd, last = rpc.rpc_sync("ps", ps_next, args=(last,))
        if cmd == "quit":
            return
        n, el = sgd_window(rpc, grad, args.target_s)
        rpc.rpc_sync("ps", ps_report, args=(last, n, el, args.world - 1, False))


def run_rank(args):
    global _barrier
    pin(args.server_cpu if args.rank == 0 else args.client_cpu)
    single_thread_env()
    import torch
    import torch.distributed.rpc as rpc
    torch.set_num_threads(1)
    _barrier = threading.Barrier(args.world - 1)
    name = "ps" if args.rank == 0 else f"client{args.rank}"
    rpc.init_rpc(name, rank=args.rank, world_size=args.world,
                 rpc_backend_options=backend_options(rpc, args.port))
    if args.rank == 1:
        Leader(args, rpc, torch).serve()
    elif args.rank > 1:
        follow(args, rpc, torch)
    rpc.shutdown()          # the ps waits here until every client is done


def serve_group(args, n_clients):
    """Start one ps and n_clients clients; the leader inherits our stdin/stdout."""
    port = free_port()
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--world", str(n_clients + 1), "--port", str(port),
              "--target-s", str(args.target_s), "--server-cpu", str(args.server_cpu),
              "--client-cpu", str(args.client_cpu)]
    env = dict(os.environ, GLOG_minloglevel="2")   # no "agent is shutting down" lines
    procs = []
    for r in range(n_clients + 1):
        quiet = r != 1
        procs.append(subprocess.Popen(
            me + common + ["--rank", str(r)], env=env,
            stdin=subprocess.DEVNULL if quiet else None,
            stdout=sys.stderr if quiet else None))
    # A process that fails takes the group down, so the leader's stdout closes and
    # bench_ps sees the end instead of waiting for an rpc that never returns.
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.1)
    rc = [p.returncode for p in procs]
    if any(rc):
        sys.exit(f"ps_torch: exit statuses {rc}")


def standalone(args):
    """Drive the groups ourselves; one JSON line per case with each run's rate."""
    me = [sys.executable, os.path.abspath(__file__), "--target-s", str(args.target_s),
          "--server-cpu", str(args.server_cpu), "--client-cpu", str(args.client_cpu)]
    for n in [int(x) for x in args.clients.split(",")]:
        g = subprocess.Popen(me + ["--serve", str(n)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)

        def ask(cmd):
            g.stdin.write(cmd + "\n")
            g.stdin.flush()
            return g.stdout.readline().strip()
        cases = [(op, s) for s in SIZES for op in ("get", "put")] if n == 1 else []
        for op, s in cases:
            rates = [float(ask(f"{op} {s}")) for _ in range(args.runs)]
            check = ask(f"check {op} {s}")
            print(json.dumps({"case": op, "bytes": s, "clients": 1, "rates": rates,
                              "check": check}), flush=True)
        rates = [float(ask("sgd")) for _ in range(args.runs)]
        print(json.dumps({"case": "sgd", "bytes": SGD_BYTES, "clients": n, "rates": rates,
                          "check": ask("checkw")}), flush=True)
        g.stdin.write("quit\n")
        g.stdin.close()
        g.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 short runs per case")
    p.add_argument("--server-cpu", type=int, default=-1)
    p.add_argument("--client-cpu", type=int, default=-1)
    p.add_argument("--runs", type=int, default=0, help="runs per case (default 7, quick 3)")
    p.add_argument("--target-s", type=float, default=0.0, help="seconds per run")
    p.add_argument("--clients", type=str, default="1,8", help="client counts for sgd")
    p.add_argument("--serve", type=int, default=0, help="serve one group of N clients")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.runs <= 0:
        args.runs = 3 if args.quick else 7
    if args.target_s <= 0:
        args.target_s = 0.05 if args.quick else 0.2
    if args.rank >= 0:
        run_rank(args)
    elif args.serve > 0:
        serve_group(args, args.serve)
    else:
        standalone(args)


if __name__ == "__main__":
    main()
