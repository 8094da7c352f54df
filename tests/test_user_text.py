"""The text users read (README, CHANGELOG, docs, examples, benchmark scripts, docstrings and messages of the
package) cites papers by authors and year and never names internal planning documents ("seed 000",
"SPEC", issue numbers, "this session")."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
INTERNAL = re.compile(
    r"seed 00\d|\bseed\s*§|\bseed's\b|\bseed A\d|\bseed table|\bthe seed\b(?![- ](?:spread|to-seed|\d))"
    r"|this session|\bissue\s*#?\d|\bthe issue's\b",
    re.IGNORECASE,
)
SPEC = re.compile(r"\bSPEC\b")
FILES = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    + [p for pattern in ("docs/*.md", "examples/*.py", "benchmarks/*.py", "scripts/*", "spectrakit/**/*.py")
       for p in ROOT.glob(pattern)]
)


def test_pattern_catches_internal_words():
    for bad in ("seed 000 §3.1", "(seed §6.2)", "the seed's baseline", "seed A1.2", "as in the seed.",
                "issue 7", "issue #3", "the issue's shapes", "this session"):
        assert INTERNAL.search(bad), bad
    for good in ("the seed spread", "seed-to-seed spread", "the seed-1 runs", "--seeds 0,1,2", "seed 0"):
        assert not INTERNAL.search(good), good
    assert SPEC.search("see SPEC §5") and not SPEC.search("spec = OPTIMIZERS[name]")


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_no_internal_words(path):
    if not path.exists():
        pytest.skip(f"{path.name} not present")
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = INTERNAL.search(line) or SPEC.search(line)
        assert m is None, f"{path.relative_to(ROOT)}:{i}: {m.group(0)!r} in {line.strip()!r}"
