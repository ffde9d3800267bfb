"""Helper of test_numpy.sh: builds the weighted-mean graph for every split point
and random inputs (gen), then compares dg's results with numpy (check).

    weighted_mean.py gen EXAMPLE.json DIR    writes DIR/g_K.json and DIR/x_K.npy, K = 1..99
    weighted_mean.py check DIR               reads DIR/out_K.txt and DIR/npy_K/mean.npy
Prints one "ok - ..." or "FAIL - ..." line per check and a last line "N M"
(passed, failed) for the shell script to add to its counts.
"""
import json
import os
import sys

import numpy as np

SPLITS = range(1, 100)


def gen(example, outdir):
    with open(example) as f:
        graph = json.load(f)
    for k in SPLITS:
        g = json.loads(json.dumps(graph))
        for node in g["nodes"]:
            if node["name"] == "part1":
                node["attrs"] = {"begin": [0], "size": [k]}
            elif node["name"] == "part2":
                node["attrs"] = {"begin": [k], "size": [-1]}
        with open(os.path.join(outdir, "g_%d.json" % k), "w") as f:
            json.dump(g, f)
        rng = np.random.RandomState(k)
        np.save(os.path.join(outdir, "x_%d.npy" % k), rng.random_sample(100).astype(np.float32))


def check(outdir):
    passed = failed = 0

    def report(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
            print("ok - " + what)
        else:
            failed += 1
            print("FAIL - " + what)

    for k in SPLITS:
        x = np.load(os.path.join(outdir, "x_%d.npy" % k))
        want = np.mean(x.astype(np.float64))
        try:
            with open(os.path.join(outdir, "out_%d.txt" % k)) as f:
                got = float(f.read().strip())
        except (OSError, ValueError) as e:
            report(False, "split %d: no number printed (%s)" % (k, e))
            got = None
        if got is not None:
            rel = abs(got - want) / abs(want)
            report(rel <= 1e-6,
                   "split %d: dg %.9g vs np.mean %.9g (rel %.2g)" % (k, got, want, rel))
        path = os.path.join(outdir, "npy_%d" % k, "mean.npy")
        try:
            m = np.load(path)
            ok = (m.dtype == np.float32 and m.shape == () and got is not None
                  and m == np.float32(got))
            report(ok, "split %d: np.load of --out file gives %r %s %s" % (k, m.dtype, m.shape, m))
        except (OSError, ValueError) as e:
            report(False, "split %d: np.load(%s) failed: %s" % (k, path, e))
    print("%d %d" % (passed, failed))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "gen":
        gen(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        sys.exit(__doc__)
