"""`spectrakit sweep`: grid, per-point folders, skipping finished runs, best-LR selection and the mean ± std
table on synthetic rows, diverged points kept but never chosen, the CLI outputs."""

from __future__ import annotations

import json
import math
import os

import pytest

from spectrakit import cli
from spectrakit.experiments import compare as cmp
from spectrakit.experiments import runfolders
from spectrakit.experiments import sweep as sw

TINY = dict(
    setting="cpu",
    preset="nano",
    tokenizer="bytes",
    steps=4,
    batch_size=2,
    seq_len=16,
    warmup=1,
    eval_every=2,
    eval_tokens=64,
    diag_every=2,
    progress=False,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPECTRAKIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded."""


def _row(opt, lr, seed, loss, c=None, diverged=False, sn=1.0):
    return {"optimizer": opt, "lr": lr, "seed": seed, "val_loss": loss, "c": c, "diverged": diverged,
            "max_weight_sn": sn, "max_update_sn": 2 * sn, "agg_linf": 0.5 * sn}


def test_grid_table_mean_std_over_seeds_and_diverged_points_recorded():
    rows = [_row("a", 1e-3, 0, 3.0), _row("a", 1e-3, 1, 3.2), _row("a", 1e-3, 2, 3.4, sn=4.0),
            _row("a", 1e-2, 0, 2.0), _row("a", 1e-2, 1, math.nan), _row("b", 1e-3, 0, 2.5, diverged=True)]
    pts = {(p["optimizer"], p["lr"]): p for p in sw.grid_table(rows)}
    p = pts[("a", 1e-3)]
    assert p["val_loss_mean"] == pytest.approx(3.2)
    assert p["val_loss_std"] == pytest.approx(0.2)  # sample std (ddof=1) of 3.0, 3.2, 3.4
    assert p["seeds"] == 3 and not p["diverged"]
    assert p["max_weight_sn"] == pytest.approx(2.0) and p["agg_linf"] == pytest.approx(1.0)
    assert pts[("a", 1e-2)]["diverged"] and math.isnan(pts[("a", 1e-2)]["val_loss_mean"])
    assert pts[("b", 1e-3)]["diverged"]  # flagged diverged even with a finite loss
    assert len(pts) == 3


def test_select_best_ignores_diverged_and_reports_tolerance_range():
    rows = [_row("a", lr, s, loss + 0.01 * s) for lr, loss in [(1e-4, 3.5), (3e-4, 3.04), (1e-3, 3.0),
                                                                 (3e-3, 3.03), (1e-2, 3.2)] for s in (0, 1)]
    rows += [_row("a", 3e-2, 0, 0.1, diverged=True)]  # lowest loss, but diverged: never chosen
    rows += [_row("b", 1e-3, 0, math.inf), _row("b", 1e-2, 0, math.nan)]
    rows += [_row("s", 1e-3, 0, 2.0, c=1.0), _row("s", 1e-3, 0, 1.9, c=10.0), _row("s", 1e-2, 0, 1.8, c=10.0)]
    best = {(b["optimizer"], b["c"]): b for b in sw.select_best(sw.grid_table(rows), tol=0.05)}
    a = best[("a", None)]
    assert a["best_lr"] == 1e-3 and a["val_loss_mean"] == pytest.approx(3.005)
    assert a["val_loss_std"] == pytest.approx(0.01 / math.sqrt(2))
    assert (a["lr_range_lo"], a["lr_range_hi"]) == (3e-4, 3e-3)
    assert a["diverged_points"] == 1 and a["seeds"] == 2
    b = best[("b", None)]
    assert math.isnan(b["best_lr"]) and b["diverged_points"] == 2
    assert best[("s", 1.0)]["best_lr"] == 1e-3 and best[("s", 10.0)]["best_lr"] == 1e-2
    # tolerance 0: the range is the best LR alone
    a0 = [b for b in sw.select_best(sw.grid_table(rows), tol=0.0) if b["optimizer"] == "a"][0]
    assert a0["lr_range_lo"] == a0["lr_range_hi"] == 1e-3
    diffs = sw.differences([
        {"optimizer": "adamw", "c": None, "val_loss_mean": 3.0, "val_loss_std": 0.3},
        {"optimizer": "spectra-adamw", "c": None, "val_loss_mean": 2.9, "val_loss_std": 0.4},
        {"optimizer": "spectra-signum", "c": None, "val_loss_mean": 2.0, "val_loss_std": 0.0}])  # base not swept
    assert len(diffs) == 1 and diffs[0]["base"] == "adamw"
    assert diffs[0]["delta_val_loss"] == pytest.approx(-0.1) and diffs[0]["spread"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="tol"):
        sw.select_best([], tol=-1)


def test_grid_sweeps_c_only_for_spectra_optimizers_and_validates():
    pts = sw.grid(("adamw", "spectra-adamw"), (1e-3, 1e-2), (0, 1), cs=(1.0, 30.0))
    assert len(pts) == 2 * 2 + 2 * 2 * 2
    assert {p["c"] for p in pts if p["optimizer"] == "adamw"} == {None}
    assert sw.run_name(pts[-1]) == "spectra-adamw-c30-lr0.01-s1"
    with pytest.raises(ValueError, match="lrs"):
        sw.grid(("adamw",), (0.0,), (0,))
    with pytest.raises(ValueError, match="optimizers"):
        sw.grid(("nope",), (1e-3,), (0,))
    with pytest.raises(ValueError, match="cs"):
        sw.grid(("spectra-adamw",), (1e-3,), (0,), cs=(-1.0,))
    with pytest.raises(ValueError, match="base optimizer"):
        sw.grid(("spectra-adamw",), (1e-3,), (0,), cs=(math.inf,))


def test_lr_multiples_of_each_optimizers_default():
    from spectrakit.train.optimizers import OPTIMIZERS

    lrs = sw.parse_lrs("0.5x, 2X,1e-3")
    assert lrs == ["0.5x", "2x", 1e-3]
    pts = sw.grid(("signum", "muon"), lrs, (0,))
    got = {(p["optimizer"], p["lr"]) for p in pts}
    for name in ("signum", "muon"):
        d = OPTIMIZERS[name].lr
        assert sorted(lr for n, lr in got if n == name) == pytest.approx(sorted([0.5 * d, 2 * d, 1e-3]))
    for bad in ("fast", "1e-3,x", "-1x"):
        with pytest.raises(ValueError, match="lrs"):
            sw.grid(("adamw",), sw.parse_lrs(bad), (0,))


def test_tiny_sweep_writes_four_runs_and_rerun_skips_them(tmp_path, monkeypatch, capsys, quick_plots):
    out = str(tmp_path / "sw")
    argv = ["sweep", "--optimizers", "adamw,spectra-adamw", "--lrs", "1e-3,1e-2", "--seeds", "0",
            "--setting", "cpu", "--preset", "nano", "--tokenizer", "bytes", "--steps", "4", "--batch-size", "2",
            "--seq-len", "16", "--warmup", "1", "--eval-every", "2", "--eval-tokens", "64", "--diag-every", "2",
            "--quiet", "--out", out]
    assert cli.main(argv) == 0
    data = json.load(open(os.path.join(out, "sweep.json")))
    assert len(data["rows"]) == 4 and len(data["ran"]) == 4 and data["skipped"] == []
    runs = ["adamw-lr0.001-s0", "adamw-lr0.01-s0", "spectra-adamw-lr0.001-s0", "spectra-adamw-lr0.01-s0"]
    assert sorted(os.listdir(out)) == sorted(
        [*runs, "best", "lr_sensitivity.png", "sweep.json", "sweep.md", ".spectrakit-out.json", ".spectrakit-runs.json",
         ".spectrakit.lock"])
    assert sorted(json.load(open(os.path.join(out, ".spectrakit-runs.json")))["runs"]) == runs
    assert {(r["optimizer"], r["lr"]) for r in data["rows"]} == {
        (o, lr) for o in ("adamw", "spectra-adamw") for lr in (1e-3, 1e-2)}
    assert {b["optimizer"] for b in data["best"]} == {"adamw", "spectra-adamw"}
    for b in data["best"]:
        assert b["best_lr"] in (1e-3, 1e-2) and b["max_weight_sn"] > 0
    assert sorted(os.listdir(os.path.join(out, "best"))) == ["loss_curves.png", "weight_norms.png"]
    (d,) = data["differences"]
    sp, ad = ({b["optimizer"]: b for b in data["best"]}[k] for k in ("spectra-adamw", "adamw"))
    assert d["delta_val_loss"] == pytest.approx(sp["val_loss_mean"] - ad["val_loss_mean"])
    assert "best LR per optimizer" in open(os.path.join(out, "sweep.md")).read()

    def no_training(*a, **k):
        raise AssertionError("a finished point was trained again")

    monkeypatch.setattr(cmp, "compare", no_training)
    assert cli.main(argv) == 0
    again = json.load(open(os.path.join(out, "sweep.json")))
    assert again["ran"] == [] and len(again["skipped"]) == 4
    assert again["best"] == data["best"]


def test_unfinished_run_folder_is_trained_again(tmp_path):
    point = {"optimizer": "adamw", "c": None, "lr": 1e-3, "seed": 0}
    run_dir = tmp_path / sw.run_name(point)
    runfolders.make_run(str(tmp_path), run_dir.name)  # the folder an interrupted sweep left
    (run_dir / sw.RUN_FILE).write_text('{"complete": false}')
    assert sw.load_finished(str(run_dir)) is None
    res = sw.sweep(lrs=(1e-3,), out=str(tmp_path), optimizers=("adamw",), seeds=(0,), **TINY)
    assert res["ran"] == [sw.run_name(point)]
    assert sw.load_finished(str(run_dir))["val_loss"] == res["rows"][0]["val_loss"]


def test_cli_rejects_lr_without_training(tmp_path, capsys):
    assert cli.main(["sweep", "--lrs", "1e-3", "--lr", "1e-3", "--out", str(tmp_path)]) == 2
    assert "--lrs" in capsys.readouterr().err and not os.listdir(tmp_path)


def _fake_training(monkeypatch, loss):
    """``sw._run_or_resume`` replaced by a run that writes a finished run's file with the validation loss
    ``loss(point)`` (the real one trains a model: tested above); returns the names of the points "trained"."""
    trained = []

    def fake(run_dir, point, options):
        trained.append(sw.run_name(point))
        row = {"optimizer": point["optimizer"], "lr": point["lr"], "seed": point["seed"], "c": point["c"],
               "val_loss": loss(point), "diverged": False, "max_weight_sn": 1.0, "max_update_sn": 1.0,
               "agg_linf": 1.0}
        with open(os.path.join(run_dir, sw.RUN_FILE), "w") as f:
            json.dump({"complete": True, "point": point, "row": row}, f)
        return row

    monkeypatch.setattr(sw, "_run_or_resume", fake)
    return trained


def test_shards_split_the_grid_and_a_last_run_reports_all(tmp_path, monkeypatch):
    """Two shards train disjoint halves of the grid in one folder; the unsharded run trains nothing and
    reports the four points."""
    out = str(tmp_path / "sw")
    trained = _fake_training(monkeypatch, lambda point: 3.0 + point["lr"])
    opts = dict(TINY, optimizers=("adamw", "signum"), seeds=(0,))
    first = sw.sweep(lrs=(1e-3, 1e-2), out=out, shard=(0, 2), **dict(opts))
    assert len(first["ran"]) == 2 and len(first["pending"]) == 2 and len(first["rows"]) == 2
    second = sw.sweep(lrs=(1e-3, 1e-2), out=out, shard=(1, 2), **dict(opts))
    assert len(second["ran"]) == 2 and second["pending"] == [] and len(second["rows"]) == 4
    assert sorted(first["ran"] + second["ran"]) == sorted(trained) and len(set(trained)) == 4
    last = sw.sweep(lrs=(1e-3, 1e-2), out=out, **dict(opts))
    assert last["ran"] == [] and len(last["skipped"]) == 4 and len(last["points"]) == 4
    for bad in ("2/2", "a/b", "1"):
        with pytest.raises(ValueError, match="shard"):
            sw.parse_shard(bad)


def _point(opt, lr, loss, c=None, diverged=False):
    return {"optimizer": opt, "c": c, "lr": lr, "val_loss_mean": loss, "val_loss_std": 0.0, "seeds": 1,
            "diverged": diverged}


def test_edge_points_step_beyond_edges_within_tolerance():
    pts = [_point("a", lr, loss) for lr, loss in [(1e-3, 3.00), (2e-3, 3.10), (4e-3, 3.30)]]  # best at lowest
    pts += [_point("b", lr, loss) for lr, loss in [(1e-3, 3.5), (3e-3, 3.02), (9e-3, 3.0)]]  # both edges near
    pts += [_point("c", lr, loss) for lr, loss in [(1e-3, 3.5), (2e-3, 3.0), (4e-3, 3.6)]]  # inside: nothing
    pts += [_point("d", 1e-3, 2.0)]  # a single LR: x0.5 and x2
    pts += [_point("e", 1e-3, 3.0), _point("e", 2e-3, 0.1, diverged=True)]  # a diverged edge is no optimum
    pts += [_point("f", 1e-3, 3.0, c=10.0), _point("f", 2e-3, 3.5, c=10.0)]  # per (optimizer, c)
    got = {(p["optimizer"], p["c"], p["lr"], p["seed"]) for p in sw.edge_points(pts, seeds=(0, 1), tol=0.05)}
    want = {("a", None, 5e-4), ("b", None, 0.027), ("d", None, 5e-4), ("d", None, 2e-3),
            ("e", None, 5e-4), ("f", 10.0, 5e-4)}
    assert got == {(o, c, lr, s) for o, c, lr in want for s in (0, 1)}  # rounded to 6 digits: exact
    # tolerance 0: only b's best edge (9e-3) is extended; its lowest LR (3.5) never is
    assert {p["lr"] for p in sw.edge_points(pts[3:6], seeds=(0,), tol=0.0)} == {0.027}
    assert sw.edge_points([_point("x", 1e-3, math.nan, diverged=True)], seeds=(0,)) == []
    with pytest.raises(ValueError, match="tol"):
        sw.edge_points(pts, seeds=(0,), tol=-1.0)


def test_extend_adds_points_until_the_best_lr_is_inside_the_grid(tmp_path, monkeypatch):
    """Losses are a parabola in log LR with its minimum at 1e-4, below a grid 1e-3..1e-2: each round adds one
    LR a grid step lower until the best lies inside; a rerun trains nothing; shards split the new points."""
    trained = _fake_training(
        monkeypatch, lambda point: 3.0 + 0.1 * (math.log10(point["lr"]) + 4) ** 2 + 0.001 * point["seed"])
    opts = dict(TINY, optimizers=("adamw",), seeds=(0, 1))
    res = sw.sweep(lrs=(1e-3, 3.16228e-3, 1e-2), out=str(tmp_path / "a"), extend=3, **dict(opts))
    lrs = sorted({p["lr"] for p in res["points"]})
    assert len(lrs) == 6 and lrs[0] == pytest.approx(3.16228e-5, rel=1e-4)  # 3 rounds: 3e-4, 1e-4, 3e-5
    assert len(res["extended"]) == 6 and len(trained) == 12
    (best,) = res["best"]
    assert best["best_lr"] == pytest.approx(1e-4, rel=1e-4) and best["lr_range_lo"] < best["best_lr"]
    again = sw.sweep(lrs=(1e-3, 3.16228e-3, 1e-2), out=str(tmp_path / "a"), extend=3, **dict(opts))
    assert again["ran"] == [] and len(again["skipped"]) == 12 and len(trained) == 12
    # without extension the best LR is the grid's lowest, and nothing is added
    none = sw.sweep(lrs=(1e-3, 1e-2), out=str(tmp_path / "b"), **dict(opts))
    assert none["extended"] == [] and none["best"][0]["best_lr"] == 1e-3
    # shards: shard 0 stops while shard 1's points are pending; shard 1 then extends, splitting the new points
    out = str(tmp_path / "c")
    s0 = sw.sweep(lrs=(1e-3, 1e-2), out=out, shard=(0, 2), extend=1, **dict(opts))
    assert s0["pending"] and s0["extended"] == []
    s1 = sw.sweep(lrs=(1e-3, 1e-2), out=out, shard=(1, 2), extend=1, **dict(opts))
    assert len(s1["extended"]) == 2 and len(s1["pending"]) == 1 and len(s1["ran"]) == 3
    last = sw.sweep(lrs=(1e-3, 1e-2), out=out, extend=1, **dict(opts))
    assert len(last["ran"]) == 1 and last["pending"] == [] and len(last["rows"]) == 6
    with pytest.raises(ValueError, match="extend"):
        sw.sweep(lrs=(1e-3,), out=out, extend=-1, **dict(opts))


@pytest.mark.parametrize("args", [["--lrs", "1e-3", "--shard", "3/2"], ["--lrs", "1e-3", "--tol", "-1"],
                                  ["--lrs", "1e-3", "--extend", "-1"], ["--lrs", "1e-3,abc"], ["--lrs", "0"],
                                  ["--lrs", "1e-3", "--cs", "-1"], ["--lrs", "1e-3", "--cs", "abc"]])
def test_cli_grid_errors_are_one_line_without_training(tmp_path, args, capsys):
    """Run in this interpreter (``main`` is what ``python -m spectrakit`` calls; a real process's exit status
    and stderr are checked by tests/test_cli_errors.py)."""
    out = tmp_path / "sw"
    try:
        code = cli.main(["sweep", *args, "--out", str(out)])
    except SystemExit as e:  # argparse errors exit from the parser
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --") and "Traceback" not in err
    assert not out.exists() or os.listdir(out) == []
