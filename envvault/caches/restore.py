"""Restoring archived compile caches: staged, verified, then renamed into place, inside the cache root only.

Order of work, for every cache of a snapshot before anything is written: parse and validate each manifest
(paths, symlinks; see ``manifest.parse_manifest``), check that no folder on the way to a file is a symlink
leading out of the cache root, and plan what to write. Then per cache: create folders, write every file
to ``<dir>/.<name>.envvault-<pid>.tmp`` (checking each object's BLAKE3 and the file's sha256), and only when
all are staged, rename them into place: kernels and other files first, Inductor's ``fxgraph/`` and
``aotautograd/`` entries last, so a compile running meanwhile never finds an entry whose kernels are
missing. A failure before the renames removes every temp file and every folder this run created.

``merge`` (the default) adds what is missing and never overwrites: a file is put in place with ``link`` +
``unlink``, which fails rather than replace one that appeared meanwhile. ``replace`` makes the root hold
exactly the archived files: others are removed, differing ones replaced (``locks/`` and files being
written, ``*.tmp``, are left alone). Like torch's own cache writes, files are not fsynced: a killed restore
leaves only complete files under final names, a power cut may lose some (torch then recompiles).
"""

from __future__ import annotations

import hashlib
import os
import stat as statmod
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, Sequence

from ..errors import NotFoundError, StorageError, UsageError
from .. import materialize
from ..materialize import FileSpec, refuse_escapes
from ..model.snapshot import CacheEntry, Snapshot, as_snapshot
from ..safepaths import FinalTree
from ..vault.fsutil import makedirs_recording
from ..vault.ingest import b64_sha256
from ..vault.store import ObjectReader
from .discover import inductor_cache_dir, triton_cache_dir
from .fingerprint import Fingerprint, Mismatch, compare
from ..model.cache import CacheManifest, ManifestFile, parse_manifest
from .walk import walk_cache

__all__ = ["CacheRestoreEntry", "CacheRestoreResult", "restore_snapshot_caches", "select_caches", "cache_roots"]

Mode = Literal["merge", "replace"]
# Components of a fingerprint each kind of cache depends on (None: all of them).
_COMPONENTS: dict[str, tuple[str, ...]] = {
    "triton": ("triton", "gpu", "python", "env:TRITON"),
    "cuda": ("gpu",),
    "torch_extensions": ("torch", "torch_build", "python"),
}
_LAST = ("fxgraph/", "aotautograd/")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheRestoreEntry:
    """What restoring one cache did (or, with ``dry_run``, would do)."""

    kind: str
    root: str
    archived_root: str
    manifest: str
    mode: Mode
    dry_run: bool
    written_files: int = 0
    written_bytes: int = 0
    kept_files: int = 0
    removed_files: int = 0
    mismatches: tuple[Mismatch, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "kind": self.kind, "root": self.root, "archived_root": self.archived_root, "manifest": self.manifest,
            "mode": self.mode, "dry_run": self.dry_run, "written_files": self.written_files,
            "written_bytes": self.written_bytes, "kept_files": self.kept_files, "removed_files": self.removed_files,
            "mismatches": [{"component": m.component, "cached": m.cached, "current": m.current,
                            "message": m.message} for m in self.mismatches],
            "warnings": list(self.warnings), "seconds": self.seconds,
        }  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheRestoreResult:
    """Every cache restored from one snapshot; ``warnings`` gathers theirs, fingerprint mismatches first."""

    entries: tuple[CacheRestoreEntry, ...] = ()
    skipped: tuple[dict, ...] = ()  # caches whose archived root this environment does not name
    warnings: tuple[str, ...] = field(default=())
    dry_run: bool = False

    def to_json(self) -> dict:
        return {"dry_run": self.dry_run, "caches": [e.to_json() for e in self.entries], "skipped": list(self.skipped),
                "warnings": list(self.warnings)}


def select_caches(snapshot: Snapshot | dict, select: Sequence[str] = ()) -> list[CacheEntry]:
    """The snapshot's cache entries that have a manifest, limited to ``select`` (kinds or archived roots)."""
    entries = [c for c in as_snapshot(snapshot).caches or () if c.manifest]
    if not select:
        return entries
    roots = {os.path.abspath(os.path.expanduser(s)) for s in select if "/" in s or s.startswith("~")}
    return [c for c in entries if c.kind in select or c.root in roots]


def restore_snapshot_caches(
    vault,
    snapshot: Snapshot | dict,
    *,
    venv: Path | None = None,
    mode: Mode = "merge",
    select: Sequence[str] = (),
    to: Path | None = None,
    archived_roots: bool = False,
    dry_run: bool = False,
    env: Mapping[str, str] = os.environ,
) -> CacheRestoreResult:
    """Restore the caches archived in ``snapshot`` (all, or those ``select`` names by kind or root).

    Each goes back to the root it was archived from, or to ``to`` (only when one cache is selected). The
    archived root is the vault's word, so it is used only when it lies in a cache directory of this
    environment (``env``: where torch, Triton and CUDA look, and the configured dirs), or with
    ``archived_roots``; other caches are skipped with a warning and listed in ``skipped``.
    ``venv`` is the environment that will use the caches: each cache's fingerprint is compared with it
    and every component that makes torch or Triton ignore the cache becomes a warning ("built by torch
    2.11.0+cu130 on NVIDIA H200; this environment has torch 2.13.0+cpu: Inductor will not use it").
    Raises ``RefusedError`` before writing anything when a manifest is unsafe (paths leaving the root,
    symlinks leading out, a symlink on disk that leads out), ``CorruptError`` when vault data is damaged.
    """
    if mode not in ("merge", "replace"):
        raise UsageError(f"unknown cache restore mode {mode!r}: use merge or replace")
    chosen = select_caches(snapshot, select)
    if select and not chosen:
        raise NotFoundError(f"no cache matching {', '.join(select)} in this snapshot; see `envvault cache list ID`")
    if to is not None and len(chosen) != 1:
        raise UsageError(f"--to needs exactly one cache and {len(chosen)} are selected; pick one with --kind or --root")
    target_fp, fp_note = _target_fingerprint(venv, env)
    trusted = None if to is not None or archived_roots else cache_roots(env, venv, vault.settings())
    skipped: list[dict] = []
    with vault.lock():
        reader = ObjectReader(vault)
        manifests = []
        for entry in chosen:  # every manifest is checked before any cache is written
            mid = entry.manifest
            manifests.append((mid, parse_manifest(vault.get_json(mid), f"cache manifest {mid[:12]}")))
        plans = []
        for mid, manifest in manifests:
            if trusted is not None and not _trusted(manifest.root, trusted):
                skipped.append({"kind": manifest.cache_kind, "root": manifest.root, "manifest": mid,
                                "reason": "not a cache directory of this environment"})
                continue
            dest = Path(os.path.abspath(to)) if to is not None else Path(manifest.root)
            plans.append(_plan(manifest, mid, dest, mode))
        results = []
        for plan in plans:
            started = time.monotonic()
            warnings = _where_torch_looks(plan.manifest.cache_kind, plan.dest, env) + plan.warnings
            mismatches = _mismatches(plan.manifest, target_fp)
            if not dry_run:
                _execute(plan, reader)
            results.append(CacheRestoreEntry(
                kind=plan.manifest.cache_kind, root=str(plan.dest), archived_root=plan.manifest.root,
                manifest=plan.mid, mode=mode, dry_run=dry_run,
                written_files=len(plan.writes) + len(plan.links) - plan.raced,
                written_bytes=sum(f.size for f in plan.writes), kept_files=plan.kept + plan.raced,
                removed_files=len(plan.removals), mismatches=tuple(mismatches), warnings=tuple(warnings),
                seconds=round(time.monotonic() - started, 3),
            ))  # fmt: skip
    flat = [f"{e.kind} cache {e.root}: {m.message}" for e in results for m in e.mismatches]
    flat += [w for e in results for w in e.warnings]
    flat += [f"{s['kind']} cache not restored: {s['root']} is not where this environment keeps compile caches "
             f"(the vault names it); pass --to {s['root']} (or --archived-roots) if you trust this snapshot"
             for s in skipped]
    if fp_note and results:
        flat.append(fp_note)
    return CacheRestoreResult(entries=tuple(results), skipped=tuple(skipped), warnings=tuple(flat), dry_run=dry_run)


def cache_roots(env: Mapping[str, str], venv: Path | None, vault_settings: dict) -> set[str]:
    """Where this environment keeps compile caches, existing or not: what torch, Triton and CUDA would use
    under ``env``, Inductor's default root and its precompiled headers, and the configured dirs."""
    from .config import configured_dirs
    from .discover import discover_caches

    roots = {loc.path for loc in discover_caches(env, configured_dirs(vault_settings, venv))}
    default, _ = inductor_cache_dir({k: v for k, v in env.items() if k != "TORCHINDUCTOR_CACHE_DIR"})
    roots |= {default, default / "precompiled_headers"}
    return {str(p) for p in roots} | {os.path.realpath(p) for p in roots}


def _trusted(root: str, trusted: set[str]) -> bool:
    real = os.path.realpath(root)
    return any(_within(candidate, t) for t in trusted for candidate in (root, real))


# -- fingerprints and where torch looks ------------------------------------------------------------


def _target_fingerprint(venv: Path | None, env: Mapping[str, str]) -> tuple[Fingerprint | None, str | None]:
    if venv is None:
        return None, "no environment to check the caches' fingerprints against; pass --venv PATH"
    from .snap_fingerprint import environment_fingerprint

    fp, why = environment_fingerprint(Path(venv), None, env)
    return (Fingerprint.from_dict(fp) if fp else None), why


def _mismatches(manifest: CacheManifest, target_fp: Fingerprint | None) -> list[Mismatch]:
    if target_fp is None or manifest.fingerprint is None:
        return []
    allowed = _COMPONENTS.get(manifest.cache_kind)
    found = compare(manifest.fingerprint, target_fp)
    if allowed is None:
        return found
    return [m for m in found if any(m.component == a or m.component.startswith(a) for a in allowed)]


def _where_torch_looks(kind: str, dest: Path, env: Mapping[str, str]) -> list[str]:
    if kind == "inductor":
        root, reason = inductor_cache_dir(env)
        default, _ = inductor_cache_dir({k: v for k, v in env.items() if k != "TORCHINDUCTOR_CACHE_DIR"})
        if dest in (root, default / "precompiled_headers"):
            return []
        return [f"Inductor here looks in {root} ({reason}), not {dest}: run with TORCHINDUCTOR_CACHE_DIR={dest} "
                "or restore with --to"]
    if kind == "triton":
        root, reason = triton_cache_dir(env)
        if dest == root or "/triton/" in f"{dest}/":
            return []
        return [f"Triton here looks in {root} ({reason}), not {dest}: run with TRITON_CACHE_DIR={dest} or restore with --to"]
    return []


# -- planning (reads the destination, writes nothing) ----------------------------------------------


@dataclass
class _Plan:
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
    kept: int = 0
    raced: int = 0  # merge: appeared while we staged, so left as found


def _plan(manifest: CacheManifest, mid: str, dest: Path, mode: Mode) -> _Plan:
    plan = _Plan(manifest=manifest, mid=mid, dest=dest, mode=mode)
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
    for f in manifest.files:
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


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


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
    return b64_sha256(h.digest()) == f.sha256


# -- execution --------------------------------------------------------------------------------------


def _execute(plan: _Plan, reader: ObjectReader) -> None:
    dest = plan.dest
    pid = os.getpid()
    created: list[str] = []
    try:
        _makedirs(str(dest), created)
        for rel in sorted({f.path.rpartition("/")[0] for f in plan.writes + plan.links} - {""}):
            _makedirs(os.path.join(dest, rel), created)
        specs = [FileSpec(f.path, f.chunks, f.size, f.sha256, f.mode) for f in plan.writes]
        staged = materialize.stage(reader, dest, specs, lambda final: _tmp_path(final, pid), workers=_WORKERS)
    except BaseException:
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise
    # Every file is staged and verified: from here on only renames, kernels first, graph entries last.
    merge = plan.mode == "merge"
    staged.sort(key=lambda s: (s.spec.path.startswith(_LAST), s.spec.path))
    for s in staged:
        if not materialize.place(s, keep_existing=merge):
            plan.raced += 1
    for f in plan.links:
        final = os.path.join(dest, f.path)
        if not materialize.place_link(f.target, final, lambda p: _tmp_path(p, pid), keep_existing=merge):
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


_RUN = os.urandom(3).hex()  # with the pid, keeps two restores (or a stale temp file) apart
_WORKERS = max(1, min(8, os.cpu_count() or 1))


def _tmp_path(final: str, pid: int) -> str:
    head, name = os.path.split(final)
    return os.path.join(head, f".{name}.envvault-{pid}-{_RUN}.tmp")


def _makedirs(path: str, created: list[str]) -> None:
    makedirs_recording(path, created, lambda p: StorageError(f"cannot create folder {path}: {p} is in the way"))
