"""Applying an in-place plan to the environment (docs/format.md, "Restoring an environment", steps 4 and 5):
stage every write through the materializer (``envvault/materialize.py``), then commit: rename the staged files into
place, give kept files back their modes, delete what the snapshot lacks (package files first, then whole
dist-info folders renamed away), drop stale bytecode, prune emptied folders. A path whose kind the restore
changes (``KindChanges``: another version's file where the snapshot has a folder, or its folder where the
snapshot has a file) is cleared at the commit, just before the renames. The crash points ``stage``,
``commit`` and ``remove_dir`` lie on this path; the journal (written before, removed after) is the caller's.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from envvault.crashpoints import crash_point
from envvault import materialize
from envvault.model.identity import bytecode_source, is_bytecode
from envvault.model.records import dataclass, replace
from envvault.errors import EnvironmentProblem, EnvvaultError
from envvault.journal import Paths, prune_empty, remove_journal, tmp_for
from envvault.materialize import FileSpec, Staged
from envvault.restore.plan import FileWrite, Plan
from envvault.output import ProgressSink
from envvault.vault.fsutil import makedirs_recording, remove_folders, storage_error
from envvault.vault.store import ObjectReader, Vault

__all__ = ["stage_plan", "commit_plan", "undo_staging", "populate_statcache", "remember_written", "KindChanges",
           "kind_changes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KindChanges:
    """Paths a restore turns from one kind into another, each of them what another version of a package left
    there and the restore deletes anyway (helper 29: a rollback across such an upgrade was refused).
    ``files``: a file or link where the snapshot needs a folder (its writes are staged beside it, in the
    nearest folder that exists: ``staged_beside``; ``folders_to_make``: the folders made for them at the
    commit); ``folders``: a folder all of whose entries the restore deletes (``removable``), where the
    snapshot has a file. ``links``: those of ``files`` that are symlinks leading out of the environment (the
    plan's ``unlinked``): the link goes, never what it leads to."""

    files: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()
    folders_to_make: tuple[str, ...] = ()
    removals: frozenset[str] = frozenset()
    links: tuple[str, ...] = ()  # of ``files``: symlinks out of the environment a folder replaces (``links_out``)

    def staging_dirs(self) -> set[str]:
        """Folders a killed restore may have left temp files in, beyond the writes' own."""
        return {os.path.dirname(rel) for rel in self.files + self.folders}

    def staged_beside(self, rel: str) -> str | None:
        """The changed file ``rel`` lies under, if any (its writes cannot be staged in their folder yet)."""
        for f in self.files:
            if rel.startswith(f + "/"):
                return f
        return None

    def removable(self, rel: str) -> bool:
        """Whether the restore deletes ``rel``: a file of the plan's removals, or the bytecode of one (an
        installer such as uv lists no ``__pycache__`` in RECORD; helper 30, F1: an import made the folder in
        the way hold the user's file, it seemed)."""
        return rel in self.removals or bytecode_source(rel) in self.removals


def _dir_in_the_way(full: str) -> EnvironmentProblem:
    return EnvironmentProblem(f"{full} is in the way: the snapshot needs a directory there; move it and run again")


def _folders_of_writes(plan: Plan) -> set[str]:
    """Every folder the plan's writes lie in, and every folder above those (relative to the environment)."""
    needed: set[str] = set()
    for w in plan.writes:
        d = os.path.dirname(w.path)
        while d and d not in needed:
            needed.add(d)
            d = os.path.dirname(d)
    return needed


def links_out(target: Path, plan: Plan, sites) -> tuple[str, ...]:
    """The folders on the way of ``plan``'s writes that are, on disk, symlinks inside one of the environment's
    site folders (``sites``, relative to ``target``) leading out of it, or to nothing there: a package's folder
    linked into an installer's cache (pdm's ``symlink`` install method), the cache pruned or holding other
    bytes. The restore replaces each with a real folder (``make_plan``'s ``unlinked``) and never writes where
    it leads. A link at or above a site folder is not one of them (every package lies under it: refused, as
    any write through a link out is), nor is one whose own folder leads out, nor one leading inside."""
    from envvault.safepaths import FinalTree

    prefixes = tuple(s.rstrip("/") + "/" for s in sites if s)
    needed = _folders_of_writes(plan)
    tree = FinalTree(target)
    found: list[str] = list(plan.unlinked)  # (replaced already: what lies under them is the restore's)
    missing: set[str] = set()  # folders not there: nothing under them is looked at (a removed torch's 1,000)
    for rel in sorted(needed, key=lambda r: r.count("/")):  # the topmost first: nothing under one is looked at
        if not rel.startswith(prefixes) or any(rel == f or rel.startswith(f + "/") for f in found):
            continue
        if os.path.dirname(rel) in missing:
            missing.add(rel)
            continue
        try:
            if not stat.S_ISLNK(os.lstat(os.path.join(target, rel)).st_mode):
                continue
        except OSError:
            missing.add(rel)
            continue
        if tree.write_problem(rel) is None and tree.resolve(rel) is None:
            found.append(rel)
    return tuple(sorted(found))


def kind_changes(target: Path, plan: Plan) -> KindChanges:
    """Find the paths whose kind ``plan`` changes, before anything is written (the dry run too): one ``lstat``
    a folder the writes need (a ``stat`` more for a link). A file in the way of a folder that the restore
    does not delete is an EnvironmentProblem, and so (``refuse_folders_in_the_way``, a RefusedError) is a folder
    in the way of a file that holds anything the restore would not delete: a user's file is never deleted.
    A symlink out that the plan replaces with a folder (its ``unlinked``) is cleared like a file in the way."""
    removed = frozenset(plan.removals)
    unlinked = frozenset(plan.unlinked)
    needed = _folders_of_writes(plan)
    files: list[str] = []
    for rel in sorted(needed):  # parents first: what lies under a file the restore clears is not looked at
        if any(rel.startswith(f + "/") for f in files):
            continue
        full = os.path.join(target, rel)
        try:
            mode = os.lstat(full).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISDIR(mode):
            continue
        if rel in removed or rel in unlinked:
            files.append(rel)  # (a link too: a folder of the snapshot's takes its place)
        elif not (stat.S_ISLNK(mode) and os.path.isdir(full)):  # a symlinked folder inside (refuse_escapes)
            raise _dir_in_the_way(full)  # the user's (or another package's): never deleted
    under = tuple(f + "/" for f in files)
    make = sorted({os.path.dirname(w.path) for w in plan.writes if w.path.startswith(under)}) if files else []
    changes = KindChanges(files=tuple(files), folders_to_make=tuple(make), removals=removed,
                          links=tuple(f for f in files if f in unlinked))
    # (what lies under a file or link cleared at the commit is not looked at: a link's is not the environment's)
    folders = materialize.refuse_folders_in_the_way(
        target, [w.path for w in plan.writes if changes.staged_beside(w.path) is None], changes.removable)
    return replace(changes, folders=tuple(folders)) if folders else changes


def _spec(w: FileWrite) -> FileSpec:
    return FileSpec(w.path, w.chunks, w.size, w.sha256, w.mode, w.link, w.package)


def stage_plan(vault: Vault, plan: Plan, paths: Paths, pid: int, progress: ProgressSink | None,
               created: list[str], changes: KindChanges = KindChanges()) -> list[Staged]:
    """Create the folders the writes need (recorded in ``created``) and stage every write. On failure the
    staged files are deleted; the caller removes ``created``. A write under a file ``changes`` clears at the
    commit is staged in that file's folder, under a temp name of its whole path there."""
    reader = ObjectReader(vault)

    root = len(str(paths.target)) + 1

    def tmp_name(final: str) -> str:
        if not changes.files:
            return tmp_for(final, pid)
        rel = final[root:].replace(os.sep, "/")  # (``final`` is ``paths.abs(rel)``)
        blocked = changes.staged_beside(rel)
        if blocked is None:
            return tmp_for(final, pid)
        # In the folder that holds the file in the way, named by the file and a digest of the whole path: two
        # writes never share a temp name (``b/c.txt`` and ``b~c.txt`` did, helper 30 F2).
        import blake3

        beside = f"{blocked}~{blake3.blake3(rel.encode()).hexdigest()[:16]}"
        return tmp_for(paths.abs(beside), pid)

    for d in sorted({os.path.dirname(w.path) for w in plan.writes}):
        if changes.staged_beside(d + "/") is not None:
            continue  # made at the commit, once the file in its way is gone
        # (what was in the way refused the restore in ``kind_changes``; one put there since is refused here)
        makedirs_recording(paths.abs(d) if d else str(paths.target), created, _dir_in_the_way)
    if progress is not None:
        progress.set_total(plan.bytes)  # now the real amount is known
    return materialize.stage(reader, paths.target, [_spec(w) for w in plan.writes], tmp_name, progress=progress)


def shares_inode(full: str, mode: int, root: str | None = None) -> bool:
    """Whether the file ``full`` lacks permission bits ``mode`` and changing it in place would change another
    too: a symlink (what it leads to), a file with more than one link (an installer's cache: uv links
    files by default) or one under a folder that leads out of ``root`` (a package folder linked into a cache).
    False when it is gone."""
    if root is not None:
        real = os.path.realpath(root)
        if not os.path.realpath(os.path.dirname(full)).startswith(real.rstrip("/") + "/"):
            return True
    try:
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            return True  # (a link is never chmod-ed: written anew whatever it leads to)
    except OSError:
        return False
    return st.st_nlink > 1 and (st.st_mode & 0o777) != (mode & 0o777)


def _unlink_counted(full: str) -> int:
    """Delete the file or link ``full``; 1 when it was there (0: gone, or a folder on its path is a file now)."""
    try:
        os.unlink(full)
        return 1
    except (FileNotFoundError, NotADirectoryError):
        return 0
    except OSError as err:
        raise storage_error(err, full) from None


def _drop_bytecode(abs_py: str, seen: dict[str, list[str]]) -> None:
    """Delete ``__pycache__/<stem>.*.pyc`` (``.opt-N`` ones too) of a source file we replaced or removed (a
    stale .pyc with the same source size and mtime second would otherwise win over the restored source)."""
    d, name = os.path.split(abs_py)
    cache = os.path.join(d, "__pycache__")
    if cache not in seen:
        try:
            seen[cache] = os.listdir(cache)
        except OSError:
            seen[cache] = []
    for entry in seen[cache]:
        if bytecode_source(f"__pycache__/{entry}") == name:
            try:
                os.unlink(os.path.join(cache, entry))
            except OSError:
                pass


def commit_plan(plan: Plan, staged: list[Staged], paths: Paths, protected: set[str],
                changes: KindChanges = KindChanges()) -> tuple[int, int]:
    """Rename staged files into place, set the modes of kept files, delete; returns (removed, modes set).
    What stands where ``changes`` changes a path's kind goes first (it is in ``plan.removals``)."""
    pyc_seen: dict[str, list[str]] = {}
    parents: set[str] = set()
    removed = 0
    for rel in changes.folders:  # emptied of what the restore deletes; ``place`` then replaces the empty tree
        for r in list(materialize.files_under(paths.target, paths.abs(rel))):
            if changes.removable(r) and paths.check(r) is None:  # (what appeared since: ``place`` refuses)
                gone = _unlink_counted(paths.abs(r))
                removed += gone if r in changes.removals and not is_bytecode(r) else 0  # (as the dry run)
                crash_point("commit")
    for rel in changes.files:
        if paths.check(rel) is None:
            gone = _unlink_counted(paths.abs(rel))  # (a link out: the link, never what it leads to)
            removed += gone if rel not in changes.links else 0
            crash_point("commit")
    for rel in changes.links:  # made by this restore, or it stops: a link put back meanwhile is never written through
        try:
            os.mkdir(paths.abs(rel))
        except FileExistsError:
            raise EnvironmentProblem(f"{paths.abs(rel)} appeared while the restore replaced the symlink there; "
                                     "see what made it, remove it and run the restore again") from None
    now = Paths(paths.target) if changes.links else paths  # (the tree as it is once the links are gone)
    for rel in changes.folders_to_make:
        os.makedirs(paths.abs(rel), exist_ok=True)
        if changes.links and now.check(rel + "/x") is not None:  # (a folder on its way made a link meanwhile)
            raise EnvironmentProblem(f"{paths.abs(rel)} leads out of the environment now; the restore stopped")
    for s in staged:
        materialize.place(s)
        if s.final.endswith(".py"):
            _drop_bytecode(s.final, pyc_seen)
        crash_point("commit")
    modes_set = 0
    for rel, mode in plan.keeps:  # files of changed packages whose bytes match: give them back their mode
        full = paths.abs(rel)
        if paths.check(rel) is not None:
            continue  # under a link out (a cache's file, another's too): never chmod-ed; verification names it
        try:
            st = os.lstat(full)
            # (never a file another path shares, a hardlink into uv's cache: its mode is that file's too; one
            # whose execute bit differs was written anew, ``make_plan``'s ``shared``)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and (st.st_mode & 0o777) != (mode & 0o777):
                os.chmod(full, mode & 0o777)  # never setuid/setgid from a vault
                modes_set += 1
        except OSError:
            pass  # gone or not ours: verification names what still differs
    # Files inside a dist-info folder that goes away leave with the folder (renamed away whole, below), so
    # a kill never leaves a dist-info without METADATA or RECORD. Package files go first: until then the
    # dist-info still lists them, and after a kill the journal does.
    doomed_dirs = tuple(d + "/" for d in plan.remove_dirs)
    paths = Paths(paths.target)  # the tree has changed: judge removals against it as it is now
    for rel in plan.removals:
        if paths.check(rel) is not None or (doomed_dirs and rel.startswith(doomed_dirs)):
            continue
        full = paths.abs(rel)
        if os.path.isdir(full) and not os.path.islink(full):
            continue
        gone = _unlink_counted(full)
        removed += gone if not is_bytecode(rel) else 0  # (bytecode: counted by neither this nor a dry run)
        if full.endswith(".py"):
            _drop_bytecode(full, pyc_seen)
        parents.add(os.path.dirname(full))
        crash_point("commit")
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
            crash_point("remove_dir")
            shutil.rmtree(doomed, ignore_errors=True)
        parents.add(os.path.dirname(full))
        crash_point("commit")
    for cache_dir in pyc_seen:
        parents.add(cache_dir)
    prune_empty(parents, protected)
    return removed, modes_set


def populate_statcache(vault: Vault, target: Path, staged: list[Staged], cache=None) -> None:
    """Record the hashes computed while writing, so verification and the next status need not re-read.
    Each written file's entry holds its stats after the rename (an lstat; a rename changes ctime) or, when
    it was written under its final name, the stats fstat gave. Given the target's stat ``cache`` (the
    restore's one), it is filled and not saved: the caller saves it once, and decides which entries it keeps."""
    from envvault.snap import statcache_for

    own = cache is None
    if own:
        cache = statcache_for(vault, target)
        cache.touch(list(cache.files))
    for s in staged:
        if s.spec.link is not None or s.sha256 is None:
            continue
        st = s.st if s.tmp == s.final else None  # written under its final name (--into): stats known
        if st is None:
            try:
                st = os.lstat(os.path.join(target, s.spec.path))
            except OSError:
                continue
        cache.put(s.spec.path, st, s.sha256, list(s.spec.chunks))
    if own:
        cache.save()


def remember_written(cache, target: Path, installed: dict, packages) -> list[str]:
    """After a restore's commit, give each distribution it installed (``installed``: manifest id -> the
    snapshot's ``DistManifest``; ``packages``: the snapshot's summaries) the stat cache group a scan would
    record for it (``scan.remember_group``), so that the verify scan, and the next status or snap, compare its
    files by ``lstat`` instead of rebuilding its manifest from RECORD. Only where a rebuild could give nothing
    else: the summary the manifest gives is the snapshot's own (ids of this identity version, the scan rules of
    this envvault), every dist-info field comes from a file the manifest lists (``_dist_info_closed``), every
    RECORD row has its entry (``_every_row_listed``) and the disk shows exactly that manifest (``_as_recorded``);
    any other distribution is built by the verify scan as before. Returns the manifest ids given a group."""
    from envvault.model.encoding import canonical_json
    from envvault.snap.fresh import base_of
    from envvault.snap.manifests import summary_of
    from envvault.snap.scan import remember_group

    base = base_of(target)
    summaries = {p.manifest: p for p in packages}
    done = []
    for mid, man in installed.items():
        p = summaries.get(mid)
        if p is None or not isinstance(man.dist_info, str):
            continue
        summary = summary_of(man, mid)
        if (canonical_json(summary) != canonical_json(p.to_dict()) or not _dist_info_closed(base, man)
                or not _every_row_listed(base, man) or not _as_recorded(cache, base, man)):
            continue
        try:
            remember_group(cache, target / man.dist_info, target, man, summary, "full", mid)
        except OSError:
            continue
        done.append(mid)
    return done


def _every_row_listed(base: str, man) -> bool:
    """True when the manifest has an entry for every row of its RECORD (which ``_as_recorded`` checks as the
    snapshot's): a row the manifest leaves out (a folder a RECORD names, a path outside the environment) is one
    a rebuild would look at again and a group would not."""
    from envvault.env.static import read_env_file

    try:
        data = read_env_file(f"{base}{man.dist_info}/RECORD")
    except (OSError, EnvvaultError):
        return False
    # Its non-blank lines, as ``model.record.parse_record`` takes rows (any line ending), without parsing them:
    # 2 ms for torch's 14,622 rows against 32 ms. A row only a CSV reader would join across lines (a quoted
    # newline in a path) counts twice here: no group, the verify scan rebuilds, as for any other mismatch.
    return sum(1 for line in data.splitlines() if line.strip()) == len(man.files)


def _dist_info_closed(base: str, man) -> bool:
    """True when every field the manifest took from its dist-info folder came from a file it lists (and so
    checks): the files the folder holds now are exactly those the manifest lists there, and the files that
    give ``installer``, ``requested``, ``wheel`` and ``direct_url`` are among them when those are set (a
    RECORD that does not list REQUESTED, say, leaves the restore nothing to write it back from)."""
    prefix = man.dist_info + "/"
    mine = [f for f in man.files if f.path.startswith(prefix) and f.state != "missing"]
    if any(f.link is not None for f in mine):  # a listed link vouches for its text, not for what it points to
        return False
    listed = {f.path[len(prefix):] for f in mine}
    for name, field in (("INSTALLER", man.installer), ("REQUESTED", man.requested), ("WHEEL", man.wheel),
                        ("direct_url.json", man.direct_url)):
        if field and name not in listed:
            return False
    folder = base + man.dist_info
    if os.path.islink(folder):  # never walked through a link (a dist-info folder is a real one)
        return False
    on_disk = set()
    try:
        for root, dirs, files in os.walk(folder):  # links to folders inside are listed, not followed
            if len(on_disk) > len(listed):
                return False  # more than the manifest lists: not closed (and no walk of a large tree)
            rel = os.path.relpath(root, folder)
            on_disk.update(name if rel == "." else f"{rel}/{name}" for name in files)
            on_disk.update(name if rel == "." else f"{rel}/{name}" for name in dirs
                           if os.path.islink(os.path.join(root, name)))
    except OSError:
        return False
    return on_disk == listed


def _as_recorded(cache, base: str, man) -> bool:
    """True when every file ``man`` lists is on disk as it records it: each stored file a regular file with
    the manifest's mode and hash, its stat cache entry made for those very stats (``populate_statcache``, or
    the scan before the restore for a file it kept); each link pointing where the manifest says; each file
    recorded missing absent; an entry without a mode is bytecode (not in a group: ``remember_group``), else False."""
    from envvault.model.identity import is_bytecode
    from envvault.vault.statcache import stat_key

    files = cache.files
    lstat = os.lstat
    try:
        for f in man.files:
            full = base + f.path
            if f.state == "missing":
                if os.path.lexists(full):
                    return False
                continue
            if f.mode is None:  # bytecode (never stored); any other file without a mode: a rebuild differs
                if is_bytecode(f.path):
                    continue
                return False
            st = lstat(full)
            if f.link is not None:
                if not stat.S_ISLNK(st.st_mode) or os.readlink(full) != f.link:
                    return False
                continue
            entry = files.get(f.path)
            if (not stat.S_ISREG(st.st_mode) or st.st_mode & 0o7777 != f.mode or entry is None
                    or entry[0] != stat_key(st) or entry[1] != f.sha256):
                return False
    except (OSError, TypeError, ValueError):
        return False
    return True


def undo_staging(journal: Path, created: list[str], *, keep_journal: bool) -> None:
    """After a failure before any rename: remove the folders this run made (only while empty) and the
    journal (the file ``journal``), unless it was an earlier run's (its renames are still to be finished)."""
    remove_folders(created)
    if not keep_journal:
        try:
            remove_journal(journal)
        except OSError:
            pass
