"""Every user error of the command line is one line ``error: ...`` on stderr with exit status 2, found
before any training or data loading, and never a traceback."""

import argparse
import os
import subprocess
import sys

import pytest
import torch

from spectrakit.cli import main
from spectrakit.data.corpora import CorpusUnavailableError, corpus_files
from spectrakit.experiments.compare import CompareOptions


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse errors exit from the parser
        code = e.code
    err = capsys.readouterr().err
    return code, err


CASES = [
    (["compare", "--optimizers", "adamw,spectra-adamv"], ["--optimizers", "spectra-adamv", "spectra-adamw"]),
    (["compare", "--optimizers", ""], ["--optimizers", "at least one"]),
    (["compare", "--steps", "-5"], ["--steps", ">= 1"]),
    (["compare", "--steps", "ten"], ["--steps"]),
    (["compare", "--corpus", "nonexistent"], ["--corpus", "stdlib"]),
    (["compare", "--seeds", "a"], ["--seeds"]),
    (["compare", "--seeds", ","], ["--seeds"]),
    (["compare", "--lr", "inf"], ["--lr", "finite"]),
    (["compare", "--lr", "nan"], ["--lr", "finite"]),
    (["compare", "--grad-clip", "nan"], ["--grad-clip", "finite"]),
    (["compare", "--c=-inf"], ["--c", "finite"]),
    (["compare", "--warmup", "500", "--steps", "100"], ["warmup", "[0, 100]"]),
    (["compare", "--schedule", "bogus"], ["--schedule"]),
    (["ops", "--reps", "x"], ["--reps"]),
    (["experiment", "grokking", "--lr", "inf"], ["--lr"]),
    (["experiment", "nope"], ["nope"]),
    (["compare", "--threads", "100000"], ["--threads", "cores"]),
    (["ops", "--threads", "0"], ["--threads", ">= 1"]),
    (["experiment", "spike-noise", "--rank", "1000", "--steps", "1"], ["rank", "[1, 50]", "1000"]),
    # settings that cannot fit the machine: refused with the estimate, before any training
    (["compare", "--tokenizer", "bytes", "--seq-len", "100000", "--quiet"], ["GB of memory", "--seq-len",
                                                                              "--no-resource-check"]),
    (["compare", "--tokenizer", "bytes", "--steps", "100000000", "--quiet"], ["more than 24 h", "--steps",
                                                                              "--no-resource-check"]),
    (["compare", "--tokenizer", "bytes", "--eval-tokens", "1000000000000", "--quiet"],
     ["--eval-tokens", "validation split"]),
]


@pytest.mark.parametrize("argv,words", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_user_error_one_line(argv, words, capsys, tmp_path):
    code, err = _run([*argv, "--out", str(tmp_path / "o")] if argv[0] == "compare" else argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("argv", [["compare", "--device", "cuda"], ["ops", "--device", "cuda:0"],
                                  ["experiment", "conv-bounds", "--device", "cuda"]])
def test_device_without_cuda(argv, capsys):
    code, err = _run(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "CUDA is not available" in err and "--device cpu" in err


def test_device_names():
    """``--device``: auto and cpu are accepted without asking torch; any other name is parsed by torch and must
    be a CPU or CUDA device."""
    from spectrakit._cliargs import device_name

    assert [device_name(t) for t in ("auto", "cpu", "cpu:0")] == ["auto", "cpu", "cpu:0"]
    for bad in ("meta", "gpu", "cuda:x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected cpu, cuda or cuda:N"):
            device_name(bad)


def test_unwritable_out_checked_before_work(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the folder should go: cannot be created
    import spectrakit.experiments.compare as cmp

    monkeypatch.setattr(cmp, "compare", lambda **kw: pytest.fail("work started before the --out check"))
    code, err = _run(["compare", "--out", str(blocker / "sub")], capsys)
    assert code == 2 and err.startswith("error: --out") and len(err.strip().splitlines()) == 1


def test_missing_corpus_is_one_line(capsys, tmp_path):
    try:
        corpus_files("gcide")
        pytest.skip("dict-gcide is installed here")
    except CorpusUnavailableError:
        pass
    code, err = _run(["compare", "--corpus", "gcide", "--steps", "2", "--out", str(tmp_path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "apt-get install" in err


def test_missing_fashion_mnist_is_one_line(capsys, tmp_path):
    code, err = _run(["experiment", "conv-regularization", "--root", str(tmp_path / "none"),
                      "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "dataset-fashion-mnist" in err


def test_short_run_scales_warmup():
    assert CompareOptions(steps=10, setting="cpu").resolved()["warmup"] == 1
    assert CompareOptions(steps=100, setting="cpu").resolved()["warmup"] == 10
    assert CompareOptions(setting="cpu").resolved()["warmup"] == 20
    assert CompareOptions(steps=1000, setting="cpu").resolved()["warmup"] == 20
    assert CompareOptions(steps=10, warmup=5, setting="cpu").resolved()["warmup"] == 5


def _spectrakit_process(*argv):
    """``python -m spectrakit ARGV`` in a fresh interpreter with ``-X importtime``: returns the exit status,
    stdout, the stderr lines that are not import times, and the names of the modules it imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "spectrakit", *argv], capture_output=True,
                       text=True, env=env, timeout=120)
    lines = r.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    return r.returncode, r.stdout, [line for line in lines if not line.startswith("import time:")], imported


def test_subprocess_no_traceback():
    """A real process: a user error is one line on stderr with exit status 2, no traceback; and an argument
    error of a command, like ``spectrakit --help``, is answered without importing torch (about 4 s here)."""
    code, out, err, imported = _spectrakit_process("gpu-suite", "--budget", "0")
    assert code == 2 and out == "" and "Traceback" not in "\n".join(err)
    assert len(err) == 1 and err[0].startswith("error: spectrakit gpu-suite: argument --budget: "), err
    # (importtime lists the modules imported by import statements: the command's modules, and torch wherever
    # an import statement of any module would load it)
    assert "spectrakit.experiments.gpu_suite" in imported and "torch" not in imported
    code, out, err, imported = _spectrakit_process("--help")
    assert code == 0 and err == [] and "usage: spectrakit" in out
    assert all(f"\n    {name}" in out for name in ("compare", "experiment", "gpu-suite", "report"))
    assert "spectrakit.cli" in imported and not any(m == "torch" or m.startswith("torch.") for m in imported)
