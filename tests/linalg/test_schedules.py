"""Coefficient schedules: Remez minimax quintics vs brute force, schedule tracking, registry."""

import numpy as np
import pytest

from spectrakit.linalg.schedules import (
    MUON_QUINTIC,
    SCHEDULES,
    lower_bound_grid,
    minimax_quintic,
    polar_express_coeffs,
    schedule_error,
    steps_for,
)


def _p(coef, x):
    a, b, c = coef
    return a * x + b * x**3 + c * x**5


@pytest.mark.parametrize("lo,hi", [(1e-6, 1.0), (1e-3, 1.0), (0.1, 1.2), (0.5, 1.01), (0.9, 1.1)])
def test_minimax_equioscillates_and_is_optimal(lo, hi):
    coef, err = minimax_quintic(lo, hi)
    x = np.linspace(lo, hi, 20001)
    e = 1 - _p(coef, x)
    # the claimed error is the true max error on the interval (brute force)
    assert abs(np.abs(e).max() - err) <= 1e-9 + 1e-6 * err
    # equioscillation: +E at lo, -E at hi
    assert e[0] == pytest.approx(err, rel=1e-6)
    assert e[-1] == pytest.approx(-err, rel=1e-6)
    # no random odd quintic does better (optimality, sampled)
    rng = np.random.default_rng(0)
    for _ in range(50):
        trial = np.array(coef) * (1 + 1e-2 * rng.standard_normal(3))
        assert np.abs(1 - _p(trial, x)).max() >= err * (1 - 1e-9)


def test_polar_express_schedule_tracks_interval():
    lb = 1e-3
    coeffs = polar_express_coeffs(lb, 8)
    x = np.geomspace(lb, 1.0, 20001)
    for coef in coeffs:
        x = _p(coef, x)
    assert np.abs(1 - x).max() <= schedule_error(lb, 8) + 1e-12
    assert schedule_error(lb, 8) < 1e-6
    # values slightly above 1 (rounding) stay bounded thanks to the safety factor
    y = np.array([1.005])
    for coef in coeffs:
        y = _p(coef, y)
    assert abs(y[0] - 1) < 1e-3


@pytest.mark.parametrize("lb", [1e-6, 1e-4, 1e-2])
def test_steps_for_is_minimal(lb):
    t = steps_for(lb, 1e-5)
    assert schedule_error(lb, t) <= 1e-5
    assert t == 1 or schedule_error(lb, t - 1) > 1e-5
    assert steps_for(lb / 100, 1e-5) >= t


def test_registry_and_custom_schedule():
    assert SCHEDULES["muon"](None, None) == (MUON_QUINTIC,) * 5
    assert len(SCHEDULES["newton_schulz"](7, None)) == 7
    assert len(SCHEDULES["polar_express"](6, 1e-2)) == 6
    SCHEDULES["test_cubic"] = lambda steps, lb: ((1.5, -0.5, 0.0),) * (steps or 30)
    try:
        import torch

        from spectrakit.linalg import msign

        x = torch.randn(8, 12, dtype=torch.float64)
        x = x / torch.linalg.matrix_norm(x, 2)
        s = torch.linalg.svdvals(msign(x, schedule="test_cubic", steps=40))
        assert torch.allclose(s, torch.ones_like(s), atol=1e-6)
    finally:
        del SCHEDULES["test_cubic"]


def test_grid_is_monotone_and_conservative():
    grid, coeffs = lower_bound_grid(9)
    assert list(grid) == sorted(grid) and grid[0] <= 1e-8 and grid[-1] < 1
    for g, c in zip(grid[::8], coeffs[::8]):
        x = np.geomspace(g, 1.0, 2001)
        for coef in c:
            x = _p(coef, x)
        assert np.abs(1 - x).max() <= schedule_error(g, 9) + 1e-12
