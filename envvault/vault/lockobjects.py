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
MAX_LEASES = 1_000  # fresh lease objects past this stop ``gc --keep-last`` (a lister reads each one)


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
    import uuid

    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad lock name {name!r}")
    me = f"{name}-{uuid.uuid4().hex}"
    key = f"locks/{me}.json"
    body = {"lock": name, "exclusive": exclusive, **_place(), "pid": os.getpid()}
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
    with _kept_until_done(keys, key, lambda stop: _refresh(keys, key, body, me, stop)):
        yield True


@contextmanager
def _kept_until_done(keys: LockKeys, key: str, rewrite: Callable[[Any], None]) -> Iterator[None]:
    """Run ``rewrite(stop)`` in a thread while the block runs (it rewrites ``key`` until ``stop`` is set),
    then delete ``key``; one that cannot be deleted goes stale."""
    import threading

    stop = threading.Event()
    writer = threading.Thread(target=rewrite, args=(stop,), daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()
        try:
            keys.delete_key(key)
        except StorageError:
            pass


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


_HERE: dict | None = None


def _place() -> dict:
    """Where this process runs, as lock objects and leases record it: the host's name, its boot (Linux's
    ``boot_id``) and the PID namespace (``/proc/self/ns/pid``); None for a part that cannot be read. Read once
    a process."""
    global _HERE
    if _HERE is None:
        import socket

        def read(how) -> str | None:
            try:
                return how()[:100]
            except (OSError, ValueError):
                return None

        def boot() -> str:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                return f.read(100).decode("ascii").strip()

        _HERE = {"hostname": socket.gethostname(), "boot": read(boot),
                 "pidns": read(lambda: os.readlink("/proc/self/ns/pid"))}
    return dict(_HERE)


def _gone_here(hostname: object, boot: object, pidns: object, pid: object) -> bool:
    """Whether the process that wrote a lock object or lease is known to be gone: it ran on this host, in this
    boot and this PID namespace (all three recorded and equal to ``_place()``'s), and its pid runs no more. A
    process of another PID namespace of the same host (a container sharing the host's name: Docker
    ``--network host``, Kubernetes ``hostNetwork``) is never judged so, nor one of a writer that did not record
    them: those go stale by age alone (helper 28, F1: such a gc dropped a running guard's lease)."""
    here = _place()
    return (here["hostname"] is not None and here["boot"] is not None and here["pidns"] is not None
            and (hostname, boot, pidns) == (here["hostname"], here["boot"], here["pidns"])
            and isinstance(pid, int) and not isinstance(pid, bool) and not process_alive(pid))


def _put_lock(keys: LockKeys, key: str, body: dict) -> None:
    keys.put_key(key, json.dumps(dict(body, time=time.time()), sort_keys=True).encode())


def _conflict(keys: LockKeys, name: str, me: str, exclusive: bool) -> str | None:
    """Another live lock object of ``name`` that excludes this one (removing stale ones on the way)."""
    mine_re = re.compile(rf"locks/({re.escape(name)}-[0-9a-f]{{32}})\.json")
    metas: dict[str, Any] = {}
    for m in keys.list_meta("locks/"):
        hit = mine_re.fullmatch(m["path"])
        if hit:
            metas[hit.group(1)] = m
    mine = metas.get(me)
    if mine is None:
        return None if not metas else next(iter(metas))  # our own write is not listed yet: try again
    now = mine["last_modified"]  # the server's clock, not ours
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
        if age > LOCK_STALE_SECONDS or _gone_here(doc.get("hostname"), doc.get("boot"), doc.get("pidns"),
                                                  doc.get("pid")):
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
    """A guard lease as read back: the snapshot it keeps, and where its writer ran (``_gone_here``)."""

    snapshot: str
    hostname: str | None
    boot: str | None
    pidns: str | None
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

    def text(key: str) -> str | None:
        value = doc.get(key)
        return value if isinstance(value, str) else None

    pid = doc.get("pid")
    return Lease(snapshot=doc["snapshot"], hostname=text("hostname"), boot=text("boot"),
                 pidns=text("pidns"), pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None)


@contextmanager
def lease(keys: LockKeys, snapshot: str, venv: str, *, refresh: float = LOCK_REFRESH_SECONDS) -> Iterator[None]:
    """Hold a lease on ``snapshot`` while the block runs: ``locks/lease-<32 hex>.json``, rewritten every
    ``refresh`` seconds (a guarded command may run for hours), deleted at the end. Unlike ``hold`` it excludes
    nothing and is never taken away: a lease a peer judged stale is simply written again."""
    import uuid

    key = f"locks/{LEASE}-{uuid.uuid4().hex}.json"
    body = {"lock": LEASE, "snapshot": snapshot, "venv": venv, **_place(), "pid": os.getpid()}
    _put_lock(keys, key, body)

    def rewrite(stop) -> None:
        while not stop.wait(refresh):
            try:
                _put_lock(keys, key, body)
            except StorageError:
                continue

    with _kept_until_done(keys, key, rewrite):
        yield


def live_leases(keys: LockKeys, *, clean: bool = True) -> list[Lease]:
    """The leases under ``locks/`` that are not stale (``hold``'s rule: last written more than
    ``LOCK_STALE_SECONDS`` before the newest vault lock object listed with them, the lister's own, by the
    server's clock; or ``_gone_here``); stale ones are deleted when ``clean``. A lease that reads but does not
    parse pins nothing; one that cannot be read is a StorageError naming it (what it keeps is unknown), and
    more than ``MAX_LEASES`` fresh ones a CorruptError, before any is read (each is a request)."""
    lease_re = re.compile(rf"locks/{LEASE}-[0-9a-f]{{32}}\.json")
    holder_re = re.compile(r"locks/vault-[0-9a-f]{32}\.json")
    metas = keys.list_meta("locks/")
    found = [m for m in metas if lease_re.fullmatch(m["path"])]
    if not found:
        return []
    stamps = [m["last_modified"] for m in metas if holder_re.fullmatch(m["path"])]
    now = max(stamps) if stamps else max(m["last_modified"] for m in found)
    stale: list[dict] = []
    fresh: list[dict] = []
    for m in found:
        (stale if (now - m["last_modified"]).total_seconds() > LOCK_STALE_SECONDS else fresh).append(m)
    if len(fresh) > MAX_LEASES:
        raise CorruptError(f"{len(fresh)} guard leases under locks/ are fresh, more than {MAX_LEASES}; gc stops "
                           "before it deletes anything (it would read each one): remove those no guard holds")
    live: list[Lease] = []
    for meta, data in zip(fresh, _read_all(keys, [m["path"] for m in fresh])):
        got = parse_lease(data)
        if got is not None and _gone_here(got.hostname, got.boot, got.pidns, got.pid):
            stale.append(meta)
        elif got is not None:
            live.append(got)
    if clean:
        for meta in stale:
            try:
                keys.delete_key(meta["path"])
            except Exception:  # noqa: BLE001 - another lister deleted it, or it goes next time
                pass
    return live


def _read_all(keys: LockKeys, paths: list[str]) -> list[bytes | None]:
    """``keys.get_key`` of each path (up to ``_SMALL`` bytes), eight at a time; a failure to read one is a
    StorageError that names it."""
    def read(path: str) -> bytes | None:
        try:
            return keys.get_key(path, _SMALL)
        except StorageError as err:
            raise StorageError(f"cannot read the guard lease {path} ({err}); gc stops so it cannot drop the "
                               "snapshot it keeps: remove it if no guard holds it") from None

    if len(paths) < 2:
        return [read(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(read, paths))
