"""Helpers of the dg package's tests: free loopback ports, clusters of real
dg servers that stop whatever happens, and the dg binary under test."""
import contextlib
import os
import socket
import subprocess
import tempfile
import unittest

import dg

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# meson sets DG_BIN to the build's dg (release or sanitizer build).
ASAN = "asan" in os.environ.get("DG_BIN", "")


def free_ports(n):
    """n loopback ports free now (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextlib.contextmanager
def cluster(jobs, **server_kw):
    """Real servers of {"job": n_tasks}: yields (ClusterSpec, [Server]); stops
    them at the end, also on failure. Retries once when a port was taken."""
    for attempt in range(3):
        total = sum(jobs.values())
        ports = iter(free_ports(total))
        spec = dg.train.ClusterSpec({j: ["127.0.0.1:%d" % next(ports) for _ in range(n)]
                                     for j, n in jobs.items()})
        servers = []
        try:
            for j, n in jobs.items():
                for i in range(n):
                    servers.append(dg.train.Server(spec, job_name=j, task_index=i, **server_kw))
        except dg.errors.OpError:
            for s in servers:
                s.stop()
            if attempt == 2:
                raise
            continue
        try:
            yield spec, servers
        finally:
            for s in servers:
                s.stop()
        return


def run_dg(*args, **kw):
    return subprocess.run([dg._binary.dg_binary()] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, **kw)


def tmpdir():
    return tempfile.TemporaryDirectory(prefix="dg-pytest-")


class Fresh(unittest.TestCase):
    """A test case whose every test builds in a graph of its own (self.g, the
    default graph while the test runs)."""

    def setUp(self):
        self.g = dg.Graph()
        self.cm = self.g.as_default()
        self.cm.__enter__()

    def tearDown(self):
        self.cm.__exit__(None, None, None)


def run_example(script, jobs, timeout=600):
    """examples/python/SCRIPT run against a cluster of real servers of
    {"job": n_tasks} (DG_CLUSTER names its spec): the CompletedProcess."""
    import sys
    with cluster(jobs) as (spec, servers), tmpdir() as d:
        path = os.path.join(d, "cluster.json")
        with open(path, "w") as f:
            f.write(spec.to_json())
        env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"), DG_CLUSTER=path)
        return subprocess.run([sys.executable, os.path.join(SRC, "examples", "python", script)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              universal_newlines=True, timeout=timeout)
