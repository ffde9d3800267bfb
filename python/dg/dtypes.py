"""dtypes: TensorFlow's names for dg's eight element types (doc/encodings.md)."""

import builtins

import numpy as np

__all__ = ["DType", "as_dtype", "float16", "half", "bfloat16", "float32", "float64",
           "double", "int32", "int64", "uint8", "bool"]


class DType:
    """An element type. ``name`` is dg's spelling (the graph format's), which is
    also TensorFlow's; ``as_numpy_dtype`` is numpy's type (bfloat16 has none)."""

    def __init__(self, name, np_type, kind):
        self._name = name
        self._np = np_type
        self._kind = kind       # "f", "i", "u" or "b"

    @property
    def name(self):
        return self._name

    @property
    def as_numpy_dtype(self):
        if self._np is None:
            raise TypeError("bfloat16 has no numpy type")
        return self._np

    @property
    def is_floating(self):
        return self._kind == "f"

    @property
    def is_integer(self):
        return self._kind in "iu"

    @property
    def is_bool(self):
        return self._kind == "b"

    @property
    def base_dtype(self):
        return self

    @property
    def size(self):
        return 2 if self._np is None else np.dtype(self._np).itemsize

    def __repr__(self):
        return "tf.%s" % self._name

    def __str__(self):
        return "<dtype: %r>" % self._name

    def __eq__(self, other):
        try:
            return self is as_dtype(other)
        except TypeError:
            return False

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self._name)


float16 = half = DType("float16", np.float16, "f")
bfloat16 = DType("bfloat16", None, "f")
float32 = DType("float32", np.float32, "f")
float64 = double = DType("float64", np.float64, "f")
int32 = DType("int32", np.int32, "i")
int64 = DType("int64", np.int64, "i")
uint8 = DType("uint8", np.uint8, "u")
bool = DType("bool", np.bool_, "b")     # noqa: A001 -- TensorFlow's name

_ALL = (float16, bfloat16, float32, float64, int32, int64, uint8, bool)
_BY_NAME = {d.name: d for d in _ALL}
_BY_NAME.update({"half": float16, "double": float64, "float": float32, "bf16": bfloat16})


def as_dtype(value):
    """A DType from a DType, its name, a numpy dtype or type, or a Python type.
    Raises TypeError for what dg has no dtype for (e.g. complex64, string)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    if value is int:
        return int32
    if value is float:
        return float32
    if value is builtins.bool:
        return bool
    try:
        npd = np.dtype(value)
    except TypeError:
        npd = None
    if npd is not None:
        for d in _ALL:
            if d._np is not None and np.dtype(d._np) == npd:
                return d
    raise TypeError("dg has no dtype %r: it has %s" % (value, ", ".join(d.name for d in _ALL)))
