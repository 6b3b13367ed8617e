"""Read what a checkpoint says about itself — content, tensors, stamp, hostile calls — without torch.

:func:`read_file` understands torch zip files (``torch.save``), legacy torch files
(``_use_new_zipfile_serialization=False``), bare pickles and safetensors files; ``directories`` adds
distributed-checkpoint (DCP) and Hugging Face style directories and ``read_checkpoint``, the entry for any path. It reads only pickles, JSON headers and zip directories:
tensor bytes are never read, so a checkpoint of any size takes milliseconds and little memory. Pickles go
through :mod:`envvault.torch.pickle_reader`, which imports and runs nothing the file names.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
import zlib
from envvault.model.records import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from envvault.errors import CorruptError, UsageError
from envvault.model.stamp import STAMP_KEY, STAMP_RECORD, Stamp, parse_stamp
from envvault.torch import pickle_reader as pr
from envvault.torch.files import MAX_SIDE_BYTES, open_regular
from envvault.torch.jsonable import TensorSummary, summarize, to_jsonable
from envvault.torch.records import Blocked, TensorInfo, valid_shape

__all__ = [
    "CheckpointInfo",
    "FileInfo",
    "TensorSummary",
    "read_file",
    "stamp_from_json",
    "zip_pickle",
    "read_safetensors_header",
    "load_json",
    "BadJSON",
    "to_jsonable",
]


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
# Reading limits (docs/format.md, threat model; the pickle reader has its own in pickle_reader.MAX_*).
MAX_PICKLE_BYTES = 1 << 30  # a data.pkl bigger than this holds data, not structure: refuse
MAX_SAFETENSORS_HEADER = 16 << 20  # a header this large describes ~150,000 tensors; over it: refuse
_SAFETENSORS_LIBRARY_LIMIT = 100_000_000  # what the safetensors library accepts (to recognise the format)
MAX_ZIP_DIRECTORY = 16 << 20  # a zip central directory this large lists ~200,000 records; over it: refuse
MAX_JSON_DEPTH = 64  # nesting of any JSON document read (stamps, headers, config.json)
MAX_JSON_DIGITS = 100  # digits of an integer in any JSON document read
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
    stamp: Stamp | None = None
    findings: tuple[Blocked, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.format, "size": self.size, "tensors": self.tensors.to_dict(),
                "stamp": self.stamp.to_dict() if self.stamp else None, "findings": [str(f) for f in self.findings]}


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``directories.read_checkpoint`` found.

    ``format``: torch-zip, torchscript, torch-legacy, pickle, safetensors, dcp, hf-dir or directory.
    ``stamp``: the envvault stamp (validated by :func:`envvault.model.stamp.parse_stamp`) or None;
    ``stamp_source`` says where it was found; ``stamp_problem``: why a stamp that was there was ignored (also
    in ``notes``).
    ``content``: JSON-able plain data (see :func:`to_jsonable`). ``findings``: calls and classes the
    pickle names that are not on the allow-list (none of them ran). ``globals``: every non-allow-listed
    global the pickle names, i.e. what ``torch.load(weights_only=True)`` would refuse. ``notes``: problems
    that did not stop the read.
    """

    path: str
    format: str
    stamp: Stamp | None
    stamp_source: str | None
    content: Any
    tensors: TensorSummary
    findings: tuple[Blocked, ...] = ()
    globals: tuple[str, ...] = ()
    files: tuple[FileInfo, ...] = ()
    notes: tuple[str, ...] = ()
    stamp_problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document ``envvault inspect --json`` prints."""
        return {"path": self.path, "format": self.format, "stamp": self.stamp.to_dict() if self.stamp else None,
                "stamp_source": self.stamp_source,
                "tensors": self.tensors.to_dict(), "findings": [str(f) for f in self.findings],
                "globals": list(self.globals), "files": [f.to_dict() for f in self.files],
                "notes": list(self.notes), "content": self.content}


class BadJSON(ValueError):
    """A JSON document that does not parse or goes past :data:`MAX_JSON_DEPTH` / :data:`MAX_JSON_DIGITS`."""


def _json_int(text: str) -> int:
    if len(text) > MAX_JSON_DIGITS:
        raise BadJSON(f"it holds an integer of {len(text)} digits (over {MAX_JSON_DIGITS})")
    return int(text)


def load_json(raw: bytes | str) -> Any:
    """Parse a JSON document read from a checkpoint: the one bounded parser for stamps, safetensors
    headers and folder JSON. Raises :class:`BadJSON` (one line) for what is not JSON, holds an integer of
    more than :data:`MAX_JSON_DIGITS` digits or nests deeper than :data:`MAX_JSON_DEPTH`."""
    try:
        value = json.loads(raw, parse_int=_json_int)
    except RecursionError:
        raise BadJSON(f"it nests deeper than {MAX_JSON_DEPTH}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadJSON(" ".join(str(err).split())[:160]) from None
    level = [value]
    for _ in range(MAX_JSON_DEPTH):
        level = [c for v in level if isinstance(v, (dict, list)) for c in (v.values() if isinstance(v, dict) else v)]
        if not level:
            return value
    raise BadJSON(f"it nests deeper than {MAX_JSON_DEPTH}")


def read_file(p: Path) -> CheckpointInfo:
    with open_regular(p) as f:
        size = os.fstat(f.fileno()).st_size
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


def _zip_directory_size(f: BinaryIO, size: int) -> int:
    """The size its end record gives the zip's central directory (0 when there is no end record)."""
    tail_len = min(size, 22 + 0xFFFF)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    i = tail.rfind(b"PK\x05\x06")
    if i < 0 or len(tail) - i < 22:
        return 0
    cd_size = struct.unpack_from("<L", tail, i + 12)[0]
    if i >= 20 and tail[i - 20 : i - 16] == b"PK\x06\x07":  # zip64: the real size is in the zip64 record
        offset = struct.unpack_from("<Q", tail, i - 12)[0]
        if offset <= size - 56:  # a hostile locator may point anywhere, 2**64-1 included (seek raises)
            f.seek(offset)
            rec = f.read(56)
            if len(rec) == 56 and rec[:4] == b"PK\x06\x06":
                cd_size = struct.unpack_from("<Q", rec, 40)[0]
    f.seek(0)
    return cd_size


def _read_zip(p: Path, f: BinaryIO) -> CheckpointInfo:
    cd_size = _zip_directory_size(f, os.fstat(f.fileno()).st_size)
    if cd_size > MAX_ZIP_DIRECTORY:
        raise UsageError(f"{p}: its zip directory is {cd_size} bytes, over envvault's {MAX_ZIP_DIRECTORY >> 20} MiB "
                         "limit; refusing to read it")
    try:
        zf = zipfile.ZipFile(f)
        names = zf.namelist()
        data_name = _data_pkl_name(names)
        if data_name is None:
            raise CorruptError(f"{p}: a zip file without data.pkl, not a torch checkpoint")
        prefix = data_name[: -len("data.pkl")]
        fmt = "torchscript" if any(n.startswith(prefix + "code/") for n in names) else "torch-zip"
        result = zip_pickle(zf, data_name, f"{p}: {data_name}")
        record = zf.read(prefix + STAMP_RECORD) if _small_member(zf, prefix + STAMP_RECORD) else None
        stored = sum(zf.getinfo(n).file_size for n in names if n.startswith(prefix + "data/"))
    except _ZIP_ERRORS as err:
        raise CorruptError(f"{p}: damaged zip checkpoint ({' '.join(str(err).split())[:160]})") from None
    notes = _more_findings(result)
    stamp, source, problem = _stamp_from_content(result.obj, notes)
    if record is not None:
        rec_stamp, rec_problem = stamp_from_json(record, f"{prefix}{STAMP_RECORD}", notes)
        if stamp is None:
            stamp, source, problem = rec_stamp, "zip-record" if rec_stamp else None, problem or rec_problem
        elif rec_stamp is not None and rec_stamp != stamp:
            notes.append(f"the zip record {prefix}{STAMP_RECORD} differs from the '{STAMP_KEY}' key; "
                         "showing the key")
    summary = summarize(result.obj, result.storages)
    if stored != summary.storage_bytes:
        notes.append(f"the data records hold {stored} bytes but the pickle describes {summary.storage_bytes}")
    return CheckpointInfo(str(p), fmt, stamp, source, to_jsonable(result.obj), summary, result.findings,
                          result.globals, notes=tuple(notes), stamp_problem=problem)


def _more_findings(result: pr.PickleResult) -> list[str]:
    return [f"{result.more_findings} more findings like those above are not listed"] if result.more_findings else []


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


def zip_pickle(zf: zipfile.ZipFile, name: str, what: str) -> pr.PickleResult:
    if zf.getinfo(name).file_size > MAX_PICKLE_BYTES:
        raise UsageError(f"{what}: pickle larger than {MAX_PICKLE_BYTES >> 20} MiB; refusing to read it")
    with zf.open(name) as stream:
        # zipfile's reader is Python code; a buffer in front of it serves the unpickler's small reads in C.
        return pr.load(io.BufferedReader(stream, 1 << 16), what=what)


# --- legacy torch files and bare pickles --------------------------------------------------------------


def _read_pickle_file(p: Path, f: BinaryIO) -> CheckpointInfo:
    first = pr.load(f, what=f"{p}")
    if type(first.obj) is int and first.obj == LEGACY_MAGIC:
        protocol = pr.load(f, what=f"{p}: legacy header").obj
        if protocol != LEGACY_PROTOCOL:
            # Never repr() what the pickle built: a deep list recurses, a shared one is a terabyte long.
            shown = protocol if type(protocol) is int else f"(a {type(protocol).__name__}, not a number)"
            raise CorruptError(f"{p}: legacy torch file with unknown protocol version {shown}")
        pr.load(f, what=f"{p}: legacy sys_info")
        result, fmt = pr.load(f, what=f"{p}: legacy torch pickle"), "torch-legacy"
        # What follows is the list of storage keys, then raw storage bytes: never read.
    else:
        result, fmt = first, "pickle"
    notes = _more_findings(result)
    stamp, source, problem = _stamp_from_content(result.obj, notes)
    return CheckpointInfo(str(p), fmt, stamp, source, to_jsonable(result.obj),
                          summarize(result.obj, result.storages), result.findings, result.globals,
                          notes=tuple(notes), stamp_problem=problem)


# --- safetensors -----------------------------------------------------------------------------------------


def _looks_safetensors(head: bytes) -> bool:
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= _SAFETENSORS_LIBRARY_LIMIT and head[8:9] == b"{"


def read_safetensors_header(f: BinaryIO, size: int, what: str) -> dict[str, Any]:
    """The parsed JSON header of a safetensors stream positioned at its start; checks the header's shape
    (length, JSON object, every tensor's dtype/shape/data_offsets within the file) and raises
    :class:`CorruptError` naming every problem found."""
    raw = f.read(8)
    if len(raw) < 8:
        raise CorruptError(f"{what}: truncated safetensors file")
    n = int.from_bytes(raw, "little")
    if 8 + n > size:
        raise CorruptError(f"{what}: safetensors header length {n} does not fit in a {size}-byte file")
    if n > MAX_SAFETENSORS_HEADER:
        raise UsageError(f"{what}: its safetensors header is {n} bytes, over envvault's "
                         f"{MAX_SAFETENSORS_HEADER >> 20} MiB limit; refusing to read it")
    try:
        header = load_json(f.read(n))
    except BadJSON as err:
        raise CorruptError(f"{what}: safetensors header is not JSON envvault reads ({err})") from None
    if not isinstance(header, dict):
        raise CorruptError(f"{what}: safetensors header is not a JSON object")
    problems = []
    data_size = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                problems.append("__metadata__ is not a str-to-str map")
            continue
        ok = (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and len(entry["dtype"]) <= 32
              and valid_shape(entry.get("shape")) is not None
              and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
              and all(type(o) is int for o in entry["data_offsets"]))
        if not ok:
            problems.append(f"{name}: malformed entry")
        elif not 0 <= entry["data_offsets"][0] <= entry["data_offsets"][1] <= data_size:
            problems.append(f"{name}: data_offsets {entry['data_offsets']} outside the {data_size}-byte data")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise CorruptError(f"{what}: damaged safetensors header: {shown}")
    return header


def safetensors_tensors(header: dict[str, Any]) -> tuple[dict[str, TensorInfo], int]:
    """TensorInfo per tensor name (file order) and the total data bytes, from a checked header."""
    tensors, total = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower())
        tensors[name] = TensorInfo(tuple(entry["shape"]), dtype, storage_key=name, device="cpu")
        total += entry["data_offsets"][1] - entry["data_offsets"][0]
    return tensors, total


def _from_safetensors(p: Path, header: dict[str, Any]) -> CheckpointInfo:
    tensors, total = safetensors_tensors(header)
    metadata = header.get("__metadata__") or {}
    notes: list[str] = []
    stamp, problem = stamp_from_json(metadata[STAMP_KEY].encode(), f"__metadata__[{STAMP_KEY!r}]", notes) \
        if STAMP_KEY in metadata else (None, None)
    content = {"__metadata__": metadata, **to_jsonable(tensors)} if metadata else to_jsonable(tensors)
    return CheckpointInfo(str(p), "safetensors", stamp, "safetensors-metadata" if stamp else None, content,
                          summarize(tensors, storage_bytes=total), notes=tuple(notes), stamp_problem=problem)


# --- stamps ----------------------------------------------------------------------------------------------


def _stamp_from_content(obj: Any, notes: list[str]) -> tuple[Stamp | None, str | None, str | None]:
    """(stamp, "key" or None, why a stamp there was ignored) of a dict checkpoint's ``"envvault"`` key."""
    if not isinstance(obj, dict) or STAMP_KEY not in obj:
        return None, None, None
    value = obj[STAMP_KEY]
    if isinstance(value, str):
        stamp, problem = stamp_from_json(value.encode(), f"the '{STAMP_KEY}' key", notes)
    else:
        stamp, problem = _checked(to_jsonable(value), f"the '{STAMP_KEY}' key", notes)
    return stamp, "key" if stamp else None, problem


def stamp_from_json(raw: bytes, where: str, notes: list[str]) -> tuple[Stamp | None, str | None]:
    """The stamp in JSON text ``raw`` (bounded parse, then :func:`parse_stamp`), or None and why, the reason
    also added to ``notes``."""
    try:
        value = load_json(raw)
    except BadJSON as err:
        notes.append(f"{where} is not JSON envvault reads ({err}); stamp ignored")
        return None, notes[-1]
    return _checked(value, where, notes)


def _checked(value: Any, where: str, notes: list[str]) -> tuple[Stamp | None, str | None]:
    try:
        return parse_stamp(value, where), None
    except CorruptError as err:
        notes.append(f"{err}; stamp ignored")
        return None, notes[-1]
