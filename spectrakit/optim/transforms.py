"""Post-/pre-transforms of a batch of update matrices and the per-matrix update scale ``alpha``.

Every transform ``fn(U, c, steps=None, dtype=None)`` maps a stacked batch ``U`` of shape ``(B, m, n)``
and a threshold ``c`` (float) to a batch of the same shape and dtype (``dtype``: compute dtype of the
iterative ones, e.g. bfloat16; ``steps``: their iteration count; None = linalg's defaults); the
optimizer calls it once per (shape, dtype) batch. Names:"""

# - ``soft_clip`` (the optimizers' default post-transform; alias of ``soft_clip_fast``):
#   ``s -> s / sqrt(1 + s^2/c^2)`` (SPECTRA's SSC, Jiang, Semenov and Stich 2026 §5.1), see ``soft_clip_fast``;
# - ``soft_clip_accurate``: the same map by ``linalg.soft_clip``'s default polar route (3 tall + 6 Gram
#   steps in fp32, error <= 1e-3 for ``sigma_max/c`` up to 1e4); the default PRE-transform (raw gradients
#   can be far above ``pre_c``);
# - ``soft_clip_fast``: the same map by the Gram-only route ``linalg.soft_clip(tall_steps=0)``
#   (implemented by its in-place form ``linalg.soft_clip.soft_clip_fast_``, equal to rounding; 6
#   Polar-Express steps on ``U U^T + c^2 I``, fp32: 0.72-0.76x the paper's Newton-Schulz FLOPs, 1.5-1.7x
#   faster than ``soft_clip`` on CPU; relative error <= 1e-3 only for ``sigma_max(U)/c <= 300``, tested;
#   beyond that a safe under-shoot, e.g. ~2e-2 at 1e3). A bfloat16 compute dtype uses the accurate route
#   (the bf16 Gram phase diverges) on GPUs; on CPU it computes in fp32 (the bf16 route was measured slower
#   there: 1.28-1.5x with AMX bf16 units, 40-80x without);
# - ``soft_clip_ns``: the same map by the paper's Alg. 1 + 3 (``linalg.soft_clip(method="newton_schulz")``,
#   10 coupled Newton-Schulz steps on the Gram matrix: fewer FLOPs for very wide matrices, but the small
#   singular values are under-amplified when ``sigma_max/c >~ 100``);
# - ``soft_clip_exact``: the same map by a float64 SVD (reference);
# - ``hard_clip``: ``s -> min(s, c)`` (``clip^sp_c`` of Jiang, Semenov and Stich 2026 §2) by a float64 SVD;
# - ``hardcap``: ``s -> min(s, c)`` by ``linalg.spectral_hardcap``;
# - ``orthogonalize``: ``s -> 1`` (post-orthogonalisation ablation, §F.3 Table F.8), ``linalg.orthogonalize``;
# - ``newton_schulz5``: ``s -> ~1`` in [0.7, 1.2] (Muon's quintic x 5 steps from a Frobenius-normalised
#   start, Jordan et al. 2024; bit-identical to ``torch.optim.Muon``), ``linalg.msign(schedule="muon",
#   normalize="frobenius")``; ``newton_schulz5_batched``: the same, with one batched product per stack of
#   same-shape matrices on every device (the CPU default runs torch's per-matrix calls; on CPUs with bf16
#   matrix units, Intel AMX, batching saves oneDNN's fixed cost per call but may change the last bf16 place at
#   small shapes); ``newton_schulz5_spectral``: the same quintic from linalg's spectral-bound start
#   (``linalg.msign(schedule="muon")``);
# - ``global_clip``: ``U -> U min(1, c / ||U||_F)`` (global clipping ``clip^g_c``, Jiang, Semenov and Stich 2026 §2);
# - ``spectral_lmo``: ``s -> s*(s)`` of the regularised Frank–Wolfe subproblem over the spectral ball of
#   radius ``c`` with the group's ``regularizer`` (``"frobenius"``, ``"nuclear"``, ``"schatten"`` with ``p``,
#   ``"entropy"``) and strength ``b`` (Jiang, Semenov & Stich 2026, §3.1, App. E.3; ``linalg.spectral_lmo``);
# - ``linf_fw``: ``(||U||_1 / b) clip^sp_{b c / ||U||_1}(sign(U))``, the approximate Frank–Wolfe step of the
#   l_inf-regularised subproblem (Signum with a post spectral clip, §3.1); give it the momentum, not its sign;
#   spectral norm ``<= c (1 + 1e-3)`` (the hard cap's accuracy, also for nearly rank-1 sign matrices far above
#   the cap);
# - ``none``: identity.
#
# (``U = P diag(s) Q^T``; the singular vectors are kept.) ``spectrakit.linalg`` is imported lazily,
# so the exact variants work without it.
#
# Memory: ``soft_clip``/``soft_clip_fast`` have an in-place variant (``POST_TRANSFORMS["soft_clip"].inplace``,
# fp32/fp64 compute) that overwrites ``U`` and allocates no full-size temporary (4 ``m x m`` Gram matrices
# per matrix, then a block of at most ``2^20`` elements); the optimizer calls it on its work tensor. So do
# ``newton_schulz5`` and ``newton_schulz5_batched`` (Muon's loop writes each result into ``U``: no full-size
# output per step) and the regularised Frank-Wolfe posts. The entries of ``POST_TRANSFORMS`` themselves never
# modify ``U``.

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from spectrakit._checks import check_int, no_value_checks


def _linalg():
    import spectrakit.linalg as linalg

    return linalg


def _svd_map(U: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    P, s, Qh = torch.linalg.svd(U.double(), full_matrices=False)
    return ((P * fn(s).unsqueeze(-2)) @ Qh).to(U.dtype)


def soft_clip_exact(U: torch.Tensor, c: float, steps=None, dtype=None) -> torch.Tensor:
    """Exact soft spectral clip ``P diag(s / sqrt(1 + s^2/c^2)) Q^T`` by a float64 SVD (Jiang, Semenov and Stich 2026
    eq. H_c)."""
    return _svd_map(U, lambda s: s / torch.sqrt(1 + (s / c) ** 2))


def hard_clip_exact(U: torch.Tensor, c: float, steps=None, dtype=None) -> torch.Tensor:
    """Exact hard spectral clip ``P diag(min(s, c)) Q^T`` by a float64 SVD (Jiang, Semenov and Stich 2026 §2,
    ``clip^sp_c``)."""
    return _svd_map(U, lambda s: s.clamp(max=c))


def global_clip(U: torch.Tensor, c: float, steps=None, dtype=None) -> torch.Tensor:
    """Global (Frobenius) clipping ``U * min(1, c / ||U||_F)`` per matrix (Jiang, Semenov and Stich 2026 §2,
    ``clip^g_c``);
    the baseline that shrinks signal and noise alike. No host sync (``clamp`` on tensors)."""
    norm = torch.linalg.matrix_norm(U, keepdim=True)
    return U * (c / norm.clamp_min(c))


def _soft_clip_accurate(U, c, steps=None, dtype=None):
    """Accurate soft clip: ``linalg.soft_clip``'s default polar route."""
    with no_value_checks():
        return _linalg().soft_clip(U, c, steps=steps, dtype=dtype)


def _fast_dtype(U, dtype):
    """Compute dtype of the fast soft clip: a bfloat16 request on a CPU tensor computes in float32 (U's
    dtype when float64), since the bf16 route iterates on the tall matrix and was measured slower than the
    fp32 Gram route on every CPU: 1.28-1.5x with AMX bf16 units, 40-80x without (emulated products)."""
    if dtype == torch.bfloat16 and U.device.type == "cpu":
        return torch.float64 if U.dtype == torch.float64 else torch.float32
    return dtype


def _inplace_ok(U, dtype) -> bool:
    return U.dtype in (torch.float32, torch.float64) and (dtype is None or dtype == U.dtype)


def _soft_clip_fast(U, c, steps=None, dtype=None):
    """Fast Gram-only soft clip: ``linalg.soft_clip.soft_clip_fast_`` on a contiguous copy of ``U`` (the
    iteration of ``linalg.soft_clip(tall_steps=0)``, equal to it to rounding, and bit-identical to the
    optimizer's in-place call on its contiguous work tensor); other compute dtypes go through
    ``linalg.soft_clip(tall_steps=0)``, bf16 through the accurate route (the bf16 Gram phase diverges),
    except on CPU, where bf16 computes in fp32 (see :func:`_fast_dtype`)."""
    dtype = _fast_dtype(U, dtype)
    if _inplace_ok(U, dtype):
        return _soft_clip_fast_inplace(U.clone(memory_format=torch.contiguous_format), c, steps, dtype)
    cdt = U.dtype if dtype is None else dtype
    tall = None if cdt == torch.bfloat16 else 0
    with no_value_checks():
        return _linalg().soft_clip(U, c, steps=steps, dtype=dtype, tall_steps=tall)


def _soft_clip_fast_inplace(U, c, steps=None, dtype=None):
    """:func:`_soft_clip_fast` that overwrites ``U`` and returns it (``linalg.soft_clip.soft_clip_fast_``, no
    full-size temporary) when ``U`` is float32/float64 and the compute dtype is ``U``'s; otherwise the
    out-of-place route (``U`` unchanged, a new tensor returned)."""
    dtype = _fast_dtype(U, dtype)
    if not _inplace_ok(U, dtype):
        return _soft_clip_fast(U, c, steps, dtype)
    from spectrakit.linalg.soft_clip import soft_clip_fast_

    with no_value_checks():
        return soft_clip_fast_(U, c, steps=steps)


# the in-place variant the optimizer calls (Spectra._post_transform_groups uses ``fn.inplace`` when present)
_soft_clip_fast.inplace = _soft_clip_fast_inplace


def workspace_numel(post: str, m: int, n: int) -> int:
    """Elements of the temporaries that the optimizer's call of post-transform ``post`` allocates for one
    ``(m, n)`` matrix besides the work tensor: ``4 min(m, n)^2`` for the in-place fast soft clip (its Gram
    iteration), 0 for an identity and for the other transforms (not modelled: they allocate at least a
    full-size output). Used to size the default batches (see ``Spectra``'s ``max_batch_numel``). The
    regularised Frank-Wolfe posts (``spectral_lmo``, ``linf_fw``; CPU Gram route): ``8 min(m, n)^2`` (four
    float64 ``min(m, n)^2`` matrices: the Gram matrix, its eigenvectors, ``W``, one product); a matrix that
    takes the route's accurate SVD adds about nine float64 ``min(m, n)^2`` for that one matrix at a time."""
    fn = POST_TRANSFORMS.get(post)
    if fn is _soft_clip_fast:
        return 4 * min(m, n) ** 2
    return 8 * min(m, n) ** 2 if fn in (_spectral_lmo, _linf_fw) else 0


def _soft_clip_ns(U, c, steps=None, dtype=None):
    with no_value_checks():
        return _linalg().soft_clip(U, c, method="newton_schulz", steps=steps, dtype=dtype)


def _hardcap(U, c, steps=None, dtype=None):
    with no_value_checks():
        return _linalg().spectral_hardcap(U, c, steps=steps, dtype=dtype)


def _orthogonalize(U, c, steps=None, dtype=None):
    with no_value_checks():
        return _linalg().orthogonalize(U, steps=steps, dtype=dtype)


def _newton_schulz5(U, c, steps=None, dtype=None, *, batched=None, out=None):
    """Muon's Newton-Schulz as published: Frobenius-normalised start, 5 quintic steps, bit-identical to
    ``torch.optim.Muon``'s ``_zeropower_via_newtonschulz`` (``linalg.msign(normalize="frobenius")``);
    ``batched``/``out`` as in ``msign``."""
    with no_value_checks():
        return _linalg().msign(U, schedule="muon", steps=steps or 5, dtype=dtype, normalize="frobenius",
                               batched=batched, out=out)


def _newton_schulz5_batched(U, c, steps=None, dtype=None, *, out=None):
    """:func:`_newton_schulz5` with one batched product per step and product for the whole stack on every
    device (``linalg.msign(..., batched=True)``): the per-matrix arithmetic of Muon, in 15 ``bmm``/``baddbmm``
    calls per stack instead of 15 per matrix (the CPU default is per matrix, torch's own calls)."""
    return _newton_schulz5(U, c, steps, dtype, batched=True, out=out)


def _into_input(fn):
    """``fn`` written into its input ``U`` (``msign(..., out=U)``): the same bits, and no full-size output
    allocated per step."""

    def inplace(U, c, steps=None, dtype=None):
        return fn(U, c, steps, dtype, out=U)

    return inplace


_newton_schulz5.inplace = _into_input(_newton_schulz5)
_newton_schulz5_batched.inplace = _into_input(_newton_schulz5_batched)


def _newton_schulz5_spectral(U, c, steps=None, dtype=None):
    """The same quintic from linalg's spectral-bound start ``X / ||(X X^T)^2||_F^(1/4)`` (a tighter upper
    bound on ``sigma_max`` than ``||X||_F``, so the small singular values start larger)."""
    with no_value_checks():
        return _linalg().msign(U, schedule="muon", steps=steps or 5, dtype=dtype)


def _spectral_lmo(U, c, steps=None, dtype=None, *, regularizer="frobenius", b=1.0, p=None):
    """``-spectral_lmo(U, regularizer, b=b, radius=c, p=p)``: the regularised Frank–Wolfe direction over the
    spectral ball of radius ``c`` (Jiang, Semenov & Stich 2026, §3.1 / App. E.3), ``U diag(s*(s)) V^T`` with
    ``s* <= c`` (``linalg.spectral_lmo``'s default route: the float64 Gram route on CPU, the polar route
    elsewhere). ``-X*(U) = X*(-U)`` (an odd map)."""
    with no_value_checks():
        return _linalg().spectral_lmo(-U, regularizer, b=b, radius=c, p=p, steps=steps, dtype=dtype)


def _spectral_lmo_inplace(U, c, steps=None, dtype=None, *, regularizer="frobenius", b=1.0, p=None):
    """:func:`_spectral_lmo` that overwrites ``U`` (``linalg.lmo.spectral_lmo_``: on the CPU Gram route no
    full-size temporary, only ``min(m, n)^2`` float64 matrices and a block)."""
    from spectrakit.linalg.lmo import spectral_lmo_

    with no_value_checks():
        return spectral_lmo_(U.neg_(), regularizer, b=b, radius=c, p=p, steps=steps, dtype=dtype)


_spectral_lmo.inplace = _spectral_lmo_inplace


def _linf_fw(U, c, steps=None, dtype=None, *, b=1.0, **_):
    """Approximate Frank–Wolfe step for the l_inf-regularised subproblem (Jiang, Semenov & Stich 2026, §3.1):
    ``(||U||_1 / b) clip^sp_t(sign(U))`` with ``t = b c / ||U||_1`` (entrywise l1 norm per matrix), i.e. the
    spectral-ball projection of the unconstrained minimiser ``-(||U||_1 / b) sign(U)`` of
    ``<U, X> + b/2 ||X||_inf^2``; spectral norm ``<= c``. Exact when ``||sign(U)||_2 <= t``. Computed as
    ``clip^sp_c(Y)`` with ``Y = (||U||_1 / b) sign(U)`` (``a clip_t(S) = clip_{a t}(a S)`` for ``a > 0``): on CPU
    the float64 Gram route (``clip_c(Y) = -spectral_lmo(-Y, "frobenius", b=1, radius=c)``), elsewhere
    ``linalg.spectral_hardcap`` (polar route, per-matrix threshold tensor ``t``: no host sync)."""
    return _linf_fw_inplace(U.clone(memory_format=torch.contiguous_format), c, steps, dtype, b=b)


def _linf_fw_inplace(U, c, steps=None, dtype=None, *, b=1.0, **_):
    """:func:`_linf_fw` that overwrites ``U`` on the CPU Gram route (a new tensor elsewhere)."""
    linalg = _linalg()
    from spectrakit.linalg.lmo import default_method, spectral_lmo_

    l1 = torch.linalg.vector_norm(U, 1, dim=(-2, -1))
    if default_method(U.device) == "gram":
        y = U.sign_().mul_((-l1 / b).to(U.dtype)[..., None, None])
        with no_value_checks():
            return spectral_lmo_(y, "frobenius", b=1.0, radius=c)
    tiny = torch.finfo(torch.float32).tiny
    thr = (b * c) / l1.float().clamp_min(tiny)
    with no_value_checks():
        capped = linalg.spectral_hardcap(torch.sign(U), thr, steps=steps, dtype=dtype)
    return capped * (l1 / b).to(U.dtype)[..., None, None]


_linf_fw.inplace = _linf_fw_inplace


# post-transforms that take the group's ``regularizer``, ``b``, ``p`` (see :func:`post_kwargs`)
LMO_POSTS = ("spectral_lmo", "linf_fw")


def post_kwargs(group: dict, post: str) -> dict:
    """Extra keyword arguments of post-transform ``post`` from a param group (empty for most transforms)."""
    if post == "spectral_lmo":
        return {"regularizer": group.get("regularizer", "frobenius"), "b": group.get("b", 1.0), "p": group.get("p")}
    if post == "linf_fw":
        return {"b": group.get("b", 1.0)}
    return {}


POST_TRANSFORMS: dict[str, Callable | None] = {
    "soft_clip": _soft_clip_fast,
    "soft_clip_accurate": _soft_clip_accurate,
    "soft_clip_fast": _soft_clip_fast,
    "soft_clip_ns": _soft_clip_ns,
    "soft_clip_exact": soft_clip_exact,
    "hard_clip": hard_clip_exact,
    "hardcap": _hardcap,
    "orthogonalize": _orthogonalize,
    "newton_schulz5": _newton_schulz5,
    "newton_schulz5_batched": _newton_schulz5_batched,
    "newton_schulz5_spectral": _newton_schulz5_spectral,
    "global_clip": global_clip,
    "spectral_lmo": _spectral_lmo,
    "linf_fw": _linf_fw,
    "none": None,
}
# transforms that use the threshold c (the others ignore it)
# pre-transforms of the raw gradient (Jiang, Semenov and Stich 2026 Alg. 2 line 5)
PRE_TRANSFORMS = ("soft_clip", "soft_clip_accurate", "soft_clip_fast", "soft_clip_ns", "soft_clip_exact", "hard_clip")

SCALES = ("auto", "spectra", "muon", "moonlight", "none")


def matrix_shape(shape: torch.Size) -> tuple[int, int]:
    """Matrix view ``(out, prod(rest))`` of a parameter of ndim >= 2 (conv ``(o, i, k, k) -> (o, i*k*k)``)."""
    return int(shape[0]), int(math.prod(shape[1:]))


def check_split(split, name: str = "split_fused") -> tuple[int, int]:
    """``split`` as ``(r, c)``: None is ``(1, 1)`` (the whole matrix), an int ``r >= 1`` is ``(r, 1)`` (``r``
    row blocks), a pair of ints ``>= 1`` is itself. Raises ``TypeError``/``ValueError`` naming ``name``."""
    if split is None:
        return 1, 1
    pair = (split, 1) if isinstance(split, int) and not isinstance(split, bool) else split
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2
            or not all(isinstance(k, int) and not isinstance(k, bool) for k in pair)):
        raise TypeError(f"{name} must be None, an int >= 1 or a pair of ints >= 1 (row and column blocks), "
                        f"got {split!r}")
    if min(pair) < 1:
        raise ValueError(f"{name} must be None, an int >= 1 or a pair of ints >= 1, got {split!r}")
    return int(pair[0]), int(pair[1])


def block_shape(shape: tuple[int, int], split) -> tuple[int, int]:
    """The ``(m / r, n / c)`` blocks of an ``(m, n)`` matrix split ``(r, c)`` (:func:`check_split`); raises
    ``ValueError`` when ``r`` does not divide ``m`` or ``c`` does not divide ``n``."""
    (m, n), (r, c) = shape, check_split(split)
    if m % r or n % c:
        raise ValueError(f"split_fused={split!r} needs a matrix whose rows divide by {r} and columns by {c}, "
                         f"got a {m}x{n} matrix")
    return m // r, n // c


def on_blocks(fn: Callable, U: torch.Tensor, split, *args) -> torch.Tensor:
    """``fn`` applied to every block of the ``(B, m, n)`` batch ``U`` split ``(r, c)`` as one batch of
    ``B r c`` matrices of shape ``(m/r, n/c)``: the per-matrix semantics of separate layers for a fused weight
    (Q, K and V stacked in one ``(3d, d)`` weight: ``split=3``). Row blocks are views of ``U`` (an in-place
    ``fn`` overwrites ``U``); column blocks go through a copy. Returns a ``(B, m, n)`` tensor."""
    r, c = check_split(split)
    if (r, c) == (1, 1):
        return fn(U, *args)
    B, m, n = U.shape
    bm, bn = block_shape((m, n), split)
    if c == 1:
        return fn(U.reshape(B * r, bm, bn), *args).reshape(B, m, n)
    V = U.reshape(B, r, bm, c, bn).transpose(2, 3).reshape(B * r * c, bm, bn)
    return fn(V, *args).reshape(B, r, c, bm, bn).transpose(2, 3).reshape(B, m, n)


def update_scale(scale, post: str, m: int, n: int) -> float:
    """Scale ``alpha`` of the update of an ``(m, n)`` matrix (Jiang, Semenov and Stich 2026 §5.2 item 1).

    ``scale``: a positive number (used as is) or a name:
    ``"spectra"``: ``max(1, sqrt(m/n))`` (the RMS->RMS alignment of Jiang, Semenov and Stich 2026; a ``(vocab, d)``
    embedding
    or head gets ``sqrt(vocab/d)`` as in the paper's reference code);
    ``"muon"``: Keller Jordan's ``max(1, m/n)^0.5`` (the same number, kept as a separate name);
    ``"moonlight"``: ``0.2 * sqrt(max(m, n))`` (D-Muon, Liu et al. 2025);
    ``"none"``: 1; ``"auto"``: 1 if ``post == "none"`` else ``"spectra"``.

    ``m``, ``n``: ints >= 0. An empty matrix (``m == 0`` or ``n == 0``, e.g. a zero-column shard) has an
    empty update, and the ratio-based scales ``"spectra"``/``"muon"`` return 1 for it (instead of dividing
    by 0).

    Raises:
        ValueError: ``m`` or ``n`` negative. TypeError: ``m`` or ``n`` not an int.
    """
    check_int(m, "m", low=0)
    check_int(n, "n", low=0)
    if not isinstance(scale, str):
        return float(scale)
    if scale == "auto":
        scale = "none" if post == "none" else "spectra"
    if scale in ("spectra", "muon"):
        return max(1.0, m / n) ** 0.5 if m and n else 1.0
    if scale == "moonlight":
        return 0.2 * math.sqrt(max(m, n))
    return 1.0


def vector_soft_clip_factors(norms: torch.Tensor, c: float) -> torch.Tensor:
    """Factors ``1 / sqrt(1 + ||g||^2 / c^2)`` of the smooth vector clip ``g -> g / sqrt(1 + ||g||^2/c^2)``
    (Jiang, Semenov and Stich 2026 §5.2, the 1-D case of SSC), for a tensor of norms."""
    return torch.rsqrt(1 + (norms / c) ** 2)


def vector_reference_clip_factors(norms: torch.Tensor, c: float) -> torch.Tensor:
    """Factors of the paper's 1-D rule (Jiang, Semenov & Stich 2026, Alg. 1 for a vector): ``u`` unchanged
    while ``||u|| <= c``, else ``u / sqrt(1 + ||u||^2/c^2)``. Discontinuous at ``||u|| = c`` (the factor jumps
    from 1 to ``1/sqrt(2)``), which is why the optimizers' default (``vector_clip=True``) is the smooth map
    :func:`vector_soft_clip_factors`; this one is for exact reproduction (``vector_clip="reference"``).
    ``torch.where`` on the device: no host sync."""
    return torch.where(norms <= c, torch.ones_like(norms), vector_soft_clip_factors(norms, c))


def vector_clip_factors(rule, norms: torch.Tensor, c) -> torch.Tensor:
    """The factors of ``vector_clip=rule``: ``True`` (smooth) or ``"reference"`` (the paper's rule). ``c``: a
    number, or a 0-d tensor (a scheduled threshold in a compiled step), moved to the norms' device (its value
    rounds to the norms' dtype as a number's does)."""
    if isinstance(c, torch.Tensor):
        c = c.to(norms.device, non_blocking=True)
    return (vector_reference_clip_factors if rule == "reference" else vector_soft_clip_factors)(norms, c)
