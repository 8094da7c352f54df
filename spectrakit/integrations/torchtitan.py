"""spectrakit's optimizers in a torchtitan job, through torchtitan's own optimizer extension point.

torchtitan (Liang et al. 2025, "TorchTitan: One-stop PyTorch native solution for production ready LLM
pre-training") builds the optimizers of a job with ``OptimizersContainer``: each ``ParamGroupConfig`` of the
job's ``optimizer`` config matches parameter names with a regex and names an optimizer; the container looks
the name up in its factory table (``_resolve_optimizer_factory``), batches the groups that share a name into
one optimizer and saves all of them as one flat, name-keyed state dict through ``torch.distributed.checkpoint``.
Subclassing the container (with its own nested ``Config``) is the extension torchtitan documents.

:class:`SpectraOptimizersContainer` is that subclass: its factory table adds every name of :data:`OPTIMIZERS`
(``SpectraAdamW``, ``SpectraSignum``, ``Muon``, ``DMuon``, ... and the generic ``Spectra``) and keeps
torchtitan's own names (``AdamW``, ``Adam``, ``DistMuon``) for the other groups. A group's
``optimizer_kwargs`` are the optimizer's keyword arguments (``lr``, ``c``, ``post``, ``weight_decay``,
``betas``, ...), as they would be given to the class; every spectrakit group of one container step is the
update of Jiang, Semenov and Stich (2026), Alg. 2:

    ``X <- (1 - lr wd) X - lr alpha post(base(g), c)``"""

# torchtitan adds its implementation switches (``fused``/``foreach``, from ``Config.implementation``) to every
# group; they select kernels of ``torch.optim`` and are dropped for spectrakit's groups (which always take
# their own batched step). ``optimizer_factory_kwargs_by_name[name]`` is passed to the class as constructor
# keywords (defaults of every group of that optimizer, e.g. ``max_batch_numel``).
#
# :func:`spectra_optimizers` writes the common config (one spectral group for everything, optionally a
# ``torch.optim.AdamW`` side group for the embeddings, norms and head) as ``default_adamw`` does for AdamW.
#
# torchtitan is optional: this module imports it only when :class:`SpectraOptimizersContainer` or
# :func:`spectra_optimizers` is used, and raises ``ImportError`` naming the install command when it is missing
# (``pip install torchtitan``; torchtitan 0.3 needs Python >= 3.11 and torch >= 2.11).

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from spectrakit._checks import check_choice, check_scalar
from spectrakit.optim import (
    MARS,
    SGD,
    AdEMAMix,
    DMuon,
    Lion,
    Muon,
    ParamGroupWarning,
    Signum,
    Spectra,
    SpectraAdamW,
    SpectraAdEMAMix,
    SpectraLion,
    SpectraMARS,
    SpectraSGD,
    SpectraSignum,
)

INSTALL = "pip install torchtitan"

# optimizer_name -> spectrakit class. spectrakit's plain AdamW is left out: the name "AdamW" stays
# torchtitan's (torch.optim.AdamW), which the side groups of embeddings, norms and head use.
OPTIMIZERS: dict[str, type[Spectra]] = {
    "Spectra": Spectra,
    "SpectraAdamW": SpectraAdamW,
    "SpectraSignum": SpectraSignum,
    "SpectraSGD": SpectraSGD,
    "SpectraAdEMAMix": SpectraAdEMAMix,
    "SpectraMARS": SpectraMARS,
    "SpectraLion": SpectraLion,
    "Muon": Muon,
    "DMuon": DMuon,
    "Signum": Signum,
    "SGD": SGD,
    "AdEMAMix": AdEMAMix,
    "MARS": MARS,
    "Lion": Lion,
}

# keys torchtitan's container adds to every param group (Config.implementation); kernels of torch.optim
IMPLEMENTATION_KEYS = frozenset({"fused", "foreach"})


def build_optimizer(name: str, param_groups: list[dict[str, Any]], **kwargs: Any) -> Spectra:
    """The factory torchtitan calls for ``optimizer_name=name``: ``OPTIMIZERS[name](groups, **kwargs)``.

    Args:
        name: a key of :data:`OPTIMIZERS`.
        param_groups: torchtitan's param-group dicts (``params``, ``param_names``, the group's
            ``optimizer_kwargs``); the implementation keys ``fused``/``foreach`` are dropped.
        kwargs: constructor keywords (``optimizer_factory_kwargs_by_name[name]``), defaults of every group.

    Raises:
        ValueError: unknown ``name``, or a hyperparameter out of range (the class's message, prefixed with
            the optimizer name); TypeError: a keyword the optimizer does not accept.
    """
    check_choice(name, "optimizer_name", OPTIMIZERS)
    groups = [{k: v for k, v in g.items() if k not in IMPLEMENTATION_KEYS} for g in param_groups]
    try:
        with warnings.catch_warnings():
            # torchtitan's convention is one group per optimizer (as its default AdamW); the routing of
            # embeddings, norms and the head is spectra_optimizers(adamw_pattern=...), not param_groups(model)
            warnings.simplefilter("ignore", ParamGroupWarning)
            return OPTIMIZERS[name](groups, **kwargs)
    except (TypeError, ValueError) as e:
        raise type(e)(f"torchtitan optimizer {name!r}: {e}") from e


def _torchtitan_optimizer():
    """torchtitan's ``components.optimizer`` module, or ImportError with the install command."""
    try:
        from torchtitan.components import optimizer
    except ImportError as e:
        raise ImportError(
            f"spectrakit.integrations.torchtitan needs torchtitan (>= 0.3, Python >= 3.11): {INSTALL} "
            f"(import failed: {e})"
        ) from e
    return optimizer


def _materialize_state(opt: Spectra, init_optim_state) -> None:
    """Create the empty state of ``opt`` with torchtitan's ``init_optim_state`` (one step with zero gradients at
    ``lr = 0``: parameters and moments unchanged), then undo that step's counting: the per-group ``steps_taken``
    and ``skipped_steps`` get their earlier values back and each new per-parameter ``step`` is 0."""
    before = [(torch.as_tensor(g["steps_taken"]).clone(), g["skipped_steps"].clone()) for g in opt.param_groups]
    init_optim_state(opt)
    if not opt.state:  # torchtitan left it alone (a gradient was set)
        return
    for group, (steps, skipped) in zip(opt.param_groups, before):
        if isinstance(group["steps_taken"], torch.Tensor):  # a 0-d CPU counter, kept in place
            group["steps_taken"].copy_(steps)
        else:
            group["steps_taken"] = int(steps)
        group["skipped_steps"].copy_(skipped)
    for state in opt.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"].zero_()


@functools.cache
def _container_class() -> type:
    tt = _torchtitan_optimizer()
    from torchtitan.components.optimizer.utils import init_optim_state

    base = tt.OptimizersContainer

    class SpectraOptimizersContainer(base):
        """torchtitan's ``OptimizersContainer`` whose ``optimizer_name`` may also be a spectrakit optimizer
        (:data:`OPTIMIZERS`); build it with ``SpectraOptimizersContainer.Config(param_groups=[...])``
        ``.build(model_parts=[model])``, or put the Config in a job's ``optimizer`` field. Steps, zero_grad,
        the flat state dict and checkpoints are torchtitan's."""

        @dataclass(kw_only=True, slots=True)
        class Config(base.Config):
            """``OptimizersContainer.Config`` (same fields) that builds :class:`SpectraOptimizersContainer`."""

        @staticmethod
        def _resolve_optimizer_factory(name: str):
            if name in OPTIMIZERS:
                return functools.partial(build_optimizer, name)
            try:
                return base._resolve_optimizer_factory(name)
            except NotImplementedError:
                raise ValueError(
                    f"optimizer_name must be one of {sorted(OPTIMIZERS)} or a name torchtitan builds itself "
                    f"(e.g. 'AdamW'), got {name!r}"
                ) from None

        def state_dict(self) -> dict[str, Any]:
            """torchtitan's flat, name-keyed state dict. A spectrakit optimizer that has not stepped yet gets its
            state as torchtitan makes it (one step with zero gradients and ``lr = 0``: parameters and moments
            stay as they are), then its step counters are put back to 0, so saving before the first step
            leaves the run unchanged."""
            for o in self.optimizers:
                if isinstance(o, Spectra) and not o.state:
                    _materialize_state(o, init_optim_state)
            return base.state_dict(self)

    SpectraOptimizersContainer.__module__ = __name__  # found again through the module's __getattr__ (pickle)
    SpectraOptimizersContainer.__qualname__ = "SpectraOptimizersContainer"
    SpectraOptimizersContainer.Config.__module__ = __name__
    SpectraOptimizersContainer.Config.__qualname__ = "SpectraOptimizersContainer.Config"
    return SpectraOptimizersContainer


def spectra_optimizers(
    optimizer: str = "SpectraAdamW",
    *,
    lr: float,
    adamw_pattern: str | None = None,
    adamw_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
):
    """A ``SpectraOptimizersContainer.Config`` for a job's ``optimizer`` field (like torchtitan's
    ``default_adamw``): every trainable parameter in one group of ``optimizer`` with ``lr`` and ``kwargs``
    (e.g. ``c=10.0``, ``post="soft_clip"``, ``weight_decay=0.1``), except, when ``adamw_pattern`` is given,
    the parameters whose names it matches (``re.search``), which go first to a ``torch.optim.AdamW`` group
    with ``adamw_kwargs`` (``lr`` required there; defaults ``betas=(0.9, 0.95)``, ``eps=1e-8``,
    ``weight_decay=0.0``). Muon is meant for hidden matrices (Jordan et al. 2024): give it an
    ``adamw_pattern`` for the embeddings, norms and output head.

    Raises:
        ValueError: ``optimizer`` not in :data:`OPTIMIZERS`, ``lr`` not a number >= 0, ``adamw_kwargs``
            without ``lr`` or given without ``adamw_pattern``; ImportError: torchtitan is not installed.
    """
    check_choice(optimizer, "optimizer", OPTIMIZERS)
    check_scalar(lr, "lr", low=0.0, allow_tensor=False)
    if adamw_pattern is None and adamw_kwargs is not None:
        raise ValueError("adamw_kwargs needs adamw_pattern (the names of the parameters AdamW updates)")
    if adamw_pattern is not None and not isinstance(adamw_pattern, str):
        raise TypeError(f"adamw_pattern must be a regex string, got {type(adamw_pattern).__name__}")
    tt = _torchtitan_optimizer()
    groups = []
    if adamw_pattern is not None:
        side = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, **(adamw_kwargs or {})}
        if "lr" not in side:
            raise ValueError("adamw_kwargs must set 'lr', the learning rate of the AdamW group")
        groups.append(tt.ParamGroupConfig(pattern=adamw_pattern, optimizer_name="AdamW", optimizer_kwargs=side))
    groups.append(tt.ParamGroupConfig(pattern=r".*", optimizer_name=optimizer, optimizer_kwargs={"lr": lr, **kwargs}))
    return _container_class().Config(param_groups=groups)


def __getattr__(name: str):
    # the container subclasses torchtitan's class, so it exists only once torchtitan is imported
    if name == "SpectraOptimizersContainer":
        return _container_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["INSTALL", "OPTIMIZERS", "SpectraOptimizersContainer", "build_optimizer", "spectra_optimizers"]  # noqa: F822 (module __getattr__)
