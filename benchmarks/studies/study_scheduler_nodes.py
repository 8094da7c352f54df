"""How many buffers a compiled step hands to inductor's scheduler, in the form inductor lowers it for a GPU.

Usage: ``python benchmarks/studies/study_scheduler_nodes.py [--width 256] [--names "torch AdamW,SpectraAdEMAMix"]``

On a GPU inductor stores (realizes) every output of a ``torch._foreach_*`` operation that a per-tensor operation
reads or that is written in place; on a CPU it does not (no multi-tensor kernels there). This study makes the
CPU's lowering take the GPU's rule (``GraphLowering.has_feature(..., FOREACH)`` answers yes), lowers the traced
multi-tensor step (CUDA's code path, forced) of each optimizer on the 2-layer LLaMA parameter set of
``bench_optim.width_shapes(width)``, and stops at inductor's scheduler: it prints the number of buffers and
operations that reach the scheduler and the seconds spent until then. The scheduler's fusion search is where a
GPU's first compile of SpectraAdEMAMix spent its time (docs/BENCHMARKS.md, "H100 results (2026-11-27, late)");
its input count is a GPU-free proxy for it. No code is generated (the CPU's scheduler cannot fuse the GPU's
multi-tensor nodes). Results: docs/BENCHMARKS.md ("Multi-tensor moment updates in the traced step").
"""
import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/

import torch  # noqa: E402
import torch._inductor.graph as inductor_graph  # noqa: E402
import torch._inductor.scheduler as inductor_scheduler  # noqa: E402
from bench_optim import width_shapes  # noqa: E402
from torch._inductor.codegen.common import BackendFeature  # noqa: E402

import spectrakit.optim as O  # noqa: E402
from spectrakit.optim.spectra import Spectra  # noqa: E402


class _Stop(Exception):
    """Raised at the scheduler: the lowering is done."""


def count(name: str, width: int) -> tuple[int, float]:
    """(buffers and operations into inductor's scheduler, seconds from the first call to the scheduler)."""
    torch._dynamo.reset()
    seen = {}

    def at_scheduler(self, nodes):
        seen["n"] = len(nodes)
        raise _Stop()

    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in width_shapes(width)]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-2
    if name == "torch AdamW":
        opt = torch.optim.AdamW(ps, lr=1e-3, foreach=True)
    elif name in ("Muon", "DMuon"):
        opt = getattr(O, name)([p for p in ps if p.ndim == 2], lr=0.02)
    else:
        opt = getattr(O, name)(ps, lr=1e-3)
    step = torch.compile(opt.step)
    saved = inductor_scheduler.Scheduler.__init__
    inductor_scheduler.Scheduler.__init__ = at_scheduler
    t = time.perf_counter()
    try:
        step()
    except Exception as e:  # inductor wraps the stop in its own error
        if "_Stop" not in repr(e) and not isinstance(e, _Stop):
            raise
    finally:
        inductor_scheduler.Scheduler.__init__ = saved
    return seen["n"], time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--names", default="torch AdamW,SpectraAdamW,SpectraAdEMAMix,SpectraMARS,AdEMAMix,MARS",
                    help="comma-separated: torch AdamW (foreach) or any spectrakit.optim preset")
    a = ap.parse_args()
    torch.set_num_threads(1)
    original = inductor_graph.GraphLowering.has_feature

    def has_feature(self, device, feature):
        return True if feature == BackendFeature.FOREACH else original(self, device, feature)

    inductor_graph.GraphLowering.has_feature = has_feature
    Spectra._per_tensor = staticmethod(lambda device: False)  # the multi-tensor (CUDA) code path
    print(f"torch {torch.__version__}, d = {a.width}, multi-tensor path, the GPU's foreach realization, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for name in a.names.split(","):
        n, s = count(name.strip(), a.width)
        print(f"{name.strip():16s} {n:4d} buffers and operations into the scheduler ({s:.1f} s to lower)")


if __name__ == "__main__":
    main()
