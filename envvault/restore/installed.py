"""Putting a distribution that uv just installed into the state a snapshot recorded: finding its dist-info
folder, reading and rewriting its RECORD, re-applying files that were edited or missing at snapshot time.
Shared by ``restore --into`` and lock-only restores (``uv.py``), below both."""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from envvault.model.manifest import DistManifest
from envvault.model.record import format_record, parse_record
from envvault.model.snapshot import PythonInfo

__all__ = ["find_dist_info", "read_record", "reapply_state", "replace_file"]


def read_record(text: str) -> list[list[str]]:
    return [e.to_row() for e in parse_record(text)[0]]


def reapply_state(vault, dest: Path, python: PythonInfo, man: DistManifest) -> None:
    """Make edited / deleted files as they were at snapshot time, with the RECORD rows the snapshot had."""
    di = man.dist_info or ""
    record_rel = f"{PurePosixPath(di).name}/RECORD"
    original = next((f for f in man.files if f.record == record_rel and f.chunks is not None), None)
    if original is None:
        return
    old_rows = {row[0]: row for row in read_record(b"".join(vault.get(c) for c in original.chunks).decode("utf-8"))}
    new_dist_info = find_dist_info(dest, python, PurePosixPath(di).name)
    if new_dist_info is None:
        return
    site = new_dist_info.parent
    record_path = new_dist_info / "RECORD"
    rows = read_record(record_path.read_text(encoding="utf-8"))
    by_path = {row[0]: i for i, row in enumerate(rows)}
    for f in man.files:
        if f.state not in ("modified", "missing"):
            continue
        rec = f.record
        old = old_rows.get(rec)
        if old is None:
            continue
        if f.state == "missing":
            try:
                os.unlink(os.path.normpath(site / rec))
            except FileNotFoundError:
                pass
        if rec in by_path:
            rows[by_path[rec]] = old
        else:
            rows.insert(len(rows) - 1, old)
    replace_file(record_path, format_record(rows).encode("utf-8"))


def replace_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.envvault-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _dist_key(dist_info_name: str) -> str:
    """``Foo.Bar-1.0.dist-info`` and ``foo_bar-1.0.dist-info`` name one distribution."""
    name, _, version = dist_info_name[: -len(".dist-info")].partition("-")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}"


def find_dist_info(dest: Path, python: PythonInfo, name: str) -> Path | None:
    """The dist-info folder the installer wrote for the snapshot's ``name`` (purelib or platlib; a wheel from
    an index may spell the name another way)."""
    for lib in (python.purelib, python.platlib):
        candidate = dest / (lib or "lib") / name
        if candidate.is_dir():
            return candidate
    found = list(dest.glob(f"lib*/python*/site-packages/{name}"))
    if found:
        return found[0]
    key = _dist_key(name)
    return next((p for p in dest.glob("lib*/python*/site-packages/*.dist-info") if _dist_key(p.name) == key), None)
