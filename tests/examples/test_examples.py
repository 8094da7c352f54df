"""Every script in examples/ runs end to end with ``--steps 3`` on a small offline corpus (real Python
standard-library sources); the Lightning module trains exactly like the plain loop; the FSDP2 examples run on
2 and 4 gloo processes and resume from their DCP checkpoints to the same losses as an uninterrupted run.
Examples whose framework is missing are skipped, naming the package.

The default tier forks each process from a server that has imported torch once (``fork_ranks``), which takes
the interpreter start-up (most of a 3-step run's time) out of every run after the first; the soak tier starts
the scripts as a user does, in fresh interpreters (the compiled runs against eager ones) and under torchrun."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import subprocess
import sys

import pytest

from spectrakit.data.corpora import corpus_files
from spectrakit.data.tokens import prepare

from ..forked_ranks import fork_ranks, torchrun_envs

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
    """``args`` in a fresh interpreter (``subprocess``); fails the test unless it exits 0; returns stdout."""
    return _checked(subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout))


def run_forked(args, env, timeout=300):
    """``run`` with the script in a process forked from the fork server (``fork_ranks``): the same script,
    arguments, environment and output, without importing torch again."""
    proc, _ = fork_ranks(args, [env], ROOT, timeout)
    return _checked(proc)


def _checked(proc) -> str:
    args = proc.args
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


@pytest.fixture(scope="module")
def nanogpt_out(data_env):
    """The plain loop's output, 3 steps with diagnostics at every step: checked by ``test_nanogpt_style``, and
    the reference of the Lightning module."""
    env, data = data_env
    return run_forked([sys.executable, "examples/nanogpt_style.py", "--steps", "3", "--diagnostics-every", "1", *data],
               env)


def test_nanogpt_style(nanogpt_out):
    out = nanogpt_out
    assert "embed.weight" in out and "adamw/soft_clip" in out  # the parameter table
    assert len(losses(out)) == 2 and all(0 < v < 10 for v in losses(out))
    assert len(re.findall(r"max \|\|U\|\|_2", out)) == 3


@pytest.mark.soak
def test_nanogpt_style_compiled_matches_eager(data_env):
    """``--compile`` (aot_eager: no code generation, so the trace is what is tested, in reasonable time on a
    CPU) gives the eager losses, through the clip's warm-up (2 of the 3 steps) and past it."""
    env, data = data_env
    args = [sys.executable, "examples/nanogpt_style.py", "--steps", "3", "--warmup", "2", "--diagnostics-every",
            "1000", *data]
    eager = losses(run(args, env))
    compiled = losses(run([*args, "--compile", "--compile-backend", "aot_eager"], env, timeout=1200))
    assert len(compiled) == 2 and compiled == pytest.approx(eager, abs=1e-4)


@needs("lightning")
def test_lightning_module_matches_the_plain_loop(data_env, nanogpt_out):
    env, data = data_env
    out = run_forked([sys.executable, "examples/lightning_module.py", "--steps", "3", *data], env)
    plain = nanogpt_out
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
    out = run_forked([sys.executable, "examples/hf_trainer.py", "--steps", "3", *data], env)
    assert 0 < float(re.search(r"final train loss ([0-9.]+)", out).group(1)) < 10
    assert "max ||U||_2" in out


# the FSDP2 examples' batches in the tests: 2 sequences of 16 tokens per data-parallel rank (their defaults, 8 of
# 64, only make each step slower: the sharding, the collectives and the checkpoints are the same)
SMALL = ["--batch-size", "2", "--seq-len", "16"]


def launch(args, env, nproc, timeout=300):
    """Start ``nproc`` ranks of an example script with the variables torchrun would set (rank, world size, a
    free local port), without torchrun's agent process (``fork_ranks``). Returns rank 0's completed process
    and every rank's exit code."""
    return fork_ranks(args, torchrun_envs(env, nproc), ROOT, timeout)


def ranks(args, env, nproc, timeout=300) -> str:
    """``launch`` that fails the test unless every rank exits 0; returns rank 0's output."""
    proc, codes = launch(args, env, nproc, timeout)
    if codes != [0] * nproc:
        pytest.fail(f"{args[1]} exit codes {codes}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def eager_and_compiled_resumed(script, env, nproc: int, stop_after: int, ckpt: str) -> tuple[list, list]:
    """The losses of ``script`` run eagerly, and of the same run compiled (``--compile``, ``aot_eager``) in two parts:
    stopped and checkpointed after ``stop_after`` steps, then resumed from ``ckpt``, compiled again."""
    eager = losses(ranks(script, env, nproc))
    compiled = [*script, "--compile", "--compile-backend", "aot_eager"]
    first = losses(ranks([*compiled, "--ckpt", ckpt, "--stop-after", str(stop_after)], env, nproc))
    second = losses(ranks([*compiled, "--ckpt", ckpt, "--resume"], env, nproc))
    return eager, first + second


@pytest.mark.soak
@needs("transformers")
@needs("accelerate")
def test_hf_trainer_compiled(data_env):
    env, data = data_env
    out = run([sys.executable, "examples/hf_trainer.py", "--steps", "3", "--warmup", "0", "--compile",
               "--compile-backend", "aot_eager", *data], env, timeout=1200)
    assert 0 < float(re.search(r"final train loss ([0-9.]+)", out).group(1)) < 10


@pytest.mark.distributed
def test_fsdp2_torchrun_resumes_exactly(data_env, tmp_path):
    """3 of 5 steps, checkpoint, resume for the last 2: the same losses as 5 uninterrupted steps. The ranks
    start with torchrun's variables (``launch``); torchrun itself runs the script in
    ``test_fsdp2_example_under_torchrun`` (soak tier)."""
    env, data = data_env
    script = [sys.executable, "examples/fsdp2_torchrun.py", "--steps", "5", *SMALL, *data]
    full = losses(ranks(script, env, 2))
    ckpt = str(tmp_path / "ckpt")

    def two_ranks(*extra):
        return ranks([*script, *extra], env, 2)

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
@pytest.mark.soak
def test_fsdp2_example_compiled_matches_eager_and_resumes(data_env, tmp_path):
    """``--compile`` (the blocks compiled with ``aot_eager``; the sharded step runs eagerly): the losses of the
    eager run (the same floating-point operations), and a compiled run checkpointed after 3 steps resumes,
    compiled again, to them."""
    env, data = data_env
    script = [sys.executable, "examples/fsdp2_torchrun.py", "--steps", "5", *SMALL, *data]
    eager, resumed = eager_and_compiled_resumed(script, env, 2, 3, str(tmp_path / "ckpt"))
    assert len(eager) == 5 and resumed == pytest.approx(eager, abs=1e-6)


@pytest.mark.distributed
@pytest.mark.soak
def test_fsdp2_example_under_torchrun(data_env):
    """torchrun (its agent process, rendezvous and environment) runs the FSDP2 example on 2 processes to the
    losses of the ranks started directly (``launch``), which the other FSDP2 tests use."""
    env, data = data_env
    script = [sys.executable, "examples/fsdp2_torchrun.py", "--steps", "3", *SMALL, *data]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *script[1:]]
    under_torchrun = losses(run(torchrun, env))
    assert len(under_torchrun) == 3 and under_torchrun == pytest.approx(losses(ranks(script, env, 2)), abs=1e-6)


@pytest.mark.distributed
def test_fsdp2_tp_torchrun_resumes_on_another_mesh(data_env, tmp_path):
    """--dp 2 --tp 2 for 3 steps; then 2 steps on 2x2, checkpoint, and the last step resumed on 2x1 (tensor
    parallelism off, the same data-parallel ranks and so the same batches): the same losses as the
    uninterrupted 2x2 run (to the rounding of the other summation order). The ranks start with torchrun's
    variables (``launch``; the torchrun path itself is checked by the FSDP2 example's test)."""
    env, data = data_env
    script = [sys.executable, "examples/fsdp2_tp_torchrun.py", "--steps", "3", *SMALL, *data]
    full = ranks([*script, "--dp", "2", "--tp", "2"], env, 4)
    assert "SpectraAdamW on 2x2 dp x tp" in full
    assert len(losses(full)) == 3 and all(0 < v < 10 for v in losses(full))
    ckpt = str(tmp_path / "ckpt")
    first = ranks([*script, "--dp", "2", "--tp", "2", "--ckpt", ckpt, "--stop-after", "2"], env, 4)
    second = ranks([*script, "--dp", "2", "--tp", "1", "--ckpt", ckpt, "--resume"], env, 2)
    assert "resumed from step 2" in second and "on 2x1 dp x tp" in second
    assert losses(first) + losses(second) == pytest.approx(losses(full), abs=1e-4)
    proc, codes = launch([*script, "--dp", "3", "--tp", "2"], env, 2)
    assert codes == [2, 2] and "--dp * --tp must equal the number of processes (2), got 3 * 2" in proc.stderr, (
        codes, proc.stderr[-2000:])


@pytest.mark.distributed
def test_fsdp2_tp_example_compiled_matches_eager(data_env):
    """``--compile`` on a 1x2 mesh (the blocks compiled with ``aot_eager``, the embedding's tensor-parallel
    output entering the first one): the losses of the eager run. Without the example's copy of the embedding's
    output the embedding got no gradient (its all-reduce's pending result as the compiled block's input) and the
    second loss differed."""
    env, data = data_env
    script = [sys.executable, "examples/fsdp2_tp_torchrun.py", "--steps", "2", "--dp", "1", "--tp", "2", *SMALL,
              *data]
    eager = losses(ranks(script, env, 2))
    compiled = losses(ranks([*script, "--compile", "--compile-backend", "aot_eager"], env, 2))
    assert len(eager) == 2 and compiled == pytest.approx(eager, abs=1e-6)


@pytest.mark.distributed
@pytest.mark.soak
def test_fsdp2_tp_example_compiled_resumes(data_env, tmp_path):
    """A compiled 2x2 run checkpointed after 2 of 3 steps resumes, compiled again, to the losses of the eager
    2x2 run (compiling in place keeps the parameter names the checkpoint stores)."""
    env, data = data_env
    script = [sys.executable, "examples/fsdp2_tp_torchrun.py", "--steps", "3", "--dp", "2", "--tp", "2", *SMALL,
              *data]
    eager, resumed = eager_and_compiled_resumed(script, env, 4, 2, str(tmp_path / "ckpt"))
    assert len(eager) == 3 and resumed == pytest.approx(eager, abs=1e-6)
