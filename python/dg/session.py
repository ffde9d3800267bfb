"""tf.Session: runs parts of a graph and returns their values as numpy arrays.

- ``Session()`` runs in this machine: ``dg eval`` in a child process for a
  graph without Variables; with Variables (which live on a ps) it starts a
  private one-task server (train.Server.create_local_server) on first use and
  stops it at close.
- ``Session("grpc://host:port")`` (or http://, https://, host:port) submits
  each run as a job to the master at that address (POST /v1/jobs), waits on
  its events and reads the fetched values back as .npy.

Each run is one job of one step: what the fetches need is cut out of the
graph (the master runs only that), the feeds travel in the job (small ones as
JSON literals, large ones uploaded as .npy)."""

import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.parse

import numpy as np

from . import errors
from . import framework as _fw
from ._binary import dg_binary
from ._http import Client, npy_bytes, token_from_env
from .framework import Group, Operation, Tensor

__all__ = ["Session", "InteractiveSession", "ConfigProto", "get_default_session"]

# Ops that only a cluster runs (doc/ops.md: layer master, or a worker op that
# talks to a ps): a local session starts a server for them.
_CLUSTER_OPS = {"Variable", "ApplyGradient", "AssignMovingAverage", "Assign", "AssignAdd",
                "Queue", "QueueEnqueueMany", "QueueDequeueMany", "QueueClose", "QueueSize",
                "QueueAck", "Minimize"}

# Feeds of at most this many elements travel as JSON in the job; larger ones
# are uploaded as .npy (exact bytes, one copy).
_INLINE_FEED = 4096


class ConfigProto:
    """The session options dg has: allow_soft_placement (nodes placed on a GPU
    that is not there run on the CPU) and log_device_placement (print where each
    node ran, on stderr). Other TensorFlow options are accepted and ignored."""

    def __init__(self, allow_soft_placement=False, log_device_placement=False, **ignored):
        self.allow_soft_placement = bool(allow_soft_placement)
        self.log_device_placement = bool(log_device_placement)
        self.ignored = ignored


_default_sessions = []


def get_default_session():
    if not _default_sessions:
        raise ValueError("no default session: use 'with dg.Session() as sess:' or pass "
                         "session=")
    return _default_sessions[-1]


class _Fetch:
    """The flattened fetches of one run and how to rebuild their structure."""

    def __init__(self, graph, fetches):
        self.graph = graph
        self.elements = []           # Tensor, or None for an operation run for effect
        self.targets = []            # operations run for effect
        self.build = self._walk(fetches)

    def _walk(self, f):
        if isinstance(f, dict):
            parts = {k: self._walk(v) for k, v in f.items()}
            return lambda r: type(f)((k, b(r)) for k, b in parts.items())
        if isinstance(f, tuple) and hasattr(f, "_fields"):
            parts = [self._walk(v) for v in f]
            return lambda r: type(f)(*[b(r) for b in parts])
        if isinstance(f, (list, tuple)):
            parts = [self._walk(v) for v in f]
            return lambda r: type(f)(b(r) for b in parts)
        e = self._element(f)
        i = len(self.elements)
        self.elements.append(e if isinstance(e, Tensor) else None)
        if not isinstance(e, Tensor):
            self.targets.append(e)
        return lambda r: r[i]

    def _element(self, f):
        if isinstance(f, str):
            f = self.graph.as_graph_element(f)
        if hasattr(f, "_as_tensor"):
            f = f._as_tensor()
        if isinstance(f, (Tensor, Operation, Group)):
            if f.graph is not self.graph:
                raise ValueError("fetch %s is not an element of this session's graph" % f.name)
            return f
        if f is None:
            raise TypeError("fetch argument None has invalid type")
        raise TypeError("fetch argument %r is not a tensor, operation or name" % (f,))


def _target_refs(targets):
    """The outputs to fetch so that the master runs each target operation (a
    Group's members, and control dependencies, recursively)."""
    seen, refs, todo = set(), [], list(targets)
    while todo:
        op = todo.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        if isinstance(op, Group):
            todo.extend(op.members)
            continue
        todo.extend(op.control_inputs)
        if op.outputs:
            refs.append(op.outputs[0])
    return refs


def _needed_ops(graph, tensors):
    need, todo = set(), [t.op for t in tensors]
    while todo:
        op = todo.pop()
        if id(op) in need:
            continue
        need.add(id(op))
        todo.extend(op._deps())
    return [op for op in graph._ops if id(op) in need]


class Session:
    """tf.Session(target="", graph=None, config=None). Also token= / token_file=
    for servers started with --token-file (default $DG_TOKEN, $DG_TOKEN_FILE),
    and timeout_ms=, how long a task waits for another's tensor in a step."""

    def __init__(self, target="", graph=None, config=None, token=None, token_file=None,
                 timeout_ms=None):
        self.graph = graph or _fw.get_default_graph()
        self.config = config or ConfigProto()
        self.target = target or ""
        self._token = token_from_env(token, token_file)
        self._timeout_ms = timeout_ms
        self._client = Client(self.target, self._token) if self.target else None
        self._local = None
        # queue runners' threads share the session: _lock guards _local,
        # _closed, _docs and _own_queues
        self._lock = threading.Lock()
        self._closed = False
        self._docs = {}
        self._entered = []
        # The session's own queues (those without a shared_name) are named
        # NODE.TAG on their ps, and deleted when the session closes.
        self._tag = "s" + os.urandom(4).hex()
        self._own_queues = {}           # ps name -> ps address

    # -- lifetime
    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            local, self._local = self._local, None
            own, self._own_queues = self._own_queues, {}
        if self._client is not None:
            for name, address in own.items():
                self._delete_queue(name, address)
            self._client.close()
        if local is not None:               # its queues go with it
            local[1].close()
            local[0].stop()

    def _delete_queue(self, name, address):
        try:
            c = Client(address, self._token, timeout=10)
            try:
                c.request("DELETE", "/v1/queues/" + urllib.parse.quote(name, safe="/"),
                          ok=(200, 204, 404))
            finally:
                c.close()
        except errors.OpError:
            pass            # its ps is gone: so is the queue

    def __enter__(self):
        cm = self.as_default()
        cm.__enter__()
        self._entered.append(cm)
        return self

    def __exit__(self, *exc):
        self._entered.pop().__exit__(*exc)
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:       # noqa: BLE001 -- interpreter shutdown
            pass

    @contextlib.contextmanager
    def as_default(self):
        _default_sessions.append(self)
        try:
            yield self
        finally:
            _default_sessions.remove(self)

    # -- running
    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        """The values of fetches (a tensor, operation, name, or a list, tuple,
        namedtuple or dict of them) as numpy arrays, in the same structure;
        operations give None."""
        if self._closed:
            raise RuntimeError("attempted to use a closed Session")
        fx = _Fetch(self.graph, fetches)
        feeds = self._feeds(feed_dict or {})
        want = [t for t in fx.elements if t is not None] + _target_refs(fx.targets)
        refs = list(dict.fromkeys(t._ref for t in want))
        if not refs:
            return fx.build([None] * len(fx.elements))
        ops = self._graph_ops(want)
        if self._client is None and not any(op.type in _CLUSTER_OPS for op in ops):
            values = self._run_eval(ops, refs, feeds)
        else:
            values = self._run_job(ops, refs, feeds)
        return fx.build([None if t is None else _scalar(values[t._ref]) for t in fx.elements])

    def _graph_ops(self, want):
        key = (self.graph.version, frozenset(id(t.op) for t in want))
        with self._lock:
            ops = self._docs.get(key)
        if ops is None:
            ops = _needed_ops(self.graph, want)
            with self._lock:
                self._docs = {k: v for k, v in self._docs.items()
                              if k[0] == self.graph.version}
                self._docs[key] = ops
        return ops

    def _feeds(self, feed_dict):
        out = collections.OrderedDict()
        for k, v in feed_dict.items():
            t = k
            if isinstance(t, str):
                t = self.graph.as_graph_element(t if ":" in t else t + ":0")
            if hasattr(t, "_as_tensor"):
                t = t._as_tensor()
            if not isinstance(t, Tensor):
                raise TypeError("feed_dict key %r is not a tensor" % (k,))
            if t.graph is not self.graph:
                raise ValueError("feed %s is not an element of this session's graph" % t.name)
            try:
                arr = np.asarray(v, dtype=t.dtype.as_numpy_dtype)
            except (TypeError, ValueError) as e:
                raise TypeError("cannot feed %r to %s (%s): %s" % (v, t.name, t.dtype.name, e))
            s = t.shape
            if s.ndims is not None and (arr.ndim != s.ndims or any(
                    d is not None and d != a for d, a in zip(s.as_list(), arr.shape))):
                raise ValueError("Cannot feed value of shape %s for Tensor %r, which has "
                                 "shape %r" % (arr.shape, t.name, str(s)))
            out[t._ref] = arr
        return out

    # -- in this machine: dg eval
    def _run_eval(self, ops, refs, feeds):
        with tempfile.TemporaryDirectory(prefix="dg-session-") as tmp:
            gpath = os.path.join(tmp, "graph.json")
            with open(gpath, "w") as f:
                f.write(_fw.dumps(self.graph.as_graph_def(ops=ops)))
            cmd = [dg_binary(), "eval", gpath, "--out", os.path.join(tmp, "out")]
            for i, (name, arr) in enumerate(feeds.items()):
                p = os.path.join(tmp, "feed%d.npy" % i)
                np.save(p, arr, allow_pickle=False)
                cmd += ["--feed", "%s=%s" % (name, p)]
            for r in refs:
                cmd += ["--fetch", r]
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True)
            if done.returncode != 0:
                raise errors.from_exit(done.returncode, done.stderr)
            if self.config.log_device_placement:
                for op in ops:
                    print("%s: (%s): this process%s" % (op.name, op.type, " " + op.device
                                                        if op.device else ""), file=sys.stderr)
            out = {}
            for r in refs:
                fn = r.replace("/", "_").replace(":", "_") + ".npy"
                out[r] = np.load(os.path.join(tmp, "out", fn), allow_pickle=False)
            return out

    # -- on a cluster: a job
    def _job_client(self):
        if self._client is not None:
            return self._client
        with self._lock:
            if self._closed:
                raise RuntimeError("attempted to use a closed Session")
            if self._local is None:
                from .train import Server
                srv = Server.create_local_server(config=self.config, start=False)
                srv._quiet = True
                srv.start()
                self._local = (srv, Client(srv.target, self._token))
            return self._local[1]

    def _graph_doc(self, ops):
        """The graph document of ops, the session's own queues renamed."""
        doc = self.graph.as_graph_def(ops=ops)
        for n in doc["nodes"]:
            if n["op"] == "Queue" and "shared_name" not in n.get("attrs", {}):
                n["attrs"] = dict(n["attrs"], shared_name="%s.%s" % (n["name"], self._tag))
        return doc

    def _server_gone(self, e):
        """e, with the private server's last lines when it is the one that died."""
        local = self._local
        if local is None or local[0]._proc is None or local[0]._proc.poll() is None:
            return e
        tail = "\n".join(local[0]._tail[-5:])
        return errors.from_dg("unavailable", "%s (this session's local dg server exited "
                              "with status %s%s)" % (e.message, local[0]._proc.returncode,
                                                      ": " + tail if tail else ""))

    def _run_job(self, ops, refs, feeds):
        try:
            return self._run_job_on(self._job_client(), ops, refs, feeds)
        except errors.UnavailableError as e:
            raise self._server_gone(e) from None

    def _run_job_on(self, c, ops, refs, feeds):
        body = {"graph": self._graph_doc(ops), "fetch": refs}
        inline = {k: v for k, v in feeds.items() if v.size <= _INLINE_FEED}
        upload = [k for k in feeds if k not in inline]
        if inline:
            body["feeds"] = {k: _feed_literal(v) for k, v in inline.items()}
        if upload:
            body["upload"] = upload
            body["start"] = False
        if self.config.allow_soft_placement:
            body["soft_placement"] = True
        if self._timeout_ms is not None:
            body["timeout_ms"] = int(self._timeout_ms)
        st = json.loads(c.request("POST", "/v1/jobs", _fw.dumps(body).encode(),
                                  {"Content-Type": "application/json"})[2])
        jid = st["id"]
        if self._client is not None:
            with self._lock:
                for q in st.get("queues", []):
                    if q.get("name", "").endswith("." + self._tag):
                        self._own_queues[q["name"]] = q["address"]
        try:
            for k in upload:
                c.request("PUT", "/v1/jobs/%s/feeds/%s" % (jid, urllib.parse.quote(k, safe="")),
                          npy_bytes(feeds[k]), {"Content-Type": "application/x-npy"})
            if upload:
                c.request("POST", "/v1/jobs/%s/start" % jid)
            last = self._wait(c, jid)
        except KeyboardInterrupt:
            c.request("DELETE", "/v1/jobs/%s" % jid, ok=(200, 404, 409))
            raise
        if last.get("event") != "done":
            e = last.get("error") or {}
            raise errors.from_dg(e.get("code", "canceled" if last.get("event") == "canceled"
                                       else "internal"),
                                 e.get("message", "job %s %s" % (jid, last.get("event"))),
                                 e.get("hint"))
        if self.config.log_device_placement:
            self._log_placement(st)
        return {r: c.get_npy("/v1/jobs/%s/results/%s" % (jid, urllib.parse.quote(r, safe="")))
                for r in refs}

    def _wait(self, c, jid):
        frm, last = 0, {}
        while True:
            _, resp, data = c.request("GET", "/v1/jobs/%s/events?from=%d&timeout_ms=60000"
                                      % (jid, frm))
            for line in data.decode().splitlines():
                if line.strip():
                    last = json.loads(line)
            frm = int(resp.getheader("Dg-Count", frm))
            if resp.getheader("Dg-Job-Over") == "1":
                return last

    def _log_placement(self, st):
        types = {}
        for op in self.graph._ops:
            types[op.name] = op.type
        print("Device mapping:", file=sys.stderr)
        for t in st.get("tasks", []):
            print("%s -> %s" % (t.get("device"), t.get("address")), file=sys.stderr)
        soft = {s.get("node"): s.get("device") for s in st.get("soft", [])}
        for node, dev in st.get("placement", {}).items():
            note = " (soft placement: %s is not there)" % soft[node] if node in soft else ""
            print("%s: (%s): %s%s" % (node, types.get(node, "?"), dev, note), file=sys.stderr)


def _feed_literal(arr):
    from .ops import _literal
    lit = _literal(arr)
    if not isinstance(lit, dict):
        lit = {"dtype": arr.dtype.name if arr.dtype != np.bool_ else "bool", "shape": [],
               "value": lit}
    return lit


class InteractiveSession(Session):
    """A Session that makes itself the default at once (for shells)."""

    def __init__(self, target="", graph=None, config=None, **kw):
        super().__init__(target, graph, config, **kw)
        self._cm = self.as_default()
        self._cm.__enter__()

    def close(self):
        if getattr(self, "_cm", None) is not None:
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)
        super().close()


def _scalar(arr):
    """A 0-d result as a numpy scalar (np.float32(2.5)), as TensorFlow returns it."""
    return arr[()] if arr.ndim == 0 else arr
