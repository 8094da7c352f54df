"""Train a small ResNet on Fashion-MNIST with convolution spectral regularizers (Grishina, Gorbunov and Rakhuba 2024
§6.2–6.3).

Regularizers: none, F4, TN (``beta * sum_l bound(K_l)``) and the orthogonality penalties "2norm"
(``||T^T T - I||`` through the TN bound) and "ratio" (``sqrt(hw) ||K||_sigma / ||K||_F``). Reports test accuracy,
time per epoch and the per-layer TN bound at the end, and plots the TN bound of one layer vs epoch.
CPU-sized defaults (a subset, 2 epochs); use --train-size 60000 --test-size 10000 --epochs 15 on a GPU.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from spectrakit._cliargs import UsageError
from spectrakit._files import save_figure
from spectrakit.conv import ConvRegularizer, tn_bound
from spectrakit.conv.kernel import CONV_TYPES
from spectrakit.data.fashion_mnist import DEFAULT_ROOT, MISSING, available, load_fashion_mnist
from spectrakit.experiments.io import invocation, report
from spectrakit.experiments.options import conv_regularization as add_arguments  # noqa: F401 (its options)
from spectrakit.models.cnn import SmallResNet

REGULARIZERS = ("none", "f4", "tn", "2norm", "ratio")


def conv_tn_bounds(model) -> dict[str, float]:
    """Cold TN bound (100 sweeps, screened restarts) of every conv layer (without BN folding)."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, CONV_TYPES):
            out[name] = float(tn_bound(m.weight.detach(), stride=m.stride, dilation=m.dilation, groups=m.groups,
                                       spatial_dims=m.weight.ndim - 2)[0])
    return out


def _evaluate(model, x, y, batch_size):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            correct += int((model(x[i:i + batch_size]).argmax(1) == y[i:i + batch_size]).sum())
    model.train()
    return correct / len(x)


def run(regularizers=REGULARIZERS, epochs: int = 2, train_size: int = 4000, test_size: int = 2000,
        batch_size: int = 128, lr: float = 0.05, weight_decay: float = 5e-4, beta: float = 1e-3,
        widths=(8, 16, 32), track_layer: str = "layers.1.conv2", seed: int = 0, device: str = "cpu",
        root: str = DEFAULT_ROOT, history: dict | None = None) -> list[dict]:
    """One row per regularizer: test accuracy, time per epoch (s), final TN bound of ``track_layer`` and the
    mean/max over conv layers. ``history`` (if a dict) receives ``{reg: {"epoch_bounds": [...],
    "final_bounds": {...}}}`` for plots and JSON. Raises ``FileNotFoundError`` if Fashion-MNIST is missing."""
    for r in regularizers:
        if r not in REGULARIZERS:
            raise ValueError(f"regularizers must be a subset of {REGULARIZERS}, got {r!r}")
    xtr, ytr = load_fashion_mnist("train", root=root, limit=train_size)
    xte, yte = load_fashion_mnist("test", root=root, limit=test_size)
    xtr, ytr, xte, yte = (t.to(device) for t in (xtr, ytr, xte, yte))
    rows = []
    for reg_name in regularizers:
        torch.manual_seed(seed)
        model = SmallResNet(1, 10, tuple(widths), 1).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
        reg = None if reg_name == "none" else ConvRegularizer(model, beta, kind=reg_name)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        epoch_bounds, times, bounds = [], [], None
        for _ in range(epochs):
            t0 = time.perf_counter()
            perm = torch.randperm(len(xtr), generator=gen).to(device)
            for i in range(0, len(xtr), batch_size):
                idx = perm[i:i + batch_size]
                loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
                if reg is not None:
                    loss = loss + reg()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            bounds = conv_tn_bounds(model)  # every layer's: after the last epoch they are the final ones
            epoch_bounds.append(bounds[track_layer])
        final = bounds if bounds is not None else conv_tn_bounds(model)
        acc = _evaluate(model, xte, yte, 512)
        rows.append({"regularizer": reg_name, "beta": 0.0 if reg is None else beta, "test_acc": acc,
                     "time_per_epoch_s": sum(times) / len(times), f"TN[{track_layer}]": final[track_layer],
                     "TN mean": sum(final.values()) / len(final), "TN max": max(final.values())})
        if history is not None:
            history[reg_name] = {"epoch_bounds": epoch_bounds, "final_bounds": final}
    return rows


def plot(history: dict, track_layer: str, path: str) -> None:
    """TN bound of ``track_layer`` vs epoch, one line per regularizer (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, h in history.items():
        ax.plot(range(1, len(h["epoch_bounds"]) + 1), h["epoch_bounds"], marker="o", label=name)
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"TN bound of {track_layer}")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if not available(args.root):
        raise UsageError(MISSING.format(root=args.root).replace("pass root=", "pass --root FOLDER"))
    history: dict = {}
    rows = run(tuple(args.regularizers.split(",")), args.epochs, args.train_size, args.test_size, args.batch_size,
               args.lr, args.weight_decay, args.beta, tuple(int(w) for w in args.widths.split(",")),
               args.track_layer, args.seed, args.device, args.root, history)
    report("conv-regularization (Fashion-MNIST, SmallResNet)", rows, args.out,
           command=invocation("experiment", f"spectrakit experiment conv-regularization --epochs {args.epochs} "
                              f"--train-size {args.train_size} --regularizers {args.regularizers}"),
           extra={"history": history})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        plot(history, args.track_layer, os.path.join(args.out, "bound_vs_epoch.png"))
    return 0
