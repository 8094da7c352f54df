"""FSDP2 x tensor parallel on gloo against one process: a tiny LLaMA (workers_tp.py) trained 20 steps with
the PLAIN presets SpectraAdamW, SpectraSignum, Muon and a Frank-Wolfe post (``spectral_lmo``) on a 2x2
(dp x tp) mesh and a 1x2 (tensor parallel only) mesh; and a checkpoint carried across mesh shapes
2x2 -> 4x1 -> one process -> 2x2.

Precision: parameters within 1e-5 of the one-process run (float32; the tensor-parallel forward sums in
another order), SpectraSignum in float64 within 1e-10 (its sign-based update turns float32 rounding into
sign flips, see workers_tp.DTYPE); every rank holds the same numbers bit for bit. The Frank-Wolfe run also
pre-clips the raw gradient through the block exchange.

Each launch starts 2-4 processes and trains several optimizers (minutes on a loaded 2-core machine):
soak tier."""

from __future__ import annotations

import os

import pytest
import torch

import spectrakit.optim as O
from spectrakit.distributed.launch import run_workers

pytestmark = [pytest.mark.distributed, pytest.mark.soak]

HERE = os.path.dirname(os.path.abspath(__file__))
TP = os.path.join(HERE, "workers_tp.py")
ATOL = {"SpectraSignum": 1e-10}


@pytest.fixture(scope="session")
def tp(load_module):
    return load_module("_spectrakit_test_workers_tp", TP)


@pytest.fixture(scope="session")
def tp_references(tp):
    refs = {}
    for name in tp.OPT_KW:
        model = tp.make_llama(dtype=tp.DTYPE.get(name, torch.float32))
        tp.train_steps(model, getattr(O, name)(model.parameters(), **tp.OPT_KW[name]), 0, tp.STEPS)
        refs[name] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return refs


@pytest.fixture(scope="session", params=[(2, 2), (1, 2)], ids=["2x2", "1x2"])
def tp_results(request):
    shape = request.param
    return shape, run_workers(f"{TP}:tp_suite", shape[0] * shape[1], args=(shape,), timeout=1200)


@pytest.mark.parametrize("name", ["SpectraAdamW", "SpectraSignum", "Muon", "Spectra"])
def test_tensor_parallel_matches_single_process(tp, tp_results, tp_references, name):
    shape, res = tp_results
    ref = tp_references[name]
    init = dict(tp.make_llama().named_parameters())
    assert max((ref[n].float() - init[n]).abs().max().item() for n in ref) > 1e-2  # training moved them
    for r, out in enumerate(res):
        assert out[(name, "sharded_path")]  # the plain preset switched to the sharded step by itself
        assert set(out[name]) == set(ref)
        for n in ref:
            torch.testing.assert_close(out[name][n], ref[n], rtol=0, atol=ATOL.get(name, 1e-5),
                                       msg=f"{shape} {name} rank {r} {n}")
            assert torch.equal(out[name][n], res[0][name][n])


def test_tensor_parallel_layouts(tp_results):
    shape, res = tp_results
    lay = res[0]["layouts"]
    colwise, rowwise = lay["blocks.0.mlp.gate_proj.weight"], lay["blocks.0.mlp.down_proj.weight"]
    assert "Shard(dim=1)" in rowwise[0] and "_StridedShard" in colwise[0]  # FSDP2 on a TP module
    if shape == (2, 2):  # two sharding mesh dims: the block exchange
        assert colwise[1] == rowwise[1] == lay["head.weight"][1] == lay["embed.weight"][1] == "blocks"
        assert lay["blocks.0.attn.q_proj.weight"][1] == "sharded"  # FSDP2 only
    else:  # the data-parallel mesh dim has size 1: a one-dim shard on the tensor-parallel ranks
        assert colwise[1] == rowwise[1] == "sharded"
        assert lay["blocks.0.attn.q_proj.weight"][1] == "replicated"
    for r in range(len(res)):  # the computed blocks are the DTensors' local tensors
        assert all(res[r]["blocks_match_local"].values()), res[r]["blocks_match_local"]


def _close(a: dict, b: dict, atol: float, what: str) -> None:
    assert set(a) == set(b), what
    for k in a:
        if torch.is_tensor(a[k]):
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=f"{what} {k}")
        else:
            assert a[k] == b[k], (what, k)


def test_checkpoint_reshards_across_mesh_shapes(tp, tmp_path):
    """2x2 -> 4x1 -> one process -> 2x2, 6 steps each: the loaded model, optimizer state and step counter
    equal what was saved (exactly), and the run ends where one uninterrupted process does."""
    from spectrakit.distributed.checkpoint import load_checkpoint, save_checkpoint

    cls, kw = getattr(O, tp.CKPT_OPT), tp.OPT_KW[tp.CKPT_OPT]
    ck = [str(tmp_path / f"ck{i}") for i in range(4)]
    a = run_workers(f"{TP}:ckpt_suite", 4, args=((2, 2), None, ck[0], 0, 6), timeout=1200)
    b = run_workers(f"{TP}:ckpt_suite", 4, args=((4, 1), ck[0], ck[1], 6, 12), timeout=1200)
    assert b[0]["loaded_step"] == 6
    _close(b[0]["loaded_params"], a[0]["saved_params"], 0, "params 2x2 -> 4x1")
    _close(b[0]["loaded_state"], a[0]["saved_state"], 0, "optimizer 2x2 -> 4x1")
    # one process, no process group
    model = tp.make_llama(seed=1)
    opt = cls(model.parameters(), **kw)
    extra = load_checkpoint(ck[1], model, opt, extra={"step": torch.tensor(0)})
    assert int(extra["step"]) == 12
    _close(tp.full_params(model), b[0]["saved_params"], 0, "params 4x1 -> 1")
    _close(tp.full_state(opt, model), b[0]["saved_state"], 0, "optimizer 4x1 -> 1")
    tp.train_steps(model, opt, 12, 18)
    save_checkpoint(ck[2], model, opt, extra={"step": torch.tensor(18)})
    c = run_workers(f"{TP}:ckpt_suite", 4, args=((2, 2), ck[2], ck[3], 18, 24), timeout=1200)
    assert c[0]["loaded_step"] == 18
    _close(c[0]["loaded_params"], tp.full_params(model), 0, "params 1 -> 2x2")
    _close(c[0]["loaded_state"], tp.full_state(opt, model), 0, "optimizer 1 -> 2x2")
    ref = tp.make_llama()
    tp.train_steps(ref, cls(ref.parameters(), **kw), 0, 24)
    _close(c[0]["saved_params"], {n: p.detach() for n, p in ref.named_parameters()}, 1e-5, "after 24 steps")


def test_exchange_bytes_match_cost_model(tp_results):
    from spectrakit.distributed.cost_model import mesh_exchange

    shape, res = tp_results
    pred = mesh_exchange(res[0]["specs"], shape)
    measured = [out["bytes"] for out in res]
    assert measured == pred["sent"], (measured, pred["sent"])
    assert all(out["specs"] == res[0]["specs"] for out in res)


@pytest.fixture(scope="session")
def hsdp_tp_results():
    return run_workers(f"{TP}:tp_suite", 8, args=((2, 2, 2), ("SpectraAdamW",)), timeout=1800)


def test_hsdp_x_tp_3d_mesh(tp, hsdp_tp_results, tp_references):
    """8 processes as (replicate 2, shard 2, tp 2): HSDP x TP. The flattened sharding group of a TP matrix is
    the (shard, tp) slice of each replica; 20 SpectraAdamW steps give the one-process parameters."""
    from spectrakit.distributed.cost_model import mesh_exchange

    res, ref = hsdp_tp_results, tp_references["SpectraAdamW"]
    assert res[0]["layouts"]["blocks.0.mlp.gate_proj.weight"][1] == "blocks"
    assert "Replicate()" in res[0]["layouts"]["blocks.0.mlp.gate_proj.weight"][0]
    for r, out in enumerate(res):
        assert out[("SpectraAdamW", "sharded_path")] and all(out["blocks_match_local"].values())
        for n in ref:
            torch.testing.assert_close(out["SpectraAdamW"][n], ref[n], rtol=0, atol=1e-5, msg=f"rank {r} {n}")
            assert torch.equal(out["SpectraAdamW"][n], res[0]["SpectraAdamW"][n])
    assert [out["bytes"] for out in res] == mesh_exchange(res[0]["specs"], (2, 2, 2))["sent"]
