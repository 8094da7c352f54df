"""Polar factor ``msign(X) = U V^T`` by odd-polynomial (Newton–Schulz type) iterations.

For ``X = U S V^T`` one step ``X <- a X + (b A + c A^2) X`` with ``A = X X^T`` maps every singular value
``s -> p(s) = a s + b s^3 + c s^5`` and keeps ``U, V``; a schedule of such steps drives all singular
values in ``[l, 1]`` to 1. Inputs are first put in the wide orientation (``m <= n``, so ``A`` is the small
``m x m`` Gram matrix) and normalised by a cheap upper bound of ``sigma_max``: after a Frobenius
pre-scaling, ``||A^2||_F^(1/4) = (sum s^8)^(1/8)`` (within ``m^(1/8)`` of ``sigma_max``), whose ``A^2``
is re-used by the first step, so the bound costs no extra matmul.
"""

from __future__ import annotations

import torch

from spectrakit._checks import check_choice, check_int, check_scalar, check_tensor

from ._util import compute_dtype, flush_tiny, frob, mT, pow2_scale
from .schedules import BF16_SAFETY, BF16_SWITCH, SAFETY, SCHEDULES, bf16_fp32_steps, polar_express_coeffs, steps_for


def safety_for(dtype: torch.dtype) -> float:
    """Safety factor of Polar Express schedules for a compute dtype (larger for bfloat16)."""
    return BF16_SAFETY if dtype == torch.bfloat16 else SAFETY

# Worst |1 - sigma_out| the default number of Polar Express steps aims at, per compute dtype.
DEFAULT_TOL = {torch.float64: 1e-7, torch.float32: 1e-5, torch.bfloat16: 1e-3}
# With dtype=bfloat16 the first steps of the polar_express schedule run in float32: as many as
# :func:`~.schedules.bf16_fp32_steps` gives for the lower bound (2 for the default 1e-3).


def to_wide(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``(x, False)`` if ``m <= n`` else ``(x^T, True)``."""
    return (mT(x), True) if x.shape[-2] > x.shape[-1] else (x, False)


def _coef(v, t: int):
    """Step ``t`` of a coefficient: a float, or a per-matrix tensor of shape ``(..., steps)``."""
    return v[..., t, None, None] if isinstance(v, torch.Tensor) else v


def normalized_start(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normalise wide ``x`` so that ``sigma_max <= 1``; returns ``(x1, A1, A1^2)`` with ``A1 = x1 x1^T``.

    Frobenius pre-scaling avoids overflow of ``A^2``; the final scale ``||A^2||_F^(1/4)`` is tighter
    (``<= m^(1/8) sigma_max``). Zero input stays zero (norms are floored, never divided by zero).
    """
    # first by a power of two near max|x| (exact; ||x||_F of entries near fp32's largest value overflowed),
    # then the Frobenius norm, floored at the smallest normal number
    x = x / pow2_scale(x)
    x0 = x / frob(x).clamp_min(torch.finfo(x.dtype).tiny)
    a = x0 @ mT(x0)
    a2 = a @ a
    # >= sigma_max(x0)^2 >= 1/m for nonzero x0 (||x0||_F = 1): the floor only acts on zero input
    s2 = frob(a2).clamp_min((0.25 / x.shape[-2]) ** 2).sqrt()  # floor before sqrt: finite gradient at 0
    return x0 / s2.sqrt(), a / s2, a2 / (s2 * s2)


def polar_iterate(x: torch.Tensor, coeffs, *, a_first=None, dtypes=None) -> torch.Tensor:
    """Run ``X <- a X + (b A + c A^2) X`` for each ``(a, b, c)`` in ``coeffs`` on wide ``x``.

    ``coeffs`` is a sequence of float triples, or a tensor ``(..., steps, 3)`` of per-matrix coefficients.
    ``a_first = (A, A^2)`` re-uses an already computed Gram matrix and its square for step 0.
    ``dtypes``: optional per-step compute dtypes (mixed precision); default: x's dtype throughout.
    """
    steps = coeffs.shape[-2] if isinstance(coeffs, torch.Tensor) else len(coeffs)
    for t in range(steps):
        if dtypes is not None and x.dtype != dtypes[t]:
            x = x.to(dtypes[t])
            a_first = None
        if isinstance(coeffs, torch.Tensor):
            ct = coeffs[..., t, :].to(x.dtype)
            a, b, c = (ct[..., i, None, None] for i in range(3))
        else:
            a, b, c = coeffs[t]
        if t == 0 and a_first is not None:
            g, g2 = a_first
        else:
            g = flush_tiny(x @ mT(x))
            g2 = g @ g
        x = a * x + (b * g + c * g2) @ x
    return x


def _exact_msign(x: torch.Tensor) -> torch.Tensor:
    """``U diag(s > tol) V^T`` from a float64 SVD; numerically zero singular values map to 0."""
    x64 = x.double()
    u, s, vh = torch.linalg.svd(x64, full_matrices=False)
    tol = s[..., :1] * (max(x.shape[-2:]) * torch.finfo(torch.float64).eps) + 1e-300
    keep = (s > tol).to(x64.dtype)
    return ((u * keep[..., None, :]) @ vh).to(x.dtype)


NORMALIZATIONS = ("spectral_bound", "frobenius")
# Keller Jordan's Muon: X / (||X||_F + 1e-7)
FROBENIUS_EPS = 1e-7


def _frobenius_one(x: torch.Tensor, coeffs) -> torch.Tensor:
    """:func:`_frobenius_iterate` of one wide 2-D matrix: ``torch.optim.Muon``'s calls themselves (``norm``,
    ``div``, then per step ``mm`` and two ``addmm``)."""
    x = x / x.norm().clamp(min=FROBENIUS_EPS)
    for a, b, c in coeffs:
        g = x @ x.T
        x = torch.addmm(x, torch.addmm(g, g, g, beta=b, alpha=c), x, beta=a)
    return x


def _frobenius_iterate(x: torch.Tensor, coeffs, out_dtype: torch.dtype | None = None,
                       transposed: bool = False, per_matrix: bool | None = None, *,
                       dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Muon's published loop on wide ``x``, no mixed precision, no flush: ``X <- X / max(||X||_F, 1e-7)``,
    then ``A = X X^T; B = b A + c A A; X <- a X + B X`` per step, in the compute dtype ``dtype`` (default:
    x's), with the rounding of ``torch.optim.Muon`` (each of ``B`` and ``X`` one fused ``addmm``; batched:
    ``baddbmm``, the same per-matrix arithmetic). Keller Jordan's reference rounds ``b A``, ``c A A`` and
    ``a X`` separately (bf16: ~1e-2 relative difference in the output after 5 steps; fp32: ~1e-7).

    Returns the result transposed back when ``transposed``, in ``out_dtype`` (default: x's dtype), written
    into ``out`` when given (a tensor of the result's shape and dtype; it may share x's memory: each matrix
    is read before its result is written). ``per_matrix`` (default: True on CPU, else False) picks the loop.
    Per matrix: each matrix is converted to the compute dtype (``torch.optim.Muon``'s ``G.bfloat16()``) and
    goes through all steps before the next one (torch's own ``mm``/``addmm`` calls, while the matrix is in
    cache), then is written into the output in its final layout and dtype by one copy; every temporary is
    one matrix's (a CPU allocates and page-faults a fresh full-batch tensor every call). On the CPU batching
    gains nothing (``baddbmm`` loops over the matrices there anyway; measured within 1% in emulated bf16)
    and this loop issues exactly ``torch.optim.Muon``'s calls. Batched (other devices): one
    ``bmm``/``baddbmm`` per product for the whole batch (one kernel launch per product). Both loops give the
    same bits where the library runs the same kernel for a batch and a single matrix; on the CPU both write
    a contiguous output."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    dtype = x.dtype if dtype is None else dtype
    flat = x.reshape(-1, *x.shape[-2:])
    if per_matrix is None:
        per_matrix = flat.device.type == "cpu"
    shape = mT(x).shape if transposed else x.shape
    if per_matrix:
        if out is None:
            out = torch.empty(shape, dtype=out_dtype, device=x.device)
        dst = (mT(out) if transposed else out).view(flat.shape)  # a view: written in place
        for i, m in enumerate(flat.unbind(0)):
            dst[i].copy_(_frobenius_one(m.to(dtype), coeffs))
        return out
    flat = flat.to(dtype)
    norms = torch.stack([m.norm() for m in flat.unbind(0)]).clamp(min=FROBENIUS_EPS)
    flat = flat / norms.view(-1, 1, 1)
    for a, b, c in coeffs:
        g = flat @ mT(flat)
        flat = torch.baddbmm(flat, torch.baddbmm(g, g, g, beta=b, alpha=c), flat, beta=a)
    res = flat.reshape(x.shape)
    res = mT(res) if transposed else res
    if out is not None:
        return out.copy_(res)
    if res.device.type == "cpu":  # written in its final layout, as the per-matrix loop (strided passes cost 2x)
        return res.contiguous() if res.dtype == out_dtype else res.to(out_dtype, memory_format=torch.contiguous_format)
    return res.to(out_dtype)


def msign(X: torch.Tensor, *, steps: int | None = None, schedule: str = "polar_express",
          lower_bound: float | None = None, dtype: torch.dtype | None = None,
          normalize: str = "spectral_bound", batched: bool | None = None,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """Polar factor ``msign(X) = U V^T`` of ``X = U S V^T`` (; Jiang, Semenov and Stich 2026 §5.1, Cesista 2025 §2).

    Computed by odd quintic iterations ``X <- a X + (b A + c A^2) X``, ``A = X X^T`` in the wide
    orientation, with a named coefficient schedule from :data:`spectrakit.linalg.schedules.SCHEDULES`:

    - ``"polar_express"`` (default): minimax quintics for the interval ``[lower_bound, 1]`` (Amsel et al.
      2025, computed here by Remez exchange, safety factor 1.01). Singular values
      ``>= lower_bound * sigma_max`` come out within ``1 +- 1e-3`` (fp32) / ``+- 3e-2`` (bf16); smaller ones
      are mapped monotonically into ``[0, 1]``.
    - ``"muon"``: Muon's fixed quintic ``(3.4445, -4.7750, 2.0315)``, 5 steps; output singular values
      land roughly in ``[0.7, 1.2]``.
    - ``"newton_schulz"``: the cubic ``(1.5, -0.5)``, 12 steps by default (slow start on small values).
    - ``"exact"``: float64 SVD, ``U diag(s > tol) V^T`` (numerically zero singular values map to 0).

    Zero singular values always map to 0 (the direction is undefined), so ``msign(0) = 0`` (with a finite,
    zero gradient there). Scale-invariant: any finite input scale, subnormal (1e-40 entries in fp32) to ~1e38.

    Args:
        X: ``(..., m, n)`` floating tensor, finite.
        steps: iterations (int >= 1); default: 5 (muon), 12 (newton_schulz), or the fewest Polar Express
            steps reaching the dtype's accuracy for ``lower_bound``.
        schedule: one of ``SCHEDULES`` or ``"exact"``.
        lower_bound: in (0, 1); relative size of the smallest singular value that must be mapped to 1
            (default 1e-3). Only used by schedules that take it (polar_express).
        dtype: compute dtype (bfloat16/float32/float64); default: the input's (fp16 computes in fp32).
            With bfloat16 and the polar_express schedule the first steps run in float32 on the input itself,
            until the tracked lower bound of the schedule reaches 1e-2 (2 steps for ``lower_bound=1e-3``,
            7 for 1e-6, :func:`~spectrakit.linalg.schedules.bf16_fp32_steps`): bf16 rounding next to large
            singular values destroys the directions of small ones. The result has the input dtype.
        normalize: ``"spectral_bound"`` (default: Frobenius pre-scaling, then ``||A^2||_F^(1/4)``, see the
            module docstring) or ``"frobenius"``: ``X / max(||X||_F, 1e-7)`` in the compute dtype and the plain
            loop ``A = X X^T; B = b A + c A A; X = a X + B X`` with no mixed precision. With
            ``schedule="muon", dtype=torch.bfloat16`` this reproduces Keller Jordan's published Muon
            Newton–Schulz exactly (bf16, 5 steps, tall inputs transposed).
        batched: ``normalize="frobenius"`` only: one ``bmm``/``baddbmm`` per product for a batch of matrices
            (True) or each matrix through all steps with ``torch.optim.Muon``'s own ``mm``/``addmm`` calls
            (False); default: per matrix on the CPU, batched elsewhere. The per-matrix loop gives
            ``torch.optim.Muon``'s bits; batched products are one kernel launch (or, on the CPU, one oneDNN
            call of ~20 us fixed cost in bf16) per product instead of one per matrix, with the same arithmetic
            per matrix where the library runs the same kernel for both (on an H100, and at the LLaMA shapes on
            an Intel CPU with AMX; at some small shapes there the last bf16 place can differ).
        out: a tensor of X's shape and dtype to write the result into (returned); it may be X itself. With
            ``normalize="frobenius"`` on a contiguous ``out`` the per-matrix loop writes each result there
            directly, so a step allocates no full-size output (on a CPU, a fresh large tensor is page-faulted
            in on every call); elsewhere the result is copied into it.

    Raises:
        TypeError: X not a floating tensor, dtype unsupported, batched not a bool or None, out not a tensor
            of X's dtype.
        ValueError: X with fewer than 2 dims or non-finite values, unknown schedule or normalize,
            steps < 1, lower_bound outside (0, 1), ``batched`` without ``normalize="frobenius"``, out of
            another shape or device than X.
    """
    check_tensor(X, "X", min_ndim=2)
    check_choice(schedule, "schedule", set(SCHEDULES) | {"exact"})
    check_choice(normalize, "normalize", NORMALIZATIONS)
    if batched is not None and not isinstance(batched, bool):
        raise TypeError(f"batched must be True, False or None, got {batched!r}")
    if batched is not None and normalize != "frobenius":
        raise ValueError(f"batched applies to normalize='frobenius' only, got normalize={normalize!r}")
    if steps is not None:
        check_int(steps, "steps", low=1, high=100)
    if lower_bound is not None:
        check_scalar(lower_bound, "lower_bound", low=0.0, high=1.0, low_inclusive=False,
                     high_inclusive=False, allow_tensor=False)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != X.dtype:
            raise TypeError(f"out must be a tensor of X's dtype {X.dtype}, got "
                            f"{out.dtype if isinstance(out, torch.Tensor) else type(out).__name__}")
        if out.shape != X.shape or out.device != X.device:
            raise ValueError(f"out must have X's shape {tuple(X.shape)} and device {X.device}, got "
                             f"{tuple(out.shape)} on {out.device}")
        if not (normalize == "frobenius" and schedule != "exact" and out.is_contiguous() and X.numel()):
            return out.copy_(msign(X, steps=steps, schedule=schedule, lower_bound=lower_bound, dtype=dtype,
                                   normalize=normalize, batched=batched))
    cdt = compute_dtype(X, dtype)
    if X.numel() == 0:  # an empty matrix (a zero dimension) maps to itself
        return X.clone()
    if schedule == "exact":
        return _exact_msign(X)
    if schedule == "polar_express" and normalize == "spectral_bound":
        # the shared iteration; with bf16 its leading steps run in fp32 on the input itself (rounding an fp32
        # input to bf16 first perturbs it by ~4e-3 s_max / sqrt(m): smaller singular values were lost)
        return sign_iteration(X, lower_bound=1e-3 if lower_bound is None else float(lower_bound),
                              tol=DEFAULT_TOL[cdt], dtype=cdt, steps=steps)
    # (the Frobenius loop converts to the compute dtype itself: per matrix on the CPU, as torch.optim.Muon)
    x, transposed = to_wide(X if normalize == "frobenius" else X.to(cdt))
    if schedule == "polar_express":
        lb = (1e-3 if lower_bound is None else float(lower_bound)) * x.shape[-2] ** (-1 / 8)
        if steps is None:
            steps = steps_for(lb, DEFAULT_TOL[cdt], safety=safety_for(cdt))
        coeffs = polar_express_coeffs(lb, steps, safety_for(cdt))
    else:
        coeffs = SCHEDULES[schedule](steps, lower_bound)
    if normalize == "frobenius":
        return _frobenius_iterate(x, coeffs, X.dtype, transposed, None if batched is None else not batched,
                                  dtype=cdt, out=out)
    x1, a1, a1sq = normalized_start(x)
    out = polar_iterate(x1, coeffs, a_first=(a1, a1sq))
    return (mT(out) if transposed else out).to(X.dtype)


def sign_iteration(x: torch.Tensor, *, lower_bound: float, tol: float, dtype: torch.dtype | None = None,
                   fp32_steps: int | None = None, fp32_last: int = 0, steps: int | None = None,
                   bf16_switch: float = BF16_SWITCH) -> torch.Tensor:
    """Unchecked Polar Express ``msign`` of ``x`` (any orientation) for internal callers.

    ``lower_bound`` is relative to ``sigma_max`` (the ``m^(1/8)`` slack of the normalisation is added
    here). ``dtype`` (default x's) is the compute dtype. For bfloat16 the input stays in x's precision
    (fp32 or fp64; fp32 for half-precision inputs), and the first ``fp32_steps`` and the last ``fp32_last``
    steps run in that precision. ``fp32_steps=None`` takes :func:`~.schedules.bf16_fp32_steps` for
    ``bf16_switch``: steps until the tracked lower bound reaches it (larger switch values also keep the
    singular vectors accurate). The first steps resolve small singular values that bf16 cannot represent
    next to large ones; the last ones polish the bf16 rounding of the singular values (not of the
    vectors). Returns x's dtype.
    """
    dtype = x.dtype if dtype is None else dtype
    xw, transposed = to_wide(x)
    lb = lower_bound * xw.shape[-2] ** (-1 / 8)
    if steps is None:
        steps = steps_for(lb, tol, safety=safety_for(dtype))
    coeffs = polar_express_coeffs(lb, steps, safety_for(dtype))
    if dtype == torch.bfloat16:
        if fp32_steps is None:
            fp32_steps = bf16_fp32_steps(lb, steps, safety_for(dtype), bf16_switch)
        hi = xw.dtype if xw.dtype in (torch.float32, torch.float64) else torch.float32
        xw = xw.to(hi)
        dtypes = [hi if (t < fp32_steps or t >= steps - fp32_last) else torch.bfloat16 for t in range(steps)]
    else:
        xw = xw.to(dtype)
        dtypes = None
    x1, a1, a1sq = normalized_start(xw)
    out = polar_iterate(x1, coeffs, a_first=(a1, a1sq), dtypes=dtypes).to(x.dtype)
    return mT(out) if transposed else out


# Accurate sign iterations behind the hard clips and the eigenvalue functions (their sandwiches need the
# sign's singular/eigen-VECTORS, not only its values): relative lower bound, worst |1 - sigma| per dtype,
# bf16 switch point and a final fp32 polishing step. The bf16 steps rotate the vectors by ~u (|b| + |c|) per
# step while the singular values are still spread; measured worst bf16 errors of hardcap/relu/clip (64x192;
# Gaussian, 1e3 spike, 6-decade spectrum; ratios 1e-2..1e3) by switch point: 0.01 -> 3.4e-2,
# 0.03 -> 2.4e-2, 0.1 -> 9.8e-3, 0.3 -> 5.6e-3; without the final fp32 step 3.4e-2 at 0.1.
CLIP_LOWER_BOUND = 1e-6
CLIP_TOL = {torch.float64: 1e-8, torch.float32: 1e-6, torch.bfloat16: 1e-3}
CLIP_BF16_SWITCH = 0.1
CLIP_FP32_LAST = 1


def clip_sign(x: torch.Tensor, dtype: torch.dtype, steps: int | None = None, *, symmetric: bool = False,
              ) -> torch.Tensor:
    """:func:`sign_iteration` with the settings above: ``msign(x)`` for every singular value down to
    ``1e-6 s_max``. ``symmetric=True`` (x symmetric, the result its eigen-sign) symmetrises the result: the
    skew part of a computed eigen-sign is a rotation error (bf16 rounding breaks the symmetry of the
    iterates) that a projector sandwich ``P D P`` would carry to first order."""
    s = sign_iteration(x, lower_bound=CLIP_LOWER_BOUND, tol=CLIP_TOL[dtype], dtype=dtype,
                       fp32_last=CLIP_FP32_LAST, steps=steps, bf16_switch=CLIP_BF16_SWITCH)
    return (s + mT(s)) / 2 if symmetric else s


def orthogonalize(X: torch.Tensor, *, steps: int | None = None, schedule: str = "polar_express",
                  lower_bound: float | None = None, dtype: torch.dtype | None = None,
                  normalize: str = "spectral_bound") -> torch.Tensor:
    """``orthogonalize(X) = msign(X) = U V^T``; same arguments and errors as :func:`msign`."""
    return msign(X, steps=steps, schedule=schedule, lower_bound=lower_bound, dtype=dtype, normalize=normalize)
