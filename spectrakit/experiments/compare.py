"""Train a small LLaMA-style LM with several optimizers and compare them: the runs, their rows and results.

What the command does and its options: :mod:`spectrakit.experiments.compare_cli` (its description).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shlex
import sys
import time

import torch

from spectrakit._checks import check_choice, check_int
from spectrakit._cliargs import UsageError
from spectrakit._files import read_regular, write_atomic
from spectrakit.data.batches import TokenBatches
from spectrakit.data.tokens import prepare, unigram_entropy
from spectrakit.experiments import resources, runfolders
from spectrakit.experiments.compare_cli import SETTINGS, add_arguments  # noqa: F401 (compare's options)
from spectrakit.experiments.compare_plots import plot
from spectrakit.experiments.io import report
from spectrakit.models.llama import PRESETS, Llama, preset_config
from spectrakit.train import interrupt
from spectrakit.train.checkpoint import candidates, prune
from spectrakit.train.diagnostics import NoiseStructure, SpectralDiagnostics
from spectrakit.train.distributed import PARALLEL_MODES, DistInfo, barrier, setup, teardown, wrap_model
from spectrakit.train.loop import CHECKPOINTS, TrainConfig, train
from spectrakit.train.optimizers import OPTIMIZERS, build_optimizer
from spectrakit.train.schedules import SCHEDULES, make_scheduler

COLUMNS = [
    "optimizer",
    "seed",
    "lr",
    "val_loss",
    "val_ppl",
    "step_ms",
    "overhead_%",
    "max_weight_sn",
    "max_update_sn",
    "agg_linf",
    "diverged",
]


@dataclasses.dataclass
class CompareOptions:
    """Options of :func:`compare` (see ``spectrakit compare --help``)."""

    optimizers: tuple[str, ...] = ("adamw", "spectra-adamw")
    setting: str = "auto"
    preset: str | None = None
    corpus: str = "stdlib"
    tokenizer: str | None = None
    steps: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    grad_accum: int = 1
    warmup: int | None = None
    schedule: str = "wsd"
    lr: float | None = None
    c: float = 10.0
    embedding_scale: float | None = None
    weight_decay: float = 0.1
    grad_clip: float | None = 0.5
    seeds: tuple[int, ...] = (0,)
    eval_every: int | None = None
    eval_tokens: int | None = None
    diag_every: int | None = None
    noise_steps: tuple[int, ...] = ()
    noise_signal_batches: int = 16
    noise_samples: int = 8
    device: str | None = None
    parallel: str = "ddp"
    compile: bool = False
    out: str | None = "runs/compare"
    progress: bool = True
    ckpt_every: int | None = None
    resume: bool = False
    resource_check: bool = True

    def resolved(self) -> dict:
        """The effective settings: ``setting`` defaults overridden by the explicit options."""
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        setting = self.setting if self.setting != "auto" else ("cuda" if device.startswith("cuda") else "cpu")
        check_choice(setting, "setting", SETTINGS)
        base = dict(SETTINGS[setting])
        for key in (
            "preset",
            "tokenizer",
            "steps",
            "batch_size",
            "seq_len",
            "warmup",
            "eval_every",
            "eval_tokens",
            "diag_every",
        ):
            if getattr(self, key) is not None:
                base[key] = getattr(self, key)
        if self.warmup is None and self.steps is not None:
            # a short run keeps the setting's warm-up fraction (10% on cpu) instead of failing
            base["warmup"] = min(base["warmup"], self.steps * SETTINGS[setting]["warmup"] // SETTINGS[setting]["steps"])
        for name in self.optimizers:
            check_choice(name, "optimizers", OPTIMIZERS)
        check_choice(base["preset"], "preset", PRESETS)
        check_choice(self.schedule, "schedule", SCHEDULES)
        check_int(base["steps"], "steps", low=1)
        check_int(base["warmup"], "warmup", low=0, high=base["steps"])
        if not self.seeds:
            raise ValueError("seeds must list at least one seed")
        check_choice(self.parallel, "parallel", PARALLEL_MODES)
        if self.parallel == "fsdp2" and self.noise_steps:
            raise ValueError("noise_steps must be empty with parallel='fsdp2' (the noise analysis runs on "
                             "rank 0 only and needs whole parameters)")
        log_every = min(10, base["steps"])
        ckpt = self.ckpt_every
        if ckpt is None:  # about every 10% of the run, on a logged step
            ckpt = max(log_every, base["steps"] // 10 // log_every * log_every)
        check_int(ckpt, "ckpt_every", low=0)
        return {**base, "setting": setting, "device": device, "ckpt_every": ckpt, "log_every": log_every}


# A run diverged when its logged training loss is not finite or above DIVERGE_FACTOR * ln(vocab size), i.e.
# three times the loss of a uniform guess; it then stops, and its row says diverged with the curves so far.
DIVERGE_FACTOR = 3.0


def _noise_batches(tokens, cfg: dict, opts: CompareOptions, seed: int, device: torch.device):
    """Batches for the noise-structure analysis (Jiang, Semenov and Stich 2026 §F.2.2), from a stream separate from
    training
    (so the training data order is unchanged): signal = ``noise_signal_batches`` micro-batches of
    ``batch_size`` sequences, samples = ``noise_samples`` single sequences."""
    big = TokenBatches(tokens, cfg["batch_size"], cfg["seq_len"], seed=seed + 7919)
    single = TokenBatches(tokens, 1, cfg["seq_len"], seed=seed + 104729)

    def make(step: int):
        def dev(b):
            return b[0].to(device), b[1].to(device)

        base = step * 100_000
        signal = [dev(big.batch(base + i)) for i in range(opts.noise_signal_batches)]
        samples = [dev(single.batch(base + i)) for i in range(opts.noise_samples)]
        return signal, samples

    return make


def _run_one(
    name: str, seed: int, opts: CompareOptions, cfg: dict, splits, out_dir: str | None, info: DistInfo,
    resume: str | None = None,
) -> dict:
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    torch.manual_seed(seed)
    model_cfg = preset_config(cfg["preset"], splits.meta["vocab_size"], max_seq_len=cfg["seq_len"])
    # wrap BEFORE building the optimizer: FSDP2 replaces the parameters by DTensors; with several ranks
    # the Spectra presets become spectrakit.distributed.sharded(...) (each matrix transformed once)
    model = wrap_model(Llama(model_cfg).to(info.device), info, opts.parallel)
    optimizer = build_optimizer(
        name,
        model,
        lr=opts.lr,
        weight_decay=opts.weight_decay,
        c=opts.c,
        warmup_steps=cfg["warmup"],
        world_size=info.world_size,
        embedding_scale=opts.embedding_scale,
    )
    lr = optimizer.param_groups[0]["lr"]
    scheduler = make_scheduler(optimizer, total=cfg["steps"], warmup=cfg["warmup"], kind=opts.schedule)
    data = TokenBatches(
        splits.train, cfg["batch_size"], cfg["seq_len"], seed=seed, rank=info.rank, world_size=info.world_size
    )
    out_dir = out_dir if info.is_main else None
    diag = SpectralDiagnostics(every=cfg["diag_every"], spectra_steps=(0, cfg["steps"] - 1), out_dir=out_dir)
    callbacks = [diag]
    if opts.noise_steps and info.is_main:
        callbacks.append(
            NoiseStructure(
                opts.noise_steps, _noise_batches(splits.train, cfg, opts, seed, info.device), out_dir=out_dir
            )
        )
    tcfg = TrainConfig(
        steps=cfg["steps"],
        grad_accum=opts.grad_accum,
        grad_clip=opts.grad_clip,
        eval_every=cfg["eval_every"],
        eval_tokens=cfg["eval_tokens"],
        compile=opts.compile,
        out_dir=out_dir,
        progress=opts.progress,
        log_every=cfg["log_every"],
        ckpt_every=cfg["ckpt_every"] if out_dir else 0,
        ckpt_dir=out_dir,
        resume=resume,
        diverge_loss=DIVERGE_FACTOR * math.log(splits.meta["vocab_size"]),
    )
    res = train(
        model,
        optimizer,
        scheduler,
        data,
        splits.val,
        tcfg,
        callbacks=callbacks,
        dist_info=info,
        desc=f"{name} s{seed}",
    )
    last = diag.rows[-1] if diag.rows else {}
    updates = [_num(r["max_update_sn"]) for r in diag.rows if r["step"] >= cfg["warmup"]]
    # non-finite weights at the last diagnostics also mean divergence, even where the loss stayed finite
    diverged = res.diverged or (bool(diag.rows) and last.get("max_weight_sn") is None)
    return {
        "optimizer": name,
        "seed": seed,
        "lr": lr,
        "val_loss": res.final_val_loss,
        "val_ppl": math.exp(min(res.final_val_loss, 50.0)) if math.isfinite(res.final_val_loss) else math.nan,
        "step_ms": res.step_ms,
        "max_weight_sn": _num(last.get("max_weight_sn")),
        "max_update_sn": math.nan if any(map(math.isnan, updates)) else max(updates, default=math.nan),
        "agg_linf": _num(last.get("agg_linf")),
        "diverged": diverged,
        "diverged_at": res.steps_done if diverged else None,
        # the machine's 1-minute load average at the run's start and end (results.json): a change marks wall
        # times measured under another load
        "load": [round(load_start, 2), round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else math.nan],
        "_curve": [(r["step"], r["loss"]) for r in res.logs],
        "_evals": res.evals,
        "_norms": [(r["step"], _num(r["agg_linf"]), _num(r["agg_fro"]), _num(r["max_weight_sn"]))
                   for r in diag.rows],
    }


def _num(value) -> float:
    """A logged number as a float: the logs store non-finite values (a diverged run) as ``None``."""
    return math.nan if value is None else float(value)


RESULT = "result.json"  # a finished run's table row (with its curves), in its run folder


# the options that decide what a run computes: a resumed comparison must keep them (optimizers and seeds may
# grow, each run has its own folder; device, checkpoint interval and output only change where it runs)
RUN_OPTIONS = ("preset", "tokenizer", "steps", "batch_size", "seq_len", "warmup", "eval_every", "eval_tokens",
               "diag_every", "corpus", "grad_accum", "schedule", "lr", "c", "embedding_scale", "weight_decay",
               "grad_clip", "noise_steps", "noise_signal_batches", "noise_samples")


def run_options(opts: CompareOptions, cfg: dict, keys=RUN_OPTIONS) -> dict:
    """The options of ``keys`` that the runs are started with (``cfg``'s resolved value where it has one)."""
    return {k: cfg[k] if k in cfg else getattr(opts, k) for k in keys}


def run_folders(out: str) -> list[str]:
    """The run folders of a compare output folder: those the tool made (:func:`.runfolders.owned_runs`)."""
    return runfolders.owned_runs(out) if out else []


def _finished_row(run_dir: str) -> dict | None:
    """The row a finished run wrote (``result.json``, a regular file of the run folder), else None."""
    path = os.path.join(run_dir, RESULT)
    if os.path.islink(path):
        return None
    try:
        row = json.loads(read_regular(path, what="result"))
    except (OSError, ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) else None


def _write_row(run_dir: str, row: dict) -> None:
    write_atomic(os.path.join(run_dir, RESULT), json.dumps(row, default=str))


def _paired_overhead(name: str, base: str, seed: int, opts: CompareOptions, cfg: dict, splits, info: DistInfo,
                     rounds: int = 7) -> float | None:
    """SPECTRA's overhead over its base measured in pairs: both optimizers on copies of one model, the same
    batches, their training steps (forward, backward, step) interleaved for ``rounds`` rounds after a
    warm-up, process CPU time (on a CPU: what the process itself spent, so other processes' load cannot flip
    the sign; CUDA: wall time after synchronising), the median of the per-round ratios, in percent. The
    training runs' own step times are wall times of runs made minutes apart; this is the figure the table
    shows. None under several processes."""
    if info.world_size > 1:
        return None
    from spectrakit.train.loop import autocast_context

    model_cfg = preset_config(cfg["preset"], splits.meta["vocab_size"], max_seq_len=cfg["seq_len"])
    data = TokenBatches(splits.train, cfg["batch_size"], cfg["seq_len"], seed=seed)
    batches = [tuple(t.to(info.device) for t in data.next()) for _ in range(rounds + 2)]
    pairs = []
    for label in (name, base):
        torch.manual_seed(seed)
        model = Llama(model_cfg).to(info.device)
        pairs.append((model, build_optimizer(label, model, lr=opts.lr, weight_decay=opts.weight_decay, c=opts.c)))
    cuda = info.device.type == "cuda"

    def step(model, opt, batch) -> float:
        if cuda:
            torch.cuda.synchronize(info.device)
        t0 = time.perf_counter() if cuda else time.process_time()
        with autocast_context(info.device):
            _, loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(info.device)
        return (time.perf_counter() if cuda else time.process_time()) - t0

    ratios = []
    for i, batch in enumerate(batches):
        order = pairs if i % 2 == 0 else pairs[::-1]
        times = {id(m): step(m, o, batch) for m, o in order}
        if i >= 2:  # (the first two: warm-up, state allocation)
            t_name, t_base = times[id(pairs[0][0])], times[id(pairs[1][0])]
            if t_base > 0:
                ratios.append(t_name / t_base)
    if not ratios:
        return None
    ratios.sort()
    return 100.0 * (ratios[len(ratios) // 2] - 1.0)


def _ratio_pct(a, b) -> float | None:
    """``100 (a / b - 1)``, or None (shown as ``-``) where it is undefined (a zero, missing or non-finite time)."""
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in (a, b))
    return 100.0 * (a / b - 1.0) if ok else None


def _load_note(rows: list[dict]) -> str:
    """A remark for the table's title when the machine's load average moved by more than 1 during the runs
    (their ``step_ms`` are wall times under different loads; ``overhead_%`` is measured in pairs)."""
    loads = [x for r in rows for x in (r.get("load") or []) if isinstance(x, (int, float)) and x == x]
    if len(loads) < 2 or max(loads) - min(loads) <= 1.0:
        return ""
    return (f"; the load average moved from {min(loads):.1f} to {max(loads):.1f} during the runs: step_ms are "
            "wall times under different loads, overhead_% is measured in pairs")


def _with_overheads(rows: list[dict]) -> list[dict]:
    by_key = {(r["optimizer"], r["seed"]): r for r in rows}
    for r in rows:
        base = OPTIMIZERS[r["optimizer"]].base
        b = by_key.get((base, r["seed"])) if base else None
        r["overhead_%"] = _ratio_pct(r["step_ms"], b["step_ms"]) if b else None
    return rows


def compare(*, on_row=None, on_splits=None, **options) -> list[dict]:
    """Run the comparison; keyword options are the fields of :class:`CompareOptions`.

    With ``out`` set, every run writes checkpoints (``ckpt_every`` steps, default about 10% of the run) and,
    when it finishes, its row to ``<out>/<optimizer>-s<seed>/result.json``; with ``resume=True`` finished
    runs are read back instead of trained again and unfinished ones continue from their newest usable
    checkpoint (bit-identical to an uninterrupted run on CPU). ``on_row(rows)`` is called on the main rank
    after each run with the rows so far; ``on_splits(splits)`` once before the runs, with the tokenised
    corpus (:class:`~spectrakit.data.tokens.TokenSplits`).

    Returns one row per (optimizer, seed) with ``val_loss``, ``val_ppl``, ``step_ms``, ``overhead_%`` (the
    paired measurement of :func:`_paired_overhead`; ``overhead_wall_%``: step
    time over the base optimizer of the same seed when both ran, else ``None``, shown as ``-``),
    ``max_weight_sn`` (final largest ``||W||_2`` over matrices), ``max_update_sn`` (largest ``||U||_2`` of the
    applied update direction
    over the recorded steps after the LR warm-up, during which SPECTRA's threshold is raised to
    ``c * lr_peak / lr_k``), ``agg_linf`` (final ``max |W_ij|``), ``diverged`` (the logged training loss
    was not finite or above ``3 ln V``, or the weights were not finite: the run stopped there, at step
    ``diverged_at``, and the next one starts) and ``diverged_at``; private keys starting with ``_`` hold
    the curves. With ``out`` set, the run folders are listed in the folder's index and a resumed
    comparison must keep the options of :data:`RUN_OPTIONS` (:mod:`.runfolders`); the memory and time the
    runs need are estimated first and, with ``resource_check``, refused when they cannot fit this machine
    (:mod:`.resources`). Raises ``ValueError`` for invalid options,
    :class:`~spectrakit.data.corpora.CorpusUnavailableError` for a missing corpus.
    """
    opts = CompareOptions(**options)
    cfg = opts.resolved()
    if opts.out:  # every rank checks the options of a resumed comparison; rank 0 records them
        runfolders.start(opts.out, "compare", run_options(opts, cfg), resume=opts.resume, write=False)
    info = setup(cfg["device"])
    if opts.out and info.is_main:
        runfolders.start(opts.out, "compare", run_options(opts, cfg), resume=opts.resume)
    # tokenise once on the main rank; the other ranks then read the cache
    splits = prepare(opts.corpus, cfg["tokenizer"], verbose=opts.progress) if info.is_main else None
    barrier(info)
    if splits is None:
        splits = prepare(opts.corpus, cfg["tokenizer"])
    _check_resources(opts, cfg, splits, info)
    if on_splits is not None and info.is_main:
        on_splits(splits)
    rows = []
    for seed in opts.seeds:
        for name in opts.optimizers:
            out_dir = os.path.join(opts.out, f"{name}-s{seed}") if opts.out else None
            done = _finished_row(out_dir) if out_dir and opts.resume and runfolders.owned(out_dir) else None
            if done is not None:
                rows.append(done)
            else:
                if out_dir and info.is_main:
                    runfolders.make_run(opts.out, os.path.basename(out_dir))
                if out_dir:
                    barrier(info)  # the run folder exists, marked, before any rank writes into it
                ckpts = os.path.join(out_dir, CHECKPOINTS) if out_dir else None
                if ckpts and os.path.islink(ckpts):
                    raise UsageError(f"{ckpts} is a symbolic link; a run's checkpoints stay inside its folder")
                resume = ckpts if opts.resume and ckpts and candidates(ckpts) else None
                row = _run_one(name, seed, opts, cfg, splits, out_dir, info, resume=resume)
                if out_dir and info.is_main:
                    _write_row(out_dir, row)
                    prune(os.path.join(out_dir, CHECKPOINTS), 1)  # a finished run keeps its final state only
                rows.append(row)
            if on_row is not None and info.is_main:
                on_row(_with_overheads(list(rows)))
    rows = _with_overheads(rows)
    for r in rows:  # the table's overhead: a paired, interleaved measurement (load cannot flip its sign)
        base = OPTIMIZERS[r["optimizer"]].base
        if r.get("overhead_%") is not None and not r.get("diverged") and info.is_main:
            r["overhead_wall_%"] = r["overhead_%"]
            r["overhead_%"] = _paired_overhead(r["optimizer"], base, r["seed"], opts, cfg, splits, info)
    return rows


def _check_resources(opts: CompareOptions, cfg: dict, splits, info: DistInfo) -> dict:
    """Estimate the memory and time of the runs (:mod:`.resources`) and, with ``opts.resource_check``,
    refuse what cannot fit this machine: more memory than is free, or longer than
    :data:`~spectrakit.experiments.resources.MAX_HOURS`; validation settings the split cannot hold are
    always refused. Returns ``{"memory_bytes", "seconds", "available_bytes"}``."""
    from spectrakit._cliargs import UsageError

    val = len(splits.val)
    if cfg["seq_len"] >= val:
        raise UsageError(f"--seq-len {cfg['seq_len']}: the validation split has {val} tokens; use at most {val - 1}")
    if opts.eval_tokens is not None and opts.eval_tokens > val:
        raise UsageError(f"--eval-tokens {opts.eval_tokens} is more than the validation split holds ({val} "
                         f"tokens); use at most {val}")
    model_cfg = preset_config(cfg["preset"], splits.meta["vocab_size"], max_seq_len=cfg["seq_len"])
    runs = len(opts.optimizers) * len(opts.seeds)
    mem = resources.memory_bytes(model_cfg, cfg["batch_size"], cfg["seq_len"])
    flops = runs * resources.run_flops(model_cfg, steps=cfg["steps"], batch_size=cfg["batch_size"],
                                       seq_len=cfg["seq_len"], grad_accum=opts.grad_accum,
                                       eval_every=cfg["eval_every"], eval_tokens=min(cfg["eval_tokens"], val))
    seconds = flops / info.world_size / resources.measured_flops_per_s(info.device)
    free = resources.available_bytes(info.device)
    what = (f"about {resources.size(mem)} of memory per process and {resources.duration(seconds)} for {runs} "
            f"run(s) on this machine")
    if opts.resource_check:
        if free is not None and mem > free:
            raise UsageError(f"these settings need {what}, but only {resources.size(free)} of memory is free; "
                             "lower --seq-len, --batch-size or --preset, or pass --no-resource-check to try anyway")
        if seconds > resources.MAX_HOURS * 3600:
            raise UsageError(f"these settings need {what} (more than {resources.MAX_HOURS:g} h); lower --steps, "
                             "--eval-tokens, --seq-len or --preset, or pass --no-resource-check to run anyway")
    if opts.progress and info.is_main:
        print(f"estimate: {what}", file=sys.stderr, flush=True)
    return {"memory_bytes": mem, "seconds": seconds, "available_bytes": free}


def _csv(text: str, kind=str) -> tuple:
    return tuple(kind(t) for t in text.split(",") if t.strip())


def _check_out_folder(args: argparse.Namespace) -> None:
    """Refuse to mix a new comparison with an old one in ``--out`` unless ``--resume`` or ``--force``."""
    from spectrakit._cliargs import UsageError

    if args.resume and args.force:
        raise UsageError("--resume and --force exclude each other")
    if not runfolders.main_process():  # rank 0 of a torchrun job checks, claims and cleans --out alone
        return
    runfolders.claim_out(args.out, "compare")  # new, empty or a comparison's: never another folder
    old = run_folders(args.out)
    leftovers = [f for f in ("results.json", "results.md") if os.path.exists(os.path.join(args.out, f))]
    if args.resume and not old:
        raise UsageError(f"--resume: --out {args.out} holds no comparison to continue; run without --resume to "
                         "start one there")
    if not (old or leftovers) or args.resume:
        return
    if not args.force:
        raise UsageError(f"--out {args.out} holds a previous comparison ({len(old)} run folders); pass --resume "
                         "to continue it or --force to delete it and start over")
    # only what a comparison wrote: other folders in --out (photos-s2023/) stay
    runfolders.remove_runs(args.out, OUTPUTS)


def _resume_command(args: argparse.Namespace) -> str:
    if sys.argv[1:2] == ["compare"]:
        argv = [a for a in sys.argv[1:] if a not in ("--force", "--resume")]
        return "spectrakit " + shlex.join(argv) + " --resume"
    return f"spectrakit compare --out {shlex.quote(args.out)} --resume (with the same options)"


OUTPUTS = ("results.json", "results.md", "loss_curves.png", "weight_norms.png")  # a comparison's own files


def stalled_rank_exit(exc: BaseException, timeout_s: float) -> None:
    """When ``exc`` is a collective's timeout under ``torchrun`` (gloo: "Timed out waiting ...ms", NCCL:
    "Watchdog caught collective operation timeout"), print one line naming the timeout and ``--dist-timeout``;
    when another rank closed its connection (it died), one line saying so; then end the process with status
    1 at once (the process group cannot be shut down cleanly any more). Otherwise return."""
    import torch.distributed as dist

    text = str(exc)
    if not (dist.is_available() and dist.is_initialized()):
        return
    if re.search(r"timed out|timeout", text, re.I):
        line = (f"rank {dist.get_rank()} waited {timeout_s:g} s (--dist-timeout {timeout_s:g}) for another rank "
                "that stalled or died; raise --dist-timeout if a step, evaluation or checkpoint legitimately "
                "takes longer")
    elif re.search(r"connection (closed|reset) by peer|remote worker crash", text, re.I):
        line = f"rank {dist.get_rank()} lost its connection to another rank, which stopped (see that rank's output)"
    else:
        return
    print(f"error: {line}", file=sys.stderr, flush=True)
    os._exit(1)


def run(args: argparse.Namespace) -> int:
    with runfolders.lock_out(args.out):  # one command per --out at a time
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    _check_out_folder(args)
    if args.dist_timeout <= 0:
        from spectrakit._cliargs import UsageError

        raise UsageError(f"--dist-timeout must be > 0 seconds, got {args.dist_timeout}")
    os.environ["SPECTRAKIT_DIST_TIMEOUT"] = str(args.dist_timeout)
    opts = dict(
        optimizers=tuple(args.optimizers),
        setting=args.setting,
        preset=args.preset,
        corpus=args.corpus,
        tokenizer=args.tokenizer,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        grad_accum=args.grad_accum,
        warmup=args.warmup,
        schedule=args.schedule,
        lr=args.lr,
        c=args.c,
        embedding_scale=args.embedding_scale,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip if args.grad_clip > 0 else None,
        seeds=tuple(args.seeds),
        eval_every=args.eval_every,
        eval_tokens=args.eval_tokens,
        diag_every=args.diag_every,
        noise_steps=_csv(args.noise_steps, int),
        noise_signal_batches=args.noise_signal_batches,
        noise_samples=args.noise_samples,
        device=args.device,
        parallel=args.parallel,
        compile=args.compile,
        out=args.out,
        progress=not args.quiet,
        ckpt_every=args.ckpt_every,
        resume=args.resume,
        resource_check=args.resource_check,
    )
    t0 = time.perf_counter()
    cfg = CompareOptions(**opts).resolved()
    command = ("spectrakit " + shlex.join(sys.argv[1:])) if sys.argv[1:2] == ["compare"] else ""
    state: dict = {}

    def entropy(splits) -> None:
        state["h1"] = unigram_entropy(splits.val, splits.meta["vocab_size"])

    def write(rows: list[dict], final: bool = False) -> list[str]:
        """results.json / results.md / plots of the runs finished so far (after each run)."""
        h1 = state["h1"]  # (compare() passes the corpus to entropy() before the first run)
        title = f"{cfg['preset']} on {args.corpus} ({cfg['tokenizer']})"
        # the figures show only these fields: the last run's figures are not drawn again at the end
        drawn = repr([(r["optimizer"], r.get("c"), r["seed"], r["lr"], r["_curve"], r["_evals"], r["_norms"])
                      for r in rows]) + title
        if state.get("drawn") == drawn and all(os.path.exists(p) for p in state["paths"]):
            paths = state["paths"]
        else:
            paths = plot(rows, args.out, title=title)
            state.update(drawn=drawn, paths=paths)
        public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
        report(
            f"compare: {cfg['preset']} model, {cfg['steps']} steps x "
            f"{cfg['batch_size']}x{cfg['seq_len']} tokens, "
            f"{args.corpus}/{cfg['tokenizer']} (validation unigram entropy {h1:.3f} nats)" + _load_note(rows),
            public,
            args.out,
            command=command,
            columns=COLUMNS,
            echo=final,
            extra={
                "settings": cfg,
                "options": {k: list(v) if isinstance(v, tuple) else v for k, v in opts.items()},
                "unigram_entropy": h1,
                "curves": {f"{r['optimizer']}-s{r['seed']}": r["_curve"] for r in rows},
                "evals": {f"{r['optimizer']}-s{r['seed']}": r["_evals"] for r in rows},
                "norms": {f"{r['optimizer']}-s{r['seed']}": r["_norms"] for r in rows},
                "wall_s": time.perf_counter() - t0,
                "complete": final,
            },
        )
        return paths

    try:
        with interrupt.graceful():
            rows = compare(on_row=write, on_splits=entropy, **opts)
    except RuntimeError as e:
        stalled_rank_exit(e, args.dist_timeout)
        raise
    except interrupt.Interrupted as e:
        where = f"checkpoint {e.checkpoint}" if e.checkpoint else "no checkpoint (no --out)"
        interrupt.report_stop(f"interrupted at step {e.step} ({where}); resume with: {_resume_command(args)}")
        return e.exit_code
    info = setup(cfg["device"])  # already initialised by compare(); under torchrun only rank 0 reports
    if not info.is_main:
        teardown(info)
        return 0
    paths = write(rows, final=True)
    print("plots: " + ", ".join(paths))
    teardown(info)
    return 0


main = run
