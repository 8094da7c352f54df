"""Seed 000 §F.1.2 (small): spectral clipping (c = M) is robust to rank-r spectral spikes."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from spectrakit.experiments import spike_noise as sn


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_stiefel_and_gradient_bound():
    gen = torch.Generator().manual_seed(0)
    U = sn.stiefel(12, 3, gen)
    torch.testing.assert_close(U.T @ U, torch.eye(3, dtype=torch.float64), atol=1e-12, rtol=0)
    A, y, _, _, _ = sn.logistic_data(8, 30, 0, 1.0)
    M = sn.gradient_bound(A)
    for _ in range(5):  # ||grad f(X)||_2 <= M at random points
        X = torch.randn(8, 8, dtype=torch.float64) * 3
        assert float(torch.linalg.matrix_norm(sn.logistic_grad(X, A, y), ord=2)) <= M


@pytest.mark.parametrize("rank", [1, 2])
def test_spectral_clipping_beats_sgd_and_global_clipping(rank):
    """20 steps: spectral clipping ends 60-25000x below both others at l = 100 and 1000 (100-30000x after 50
    steps), and within 1.4x of its l = 10 loss at l = 1000."""
    rows = sn.run(
        d=20,
        n=40,
        noises=(10.0, 100.0, 1000.0),
        rank=rank,
        steps=20,
        lrs=(0.1, 0.3, 1.0),
        methods=("sgd", "sgd+global_clip", "sgd+spectral_clip"),
    )
    shared = {(r["noise"], r["method"]): r["final_loss"] for r in rows if r["protocol"] == "shared"}
    for noise in (100.0, 1000.0):
        spec = shared[(noise, "sgd+spectral_clip")]
        assert spec < shared[(noise, "sgd")] and spec < shared[(noise, "sgd+global_clip")]
    # spectral clipping is insensitive to the spike size: l = 1000 ends within 2x of l = 10
    assert shared[(1000.0, "sgd+spectral_clip")] < 2 * shared[(10.0, "sgd+spectral_clip")]


def test_pre_clip_protects_momentum(tmp_path, quick_plots):
    """20 steps: with the pre-clip, momentum ends 140x lower (460x after 60 steps); the figures are built, not
    rendered (``quick_plots``)."""
    args = argparse.Namespace(
        d=12,
        n=30,
        noises=[300.0],
        rank=1,
        steps=20,
        lrs=[0.3, 1.0],
        methods=["sgd", "sgdm", "sgdm+pre_clip"],
        seed=0,
        out=str(tmp_path),
    )
    assert sn.main(args) == 0
    data = json.load(open(tmp_path / "results.json"))
    shared = {r["method"]: r["final_loss"] for r in data["rows"] if r["protocol"] == "shared"}
    assert shared["sgdm+pre_clip"] < shared["sgdm"]
    assert all(os.path.exists(p) for p in data["plots"])
