"""Training from Python on real clusters: the MLP of examples/python/mlp.py to
>= 0.85 test accuracy in one fit() call (its progress on stderr),
examples/mlp.json as that program's --json output, and a graph built in
Python training to the same bits as the same model written in JSON."""
import json
import os
import subprocess
import sys
import unittest

import numpy as np

import dg as tf
from util import ASAN, SRC, cluster, run_dg, run_example, tmpdir

os.environ.setdefault("DG_SERVER_QUIET", "1")
DATA = "/usr/share/datasets/fashion-mnist/"
HAVE_DATA = os.path.exists(DATA + "train-images-idx3-ubyte.gz")
EX = os.path.join(SRC, "examples")
sys.path.insert(0, os.path.join(EX, "python"))


def var_bytes(address, name):
    from dg._http import Client
    c = Client(address)
    try:
        return c.request("GET", "/v1/vars/" + name)[2]
    finally:
        c.close()


@unittest.skipUnless(HAVE_DATA, "no Fashion-MNIST at %s (apt-get install dataset-fashion-mnist)"
                     % DATA)
class Train(unittest.TestCase):
    def test_mlp_json_is_the_python_programs_output(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"))
        done = subprocess.run([sys.executable, os.path.join(EX, "python", "mlp.py"), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              universal_newlines=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(os.path.join(EX, "mlp.json")) as f:
            self.assertEqual(done.stdout, f.read(),
                             "regenerate it: python3 examples/python/mlp.py --json > "
                             "examples/mlp.json")

    @unittest.skipIf(ASAN, "the 3-epoch MLP runs in the release build (see the short fit)")
    def test_the_python_mlp_trains_to_085_in_one_fit_with_progress(self):
        done = run_example("mlp.py", {"ps": 1, "worker": 2})
        self.assertEqual(done.returncode, 0, done.stderr)
        acc = float(done.stdout.split("test_accuracy:")[1])
        self.assertGreaterEqual(acc, 0.85, done.stderr)
        self.assertIn("dg: epoch 3/3 step 1404/1404", done.stderr)
        self.assertIn("dg: eval after epoch 1: test_accuracy", done.stderr)
        self.assertIn("dg: trained 3 epochs (1404 steps x 2 replicas", done.stderr)

    def test_a_short_fit_returns_its_evals_and_status(self):
        g = tf.Graph()
        with g.as_default(), cluster({"ps": 1, "worker": 1}) as (spec, servers):
            import mlp
            train_op, acc, test_acc = mlp.build()
            r = tf.train.fit(train_op, target=servers[1].target, steps=150, progress=False,
                             metrics={"accuracy": acc}, eval={"test_accuracy": test_acc})
            self.assertGreaterEqual(r.evals["test_accuracy"], 0.6)
            self.assertEqual(r.status["state"], "done")
            self.assertEqual(r.status["training"]["replica_steps"], [150])
            self.assertIn("accuracy", r.status["training"]["metrics"])
            with self.assertRaisesRegex(ValueError, "epochs or steps"):
                tf.train.fit(train_op, target=servers[1].target)
            bad = tf.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(tf.Variable(
                tf.zeros([2]))))
            with self.assertRaises(tf.errors.InvalidArgumentError):
                tf.train.fit(bad, target=servers[1].target, epochs=1, progress=False)

    def test_python_and_json_graphs_of_one_model_train_to_the_same_bits(self):
        steps = 60 if ASAN else 200
        with open(os.path.join(EX, "softmax_regression.json")) as f:
            doc = json.load(f)
        t = doc["training"]
        del t["epochs"]
        t.update(steps=steps, replicas=1, reinit=True, eval={"fetch": ["test_accuracy"]})
        with cluster({"ps": 1, "worker": 1}) as (spec, servers), tmpdir() as d:
            path = os.path.join(d, "g.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            done = run_dg("submit", path, "--master", servers[1].address)
            self.assertEqual(done.returncode, 0, done.stderr)
            json_acc = float(done.stdout.split("test_accuracy:")[1])
            json_w = var_bytes(servers[0].address, "w")
            json_b = var_bytes(servers[0].address, "b")

            g = tf.Graph()
            with g.as_default():
                x = tf.data.idx(DATA + "train-images-idx3-ubyte.gz", scale=True, flatten=True)
                y = tf.data.idx(DATA + "train-labels-idx1-ubyte.gz")
                images, labels = tf.data.shard_batch(x, y, batch=64, seed=42)
                w = tf.Variable(tf.zeros([784, 10]), name="w")
                b = tf.Variable(tf.zeros([10]), name="b")
                logits = tf.matmul(images, w) + b
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=labels, logits=logits))
                tx = tf.data.idx(DATA + "t10k-images-idx3-ubyte.gz", scale=True, flatten=True)
                ty = tf.data.idx(DATA + "t10k-labels-idx1-ubyte.gz")
                pred = tf.argmax(tf.matmul(tx, w) + b, 1, output_type=tf.int32)
                test_acc = tf.reduce_mean(tf.cast(tf.equal(pred, ty), tf.float32))
                train = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
                r = tf.train.fit(train, target=servers[1].target, steps=steps, batch=64,
                                 replicas=1, reinit=True, progress=False,
                                 eval={"test_accuracy": test_acc})
            self.assertEqual(var_bytes(servers[0].address, "w"), json_w)
            self.assertEqual(var_bytes(servers[0].address, "b"), json_b)
            self.assertEqual("%.4f" % r.evals["test_accuracy"], "%.4f" % json_acc)
            self.assertTrue(np.any(np.frombuffer(json_w, np.float32) != 0))


if __name__ == "__main__":
    unittest.main()
