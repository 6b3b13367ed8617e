"""Hostile checkpoints crafted from the file formats alone (pickle opcodes, torch zip layout, safetensors
headers), and a runner that executes ``envvault`` under an address-space limit and reports its peak memory.

Every builder writes a few bytes or kilobytes (or a sparse file) that would crash, hang or exhaust an
unbounded reader; none of them needs torch.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.evtools import ev_env

__all__ = ["P2", "Run", "run_limited", "unicode", "binint", "torch_zip", "bare_pickle", "safetensors",
           "sparse_safetensors", "rebuild_tensor", "mkfifo", "binput", "binget", "shared_list", "LEGACY_HEADER",
           "dcp_folder", "torch_blob"]

P2 = b"\x80\x02"  # PROTO 2: what torch.save writes
AS_LIMIT = 1 << 30  # address space of the envvault process: a regression fails here, not on the box


def unicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def binint(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)  # BININT


def binput(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)  # LONG_BINPUT


def binget(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)  # LONG_BINGET


def shared_list(text_len: int, fanout: int = 1000) -> bytes:
    """Opcodes leaving on the stack a list of ``fanout`` references to one list of ``fanout`` references to
    one ``text_len``-character string (memo 0 and 1 used): a few KB whose full str()/repr() is
    ``fanout**2 * text_len`` characters."""
    return (b"X" + struct.pack("<I", text_len) + b"a" * text_len + binput(0) + b"0"
            + b"](" + binget(0) * fanout + b"e" + binput(1) + b"0"
            + b"](" + binget(1) * fanout + b"e")


_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
LEGACY_HEADER = P2 + b"\x8a" + bytes([len(_MAGIC)]) + _MAGIC + b"."  # the magic number of a legacy torch file


def torch_zip(path: Path, data_pkl: bytes, extra: dict[str, bytes] | None = None) -> Path:
    """A torch zip checkpoint laid out as ``torch.save`` does: ``<stem>/data.pkl``, ``<stem>/version``."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{path.stem}/data.pkl", data_pkl)
        zf.writestr(f"{path.stem}/version", b"3\n")
        for name, data in (extra or {}).items():
            zf.writestr(f"{path.stem}/{name}", data)
    return path


def torch_blob(data_pkl: bytes, name: str = "blob") -> bytes:
    """The bytes of a small ``torch.save`` zip, as DCP stores a non-tensor entry inside a ``.distcp`` file."""
    bio = io.BytesIO()
    with zipfile.ZipFile(bio, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{name}/data.pkl", data_pkl)
    return bio.getvalue()


def dcp_folder(folder: Path, data: bytes, entries: list[tuple[str, bytes, int]]) -> Path:
    """A DCP folder: ``__0_0.distcp`` holding ``data`` and a ``.metadata`` naming one bytes entry ``k<i>``
    per ``(relative_path, offset as pickle opcodes, length)`` of ``entries`` (classes under module ``m``:
    the reader matches fields, not class names)."""
    folder.mkdir(exist_ok=True)
    sdm = b"}(" + b"".join(unicode(f"k{i}") + b"cm\nBytesStorageMetadata\n)\x81}b" for i in range(len(entries)))
    sd = b"}(" + b"".join(
        b"cm\nMetadataIndex\n)\x81}" + unicode("fqn") + unicode(f"k{i}") + b"sb"
        + b"cm\nStorageInfo\n)\x81}(" + unicode("relative_path") + unicode(rel) + unicode("offset") + offset
        + unicode("length") + binint(length) + b"ub"
        for i, (rel, offset, length) in enumerate(entries))
    meta = (P2 + b"cm\nMetadata\n)\x81}(" + unicode("state_dict_metadata") + sdm + b"u"
            + unicode("storage_data") + sd + b"u" + b"ub.")
    (folder / ".metadata").write_bytes(meta)
    (folder / "__0_0.distcp").write_bytes(data)
    return folder


def bare_pickle(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def safetensors(path: Path, header: bytes | dict, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def sparse_safetensors(path: Path, header_len: int) -> Path:
    """A safetensors file whose header length says ``header_len`` bytes; the rest is a hole (no disk)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", header_len) + b'{"a":')
        f.truncate(8 + header_len + 16)
    return path


def rebuild_tensor(shape_pickle: bytes) -> bytes:
    """``{"w": torch._utils._rebuild_tensor_v2(<storage>, 0, <shape>, <shape>)}`` with the shape (and the
    stride) given as pickle opcodes that leave one value on the stack."""
    storage = (b"(" + unicode("storage") + b"ctorch\nFloatStorage\n" + unicode("0") + unicode("cpu")
               + binint(1) + b"tQ")  # BINPERSID ('storage', FloatStorage, '0', 'cpu', 1)
    return (P2 + b"}" + unicode("w") + b"ctorch._utils\n_rebuild_tensor_v2\n(" + storage + binint(0)
            + shape_pickle + b"q\x01h\x01" + b"\x89ccollections\nOrderedDict\n)Rtq\x02Rs.")


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]


_MEASURE = (
    "import resource, subprocess, sys, time\n"
    "t = time.monotonic()\n"
    "p = subprocess.run(sys.argv[1:], stdout=open(sys.argv[0] + '.out', 'wb'), stderr=subprocess.PIPE)\n"
    "sys.stderr.buffer.write(p.stderr)\n"
    "print(p.returncode, time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def run_limited(vault: Path, *args: str, timeout: float = 60, cwd: Path | None = None) -> Run:
    """``envvault *args`` under ``prlimit --as`` with a wall-clock timeout; its peak RSS measured by a
    parent whose only child it is. stdout goes to a file (it may be large when a limit is missing)."""
    out = Path(cwd or vault.parent) / "envvault-stdout"
    cmd = [sys.executable, "-c", _MEASURE.replace("sys.argv[0] + '.out'", repr(str(out))),
           "prlimit", f"--as={AS_LIMIT}", "--", sys.executable, "-m", "envvault", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout, env=ev_env(vault), cwd=cwd)
    rc, seconds, peak_kb = proc.stdout.decode().split()
    stdout = out.read_bytes()
    out.unlink()
    if len(stdout) > 50 << 20:
        stdout = stdout[:1000] + b"... (over 50 MiB)"
    return Run(int(rc), stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"),
               float(seconds), int(peak_kb) / 1024)


def mkfifo(path: Path) -> Path:
    os.mkfifo(path)
    return path

