#!/usr/bin/python3
"""bench/train: dg's distributed training of examples/mlp.json against PyTorch, in one run.

1. dg: `dg up` starts 1 ps + 2 workers on free loopback ports (state in a temp dir; the
   user's own cluster is not touched), the graph is submitted to the master as a job
   (POST /v1/jobs), the bench waits for it, then reads the job's status (examples/s
   from "training") and its metrics CSV (GET /v1/jobs/ID/metrics: the test accuracy of
   each per-epoch eval), and takes the cluster down.
2. torch_single.py: the same recipe in one PyTorch process (1 thread).
3. torch_rpc.py: a PyTorch parameter server over torch.distributed.rpc with 2 async
   trainers (1 thread per process), as dg's default.
Prints each figure (examples/s, CPU microseconds per example, test accuracy), the ratios
dg/torch_rpc and dg/torch_single of examples/s (target: dg >= 1.5x torch_rpc) and of
examples per CPU second, and dg's test accuracy minus each torch's after epoch 1 and at
the end. OPENBLAS_CORETYPE is left as the environment has it; the OpenBLAS core of each side
is printed (and, where dg chose one itself, the torch processes get the same).
With --seeds N every side trains N times, run i with data-order and initial-weight seed i
(dg: each ShardBatch's seed and each Variable's; torch: --seed), and the accuracy condition
(dg's final test accuracy at most 0.5 points below torch_rpc's) is judged on the means: one
run's accuracy moves by about +-0.4 points with the data order alone.
Exit status: 0, 1 on a failure, 4 with --strict when a target is missed.
Run with Debian's /usr/bin/python3 (numpy; torch from python3-torch, else torch skips).
"""
import argparse
import csv
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGET = 1.5            # dg examples/s >= 1.5x torch rpc (the training issue)
ACC_TARGET = -0.005     # dg's final test accuracy - torch rpc's >= this (means over seeds)


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


def dg_core(dg, env):
    """(core name, how chosen) from `dg --version`'s OpenBLAS line."""
    out = subprocess.run([dg, "--version"], env=env, capture_output=True, text=True).stdout
    m = re.search(r"core (\S+) \(([^)]*)\)", out)
    return (m.group(1), m.group(2)) if m else ("unknown", out.strip())


def cpu_s(pids):
    """CPU seconds (user + system, all threads) the processes pids have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])     # utime, stime (fields 14, 15)
    return total / tick


def run_dg(args, graph):
    """Train graph on a fresh local cluster; returns the figures as a dict."""
    tmp = tempfile.mkdtemp(prefix="dg-bench-train-")
    env = dict(os.environ, XDG_RUNTIME_DIR=tmp, HOME=tmp)
    if args.dg_blas_threads > 0:
        env["OPENBLAS_NUM_THREADS"] = str(args.dg_blas_threads)
    cdir = os.path.join(tmp, "cluster")
    res = {"impl": "dg", "workers": args.workers,
           "blas_threads": env.get("OPENBLAS_NUM_THREADS", "OpenBLAS default (CPU count)")}
    res["openblas_core"], res["openblas_how"] = dg_core(args.dg, env)
    try:
        subprocess.run([args.dg, "up", "--dir", cdir, "--ps", "1", "--workers",
                        str(args.workers)], env=env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(cdir, "cluster.json")) as f:
            master = json.load(f)["worker"][0]
        pids = []
        for name in os.listdir(cdir):
            if name.endswith(".pid"):
                with open(os.path.join(cdir, name)) as f:
                    pids.append(int(f.read().split()[0]))
        base = f"http://{master}/v1/jobs"
        cpu0 = cpu_s(pids)
        t0 = time.time()
        st, body = http("POST", base, {"graph": graph})
        if st != 201:
            raise RuntimeError(f"POST /v1/jobs: {st} {body.decode(errors='replace')}")
        job = json.loads(body)["id"]
        while True:
            st, body = http("GET", f"{base}/{job}")
            status = json.loads(body)
            if status["state"] not in ("created", "running"):
                break
            if time.time() - t0 > args.timeout_s:
                http("DELETE", f"{base}/{job}")
                raise RuntimeError(f"job {job} still {status['state']} after "
                                   f"{args.timeout_s} s (--timeout-s); canceled")
            time.sleep(0.2)
        wall = time.time() - t0
        res["cpu_s"] = cpu_s(pids) - cpu0
        if status["state"] != "done":
            raise RuntimeError(f"job {job} {status['state']}: {json.dumps(status.get('error'))}")
        tr = status["training"]
        st, body = http("GET", f"{base}/{job}/metrics")
        if st != 200:
            raise RuntimeError(f"GET /v1/jobs/{job}/metrics: {st}")
        rows = list(csv.DictReader(io.StringIO(body.decode())))
        evals = [r for r in rows if r.get("test_accuracy")]
        if not evals:
            raise RuntimeError(f"job {job}: no test_accuracy row in its metrics CSV")
        # Steady state: from the first train row after some steps ran (the first chunk
        # reads and decompresses the dataset) to the last; step = mean replica progress.
        train = [r for r in rows if r.get("loss") and int(r["step"]) > 0]
        per_step = tr["replicas"] * tr["batch"]
        if len(train) >= 2 and float(train[-1]["time_s"]) > float(train[0]["time_s"]):
            res["steady_examples_per_s"] = (
                (int(train[-1]["step"]) - int(train[0]["step"])) * per_step /
                (float(train[-1]["time_s"]) - float(train[0]["time_s"])))
            res["startup_s"] = float(train[0]["time_s"]) - int(train[0]["step"]) * per_step / \
                res["steady_examples_per_s"]
        res.update({"examples": tr["examples"], "examples_per_s": tr["examples_per_s"],
                    "wall_s": round(wall, 3), "wall_examples_per_s": tr["examples"] / wall,
                    "loss": tr.get("loss"), "stale": tr.get("stale"),
                    "test_accuracy": [float(r["test_accuracy"]) for r in evals],
                    "eval_epochs": [r.get("epoch") for r in evals]})
        res["test_accuracy_epoch1"] = res["test_accuracy"][0]
        res["test_accuracy_final"] = res["test_accuracy"][-1]
        return res
    finally:
        subprocess.run([args.dg, "down", "--dir", cdir], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)


def seeded(graph, seed):
    """A copy of graph whose ShardBatch and Variable seeds derive from seed; reinit so
    that every run starts from its own initial weights."""
    g = json.loads(json.dumps(graph))
    for k, n in enumerate(g["nodes"]):
        if n["op"] in ("ShardBatch", "Variable"):
            n.setdefault("attrs", {})["seed"] = seed if n["op"] == "ShardBatch" \
                else 1000 * seed + k
    g["training"]["reinit"] = True
    return g


def mean(rs, key):
    return sum(r[key] for r in rs) / len(rs)


def run_torch(script, args, core, seed=None):
    """One torch baseline as a child process; its JSON line as a dict."""
    env = dict(os.environ)
    if core and "OPENBLAS_CORETYPE" not in env:
        env["OPENBLAS_CORETYPE"] = core
    cmd = [sys.executable, os.path.join(HERE, script), "--epochs", str(args.epochs)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{script} exited with {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def line(r):
    return (f"{r['impl']:<13} {r['examples_per_s']:>8.0f} ex/s {cpu_us(r):>6.1f} CPU us/ex   "
            f"test accuracy epoch 1 {r['test_accuracy_epoch1']:.4f}  final "
            f"{r['test_accuracy_final']:.4f}   ({r['examples']} examples, "
            f"OpenBLAS {r['openblas_core']}"
            + (f", {r['openblas_threads']} thread(s)" if "openblas_threads" in r else "") + ")")


def cpu_us(r):
    """CPU microseconds per example (all processes of the side, user + system)."""
    return r["cpu_s"] * 1e6 / r["examples"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="build directory holding cli/dg (default: build/)")
    ap.add_argument("--dg", help="the dg binary (default: BUILD/cli/dg)")
    ap.add_argument("--graph", default=os.path.join(ROOT, "examples", "mlp.json"))
    ap.add_argument("--workers", type=int, default=2,
                    help="dg's workers = replicas (default 2; torch_rpc has 2 trainers)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs on every side (default 3)")
    ap.add_argument("--dg-blas-threads", type=int, default=1,
                    help="OPENBLAS_NUM_THREADS of dg's servers, as torch runs 1 thread per "
                    "process (default 1; 0: as the environment has it)")
    ap.add_argument("--no-torch", action="store_true", help="dg only")
    ap.add_argument("--timeout-s", type=float, default=1800,
                    help="cancel dg's job and fail after this long (default 1800)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="train every side N times with seeds 1..N and compare means "
                    "(default 1: the graph's and the scripts' own seeds)")
    ap.add_argument("--strict", action="store_true", help="exit 4 when a target is missed")
    args = ap.parse_args()
    args.dg = args.dg or os.path.join(args.build, "cli", "dg")
    if not os.access(args.dg, os.X_OK):
        print(f"bench_train: no dg binary at {args.dg} (build first, or give --dg)",
              file=sys.stderr)
        return 1
    with open(args.graph) as f:
        graph = json.load(f)
    graph["training"]["epochs"] = args.epochs
    graph["training"].pop("steps", None)

    print(f"bench_train: {os.path.relpath(args.graph, ROOT)}, {args.epochs} epochs, batch "
          f"{graph['training'].get('batch')}, {json.dumps(graph['training']['optimizer'])}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    if args.seeds < 1:
        print("bench_train: --seeds must be >= 1", file=sys.stderr)
        return 1
    seeds = [None] if args.seeds == 1 else list(range(1, args.seeds + 1))
    dgs = []
    try:
        for sd in seeds:
            dgs.append(run_dg(args, graph if sd is None else seeded(graph, sd)))
            if sd is not None:
                print(f"dg seed {sd}: {dgs[-1]['examples_per_s']:.0f} ex/s, final test accuracy "
                      f"{dgs[-1]['test_accuracy_final']:.4f}", flush=True)
    except (RuntimeError, OSError, subprocess.CalledProcessError, KeyError, ValueError) as e:
        print(f"bench_train: dg run failed: {e}", file=sys.stderr)
        return 1
    dg = dict(dgs[-1])
    for key in ("examples_per_s", "test_accuracy_epoch1", "test_accuracy_final", "cpu_s"):
        dg[key] = mean(dgs, key)
    if "steady_examples_per_s" in dg and all("steady_examples_per_s" in r for r in dgs):
        dg["steady_examples_per_s"] = mean(dgs, "steady_examples_per_s")
    if len(dgs) > 1:
        print(f"means over {len(dgs)} seeds below", flush=True)
    print(line(dg) + f"  ({dg['openblas_how']}; OPENBLAS_NUM_THREADS {dg['blas_threads']})",
          flush=True)
    print(f"{'':<13} wall {dg['wall_s']:.2f} s from submit to done: "
          f"{dg['wall_examples_per_s']:.0f} ex/s; eval epochs {dg['eval_epochs']}, "
          f"stale {dg['stale']}", flush=True)
    if "steady_examples_per_s" in dg:
        print(f"{'':<13} steady state (metrics rows after the first chunk): "
              f"{dg['steady_examples_per_s']:.0f} ex/s; start-up ~{dg['startup_s']:.1f} s "
              f"(placement, init, reading the dataset)", flush=True)
    if args.no_torch:
        return 0
    if importlib.util.find_spec("torch") is None:
        print("torch: skipped: python3-torch is not installed "
              "(sudo apt-get install python3-torch)")
        return 0
    core = dg["openblas_core"].capitalize() if "chosen by dg" in dg["openblas_how"] else None
    res = {}
    for name in ("torch_single", "torch_rpc"):
        runs = []
        try:
            for sd in seeds:
                runs.append(run_torch(name + ".py", args, core, sd))
                if sd is not None:
                    print(f"{name} seed {sd}: {runs[-1]['examples_per_s']:.0f} ex/s, final "
                          f"test accuracy {runs[-1]['test_accuracy_final']:.4f}", flush=True)
        except (RuntimeError, ValueError) as e:
            print(f"bench_train: {name} failed: {e}", file=sys.stderr)
            return 1
        res[name] = dict(runs[-1])
        for key in ("examples_per_s", "test_accuracy_epoch1", "test_accuracy_final", "cpu_s"):
            res[name][key] = mean(runs, key)
        print(line(res[name]), flush=True)
    status = 0
    for name, r in res.items():
        ratio = dg["examples_per_s"] / r["examples_per_s"]
        steady = dg.get("steady_examples_per_s", 0) / r["examples_per_s"]
        verdict = ""
        if name == "torch_rpc":
            met = ratio >= TARGET
            verdict = f"  (target >= {TARGET}: {'met' if met else 'MISSED'})"
            if not met and args.strict:
                status = 4
        print(f"ratio dg / {name:<12} examples/s {ratio:5.2f}{verdict}; steady state "
              f"{steady:5.2f}; examples per CPU second {cpu_us(r) / cpu_us(dg):5.2f}")
    for name, r in res.items():
        d1 = dg["test_accuracy_epoch1"] - r["test_accuracy_epoch1"]
        dn = dg["test_accuracy_final"] - r["test_accuracy_final"]
        verdict = ""
        if name == "torch_rpc":
            met = dn >= ACC_TARGET
            verdict = (f"  (target >= {ACC_TARGET:+.3f}"
                       f"{', means of %d seeds' % len(seeds) if len(seeds) > 1 else ''}: "
                       f"{'met' if met else 'MISSED'})")
            if not met and args.strict:
                status = 4
        print(f"accuracy dg - {name:<12} epoch 1 {d1:+.4f}  final {dn:+.4f}{verdict}")
    cores = {dg["openblas_core"].lower()} | {r["openblas_core"].lower() for r in res.values()}
    if len(cores) > 1:
        print(f"WARNING: the sides ran different OpenBLAS cores: {sorted(cores)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
