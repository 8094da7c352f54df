"""The ``spectrakit ops`` command: every function appears and meets its accuracy on random input."""

import argparse

import torch

from spectrakit.commands import ops
from spectrakit.linalg import report


def test_rows_cover_all_functions_and_are_accurate():
    rows = report.rows_for(24, 40, torch.device("cpu"), [torch.float32], reps=1)
    names = {r["function"] for r in rows}
    assert names == {"msign", "soft_clip polar", "soft_clip newton_schulz", "spectral_hardcap",
                     "spectral_clip", "spectral_norm", "eig_clip", "eig_stepfun", "proj_psd"}
    for r in rows:
        assert r["time_ms"] > 0 and r["exact_ms"] > 0
        if r["input"] == "random" and r["function"] != "spectral_norm":
            assert r["rel_err"] < 1e-3, r
        if r["function"] == "soft_clip polar":
            assert r["rel_err"] < 1e-3, r  # also beside the 1e3 spike


def test_cli_runs_and_saves(tmp_path, capsys):
    p = argparse.ArgumentParser()
    ops.add_arguments(p)
    args = p.parse_args(["--shapes", "16x20", "--dtypes", "fp32,bf16", "--reps", "1", "--out", str(tmp_path)])
    assert ops.run(args) == 0
    out = capsys.readouterr().out
    assert "soft_clip polar" in out and "bfloat16" in out
    assert (tmp_path / "results.json").exists()


def test_verdicts():
    assert report.verdict("msign", "random", "float32", 1e-5).startswith("ok")
    assert report.verdict("msign", "random", "float32", 2e-3).startswith("OUTSIDE")
    assert report.verdict("msign", "random", "bfloat16", 2e-2).startswith("ok")
    assert report.verdict("soft_clip newton_schulz", "ill-cond", "float32", 0.3).startswith("expected")
    assert report.verdict("soft_clip newton_schulz", "random", "float32", 0.3).startswith("OUTSIDE")


def test_ops_prints_rows_as_they_come(capsys, tmp_path):
    from spectrakit.cli import main

    assert main(["ops", "--shapes", "16x24", "--dtypes", "fp32", "--reps", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [x for x in out.splitlines() if x.startswith("| ") and "| function |" not in x]
    assert len(rows) == 18 and all("ok (<=" in x or "expected:" in x for x in rows), out
    assert "within the documented accuracy" in out and (tmp_path / "results.json").exists()
