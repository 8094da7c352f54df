"""Cost model of the exchange on an N-d mesh (FSDP2 x tensor parallel) against the one-mesh-dim formulas,
a hand count, and 3-D replication (the live byte counts of real collectives on a 2x2 and a 1x2 gloo mesh are
checked in test_tensor_parallel.py)."""

from __future__ import annotations

import pytest

from spectrakit.distributed.cost_model import LLAMA_CONFIGS, exchange_bytes, mesh_exchange, tp_layouts
from spectrakit.optim.sharding.assign import spectral_flops

SHAPES = [(16, 16), (16, 16), (48, 16), (16, 48), (33, 16), (7, 5), (33, 16), (3, 15)]
R, S0 = ("r", -1, 1), ("s", 0, 1)


@pytest.mark.parametrize("W", [1, 2, 3, 4])
def test_one_sharded_mesh_dim_is_the_fsdp2_formula(W):
    want = exchange_bytes(SHAPES, W, "fsdp2")["sent"]
    assert mesh_exchange([(s, (S0, R)) for s in SHAPES], (W, 1))["sent"] == want
    assert mesh_exchange([(s, (R, S0)) for s in SHAPES], (1, W))["sent"] == want
    # a size-1 mesh dim that "shards" holds the whole tensor: the same numbers
    assert mesh_exchange([(s, (S0, S0)) for s in SHAPES], (W, 1))["sent"] == want


@pytest.mark.parametrize("W", [2, 3, 4])
def test_replicated_is_the_ddp_formula(W):
    assert mesh_exchange([(s, (R, R)) for s in SHAPES], (W, 1))["sent"] == exchange_bytes(SHAPES, W, "ddp")["sent"]


def test_hand_count_one_colwise_matrix_on_2x2():
    # one (8, 8) matrix, (_StridedShard(0, 2), Shard(0)): 4 blocks of 16 elements; owner rank 0
    out = mesh_exchange([((8, 8), (("ss", 0, 2), S0))], (2, 2), elem_bytes=2)
    assert out["sent"] == [48 * 2, 16 * 2, 16 * 2, 16 * 2]
    assert out["flops"] == [spectral_flops((8, 8)), 0, 0, 0]
    # uneven: 7 rows, (Shard(0), Shard(0)) on 2x2: 4/3 rows by dp, then 2/2 and 2/1 by tp
    out = mesh_exchange([((7, 3), (S0, S0))], (2, 2))
    assert out["sent"] == [(21 - 6) * 4, 6 * 4, 6 * 4, 3 * 4]


def test_3d_mesh_repeats_the_group_per_replica():
    specs = [(s, (R, ("ss", 0, 2), S0)) for s in SHAPES]
    out = mesh_exchange(specs, (2, 2, 2))
    two_d = mesh_exchange([(s, (("ss", 0, 2), S0)) for s, _ in specs], (2, 2))
    assert out["sent"] == two_d["sent"] * 2
    assert out["flops"] == two_d["flops"] * 2
    assert out["total_flops"] == sum(spectral_flops(s) for s in SHAPES)


def test_llama_7b_plan_balances_work_and_traffic():
    cfg = LLAMA_CONFIGS["llama-7b"]
    for dp, tp in [(2, 2), (4, 1), (1, 4), (8, 8)]:
        out = mesh_exchange(tp_layouts(cfg, dp, tp), (dp, tp))
        assert out["max_flops"] <= 1.2 * out["ideal_flops"]
        total = sum(4 * s[0] * s[1] for s, _ in tp_layouts(cfg, dp, tp))
        W = dp * tp
        assert out["max_sent"] <= 1.2 * 2 * (W - 1) / W ** 2 * total  # the owner-compute ideal


@pytest.mark.parametrize("call, match", [
    (lambda: mesh_exchange([((4, 4), (S0,))], (2, 2)), "one entry per mesh dim"),
    (lambda: mesh_exchange([((4,), (S0, R))], (2, 2)), "at least 2 dims"),
    (lambda: mesh_exchange([((4, 4), (S0, R))], (2, 0)), "mesh_shape entries must be an int in"),
    (lambda: mesh_exchange([((4, 4), (S0, R))], (2, 2), elem_bytes=0), "elem_bytes must be an int in"),
    (lambda: tp_layouts(LLAMA_CONFIGS["llama-1b"], 0, 2), "dp must be an int in"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
