"""Every script in examples/ runs end to end with ``--steps 3`` on a small offline corpus (real Python
standard-library sources); the Lightning module trains exactly like the plain loop; the FSDP2 example runs on
2 gloo processes under torchrun and resumes from its DCP checkpoint to the same losses as an uninterrupted run.
Examples whose framework is missing are skipped, naming the package."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import socket
import subprocess
import sys

import pytest

from spectrakit.data.corpora import corpus_files
from spectrakit.data.tokens import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.fixture(scope="module")
def data_env(tmp_path_factory):
    """A private cache holding a ~40-file slice of the stdlib corpus (both splits non-empty), and the
    environment for the example processes."""
    cache = str(tmp_path_factory.mktemp("cache"))
    files = corpus_files("stdlib")
    for n in (40, 80, 160, len(files)):
        try:
            prepare("stdlib-slice", "bytes", files=files[:n], root=cache)
            break
        except ValueError:
            continue
    env = dict(os.environ, SPECTRAKIT_CACHE=cache, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    return env, ["--corpus", "stdlib-slice", "--data-files", *files[:n]]


def run(args, env, timeout=300):
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if re.search(r"rror|terminate|what\(\)|Abort", ln)]
        pytest.fail(f"{' '.join(args[-12:])} exited {proc.returncode}:\n" + "\n".join(errors[:40])
                    + "\n--- stdout tail:\n" + proc.stdout[-2000:] + "\n--- stderr tail:\n" + proc.stderr[-3000:])
    return proc.stdout


def losses(out: str) -> list[float]:
    return [float(v) for v in re.findall(r"step \d+ loss ([0-9.]+)", out)]


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"needs {module} (pip install 'spectrakit[examples]')")


def test_nanogpt_style(data_env):
    env, data = data_env
    out = run([sys.executable, "examples/nanogpt_style.py", "--steps", "3", "--diagnostics-every", "1", *data],
              env)
    assert "embed.weight" in out and "adamw/soft_clip" in out  # the parameter table
    assert len(losses(out)) == 2 and all(0 < v < 10 for v in losses(out))
    assert len(re.findall(r"max \|\|U\|\|_2", out)) == 3


@pytest.mark.soak
def test_nanogpt_style_compiled_matches_eager(data_env):
    """``--compile`` (aot_eager: no code generation, so the trace is what is tested, in reasonable time on a
    CPU) gives the eager losses."""
    env, data = data_env
    args = [sys.executable, "examples/nanogpt_style.py", "--steps", "3", "--warmup", "0", "--diagnostics-every",
            "1000", *data]
    eager = losses(run(args, env))
    compiled = losses(run([*args, "--compile", "--compile-backend", "aot_eager"], env, timeout=1200))
    assert len(compiled) == 2 and compiled == pytest.approx(eager, abs=1e-4)


@needs("lightning")
def test_lightning_module_matches_the_plain_loop(data_env):
    env, data = data_env
    out = run([sys.executable, "examples/lightning_module.py", "--steps", "3", *data], env)
    plain = run([sys.executable, "examples/nanogpt_style.py", "--steps", "3", "--diagnostics-every", "1",
                 *data], env)
    final = float(re.search(r"final loss ([0-9.]+)", out).group(1))
    assert final == pytest.approx(losses(plain)[-1], abs=1e-4)  # same model, data, optimizer and schedule
    diag = re.findall(r"step \d+: max .*", out)
    assert diag and set(diag) <= set(re.findall(r"step \d+: max .*", plain))


@pytest.mark.soak
@needs("lightning")
def test_lightning_module_compiled(data_env):
    env, data = data_env
    out = run([sys.executable, "examples/lightning_module.py", "--steps", "3", "--compile", "--compile-backend",
               "aot_eager", *data], env, timeout=1200)
    assert 0 < float(re.search(r"final loss ([0-9.]+)", out).group(1)) < 10


@needs("transformers")
@needs("accelerate")
def test_hf_trainer(data_env):
    env, data = data_env
    out = run([sys.executable, "examples/hf_trainer.py", "--steps", "3", *data], env)
    assert 0 < float(re.search(r"final train loss ([0-9.]+)", out).group(1)) < 10
    assert "max ||U||_2" in out


def launch(args, env, nproc, timeout=300):
    """Start ``nproc`` ranks of a script directly with the variables torchrun would set (rank, world size, a
    free local port): torchrun's own agent process, a third interpreter importing torch, is not needed for
    the checks after the first run. Returns rank 0's completed process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc),
                LOCAL_WORLD_SIZE=str(nproc))
    procs = [subprocess.Popen(args, cwd=ROOT, env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(nproc)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    return subprocess.CompletedProcess(args, procs[0].returncode, *outs[0]), [p.returncode for p in procs]


@pytest.mark.soak
@needs("transformers")
@needs("accelerate")
def test_hf_trainer_compiled(data_env):
    env, data = data_env
    out = run([sys.executable, "examples/hf_trainer.py", "--steps", "3", "--warmup", "0", "--compile",
               "--compile-backend", "aot_eager", *data], env, timeout=1200)
    assert 0 < float(re.search(r"final train loss ([0-9.]+)", out).group(1)) < 10


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_torchrun_resumes_exactly(data_env, tmp_path):
    """3 of 5 steps, checkpoint, resume for the last 2: the same losses as 5 uninterrupted steps. The
    uninterrupted run goes through torchrun; the interrupted one, its resumption and the hostile checkpoint
    start the ranks directly with torchrun's variables (``launch``)."""
    env, data = data_env
    script = [sys.executable, "examples/fsdp2_torchrun.py", "--steps", "5", *data]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *script[1:]]
    full = losses(run(torchrun, env))
    ckpt = str(tmp_path / "ckpt")

    def two_ranks(*extra):
        proc, codes = launch([*script, *extra], env, 2)
        if codes != [0, 0]:
            pytest.fail(f"exit codes {codes}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        return proc.stdout

    first = two_ranks("--ckpt", ckpt, "--stop-after", "3")
    assert "ShardedSpectraAdamW on 2 processes" in first and os.path.isdir(ckpt)
    second = two_ranks("--ckpt", ckpt, "--resume")
    assert "resumed from step 3" in second
    assert len(full) == 5 and losses(first) + losses(second) == pytest.approx(full, abs=1e-6)
    # a crafted .metadata (its pickle calls os.system through a module DCP's own reader imports) is refused
    # (one rank: the loader refuses it before any collective)
    marker = tmp_path / "PWNED"
    body = pickle.dumps((f"touch {marker}",), protocol=2)[2:-1]
    name = lambda s: b"\x8c" + bytes([len(s)]) + s.encode()
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        f.write(b"\x80\x04" + name("torch.distributed.checkpoint.filesystem") + name("os.system") + b"\x93" + body
                + b"R.")
    proc, _ = launch([*script, "--ckpt", ckpt, "--resume"], env, 1)
    assert proc.returncode != 0 and "refused, never executed" in proc.stderr
    assert not marker.exists()


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_tp_torchrun_resumes_on_another_mesh(data_env, tmp_path):
    """--dp 2 --tp 2 for 3 steps; then 2 steps on 2x2, checkpoint, and the last step resumed on 2x1 (tensor
    parallelism off, the same data-parallel ranks and so the same batches): the same losses as the
    uninterrupted 2x2 run (to the rounding of the other summation order)."""
    env, data = data_env
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    script = ["examples/fsdp2_tp_torchrun.py", "--steps", "3", *data]
    full = run([*torchrun, "--nproc_per_node=4", *script, "--dp", "2", "--tp", "2"], env)
    assert "SpectraAdamW on 2x2 dp x tp" in full
    assert len(losses(full)) == 3 and all(0 < v < 10 for v in losses(full))
    ckpt = str(tmp_path / "ckpt")
    first = run([*torchrun, "--nproc_per_node=4", *script, "--dp", "2", "--tp", "2", "--ckpt", ckpt,
                 "--stop-after", "2"], env)
    second = run([*torchrun, "--nproc_per_node=2", *script, "--dp", "2", "--tp", "1", "--ckpt", ckpt, "--resume"],
                 env)
    assert "resumed from step 2" in second and "on 2x1 dp x tp" in second
    assert losses(first) + losses(second) == pytest.approx(losses(full), abs=1e-4)
    proc = subprocess.run([*torchrun, "--nproc_per_node=2", *script, "--dp", "3", "--tp", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "--dp * --tp must equal the number of processes (2), got 3 * 2" in proc.stderr
