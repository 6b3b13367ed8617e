"""Plain-data views of the reader's record trees: JSON-able content and a tensor summary.

Both walk only what the pickle built (records, dicts, lists...), never call into it, and stay bounded on
hostile input: shared references are followed once per path, cycles are cut, depth and size are capped.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from envvault.model.records import dataclass, field
from typing import Any, Iterable

from envvault.torch.records import (
    LargeData,
    Opaque,
    StorageRef,
    StorageType,
    TensorInfo,
    TorchConst,
    global_name,
    walk,
)

__all__ = ["to_jsonable", "TensorSummary", "summarize"]

MAX_DEPTH = 100
MAX_NODES = 200_000  # values rendered (scalars included, deep ones weigh more): bounds the output
MAX_CHARS = 8_000_000  # characters of strings rendered, in all
_CUT = "…"  # marks a subtree left out because of a cycle or a limit


@dataclass(frozen=True)
class TensorSummary:
    """Tensors found, without reading their data.

    ``bytes`` counts each tensor's own extent; ``storage_bytes`` counts each storage the file holds once
    (views share storages, so ``storage_bytes`` is what the file's data records weigh).
    """

    count: int = 0
    elements: int = 0
    bytes: int = 0
    storage_bytes: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)

    def __add__(self, other: TensorSummary) -> TensorSummary:
        return TensorSummary(self.count + other.count, self.elements + other.elements,
                             self.bytes + other.bytes, self.storage_bytes + other.storage_bytes,
                             dict(Counter(self.dtypes) + Counter(other.dtypes)))

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "elements": self.elements, "bytes": self.bytes,
                "storage_bytes": self.storage_bytes, "dtypes": dict(sorted(self.dtypes.items()))}


def summarize(obj: Any, storages: Iterable[StorageRef] = (), *, storage_bytes: int | None = None) -> TensorSummary:
    """Count the :class:`TensorInfo` records reachable from ``obj`` (sparse/nested wrappers count through
    their parts). ``storage_bytes`` defaults to the sum over ``storages``."""
    count = elements = nbytes = 0
    dtypes: Counter[str] = Counter()
    for node in walk(obj):
        if isinstance(node, TensorInfo) and node.kind not in ("sparse", "nested"):
            count += 1
            elements += node.numel if node.shape is not None else 0
            nbytes += node.nbytes if node.shape is not None else 0
            dtypes[node.dtype] += 1
    if storage_bytes is None:
        storage_bytes = sum(s.nbytes for s in storages)
    return TensorSummary(count, elements, nbytes, storage_bytes, dict(dtypes))


def to_jsonable(obj: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
                max_chars: int = MAX_CHARS, budget: list[int] | None = None) -> Any:
    """Plain data for ``obj`` that ``json.dumps`` accepts, with records rendered as small dicts.

    Tensors become ``{"tensor": [shape], "dtype": "float32"}`` (plus ``"kind"`` for parameters and
    other kinds, ``"device"`` when not CPU); objects of classes the reader did not import become
    ``{"object": "module.Class", "args": [...], "state": ...}``; blocked or unknown calls become
    ``{"call": "os.system", "args": [...], "blocked": true}``; bytes become ``{"bytes": length}`` (and
    payloads the reader skipped ``{"bytes": length}`` or ``{"str": length}``). Dict keys become strings.
    Cycles and anything past ``max_depth`` becomes ``"…"``; past ``max_nodes`` values or ``max_chars``
    characters of strings, containers end with ``"…"`` and strings are cut, ending in ``"…"``: the result
    is bounded whatever the input shares or repeats.

    ``budget``, when given, is ``[nodes, chars]`` left, shared by several calls (one folder's entries):
    it replaces ``max_nodes``/``max_chars`` and is spent in place.
    """
    if budget is None:
        budget = [max_nodes, max_chars]
    return _conv(obj, 0, set(), budget, max_depth)


def _conv(o: Any, depth: int, path: set[int], budget: list[int], max_depth: int) -> Any:
    budget[0] -= 1 + depth // 4  # deep values cost more: printed with indentation, they weigh more
    if o is None or isinstance(o, (bool, int)):
        return o
    if isinstance(o, str):
        return _clip(o, budget)
    if isinstance(o, float):
        return o if math.isfinite(o) else str(o)
    if budget[0] < 0 or depth >= max_depth or id(o) in path:
        return _CUT
    path.add(id(o))
    try:
        return _conv_node(o, lambda x: _conv(x, depth + 1, path, budget, max_depth), budget)
    finally:
        path.discard(id(o))


def _clip(text: str, budget: list[int]) -> str:
    budget[1] -= len(text)
    if budget[1] >= 0:
        return text
    keep = max(0, len(text) + budget[1])
    budget[1] = 0
    return text[:keep] + _CUT


def _items(values: Iterable[Any], conv: Any, budget: list[int]) -> list[Any]:
    out = []
    for v in values:
        if budget[0] <= 0:
            out.append(_CUT)
            break
        out.append(conv(v))
    return out


def _conv_node(o: Any, conv: Any, budget: list[int]) -> Any:
    if isinstance(o, TensorInfo):
        out: dict[str, Any] = {"tensor": list(o.shape) if o.shape is not None else None, "dtype": o.dtype}
        if o.kind != "tensor":
            out["kind"] = o.kind
        if o.device not in (None, "cpu"):
            out["device"] = o.device
        return out
    if isinstance(o, TorchConst):
        return o.text
    if isinstance(o, StorageType):
        return o.name
    if isinstance(o, StorageRef):
        return {"storage": o.numel, "dtype": o.dtype}
    if isinstance(o, dict):
        out = {}
        dups: dict[str, int] = {}  # key -> next suffix to try: linear, however many keys collide
        for k, v in o.items():
            if budget[0] <= 0:
                out[_CUT] = _CUT
                break
            key = _clip(_key(k, conv), budget)
            if key in out:
                n = dups.get(key, 2)
                while f"{key}#{n}" in out:
                    n += 1
                dups[key] = n + 1
                key = f"{key}#{n}"
            out[key] = conv(v)
        return out
    if isinstance(o, (list, tuple)):
        return _items(o, conv, budget)
    if isinstance(o, (set, frozenset)):
        # Sets have no order: sort the rendered elements (never repr(): it recurses without bound).
        return sorted(_items(o, conv, budget), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(o, (bytes, bytearray)):
        return {"bytes": len(o)}
    if isinstance(o, LargeData):
        return {"str" if o.kind == "str" else "bytes": o.size}
    if isinstance(o, complex):
        return {"complex": [conv(o.real), conv(o.imag)]}
    if isinstance(o, slice):
        return {"slice": [conv(o.start), conv(o.stop), conv(o.step)]}
    if isinstance(o, Opaque):
        return _conv_opaque(o, conv)
    if isinstance(o, type) or getattr(o, "__qualname__", "").startswith("guarded "):
        name = global_name(o) if isinstance(o, type) else o.__qualname__.removeprefix("guarded ")
        return {"global": name}
    return {"object": type(o).__name__}


def _conv_opaque(o: Opaque, conv: Any) -> Any:
    if o.name == "_reconstruct" and isinstance(o.state, tuple) and len(o.state) >= 3:  # numpy array
        dtype = o.state[2]
        code = dtype.args[0] if isinstance(dtype, Opaque) and dtype.args else None
        return {"ndarray": conv(o.state[1]), "dtype": conv(code)}
    if o.called and not o.benign:
        out: dict[str, Any] = {"call": o.qualname, "args": conv(o.args)}
        if o.kwargs:
            out["kwargs"] = conv(o.kwargs)
        out["blocked"] = True
        return out
    out = {"object": o.qualname}
    if o.args:
        out["args"] = conv(o.args)
    if o.kwargs:
        out["kwargs"] = conv(o.kwargs)
    if o.state is not None:
        out["state"] = conv(o.state)
    if o.items:
        out["items"] = conv(o.items)
    if o.dict_items:
        out["dict_items"] = conv(o.dict_items)  # (key, value) pairs: rendered as two-element lists
    return out


def _key(k: Any, conv: Any) -> str:
    if isinstance(k, str):
        return k
    if k is None or isinstance(k, (bool, int, float)):
        return json.dumps(k)
    if isinstance(k, (TensorInfo, Opaque)) or isinstance(k, type):
        return f"<{global_name(k) if not isinstance(k, TensorInfo) else k.kind}>"
    if isinstance(k, LargeData):
        return repr(k)
    return json.dumps(conv(k), sort_keys=True)
