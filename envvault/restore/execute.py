"""Carry out a restore. The only code in envvault that changes an environment.

In place (see docs/format.md, "Restoring an environment"): back up, plan (``plan.make_plan``), check every
destination against symlinks that lead out, write a journal, stage every file next to its final path as
``.<name>.envvault-<pid>.tmp`` (bytes from the vault, BLAKE3 per object and sha256 per file checked while
writing), rename the staged files into place, delete what the snapshot lacks, verify, drop the journal.
A SIGKILL at any point leaves complete files under final names; rerunning the restore re-plans from what is
on disk, adds the journal's pending deletions, and completes.

``--into`` builds a fresh venv with uv from rebuilt wheels; lock-only snapshots go through uv
(``envvault.restore.uv``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from envvault.crashpoints import crash_point as _crash_point
from envvault.diff import current_document, diff_snapshots
from envvault.errors import CorruptError, EnvironmentProblem, RefusedError, UsageError
from envvault.restore.baseline import record_restored
from envvault.restore.journal import (
    JOURNAL_NAME, Paths, clean_temps, prune_empty, read_journal, recover, remove_journal, settle_interrupted, str_list,
    tmp_for, write_journal,
)
from envvault.restore.plan import CurrentDist, FileWrite, Plan, check_python, is_pyc, make_plan
from envvault.restore.result import RestoreResult
from envvault.safepaths import FinalTree, env_key
from envvault.vault.fsutil import flocked, makedirs_recording, storage_error
from envvault.vault.ingest import b64_sha256
from envvault.vault.store import ObjectReader, Vault

__all__ = ["RestoreResult", "restore_snapshot", "read_current", "settle_interrupted", "JOURNAL_NAME"]

_BATCH_BYTES = 16 << 20  # staging work is handed to threads in runs of about this many bytes
_WORKERS = max(1, min(4, os.cpu_count() or 1))

Progress = Callable[[int], None]


# -- reading objects, one frame cache per thread ---------------------------------------------------


# -- the environment now ---------------------------------------------------------------------------


def _pack_order(reader: ObjectReader, w: FileWrite) -> tuple:
    """Where a file's first chunk lies: writing files in pack order keeps each frame read once."""
    loc = reader.index.get(w.chunks[0]) if w.chunks else None
    return (loc[0], loc[1], loc[3]) if loc else ("", 0, 0)


def read_current(prefix: Path, interp, packages: list[dict], wanted: list[dict] | None = None) -> list[CurrentDist]:
    """Pair each package summary of a scan with its RECORD, as ``CurrentDist`` records for the planner.
    Unhashed RECORD rows (RECORD itself) are hashed only for packages not identical to one in ``wanted``
    (the snapshot's packages): those are the only ones a restore may rewrite."""
    from envvault.env.dists import scan_dists

    same = {(p["name"], p["version"], p.get("build_id"), p.get("state_id")) for p in wanted or ()}
    base = f"{prefix}/"
    dists = scan_dists([interp.purelib, interp.platlib])
    by_key: dict[tuple[str, str], list] = {}
    for d in dists:
        by_key.setdefault((d.name, d.version), []).append(d)
    out = []
    for p in packages:
        cands = by_key.get((p["name"], p["version"])) or []
        d = cands.pop(0) if cands else None
        if d is None or d.record is None:
            out.append(CurrentDist(p, None, {}, has_record=False))
            continue
        untouched = (p["name"], p["version"], p.get("build_id"), p.get("state_id")) in same
        bad = set(p.get("modified") or ()) | set(p.get("missing") or ())
        files: dict[str, str | None] = {}
        site = f"{d.site}/"
        for e in d.record:
            absolute = os.path.normpath(site + e.path)
            if not absolute.startswith(base):
                continue  # outside the environment: never deleted by a restore
            rel = absolute[len(base):]
            if e.algo == "sha256" and e.digest:
                files[rel] = None if rel in bad else e.digest
            elif untouched or is_pyc(rel):
                files[rel] = None
            else:  # RECORD itself: hash it (small), so an unchanged one stays untouched
                files[rel] = _sha_of_small(absolute)
        di = str(d.dist_info)
        out.append(CurrentDist(p, di[len(base):] if di.startswith(base) else None, files))
    return out


def _sha_of_small(path: str, limit: int = 64 << 20) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return None if len(data) > limit else b64_sha256(hashlib.sha256(data).digest())


# -- journal ---------------------------------------------------------------------------------------


# -- paths -----------------------------------------------------------------------------------------


# -- staging and committing ------------------------------------------------------------------------


@dataclass
class _Staged:
    write: FileWrite
    tmp: str
    sha256: str | None


def _stage_one(reader: ObjectReader, paths: Paths, w: FileWrite, pid: int) -> _Staged:
    final = paths.abs(w.path)
    tmp = tmp_for(final, pid)
    try:
        if w.link is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            os.symlink(w.link, tmp)
            return _Staged(w, tmp, None)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        h = hashlib.sha256()
        size = 0
        try:
            for oid in w.chunks:
                data = reader.get(oid)
                h.update(data)
                size += len(data)
                while data:
                    n = os.write(fd, data)
                    data = data[n:]
            os.fchmod(fd, w.mode & 0o777)  # never setuid/setgid from a vault
        finally:
            os.close(fd)
    except OSError as err:
        raise storage_error(err, final) from None
    sha = b64_sha256(h.digest())
    if w.sha256 is not None and sha != w.sha256:
        raise CorruptError(f"{w.path} ({w.package}) restored from the vault does not match its recorded sha256; "
                           "nothing was renamed into place; run `envvault verify`")
    if size != w.size and w.chunks:
        raise CorruptError(f"{w.path} ({w.package}) restored with {size} bytes, the snapshot says {w.size}")
    _crash_point("stage")
    return _Staged(w, tmp, sha)


def _batches(writes: list[FileWrite]) -> Iterator[list[FileWrite]]:
    batch, size = [], 0
    for w in writes:
        batch.append(w)
        size += w.size + 4096
        if size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _makedirs(path: str, created: list[str]) -> None:
    makedirs_recording(path, created, lambda p: EnvironmentProblem(
        f"{p} is in the way: the snapshot needs a directory there; move it and run again"))


def _stage_all(vault: Vault, plan: Plan, paths: Paths, pid: int, progress: Progress | None,
               created: list[str]) -> list[_Staged]:
    """Create the folders the writes need (recorded in ``created``) and stage every write. On failure the
    staged files are deleted; the caller removes ``created``."""
    reader = ObjectReader(vault)
    for d in sorted({os.path.dirname(w.path) for w in plan.writes}):
        full = paths.abs(d) if d else str(paths.target)
        if os.path.islink(full) or (os.path.exists(full) and not os.path.isdir(full)):
            if os.path.islink(full) and os.path.isdir(full):
                continue  # a symlinked directory inside the target (checked by Paths)
            raise EnvironmentProblem(f"{full} is in the way: the snapshot needs a directory there; move it and run again")
        _makedirs(full, created)
    if progress is not None and hasattr(progress, "total"):
        progress.total = max(plan.bytes, 1)  # a Progress bar: now the real amount is known
    # Read the vault in pack order so each frame is decompressed once.
    ordered = sorted(plan.writes, key=lambda w: _pack_order(reader, w))
    staged: list[_Staged] = []
    done = 0

    def run(batch: list[FileWrite]) -> list[_Staged]:
        return [_stage_one(reader, paths, w, pid) for w in batch]

    try:
        with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
            for result in pool.map(run, _batches(ordered)):
                staged.extend(result)
                done += sum(s.write.size for s in result)
                if progress:
                    progress(done)
    except BaseException:
        for w in ordered:
            try:
                os.unlink(tmp_for(paths.abs(w.path), pid))
            except OSError:
                pass
        raise
    return staged


def _drop_bytecode(abs_py: str, seen: dict[str, list[str]]) -> None:
    """Delete ``__pycache__/<stem>.*.pyc`` of a source file we replaced or removed (a stale .pyc with the
    same source size and mtime second would otherwise win over the restored source)."""
    d, name = os.path.split(abs_py)
    stem = name[:-3]
    cache = os.path.join(d, "__pycache__")
    if cache not in seen:
        try:
            seen[cache] = os.listdir(cache)
        except OSError:
            seen[cache] = []
    for entry in seen[cache]:
        if entry.startswith(stem + ".") and entry.endswith(".pyc") and entry.count(".") == stem.count(".") + 2:
            try:
                os.unlink(os.path.join(cache, entry))
            except OSError:
                pass


def _commit(plan: Plan, staged: list[_Staged], paths: Paths, protected: set[str]) -> tuple[int, int]:
    """Rename staged files into place, set the modes of kept files, delete; returns (removed, modes set)."""
    pyc_seen: dict[str, list[str]] = {}
    parents: set[str] = set()
    for s in staged:
        final = paths.abs(s.write.path)
        try:
            os.rename(s.tmp, final)
        except IsADirectoryError:
            _rmdir_tree_if_empty(final)
            os.rename(s.tmp, final)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST) and os.path.isdir(final) and not os.path.islink(final):
                raise EnvironmentProblem(f"{final} is a non-empty directory where the snapshot has a file; move it and run again") from None
            raise storage_error(err, final) from None
        if final.endswith(".py"):
            _drop_bytecode(final, pyc_seen)
        _crash_point("commit")
    modes_set = 0
    for rel, mode in plan.keeps:  # files of changed packages whose bytes match: give them back their mode
        full = paths.abs(rel)
        try:
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode) and (st.st_mode & 0o777) != (mode & 0o777):
                os.chmod(full, mode & 0o777)  # never setuid/setgid from a vault
                modes_set += 1
        except OSError:
            pass  # gone or not ours: verification names what still differs
    removed = 0
    # Files inside a dist-info folder that goes away leave with the folder (renamed away whole, below), so
    # a kill never leaves a dist-info without METADATA or RECORD. Package files go first: until then the
    # dist-info still lists them, and after a kill the journal does.
    doomed_dirs = tuple(d + "/" for d in plan.remove_dirs)
    paths = Paths(paths.target)  # the tree has changed: judge removals against it as it is now
    for rel in plan.removals:
        if paths.check(rel) is not None or (doomed_dirs and rel.startswith(doomed_dirs)):
            continue
        full = paths.abs(rel)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                continue
            os.unlink(full)
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as err:
            raise storage_error(err, full) from None
        if full.endswith(".py"):
            _drop_bytecode(full, pyc_seen)
        parents.add(os.path.dirname(full))
        _crash_point("commit")
    for rel in plan.remove_dirs:
        if paths.check(rel) is not None:
            continue
        full = paths.abs(rel)
        if os.path.islink(full):
            os.unlink(full)
        elif os.path.isdir(full):
            # Renamed away first, so a kill mid-delete never leaves a dist-info without METADATA or RECORD.
            doomed = tmp_for(full, os.getpid())
            removed += sum(len(files) for _root, _dirs, files in os.walk(full))
            os.rename(full, doomed)
            _crash_point("remove_dir")
            shutil.rmtree(doomed, ignore_errors=True)
        parents.add(os.path.dirname(full))
        _crash_point("commit")
    for cache_dir in pyc_seen:
        parents.add(cache_dir)
    prune_empty(parents, protected)
    return removed, modes_set


def _rmdir_tree_if_empty(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        if files:
            raise EnvironmentProblem(f"{path} is a non-empty directory where the snapshot has a file; move it and run again")
        os.rmdir(root)


def _populate_statcache(vault: Vault, target: Path, staged: list[_Staged]) -> None:
    """Record the hashes computed while writing, so verification and the next status need not re-read."""
    from envvault.snap import statcache_for

    cache = statcache_for(vault, target)
    cache.touch(list(cache.files))
    for s in staged:
        if s.write.link is not None or s.sha256 is None:
            continue
        try:
            st = os.lstat(os.path.join(target, s.write.path))
        except OSError:
            continue
        cache.put(s.write.path, st, s.sha256, list(s.write.chunks))
    cache.save()


# -- locks -----------------------------------------------------------------------------------------


@contextmanager
def _target_lock(vault: Vault, target: Path) -> Iterator[None]:
    with flocked(vault.root / "locks" / f"restore-{env_key(target)}.lock", exclusive=True, wait=False) as held:
        if not held:
            raise RefusedError(f"another envvault restore of {target} is running; wait for it to finish")
        yield


# -- the entry point -------------------------------------------------------------------------------


def restore_snapshot(
    vault: Vault,
    sid: str,
    target: Path,
    *,
    backup: bool = True,
    dry_run: bool = False,
    into: Path | None = None,
    progress: Progress | None = None,
    caches: bool = True,
) -> RestoreResult:
    """Restore snapshot ``sid`` onto the environment ``target`` (or, with ``into``, into a new venv there).

    In place, untouched distributions keep every file as it is (mtimes included); changed ones are put
    back from vault objects only; distributions the snapshot lacks are removed. ``backup`` snapshots the
    environment first. Raises ``RefusedError`` for unsafe manifests or an interpreter mismatch.
    """
    started = time.monotonic()
    ref = vault.load_snapshot(sid)
    doc = ref.doc
    env_target = Path(into or target).absolute()
    if caches and doc.get("caches") and not dry_run:
        # Validate the cache manifests (paths, roots) before the environment is touched: a hostile cache
        # manifest must not leave a half-finished restore behind.
        _restore_caches(vault, doc, env_target, True)
    if into is not None:
        from envvault.restore.into import restore_into

        result = restore_into(vault, ref.id, doc, Path(into).absolute(), dry_run=dry_run, progress=progress)
    elif doc.get("lock_only"):
        from envvault.restore.uv import restore_lock_only

        result = restore_lock_only(vault, ref.id, doc, Path(target).absolute(), backup=backup, dry_run=dry_run)
    else:
        result = _restore_in_place(vault, ref.id, doc, Path(target).absolute(), backup=backup, dry_run=dry_run,
                                   progress=progress)
    if result.verified and not result.dry_run:
        record_restored(vault, Path(into or target).absolute(), ref.id)
    cache_result = None
    if caches and doc.get("caches"):
        cache_result = _restore_caches(vault, doc, env_target, dry_run)
    return replace(result, caches=cache_result, seconds=round(time.monotonic() - started, 3))


def _restore_caches(vault: Vault, doc: dict, target: Path, dry_run: bool) -> dict:
    """The snapshot's compile caches, through ``envvault.caches.restore`` (staged, inside each cache root)."""
    from envvault.caches.restore import restore_snapshot_caches

    return restore_snapshot_caches(vault, doc, venv=target, dry_run=dry_run).to_json()


def _scan_now(vault: Vault, target: Path, sid: str, backup: bool) -> tuple[dict, str | None]:
    """The environment's state, from a backup snapshot (one read of every new file) or a check scan."""
    if backup:
        from envvault.snap import take_snapshot

        snap = take_snapshot(vault, target, message=f"backup before restoring {sid[:12]}", trigger="restore-backup",
                             argv=["envvault", "restore", sid])
        return snap.doc, snap.id
    return current_document(vault, target, facts=False), None


def _discard_snapshot(vault: Vault, sid: str | None) -> None:
    """Drop a backup this run made but did not need (its objects become garbage for gc)."""
    if sid:
        try:
            os.unlink(vault.root / "snapshots" / f"{sid}.json")
        except OSError:
            pass


def _restore_in_place(vault: Vault, sid: str, doc: dict, target: Path, *, backup: bool, dry_run: bool,
                      progress: Progress | None) -> RestoreResult:
    if not (target / "pyvenv.cfg").exists() and not (target / "bin" / "python").exists():
        raise UsageError(f"{target} is not a Python environment; pass --venv PATH or use --into NEW_PATH")
    with vault.lock(), (_nullcontext() if dry_run else _target_lock(vault, target)):
        journal = read_journal(target)
        resumed = journal is not None
        if resumed and not dry_run:
            recover(target, journal)
        take_backup = backup and not dry_run and not resumed
        clock = _Clock()
        now_doc, backup_id = _scan_now(vault, target, sid, take_backup)
        clock.lap("backup" if take_backup else "scan")
        if resumed:
            backup_id = journal.get("backup") if isinstance(journal.get("backup"), str) else None
        try:
            check_python(doc["python"], now_doc["python"])
            interp = _Layout.of(target, now_doc["python"])
            current = read_current(target, interp, now_doc["packages"], doc.get("packages"))
            plan = make_plan(sid, doc, now_doc, current, vault.get_json,
                             pending_removals=str_list(journal, "removals") + str_list(journal, "writes"))
            paths = Paths(target)
            # Every entry decided against the tree as the restore leaves it (its own symlinks included).
            bad = FinalTree(target, links={w.path: w.link for w in plan.writes if w.link is not None},
                            entries=[w.path for w in plan.writes if w.link is None]).problems()
            if bad:
                raise RefusedError(f"refusing to restore {sid[:12]}: " + "; ".join(bad[:10]) +
                                   (f"; and {len(bad) - 10} more" if len(bad) > 10 else ""))
        except BaseException:
            if take_backup:
                _discard_snapshot(vault, backup_id)
            raise
        if dry_run:
            return RestoreResult(sid, str(target), "in-place", None, plan.changed, False, True,
                                 len(plan.writes), plan.bytes, len(plan.removals), plan=plan.to_json(),
                                 warnings=plan.warnings)
        if plan.empty and not resumed:
            _discard_snapshot(vault, backup_id if take_backup else None)
            return RestoreResult(sid, str(target), "in-place", None, 0, plan.diff.packages_empty, False,
                                 plan=plan.to_json(), remaining=None if plan.diff.packages_empty else plan.diff.to_json(),
                                 warnings=plan.warnings)
        clock.lap("plan")
        pid = os.getpid()
        write_journal(target, {
            "format": 1, "snapshot": sid, "backup": backup_id, "pid": pid,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "staging_dirs": sorted(set(plan.staging_dirs()) | set(str_list(journal, "staging_dirs"))
                                   | {os.path.dirname(d) for d in plan.remove_dirs}),
            "removals": list(plan.removals),
            "writes": [w.path for w in plan.writes],
            "dist_infos": list(plan.dist_infos),
            "protected": sorted(os.path.relpath(d, target) for d in _protected_dirs(target, interp)),
        })
        _crash_point("journal")
        created: list[str] = []
        try:
            clean_temps(target, str_list(journal, "staging_dirs") + plan.staging_dirs(), paths, keep_pid=pid)
            staged = _stage_all(vault, plan, paths, pid, progress, created)
        except BaseException:
            # Nothing was renamed into place: leave the environment as this run found it (a full disk must
            # not leave empty package folders that import as empty packages).
            _undo_staging(target, created, keep_journal=resumed)
            if take_backup:
                _discard_snapshot(vault, backup_id)
            raise
        _crash_point("staged")
        clock.lap("stage")
        protected = _protected_dirs(target, interp)
        removed, modes_set = _commit(plan, staged, paths, protected)
        _populate_statcache(vault, target, staged)
        _crash_point("committed")
        clock.lap("commit")
        after = current_document(vault, target, facts=False)
        remaining = diff_snapshots(after, doc, vault=vault, old_label="current", new_label=sid[:12], scope="environment")
        remove_journal(target)
        _crash_point("verified")
        clock.lap("verify")
    warnings = list(plan.warnings)
    if doc.get("venv") and doc["venv"] != str(target) and any(w.path.startswith(interp_scripts_rel(doc)) for w in plan.writes):
        warnings.append(f"the snapshot was taken of {doc['venv']}: scripts restored into bin/ keep that "
                        "environment's interpreter in their first line; use --into for a relocated copy")
    for k, (o, n) in remaining.python.items():
        warnings.append(f"python {k} is {o}, the snapshot had {n}")
    return RestoreResult(
        sid, str(target), "in-place", backup_id, plan.changed, remaining.packages_empty, False,
        len(staged), plan.bytes, removed, plan=plan.to_json(),
        remaining=None if remaining.packages_empty else remaining.to_json(), warnings=tuple(warnings),
        timings=clock.laps, modes_set=modes_set,
    )


class _Clock:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self._last, 3)
        self._last = now


@dataclass(frozen=True)
class _Layout:
    """The install paths of an environment, from a document's ``python`` section (no second probe)."""

    purelib: Path
    platlib: Path
    scripts: Path

    @classmethod
    def of(cls, prefix: Path, python: dict) -> "_Layout":
        def at(key: str, default: str) -> Path:
            value = Path(python.get(key) or default)
            return value if value.is_absolute() else prefix / value
        return cls(at("purelib", "lib"), at("platlib", python.get("purelib") or "lib"), at("scripts", "bin"))


def _undo_staging(target: Path, created: list[str], *, keep_journal: bool) -> None:
    """After a failure before any rename: remove the folders this run made (only while empty) and the
    journal, unless it was an earlier run's (its renames are still to be finished)."""
    for d in reversed(created):
        try:
            os.rmdir(d)
        except OSError:
            pass
    if not keep_journal:
        try:
            remove_journal(target)
        except OSError:
            pass


def interp_scripts_rel(doc: dict) -> str:
    scripts = (doc.get("python") or {}).get("scripts") or "bin"
    return scripts.rstrip("/") + "/"


def _protected_dirs(target: Path, interp) -> set[str]:
    keep = {str(target)}
    for p in (interp.purelib, interp.platlib, interp.scripts):
        p = str(p)
        while p.startswith(str(target)) and p not in keep:
            keep.add(p)
            p = os.path.dirname(p)
    return keep


@contextmanager
def _nullcontext() -> Iterator[None]:
    yield
