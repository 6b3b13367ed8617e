"""The only functions a pickle can make the restricted reader run: guards that accept plain data only.

Each guard takes the reader's session first, then the pickle's arguments. Arguments that are not plain data
raise :class:`Refused`; the reader then records the call instead of making it.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any

from envvault.torch.records import (
    Opaque,
    Placeholder,
    StorageRef,
    TensorInfo,
    TorchConst,
    global_name,
    valid_shape,
)

__all__ = ["GUARDS", "Refused"]


class Refused(Exception):
    """A guard saw arguments that are not plain data."""


def _plain_seq(value: Any) -> Any:
    if not isinstance(value, (list, tuple, set, frozenset, dict)):
        raise Refused(type(value).__name__)
    return value


def _ints(value: Any) -> tuple[int, ...]:
    shape = valid_shape(value)
    if shape is None:
        raise Refused("expected a shape: a few ints in [0, 2**63)")
    return shape


def _g_ordered_dict(s: Any, items: Any = ()) -> OrderedDict:
    return OrderedDict(_plain_seq(items))


def _g_dict(s: Any, items: Any = ()) -> dict:
    return dict(_plain_seq(items)) if not callable(items) else {}  # defaultdict(factory): factory dropped


def _g_set(s: Any, items: Any = ()) -> set:
    return set(_plain_seq(items))


def _g_frozenset(s: Any, items: Any = ()) -> frozenset:
    return s.nest(frozenset(_plain_seq(items)))  # nesting counted like tuples (hashing recurses)


def _g_complex(s: Any, real: Any = 0, imag: Any = 0) -> complex:
    if not all(isinstance(v, (int, float)) or (isinstance(v, str) and len(v) < 100) for v in (real, imag)):
        raise Refused("complex")
    return complex(real, imag) if not isinstance(real, str) else complex(real)


def _g_slice(s: Any, *args: Any) -> slice:
    if not all(a is None or type(a) is int for a in args):
        raise Refused("slice")  # slices hash their fields: no tuples inside
    return slice(*args)


def _g_bytes(s: Any, value: Any = b"", encoding: Any = None) -> bytes:
    if isinstance(value, str) and encoding in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        return value.encode(encoding)
    if isinstance(value, (bytes, bytearray)) or (isinstance(value, list) and all(
            isinstance(v, int) for v in value)):
        return bytes(value)
    raise Refused("bytes")  # bytes(int) would allocate whatever size the pickle asks for


def _g_bytearray(s: Any, value: Any = b"", encoding: Any = None) -> bytearray:
    return bytearray(_g_bytes(s, value, encoding))


def _g_encode(s: Any, text: Any, encoding: Any = "utf-8", errors: Any = "strict") -> bytes:
    return _g_bytes(s, text, encoding)


def _g_device(s: Any, kind: Any, index: Any = None) -> TorchConst:
    if not isinstance(kind, str) or not (index is None or isinstance(index, int)):
        raise Refused("device")
    return TorchConst(kind if index is None else f"{kind}:{index}")


def _g_size(s: Any, dims: Any = ()) -> tuple[int, ...]:
    return _ints(dims)


def _g_layout(s: Any, name: Any) -> TorchConst:
    if not isinstance(name, str):
        raise Refused("layout")
    return TorchConst(name)


def _g_reconstructor(s: Any, cls: Any, base: Any = None, state: Any = None) -> Any:
    if not (isinstance(cls, type) and issubclass(cls, Placeholder)):
        raise Refused("copyreg._reconstructor of a non-placeholder")
    return cls.__new__(cls, *(() if state is None else (state,)))


def _g_newobj(s: Any, cls: Any, *args: Any) -> Any:
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


def _g_rebuild_tensor(s: Any, storage: Any, offset: Any, size: Any, stride: Any) -> TensorInfo:
    return _tensor(storage, offset, size, stride)


def _g_rebuild_tensor_v2(s, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    return _tensor(storage, offset, size, stride, requires_grad)


def _g_rebuild_tensor_v3(s, storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    name = dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else None
    return _tensor(storage, offset, size, stride, requires_grad, dtype=name)


def _g_rebuild_parameter(s: Any, data: Any, requires_grad: Any = True, hooks: Any = None,
                         state: Any = None) -> Any:
    if isinstance(data, TensorInfo):
        data.kind, data.requires_grad = "parameter", requires_grad is True
        if state is not None:
            data.state = state
    return data


def _g_rebuild_qtensor(s, storage, offset, size, stride, qparams, requires_grad=False, hooks=None):
    return _tensor(storage, offset, size, stride, requires_grad, kind="qtensor")


def _g_rebuild_sparse(s: Any, layout: Any, data: Any) -> TensorInfo:
    parts = tuple(_plain_seq(data))
    size = next((p for p in reversed(parts) if isinstance(p, tuple)), None)
    values = next((p for p in reversed(parts) if isinstance(p, TensorInfo)), None)
    return TensorInfo(_ints(size) if size is not None else None, values.dtype if values else "unknown",
                      kind="sparse", state=parts)


def _g_rebuild_meta(s: Any, dtype: Any, size: Any, stride: Any, requires_grad: Any = False) -> TensorInfo:
    name = dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else "unknown"
    return TensorInfo(_ints(size), name, _ints(stride), device="meta", requires_grad=requires_grad is True,
                      kind="meta")


def _g_rebuild_nested(s: Any, buffer: Any, sizes: Any, strides: Any, offsets: Any) -> TensorInfo:
    dtype = buffer.dtype if isinstance(buffer, TensorInfo) else "unknown"
    return TensorInfo(None, dtype, kind="nested", state=(buffer, sizes, strides, offsets))


def _g_rebuild_wrapper(s, cls, dtype, size, stride, offset, layout, device, requires_grad):
    name = dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else "unknown"
    return TensorInfo(_ints(size), name, _ints(stride), device=getattr(device, "text", None),
                      kind=f"subclass:{global_name(cls)}")


def _g_rebuild_device(s: Any, data: Any, dtype: Any, device: Any, requires_grad: Any) -> TensorInfo:
    name = dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else "unknown"
    shape = data.shape if isinstance(data, TensorInfo) else None
    return TensorInfo(shape, name, device=getattr(device, "text", None), requires_grad=requires_grad is True,
                      state=data)


def _g_rebuild_from_type(s: Any, func: Any, new_type: Any, args: Any, state: Any) -> Any:
    # func can only be one of our own callables (pickle opcodes cannot make any other callable).
    if not (getattr(func, "__qualname__", "").startswith("guarded ") or isinstance(func, Opaque)
            or (isinstance(func, type) and issubclass(func, Placeholder))):
        raise Refused("_rebuild_from_type_v2")
    result = func(*_plain_seq(args))
    if isinstance(result, TensorInfo):
        cls = global_name(new_type)
        if cls not in ("torch.Tensor", "torch.nn.parameter.Parameter"):
            result.kind = f"subclass:{cls}"
        if state:
            result.state = state
    return result


def _g_numpy_scalar(s: Any, dtype: Any, raw: Any = None) -> Any:
    """A numpy scalar becomes a Python number when its dtype is a plain one; otherwise a record."""
    code = dtype.args[0] if isinstance(dtype, Opaque) and dtype.args and isinstance(dtype.args[0], str) else ""
    order = dtype.state[1] if isinstance(dtype, Opaque) and isinstance(dtype.state, tuple) else "<"
    fmt = {"f2": "e", "f4": "f", "f8": "d", "i1": "b", "i2": "h", "i4": "i", "i8": "q", "u1": "B",
           "u2": "H", "u4": "I", "u8": "Q", "b1": "?"}.get(code)
    if fmt is None or not isinstance(raw, bytes) or len(raw) != struct.calcsize(fmt):
        raise Refused("numpy scalar")
    return struct.unpack((">" if order == ">" else "<") + fmt, raw)[0]


GUARDS: dict[tuple[str, str], Any] = {
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
