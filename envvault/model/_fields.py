"""The small engine behind the records of model/: one table of keys per record, one parser, one writer.

A record is a frozen dataclass whose fields are the document keys readers use. Its table (``Key`` per
field) says the key's checker, whether it is required, and how a value converts between the document
(JSON: lists, objects) and the record (tuples, nested records). Parsing collects every problem with its
place instead of stopping at the first; writing gives the canonical dict back, exactly the keys the
document had: a known key the document lacked is left out again (``absent``), unknown keys come back from
``extra``. Pure: no I/O.
"""

from __future__ import annotations

import re
from envvault.model.records import dataclass
from collections.abc import Mapping

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Callable

    Rule = Callable[[Any], "str | None"]

from envvault.errors import CorruptError

__all__ = ["Key", "NO_EXTRA", "load_fields", "load_record", "record_loader", "dump_fields", "plain", "raise_problems", "is_id",
           "check_str", "check_opt_str", "check_int", "check_opt_int", "check_num", "check_bool", "check_hex_id",
           "check_opt_hex_id", "check_dict", "check_opt_dict", "check_str_list", "check_opt_str_list",
           "check_str_map", "check_list", "check_opt_list", "check_any"]

_ID = re.compile(r"[0-9a-f]{64}")


class _NoExtra(Mapping):
    """The ``extra`` of a record whose document had no unknown keys: empty, immutable, shared."""

    __slots__ = ()

    def __getitem__(self, key):
        raise KeyError(key)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "{}"


NO_EXTRA: Mapping[str, Any] = _NoExtra()


def is_id(value: Any) -> bool:
    """A full object or snapshot id: 64 lowercase hex digits."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


# -- checkers: each returns None when the value fits, else what was expected ---------------------------------

def check_any(v: Any) -> str | None:
    return None


def check_str(v: Any) -> str | None:
    return None if type(v) is str or isinstance(v, str) else "expected a string"


def check_opt_str(v: Any) -> str | None:
    return None if v is None or isinstance(v, str) else "expected a string or null"


def check_int(v: Any) -> str | None:
    return None if type(v) is int or isinstance(v, int) and not isinstance(v, bool) else "expected an integer"


def check_opt_int(v: Any) -> str | None:
    return None if v is None or isinstance(v, int) and not isinstance(v, bool) else "expected an integer or null"


def check_num(v: Any) -> str | None:
    return None if isinstance(v, (int, float)) and not isinstance(v, bool) else "expected a number"


def check_bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "expected true or false"


_ID_MATCH = _ID.fullmatch


def check_hex_id(v: Any) -> str | None:
    return None if type(v) is str and _ID_MATCH(v) is not None else "expected a 64-hex string"


def check_opt_hex_id(v: Any) -> str | None:
    return None if v is None or is_id(v) else "expected a 64-hex string or null"


def check_dict(v: Any) -> str | None:
    return None if isinstance(v, dict) else "expected an object"


def check_opt_dict(v: Any) -> str | None:
    return None if v is None or isinstance(v, dict) else "expected an object or null"


def check_list(v: Any) -> str | None:
    return None if isinstance(v, list) else "expected a list"


def check_opt_list(v: Any) -> str | None:
    return None if v is None or isinstance(v, list) else "expected a list or null"


def check_str_list(v: Any) -> str | None:
    if type(v) is list and (not v or all(type(x) is str for x in v)):
        return None
    return None if isinstance(v, list) and all(isinstance(x, str) for x in v) else "expected a list of strings"


def check_opt_str_list(v: Any) -> str | None:
    return None if v is None else check_str_list(v)


def check_str_map(v: Any) -> str | None:
    ok = isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
    return None if ok else "expected an object of strings"


# -- converting values -----------------------------------------------------------------------------------

def plain(value: Any) -> Any:
    """A JSON value as plain dicts and lists (records written with ``to_dict``, tuples as lists), copied so
    that a caller editing the result never edits a record. An object's keys must be strings (TypeError):
    JSON would write any other key as a string, so the document would not read back as what was built."""
    t = type(value)
    if t is str or t is int or t is float or t is bool or value is None:
        return value
    if t is dict:
        return {k if type(k) is str else _bad_key(k): plain(v) for k, v in value.items()}
    if t is tuple or t is list:
        return [plain(v) for v in value]
    to_dict = getattr(value, "to_dict", None)  # a record (asked first: a Mapping check is slow)
    if to_dict is not None:
        return to_dict()
    if isinstance(value, Mapping):
        return {k if type(k) is str else _bad_key(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _bad_key(k: Any) -> str:
    raise TypeError(f"a document's object key must be a string, not {type(k).__name__} {k!r}")


def strs(v: Any) -> tuple[str, ...]:
    return tuple(v)


def opt_strs(v: Any) -> tuple[str, ...] | None:
    return None if v is None else tuple(v)


@dataclass(frozen=True, slots=True)
class Key:
    """One document key of a record: ``name`` in the document, ``attr`` on the record (same unless given),
    ``check`` its checker, ``required``, ``default`` (the field's value when the key is absent or wrong),
    ``load`` turning a checked value into the field's (``(value, where, problems) -> field``; a nested
    record's parser). Written back with ``plain``."""

    name: str
    check: Rule = check_any
    required: bool = False
    default: Any = None
    load: Callable[[Any, str, list[str]], Any] | None = None
    attr: str = ""

    @property
    def field(self) -> str:
        return self.attr or self.name


def seq(fn: Callable[[Any], Any]) -> Callable[[Any, str, list[str]], Any]:
    """A ``load`` from a one-argument converter."""
    return lambda v, where, problems: fn(v)


STRS = seq(strs)
OPT_STRS = seq(opt_strs)


_PLANS: dict[int, tuple[tuple, frozenset[str]]] = {}


def _plan(keys: tuple[Key, ...]) -> tuple[tuple, frozenset[str]]:
    got = _PLANS.get(id(keys))
    if got is None:
        got = (tuple((k.name, k.field, k.check, k.required, k.default, k.load) for k in keys),
               frozenset(k.name for k in keys))
        _PLANS[id(keys)] = got
    return got


def load_fields(obj: Mapping[str, Any], keys: tuple[Key, ...], where: str,
                problems: list[str]) -> tuple[dict[str, Any], frozenset[str], dict[str, Any]]:
    """The record's keyword arguments from ``obj`` (every problem appended to ``problems`` with its place,
    ``where`` ending in ``.`` or empty), the known keys the document lacks, and its unknown keys."""
    plan, known = _plan(keys)
    kwargs: dict[str, Any] = {}
    absent = []
    for name, attr, check, required, default, load in plan:
        if name not in obj:
            if required:
                problems.append(f"{where}{name}: missing")
            absent.append(name)
            kwargs[attr] = default
            continue
        value = obj[name]
        why = check(value)
        if why:
            problems.append(f"{where}{name}: {why}")
            kwargs[attr] = default
            continue
        kwargs[attr] = load(value, where + name, problems) if load else value
    extra = {k: v for k, v in obj.items() if k not in known} if len(obj) > len(plan) - len(absent) else {}
    return kwargs, frozenset(absent) if absent else _NONE, extra


_NONE: frozenset[str] = frozenset()


def load_record(cls: Any, obj: Mapping[str, Any], where: str, problems: list[str]) -> Any:
    """A ``cls`` record (its ``KEYS`` table, ``extra``, ``absent``) read from ``obj`` by ``load_fields``."""
    kw, absent, extra = load_fields(obj, cls.KEYS, where, problems)
    return cls(**kw, extra=extra, absent=absent)


def record_loader(cls: Any) -> Callable[[Any, str, list[str]], Any]:
    """``parse(obj, where, problems)`` of ``cls`` records (``load_record``)."""
    return lambda obj, where, problems: load_record(cls, obj, where, problems)


def dump_fields(record: Any, keys: tuple[Key, ...]) -> dict[str, Any]:
    """The canonical dict of ``record``: its known keys (but those the parsed document lacked, while they
    still hold their default), then its unknown ones."""
    out: dict[str, Any] = {}
    absent = record.absent
    for name, attr, _check, _required, default, _load in _plan(keys)[0]:
        value = getattr(record, attr)
        if absent and name in absent and value == default:
            continue
        out[name] = plain(value)
    if record.extra:
        for k, v in record.extra.items():
            out.setdefault(k, plain(v))
    return out


def raise_problems(what: str, problems: list[str], shown: int = 5) -> None:
    """A CorruptError ``<what> is malformed (p1; p2; ...)`` naming the first ``shown`` problems, with every
    problem in its ``problems`` attribute; nothing when there are none."""
    if not problems:
        return
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    err = CorruptError(f"{what} is malformed ({'; '.join(problems[:shown])}{more})")
    err.problems = list(problems)  # type: ignore[attr-defined]
    raise err
