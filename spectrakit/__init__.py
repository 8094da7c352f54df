"""spectrakit: control the spectrum of neural networks.

Subpackages
-----------
- :mod:`spectrakit.linalg`   matrix functions built on one polar-factor (``msign``) core
- :mod:`spectrakit.optim`    SPECTRA, Muon and plain optimizers as one update pipeline
- :mod:`spectrakit.conv`     convolution spectral norms (TN bound, F4, exact, Gram) and regularizers
- :mod:`spectrakit.manifold` steepest descent on spectral sets (PSD cone, spectrahedron, balls, bands)
- :mod:`spectrakit.checkpoint` durable, verified checkpoint folders that never run code from a file
- :mod:`spectrakit.models`, :mod:`spectrakit.data`, :mod:`spectrakit.train`, :mod:`spectrakit.experiments`
- :mod:`spectrakit.commands`: the ``spectrakit`` command line, one module per sub-command

The layers and their import rules are described in docs/architecture.md.
"""

__version__ = "0.1.0"


def set_threads(threads="auto") -> int:
    """Set the number of CPU threads torch uses for its intra-op work (``torch.set_num_threads``), for library
    users; returns the number set. Importing spectrakit never changes it.

    ``threads``: an int >= 1, or ``"auto"``: ``OMP_NUM_THREADS`` when set, else the cores not busy with other
    work, ``max(1, round(cores - busy))``, where ``busy`` is the CPU time other processes used on this
    process's cores during a 0.2 s sample (Linux ``/proc/stat``; elsewhere the load average). On a machine
    whose cores are busy, one torch thread per core makes the threads wait on each other and steps several
    times slower; the ``spectrakit`` commands make the same choice at start.

    Raises:
        ValueError: an int < 1 or a string other than ``"auto"``. TypeError: another type (bool included).
    """
    if isinstance(threads, str):
        if threads != "auto":
            raise ValueError(f"threads must be 'auto' or an int >= 1, got {threads!r}")
        requested = None
    elif isinstance(threads, int) and not isinstance(threads, bool):
        if threads < 1:
            raise ValueError(f"threads must be 'auto' or an int >= 1, got {threads}")
        requested = threads
    else:
        raise TypeError(f"threads must be 'auto' or an int >= 1, got {type(threads).__name__}")
    from spectrakit._threads import apply_threads

    return apply_threads(requested)
