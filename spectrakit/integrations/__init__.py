"""Entry points that let other training frameworks use spectrakit's optimizers through their own extension
mechanisms. Each integration is a module that imports its framework only when used, so ``spectrakit`` itself
never depends on it:

- :mod:`spectrakit.integrations.torchtitan`: SPECTRA presets, Muon and the other spectrakit optimizers as
  named optimizers of torchtitan's ``OptimizersContainer`` (``pip install torchtitan``).

Layer: above ``optim`` and ``distributed``, below ``train``, ``experiments`` and the commands
(docs/architecture.md).
"""
