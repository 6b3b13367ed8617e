"""A second read of envvault.model.records against dataclasses: every record class of envvault compared with
the class dataclasses makes from the same source, the shapes envvault relies on (plain and decorated
subclasses, slotted frozen records with properties and class attributes, own ``__repr__``/``__setstate__``,
``cached_property``, ``match``), and guards on the few places where records knowingly differs from
dataclasses (none of which any envvault record reaches today)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
from functools import cached_property

import pytest

from envvault.model import records

ROOT = pathlib.Path(records.__file__).parents[2]

# Describes every record class of an envvault tree (fields, signature, hash/eq/setattr kind, slots, state
# functions, class attributes, MRO), importing every module of it; UserSiteDist is made on first use.
_DESCRIBE = r'''
import importlib, inspect, json, pkgutil, re, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import envvault
assert envvault.__file__.startswith(sys.argv[1]), envvault.__file__
mods = [importlib.import_module(m.name) for m in pkgutil.walk_packages(envvault.__path__, "envvault.")]
from envvault.env.dists import InstalledDist
from envvault.env import system
user = system._in_user_site(InstalledDist("a", "1", Path("/x/a-1.dist-info"), Path("/x"), None, True, {}, None,
                                          None), Path("/bin"))
classes = {id(c): c for m in mods for c in vars(m).values()
           if isinstance(c, type) and c.__module__.startswith("envvault")}
classes[id(type(user))] = type(user)
def r(v):
    s = "MISSING" if type(v).__name__ in ("_MISSING_TYPE", "_Missing") else repr(v)
    return re.sub(r" at 0x[0-9a-f]+", "", s)
def kind(fn):
    if fn is None: return "none"
    if fn in (object.__hash__, object.__eq__, object.__repr__, object.__setattr__): return "object"
    q = fn.__qualname__
    return "generated" if ("<locals>" in q or q.startswith("_dataclass")) else q
out = {}
for c in classes.values():
    if not any("__dataclass_fields__" in b.__dict__ or "__record_fields__" in b.__dict__ for b in c.__mro__):
        continue
    fs = list(c.__dataclass_fields__.values()) if hasattr(c, "__dataclass_fields__") else c.__record_fields__
    out[c.__module__ + "." + c.__qualname__] = {
        "fields": [(f.name, r(f.type), r(f.default), r(f.default_factory), f.init, f.repr, f.hash, f.compare,
                    f.kw_only) for f in fs],
        "match_args": getattr(c, "__match_args__", None),
        "init": re.sub(r" at 0x[0-9a-f]+", "", str(inspect.signature(c.__init__)).replace("_ev_self", "self")),
        "hash": kind(c.__hash__), "eq": kind(c.__eq__), "repr": kind(c.__repr__), "setattr": kind(c.__setattr__),
        "delattr": kind(c.__delattr__), "slots": c.__dict__.get("__slots__"), "dict": c.__dictoffset__ != 0,
        "weakref": c.__weakrefoffset__ != 0,
        "state": [kind(c.__dict__.get(n)) for n in ("__getstate__", "__setstate__")],
        "attrs": sorted((k, type(v).__name__) for k, v in c.__dict__.items()
                        if not (k.startswith("__") and k.endswith("__"))),
        "mro": [b.__qualname__ for b in c.__mro__],
    }
print(json.dumps(out, sort_keys=True, default=str))
'''


def _describe(tree: pathlib.Path) -> dict:
    done = subprocess.run([sys.executable, "-B", "-c", _DESCRIBE, str(tree)], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> tuple[dict, dict]:
    """(dataclasses' description, records' description) of every record class of envvault."""
    std_tree = tmp_path_factory.mktemp("std")
    shutil.copytree(ROOT / "envvault", std_tree / "envvault", ignore=shutil.ignore_patterns("__pycache__"))
    (std_tree / "envvault" / "model" / "records.py").write_text(
        "from dataclasses import dataclass, field, fields, replace, Field, FrozenInstanceError, MISSING\n")
    return _describe(std_tree), _describe(ROOT)


def test_every_envvault_record_class_is_the_class_dataclasses_makes_of_it(both):
    """All 80-odd classes (UserSiteDist and the plain subclasses SnapResult/CacheSnapResult included): same
    fields and options, __init__ signature, __match_args__, which of __hash__/__eq__/__repr__/__setattr__ are
    generated, None or inherited, slots, __dict__/__weakref__, pickling state functions, class attributes.
    (Only ``__doc__`` differs: dataclasses writes a signature into an undocumented class; envvault reads no
    record's ``__doc__``.) On Python 3.11+ this also proves no record has a default dataclasses refuses."""
    std, ours = both
    assert len(ours) >= 80
    assert sorted(std) == sorted(ours)
    differing = {name: sorted(k for k in std[name] if std[name][k] != ours[name][k]) for name in std}
    assert {name: keys for name, keys in differing.items() if keys} == {}


def test_no_record_reaches_a_place_where_records_knowingly_differs(both):
    """Guards on the gaps, on every Python: no default is unhashable (dataclasses 3.11+ refuses one, records
    only refuses list/dict/set), no slotted frozen record defines its own __getstate__/__setstate__ (records
    would replace them; dataclasses keeps them), no decorated subclass re-annotates an inherited field (records
    reads a default from the class's own namespace only, dataclasses through getattr)."""
    _, ours = both
    src = f"""
import sys, json
sys.path.insert(0, {str(ROOT)!r})
names = json.loads(sys.stdin.read())
import importlib
from envvault.model.records import fields, MISSING
bad = []
for qual in names:
    if "<locals>" in qual:
        continue
    mod, _, cls_name = qual.rpartition(".")
    cls = getattr(importlib.import_module(mod), cls_name)
    own = cls.__dict__.get("__record_fields__")
    for f in fields(cls):
        if f.default is not MISSING and type(f.default).__hash__ is None:
            bad.append((qual, f.name, "unhashable default"))
    if own is not None and cls.__dict__.get("__slots__") is not None and cls.__record_frozen__:
        for n in ("__getstate__", "__setstate__"):
            if "<locals>" not in cls.__dict__[n].__qualname__:
                bad.append((qual, n, "own state function"))
    if own is not None:
        inherited = {{f.name for b in cls.__mro__[1:] for f in b.__dict__.get("__record_fields__", ())}}
        again = inherited & set(cls.__dict__.get("__annotations__", {{}}))
        if again:
            bad.append((qual, sorted(again), "re-annotated"))
print(json.dumps(bad))
"""
    done = subprocess.run([sys.executable, "-B", "-c", src], input=json.dumps(sorted(ours)), capture_output=True,
                          text=True, check=True)
    assert json.loads(done.stdout) == []


# --- the shapes envvault relies on, declared with both decorators ---------------------------------------


def _both(build):
    return build(dataclasses), build(records)


def _committed(m):
    @m.dataclass(frozen=True)
    class Committed:
        id: str
        snapshot: str

        def to_json(self):
            return {"id": self.id, **self.extra_json()}

        def extra_json(self):
            return {}

    class SnapResult(Committed):
        def extra_json(self):
            return {"n": len(self.snapshot)}

    return SnapResult


@pytest.mark.parametrize("m", [dataclasses, records], ids=["std", "ours"])
def test_a_plain_subclass_of_a_frozen_record_as_snap_result(m):
    SnapResult = _committed(m)
    r = SnapResult("abc", "snap")
    assert repr(r) == "_committed.<locals>.SnapResult(id='abc', snapshot='snap')"
    assert r.to_json() == {"id": "abc", "n": 4}
    assert r == SnapResult("abc", "snap") and hash(r) == hash(SnapResult("abc", "snap"))
    assert r != SnapResult.__mro__[1]("abc", "snap")  # the base's instance: another class
    with pytest.raises(m.FrozenInstanceError):
        r.id = "x"
    r.note = 1  # a plain subclass has a __dict__ and takes other names
    for made in (copy.copy(r), copy.deepcopy(r)):
        assert made == r and made.note == 1
    assert [f.name for f in m.fields(r)] == ["id", "snapshot"]
    assert m.replace(r, id="d") == SnapResult("d", "snap")


def _dists(m):
    from pathlib import Path

    @m.dataclass
    class InstalledDist:
        name: str
        record: list | None
        scripts: set = m.field(default_factory=set)
        kind: str = "dist-info"

        @property
        def display(self):
            return f"{self.name}!"

        def layout(self, scripts_dir):
            return ("base", scripts_dir)

    @m.dataclass
    class UserSiteDist(InstalledDist):
        user_scripts: Path = Path("bin")

        def layout(self, scripts_dir):
            return InstalledDist.layout(self, self.user_scripts)

    return InstalledDist, UserSiteDist


def test_a_decorated_subclass_of_a_mutable_record_as_user_site_dist():
    (s_base, s_user), (o_base, o_user) = _both(_dists)
    for base, user, m in ((s_base, s_user, dataclasses), (o_base, o_user, records)):
        d = base("a", None)
        u = user(**{f.name: getattr(d, f.name) for f in m.fields(d)}, user_scripts="/u/bin")
        assert [f.name for f in m.fields(u)] == ["name", "record", "scripts", "kind", "user_scripts"]
        assert user.__match_args__ == ("name", "record", "scripts", "kind", "user_scripts")
        assert u.layout("ignored") == ("base", "/u/bin") and u.display == "a!"
        assert u.scripts == set() and user("b", None).scripts is not user("c", None).scripts
        assert user.__hash__ is None and base.__hash__ is None
        assert u == user("a", None, set(), "dist-info", "/u/bin") and u != d
        u.kind = "egg-info"  # not frozen
        assert m.replace(u, name="b").kind == "egg-info"
    assert repr(o_user("a", None)).split("(", 1)[1] == repr(s_user("a", None)).split("(", 1)[1]


def _keyed(m):
    @m.dataclass(frozen=True, slots=True, kw_only=True)
    class Entry:
        path: str
        sha256: str | None = None
        mode: int = m.field(default=0o644, repr=False)
        seen: tuple = m.field(default=(), compare=False)
        KEYS = ("path", "sha256")

        @property
        def stored(self):
            return self.sha256 is not None

        @classmethod
        def scanned(cls, path):
            return cls(path=path, sha256="0" * 64)

        @staticmethod
        def kind():
            return "file"

    return Entry


def test_a_slotted_frozen_keyword_record_with_members_and_class_attributes():
    std, ours = _both(_keyed)
    for cls in (std, ours):
        e = cls.scanned("p")
        assert e.stored and cls.kind() == "file" and cls.KEYS == ("path", "sha256")
        assert not hasattr(e, "__dict__") and "mode" in cls.__slots__
        assert e == cls(path="p", sha256="0" * 64, seen=(1,)) and hash(e) == hash(cls(path="p", sha256="0" * 64))
        with pytest.raises(TypeError):
            cls("p")  # keyword-only
        for made in (copy.copy(e), copy.deepcopy(e)):  # through __reduce_ex__ and the state functions
            assert made == e and made.mode == 0o644
        with pytest.raises(AttributeError):
            e.path = "q"
        with pytest.raises(AttributeError):
            del e.sha256
    assert repr(ours(path="p")).split("(", 1)[1] == repr(std(path="p")).split("(", 1)[1] == "path='p', sha256=None, seen=())"


def _torchish(m):
    @m.dataclass(frozen=True)
    class TorchConst:
        text: str

        def __setstate__(self, state):
            pass

    @m.dataclass(eq=False, repr=False)
    class TensorInfo:
        dtype: str
        state: object = None

        def __setstate__(self, state):
            self.state = state

        def __repr__(self):
            return f"<tensor {self.dtype}>"

    @m.dataclass(frozen=True)
    class Ref:
        id: str

        @cached_property
        def doc(self):
            return {"id": self.id}

    return TorchConst, TensorInfo, Ref


def test_own_setstate_and_repr_and_cached_property_are_kept():
    for TorchConst, TensorInfo, Ref in _both(_torchish):
        c = TorchConst("torch.float16")
        c.__setstate__({"x": 1})  # the unpickler's BUILD: ignored, not refused
        assert c.text == "torch.float16" and c == TorchConst("torch.float16")
        t = TensorInfo("f16")
        t.__setstate__("s")
        assert t.state == "s" and repr(t) == "<tensor f16>" and t != TensorInfo("f16", "s")
        assert TensorInfo.__hash__ is object.__hash__
        r = Ref("a")
        assert r.doc is r.doc and copy.deepcopy(r).doc == {"id": "a"}


def test_match_and_string_annotations_as_dataclasses():
    for m in (dataclasses, records):
        @m.dataclass(frozen=True, slots=True)
        class Row:
            path: str
            algo: str | None
            size: int | None = None

        assert [f.type for f in m.fields(Row)] == ["str", "str | None", "int | None"]
        assert Row.__init__.__annotations__ == {"path": "str", "algo": "str | None", "size": "int | None",
                                                "return": None}
        match Row("p", "sha256"):
            case Row(path, algo, size):
                got = (path, algo, size)
        assert got == ("p", "sha256", None)
