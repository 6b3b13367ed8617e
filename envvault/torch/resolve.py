"""From a stamped checkpoint (file or folder) back to the snapshot its stamp names, for ``restore CKPT`` and
``diff CKPT`` (through :mod:`envvault.refs`): the named snapshot, or a better one of the same environment
(docs/format.md, "Checkpoint stamps").
"""

from __future__ import annotations

from pathlib import Path

from envvault.errors import NotFoundError, UsageError
from envvault.torch.directories import read_checkpoint
from envvault.torch.naming import find_snapshot
from envvault.torch.stamp_index import snapshot_facts

__all__ = ["snapshot_of"]


def snapshot_of(vault, path: Path) -> str:
    """The id of the snapshot a stamped checkpoint (file or directory) names, in ``vault``.

    A stamp that names a lock-only snapshot resolves to a full snapshot with the same fingerprint and venv
    when the vault holds one (same distributions, files stored: restores without rebuilding wheels). A stamp
    without a snapshot (the vault could not be written at save time) resolves through its fingerprint.
    Raises :class:`NotFoundError` with one line naming the id and the vault searched, :class:`UsageError`
    for a stamp that is not one envvault reads.
    """
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
                            f"and {vault.location} holds none with fingerprint {fp or 'unknown'}")
    if sid in set(vault.snapshot_ids()):
        # A lock-only snapshot stores no files: a full one of the same environment (same lock-level
        # fingerprint and venv: the detached snap of the first stamp, or any later one) restores better.
        named = snapshot_facts(vault).get(sid)
        if better and not better[1] and better[0] != sid and named is not None and named.lock_only:
            return better[0]
        return sid
    hint = f"; it was written to {stamp.vault} (pass --vault)" if stamp.vault and stamp.vault != vault.location else ""
    raise NotFoundError(f"snapshot {sid} named by {path.name} is not in {vault.location}{hint}")
