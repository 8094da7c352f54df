"""Train a small LLaMA-style LM with several optimizers and compare them (default: AdamW vs SpectraAdamW).

Every optimizer trains the same model (same initialisation seed), on the same data in the same order, with
the same LR schedule (Jiang, Semenov and Stich 2026 §6.2: WSD with square-root decay over the final 20%, linear
warm-up). The
table reports the final validation loss and perplexity, the mean step time (forward + backward + optimizer)
and SPECTRA's overhead over its base optimizer, and the largest weight and update spectral norms and the
aggregated weight ``l_inf`` norm at the end (Jiang, Semenov and Stich 2026 Fig. 4). Without arguments it runs the
``cpu``
setting (tiny model, ~3-5 min on 2 CPU cores) or, on CUDA, the larger ``cuda`` setting; results (table,
JSON, loss-curve and weight-norm plots, per-run logs) go to ``--out``.
"""

from __future__ import annotations

import argparse

from spectrakit._cliargs import int_list, name_list, positive_int
from spectrakit.data.corpora import CORPORA
from spectrakit.data.tokenizer import tokenizer_name

# The names the options accept, here without importing torch (``--help`` and argument errors answer at once):
# the registries are spectrakit.train.optimizers.OPTIMIZERS, spectrakit.models.llama.PRESETS,
# spectrakit.train.schedules.SCHEDULES and spectrakit.train.distributed.PARALLEL_MODES (a test keeps them equal)
OPTIMIZERS = ("adamw", "spectra-adamw", "signum", "spectra-signum", "ademamix", "spectra-ademamix", "mars",
              "spectra-mars", "lion", "spectra-lion", "muon", "dmuon", "torch-adamw", "lmo-nuclear-signum",
              "lmo-schatten3-signum", "lmo-entropy-signum")
PRESETS = ("nano", "tiny", "mini", "small", "124m", "160m")
SCHEDULES = ("wsd", "cosine", "constant")
PARALLEL_MODES = ("ddp", "fsdp2")

# Named settings; any field can be overridden from the command line.
SETTINGS: dict[str, dict] = {
    "cpu": dict(
        preset="tiny",
        tokenizer="bpe4096",
        batch_size=16,
        seq_len=128,
        steps=200,
        warmup=20,
        eval_every=50,
        eval_tokens=32768,
        diag_every=25,
    ),
    "cuda": dict(
        preset="small",
        tokenizer="bpe8192",
        batch_size=32,
        seq_len=512,
        steps=1000,
        warmup=100,
        eval_every=100,
        eval_tokens=262144,
        diag_every=100,
    ),
    "cuda-124m": dict(
        preset="124m",
        tokenizer="bpe8192",
        batch_size=32,
        seq_len=512,
        steps=2000,
        warmup=200,
        eval_every=250,
        eval_tokens=524288,
        diag_every=250,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--optimizers",
        default=("adamw", "spectra-adamw"),
        type=name_list(tuple(OPTIMIZERS)),
        help=f"comma-separated names from: {', '.join(OPTIMIZERS)} (default: adamw,spectra-adamw)",
    )
    parser.add_argument(
        "--setting",
        default="auto",
        choices=["auto", *SETTINGS],
        help="defaults for model/data/steps; auto = cuda if available else cpu",
    )
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS), help="model preset")
    parser.add_argument("--corpus", default="stdlib", choices=sorted(CORPORA),
                        help="text corpus (see spectrakit data list)")
    parser.add_argument("--tokenizer", default=None, type=tokenizer_name,
                        help="'bytes' or 'bpeN' (default: the setting's, bpe4096 on cpu)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="optimizer steps per run (default: the setting's, 200 on cpu)")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="sequences per micro-batch (default: the setting's, 16 on cpu)")
    parser.add_argument("--seq-len", type=positive_int, default=None,
                        help="tokens per sequence (default: the setting's, 128 on cpu)")
    parser.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--warmup", type=int, default=None,
                        help="LR warm-up steps (default: the setting's, 20 on cpu, scaled down to 10%% of a "
                        "shorter --steps)")
    parser.add_argument("--schedule", default="wsd", choices=SCHEDULES, help="LR schedule")
    parser.add_argument(
        "--lr", type=float, default=None, help="peak LR for all optimizers (default: each optimizer's own)"
    )
    parser.epilog = (
        "Columns of the result table: val_loss and val_ppl (validation cross-entropy in nats and its exp), step_ms "
        "(mean time of a training step), overhead_% (SPECTRA's training step over its base optimizer's, same seed, "
        "measured in interleaved pairs on the same batches in CPU time after the runs, so load cannot flip its "
        "sign; overhead_wall_% in results.json: from the runs' wall times), "
        "max_weight_sn (largest spectral norm ||W||_2 of a weight matrix at the end), max_update_sn (largest "
        "spectral norm of one step's applied update direction after the warm-up: what SPECTRA's clip bounds), "
        "agg_linf (largest absolute weight entry max |W_ij| over all matrices at the end) and diverged.")
    parser.add_argument("--c", type=float, default=10.0,
                        help="SPECTRA's clip threshold c: each singular value s of the update becomes "
                        "s / sqrt(1 + s^2/c^2), about min(s, c)")
    parser.add_argument(
        "--embedding-scale",
        type=float,
        default=None,
        help="SPECTRA's update scale alpha for the embedding and head (default: the reference code's "
        "sqrt(vocab/d))",
    )
    parser.add_argument("--weight-decay", type=float, default=0.1, help="decoupled weight decay")
    parser.add_argument("--grad-clip", type=float, default=0.5, help="global grad-norm clip (<= 0: off)")
    parser.add_argument("--seeds", type=int_list, default=(0,), help="comma-separated seeds (default: 0)")
    parser.add_argument("--eval-every", type=positive_int, default=None,
                        help="steps between validation evaluations (default: the setting's, 50 on cpu)")
    parser.add_argument("--eval-tokens", type=positive_int, default=None,
                        help="validation tokens per evaluation (default: the setting's, 32768 on cpu)")
    parser.add_argument("--diag-every", type=int, default=None, help="steps between spectral diagnostics")
    parser.add_argument(
        "--noise-steps",
        default="",
        help="comma-separated steps at which to measure the gradient-noise structure of Jiang, Semenov and "
        "Stich (2026), Appendix F (default: off)",
    )
    parser.add_argument(
        "--noise-signal-batches",
        type=int,
        default=16,
        help="micro-batches averaged into the signal gradient G",
    )
    parser.add_argument("--noise-samples", type=int, default=8, help="single-sequence gradients per step")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument(
        "--parallel",
        default="ddp",
        choices=PARALLEL_MODES,
        help="data parallelism under torchrun: ddp, or fsdp2 (sharded parameters, DCP checkpoints)",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--out", default="runs/compare", help="folder for results, plots and per-run logs")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("--ckpt-every", type=int, default=None,
                        help="steps between checkpoints of each run (default: about 10%% of --steps; 0: only at "
                        "the end)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the runs in --out: finished runs are kept, unfinished ones resume from "
                        "their newest usable checkpoint")
    parser.add_argument("--dist-timeout", type=float, default=300.0,
                        help="seconds a collective may wait under torchrun before the job stops with an error")
    parser.add_argument("--force", action="store_true",
                        help="delete the previous results and runs in --out and start over (other folders in "
                        "--out are kept)")
    parser.add_argument("--no-resource-check", dest="resource_check", action="store_false",
                        help="run even when the memory or time estimated from the settings does not fit this "
                        "machine (more memory than is free, or more than 24 h)")
