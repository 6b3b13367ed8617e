"""The environment as it is now, in the terms the in-place planner (``plan.make_plan``) needs: each scanned
distribution paired with its RECORD (``read_current``), the install paths of the scan (``Layout``) and the
folders a restore never prunes (``protected_dirs``). Reads; writes nothing."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from envvault.model.snapshot import PackageSummary, PythonInfo
from envvault.restore.plan import CurrentDist, is_pyc
from envvault.vault.ingest import b64_sha256

__all__ = ["read_current", "Layout", "protected_dirs"]


def read_current(prefix: Path, interp: "Layout", packages: Sequence[PackageSummary],
                 wanted: Sequence[PackageSummary] = ()) -> list[CurrentDist]:
    """Pair each package summary of a scan with its RECORD, as ``CurrentDist`` records for the planner.
    Unhashed RECORD rows (RECORD itself) are hashed only for packages not identical to one in ``wanted``
    (the snapshot's packages): those are the only ones a restore may rewrite."""
    from envvault.env.dists import scan_dists

    same = {(p.name, p.version, p.build_id, p.state_id) for p in wanted}
    base = f"{str(prefix).rstrip('/')}/"  # a system environment's root may be "/"
    dists = scan_dists([interp.purelib, interp.platlib, *interp.sites])  # sites: a system environment's
    by_key: dict[tuple[str, str], list] = {}
    for d in dists:
        by_key.setdefault((d.name, d.version), []).append(d)
    out = []
    for p in packages:
        cands = by_key.get((p.name, p.version)) or []
        d = cands.pop(0) if cands else None
        if d is None or d.record is None:
            out.append(CurrentDist(p, None, {}, has_record=False))
            continue
        untouched = (p.name, p.version, p.build_id, p.state_id) in same
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
