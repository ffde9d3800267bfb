"""tf.Variable over dg's Variable node: a tensor held by a ps task. Its initial
value is an ordinary tensor of the graph; ``initializer`` (and
global_variables_initializer) writes it into the variable with an Assign
node. Before that, the first job that touches the variable creates it with
dg's own initialiser, chosen from the initial value where dg has the same
(zeros, ones, normal, uniform, glorot), else zeros."""

import numpy as np

from . import dtypes as _dt
from . import framework as _fw
from . import ops as _ops
from .framework import GraphKeys, Tensor

__all__ = ["Variable", "global_variables_initializer", "variables_initializer",
           "initialize_all_variables", "global_variables", "trainable_variables",
           "get_variable", "zeros_initializer", "ones_initializer", "constant_initializer",
           "random_normal_initializer", "random_uniform_initializer",
           "truncated_normal_initializer", "glorot_uniform_initializer"]


def _ps_init(t):
    """dg's Variable attrs that create the same distribution as tensor t, or
    zeros."""
    op, a = t.op, t.op.attrs
    if op.type == "Fill" and a.get("value") in (0, 1):
        return {"init": "ones" if a["value"] == 1 else "zeros"}
    if op.type == "RandomNormal" and a.get("mean", 0) == 0:
        return {"init": "normal", "scale": a.get("stddev", 1.0), "seed": a.get("seed")}
    if op.type == "RandomUniform" and a.get("minval", 0) == -a.get("maxval", 1):
        return {"init": "uniform", "scale": a.get("maxval"), "seed": a.get("seed")}
    if op.type == "GlorotUniform":
        return {"init": "glorot", "seed": a.get("seed")}
    return {"init": "zeros"}


class Variable:
    """tf.Variable(initial_value, trainable=True, name=None, dtype=None)."""

    def __init__(self, initial_value=None, trainable=True, collections=None,
                 validate_shape=True, caching_device=None, name=None, dtype=None,
                 expected_shape=None, import_scope=None, constraint=None):
        if initial_value is None:
            raise ValueError("a Variable needs an initial_value")
        g = _fw.get_default_graph()
        if callable(initial_value):
            initial_value = initial_value()
        if isinstance(initial_value, Tensor) or hasattr(initial_value, "_as_tensor"):
            init = _fw.convert_to_tensor(initial_value)
            if dtype is not None and init.dtype != _dt.as_dtype(dtype):
                init = _ops.cast(init, dtype)
        else:
            init = _ops.constant(initial_value, dtype, name=(name or "Variable") + "/initial_value")
        if not init.shape.is_fully_defined():
            raise ValueError("Variable %s: the initial value %s has shape %s; a Variable's "
                             "shape must be fully known" % (name or "", init.name, init.shape))
        attrs = {"shape": init.shape.as_list(), "dtype": init.dtype.name}
        attrs.update({k: v for k, v in _ps_init(init).items() if v is not None})
        self._init_value = init
        self._tensor = _ops._op("Variable", [], attrs, name or "Variable", init.dtype,
                                init.shape)
        self._initializer = None
        self.trainable = bool(trainable)
        for key in collections or ([GraphKeys.GLOBAL_VARIABLES] +
                                   ([GraphKeys.TRAINABLE_VARIABLES] if trainable else [])):
            g.add_to_collection(key, self)

    # -- as a tensor
    def _as_tensor(self):
        return self._tensor

    @property
    def op(self):
        return self._tensor.op

    @property
    def name(self):
        return self._tensor.name

    @property
    def dtype(self):
        return self._tensor.dtype

    @property
    def shape(self):
        return self._tensor.shape

    def get_shape(self):
        return self._tensor.shape

    @property
    def graph(self):
        return self._tensor.graph

    @property
    def device(self):
        return self._tensor.device

    @property
    def initial_value(self):
        return self._init_value

    @property
    def initializer(self):
        """The Assign of the initial value (built once)."""
        if self._initializer is None:
            with self.graph.name_scope(self.op.name + "/"):
                self._initializer = _ops.assign(self, self._init_value, name="Assign").op
        return self._initializer

    def value(self):
        return self._tensor

    read_value = value

    def assign(self, value, use_locking=None, name=None, read_value=True):
        return _ops.assign(self, value, name=name)

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        return _ops.assign_add(self, delta, name=name)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        return _ops.assign_sub(self, delta, name=name)

    def eval(self, session=None):
        return self._tensor.eval(session=session)

    def load(self, value, session=None):
        from .session import get_default_session
        (session or get_default_session()).run(self.assign(np.asarray(value)))

    def __repr__(self):
        return "<dg.Variable '%s' shape=%s dtype=%s>" % (self.name, self.shape, self.dtype.name)

    def __getattr__(self, attr):
        # The operators and anything else a Tensor has.
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self._tensor, attr)


def _forward(name):
    def f(self, *a):
        return getattr(self._tensor, name)(*a)
    f.__name__ = name
    return f


for _m in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
           "__rtruediv__", "__matmul__", "__rmatmul__", "__pow__", "__rpow__", "__neg__",
           "__abs__", "__lt__", "__le__", "__gt__", "__ge__", "__getitem__"):
    setattr(Variable, _m, _forward(_m))


def global_variables(scope=None):
    return _fw.get_collection(GraphKeys.GLOBAL_VARIABLES, scope)


def trainable_variables(scope=None):
    return _fw.get_collection(GraphKeys.TRAINABLE_VARIABLES, scope)


def variables_initializer(var_list, name="init"):
    return _fw.group(*[v.initializer for v in var_list], name=name)


def global_variables_initializer():
    """Runs every Variable's initializer (an Assign of its initial value)."""
    return variables_initializer(global_variables())


initialize_all_variables = global_variables_initializer


# --- initializers (callables of shape and dtype) ---------------------------------------

class _Init:
    def __init__(self, fn):
        self._fn = fn

    def __call__(self, shape, dtype=_dt.float32, partition_info=None):
        return self._fn(list(shape), _dt.as_dtype(dtype))


def zeros_initializer(dtype=_dt.float32):
    return _Init(lambda s, d: _ops.zeros(s, d))


def ones_initializer(dtype=_dt.float32):
    return _Init(lambda s, d: _ops.ones(s, d))


def constant_initializer(value=0, dtype=_dt.float32, verify_shape=False):
    return _Init(lambda s, d: _ops.constant(value, d, shape=s))


def random_normal_initializer(mean=0.0, stddev=1.0, seed=None, dtype=_dt.float32):
    return _Init(lambda s, d: _ops.random_normal(s, mean, stddev, d, seed))


def truncated_normal_initializer(mean=0.0, stddev=1.0, seed=None, dtype=_dt.float32):
    return _Init(lambda s, d: _ops.truncated_normal(s, mean, stddev, d, seed))


def random_uniform_initializer(minval=0, maxval=None, seed=None, dtype=_dt.float32):
    return _Init(lambda s, d: _ops.random_uniform(s, minval, maxval, d, seed))


def glorot_uniform_initializer(seed=None, dtype=_dt.float32):
    """Uniform in +-sqrt(6 / (fan_in + fan_out)): dg's GlorotUniform."""
    def make(s, d):
        g = _fw.get_default_graph()
        return _ops._op("GlorotUniform", [], {"shape": s, "dtype": d.name,
                                              "seed": _ops._seed(g, seed)}, "glorot_uniform",
                        d, s)
    return _Init(make)


def get_variable(name, shape=None, dtype=None, initializer=None, trainable=True, **kwargs):
    """A new Variable named name (no reuse: a second one with the same name gets a
    suffix, as tf.Variable does). Default initializer: glorot uniform."""
    dt = _dt.as_dtype(dtype or _dt.float32)
    if initializer is None:
        initializer = glorot_uniform_initializer()
    if isinstance(initializer, (_Init,)) or callable(initializer):
        if shape is None:
            raise ValueError("get_variable %s needs a shape" % name)
        init = lambda: initializer(shape, dt)          # noqa: E731
    else:
        init = initializer
    return Variable(init, trainable=trainable, name=name, dtype=dt)

