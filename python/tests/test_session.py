"""Sessions against real dg: in this process (dg eval, or a private server for
Variables) and on clusters of tf.train.Servers started by the tests."""
import os
import subprocess
import sys
import unittest

import numpy as np

import dg as tf
from util import SRC, Fresh, cluster, free_ports, tmpdir

os.environ.setdefault("DG_SERVER_QUIET", "1")


class Local(Fresh):
    def test_the_seed_sum_and_fetch_structures(self):
        x = tf.constant(2)
        y1, y2 = x + 300, x - 66
        y = y1 + y2
        with tf.Session() as sess:
            self.assertEqual(sess.run(y), 238)
            self.assertIsInstance(sess.run(y), np.int32)
            got = sess.run({"sum": y, "parts": (y1, [y2])})
            self.assertEqual(got, {"sum": 238, "parts": (302, [-64])})
            self.assertEqual(y.eval(), 238)
            self.assertEqual(sess.run("Add_1:0"), 238)

    def test_feeds_are_cast_shape_checked_and_any_output_can_be_fed(self):
        x = tf.placeholder(tf.float32, [100])
        m = tf.reduce_mean(x)
        data = np.random.random(100)
        with tf.Session() as sess:
            self.assertAlmostEqual(float(sess.run(m, {x: data})),
                                   float(np.mean(data.astype(np.float32))), places=6)
            with self.assertRaisesRegex(ValueError, r"Cannot feed value of shape \(3,\)"):
                sess.run(m, {x: [1, 2, 3]})
            s = tf.reduce_sum(tf.constant([1.0, 2.0]))
            doubled = s * 2
            self.assertEqual(sess.run(doubled, {s: 10.0}), 20.0)
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "must be fed"):
                sess.run(m)

    def test_errors_of_a_run_are_exceptions_with_dgs_code(self):
        a = tf.constant([4, 5])
        b = tf.constant([2, 0])
        with tf.Session() as sess:
            with self.assertRaises(tf.errors.InvalidArgumentError) as cm:
                sess.run(tf.truncatediv(a, b))
            self.assertIn("division by zero", str(cm.exception))
            self.assertEqual(cm.exception.code, "invalid_argument")
        with self.assertRaisesRegex(RuntimeError, "closed Session"):
            sess.run(a)

    def test_variables_in_a_local_session_live_on_a_private_server(self):
        w = tf.Variable([1.0, 2.0], name="w")
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(w), [1.0, 2.0])
            sess.run(w.assign_add([1.0, 1.0]))
            sess.run(tf.assign_sub(w, [0.5, 0.5]))
            np.testing.assert_array_equal(sess.run(w * 2), [3.0, 5.0])
            sess.run(w.initializer)
            np.testing.assert_array_equal(sess.run(w), [1.0, 2.0])
            server = sess._local[0]
        self.assertIsNone(server._proc)  # stopped with the session

    def test_minimize_trains_one_step_per_run(self):
        x = tf.placeholder(tf.float32, [4])
        y = tf.placeholder(tf.float32, [4])
        w = tf.Variable(tf.zeros([1]), name="w")
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        loss = tf.reduce_mean(tf.square(x * w - y))
        train = tf.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=step)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(30):
                sess.run(train, {x: [1, 2, 3, 4], y: [3, 6, 9, 12]})
            self.assertAlmostEqual(float(sess.run(w)[0]), 3.0, places=3)
            self.assertEqual(sess.run(step), 30)


class Remote(Fresh):
    def test_the_seed_programs_on_two_servers(self):
        with cluster({"local": 2}) as (spec, servers):
            x = tf.constant(2)
            with tf.device("/job:local/task:1"):
                y2 = x - 66
            with tf.device("/job:local/task:0"):
                y1 = x + 300
                y = y1 + y2
            with tf.Session(servers[0].target) as sess:
                self.assertEqual(sess.run(y), 238)

            v = tf.placeholder(tf.float32, 100)
            with tf.device("/job:local/task:1"):
                first = tf.slice(v, [0], [37])
                mean1 = tf.reduce_mean(first)
            with tf.device("/job:local/task:0"):
                second = tf.slice(v, [37], [-1])
                mean2 = tf.reduce_mean(second)
                mean = (tf.cast(tf.size(first), tf.float32) * mean1 +
                        tf.cast(tf.size(second), tf.float32) * mean2) / 100
            big = tf.placeholder(tf.float32, [5000])
            total = tf.reduce_sum(big)
            data = np.random.random(100).astype(np.float32)
            with tf.Session("http://" + servers[0].address) as sess:
                self.assertAlmostEqual(float(sess.run(mean, {v: data})), float(np.mean(data)),
                                       places=6)
                ones = np.ones(5000, np.float32)   # > 4096 elements: uploaded as .npy
                self.assertEqual(sess.run(total, {big: ones}), 5000.0)

    def test_soft_placement_and_the_placement_log(self):
        with cluster({"local": 2}) as (spec, servers):
            x = tf.constant(2.0)
            with tf.device("/job:local/task:0/gpu:0"):
                y = x + 300
            gpus = [h for h in [tf.Session(servers[0].target)._client.get_json("/v1/health")]
                    if h.get("gpus")]
            with tf.Session(servers[0].target) as sess:
                if not gpus:
                    with self.assertRaises(tf.errors.UnimplementedError):
                        sess.run(y)
            prog = (
                "import dg as tf, sys\n"
                "x = tf.constant(2.0)\n"
                "with tf.device('/job:local/task:0/gpu:0'):\n"
                "    y = x + 300\n"
                "c = tf.ConfigProto(allow_soft_placement=True, log_device_placement=True)\n"
                "with tf.Session(sys.argv[1], config=c) as s:\n"
                "    print(s.run(y))\n")
            env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"))
            done = subprocess.run([sys.executable, "-c", prog, servers[0].target],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                  universal_newlines=True)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(done.stdout.strip(), "302.0")
            self.assertIn("Add: (Add): /job:local/task:0", done.stderr)
            if not gpus:
                self.assertIn("soft placement", done.stderr)

    def test_a_missing_task_and_a_wrong_target_are_errors(self):
        with cluster({"local": 1}) as (spec, servers):
            with tf.device("/job:local/task:3"):
                y = tf.constant(1) + 1
            with tf.Session(servers[0].target) as sess:
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "task:3"):
                    sess.run(y)
        port = free_ports(1)[0]
        with tf.Session("grpc://127.0.0.1:%d" % port) as sess:
            with self.assertRaisesRegex(tf.errors.UnavailableError, "cannot reach"):
                sess.run(tf.constant(1) + 1)
        with self.assertRaises(tf.errors.InvalidArgumentError):
            tf.Session("grpc://nohostport")

    def test_a_token_is_needed_where_the_servers_have_one(self):
        with tmpdir() as d:
            tok = os.path.join(d, "token")
            with open(tok, "w") as f:
                f.write("s3cret\n")
            os.chmod(tok, 0o600)
            with cluster({"local": 1}, token_file=tok) as (spec, servers):
                y = tf.constant(1) + 1
                with tf.Session(servers[0].target) as sess:
                    with self.assertRaises(tf.errors.UnauthenticatedError):
                        sess.run(y)
                with tf.Session(servers[0].target, token_file=tok) as sess:
                    self.assertEqual(sess.run(y), 2)
                os.chmod(tok, 0o644)
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "read by others"):
                    tf.Session(servers[0].target, token_file=tok)


class Servers(unittest.TestCase):
    def test_a_taken_port_fails_the_start_with_dgs_message(self):
        with cluster({"local": 1}) as (spec, servers):
            with self.assertRaises(tf.errors.OpError) as cm:
                tf.train.Server(spec, job_name="local", task_index=0)
            self.assertIn("127.0.0.1", str(cm.exception))

    def test_a_local_server_and_join_after_stop(self):
        s = tf.train.Server.create_local_server()
        try:
            self.assertTrue(s.target.startswith("grpc://localhost:"))
            self.assertNotEqual(s.target, "grpc://localhost:0")
        finally:
            s.stop()
        with self.assertRaisesRegex(RuntimeError, "not started"):
            s.join()


if __name__ == "__main__":
    unittest.main()
