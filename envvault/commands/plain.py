"""The bodies of the commands a plain command line runs without click (``lean.py``: ``snap``, ``cache
restore``), and the helpers they share with the click commands, which call the same bodies: one definition of
what each command does and prints, whichever way its command line was read. Nothing here imports click.
"""

from __future__ import annotations

import os
from pathlib import Path

from envvault.env import chosen_python
from envvault.errors import NotFoundError
from envvault.output import echo, emit_json, human_bytes, style
from envvault.model.paths import absolute_path

__all__ = ["open_vault", "warn", "snap", "cache_target", "resolve_caches", "cache_restore"]


def open_vault(vault_path: str | None, create: bool = False):
    """The vault at ``vault_path`` (``--vault``, else ``$ENVVAULT_HOME``, else the default); documents it skips
    (a malformed snapshot, a bad tag) are warned about on stderr."""
    from envvault.vault.store import Vault

    vault = Vault.open(vault_path, create=create)
    vault.warn = lambda message: echo(f"envvault: warning: {message}", err=True)
    return vault


def warn(lines) -> None:
    for w in lines:
        echo(f"warning: {w}", err=True)


def snap(vault_path: str | None, venv: str | None, message: str, lock_only: bool, no_caches: bool,
         cache_dirs, as_json: bool) -> None:
    """``envvault snap``: freeze an environment into the vault and say what was stored."""
    from envvault.env.probe import find_target
    from envvault.output import Progress
    from envvault.snap import statcache_for, take_snapshot
    from envvault.snap.fresh import journal_left

    target = find_target(venv)
    vault = open_vault(vault_path, create=True)
    if journal_left(target, vault.state.dir):  # a restore's journal: one running now is waited for
        from envvault.journal import wait_for_restore

        wait_for_restore(vault, target)
    progress = Progress("snap", 1, enabled=not as_json)
    hook = None
    if not no_caches and not lock_only:
        hook = _cache_hook(vault, target, cache_dirs)
    cache = statcache_for(vault, target)  # saved here once the snapshot committed, then named by a verdict
    try:
        result = take_snapshot(vault, target, message=message, lock_only=lock_only, progress=progress,
                               cache_hook=hook, cache=cache)
    finally:
        progress.close()
    cache.save()
    if not lock_only:  # the next status answers from this snap (a lock-only baseline's status has a note)
        from envvault.restore.baseline import leave_verdict

        leave_verdict(vault, cache, target, result.id)
    if as_json:
        emit_json(result.to_json())
        return
    d = result.to_json()
    echo(f"snapshot {style(d['short_id'], 'yellow')} of {d['venv']}: {d['packages']} packages, {d['files']} files "
         f"({human_bytes(d['bytes'])}), {human_bytes(d['new_bytes'])} new in the vault")
    warn(d["warnings"])


def _cache_hook(vault, target, cache_dirs):
    try:
        from envvault.caches.snap import make_cache_hook
    except ImportError:
        return None
    return make_cache_hook(vault, target, [Path(d) for d in cache_dirs])


def cache_target(venv: str | None) -> Path | None:
    """The environment the caches are checked against: ``--venv`` (or ``--python``), else the active one."""
    if venv is not None or chosen_python():
        from envvault.env.probe import find_target

        return find_target(venv)
    active = os.environ.get("VIRTUAL_ENV")
    return absolute_path(active) if active else None


def resolve_caches(vault, ref: str) -> str:
    """id / prefix / tag, or ``latest``: the newest snapshot that holds caches."""
    if ref == "latest":
        from envvault.vault.heads import newest_head

        def holds_files(ref) -> bool:
            return ref is not None and any(c.manifest for c in ref.snapshot.caches or ())

        hit = newest_head(vault, lambda head: head.caches > 0)  # checked against its document
        chosen = vault.load_listed(hit[0]) if hit is not None else None  # None: deleted since
        if holds_files(chosen):
            return chosen.id
        for s in vault.snapshots():  # caches listed without files: the documents decide
            if holds_files(s):
                return s.id
        raise NotFoundError(f"no snapshot with compile caches in {vault.location}; run `envvault cache snap` first")
    return vault.resolve(ref)


def cache_restore(vault_path: str | None, snapshot_id: str, venv: str | None, kinds, roots, to: str | None,
                  merge: bool, archived_roots: bool, dry_run: bool, as_json: bool) -> None:
    """``envvault cache restore``: put archived caches back and say what was written."""
    from envvault.caches.restore import restore_snapshot_caches

    from envvault.vault.store import Vault

    target = cache_target(venv)  # a bad --venv is told before the vault is read
    vault = Vault.open(vault_path)
    sid = resolve_caches(vault, snapshot_id)
    snapshot = vault.load_snapshot(sid).snapshot
    result = restore_snapshot_caches(vault, snapshot, venv=target, mode="merge" if merge else "replace",
                                     select=list(kinds) + [os.path.abspath(os.path.expanduser(r)) for r in roots],
                                     to=Path(to) if to else None, archived_roots=archived_roots, dry_run=dry_run, sid=sid)
    if as_json:
        emit_json({"snapshot": sid, **result.to_json()})
        return
    verb = "would restore" if dry_run else "restored"
    for e in result.entries:
        removed = f", {e.removed_files} removed" if e.removed_files else ""
        echo(f"{verb} {e.kind} cache to {e.root}: {e.written_files} files ({human_bytes(e.written_bytes)}), "
             f"{e.kept_files} already there{removed} [{e.mode}]")
    if not result.entries and not result.skipped:
        echo(f"snapshot {sid[:12]} holds no caches", err=True)
    warn(result.warnings)
