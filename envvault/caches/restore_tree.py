"""One cache root of a cache restore (docs/format.md, "Restoring caches", steps 2 to 4): plan against the
destination as it is (``plan_tree``: what to write, keep and, with ``replace``, remove; every entry decided
against the final tree, a symlink on the way that leads out refusing the restore), then act
(``execute_tree``): create folders, stage every file through the materializer (``envvault/materialize.py``:
``<dir>/.<name>.envvault-<pid>-<run>.tmp``, BLAKE3 per object, size and sha256 per file) and only when all
are staged, rename them into place: kernels and other files first, Inductor's ``fxgraph/`` and
``aotautograd/`` entries last, so a compile running meanwhile never finds an entry whose kernels are missing.
A failure before the renames removes every temp file and every folder this run created. A root that does
not exist yet is instead made whole beside it (``.<root name>.envvault-<pid>-<run>.tmp``, every file under its
final name) and renamed into place: one rename, and a compile sees all of the cache or none of it.

``merge`` (the default) adds what is missing and never overwrites: a file is put in place with ``link`` +
``unlink``, which fails rather than replace one that appeared meanwhile. ``replace`` makes the root hold
exactly the archived files: others are removed, differing ones replaced (``locks/`` and files being
written, ``*.tmp``, are left alone). Like torch's own cache writes, files are not fsynced: a killed restore
leaves only complete files under final names, a power cut may lose some (torch then recompiles).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat as statmod
import time
from envvault.model.records import dataclass, field
from pathlib import Path

from .. import materialize
from ..errors import EnvvaultError, StorageError
from ..materialize import FileSpec, refuse_escapes
from ..model.cache import CacheManifest, ManifestFile
from ..safepaths import FinalTree
from ..vault.fsutil import makedirs_recording, process_alive, remove_folders
from ..model.record import record_sha256
from ..vault.store import ObjectReader
from .walk import restore_temp_name, restore_temp_owner, walk_cache

__all__ = ["TreePlan", "plan_tree", "execute_tree"]

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Literal

    Mode = Literal["merge", "replace"]
_LAST = ("fxgraph/", "aotautograd/")


# -- planning (reads the destination, writes nothing) ----------------------------------------------


@dataclass
class TreePlan:
    """What restoring one cache into ``dest`` writes, keeps and removes (and, after it ran, ``raced``)."""

    manifest: CacheManifest
    mid: str
    dest: Path
    mode: Mode
    writes: list[ManifestFile] = field(default_factory=list)
    links: list[ManifestFile] = field(default_factory=list)
    dirs: list[ManifestFile] = field(default_factory=list)
    removals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    keep_dirs: set[str] = field(default_factory=set)
    fresh: bool = False  # no entry at ``dest`` when planned: the whole tree is made beside it, then renamed in
    kept: int = 0
    raced: int = 0  # merge: appeared while we staged, so left as found


def plan_tree(manifest: CacheManifest, mid: str, dest: Path, mode: Mode) -> TreePlan:
    """Plan the restore of ``manifest`` into ``dest``; ``RefusedError`` when an entry would lead out."""
    plan = TreePlan(manifest=manifest, mid=mid, dest=dest, mode=mode, fresh=not os.path.lexists(dest))
    disk = FinalTree(dest, where="the cache root")  # as it is now; the final tree is checked below
    parents: dict[str, str | None] = {"": None}

    def parent_problem(rel_dir: str) -> str | None:
        # None: every existing folder on the way is a folder (or a symlink that stays inside the root).
        if rel_dir in parents:
            return parents[rel_dir]
        up = rel_dir.rpartition("/")[0]
        why = parent_problem(up)
        if why is None:
            path = os.path.join(dest, rel_dir)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                st = None
            except OSError as err:
                raise StorageError(f"cannot read {path}: {err.strerror}") from None
            if st is not None and statmod.S_ISLNK(st.st_mode):
                # One leading out is refused with the final tree below; here only "not a folder".
                if disk.resolve(rel_dir) is not None and not os.path.isdir(path):
                    why = f"{rel_dir} is not a folder"
            elif st is not None and not statmod.S_ISDIR(st.st_mode):
                why = f"{rel_dir} is a file where the archive has a folder"
        parents[rel_dir] = why
        return why

    wanted: set[str] = set()
    for f in manifest.files if plan.fresh else ():  # nothing on disk to look at: every entry is made
        (plan.dirs if f.kind == "dir" else plan.writes if f.kind == "file" else plan.links).append(f)
    for f in manifest.files if not plan.fresh else ():
        wanted.add(f.path)
        why = parent_problem(f.path.rpartition("/")[0])
        if why is not None:
            if why not in plan.warnings:
                plan.warnings.append(f"{dest}: left out what lies under {why}")
            continue
        path = os.path.join(dest, f.path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if f.kind == "dir":
            if st is None:
                plan.dirs.append(f)
            elif not statmod.S_ISDIR(st.st_mode):
                plan.warnings.append(f"{dest}: left {f.path} as it is (the archive has a folder there)")
            continue
        if st is None:
            (plan.writes if f.kind == "file" else plan.links).append(f)
        elif statmod.S_ISDIR(st.st_mode):
            plan.warnings.append(f"{dest}: left the folder {f.path} as it is (the archive has a file there)")
        elif mode == "merge" or _same(path, st, f):
            plan.kept += 1
        else:
            (plan.writes if f.kind == "file" else plan.links).append(f)
    # Every entry written, decided against the cache root as the restore leaves it (its symlinks included).
    refuse_escapes(dest, f"refusing to restore into {dest}", links={f.path: f.target for f in plan.links},
                   entries=[f.path for f in plan.writes], dirs=[f.path for f in plan.dirs], where="the cache root")
    if mode == "replace" and os.path.isdir(dest):
        implied = {p.rsplit("/", n)[0] for p in wanted for n in range(1, p.count("/") + 1)}
        plan.keep_dirs = implied | wanted
        for cf in walk_cache(dest):
            if cf.path not in wanted and not (cf.is_dir and (cf.path in implied or cf.path == "locks")):
                parts = cf.path.split("/")
                if any("/".join(parts[:n]) in wanted and n < len(parts) for n in range(1, len(parts))):
                    continue
                plan.removals.append(cf.path)
    return plan


def _same(path: str, st: os.stat_result, f: ManifestFile) -> bool:
    if f.kind == "link":
        return statmod.S_ISLNK(st.st_mode) and os.readlink(path) == f.target
    if not statmod.S_ISREG(st.st_mode) or st.st_size != f.size or st.st_mode & 0o777 != f.mode & 0o777:
        return False
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    except OSError:
        return False
    return record_sha256(h.digest()) == f.sha256


# -- execution --------------------------------------------------------------------------------------


def execute_tree(plan: TreePlan, reader: ObjectReader) -> None:
    """Carry out ``plan``; a failure before the renames leaves the root as it was. A root that did not exist
    (``plan.fresh``) is made whole beside it and renamed into place. When an entry took its place meanwhile,
    the restore is planned again against what is there, as a merge whatever the mode (what appeared, a
    symlink among them, is never a reason to delete), with a warning, and done file by file (``plan``
    updated); where the temp folder's longer name does not fit, file by file as planned. First, what killed
    restores of this root left beside it is removed, and before files are written into the root's folders,
    the temp files killed restores left in them (``_remove_stale``)."""
    _remove_stale(*os.path.split(str(plan.dest)))
    if plan.fresh:
        how = _execute_fresh(plan, reader)
        if how == _DONE:
            return
        if how == _APPEARED:
            again = plan_tree(plan.manifest, plan.mid, plan.dest, "merge")
            for name in ("mode", "writes", "links", "dirs", "removals", "keep_dirs", "kept", "fresh"):
                setattr(plan, name, getattr(again, name))
            plan.warnings.append(f"{plan.dest}: appeared while the cache was restored: merged into it, "
                                 "nothing there replaced or removed")
            plan.warnings.extend(w for w in again.warnings if w not in plan.warnings)
    dest = plan.dest
    pid = os.getpid()
    created: list[str] = []
    try:
        _makedirs(str(dest), created)
        for rel in sorted({f.path.rpartition("/")[0] for f in plan.writes + plan.links}):
            folder = os.path.join(dest, rel)
            if os.path.isdir(folder):
                _remove_stale(folder)
            _makedirs(folder, created)
        specs = [FileSpec(f.path, f.chunks, f.size, f.sha256, f.mode) for f in plan.writes]
        staged = materialize.stage(reader, dest, specs, lambda final: restore_temp_name(final, pid))
    except BaseException:
        remove_folders(created)
        raise
    # Every file is staged and verified: from here on only renames, kernels first, graph entries last.
    merge = plan.mode == "merge"
    staged.sort(key=lambda s: (s.spec.path.startswith(_LAST), s.spec.path))
    for s in staged:
        if not materialize.place(s, keep_existing=merge):
            plan.raced += 1
    for f in plan.links:
        final = os.path.join(dest, f.path)
        if not materialize.place_link(f.target, final, lambda p: restore_temp_name(p, pid), keep_existing=merge):
            plan.raced += 1
    for f in plan.dirs:
        path = os.path.join(dest, f.path)
        mine: list[str] = []
        _makedirs(path, mine)
        if mine:
            os.chmod(path, f.mode & 0o777)
    for rel in sorted(plan.removals, reverse=True):
        path = os.path.join(dest, rel)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            plan.warnings.append(f"{dest}: could not remove {rel}: {err.strerror}")
    emptied = {rel.rsplit("/", n)[0] for rel in plan.removals for n in range(1, rel.count("/") + 1)}
    for rel in sorted(emptied - plan.keep_dirs, key=lambda r: (-r.count("/"), r)):
        try:
            os.rmdir(os.path.join(dest, rel))  # only when nothing is left in it
        except OSError:
            pass


_DONE, _APPEARED, _NO_ROOM = "done", "appeared", "no room"  # how _execute_fresh ended


def _execute_fresh(plan: TreePlan, reader: ObjectReader) -> str:
    """The whole tree written under its final names into a new folder beside the root
    (``<parent>/.<root name>.envvault-<pid>-<run>.tmp``, the same temp name a file gets), which is then renamed
    to the root: one rename instead of one per file, and a compile never sees part of the tree. ``_DONE``;
    ``_APPEARED`` (the folder removed again) when the rename finds an entry in the root's place that it
    cannot replace; ``_NO_ROOM`` (nothing made) when the temp name is too long for the file system. The
    modes of the empty folders are given once the tree is in place (a folder without the owner's rights
    inside the temp folder would keep it from being removed)."""
    dest = str(plan.dest)
    parent = os.path.dirname(dest)
    work = restore_temp_name(dest, os.getpid())
    created: list[str] = []
    made = False
    try:
        _makedirs(parent, created)
        try:
            os.mkdir(work)  # the run id is random: an entry of that name is not this run's, and is left alone
        except OSError as err:
            if err.errno == errno.ENAMETOOLONG:
                remove_folders(created)
                return _NO_ROOM
            raise StorageError(f"cannot create folder {work}: {err.strerror}") from None
        made = True

        def folder(path: str) -> None:  # the writers make the new tree's folders as they reach them
            _makedirs(path, [])

        specs = [FileSpec(f.path, f.chunks, f.size, f.sha256, f.mode) for f in plan.writes]
        try:
            materialize.stage(reader, work, specs, materialize.FINAL_NAME, folders=folder)
        except EnvvaultError as err:  # named as the user knows it: the root, not the temp folder
            err.args = (str(err).replace(work, dest),)  # the same error (a ReadFailed keeps its ``why``)
            raise
        for f in plan.links:
            path = os.path.join(work, f.path)
            _makedirs(os.path.dirname(path), [])
            os.symlink(f.target, path)
        empty: list[ManifestFile] = []  # the folders this step makes, as the file by file way counts them
        for f in plan.dirs:
            mine: list[str] = []
            _makedirs(os.path.join(work, f.path), mine)
            if mine:
                empty.append(f)
        try:
            os.rename(work, dest)  # over nothing, or over an empty folder made meanwhile
        except OSError as err:
            if not os.path.lexists(dest):
                raise StorageError(f"cannot rename {work} to {dest}: {err.strerror}") from None
            _remove_tree(work)
            return _APPEARED
        made = False  # the tree is the root now
        for f in empty:
            os.chmod(os.path.join(dest, f.path), f.mode & 0o777)
        return _DONE
    except BaseException:
        if made:
            _remove_tree(work)
        remove_folders(created)
        raise


_STALE_AFTER = 3600  # seconds a dead restore's temp folder stays untouched before it is removed


def _remove_stale(folder: str, root: str | None = None) -> None:
    """Remove what killed restores left in ``folder`` (``restore_temp_name``): with ``root``, the temp folders
    of that root (made whole beside it); without, temp files and symlinks (a root restored file by file).
    Only entries of this user, whose restore's process is gone, untouched for ``_STALE_AFTER`` seconds (a
    process id seen from another PID namespace may look gone; an hour is longer than any restore writes
    without adding to its folder). Anything else of that name, and every error, is left alone."""
    try:
        with os.scandir(folder) as entries:
            found = [(e, owner[1]) for e in entries
                     if (owner := restore_temp_owner(e.name)) and (root is None or owner[0] == root)]
    except OSError:
        return
    for entry, pid in found:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (statmod.S_ISDIR(st.st_mode) == (root is not None) and st.st_uid == os.getuid()
                and time.time() - st.st_mtime > _STALE_AFTER and not process_alive(pid)):
            if root is not None:
                _remove_tree(entry.path)
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass


def _remove_tree(path: str) -> None:
    """Remove this run's own temp tree (symlinks in it are removed, never followed)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _makedirs(path: str, created: list[str]) -> None:
    makedirs_recording(path, created, lambda p: StorageError(f"cannot create folder {path}: {p} is in the way"))
