"""LR schedules against hand-computed values of the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from spectrakit.train.schedules import lr_factor, make_scheduler


@pytest.mark.parametrize(
    "step,expected",
    [
        (0, 0.1),
        (9, 1.0),
        (10, 1.0),
        (79, 1.0),
        (80, 1.0),
        (81, 1 - math.sqrt(1 / 20)),
        (95, 1 - math.sqrt(15 / 20)),
        (99, 1 - math.sqrt(19 / 20)),
        (150, 1 - math.sqrt(19 / 20)),
    ],
)
def test_wsd_sqrt_decay_over_final_20_percent(step, expected):
    assert lr_factor(step, total=100, warmup=10, kind="wsd") == pytest.approx(expected)


@pytest.mark.parametrize("step", [10, 30, 55, 99])
def test_cosine(step):
    t = (step - 10) / 90
    expected = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))
    assert lr_factor(step, total=100, warmup=10, kind="cosine", final=0.1) == pytest.approx(expected)


def test_wsd_final_and_constant():
    assert lr_factor(99, total=100, kind="wsd", decay_frac=0.5, final=0.2) == pytest.approx(
        0.2 + 0.8 * (1 - math.sqrt(49 / 50))
    )
    assert lr_factor(50, total=100, warmup=10, kind="constant") == 1.0
    assert lr_factor(0, total=1, kind="wsd") == 1.0  # degenerate one-step run


def test_scheduler_drives_optimizer_and_round_trips():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.5)
    sch = make_scheduler(opt, total=20, warmup=4, kind="wsd")
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    assert lrs == pytest.approx([0.5 * lr_factor(k, total=20, warmup=4) for k in range(20)])
    sch2 = make_scheduler(torch.optim.SGD([p], lr=0.5), total=20, warmup=4)
    sch2.load_state_dict(sch.state_dict())
    assert sch2.last_epoch == sch.last_epoch


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(step=-1, total=10), "step"),
        (dict(step=0, total=0), "total"),
        (dict(step=0, total=10, warmup=11), "warmup"),
        (dict(step=0, total=10, kind="linear"), "kind"),
        (dict(step=0, total=10, decay_frac=1.5), "decay_frac"),
        (dict(step=0, total=10, final=-0.1), "final"),
    ],
)
def test_errors(kwargs, match):
    step = kwargs.pop("step")
    with pytest.raises(ValueError, match=match):
        lr_factor(step, **kwargs)
