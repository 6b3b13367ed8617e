"""Read what a checkpoint says about itself — content, tensors, stamp, hostile calls — without torch.

:func:`read_checkpoint` understands torch zip files (``torch.save``), legacy torch files
(``_use_new_zipfile_serialization=False``), bare pickles, safetensors files, distributed-checkpoint (DCP)
directories and Hugging Face style directories. It reads only pickles, JSON headers and zip directories:
tensor bytes are never read, so a checkpoint of any size takes milliseconds and little memory. Pickles go
through :mod:`envvault.torch.pickle_reader`, which imports and runs nothing the file names.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from envvault.errors import CorruptError, NotFoundError, UsageError
from envvault.torch import pickle_reader as pr
from envvault.torch.jsonable import TensorSummary, summarize, to_jsonable

__all__ = [
    "CheckpointInfo",
    "FileInfo",
    "TensorSummary",
    "read_checkpoint",
    "read_safetensors_header",
    "to_jsonable",
    "STAMP_KEY",
    "STAMP_RECORD",
    "SIDECAR_NAME",
]

STAMP_KEY = "envvault"  # top-level key of a dict checkpoint; key in safetensors __metadata__
STAMP_RECORD = "extra/envvault.json"  # record under the torch zip's <prefix>/
SIDECAR_NAME = "envvault.json"  # file in a checkpoint directory

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
MAX_PICKLE_BYTES = 1 << 30  # a data.pkl bigger than this holds data, not structure: refuse
MAX_SIDE_BYTES = 1 << 20  # stamp records, sidecars and DCP byte entries read into memory
MAX_SAFETENSORS_HEADER = 100_000_000  # the limit the safetensors library itself enforces
CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")

SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16",
    "U8": "uint8", "BOOL": "bool", "C64": "complex64", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
}  # fmt: skip


@dataclass(frozen=True)
class FileInfo:
    """One checkpoint file inside a checkpoint directory."""

    name: str
    format: str
    size: int
    tensors: TensorSummary
    stamp: dict | None = None
    findings: tuple[pr.Blocked, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.format, "size": self.size, "tensors": self.tensors.to_dict(),
                "stamp": self.stamp, "findings": [str(f) for f in self.findings]}


@dataclass(frozen=True)
class CheckpointInfo:
    """What :func:`read_checkpoint` found.

    ``format``: torch-zip, torchscript, torch-legacy, pickle, safetensors, dcp, hf-dir or directory.
    ``stamp``: the envvault stamp (a dict) or None; ``stamp_source`` says where it was found.
    ``content``: JSON-able plain data (see :func:`to_jsonable`). ``findings``: calls and classes the
    pickle names that are not on the allow-list (none of them ran). ``globals``: every non-allow-listed
    global the pickle names, i.e. what ``torch.load(weights_only=True)`` would refuse. ``notes``: problems
    that did not stop the read.
    """

    path: str
    format: str
    stamp: dict | None
    stamp_source: str | None
    content: Any
    tensors: TensorSummary
    findings: tuple[pr.Blocked, ...] = ()
    globals: tuple[str, ...] = ()
    files: tuple[FileInfo, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON document ``envvault inspect --json`` prints."""
        return {"path": self.path, "format": self.format, "stamp": self.stamp, "stamp_source": self.stamp_source,
                "tensors": self.tensors.to_dict(), "findings": [str(f) for f in self.findings],
                "globals": list(self.globals), "files": [f.to_dict() for f in self.files],
                "notes": list(self.notes), "content": self.content}


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Describe the checkpoint at ``path`` (a file or a checkpoint directory) without torch.

    Never executes code from the file and never reads tensor bytes. Raises :class:`NotFoundError` for a
    missing path, :class:`CorruptError` (one line) for a damaged or unrecognised file, :class:`UsageError`
    for a directory that holds no checkpoint.
    """
    p = Path(path)
    try:
        if p.is_dir():
            from envvault.torch.directories import read_directory  # directories build on the file readers

            return read_directory(p)
        if not p.exists():
            raise NotFoundError(f"{p}: no such file or directory")
        return _read_file(p)
    except OSError as err:
        raise UsageError(f"{p}: cannot read: {err.strerror or err}") from None


def _read_file(p: Path) -> CheckpointInfo:
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(512)
        if head[:4] == b"PK\x03\x04":
            return _read_zip(p, f)
        if _looks_safetensors(head):
            f.seek(0)
            return _from_safetensors(p, read_safetensors_header(f, size, str(p)))
        if head[:1] == b"\x80":
            f.seek(0)
            return _read_pickle_file(p, f)
        if head[257:262] == b"ustar":
            raise UsageError(f"{p}: a pre-1.0 torch tar checkpoint; envvault cannot read this old format")
    raise CorruptError(f"{p}: not a checkpoint envvault can read (neither a torch zip, a legacy torch file, "
                       "a pickle nor a safetensors file)")


# --- torch zip ---------------------------------------------------------------------------------------

# What zipfile raises for damaged archives (RuntimeError: encrypted; NotImplementedError: odd compression).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, KeyError, NotImplementedError, RuntimeError)


def _read_zip(p: Path, f: BinaryIO) -> CheckpointInfo:
    try:
        zf = zipfile.ZipFile(f)
        names = zf.namelist()
        data_name = _data_pkl_name(names)
        if data_name is None:
            raise CorruptError(f"{p}: a zip file without data.pkl, not a torch checkpoint")
        prefix = data_name[: -len("data.pkl")]
        fmt = "torchscript" if any(n.startswith(prefix + "code/") for n in names) else "torch-zip"
        result = _zip_pickle(zf, data_name, f"{p}: {data_name}")
        record = zf.read(prefix + STAMP_RECORD) if _small_member(zf, prefix + STAMP_RECORD) else None
        stored = sum(zf.getinfo(n).file_size for n in names if n.startswith(prefix + "data/"))
    except _ZIP_ERRORS as err:
        raise CorruptError(f"{p}: damaged zip checkpoint ({' '.join(str(err).split())[:160]})") from None
    notes: list[str] = []
    stamp, source = _stamp_from_content(result.obj, notes)
    if record is not None:
        rec_stamp = _parse_stamp(record, f"{prefix}{STAMP_RECORD}", notes)
        if stamp is None:
            stamp, source = rec_stamp, "zip-record"
        elif rec_stamp is not None and rec_stamp != stamp:
            notes.append(f"the zip record {prefix}{STAMP_RECORD} differs from the '{STAMP_KEY}' key; "
                         "showing the key")
    summary = summarize(result.obj, result.storages)
    if stored != summary.storage_bytes:
        notes.append(f"the data records hold {stored} bytes but the pickle describes {summary.storage_bytes}")
    return CheckpointInfo(str(p), fmt, stamp, source, to_jsonable(result.obj), summary, result.findings,
                          result.globals, notes=tuple(notes))


def _data_pkl_name(names: list[str]) -> str | None:
    # torch names every record "<prefix>/<name>", with <prefix> taken from the first record.
    if names and "/" in names[0]:
        candidate = names[0].split("/", 1)[0] + "/data.pkl"
        if candidate in names:
            return candidate
    found = sorted((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), key=len)
    return found[0] if found else None


def _small_member(zf: zipfile.ZipFile, name: str) -> bool:
    try:
        return zf.getinfo(name).file_size <= MAX_SIDE_BYTES
    except KeyError:
        return False


def _zip_pickle(zf: zipfile.ZipFile, name: str, what: str) -> pr.PickleResult:
    if zf.getinfo(name).file_size > MAX_PICKLE_BYTES:
        raise UsageError(f"{what}: pickle larger than {MAX_PICKLE_BYTES >> 20} MiB; refusing to read it")
    with zf.open(name) as stream:
        return pr.load(stream, what=what)


# --- legacy torch files and bare pickles --------------------------------------------------------------


def _read_pickle_file(p: Path, f: BinaryIO) -> CheckpointInfo:
    first = pr.load(f, what=f"{p}")
    if type(first.obj) is int and first.obj == LEGACY_MAGIC:
        protocol = pr.load(f, what=f"{p}: legacy header").obj
        if protocol != LEGACY_PROTOCOL:
            raise CorruptError(f"{p}: legacy torch file with unknown protocol version {protocol!r}")
        pr.load(f, what=f"{p}: legacy sys_info")
        result, fmt = pr.load(f, what=f"{p}: legacy torch pickle"), "torch-legacy"
        # What follows is the list of storage keys, then raw storage bytes: never read.
    else:
        result, fmt = first, "pickle"
    notes: list[str] = []
    stamp, source = _stamp_from_content(result.obj, notes)
    return CheckpointInfo(str(p), fmt, stamp, source, to_jsonable(result.obj),
                          summarize(result.obj, result.storages), result.findings, result.globals,
                          notes=tuple(notes))


# --- safetensors -----------------------------------------------------------------------------------------


def _looks_safetensors(head: bytes) -> bool:
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= MAX_SAFETENSORS_HEADER and head[8:9] == b"{"


def read_safetensors_header(f: BinaryIO, size: int, what: str) -> dict[str, Any]:
    """The parsed JSON header of a safetensors stream positioned at its start; checks the header's shape
    (length, JSON object, every tensor's dtype/shape/data_offsets within the file) and raises
    :class:`CorruptError` naming every problem found."""
    raw = f.read(8)
    if len(raw) < 8:
        raise CorruptError(f"{what}: truncated safetensors file")
    n = int.from_bytes(raw, "little")
    if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
        raise CorruptError(f"{what}: safetensors header length {n} does not fit in a {size}-byte file")
    try:
        header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptError(f"{what}: safetensors header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise CorruptError(f"{what}: safetensors header is not a JSON object")
    problems = []
    data_size = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                problems.append("__metadata__ is not a str-to-str map")
            continue
        ok = (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
              and isinstance(entry.get("shape"), list) and all(isinstance(d, int) for d in entry["shape"])
              and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
              and all(isinstance(o, int) for o in entry["data_offsets"]))
        if not ok:
            problems.append(f"{name}: malformed entry")
        elif not 0 <= entry["data_offsets"][0] <= entry["data_offsets"][1] <= data_size:
            problems.append(f"{name}: data_offsets {entry['data_offsets']} outside the {data_size}-byte data")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise CorruptError(f"{what}: damaged safetensors header: {shown}")
    return header


def safetensors_tensors(header: dict[str, Any]) -> tuple[dict[str, pr.TensorInfo], int]:
    """TensorInfo per tensor name (file order) and the total data bytes, from a checked header."""
    tensors, total = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower())
        tensors[name] = pr.TensorInfo(tuple(entry["shape"]), dtype, storage_key=name, device="cpu")
        total += entry["data_offsets"][1] - entry["data_offsets"][0]
    return tensors, total


def _from_safetensors(p: Path, header: dict[str, Any]) -> CheckpointInfo:
    tensors, total = safetensors_tensors(header)
    metadata = header.get("__metadata__") or {}
    notes: list[str] = []
    stamp = _parse_stamp(metadata[STAMP_KEY].encode(), f"__metadata__[{STAMP_KEY!r}]", notes) \
        if STAMP_KEY in metadata else None
    content = {"__metadata__": metadata, **to_jsonable(tensors)} if metadata else to_jsonable(tensors)
    return CheckpointInfo(str(p), "safetensors", stamp, "safetensors-metadata" if stamp else None, content,
                          summarize(tensors, storage_bytes=total), notes=tuple(notes))


# --- stamps ----------------------------------------------------------------------------------------------


def _stamp_from_content(obj: Any, notes: list[str]) -> tuple[dict | None, str | None]:
    if not isinstance(obj, dict) or STAMP_KEY not in obj:
        return None, None
    value = obj[STAMP_KEY]
    if isinstance(value, str):
        return _parse_stamp(value.encode(), f"the '{STAMP_KEY}' key", notes), "key"
    plain = to_jsonable(value)
    if not isinstance(plain, dict):
        notes.append(f"the '{STAMP_KEY}' key holds {type(plain).__name__}, not a stamp record")
        return None, None
    return plain, "key"


def _parse_stamp(raw: bytes, where: str, notes: list[str]) -> dict | None:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        notes.append(f"{where} is not valid JSON; stamp ignored")
        return None
    if not isinstance(value, dict):
        notes.append(f"{where} is not a JSON object; stamp ignored")
        return None
    return value
