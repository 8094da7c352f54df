"""What a newcomer reads stays short: the README fits in 150 lines and no module of the package is over 700
lines (a module longer than that is split along its seams, as ``optim/spectra.py`` was into ``verdict``,
``batching``, ``hyperparams`` and ``state_io``)."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = sorted((ROOT / "spectrakit").rglob("*.py"))


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, len(lines)


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(ROOT)) for p in MODULES])
def test_module_is_at_most_700_lines(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= 700, f"{path.relative_to(ROOT)}: {n} lines"


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(ROOT)) for p in MODULES])
def test_module_docstring_is_at_most_20_lines(path):
    """A module says what it is in <= 20 lines; implementation narratives live in docs or in comments."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert len(doc.splitlines()) <= 20, f"{path.relative_to(ROOT)}: {len(doc.splitlines())} lines"


DOCS = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_doc_page_is_at_most_400_lines(path):
    """Each page of docs/ is reference first and short; dated records live in docs/results/."""
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= 400, f"{path.name}: {n} lines"
