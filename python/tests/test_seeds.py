"""The seeds' programs (examples/python), TensorFlow 1.x's code with only the
import changed, on servers started by create_worker.py: run unchanged on
ports 2222-2225 of a private network namespace (unshare -n, as root), else
on free ports written into copies of them."""
import json
import os
import shutil
import subprocess
import sys
import unittest

import numpy as np

from util import free_ports

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 7


def run_driver():
    drv = [sys.executable, os.path.join(HERE, "seeds_driver.py"), "--seed", str(SEED)]
    probe = None
    if shutil.which("unshare") and shutil.which("ip"):
        probe = subprocess.run(["unshare", "-n", "true"], stderr=subprocess.DEVNULL)
    if probe is not None and probe.returncode == 0:
        cmd = ["unshare", "-n"] + drv + ["--netns"]
        how = "a private network namespace, ports 2222-2225 as written"
    else:
        cmd = drv + ["--ports", ",".join(map(str, free_ports(4)))]
        how = "free loopback ports (no network namespace here)"
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError("seeds_driver failed: %s" % done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1]), how


class Seeds(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.r, how = run_driver()
        print("(the seed programs ran in %s)" % how)

    def out(self, name):
        r = self.r[name]
        self.assertEqual(r["rc"], 0, r["err"])
        return r["out"]

    def data(self):
        np.random.seed(SEED)
        return np.random.random(100).astype(np.float32)

    def test_create_worker_starts_and_announces_each_task(self):
        outs = [w["out"] for w in self.r["workers"]]
        self.assertEqual(outs, ["Starting server #0\n", "Starting server #1\n"])

    def test_the_sum_prints_238_in_one_process_and_over_two_tasks(self):
        self.assertEqual(self.out("sum"), "238\n")
        self.assertEqual(self.out("sum_distributed"), "238\n")

    def test_the_means_equal_numpys(self):
        want = float(np.mean(self.data()))
        self.assertAlmostEqual(float(self.out("mean")), want, places=6)
        self.assertAlmostEqual(float(self.out("mean_distributed")), want, places=6)

    def test_the_weighted_mean_of_37_and_63_equals_numpys(self):
        lines = self.out("weighted_mean").split("\n")
        want = float(np.mean(self.data()))
        self.assertAlmostEqual(float(lines[0]), want, places=6)
        self.assertEqual(lines[1], "numpy: %s" % np.mean(self.data()))

    def test_the_remote_gpu_runs_with_soft_placement_and_says_where(self):
        self.assertEqual(self.out("remote_gpu"), "238.0\n")
        err = self.r["remote_gpu"]["err"]
        self.assertIn("Add: (Add): /job:local/task:0", err)
        self.assertIn("Sub: (Sub): /job:local/task:1", err)


if __name__ == "__main__":
    unittest.main()
