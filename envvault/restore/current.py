"""The environment as it is now, in the terms the in-place planner (``plan.make_plan``) needs: each scanned
distribution paired with its RECORD (``read_current``), the install paths of the scan (``Layout``) and the
folders a restore never prunes (``protected_dirs``). Reads; writes nothing."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from envvault.model.records import dataclass
from pathlib import Path
from typing import Sequence

from envvault.model.snapshot import PackageSummary, PythonInfo
from envvault.restore.plan import CurrentDist, is_pyc
from envvault.env.static import read_env_file
from envvault.errors import CorruptError
from envvault.model.record import record_sha256

__all__ = ["read_current", "Layout", "protected_dirs"]


def read_current(prefix: Path, interp: "Layout", packages: Sequence[PackageSummary],
                 wanted: Sequence[PackageSummary] = ()) -> list[CurrentDist]:
    """Pair each package summary of a scan with its RECORD, as ``CurrentDist`` records for the planner.
    Unhashed RECORD rows (RECORD itself) are hashed only for packages not identical to one in ``wanted``
    (the snapshot's packages): those are the only ones a restore may rewrite. In a venv the untouched ones
    (identical to one in ``wanted``) are found by their folder's name and read only when the planner asks
    for their files (a restore that removes nothing never does)."""
    from envvault.env.dists import dist_entries, read_any, scan_dists

    same = {(p.name, p.version, p.build_id, p.state_id) for p in wanted}
    base = f"{str(prefix).rstrip('/')}/"  # a system environment's root may be "/"
    sites = [interp.purelib, interp.platlib, *interp.sites]  # sites: a system environment's
    deferred: dict[tuple[str, str], tuple[Path, Path]] = {}
    if not interp.sites:
        untouched = {(_norm(p.name), p.version) for p in packages if (p.name, p.version, p.build_id, p.state_id) in same}
        found: dict[tuple[str, str], list[tuple[Path, Path]]] = {}
        for site in dict.fromkeys(sites):
            if site.is_dir():
                for entry in dist_entries(site):
                    key = _folder_key(entry.name)
                    if key in untouched:
                        found.setdefault(key, []).append((entry, site))
        deferred = {k: v[0] for k, v in found.items() if len(v) == 1 and v[0][0].is_dir()}
        skip = {entry for entry, _site in deferred.values()}
        dists = scan_dists(sites, skip)
    else:
        dists = scan_dists(sites)
    by_key: dict[tuple[str, str], list] = {}
    for d in dists:
        by_key.setdefault((d.name, d.version), []).append(d)
    out = []
    for p in packages:
        untouched = (p.name, p.version, p.build_id, p.state_id) in same
        entry = deferred.pop((_norm(p.name), p.version), None) if untouched else None
        if entry is not None:
            di = str(entry[0])
            out.append(CurrentDist(p, di[len(base):] if di.startswith(base) else None,
                                   _Deferred(lambda e=entry, p=p: _files_of(read_any(*e), p, base, True))))
            continue
        cands = by_key.get((p.name, p.version)) or []
        d = cands.pop(0) if cands else None
        if d is None or d.record is None:
            out.append(CurrentDist(p, None, {}, has_record=False))
            continue
        di = str(d.dist_info)
        out.append(CurrentDist(p, di[len(base):] if di.startswith(base) else None, _files_of(d, p, base, untouched)))
    return out


def _files_of(d, p: PackageSummary, base: str, untouched: bool) -> dict[str, str | None]:
    """RECORD path (relative to the environment) -> sha256 when the bytes on disk are known to match."""
    if d is None or d.record is None:
        return {}
    bad = set(p.modified) | set(p.missing)
    files: dict[str, str | None] = {}
    site = f"{d.site}/"
    for e in d.record:
        absolute = os.path.normpath(site + e.path)
        if not absolute.startswith(base):
            continue  # outside the environment: never deleted by a restore
        rel = absolute[len(base):]
        if e.algo == "sha256" and e.digest:
            files[rel] = None if rel in bad else e.digest
        elif untouched or is_pyc(rel) or os.path.islink(absolute):
            files[rel] = None  # (a link RECORD gives no hash for, pdm's into its cache: written anew, a file)
        else:  # RECORD itself: hash it (small), so an unchanged one stays untouched
            files[rel] = _sha_of_small(absolute)
    return files


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _folder_key(entry: str) -> tuple[str, str] | None:
    """``(normalised name, version)`` a ``<name>-<version>.dist-info`` folder names, else None."""
    if not entry.endswith(".dist-info"):
        return None
    name, sep, version = entry[: -len(".dist-info")].partition("-")
    return (_norm(name), version) if sep and name and version else None


class _Deferred(Mapping):
    """A distribution's ``files`` read on first use."""

    def __init__(self, load):
        self._load, self._files = load, None

    def _get(self) -> dict:
        if self._files is None:
            self._files = self._load()
        return self._files

    def __getitem__(self, key):
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def _sha_of_small(path: str) -> str | None:
    """The sha256 of a small file of the environment (a RECORD), or None: a FIFO or a device in its place is
    never waited on, a file over the dist-info limit never read whole."""
    try:
        data = read_env_file(path)
    except (OSError, CorruptError):
        return None
    return record_sha256(hashlib.sha256(data).digest())


@dataclass(frozen=True)
class Layout:
    """The install paths of an environment, from a scan's ``python`` record (no second probe)."""

    purelib: Path
    platlib: Path
    scripts: Path
    sites: tuple[Path, ...] = ()  # a system environment's site directories (docs/format.md, "Environment kinds")

    @classmethod
    def of(cls, prefix: Path, python: PythonInfo) -> "Layout":
        def at(value: str | None, default: str) -> Path:
            path = Path(value or default)
            return path if path.is_absolute() else prefix / path
        return cls(at(python.purelib, "lib"), at(python.platlib, python.purelib or "lib"), at(python.scripts, "bin"),
                   tuple(at(s, "lib") for s in python.sites or ()))


def protected_dirs(target: Path, interp: Layout) -> set[str]:
    """The prefix, site-packages and scripts folders and every folder between: never pruned when empty."""
    keep = {str(target)}
    for p in (interp.purelib, interp.platlib, interp.scripts, *interp.sites):
        p = str(p)
        while p.startswith(str(target)) and p not in keep:
            keep.add(p)
            p = os.path.dirname(p)
    return keep
