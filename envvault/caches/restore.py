"""Restoring archived compile caches (docs/format.md, "Restoring caches"): which caches of a snapshot, to
which roots (only those this environment uses, unless told), what each cache's fingerprint means for the
environment that will use it (warnings), and what was done. The work on one cache root (plan, stage,
rename, delete) is ``restore_tree.py``'s; files go through the one materializer (``envvault/materialize.py``).

Every manifest is parsed and validated (``model.cache.parse_manifest``) and every cache planned (entries
decided against the final tree) before any cache is written.
"""

from __future__ import annotations

import os
import time
from envvault.model.records import dataclass, field
from pathlib import Path

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Mapping, Sequence

    from .restore_tree import Mode


from ..errors import NotFoundError, UsageError
from ..model.cache import CacheManifest, parse_manifest
from ..model.snapshot import CacheEntry, Snapshot, as_snapshot
from ..vault.store import ObjectReader
from .discover import inductor_cache_dir, triton_cache_dir
from .fingerprint import Fingerprint, Mismatch, compare
from .restore_tree import execute_tree, plan_tree

__all__ = ["CacheRestoreEntry", "CacheRestoreResult", "restore_snapshot_caches", "select_caches", "cache_roots"]

# Components of a fingerprint each kind of cache depends on (None: all of them).
_COMPONENTS: dict[str, tuple[str, ...]] = {
    "triton": ("triton", "gpu", "python", "env:TRITON"),
    "cuda": ("gpu",),
    "torch_extensions": ("torch", "torch_build", "python"),
}


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
    """The snapshot's cache entries that have a manifest, limited to ``select``: kinds and archived roots (a
    path), a cache matching one of the kinds given and one of the roots given (``--kind inductor --root R``
    is that cache, not every inductor cache and R: helper 31)."""
    entries = [c for c in as_snapshot(snapshot).caches or () if c.manifest]
    if not select:
        return entries
    paths = [s for s in select if "/" in s or s.startswith("~")]
    kinds = {s for s in select if s not in paths}
    roots = {os.path.abspath(os.path.expanduser(s)) for s in paths}
    return [c for c in entries if (not kinds or c.kind in kinds) and (not roots or c.root in roots)]


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
    sid: str | None = None,
) -> CacheRestoreResult:
    """Restore the caches archived in ``snapshot`` (all, or those ``select`` names by kind or root); ``sid``:
    its id, checked to be still there once the vault lock is held (a gc waited for may have deleted it).

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
        if sid is not None:
            vault.snapshot_still_there(sid)
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
            plans.append(plan_tree(manifest, mid, dest, mode))
        results = []
        for plan in plans:
            started = time.monotonic()
            mismatches = _mismatches(plan.manifest, target_fp)
            if not dry_run:
                execute_tree(plan, reader)
            warnings = _where_torch_looks(plan.manifest.cache_kind, plan.dest, env) + plan.warnings  # as run
            results.append(CacheRestoreEntry(
                kind=plan.manifest.cache_kind, root=str(plan.dest), archived_root=plan.manifest.root,
                manifest=plan.mid, mode=plan.mode, dry_run=dry_run,
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
    """Whether ``root`` lies in a trusted cache directory: real paths only (never the text as given, whose
    ``..`` or symlinks could lead elsewhere)."""
    real = os.path.realpath(root)
    return any(_within(real, os.path.realpath(t)) for t in trusted)


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
        if dest.name == "precompiled_headers":  # (helper 31: the hint named a variable torch ignores for these)
            return [f"Inductor here keeps precompiled headers in {default / 'precompiled_headers'} whatever "
                    f"TORCHINDUCTOR_CACHE_DIR says, not {dest}: restore with --to {default / 'precompiled_headers'}"]
        return [f"Inductor here looks in {root} ({reason}), not {dest}: run with TORCHINDUCTOR_CACHE_DIR={dest} "
                "or restore with --to"]
    if kind == "triton":
        root, reason = triton_cache_dir(env)
        if dest == root or "/triton/" in f"{dest}/":
            return []
        return [f"Triton here looks in {root} ({reason}), not {dest}: run with TRITON_CACHE_DIR={dest} or restore with --to"]
    return []


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
