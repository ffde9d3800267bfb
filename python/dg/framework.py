"""Graphs, operations and tensors: TensorFlow 1.x's graph-building model over
dg's graph format (doc/graph-format.md). A Graph is a list of Operations, each
one node of the JSON document; a Tensor is one output of an Operation, named
"node" or "node:k" in the document and "node:k" in Python, as TensorFlow names
it. Static dtypes always, static shapes where they follow from the inputs."""

import contextlib
import json
import math
import re
import threading

import numpy as np

from . import dtypes as _dt

__all__ = ["Graph", "Operation", "Tensor", "TensorShape", "Dimension", "get_default_graph",
           "reset_default_graph", "name_scope", "device", "convert_to_tensor", "DeviceSpec",
           "get_collection", "add_to_collection", "GraphKeys", "set_random_seed", "group",
           "no_op"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")


class GraphKeys:
    GLOBAL_VARIABLES = "variables"
    TRAINABLE_VARIABLES = "trainable_variables"
    TRAIN_OP = "train_op"
    UPDATE_OPS = "update_ops"
    LOSSES = "losses"
    QUEUE_RUNNERS = "queue_runners"


# --- shapes ------------------------------------------------------------------

class Dimension(int):
    """A known size; ``.value`` as TensorFlow 1.x's Dimension has."""

    @property
    def value(self):
        return int(self)


class TensorShape:
    """A static shape: None for an unknown rank, else a list of sizes with None
    for an unknown size."""

    def __init__(self, dims):
        if isinstance(dims, TensorShape):
            dims = dims._dims
        if dims is None:
            self._dims = None
        else:
            try:
                it = list(dims)
            except TypeError:
                it = [dims]
            self._dims = [None if (d is None or (isinstance(d, (int, np.integer)) and d < 0))
                          else int(d) for d in it]

    @property
    def ndims(self):
        return None if self._dims is None else len(self._dims)

    rank = ndims

    @property
    def dims(self):
        return None if self._dims is None else [None if d is None else Dimension(d)
                                                for d in self._dims]

    def as_list(self):
        if self._dims is None:
            raise ValueError("as_list() is not defined on an unknown TensorShape")
        return list(self._dims)

    def is_fully_defined(self):
        return self._dims is not None and all(d is not None for d in self._dims)

    def is_compatible_with(self, other):
        """Whether the two shapes can be the same: equal ranks and sizes where
        both are known (an unknown rank fits any)."""
        other = TensorShape(other)
        if self._dims is None or other._dims is None:
            return True
        return len(self._dims) == len(other._dims) and all(
            a is None or b is None or a == b for a, b in zip(self._dims, other._dims))

    def num_elements(self):
        if not self.is_fully_defined():
            return None
        return int(np.prod(self._dims, dtype=np.int64))

    def __len__(self):
        if self._dims is None:
            raise ValueError("cannot take the length of a shape of unknown rank")
        return len(self._dims)

    def __iter__(self):
        if self._dims is None:
            raise ValueError("cannot iterate over a shape of unknown rank")
        return iter(self.dims)

    def __getitem__(self, key):
        if self._dims is None:
            return None if isinstance(key, int) else TensorShape(None)
        if isinstance(key, slice):
            return TensorShape(self._dims[key])
        d = self._dims[key]
        return None if d is None else Dimension(d)

    def __eq__(self, other):
        try:
            other = TensorShape(other)
        except TypeError:
            return NotImplemented
        return self._dims == other._dims

    def __hash__(self):
        return hash(None if self._dims is None else tuple(self._dims))

    def __repr__(self):
        return "TensorShape(%r)" % (self._dims,)

    def __str__(self):
        if self._dims is None:
            return "<unknown>"
        inner = ", ".join("?" if d is None else str(d) for d in self._dims)
        return "(%s,)" % inner if len(self._dims) == 1 else "(%s)" % inner

    def json(self):
        """The graph format's shape: sizes with -1 for unknown, null for unknown rank."""
        return None if self._dims is None else [-1 if d is None else d for d in self._dims]


def broadcast_shape(a, b):
    """NumPy broadcasting of two static shapes (None where unknown); raises
    ValueError when they cannot broadcast, as TensorFlow does at build time."""
    a, b = TensorShape(a), TensorShape(b)
    if a.ndims is None or b.ndims is None:
        return TensorShape(None)
    x, y = a.as_list()[::-1], b.as_list()[::-1]
    out = []
    for i in range(max(len(x), len(y))):
        p = x[i] if i < len(x) else 1
        q = y[i] if i < len(y) else 1
        if p == 1:
            out.append(q)
        elif q == 1 or p == q:
            out.append(p)
        elif p is None or q is None:
            out.append(p if q is None else q)
        else:
            raise ValueError("shapes %s and %s cannot be broadcast together" % (a, b))
    return TensorShape(out[::-1])


# --- devices -----------------------------------------------------------------

class DeviceSpec:
    """TensorFlow's device string "/job:J/replica:R/task:T/device:TYPE:I" (also
    "/cpu:0", "/gpu:1"), parsed and merged: fields given win over fields merged in."""

    def __init__(self, job=None, replica=None, task=None, device_type=None, device_index=None):
        self.job, self.replica, self.task = job, replica, task
        self.device_type, self.device_index = device_type, device_index

    @classmethod
    def from_string(cls, spec):
        d = cls()
        if isinstance(spec, DeviceSpec):
            d.__dict__.update(spec.__dict__)
            return d
        for part in (spec or "").split("/"):
            if not part:
                continue
            f = part.split(":")
            key = f[0].lower()
            try:
                if key == "job" and len(f) == 2 and f[1]:
                    d.job = f[1]
                elif key == "replica" and len(f) == 2:
                    d.replica = int(f[1])
                elif key == "task" and len(f) == 2:
                    d.task = int(f[1])
                elif key in ("cpu", "gpu") and len(f) == 2:
                    d.device_type = key.upper()
                    d.device_index = None if f[1] == "*" else int(f[1])
                elif key == "device" and len(f) in (2, 3) and f[1].upper() in ("CPU", "GPU"):
                    d.device_type = f[1].upper()
                    d.device_index = None if len(f) == 2 or f[2] == "*" else int(f[2])
                else:
                    raise ValueError(part)
            except ValueError:
                raise ValueError("device %r: cannot parse %r (use /job:NAME/task:I[/gpu:K])"
                                 % (spec, part)) from None
        return d

    def merged_over(self, base):
        """This spec, with the fields it lacks taken from base."""
        b = DeviceSpec.from_string(base)
        out = DeviceSpec.from_string(self)
        for k in ("job", "replica", "task"):
            if getattr(out, k) is None:
                setattr(out, k, getattr(b, k))
        if out.device_type is None:
            out.device_type, out.device_index = b.device_type, b.device_index
        return out

    def to_string(self):
        s = ""
        if self.job is not None:
            s += "/job:%s" % self.job
        if self.replica is not None:
            s += "/replica:%d" % self.replica
        if self.task is not None:
            s += "/task:%d" % self.task
        if self.device_type is not None:
            s += "/device:%s:%d" % (self.device_type, self.device_index or 0)
        return s

    __str__ = to_string


def _merge_device(outer, current):
    """Merge device scope ``outer`` under the device already chosen, ``current``
    (the inner scopes' choice wins), as TensorFlow's merge_device does."""
    return DeviceSpec.from_string(current).merged_over(outer).to_string()


# --- operations and tensors ----------------------------------------------------

class Operation:
    """One node: ``type`` is dg's op name, ``inputs`` Tensors, ``attrs`` the
    node's attrs (JSON values), ``device`` its device string."""

    def __init__(self, graph, op_type, name, inputs, attrs, device):
        self.graph = graph
        self.type = op_type
        self.name = name
        self.inputs = list(inputs)
        self.attrs = attrs
        self._device = device
        self.outputs = []
        self.control_inputs = []

    @property
    def device(self):
        return self._device

    def _set_device(self, dev):
        self._device = dev.to_string() if isinstance(dev, DeviceSpec) else (dev or "")

    def get_attr(self, name):
        return self.attrs[name]

    @property
    def node_def(self):
        n = {"name": self.name, "op": self.type}
        if self.inputs:
            n["inputs"] = [t._ref for t in self.inputs]
        if self.attrs:
            n["attrs"] = self.attrs
        if self._device:
            n["device"] = self._device
        return n

    def _deps(self):
        """The operations this node needs in a graph document: its inputs' and,
        for an update of a Variable or a use of a Queue, that node's."""
        deps = [t.op for t in self.inputs]
        for key in ("variable", "queue"):
            ref = self.attrs.get(key) if isinstance(self.attrs, dict) else None
            if ref is not None:
                deps.append(self.graph.get_operation_by_name(ref))
        return deps + list(self.control_inputs)

    def run(self, feed_dict=None, session=None):
        from .session import get_default_session
        (session or get_default_session()).run(self, feed_dict=feed_dict)

    def __repr__(self):
        return "<dg.Operation '%s' type=%s>" % (self.name, self.type)


class Group:
    """tf.group / tf.no_op: runs its members, fetches as None. It is no node of
    the graph document: running it fetches what it groups."""

    def __init__(self, graph, name, members):
        self.graph = graph
        self.name = name
        self.type = "NoOp"
        self.members = list(members)
        self.outputs = []
        self.inputs = []
        self.device = ""

    def run(self, feed_dict=None, session=None):
        from .session import get_default_session
        (session or get_default_session()).run(self, feed_dict=feed_dict)

    def __repr__(self):
        return "<dg.Operation '%s' type=NoOp (%d members)>" % (self.name, len(self.members))


class Tensor:
    """Output ``value_index`` of operation ``op``."""

    # numpy's operators must give way to ours (np.float32(2) * t).
    __array_priority__ = 100

    def __init__(self, op, value_index, dtype, shape):
        self.op = op
        self.value_index = value_index
        self.dtype = _dt.as_dtype(dtype)
        self._shape = TensorShape(shape)

    @property
    def graph(self):
        return self.op.graph

    @property
    def name(self):
        return "%s:%d" % (self.op.name, self.value_index)

    @property
    def _ref(self):
        """The graph format's name of this output."""
        return self.op.name if self.value_index == 0 else "%s:%d" % (self.op.name,
                                                                     self.value_index)

    @property
    def device(self):
        return self.op.device

    @property
    def shape(self):
        return self._shape

    def get_shape(self):
        return self._shape

    def set_shape(self, shape):
        new = TensorShape(shape)
        old = self._shape
        if old.ndims is not None and new.ndims is not None:
            if old.ndims != new.ndims or any(a is not None and b is not None and a != b
                                             for a, b in zip(old.as_list(), new.as_list())):
                raise ValueError("shape %s is not compatible with %s" % (new, old))
            new = TensorShape([a if a is not None else b
                               for a, b in zip(old.as_list(), new.as_list())])
        elif new.ndims is None:
            new = old
        self._shape = new

    def eval(self, feed_dict=None, session=None):
        from .session import get_default_session
        return (session or get_default_session()).run(self, feed_dict=feed_dict)

    def __repr__(self):
        return "<dg.Tensor '%s' shape=%s dtype=%s>" % (self.name, self._shape, self.dtype.name)

    def __hash__(self):
        return id(self)

    def __eq__(self, other):        # TensorFlow 1.x: identity, not element-wise
        return self is other

    def __ne__(self, other):
        return self is not other

    def __bool__(self):
        raise TypeError("using a dg.Tensor as a Python bool is not allowed: its value is "
                        "known only when a session runs it")

    def __iter__(self):
        raise TypeError("a dg.Tensor is not iterable; use dg.split or indexing")

    def __len__(self):
        raise TypeError("len() of a dg.Tensor is not defined; use dg.size or t.shape")

    # The operators: ops.py fills _OPS when dg is imported.
    def __add__(self, o): return _OPS.add(self, o)
    def __radd__(self, o): return _OPS.add(o, self)
    def __sub__(self, o): return _OPS.subtract(self, o)
    def __rsub__(self, o): return _OPS.subtract(o, self)
    def __mul__(self, o): return _OPS.multiply(self, o)
    def __rmul__(self, o): return _OPS.multiply(o, self)
    def __truediv__(self, o): return _OPS.truediv(self, o)
    def __rtruediv__(self, o): return _OPS.truediv(o, self)
    def __matmul__(self, o): return _OPS.matmul(self, o)
    def __rmatmul__(self, o): return _OPS.matmul(o, self)
    def __pow__(self, o): return _OPS.pow(self, o)
    def __rpow__(self, o): return _OPS.pow(o, self)
    def __neg__(self): return _OPS.negative(self)
    def __abs__(self): return _OPS.abs(self)
    def __lt__(self, o): return _OPS.less(self, o)
    def __le__(self, o): return _OPS.less_equal(self, o)
    def __gt__(self, o): return _OPS.greater(self, o)
    def __ge__(self, o): return _OPS.greater_equal(self, o)
    def __getitem__(self, key): return _OPS._getitem(self, key)


_OPS = None     # the ops module, set by ops.py


# --- graphs ------------------------------------------------------------------

class Graph:
    """A dataflow graph being built: its operations in creation order, the name
    and device scopes, collections (variables), and its JSON document."""

    def __init__(self):
        self._ops = []
        self._by_name = {}
        self._names_in_use = {}
        self._name_stack = ""
        self._device_stack = []
        self._control_stack = []
        self._collections = {}
        self.seed = None
        self._version = 0
        self._lock = threading.RLock()

    # -- building
    def _create_op(self, op_type, inputs, attrs, name=None, outputs=((None, None),)):
        """Add one node: op_type (dg's op name), input Tensors, attrs (JSON
        values; None values dropped), and one (dtype, shape) per output."""
        with self._lock:
            for t in inputs:
                if not isinstance(t, Tensor):
                    raise TypeError("input %r of %s is not a Tensor" % (t, op_type))
                if t.graph is not self:
                    raise ValueError("tensor %s is from another graph than this %s"
                                     % (t.name, op_type))
            full = self.unique_name(name or op_type)
            attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
            op = Operation(self, op_type, full, inputs, attrs, "")
            op.control_inputs = [c for deps in self._control_stack for c in deps]
            op._set_device(self._device_for(op))
            op.outputs = [Tensor(op, i, dt, sh) for i, (dt, sh) in enumerate(outputs)]
            self._ops.append(op)
            self._by_name[full] = op
            self._version += 1
            return op

    def _device_for(self, op):
        dev = ""
        for entry in reversed(self._device_stack):
            if entry is None:
                break
            if callable(entry):
                op._set_device(dev)
                got = entry(op)
                dev = got.to_string() if isinstance(got, DeviceSpec) else (got or "")
            else:
                dev = _merge_device(entry, dev)
        return dev

    def unique_name(self, name, mark_as_used=True):
        if self._name_stack:
            name = self._name_stack + "/" + name
        if not _NAME_RE.match(name) or len(name) > 256:
            raise ValueError("%r is not a valid node name: 1 to 256 characters of "
                             "A-Z a-z 0-9 _ . / - (not starting with / or -)" % name)
        key = name.lower()
        i = self._names_in_use.get(key, 0)
        if mark_as_used:
            self._names_in_use[key] = i + 1
        if i > 0:
            base = name
            while True:
                name = "%s_%d" % (base, i)
                if name.lower() not in self._names_in_use:
                    break
                i += 1
            if mark_as_used:
                self._names_in_use[name.lower()] = 1
        return name

    # -- scopes
    @contextlib.contextmanager
    def as_default(self):
        _default_stack.append(self)
        try:
            yield self
        finally:
            _default_stack.remove(self)

    @contextlib.contextmanager
    def name_scope(self, name):
        old = self._name_stack
        if not name:
            new = ""
        elif name.endswith("/"):
            new = name[:-1]
        else:
            new = self.unique_name(name)
        self._name_stack = new
        try:
            yield new + "/" if new else ""
        finally:
            self._name_stack = old

    @contextlib.contextmanager
    def device(self, spec):
        if spec is not None and not callable(spec):
            spec = DeviceSpec.from_string(spec).to_string()
        self._device_stack.append(spec)
        try:
            yield
        finally:
            self._device_stack.pop()

    @contextlib.contextmanager
    def control_dependencies(self, deps):
        """Recorded on the operations built inside (their ``control_inputs``): dg
        runs what a fetch needs, so a dependency here is run with the node."""
        ops = []
        for d in deps or []:
            ops.extend(_as_ops(d))
        self._control_stack.append(ops)
        try:
            yield
        finally:
            self._control_stack.pop()

    # -- lookup
    def get_operations(self):
        return list(self._ops)

    def get_operation_by_name(self, name):
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError("the graph has no operation %r" % name) from None

    def get_tensor_by_name(self, name):
        op, _, k = name.partition(":")
        o = self.get_operation_by_name(op)
        i = int(k) if k else 0
        if i >= len(o.outputs):
            raise KeyError("operation %r has %d outputs" % (op, len(o.outputs)))
        return o.outputs[i]

    def as_graph_element(self, obj):
        if isinstance(obj, str):
            return self.get_tensor_by_name(obj) if ":" in obj else self.get_operation_by_name(obj)
        return obj

    def get_collection(self, key, scope=None):
        items = list(self._collections.get(key, []))
        if scope:
            items = [i for i in items if getattr(i, "name", "").startswith(scope)]
        return items

    def add_to_collection(self, key, value):
        self._collections.setdefault(key, []).append(value)

    # -- the document
    def as_graph_def(self, fetch=None, ops=None):
        """The graph document (a dict): every node, or ``ops`` only, in creation
        order; ``fetch`` as the document's "fetch"."""
        doc = {"version": 1, "nodes": [o.node_def for o in (self._ops if ops is None else ops)]}
        if fetch:
            doc["fetch"] = [t._ref if isinstance(t, Tensor) else t for t in fetch]
        return doc

    def as_json(self, fetch=None, indent=None):
        """The graph as dg's JSON graph document (doc/graph-format.md)."""
        return dumps(self.as_graph_def(fetch), indent=indent)

    def finalize(self):
        pass

    @property
    def version(self):
        return self._version


def dumps(doc, indent=None):
    """JSON as the graph format reads it: non-finite floats as "nan", "inf", "-inf"."""
    return json.dumps(_finite(doc), indent=indent, allow_nan=False, separators=(",", ":")
                      if indent is None else None)


def pretty(doc):
    """A graph document as people write them: one node per line."""
    doc = _finite(doc)
    lines = ["{"]
    keys = list(doc)
    for i, k in enumerate(keys):
        end = "," if i < len(keys) - 1 else ""
        if k == "nodes":
            lines.append('  "nodes": [')
            n = doc[k]
            for j, node in enumerate(n):
                lines.append("    " + json.dumps(node, allow_nan=False) +
                             ("," if j < len(n) - 1 else ""))
            lines.append("  ]" + end)
        else:
            text = json.dumps(doc[k], indent=2, allow_nan=False).replace("\n", "\n  ")
            lines.append("  %s: %s%s" % (json.dumps(k), text, end))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _as_ops(x):
    if isinstance(x, Tensor):
        return [x.op]
    if isinstance(x, (Operation, Group)):
        return [x]
    if hasattr(x, "_as_tensor"):
        return [x._as_tensor().op]
    if isinstance(x, (list, tuple)):
        return [o for e in x for o in _as_ops(e)]
    raise TypeError("%r is not an operation or tensor" % (x,))


_default_stack = []
_global_graph = Graph()


def get_default_graph():
    return _default_stack[-1] if _default_stack else _global_graph


def reset_default_graph():
    """A new empty default graph (refused inside a Graph.as_default block)."""
    global _global_graph
    if _default_stack:
        raise AssertionError("reset_default_graph() inside a Graph.as_default() block")
    _global_graph = Graph()


def name_scope(name, default_name=None, values=None):
    """tf.name_scope: node names built inside start with "name/"."""
    g = get_default_graph()
    for v in values or []:
        if isinstance(v, Tensor):
            g = v.graph
            break
    return g.name_scope(name if name is not None else default_name)


def device(spec):
    """tf.device: a device string (merged with the enclosing ones), a function of
    the operation that returns one (tf.train.replica_device_setter), or None."""
    return get_default_graph().device(spec)


def control_dependencies(deps):
    return get_default_graph().control_dependencies(deps)


def get_collection(key, scope=None):
    return get_default_graph().get_collection(key, scope)


def add_to_collection(key, value):
    get_default_graph().add_to_collection(key, value)


def set_random_seed(seed):
    """The graph-level seed: random ops without a seed of their own derive theirs
    from it and their position in the graph."""
    get_default_graph().seed = int(seed)


def group(*inputs, name=None):
    """An operation that runs every input when run (fetches None)."""
    g = get_default_graph()
    members = _as_ops(list(inputs))
    return Group(g, g.unique_name(name or "group_deps"), members)


def no_op(name=None):
    g = get_default_graph()
    return Group(g, g.unique_name(name or "NoOp"), [])


def convert_to_tensor(value, dtype=None, name=None, preferred_dtype=None):
    """A Tensor from a Tensor, a Variable, or a Python/numpy value (a Const)."""
    if isinstance(value, Tensor):
        if dtype is not None and _dt.as_dtype(dtype) != value.dtype:
            raise ValueError("tensor %s is %s, not %s" % (value.name, value.dtype.name,
                                                          _dt.as_dtype(dtype).name))
        return value
    if hasattr(value, "_as_tensor"):
        return convert_to_tensor(value._as_tensor(), dtype)
    if dtype is None and preferred_dtype is not None:
        try:
            return _OPS.constant(value, dtype=preferred_dtype, name=name)
        except (TypeError, ValueError):
            pass
    return _OPS.constant(value, dtype=dtype, name=name)
