"""Robustness of spectral clipping to rank-r spectral-spike noise (Jiang, Semenov and Stich 2026 §4.2, §F.1.2, Fig.
F.5/F.6).

Matrix logistic regression (``d x d`` features, ``n`` samples, as in :mod:`.fw_logistic`) with the
stochastic gradient oracle ``g(X) = grad f(X) + N``, ``N = l U V^T``, where ``U, V`` (``d x r``) are drawn
fresh at every step uniformly from the Stiefel manifold as ``A (A^T A)^(-1/2)``, ``A ~ N(0, 1)``.
Methods (all :class:`spectrakit.optim.Spectra`, ``eta_k = eta_0 / sqrt(k+1)`` via ``LambdaLR``):

- ``sgd``: vanilla SGD (post ``none``);
- ``sgd+global_clip``: ``X <- X - eta_k min(1, c/||g||_F) g`` (post ``global_clip``);
- ``sgd+spectral_clip``: ``X <- X - eta_k clip^sp_c(g)`` (post ``hard_clip``, exact SVD), ``c = M``;
- ``sgdm`` / ``sgdm+pre_clip`` (Fig. F.6): EMA momentum 0.9 without / with the spectral clip of the raw
  gradient before the momentum (``pre_c = M``, pre ``hard_clip``).

``M`` is the gradient spectral-norm bound ``(1/n) sum_i ||A_i||_2`` (about 15 for d = 50). Two protocols:
``shared``: one ``eta_0``, tuned once (best final loss of vanilla SGD at the smallest noise level) and
used by every method at every noise level; ``tuned``: ``eta_0`` tuned per method and noise level over the
grid (the paper's protocol). Reported: final training loss ``f(X_K)`` (mean over the last 10% of steps).
"""

from __future__ import annotations

import argparse
import math
import os

import torch

from spectrakit._checks import check_int
from spectrakit._files import save_figure
from spectrakit.experiments.fw_logistic import logistic_data, logistic_grad, logistic_loss
from spectrakit.experiments.io import invocation, report
from spectrakit.experiments.options import spike_noise as add_arguments  # noqa: F401 (its options)
from spectrakit.optim import Spectra

METHODS = {
    "sgd": dict(post="none", momentum=0.0),
    "sgd+global_clip": dict(post="global_clip", momentum=0.0),
    "sgd+spectral_clip": dict(post="hard_clip", momentum=0.0),
    "sgdm": dict(post="none", momentum=0.9, dampening=0.9),
    "sgdm+pre_clip": dict(post="none", momentum=0.9, dampening=0.9, pre="hard_clip"),
}


def stiefel(d: int, r: int, gen: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """Uniform sample on the Stiefel manifold ``{U in R^{d x r}: U^T U = I}``: ``A (A^T A)^(-1/2)``."""
    A = torch.randn(d, r, generator=gen, dtype=dtype)
    evals, evecs = torch.linalg.eigh(A.T @ A)
    return A @ (evecs * evals.rsqrt()) @ evecs.T


def gradient_bound(A: torch.Tensor) -> float:
    """``M = (1/n) sum_i ||A_i||_2``, the bound on ``||grad f||_2`` of the logistic loss."""
    return float(torch.linalg.matrix_norm(A, ord=2).mean())


def train(
    A, y, method: str, lr0: float, noise: float, rank: int, c: float, steps: int, seed: int = 0
) -> list[float]:
    """Run one method; returns the training loss after every step (inf once it diverges)."""
    opts = dict(METHODS[method])
    if method == "sgdm+pre_clip":
        opts["pre_c"] = c
    X = torch.nn.Parameter(torch.zeros(A.shape[1:], dtype=A.dtype))
    opt = Spectra([X], base="sgd", lr=lr0, weight_decay=0.0, c=c, scale=1.0, **opts)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / math.sqrt(k + 1))
    gen = torch.Generator().manual_seed(seed + 1)
    d, losses = A.shape[1], []
    for _ in range(steps):
        N = noise * stiefel(d, rank, gen) @ stiefel(d, rank, gen).T
        X.grad = logistic_grad(X.detach(), A, y) + N
        opt.step()
        sched.step()
        loss = float(logistic_loss(X.detach(), A, y))
        losses.append(loss if math.isfinite(loss) else float("inf"))
    return losses


def _final(losses: list[float]) -> float:
    tail = losses[-max(1, len(losses) // 10) :]
    return sum(tail) / len(tail)


def run(
    d: int = 50,
    n: int = 100,
    label_noise: float = 5.0,
    noises=(10.0, 100.0, 1000.0),
    rank: int = 1,
    steps: int = 1000,
    lrs=tuple(2.0**k for k in range(-8, 3)),
    methods=tuple(METHODS),
    c: float | None = None,
    seed: int = 0,
    histories: dict | None = None,
) -> list[dict]:
    """Rows ``(protocol, noise, method, lr0, final_loss)`` for both protocols (see module docstring)."""
    check_int(d, "d", low=1)
    check_int(rank, "rank", low=1, high=d)  # a d x r Stiefel sample needs r <= d
    A, y, _, _, _ = logistic_data(d, n, 0, label_noise, seed)
    M = gradient_bound(A)
    c = M if c is None else c
    finals: dict = {}
    for method in methods:
        for noise in noises:
            for lr in lrs:
                losses = train(A, y, method, lr, noise, rank, c, steps, seed)
                finals[(method, noise, lr)] = _final(losses)
                if histories is not None:
                    histories[(method, noise, lr)] = losses
    shared_lr = min(lrs, key=lambda lr: finals[("sgd", min(noises), lr)]) if "sgd" in methods else lrs[0]
    rows = []
    for noise in noises:
        for method in methods:
            rows.append(
                {
                    "protocol": "shared",
                    "noise": noise,
                    "method": method,
                    "lr0": shared_lr,
                    "final_loss": finals[(method, noise, shared_lr)],
                    "M": M,
                    "c": c,
                }
            )
    for noise in noises:
        for method in methods:
            best = min(lrs, key=lambda lr: finals[(method, noise, lr)])
            rows.append(
                {
                    "protocol": "tuned",
                    "noise": noise,
                    "method": method,
                    "lr0": best,
                    "final_loss": finals[(method, noise, best)],
                    "M": M,
                    "c": c,
                }
            )
    return rows


def plot(rows: list[dict], histories: dict, out_dir: str) -> list[str]:
    """Fig. F.5 (SGD / global / spectral clipping) and F.6 (momentum, with/without pre-clip): training loss
    vs iteration at each method's tuned ``eta_0``, one panel per noise level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    tuned = {(r["method"], r["noise"]): r["lr0"] for r in rows if r["protocol"] == "tuned"}
    noises = sorted({r["noise"] for r in rows})
    paths = []
    for fig_name, group in (
        ("F5", ("sgd", "sgd+global_clip", "sgd+spectral_clip")),
        ("F6", ("sgdm", "sgdm+pre_clip")),
    ):
        group = [m for m in group if any(k[0] == m for k in tuned)]
        if not group:
            continue
        fig, axes = plt.subplots(1, len(noises), figsize=(5 * len(noises), 3.6), squeeze=False)
        for ax, noise in zip(axes[0], noises):
            for m in group:
                lr = tuned[(m, noise)]
                ax.plot(histories[(m, noise, lr)], label=f"{m} (eta0={lr:g})")
            ax.set_yscale("log")
            ax.set_title(f"spike noise l = {noise:g}")
            ax.set_xlabel("iteration")
            ax.set_ylabel("training loss")
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"spike_noise_{fig_name}.png")
        save_figure(fig, path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def main(args: argparse.Namespace) -> int:
    """Run with the parsed options, print/save the table (``results.json``/``.md``) and the PNG figures."""
    histories: dict = {}
    rows = run(
        d=args.d,
        n=args.n,
        noises=tuple(args.noises),
        rank=args.rank,
        steps=args.steps,
        lrs=tuple(args.lrs),
        methods=tuple(args.methods),
        seed=args.seed,
        histories=histories,
    )
    paths = plot(rows, histories, args.out)
    report(
        "spike-noise: SGD vs global vs spectral clipping under rank-r spikes (Jiang, Semenov and Stich 2026 §F.1.2)",
        rows,
        args.out,
        command=invocation("experiment", f"spectrakit experiment spike-noise --steps {args.steps} --rank {args.rank}"),
        extra={"plots": paths},
    )
    return 0
