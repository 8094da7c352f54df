"""The sharded optimizers against the single-process optimizer on the same global batch.

2 gloo processes, ``workers.STEPS`` steps, AdamW / SpectraAdamW / SpectraSignum / Muon under DDP (post-transform split
across ranks, results exchanged) and FSDP2 (DTensor shards, all-to-all to the owner and back), plus HSDP
(2-D mesh), distributed checkpoint -> resume (bit-identical), and the refusals of unsupported layouts.
The reference runs in this process with the plain ``spectrakit.optim`` classes. The distributed runs are two
launches of about the same cost (``optim_results``, ``resume_results``): neither test that starts one waits for
all of them."""

from __future__ import annotations

import os

import pytest
import torch

import spectrakit.optim as O
from spectrakit.distributed import DistributedSpectra, run_workers, sharded

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers.py")

pytestmark = pytest.mark.distributed

NAMES = ["AdamW", "SpectraAdamW", "SpectraSignum", "Muon"]
N_MATRICES = 6  # conv, fc1, fc2, fc3, fc4, out


@pytest.fixture(scope="module")
def optim_results():
    """Per rank: the equivalence runs (DDP, FSDP2, HSDP), the non-finite skip and the refusals."""
    return run_workers(f"{WORKERS}:optim_suite", 2, timeout=150)


@pytest.fixture(scope="module")
def resume_results(tmp_path_factory):
    """Per rank: the compiled sharded step, and the checkpoint -> resume runs."""
    return run_workers(f"{WORKERS}:optim_resume_suite", 2, args=(str(tmp_path_factory.mktemp("dcp")),),
                       timeout=150)


@pytest.fixture(scope="module")
def references(workers):
    refs = {}
    for name in NAMES:
        model = workers.make_model()
        opt = getattr(O, name)(model.parameters(), **workers.OPT_KW[name])
        workers.train_steps(model, opt, 0, workers.STEPS)
        refs[name] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return refs


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
@pytest.mark.parametrize("name", NAMES)
def test_matches_single_process(optim_results, references, name, mode):
    ref = references[name]
    for r in range(2):
        got = optim_results[r][(name, mode)]
        assert set(got) == set(ref)
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=0, atol=1e-5, msg=f"{name} {mode} rank {r} {n}")
            assert torch.equal(got[n], optim_results[0][(name, mode)][n])  # ranks agree bit for bit


def test_fused_weight_split_into_blocks_matches_single_process(workers, optim_results):
    """``split_fused`` on FSDP2 shards: the gathered matrix is transformed block by block, as in one process."""
    model = workers.make_model()
    opt = O.SpectraAdamW(workers.split_groups(model), **workers.OPT_KW["SpectraAdamW"])
    workers.train_steps(model, opt, 0, workers.STEPS)
    plain = workers.make_model()
    workers.train_steps(plain, O.SpectraAdamW(plain.parameters(), **workers.OPT_KW["SpectraAdamW"]), 0,
                        workers.STEPS)
    assert not torch.allclose(model.fc2.weight, plain.fc2.weight, atol=1e-4)  # the split changes the update
    for r in range(2):
        got = optim_results[r][("SpectraAdamW", "fsdp2", "split")]
        for n, p in model.named_parameters():
            torch.testing.assert_close(got[n], p.detach(), rtol=0, atol=1e-5, msg=f"rank {r} {n}")


def test_training_actually_moves_parameters(workers, references):
    init = dict(workers.make_model().named_parameters())
    for name in NAMES:
        assert max((references[name][n] - init[n]).abs().max().item() for n in init) > 1e-3


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
@pytest.mark.parametrize("name", NAMES)
def test_each_matrix_transformed_once_per_step_across_ranks(workers, optim_results, name, mode):
    counts = [optim_results[r][(name, mode, "transformed")] for r in range(2)]
    if name == "AdamW":
        assert counts == [0, 0]
    else:
        per_step = 2 if "pre_c" in workers.OPT_KW[name] else 1  # the pre-clip is sharded too
        assert sum(counts) == per_step * N_MATRICES * workers.STEPS
        assert min(counts) > 0  # the work is split, not repeated


@pytest.mark.parametrize("name", NAMES)
def test_fsdp2_states_are_dtensors(optim_results, name):
    assert "DTensor" in optim_results[0][(name, "fsdp2", "state_types")]


def test_compiled_step_runs_eagerly_with_the_same_numbers(optim_results, resume_results):
    """``torch.compile(opt.step)`` of a sharded optimizer over 4 steps: the step is not traced (it runs
    eagerly, as torch's fused optimizers do): no graph, one skip at the step inside ``torch.optim``'s hook
    wrapper, no recompilation, and the eager step's numbers bit for bit."""
    for r in range(2):
        eager = optim_results[r][("SpectraAdamW", "fsdp2")]
        compiled = resume_results[r][("SpectraAdamW", "fsdp2", "compiled")]
        assert all(torch.equal(compiled[n], eager[n]) for n in eager)
        counters = resume_results[r]["compiled_counters"]
        assert counters.get("stats", {}).get("unique_graphs", 0) == 0, counters
        breaks = counters.get("graph_break", {})
        assert sum(breaks.values()) <= 1, breaks  # the skip (how torch counts it varies by version)
        assert all("ShardedSpectraMixin.step" in k or "disable" in k for k in breaks), breaks
        assert not counters.get("recompiles"), counters


def test_hsdp_2d_mesh_matches_single_process(optim_results, references):
    for r in range(2):
        for n, ref in references["SpectraAdamW"].items():
            torch.testing.assert_close(optim_results[r][("SpectraAdamW", "hsdp")][n], ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["SpectraAdamW", "Muon"])
def test_checkpoint_resume_is_bit_identical(workers, resume_results, name):
    for r in range(2):
        uninterrupted, resumed, control, step, steps_taken = resume_results[r][("ckpt", name)]
        for n in uninterrupted:
            assert torch.equal(uninterrupted[n], resumed[n]), n
        # the control lost the optimizer state at the checkpoint's step: it must differ (the check can fail)
        assert any(not torch.equal(uninterrupted[n], control[n]) for n in uninterrupted)
        assert step == workers.CKPT_STEP and steps_taken == workers.STEPS


def test_nonfinite_gradient_on_one_rank_skips_everywhere(optim_results):
    for r in range(2):
        unchanged, skipped, steps_taken = optim_results[r]["nonfinite_one_rank"]
        assert unchanged and skipped == 1 and steps_taken == 3


def test_given_norm_skips_on_every_rank_or_none(optim_results):
    """``step(grad_norm=...)`` on FSDP2 shards: a rank's own norm, infinite on one rank, skips the step on both
    (the flag is all-reduced); the DTensor norm of ``clip_grad_norm_`` takes it on both."""
    for r in range(2):
        assert optim_results[r][("given_norm", True)][:2] == (True, 2)
        unchanged, skipped, kind = optim_results[r][("given_norm", False)]
        assert not unchanged and skipped == 2 and kind == "DTensor"


@pytest.mark.parametrize("key, expected", [
    ("partial", "unsupported DTensor placement Partial"),
    ("vector_clip", "sharded 1-D parameter: vector_clip needs the norm of the whole vector"),
    ("mars", "base='mars' is not supported under FSDP2"),
    ("bad_exchange", "replicated_exchange must be one of"),
    ("not_spectra", "optimizer_cls must be a subclass of spectrakit.optim.Spectra"),
])
def test_unsupported_layouts_and_options_raise(optim_results, key, expected):
    msg = optim_results[0]["errors"][key]
    assert msg is not None and expected in msg, msg


def test_two_sharded_mesh_dims_accepted(optim_results):
    # (Shard(0), Shard(1)) on a (W, 1) mesh: no longer refused (the size-1 mesh dim holds the whole tensor)
    assert optim_results[0]["errors"]["two_mesh_dims"] is None


def test_pre_clip_and_matrix_vector_clip_accepted_on_shards(optim_results):
    assert optim_results[0]["errors"]["matrix_vector_clip_pre_c_ok"] is None  # no longer refused


def test_wrap_model_modes(optim_results):
    err = optim_results[0]["errors"]
    assert err["fsdp2_wrap"] == [("DTensor", "(Shard(dim=0),)")]
    assert err["ddp_wrap"] == "DistributedDataParallel"
    assert "mode must be one of" in err["bad_mode"]


def test_dtensor_layout_classification(optim_results):
    err = optim_results[0]["errors"]
    assert err["replicate_kind"] == "replicated"
    assert err["shard_kind"] == ("sharded", 0, (4, 6))


# ------------------------------------------------------------------ single process (no process group)

@pytest.mark.parametrize("name", NAMES)
def test_world_size_one_is_bitwise_the_plain_optimizer(workers, name):
    a, b = workers.make_model(), workers.make_model()
    opt_a = getattr(O, name)(a.parameters(), **workers.OPT_KW[name])
    opt_b = sharded(getattr(O, name))(b.parameters(), **workers.OPT_KW[name])
    assert opt_b.world_size == 1
    workers.train_steps(a, opt_a, 0, 5)
    workers.train_steps(b, opt_b, 0, 5)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    sd_a, sd_b = opt_a.state_dict(), opt_b.state_dict()
    for k in sd_a["state"]:
        for key, v in sd_a["state"][k].items():
            assert torch.equal(v, sd_b["state"][k][key])


def test_world_size_one_with_one_matrix_per_batch_is_bitwise_the_plain_optimizer(workers):
    """``max_batch_numel=1``: the two (16, 16) matrices of one shape bucket go in batches of one; the sharded
    class still equals the plain one bit for bit."""
    a, b = workers.make_model(), workers.make_model()
    kw = dict(workers.OPT_KW["SpectraAdamW"], max_batch_numel=1)
    opt_a, opt_b = O.SpectraAdamW(a.parameters(), **kw), sharded(O.SpectraAdamW)(b.parameters(), **kw)
    workers.train_steps(a, opt_a, 0, 3)
    workers.train_steps(b, opt_b, 0, 3)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n


def test_step_hooks_run_once_per_step():
    O.SpectraAdamW([torch.nn.Parameter(torch.randn(2, 2))])  # patches SpectraAdamW.step with torch's hooks
    p = torch.nn.Parameter(torch.randn(4, 4))
    opt = sharded(O.SpectraAdamW)([p])
    calls = []
    opt.register_step_pre_hook(lambda *a: calls.append("pre"))
    opt.register_step_post_hook(lambda *a: calls.append("post"))
    for _ in range(2):
        p.grad = torch.randn(4, 4)
        opt.step()
    assert calls == ["pre", "post", "pre", "post"]
    assert opt.param_groups[0]["steps_taken"] == 2


def test_sharded_class_factory():
    cls = sharded(O.SpectraAdamW)
    assert cls is sharded(O.SpectraAdamW) and cls is sharded(cls)
    assert issubclass(cls, O.SpectraAdamW) and cls.__name__ == "ShardedSpectraAdamW"
    assert issubclass(DistributedSpectra, O.Spectra)
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = DistributedSpectra([p], base="signum", post="orthogonalize", lr=0.1)
    p.grad = torch.randn(4, 3)
    opt.step()
    with pytest.raises(ValueError, match="replicated_exchange must be one of"):
        cls([p], replicated_exchange="nope")
    with pytest.raises(TypeError, match="subclass of spectrakit.optim.Spectra"):
        sharded(int)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_world_size_one_cuda_bitwise(workers, name):
    a, b = workers.make_model().cuda(), workers.make_model().cuda()
    opt_a = getattr(O, name)(a.parameters(), **workers.OPT_KW[name])
    opt_b = sharded(getattr(O, name))(b.parameters(), **workers.OPT_KW[name])
    for s in range(3):
        x, y = workers.batch(s)
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            workers.loss_fn(model, x.cuda(), y.cuda()).backward()
            opt.step()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
