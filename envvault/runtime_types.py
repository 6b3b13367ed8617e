"""``NamedTuple`` and ``Protocol`` at run time without importing ``typing``. The commands measured from the shell
(an unchanged snap, a lock-only snap, the quick ``status``) import no ``typing``: importing it, and making the
named tuples through it, was 5-6 ms of their 20-30 ms of imports on the 2-core machine
(bench/results/issue11_device.md). So the modules they import do not import ``typing`` at run time: each writes
``TYPE_CHECKING = False`` and imports what annotations name under ``if TYPE_CHECKING:`` (type checkers take
that name as typing's), and a module that declares a named tuple or a protocol writes::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple, Protocol
    else:
        from envvault.runtime_types import NamedTuple, Protocol

in a module that has ``from __future__ import annotations``, so a type checker sees typing's, and the running
program these: a ``class X(NamedTuple)`` with annotated
fields (defaults after the fields without one, methods, a docstring) becomes the ``collections.namedtuple``
that ``typing.NamedTuple`` would make; a ``class X(Protocol)`` is a plain class (nothing checks a protocol at
run time here).
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["NamedTuple", "Protocol"]

_OWN = ("__module__", "__qualname__", "__annotations__")


class _NamedTupleMaker(type):
    def __new__(mcls, name, bases, ns):
        if ns.get("__module__") == __name__:  # the base itself
            return super().__new__(mcls, name, bases, ns)
        if "__annotations__" not in ns and "__annotate__" in ns:  # Python 3.14's lazy annotations (PEP 649)
            raise TypeError(f"{name}: declare it in a module with `from __future__ import annotations`")
        fields = list(ns.get("__annotations__", {}))
        defaults = [ns[f] for f in fields if f in ns]
        if any(f not in ns for f in fields[len(fields) - len(defaults):]):
            raise TypeError(f"{name}: a field without a default follows one with a default")
        made = namedtuple(name, fields, defaults=defaults, module=ns.get("__module__"))
        for key, value in ns.items():  # methods, properties, the docstring: as typing.NamedTuple sets them
            if key not in fields and key not in _OWN:
                setattr(made, key, value)
        made.__qualname__ = ns.get("__qualname__", name)
        made.__annotations__ = dict(ns.get("__annotations__", {}))
        return made


class NamedTuple(metaclass=_NamedTupleMaker):
    """Base of a named tuple declared with annotated fields, as ``typing.NamedTuple`` (class syntax only)."""


class Protocol:
    """Base of a protocol class: a plain base at run time."""
