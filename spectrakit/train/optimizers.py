"""Optimizer registry by name for training runs: ``--optimizers adamw,spectra-adamw,...``.

Each name maps to a class of :mod:`spectrakit.optim` and the paper's reference hyper-parameters
(Jiang, Semenov and Stich 2026, Tables F.9-F.16): AdamW betas (0.8, 0.999); Signum momentum 0.95 with Nesterov;
AdEMAMix betas
(0.9, 0.999, 0.999) and alpha 8; weight decay 0.1 on matrices. ``torch-adamw`` is ``torch.optim.AdamW``
(a reference implementation to compare against).

Parameter groups (:func:`param_groups`): every parameter with ``ndim >= 2`` — attention/MLP matrices and
the untied embedding and head, as in the reference code of Jiang, Semenov and Stich 2026 — gets weight decay and, for
SPECTRA
variants, the post soft spectral clip with ``alpha = max(1, sqrt(m/n))`` (``sqrt(vocab/d)`` for the
embedding/head, reproducing the reference code); 1-D parameters (RMSNorm gains) get no weight decay.
For ``muon``/``dmuon`` the embedding, head and 1-D parameters form groups updated by plain AdamW
(``base="adamw", post="none", scale="none"``, betas (0.8, 0.999), Table F.15), as Muon is meant for hidden
matrices.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import torch
from torch import nn

from spectrakit._checks import check_choice, check_int, check_scalar
from spectrakit.optim.groups import classify
from spectrakit.optim.groups import param_groups as public_param_groups


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """``cls`` is ``"module:Class"``; ``kwargs`` the reference hyper-parameters; ``lr`` the default peak LR
    (a starting point in the range of the paper's sweeps, raised for small models; NOT tuned per optimizer:
    sweep with ``--lr``); ``spectra`` says whether the post soft clip threshold ``c`` applies; ``base``
    names the optimizer it modifies; ``aux_adamw_lr`` (Muon family) the LR of the AdamW group for
    embeddings/head/1-D parameters (0: same as ``lr``)."""

    cls: str
    kwargs: dict
    lr: float
    spectra: bool = False
    base: str | None = None
    aux_adamw_lr: float | None = None


_ADAM = {"betas": (0.8, 0.999)}
_SIGNUM = {"momentum": 0.95, "nesterov": True}
_ADEMAMIX = {"betas": (0.9, 0.999, 0.999), "alpha": 8.0}
_LMO = {"post": "spectral_lmo"}

OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec("spectrakit.optim:AdamW", _ADAM, 3e-3),
    "spectra-adamw": OptimizerSpec("spectrakit.optim:SpectraAdamW", _ADAM, 3e-3, True, "adamw"),
    "signum": OptimizerSpec("spectrakit.optim:Signum", _SIGNUM, 1e-3),
    "spectra-signum": OptimizerSpec("spectrakit.optim:SpectraSignum", _SIGNUM, 1e-3, True, "signum"),
    "ademamix": OptimizerSpec("spectrakit.optim:AdEMAMix", _ADEMAMIX, 3e-3),
    "spectra-ademamix": OptimizerSpec("spectrakit.optim:SpectraAdEMAMix", _ADEMAMIX, 3e-3, True, "ademamix"),
    "mars": OptimizerSpec("spectrakit.optim:MARS", {}, 3e-3),
    "spectra-mars": OptimizerSpec("spectrakit.optim:SpectraMARS", {}, 3e-3, True, "mars"),
    "lion": OptimizerSpec("spectrakit.optim:Lion", {}, 3e-4),
    "spectra-lion": OptimizerSpec("spectrakit.optim:SpectraLion", {}, 3e-4, True, "lion"),
    "muon": OptimizerSpec("spectrakit.optim:Muon", {}, 2e-2, aux_adamw_lr=3e-3),
    "dmuon": OptimizerSpec("spectrakit.optim:DMuon", {}, 3e-3, aux_adamw_lr=0.0),
    "torch-adamw": OptimizerSpec("torch.optim:AdamW", _ADAM, 3e-3),
    # regularised Frank-Wolfe variants of SPECTRA-Signum (Jiang, Semenov & Stich 2026, §3.1; post="spectral_lmo",
    # radius c): b set so that the map is active on the singular values of sign(m) (~1-30 for the small
    # presets); NOT tuned
    "lmo-nuclear-signum": OptimizerSpec("spectrakit.optim:SpectraSignum", {**_SIGNUM, **_LMO, "regularizer": "nuclear",
                                        "b": 4.0}, 1e-3, True, "signum"),
    "lmo-schatten3-signum": OptimizerSpec("spectrakit.optim:SpectraSignum", {**_SIGNUM, **_LMO,
                                          "regularizer": "schatten", "p": 3.0, "b": 0.1}, 1e-3, True, "signum"),
    "lmo-entropy-signum": OptimizerSpec("spectrakit.optim:SpectraSignum", {**_SIGNUM, **_LMO, "regularizer": "entropy",
                                        "b": 4.0}, 1e-3, True, "signum"),
}


def resolve_class(name: str) -> type:
    """The optimizer class registered as ``name``; ``ImportError`` naming the class if it is not available."""
    check_choice(name, "optimizer", OPTIMIZERS)
    mod_name, cls_name = OPTIMIZERS[name].cls.split(":")
    cls = getattr(importlib.import_module(mod_name), cls_name, None)
    if cls is None:
        raise ImportError(
            f"optimizer {name!r} needs {mod_name}.{cls_name}, which this install does not provide"
        )
    return cls


def is_embedding_like(name: str, p: torch.Tensor, model: nn.Module) -> bool:
    """Whether parameter ``name`` is an embedding table (of an ``nn.Embedding``) or the LM output head
    (kinds ``"embedding"``/``"head"`` of :func:`spectrakit.optim.groups.classify`)."""
    return any(q is p and kind in ("embedding", "head") for _, q, kind in classify(model))


def param_groups(model: nn.Module, weight_decay: float, *, split_embeddings: bool = False) -> list[dict]:
    """Parameter groups: matrices (``ndim >= 2``, weight decay ``weight_decay``) and 1-D parameters (no
    decay); with ``split_embeddings`` the embedding/head matrices (:func:`is_embedding_like`) form a third
    group (``"kind": "embedding"``). Tied parameters appear once. Each group carries ``kind``
    (``"matrix"``, ``"embedding"``, ``"vector"``) and ``names`` (parameter names); empty groups are
    dropped. Built with :func:`spectrakit.optim.param_groups`."""
    split = {} if split_embeddings else None
    groups = public_param_groups(model, embeddings=split, head=split, weight_decay=weight_decay)
    return [{**g, "names": ns, "kind": k} for g, k, ns in zip(groups, groups.kinds, groups.names)]


def build_optimizer(
    name: str,
    model: nn.Module,
    *,
    lr: float | None = None,
    weight_decay: float = 0.1,
    c: float = 10.0,
    warmup_steps: int = 0,
    world_size: int = 1,
    embedding_scale: float | None = None,
    **overrides,
) -> torch.optim.Optimizer:
    """Optimizer ``name`` (a key of :data:`OPTIMIZERS`) over :func:`param_groups` of ``model``.

    Args:
        lr: peak learning rate, > 0 (default: the registry's LR for the small presets).
        weight_decay: decoupled weight decay on matrices, >= 0 (paper: 0.1).
        c: SPECTRA post-clip threshold, > 0 (paper default 10); passed only to SPECTRA variants.
        warmup_steps: LR warm-up length, passed to optimizers that take it (SPECTRA's "standard" clip
            schedule ``c_k = c * lr_peak / lr_k`` during warm-up).
        world_size: number of data-parallel ranks, >= 1. When > 1, every :class:`spectrakit.optim.Spectra`
            class (SPECTRA presets, Muon, the plain baselines of the pipeline) is replaced by
            :func:`spectrakit.distributed.sharded` of it: each matrix's spectral transform is computed once
            in the job, and FSDP2 (DTensor) parameters are supported. Build the optimizer after wrapping
            the model (FSDP2 replaces the parameters).
        embedding_scale: SPECTRA variants only: the update scale ``alpha`` of the embedding and head
            (:func:`is_embedding_like`), > 0, in their own parameter group. Default (None): the reference
            code's ``max(1, sqrt(m/n))``, i.e. ``sqrt(vocab/d)`` for a ``(vocab, d)`` table.
        overrides: further keyword arguments for the optimizer class (e.g. ``betas``).

    Keyword arguments the class does not accept are dropped, so one call serves every optimizer.
    Raises ``ValueError`` for an unknown name or out-of-range values, ``ImportError`` when the class is
    missing.
    """
    spec = OPTIMIZERS[check_choice(name, "optimizer", OPTIMIZERS)]
    lr = spec.lr if lr is None else lr
    check_scalar(lr, "lr", low=0, low_inclusive=False, allow_tensor=False)
    check_scalar(weight_decay, "weight_decay", low=0, allow_tensor=False)
    check_scalar(c, "c", low=0, low_inclusive=False, allow_tensor=False)
    check_int(world_size, "world_size", low=1)
    if embedding_scale is not None:
        check_scalar(embedding_scale, "embedding_scale", low=0, low_inclusive=False, allow_tensor=False)
    cls = resolve_class(name)
    if world_size > 1:
        from spectrakit.distributed import sharded
        from spectrakit.optim import Spectra

        if issubclass(cls, Spectra):
            cls = sharded(cls)
    kwargs = {
        **spec.kwargs,
        "lr": lr,
        "weight_decay": weight_decay,
        "warmup_steps": warmup_steps,
        **overrides,
    }
    if spec.spectra:
        kwargs["c"] = c
    accepted = inspect.signature(cls.__init__).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in accepted.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    if spec.aux_adamw_lr is not None:
        route = dict(embeddings="adamw", head="adamw", vectors="adamw", adamw_lr=spec.aux_adamw_lr or lr)
    elif embedding_scale is not None and spec.spectra:
        route = dict(embeddings={"scale": float(embedding_scale)}, head={"scale": float(embedding_scale)})
    else:
        route = {}
    return cls(list(public_param_groups(model, weight_decay=weight_decay, **route)), **kwargs)
