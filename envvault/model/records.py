"""``dataclass``: the standard library's decorator with the same options and the same classes, made at a
fraction of its import cost. Every record type of envvault is declared with it.

``dataclasses.dataclass`` compiles six methods a frozen class (``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, ``__setattr__``, ``__delattr__``) from generated source: about 0.6 ms a class, 10-19 ms of every
command that writes a snapshot (18 classes on its path; docs/benchmarks.md, twelfth session). Here the
standard decorator does what costs nothing (the fields, ``__slots__``, ``__match_args__``: it is called with
``init``, ``repr`` and ``eq`` off), ``__init__`` is compiled from one small source of our own (the same
parameters, defaults, default factories and keyword-only rule), and the other methods are closures that do
what the generated ones do: ``dataclasses.fields``, ``replace``, ``asdict``, pickling and copying work as on a
standard dataclass. ``InitVar`` and ``ClassVar`` fields are not supported (none is declared in envvault): a
class with one is refused, so nothing silently differs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, FrozenInstanceError, field
from operator import attrgetter

__all__ = ["dataclass", "field"]


class _HasFactory:
    """The default of an ``__init__`` parameter whose field has a ``default_factory`` (as in dataclasses)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _HasFactory()


def dataclass(cls=None, /, *, init: bool = True, repr: bool = True, eq: bool = True,  # noqa: A002
              frozen: bool = False, slots: bool = False, kw_only: bool = False):
    """``dataclasses.dataclass`` with these options (``order``, ``unsafe_hash``, ``match_args=False`` and
    ``weakref_slot`` are not offered: envvault uses none)."""

    def wrap(cls):
        return _make(cls, init=init, repr=repr, eq=eq, frozen=frozen, slots=slots, kw_only=kw_only)

    return wrap if cls is None else wrap(cls)


def _make(cls, *, init: bool, repr: bool, eq: bool, frozen: bool, slots: bool, kw_only: bool):  # noqa: A002
    own = dict(cls.__dict__)
    for name, kind in own.get("__annotations__", {}).items():
        if "InitVar" in str(kind) or "ClassVar" in str(kind):
            raise TypeError(f"{cls.__qualname__}.{name}: InitVar and ClassVar fields are not supported here")
    if frozen and ("__setattr__" in own or "__delattr__" in own):
        raise TypeError(f"cannot overwrite attribute __setattr__ or __delattr__ in class {cls.__name__}")
    class_hash = own.get("__hash__", MISSING)
    explicit_hash = not (class_hash is MISSING or (class_hash is None and "__eq__" in own))
    klass = dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=False, slots=slots,
                                  kw_only=kw_only)
    fields = dataclasses.fields(klass)
    if init and "__init__" not in own:
        klass.__init__ = _init_fn(klass, fields, frozen, slots)
        if not own.get("__doc__"):
            import inspect

            klass.__doc__ = klass.__name__ + str(inspect.signature(klass)).replace(" -> None", "")
    if repr and "__repr__" not in own:
        klass.__repr__ = _repr_fn(klass, tuple(f.name for f in fields if f.repr))
    compared = tuple(f.name for f in fields if f.compare)
    if eq and "__eq__" not in own:
        klass.__eq__ = _eq_fn(klass, _getter(compared))
    if eq and not explicit_hash:
        if frozen:
            hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
            klass.__hash__ = _hash_fn(klass, _getter(hashed))
        else:
            klass.__hash__ = None
    if frozen:
        names = frozenset(f.name for f in fields)
        klass.__setattr__, klass.__delattr__ = _frozen_fns(klass, names)
        if slots:  # a frozen slotted instance cannot take its state back through __setattr__ (as dataclasses)
            klass.__getstate__, klass.__setstate__ = _state_fns(tuple(f.name for f in fields))
    return klass


def _getter(names: tuple[str, ...]):
    """A function from an instance to the tuple of its ``names`` fields (``attrgetter``: in C)."""
    if len(names) >= 2:
        return attrgetter(*names)
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda obj: (get(obj),)
    return lambda obj: ()


def _init_fn(klass, fields, frozen: bool, slots: bool):
    """``__init__`` as dataclasses generates it: init fields as parameters in order (keyword-only ones after
    ``*``), defaults and factories; a field with ``init=False`` set from its factory, or from its default in
    a slotted class (otherwise the class attribute answers for it); a frozen class's values set with
    ``object.__setattr__``."""
    ns: dict = {"_ev_set": object.__setattr__, "_ev_factory": _FACTORY}
    params: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields):
        factory = f.default_factory is not MISSING
        if factory:
            ns[f"_ev_f{i}"] = f.default_factory
        if f.default is not MISSING:
            ns[f"_ev_d{i}"] = f.default
        if f.init:
            param = f"{f.name}=_ev_d{i}" if f.default is not MISSING else (
                f"{f.name}=_ev_factory" if factory else f.name)
            (keyword if f.kw_only else params).append(param)
            value = f"_ev_f{i}() if {f.name} is _ev_factory else {f.name}" if factory else f.name
        elif factory:
            value = f"_ev_f{i}()"
        elif f.default is not MISSING and slots:
            value = f"_ev_d{i}"
        else:
            continue
        body.append(f"_ev_set(_ev_self, {f.name!r}, {value})" if frozen else f"_ev_self.{f.name} = {value}")
    if hasattr(klass, "__post_init__"):
        body.append("_ev_self.__post_init__()")
    signature = ", ".join(["_ev_self", *params, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}):\n" + "".join(f" {line}\n" for line in body or ["pass"])
    exec(source, ns)  # noqa: S102 - our own source, built from the class's field names only
    fn = ns["__init__"]
    fn.__qualname__ = f"{klass.__qualname__}.__init__"
    fn.__annotations__ = {**{f.name: f.type for f in fields if f.init}, "return": None}
    return fn


def _repr_fn(klass, names: tuple[str, ...]):
    def __repr__(self) -> str:
        return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    __repr__.__qualname__ = f"{klass.__qualname__}.__repr__"
    return __repr__


def _eq_fn(klass, get):
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return get(self) == get(other)
        return NotImplemented

    __eq__.__qualname__ = f"{klass.__qualname__}.__eq__"
    return __eq__


def _hash_fn(klass, get):
    def __hash__(self) -> int:
        return hash(get(self))

    __hash__.__qualname__ = f"{klass.__qualname__}.__hash__"
    return __hash__


def _frozen_fns(klass, names: frozenset[str]):
    """``__setattr__`` and ``__delattr__`` of a frozen class, as dataclasses makes them: any name on the class
    itself, a field's name on a subclass, raises ``FrozenInstanceError``."""

    def __setattr__(self, name, value):
        if type(self) is klass or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(klass, self).__setattr__(name, value)

    def __delattr__(self, name):
        if type(self) is klass or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(klass, self).__delattr__(name)

    __setattr__.__qualname__ = f"{klass.__qualname__}.__setattr__"
    __delattr__.__qualname__ = f"{klass.__qualname__}.__delattr__"
    return __setattr__, __delattr__


def _state_fns(names: tuple[str, ...]):
    def __getstate__(self):
        return [getattr(self, n) for n in names]

    def __setstate__(self, state):
        for n, value in zip(names, state):
            object.__setattr__(self, n, value)

    return __getstate__, __setstate__
