"""What identifies an installed distribution: which RECORD rows the installer generated, the build id, the
state id and an environment's fingerprint (docs/format.md, glossary).

Pure rules: RECORD entries, file heads and names in, ids out. Every module that asks "is this row the
wheel's or the installer's?" asks here (snap, status, guard, caches, export, ``restore --into``, stamps).
"""

from __future__ import annotations

import posixpath
import re
from envvault.model.records import dataclass
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Iterable

import blake3

from envvault.model.record import RecordEntry, record_sha256

__all__ = [
    "IDENTITY_VERSION", "GENERATED_NAMES", "DistLayout", "is_bytecode", "bytecode_source", "is_script", "is_generated",
    "is_launcher", "is_seed_marker", "normalise_script", "script_digest", "build_id", "scripts_id", "state_id", "fingerprint",
    "lock_fingerprint", "record_line", "verbatim_rows", "same_build", "egg_link_build_id", "LAUNCHER_HEAD",
]

# 1: every non-generated row entered the build id, data scripts with the hash of their rewritten shebang.
# 2: rows installed into the scripts folder are left out of the build id (docs/format.md, "build id").
IDENTITY_VERSION = 2

# Files an installer writes into the dist-info folder itself; they differ between pip and uv installs.
GENERATED_NAMES = frozenset(
    {"INSTALLER", "REQUESTED", "RECORD", "RECORD.jws", "RECORD.p7s", "direct_url.json", "uv_cache.json"}
)

# Bytes of a script's head that tell a launcher (every launcher pip, uv or installer writes is < 1 KiB).
LAUNCHER_HEAD = 4096


@dataclass(frozen=True, slots=True)
class DistLayout:
    """What the rules need to know about one installed distribution. ``dist_info``: the dist-info folder's
    name; ``scripts``: the scripts folder relative to the site directory RECORD paths start from
    (``../../../bin`` in a POSIX venv); ``entry_points``: its console and gui script names."""

    dist_info: str
    scripts: str = "../../../bin"
    entry_points: frozenset[str] = frozenset()

    @classmethod
    def of(cls, dist_info: str, site: str, scripts_dir: str, entry_points: Iterable[str] = ()) -> DistLayout:
        """From absolute paths of the site directory and the scripts folder."""
        return cls(dist_info, posixpath.relpath(scripts_dir, site), frozenset(entry_points))


def is_bytecode(path: str) -> bool:
    """``*.pyc`` / ``*.pyo``, or anything in (or naming) a ``__pycache__`` folder: installers compile these
    (pip does, uv does not), so they are never part of a build."""
    return path.endswith((".pyc", ".pyo")) or ("__pycache__" in path and "__pycache__" in path.split("/"))


def bytecode_source(path: str) -> str | None:
    """The source file whose bytecode ``path`` is (``d/__pycache__/m.cpython-312.pyc`` and ``...opt-1.pyc``:
    ``d/m.py``), or None for anything else. The one rule for "the bytecode of a source" (a restore drops the
    bytecode of every source it writes or deletes, and clears that of the sources it deletes)."""
    folder, _, name = path.rpartition("/")
    parent, _, cache = folder.rpartition("/")
    if cache != "__pycache__" or not name.endswith(".pyc"):
        return None
    parts = name.split(".")  # <stem>.<tag>.pyc or <stem>.<tag>.opt-N.pyc
    if len(parts) < 3:
        return None
    stem = ".".join(parts[:-3] if len(parts) > 3 and parts[-2].startswith("opt-") else parts[:-2])
    if not stem:
        return None
    return f"{parent}/{stem}.py" if parent else f"{stem}.py"


def is_seed_marker(path: str) -> bool:
    """The ``<name>-<version>.virtualenv`` file virtualenv's seeder writes at the top of site-packages."""
    return "/" not in path and path.endswith(".virtualenv")


def _is_installer_file(path: str, dist: DistLayout) -> bool:
    """The dist-info files in ``GENERATED_NAMES``, and virtualenv's seed marker."""
    head, sep, tail = path.partition("/")
    if not sep:
        return is_seed_marker(head)
    return head == dist.dist_info and tail in GENERATED_NAMES


def is_script(path: str, dist: DistLayout) -> bool:
    """True when the RECORD path lies in the scripts folder: launchers and ``<name>.data/scripts/`` files,
    whose bytes the installer writes or rewrites for the interpreter at hand."""
    return path.startswith("../") and posixpath.dirname(posixpath.normpath(path)) == dist.scripts


# The shebang installers write: one line naming an interpreter, or (for paths too long for the kernel)
# /bin/sh with an `exec` trampoline over three lines.
_SHEBANG = re.compile(rb"#![^\n]*python[^\n]*(?:\n|\Z)")
_TRAMPOLINE = re.compile(rb"#!/bin/sh\r?\n'''exec' [^\n]*python[^\n]*\n' '''\r?\n")

_LAUNCHER_BODY = re.compile(
    r"(?:# -\*- coding: utf-8 -\*-\n)?"
    r"(?:import (?:re|sys)\n){1,2}"
    r"(?:from [A-Za-z_][\w.]* import [A-Za-z_]\w*\n)?"  # virtualenv imports inside the __main__ block
    r'if __name__ == "__main__":\n'
    r"(?:    [^\n]*\n){1,6}"
)
_IMPORT = re.compile(r"^ *from [A-Za-z_][\w.]* import [A-Za-z_]\w*$", re.M)


def _shebang_end(data: bytes) -> int | None:
    """Where a python shebang (one line or the /bin/sh trampoline) ends, or None when there is none."""
    m = _TRAMPOLINE.match(data) or _SHEBANG.match(data)
    return m.end() if m else None


def is_launcher(head: bytes) -> bool:
    """True when ``head`` (a script's first bytes) is a console-script launcher as pip, uv or installer
    write them: a python shebang, then ``from MOD import FUNC`` and a ``__main__`` block that strips
    ``-script.pyw`` from ``sys.argv[0]`` and exits with ``FUNC()``. Decided by content, not by name: pip
    writes ``pip3.X`` for the running Python whatever ``entry_points.txt`` says."""
    end = _shebang_end(head)
    if end is None or len(head) >= LAUNCHER_HEAD:
        return False
    try:
        body = head[end:].decode("utf-8")
    except UnicodeDecodeError:
        return False
    body = body.replace("\r\n", "\n").replace("'", '"')
    if not body.endswith("\n"):
        body += "\n"
    return (_LAUNCHER_BODY.fullmatch(body) is not None and len(_IMPORT.findall(body)) == 1
            and "sys.argv[0]" in body and "-script" in body and "sys.exit(" in body)


def is_generated(row: RecordEntry | str, dist: DistLayout, head: bytes | None = None) -> bool:
    """True when the installer, not the wheel, made this row's file: bytecode, the dist-info files in
    ``GENERATED_NAMES``, virtualenv's ``*.virtualenv`` marker, and launchers in the scripts folder (named in ``entry_points.txt``, or, when the
    file's ``head`` is given, shaped like one)."""
    path = row.path if isinstance(row, RecordEntry) else row
    if is_bytecode(path) or _is_installer_file(path, dist):
        return True
    if not is_script(path, dist):
        return False
    return posixpath.basename(path) in dist.entry_points or (head is not None and is_launcher(head))


def normalise_script(data: bytes) -> bytes:
    """A script as the wheel shipped it: a python shebang (as rewritten by the installer) becomes
    ``#!python``; other files are returned unchanged."""
    end = _shebang_end(data)
    return data if end is None else b"#!python\n" + data[end:]


def script_digest(data: bytes) -> str:
    """RECORD-style sha256 of the normalised script."""
    import hashlib  # here: a quick command (status, a second snap) loads no OpenSSL

    return record_sha256(hashlib.sha256(normalise_script(data)).digest())


def record_line(row: RecordEntry) -> str:
    return f"{row.path},{row.hash_field},{'' if row.size is None else row.size}"


def build_id(rows: Iterable[RecordEntry], dist: DistLayout) -> str:
    """BLAKE3 over the sorted RECORD lines that neither the installer generated nor it rewrites (files in the
    scripts folder). Needs RECORD only, never file contents, so a lock-only scan gets the same id."""
    # Not generated and not a script: bytecode, the installer's dist-info files and every file of the scripts
    # folder (launchers among them: ``is_generated``'s last case lies inside ``is_script``) are left out.
    lines = sorted(record_line(r) for r in rows
                   if not (is_bytecode(r.path) or _is_installer_file(r.path, dist) or is_script(r.path, dist)))
    return blake3.blake3("\n".join(lines).encode()).hexdigest()


def egg_link_build_id(target: str) -> str:
    """An old-style editable has no RECORD: its identity is where its files are."""
    return blake3.blake3(f"egg-link {target}".encode()).hexdigest()


def scripts_id(scripts: Iterable[tuple[str, str]]) -> str | None:
    """BLAKE3 over sorted ``name digest`` lines of a distribution's non-generated scripts (digest of the
    normalised content), or None when it has none."""
    lines = sorted(f"{name} {digest}" for name, digest in scripts)
    return blake3.blake3("\n".join(lines).encode()).hexdigest() if lines else None


def state_id(build: str, modified: Iterable[tuple[str, str]]) -> str:
    """The build id when nothing is edited, else BLAKE3 over it and the sorted ``path sha256`` lines."""
    modified = sorted(modified)
    if not modified:
        return build
    text = build + "\n" + "\n".join(f"{p} {h}" for p, h in modified)
    return blake3.blake3(text.encode()).hexdigest()


def fingerprint(python_version: str, packages: Iterable[dict]) -> str:
    """BLAKE3 over ``python <version>`` and the sorted ``name version state_id`` lines."""
    lines = [f"python {python_version}"] + sorted(f"{p['name']} {p['version']} {p['state_id']}" for p in packages)
    return blake3.blake3("\n".join(lines).encode()).hexdigest()


def lock_fingerprint(python_version: str, packages: Iterable[tuple[str, str, str]]) -> str:
    """The lock-level fingerprint of ``(name, version, build id)`` packages: the fingerprint with each build id
    in place of the state id (what checkpoint stamps carry and are matched by; docs/format.md)."""
    return fingerprint(python_version, [{"name": n, "version": v, "state_id": b} for n, v, b in packages])


def same_build(a, b) -> bool | None:
    """Of two package summaries (``model.snapshot.PackageSummary``): True when they hold one build, False when
    two, None when their ids cannot tell (a side without ids, such as a foreign pylock, or ids of two identity
    versions)."""
    if not a.build_id or not b.build_id or a.identity != b.identity:
        return None
    if a.build_id != b.build_id:
        return False
    sa, sb = a.scripts, b.scripts
    return not (sa and sb and sa != sb)


def verbatim_rows(rows: dict[str, str]) -> dict[str, str]:
    """Of ``{RECORD path: hash field}`` (a wheel's RECORD or an installed one), the rows an installer copies
    verbatim into site-packages, keyed with the dist-info folder's name removed (``.dist-info/METADATA``):
    equal for a wheel and its installation. ``*.data/`` members (moved, scripts rewritten), files outside
    site-packages and generated rows are left out."""
    out = {}
    for path, digest in rows.items():
        if path.startswith("../") or is_bytecode(path):
            continue
        head, _, tail = path.partition("/")
        if head.endswith(".data"):
            continue
        if head.endswith(".dist-info"):
            if tail in GENERATED_NAMES:
                continue
            path = ".dist-info/" + tail
        out[path] = digest
    return out
