"""SPECTRA, Muon and the plain optimizers as one update pipeline (Jiang, Semenov and Stich 2026).

``pre(grad) -> base direction (with state) -> post-transform -> p <- (1 - lr wd) p - lr alpha post(U)``

- :class:`Spectra`: the pipeline (a ``torch.optim.Optimizer``); parts in :mod:`.bases`,
  :mod:`.transforms` and :mod:`.schedules`.
- Presets (thin subclasses setting ``base``/``post``/``scale`` defaults): ``SpectraAdamW``,
  ``SpectraSignum``, ``SpectraSGD``, ``SpectraAdEMAMix``, ``SpectraMARS``, ``SpectraLion``, and the
  baselines ``AdamW``, ``Signum``, ``SGD``, ``AdEMAMix``, ``MARS``, ``Lion``, ``Muon``, ``DMuon``.
- :func:`param_groups`: the parameter groups of any ``nn.Module`` (which parameters get the spectral update,
  which the AdamW side groups), with a readable summary (:func:`print_param_groups`).
- :mod:`.sharding`: the step for parameters spread over ranks; a plain optimizer given FSDP2 (DTensor)
  parameters takes it by itself (re-exported by :mod:`spectrakit.distributed`). It is loaded on first use
  (it needs DTensor and ``torch._dynamo``, seconds to import), not by ``import spectrakit.optim``.
"""

import importlib

from spectrakit.optim.bases import BASES
from spectrakit.optim.groups import ParamGroups as ParamGroups  # a list of groups, not an optimizer
from spectrakit.optim.groups import param_group_table, param_groups, print_param_groups
from spectrakit.optim.presets import (
    MARS,
    SGD,
    AdamW,
    AdEMAMix,
    DMuon,
    Lion,
    Muon,
    Signum,
    SpectraAdamW,
    SpectraAdEMAMix,
    SpectraLion,
    SpectraMARS,
    SpectraSGD,
    SpectraSignum,
)
from spectrakit.optim.schedules import clip_threshold, make_schedule
from spectrakit.optim.spectra import ParamGroupWarning, Spectra
from spectrakit.optim.transforms import POST_TRANSFORMS, update_scale


def _sharded_class(optimizer_cls: type) -> type:
    """``spectrakit.optim.sharding.sharded(optimizer_cls)``, importing that module on first use."""
    from spectrakit.optim.sharding import sharded

    return sharded(optimizer_cls)


Spectra._sharded_class = staticmethod(_sharded_class)  # FSDP2 parameters in a plain optimizer


def __getattr__(name: str):
    """``spectrakit.optim.sharding`` as an attribute, imported when first asked for."""
    if name == "sharding":
        return importlib.import_module("spectrakit.optim.sharding")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BASES",
    "POST_TRANSFORMS",
    "ParamGroupWarning",
    "Spectra",
    "clip_threshold",
    "make_schedule",
    "param_groups",
    "param_group_table",
    "print_param_groups",
    "update_scale",
    "SpectraAdamW",
    "SpectraSignum",
    "SpectraSGD",
    "SpectraAdEMAMix",
    "SpectraMARS",
    "SpectraLion",
    "AdamW",
    "Signum",
    "SGD",
    "AdEMAMix",
    "MARS",
    "Lion",
    "Muon",
    "DMuon",
]
