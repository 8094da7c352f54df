"""`spectrakit compare`: same init/data/schedule for every optimizer, table columns, overhead, saved
results and plots, `spectrakit plot` on its run folders, option errors."""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest

from spectrakit.experiments import compare as cmp
from spectrakit.train import plots

SMALL = dict(
    setting="cpu",
    tokenizer="bytes",
    steps=6,
    batch_size=2,
    seq_len=16,
    warmup=2,
    eval_every=3,
    eval_tokens=64,
    diag_every=3,
    progress=False,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPECTRAKIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (the shared ``one_thread`` fixture)."""


def test_same_seed_same_data_gives_identical_runs_for_equivalent_optimizers(tmp_path):
    rows = cmp.compare(optimizers=("adamw", "torch-adamw"), out=str(tmp_path), **(SMALL | dict(preset="nano")))
    a, b = rows
    assert [s for s, _ in a["_curve"]] == [s for s, _ in b["_curve"]] == [6]
    assert a["_curve"][0][1] == pytest.approx(b["_curve"][0][1], rel=1e-5)
    assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    assert a["overhead_%"] is None  # no base optimizer in this pair


def test_cli_writes_table_json_and_plots(tmp_path, capsys, monkeypatch, quick_plots):
    # the figures are built from the results after each run (the final report reuses the last run's: same
    # rows), not rendered: test_plots_readable.py renders the comparison's figures, and
    # test_plot_runs_renders_every_figure below those of `spectrakit plot`
    drawn = []
    real_plot = cmp.plot

    def plot(rows, *args, **kwargs):
        drawn.append(len(rows))
        return real_plot(rows, *args, **kwargs)

    monkeypatch.setattr(cmp, "plot", plot)
    parser = argparse.ArgumentParser()
    cmp.add_arguments(parser)
    out = str(tmp_path / "run")
    args = parser.parse_args(
        [
            "--optimizers",
            "adamw,spectra-adamw",
            "--tokenizer",
            "bytes",
            "--steps",
            "6",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--warmup",
            "2",
            "--eval-every",
            "3",
            "--eval-tokens",
            "64",
            "--diag-every",
            "3",
            "--seeds",
            "1",
            "--quiet",
            "--setting",
            "cpu",
            "--preset",
            "nano",
            "--out",
            out,
            "--c",
            "0.5",
            "--noise-steps",
            "4",
            "--noise-signal-batches",
            "2",
            "--noise-samples",
            "2",
        ]
    )
    assert cmp.run(args) == 0
    assert drawn == [1, 2]
    text = capsys.readouterr().out
    assert "| optimizer | seed | lr | val_loss |" in text and "spectra-adamw" in text
    res = json.load(open(os.path.join(out, "results.json")))
    rows = {r["optimizer"]: r for r in res["rows"]}
    assert set(rows) == {"adamw", "spectra-adamw"} and rows["adamw"]["seed"] == 1
    base, spec = rows["adamw"], rows["spectra-adamw"]
    # the runs' wall times, minutes apart, are kept beside; the table's overhead is the paired CPU-time measurement
    assert spec["overhead_wall_%"] == pytest.approx(100 * (spec["step_ms"] / base["step_ms"] - 1))
    assert math.isfinite(spec["overhead_%"]) and -20 < spec["overhead_%"] < 400
    assert all(
        math.isfinite(r["val_loss"]) and r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
        for r in rows.values()
    )
    # SPECTRA bounds the update direction after warm-up: ||U||_2 <= alpha * c with the largest
    # alpha = sqrt(m/n) = sqrt(256/32) (the embedding and output matrices of the nano preset: 256 byte tokens
    # by 32 dimensions; the clip reaches the bound)
    assert spec["max_update_sn"] <= math.sqrt(8) * 0.5 * 1.02 < base["max_update_sn"]
    assert res["unigram_entropy"] > 0 and res["settings"]["preset"] == "nano"
    # without --preset, the setting's model (the nano one above keeps this test to a fraction of the tiny's time)
    assert cmp.CompareOptions(setting="cpu").resolved()["preset"] == "tiny"
    for f in (
        "loss_curves.png",
        "weight_norms.png",
        "results.md",
        "adamw-s1/metrics.jsonl",
        "spectra-adamw-s1/diagnostics.jsonl",
        "spectra-adamw-s1/spectra.jsonl",
        "adamw-s1/noise.jsonl",
    ):
        assert os.path.exists(os.path.join(out, f)), f
    # `spectrakit plot` reads every log of these run folders (its figures built, not rendered: rendering all
    # layers' spectra took 5 s of CPU)
    written = plots.plot_runs(
        [os.path.join(out, "adamw-s1"), os.path.join(out, "spectra-adamw-s1")], str(tmp_path / "plots")
    )
    assert [os.path.basename(p) for p in written] == ["loss.png", "norms.png", "spectra.png", "noise.png"]
    assert all(os.path.exists(p) for p in written)
    assert all(os.path.exists(os.path.join(out, f)) for f in ("loss_curves.png", "weight_norms.png"))


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_plot_runs_renders_every_figure(tmp_path):
    """The four figures of `spectrakit plot`, rendered to PNG, from two run folders with the records the
    training loop and its diagnostics write (one layer each: a figure's cost grows with its panels)."""
    runs = []
    for k, name in enumerate(("adamw-s0", "spectra-adamw-s0")):
        d = tmp_path / name
        d.mkdir()
        _write_jsonl(d / "metrics.jsonl", [{"step": s, "loss": 5.0 - s / 4 - k} for s in (1, 2, 3)]
                     + [{"step": 3, "val_loss": 4.5 - k, "val_ppl": math.exp(4.5 - k)}])
        _write_jsonl(d / "diagnostics.jsonl", [dict(step=s, agg_linf=0.1 * s, agg_fro=16.0 + s, max_weight_sn=1.0 + s,
                                                    max_update_sn=10.0 ** (2 - s)) for s in (0, 1, 2)])
        _write_jsonl(d / "spectra.jsonl", [dict(step=s, layer="embed.weight", kind=kind, sv=[4.0, 1.0, 1e-3, 1e-8])
                                           for s in (0, 2) for kind in ("grad", "update")])
        _write_jsonl(d / "noise.jsonl", [dict(step=2, sample=i, layer="embed.weight", signal_sn=0.3,
                                              noise_sv=[0.3, 0.05], ratio=1.0 + i / 10, d_spec=0.99,
                                              d_chord=0.5 + i / 10) for i in range(3)])
        runs.append(str(d))
    written = plots.plot_runs(runs, str(tmp_path / "plots"))
    assert [os.path.basename(p) for p in written] == ["loss.png", "norms.png", "spectra.png", "noise.png"]
    for p in written:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(p) > 1000, p


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(optimizers=("adamw", "sgdx")), "optimizers"),
        (dict(preset="giant"), "preset"),
        (dict(schedule="linear"), "schedule"),
        (dict(seeds=()), "seeds"),
        (dict(setting="tpu"), "setting"),
        (dict(warmup=100), "warmup"),
    ],
)
def test_option_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cmp.compare(**(SMALL | kwargs))


def test_plot_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plots.plot_runs([str(tmp_path)], str(tmp_path / "out"))


def test_plot_styles_share_a_colour_and_one_legend_entry_per_optimizer():
    from spectrakit.experiments.compare_plots import _run_styles

    rows = [{"optimizer": o, "seed": s, "lr": 3e-3} for o in ("adamw", "spectra-adamw") for s in (0, 1, 2)]
    rows.append({"optimizer": "spectra-adamw", "seed": 0, "lr": 3e-3, "c": 10.0})
    styles = _run_styles(rows)
    colours = [c for c, _ in styles]
    assert len(set(colours[:3])) == 1 and len(set(colours[3:6])) == 1 and len(set(colours)) == 3
    assert [label for _, label in styles] == ["adamw (lr 0.003, 3 seeds)", None, None,
                                             "spectra-adamw (lr 0.003, 3 seeds)", None, None,
                                             "spectra-adamw c=10 (s0, lr 0.003)"]
