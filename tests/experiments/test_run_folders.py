"""The --out folder of compare and sweep: --force deletes only what a comparison wrote, one command at a time
holds it (exclusive lock), a resume with other options is refused, a diverging run is a result."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from spectrakit.cli import main
from spectrakit.experiments import runfolders
from spectrakit.train.diagnostics import batched_spectral_norms, svdvals_or_nan

# (the nano model, diagnostics at the first and the last step only: these tests check folders, not training)
TINY = ["--optimizers", "adamw", "--preset", "nano", "--tokenizer", "bytes", "--steps", "4", "--batch-size", "2",
        "--seq-len", "16", "--eval-every", "2", "--eval-tokens", "64", "--diag-every", "4", "--ckpt-every", "2",
        "--quiet", "--threads", "1"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPECTRAKIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _mine(path, text="keep me"):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "notes.txt"), "w") as f:
        f.write(text)


def test_force_deletes_only_what_a_comparison_wrote(tmp_path, capsys, quick_plots):
    out = tmp_path / "out"
    assert main(["compare", *TINY, "--out", str(out)]) == 0
    assert runfolders.read_index(str(out))["runs"] == ["adamw-s0"]
    for name in ("photos-s2023", "thesis-s1", "adamw-s9", "adamw-s0-old"):  # names that look like run folders
        _mine(out / name)
    assert main(["compare", *TINY, "--out", str(out)]) == 2  # a previous comparison: --resume or --force
    assert "--force" in capsys.readouterr().err
    # a folder with a run's files but no marker (not made by the tool): kept
    os.makedirs(out / "spectra-adamw-s3")
    (out / "spectra-adamw-s3" / "metrics.jsonl").write_text("")
    assert main(["compare", *TINY, "--out", str(out), "--force", "--seeds", "1"]) == 0
    left = sorted(os.listdir(out))
    for name in ("photos-s2023", "thesis-s1", "adamw-s9", "adamw-s0-old"):
        assert (out / name / "notes.txt").read_text() == "keep me"
    assert "adamw-s0" not in left and "spectra-adamw-s3" in left and "adamw-s1" in left
    assert runfolders.read_index(str(out))["runs"] == ["adamw-s1"]


def test_index_cannot_delete_outside_out(tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim"
    _mine(victim)
    os.makedirs(out)
    os.symlink(victim, out / "link-s0")
    (out / runfolders.INDEX).write_text(json.dumps({"command": "compare", "options": {},
                                                    "runs": ["../victim", "link-s0", "/tmp", "..", ""]}))
    runfolders.remove_runs(str(out))  # the index names no folder to delete: only marked run folders go
    assert (victim / "notes.txt").exists() and os.path.islink(out / "link-s0")
    for bad in (["../victim"], ["/tmp"], [".."], [""]):  # result file names are names inside out, nothing else
        with pytest.raises(ValueError, match="files must be names"):
            runfolders.remove_runs(str(out), tuple(bad))
    assert (victim / "notes.txt").exists()
    with pytest.raises(ValueError, match="runs"):
        runfolders.write_index(str(out), "compare", {}, ["../victim"])
    (out / runfolders.INDEX).write_text("[" * 100000)  # not an index: ignored, never followed
    assert runfolders.read_index(str(out)) is None


def _hold_lock(path):
    """Another process holding the lock of ``path``, as a running compare does."""
    code = ("import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.ftruncate(fd, 0); os.write(fd, str(os.getpid()).encode())\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_command_on_one_out_is_refused(tmp_path, capsys, quick_plots):
    out = tmp_path / "out"
    os.makedirs(out)
    holder = _hold_lock(out / runfolders.LOCK)
    try:
        for argv in (["compare", *TINY], ["sweep", *TINY, "--lrs", "1e-3"]):
            assert main([*argv, "--out", str(out)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"is in use by process {holder.pid}" in err[0], err
        assert not (out / "adamw-s0").exists() and not (out / runfolders.INDEX).exists()  # nothing written
    finally:
        holder.kill()
        holder.wait()
    assert main(["compare", *TINY, "--out", str(out)]) == 0  # the lock ends with its process


def test_sweep_shards_share_out_but_not_a_shard(tmp_path, capsys, quick_plots):
    out = str(tmp_path / "sweep")
    with runfolders.locked(out, shared=True), runfolders.locked(out, name=f"{runfolders.LOCK}.shard-0-of-2"):
        assert main(["sweep", *TINY, "--lrs", "1e-3,2e-3", "--shard", "0/2", "--out", out]) == 2
        assert f"in use by process {os.getpid()}" in capsys.readouterr().err
        assert main(["sweep", *TINY, "--lrs", "1e-3,2e-3", "--out", out]) == 2  # a whole sweep needs it alone
        capsys.readouterr()
        assert main(["sweep", *TINY, "--lrs", "1e-3,2e-3", "--shard", "1/2", "--out", out]) == 0
    assert sorted(runfolders.read_index(out)["runs"]) == ["adamw-lr0.002-s0"]


def test_resume_with_other_options_is_refused(tmp_path, capsys, quick_plots):
    out = str(tmp_path / "out")
    assert main(["compare", *TINY, "--out", out]) == 0
    rows = json.load(open(os.path.join(out, "results.json")))["rows"]
    for extra, words in ((["--steps", "8"], "--steps 4 (now 8)"), (["--lr", "1e-2"], "--lr default (now 0.01)"),
                         (["--steps", "8", "--weight-decay", "0"], "--weight-decay 0.1 (now 0.0)")):
        assert main(["compare", *TINY, *extra, "--out", out, "--resume"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert json.load(open(os.path.join(out, "results.json")))["rows"] == rows  # nothing was relabelled
    # the same options (more seeds, another checkpoint interval) continue the comparison
    assert main(["compare", *TINY, "--seeds", "0,1", "--ckpt-every", "4", "--out", out, "--resume"]) == 0
    assert main(["compare", *TINY, "--steps", "8", "--out", out, "--force"]) == 0  # or start over


def test_sweep_with_other_options_is_refused(tmp_path, capsys, quick_plots):
    out = str(tmp_path / "sweep")
    assert main(["sweep", *TINY, "--lrs", "1e-3", "--out", out]) == 0
    capsys.readouterr()
    assert main(["sweep", *TINY, "--lrs", "1e-3", "--steps", "6", "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--steps 4 (now 6)" in err[0]
    assert main(["sweep", *TINY, "--lrs", "1e-3,2e-3", "--out", out]) == 0  # more LRs: the same sweep, grown
    _mine(os.path.join(out, "photos-s2023"))
    assert main(["sweep", *TINY, "--lrs", "1e-3", "--steps", "6", "--out", out, "--force"]) == 0
    assert sorted(n for n in os.listdir(out) if not n.startswith(".")) == \
        ["adamw-lr0.001-s0", "best", "lr_sensitivity.png", "photos-s2023", "sweep.json", "sweep.md"]


def test_diverging_run_is_a_result_and_the_sweep_goes_on(tmp_path, capsys, quick_plots):
    out = str(tmp_path / "sweep")
    args = [a if a != "4" else "20" for a in TINY]
    assert main(["sweep", *args, "--eval-every", "10", "--lrs", "3e-3,30", "--out", out]) == 0
    res = json.load(open(os.path.join(out, "sweep.json")))
    by_lr = {r["lr"]: r for r in res["rows"]}
    assert by_lr[30.0]["diverged"] is True and math.isnan(float(by_lr[30.0]["val_loss"]))
    assert by_lr[0.003]["diverged"] is False and math.isfinite(by_lr[0.003]["val_loss"])
    assert res["best"][0]["best_lr"] == 0.003 and res["best"][0]["diverged_points"] == 1
    # the diverged run's curve up to its stop
    with open(os.path.join(out, "adamw-lr30-s0", "adamw-s0", "metrics.jsonl")) as f:
        logged = [json.loads(line) for line in f]
    stop = by_lr[30.0]["diverged_at"]
    assert 1 <= stop < 20 and [r["step"] for r in logged if "loss" in r][-1] == stop


def test_spectral_norms_of_non_finite_matrices_are_nan():
    g = torch.Generator().manual_seed(0)
    mats = [torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(4)]
    mats[1][2, 0] = math.nan
    mats[3][0, 0] = math.inf
    got = batched_spectral_norms(mats)
    for m, v in zip(mats, got):
        if torch.isfinite(m).all():
            assert v == pytest.approx(float(torch.linalg.svdvals(m)[0]), rel=1e-12)
        else:
            assert math.isnan(v)
    sv = svdvals_or_nan(torch.stack(mats))
    assert torch.isnan(sv[1]).all() and torch.isnan(sv[3]).all()
    torch.testing.assert_close(sv[0], torch.linalg.svdvals(mats[0]))
