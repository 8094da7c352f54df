"""Print the result table of a results.json, or write it into a markdown file between marker comments.

`spectrakit report runs/compare/results.json` prints the table; `--into README.md` replaces the text between
`<!-- results:NAME -->` and `<!-- /results:NAME -->` in that file (NAME: --name, default the results folder's
name, e.g. compare), so README and docs tables come from one results.json and cannot drift.
"""

from __future__ import annotations

import argparse
import json
import os
import re

from spectrakit._cliargs import UsageError
from spectrakit._files import read_regular, write_atomic
from spectrakit._tables import markdown_table


def render(results: dict, columns: list[str] | None = None) -> str:
    """The table of a ``results.json`` (as written by every command), with its device/date/command line."""
    env = results.get("env", {})
    head = f"device: {env.get('device', '?')} · torch {env.get('torch', '?')} · {env.get('date', '?')}"
    if results.get("command"):
        head += f" · command: `{results['command']}`"
    if "wall_s" in results:
        head += f" · wall time {results['wall_s']:.0f} s"
    return head + "\n\n" + markdown_table(results.get("rows", []), columns) + "\n"


def replace_block(text: str, name: str, block: str) -> str:
    """``text`` with the part between ``<!-- results:name -->`` and ``<!-- /results:name -->`` replaced."""
    pattern = re.compile(rf"(<!-- results:{re.escape(name)} -->\n).*?(<!-- /results:{re.escape(name)} -->)", re.S)
    if not pattern.search(text):
        raise UsageError(f"--into: no '<!-- results:{name} -->' ... '<!-- /results:{name} -->' markers found")
    return pattern.sub(lambda m: m.group(1) + block + m.group(2), text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="a results.json written by compare, ops or an experiment")
    parser.add_argument("--into", default=None, help="markdown file whose marked block is replaced (default: print)")
    parser.add_argument("--name", default=None, help="marker name (default: the results folder's name)")
    parser.add_argument("--columns", default=None, help="comma-separated columns (default: all, in order)")


def run(args: argparse.Namespace) -> int:
    try:
        results = json.loads(read_regular(args.results, what="results"))
    except ValueError as e:
        if not isinstance(e, json.JSONDecodeError):
            raise UsageError(str(e)) from None
        raise UsageError(f"results {args.results}: cannot read it as JSON ({e})") from None
    except (OSError, RecursionError) as e:
        raise UsageError(f"results {args.results}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
        raise UsageError(f"results {args.results}: not a results table (no 'rows'); pass the results.json of a "
                         "command's --out folder, such as runs/compare/results.json, not one run's result.json")
    columns = [c.strip() for c in args.columns.split(",")] if args.columns else results.get("columns")
    block = render(results, columns)
    if not args.into:
        print(block, end="")
        return 0
    name = args.name or os.path.basename(os.path.dirname(os.path.abspath(args.results)))
    try:
        text = read_regular(args.into, what="--into")
    except ValueError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"--into {args.into}: cannot read it ({e.strerror or e})") from None
    write_atomic(args.into, replace_block(text, name, block))  # a failed write leaves the file whole
    print(f"updated the '{name}' table in {args.into}")
    return 0
