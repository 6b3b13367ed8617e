"""Which vault snapshot names an environment, both ways: for a stamping process, the snapshot of the
environment it started with (found through the stamp index, else a lock-only snapshot taken now and a detached
``envvault snap`` that stores the files); for a stamped checkpoint, the snapshot its stamp names.

Among snapshots of one lock-level fingerprint the order is docs/format.md's: a full one before a lock-only
one, one without missing files before one with (the lock-level fingerprint reads dist-info only, so a
snapshot of a damaged environment, such as the backup a restore takes before repairing it, can share it),
one not taken as a restore's backup before a backup, then the newest.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from envvault.errors import EnvvaultError, NotFoundError, UsageError
from envvault.torch import stamp_index
from envvault.torch.environment import EnvState

__all__ = ["find_snapshot", "ensure_snapshot", "spawn_full_snapshot", "snapshot_of"]


def find_snapshot(vault, fingerprint: str, venv: str | None = None) -> tuple[str, bool] | None:
    """``(id, lock_only)`` of the best snapshot with this lock-level fingerprint (of the environment at
    ``venv`` when given: an identical copy elsewhere would make ``restore`` target that copy), or None."""
    facts = stamp_index.snapshot_facts(vault)
    matches = [(entry.rank(), sid) for sid, entry in facts.items()
               if entry.lock_fingerprint == fingerprint and (venv is None or entry.venv == venv)]
    if not matches:
        return None
    _rank, sid = max(matches)
    return sid, facts[sid].lock_only


@contextmanager
def _flock(path: Path) -> Iterator[None]:
    from envvault.vault.fsutil import flocked, storage_error

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise storage_error(err, path) from None
    with flocked(path, exclusive=True):
        yield


def ensure_snapshot(vault, prefix: Path, state: EnvState, *, full_snapshot: bool = True,
                    runtime_path: list[str] | None = None) -> tuple[str, bool]:
    """``(id, lock_only)`` of a snapshot of ``state``: an existing one with its fingerprint, else a
    lock-only snapshot taken now and, with ``full_snapshot``, a detached ``envvault snap`` that vaults the
    files without making the caller wait.

    Concurrent callers (threads or processes) serialise on ``locks/stamp-<fingerprint>.lock`` and look again
    once they hold it, so they produce one snapshot between them. Raises :class:`EnvvaultError` when the
    vault cannot be written or the environment changed before it could be vaulted.
    """
    found = find_snapshot(vault, state.fingerprint, state.prefix)
    if found:
        return found
    from envvault.snap import take_snapshot  # at the first stamp only (stamping starts with the interpreter)

    with _flock(vault.root / "locks" / f"stamp-{state.fingerprint}.lock"):
        found = find_snapshot(vault, state.fingerprint, state.prefix)
        if found:
            return found
        result = take_snapshot(vault, prefix, lock_only=True, trigger="stamp", argv=list(sys.argv),
                               message=f"for checkpoint stamps (pid {os.getpid()})")
        if result.doc.get("fingerprint") != state.fingerprint:
            raise EnvvaultError(f"{prefix} changed before it could be vaulted (snapshot {result.id[:12]} has "
                                "another fingerprint); the stamp names no snapshot")
        stamp_index.snapshot_facts(vault)  # index the new snapshot for the processes waiting on the lock
        if full_snapshot:
            try:
                spawn_full_snapshot(vault, prefix, state.fingerprint, runtime_path or [])
            except (OSError, subprocess.SubprocessError) as err:  # the stamp's snapshot stands without it
                logging.getLogger("envvault").warning(
                    "envvault: could not start `envvault snap` of %s in the background (%s); run it yourself to "
                    "store the files", prefix, err)
        return result.id, True


def spawn_full_snapshot(vault, prefix: Path, fingerprint: str, runtime_path: list[str]) -> None:
    """Start ``envvault snap`` of ``prefix`` in its own session, detached (it outlives the caller); its
    stderr goes to ``state/stamp-snap.log`` in the vault."""
    from envvault.env.untrusted import boot_code  # the current folder off sys.path: it may hold a json.py

    log = vault.state_path("stamp-snap.log")
    # The environment stays the training process's (the snapshot records it); envvault's own import path
    # goes on the command line instead of PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "ENVVAULT_STAMP"}
    boot = boot_code(runtime_path)
    cmd = [sys.executable, "-c", boot, "--vault", str(vault.root), "snap", "--venv", str(prefix),
           "--no-caches", "-m", f"files for checkpoint stamps ({fingerprint[:12]})"]
    # sh starts the snap in the background and exits at once: the snap is re-parented, never a zombie here.
    subprocess.run(["/bin/sh", "-c", 'exec 2>>"$0"; "$@" </dev/null >/dev/null &', str(log), *cmd],
                   env=env, start_new_session=True, check=True, timeout=30)


# --- from a checkpoint back to its snapshot --------------------------------------------------------------


def snapshot_of(vault, path: Path) -> str:
    """The id of the snapshot a stamped checkpoint (file or directory) names, in ``vault``.

    A stamp that names a lock-only snapshot resolves to a full snapshot with the same fingerprint and venv
    when the vault holds one (same distributions, files stored: restores without rebuilding wheels). A stamp
    without a snapshot (the vault could not be written at save time) resolves through its fingerprint.
    Raises :class:`NotFoundError` with one line naming the id and the vault searched, :class:`UsageError`
    for a stamp that is not one envvault reads.
    """
    from envvault.torch.directories import read_checkpoint

    info = read_checkpoint(path)
    stamp = info.stamp
    if stamp is None and info.stamp_problem:
        raise UsageError(f"{path}: {info.stamp_problem}")
    if stamp is None:
        raise NotFoundError(f"{path} carries no envvault stamp (saved without stamping); name a snapshot instead")
    sid, fp = stamp.snapshot, stamp.fingerprint
    better = find_snapshot(vault, fp, stamp.venv) if fp else None
    if sid is None:
        if better:
            return better[0]
        raise NotFoundError(f"{path}: its stamp names no snapshot (the vault was not writable when it was saved) "
                            f"and {vault.root} holds none with fingerprint {fp or 'unknown'}")
    if sid in set(vault.snapshot_ids()):
        # A lock-only snapshot stores no files: a full one of the same environment (same lock-level
        # fingerprint and venv: the detached snap of the first stamp, or any later one) restores better.
        named = stamp_index.snapshot_facts(vault).get(sid)
        if better and not better[1] and better[0] != sid and named is not None and named.lock_only:
            return better[0]
        return sid
    hint = f"; it was written to {stamp.vault} (pass --vault)" if stamp.vault and stamp.vault != str(vault.root) else ""
    raise NotFoundError(f"snapshot {sid} named by {path.name} is not in {vault.root}{hint}")
