"""Spectral diagnostics against float64 oracles: update norms equal hand-computed updates, SPECTRA's
update bound, aggregated norms, subspace distances vs principal angles, noise-structure analysis."""

from __future__ import annotations

import math

import pytest
import torch

from spectrakit.data.batches import TokenBatches
from spectrakit.train.diagnostics import (
    NoiseStructure,
    SpectralDiagnostics,
    noise_structure,
    subspace_distance,
)
from spectrakit.train.loop import TrainConfig, train
from spectrakit.train.optimizers import build_optimizer


def test_sgd_update_norms_equal_gradient_norms(make_model, tokens):
    model = make_model(0).double()
    batch = TokenBatches(tokens[0], 4, 12).batch(0)
    ref = make_model(0).double()
    _, loss = ref(*batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    diag = SpectralDiagnostics(every=1, spectra_steps=[0])

    class _Data:
        batch_size, seq_len, position = 4, 12, 0

        def next(self):
            return batch

        def state_dict(self):
            return {}

    opt = torch.optim.SGD([{"params": list(model.parameters()), "weight_decay": 0.0}], lr=0.3)
    train(
        model,
        opt,
        None,
        _Data(),
        tokens[1],
        TrainConfig(steps=1, grad_clip=None, progress=False, eval_tokens=24),
        callbacks=[diag],
    )
    layers = {r["layer"]: r for r in diag.layer_rows}
    mats = {n: p.detach() for n, p in model.named_parameters() if p.ndim >= 2}
    assert set(layers) == set(mats)
    for n, p in mats.items():
        assert layers[n]["update_sn"] == pytest.approx(float(torch.linalg.matrix_norm(grads[n], 2)), rel=1e-6)
        assert layers[n]["weight_sn"] == pytest.approx(
            float(torch.linalg.matrix_norm(p.detach(), 2)), rel=1e-5
        )
    agg = diag.rows[0]
    assert agg["agg_linf"] == pytest.approx(max(float(p.abs().max()) for p in mats.values()), rel=1e-6)
    assert agg["agg_fro"] == pytest.approx(
        math.sqrt(sum(float((p * p).sum()) for p in mats.values())), rel=1e-5
    )
    grad_sv = {r["layer"]: r["sv"] for r in diag.spectra if r["kind"] == "grad"}
    upd_sv = {r["layer"]: r["sv"] for r in diag.spectra if r["kind"] == "update"}
    for n in mats:
        ref_sv = torch.linalg.svdvals(grads[n]).tolist()
        assert grad_sv[n] == pytest.approx(ref_sv, rel=1e-4, abs=1e-9)
        assert upd_sv[n] == pytest.approx(ref_sv, rel=1e-4, abs=1e-9)


@pytest.mark.parametrize("c", [0.05, 0.5])
def test_spectra_update_norm_is_bounded_by_alpha_c(make_model, tokens, c):
    model = make_model(0, vocab_size=64)
    opt = build_optimizer("spectra-adamw", model, lr=1e-3, c=c)
    diag = SpectralDiagnostics(every=1)
    train(
        model,
        opt,
        None,
        TokenBatches(tokens[0], 4, 12),
        tokens[1],
        TrainConfig(steps=4, progress=False, eval_tokens=24),
        callbacks=[diag],
    )
    for r in diag.layer_rows:
        m, n = dict(model.named_parameters())[r["layer"]].shape
        alpha = max(1.0, math.sqrt(m / n))
        assert r["update_sn"] <= alpha * c * 1.02, r
        assert r["update_sn"] >= 0.3 * alpha * c, r  # AdamW directions have ||U||_2 >> c: clipped near c
    plain = SpectralDiagnostics(every=1)
    model = make_model(0, vocab_size=64)
    train(
        model,
        build_optimizer("adamw", model, lr=1e-3),
        None,
        TokenBatches(tokens[0], 4, 12),
        tokens[1],
        TrainConfig(steps=2, progress=False, eval_tokens=24),
        callbacks=[plain],
    )
    assert max(r["max_update_sn"] for r in plain.rows) > 10 * c


def _orth(m, r, gen):
    return torch.linalg.qr(torch.randn(m, r, generator=gen, dtype=torch.float64))[0]


@pytest.mark.parametrize("m,r", [(10, 1), (20, 5), (50, 7)])
def test_subspace_distance_against_principal_angles(m, r):
    gen = torch.Generator().manual_seed(m + r)
    U1, U2 = _orth(m, r, gen), _orth(m, r, gen)
    cos = torch.linalg.svdvals(U1.T @ U2).clamp(max=1)
    sin2 = 1 - cos**2
    assert float(subspace_distance(U1, U2, "spectral")) == pytest.approx(float(sin2.max().sqrt()), abs=1e-7)
    assert float(subspace_distance(U1, U2, "chordal")) == pytest.approx(float(sin2.mean().sqrt()), abs=1e-10)
    # seed 000 F.2.2 also writes d_chord = ||U1 U1^T - U2 U2^T||_F / sqrt(r); that norm is sqrt(2 sum sin^2),
    # so it agrees with the trace formula (range [0, 1]) only with an extra 1/sqrt(2)
    proj = U1 @ U1.T - U2 @ U2.T
    assert float(subspace_distance(U1, U2, "chordal")) == pytest.approx(
        float(proj.norm() / math.sqrt(2 * r)), abs=1e-9
    )
    assert float(subspace_distance(U1, U2, "spectral")) == pytest.approx(
        float(torch.linalg.matrix_norm(proj, 2)), abs=1e-7
    )
    assert float(subspace_distance(U1, U1 @ _orth(r, r, gen), "spectral")) == pytest.approx(0.0, abs=1e-6)
    if 2 * r <= m:
        Q = _orth(m, 2 * r, gen)
        assert float(subspace_distance(Q[:, :r], Q[:, r:], "spectral")) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="kind"):
        subspace_distance(U1, U2, "angle")


def test_noise_structure_against_manual_gradients(make_model, tokens):
    model = make_model(0).double()
    stream = TokenBatches(tokens[0], 2, 12, seed=9)
    signal = [stream.batch(i) for i in range(3)]
    samples = [TokenBatches(tokens[0], 1, 12, seed=10).batch(i) for i in range(2)]

    def grad(batch):
        model.zero_grad()
        model(*batch)[1].backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.ndim >= 2}

    gs = [grad(b) for b in signal]
    G = {n: sum(g[n] for g in gs) / 3 for n in gs[0]}
    rows = noise_structure(model, signal, samples, r=3)
    assert all(p.grad is None for p in model.parameters())
    assert len(rows) == 2 * len(G)
    for row in rows:
        g = grad(samples[row["sample"]])[row["layer"]]
        N, S = g - G[row["layer"]], G[row["layer"]]
        assert row["noise_sv"] == pytest.approx(torch.linalg.svdvals(N)[:3].tolist(), rel=1e-8)
        assert row["signal_sn"] == pytest.approx(float(torch.linalg.matrix_norm(S, 2)), rel=1e-8)
        UN, _, VNh = torch.linalg.svd(N)
        UG, _, VGh = torch.linalg.svd(S)
        cos_u = torch.linalg.svdvals(UN[:, :3].T @ UG[:, :3]).clamp(max=1)
        cos_v = torch.linalg.svdvals(VNh[:3] @ VGh[:3].T).clamp(max=1)
        d = max(float((1 - cos_u.min() ** 2).sqrt()), float((1 - cos_v.min() ** 2).sqrt()))
        assert row["d_spec"] == pytest.approx(d, abs=1e-6)
        assert 0 <= row["d_chord"] <= row["d_spec"] + 1e-12
    cb = NoiseStructure([0], lambda step: (signal, samples[:1]), r=2)
    assert cb.active(0) and not cb.active(1)


def test_attach_records_from_a_plain_loop(make_model, tokens):
    """``attach`` (optimizer step hooks) in a hand-written loop records the same rows as the callback path of
    :func:`train`, at the active steps only, and ``remove()`` stops it; SPECTRA's bound holds."""
    batches = TokenBatches(tokens[0], 4, 12)
    model, ref_model = make_model(0, vocab_size=64), make_model(0, vocab_size=64)
    opt = build_optimizer("spectra-adamw", model, lr=1e-3, c=0.5)
    ref_opt = build_optimizer("spectra-adamw", ref_model, lr=1e-3, c=0.5)
    diag, ref = SpectralDiagnostics(every=2), SpectralDiagnostics(every=2)
    handle = diag.attach(model, opt)
    for step in range(4):
        x, y = batches.batch(step)
        for m, o, cb in ((model, opt, None), (ref_model, ref_opt, ref)):
            _, loss = m(x, y)
            loss.backward()
            ctx = type("Ctx", (), {"model": m, "optimizer": o, "step": step})
            if cb is not None and cb.active(step):
                cb.before_step(ctx)
            o.step()
            if cb is not None and cb.active(step):
                cb.after_step(ctx)
            o.zero_grad()
    assert [r["step"] for r in diag.rows] == [0, 2] and diag.rows == ref.rows
    assert diag.layer_rows == ref.layer_rows
    for r in diag.layer_rows:
        m, n = dict(model.named_parameters())[r["layer"]].shape
        assert r["update_sn"] <= max(1.0, math.sqrt(m / n)) * 0.5 * 1.02
    handle.remove()
    _, loss = model(*batches.batch(4))
    loss.backward()
    opt.step()
    assert len(diag.rows) == 2
