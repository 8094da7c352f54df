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
