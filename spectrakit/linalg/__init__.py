"""Matrix functions built on one polar-factor core.

Every function takes ``(..., m, n)`` tensors (leading batch dims), works in fp32/bf16/fp64 on CPU and
CUDA, has an ``"exact"`` (float64 SVD/eigh) reference path, and, with value checks off
(:func:`spectrakit._checks.no_value_checks`), never synchronises the host with the device.

- polar factor: :func:`msign` / :func:`orthogonalize` with named schedules (:data:`SCHEDULES`)
- SPECTRA's soft spectral clip: :func:`soft_clip`
- hard spectral clips: :func:`spectral_clip`, :func:`spectral_hardcap`, :func:`spectral_relu`
- eigenvalue functions: :func:`sym`, :func:`eig_clip`, :func:`eig_relu`, :func:`eig_hardcap`,
  :func:`eig_stepfun`, :func:`proj_psd`, :func:`proj_nsd`
- regularised linear minimisation over the spectral-norm ball: :func:`spectral_lmo`
- norms: :func:`spectral_norm` (power iteration with warm start), :func:`subspace_distance`
- precision: :func:`bf16_matmul_fast` (are bf16 matmuls hardware-accelerated here? with an override)
"""

from .eig import eig_clip, eig_hardcap, eig_relu, eig_stepfun, proj_nsd, proj_psd, sym
from .hard_clip import spectral_clip, spectral_hardcap, spectral_relu
from .lmo import spectral_lmo
from .norms import spectral_norm, subspace_distance
from .polar import msign, orthogonalize
from .precision import bf16_matmul_fast, bf16_matmul_override, set_bf16_matmul_fast
from .schedules import SCHEDULES, polar_express_coeffs
from .soft_clip import soft_clip

__all__ = [
    "SCHEDULES",
    "bf16_matmul_fast",
    "bf16_matmul_override",
    "eig_clip",
    "eig_hardcap",
    "eig_relu",
    "eig_stepfun",
    "msign",
    "orthogonalize",
    "polar_express_coeffs",
    "proj_nsd",
    "proj_psd",
    "set_bf16_matmul_fast",
    "soft_clip",
    "spectral_clip",
    "spectral_hardcap",
    "spectral_lmo",
    "spectral_norm",
    "spectral_relu",
    "subspace_distance",
    "sym",
]
