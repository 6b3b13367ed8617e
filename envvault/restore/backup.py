"""The backup a restore takes of the environment before changing it (docs/format.md, "Restoring an
environment", step 1): a snap without caches, trigger ``restore-backup``; deleted again when the restore
turns out not to need it. In place its package summaries are also the "current state" the plan starts
from; with ``--no-backup`` that state comes from a check scan instead."""

from __future__ import annotations

import os
from pathlib import Path

from envvault.snap import scan_current
from envvault.model.snapshot import Snapshot, loose_snapshot
from envvault.errors import EnvvaultError
from envvault.vault.store import Vault

__all__ = ["take_backup", "scan_now", "discard_backup", "links_refused"]


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


def links_refused(backup: Snapshot, target: Path) -> tuple[str, ...]:
    """The backup's files that are symlinks a restore refuses to make (``model.paths.outward_links``' rule: an
    absolute target, or one leading out of the environment), "name version: path -> target": that backup
    cannot undo the restore (helper 34: a package file replaced by a link to /etc/passwd). Only the files the
    backup found modified are looked at, on disk, as the backup found them: no manifest is read on the
    restore's way. A link whose target holds the RECORD's bytes (an installer's symlink mode: ``uv
    --link-mode symlink``) is stored as that file (``snap/manifests.py``), so the backup can undo with it."""
    from envvault.model.paths import outward_links

    found = []
    for p in backup.packages:
        links = []
        for path in p.modified:
            try:
                links.append((path, os.readlink(os.path.join(target, path))))
            except (OSError, ValueError):  # not a link (an edited file), or gone since
                continue
        found.extend(f"{p.name} {p.version}: {link}" for link in outward_links(links))
    return tuple(found)


def discard_backup(vault: Vault, sid: str | None) -> None:
    """Drop a backup this run made but did not need (its objects become garbage for gc)."""
    if sid:
        try:
            vault.delete_snapshot(sid)
        except EnvvaultError:
            pass
