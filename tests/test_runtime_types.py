"""envvault.runtime_types: the NamedTuple and Protocol envvault's modules use at run time instead of typing's
(docs/architecture.md, "Start-up"), and the commands measured from the shell importing no ``typing``."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
import typing

import pytest

from envvault.runtime_types import NamedTuple, Protocol
from fixtures import catalogue as C
from fixtures import uv_install
from tests.evtools import ev_env


def _point(name: str, base):
    """The same class declared on ``base`` (envvault's NamedTuple or typing's), named ``name`` at module level."""

    class Point(base):
        """A point."""

        x: int
        y: str = "b"
        z: tuple = ()

        @property
        def both(self) -> str:
            return f"{self.x}{self.y}"

        @classmethod
        def origin(cls):
            return cls(0)

    Point.__name__ = Point.__qualname__ = name
    return Point


Light = _point("Light", NamedTuple)
Heavy = _point("Heavy", typing.NamedTuple)


def test_a_named_tuple_behaves_as_typings():
    for cls in (Light, Heavy):
        p = cls(1, "a")
        assert p == (1, "a", ()) and isinstance(p, tuple)
        assert p.both == "1a" and cls.origin() == (0, "b", ())
        assert p._replace(y="c") == cls(1, "c") and type(p._replace(y="c")) is cls
        assert p._asdict() == {"x": 1, "y": "a", "z": ()}
        assert cls._fields == ("x", "y", "z") and cls._field_defaults == {"y": "b", "z": ()}
        assert repr(p) == f"{cls.__name__}(x=1, y='a', z=())"
        assert cls.__doc__ == "A point." and cls.__module__ == __name__
        assert pickle.loads(pickle.dumps(p)) == p
        assert list(cls.__annotations__) == ["x", "y", "z"]
        with pytest.raises(TypeError):
            cls()  # x has no default
        with pytest.raises(AttributeError):
            p.x = 2  # immutable, as a tuple
        with pytest.raises(AttributeError):
            p.other = 1  # no instance dict


def test_a_field_without_a_default_after_one_with_a_default_is_refused():
    with pytest.raises(TypeError, match="without a default follows"):
        class Bad(NamedTuple):
            a: int = 1
            b: int


def test_a_protocol_is_a_plain_base():
    class Sink(Protocol):
        def update(self, n: int) -> None: ...

    class Mine(Sink):
        def update(self, n: int) -> None:
            self.n = n

    m = Mine()
    m.update(3)
    assert m.n == 3 and Sink.__mro__ == (Sink, Protocol, object)


@pytest.mark.parametrize("args", [("snap", "--no-caches"), ("snap", "--lock-only"), ("status", "--exit-code")])
def test_the_commands_measured_from_the_shell_import_no_typing(tmp_path, make_venv, wheelhouse, args):
    """An unchanged second snap, a lock-only snap and the quick status import no ``typing`` (``click``
    would: those commands never import it either)."""
    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]), str(wheelhouse[C.NS_ALPHA]))
    vault = tmp_path / "vault"
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('typing' in sys.modules, 'click' in sys.modules))\n"
             "from envvault.entry import main\n"
             "sys.argv = ['envvault', *sys.argv[1:]]\n"
             "main()\n")

    def run(*argv: str) -> str:
        proc = subprocess.run([sys.executable, "-c", probe, argv[0], "--venv", str(venv), *argv[1:]],
                              capture_output=True, text=True, env=ev_env(vault), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    assert run("snap", "--no-caches") == "True False"  # the first snap reads and stores every file
    run(*args)  # a first lock-only snap reads every dist-info
    assert run(*args) == "False False"


# Run as ``python -c``: the modules that import ``typing`` or ``click`` first, found from the import's frames.
_IMPORTERS = """import sys
importers = set()
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name in ("typing", "click"):
            f = sys._getframe(1)
            while f is not None and f.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
                f = f.f_back
            importers.add(name + " from " + (f.f_globals.get("__name__", "?") if f is not None else "?"))
        return None
sys.meta_path.insert(0, Spy())
import atexit
atexit.register(lambda: print(sorted(importers)))
from envvault.entry import main
sys.argv = ["envvault", *sys.argv[1:]]
main()
"""


def test_a_compile_cache_restore_imports_no_typing(tmp_path):
    """The compile cache restore, measured from the shell beside ``zstd -dc | tar -x``, imports neither
    ``typing`` nor ``click`` from envvault's own modules (on Python 3.11, zstandard imports ``typing``)."""
    cache = tmp_path / "cache"
    (cache / "fxgraph" / "ab").mkdir(parents=True)
    (cache / "fxgraph" / "ab" / "entry").write_bytes(b"graph" * 100)
    vault = tmp_path / "vault"
    subprocess.run([sys.executable, "-m", "envvault", "cache", "snap", "--no-discover", "--cache-dir", str(cache)],
                   check=True, capture_output=True, env=ev_env(vault), timeout=300)
    proc = subprocess.run([sys.executable, "-c", _IMPORTERS, "cache", "restore", "--to", str(tmp_path / "restored")],
                          capture_output=True, text=True, env=ev_env(vault), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    importers = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert [i for i in importers if " from envvault" in i or i.startswith("click")] == []
    assert (tmp_path / "restored" / "fxgraph" / "ab" / "entry").read_bytes() == b"graph" * 100


def test_a_named_tuple_with_lazy_annotations_is_refused_not_made_empty():
    """Python 3.14 puts ``__annotate__`` in a class body written without ``from __future__ import
    annotations``: the fields would be lost, so the class is refused (simulated here: no 3.14 on this machine)."""
    maker = type(NamedTuple)
    with pytest.raises(TypeError, match="from __future__ import annotations"):
        maker("Lazy", (NamedTuple,), {"__module__": __name__, "__qualname__": "Lazy", "__annotate__": lambda f: {}})
