"""Fixtures of the experiment tests."""

from __future__ import annotations

import os

import pytest

from spectrakit.experiments import compare


@pytest.fixture
def quick_plots(monkeypatch):
    """``compare``'s loss-curve and weight-norm plots (``spectrakit.experiments.compare.plot``, also the ``best/``
    plots of a sweep) written as empty files of the same names, for the tests of run folders and resumption:
    they check which files a command writes and what its results are, not the figures, and matplotlib's
    layout and PNG encoding are about two thirds of a tiny comparison's time (drawn after every run and at
    the end). ``test_compare.py`` and ``test_plots_readable.py`` check the real figures. Returns the real
    ``plot``, for a test that puts it back for one command."""
    real = compare.plot

    def plot(rows, out_dir, title=""):
        os.makedirs(out_dir, exist_ok=True)
        paths = [os.path.join(out_dir, name) for name in ("loss_curves.png", "weight_norms.png")]
        for path in paths:
            open(path, "wb").close()
        return paths

    monkeypatch.setattr(compare, "plot", plot)
    return real
