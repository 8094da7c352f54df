"""Cost model: published parameter counts, FLOP totals by hand, bytes against an independent replay of the
exchanges with torch.chunk (the live byte counts of real collectives are checked in test_exchange.py)."""

from __future__ import annotations

import math

import pytest
import torch

from spectrakit.distributed.cost_model import (
    LLAMA_CONFIGS,
    engine_bytes,
    exchange_bytes,
    flops_per_rank,
    simulate,
)
from spectrakit.optim.sharding.assign import plan_batches, spectral_flops

# published parameter counts: LLaMA-2-7B 6,738,415,616; TinyLlama-1.1B 1,100,048,384
PUBLISHED = {"llama-7b": 6_738_415_616, "llama-1b": 1_100_048_384}


@pytest.mark.parametrize("name", sorted(LLAMA_CONFIGS))
def test_llama_shapes_match_published_parameter_counts(name):
    cfg = LLAMA_CONFIGS[name]
    total = sum(math.prod(s) for _, s in cfg.matrix_shapes()) + cfg.vector_numel()
    assert total == PUBLISHED[name]


def _replay_fsdp2_sent(shapes, W, elem_bytes=4):
    """Independent replay: cut every matrix with torch.chunk, count what each rank hands to the owner in
    phase 1 and what the owner hands back in phase 2."""
    order = {}
    for s in shapes:
        order[tuple(s)] = order.get(tuple(s), 0) + 1
    batches = [(k, s) for s, k in order.items()]
    owners = plan_batches(batches, W)
    sent = [0] * W
    for (_, s), ob in zip(batches, owners):
        chunks = [c.numel() for c in torch.chunk(torch.empty(s), W, dim=0)]
        chunks += [0] * (W - len(chunks))
        for o in ob:
            for r in range(W):
                if r != o:
                    sent[r] += chunks[r]
                    sent[o] += chunks[r]
    return [v * elem_bytes for v in sent]


SHAPE_SETS = [
    [(16, 16)] * 4 + [(48, 16), (16, 48), (33, 16), (7, 5)],
    [(3, 7), (1, 9), (128, 64)],
    [(2048, 2048)] * 3 + [(5632, 2048)] * 2 + [(2048, 5632)],
]


@pytest.mark.parametrize("shapes", SHAPE_SETS)
@pytest.mark.parametrize("W", [1, 2, 3, 8, 64])
def test_fsdp2_bytes_match_replay(shapes, W):
    got = exchange_bytes(shapes, W, "fsdp2")
    assert got["sent"] == _replay_fsdp2_sent(shapes, W)
    assert got["max_sent"] == max(got["sent"])
    if W > 1:
        assert got["method"] == "all_to_all"


@pytest.mark.parametrize("shapes", SHAPE_SETS)
@pytest.mark.parametrize("W", [2, 3, 8, 64])
def test_ddp_bytes_patterns(shapes, W):
    total = sum(math.prod(s) for s in shapes) * 4
    ag = exchange_bytes(shapes, W, "ddp", replicated_exchange="all_gather")
    bc = exchange_bytes(shapes, W, "ddp", replicated_exchange="broadcast")
    auto = exchange_bytes(shapes, W, "ddp")
    assert bc["sent"] == [total] * W
    assert ag["max_sent"] >= ag["ideal"] - 1e-6       # padding never beats the ideal all-gather
    # per batch "auto" takes the all-gather only while it costs <= 1.25x the broadcasts
    assert auto["max_sent"] <= min(ag["max_sent"], 1.25 * bc["max_sent"]) + 1e-6


def test_ddp_all_gather_by_hand():
    # 4 equal matrices on 2 ranks: 2 each, no padding: each rank sends its 2 matrices once
    got = exchange_bytes([(10, 10)] * 4, 2, "ddp", replicated_exchange="all_gather", elem_bytes=2)
    assert got["sent"] == [2 * 100 * 2] * 2 and got["ideal"] == pytest.approx(0.5 * 400 * 2)
    # 1 matrix on 4 ranks: padded all-gather makes every rank send 3 copies of its (mostly padding) buffer
    assert exchange_bytes([(10, 10)], 4, "ddp", replicated_exchange="all_gather")["max_sent"] == 3 * 100 * 4
    assert exchange_bytes([(10, 10)], 4, "ddp")["method"] == "broadcast"


def test_world_size_one_moves_nothing():
    got = exchange_bytes([(8, 8)] * 3, 1, "ddp")
    assert got["max_sent"] == 0 and got["method"] == "none"


@pytest.mark.parametrize("W", [1, 8, 64, 512])
def test_flops_per_rank_bounds(W):
    shapes = [s for _, s in LLAMA_CONFIGS["llama-1b"].matrix_shapes()]
    f = flops_per_rank(shapes, W)
    assert f["total"] == sum(spectral_flops(s) for s in shapes)
    assert f["ideal"] == pytest.approx(f["total"] / W)
    assert max(f["ideal"], f["largest"]) <= f["max"] + 1e-3
    assert f["speedup"] <= W + 1e-9
    if W == 8:  # plenty of matrices per rank: greedy is within 2% of perfect balance
        assert f["max"] <= 1.02 * f["ideal"]


def test_simulation_table():
    rows = simulate("llama-7b", (8, 64, 512))
    assert [r["ranks"] for r in rows] == [8, 64, 512]
    assert all(r["params (B)"] == 6.738 and r["matrices"] == 226 for r in rows)
    assert rows[0]["max GFLOP/rank"] > rows[1]["max GFLOP/rank"] >= rows[2]["max GFLOP/rank"]
    # FSDP2's exchange shrinks with W, and is a small fraction of FSDP2's own traffic
    assert rows[0]["FSDP2 exch MB/rank"] > rows[2]["FSDP2 exch MB/rank"]
    assert all(r["FSDP2 exch MB/rank"] < 0.1 * r["FSDP2 engine MB/rank"] for r in rows)
    no_emb = simulate("llama-7b", (512,), include_embeddings=False)[0]
    assert no_emb["matrices"] == 224 and no_emb["params (B)"] == 6.738
    assert no_emb["speedup"] > rows[2]["speedup"]  # the embeddings are the indivisible bottleneck


def test_engine_bytes():
    assert engine_bytes(1000, 4, "ddp") == pytest.approx(2 * 0.75 * 1000 * 4)
    assert engine_bytes(1000, 4, "fsdp2", elem_bytes=2) == pytest.approx(3 * 0.75 * 1000 * 2)
    assert engine_bytes(1000, 1) == 0


@pytest.mark.parametrize("call, exc, match", [
    (lambda: exchange_bytes([(4, 4)], 2, "tp"), ValueError, "mode must be one of"),
    (lambda: exchange_bytes([(4, 4)], 0), ValueError, "world_size must be an int in \\[1"),
    (lambda: exchange_bytes([(4, 4)], 2, elem_bytes=0), ValueError, "elem_bytes must be an int in"),
    (lambda: exchange_bytes([(4, 4)], 2, "fsdp2", shard_dim=2), ValueError, "shard_dim must be < 2"),
    (lambda: exchange_bytes([(4, 4)], 2, replicated_exchange="x"), ValueError, "replicated_exchange must be"),
    (lambda: simulate("llama-70b"), ValueError, "config must be one of"),
    (lambda: flops_per_rank([(4,)], 2), ValueError, "at least 2 dims"),
    (lambda: engine_bytes(-1, 2), ValueError, "num_params must be an int in \\[0"),
])
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
