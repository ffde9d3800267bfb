#!/usr/bin/python3
"""PyTorch baseline of bench/train, distributed: a parameter server over
torch.distributed.rpc and 2 trainer processes, the recipe of examples/mlp.json (784-256-10,
ReLU, softmax cross-entropy, SGD lr 0.1, batch 64, 3 epochs on Fashion-MNIST), or another
(--model cnn --opt adam ...: the ps then applies each gradient with torch's Adam).

Like dg's default (async between-graph replication): trainer k (k = 0, 1) owns the
training examples i with i % 2 == k (dg's ShardBatch shards), visits them in a fresh
permutation each epoch in full batches of 64 (468 steps per epoch), and at every step
pulls all four parameters from the ps (one rpc_sync), computes the gradient of its batch
and pushes it (one rpc_sync) without waiting for the other trainer (--dg-order, --dg-init:
dg's ShardBatch order of shard k and dg's initial weights for those seeds); the ps applies
w -= lr * g under a lock, and returns a consistent copy on each pull. When both trainers
have finished epoch e the ps snapshots the parameters; the test accuracy of each snapshot
is computed after training, outside the clock. Loopback only: TensorPipe's TCP transport
("uv") and "basic" channel, as dg talks HTTP over TCP. One math thread per process
(torch, OpenMP, OpenBLAS). The clock runs from the earliest trainer's first step to the
latest trainer's last; CPU time is that of the trainers' loops plus the ps's from the first
pull to the last epoch's end. Prints one JSON object. Run with Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

import common

N_TRAINERS = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_options(rpc, port):
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=8, init_method=f"tcp://127.0.0.1:{port}",
        _transports=["uv"], _channels=["basic"], rpc_timeout=600)


# --------------------------------------------------------------------------- ps side
# Called by rpc in the ps process. _params is the model's parameters (w1, b1, w2, b2 as
# torch.nn.Linear lays them out); _lock makes an apply and a pull atomic.
_params = []
_lock = threading.Lock()
_done = {}              # epoch -> trainers that finished it
_snap = {}              # epoch -> parameters when the last trainer finished it
_applies = [0]
_opt = []               # the recipe's optimizer over _params (Adam: its state lives here)
_args = []
_cpu = []               # the ps's process CPU time at the first pull and the last epoch end


def ps_pull():
    with _lock:
        if not _cpu:
            _cpu.append(time.process_time())
        return [p.clone() for p in _params]


def ps_push(grads):
    with _lock:
        if _opt:
            for p, g in zip(_params, grads):
                p.grad = g
            _opt[0].step()
        else:
            for p, g in zip(_params, grads):
                p.sub_(g, alpha=_args[0].lr)
        _applies[0] += 1


def ps_epoch_done(epoch):
    with _lock:
        _done[epoch] = _done.get(epoch, 0) + 1
        if _done[epoch] == N_TRAINERS:
            _snap[epoch] = [p.clone() for p in _params]
            for g in (_opt[0].param_groups if _opt else ()):
                g["lr"] *= _args[0].lr_decay
            if not _opt:
                _args[0].lr *= _args[0].lr_decay
            del _cpu[1:]
            _cpu.append(time.process_time())


# ----------------------------------------------------------------------- processes
def run_ps(args, rpc, torch):
    model = common.make_net(torch, args, args.seed, args.dg_init)
    _params.extend(p.detach().clone() for p in model.parameters())
    _args.append(args)
    if args.opt == "adam":
        _opt.append(torch.optim.Adam(_params, lr=args.lr))
    tx, ty = (torch.from_numpy(a) for a in common.load("t10k"))
    rpc.init_rpc("ps", rank=0, world_size=N_TRAINERS + 1,
                 rpc_backend_options=backend_options(rpc, args.port))
    rpc.shutdown()          # waits until both trainers are done
    acc = []
    for e in sorted(_snap):
        with torch.no_grad():
            for p, v in zip(model.parameters(), _snap[e]):
                p.copy_(v)
        acc.append(common.accuracy(torch, model, tx, ty))
    print(json.dumps({"rank": 0, "test_accuracy": acc, "applies": _applies[0],
                      "openblas_threads": common.openblas_threads(),
                      "cpu_s": _cpu[-1] - _cpu[0],
                      "openblas_core": common.openblas_core()}), flush=True)


def run_trainer(args, rpc, torch, np):
    k = args.rank - 1
    x, y = common.load("train")
    x, y = torch.from_numpy(x[k::N_TRAINERS]), torch.from_numpy(y[k::N_TRAINERS])
    model = common.make_net(torch, args, 0)
    params = list(model.parameters())
    lossf = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng([args.seed, k])     # independent streams per (seed, k)
    rpc.init_rpc(f"trainer{k}", rank=args.rank, world_size=N_TRAINERS + 1,
                 rpc_backend_options=backend_options(rpc, args.port))
    examples = 0
    loss = None
    t0 = time.time()
    c0 = time.process_time()
    for e in range(args.epochs):
        order, steps = common.epoch_order(rng, x.shape[0], e, args.dg_order, k)
        order = torch.from_numpy(order)
        for i in range(steps):
            vals = rpc.rpc_sync("ps", ps_pull)
            with torch.no_grad():
                for p, v in zip(params, vals):
                    p.copy_(v)
            idx = order[i * common.BATCH:(i + 1) * common.BATCH]
            for p in params:
                p.grad = None
            loss = lossf(model(x[idx]), y[idx])
            loss.backward()
            rpc.rpc_sync("ps", ps_push, args=([p.grad for p in params],))
        examples += steps * common.BATCH
        rpc.rpc_sync("ps", ps_epoch_done, args=(e,))
    t1 = time.time()
    cpu = time.process_time() - c0
    rpc.shutdown()
    print(json.dumps({"rank": args.rank, "start": t0, "end": t1, "examples": examples,
                      "cpu_s": cpu,
                      "final_loss": float(loss)}), flush=True)


def launch(args):
    """Start the ps and the trainers, collect their JSON lines, print the summary."""
    port = free_port()
    me = [sys.executable, os.path.abspath(__file__), "--epochs", str(args.epochs),
          "--seed", str(args.seed), "--port", str(port)]
    if args.dg_order is not None:
        me += ["--dg-order", str(args.dg_order)]
    if args.dg_init is not None:
        me += ["--dg-init", "%d,%d" % args.dg_init]
    me += ["--model", args.model, "--opt", args.opt, "--lr", repr(args.lr), "--lr-decay",
           repr(args.lr_decay)]
    procs = [subprocess.Popen(me + ["--rank", str(r)], stdout=subprocess.PIPE, text=True)
             for r in range(N_TRAINERS + 1)]
    # A rank that fails leaves the others waiting in rpc: stop them all then.
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.2)
    out = {}
    for r, p in enumerate(procs):
        text, _ = p.communicate()
        if p.returncode != 0:
            print(f"torch_rpc: rank {r} exited with status {p.returncode}", file=sys.stderr)
            return 1
        out[r] = json.loads(text.strip().splitlines()[-1])
    trainers = [out[r] for r in range(1, N_TRAINERS + 1)]
    examples = sum(t["examples"] for t in trainers)
    train_s = max(t["end"] for t in trainers) - min(t["start"] for t in trainers)
    acc = out[0]["test_accuracy"]
    import torch
    print(json.dumps({
        "impl": "torch_rpc", "torch": torch.__version__, "trainers": N_TRAINERS,
        "threads_per_process": 1, "openblas_threads": out[0]["openblas_threads"],
        "openblas_core": out[0]["openblas_core"],
        "epochs": args.epochs, "examples": examples, "train_s": round(train_s, 3),
        "examples_per_s": round(examples / train_s, 1), "applies": out[0]["applies"],
        "cpu_s": round(out[0]["cpu_s"] + sum(t["cpu_s"] for t in trainers), 3),
        "test_accuracy_epoch1": round(acc[0], 4), "test_accuracy_final": round(acc[-1], 4),
        "test_accuracy": [round(a, 4) for a in acc],
        "final_loss": [round(t["final_loss"], 4) for t in trainers]}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=common.EPOCHS)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--dg-order", type=int, metavar="SEED",
                    help="trainer k visits its shard in dg's order: ShardBatch's "
                    "permutations with this seed for shard k of 2")
    ap.add_argument("--dg-init", type=common.dg_init_arg, metavar="W1,W2",
                    help="start from dg's initial weights: Variables w1, w2 with init "
                    "glorot and these seeds")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    common.add_recipe_args(ap)
    args = ap.parse_args()
    common.threads_env(1)
    os.environ.setdefault("GLOG_minloglevel", "2")    # TensorPipe's shutdown lines
    import numpy as np
    try:
        import torch
        import torch.distributed.rpc as rpc
    except ImportError:
        print(json.dumps({"skipped": common.NO_TORCH}))
        return 0
    if args.rank < 0:
        return launch(args)
    torch.set_num_threads(1)
    if args.rank == 0:
        run_ps(args, rpc, torch)
    else:
        run_trainer(args, rpc, torch, np)
    return 0


if __name__ == "__main__":
    sys.exit(main())
