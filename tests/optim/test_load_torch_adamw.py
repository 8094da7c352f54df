"""A torch.optim.AdamW state dict loads into SpectraAdamW: with the identity post-transform the run continues
exactly as torch's AdamW (the oracle), with the soft clip the schedule continues at the saved step; other
foreign states give a ValueError that says how to convert."""

from __future__ import annotations

import pytest
import torch

from spectrakit.optim import SpectraAdamW, SpectraSignum


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _steps(model, opt, n, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


def test_adamw_state_continues_as_torch_adamw():
    ref, mine = _model(), _model()
    kw = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), **kw)
    _steps(ref, ref_opt, 3, seed=1)
    mine.load_state_dict(ref.state_dict())
    opt = SpectraAdamW(mine.parameters(), lr=1.0, post="none", weight_decay=0.0)  # lr/wd come from the state
    opt.load_state_dict(ref_opt.state_dict())
    g = opt.param_groups[0]
    assert g["lr"] == 1e-2 and g["weight_decay"] == 0.1 and g["betas"] == (0.8, 0.99) and g["steps_taken"] == 3
    assert int(opt.skipped_steps) == 0
    _steps(ref, ref_opt, 3, seed=2)
    _steps(mine, opt, 3, seed=2)
    for a, b in zip(ref.parameters(), mine.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_adamw_state_into_soft_clip_resumes_schedule():
    ref = _model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    _steps(ref, ref_opt, 5, seed=1)
    opt = SpectraAdamW(ref.parameters(), lr=1e-2, c=1.0, warmup_steps=10)
    opt.load_state_dict(ref_opt.state_dict())
    assert opt.param_groups[0]["steps_taken"] == 5 and opt.param_groups[0]["post"] == "soft_clip"
    _steps(ref, opt, 2, seed=3)
    assert opt.param_groups[0]["steps_taken"] == 7


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.AdamW(ps, lr=0.1, amsgrad=True),
])
def test_other_foreign_states_say_how(make):
    m = _model()
    other = make(m.parameters())
    _steps(m, other, 1, seed=1)
    with pytest.raises(ValueError, match="torch.optim.AdamW"):
        SpectraAdamW(m.parameters()).load_state_dict(other.state_dict())
    adamw = torch.optim.AdamW(m.parameters())
    _steps(m, adamw, 1, seed=1)
    with pytest.raises(ValueError, match="base='adamw'"):
        SpectraSignum(m.parameters()).load_state_dict(adamw.state_dict())
