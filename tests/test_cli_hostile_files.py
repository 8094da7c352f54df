"""``report`` and ``plot`` read only regular files of bounded size (a link to ``/dev/zero`` or a FIFO is
refused at once, never read until memory runs out or waited on forever), and ``report --into`` replaces its
target atomically: a write that fails (a file-size limit, a full disk) leaves the file whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spectrakit._files import MAX_JSON_BYTES, read_regular, write_atomic
from spectrakit.cli import main

RESULTS = {"name": "x", "env": {"device": "cpu", "torch": "2", "date": "today"}, "rows": [{"a": 1, "b": 2.5}]}


def _one_error(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err


@pytest.mark.parametrize("kind", ["dev-zero link", "fifo", "folder", "too large"])
def test_report_refuses_what_is_not_a_regular_file_of_sane_size(tmp_path, capsys, kind):
    path = tmp_path / "results.json"
    if kind == "dev-zero link":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(MAX_JSON_BYTES + 1)  # sparse: no disk used
    assert main(["report", str(path)]) == 2
    _one_error(capsys, str(path), "64 MiB" if kind == "too large" else "not a regular file")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(RESULTS))
    assert main(["report", str(good), "--into", str(path)]) == 2
    capsys.readouterr()


def test_plot_refuses_a_log_that_is_not_a_regular_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "metrics.jsonl")
    assert main(["plot", str(run)]) == 2
    _one_error(capsys, "metrics.jsonl")


def test_report_into_is_atomic_under_a_file_size_limit(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({**RESULTS, "rows": [{"a": i, "text": "x" * 200} for i in range(200)]}))
    readme = tmp_path / "README.md"
    original = "# title\n\n<!-- results:t -->\nold\n<!-- /results:t -->\n" + "padding line\n" * 2000
    readme.write_text(original)
    assert len(original) > 24_000
    code = ("import sys, resource; resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192)); "
            "from spectrakit.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "report", str(results), "--into", str(readme), "--name", "t"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert readme.read_text() == original  # whole, not cut at 8 192 bytes
    assert sorted(os.listdir(tmp_path)) == ["README.md", "results.json"]  # no temporary file left
    assert main(["report", str(results), "--into", str(readme), "--name", "t"]) == 0
    assert "| a |" in readme.read_text() and readme.read_text().endswith("padding line\n")


def test_write_atomic_replaces_a_link_instead_of_writing_through_it(tmp_path):
    target = tmp_path / "target"
    target.write_text("theirs")
    os.symlink(target, tmp_path / "out.json")
    write_atomic(str(tmp_path / "out.json"), "ours")
    assert target.read_text() == "theirs"
    assert not os.path.islink(tmp_path / "out.json") and (tmp_path / "out.json").read_text() == "ours"
    with pytest.raises(ValueError, match="not a regular file"):
        read_regular("/dev/zero")
