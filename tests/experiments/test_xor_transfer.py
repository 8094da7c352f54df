"""Smoke tests of the XOR learning-rate-transfer experiment (tiny settings)."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from spectrakit.experiments import xor_transfer as xt


def test_xor_data():
    x, y = xt.xor_data()
    assert torch.equal(y, (x[:, 0] != x[:, 1]).long())


@pytest.mark.parametrize("constraint", xt.SETS)
def test_training_reduces_loss_and_respects_constraints(constraint):
    before = xt.train_xor(8, 1e-6, constraint, steps=1)
    after = xt.train_xor(8, 0.25, constraint, steps=2)  # 2 steps: from 0.68-0.69 to 0.50-0.57 (4: 0.36-0.50)
    assert after < before


def test_run_optimal_lrs_and_main(tmp_path):
    rows = xt.run(widths=(4, 8), lrs=(0.01, 0.3), sets=("ball",), steps=1, seeds=(0,))
    assert len(rows) == 4 and all(r["final_loss"] > 0 for r in rows)
    best = xt.optimal_lrs(rows)
    assert {(b["set"], b["width"]) for b in best} == {("ball", 4), ("ball", 8)}
    for b in best:
        same = [r for r in rows if r["width"] == b["width"]]
        assert b["best_loss"] == min(r["final_loss"] for r in same)
    parser = argparse.ArgumentParser()
    xt.add_arguments(parser)
    args = parser.parse_args(["--widths", "4", "--lrs", "0.1", "--sets", "psd", "--steps", "1",
                              "--seeds", "0"])
    args.out = str(tmp_path)
    assert xt.main(args) == 0
    data = json.load(open(os.path.join(tmp_path, "results.json")))
    assert data["rows"][0]["set"] == "psd" and len(data["sweep"]) == 1
    assert os.path.getsize(os.path.join(tmp_path, "xor_transfer.png")) > 0


def test_invalid_set():
    with pytest.raises(ValueError, match="sets"):
        xt.run(widths=(4,), lrs=(0.1,), sets=("cube",), steps=1)
