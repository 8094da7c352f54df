"""Study: does the compiled step (``torch.compile(opt.step, backend=...)``) equal the eager step bit for bit?

Five parameters ((64, 32) twice, (32, 64), (48, 48), (32,)), four steps with fresh gradients, one of them with a
NaN (a skipped step); ``"torch Muon"`` (``torch.optim.Muon``, the reference a compiled Muon is held to) takes the
four matrices and no NaN (it has no skipped step). Prints, per optimizer and backend, whether the parameters are
bit-identical and the largest difference relative to the largest entry.

Usage: ``python benchmarks/studies/study_compile_equal.py [--device cuda] [--names SpectraAdamW,Muon]
[--backends aot_eager] [--post-dtype float32] [--trace-post] [--exact-bf16-reductions] [--diff-detail]``.

``--trace-post`` records every call of the matrix post-transform (Muon's Newton-Schulz) in the eager and the
compiled step and prints, call by call, whether the input layouts (shape, strides, storage offset, data pointer
modulo 256 bytes, dtype), the input values and the output values agree: where a compiled step differs, this says
whether the transform got other inputs or gave other outputs for the same ones. (The first calls are each
optimizer's warm-up on small matrices; in the step with the NaN, which both skip, the inputs differ: the eager
step zeroes only the gradient's non-finite entries, the traced one the whole gradient.) ``--exact-bf16-reductions`` sets
``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False`` first (cuBLAS may otherwise choose
reduced-precision reductions in bf16 products, differently for differently laid-out inputs). ``--diff-detail``
prints, per parameter, how many entries differ and the largest difference in units of the learning rate (a sign
optimizer's entry whose sign flipped differs by 2 lr).
Results: docs/BENCHMARKS.md ("H100 results", fourth run).
"""
import argparse
import time

import torch

import spectrakit.optim as O
from spectrakit.optim.transforms import POST_TRANSFORMS

CALLS: dict[str, list] = {"eager": [], "compiled": []}
_WHO = ["eager"]


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.data_ptr() % 256, str(t.dtype))


def _recording(fn):
    """``fn`` that also keeps (input layout, input copy, output copy) of each call under the current label."""
    def wrapper(U, *args, **kwargs):
        out = fn(U, *args, **kwargs)
        CALLS[_WHO[0]].append((_layout(U), U.detach().clone(), out.detach().clone()))
        return out

    return wrapper


def post_report() -> str:
    """Call by call: eager against compiled post-transform inputs and outputs (``--trace-post``)."""
    lines = []
    for i, (e, c) in enumerate(zip(CALLS["eager"], CALLS["compiled"])):
        same_in = e[1].shape == c[1].shape and torch.equal(e[1], c[1])
        same_out = e[2].shape == c[2].shape and torch.equal(e[2], c[2])
        lay = "same layout" if e[0] == c[0] else f"layouts eager {e[0]} compiled {c[0]}"
        lines.append(f"  post call {i}: inputs equal={same_in} outputs equal={same_out}, {lay}")
    if len(CALLS["eager"]) != len(CALLS["compiled"]):
        lines.append(f"  calls: eager {len(CALLS['eager'])}, compiled {len(CALLS['compiled'])}")
    for v in CALLS.values():
        v.clear()
    return "\n".join(lines)

SHAPES = [(64, 32), (64, 32), (32, 64), (48, 48), (32,)]


def compare(name: str, backend: str, dev: str, post_dtype: str | None = None, detail: bool = False) -> str:
    torch._dynamo.reset()
    shapes = [s for s in SHAPES if len(s) == 2] if name == "torch Muon" else SHAPES
    gen = torch.Generator(device=dev).manual_seed(0)
    init = [torch.randn(s, device=dev, generator=gen) for s in shapes]
    grads = [[torch.randn(s, device=dev, generator=gen) for s in shapes] for _ in range(4)]
    if name != "torch Muon":
        grads[2][0][0, 0] = float("nan")
    eager_ps = [torch.nn.Parameter(t.clone()) for t in init]
    traced_ps = [torch.nn.Parameter(t.clone()) for t in init]
    kw = dict(lr=0.02) if "Muon" in name else dict(lr=1e-2)
    if post_dtype is not None and "Muon" in name:
        kw["post_dtype"] = post_dtype
    make = torch.optim.Muon if name == "torch Muon" else getattr(O, name)
    if name == "torch Muon":
        kw.pop("post_dtype", None)
    eager, traced = make(eager_ps, **kw), make(traced_ps, **kw)
    step = torch.compile(traced.step, backend=backend)
    for gs in grads:
        for pa, pb, g in zip(eager_ps, traced_ps, gs):
            pa.grad, pb.grad = g.clone(), g.clone()
        _WHO[0] = "eager"
        eager.step()
        _WHO[0] = "compiled"
        step()
    rel = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item() for a, b in zip(eager_ps, traced_ps))
    same = all(torch.equal(a, b) for a, b in zip(eager_ps, traced_ps))
    out = f"bit-identical={same} max rel diff {rel:.2e}"
    if detail:  # per parameter: entries that differ, and the largest difference in units of the learning rate
        out += "".join(f"\n  param {i} {tuple(a.shape)}: {int((a != b).sum())} of {a.numel()} entries differ, "
                       f"largest |difference| {((a - b).abs().max() / kw['lr']).item():.4g} lr"
                       for i, (a, b) in enumerate(zip(eager_ps, traced_ps)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--names", default="SpectraAdamW,SpectraSignum,Muon,Lion,AdamW",
                    help="comma-separated spectrakit presets, and 'torch Muon' (torch.optim.Muon)")
    ap.add_argument("--backends", default="aot_eager")
    ap.add_argument("--post-dtype", default=None,
                    help="the Muons' Newton-Schulz dtype (post_dtype), e.g. float32; default: the optimizer's")
    ap.add_argument("--trace-post", action="store_true",
                    help="compare the matrix post-transform's inputs and outputs call by call (module docstring)")
    ap.add_argument("--exact-bf16-reductions", action="store_true",
                    help="torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False")
    ap.add_argument("--diff-detail", action="store_true",
                    help="per parameter: how many entries differ, and the largest difference in units of lr")
    a = ap.parse_args()
    if a.exact_bf16_reductions:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    if a.trace_post:
        for key in ("newton_schulz5", "newton_schulz5_spectral"):
            POST_TRANSFORMS[key] = _recording(POST_TRANSFORMS[key])
    for name in a.names.split(","):
        for backend in a.backends.split(","):
            t0 = time.time()
            try:
                out = compare(name, backend, a.device, a.post_dtype, a.diff_detail)
            except Exception as e:  # a backend that fails to compile is a result here
                out = f"FAILED {type(e).__name__}: {str(e)[:300]}"
            print(f"{name:14s} {backend:10s} {out} ({time.time() - t0:.1f} s)", flush=True)
            if a.trace_post and (CALLS["eager"] or CALLS["compiled"]):
                print(post_report(), flush=True)


if __name__ == "__main__":
    main()
