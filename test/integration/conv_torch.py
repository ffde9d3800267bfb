#!/usr/bin/env python3
"""Conv2D, MaxPool2D and AvgPool2D and their gradients in dg against PyTorch's
CPU conv/pool forward and autograd on fixed random inputs (float64, and the
issue's LeNet shapes in float32). TensorFlow's SAME padding (even, the extra
one after) is built for PyTorch with an explicit pad; a SAME average divides
by the window's positions inside the image, as TensorFlow does.
Usage: conv_torch.py PATH/TO/dg. Prints "ok - ..." lines and "N passed, M failed"."""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("ok - skipped: PyTorch or numpy is absent (%s; apt-get install python3-torch)" % e)
    print("1 passed, 0 failed")
    sys.exit(0)

DG = sys.argv[1]
torch.set_num_threads(1)
passed = failed = 0


def pads(n, k, s, d, same):
    """TensorFlow's padding (before, after) of one dim."""
    if not same:
        return 0, 0
    out = -(-n // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
    return total // 2, total - total // 2


def torch_conv(x, f, s, d, same):
    """x NHWC, f HWIO (numpy) -> y, dx, df (numpy, NHWC/HWIO) for loss = sum(y * r)."""
    xt = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    ft = torch.tensor(f.transpose(3, 2, 0, 1), requires_grad=True)
    pt, pb = pads(x.shape[1], f.shape[0], s[0], d[0], same)
    pl, pr = pads(x.shape[2], f.shape[1], s[1], d[1], same)
    y = F.conv2d(F.pad(xt, (pl, pr, pt, pb)), ft, stride=s, dilation=d)
    r = torch.tensor(rng.uniform(-1, 1, y.shape).astype(x.dtype))
    (y * r).sum().backward()
    return (y.detach().numpy().transpose(0, 2, 3, 1), r.numpy().transpose(0, 2, 3, 1),
            xt.grad.numpy().transpose(0, 2, 3, 1), ft.grad.numpy().transpose(2, 3, 1, 0))


def torch_pool(x, k, s, same, kind):
    xt = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    pt, pb = pads(x.shape[1], k[0], s[0], 1, same)
    pl, pr = pads(x.shape[2], k[1], s[1], 1, same)
    if kind == "MaxPool2D":
        y = F.max_pool2d(F.pad(xt, (pl, pr, pt, pb), value=-float("inf")), k, s)
    else:
        ones = torch.ones_like(xt[:1, :1])
        cnt = F.avg_pool2d(F.pad(ones, (pl, pr, pt, pb)), k, s) * (k[0] * k[1])
        y = F.avg_pool2d(F.pad(xt, (pl, pr, pt, pb)), k, s) * (k[0] * k[1]) / cnt
    r = torch.tensor(rng.uniform(-1, 1, y.shape).astype(x.dtype))
    (y * r).sum().backward()
    return (y.detach().numpy().transpose(0, 2, 3, 1), r.numpy().transpose(0, 2, 3, 1),
            xt.grad.numpy().transpose(0, 2, 3, 1))


def dg_run(tmp, nodes, feeds, fetch):
    """Run the graph of nodes with placeholders feeds {name: array}; returns {fetch: array}."""
    ph = [{"name": n, "op": "Placeholder",
           "attrs": {"dtype": str(a.dtype), "shape": list(a.shape)}} for n, a in feeds.items()]
    g = os.path.join(tmp, "g.json")
    json.dump({"nodes": ph + nodes}, open(g, "w"))
    args = [DG, "eval", g, "--out", os.path.join(tmp, "out")]
    for n, a in feeds.items():
        np.save(os.path.join(tmp, n + ".npy"), a)
        args += ["--feed", "%s=%s" % (n, os.path.join(tmp, n + ".npy"))]
    for n in fetch:
        args += ["--fetch", n]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("dg eval failed (%d): %s" % (p.returncode, p.stderr.strip()))
    return {n: np.load(os.path.join(tmp, "out", n + ".npy")) for n in fetch}


def check(desc, got, want, tol):
    global passed, failed
    bad = []
    for name in want:
        g, w = got[name], want[name]
        if g.shape != w.shape:
            bad.append("%s shape %s, torch %s" % (name, g.shape, w.shape))
            continue
        err = float(np.max(np.abs(g - w))) if g.size else 0.0
        scale = 1 + float(np.max(np.abs(w))) if w.size else 1
        if not err <= tol * scale:
            bad.append("%s max error %.3g (tolerance %.3g)" % (name, err, tol * scale))
    if bad:
        failed += 1
        print("FAIL - %s: %s" % (desc, "; ".join(bad)))
    else:
        passed += 1
        print("ok - %s: equal to PyTorch (%s)" % (desc, ", ".join(sorted(want))))


rng = np.random.default_rng(7)
CONVS = [  # x NHWC, filter HWIO, strides, padding, dilations, dtype
    ((2, 7, 7, 3), (3, 3, 3, 4), (1, 1), "SAME", (1, 1), "float64"),
    ((2, 8, 7, 3), (3, 2, 3, 5), (2, 2), "SAME", (1, 1), "float64"),
    ((2, 9, 9, 2), (3, 3, 2, 4), (2, 1), "VALID", (1, 1), "float64"),
    ((1, 8, 8, 3), (3, 3, 3, 2), (1, 1), "SAME", (2, 2), "float64"),
    ((3, 5, 5, 4), (1, 1, 4, 6), (1, 1), "VALID", (1, 1), "float64"),
    ((64, 28, 28, 1), (5, 5, 1, 32), (1, 1), "SAME", (1, 1), "float32"),
    ((64, 14, 14, 32), (5, 5, 32, 64), (1, 1), "SAME", (1, 1), "float32"),
]
POOLS = [  # x, ksize, strides, padding
    ((2, 8, 8, 3), (2, 2), (2, 2), "VALID"),
    ((2, 7, 7, 3), (3, 3), (2, 2), "SAME"),
    ((2, 6, 5, 2), (3, 2), (1, 2), "SAME"),
]
with tempfile.TemporaryDirectory() as tmp:
    for xs, fs, s, pad, d, dt in CONVS:
        desc = "Conv2D %s x %s strides %s %s dilations %s %s" % (list(xs), list(fs), list(s),
                                                                 pad, list(d), dt)
        try:
            x = rng.uniform(-1, 1, xs).astype(dt)
            f = rng.uniform(-1, 1, fs).astype(dt)
            y, r, dx, df = torch_conv(x, f, s, d, pad == "SAME")
            attrs = {"padding": pad, "strides": list(s), "dilations": list(d)}
            nodes = [{"name": "y", "op": "Conv2D", "inputs": ["x", "f"], "attrs": attrs},
                     {"name": "dx", "op": "Conv2DBackpropInput", "inputs": ["x", "f", "r"],
                      "attrs": attrs},
                     {"name": "df", "op": "Conv2DBackpropFilter", "inputs": ["x", "f", "r"],
                      "attrs": attrs}]
            got = dg_run(tmp, nodes, {"x": x, "f": f, "r": r}, ["y", "dx", "df"])
            check(desc, got, {"y": y, "dx": dx, "df": df}, 1e-10 if dt == "float64" else 2e-5)
        except Exception as e:  # a dg failure is a failed check, not a crash
            failed += 1
            print("FAIL - %s: %s" % (desc, e))
    for kind in ("MaxPool2D", "AvgPool2D"):
        for xs, k, s, pad in POOLS:
            desc = "%s %s ksize %s strides %s %s" % (kind, list(xs), list(k), list(s), pad)
            try:
                # distinct values: no window has a tied maximum
                x = rng.permutation(np.prod(xs)).reshape(xs).astype("float64") / 7.0
                y, r, dx = torch_pool(x, k, s, pad == "SAME", kind)
                attrs = {"ksize": list(k), "strides": list(s), "padding": pad}
                nodes = [{"name": "y", "op": kind, "inputs": ["x"], "attrs": attrs},
                         {"name": "dx", "op": kind + "Grad",
                          "inputs": ["x", "y", "r"] if kind == "MaxPool2D" else ["x", "r"],
                          "attrs": attrs}]
                got = dg_run(tmp, nodes, {"x": x, "r": r}, ["y", "dx"])
                check(desc, got, {"y": y, "dx": dx}, 1e-12)
            except Exception as e:
                failed += 1
                print("FAIL - %s: %s" % (desc, e))
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
