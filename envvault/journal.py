"""The restore journal on disk and what a killed restore leaves behind (docs/format.md, "Restoring an
environment", steps 3 and 6): reading, writing and removing ``<venv>/.envvault-restore.json`` (the record is
``model.journal.Journal``), the staged temp names (``.<name>.envvault-<pid>.tmp``), the restore lock of an
environment, and tidying what a killed restore half-made. ``journal_file`` says where the journal lies: in a
venv, and in the vault's machine-local state for a system environment (whose root may be ``/``). Below ``restore/`` (which restores) and ``snap``
(whose scans tidy first), so neither imports the other for it."""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import blake3

from envvault.errors import CorruptError, EnvironmentProblem, EnvvaultError, RefusedError
from envvault.model.encoding import json_loads, parse_json
from envvault.model.journal import Journal, parse_journal
from envvault.safepaths import FinalTree, env_key
from envvault.vault.fsutil import fsync_dir, read_regular, storage_error
from envvault.vault.store import Vault

__all__ = [
    "JOURNAL_NAME",
    "JOURNAL_LIMIT",
    "exclusive_target",
    "interrupted_restore",
    "wait_for_restore",
    "is_dist_info_name",
    "journal_file",
    "Paths",
    "TMP_RE",
    "read_journal",
    "write_journal",
    "remove_journal",
    "tmp_for",
    "clean_temps",
    "prune_empty",
    "recover",
    "target_lock",
    "settle_interrupted",
]

JOURNAL_NAME = ".envvault-restore.json"  # in the environment while a restore is under way (docs/format.md)
JOURNAL_LIMIT = 256 << 20  # a journal lists every file a restore writes or deletes; read no more than this
TMP_RE = re.compile(r"^\..+\.envvault-(\d+)\.tmp$")


def journal_file(vault: Vault, target: Path) -> Path:
    """Where the journal of a restore of ``target`` lies (docs/format.md): ``<venv>/.envvault-restore.json``,
    or for a system environment (registered by ``--python``; its root may be ``/``, which the user need not
    be able to write) the vault's ``state/journal-<key>.json``."""
    from envvault.env.probe import system_of

    if system_of(target) is not None:
        return vault.state.path(f"journal-{env_key(target)}.json")
    return Path(target) / JOURNAL_NAME


def read_journal(path: Path) -> Journal | None:
    """The journal at ``path`` (``journal_file``) of a restore under way, or None. One that does not parse is
    salvaged (``Journal.salvage``): a rerun still uses what it can read of it."""
    try:
        data = read_regular(path, JOURNAL_LIMIT, str(path))
    except FileNotFoundError:
        return None
    except CorruptError as err:  # a link, a FIFO, a device or a huge file where the journal should be
        raise EnvironmentProblem(f"{err}; move it away and run again") from None
    except OSError as err:
        raise EnvironmentProblem(f"cannot read {path}: {err.strerror}") from None
    try:
        doc = parse_json(data, str(path))
    except CorruptError:
        return Journal.salvage(None)
    try:
        return parse_journal(doc, str(path))
    except CorruptError:
        return Journal.salvage(doc)


def write_journal(path: Path, journal: Journal) -> None:
    """At ``path`` (``journal_file``): temp name that a rerun's cleanup recognises, fsync, rename, fsync the
    folder."""
    final = str(path)
    tmp = tmp_for(final, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(json.dumps(journal.to_dict(), separators=(",", ":")).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(Path(path).parent)
    except OSError as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        # A system environment's journal is one of the vault's state files (``journal_file``).
        raise storage_error(err, final, vault=Path(path).name != JOURNAL_NAME) from None


def remove_journal(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Paths:
    """Maps manifest paths to absolute ones, refusing any whose folders resolve outside the target as it is
    on disk now (the rule is ``envvault.safepaths.FinalTree``; a restore's own entries are checked against
    the final tree in ``_restore_in_place``)."""

    def __init__(self, target: Path):
        self.target = target
        self.tree = FinalTree(target)

    def check(self, rel: str) -> str | None:
        return self.tree.write_problem(rel)

    def abs(self, rel: str) -> str:
        return os.path.join(self.target, rel)


def tmp_for(abs_path: str, pid: int) -> str:
    d, name = os.path.split(abs_path)
    if len(name) > 200:
        name = name[:150] + "~" + blake3.blake3(name.encode()).hexdigest()[:12]
    return os.path.join(d, f".{name}.envvault-{pid}.tmp")


def clean_temps(target: Path, rel_dirs, paths: Paths, *, keep_pid: int | None = None) -> int:
    n = 0
    for rel in set(rel_dirs):
        if not isinstance(rel, str) or (rel and paths.check(rel + "/x") is not None):
            continue
        try:
            entries = os.listdir(paths.abs(rel) if rel else target)
        except OSError:
            continue
        for name in entries:
            m = TMP_RE.match(name)
            if m and (keep_pid is None or int(m.group(1)) != keep_pid):
                full = os.path.join(paths.abs(rel) if rel else target, name)
                try:
                    if os.path.isdir(full) and not os.path.islink(full):
                        import shutil  # here: status imports this module and rarely cleans anything

                        shutil.rmtree(full)  # a dist-info folder renamed away for deletion
                    else:
                        os.unlink(full)
                    n += 1
                except OSError:
                    pass
    return n


def prune_empty(dirs: set[str], protected: set[str]) -> None:
    """Remove directories left empty by deletions, bottom-up, never a protected one (prefix, site-packages, bin)."""
    for d in sorted(dirs, key=len, reverse=True):
        while d not in protected and len(d) > 1:
            try:
                os.rmdir(d)
            except OSError:
                break
            d = os.path.dirname(d)


def is_dist_info_name(rel: str) -> bool:
    """Whether the last component of ``rel`` names a dist-info folder (``<name>-<version>.dist-info``): the
    only kind of folder a journal may ask ``recover`` to remove (the planner journals no other)."""
    name = rel.rpartition("/")[2]
    return name.endswith(".dist-info") and len(name) > len(".dist-info")


def recover(target: Path, journal: Journal) -> None:
    """Undo what a killed restore left half-made, before the environment is scanned: staged temp files,
    dist-info folders it had begun to create (no METADATA or RECORD yet) and the folders made for them.
    Everything else it did is complete and is judged again by the new plan."""
    paths = Paths(target)
    dirs = list(journal.staging_dirs)
    clean_temps(target, dirs + [""], paths)
    for rel in journal.dist_infos:
        if not isinstance(rel, str) or not is_dist_info_name(rel) or paths.check(rel) is not None:
            continue  # only a dist-info folder is ever removed (a journal is the vault's word, not ours)
        full = paths.abs(rel)
        if os.path.isdir(full) and not os.path.islink(full) and not (
                os.path.exists(os.path.join(full, "METADATA")) and os.path.exists(os.path.join(full, "RECORD"))):
            import shutil

            shutil.rmtree(full, ignore_errors=True)
    protected = {str(target)} | {os.path.normpath(paths.abs(d)) for d in journal.protected
                                 if d == "." or paths.check(d) is None}
    prune_empty({paths.abs(d) for d in dirs if d and paths.check(d) is None}, protected)


@contextmanager
def target_lock(vault: Vault, target: Path) -> Iterator[bool]:
    """Hold ``locks/restore-<key>.lock`` of ``target`` without waiting: yields False when another process
    (a restore running now) holds it."""
    with vault.state.lock(_restore_lock(target), exclusive=True, wait=False) as held:
        yield held


def _restore_lock(target: Path) -> str:
    """The name of ``target``'s restore lock (``locks/restore-<key>.lock``)."""
    return f"restore-{env_key(target)}"


@contextmanager
def exclusive_target(vault: Vault, target: Path) -> Iterator[None]:
    """Hold the restore lock of ``target`` (``target_lock``) for a restore in place or ``--into``; a
    RefusedError when another restore of it runs."""
    with target_lock(vault, target) as held:
        if not held:
            raise RefusedError(f"another envvault restore of {target} is running; wait for it to finish")
        yield


def wait_for_restore(vault: Vault, target: Path) -> None:
    """When a restore of ``target`` runs now (its journal there, its restore lock held by another process),
    wait until it has ended, saying so once on stderr (Ctrl-C stops waiting): a ``status`` or ``snap`` of the
    environment part way through a restore answered about a tree no one wants (a dist-info folder between its
    old and new files: "reinstall that package"; a snapshot of the half-restored tree; helper 23, F3). Called
    by a process that holds neither lock."""
    if not os.path.lexists(journal_file(vault, target)):
        return
    key = _restore_lock(target)  # taken shared here: a restore's exclusive hold is what is waited for
    try:
        with vault.state.lock(key, exclusive=False, wait=False) as held:
            if held:
                return  # none running: an interrupted one, which the scan settles and status reports
        import sys

        try:
            sys.stderr.write(f"envvault: waiting for the restore of {target} that is running to finish; Ctrl-C "
                             "stops waiting\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        with vault.state.lock(key, exclusive=False, wait=True):
            pass
    except (EnvvaultError, OSError):
        return  # no lock to ask (an unwritable locks/): the scan goes on as before


def settle_interrupted(vault: Vault, target: Path) -> str | None:
    """When a restore of ``target`` was killed (its journal is there) and none is running now, clean what
    it half-made (staged files, unfinished dist-info folders, empty folders made for them) so that no empty
    package imports meanwhile. The journal stays: ``status`` reports the restore as unfinished and the next
    restore completes it. Returns the interrupted restore's snapshot id, or None. Never fails the caller."""
    target = Path(target)
    path = journal_file(vault, target)
    if not os.path.lexists(path):
        return None
    journal = None
    try:
        journal = read_journal(path)
        if journal is None:
            return None
        with target_lock(vault, target) as held:
            if held:  # else a restore is running right now: its staged files are its own
                recover(target, journal)
    except (EnvvaultError, OSError):
        pass
    sid = journal.snapshot if journal is not None else None
    return sid if isinstance(sid, str) else "unknown"


def interrupted_restore(path: Path) -> str | None:
    """The snapshot id of the restore whose journal is at ``path`` (``journal_file``), killed before it
    finished, if any."""
    try:
        doc = json_loads(read_regular(Path(path), JOURNAL_LIMIT, "the restore journal"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EnvvaultError):
        return "unknown"
    sid = Journal.salvage(doc).snapshot
    return sid if sid is not None else "unknown"
