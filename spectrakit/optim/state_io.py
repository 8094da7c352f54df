"""The optimizer state of :class:`~spectrakit.optim.spectra.Spectra` in and out: ``load_state_dict`` (checked
against the parameters before anything is applied, :mod:`spectrakit._optstate`; a refused state changes
nothing), the conversion of a ``torch.optim.AdamW`` state, and the group counters' home device."""

from __future__ import annotations

from itertools import chain

import torch

from spectrakit._optstate import check_state_dict
from spectrakit.optim.bases import BASES


def _home(group: dict) -> torch.device:
    """The device of a group's first parameter (the CPU for an empty group or parameters on the meta device)."""
    params = group["params"]
    device = params[0].device if params else torch.device("cpu")
    return torch.device("cpu") if device.type == "meta" else device
def _counter(value) -> torch.Tensor:
    """A group's ``steps_taken`` as a fresh 0-d int64 CPU tensor (from an int or a tensor of a saved state)."""
    return torch.as_tensor(value, dtype=torch.int64, device="cpu").detach().clone().reshape(())
def _expected_state(group: dict, saved: dict, p: torch.Tensor) -> dict:
    """The state ``base.init_state`` creates for ``p`` (a meta tensor) under the saved group's base."""
    name = saved.get("base", group["base"])
    if name not in BASES:
        raise ValueError(f"cannot load the optimizer state: unknown base {str(name)[:40]!r} "
                         f"(accepted: {', '.join(sorted(BASES))})")
    return BASES[name].init_state(p)


class StateDictMixin:
    """Loading state dicts (a mixin of :class:`~spectrakit.optim.spectra.Spectra`)."""

    def load_state_dict(self, state_dict: dict, *, allow_changes: bool = False) -> None:
        """Load a state dict; unlike ``torch.optim.Optimizer``, fp32 state of bf16/fp16 params stays fp32.

        A state whose groups use another ``base`` or ``post`` than this optimizer's (say a SpectraAdamW
        checkpoint loaded into a SpectraSignum) raises ``ValueError`` instead of silently continuing as the
        saved optimizer, unless ``allow_changes=True`` (the saved choice then wins, as in
        ``torch.optim``). Loaded hyperparameters are validated like the constructor's arguments. A
        ``torch.optim.AdamW`` state dict is converted (an AdamW state is a valid state of a ``base="adamw"``
        group; the clip's schedule continues at its step); another foreign one raises ValueError."""
        state_dict = self._from_torch_adamw(state_dict)
        saved_groups = state_dict.get("param_groups", []) if isinstance(state_dict, dict) else []
        if not allow_changes:
            for i, (mine, saved) in enumerate(zip(self.param_groups, saved_groups)):
                for key in ("base", "post"):
                    if isinstance(saved, dict) and key in saved and saved[key] != mine[key]:
                        raise ValueError(
                            f"the state dict's param group {i} has {key}={saved[key]!r} but this optimizer "
                            f"({type(self).__name__}) has {key}={mine[key]!r}; load it into the matching "
                            f"optimizer, or pass allow_changes=True to continue with the saved {key}")
        check_state_dict(self, state_dict, _expected_state, optional=("step",))
        before = (self.param_groups, self.state)
        try:
            self._apply_state_dict(state_dict)
        except BaseException:  # a refused hyperparameter: the optimizer stays as it was
            self.param_groups, self.state = before
            raise

    def _apply_state_dict(self, state_dict: dict) -> None:
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(ids, params):
            if pid in saved_state:
                self.state[p] = {
                    k: (v.to(device=p.device, copy=True) if torch.is_tensor(v) else v)
                    for k, v in saved_state[pid].items()
                }
        for g in self.param_groups:  # states saved when SGD, Signum and Lion still counted steps: the count goes
            if not getattr(BASES[g["base"]], "keeps_step", True):
                for p in g["params"]:
                    self.state.get(p, {}).pop("step", None)
        for g in self.param_groups:
            g["skipped_steps"] = g["skipped_steps"].to(device=_home(g), copy=True)
            g.setdefault("capturable", True)
            g.setdefault("check_finite", True)  # state dicts saved before these options existed
            g.setdefault("torch_kernel", True)
            g.setdefault("split_fused", None)
            g["steps_taken"] = _counter(g.get("steps_taken", 0))
            self._validate(g)

    def _from_torch_adamw(self, state_dict: dict) -> dict:
        """A ``torch.optim.AdamW`` state dict (groups without ``base``) as this optimizer's: an AdamW state is a
        valid state of a ``base="adamw"`` group (same ``step``, ``exp_avg``, ``exp_avg_sq``, decoupled weight
        decay); the saved lr, betas, eps and weight decay are kept, the clip's schedule continues at the saved
        step (``steps_taken``) and ``skipped_steps`` starts at 0. Any other foreign state raises ValueError."""
        saved_groups = state_dict.get("param_groups", [])
        if not saved_groups or all("base" in g for g in saved_groups):
            return state_dict
        how = ("load a torch.optim.AdamW state (without amsgrad) into groups with base='adamw', one saved group "
               "per group, or start this optimizer from scratch")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(saved_groups)} param groups, this optimizer "
                             f"{len(self.param_groups)}; {how}")
        groups = []
        for i, (mine, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if mine["base"] != "adamw" or "betas" not in saved or saved.get("amsgrad") or "momentum" in saved:
                raise ValueError(f"param group {i} of the state dict is not a torch.optim.AdamW state this "
                                 f"optimizer (base={mine['base']!r}) can continue; {how}")
            saved_state = state_dict.get("state") if isinstance(state_dict.get("state"), dict) else {}
            steps = [saved_state[pid]["step"] for pid in saved["params"]
                     if isinstance(saved_state.get(pid), dict) and "step" in saved_state[pid]]
            group = {k: v for k, v in mine.items() if k != "params"}
            group.update({k: saved[k] for k in ("lr", "betas", "eps", "weight_decay", "initial_lr") if k in saved})
            group.update(params=saved["params"], steps_taken=int(max(map(float, steps), default=0)),
                         skipped_steps=torch.zeros((), dtype=torch.int64))
            groups.append(group)
        state = {pid: {k: st[k] for k in ("step", "exp_avg", "exp_avg_sq") if k in st} if isinstance(st, dict) else st
                 for pid, st in state_dict["state"].items()}
        return {"state": state, "param_groups": groups}
