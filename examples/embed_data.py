#!/usr/bin/python3
"""Bag-of-tokens Fashion-MNIST for examples/embed.json.

Each image becomes 196 tokens, one per 2x2 patch: the patch's position and
its four pixels quantised to 3 levels (81 patterns), hashed into a table of
2^20 rows (the hashing trick; 196 * 81 = 15876 distinct tokens can occur, so
most of the table is never touched, as in a real vocabulary). A batch of 64
images touches a few thousand rows of the million: the use sparse (row-wise)
updates are for.

Writes OUT/{train,test}_tokens.npy (int32 [N, 196]) and
OUT/{train,test}_labels.npy (int32 [N]). Default OUT: /var/tmp/dg-embed.
Usage: /usr/bin/python3 examples/embed_data.py [OUT]
Needs python3-numpy and Debian's dataset-fashion-mnist.
"""
import gzip
import os
import sys

import numpy as np

SRC = "/usr/share/datasets/fashion-mnist"
ROWS = 1 << 20          # the embedding table's rows: examples/embed.json's emb


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def tokens(images):
    n = images.shape[0]
    level = np.minimum(images.astype(np.int64) * 3 // 256, 2)      # 0, 1, 2
    p = level.reshape(n, 14, 2, 14, 2).transpose(0, 1, 3, 2, 4).reshape(n, 196, 4)
    pattern = ((p[..., 0] * 3 + p[..., 1]) * 3 + p[..., 2]) * 3 + p[..., 3]
    tok = np.arange(196, dtype=np.int64) * 81 + pattern             # [n, 196]
    # a multiplicative hash spreads the tokens over the table
    return ((tok * 2654435761) % ROWS).astype(np.int32)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/dg-embed"
    os.makedirs(out, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = idx(f"{SRC}/{prefix}-images-idx3-ubyte.gz")
        y = idx(f"{SRC}/{prefix}-labels-idx1-ubyte.gz").astype(np.int32)
        np.save(f"{out}/{split}_tokens.npy", tokens(x))
        np.save(f"{out}/{split}_labels.npy", y)
    print(f"wrote {out}/{{train,test}}_{{tokens,labels}}.npy")


if __name__ == "__main__":
    main()
