"""Every sub-command, walked with bad arguments and missing or foreign files: the answer is one line
``error: ...`` on stderr and exit status 2 (a user error) or 1 (a failure other arguments would not fix), never a
traceback. In-process (``spectrakit.cli.main``) for speed."""

from __future__ import annotations

import json
import os

import pytest
import torch

from spectrakit.cli import COMMANDS, main


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse errors exit from the parser
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Foreign and broken inputs: what a user may point a command at by mistake."""
    d = tmp_path_factory.mktemp("files")
    (d / "empty").mkdir()
    (d / "garbage.pt").write_bytes(b"not a torch file")
    (d / "notjson.json").write_text("{ nope")
    (d / "list.json").write_text("[1, 2]")
    # one run's result.json of `compare` (a row, not a results table)
    (d / "result.json").write_text(json.dumps({"optimizer": "adamw", "seed": 0, "val_loss": 4.6}))
    # a language model's state_dict, and a checkpoint folder holding it (as compare writes them)
    lm = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
    torch.save(lm.state_dict(), d / "lm.pt")
    from spectrakit.train.checkpoint import save_checkpoint

    save_checkpoint(str(d / "ckpt"), model=lm, optimizer=torch.optim.AdamW(lm.parameters()), step=2)
    return d


# (argv with {d} for the files folder, exit status, words the one line must contain)
TABLE = [
    (["compare", "--tokenizer", "bpe"], 2, ["--tokenizer", "bpeN"]),
    (["compare", "--tokenizer", "bpe12"], 2, ["--tokenizer"]),
    (["compare", "--resume", "--out", "{d}/new_out"], 2, ["--resume", "without --resume"]),
    (["sweep", "--lrs", "abc"], 2, ["--lrs"]),
    (["ops", "--dtypes", "fp16"], 2, ["--dtypes", "fp32"]),
    (["ops", "--shapes", "3"], 2, ["--shapes"]),
    (["ops", "--shapes", "1x8"], 2, ["--shapes", ">= 2"]),
    (["experiment", "conv-regularization", "--root", "{d}/empty", "--out", "{d}/o"], 2, ["--root"]),
    (["lipschitz", "--checkpoint", "{d}/missing.pt"], 2, ["--checkpoint"]),
    (["lipschitz", "--checkpoint", "{d}/garbage.pt"], 2, ["--checkpoint"]),
    (["lipschitz", "--checkpoint", "{d}/lm.pt"], 2, ["--checkpoint", "--model"]),
    (["lipschitz", "--checkpoint", "{d}/ckpt"], 2, ["--checkpoint", "--model"]),
    (["lipschitz", "--checkpoint", "{d}/ckpt/step_00000002"], 2, ["--checkpoint", "--model"]),
    (["lipschitz", "--checkpoint", "{d}/empty"], 2, ["--checkpoint"]),
    (["data", "prepare", "nonexistent"], 2, ["nonexistent"]),
    (["data", "prepare", "stdlib", "--tokenizer", "bpe"], 2, ["--tokenizer"]),
    (["plot", "{d}/nonexistent"], 2, ["nonexistent", "not a folder"]),
    (["plot", "{d}/empty"], 2, ["metrics.jsonl"]),
    (["report", "{d}/missing.json"], 2, ["missing.json"]),
    (["report", "{d}/notjson.json"], 2, ["JSON"]),
    (["report", "{d}/list.json"], 2, ["results table"]),
    (["report", "{d}/result.json"], 2, ["results table", "results.json"]),
    (["experiment", "grokking", "--steps", "0"], 2, ["--steps"]),
    (["experiment", "xor-transfer", "--seeds", "a"], 2, ["--seeds"]),
    (["experiment", "spike-noise", "--lrs", "x"], 2, ["--lrs"]),
    (["gpu-suite", "--stage", "nonexistent"], 2, ["--stage"]),
    (["gpu-suite", "--device", "cuda:99"], 2, ["--device"]),
    (["nonexistent-command"], 2, ["nonexistent-command"]),
]


@pytest.mark.parametrize("argv,code,words", TABLE, ids=[" ".join(a) for a, _, _ in TABLE])
def test_one_error_line(argv, code, words, files, capsys):
    got, err = _run([a.replace("{d}", str(files)) for a in argv], capsys)
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert got == code, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_table_walks_every_command():
    assert {a[0] for a, _, _ in TABLE} >= set(COMMANDS)


def test_unexpected_failure_is_one_line_exit_1(capsys, monkeypatch):
    import spectrakit.commands.report as rt

    def boom(args):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(rt, "run", boom)
    code, err = _run(["report", "x.json"], capsys)
    assert code == 1 and err.strip().splitlines() == [
        "error: RuntimeError: something broke (unexpected; SPECTRAKIT_DEBUG=1 shows where)"]
    monkeypatch.setenv("SPECTRAKIT_DEBUG", "1")
    with pytest.raises(RuntimeError, match="something broke"):
        main(["report", "x.json"])


def test_resume_with_every_checkpoint_corrupted_is_one_line_exit_1(tmp_path, capsys, monkeypatch, corpus_cache):
    monkeypatch.setenv("SPECTRAKIT_CACHE", corpus_cache)
    from matplotlib.figure import Figure

    # the comparison's figures are built but not rendered (about 2 s of CPU; test_compare.py renders them)
    monkeypatch.setattr(Figure, "tight_layout", lambda self, *a, **k: None)
    monkeypatch.setattr(Figure, "savefig", lambda self, fname, *a, **k: open(fname, "wb").close())
    args = ["compare", "--optimizers", "adamw", "--preset", "nano", "--tokenizer", "bytes", "--steps", "4",
            "--batch-size", "2", "--seq-len", "8", "--eval-every", "2", "--eval-tokens", "32", "--ckpt-every", "2",
            "--quiet", "--threads", "1", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    ckpts = tmp_path / "out" / "adamw-s0" / "checkpoints"
    os.remove(tmp_path / "out" / "adamw-s0" / "result.json")  # unfinished: resumed from its checkpoints
    steps = [p for p in ckpts.iterdir() if p.name.startswith("step_")]
    assert steps
    for p in steps:
        (p / "state.pt").write_bytes(b"corrupted")
    code, err = _run([*args, "--resume"], capsys)
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning: ")]
    assert "Traceback" not in err and code == 1, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "checkpoint" in lines[0], err
