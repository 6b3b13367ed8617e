"""Archiving one cache root through the ``Ingester``: one cache tree manifest per root, in the same vault as
environment snaps, so a file shared by two caches (or a cache and a venv) is stored once and two
near-identical precompiled headers share most of their chunks.

A cache may change while it is read (a compile running). Every file is taken only when its stat is the same
before and after the read (else it is read again, up to three times, then left out with a warning); the
tree is listed again after the pass and files that appeared meanwhile are taken in a second (and third)
round, so an Inductor entry is not archived without the kernels it names. The result is an archive of
complete files, each as it was at one moment, or a warning that says what was left out.

An unchanged cache costs one ``lstat`` per file and folder: each root keeps a shortcut in the stat cache
(folder and file stats, the entry it produced) and is re-read only when a stat differs.
"""

from __future__ import annotations

import os
import stat as statmod
import time
from pathlib import Path

import blake3

from ..errors import EnvironmentProblem
from ..model.encoding import canonical_json, not_utf8, object_id
from ..vault.ingest import Ingester
from ..vault.statcache import StatCache, group_stats_fresh, stat_key
from .discover import CacheLocation
from .entries import summarise_entries
from .snap_fingerprint import builder_fingerprint

# model.cache, walk and fingerprint are imported where a cache is actually read: an unchanged one is not.

__all__ = ["archive_cache", "KEY_PREFIX"]

KEY_PREFIX = "cache:"  # stat cache keys: cache:<root>/<path> per file, cache:<root> per root
_READ_ATTEMPTS = 4
_RACY_NS = 30_000_000  # 30 ms: more than a coarse timestamp tick
_ROUNDS = 3


def archive_cache(
    vault,
    ingester: Ingester,
    statcache: StatCache,
    location: CacheLocation,
    *,
    env_fp: dict | None = None,
) -> dict:
    """Archive one cache root; returns its snapshot entry (``kind``, ``root``, ``manifest``, ``files``,
    ``bytes``, ``entries``, ``fingerprint``, ``warnings``, ``seconds``, ``reused``). ``env_fp`` is the
    fingerprint (``Fingerprint.to_dict()``) of the environment snapped with it. New objects and the manifest
    are queued on ``ingester.writer``; the caller flushes it and commits the snapshot."""
    started = time.monotonic()
    root = Path(location.path)
    if not_utf8(root):
        raise EnvironmentProblem(f"cannot archive the cache folder {os.fsencode(root)!r}: its path is not UTF-8, "
                                 "which a snapshot cannot record; rename it or leave it out")
    gkey = KEY_PREFIX + str(root)
    env_key = blake3.blake3(canonical_json(env_fp)).hexdigest()
    group = statcache.groups.get(gkey)
    fresh = isinstance(group, dict) and _fresh(root, group)
    if fresh and group.get("env_key") == env_key and isinstance(group.get("entry"), dict):
        statcache.touch_group(group, gkey + "/")
        # Why the root is archived is this snap's (a folder first named with --cache-dir, configured since).
        return dict(group["entry"], reason=location.reason, seconds=round(time.monotonic() - started, 3), reused=True)
    from concurrent.futures import ThreadPoolExecutor

    from ._tree import fingerprint_from_tree
    from ..model.cache import CacheManifest, Fingerprint

    dirs = _dir_stats(root)
    with ThreadPoolExecutor(max_workers=1) as pool:
        tree_fp = None
        if fresh and isinstance(group.get("tree_fp"), dict):
            try:
                tree_fp = Fingerprint.from_dict(group["tree_fp"])
            except Exception:  # noqa: BLE001 - recomputed below
                tree_fp = None
        # The tree's own fingerprint reads the graph entries: do it while the files are archived.
        tree_job = pool.submit(fingerprint_from_tree, root) if tree_fp is None else None
        # ``vault.has`` re-lists index/ on every call; one look at the index serves the whole read.
        known = vault.index().__contains__
        files, stats, warnings = _read_tree(root, dirs, ingester, statcache, gkey + "/")
        if tree_job is not None:
            tree_fp = tree_job.result()
    fp = builder_fingerprint(tree_fp, Fingerprint.from_dict(env_fp) if env_fp else None)
    manifest = CacheManifest(cache_kind=location.kind, root=str(root), fingerprint=fp, files=tuple(files))
    data = canonical_json(manifest.to_dict())
    mid = object_id(data)
    writer = ingester.writer
    if writer is not None and not known(mid) and not writer.queued(mid):
        writer.add(mid, data, "m")
    regular = [f for f in files if f.kind == "file"]
    entry = {
        "kind": location.kind,
        "root": str(root),
        "reason": location.reason,
        "manifest": mid,
        "files": len(regular) + sum(1 for f in files if f.kind == "link"),
        "bytes": sum(f.size for f in regular),
        "entries": summarise_entries(location.kind, [f.path for f in regular]),
        "fingerprint": fp.to_dict(),
        "warnings": warnings,
    }
    if warnings:
        statcache.drop_group(gkey)  # not a clean picture: read it again next time
    else:
        statcache.set_group(gkey, {
            "dirs": dirs, "files": [rel for rel, _ in stats], "stats": [key for _, key in stats],
            "tree_fp": tree_fp.to_dict(), "env_key": env_key, "entry": entry,
        })
    return dict(entry, seconds=round(time.monotonic() - started, 3), reused=False)


def _is_transient_dir(rel: str) -> bool:
    from .walk import is_transient

    return is_transient(rel, is_dir=True)


def _dir_stats(root: Path) -> list[list]:
    """[path, ctime_ns, inode] of every folder the walk enters; taken before the walk, so a change made
    after it shows up at the next snap. A folder's ctime moves whenever an entry is added, removed or
    renamed in it (and on chmod)."""
    out: list[list] = []
    stack = [("", str(root))]
    while stack:
        rel, path = stack.pop()
        try:
            st = os.lstat(path)
            with os.scandir(path) as it:
                subs = [(e.name, e.path) for e in it if e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as err:
            raise EnvironmentProblem(f"cannot read cache folder {path}: {err.strerror}") from None
        out.append([rel, st.st_ctime_ns, st.st_ino])
        for name, sub in subs:
            r = f"{rel}/{name}" if rel else name
            if r != "locks" and not _is_transient_dir(r):
                stack.append((r, sub))
    return out


def _fresh(root: Path, group: dict) -> bool:
    """True when every folder and file of the last archive still has the stats recorded then."""
    base = f"{root}/"
    lstat = os.lstat
    try:
        for rel, ctime, ino in group["dirs"]:
            st = lstat(base + rel if rel else str(root))
            if st.st_ctime_ns != ctime or st.st_ino != ino:
                return False
        if not group_stats_fresh(base, group):
            return False
    except (OSError, KeyError, TypeError, ValueError):
        return False
    return True


def _read_tree(root: Path, dirs: list[list], ing: Ingester, cache: StatCache, prefix: str):
    """Read every file of the tree on the ingester's reader threads; their objects are stored in the
    listing's order (the same packs whatever the thread count)."""
    from ..model.cache import ManifestFile
    from .walk import walk_cache

    files: dict[str, ManifestFile] = {}
    stats: list[tuple[str, list]] = []
    warnings: list[str] = []
    seen: set[str] = set()
    cache.files  # noqa: B018 - load the per-file stat cache before the reading threads share it

    def take(rel: str, read):
        return rel, _take_file(f"{root}/{rel}", prefix + rel, read, cache)

    skipped: list[str] = []
    pending = walk_cache(root, skipped)
    for _ in range(_ROUNDS):
        regular = []
        for cf in pending:
            seen.add(cf.path)
            if cf.is_dir:
                files[cf.path] = ManifestFile(path=cf.path, kind="dir", mode=cf.mode)
            elif cf.is_symlink:
                if cf.escapes_root:
                    warnings.append(f"{root}: left out {cf.path}, a symlink that leads outside the cache ({cf.target})")
                else:
                    files[cf.path] = ManifestFile(path=cf.path, kind="link", mode=cf.mode, target=cf.target)
            else:
                regular.append(cf.path)
        regular.sort()  # the stored order, hence the packs, do not depend on the listing order
        results = ing.map_ordered(take, regular)
        try:
            for rel, got in results:
                if isinstance(got, str):
                    warnings.append(f"{root}: left out {rel}: {got}")
                elif got is not None:
                    st, sha, chunks = got
                    files[rel] = ManifestFile(path=rel, kind="file", mode=statmod.S_IMODE(st.st_mode),
                                              size=st.st_size, sha256=sha, chunks=tuple(chunks))
                    stats.append((rel, stat_key(st)))
        finally:
            results.close()  # an error: the reader threads stop now
        now = _dir_stats(root)
        if now == dirs:
            pending = []
            break  # no folder changed: nothing appeared or vanished since the listing
        dirs = now
        pending = [cf for cf in walk_cache(root, skipped) if cf.path not in seen]
        if not pending:
            break
    else:
        warnings.append(
            f"{root}: still being written while it was archived; {len(pending)} file(s) that appeared during "
            "the snap were left out (every archived file is complete); snap again when the compile has finished"
        )
    if skipped:
        names = sorted(set(skipped))
        shown = ", ".join(repr(n.encode("utf-8", "surrogateescape"))[2:-1] for n in names[:3])
        warnings.append(f"{root}: left out {len(names)} entr{'y' if len(names) == 1 else 'ies'} whose name (or link "
                        f"target) is not UTF-8, which a snapshot cannot record: {shown}"
                        + (" and more" if len(names) > 3 else ""))
    # A folder noted empty that got files meanwhile is implied by them.
    dirs_with_content = {p.rsplit("/", 1)[0] for p in files if "/" in p}
    for rel in [r for r, f in files.items() if f.kind == "dir" and r in dirs_with_content]:
        del files[rel]
    return sorted(files.values(), key=lambda f: f.path), stats, warnings


def _take_file(path: str, key: str, read, cache: StatCache):
    """(stat, sha256, chunks) of a file read whole while it did not change; None when it vanished or is no
    longer a regular file; a reason (str) when it could not be read consistently.

    A file modified within the last ``_RACY_NS`` is read only after it settles: on filesystems with coarse
    timestamps a write in the same clock tick as the last one leaves mtime and ctime as they were, so the
    before/after comparison would not see it (git's "racy" files).
    """
    for attempt in range(_READ_ATTEMPTS):
        if attempt:
            time.sleep(_RACY_NS / 1e9 * attempt)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not statmod.S_ISREG(st.st_mode):
            return None
        hit = cache.lookup(key, st)
        if hit is not None and hit[2] is not None:
            return st, hit[1], hit[2]
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS:
            continue
        try:
            digest = read(path, st.st_size)
        except EnvironmentProblem as err:
            if not os.path.lexists(path):
                return None
            return str(err)
        try:
            after = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat_key(after) == stat_key(st) and digest.size == st.st_size and statmod.S_ISREG(after.st_mode):
            cache.put(key, st, digest.sha256, digest.chunks)
            return st, digest.sha256, digest.chunks
    return f"it was being written each time it was read ({_READ_ATTEMPTS} tries): a compile rewriting it in place?"
