"""First ``torch.compile`` (inductor) of ``opt.step``: compile time, recompiles, compiled and eager step.

Usage: ``python benchmarks/bench_compile.py [--device cuda] [--width 256] [--budget 300] [--names A,B]
[--rounds N] [--multi-tensor] [--polar-lmo] [--inductor-config KEY=VALUE ...] [--phases]``

Each optimizer (torch AdamW foreach, SpectraAdamW, SpectraSignum, Muon, torch.optim.Muon) runs in a fresh
process with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a new temporary folder), on the 2-layer LLaMA
parameter set of ``bench_optim.width_shapes(width)`` (the Muons on its matrices: ``torch.optim.Muon`` takes
matrices only); one line each: the first call's time (the compile), the second call's, ``unique_graphs`` after
the first call and after calls 2-4 (a recompile if it grew), and the medians of 20 compiled and 20 eager steps
in interleaved rounds (CUDA-synchronised on a GPU) with the host's minor page faults per step (medians; a CPU
allocator that returns freed blocks to the system page-faults the next step's tensors in) and the most memory the
tensors of one step took at once (beyond those alive before it: the CUDA allocator's peak, or on a CPU the sum of
the allocations and frees that the torch profiler records), the first call's CPU seconds (this process and its
compiler subprocesses: less sensitive to a shared machine's load than the wall time), inductor's generated kernel
count (``torch._inductor.metrics.generated_kernel_count``) and the nodes of the traced graph. ``--names`` picks
some of the optimizers (comma-separated, e.g. ``"torch AdamW,SpectraAdamW"``; every preset, and the nuclear
Frank-Wolfe, ``linf_fw`` and hard-clip posts as ``"SpectraSignum nuclear"`` etc.: ``--help`` lists them;
``"SpectraAdamW flag copies"``: every batch of the traced step reads its own copy of the skip flag, the CPU's
form, on any device);
``--rounds N`` runs that list N times (name torch AdamW between the others to alternate) and ends with each
optimizer's median CPU seconds and its ratio to torch AdamW's; ``--multi-tensor`` makes the spectrakit
optimizers take the multi-tensor code path (CUDA's) on the CPU as well, to study it there, and ``--polar-lmo``
the Frank-Wolfe posts their polar route (CUDA's; on the CPU they take the float64 Gram route);
``--inductor-config loop_ordering_after_fusion=False`` sets that ``torch._inductor.config`` entry in every
optimizer's process (a Python literal; repeat the option for more); ``--phases`` also prints where each first
compile went (the wall seconds of torch's timed compile stages, ``torch._dynamo.utils.compilation_time_metrics``:
tracing, AOT, lowering, scheduling and fusion, code generation; nested stages overlap). Optimizers not started
within ``--budget`` seconds are skipped. Results:
docs/BENCHMARKS.md (current figures; earlier runs: docs/results/history-2026-11/BENCHMARKS.md).
"""
import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ["torch AdamW", "SpectraAdamW", "SpectraSignum", "Muon", "torch Muon"]
# every other preset (--names); the Frank-Wolfe and hard-clip posts as SPECTRA variants
PRESETS = ["AdamW", "SGD", "Lion", "Signum", "AdEMAMix", "MARS", "DMuon", "SpectraSGD", "SpectraLion",
           "SpectraAdEMAMix", "SpectraMARS"]
VARIANTS = {"SpectraSignum nuclear": ("SpectraSignum", dict(post="spectral_lmo", regularizer="nuclear", b=0.1)),
            "SpectraSignum linf_fw": ("SpectraSignum", dict(post="linf_fw")),
            "SpectraAdamW hardcap": ("SpectraAdamW", dict(post="hardcap"))}
# SpectraAdamW with a copy of the skip flag per batch on any device (the CPU's traced form; bases.stored)
FLAG_COPIES = {"SpectraAdamW flag copies": "SpectraAdamW"}
ALL = NAMES + PRESETS + list(VARIANTS) + list(FLAG_COPIES)


def make(name, ps):
    import torch

    import spectrakit.optim as O

    if name == "torch AdamW":
        return torch.optim.AdamW(ps, lr=1e-3, foreach=True)
    if name == "torch Muon":
        return torch.optim.Muon(ps, lr=0.02)
    if name in ("Muon", "DMuon"):
        return getattr(O, name)(ps, lr=0.02)
    name = FLAG_COPIES.get(name, name)
    if name in VARIANTS:
        cls, kw = VARIANTS[name]
        return getattr(O, cls)(ps, lr=1e-3, **kw)
    return getattr(O, name)(ps, lr=1e-3)


def inductor_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> (key, value) for ``torch._inductor.config``; ``ValueError`` naming what is wrong."""
    import ast

    import torch._inductor.config as config

    key, sep, value = text.partition("=")
    if not sep or not hasattr(config, key.strip()):
        raise ValueError(f"--inductor-config expects KEY=VALUE with KEY a torch._inductor.config entry, got {text!r}")
    try:
        return key.strip(), ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        raise ValueError(f"--inductor-config {text!r}: the value must be a Python literal (True, 64, 'x')") from None


def one(name, device, width, multi_tensor=False, settings=(), phases=False, polar_lmo=False):
    import torch
    import torch._inductor.config as config
    import torch._inductor.metrics as metrics
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx

    if multi_tensor or name in FLAG_COPIES:
        from spectrakit.optim.spectra import Spectra

        if multi_tensor:  # CUDA's code path: multi-tensor kernels (and so no per-batch copies of the skip flag)
            Spectra._per_tensor = staticmethod(lambda device: False)
        if name in FLAG_COPIES:  # every batch reads its own copy of the skip flag, on any device
            Spectra._flag_copies = staticmethod(lambda device: True)

    if polar_lmo:  # the Frank-Wolfe posts take the polar route (CUDA's default) on the CPU too
        import spectrakit.linalg.lmo as lmo

        lmo.GRAM_DEVICE_TYPES = ()
    for text in settings:
        setattr(config, *inductor_setting(text))
    sys.path.insert(0, ROOT)
    from benchmarks.bench_optim import width_shapes

    cuda = device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    shapes = width_shapes(width)
    if "Muon" in name:
        shapes = [s for s in shapes if len(s) == 2]
    gen = torch.Generator(device=device).manual_seed(0)
    init = [torch.randn(s, device=device, generator=gen) * 0.02 for s in shapes]
    grads = [torch.randn(s, device=device, generator=gen) * 1e-2 for s in shapes]

    def params():
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        return ps

    opt, ref = make(name, params()), make(name, params())
    nodes = []

    def inductor(gm, example_inputs):  # inductor, after counting the traced graph's nodes
        nodes.append(sum(1 for n in gm.graph.nodes if n.op == "call_function"))
        return compile_fx(gm, example_inputs)

    step = torch.compile(opt.step, backend=inductor)
    sync()
    t, c0 = time.perf_counter(), os.times()
    step()
    sync()
    first, c1 = time.perf_counter() - t, os.times()
    cpu = sum(c1[:4]) - sum(c0[:4])  # user + system, with the compiler subprocesses waited for
    kernels = metrics.generated_kernel_count
    g1 = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    if phases:  # where the first call's compile went: torch's timed compile stages (nested: they overlap)
        from torch._dynamo.utils import compilation_time_metrics

        spent = sorted(((sum(v), k) for k, v in compilation_time_metrics.items()), reverse=True)[:14]
        print(f"phases {name}: " + ", ".join(f"{k} {x:.2f} s" for x, k in spent), flush=True)
    t = time.perf_counter()
    step()
    sync()
    second = time.perf_counter() - t
    step()
    step()
    sync()
    g4 = counters["stats"]["unique_graphs"]

    def timed(fn):  # (ms, the host's minor page faults during the call)
        f, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t) * 1e3, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f

    ref.step()  # the eager optimizer's warm-up call (the compiled one has had four)
    sync()
    xs = {"compiled": [], "eager": []}
    for r in range(20):  # interleaved rounds, the order alternating: a drift of the machine hits both alike
        pair = (("compiled", step), ("eager", ref.step))
        for key, fn in pair if r % 2 == 0 else pair[::-1]:
            xs[key].append(timed(fn))
    ce, ee = (statistics.median(t for t, _ in xs[k]) for k in ("compiled", "eager"))
    cf, ef = (statistics.median(f for _, f in xs[k]) for k in ("compiled", "eager"))

    def peak_mib(fn):  # the most memory the step's tensors took at once beyond what was allocated before it
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - base) / 2**20
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        now = most = 0
        for e in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns()):
            now += e.nbytes()
            most = max(most, now)
        return most / 2**20

    cm, em = peak_mib(step), peak_mib(ref.step)
    print(f"{name:14s} device {device} d={width}{' multi-tensor' if multi_tensor else ''}: first compile "
          f"{first:.1f} s (CPU {cpu:.1f} s, {kernels} kernels, {'+'.join(map(str, nodes))} graph nodes), "
          f"{breaks} graph breaks, 2nd call {second:.3f} s, "
          f"unique_graphs {g1} after call 1, {g4} after calls 2-4 ({'recompiled' if g4 > g1 else 'no recompile'}), "
          f"compiled {ce:.3f} ms, eager {ee:.3f} ms (medians of 20 interleaved rounds), compiled/eager {ce / ee:.2f}, "
          f"page faults per step {cf:.0f} compiled, {ef:.0f} eager, peak memory of a step {cm:.1f} MiB compiled, "
          f"{em:.1f} MiB eager", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available, else cpu)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--names", default=",".join(NAMES), help="comma-separated, among: " + ", ".join(ALL))
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the --names list this many times (list torch AdamW between the others to alternate)")
    ap.add_argument("--multi-tensor", action="store_true",
                    help="spectrakit optimizers take the multi-tensor (CUDA) code path on the CPU too")
    ap.add_argument("--polar-lmo", action="store_true",
                    help="the Frank-Wolfe posts take their polar route (CUDA's default) on the CPU too, not the "
                         "float64 Gram route")
    ap.add_argument("--inductor-config", action="append", default=[], metavar="KEY=VALUE",
                    help="set torch._inductor.config.KEY = VALUE (a Python literal) in each optimizer's process, e.g. "
                         "loop_ordering_after_fusion=False; repeatable")
    ap.add_argument("--phases", action="store_true",
                    help="also print where each first compile went (torch's timed compile stages, wall seconds; "
                         "nested stages overlap)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    for text in a.inductor_config:
        try:
            inductor_setting(text)
        except ValueError as e:
            ap.error(str(e))
    names = [n.strip() for n in a.names.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL]
    if unknown or not names:
        ap.error(f"--names: unknown {unknown or names}; accepted: {', '.join(ALL)}")
    if a.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {a.rounds}")
    if a.one:
        one(a.one, a.device, a.width, a.multi_tensor, a.inductor_config, a.phases, a.polar_lmo)
        return
    import torch

    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: this torch has no CUDA device (torch {torch.__version__}); use --device cpu")
    where = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {where}, threads {torch.get_num_threads()}, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average {load}"
          + "".join(f", inductor {text}" for text in a.inductor_config), flush=True)
    start = time.time()
    cpu = {}
    for name in names * a.rounds:
        if time.time() - start > a.budget:
            print(f"{name}: skipped (over {a.budget:.0f} s)", flush=True)
            continue
        cache = tempfile.mkdtemp(prefix="inductor_cold_")
        path = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONPATH=path)
        try:
            left = max(10.0, a.budget + 50 - (time.time() - start))
            cmd = [sys.executable, __file__, "--one", name, "--device", a.device, "--width", str(a.width)]
            cmd += ["--multi-tensor"] if a.multi_tensor else []
            cmd += ["--polar-lmo"] if a.polar_lmo else []
            cmd += [f"--inductor-config={text}" for text in a.inductor_config]
            cmd += ["--phases"] if a.phases else []
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left)
            lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
            for line in lines[:-1] if r.returncode == 0 else ():
                if line.startswith("phases "):
                    print(line, flush=True)
            print(lines[-1] if r.returncode == 0 and lines else f"{name}: failed rc={r.returncode}: {r.stderr[-600:]}",
                  flush=True)
            m = re.search(r"\(CPU ([0-9.]+) s", lines[-1]) if r.returncode == 0 and lines else None
            if m:
                cpu.setdefault(name, []).append(float(m.group(1)))
        except subprocess.TimeoutExpired:
            print(f"{name}: timed out", flush=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    ref = statistics.median(cpu["torch AdamW"]) if "torch AdamW" in cpu else None
    for name, xs in cpu.items():  # the first compile's CPU seconds: median over the rounds, / torch AdamW's
        ratio = f", {statistics.median(xs) / ref:.2f}x torch AdamW's median" if ref else ""
        print(f"summary {name:22s} CPU s {', '.join(f'{x:.1f}' for x in xs)}: median {statistics.median(xs):.1f}"
              f"{ratio}", flush=True)
    print(f"total {time.time() - start:.0f} s, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
          flush=True)


if __name__ == "__main__":
    main()
