"""The in-place strategy: restore a snapshot onto the environment it names (docs/format.md, "Restoring an
environment (in place)").

Back up (``backup.py``), plan (``plan.make_plan``), decide every destination against the final tree, write
the journal (``journal.py``), stage every file beside its final path and commit (``apply.py``, through the
materializer), verify, drop the journal. A SIGKILL at any point leaves complete files under final names;
rerunning the restore re-plans from what is on disk, adds the journal's pending deletions, and completes.
Crash points ``journal``, ``staged``, ``committed`` and ``verified`` mark the moments of this flow.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path

from envvault.crashpoints import crash_point
from envvault.diff import diff_snapshots
from envvault.errors import EnvvaultError, UsageError
from envvault.journal import (Paths, clean_temps, exclusive_target, journal_file, read_journal, recover, remove_journal,
                              write_journal)
from envvault.materialize import refuse_escapes
from envvault.model.identity import is_bytecode
from envvault.model.journal import Journal
from envvault.model.snapshot import Snapshot
from envvault.model.records import replace
from envvault.safepaths import reserved_problem
from envvault.vault import timing
from envvault.restore.apply import (commit_plan, kind_changes, links_out, populate_statcache, remember_written,
                                    shares_inode, stage_plan, undo_staging)
from envvault.restore.backup import discard_backup, links_refused, scan_now
from envvault.env.probe import system_of, target_options
from envvault.restore.current import Layout, protected_dirs, read_current
from envvault.restore.managed import hold_managed
from envvault.restore.plan import check_python, make_plan, site_folders
from envvault.restore.pyvenv import apply_settings, settings_to_set
from envvault.output import ProgressSink
from envvault.restore.result import RestoreResult
from envvault.snap import scan_current, statcache_for
from envvault.vault.fsutil import storage_error
from envvault.vault.store import Vault

__all__ = ["restore_in_place"]


def restore_in_place(vault: Vault, sid: str, snapshot: Snapshot, target: Path, *, backup: bool, dry_run: bool,
                     progress: ProgressSink | None = None, remember=None) -> RestoreResult:
    """Restore ``snapshot`` (id ``sid``) onto the environment ``target`` (a ``restore.result.Strategy``)."""
    if not (target / "pyvenv.cfg").exists() and not (target / "bin" / "python").exists() and system_of(target) is None:
        raise UsageError(f"{target} is not a Python environment; pass --venv PATH or use --into NEW_PATH")
    with vault.lock(), (nullcontext() if dry_run else exclusive_target(vault, target)):
        vault.snapshot_still_there(sid)  # a gc it waited for may have deleted it
        jfile = journal_file(vault, target)  # a system environment's lies in the vault's state, not in its root
        journal = read_journal(jfile)
        resumed = journal is not None
        if resumed and not dry_run:
            recover(target, journal)
        earlier = journal or Journal(snapshot=None)
        take_backup = backup and not dry_run and not resumed
        clock = _Clock()
        # The target's stat cache: loaded once, passed through the backup or check scan, the files written
        # and the verify scan, saved once on every way out, but never after a backup that did not commit
        # (its groups would name manifests that were never stored).
        cache = statcache_for(vault, target)
        try:
            try:
                now, backup_id = scan_now(vault, target, sid, take_backup, cache=cache)
            except BaseException:
                if take_backup:
                    cache = None
                raise
            refused = links_refused(now, target) if take_backup else ()
            clock.lap("backup" if take_backup else "scan")
            if resumed:
                backup_id = journal.backup
            try:
                check_python(snapshot.python, now.python)
                interp = Layout.of(target, now.python)
                current = read_current(target, interp, now.packages, snapshot.packages)
                installed: dict = {}  # manifest id -> the manifest the plan read (remember_written)

                def manifest_of(mid: str):
                    if mid not in installed:
                        installed[mid] = vault.load_manifest(mid)
                    return installed[mid]

                def plan_for(unlinked=()):
                    return make_plan(sid, snapshot, now, current, manifest_of,
                                     pending_removals=list(earlier.removals) + list(earlier.writes),
                                     shared=lambda rel, mode: shares_inode(os.path.join(target, rel), mode, str(target)),
                                     unlinked=unlinked)

                plan = plan_for()
                # A package folder linked out of the environment (an installer's cache) that the writes need:
                # a folder takes its place (planned again: every file under it written, none kept)
                sites = site_folders(now.python)  # (never the snapshot's word: a vault may be anyone's)
                while (unlinked := links_out(target, plan, sites)) != plan.unlinked:
                    plan = plan_for(unlinked)
                if plan.unlinked:
                    plan = replace(plan, warnings=plan.warnings + tuple(_unlinked_note(target, rel) for rel in plan.unlinked))
                plan = hold_managed(plan, target, now, snapshot, current)  # a system environment's dpkg files stay
                # The venv's own interpreter and pyvenv.cfg are never deleted, whatever a RECORD or journal lists.
                scripts = {"bin", os.path.relpath(interp.scripts, target).replace(os.sep, "/")}
                kept = tuple(r for r in plan.removals if reserved_problem(r, scripts) is None)
                if len(kept) != len(plan.removals):
                    plan = replace(plan, removals=kept)
                # The venv's pyvenv.cfg settings the snapshot recorded otherwise (include-system-site-packages...)
                settings = {} if now.python.system else settings_to_set(target, snapshot.python)
                paths = Paths(target)
                # Every entry decided against the tree as the restore leaves it (its own symlinks included).
                refuse_escapes(target, f"refusing to restore {sid[:12]}",
                               links={w.path: w.link for w in plan.writes if w.link is not None},
                               entries=[w.path for w in plan.writes if w.link is None], dirs=plan.unlinked,
                               scripts=scripts)
                changes = kind_changes(target, plan)  # a user's file in a folder in the way refuses it
            except BaseException:
                if take_backup:
                    discard_backup(vault, backup_id)
                raise
            if dry_run:  # the files the commit would delete: RECORD rows of bytecode never written are not there
                there = sum(os.path.lexists(os.path.join(target, r)) for r in plan.removals if not is_bytecode(r))
                return RestoreResult(sid, str(target), "in-place", None, plan.changed, False, True,
                                     len(plan.writes), plan.bytes, there, plan=plan.to_json(),
                                     warnings=plan.warnings)
            if plan.empty and not resumed and not settings:
                discard_backup(vault, backup_id if take_backup else None)
                return RestoreResult(sid, str(target), "in-place", None, 0, plan.diff.packages_empty, False,
                                     plan=plan.to_json(), remaining=None if plan.diff.packages_empty else plan.diff.to_json(),
                                     warnings=plan.warnings)
            clock.lap("plan")
            pid = os.getpid()
            write_journal(jfile, Journal(
                snapshot=sid, backup=backup_id, pid=pid, started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                staging_dirs=tuple(sorted(set(plan.staging_dirs()) | set(earlier.staging_dirs)
                                          | {os.path.dirname(d) for d in plan.remove_dirs} | changes.staging_dirs())),
                removals=tuple(plan.removals), writes=tuple(w.path for w in plan.writes),
                dist_infos=tuple(plan.dist_infos),
                protected=tuple(sorted(os.path.relpath(d, target) for d in protected_dirs(target, interp))),
            ))
            crash_point("journal")
            created: list[str] = []
            try:
                clean_temps(target, list(earlier.staging_dirs) + plan.staging_dirs(), paths, keep_pid=pid)
                staged = stage_plan(vault, plan, paths, pid, progress, created, changes)
            except BaseException:
                # Nothing was renamed into place: leave the environment as this run found it (a full disk must
                # not leave empty package folders that import as empty packages).
                undo_staging(jfile, created, keep_journal=resumed)
                if take_backup:
                    discard_backup(vault, backup_id)
                raise
            crash_point("staged")
            clock.lap("stage")
            try:
                removed, modes_set = commit_plan(plan, staged, paths, protected_dirs(target, interp), changes)
                apply_settings(target, settings)  # one file replaced whole; a restore run again sets what is left
            except (EnvvaultError, OSError) as caught:
                # Part committed, the journal kept: the error line says so, and how to finish (helpers 34, 35).
                err = caught if isinstance(caught, EnvvaultError) else storage_error(caught, caught.filename or target)
                err.args = (f"{err}; the restore stopped part way (its staged files and journal are kept): once "
                            f"that is fixed, run `{vault.command('restore', sid[:12], *target_options(target))}` "
                            "to finish it",)
                raise err from None
            populate_statcache(vault, target, staged, cache)  # what the verify scan compares by lstat
            if not now.python.system:  # a system environment's groups name their site (scan._build_one)
                remember_written(cache, target, installed, snapshot.packages)  # what it need not build again
            crash_point("committed")
            clock.lap("commit")
            after = scan_current(vault, target, facts=False, cache=cache, save_cache=False)
            remaining = diff_snapshots(after, snapshot, vault=vault, old_label="current", new_label=sid[:12], scope="environment")
            remove_journal(jfile)
            crash_point("verified")
            clock.lap("verify")
        finally:
            if cache is not None:
                _save_cache(cache, pruned=take_backup)
        # The cache saved: the verdict can name its file. Under the restore lock still: a status or snap that
        # waited for this restore (journal.wait_for_restore) finds the snapshot restored as the baseline.
        if remember is not None and remaining.packages_empty:
            remember(cache if remaining.empty else None)
    warnings = list(plan.warnings)
    if snapshot.venv and snapshot.venv != str(target) and any(w.path.startswith(_scripts_rel(snapshot)) for w in plan.writes):
        warnings.append(f"the snapshot was taken of {snapshot.venv}: scripts restored into bin/ keep that "
                        "environment's interpreter in their first line; use --into for a relocated copy")
    for k, (o, n) in remaining.python.items():
        warnings.append(f"python {k} is {o}, the snapshot had {n}")
    return RestoreResult(
        sid, str(target), "in-place", backup_id, plan.changed, remaining.packages_empty, False,
        len(staged), plan.bytes, removed, plan=plan.to_json(),
        remaining=None if remaining.packages_empty else remaining.to_json(), warnings=tuple(warnings),
        timings=clock.laps, modes_set=modes_set,
        settings_set=tuple(f"{k} = {'(absent)' if v is None else v}" for k, v in settings.items()),
        backup_refused=refused,
    )


def _unlinked_note(target: Path, rel: str) -> str:
    try:
        where = os.readlink(os.path.join(target, rel))
    except OSError:
        where = "?"
    return (f"{rel} is a symlink out of the environment (to {where}, an installer's cache?): a folder of the "
            "snapshot's files takes its place; what it leads to is left as it is")


def _save_cache(cache, pruned: bool) -> None:
    """Save the restore's stat cache. After a backup snap, as after any snap, the file entries no scan or
    write of this run used are dropped (files gone since); after a check scan every entry is kept (other
    scans, cache trees, rely on them), as a check scan's own save does."""
    if not pruned:
        cache.touch(list(cache.files))
    cache.save()


class _Clock:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self._last, 3)
        if timing.ON:
            timing.add(f"restore: {name}", time.perf_counter() - (now - self._last))
        self._last = now


def _scripts_rel(snapshot: Snapshot) -> str:
    return (snapshot.python.scripts or "bin").rstrip("/") + "/"
