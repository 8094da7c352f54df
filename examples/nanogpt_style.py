"""SPECTRA in a minimal nanoGPT-style training loop (copy-paste starting point).

    python examples/nanogpt_style.py --steps 200

The three lines that matter: ``param_groups(model)`` (which parameters get the spectral update),
``SpectraAdamW(groups, lr=..., c=..., warmup_steps=...)`` and, optionally, ``SpectralDiagnostics().attach``
to log spectral norms of weights and updates from this (or any) loop.

``--compile`` compiles the model and the optimizer step with ``torch.compile`` (``--compile-backend
aot_eager`` compiles in seconds instead of minutes on a CPU, without inductor's code generation). The
learning rate is then a 0-d tensor that the scheduler updates in place, so the compiled step is reused at
every step, the clip's warm-up included (its threshold is computed inside the compiled step from the step
counter and learning-rate tensors, without a graph break).
"""

import argparse

import torch

import spectrakit
from spectrakit.data.batches import TokenBatches
from spectrakit.data.tokens import prepare
from spectrakit.models.llama import Llama, LlamaConfig
from spectrakit.optim import SpectraAdamW, param_groups, print_param_groups
from spectrakit.train.diagnostics import SpectralDiagnostics
from spectrakit.train.schedules import make_scheduler

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", "--max-steps", dest="max_steps", type=int, default=200,
                    help="training steps (--max-steps: the earlier spelling)")
parser.add_argument("--lr", type=float, default=3e-3, help="peak LR (the AdamW LR is a good start)")
parser.add_argument("--c", type=float, default=10.0, help="SPECTRA clip threshold")
parser.add_argument("--warmup", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=64)
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--corpus", default="stdlib", help="an offline corpus name of spectrakit.data")
parser.add_argument("--data-files", nargs="*", help="text files to train on instead of --corpus")
parser.add_argument("--diagnostics-every", type=int, default=50)
parser.add_argument("--compile", action="store_true", help="torch.compile the model and the optimizer step")
parser.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend with --compile (default inductor; aot_eager compiles fastest)")
args = parser.parse_args()
# torch's CPU threads as the `spectrakit` commands choose them: OMP_NUM_THREADS when set (torchrun sets 1 per
# rank), else the cores not busy with other work (one thread per busy core made a loaded machine 10x slower)
spectrakit.set_threads()

torch.manual_seed(0)
data = prepare(args.corpus, "bytes", files=args.data_files)
batches = TokenBatches(data.train, args.batch_size, args.seq_len, seed=0)
cfg = LlamaConfig(vocab_size=data.tokenizer.vocab_size, dim=args.dim, n_layers=args.layers, n_heads=4,
                  max_seq_len=args.seq_len)
model = Llama(cfg)

groups = param_groups(model, weight_decay=0.1)  # SPECTRA's reference routing
warmup = min(args.warmup, args.max_steps)
lr = torch.tensor(args.lr) if args.compile else args.lr  # a tensor lr: no recompile when the scheduler moves it
opt = SpectraAdamW(groups, lr=lr, c=args.c, betas=(0.8, 0.999), warmup_steps=warmup)
print_param_groups(opt, model)  # name, shape, group, update rule, alpha, weight decay, lr of every parameter
sched = make_scheduler(opt, total=args.max_steps, warmup=warmup, kind="wsd")
diag = SpectralDiagnostics(every=args.diagnostics_every)
diag.attach(model, opt)  # runs inside opt.step() at every `every`-th step
forward, opt_step = model, opt.step
if args.compile:
    forward = torch.compile(model, backend=args.compile_backend)
    opt_step = torch.compile(opt.step, backend=args.compile_backend)

for step in range(args.max_steps):
    x, y = batches.next()
    _, loss = forward(x, y)
    loss.backward()
    opt_step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    if step % 10 == 0 or step == args.max_steps - 1:
        print(f"step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e}")
for row in diag.rows:
    print(f"step {row['step']}: max ||W||_2 {row['max_weight_sn']:.3f}, max ||U||_2 {row['max_update_sn']:.3f}")
