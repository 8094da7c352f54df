"""The matrix post-/pre-transforms as one opaque operator call per batch in a ``torch.compile``-d step.

Traced by ``torch.compile``, a transform of :data:`~spectrakit.optim.transforms.POST_TRANSFORMS` (the soft
clip's Polar-Express iteration on ``U U^T + c^2 I``, Jiang, Semenov and Stich 2026 §5.1; the accurate
route's 3 tall + 6 Gram steps; the hard cap; Newton-Schulz, Jordan et al. 2024; the regularised
Frank-Wolfe posts, §3.1) unrolls into every iteration's matmuls and element-wise operations, for every
(shape, dtype) batch, and inductor generates and compiles code for each: the first compile of
``SpectraAdamW`` took 7.7x torch AdamW's on a CPU, 8.7x on an H100, and a matmul-bound iteration gains
nothing from the generated code. Under ``torch.compile`` the optimizer therefore calls each batch's
transform as one operator, ``torch.ops.spectrakit.post_transform(U, name, c, steps, dtype, regularizer, b,
p)``, defined with :class:`torch.library.Library` (as :mod:`spectrakit.optim.fused`): functional (``U`` is
read, a new tensor returned), its kernel the eager function itself (the in-place variant ``fn.inplace`` on a
contiguous copy of ``U``, the call the eager step makes on its contiguous work tensor), so that the compiled
step gives the eager numbers bit for bit; its fake kernel returns an empty tensor of ``U``'s shape and dtype.

The arguments are those of a transform call: ``c`` a Python float (the clip threshold of the step; it changes
only with a clip schedule that reads the step counter, which is itself a guard of the traced step), ``steps``
and ``dtype`` fixed per group, ``regularizer``/``b``/``p`` the group's Frank-Wolfe options (ignored by the
other transforms).
"""

from __future__ import annotations

import torch

from spectrakit.optim.transforms import LMO_POSTS, POST_TRANSFORMS


def _alias(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.numel() > 0


def _post_transform(U: torch.Tensor, name: str, c: float, steps: int | None, dtype: torch.dtype | None,
                    regularizer: str, b: float, p: float | None) -> torch.Tensor:
    """The kernel: transform ``name`` of the batch ``U`` into a new tensor (``U`` unchanged)."""
    fn = POST_TRANSFORMS[name]
    kwargs = {"regularizer": regularizer, "b": b, "p": p} if name in LMO_POSTS else {}
    inplace = getattr(fn, "inplace", None)
    if inplace is not None:  # the optimizer's eager call, on a copy of its contiguous work tensor
        return inplace(U.clone(memory_format=torch.contiguous_format), c, steps, dtype, **kwargs)
    out = U.clone() if fn is None else fn(U, c, steps, dtype, **kwargs)
    return out.clone() if _alias(out, U) else out  # an operator's output must not alias its input


def _fake(U, name, c, steps, dtype, regularizer, b, p):
    return torch.empty_like(U, memory_format=torch.contiguous_format)


_LIB = torch.library.Library("spectrakit", "FRAGMENT")
_LIB.define("post_transform(Tensor U, str name, float c, int? steps, ScalarType? dtype, str regularizer, float b, "
            "float? p) -> Tensor")
_LIB.impl("post_transform", _post_transform, "CompositeExplicitAutograd")
torch.library.register_fake("spectrakit::post_transform", _fake, lib=_LIB)
post_transform_op = torch.ops.spectrakit.post_transform.default


def traced_transform(U: torch.Tensor, name: str, c: float, steps: int | None, dtype: torch.dtype | None,
                     kwargs: dict) -> torch.Tensor:
    """Transform ``name`` (a key of ``POST_TRANSFORMS``) of the batch ``U`` as one call of
    ``torch.ops.spectrakit.post_transform`` (for a step traced by ``torch.compile``); ``kwargs``: the
    transform's extra keywords (``regularizer``, ``b``, ``p`` of the Frank-Wolfe posts, see
    :func:`~spectrakit.optim.transforms.post_kwargs`)."""
    return post_transform_op(U, name, float(c), steps, dtype, str(kwargs.get("regularizer", "frobenius")),
                             float(kwargs.get("b", 1.0)), None if kwargs.get("p") is None else float(kwargs["p"]))
