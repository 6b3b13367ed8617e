"""The one interface of the three ways to restore (in place: ``inplace.py``; ``--into`` a new venv:
``into.py``; lock-only through uv: ``uv.py``) and the one record each returns. Below all three;
``dispatch.py`` picks one."""

from __future__ import annotations

from envvault.model.records import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from envvault.output import ProgressSink

if TYPE_CHECKING:
    from envvault.model.snapshot import Snapshot

__all__ = ["RestoreResult", "Strategy"]


class Strategy(Protocol):
    """Restore snapshot ``sid`` (its record ``snapshot``) at ``target``: the environment to change, or the new
    folder for ``--into``. ``backup``: snapshot an environment before changing it (ignored where there is
    none); ``dry_run``: plan only, change nothing; ``progress(bytes_done)`` where the strategy writes bytes
    itself. ``remember(cache)``: a strategy that verifies with a check scan of its own stat cache calls it
    when the environment was found equal to the snapshot, once it saved that cache (``dispatch._Remember``);
    the others leave it to the caller. Raises ``EnvvaultError``s; returns what it did."""

    def __call__(self, vault, sid: str, snapshot: "Snapshot", target: Path, *, backup: bool, dry_run: bool,
                 progress: ProgressSink | None = None, remember=None) -> "RestoreResult": ...


@dataclass(frozen=True)
class RestoreResult:
    restored: str
    target: str
    mode: str  # "in-place", "into", "lock"
    backup: str | None = None
    changed: int = 0
    verified: bool = False
    dry_run: bool = False
    written_files: int = 0
    written_bytes: int = 0
    removed_files: int = 0
    seconds: float = 0.0
    plan: dict | None = None
    remaining: dict | None = None  # what still differs after the restore (diff JSON), when not verified
    warnings: tuple[str, ...] = ()
    caches: object = None
    timings: dict | None = None  # seconds per phase (scan, plan, stage, commit, verify)
    modes_set: int = 0  # kept files whose permission bits were put back
    settings_set: tuple[str, ...] = ()  # pyvenv.cfg settings put back (``restore/pyvenv.py``), "key = value"
    # The backup's symlinks that lead out of the environment ("name version: path -> target"): a restore refuses
    # to make them, so that backup cannot undo this restore (helper 34)
    backup_refused: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "restored": self.restored,
            "target": self.target,
            "mode": self.mode,
            "backup": self.backup,
            "backup_refused": list(self.backup_refused),
            "changed": self.changed,
            "verified": self.verified,
            "dry_run": self.dry_run,
            "written_files": self.written_files,
            "written_bytes": self.written_bytes,
            "removed_files": self.removed_files,
            "modes_set": self.modes_set,
            "settings_set": list(self.settings_set),
            "seconds": self.seconds,
            "plan": self.plan,
            "remaining": self.remaining,
            "warnings": list(self.warnings),
            "caches": self.caches,
            "timings": self.timings,
        }
