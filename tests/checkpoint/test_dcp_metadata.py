"""DCP ``.metadata`` is read with an exact (module, name) allow-list: no callable reached through an allowed
module (``torch.distributed.checkpoint.filesystem.os.system`` and the like) is ever resolved, let alone
called. Every attack writes a marker file if it runs; the marker must never appear."""

from __future__ import annotations

import importlib
import os
import pickle
import pkgutil
import types

import pytest
import torch

from spectrakit.checkpoint import METADATA_GLOBALS, CheckpointError, check_metadata, load_dcp, save_dcp

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

DANGEROUS = ("os", "posix", "nt", "subprocess", "builtins", "shutil")


def _allowed_modules() -> list[str]:
    """Every module the allow-list names, plus every module of ``torch.distributed.checkpoint`` (a prefix
    rule on that package was the original hole)."""
    import torch.distributed.checkpoint as dcp_pkg  # ~2.5 s with its submodules: paid by these tests only

    names = {m for m, _ in METADATA_GLOBALS} | {"torch", dcp_pkg.__name__}
    for info in pkgutil.walk_packages(dcp_pkg.__path__, dcp_pkg.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception:  # optional back-ends (e.g. fsspec) that are not installed
            continue
        names.add(info.name)
    return sorted(names)


def _reachable_dangerous() -> list[tuple[str, str]]:
    """``(allowed module, dotted name)`` of every os/posix/subprocess/builtins/shutil callable reachable as an
    attribute, or an attribute of an attribute, of an allowed module."""
    out = set()
    for mod_name in _allowed_modules():
        mod = importlib.import_module(mod_name)
        for attr in dir(mod):
            try:
                value = getattr(mod, attr)
            except Exception:
                continue
            if isinstance(value, types.ModuleType) and value.__name__ in DANGEROUS:
                for fn in dir(value):
                    if not fn.startswith("__") and callable(getattr(value, fn, None)):
                        out.add((mod_name, f"{attr}.{fn}"))
            elif callable(value) and getattr(value, "__module__", None) in DANGEROUS:
                out.add((mod_name, attr))
        out.add((mod_name, "__builtins__.exec"))
        out.add((mod_name, "__builtins__.eval"))
    return sorted(out)


@pytest.fixture(scope="module")
def attacks() -> list[tuple[str, str]]:
    """The reachable dangerous callables, enumerated once for this module's tests (not at collection)."""
    return _reachable_dangerous()


def _args(name: str, marker: str, src: str):
    """Arguments that make the callable ``name`` create ``marker`` (or at least touch the file system)."""
    fn = name.rsplit(".", 1)[-1]
    if fn in ("system", "popen", "getoutput", "getstatusoutput"):
        return (f"touch {marker}",)
    if fn in ("exec", "eval"):
        return (f"open({marker!r}, 'w').close()",)
    if fn in ("run", "call", "check_call", "check_output", "Popen"):
        return (["touch", marker],)
    if fn in ("execv", "execvp", "spawnv", "spawnvp", "posix_spawn", "posix_spawnp"):
        return ("/usr/bin/touch", ["touch", marker])
    if fn == "open":
        return (marker, "w")
    if fn in ("copy", "copy2", "copyfile", "copytree", "move", "rename", "replace", "link", "symlink"):
        return (src, marker)
    return (marker,)


def payload(module: str, name: str, args: tuple) -> bytes:
    """A protocol-4 pickle calling ``module.name(*args)``; ``name`` may be dotted (resolved by attribute)."""
    enc = lambda s: b"\x8c" + bytes([len(s.encode())]) + s.encode()  # SHORT_BINUNICODE
    body = pickle.dumps(args, protocol=2)[2:-1]  # the tuple's opcodes, without PROTO and STOP
    return b"\x80\x04" + enc(module) + enc(name) + b"\x93" + body + b"R."


def test_the_attack_list_is_real(tmp_path, attacks):
    """The enumeration finds the known holes, and a payload built this way runs when unpickled freely (so the
    refusals below are refusals of live attacks)."""
    assert ("torch.distributed.checkpoint.filesystem", "os.system") in attacks
    assert len(attacks) > 500
    marker = tmp_path / "LIVE"
    pickle.loads(payload("torch.distributed.checkpoint.filesystem", "os.system", (f"touch {marker}",)))
    assert marker.exists()


def test_every_reachable_dangerous_callable_is_refused(tmp_path, attacks):
    marker = str(tmp_path / "PWNED")
    src = tmp_path / "src.txt"
    src.write_text("x")
    folder = tmp_path / "ck"
    folder.mkdir()
    refused = 0
    # one open file rewritten in place for each attack (re-opening it with truncation cost ~3 ms each here)
    with open(folder / ".metadata", "wb") as f:
        for module, name in attacks:
            f.seek(0)
            f.write(payload(module, name, _args(name, marker, str(src))))
            f.truncate()
            f.flush()
            with pytest.raises(ValueError, match="is not allowed in checkpoint metadata.*refused, never executed"):
                check_metadata(folder)
            assert not os.path.lexists(marker), (module, name)
            refused += 1
    assert refused == len(attacks)
    assert sorted(os.listdir(tmp_path)) == ["ck", "src.txt"]  # nothing was created, moved or removed


@pytest.mark.parametrize("module,name", [
    ("torch", "load"), ("torch", "save"), ("torch.serialization", "load"), ("pathlib", "Path.write_text"),
    ("torch.distributed.checkpoint.metadata", "Metadata.__init__"), ("torch", "Size.__class__"),
    ("torch.distributed.checkpoint.filesystem", "FileSystemWriter"), ("torch.distributed.checkpoint", "load"),
    ("torch.distributed.checkpoint.metadata", "dataclass"), ("torch", "float32.__class__"),
    ("builtins", "getattr"), ("copyreg", "_reconstructor"), ("posix", "system"), ("nt", "system"),
])
def test_names_outside_the_exact_list_are_refused(tmp_path, module, name):
    (tmp_path / ".metadata").write_bytes(payload(module, name, (str(tmp_path / "PWNED"),)))
    with pytest.raises(ValueError, match="refused, never executed"):
        check_metadata(tmp_path)
    assert not (tmp_path / "PWNED").exists()


def _dcp_folder(path):
    m = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    save_dcp(path, m, opt)
    return m, opt


def test_real_metadata_passes_and_storage_records_stay_inside(tmp_path):
    m, opt = _dcp_folder(tmp_path / "a")
    check_metadata(tmp_path / "a")
    load_dcp(tmp_path / "a", m, opt)
    # a storage record that points outside the folder (DCP would read its bytes as tensor data)
    from torch.distributed.checkpoint.metadata import Metadata

    with open(tmp_path / "a" / ".metadata", "rb") as f:
        md = pickle.load(f)
    assert isinstance(md, Metadata)
    for bad in ("../../etc/passwd", "/etc/passwd", "..", "sub/x.distcp"):
        for info in md.storage_data.values():
            info.relative_path = bad
        with open(tmp_path / "a" / ".metadata", "wb") as f:
            pickle.dump(md, f)
        with pytest.raises(ValueError, match="not a file of the folder"):
            load_dcp(tmp_path / "a", m, opt)


def test_malformed_metadata_is_one_clear_error(tmp_path):
    m, opt = _dcp_folder(tmp_path)
    for raw in (b"", b"\x80\x04garbage", pickle.dumps({"a": 1}), pickle.dumps([1] * 10), b"\x80\x04N."):
        (tmp_path / ".metadata").write_bytes(raw)
        with pytest.raises(ValueError, match=r"cannot load .*\.metadata"):
            load_dcp(tmp_path, m, opt)


def test_sharded_resume_falls_back_from_a_crafted_metadata(tmp_path, capsys):
    """The whole path of a resume (the training loop's sharded loader, single process here): a crafted
    ``.metadata`` with a rewritten manifest is refused before DCP reads it, and the previous step is used."""
    from spectrakit.checkpoint import load_sharded, save_sharded, write_manifest

    marker = tmp_path / "PWNED"
    root = str(tmp_path / "ck")
    for step in (1, 2):
        m = torch.nn.Linear(3, 3)
        with torch.no_grad():
            m.weight.fill_(float(step))
        save_sharded(root, model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), step=step)
    newest = os.path.join(root, "step_00000002")
    with open(os.path.join(newest, ".metadata"), "wb") as f:
        f.write(payload("torch.distributed.checkpoint.filesystem", "os.system", (f"touch {marker}",)))
    write_manifest(newest, 2)  # the attacker also rewrites the manifest
    m = torch.nn.Linear(3, 3)
    state = load_sharded(root, model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    assert state["step"] == 1 and float(m.weight[0, 0]) == 1.0
    assert "refused, never executed" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="refused, never executed"):
        load_sharded(newest, model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    assert not marker.exists()
