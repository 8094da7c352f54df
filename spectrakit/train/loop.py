"""The training loop for language models (Jiang, Semenov and Stich 2026 §6.2 / App. F.3 protocol).

One optimizer step = ``grad_accum`` micro-batches (forward in bf16 autocast on CUDA, backward with the loss
divided by ``grad_accum``; DDP gradient sync only on the last one) -> optional global grad-norm clipping
``g <- g * min(1, clip / ||g||_2)`` over all parameters -> ``optimizer.step()`` -> ``scheduler.step()``.
The gradient norm (taken every step for the logs, clipped or not) is given to a spectrakit optimizer's step
(``step(grad_norm=...)``), which then decides its non-finite check from it instead of reading every gradient
once more.
Every ``log_every`` steps the host synchronises once to log the mean training loss, gradient norm, LR,
step time and tokens/s (JSONL/CSV); every ``eval_every`` steps (and at the end) the validation loss is
computed on fixed windows; every ``ckpt_every`` steps a checkpoint allows exact resume.

Checkpoints are step directories under ``<ckpt_dir>/checkpoints/`` (:mod:`spectrakit.train.checkpoint`:
atomic, checksummed, loaded without executing code). Data parallelism: DDP (rank 0 writes them) or FSDP2
(DTensor parameters; every rank writes its shards with
:func:`~spectrakit.train.checkpoint.save_sharded_checkpoint`; the folder is rank 0's ``ckpt_dir``/``out_dir``,
broadcast to the other ranks). Inside :func:`spectrakit.train.interrupt.graceful`, SIGINT/SIGTERM stop the
loop after its current step with a checkpoint (:class:`~spectrakit.train.interrupt.Interrupted`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time

import numpy as np
import torch

from spectrakit._checks import check_choice, check_int, check_scalar
from spectrakit.data.batches import TokenBatches, eval_batches
from spectrakit.optim import Spectra
from spectrakit.train import interrupt
from spectrakit.train.checkpoint import (
    load_checkpoint,
    load_sharded_checkpoint,
    save_checkpoint,
    save_sharded_checkpoint,
    unwrap,
)
from spectrakit.train.distributed import DistInfo, all_reduce_mean, is_sharded
from spectrakit.train.logs import RunLogger
from spectrakit.train.progress import ProgressLines

CHECKPOINTS = "checkpoints"  # subfolder of ckpt_dir holding the step directories


@dataclasses.dataclass
class TrainConfig:
    """Loop settings.

    Args:
        steps: optimizer steps, >= 1.
        grad_accum: micro-batches per step, >= 1.
        grad_clip: global L2 gradient-norm clip, > 0, or ``None`` (paper: 0.5 at 160M).
        log_every: steps between logged rows (each costs one host sync), >= 1.
        eval_every: steps between validation evaluations, >= 1 (a final evaluation always runs).
        eval_tokens: validation target tokens per evaluation, >= 1.
        eval_batch_size: windows per validation batch, >= 1.
        autocast: ``"auto"`` (bf16 on CUDA, off on CPU), ``"bf16"`` or ``"off"``.
        compile: wrap the model in ``torch.compile``.
        ckpt_every: steps between checkpoints (0: only at the end when ``out_dir`` is set), >= 0.
        ckpt_keep: complete checkpoints kept (the newest), >= 1.
        out_dir: folder for ``metrics.jsonl``/``.csv`` and the checkpoints (``None``: keep in memory).
        ckpt_dir: folder whose ``checkpoints/`` subfolder holds the step directories of
            :mod:`spectrakit.train.checkpoint` (``None``: ``out_dir``). Under FSDP2 rank 0's value is used
            on every rank.
        resume: checkpoint to resume from (``None``: start fresh): a ``checkpoints/`` folder (its newest
            usable checkpoint, falling back to older ones) or one of its step directories; under FSDP2
            every rank passes it. The logs of the resumed run are truncated to the checkpoint's step; the main
            rank prints ``resuming <out_dir name> from step N`` on stderr.
        progress: show a tqdm bar when stderr is a TTY, else plain lines (every ~10% of the run or 30 s).
        stop_on_nan: stop when the logged training loss is not finite or above ``diverge_loss`` (marks the run
            ``diverged``; its logs up to that step are kept).
        diverge_loss: a logged training loss above this (nats) also counts as divergence, > 0, or ``None``
            (only non-finite losses count). Optimizers that skip non-finite steps keep the loss finite while the
            weights blow up, so a bound is needed to see those runs diverge; :mod:`spectrakit.experiments.compare`
            uses ``3 ln V`` (three times the loss of a uniform guess over the ``V`` tokens).
    """

    steps: int = 300
    grad_accum: int = 1
    grad_clip: float | None = 0.5
    log_every: int = 10
    eval_every: int = 100
    eval_tokens: int = 65536
    eval_batch_size: int = 16
    autocast: str = "auto"
    compile: bool = False
    ckpt_every: int = 0
    ckpt_keep: int = 2
    out_dir: str | None = None
    ckpt_dir: str | None = None
    resume: str | None = None
    progress: bool = True
    stop_on_nan: bool = True
    diverge_loss: float | None = None

    def __post_init__(self) -> None:
        check_int(self.steps, "steps", low=1)
        check_int(self.grad_accum, "grad_accum", low=1)
        if self.grad_clip is not None:
            check_scalar(self.grad_clip, "grad_clip", low=0, low_inclusive=False, allow_tensor=False)
        check_int(self.log_every, "log_every", low=1)
        check_int(self.eval_every, "eval_every", low=1)
        check_int(self.eval_tokens, "eval_tokens", low=1)
        check_int(self.eval_batch_size, "eval_batch_size", low=1)
        check_choice(self.autocast, "autocast", ("auto", "bf16", "off"))
        check_int(self.ckpt_every, "ckpt_every", low=0)
        check_int(self.ckpt_keep, "ckpt_keep", low=1)
        if self.diverge_loss is not None:
            check_scalar(self.diverge_loss, "diverge_loss", low=0, low_inclusive=False, allow_tensor=False)


@dataclasses.dataclass
class StepContext:
    """What callbacks see: the step about to be applied (0-based), the unwrapped model and the optimizer."""

    step: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer


@dataclasses.dataclass
class TrainResult:
    """``logs``: rows logged every ``log_every`` steps; ``evals``: ``{"step", "val_loss"}`` rows;
    ``final_val_loss``; ``step_ms``: mean step time (first logged window, warm-up/compilation, excluded when
    there are more); ``diverged``; ``steps_done``."""

    logs: list
    evals: list
    final_val_loss: float
    step_ms: float
    diverged: bool
    steps_done: int


def autocast_context(device: torch.device, mode: str = "auto"):
    """bf16 autocast on CUDA for ``"auto"``/``"bf16"`` (``"bf16"`` also on CPU); a no-op otherwise."""
    if mode == "bf16" or (mode == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    tokens: np.ndarray,
    *,
    seq_len: int,
    batch_size: int = 16,
    max_tokens: int | None = None,
    device: torch.device | str = "cpu",
    autocast: str = "auto",
) -> float:
    """Mean next-token cross entropy (nats) over consecutive validation windows (see
    :func:`spectrakit.data.batches.eval_batches`); restores the model's train/eval mode."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for x, y in eval_batches(tokens, batch_size, seq_len, max_tokens):
        with autocast_context(device, autocast):
            _, loss = model(x.to(device), y.to(device))
        total += loss.double() * y.numel()
        count += y.numel()
    model.train(was_training)
    return float(total / count)


def _call(callbacks, hook: str, ctx: StepContext, device: torch.device) -> float:
    """Run ``hook`` of the callbacks active at ``ctx.step``; returns the seconds spent (device-synchronised),
    which the loop leaves out of the step time."""
    active = [cb for cb in callbacks if hasattr(cb, hook) and getattr(cb, "active", lambda s: True)(ctx.step)]
    if not active:
        return 0.0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    for cb in active:
        getattr(cb, hook)(ctx)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def _grad_norm(params: list[torch.Tensor], clip: float | None) -> torch.Tensor:
    """Global L2 norm of the gradients (0-d tensor, no host sync), clipping them to ``clip`` when set.
    FSDP2's DTensor norm is turned into a plain (replicated) tensor."""
    if clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def _checkpoint(ckpt_dir, sharded, main, model, optimizer, scheduler, step, data, extra=None, keep=2):
    """Write ``ckpt_dir/checkpoints/step_XXXXXXXX/`` (FSDP2: every rank; else rank 0); returns its path."""
    root = os.path.join(ckpt_dir, CHECKPOINTS)
    if sharded:
        return save_sharded_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, step=step,
                                       data_state=data.state_dict(), extra=extra, keep=keep)
    if main:
        return save_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, step=step,
                               data_state=data.state_dict(), extra=extra, keep=keep)
    return None


@interrupt.defers  # a signal inside the loop stops it after the current step, with a checkpoint
def train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    data: TokenBatches,
    val_tokens: np.ndarray,
    cfg: TrainConfig,
    *,
    callbacks=(),
    dist_info: DistInfo | None = None,
    desc: str = "train",
) -> TrainResult:
    """Train ``model`` (already on its device and wrapped for DDP if wanted) for ``cfg.steps`` steps.

    ``data`` yields the training micro-batches (its ``position`` is checkpointed), ``val_tokens`` is the
    validation token array. ``callbacks`` are objects with optional methods ``before_step(ctx)`` (gradients
    ready, before clipping and the optimizer step), ``after_step(ctx)`` (after the optimizer step) and
    ``active(step) -> bool`` (whether to call them at this step; their time is excluded from the step
    time); see :class:`StepContext`. Returns a :class:`TrainResult`.
    """
    info = dist_info or DistInfo(device=next(model.parameters()).device)
    device = info.device
    core = unwrap(model)
    params = [p for p in core.parameters() if p.requires_grad]
    takes_norm = isinstance(optimizer, Spectra)  # (step(grad_norm=): the gradient norm the loop takes anyway)
    sharded = info.enabled and is_sharded(core)
    ckpt_dir = cfg.ckpt_dir or cfg.out_dir
    if sharded:  # every rank writes its shards: all need rank 0's folder (out_dir is often rank 0's only)
        box = [ckpt_dir]
        torch.distributed.broadcast_object_list(box, src=0)
        ckpt_dir = box[0]
    start, window = 0, None
    if cfg.resume:
        if sharded:
            state = load_sharded_checkpoint(
                cfg.resume, model=core, optimizer=optimizer, scheduler=scheduler, map_location=device,
                max_step=cfg.steps,
            )
        else:
            state = load_checkpoint(
                cfg.resume, model=core, optimizer=optimizer, scheduler=scheduler, map_location=device,
                max_step=cfg.steps,
            )
        data.load_state_dict(state["data"])
        start = int(state["step"])
        window = state["extra"].get("window")
        if info.is_main:  # also with progress off: a resume is worth one line
            name = os.path.basename(os.path.normpath(cfg.out_dir)) if cfg.out_dir else "the run"
            print(f"resuming {name} from step {start}", file=sys.stderr, flush=True)
    fwd = torch.compile(model) if cfg.compile else model
    main = info.is_main
    logger = RunLogger(cfg.out_dir if main else None)
    evals: list[dict] = []
    if start > 0:  # continue the logs of the interrupted run from the checkpoint's step
        evals = [{"step": r["step"], "val_loss": r["val_loss"]} for r in logger.resume(start) if "val_loss" in r]
        for cb in callbacks:
            if hasattr(cb, "resume"):
                cb.resume(start)
    bar = None
    if cfg.progress and main and sys.stderr.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc=desc, dynamic_ncols=True)
    lines = ProgressLines(desc or "train", cfg.steps, start) if cfg.progress and main and bar is None else None
    tokens_per_step = data.batch_size * data.seq_len * cfg.grad_accum * info.world_size
    seq_len = data.seq_len

    def run_eval(step: int) -> float:
        val = evaluate(
            fwd,
            val_tokens,
            seq_len=seq_len,
            batch_size=cfg.eval_batch_size,
            max_tokens=cfg.eval_tokens,
            device=device,
            autocast=cfg.autocast,
        )
        evals.append({"step": step, "val_loss": val})
        logger.log({"step": step, "val_loss": val, "val_ppl": math.exp(min(val, 50.0))})
        return val

    window_loss = torch.zeros((), device=device)
    window_gnorm = torch.zeros((), device=device)
    window_steps, windows_ms = 0, []
    if window is not None:  # a checkpoint written between two logged rows (a graceful stop)
        window_loss += window["loss"].to(device)
        window_gnorm += window["gnorm"].to(device)
        window_steps = int(window["steps"])
    diverged = False
    model.train()
    t0 = time.perf_counter()
    step = start
    while step < cfg.steps:
        for micro in range(cfg.grad_accum):
            x, y = data.next()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            sync_ctx = (
                model.no_sync()
                if info.enabled and micro < cfg.grad_accum - 1 and hasattr(model, "no_sync")
                else contextlib.nullcontext()
            )
            with sync_ctx:
                with autocast_context(device, cfg.autocast):
                    _, loss = fwd(x, y)
                (loss / cfg.grad_accum).backward()
            window_loss += loss.detach() / cfg.grad_accum
        ctx = StepContext(step, core, optimizer)
        t0 += _call(callbacks, "before_step", ctx, device)
        gnorm = _grad_norm(params, cfg.grad_clip)
        window_gnorm += gnorm
        if takes_norm:  # the norm decides the step's non-finite check: no second pass over the gradients
            optimizer.step(grad_norm=gnorm)
        else:
            optimizer.step()
        t0 += _call(callbacks, "after_step", ctx, device)
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        window_steps += 1
        if bar is not None:
            bar.update(1)  # host-side only: the bar moves from the first step
        if step % cfg.log_every == 0 or step == cfg.steps:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
            loss_v = float(all_reduce_mean(window_loss, info)) / window_steps
            ms = 1e3 * elapsed / window_steps
            windows_ms.append((ms, window_steps))
            logger.log(
                {
                    "step": step,
                    "tokens": step * tokens_per_step,
                    "loss": loss_v,
                    "grad_norm": float(window_gnorm) / window_steps,
                    "lr": optimizer.param_groups[0]["lr"],
                    "step_ms": ms,
                    "tok_s": tokens_per_step / (ms / 1e3),
                }
            )
            if bar is not None:
                bar.set_postfix(loss=f"{loss_v:.3f}", tok_s=f"{tokens_per_step / (ms / 1e3):,.0f}")
            if lines is not None:
                lines.update(step, loss_v, tokens_per_step / (ms / 1e3))
            window_loss.zero_()
            window_gnorm.zero_()
            window_steps = 0
            too_high = cfg.diverge_loss is not None and loss_v > cfg.diverge_loss
            if (not math.isfinite(loss_v) or too_high) and cfg.stop_on_nan:
                diverged = True
                break
            if step % cfg.eval_every == 0 and step < cfg.steps:
                run_eval(step)
            if ckpt_dir and cfg.ckpt_every and step % cfg.ckpt_every == 0:
                _checkpoint(ckpt_dir, sharded, main, core, optimizer, scheduler, step, data, keep=cfg.ckpt_keep)
            t0 = time.perf_counter()
        if interrupt.requested() is not None and step < cfg.steps:  # graceful stop (SIGINT/SIGTERM)
            if bar is not None:
                bar.close()
            path = None
            if ckpt_dir:
                win = {"loss": window_loss.cpu(), "gnorm": window_gnorm.cpu(), "steps": window_steps}
                path = _checkpoint(ckpt_dir, sharded, main, core, optimizer, scheduler, step, data,
                                   extra={"window": win}, keep=cfg.ckpt_keep)
            raise interrupt.Interrupted(step, interrupt.requested(), path)
    if bar is not None:
        bar.close()
    if diverged:
        final = float("nan")
    elif step == start and evals and evals[-1]["step"] == step:  # resumed after the final checkpoint: done
        final = evals[-1]["val_loss"]
    else:
        final = run_eval(step)
    if ckpt_dir and not diverged and not (cfg.ckpt_every and step % cfg.ckpt_every == 0):
        _checkpoint(ckpt_dir, sharded, main, core, optimizer, scheduler, step, data, keep=cfg.ckpt_keep)
    if not windows_ms:  # no step ran in this process (resumed at the end): the step time of the logs
        logged = [r.get("step_ms") for r in logger.rows]
        windows_ms = [(ms, 1) for ms in logged if isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0]
    timed = windows_ms[1:] if len(windows_ms) > 1 else windows_ms
    step_ms = sum(ms * n for ms, n in timed) / sum(n for _, n in timed) if timed else float("nan")
    return TrainResult(
        logs=[r for r in logger.rows if "loss" in r],
        evals=evals,
        final_val_loss=final,
        step_ms=step_ms,
        diverged=diverged,
        steps_done=step,
    )
