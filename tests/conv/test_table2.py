"""Seed 001 Table 2 rows that fit the CI budget (128 channels, 3x3/5x5/7x7, zero padding, 32x32 input).

The published ratios come from one Gaussian kernel each; single kernels scatter by about +-0.05 around the
mean ratio (measured), so each row compares the mean over 3 kernels with the published value (+-0.03).

All three rows run in the soak tier (17-24 s each on one core of a fast machine, about 70 s for the 3x3 row on
a slow one), which .ci/run also runs on a fast enough machine; the default tier checks the same bounds on
smaller layers (tests/conv/test_lipbound.py, test_exact.py, test_tensor_norm.py)."""

import pytest

from spectrakit.experiments.conv_bounds import PAPER, run


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize("k", [3, 5, 7])
def test_table2_row(k):
    (row,) = run(channels=(128,), kernel_sizes=(k,), input_size=32, iters=100, exact_iters=50, seed=0,
                  samples=3)
    pt, pf, ptn = PAPER[(128, k)]
    assert abs(row["TN/exact"] - ptn / pt) < 0.03
    assert abs(row["F4/exact"] - pf / pt) < 0.03
    assert row["TN"] < row["F4"]
