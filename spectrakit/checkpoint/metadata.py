"""A DCP ``.metadata`` file read by our own restricted unpickler, and checked, before DCP sees it.

torch's DCP reads ``.metadata`` with plain ``pickle.load``, which runs whatever the file names. Here it is
read once by :func:`read_metadata`; DCP then gets that object (``spectrakit.checkpoint.dcp``'s reader) and
never unpickles the file itself. The unpickler understands only the opcodes a DCP file uses, hands out
*names* (never classes or functions) for the globals it allows, builds DCP's records through their
constructors with their own field names, and refuses everything else.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import pickle
import stat

import torch

METADATA = ".metadata"
MAX_METADATA_BYTES = 256 << 20
_DCP_MD = "torch.distributed.checkpoint.metadata"
# the (module, name) pairs a file may name: DCP's records, the values torch pickles inside them, paths
METADATA_GLOBALS = frozenset({
    (_DCP_MD, "Metadata"), (_DCP_MD, "MetadataIndex"), (_DCP_MD, "StorageMeta"), (_DCP_MD, "TensorProperties"),
    (_DCP_MD, "TensorStorageMetadata"), (_DCP_MD, "BytesStorageMetadata"), (_DCP_MD, "ChunkStorageMetadata"),
    (_DCP_MD, "_MEM_FORMAT_ENCODING"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"), ("torch", "Size"),
    ("pathlib", "Path"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
})
# the opcodes of a protocol 2-5 pickle of plain data and records (no persistent ids, extension codes, INST,
# OBJ, NEWOBJ_EX, sets, bytes, floats or out-of-band buffers)
_OPCODES = ("MARK STOP POP POP_MARK BININT BININT1 BININT2 LONG1 NONE NEWTRUE NEWFALSE BINUNICODE "
            "SHORT_BINUNICODE BINUNICODE8 EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_LIST APPEND APPENDS LIST "
            "EMPTY_DICT SETITEM SETITEMS GET BINGET LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE PROTO FRAME "
            "GLOBAL STACK_GLOBAL REDUCE NEWOBJ BUILD").split()


class _Name:
    """What a GLOBAL opcode puts on the stack: the allowed name, never the object it names."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


def _types() -> dict[str, type]:
    from torch.distributed.checkpoint import filesystem as fs
    from torch.distributed.checkpoint import metadata as md

    return {"Metadata": md.Metadata, "MetadataIndex": md.MetadataIndex, "StorageMeta": md.StorageMeta,
            "TensorProperties": md.TensorProperties, "TensorStorageMetadata": md.TensorStorageMetadata,
            "BytesStorageMetadata": md.BytesStorageMetadata, "ChunkStorageMetadata": md.ChunkStorageMetadata,
            "_StorageInfo": fs._StorageInfo}


def _refuse(why: str):
    raise pickle.UnpicklingError(why)


def _is_int(x) -> bool:
    return type(x) is int


def _size(parts) -> torch.Size:
    if type(parts) not in (list, tuple) or len(parts) > 64 or not all(_is_int(p) and p >= 0 for p in parts):
        _refuse("torch.Size takes a short list of non-negative ints")
    return torch.Size(parts)


def _layout(name) -> torch.layout:
    value = getattr(torch, name[len("torch."):], None) if type(name) is str and name.startswith("torch.") else None
    if not isinstance(value, torch.layout):
        _refuse(f"{str(name)[:40]!r} is not a torch layout")
    return value


class _Reader(pickle._Unpickler):
    """The pure-Python unpickler with a dispatch table of :data:`_OPCODES` only, GLOBAL giving a
    :class:`_Name`, REDUCE calling one of four value constructors with checked arguments, NEWOBJ allocating
    an allowed record and BUILD filling it once, through its constructor."""

    def __init__(self, data: bytes, types: dict[str, type]):
        super().__init__(io.BytesIO(data))
        self._records = types
        self._open: dict[int, object] = {}  # id -> record allocated by NEWOBJ, not built yet
        self.dispatch = {op: type(self)._bad_opcode for op in range(256)}
        for name in _OPCODES:
            code = getattr(pickle, name)[0]
            self.dispatch[code] = getattr(type(self), f"_op_{name.lower()}", None) or pickle._Unpickler.dispatch[code]

    def _bad_opcode(self):
        _refuse("an opcode outside plain data and DCP records")

    def find_class(self, module, name):
        if module == "torch" and isinstance(vars(torch).get(name), torch.dtype):
            return vars(torch)[name]  # a dtype value
        if (module, name) not in METADATA_GLOBALS:
            _refuse(f"{str(module)[:80]}.{str(name)[:80]} is not allowed in checkpoint metadata")
        return _Name(module, name)

    def persistent_load(self, pid):  # (unreachable: PERSID opcodes are refused) pragma: no cover
        _refuse("persistent references are not allowed in checkpoint metadata")

    def _key(self, k):
        if not (type(k) in (str, int) or (type(k) is self._records["MetadataIndex"] and id(k) not in self._open)):
            _refuse("a dict key other than a str, an int or a built MetadataIndex")
        return k

    def _op_setitem(self):
        value, key = self.stack.pop(), self.stack.pop()
        self._dict()[self._key(key)] = value

    def _op_setitems(self):
        items = self.pop_mark()
        target = self._dict()
        for i in range(0, len(items) - 1, 2):
            target[self._key(items[i])] = items[i + 1]

    def _dict(self) -> dict:
        if type(self.stack[-1]) is not dict:
            _refuse("SETITEM on something other than a dict")
        return self.stack[-1]

    def _op_append(self):
        value = self.stack.pop()
        self._list().append(value)

    def _op_appends(self):
        items = self.pop_mark()
        self._list().extend(items)

    def _list(self) -> list:
        if type(self.stack[-1]) is not list:
            _refuse("APPEND on something other than a list")
        return self.stack[-1]

    def _op_reduce(self):
        args, fn = self.stack.pop(), self.stack.pop()
        if type(fn) is not _Name or type(args) is not tuple:
            _refuse("REDUCE of something other than an allowed name")
        if (fn.module, fn.name) == ("torch", "Size") and len(args) == 1:
            self.append(_size(args[0]))
        elif fn.name == "_get_layout" and len(args) == 1:
            self.append(_layout(args[0]))
        elif fn.name == "_MEM_FORMAT_ENCODING" and len(args) == 1 and _is_int(args[0]):
            from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

            if args[0] not in {e.value for e in _MEM_FORMAT_ENCODING}:
                _refuse(f"{args[0]} is not a memory format code")
            self.append(_MEM_FORMAT_ENCODING(args[0]))
        elif fn.module == "pathlib" and 0 < len(args) <= 256 and all(type(a) is str for a in args):
            self.append(pathlib.PurePosixPath(*args))  # a path is data here: never a Path that touches disk
        else:
            _refuse(f"{fn.module}.{fn.name} cannot be called with these arguments in checkpoint metadata")

    def _op_newobj(self):
        args, cls = self.stack.pop(), self.stack.pop()
        kind = self._records.get(cls.name) if type(cls) is _Name else None
        if kind is None or args != ():
            _refuse("NEWOBJ of something other than a DCP record")
        obj = object.__new__(kind)
        self._open[id(obj)] = obj
        self.append(obj)

    def _op_build(self):
        state, obj = self.stack.pop(), self.stack[-1]
        if self._open.pop(id(obj), None) is not obj:
            _refuse("BUILD on something other than a new DCP record")
        self._build(obj, state)

    def _build(self, obj, state) -> None:
        kind = type(obj)
        if kind.__name__ == "TensorProperties":
            state = _properties_state(state)
        fields = {f.name for f in dataclasses.fields(kind)}
        if type(state) is not dict or not all(type(k) is str and k in fields for k in state):
            _refuse(f"the state of a {kind.__name__} must be a dict of its fields ({', '.join(sorted(fields))})")
        _check_fields(kind.__name__, state, self._records)
        try:
            built = kind(**state)  # the record's own constructor: only its fields, each a checked value
        except TypeError as e:
            _refuse(f"{kind.__name__}: {e}")
        obj.__dict__.update(built.__dict__)

    def load(self):
        md = super().load()
        for obj in self._open.values():  # a record pickled without state (all fields at their defaults)
            self._build(obj, {})
        return md


def _properties_state(state) -> dict:
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING as enc

    formats = {enc.TORCH_CONTIGUOUS_FORMAT: torch.contiguous_format, enc.TORCH_CHANNELS_LAST: torch.channels_last,
               enc.TORCH_PRESERVE_FORMAT: torch.preserve_format}
    if type(state) is not tuple or len(state) != 5:
        _refuse("the state of a TensorProperties must be (dtype, layout, requires_grad, memory format, pinned)")
    dtype, layout, grad, mem, pinned = state
    if not (isinstance(dtype, torch.dtype) and isinstance(layout, torch.layout) and type(grad) is bool
            and type(pinned) is bool and type(mem) is enc):
        _refuse("a TensorProperties holds values of the wrong types")
    return {"dtype": dtype, "layout": layout, "requires_grad": grad, "memory_format": formats[mem],
            "pin_memory": pinned}


def _check_fields(kind: str, s: dict, types: dict[str, type]) -> None:
    """Refuse a record field of the wrong type (checked before the constructor runs)."""
    def ok(key, test):
        if key in s and not test(s[key]):
            _refuse(f"{kind}.{key} has the wrong type ({type(s[key]).__name__})")

    opt_str = lambda v: v is None or type(v) is str  # noqa: E731
    if kind == "MetadataIndex":
        ok("fqn", lambda v: type(v) is str)
        ok("offset", lambda v: v is None or type(v) is torch.Size)
        ok("index", lambda v: v is None or _is_int(v))
    elif kind == "_StorageInfo":
        ok("relative_path", lambda v: type(v) is str)
        ok("offset", _is_int)
        ok("length", _is_int)
        ok("transform_descriptors", lambda v: v is None or (type(v) in (list, tuple) and not v))
    elif kind == "ChunkStorageMetadata":
        ok("offsets", lambda v: type(v) is torch.Size)
        ok("sizes", lambda v: type(v) is torch.Size)
    elif kind == "TensorStorageMetadata":
        ok("properties", lambda v: type(v) is types["TensorProperties"])
        ok("size", lambda v: type(v) is torch.Size)
        ok("chunks", lambda v: type(v) is list and all(type(c) is types["ChunkStorageMetadata"] for c in v))
    elif kind == "StorageMeta":
        ok("checkpoint_id", lambda v: v is None or type(v) is str or isinstance(v, pathlib.PurePath))
        ok("save_id", opt_str)
        ok("load_id", opt_str)
        ok("modules", lambda v: type(v) is list and all(type(m) is str for m in v))
    elif kind == "Metadata":
        ok("state_dict_metadata", lambda v: type(v) is dict)
        ok("planner_data", lambda v: v is None or type(v) is dict)
        ok("storage_data", lambda v: type(v) is dict)
        ok("storage_meta", lambda v: v is None or type(v) is types["StorageMeta"])
        ok("version", opt_str)


def _consistency_error(md, types: dict[str, type]) -> str | None:
    """Why ``md`` is not the metadata of files inside its folder, or None."""
    if type(md) is not types["Metadata"]:
        return "it is not DCP metadata"
    entries, records = md.state_dict_metadata, md.storage_data
    if not entries or not records:
        return "it lists no entries or no storage records"
    for fqn, entry in entries.items():
        if type(fqn) is not str or type(entry) not in (types["TensorStorageMetadata"], types["BytesStorageMetadata"]):
            return f"entry {str(fqn)[:80]!r} is not a tensor or bytes record"
        if type(entry) is types["TensorStorageMetadata"]:
            for c in entry.chunks:
                if len(c.offsets) != len(entry.size) or len(c.sizes) != len(entry.size) or any(
                        o + n > s for o, n, s in zip(c.offsets, c.sizes, entry.size)):
                    return f"a chunk of {fqn[:80]!r} lies outside its tensor {tuple(entry.size)}"
    for index, info in records.items():
        if type(index) is not types["MetadataIndex"] or type(info) is not types["_StorageInfo"]:
            return "a storage record is not (MetadataIndex, storage info)"
        if index.fqn not in entries:
            return f"a storage record names {index.fqn[:80]!r}, which is not an entry"
        rel = info.relative_path
        if not rel or rel in (".", "..") or "/" in rel or "\\" in rel or "\x00" in rel:
            return f"a storage record names {rel[:100]!r}, not a file of the folder"
        if info.offset < 0 or info.length < 0:
            return f"a storage record has offset {info.offset} and length {info.length}"
    if {i.fqn for i in records} != set(entries):
        return "some entries have no storage record"
    if md.planner_data is not None and not all(
            type(k) is str and type(v) is tuple and all(type(p) in (str, int) for p in v)
            for k, v in md.planner_data.items()):
        return "its planner data is not a map of names to key paths"
    return None


def read_metadata(folder: str | os.PathLike):
    """The DCP ``Metadata`` of ``folder``, read by the restricted unpickler and checked (entries, storage
    records inside the folder, chunks inside their tensors, every entry stored).

    Raises ``ValueError`` "cannot load <file>: <why> (refused, never executed)" for anything else, a file
    over :data:`MAX_METADATA_BYTES` or not a regular file; ``FileNotFoundError`` if there is none."""
    path = os.path.join(os.fspath(folder), METADATA)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ValueError(f"cannot load {path}: {e.strerror or e} (refused, never executed)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_METADATA_BYTES:
            what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"over {MAX_METADATA_BYTES >> 20} MiB"
            raise ValueError(f"cannot load {path}: {what} (refused, never executed)")
        data = f.read(MAX_METADATA_BYTES + 1)
    types = _types()
    try:
        md = _Reader(data, types).load()
    except pickle.UnpicklingError as e:
        reason = (str(e).splitlines() or ["not a pickle"])[0][:200]
        raise ValueError(f"cannot load {path}: {reason} (refused, never executed)") from None
    except Exception as e:  # EOFError, IndexError from a short stack, KeyError from a missing memo entry, ...
        reason = f"a malformed pickle ({type(e).__name__})"
        raise ValueError(f"cannot load {path}: {reason} (refused, never executed)") from None
    why = _consistency_error(md, types)
    if why:
        raise ValueError(f"cannot load {path}: {why} (refused)")
    return md
