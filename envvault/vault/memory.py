"""MemoryBackend: a vault's objects in a dict, for tests. It keeps the whole contract of ``backend.py``
(atomic saves, exclusive create, ranges, limits, locks) so a test over it proves the vault uses nothing else."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from envvault.errors import CorruptError
from envvault.vault.backend import DEFAULT_LIMIT, Missing, ObjectInfo, check_kind, check_name

__all__ = ["MemoryBackend"]


class MemoryBackend:
    def __init__(self, location: str = "memory:"):
        self.location = location
        self.objects: dict[tuple[str, str], bytes] = {}
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._holders: dict[str, int] = {}  # lock name -> readers (> 0) or -1 for a writer

    def _key(self, kind: str, name: str) -> tuple[str, str]:
        return check_kind(kind), check_name(name)

    def where(self, kind: str, name: str) -> str:
        return f"{self.location}{kind}/{name}"

    def save(self, kind: str, name: str, data: bytes, *, exclusive: bool = False) -> bool:
        key = self._key(kind, name)
        with self._mutex:
            if exclusive and key in self.objects:
                return False
            self.objects[key] = bytes(data)
        return True

    def save_file(self, kind: str, name: str, local_path: Path) -> None:
        data = Path(local_path).read_bytes()
        self.save(kind, name, data)
        Path(local_path).unlink()

    def load(self, kind: str, name: str, offset: int = 0, length: int | None = None, *,
             limit: int = DEFAULT_LIMIT) -> bytes:
        key = self._key(kind, name)
        data = self.objects.get(key)
        if data is None:
            raise Missing(f"{kind} {name} not found in {self.location}")
        if length is None:
            if len(data) > limit:
                raise CorruptError(f"{self.where(kind, name)} is {len(data)} bytes, over the limit of {limit}")
            return data[offset:]
        return data[offset: offset + length]

    def stat(self, kind: str, name: str) -> ObjectInfo:
        data = self.objects.get(self._key(kind, name))
        if data is None:
            raise Missing(f"{kind} {name} not found in {self.location}")
        return ObjectInfo(name, len(data))

    def list(self, kind: str) -> list[str]:
        check_kind(kind)
        with self._mutex:
            return [n for k, n in self.objects if k == kind]

    def remove(self, kind: str, name: str) -> bool:
        with self._mutex:
            return self.objects.pop(self._key(kind, name), None) is not None

    @contextmanager
    def lock(self, name: str, *, exclusive: bool, wait: bool = True) -> Iterator[bool]:
        self._key("locks", name)
        with self._cond:
            while not self._free(name, exclusive):
                if not wait:
                    break
                self._cond.wait()
            held = self._free(name, exclusive)
            if held:
                self._holders[name] = -1 if exclusive else self._holders.get(name, 0) + 1
        if not held:
            yield False
            return
        try:
            yield True
        finally:
            with self._cond:
                self._holders[name] = 0 if exclusive else self._holders[name] - 1
                self._cond.notify_all()

    def _free(self, name: str, exclusive: bool) -> bool:
        n = self._holders.get(name, 0)
        return n == 0 if exclusive else n >= 0
