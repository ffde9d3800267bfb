"""bench_train.py --mode / --pipeline: the ways to distribute one model, side by side in one
run (doc/training.md, "Replication").

--mode between_graph,model_parallel,in_graph trains the demo MLP (784-256-10, batch 64) on
1 ps + 2 workers each way, the modes alternating run by run so that a change of the load
touches each alike: between_graph (examples/mlp.json: a replica per worker), model_parallel
(examples/mlp_model_parallel.json: layer 1 on worker 0, layer 2 on worker 1) and in_graph
(examples/mlp_in_graph.json: 2 towers, their gradients summed on the ps). Each job trains
--steps steps without evals. Printed per mode: the median examples/s (the job's status)
and the bytes that crossed tasks per training step, against the minimum of the mode:

  measured  = (request and reply body bytes every server counted, dg_http_bytes_*_total,
               minus the tensor bytes of a task's variable requests to its own ps,
               dg_worker_ps_bytes_total{peer="self"}, minus the bench's own requests)
              / the training steps of all replicas;
  minimum   = between_graph: 2V per replica step (pull every variable, push its gradient);
              model_parallel: 2V + the activations at the cut and their gradient
              (2 x batch x 256 x 4) + the labels the second stage needs (batch x 4);
              in_graph: 2V per tower (each tower pulls the variables and pushes its part
              of each gradient to the ps, which sums them); V = the trained variables'
              bytes.

--pipeline trains an MLP split over two workers (--pipeline-model, default
784-512-512-1024-10, cut after --pipeline-cut layers, default 2) with "microbatches": 1
and 4, alternating, and prints the median examples/s of each and their ratio (target:
M=4 >= 1.3x M=1). It prints each stage's multiply-adds an example over a step, forward
and backward: a layer costs its forward, its weight gradient and (except the first
layer, whose input needs no gradient) its input gradient. Pipelining's best case is
(s1 + s2) / (max(s1, s2) + min(s1, s2) / M): the default split has 1589k against 1604k
(best 1.6x at M=4); the earlier 784-512-512-512-10 cut after layer 1 had 802k against
1588k (best 1.34x), too unequal for 1.3x.
"""
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from dgrun import cpu_s, http

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = {"between_graph": "mlp.json", "model_parallel": "mlp_model_parallel.json",
            "in_graph": "mlp_in_graph.json"}
PIPELINE_TARGET = 1.3
BYTES_TARGET = 1.1


class Cluster:
    """dg up of 1 ps + N workers in a temp dir (the user's cluster is untouched)."""

    def __init__(self, dg, workers, blas_threads, up_args=()):
        self.dg, self.tmp = dg, tempfile.mkdtemp(prefix="dg-bench-modes-")
        self.env = dict(os.environ, XDG_RUNTIME_DIR=self.tmp, HOME=self.tmp)
        if blas_threads > 0:
            self.env["OPENBLAS_NUM_THREADS"] = str(blas_threads)
        self.dir = os.path.join(self.tmp, "cluster")
        subprocess.run([dg, "up", "--dir", self.dir, "--ps", "1", "--workers", str(workers),
                        *up_args], env=self.env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.dir, "cluster.json")) as f:
            spec = json.load(f)
        self.addrs = spec["ps"] + spec["worker"]
        self.master = spec["worker"][0]
        self.pids = []
        for name in os.listdir(self.dir):
            if name.endswith(".pid"):
                with open(os.path.join(self.dir, name)) as f:
                    self.pids.append(int(f.read().split()[0]))
        self.own = 0            # body bytes of the bench's own requests and replies

    def get(self, path, addr=None):
        st, body = http("GET", f"http://{addr or self.master}{path}")
        self.own += len(body)
        return st, body

    def counters(self):
        """Body bytes every server counted, less what tasks sent their own ps."""
        total = 0
        for a in self.addrs:
            st, body = self.get("/v1/metrics", a)
            if st != 200:
                raise RuntimeError(f"GET {a}/v1/metrics: {st}")
            for ln in body.decode().splitlines():
                name, _, val = ln.rpartition(" ")
                if name in ("dg_http_bytes_received_total", "dg_http_bytes_sent_total"):
                    total += int(float(val))
                elif name.startswith("dg_worker_ps_bytes_total") and 'peer="self"' in name:
                    total -= int(float(val))
        return total

    def train(self, graph, timeout_s):
        """Run graph's training job to its end: (status, bytes crossed, cpu s)."""
        before, cpu0 = self.counters(), cpu_s(self.pids)
        self.own = 0
        body = json.dumps({"graph": graph}).encode()
        st, reply = http("POST", f"http://{self.master}/v1/jobs", body)
        self.own += len(body) + len(reply)
        if st != 201:
            raise RuntimeError(f"POST /v1/jobs: {st} {reply.decode(errors='replace')}")
        job, t0 = json.loads(reply)["id"], time.time()
        while True:
            time.sleep(0.5)
            st, reply = self.get(f"/v1/jobs/{job}")
            status = json.loads(reply)
            if status["state"] not in ("created", "running"):
                break
            if time.time() - t0 > timeout_s:
                http("DELETE", f"http://{self.master}/v1/jobs/{job}")
                raise RuntimeError(f"job {job} still running after {timeout_s} s; canceled")
        if status["state"] != "done":
            raise RuntimeError(f"job {job} {status['state']}: {json.dumps(status.get('error'))}")
        st, reply = self.get(f"/v1/jobs/{job}/metrics")
        status["steady_examples_per_s"] = steady(reply.decode(), status["training"])
        own = self.own
        crossed = self.counters() - before - own
        return status, crossed, cpu_s(self.pids) - cpu0

    def close(self):
        subprocess.run([self.dg, "down", "--dir", self.dir], env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.tmp, ignore_errors=True)


def steady(csv_text, tr):
    """examples/s from the job's first metrics row after step 0 to its last (the first
    chunk, which reads the dataset, left out); the status's figure when too few rows."""
    rows = [r for r in csv.DictReader(io.StringIO(csv_text)) if r.get("loss")]
    rows = [r for r in rows if int(r["step"]) > 0]
    per_step = tr["replicas"] * tr["batch"]
    if len(rows) < 2 or float(rows[-1]["time_s"]) <= float(rows[0]["time_s"]):
        return tr["examples_per_s"]
    return ((int(rows[-1]["step"]) - int(rows[0]["step"])) * per_step /
            (float(rows[-1]["time_s"]) - float(rows[0]["time_s"])))


def training_only(graph, steps, tag):
    """graph trained for steps steps, no evals, fresh variables under tag/."""
    g = json.loads(json.dumps(graph))
    t = g["training"]
    t.pop("epochs", None)
    t.pop("eval", None)
    t["steps"], t["reinit"] = steps, True
    for n in g["nodes"]:
        if n["op"] == "Variable":
            a = n.setdefault("attrs", {})
            a["var"] = f"{tag}/{a.get('var', n['name'])}"
    return g


def var_bytes(graph):
    """Bytes of the graph's float32 Variables."""
    total = 0
    for n in graph["nodes"]:
        if n["op"] == "Variable":
            k = 1
            for d in n["attrs"]["shape"]:
                k *= d
            total += 4 * k
    return total


def minimum(mode, graph, status):
    """The fewest bytes that must cross tasks per training step of one replica."""
    v, batch = var_bytes(graph), graph["training"].get("batch", 64)
    if mode == "model_parallel":
        hidden = next(n["attrs"]["shape"][1] for n in graph["nodes"] if n["name"] == "w1")
        return 2 * v + 2 * batch * hidden * 4 + batch * 4
    if mode == "in_graph":
        return 2 * v * graph["training"].get("towers", 1)
    return 2 * v


def load(name):
    with open(os.path.join(ROOT, "examples", name)) as f:
        return json.load(f)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def bench_modes(args, modes):
    print(f"modes: {', '.join(modes)}; {args.mode_steps} steps each, {args.runs} runs "
          f"alternating; 1 ps + 2 workers; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs", flush=True)
    res = {m: {"xps": [], "bytes": [], "min": 0, "cpu_us": []} for m in modes}
    for run in range(args.runs):
        for m in modes:
            cl = Cluster(args.dg, 2, args.dg_blas_threads)
            try:
                g = training_only(load(EXAMPLES[m]), args.mode_steps, f"bench_{m}_{run}")
                status, crossed, cpu = cl.train(g, args.timeout_s)
            finally:
                cl.close()
            tr = status["training"]
            steps = sum(tr["replica_steps"])
            r = res[m]
            r["xps"].append(status["steady_examples_per_s"])
            r["bytes"].append(crossed / steps)
            r["min"] = minimum(m, g, status)
            r["cpu_us"].append(cpu / max(tr["examples"], 1) * 1e6)
            print(f"run {run + 1} {m:<15} {status['steady_examples_per_s']:8.0f} ex/s  "
                  f"{crossed / steps / 1e6:7.3f} MB crossed per replica step "
                  f"({tr['replicas']} replica(s), {steps} steps)", flush=True)
    status = 0
    print(f"medians of {args.runs} runs; load average {os.getloadavg()[0]:.1f}")
    for m in modes:
        r = res[m]
        ratio = med(r["bytes"]) / r["min"]
        met = ratio <= BYTES_TARGET
        print(f"{m:<15} {med(r['xps']):8.0f} ex/s  {med(r['cpu_us']):6.1f} CPU us/example  "
              f"bytes per step {med(r['bytes']) / 1e6:.3f} MB, minimum "
              f"{r['min'] / 1e6:.3f} MB: {ratio:.3f}x (target <= {BYTES_TARGET}: "
              f"{'met' if met else 'MISSED'})")
        if not met and args.strict:
            status = 4
    return status


def stage_costs(sizes, cut):
    """Multiply-adds an example of each stage over a step (forward + backward)."""
    s = [0, 0]
    for i in range(len(sizes) - 1):
        mac = sizes[i] * sizes[i + 1]
        s[0 if i < cut else 1] += mac * (2 if i == 0 else 3)
    return s


def pipeline_graph(micro, batch, steps, tag, sizes, cut):
    """An MLP of layer widths sizes: its first cut layers on worker 0, the rest and
    the loss on worker 1."""
    P = "/usr/share/datasets/fashion-mnist/"
    d0, d1 = "/job:worker/task:0", "/job:worker/task:1"
    nodes = [
        {"name": "x", "op": "IdxReader", "attrs": {"path": P + "train-images-idx3-ubyte.gz",
                                                   "scale": True, "flatten": True}},
        {"name": "y", "op": "IdxReader", "attrs": {"path": P + "train-labels-idx1-ubyte.gz"}},
        {"name": "batch", "op": "ShardBatch", "inputs": ["x", "y"], "attrs": {"batch": batch,
                                                                             "seed": 3}},
    ]
    prev, layers = "batch:0", len(sizes) - 1
    for i in range(layers):
        dev = d0 if i < cut else d1
        w, b = f"{tag}/w{i + 1}", f"{tag}/b{i + 1}"
        nodes += [
            {"name": f"w{i + 1}", "op": "Variable", "attrs": {
                "var": w, "shape": [sizes[i], sizes[i + 1]], "init": "glorot", "seed": i + 1}},
            {"name": f"b{i + 1}", "op": "Variable", "attrs": {"var": b, "shape": [sizes[i + 1]]}},
            {"name": f"mm{i + 1}", "op": "MatMul", "inputs": [prev, f"w{i + 1}"],
             "device": dev},
            {"name": f"z{i + 1}", "op": "Add", "inputs": [f"mm{i + 1}", f"b{i + 1}"],
             "device": dev},
        ]
        prev = f"z{i + 1}"
        if i < layers - 1:
            nodes.append({"name": f"h{i + 1}", "op": "Relu", "inputs": [prev], "device": dev})
            prev = f"h{i + 1}"
    nodes += [
        {"name": "xent", "op": "SparseSoftmaxCrossEntropyWithLogits",
         "inputs": [prev, "batch:1"], "device": d1},
        {"name": "loss", "op": "Mean", "inputs": ["xent"], "device": d1},
    ]
    t = {"loss": "loss", "optimizer": {"rule": "sgd", "lr": 0.05}, "steps": steps,
         "reinit": True}
    if micro > 1:
        t["microbatches"] = micro
    return {"version": 1, "nodes": nodes, "training": t}


def bench_pipeline(args):
    batch, steps = args.pipeline_batch, args.pipeline_steps
    try:
        sizes = [int(v) for v in args.pipeline_model.split("-")]
    except ValueError:
        sizes = []
    if len(sizes) < 3 or min(sizes) < 1 or not 1 <= args.pipeline_cut < len(sizes) - 1:
        print(f"bench_train: --pipeline-model {args.pipeline_model} --pipeline-cut "
              f"{args.pipeline_cut}: need widths like 784-512-10 and a cut in 1..layers-1",
              file=sys.stderr)
        return 2
    s1, s2 = stage_costs(sizes, args.pipeline_cut)
    best = (s1 + s2) / (max(s1, s2) + min(s1, s2) / 4)
    print(f"pipeline: {args.pipeline_model} split after layer {args.pipeline_cut} (worker 0 "
          f"| worker 1: {s1 / 1e3:.0f}k | {s2 / 1e3:.0f}k multiply-adds an example a step, "
          f"best case {best:.2f}x at M=4), batch {batch}, {steps} steps, microbatches 1 and "
          f"4 alternating, {args.runs} runs; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs", flush=True)
    xps = {1: [], 4: []}
    for run in range(args.runs):
        for micro in (1, 4):
            cl = Cluster(args.dg, 2, args.dg_blas_threads)
            try:
                status, _, cpu = cl.train(pipeline_graph(micro, batch, steps,
                                                         f"bench_pipe_{micro}_{run}", sizes,
                                                         args.pipeline_cut),
                                          args.timeout_s)
            finally:
                cl.close()
            x = status["steady_examples_per_s"]
            xps[micro].append(x)
            wall = status["training"]["examples"] / status["training"]["examples_per_s"]
            print(f"run {run + 1} microbatches {micro}: {x:8.0f} ex/s  loss "
                  f"{status['training']['loss']:.4f}  CPU {cpu / wall:.2f} cores "
                  f"({cpu / steps * 1e3:.1f} CPU ms a step)", flush=True)
    ratio = med(xps[4]) / med(xps[1])
    met = ratio >= PIPELINE_TARGET
    print(f"medians: microbatches 1 {med(xps[1]):.0f} ex/s, 4 {med(xps[4]):.0f} ex/s: "
          f"{ratio:.2f}x (target >= {PIPELINE_TARGET}: {'met' if met else 'MISSED'}); load "
          f"average {os.getloadavg()[0]:.1f}")
    return 4 if args.strict and not met else 0


INPUTS = {"shards": "mlp.json", "queue": "mlp_queue.json"}
INPUT_TARGET = 0.9


def epochs_only(graph, epochs, tag):
    """graph trained for its epochs without evals, fresh variables under tag/."""
    g = json.loads(json.dumps(graph))
    t = g["training"]
    t.pop("eval", None)
    t["epochs"], t["reinit"] = epochs, True
    for n in g["nodes"]:
        if n["op"] == "Variable":
            a = n.setdefault("attrs", {})
            a["var"] = f"{tag}/{a.get('var', n['name'])}"
    return g


def bench_inputs(args, inputs):
    """--input queue,shards: the demo MLP fed from static shards (examples/mlp.json) and
    from the shared queue (examples/mlp_queue.json: its feeder on the ps, leased batches),
    alternating, 1 ps + 2 workers, the same epochs; examples/s are the job's (examples
    applied over its time), CPU is every task's."""
    print(f"inputs: {', '.join(inputs)}; {args.epochs} epochs each, no evals, {args.runs} runs "
          f"alternating; 1 ps + 2 workers; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs", flush=True)
    res = {i: {"xps": [], "cpu_us": [], "ms": []} for i in inputs}
    for run in range(args.runs):
        for i in inputs:
            cl = Cluster(args.dg, 2, args.dg_blas_threads)
            try:
                g = epochs_only(load(INPUTS[i]), args.epochs, f"bench_{i}_{run}")
                status, _, cpu = cl.train(g, args.timeout_s)
            finally:
                cl.close()
            tr = status["training"]
            r = res[i]
            r["xps"].append(tr["examples_per_s"])
            r["cpu_us"].append(cpu / max(tr["examples"], 1) * 1e6)
            r["ms"].append(status["ms"]["mean_step"])
            print(f"run {run + 1} {i:<7} {tr['examples_per_s']:8.0f} ex/s  "
                  f"{r['cpu_us'][-1]:6.1f} CPU us/example  {tr['examples']} examples, "
                  f"replica steps {tr['replica_steps']}", flush=True)
    print(f"medians of {args.runs} runs; load average {os.getloadavg()[0]:.1f}")
    for i in inputs:
        r = res[i]
        print(f"{i:<7} {med(r['xps']):8.0f} ex/s  {med(r['cpu_us']):6.1f} CPU us/example  "
              f"mean step {med(r['ms']):.2f} ms")
    status = 0
    if "queue" in res and "shards" in res:
        ratio = med(res["queue"]["xps"]) / med(res["shards"]["xps"])
        met = ratio >= INPUT_TARGET
        print(f"queue / shards examples/s {ratio:.2f}x (target >= {INPUT_TARGET}: "
              f"{'met' if met else 'MISSED'}); CPU per example "
              f"{med(res['queue']['cpu_us']) / med(res['shards']['cpu_us']):.2f}x")
        if not met and args.strict:
            status = 4
    return status
