"""Taking a snapshot: scan the environment (``scan.py``), call the cache hook, store what is new, commit the
snapshot document last."""

from __future__ import annotations

import sys
import time
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)

from envvault import __version__
from envvault.crashpoints import crash_point
from envvault.env.host import host_facts_cached, relevant_env
from envvault.model.encoding import utc_timestamp as now
from envvault.model.identity import fingerprint
from envvault.model.snapshot import build_snapshot
from envvault.output import ProgressSink
from envvault.vault.store import Vault
from envvault.vault import timing
from envvault.vault.transaction import Committed, snapshot_transaction

from .scan import scan_environment

if TYPE_CHECKING:
    from typing import Callable

    from envvault.caches.snap import CacheHook
    from envvault.vault.statcache import StatCache

__all__ = ["take_snapshot", "SnapResult"]

class SnapResult(Committed):
    """A committed snapshot: its id and the validated record."""

    def extra_json(self) -> dict:
        s = self.snapshot
        return {"packages": len(s.packages), "files": s.stats.files, "bytes": s.stats.bytes}

    def tail_json(self) -> dict:
        return {"lock_only": self.snapshot.lock_only, "fingerprint": self.snapshot.fingerprint}


def take_snapshot(
    vault: Vault,
    prefix: Path,
    *,
    message: str = "",
    lock_only: bool = False,
    trigger: str = "manual",
    argv: list[str] | None = None,
    progress: ProgressSink | None = None,
    cache_hook: CacheHook | None = None,
    extra: dict | None = None,
    cache: StatCache | None = None,
    on_commit: Callable[[str], None] | None = None,
) -> SnapResult:
    """Snapshot ``prefix`` into ``vault`` in one snapshot transaction: objects first, then the snapshot
    document (the commit point). The target's stat cache is loaded before the scan and saved after the
    commit, unless the caller passes its own ``cache`` (a restore's backup): then saving it is the caller's,
    and only once this returned (the cache trusts the manifest ids it holds, and those exist only once
    committed). ``on_commit(id)`` runs right after the commit, under the same vault lock."""
    started = time.monotonic()
    t0 = timing.clock()
    callers_cache = cache is not None
    with snapshot_transaction(vault) as txn:
        interp, packages, warnings, cache, ing, stats = scan_environment(
            vault, prefix, mode="lock" if lock_only else "full", writer=txn.writer, progress=progress,
            cache=cache,
        )
        t0 = _stage("snap: scan (reads, manifests)", t0)
        caches = cache_hook(vault, ing, cache) if cache_hook and not lock_only else []  # a lock stores no file
        t0 = _stage("snap: compile caches", t0)
        txn.flush()
        t0 = _stage("snap: flush (last packs durable)", t0)
        crash_point("snap_objects")
        snapshot = build_snapshot(
            created=now(),
            message=message,
            trigger=trigger,
            argv=list(argv if argv is not None else sys.argv),
            venv=str(prefix),
            lock_only=lock_only,
            python=interp.to_dict(),
            host=host_facts_cached(cache),
            env=relevant_env(),
            packages=packages,
            caches=caches,
            fingerprint=fingerprint(interp.version, packages),
            warnings=warnings + [f"cache {c.get('kind')} {c.get('root')}: {w}" for c in caches
                                 for w in c.get("warnings", ())],
            stats={
                "files": stats["files"],
                "bytes": stats["bytes"],
                "new_bytes": txn.written_bytes,
                "new_objects": txn.written_objects,
                "seconds": round(time.monotonic() - started, 3),
            },
            tool={"envvault": __version__},
            extra=extra,
        )
        sid = txn.commit(snapshot)
        if on_commit is not None:
            on_commit(sid)  # still under the vault lock: no gc runs between the commit and it
        t0 = _stage("snap: snapshot document and commit", t0)
    if not callers_cache:
        cache.save()
        _stage("snap: stat cache saved", t0)
    return SnapResult(sid, snapshot)


def _stage(name: str, since: float) -> float:
    if timing.ON:
        timing.add(name, since)
    return timing.clock()
