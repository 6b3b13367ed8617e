"""Frozen, typed records: ``dataclass``, ``field``, ``fields`` and ``replace``, as the standard library's
``dataclasses`` has them, made at a fraction of its import cost. Every record type of envvault is declared
with them.

``dataclasses.dataclass`` compiles six methods a frozen class (``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, ``__setattr__``, ``__delattr__``) from generated source, and importing ``dataclasses`` imports
``inspect`` (with ``ast``, ``dis`` and ``tokenize``): together 10-19 ms of every command that writes a snapshot
(18 classes on its path; docs/benchmarks.md, twelfth session), before it does any work. Here ``__init__`` is
compiled from one small source (the same parameters, defaults, default factories and keyword-only rule as
the standard one's), the other methods are closures that do what the generated ones do, and ``slots=True``
remakes the class with ``__slots__`` as the standard decorator does. What is not offered is refused, not
approximated: ``InitVar`` and ``ClassVar`` fields, ``order``, ``unsafe_hash``. ``tests/test_records_decorator.py``
declares each shape with both decorators and checks that they behave alike.
"""

from __future__ import annotations

from operator import attrgetter

__all__ = ["dataclass", "field", "fields", "replace", "Field", "FrozenInstanceError", "MISSING"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()  # no default given


class FrozenInstanceError(AttributeError):
    """An assignment to, or deletion of, a field of a frozen record (as ``dataclasses.FrozenInstanceError``)."""


class _HasFactory:
    """The default of an ``__init__`` parameter whose field has a ``default_factory``."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _HasFactory()
_FIELDS = "__record_fields__"  # the class attribute holding a record class's fields, inherited ones first


class Field:
    """One field of a record class (``dataclasses.Field``'s attributes that envvault uses)."""

    __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "hash", "compare", "kw_only",
                 "metadata")

    def __init__(self, default, default_factory, init, repr, hash, compare, kw_only, metadata):  # noqa: A002
        self.name: str = ""
        self.type = None
        self.default, self.default_factory = default, default_factory
        self.init, self.repr, self.hash, self.compare = init, repr, hash, compare
        self.kw_only, self.metadata = kw_only, metadata

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, init={self.init}, kw_only={self.kw_only})"


def field(*, default=MISSING, default_factory=MISSING, init: bool = True, repr: bool = True,  # noqa: A002
          hash: bool | None = None, compare: bool = True, kw_only=MISSING, metadata=None):  # noqa: A002
    """A field with options, as ``dataclasses.field``."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, init, repr, hash, compare, kw_only, metadata or {})


def fields(record) -> tuple[Field, ...]:
    """The fields of a record class or instance, in order (inherited first), as ``dataclasses.fields``."""
    try:
        return getattr(record, _FIELDS)
    except AttributeError:
        raise TypeError("must be called with a record class or instance") from None


def replace(record, /, **changes):
    """A copy of ``record`` with ``changes``, made through its ``__init__`` (as ``dataclasses.replace``)."""
    for f in fields(record):
        if not f.init:
            if f.name in changes:
                raise ValueError(f"field {f.name} is declared with init=False, it cannot be specified with replace()")
            continue
        if f.name not in changes:
            changes[f.name] = getattr(record, f.name)
    return record.__class__(**changes)


def dataclass(cls=None, /, *, init: bool = True, repr: bool = True, eq: bool = True,  # noqa: A002
              frozen: bool = False, slots: bool = False, kw_only: bool = False):
    """A record class from ``cls``, with ``dataclasses.dataclass``'s meaning of each option."""

    def wrap(cls):
        return _make(cls, init=init, repr=repr, eq=eq, frozen=frozen, slots=slots, kw_only=kw_only)

    return wrap if cls is None else wrap(cls)


def _collect(cls, kw_only: bool) -> tuple[Field, ...]:
    """The fields of ``cls``: its bases' (a record base's, in order), then those its own annotations declare
    (a later one of the same name replacing an inherited one, in its place), with the class attributes
    set as dataclasses sets them (a default stays a class attribute; a ``field()`` is replaced by its
    default, or removed)."""
    found: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get(_FIELDS, ()):
            found[f.name] = f
    # The class's own annotations (3.10 on: never a base's; 3.14 evaluates them when asked, PEP 649).
    annotations = cls.__dict__.get("__annotations__")
    if annotations is None:
        annotations = getattr(cls, "__annotations__", None) or {}
    for name, value in cls.__dict__.items():
        if isinstance(value, Field) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    for name, kind in annotations.items():
        text = kind if isinstance(kind, str) else repr(kind)
        if "InitVar" in text or "ClassVar" in text:
            raise TypeError(f"{cls.__qualname__}.{name}: InitVar and ClassVar fields are not supported here")
        value = getattr(cls, name, MISSING)  # a default may come from a base, as in dataclasses
        f = value if isinstance(value, Field) else Field(value, MISSING, True, True, None, True, MISSING, {})
        f.name, f.type = name, kind
        if f.kw_only is MISSING:
            f.kw_only = kw_only
        if f.default is not MISSING and type(f.default).__hash__ is None:  # as dataclasses 3.11 on
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory")
        if isinstance(value, Field):
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        found[name] = f
    return tuple(found.values())


def _make(cls, *, init: bool, repr: bool, eq: bool, frozen: bool, slots: bool, kw_only: bool):  # noqa: A002
    own = dict(cls.__dict__)
    if frozen and ("__setattr__" in own or "__delattr__" in own):
        raise TypeError(f"cannot overwrite attribute __setattr__ or __delattr__ in class {cls.__name__}")
    for base in cls.__mro__[1:]:
        if _FIELDS in base.__dict__ and base.__dict__.get("__record_frozen__", False) != frozen:
            raise TypeError("cannot inherit a frozen record from a non-frozen one, or the other way round")
    class_hash = own.get("__hash__", MISSING)
    explicit_hash = not (class_hash is MISSING or (class_hash is None and "__eq__" in own))
    all_fields = _collect(cls, kw_only)
    positional = [f for f in all_fields if f.init and not f.kw_only]
    seen_default = False
    for f in positional:
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        if seen_default and not has_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        seen_default = seen_default or has_default
    klass = _with_slots(cls, all_fields) if slots else cls
    setattr(klass, _FIELDS, all_fields)
    klass.__record_frozen__ = frozen
    if "__match_args__" not in own:
        klass.__match_args__ = tuple(f.name for f in positional)
    if init and "__init__" not in own:
        klass.__init__ = _init_fn(klass, all_fields, frozen, slots)
    if repr and "__repr__" not in own:
        klass.__repr__ = _named(klass, _repr_fn(tuple(f.name for f in all_fields if f.repr)), "__repr__")
    if eq and "__eq__" not in own:
        klass.__eq__ = _named(klass, _eq_fn(_getter(tuple(f.name for f in all_fields if f.compare))), "__eq__")
    if eq and not explicit_hash:
        if frozen:
            hashed = tuple(f.name for f in all_fields if (f.compare if f.hash is None else f.hash))
            klass.__hash__ = _named(klass, _hash_fn(_getter(hashed)), "__hash__")
        else:
            klass.__hash__ = None
    if frozen:
        setter, deleter = _frozen_fns(klass, frozenset(f.name for f in all_fields))
        klass.__setattr__ = _named(klass, setter, "__setattr__")
        klass.__delattr__ = _named(klass, deleter, "__delattr__")
        if slots:  # a frozen slotted instance cannot take its state back through __setattr__
            getstate, setstate = _state_fns(tuple(f.name for f in all_fields))
            if "__getstate__" not in own:
                klass.__getstate__ = getstate
            if "__setstate__" not in own:
                klass.__setstate__ = setstate
    return klass


def _with_slots(cls, all_fields: tuple[Field, ...]):
    """``cls`` made again with ``__slots__`` for its fields (those no base already has a slot for), as
    ``dataclasses`` does for ``slots=True``."""
    inherited: set[str] = set()
    for base in cls.__mro__[1:-1]:
        names = base.__dict__.get("__slots__", ())
        inherited.update((names,) if isinstance(names, str) else names)
    body = dict(cls.__dict__)
    body["__slots__"] = tuple(f.name for f in all_fields if f.name not in inherited)
    for f in all_fields:
        body.pop(f.name, None)
    body.pop("__dict__", None)
    body.pop("__weakref__", None)
    made = type(cls)(cls.__name__, cls.__bases__, body)
    made.__qualname__ = cls.__qualname__
    return made


def _named(klass, fn, name: str):
    fn.__name__, fn.__qualname__ = name, f"{klass.__qualname__}.{name}"
    return fn


def _getter(names: tuple[str, ...]):
    """A function from an instance to the tuple of its ``names`` fields (``attrgetter``: in C)."""
    if len(names) >= 2:
        return attrgetter(*names)
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda obj: (get(obj),)
    return lambda obj: ()


def _init_fn(klass, all_fields, frozen: bool, slots: bool):
    """``__init__`` as dataclasses generates it: init fields as parameters in order (keyword-only ones after
    ``*``), defaults and factories; a field with ``init=False`` set from its factory, or from its default in
    a slotted class (otherwise the class attribute answers for it); a frozen class's values set with
    ``object.__setattr__``; ``__post_init__`` called last when the class has one."""
    ns: dict = {"_ev_set": object.__setattr__, "_ev_factory": _FACTORY}
    params: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for i, f in enumerate(all_fields):
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
    fn = _named(klass, ns["__init__"], "__init__")
    fn.__annotations__ = {**{f.name: f.type for f in all_fields if f.init}, "return": None}
    return fn


def _repr_fn(names: tuple[str, ...]):
    def __repr__(self) -> str:
        return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    return __repr__


def _eq_fn(get):
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return get(self) == get(other)
        return NotImplemented

    return __eq__


def _hash_fn(get):
    def __hash__(self) -> int:
        return hash(get(self))

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

    return __setattr__, __delattr__


def _state_fns(names: tuple[str, ...]):
    def __getstate__(self):
        return [getattr(self, n) for n in names]

    def __setstate__(self, state):
        for n, value in zip(names, state):
            object.__setattr__(self, n, value)

    return __getstate__, __setstate__
