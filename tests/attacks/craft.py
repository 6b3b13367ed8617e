"""Craft hostile vault content from the on-disk format alone (docs/format.md), and run the CLI as an attacker's
victim would: bounded in memory and time.

Nothing here calls envvault's own writers: a pack, an index file, a manifest or a snapshot is built byte by byte
from the contract, so a test can write exactly the (valid-looking or broken) document it wants.

    vault = init_vault(tmp_path / "vault")            # config.json and the folders, as the format says
    blob = put_blob(vault, b"data")                     # -> object id (its own pack and index file)
    mid = put_manifest(vault, {"kind": "dist", ...})    # canonical JSON stored as a manifest object
    sid = put_snapshot(vault, {"format": 1, ...})       # snapshots/<id>.json, canonical JSON, id = BLAKE3
    put_tag(vault, "good", sid)
    root, state = decoy(tmp_path)                       # a folder to watch: state() is its tree hash
    rc, out, err = run_cli(["list"], vault=vault)       # under prlimit --as and a timeout

Used by the attack tests (vault, restore, export, checkpoint attacks). Keep it small.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable, Union

import blake3
import zstandard

__all__ = [
    "ROOT", "canonical", "blake", "init_vault", "write_pack", "put_blob", "put_manifest", "put_snapshot",
    "put_raw_snapshot", "put_tag", "snapshot_doc", "tree_hash", "decoy", "run_cli", "one_line", "MEMORY_LIMIT",
]

ROOT = Path(__file__).resolve().parents[2]
PACK_MAGIC = b"EVPK\x01\x00\x00\x00"
MEMORY_LIMIT = 1 << 30  # address space given to the CLI by run_cli (prlimit --as)
SUBDIRS = ("packs", "index", "snapshots", "tags", "locks", "state", "tmp")


def canonical(doc) -> bytes:
    """Canonical JSON: UTF-8, keys sorted, separators ``,`` and ``:``, non-ASCII kept (docs/format.md)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def blake(data: bytes) -> str:
    """An id: lowercase hex BLAKE3-256."""
    return blake3.blake3(data).hexdigest()


def init_vault(root: Path) -> Path:
    """A new empty vault at ``root`` (config.json and the folders of the directory tree), written by hand."""
    root = Path(root)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    for sub in SUBDIRS:
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    cfg = {"format": 1, "vault_id": os.urandom(16).hex(), "created": "2026-11-30T00:00:00.000000Z",
           "zstd_level": 3, "zstd_level_large": 2}
    (root / "config.json").write_text(json.dumps(cfg, indent=1))
    return root


Obj = Union[bytes, "tuple[bytes, str]"]


def write_pack(vault: Path, objects: Iterable[Obj], *, index: dict | None = None) -> tuple[str, Path]:
    """Write one pack holding ``objects`` (bytes, or ``(bytes, kind)`` with kind ``b``/``m``), one zstd frame each,
    and its index file. ``index`` entries override keys of the index document (to craft a hostile one).
    Returns ``(pack id, index file path)``; each object's id is ``blake(bytes)``."""
    vault = Path(vault)
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=True)
    body = bytearray(PACK_MAGIC)
    frames, entries = [], {}
    for obj in objects:
        data, kind = (obj, "b") if isinstance(obj, (bytes, bytearray)) else obj
        comp = cctx.compress(bytes(data))
        entries[blake(bytes(data))] = [len(frames), 0, len(data), kind]
        frames.append([len(body), len(comp)])
        body += comp
    pack_id = blake(bytes(body))
    pack = vault / "packs" / pack_id[:2] / f"{pack_id}.pack"
    pack.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    pack.write_bytes(bytes(body))
    doc = {"format": 1, "pack": pack_id, "frames": frames, "objects": entries}
    doc.update(index or {})
    idx = vault / "index" / f"{pack_id}.idx"
    idx.write_bytes(json.dumps(doc, separators=(",", ":")).encode())
    return pack_id, idx


def put_blob(vault: Path, data: bytes) -> str:
    """Store one blob in a pack of its own; returns its id."""
    write_pack(vault, [(data, "b")])
    return blake(data)


def put_manifest(vault: Path, doc: dict) -> str:
    """Store ``doc`` as a manifest object (canonical JSON) in a pack of its own; returns its id."""
    data = canonical(doc)
    write_pack(vault, [(data, "m")])
    return blake(data)


def put_raw_snapshot(vault: Path, data: bytes) -> str:
    """Write ``data`` as ``snapshots/<blake(data)>.json`` (any bytes: the id is valid, the content need not be)."""
    sid = blake(data)
    (Path(vault) / "snapshots" / f"{sid}.json").write_bytes(data)
    return sid


def put_snapshot(vault: Path, doc: dict) -> str:
    """Write ``doc`` as a committed snapshot (canonical JSON, id = BLAKE3 of its bytes); returns its id."""
    return put_raw_snapshot(vault, canonical(doc))


def put_tag(vault: Path, name: str, sid: str) -> Path:
    """``tags/<name>``: the id and a newline. ``name`` is written as given (no validation)."""
    path = Path(vault) / "tags" / name
    path.write_text(sid + "\n")
    return path


def snapshot_doc(venv: str = "/nonexistent/venv", packages: list | None = None, **over) -> dict:
    """A minimal well-formed snapshot document (a lock-only snapshot of ``venv``); ``over`` replaces keys."""
    doc = {
        "argv": ["envvault", "snap"], "caches": [], "created": "2026-11-30T10:00:00.000000Z", "env": {},
        "fingerprint": "0" * 64, "format": 1, "host": {"arch": "x86_64", "hostname": "h", "os": "Linux"},
        "kind": "snapshot", "lock_only": True, "message": "crafted", "packages": packages or [],
        "python": {"abi": "cp311", "implementation": "cpython", "platform": "linux-x86_64", "version": "3.11.7"},
        "stats": {"bytes": 0, "files": 0, "new_bytes": 0, "new_objects": 0, "seconds": 0.0},
        "tool": {"envvault": "0.1.0"}, "trigger": "manual", "venv": venv, "warnings": [],
    }
    doc.update(over)
    return doc


# -- watching what must not change ----------------------------------------------------------------------------


def tree_hash(root: Path) -> str:
    """One sha256 over every entry under ``root`` (and root itself): path, type, mode, size, mtime, content or
    link target. Symlinks are not followed. Equal before and after means nothing was written, deleted, chmod'ed."""
    root = Path(root)
    h = hashlib.sha256()

    def add(full: str) -> None:
        st = os.lstat(full)
        h.update(f"{os.path.relpath(full, root)}\0{st.st_mode:o}\0".encode())
        if os.path.islink(full):
            h.update(os.readlink(full).encode())
        elif os.path.isfile(full):
            h.update(f"{st.st_size}\0{st.st_mtime_ns}\0".encode())
            with open(full, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        h.update(b"\n")

    add(str(root))
    for dirpath, dirnames, filenames in os.walk(root):  # os.walk does not descend into symlinked folders
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            add(os.path.join(dirpath, name))
    return h.hexdigest()


def decoy(tmp_path: Path, name: str = "decoy") -> tuple[Path, Callable[[], str]]:
    """A folder outside the vault with a few files (one old, one executable, a subfolder) that an attack might
    aim at. Returns ``(folder, state)``; ``state()`` is its :func:`tree_hash` now."""
    root = Path(tmp_path) / name
    (root / "sub").mkdir(parents=True)
    (root / "keep.txt").write_text("decoy\n")
    (root / "config.json").write_text('{"mine": true}\n')
    (root / "sub" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "sub" / "run.sh", 0o755)
    old = root / "old.tmp"
    old.write_text("an old file\n")
    os.utime(old, (1_000_000_000, 1_000_000_000))  # older than any "older than a minute" cleaner's cut
    return root, lambda: tree_hash(root)


# -- running the CLI ------------------------------------------------------------------------------------------


def run_cli(args: list, env: dict | None = None, *, vault: Path | None = None, cwd: Path | None = None,
            timeout: float = 30, memory: int = MEMORY_LIMIT, stdin: str | None = None) -> tuple[int, str, str]:
    """``python -m envvault *args`` under ``prlimit --as=<memory>`` with a timeout. ``env`` defaults to this
    process's environment without ``VIRTUAL_ENV``/``ENVVAULT_HOME`` (``vault`` sets ``ENVVAULT_HOME``).
    Returns ``(rc, stdout, stderr)``; a run past ``timeout`` is killed (its whole process group) and returns
    rc 124 with ``TIMEOUT`` appended to stderr."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "ENVVAULT_HOME")}
    env = dict(env)
    env["PYTHONPATH"] = str(ROOT)
    if vault is not None:
        env["ENVVAULT_HOME"] = str(vault)
    cmd = ["prlimit", f"--as={int(memory)}", "--", sys.executable, "-m", "envvault", *map(str, args)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(cwd or ROOT), start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return 124, out, err + f"\nTIMEOUT after {timeout}s"


def one_line(rc: int, err: str, code: int, *needles: str) -> str:
    """Assert a clean failure: exit ``code``, exactly one non-empty stderr line, no traceback, each of
    ``needles`` in it. Returns the line."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == code, (rc, err)
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
