"""Hyperparameters of a :class:`~spectrakit.optim.spectra.Spectra` group: validation at construction and at
every step (a Python number is checked for free; a tensor ``lr`` on the CPU is read, on a GPU folded into the
step's flag), and the clip threshold ``c_k`` of the step (warm-up and decay schedules)."""

from __future__ import annotations

import math

import torch

from spectrakit._checks import check_choice, check_int, check_scalar, value_checks_enabled
from spectrakit._groups import check_finite_hyperparameters
from spectrakit.optim.bases import BASES
from spectrakit.optim.batching import _DTYPES
from spectrakit.optim.opaque import (
    reads_step,
    traced_threshold,
)
from spectrakit.optim.schedules import clip_threshold
from spectrakit.optim.transforms import (
    LMO_POSTS,
    POST_TRANSFORMS,
    PRE_TRANSFORMS,
    SCALES,
    check_split,
    post_kwargs,
)


class HyperMixin:
    """Hyperparameter checks and clip thresholds (a mixin of :class:`~spectrakit.optim.spectra.Spectra`)."""

    @staticmethod
    def _reads_lr_on_host(lr: torch.Tensor) -> bool:
        """Whether a step checks a tensor ``lr``'s value itself: a CPU tensor in an eager step (a read that waits
        for nothing). Elsewhere a bad value skips the step through its flag (see ``lr_skipped_steps``)."""
        return lr.is_cpu and not torch.compiler.is_compiling()

    @classmethod
    def _validate(cls, group: dict, at_step: bool = False) -> None:
        """Check every hyperparameter of ``group`` (the constructor, ``add_param_group``,
        ``load_state_dict`` and every ``step`` use it); numbers must be finite except ``c`` and ``pre_c``,
        whose ``inf`` turns that clip off. ``lr`` may be a 0-d real tensor (as in ``torch.optim.Muon``): its
        value is checked here except ``at_step`` (where reading it would be a host sync)."""
        check_finite_hyperparameters(group)
        for key in ("check_finite", "torch_kernel"):
            if not isinstance(group[key], bool):
                raise TypeError(f"{key} must be True or False, got {group[key]!r}")
        check_choice(group["post"], "post", POST_TRANSFORMS)
        check_choice(group["pre"], "pre", PRE_TRANSFORMS)
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            if lr.ndim != 0 or not lr.is_floating_point():
                raise TypeError(f"lr must be a number or a 0-d floating tensor, got a {lr.dtype} tensor "
                                f"of shape {tuple(lr.shape)}")
            # read where it costs no wait: at construction, or a CPU tensor in an eager step (a GPU's is folded
            # into the step's flag instead, see LrSkips)
            if not at_step or cls._reads_lr_on_host(lr):
                if value_checks_enabled() and not bool(torch.isfinite(lr)):
                    raise ValueError(f"lr must be a finite number >= 0, got {lr}")
                check_scalar(lr, "lr", low=0.0)
        else:
            check_scalar(lr, "lr", low=0.0, allow_tensor=False)
        check_scalar(group["peak_lr"], "peak_lr", low=0.0, allow_tensor=False)
        check_scalar(group["weight_decay"], "weight_decay", low=0.0, allow_tensor=False)
        check_scalar(group["c"], "c", low=0.0, low_inclusive=False, allow_tensor=False)
        if group["pre_c"] is not None:
            check_scalar(group["pre_c"], "pre_c", low=0.0, low_inclusive=False, allow_tensor=False)
        check_int(group["warmup_steps"], "warmup_steps", low=0)
        if group["post_steps"] is not None:
            check_int(group["post_steps"], "post_steps", low=1)
        if group["post_dtype"] is not None:
            check_choice(group["post_dtype"], "post_dtype", _DTYPES)
        if group["vector_clip"] not in (False, True, "reference"):
            raise ValueError(f"vector_clip must be False, True or 'reference', got {group['vector_clip']!r}")
        if group["max_batch_numel"] is not None:
            check_int(group["max_batch_numel"], "max_batch_numel", low=1)
        check_split(group["split_fused"])
        if isinstance(group["scale"], str):
            check_choice(group["scale"], "scale", SCALES)
        else:
            check_scalar(group["scale"], "scale", low=0.0, low_inclusive=False, allow_tensor=False)
        if group["post"] in LMO_POSTS:
            from spectrakit.linalg.lmo import check_lmo_args

            kw = post_kwargs(group, group["post"])
            check_lmo_args(kw.get("regularizer", "frobenius"), kw["b"], group["c"], kw.get("p"))
        BASES[group["base"]].validate(group)

    def _check_step_hyperparameters(self, index: int, group: dict) -> None:
        """Re-validate a group's hyperparameters at step time: a scheduler or user code may have set them
        after construction (``group["lr"] = float("nan")``, ``betas = (1.0, 0.999)``, ``post = "bogus"``).
        Python numbers cost no host sync to check, so a bad one raises ``ValueError`` naming the group and the
        argument before anything is modified; tensor values (a tensor ``lr``) are not read here but folded
        into the step's skip flag (:meth:`_tensor_hyper_flag`)."""
        try:
            self._validate(group, at_step=True)
        except (ValueError, TypeError) as e:
            raise type(e)(f"param group {index}: {e} (checked at step time; it was changed after "
                          "construction)") from None

    @staticmethod
    def _clips(group: dict) -> bool:
        """Whether the group's threshold ``c`` is used: a matrix post-transform or the vector clip."""
        return POST_TRANSFORMS[group["post"]] is not None or group["vector_clip"]

    @staticmethod
    def _schedule_step(group: dict) -> int:
        """The step index ``k`` for the group's clip schedules in an eager step: ``int(steps_taken)`` when a
        schedule in use depends on it (an ``inverse_lr`` warm-up with ``warmup_steps > 0``, or a decay), else
        ``warmup_steps`` (where such a schedule is constant, ``c_k = c``), so that the counter is not read.
        Reading it costs no device sync (the counter lives on the CPU)."""
        scheds = ([group["c_schedule"]] if HyperMixin._clips(group) else []) + (
            [group["pre_c_schedule"]] if group["pre_c"] is not None else [])
        if any(reads_step(s, group["warmup_steps"]) for s in scheds):
            return int(group["steps_taken"])
        return group["warmup_steps"]

    @classmethod
    def _clip_thresholds(cls, group: dict) -> tuple:
        """``(c_k, pre_c_k)`` of the group's step (:func:`~spectrakit.optim.schedules.clip_threshold`;
        ``pre_c_k`` None without pre-clip, ``pre_c`` None or inf). Eagerly Python floats (a tensor ``lr`` is read
        during the warm-up only, where ``c_k = c peak_lr / lr_k`` needs its value). While ``torch.compile``
        traces the step, a threshold whose schedule depends on the step (warm-up, decay) is a 0-d float64 CPU
        tensor made by one operator call from the ``steps_taken`` and ``lr`` tensors
        (:func:`~spectrakit.optim.opaque.traced_threshold`, the same function evaluated by its kernel: the eager
        value bit for bit), so that the traced step reads neither on the host (no graph break, no recompile);
        the other thresholds stay the constant floats."""
        if torch.compiler.is_compiling():
            warmup = group["warmup_steps"]

            def traced(value, sched, used):  # constant thresholds as the eager step's (k = warmup: c_k = c)
                if used and value != math.inf and reads_step(sched, warmup):
                    return traced_threshold(value, group, sched)
                return clip_threshold(value, warmup, 0.0, group["peak_lr"], warmup, sched)

            pre_c = group["pre_c"]
            c_k = traced(group["c"], group["c_schedule"], cls._clips(group))
            if pre_c is None or pre_c == math.inf:
                return c_k, None
            return c_k, traced(pre_c, group["pre_c_schedule"], True)
        k, lr = cls._schedule_step(group), group["lr"]
        # the warm-up rule c_k = c peak_lr / lr_k needs lr_k's value: a tensor lr is read during warm-up only
        lr_c = float(lr) if isinstance(lr, torch.Tensor) and k < group["warmup_steps"] else lr
        c_k = clip_threshold(group["c"], k, lr_c, group["peak_lr"], group["warmup_steps"], group["c_schedule"])
        pre_c = group["pre_c"]
        pre_c_k = None if pre_c is None else clip_threshold(
            pre_c, k, lr_c, group["peak_lr"], group["warmup_steps"], group["pre_c_schedule"])
        if pre_c_k == math.inf:  # pre_c = inf: no pre-clip
            pre_c_k = None
        return c_k, pre_c_k
