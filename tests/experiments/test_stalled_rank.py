"""A rank that stalls under a 2-process job: the other one stops after --dist-timeout with one line naming the
timeout and the flag (not a gloo traceback), exit status 1. The timeout is 4 s (the test waits for it in
full): the ranks are forked from one interpreter that has imported torch (``cli_process``), so they start
together, and until the stall no collective of this tiny job waits on the other rank for more than a fraction
of a second, even on a loaded machine."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from spectrakit.data.tokens import prepare

TIMEOUT = "4"
TINY = ["compare", "--optimizers", "adamw", "--preset", "nano", "--tokenizer", "bytes", "--steps", "400",
        "--batch-size", "2", "--seq-len", "16", "--eval-every", "200", "--eval-tokens", "64", "--diag-every", "100",
        "--quiet", "--threads", "1", "--device", "cpu", "--dist-timeout", TIMEOUT]


@pytest.mark.distributed
def test_stalled_rank_ends_the_job_in_one_line(tmp_path, corpus_cache, cli_process):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prepare("stdlib", "bytes", root=corpus_cache)  # both ranks load it: no rank waits on the other's tokenising
    out = tmp_path / "out"
    base = {**os.environ, "OMP_NUM_THREADS": "1", "SPECTRAKIT_CACHE": corpus_cache, "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    procs = [cli_process([*TINY, "--out", str(out)], {**base, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    logged = out / "adamw-s0" / "metrics.jsonl"
    deadline = time.time() + 180
    while not logged.exists() and time.time() < deadline and procs[0].poll() is None:
        time.sleep(0.05)
    assert logged.exists(), procs[0].output()
    os.kill(procs[1].pid, signal.SIGSTOP)  # rank 1 stalls in the middle of training
    t0 = time.time()
    _, err = procs[0].communicate(timeout=120)
    waited = time.time() - t0
    lines = err.strip().splitlines()
    assert procs[0].returncode == 1 and len(lines) == 1, err
    assert f"--dist-timeout {TIMEOUT}" in lines[0] and "Traceback" not in err
    assert float(TIMEOUT) - 1 < waited < 90  # the job waited for the timeout, not for the test's patience
