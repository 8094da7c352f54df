"""Per-layer spectral-norm bounds and the product Lipschitz bound of a model (Grishina, Gorbunov and Rakhuba 2024 §4,
eq. (6); App. F).

``Lip(f_L o .. o f_1) <= prod_l Lip(f_l)``: Linear layers contribute ``||W||_2`` (warm-started power
iteration), convolutions their TN bound (BatchNorm in eval mode folded into the preceding convolution:
``K'[o] = K[o] gamma_o / sqrt(var_o + eps)``), a BatchNorm without a preceding convolution
``max |gamma/sqrt(var+eps)|``,
and ReLU-type activations, flatten, dropout and average pooling 1. The product is a certified upper bound only
for a sequential chain of such layers; for models with skip connections it is reported but flagged.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
from torch import nn

from spectrakit._checks import check_int
from spectrakit.conv.exact import exact_circular, exact_zero_pad
from spectrakit.conv.kernel import CONV_TYPES
from spectrakit.conv.power import top_singular
from spectrakit.conv.tensor_norm import tn_bound
from spectrakit.conv.unfolding_bound import f4_bound
from spectrakit.experiments.io import markdown_table

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_ONE_LIPSCHITZ = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.GELU, nn.Flatten, nn.Dropout, nn.Identity,
                  nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)


def _bn_scale(bn) -> torch.Tensor:
    scale = torch.rsqrt(bn.running_var + bn.eps)
    return scale * bn.weight if bn.weight is not None else scale


def _padding(conv, k_eff):
    if isinstance(conv.padding, str):
        return tuple(0 for _ in k_eff) if conv.padding == "valid" else tuple(k // 2 for k in k_eff)
    return tuple(conv.padding)


def lipschitz_report(model: nn.Module, input_shape, *, exact: bool = False, iters: int = 100,
                     exact_iters: int = 300, verbose: bool = True) -> dict:
    """Per-layer bounds of ``model`` for inputs of shape ``input_shape`` (without the batch dim).

    Returns ``{"layers": [row, ...], "product": float, "sequential": bool}``; each row has the layer ``name``,
    ``type``, ``shape``, the ``input`` size, ``tn`` and ``f4`` bounds (convs), ``exact`` (zero-padding power
    iteration or circular FFT value, convs, when ``exact=True``), ``bn_folded`` and ``bound`` (the factor used in
    the product: TN for convs, ``||W||_2`` for Linear). ``iters`` >= 1 HOPM / power iterations;
    ``exact_iters`` >= 1 for the exact zero-padding value. Prints a markdown table when ``verbose``.
    Raises ``TypeError``/``ValueError`` for a non-module or bad shapes.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_int(iters, "iters", low=1)
    check_int(exact_iters, "exact_iters", low=1)
    input_shape = tuple(int(s) for s in input_shape)
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
    order: list[tuple[str, nn.Module, tuple]] = []
    names = {m: n for n, m in model.named_modules()}
    hooks = [m.register_forward_hook(lambda m, i, o: order.append((names[m], m, tuple(i[0].shape[1:]))))
             for m in model.modules() if len(list(m.children())) == 0]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape, device=device, dtype=dtype))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    rows, product, sequential = [], 1.0, isinstance(model, nn.Sequential)
    i = 0
    with torch.no_grad():
        while i < len(order):
            name, mod, in_shape = order[i]
            row = {"name": name, "type": type(mod).__name__, "input": "x".join(map(str, in_shape))}
            if isinstance(mod, CONV_TYPES):
                W = mod.weight.detach()
                d = W.ndim - 2
                folded = i + 1 < len(order) and isinstance(order[i + 1][1], _BN)
                if folded:
                    W = W * _bn_scale(order[i + 1][1]).reshape(-1, *([1] * (d + 1)))
                geo = dict(stride=mod.stride, dilation=mod.dilation, groups=mod.groups, spatial_dims=d)
                tn, _ = tn_bound(W, iters=iters, **geo)
                f4, _ = f4_bound(W, **geo)
                row.update(shape="x".join(map(str, W.shape)), stride=str(tuple(mod.stride)), bn_folded=folded,
                           tn=float(tn), f4=float(f4))
                if exact:
                    n = in_shape[1:]
                    if mod.padding_mode == "circular":
                        row["exact"] = float(exact_circular(W, n, **geo))
                    else:
                        k_eff = [r * (k - 1) + 1 for r, k in zip(mod.dilation, W.shape[2:])]
                        ex, _ = exact_zero_pad(W, n, padding=_padding(mod, k_eff), iters=exact_iters, **geo)
                        row["exact"] = float(ex)
                row["bound"] = row["tn"]
                i += 2 if folded else 1
            elif isinstance(mod, nn.Linear):
                s, _ = top_singular(mod.weight.detach(), iters=iters)
                row.update(shape="x".join(map(str, mod.weight.shape)), bound=float(s))
                i += 1
            elif isinstance(mod, _BN):
                row["bound"] = float(_bn_scale(mod).abs().max())
                i += 1
            else:
                row["bound"] = 1.0
                if not isinstance(mod, _ONE_LIPSCHITZ):
                    row["note"] = "assumed 1-Lipschitz"
                    sequential = False
                i += 1
            product *= row["bound"]
            rows.append(row)
    result = {"layers": rows, "product": product, "sequential": sequential}
    if verbose:
        cols = ["name", "type", "shape", "stride", "input", "bn_folded", "f4", "tn"] + (["exact"] if exact else [])
        print(markdown_table(rows, cols + ["bound"]))
        flag = "" if sequential else " (not certified: the model is not a plain sequential chain)"
        print(f"\nproduct of per-layer bounds: {product:.6g}{flag}")
    if not math.isfinite(product):
        result["product"] = float("inf")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spectrakit.models.cnn import MODELS

    parser.add_argument("--model", default="cnn-small", choices=sorted(MODELS),
                        help="built-in model (also the architecture for a state_dict --checkpoint)")
    parser.add_argument("--checkpoint", default=None,
                        help="state_dict of --model: a torch.save'd state_dict or a spectrakit checkpoint "
                        "folder (loaded safely: tensors only, never code)")
    parser.add_argument("--input-shape", default="1,28,28", help="input shape without the batch dim, e.g. 3,32,32")
    parser.add_argument("--exact", action="store_true", help="also compute the exact value per conv layer")
    parser.add_argument("--iters", type=int, default=100, help="HOPM / power iterations")
    parser.add_argument("--json", default=None, help="write the report as JSON to this path")


def _load_weights(path: str) -> dict:
    """The model state_dict in ``path``: a ``torch.save``d state_dict, a dict with a ``"model"`` entry, or a
    spectrakit checkpoint folder / step directory; read with ``weights_only=True`` (never executes code)."""
    from spectrakit._cliargs import UsageError
    from spectrakit.train.checkpoint import STATE_FILE, CheckpointError, _resolve, safe_load

    try:
        if os.path.isdir(path):
            obj = _resolve(path, lambda d: safe_load(os.path.join(d, STATE_FILE)))[1]
        else:
            obj = safe_load(path)
    except (CheckpointError, FileNotFoundError) as e:
        raise UsageError(f"--checkpoint: {e}") from None
    obj = obj.get("model", obj) if isinstance(obj, dict) else obj
    if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
        raise UsageError(f"--checkpoint: {path} holds no state_dict (save model.state_dict(), not the model)")
    return obj


def run(args: argparse.Namespace) -> int:
    from spectrakit.models.cnn import MODELS, build_model

    model = build_model(args.model)
    if args.checkpoint:
        from spectrakit._cliargs import UsageError

        try:
            model.load_state_dict(_load_weights(args.checkpoint))
        except RuntimeError:  # keys or shapes of another model (e.g. a language model of `compare`)
            raise UsageError(f"--checkpoint {args.checkpoint}: its weights are not those of --model {args.model} "
                             f"(choose the --model it was trained as: {', '.join(sorted(MODELS))})") from None
    shape = tuple(int(s) for s in args.input_shape.split(","))
    result = lipschitz_report(model, shape, exact=args.exact, iters=args.iters)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0
