"""Where each build of a lock-only snapshot can come from: the one rule ``restore`` (in place and ``--into``)
and ``export`` share.

A lock-only snapshot records each distribution's name, version and build id, not its files. Its builds are
found, in this order:

1. a stored copy of the same build in the vault (any full snapshot holding a package with that build id and
   its files): an unedited copy first; when only an edited state of the build is stored, that one, and the
   files whose bytes differ from RECORD are named (the restore puts them back edited, with RECORD's rows);
2. the wheel URL and hash its installer recorded (``direct_url.json`` in the lock-only manifest).

``resolve_sources`` decides without reading a single file's bytes (snapshot documents and the vault index
only), so a restore that cannot succeed fails before any slow work, and ``--dry-run`` runs the very same
decision. ``pylock_entries`` then rebuilds the wheels of stored copies.
"""

from __future__ import annotations

import os
from envvault.model.records import dataclass
from pathlib import Path

from envvault.model.manifest import DistManifest, as_dist_manifest
from envvault.model.snapshot import PackageSummary, Snapshot, as_snapshot

__all__ = ["StoredCopy", "Source", "stored_copies", "resolve_sources", "pylock_entries", "describe"]


def original_source(man: DistManifest | dict) -> dict | None:
    """The wheel URL and hash from ``direct_url.json`` (PEP 610, a document of the installer's, read as
    such), when the installer recorded them."""
    du = as_dist_manifest(man).direct_url or {}
    url = du.get("url")
    info = du.get("archive_info")
    if not url or not isinstance(info, dict):
        return None
    given, one = info.get("hashes"), info.get("hash")  # a document of the installer's: a malformed part is absent
    hashes = {k: v for k, v in given.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(given, dict) else {}
    if not hashes and isinstance(one, str) and "=" in one:
        algo, value = one.split("=", 1)
        hashes[algo] = value
    return {"url": url, "hashes": hashes} if hashes else {"url": url}


@dataclass(frozen=True)
class StoredCopy:
    """A full snapshot's copy of one build: ``differs`` are the files edited in place (bytes differ from
    RECORD), ``missing`` the files RECORD lists that were absent."""

    build_id: str
    snapshot: str
    manifest: str
    differs: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    @property
    def edited(self) -> bool:
        return bool(self.differs or self.missing)


@dataclass(frozen=True)
class Source:
    """Where one package of a lock-only snapshot comes from: ``copy`` or ``url`` (a dict {url, hashes}),
    or neither (no known source)."""

    package: PackageSummary
    copy: StoredCopy | None = None
    url: dict | None = None

    @property
    def known(self) -> bool:
        return self.copy is not None or self.url is not None


def stored_copies(vault) -> dict[str, StoredCopy]:
    """build id -> the best stored copy of that build in the vault: unedited before edited (fewest edited
    files first), then the newest snapshot."""
    best: dict[str, tuple[tuple, StoredCopy]] = {}
    for s in vault.snapshots():  # newest first
        if s.snapshot.lock_only:
            continue
        for p in s.snapshot.packages:
            b, mid = p.build_id, p.manifest
            if p.record != "ok":
                continue
            differs = tuple(sorted(p.modified)) if p.state_id != b else ()
            copy = StoredCopy(b, s.id, mid, differs, tuple(sorted(p.missing)))
            rank = (len(copy.differs) + len(copy.missing),)
            if b not in best or rank < best[b][0]:
                if vault.has(mid):
                    best[b] = (rank, copy)
    return {b: c for b, (_r, c) in best.items()}


def resolve_sources(vault, doc: Snapshot | dict, *, copies: bool = True) -> list[Source]:
    """One ``Source`` per package of the lock-only snapshot ``doc``, in its order. Reads snapshot documents
    and, for packages without a stored copy, their (file-less) lock-only manifests; never a file's bytes.
    ``copies=False``: recorded URLs only (an export without wheels)."""

    snap = as_snapshot(doc)
    copies = stored_copies(vault) if copies else {}
    out = []
    for p in snap.packages:
        copy = copies.get(p.build_id)
        if copy is not None:
            out.append(Source(p, copy=copy))
            continue
        url = None
        mid = p.manifest
        if vault.has(mid):
            src = original_source(vault.load_manifest(mid))
            if src and src.get("hashes") and src["url"].endswith(".whl"):
                url = src
        out.append(Source(p, url=url))
    return out


def describe(source: Source) -> str | None:
    """A line for a package restored from an edited copy (which files differ from RECORD), else None."""
    c = source.copy
    if c is None or not c.edited:
        return None
    p = source.package
    parts = []
    if c.differs:
        parts.append(f"{', '.join(c.differs)} differ{'s' if len(c.differs) == 1 else ''} from RECORD")
    if c.missing:
        parts.append(f"{', '.join(c.missing)} absent")
    return (f"{p.name} {p.version}: only an edited copy of its build is stored (snapshot {c.snapshot[:12]}); "
            f"it is restored as stored: {'; '.join(parts)}")


def pylock_entries(vault, sid: str, doc: Snapshot | dict, sources: list[Source], wheel_dir: Path,
                   rel_base: Path) -> list[dict]:
    """Entries for ``envvault.lock.export.pylock_document``: a wheel rebuilt under ``wheel_dir`` for each
    stored copy (path relative to ``rel_base``, where the lockfile lives), else the recorded URL, else no
    source. Each entry also carries ``copy`` (the ``StoredCopy`` or None)."""
    from envvault.lock.wheels import rebuild_wheel

    python = as_snapshot(doc).python
    entries = []
    for s in sources:
        entry = {"summary": s.package, "snapshot": sid, "source": s.url, "wheel": None, "copy": s.copy}
        if s.copy is not None:
            wheel_dir.mkdir(parents=True, exist_ok=True)
            path, sha, size = rebuild_wheel(vault, vault.load_manifest(s.copy.manifest), python, wheel_dir)
            entry["wheel"] = {"name": path.name, "path": os.path.relpath(path, rel_base), "size": size, "sha256": sha}
        entries.append(entry)
    return entries
