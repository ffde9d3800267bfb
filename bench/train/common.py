"""Shared by the PyTorch baselines of bench/train: the thread settings, the Fashion-MNIST
reader (gzip + numpy), the model of examples/mlp.json and the test accuracy.

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


def make_model(torch, seed):
    """The MLP with dg's initialisation: Glorot-uniform weights, zero biases."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, 10))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            torch.nn.init.zeros_(m.bias)
    return model


def accuracy(torch, model, x, y):
    """Fraction of (x, y) the model classifies right (x, y: torch tensors)."""
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def epoch_order(rng, n):
    """The example order of one epoch and its number of full batches (the last partial
    batch is dropped, as dg's ShardBatch does)."""
    return rng.permutation(n), n // BATCH
