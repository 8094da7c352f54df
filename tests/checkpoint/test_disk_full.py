"""A full disk during a save: one clear error "no space left on device: <path>" (errno ENOSPC), no partial
files, the previous checkpoint stays current and loads; `spectrakit compare` prints it as one line."""

from __future__ import annotations

import builtins
import errno
import os

import pytest
import torch

from spectrakit import checkpoint as ck
from spectrakit.checkpoint import files


class _FullFile:
    """A real file whose writes fail with ENOSPC once ``budget`` bytes are written (as on a full tmpfs)."""

    def __init__(self, f, budget):
        self.f, self.left = f, budget

    def write(self, data):
        if len(data) > self.left:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.left -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _fill_disk(monkeypatch, budget: int, only: str | None = None, after: int = 0):
    """Make files opened for writing by the checkpoint code run out of space after ``budget`` bytes (only
    files whose name contains ``only``, from the ``after``-th such file on)."""
    seen = {"n": 0}

    def fake_open(path, mode="r", *a, **kw):
        f = builtins.open(path, mode, *a, **kw)
        if "w" in mode and (only is None or only in os.path.basename(str(path))):
            seen["n"] += 1
            if seen["n"] > after:
                return _FullFile(f, budget)
        return f

    monkeypatch.setattr(files, "open", fake_open, raising=False)


def _save(root, step):
    m = torch.nn.Linear(64, 64)
    with torch.no_grad():
        m.weight.fill_(float(step))
    return ck.save(str(root), model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), step=step)


def _step_loaded(root):
    m = torch.nn.Linear(64, 64)
    return ck.load(str(root), model=m)["step"], float(m.weight[0, 0].detach())


@pytest.mark.parametrize("budget", [0, 100, 5000, 12000])
def test_torch_save_running_out_of_space(tmp_path, monkeypatch, budget):
    """torch's writer reports a failed write as "RuntimeError: [enforce fail at inline_container.cc]";
    the save reports the full disk instead."""
    _save(tmp_path, 1)
    _fill_disk(monkeypatch, budget)
    with pytest.raises(ck.CheckpointError) as e:
        _save(tmp_path, 2)
    msg = str(e.value)
    assert msg.startswith(f"no space left on device: {tmp_path} ") and "\n" not in msg
    assert "step_00000001 is kept" in msg and e.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000001"]  # no partial files
    monkeypatch.undo()
    assert _step_loaded(tmp_path) == (1, 1.0)


@pytest.mark.parametrize("which", ["manifest.json", "latest"])
def test_manifest_or_pointer_running_out_of_space(tmp_path, monkeypatch, which):
    _save(tmp_path, 1)
    _fill_disk(monkeypatch, 0, only=which)
    with pytest.raises(ck.CheckpointError, match=f"^no space left on device: {tmp_path}"):
        _save(tmp_path, 2)
    monkeypatch.undo()
    assert ck.latest(str(tmp_path)).endswith("step_00000001")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]
    step, w = _step_loaded(tmp_path)  # the previous one, or the complete new one when only `latest` failed
    assert (step, w) in ((1, 1.0), (2, 2.0))


def test_first_save_on_a_full_disk(tmp_path, monkeypatch):
    _fill_disk(monkeypatch, 0)
    with pytest.raises(ck.CheckpointError, match="no space left on device: .*there is no previous checkpoint"):
        _save(tmp_path / "run", 1)
    assert os.listdir(tmp_path / "run") == []


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_sharded_save_running_out_of_space(tmp_path, monkeypatch):
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ck.save_sharded(str(tmp_path), model=m, optimizer=opt, step=1)
    _fill_disk(monkeypatch, 0, only="train_state_rank")
    with pytest.raises(ck.CheckpointError, match=f"^no space left on device: {tmp_path}") as e:
        ck.save_sharded(str(tmp_path), model=m, optimizer=opt, step=2)
    assert e.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000001"]


def test_other_write_errors_are_one_line_too(tmp_path, monkeypatch):
    _save(tmp_path, 1)

    def denied(obj, path):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr("spectrakit.checkpoint.store.save_file", denied)
    with pytest.raises(ck.CheckpointError, match="could not write a checkpoint to .*: Permission denied"):
        _save(tmp_path, 2)


def test_compare_on_a_full_disk_prints_one_line(tmp_path, tmp_path_factory, monkeypatch, capsys):
    """The second checkpoint of a `spectrakit compare` run hits a full disk: one line, exit status 1, and
    the first checkpoint is intact."""
    from spectrakit.cli import main

    monkeypatch.setenv("SPECTRAKIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    _fill_disk(monkeypatch, 1000, only="state.pt", after=1)
    out = tmp_path / "out"
    # the nano model, diagnostics at the end only: the property is the save's, not the model's (checkpoints
    # fall on logged steps, every 10 at most: 20 steps for two of them)
    code = main(["compare", "--optimizers", "adamw", "--preset", "nano", "--tokenizer", "bytes", "--steps", "20",
                 "--batch-size", "2", "--seq-len", "16", "--eval-every", "20", "--eval-tokens", "64", "--diag-every",
                 "20", "--ckpt-every", "10", "--quiet", "--threads", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"error: no space left on device: {out}")
    monkeypatch.undo()
    runs = [d for d in os.listdir(out) if os.path.isdir(out / d / "checkpoints")]
    assert len(runs) == 1
    assert ck.latest(str(out / runs[0] / "checkpoints")).endswith("step_00000010")
    from spectrakit.checkpoint import verify

    verify(ck.latest(str(out / runs[0] / "checkpoints")))
