"""Snapshot heads shared through a bucket (docs/format.md, "Snapshot heads"): ``PREFIX/heads/<id>.json``
objects read by a new node so that it lists 1,000 snapshots from a few small requests, and written at exit by
a command that computed many heads. An optimisation: any failure leaves things as they were."""

from __future__ import annotations

import re
from typing import Any, Protocol

from envvault.errors import CorruptError, StorageError
from envvault.model.encoding import canonical_json, json_loads, object_id

__all__ = ["HeadShare", "KeyStore", "WRITE_MIN"]

# A command writes a heads object when it computed at least this many heads (the bundle threshold).
WRITE_MIN = 32
MERGE_MIN = 3  # ... or when it read at least this many heads objects
_LIMIT = 64 << 20  # one heads object, and all of them together: what lies beyond is computed from documents
_ID = re.compile(r"[0-9a-f]{64}").fullmatch


class KeyStore(Protocol):
    """What a heads share needs of ``S3Backend``: keys outside the kinds, and the node's object cache."""

    cache: Any

    def list(self, kind: str) -> list[str]: ...

    def list_keys(self, prefix: str) -> list[str]: ...

    def get_key(self, key: str, limit: int) -> bytes | None: ...

    def create_key(self, key: str, data: bytes) -> None: ...

    def delete_key(self, key: str) -> None: ...


class HeadShare:
    """The heads objects of one bucket vault, for one process."""

    def __init__(self, backend: KeyStore) -> None:
        self.backend = backend
        self._objects: dict[str, frozenset[str]] | None = None  # heads object id -> the snapshot ids it covers
        self._heads: dict[str, dict] = {}
        self._registered = False

    def _load(self) -> dict[str, dict]:
        """Every head the bucket's heads objects hold (each object checked against its id, cached per node)."""
        b = self.backend
        self._objects = {}
        out: dict[str, dict] = {}
        try:
            keys = b.list_keys("heads/")
        except StorageError:
            return out
        budget = _LIMIT
        for key in keys:
            name = key[len("heads/"):]
            if not name.endswith(".json") or not _ID(name[:-5]):
                continue
            hid = name[:-5]
            try:
                data = b.cache.read("heads", hid, 0, None, budget, hid) if b.cache is not None else None
                if data is None:
                    data = b.get_key(key, budget)
                    if data is None or len(data) > budget or object_id(data) != hid:
                        continue
                    if b.cache is not None:
                        b.cache.put_bytes("heads", hid, data)
                heads = json_loads(data).get("heads")
            except (StorageError, CorruptError, ValueError, AttributeError, OSError):
                continue
            if not isinstance(heads, dict):
                continue
            budget -= len(data)
            self._objects[hid] = frozenset(heads)
            out.update((sid, h) for sid, h in heads.items() if isinstance(h, dict) and _valid(h))
        return out

    def shared(self, ids: set[str]) -> dict[str, dict]:
        """The heads the bucket holds of ``ids`` (each parsed once to be kept; the caller parses it again into
        its record)."""
        return {sid: h for sid, h in self._load().items() if sid in ids}

    def remember(self, heads: dict[str, dict], computed: int) -> None:
        """The heads of every listed snapshot a listing has; when it computed ``WRITE_MIN`` or more, or read
        ``MERGE_MIN`` heads objects or more, they are written as one heads object as the process exits."""
        self._heads = heads
        # Many heads objects (writers that committed at once each left one): merge them for the next node.
        if (computed >= WRITE_MIN or len(self._objects or ()) >= MERGE_MIN) and not self._registered:
            import atexit

            self._registered = True
            atexit.register(self.write)

    def add(self, sid: str, head: dict) -> str | None:
        """A snapshot just committed: write one heads object of its head and every head the bucket's heads
        objects hold of a listed snapshot, then delete the objects read (each is covered, but for snapshots
        gc removed). The heads objects are read before the snapshots are listed, and each was written after
        its snapshots were committed: a head left out is one of a snapshot that is gone. Concurrent writers
        leave one object each, the next writer merges them. Any failure leaves things as they were."""
        try:
            existing = self._load()
            listed = set(self.backend.list("snapshots"))
        except (StorageError, OSError):
            return None
        heads = {k: v for k, v in existing.items() if k in listed}  # (``_load`` kept only heads that parse)
        heads[sid] = head
        self._heads = heads
        # Every object read goes: what it held and this one does not is gc'd or did not parse.
        read = frozenset().union(*(self._objects or {}).values())
        return self.write(gone=read - heads.keys())

    def write(self, gone: frozenset[str] = frozenset()) -> str | None:
        """Write one heads object of every remembered head; delete the heads objects it covers (leaving out
        ``gone``: ids no longer listed, or whose heads did not parse)."""
        b = self.backend
        if not self._heads:
            return None
        try:
            if self._objects is None:
                self._load()
            data = canonical_json({"format": 1, "heads": self._heads})
            hid = object_id(data)
            b.create_key(f"heads/{hid}.json", data)
            if b.cache is not None:  # this node's next snap or listing reads it from here
                b.cache.put_bytes("heads", hid, data)
            for old, covered in (self._objects or {}).items():
                if old != hid and covered - gone <= self._heads.keys():
                    b.delete_key(f"heads/{old}.json")
                    if b.cache is not None:
                        b.cache.discard("heads", old)
            return hid
        except (StorageError, OSError):
            return None


def _valid(head: dict) -> bool:
    from envvault.model.heads import parse_head

    try:
        parse_head(head)
        return True
    except CorruptError:
        return False
