"""spectrakit ``Muon`` against ``torch.optim.Muon``: step time, side by side, on the 2-D parameters of the
2-layer LLaMA parameter sets of ``bench_optim.py --widths`` (``width_shapes(d)``: embedding, q/k/v/o, SwiGLU
gate/up/down, head; ``torch.optim.Muon`` takes 2-D parameters only).

Both optimizers start from the same weights and gradients (fixed across steps, as in ``bench_optim.py``) and
run in one process, in interleaved rounds (one step of each per round, the order alternating from round to
round, so that a change of machine load hits both); the table gives the medians of the step times and of the
per-round ratios ``spectrakit / torch``, by wall clock and by this thread's CPU time (the CPU time leaves out
the time the process waited for a core, so it is the steadier of the two on a shared machine; a host that
takes the whole VM off its cores still counts as CPU time, so the ratios of the lower quartiles and of the
minima of each optimizer's step times are given too), and those of ``Muon(check_finite=False)`` (no
non-finite check, no skip: torch's behaviour) and ``Muon(post="newton_schulz5_batched")`` (one batched
product per same-shape stack on the CPU too). ``outside
products ms``: time of one step outside the matrix products (the profiler's self time of every other op and
of the Python code between them; wall time of those ops, so it includes waiting on a loaded machine): what a
step adds around the Newton-Schulz products. After the
rounds it checks that the momentum buffers are bit-identical
and reports the largest parameter difference (relative to the largest parameter entry).

Where bf16 matmuls are emulated in software (CPUs without AMX/AVX512-BF16), the Newton-Schulz iteration of
both optimizers (bf16, as published) dominates the step: a width whose estimated step (Newton-Schulz FLOPs at
the measured bf16 matmul rate) exceeds ``--max-step-s`` is skipped and listed; ``--ns-steps`` (1..5, both
optimizers) shortens the iteration to measure large widths at a fifth of the cost (the per-step work is the
same, so the ratio measures the same code).

On CUDA (``--device cuda``) the step times are device-synchronised wall times (no CPU-time column), and
the products run on the tensor cores in bf16 as in both published loops.

Usage: ``python benchmarks/bench_muon.py --widths 192,256,512 --reps 5`` (writes its section, one per widths and
``--ns-steps``, of docs/results/bench/ unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import command_line, parse_widths, write_section  # noqa: E402
from benchmarks.bench_optim import matmul_tflops, width_shapes  # noqa: E402
from spectrakit.experiments.io import environment, markdown_table  # noqa: E402
from spectrakit.linalg import bf16_matmul_fast  # noqa: E402
from spectrakit.optim import Muon  # noqa: E402


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else the platform's."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def muon_shapes(d: int) -> list[tuple[int, int]]:
    """The 2-D parameters of the 2-layer LLaMA parameter set of width ``d``."""
    return [s for s in width_shapes(d) if len(s) == 2]


def ns_flops(shapes, ns_steps: int) -> float:
    """Matmul FLOPs of Muon's Newton-Schulz on every matrix: per step ``X X^T`` (2 m^2 n), ``A A`` (2 m^3)
    and ``B X`` (2 m^2 n) with ``m <= n``."""
    total = 0.0
    for s in shapes:
        m, n = sorted(s)
        total += ns_steps * (4 * m * m * n + 2 * m**3)
    return total


_MATMULS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::matmul"}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _step_s(opt, device: str = "cpu") -> tuple[float, float]:
    """Wall-clock and CPU (this thread's) seconds of one step (device-synchronised on CUDA)."""
    _sync(device)
    w0, c0 = time.perf_counter(), time.thread_time()
    opt.step()
    _sync(device)
    return time.perf_counter() - w0, time.thread_time() - c0


def outside_matmul_ms(opt) -> float:
    """Milliseconds of one step spent outside the matrix products (the profiler's self time of every other op
    and of the Python code between them): the work a step adds around the Newton-Schulz products."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        opt.step()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key not in _MATMULS) / 1e3


def bench_width(d: int, reps: int, ns_steps: int, lr: float = 0.02, device: str = "cpu") -> dict:
    """One width: interleaved rounds of a ``torch.optim.Muon`` and a spectrakit ``Muon`` step (weight decay
    0.1, Nesterov momentum 0.95, the original ``max(1, m/n)^0.5`` scale), medians and the parity checks."""
    shapes = muon_shapes(d)
    gen = torch.Generator().manual_seed(d)
    init = [(torch.randn(s, generator=gen) * 0.02).to(device) for s in shapes]
    grads = [(torch.randn(s, generator=gen) * 1e-2).to(device) for s in shapes]

    def params():
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        return ps

    ref = torch.optim.Muon(params(), lr=lr, weight_decay=0.1, ns_steps=ns_steps)
    ours = Muon(params(), lr=lr, weight_decay=0.1, post_steps=ns_steps)
    unchecked = Muon(params(), lr=lr, weight_decay=0.1, post_steps=ns_steps, check_finite=False)
    batched = Muon(params(), lr=lr, weight_decay=0.1, post_steps=ns_steps, post="newton_schulz5_batched")
    opts = {"torch": ref, "spectrakit": ours, "unchecked": unchecked, "batched": batched}
    for opt in opts.values():
        opt.step()  # allocate state
        opt.step()  # CUDA: kernels loaded, workspaces allocated
    times: dict[str, list[float]] = {k: [] for k in opts}
    cpu: dict[str, list[float]] = {k: [] for k in opts}
    for r in range(reps):
        order = list(opts) if r % 2 == 0 else list(opts)[::-1]
        for k in order:
            wall, c = _step_s(opts[k], device)
            times[k].append(wall)
            cpu[k].append(c)
    cuda = device.startswith("cuda")
    outside = {k: float("nan") if cuda else outside_matmul_ms(opt) for k, opt in opts.items()}

    def med(xs):
        return sorted(xs)[len(xs) // 2]

    def q1(xs):
        return sorted(xs)[len(xs) // 4]

    def per_round(k, clock=cpu):
        return [a / b for a, b in zip(clock[k], clock["torch"])]

    def vs_torch(k, stat):  # a host that takes the VM off its cores adds seconds to random rounds (seen as
        return stat(cpu[k]) / stat(cpu["torch"])  # CPU time by the guest): q1 and min are the rounds least hit

    ratios, cpu_ratios = per_round("spectrakit", times), per_round("spectrakit")
    unchecked_ratios, batched_ratios = per_round("unchecked"), per_round("batched")
    q1_ratio, min_ratio = vs_torch("spectrakit", q1), vs_torch("spectrakit", min)
    unchecked_q1, batched_q1 = vs_torch("unchecked", q1), vs_torch("batched", q1)
    pr, po = ref.param_groups[0]["params"], ours.param_groups[0]["params"]
    same_m = all(torch.equal(ref.state[a]["momentum_buffer"], ours.state[b]["momentum_buffer"])
                 for a, b in zip(pr, po))
    with torch.no_grad():
        diff = max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(pr, po))
        diff_b = max(float((a - b).abs().max() / a.abs().max())
                     for a, b in zip(pr, batched.param_groups[0]["params"]))
    if cuda:
        cpu = {k: [float("nan")] for k in opts}
        cpu_ratios = unchecked_ratios = batched_ratios = [float("nan")]
        q1_ratio = min_ratio = unchecked_q1 = batched_q1 = float("nan")
    return {"d": d, "matrices": len(shapes), "params (M)": sum(math.prod(s) for s in shapes) / 1e6,
            "ns steps": ns_steps, "torch ms": med(times["torch"]) * 1e3,
            "spectrakit ms": med(times["spectrakit"]) * 1e3, "spectrakit / torch": med(ratios),
            "ratio min..max": f"{min(ratios):.3f}..{max(ratios):.3f}",
            "torch CPU ms": med(cpu["torch"]) * 1e3, "spectrakit CPU ms": med(cpu["spectrakit"]) * 1e3,
            "CPU-time ratio": med(cpu_ratios), "CPU ratio min..max": f"{min(cpu_ratios):.3f}..{max(cpu_ratios):.3f}",
            "CPU ms q1 ratio": q1_ratio, "CPU ms min ratio": min_ratio,
            "check_finite=False CPU-time ratio": med(unchecked_ratios), "check_finite=False q1 ratio": unchecked_q1,
            "batched post CPU-time ratio": med(batched_ratios), "batched post q1 ratio": batched_q1,
            "outside products ms (torch)": outside["torch"], "outside products ms (spectrakit)": outside["spectrakit"],
            "momentum bit-identical": same_m, "max param diff (rel)": diff, "batched post max param diff": diff_b}


def bench_ns_loops(d: int, reps: int, ns_steps: int) -> list[dict]:
    """The Newton-Schulz iteration alone on the same-shape stacks the optimizer forms at width ``d``:
    torch.optim.Muon's per-matrix function, ``linalg.msign(normalize="frobenius")`` (per matrix on the CPU)
    and its batched ``bmm``/``baddbmm`` loop (the one used on GPUs), in interleaved rounds; medians of the
    per-round CPU-time ratios to torch. All three give the same bits (checked)."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from spectrakit.linalg import msign
    from spectrakit.linalg.polar import _frobenius_iterate, to_wide
    from spectrakit.linalg.schedules import SCHEDULES

    coeffs = SCHEDULES["muon"](ns_steps, None)
    stacks: dict[tuple, int] = {}
    for s in muon_shapes(d):
        stacks[s] = stacks.get(s, 0) + 1
    gen = torch.Generator().manual_seed(d)
    batches = [torch.randn(b, *s, generator=gen) for s, b in stacks.items()]

    def torch_loop():
        return [torch.stack([_zeropower_via_newtonschulz(m, coeffs[0], ns_steps, 1e-7) for m in x]).float()
                for x in batches]

    def batched():
        out = []
        for x in batches:
            w, transposed = to_wide(x.bfloat16())
            out.append(_frobenius_iterate(w, coeffs, torch.float32, transposed, per_matrix=False))
        return out

    def ours():
        return [msign(x, schedule="muon", steps=ns_steps, dtype=torch.bfloat16, normalize="frobenius")
                for x in batches]

    fns = {"torch.optim.Muon's function, per matrix": torch_loop, "msign (per matrix on CPU)": ours,
           "msign's batched bmm/baddbmm loop": batched}
    ref = torch_loop()
    same = {k: all(torch.equal(a, b) for a, b in zip(ref, f())) for k, f in fns.items()}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(reps):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            c0 = time.thread_time()
            fns[k]()
            cpu[k].append(time.thread_time() - c0)
    base = cpu["torch.optim.Muon's function, per matrix"]
    rows = []
    for k, ts in cpu.items():
        ratios = sorted(a / b for a, b in zip(ts, base))
        desc = " ".join(f"{b}x{s[0]}x{s[1]}" for s, b in stacks.items())
        rows.append({"d": d, "Newton-Schulz loop": k, "stacks": desc,
                     "ns steps": ns_steps, "CPU ms": sorted(ts)[len(ts) // 2] * 1e3,
                     "CPU-time ratio to torch": ratios[len(ratios) // 2],
                     "min..max": f"{ratios[0]:.3f}..{ratios[-1]:.3f}", "same bits as torch": same[k]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="192,256,512,1024",
                        help="comma-separated model widths (2-layer LLaMA parameter sets, vocab 2048)")
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds per width (>= 1)")
    parser.add_argument("--ns-steps", type=int, default=5, help="Newton-Schulz steps of both optimizers (1..5)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--max-step-s", type=float, default=300.0,
                        help="skip a width whose estimated step exceeds this many seconds")
    parser.add_argument("--ns-loops", action="store_true",
                        help="time the Newton-Schulz loops alone (torch's per-matrix function, ours per matrix, "
                             "ours batched) instead of the optimizer steps")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/results/bench/KEY.md")
    args = parser.parse_args()
    widths = parse_widths(parser, args.widths, "--widths")
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if not 1 <= args.ns_steps <= 5:
        parser.error(f"--ns-steps must be in 1..5, got {args.ns_steps}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here")
    if args.device.startswith("cuda") and args.ns_loops:
        parser.error("--ns-loops times CPU loops: use it without --device cuda")
    if not hasattr(torch.optim, "Muon"):
        sys.exit("error: torch.optim.Muon (the reference) needs torch >= 2.9")
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    rows = []
    if args.ns_loops:
        for d in widths:
            rows += bench_ns_loops(d, args.reps, args.ns_steps)
    for d in [] if args.ns_loops else widths:
        rate = matmul_tflops(args.device, torch.bfloat16, min(d, 512)) * 1e12
        est = ns_flops(muon_shapes(d), args.ns_steps) / rate
        if est > args.max_step_s:
            rows.append({"d": d, "ns steps": args.ns_steps,
                         "torch ms": f"skipped: estimated {est:.0f} s/step (bf16 matmul {rate / 1e9:.2f} GFLOP/s)"})
            continue
        rows.append(bench_width(d, args.reps, args.ns_steps, device=args.device))
        print(rows[-1], flush=True)
    env = environment()
    title = (
        "### optim: Muon's Newton-Schulz loops against torch.optim.Muon's (the optimizer's stacks, interleaved "
         "rounds)\n\n" if args.ns_loops else
         "### optim: Muon against torch.optim.Muon (2-D parameters of the 2-layer LLaMA sets, interleaved rounds)\n\n")
    text = title + (
        f"device: {env['device']}, {cpu_model()}, {os.cpu_count()} cores · torch {env['torch']} · "
        f"threads {torch.get_num_threads()} · CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()} · bf16 matmuls fast: {bf16_matmul_fast(args.device)} · "
        f"{env['date']} · load average {load[0]:.1f} (start), {os.getloadavg()[0]:.1f} (end) · "
        f"{args.reps} rounds\n\ncommand: `{command_line()}`\n\n" + markdown_table(rows) + "\n"
    )
    print(text)
    if not args.no_write:
        kind = "ns-loops" if args.ns_loops else "steps"
        dev = torch.device(args.device).type
        write_section(f"muon-vs-torch-{dev}-{kind}-{args.widths}-ns{args.ns_steps}", text)


if __name__ == "__main__":
    main()
