"""tf.train: the cluster (ClusterSpec, Server, replica_device_setter) and
training (the optimizers, whose minimize() builds a Minimize node that the
master differentiates; fit(), which submits a whole training job)."""

import atexit
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from . import errors
from ._binary import dg_binary
from ._http import split_target, token_from_env
from .framework import DeviceSpec

__all__ = ["ClusterSpec", "Server", "replica_device_setter"]


class ClusterSpec:
    """tf.train.ClusterSpec({"job": ["host:port", ...] or {index: "host:port"}})."""

    def __init__(self, cluster):
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        if not isinstance(cluster, dict):
            raise TypeError("ClusterSpec takes a dict of job name to addresses, got %r"
                            % (cluster,))
        self._jobs = {}
        for job, tasks in cluster.items():
            if not isinstance(job, str) or not job:
                raise ValueError("job name %r must be a non-empty string" % (job,))
            if isinstance(tasks, dict):
                self._jobs[job] = {int(i): str(a) for i, a in tasks.items()}
            elif isinstance(tasks, (list, tuple)):
                self._jobs[job] = {i: str(a) for i, a in enumerate(tasks)}
            else:
                raise TypeError("job %r: tasks must be a list or dict of addresses" % job)

    @property
    def jobs(self):
        return list(self._jobs)

    def as_dict(self):
        out = {}
        for job, tasks in self._jobs.items():
            idx = sorted(tasks)
            out[job] = [tasks[i] for i in idx] if idx == list(range(len(idx))) else dict(tasks)
        return out

    def num_tasks(self, job_name):
        return len(self._tasks(job_name))

    def task_indices(self, job_name):
        return sorted(self._tasks(job_name))

    def task_address(self, job_name, task_index):
        t = self._tasks(job_name)
        if task_index not in t:
            raise ValueError("no task %d in job %r" % (task_index, job_name))
        return t[task_index]

    def job_tasks(self, job_name):
        """The addresses of the job's tasks by index, None where an index is missing."""
        t = self._tasks(job_name)
        return [t.get(i) for i in range(max(t) + 1)] if t else []

    def _tasks(self, job_name):
        if job_name not in self._jobs:
            raise ValueError("no such job in cluster: %r (jobs: %s)"
                             % (job_name, ", ".join(self._jobs)))
        return self._jobs[job_name]

    def __bool__(self):
        return bool(self._jobs)

    def __eq__(self, other):
        return isinstance(other, ClusterSpec) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "ClusterSpec(%r)" % self.as_dict()

    def to_json(self):
        """The cluster file dg server reads (sparse jobs as {"index": address})."""
        d = self.as_dict()
        return json.dumps({j: (t if isinstance(t, list) else {str(i): a for i, a in t.items()})
                           for j, t in d.items()})


# --- servers -------------------------------------------------------------------

_servers = []


def _stop_all():
    for s in list(_servers):
        s.stop()


atexit.register(_stop_all)


def _die_with_parent():
    """In the child: SIGTERM when the Python process that started it dies, so a
    killed script leaves no server behind (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class _Spawner:
    """Starts server processes from one thread that lives as long as the
    interpreter: PR_SET_PDEATHSIG fires when the *thread* that forked the
    child ends, so a server started from a short-lived thread (a queue
    runner making a session's first run) would be stopped with it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs = None

    def popen(self, cmd, **kw):
        import queue
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.Queue()
                threading.Thread(target=self._main, name="dg-server-spawner",
                                 daemon=True).start()
        done = queue.Queue(1)
        self._jobs.put((cmd, kw, done))
        ok, got = done.get()
        if not ok:
            raise got
        return got

    def _main(self):
        while True:
            cmd, kw, done = self._jobs.get()
            try:
                done.put((True, subprocess.Popen(cmd, **kw)))
            except Exception as e:      # reaches the caller
                done.put((False, e))


_spawner = _Spawner()


class Server:
    """tf.train.Server(cluster, job_name=, task_index=): a ``dg server`` of that
    task in a child process, stopped when this Python process ends (or by
    stop()). Extra: data_dir=, token_file= and args= (more dg server flags)."""

    def __init__(self, server_or_cluster_def, job_name=None, task_index=None, protocol=None,
                 config=None, start=True, data_dir=None, token_file=None, args=()):
        cluster = ClusterSpec(server_or_cluster_def)
        if job_name is None:
            if len(cluster.jobs) != 1:
                raise ValueError("job_name must be given for a cluster of several jobs (%s)"
                                 % ", ".join(cluster.jobs))
            job_name = cluster.jobs[0]
        if task_index is None:
            task_index = cluster.task_indices(job_name)[0]
        self._address = cluster.task_address(job_name, int(task_index))
        self.cluster = cluster
        self.job_name, self.task_index = job_name, int(task_index)
        self._config = config
        self._data_dir, self._token_file, self._args = data_dir, token_file, list(args)
        self._proc = None
        self._tmp = None
        self._tail = []
        self._quiet = False
        if start:
            self.start()

    @classmethod
    def create_local_server(cls, config=None, start=True):
        """A one-task server on a free port of this machine (job "localhost")."""
        return cls({"localhost": ["localhost:0"]}, "localhost", 0, config=config, start=start)

    @property
    def target(self):
        """The address sessions reach it at: "grpc://host:port" (dg's HTTP)."""
        return "grpc://" + self.address

    @property
    def address(self):
        return self._address

    @property
    def server_def(self):
        return {"cluster": self.cluster.as_dict(), "job_name": self.job_name,
                "task_index": self.task_index}

    def start(self):
        if self._proc is not None and self._proc.poll() is None:
            return
        self._tmp = tempfile.TemporaryDirectory(prefix="dg-server-")
        spec = os.path.join(self._tmp.name, "cluster.json")
        port_file = os.path.join(self._tmp.name, "port")
        with open(spec, "w") as f:
            f.write(self.cluster.to_json())
        cmd = [dg_binary(), "server", "--cluster", spec, "--job", self.job_name, "--task",
               str(self.task_index), "--port-file", port_file]
        if self._config is not None and getattr(self._config, "allow_soft_placement", False):
            cmd.append("--soft-placement")
        if self._data_dir:
            cmd += ["--data-dir", self._data_dir]
        if self._token_file:
            cmd += ["--token-file", self._token_file]
        cmd += self._args
        self._proc = _spawner.popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        threading.Thread(target=self._pump, args=(self._proc,), daemon=True).start()
        _servers.append(self)
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            if self._proc.poll() is not None:
                self._proc.wait()
                time.sleep(0.05)        # the pump's last lines
                rc = self._proc.returncode
                _servers.remove(self)
                self._proc = None
                raise errors.from_exit(rc, "\n".join(self._tail)) from None
            if time.monotonic() > deadline:
                self.stop()
                raise errors.from_dg("timeout", "dg server %s/%d did not start in 30 s"
                                     % (self.job_name, self.task_index))
            time.sleep(0.01)
        with open(port_file) as f:
            port = int(f.read().strip())
        host = self._address.rpartition(":")[0]
        self._address = "%s:%d" % (host, port)

    def _pump(self, proc):
        """Copy the server's stderr to ours, keeping the last lines for errors.
        With $DG_SERVER_QUIET=1, and for a session's private server (its errors
        reach the caller as exceptions), its own "dg: " lines are not copied (anything
        else, such as a sanitizer's report, still is)."""
        quiet = self._quiet or os.environ.get("DG_SERVER_QUIET") == "1"
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._tail = (self._tail + [line])[-20:]
            if not (quiet and (line.startswith("dg: ") or " dg: " in line[:40])):
                print(line, file=sys.stderr, flush=True)

    def join(self):
        """Wait until the server stops (for ever, unless it is stopped or fails)."""
        p = self._proc
        if p is None:
            raise RuntimeError("the server is not started (or was stopped)")
        try:
            rc = p.wait()
        except KeyboardInterrupt:
            self.stop()
            raise
        if rc not in (0, -signal.SIGTERM):
            raise errors.from_exit(rc, "\n".join(self._tail))

    def stop(self):
        """Stop the server (SIGTERM: it checkpoints and exits) and wait for it."""
        p = self._proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._proc = None
        if self in _servers:
            _servers.remove(self)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


# --- placement -------------------------------------------------------------------

_PS_OPS = ("Variable", "Queue")


def replica_device_setter(ps_tasks=0, ps_device="/job:ps", worker_device="/job:worker",
                          merge_devices=True, cluster=None, ps_ops=None, ps_strategy=None):
    """A device function for tf.device: Variables (ps_ops) on the ps tasks in turn
    (or by ps_strategy(op) -> task), every other node on worker_device; device
    fields a node already has win. None when there is no ps task."""
    if cluster is not None:
        cl = ClusterSpec(cluster)
        ps_tasks = cl.num_tasks("ps") if "ps" in cl.jobs else 0
    if ps_tasks == 0:
        return None
    ops = tuple(ps_ops) if ps_ops is not None else _PS_OPS
    counter = [0]

    def round_robin(op):
        t = counter[0] % ps_tasks
        counter[0] += 1
        return t

    strategy = ps_strategy or round_robin

    def chooser(op):
        current = DeviceSpec.from_string(op.device or "")
        if ps_device and op.type in ops:
            ps = DeviceSpec.from_string(ps_device)
            if ps.job and (not current.job or current.job == ps.job):
                ps.task = strategy(op)
            return current.merged_over(ps).to_string()
        return current.merged_over(worker_device or "").to_string()

    return chooser




# --- optimizers ------------------------------------------------------------------

class Optimizer:
    """An update rule run on the ps (doc/training.md, "Optimizers and
    schedules"). minimize(loss) adds a Minimize node: running it is one training
    step (gradient and applies) with the run's feeds; fit() runs many."""

    _rule = None

    def __init__(self, **params):
        self._params = {k: v for k, v in params.items() if v is not None}
        lr = self._params.get("lr")
        if lr is not None and not isinstance(lr, (int, float)):
            raise TypeError("learning_rate must be a Python number here (a decay schedule "
                            "goes to fit(lr_schedule=...)), got %r" % (lr,))

    def optimizer_json(self):
        """The training section's "optimizer" object."""
        d = {"rule": self._rule}
        d.update(self._params)
        return d

    def minimize(self, loss, global_step=None, var_list=None, name=None, **ignored):
        from .framework import convert_to_tensor, group
        from .ops import _op, assign_add
        from . import dtypes as _dt
        t = convert_to_tensor(loss)
        attrs = dict(self._params, rule=self._rule)
        if var_list is not None:
            attrs["variables"] = [v.op.name for v in var_list]
        else:
            from .variables import trainable_variables
            tv = [v for v in trainable_variables() if v.graph is t.graph]
            gv = [v for v in t.graph.get_collection("variables") if v.graph is t.graph]
            if len(tv) != len(gv) and tv:  # untrainable ones exist: name the trainable
                attrs["variables"] = [v.op.name for v in tv]
        node = _op("Minimize", [t], attrs, name or self._name, _dt.int64, [None])
        node.op._loss = t
        node.op._optimizer = self
        if global_step is not None:
            return group(node, assign_add(global_step, 1), name=(name or self._name) + "_step")
        return node.op


class GradientDescentOptimizer(Optimizer):
    _rule, _name = "sgd", "GradientDescent"

    def __init__(self, learning_rate, use_locking=False, name=None):
        super().__init__(lr=learning_rate)


class MomentumOptimizer(Optimizer):
    _rule, _name = "momentum", "Momentum"

    def __init__(self, learning_rate, momentum, use_locking=False, name=None,
                 use_nesterov=False):
        super().__init__(lr=learning_rate, momentum=momentum, nesterov=bool(use_nesterov))


class AdamOptimizer(Optimizer):
    _rule, _name = "adam", "Adam"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-08,
                 use_locking=False, name=None):
        super().__init__(lr=learning_rate, beta1=beta1, beta2=beta2, eps=epsilon)


class AdagradOptimizer(Optimizer):
    _rule, _name = "adagrad", "Adagrad"

    def __init__(self, learning_rate, initial_accumulator_value=0.1, use_locking=False,
                 name=None):
        super().__init__(lr=learning_rate, init=initial_accumulator_value)


class RMSPropOptimizer(Optimizer):
    _rule, _name = "rmsprop", "RMSProp"

    def __init__(self, learning_rate, decay=0.9, momentum=0.0, epsilon=1e-10,
                 use_locking=False, centered=False, name=None):
        if centered:
            raise NotImplementedError("RMSPropOptimizer(centered=True): dg's rmsprop is not "
                                      "centered")
        super().__init__(lr=learning_rate, rho=decay, momentum=momentum, eps=epsilon)


__all__ += ["Optimizer", "GradientDescentOptimizer", "MomentumOptimizer", "AdamOptimizer",
            "AdagradOptimizer", "RMSPropOptimizer", "fit", "fit_json", "training_graph",
            "FitResult", "cluster_target"]


# --- whole training jobs ------------------------------------------------------------

def cluster_target(cluster=None):
    """The master of the cluster dg submit would use: task 0 of job "worker"
    (else of the first job) of cluster (a ClusterSpec, dict or file), else of
    $DG_CLUSTER (a file or the spec's text), else of the spec `dg up` wrote."""
    spec = cluster
    if spec is None:
        env = os.environ.get("DG_CLUSTER")
        if env and env.lstrip().startswith("{"):
            spec = json.loads(env)
        elif env:
            spec = env
        else:
            places = []
            if os.environ.get("XDG_RUNTIME_DIR"):
                places.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "dg", "cluster.json"))
            if os.environ.get("HOME"):
                places.append(os.path.join(os.environ["HOME"], ".dg", "cluster.json"))
            spec = next((p for p in places if os.path.exists(p)), None)
    if spec is None:
        raise errors.from_dg("not_found", "no cluster: give target= or cluster=, set "
                             "$DG_CLUSTER, or start one with 'dg up'")
    if isinstance(spec, str):
        with open(spec) as f:
            spec = json.load(f)
    cl = ClusterSpec(spec)
    job = "worker" if "worker" in cl.jobs else cl.jobs[0]
    return "grpc://" + cl.task_address(job, cl.task_indices(job)[0])


class FitResult:
    """What fit() returns: ``evals`` (the last evaluation's values, numpy
    arrays by the names of the eval dict), ``status`` (the job's final status,
    its ``training`` part with examples/s, loss and metrics) and ``job`` (its id)."""

    def __init__(self, job, status, evals):
        self.job, self.status, self.evals = job, status, evals

    def __repr__(self):
        return "FitResult(job=%r, evals=%r)" % (self.job, self.evals)


_FIT_DOC = """train_op: what an optimizer's minimize() returned. metrics and eval are
    dicts of name -> scalar tensor (metrics: collected every step, e.g. a batch
    accuracy; eval: computed after every eval_every_epochs epochs or
    eval_every_steps steps and at the end, e.g. a test accuracy); the other
    arguments are the training section's keys (doc/training.md)."""


def training_graph(train_op, epochs=None, steps=None, batch=None, metrics=None, eval=None,
                   eval_every_epochs=None, eval_every_steps=None, mode="async", replicas=None,
                   backup=None, checkpoint_secs=None, lr_schedule=None, reinit=False,
                   extra=None, doc=None):
    """The graph document fit() submits (a dict): what the loss, metrics and
    evals need, with a "training" section. """ + _FIT_DOC
    from .framework import Tensor
    from .session import _needed_ops
    op = train_op.op if isinstance(train_op, Tensor) else train_op
    if not hasattr(op, "_loss"):
        raise TypeError("fit takes what an optimizer's minimize() returned, got %r" % (train_op,))
    g, loss, opt = op.graph, op._loss, op._optimizer
    if (epochs is None) == (steps is None):
        raise ValueError("fit needs epochs or steps (one of them)")
    metrics = {k: _named(g, k, t) for k, t in (metrics or {}).items()}
    eval = {k: _named(g, k, t) for k, t in (eval or {}).items()}
    section = {"loss": loss._ref}
    if metrics:
        section["metrics"] = [t._ref for t in metrics.values()]
    section["optimizer"] = opt.optimizer_json()
    for k, v in (("lr_schedule", lr_schedule), ("epochs", epochs), ("steps", steps),
                 ("batch", batch), ("replicas", replicas), ("mode", mode), ("backup", backup),
                 ("checkpoint_secs", checkpoint_secs)):
        if v is not None:
            section[k] = v
    if eval:
        section["eval"] = {"fetch": [t._ref for t in eval.values()]}
        if eval_every_epochs:
            section["eval"]["every_epochs"] = int(eval_every_epochs)
        if eval_every_steps:
            section["eval"]["every_steps"] = int(eval_every_steps)
    if reinit:
        section["reinit"] = True
    section.update(extra or {})
    want = [loss] + list(metrics.values()) + list(eval.values())
    ops = _needed_ops(g, want)
    # A queue's enqueue_many ops are the job's feeders (TensorFlow's queue
    # runners): the training section sets their epochs, and they close the
    # queue after the last one. Not those that need a feed or another
    # queue's dequeue: they are for sess.run.
    queues = {o.name for o in ops if o.type == "Queue"}
    feeders = [o for o in g._ops
               if o.type == "QueueEnqueueMany" and o.attrs.get("queue") in queues and
               not any(d.type in ("Placeholder", "QueueDequeueMany")
                       for d in _needed_ops(g, [o.outputs[0]]))]
    if feeders:
        keep = {id(o) for o in ops + _needed_ops(g, [f.outputs[0] for f in feeders])}
        ops = [o for o in g._ops if id(o) in keep]
    out = {"version": 1}
    if doc:
        out["doc"] = doc
    out.update(g.as_graph_def(ops=[o for o in ops if o.type != "Minimize"]))
    for n in out["nodes"]:
        if n["op"] == "QueueEnqueueMany" and n.get("attrs", {}).get("close") is False:
            n["attrs"] = {k: v for k, v in n["attrs"].items() if k != "close"}
    if eval:
        out["fetch"] = [t._ref for t in eval.values()]
    out["training"] = section
    return out


def _named(graph, name, t):
    """t under the name the training job reports it by (its metrics and evals
    are named by node): t itself when its node has that name, else an Identity
    named so (made once per graph)."""
    from .framework import convert_to_tensor
    from .ops import identity
    t = convert_to_tensor(t)
    if t._ref == name:
        return t
    cache = graph.__dict__.setdefault("_fit_names", {})
    if (name, id(t)) not in cache:
        with graph.name_scope(None):
            cache[(name, id(t))] = identity(t, name=name)
    return cache[(name, id(t))]


def fit_json(train_op, **kw):
    """training_graph() as the JSON text dg submit reads."""
    return _fw_dumps(training_graph(train_op, **kw))


def fit(train_op, target=None, cluster=None, token_file=None, progress=True, **kw):
    """Train as one dg job: training_graph(train_op, **kw) submitted with
    ``dg submit`` to target (default: cluster_target(cluster)), its progress
    bar on stderr. Returns a FitResult. """ + _FIT_DOC
    doc = training_graph(train_op, **kw)
    evals_of = dict(zip((kw.get("eval") or {}).keys(), doc.get("fetch", [])))
    master = target or cluster_target(cluster)
    with tempfile.TemporaryDirectory(prefix="dg-fit-") as tmp:
        path = os.path.join(tmp, "graph.json")
        with open(path, "w") as f:
            f.write(_fw_dumps(doc))
        cmd = [dg_binary(), "submit", path, "--master", split_target(master)[1], "--json"]
        token = token_from_env(None, token_file)
        if token:
            tf = os.path.join(tmp, "token")
            with os.fdopen(os.open(tf, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(token + "\n")
            cmd += ["--token-file", tf]
        done = subprocess.run(cmd, stdout=subprocess.PIPE,
                              stderr=None if progress else subprocess.PIPE,
                              universal_newlines=True)
        if done.returncode != 0:
            raise errors.from_exit(done.returncode, done.stderr or
                                   "dg submit failed (its message is above)")
    status = json.loads(done.stdout)
    from .session import Session
    evals = {}
    if evals_of:
        with Session(master, token=token) as s:
            for name, ref in evals_of.items():
                v = s._job_client().get_npy("/v1/jobs/%s/results/%s" % (
                    status["id"], urllib.parse.quote(ref, safe="")))
                evals[name] = v[()] if v.ndim == 0 else v
    return FitResult(status["id"], status, evals)


def _fw_dumps(doc):
    from .framework import pretty
    return pretty(doc)


# --- input threads (queue_runner.py) ----------------------------------------------
from .queue_runner import (Coordinator, QueueRunner, add_queue_runner,  # noqa: E402
                           batch, shuffle_batch, start_queue_runners)

__all__ += ["Coordinator", "QueueRunner", "add_queue_runner", "start_queue_runners", "batch",
            "shuffle_batch"]
