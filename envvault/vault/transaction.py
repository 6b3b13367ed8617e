"""The one way objects and snapshots are written: lock -> pack writer -> flush or abort -> commit.

A snap (``snap.py``, ``caches/snap.py``) runs as::

    with snapshot_transaction(vault) as txn:          # the shared vault lock, a pack writer
        ... txn.writer.add(oid, data) / Ingester(txn.writer, vault.has) ...
        txn.flush()                                   # every object durable (packs, then their index files)
        doc = {..., "new_bytes": txn.written_bytes, "new_objects": txn.written_objects}
        sid = txn.commit(doc)                         # the snapshot file: the single commit point

An exception anywhere in the block aborts the writer (its unfinished pack's temp file is removed) and commits
nothing; packs already stored without a snapshot that references them are garbage for the next gc. gc, which
holds the exclusive lock itself and commits no snapshot, copies objects with :func:`pack_writing`.
"""

from __future__ import annotations

from contextlib import contextmanager
from envvault.model.records import dataclass
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)

from envvault.vault.packs import PackWriter

if TYPE_CHECKING:
    from typing import Any, Iterator
    from envvault.model.snapshot import Snapshot
    from envvault.vault.store import Vault

__all__ = ["Committed", "SnapshotTransaction", "snapshot_transaction", "pack_writing"]


@dataclass(frozen=True)
class Committed:
    """A snapshot a transaction committed: its id and the validated record. ``to_json`` gives what every
    snap's ``--json`` prints of it; a snap's own result adds its fields (``extra_json``)."""

    id: str
    snapshot: "Snapshot"

    def to_json(self) -> dict[str, Any]:
        s = self.snapshot
        return {"id": self.id, "short_id": self.id[:12], "created": s.created, "message": s.message,
                "venv": s.venv, **self.extra_json(), "new_bytes": s.stats.new_bytes,
                "new_objects": s.stats.new_objects, **self.tail_json(), "warnings": list(s.warnings)}

    def extra_json(self) -> dict[str, Any]:
        return {}

    def tail_json(self) -> dict[str, Any]:
        return {}


@contextmanager
def pack_writing(vault: "Vault", *, threads: int | None = None) -> Iterator[PackWriter]:
    """A pack writer for the block: flushed (every object durable) and closed when the block ends, aborted
    when it raises. The caller holds the vault lock."""
    writer = vault.writer(threads)
    try:
        yield writer
        writer.flush()
    except BaseException:
        writer.abort()
        raise
    writer.close()


class SnapshotTransaction:
    """One snap's writes: ``writer`` takes objects, ``flush`` makes them durable, ``commit`` writes the
    snapshot document (once, after every object is durable)."""

    def __init__(self, vault: "Vault", writer: PackWriter):
        self.vault = vault
        self.writer = writer
        self.sid: str | None = None
        self._flushed = False

    @property
    def written_bytes(self) -> int:
        return self.writer.written_bytes

    @property
    def written_objects(self) -> int:
        return self.writer.written_objects

    def flush(self) -> None:
        """Make every object added so far durable and stop the writer's threads; no more objects after it."""
        if not self._flushed:
            self.writer.flush()
            self.writer.close()
            self._flushed = True

    def commit(self, doc: "dict | Snapshot") -> str:
        """Write the snapshot document (after flushing, if the caller did not): the commit point. Returns its id."""
        if self.sid is not None:
            raise RuntimeError("a snapshot transaction commits once")
        self.flush()
        self.sid = self.vault.commit_snapshot(doc)
        return self.sid

    def abort(self) -> None:
        if not self._flushed:
            self.writer.abort()
            self._flushed = True


@contextmanager
def snapshot_transaction(vault: "Vault", *, threads: int | None = None) -> Iterator[SnapshotTransaction]:
    """Hold the shared vault lock and a pack writer for one snap (see the module docstring). Leaving the block
    without ``commit`` flushes what was written (garbage for gc, never a damaged vault); an exception aborts."""
    with vault.lock():
        txn = SnapshotTransaction(vault, vault.writer(threads))
        try:
            yield txn
        except BaseException:
            txn.abort()
            raise
        txn.flush()
