"""`spectrakit compare` interrupted (SIGINT) then resumed gives the same results as an uninterrupted run; an
existing run folder is refused without --resume/--force."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from spectrakit.cli import main
from spectrakit.train import diagnostics, interrupt

# 12 steps: checkpoints at 5, 10 and 12, evaluations at 5, 10 and 12, diagnostics at 0, 5, 10 and 11 (the last
# step's spectra), training log lines at 10 and 12
ARGS = ["compare", "--optimizers", "adamw,spectra-adamw", "--preset", "nano", "--tokenizer", "bytes", "--steps", "12",
        "--batch-size", "2", "--seq-len", "16", "--eval-every", "5", "--eval-tokens", "64", "--diag-every", "5",
        "--ckpt-every", "5", "--quiet", "--threads", "1"]
SAME = ("optimizer", "seed", "lr", "val_loss", "val_ppl", "max_weight_sn", "max_update_sn", "agg_linf", "diverged")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPECTRAKIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _rows(out):
    with open(os.path.join(out, "results.json")) as f:
        data = json.load(f)
    return [{k: r[k] for k in SAME} for r in data["rows"]], data["curves"]


def test_interrupt_then_resume_equals_uninterrupted(tmp_path, monkeypatch, capsys, quick_plots):
    straight = str(tmp_path / "straight")
    assert main([*ARGS, "--out", straight]) == 0
    # interrupted in the second optimizer's run between two checkpoints (step 11 of 12), after its step-10 log line
    original = diagnostics.SpectralDiagnostics.after_step
    seen = {"runs": 0}

    def after_step(self, ctx):
        original(self, ctx)
        if ctx.step == 0:
            seen["runs"] += 1
        if seen["runs"] == 2 and ctx.step == 10:
            interrupt.request(signal.SIGINT)

    monkeypatch.setattr(diagnostics.SpectralDiagnostics, "after_step", after_step)
    part = str(tmp_path / "part")
    assert main([*ARGS, "--out", part]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted at step 11" in err[0] and "--resume" in err[0]
    rows, _ = _rows(part)  # the finished run's row is already written
    assert [r["optimizer"] for r in rows] == ["adamw"]
    monkeypatch.setattr(diagnostics.SpectralDiagnostics, "after_step", original)
    assert main([*ARGS, "--out", part]) == 2  # refused without --resume / --force
    assert "--resume" in capsys.readouterr().err
    assert main([*ARGS, "--out", part, "--resume"]) == 0  # (the figures of the resumed rows are built, not rendered)
    assert "resuming spectra-adamw-s0 from step 11" in capsys.readouterr().err.splitlines()
    assert _rows(part) == _rows(straight)
    # the resumed run's log has each step once (training lines every 10 steps and at the last)
    with open(os.path.join(part, "spectra-adamw-s0", "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f if '"loss"' in line]
    assert steps == sorted(set(steps)) == [10, 12]
    # --resume into a folder without a comparison is refused, not a silent fresh start
    assert main([*ARGS, "--out", str(tmp_path / "new"), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --resume") and "without --resume" in err[0]
    # --force starts over
    assert main([*ARGS, "--out", part, "--force", "--optimizers", "adamw"]) == 0
    assert sorted(n for n in os.listdir(part) if n.endswith("-s0")) == ["adamw-s0"]


def test_real_sigint_prints_one_line_and_exits_130(tmp_path, cli_process):
    """A real SIGINT to a command-line process in the middle of training (a process forked from one that
    has imported torch, see ``cli_process``)."""
    out = tmp_path / "run"
    args = [*ARGS, "--steps", "400"]  # (the last --steps counts)
    proc = cli_process([*args, "--out", str(out)], dict(os.environ))
    latest = out / "adamw-s0" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "--resume" in lines[0], err
    assert "resume with: spectrakit compare --optimizers adamw,spectra-adamw" in lines[0], err  # its own command
