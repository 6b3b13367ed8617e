"""Cache tree manifests: the record of one archived cache root (see docs/format.md, "Cache tree manifest").

``to_manifest`` builds the canonical dict a snap stores; ``parse_manifest`` validates one read from a vault,
which may be damaged or hostile, and lists every problem with its place (``files[3].path: contains '..'``)
before anything acts on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Mapping

from ..errors import CorruptError, RefusedError, UsageError
from ..safepaths import link_target_problem, path_problem

if TYPE_CHECKING:
    from .fingerprint import Fingerprint

__all__ = ["FORMAT", "ManifestFile", "CacheManifest", "parse_manifest", "path_problem", "link_problem"]

FORMAT = 1
_OID = re.compile(r"[0-9a-f]{64}")
_MAX_PROBLEMS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestFile:
    """One entry of a cache tree: a regular file (``chunks``), a folder kept empty, or a symlink."""

    path: str
    kind: Literal["file", "dir", "link"]
    mode: int
    size: int = 0
    sha256: str | None = None
    chunks: tuple[str, ...] = ()
    target: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "dir":
            return {"path": self.path, "dir": True, "mode": self.mode}
        if self.kind == "link":
            return {"path": self.path, "link": self.target, "mode": self.mode}
        return {"path": self.path, "size": self.size, "mode": self.mode, "sha256": self.sha256,
                "chunks": list(self.chunks)}


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheManifest:
    """A parsed, validated cache tree manifest. ``root`` is where the cache was when it was archived."""

    cache_kind: str
    root: str
    fingerprint: Fingerprint | None
    files: tuple[ManifestFile, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": "cache",
            "cache_kind": self.cache_kind,
            "root": self.root,
            "fingerprint": self.fingerprint.to_dict() if self.fingerprint else None,
            "files": [f.to_dict() for f in sorted(self.files, key=lambda f: f.path)],
        }


def link_problem(path: str, target: object) -> str | None:
    """What the text alone shows wrong with a symlink at ``path`` to ``target`` (the rule for the final
    tree is ``envvault.safepaths.FinalTree``, applied when a cache is restored)."""
    return link_target_problem(path, target, "the cache root")


def parse_manifest(doc: object, where: str = "cache manifest") -> CacheManifest:
    """Validate a manifest read from a vault. Raises ``RefusedError`` listing every unsafe or malformed
    entry (paths outside the root, symlinks leading out, files beneath a file or symlink), ``CorruptError``
    when it is not a cache manifest at all, ``UsageError`` for a newer format."""
    if not isinstance(doc, Mapping) or doc.get("kind") != "cache":
        raise CorruptError(f"{where} is not a cache tree manifest")
    fmt = doc.get("format")
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise UsageError(f"{where} has format {fmt!r}, newer than this envvault reads ({FORMAT}); upgrade envvault")
    problems: list[str] = []
    kind, root = doc.get("cache_kind"), doc.get("root")
    if not isinstance(kind, str) or not kind:
        problems.append("cache_kind: expected a string")
    if not isinstance(root, str) or not root.startswith("/"):
        problems.append("root: expected an absolute path")
    fingerprint = None
    if doc.get("fingerprint") is not None:
        from .fingerprint import Fingerprint

        try:
            fingerprint = Fingerprint.from_dict(doc["fingerprint"])
        except CorruptError as err:
            problems.append(str(err))
    raw = doc.get("files")
    if not isinstance(raw, list):
        problems.append("files: expected a list")
        raw = []
    files: list[ManifestFile] = []
    for i, entry in enumerate(raw):
        parsed = _parse_file(entry, f"files[{i}]", problems)
        if parsed is not None:
            files.append(parsed)
    _check_tree(files, problems)
    if problems:
        more = f"; and {len(problems) - _MAX_PROBLEMS} more" if len(problems) > _MAX_PROBLEMS else ""
        raise RefusedError(f"refusing {where}: " + "; ".join(problems[:_MAX_PROBLEMS]) + more)
    return CacheManifest(cache_kind=kind, root=root, fingerprint=fingerprint, files=tuple(files))


def _parse_file(entry: object, at: str, problems: list[str]) -> ManifestFile | None:
    if not isinstance(entry, Mapping):
        problems.append(f"{at}: expected an object")
        return None
    path = entry.get("path")
    why = path_problem(path)
    if why is not None:
        problems.append(f"{at}.path {path!r} {why}")
        return None
    mode = entry.get("mode")
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        problems.append(f"{at}.mode: expected permission bits")
        return None
    shapes = [k for k in ("chunks", "link", "dir") if k in entry]
    if len(shapes) != 1:
        problems.append(f"{at}: expected exactly one of chunks, link, dir")
        return None
    if shapes[0] == "dir":
        return ManifestFile(path=path, kind="dir", mode=mode)
    if shapes[0] == "link":
        why = link_problem(path, entry["link"])
        if why is not None:
            problems.append(f"{at} ({path}) {why}")
            return None
        return ManifestFile(path=path, kind="link", mode=mode, target=entry["link"])
    chunks, size, sha = entry.get("chunks"), entry.get("size"), entry.get("sha256")
    if not isinstance(chunks, list) or not all(isinstance(c, str) and _OID.fullmatch(c) for c in chunks):
        problems.append(f"{at}.chunks: expected a list of object ids")
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(sha, str):
        problems.append(f"{at}: expected size and sha256")
        return None
    return ManifestFile(path=path, kind="file", mode=mode, size=size, sha256=sha, chunks=tuple(chunks))


def _check_tree(files: list[ManifestFile], problems: list[str]) -> None:
    # Nothing may lie beneath a file or a symlink: writing there would follow the link (or fail halfway).
    kinds: dict[str, str] = {}
    for f in files:
        if f.path in kinds:
            problems.append(f"{f.path}: listed twice")
        kinds[f.path] = f.kind
    for f in files:
        parts = f.path.split("/")
        for n in range(1, len(parts)):
            parent = "/".join(parts[:n])
            if kinds.get(parent) in ("file", "link"):
                problems.append(f"{f.path}: lies beneath the {kinds[parent]} {parent}")
                break
