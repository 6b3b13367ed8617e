"""Putting a distribution that uv just installed into the state a snapshot recorded: finding its dist-info
folder, reading and rewriting its RECORD, re-applying files that were edited or missing at snapshot time.
Shared by ``restore --into`` and lock-only restores (``uv.py``), below both."""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from envvault.errors import CorruptError
from envvault.materialize import stored_bytes
from envvault.model.identity import normalise_script
from envvault.model.manifest import DistManifest
from envvault.model.record import format_record, parse_record
from envvault.model.snapshot import PythonInfo
from envvault.safepaths import FinalTree, reserved_problem

__all__ = ["find_dist_info", "installed_script", "read_record", "reapply_state", "replace_file", "shebang",
           "stored_record"]

_MAX_SHEBANG = 127  # what Linux reads of a ``#!`` line


def shebang(python: str) -> bytes:
    """The head an installer writes into a script for the interpreter ``python`` (as uv and pip do): one
    ``#!`` line, or, for a path too long for the kernel or holding a space, a ``/bin/sh`` trampoline."""
    exe = os.fsencode(python)
    if len(exe) + 2 > _MAX_SHEBANG or b" " in exe:
        return b"#!/bin/sh\n'''exec' '" + exe + b"' \"$0\" \"$@\"\n' '''\n"
    return b"#!" + exe + b"\n"


def installed_script(data: bytes, python: str) -> bytes:
    """A scripts-folder file as an installer writes it for ``python``: a python shebang (the wheel's
    ``#!python``, or what another installer rewrote it to; launchers included) becomes this interpreter's;
    any other file is returned as is (the same object)."""
    wheel = normalise_script(data)
    if wheel is data:
        return data
    return shebang(python) + wheel[len(b"#!python\n"):]


def read_record(text: str) -> list[list[str]]:
    return [e.to_row() for e in parse_record(text)[0]]


def stored_record(reader, f, owner: str) -> list[list[str]]:
    """The rows of a RECORD stored in the vault (manifest entry ``f`` of distribution ``owner``): its bytes
    bounded by its recorded size (``materialize.stored_bytes``), ``CorruptError`` when they are not UTF-8."""
    data = stored_bytes(reader, f, owner)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptError(f"{f.path} ({owner}): the stored RECORD is not UTF-8; run `envvault verify`") from None
    return read_record(text)


def reapply_state(vault, dest: Path, python: PythonInfo, man: DistManifest) -> None:
    """Make edited / deleted files as they were at snapshot time, with the RECORD rows the snapshot had."""
    di = man.dist_info or ""
    record_rel = f"{PurePosixPath(di).name}/RECORD"
    original = next((f for f in man.files if f.record == record_rel and f.chunks is not None), None)
    if original is None:
        return
    old_rows = {row[0]: row for row in stored_record(vault, original, f"{man.name} {man.version}")}
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
        if f.state == "missing" and rec in by_path:  # only a file of the package just installed (helper 32, 2)
            _unlink_inside(dest, site, rec)
        if rec in by_path:
            rows[by_path[rec]] = old
        else:
            rows.insert(len(rows) - 1, old)
    replace_file(record_path, format_record(rows).encode("utf-8"))


def _unlink_inside(dest: Path, site: Path, rec: str) -> None:
    """Remove the file a RECORD path ``rec`` (relative to ``site``) names, only when it lies inside ``dest``,
    no symlink on its way leads out of it (safepaths.FinalTree) and it is not the venv's own interpreter or
    pyvenv.cfg (``safepaths.reserved_problem``); anything else is left alone."""
    rel = os.path.relpath(os.path.normpath(site / rec), os.path.normpath(dest)).replace(os.sep, "/")
    if (rel == "." or rel == ".." or rel.startswith("../") or FinalTree(dest).write_problem(rel) is not None
            or reserved_problem(rel, ("bin",)) is not None):  # never the venv's interpreter or pyvenv.cfg
        return
    try:
        os.unlink(dest / rel)
    except FileNotFoundError:
        pass


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
    an index may spell the name another way), inside ``dest``. The snapshot's purelib, platlib and ``name``
    may be anyone's: one that is not a plain relative path, or that leads out of ``dest`` by a symlink on its
    way (safepaths.FinalTree), is not looked at."""
    tree = FinalTree(dest)
    for lib in (python.purelib, python.platlib):
        rel = f"{lib or 'lib'}/{name}"
        if isinstance(lib, (str, type(None))) and tree.write_problem(rel) is None and (dest / rel).is_dir():
            return dest / rel
    if "/" in name or name in ("", ".", ".."):
        return None
    found = [p for p in dest.glob(f"lib*/python*/site-packages/{name}") if not _leads_out(dest, tree, p)]
    if found:
        return found[0]
    key = _dist_key(name)
    return next((p for p in dest.glob("lib*/python*/site-packages/*.dist-info")
                 if _dist_key(p.name) == key and not _leads_out(dest, tree, p)), None)


def _leads_out(dest: Path, tree: FinalTree, path: Path) -> bool:
    return tree.write_problem(path.relative_to(dest).as_posix()) is not None
