"""Hostile or broken checkpoint files: a tampered manifest, a `latest` pointer that leads outside the run
folder, malformed JSON, symbolic links and absurd loop states are refused with one-line
:class:`CheckpointError`s, and resuming from the run folder falls back to the previous checkpoint."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from spectrakit import checkpoint as ck


def _model(fill: float) -> torch.nn.Module:
    m = torch.nn.Linear(4, 4)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(fill)
    return m


def _save(root, step):
    m = _model(float(step))
    return ck.save(str(root), model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), step=step,
                   data_state={"position": step})


def _load(path, **kw):
    m = _model(-1.0)
    state = ck.load(str(path), model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), **kw)
    return state["step"], float(m.weight[0, 0].detach())


@pytest.fixture(scope="module")
def _saved_run(tmp_path_factory):
    """The run folder of ``run``, saved once for the module (two saves with their fsyncs were most of each
    test's time)."""
    root = tmp_path_factory.mktemp("saved") / "run"
    _save(root, 1)
    return root, os.path.basename(_save(root, 2))


@pytest.fixture
def run(tmp_path, _saved_run):
    """A run folder with complete checkpoints of steps 1 and 2 (a copy of one saved by ``checkpoint.save``,
    whose ``latest`` pointer and manifests are relative to the folder); returns (root, newest step folder)."""
    saved, newest = _saved_run
    root = tmp_path / "run"
    shutil.copytree(saved, root, symlinks=True)
    return root, str(root / newest)


def _manifest(step_dir) -> dict:
    return json.loads(open(os.path.join(step_dir, "manifest.json")).read())


def _write(step_dir, obj_or_text) -> None:
    text = obj_or_text if isinstance(obj_or_text, (str, bytes)) else json.dumps(obj_or_text)
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(os.path.join(step_dir, "manifest.json"), mode) as f:
        f.write(text)


def _refused_then_fallback(root, newest, match, capsys):
    """The step folder is refused with one line matching ``match``; the run folder falls back to step 1."""
    with pytest.raises(ck.CheckpointError, match=match) as e:
        _load(newest)
    assert "\n" not in str(e.value)
    assert _load(root) == (1, 1.0)
    assert "trying the previous checkpoint" in capsys.readouterr().err


# ------------------------------------------------------------------ item 2: the manifest lists exactly the folder
def test_empty_file_list_does_not_skip_verification(run, capsys):
    root, newest = run
    m = _manifest(newest)
    m["files"] = {}
    _write(newest, m)
    with open(os.path.join(newest, "state.pt"), "r+b") as f:  # tampered state.pt, unverified before
        f.seek(100)
        f.write(b"\x00" * 8)
    _refused_then_fallback(root, newest, "state.pt is not listed in manifest.json", capsys)


@pytest.mark.parametrize("path", [
    "../state.pt", "/etc/passwd", "../../../../etc/passwd", "./state.pt", "state.pt/", "a//state.pt",
    "sub/../state.pt", "..", ".", "", "manifest.json", "C:\\x", "state.pt\x00",
])
def test_paths_outside_the_folder_are_refused(run, capsys, path):
    root, newest = run
    m = _manifest(newest)
    m["files"][path] = m["files"]["state.pt"]
    _write(newest, m)
    _refused_then_fallback(root, newest, "corrupted", capsys)


def test_aliases_and_duplicates_are_refused(run, capsys):
    root, newest = run
    entry = json.dumps(_manifest(newest)["files"]["state.pt"])
    # the same key twice (json keeps the last one silently)
    _write(newest, '{"format": 1, "step": 2, "files": {"state.pt": ' + entry + ', "state.pt": ' + entry + "}}")
    _refused_then_fallback(root, newest, "duplicate key", capsys)
    # 2000 aliases of one file, about 4 MB: refused by size before anything is hashed
    aliases = {("./" * k) + "state.pt": json.loads(entry) for k in range(1, 2001)}
    _write(newest, {"format": 1, "step": 2, "files": aliases})
    assert os.path.getsize(os.path.join(newest, "manifest.json")) > ck.MAX_MANIFEST_BYTES
    _refused_then_fallback(root, newest, "larger than", capsys)
    # a few aliases under the size limit: refused as paths that are not plain
    _write(newest, {"format": 1, "step": 2, "files": {k: v for k, v in list(aliases.items())[:20]}})
    _refused_then_fallback(root, newest, "not a relative path inside the folder", capsys)


def test_unlisted_and_missing_files_are_refused(run, capsys):
    root, newest = run
    open(os.path.join(newest, "extra.pt"), "wb").write(b"payload")
    _refused_then_fallback(root, newest, "extra.pt is not listed", capsys)
    os.remove(os.path.join(newest, "extra.pt"))
    m = _manifest(newest)
    m["files"]["ghost.pt"] = {"size": 1, "sha256": "0" * 64}
    _write(newest, m)
    _refused_then_fallback(root, newest, "ghost.pt is missing", capsys)


def test_symbolic_links_are_refused(run, tmp_path, capsys):
    """A symbolic link in a step folder (to a file outside, with a manifest that matches it) is refused,
    and so is a step folder that is itself a link out of the run folder."""
    root, newest = run
    outside = tmp_path / "outside.pt"
    os.replace(os.path.join(newest, "state.pt"), outside)
    os.symlink(outside, os.path.join(newest, "state.pt"))
    # the writer itself refuses to list a link
    with pytest.raises(ck.CheckpointError, match="symbolic link"):
        ck.write_manifest(newest, 2)
    _refused_then_fallback(root, newest, "symbolic link", capsys)
    # a step folder that is a link to a complete checkpoint elsewhere is not a step folder of this run
    evil = tmp_path / "evil"
    _save(evil, 99)
    os.symlink(evil / "step_00000099", root / "step_00000099")
    assert _load(root) == (1, 1.0)


# ------------------------------------------------------------------ item 4: malformed manifests
MALFORMED = {
    "files is a list": {"format": 1, "step": 2, "files": ["state.pt"]},
    "int entry": {"format": 1, "step": 2, "files": {"state.pt": 5}},
    "no sha256": {"format": 1, "step": 2, "files": {"state.pt": {"size": 1}}},
    "sha256 int": {"format": 1, "step": 2, "files": {"state.pt": {"size": 1, "sha256": 7}}},
    "sha256 short": {"format": 1, "step": 2, "files": {"state.pt": {"size": 1, "sha256": "ab"}}},
    "size str": {"format": 1, "step": 2, "files": {"state.pt": {"size": "1", "sha256": "0" * 64}}},
    "size bool": {"format": 1, "step": 2, "files": {"state.pt": {"size": True, "sha256": "0" * 64}}},
    "size negative": {"format": 1, "step": 2, "files": {"state.pt": {"size": -1, "sha256": "0" * 64}}},
    "size float": {"format": 1, "step": 2, "files": {"state.pt": {"size": 1.5, "sha256": "0" * 64}}},
    "extra key": {"format": 1, "step": 2, "files": {}, "evil": 1},
    "only files": {"files": {}},
    "top-level list": [1, 2, 3],
    "top-level string": "state.pt",
    "null": None,
    "number": 3,
    "format 2": {"format": 2, "step": 2, "files": {}},
    "step string": {"format": 1, "step": "2", "files": {}},
    "step negative": {"format": 1, "step": -2, "files": {}},
    "step of another folder": {"format": 1, "step": 3, "files": {}},
    "step huge": {"format": 1, "step": 10**30, "files": {}},
}
RAW = {
    "deep nesting": "[" * 100000 + "]" * 100000,
    "deep object": '{"a":' * 50000 + "1" + "}" * 50000,
    "NaN": '{"format": 1, "step": NaN, "files": {}}',
    "Infinity size": '{"format": 1, "step": 2, "files": {"state.pt": {"size": Infinity, "sha256": "0"}}}',
    "not utf-8": b"\xff\xfe{\x00",
    "empty": "",
    "truncated": '{"format": 1, "step": 2, "files": {"state',
    "garbage": "{garbage",
}


@pytest.mark.parametrize("name", sorted(MALFORMED) + sorted(RAW))
def test_malformed_manifest_is_corrupted_not_a_crash(run, capsys, name):
    root, newest = run
    _write(newest, RAW[name] if name in RAW else json.dumps(MALFORMED[name]))
    _refused_then_fallback(root, newest, r"manifest\.json is corrupted", capsys)


def test_manifest_that_is_not_a_file(run, capsys):
    root, newest = run
    os.remove(os.path.join(newest, "manifest.json"))
    os.mkdir(os.path.join(newest, "manifest.json"))
    _refused_then_fallback(root, newest, "not a regular file", capsys)


# ------------------------------------------------------------------ item 3: `latest` names one step folder
@pytest.mark.parametrize("pointer", [
    "step_00000045/../../evil/step_00000099", "../evil/step_00000099", "{evil}/step_00000099", "step_00000099",
    "step_2", "step_00000002/", "./step_00000002", "step_00000002\n\n", " step_00000002", "", "\x00",
    "step_00000002/../step_00000001", "x" * 10000,
])
def test_latest_pointer_cannot_leave_the_run_folder(run, tmp_path, capsys, pointer):
    root, _ = run
    evil = tmp_path / "evil"
    _save(evil, 99)  # a complete, valid checkpoint outside the run folder
    (root / "step_00000045").mkdir()
    (root / "latest").write_text(pointer.format(evil=evil))
    step, w = _load(root)
    assert (step, w) == (2, 2.0)  # the newest step folder of the run itself, never step 99
    if pointer.strip() != "step_00000002":
        assert "latest" in capsys.readouterr().err
    assert ck.latest(str(root)) in (None, str(root / "step_00000002"))


def test_latest_that_is_a_link_or_a_folder(run, tmp_path):
    root, _ = run
    evil = tmp_path / "evil"
    _save(evil, 99)
    os.remove(root / "latest")
    os.symlink(evil / "latest", root / "latest")
    assert ck.latest(str(root)) is None and _load(root) == (2, 2.0)
    os.remove(root / "latest")
    os.mkdir(root / "latest")
    assert ck.latest(str(root)) is None and _load(root) == (2, 2.0)


def test_prune_never_follows_a_pointer_out(run, tmp_path):
    root, _ = run
    evil = tmp_path / "evil"
    _save(evil, 99)
    (root / "latest").write_text(f"../{evil.name}/step_00000099")
    ck.prune(str(root), 1)
    assert os.path.isdir(evil / "step_00000099")


# ------------------------------------------------------------------ item 5: the loop state is validated
def _forge(step_dir, **changes):
    """Rewrite ``state.pt`` with ``changes`` (None deletes a key) and a matching manifest, as an attacker
    who can write the folder would."""
    path = os.path.join(step_dir, "state.pt")
    state = torch.load(path, weights_only=True)
    for k, v in changes.items():
        if v is None:
            state.pop(k)
        else:
            state[k] = v
    torch.save(state, path)
    ck.write_manifest(step_dir, int(os.path.basename(step_dir)[5:]))


FORGED = {
    "step 10**9": {"step": 10**9},
    "step -5": {"step": -5},
    "step float": {"step": 2.0},
    "step bool": {"step": True},
    "step tensor": {"step": torch.tensor(2)},
    "no step": {"step": None},
    "format": {"format": 7},
    "data position negative": {"data": {"position": -1}},
    "data position float": {"data": {"position": 1.5}},
    "data list": {"data": [1]},
    "extra list": {"extra": [1]},
    "window of strings": {"extra": {"window": {"loss": "x", "gnorm": "y", "steps": 1}}},
    "window negative steps": {"extra": {"window": {"loss": torch.tensor(1.0), "gnorm": torch.tensor(1.0),
                                                   "steps": -3}}},
    "scheduler list": {"scheduler": [1]},
    "rng missing": {"rng": None},
    "rng empty": {"rng": {}},
    "rng torch wrong size": {"rng": "torch"},
    "rng python out of range": {"rng": "python"},
    "model list": {"model": [1]},
    "model wrong shapes": {"model": {"weight": torch.zeros(2, 2), "bias": torch.zeros(4)}},
    "optimizer empty": {"optimizer": {}},
    "optimizer other groups": {"optimizer": {"state": {}, "param_groups": []}},
    "state is a list": "list",
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_loop_state_is_refused(run, capsys, name):
    root, newest = run
    change = FORGED[name]
    if change == "list":
        torch.save([1, 2], os.path.join(newest, "state.pt"))
        ck.write_manifest(newest, 2)
    else:
        if change.get("rng") in ("torch", "python"):
            state = torch.load(os.path.join(newest, "state.pt"), weights_only=True)
            rng = state["rng"]
            if change["rng"] == "torch":
                rng["torch"] = rng["torch"][:10]
            else:
                rng["python"]["state"] = rng["python"]["state"] + 2**40
            change = {"rng": rng}
        _forge(newest, **change)
    _refused_then_fallback(root, newest, "corrupted|does not fit", capsys)


def test_step_beyond_the_run_does_not_finish_it(run, capsys):
    """A checkpoint claiming a step past the run's number of steps (consistent with its own folder and
    manifest) does not belong to the run: with ``max_step`` it is refused and the previous one is used."""
    root, _ = run
    big = _save(root, 50)
    assert _load(root) == (50, 50.0)  # no limit given: a valid checkpoint
    with pytest.raises(ck.CheckpointError, match=r"does not belong to this run: step 50 is outside \[0, 20\]"):
        _load(big, max_step=20)
    assert _load(root, max_step=20) == (2, 2.0)
    assert "does not belong to this run" in capsys.readouterr().err


def test_training_loop_refuses_a_checkpoint_past_its_steps(tmp_path, capsys):
    """``train`` resumes with ``max_step`` = its number of steps: a checkpoint claiming step 10**6 in its
    state and manifest and folder name is skipped, the run trains from the previous one."""
    from spectrakit.data.batches import TokenBatches
    from spectrakit.models.llama import Llama, LlamaConfig
    from spectrakit.train.loop import TrainConfig, train

    rng = np.random.default_rng(0)
    train_tok, val_tok = rng.integers(0, 16, 4000).astype(np.uint16), rng.integers(0, 16, 400).astype(np.uint16)

    def setup():
        torch.manual_seed(0)
        model = Llama(LlamaConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, max_seq_len=16))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2), TokenBatches(train_tok, 4, 16, seed=0)

    model, opt, data = setup()
    cfg = dict(log_every=2, eval_every=100, eval_tokens=64, progress=False, ckpt_every=2)
    train(model, opt, None, data, val_tok, TrainConfig(steps=4, out_dir=str(tmp_path / "a"), **cfg))
    ckpts = tmp_path / "a" / "checkpoints"
    newest = ck.latest(str(ckpts))
    forged = ckpts / "step_01000000"
    os.rename(newest, forged)
    _forge(str(forged), step=10**6)
    (ckpts / "latest").write_text("step_01000000\n")
    model, opt, data = setup()
    res = train(model, opt, None, data, val_tok, TrainConfig(steps=6, out_dir=str(tmp_path / "a"),
                                                             resume=str(ckpts), **cfg))
    assert "does not belong to this run" in capsys.readouterr().err
    assert res.steps_done == 6
    state = ck.load(str(ckpts), model=setup()[0])
    assert state["step"] == 6  # trained on to 6 from the previous checkpoint, not "finished" at 10**6


def test_fifos_never_block_a_resume(run, capsys):
    """A FIFO (reading it would block forever) as a step folder file or as `latest` is refused unread."""
    root, newest = run
    os.mkfifo(os.path.join(newest, "extra"))
    _refused_then_fallback(root, newest, "not a regular file", capsys)
    os.remove(os.path.join(newest, "extra"))
    os.remove(root / "latest")
    os.mkfifo(root / "latest")
    assert ck.latest(str(root)) is None and _load(root) == (2, 2.0)
