"""Which snapshot an environment should match now: what ``status`` compares against.

That is the newest environment snapshot of the environment (backups a restore took excluded; cache-only
snapshots never) or, when newer, the snapshot most recently restored onto it (a guard's rollback included).
The latter is remembered under the vault's ``state/`` (a cache: losing it only makes ``status`` fall back to
the newest snapshot).
"""

from __future__ import annotations

import json
from pathlib import Path

from envvault.errors import EnvvaultError, NotFoundError
from envvault.snap.verdict import is_restored_name, restored_name
from envvault.vault.fsutil import atomic_write, read_regular
from envvault.model.encoding import json_loads, utc_timestamp
from envvault.model.heads import head_of
from envvault.vault.heads import newest_head
from envvault.vault.store import Vault

__all__ = ["baseline_snapshot", "record_restored", "leave_verdict", "environment_latests"]



def _of_interpreter(exe: str | None):
    """A test of a snapshot: of the system interpreter ``exe``? Only its own snapshots count. Always true for
    a venv (``exe`` None) and for snapshots that name no interpreter."""
    return lambda snap: exe is None or not snap.system or snap.interpreter in (None, exe)


def _snap_command(vault: Vault, target: Path) -> str:
    """The command that snaps ``target`` into ``vault``: a system root through its interpreter."""
    from envvault.env.probe import target_options

    return vault.command("snap", *target_options(target))


def _markers(vault: Vault, target: Path, exe: str | None) -> list[Path]:
    """The ``restored-`` markers of ``target`` (a system interpreter's own first; an older vault's one per
    root after it)."""
    return [vault.state_path(restored_name(target, exe))] + ([vault.state_path(restored_name(target))] if exe else [])


def record_restored(vault: Vault, target: Path, sid: str) -> None:
    """Remember that ``target`` (with the system interpreter in use there: each its own) now holds snapshot
    ``sid``. Never fails the caller."""
    from envvault.env.probe import system_interpreter

    try:
        data = json.dumps({"snapshot": sid, "venv": str(target), "at": utc_timestamp()}).encode()
        marker = _markers(vault, target, system_interpreter(target))[0]
        atomic_write(marker, data, tmp_dir=vault.state.tmp_dir, vault=True)
    except EnvvaultError:
        pass


def baseline_snapshot(vault: Vault, target: Path, interpreter: str | None = None) -> str:
    """The id of the snapshot ``target`` should match; ``NotFoundError`` when it has none. ``interpreter``:
    that system interpreter's (of those sharing the root ``target``), else the one in use there."""
    from envvault.env.probe import system_interpreter

    target = Path(target)
    exe = interpreter or system_interpreter(target)
    mine = _of_interpreter(exe)

    def ours(h) -> bool:  # an environment snapshot of it (a `cache snap --venv` of it is not)
        return h.venv == str(target) and h.kind == "snapshot" and mine(h)

    own = newest_head(vault, lambda h: ours(h) and h.trigger != "restore-backup") or newest_head(vault, ours)
    best = (own[1].created, own[0]) if own else None
    for marker in _markers(vault, target, exe):
        try:
            got = json_loads(read_regular(marker, 1 << 20, "restored marker"))
            sid, at = got["snapshot"], got["at"]
            if isinstance(sid, str) and vault.has_snapshot(sid) and (best is None or at > best[0]) \
                    and mine(head_of(vault.load_snapshot(sid).snapshot)):
                best = (at, sid)
        except (OSError, ValueError, KeyError, TypeError, EnvvaultError):
            pass
    if best is None:
        raise NotFoundError(f"no snapshot of {target} in {vault.location}; run `{_snap_command(vault, target)}` "
                            "first")
    return best[1]


def environment_latests(vault: Vault) -> dict[tuple[str, str | None], str]:
    """``{(environment, system interpreter or None): its baseline}`` for every environment the vault knows
    here: those its environment snapshots name (a system root once per interpreter whose snapshots it holds),
    and those here a restore was made onto (``record_restored``: ``--into`` a new folder, or another
    environment's snapshot), whichever environment's snapshot the baseline is. For gc."""
    from envvault.vault.heads import snapshot_heads

    targets = {(h.venv, h.interpreter if h.system else None)
               for _, h in snapshot_heads(vault) if h.kind == "snapshot" and h.venv}
    roots = {venv for venv, who in targets if who is not None}  # a restore onto one: each interpreter's own
    for name in vault.state.names():
        if is_restored_name(name):
            try:
                venv = json_loads(vault.state.read(name, 1 << 20) or b"")["venv"]
            except (ValueError, KeyError, TypeError, EnvvaultError):
                continue
            # A folder since deleted needs nothing kept.
            if isinstance(venv, str) and venv and venv not in roots and Path(venv).is_dir():
                targets.add((venv, None))
    out = {}
    for venv, who in targets:
        try:
            out[(venv, who)] = baseline_snapshot(vault, Path(venv), interpreter=who)
        except EnvvaultError:
            pass
    return out


def leave_verdict(vault: Vault, cache, target: Path, sid: str) -> None:
    """After a command that left the environment at ``target`` equal to snapshot ``sid`` (a snap, a verified
    restore) and saved ``cache``, the stat cache of the scan that found it so: the verdict the next ``status``
    answers from (``snap/verdict.py``), when ``sid`` is now the environment's baseline. Never fails."""
    from envvault.snap.verdict import record_verdict, verdict_stamp

    try:
        stamp = verdict_stamp(vault, target)  # before the baseline is chosen
        if stamp is not None and baseline_snapshot(vault, target) == sid:
            record_verdict(vault, cache, target=target, sid=sid, note=None, stamp=stamp)
    except (EnvvaultError, OSError):
        pass  # a cache: the next status answers in full
