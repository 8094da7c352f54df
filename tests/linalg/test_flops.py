"""The FLOP models of spectrakit.linalg.flops equal the matmul FLOPs torch actually counts."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from spectrakit.linalg import flops as F
from spectrakit.linalg import msign, soft_clip, spectral_hardcap


def _count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("shape", [(16, 40), (24, 24), (40, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flop_models_match_counted(shape, dtype):
    m, n = shape
    x = torch.randn(m, n)
    assert _count(lambda: soft_clip(x, 0.5, dtype=dtype)) == F.soft_clip_polar_flops(m, n, dtype)
    assert _count(lambda: soft_clip(x, 0.5, steps=5, dtype=dtype)) == F.soft_clip_polar_flops(m, n, dtype, 5)
    assert _count(lambda: soft_clip(x, 0.5, method="newton_schulz")) == F.soft_clip_newton_schulz_flops(m, n)
    assert _count(lambda: msign(x, dtype=dtype)) == F.msign_flops(m, n, F.msign_default_steps(m, n, dtype))
    assert _count(lambda: spectral_hardcap(x, 0.5, dtype=dtype)) == F.hardcap_flops(m, n, dtype)
    assert _count(lambda: x @ x.mT if m <= n else x.mT @ x) == F.gram_flops(m, n)
