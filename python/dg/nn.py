"""tf.nn: activations, losses, convolution, pooling, dropout, batch norm and
embeddings, over dg's ops."""

from . import ops as _ops
from .framework import convert_to_tensor
from .ops import _ints, _op, sigmoid, tanh  # noqa: F401 -- tf.nn.sigmoid, tf.nn.tanh
from .ops import softmax_cross_entropy_with_logits, sparse_softmax_cross_entropy_with_logits

softmax_cross_entropy_with_logits_v2 = softmax_cross_entropy_with_logits

__all__ = ["relu", "sigmoid", "tanh", "softmax", "log_softmax", "bias_add", "l2_loss",
           "sparse_softmax_cross_entropy_with_logits", "softmax_cross_entropy_with_logits",
           "softmax_cross_entropy_with_logits_v2", "conv2d", "max_pool", "avg_pool",
           "dropout", "fused_batch_norm", "embedding_lookup"]


def relu(features, name=None):
    return _ops._unary("Relu", features, name)


def softmax(logits, axis=-1, name=None, dim=None):
    x = convert_to_tensor(logits)
    return _op("Softmax", [x], {"axis": int(dim if dim is not None else axis)}, name, x.dtype,
               x.shape)


def log_softmax(logits, axis=-1, name=None, dim=None):
    x = convert_to_tensor(logits)
    return _op("LogSoftmax", [x], {"axis": int(dim if dim is not None else axis)}, name,
               x.dtype, x.shape)


def bias_add(value, bias, data_format=None, name=None):
    if data_format not in (None, "NHWC", "N...C"):
        raise NotImplementedError("bias_add: only channels last (NHWC)")
    return _ops.add(value, bias, name=name or "BiasAdd")


def l2_loss(t, name=None):
    """sum(t ** 2) / 2."""
    x = convert_to_tensor(t)
    return _ops.multiply(_ops.reduce_sum(_ops.square(x)), 0.5, name=name or "L2Loss")


def _hw(v, what):
    """[1, h, w, 1] / [h, w] / k: the attr as given (dg takes all three forms)."""
    return _ints(v, what)


def _conv_out(size, k, s, d, padding):
    if size is None:
        return None
    if padding == "SAME":
        return -(-size // s)
    return max(0, -(-(size - (k - 1) * d) // s))


def _spatial(x, kh, kw, strides, dilations, padding, channels):
    if x.shape.ndims != 4:
        return None
    n, h, w, _ = x.shape.as_list()
    s = _ints(strides, "strides") if strides is not None else [1]
    s = s[1:3] if len(s) == 4 else (s * 2 if len(s) == 1 else s)
    d = _ints(dilations, "dilations") if dilations is not None else [1]
    d = d[1:3] if len(d) == 4 else (d * 2 if len(d) == 1 else d)
    return [n, _conv_out(h, kh, s[0], d[0], padding), _conv_out(w, kw, s[1], d[1], padding),
            channels]


def conv2d(input, filter=None, strides=None, padding=None, use_cudnn_on_gpu=True,
           data_format="NHWC", dilations=None, name=None, filters=None):
    """2-D convolution of NHWC images with HWIO filters."""
    if data_format != "NHWC":
        raise NotImplementedError("conv2d: only NHWC (dg's layout)")
    x = convert_to_tensor(input)
    f = convert_to_tensor(filter if filter is not None else filters)
    if padding not in ("SAME", "VALID"):
        raise ValueError("conv2d: padding must be 'SAME' or 'VALID', got %r" % (padding,))
    out = None
    if f.shape.ndims == 4:
        kh, kw, _, oc = f.shape.as_list()
        if kh is not None and kw is not None:
            out = _spatial(x, kh, kw, strides, dilations, padding, oc)
    attrs = {"padding": padding, "strides": None if strides is None else _hw(strides, "strides"),
             "dilations": None if dilations is None else _hw(dilations, "dilations")}
    return _op("Conv2D", [x, f], attrs, name, x.dtype, out)


def _pool(op_type, value, ksize, strides, padding, data_format, name):
    if data_format not in ("NHWC", None):
        raise NotImplementedError("%s: only NHWC (dg's layout)" % op_type)
    x = convert_to_tensor(value)
    k = _ints(ksize, "ksize")
    kh, kw = (k[1], k[2]) if len(k) == 4 else ((k[0], k[0]) if len(k) == 1 else k)
    ch = x.shape.as_list()[3] if x.shape.ndims == 4 else None
    out = _spatial(x, kh, kw, strides, None, padding, ch)
    return _op(op_type, [x], {"ksize": k, "strides": None if strides is None else
                              _ints(strides, "strides"), "padding": padding},
               name, x.dtype, out)


def max_pool(value, ksize, strides, padding, data_format="NHWC", name=None):
    return _pool("MaxPool2D", value, ksize, strides, padding, data_format, name or "MaxPool")


def avg_pool(value, ksize, strides, padding, data_format="NHWC", name=None):
    return _pool("AvgPool2D", value, ksize, strides, padding, data_format, name or "AvgPool")


def dropout(x, keep_prob=None, noise_shape=None, seed=None, name=None, rate=None):
    """Zero each element with probability rate (1 - keep_prob), scale the rest by
    1 / (1 - rate). dg's Dropout draws its mask from (seed, step): a fresh mask
    every training step, the same one in a step's forward and backward pass."""
    if noise_shape is not None:
        raise NotImplementedError("dropout: noise_shape (dg draws one bit per element)")
    if rate is None:
        if keep_prob is None:
            raise ValueError("dropout needs rate or keep_prob")
        rate = 1.0 - float(keep_prob)
    t = convert_to_tensor(x)
    return _op("Dropout", [t], {"rate": float(rate), "seed": _ops._seed(t.graph, seed)},
               name, t.dtype, t.shape)


def fused_batch_norm(x, scale, offset, mean=None, variance=None, epsilon=0.001,
                     data_format="NHWC", is_training=True, name=None):
    """(y, batch_mean, batch_variance): channels-last batch normalisation."""
    if data_format != "NHWC":
        raise NotImplementedError("fused_batch_norm: only channels last (NHWC)")
    t = convert_to_tensor(x)
    ins = [t, convert_to_tensor(scale), convert_to_tensor(offset)]
    if not is_training:
        if mean is None or variance is None:
            raise ValueError("fused_batch_norm with is_training=False needs mean and variance")
        ins += [convert_to_tensor(mean), convert_to_tensor(variance)]
    c = None if t.shape.ndims is None else [t.shape.as_list()[-1]]
    return tuple(_op("FusedBatchNorm", ins, {"epsilon": float(epsilon),
                                             "is_training": bool(is_training)},
                     name or "FusedBatchNorm",
                     outputs=[(t.dtype, t.shape), (t.dtype, c), (t.dtype, c)]))


def embedding_lookup(params, ids, partition_strategy="mod", name=None, max_norm=None):
    """Rows of params (one tensor or Variable) that ids name: dg's Gather; on a
    Variable, a training step pulls and pushes only those rows."""
    if isinstance(params, (list, tuple)):
        if len(params) != 1:
            raise NotImplementedError("embedding_lookup over a list of shards")
        params = params[0]
    if max_norm is not None:
        raise NotImplementedError("embedding_lookup: max_norm")
    return _ops.gather(params, ids, name=name or "embedding_lookup")


