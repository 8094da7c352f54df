"""Durable checkpoints: atomic step directories, checksums and fallback, no code execution on load, disk-full
cleanup, SIGKILL during saves, graceful SIGINT and exact resume of `spectrakit compare`."""

from __future__ import annotations

import errno
import os
import pickle
import random
import select
import signal
import sys
import time
import traceback

import pytest
import torch

from spectrakit.checkpoint import store
from spectrakit.train import checkpoint as ck
from spectrakit.train import interrupt


def _model(fill: float) -> torch.nn.Module:
    m = torch.nn.Linear(8, 8)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(fill)
    return m


def _save(root, step, **kw):
    m = _model(float(step))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    return ck.save_checkpoint(str(root), model=m, optimizer=opt, step=step, data_state={"position": step}, **kw)


def _load(path):
    m = _model(-1.0)
    state = ck.load_checkpoint(str(path), model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    return state, float(m.weight[0, 0].detach())


class _Payload:
    """Unpickling this runs ``open(marker, 'w')``: a stand-in for ``os.system``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_layout_keep_and_latest(tmp_path):
    for step in (10, 20, 30):
        _save(tmp_path, step)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000020", "step_00000030"]
    assert sorted(os.listdir(tmp_path / "step_00000030")) == ["manifest.json", "state.pt"]
    state, w = _load(tmp_path)
    assert state["step"] == 30 and w == 30.0 and state["data"] == {"position": 30}


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_corruption_refused_with_fallback(tmp_path, damage, capsys):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    f = os.path.join(newest, "state.pt")
    if damage == "flip":
        data = bytearray(open(f, "rb").read())
        data[len(data) // 2: len(data) // 2 + 256] = os.urandom(256)
        open(f, "wb").write(bytes(data))
    elif damage == "truncate":
        os.truncate(f, os.path.getsize(f) // 2)
    elif damage == "delete":
        os.remove(f)
    else:
        open(os.path.join(newest, "manifest.json"), "w").write("{garbage")
    with pytest.raises(ck.CheckpointError) as e:
        _load(newest)  # a step directory is used as given: refused, one line naming the file
    assert "\n" not in str(e.value) and newest in str(e.value)
    state, w = _load(tmp_path)  # the root falls back to the previous complete checkpoint, saying so
    assert state["step"] == 1 and w == 1.0
    assert "resuming from" in capsys.readouterr().err


def test_no_usable_checkpoint(tmp_path):
    newest = _save(tmp_path, 1)
    os.truncate(os.path.join(newest, "state.pt"), 10)
    with pytest.raises(ck.CheckpointError, match="no usable checkpoint"):
        _load(tmp_path)
    with pytest.raises(FileNotFoundError):
        _load(tmp_path / "missing")


def test_pickled_payload_is_never_executed(tmp_path):
    marker = tmp_path / "PWNED"
    step = tmp_path / "ck" / "step_00000001"
    step.mkdir(parents=True)
    # a state file with a valid manifest (the checksum cannot help here): refused by weights_only loading
    torch.save({"model": {}, "evil": _Payload(str(marker))}, step / "state.pt")
    ck.write_manifest(str(step), 1)
    with pytest.raises(ck.CheckpointError, match="refused, never executed"):
        _load(step)
    # an FSDP2 loop-state file goes through the same reader
    torch.save({"step": 1, "rng": _Payload(str(marker))}, tmp_path / "train_state_rank0.pt")
    with pytest.raises(ck.CheckpointError):
        ck.safe_load(str(tmp_path / "train_state_rank0.pt"))
    # `spectrakit lipschitz --checkpoint` with a pickled model or payload
    from spectrakit.cli import main

    bad = tmp_path / "model.pt"
    with open(bad, "wb") as f:
        pickle.dump(_Payload(str(marker)), f)
    assert main(["lipschitz", "--checkpoint", str(bad)]) == 2
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    assert main(["lipschitz", "--checkpoint", str(tmp_path / "module.pt")]) == 2
    assert not marker.exists()


def test_lipschitz_loads_a_state_dict_and_a_checkpoint_folder(tmp_path, capsys):
    from spectrakit.cli import main
    from spectrakit.models.cnn import build_model

    model = build_model("cnn-small")
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    assert main(["lipschitz", "--checkpoint", str(tmp_path / "sd.pt"), "--iters", "5"]) == 0
    ck.save_checkpoint(str(tmp_path / "ck"), model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                       step=3)
    assert main(["lipschitz", "--checkpoint", str(tmp_path / "ck"), "--iters", "5"]) == 0


def test_disk_full_keeps_previous_and_cleans_up(tmp_path, monkeypatch):
    _save(tmp_path, 1)

    def full(obj, path):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "save_file", full)
    with pytest.raises(ck.CheckpointError, match="no space left on device") as e:
        _save(tmp_path, 2)
    assert str(tmp_path) in str(e.value) and "step_00000001" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000001"]  # no partial files
    monkeypatch.undo()
    assert _load(tmp_path)[0]["step"] == 1


def test_leftover_temporary_files_are_cleaned(tmp_path):
    _save(tmp_path, 1)
    (tmp_path / ".tmp-step_00000002-999").mkdir()
    (tmp_path / ".tmp-step_00000002-999" / "state.pt").write_bytes(b"x" * 1000)
    (tmp_path / ".tmp-latest-999").write_text("step_00000002")
    _save(tmp_path, 2)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000001", "step_00000002"]


def _saver(root: str) -> None:
    """Write checkpoints of one Linear(256, 256) + AdamW in a loop until killed; ``ready`` on stdout after
    the first."""
    m = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(m.parameters())
    for step in range(1, 100000):
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(float(step))
        ck.save_checkpoint(root, model=m, optimizer=opt, step=step, data_state={"position": step})
        if step == 1:
            os.write(1, b"ready\n")


def _fork(work, *args, new_session: bool = False) -> tuple[int, int]:
    """``(pid, fd)``: ``work(*args)`` in a child forked from this interpreter (torch already imported: no new
    interpreter to start), its stdout a pipe read through ``fd``. The child never returns into pytest."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child is killed; coverage is never saved there)
        try:
            os.close(r)
            os.dup2(w, 1)
            if new_session:
                os.setsid()
            torch.set_num_threads(1)  # a forked child must not use the parent's OpenMP pool
            work(*args)
        except BaseException:
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(1)
    os.close(w)
    return pid, r


def _read_ready(fd: int, pid: int, timeout: float = 120.0) -> bytes:
    """The child's first line, or a failure (child killed) if none comes within ``timeout`` seconds."""
    with os.fdopen(fd, "rb") as f:
        if not select.select([f], [], [], timeout)[0]:
            os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked saver printed nothing within {timeout} s")
        return f.readline().strip()


@pytest.mark.parametrize("trials", [10, pytest.param(50, marks=pytest.mark.soak)])
def test_sigkill_during_saves_leaves_a_loadable_checkpoint(tmp_path, trials):
    """SIGKILL a process at a random moment while it writes checkpoints in a loop: the newest complete
    checkpoint loads with one step's model and data state, and ``clean`` removes the partial files. The saver
    is forked from this interpreter (a trial costs about 0.2 s); the kill comes within 0.15 s of the first
    save, several saves of 20-60 ms each; the soak tier runs five times as many trials."""
    rng = random.Random(0)
    _save(tmp_path / "warm", 1)  # the first save's imports happen here once, not in every forked child
    for trial in range(trials):
        root = tmp_path / f"t{trial}"
        pid, fd = _fork(_saver, str(root))
        assert _read_ready(fd, pid) == b"ready"
        time.sleep(rng.uniform(0.0, 0.15))  # over several saves of 20-60 ms: the kill hits any point of one
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        m = torch.nn.Linear(256, 256)
        state = ck.load_checkpoint(str(root), model=m)
        assert state["data"] == {"position": state["step"]} and float(m.weight[0, 0].detach()) == state["step"]
        ck.clean(str(root))
        assert not [n for n in os.listdir(root) if n.startswith(".tmp")]


def test_graceful_stop_flag():
    with interrupt.graceful(), interrupt.deferred():  # inside the training loop: the first signal is a request
        assert interrupt.requested() is None
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert interrupt.requested() == signal.SIGTERM
        with pytest.raises(interrupt.Terminated):  # a second one stops at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
    assert interrupt.requested() is None


@pytest.mark.parametrize("signum, exc, code", [(signal.SIGTERM, interrupt.Terminated, 143),
                                              (signal.SIGINT, KeyboardInterrupt, 130)])
def test_signal_outside_the_training_loop_stops_at_once(signum, exc, code):
    with pytest.raises(exc) as info, interrupt.graceful():  # data preparation, model set-up: nothing to save
        os.kill(os.getpid(), signum)
        time.sleep(0.05)
        raise AssertionError("the signal did not stop the block")
    assert interrupt.exit_code(info.value) == code and interrupt.requested() is None


def _fsdp_saver(workers: str, root: str) -> None:
    from spectrakit.distributed import run_workers

    # the ranks forked from this single-threaded launcher (torch imported once, by the test process): its
    # children, in its process group; their print() goes to file descriptor 1 (the pipe), not to pytest's capture
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    run_workers(workers + ":saver", 2, args=(root,), timeout=600, start_method="fork")


@pytest.mark.distributed
@pytest.mark.parametrize("trials", [1, pytest.param(5, marks=pytest.mark.soak)])
def test_sigkill_of_both_fsdp2_ranks_during_saves(tmp_path, trials):
    """Kill the whole 2-rank FSDP2 job at random moments while it writes sharded checkpoints: the newest
    complete checkpoint always loads (resharded onto one process), with model, optimizer and loop state of one
    step. One trial here; the soak tier runs five."""
    workers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_kill_workers.py")
    rng = random.Random(1)
    import spectrakit.distributed  # noqa: F401  (imported once here, not in every forked launcher)

    for trial in range(trials):
        root = tmp_path / f"t{trial}"
        # the launcher is forked from this interpreter, in its own process group with the two ranks
        pid, fd = _fork(_fsdp_saver, workers, str(root), new_session=True)
        assert _read_ready(fd, pid) == b"ready"
        time.sleep(rng.uniform(0.0, 1.0))
        os.killpg(pid, signal.SIGKILL)  # both ranks and their launcher at once
        os.waitpid(pid, 0)
        # load the 2-rank checkpoint in this process (DCP reshards to one rank)
        from spectrakit.optim import SpectraAdamW

        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(-1.0)
        state = ck.load_sharded_checkpoint(str(root), model=model,
                                           optimizer=SpectraAdamW(model.parameters(), lr=1e-3))
        assert state["step"] >= 1 and state["data"] == {"position": state["step"]}
        values = {float(v) for p in model.parameters() for v in (p.detach().min(), p.detach().max())}
        assert values == {float(state["step"])}  # every shard of the model is from that step


def test_dcp_payloads_are_never_executed(tmp_path):
    """FSDP2 checkpoints go through torch.distributed.checkpoint, which unpickles its metadata and non-tensor
    entries freely: both are checked / read with weights_only first."""
    from spectrakit.distributed import load_checkpoint, save_checkpoint

    marker = tmp_path / "PWNED"
    m = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    save_checkpoint(tmp_path / "a", m, opt, extra={"note": _Payload(str(marker))})  # a non-tensor entry
    with pytest.raises(Exception, match="weights_only|Unsupported|refused"):
        load_checkpoint(tmp_path / "a", m, opt, extra={"note": None})
    save_checkpoint(tmp_path / "b", m, opt)
    with open(tmp_path / "b" / ".metadata", "wb") as f:
        pickle.dump(_Payload(str(marker)), f)
    with pytest.raises(ValueError, match="refused, never executed"):
        load_checkpoint(tmp_path / "b", m, opt)
    assert not marker.exists()
