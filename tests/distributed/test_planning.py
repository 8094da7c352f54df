"""How SpectralSharder plans the calls of consecutive optimizer steps (no processes needed: the world size
is patched, planning is pure Python on shapes)."""

from __future__ import annotations

import pytest

import spectrakit.optim.sharding.exchange as ex
from spectrakit.optim.sharding.assign import plan_batches, plan_sequential, rank_loads, spectral_flops


@pytest.fixture
def world3(monkeypatch):
    monkeypatch.setattr(ex, "group_size_rank", lambda group=None: (3, 0))


CALLS = [(4, (16, 16)), (2, (64, 16)), (3, (8, 40)), (2, (500, 64))]  # big matrices come last


def _step(sh, calls):
    sh.reset_loads()
    return [sh.owners([c])[0] for c in calls]


def test_first_step_sequential_then_global_plan(world3):
    sh = ex.SpectralSharder()
    first = _step(sh, CALLS)
    assert first == plan_sequential(CALLS, 3)
    second = _step(sh, CALLS)
    assert second == plan_batches(CALLS, 3)
    assert _step(sh, CALLS) == second  # steady state, cached

    def makespan(plan):
        costs = [spectral_flops(s) for k, s in CALLS for _ in range(k)]
        return max(rank_loads(costs, [o for ob in plan for o in ob], 3))

    assert makespan(second) <= makespan(first)


def test_departing_sequence_falls_back_consistently(world3):
    sh = ex.SpectralSharder()
    _step(sh, CALLS)
    _step(sh, CALLS)
    changed = CALLS[:2] + [(1, (8, 40))] + CALLS[3:]   # e.g. some gradients were None this step
    got = _step(sh, changed)
    full = plan_batches(CALLS, 3)
    assert got[:2] == full[:2]                          # the shared prefix keeps the step plan
    loads = [0.0] * 3
    for (_, s), ob in zip(CALLS[:2], full[:2]):
        for r in ob:
            loads[r] += spectral_flops(s)
    assert got[2] == plan_batches([changed[2]], 3, initial_loads=loads)[0]
    assert all(0 <= o < 3 for ob in got for o in ob)
    # the next step records the new sequence and plans it globally
    assert _step(sh, changed) == plan_batches(changed, 3)


def test_single_process_owner_is_rank_zero():
    sh = ex.SpectralSharder()
    assert sh.world_size == 1 and sh.rank == 0
    assert sh.owners([(3, (4, 4))]) == [[0, 0, 0]]


def test_bad_exchange_name():
    with pytest.raises(ValueError, match="replicated_exchange must be one of"):
        ex.SpectralSharder(replicated_exchange="ring")
