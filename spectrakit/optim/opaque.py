"""The matrix post-/pre-transforms as one opaque operator call per batch in a ``torch.compile``-d step.

Traced by ``torch.compile``, a transform of :data:`~spectrakit.optim.transforms.POST_TRANSFORMS` (the soft
clip's Polar-Express iteration on ``U U^T + c^2 I``, Jiang, Semenov and Stich 2026 §5.1; the accurate
route's 3 tall + 6 Gram steps; the hard cap; Newton-Schulz, Jordan et al. 2024; the regularised
Frank-Wolfe posts, §3.1) unrolls into every iteration's matmuls and element-wise operations, for every
(shape, dtype) batch, and inductor generates and compiles code for each: the first compile of
``SpectraAdamW`` took 7.7x torch AdamW's on a CPU, 8.7x on an H100, and a matmul-bound iteration gains
nothing from the generated code. Under ``torch.compile`` the optimizer therefore calls the transforms of a
param group's matrix batches as one operator, ``torch.ops.spectrakit.post_transform(Us, name, c, steps,
dtype, regularizer, b, p)`` (``Us``: the list of batches), defined with :class:`torch.library.Library` (as
:mod:`spectrakit.optim.fused`): functional (the batches are read, new tensors returned), its kernel the eager
function itself (the in-place variant ``fn.inplace`` on a contiguous copy of each batch, the call the eager step
makes on its contiguous work tensor), so that the compiled step gives the eager numbers bit for bit; its fake
kernel returns empty tensors of the batches' shapes and dtypes. The traced step makes every batch's direction
first, then this one call, then every batch's update (``Spectra._step_group``): each operator call is a
fusion barrier, and each stretch of element-wise code between two barriers one more generated kernel to
compile (on a CPU, one compiler run each). The price: the work tensors of all the group's matrix batches are
alive at once in the compiled step (one copy of the group's matrices), where the eager step holds one batch's.

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


def _one(U: torch.Tensor, name: str, c: float, steps: int | None, dtype: torch.dtype | None,
         kwargs: dict) -> torch.Tensor:
    fn = POST_TRANSFORMS[name]
    inplace = getattr(fn, "inplace", None)
    if inplace is not None:  # the optimizer's eager call, on a copy of its contiguous work tensor
        return inplace(U.clone(memory_format=torch.contiguous_format), c, steps, dtype, **kwargs)
    out = U.clone() if fn is None else fn(U, c, steps, dtype, **kwargs)
    if _alias(out, U):  # an operator's output must not alias its input
        out = out.clone(memory_format=torch.contiguous_format)
    return out.contiguous()  # the strides the fake kernel gives (a tall-transposed result is a transposed view)


def _post_transform(U: list[torch.Tensor], name: str, c: float, steps: int | None, dtype: torch.dtype | None,
                    regularizer: str, b: float, p: float | None) -> list[torch.Tensor]:
    """The kernel: transform ``name`` of each batch of ``U`` into a new tensor (``U`` unchanged)."""
    kwargs = {"regularizer": regularizer, "b": b, "p": p} if name in LMO_POSTS else {}
    return [_one(u, name, c, steps, dtype, kwargs) for u in U]


def _fake(U, name, c, steps, dtype, regularizer, b, p):
    return [torch.empty_like(u, memory_format=torch.contiguous_format) for u in U]


_LIB = torch.library.Library("spectrakit", "FRAGMENT")
_LIB.define("post_transform(Tensor[] U, str name, float c, int? steps, ScalarType? dtype, str regularizer, "
            "float b, float? p) -> Tensor[]")
_LIB.impl("post_transform", _post_transform, "CompositeExplicitAutograd")
torch.library.register_fake("spectrakit::post_transform", _fake, lib=_LIB)
post_transform_op = torch.ops.spectrakit.post_transform.default


def _key(batch: dict) -> tuple:
    kw = batch.get("post_kwargs") or {}
    return (batch["post"], float(batch["c"]), batch["steps"], batch["dtype"], str(kw.get("regularizer", "frobenius")),
            float(kw.get("b", 1.0)), None if kw.get("p") is None else float(kw["p"]))


def traced_transforms(batches: list[dict]) -> list[torch.Tensor]:
    """The transforms of ``batches`` (the dicts of ``Spectra._post_transform_groups``: ``U``, ``post``, ``c``,
    ``steps``, ``dtype``, ``post_kwargs``) as calls of ``torch.ops.spectrakit.post_transform``, one per run of
    consecutive batches with the same transform and arguments (for a step traced by ``torch.compile``); an
    identity (``post="none"``) returns ``U`` itself, as the eager hook."""
    out: list[torch.Tensor] = []
    i = 0
    while i < len(batches):
        key = _key(batches[i])
        j = i + 1
        while j < len(batches) and _key(batches[j]) == key:
            j += 1
        if POST_TRANSFORMS[key[0]] is None:
            out.extend(b["U"] for b in batches[i:j])
        else:
            out.extend(post_transform_op([b["U"] for b in batches[i:j]], *key))
        i = j
    return out
