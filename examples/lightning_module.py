"""SPECTRA in a Lightning module: ``configure_optimizers`` returns a SPECTRA optimizer and a per-step scheduler.

    pip install 'spectrakit[examples]'
    python examples/lightning_module.py --steps 200

Lightning calls ``optimizer.step()`` once per batch; SPECTRA needs nothing else (no manual optimization).
``SpectralDiagnostics.attach`` in ``on_fit_start`` logs spectral norms through ``self.log``.
``--compile`` compiles the model's forward with ``torch.compile`` (``--compile-backend aot_eager`` compiles in
seconds on a CPU); Lightning steps the optimizer with a closure, so the step itself stays eager here (see
examples/nanogpt_style.py for a compiled step).
"""

import argparse
import sys

import torch

try:
    import lightning as L
except ImportError:
    sys.exit("this example needs lightning: pip install 'spectrakit[examples]'")

import spectrakit
from spectrakit.data.batches import TokenBatches
from spectrakit.data.tokens import prepare
from spectrakit.models.llama import Llama, LlamaConfig
from spectrakit.optim import SpectraAdamW, param_groups
from spectrakit.train.diagnostics import SpectralDiagnostics
from spectrakit.train.schedules import make_scheduler

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
parser.add_argument("--compile", action="store_true", help="torch.compile the model's forward")
parser.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend with --compile (default inductor; aot_eager compiles fastest)")
args = parser.parse_args()
# torch's CPU threads as the `spectrakit` commands choose them: OMP_NUM_THREADS when set (torchrun sets 1 per
# rank), else the cores not busy with other work (one thread per busy core made a loaded machine 10x slower)
spectrakit.set_threads()


class LitLM(L.LightningModule):
    def __init__(self, vocab_size):
        super().__init__()
        self.model = Llama(LlamaConfig(vocab_size=vocab_size, dim=64, n_layers=2, n_heads=4, max_seq_len=args.seq_len))
        self.diag = SpectralDiagnostics(every=max(1, args.max_steps // 4))
        # a compiled function, not a submodule: the parameters keep their names
        self.compiled = torch.compile(self.model.forward, backend=args.compile_backend) if args.compile else None

    def training_step(self, batch, batch_idx):
        _, loss = (self.compiled or self.model)(*batch)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        warmup = min(args.warmup, self.trainer.max_steps)
        opt = SpectraAdamW(param_groups(self, weight_decay=0.1), lr=args.lr, c=args.c, betas=(0.8, 0.999),
                           warmup_steps=warmup)
        sched = make_scheduler(opt, total=self.trainer.max_steps, warmup=warmup, kind="wsd")
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_fit_start(self):
        self.diag.attach(self, self.trainer.optimizers[0])


class Batches(torch.utils.data.IterableDataset):
    def __init__(self, tokens):
        self.batches = TokenBatches(tokens, args.batch_size, args.seq_len, seed=0)

    def __iter__(self):
        while True:
            yield self.batches.next()


torch.manual_seed(0)
data = prepare(args.corpus, "bytes", files=args.data_files)
module = LitLM(data.tokenizer.vocab_size)
trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
trainer.fit(module, torch.utils.data.DataLoader(Batches(data.train), batch_size=None))
print(f"final loss {trainer.callback_metrics['loss'].item():.4f}")
for row in module.diag.rows:
    print(f"step {row['step']}: max ||W||_2 {row['max_weight_sn']:.3f}, max ||U||_2 {row['max_update_sn']:.3f}")
