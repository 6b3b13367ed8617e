"""The inert records the restricted pickle reader builds instead of real objects.

None of them can run code: the methods the unpickler may call on them (``__setstate__``, ``append``,
``extend``, ``add``, ``__setitem__``, ``__call__``) only record what they were given.
"""

from __future__ import annotations

from envvault.model.records import dataclass
from typing import Any, Iterator

__all__ = [
    "DTYPE_SIZES",
    "TorchConst",
    "StorageType",
    "StorageRef",
    "TensorInfo",
    "Opaque",
    "Placeholder",
    "Blocked",
    "LargeData",
    "MAX_DIMS",
    "valid_shape",
    "global_name",
    "walk",
]

MAX_DIMS = 64  # dimensions of a tensor shape a reader accepts
_MAX_DIM = (1 << 63) - 1  # torch sizes are int64

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


def valid_shape(value: Any) -> tuple[int, ...] | None:
    """``value`` as a tensor shape (or stride): a list or tuple of at most :data:`MAX_DIMS` ints in
    ``[0, 2**63)``; None for anything else. The one rule for shapes read from any checkpoint, so that
    element counts stay cheap to compute whatever a file claims."""
    if not isinstance(value, (list, tuple)) or len(value) > MAX_DIMS:
        return None
    if not all(type(d) is int and 0 <= d <= _MAX_DIM for d in value):
        return None
    return tuple(value)


class LargeData:
    """A str or bytes payload too large to keep (see ``pickle_reader.MAX_ITEM``): its kind and size."""

    __slots__ = ("kind", "size")

    def __init__(self, kind: str, size: int) -> None:
        self.kind, self.size = kind, size

    def __repr__(self) -> str:
        return f"<{self.kind} of {self.size} bytes, not read>"


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
        if self.shape is None:
            return 0
        n = 1
        for d in self.shape:  # () is a scalar: one element
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


class Placeholder(Opaque):
    """Base of the per-global placeholder types. Creating one (NEWOBJ) or calling it (REDUCE) records."""

    __slots__ = ()
    _g_module = _g_name = ""
    _g_session: Any  # the pickle_reader session that made this type
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
        if self.module in ("posix", "nt"):  # what os.system and friends pickle as
            target += f" (os.{self.name})"
        if self.severity == "danger":
            tail = "blocked, not run"
        else:
            tail = "not allow-listed with these arguments, not run"
        if self.action == "call":
            return f"pickle tries to call {target}{self.args} ({tail})"
        if self.action == "instantiate":
            return f"pickle tries to create an object of class {target} ({tail})"
        return f"pickle refers to {target} ({tail})"


_PLAIN = (str, bytes, int, float, bool, type(None))


def global_name(obj: Any) -> str:
    """``module.name`` for a placeholder type, an :class:`Opaque` record or any other object's type."""
    if isinstance(obj, type) and issubclass(obj, Placeholder):
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
