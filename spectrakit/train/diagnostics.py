"""Spectral diagnostics of a training run (Jiang, Semenov and Stich 2026 §4.1, App. F.2, Fig. 4).

:class:`SpectralDiagnostics` (a training-loop callback) records, every ``every`` steps, per matrix
parameter ``W`` (``ndim >= 2``, viewed as ``(out, in)``):

- ``weight_sn = ||W||_2`` (after the step), ``weight_linf = max |W_ij|``, ``weight_fro = ||W||_F``;
- ``update_sn = ||U||_2`` of the applied update direction ``U = ((1 - lr wd) W_before - W_after) / lr``,
  i.e. the step with the decoupled weight decay removed and divided by the current LR (for SPECTRA this is
  ``alpha * soft_clip(U_base, c_k)``, so ``update_sn <= alpha c_k``);
- the aggregates of Fig. 4: ``agg_linf = max_l max |W_l|``, ``agg_fro = sqrt(sum_l ||W_l||_F^2)``, and the
  maxima of ``weight_sn`` and ``update_sn`` over layers;

and at the steps in ``spectra_steps`` the full singular-value spectra of the raw gradient (before clipping)
and of ``U`` (Fig. F.9-F.13). Spectral norms are exact (``torch.linalg.matrix_norm(ord=2)``, same-shaped
matrices batched); these run only at diagnostic steps and are excluded from the step time."""

# :func:`noise_structure` is the analysis of §F.2.2: signal ``G`` = mean gradient over a large batch, noise
# ``N = g - G`` for single-sequence gradients ``g``; it reports the top-``r`` singular values of ``N``,
# ``||G||_2`` and the subspace distances ``d_r(N, G) = max(d(U_N, U_G), d(V_N, V_G))`` (spectral and chordal).
# :class:`NoiseStructure` runs it as a callback at chosen steps.

from __future__ import annotations

import json
import os
from collections import defaultdict

import torch

from spectrakit._checks import check_choice, check_int
from spectrakit._files import open_append, write_atomic
from spectrakit.train.logs import RunLogger


def matrix_view(p: torch.Tensor) -> torch.Tensor:
    """``p`` as a matrix ``(out, prod(rest))`` (conv kernels flattened), in at least float32. An FSDP2
    (DTensor) parameter or gradient is gathered first (``full_tensor()``, a collective: under FSDP2 the
    diagnostics must run on every rank)."""
    p = p.detach()
    if hasattr(p, "full_tensor"):
        p = p.full_tensor()
    m = p.reshape(p.shape[0], -1)
    return m.double() if m.dtype == torch.float64 else m.float()


def _finite_or_nan(mats: torch.Tensor, fn) -> torch.Tensor:
    """``fn`` (a batched SVD-based function of ``(..., m, n)`` matrices) of the finite matrices, ``nan`` for
    the results of matrices holding a ``nan``/``inf`` entry (a diverged run), where LAPACK would raise
    instead. No host sync: non-finite matrices are replaced by zeros before ``fn`` and masked after."""
    finite = torch.isfinite(mats).flatten(-2).all(-1)
    out = fn(torch.where(finite[..., None, None], mats, torch.zeros((), dtype=mats.dtype, device=mats.device)))
    mask = finite.reshape(finite.shape + (1,) * (out.ndim - finite.ndim))
    return torch.where(mask, out, torch.full((), float("nan"), dtype=out.dtype, device=out.device))


def svdvals_or_nan(m: torch.Tensor) -> torch.Tensor:
    """Singular values of ``m`` (batched over leading dimensions), all ``nan`` where ``m`` is not finite."""
    return _finite_or_nan(m, torch.linalg.svdvals)


def batched_spectral_norms(mats: list[torch.Tensor]) -> list[float]:
    """Exact ``||M||_2`` of each matrix (``nan`` for a matrix with a non-finite entry); same-shaped matrices
    go through one batched call; one host transfer."""
    by_shape: dict[tuple, list[int]] = defaultdict(list)
    for i, m in enumerate(mats):
        by_shape[tuple(m.shape)].append(i)
    out = [0.0] * len(mats)
    vals, order = [], []
    for idx in by_shape.values():
        vals.append(_finite_or_nan(torch.stack([mats[i] for i in idx]),
                                   lambda m: torch.linalg.matrix_norm(m, ord=2)))
        order.extend(idx)
    for i, v in zip(order, torch.cat(vals).tolist()):
        out[i] = v
    return out


def subspace_distance(U1: torch.Tensor, U2: torch.Tensor, kind: str = "spectral") -> torch.Tensor:
    """Distance between the column spans of orthonormal ``U1, U2`` (m x r) (Jiang, Semenov and Stich 2026 §F.2.2):
    with ``A = U1^T U2`` and ``B = I - A A^T``, ``spectral = sqrt(lambda_max(B)) = max_i sin(theta_i)`` and
    ``chordal = sqrt(trace(B) / r)``. Uses :func:`spectrakit.linalg.subspace_distance` when available."""
    check_choice(kind, "kind", ("spectral", "chordal"))
    try:
        from spectrakit.linalg import subspace_distance as lin_sd
    except ImportError:
        lin_sd = None
    if lin_sd is not None:
        return lin_sd(U1, U2, kind=kind)
    A = U1.transpose(-1, -2) @ U2
    B = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device) - A @ A.transpose(-1, -2)
    if kind == "spectral":
        return torch.linalg.eigvalsh(B)[..., -1].clamp_min(0).sqrt()
    return (torch.diagonal(B, dim1=-2, dim2=-1).sum(-1) / A.shape[-1]).clamp_min(0).sqrt()


def _matrix_params(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    seen, out = set(), []
    for name, p in model.named_parameters():
        if p.ndim >= 2 and p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def _lr_wd(optimizer: torch.optim.Optimizer) -> dict[int, tuple[float, float]]:
    return {
        id(p): (float(g["lr"]), float(g.get("weight_decay", 0.0)))
        for g in optimizer.param_groups
        for p in g["params"]
    }


class _HookContext:
    """The ``ctx`` (model, optimizer, step) the callbacks read, for :meth:`SpectralDiagnostics.attach`."""

    def __init__(self, model, optimizer, step: int) -> None:
        self.model, self.optimizer, self.step = model, optimizer, step


class _Handles:
    def __init__(self, *handles) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class SpectralDiagnostics:
    """Training-loop callback recording the quantities in the module docstring.

    Args:
        every: record norms every ``every`` steps (and at step 0), >= 1.
        spectra_steps: steps (0-based) at which full singular-value spectra are stored.
        out_dir: folder for ``diagnostics.jsonl``/``.csv`` (aggregates), ``layers.jsonl``/``.csv``
            (per layer) and ``spectra.jsonl``; ``None`` keeps everything in memory (``rows``,
            ``layer_rows``, ``spectra``).
    """

    def __init__(self, every: int = 50, spectra_steps=(), out_dir: str | None = None) -> None:
        check_int(every, "every", low=1)
        self.every, self.spectra_steps = every, {int(s) for s in spectra_steps}
        self.logger = RunLogger(out_dir, "diagnostics")
        self.layer_logger = RunLogger(out_dir, "layers")
        self.spectra: list[dict] = []
        self.spectra_path = os.path.join(out_dir, "spectra.jsonl") if out_dir else None
        self._spectra_fresh = True  # an old spectra.jsonl is replaced at the first row, unless resume() keeps it
        self._before: dict[int, torch.Tensor] = {}

    def resume(self, start: int) -> None:
        """Continue after a checkpoint written once ``start`` steps were done: keep the logged rows of steps
        ``< start`` and drop later ones (they are recomputed)."""
        self.logger.resume(start - 1)
        self.layer_logger.resume(start - 1)
        self._spectra_fresh = False
        if self.spectra_path and os.path.exists(self.spectra_path):
            with open(self.spectra_path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            self.spectra = [r for r in rows if r["step"] < start]
            write_atomic(self.spectra_path, "".join(json.dumps(r) + "\n" for r in self.spectra))

    @property
    def rows(self) -> list[dict]:
        return self.logger.rows

    @property
    def layer_rows(self) -> list[dict]:
        return self.layer_logger.rows

    def active(self, step: int) -> bool:
        return step % self.every == 0 or step in self.spectra_steps

    def _save_spectrum(self, step: int, layer: str, kind: str, sv: torch.Tensor) -> None:
        row = {"step": step, "layer": layer, "kind": kind, "sv": sv.tolist()}
        self.spectra.append(row)
        if self.spectra_path:
            if self._spectra_fresh and os.path.exists(self.spectra_path):
                os.remove(self.spectra_path)
            self._spectra_fresh = False
            with open_append(self.spectra_path) as f:
                f.write(json.dumps(row) + "\n")

    def before_step(self, ctx) -> None:
        params = _matrix_params(ctx.model)
        self._before = {id(p): p.detach().clone() for _, p in params}
        if ctx.step in self.spectra_steps:
            for name, p in params:
                if p.grad is not None:
                    self._save_spectrum(
                        ctx.step, name, "grad", svdvals_or_nan(matrix_view(p.grad)).cpu()
                    )

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, start_step: int = 0):
        """Record from any training loop (Hugging Face ``Trainer``, Lightning, a plain loop): registers
        ``optimizer.register_step_pre_hook``/``register_step_post_hook`` so that every ``optimizer.step()``
        calls :meth:`before_step`/:meth:`after_step` at the active steps; the step counter starts at
        ``start_step`` (>= 0) and counts ``optimizer.step()`` calls. Returns a handle whose ``remove()``
        detaches both hooks. Under FSDP2 every rank must attach (the norms gather the shards)."""
        check_int(start_step, "start_step", low=0)
        ctx = _HookContext(model, optimizer, start_step)

        def pre(_opt, _args, _kwargs):
            if self.active(ctx.step):
                self.before_step(ctx)

        def post(_opt, _args, _kwargs):
            if self.active(ctx.step):
                self.after_step(ctx)
            ctx.step += 1

        return _Handles(optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post))

    def after_step(self, ctx) -> None:
        params = _matrix_params(ctx.model)
        lr_wd = _lr_wd(ctx.optimizer)
        weights, updates = [], []
        for _, p in params:
            lr, wd = lr_wd.get(id(p), (1.0, 0.0))
            before = matrix_view(self._before[id(p)])
            weights.append(matrix_view(p))
            # lr = 0 (e.g. step 0 of a warm-up from zero): the step is zero, report ||U|| = 0, not NaN
            updates.append(((1 - lr * wd) * before - weights[-1]) / (lr or 1.0))
        w_sn, u_sn = batched_spectral_norms(weights), batched_spectral_norms(updates)
        fro = torch.stack([torch.linalg.matrix_norm(w) for w in weights]).tolist()
        linf = torch.stack([w.abs().max() for w in weights]).tolist()
        step = ctx.step
        self.logger.log(
            {
                "step": step,
                "agg_linf": max(linf),
                "agg_fro": sum(f * f for f in fro) ** 0.5,
                "max_weight_sn": max(w_sn),
                "max_update_sn": max(u_sn),
            }
        )
        for (name, _), ws, us, f, li in zip(params, w_sn, u_sn, fro, linf):
            self.layer_logger.log(
                {
                    "step": step,
                    "layer": name,
                    "weight_sn": ws,
                    "update_sn": us,
                    "weight_fro": f,
                    "weight_linf": li,
                }
            )
        if step in self.spectra_steps:
            for (name, _), u in zip(params, updates):
                self._save_spectrum(step, name, "update", svdvals_or_nan(u).cpu())
        self._before = {}


def noise_structure(
    model: torch.nn.Module, signal_batches, sample_batches, *, names=None, r: int = 5, autocast=None
) -> list[dict]:
    """Noise-structure analysis of Jiang, Semenov and Stich 2026 §F.2.2 for the matrix parameters ``names`` (default:
    all).

    Args:
        model: an (unwrapped) LM returning ``(logits, loss)`` from ``model(x, y)``.
        signal_batches: iterable of ``(x, y)`` micro-batches (on the model's device) whose mean gradient
            is the signal ``G`` (the paper uses 4096 sequences).
        sample_batches: iterable of ``(x, y)``; each gives one stochastic gradient ``g`` (paper: single
            sequences, 50 of them) and the noise ``N = g - G``.
        r: number of top singular values/vectors, >= 1 (paper: 5).
        autocast: optional context-manager factory for the forward passes.

    Returns one row per (sample, layer): ``sample``, ``layer``, ``signal_sn = ||G||_2``, ``noise_sv``
    (top-r singular values of N), ``ratio = sigma_1(N) / ||G||_2``, ``d_spec`` and ``d_chord``
    (``max`` over left and right subspaces). Leaves the parameters' ``.grad`` set to ``None``.
    """
    check_int(r, "r", low=1)
    params = [(n, p) for n, p in _matrix_params(model) if names is None or n in names]

    def grads(batches) -> tuple[list[torch.Tensor], int]:
        acc, count = [torch.zeros_like(matrix_view(p)) for _, p in params], 0
        for x, y in batches:
            model.zero_grad(set_to_none=True)
            with autocast() if autocast else torch.enable_grad():
                _, loss = model(x, y)
            loss.backward()
            for a, (_, p) in zip(acc, params):
                a += matrix_view(p.grad)
            count += 1
        model.zero_grad(set_to_none=True)
        return acc, count

    acc, count = grads(signal_batches)
    if count == 0:
        raise ValueError("signal_batches must yield at least one batch")
    signal = [(a / count).double() for a in acc]
    tops = []
    for G in signal:
        U, S, Vh = torch.linalg.svd(G, full_matrices=False)
        k = min(r, S.numel())
        tops.append((U[:, :k], Vh[:k].T, S[0]))
    rows = []
    for i, batch in enumerate(sample_batches):
        g, _ = grads([batch])
        for (name, _), gi, G, (UG, VG, sG) in zip(params, g, signal, tops):
            N = gi.double() - G
            U, S, Vh = torch.linalg.svd(N, full_matrices=False)
            k = UG.shape[1]
            UN, VN = U[:, :k], Vh[:k].T
            d_spec = torch.maximum(
                subspace_distance(UN, UG, "spectral"), subspace_distance(VN, VG, "spectral")
            )
            d_chord = torch.maximum(
                subspace_distance(UN, UG, "chordal"), subspace_distance(VN, VG, "chordal")
            )
            rows.append(
                {
                    "sample": i,
                    "layer": name,
                    "signal_sn": float(sG),
                    "noise_sv": S[:k].tolist(),
                    "ratio": float(S[0] / sG),
                    "d_spec": float(d_spec),
                    "d_chord": float(d_chord),
                }
            )
    return rows


class NoiseStructure:
    """Callback running :func:`noise_structure` after the optimizer step at ``steps``.

    ``make_batches(step) -> (signal_batches, sample_batches)`` supplies the data (use a stream separate
    from the training stream so the training data order is unchanged); rows go to
    ``<out_dir>/noise.jsonl`` with the ``step`` added; a step whose weights are not finite (a diverged run)
    is skipped."""

    def __init__(self, steps, make_batches, *, r: int = 5, names=None, out_dir: str | None = None) -> None:
        self.steps, self.make_batches, self.r, self.names = {int(s) for s in steps}, make_batches, r, names
        self.logger = RunLogger(out_dir, "noise")

    @property
    def rows(self) -> list[dict]:
        return self.logger.rows

    def active(self, step: int) -> bool:
        return step in self.steps

    def after_step(self, ctx) -> None:
        params = [p for _, p in _matrix_params(ctx.model)]
        if not bool(torch.stack([torch.isfinite(matrix_view(p)).all() for p in params]).all()):
            return  # a diverged run: no gradient structure to measure (the SVDs would fail)
        signal, samples = self.make_batches(ctx.step)
        for row in noise_structure(ctx.model, signal, samples, names=self.names, r=self.r):
            self.logger.log({"step": ctx.step, **row})
