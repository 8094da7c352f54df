"""XOR learning-rate transfer across widths under steepest descent on spectral sets (Cesista 2025 §6.1).

An MLP ``2 -> D -> D -> 2`` (ReLU, no biases) is trained on the four XOR points for 32 full-batch steps with
:class:`~spectrakit.manifold.ManifoldSGD` (RMS→RMS norm, PDHG dualizer warm-started by one alternating
step). The hidden ``D x D`` weight is constrained to the PSD cone, the spectrahedron ``[-1, 1]`` or the unit
RMS→RMS ball; in the first two cases the input and output layers live on the scaled Stiefel manifold, in
the third every layer lives in the unit RMS→RMS ball (as in Cesista 2025). For each width the learning rate is
swept over a log grid; the claim is that the optimal learning rate does not move with ``D``.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F

from spectrakit._files import save_figure
from spectrakit.experiments.io import table_row
from spectrakit.experiments.options import xor_transfer as add_arguments  # noqa: F401 (its options)
from spectrakit.manifold import ManifoldSGD, PSDCone, Spectrahedron, SpectralBall, Stiefel
from spectrakit.models.mlp import MLP

SETS = ("psd", "spectrahedron", "ball")
DEFAULT_LRS = tuple(2.0**k for k in range(-6, 2))
DEFAULT_WIDTHS = (16, 32, 64, 128)


def xor_data(dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The four XOR points ``{±1}^2`` and labels ``1[x1 != x2]``."""
    x = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]], dtype=dtype)
    return x, torch.tensor([0, 0, 1, 1])


def _param_groups(model: MLP, constraint: str, method: str):
    first, hidden, last = (layer.weight for layer in model.layers)
    if constraint == "ball":
        return [{"params": [first, hidden, last], "manifold": SpectralBall(1.0, rms=True, method=method)}]
    inner = PSDCone(method=method) if constraint == "psd" else Spectrahedron(-1.0, 1.0, method=method)
    outer = Stiefel(rms=True, method=method)
    return [{"params": [first, last], "manifold": outer}, {"params": [hidden], "manifold": inner}]


def train_xor(width: int, lr: float, constraint: str, *, steps: int = 32, seed: int = 0,
              dualizer: str = "pdhg", dualizer_steps: int = 4, method: str = "polar") -> float:
    """Train one ``2 -> width -> width -> 2`` MLP; return the final cross-entropy on the XOR points."""
    gen = torch.Generator().manual_seed(seed)
    model = MLP([2, width, width, 2], generator=gen)
    x, y = xor_data()
    opt = ManifoldSGD(_param_groups(model, constraint, method), lr=lr, norm="rms", dualizer=dualizer,
                      dualizer_options={"steps": dualizer_steps})
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        loss = F.cross_entropy(model(x), y)
    return float(loss) if math.isfinite(float(loss)) else float("inf")


def run(widths=DEFAULT_WIDTHS, lrs=DEFAULT_LRS, sets=SETS, steps: int = 32, seeds=(0,),
        dualizer: str = "pdhg", dualizer_steps: int = 4, method: str = "polar",
        verbose: bool = False) -> list[dict]:
    """Sweep (set, width, lr); each row holds the final loss averaged over ``seeds`` and the wall time."""
    rows = []
    for constraint in sets:
        if constraint not in SETS:
            raise ValueError(f"sets must be a subset of {list(SETS)}, got {constraint!r}")
        for width in widths:
            for lr in lrs:
                t0 = time.perf_counter()
                losses = [train_xor(width, lr, constraint, steps=steps, seed=s, dualizer=dualizer,
                                    dualizer_steps=dualizer_steps, method=method) for s in seeds]
                row = {"set": constraint, "width": width, "lr": lr, "final_loss": sum(losses) / len(losses),
                       "seconds": time.perf_counter() - t0}
                rows.append(row)
                if verbose:
                    print(table_row(row, first=len(rows) == 1), flush=True)
    return rows


def optimal_lrs(rows: list[dict]) -> list[dict]:
    """One row per (set, width): the learning rate with the lowest mean final loss."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["set"], r["width"])
        if key not in best or r["final_loss"] < best[key]["final_loss"]:
            best[key] = r
    return [{"set": s, "width": w, "best_lr": r["lr"], "best_loss": r["final_loss"]}
            for (s, w), r in best.items()]


def plot(rows: list[dict], path: str) -> None:
    """Final loss vs learning rate, one panel per set, one curve per width (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(r["set"] for r in rows))
    fig, axes = plt.subplots(1, len(sets), figsize=(4.5 * len(sets), 3.6), squeeze=False)
    for ax, s in zip(axes[0], sets):
        for w in sorted({r["width"] for r in rows if r["set"] == s}):
            pts = sorted((r["lr"], r["final_loss"]) for r in rows if r["set"] == s and r["width"] == w)
            ax.plot([p[0] for p in pts], [max(p[1], 1e-8) for p in pts], marker="o", label=f"D={w}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("final loss (32 steps)")
        ax.set_title(s)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    from spectrakit.experiments.io import invocation, report

    rows = run(widths=args.widths, lrs=args.lrs, sets=args.sets, steps=args.steps, seeds=args.seeds,
               dualizer=args.dualizer, dualizer_steps=args.dualizer_steps, method=args.method, verbose=True)
    command = (f"spectrakit experiment xor-transfer --widths {' '.join(map(str, args.widths))} "
               f"--seeds {','.join(map(str, args.seeds))} --dualizer {args.dualizer} "
               f"--dualizer-steps {args.dualizer_steps}")
    report("xor-transfer: optimal learning rate per width", optimal_lrs(rows), args.out,
           command=invocation("experiment", command),
           extra={"sweep": rows})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        plot(rows, os.path.join(args.out, "xor_transfer.png"))
    return 0
