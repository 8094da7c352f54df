"""Replicated (DDP) and sharded (FSDP2) exchanges on 2 and 3 gloo processes against the transform applied
to the whole batch in this process: exact routing (every matrix in its slot, bit for bit), whole-matrix
transforms, uneven/zero-size chunks, 3-D kernels, fp64/fp32/bf16, huge/tiny/zero matrices, non-contiguous
input, and the bytes each collective moved against the cost model."""

from __future__ import annotations

import pytest
import torch

from spectrakit.distributed.cost_model import exchange_bytes
from spectrakit.optim.sharding.layout import chunk_sizes

pytestmark = pytest.mark.distributed

METHODS = ["all_gather", "broadcast", "auto"]


def _tol(dtype):
    return {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]


@pytest.mark.parametrize("method", METHODS)
def test_replicated_routing_is_exact(exchange_results, workers, method):
    ws, res = exchange_results
    xs = workers.exchange_inputs()
    assert res[0]["noncontig"]
    for r in range(ws):
        for b, (out, x) in enumerate(zip(res[r][f"rep_tag_{method}"], xs)):
            ref = workers.tag(b, list(range(x.shape[0])), x)
            assert out.dtype == x.dtype and out.shape == x.shape
            assert torch.equal(out, ref), (r, b)


@pytest.mark.parametrize("method", METHODS)
def test_replicated_whole_matrix_transform(exchange_results, workers, method):
    ws, res = exchange_results
    xs = workers.exchange_inputs()
    for r in range(ws):
        for b, (out, x) in enumerate(zip(res[r][f"rep_whole_{method}"], xs)):
            ref = workers.whole(b, list(range(x.shape[0])), x)
            torch.testing.assert_close(out, ref, rtol=_tol(x.dtype), atol=_tol(x.dtype))
            assert torch.equal(out, res[0][f"rep_whole_{method}"][b])  # identical on every rank


def test_owner_plan_identical_on_ranks_and_uses_all_ranks(exchange_results):
    ws, res = exchange_results
    for method in METHODS:
        plans = [res[r][f"owners_{method}"] for r in range(ws)]
        assert all(p == plans[0] for p in plans)
        assert {o for ob in plans[0] for o in ob} == set(range(ws))


@pytest.mark.parametrize("kind", ["shard_tag", "shard_whole"])
def test_sharded_exchange_matches_chunks_of_whole_result(exchange_results, workers, kind):
    ws, res = exchange_results
    xs = workers.exchange_inputs()
    fn = workers.tag if kind == "shard_tag" else workers.whole
    for b, (x, d) in enumerate(zip(xs, workers.SHARD_DIMS)):
        ref = fn(b, list(range(x.shape[0])), x)
        sizes = chunk_sizes(x.shape[1 + d], ws)
        for r in range(ws):
            want = torch.split(ref, sizes, dim=1 + d)[r]
            got = res[r][kind][b]
            assert got.shape == want.shape, (b, r)
            if kind == "shard_tag":
                assert torch.equal(got, want), (b, r)
            else:
                torch.testing.assert_close(got, want, rtol=_tol(x.dtype), atol=_tol(x.dtype))


def test_zero_size_chunks_are_exercised(exchange_results, workers):
    ws, res = exchange_results
    # (2, 1, 8) sharded on rows: rank 0 holds the row, the others hold (2, 0, 8)
    assert res[ws - 1]["shard_tag"][5].shape == (2, 0, 8)


def test_errors(exchange_results):
    _, res = exchange_results
    assert "rank 0 of" in res[0]["err_local_shape"] and "sharded on dim 0" in res[0]["err_local_shape"]
    assert "fn must return a tensor of the input's shape and dtype" in res[0]["err_fn_dtype"]
    assert "shard_dims[0] must be in [0, 1]" in res[0]["err_shard_dim"]


def test_bytes_moved_match_cost_model(exchange_results):
    ws, res = exchange_results
    shapes = [s for k, s in res[0]["bytes_shapes"] for _ in range(k)]
    ddp = exchange_bytes(shapes, ws, "ddp", replicated_exchange="all_gather")
    fsdp = exchange_bytes(shapes, ws, "fsdp2")
    for r in range(ws):
        assert res[r]["bytes"]["all_gather"] == ddp["sent"][r]
        assert res[r]["bytes"]["all_to_all"] == fsdp["sent"][r]
    assert sum(res[r]["bytes"]["all_to_all"] for r in range(ws)) == sum(fsdp["sent"])
