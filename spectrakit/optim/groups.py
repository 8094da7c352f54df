"""Parameter groups for any ``nn.Module``: which parameters get the spectral update, which get AdamW.

:func:`param_groups` sorts every trainable parameter of a model, exactly once (tied or shared weights once),
into one of four kinds:

- ``embedding``: the weight of an ``nn.Embedding``;
- ``head``: the output head, i.e. a ``>= 2``-D parameter of a module named ``head``/``lm_head`` (or named by
  the caller), or, when no module has such a name, the weight of the last ``nn.Linear`` if it is shaped like
  an embedding table ``(vocab, d)``; a head tied to the embedding is the embedding (one parameter);
- ``vector``: parameters with ``ndim < 2`` (biases, norm gains);
- ``matrix``: every other parameter (Linear weights, conv kernels viewed as ``(out, in k k)``, other
  ``>= 2``-D parameters).

Each of ``embeddings``, ``head`` and ``vectors`` is routed by an option:
``"default"`` (the optimizer's own update: for SPECTRA the spectral post clip with
``alpha = max(1, sqrt(m/n))``), ``"adamw"`` (a side group ``base="adamw", post="none", scale="none"``
updated by plain AdamW inside a spectrakit optimizer; ``scale="none"`` matters: without it the group would
inherit Muon's ``scale="muon"`` and scale the AdamW step of a ``(vocab, d)`` table by ``sqrt(vocab/d)``)
or a dict of group options (its own group, e.g. ``{"scale": 0.25}``)."""

# Weights stored transposed, ``(in, out)`` instead of ``(out, in)``: the ``Conv1D`` of Hugging Face GPT-2 (a
# module class named ``Conv1D`` with ``nf`` outputs, ``nx`` inputs and weight ``(nx, nf)``) and the ``weight``
# of any module with the attribute ``spectrakit_transposed = True``. The spectral maps are orientation-free
# (``f(W^T) = f(W)^T`` for the soft clip, ``msign``, the hard clip), the update scale is not:
# ``alpha = max(1, sqrt(m/n))`` must use the true ``(m, n) = (out, in)``. Such weights get their own groups with
# the numeric ``scale`` of their true shape (one group per value) when the optimizer's scale is
# ``"spectra"``/``"muon"``/``"auto"``; the symmetric ``"moonlight"`` and ``"none"`` need nothing (pass
# ``optimizer=DMuon`` for D-Muon).
# The defaults follow the reference code of SPECTRA (Jiang, Semenov and Stich 2026): every ``>= 2``-D
# parameter, the untied embedding and head included, gets the spectral update and weight decay; 1-D
# parameters get no weight decay. For Muon and D-Muon (Jordan et al. 2024; Liu et al. 2025), which are meant
# for hidden matrices, the embedding, head and 1-D parameters default to the AdamW side groups.

from __future__ import annotations

import math

import torch
from torch import nn

from spectrakit._checks import check_scalar

KINDS = ("matrix", "embedding", "head", "vector")
TRANSPOSED_ATTR = "spectrakit_transposed"
HEAD_MODULE_NAMES = ("head", "lm_head")
ADAMW_BETAS = (0.8, 0.999)


def classify(model: nn.Module, head_names=()) -> list[tuple[str, nn.Parameter, str]]:
    """``(name, parameter, kind)`` for every trainable parameter of ``model``, each once (first name),
    with ``kind`` in :data:`KINDS` as described in the module docstring. ``head_names``: parameter or module
    names (e.g. ``"classifier"``) to treat as the head."""
    head_names = {head_names} if isinstance(head_names, str) else set(head_names)
    embeds = {id(m.weight): tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Embedding)}
    named = [
        n for n, m in model.named_modules()
        if n.rpartition(".")[2] in HEAD_MODULE_NAMES or n in head_names
    ]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    shaped_heads = set()
    if not named and linears and tuple(linears[-1].weight.shape) in set(embeds.values()):
        shaped_heads.add(id(linears[-1].weight))
    seen, out = set(), []
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        module = name.rpartition(".")[0]
        if p.ndim < 2:
            kind = "vector"
        elif id(p) in embeds:
            kind = "embedding"
        elif (
            id(p) in shaped_heads
            or module.rpartition(".")[2] in HEAD_MODULE_NAMES
            or name in head_names
            or module in head_names
        ):
            kind = "head"
        else:
            kind = "matrix"
        out.append((name, p, kind))
    return out


def transposed_weights(model: nn.Module) -> set[int]:
    """``id`` of every 2-D weight of ``model`` stored ``(in, out)`` (see the module docstring): Hugging Face's
    ``Conv1D`` (GPT-2) and modules that set ``spectrakit_transposed = True``."""
    out = set()
    for m in model.modules():
        w = getattr(m, "weight", None)
        if not isinstance(w, torch.Tensor) or w.ndim != 2:
            continue
        hf_conv1d = type(m).__name__ == "Conv1D" and tuple(w.shape) == (getattr(m, "nx", None), getattr(m, "nf", None))
        if hf_conv1d or getattr(m, TRANSPOSED_ATTR, False) is True:
            out.add(id(w))
    return out


def _default_scale_post(optimizer) -> tuple:
    """``(scale, post)`` the optimizer class gives a group that sets neither (SPECTRA's when unknown)."""
    preset = dict(getattr(optimizer, "preset", {})) if isinstance(optimizer, type) else {}
    post = preset.get("post", "newton_schulz5" if _is_muon(optimizer) else "soft_clip")
    return preset.get("scale", "auto"), post


def _split_transposed(params, names, transposed, optimizer, fused) -> tuple[list, list, dict]:
    """Split a spectral group's parameters into the plain ones and, per ``(alpha, blocks)``, the transposed ones
    (``alpha`` of the true ``(out, in)`` matrix, or of one block: only where the scale depends on the
    orientation; else None) and the fused ones (``blocks`` from :func:`fused_splits`)."""
    from spectrakit.optim.transforms import block_shape, update_scale

    scale, post = _default_scale_post(optimizer)
    plain, by_key = ([], []), {}
    oriented = scale in ("spectra", "muon", "auto") and not (scale == "auto" and post == "none")
    for p, n in zip(params, names):
        blocks = fused.get(id(p), (1, 1))
        if id(p) in transposed and oriented:
            bm, bn = block_shape((int(p.shape[0]), int(math.prod(p.shape[1:]))), blocks)
            key = (update_scale(scale, post, bn, bm), blocks)
        elif blocks != (1, 1):
            key = (None, blocks)
        else:
            plain[0].append(p)
            plain[1].append(n)
            continue
        ps, ns = by_key.setdefault(key, ([], []))
        ps.append(p)
        ns.append(n)
    return plain[0], plain[1], by_key


def _is_muon(optimizer) -> bool:
    from spectrakit.optim.presets import DMuon, Muon

    return isinstance(optimizer, type) and issubclass(optimizer, (Muon, DMuon))


def _route(option, arg: str, adamw: dict):
    if option is None or option == "default":
        return None
    if option == "adamw":
        return adamw
    if isinstance(option, dict):
        return dict(option)
    raise ValueError(f"{arg} must be 'default', 'adamw' or a dict of group options, got {option!r}")


class ParamGroups(list):
    """The list of param-group dicts from :func:`param_groups` (pass it to any optimizer), plus
    ``kinds`` and ``names`` (per group) and :meth:`table`, a readable summary (also ``str(groups)``)."""

    def __init__(self, groups, kinds, names, optimizer=None):
        super().__init__(groups)
        self.kinds, self.names, self.optimizer = list(kinds), list(names), optimizer

    def table(self) -> str:
        defaults = {}
        if isinstance(self.optimizer, type):
            defaults = dict(getattr(self.optimizer, "preset", {}))
            if _is_muon(self.optimizer):
                defaults.setdefault("post", "newton_schulz5")
        return param_group_table(self, defaults=defaults, names=self.names, kinds=self.kinds)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        n = sum(len(g["params"]) for g in self)
        return f"ParamGroups({len(self)} groups, {n} parameters)\n{self.table()}"


def param_groups(
    model: nn.Module,
    *,
    optimizer: type | None = None,
    embeddings=None,
    head=None,
    vectors=None,
    weight_decay: float = 0.1,
    head_names=(),
    adamw_lr: float | None = None,
    adamw_betas: tuple[float, float] = ADAMW_BETAS,
    split_fused: dict | None = None,
) -> ParamGroups:
    """Param groups of ``model`` for a spectral optimizer (or any ``torch.optim`` optimizer).

    Every trainable parameter appears exactly once (:func:`classify`). Groups, in this order, empty ones
    dropped: ``matrix`` (hidden matrices plus the embedding/head routed ``"default"``; weight decay
    ``weight_decay``), then the matrices stored ``(in, out)`` (:func:`transposed_weights`) with the numeric
    ``scale`` of their ``(out, in)`` matrix, one group per value, ``embedding`` (embedding and head together
    when both have the same non-default option, else the embedding alone), ``head``, ``vector`` (``weight_decay = 0``).

    Args:
        model: any ``nn.Module`` (spectrakit models, Hugging Face ``transformers`` models, CNNs).
        optimizer: the optimizer class the groups are for; :class:`~spectrakit.optim.Muon` and
            :class:`~spectrakit.optim.DMuon` (and subclasses) switch the defaults of ``embeddings``,
            ``head`` and ``vectors`` to ``"adamw"``; other classes keep SPECTRA's reference routing.
        embeddings, head, vectors: ``"default"``, ``"adamw"`` or a dict of group options (see the module
            docstring); ``None`` takes the default for ``optimizer``.
        weight_decay: decoupled weight decay of matrices, embedding and head, >= 0 (1-D parameters: 0).
        head_names: parameter or module names of an output head the shape rule does not find.
        adamw_lr: LR of the ``"adamw"`` groups, > 0 (default: the optimizer's ``lr``).
        adamw_betas: betas of the ``"adamw"`` groups (default (0.8, 0.999), the AdamW of the SPECTRA paper).
        split_fused: ``{name: k}``: the matrices whose parameter or module name is ``name`` or ends with
            ``"." + name`` hold ``k`` equal blocks along their output dimension (a fused QKV weight: 3), each
            updated as a matrix of its own (their group's ``split_fused``, rows or, for an ``(in, out)`` weight,
            columns); see :func:`fused_splits`.

    Returns:
        :class:`ParamGroups`, a list of dicts ``{"params": [...], "weight_decay": ..., ...}``.

    Raises:
        ValueError: an unknown option, ``weight_decay < 0``, ``adamw_lr <= 0``, or a ``split_fused`` name that
        matches no matrix or a ``k`` that does not divide its output dimension. TypeError: ``model`` is not
        an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_scalar(weight_decay, "weight_decay", low=0, allow_tensor=False)
    adamw = {"base": "adamw", "post": "none", "scale": "none", "betas": tuple(adamw_betas)}
    if adamw_lr is not None:
        check_scalar(adamw_lr, "adamw_lr", low=0, low_inclusive=False, allow_tensor=False)
        adamw["lr"] = float(adamw_lr)
    if _is_muon(optimizer):
        embeddings, head, vectors = (("adamw" if o is None else o) for o in (embeddings, head, vectors))
    routes = {
        "matrix": None,
        "embedding": _route(embeddings, "embeddings", adamw),
        "head": _route(head, "head", adamw),
        "vector": _route(vectors, "vectors", adamw),
    }
    buckets = {k: ([], []) for k in KINDS}
    embeds = set()
    for name, p, kind in classify(model, head_names):
        if kind == "embedding":
            embeds.add(id(p))
        if kind in ("embedding", "head") and routes[kind] is None:
            target = "matrix"
        elif kind == "head" and routes["head"] == routes["embedding"]:
            target = "embedding"
        else:
            target = kind
        buckets[target][0].append(p)
        buckets[target][1].append(name)
    groups, kinds, names = [], [], []
    transposed = transposed_weights(model)
    fused = fused_splits(buckets["matrix"][0], buckets["matrix"][1], transposed, split_fused)
    for kind, (ps, ns) in buckets.items():
        wd = 0.0 if kind == "vector" else float(weight_decay)
        split = {}
        if kind == "matrix":
            ps, ns, split = _split_transposed(ps, ns, transposed, optimizer, fused)
        if ps:
            groups.append({"params": ps, "weight_decay": wd, **(routes[kind] or {})})
            kinds.append("head" if kind == "embedding" and not any(id(p) in embeds for p in ps) else kind)
            names.append(ns)
        for (alpha, blocks), (tps, tns) in split.items():  # (in, out) or fused weights: groups of their own
            group = {"params": tps, "weight_decay": wd}
            if alpha is not None:  # the scale of the (out, in) matrix (of one block)
                group["scale"] = alpha
            if blocks != (1, 1):
                group["split_fused"] = blocks
            groups.append(group)
            label = "matrix(in,out)" if id(tps[0]) in transposed else "matrix"
            kinds.append(label + (f" split {blocks[0]}x{blocks[1]}" if blocks != (1, 1) else ""))
            names.append(tns)
    return ParamGroups(groups, kinds, names, optimizer)


def fused_splits(params, names, transposed: set[int], split_fused: dict | None) -> dict[int, tuple[int, int]]:
    """``{id(p): (r, c)}``, the blocks of each fused matrix named in ``split_fused`` (see :func:`param_groups`):
    ``(k, 1)`` for a weight stored ``(out, in)``, ``(1, k)`` for one stored ``(in, out)``; conv kernels split their
    output channels. Every name must match a matrix and every ``k`` divide its output dimension (ValueError)."""
    if not split_fused:
        return {}
    if not isinstance(split_fused, dict):
        raise TypeError(f"split_fused must be a dict {{name: blocks}}, got {type(split_fused).__name__}")
    for key, k in split_fused.items():
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"split_fused[{key!r}] must be an int >= 1 (blocks along the output dimension), "
                             f"got {k!r}")
    out, used = {}, set()
    for p, name in zip(params, names):
        module = name.rpartition(".")[0]
        for key, k in split_fused.items():
            if not any(x == key or x.endswith("." + key) for x in (name, module)):
                continue
            used.add(key)
            flipped = id(p) in transposed
            rows = int(p.shape[1] if flipped else p.shape[0])
            if rows % k:
                raise ValueError(f"split_fused[{key!r}] = {k} does not divide the output dimension {rows} of "
                                 f"{name} (shape {tuple(p.shape)})")
            out[id(p)] = (1, k) if flipped else (k, 1)
    missing = sorted(set(split_fused) - used)
    if missing:
        raise ValueError(f"split_fused names {missing} match no matrix parameter of the model (names are "
                         "parameter or module names, or their last parts, e.g. 'c_attn' or 'in_proj_weight')")
    return out


def _update_rule(group: dict, defaults: dict, p: torch.Tensor) -> str:
    """``base/post`` as the optimizer applies it: a ``post`` transform acts on matrices only; a 1-D or 0-d
    parameter gets the vector clip when ``vector_clip`` is set, else nothing after its base."""
    base = group.get("base", defaults.get("base", "-"))
    post = group.get("post", defaults.get("post", "-"))
    if p.ndim < 2 and post != "-":
        vclip = group.get("vector_clip", defaults.get("vector_clip", False))
        post = {True: "vector_clip", "reference": "vector_clip_reference"}.get(vclip, "none")
    return f"{base}/{post}"


def _alpha(group: dict, defaults: dict, p: torch.Tensor) -> str:
    from spectrakit.optim.transforms import block_shape, update_scale

    scale = group.get("scale", defaults.get("scale", "auto"))
    post = group.get("post", defaults.get("post", "soft_clip"))
    if p.ndim < 2:
        return f"{scale:g}" if not isinstance(scale, str) else "1"
    shape = block_shape((int(p.shape[0]), int(math.prod(p.shape[1:]))), group.get("split_fused"))
    return f"{update_scale(scale, post, *shape):.3g}"


def param_group_table(groups, model: nn.Module | None = None, *, defaults=None, names=None, kinds=None) -> str:
    """A text table with one row per parameter: name, shape, group index and kind, update rule (``post``
    and ``base``), ``alpha`` (the update scale of :func:`spectrakit.optim.update_scale`), weight decay, lr.

    ``groups``: a :class:`ParamGroups` or an optimizer (then ``model`` supplies the names, and the optimizer's
    groups their actual values)."""
    if isinstance(groups, torch.optim.Optimizer):
        defaults = groups.defaults
        groups = groups.param_groups
    defaults = defaults or {}
    by_id = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    flipped = transposed_weights(model) if model is not None else set()
    rows = [("name", "shape", "group", "update", "alpha", "wd", "lr")]
    for gi, g in enumerate(groups):
        kind = kinds[gi] if kinds else ""
        for j, p in enumerate(g["params"]):
            name = names[gi][j] if names else by_id.get(id(p), f"[{gi}][{j}]")
            lr = g.get("lr", defaults.get("lr"))
            rows.append((
                name, ("x".join(map(str, p.shape)) or "scalar") + (" matrix(in,out)" if id(p) in flipped else ""),
                f"{gi}:{kind}" if kind else str(gi),
                _update_rule(g, defaults, p), _alpha(g, defaults, p),
                f"{g.get('weight_decay', defaults.get('weight_decay', 0)):g}",
                "-" if lr is None else f"{lr:g}",
            ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def print_param_groups(groups, model: nn.Module | None = None) -> None:
    """Print :func:`param_group_table` of ``groups`` (a :class:`ParamGroups` or an optimizer and its model)."""
    if isinstance(groups, ParamGroups):
        print(groups.table())
    else:
        print(param_group_table(groups, model))
