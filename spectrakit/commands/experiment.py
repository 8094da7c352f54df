"""Run one of the paper experiments: prints its result table and writes JSON (and plots) under --out."""

from __future__ import annotations

import argparse
import functools
import importlib

from spectrakit.experiments import EXPERIMENTS


def _first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line (not cut at "Fig." or "et al.")."""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    for i, ch in enumerate(text):
        end = i + 1 == len(text) or text[i + 1] == " "
        if ch == "." and end and not text[:i].endswith(("Fig", "al", "e.g", "i.e", "Eq")):
            return text[: i + 1]
    return text


def _docstring(module: str) -> str:
    """The docstring of ``module``, read from its source without importing it (which would import torch)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    with open(spec.origin, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def add_arguments(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> None:
    """The experiments as sub-commands. With ``argv`` (a run of the command line) only the experiment it names
    is imported and gets its options; the others are listed with their first sentence (no torch import)."""
    sub = parser.add_subparsers(dest="experiment", metavar="NAME", required=True)
    words = [a for a in (argv or []) if not a.startswith("-")]
    chosen = words[1] if argv is not None and len(words) > 1 and words[0] == "experiment" else None
    from spectrakit.experiments import options  # (no torch: the experiments' own modules wait for the run)

    for name, module in EXPERIMENTS.items():
        doc = _docstring(module) or name
        if argv is not None and name != chosen:
            sub.add_parser(name, help=_first_sentence(doc))
            continue
        p = sub.add_parser(name, help=_first_sentence(doc), description=doc.strip(),
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        p.add_argument("--out", default=f"runs/{name}", help="folder for results.json, results.md and plots")
        getattr(options, module.rsplit(".", 1)[1])(p)
        p.set_defaults(_experiment_main=functools.partial(_main, module))


def _main(module: str, args: argparse.Namespace) -> int:
    return importlib.import_module(module).main(args)


def run(args: argparse.Namespace) -> int:
    return int(args._experiment_main(args) or 0)
