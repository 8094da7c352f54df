"""Result-table helpers: the reported command is the command that actually ran."""

import sys

from spectrakit.experiments.io import invocation, markdown_table


def test_invocation_reports_the_real_command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/spectrakit", "experiment", "conv-bounds", "--channels", "256,512",
                                      "--exact-iters", "60", "--out", "my dir"])
    assert invocation("experiment", "fallback") == (
        "spectrakit experiment conv-bounds --channels 256,512 --exact-iters 60 --out 'my dir'")
    monkeypatch.setattr(sys, "argv", ["pytest", "-q"])
    assert invocation("experiment", "fallback") == "fallback"


def test_markdown_table_formats_numbers():
    text = markdown_table([{"a": 1.23456, "b": 1e-5, "c": True}])
    assert text.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1.235 | 1.000e-05 | True |"]
