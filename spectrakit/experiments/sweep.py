"""Tune the learning rate of several optimizers over seeds: the grid of `spectrakit compare` runs.

What the command does and its options: :mod:`spectrakit.experiments.sweep_cli` (its description).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
import time

from spectrakit._checks import check_choice, check_int, check_scalar
from spectrakit._cliargs import UsageError
from spectrakit._files import read_regular, save_figure, write_atomic
from spectrakit.experiments import compare as cmp
from spectrakit.experiments import runfolders
from spectrakit.experiments.io import environment, invocation, markdown_table
from spectrakit.experiments.sweep_cli import add_arguments  # noqa: F401 (the sweep's options)
from spectrakit.train import interrupt
from spectrakit.train.optimizers import OPTIMIZERS

RUN_FILE = "run.json"
SWEEP_OPTIONS = tuple(k for k in cmp.RUN_OPTIONS if k != "lr")  # a point's LR is its own; c may be swept too
OUTPUTS = ("sweep.json", "sweep.md", "lr_sensitivity.png", "c_sweep.png", "best")  # a sweep's own files
NORM_KEYS = ("max_weight_sn", "max_update_sn", "agg_linf")
SUMMARY_COLUMNS = [
    "optimizer", "c", "best_lr", "val_loss_mean", "val_loss_std", "seeds", "lr_range_lo", "lr_range_hi",
    *NORM_KEYS, "diverged_points",
]
GRID_COLUMNS = ["optimizer", "c", "lr", "val_loss_mean", "val_loss_std", "seeds", "diverged"]


# ----------------------------------------------------------------------------- pure aggregation / selection
def _mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; 0 for a single value)."""
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def grid_table(rows: list[dict]) -> list[dict]:
    """Group run rows by ``(optimizer, c, lr)``: mean and std of ``val_loss`` over seeds.

    A point is ``diverged`` when any of its seeds diverged or has a non-finite validation loss; its mean is
    then ``nan`` (recorded, never comparable). The weight-norm quantities (``max_weight_sn``,
    ``max_update_sn``, ``agg_linf``) are averaged over seeds.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["optimizer"], r.get("c"), r["lr"]), []).append(r)
    out = []
    for (name, c, lr), rs in groups.items():
        losses = [float(r["val_loss"]) for r in rs]
        diverged = any(bool(r.get("diverged")) or not math.isfinite(v) for r, v in zip(rs, losses))
        m, s = (math.nan, math.nan) if diverged else _mean_std(losses)
        point = {"optimizer": name, "c": c, "lr": lr, "val_loss_mean": m, "val_loss_std": s,
                 "seeds": len(rs), "diverged": diverged}
        for k in NORM_KEYS:
            vals = [float(v) if isinstance(v := r.get(k), (int, float)) else math.nan for r in rs]
            point[k] = sum(vals) / len(vals)
        out.append(point)
    out.sort(key=lambda p: (p["optimizer"], math.inf if p["c"] is None else p["c"], p["lr"]))
    return out


def select_best(points: list[dict], tol: float = 0.05) -> list[dict]:
    """Per ``(optimizer, c)``: the LR with the smallest mean validation loss over non-diverged points.

    ``lr_range_lo``/``lr_range_hi`` bound the LRs whose mean loss is within ``tol`` nats of the best (the
    stability measure of Jiang, Semenov and Stich 2026, Fig. 2); ``best_lr`` is ``nan`` when every point
    diverged. ``diverged_points`` counts the diverged LRs.
    """
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"tol must be a number >= 0, got {tol!r}")
    by_key: dict[tuple, list[dict]] = {}
    for p in points:
        by_key.setdefault((p["optimizer"], p["c"]), []).append(p)
    out = []
    for (name, c), ps in by_key.items():
        ok = [p for p in ps if not p["diverged"] and math.isfinite(p["val_loss_mean"])]
        row = {"optimizer": name, "c": c, "diverged_points": len(ps) - len(ok)}
        if not ok:
            row.update(best_lr=math.nan, val_loss_mean=math.nan, val_loss_std=math.nan, seeds=0,
                       lr_range_lo=math.nan, lr_range_hi=math.nan, **{k: math.nan for k in NORM_KEYS})
        else:
            best = min(ok, key=lambda p: (p["val_loss_mean"], p["lr"]))
            near = [p["lr"] for p in ok if p["val_loss_mean"] <= best["val_loss_mean"] + tol]
            row.update(best_lr=best["lr"], val_loss_mean=best["val_loss_mean"], val_loss_std=best["val_loss_std"],
                       seeds=best["seeds"], lr_range_lo=min(near), lr_range_hi=max(near),
                       **{k: best[k] for k in NORM_KEYS})
        out.append(row)
    return out


def differences(best: list[dict]) -> list[dict]:
    """Each SPECTRA optimizer at its best LR minus its base optimizer at the base's best LR:
    ``delta = mean_spectra - mean_base`` (negative: SPECTRA is better) with the combined seed spread
    ``sqrt(std_spectra^2 + std_base^2)``; one row per tuned ``(optimizer, c)`` whose base was swept."""
    base_best = {b["optimizer"]: b for b in best if b["c"] is None}
    out = []
    for b in best:
        spec = OPTIMIZERS.get(b["optimizer"])
        ref = base_best.get(spec.base) if spec is not None and spec.base else None
        if ref is None:
            continue
        out.append({"optimizer": b["optimizer"], "c": b["c"], "base": spec.base,
                    "delta_val_loss": b["val_loss_mean"] - ref["val_loss_mean"],
                    "spread": math.hypot(b["val_loss_std"], ref["val_loss_std"])})
    return out


def edge_points(points: list[dict], seeds, tol: float = 0.05) -> list[dict]:
    """Grid points one LR step beyond the edges of the grid where the optimum may lie outside it.

    Per ``(optimizer, c)`` of :func:`grid_table` rows: if the lowest LR ``l_1`` did not diverge and its mean
    validation loss is within ``tol`` nats of the best, add ``l_1^2 / l_2`` (one grid step below, for a
    geometric grid ``l_1 < l_2 < ...``); likewise ``l_n^2 / l_{n-1}`` above the highest LR ``l_n``. With a
    single LR the steps are x0.5 and x2. New LRs are rounded to 6 significant digits; one point per seed.
    """
    check_scalar(tol, "tol", low=0, allow_tensor=False)
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault((p["optimizer"], p["c"]), []).append(p)
    out = []
    for (name, c), ps in groups.items():
        ps = sorted(ps, key=lambda p: p["lr"])
        ok = [p["val_loss_mean"] for p in ps if not p["diverged"] and math.isfinite(p["val_loss_mean"])]
        if not ok:
            continue
        best = min(ok)
        new = []
        for edge, inner, step in ((ps[0], ps[1] if len(ps) > 1 else None, 0.5),
                                  (ps[-1], ps[-2] if len(ps) > 1 else None, 2.0)):
            if edge["diverged"] or not edge["val_loss_mean"] <= best + tol:
                continue
            lr = edge["lr"] ** 2 / inner["lr"] if inner is not None else edge["lr"] * step
            new.append(float(f"{lr:.6g}"))
        for lr in dict.fromkeys(new):
            out += [{"optimizer": name, "c": c, "lr": lr, "seed": int(s)} for s in seeds]
    return out


# ----------------------------------------------------------------------------- runs
def parse_lrs(text: str) -> list:
    """``--lrs``: comma-separated peak LRs, each a number (``3e-3``) or a multiple of the optimizer's own
    default LR (``2x``: twice the default of each optimizer, so one grid fits optimizers whose good LRs differ
    by orders of magnitude, such as Signum and Muon). Raises ``ValueError`` for anything else."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            out.append(f"{float(item[:-1]):g}x" if item.lower().endswith("x") else float(item))
        except ValueError:
            raise ValueError(f"lrs must be numbers or multiples such as 2x, got {item!r}") from None
    return out


def parse_cs(text: str) -> tuple[float, ...]:
    """``--cs``: comma-separated clip thresholds as floats; ``ValueError`` naming the flag otherwise (the
    range, finite and > 0, is checked by :func:`grid`)."""
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"cs must be comma-separated numbers, got {text!r}") from None


def parse_shard(text: str) -> tuple[int, int]:
    """``--shard I/N`` as ``(I, N)``; ``ValueError`` naming the flag unless ``0 <= I < N``."""
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"shard must look like I/N (e.g. 0/2), got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"shard must be I/N with 0 <= I < N, got {text!r}")
    return i, n


def resolve_lr(lr, optimizer: str) -> float:
    """The peak LR of a grid entry for ``optimizer``: ``lr`` itself, or ``k`` times the optimizer's default LR
    (``spectrakit.train.optimizers.OPTIMIZERS``) for ``"kx"``."""
    if isinstance(lr, str):
        return float(f"{float(lr[:-1]) * OPTIMIZERS[optimizer].lr:.6g}")
    return float(lr)


def grid(optimizers, lrs, seeds, cs=()) -> list[dict]:
    """The sweep points: every optimizer x LR x seed, and x ``c`` for SPECTRA optimizers when ``cs`` is given
    (``c`` is ``None`` where it does not apply or is not swept). An LR ``"kx"`` is ``k`` times each
    optimizer's default LR (:func:`resolve_lr`)."""
    if not optimizers or not lrs or not seeds:
        raise ValueError("optimizers, lrs and seeds must each list at least one value")
    for lr in lrs:
        v = float(lr[:-1]) if isinstance(lr, str) and lr.endswith("x") else lr
        if isinstance(v, str) or not (v > 0 and math.isfinite(v)):
            raise ValueError(f"lrs must be finite and > 0, got {lr!r}")
    for c in cs:
        if not (c > 0 and math.isfinite(c)):
            raise ValueError(f"cs must be finite and > 0, got {c!r} (for no clipping, c = inf, sweep the base "
                             "optimizer, e.g. adamw next to spectra-adamw)")
    points = []
    for name in optimizers:
        check_choice(name, "optimizers", OPTIMIZERS)
        for c in (cs if cs and OPTIMIZERS[name].spectra else (None,)):
            for lr in lrs:
                for seed in seeds:
                    points.append({"optimizer": name, "c": c, "lr": resolve_lr(lr, name), "seed": int(seed)})
    return points


def run_name(point: dict) -> str:
    """Folder name of a sweep point, e.g. ``spectra-adamw-c10-lr0.003-s0``."""
    c = "" if point["c"] is None else f"-c{point['c']:g}"
    return f"{point['optimizer']}{c}-lr{point['lr']:g}-s{point['seed']}"


def load_finished(run_dir: str) -> dict | None:
    """The row of a finished run (``run.json`` written after training, ``complete`` true), else ``None``."""
    if not runfolders.owned(run_dir):  # a folder the tool did not make holds no result of it
        return None
    try:
        data = json.loads(read_regular(os.path.join(run_dir, RUN_FILE)))
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(data, dict) and data.get("complete") is True and isinstance(data.get("row"), dict)
    return data["row"] if ok else None


def _run_or_resume(run_dir: str, point: dict, options: dict) -> dict:
    """Train one sweep point with :func:`spectrakit.experiments.compare.compare` and write its ``run.json``.
    An unfinished run folder (no complete ``run.json``) continues from its newest usable checkpoint
    (``compare(resume=True)``: bit-identical to an uninterrupted run on CPU); a new one starts at step 0."""
    c = options.get("c", 10.0) if point["c"] is None else point["c"]
    opts = {**options, "optimizers": (point["optimizer"],), "seeds": (point["seed"],), "lr": point["lr"],
            "c": c, "out": run_dir, "resume": True}
    (row,) = cmp.compare(**opts)
    row = {k: v for k, v in row.items() if k != "overhead_%"}
    row["c"] = point["c"]
    write_atomic(os.path.join(run_dir, RUN_FILE), json.dumps({"complete": True, "point": point, "row": row},
                                                             default=str))
    return row


def sweep(*, lrs, cs=(), out: str = "runs/sweep", tol: float = 0.05, shard: tuple[int, int] = (0, 1),
          extend: int = 0, **options) -> dict:
    """Run (or skip when finished) every grid point; ``options`` are :class:`CompareOptions` fields
    (``optimizers`` and ``seeds`` span the grid, ``lr``/``c``/``out`` are set per point).

    ``shard = (i, n)``: train only the unfinished points whose grid index is ``i`` mod ``n``, so that ``n``
    processes (e.g. one per core, each with one thread) share one grid in one ``out`` folder; points of the
    other shards enter the result only once finished (``pending`` lists the others). A last run without a
    shard trains whatever is left and reports the whole grid.

    ``extend = R``: up to ``R`` rounds that add the LRs one grid step beyond an edge whose loss is within
    ``tol`` of the best (:func:`edge_points`), so that the best LR ends up inside the grid; a round starts only
    when no point is pending, and its points continue the grid index, so shards split them too.

    Returns ``{"rows", "points", "best", "differences", "ran", "skipped", "pending", "extended"}``: run rows,
    :func:`grid_table`, :func:`select_best`, :func:`differences`, the names of the points trained now,
    finished before and left to other shards, and the names of the points added beyond the grid's edges.
    """
    k, n_shards = shard
    if not (isinstance(n_shards, int) and isinstance(k, int) and n_shards >= 1 and 0 <= k < n_shards):
        raise ValueError(f"shard must be (i, n) with n >= 1 and 0 <= i < n, got {shard!r}")
    check_int(extend, "extend", low=0, high=20)
    check_scalar(tol, "tol", low=0, allow_tensor=False)
    names = tuple(options.pop("optimizers", cmp.CompareOptions.optimizers))
    seeds = tuple(options.pop("seeds", cmp.CompareOptions.seeds))
    for key in ("lr", "out"):
        options.pop(key, None)
    checked = cmp.CompareOptions(**options, optimizers=names, seeds=seeds)
    cfg = checked.resolved()  # validate before any run
    # a sweep always continues its --out: its points must keep the options they were started with
    runfolders.start(out, "sweep", cmp.run_options(checked, cfg, SWEEP_OPTIONS), resume=True,
                     write=runfolders.main_process())
    res = {"rows": [], "ran": [], "skipped": [], "pending": [], "extended": []}
    todo = grid(names, tuple(lrs), seeds, tuple(cs))
    known = {run_name(p) for p in todo}
    index = 0  # global grid index: the shards split the extension rounds' points too
    for round_ in range(extend + 1):
        if round_ > 0:
            if res["pending"]:
                break  # the edges are decided only once every point so far has finished
            todo = [p for p in edge_points(grid_table(res["rows"]), seeds, tol) if run_name(p) not in known]
            if not todo:
                break
            known.update(run_name(p) for p in todo)
            res["extended"] += [run_name(p) for p in todo]
        for point in todo:
            index += 1
            _visit(point, index, len(known), out, shard, options, res)
    points = grid_table(res["rows"])
    best = select_best(points, tol)
    return {**res, "points": points, "best": best, "differences": differences(best)}


def _visit(point: dict, index: int, size: int, out: str, shard: tuple[int, int], options: dict,
           res: dict) -> None:
    """Skip a finished point, leave another shard's point pending, or train it; record it in ``res``.
    ``index``: the point's 1-based grid index (shard ``i/n`` trains the indices ``= i + 1 mod n``);
    ``size``: the grid's size so far."""
    name = run_name(point)
    run_dir = os.path.join(out, name)
    row = load_finished(run_dir)
    if row is None and (index - 1) % shard[1] != shard[0]:
        res["pending"].append(name)
        return
    if options.get("progress", True):
        state = "finished before, skipped" if row is not None else "training"
        print(f"sweep [{index}/{size}] {name}: {state}", file=sys.stderr, flush=True)
    if row is None:
        if runfolders.main_process():
            runfolders.make_run(out, name)
        row = _run_or_resume(run_dir, point, options)
        res["ran"].append(name)
    else:
        res["skipped"].append(name)
    res["rows"].append(row)


# ----------------------------------------------------------------------------- plots and report
def plot(result: dict, out_dir: str) -> list[str]:
    """Save ``lr_sensitivity.png`` (mean validation loss vs LR per optimizer, error bars = std over seeds,
    diverged points marked x on a row above every finite point), ``best/loss_curves.png`` and
    ``best/weight_norms.png`` (the runs at the best LRs, via :func:`spectrakit.experiments.compare.plot`) and,
    when ``c`` was swept, ``c_sweep.png``
    (best-LR validation loss vs ``c``, with the base optimizer, ``c = inf``, as a dashed level when it was
    swept too)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    points, best = result["points"], result["best"]
    finite = [p["val_loss_mean"] for p in points if math.isfinite(p["val_loss_mean"])]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    top = hi + 0.12 * ((hi - lo) or 1.0)  # the diverged row, above every finite point
    fig, ax = plt.subplots(figsize=(7, 4.5))
    keys = list(dict.fromkeys((p["optimizer"], p["c"]) for p in points))
    for k, key in enumerate(keys):
        ps = [p for p in points if (p["optimizer"], p["c"]) == key]
        label = key[0] + ("" if key[1] is None else f" c={key[1]:g}")
        ok = [p for p in ps if not p["diverged"]]
        line = ax.errorbar([p["lr"] for p in ok], [p["val_loss_mean"] for p in ok],
                           yerr=[p["val_loss_std"] for p in ok], marker="o", capsize=3, label=label)
        bad = [p["lr"] for p in ps if p["diverged"]]
        if bad:  # side by side (a few % apart on the log axis) so that the markers of one LR do not hide
            shift = 1.07 ** (k - (len(keys) - 1) / 2)
            ax.plot([b * shift for b in bad], [top] * len(bad), "x", color=line[0].get_color(), ms=9, mew=2)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("validation loss (nats), mean over seeds")
    if any(p["diverged"] for p in points):
        ax.axhline(top, color="0.6", lw=0.8, ls=":")
        ax.annotate("diverged", (0.01, top), xycoords=("axes fraction", "data"), va="bottom", fontsize="small",
                    color="0.4")
        ax.set_title("LR sensitivity (x on the top row: diverged)")
    else:
        ax.set_title("LR sensitivity (no run diverged)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths = [os.path.join(out_dir, "lr_sensitivity.png")]
    save_figure(fig, paths[0], dpi=120)
    plt.close(fig)
    chosen = {(b["optimizer"], b["c"], b["best_lr"]) for b in best}
    best_rows = [r for r in result["rows"] if (r["optimizer"], r["c"], r["lr"]) in chosen and "_curve" in r]
    if best_rows:
        paths += cmp.plot(best_rows, os.path.join(out_dir, "best"), title="loss at the best LRs")
    swept = [b for b in best if b["c"] is not None]
    if swept:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in dict.fromkeys(b["optimizer"] for b in swept):
            bs = sorted((b for b in swept if b["optimizer"] == name), key=lambda b: b["c"])
            line = ax.errorbar([b["c"] for b in bs], [b["val_loss_mean"] for b in bs],
                               yerr=[b["val_loss_std"] for b in bs], marker="o", capsize=3, label=name)
            spec = OPTIMIZERS.get(name)
            ref = next((b for b in best if b["c"] is None and spec is not None and b["optimizer"] == spec.base), None)
            if ref is not None:  # c = inf is the base optimizer: a dashed level with its seed band
                mean, std = ref["val_loss_mean"], ref["val_loss_std"]
                ax.axhline(mean, ls="--", color=line[0].get_color(), label=f"c = inf ({ref['optimizer']})")
                ax.axhspan(mean - std, mean + std, color=line[0].get_color(), alpha=0.12)
        ax.set_xscale("log")
        ax.set_xlabel("clip threshold c")
        ax.set_ylabel("validation loss at the best LR")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "c_sweep.png"))
        save_figure(fig, paths[-1], dpi=120)
        plt.close(fig)
    return paths


def _compare_options(args: argparse.Namespace) -> dict:
    """The :class:`CompareOptions` fields from the parsed compare arguments (tuples from comma lists)."""
    opts = {}
    for field in dataclasses.fields(cmp.CompareOptions):
        if field.name in ("progress", "lr", "out") or not hasattr(args, field.name):
            continue
        value = getattr(args, field.name)
        if isinstance(field.default, tuple) and isinstance(value, str):
            value = cmp._csv(value, type(field.default[0]) if field.default else int)
        opts[field.name] = value
    if opts.get("grad_clip") is not None and opts["grad_clip"] <= 0:
        opts["grad_clip"] = None
    opts["progress"] = not args.quiet
    return opts


def _shown(rows: list[dict]) -> list[dict]:
    """Rows for the markdown tables: ``c = None`` (not swept or not a SPECTRA optimizer) shown as ``-``."""
    return [{**r, "c": "-" if r.get("c") is None else r["c"]} for r in rows]


def _again_command(args: argparse.Namespace) -> str:
    """The command that continues this sweep: the same one (finished points are kept), without ``--force``."""
    if sys.argv[1:2] == ["sweep"]:
        return "spectrakit " + shlex.join(a for a in sys.argv[1:] if a != "--force")
    return f"spectrakit sweep --out {shlex.quote(args.out)} (with the same options)"


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.lr is not None:
        print("spectrakit sweep: error: --lr is set per point by --lrs; drop --lr", file=sys.stderr)
        return 2
    try:  # the grid's own arguments, checked before any run; the compare options are checked in sweep()
        lrs, cs, shard = parse_lrs(args.lrs), parse_cs(args.cs), parse_shard(args.shard)
        grid(tuple(args.optimizers), lrs, (0,), cs)
        check_int(args.extend, "extend", low=0, high=20)
        check_scalar(args.tol, "tol", low=0, allow_tensor=False)
    except ValueError as e:
        raise UsageError(f"--{e}") from None
    if args.dist_timeout <= 0:
        raise UsageError(f"--dist-timeout must be > 0 seconds, got {args.dist_timeout}")
    os.environ["SPECTRAKIT_DIST_TIMEOUT"] = str(args.dist_timeout)
    opts = _compare_options(args)
    if shard == (0, 1):  # one sweep per --out; the shards of one grid share it, one process per shard
        with runfolders.lock_out(args.out):
            return _run(args, t0, lrs, cs, shard, opts)
    if args.force:
        raise UsageError("--force deletes the whole sweep: run it once without --shard")
    with runfolders.lock_out(args.out, shared=True), \
            runfolders.lock_out(args.out, name=f"{runfolders.LOCK}.shard-{shard[0]}-of-{shard[1]}"):
        return _run(args, t0, lrs, cs, shard, opts)


def _run(args: argparse.Namespace, t0: float, lrs, cs, shard, opts: dict) -> int:
    if runfolders.main_process():  # the other ranks of a torchrun job neither check nor clean --out
        runfolders.claim_out(args.out, "sweep")  # new, empty or a sweep's: never another folder
        if args.force:  # only what a sweep wrote: other folders in --out stay
            runfolders.remove_runs(args.out, OUTPUTS)
    try:
        with interrupt.graceful():
            result = sweep(lrs=lrs, cs=cs, out=args.out, tol=args.tol, shard=shard, extend=args.extend, **opts)
    except RuntimeError as e:
        cmp.stalled_rank_exit(e, args.dist_timeout)
        raise
    except interrupt.Interrupted as e:
        where = f"checkpoint {e.checkpoint}" if e.checkpoint else "no checkpoint"
        interrupt.report_stop(f"interrupted at step {e.step} ({where}); continue with: {_again_command(args)}")
        return e.exit_code
    paths = plot(result, args.out)
    command = invocation("sweep", "")
    env = environment()
    text = (f"## sweep\n\ndevice: {env['device']} · torch {env['torch']} · {env['date']}\n\n"
            + (f"command: `{command}`\n\n" if command else "")
            + f"runs: {len(result['rows'])} ({len(result['ran'])} trained now, {len(result['skipped'])} "
            f"finished before" + (f", {len(result['pending'])} left to other shards" if result["pending"] else "")
            + (f"; {len(result['extended'])} beyond the LR grid's edges" if result["extended"] else "")
            + f"), wall {time.perf_counter() - t0:.0f} s\n\n### best LR per optimizer "
            f"(mean ± std of validation loss over seeds; LR range within {args.tol:g} nats of the best)\n\n"
            + markdown_table(_shown(result["best"]), SUMMARY_COLUMNS)
            + "\n\n### SPECTRA minus its base optimizer, each at its best LR (negative: SPECTRA lower)\n\n"
            + markdown_table(_shown(result["differences"]), ["optimizer", "c", "base", "delta_val_loss", "spread"])
            + "\n\n### every point\n\n" + markdown_table(_shown(result["points"]), GRID_COLUMNS) + "\n")
    print(text)
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in result["rows"]]
    summary = {"env": env, "command": command,
               "options": {k: list(v) if isinstance(v, tuple) else v for k, v in opts.items()},
               "lrs": lrs, "cs": cs, "tol": args.tol, "extend": args.extend, "extended": result["extended"],
               "rows": public, "points": result["points"], "best": result["best"], "ran": result["ran"],
               "differences": result["differences"], "skipped": result["skipped"], "pending": result["pending"],
               "wall_s": time.perf_counter() - t0}
    write_atomic(os.path.join(args.out, "sweep.json"), json.dumps(summary, indent=1, default=str))
    write_atomic(os.path.join(args.out, "sweep.md"), text)
    print("plots: " + ", ".join(paths))
    return 0


main = run
