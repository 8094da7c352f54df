"""Smoke tests of the Addition-mod-31 grokking experiment (tiny settings)."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from spectrakit.experiments import grokking as gk


def test_data_split_and_labels():
    xtr, ytr, xte, yte = gk.addition_mod_data(train_fraction=0.5, seed=0)
    assert xtr.shape[0] + xte.shape[0] == 31 * 31 and xtr.shape[1] == 62
    for x, y in ((xtr, ytr), (xte, yte)):
        a, b = x[:, :31].argmax(1), x[:, 31:].argmax(1)
        assert torch.equal(y, (a + b) % 31)
        assert torch.allclose(x.square().mean(1), torch.ones(x.shape[0]))  # unit RMS inputs
    with pytest.raises(ValueError, match="train_fraction"):
        gk.addition_mod_data(train_fraction=1.0)


@pytest.mark.parametrize("dualizer", list(gk.DUALIZER_RUNS))
def test_training_stays_in_ball_and_fits(dualizer):
    r = gk.train_grokking(dualizer, width=16, lr=0.1, max_steps=4, log_every=2)  # loss 3.420 -> 3.385
    assert r["curve"][-1]["loss"] < r["curve"][0]["loss"]
    assert len(r["deltas"]) == 4 and r["mean_weight_delta"] > 0


def test_main_writes_table_and_plot(tmp_path, quick_plots):
    """The figure is built, not rendered (``quick_plots``): test_plots_readable.py renders it."""
    parser = argparse.ArgumentParser()
    gk.add_arguments(parser)
    args = parser.parse_args(["--dualizers", "naive", "pdhg", "--width", "8", "--max-steps", "3"])
    args.out = str(tmp_path)
    assert gk.main(args) == 0
    data = json.load(open(os.path.join(tmp_path, "results.json")))
    assert [r["dualizer"] for r in data["rows"]] == ["naive", "pdhg"]
    assert os.path.exists(os.path.join(tmp_path, "grokking.png"))
    with pytest.raises(ValueError, match="dualizer"):
        gk.train_grokking("adam", max_steps=1)
