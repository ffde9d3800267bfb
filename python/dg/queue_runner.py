"""TensorFlow 1.x's input threads: Coordinator, QueueRunner,
start_queue_runners, and the batching functions built on them (batch,
shuffle_batch). A QueueRunner's threads run its enqueue ops with
Session.run again and again, each run a step on the cluster, until the
coordinator stops them or the input is exhausted (OutOfRangeError), as in
TensorFlow. For a whole training job, dg's own feeder (enqueue_many with
epochs=, in the job) does the same without a Python thread."""

import contextlib
import sys
import threading
import time

from . import errors
from . import framework as _fw
from .framework import GraphKeys, TensorShape
from .queues import FIFOQueue, RandomShuffleQueue

__all__ = ["Coordinator", "QueueRunner", "add_queue_runner", "start_queue_runners", "batch",
           "shuffle_batch"]


class Coordinator:
    """Stops a set of threads together: should_stop(), request_stop(ex),
    wait_for_stop(), join(threads) (which re-raises the first exception a
    thread reported)."""

    def __init__(self, clean_stop_exception_types=None):
        self._clean = tuple(clean_stop_exception_types or (errors.OutOfRangeError,))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._exc_info = None
        self._threads = set()
        self._joined = False

    def should_stop(self):
        return self._stop.is_set()

    def request_stop(self, ex=None):
        """Ask every thread to stop; ex (an exception, or sys.exc_info()) is
        raised by join unless it is a clean stop (OutOfRangeError). As in
        TensorFlow, only the first exception before the stop counts: threads
        failing while they stop do not."""
        with self._lock:
            if ex is not None and self._exc_info is None and not self._stop.is_set():
                if isinstance(ex, tuple):
                    info = ex
                else:
                    info = (type(ex), ex, ex.__traceback__)
                if not issubclass(info[0], self._clean):
                    self._exc_info = info
            self._stop.set()

    def clear_stop(self):
        with self._lock:
            self._joined = False
            self._exc_info = None
            self._stop.clear()

    def wait_for_stop(self, timeout=None):
        return self._stop.wait(timeout)

    @contextlib.contextmanager
    def stop_on_exception(self):
        try:
            yield
        except Exception:
            self.request_stop(sys.exc_info())

    def register_thread(self, thread):
        with self._lock:
            self._threads.add(thread)

    def raise_requested_exception(self):
        with self._lock:
            info = self._exc_info
        if info is not None:
            raise info[1].with_traceback(info[2])

    def join(self, threads=None, stop_grace_period_secs=120, ignore_live_threads=False):
        """Wait for the threads (and the registered ones) to end once a stop
        was requested; threads still alive stop_grace_period_secs after the
        request raise RuntimeError unless ignore_live_threads."""
        with self._lock:
            threads = list(self._threads | set(threads or []))
        while any(t.is_alive() for t in threads) and not self.wait_for_stop(0.05):
            pass
        deadline = time.monotonic() + stop_grace_period_secs
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        with self._lock:
            self._joined = True
            self._threads = set()
        self.raise_requested_exception()
        if alive and not ignore_live_threads:
            raise RuntimeError("coordinator stopped with threads still running: %s"
                               % " ".join(alive))

    @property
    def joined(self):
        return self._joined


class QueueRunner:
    """Threads that run enqueue_ops (one thread each) until the input ends;
    the last thread to end runs close_op (default: queue.close()); a stop
    request runs cancel_op (default: close the queue, which ends a blocked
    enqueue)."""

    def __init__(self, queue=None, enqueue_ops=None, close_op=None, cancel_op=None,
                 queue_closed_exception_types=None, name=None):
        if queue is None or not enqueue_ops:
            raise ValueError("a QueueRunner needs a queue and at least one enqueue op")
        self.queue = queue
        self.enqueue_ops = list(enqueue_ops)
        self.close_op = close_op if close_op is not None else queue.close()
        self.cancel_op = (cancel_op if cancel_op is not None else
                          queue.close(cancel_pending_enqueues=True))
        self._closed_types = tuple(queue_closed_exception_types or (errors.OutOfRangeError,))
        self.name = name or queue.name
        self._lock = threading.Lock()
        self._runs = {}
        self.exceptions_raised = []

    def _run(self, sess, op, coord):
        decremented = False
        try:
            while not (coord and coord.should_stop()):
                try:
                    sess.run(op)
                except self._closed_types:
                    with self._lock:
                        self._runs[sess] -= 1
                        decremented = True
                        last = self._runs[sess] == 0
                    if last:
                        try:
                            sess.run(self.close_op)
                        except Exception:   # noqa: BLE001 -- closed already, or the session
                            pass
                    return
        except Exception as e:
            if coord:
                coord.request_stop(e)
            else:
                with self._lock:
                    self.exceptions_raised.append(e)
                raise
        finally:
            if not decremented:
                with self._lock:
                    self._runs[sess] -= 1

    def _cancel_on_stop(self, sess, coord):
        coord.wait_for_stop()
        try:
            sess.run(self.cancel_op)
        except Exception:       # the session may be closed already: nothing to cancel
            pass

    def create_threads(self, sess, coord=None, daemon=False, start=False):
        """The threads for sess (started when start=True), registered with coord."""
        with self._lock:
            if self._runs.get(sess, 0) > 0:
                return []       # already running for this session
            self._runs[sess] = len(self.enqueue_ops)
            self.exceptions_raised = []
        threads = [threading.Thread(target=self._run, args=(sess, op, coord), daemon=daemon,
                                    name="QueueRunner:%s:%d" % (self.name, i))
                   for i, op in enumerate(self.enqueue_ops)]
        if coord:
            threads.append(threading.Thread(target=self._cancel_on_stop, args=(sess, coord),
                                            daemon=True, name="QueueRunner:%s:cancel"
                                            % self.name))
        for t in threads:
            if coord:
                coord.register_thread(t)
            if start:
                t.start()
        return threads


def add_queue_runner(qr, collection=GraphKeys.QUEUE_RUNNERS):
    _fw.get_default_graph().add_to_collection(collection, qr)


def start_queue_runners(sess=None, coord=None, daemon=True, start=True,
                        collection=GraphKeys.QUEUE_RUNNERS):
    """Start the threads of every QueueRunner of sess's graph; returns them."""
    if sess is None:
        from .session import get_default_session
        sess = get_default_session()     # ValueError without one
    threads = []
    for qr in sess.graph.get_collection(collection):
        threads.extend(qr.create_threads(sess, coord=coord, daemon=daemon, start=start))
    return threads


def _batch_args(tensors, shapes, enqueue_many):
    """(keys or None, the Tensors, their dtypes, one example's shapes)."""
    keys = None
    if isinstance(tensors, dict):
        keys = sorted(tensors)
        tensors = [tensors[k] for k in keys]
    elif not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    tensors = [_fw.convert_to_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("nothing to batch: give at least one tensor")
    if shapes is None:
        shapes = []
        for t in tensors:
            s = t.shape
            if enqueue_many and s.ndims is not None:
                s = TensorShape(s.as_list()[1:])
            if not s.is_fully_defined():
                raise ValueError("the shape of %s is not fully defined (%s): pass shapes=" %
                                 (t.name, s))
            shapes.append(s)
    return keys, tensors, [t.dtype for t in tensors], shapes


def _batch(queue, keys, tensors, batch_size, num_threads, enqueue_many,
           allow_smaller_final_batch, name):
    op = queue.enqueue_many(tensors) if enqueue_many else queue.enqueue(tensors)
    add_queue_runner(QueueRunner(queue, [op] * num_threads))
    out = (queue.dequeue_up_to(batch_size, name=name) if allow_smaller_final_batch
           else queue.dequeue_many(batch_size, name=name))
    if not isinstance(out, (list, dict)):
        out = [out]
    return dict(zip(keys, out)) if keys is not None else (out[0] if len(out) == 1 else out)


def batch(tensors, batch_size, num_threads=1, capacity=32, enqueue_many=False, shapes=None,
          dynamic_pad=False, allow_smaller_final_batch=False, shared_name=None, name=None):
    """Batches of tensors through a FIFOQueue filled by a QueueRunner (run
    start_queue_runners). The queue holds at least a batch (dg's dequeues take
    at most the capacity): capacity is raised to batch_size when smaller."""
    if dynamic_pad:
        raise ValueError("dynamic_pad is not supported: dg's queues hold examples of one "
                         "fixed shape")
    keys, ts, dtypes, shapes = _batch_args(tensors, shapes, enqueue_many)
    scope = name or "batch"
    q = FIFOQueue(max(capacity, batch_size), dtypes, shapes, shared_name=shared_name,
                  name=scope + "/fifo_queue")
    return _batch(q, keys, ts, batch_size, num_threads, enqueue_many,
                  allow_smaller_final_batch, scope)


def shuffle_batch(tensors, batch_size, capacity, min_after_dequeue, num_threads=1, seed=None,
                  enqueue_many=False, shapes=None, allow_smaller_final_batch=False,
                  shared_name=None, name=None):
    """Shuffled batches of tensors through a RandomShuffleQueue filled by a
    QueueRunner (run start_queue_runners). capacity is raised to hold at
    least min_after_dequeue + batch_size (dg's dequeues take at most what
    the queue holds beyond min_after_dequeue until it closes)."""
    keys, ts, dtypes, shapes = _batch_args(tensors, shapes, enqueue_many)
    scope = name or "shuffle_batch"
    q = RandomShuffleQueue(max(capacity, min_after_dequeue + batch_size), min_after_dequeue,
                           dtypes, shapes, seed=seed, shared_name=shared_name,
                           name=scope + "/random_shuffle_queue")
    return _batch(q, keys, ts, batch_size, num_threads, enqueue_many,
                  allow_smaller_final_batch, scope)
