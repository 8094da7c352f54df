"""Memory and time a ``compare`` run will need, estimated from its settings before it starts.

Memory (float32 training of the LLaMA model of :mod:`spectrakit.models.llama` with ``P`` parameters, ``L``
blocks of width ``d``, SwiGLU width ``h``, vocabulary ``V``, micro-batches of ``B`` sequences of ``T``
tokens):

``M = 24 P + 4 B T (L (12 d + 4 h) + 3 V)`` bytes

- ``24 P``: weights, gradients, up to three optimizer buffers (Adam's moments and SPECTRA's one), and the
  copy of the weights the spectral diagnostics keep around a step;
- ``4 B T (...)``: the activations kept for the backward pass, per token about ``12 d + 4 h`` floats in
  each block and three vocabulary-sized rows (logits, their softmax and its gradient), which dominate for a
  long ``T`` (the attention itself runs as a fused kernel, without the ``T x T`` scores).

Time: ``6 P + 6 L T d`` floating-point operations per trained token (forward and backward, Kaplan et al.
2020, with the causal attention term), ``2 P + 2 L T d`` per evaluated token, divided by a rate measured on
this machine (a 256 x 256 matrix product, 1024 x 1024 on a GPU, for about 50 ms, at a third of its speed: small
models do not run at matrix-product speed); a rough guide, within a factor of a few.
"""

from __future__ import annotations

import os
import time

import torch

ASSUMED_EFFICIENCY = 1 / 3  # fraction of the measured matmul rate that training reaches
MAX_HOURS = 24.0  # a run estimated to take longer is refused unless insisted on


def parameters(cfg) -> int:
    """Parameters of a :class:`~spectrakit.models.llama.LlamaConfig` (embeddings, blocks, norms, head)."""
    d, h, layers, vocab = cfg.dim, cfg.mlp_hidden, cfg.n_layers, cfg.vocab_size
    block = 4 * d * d + 3 * d * h + 2 * d
    return vocab * d * (1 if cfg.tie_embeddings else 2) + layers * block + d


def memory_bytes(cfg, batch_size: int, seq_len: int) -> int:
    """``M`` of the module docstring for one training process."""
    d, h, layers = cfg.dim, cfg.mlp_hidden, cfg.n_layers
    acts = 4 * batch_size * seq_len * (layers * (12 * d + 4 * h) + 3 * cfg.vocab_size)
    return 24 * parameters(cfg) + acts


def run_flops(cfg, *, steps: int, batch_size: int, seq_len: int, grad_accum: int, eval_every: int,
              eval_tokens: int) -> float:
    """Floating-point operations of one run: training and its evaluations (every ``eval_every`` steps and
    at the end, ``eval_tokens`` tokens each)."""
    p, attn = parameters(cfg), cfg.n_layers * seq_len * cfg.dim
    trained = steps * grad_accum * batch_size * seq_len * (6 * p + 6 * attn)
    evals = (steps // eval_every + 1) * eval_tokens * (2 * p + 2 * attn)
    return float(trained + evals)


def measured_flops_per_s(device: torch.device, seconds: float = 0.05) -> float:
    """Matrix-product rate of ``device`` (floating-point operations per second), measured for about
    ``seconds``, times :data:`ASSUMED_EFFICIENCY`."""
    n = 1024 if device.type == "cuda" else 256  # (a 256 product on a GPU measures its launch time)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)

    def product() -> None:
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return ASSUMED_EFFICIENCY * timed_rate(product, 2 * n**3, seconds)


def timed_rate(fn, work_per_call: float, seconds: float) -> float:
    """``work_per_call`` times the calls of ``fn`` per second, over about ``seconds``, after one untimed
    call (the first product on a GPU also creates its library handles: hundreds of milliseconds, which
    made a 50 ms measurement read an H100 as a million times too slow)."""
    fn()
    count, t0 = 0, time.perf_counter()
    while True:
        fn()
        count += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return work_per_call * count / elapsed


def available_bytes(device: torch.device) -> int | None:
    """Free memory for a run: free GPU memory on CUDA, ``MemAvailable`` of ``/proc/meminfo`` on CPU (None
    where it cannot be read)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return None


def size(nbytes: float) -> str:
    """``nbytes`` in MB or GB."""
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


def duration(seconds: float) -> str:
    """``seconds`` in s, min, h or days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
