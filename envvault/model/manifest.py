"""The distribution manifest (docs/format.md, "Distribution manifest", object kind ``m``) as typed, frozen
records.

``parse_dist_manifest(doc, where)`` is the one validating parser, run on every manifest loaded by id
(``Vault.load_manifest``), so in-place restore, ``restore --into`` and export all get the same check:
a path that is absolute, holds ``..`` or NUL (``path``, ``dist_info``), or a RECORD path that is absolute,
holds NUL, a backslash or a ``..`` after its leading ones (``record``) is a RefusedError (exit 3) naming
every such file with its place; any other problem (wrong types) a CorruptError (exit 5) naming each. Where
a symlink leads is decided against the final tree (``envvault.safepaths.FinalTree``), not here.
``DistManifest.to_dict()`` writes the canonical form back exactly (unknown keys kept). Pure: no I/O.
"""

from __future__ import annotations

import re
from envvault.model.records import dataclass, field
from typing import Any, Mapping

from envvault.errors import RefusedError, UsageError
from envvault.model._fields import (
    NO_EXTRA, OPT_STRS, Key, check_bool, check_hex_id, check_int, check_list, check_opt_dict,
    check_opt_str,
    check_str, dump_fields, is_id, load_fields, raise_problems,
)
from envvault.model.paths import path_problem, record_path_problem

__all__ = ["FORMAT", "DistManifest", "FileEntry", "parse_dist_manifest", "parse_file_entry", "STATES", "manifest_blob_ids", "as_dist_manifest"]

FORMAT = 1
STATES = frozenset({"ok", "modified", "unhashed", "missing", "unchecked"})
_EMPTY: frozenset[str] = frozenset()
_MAX_SHOWN = 10


def _check_state(v: Any) -> str | None:
    return None if v in STATES else "expected one of " + ", ".join(sorted(STATES))


def _check_mode(v: Any) -> str | None:
    ok = v is None or isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0o177777
    return None if ok else "expected permission bits"


def _check_chunks(v: Any) -> str | None:
    ok = v is None or isinstance(v, list) and all(is_id(c) for c in v)
    return None if ok else "expected a list of object ids"


def _check_opt_size(v: Any) -> str | None:
    ok = v is None or isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return None if ok else "expected a size in bytes"


def _check_link(v: Any) -> str | None:
    return None if isinstance(v, str) and v and "\x00" not in v else "has a bad symlink target"


@dataclass(frozen=True, slots=True, kw_only=True)
class FileEntry:
    """One RECORD row of a distribution. ``path``: relative to the environment's prefix; ``record``: as
    RECORD writes it; ``state``: ``ok``, ``modified``, ``unhashed``, ``missing`` or ``unchecked``;
    ``sha256``: RECORD-style (the actual bytes' when modified or unhashed); ``chunks``: blob ids (None when
    no content is stored: lock-only, missing, bytecode); ``link``: a symlink's target; ``generated``: a
    launcher the installer wrote. A RECORD digest of another algorithm stays in ``extra``
    (``record_<algo>``)."""

    path: str
    record: str
    state: str = "ok"
    sha256: str | None = None
    size: int | None = None
    mode: int | None = None
    chunks: tuple[str, ...] | None = None
    link: str | None = None
    generated: bool = False
    record_sha256: str | None = None
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY
    # The document a scan made this entry from (``scanned``), written back as it is: a first snap writes
    # tens of thousands of entries, and the generic writer would rebuild each key by key.
    # Not an __init__ argument, so records.replace (a changed path, say) drops it: the change is written.
    written: Mapping[str, Any] | None = field(default=None, init=False, compare=False, repr=False)

    KEYS = (Key("path", required=True, default=""), Key("record", required=True, default=""),
            Key("state", _check_state, default="ok"), Key("sha256", check_opt_str), Key("size", _check_opt_size),
            Key("mode", _check_mode), Key("chunks", _check_chunks, load=lambda v, w, p: OPT_STRS(v, w, p)),
            Key("link", _check_link), Key("generated", check_bool, default=False),
            Key("record_sha256", check_opt_str))

    def to_dict(self) -> dict[str, Any]:
        if self.written is not None:
            return dict(self.written)
        return dump_fields(self, FileEntry.KEYS)

    @classmethod
    def scanned(cls, fields: dict[str, Any]) -> "FileEntry":
        """The entry a scan writes: exactly the keys in ``fields`` (the others stay out of its document; the
        caller hands ``fields`` over and changes it no more), a RECORD digest of another algorithm
        (``record_md5``) kept as it is. ``chunks`` is a list, as in the document."""
        shape = tuple(fields)
        kw = fields
        chunks = fields.get("chunks")
        if chunks is not None:
            kw = dict(fields, chunks=tuple(chunks))
        absent = _ABSENT_BY_SHAPE.get(shape)
        if absent is None:
            absent = _FILE_KEYS.difference(shape)
            if _FILE_KEYS.issuperset(shape) and len(_ABSENT_BY_SHAPE) <= 256:
                _ABSENT_BY_SHAPE[shape] = absent
        if _FILE_KEYS.issuperset(shape):
            entry = cls(**kw, absent=absent)
        else:
            known = {k: v for k, v in kw.items() if k in _FILE_KEYS}
            entry = cls(**known, extra={k: v for k, v in kw.items() if k not in _FILE_KEYS}, absent=absent)
        object.__setattr__(entry, "written", fields)
        return entry

    @property
    def is_link(self) -> bool:
        return self.link is not None

    @property
    def stored(self) -> bool:
        """Its bytes are in the vault (a regular file of a full snapshot)."""
        return self.chunks is not None


_FILE_KEYS = frozenset(k.name for k in FileEntry.KEYS)
_ABSENT_BY_SHAPE: dict[tuple[str, ...], frozenset[str]] = {}
_ID_MATCH = re.compile(r"[0-9a-f]{64}").fullmatch


def _fast_file(obj: dict) -> FileEntry | None:
    """A file entry of the shapes snaps write (known keys, each of its type, safe paths), read without the
    generic engine: a torch manifest holds 12,000 of them. None for anything else (the generic parser then
    reads and reports it)."""
    shape = tuple(obj)
    absent = _ABSENT_BY_SHAPE.get(shape)
    if absent is None:
        if not _FILE_KEYS.issuperset(shape) or len(_ABSENT_BY_SHAPE) > 256:
            return None
        absent = _ABSENT_BY_SHAPE[shape] = _FILE_KEYS.difference(shape)
    g = obj.get
    path, record, state, sha, size, mode = g("path"), g("record"), g("state", "ok"), g("sha256"), g("size"), g("mode")
    chunks, link, generated, rsha = g("chunks"), g("link"), g("generated", False), g("record_sha256")
    if (type(path) is not str or type(record) is not str or path_problem(path) is not None
            or record_path_problem(record) is not None or state not in STATES
            or (sha is not None and type(sha) is not str) or (rsha is not None and type(rsha) is not str)
            or (size is not None and (type(size) is not int or size < 0))
            or (mode is not None and (type(mode) is not int or not 0 <= mode <= 0o177777))
            or (link is not None and (type(link) is not str or not link or "\x00" in link))
            or type(generated) is not bool):
        return None
    if chunks is not None:
        if type(chunks) is not list or not all(type(c) is str and _ID_MATCH(c) is not None for c in chunks):
            return None
        chunks = tuple(chunks)
    return FileEntry(path=path, record=record, state=state, sha256=sha, size=size, mode=mode, chunks=chunks,
                     link=link, generated=generated, record_sha256=rsha, absent=absent)


def parse_file_entry(obj: Any, where: str, problems: list[str], unsafe: list[str]) -> FileEntry | None:
    """One file of a manifest; wrong types go to ``problems``, unsafe paths to ``unsafe`` (``where`` is its
    place, ``files[3]``)."""
    if not isinstance(obj, dict):
        problems.append(f"{where}: expected an object")
        return None
    fast = _fast_file(obj)
    if fast is not None:
        return fast
    path, record = obj.get("path"), obj.get("record")
    bad = False
    why = path_problem(path)
    if why is not None:
        unsafe.append(f"{where}.path {path!r} {why}" if isinstance(path, str) and path else f"{where}.path: {why}")
        bad = True
    why = record_path_problem(record)
    if why is not None:
        unsafe.append(f"{where}.record {record!r} {why}" if isinstance(record, str) and record else f"{where}.record: {why}")
        bad = True
    kw, absent, extra = load_fields(obj, FileEntry.KEYS, where + ".", problems)
    if bad:
        return None
    return FileEntry(**kw, extra=extra, absent=absent)


def _check_kind(v: Any) -> str | None:
    return None if v == "dist" else "expected \"dist\""


def _check_dist_info(v: Any) -> str | None:
    return None if v is None else None if isinstance(v, str) else "expected a string or null"


@dataclass(frozen=True, slots=True, kw_only=True)
class DistManifest:
    """One distribution as stored (docs/format.md, "Distribution manifest"). ``wheel``: the WHEEL file's
    fields (``build``, ``generator``, ``root_is_purelib``, ``tags``) or None; ``direct_url``: the
    installer's PEP 610 ``direct_url.json`` or None; ``record``: ``ok`` or ``missing`` (no RECORD)."""

    name: str
    version: str
    build_id: str
    state_id: str
    files: tuple[FileEntry, ...] = ()
    kind: str = "dist"
    format: int = FORMAT
    dist_info: str | None = None
    installer: str | None = None
    requested: bool = False
    wheel: Mapping[str, Any] | None = None
    direct_url: Mapping[str, Any] | None = None
    record: str = "ok"
    scripts: str | None = None
    build_info: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = NO_EXTRA
    absent: frozenset[str] = _EMPTY

    KEYS = (Key("kind", _check_kind, default="dist"), Key("format", check_int, default=FORMAT),
            Key("name", check_str, True, ""), Key("version", check_str, True, ""),
            Key("build_id", check_hex_id, True, ""), Key("state_id", check_hex_id, True, ""),
            Key("dist_info", _check_dist_info), Key("installer", check_opt_str),
            Key("requested", check_bool, default=False), Key("wheel", check_opt_dict),
            Key("direct_url", check_opt_dict), Key("record", check_str, default="ok"),
            Key("scripts", check_opt_str), Key("build_info", check_opt_dict),
            Key("files", check_list, True, ())) 

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, DistManifest.KEYS)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    @property
    def dist_info_name(self) -> str | None:
        """The dist-info folder's (or ``.egg-link`` file's) own name."""
        return self.dist_info.rsplit("/", 1)[-1] if self.dist_info else None

    @property
    def wheel_tags(self) -> tuple[str, ...] | None:
        """The WHEEL file's tags; None when not recorded, or not a list (export refuses that)."""
        tags = (self.wheel or {}).get("tags")
        return tuple(tags) if isinstance(tags, (list, tuple)) else None

    @property
    def wheel_build(self) -> Any:
        """The WHEEL file's build tag (a string) or None."""
        return (self.wheel or {}).get("build")

    @property
    def direct_url_value(self) -> str | None:
        """``direct_url.json``'s ``url`` when it is a string."""
        url = (self.direct_url or {}).get("url")
        return url if isinstance(url, str) else None

    def blob_ids(self) -> list[str]:
        """Every blob id its files name, in order (duplicates kept)."""
        return [c for f in self.files if f.chunks for c in f.chunks]


def parse_dist_manifest(doc: Any, where: str = "manifest") -> DistManifest:
    """The distribution manifest in ``doc`` (parsed JSON). RefusedError ``refusing <where>: ...`` naming every
    unsafe path (up to 10, then how many more), CorruptError ``<where> is malformed (...)`` naming every
    other problem, UsageError for a newer format."""
    if not isinstance(doc, dict):
        raise_problems(where, ["expected a JSON object"])
    if isinstance(doc.get("format"), int) and doc["format"] > FORMAT:
        raise UsageError(f"{where} has a newer format; upgrade envvault")
    problems: list[str] = []
    unsafe: list[str] = []
    kw, absent, extra = load_fields(doc, DistManifest.KEYS, "", problems)
    di = kw.get("dist_info")
    if di is not None and (why := path_problem(di)) is not None:
        unsafe.append(f"dist_info {di!r} {why}")
    files = []
    for i, entry in enumerate(doc.get("files") if isinstance(doc.get("files"), list) else ()):
        f = parse_file_entry(entry, f"files[{i}]", problems, unsafe)
        if f is not None:
            files.append(f)
    if unsafe:
        more = f"; and {len(unsafe) - _MAX_SHOWN} more" if len(unsafe) > _MAX_SHOWN else ""
        err = RefusedError(f"refusing {where}: " + "; ".join(unsafe[:_MAX_SHOWN]) + more)
        err.problems = unsafe + problems  # type: ignore[attr-defined]
        raise err
    raise_problems(where, problems)
    kw["files"] = tuple(files)
    return DistManifest(**kw, extra=extra, absent=absent)


def manifest_blob_ids(doc: Any) -> list[str]:
    """The blob ids a stored manifest (a distribution's or a cache tree's, as parsed JSON) names, read
    leniently: what gc keeps and verify re-hashes, even of a manifest a restore would refuse."""
    files = doc.get("files") if isinstance(doc, dict) else None
    out: list[str] = []
    for f in files if isinstance(files, list) else ():
        chunks = f.get("chunks") if isinstance(f, dict) else None
        if isinstance(chunks, list):
            out.extend(c for c in chunks if isinstance(c, str))
    return out


def as_dist_manifest(man: Any, where: str = "manifest") -> DistManifest:
    """``man`` itself when it is a ``DistManifest``, else parsed (for callers still holding the dict)."""
    return man if isinstance(man, DistManifest) else parse_dist_manifest(man, where)
