"""Thread policy of the command line: wall time of `spectrakit ops`, a short `spectrakit compare` and the
linear-algebra part of the test suite with one thread per core (PyTorch's default) and with the policy
(only the cores not busy with other work), on an idle machine and under a synthetic load of busy processes.

    python benchmarks/studies/study_threads.py [--load 2] [--write]

The load is ``--load`` Python processes spinning in a loop (like other jobs on a shared machine); each
configuration runs once, side by side in one invocation.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from _common import command_line, write_section  # noqa: E402

COMMANDS = {
    "ops": ["ops", "--shapes", "128x256", "--reps", "3"],
    "compare (40 steps)": ["compare", "--steps", "40", "--eval-every", "20", "--quiet", "--force"],
    "tests (tests/linalg)": None,  # pytest: the suite's conftest applies the same policy
}
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args: list[str] | None, threads: str | None, out: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if args is None:  # the tests: threads forced through the environment, as a user would
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/linalg"]
        if threads:
            env["OMP_NUM_THREADS"] = threads
    else:
        extra = ["--threads", threads] if threads else []
        cmd = [sys.executable, "-m", "spectrakit", *args, *extra, "--out", out]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, cwd=_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", type=int, default=2, help="busy processes for the loaded runs")
    ap.add_argument("--commands", default=",".join(COMMANDS), help="which commands to time")
    ap.add_argument("--write", action="store_true", help="write the table into docs/BENCHMARKS.md")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for loaded in (False, True):
            busy = []
            if loaded:
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
                time.sleep(65)  # let the 1-minute load average see the load, as the policy reads it
            try:
                for name in args.commands.split(","):
                    load = os.getloadavg()[0]
                    t_all = _run(COMMANDS[name], str(cores), os.path.join(tmp, "a"))
                    t_pol = _run(COMMANDS[name], None, os.path.join(tmp, "b"))
                    rows.append((name, (f"{args.load} busy processes" if loaded else "idle") + f" (load {load:.1f})",
                                 t_all, t_pol))
                    print(rows[-1], flush=True)
            finally:
                for p in busy:
                    p.kill()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    lines = [f"### Thread policy ({cores}-core CPU, {date})", "", f"command: `{command_line()}`", "",
             f"| command | machine | {cores} threads (one per core) | policy (free cores) | ratio |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {m} | {a:.1f} s | {b:.1f} s | {a / b:.2f}x |" for n, m, a, b in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_section("threads", text)


if __name__ == "__main__":
    main()
