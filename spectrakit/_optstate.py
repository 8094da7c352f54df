"""Validation of a loaded optimizer state against the optimizer's parameters, before anything is applied.

A state dict is data from a file: a moment of the wrong shape reaches a fused kernel that writes past its
buffer, a missing one a ``KeyError`` deep in the step. :func:`check_state_dict` compares every saved state
with the state the optimizer would create for that parameter (key names, shapes, a floating dtype, finite
values) and raises one ``ValueError`` naming the parameter, the key, what was expected and what was found.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch


def _local(v: torch.Tensor) -> torch.Tensor:
    return v.to_local() if hasattr(v, "to_local") else v  # a DTensor's shard (finiteness is checked per rank)


def _where(i: int, names: list | None) -> str:
    name = names[i] if names is not None and i < len(names) else None
    return f"parameter {i}" + (f" ({name})" if isinstance(name, str) else "")


def _check_counter(v, where: str, key: str) -> None:
    if torch.is_tensor(v):
        ok = v.ndim == 0 and not v.is_complex() and v.dtype != torch.bool
        if ok:
            x = _local(v).detach().double().cpu()
            ok = bool(torch.isfinite(x)) and float(x) >= 0
        found = f"a tensor of shape {tuple(v.shape)}, dtype {v.dtype}"
        if v.ndim == 0 and not ok and v.dtype.is_floating_point:
            found = f"{float(_local(v).detach().cpu())}"
    else:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        found = repr(v)[:40]
    if not ok:
        raise ValueError(f"cannot load the optimizer state: {where}, key {key!r}: expected a finite count >= 0 "
                         f"(a number or a 0-d tensor), found {found}")


def _check_moment(v, t: torch.Tensor, dtypes: set, where: str, key: str) -> None:
    if not torch.is_tensor(v):
        raise ValueError(f"cannot load the optimizer state: {where}, key {key!r}: expected a tensor of shape "
                         f"{tuple(t.shape)}, found {type(v).__name__}")
    if tuple(v.shape) != tuple(t.shape):
        raise ValueError(f"cannot load the optimizer state: {where}, key {key!r}: expected shape "
                         f"{tuple(t.shape)}, found {tuple(v.shape)}")
    if v.dtype not in dtypes:
        raise ValueError(f"cannot load the optimizer state: {where}, key {key!r}: expected dtype "
                         f"{' or '.join(sorted(map(str, dtypes)))}, found {v.dtype}")
    if not bool(torch.isfinite(_local(v)).all()):
        raise ValueError(f"cannot load the optimizer state: {where}, key {key!r}: holds non-finite values")


def check_state_dict(optimizer: torch.optim.Optimizer, state_dict,
                     expected: Callable[[dict, dict, torch.Tensor], dict], *, optional: Iterable[str] = (),
                     may_lack: Iterable[str] = (), counters: Iterable[str] = ("step",)) -> None:
    """Raise ``ValueError`` unless ``state_dict`` fits ``optimizer``: the same number of groups and parameters
    per group, and each saved state ``s`` of parameter ``p`` has exactly the keys of ``expected(group,
    saved_group, meta_p)`` (meta tensors) plus any of ``optional``, less any of ``may_lack``; each moment
    has ``p``'s shape, the template's or ``p``'s dtype and finite values; each of ``counters`` is a finite
    number >= 0 (a number or a 0-d tensor). ``meta_p`` is ``p`` on the meta device. Nothing is changed."""
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict) \
            or not isinstance(state_dict.get("param_groups"), list):
        raise ValueError("cannot load the optimizer state: expected a dict with 'state' (a dict) and "
                         f"'param_groups' (a list), found {type(state_dict).__name__}")
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"cannot load the optimizer state: it has {len(saved_groups)} param groups, the optimizer "
                         f"{len(optimizer.param_groups)}")
    state, optional, may_lack, counters, index = state_dict["state"], set(optional), set(may_lack), set(counters), 0
    for gi, (group, saved) in enumerate(zip(optimizer.param_groups, saved_groups)):
        if not isinstance(saved, dict) or not isinstance(saved.get("params"), list) \
                or len(saved["params"]) != len(group["params"]):
            found = len(saved["params"]) if isinstance(saved, dict) and isinstance(saved.get("params"), list) else "?"
            raise ValueError(f"cannot load the optimizer state: param group {gi} has {found} parameters, the "
                             f"optimizer's {len(group['params'])}")
        names = saved.get("param_names", group.get("param_names"))
        for j, (pid, p) in enumerate(zip(saved["params"], group["params"])):
            where = _where(index + j, None) if names is None else _where(j, names) + f" of group {gi}"
            s = state.get(pid) if isinstance(pid, (int, str)) else None
            if s is None:
                continue
            if not isinstance(s, dict):
                raise ValueError(f"cannot load the optimizer state: {where}: expected a dict, found {type(s).__name__}")
            meta = torch.empty(p.shape, dtype=p.dtype, device="meta")
            template = expected(group, saved, meta)
            missing = sorted(set(template) - set(s) - may_lack)
            extra = sorted(set(s) - set(template) - optional, key=str)
            if missing or extra:
                what = f"missing key {missing[0]!r}" if missing else f"unexpected key {str(extra[0])[:60]!r}"
                raise ValueError(f"cannot load the optimizer state: {where}: {what} (expected keys "
                                 f"{sorted(template)})")
            for key, t in template.items():
                if key not in s:
                    continue
                if key in counters:
                    _check_counter(s[key], where, key)
                else:
                    _check_moment(s[key], t, {t.dtype, p.dtype}, where, key)
        index += len(group["params"])
