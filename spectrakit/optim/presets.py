"""Named optimizers: each is :class:`~spectrakit.optim.Spectra` with preset defaults (no copied code).

``SpectraX`` = base X + ``post="soft_clip"`` (c = 10, wd = 0.1, alpha = max(1, sqrt(m/n))), Jiang, Semenov and Stich
2026 §5.
Plain ``X`` = base X + ``post="none"`` (alpha = 1): the published optimizer itself.
``Muon`` = EMA-Nesterov momentum 0.95 + Frobenius-normalised Newton-Schulz quintic (bf16) +
``max(1, m/n)^0.5`` (Jordan et al. 2024), equal to ``torch.optim.Muon``.
``DMuon`` = the same + ``0.2 sqrt(max(m, n))`` (Moonlight, Liu et al. 2025), equal to
``torch.optim.Muon(adjust_lr_fn="match_rms_adamw")``.
Every keyword of :class:`Spectra` (and of the base) can still be passed and overrides the preset;
param groups may override ``base``/``post``/``scale`` (e.g. AdamW for 1-D parameters under Muon).
"""

from __future__ import annotations

from spectrakit.optim.spectra import Spectra


def _preset(name: str, doc: str, **preset):
    def __init__(self, params, **kwargs):
        Spectra.__init__(self, params, **{**preset, **kwargs})

    __init__.__doc__ = f"``{name}(params, **kwargs)``: Spectra with defaults {preset}; kwargs override them."
    return type(
        name, (Spectra,), {"__init__": __init__, "__doc__": doc, "preset": preset, "__module__": __name__}
    )


_SPECTRA = dict(post="soft_clip", weight_decay=0.1, c=10.0)
_SEED = "Jiang, Semenov and Stich 2026 Alg. 2 with this base; arguments, ranges and errors as in :class:`Spectra`."

SpectraAdamW = _preset(
    "SpectraAdamW",
    "SPECTRA-AdamW: ``X <- (1-lr wd) X - lr alpha soft_clip_c(AdamW dir)``. " + _SEED,
    base="adamw",
    **_SPECTRA,
)
SpectraSignum = _preset(
    "SpectraSignum", "SPECTRA-Signum: soft clip of ``sign(m)``. " + _SEED, base="signum", **_SPECTRA
)
SpectraSGD = _preset(
    "SpectraSGD",
    "SGD-momentum with soft spectral clipping (update rule (4)). " + _SEED,
    base="sgd",
    **_SPECTRA,
)
SpectraAdEMAMix = _preset("SpectraAdEMAMix", "SPECTRA-AdEMAMix. " + _SEED, base="ademamix", **_SPECTRA)
SpectraMARS = _preset("SpectraMARS", "SPECTRA-MARS(-AdamW). " + _SEED, base="mars", **_SPECTRA)
SpectraLion = _preset(
    "SpectraLion", "Lion with soft spectral clipping of ``sign(.)``. " + _SEED, base="lion", **_SPECTRA
)

_PLAIN = "Plain optimizer (post='none', alpha = 1), the same pipeline; see :class:`Spectra`."
AdamW = _preset(
    "AdamW",
    "AdamW (Loshchilov & Hutter 2019), equal to torch.optim.AdamW (CPU float32/float64: torch's fused kernel, "
    "bit for bit, see spectrakit.optim.fused; ``check_finite=False`` drops the non-finite check). " + _PLAIN,
    base="adamw",
    post="none",
    weight_decay=1e-2,
)
Signum = _preset(
    "Signum", "Signum (Bernstein et al. 2018). " + _PLAIN, base="signum", post="none", weight_decay=0.0
)
SGD = _preset(
    "SGD",
    "SGD with momentum (torch.optim.SGD rule, decoupled weight decay; CPU float32/float64 without dampening: "
    "torch's fused kernel, see spectrakit.optim.fused). " + _PLAIN,
    base="sgd",
    post="none",
    weight_decay=0.0,
)
AdEMAMix = _preset(
    "AdEMAMix",
    "AdEMAMix (Pagliardini et al. 2024). " + _PLAIN,
    base="ademamix",
    post="none",
    weight_decay=0.0,
)
MARS = _preset("MARS", "MARS-AdamW (Yuan et al. 2024). " + _PLAIN, base="mars", post="none", weight_decay=0.0)
Lion = _preset(
    "Lion", "Lion (Chen et al. 2023). " + _PLAIN, base="lion", post="none", lr=1e-4, weight_decay=0.0
)


_NORMALIZE = {"frobenius": "newton_schulz5", "spectral": "newton_schulz5_spectral"}


def _muon_opts(preset: dict, kwargs: dict) -> dict:
    opts = {**preset, **kwargs}
    normalize = opts.pop("normalize", "frobenius")
    if normalize not in _NORMALIZE:
        raise ValueError(f"normalize must be one of {sorted(_NORMALIZE)}, got {normalize!r}")
    if "post" not in kwargs:
        opts["post"] = _NORMALIZE[normalize]
    return opts


class Muon(Spectra):
    """Muon (Jordan et al. 2024), as published and as ``torch.optim.Muon``:
    ``m <- m + (1-b)(g - m)``, ``U = g + b (m - g)`` (Nesterov), ``X <- (1 - lr wd) X - lr max(1, m/n)^0.5
    NS5(U)`` with ``NS5``: ``U / max(||U||_F, 1e-7)`` then 5 quintic Newton-Schulz steps
    ``(a, b, c) = (3.4445, -4.7750, 2.0315)`` in bfloat16; conv kernels are flattened to ``(out, in k k)``.

    Defaults: lr 0.02 (a number or, as in ``torch.optim.Muon``, a 0-d tensor), momentum 0.95, Nesterov, wd 0,
    ``post_dtype="bfloat16"``. The momentum (base
    ``"ema"``) and the Newton-Schulz output are bit-identical to ``torch.optim.Muon``; the parameter update
    rounds ``lr alpha U`` before adding it (``torch`` fuses ``add(alpha=)``): <= 1 ulp per step, tested to
    2e-6 relative over 50 steps.

    ``normalize="spectral"`` (an option, not Muon) starts the iteration from linalg's spectral-norm bound
    ``U / ||(U U^T)^2||_F^(1/4)`` instead of the Frobenius norm (``post="newton_schulz5_spectral"``): the
    start is closer to ``sigma_max = 1``, so small singular values are amplified more; the NS5 output
    differs from Muon's by 6-40% (relative Frobenius) on Gaussian matrices.
    Muon is meant for hidden matrices: give 1-D parameters, embeddings and the head their own group with
    ``base="adamw", post="none"``. Arguments, ranges and errors as in :class:`Spectra`."""

    preset = dict(
        base="ema",
        scale="muon",
        lr=0.02,
        weight_decay=0.0,
        momentum=0.95,
        nesterov=True,
        post_dtype="bfloat16",
    )

    exact_bf16 = True  # torch.optim.Muon's bf16 Newton-Schulz, also where bf16 matmuls are emulated

    def __init__(self, params, **kwargs):
        super().__init__(params, **_muon_opts(self.preset, kwargs))


class DMuon(Spectra):
    """D-Muon (Moonlight, Liu et al. 2025; ``torch.optim.Muon(adjust_lr_fn="match_rms_adamw")``): Muon's
    update with ``alpha = 0.2 sqrt(max(m, n))`` so the update RMS matches AdamW's, lr 1e-3, wd 0.1
    (defaults of ``torch.optim.Muon``). ``normalize`` as in :class:`Muon`. Give embeddings/head/1-D
    parameters a group with ``base='adamw', post='none'``. Arguments as in :class:`Spectra`."""

    preset = dict(
        base="ema",
        scale="moonlight",
        lr=1e-3,
        weight_decay=0.1,
        momentum=0.95,
        nesterov=True,
        post_dtype="bfloat16",
    )

    exact_bf16 = True

    def __init__(self, params, **kwargs):
        super().__init__(params, **_muon_opts(self.preset, kwargs))
