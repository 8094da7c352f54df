"""Training loop: exact resume (bit-identical), gradient accumulation, grad-norm clipping, evaluation,
logs, divergence detection, against hand-written reference steps."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from spectrakit.data.batches import TokenBatches, eval_batches
from spectrakit.train.checkpoint import load_checkpoint, save_checkpoint
from spectrakit.train.loop import TrainConfig, evaluate, train
from spectrakit.train.optimizers import build_optimizer
from spectrakit.train.schedules import make_scheduler


def _setup(make_model, tokens, name, steps, seed=0, **model_kw):
    model = make_model(seed, **model_kw)
    opt = build_optimizer(name, model, lr=3e-3, warmup_steps=2)
    sch = make_scheduler(opt, total=steps, warmup=2, kind="wsd")
    data = TokenBatches(tokens[0], 4, 12, seed=seed)
    return model, opt, sch, data


@pytest.mark.parametrize("name", ["adamw", "spectra-adamw", "spectra-signum", "muon"])
def test_resume_is_bit_identical(tmp_path, make_model, tokens, name):
    steps = 8
    cfg = dict(steps=steps, log_every=2, eval_every=4, eval_tokens=64, progress=False)
    m_full, o, s, d = _setup(make_model, tokens, name, steps)
    full = train(m_full, o, s, d, tokens[1], TrainConfig(**cfg))
    # interrupted run: 5 steps with a checkpoint, then a fresh process-like restart from the checkpoint
    m1, o1, s1, d1 = _setup(make_model, tokens, name, steps)
    train(m1, o1, s1, d1, tokens[1], TrainConfig(**(cfg | dict(steps=5, out_dir=str(tmp_path)))))
    torch.manual_seed(1234)  # perturb global RNG: resume must restore it
    m2, o2, s2, d2 = _setup(make_model, tokens, name, steps, seed=0)
    with torch.no_grad():
        for p in m2.parameters():
            p.add_(1.0)  # garbage that the checkpoint must overwrite
    res = train(
        m2, o2, s2, d2, tokens[1], TrainConfig(**(cfg | dict(resume=str(tmp_path / "checkpoints"))))
    )
    assert res.steps_done == steps and d2.position == steps
    for a, b in zip(m_full.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    assert res.final_val_loss == full.final_val_loss
    assert o2.param_groups[0]["lr"] == o.param_groups[0]["lr"]


class _FixedData:
    """Stream yielding given batches in order (same interface as TokenBatches)."""

    def __init__(self, batches, seq_len):
        self.batches, self.batch_size, self.seq_len, self.position = (
            batches,
            batches[0][0].shape[0],
            seq_len,
            0,
        )

    def next(self):
        self.position += 1
        return self.batches[self.position - 1]

    def state_dict(self):
        return {"position": self.position}


def test_grad_accumulation_equals_big_batch(make_model, tokens):
    big = TokenBatches(tokens[0], 8, 12, seed=5).batch(0)
    halves = [(big[0][:4], big[1][:4]), (big[0][4:], big[1][4:])]
    results = []
    for accum, batches in ((1, [big]), (2, halves)):
        model = make_model(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train(
            model,
            opt,
            None,
            _FixedData(batches, 12),
            tokens[1],
            TrainConfig(steps=1, grad_accum=accum, grad_clip=None, progress=False, eval_tokens=24),
        )
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("clip", [1e-3, 1e3])
def test_grad_clipping_matches_manual_step(make_model, tokens, clip):
    batch = TokenBatches(tokens[0], 4, 12, seed=1).batch(0)
    ref = make_model(0)
    _, loss = ref(*batch)
    loss.backward()
    grads = [p.grad.double() for p in ref.parameters()]
    norm = torch.sqrt(sum((g * g).sum() for g in grads))
    scale = min(1.0, clip / float(norm))
    model = make_model(0)
    res = train(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        None,
        _FixedData([batch], 12),
        tokens[1],
        TrainConfig(steps=1, grad_clip=clip, progress=False, eval_tokens=24),
    )
    assert res.logs[0]["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    for p0, g, p in zip(ref.parameters(), grads, model.parameters()):
        torch.testing.assert_close(p.double(), p0.double() - 0.5 * scale * g, rtol=1e-5, atol=1e-7)


def test_training_learns_and_logs(tmp_path, make_model, tokens):
    model, opt, sch, data = _setup(make_model, tokens, "adamw", 60)
    for g in opt.param_groups:
        g["lr"] = g["initial_lr"] = 1e-2
    start = evaluate(model, tokens[1], seq_len=12, max_tokens=2000)
    res = train(
        model,
        opt,
        sch,
        data,
        tokens[1],
        TrainConfig(
            steps=60, log_every=10, eval_every=30, eval_tokens=2000, out_dir=str(tmp_path), progress=False
        ),
    )
    assert start > math.log(16) - 0.2
    assert res.final_val_loss < 0.6 * start  # the pattern is learnable
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [10, 20, 30, 40, 50, 60]
    assert [r["step"] for r in rows if "val_loss" in r] == [30, 60]
    assert res.evals[-1]["val_loss"] == res.final_val_loss
    header = open(tmp_path / "metrics.csv").readline().strip().split(",")
    assert header[:3] == ["step", "tokens", "loss"] and res.step_ms > 0
    assert rows[0]["tokens"] == 10 * 4 * 12


def test_evaluate_matches_manual_mean(make_model, tokens):
    model = make_model(0)
    val = tokens[1][:500]
    nll, count = 0.0, 0
    for x, y in eval_batches(val, 5, 12):
        with torch.no_grad():
            logits, _ = model(x)
        nll += float(
            torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="sum")
        )
        count += y.numel()
    assert evaluate(model, val, seq_len=12, batch_size=5) == pytest.approx(nll / count, rel=1e-5)


def test_divergence_is_detected(make_model, tokens):
    class _Poison:
        def before_step(self, ctx):
            if ctx.step == 2:
                next(ctx.model.parameters()).grad.fill_(float("nan"))

    model = make_model(0)
    res = train(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        None,
        TokenBatches(tokens[0], 2, 12),
        tokens[1],
        TrainConfig(steps=20, log_every=1, grad_clip=None, progress=False, eval_tokens=24),
        callbacks=[_Poison()],
    )
    assert res.diverged and res.steps_done == 4 and math.isnan(res.final_val_loss)


def test_divergence_by_a_finite_loss_above_the_bound(make_model, tokens):
    """An optimizer that skips non-finite steps keeps the loss finite while the weights blow up: a loss above
    ``diverge_loss`` stops the run too, at the first logged step past the bound, with the logs up to it."""
    model = make_model(0)
    res = train(model, torch.optim.SGD(model.parameters(), lr=50.0), None, TokenBatches(tokens[0], 2, 12),
                tokens[1], TrainConfig(steps=40, log_every=2, grad_clip=None, progress=False, eval_tokens=24,
                                       diverge_loss=20.0))
    assert res.diverged and res.steps_done < 40 and math.isnan(res.final_val_loss)
    losses = [r["loss"] for r in res.logs]
    assert all(v is not None and v <= 20.0 for v in losses[:-1])  # it ran until the first loss past 20 nats
    assert losses[-1] is not None and losses[-1] > 20.0  # finite: only the bound stops it
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="diverge_loss"):
            TrainConfig(diverge_loss=bad)


def test_checkpoint_restores_rng_and_errors(tmp_path, make_model):
    model = make_model(0)
    opt = torch.optim.AdamW(model.parameters())
    path = str(tmp_path / "c.pt")
    np.random.seed(3)
    save_checkpoint(path, model=model, optimizer=opt, step=7, data_state={"position": 7})
    a, b = torch.rand(3), np.random.rand()
    state = load_checkpoint(path, model=make_model(1), optimizer=opt)
    assert state["step"] == 7 and torch.equal(torch.rand(3), a) and np.random.rand() == b
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        load_checkpoint(str(tmp_path / "missing.pt"), model=model)
    assert sorted(os.listdir(path)) == ["latest", "step_00000007"]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(steps=0), "steps"),
        (dict(grad_clip=0.0), "grad_clip"),
        (dict(autocast="fp8"), "autocast"),
        (dict(grad_accum=0), "grad_accum"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


@pytest.mark.gpu
def test_cuda_bf16_autocast_step(make_model, tokens):
    model = make_model(0).cuda()
    opt = build_optimizer("spectra-adamw", model)
    res = train(
        model,
        opt,
        None,
        TokenBatches(tokens[0], 4, 12),
        tokens[1],
        TrainConfig(steps=3, progress=False, eval_tokens=48),
    )
    assert math.isfinite(res.final_val_loss)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager_default_partitioner", pytest.param("inductor", marks=pytest.mark.soak)])
def test_torch_compile_matches_eager(make_model, tokens, backend, monkeypatch):
    """``TrainConfig(compile=True)`` gives the eager run's loss. ``aot_eager_default_partitioner`` traces the
    same joint forward and backward graph as inductor without generating C++ (the default tier), split into
    forward and backward by AOT autograd's default partitioner (inductor's min-cut one imports inductor: about
    1 s of the test's 2.6 s of CPU); inductor's code and partition run in the soak tier."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    from torch import _dynamo

    _dynamo.reset()
    results = []
    for compiled in (False, True):
        model = make_model(0)
        res = train(
            model,
            build_optimizer("spectra-adamw", model),
            None,
            TokenBatches(tokens[0], 4, 12),
            tokens[1],
            TrainConfig(steps=3, compile=compiled, progress=False, eval_tokens=48),
        )
        results.append(res.final_val_loss)
    assert results[1] == pytest.approx(results[0], rel=1e-4)
