"""conv stage: spectral-norm bounds and exact norms of convolution layers, time and value.

Layers: the Gaussian kernels ``(c, c, k, k)``, ``c`` in 64..512, ``k`` in 3, 5, 7, of Grishina, Gorbunov &
Rakhuba (2024) Table 2 (``K ~ N(0, 1)``, 32 x 32 input) and the convolutions of ResNet-18 (He et al. 2016;
He-normal kernels, their strides); tiny: 8 channels, ``k`` 3 and 5, ResNet-18's channels / 32, an 8 x 8
input, 4 TN restarts of 10 sweeps. Per layer: the TN bound (Grishina et al. 2024, cold start), the F4 bound
(four unfoldings), the exact norm of the circularly padded convolution (Sedghi, Gupta & Long 2019: FFT +
SVD per frequency) and the exact norm of the zero-padded one (power iteration), each with its median time;
ratios to the exact zero-padding norm, and the published Table 2 ratios beside the measured ones.
"""

from __future__ import annotations

import torch

from spectrakit.conv import exact_circular, exact_zero_pad, f4_bound, tn_bound
from spectrakit.experiments.conv_bounds import PAPER
from spectrakit.models.cnn import RESNET18_CONVS

from . import StageResult
from ._measure import error_text, time_ms


def layers(tiny: bool) -> list[tuple[str, tuple[int, int, int, int]]]:
    """(network, (out, in, k, stride)) of every layer of the stage."""
    chans, ks, div = ((8,), (3, 5), 32) if tiny else ((64, 128, 256, 512), (3, 5, 7), 1)
    out = [("Table 2 (Gaussian)", (c, c, k, 1)) for k in ks for c in chans]
    out += [("ResNet-18", (max(1, co // div), ci if ci == 3 else max(1, ci // div), k, s))
            for co, ci, k, s in RESNET18_CONVS]
    return out


def measure(K: torch.Tensor, stride: int, n: int, device, reps: int, exact_iters: int, tn_args: dict) -> dict:
    ex = float(exact_zero_pad(K, n, stride=stride, iters=exact_iters)[0])
    runs = {
        "TN": lambda: tn_bound(K, stride=stride, **tn_args)[0],
        "F4": lambda: f4_bound(K, stride=stride)[0],
        "exact circular": lambda: exact_circular(K, n, stride=stride),
        "exact zero-pad": lambda: exact_zero_pad(K, n, stride=stride, iters=exact_iters)[0],
    }
    row: dict = {}
    for name, fn in runs.items():
        value = ex if name == "exact zero-pad" else float(fn())
        row[name] = value
        row[f"{name} ms"] = time_ms(fn, device, warmup=int(reps > 1), reps=reps)
    row["TN/exact"] = row["TN"] / ex
    row["F4/exact"] = row["F4"] / ex
    return row


def run(ctx) -> StageResult:
    n, reps, iters = (8, 1, 10) if ctx.tiny else (32, 3, 50)
    tn_args = dict(restarts=4, iters=10) if ctx.tiny else {}
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    rows, errors = [], 0
    for net, (co, ci, k, s) in layers(ctx.tiny):
        row: dict = {"network": net, "kernel": f"{co},{ci},{k},{k}", "stride": s, "n": n}
        rows.append(row)
        if ctx.over_budget():
            row["error"] = "skipped: stage time budget spent"
            continue
        try:
            K = torch.randn(co, ci, k, k, generator=gen, device=ctx.device)
            if net == "ResNet-18":
                K = K * (2.0 / (ci * k * k)) ** 0.5
            row.update(measure(K, s, n, ctx.device, reps, iters, tn_args))
            if net.startswith("Table 2") and (co, k) in PAPER:
                exact, f4, tn = PAPER[(co, k)]
                row["published TN/exact"] = tn / exact
                row["published F4/exact"] = f4 / exact
        except Exception as e:
            row["error"] = error_text(e)
            errors += 1
    res = StageResult(tables={"convolution spectral norms": rows}, notes=[
        f"Input {n} x {n}; exact zero-pad: {iters} power iterations; times: median of {reps} calls after "
        "warm-up. published: Grishina, Gorbunov & Rakhuba (2024) Table 2 (not measured here)."])
    if errors:
        res.ok, res.error = False, f"{errors} layer(s) raised (see the error column)"
    return res
