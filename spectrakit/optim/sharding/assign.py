"""Which rank transforms which matrix: spectral FLOP estimates and greedy load balancing.

The spectral post-transform (``msign``, ``soft_clip``, hard clips) of an ``(m, n)`` matrix is a fixed
number of Newton–Schulz-type steps on the wide orientation ``(p, q) = (min(m, n), max(m, n))``. Each
matrix needs the whole matrix, so the unit of work is one matrix; the work is split across ranks by
giving every matrix one *owner* rank (Jiang, Semenov and Stich 2026 §6 lists "efficient distributed spectral clipping"
as
future work; Muon's reference code uses a round-robin, here the split is balanced by FLOPs).

Everything here is pure Python on shapes (no tensors), so every rank computes the same plan without
communicating.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from spectrakit._checks import check_int

Shape = tuple[int, ...]


def matrix_dims(shape: Sequence[int]) -> tuple[int, int]:
    """``(m, n)`` of the matrix view of a parameter: ``(shape[0], prod(shape[1:]))``.

    A conv kernel ``(c_out, c_in, h, w)`` is the matrix ``(c_out, c_in*h*w)``.

    Raises:
        ValueError: if ``shape`` has fewer than 2 dims.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(f"shape must have at least 2 dims (a matrix), got {shape}")
    return shape[0], math.prod(shape[1:])


def spectral_flops(shape: Sequence[int], steps: int = 5) -> int:
    """FLOPs of one polar-factor / spectral-clip transform of a matrix of ``shape``.

    With ``p = min(m, n)``, ``q = max(m, n)`` one odd-quintic Newton–Schulz step ``X <- aX + (bA + cA^2)X``,
    ``A = X X^T`` costs ``2p^2q`` (Gram) ``+ 2p^3`` (``A^2``) ``+ 2p^2q`` (product with X), so

        ``flops = steps * (4 p^2 q + 2 p^3)``.

    The soft clip via the Gram route (Jiang, Semenov and Stich 2026 Alg. 3: 3 square ``p x p`` products per coupled
    step)
    has the same ``O(p^2 q + p^3)`` form; only relative costs matter for load balancing.

    Args:
        shape: parameter shape, at least 2 dims (trailing dims are flattened into ``n``).
        steps: number of iterations, an int in [1, 1000].

    Raises:
        ValueError: for shapes with fewer than 2 dims or ``steps`` out of range.
    """
    check_int(steps, "steps", low=1, high=1000)
    m, n = matrix_dims(shape)
    p, q = min(m, n), max(m, n)
    return steps * (4 * p * p * q + 2 * p ** 3)


def assign_owners(costs: Sequence[float], world_size: int,
                  initial_loads: Sequence[float] | None = None) -> list[int]:
    """Greedy longest-processing-time assignment of work items to ranks.

    Items are visited by decreasing cost (ties: lower index first) and each goes to the rank with the
    smallest load so far (ties: lower rank). The result is deterministic, so every rank derives the same
    plan. The makespan is at most ``4/3 - 1/(3W)`` times the optimum (Graham 1969) and never below the
    largest single item: one matrix is never split, so ranks beyond the number of matrices idle.

    Args:
        costs: non-negative cost per item (e.g. :func:`spectral_flops`).
        world_size: number of ranks, an int ``>= 1``.
        initial_loads: optional cost already on each rank (length ``world_size``), so that consecutive
            calls (one per batch) balance the total; default zeros.

    Returns:
        ``owners[i]`` = rank in ``[0, world_size)`` that processes item ``i``.

    Raises:
        ValueError: for negative or non-finite costs, ``world_size < 1`` or ``initial_loads`` of the wrong
            length.
    """
    check_int(world_size, "world_size", low=1)
    costs = [float(c) for c in costs]
    for i, c in enumerate(costs):
        if not math.isfinite(c) or c < 0:
            raise ValueError(f"costs[{i}] must be a finite number >= 0, got {c}")
    if initial_loads is not None and len(initial_loads) != world_size:
        raise ValueError(f"initial_loads must have world_size = {world_size} entries, "
                         f"got {len(initial_loads)}")
    loads = [0.0] * world_size if initial_loads is None else [float(v) for v in initial_loads]
    owners = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        r = min(range(world_size), key=lambda k: (loads[k], k))
        owners[i] = r
        loads[r] += costs[i]
    return owners


def plan_batches(batch_shapes: Sequence[tuple[int, Shape]], world_size: int,
                 cost: Callable[[Shape], float] = spectral_flops,
                 initial_loads: Sequence[float] | None = None) -> list[list[int]]:
    """Owner rank of every matrix of a list of same-shaped batches.

    Args:
        batch_shapes: ``(count, matrix_shape)`` per batch (``count >= 0`` matrices of that shape).
        world_size: number of ranks, an int ``>= 1``.
        cost: cost of one matrix of a given shape (default :func:`spectral_flops`).
        initial_loads: cost already on each rank (see :func:`assign_owners`).

    Returns:
        ``owners[b][i]``: rank that transforms matrix ``i`` of batch ``b``.

    Raises:
        ValueError: for a negative count, or what :func:`assign_owners` raises.
    """
    costs, index = [], []
    for b, (count, shape) in enumerate(batch_shapes):
        check_int(count, f"batch_shapes[{b}] count", low=0)
        c = cost(tuple(shape))
        for i in range(count):
            costs.append(c)
            index.append((b, i))
    flat = assign_owners(costs, world_size, initial_loads)
    owners = [[0] * count for count, _ in batch_shapes]
    for (b, i), r in zip(index, flat):
        owners[b][i] = r
    return owners


def plan_sequential(batch_shapes: Sequence[tuple[int, Shape]], world_size: int,
                    cost: Callable[[Shape], float] = spectral_flops) -> list[list[int]]:
    """Owners when the batches are planned one call at a time, each on top of the loads of the earlier
    ones — what the distributed optimizer does (one post-transform call per batch, in order). Arguments,
    result and errors as in :func:`plan_batches`."""
    check_int(world_size, "world_size", low=1)
    loads = [0.0] * world_size
    owners = []
    for count, shape in batch_shapes:
        ob = plan_batches([(count, shape)], world_size, cost, loads)[0]
        c = cost(tuple(shape))
        for r in ob:
            loads[r] += c
        owners.append(ob)
    return owners


def rank_loads(costs: Sequence[float], owners: Sequence[int], world_size: int) -> list[float]:
    """Total cost per rank for a given assignment (``loads[r] = sum of costs[i] with owners[i] == r``)."""
    check_int(world_size, "world_size", low=1)
    loads = [0.0] * world_size
    for c, r in zip(costs, owners):
        loads[r] += float(c)
    return loads
