"""Graph building without a server: names, scopes, devices, dtypes, static
shapes, operators, the JSON document, ClusterSpec and replica_device_setter."""
import json
import os
import unittest

import numpy as np

import dg as tf
import util
from util import SRC


class Fresh(util.Fresh):
    def nodes(self):
        return {n["name"]: n for n in self.g.as_graph_def()["nodes"]}


class Naming(Fresh):
    def test_names_are_unique_as_tensorflow_makes_them(self):
        a = tf.constant(1)
        b = tf.constant(2)
        c = tf.add(a, b, name="sum")
        d = tf.add(a, b, name="sum")
        self.assertEqual([a.name, b.name, c.name, d.name],
                         ["Const:0", "Const_1:0", "sum:0", "sum_1:0"])

    def test_name_scopes_nest_and_reenter_with_a_suffix(self):
        with tf.name_scope("layer") as scope:
            self.assertEqual(scope, "layer/")
            with tf.name_scope("inner"):
                x = tf.constant(1.0, name="x")
        with tf.name_scope("layer"):
            y = tf.constant(1.0, name="x")
        self.assertEqual(x.op.name, "layer/inner/x")
        self.assertEqual(y.op.name, "layer_1/x")

    def test_a_bad_name_is_refused(self):
        with self.assertRaisesRegex(ValueError, "not a valid node name"):
            tf.constant(1, name="a:b")

    def test_get_by_name(self):
        x = tf.constant([1, 2], name="x")
        parts = tf.split(x, 2, name="parts")
        self.assertIs(self.g.get_tensor_by_name("x:0"), x)
        self.assertIs(self.g.get_tensor_by_name("parts:1"), parts[1])
        self.assertEqual(parts[1]._ref, "parts:1")
        with self.assertRaises(KeyError):
            self.g.get_operation_by_name("nope")


class Devices(Fresh):
    def test_nested_device_scopes_merge_inner_fields_first(self):
        with tf.device("/job:ps"):
            with tf.device("/task:1"):
                a = tf.constant(1)
            with tf.device("/job:worker/task:0/gpu:1"):
                b = tf.constant(1)
            c = tf.constant(1)
        with tf.device("/job:local/task:0"):
            with tf.device(None):
                d = tf.constant(1)
        self.assertEqual(a.device, "/job:ps/task:1")
        self.assertEqual(b.device, "/job:worker/task:0/device:GPU:1")
        self.assertEqual(c.device, "/job:ps")
        self.assertEqual(d.device, "")

    def test_device_functions_see_the_operation(self):
        with tf.device(lambda op: "/job:a" if op.type == "Const" else "/job:b"):
            x = tf.constant(1.0)
            y = x * x
        self.assertEqual((x.device, y.device), ("/job:a", "/job:b"))

    def test_bad_device_strings_are_refused(self):
        with self.assertRaisesRegex(ValueError, "cannot parse 'tsk:1'"):
            with tf.device("/job:a/tsk:1"):
                pass

    def test_replica_device_setter_round_robins_variables_over_ps(self):
        cluster = tf.train.ClusterSpec({"ps": ["h:1", "h:2"], "worker": ["h:3", "h:4"]})
        with tf.device(tf.train.replica_device_setter(cluster=cluster)):
            v = [tf.Variable(tf.zeros([2])) for _ in range(3)]
            y = v[0] + v[1]
            with tf.device("/task:1"):
                z = y * 2.0
        self.assertEqual([x.device for x in v], ["/job:ps/task:0", "/job:ps/task:1",
                                                 "/job:ps/task:0"])
        self.assertEqual(y.device, "/job:worker")
        self.assertEqual(z.device, "/job:worker/task:1")
        self.assertIsNone(tf.train.replica_device_setter(ps_tasks=0))


class Building(Fresh):
    def test_python_values_take_the_other_operands_dtype(self):
        x = tf.constant(2)
        self.assertEqual((x + 300).dtype, tf.int32)
        f = tf.placeholder(tf.float64, [3])
        self.assertEqual((1 - f).dtype, tf.float64)
        self.assertEqual((f < 0.5).dtype, tf.bool)
        with self.assertRaisesRegex(TypeError, "dtypes float64 and int32 differ"):
            f + x

    def test_constants_keep_numpys_dtype_and_pythons_defaults(self):
        self.assertEqual(tf.constant(1.5).dtype, tf.float32)
        self.assertEqual(tf.constant(np.arange(3.0)).dtype, tf.float64)
        self.assertEqual(tf.constant(2 ** 40).dtype, tf.int64)
        self.assertEqual(tf.constant([True, False]).dtype, tf.bool)
        c = tf.constant(0.0, shape=[2, 3])
        self.assertEqual(c.shape.as_list(), [2, 3])
        with self.assertRaises(TypeError):
            tf.constant(2.5, dtype=tf.int32)
        tf.constant([float("nan"), float("-inf")], name="n")
        self.assertEqual(json.loads(self.g.as_json())["nodes"][-1]["attrs"]["value"],
                         {"dtype": "float32", "shape": [2], "value": ["nan", "-inf"]})

    def test_static_shapes_follow_the_inputs(self):
        x = tf.placeholder(tf.float32, [None, 784])
        w = tf.Variable(tf.random_normal([784, 10]))
        logits = tf.matmul(x, w) + tf.zeros([10])
        self.assertEqual(logits.shape.as_list(), [None, 10])
        self.assertEqual(tf.reduce_mean(logits, axis=1).shape.as_list(), [None])
        self.assertEqual(tf.reshape(tf.zeros([4, 6]), [-1, 3]).shape.as_list(), [8, 3])
        self.assertEqual(tf.slice(tf.zeros([100]), [37], [-1]).shape.as_list(), [63])
        self.assertEqual(tf.transpose(tf.zeros([2, 3, 4])).shape.as_list(), [4, 3, 2])
        img = tf.placeholder(tf.float32, [8, 28, 28, 1])
        conv = tf.nn.conv2d(img, tf.zeros([5, 5, 1, 32]), strides=[1, 2, 2, 1], padding="SAME")
        self.assertEqual(conv.shape.as_list(), [8, 14, 14, 32])
        pool = tf.nn.max_pool(conv, [1, 2, 2, 1], [1, 2, 2, 1], "VALID")
        self.assertEqual(pool.shape.as_list(), [8, 7, 7, 32])
        with self.assertRaisesRegex(ValueError, "cannot be broadcast"):
            tf.zeros([2, 3]) + tf.zeros([4])
        with self.assertRaisesRegex(ValueError, "Cannot feed|not compatible"):
            x.set_shape([None, 10])

    def test_tensors_are_not_python_bools_and_compare_by_identity(self):
        x = tf.constant(1)
        with self.assertRaises(TypeError):
            bool(x)
        self.assertTrue(x == x)
        self.assertFalse(x == tf.constant(1))
        self.assertEqual(len({x: 1}), 1)

    def test_indexing_is_a_strided_slice(self):
        x = tf.zeros([4, 5])
        y = x[1:3, ::2]
        n = self.nodes()[y.op.name]
        self.assertEqual(n["op"], "StridedSlice")
        self.assertEqual(n["attrs"]["begin"], [1, 0])
        self.assertEqual(n["attrs"]["end"], [3, 0])
        self.assertEqual(n["attrs"]["strides"], [1, 2])
        self.assertEqual(n["attrs"]["end_mask"], 2)

    def test_variables_map_initialisers_to_the_ps_ones(self):
        a = tf.Variable(tf.zeros([3]), name="a")
        b = tf.Variable(tf.random_normal([3, 4], stddev=0.1, seed=7), name="b")
        c = tf.Variable(tf.glorot_uniform_initializer(seed=2)([4, 5]), name="c")
        d = tf.Variable(np.arange(6.0).reshape(2, 3), name="d")
        e = tf.Variable(tf.ones([2], dtype=tf.int64), trainable=False, name="e")
        n = self.nodes()
        self.assertEqual(n["a"]["attrs"], {"shape": [3], "dtype": "float32", "init": "zeros"})
        self.assertEqual(n["b"]["attrs"], {"shape": [3, 4], "dtype": "float32", "init": "normal",
                                           "scale": 0.1, "seed": 7})
        self.assertEqual(n["c"]["attrs"]["init"], "glorot")
        self.assertEqual(n["d"]["attrs"]["dtype"], "float64")
        self.assertEqual(n["e"]["attrs"]["init"], "ones")
        self.assertEqual(tf.trainable_variables(), [a, b, c, d])
        self.assertEqual(tf.global_variables(), [a, b, c, d, e])
        init = tf.global_variables_initializer()
        self.assertEqual(sorted(m.type for m in init.members), ["Assign"] * 5)
        with self.assertRaisesRegex(ValueError, "fully known"):
            tf.Variable(tf.placeholder(tf.float32, [None]))

    def test_minimize_builds_one_minimize_node_with_the_optimizer(self):
        w = tf.Variable(tf.zeros([2]), name="w")
        frozen = tf.Variable(tf.ones([2]), trainable=False, name="frozen")
        loss = tf.reduce_sum(w * frozen)
        op = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        n = self.nodes()[op.name]
        self.assertEqual(n["op"], "Minimize")
        self.assertEqual(n["attrs"], {"lr": 0.1, "momentum": 0.9, "nesterov": False,
                                      "rule": "momentum", "variables": ["w"]})
        with self.assertRaises(NotImplementedError):
            tf.train.RMSPropOptimizer(0.1, centered=True)

    def test_the_seed_program_builds_the_document_of_the_json_example(self):
        with tf.device("/job:worker/task:0"):
            x = tf.constant(2, dtype=tf.int32, name="x")
            y1 = tf.add(x, tf.constant(300, dtype=tf.int32, name="c300"), name="y1")
        with tf.device("/job:worker/task:1"):
            y2 = tf.subtract(x, tf.constant(66, dtype=tf.int32, name="c66"), name="y2")
        with tf.device("/job:worker/task:0"):
            y = tf.add(y1, y2, name="y")
        doc = json.loads(self.g.as_json(fetch=[y]))
        with open(os.path.join(SRC, "examples", "seed_sum.json")) as f:
            want = json.load(f)
        del want["doc"]
        self.assertEqual(doc, want)


class Clusters(unittest.TestCase):
    def test_the_package_version_is_dgs(self):
        from util import run_dg
        out = run_dg("--version").stdout.split("\n")[0]
        self.assertEqual(out, "dg " + tf.__version__)

    def test_cluster_spec_as_tensorflow_has_it(self):
        c = tf.train.ClusterSpec({"local": ["localhost:2222", "localhost:2223"]})
        self.assertEqual(c.as_dict(), {"local": ["localhost:2222", "localhost:2223"]})
        self.assertEqual(c.job_tasks("local"), ["localhost:2222", "localhost:2223"])
        self.assertEqual(c.num_tasks("local"), 2)
        self.assertEqual(c.task_address("local", 1), "localhost:2223")
        self.assertEqual(c.jobs, ["local"])
        sparse = tf.train.ClusterSpec({"worker": {1: "h:1", 3: "h:3"}})
        self.assertEqual(sparse.job_tasks("worker"), [None, "h:1", None, "h:3"])
        self.assertEqual(json.loads(sparse.to_json()), {"worker": {"1": "h:1", "3": "h:3"}})
        with self.assertRaisesRegex(ValueError, "no such job"):
            c.num_tasks("ps")
        self.assertEqual(tf.train.ClusterSpec(c), c)

    def test_errors_map_dg_codes_to_tensorflows_classes(self):
        e = tf.errors.from_dg("closed", "queue closed", "hint")
        self.assertIsInstance(e, tf.errors.OutOfRangeError)
        self.assertEqual((e.code, e.error_code, e.hint), ("closed", 11, "hint"))
        e = tf.errors.from_exit(5, "dg: shapes [2] and [3]\ndg: hint: align them\n")
        self.assertIsInstance(e, tf.errors.InvalidArgumentError)
        self.assertEqual(e.code, "shape_mismatch")
        self.assertEqual(str(e), "shapes [2] and [3] (hint: align them)")


if __name__ == "__main__":
    unittest.main()
