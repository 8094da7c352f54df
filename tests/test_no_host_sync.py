"""No host-device synchronisation in the hot paths, checked on CPU at the dispatcher.

Every way a tensor value reaches the host (``item()``, ``float()``/``bool()``/``if tensor``, and the C++
argument parser turning a tensor into a ``Scalar``, e.g. ``torch._foreach_lerp_(m, u, weight_tensor)``)
goes through ``aten::_local_scalar_dense``, the op that blocks on CUDA. A ``TorchDispatchMode`` that raises
on it catches all of them on CPU, including the ones a monkeypatched ``Tensor.item`` cannot see. It also
raises on the ops that block on CUDA without reading a scalar: data-dependent output shapes (``nonzero``,
boolean-mask indexing, ``unique``, ``masked_select``), ``equal``, and LAPACK calls that check their info code
(SVD, eigh). The CUDA check (``torch.cuda.set_sync_debug_mode("error")``) is in the benchmarks and the
CUDA-only tests.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import spectrakit.optim as O
from spectrakit._checks import no_value_checks

_aten = torch.ops.aten
# Ops that block on CUDA without reading a scalar: a data-dependent output shape (the host must learn it), a
# bool result, or a LAPACK/cuSOLVER call that checks its info code on the host.
_SYNCING = {
    _aten.nonzero.default, _aten.masked_select.default, _aten._unique2.default, _aten.unique_dim.default,
    _aten.unique_consecutive.default, _aten.equal.default, _aten.is_nonzero.default,
    _aten.repeat_interleave.Tensor, _aten._linalg_svd.default, _aten._linalg_eigh.default,
    _aten.linalg_cholesky_ex.default, _aten.linalg_inv_ex.default,
}


def _bool_mask_index(func, args) -> bool:
    """``x[mask]`` / ``x[mask] = v`` with a boolean mask: the output size is the mask's count (``nonzero``)."""
    if func not in (_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))


class ForbidHostReads(TorchDispatchMode):
    """``host_tensors``: tensors that live on the CPU whatever the parameters' device (the optimizer's step
    counters, as torch.optim keeps its ``step``): reading them costs no device sync."""

    allowed: frozenset = frozenset()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No ``torch._dynamo.disable`` wrapper around every dispatched op (torch adds one to each mode's
        ``__torch_dispatch__`` unless this says no): the mode never runs under ``torch.compile`` here, and the
        wrapper was a fifth of the file's time (about 325 thousand ops)."""
        return False

    def __init__(self, host_tensors=()):
        super().__init__()
        self.host_ptrs = {t.data_ptr() for t in host_tensors}
        assert all(t.device.type == "cpu" for t in host_tensors)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _aten._local_scalar_dense.default and args[0].data_ptr() not in self.host_ptrs:
            raise AssertionError("a tensor value was read on the host (a sync on CUDA)")
        if (func in _SYNCING and func not in self.allowed) or _bool_mask_index(func, args):
            raise AssertionError(f"{func} synchronises the host on CUDA")
        return func(*args, **(kwargs or {}))


class ForbidHostReadsButEigh(ForbidHostReads):
    """The CPU-only Gram route of spectral_lmo: LAPACK's eigh and, for a matrix that needs the route's accurate
    SVD, LAPACK's SVD (their info checks are on the host, which on a CPU is the device itself), and nothing
    else. (The route's per-matrix choice of that SVD reads CPU values as NumPy arrays: no device to wait for.)"""

    allowed = frozenset({_aten._linalg_eigh.default, _aten._linalg_svd.default})


@pytest.fixture(autouse=True)
def cuda_routes(monkeypatch):
    """Route choices as on CUDA: spectral_lmo's default is the polar route there (the Gram route's eigh blocks
    a CUDA device), so the CPU run checks the code that CUDA runs."""
    import spectrakit.linalg.lmo as lmo

    monkeypatch.setattr(lmo, "GRAM_DEVICE_TYPES", ())


def test_detector_catches_scalar_conversions():
    m, u, w = [torch.zeros(3)], [torch.ones(3)], torch.tensor(0.5)
    for fn in (lambda: float(w), lambda: bool(w > 0), lambda: torch._foreach_lerp_(m, u, w)):
        with pytest.raises(AssertionError, match="host"), ForbidHostReads():
            fn()
    with ForbidHostReads():
        torch._foreach_mul_(m, w)  # the Tensor overload stays on the device
    x = torch.randn(4, 4)
    for fn in (lambda: x[x > 0], lambda: torch.nonzero(x), lambda: torch.equal(x, x), lambda: torch.unique(x),
               lambda: torch.linalg.svdvals(x), lambda: torch.linalg.eigh(x + x.T),
               lambda: x.__setitem__(x > 0, 0.0)):
        with pytest.raises(AssertionError, match="host"), ForbidHostReads():
            fn()
    with ForbidHostReads():
        torch.where(x > 0, x, 0.0), x[torch.tensor([0, 2])]  # no data-dependent shape: fine


class _MultiTensor(O.Spectra):
    """The non-CPU (``torch._foreach_*``) step path, forced on CPU."""

    @staticmethod
    def _per_tensor(device):
        return False


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in [(6, 10), (6, 10), (10, 6), (4, 3, 3, 3), (7,)]]


PRESETS = [n for n in O.__all__ if isinstance(getattr(O, n), type) and issubclass(getattr(O, n), O.Spectra)
           and n != "Spectra"]
CONFIGS = [(n, {}) for n in PRESETS] + [
    ("Spectra", dict(base="adamw", post="soft_clip", pre_c=1.0)),
    ("Spectra", dict(base="signum", post="hardcap", vector_clip=True)),
    ("Spectra", dict(base="adamw", post="soft_clip_accurate", max_batch_numel=60)),
    ("Spectra", dict(base="signum", post="spectral_lmo", regularizer="schatten", b=0.5, p=3.0)),
    ("Spectra", dict(base="signum", post="spectral_lmo", regularizer="entropy", b=0.5, c=5.0)),
    ("Spectra", dict(base="sgd", post="linf_fw", b=0.5)),
]


@pytest.mark.parametrize("multi_tensor", [False, True], ids=["cpu-path", "multi-tensor-path"])
@pytest.mark.parametrize("name,kw", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_optimizer_step_has_no_host_reads(name, kw, multi_tensor):
    cls = getattr(O, name)
    if multi_tensor:
        cls = _MultiTensor if cls is O.Spectra else type(f"Multi{name}", (cls, _MultiTensor), {})
    params = _params()
    opt = cls(params, lr=1e-2, warmup_steps=2, **kw) if name != "Muon" else cls(params, lr=1e-2)
    # an eager step of CPU tensors reads its check's verdict (nothing to wait for on a CPU); with a gradient on a
    # GPU it never does (Spectra._flags_on_host, tests/optim/test_host_flag.py): check the rest as a GPU runs it
    assert opt._flags_on_host([torch.zeros(1)], None) is not multi_tensor
    opt._flags_on_host = lambda grads, grad_norm: False
    for k in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        if k == 1:
            params[0].grad[0, 0] = float("nan")  # a skipped step takes the same path
        counters = [g["steps_taken"] for g in opt.param_groups]  # CPU tensors by design
        with no_value_checks(), ForbidHostReads(counters):
            opt.step()
    assert all(torch.isfinite(p).all() for p in params)


def _linalg_calls():
    import spectrakit.linalg as L

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 24, 40, generator=g)
    w = torch.randn(3, 16, 16, generator=g)
    thr = torch.tensor([0.5, 2.0, 8.0])
    lo, hi = thr * 0.5, thr
    return {
        "msign": lambda: L.msign(x),
        "msign_bf16": lambda: L.msign(x, dtype=torch.bfloat16),
        "msign_muon_frobenius": lambda: L.msign(x, schedule="muon", normalize="frobenius"),
        "soft_clip": lambda: L.soft_clip(x, thr),
        "soft_clip_fast": lambda: L.soft_clip(x, thr, tall_steps=0),
        "soft_clip_bf16": lambda: L.soft_clip(x, thr, dtype=torch.bfloat16),
        "soft_clip_ns": lambda: L.soft_clip(x, thr, method="newton_schulz"),
        "soft_clip_vec": lambda: L.soft_clip(x[0, 0], thr[0]),
        "spectral_clip": lambda: L.spectral_clip(x, lo, hi),
        "spectral_hardcap": lambda: L.spectral_hardcap(x, hi),
        "spectral_hardcap_float": lambda: L.spectral_hardcap(x, 1.0),
        "spectral_hardcap_dilation": lambda: L.spectral_hardcap(x, hi, method="dilation"),
        "spectral_relu": lambda: L.spectral_relu(x, lo),
        **{f"spectral_lmo_{r}": (lambda r=r: L.spectral_lmo(x, r, b=0.5, radius=2.0,
                                                            p=3.0 if r == "schatten" else None))
           for r in ("frobenius", "nuclear", "schatten", "entropy")},
        "spectral_lmo_bf16": lambda: L.spectral_lmo(x, "schatten", b=0.5, radius=2.0, p=5.0, dtype=torch.bfloat16),
        "eig_clip": lambda: L.eig_clip(w, -hi, hi),
        "eig_stepfun": lambda: L.eig_stepfun(w, lo),
        "proj_psd": lambda: L.proj_psd(w),
        "spectral_norm": lambda: L.spectral_norm(x, iters=3),
    }


@pytest.mark.parametrize("name", sorted(_linalg_calls()))
def test_linalg_functions_have_no_host_reads(name):
    fn = _linalg_calls()[name]
    fn()  # warm the host-side schedule caches
    with no_value_checks(), ForbidHostReads():
        fn()


LMO_CONFIGS = [c for c in CONFIGS if c[1].get("post") in ("spectral_lmo", "linf_fw")]


@pytest.mark.parametrize("name,kw", LMO_CONFIGS, ids=[kw["post"] + str(i) for i, (_, kw) in enumerate(LMO_CONFIGS)])
def test_gram_route_reads_no_tensor_value(name, kw, monkeypatch):
    """On CPU (the Gram route's only default device) the Frank-Wolfe posts call LAPACK's eigh and read no
    tensor value on the host themselves."""
    import spectrakit.linalg as L
    import spectrakit.linalg.lmo as lmo

    monkeypatch.setattr(lmo, "GRAM_DEVICE_TYPES", ("cpu",))
    params = _params()
    opt = O.Spectra(params, lr=1e-2, warmup_steps=2, **kw)
    opt._flags_on_host = lambda grads, grad_norm: False  # (the step's own verdict read: see above)
    x = torch.randn(3, 24, 40)
    for k in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        if k == 1:
            params[0].grad[0, 0] = float("nan")
        with no_value_checks(), ForbidHostReadsButEigh([g["steps_taken"] for g in opt.param_groups]):
            opt.step()
            L.spectral_lmo(x, "entropy", b=0.5, radius=2.0)
    assert all(torch.isfinite(p).all() for p in params)


def test_manifold_sgd_step_has_no_host_reads():
    from spectrakit.manifold import ManifoldSGD, Spectrahedron, SpectralBall

    g = torch.Generator().manual_seed(1)
    a = torch.nn.Parameter(torch.randn(6, 10, generator=g) * 0.1)
    b = torch.nn.Parameter(torch.eye(8) / 8)
    # 4 PDHG iterations (default 32): every iteration runs the same code
    opt = ManifoldSGD([{"params": [a], "manifold": SpectralBall(1.0), "dualizer": "pdhg",
                        "dualizer_options": {"steps": 4}},
                       {"params": [b], "manifold": Spectrahedron(), "dualizer": "alternating"}], lr=0.05,
                      momentum=0.9)
    for _ in range(2):
        a.grad, b.grad = torch.randn(6, 10, generator=g), torch.randn(8, 8, generator=g)
        with no_value_checks(), ForbidHostReads():
            opt.step()


def test_conv_regularizer_warm_call_has_no_host_reads():
    from spectrakit.conv import ConvRegularizer

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, stride=2))
    for kind in ("tn", "f4", "2norm", "ratio"):
        reg = ConvRegularizer(model, 1e-3, kind=kind, cold_iters=5, restarts=None if kind == "f4" else 2)
        reg()  # cold call (restarts pick the best start with argmax/indexing on the device)
        with no_value_checks(), ForbidHostReads():
            reg().backward()


def test_sharded_optimizer_world_size_one_has_no_host_reads():
    from spectrakit.distributed import sharded

    params = _params()
    opt = sharded(O.SpectraAdamW)(params, lr=1e-2)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        with no_value_checks(), ForbidHostReads():
            opt.step()
