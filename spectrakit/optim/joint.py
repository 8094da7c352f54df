"""The 0-d results of a multi-tensor reduction as one 1-D tensor, without a copy where they already are one.

``torch._foreach_norm`` on CUDA writes the norms of its list into one buffer and returns its elements as 0-d views;
``torch.stack`` of them costs a host call per element (``unsqueeze``) and a ``cat`` kernel: about 0.1 ms of host
time for the 21 gradients of a 2-layer LLaMA step on an H100's host, 40% of the optimizer's non-finite check there
(torch profiler, 2026-11-26). :func:`stack_scalars` returns the buffer itself when the results are its consecutive
elements, else their stack (the CPU kernel, which makes each result a tensor of its own).
"""

from __future__ import annotations

import torch


def stack_scalars(ts: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``torch.stack(ts)`` for 0-d tensors ``ts`` of one dtype: a 1-D view of their common buffer when they are its
    consecutive elements (no copy; the values of the stack), else the stack. While ``torch.compile`` traces,
    always the stack (the addresses are not traced)."""
    if torch.compiler.is_compiling() or not ts:
        return torch.stack(ts)
    first = ts[0]
    if first.dim() != 0:
        return torch.stack(ts)
    size, ptr, storage = first.element_size(), first.data_ptr(), first.untyped_storage().data_ptr()
    for i, t in enumerate(ts):
        if t.dim() != 0 or t.dtype is not first.dtype or t.device != first.device or t.data_ptr() != ptr + i * size:
            return torch.stack(ts)
    if ts[-1].untyped_storage().data_ptr() != storage:
        return torch.stack(ts)
    return first.as_strided((len(ts),), (1,))
