"""Write envvault stamps into checkpoints without torch, crash-safely.

Three places hold a stamp, chosen so that loading the checkpoint is unaffected:

- a torch zip checkpoint gets a stored record ``<prefix>/extra/envvault.json``; ``torch.load`` ignores
  records it does not know under ``<prefix>/`` (weights_only True or False, and ``mmap=True``);
- a safetensors file gets a key in its ``__metadata__`` str-to-str map (``"format": "pt"`` is kept or
  added, since transformers refuses metadata without it);
- a directory (DCP, Hugging Face) gets an ``envvault.json`` sidecar.

Every writer builds the new file under a temporary name in the same directory, fsyncs it, renames it over
the original and fsyncs the directory: a crash leaves either the old file or the new one, never a mix.
Existing zip entries are copied byte for byte (their 64-byte data alignment, which ``mmap=True`` needs,
is untouched); only the central directory is rewritten after the new record.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable

from envvault.crashpoints import crash_point
from envvault.errors import CorruptError, NotFoundError, RefusedError, StorageError, UsageError
from envvault.model.stamp import SIDECAR_NAME, STAMP_RECORD
from envvault.torch.checkpoint import MAX_ZIP_DIRECTORY, read_safetensors_header
from envvault.torch.files import open_regular
from envvault.vault.fsutil import fsync_dir, tmp_name

__all__ = ["add_zip_record", "set_safetensors_metadata", "write_sidecar", "ZIP_ALIGNMENT"]

ZIP_ALIGNMENT = 64  # torch aligns record data to 64 bytes ("FB" padding in the local header's extra field)
_U16, _U32 = 0xFFFF, 0xFFFFFFFF
_LOCAL = struct.Struct("<4s5H3L2H")
_CENTRAL = struct.Struct("<4s6H3L5H2L")
_EOCD = struct.Struct("<4s4H2LH")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_LOCATOR64 = struct.Struct("<4sLQL")


def add_zip_record(path: str | os.PathLike[str], record_name: str = STAMP_RECORD, *, data: bytes) -> str:
    """Add (or replace) the stored record ``<prefix>/<record_name>`` in the torch zip checkpoint at ``path``.

    Returns the full record name. Existing entries keep their bytes and offsets. A record of that name
    that is not the archive's last entry is not replaced (:class:`RefusedError`): that would move data.
    Raises :class:`UsageError` for a file that is not a torch zip, :class:`CorruptError` for a damaged one.
    """
    target = Path(path)
    if not isinstance(data, (bytes, bytearray)):
        raise UsageError("add_zip_record: data must be bytes")
    if record_name.startswith("/") or ".." in record_name.split("/") or not record_name:
        raise UsageError(f"add_zip_record: bad record name {record_name!r}")
    with _open_existing(target) as f:
        size = os.fstat(f.fileno()).st_size
        cd_offset, entries, comment, was_zip64 = _read_central_directory(f, size, target)
    prefix = _torch_prefix(entries, target)
    full = f"{prefix}/{record_name}"
    write_at = cd_offset
    old = [e for e in entries if e[0] == full]
    if old:
        if old[0][2] != max(e[2] for e in entries):
            raise RefusedError(f"{target}: {full} exists and is not the last record; not rewriting the archive")
        write_at = old[0][2]
        entries = [e for e in entries if e[0] != full]

    def fill(tmp: BinaryIO) -> None:
        with open(target, "rb") as src:
            _copy_range(src, tmp, 0, write_at)
        tmp.seek(write_at)
        tmp.truncate()
        name = full.encode("utf-8")
        crc = zlib.crc32(data)
        pad = -(write_at + _LOCAL.size + len(name) + 4) % ZIP_ALIGNMENT
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        tmp.write(_LOCAL.pack(b"PK\x03\x04", 20, 0x0800, 0, 0, 0, crc, len(data), len(data), len(name),
                              len(extra)) + name + extra + bytes(data))
        cd_extra = struct.pack("<HHQ", 1, 8, write_at) if write_at >= _U32 else b""
        central = b"".join(e[1] for e in entries) + _CENTRAL.pack(
            b"PK\x01\x02", 0x031E, 45 if cd_extra else 20, 0x0800, 0, 0, 0, crc, len(data), len(data),
            len(name), len(cd_extra), 0, 0, 0, 0o100644 << 16, min(write_at, _U32)) + name + cd_extra
        _write_end(tmp, central, len(entries) + 1, comment, was_zip64)

    _replace_atomically(target, fill)
    return full


def set_safetensors_metadata(path: str | os.PathLike[str], key: str, value: str) -> None:
    """Set ``__metadata__[key] = value`` in the safetensors file at ``path`` (keeping ``"format": "pt"``).

    The header is rewritten compactly and padded with spaces to a multiple of 8 bytes, as the safetensors
    writer does; tensor entries and data bytes are unchanged (offsets are relative to the data start).
    """
    target = Path(path)
    if not isinstance(key, str) or not isinstance(value, str):
        raise UsageError("safetensors metadata is a str-to-str map: key and value must be str")
    with _open_existing(target) as src:
        size = os.fstat(src.fileno()).st_size
        header = read_safetensors_header(src, size, str(target))
        data_start = src.tell()
    metadata = dict(header.pop("__metadata__", None) or {})
    metadata.setdefault("format", "pt")
    metadata[key] = value
    raw = json.dumps({"__metadata__": metadata, **header}, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)

    def fill(tmp: BinaryIO) -> None:
        tmp.write(struct.pack("<Q", len(raw)) + raw)
        with open(target, "rb") as src2:
            _copy_range(src2, tmp, data_start, size - data_start)

    _replace_atomically(target, fill)


def write_sidecar(directory: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write ``data`` as ``<directory>/envvault.json`` (sorted keys, trailing newline); returns its path."""
    d = Path(directory)
    if not d.is_dir():
        raise NotFoundError(f"{d}: not a directory")
    try:
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    except (TypeError, ValueError) as err:
        raise UsageError(f"stamp is not plain JSON data: {err}") from None
    target = d / SIDECAR_NAME
    _replace_atomically(target, lambda tmp: tmp.write(text.encode("utf-8")))
    return target


# --- zip structure ---------------------------------------------------------------------------------------


_Entry = tuple[str, bytes, int]  # (name, raw central directory entry, local header offset)


def _read_central_directory(f: BinaryIO, size: int, where: Path) -> tuple[int, list[_Entry], bytes, bool]:
    """(central directory offset, [(name, raw central entry, local header offset)], comment, zip64?)."""
    tail_len = min(size, _EOCD.size + _U16)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    i = tail.rfind(b"PK\x05\x06")
    if i < 0 or len(tail) - i < _EOCD.size:
        raise UsageError(f"{where}: not a zip file, so not a torch zip checkpoint")
    _, _, _, _, count, cd_size, cd_offset, clen = _EOCD.unpack_from(tail, i)
    comment = tail[i + _EOCD.size : i + _EOCD.size + clen]
    zip64 = i >= _LOCATOR64.size and tail[i - _LOCATOR64.size : i - _LOCATOR64.size + 4] == b"PK\x06\x07"
    if zip64:
        _, _, eocd64_at, _ = _LOCATOR64.unpack_from(tail, i - _LOCATOR64.size)
        f.seek(eocd64_at)
        rec = f.read(_EOCD64.size)
        if len(rec) < _EOCD64.size or rec[:4] != b"PK\x06\x06":
            raise CorruptError(f"{where}: damaged zip64 end record")
        _, _, _, _, _, _, _, count, cd_size, cd_offset = _EOCD64.unpack(rec)
    if cd_size > MAX_ZIP_DIRECTORY:
        raise UsageError(f"{where}: its zip directory is {cd_size} bytes, over envvault's "
                         f"{MAX_ZIP_DIRECTORY >> 20} MiB limit")
    f.seek(cd_offset)
    cd = f.read(cd_size)
    entries, pos = [], 0
    while pos < len(cd):
        if cd[pos : pos + 4] != b"PK\x01\x02" or pos + _CENTRAL.size > len(cd):
            raise CorruptError(f"{where}: damaged zip central directory")
        fields = _CENTRAL.unpack_from(cd, pos)
        csize, usize, n, m, k, offset = fields[8:13] + (fields[16],)
        name = cd[pos + _CENTRAL.size : pos + _CENTRAL.size + n]
        if offset == _U32:
            offset = _zip64_offset(cd[pos + _CENTRAL.size + n : pos + _CENTRAL.size + n + m], usize, csize)
        end = pos + _CENTRAL.size + n + m + k
        entries.append((name.decode("utf-8", "replace"), cd[pos:end], offset))
        pos = end
    if len(entries) != count:
        raise CorruptError(f"{where}: zip central directory lists {len(entries)} entries, end record says {count}")
    return cd_offset, entries, comment, zip64


def _zip64_offset(extra: bytes, usize: int, csize: int) -> int:
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            skip = 8 * ((usize == _U32) + (csize == _U32))
            return struct.unpack_from("<Q", extra, pos + 4 + skip)[0]
        pos += 4 + length
    raise CorruptError("zip entry has a 64-bit offset marker but no zip64 extra field")


def _torch_prefix(entries: list[tuple[str, bytes, int]], where: Path) -> str:
    prefix = entries[0][0].split("/", 1)[0] if entries and "/" in entries[0][0] else ""
    if not prefix or f"{prefix}/data.pkl" not in {e[0] for e in entries}:
        raise UsageError(f"{where}: a zip file without <prefix>/data.pkl, not a torch checkpoint")
    return prefix


def _write_end(f: BinaryIO, central: bytes, count: int, comment: bytes, zip64: bool) -> None:
    cd_offset = f.tell()
    f.write(central)
    if zip64 or count >= _U16 or cd_offset >= _U32 or len(central) >= _U32:
        eocd64_at = f.tell()
        f.write(_EOCD64.pack(b"PK\x06\x06", _EOCD64.size - 12, 45, 45, 0, 0, count, count, len(central),
                             cd_offset))
        f.write(_LOCATOR64.pack(b"PK\x06\x07", 0, eocd64_at, 1))
    f.write(_EOCD.pack(b"PK\x05\x06", 0, 0, min(count, _U16), min(count, _U16), min(len(central), _U32),
                       min(cd_offset, _U32), len(comment)) + comment)


# --- files -----------------------------------------------------------------------------------------------


def _open_existing(path: Path) -> BinaryIO:
    """``path`` opened for reading when it is a regular file (a FIFO or device is refused, never waited on)."""
    try:
        return open_regular(path)
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None


def _copy_range(src: BinaryIO, dst: BinaryIO, start: int, length: int) -> None:
    """Copy ``length`` bytes of ``src`` from ``start`` to ``dst``'s position, in the kernel when possible."""
    dst.flush()
    out_fd, in_fd = dst.fileno(), src.fileno()
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(in_fd, out_fd, length - done, start + done)
            if n == 0:
                break
            done += n
    except (AttributeError, OSError):
        pass  # no copy_file_range here, or not across these filesystems: copy the rest by hand
    dst.seek(os.lseek(out_fd, 0, os.SEEK_CUR))  # copy_file_range moved the fd's offset; resync the file object
    src.seek(start + done)
    while done < length:
        chunk = src.read(min(1 << 24, length - done))
        if not chunk:
            raise CorruptError(f"{getattr(src, 'name', 'source')}: file shrank while being copied")
        dst.write(chunk)
        done += len(chunk)


def _replace_atomically(target: Path, fill: Callable[[BinaryIO], Any], mode: int = 0o644) -> None:
    """Build the new ``target`` with ``fill`` under a temp name beside it, fsync, rename over, fsync the dir.

    The new file keeps ``target``'s permission bits (``mode`` when it is new). Any failure removes the temp
    file and leaves ``target`` as it was; OS errors become :class:`StorageError`.
    """
    tmp = tmp_name(target.parent, target.name)
    try:
        with open(tmp, "xb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        crash_point("stamp_write")
        os.chmod(tmp, stat.S_IMODE(target.stat().st_mode) if target.exists() else mode)
        os.replace(tmp, target)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise StorageError(f"cannot write {target}: {err.strerror or err}") from None
        raise
    fsync_dir(target.parent)
