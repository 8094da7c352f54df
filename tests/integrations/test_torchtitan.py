"""spectrakit optimizers inside torchtitan's ``OptimizersContainer`` (spectrakit.integrations.torchtitan).

The container is built through torchtitan's own API (``Config.build(model_parts=...)``, a job config parsed by
torchtitan's ``ConfigManager``, state dicts and DCP checkpoints through its ``CheckpointManager``) on a small
LLaMA on CPU, and compared step by step with the spectrakit optimizer built directly on a copy of the model:
same parameters, same hyperparameters, so the parameters must agree bit for bit. The tests that need
torchtitan skip when it is not installed (``pip install torchtitan``); torchtitan's trainer needs CUDA (its
models import Triton kernels), so no trainer run is here.
"""

from __future__ import annotations

import copy
import importlib
import re
import sys

import pytest
import torch

import spectrakit.integrations.torchtitan as tt_spectra
from spectrakit.models.llama import Llama, LlamaConfig
from spectrakit.optim import DMuon, Muon, Spectra, SpectraAdamW, SpectraSignum

SIDE = r"(^|\.)(embed|head|norm)\.|_norm\.weight$"  # embeddings, norms and head of spectrakit's Llama


def _model(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, max_seq_len=16))


def _batches(n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (2, 16), generator=g) for _ in range(n)]


def _train(model, opt, batches) -> list[float]:
    losses = []
    for x in batches:
        opt.zero_grad()
        _, loss = model(x, x.roll(-1, dims=1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _assert_same_params(a, b) -> None:
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), f"{name}: max difference {(p - q).abs().max().item():.3g}"


# --- without torchtitan -----------------------------------------------------------------------------------


@pytest.fixture
def no_torchtitan(monkeypatch):
    """torchtitan made unimportable (a ``None`` entry in sys.modules makes ``import`` raise ImportError)."""
    for name in [m for m in sys.modules if m == "torchtitan" or m.startswith("torchtitan.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchtitan", None)
    tt_spectra._container_class.cache_clear()
    yield
    tt_spectra._container_class.cache_clear()


def test_missing_torchtitan_names_the_install_command(no_torchtitan):
    mod = importlib.reload(tt_spectra)  # the module itself imports without torchtitan
    assert "SpectraAdamW" in mod.OPTIMIZERS
    with pytest.raises(ImportError, match="pip install torchtitan"):
        mod.SpectraOptimizersContainer
    with pytest.raises(ImportError, match="pip install torchtitan"):
        mod.spectra_optimizers("Muon", lr=0.02)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        mod.Nope


def test_factory_works_without_torchtitan(no_torchtitan):
    """build_optimizer is plain spectrakit: it takes torchtitan-shaped groups (with param_names and the
    implementation keys) and drops only the implementation keys."""
    model = _model()
    names, params = zip(*model.named_parameters())
    opt = tt_spectra.build_optimizer(
        "SpectraSignum", [{"params": list(params), "param_names": list(names), "fused": True, "foreach": False,
                           "lr": 3e-3, "c": 2.0}], max_batch_numel=2**20)
    assert type(opt) is SpectraSignum
    (group,) = opt.param_groups
    assert group["c"] == 2.0 and group["lr"] == 3e-3 and group["max_batch_numel"] == 2**20
    assert "fused" not in group and "foreach" not in group and group["param_names"] == list(names)


@pytest.mark.parametrize(
    "name, kwargs, match, exc",
    [
        ("Adamw", {}, r"optimizer_name must be one of .*'SpectraAdamW'.*got 'Adamw'", ValueError),
        ("SpectraAdamW", {"c": -1.0}, r"torchtitan optimizer 'SpectraAdamW': c must be", ValueError),
        ("Muon", {"lr": float("nan")}, r"torchtitan optimizer 'Muon': lr must be", ValueError),
        ("SpectraSignum", {"betaz": 0.9}, r"torchtitan optimizer 'SpectraSignum': unknown keys \['betaz'\]",
         TypeError),
    ],
)
def test_factory_rejects_bad_input(name, kwargs, match, exc):
    params = [torch.nn.Parameter(torch.randn(4, 3))]
    with pytest.raises(exc, match=match):
        tt_spectra.build_optimizer(name, [{"params": params, "lr": 1e-3, **kwargs}])


# --- with torchtitan --------------------------------------------------------------------------------------


@pytest.fixture
def titan():
    """torchtitan's optimizer module; the test skips when torchtitan is not installed."""
    return pytest.importorskip("torchtitan.components.optimizer", reason="torchtitan is not installed")


def _config(param_groups, **config):
    Config = tt_spectra.SpectraOptimizersContainer.Config
    return Config(param_groups=param_groups, **config)


CASES = {
    # id: (torchtitan param groups, the same optimizers built directly: (class, kwargs, params filter))
    "SpectraAdamW": (
        [("SpectraAdamW", r".*", {"lr": 1e-2, "c": 0.5, "weight_decay": 0.05})],
        [(SpectraAdamW, {"lr": 1e-2, "c": 0.5, "weight_decay": 0.05}, None)],
    ),
    "SpectraSignum-hard-clip": (
        [("SpectraSignum", r".*", {"lr": 3e-3, "c": 0.8, "post": "hard_clip"})],
        [(SpectraSignum, {"lr": 3e-3, "c": 0.8, "post": "hard_clip"}, None)],
    ),
    "Muon+AdamW": (
        [("AdamW", SIDE, {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}),
         ("Muon", r".*", {"lr": 0.02})],
        [(torch.optim.AdamW, {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}, True),
         (Muon, {"lr": 0.02}, False)],
    ),
    "Spectra-Frank-Wolfe": (
        [("Spectra", r".*", {"lr": 1e-2, "base": "signum", "post": "spectral_lmo", "c": 2.0})],
        [(Spectra, {"lr": 1e-2, "base": "signum", "post": "spectral_lmo", "c": 2.0}, None)],
    ),
}


def _direct(model, spec, implementation):
    """The optimizers the container should hold, built directly (same parameter order and keywords)."""
    import re

    side = re.compile(SIDE)
    opts = []
    for cls, kwargs, is_side in spec:
        params = [p for n, p in model.named_parameters() if is_side is None or bool(side.search(n)) == is_side]
        extra = {"fused": implementation == "fused", "foreach": False} if cls is torch.optim.AdamW else {}
        opts.append(cls(params, **kwargs, **extra))
    return opts


class _Many:
    def __init__(self, opts):
        self.opts = opts

    def zero_grad(self):
        for o in self.opts:
            o.zero_grad()

    def step(self):
        for o in self.opts:
            o.step()


@pytest.mark.parametrize("case", list(CASES))
def test_container_steps_equal_the_direct_optimizer(titan, case):
    groups, spec = CASES[case]
    config = _config([titan.ParamGroupConfig(pattern=p, optimizer_name=n, optimizer_kwargs=dict(k))
                         for n, p, k in groups])
    model = _model()
    twin = copy.deepcopy(model)
    start = copy.deepcopy(model)
    opt = config.build(model_parts=[model])
    assert isinstance(opt, titan.OptimizersContainer)
    assert [type(o) for o in opt] == [cls for cls, _, _ in spec]
    for o, (_, kwargs, _) in zip(opt, spec):
        for key, value in kwargs.items():
            assert o.param_groups[0][key] == value, key
    batches = _batches(4)
    losses = _train(model, opt, batches)
    twin_losses = _train(twin, _Many(_direct(twin, spec, config.implementation)), batches)
    assert losses == twin_losses
    _assert_same_params(model, twin)
    moved = [n for (n, p), (_, q) in zip(model.named_parameters(), start.named_parameters()) if not torch.equal(p, q)]
    assert len(moved) == len(list(model.parameters())), "every parameter should have been updated"


def test_unknown_optimizer_name_in_config(titan):
    config = _config([titan.ParamGroupConfig(pattern=r".*", optimizer_name="SpectraAdam",
                                                optimizer_kwargs={"lr": 1e-3})])
    with pytest.raises(ValueError, match=r"optimizer_name must be one of .*got 'SpectraAdam'"):
        config.build(model_parts=[_model()])


def test_config_pickles_and_copies(titan):
    """A job's config is copied and may be pickled (e.g. to other processes): the classes are found again by
    name, through the module's ``__getattr__``."""
    import pickle

    config = tt_spectra.spectra_optimizers("SpectraSignum", lr=3e-3, c=2.0)
    for clone in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config)):
        assert type(clone) is tt_spectra.SpectraOptimizersContainer.Config and clone == config
    container = tt_spectra.SpectraOptimizersContainer
    assert pickle.loads(pickle.dumps(container)) is container


def test_spectra_optimizers_config(titan):
    config = tt_spectra.spectra_optimizers("DMuon", lr=1e-3, adamw_pattern=SIDE, adamw_kwargs={"lr": 2e-3},
                                           weight_decay=0.05)
    assert isinstance(config, titan.OptimizersContainer.Config)
    side, main = config.param_groups
    assert (side.optimizer_name, side.pattern, side.optimizer_kwargs) == (
        "AdamW", SIDE, {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "lr": 2e-3})
    assert (main.optimizer_name, main.pattern, main.optimizer_kwargs) == ("DMuon", r".*", {"lr": 1e-3,
                                                                                           "weight_decay": 0.05})
    opt = config.build(model_parts=[_model()])
    assert [type(o) for o in opt] == [torch.optim.AdamW, DMuon]
    n_side = sum(1 for n, _ in _model().named_parameters() if re.search(SIDE, n))
    assert len(opt.optimizers[0].param_groups[0]["params"]) == n_side == 7  # embed, head, final norm, 4 norms


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"optimizer": "Adam"}, ValueError, r"optimizer must be one of"),
        ({"lr": -1.0}, ValueError, r"lr must be"),
        ({"adamw_kwargs": {"lr": 1e-3}}, ValueError, r"adamw_kwargs needs adamw_pattern"),
        ({"adamw_pattern": SIDE, "adamw_kwargs": {"eps": 1e-6}}, ValueError, r"adamw_kwargs must set 'lr'"),
        ({"adamw_pattern": 3}, TypeError, r"adamw_pattern must be a regex string"),
    ],
)
def test_spectra_optimizers_rejects_bad_input(titan, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        tt_spectra.spectra_optimizers(**{"lr": 1e-3, **kwargs})


def _muon_config():
    return tt_spectra.spectra_optimizers("Muon", lr=0.02, adamw_pattern=SIDE, adamw_kwargs={"lr": 3e-3})


def test_flat_state_dict_round_trip(titan):
    """torchtitan's flat, name-keyed optimizer state (what its checkpoints store) restores the spectrakit
    optimizer: a fresh model and container loaded from it continue exactly like the original."""
    model = _model()
    opt = _muon_config().build(model_parts=[model])
    batches = _batches(5)
    _train(model, opt, batches[:3])
    flat = copy.deepcopy(opt.state_dict())
    assert "state.blocks.0.attn.q_proj.weight.momentum_buffer" in flat or any(
        k.startswith("state.blocks.0.attn.q_proj.weight.") for k in flat)
    assert flat["param_groups.blocks.0.attn.q_proj.weight.post"] == "newton_schulz5"
    resumed = _model(seed=5)
    resumed.load_state_dict(model.state_dict())
    opt2 = _muon_config().build(model_parts=[resumed])
    opt2.load_state_dict(flat)
    assert opt2.optimizers[1].param_groups[0]["steps_taken"] == 3
    assert _train(model, opt, batches[3:]) == _train(resumed, opt2, batches[3:])
    _assert_same_params(model, resumed)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.filterwarnings("ignore:To get the last learning rate:UserWarning")
def test_dcp_checkpoint_through_torchtitan_checkpoint_manager(titan, tmp_path):
    """Save with torchtitan's CheckpointManager (DCP, no process group) after 3 steps, load into a fresh
    model and container, take 2 more steps on both: equal parameters."""
    ckpt = pytest.importorskip("torchtitan.components.checkpoint")
    lr_mod = pytest.importorskip("torchtitan.components.optimizer.lr_scheduler")

    def manager(model, opt):
        cfg = ckpt.CheckpointManager.Config(enable=True, folder="ckpt", interval=1, keep_latest_k=0,
                                            last_save_model_only=False)
        scheds = lr_mod.LRSchedulersContainer(opt, lambda step: 1.0)
        return cfg.build(dataloader=None, model_parts=[model], optimizers=opt, lr_schedulers=scheds, states={},
                         sd_adapter=None, base_folder=str(tmp_path)), scheds

    config = tt_spectra.spectra_optimizers("SpectraAdamW", lr=1e-2, c=0.5)
    model = _model()
    opt = config.build(model_parts=[model])
    mgr, scheds = manager(model, opt)
    batches = _batches(5)
    _train(model, opt, batches[:3])
    assert mgr.save(curr_step=3)
    mgr.close()
    assert (tmp_path / "ckpt" / "step-3").is_dir()

    resumed = _model(seed=7)
    opt2 = config.build(model_parts=[resumed])
    mgr2, _ = manager(resumed, opt2)
    assert mgr2.load(step=3)
    mgr2.close()
    _assert_same_params(model, resumed)
    assert opt2.optimizers[0].param_groups[0]["steps_taken"] == 3
    assert _train(model, opt, batches[3:]) == _train(resumed, opt2, batches[3:])
    _assert_same_params(model, resumed)


JOB_MODULE = '''
from dataclasses import dataclass, field
from torchtitan.components.optimizer import OptimizersContainer, default_adamw
from spectrakit.integrations.torchtitan import spectra_optimizers


@dataclass(kw_only=True)
class Job:
    hf_assets_path: str = "."
    optimizer: OptimizersContainer.Config = field(default_factory=default_adamw)


def spectra_job() -> Job:
    return Job(optimizer=spectra_optimizers("SpectraSignum", lr=3e-3, c=2.0, post="soft_clip"))
'''


def test_job_config_parsed_by_torchtitan_config_manager(titan, tmp_path, monkeypatch):
    """A job's config function (``--module``/``--config``) that sets ``optimizer=spectra_optimizers(...)``, read
    by torchtitan's ConfigManager with a command-line override, builds the spectrakit optimizer."""
    manager = pytest.importorskip("torchtitan.config.manager")
    (tmp_path / "spectrakit_tt_job.py").write_text(JOB_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    job = manager.ConfigManager().parse_args(
        ["--module", "spectrakit_tt_job", "--config", "spectra_job", "--optimizer.implementation", "for-loop"])
    assert type(job.optimizer) is tt_spectra.SpectraOptimizersContainer.Config
    assert job.optimizer.implementation == "for-loop"
    opt = job.optimizer.build(model_parts=[_model()])
    (inner,) = opt.optimizers
    assert type(inner) is SpectraSignum and inner.param_groups[0]["c"] == 2.0


@pytest.mark.parametrize("name", ["SpectraAdamW", "Muon", "SpectraMARS"])
def test_state_dict_before_the_first_step_leaves_the_run_unchanged(titan, name):
    """torchtitan makes missing optimizer state with a zero-gradient, lr = 0 step (its checkpoint reads the
    state dict before training when it saves at step 0); for spectrakit optimizers the counters go back to
    0, so the run continues bit for bit as one that never saved. (torch's AdamW keeps torchtitan's
    ``step = 1``, so the config here has no AdamW group.)"""
    config = tt_spectra.spectra_optimizers(name, lr=1e-2)
    model, twin = _model(), _model()
    opt, twin_opt = config.build(model_parts=[model]), config.build(model_parts=[twin])
    flat = opt.state_dict()
    _assert_same_params(model, twin)
    (spectral,) = opt.optimizers
    assert spectral.param_groups[0]["steps_taken"] == 0 and int(spectral.param_groups[0]["skipped_steps"]) == 0
    assert all(float(s.get("step", 0)) == 0 for s in spectral.state.values())  # (Muon keeps no counter)
    assert flat["param_groups.blocks.0.attn.q_proj.weight.steps_taken"] == 0
    batches = _batches(3)
    assert _train(model, opt, batches) == _train(twin, twin_opt, batches)
    _assert_same_params(model, twin)


def test_state_dict_keeps_counts_of_steps_without_gradients(titan):
    """A step with no gradient at all counts in ``steps_taken`` but creates no state; making the state for a
    state dict afterwards keeps that count (only torchtitan's own zero-gradient step is not counted)."""
    opt = tt_spectra.spectra_optimizers("SpectraAdamW", lr=1e-2).build(model_parts=[_model()])
    opt.step()  # no gradients yet
    (inner,) = opt.optimizers
    assert inner.param_groups[0]["steps_taken"] == 1 and not inner.state
    flat = opt.state_dict()
    assert inner.param_groups[0]["steps_taken"] == 1 and int(inner.param_groups[0]["skipped_steps"]) == 0
    assert flat["param_groups.head.weight.steps_taken"] == 1
    assert all(float(s["step"]) == 0 for s in inner.state.values()) and inner.state
