"""Which snapshot an environment should match now: what ``status`` compares against.

That is the newest snapshot of the environment (backups a restore took excluded) or, when newer, the
snapshot most recently restored onto it. The latter is remembered under the vault's ``state/`` (a cache:
losing it only makes ``status`` fall back to the newest snapshot).
"""

from __future__ import annotations

import json
from pathlib import Path

from envvault.errors import EnvvaultError, NotFoundError
from envvault.safepaths import env_key
from envvault.vault.fsutil import atomic_write, read_regular
from envvault.vault.store import Vault, _now

__all__ = ["baseline_snapshot", "record_restored", "interrupted_restore", "contents_note", "JOURNAL_NAME"]

JOURNAL_NAME = ".envvault-restore.json"  # in the environment while a restore is under way (docs/format.md)
JOURNAL_LIMIT = 256 << 20  # a journal lists every file a restore writes or deletes; read no more than this


def _marker(vault: Vault, target: Path) -> Path:
    return vault.state_path(f"restored-{env_key(target)}.json")


def record_restored(vault: Vault, target: Path, sid: str) -> None:
    """Remember that ``target`` now holds snapshot ``sid``. Never fails the caller."""
    try:
        data = json.dumps({"snapshot": sid, "venv": str(target), "at": _now()}).encode()
        atomic_write(_marker(vault, target), data, tmp_dir=vault.root / "tmp")
    except EnvvaultError:
        pass


def baseline_snapshot(vault: Vault, target: Path) -> str:
    """The id of the snapshot ``target`` should match; ``NotFoundError`` when it has none."""
    target = Path(target)
    snaps = [s for s in vault.snapshots() if s.doc.get("venv") == str(target)]
    own = [s for s in snaps if s.doc.get("trigger") != "restore-backup"] or snaps
    best = (own[0].created, own[0].id) if own else None
    try:
        marker = json.loads(read_regular(_marker(vault, target), 1 << 20, "restored marker"))
        sid, at = marker["snapshot"], marker["at"]
        if isinstance(sid, str) and (vault.root / "snapshots" / f"{sid}.json").exists() and (best is None or at > best[0]):
            best = (at, sid)
    except (OSError, ValueError, KeyError, TypeError, EnvvaultError):
        pass
    if best is None:
        raise NotFoundError(f"no snapshot of {target} in {vault.root}; run `envvault snap` first")
    return best[1]


def contents_note(vault: Vault, sid: str, doc: dict, *, changed: bool) -> str | None:
    """What a comparison with snapshot ``doc`` could not know: a lock-only snapshot recorded no file contents,
    so its packages were compared with full snapshots of the same builds (``diff.content_states``) where the
    vault holds one, by version and build only where not. None for a full snapshot."""
    if not doc.get("lock_only"):
        return None
    from envvault.diff import content_states

    total = len(doc.get("packages") or [])
    known = len(content_states(vault, doc))
    if known == total:
        return f"baseline {sid[:12]} is lock-only: file contents compared with full snapshots of the same builds"
    tail = "only versions and builds were compared" if changed else "versions and builds unchanged"
    if known:
        return (f"baseline {sid[:12]} is lock-only: file contents of {known} of {total} packages compared with "
                f"full snapshots of the same builds; for the others, {tail}")
    return f"baseline {sid[:12]} is lock-only: file contents were not recorded; {tail}"


def interrupted_restore(target: Path) -> str | None:
    """The snapshot id of a restore of ``target`` that was killed before it finished, if any."""
    try:
        doc = json.loads(read_regular(Path(target) / JOURNAL_NAME, JOURNAL_LIMIT, "the restore journal"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EnvvaultError):
        return "unknown"
    sid = doc.get("snapshot") if isinstance(doc, dict) else None
    return sid if isinstance(sid, str) else "unknown"
