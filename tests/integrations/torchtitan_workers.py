"""Worker of tests/integrations/test_torchtitan_fsdp.py: a torchtitan container of spectrakit optimizers on
FSDP2 (``fully_shard`` per block and at the root, torchtitan's layout), run by ``run_workers``."""

from __future__ import annotations

import torch

from spectrakit.models.llama import Llama, LlamaConfig

SIDE = r"(^|\.)(embed|head|norm)\.|_norm\.weight$"
STEPS = 4


def make_model(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, max_seq_len=16))


def configs():
    from spectrakit.integrations.torchtitan import spectra_optimizers

    # Muon's bf16 Newton-Schulz would amplify the all-reduce's fp32 rounding: fp32 here, as in tests/distributed
    return {
        "SpectraAdamW": spectra_optimizers("SpectraAdamW", lr=1e-2, c=0.5),
        "Muon": spectra_optimizers("Muon", lr=0.02, post_dtype="float32", adamw_pattern=SIDE,
                                   adamw_kwargs={"lr": 3e-3}),
    }


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(100 + step))


def train(model, opt, s0: int, s1: int, rank: int = 0, ws: int = 1) -> None:
    for s in range(s0, s1):
        x = batch(s).chunk(ws)[rank]
        opt.zero_grad()
        _, loss = model(x, x.roll(-1, dims=1))
        loss.backward()
        opt.step()


def shard(model):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def full_params(model) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def fsdp_suite(rank: int, ws: int, folder: str) -> dict:
    """Per config: parameters after STEPS steps, whether each spectrakit optimizer took the sharded step, and
    the parameters after a DCP checkpoint (torchtitan's CheckpointManager) at STEPS // 2 and a resume."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

    from spectrakit.optim.sharding.optimizer import ShardedSpectraMixin

    def manager(model, opt, name):
        cfg = CheckpointManager.Config(enable=True, folder=name, interval=1, keep_latest_k=0,
                                       last_save_model_only=False)
        return cfg.build(dataloader=None, model_parts=[model], optimizers=opt,
                         lr_schedulers=LRSchedulersContainer(opt, lambda step: 1.0), states={}, sd_adapter=None,
                         base_folder=folder)

    res: dict = {}
    for name, config in configs().items():
        model = shard(make_model())
        opt = config.build(model_parts=[model])
        res[(name, "sharded")] = [isinstance(o, ShardedSpectraMixin) for o in opt]
        mgr = manager(model, opt, name)
        train(model, opt, 0, STEPS // 2, rank, ws)
        mgr.save(curr_step=STEPS // 2)
        mgr.close()
        train(model, opt, STEPS // 2, STEPS, rank, ws)
        res[(name, "params")] = full_params(model)

        resumed = shard(make_model(seed=3))
        opt2 = config.build(model_parts=[resumed])
        mgr2 = manager(resumed, opt2, name)
        res[(name, "loaded")] = mgr2.load(step=STEPS // 2)
        mgr2.close()
        train(resumed, opt2, STEPS // 2, STEPS, rank, ws)
        res[(name, "resumed")] = full_params(resumed)
    return res
