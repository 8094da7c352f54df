"""Per-layer spectral-norm bounds and the product Lipschitz bound of a model (Grishina, Gorbunov and Rakhuba 2024 §4,
eq. (6); App. F).

The bounds are those of :func:`spectrakit.conv.report.lipschitz_report`, which prints the table.
"""

from __future__ import annotations

import argparse
import json
import os

from spectrakit._cliargs import UsageError, positive_int, shape

# the models of spectrakit.models.cnn (a test keeps the two lists equal): --help needs no torch
MODEL_NAMES = ("cnn-small", "resnet-small", "resnet-tiny")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="cnn-small", choices=MODEL_NAMES,
                        help="built-in model (also the architecture for a state_dict --checkpoint)")
    parser.add_argument("--checkpoint", default=None,
                        help="state_dict of --model: a torch.save'd state_dict or a spectrakit checkpoint "
                        "folder (loaded safely: tensors only, never code)")
    parser.add_argument("--input-shape", type=shape, default=(1, 28, 28),
                        help="input shape without the batch dim, e.g. 3,32,32 (default: 1,28,28)")
    parser.add_argument("--exact", action="store_true", help="also compute the exact value per conv layer")
    parser.add_argument("--iters", type=positive_int, default=100, help="HOPM / power iterations")
    parser.add_argument("--json", default=None, help="write the report as JSON to this path")


def _load_weights(path: str) -> dict:
    """The model state_dict in ``path``: a ``torch.save``d state_dict, a dict with a ``"model"`` entry, or a
    spectrakit checkpoint folder / step directory; read with ``weights_only=True`` (never executes code)."""
    import torch

    from spectrakit.checkpoint import STATE_FILE, CheckpointError, resolve, safe_load

    try:
        if os.path.isdir(path):
            obj = resolve(path, lambda d: safe_load(os.path.join(d, STATE_FILE)))[1]
        else:
            obj = safe_load(path)
    except (CheckpointError, FileNotFoundError) as e:
        raise UsageError(f"--checkpoint: {e}") from None
    obj = obj.get("model", obj) if isinstance(obj, dict) else obj
    if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
        raise UsageError(f"--checkpoint: {path} holds no state_dict (save model.state_dict(), not the model)")
    return obj


def run(args: argparse.Namespace) -> int:
    from spectrakit.conv.report import lipschitz_report
    from spectrakit.models.cnn import MODELS, build_model

    model = build_model(args.model)
    if args.checkpoint:
        weights = _load_weights(args.checkpoint)
        try:
            model.load_state_dict(weights)
        except RuntimeError:  # keys or shapes of another model (e.g. a language model of `compare`)
            from spectrakit.checkpoint import model_mismatch

            raise UsageError(f"--checkpoint {args.checkpoint}: its weights are not those of --model {args.model} "
                             f"({model_mismatch(model.state_dict(), weights)}; choose the --model it was trained "
                             f"as: {', '.join(sorted(MODELS))})") from None
    result = lipschitz_report(model, tuple(args.input_shape), exact=args.exact, iters=args.iters)
    if args.json:
        from spectrakit._files import write_atomic

        write_atomic(args.json, json.dumps(result, indent=1))
    return 0
