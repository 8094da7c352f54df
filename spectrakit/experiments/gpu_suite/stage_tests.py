"""tests stage: the test suite on the device, in pytest subprocesses of the checkout's ``tests/`` folder.

Two runs, each with a JUnit XML file in ``tests/`` of the report folder from which the counts are read:

- ``gpu-marked``: every test marked ``gpu`` (sync-debug mode on the hot paths, bf16, batched,
  ``torch.compile``; they skip without CUDA), from the test files that use the mark (tiny: the smallest);
- ``device``: the tests that take the ``device`` fixture, run for that device (``-k cuda`` / ``-k cpu``),
  without the ``gpu``, ``slow`` and ``distributed`` ones (tiny: the smallest such file). A run without
  test files is skipped with a note.

The stage fails when a test fails or errors (the failing test ids are listed) or a run collected no test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

from . import StageResult

_GPU_MARK = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark\s*=.*\bmark\.gpu\b)", re.M)
_DEVICE_ARG = re.compile(r"^def test_\w+\([^)]*\bdevice\b", re.M)


def tests_folder() -> str:
    """The ``tests/`` folder beside the ``spectrakit`` package (a source checkout)."""
    import spectrakit

    root = os.path.dirname(os.path.dirname(os.path.abspath(spectrakit.__file__)))
    path = os.path.join(root, "tests")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no tests/ folder beside the spectrakit package ({root}); run the suite from a "
                                "source checkout")
    return path


def _files(folder: str, pattern) -> list[str]:
    found = []
    for dirpath, _, names in os.walk(folder):
        for name in sorted(names):
            if name.startswith("test_") and name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    if pattern(f.read()):
                        found.append(path)
    return sorted(found)


def selections(folder: str, device: str, tiny: bool) -> dict[str, list[str]]:
    """name -> pytest arguments of the two runs."""
    gpu = _files(folder, lambda text: _GPU_MARK.search(text) is not None)
    dev = _files(folder, lambda text: _DEVICE_ARG.search(text) is not None)
    if tiny:
        gpu, dev = ([min(files, key=os.path.getsize)] if files else [] for files in (gpu, dev))
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return {"gpu-marked": ["-m", "gpu", *gpu] if gpu else [],
            "device": ["-m", "not gpu and not slow and not distributed", "-k", kind, *dev] if dev else []}


def _counts(xml_path: str) -> dict:
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for s in suites for case in s.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return {**total, "failed_ids": failed}


def run(ctx) -> StageResult:
    folder = tests_folder()
    root = os.path.dirname(folder)
    out = os.path.join(ctx.out, "tests")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    res = StageResult()
    rows, problems = [], []
    for name, args in selections(folder, str(ctx.device), ctx.tiny).items():
        if not args:
            rows.append({"run": name, "exit": "-", "tests": 0})
            res.notes.append(f"{name}: no test file found for this run"
                             + (" (no test takes the device fixture)" if name == "device" else ""))
            continue
        xml_path = os.path.join(out, f"{name}.xml")
        log_path = os.path.join(out, f"{name}.log")
        # one test process (-n 0: the project's pytest settings start one per core; CUDA tests share one GPU)
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", f"--junitxml={xml_path}",
               *args]
        remaining = max(10.0, ctx.budget_s - ctx.elapsed())
        with open(log_path, "w") as log:
            try:
                rc = subprocess.run(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=remaining).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        res.files += [os.path.relpath(p, ctx.out) for p in (xml_path, log_path) if os.path.exists(p)]
        row = {"run": name, "exit": rc}
        if os.path.exists(xml_path):
            counts = _counts(xml_path)
            row.update({k: counts[k] for k in ("tests", "passed", "failures", "errors", "skipped")})
            if counts["failed_ids"]:
                res.notes.append(f"{name}: failing: " + ", ".join(counts["failed_ids"][:30]))
            if counts["failures"] or counts["errors"]:
                problems.append(f"{name}: {counts['failures']} failed, {counts['errors']} errors")
            elif counts["tests"] == 0:
                problems.append(f"{name}: no test collected")
        else:
            problems.append(f"{name}: pytest wrote no result (exit {rc}, see {os.path.relpath(log_path, ctx.out)})")
        row["pytest args"] = " ".join(os.path.relpath(a, root) if os.path.isabs(a) else a for a in args)
        rows.append(row)
    res.tables["pytest"] = rows
    if problems:
        res.ok, res.error = False, "; ".join(problems)
    return res
