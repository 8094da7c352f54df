"""Composite Frank-Wolfe view of spectral clipping on matrix logistic regression (Jiang, Semenov and Stich 2026 §3,
§F.1.1).

The problem (the paper's eq. 3): ``min_{||X||_2 <= D2} F(X) = f(X) + b/2 ||X||_F^2`` with the logistic loss
``f(X) = 1/n sum_i log(1 + exp(-y_i <A_i, X>))`` on ``d x d`` features ``A_i ~ N(0, 1)`` and labels
``y_i = sign(<A_i, X~> + xi_i)``, ``X~ ~ N(0, 1)``, ``xi_i ~ N(0, sigma^2)``.

The paper's update rule (its eq. 4) with the step sizes of its convergence theorem: ``1/lambda = D2``,
``alpha = lambda/b``, ``c = b D2``,
``lambda eta_k = 2/(k+2)``, run as :class:`spectrakit.optim.Spectra` (base ``sgd``, post ``hard_clip``
(exact clip^sp), ``weight_decay = lambda``, ``scale = alpha``, ``lr = eta_k`` from a ``LambdaLR``).
Full batch uses ``beta_k = 1``; the stochastic variant (Fig. F.4) batch 20 and ``beta_k = 1/(k+1)^(2/3)``.
``b = 0`` is the limit ``alpha c = lambda D2`` with ``c -> 0`` (Frank-Wolfe with the spectral LMO),
run as ``c = 1e-12 D2``. ``F*`` comes from an independent solver: FISTA with the exact SVD projection onto
the spectral ball. Reported per (b, D2): ``F(X_K) - F*``, test loss, ``||X_K||_2``, ``||X_K||_F`` and the
largest ``||X_k||_2`` over the run (must stay <= D2).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

from spectrakit._files import save_figure
from spectrakit.experiments.io import invocation, report
from spectrakit.experiments.logistic import logistic_data, logistic_grad, logistic_loss
from spectrakit.experiments.options import fw_logistic as add_arguments  # noqa: F401 (its options)
from spectrakit.optim import Spectra


def project_spectral_ball(X: torch.Tensor, radius: float) -> torch.Tensor:
    """Exact Euclidean projection onto ``{||X||_2 <= radius}``: ``U min(S, radius) V^T`` (float64 SVD)."""
    U, s, Vh = torch.linalg.svd(X, full_matrices=False)
    return (U * s.clamp(max=radius)) @ Vh


def solve_reference(A, y, b: float, D2: float, iters: int = 3000) -> float:
    """``F*`` by FISTA with exact projection (independent of the optimizer under test)."""
    n = A.shape[0]
    L = float(torch.linalg.matrix_norm(A.reshape(n, -1), ord=2)) ** 2 / (4 * n) + b
    X = Z = torch.zeros(A.shape[1:], dtype=A.dtype)
    t = 1.0
    for _ in range(iters):
        X_new = project_spectral_ball(Z - (logistic_grad(Z, A, y) + b * Z) / L, D2)
        t_new = (1 + math.sqrt(1 + 4 * t * t)) / 2
        Z = X_new + ((t - 1) / t_new) * (X_new - X)
        X, t = X_new, t_new
    return float(logistic_loss(X, A, y) + b / 2 * X.pow(2).sum())


def run_rule4(A, y, A_test, y_test, b: float, D2: float, steps: int, batch: int | None = None, seed: int = 0):
    """Run rule (4) with the Theorem 3.4 parameters; returns the per-step history of metrics."""
    lam = 1.0 / D2
    c = b * D2 if b > 0 else 1e-12 * D2
    alpha = lam / b if b > 0 else lam * D2 / c
    X = torch.nn.Parameter(torch.zeros(A.shape[1:], dtype=A.dtype))
    opt = Spectra(
        [X],
        base="sgd",
        post="hard_clip",
        lr=2.0 / lam,
        weight_decay=lam,
        c=c,
        scale=alpha,
        momentum=0.0,
        dampening=0.0,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (k + 2))  # lambda eta_k = 2/(k+2)
    gen = torch.Generator().manual_seed(seed)
    hist = []
    for k in range(steps):
        if batch is None:
            g = logistic_grad(X.detach(), A, y)
        else:
            beta = 1.0 / (k + 1) ** (2 / 3)  # M_k = (1 - beta_k) M_{k-1} + beta_k g_k, M_0 = g_0
            opt.param_groups[0]["momentum"] = opt.param_groups[0]["dampening"] = 1.0 - beta
            idx = torch.randint(0, A.shape[0], (batch,), generator=gen)
            g = logistic_grad(X.detach(), A[idx], y[idx])
        X.grad = g
        opt.step()
        sched.step()
        Xd = X.detach()
        hist.append(
            {
                "F": float(logistic_loss(Xd, A, y) + b / 2 * Xd.pow(2).sum()),
                "test": float(logistic_loss(Xd, A_test, y_test)),
                "spec": float(torch.linalg.matrix_norm(Xd, ord=2)),
                "fro": float(Xd.norm()),
            }
        )
    return hist


def run(
    d: int = 10,
    n: int = 80,
    n_test: int = 200,
    noise: float = 5.0,
    bs=(0.0, 0.1, 1.0),
    D2s=(0.2, 1.0, 5.0),
    steps: int = 2000,
    stochastic_batch: int = 20,
    stochastic_D2: float | None = 1.0,
    ref_iters: int = 3000,
    seed: int = 0,
    histories: dict | None = None,
) -> list[dict]:
    """One row per (mode, b, D2): final residual ``F(X_K) - F*`` (and at K/10), test loss, norms.

    ``histories`` (optional dict) receives the per-step metrics for plotting."""
    A, y, A_test, y_test, _ = logistic_data(d, n, n_test, noise, seed)
    runs = [("full", b, D2, None) for D2 in D2s for b in bs]
    if stochastic_D2 is not None:
        runs += [("stochastic", b, stochastic_D2, stochastic_batch) for b in bs]
    rows, fstar = [], {}
    for mode, b, D2, batch in runs:
        if (b, D2) not in fstar:
            fstar[(b, D2)] = solve_reference(A, y, b, D2, ref_iters)
        hist = run_rule4(A, y, A_test, y_test, b, D2, steps, batch, seed)
        res = [h["F"] - fstar[(b, D2)] for h in hist]
        if histories is not None:
            histories[(mode, b, D2)] = {
                "residual": res,
                **{k: [h[k] for h in hist] for k in ("test", "spec", "fro")},
            }
        rows.append(
            {
                "mode": mode,
                "b": b,
                "D2": D2,
                "F*": fstar[(b, D2)],
                "residual@K/10": res[steps // 10 - 1] if steps >= 10 else res[0],
                "residual@K": res[-1],
                "test_loss": hist[-1]["test"],
                "spec_norm": hist[-1]["spec"],
                "max_spec_norm": max(h["spec"] for h in hist),
                "fro_norm": hist[-1]["fro"],
            }
        )
    return rows


def plot(histories: dict, out_dir: str) -> list[str]:
    """Figures F.1-F.4: residual, test loss, spectral and Frobenius norms vs iteration (one per D2/mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for mode, D2 in sorted({(m, D2) for m, _, D2 in histories}):
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
        for (m, b, d2), h in sorted(histories.items()):
            if (m, d2) != (mode, D2):
                continue
            for ax, key in zip(axes, ("residual", "test", "spec", "fro")):
                vals = [max(v, 1e-16) for v in h[key]] if key == "residual" else h[key]
                ax.plot(range(1, len(vals) + 1), vals, label=f"b={b}")
        for ax, title in zip(axes, ("F(X_k) - F*", "test loss", "||X_k||_2", "||X_k||_F")):
            ax.set_xscale("log")
            ax.set_title(title)
            ax.set_xlabel("iteration k")
        axes[0].set_yscale("log")
        axes[2].axhline(D2, color="k", ls="--", lw=0.8)
        axes[0].legend()
        fig.suptitle(f"clipped Frank-Wolfe rule, step sizes of the convergence theorem, D2 = {D2}, {mode} gradient")
        fig.tight_layout()
        path = os.path.join(out_dir, f"fw_logistic_{mode}_D2_{D2}.png")
        save_figure(fig, path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def main(args: argparse.Namespace) -> int:
    """Run with the parsed options, print/save the table (``results.json``/``.md``) and the PNG figures."""
    if getattr(args, "family", False):
        return _main_family(args)
    histories: dict = {}
    rows = run(
        d=args.d,
        n=args.n,
        n_test=args.n_test,
        noise=args.noise,
        bs=tuple(args.bs),
        D2s=tuple(args.D2s),
        steps=args.steps,
        stochastic_batch=args.batch,
        ref_iters=args.ref_iters,
        seed=args.seed,
        histories=histories,
    )
    paths = plot(histories, args.out)
    report(
        "fw-logistic: clipped Frank-Wolfe rule with the step sizes of the convergence theorem (Jiang, Semenov and "
        "Stich 2026 §F.1.1)",
        rows,
        args.out,
        command=invocation("experiment", f"spectrakit experiment fw-logistic --steps {args.steps}"),
        extra={"plots": paths},
    )
    return 0


def _main_family(args: argparse.Namespace) -> int:
    """``--family``: composite Frank–Wolfe with each regularizer (:mod:`spectrakit.experiments.fw_family`)."""
    from spectrakit.experiments import fw_family

    bs = [b for b in args.bs if b > 0]
    if len(bs) != len(args.bs):
        print(f"error: --b-values must be > 0 with --family (the regularizer strength b), got {args.bs}",
              file=sys.stderr)
        return 2
    rows = fw_family.run(d=args.d, n=args.n, noise=args.noise, regularizers=tuple(args.regularizers), p=args.p,
                         bs=tuple(bs), D2s=tuple(args.D2s), steps=args.steps, ref_iters=args.ref_iters,
                         seed=args.seed)
    report(
        "fw-logistic --family: composite Frank-Wolfe with nuclear / Schatten-p / entropy regularizers "
        "(Jiang, Semenov & Stich 2026, §3.1, App. E.3)",
        rows,
        args.out,
        command=invocation("experiment", f"spectrakit experiment fw-logistic --family --steps {args.steps}"),
    )
    return 0
