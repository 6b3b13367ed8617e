"""Which vault snapshot names the environment a stamping process started with: found through the stamp
index, else a lock-only snapshot taken now and a detached ``envvault snap`` that stores the files. The way
back, from a stamped checkpoint to its snapshot, is :mod:`envvault.torch.resolve`.

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
from pathlib import Path

from envvault.errors import EnvvaultError
from envvault.torch import stamp_index
from envvault.torch.environment import EnvState

__all__ = ["find_snapshot", "ensure_snapshot", "spawn_full_snapshot"]


def find_snapshot(vault, fingerprint: str, venv: str | None = None, *, unedited: bool = False
                  ) -> tuple[str, bool] | None:
    """``(id, lock_only)`` of the best snapshot with this lock-level fingerprint (of the environment at
    ``venv`` when given: an identical copy elsewhere would make ``restore`` target that copy), or None.
    ``unedited``: only one that records no file edited in place."""
    facts = stamp_index.snapshot_facts(vault)
    matches = [(entry.rank(), sid) for sid, entry in facts.items()
               if entry.lock_fingerprint == fingerprint and (venv is None or entry.venv == venv)
               and not (unedited and entry.fingerprint != entry.lock_fingerprint)]
    if not matches:
        return None
    _rank, sid = max(matches)
    return sid, facts[sid].lock_only


def _choose(vault, state: EnvState) -> tuple[str, bool] | None:
    """``find_snapshot``'s answer, unless the environment's ``status`` baseline (what it was last snapped as
    or restored to) is another full snapshot of this fingerprint with other contents and the environment is
    known to be in it: snapshots of one fingerprint differ in files edited in place (a patched torch
    snapped, then the clean one restored: the newest full one is the patch the run never had). Known: its
    last ``status``, snap or verified restore found it equal to the baseline, with no file changed since
    (``verdict.unchanged_since``, the quick ``status``'s check: a local vault, a venv). That check reads a
    stat of every file, so it runs only when the two differ (never in the common case of one content).
    A full snapshot recording edits that is not the baseline is named only when the environment holds those
    edits now (``_edits_present``: the few edited files hashed); else the best one without edits, or none
    (a lock-only snapshot is then taken): a restore's backup holding a patch the run never had, the only
    snapshot of its fingerprint, was named (helper 31)."""
    from envvault.restore.baseline import baseline_snapshot

    found = find_snapshot(vault, state.fingerprint, state.prefix)
    if found is None or found[1]:
        return found
    try:
        base = baseline_snapshot(vault, Path(state.prefix))
    except EnvvaultError:
        base = None
    if base == found[0]:
        return found
    facts = stamp_index.snapshot_facts(vault)
    entry = facts.get(base) if base is not None else None
    if entry is not None and entry.lock_fingerprint == state.fingerprint and not entry.lock_only:
        if _contents(vault, base) == _contents(vault, found[0]):
            return found
        if _known_in(vault, state, base):
            return base, False
    chosen = facts.get(found[0])
    if chosen is None or chosen.fingerprint == chosen.lock_fingerprint or _edits_present(vault, state, found[0]):
        return found
    return find_snapshot(vault, state.fingerprint, state.prefix, unedited=True)


def _known_in(vault, state: EnvState, base: str) -> bool:
    """Whether the environment is known to hold ``base`` now (its verdict, ``verdict.unchanged_since``)."""
    from envvault.snap.verdict import unchanged_since
    from envvault.vault.local import LocalBackend

    if type(vault.backend) is not LocalBackend:  # a bucket keeps no verdicts
        return False
    try:
        hit = unchanged_since(vault.backend.root, str(state.prefix))
    except (EnvvaultError, OSError):
        return False
    return hit is not None and hit[1].snapshot == base


def _edits_present(vault, state: EnvState, sid: str) -> bool:
    """Whether the files snapshot ``sid`` recorded as edited in place hold those bytes now, and those it
    recorded deleted are gone: a few files hashed (an edited ``cacert.pem``; paths as the manifest parser
    checked them, relative and without ``..``). False when anything cannot be read."""
    import hashlib

    from envvault.model.record import record_sha256
    from envvault.vault.fsutil import open_regular_fd

    prefix = Path(state.prefix)
    try:
        for p in vault.load_snapshot(sid).snapshot.packages:
            if not p.modified and not p.missing:
                continue
            for f in vault.load_manifest(p.manifest).files:
                path = prefix / f.path
                if f.state == "missing" and os.path.lexists(path):
                    return False
                if f.state != "modified":
                    continue
                fd = open_regular_fd(str(path))
                if fd is None:
                    return False
                with os.fdopen(fd, "rb") as fh:
                    h = hashlib.sha256()
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
                if record_sha256(h.digest()) != f.sha256:
                    return False
    except (EnvvaultError, OSError):
        return False
    return True


def _contents(vault, sid: str) -> frozenset | None:
    """What the files of snapshot ``sid`` are: each package's state id (None when it cannot be read)."""
    try:
        return frozenset((p.name, p.state_id) for p in vault.load_snapshot(sid).snapshot.packages)
    except EnvvaultError:
        return None


def ensure_snapshot(vault, prefix: Path, state: EnvState, *, full_snapshot: bool = True,
                    runtime_path: list[str] | None = None) -> tuple[str, bool]:
    """``(id, lock_only)`` of a snapshot of ``state``: an existing one with its fingerprint (``_choose``: the
    one the environment is known to be in, else ``find_snapshot``'s), else a
    lock-only snapshot taken now and, with ``full_snapshot``, a detached ``envvault snap`` that vaults the
    files without making the caller wait.

    Concurrent callers (threads or processes) serialise on ``locks/stamp-<fingerprint>.lock`` and look again
    once they hold it, so they produce one snapshot between them. Raises :class:`EnvvaultError` when the
    vault cannot be written or the environment changed before it could be vaulted.
    """
    found = _choose(vault, state)
    if found:
        return found
    from envvault.snap import take_snapshot  # at the first stamp only (stamping starts with the interpreter)

    vault.state.ensure_locks_dir()
    with vault.state.lock(f"stamp-{state.fingerprint}"):
        found = _choose(vault, state)  # (another process may have taken one meanwhile)
        if found:
            return found
        result = take_snapshot(vault, prefix, lock_only=True, trigger="stamp", argv=list(sys.argv),
                               message=f"for checkpoint stamps (pid {os.getpid()})")
        # Indexes the new snapshot for the processes waiting on the lock, too.
        taken = stamp_index.snapshot_facts(vault).get(result.id)
        if taken is None or taken.lock_fingerprint != state.fingerprint:
            raise EnvvaultError(f"{prefix} changed before it could be vaulted (snapshot {result.id[:12]} has "
                                "another fingerprint); the stamp names no snapshot")
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

    log = vault.state.path("stamp-snap.log")
    # The environment stays the training process's (the snapshot records it); envvault's own import path
    # goes on the command line instead of PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "ENVVAULT_STAMP"}
    boot = boot_code(runtime_path)
    cmd = [sys.executable, "-c", boot, "--vault", vault.location, "snap", "--venv", str(prefix),
           "--no-caches", "-m", f"files for checkpoint stamps ({fingerprint[:12]})"]
    # sh starts the snap in the background and exits at once: the snap is re-parented, never a zombie here.
    subprocess.run(["/bin/sh", "-c", 'exec 2>>"$0"; "$@" </dev/null >/dev/null &', str(log), *cmd],
                   env=env, start_new_session=True, check=True, timeout=30)
