"""A restricted unpickler for checkpoint pickles: it builds an inert record tree and never imports or runs code.

``torch.load(weights_only=False)`` imports every global a pickle names and calls whatever the pickle says.
This reader resolves each global against a fixed table instead of importing it:

- tensor rebuild functions become placeholders that return :class:`TensorInfo` records, and storage
  persistent ids become :class:`StorageRef` records (tensor bytes are never read);
- dtypes, layouts and devices become :class:`TorchConst`, ``torch.Size`` a tuple, ``OrderedDict`` itself;
- ``set``, ``frozenset``, ``complex``, ``slice``, ``bytes``, ``bytearray`` and ``_codecs.encode`` run
  through guards that accept plain data only (no ``bytearray(10**12)``);
- every other global becomes a placeholder *type*: creating it yields an inert :class:`Opaque` record that
  keeps its arguments and ``__setstate__`` state, so a pickled ``nn.Module`` is a tree of records;
- calling anything that is not allow-listed (``os.system``, ``builtins.eval``, the result of a blocked
  call, an :class:`Opaque`) runs nothing: it returns an inert record and is reported as a :class:`Blocked`
  finding.

The only code that runs is in this module, and no module named by the pickle is imported.
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
import reprlib
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

from envvault.errors import CorruptError

__all__ = [
    "DTYPE_SIZES",
    "TorchConst",
    "StorageType",
    "StorageRef",
    "TensorInfo",
    "Opaque",
    "Blocked",
    "PickleResult",
    "load",
    "loads",
    "global_name",
    "walk",
]

DTYPE_SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    **{f"{p}int{n}": 1 for p in ("", "u") for n in range(1, 8)},
}  # fmt: skip

_STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128",
    "QInt8Storage": "qint8", "QUInt8Storage": "quint8", "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8", "TypedStorage": "uint8",
}  # fmt: skip

_TORCH_CONSTS = set(DTYPE_SIZES) | {
    "per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
    "per_channel_affine_float_qparams", "strided", "sparse_coo", "sparse_csr", "sparse_csc",
    "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged", "contiguous_format", "channels_last",
    "channels_last_3d", "preserve_format",
}  # fmt: skip

# Classes torch's own weights_only loader accepts: placeholders for them are not worth listing.
_ALLOWED_CLASSES = {
    ("argparse", "Namespace"), ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"),
    ("torch.nn.parameter", "Buffer"), ("builtins", "object"),
} | {(m, f"{t}Tensor") for m in ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse")
     for t in ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")}

# Calls that only build data; torch.load would run them, we don't, and they are not worth a finding.
_BENIGN_CALLS = {
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"), ("datetime", "timedelta"),
    ("datetime", "timezone"), ("decimal", "Decimal"), ("fractions", "Fraction"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"), ("pathlib", "Path"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
}  # fmt: skip

# Labels only: nothing outside the allow-list runs whatever its label. "danger" marks names known to
# reach the shell, the file system, the network or an interpreter (after fickling's UNSAFE_IMPORTS).
_DANGEROUS_MODULES = frozenset(
    "os posix nt subprocess sys pty commands multiprocessing _posixsubprocess _winapi code codeop runpy "
    "marshal types importlib _imp imp pkgutil zipimport gc site inspect _operator operator functools "
    "ctypes _ctypes pickle _pickle dill cloudpickle joblib shutil tempfile socket ssl http urllib urllib2 "
    "httplib requests asyncio webbrowser ftplib smtplib telnetlib pdb bdb timeit trace cProfile profile "
    "pydoc signal threading _thread atexit glob platform io _io mmap shelve tarfile zipfile logging "
    "sqlite3 venv ensurepip pip doctest builtins __builtin__ __builtins__ _frozen_importlib "
    "_frozen_importlib_external _interpreters _xxsubinterpreters".split()
)
_DANGEROUS_PREFIXES = ("torch.hub", "torch.utils.cpp_extension", "torch.package", "torch.jit", "torch.ops",
                       "torch._ops", "torch._dynamo", "numpy.f2py", "numpy.distutils", "numpy.testing")
_DANGEROUS_NAMES = frozenset(
    "eval exec compile open __import__ getattr setattr delattr globals locals vars breakpoint input "
    "system popen spawn load loads load_inline".split()
)
_HARMLESS_BUILTINS = frozenset(
    "int float str bool list dict tuple bytes object range NoneType Ellipsis NotImplemented".split()
)


def _is_dangerous(module: str, name: str) -> bool:
    if module in ("builtins", "__builtin__", "__builtins__") and name in _HARMLESS_BUILTINS:
        return False
    if module.split(".")[0] in _DANGEROUS_MODULES:
        return True
    if any(module == p or module.startswith(p + ".") for p in _DANGEROUS_PREFIXES):
        return True
    parts = name.split(".")
    # Dotted names are resolved attribute by attribute (torch.serialization + "os.system").
    return any(p in _DANGEROUS_NAMES or p in _DANGEROUS_MODULES or (p.startswith("__") and p.endswith("__"))
               for p in parts)


@dataclass(frozen=True)
class TorchConst:
    """A torch constant the pickle names: ``torch.float16``, ``torch.strided``, a device such as ``cuda:0``."""

    text: str

    def __setstate__(self, state: Any) -> None:  # BUILD on a constant: ignored
        pass


@dataclass(frozen=True)
class StorageType:
    """A ``torch.*Storage`` class named by the pickle; ``dtype`` is the element type it implies."""

    name: str
    dtype: str

    def __setstate__(self, state: Any) -> None:
        pass


@dataclass(eq=False)
class StorageRef:
    """A storage the pickle points at by persistent id; its bytes live elsewhere and are never read."""

    key: str
    dtype: str
    location: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES.get(self.dtype, 1)

    def __setstate__(self, state: Any) -> None:
        pass


@dataclass(eq=False, repr=False)
class TensorInfo:
    """What ``torch.load`` would rebuild, without the data. ``shape`` is None when the pickle does not say."""

    shape: tuple[int, ...] | None
    dtype: str
    stride: tuple[int, ...] | None = None
    storage_key: str | None = None
    device: str | None = None
    offset: int = 0
    requires_grad: bool = False
    kind: str = "tensor"  # tensor, parameter, qtensor, sparse, meta, nested, or "subclass:<module.Class>"
    state: Any = None

    def __setstate__(self, state: Any) -> None:  # BUILD on a tensor subclass: keep, never apply
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.kind} {self.dtype}{list(self.shape) if self.shape is not None else '[?]'}>"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape or (0,):
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES.get(self.dtype, 1)


class Opaque:
    """An inert stand-in for an object the pickle builds from a class or a call the reader did not run.

    ``module``/``name`` say what torch.load would have imported (``name`` ends in ``(...)`` for the result
    of calling another record); ``args``/``kwargs`` what it would have been called with; ``state`` what
    BUILD passed to ``__setstate__``; ``items``/``dict_items`` what APPENDS/SETITEMS added. ``called`` is
    True when the pickle called it (REDUCE) rather than only creating an instance (NEWOBJ).
    """

    __slots__ = ("module", "name", "args", "kwargs", "state", "items", "dict_items", "called", "danger",
                 "benign", "_session")

    # The unpickler may call the methods below on an object it built; each one only records.
    def __setstate__(self, state: Any) -> None:
        self.state = state

    def append(self, value: Any) -> None:
        self.items.append(value)

    def extend(self, values: list) -> None:
        self.items.extend(values)

    def add(self, value: Any) -> None:
        self.items.append(value)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.dict_items.append((key, value))

    def __call__(self, *args: Any, **kwargs: Any) -> Opaque:
        return self._session.make(Opaque, self.module, f"{self.name}(...)", args, kwargs, called=True,
                                  danger=self.danger)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name

    def __repr__(self) -> str:
        return f"<{self.qualname}>"


class _Placeholder(Opaque):
    """Base of the per-global placeholder types. Creating one (NEWOBJ) or calling it (REDUCE) records."""

    __slots__ = ()
    _g_module = _g_name = ""
    _g_session: _Session
    _g_danger = _g_benign = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        return cls._g_session.make(cls, cls._g_module, cls._g_name, args, kwargs, called=False,
                                   danger=cls._g_danger, benign=cls._g_benign)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # reached only when the pickle calls the type
        self.called = True


@dataclass(frozen=True)
class Blocked:
    """A finding: the pickle refers to, creates or calls something that is not on the allow-list.

    Nothing ran. ``severity`` is ``"danger"`` for names known to reach the shell, files, network or an
    interpreter (``os.system``, ``builtins.eval``...) and ``"unknown"`` for other callables.
    """

    module: str
    name: str
    action: str  # call, instantiate, reference
    args: str = ""
    severity: str = "danger"

    def __str__(self) -> str:
        target = f"{self.module}.{self.name}" if self.module else self.name
        tail = "blocked, not run" if self.severity == "danger" else "not on the allow-list, not run"
        if self.action == "call":
            return f"pickle tries to call {target}{self.args} ({tail})"
        if self.action == "instantiate":
            return f"pickle tries to create a {target} object ({tail})"
        return f"pickle refers to {target} ({tail})"


@dataclass(frozen=True)
class PickleResult:
    """The record tree, the findings in pickle order, every non-allow-listed global the pickle names, and
    the storages its persistent ids point at."""

    obj: Any
    findings: tuple[Blocked, ...]
    globals: tuple[str, ...]
    storages: tuple[StorageRef, ...] = ()


_REPR = reprlib.Repr()
_REPR.maxstring = 80
_REPR.maxother = 60
_REPR.maxlevel = 3


class _Refused(Exception):
    """A guard saw arguments that are not plain data."""


class _Session:
    """State of one load: placeholder types, the records made, storages seen, non-allow-listed names."""

    def __init__(self) -> None:
        self.types: dict[tuple[str, str], type] = {}
        self.made: list[Opaque] = []
        self.names: dict[tuple[str, str], None] = {}
        self.storages: dict[str, StorageRef] = {}

    def make(self, cls: type, module: str, name: str, args: tuple, kwargs: dict, *, called: bool,
             danger: bool, benign: bool = False) -> Opaque:
        rec = object.__new__(cls)
        rec.module, rec.name, rec.args, rec.kwargs = module, name, args, kwargs
        rec.state, rec.items, rec.dict_items = None, [], []
        rec.called, rec.danger, rec.benign, rec._session = called, danger, benign, self
        self.made.append(rec)
        return rec

    def placeholder(self, module: str, name: str) -> type:
        key = (module, name)
        if key not in self.types:
            if key not in _ALLOWED_CLASSES:
                self.names[key] = None
            self.types[key] = type("OpaqueGlobal", (_Placeholder,), {
                "__slots__": (), "_g_module": module, "_g_name": name, "_g_session": self,
                "_g_danger": _is_dangerous(module, name), "_g_benign": key in _BENIGN_CALLS,
            })  # fmt: skip
        return self.types[key]

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        guard = _GUARDS.get((module, name))
        if guard is not None:
            return _bind(guard, self, module, name)
        if module == "torch" and name in _TORCH_CONSTS:
            return TorchConst(f"torch.{name}")
        if module in ("torch", "torch.cuda", "torch.storage") and name in _STORAGE_DTYPES:
            return StorageType(f"{module}.{name}", _STORAGE_DTYPES[name])
        return self.placeholder(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] in ("storage", b"storage"):
            stype, key, location, numel = pid[1:5]
            key = _text(key)
            if key not in self.storages:
                dtype = stype.dtype if isinstance(stype, StorageType) else "unknown"
                numel = numel if isinstance(numel, int) and numel >= 0 else 0
                self.storages[key] = StorageRef(key, dtype, _text(location), numel)
            return self.storages[key]
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] in ("module", b"module"):
            return pid[1]  # legacy torch.save(model): the class itself, with its source (ignored)
        # Unknown persistent ids stay inert data; torch.load would fail on them.
        return self.make(Opaque, "", "persistent_id", (pid,), {}, called=False, danger=False, benign=True)

    def findings(self) -> tuple[Blocked, ...]:
        out: list[Blocked] = []
        used: set[tuple[str, str]] = set()
        for rec in self.made:
            used.add((rec.module, rec.name))
            if rec.called and not rec.benign:
                out.append(Blocked(rec.module, rec.name, "call", _call_repr(rec.args, rec.kwargs),
                                   "danger" if rec.danger else "unknown"))
            elif rec.danger and not rec.called:
                out.append(Blocked(rec.module, rec.name, "instantiate"))
        for (module, name), cls in self.types.items():
            if cls._g_danger and (module, name) not in used:
                out.append(Blocked(module, name, "reference"))
        return tuple(out)


def _call_repr(args: tuple, kwargs: dict) -> str:
    parts = [_REPR.repr(a) for a in args] + [f"{k}={_REPR.repr(v)}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return f"({text[:300]}{'...' if len(text) > 300 else ''})"


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _bind(guard: Any, session: _Session, module: str, name: str) -> Any:
    """A callable that runs ``guard`` and turns arguments it refuses into a recorded (unknown) call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return guard(session, *args, **kwargs)
        except (_Refused, TypeError, ValueError, OverflowError):
            return session.make(Opaque, module, name, args, kwargs, called=True, danger=False)

    call.__qualname__ = call.__name__ = f"guarded {module}.{name}"
    return call


# --- guards: the only functions a pickle can make this reader run ------------------------------------

_PLAIN = (str, bytes, int, float, bool, type(None))


def _plain_seq(value: Any) -> Any:
    if not isinstance(value, (list, tuple, set, frozenset, dict)):
        raise _Refused(type(value).__name__)
    return value


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                        for v in value):
        raise _Refused("expected a sequence of ints")
    return tuple(value)


def _g_ordered_dict(s: _Session, items: Any = ()) -> OrderedDict:
    return OrderedDict(_plain_seq(items))


def _g_dict(s: _Session, items: Any = ()) -> dict:
    return dict(_plain_seq(items)) if not callable(items) else {}  # defaultdict(factory): factory dropped


def _g_set(s: _Session, items: Any = ()) -> set:
    return set(_plain_seq(items))


def _g_frozenset(s: _Session, items: Any = ()) -> frozenset:
    return frozenset(_plain_seq(items))


def _g_complex(s: _Session, real: Any = 0, imag: Any = 0) -> complex:
    if not all(isinstance(v, (int, float)) or (isinstance(v, str) and len(v) < 100) for v in (real, imag)):
        raise _Refused("complex")
    return complex(real, imag) if not isinstance(real, str) else complex(real)


def _g_slice(s: _Session, *args: Any) -> slice:
    return slice(*args)


def _g_bytes(s: _Session, value: Any = b"", encoding: Any = None) -> bytes:
    if isinstance(value, str) and encoding in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        return value.encode(encoding)
    if isinstance(value, (bytes, bytearray)) or (isinstance(value, list) and all(
            isinstance(v, int) for v in value)):
        return bytes(value)
    raise _Refused("bytes")  # bytes(int) would allocate whatever size the pickle asks for


def _g_bytearray(s: _Session, value: Any = b"", encoding: Any = None) -> bytearray:
    return bytearray(_g_bytes(s, value, encoding))


def _g_encode(s: _Session, text: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    return _g_bytes(s, text, encoding)


def _g_device(s: _Session, kind: Any, index: Any = None) -> TorchConst:
    if not isinstance(kind, str) or not (index is None or isinstance(index, int)):
        raise _Refused("device")
    return TorchConst(kind if index is None else f"{kind}:{index}")


def _g_size(s: _Session, dims: Any = ()) -> tuple[int, ...]:
    return _ints(dims)


def _g_layout(s: _Session, name: Any) -> TorchConst:
    if not isinstance(name, str):
        raise _Refused("layout")
    return TorchConst(name)


def _g_reconstructor(s: _Session, cls: Any, base: Any = None, state: Any = None) -> Any:
    if not (isinstance(cls, type) and issubclass(cls, _Placeholder)):
        raise _Refused("copyreg._reconstructor of a non-placeholder")
    return cls.__new__(cls, *(() if state is None else (state,)))


def _g_newobj(s: _Session, cls: Any, *args: Any) -> Any:
    return _g_reconstructor(s, cls, None, args[0] if len(args) == 1 else (args or None))


def _storage_fields(storage: Any) -> tuple[str, str | None, str | None]:
    if isinstance(storage, StorageRef):
        return storage.dtype, storage.key, storage.location
    return "unknown", None, None


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False, *,
            dtype: str | None = None, kind: str = "tensor") -> TensorInfo:
    sdtype, key, location = _storage_fields(storage)
    return TensorInfo(_ints(size), dtype or sdtype, _ints(stride) if stride is not None else None, key,
                      location, offset if isinstance(offset, int) else 0, requires_grad is True, kind)


def _g_rebuild_tensor(s: _Session, storage: Any, offset: Any, size: Any, stride: Any) -> TensorInfo:
    return _tensor(storage, offset, size, stride)


def _g_rebuild_tensor_v2(s, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    return _tensor(storage, offset, size, stride, requires_grad)


def _g_rebuild_tensor_v3(s, storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    name = dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else None
    return _tensor(storage, offset, size, stride, requires_grad, dtype=name)


def _g_rebuild_parameter(s: _Session, data: Any, requires_grad: Any = True, hooks: Any = None,
                         state: Any = None) -> Any:
    if isinstance(data, TensorInfo):
        data.kind, data.requires_grad = "parameter", requires_grad is True
        if state is not None:
            data.state = state
    return data


def _g_rebuild_qtensor(s, storage, offset, size, stride, qparams, requires_grad=False, hooks=None):
    return _tensor(storage, offset, size, stride, requires_grad, kind="qtensor")


def _g_rebuild_sparse(s: _Session, layout: Any, data: Any) -> TensorInfo:
    parts = tuple(_plain_seq(data))
    size = next((p for p in reversed(parts) if isinstance(p, tuple)), None)
    values = next((p for p in reversed(parts) if isinstance(p, TensorInfo)), None)
    return TensorInfo(_ints(size) if size is not None else None, values.dtype if values else "unknown",
                      kind="sparse", state=parts)


def _g_rebuild_meta(s: _Session, dtype: Any, size: Any, stride: Any, requires_grad: Any = False) -> TensorInfo:
    name = dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else "unknown"
    return TensorInfo(_ints(size), name, _ints(stride), device="meta", requires_grad=requires_grad is True,
                      kind="meta")


def _g_rebuild_nested(s: _Session, buffer: Any, sizes: Any, strides: Any, offsets: Any) -> TensorInfo:
    dtype = buffer.dtype if isinstance(buffer, TensorInfo) else "unknown"
    return TensorInfo(None, dtype, kind="nested", state=(buffer, sizes, strides, offsets))


def _g_rebuild_wrapper(s, cls, dtype, size, stride, offset, layout, device, requires_grad):
    name = dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else "unknown"
    return TensorInfo(_ints(size), name, _ints(stride), device=getattr(device, "text", None),
                      kind=f"subclass:{global_name(cls)}")


def _g_rebuild_device(s: _Session, data: Any, dtype: Any, device: Any, requires_grad: Any) -> TensorInfo:
    name = dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else "unknown"
    shape = data.shape if isinstance(data, TensorInfo) else None
    return TensorInfo(shape, name, device=getattr(device, "text", None), requires_grad=requires_grad is True,
                      state=data)


def _g_rebuild_from_type(s: _Session, func: Any, new_type: Any, args: Any, state: Any) -> Any:
    # func can only be one of our own callables (pickle opcodes cannot make any other callable).
    if not (getattr(func, "__qualname__", "").startswith("guarded ") or isinstance(func, Opaque)
            or (isinstance(func, type) and issubclass(func, _Placeholder))):
        raise _Refused("_rebuild_from_type_v2")
    result = func(*_plain_seq(args))
    if isinstance(result, TensorInfo):
        cls = global_name(new_type)
        if cls not in ("torch.Tensor", "torch.nn.parameter.Parameter"):
            result.kind = f"subclass:{cls}"
        if state:
            result.state = state
    return result


def _g_numpy_scalar(s: _Session, dtype: Any, raw: Any = None) -> Any:
    """A numpy scalar becomes a Python number when its dtype is a plain one; otherwise a record."""
    code = dtype.args[0] if isinstance(dtype, Opaque) and dtype.args and isinstance(dtype.args[0], str) else ""
    order = dtype.state[1] if isinstance(dtype, Opaque) and isinstance(dtype.state, tuple) else "<"
    fmt = {"f2": "e", "f4": "f", "f8": "d", "i1": "b", "i2": "h", "i4": "i", "i8": "q", "u1": "B",
           "u2": "H", "u4": "I", "u8": "Q", "b1": "?"}.get(code)
    if fmt is None or not isinstance(raw, bytes) or len(raw) != struct.calcsize(fmt):
        raise _Refused("numpy scalar")
    return struct.unpack((">" if order == ">" else "<") + fmt, raw)[0]


_GUARDS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _g_ordered_dict,
    ("collections", "Counter"): _g_dict,
    ("collections", "defaultdict"): _g_dict,
    ("builtins", "set"): _g_set,
    ("builtins", "frozenset"): _g_frozenset,
    ("builtins", "complex"): _g_complex,
    ("builtins", "slice"): _g_slice,
    ("builtins", "bytes"): _g_bytes,
    ("builtins", "bytearray"): _g_bytearray,
    ("_codecs", "encode"): _g_encode,
    ("copyreg", "_reconstructor"): _g_reconstructor,
    ("copyreg", "__newobj__"): _g_newobj,
    ("torch", "device"): _g_device,
    ("torch", "Size"): _g_size,
    ("torch.serialization", "_get_layout"): _g_layout,
    ("torch._utils", "_rebuild_tensor"): _g_rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _g_rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _g_rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _g_rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _g_rebuild_parameter,
    ("torch._utils", "_rebuild_qtensor"): _g_rebuild_qtensor,
    ("torch._utils", "_rebuild_sparse_tensor"): _g_rebuild_sparse,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _g_rebuild_meta,
    ("torch._utils", "_rebuild_nested_tensor"): _g_rebuild_nested,
    ("torch._utils", "_rebuild_wrapper_subclass"): _g_rebuild_wrapper,
    ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"): _g_rebuild_device,
    ("torch._utils", "_rebuild_device_tensor_from_numpy"): _g_rebuild_device,
    ("torch._tensor", "_rebuild_from_type_v2"): _g_rebuild_from_type,
    ("numpy.core.multiarray", "scalar"): _g_numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _g_numpy_scalar,
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: BinaryIO, session: _Session) -> None:
        super().__init__(file, encoding="utf-8", errors="backslashreplace")
        self._session = session

    def find_class(self, module: str, name: str) -> Any:  # never imports
        return self._session.find_class(str(module), str(name))

    def persistent_load(self, pid: Any) -> Any:  # never loads
        return self._session.persistent_load(pid)


def load(file: BinaryIO, *, what: str = "pickle") -> PickleResult:
    """Read one pickle from ``file`` (left just after its STOP opcode) without importing or running code.

    Raises :class:`CorruptError` (one line, naming ``what``) when the bytes are not a complete pickle.
    """
    session = _Session()
    try:
        obj = _Unpickler(file, session).load()
    except EOFError:
        raise CorruptError(f"{what} is truncated") from None
    except Exception as err:  # whatever the bytes make the unpickler raise, the file is unreadable
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise CorruptError(f"{what} cannot be read: {detail}") from None
    names = tuple(f"{m}.{n}" for m, n in session.names)
    return PickleResult(obj, session.findings(), names, tuple(session.storages.values()))


def loads(data: bytes, *, what: str = "pickle") -> PickleResult:
    """Like :func:`load`, from bytes."""
    return load(io.BytesIO(data), what=what)


def global_name(obj: Any) -> str:
    """``module.name`` for a placeholder type, an :class:`Opaque` record or any other object's type."""
    if isinstance(obj, type) and issubclass(obj, _Placeholder):
        return f"{obj._g_module}.{obj._g_name}"
    if isinstance(obj, Opaque):
        return obj.qualname
    return type(obj).__name__


def walk(obj: Any) -> Iterator[Any]:
    """Every object reachable from ``obj`` through containers and records, each once (cycles are fine)."""
    seen: set[int] = set()
    stack = [obj]
    while stack:
        node = stack.pop()
        if id(node) in seen or isinstance(node, _PLAIN):
            continue
        seen.add(id(node))
        yield node
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend(node)
        elif isinstance(node, Opaque):
            stack.extend((node.args, node.kwargs, node.state, node.items, node.dict_items))
        elif isinstance(node, TensorInfo):
            stack.append(node.state)
