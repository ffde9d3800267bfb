"""Input: dg's reader ops (the whole dataset as one tensor, read by the task
that runs the node) and ShardBatch, the batch of a training step."""

from . import dtypes as _dt
from .framework import convert_to_tensor
from .ops import _op

__all__ = ["idx", "npy", "csv", "shard_batch"]


def idx(path, scale=False, flatten=False, one_hot=0, dtype=None, name=None):
    """An IDX file (MNIST's format, plain or .gz): images [N,28,28] (flatten:
    [N,784]) or labels [N]; scale: uint8 -> [0,1] floats; one_hot: labels as
    rows of that many classes. The dtype follows IdxReader's rule unless given:
    float32 with scale or one_hot, else uint8 images and int32 labels; the
    shape is read from the file's header when it is here."""
    attrs = {"path": str(path), "scale": bool(scale) or None, "flatten": bool(flatten) or None,
             "one_hot": int(one_hot) or None}
    dims = _idx_dims(path)
    if dtype is not None:
        dt = _dt.as_dtype(dtype)
        attrs["dtype"] = dt.name
    elif scale or one_hot:
        dt = _dt.float32
    else:
        dt = _dt.int32 if dims is not None and len(dims) == 1 else _dt.uint8
    shape = None
    if dims is not None:
        shape = list(dims)
        if flatten and len(shape) == 3:
            shape = [shape[0], shape[1] * shape[2]]
        if one_hot and len(shape) == 1:
            shape = shape + [int(one_hot)]
    return _op("IdxReader", [], attrs, name or "IdxReader", dt, shape)


def _idx_dims(path):
    import gzip
    import struct
    try:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rb") as f:
            head = f.read(4)
            nd = head[3]
            return list(struct.unpack(">" + "I" * nd, f.read(4 * nd)))
    except (OSError, IndexError, struct.error):
        return None


def npy(path, dtype=None, name=None):
    """The tensor stored in a .npy file (its dtype and shape from the header when
    the file is here)."""
    import numpy as np
    shape, dt = None, _dt.as_dtype(dtype) if dtype is not None else None
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            shp, _, d = np.lib.format._read_array_header(f, version)
            shape, dt = list(shp), dt or _dt.as_dtype(d)
    except (OSError, ValueError):
        if dt is None:
            raise ValueError("npy(%r): the file is not here, so give its dtype" % path) from None
    return _op("NpyReader", [], {"path": str(path), "dtype": dt.name}, name or "NpyReader",
               dt, shape)


def csv(path, columns=None, column=None, dtype=_dt.float32, header=False, delimiter=",",
        name=None):
    """A CSV file of numbers: [N, len(columns)] or, with column=, one column [N]."""
    dt = _dt.as_dtype(dtype)
    attrs = {"path": str(path), "dtype": dt.name, "header": bool(header) or None,
             "delimiter": delimiter if delimiter != "," else None,
             "columns": None if columns is None else [int(c) for c in columns],
             "column": None if column is None else int(column)}
    shape = [None] if column is not None else [None, None if columns is None else len(columns)]
    return _op("CsvReader", [], attrs, name or "CsvReader", dt, shape)


def shard_batch(examples, labels, batch, seed=0, shuffle=True, name=None):
    """(images, labels) of one training step: batch number `step` of this
    replica's shard, reshuffled every epoch (a training job sets the shard)."""
    x, y = convert_to_tensor(examples), convert_to_tensor(labels)
    sx = None if x.shape.ndims is None else [int(batch)] + x.shape.as_list()[1:]
    sy = None if y.shape.ndims is None else [int(batch)] + y.shape.as_list()[1:]
    out = _op("ShardBatch", [x, y], {"batch": int(batch), "seed": int(seed),
                                     "shuffle": None if shuffle else False},
              name or "ShardBatch", outputs=[(x.dtype, sx), (y.dtype, sy)])
    return out[0], out[1]


