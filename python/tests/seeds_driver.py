"""Runs the seed programs of examples/python as a user would: create_worker.py 0
and 1 in the background, then each program, and prints one JSON object of
their outputs. Inside a private network namespace (test_seeds.py starts it
with unshare -n) the programs run unchanged on their own ports 2222-2225;
with --ports P0,P1,P2,P3 the programs' text is copied with those ports instead.
numpy's generator is seeded (--seed) so the test knows the data."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
EX = os.path.join(SRC, "examples", "python")
PROGRAMS = ["sum", "sum_distributed", "mean", "mean_distributed", "weighted_mean",
            "remote_gpu"]
RUN = ("import numpy as np, runpy, sys; np.random.seed(int(sys.argv[2])); "
       "sys.argv = sys.argv[1:2] + sys.argv[3:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def wait_port(port, proc):
    for _ in range(1000):
        if proc.poll() is not None:
            raise SystemExit("create_worker.py exited with %d" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return
        except OSError:
            time.sleep(0.01)
    raise SystemExit("port %d never answered" % port)


def main():
    args = sys.argv[1:]
    seed = args[args.index("--seed") + 1] if "--seed" in args else "7"
    ports = None
    if "--ports" in args:
        ports = [int(p) for p in args[args.index("--ports") + 1].split(",")]
    if "--netns" in args:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"), DG_SERVER_QUIET="1")
    with tempfile.TemporaryDirectory(prefix="dg-seeds-") as tmp:
        def prog(name):
            path = os.path.join(EX, name + ".py")
            if ports is None:
                return path
            with open(path) as f:
                text = f.read()
            for old, new in zip((2222, 2223, 2224, 2225), ports):
                text = text.replace("localhost:%d" % old, "localhost:%d" % new)
            out = os.path.join(tmp, name + ".py")
            with open(out, "w") as f:
                f.write(text)
            return out

        workers = [subprocess.Popen([sys.executable, prog("create_worker"), str(i)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    universal_newlines=True) for i in (0, 1)]
        results = {}
        try:
            for i, w in enumerate(workers):
                wait_port(ports[i] if ports else 2222 + i, w)
            for name in PROGRAMS:
                done = subprocess.run([sys.executable, "-c", RUN, prog(name), seed], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      universal_newlines=True, timeout=120)
                results[name] = {"rc": done.returncode, "out": done.stdout, "err": done.stderr}
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                try:
                    out, _ = w.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    w.kill()
                    out, _ = w.communicate()
                results.setdefault("workers", []).append({"rc": w.returncode, "out": out})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
