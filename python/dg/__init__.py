"""dg's Python front end: TensorFlow 1.x's graph-building API over dg's graph
format and HTTP API, so that ``import dg as tf`` runs TensorFlow 1.x programs
on a dg cluster. See doc/python.md."""

__version__ = "0.1.0"

from . import data, dtypes, errors, nn, train                  # noqa: F401
from .dtypes import (DType, as_dtype, bfloat16, bool, double, float16, float32,  # noqa: F401
                     float64, half, int32, int64, uint8)
from .framework import (DeviceSpec, Dimension, Graph, GraphKeys, Operation, Tensor,  # noqa: F401
                        TensorShape, add_to_collection, control_dependencies,
                        convert_to_tensor, device, get_collection, get_default_graph, group,
                        name_scope, no_op, reset_default_graph, set_random_seed)
from .ops import *                                              # noqa: F401,F403
from .queues import FIFOQueue, QueueBase, RandomShuffleQueue   # noqa: F401
from .session import ConfigProto, InteractiveSession, Session, get_default_session  # noqa: F401
from .variables import *                                        # noqa: F401,F403
from .variables import glorot_uniform_initializer as glorot_uniform  # noqa: F401

newaxis = None
