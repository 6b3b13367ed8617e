"""``restore_snapshot``: the entry point of every restore. It picks the strategy (``result.Strategy``): in
place (``inplace.py``), ``--into`` a new venv (``into.py``) or, for a lock-only snapshot, through uv
(``uv.py``); validates the snapshot's cache manifests before the environment is touched and restores the
caches after it (``caches/restore.py``); and remembers a verified restore for ``status`` (``baseline.py``).
"""

from __future__ import annotations

import time
from envvault.model.records import replace
from pathlib import Path

from envvault.model.snapshot import Snapshot
from envvault.restore.baseline import leave_verdict, record_restored
from envvault.output import ProgressSink
from envvault.restore.result import RestoreResult, Strategy
from envvault.vault.store import Vault

__all__ = ["restore_snapshot", "strategy_for"]


def strategy_for(snapshot: Snapshot, *, into: bool) -> Strategy:
    """The strategy that restores ``snapshot``: ``--into`` first, then lock-only, else in place."""
    if into:
        from envvault.restore.into import restore_into

        return restore_into
    if snapshot.lock_only:
        from envvault.restore.uv import restore_lock_only

        return restore_lock_only
    from envvault.restore.inplace import restore_in_place

    return restore_in_place


def restore_snapshot(
    vault: Vault,
    sid: str,
    target: Path,
    *,
    backup: bool = True,
    dry_run: bool = False,
    into: Path | None = None,
    progress: ProgressSink | None = None,
    caches: bool = True,
) -> RestoreResult:
    """Restore snapshot ``sid`` onto the environment ``target`` (or, with ``into``, into a new venv there).

    In place, untouched distributions keep every file as it is (mtimes included); changed ones are put
    back from vault objects only; distributions the snapshot lacks are removed. ``backup`` snapshots the
    environment first. Raises ``RefusedError`` for unsafe manifests or an interpreter mismatch.
    """
    started = time.monotonic()
    ref = vault.load_snapshot(sid)
    snapshot = ref.snapshot
    env_target = Path(into or target).absolute()
    if caches and snapshot.caches and not dry_run:
        # Validate the cache manifests (paths, roots) before the environment is touched: a hostile cache
        # manifest must not leave a half-finished restore behind.
        _restore_caches(vault, snapshot, env_target, True)
    strategy = strategy_for(snapshot, into=into is not None)
    remember = _Remember(vault, env_target, ref.id, snapshot)
    result = strategy(vault, ref.id, snapshot, env_target, backup=backup, dry_run=dry_run, progress=progress,
                      remember=remember)
    if result.verified and not result.dry_run:
        remember()  # once: a strategy that held the verify scan's stat cache has called it already
    cache_result = None
    if caches and snapshot.caches:
        cache_result = _restore_caches(vault, snapshot, env_target, dry_run)
    return replace(result, caches=cache_result, seconds=round(time.monotonic() - started, 3))


class _Remember:
    """What a verified restore leaves for ``status``: the marker naming the snapshot restored
    (``baseline.record_restored``), written once; and, given the stat cache of the verify scan that found the
    environment equal to the snapshot (once that cache is saved), a verdict (``snap/verdict.py``), so that
    the first ``status`` after the restore is answered from it, when the snapshot is now the environment's
    baseline. A lock-only snapshot's status carries a note about contents: the full command answers that one."""

    def __init__(self, vault: Vault, target: Path, sid: str, snapshot: Snapshot) -> None:
        self.vault, self.target, self.sid, self.snapshot = vault, target, sid, snapshot
        self.done = False

    def __call__(self, cache=None) -> None:
        if self.done:
            return
        self.done = True
        record_restored(self.vault, self.target, self.sid)
        if cache is not None and not self.snapshot.lock_only:  # the marker written, the backup committed
            leave_verdict(self.vault, cache, self.target, self.sid)


def _restore_caches(vault: Vault, snapshot: Snapshot, target: Path, dry_run: bool) -> dict:
    """The snapshot's compile caches, through ``envvault.caches.restore`` (staged, inside each cache root)."""
    from envvault.caches.restore import restore_snapshot_caches

    return restore_snapshot_caches(vault, snapshot, venv=target, dry_run=dry_run).to_json()
