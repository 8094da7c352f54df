"""docs/BENCHMARKS.md keeps its hand-written sections out of the blocks that the benchmark scripts rewrite.

``benchmarks/_common.write_section(key, text)`` replaces everything between ``<!-- bench:KEY:start -->`` and
``<!-- bench:KEY:end -->``: a section written by hand inside such a block would be lost the next time that
benchmark runs with its default (writing) output."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "BENCHMARKS.md"
MARK = re.compile(r"<!-- bench:(.+?):(start|end) -->")


def _blocks(lines: list[str]) -> list[tuple[str, int, int]]:
    """``(key, start line, end line)`` of every block (0-based indices); AssertionError if blocks nest, a
    start has no end or an end no start."""
    out, open_key, open_at = [], None, None
    for i, line in enumerate(lines):
        m = MARK.fullmatch(line.strip())
        if not m:
            continue
        key, kind = m.groups()
        if kind == "start":
            assert open_key is None, f"line {i + 1}: block {key!r} starts inside block {open_key!r}"
            open_key, open_at = key, i
        else:
            assert open_key == key, f"line {i + 1}: end of {key!r} while {open_key!r} is open"
            out.append((key, open_at, i))
            open_key = None
    assert open_key is None, f"block {open_key!r} has no end"
    return out


def test_blocks_are_flat_and_closed():
    assert len(_blocks(DOC.read_text(encoding="utf-8").splitlines())) >= 10


def test_no_hand_written_section_inside_a_block():
    """A level-2 heading (a hand-written section) may only open a block, never follow inside it."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    for key, start, end in _blocks(lines):
        inner = [i for i in range(start + 2, end) if lines[i].startswith("## ")]
        assert not inner, f"block {key!r} (line {start + 1}) holds {lines[inner[0]]!r} (line {inner[0] + 1})"


def test_rewriting_a_block_keeps_the_rest(tmp_path):
    """Rewriting each block with ``write_section`` changes that block only: every other line stays."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _common import write_section
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    text = DOC.read_text(encoding="utf-8")
    lines = text.splitlines()
    copy = tmp_path / "BENCHMARKS.md"
    for key, start, end in _blocks(lines):
        copy.write_text(text, encoding="utf-8")
        write_section(key, "NEW", path=str(copy))
        assert copy.read_text(encoding="utf-8").splitlines() == lines[:start + 1] + ["NEW"] + lines[end:], key


def test_at_most_ten_maintained_benchmarks_each_in_the_readme():
    """benchmarks/ keeps at most 10 maintained ``bench_*.py`` scripts, every one (and every study of
    ``benchmarks/studies/``) listed in benchmarks/README.md; no scripts among the dated raw outputs."""
    bench = sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))
    studies = sorted(p.name for p in (ROOT / "benchmarks" / "studies").glob("*.py"))
    readme = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert len(bench) <= 10, bench
    for name in bench + studies:
        assert f"`{name}`" in readme, name
    stray = [p for p in (ROOT / "docs" / "results").rglob("*") if p.suffix in (".py", ".sh")]
    assert not stray, stray
