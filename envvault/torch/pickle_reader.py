"""A restricted unpickler for checkpoint pickles: it builds an inert record tree and never imports or runs code.

``torch.load(weights_only=False)`` imports every global a pickle names and calls whatever the pickle says.
This reader resolves each global against a fixed table instead of importing it:

- tensor rebuild functions become placeholders that return :class:`TensorInfo` records, and storage
  persistent ids become :class:`StorageRef` records (tensor bytes are never read);
- dtypes, layouts and devices become :class:`TorchConst`, ``torch.Size`` a tuple, ``OrderedDict`` itself;
- ``set``, ``frozenset``, ``complex``, ``slice``, ``bytes``, ``bytearray`` and ``_codecs.encode`` run
  through guards that accept plain data only (no ``bytearray(10**12)``);
- the pickle is read by a bounded subclass of Python's own (pure-Python) unpickler: at most
  :data:`MAX_OPS` opcodes (so objects), :data:`MAX_BYTES` bytes, tuples nested :data:`MAX_NEST` deep
  (hashing a deeper one as a dict key would exhaust the C stack), integers of :data:`MAX_INT_BITS` bits,
  :data:`MAX_GLOBALS` distinct globals; strings and bytes over :data:`MAX_ITEM` bytes are skipped and
  stand in as :class:`LargeData`. Past a limit the read stops with one line (:class:`UsageError`);
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
import itertools
import pickle
import reprlib
import struct
from envvault.model.records import dataclass
from typing import Any, BinaryIO

from envvault.errors import CorruptError, UsageError
from envvault.torch._guards import GUARDS, Refused
from envvault.torch.records import (
    DTYPE_SIZES,
    Blocked,
    LargeData,
    Opaque,
    Placeholder,
    StorageRef,
    StorageType,
    TorchConst,
    global_name,
)

# The records it builds are envvault.torch.records'.
__all__ = ["PickleResult", "MAX_BYTES", "MAX_OPS", "load", "loads"]

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


# Reading limits (docs/format.md, threat model). A real torch.save of 12,000 tensors (a 4,000-layer model
# and its Adam state) is a 1.4 MB pickle of 500,000 opcodes: these leave room for twice that.
MAX_BYTES = 1 << 30  # bytes of one pickle stream read, payloads skipped over included
MAX_OPS = 1_000_000  # opcodes executed: each makes at most one object
MAX_ITEM = 1 << 20  # a str or bytes payload larger than this is skipped (a LargeData stands in)
MAX_KEPT = 64 << 20  # total str/bytes payload kept in memory; later ones are skipped too
MAX_LINE = 1 << 16  # one line of a text opcode (protocol 0/1 GLOBAL, INT, STRING...)
MAX_FRAME = 4 << 20  # one protocol-4 frame (the pickler makes them about 64 KiB)
MAX_NEST = 100  # tuples / frozensets inside tuples / frozensets
MAX_INT_BITS = 4096  # an integer of more bits ends the read (4096 bits: 1234 decimal digits)
MAX_GLOBALS = 10_000  # distinct module.name pairs
MAX_NAME = 256  # characters in a global's module or name
MAX_FINDINGS = 100  # findings listed; the rest are counted


@dataclass(frozen=True)
class PickleResult:
    """The record tree, the findings in pickle order (the first :data:`MAX_FINDINGS`; ``more_findings``
    counts the rest), every non-allow-listed global the pickle names, and the storages its persistent ids
    point at."""

    obj: Any
    findings: tuple[Blocked, ...]
    globals: tuple[str, ...]
    storages: tuple[StorageRef, ...] = ()
    more_findings: int = 0


class _BoundedRepr(reprlib.Repr):
    """reprlib's bounded repr, bounded for every type: what reprlib has no method for (an ``OrderedDict``,
    a record, anything a guard built) is never handed to ``builtins.repr``, which recurses through a
    container's whole contents (a 1 MiB file can hold a list whose full repr is a terabyte)."""

    def repr_instance(self, x: Any, level: int) -> str:
        name = type(x).__name__[: self.maxother]
        if isinstance(x, dict):
            return f"{name}({self.repr_dict(x, level)})"
        if isinstance(x, (list, tuple)):
            return f"{name}({self.repr_list(list(x[: self.maxlist + 1]), level)})"
        if isinstance(x, str):
            return self.repr_str(str.__str__(x), level)
        if isinstance(x, (bytes, bytearray)):
            return repr(bytes(x[: self.maxother])) + ("..." if len(x) > self.maxother else "")
        if x is None or type(x) in (bool, float, complex):
            return repr(x)
        if isinstance(x, type) or getattr(x, "__qualname__", "").startswith("guarded "):
            return global_name(x) if isinstance(x, type) else x.__qualname__.removeprefix("guarded ")
        if isinstance(x, Opaque):
            return f"<{x.qualname[: self.maxother]}>"
        if isinstance(x, LargeData):
            return repr(x)
        if isinstance(x, TorchConst):
            return x.text[: self.maxother]
        return f"<{name}>"

    # reprlib sorts a whole dict or set before it shows its first few items: a finding per call of one
    # shared million-key dict sorted it a hundred times. The first items in their own order instead.
    def repr_dict(self, x: Any, level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        pieces = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                  for k, v in itertools.islice(x.items(), self.maxdict)]
        return "{" + ", ".join(pieces + (["..."] if len(x) > self.maxdict else [])) + "}"

    def repr_set(self, x: Any, level: int) -> str:
        if not x:
            return "set()"
        return self._repr_iterable(list(itertools.islice(x, self.maxset + 1)), level, "{", "}", self.maxset)

    def repr_frozenset(self, x: Any, level: int) -> str:
        if not x:
            return "frozenset()"
        return self._repr_iterable(list(itertools.islice(x, self.maxfrozenset + 1)), level, "frozenset({", "})",
                                   self.maxfrozenset)


_REPR = _BoundedRepr()
_REPR.maxstring = 400  # findings show the whole command a payload would run
_REPR.maxother = 60
_REPR.maxlevel = 3
_MAX_CALL_TEXT = 600  # characters of a call's arguments shown in a finding
MAX_TEXT = 256  # characters kept of a storage key or location (torch writes "0", "cpu", "cuda:0")


class _Session:
    """State of one load: placeholder types, the records made, storages seen, non-allow-listed names."""

    def __init__(self) -> None:
        self.types: dict[tuple[str, str], type] = {}
        self.made: list[Opaque] = []
        self.names: dict[tuple[str, str], None] = {}
        self.storages: dict[str, StorageRef] = {}
        self.depths: dict[int, int] = {}
        self.keep: list[Any] = []

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
            if len(self.types) >= MAX_GLOBALS:
                raise _Limit(f"it names more than {MAX_GLOBALS} distinct globals")
            if key not in _ALLOWED_CLASSES:
                self.names[key] = None
            self.types[key] = type("OpaqueGlobal", (Placeholder,), {
                "__slots__": (), "_g_module": module, "_g_name": name, "_g_session": self,
                "_g_danger": _is_dangerous(module, name), "_g_benign": key in _BENIGN_CALLS,
            })  # fmt: skip
        return self.types[key]

    def find_class(self, module: str, name: str) -> Any:
        if len(module) > MAX_NAME or len(name) > MAX_NAME:
            raise _Limit(f"it names a global longer than {MAX_NAME} characters")
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
                numel = numel if type(numel) is int and 0 <= numel < 1 << 63 else 0
                self.storages[key] = StorageRef(key, dtype, _text(location), numel)
            return self.storages[key]
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] in ("module", b"module"):
            return pid[1]  # legacy torch.save(model): the class itself, with its source (ignored)
        # Unknown persistent ids stay inert data; torch.load would fail on them.
        return self.make(Opaque, "", "persistent_id", (pid,), {}, called=False, danger=False, benign=True)

    def nest(self, obj: Any) -> Any:
        """Record how deeply the new tuple or frozenset ``obj`` nests others; refuse past :data:`MAX_NEST`.
        (Hashing one as a dict key or set member recurses in C once per level.)"""
        depth = 1
        for e in obj:
            if type(e) is tuple or type(e) is frozenset:
                d = self.depths.get(id(e), 1) + 1
                if d > depth:
                    depth = d
        if depth > MAX_NEST:
            raise _Limit(f"it nests tuples more than {MAX_NEST} deep")
        if depth > 1:
            self.depths[id(obj)] = depth
            self.keep.append(obj)  # alive while its id is a key of depths
        return obj

    def findings(self, limit: int) -> tuple[tuple[Blocked, ...], int]:
        """The first ``limit`` findings and how many more there are."""
        out: list[Blocked] = []
        more = 0
        used: set[tuple[str, str]] = set()
        for rec in self.made:
            used.add((rec.module, rec.name))
            if rec.called and not rec.benign:
                if len(out) >= limit:
                    more += 1
                    continue
                out.append(Blocked(rec.module, rec.name, "call", _call_repr(rec.args, rec.kwargs),
                                   "danger" if rec.danger else "unknown"))
            elif rec.danger and not rec.called:
                if len(out) >= limit:
                    more += 1
                    continue
                out.append(Blocked(rec.module, rec.name, "instantiate"))
        for (module, name), cls in self.types.items():
            if cls._g_danger and (module, name) not in used:
                if len(out) >= limit:
                    more += 1
                    continue
                out.append(Blocked(module, name, "reference"))
        return tuple(out), more


def _call_repr(args: Any, kwargs: Any) -> str:
    """The arguments of a blocked call, bounded: each one through :data:`_REPR`, and no more of them than
    fill :data:`_MAX_CALL_TEXT` characters (a call may have a million arguments)."""
    parts: list[str] = []
    size = 0
    pairs = itertools.chain(((None, a) for a in (args if isinstance(args, tuple) else (args,))),
                            kwargs.items() if isinstance(kwargs, dict) else ())
    for k, v in pairs:
        part = _REPR.repr(v) if k is None else f"{_text(k, 60)}={_REPR.repr(v)}"
        parts.append(part)
        size += len(part) + 2
        if size > _MAX_CALL_TEXT:
            break
    text = ", ".join(parts)
    return f"({text[:_MAX_CALL_TEXT]}{'...' if len(text) > _MAX_CALL_TEXT else ''})"


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    """A str or bytes value the pickle built, cut to ``limit`` characters; anything else a placeholder
    (never ``str()`` of a pickle-built object: it can be a terabyte long)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value[:limit]).decode("ascii", "replace")
    if isinstance(value, str):
        return str.__str__(value[:limit])
    return "<not text>"


def _bind(guard: Any, session: _Session, module: str, name: str) -> Any:
    """A callable that runs ``guard`` and turns arguments it refuses into a recorded (unknown) call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return guard(session, *args, **kwargs)
        except (Refused, TypeError, ValueError, OverflowError):
            return session.make(Opaque, module, name, args, kwargs, called=True, danger=False)

    call.__qualname__ = call.__name__ = f"guarded {module}.{name}"
    return call


class _Limit(Exception):
    """The pickle goes past a reading limit; the message completes "pickle ... : <message>"."""


class _Lines:
    """The pickle's file as the unpickler sees it: ``read`` is the file's own (every size the pickle
    states is checked before a read, see ``_Reader``), ``readline`` stops at :data:`MAX_LINE` bytes."""

    def __init__(self, file: BinaryIO) -> None:
        self.read = file.read
        self._readline = file.readline

    def readline(self) -> bytes:
        line = self._readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise _Limit(f"it holds a text line longer than {MAX_LINE} bytes")
        return line


def _digits(line: bytes) -> bytes:
    if len(line) > MAX_INT_BITS // 3:
        raise _Limit(f"it holds an integer of more than {MAX_INT_BITS} bits")
    return line


class _Reader(pickle._Unpickler):
    """Python's own unpickler with every opcode counted and every size checked before it is allocated.

    The C unpickler cannot be bounded from outside (it hashes a 300,000-deep tuple used as a dict key
    until the C stack overflows, and sizes its memo by the largest index a pickle names), so this one runs
    the pure-Python implementation of the same opcodes (``pickle._Unpickler``), overriding only those
    that allocate by a size the pickle states or build nested tuples.
    """

    dispatch: dict[int, Any] = {}  # filled below: the base table, with this class's overrides

    def __init__(self, file: BinaryIO, session: _Session) -> None:
        super().__init__(_Lines(file), encoding="utf-8", errors="backslashreplace")
        self._session = session
        self._kept = self._payloads = 0

    def find_class(self, module: str, name: str) -> Any:  # never imports
        return self._session.find_class(str(module), str(name))

    def persistent_load(self, pid: Any) -> Any:  # never loads
        return self._session.persistent_load(pid)

    def load(self) -> Any:
        # pickle._Unpickler.load with an opcode budget (same private helpers as the standard library's).
        # Reads go straight to the file until a FRAME opcode (protocol 4+) switches them to the unframer.
        self._unframer = pickle._Unframer(self._file_read, self._file_readline)
        self.read, self.readline = self._file_read, self._file_readline
        self.metastack, self.stack, self.proto = [], [], 0
        self.append = self.stack.append
        dispatch = self.dispatch
        budget = MAX_OPS
        try:
            while True:
                key = self.read(1)
                if not key:
                    raise EOFError
                budget -= 1
                if budget < 0:
                    raise _Limit(f"it runs more than {MAX_OPS} opcodes")
                dispatch[key[0]](self)
        except pickle._Stop as stop:
            return stop.value

    # -- sizes stated by the pickle ------------------------------------------------------------------

    def _payload(self, n: int, kind: str) -> Any:
        if n < 0:
            raise pickle.UnpicklingError("negative length")
        self._payloads += n
        if self._payloads > MAX_BYTES:
            raise _Limit(f"its strings and bytes are larger than {MAX_BYTES >> 20} MiB")
        if n > MAX_ITEM or self._kept + n > MAX_KEPT:
            left = n
            while left:  # skipped in chunks: never held
                step = min(left, MAX_ITEM)
                if len(self.read(step)) < step:
                    raise EOFError
                left -= step
            return LargeData(kind, n)
        data = self.read(n)
        if len(data) < n:
            raise EOFError
        self._kept += n
        return data

    def _bytes(self, n: int) -> None:
        self.append(self._payload(n, "bytes"))

    def _text(self, n: int, *, legacy: bool = False) -> None:
        data = self._payload(n, "str")
        if isinstance(data, LargeData):
            self.append(data)
        elif legacy:
            self.append(self._decode_string(data))
        else:
            self.append(str(data, "utf-8", "surrogatepass"))

    def load_binbytes(self) -> None:
        self._bytes(struct.unpack("<I", self.read(4))[0])

    def load_binbytes8(self) -> None:
        self._bytes(struct.unpack("<Q", self.read(8))[0])

    def load_short_binbytes(self) -> None:
        self._bytes(self.read(1)[0])

    def load_bytearray8(self) -> None:
        data = self._payload(struct.unpack("<Q", self.read(8))[0], "bytearray")
        self.append(data if isinstance(data, LargeData) else bytearray(data))

    def load_binunicode(self) -> None:
        self._text(struct.unpack("<I", self.read(4))[0])

    def load_binunicode8(self) -> None:
        self._text(struct.unpack("<Q", self.read(8))[0])

    def load_short_binunicode(self) -> None:
        self._text(self.read(1)[0])

    def load_binstring(self) -> None:
        self._text(struct.unpack("<i", self.read(4))[0], legacy=True)

    def load_short_binstring(self) -> None:
        self._text(self.read(1)[0], legacy=True)

    def load_frame(self) -> None:
        size = struct.unpack("<Q", self.read(8))[0]
        if size > MAX_FRAME:
            raise _Limit(f"it holds a {size}-byte frame (over {MAX_FRAME >> 20} MiB)")
        self.read, self.readline = self._unframer.read, self._unframer.readline
        self.readinto = self._unframer.readinto
        self._unframer.load_frame(size)

    def load_long1(self) -> None:
        self._long(self.read(1)[0])

    def load_long4(self) -> None:
        self._long(struct.unpack("<i", self.read(4))[0])

    def _long(self, n: int) -> None:
        if n < 0:
            raise pickle.UnpicklingError("LONG pickle has negative byte count")
        if n * 8 > MAX_INT_BITS:
            raise _Limit(f"it holds an integer of more than {MAX_INT_BITS} bits")
        self.append(pickle.decode_long(self.read(n)))

    def load_long(self) -> None:
        val = _digits(self.readline()[:-1])
        self.append(int(val[:-1] if val.endswith(b"L") else val, 0))

    def load_int(self) -> None:
        data = _digits(self.readline())
        self.append(False if data == b"00\n" else True if data == b"01\n" else int(data, 0))

    def load_get(self) -> None:
        i = int(_digits(self.readline()[:-1]))
        if i not in self.memo:
            raise pickle.UnpicklingError(f"memo value not found at index {i}")
        self.append(self.memo[i])

    def load_put(self) -> None:
        i = int(_digits(self.readline()[:-1]))
        if i < 0:
            raise pickle.UnpicklingError("negative PUT argument")
        self.memo[i] = self.stack[-1]

    # -- nesting -----------------------------------------------------------------------------------

    def load_tuple(self) -> None:
        items = self.pop_mark()  # before self.append is looked up: pop_mark replaces it
        self.append(self._session.nest(tuple(items)))

    def load_tuple1(self) -> None:
        self.stack[-1] = self._session.nest((self.stack[-1],))

    def load_tuple2(self) -> None:
        self.stack[-2:] = [self._session.nest((self.stack[-2], self.stack[-1]))]

    def load_tuple3(self) -> None:
        self.stack[-3:] = [self._session.nest((self.stack[-3], self.stack[-2], self.stack[-1]))]

    def load_frozenset(self) -> None:
        items = self.pop_mark()
        self.append(self._session.nest(frozenset(items)))


_Reader.dispatch = {key: getattr(_Reader, func.__name__) for key, func in pickle._Unpickler.dispatch.items()}


def load(file: BinaryIO, *, what: str = "pickle") -> PickleResult:
    """Read one pickle from ``file`` (left just after its STOP opcode) without importing or running code.

    Raises :class:`CorruptError` (one line, naming ``what``) when the bytes are not a complete pickle, and
    :class:`UsageError` when they go past a reading limit (``MAX_*`` above).
    """
    session = _Session()
    try:
        obj = _Reader(file, session).load()
    except _Limit as err:
        raise UsageError(f"{what}: refusing to read this pickle: {err} (envvault's limit)") from None
    except EOFError:
        raise CorruptError(f"{what} is truncated") from None
    except RecursionError:  # not expected: nothing here recurses by the pickle's nesting
        raise UsageError(f"{what}: refusing to read this pickle: it nests too deeply") from None
    except Exception as err:  # whatever the bytes make the unpickler raise, the file is unreadable
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        raise CorruptError(f"{what} cannot be read: {detail}") from None
    names = tuple(f"{m}.{n}" for m, n in session.names)
    findings, more = session.findings(MAX_FINDINGS)
    return PickleResult(obj, findings, names, tuple(session.storages.values()), more)


def loads(data: bytes, *, what: str = "pickle") -> PickleResult:
    """Like :func:`load`, from bytes."""
    return load(io.BytesIO(data), what=what)
