"""The ``spectrakit`` command.

Every sub-command lives in its own module of :mod:`spectrakit.commands` that defines ``add_arguments(parser)``
and ``run(args) -> int``; this file only lists them. Experiments are registered in
:data:`spectrakit.experiments.EXPERIMENTS`.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys
import traceback

from spectrakit.train import interrupt  # no torch: imported before the signal handlers are in place

# the other imports (torch among them) wait until main() has installed the signal handlers

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "compare": ("spectrakit.commands.compare",
                "train a small LM with several optimizers (default AdamW vs SpectraAdamW) and compare them"),
    "sweep": ("spectrakit.commands.sweep",
              "tune the LR of several optimizers over seeds (and SPECTRA's c): a resumable grid of compare runs"),
    "ops": ("spectrakit.commands.ops",
            "check every matrix function against its exact SVD/eigh reference and time it"),
    "experiment": ("spectrakit.commands.experiment", "run one of the paper experiments (see `experiment --help`)"),
    "lipschitz": ("spectrakit.commands.lipschitz", "per-layer spectral-norm bounds and Lipschitz bound of a model"),
    "data": ("spectrakit.commands.data", "prepare offline corpora (`data prepare NAME`, `data list`)"),
    "plot": ("spectrakit.commands.plot", "plot logs and spectral diagnostics of a training run"),
    "report": ("spectrakit.commands.report",
               "print a results.json as a table, or update the marked table in README/docs from it"),
    "gpu-suite": ("spectrakit.commands.gpu_suite",
                  "run every GPU check and benchmark (tests, linalg, optim, train, compare, conv) into one report"),
}


class Parser(argparse.ArgumentParser):
    """argparse parser whose errors are one line on stderr (``error: spectrakit compare: --lr: ...``),
    exit status 2, instead of the usage block followed by the message."""

    def error(self, message: str):  # noqa: D102 (argparse API)
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default once: not when the help text already names it, nor for flags and
    options without a default; a list option as ``--seeds SEEDS,...``."""

    def _format_args(self, action, default_metavar):
        if isinstance(action, _CommaList):
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text.lower() or action.default in (None, argparse.SUPPRESS, False, True)
                or not action.option_strings):
            return text
        return text + " (default: %(default)s)"


# old option spellings kept as hidden aliases for one release: one name per idea across the commands
ALIASES = {"--max-steps": "--steps", "--D2s": "--radii", "--bs": "--b-values"}
# commands that read files and compute nothing: no --threads
NO_THREADS = ("spectrakit report", "spectrakit plot", "spectrakit data list")


def _user_text(text: str | None) -> str | None:
    """Help text as users read it: docstrings reused as descriptions lose their reST markup (``literal``,
    :class:`~a.b.Name` -> Name, :mod:`.name` -> name)."""
    if not text:
        return text
    text = re.sub(r":[a-z]+:`~?\.?([^`]*?)`", lambda m: m.group(1).rpartition(".")[2] if "~" in m.group(0)
                  or m.group(0).split("`")[1].startswith(".") else m.group(1), text)
    return text.replace("``", "")


class _CommaList(argparse._StoreAction):
    """A list option: comma-separated (``--seeds 0,1,2``), the one list convention of the command line;
    the space-separated spelling of earlier releases (``--seeds 0 1 2``) is still accepted."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [v for vs in values for v in vs])


def _comma_list(action: argparse.Action):
    """``type=`` of a list option: one token ``a,b,c`` -> its converted items, checked against ``choices``."""
    convert, choices = action.type or str, action.choices

    def parse(text: str) -> list:
        items = []
        parts = [t.strip() for t in text.split(",")]
        if len(parts) > 1 and not all(parts):
            raise argparse.ArgumentTypeError(f"empty item in the comma-separated list {text!r}")
        for t in parts:
            if not t:
                continue
            try:
                value = convert(t)
            except (ValueError, argparse.ArgumentTypeError) as e:
                raise argparse.ArgumentTypeError(f"expected a comma-separated list, {t!r}: {e}") from None
            if choices is not None and value not in choices:
                raise argparse.ArgumentTypeError(f"unknown {t!r}; accepted: {', '.join(map(str, choices))}")
            items.append(value)
        if not items:
            raise argparse.ArgumentTypeError("expected at least one value")
        return items

    parse.__name__ = "list"
    return parse


def _one_convention(parser: argparse.ArgumentParser, action: argparse.Action) -> None:
    """Comma-separated lists and the common option names (see :data:`ALIASES`) on one option."""
    if action.option_strings and action.nargs in ("+", "*"):
        action.type = _comma_list(action)
        action.choices = None
        action.__class__ = _CommaList
        action.metavar = f"{(action.metavar or action.dest.upper()).replace('_', '-')},..."
        if action.help and "comma-separated" not in action.help:
            action.help = "comma-separated " + action.help
        if isinstance(action.default, (list, tuple)):
            action.default = list(action.default)
            if action.help and "default" not in action.help.lower():
                shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in action.default)
                action.help += f" (default: {shown})"
    for old, new in ALIASES.items():
        if old in action.option_strings and new not in parser._option_string_actions:
            action.option_strings = [new if o == old else o for o in action.option_strings]
            action.metavar = action.metavar or new.lstrip("-").upper().replace("-", "_")
            parser._option_string_actions[new] = action  # the old spelling still parses, help shows the new
        elif new in action.option_strings and old not in parser._option_string_actions:
            parser._option_string_actions[old] = action  # a hidden alias: the old spelling parses too


def _harden(parser: argparse.ArgumentParser) -> None:
    """Make every sub-parser report errors in one line, show defaults once, reject nan/inf for every
    float option and check ``--device`` while parsing; recurses into nested sub-commands."""
    from spectrakit._cliargs import device_name, finite_float, thread_count

    parser.__class__ = Parser
    parser.formatter_class = HelpFormatter
    parser.description = _user_text(parser.description)
    for action in list(parser._actions):
        _one_convention(parser, action)
        if action.help != argparse.SUPPRESS:
            action.help = _user_text(action.help)
        if action.type is float:
            action.type = finite_float
        if action.dest == "device" and action.type is None:
            action.type = device_name
    if (not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
            and parser.prog not in ("spectrakit", *NO_THREADS)):
        parser.add_argument("--threads", type=thread_count, default=None,
                            help="CPU threads for torch, at most the cores this process may use (default: the "
                            "cores not busy with other work, measured over 0.2 s at start; OMP_NUM_THREADS when "
                            "set)")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _harden(sub)
            for choice in action._choices_actions:
                choice.help = _user_text(choice.help)


def command_of(argv: list[str]) -> str | None:
    """The sub-command that ``argv`` (the arguments after ``spectrakit``) names: its first argument that is
    not an option (the ``spectrakit`` level has only ``--help`` and ``--version``, which take no value), or
    None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(commands=None, argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the command line. ``commands``: the sub-commands whose options are filled in (their
    modules imported); the others are listed with their one-line help only, which is all that ``spectrakit
    --help`` and a run of another command use. Default: all of them (for tools that walk every option).

    A run fills in only the command it runs: ``spectrakit --help`` imports no command module, and a command's
    own module imports what its options need; the heavy libraries (torch) wait for the commands that
    compute. ``argv`` (the arguments after ``spectrakit``) goes to a command whose ``add_arguments`` takes it
    (``experiment``: only the experiment named is filled in)."""
    parser = Parser(
        prog="spectrakit",
        description="spectrakit: control the spectrum of neural networks (matrix functions, "
                    "spectral-norm bounds, SPECTRA/Muon optimizers, reproducible experiments).",
    )
    from spectrakit import __version__

    parser.add_argument("--version", action="version", version=f"spectrakit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if commands is not None and name not in commands:
            sub.add_parser(name, help=help_text)
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().split("\n\n")[0],
                           formatter_class=HelpFormatter)
        if "argv" in inspect.signature(mod.add_arguments).parameters:
            mod.add_arguments(p, argv=argv)
        else:
            mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    _harden(parser)
    return parser


def _is_user_error(exc: BaseException) -> bool:
    """A user error: :class:`UsageError`, a missing corpus or data set, or an exception raised by the
    library's own argument checks (``spectrakit/_checks.py``) about an option's value."""
    from spectrakit._cliargs import UsageError
    from spectrakit.data.corpora import CorpusUnavailableError

    if isinstance(exc, (UsageError, CorpusUnavailableError)):
        return True
    if isinstance(exc, FileNotFoundError) and "install" in str(exc):
        return True  # missing data set, the message names the package to install
    if isinstance(exc, (ValueError, TypeError)) and exc.__traceback__ is not None:
        frames = traceback.extract_tb(exc.__traceback__)
        return os.path.basename(frames[-1].filename) in ("_checks.py", "_cliargs.py")
    return False


def main(argv: list[str] | None = None) -> int:
    """Run the command line. Every error is one line ``error: ...`` on stderr, never a traceback: exit status 2
    for a user error (a bad option, a missing or foreign file), 1 for a failure that other arguments would not
    fix, such as unusable checkpoints or a full disk (``SPECTRAKIT_DEBUG=1`` shows the traceback). SIGINT and
    SIGTERM at any moment give one line and exit status 130 / 143
    (inside a training loop after a checkpoint, see :mod:`spectrakit.train.interrupt`)."""
    signals = (interrupt.signal.SIGINT, interrupt.signal.SIGTERM)
    previous = {s: interrupt.signal.getsignal(s) for s in signals}
    interrupt.install_exit_handlers(immediate=argv is None)  # (a Python caller's process is never ended)
    try:
        code = _main(argv)
    except KeyboardInterrupt as e:  # Terminated (SIGTERM) too
        interrupt.ignore_signals()  # the command is stopping: a further Ctrl-C must not add a traceback
        print(interrupt.message(e), file=sys.stderr)
        code = interrupt.exit_code(e)
        if argv is None:  # a command-line process: end it here (see interrupt.end_process)
            interrupt.end_process(code)
    finally:  # (also after --help or a usage error, which leave through SystemExit)
        if argv is None:  # the command has printed its result and the process ends next: a late signal is
            interrupt.ignore_signals()  # ignored (Python's shutdown would restore the default: death by signal)
        else:  # called from Python: give the caller its handlers back
            interrupt.uninstall_exit_handlers(previous)
    return code


def _main(argv: list[str] | None) -> int:
    from spectrakit._cliargs import check_output_folder
    from spectrakit._threads import apply_threads

    line = sys.argv[1:] if argv is None else argv
    parser = build_parser([command_of(line)], argv=line)
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 0
    if hasattr(args, "threads"):  # commands that compute nothing have no --threads
        apply_threads(args.threads)
    try:
        for flag in ("out",):
            if getattr(args, flag, None):
                check_output_folder(getattr(args, flag), "--" + flag)
        interrupt.end_start_up()
        return int(args._run(args) or 0)
    except Exception as e:
        if os.environ.get("SPECTRAKIT_DEBUG"):
            raise
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if _is_user_error(e):
            print(f"error: {text}", file=sys.stderr)
            return 2
        # a failure that other arguments would not fix (unreadable checkpoints, a full disk, a bug): one line,
        # exit status 1; the traceback stays available for a bug report
        from spectrakit.checkpoint import CheckpointError

        if not isinstance(e, (CheckpointError, OSError)):
            text = f"{type(e).__name__}: {text} (unexpected; SPECTRAKIT_DEBUG=1 shows where)"
        print(f"error: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
