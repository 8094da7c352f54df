"""The GPU validation suite (``spectrakit gpu-suite``), proven on the CPU at toy sizes: every stage runs and
writes its part of the report; a failing stage is recorded and the next one still runs; reports of separate
commands merge; the stages' figures agree with independent references (float64 SVD, the bound
inequalities of the convolution norms)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from spectrakit.cli import main
from spectrakit.experiments import gpu_suite
from spectrakit.experiments.gpu_suite import stage_compare, stage_linalg, stage_optim, stage_tests, stage_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _suite(tmp_path, *stages):
    out = tmp_path / "gpu_report"
    argv = ["gpu-suite", "--device", "cpu", "--tiny", "--out", str(out), "--threads", "1"]
    for s in stages:
        argv += ["--stage", s]
    rc = main(argv)
    report = json.loads((out / "report.json").read_text())
    return rc, report, (out / "REPORT.md").read_text(), out


def _check_header(text: str, report: dict) -> None:
    for key in ("device", "driver", "cuda", "torch", "date", "command"):
        assert f"- {key}: " in text, key
        assert key in report["env"], key
    assert "--device cpu --tiny" in report["env"]["command"]


@pytest.mark.soak  # every stage end to end (about a minute of CPU); .ci/run runs the soak tier on a fast machine
def test_whole_suite_tiny_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["spectrakit", "gpu-suite", "--device", "cpu", "--tiny"])
    rc, report, text, out = _suite(tmp_path)
    stages = report["stages"]
    assert list(gpu_suite.STAGES) == ["tests", "linalg", "optim", "train", "compare", "conv", "scale"]
    assert set(stages) == set(gpu_suite.STAGES)
    bad = {n: e["error"] for n, e in stages.items() if e["status"] != "ok"}
    assert rc == 0 and not bad, bad
    _check_header(text, report)
    for name in gpu_suite.STAGES:
        assert f"## {name}: ok" in text
        assert stages[name]["tables"] and all(stages[name]["tables"].values()), name

    runs = {r["run"]: r for r in stages["tests"]["tables"]["pytest"]}
    assert runs["gpu-marked"]["tests"] >= 1 and runs["gpu-marked"]["skipped"] == runs["gpu-marked"]["tests"]
    assert (out / "tests" / "gpu-marked.xml").exists()
    device_files = stage_tests.selections(stage_tests.tests_folder(), "cpu", True)["device"]
    if device_files:
        assert runs["device"]["passed"] >= 1 and runs["device"]["failures"] == 0
    else:
        assert runs["device"]["tests"] == 0 and any("device fixture" in n for n in stages["tests"]["notes"])

    acc = stages["linalg"]["tables"]["accuracy and time per function"]
    names = {r["function"] for r in acc}
    assert {"msign", "soft_clip fast", "soft_clip accurate", "spectral_hardcap", "eig_clip",
            "spectral_lmo nuclear"} <= names
    for r in acc:  # the documented accuracy: 1e-3 relative in fp32, 3e-2 in bf16
        assert r["rel_err"] < (1e-3 if r["dtype"] == "fp32" else 5e-2), r
        assert r["time_ms"] > 0
    assert {r["shape"] for r in acc} == {"16x16", "16x48", "48x16", "256x16"}

    optim = {r["optimizer"]: r for r in stages["optim"]["tables"]["optimizer step"]}
    for name in ("torch.optim.AdamW (fused)", "adamw", "spectra-adamw", "spectra-signum", "lmo-nuclear-signum",
                 "muon"):
        assert optim[name]["step_ms"] > 0 and optim[name]["peak_extra_MiB"] >= 0, name
    assert optim["torch.optim.AdamW (fused)"]["compiled_step_ms"] > 0

    train = {r["optimizer"]: r for r in stages["train"]["tables"]["training step"]}
    assert set(train) == {"adamw", "spectra-adamw"}
    assert train["spectra-adamw"]["overhead_%"] == pytest.approx(
        100 * (train["spectra-adamw"]["step_ms"] / train["adamw"]["step_ms"] - 1))
    assert train["adamw"]["tokens/s"] > 0

    (rows,) = stages["compare"]["tables"].values()
    assert {r["optimizer"] for r in rows} == {"adamw", "spectra-adamw"}
    assert all(r["val_loss"] > 0 for r in rows)
    assert (out / "compare" / "loss_curves.png").exists()

    for r in stages["conv"]["tables"]["convolution spectral norms"]:
        exact = r["exact zero-pad"]
        # TN <= F4 (Grishina et al. 2024, Lemma 1); both bound the zero-padded and circular norms from above
        assert exact * (1 - 1e-3) <= r["TN"] <= r["F4"] * (1 + 1e-4), r
        assert r["exact circular"] <= r["TN"] * (1 + 1e-4), r


def test_failing_stage_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    def boom(ctx):
        raise RuntimeError("injected failure for the test")

    monkeypatch.setattr(stage_train, "run", lambda ctx: gpu_suite.StageResult(tables={"t": [{"a": 1}]}))
    rc, report, text, out = _suite(tmp_path, "train")  # an earlier command's stage, kept in the merged report
    assert rc == 0 and report["stages"]["train"]["status"] == "ok"
    monkeypatch.setattr(stage_linalg, "run", boom)
    rc, report, text, out = _suite(tmp_path, "linalg", "conv")
    assert rc == 1
    entry = report["stages"]["linalg"]
    assert entry["status"] == "failed" and entry["error"] == "RuntimeError: injected failure for the test"
    assert "boom" in entry["traceback"]
    assert report["stages"]["conv"]["status"] == "ok" and report["stages"]["conv"]["tables"]
    assert report["stages"]["train"]["tables"] == {"t": [{"a": 1}]}  # merged from the first command
    assert "## linalg: failed" in text and "error: RuntimeError: injected failure" in text
    assert "## train: ok" in text and "## conv: ok" in text
    assert text.index("## linalg") < text.index("## train") < text.index("## conv")
    _check_header(text, report)
    assert "--stage linalg --stage conv" in report["env"]["command"]


def test_stage_that_finds_failures_is_marked_failed(tmp_path, monkeypatch):
    """A stage that runs to its end but whose checks fail (here: pytest reports a failing test) is failed."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_gpu():\n    pass\n\n"
                                     "@pytest.mark.parametrize('device', ['cpu'])\n"
                                     "def test_dev(device):\n    assert device == 'cuda'\n")
    monkeypatch.setattr(stage_tests, "tests_folder", lambda: str(tests))
    # the two pytest processes run the file above only: the installed plugins it does not use are not loaded
    # (Hypothesis' alone costs about 1.5 s of CPU per process here)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest -p no:benchmark -p no:cov -p no:anyio")
    rc, report, text, out = _suite(tmp_path, "tests")
    entry = report["stages"]["tests"]
    assert rc == 1 and entry["status"] == "failed"
    assert "device: 1 failed" in entry["error"]
    assert any("test_dev" in n for n in entry["notes"])
    runs = {r["run"]: r for r in entry["tables"]["pytest"]}
    assert runs["gpu-marked"]["tests"] == 1 and runs["device"]["tests"] == 1 and runs["device"]["failures"] == 1


def test_a_failing_row_fails_the_stage_and_the_other_rows_run(tmp_path, monkeypatch):
    real = stage_optim.makers

    def broken(model):
        raise ValueError("broken optimizer for the test")

    monkeypatch.setattr(stage_optim, "makers", lambda ctx: {"adamw": real(ctx)["adamw"], "broken": broken})
    entry = gpu_suite.run_stage("optim", gpu_suite.Context(torch.device("cpu"), True, str(tmp_path)))
    assert entry["status"] == "failed" and entry["error"] == "step failed for: broken"
    rows = {r["optimizer"]: r for r in entry["tables"]["optimizer step"]}
    assert rows["adamw"]["step_ms"] > 0 and "error" not in rows["adamw"]
    assert rows["broken"]["error"] == "ValueError: broken optimizer for the test"


def test_compare_past_its_budget_is_interrupted_and_recorded(tmp_path, monkeypatch):
    # a run far longer than the budget: the 3 steps of the tiny run could end just as the signal is sent (a
    # late signal is ignored by design), e.g. where this process waited for a core before starting its timer
    tiny = list(stage_compare.TINY)
    tiny[tiny.index("--steps") + 1] = "100000"
    monkeypatch.setattr(stage_compare, "TINY", tiny)
    ctx = gpu_suite.Context(torch.device("cpu"), True, str(tmp_path), budget_s=0.5)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a shell's background job
    try:
        entry = gpu_suite.run_stage("compare", ctx)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert entry["status"] == "failed" and "time budget" in entry["error"] and "--resume" in entry["error"]
    # the command was stopped, not run to its end: its log ends with the command line's one line for SIGINT
    # (its handlers are installed before torch is imported), or, for a signal that lands in the interpreter's
    # own start-up, before those handlers exist, with Python's KeyboardInterrupt or nothing. No bound on the
    # seconds: on a loaded 2-core machine the interrupted stage took 94 s.
    log = (tmp_path / "compare.log").read_text().strip().splitlines()
    assert not log or log[-1] in ("interrupted (SIGINT, Ctrl-C)", "KeyboardInterrupt"), log[-5:]


@pytest.mark.parametrize("helper", [True, False])
def test_the_compare_child_takes_sigint_where_this_process_ignores_it(helper):
    """A shell's background job starts with SIGINT ignored and passes that on to the processes it starts: the
    compare stage's child gets a handled SIGINT all the same (with a plain ``Popen``, the control case, it is
    ignored until the command installs its handlers: a stop sent during its start-up was dropped and the run went
    on), and this process's own disposition is restored."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        spawn = stage_compare.popen_interruptible if helper else subprocess.Popen
        proc = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=120)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert out.strip() == ("False" if helper else "True")


def test_compare_stage_reads_the_table_in_compare_order(tmp_path, monkeypatch):
    """The stage's table is compare's ``results.json``, its rows re-keyed in the order of its ``columns`` (keys
    not listed dropped), under its ``name``; a command that exits 0 leaves the stage passed. (Deterministic:
    the end-to-end run above is in the soak tier, and the budget test's interrupted run writes this file or not
    depending on how far it got.)"""

    table = {"name": "validation", "columns": ["optimizer", "val_loss"],
             "rows": [{"val_loss": 3.5, "optimizer": "adamw", "extra": 1}, {"optimizer": "spectra-adamw"}]}
    writer = f"import json, sys; json.dump({table!r}, open(sys.argv[1] + '/results.json', 'w'))"
    monkeypatch.setattr(stage_compare, "command", lambda ctx, folder: [sys.executable, "-c", writer, folder])
    res = stage_compare.run(gpu_suite.Context(torch.device("cpu"), True, str(tmp_path), budget_s=60))
    assert res.ok and not res.error
    rows = res.tables["validation"]
    assert [list(r) for r in rows] == [["optimizer", "val_loss"], ["optimizer"]]
    assert rows[0] == {"optimizer": "adamw", "val_loss": 3.5}
    assert "compare/results.json" in res.files


def test_cli_errors_and_wrapper(tmp_path, capsys):
    """One process launch, through the wrapper script: it passes its arguments on, and a bad --stage is one
    line on stderr with exit status 2 (no traceback); the help text from the command line in this process."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    script = os.path.join(ROOT, "scripts", "gpu_suite.sh")
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    p = subprocess.run([script, "--stage", "nope", "--out", str(tmp_path)], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1
    assert "--stage" in p.stderr and all(name in p.stderr for name in gpu_suite.STAGES)
    with pytest.raises(SystemExit) as e:
        main(["gpu-suite", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--tiny" in out and "--stage" in out


def test_driver_version_from_nvidia_smi(tmp_path, monkeypatch):
    from spectrakit.experiments.gpu_suite import report

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 550.54.15\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert report._driver_version() == "550.54.15"
    fake.write_text("#!/bin/sh\nexit 9\n")
    assert report._driver_version() == "n/a (nvidia-smi failed)"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert report._driver_version() == "n/a (no nvidia-smi)"


def test_scale_stage_tiny_on_cpu(tmp_path, monkeypatch):
    """``spectrakit gpu-suite --stage scale --device cpu --tiny``: ``scale.json`` with the keys the H100 run
    fills (optimizer and training steps, overhead, memory, launches, the large-LR runs), ``scale.md`` and the
    loss-curve figure; the paper's code, given as a checkout folder, is imported from there and timed."""
    ref = tmp_path / "checkout" / "src" / "optim"
    ref.mkdir(parents=True)
    # a stand-in checkout with the authors' file layout and class name (their code is never copied here)
    (ref / "post_process.py").write_text("def clip_sigvals(U, clip_c, ns_iter):\n    return U.clamp(-clip_c, clip_c)\n")
    (ref / "spectra.py").write_text(
        "import torch\nfrom .post_process import clip_sigvals\n\n"
        "class SPECTRA:\n"
        "    def __init__(self, base_optimizer, post_process='clip', clip_c=1.0, ns_steps=10, base_lr=1e-3):\n"
        "        self.base = base_optimizer\n"
        "    def step(self):\n"
        "        self.base.step()\n"
        "        with torch.no_grad():\n"
        "            for g in self.base.param_groups:\n"
        "                for p in g['params']:\n"
        "                    p.copy_(clip_sigvals(p, 10.0, 10))\n")
    out = tmp_path / "gpu_report"
    rc = main(["gpu-suite", "--device", "cpu", "--tiny", "--out", str(out), "--threads", "1", "--stage", "scale",
               "--reference", str(tmp_path / "checkout"), "--scale-steps", "4"])
    entry = json.loads((out / "report.json").read_text())["stages"]["scale"]
    assert rc == 0 and entry["status"] == "ok", entry.get("error")
    data = json.loads((out / "scale.json").read_text())
    for key in ("opt_step_ms", "train_step_ms", "overhead_pct", "peak_extra_mib", "launches_per_step", "repro"):
        assert key in data, key
    for model in ("124m", "160m"):
        steps = data["opt_step_ms"][model]
        assert {"torch AdamW (fused)", "AdamW", "SpectraAdamW", "paper SPECTRA-AdamW"} <= set(steps)
        assert all(v > 0 for v in steps.values())
        assert data["launches_per_step"][model]["SpectraAdamW"] > data["launches_per_step"][model]["AdamW"]
    assert set(data["train_step_ms"]) == {"adamw", "spectra-adamw", "muon"}
    assert data["repro"]["steps"] == 4 and {r["optimizer"] for r in data["repro"]["runs"]} == {"signum",
                                                                                                "spectra-signum"}
    assert all(r["final_val_loss"] > 0 for r in data["repro"]["runs"])
    assert os.path.getsize(os.path.join(out, "scale_loss.png")) > 1000 and os.path.exists(os.path.join(out, "scale.md"))
