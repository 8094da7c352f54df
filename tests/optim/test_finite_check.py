"""The eager CPU non-finite check of the step (``Spectra._finite_flag``): per-gradient ``aminmax`` written into a
buffer kept across calls (one per thread, the compiled step's ``spectrakit::grads_within`` kernel uses it too).
Checked against a brute-force float64 oracle (every entry finite and at most ``GRAD_BOUND`` in magnitude, compared
in the gradient's dtype as the check does) on adversarial entries, with the buffer reused across calls whose
gradient count, dtype and verdict change, by several optimizers and by threads checking at the same time."""

from __future__ import annotations

import math
import threading

import pytest
import torch

import spectrakit.optim as O
from spectrakit.optim.opaque import grads_within, grads_within_op
from spectrakit.optim.spectra import GRAD_BOUND

SHAPES = [(7, 5), (), (4,), (3, 2, 2), (1, 1), (64,)]


def _oracle(grads: list[torch.Tensor]) -> float:
    """1.0 iff every entry of every gradient is finite and ``|g| <= GRAD_BOUND`` (the bound rounded to the
    gradient's dtype, as a comparison with a Python number is), entry by entry in float64."""
    for g in grads:
        bound = torch.tensor(GRAD_BOUND, dtype=g.dtype).double().item()
        for x in g.double().reshape(-1).tolist():
            if not math.isfinite(x) or abs(x) > bound:
                return 0.0
    return 1.0


def _adversarial(dtype: torch.dtype) -> list[float]:
    b = torch.tensor(GRAD_BOUND, dtype=dtype)
    above = torch.nextafter(b, torch.tensor(math.inf, dtype=dtype)).item()
    return [math.nan, math.inf, -math.inf, b.item(), -b.item(), above, -above, -0.0,
            torch.finfo(dtype).tiny / 4, torch.finfo(dtype).max, -torch.finfo(dtype).max]


def _opt() -> O.Spectra:
    return O.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_flag_equals_oracle_on_adversarial_entries(dtype):
    """Every adversarial value at the first, a middle and the last entry of each gradient in turn, alternating
    with clean calls (the buffer of the previous verdict must not leak into the next one)."""
    opt = _opt()
    gen = torch.Generator().manual_seed(0)
    clean = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) * 1e3 for s in SHAPES]
    seen = set()
    for value in _adversarial(dtype):
        for i, g in enumerate(clean):
            for pos in sorted({0, g.numel() // 2, g.numel() - 1}):
                grads = [x.clone() for x in clean]
                grads[i].view(-1)[pos] = value
                flag = opt._finite_flag(grads)
                assert flag.dtype == torch.float32 and flag.shape == ()
                assert float(flag) == _oracle(grads), (value, i, pos)
                assert opt._host_finite(grads, None) is (_oracle(grads) == 1.0), (value, i, pos)
                seen.add(float(flag))
                assert float(opt._finite_flag(clean)) == 1.0
    assert seen == {0.0, 1.0}


def test_buffer_follows_changing_gradient_lists():
    """The gradient count and dtype change from call to call (a parameter without a gradient, a new group of
    another dtype): the flag still equals the oracle; mixed dtypes take the stacked form."""
    opt = _opt()
    gen = torch.Generator().manual_seed(1)
    lists = []
    for n in (3, 6, 1, 6, 3):
        for dtype in (torch.float32, torch.float64):
            lists.append([torch.randn(SHAPES[k], generator=gen, dtype=torch.float64).to(dtype) for k in range(n)])
    lists.append([torch.randn(4), torch.randn(3, dtype=torch.float64), torch.randn(2).bfloat16()])
    for k, grads in enumerate(lists * 2):
        if k % 3 == 1:
            grads = [g.clone() for g in grads]
            grads[-1].view(-1)[0] = (math.nan, math.inf, -math.inf, 4 * GRAD_BOUND)[k % 4]
        assert float(opt._finite_flag(grads)) == _oracle(grads), k


def test_threads_and_the_operator_share_no_verdict():
    """Two threads check gradient lists of the same count and dtype (the same key of the kept buffer) at the same
    time, one list clean and one with a NaN, 300 times each, through the eager check and the compiled step's
    operator alternately: every verdict equals the oracle (a buffer shared by the threads would let one thread
    read the other's extremes). Two optimizers in one thread share the buffer and still agree with the oracle."""
    gen = torch.Generator().manual_seed(3)
    clean = [torch.randn(s, generator=gen) for s in SHAPES]
    bad = [g.clone() for g in clean]
    bad[2].view(-1)[1] = math.nan
    opts = [_opt(), _opt()]
    errors: list = []
    start = threading.Barrier(2)

    def run(grads, expected):
        start.wait()
        for k in range(300):
            flag = opts[k % 2]._finite_flag(grads) if k % 3 else grads_within_op(grads, GRAD_BOUND, True).float()
            if float(flag) != expected:
                errors.append((expected, k))

    threads = [threading.Thread(target=run, args=(clean, 1.0)), threading.Thread(target=run, args=(bad, 0.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _oracle(clean) == 1.0 and _oracle(bad) == 0.0
    assert not errors, errors[:5]


def test_buffer_made_under_inference_mode_serves_later_steps():
    """The kept buffer is first made while a step runs under ``torch.inference_mode`` (in a fresh thread: a fresh
    buffer), then serves another optimizer's steps outside it: both steps are taken and the later checks still
    see a NaN (an inference tensor as the buffer would refuse the ``out=`` writes outside inference mode)."""
    results: list = []

    def run():
        try:
            a, b = _opt(), _opt()
            for opt in (a, b):
                opt.param_groups[0]["params"][0].grad = torch.ones(2)
            with torch.inference_mode():
                a.step()
            b.step()
            results.append(float(b._finite_flag([torch.tensor([1.0, math.nan])])))
            results.append(float(b._finite_flag([torch.tensor([1.0, 2.0])])))
        except RuntimeError as e:  # pragma: no cover - the failure this test guards against
            results.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert results == [0.0, 1.0], results


def test_steps_after_a_skip_use_fresh_flags():
    """A skipped step (a nan gradient) followed by clean steps: each clean step moves the parameters, the
    skipped one leaves parameters and momentum exactly as they were, and one skip is counted."""
    gen = torch.Generator().manual_seed(2)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    opt = O.SGD(params, lr=0.1, momentum=0.9)
    for k in range(4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        if k == 1:
            params[3].grad[1, 0, 1] = math.nan
        before = [p.detach().clone() for p in params]
        moments = [opt.state[p]["momentum_buffer"].clone() for p in params] if k else None
        opt.step()
        moved = [not torch.equal(p, b) for p, b in zip(params, before)]
        if k == 1:
            assert not any(moved)
            assert all(torch.equal(opt.state[p]["momentum_buffer"], m) for p, m in zip(params, moments))
        else:
            assert all(moved)
    assert int(opt.skipped_steps) == 1


def test_skip_counter_of_meta_parameters_is_on_the_cpu():
    """The skip counter is made on the parameters' device (see tests/optim/test_fused_cuda.py for CUDA); parameters
    on the meta device (deferred initialisation) get a CPU counter, which ``_init_group`` moves to the gradients'
    device at the first step."""
    opt = O.AdamW([torch.nn.Parameter(torch.empty(4, 3, device="meta"))], lr=1e-3)
    assert opt.param_groups[0]["skipped_steps"].device.type == "cpu"


@pytest.mark.parametrize("per_tensor", [True, False], ids=["aminmax", "multi-tensor inf-norm"])
def test_float16_infinity_fails_the_check(per_tensor):
    """float16 cannot hold the bound (1e18 rounds to inf there), so a comparison with it in float16 passed an
    infinite entry (``inf <= inf``); the largest finite float16 passes."""
    for value, expected in [(math.inf, False), (-math.inf, False), (math.nan, False), (65504.0, True),
                            (-65504.0, True)]:
        grads = [torch.ones(3, dtype=torch.float16), torch.tensor([1.0, value], dtype=torch.float16)]
        assert bool(grads_within(grads, GRAD_BOUND, per_tensor)) is expected, value


@pytest.mark.parametrize("name", ["SGD", "AdamW", "Lion", "Signum", "SpectraAdamW", "Muon"])
@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_float16_parameters_skip_an_infinite_gradient(name, value):
    """End to end: the step with an infinite float16 gradient entry changes no parameter and no state and is
    counted; the next clean step is taken."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).half()) for s in [(8, 4), (4,)]]
    opt = getattr(O, name)(params, lr=1e-2)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).half()
    opt.step()
    before = [p.detach().clone() for p in params]
    states = [{k: v.clone() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)} for p in params]
    params[0].grad.view(-1)[5] = value
    opt.step()
    assert int(opt.skipped_steps) == 1
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert all(torch.equal(opt.state[p][k], v) for p, st in zip(params, states) for k, v in st.items())
    params[0].grad.view(-1)[5] = 0.5
    opt.step()
    assert int(opt.skipped_steps) == 1 and not torch.equal(params[0], before[0])
