import gzip
import os

import numpy as np
import pytest
import torch

from spectrakit.data.fashion_mnist import DEFAULT_ROOT, available, load_fashion_mnist, read_idx

needs_data = pytest.mark.skipif(not available(), reason="Fashion-MNIST missing: install the Debian package "
                                                        "`dataset-fashion-mnist`")


def test_read_idx_roundtrip(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    p = tmp_path / "x-idx3-ubyte.gz"
    with gzip.open(p, "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + np.array([2, 3, 4], dtype=">u4").tobytes() + arr.tobytes())
    np.testing.assert_array_equal(read_idx(str(p)), arr)
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00\x00\x09\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="magic"):
        read_idx(str(bad))
    short = tmp_path / "short"
    short.write_bytes(bytes([0, 0, 8, 1]) + np.array([5], dtype=">u4").tobytes() + b"\x01\x02")
    with pytest.raises(ValueError, match="header"):
        read_idx(str(short))


def test_missing_names_debian_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist(root=str(tmp_path))
    with pytest.raises(ValueError, match="split"):
        load_fashion_mnist("val")


@needs_data
@pytest.mark.parametrize("split,n", [("train", 60000), ("test", 10000)])
def test_real_files(split, n):
    x, y = load_fashion_mnist(split, limit=500, normalize=False)
    assert x.shape == (500, 1, 28, 28) and x.dtype == torch.uint8 and y.dtype == torch.int64
    assert int(y.min()) >= 0 and int(y.max()) <= 9
    lab = read_idx(os.path.join(DEFAULT_ROOT, f"{'train' if split == 'train' else 't10k'}-labels-idx1-ubyte.gz"))
    assert lab.shape == (n,) and np.bincount(lab).tolist() == [n // 10] * 10   # balanced classes
    xn, _ = load_fashion_mnist(split, limit=500)
    assert abs(float(xn.mean())) < 0.2 and xn.dtype == torch.float32
