"""Plain progress lines when stderr is not a terminal (CI logs, pipes)."""

import io
import re

from spectrakit.experiments import compare as cmp
from spectrakit.train.progress import ProgressLines

LINE = re.compile(r"^\[(?P<desc>[^\]]+)\] step (?P<k>\d+)/(?P<n>\d+) loss \d+\.\d{3} [\d.]+[kM]? tok/s eta \S+$")


def test_lines_every_tenth_and_at_the_end():
    out = io.StringIO()
    p = ProgressLines("adamw s0", 200, stream=out, interval=1e9)
    for step in range(1, 201):
        p.update(step, 5.0, 3100.0)
    lines = out.getvalue().splitlines()
    assert [int(LINE.match(x)["k"]) for x in lines] == list(range(20, 201, 20))
    assert "3.1k tok/s" in lines[0]


def test_time_interval_forces_a_line():
    out = io.StringIO()
    p = ProgressLines("x", 1000, stream=out, interval=0.0)
    p.update(1, 1.0, 10.0)
    p.update(2, 1.0, 10.0)
    assert len(out.getvalue().splitlines()) == 2


def test_resumed_run_counts_from_its_start():
    out = io.StringIO()
    p = ProgressLines("x", 100, start=50, stream=out, interval=1e9)
    for step in range(51, 101):
        p.update(step, 1.0, 10.0)
    assert [int(LINE.match(x)["k"]) for x in out.getvalue().splitlines()] == [60, 70, 80, 90, 100]


def test_compare_prints_plain_lines_when_not_a_tty(tmp_path, tmp_path_factory, capsys, monkeypatch, one_thread):
    # the tokenised corpus is shared with the other tests of the session (tests/experiments use the same cache)
    monkeypatch.setenv("SPECTRAKIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    # the nano model, diagnostics at the end only: the lines are the loop's, not the model's
    cmp.compare(optimizers=("adamw",), setting="cpu", preset="nano", tokenizer="bytes", steps=20, batch_size=2,
                seq_len=16, warmup=2, eval_every=10, eval_tokens=64, diag_every=20, out=str(tmp_path / "run"),
                progress=True)
    err = capsys.readouterr().err  # captured: not a TTY
    lines = [x for x in err.splitlines() if x.startswith("[adamw s0]")]
    assert lines and all(LINE.match(x) for x in lines), err
    assert lines[-1].startswith("[adamw s0] step 20/20 ")
