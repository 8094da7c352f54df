"""Bad hyperparameters and gradients: clear errors at construction, skipped steps instead of NaN weights."""

import math

import pytest
import torch

import spectrakit.optim as O

PRESETS = [O.SpectraAdamW, O.SpectraSignum, O.SpectraSGD, O.SpectraAdEMAMix, O.SpectraMARS, O.SpectraLion,
           O.AdamW, O.Signum, O.SGD, O.AdEMAMix, O.MARS, O.Lion, O.Muon, O.DMuon]
IDS = [c.__name__ for c in PRESETS]


def _params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(8, 12)), torch.nn.Parameter(torch.randn(12))]


@pytest.mark.parametrize("cls", PRESETS, ids=IDS)
@pytest.mark.parametrize("key", ["lr", "weight_decay"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_hyperparameters_rejected(cls, key, value):
    with pytest.raises(ValueError, match=key):
        cls(_params(), **{key: value})


@pytest.mark.parametrize("key,value", [("betas", (0.9, math.inf)), ("eps", math.inf), ("c", math.nan),
                                       ("c", -1.0), ("peak_lr", math.inf)])
def test_other_bad_values_rejected(key, value):
    with pytest.raises(ValueError, match=key.split("_")[0]):
        O.SpectraAdamW(_params(), **{key: value})


def test_misspelled_group_key_rejected():
    a, b = _params()
    with pytest.raises(TypeError, match="betaz"):
        O.SpectraAdamW([{"params": [a], "betaz": (0.9, 0.95)}, {"params": [b]}])
    with pytest.raises(TypeError, match="momentun"):
        O.SpectraSGD([{"params": [a], "momentun": 0.9}])


def test_scheduler_keys_and_state_dict_round_trip_still_load():
    a, b = _params()
    opt = O.SpectraAdamW([{"params": [a], "name": "hidden", "initial_lr": 1e-3}, {"params": [b], "lr": 1e-2}])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=10)  # adds max_lr, min_lr, ...
    for _ in range(2):
        (a.sum() + b.sum()).backward()
        opt.step()
        sched.step()
    a2, b2 = _params()
    opt2 = O.SpectraAdamW([{"params": [a2]}, {"params": [b2]}])
    opt2.load_state_dict(opt.state_dict())
    sched2 = torch.optim.lr_scheduler.OneCycleLR(opt2, max_lr=1e-2, total_steps=10)
    sched2.load_state_dict(sched.state_dict())
    opt2.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))], "initial_lr": 1e-3, "max_lr": 1e-2,
                          "min_lr": 0.0})


@pytest.mark.parametrize("cls", PRESETS, ids=IDS)
def test_sparse_gradient_rejected(cls):
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = cls(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match="sparse"):
        opt.step()


@pytest.mark.parametrize("cls", PRESETS, ids=IDS)
def test_huge_finite_gradient_is_skipped_not_nan(cls):
    params = _params()
    opt = cls(params, lr=1e-2)
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, 3e38)
    opt.step()
    assert int(opt.skipped_steps) == 1
    for p, q in zip(params, before):
        assert torch.equal(p.detach(), q)  # the step was a no-op, weights and moments unchanged
    # the optimizer stays usable: an ordinary step afterwards moves the weights and keeps them finite
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert int(opt.skipped_steps) == 1
    assert all(torch.isfinite(p).all() and not torch.equal(p.detach(), q) for p, q in zip(params, before))
    # torch.optim.AdamW, for comparison, keeps finite weights too
    ref = [torch.nn.Parameter(q.clone()) for q in before]
    t = torch.optim.AdamW(ref, lr=1e-2)
    for p in ref:
        p.grad = torch.full_like(p, 3e38)
    t.step()
    assert all(torch.isfinite(p).all() for p in ref)


def test_skipped_step_leaves_state_equal_to_never_taken():
    torch.manual_seed(1)
    a = [torch.nn.Parameter(torch.randn(6, 6))]
    b = [torch.nn.Parameter(a[0].detach().clone())]
    oa, ob = O.SpectraAdamW(a, lr=1e-2), O.SpectraAdamW(b, lr=1e-2)
    g = torch.randn(6, 6)
    a[0].grad = torch.full((6, 6), -3e38)
    oa.step()
    a[0].grad, b[0].grad = g.clone(), g.clone()
    oa.step()
    ob.step()
    assert torch.equal(a[0].detach(), b[0].detach())


def test_c_inf_turns_the_clip_off():
    torch.manual_seed(2)
    w0 = torch.randn(16, 16) * 5
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    spectra = O.SpectraAdamW([a], lr=1e-2, c=math.inf, pre_c=math.inf, scale="none", warmup_steps=3)
    plain = O.AdamW([b], lr=1e-2, weight_decay=0.1, torch_kernel=False)  # the same pipeline, without a clip
    for _ in range(5):
        g = torch.randn(16, 16) * 100
        a.grad, b.grad = g.clone(), g.clone()
        spectra.step()
        plain.step()
    assert torch.equal(a.detach(), b.detach())


def test_load_state_dict_checks_base_post_and_values():
    a, b = _params(), _params()
    src = O.SpectraAdamW(a)
    for p in a:
        p.grad = torch.randn_like(p)
    src.step()
    sd = src.state_dict()
    with pytest.raises(ValueError, match="base='adamw'"):
        O.SpectraSignum(b).load_state_dict(sd)
    with pytest.raises(ValueError, match="post='none'"):
        O.AdamW(b).load_state_dict(sd)
    O.SpectraSignum(b).load_state_dict(sd, allow_changes=True)  # explicit override
    bad = src.state_dict()
    bad["param_groups"][0]["lr"] = -5.0
    with pytest.raises(ValueError, match="lr"):
        O.SpectraAdamW(_params()).load_state_dict(bad)
    bad["param_groups"][0]["lr"] = 1e-3
    bad["param_groups"][0]["post"] = "bogus"
    with pytest.raises(ValueError, match="post"):
        O.SpectraAdamW(_params()).load_state_dict(bad, allow_changes=True)


@pytest.mark.parametrize("cls", PRESETS, ids=IDS)
def test_gradients_at_the_bound_keep_moments_and_updates_finite(cls):
    """The overflow policy's other half: a step is taken when every gradient entry is at most GRAD_BOUND in
    magnitude, and then every base's moments (squares, differences of consecutive gradients, EMAs) and the
    update stay finite, here with gradients of alternating sign exactly at the bound for several steps."""
    from spectrakit.optim.spectra import GRAD_BOUND

    params = _params()
    opt = cls(params, lr=1e-2)
    for k in range(4):
        for p in params:
            p.grad = torch.full_like(p, GRAD_BOUND * (-1) ** k)
        opt.step()
    assert int(opt.skipped_steps) == 0
    assert all(torch.isfinite(p).all() for p in params)
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                assert torch.isfinite(v).all()
