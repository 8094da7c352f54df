"""Seed 001 Table 2 rows that fit the CI budget (128 channels, 3x3/5x5/7x7, zero padding, 32x32 input).

The published ratios come from one Gaussian kernel each; single kernels scatter by about +-0.05 around the
mean ratio (measured), so each row compares the mean over 3 kernels with the published value (+-0.03).

The 3x3 row runs in the default tier; the 5x5 and 7x7 rows (the same code on larger kernels, 17-23 s each on
one core) run in the soak tier, which .ci/run also runs on a fast enough machine."""

import pytest

from spectrakit.experiments.conv_bounds import PAPER, run


@pytest.mark.slow
@pytest.mark.parametrize("k", [3, pytest.param(5, marks=pytest.mark.soak), pytest.param(7, marks=pytest.mark.soak)])
def test_table2_row(k):
    (row,) = run(channels=(128,), kernel_sizes=(k,), input_size=32, iters=100, exact_iters=50, seed=0,
                  samples=3)
    pt, pf, ptn = PAPER[(128, k)]
    assert abs(row["TN/exact"] - ptn / pt) < 0.03
    assert abs(row["F4/exact"] - pf / pt) < 0.03
    assert row["TN"] < row["F4"]
