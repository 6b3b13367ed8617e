"""How many automatic snapshots an environment keeps, so guarded installs never grow the vault without bound.

Policy: per environment, the newest ``keep`` snapshots whose trigger is automatic (``guard``) stay; older
automatic ones are forgotten, in rounds: once more than ``keep + keep // 2`` have gathered (one gc per
round, not one per guarded command; a gc reads every kept manifest, about a second for a torch venv).
Manual snapshots, those of other triggers (a restore's backup) and every tagged snapshot always stay.
Forgetting deletes only snapshot files; gc then removes the objects no remaining snapshot references, and
nothing else.
"""

from __future__ import annotations

from envvault.model.records import dataclass
from pathlib import Path
from typing import Iterable

from envvault.vault.store import SnapshotRef, Vault

__all__ = ["AUTOMATIC_TRIGGERS", "RetentionResult", "plan_retention", "apply_retention"]

AUTOMATIC_TRIGGERS = frozenset({"guard"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionResult:
    venv: str
    kept: int
    forgotten: tuple[str, ...]
    gc: dict | None = None  # gc's report, when it ran

    def to_json(self) -> dict:
        return {"venv": self.venv, "kept": self.kept, "forgotten": list(self.forgotten), "gc": self.gc}


def plan_retention(snapshots: Iterable[SnapshotRef], venv: str, tagged: set[str], keep: int,
                   slack: int = 0, interpreter: str | None = None) -> list[str]:
    """Ids of the automatic snapshots of ``venv`` beyond the newest ``keep`` (tagged ones never), or none
    while there are at most ``keep + slack`` of them (so gc runs once per ``slack`` snapshots, not each time).
    ``interpreter``: of a system environment, only that interpreter's count (several may share a root)."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    auto = [s for s in snapshots if s.snapshot.venv == venv and s.snapshot.trigger in AUTOMATIC_TRIGGERS
            and (interpreter is None or s.snapshot.system_interpreter == interpreter)]
    if len(auto) <= keep + slack:
        return []
    auto.sort(key=lambda s: (s.created, s.id), reverse=True)
    return [s.id for s in auto[keep:] if s.id not in tagged]


def _forget(vault: Vault, ids: list[str]) -> list[str] | None:
    """Delete the snapshot files of ``ids`` under the exclusive vault lock, taken without waiting (None when it
    is busy: while another snap or restore runs, retention waits for the next guarded command instead); the
    ids deleted. A snapshot tagged since the plan was made (``tag`` holds the shared lock) stays, and so does
    one a running guard's rollback needs (``vault.gc.guarded_snapshots``: another guard of the path on another
    node of a bucket vault)."""
    from envvault.vault.gc import guarded_snapshots

    with vault.lock(exclusive=True, wait=False) as held:
        if not held:
            return None
        kept = set(vault.tags().values()) | guarded_snapshots(vault)
        dropped = [sid for sid in ids if sid not in kept]
        for sid in dropped:
            vault.delete_snapshot(sid)  # a StorageError (read-only, permission) says what to do
        return dropped


def apply_retention(vault: Vault, venv: Path, *, keep: int, slack: int | None = None,
                    gc: bool = True, interpreter: str | None = None) -> RetentionResult:
    """Forget the automatic snapshots of ``venv`` that the policy drops, then let gc delete the objects
    no remaining snapshot references (gc keeps every remaining snapshot whole). ``slack`` (default
    ``keep // 2``): how many extra automatic snapshots may gather before a round of forgetting and gc."""
    snapshots = vault.snapshots()
    slack = keep // 2 if slack is None else slack
    drop = plan_retention(snapshots, str(venv), set(vault.tags().values()), keep, slack, interpreter)
    mine = sum(1 for s in snapshots if s.snapshot.venv == str(venv)
               and (interpreter is None or s.snapshot.system_interpreter == interpreter))
    drop = _forget(vault, drop) if drop else None
    if not drop:
        return RetentionResult(venv=str(venv), kept=mine, forgotten=())
    report = None
    if gc:
        from envvault.vault.gc import collect_garbage

        report = collect_garbage(vault).to_json()
    return RetentionResult(venv=str(venv), kept=mine - len(drop), forgotten=tuple(drop), gc=report)
