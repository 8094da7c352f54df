"""The resource estimate of compare: parameter count against the real model, the memory formula's terms, and
--no-resource-check letting settings through that are otherwise refused."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from spectrakit._cliargs import UsageError
from spectrakit.experiments import compare as cmp
from spectrakit.experiments import resources
from spectrakit.models.llama import Llama, preset_config
from spectrakit.train.distributed import DistInfo


@pytest.mark.parametrize("preset", ["nano", "tiny", "mini", "small", "124m"])
def test_parameter_count_equals_the_model(preset):
    cfg = preset_config(preset, 300, max_seq_len=32)
    with torch.device("meta"):  # no memory: only the shapes count
        model = Llama(cfg)
    assert resources.parameters(cfg) == sum(p.numel() for p in model.parameters())


def test_memory_terms():
    cfg = preset_config("tiny", 256, max_seq_len=64)
    p = resources.parameters(cfg)
    base = resources.memory_bytes(cfg, 1, 1)
    assert base == 24 * p + 4 * (cfg.n_layers * (12 * cfg.dim + 4 * cfg.mlp_hidden) + 3 * 256)
    # activations are linear in batch x sequence length (the attention runs fused, without T x T scores)
    assert resources.memory_bytes(cfg, 4, 100) - 24 * p == 400 * (base - 24 * p)
    assert resources.duration(30) == "30 s" and resources.duration(7200) == "2.0 h"
    assert resources.size(2.5e9) == "2.5 GB" and resources.size(3e6) == "3 MB"


def _fake_splits(n_val: int):
    return types.SimpleNamespace(val=np.zeros(n_val, dtype=np.uint16), meta={"vocab_size": 256})


def test_check_refuses_and_no_resource_check_insists():
    opts = cmp.CompareOptions(tokenizer="bytes", seq_len=100000, device="cpu", progress=False)
    cfg = opts.resolved()
    info = DistInfo()
    with pytest.raises(UsageError, match=r"GB of memory.*--no-resource-check"):
        cmp._check_resources(opts, cfg, _fake_splits(10**6), info)
    opts.resource_check = False
    est = cmp._check_resources(opts, cfg, _fake_splits(10**6), info)
    assert est["memory_bytes"] > 50e9 and est["seconds"] > 0
    with pytest.raises(UsageError, match="validation split has 1000 tokens"):  # never insisted away
        cmp._check_resources(opts, cfg, _fake_splits(1000), info)
    opts = cmp.CompareOptions(tokenizer="bytes", eval_tokens=2000, device="cpu", progress=False,
                              resource_check=False)
    with pytest.raises(UsageError, match="--eval-tokens 2000"):
        cmp._check_resources(opts, opts.resolved(), _fake_splits(1500), info)


def test_rate_ignores_a_slow_first_call(monkeypatch):
    """A first call that is slow (a GPU creating its library handles) is not timed: on a clock where the first
    call takes 0.3 s and every later one 1 ms, a 20 ms measurement reads 1000 calls per second (it read about 3
    when the first call was timed). The clock is simulated: a wall clock made this test fail when the machine
    descheduled the process for 0.2 s."""
    now = [0.0]
    calls = []

    def fn():
        now[0] += 0.3 if not calls else 1e-3
        calls.append(1)

    monkeypatch.setattr(resources, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    rate = resources.timed_rate(fn, 1.0, 0.02)
    assert rate == pytest.approx(1000.0)
    assert len(calls) == 21
    rate = resources.timed_rate(fn, 5.0, 0.02)  # work_per_call scales the rate
    assert rate == pytest.approx(5000.0)
