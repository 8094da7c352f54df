"""compare and sweep own only what they made: a folder of a run's name, a planted index, links at the lock,
at the result files or at a run's checkpoints, ``--out /`` and a link as ``--out`` are refused or left
alone, never followed, written through or deleted. A run stopped between its final checkpoint and its
result finishes on resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from spectrakit.cli import main
from spectrakit.experiments import runfolders

TINY = ["--optimizers", "adamw", "--preset", "nano", "--tokenizer", "bytes", "--steps", "4", "--batch-size", "2",
        "--seq-len", "16", "--eval-every", "2", "--eval-tokens", "64", "--diag-every", "4", "--ckpt-every", "2",
        "--quiet", "--threads", "1"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPECTRAKIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _user_file(path, text="mine"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _one_error(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    return err[0]


def test_a_folder_the_tool_did_not_make_is_never_used_or_deleted(tmp_path, capsys, quick_plots):
    out = tmp_path / "C"
    _user_file(out / "adamw-s0" / "mydata.txt")  # a user's folder where a run would go
    assert main(["compare", *TINY, "--out", str(out)]) == 2
    _one_error(capsys, "not empty", "not made by 'spectrakit compare'")
    assert main(["compare", *TINY, "--out", str(out), "--force"]) == 2
    capsys.readouterr()
    assert (out / "adamw-s0" / "mydata.txt").read_text() == "mine" and os.listdir(out / "adamw-s0") == ["mydata.txt"]

    out = tmp_path / "D"
    assert main(["compare", *TINY, "--out", str(out)]) == 0
    _user_file(out / "adamw-s1" / "mydata.txt")  # later, inside the tool's --out, under a run's name
    _user_file(out / "userdir" / "notes.txt")
    (out / runfolders.INDEX).write_text(json.dumps({"command": "compare", "options": {},
                                                    "runs": ["userdir", "adamw-s1", "../C"]}))
    assert main(["compare", *TINY, "--seeds", "0,1", "--out", str(out), "--resume"]) == 2
    _one_error(capsys, "adamw-s1", "was not made by spectrakit")
    assert main(["compare", *TINY, "--out", str(out), "--force"]) == 0  # deletes its own runs only
    capsys.readouterr()
    assert (out / "adamw-s1" / "mydata.txt").read_text() == "mine"
    assert (out / "userdir" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "C" / "adamw-s0" / "mydata.txt").exists()
    assert runfolders.owned(str(out / "adamw-s0")) and not runfolders.owned(str(out / "adamw-s1"))


def test_links_are_refused_or_replaced_never_followed(tmp_path, capsys, quick_plots):
    outside = tmp_path / "outside"
    for name in ("lock", "results.json", "results.md", "loss_curves.png", "index", "target"):
        _user_file(outside / name, f"outside {name}")
    out = tmp_path / "out"
    os.makedirs(out)
    os.symlink(outside / "lock", out / runfolders.LOCK)
    assert main(["compare", *TINY, "--out", str(out)]) == 2
    _one_error(capsys, runfolders.LOCK, "symbolic link")
    os.remove(out / runfolders.LOCK)
    assert main(["compare", *TINY, "--out", str(out)]) == 0
    for name in ("results.json", "results.md", "loss_curves.png"):
        os.remove(out / name)
        os.symlink(outside / name, out / name)
    os.remove(out / runfolders.INDEX)
    os.symlink(outside / "index", out / runfolders.INDEX)
    assert main(["compare", *TINY, "--out", str(out), "--force"]) == 0
    capsys.readouterr()
    for name in ("lock", "results.json", "results.md", "loss_curves.png", "index"):
        assert (outside / name).read_text() == f"outside {name}", name
    for name in ("results.json", "results.md", "loss_curves.png", runfolders.INDEX):
        assert os.path.isfile(out / name) and not os.path.islink(out / name), name

    # a run's checkpoints folder replaced by a link: resume refuses it, nothing behind it is read or removed
    ck = out / "adamw-s0" / "checkpoints"
    os.remove(out / "adamw-s0" / "result.json")
    elsewhere = tmp_path / "elsewhere"
    os.rename(ck, elsewhere)
    _user_file(elsewhere / "step_00000000" / "user.txt")
    os.symlink(elsewhere, ck)
    before = sorted(os.listdir(elsewhere))
    assert main(["compare", *TINY, "--out", str(out), "--resume"]) == 2
    _one_error(capsys, "checkpoints", "symbolic link")
    assert sorted(os.listdir(elsewhere)) == before and (elsewhere / "step_00000000" / "user.txt").exists()

    # --out itself a link, or the root folder
    os.symlink(out, tmp_path / "link")
    assert main(["compare", *TINY, "--out", str(tmp_path / "link"), "--resume"]) == 2
    _one_error(capsys, "symbolic link")
    assert main(["compare", *TINY, "--out", "/"]) == 2
    _one_error(capsys, "root folder")


def test_prune_removes_only_step_folders_a_save_wrote(tmp_path):
    import torch

    from spectrakit.checkpoint import CheckpointError, prune, save

    root = tmp_path / "ck"
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    _user_file(root / "step_00000000" / "user.txt")  # a folder with a step's name, not written by a save
    for step in (1, 2, 3):
        save(str(root), model=m, optimizer=opt, step=step, keep=1)
    prune(str(root), 1)
    assert sorted(os.listdir(root)) == ["latest", "step_00000000", "step_00000003"]
    os.symlink(root, tmp_path / "ck-link")
    with pytest.raises(CheckpointError, match="symbolic link"):
        save(str(tmp_path / "ck-link"), model=m, optimizer=opt, step=4)
    prune(str(tmp_path / "ck-link"), 1)
    assert sorted(os.listdir(root)) == ["latest", "step_00000000", "step_00000003"]


def test_a_run_killed_after_its_final_checkpoint_finishes_on_resume(tmp_path, capsys, quick_plots):
    """SIGKILL between the final checkpoint and ``result.json`` (the process kills itself exactly there): every
    later resume used to do 0 steps and end in a ZeroDivisionError; now it writes the result from the
    checkpoint and the step time from the logs, without training."""
    out = tmp_path / "out"
    argv = ["compare", *TINY, "--optimizers", "adamw,spectra-adamw", "--out", str(out)]
    code = ("import os, signal, sys\n"
            "import spectrakit.experiments.compare as c\n"
            "c._write_row = lambda run_dir, row: os.kill(os.getpid(), signal.SIGKILL)\n"
            "from spectrakit.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert os.path.isdir(out / "adamw-s0" / "checkpoints" / "step_00000004")
    assert not os.path.exists(out / "adamw-s0" / "result.json")
    assert main([*argv, "--resume"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["optimizer"] for r in rows] == ["adamw", "spectra-adamw"]
    assert all(r["step_ms"] > 0 and r["val_loss"] > 0 for r in rows) and rows[1]["overhead_%"] is not None
    logged = [json.loads(line) for line in (out / "adamw-s0" / "metrics.jsonl").read_text().splitlines()]
    assert sum("val_loss" in r and r["step"] == 4 for r in logged) == 1  # no second validation of the last step
    assert "resuming adamw-s0 from step 4" in capsys.readouterr().err


def test_undefined_ratios_are_dashes():
    from spectrakit.experiments.compare import _ratio_pct

    assert _ratio_pct(2.0, 1.0) == pytest.approx(100.0)
    for a, b in ((1.0, 0.0), (0.0, 1.0), (float("nan"), 1.0), (None, 1.0), (1.0, float("inf"))):
        assert _ratio_pct(a, b) is None


def test_a_load_change_is_marked_in_the_title():
    from spectrakit.experiments.compare import _load_note

    assert _load_note([{"load": [0.1, 0.3]}, {"load": [0.2, 0.9]}]) == ""
    note = _load_note([{"load": [0.1, 0.3]}, {"load": [0.2, 2.5]}])
    assert "moved from 0.1 to 2.5" in note and "measured in pairs" in note


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_only_rank_0_checks_claims_and_cleans_out(tmp_path, monkeypatch, command):
    """Under torchrun every rank parses the same command line; rank 0 alone claims and cleans --out, so a
    rank that starts a moment later never sees rank 0's half-written marker (or its --force deletion)."""
    import argparse

    from spectrakit.experiments import compare, sweep

    out = tmp_path / "out"
    out.mkdir()
    (out / f".tmp-{runfolders.OUT_MARKER}-123").write_text("{")  # rank 0's marker, mid write_atomic
    runfolders.make_run(str(out), "run-a")  # a run of the previous job: --force is rank 0's to delete
    before = sorted(os.listdir(out))
    monkeypatch.setenv("RANK", "1")
    if command == "compare":
        compare._check_out_folder(argparse.Namespace(out=str(out), resume=False, force=True))
    else:
        monkeypatch.setattr(sweep, "sweep", lambda **kw: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):  # stops right after the --out handling
            args = argparse.Namespace(out=str(out), force=True, dist_timeout=1.0, tol=0.1, extend=False)
            sweep._run(args, 0.0, [], [], (0, 1), {})
    assert sorted(os.listdir(out)) == before and runfolders.owned(str(out / "run-a"))  # nothing read or written
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(runfolders.UsageError, match="not empty"):  # rank 0 does check
        compare._check_out_folder(argparse.Namespace(out=str(out), resume=False, force=False))
