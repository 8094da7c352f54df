"""Owner assignment: FLOP formula by hand count, greedy LPT against the brute-force optimum."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from spectrakit.optim.sharding.assign import (
    assign_owners,
    matrix_dims,
    plan_batches,
    plan_sequential,
    rank_loads,
    spectral_flops,
)


def _ns_step_flops_by_hand(m, n):
    """Count one Newton–Schulz quintic step X <- aX + (bA + cA^2) X, A = X X^T on the wide orientation."""
    p, q = min(m, n), max(m, n)
    gram = p * q * p * 2          # (p x q) @ (q x p): p*p outputs, q multiply-adds each
    square = p * p * p * 2        # A @ A
    apply = p * p * q * 2         # (p x p) @ (p x q)
    return gram + square + apply


@pytest.mark.parametrize("shape", [(4, 4), (3, 7), (7, 3), (1, 50), (6, 2, 3, 3), (512, 64)])
@pytest.mark.parametrize("steps", [1, 5])
def test_spectral_flops_matches_hand_count(shape, steps):
    m, n = matrix_dims(shape)
    assert (m, n) == (shape[0], math.prod(shape[1:]))
    assert spectral_flops(shape, steps) == steps * _ns_step_flops_by_hand(m, n)


def _brute_force_makespan(costs, W):
    best = math.inf
    for assignment in itertools.product(range(W), repeat=len(costs)):
        best = min(best, max(rank_loads(costs, assignment, W)))
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("W", [2, 3])
def test_lpt_within_graham_bound_of_brute_force(seed, W):
    rng = random.Random(seed)
    costs = [rng.choice([1, 2, 3, 5, 8, 13, 100]) * rng.random() for _ in range(7)]
    owners = assign_owners(costs, W)
    assert all(0 <= o < W for o in owners)
    makespan = max(rank_loads(costs, owners, W))
    opt = _brute_force_makespan(costs, W)
    assert opt <= makespan <= (4 / 3 - 1 / (3 * W)) * opt + 1e-9
    assert makespan >= max(costs)  # never split a matrix


def test_lpt_known_answers_and_ties():
    assert assign_owners([5, 5, 5, 5], 2) == [0, 1, 0, 1]          # ties: lower index, lower rank
    assert assign_owners([1, 10, 1, 1], 2) == [1, 0, 1, 1]         # the big item alone on rank 0
    assert assign_owners([], 4) == []
    assert assign_owners([3.0, 2.0], 8) == [0, 1]                  # idle ranks beyond the item count
    assert assign_owners([1, 1], 2, initial_loads=[5, 0]) == [1, 1]  # earlier work counted


def test_plan_is_deterministic_and_batches_match_flat():
    shapes = [(3, (16, 16)), (2, (64, 16)), (0, (5, 5)), (4, (8, 32))]
    a, b = plan_batches(shapes, 3), plan_batches(list(shapes), 3)
    assert a == b and [len(x) for x in a] == [3, 2, 0, 4]
    costs = [spectral_flops(s) for k, s in shapes for _ in range(k)]
    assert [o for ob in a for o in ob] == assign_owners(costs, 3)


def test_plan_sequential_carries_loads():
    shapes = [(1, (64, 64)), (3, (8, 8))]
    seq = plan_sequential(shapes, 2)
    assert seq[0] == [0]
    assert seq[1] == [1, 1, 1]  # the small ones go to the idle rank first
    assert plan_sequential([], 2) == []


@pytest.mark.parametrize("call, match", [
    (lambda: assign_owners([1, -1], 2), "costs\\[1\\] must be a finite number >= 0"),
    (lambda: assign_owners([float("nan")], 2), "costs\\[0\\]"),
    (lambda: assign_owners([1], 0), "world_size must be an int in \\[1"),
    (lambda: assign_owners([1], 2, initial_loads=[0]), "initial_loads must have world_size = 2"),
    (lambda: spectral_flops((5,)), "at least 2 dims"),
    (lambda: spectral_flops((5, 5), steps=0), "steps must be an int in \\[1, 1000\\]"),
    (lambda: plan_batches([(-1, (2, 2))], 2), "count must be an int in \\[0"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_type_errors():
    with pytest.raises(TypeError, match="world_size must be an int"):
        assign_owners([1], 2.0)
