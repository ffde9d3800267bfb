#!/usr/bin/python3
"""PyTorch baseline of bench/train, one process: the MLP of examples/mlp.json (784-256-10,
ReLU, softmax cross-entropy) trained on Fashion-MNIST with SGD lr 0.1, batch 64, 3 epochs;
or another recipe (--model cnn --opt adam --lr 0.002 --lr-decay 0.5: examples/cnn.json's).

The data is read with gzip + numpy and held as torch tensors; each epoch visits a fresh
permutation in full batches of 64 (937 steps of 59968 examples per epoch); with
--dg-order and --dg-init, exactly the order and initial weights of a 1-replica dg job
with those seeds (common.dg_shard_perm, common.dg_glorot). Only the
training steps are timed, in wall-clock and CPU time (the test accuracy after each epoch
is computed outside the clock). Prints one JSON object: examples/s, CPU seconds, the test
accuracy after epochs 1 and 3 (and every epoch), threads and the OpenBLAS core. Run with
Debian's /usr/bin/python3 (numpy, python3-torch).
"""
import argparse
import json
import sys
import time

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op, OpenMP and OpenBLAS threads (default 1)")
    ap.add_argument("--epochs", type=int, default=common.EPOCHS)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--dg-order", type=int, metavar="SEED",
                    help="visit the examples in dg's order: ShardBatch's permutations "
                    "with this seed (1 shard)")
    ap.add_argument("--dg-init", type=common.dg_init_arg, metavar="W1,W2",
                    help="start from dg's initial weights: Variables w1, w2 with init "
                    "glorot and these seeds")
    common.add_recipe_args(ap)
    args = ap.parse_args()
    common.threads_env(args.threads)
    import numpy as np
    try:
        import torch
    except ImportError:
        print(json.dumps({"skipped": common.NO_TORCH}))
        return 0
    torch.set_num_threads(args.threads)

    x, y = common.load("train")
    tx, ty = common.load("t10k")
    x, y, tx, ty = (torch.from_numpy(a) for a in (x, y, tx, ty))
    model = common.make_net(torch, args, args.seed, args.dg_init)
    opt = common.make_opt(torch, model.parameters(), args)
    lossf = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(args.seed)

    train_s = 0.0
    cpu = 0.0
    examples = 0
    acc = []
    loss = None
    for e in range(args.epochs):
        order, steps = common.epoch_order(rng, x.shape[0], e, args.dg_order)
        order = torch.from_numpy(order)
        t0 = time.perf_counter()
        c0 = time.process_time()
        for i in range(steps):
            idx = order[i * common.BATCH:(i + 1) * common.BATCH]
            opt.zero_grad(set_to_none=True)
            loss = lossf(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
        train_s += time.perf_counter() - t0
        cpu += time.process_time() - c0
        examples += steps * common.BATCH
        acc.append(common.accuracy(torch, model, tx, ty))
        common.decay(opt, args)
    print(json.dumps({
        "impl": "torch_single", "torch": torch.__version__, "threads": args.threads,
        "openblas_threads": common.openblas_threads(),
        "openblas_core": common.openblas_core(), "epochs": args.epochs,
        "examples": examples, "train_s": round(train_s, 3), "cpu_s": round(cpu, 3),
        "examples_per_s": round(examples / train_s, 1),
        "test_accuracy_epoch1": round(acc[0], 4), "test_accuracy_final": round(acc[-1], 4),
        "test_accuracy": [round(a, 4) for a in acc], "final_loss": round(float(loss), 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
