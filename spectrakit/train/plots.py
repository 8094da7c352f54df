"""Plot the logs and spectral diagnostics of training runs: ``spectrakit plot RUN_DIR [RUN_DIR ...]``.

Each RUN_DIR is a folder written by the training loop (``metrics.jsonl``) and optionally by
:class:`~spectrakit.train.diagnostics.SpectralDiagnostics` (``diagnostics.jsonl``, ``layers.jsonl``,
``spectra.jsonl``) and :class:`~spectrakit.train.diagnostics.NoiseStructure` (``noise.jsonl``). Writes PNGs:
``loss.png`` (training and validation loss), ``norms.png`` (aggregated l_inf / Frobenius norms and the
largest weight and update spectral norms, Jiang, Semenov and Stich 2026 Fig. 4), ``spectra.png`` (singular values of
gradients
and updates at the recorded steps, Fig. F.9-F.13) and ``noise.png`` (top noise singular value over the
signal norm and subspace distances, Fig. F.14).
"""

from __future__ import annotations

import os
from collections import defaultdict

from spectrakit._files import save_figure
from spectrakit.train.logs import read_jsonl


def _read(folder: str, name: str) -> list[dict]:
    path = os.path.join(folder, f"{name}.jsonl")
    return read_jsonl(path) if os.path.exists(path) else []


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_runs(run_dirs: list[str], out_dir: str, *, layers: list[str] | None = None) -> list[str]:
    """Write the PNGs described in the module docstring for ``run_dirs`` into ``out_dir``; returns the
    paths written (a figure is skipped when no run has its data). ``layers`` restricts the spectra plot to
    these parameter names (default: up to 6 layers). Raises ``FileNotFoundError`` when a folder has no
    ``metrics.jsonl``."""
    for d in run_dirs:
        if not os.path.exists(os.path.join(d, "metrics.jsonl")):
            raise FileNotFoundError(f"run_dirs: {d} has no metrics.jsonl (not a training run folder)")
    plt = _plt()
    os.makedirs(out_dir, exist_ok=True)
    written = []
    labels = {d: os.path.basename(os.path.normpath(d)) for d in run_dirs}

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for d in run_dirs:
        rows = _read(d, "metrics")
        train = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None]
        val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
        (line,) = ax.plot(*zip(*train), label=labels[d], alpha=0.8) if train else ax.plot([], [])
        if val:
            ax.plot(*zip(*val), "o--", color=line.get_color(), ms=4)
    ax.set(xlabel="step", ylabel="loss (nats); dashed: validation", title="loss")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(os.path.join(out_dir, "loss.png"))
    fig.tight_layout()
    save_figure(fig, written[-1], dpi=120)
    plt.close(fig)

    diag = {d: _read(d, "diagnostics") for d in run_dirs}
    if any(diag.values()):
        fig, axes = plt.subplots(1, 4, figsize=(17, 4))
        keys = [
            ("agg_linf", "aggregated l_inf  max|W|"),
            ("agg_fro", "aggregated Frobenius"),
            ("max_weight_sn", "max ||W||_2"),
            ("max_update_sn", "max ||U||_2 (update direction)"),
        ]
        for d, rows in diag.items():
            for ax, (k, _) in zip(axes, keys):
                if rows:
                    ax.plot([r["step"] for r in rows], [r[k] for r in rows], label=labels[d])
        for ax, (_, t) in zip(axes, keys):
            ax.set(title=t, xlabel="step")
            ax.grid(alpha=0.3)
        axes[3].set_yscale("log")
        axes[0].legend()
        written.append(os.path.join(out_dir, "norms.png"))
        fig.tight_layout()
        save_figure(fig, written[-1], dpi=120)
        plt.close(fig)

    spectra = {d: _read(d, "spectra") for d in run_dirs}
    if any(spectra.values()):
        names = layers or list(dict.fromkeys(r["layer"] for rows in spectra.values() for r in rows))[:6]
        fig, axes = plt.subplots(
            len(run_dirs), len(names), figsize=(3.2 * len(names), 2.8 * len(run_dirs)), squeeze=False
        )
        for i, d in enumerate(run_dirs):
            for j, name in enumerate(names):
                ax = axes[i][j]
                for r in spectra[d]:
                    if r["layer"] == name:
                        ax.semilogy(
                            r["sv"], "-" if r["kind"] == "grad" else "--", label=f"{r['kind']} @ {r['step']}"
                        )
                ax.set_title(f"{labels[d]}: {name}", fontsize=7)
                ax.grid(alpha=0.3)
                if i == 0 and j == 0:
                    ax.legend(fontsize=6)
        written.append(os.path.join(out_dir, "spectra.png"))
        fig.tight_layout()
        save_figure(fig, written[-1], dpi=110)
        plt.close(fig)

    noise = {d: _read(d, "noise") for d in run_dirs}
    if any(noise.values()):
        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        k_runs = len(run_dirs)
        for k, d in enumerate(run_dirs):  # one box per (layer, run), runs side by side
            per = defaultdict(list)
            for r in noise[d]:
                per[r["layer"]].append(r)
            names = list(per)
            pos = [i * (k_runs + 1) + k for i in range(len(names))]
            for ax, key in zip(axes, ("ratio", "d_spec", "d_chord")):
                bp = ax.boxplot([[r[key] for r in per[n]] for n in names], positions=pos, widths=0.8,
                                patch_artist=True)
                for box in bp["boxes"]:
                    box.set_facecolor(f"C{k}")
                ax.set_xticks([i * (k_runs + 1) for i in range(len(names))], names, rotation=90, fontsize=6)
            axes[0].plot([], [], color=f"C{k}", lw=6, label=labels[d])
        axes[0].legend(fontsize=7)
        for ax, t in zip(
            axes, ("sigma_1(N) / ||G||_2", "spectral distance d_r(N, G)", "chordal distance d_r(N, G)")
        ):
            ax.set_title(t)
            ax.grid(alpha=0.3)
        written.append(os.path.join(out_dir, "noise.png"))
        fig.tight_layout()
        save_figure(fig, written[-1], dpi=110)
        plt.close(fig)
    return written
