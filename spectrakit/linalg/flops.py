"""Matmul FLOP counts (2 per multiply-add) of the algorithms in :mod:`spectrakit.linalg`, per matrix.

They count exactly the matrix products the implementations issue (element-wise work is ignored), so
``flops / time`` is the achieved matmul throughput. ``m x n`` is the input shape; tall inputs are
transposed to wide first, so only ``(min, max)`` matters.
"""

from __future__ import annotations

import torch

from .polar import CLIP_LOWER_BOUND as HARD_LOWER_BOUND
from .polar import CLIP_TOL as HARD_TOL
from .polar import DEFAULT_TOL, safety_for
from .schedules import steps_for
from .soft_clip import BF16_DEFAULT_STEPS, DEFAULT_STEPS, tall_steps


def _wide(m: int, n: int) -> tuple[int, int]:
    return (m, n) if m <= n else (n, m)


def gram_flops(m: int, n: int) -> float:
    """``G = X X^T`` in the wide orientation: ``2 m^2 n``."""
    m, n = _wide(m, n)
    return 2.0 * m * m * n


def msign_flops(m: int, n: int, steps: int) -> float:
    """Quintic iteration ``X <- a X + (b A + c A^2) X``: per step ``A`` (2m^2n), ``A^2`` (2m^3),
    ``(.) X`` (2m^2n)."""
    m, n = _wide(m, n)
    return steps * (4.0 * m * m * n + 2.0 * m**3)


def msign_default_steps(m: int, n: int, dtype: torch.dtype, lower_bound: float = 1e-3) -> int:
    """Steps :func:`spectrakit.linalg.msign` uses by default (polar_express schedule)."""
    m, _ = _wide(m, n)
    return steps_for(lower_bound * m ** (-1 / 8), DEFAULT_TOL[dtype], safety=safety_for(dtype))


def soft_clip_newton_schulz_flops(m: int, n: int, steps: int = 10) -> float:
    """Jiang, Semenov and Stich 2026 Alg. 1 + 3: ``G`` (2m^2n), ``steps x 3`` products ``m^3`` (2m^3 each), final ``Z
    X``
    (2m^2n)."""
    m, n = _wide(m, n)
    return 4.0 * m * m * n + steps * 6.0 * m**3


# Dense matmul throughput of one H100 SXM (TFLOP/s, spec sheet, dense): bf16 tensor cores, TF32 tensor
# cores, fp32 without tensor cores (torch's default for fp32 matmul), fp64 tensor cores.
H100_TFLOPS = {torch.bfloat16: 990.0, "tf32": 495.0, torch.float32: 67.0, torch.float64: 67.0}


def soft_clip_polar_flops_by_dtype(m: int, n: int, dtype: torch.dtype = torch.float32,
                                   steps: int | None = None) -> dict:
    """Matmul FLOPs of :func:`spectrakit.linalg.soft_clip` (polar route), split by the dtype each product
    runs in: ``{torch.float32: ..., torch.bfloat16: ...}`` (fp32/fp64 compute: one entry).

    Per step (``mmn = 2 m^2 n``, ``m3 = 2 m^3``): step 0 ``G``, ``G^2``, ``Y P``: ``2 mmn + m3``. Tall steps:
    ``Y^T Y``, ``Z^T Z``, ``G^2``, ``Z P``, ``Y P``: ``2 mmn + 3 m3``. Switch to the Gram phase: ``G`` from
    the tall matrix (``mmn + m3``). Gram steps: ``G^2`` (m3), ``R P`` (m3, not on the first), ``P G P``
    (2 m3, not on the last). Output ``Y R`` (mmn). With bf16 every step is tall and the first
    ``BF16_FP32_STEPS`` (3) run in fp32; the Gram-phase products of fp32/fp64 run in that dtype.
    """
    from .soft_clip import BF16_FP32_STEPS

    m, n = _wide(m, n)
    if steps is None:
        steps = BF16_DEFAULT_STEPS if dtype == torch.bfloat16 else DEFAULT_STEPS
    mmn, m3 = 2.0 * m * m * n, 2.0 * m**3
    tall = tall_steps(dtype, steps)
    per_step = []
    for t in range(tall):
        per_step.append(2 * mmn + (m3 if t == 0 else 3 * m3))
    gram = steps - tall
    if gram > 0:
        per_step[-1] += mmn + m3  # switch (charged to the last tall step's dtype)
        for g in range(gram):
            per_step.append(m3 + (m3 if g > 0 else 0.0) + (2 * m3 if g < gram - 1 else 0.0))
        per_step[-1] += mmn  # output Y R
    out: dict = {}
    for t, f in enumerate(per_step):
        dt = dtype if (dtype != torch.bfloat16 or t >= BF16_FP32_STEPS) else torch.float32
        out[dt] = out.get(dt, 0.0) + f
    return out


def soft_clip_fast_flops_by_dtype(m: int, n: int, steps: int | None = None,
                                  dtype: torch.dtype = torch.float32) -> dict:
    """Matmul FLOPs of the fast Gram-only route ``soft_clip(X, c, tall_steps=0)``, as ``{dtype: flops}``.

    ``G = X X^T + c^2 I`` (mmn = 2 m^2 n) and ``G^2`` (m3 = 2 m^3); step 0: ``P G P`` (2 m3); middle steps:
    ``G^2``, ``R P``, ``P G P`` (4 m3); last step: ``G^2``, ``R P`` (2 m3); output ``Y R`` (mmn). Total
    ``2 mmn + (4 steps - 3) m3`` (default 6 steps: ``4 m^2 n + 42 m^3``, below the paper's
    ``4 m^2 n + 60 m^3``). Every product runs in the compute dtype (fp32 or fp64): one entry.
    """
    from .soft_clip import FAST_STEPS

    m, n = _wide(m, n)
    steps = FAST_STEPS if steps is None else steps
    mmn, m3 = 2.0 * m * m * n, 2.0 * m**3
    per_step = []
    for t in range(steps):
        f = (m3 if t > 0 else 0.0) + (m3 if t > 0 else 0.0) + (2 * m3 if t < steps - 1 else 0.0)
        per_step.append(f)
    per_step[0] += mmn + m3
    per_step[-1] += mmn  # output Y R
    return {dtype: sum(per_step)}


def soft_clip_polar_flops(m: int, n: int, dtype: torch.dtype = torch.float32,
                          steps: int | None = None) -> float:
    """Total matmul FLOPs of the stacked polar route of :func:`spectrakit.linalg.soft_clip` (the sum of
    :func:`soft_clip_polar_flops_by_dtype`); default steps 9 (7 with bf16, all on the tall matrix)."""
    return sum(soft_clip_polar_flops_by_dtype(m, n, dtype, steps).values())


def model_time_s(flops_by_dtype: dict, tflops: dict | None = None, *, fp32_as: str | torch.dtype = torch.float32,
                 ) -> float:
    """Time (s) of a FLOP split on a device whose per-dtype matmul throughput is ``tflops`` (default
    :data:`H100_TFLOPS`); ``fp32_as="tf32"`` charges fp32 products at the TF32 rate (only valid when the
    caller enables TF32, which changes the accuracy). Ignores element-wise work and launch overhead."""
    rates = H100_TFLOPS if tflops is None else tflops
    total = 0.0
    for dt, f in flops_by_dtype.items():
        key = fp32_as if dt == torch.float32 else dt
        total += f / (rates[key] * 1e12)
    return total


def soft_clip_vs_paper_model(m: int, n: int, dtype: torch.dtype = torch.bfloat16,
                             tflops: dict | None = None) -> dict:
    """Dtype-weighted cost model of our soft clip against the paper's Newton–Schulz (all products in
    ``dtype``, 10 steps): FLOP ratio and modelled time ratio (fp32 at the non-tensor rate and at TF32)."""
    ours = soft_clip_polar_flops_by_dtype(m, n, dtype)
    paper = {dtype: soft_clip_newton_schulz_flops(m, n)}
    out = {"flops_ratio": sum(ours.values()) / paper[dtype]}
    for name, as_ in (("time_ratio_fp32", torch.float32), ("time_ratio_tf32", "tf32")):
        out[name] = model_time_s(ours, tflops, fp32_as=as_) / model_time_s(paper, tflops, fp32_as=as_)
    if dtype == torch.bfloat16:
        # candidate (not shipped): the fp32 steps as 3 bf16 products of hi/lo splits, fp32 accumulation
        split = {torch.bfloat16: ours.get(torch.bfloat16, 0.0) + 3 * ours.get(torch.float32, 0.0)}
        out["time_ratio_split_bf16"] = model_time_s(split, tflops) / model_time_s(paper, tflops)
    return out


def hardcap_flops(m: int, n: int, dtype: torch.dtype = torch.float32, steps: int | None = None,
                  thresholds: int = 1) -> float:
    """Default route of :func:`spectrakit.linalg.spectral_hardcap`/``spectral_clip``: ``O = msign(X)``
    (``m x n``), ``A = X O^T`` (2m^2n), the eigen-signs of ``thresholds`` (1, or 2 for a band) symmetric
    ``m x m`` matrices plus ``P (t I - A) P`` with ``P = (I + sign(.)) / 2`` (4m^3 each), repeated for the
    ``eig.CLIP_PASSES`` refinement passes, and ``clip(A) O`` (2m^2n). A hardcap (``thresholds=1``) also clips
    at 0 from its second pass on (``eig.clip_sym(psd=True)``): two eigen-signs in those passes."""
    from .eig import CLIP_PASSES

    m, n = _wide(m, n)
    if steps is None:
        steps = steps_for(HARD_LOWER_BOUND * m ** (-1 / 8), HARD_TOL[dtype], safety=safety_for(dtype))
    signs = thresholds * CLIP_PASSES if thresholds == 2 else (2 * CLIP_PASSES - 1 if CLIP_PASSES > 1 else 2)
    return (msign_flops(m, n, steps) + 2.0 * m * m * n
            + signs * (msign_flops(m, m, steps) + 4.0 * m**3) + 2.0 * m * m * n)


def hardcap_dilation_flops(m: int, n: int, dtype: torch.dtype = torch.float32, steps: int | None = None) -> float:
    """``method="dilation"`` of :func:`spectrakit.linalg.spectral_hardcap`: ``msign`` of a symmetric
    ``(m+n)`` matrix (3 products of ``(m+n)^3`` per step) plus ``P W`` (2m^2n)."""
    m, n = _wide(m, n)
    big = m + n
    if steps is None:
        steps = steps_for(HARD_LOWER_BOUND * big ** (-1 / 8), HARD_TOL[dtype], safety=safety_for(dtype))
    return steps * 6.0 * big**3 + 2.0 * m * m * n
