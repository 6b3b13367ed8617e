"""Checkpoint directories: torch distributed checkpoints (DCP) and Hugging Face style model folders.

A DCP directory holds a pickled ``.metadata`` (tensor names, shapes, dtypes and where each piece lives)
and ``__<rank>_<n>.distcp`` data files; envvault stamps it with an ``envvault.json`` sidecar. A Hugging
Face folder holds ``config.json``, ``*.safetensors`` / ``pytorch_model*.bin`` shards and maybe an
``*.index.json``; each checkpoint file is read with the single-file readers and reported on its own.
``read_checkpoint`` is the entry for any path: a folder here, a file through ``checkpoint.read_file``.
"""

from __future__ import annotations

from envvault.model import records
import io
import os
import zipfile
from pathlib import Path
from typing import Any

from envvault.errors import CorruptError, EnvvaultError, NotFoundError, UsageError
from envvault.model.stamp import SIDECAR_NAME, Stamp
from envvault.torch import pickle_reader as pr
from envvault.torch.checkpoint import (
    CHECKPOINT_SUFFIXES,
    MAX_SAFETENSORS_HEADER,
    _ZIP_ERRORS,
    BadJSON,
    CheckpointInfo,
    FileInfo,
    load_json,
    read_file,
    stamp_from_json,
    zip_pickle,
)
from envvault.torch.files import MAX_SIDE_BYTES, open_regular, read_small
from envvault.torch.jsonable import MAX_CHARS, MAX_NODES, TensorSummary, summarize, to_jsonable
from envvault.torch.records import Opaque, TensorInfo, TorchConst, valid_shape

__all__ = ["read_checkpoint", "read_directory"]


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Describe the checkpoint at ``path`` (a file or a checkpoint directory) without torch.

    Never executes code from the file and never reads tensor bytes. Raises :class:`NotFoundError` for a
    missing path, :class:`CorruptError` (one line) for a damaged or unrecognised file, :class:`UsageError`
    for a directory that holds no checkpoint.
    """
    p = Path(path)
    try:
        if p.is_dir():
            return read_directory(p)
        if not p.exists():
            raise NotFoundError(f"{p}: no such file or directory")
        return read_file(p)
    except OSError as err:
        raise UsageError(f"{p}: cannot read: {err.strerror or err}") from None


def read_directory(d: Path) -> CheckpointInfo:
    """Describe a DCP or Hugging Face style directory; :class:`UsageError` when it holds no checkpoint."""
    notes: list[str] = []
    stamp, problem = _sidecar(d, notes)
    if (d / ".metadata").is_file():
        info = _read_dcp(d, stamp, notes)
    else:
        info = _read_model_dir(d, stamp, notes)
    return info if info.stamp is not None or problem is None else records.replace(info, stamp_problem=problem)


def _small_json_file(p: Path, notes: list[str], limit: int = MAX_SIDE_BYTES) -> bytes | None:
    """The bytes of ``p`` (a regular file of at most ``limit`` bytes), else None with a note."""
    if not p.exists():
        return None
    try:
        raw = read_small(p, limit)
    except EnvvaultError as err:  # not a regular file
        notes.append(str(err))
        return None
    if raw is None:
        notes.append(f"{p.name} is larger than {limit} bytes; not read")
    return raw


def _sidecar(d: Path, notes: list[str]) -> tuple[Stamp | None, str | None]:
    raw = _small_json_file(d / SIDECAR_NAME, notes)
    return (None, None) if raw is None else stamp_from_json(raw, SIDECAR_NAME, notes)


def _read_dcp(d: Path, stamp: Stamp | None, notes: list[str]) -> CheckpointInfo:
    with open_regular(d / ".metadata") as f:
        result = pr.load(f, what=f"{d / '.metadata'}")
    state = _state(result.obj)
    entries = state.get("state_dict_metadata")
    if not isinstance(entries, dict):
        raise CorruptError(f"{d / '.metadata'}: no state_dict_metadata; not a distributed checkpoint")
    where = _storage_index(state.get("storage_data"))
    content: dict[str, Any] = {}
    tensors: dict[str, TensorInfo] = {}
    blobs = _BlobBudget()
    skipped = 0
    for fqn, entry in entries.items():
        if not isinstance(fqn, str):  # never str() of what the pickle built: it can be a terabyte long
            skipped += 1
            continue
        fields = _state(entry)
        if "size" in fields:  # TensorStorageMetadata; BytesStorageMetadata has no fields
            size = fields["size"]
            shape = valid_shape(size) if isinstance(size, tuple) else None
            tensors[fqn] = info = TensorInfo(shape, _dcp_dtype(fields.get("properties")))
            content[fqn] = to_jsonable(info)
        else:
            content[fqn] = _dcp_bytes(d, where.get(fqn), blobs)
    if skipped:
        notes.append(f"{skipped} entries of .metadata not named by a string; not shown")
    notes.extend(blobs.notes)
    if blobs.more_notes:
        notes.append(f"{blobs.more_notes} more notes about byte entries are not listed")
    files = tuple(FileInfo(f.name, "distcp", f.stat().st_size, TensorSummary())
                  for f in sorted(d.glob("*.distcp")))
    summary = summarize(tensors, storage_bytes=sum(fi.size for fi in files))
    return CheckpointInfo(str(d), "dcp", stamp, SIDECAR_NAME if stamp else None, content, summary,
                          result.findings, result.globals, files, tuple(notes))


def _state(rec: Any) -> dict:
    return rec.state if isinstance(rec, Opaque) and isinstance(rec.state, dict) else {}


def _dcp_dtype(props: Any) -> str:
    # TensorProperties pickles its fields as a tuple (dtype first); older torch used a plain __dict__.
    state = props.state if isinstance(props, Opaque) else None
    if isinstance(state, tuple) and state:
        dtype = state[0]
    else:
        dtype = state.get("dtype") if isinstance(state, dict) else None
    return dtype.text.removeprefix("torch.") if isinstance(dtype, TorchConst) else "unknown"


def _storage_index(storage_data: Any) -> dict[str, dict]:
    """fqn -> {relative_path, offset, length, transform_descriptors?} for non-tensor (bytes) entries."""
    out = {}
    for key, info in (storage_data or {}).items() if isinstance(storage_data, dict) else ():
        fqn = _state(key).get("fqn")
        if isinstance(fqn, str):
            out[fqn] = _state(info)
    return out


# One budget for all the byte entries of one DCP folder (a 9 KB .metadata can point a million entries at
# one blob): blob bytes read, what their contents render to, notes; each blob is read at most once.
MAX_DCP_BLOB_BYTES = 8 << 20  # bytes of .distcp blobs read, all entries together
MAX_DCP_NOTES = 100  # notes about byte entries listed; the rest are counted


class _BlobBudget:
    def __init__(self) -> None:
        self.bytes_left = MAX_DCP_BLOB_BYTES
        self.render = [MAX_NODES, MAX_CHARS]  # to_jsonable's [nodes, chars], shared by every entry
        self.seen: dict[tuple[str, int, int], tuple[Any, int, int]] = {}  # blob -> (content, its cost)
        self.notes: list[str] = []
        self.more_notes = 0

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_DCP_NOTES:
            self.notes.append(text)
        else:
            self.more_notes += 1


def _dcp_bytes(d: Path, info: dict | None, budget: _BlobBudget) -> Any:
    """A DCP non-tensor entry: a small torch.save blob inside a .distcp file, read with the safe reader."""
    if not info or not isinstance(info.get("relative_path"), str) or info.get("transform_descriptors"):
        return {"object": "bytes"}
    length, offset = info.get("length"), info.get("offset")
    if (type(length) is not int or type(offset) is not int or not 0 <= length <= MAX_SIDE_BYTES
            or not 0 <= offset < 1 << 62):
        return {"bytes": length if type(length) is int else None}
    key = (info["relative_path"], offset, length)
    if key in budget.seen:  # the same blob again: its content again, if the output budget still allows
        content, nodes, chars = budget.seen[key]
        if budget.render[0] < nodes or budget.render[1] < chars:
            return {"bytes": length}
        budget.render[0] -= nodes
        budget.render[1] -= chars
        return content
    try:
        target = (d / info["relative_path"]).resolve()
        if target.parent != d.resolve() or not target.is_file():
            return {"bytes": length}
    except (OSError, ValueError):  # a NUL in the name, a name too long...
        return {"bytes": length}
    if length > budget.bytes_left:
        budget.note(f"{target.name}: entry at offset {offset} not read (the folder's byte entries are over "
                    f"envvault's {MAX_DCP_BLOB_BYTES >> 20} MiB limit)")
        return {"bytes": length}
    budget.bytes_left -= length
    with open_regular(target) as f:
        f.seek(offset)
        blob = f.read(length)
    try:
        zf = zipfile.ZipFile(io.BytesIO(blob))
        name = next(n for n in zf.namelist() if n.endswith("data.pkl"))
        result = zip_pickle(zf, name, f"{target.name}@{offset}")
    except (*_ZIP_ERRORS, StopIteration, CorruptError):
        budget.note(f"{target.name}: entry at offset {offset} is not a readable torch.save blob")
        budget.seen[key] = ({"bytes": length}, 0, 0)
        return {"bytes": length}
    for f in result.findings:
        budget.note(f"{target.name}@{offset}: {f}")
    nodes, chars = budget.render
    content = to_jsonable(result.obj, budget=budget.render)
    budget.seen[key] = (content, nodes - budget.render[0], chars - budget.render[1])
    return content


def _read_model_dir(d: Path, stamp: Stamp | None, notes: list[str]) -> CheckpointInfo:
    content: dict[str, Any] = {}
    for name in ("config.json", "generation_config.json"):
        raw = _small_json_file(d / name, notes)
        if raw is not None:
            try:
                content[name] = load_json(raw)
            except BadJSON as err:
                notes.append(f"{name} is not JSON envvault reads ({err})")
    for index in sorted(d.glob("*.index.json")):
        raw = _small_json_file(index, notes, MAX_SAFETENSORS_HEADER)  # a weight map: one line per tensor
        if raw is None:
            continue
        try:
            doc = load_json(raw)
            weight_map = doc["weight_map"]
            content[index.name] = {"metadata": doc.get("metadata"), "files": sorted(set(weight_map.values())),
                                   "tensors": len(weight_map)}
        except (BadJSON, KeyError, TypeError, AttributeError):
            notes.append(f"{index.name} is not a valid index (no weight_map)")
    paths = sorted(p for p in d.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
    if not paths:
        raise UsageError(f"{d}: a directory with no checkpoint files (.metadata, *.safetensors, *.bin, *.pt)")
    files, findings, names, summary = [], [], {}, TensorSummary()
    for p in paths:
        try:
            info = read_file(p)
        except EnvvaultError as err:
            notes.append(str(err))
            continue
        files.append(FileInfo(p.name, info.format, p.stat().st_size, info.tensors, info.stamp, info.findings))
        content[p.name] = info.content
        findings.extend(info.findings)
        names.update(dict.fromkeys(info.globals))
        summary = summary + info.tensors
        notes.extend(f"{p.name}: {n}" for n in info.notes)
    source = SIDECAR_NAME if stamp else None
    if stamp is None:
        stamped = next((f for f in files if f.stamp is not None), None)
        if stamped is not None:
            stamp, source = stamped.stamp, stamped.name
    fmt = "hf-dir" if "config.json" in content or any(d.glob("*.index.json")) else "directory"
    return CheckpointInfo(str(d), fmt, stamp, source, content, summary, tuple(findings), tuple(names),
                          tuple(files), tuple(notes))
