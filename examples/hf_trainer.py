"""SPECTRA with the Hugging Face ``Trainer``: a tiny GPT-2 built locally (no hub download) on an offline corpus.

    pip install 'spectrakit[examples]'
    python examples/hf_trainer.py --steps 200

``Trainer(optimizers=(SpectraAdamW(param_groups(model), ...), scheduler))`` replaces the Trainer's AdamW; the
Trainer's own ``learning_rate``/``weight_decay`` arguments are then unused. GPT-2's ``lm_head`` is tied to
the token embedding, so ``param_groups`` lists it once.

``--compile`` compiles the model (the Trainer's ``torch_compile``) and the optimizer step (``torch.compile``
of ``opt.step``, after the scheduler has wrapped it); ``--compile-backend aot_eager`` compiles in seconds on a
CPU.
"""

import argparse
import sys
import tempfile

import numpy as np
import torch

try:
    import transformers
except ImportError:
    sys.exit("this example needs transformers: pip install 'spectrakit[examples]'")

import spectrakit
from spectrakit.data.tokens import prepare
from spectrakit.optim import SpectraAdamW, param_groups
from spectrakit.train.diagnostics import SpectralDiagnostics

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", "--max-steps", dest="max_steps", type=int, default=200,
                    help="training steps (--max-steps: the earlier spelling)")
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--c", type=float, default=10.0, help="SPECTRA clip threshold")
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=64)
parser.add_argument("--corpus", default="stdlib", help="an offline corpus name of spectrakit.data")
parser.add_argument("--data-files", nargs="*", help="text files to train on instead of --corpus")
parser.add_argument("--output-dir", default=None, help="Trainer output folder (default: a temporary one)")
parser.add_argument("--compile", action="store_true", help="torch.compile the model and the optimizer step")
parser.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend with --compile (default inductor; aot_eager compiles fastest)")
args = parser.parse_args()
# torch's CPU threads as the `spectrakit` commands choose them: OMP_NUM_THREADS when set (torchrun sets 1 per
# rank), else the cores not busy with other work (one thread per busy core made a loaded machine 10x slower)
spectrakit.set_threads()


class Windows(torch.utils.data.Dataset):
    """Consecutive ``seq_len``-token windows; GPT-2 shifts the labels itself."""

    def __init__(self, tokens, seq_len):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self):
        return len(self.tokens) // self.seq_len

    def __getitem__(self, i):
        ids = torch.from_numpy(np.asarray(self.tokens[i * self.seq_len:(i + 1) * self.seq_len], dtype=np.int64))
        return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
data = prepare(args.corpus, "bytes", files=args.data_files)
config = transformers.GPT2Config(vocab_size=data.tokenizer.vocab_size, n_positions=args.seq_len, n_embd=64,
                                 n_layer=2, n_head=4)
model = transformers.GPT2LMHeadModel(config)

warmup = min(args.warmup, args.max_steps)
opt = SpectraAdamW(param_groups(model, weight_decay=0.1), lr=args.lr, c=args.c, betas=(0.8, 0.999),
                   warmup_steps=warmup)
sched = transformers.get_cosine_schedule_with_warmup(opt, warmup, args.max_steps)
if args.compile:  # after the scheduler, which wraps the (bound) opt.step to count its calls
    opt.step = torch.compile(opt.step, backend=args.compile_backend)
diag = SpectralDiagnostics(every=max(1, args.max_steps // 4))
diag.attach(model, opt)

with tempfile.TemporaryDirectory() as tmp:
    targs = transformers.TrainingArguments(
        output_dir=args.output_dir or tmp, max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        logging_steps=max(1, args.max_steps // 10), save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, seed=0, torch_compile=args.compile,
        **({"torch_compile_backend": args.compile_backend} if args.compile else {}),
    )
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=Windows(data.train, args.seq_len),
                                   optimizers=(opt, sched))
    result = trainer.train()
print(f"final train loss {result.training_loss:.4f}")
for row in diag.rows:
    print(f"step {row['step']}: max ||W||_2 {row['max_weight_sn']:.3f}, max ||U||_2 {row['max_update_sn']:.3f}")
