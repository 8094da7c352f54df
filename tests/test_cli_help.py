"""Every option of every sub-command has help text, shows its default at most once, and the help speaks to
users (no reST markup, no internal document names)."""

import argparse
import pathlib
import re

import pytest

from spectrakit.cli import build_parser

# beyond the internal names that no user-facing text may contain (tests/test_user_text.py): reST markup and
# words about our own process
FORBIDDEN = re.compile(r"``|\bissue\b|helper", re.IGNORECASE)


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
def test_help_text(prog, parser, load_module):
    rules = load_module("test_user_text", str(pathlib.Path(__file__).with_name("test_user_text.py")))
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._VersionAction | argparse._SubParsersAction):
            continue
        assert action.help, f"{prog} {'/'.join(action.option_strings) or action.dest}: no help text"
    text = parser.format_help()
    for pattern in (FORBIDDEN, rules.INTERNAL, rules.SPEC):
        m = pattern.search(text)
        assert m is None, f"{prog}: {m.group(0)!r} in --help"
    # each option's paragraph names its default at most once
    for block in re.split(r"\n  (?=-)", text):
        assert block.count("(default") <= 1, f"{prog}: default shown twice in {block!r}"
