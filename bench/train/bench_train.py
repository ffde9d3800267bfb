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
Every side trains --seeds N times (default 5), run i with seed i for the data order and
the initial weights (dg: each ShardBatch's seed and each Variable's), and the figures are
means over the runs: one run's final accuracy moves by about +-0.4 points with the data order
and the initial weights alone. By default the torch sides get dg's data order and initial
weights of each seed (--dg-order, --dg-init of the scripts), so the accuracies are compared
seed by seed (mean of the differences, its standard error and t); --own-streams lets torch
draw its own (numpy permutations, torch's init) and compares independent means (Welch).
The accuracy condition (dg's final test accuracy at most 0.5 points below torch_rpc's) is
judged on the means. --json FILE keeps every run's figures.
Exit status: 0, 1 on a failure, 4 with --strict when a target is missed.
Run with Debian's /usr/bin/python3 (numpy; torch from python3-torch, else torch skips).
"""
import argparse
import csv
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from dgrun import cpu_s, http

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGET = 1.5            # dg examples/s >= 1.5x torch rpc (the training issue)
ACC_TARGET = -0.005     # dg's final test accuracy - torch rpc's >= this (means over seeds)
DEFAULT_SEEDS = 5       # runs per side: one run's final accuracy moves by ~+-0.4 points


def dg_core(dg, env):
    """(core name, how chosen) from `dg --version`'s OpenBLAS line."""
    out = subprocess.run([dg, "--version"], env=env, capture_output=True, text=True).stdout
    m = re.search(r"core (\S+) \(([^)]*)\)", out)
    return (m.group(1), m.group(2)) if m else ("unknown", out.strip())


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
                    "eval_epochs": [r.get("epoch") for r in evals],
                    "eval_steps": [int(r["step"]) for r in evals]})
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


def dg_start(graph):
    """The torch scripts' --dg-order and --dg-init arguments that reproduce graph's data
    order and initial weights: its ShardBatch's seed and the seeds of its two glorot
    Variables [784,256] and [256,10] (the model of examples/mlp.json); None when the graph
    has another model, which the torch scripts do not train."""
    sb = [n for n in graph["nodes"] if n["op"] == "ShardBatch"]
    ws = [n for n in graph["nodes"] if n["op"] == "Variable" and
          n.get("attrs", {}).get("init") == "glorot"]
    if len(sb) != 1 or [w["attrs"].get("shape") for w in ws] != [[784, 256], [256, 10]] or \
            sb[0].get("attrs", {}).get("shuffle", True) is not True:
        return None
    return ["--dg-order", str(sb[0]["attrs"].get("seed", 0)),
            "--dg-init", ",".join(str(w["attrs"].get("seed", 0)) for w in ws)]


def check_dg_order(dg, seed):
    """None when common.dg_shard_perm reproduces the ShardBatch kernel of this dg binary
    (epoch 0 of shard 1 of 2 of 60000 examples, via `dg eval`), else what differs: the
    torch sides must not silently train on another order than dg's."""
    sys.path.insert(0, HERE)
    import common
    import numpy as np
    tmp = tempfile.mkdtemp(prefix="dg-bench-order-")
    try:
        np.save(os.path.join(tmp, "i.npy"), np.arange(60000, dtype=np.int32))
        g = {"version": 1, "fetch": ["b:1"], "nodes": [
            {"name": "i", "op": "NpyReader", "attrs": {"path": os.path.join(tmp, "i.npy")}},
            {"name": "b", "op": "ShardBatch", "inputs": ["i", "i"],
             "attrs": {"batch": 30000, "shard": 1, "num_shards": 2, "seed": seed}}]}
        with open(os.path.join(tmp, "g.json"), "w") as f:
            json.dump(g, f)
        out = subprocess.run([dg, "eval", os.path.join(tmp, "g.json"), "--out", tmp],
                             capture_output=True, text=True)
        if out.returncode != 0:
            return f"dg eval of a ShardBatch failed: {out.stderr.strip()}"
        got = np.load(os.path.join(tmp, "b_1.npy"))
        want = 1 + 2 * common.dg_shard_perm(seed, 0, 1, 30000)
        if not np.array_equal(got, want):
            return (f"common.dg_shard_perm differs from dg's ShardBatch (seed {seed}) at "
                    f"{int(np.argmax(got != want))} of 30000")
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def mean(rs, key):
    return sum(r[key] for r in rs) / len(rs)


def stats(xs):
    """(mean, standard error of the mean) of the numbers xs (se 0 for one number)."""
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs))


def welch(a, b):
    """(mean(a) - mean(b), its standard error, t, Welch-Satterthwaite degrees of freedom)
    of two independent samples; t and dof are None when a side has fewer than 2 runs or
    both have no spread."""
    ma, sa = stats(a)
    mb, sb = stats(b)
    se = math.sqrt(sa ** 2 + sb ** 2)
    if len(a) < 2 or len(b) < 2 or se == 0:
        return ma - mb, se, None, None
    dof = se ** 4 / (sa ** 4 / (len(a) - 1) + sb ** 4 / (len(b) - 1)) if sa and sb else \
        len(a) + len(b) - 2
    return ma - mb, se, (ma - mb) / se, dof


def recipe_of(graph):
    """The torch scripts' recipe arguments for graph: its model (examples/cnn.json's CNN
    when it has a Conv2D, else examples/mlp.json's MLP), optimizer, lr, and its step
    schedule as a decay per epoch of a replica; raises ValueError for what the torch
    sides cannot mirror."""
    t = graph["training"]
    opt = t["optimizer"]
    if opt.get("rule", "sgd") not in ("sgd", "adam"):
        raise ValueError(f"the torch sides run sgd or adam, not {opt.get('rule')}")
    args = ["--model", "cnn" if any(n["op"] == "Conv2D" for n in graph["nodes"]) else "mlp",
            "--opt", opt.get("rule", "sgd"), "--lr", repr(opt.get("lr", 0.1))]
    sched = t.get("lr_schedule", {"kind": "constant"})
    if sched.get("kind", "constant") != "constant":
        if sched["kind"] != "step":
            raise ValueError("the torch sides mirror a step lr_schedule only")
        # dg's "every" counts a replica's steps: with 2 replicas, 468 is one epoch
        args += ["--lr-decay", repr(sched["factor"] ** (468 / sched["every"]))]
    return args


def run_torch(script, args, core, seed=None, extra=()):
    """One torch baseline as a child process; its JSON line as a dict."""
    env = dict(os.environ)
    if core and "OPENBLAS_CORETYPE" not in env:
        env["OPENBLAS_CORETYPE"] = core
    cmd = [sys.executable, os.path.join(HERE, script), "--epochs", str(args.epochs)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    cmd += list(extra)
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


def summarize(runs):
    """One side's runs -> a dict like one run's, figures averaged over the runs."""
    out = dict(runs[-1])
    for key in ("examples_per_s", "test_accuracy_epoch1", "test_accuracy_final", "cpu_s"):
        out[key] = mean(runs, key)
    if all("steady_examples_per_s" in r for r in runs):
        out["steady_examples_per_s"] = mean(runs, "steady_examples_per_s")
    return out


def acc_line(name, dgs, runs, paired):
    """dg's test accuracy minus side name's after epoch 1 and at the end: the difference of
    the means, its standard error and t (Welch's for independent runs; paired: the mean of
    the per-seed differences), and the final difference (for the target)."""
    text = f"accuracy dg - {name:<12}"
    dn = None
    for label, idx in (("epoch 1", 0), ("final", -1)):
        a = [r["test_accuracy"][idx] for r in dgs]
        b = [r["test_accuracy"][idx] for r in runs]
        if paired:
            d, se = stats([x - y for x, y in zip(a, b)])
            t = d / se if se > 0 else None
        else:
            d, se, t, _ = welch(a, b)
        text += f" {label} {d:+.4f}"
        if len(runs) > 1:
            text += f" (se {se:.4f}" + (f", t {t:+.1f})" if t is not None else ")")
        dn = d
    return text, dn


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
    ap.add_argument("--torch", default="single,rpc",
                    help="the torch sides to run, comma-separated: single, rpc "
                    "(default both)")
    ap.add_argument("--timeout-s", type=float, default=1800,
                    help="cancel dg's job and fail after this long (default 1800)")
    ap.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                    help="train every side N times, run i with seed i (data order and "
                    f"initial weights), and compare means (default {DEFAULT_SEEDS}; 1: one run "
                    "with the graph's own seeds)")
    ap.add_argument("--seed-base", type=int, default=1,
                    help="with --seeds N: seeds SEED_BASE .. SEED_BASE+N-1 (default 1)")
    ap.add_argument("--own-streams", action="store_true",
                    help="let each torch side draw its own data order and initial weights "
                    "from its seed (numpy, torch) and compare independent means; default: "
                    "it gets dg's (ShardBatch's permutations, the Variables' glorot values) "
                    "and the accuracies are compared seed by seed")
    ap.add_argument("--json", metavar="FILE", help="write every run's figures to FILE")
    ap.add_argument("--strict", action="store_true", help="exit 4 when a target is missed")
    ap.add_argument("--mode", metavar="MODES",
                    help="instead of the torch comparison: train the MLP each way of "
                    "MODES (comma-separated: between_graph, model_parallel, in_graph; all), "
                    "alternating, and print examples/s and the bytes crossing tasks per step "
                    "against the minimum (modes.py)")
    ap.add_argument("--input", metavar="INPUTS",
                    help="instead of the torch comparison: train the MLP fed from static "
                    "shards and from the shared queue (comma-separated: shards, queue), "
                    "alternating, and print examples/s and CPU per example of each "
                    "(modes.py)")
    ap.add_argument("--pipeline", action="store_true",
                    help="instead of the torch comparison: an MLP split over 2 workers "
                    "(--pipeline-model, --pipeline-cut) with microbatches 1 and 4, "
                    "alternating (modes.py)")
    ap.add_argument("--faults", action="store_true",
                    help="instead of the torch comparison: the MLP with its ps killed twice "
                    "per run against undisturbed runs: restart -> next step, examples/s, "
                    "accuracy (faults.py)")
    ap.add_argument("--fault-epochs", type=int, default=8,
                    help="with --faults: epochs of each job (default 8)")
    ap.add_argument("--runs", type=int, default=3,
                    help="with --mode/--pipeline/--input/--faults: runs of each side "
                    "(default 3)")
    ap.add_argument("--mode-steps", type=int, default=1500,
                    help="with --mode: training steps of each job (default 1500)")
    ap.add_argument("--pipeline-steps", type=int, default=150,
                    help="with --pipeline: training steps of each job (default 150)")
    ap.add_argument("--pipeline-model", default="784-512-512-1024-10",
                    help="with --pipeline: the MLP's layer widths (default 784-512-512-1024-10)")
    ap.add_argument("--pipeline-cut", type=int, default=2,
                    help="with --pipeline: layers on worker 0 (default 2)")
    ap.add_argument("--pipeline-batch", type=int, default=256,
                    help="with --pipeline: the batch, cut into 4 micro-batches (default 256)")
    args = ap.parse_args()
    args.same_start = not args.own_streams
    args.dg = args.dg or os.path.join(args.build, "cli", "dg")
    if not os.access(args.dg, os.X_OK):
        print(f"bench_train: no dg binary at {args.dg} (build first, or give --dg)",
              file=sys.stderr)
        return 1
    if args.faults:
        import faults
        if args.runs < 1 or args.fault_epochs < 1:
            print("bench_train: --faults needs --runs >= 1 and --fault-epochs >= 1",
                  file=sys.stderr)
            return 1
        try:
            return faults.bench_faults(args)
        except (RuntimeError, OSError, subprocess.CalledProcessError, KeyError,
                ValueError) as e:
            print(f"bench_train: {e}", file=sys.stderr)
            return 1
    if args.input:
        import modes
        wanted = [i for i in args.input.split(",") if i]
        bad = [i for i in wanted if i not in modes.INPUTS]
        if bad or not wanted or args.runs < 1:
            print(f"bench_train: --input {args.input}: inputs are "
                  f"{', '.join(modes.INPUTS)}; --runs >= 1", file=sys.stderr)
            return 1
        try:
            return modes.bench_inputs(args, wanted)
        except (RuntimeError, OSError, subprocess.CalledProcessError, KeyError,
                ValueError) as e:
            print(f"bench_train: {e}", file=sys.stderr)
            return 1
    if args.mode or args.pipeline:
        import modes
        wanted = list(modes.EXAMPLES) if args.mode == "all" else \
            [m for m in (args.mode or "").split(",") if m]
        bad = [m for m in wanted if m not in modes.EXAMPLES]
        if bad or args.runs < 1:
            print(f"bench_train: --mode {args.mode}: modes are {', '.join(modes.EXAMPLES)} "
                  f"(or all); --runs >= 1", file=sys.stderr)
            return 1
        try:
            st = modes.bench_modes(args, wanted) if wanted else 0
            return max(st, modes.bench_pipeline(args) if args.pipeline else 0)
        except (RuntimeError, OSError, subprocess.CalledProcessError, KeyError,
                ValueError) as e:
            print(f"bench_train: {e}", file=sys.stderr)
            return 1
    if args.seeds < 1:
        print("bench_train: --seeds must be >= 1", file=sys.stderr)
        return 1
    names = []
    for t in args.torch.split(","):
        if t not in ("single", "rpc"):
            print(f"bench_train: --torch {args.torch}: sides are single and rpc",
                  file=sys.stderr)
            return 1
        names.append("torch_" + t)
    with open(args.graph) as f:
        graph = json.load(f)
    graph["training"]["epochs"] = args.epochs
    graph["training"].pop("steps", None)
    try:
        recipe = recipe_of(graph)
    except (ValueError, KeyError) as e:
        print(f"bench_train: {args.graph}: {e}; use --no-torch", file=sys.stderr)
        return 1
    if args.same_start and not dg_start(graph) and "cnn" in recipe:
        # dg's data order and weights are mirrored for the MLP only
        args.same_start = False
    if args.same_start and not dg_start(graph) and not args.no_torch:
        print(f"bench_train: the torch sides train the model of examples/mlp.json (one "
              f"shuffling ShardBatch, glorot Variables [784,256] and [256,10]); "
              f"{args.graph} has another: use --no-torch", file=sys.stderr)
        return 1

    print(f"bench_train: {os.path.relpath(args.graph, ROOT)}, {args.epochs} epochs, batch "
          f"{graph['training'].get('batch')}, {json.dumps(graph['training']['optimizer'])}, "
          f"dg {args.workers} worker(s); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs", flush=True)
    torch_ok = not args.no_torch and importlib.util.find_spec("torch") is not None
    if not args.no_torch and not torch_ok:
        print("torch: skipped: python3-torch is not installed "
              "(sudo apt-get install python3-torch)")
    if torch_ok and args.same_start:
        problem = check_dg_order(args.dg, args.seed_base)
        if problem:
            print(f"bench_train: {problem}; fix bench/train/common.py or use --own-streams",
                  file=sys.stderr)
            return 1
    if args.seeds == 1:
        seeds = [None]
    else:
        seeds = list(range(args.seed_base, args.seed_base + args.seeds))
        print(f"seeds {seeds[0]}..{seeds[-1]}"
              + ("; the torch sides start from dg's order and weights of each seed"
                 if args.same_start else ""), flush=True)
    # Per seed: dg, then each torch side, so a change of the machine's load during the
    # bench touches every side alike.
    runs = {"dg": []}
    runs.update({n: [] for n in names} if torch_ok else {})
    core = None
    for sd in seeds:
        g = graph if sd is None else seeded(graph, sd)
        try:
            runs["dg"].append(run_dg(args, g))
        except (RuntimeError, OSError, subprocess.CalledProcessError, KeyError,
                ValueError) as e:
            print(f"bench_train: dg run failed: {e}", file=sys.stderr)
            return 1
        if "chosen by dg" in runs["dg"][-1]["openblas_how"]:
            core = runs["dg"][-1]["openblas_core"].capitalize()
        for name in runs:
            if name == "dg":
                continue
            try:
                runs[name].append(run_torch(name + ".py", args, core, sd,
                                            (dg_start(g) if args.same_start else [])
                                            + recipe))
            except (RuntimeError, ValueError) as e:
                print(f"bench_train: {name} failed: {e}", file=sys.stderr)
                return 1
        if sd is not None:
            print(f"seed {sd}: test accuracy per epoch " + "  ".join(
                f"{name} {' '.join('%.4f' % a for a in rs[-1]['test_accuracy'])}"
                for name, rs in runs.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seeds": seeds, "same_start": args.same_start, "runs": runs}, f,
                      indent=1)
    dg = summarize(runs["dg"])
    if len(seeds) > 1:
        print(f"means over {len(seeds)} seeds below", flush=True)
    print(line(dg) + f"  ({dg['openblas_how']}; OPENBLAS_NUM_THREADS {dg['blas_threads']})",
          flush=True)
    print(f"{'':<13} wall {dg['wall_s']:.2f} s from submit to done: "
          f"{dg['wall_examples_per_s']:.0f} ex/s; eval epochs {dg['eval_epochs']}, "
          f"stale {dg['stale']}", flush=True)
    steps = [r["eval_steps"][0] for r in runs["dg"]]
    spe = runs["dg"][0]["examples"] // runs["dg"][0]["workers"] // \
        graph["training"]["batch"] // args.epochs
    if args.workers > 1:
        print(f"{'':<13} epoch 1 evaluated at mean replica step "
              + (f"{steps[0]}" if min(steps) == max(steps) else f"{min(steps)}-{max(steps)}")
              + f" (an epoch is {spe} steps)", flush=True)
    if "steady_examples_per_s" in dg:
        print(f"{'':<13} steady state (metrics rows after the first chunk): "
              f"{dg['steady_examples_per_s']:.0f} ex/s; start-up ~{dg['startup_s']:.1f} s "
              f"(placement, init, reading the dataset)", flush=True)
    res = {name: summarize(rs) for name, rs in runs.items() if name != "dg"}
    for name, r in res.items():
        print(line(r), flush=True)
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
    for name in res:
        text, dn = acc_line(name, runs["dg"], runs[name], args.same_start)
        if name == "torch_rpc":
            met = dn >= ACC_TARGET
            text += (f"  (target final >= {ACC_TARGET:+.3f}"
                     f"{', means of %d seeds' % len(seeds) if len(seeds) > 1 else ''}: "
                     f"{'met' if met else 'MISSED'})")
            if not met and args.strict:
                status = 4
        print(text)
    cores = {dg["openblas_core"].lower()} | {r["openblas_core"].lower() for r in res.values()}
    if len(cores) > 1:
        print(f"WARNING: the sides ran different OpenBLAS cores: {sorted(cores)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
