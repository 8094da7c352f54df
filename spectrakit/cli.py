"""The ``spectrakit`` command.

Every sub-command lives in its own module of :mod:`spectrakit.commands` that defines ``add_arguments(parser)``
and ``run(args) -> int``; this file only lists them. Experiments are registered in
:data:`spectrakit.experiments.EXPERIMENTS`.
"""

from __future__ import annotations

import argparse
import importlib
import os
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
    options without a default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text.lower() or action.default in (None, argparse.SUPPRESS, False, True)
                or not action.option_strings):
            return text
        return text + " (default: %(default)s)"


def _user_text(text: str | None) -> str | None:
    """Help text as users read it: docstrings reused as descriptions lose their reST literal markup."""
    if not text:
        return text
    return text.replace("``", "")


def _harden(parser: argparse.ArgumentParser) -> None:
    """Make every sub-parser report errors in one line, show defaults once, reject nan/inf for every
    float option and check ``--device`` while parsing; recurses into nested sub-commands."""
    from spectrakit._cliargs import device_name, finite_float, thread_count

    parser.__class__ = Parser
    parser.formatter_class = HelpFormatter
    parser.description = _user_text(parser.description)
    for action in parser._actions:
        if action.help != argparse.SUPPRESS:
            action.help = _user_text(action.help)
        if action.type is float:
            action.type = finite_float
        if action.dest == "device" and action.type is None:
            action.type = device_name
    if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions) and parser.prog != "spectrakit":
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


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="spectrakit",
        description="spectrakit: control the spectrum of neural networks (matrix functions, "
                    "spectral-norm bounds, SPECTRA/Muon optimizers, reproducible experiments).",
    )
    from spectrakit import __version__

    parser.add_argument("--version", action="version", version=f"spectrakit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().split("\n\n")[0],
                           formatter_class=HelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    _harden(parser)
    return parser


def _is_user_error(exc: BaseException) -> bool:
    """A user error: :class:`UsageError`, a missing corpus or data set, a checkpoint that cannot be written or
    used (a full disk, a corrupted folder: the message is one line naming the path), or an exception raised
    by the library's own argument checks (``spectrakit/_checks.py``) about an option's value."""
    from spectrakit._cliargs import UsageError
    from spectrakit.checkpoint import CheckpointError
    from spectrakit.data.corpora import CorpusUnavailableError

    if isinstance(exc, (UsageError, CorpusUnavailableError, CheckpointError)):
        return True
    if isinstance(exc, FileNotFoundError) and "install" in str(exc):
        return True  # missing data set, the message names the package to install
    if isinstance(exc, (ValueError, TypeError)) and exc.__traceback__ is not None:
        frames = traceback.extract_tb(exc.__traceback__)
        return os.path.basename(frames[-1].filename) in ("_checks.py", "_cliargs.py")
    return False


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors give one line on stderr and exit status 2 (``SPECTRAKIT_DEBUG=1``
    shows their traceback too). SIGINT and SIGTERM at any moment give one line and exit status 130 / 143
    (inside a training loop after a checkpoint, see :mod:`spectrakit.train.interrupt`)."""
    signals = (interrupt.signal.SIGINT, interrupt.signal.SIGTERM)
    previous = {s: interrupt.signal.getsignal(s) for s in signals}
    interrupt.install_exit_handlers()
    stopped = False
    try:
        code = _main(argv)
    except KeyboardInterrupt as e:  # Terminated (SIGTERM) too
        interrupt.ignore_signals()  # the command is stopping: a further Ctrl-C must not add a traceback
        print(interrupt.message(e), file=sys.stderr)
        code, stopped = interrupt.exit_code(e), True
    for s in signals:
        if argv is not None:  # called from Python: give the caller its handlers back
            interrupt.signal.signal(s, previous[s])
        elif not stopped:  # the process ends next: a late signal ends it in one line
            interrupt.signal.signal(s, interrupt.exit_now)
    return code


def _main(argv: list[str] | None) -> int:
    from spectrakit._cliargs import check_output_folder
    from spectrakit._threads import apply_threads

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 0
    apply_threads(getattr(args, "threads", None))
    try:
        for flag in ("out",):
            if getattr(args, flag, None):
                check_output_folder(getattr(args, flag), "--" + flag)
        return int(args._run(args) or 0)
    except Exception as e:
        if not _is_user_error(e) or os.environ.get("SPECTRAKIT_DEBUG"):
            raise
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
