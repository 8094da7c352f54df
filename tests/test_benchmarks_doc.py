"""docs/BENCHMARKS.md holds the current figures (at most 400 lines, nothing superseded); the maintained
benchmarks write their latest raw output into ``docs/results/bench/KEY.md`` through
``benchmarks/_common.write_section(key, text)``, which replaces everything between ``<!-- bench:KEY:start -->``
and ``<!-- bench:KEY:end -->`` and nothing else."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "BENCHMARKS.md"
BENCH = ROOT / "docs" / "results" / "bench"
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


def _write_section():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _common import write_section
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return write_section


def test_the_page_is_short_and_every_raw_output_is_one_block_of_its_key():
    assert len(DOC.read_text(encoding="utf-8").splitlines()) <= 400
    files = sorted(BENCH.glob("*.md"))
    assert len(files) >= 10
    for f in files:
        blocks = _blocks(f.read_text(encoding="utf-8").splitlines())
        assert [b[0] for b in blocks] == [f.stem], f


def test_rewriting_a_block_keeps_the_rest(tmp_path):
    """``write_section`` into a file with several blocks changes that block only: every other line stays."""
    write_section = _write_section()
    text = "# notes\n\n" + "".join(f.read_text(encoding="utf-8") + "\nhand-written line\n"
                                      for f in sorted(BENCH.glob("*.md"))[:4])
    lines = text.splitlines()
    copy = tmp_path / "page.md"
    for key, start, end in _blocks(lines):
        copy.write_text(text, encoding="utf-8")
        write_section(key, "NEW", path=str(copy))
        assert copy.read_text(encoding="utf-8").splitlines() == lines[:start + 1] + ["NEW"] + lines[end:], key


def test_the_default_target_is_the_benchmarks_raw_output(tmp_path, monkeypatch):
    _write_section()  # (imports benchmarks/_common.py)
    _common = sys.modules["_common"]
    monkeypatch.setattr(_common, "RESULTS_BENCH", str(tmp_path / "bench"))
    _common.write_section("x-cpu", "table")
    assert (tmp_path / "bench" / "x-cpu.md").read_text() == "# Benchmarks\n\n<!-- bench:x-cpu:start -->\ntable\n" \
        "<!-- bench:x-cpu:end -->\n"


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
