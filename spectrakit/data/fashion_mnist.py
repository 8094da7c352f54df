"""Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (gzipped IDX files, parsed with numpy).

IDX format: big-endian magic ``0x00000803`` (images: then count, rows, cols as uint32) or ``0x00000801``
(labels: then count), followed by the uint8 data. Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import os

import numpy as np
import torch

from spectrakit._checks import check_choice, check_int

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
MISSING = ("Fashion-MNIST not found in {root}: install the Debian package `dataset-fashion-mnist` "
           "(apt-get install dataset-fashion-mnist) or pass root=")


def read_idx(path: str) -> np.ndarray:
    """Parse one (optionally gzipped) IDX file into a uint8 array. Raises ``ValueError`` on a bad header."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 8 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not a uint8 IDX file (bad magic)")
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4).astype(np.int64)
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {tuple(dims)} but has {body.size} values")
    return body.reshape(tuple(dims))


def available(root: str = DEFAULT_ROOT) -> bool:
    """Whether all four IDX files are present under ``root``."""
    return all(os.path.exists(os.path.join(root, f)) for pair in FILES.values() for f in pair)


def load_fashion_mnist(split: str = "train", *, root: str = DEFAULT_ROOT, limit: int | None = None,
                       normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``(N, 1, 28, 28)`` and int64 labels ``(N,)`` of ``split`` in {"train", "test"}.

    ``limit`` >= 1 keeps the first ``limit`` examples. ``normalize``: float32 scaled to [0, 1] then standardised
    with the train mean/std (0.2860, 0.3530); otherwise uint8. Raises ``FileNotFoundError`` naming the Debian
    package when the files are missing, ``ValueError`` for bad arguments or files.
    """
    check_choice(split, "split", FILES)
    if limit is not None:
        check_int(limit, "limit", low=1)
    if not available(root):
        raise FileNotFoundError(MISSING.format(root=root))
    img_file, lab_file = FILES[split]
    images = read_idx(os.path.join(root, img_file))
    labels = read_idx(os.path.join(root, lab_file))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{split}: {images.shape[0]} images but {labels.shape[0]} labels")
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.copy())[:, None]
    if normalize:
        x = (x.float() / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))
