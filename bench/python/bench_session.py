#!/usr/bin/python3
"""bench/python: the Python front end's overhead, in one run.

1. sess.run of the seed sum (examples/seed_sum.json's graph, built in Python)
   through a running two-task cluster, against `dg submit` of the same JSON
   to the same master: median of N runs each, interleaved (one of each per
   round), so drift hits both alike. Target: sess.run <= 1.2x dg submit.
2. Building and serialising a graph of 10,000 ops (and their constants) in
   Python: median of 5. Target: < 1 s.

Both sides talk to the same two dg servers (started here, unpinned: the
client is what differs). Prints the medians, min/max, the ratio and the load.

    PYTHONPATH=python /usr/bin/python3 bench/python/bench_session.py [--runs 50]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
os.environ.setdefault("DG_SERVER_QUIET", "1")

import dg as tf                      # noqa: E402
from util import cluster             # noqa: E402


def stats(xs):
    return "median %.2f ms (min %.2f, max %.2f)" % (1e3 * statistics.median(xs), 1e3 * min(xs),
                                                    1e3 * max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    a = ap.parse_args()
    print("bench_session: load %s, %d CPUs" % (" ".join(open("/proc/loadavg").read().split()[:3]),
                                               os.cpu_count()))
    with cluster({"worker": 2}) as (spec, servers), tempfile.TemporaryDirectory() as tmp:
        g = tf.Graph()
        with g.as_default():
            with tf.device("/job:worker/task:0"):
                x = tf.constant(2, name="x")
                y1 = tf.add(x, tf.constant(300, name="c300"), name="y1")
            with tf.device("/job:worker/task:1"):
                y2 = tf.subtract(x, tf.constant(66, name="c66"), name="y2")
            with tf.device("/job:worker/task:0"):
                y = tf.add(y1, y2, name="y")
        path = os.path.join(tmp, "seed_sum.json")
        with open(path, "w") as f:
            f.write(g.as_json(fetch=[y]))
        dg_bin = tf._binary.dg_binary()
        sess = tf.Session(servers[0].target, graph=g)
        assert sess.run(y) == 238
        py, cli = [], []
        for _ in range(a.runs):
            t = time.perf_counter()
            v = sess.run(y)
            py.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = subprocess.run([dg_bin, "submit", path, "--master", servers[0].address],
                                 stdout=subprocess.PIPE, check=True).stdout
            cli.append(time.perf_counter() - t)
            assert v == 238 and out.strip() == b"238"
        sess.close()
        print("seed sum, %d runs each through 2 tasks:" % a.runs)
        print("  sess.run     %s" % stats(py))
        print("  dg submit    %s" % stats(cli))
        print("  ratio sess.run / dg submit: %.2fx (target <= 1.2x)"
              % (statistics.median(py) / statistics.median(cli)))

    times = []
    for _ in range(5):
        g = tf.Graph()
        t = time.perf_counter()
        with g.as_default():
            v = tf.placeholder(tf.float32, [10])
            for i in range(10000):
                v = v + 1.0 if i % 2 else v * 0.5
            text = g.as_json()
        times.append(time.perf_counter() - t)
    n = len(json.loads(text)["nodes"])
    print("a graph of 10000 ops (%d nodes with their constants), built and serialised "
          "(%d bytes): %s (target < 1 s)" % (n, len(text), stats(times)))


if __name__ == "__main__":
    main()
