"""The Spectra pipeline: post-transforms and scales against SVD references, spectral-norm bound of the
update, state-dict resume, non-finite policy, batching, argument validation."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

import spectrakit.optim as O
from tests.optim._reference import REFERENCES, svd_map

SHAPES = [(8, 5), (5, 8), (8, 5), (4, 3, 3, 3), (6,)]


def _setup(dtype=torch.float32, shapes=SHAPES, scale=1.0):
    init = [torch.randn(s, dtype=torch.float64) * scale for s in shapes]
    return init, [p.to(dtype).requires_grad_() for p in init]


def _soft(c):
    return lambda U: svd_map(U, lambda s: s / torch.sqrt(1 + (s / c) ** 2))


def _hard(c):
    return lambda U: svd_map(U, lambda s: s.clamp(max=c))


@pytest.mark.parametrize("post,ref_post", [("soft_clip_exact", _soft), ("hard_clip", _hard)])
@pytest.mark.parametrize(
    "base,hp",
    [
        ("adamw", dict(betas=(0.9, 0.999), eps=1e-8)),
        ("sgd", dict(momentum=0.9, dampening=0.0, nesterov=True)),
        ("signum", dict(momentum=0.9, nesterov=False)),
    ],
)
def test_post_transform_and_scale_match_reference(post, ref_post, base, hp):
    """X <- (1 - lr wd) X - lr max(1, sqrt(m/n)) clip(U): conv kernels flattened to (o, i*k*k), 1-D plain."""
    lr, wd, c = 1e-2, 0.1, 0.5
    init, params = _setup(torch.float64)
    opt = O.Spectra(params, base=base, post=post, lr=lr, weight_decay=wd, c=c, **hp)
    refs = [REFERENCES[base](p, lr, wd, **hp) for p in init]
    for _ in range(15):
        grads = [torch.randn(p.shape, dtype=torch.float64) * 3 for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for p, r, g in zip(params, refs, grads):
            if p.ndim >= 2:
                m, n = p.shape[0], p[0].numel()
                f = lambda U, m=m, n=n, shape=p.shape: ref_post(c)(U.reshape(m, n)).reshape(shape)
                r.step(g, post=f, alpha=max(1.0, math.sqrt(m / n)))
            else:
                r.step(g)
            torch.testing.assert_close(p.detach(), r.p, atol=1e-10, rtol=1e-10)


def _spectral(x):
    return torch.linalg.matrix_norm(x.double().reshape(x.shape[0], -1), ord=2)


@pytest.mark.parametrize(
    "post,tol",
    [
        ("soft_clip", 1e-2),
        ("soft_clip_ns", 1e-2),
        ("hardcap", 1e-2),
        ("soft_clip_exact", 1e-4),
        ("hard_clip", 1e-4),
    ],
)
@pytest.mark.parametrize(
    "cls", [O.SpectraAdamW, O.SpectraSignum, O.SpectraSGD, O.SpectraLion, O.SpectraAdEMAMix, O.SpectraMARS]
)
def test_update_spectral_norm_bound(cls, post, tol):
    """||X_{k+1} - (1 - lr wd) X_k||_2 <= lr alpha c at every step, on a random model with huge gradients
    (tolerance: fp32 rounding of the stored weights; 1e-2 for the iterative linalg soft clip)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 24),
        torch.nn.GELU(),
        torch.nn.Linear(24, 6),
        torch.nn.Unflatten(1, (6, 1, 1)),
        torch.nn.Conv2d(6, 4, 1),
    )
    lr, wd, c = 0.05, 0.1, 0.3
    # sigma_max(U)/c reaches ~1e3 here; linalg.soft_clip's default 9 polar steps cover <= ~3e4
    opt = cls(model.parameters(), post=post, lr=lr, weight_decay=wd, c=c)
    x = torch.randn(32, 12)
    for step in range(6):
        opt.zero_grad()
        (model(x).pow(2).mean() * 10.0 ** (step % 3)).backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        for p, b in zip(model.parameters(), before):
            if p.ndim < 2:
                continue
            m, n = p.shape[0], p[0].numel()
            alpha = max(1.0, math.sqrt(m / n))
            assert _spectral(p.detach() - (1 - lr * wd) * b) <= lr * alpha * c * (1 + tol)


def test_warmup_keeps_lr_times_c_constant():
    """Standard schedule: during warm-up c_k = c lr_peak / lr_k, so ||delta|| <= lr_peak alpha c, and
    the bound is attained-ish (hard clip of a huge update) instead of shrinking with lr_k."""
    w = torch.nn.Parameter(torch.randn(6, 6))
    opt = O.SpectraSGD([w], post="hard_clip", lr=1.0, weight_decay=0.0, c=0.1, warmup_steps=5, momentum=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / 5))
    for k in range(8):
        before = w.detach().clone()
        w.grad = torch.randn(6, 6) * 100
        opt.step()
        sched.step()
        # lr_k * c_k = 1.0 * 0.1 both during and after warm-up: the top singular value is clipped to it
        assert abs(float(_spectral(w.detach() - before)) - 0.1) < 1e-5, k


class _Recorder(O.Spectra):
    def __init__(self, *a, **k):
        self.calls = []
        super().__init__(*a, **k)

    def _post_transform_groups(self, batches):
        self.calls.append([(tuple(b["U"].shape), b["c"]) for b in batches])
        return super()._post_transform_groups(batches)


def test_one_post_call_per_shape_batch_and_schedule_values():
    ps = [torch.nn.Parameter(torch.randn(s)) for s in [(4, 3), (4, 3), (3, 4), (4, 3), (2, 1, 3, 1), (5,)]]
    opt = _Recorder(
        ps,
        post="soft_clip_exact",
        c=2.0,
        lr=1.0,
        warmup_steps=2,
        c_schedule={"decay": "linear", "decay_start": 0.5, "total_steps": 6, "final_scale": 0.25},
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: [0.25, 0.5, 1, 1, 1, 1, 1][k])
    for _ in range(6):
        for p in ps:
            p.grad = torch.randn_like(p)
        opt.step()
        sched.step()
    assert len(opt.calls) == 3 * 6 and all(len(call) == 1 for call in opt.calls)  # one call per batch
    shapes = sorted(call[0][0] for call in opt.calls[:3])
    assert shapes == [(1, 2, 3), (1, 3, 4), (3, 4, 3)]  # 3 same-shape (4,3) stacked; conv as (2, 3)
    cs = [call[0][1] for call in opt.calls[::3]]
    # warm-up: c * 1/0.25, c * 1/0.5; then constant until step 3, then linear decay to 0.25 c at step 6
    expected = [8.0, 4.0, 2.0, 2.0, 2.0 * (0.25 + 0.75 * (2 / 3)), 2.0 * (0.25 + 0.75 * (1 / 3))]
    assert cs == pytest.approx(expected)


def _train(opt, params, n, gen, sched=None):
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        opt.step()
        if sched is not None:
            sched.step()


@pytest.mark.parametrize(
    "cls,kw",
    [
        (O.SpectraAdamW, dict(post="soft_clip_exact")),
        (O.SpectraAdEMAMix, dict(post="hard_clip", alpha_warmup=4, beta3_warmup=4)),
        (O.MARS, {}),
        (O.Lion, {}),
        (O.SpectraSignum, dict(post="soft_clip_exact", pre_c=0.5)),
    ],
)
def test_state_dict_round_trip_is_bit_identical(cls, kw):
    dtypes = [torch.bfloat16, torch.float32, torch.float32, torch.bfloat16, torch.float32]
    params = [torch.nn.Parameter(torch.randn(s).to(d)) for s, d in zip(SHAPES, dtypes)]
    opt = cls(params, lr=0.01, warmup_steps=3, **kw)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
    gen = torch.Generator().manual_seed(0)
    _train(opt, params, 4, gen, sched)
    buf = io.BytesIO()
    torch.save(
        {"opt": opt.state_dict(), "sched": sched.state_dict(), "params": [p.detach() for p in params]}, buf
    )
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    clone = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt2 = cls(clone, lr=0.01, warmup_steps=3, **kw)
    sched2 = torch.optim.lr_scheduler.LinearLR(opt2, start_factor=0.1, total_iters=3)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    for p in clone:  # fp32 state of bf16 params stays fp32
        assert all(v.dtype != torch.bfloat16 for v in opt2.state[p].values())
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    _train(opt, params, 5, g1, sched)
    _train(opt2, clone, 5, g2, sched2)
    for a, b in zip(params, clone):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_gradient_skips_step_without_writing(bad):
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, opt_ref = O.SpectraAdamW(params, post="soft_clip_exact"), O.SpectraAdamW(ref, post="soft_clip_exact")
    gen, gen_ref = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    _train(opt, params, 2, gen)
    _train(opt_ref, ref, 2, gen_ref)
    snap = copy.deepcopy(opt.state_dict())
    for p in params:
        p.grad = torch.randn(p.shape)
    params[3].grad[1, 0, 2, 1] = bad
    before = [p.detach().clone() for p in params]
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert int(opt.skipped_steps) == 1
    after = opt.state_dict()["state"]
    for pid, st in snap["state"].items():
        for key, val in st.items():
            assert torch.equal(after[pid][key], val), key
    _train(opt, params, 3, gen)  # continues exactly like an optimizer that never saw the bad step
    _train(opt_ref, ref, 3, gen_ref)
    for a, b in zip(params, ref):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert int(opt_ref.skipped_steps) == 0


def test_param_without_grad_and_mixed_dtypes():
    a = torch.nn.Parameter(torch.randn(5, 4, dtype=torch.float64))
    b = torch.nn.Parameter(torch.randn(5, 4, dtype=torch.float32))
    c = torch.nn.Parameter(torch.randn(5, 4).bfloat16())
    frozen = torch.nn.Parameter(torch.randn(5, 4))
    opt = O.SpectraAdamW([a, b, c, frozen], post="soft_clip_exact", lr=0.1)
    xs = [torch.nn.Parameter(t.detach().clone()) for t in (a, b, c)]
    single = [O.SpectraAdamW([x], post="soft_clip_exact", lr=0.1) for x in xs]
    frozen0 = frozen.detach().clone()
    for _ in range(3):
        for p, q in zip((a, b, c), xs):
            p.grad = torch.randn(p.shape).to(p.dtype)
            q.grad = p.grad.clone()
        opt.step()
        for o in single:
            o.step()
    assert torch.equal(frozen, frozen0) and len(opt.state[frozen]) == 0
    assert opt.state[c]["exp_avg"].dtype == torch.float32 and opt.state[a]["exp_avg"].dtype == torch.float64
    for p, q in zip((a, b, c), xs):  # batching by (shape, dtype) = running each parameter alone
        assert p.dtype == q.dtype
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("cap", [1, 30, 10**6])
def test_max_batch_numel_chunks_give_the_same_update(cap):
    ps = [
        torch.nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in [(4, 5)] * 3 + [(3,), (2,), (4, 5)]
    ]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    opt = O.SpectraAdamW(ps, post="soft_clip_exact", c=0.2, max_batch_numel=cap)
    ref = O.SpectraAdamW(qs, post="soft_clip_exact", c=0.2)
    for _ in range(3):
        for p, q in zip(ps, qs):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, atol=1e-12, rtol=1e-12)


def test_same_shape_batch_equals_individual_steps():
    ps = [torch.nn.Parameter(torch.randn(7, 3)) for _ in range(4)]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    opt = O.SpectraAdamW(ps, post="soft_clip_exact", c=0.3)
    singles = [O.SpectraAdamW([q], post="soft_clip_exact", c=0.3) for q in qs]
    for _ in range(4):
        for p, q in zip(ps, qs):
            p.grad = torch.randn(7, 3) * 10
            q.grad = p.grad.clone()
        opt.step()
        for o in singles:
            o.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)


def test_vector_clip_and_pre_clip():
    """1-D params: vector_clip gives u / sqrt(1 + ||u||^2/c^2); pre_c clips the raw gradient before the
    momentum sees it (checked against the SGD reference fed with SVD-clipped gradients)."""
    w, bias = (
        torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64)),
        torch.nn.Parameter(torch.randn(5, dtype=torch.float64)),
    )
    rw = REFERENCES["sgd"](w, 0.1, 0.0, momentum=0.9, dampening=0.0, nesterov=False)
    rb = REFERENCES["sgd"](bias, 0.1, 0.0, momentum=0.9, dampening=0.0, nesterov=False)
    opt = O.Spectra(
        [w, bias],
        base="sgd",
        post="none",
        lr=0.1,
        weight_decay=0.0,
        pre_c=0.7,
        pre="soft_clip_exact",
        vector_clip=True,
        c=0.4,
        momentum=0.9,
    )
    for _ in range(5):
        gw, gb = torch.randn(6, 4, dtype=torch.float64) * 5, torch.randn(5, dtype=torch.float64) * 5
        w.grad, bias.grad = gw.clone(), gb.clone()
        opt.step()
        rw.step(_soft(0.7)(gw))
        gb_pre = gb / torch.sqrt(1 + gb.norm() ** 2 / 0.7**2)
        rb.step(gb_pre, post=lambda u: u / torch.sqrt(1 + u.norm() ** 2 / 0.4**2))
        torch.testing.assert_close(w.detach(), rw.p, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(bias.detach(), rb.p, atol=1e-10, rtol=1e-10)


def test_scales_and_embedding_override():
    vocab, d = 50304, 768
    assert O.update_scale("auto", "soft_clip", vocab, d) == pytest.approx(math.sqrt(vocab / d))
    assert O.update_scale("auto", "none", vocab, d) == 1.0
    assert O.update_scale("muon", "newton_schulz5", 3072, 768) == pytest.approx(2.0)
    assert O.update_scale("muon", "newton_schulz5", 768, 3072) == 1.0
    assert O.update_scale("moonlight", "newton_schulz5", 768, 3072) == pytest.approx(0.2 * math.sqrt(3072))
    emb, lin = torch.nn.Parameter(torch.randn(40, 4)), torch.nn.Parameter(torch.randn(4, 4))
    opt = O.SpectraAdamW([{"params": [emb], "post": "none"}, {"params": [lin]}], lr=0.1, weight_decay=0.0)
    ref = REFERENCES["adamw"](emb, 0.1, 0.0, betas=(0.9, 0.999), eps=1e-8)
    g = torch.randn(40, 4)
    emb.grad, lin.grad = g.clone(), torch.randn(4, 4)
    opt.step()
    ref.step(g)
    torch.testing.assert_close(emb.detach().double(), ref.p, atol=1e-6, rtol=1e-6)


def test_closure_zero_grad_and_group_base_override():
    w, b = torch.nn.Parameter(torch.randn(3, 3)), torch.nn.Parameter(torch.randn(3))
    opt = O.Muon([{"params": [w]}, {"params": [b], "base": "adamw", "post": "none"}])
    assert opt.param_groups[1]["betas"] == (0.9, 0.999) and opt.param_groups[1]["eps"] == 1e-8

    def closure():
        opt.zero_grad()
        loss = (w.sum() + b.sum()) ** 2
        loss.backward()
        return loss

    opt.param_groups[0]["post"] = "hard_clip"  # keep this test independent of linalg
    loss = opt.step(closure)
    assert torch.is_tensor(loss) and "exp_avg_sq" in opt.state[b] and "momentum_buffer" in opt.state[w]
    opt.zero_grad()
    assert w.grad is None


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(lr=-1.0), "lr"),
        (dict(c=0.0), "c"),
        (dict(c=-2.0), "c"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(betas=(1.0, 0.9)), "betas[0]"),
        (dict(betas=(0.9, -0.1)), "betas[1]"),
        (dict(betas=(0.9,)), "betas"),
        (dict(base="adam"), "base"),
        (dict(post="clip"), "post"),
        (dict(pre="x"), "pre"),
        (dict(pre_c=0.0), "pre_c"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(scale="big"), "scale"),
        (dict(scale=-1.0), "scale"),
        (dict(c_schedule={"foo": 1}), "c_schedule"),
        (dict(c_schedule={"decay": "cosine"}), "total_steps"),
        (dict(c_schedule={"decay": "exp", "total_steps": 5}), "decay"),
        (dict(eps=-1.0), "eps"),
        (dict(max_batch_numel=0), "max_batch_numel"),
    ],
)
def test_invalid_arguments(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name.replace("[", r"\[").replace("]", r"\]")):
        O.Spectra([torch.nn.Parameter(torch.randn(2, 2))], **kwargs)


def test_invalid_group_and_keywords():
    p = torch.nn.Parameter(torch.randn(2, 2))
    with pytest.raises(TypeError, match="momentum"):
        O.Spectra([p], base="adamw", momentum=0.9)
    with pytest.raises(ValueError, match="lr"):
        O.Spectra([{"params": [p], "lr": -1.0}])
    with pytest.raises(ValueError, match="momentum"):
        O.Spectra([{"params": [p], "base": "sgd", "momentum": 1.5}])
    with pytest.raises(ValueError, match="alpha_warmup"):
        O.AdEMAMix([p], alpha_warmup=0)
    with pytest.raises(TypeError, match="floating"):
        O.Spectra([torch.zeros(2, 2, dtype=torch.int64)])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.soak)])
def test_torch_compile_step_matches_eager(backend):
    """``torch.compile(opt.step)`` traces the pipeline (no tensor-valued Python branches) and gives the
    eager result, including a skipped non-finite step (global_clip keeps the compile short on CPU).
    ``aot_eager`` traces the same graphs as inductor (the default tier); inductor's generated code runs in the
    soak tier."""
    from torch import _dynamo

    _dynamo.reset()
    # two matrices of one shape (one batch) and a vector: a trace's cost grows with the parameters it unrolls
    ps = [torch.nn.Parameter(torch.randn(8, 4)) for _ in range(2)] + [torch.nn.Parameter(torch.randn(4))]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    opt = O.SpectraAdamW(ps, post="global_clip", c=0.5, lr=0.01)
    ref = O.SpectraAdamW(qs, post="global_clip", c=0.5, lr=0.01)
    step = torch.compile(opt.step, backend=backend)
    for i in range(4):
        for p, q in zip(ps, qs):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        if i == 2:
            ps[0].grad[0, 0] = qs[0].grad[0, 0] = float("nan")
        step()
        ref.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)
    assert int(opt.skipped_steps) == int(ref.skipped_steps) == 1


@pytest.mark.parametrize("scale", ["spectra", "muon", "auto", "none"])
@pytest.mark.parametrize("m, n", [(0, 5), (5, 0), (0, 0)])
def test_update_scale_of_empty_matrix_is_one(scale, m, n):
    """An empty (m or n = 0) matrix has an empty update: the ratio scales give 1, not ZeroDivisionError."""
    assert O.update_scale(scale, "soft_clip", m, n) == 1.0


@pytest.mark.parametrize("m, n, exc", [(-1, 3, ValueError), (3, -2, ValueError), (3.0, 2, TypeError)])
def test_update_scale_rejects_bad_shapes(m, n, exc):
    with pytest.raises(exc, match="^m |^n "):
        O.update_scale("spectra", "soft_clip", m, n)


class _HookRecorder(O.Spectra):
    """Records every call of the two matrix hooks and doubles alpha through the overridable scale."""

    def __init__(self, *a, **k):
        self.calls = []
        super().__init__(*a, **k)

    def _post_transform_groups(self, batches):
        self.calls += [(b["stage"], b["post"], tuple(b["U"].shape), [id(p) for p in b["params"]])
                       for b in batches]
        return super()._post_transform_groups(batches)

    def _update_scale(self, group, kind, shape, params):
        return 2.0 * super()._update_scale(group, kind, shape, params)


def test_hooks_get_params_and_pre_clip_and_alpha_is_overridable():
    """The pre-clip goes through the hook (stage "pre", group's ``pre`` name) before the post-transform
    (stage "post"); ``params`` are the batch's parameters in stacking order; doubling ``_update_scale``
    doubles the applied update (checked against the plain optimizer's step)."""
    shapes = [(6, 4), (5,), (6, 4), (3, 2, 2)]
    init = [torch.randn(s, dtype=torch.float64) for s in shapes]
    grads = [torch.randn(s, dtype=torch.float64) for s in shapes]
    kw = dict(base="sgd", post="soft_clip_exact", lr=0.1, weight_decay=0.0, c=0.3, pre_c=0.5,
              pre="hard_clip", momentum=0.0)
    ps = [torch.nn.Parameter(x.clone()) for x in init]
    qs = [torch.nn.Parameter(x.clone()) for x in init]
    rec, plain = _HookRecorder(ps, **kw), O.Spectra(qs, **kw)
    for p, q, g in zip(ps, qs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    rec.step()
    plain.step()
    assert [(st, name, shape) for st, name, shape, _ in rec.calls] == [
        ("pre", "hard_clip", (2, 6, 4)), ("post", "soft_clip_exact", (2, 6, 4)),
        ("pre", "hard_clip", (1, 3, 4)), ("post", "soft_clip_exact", (1, 3, 4)),
    ]
    assert rec.calls[0][3] == [id(ps[0]), id(ps[2])] and rec.calls[2][3] == [id(ps[3])]
    for p, q, x in zip(ps, qs, init):
        torch.testing.assert_close(p.detach() - x, 2.0 * (q.detach() - x), atol=1e-12, rtol=1e-12)
    # the pre-clip is the hard clip of the raw gradient at 0.5: the matrix update is post(hard(g))
    want = _soft(0.3)(_hard(0.5)(grads[0]))
    torch.testing.assert_close(qs[0].detach(), init[0] - 0.1 * 1.5 ** 0.5 * want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ["SGD", "Signum", "Lion", "Muon"])
def test_momentum_bases_keep_no_step_counter_and_load_older_states(name):
    """SGD, Signum, Lion (and Muon, the SGD direction) keep their moment alone, as torch.optim.SGD and
    torch.optim.Muon do (their directions never read a step). A state dict saved when they still counted steps
    (a ``step`` per parameter) loads without it and continues bit for bit like the run that was not
    interrupted."""
    torch.manual_seed(0)
    init = [torch.randn(6, 4), torch.randn(4)]
    grads = [[torch.randn_like(x) for x in init] for _ in range(5)]

    def run(opt, params, steps):
        for gs in steps:
            for p, g in zip(params, gs):
                p.grad = g.clone()
            opt.step()

    ref_params = [torch.nn.Parameter(x.clone()) for x in init]
    ref = getattr(O, name)(ref_params, lr=1e-2)
    run(ref, ref_params, grads)
    if name == "SGD":
        torch_params = [torch.nn.Parameter(x.clone()) for x in init]
        torch_sgd = torch.optim.SGD(torch_params, lr=1e-2, momentum=0.9)
        run(torch_sgd, torch_params, grads[:1])
    for p in ref_params:
        assert "step" not in ref.state[p]
        if name == "SGD":
            assert ref.state[p].keys() == torch_sgd.state[torch_params[0]].keys()

    a = [torch.nn.Parameter(x.clone()) for x in init]
    opt = getattr(O, name)(a, lr=1e-2)
    run(opt, a, grads[:2])
    saved = opt.state_dict()
    for st in saved["state"].values():  # the older layout
        st["step"] = torch.tensor(2.0)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    resumed = getattr(O, name)(b, lr=1e-2)
    resumed.load_state_dict(saved)
    assert all("step" not in resumed.state[p] for p in b)
    run(resumed, b, grads[2:])
    assert all(torch.equal(p, q) for p, q in zip(b, ref_params))
