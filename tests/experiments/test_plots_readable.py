"""What the plots show a reader: weight_norms.png labels every y axis and keeps its legend off the curves; the
LR-sensitivity plot draws its diverged points (x, above every finite point); grokking.png titles its panels."""

from __future__ import annotations

import math

import pytest


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved during the test, by file name (matplotlib, ~1.5 s to import, loaded here: only a
    test process that runs these tests pays it)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    saved = {}
    original = Figure.savefig

    def record(self, path, *a, **k):
        name = str(path).rsplit("/", 1)[-1]
        if name.startswith(".tmp-"):  # written to a temporary file, then renamed (spectrakit._files.save_figure)
            name = name[len(".tmp-"):].rsplit("-", 1)[0]
        saved[name] = self
        return original(self, path, *a, **k)

    monkeypatch.setattr(Figure, "savefig", record)
    return saved


def test_weight_norms_labels_and_legend(figures, tmp_path):
    from spectrakit.experiments.compare import plot

    rows = [{"optimizer": o, "seed": 0, "lr": 3e-3, "_curve": [(0, 6.0), (10, 5.0)], "_evals": [],
             "_norms": [(0, 0.1, 5.0, 3.0), (10, 0.2 * (i + 1), 6.0, 4.0 * (i + 1))]}
            for i, o in enumerate(("adamw", "spectra-adamw"))]
    plot(rows, str(tmp_path))
    fig = figures["weight_norms.png"]
    assert all(ax.get_ylabel() and ax.get_title() for ax in fig.axes)
    assert not any(ax.get_legend() for ax in fig.axes) and fig.legends  # the legend is the figure's
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    box = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer))


def test_lr_sensitivity_draws_diverged_points(figures, tmp_path):
    from spectrakit.experiments.sweep import plot

    points = [{"optimizer": o, "c": None, "lr": lr, "val_loss_mean": v, "val_loss_std": 0.01, "seeds": 2,
               "diverged": not math.isfinite(v)}
              for o in ("adamw", "spectra-adamw") for lr, v in ((1e-3, 5.0), (3e-3, 4.6), (3e-2, math.nan))]
    plot({"points": points, "best": [], "rows": []}, str(tmp_path))
    ax = figures["lr_sensitivity.png"].axes[0]
    marks = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert len(marks) == 2 and "diverged" in ax.get_title()
    xs = sorted(float(m.get_xdata()[0]) for m in marks)
    assert xs[0] != xs[1]  # side by side, not hidden under each other
    assert all(float(m.get_ydata()[0]) > 5.0 for m in marks)
    figures.clear()
    plot({"points": [p for p in points if not p["diverged"]], "best": [], "rows": []}, str(tmp_path))
    assert "no run diverged" in figures["lr_sensitivity.png"].axes[0].get_title()


def test_grokking_panels_have_titles(figures, tmp_path):
    from spectrakit.experiments.grokking import plot

    rows = [{"dualizer": d, "seed": 0, "curve": [{"step": 1, "test_acc": 0.1}, {"step": 2, "test_acc": 0.5}],
             "deltas": [0.1, 0.2]} for d in ("naive", "pdhg")]
    plot(rows, str(tmp_path / "grokking.png"))
    fig = figures["grokking.png"]
    assert all(ax.get_title() and ax.get_ylabel() for ax in fig.axes)
    assert "{" not in fig.axes[1].get_ylabel().replace("{t+1}", "")  # mathtext, not raw braces
