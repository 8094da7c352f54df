"""The ``.metadata`` reader is ours and cannot be turned against itself: a crafted file may not change a class
(BUILD on a class, ``__setstate__`` planted on a record type, a path class given ``__fspath__``), may not
make DCP read files outside the folder, and DCP itself never unpickles the file. Every pickle is built here
from opcodes; nothing is read from a binary fixture."""

from __future__ import annotations

import importlib
import os
import pathlib
import pickle

import pytest
import torch

from spectrakit.checkpoint import CheckpointError, load_dcp, load_sharded, save_dcp, save_sharded, write_manifest
from spectrakit.checkpoint.metadata import METADATA_GLOBALS, read_metadata

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
DCP_MD = "torch.distributed.checkpoint.metadata"


def u(s: str) -> bytes:  # SHORT_BINUNICODE
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def g(module: str, name: str) -> bytes:  # STACK_GLOBAL
    return u(module) + u(name) + b"\x93"


def dict_of(*pairs: tuple[bytes, bytes]) -> bytes:  # EMPTY_DICT MARK k v ... SETITEMS
    return b"}(" + b"".join(k + v for k, v in pairs) + b"u"


def _folder(path) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    save_dcp(path, m, opt)
    return m, opt


def _snapshot() -> dict:
    """``vars()`` of every class the allow-list names (and the path classes), by identity of the values."""
    out = {}
    for module, name in sorted(METADATA_GLOBALS):
        obj = getattr(importlib.import_module(module), name)
        for cls in (obj, *getattr(obj, "__mro__", ())[1:-1]):
            out[(cls.__module__, cls.__qualname__)] = {k: id(v) for k, v in vars(cls).items()}
    return out


def _patterns(module: str, name: str, legit: bytes) -> list[bytes]:
    """Every way to aim a BUILD, REDUCE or NEWOBJ at the allowed ``module.name``: on the class itself (dict
    state and slot state, a planted ``__setstate__`` and ``__fspath__``), after a legitimate metadata object,
    on an instance with foreign fields, twice on one instance, and calls with odd arguments."""
    evil_records = dict_of((u("storage_data"), dict_of((u("x"), u("../evil/x.distcp")))))
    plant = dict_of((u("__setstate__"), g(DCP_MD, "StorageMeta")), (u("__fspath__"), g("torch", "Size")),
                    (u("storage_data"), b"N"))
    body = legit[2:-1]  # the legitimate object's opcodes, without PROTO and STOP
    out = []
    for state in (evil_records, plant, b"N" + plant + b"\x86", b"N" + evil_records + b"\x86"):
        out.append(b"\x80\x04" + g(module, name) + state + b"b.")                 # BUILD on the class
        out.append(b"\x80\x04" + body + g(module, name) + state + b"b0.")         # ... after a real Metadata
        out.append(b"\x80\x04" + g(module, name) + b")\x81" + state + b"b.")      # an instance, foreign fields
        out.append(b"\x80\x04" + g(module, name) + b")\x81" + b"}b" + state + b"b.")  # BUILD twice
    for args in (b")", u("x") + b"\x85", b"]" + b"\x85", b"K\x07\x85", u("/etc") + u("passwd") + b"\x86",
                 g("torch", "Size") + b"\x85", b"(K\x01K\x02K\x03K\x04t"):
        out.append(b"\x80\x04" + g(module, name) + args + b"R.")                  # REDUCE
        out.append(b"\x80\x04" + g(module, name) + args + b"\x81.")               # NEWOBJ with arguments
    return out


def test_no_pattern_changes_a_class_or_breaks_paths(tmp_path):
    _folder(tmp_path)
    legit = (tmp_path / ".metadata").read_bytes()
    before = _snapshot()
    refused = 0
    for module, name in sorted(METADATA_GLOBALS):
        for raw in _patterns(module, name, legit):
            (tmp_path / ".metadata").write_bytes(raw)
            with pytest.raises(ValueError, match=r"cannot load .*\.metadata: .*\(refused"):
                read_metadata(tmp_path)
            refused += 1
    assert refused == len(METADATA_GLOBALS) * 30
    assert _snapshot() == before
    assert os.fspath(pathlib.Path("a") / "b") == "a/b"  # the path classes still work
    (tmp_path / ".metadata").write_bytes(legit)
    assert read_metadata(tmp_path).storage_data  # and the real file still reads


def test_the_class_build_attack_of_the_old_checker(tmp_path):
    """The exact shape that got past the old check: a harmless Metadata, then a BUILD on the class Metadata
    planting ``__setstate__`` and class-level storage records outside the folder."""
    m, opt = _folder(tmp_path / "ck")
    legit = (tmp_path / "ck" / ".metadata").read_bytes()
    from torch.distributed.checkpoint.metadata import Metadata

    before = dict(vars(Metadata))
    raw = (b"\x80\x04" + legit[2:-1] + g(DCP_MD, "Metadata") + b"N"
           + dict_of((u("__setstate__"), g(DCP_MD, "StorageMeta")), (u("storage_data"), b"}")) + b"\x86b0.")
    (tmp_path / "ck" / ".metadata").write_bytes(raw)
    with pytest.raises(ValueError, match="BUILD on something other than a new DCP record"):
        load_dcp(tmp_path / "ck", m, opt)
    assert dict(vars(Metadata)) == before and "__setstate__" not in vars(Metadata)


def test_dcp_never_unpickles_the_file(tmp_path, monkeypatch):
    """DCP gets our object: its own ``pickle.load`` is never called on ``.metadata``."""
    import torch.distributed.checkpoint.filesystem as fs

    m, opt = _folder(tmp_path)
    m2 = torch.nn.Linear(3, 2)

    def refuse(*a, **k):
        raise AssertionError("DCP unpickled .metadata itself")

    monkeypatch.setattr(fs.pickle, "load", refuse)
    load_dcp(tmp_path, m2, torch.optim.SGD(m2.parameters(), lr=0.1))
    assert torch.equal(m2.weight, m.weight)


@pytest.mark.parametrize("what", ["bare", "no records", "orphan record", "chunk outside", "dict key", "slot state",
                                  "persistent id", "extension", "big size", "not regular"])
def test_malformed_or_inconsistent_metadata_is_refused(tmp_path, what):
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    m, opt = _folder(tmp_path)
    md = read_metadata(tmp_path)
    meta = tmp_path / ".metadata"
    if what == "bare":
        raw = pickle.dumps(Metadata(state_dict_metadata={}))
    elif what == "no records":
        md.storage_data = {}
        raw = pickle.dumps(md)
    elif what == "orphan record":
        key = next(iter(md.storage_data))
        md.storage_data[MetadataIndex("elsewhere")] = md.storage_data[key]
        raw = pickle.dumps(md)
    elif what == "chunk outside":
        entry = md.state_dict_metadata["model.weight"]
        entry.chunks[0].offsets = torch.Size([5, 0])
        raw = pickle.dumps(md)
    elif what == "dict key":  # a nested tuple as a key: hashing a crafted DAG could take forever
        raw = b"\x80\x04}(K\x01K\x02\x86K\x01u."
    elif what == "slot state":
        raw = b"\x80\x04" + g(DCP_MD, "BytesStorageMetadata") + b")\x81N" + dict_of((u("x"), b"K\x01")) + b"\x86b."
    elif what == "persistent id":
        raw = b"\x80\x04" + u("x") + b"Q."
    elif what == "extension":
        raw = b"\x80\x04\x82\x01."
    elif what == "big size":
        raw = b"\x80\x04" + g("torch", "Size") + b"]" + b"(" + b"K\x01" * 100 + b"e\x85R."
    else:
        meta.unlink()
        os.mkfifo(meta)
        raw = None
    if raw is not None:
        meta.write_bytes(raw)
    with pytest.raises(ValueError, match=r"cannot load .*\.metadata: .*\(refused"):
        load_dcp(tmp_path, m, opt)


def test_sharded_resume_falls_back_from_metadata_that_dcp_would_reject(tmp_path, capsys):
    """A bare ``Metadata()`` (60 bytes) passed the old check and made DCP raise its multi-line exception; now
    it is one line and the previous checkpoint is used. So is a folder whose shards DCP cannot read."""
    from torch.distributed.checkpoint.metadata import Metadata

    root = str(tmp_path / "ck")
    for step in (1, 2, 3):
        m = torch.nn.Linear(3, 3)
        with torch.no_grad():
            m.weight.fill_(float(step))
        save_sharded(root, model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), step=step, keep=3)
    newest, middle = (os.path.join(root, f"step_0000000{s}") for s in (3, 2))
    with open(os.path.join(newest, ".metadata"), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata={}), f)
    write_manifest(newest, 3)
    # the middle one: valid metadata, but a data file DCP cannot read as tensors
    data = [n for n in os.listdir(middle) if n.endswith(".distcp")][0]
    with open(os.path.join(middle, data), "r+b") as f:
        f.write(b"\x00" * 64)
    write_manifest(middle, 2)
    m = torch.nn.Linear(3, 3)
    state = load_sharded(root, model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    assert state["step"] == 1 and float(m.weight.detach()[0, 0]) == 1.0
    err = capsys.readouterr().err
    assert "step_00000003/.metadata: Metadata.storage_data has the wrong type" in err
    assert err.count("trying the previous checkpoint") == 2, err
    assert all(len(line) < 500 for line in err.splitlines())
    with pytest.raises(CheckpointError, match="step_00000002"):
        load_sharded(middle, model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
