"""The FLOP models of spectrakit.linalg.flops equal the matmul FLOPs torch actually counts."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from spectrakit.linalg import flops as F
from spectrakit.linalg import msign, soft_clip, spectral_clip, spectral_hardcap


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
    assert _count(lambda: spectral_clip(x, 0.2, 0.5, dtype=dtype)) == F.hardcap_flops(m, n, dtype, thresholds=2)
    assert _count(lambda: spectral_hardcap(x, 0.5, method="dilation", dtype=dtype)) == F.hardcap_dilation_flops(
        m, n, dtype)
    assert _count(lambda: x @ x.mT if m <= n else x.mT @ x) == F.gram_flops(m, n)


class _CountByDtype(torch.utils._python_dispatch.TorchDispatchMode):
    """Matmul FLOPs (2 per multiply-add) per input dtype, counted from the dispatched mm/bmm calls."""

    def __init__(self):
        super().__init__()
        self.flops: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default):
            a, b = args[0], args[1]
            f = 2.0 * a.numel() * b.shape[-1]
            self.flops[a.dtype] = self.flops.get(a.dtype, 0.0) + f
        return out


@pytest.mark.parametrize("shape", [(16, 40), (40, 16), (24, 24)])
@pytest.mark.parametrize("dtype,steps", [(torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, 9),
                                         (torch.float64, 4)])
def test_flops_by_dtype_match_dispatched_products(shape, dtype, steps):
    x = torch.randn(*shape, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    mode = _CountByDtype()
    with mode:
        soft_clip(x, 0.3, dtype=dtype, steps=steps)
    assert mode.flops == F.soft_clip_polar_flops_by_dtype(*shape, dtype, steps)


def test_cost_model_weights_dtypes():
    # all-bf16 paper vs ours with 3 fp32 steps: the FLOP ratio is ~1 for square, the modelled time is not
    r = F.soft_clip_vs_paper_model(4096, 4096, torch.bfloat16)
    assert 1.0 < r["flops_ratio"] < 1.1
    assert r["time_ratio_fp32"] > r["time_ratio_split_bf16"] > r["time_ratio_tf32"] > r["flops_ratio"]
    fl = F.soft_clip_polar_flops_by_dtype(64, 256, torch.bfloat16)
    assert F.model_time_s(fl) == pytest.approx(fl[torch.float32] / 67e12 + fl[torch.bfloat16] / 990e12)
    # fp32: a single dtype, the model time ratio equals the FLOP ratio
    r32 = F.soft_clip_vs_paper_model(512, 2048, torch.float32)
    assert r32["time_ratio_fp32"] == pytest.approx(r32["flops_ratio"])
