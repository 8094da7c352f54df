"""DDP on 2 CPU processes (gloo) started with torchrun's variables: the trained parameters equal a
single-process reference that averages the two ranks' gradients by hand; single-process set-up is a no-op
wrapper. The default tier forks the ranks from a server that has imported torch once (``fork_ranks``: the
same script, environment and rendezvous, without torchrun's agent and three fresh interpreters); the soak
tier runs the script under torchrun itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from spectrakit.data.batches import TokenBatches
from spectrakit.train.distributed import DistInfo, setup, wrap_model

from ..forked_ranks import fork_ranks, torchrun_envs
from .conftest import pattern_tokens

SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from conftest import pattern_tokens
    from spectrakit.data.batches import TokenBatches
    from spectrakit.models.llama import Llama, LlamaConfig
    from spectrakit.train.distributed import setup, teardown, wrap_model
    from spectrakit.train.loop import TrainConfig, train
    torch.set_num_threads(1)
    info = setup("cpu")
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, max_seq_len=16))
    ddp = wrap_model(model, info)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    data = TokenBatches(pattern_tokens(20000), 4, 12, seed=0, rank=info.rank, world_size=info.world_size)
    res = train(ddp, opt, None, data, pattern_tokens(4000, seed=1),
                TrainConfig(steps=3, grad_clip=None, progress=False, eval_tokens=48), dist_info=info)
    if info.is_main:
        torch.save({{k: v for k, v in model.state_dict().items()}}, {out!r})
    teardown(info)
""")


@pytest.mark.distributed
@pytest.mark.parametrize("torchrun", [False, pytest.param(True, marks=pytest.mark.soak)])
def test_ddp_two_ranks_match_manual_gradient_average(tmp_path, torchrun):
    tests = os.path.dirname(os.path.abspath(__file__))
    out = str(tmp_path / "ddp.pt")
    script = tmp_path / "ddp_train.py"
    script.write_text(SCRIPT.format(tests=tests, out=out))
    # a stuck rendezvous or collective ends with gloo's error (in the failure message) before the 300 s kill
    env = dict(os.environ, OMP_NUM_THREADS="1", SPECTRAKIT_DIST_TIMEOUT="120")
    if torchrun:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
            env=env, capture_output=True, text=True, timeout=300)
    else:
        proc, codes = fork_ranks([sys.executable, str(script)], torchrun_envs(env, 2), str(tmp_path))
        assert codes == [0, 0], (codes, proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp_state = torch.load(out)

    from spectrakit.models.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    ref = Llama(LlamaConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, max_seq_len=16))
    tokens = pattern_tokens(20000)
    streams = [TokenBatches(tokens, 4, 12, seed=0, rank=r, world_size=2) for r in range(2)]
    for i in range(3):
        grads = []
        for s in streams:
            ref.zero_grad()
            ref(*s.batch(i))[1].backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        with torch.no_grad():
            for p, g0, g1 in zip(ref.parameters(), *grads):
                p -= 0.2 * (g0 + g1) / 2
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(ddp_state[k], v, rtol=1e-5, atol=1e-6)


def test_single_process_setup_and_wrap_are_no_ops(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = setup("cpu")
    assert info == DistInfo() and info.is_main and not info.enabled
    model = torch.nn.Linear(2, 2)
    assert wrap_model(model, info) is model
    assert wrap_model(model, info, mode="fsdp2") is model
    with pytest.raises(ValueError, match="mode must be one of.*fsdp2"):
        wrap_model(model, info, mode="fsdp3")
