"""The backup a restore takes of the environment before changing it (docs/format.md, "Restoring an
environment", step 1): a snap without caches, trigger ``restore-backup``; deleted again when the restore
turns out not to need it. In place its package summaries are also the "current state" the plan starts
from; with ``--no-backup`` that state comes from a check scan instead."""

from __future__ import annotations

from pathlib import Path

from envvault.snap import scan_current
from envvault.model.snapshot import Snapshot, loose_snapshot
from envvault.errors import EnvvaultError
from envvault.vault.store import Vault

__all__ = ["take_backup", "scan_now", "discard_backup"]


def take_backup(vault: Vault, target: Path, sid: str, cache=None):
    """Snapshot ``target`` before restoring ``sid`` onto it; returns the snap's result (``.id``, ``.snapshot``).
    Given the target's stat ``cache``, the snap uses it and leaves saving it to the caller."""
    from envvault.snap import take_snapshot

    return take_snapshot(vault, target, message=f"backup before restoring {sid[:12]}", trigger="restore-backup",
                         argv=["envvault", "restore", sid], cache=cache)


def scan_now(vault: Vault, target: Path, sid: str, backup: bool, cache=None) -> tuple[Snapshot, str | None]:
    """The environment's state and the backup's id: from a backup snapshot (one read of every new file)
    or, without ``backup``, a check scan (no id; no host or env facts: ``loose_snapshot``). Either, given
    the target's stat ``cache``, uses it and leaves saving it to the caller: a backup's cache may be saved
    only once it returned (it holds the ids of the manifests it committed)."""
    if backup:
        snap = take_backup(vault, target, sid, cache=cache)
        return snap.snapshot, snap.id
    return loose_snapshot(scan_current(vault, target, facts=False, cache=cache, save_cache=cache is None)), None


def discard_backup(vault: Vault, sid: str | None) -> None:
    """Drop a backup this run made but did not need (its objects become garbage for gc)."""
    if sid:
        try:
            vault.delete_snapshot(sid)
        except EnvvaultError:
            pass
