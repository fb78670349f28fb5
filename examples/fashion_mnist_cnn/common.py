"""What train.py (1-bit Adam through onebit) and ddp_adam.py (Adam over DDP) share: the
data, the model, the batches and the evaluation, so the two runs differ only in the optimizer
and its exchange."""
import gzip
import os
import struct

import numpy as np
import torch
from torch import nn

DATA_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's fashion-mnist package
CLASSES = 10


def read_idx(path):
    """An IDX file (LeCun's MNIST format; gzip-compressed or not) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than an IDX header")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if zero != 0 or dtype_code not in dtypes:
        raise ValueError(f"{path}: not an IDX file (magic {data[:4].hex()})")
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:header])
    array = np.frombuffer(data, dtype=dtypes[dtype_code], offset=header)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {array.size} values, the header says {shape}")
    return array.reshape(shape)


def _find(name):
    for candidate in (name, name + ".gz"):
        path = os.path.join(DATA_DIR, candidate)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{name}(.gz) is not in {DATA_DIR}: apt-get install dataset-fashion-mnist")


def load(split):
    """(images float32 [n,1,28,28] normalized, labels int64 [n]) of 'train' or 't10k'."""
    images = read_idx(_find(f"{split}-images-idx3-ubyte"))
    labels = read_idx(_find(f"{split}-labels-idx1-ubyte"))
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise ValueError(f"{split}: images {images.shape} and labels {labels.shape} disagree")
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    x = ((x - 0.2860) / 0.3530).unsqueeze(1)  # Fashion-MNIST's mean and std
    return x, torch.from_numpy(labels.astype(np.int64))


class Cnn(nn.Module):
    """Two conv layers and a linear classifier (~19k parameters); no batch norm, so every
    rank's model is its parameters alone."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),   # 16 x 12 x 12
            nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2))  # 32 x 4 x 4
        self.classifier = nn.Linear(32 * 4 * 4, CLASSES)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def make_model(seed):
    torch.manual_seed(seed)  # every rank (and the DDP baseline) starts from the same weights
    return Cnn()


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


def batch_indices(n, seed, step, rank, world, batch):
    """Rank `rank`'s examples at `step` (1-based): epoch e's permutation comes from (seed, e);
    step t takes the t-th global batch of world*batch examples and rank r its r-th slice.
    The same for both runs, so each rank sees the same data under either optimizer."""
    per_epoch = n // (world * batch)
    epoch, within = divmod(step - 1, per_epoch)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    start = (within * world + rank) * batch
    return perm[start:start + batch]


@torch.no_grad()
def evaluate(model, x, y, chunk=2000):
    """(accuracy, mean cross-entropy) on (x, y)."""
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, len(x), chunk):
        logits = model(x[i:i + chunk])
        loss += nn.functional.cross_entropy(logits, y[i:i + chunk], reduction="sum").item()
        correct += (logits.argmax(1) == y[i:i + chunk]).sum().item()
    model.train()
    return correct / len(x), loss / len(x)
