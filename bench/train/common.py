"""Shared by the PyTorch baselines of bench/train: the thread settings, the Fashion-MNIST
reader (gzip + numpy), the model of examples/mlp.json, the test accuracy, and numpy copies of
dg's data order (ShardBatch's permutations) and initial weights (glorot Variables).

threads_env() must run before torch or numpy is imported: OpenMP and OpenBLAS fix their
thread counts when they load (numpy and torch share Debian's OpenBLAS). So this module
imports numpy only inside its functions, and openblas_threads() checks the result.
"""
import ctypes
import gzip
import os

DATA = "/usr/share/datasets/fashion-mnist"

# The recipe of examples/mlp.json: 784-256-10, ReLU, softmax cross-entropy, SGD, batch 64.
HIDDEN = 256
BATCH = 64
LR = 0.1
EPOCHS = 3
NO_TORCH = "python3-torch is not installed (sudo apt-get install python3-torch)"


def threads_env(n):
    """n threads for every math library (OpenMP, OpenBLAS, MKL); call before importing torch."""
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = str(n)


def _openblas():
    """The OpenBLAS this process has loaded (what Debian's torch and numpy call through
    libblas.so.3), or None."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib
    except (OSError, AttributeError):
        return None


def openblas_core():
    """The OpenBLAS core type this process runs; "unknown" where it cannot be asked."""
    lib = _openblas()
    return lib.openblas_get_corename().decode() if lib else "unknown"


def openblas_threads():
    """OpenBLAS's thread count in this process (0 where it cannot be asked)."""
    lib = _openblas()
    return lib.openblas_get_num_threads() if lib else 0


def read_idx(name):
    """One IDX file of the dataset as a numpy array (uint8): images [N,28,28], labels [N]."""
    import numpy as np
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split):
    """(x float32 [N,784] in [0,1], y int64 [N]) of "train" or "t10k", as IdxReader's
    scale + flatten gives them to dg."""
    import numpy as np
    x = read_idx(f"{split}-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255.0
    y = read_idx(f"{split}-labels-idx1-ubyte.gz").astype(np.int64)
    return x, y


def make_model(torch, seed, dg_init=None):
    """The MLP with dg's initialisation: Glorot-uniform weights, zero biases. dg_init
    (w1's seed, w2's seed): exactly the weights dg's Variables w1 [784,256] and w2 [256,10]
    get with init "glorot" and these seeds (torch's Linear holds the transposes)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, 10))
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    for i, m in enumerate(linears):
        if dg_init is None:
            torch.nn.init.xavier_uniform_(m.weight)
        else:
            w = dg_glorot(dg_init[i], m.in_features, m.out_features)
            with torch.no_grad():
                m.weight.copy_(torch.from_numpy(w.T.copy()))
        torch.nn.init.zeros_(m.bias)
    return model


def accuracy(torch, model, x, y):
    """Fraction of (x, y) the model classifies right (x, y: torch tensors), in eval mode
    (no dropout), 1000 examples at a time (the CNN's activations of 10000 at once are
    ~1 GB)."""
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], 1000):
            right += int((model(x[i:i + 1000]).argmax(dim=1) == y[i:i + 1000]).sum())
    model.train()
    return right / x.shape[0]


# ------------------------------------------------------------------ recipes
# bench_train.py reads the graph's recipe (recipe_of) and passes it to the torch
# scripts as --model/--opt/--lr/--lr-decay; the defaults are examples/mlp.json's.

def add_recipe_args(ap):
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                    help="mlp: examples/mlp.json's 784-256-10; cnn: examples/cnn.json's "
                    "LeNet-like CNN")
    ap.add_argument("--opt", choices=("sgd", "adam"), default="sgd")
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--lr-decay", type=float, default=1.0,
                    help="multiply the learning rate by this after every epoch (default 1)")


def make_cnn(torch, seed):
    """examples/cnn.json's network with dg's initialisation (Glorot-uniform weights over
    the receptive field, as dg's "glorot" and torch's xavier_uniform_ compute it; zero
    biases): conv 5x5x16 SAME + ReLU + 2x2 max pool, conv 5x5x32 + ReLU + pool, dense
    1568-128 + ReLU + dropout 0.25, dense 128-10. Input [N, 784]."""
    torch.manual_seed(seed)
    nn = torch.nn
    model = nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 16, 5, padding=2),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5, padding=2),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1568, 128),
                          nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))
    for m in model:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def make_net(torch, args, seed, dg_init=None):
    """The model the recipe names."""
    return make_cnn(torch, seed) if args.model == "cnn" else make_model(torch, seed, dg_init)


def make_opt(torch, params, args):
    """The recipe's optimizer over params."""
    if args.opt == "adam":
        return torch.optim.Adam(params, lr=args.lr)
    return torch.optim.SGD(params, lr=args.lr)


def decay(opt, args):
    """The end of an epoch: the recipe's learning-rate decay."""
    for g in opt.param_groups:
        g["lr"] *= args.lr_decay


def epoch_order(rng, n, epoch=0, dg_seed=None, shard=0):
    """The example order of one epoch over a shard of n examples and its number of full
    batches (the last partial batch is dropped, as dg's ShardBatch does): a permutation
    from rng, or with dg_seed exactly ShardBatch's (seed dg_seed, this epoch and shard)."""
    if dg_seed is not None:
        return dg_shard_perm(dg_seed, epoch, shard, n), n // BATCH
    return rng.permutation(n), n // BATCH


def dg_init_arg(text):
    """argparse type of --dg-init: "S1,S2" -> (S1, S2)."""
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError("--dg-init takes two seeds: W1,W2")
    return tuple(int(p) for p in parts)


# ------------------------------------------------------------------ dg's own streams
# For runs that give PyTorch exactly dg's data order and initial weights (--dg-order,
# --dg-init of the torch scripts): numpy versions of ShardBatch's permutation
# (kernels/cpu/data.c, shard_perm: Philox4x32-10 of kernels/philox.h) and of a Variable's
# "glorot" init (worker/ops.c, worker_init_tensor: splitmix64).
_M64 = (1 << 64) - 1


def philox4x32_10(c0, c1, c2, c3, key):
    """Philox4x32-10 of the counters (c0..c3: uint64 arrays holding 32-bit values) under
    key (a 64-bit integer, low word first); returns the output words (r0, r1)."""
    import numpy as np
    m32 = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & m32 for c in (c0, c1, c2, c3))
    k0, k1 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & m32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & m32)
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1


def dg_shard_perm(seed, epoch, shard, n):
    """ShardBatch's order of epoch `epoch` over shard `shard` of n examples: position j of
    the epoch visits the shard's example perm[j] (the file's example shard + num_shards *
    perm[j]). Fisher-Yates from j = n-1 down, swapping j with Philox((j, 0, epoch, shard),
    seed) % (j + 1) of the first two words."""
    import numpy as np
    j = np.arange(n - 1, 0, -1, dtype=np.uint64)
    r0, r1 = philox4x32_10(j, j >> np.uint64(32), np.full_like(j, epoch),
                           np.full_like(j, shard), seed & _M64)
    ks = (((r1 << np.uint64(32)) | r0) % (j + np.uint64(1))).tolist()
    perm = list(range(n))
    for jj, k in zip(range(n - 1, 0, -1), ks):
        perm[jj], perm[k] = perm[k], perm[jj]
    return np.array(perm, dtype=np.int64)


def dg_glorot(seed, fan_in, fan_out):
    """The float32 [fan_in, fan_out] value of a Variable with init "glorot" and seed: value
    i (row-major) is limit (2 u_i - 1), u_i the i-th splitmix64 draw of seed mapped to
    (0, 1), limit sqrt(6 / (fan_in + fan_out))."""
    import numpy as np
    n = fan_in * fan_out
    with np.errstate(over="ignore"):
        z = np.uint64(seed & _M64) + np.arange(1, n + 1, dtype=np.uint64) * \
            np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = ((z >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)
    limit = (6.0 / (fan_in + fan_out)) ** 0.5
    return (limit * (2.0 * u - 1.0)).astype(np.float32).reshape(fan_in, fan_out)
