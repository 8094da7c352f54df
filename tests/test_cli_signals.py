"""SIGINT and SIGTERM at any moment of a command (start-up, data preparation, model set-up, a second Ctrl-C,
a sweep) give one line on stderr and exit status 130 / 143, never a traceback or death by the signal."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")

TINY = ["--tokenizer", "bytes", "--steps", "400", "--batch-size", "2", "--seq-len", "16", "--eval-every", "100",
        "--eval-tokens", "64", "--diag-every", "50", "--quiet", "--threads", "1"]
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _start(tmp_path, *argv, fork=False, cache=None):
    """``python -m spectrakit ARGV`` in a fresh interpreter, or with ``fork`` in a child of this one
    (``_Forked``); ``cache``: the corpus cache (default: a fresh one, so the corpus is tokenised)."""
    cache = cache or str(tmp_path / "cache")
    if fork:
        return _Forked(tmp_path, argv, cache)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "SPECTRAKIT_CACHE": cache, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "spectrakit", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _run_command(argv, env, files):
    """The child of ``_Forked``: ``python -m spectrakit ARGV``'s entry (``sys.exit(main())``), its output in
    ``files``."""
    os.environ.update(env)
    for fd, path in zip((1, 2), files):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # not pytest's capture
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)
    import torch

    torch.set_num_threads(1)  # a forked child must not use the parent's OpenMP pool
    from spectrakit.cli import main

    sys.argv = ["spectrakit", *argv]
    sys.exit(main())  # an exit status, or an uncaught exception's traceback and status 1, as an interpreter


class _Forked:
    """A command run by ``spectrakit.cli.main`` in a child forked from this interpreter (torch is imported
    here already: no fresh interpreter to start), as ``python -m spectrakit ARGV`` would run it (the handlers
    of a command-line process, its exit through ``sys.exit``). Output goes to files; the ``subprocess.Popen``
    methods the tests use (``pid``, ``poll``, ``send_signal``, ``communicate``, ``returncode``). The start-up
    itself (the heavy imports under the handlers) is checked on real interpreters by the start-up tests."""

    def __init__(self, tmp_path, argv, cache):
        self._files = (str(tmp_path / "cmd.out"), str(tmp_path / "cmd.err"))
        env = {"SPECTRAKIT_CACHE": cache, "OMP_NUM_THREADS": "1"}
        self._proc = multiprocessing.get_context("fork").Process(target=_run_command,
                                                                  args=(list(argv), env, self._files))
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self):
        return self._proc.exitcode

    def poll(self):
        return self._proc.exitcode

    def send_signal(self, signum):
        os.kill(self.pid, signum)

    def communicate(self, timeout=120.0):
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            self._proc.kill()
            self._proc.join(5)
            raise AssertionError(f"the command did not end within {timeout} s")
        texts = []
        for path in self._files:
            with open(path) as f:
                texts.append(f.read())
        return tuple(texts)


def _handlers_installed(proc, timeout=60.0) -> None:
    """Wait until the process catches SIGTERM (``SigCgt`` of ``/proc/PID/status``): the command line's
    handlers are in place, its heavy imports (torch) are about to start. Before that moment the interpreter
    itself is starting, with Python's default handlers."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as f:
            caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
        if caught >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.005)
    raise AssertionError("the command never installed its SIGTERM handler")


def _wait_for(path, proc, timeout=120.0):
    deadline = time.time() + timeout
    while not os.path.exists(path) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()


def _finish(proc, expected):
    out, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == expected, (proc.returncode, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# A fresh interpreter imports torch and the commands before the situations after start-up (about 7 s of CPU):
# the default tier runs one signal per such situation in a child forked from this interpreter (``_Forked``), the
# soak tier (.ci/run runs it on a fast enough machine) the other one in a fresh interpreter, as a user starts it.
# The start-up tests stop the process before those imports (a fraction of a second each): all in the default tier.
SOAK = pytest.mark.soak


@pytest.mark.parametrize("signum, argv", [(signal.SIGINT, ["compare", *TINY]), (signal.SIGTERM, ["compare", *TINY]),
                                          (signal.SIGTERM, ["ops", "--reps", "1"])])
def test_signal_during_start_up(tmp_path, signum, argv):
    proc = _start(tmp_path, *argv, *(["--out", str(tmp_path / "out")] if argv[0] == "compare" else []))
    _handlers_installed(proc)  # then torch is imported: a signal now used to give a traceback or kill it
    time.sleep(0.05)
    proc.send_signal(signum)
    _finish(proc, CODE[signum])


@pytest.mark.parametrize("signum, fork", [pytest.param(signal.SIGINT, False, marks=SOAK), (signal.SIGTERM, True)])
def test_signal_during_data_preparation_or_model_set_up(tmp_path, signum, fork):
    out = tmp_path / "out"
    proc = _start(tmp_path, "compare", *TINY, "--out", str(out), fork=fork)
    _wait_for(out, proc)  # --out is created just before the corpus is tokenised into a fresh cache
    time.sleep(0.3)
    proc.send_signal(signum)
    line = _finish(proc, CODE[signum])
    assert ("SIGTERM" if signum == signal.SIGTERM else "SIGINT") in line or "interrupted at step" in line


@SOAK  # the same second signal inside the stop is in the default tier below (a script, no command start-up)
def test_second_ctrl_c_while_stopping(tmp_path):
    out = tmp_path / "out"
    proc = _start(tmp_path, "compare", *TINY, "--out", str(out))
    _wait_for(out / "adamw-s0" / "metrics.jsonl", proc)  # training
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _finish(proc, 130)


@pytest.mark.parametrize("signum, fork", [(signal.SIGINT, True), pytest.param(signal.SIGTERM, False, marks=SOAK)])
def test_sweep_signal(tmp_path, signum, fork, corpus_cache):
    out = tmp_path / "sweep"
    proc = _start(tmp_path, "sweep", "--optimizers", "adamw", "--lrs", "1e-3,3e-3", *TINY, "--out", str(out),
                  fork=fork, cache=corpus_cache)  # the corpus tokenised once for the test process
    _wait_for(out / "adamw-lr0.001-s0" / "adamw-s0" / "metrics.jsonl", proc)
    proc.send_signal(signum)
    line = _finish(proc, CODE[signum])
    assert "interrupted at step" in line and "spectrakit sweep" in line


def _script(tmp_path, code):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_second_signal_while_the_checkpoint_is_written_exits_at_once(tmp_path, signum):
    """The first signal asks the loop to stop; a second one arriving while the checkpoint is being written
    (here: inside the save) ends the process with one line, never an exception raised inside the writer."""
    code = f"""
import os, signal, sys
from spectrakit.train import interrupt
interrupt.install_exit_handlers()
with interrupt.graceful(), interrupt.deferred():
    os.kill(os.getpid(), {int(signum)})
    assert interrupt.requested() == {int(signum)}
    os.kill(os.getpid(), {int(signum)})  # "while saving"
    print("not reached")
"""
    r = _script(tmp_path, code)
    assert r.returncode == CODE[signum], (r.returncode, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_signal_after_the_stop_line_adds_no_line(tmp_path):
    """Once a stopped training loop's line is printed (``report_stop``), a late Ctrl-C while the command ends
    adds no second line (seen once in four CI runs before: the three-Ctrl-C test above printed
    ``interrupted (SIGINT, Ctrl-C)`` after it); a Python caller without the command line's handlers keeps
    its own."""
    code = """
import os, signal, sys, time
from spectrakit.train import interrupt
before = signal.getsignal(signal.SIGINT)
interrupt.report_stop("first")
assert signal.getsignal(signal.SIGINT) is before
interrupt.install_exit_handlers()
try:
    interrupt.report_stop("interrupted at step 3")
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
except KeyboardInterrupt:
    print("interrupted (SIGINT, Ctrl-C)", file=sys.stderr)
"""
    r = _script(tmp_path, code)
    assert r.returncode == 0 and r.stderr.splitlines() == ["first", "interrupted at step 3"], (r.returncode,
                                                                                               r.stderr)


def test_signal_during_interpreter_shutdown_is_ignored(tmp_path):
    """After the command has printed its result, a signal during Python's shutdown (when Python restores the
    default handlers) neither kills the process by the signal nor prints a traceback."""
    code = """
import atexit, os, signal, sys, time
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.1)))
sys.argv = ["spectrakit"]
from spectrakit.cli import main
sys.exit(main())
"""
    r = _script(tmp_path, code)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Exception" not in r.stderr, (r.returncode,
                                                                                               r.stderr)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_swallowed_during_start_up_still_ends_the_command(tmp_path, signum):
    """During a command's start-up (imports, parsing) a signal ends the process at once with its line: an
    exception raised inside a module's initialisation was measured to be swallowed there (NumPy's C init
    turns it into an ImportError that torch's optional import catches), after which the command failed
    later with half-imported modules or ran on. Here the code swallows it on purpose. After
    ``end_start_up`` the signal unwinds again (the same swallowing then hides it: nothing ends the process)."""
    code = f"""
import os, signal, sys
from spectrakit.train import interrupt
interrupt.install_exit_handlers(immediate=True)
try:
    os.kill(os.getpid(), {int(signum)})
except BaseException:
    pass
print("not reached")
"""
    r = _script(tmp_path, code)
    assert r.returncode == CODE[signum], (r.returncode, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    after = code.replace("immediate=True)", "immediate=True)\ninterrupt.end_start_up()")
    r = _script(tmp_path, after)
    assert r.returncode == 0 and r.stdout == "not reached\n", (r.returncode, r.stdout, r.stderr)


def test_the_entry_point_installs_its_handlers_before_any_other_import():
    """The console script's module installs SIGINT/SIGTERM handlers as its first instruction: before the
    command line, argparse or torch is imported."""
    code = ("import sys, signal; import spectrakit.commands.entry as e; "
            "print(signal.getsignal(signal.SIGINT) is e._stop, signal.getsignal(signal.SIGTERM) is e._stop, "
            "[m for m in ('spectrakit.cli', 'argparse', 'torch', 'numpy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "True True []"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_at_the_first_instruction(tmp_path, signum):
    """A signal the moment the entry point's handlers exist (before the command line's own handlers and the
    heavy imports): one line and 130 / 143, as later. (SIGTERM's handler is installed right after SIGINT's; the
    interpreter itself catches SIGINT from its start, so only SIGTERM's bit tells that the entry point ran.)"""
    proc = _start(tmp_path, "compare", *TINY, "--out", str(tmp_path / "out"))
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as f:
            caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
        if caught >> (signal.SIGTERM - 1) & 1:
            break
        time.sleep(0.001)
    proc.send_signal(signum)
    line = _finish(proc, CODE[signum])
    assert ("terminated" if signum == signal.SIGTERM else "interrupted") in line
    assert not (tmp_path / "out").exists()
