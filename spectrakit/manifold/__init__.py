"""Steepest descent on spectral sets (Cesista 2025).

Sets (one interface: ``retract``, ``faces``, ``project_tangent``, ``contains``): :class:`PSDCone`,
:class:`Spectrahedron`, :class:`SpectralBall`, :class:`SpectralBand`, :class:`Stiefel`.
Norms for the update: ``"rms"`` (RMS→RMS), ``"spectral"``, ``"frobenius"`` (:func:`get_norm`).
Dualizers (steepest on-tangent direction): :func:`naive`, :func:`alternating`, :func:`pdhg`,
:func:`dual_ascent`, dispatched by :func:`steepest_direction`. Optimizer: :class:`ManifoldSGD`.
"""

from spectrakit.manifold.dualizers import (
    DUALIZERS,
    alternating,
    dual_ascent,
    naive,
    pdhg,
    steepest_direction,
)
from spectrakit.manifold.faces import (
    Face,
    eig_lower_projector,
    eig_upper_projector,
    singular_lower_face,
    singular_upper_face,
)
from spectrakit.manifold.norms import NORMS, FrobeniusNorm, OperatorNorm, get_norm
from spectrakit.manifold.optimizer import ManifoldSGD
from spectrakit.manifold.sets import (
    PSDCone,
    Spectrahedron,
    SpectralBall,
    SpectralBand,
    SpectralSet,
    Stiefel,
    dilation,
)

__all__ = [
    "DUALIZERS", "NORMS", "Face", "FrobeniusNorm", "ManifoldSGD", "OperatorNorm", "PSDCone", "SpectralBall",
    "SpectralBand", "SpectralSet", "Spectrahedron", "Stiefel", "alternating", "dilation", "dual_ascent",
    "eig_lower_projector", "eig_upper_projector", "get_norm", "naive", "pdhg", "singular_lower_face",
    "singular_upper_face", "steepest_direction",
]
