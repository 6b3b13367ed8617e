"""Rebuild a wheel from a vaulted distribution manifest, so any installer can put the files back offline."""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from collections import deque
from concurrent.futures import Executor
from pathlib import Path, PurePosixPath
from typing import Iterator

from envvault.errors import CorruptError
from envvault.model.identity import (
    LAUNCHER_HEAD,
    DistLayout,
    is_generated,
    is_script,
    is_seed_marker,
    normalise_script,
)
from envvault.model.manifest import DistManifest, FileEntry, as_dist_manifest, parse_file_entry
from envvault.model.record import RecordEntry, format_record, record_sha256
from envvault.materialize import stored_bytes
from envvault.model.snapshot import PythonInfo, as_python
from envvault.vault.fsutil import tmp_name
from envvault.vault.store import ObjectReader, Vault

__all__ = ["check_wheel_source", "dist_layout", "rebuild_wheel", "wheel_filename", "wheel_member"]

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_AHEAD = 4  # chunks of one large file decompressed ahead of the zip writer


def _escape(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_filename(man: DistManifest | dict) -> str:
    man = as_dist_manifest(man)
    tags = man.wheel_tags or ("py3-none-any",)
    pys, abis, plats = [], [], []
    for tag in tags:
        parts = tag.split("-")
        if len(parts) != 3:
            continue
        for part, acc in zip(parts, (pys, abis, plats)):
            if part not in acc:
                acc.append(part)
    tag = "-".join(".".join(acc) for acc in (pys, abis, plats)) if pys else "py3-none-any"
    build = man.wheel_build
    build_part = f"-{build}" if build else ""
    version = man.version.replace("-", "_")
    return f"{_escape(man.name)}-{version}{build_part}-{tag}.whl"


# What a manifest may put into a wheel's file name and member paths (a shared vault is not trusted: a name
# "/abs/x" or "../x" would make export write outside its folder). Names: PEP 503 normalisable.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")
_DIST_INFO = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*\.dist-info")
_TAG = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+")
_BUILD = re.compile(r"[0-9][A-Za-z0-9_]*")


def _bad_member(member: str) -> bool:
    return (not member or "\x00" in member or "\\" in member or member.startswith("/")
            or any(part in ("", ".", "..") for part in member.split("/")))


def check_wheel_source(man: DistManifest | dict, python: PythonInfo | dict) -> None:
    """Refuse (exit 3) a manifest whose name, version, dist-info, tags or files would give a wheel file name
    or member outside where it belongs; called before anything is written. (The manifest parser has already
    refused absolute, ``..`` and NUL paths.)"""
    from envvault.errors import RefusedError

    man, python = as_dist_manifest(man), as_python(python)
    tags = (man.wheel or {}).get("tags")
    build = man.wheel_build
    name, version, di = man.name, man.version, man.dist_info
    checks = [
        ("name", name, _NAME.fullmatch(name)),
        ("version", version, _VERSION.fullmatch(version)),
        ("dist_info", di, isinstance(di, str) and _DIST_INFO.fullmatch(PurePosixPath(di).name)),
        ("wheel tags", tags, isinstance(tags or [], list) and all(isinstance(t, str) and _TAG.fullmatch(t)
                                                                 for t in tags or [])),
        ("wheel build", build, build is None or isinstance(build, str) and _BUILD.fullmatch(build)),
    ]
    shown = f"{name!r} {version!r}"
    for what, value, ok in checks:
        if not ok:
            raise RefusedError(f"refusing to rebuild the wheel of {shown}: its manifest has an unsafe {what} {value!r}")
    layout = dist_layout(man, python)
    for f in man.files:
        member = wheel_member(man, f, python, layout)
        if member is not None and _bad_member(member):
            raise RefusedError(f"refusing to rebuild the wheel of {shown}: file {f.record!r} would be the wheel "
                               f"member {member!r}, outside the wheel's folders")


def dist_layout(man: DistManifest, python: PythonInfo, entry_points=()) -> DistLayout:
    """The identity rules' view of an installed distribution (``model.identity.DistLayout``)."""
    di = PurePosixPath(man.dist_info or "")
    return DistLayout.of(di.name, str(di.parent), python.scripts or "bin", entry_points)


def wheel_member(man: DistManifest | dict, f: FileEntry | dict, python: PythonInfo | dict,
                 layout: DistLayout | None = None) -> str | None:
    """Where an installed file goes inside a wheel, or None when the installer regenerates it."""
    man, python = as_dist_manifest(man), as_python(python)
    if not isinstance(f, FileEntry):
        f = _file_entry(f)
    record = f.record
    di = man.dist_info_name or ""
    if is_generated(record, layout or dist_layout(man, python)) and not is_seed_marker(record):
        return None  # virtualenv's marker is no installer's to rewrite: carried, so the files stay as they were
    if not record.startswith("../"):
        return record
    data_dir = di[: -len(".dist-info")] + ".data"
    rel = PurePosixPath(f.path)
    scripts = PurePosixPath(python.scripts or "bin")
    if rel.parent == scripts:
        return f"{data_dir}/scripts/{rel.name}"
    if rel.parts[:2] == ("include", "site") and len(rel.parts) > 4:
        return f"{data_dir}/headers/" + "/".join(rel.parts[4:])
    return f"{data_dir}/data/{rel.as_posix()}"


def _file_entry(f: dict) -> FileEntry:
    problems: list[str] = []
    unsafe: list[str] = []
    out = parse_file_entry(f, "file", problems, unsafe)
    if out is None or problems:
        from envvault.errors import RefusedError

        raise RefusedError("refusing a manifest file entry: " + "; ".join(unsafe + problems))
    return out


def _file_bytes(reader: ObjectReader, f: FileEntry, ahead: Executor | None = None) -> Iterator[bytes]:
    """A stored file's chunks in order, each checked against its id. With ``ahead``, a file of several
    chunks (each its own frame) is decompressed a few chunks ahead on that pool."""
    chunks = f.chunks or ()
    if ahead is None or len(chunks) < 2:
        for oid in chunks:
            yield reader.get(oid)
        return
    pending: deque = deque()
    it = iter(chunks)
    for oid in it:
        pending.append(ahead.submit(reader.get, oid))
        if len(pending) >= _AHEAD:
            break
    while pending:
        data = pending.popleft().result()
        nxt = next(it, None)
        if nxt is not None:
            pending.append(ahead.submit(reader.get, nxt))
        yield data


def _head(reader: ObjectReader, f: FileEntry) -> bytes:
    """The first bytes of a stored file (its first chunk: at least 256 KiB unless the file is smaller)."""
    return bytes(reader.get(f.chunks[0])[:LAUNCHER_HEAD]) if f.chunks else b""


def _console_scripts(reader: ObjectReader, man: DistManifest) -> set[str]:
    di = man.dist_info_name
    for f in man.files:
        if f.record == f"{di}/entry_points.txt" and f.chunks is not None:
            text = stored_bytes(reader, f, f"{man.name} {man.version}").decode("utf-8", "replace")
            names, section = set(), None
            for line in text.splitlines():
                line = line.strip()
                if line.startswith("["):
                    section = line.strip("[]").strip()
                elif section in ("console_scripts", "gui_scripts") and "=" in line:
                    names.add(line.split("=", 1)[0].strip())
            return names
    return set()


def rebuild_wheel(vault: Vault, man: DistManifest | dict, python: PythonInfo | dict,
                  out_dir: Path, *, ahead: Executor | None = None) -> tuple[Path, str, int]:
    """Write ``out_dir/<wheel>``; return (path, sha256 hex, size). Deterministic bytes for one manifest.

    Members are stored (no compression: the vault's zstd frames are decompressed once and never
    recompressed); each chunk is checked against its id, and a member's RECORD hash is the one the manifest
    recorded for those bytes (hashed again only for scripts, whose shebang is normalised). Thread-safe:
    ``export`` rebuilds several wheels at once; ``ahead`` decompresses a large file's chunks in advance."""
    man, python = as_dist_manifest(man), as_python(python)
    check_wheel_source(man, python)
    reader = ObjectReader(vault)
    name = wheel_filename(man)
    final = out_dir / name
    layout = dist_layout(man, python, _console_scripts(reader, man))
    di = man.dist_info_name
    record_rows = []
    written: set[str] = set()
    tmp = tmp_name(out_dir, name)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for f in sorted(man.files, key=lambda f: f.record):
                if f.chunks is None and f.link is None:
                    continue
                member = wheel_member(man, f, python, layout)
                script = is_script(f.record, layout) and f.link is None
                if member is None or script and is_generated(f.record, layout, _head(reader, f)):
                    continue  # the installer writes launchers afresh (by name or by their shape)
                if member in written:  # two files of the manifest as one member: an ambiguous wheel
                    raise CorruptError(f"the manifest of {man.name} {man.version} names the wheel member {member} "
                                       "twice; refused")
                written.add(member)
                info = zipfile.ZipInfo(member, date_time=_ZIP_EPOCH)
                info.external_attr = (((f.mode or 0o644) & 0o777) | 0o100000) << 16
                # The recorded sha256 of checked bytes, unless they are a link's text or a rewritten script.
                known = f.sha256 if f.link is None and not script and f.sha256 and f.size is not None else None
                h, size = hashlib.sha256(), 0
                with zf.open(info, "w", force_zip64=(f.size or 0) > (1 << 30)) as out:
                    pieces = [f.link.encode()] if f.link is not None else _file_bytes(reader, f, ahead)
                    for i, data in enumerate(pieces):
                        if i == 0 and script:
                            data = normalise_script(bytes(data))
                        out.write(data)
                        if known is None:
                            h.update(data)
                        size += len(data)
                if known is not None and size == f.size:
                    record_rows.append(RecordEntry(member, "sha256", known, size))
                else:
                    record_rows.append(RecordEntry(member, "sha256", record_sha256(h.digest()), size))
            record_rows.append(RecordEntry(f"{di}/RECORD", None, None, None))
            info = zipfile.ZipInfo(f"{di}/RECORD", date_time=_ZIP_EPOCH)
            info.external_attr = 0o100644 << 16
            zf.writestr(info, format_record(record_rows))
        h = hashlib.sha256()
        with open(tmp, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return final, h.hexdigest(), final.stat().st_size
