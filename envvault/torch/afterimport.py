"""Running code once a module has been imported: how stamping wraps ``safetensors.torch`` and
``torch.distributed.checkpoint`` when a process imports them after ``enable()``.

A meta path finder that finds nothing itself: it lets the real finders find the module, then runs the
callbacks once the module has executed, and stays out of the way of every other import. A callback that
fails is reported through ``warn`` and never fails the import.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["AfterImport"]


class AfterImport:
    """A meta path finder that lets the real finders find a module, then runs callbacks once the module
    has executed. Finds nothing itself; stays out of the way of every other import."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self.warn = warn
        self.callbacks: dict[str, list[Callable[[Any], None]]] = {}
        self.busy: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.callbacks or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = next((s for s in (self._ask(f, name, path, target) for f in sys.meta_path if f is not self)
                         if s is not None), None)
        finally:
            self.busy.discard(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_fire(module):
            exec_module(module)
            self.fire(name, module)

        try:
            loader.exec_module = exec_then_fire  # this loader object serves this one module only
        except (AttributeError, TypeError):
            pass
        return spec

    @staticmethod
    def _ask(finder, name, path, target):
        find = getattr(finder, "find_spec", None)
        return find(name, path, target) if find is not None else None

    def fire(self, name: str, module: Any) -> None:
        for callback in self.callbacks.pop(name, ()):
            try:
                callback(module)
            except Exception as err:  # noqa: BLE001 - an import must never fail because of stamping
                self.warn(f"stamping not enabled for {name}: {type(err).__name__}: {err}")
        if not self.callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)

    def add(self, name: str, callback: Callable[[Any], None]) -> None:
        """Run ``callback(module)`` once module ``name`` has been imported: now if it already is."""
        module = sys.modules.get(name)
        if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
            try:
                callback(module)
            except Exception as err:  # noqa: BLE001
                self.warn(f"stamping not enabled for {name}: {type(err).__name__}: {err}")
            return
        self.callbacks.setdefault(name, []).append(callback)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def clear(self) -> None:
        """Forget every pending callback and leave ``sys.meta_path``."""
        self.callbacks.clear()
        if self in sys.meta_path:
            sys.meta_path.remove(self)
