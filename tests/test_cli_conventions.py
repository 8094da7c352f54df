"""One convention across the command line: comma-separated lists (the space-separated spelling still parses),
--steps everywhere (--max-steps a hidden alias), no --threads where nothing is computed, help text without
reST roles, paper-internal labels or descriptions cut mid-sentence."""

from __future__ import annotations

import argparse
import re

import pytest

from spectrakit.cli import build_parser


def _leaves(parser, path=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for a in subs:
        for name, p in a.choices.items():
            yield from _leaves(p, (*path, name))


PARSER = build_parser()
LEAVES = dict(_leaves(PARSER))


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_help_is_plain_and_lists_are_comma_separated(path):
    text = LEAVES[path].format_help()
    assert not re.search(r":[a-z]+:`|``|Problem \(\d|Rule \(\d|Theorem \d", text), text
    if path != ("plot",):  # plot's run folders are positional paths
        assert not re.search(r"\[[A-Z][A-Z0-9_-]* \.\.\.\]", text), text  # no "--x X [X ...]" lists
    for a in LEAVES[path]._actions:
        if a.option_strings and a.nargs in ("+", "*"):
            assert "comma-separated" in a.help, (path, a.option_strings)
    assert "--max-steps" not in text and "--D2s" not in text and "--bs " not in text
    has_threads = "--threads" in text
    assert has_threads == (path not in (("report",), ("plot",), ("data", "list"))), path


def test_experiment_summaries_are_whole_sentences():
    exp = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices["experiment"]
    choices = next(a for a in exp._actions if isinstance(a, argparse._SubParsersAction))._choices_actions
    assert len(choices) >= 6
    for c in choices:
        assert c.help.endswith("."), c.help
        assert c.help.count("(") == c.help.count(")"), c.help


@pytest.mark.parametrize("new,old,dest,want", [
    (["--seeds", "0,1"], ["--seeds", "0", "1"], "seeds", [0, 1]),
    (["--steps", "7"], ["--max-steps", "7"], "max_steps", 7),
    (["--dualizers", "naive,pdhg"], ["--dualizers", "naive", "pdhg"], "dualizers", ["naive", "pdhg"]),
])
def test_grokking_new_and_old_spellings(new, old, dest, want):
    for argv in (new, old):
        args = PARSER.parse_args(["experiment", "grokking", *argv])
        assert getattr(args, dest) == want, argv


def test_lists_and_renamed_flags_elsewhere():
    a = PARSER.parse_args(["experiment", "spike-noise", "--lrs", "0.5,1"])
    assert a.lrs == [0.5, 1.0]
    a = PARSER.parse_args(["experiment", "fw-logistic", "--b-values", "0.1,1", "--radii", "2"])
    b = PARSER.parse_args(["experiment", "fw-logistic", "--bs", "0.1", "1", "--D2s", "2"])
    assert a.bs == b.bs == [0.1, 1.0] and a.D2s == b.D2s == [2.0]
    a = PARSER.parse_args(["experiment", "xor-transfer", "--seeds", "3,4", "--widths", "8,16"])
    assert a.seeds == [3, 4] and a.widths == [8, 16]


@pytest.mark.parametrize("argv", [["experiment", "grokking", "--seeds", "a"],
                                  ["experiment", "grokking", "--dualizers", "naive,nope"],
                                  ["experiment", "spike-noise", "--lrs", ","]])
def test_bad_list_is_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        PARSER.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: ")


def test_compare_help_explains_columns_and_c():
    text = " ".join(LEAVES[("compare",)].format_help().split())
    for word in ("agg_linf (largest absolute weight entry", "max_update_sn (largest spectral norm",
                 "s / sqrt(1 + s^2/c^2)"):
        assert word in text, word


def test_compare_takes_the_old_step_spelling():
    """The README says old spellings still parse: ``compare --max-steps`` is ``--steps`` (hidden in --help)."""
    assert PARSER.parse_args(["compare", "--max-steps", "7"]).steps == 7
    assert "--max-steps" not in LEAVES[("compare",)].format_help()


@pytest.mark.parametrize("argv,words", [
    (["gpu-suite", "--stage", "linalg,,optim"], "empty item"),
    (["gpu-suite", "--stage", "linalg,nope"], "unknown name(s) nope"),
    (["compare", "--seeds", "0,,1"], "empty item"),
    (["compare", "--seeds", "0,"], "empty item"),
    (["compare", "--optimizers", "adamw,,muon"], "empty item"),
    (["lipschitz", "--input-shape", "3,x,32"], "--input-shape: expected whole numbers >= 1"),
    (["lipschitz", "--input-shape", "3,0,32"], "--input-shape: expected whole numbers >= 1"),
    (["ops", "--reps", "0"], "--reps: expected a whole number >= 1"),
])
def test_bad_values_are_one_line_and_status_2(argv, words, capsys):
    from spectrakit.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_gpu_suite_stages_as_a_comma_list_or_repeated():
    one = PARSER.parse_args(["gpu-suite", "--stage", "linalg,optim"]).stage
    two = PARSER.parse_args(["gpu-suite", "--stage", "linalg", "--stage", "optim"]).stage
    assert [s for names in one for s in names] == [s for names in two for s in names] == ["linalg", "optim"]
