"""The figures of ``spectrakit compare``: ``loss_curves.png`` (training and validation loss) and
``weight_norms.png`` (weight norms over steps, Jiang, Semenov and Stich 2026 Fig. 4)."""

from __future__ import annotations

import os

from spectrakit._files import save_figure


def _run_styles(rows: list[dict]) -> list[tuple[str, str | None]]:
    """Per row a colour (one per optimizer and ``c``, so the seeds of one optimizer share it) and a legend
    label for the first row of each optimizer (the others None): the old per-run label when it has one
    run, else ``name (lr ..., N seeds)``."""
    import matplotlib.pyplot as plt

    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = list(dict.fromkeys((r["optimizer"], r.get("c")) for r in rows))
    count = {k: sum((r["optimizer"], r.get("c")) == k for r in rows) for k in keys}
    out, seen = [], set()
    for r in rows:
        k = (r["optimizer"], r.get("c"))
        name = r["optimizer"] + ("" if k[1] is None else f" c={k[1]:g}")
        label = None
        if k not in seen:
            seen.add(k)
            label = f"{name} (s{r['seed']}, lr {r['lr']:g})" if count[k] == 1 else \
                f"{name} (lr {r['lr']:g}, {count[k]} seeds)"
        out.append((cycle[keys.index(k) % len(cycle)], label))
    return out


def _legend(fig, ax, n_labels: int) -> None:
    """A legend inside ``ax`` for a few runs; beside the figure for more than four (it would hide curves)."""
    if n_labels <= 4:
        ax.legend()
        fig.tight_layout()
    else:
        fig.legend(loc="center right", fontsize="small")
        fig.tight_layout(rect=(0, 0, 1 - 2.9 / fig.get_figwidth(), 1))  # ~2.9 in for the legend


def plot(rows: list[dict], out_dir: str, title: str = "") -> list[str]:
    """Save ``loss_curves.png`` (training loss per step, validation points) and ``weight_norms.png``
    (aggregated l_inf and Frobenius norms and max spectral norm over steps, Jiang, Semenov and Stich 2026 Fig. 4) into
    ``out_dir``; returns the paths. The seeds of one optimizer share a colour and a legend entry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    styles = _run_styles(rows)
    n_labels = sum(label is not None for _, label in styles)
    fig, ax = plt.subplots(figsize=(7, 4.5) if n_labels <= 4 else (9, 4.5))
    for r, (color, label) in zip(rows, styles):
        steps, losses = zip(*r["_curve"]) if r["_curve"] else ((), ())
        ax.plot(steps, losses, label=label, alpha=0.8, color=color)
        if r["_evals"]:
            ax.plot(
                [e["step"] for e in r["_evals"]],
                [e["val_loss"] for e in r["_evals"]],
                "o--",
                color=color,
                ms=4,
            )
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats); dashed: validation")
    ax.set_title(title or "training / validation loss")
    ax.grid(alpha=0.3)
    _legend(fig, ax, n_labels)
    paths = [os.path.join(out_dir, "loss_curves.png")]
    save_figure(fig, paths[0], dpi=120)
    plt.close(fig)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4) if n_labels <= 4 else (16, 4))
    for r, (color, label) in zip(rows, styles):
        if not r["_norms"]:
            continue
        s, linf, fro, sn = zip(*r["_norms"])
        for i, (ax, v) in enumerate(zip(axes, (linf, fro, sn))):
            ax.plot(s, v, color=color, label=label if i == 0 else None)
    for ax, t, y in zip(
        axes, ("largest weight entry", "aggregated Frobenius norm", "largest spectral norm"),
        ("max over layers of max |W_ij|", "sqrt(sum over layers of ||W||_F^2)", "max over layers of ||W||_2"),
    ):
        ax.set_title(t)
        ax.set_xlabel("step")
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    # the legend below the panels, where it hides no curve
    fig.legend(loc="lower center", ncol=min(max(n_labels, 1), 4), fontsize="small")
    fig.tight_layout(rect=(0, 0.06 * (1 + (n_labels - 1) // 4), 1, 1))
    paths.append(os.path.join(out_dir, "weight_norms.png"))
    save_figure(fig, paths[1], dpi=120)
    plt.close(fig)
    return paths
