"""TensorFlow 1.x's op functions, each building one or a few dg nodes
(`dg ops` lists dg's ops; doc/python.md maps the names). Python values given
where a tensor is expected become Const nodes of the other operand's dtype."""

import builtins
import numbers
import sys

import numpy as np

from . import dtypes as _dt
from . import framework as _fw
from .framework import Tensor, TensorShape, broadcast_shape, convert_to_tensor

__all__ = [
    "constant", "placeholder", "placeholder_with_default", "identity", "zeros", "ones", "fill",
    "zeros_like", "ones_like", "add", "subtract", "multiply", "divide", "truediv", "div",
    "truncatediv", "negative", "abs", "square", "sqrt", "exp", "log", "sigmoid", "tanh",
    "pow", "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
    "greater_equal", "where", "cast", "to_float", "to_double", "to_int32", "to_int64",
    "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "argmax", "size", "shape",
    "matmul", "reshape", "transpose", "slice", "strided_slice", "concat", "split",
    "expand_dims", "squeeze", "stack", "one_hot", "gather", "unsorted_segment_sum",
    "random_normal", "random_uniform", "truncated_normal", "add_n", "raw_op", "rank",
    "assign", "assign_add", "assign_sub", "sparse_softmax_cross_entropy_with_logits",
    "softmax_cross_entropy_with_logits",
]


def _g(*values):
    for v in values:
        if isinstance(v, Tensor):
            return v.graph
        if hasattr(v, "_as_tensor"):
            return v._as_tensor().graph
    return _fw.get_default_graph()


def _op(op_type, inputs, attrs=None, name=None, dtype=None, shape=None, outputs=None):
    """One node; its Tensor (or its list of Tensors when ``outputs`` is given)."""
    g = _g(*inputs)
    outs = outputs if outputs is not None else [(dtype, shape)]
    op = g._create_op(op_type, list(inputs), attrs, name, outs)
    return op.outputs if outputs is not None else op.outputs[0]


def raw_op(op_type, inputs=(), attrs=None, name=None, dtypes=(_dt.float32,), shapes=None):
    """Any dg op by its own name and attrs (dg ops NAME): the way to ops this
    module has no TensorFlow function for. One Tensor, or a list for several
    dtypes."""
    ins = [convert_to_tensor(i) for i in inputs]
    outs = [(d, None if shapes is None else shapes[i]) for i, d in enumerate(dtypes)]
    got = _op(op_type, ins, attrs, name, outputs=outs)
    return got[0] if len(got) == 1 else got


# --- constants and placeholders ---------------------------------------------------

def _literal(arr):
    """A tensor literal of the graph format (a number, or {"dtype","shape","value"})."""
    dt = _dt.as_dtype(arr.dtype)
    if dt.is_bool:
        flat = [bool(x) for x in arr.reshape(-1)]
    elif dt.is_floating:
        flat = [float(x) for x in arr.reshape(-1)]
    else:
        flat = [int(x) for x in arr.reshape(-1)]
    if arr.ndim == 0:
        return flat[0]
    return {"dtype": dt.name, "shape": list(arr.shape), "value": flat}


def _np_value(value, dtype=None):
    """value as a numpy array of dtype, or of TensorFlow's default dtype for it
    (Python ints int32, floats float32; numpy arrays keep theirs)."""
    if dtype is not None:
        dt = _dt.as_dtype(dtype)
        arr = np.asarray(value)
        if dt.is_integer and arr.dtype.kind == "f" and not np.all(np.mod(arr, 1) == 0):
            raise TypeError("cannot convert %r to %s without losing its fraction"
                            % (value, dt.name))
        return arr.astype(dt.as_numpy_dtype), dt
    arr = np.asarray(value)
    if arr.dtype == np.object_:
        raise TypeError("cannot make a tensor of %r" % (value,))
    if not isinstance(value, np.ndarray) and not isinstance(value, np.generic):
        if arr.dtype.kind in "iu":
            ok32 = arr.size == 0 or (arr.min() >= -2**31 and arr.max() < 2**31)
            arr = arr.astype(np.int32 if ok32 else np.int64)
        elif arr.dtype.kind == "f":
            arr = arr.astype(np.float32)
    return arr, _dt.as_dtype(arr.dtype)


def constant(value, dtype=None, shape=None, name="Const", verify_shape=False):
    """tf.constant: a Const node holding value (nested lists or a numpy array)."""
    arr, dt = _np_value(value, dtype)
    if shape is not None:
        shape = list(shape)
        if arr.size == 1 and int(np.prod(shape)) != 1:
            arr = np.full(shape, arr.reshape(-1)[0], dtype=arr.dtype)
        elif arr.size == int(np.prod(shape)):
            arr = arr.reshape(shape)
        else:
            raise ValueError("constant of %d elements cannot have shape %s" % (arr.size, shape))
    return _op("Const", [], {"value": _literal(arr), "dtype": dt.name}, name, dt,
               list(arr.shape))


def placeholder(dtype, shape=None, name=None):
    """tf.placeholder: a value given at run time (feed_dict)."""
    dt = _dt.as_dtype(dtype)
    s = TensorShape(shape)
    return _op("Placeholder", [], {"dtype": dt.name, "shape": s.json()}, name or "Placeholder",
               dt, s)


def placeholder_with_default(input, shape, name=None):
    """A fed value where one is given, else input: dg feeds any node output, so
    this is an Identity of input that a feed replaces."""
    t = convert_to_tensor(input)
    return _op("Identity", [t], None, name or "PlaceholderWithDefault", t.dtype, shape)


def identity(input, name=None):
    t = convert_to_tensor(input)
    return _op("Identity", [t], None, name, t.dtype, t.shape)


def fill(dims, value, name=None, dtype=None):
    dt = _dt.as_dtype(dtype) if dtype is not None else _np_value(value)[1]
    return _op("Fill", [], {"shape": _ints(dims, "dims"), "value": float(value),
                            "dtype": dt.name}, name, dt, list(dims))


def zeros(shape, dtype=_dt.float32, name=None):
    return fill(shape, 0, name or "zeros", dtype)


def ones(shape, dtype=_dt.float32, name=None):
    return fill(shape, 1, name or "ones", dtype)


def zeros_like(tensor, dtype=None, name=None):
    t = _cast_if(convert_to_tensor(tensor), dtype)
    return _op("ZerosLike", [t], None, name, t.dtype, t.shape)


def ones_like(tensor, dtype=None, name=None):
    t = _cast_if(convert_to_tensor(tensor), dtype)
    return _op("OnesLike", [t], None, name, t.dtype, t.shape)


def _cast_if(t, dtype):
    return t if dtype is None or _dt.as_dtype(dtype) == t.dtype else cast(t, dtype)


def _ints(v, what):
    if isinstance(v, Tensor):
        raise TypeError("%s must be a Python list of ints here (dg takes it as an attr), "
                        "not the tensor %s" % (what, v.name))
    if isinstance(v, numbers.Integral):
        return [int(v)]
    return [int(x) for x in v]


# --- element-wise ---------------------------------------------------------------

def _pair(x, y):
    """Two tensors of one dtype: a Python value takes the other's dtype."""
    if isinstance(x, Tensor) or hasattr(x, "_as_tensor"):
        x = convert_to_tensor(x)
        y = y if isinstance(y, Tensor) or hasattr(y, "_as_tensor") else constant(y, x.dtype)
        y = convert_to_tensor(y)
    else:
        y = convert_to_tensor(y)
        x = constant(x, y.dtype)
    if x.dtype != y.dtype:
        raise TypeError("%s and %s: dtypes %s and %s differ (use dg.cast)"
                        % (x.name, y.name, x.dtype.name, y.dtype.name))
    return x, y


def _binary(op_type, x, y, name, out_dtype=None):
    x, y = _pair(x, y)
    return _op(op_type, [x, y], None, name, out_dtype or x.dtype,
               broadcast_shape(x.shape, y.shape))


def _unary(op_type, x, name):
    x = convert_to_tensor(x)
    return _op(op_type, [x], None, name, x.dtype, x.shape)


def add(x, y, name=None): return _binary("Add", x, y, name)
def subtract(x, y, name=None): return _binary("Sub", x, y, name)
def multiply(x, y, name=None): return _binary("Mul", x, y, name)
def maximum(x, y, name=None): return _binary("Maximum", x, y, name)
def minimum(x, y, name=None): return _binary("Minimum", x, y, name)
def pow(x, y, name=None): return _binary("Pow", x, y, name)       # noqa: A001
def equal(x, y, name=None): return _binary("Equal", x, y, name, _dt.bool)
def not_equal(x, y, name=None): return _binary("NotEqual", x, y, name, _dt.bool)
def less(x, y, name=None): return _binary("Less", x, y, name, _dt.bool)
def less_equal(x, y, name=None): return _binary("LessEqual", x, y, name, _dt.bool)
def greater(x, y, name=None): return _binary("Greater", x, y, name, _dt.bool)
def greater_equal(x, y, name=None): return _binary("GreaterEqual", x, y, name, _dt.bool)
def negative(x, name=None): return _unary("Neg", x, name)
def abs(x, name=None): return _unary("Abs", x, name)              # noqa: A001
def square(x, name=None): return _unary("Square", x, name)
def sqrt(x, name=None): return _unary("Sqrt", x, name)
def exp(x, name=None): return _unary("Exp", x, name)
def log(x, name=None): return _unary("Log", x, name)
def sigmoid(x, name=None): return _unary("Sigmoid", x, name)
def tanh(x, name=None): return _unary("Tanh", x, name)


def truncatediv(x, y, name=None):
    """Division; integers truncate toward zero (C's rule, dg's Div)."""
    return _binary("Div", x, y, name)


def truediv(x, y, name=None):
    """x / y; integers are divided as float64 (int32: as TensorFlow), or float32
    for int8/uint8, as tf.truediv does."""
    x, y = _pair(x, y)
    if x.dtype.is_integer:
        to = _dt.float32 if x.dtype == _dt.uint8 else _dt.float64
        x, y = cast(x, to), cast(y, to)
    return _binary("Div", x, y, name)


divide = truediv
div = truncatediv


def add_n(inputs, name=None):
    inputs = [convert_to_tensor(i) for i in inputs]
    if not inputs:
        raise ValueError("add_n needs at least one input")
    out = inputs[0]
    for i, t in enumerate(inputs[1:]):
        out = add(out, t, name if i == len(inputs) - 2 else None)
    return out if len(inputs) > 1 else identity(out, name)


def where(condition, x=None, y=None, name=None):
    """tf.where(condition, x, y): x where condition, else y (broadcast). The
    one-argument form (indices of true elements) has no dg op."""
    if x is None or y is None:
        raise NotImplementedError("dg.where(condition) without x and y (the indices of "
                                  "true elements) has no dg op; give x and y")
    c = convert_to_tensor(condition)
    x, y = _pair(x, y)
    return _op("Where", [c, x, y], None, name, x.dtype,
               broadcast_shape(c.shape, broadcast_shape(x.shape, y.shape)))


def cast(x, dtype, name=None):
    x = convert_to_tensor(x)
    dt = _dt.as_dtype(dtype)
    return _op("Cast", [x], {"dtype": dt.name}, name, dt, x.shape)


def to_float(x, name="ToFloat"): return cast(x, _dt.float32, name)
def to_double(x, name="ToDouble"): return cast(x, _dt.float64, name)
def to_int32(x, name="ToInt32"): return cast(x, _dt.int32, name)
def to_int64(x, name="ToInt64"): return cast(x, _dt.int64, name)


# --- reductions -------------------------------------------------------------------

def _reduced_shape(shape, axis, keepdims):
    if shape.ndims is None:
        return TensorShape(None)
    dims = shape.as_list()
    if axis is None:
        return TensorShape([1] * len(dims) if keepdims else [])
    axes = {a % len(dims) if dims else a for a in _ints(axis, "axis")}
    return TensorShape([1 if i in axes else d for i, d in enumerate(dims)] if keepdims
                       else [d for i, d in enumerate(dims) if i not in axes])


def _reduce(op_type, x, axis, keepdims, name, reduction_indices, keep_dims):
    x = convert_to_tensor(x)
    if axis is None:
        axis = reduction_indices
    keep = bool(keepdims if keepdims is not None else keep_dims)
    attrs = {"axis": None if axis is None else _ints(axis, "axis"), "keepdims": keep or None}
    return _op(op_type, [x], attrs, name, x.dtype, _reduced_shape(x.shape, axis, keep))


def reduce_sum(input_tensor, axis=None, keepdims=None, name=None, reduction_indices=None,
               keep_dims=None):
    return _reduce("Sum", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_mean(input_tensor, axis=None, keepdims=None, name=None, reduction_indices=None,
                keep_dims=None):
    return _reduce("Mean", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_max(input_tensor, axis=None, keepdims=None, name=None, reduction_indices=None,
               keep_dims=None):
    return _reduce("Max", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def reduce_min(input_tensor, axis=None, keepdims=None, name=None, reduction_indices=None,
               keep_dims=None):
    return _reduce("Min", input_tensor, axis, keepdims, name, reduction_indices, keep_dims)


def argmax(input, axis=None, name=None, dimension=None, output_type=_dt.int64):
    x = convert_to_tensor(input)
    if axis is None:
        axis = dimension if dimension is not None else 0
    ot = _dt.as_dtype(output_type)
    return _op("ArgMax", [x], {"axis": int(axis), "output_type": ot.name}, name, ot,
               _reduced_shape(x.shape, [int(axis)], False))


def size(input, name=None, out_type=_dt.int32):
    x = convert_to_tensor(input)
    ot = _dt.as_dtype(out_type)
    return _op("Size", [x], {"out_type": ot.name}, name, ot, [])


def shape(input, name=None, out_type=_dt.int32):
    x = convert_to_tensor(input)
    ot = _dt.as_dtype(out_type)
    return _op("Shape", [x], {"out_type": ot.name}, name, ot, [x.shape.ndims])


def rank(input, name=None):
    """The rank, known when the graph is built (dg has no Rank op): a Const."""
    x = convert_to_tensor(input)
    if x.shape.ndims is None:
        raise ValueError("the rank of %s is not known when the graph is built" % x.name)
    return constant(x.shape.ndims, _dt.int32, name=name or "Rank")


# --- matrices and arrays ----------------------------------------------------------

def matmul(a, b, transpose_a=False, transpose_b=False, adjoint_a=False, adjoint_b=False,
           name=None):
    a, b = _pair(a, b)
    ta, tb = bool(transpose_a or adjoint_a), bool(transpose_b or adjoint_b)
    ra, rb = a.shape.ndims, b.shape.ndims
    if ra is not None and rb is not None and (ra > 2 or rb > 2):
        sa, sb = a.shape.as_list(), b.shape.as_list()
        m = sa[-1] if ta else sa[-2]
        n = sb[-2] if tb else sb[-1]
        batch = broadcast_shape(sa[:-2], sb[:-2]).as_list()
        return _op("BatchMatMul", [a, b], {"adj_x": ta or None, "adj_y": tb or None}, name,
                   a.dtype, batch + [m, n])
    out = None
    if ra == 2 and rb == 2:
        sa, sb = a.shape.as_list(), b.shape.as_list()
        out = [sa[1] if ta else sa[0], sb[0] if tb else sb[1]]
    return _op("MatMul", [a, b], {"transpose_a": ta or None, "transpose_b": tb or None}, name,
               a.dtype, out)


def reshape(tensor, shape, name=None):
    x = convert_to_tensor(tensor)
    dims = _ints(shape, "shape")
    out = list(dims)
    n = x.shape.num_elements()
    if -1 in out and n is not None:
        known = int(np.prod([d for d in out if d != -1])) or 1
        out[out.index(-1)] = n // known
    return _op("Reshape", [x], {"shape": dims}, name, x.dtype, out)


def transpose(a, perm=None, name="transpose", conjugate=False):
    x = convert_to_tensor(a)
    p = None if perm is None else _ints(perm, "perm")
    out = None
    if x.shape.ndims is not None:
        d = x.shape.as_list()
        out = [d[i] for i in p] if p is not None else d[::-1]
    return _op("Transpose", [x], {"perm": p}, name, x.dtype, out)


def slice(input_, begin, size, name=None):     # noqa: A001 -- TensorFlow's name
    """tf.slice: begin and size per dimension (size -1: the rest)."""
    x = convert_to_tensor(input_)
    b, s = _ints(begin, "begin"), _ints(size, "size")
    out = None
    if x.shape.ndims is not None and len(b) == x.shape.ndims == len(s):
        out = [(d - bi if d is not None else None) if si == -1 else si
               for d, bi, si in zip(x.shape.as_list(), b, s)]
    return _op("Slice", [x], {"begin": b, "size": s}, name, x.dtype, out)


def strided_slice(input_, begin, end, strides=None, begin_mask=0, end_mask=0, ellipsis_mask=0,
                  new_axis_mask=0, shrink_axis_mask=0, name=None):
    x = convert_to_tensor(input_)
    attrs = {"begin": _ints(begin, "begin"), "end": _ints(end, "end"),
             "strides": None if strides is None else _ints(strides, "strides"),
             "begin_mask": begin_mask or None, "end_mask": end_mask or None,
             "ellipsis_mask": ellipsis_mask or None, "new_axis_mask": new_axis_mask or None,
             "shrink_axis_mask": shrink_axis_mask or None}
    return _op("StridedSlice", [x], attrs, name, x.dtype, None)


def _getitem(t, key):
    """t[key] for ints, slices, Ellipsis and None (newaxis), as NumPy's basic indexing."""
    if not isinstance(key, tuple):
        key = (key,)
    begin, end, strides = [], [], []
    bm = em = elm = nam = sam = 0
    for i, k in enumerate(key):
        if k is Ellipsis:
            elm |= 1 << i
            begin.append(0), end.append(0), strides.append(1)
        elif k is None:
            nam |= 1 << i
            begin.append(0), end.append(0), strides.append(1)
        elif isinstance(k, numbers.Integral):
            sam |= 1 << i
            begin.append(int(k)), end.append(int(k) + 1), strides.append(1)
        elif isinstance(k, builtins.slice):
            st = 1 if k.step is None else int(k.step)
            if k.start is None:
                bm |= 1 << i
            if k.stop is None:
                em |= 1 << i
            begin.append(0 if k.start is None else int(k.start))
            end.append(0 if k.stop is None else int(k.stop))
            strides.append(st)
        else:
            raise TypeError("index %r: only ints, slices, ... and None index a dg.Tensor" % (k,))
    return strided_slice(t, begin, end, strides, bm, em, elm, nam, sam)



def concat(values, axis, name="concat"):
    ts = [convert_to_tensor(v) for v in values]
    if len(ts) == 1:
        return identity(ts[0], name)
    for t in ts[1:]:
        if t.dtype != ts[0].dtype:
            raise TypeError("concat: %s is %s, %s is %s" % (ts[0].name, ts[0].dtype.name,
                                                            t.name, t.dtype.name))
    out = None
    if all(t.shape.ndims is not None for t in ts):
        out = ts[0].shape.as_list()
        ax = int(axis) % len(out)
        sizes = [t.shape.as_list()[ax] for t in ts]
        out[ax] = None if None in sizes else sum(sizes)
    return _op("Concat", ts, {"axis": int(axis)}, name, ts[0].dtype, out)


def split(value, num_or_size_splits, axis=0, num=None, name="split"):
    """tf.split: a list of tensors."""
    x = convert_to_tensor(value)
    if isinstance(num_or_size_splits, numbers.Integral):
        n = int(num_or_size_splits)
        attrs = {"axis": int(axis), "num_split": n}
        sizes = None
    else:
        sizes = _ints(num_or_size_splits, "size_splits")
        n = len(sizes)
        attrs = {"axis": int(axis), "size_splits": sizes}
    outs = []
    for i in range(n):
        s = None
        if x.shape.ndims is not None:
            s = x.shape.as_list()
            ax = int(axis) % len(s)
            if sizes is not None and sizes[i] >= 0:
                s[ax] = sizes[i]
            elif sizes is None and s[ax] is not None:
                s[ax] = s[ax] // n
            else:
                s[ax] = None
        outs.append((x.dtype, s))
    return _op("Split", [x], attrs, name, outputs=outs)


def expand_dims(input, axis=None, name=None, dim=None):
    x = convert_to_tensor(input)
    ax = int(axis if axis is not None else dim)
    out = None
    if x.shape.ndims is not None:
        out = x.shape.as_list()
        out.insert(ax if ax >= 0 else len(out) + 1 + ax, 1)
    return _op("ExpandDims", [x], {"axis": ax}, name, x.dtype, out)


def squeeze(input, axis=None, name=None, squeeze_dims=None):
    x = convert_to_tensor(input)
    ax = axis if axis is not None else squeeze_dims
    axes = None if ax is None else _ints(ax, "axis")
    out = None
    if x.shape.ndims is not None:
        d = x.shape.as_list()
        keep = set(range(len(d))) - ({a % len(d) for a in axes} if axes is not None
                                     else {i for i, v in enumerate(d) if v == 1})
        out = [d[i] for i in sorted(keep)]
    return _op("Squeeze", [x], {"axis": axes}, name, x.dtype, out)


def stack(values, axis=0, name="stack"):
    """tf.stack: ExpandDims of each, then Concat."""
    ts = [expand_dims(convert_to_tensor(v), axis) for v in values]
    return concat(ts, axis, name)


def one_hot(indices, depth, on_value=None, off_value=None, axis=None, dtype=None, name=None):
    x = convert_to_tensor(indices)
    if axis not in (None, -1):
        raise NotImplementedError("one_hot: only axis -1 (dg's OneHot adds the last dim)")
    dt = _dt.as_dtype(dtype or _dt.float32)
    attrs = {"depth": int(depth), "dtype": dt.name,
             "on_value": None if on_value is None else float(on_value),
             "off_value": None if off_value is None else float(off_value)}
    out = None if x.shape.ndims is None else x.shape.as_list() + [int(depth)]
    return _op("OneHot", [x], attrs, name, dt, out)


def gather(params, indices, validate_indices=None, name=None, axis=0):
    p = convert_to_tensor(params)
    i = convert_to_tensor(indices)
    if axis != 0:
        raise NotImplementedError("gather: only axis 0 (rows)")
    out = None
    if p.shape.ndims is not None and i.shape.ndims is not None:
        out = i.shape.as_list() + p.shape.as_list()[1:]
    return _op("Gather", [p, i], None, name, p.dtype, out)


def unsorted_segment_sum(data, segment_ids, num_segments, name=None):
    d = convert_to_tensor(data)
    s = convert_to_tensor(segment_ids)
    out = None
    if d.shape.ndims is not None and s.shape.ndims is not None:
        out = [int(num_segments)] + d.shape.as_list()[s.shape.ndims:]
    return _op("UnsortedSegmentSum", [d, s], {"num_segments": int(num_segments)}, name,
               d.dtype, out)


# --- random -----------------------------------------------------------------------

def _seed(g, seed):
    """An op's seed: its own, else one from the graph seed (default 87654321,
    TensorFlow's DEFAULT_GRAPH_SEED) and the op's position, so a graph built twice
    draws the same numbers."""
    if seed is not None:
        return int(seed)
    base = g.seed if g.seed is not None else 87654321
    return (base * 1000003 + len(g._ops)) & 0x7FFFFFFFFFFFFFFF


def random_normal(shape, mean=0.0, stddev=1.0, dtype=_dt.float32, seed=None, name=None):
    g = _fw.get_default_graph()
    dt = _dt.as_dtype(dtype)
    return _op("RandomNormal", [], {"shape": _ints(shape, "shape"), "dtype": dt.name,
                                    "mean": float(mean), "stddev": float(stddev),
                                    "seed": _seed(g, seed)}, name, dt, list(shape))


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=_dt.float32, seed=None, name=None):
    g = _fw.get_default_graph()
    dt = _dt.as_dtype(dtype)
    return _op("TruncatedNormal", [], {"shape": _ints(shape, "shape"), "dtype": dt.name,
                                       "mean": float(mean), "stddev": float(stddev),
                                       "seed": _seed(g, seed)}, name, dt, list(shape))


def random_uniform(shape, minval=0, maxval=None, dtype=_dt.float32, seed=None, name=None):
    g = _fw.get_default_graph()
    dt = _dt.as_dtype(dtype)
    if maxval is None:
        if dt.is_integer:
            raise ValueError("random_uniform of %s needs maxval" % dt.name)
        maxval = 1.0
    return _op("RandomUniform", [], {"shape": _ints(shape, "shape"), "dtype": dt.name,
                                     "minval": float(minval), "maxval": float(maxval),
                                     "seed": _seed(g, seed)}, name, dt, list(shape))


# --- variables' updates -------------------------------------------------------------

def assign(ref, value, validate_shape=None, use_locking=None, name=None):
    """tf.assign: write value into Variable ref on its ps. Its output is the
    variable's new version (int64), not its value as in TensorFlow."""
    var = _variable_op(ref, "assign")
    v = value if isinstance(value, Tensor) else constant(value, var.outputs[0].dtype)
    return _op("Assign", [convert_to_tensor(v)], {"variable": var.name}, name, _dt.int64, [])


def assign_add(ref, value, use_locking=None, name=None):
    var = _variable_op(ref, "assign_add")
    v = value if isinstance(value, Tensor) else constant(value, var.outputs[0].dtype)
    return _op("AssignAdd", [convert_to_tensor(v)], {"variable": var.name}, name, _dt.int64, [])


def assign_sub(ref, value, use_locking=None, name=None):
    var = _variable_op(ref, "assign_sub")
    v = value if isinstance(value, Tensor) else constant(value, var.outputs[0].dtype)
    return _op("AssignAdd", [negative(v)], {"variable": var.name}, name or "AssignSub",
               _dt.int64, [])


def _variable_op(ref, what):
    t = ref._as_tensor() if hasattr(ref, "_as_tensor") else ref
    if not isinstance(t, Tensor) or t.op.type != "Variable":
        raise TypeError("%s needs a dg.Variable, got %r" % (what, ref))
    return t.op


# --- losses used at the top level and in nn -------------------------------------------

def sparse_softmax_cross_entropy_with_logits(_sentinel=None, labels=None, logits=None,
                                             name=None):
    if _sentinel is not None:
        raise ValueError("call sparse_softmax_cross_entropy_with_logits with labels= and "
                         "logits= (named), as TensorFlow requires")
    lg = convert_to_tensor(logits)
    lb = convert_to_tensor(labels)
    out = None if lg.shape.ndims is None else lg.shape.as_list()[:-1]
    return _op("SparseSoftmaxCrossEntropyWithLogits", [lg, lb], None, name, lg.dtype, out)


def softmax_cross_entropy_with_logits(_sentinel=None, labels=None, logits=None, dim=-1,
                                      name=None, axis=None):
    if _sentinel is not None:
        raise ValueError("call softmax_cross_entropy_with_logits with labels= and logits= "
                         "(named), as TensorFlow requires")
    if (axis if axis is not None else dim) not in (-1, None):
        raise NotImplementedError("softmax_cross_entropy_with_logits: only the last axis")
    lg = convert_to_tensor(logits)
    lb = convert_to_tensor(labels, lg.dtype) if isinstance(labels, Tensor) else \
        constant(labels, lg.dtype)
    out = None if lg.shape.ndims is None else lg.shape.as_list()[:-1]
    return _op("SoftmaxCrossEntropyWithLogits", [lg, lb], None, name, lg.dtype, out)


_fw._OPS = sys.modules[__name__]
