"""Shared test fixtures: deterministic seeds, device list, GPU skip, single-threaded runs, loading helper
scripts by path."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys

# numpy's and scipy's OpenBLAS start one thread per core at import, beside torch's own threads: the float64
# references then spin against torch (the linear-algebra tests ran 2x slower on 2 cores). One BLAS thread for
# them, set before anything imports numpy (importing torch does); torch's thread count is chosen below.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
import torch  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_addoption(parser, pluginmanager):
    """Without pytest-xdist the ``-n auto --dist loadfile --no-loadscope-reorder`` of pyproject's ``addopts``
    would end the run with "unrecognized arguments": they are accepted (and ignored) then, the tests run in
    one process, and :func:`pytest_configure` says in one line how to get the parallel run."""
    if pluginmanager.has_plugin("xdist.plugin") or pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("without pytest-xdist")
    group._addoption("-n", dest="numprocesses", default=None, help="(ignored: pytest-xdist is not installed)")
    group.addoption("--dist", dest="dist", default="no", help="(ignored: pytest-xdist is not installed)")
    group.addoption("--no-loadscope-reorder", dest="loadscopereorder", action="store_false",
                    help="(ignored: pytest-xdist is not installed)")


def pytest_configure(config):
    """Use only the cores not busy with other work (the command line's policy): on a loaded machine, one
    thread per core makes the suite several times slower. Under pytest-xdist (``-n``, one test process per
    core) each process uses one thread."""
    from spectrakit._threads import apply_threads

    if not config.pluginmanager.has_plugin("xdist.plugin") and config.getoption("numprocesses", None):
        print("pytest-xdist is not installed: the tests run in one process; install the test extra for the "
              "parallel run: pip install -e '.[test]'", file=sys.stderr)
    apply_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else None)
    gc.disable()  # collection only creates objects that live to the end (see pytest_collection_finish)


# The costliest test files (>= 4 s), costliest first (per-file sums of a 2-process run, 2026-11-26 14:25 UTC).
# pytest-xdist hands whole files to its test processes in collection order (--dist loadfile
# --no-loadscope-reorder in pyproject.toml; its default order, most tests first, put these few-test files last,
# where one process ran them alone while the other idled): starting the long ones first keeps the processes
# busy to the end (longest-first scheduling). The order changes nothing else: each file's tests keep their
# order, and files not named here follow in collection order.
LONGEST_FIRST = (
    "optim/test_compile_foreach.py",
    "examples/test_examples.py",
    "optim/test_compile.py",
    "distributed/test_optimizer.py",
    "test_no_host_sync.py",
    "optim/test_compile_schedules.py",
    "distributed/test_launch.py",
    "optim/test_compile_lr.py",
    "linalg/test_robustness.py",
    "test_packaging.py",
    "conv/test_lipbound.py",
    "experiments/test_compare.py",
    "conv/test_exact.py",
    "linalg/test_full_range.py",
    "conv/test_tensor_norm.py",
    "optim/test_spectra.py",
    "conv/test_table2.py",
    "linalg/test_extremes.py",
    "train/test_parallel.py",
    "integrations/test_torchtitan_fsdp.py",
    "linalg/test_lmo.py",
    "experiments/test_compare_resume.py",
    "distributed/test_plain_presets.py",
    "experiments/test_stalled_rank.py",
    "optim/test_bases.py",
    "linalg/test_lmo_gram.py",
    "manifold/test_dualizers.py",
    "train/test_loop.py",
    "train/test_durable.py",
    "linalg/test_hard_clip.py",
    "experiments/test_run_folders.py",
    "test_gpu_suite.py",
    "optim/test_transposed_layout.py",
    "experiments/test_sweep.py",
)
_TESTS = os.path.dirname(os.path.abspath(__file__))

# Heavier variants moved to the soak tier (``pytest -m soak``; .ci/run runs it when the machine is fast enough), each
# beside a lighter sibling that stays in the default tier, so that the README's test command stays short on a slow
# 2-core machine (a 2-core Intel Xeon VM, where a first aot_eager trace in a test process takes 20-30 s and the command
# took 22 min of pytest before these moved, 19 min after, 2026-11-26): more presets and code paths of the same
# traced-step checks (the default tier keeps SpectraAdamW and Muon on the multi-tensor path, SpectraAdamW and SGD
# against eager, one float-lr and one schedule trace, vector_clip_only and unchecked among the options), the examples
# under Lightning, the Hugging Face Trainer and 2-D FSDP2 x TP (the nanoGPT-style and FSDP2 examples and the FSDP2 x TP
# example's compiled-vs-eager run on 1x2 stay), the training
# loop's aot_eager step (the SPECTRA step's stays), the launcher's spawn start method (the fork-server default stays),
# the one-graph checks of more plain presets (AdamW's and Muon's stay), and the sharded optimizer's compiled step and
# checkpoint resume on 2 ranks (their 2-rank set-up alone took 88 s there; a sharded checkpoint's exact resume stays in
# tests/train/test_parallel.py and the FSDP2 example's test).
SOAK_VARIANTS = frozenset({
    "examples/test_examples.py::test_fsdp2_tp_torchrun_resumes_on_another_mesh",
    "examples/test_examples.py::test_lightning_module_matches_the_plain_loop",
    "examples/test_examples.py::test_hf_trainer",
    *(f"optim/test_compile_foreach.py::test_traced_step_is_multi_tensor_and_equals_eager_bitwise[{v}]" for v in (
        "SpectraAdamW-per_tensor", "SpectraSignum-per_tensor", "SpectraSignum-multi_tensor", "Muon-per_tensor",
        "Lion-per_tensor", "Lion-multi_tensor")),
    "optim/test_compile_foreach.py::test_graph_grows_by_a_few_nodes_per_parameter[SpectraAdamW-per_tensor]",
    "optim/test_compile_foreach.py::test_traced_step_equals_eager_bitwise[AdEMAMix-multi_tensor]",
    "optim/test_compile_foreach.py::test_traced_step_equals_eager_bitwise[MARS-multi_tensor]",
    "optim/test_compile_foreach.py::test_traced_step_equals_eager_bf16_parameters[multi_tensor]",
    *(f"optim/test_compile_foreach.py::test_traced_options_equal_eager_bitwise[multi_tensor-{v}]"
      for v in ("vector_clip", "pre_clip", "no_clip")),
    *(f"optim/test_compile.py::test_compiled_step_equals_eager[{v}]"
      for v in ("AdamW", "Signum", "Lion", "Muon", "DMuon", "AdEMAMix")),
    "optim/test_compile.py::test_recompile_check_can_fail",
    "optim/test_compile.py::test_compiled_plain_step_is_the_fused_kernel[SGD-kw2-eager]",
    *(f"optim/test_compile_lr.py::test_a_new_float_lr_every_call_neither_breaks_the_graph_nor_recompiles_per_value"
      f"[{v}]" for v in ("Signum", "Muon", "SGD")),
    *(f"optim/test_compile_schedules.py::test_scheduled_clip_traces_once_and_equals_eager[{v}]"
      for v in ("SpectraSignum", "pre_c", "c_schedule decay")),
    "train/test_loop.py::test_torch_compile_matches_eager[aot_eager_default_partitioner]",
    "distributed/test_launch.py::test_workers_see_the_callers_environment_and_spawn_still_works",
    "optim/test_compile_foreach.py::test_graph_grows_by_a_few_nodes_per_parameter[SpectraAdamW-multi_tensor]",
    "optim/test_compile_foreach.py::test_traced_checks_are_single_reductions_and_each_batch_has_its_flag"
    "[SpectraSignum]",
    *(f"optim/test_compile.py::test_no_graph_break[{v}]" for v in ("Signum", "Lion", "AdEMAMix")),
    *(f"optim/test_compile.py::test_one_graph_no_recompile[{v}-{w}]" for v in ("SGD", "Lion", "Signum", "DMuon")
      for w in ("before_first_step", "after_first_step")),
    "optim/test_compile.py::test_one_graph_no_recompile[Muon-before_first_step]",
    "distributed/test_optimizer.py::test_compiled_step_runs_eagerly_with_the_same_numbers",
    *(f"distributed/test_optimizer.py::test_checkpoint_resume_is_bit_identical[{v}]" for v in ("SpectraAdamW", "Muon")),
})


def _soak_variants(config, items) -> None:
    """Mark the collected tests named in ``SOAK_VARIANTS`` ``soak``. When the whole suite is collected (no file,
    folder or test named on the command line, as in the README's command), a name that its file does not have
    (a renamed test or parameter) is a usage error, not a silent move back to the default tier."""
    ids = {os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/") + "::" + item.name: item for item in items}
    named = [a for a in config.invocation_params.args if not a.startswith("-") and os.path.exists(a.split("::")[0])]
    files = {i.split("::")[0] for i in ids}
    missing = sorted(v for v in SOAK_VARIANTS if v.split("::")[0] in files and v not in ids)
    if missing and not named:
        raise pytest.UsageError("tests/conftest.py SOAK_VARIANTS names tests that were not collected: "
                                + ", ".join(missing))
    for v in SOAK_VARIANTS & ids.keys():
        ids[v].add_marker(pytest.mark.soak)


@pytest.hookimpl(tryfirst=True)  # before -m 'not soak' deselects (the mark plugin's hook)
def pytest_collection_modifyitems(config, items):
    _soak_variants(config, items)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/"), len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# imported once by the fork server besides what the launcher preloads (torch, spectrakit.distributed.launch,
# torch._dynamo): the comparison, which the CLI process tests (tests/experiments, ``cli_process``) run
FORK_SERVER_PRELOAD = ("spectrakit.experiments.compare",)


def pytest_collection_finish(session):
    """What exists once the tests are collected (torch, the test modules, their parameters: ~230 thousand
    objects) lives to the end: the collector is off while they are made (``pytest_configure``: each
    collection during the imports walked them all, ~1.5 s of CPU per test process) and they are then moved
    out of its reach (``gc.freeze``) before it is turned back on, so that the collections
    during the tests and the five full ones pytest runs at the end (to report unraisable exceptions; 6 s of
    CPU per test process before) no longer walk it.

    If any collected test starts processes from the distributed launcher's fork server (``distributed``
    marker, the ``cli_process`` fixture), the server is started now: it imports torch in the background
    (about 5 s of CPU) while the first tests run, so that this once-per-process cost is not paid, waiting,
    inside whichever test forks first. ``ensure_running`` returns at once."""
    if any("distributed" in item.keywords or "cli_process" in getattr(item, "fixturenames", ())
           for item in session.items):
        from spectrakit.distributed.launch import _ensure_fork_server

        _ensure_fork_server(FORK_SERVER_PRELOAD)
    gc.freeze()
    gc.enable()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def one_thread():
    """Run the test with one intra-op thread (restored afterwards): tiny models gain nothing from threads, and
    on a loaded machine OpenMP spinning makes many small ops very slow."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def corpus_cache(tmp_path_factory) -> str:
    """One ``SPECTRAKIT_CACHE`` folder per test process, shared by the tests that only need a tokenised corpus
    (tokenising the stdlib corpus costs about 2 s of CPU each time). Tests of the preparation itself, or of a
    signal arriving during it, keep a private empty cache."""
    return str(tmp_path_factory.getbasetemp() / "cache")


def _load_module(name: str, path: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def load_module():
    """``load_module(name, path)``: import a helper script by path once per session (e.g. the worker files that
    ``spectrakit.distributed.run_workers`` also runs in separate processes)."""
    return _load_module
