#!/usr/bin/python3
"""PyTorch's side of bench_kernels' convolution section: the same Conv2D and MaxPool
cases on PyTorch's CPU kernels (Debian's python3-torch: oneDNN convolutions), NCHW as
PyTorch users hold images, float32, with the thread count given for OpenMP, OpenBLAS
and torch. Forward: the op under no_grad. Backward: autograd.grad of both the input and
the filter (the input alone for the pooling) for a fixed output gradient.
Prints one line per case and pass, "CASE PASS MEDIAN_SECONDS", then "done".
Usage: conv_torch.py --threads N --reps R"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = str(a.threads)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("skipped: python3-torch is not installed (apt-get install python3-torch)")
        return 0
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)

    def median(fn):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[len(ts) // 2]

    # (label, x NCHW, filter OIHW) with SAME padding 2 for 5x5
    for label, xs, ws in (("conv [64,28,28,1]x[5,5,1,32]", (64, 1, 28, 28), (32, 1, 5, 5)),
                          ("conv [64,14,14,32]x[5,5,32,64]", (64, 32, 14, 14), (64, 32, 5, 5))):
        x = torch.rand(xs) * 2 - 1
        w = torch.rand(ws) * 2 - 1
        with torch.no_grad():
            fwd = median(lambda: F.conv2d(x, w, padding=2))
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = F.conv2d(xr, wr, padding=2)
        r = torch.rand(y.shape)
        bwd = median(lambda: torch.autograd.grad(y, (xr, wr), r, retain_graph=True))
        print("%s fwd %.9f" % (label, fwd))
        print("%s bwd %.9f" % (label, bwd))
    x = torch.rand(64, 32, 28, 28)
    with torch.no_grad():
        fwd = median(lambda: F.max_pool2d(x, 2, 2))
    xr = x.clone().requires_grad_()
    y = F.max_pool2d(xr, 2, 2)
    r = torch.rand(y.shape)
    bwd = median(lambda: torch.autograd.grad(y, xr, r, retain_graph=True))
    print("maxpool [64,28,28,32] 2x2 fwd %.9f" % fwd)
    print("maxpool [64,28,28,32] 2x2 bwd %.9f" % bwd)
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
