"""TensorFlow 1.x's queues on dg's shared queues: FIFOQueue and
RandomShuffleQueue (enqueue, enqueue_many, dequeue, dequeue_many,
dequeue_up_to, size, close and OutOfRangeError), a queue shared by two
sessions of one cluster, QueueRunner + Coordinator + start_queue_runners
(the input exhausted, a failing enqueue), shuffle_batch and batch, the
checks made while building, and a queue-fed fit of the MLP."""
import os
import sys
import threading
import unittest

import numpy as np

import dg as tf
from util import ASAN, SRC, Fresh, cluster, run_example

os.environ.setdefault("DG_SERVER_QUIET", "1")
DATA = "/usr/share/datasets/fashion-mnist/"
HAVE_DATA = os.path.exists(DATA + "train-images-idx3-ubyte.gz")


class Queues(Fresh):
    def test_fifo_queue_keeps_order_and_ends_with_out_of_range(self):
        q = tf.FIFOQueue(10, [tf.float32, tf.int32], shapes=[[3], []])
        x = tf.placeholder(tf.float32, [None, 3])
        y = tf.placeholder(tf.int32, [None])
        enq = q.enqueue_many([x, y])
        one = q.enqueue([tf.constant([7., 8., 9.]), 42])
        a, b = q.dequeue()
        bx, by = q.dequeue_many(2)
        ux, uy = q.dequeue_up_to(5)
        self.assertEqual(a.shape.as_list(), [3])
        self.assertEqual(bx.shape.as_list(), [2, 3])
        self.assertEqual(ux.shape.as_list(), [None, 3])
        with tf.Session() as s:
            self.assertIsNone(s.run(enq, {x: np.arange(9).reshape(3, 3), y: [1, 2, 3]}))
            s.run(one)
            self.assertEqual(s.run(q.size()), 4)
            va, vb = s.run([a, b])
            np.testing.assert_array_equal(va, [0, 1, 2])
            self.assertEqual(vb, 1)
            vx, vy = s.run([bx, by])
            np.testing.assert_array_equal(vx, [[3, 4, 5], [6, 7, 8]])
            np.testing.assert_array_equal(vy, [2, 3])
            s.run(q.close())
            # closed with one left: dequeue_many(2) cannot, dequeue_up_to(5) takes it
            with self.assertRaises(tf.errors.OutOfRangeError):
                s.run(bx)
            vx, vy = s.run([ux, uy])
            np.testing.assert_array_equal(vx, [[7, 8, 9]])
            np.testing.assert_array_equal(vy, [42])
            with self.assertRaises(tf.errors.OutOfRangeError):
                s.run(a)
            with self.assertRaises(tf.errors.OutOfRangeError):
                s.run(one)          # enqueue after close

    def test_random_shuffle_queue_shuffles_every_example_once(self):
        q = tf.RandomShuffleQueue(200, 10, [tf.int64], shapes=[[]], seed=5)
        self.assertEqual(q.queue_ref.node_def["attrs"], {
            "capacity": 200, "min_after_dequeue": 10, "shuffle": True, "seed": 5,
            "components": [{"dtype": "int64", "shape": []}]})
        enq = q.enqueue_many(tf.constant(np.arange(100, dtype=np.int64)))
        got = q.dequeue_up_to(30)
        with tf.Session() as s:
            s.run(enq)
            s.run(q.close())
            seen = []
            while True:
                try:
                    seen.extend(s.run(got).tolist())
                except tf.errors.OutOfRangeError:
                    break
        self.assertEqual(sorted(seen), list(range(100)))
        self.assertNotEqual(seen, list(range(100)))

    def test_named_components_are_dicts(self):
        q = tf.FIFOQueue(4, [tf.float32, tf.int64], shapes=[[2], []], names=["x", "id"])
        self.assertEqual(q.names, ["x", "id"])
        enq = q.enqueue({"x": [1., 2.], "id": 9})
        out = q.dequeue()
        self.assertEqual(sorted(out), ["id", "x"])
        with tf.Session() as s:
            s.run(enq)
            got = s.run(out)
        np.testing.assert_array_equal(got["x"], [1, 2])
        self.assertEqual(got["id"], 9)
        with self.assertRaisesRegex(ValueError, "takes the components"):
            q.enqueue({"x": [1., 2.]})

    def test_bad_queues_and_components_are_refused_while_building(self):
        with self.assertRaisesRegex(ValueError, "shapes="):
            tf.FIFOQueue(4, [tf.float32])
        with self.assertRaisesRegex(ValueError, "capacity"):
            tf.FIFOQueue(0, [tf.float32], shapes=[[]])
        with self.assertRaisesRegex(ValueError, "min_after_dequeue"):
            tf.RandomShuffleQueue(4, 4, [tf.float32], shapes=[[]])
        with self.assertRaisesRegex(ValueError, "not fully defined"):
            tf.FIFOQueue(4, [tf.float32], shapes=[[None, 3]])
        with self.assertRaisesRegex(ValueError, "2 shapes for 1 dtypes"):
            tf.FIFOQueue(4, [tf.float32], shapes=[[], []])
        with self.assertRaisesRegex(ValueError, "ids="):
            tf.RandomShuffleQueue(4, 0, [tf.float32], shapes=[[]], ids=0)
        q = tf.FIFOQueue(4, [tf.float32, tf.int32], shapes=[[3], []])
        with self.assertRaisesRegex(ValueError, "takes 2 components, not 1"):
            q.enqueue([[1., 2., 3.]])
        with self.assertRaisesRegex(ValueError, "has shape"):
            q.enqueue([[1., 2.], 1])
        with self.assertRaisesRegex(ValueError, r"not \[batch\]"):
            q.enqueue_many([[1., 2., 3.], [1]])
        with self.assertRaisesRegex(ValueError, "is int64, not float32"):
            q.enqueue([tf.constant([1, 2, 3], dtype=tf.int64), 1])
        with self.assertRaisesRegex(ValueError, "positive integer"):
            q.dequeue_many(0)

    def test_a_queue_is_shared_by_sessions_only_under_a_shared_name(self):
        from dg._http import Client
        with cluster({"ps": 1, "worker": 1}) as (spec, servers):
            with tf.device("/job:ps/task:0"):
                shared = tf.FIFOQueue(100, [tf.int32], shapes=[[]], shared_name="common")
                own = tf.FIFOQueue(100, [tf.int32], shapes=[[]], name="own")
            self.assertEqual(shared.shared_name, "common")
            self.assertIsNone(own.shared_name)
            ten = tf.constant(np.arange(10, dtype=np.int32))
            with tf.Session(servers[1].target) as s1:
                s1.run([shared.enqueue_many(ten), own.enqueue_many(ten)])
                self.assertEqual(s1.run(own.size()), 10)
                ps = Client(servers[0].address)
                names = [q["name"] for q in ps.get_json("/v1/queues")["queues"]]
                self.assertIn("common", names)
                self.assertEqual(len([n for n in names if n.startswith("own.s")]), 1, names)
            with tf.Session(servers[1].target) as s2:
                np.testing.assert_array_equal(s2.run(shared.dequeue_many(10)), np.arange(10))
                self.assertEqual(s2.run(own.size()), 0)     # a queue of its own
            # closing a session deleted its own queues; the shared one stays
            names = [q["name"] for q in ps.get_json("/v1/queues")["queues"]]
            self.assertEqual(names, ["common"])
            ps.close()

    def test_more_examples_than_the_capacity_go_in_pieces(self):
        q = tf.FIFOQueue(4, [tf.int32], shapes=[[]])
        enq = q.enqueue_many(tf.constant(np.arange(10, dtype=np.int32)))
        got = q.dequeue_many(4)
        with self.assertRaisesRegex(ValueError, "capacity of at least 5"):
            q.dequeue_many(5)
        out = []
        with tf.Session() as s:
            t = threading.Thread(target=s.run, args=(enq,))
            t.start()           # blocks until the dequeues make room
            for _ in range(2):
                out.extend(s.run(got).tolist())
            t.join(60)
            self.assertFalse(t.is_alive())
            s.run(q.close())
            out.extend(s.run(q.dequeue_up_to(4)).tolist())      # the last 2
        self.assertEqual(out, list(range(10)))


class Runners(Fresh):
    def test_queue_runners_feed_until_the_input_ends(self):
        numbers = tf.FIFOQueue(100, [tf.int64], shapes=[[]], name="numbers")
        fill = numbers.enqueue_many([tf.constant(np.arange(23, dtype=np.int64))])
        squares = tf.FIFOQueue(8, [tf.int64], shapes=[[]], name="squares")
        v = numbers.dequeue()
        tf.train.add_queue_runner(tf.train.QueueRunner(squares, [squares.enqueue([v * v])] * 2))
        b = squares.dequeue_up_to(5)
        got, done = [], False
        with tf.Session() as sess:
            sess.run(fill)
            sess.run(numbers.close())
            coord = tf.train.Coordinator()
            threads = tf.train.start_queue_runners(sess, coord)
            self.assertEqual(len(threads), 3)          # two enqueue threads + the canceller
            try:
                while not coord.should_stop():
                    got.extend(sess.run(b).tolist())
            except tf.errors.OutOfRangeError:
                done = True
            finally:
                coord.request_stop()
            coord.join(threads, stop_grace_period_secs=30)
        self.assertTrue(done)
        self.assertEqual(sorted(got), [i * i for i in range(23)])

    def test_runners_may_make_the_first_run_of_a_local_session(self):
        # the session's private server is started by a runner's thread, which
        # ends; the server must not end with it
        q = tf.FIFOQueue(8, [tf.int32], shapes=[[]])
        tf.train.add_queue_runner(tf.train.QueueRunner(
            q, [q.enqueue_many(tf.constant(np.arange(3, dtype=np.int32)))]))
        got = q.dequeue_many(3)
        with tf.Session() as sess:
            coord = tf.train.Coordinator()
            threads = tf.train.start_queue_runners(sess, coord)
            self.assertEqual(sorted(sess.run(got).tolist()), [0, 1, 2])
            coord.request_stop()
            coord.join(threads, stop_grace_period_secs=30)
            threading.Event().wait(0.3)
            self.assertEqual(sess.run(q.size()), sess.run(q.size()))   # still serving

    def test_shuffle_batch_of_a_whole_dataset(self):
        data = tf.constant(np.arange(20, dtype=np.float32).reshape(10, 2))
        labels = tf.constant(np.arange(10, dtype=np.int32))
        x, y = tf.train.shuffle_batch([data, labels], batch_size=4, capacity=50,
                                      min_after_dequeue=5, enqueue_many=True, seed=1)
        self.assertEqual(x.shape.as_list(), [4, 2])
        with tf.Session() as sess:
            coord = tf.train.Coordinator()
            threads = tf.train.start_queue_runners(sess=sess, coord=coord)
            seen = []
            for _ in range(10):
                xv, yv = sess.run([x, y])
                np.testing.assert_array_equal(xv[:, 0], 2 * yv)   # pairs stay together
                seen.extend(yv.tolist())
            coord.request_stop()
            coord.join(threads, stop_grace_period_secs=30)
        self.assertEqual(len(seen), 40)
        self.assertEqual([o.name for o in self.g._ops if o.type == "Queue"],
                         ["shuffle_batch/random_shuffle_queue"])
        self.assertEqual(x.op.name, "shuffle_batch")
        # the runner enqueues the 10 examples again and again: a random draw of
        # 40 need not hold all 10, but only they, and (all but surely) most
        self.assertLessEqual(set(seen), set(range(10)))
        self.assertGreaterEqual(len(set(seen)), 5)

    def test_batch_keeps_order_with_one_thread_and_names_by_dict(self):
        d = tf.train.batch({"n": tf.constant(np.arange(6, dtype=np.int32))}, batch_size=3,
                           capacity=12, enqueue_many=True)
        with tf.Session() as sess:
            coord = tf.train.Coordinator()
            threads = tf.train.start_queue_runners(sess, coord)
            got = [sess.run(d)["n"].tolist() for _ in range(4)]
            coord.request_stop()
            coord.join(threads, stop_grace_period_secs=30)
        self.assertEqual(got, [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]])

    def test_a_failing_enqueue_stops_the_coordinator_and_join_raises_it(self):
        q = tf.FIFOQueue(4, [tf.float32], shapes=[[]])
        p = tf.placeholder(tf.float32, [None])          # never fed: the run fails
        tf.train.add_queue_runner(tf.train.QueueRunner(q, [q.enqueue_many([p])]))
        with tf.Session() as sess:
            coord = tf.train.Coordinator()
            threads = tf.train.start_queue_runners(sess, coord)
            self.assertTrue(coord.wait_for_stop(60))
            with self.assertRaises(tf.errors.InvalidArgumentError):
                coord.join(threads, stop_grace_period_secs=30)

    def test_coordinator_stop_on_exception_and_clean_stops(self):
        coord = tf.train.Coordinator()
        with coord.stop_on_exception():
            raise tf.errors.OutOfRangeError(None, None, "end of input")
        self.assertTrue(coord.should_stop())
        coord.join([])                                  # a clean stop raises nothing
        coord.clear_stop()
        t = threading.Thread(target=lambda: coord.request_stop(ValueError("boom")))
        t.start()
        with self.assertRaisesRegex(ValueError, "boom"):
            coord.join([t])
        # an error reported after the stop (a thread failing as it stops) is not raised
        coord.clear_stop()
        coord.request_stop()
        coord.request_stop(RuntimeError("while stopping"))
        coord.join([])

    def test_start_queue_runners_needs_a_session(self):
        with self.assertRaisesRegex(ValueError, "no default session"):
            tf.train.start_queue_runners()


@unittest.skipUnless(HAVE_DATA, "no Fashion-MNIST at %s (apt-get install dataset-fashion-mnist)"
                     % DATA)
class QueueFit(Fresh):
    def test_the_feeder_is_in_the_job_and_closes_the_queue(self):
        sys.path.insert(0, os.path.join(SRC, "examples", "python"))
        import mlp_queue
        train_op, _, test_acc = mlp_queue.build()
        # an enqueue for sess.run (it needs a feed) is no feeder of the job
        queue = [o for o in self.g._ops if o.type == "Queue"][0]
        x = tf.placeholder(tf.float32, [None, 784], name="more_x")
        y = tf.placeholder(tf.int32, [None], name="more_y")
        self.g._create_op("QueueEnqueueMany", [x, y], {"queue": queue.name, "close": False},
                          "more", outputs=[(tf.int64, None)])
        doc = tf.train.training_graph(train_op, epochs=3, batch=64,
                                      eval={"test_accuracy": test_acc})
        self.assertFalse({"more", "more_x", "more_y"} & {n["name"] for n in doc["nodes"]})
        nodes = {n["name"]: n for n in doc["nodes"]}
        self.assertEqual(nodes["feed"]["op"], "QueueEnqueueMany")
        self.assertNotIn("close", nodes["feed"]["attrs"])       # dg's feeder closes at the end
        self.assertEqual(nodes["examples"]["attrs"]["ids"], 2)
        self.assertIn("train_x", nodes)
        # the graph kept its session semantics: its enqueue does not close
        self.assertIs(self.g.get_operation_by_name("feed").attrs["close"], False)

    @unittest.skipIf(ASAN, "the 3-epoch queue-fed MLP runs in the release build")
    def test_the_queue_fed_python_mlp_learns_every_example_once_per_epoch(self):
        done = run_example("mlp_queue.py", {"ps": 1, "worker": 2})
        self.assertEqual(done.returncode, 0, done.stderr)
        acc = float(done.stdout.split("test_accuracy:")[1])
        self.assertGreaterEqual(acc, 0.84, done.stderr)
        self.assertIn("180000 examples", done.stderr)       # 3 x 60000, each once


if __name__ == "__main__":
    unittest.main()
