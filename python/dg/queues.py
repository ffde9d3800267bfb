"""TensorFlow 1.x's queues over dg's shared queues (doc/training.md, "The
input pipeline"): FIFOQueue and RandomShuffleQueue declare a Queue node, held
by a ps task of the cluster like a variable; their methods build the queue
ops. A queue outlives the run that made it, so one sess.run enqueues and a
later one dequeues, as in TensorFlow; without a shared_name it is the
session's own (the session gives it a name of its own on the ps and deletes
it when it closes), with one every session that names it shares it. dg's
queues need every component's shape: ``shapes`` is required."""

import numbers
import os

from . import dtypes as _dt
from . import framework as _fw
from .framework import TensorShape, convert_to_tensor

__all__ = ["QueueBase", "FIFOQueue", "RandomShuffleQueue"]


def _components(dtypes, shapes, names):
    if isinstance(dtypes, (_dt.DType, str)) or not hasattr(dtypes, "__len__"):
        dtypes = [dtypes]
    dtypes = [_dt.as_dtype(d) for d in dtypes]
    if not dtypes:
        raise ValueError("a queue needs at least one component dtype")
    if shapes is None:
        raise ValueError("dg's queues need the shape of every component: pass shapes=[...] "
                         "(one per dtype, e.g. shapes=[[784], []])")
    if isinstance(shapes, TensorShape) or (shapes and isinstance(shapes[0], numbers.Integral)):
        shapes = [shapes]
    shapes = [TensorShape(s) for s in shapes]
    if len(shapes) != len(dtypes):
        raise ValueError("%d shapes for %d dtypes: give one shape per component"
                         % (len(shapes), len(dtypes)))
    for s in shapes:
        if not s.is_fully_defined():
            raise ValueError("queue component shape %s is not fully defined: dg's queues "
                             "hold examples of one fixed shape" % s)
    if names is not None:
        names = [names] if isinstance(names, str) else list(names)
        if len(names) != len(dtypes):
            raise ValueError("%d names for %d dtypes" % (len(names), len(dtypes)))
    return dtypes, shapes, names


class QueueBase:
    """A queue of examples, each a tuple of components (dtypes, shapes); with
    ``names`` they are dicts. Built by FIFOQueue and RandomShuffleQueue."""

    def __init__(self, capacity, dtypes, shapes, names, min_after_dequeue, shuffle, seed,
                 ids, shared_name, name):
        if not isinstance(capacity, numbers.Integral) or capacity < 1:
            raise ValueError("capacity must be a positive integer, not %r" % (capacity,))
        if min_after_dequeue < 0 or min_after_dequeue >= capacity:
            raise ValueError("min_after_dequeue (%d) must be at least 0 and less than "
                             "capacity (%d)" % (min_after_dequeue, capacity))
        self._dtypes, self._shapes, self._names = _components(dtypes, shapes, names)
        if ids is not None and not (0 <= ids < len(self._dtypes) and
                                    self._dtypes[ids] in (_dt.int32, _dt.int64) and
                                    self._shapes[ids].ndims == 0):
            raise ValueError("ids=%r must name a scalar int32 or int64 component" % (ids,))
        self._ids = ids
        comps = [{"dtype": d.name, "shape": s.as_list()}
                 for d, s in zip(self._dtypes, self._shapes)]
        g = _fw.get_default_graph()
        self._capacity = int(capacity)
        self._op = g._create_op("Queue", [], {
            "capacity": int(capacity), "min_after_dequeue": int(min_after_dequeue) or None,
            "shuffle": True if shuffle else None, "seed": int(seed) if seed else None,
            "components": comps, "ids": ids, "shared_name": shared_name or None}, name,
            outputs=())
        self._graph = g

    # -- what it is
    @property
    def name(self):
        return self._op.name

    @property
    def capacity(self):
        return self._capacity

    @property
    def shared_name(self):
        """The name sessions share it by, or None: a session's own queue."""
        return self._op.attrs.get("shared_name")

    @property
    def queue_ref(self):
        """The Queue node (an Operation without outputs)."""
        return self._op

    @property
    def dtypes(self):
        return list(self._dtypes)

    @property
    def shapes(self):
        return list(self._shapes)

    @property
    def names(self):
        return None if self._names is None else list(self._names)

    def _fed(self):
        """The components an enqueue gives: all but the id one, which dg's
        feeder writes itself."""
        return [i for i in range(len(self._dtypes)) if i != self._ids]

    def _values(self, vals, batched):
        """vals (a tensor, list, tuple, or a dict by name) as Tensors of the
        components an enqueue gives, checked against the queue's types."""
        want = self._fed()
        if isinstance(vals, dict):
            if self._names is None:
                raise ValueError("queue %s has no names: enqueue a list, not a dict" % self.name)
            missing = [self._names[i] for i in want if self._names[i] not in vals]
            if missing or len(vals) != len(want):
                raise ValueError("enqueue into %s takes the components %s, not %s"
                                 % (self.name, [self._names[i] for i in want], sorted(vals)))
            vals = [vals[self._names[i]] for i in want]
        elif not isinstance(vals, (list, tuple)):
            vals = [vals]
        if len(vals) != len(want):
            raise ValueError("enqueue into %s takes %d component%s, not %d%s"
                             % (self.name, len(want), "" if len(want) == 1 else "s", len(vals),
                                " (the id component is written by dg)" if self._ids is not None
                                else ""))
        out = []
        with self._graph.as_default():
            for i, v in zip(want, vals):
                t = convert_to_tensor(v, dtype=self._dtypes[i])   # ValueError: another dtype
                shape = t.shape
                want_shape = self._shapes[i]
                if batched:
                    if shape.ndims is not None and shape.ndims != want_shape.ndims + 1:
                        raise ValueError("enqueue_many into %s: component %d has shape %s, "
                                         "not [batch] + %s" % (self.name, i, shape, want_shape))
                    if shape.ndims is not None:
                        shape = TensorShape(shape.as_list()[1:])
                if not shape.is_compatible_with(want_shape):
                    raise ValueError("component %d of %s has shape %s, not %s"
                                     % (i, self.name, shape, want_shape))
                out.append(t)
        return out

    # -- the ops
    def enqueue_many(self, vals, name=None, epochs=1, shuffle=False, seed=0, close=False,
                     threads=None, chunk=None):
        """Enqueue every example of vals (their first dimension is the batch).
        dg's feeder options: epochs (each example that many times, in a new
        order each pass with shuffle=True), close (close the queue after the
        last), threads and chunk. Returns an Operation."""
        from .ops import _op
        ins = self._values(vals, True)
        if chunk is None:
            # a chunk never exceeds the queue: more examples than the capacity
            # go in several enqueues, each waiting for room, as in TensorFlow
            chunk = min(self._capacity, 1024)
        with self._graph.as_default():
            out = _op("QueueEnqueueMany", ins, {
                "queue": self.name, "epochs": int(epochs), "shuffle": bool(shuffle),
                "seed": int(seed) or None, "close": bool(close), "threads": threads,
                "chunk": int(chunk)}, name or self.name + "_enqueue_many", _dt.int64,
                TensorShape([]))
        return out.op

    def enqueue(self, vals, name=None):
        """Enqueue one example. Returns an Operation."""
        from .ops import expand_dims
        ins = self._values(vals, False)
        g = self._graph
        full = g.unique_name(name or self.name + "_enqueue", mark_as_used=False)
        with g.as_default(), g.name_scope(None):       # full has the scope already
            batched = [expand_dims(t, 0, name="%s/expand_%d" % (full, i))
                       for i, t in enumerate(ins)]
            return self.enqueue_many(batched, name=full)

    def _dequeue(self, n, allow_smaller, name):
        from .ops import _op
        if n > self._capacity:
            raise ValueError("a dequeue of %d from %s, whose capacity is %d: dg's dequeues "
                             "take at most the capacity; give the queue a capacity of at "
                             "least %d" % (n, self.name, self._capacity, n))
        outs = [(d, TensorShape([n if not allow_smaller else None] + s.as_list()))
                for d, s in zip(self._dtypes, self._shapes)]
        outs.append((_dt.int64, TensorShape([])))           # the lease: not TensorFlow's
        with self._graph.as_default():
            got = _op("QueueDequeueMany", [], {"queue": self.name, "batch": int(n),
                                               "allow_smaller": bool(allow_smaller)},
                      name, outputs=outs)
        return got[:-1]

    def _result(self, tensors):
        if self._names is not None:
            return dict(zip(self._names, tensors))
        return tensors[0] if len(tensors) == 1 else list(tensors)

    def dequeue_many(self, n, name=None):
        """n examples, each component with a leading dimension n; OutOfRangeError
        when the queue is closed with fewer left."""
        if not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError("dequeue_many takes a positive integer count, not %r" % (n,))
        return self._result(self._dequeue(n, False, name or self.name + "_dequeue_many"))

    def dequeue_up_to(self, n, name=None):
        """At most n examples: fewer once the queue is closed; OutOfRangeError
        when it is closed and empty."""
        if not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError("dequeue_up_to takes a positive integer count, not %r" % (n,))
        return self._result(self._dequeue(n, True, name or self.name + "_dequeue_up_to"))

    def dequeue(self, name=None):
        """One example (no batch dimension)."""
        from .ops import reshape
        name = name or self.name + "_dequeue"
        got = self._dequeue(1, False, name)
        with self._graph.as_default(), _fw.name_scope(name):
            one = [reshape(t, s.as_list()) for t, s in zip(got, self._shapes)]
        return self._result(one)

    def close(self, cancel_pending_enqueues=False, name=None):
        """Close the queue: enqueues fail from now on, dequeues take what is
        left. Returns an Operation."""
        from .ops import _op
        with self._graph.as_default():
            out = _op("QueueClose", [], {"queue": self.name}, name or self.name + "_close",
                      _dt.int64, TensorShape([]))
        return out.op

    def size(self, name=None):
        """The examples the queue holds now (int32, as in TensorFlow)."""
        from .ops import _op, cast
        with self._graph.as_default():
            n = _op("QueueSize", [], {"queue": self.name}, name or self.name + "_size",
                    _dt.int64, TensorShape([]))
            return cast(n, _dt.int32)


class FIFOQueue(QueueBase):
    """tf.FIFOQueue(capacity, dtypes, shapes, names=None, shared_name=None,
    name="fifo_queue"): examples leave in the order they came."""

    def __init__(self, capacity, dtypes, shapes=None, names=None, shared_name=None,
                 name="fifo_queue", ids=None):
        super().__init__(capacity, dtypes, shapes, names, 0, False, 0, ids, shared_name,
                         name)


class RandomShuffleQueue(QueueBase):
    """tf.RandomShuffleQueue(capacity, min_after_dequeue, dtypes, shapes,
    names=None, seed=None, shared_name=None, name="random_shuffle_queue"): a
    dequeue takes examples uniformly at random, leaving min_after_dequeue
    queued until the queue is closed. dg's extension: ids=K names a scalar
    integer component that dg's feeder fills with each example's id (exactly
    once per epoch in training, doc/training.md)."""

    def __init__(self, capacity, min_after_dequeue, dtypes, shapes=None, names=None,
                 seed=None, shared_name=None, name="random_shuffle_queue", ids=None):
        if seed is None:
            # the graph's seed when set, else a new order each run, as in TensorFlow
            seed = _fw.get_default_graph().seed or int.from_bytes(os.urandom(4), "little") | 1
        super().__init__(capacity, dtypes, shapes, names, min_after_dequeue, True, seed, ids,
                         shared_name, name)
