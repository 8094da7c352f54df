"""A loaded optimizer state is checked against the parameters before it is applied: a moment of the wrong shape
(which reached torch's fused kernel and corrupted memory), a missing or extra key, a non-finite moment, a
wrong dtype or a wrong group layout is one ``ValueError`` naming the parameter and key, and the optimizer is
left exactly as it was; through a checkpoint the step folder is reported as unusable and the previous one
is used."""

from __future__ import annotations

import copy
import os

import pytest
import torch

import spectrakit.optim as so
from spectrakit.checkpoint import load, save, write_manifest
from spectrakit.manifold import ManifoldSGD, SpectralBall

PRESETS = [n for n in so.__all__ if isinstance(getattr(so, n), type) and issubclass(getattr(so, n), so.Spectra)
           and n != "Spectra"]


def _trained(cls, steps=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    opt = cls(model.parameters())
    for _ in range(steps):
        model(torch.randn(4, 6)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _mutations(sd):
    """(name, broken state dict, pattern the error must match)."""
    moment = next(k for k in sd["state"][0] if k != "step")
    out = []

    def mutate(name, fn, pattern):
        bad = copy.deepcopy(sd)
        fn(bad)
        out.append((name, bad, pattern))

    mutate("shape", lambda b: b["state"][0].__setitem__(moment, torch.ones(1)),
           rf"parameter 0, key '{moment}': expected shape \(5, 6\), found \(1,\)")
    mutate("transposed", lambda b: b["state"][0].__setitem__(moment, torch.zeros(6, 5)), "expected shape")
    mutate("missing", lambda b: b["state"][0].pop(moment), f"parameter 0: missing key '{moment}'")
    mutate("extra", lambda b: b["state"][2].__setitem__("zzz", torch.ones(3, 5)), "parameter 2: unexpected key 'zzz'")
    mutate("nan", lambda b: b["state"][1][moment].__setitem__(0, float("nan")),
           f"parameter 1, key '{moment}': holds non-finite values")
    mutate("int dtype", lambda b: b["state"][0].__setitem__(moment, torch.zeros(5, 6, dtype=torch.int64)),
           "expected dtype")
    mutate("not a tensor", lambda b: b["state"][0].__setitem__(moment, [0.0] * 30), "expected a tensor")
    mutate("state not a dict", lambda b: b["state"].__setitem__(0, 3), "parameter 0: expected a dict")
    mutate("group size", lambda b: b["param_groups"][0]["params"].pop(), "param group 0 has 3 parameters")
    mutate("no groups", lambda b: b.__setitem__("param_groups", []), "0 param groups")
    if "step" in sd["state"][0]:
        mutate("step", lambda b: b["state"][0].__setitem__("step", torch.tensor(float("inf"))), "key 'step'")
    return out


@pytest.mark.parametrize("name", PRESETS)
def test_a_state_that_does_not_fit_is_refused_and_nothing_changes(name):
    model, opt = _trained(getattr(so, name))
    sd = opt.state_dict()
    before = copy.deepcopy(sd)
    for what, bad, pattern in _mutations(sd):
        with pytest.raises(ValueError, match=pattern):
            opt.load_state_dict(bad)
        after = opt.state_dict()
        assert after["param_groups"] == before["param_groups"], what
        for pid, st in before["state"].items():
            for k, v in st.items():
                assert torch.equal(after["state"][pid][k], v) if torch.is_tensor(v) else after["state"][pid][k] == v
    opt.load_state_dict(sd)  # the good one still loads, and the step runs
    model(torch.randn(4, 6)).square().mean().backward()
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_refused_hyperparameter_leaves_the_optimizer_unchanged():
    _, opt = _trained(so.SpectraAdamW)
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["lr"] = -1.0
    groups = opt.param_groups
    with pytest.raises(ValueError, match="lr"):
        opt.load_state_dict(sd)
    assert opt.param_groups is groups and opt.param_groups[0]["lr"] > 0


def test_parameter_names_appear_in_the_message():
    model = torch.nn.Linear(4, 3)
    opt = so.AdamW([{"params": list(model.parameters()), "param_names": ["weight", "bias"]}])
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][1]["exp_avg_sq"] = torch.zeros(4)
    with pytest.raises(ValueError, match=r"parameter 1 \(bias\) of group 0, key 'exp_avg_sq': expected shape \(3,\)"):
        opt.load_state_dict(sd)


def test_manifold_sgd_checks_its_momentum():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 4))
    opt = ManifoldSGD([w], manifold=SpectralBall(1.0), momentum=0.9)
    w.grad = torch.randn(4, 4)
    opt.step()
    sd = opt.state_dict()
    bad = copy.deepcopy(sd)
    bad["state"][0]["momentum_buffer"] = torch.ones(2)
    with pytest.raises(ValueError, match=r"parameter 0, key 'momentum_buffer': expected shape \(4, 4\)"):
        opt.load_state_dict(bad)
    opt.load_state_dict(sd)


def test_a_checkpoint_with_a_wrong_shaped_state_falls_back(tmp_path, capsys):
    """The wrong shape reaches resume through a re-hashed manifest: the step folder is reported as unusable
    and the previous checkpoint is used (before, AdamW's fused kernel wrote past its buffer)."""
    model, opt = _trained(so.AdamW)
    root = str(tmp_path / "ck")
    save(root, model=model, optimizer=opt, step=1)
    save(root, model=model, optimizer=opt, step=2)
    newest = os.path.join(root, "step_00000002")
    state = torch.load(os.path.join(newest, "state.pt"), weights_only=True)
    state["optimizer"]["state"][0]["exp_avg"] = torch.ones(1)
    torch.save(state, os.path.join(newest, "state.pt"))
    write_manifest(newest, 2)
    model2, opt2 = _trained(so.AdamW, steps=0)
    got = load(root, model=model2, optimizer=opt2)
    assert got["step"] == 1
    assert "key 'exp_avg': expected shape (5, 6), found (1,)" in capsys.readouterr().err
    model2(torch.randn(4, 6)).square().mean().backward()
    opt2.step()


def test_a_nan_tensor_lr_set_later_raises_on_the_cpu():
    """A float NaN lr raised ValueError, a tensor NaN was silently skipped at every step: on the CPU (a read
    that waits for nothing) both raise, naming the group."""
    model = torch.nn.Linear(4, 3)
    opt = so.SpectraAdamW(model.parameters(), lr=torch.tensor(1e-3))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    for bad in (float("nan"), -1.0, float("inf")):
        opt.param_groups[0]["lr"] = torch.tensor(bad)
        with pytest.raises(ValueError, match="param group 0: lr must be"):
            opt.step()
    assert int(opt.param_groups[0]["skipped_steps"]) == 0


def test_lr_skips_count_and_warn_once_per_group():
    """The GPU route (no host read): the device counter, a copy read only once finished, one warning per group
    naming it. Exercised here with CPU tensors (the copy is then ready at once)."""
    import warnings

    from spectrakit.optim.lr_report import LrSkips

    skips = LrSkips()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for flag in (1.0, 0.0, 0.0, 1.0):
            skips.poll("SpectraAdamW")
            skips.add(1, torch.tensor(flag))
            skips.publish()
        skips.poll("SpectraAdamW")
    messages = [str(w.message) for w in seen]
    assert len(messages) == 1 and "param group 1" in messages[0] and "1 step(s)" in messages[0]
    assert skips.totals() == {1: 2}


def test_model_mismatch_names_the_key_and_the_shape(tmp_path):
    from spectrakit.checkpoint import CheckpointError

    model, opt = _trained(so.AdamW, steps=1)
    save(str(tmp_path / "ck"), model=model, optimizer=opt, step=1)
    other = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 3), torch.nn.Linear(3, 3))
    with pytest.raises(CheckpointError) as err:
        load(str(tmp_path / "ck"), model=other)
    text = str(err.value)
    assert "missing key '2.weight' (and 1 more)" in text
    assert "'0.weight' has shape (5, 6) in the checkpoint, (4, 6) in the model" in text
    assert "\n" not in text
