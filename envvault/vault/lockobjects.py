"""Lock objects (docs/format.md, "Object storage"): the vault lock without flock, of an ``s3://`` vault and
of a local one whose settings say ``lock = "objects"`` (``local_locks.py``). A holder writes ``locks/<name>-<holder>.json``, lists the others, backs off while one excludes it,
rewrites its object every ``LOCK_REFRESH_SECONDS`` and deletes it on release; an object not rewritten for
``LOCK_STALE_SECONDS`` by the server's clock, or one of a dead process on this host, is stale and deleted.
An exclusive holder moves ``gc-epoch`` on; a shared holder reports it (``on_gc_epoch``). A running guard's
lease on its "before" snapshot (``lease``, ``live_leases``) is an object of the same kind that excludes nothing:
gc on any node keeps what it names."""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

from envvault.errors import CorruptError, StorageError
from envvault.model.encoding import json_loads
from envvault.model.records import dataclass
from envvault.model.snapshot import is_id
from envvault.vault.fsutil import process_alive

__all__ = ["hold", "lease", "live_leases", "Lease", "parse_lease", "LockKeys", "LOCK_STALE_SECONDS",
           "LOCK_REFRESH_SECONDS", "MAX_LEASES"]

LOCK_REFRESH_SECONDS = 300.0
LOCK_STALE_SECONDS = 1800.0
_SMALL = 64 << 10  # a lock object or the gc epoch is a few hundred bytes; a larger one is not read
LEASE = "lease"  # ``locks/lease-<32 hex>.json``: a running guard's "before" snapshot (docs/format.md, "Guard leases")
MAX_LEASES = 10_000  # live leases past this stop ``gc --keep-last`` (a lister reads each one)


class LockKeys(Protocol):
    """What lock objects need of a store (``S3Backend``, ``local_locks.DirLockKeys``): keys with the
    modification times of the store's own clock."""

    lost: list[str]  # locks whose object vanished while held (stale by another's clock): commit nothing
    on_gc_epoch: Callable[[str], None] | None

    def list_meta(self, prefix: str) -> list[dict]: ...  # {"path", "last_modified", ...}

    def get_key(self, key: str, limit: int) -> bytes | None: ...

    def put_key(self, key: str, data: bytes) -> None: ...

    def delete_key(self, key: str) -> None: ...

    def exists_key(self, key: str) -> bool: ...


@contextmanager
def hold(keys: LockKeys, name: str, *, exclusive: bool, wait: bool = True) -> Iterator[bool]:
    """Hold lock ``name`` (shared, or ``exclusive``); yields False at once when ``wait=False`` and another
    holder excludes it."""
    import random
    import socket
    import threading
    import uuid

    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad lock name {name!r}")
    me = f"{name}-{uuid.uuid4().hex}"
    key = f"locks/{me}.json"
    body = {"lock": name, "exclusive": exclusive, "hostname": socket.gethostname(), "pid": os.getpid()}
    delay = 0.1
    while True:
        _put_lock(keys, key, body)
        if _conflict(keys, name, me, exclusive) is None:
            break
        keys.delete_key(key)
        if not wait:
            yield False
            return
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 2.0)
    _after_lock(keys, exclusive)
    stop = threading.Event()
    refresher = threading.Thread(target=_refresh, args=(keys, key, body, me, stop), daemon=True)
    refresher.start()
    try:
        yield True
    finally:
        stop.set()
        refresher.join()
        try:
            keys.delete_key(key)
        except StorageError:
            pass  # it goes stale


def _after_lock(keys: LockKeys, exclusive: bool) -> None:
    """The gc epoch: an exclusive holder moves it on before it deletes anything; a shared holder tells
    ``on_gc_epoch`` what it holds (the node drops its stat caches when it changed)."""
    import uuid

    if exclusive:
        value = uuid.uuid4().hex.encode()
        keys.put_key("gc-epoch", value)
        if keys.on_gc_epoch is not None:
            keys.on_gc_epoch(value.decode())
        return
    if keys.on_gc_epoch is None:
        return
    value = keys.get_key("gc-epoch", _SMALL) or b""
    keys.on_gc_epoch(value.decode("ascii", "replace")[:64])


def _put_lock(keys: LockKeys, key: str, body: dict) -> None:
    keys.put_key(key, json.dumps(dict(body, time=time.time()), sort_keys=True).encode())


def _conflict(keys: LockKeys, name: str, me: str, exclusive: bool) -> str | None:
    """Another live lock object of ``name`` that excludes this one (removing stale ones on the way)."""
    import socket

    mine_re = re.compile(rf"^locks/({re.escape(name)}-[0-9a-f]{{32}})\.json$")
    metas: dict[str, Any] = {}
    for m in keys.list_meta("locks/"):
        hit = mine_re.match(m["path"])
        if hit:
            metas[hit.group(1)] = m
    mine = metas.get(me)
    if mine is None:
        return None if not metas else next(iter(metas))  # our own write is not listed yet: try again
    now = mine["last_modified"]  # the server's clock, not ours
    host = socket.gethostname()
    for other, meta in metas.items():
        if other == me:
            continue
        try:
            doc = json_loads(keys.get_key(meta["path"], _SMALL) or b"{}")
        except Exception:  # noqa: BLE001 - unreadable: judge by its age
            doc = {}
        if not isinstance(doc, dict):  # not a lock object envvault writes: judged by its age alone
            doc = {}
        age = (now - meta["last_modified"]).total_seconds()
        dead_here = doc.get("hostname") == host and isinstance(doc.get("pid"), int) and not process_alive(doc["pid"])
        if age > LOCK_STALE_SECONDS or dead_here:
            try:
                keys.delete_key(meta["path"])
            except Exception:  # noqa: BLE001
                pass
            continue
        if exclusive or doc.get("exclusive", True):
            return other
    return None


def _refresh(keys: LockKeys, key: str, body: dict, me: str, stop: Any) -> None:
    while not stop.wait(LOCK_REFRESH_SECONDS):
        try:
            if not keys.exists_key(key):
                keys.lost.append(me)
                return
            _put_lock(keys, key, body)
        except StorageError:
            continue




@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """A guard lease as read back: the snapshot it keeps, and who wrote it (for the dead-process rule)."""

    snapshot: str
    venv: str | None
    hostname: str | None
    pid: int | None


def parse_lease(data: bytes | None) -> Lease | None:
    """The one parser of a lease object; None for anything that is not one envvault writes (it pins nothing)."""
    if not data:
        return None
    try:
        doc = json_loads(data)
    except Exception:  # noqa: BLE001 - not JSON: no lease
        return None
    if not isinstance(doc, dict) or doc.get("lock") != LEASE or not is_id(doc.get("snapshot")):
        return None
    venv, host, pid = doc.get("venv"), doc.get("hostname"), doc.get("pid")
    return Lease(snapshot=doc["snapshot"], venv=venv if isinstance(venv, str) else None,
                 hostname=host if isinstance(host, str) else None,
                 pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None)


@contextmanager
def lease(keys: LockKeys, snapshot: str, venv: str, *, refresh: float = LOCK_REFRESH_SECONDS) -> Iterator[None]:
    """Hold a lease on ``snapshot`` while the block runs: ``locks/lease-<32 hex>.json``, rewritten every
    ``refresh`` seconds (a guarded command may run for hours), deleted at the end. Unlike ``hold`` it excludes
    nothing and is never taken away: a lease a peer judged stale is simply written again."""
    import socket
    import threading
    import uuid

    key = f"locks/{LEASE}-{uuid.uuid4().hex}.json"
    body = {"lock": LEASE, "snapshot": snapshot, "venv": venv, "hostname": socket.gethostname(),
            "pid": os.getpid()}
    _put_lock(keys, key, body)
    stop = threading.Event()

    def rewrite() -> None:
        while not stop.wait(refresh):
            try:
                _put_lock(keys, key, body)
            except StorageError:
                continue

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()
        try:
            keys.delete_key(key)
        except StorageError:
            pass  # it goes stale


def live_leases(keys: LockKeys, *, clean: bool = True) -> list[Lease]:
    """The leases under ``locks/`` that are not stale (``hold``'s rule: last written more than
    ``LOCK_STALE_SECONDS`` before the newest vault lock object listed with them, the lister's own, by the
    server's clock; or of this host and a process that no longer runs); stale ones are deleted when ``clean``.
    A lease that cannot be read or parsed pins nothing. A CorruptError past ``MAX_LEASES`` live ones."""
    import socket

    lease_re = re.compile(rf"^locks/{LEASE}-[0-9a-f]{{32}}\.json$")
    holder_re = re.compile(r"^locks/vault-[0-9a-f]{32}\.json$")
    metas = keys.list_meta("locks/")
    found = [m for m in metas if lease_re.match(m["path"])]
    if not found:
        return []
    stamps = [m["last_modified"] for m in metas if holder_re.match(m["path"])]
    now = max(stamps) if stamps else max(m["last_modified"] for m in found)
    host = socket.gethostname()
    live: list[Lease] = []
    for meta in found:
        stale = (now - meta["last_modified"]).total_seconds() > LOCK_STALE_SECONDS
        got = None if stale else parse_lease(keys.get_key(meta["path"], _SMALL))
        if got is not None and got.hostname == host and got.pid is not None and not process_alive(got.pid):
            stale = True
        if stale:
            if clean:
                try:
                    keys.delete_key(meta["path"])
                except Exception:  # noqa: BLE001 - another lister deleted it, or it goes next time
                    pass
            continue
        if got is not None:
            live.append(got)
            if len(live) > MAX_LEASES:
                raise CorruptError(f"more than {MAX_LEASES} guard leases under locks/ are live; gc stops so it "
                                   "cannot drop a snapshot one of them keeps; remove the ones no guard holds")
    return live
