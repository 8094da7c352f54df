"""Every option of every sub-command has help text, shows its default at most once, and the help speaks to
users (no reST markup, no internal document names)."""

import argparse
import re

import pytest

from spectrakit.cli import build_parser

FORBIDDEN = re.compile(r"``|seed 00\d|\bseed's\b|\bseed\s*§|\bSPEC\b|this session|\bissue\b|helper", re.IGNORECASE)


def _parsers(parser, prog="spectrakit"):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


PARSERS = list(_parsers(build_parser()))


def test_all_commands_found():
    names = {p for p, _ in PARSERS}
    assert {"spectrakit compare", "spectrakit ops", "spectrakit experiment xor-transfer",
            "spectrakit data prepare"} <= names


@pytest.mark.parametrize("prog,parser", PARSERS, ids=[p for p, _ in PARSERS])
def test_help_text(prog, parser):
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._VersionAction | argparse._SubParsersAction):
            continue
        assert action.help, f"{prog} {'/'.join(action.option_strings) or action.dest}: no help text"
    text = parser.format_help()
    assert not FORBIDDEN.search(text), f"{prog}: {FORBIDDEN.search(text).group(0)!r} in --help"
    # each option's paragraph names its default at most once
    for block in re.split(r"\n  (?=-)", text):
        assert block.count("(default") <= 1, f"{prog}: default shown twice in {block!r}"
