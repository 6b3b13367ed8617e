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

The only code that runs is this module's and its guards' (:mod:`envvault.torch._guards`); no module named
by the pickle is imported. The records themselves live in :mod:`envvault.torch.records`.
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
import reprlib
from dataclasses import dataclass
from typing import Any, BinaryIO

from envvault.errors import CorruptError
from envvault.torch._guards import GUARDS, Refused
from envvault.torch.records import (
    DTYPE_SIZES,
    Blocked,
    Opaque,
    Placeholder,
    StorageRef,
    StorageType,
    TensorInfo,
    TorchConst,
    global_name,
    walk,
)

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

# Tensor classes torch's own weights_only loader accepts: not worth listing among a pickle's globals.
_ALLOWED_CLASSES = {
    ("torch", "Tensor"), ("torch.nn.parameter", "Parameter"), ("torch.nn.parameter", "Buffer"),
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
    *(("torch.jit._pickle", n) for n in ("build_intlist", "build_doublelist", "build_boollist",
                                         "build_tensorlist", "build_tensor_from_id", "restore_type_tag")),
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
_DANGEROUS_PREFIXES = ("torch.hub", "torch.utils.cpp_extension", "torch.package", "torch.ops", "torch._ops",
                       "torch._dynamo", "numpy.f2py", "numpy.distutils", "numpy.testing")
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
class PickleResult:
    """The record tree, the findings in pickle order, every non-allow-listed global the pickle names, and
    the storages its persistent ids point at."""

    obj: Any
    findings: tuple[Blocked, ...]
    globals: tuple[str, ...]
    storages: tuple[StorageRef, ...] = ()


_REPR = reprlib.Repr()
_REPR.maxstring = 400  # findings show the whole command a payload would run
_REPR.maxother = 60
_REPR.maxlevel = 3


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
            self.types[key] = type("OpaqueGlobal", (Placeholder,), {
                "__slots__": (), "_g_module": module, "_g_name": name, "_g_session": self,
                "_g_danger": _is_dangerous(module, name), "_g_benign": key in _BENIGN_CALLS,
            })  # fmt: skip
        return self.types[key]

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        guard = GUARDS.get((module, name))
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
    return f"({text[:600]}{'...' if len(text) > 600 else ''})"


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _bind(guard: Any, session: _Session, module: str, name: str) -> Any:
    """A callable that runs ``guard`` and turns arguments it refuses into a recorded (unknown) call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return guard(session, *args, **kwargs)
        except (Refused, TypeError, ValueError, OverflowError):
            return session.make(Opaque, module, name, args, kwargs, called=True, danger=False)

    call.__qualname__ = call.__name__ = f"guarded {module}.{name}"
    return call


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
