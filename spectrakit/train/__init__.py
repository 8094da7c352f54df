"""Training loop, schedules, logging, checkpoints and spectral diagnostics."""
