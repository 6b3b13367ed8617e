"""envvault.model.records makes the classes dataclasses makes (issue 11: the same records without importing
dataclasses or compiling six methods a class). Each shape is declared twice, once with each decorator, and the
two must behave alike: construction and its errors, defaults and factories, repr, equality, hashing,
frozenness, fields and replace, pickling and copying."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys

import pytest

from envvault.model import records

SHAPES = {  # name: (decorator options, class body)
    "frozen_slots_kw": (dict(frozen=True, slots=True, kw_only=True),
                        "a: int\n    b: str = 'x'\n    c: tuple = ()\n    d: list = field(default_factory=list)\n"),
    "frozen_slots": (dict(frozen=True, slots=True), "path: str\n    algo: str | None\n    size: int | None = None\n"),
    "frozen": (dict(frozen=True), "a: int\n    b: dict = field(default_factory=dict, compare=False)\n"
                                  "    c: int = field(default=3, repr=False, hash=False)\n"),
    "plain": (dict(), "a: int\n    b: list = field(default_factory=list)\n"
                      "    c: int = field(default=0, init=False)\n    d: list = field(default_factory=list, init=False)\n"),
    "no_eq": (dict(eq=False), "a: int = 1\n"),
    "no_eq_repr": (dict(eq=False, repr=False), "a: int = 1\n"),
    "empty_frozen": (dict(frozen=True), "pass\n"),
    "one_field": (dict(frozen=True, slots=True), "a: int\n"),
    "field_named_self": (dict(frozen=True), "self: int\n    other: int = 2\n"),
}

# Picklable classes must live at module level: made once with each decorator, named by shape.
for _shape, (_opts, _body) in SHAPES.items():
    for _which, _mod in (("std", dataclasses), ("ours", records)):
        _dec, _name = _mod.dataclass, f"{_which}_{_shape}"
        _ns = {"field": _mod.field, "__name__": __name__}
        exec(f"class {_name}:\n    {_body}", _ns)  # noqa: S102
        _cls = _dec(**_opts)(_ns[_name])
        _cls.__module__, _cls.__qualname__ = __name__, _name
        globals()[_name] = _cls

ARGS = {
    "frozen_slots_kw": [dict(kw=dict(a=1)), dict(kw=dict(a=1, b="y", c=(1,), d=[2]))],
    "frozen_slots": [dict(args=("p", "sha256")), dict(args=("p",), kw=dict(algo=None, size=3))],
    "frozen": [dict(args=(1,)), dict(args=(1, {"k": 1}, 4))],
    "plain": [dict(args=(1,)), dict(kw=dict(a=2, b=[1]))],
    "no_eq": [dict(), dict(args=(5,))],
    "no_eq_repr": [dict()],
    "empty_frozen": [dict()],
    "one_field": [dict(args=(7,))],
    "field_named_self": [dict(args=(1,)), dict(kw=dict(self=1, other=5))],
}


def _pair(shape):
    return globals()[f"std_{shape}"], globals()[f"ours_{shape}"]


def _fields(obj):
    """The fields of either kind of record, by the function of its own module."""
    return records.fields(obj) if hasattr(obj, "__record_fields__") else dataclasses.fields(obj)


def _as_dict(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in _fields(obj)}


def _replace(obj, **changes):
    return (records.replace if hasattr(obj, "__record_fields__") else dataclasses.replace)(obj, **changes)


def _same_repr(ours, std) -> bool:
    """The reprs agree, but for the class name and the address of an object without a repr of its own."""
    import re

    def clean(obj):
        return re.sub(r"0x[0-9a-f]+", "0x", repr(obj)).replace("ours_", "").replace("std_", "")

    return clean(ours) == clean(std)


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the kind of error is what is compared
        return ("raised", type(e).__name__)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_shape_behaves_as_the_standard_dataclass(shape):
    std, ours = _pair(shape)
    assert [(f.name, f.init, f.repr, f.compare, f.hash, f.kw_only) for f in dataclasses.fields(std)] == [
        (f.name, f.init, f.repr, f.compare, f.hash, f.kw_only) for f in records.fields(ours)]
    assert ours.__match_args__ == std.__match_args__
    for call in ARGS[shape]:
        args, kw = call.get("args", ()), call.get("kw", {})
        s, o = std(*args, **kw), ours(*args, **kw)
        assert _same_repr(o, s)
        assert _as_dict(o) == _as_dict(s)
        assert (o == ours(*args, **kw)) == (s == std(*args, **kw))
        assert o != s  # another class: never equal
        assert _outcome(lambda: hash(o) == hash(ours(*args, **kw))) == _outcome(lambda: hash(s) == hash(std(*args, **kw)))
        for name in [f.name for f in dataclasses.fields(s)] + ["not_a_field"]:
            # (Python 3.11's slotted frozen class raises TypeError for a name that is no field; ours raises
            # FrozenInstanceError as for a field: both refuse)
            assert _outcome(lambda: setattr(o, name, 9))[0] == _outcome(lambda: setattr(s, name, 9))[0]
        o, s = ours(*args, **kw), std(*args, **kw)  # fresh: the assignments above may have landed
        for name in [f.name for f in dataclasses.fields(s)]:
            assert _outcome(lambda: delattr(o, name)) == _outcome(lambda: delattr(s, name))
        o, s = ours(*args, **kw), std(*args, **kw)
        o, s = ours(*args, **kw), std(*args, **kw)  # fresh again: some deletions above landed
        for made in (pickle.loads(pickle.dumps(o)), copy.deepcopy(o), copy.copy(o)):
            assert _as_dict(made) == _as_dict(o) and _same_repr(made, s)
        changes = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.init}
        assert _same_repr(_replace(o, **changes), _replace(s, **changes))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_bad_construction_fails_as_the_standard_dataclass_fails(shape):
    std, ours = _pair(shape)
    for args, kw in [((), {}), ((1, 2, 3, 4, 5), {}), ((), {"nope": 1}), ((1,), {"a": 1})]:
        assert _outcome(lambda: ours(*args, **kw))[0] == _outcome(lambda: std(*args, **kw))[0], (args, kw)


def test_factories_give_each_instance_its_own_value():
    a, b = records.dataclass(frozen=True)(_plain_factory_class())(), records.dataclass(frozen=True)(
        _plain_factory_class())()
    assert a.items == [] and a.items is not b.items


def _plain_factory_class():
    class C:
        items: list = records.field(default_factory=list)

    return C


def test_a_subclass_of_a_frozen_record_may_add_attributes_but_not_change_fields():
    @records.dataclass(frozen=True)
    class Base:
        a: int

    class Sub(Base):
        pass

    s = Sub(1)
    s.extra = 2  # a plain subclass has a __dict__: dataclasses lets it take other names
    assert s.extra == 2
    with pytest.raises(records.FrozenInstanceError):
        s.a = 3


def test_a_default_may_come_from_a_base_and_own_state_methods_are_kept():
    """(A second read's findings: dataclasses takes a re-annotated field's default from a base, and keeps a
    frozen slotted class's own __getstate__/__setstate__.)"""

    class Base:
        a = 5

    @records.dataclass
    class C(Base):
        a: int

    assert C().a == 5

    @records.dataclass(frozen=True, slots=True)
    class D:
        a: int

        def __getstate__(self):
            return ("mine", self.a)

        def __setstate__(self, state):
            object.__setattr__(self, "a", state[1])

    assert D(3).__getstate__() == ("mine", 3)
    assert copy.copy(D(3)).a == 3


def test_classvar_and_initvar_are_refused_not_mismade():
    class C:
        a: dataclasses.InitVar[int]

    with pytest.raises(TypeError, match="InitVar and ClassVar"):
        records.dataclass(C)


def test_what_the_standard_decorator_refuses_is_refused():
    def declare(body: str, **opts):
        ns = {"field": records.field}
        exec(f"class C:\n    {body}", ns)  # noqa: S102
        return records.dataclass(**opts)(ns["C"])

    with pytest.raises(ValueError, match="mutable default"):
        declare("a: list = []")
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        declare("a: int = 1\n    b: int")
    declare("a: int = 1\n    b: int", kw_only=True)  # keyword-only: any order
    with pytest.raises(ValueError, match="both default and default_factory"):
        records.field(default=1, default_factory=list)
    with pytest.raises(TypeError, match="cannot overwrite attribute __setattr__"):
        declare("a: int\n    def __setattr__(self, n, v): pass", frozen=True)
    with pytest.raises(ValueError, match="init=False"):
        records.replace(declare("a: int = field(default=0, init=False)")(), a=1)
    with pytest.raises(TypeError, match="record class or instance"):
        records.fields(object())
    with pytest.raises(ValueError, match="mutable default"):
        declare("a: bytearray = bytearray()")  # any unhashable default, as dataclasses 3.11 on
    with pytest.raises(TypeError, match="'b' is a field but has no type annotation"):
        declare("a: int = 0\n    b = field(default=1)")
    base = declare("a: int", frozen=True)
    with pytest.raises(TypeError, match="frozen record from a non-frozen one"):
        records.dataclass(type("D", (base,), {"__annotations__": {"b": "int"}, "b": 0}))


def test_no_module_of_envvault_uses_dataclasses():
    """One home for records: every class is made by envvault.model.records, and a command that writes a
    snapshot imports neither dataclasses nor inspect (what importing dataclasses costs)."""
    import pathlib
    import subprocess

    root = pathlib.Path(records.__file__).parents[1]
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if "import dataclasses" in p.read_text() or "from dataclasses" in p.read_text()]
    assert offenders == []
    probe = ("import sys, envvault.lean, envvault.commands.plain, envvault.snap.take, envvault.snap.scan, "
             "envvault.caches.snap, envvault.restore.baseline, envvault.env.probe, envvault.diff; "
             "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_record_class_costs_less_than_the_standard_one_to_make():
    """Not a timing test of the product: a count of what each decorator compiles (``exec`` calls)."""
    import builtins

    calls = {"n": 0}
    real_exec = builtins.exec

    def counting(*a, **k):
        calls["n"] += 1
        return real_exec(*a, **k)

    body = {"__annotations__": {f"f{i}": "int" for i in range(8)}, **{f"f{i}": 0 for i in range(8)}}
    counts = []
    for dec in (dataclasses.dataclass, records.dataclass):
        calls["n"] = 0
        builtins.exec = counting
        try:
            dec(frozen=True, slots=True, kw_only=True)(type("C", (), dict(body)))
        finally:
            builtins.exec = real_exec
        counts.append(calls["n"])
    std, ours = counts
    assert ours == 1 and ours <= std, counts  # one __init__ source (3.13's dataclasses batches its six in one)
