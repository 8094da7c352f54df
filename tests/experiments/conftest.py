"""Fixtures of the experiment tests: ``quick_plots`` (figures not rendered), ``cli_process`` (the command line in
a process forked from one that has imported torch)."""

from __future__ import annotations

import contextlib
import os
import runpy

import pytest


@pytest.fixture
def quick_plots(monkeypatch):
    """Every figure of the test laid out and written as an empty file of its name: the plotting code runs (the
    figures, axes, curves and legends are built from the results), but ``Figure.tight_layout`` does nothing
    and ``Figure.savefig`` renders nothing, which are nearly all of a figure's time (about 2 s of CPU for
    ``compare``'s two figures). For the tests of run folders, resumption and sweeps: they check which files
    a command writes and what its results are; ``test_compare.py`` and ``test_plots_readable.py`` check the
    rendered figures. Returns ``real_figures()``, a context manager inside which figures are rendered again."""
    from matplotlib.figure import Figure

    real = {name: getattr(Figure, name) for name in ("tight_layout", "savefig")}

    def savefig(self, fname, *args, **kwargs):
        open(fname, "wb").close()

    monkeypatch.setattr(Figure, "tight_layout", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(Figure, "savefig", savefig)

    @contextlib.contextmanager
    def real_figures():
        with monkeypatch.context() as m:
            for name, fn in real.items():
                m.setattr(Figure, name, fn)
            yield

    return real_figures


class CliProcess:
    """One ``spectrakit ARGV...`` command in its own process, forked from a fork server that has imported torch
    and the experiment modules once (``cli_process.py`` sets the environment, arguments and output files, then
    runs the console script's entry point): a fresh interpreter would import torch again, about 4 s of CPU
    per process on this 2-core machine. A real process all the same: it takes signals, and its exit status
    is the command's."""

    def __init__(self, ctx, argv: list[str], env: dict[str, str], folder: str, name: str) -> None:
        self.stdout, self.stderr = os.path.join(folder, f"{name}.out"), os.path.join(folder, f"{name}.err")
        for path in (self.stdout, self.stderr):
            open(path, "w").close()  # there to read even if the process dies before writing
        init = dict(ENV=dict(env), ARGV=list(argv), STDOUT=self.stdout, STDERR=self.stderr)
        self.process = ctx.Process(target=runpy.run_path, args=(CLI_SCRIPT,),
                                   kwargs=dict(init_globals=init, run_name="_spectrakit_cli"))
        self.process.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """The exit status (``-N`` after signal N), ``None`` while running."""
        return self.process.exitcode

    def communicate(self, timeout: float) -> tuple[str, str]:
        """``(stdout, stderr)`` once the process has ended; the test fails if it runs past ``timeout`` s."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.kill()
            pytest.fail(f"spectrakit did not end within {timeout} s:\n{self.output()[1][-3000:]}")
        return self.output()

    def output(self) -> tuple[str, str]:
        with open(self.stdout) as out, open(self.stderr) as err:
            return out.read(), err.read()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
            self.process.join(30)


CLI_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli_process.py")


@pytest.fixture
def cli_process(tmp_path_factory):
    """``start(argv, env)``: a :class:`CliProcess` running ``spectrakit argv...`` with environment ``env``;
    every process still running at the end of the test is killed."""
    import multiprocessing

    from spectrakit.distributed.launch import _ensure_fork_server

    # the fork server of the distributed launcher (one per process; the copy of spectrakit under test first on
    # its PYTHONPATH), started with the comparison preloaded once the tests were collected (tests/conftest.py)
    _ensure_fork_server()
    ctx = multiprocessing.get_context("forkserver")
    folder = str(tmp_path_factory.mktemp("cli"))
    started: list[CliProcess] = []

    def start(argv: list[str], env: dict[str, str]) -> CliProcess:
        started.append(CliProcess(ctx, argv, env, folder, str(len(started))))
        return started[-1]

    yield start
    for proc in started:
        proc.kill()
