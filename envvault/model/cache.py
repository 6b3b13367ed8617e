"""Cache tree manifests: the record of one archived cache root (docs/format.md, "Cache tree manifest"), and
the fingerprint kept with it (what the cache depends on: torch and Triton builds, GPUs, Python, compile
variables).

``CacheManifest.to_dict`` writes the canonical dict a snap stores; ``parse_manifest`` validates one read
from a vault, which may be damaged or hostile, and lists every problem with its place
(``files[3].path: contains '..'``) before anything acts on it. ``Fingerprint.from_dict`` is the
fingerprint's parser (every bad field named). Reading fingerprints from an environment and comparing them
is ``envvault.caches.fingerprint``'s.
"""

from __future__ import annotations

import re
from envvault.model.records import dataclass, field
from collections.abc import Mapping

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, Literal

    EnvScope = Literal["process", "repro", "none"]

from ..errors import CorruptError, RefusedError, UsageError
from .paths import link_target_problem, path_problem

__all__ = [
    "FORMAT", "FINGERPRINT_FORMAT", "GpuInfo", "Fingerprint", "ManifestFile", "CacheManifest",
    "parse_manifest", "path_problem", "link_problem",
]

FORMAT = 1  # of a cache tree manifest
FINGERPRINT_FORMAT = 1
_OID = re.compile(r"[0-9a-f]{64}")
_MAX_PROBLEMS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One GPU: its name as torch reports it, compute capability (``"9.0"``) and driver, when known."""

    name: str
    compute_cap: str | None = None
    driver: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fingerprint:
    """The environment a cache was built in (or would be used in).

    None means unknown, except in a fingerprint of a venv (``origin == "venv"``), where ``torch_version``
    or ``triton_version`` None means not installed. ``torch_cuda`` / ``torch_hip`` are known exactly when
    ``torch_version`` is (None then means a build without CUDA / ROCm). ``gpus`` is None when unknown and
    empty when none was found. ``env`` holds the compile-related variables (see ``compile_env``);
    ``env_scope`` says which of them the source could see: all (``process``), only those torch's repro
    header records (``repro``) or none.
    """

    origin: Literal["venv", "tree"]
    torch_version: str | None = None
    torch_git_version: str | None = None
    torch_cuda: str | None = None
    torch_hip: str | None = None
    torch_record: str | None = None
    torch_source_key: str | None = None
    torch_key_hash: str | None = None
    triton_version: str | None = None
    triton_record: str | None = None
    gpus: tuple[GpuInfo, ...] | None = None
    python_version: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    env_scope: EnvScope = "none"
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``format`` 1); ``from_dict`` reads it back."""
        return {
            "format": FINGERPRINT_FORMAT,
            "origin": self.origin,
            "torch": {
                "version": self.torch_version,
                "git_version": self.torch_git_version,
                "cuda": self.torch_cuda,
                "hip": self.torch_hip,
                "record_blake3": self.torch_record,
                "source_key": self.torch_source_key,
                "key_hash": self.torch_key_hash,
            },
            "triton": {"version": self.triton_version, "record_blake3": self.triton_record},
            "gpus": None
            if self.gpus is None
            else [{"name": g.name, "compute_cap": g.compute_cap, "driver": g.driver} for g in self.gpus],
            "python": self.python_version,
            "env": dict(self.env),
            "env_scope": self.env_scope,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        """Parse ``to_dict`` output; raises ``CorruptError`` naming every bad field."""
        problems: list[str] = []
        if not isinstance(data, Mapping):
            raise CorruptError("fingerprint: not a JSON object")
        if data.get("format") != FINGERPRINT_FORMAT:
            problems.append(f"format: expected {FINGERPRINT_FORMAT}, got {data.get('format')!r}")
        origin = data.get("origin")
        if origin not in ("venv", "tree"):
            problems.append(f"origin: expected 'venv' or 'tree', got {origin!r}")
        torch = _section(data, "torch", problems)
        triton = _section(data, "triton", problems)
        text = {
            f"torch.{k}": torch.get(k)
            for k in ("version", "git_version", "cuda", "hip", "record_blake3", "source_key", "key_hash")
        }
        text.update({f"triton.{k}": triton.get(k) for k in ("version", "record_blake3")})
        text["python"] = data.get("python")
        for where, value in text.items():
            if value is not None and not isinstance(value, str):
                problems.append(f"{where}: expected a string or null")
        gpus = _parse_gpus(data.get("gpus"), problems)
        env = data.get("env", {})
        if not isinstance(env, Mapping) or not all(isinstance(v, str) for v in env.values()):
            problems.append("env: expected an object of strings")
            env = {}
        scope = data.get("env_scope", "none")
        if scope not in ("process", "repro", "none"):
            problems.append(f"env_scope: unknown {scope!r}")
        notes = data.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            problems.append("notes: expected a list of strings")
            notes = []
        if problems:
            raise CorruptError("fingerprint: " + "; ".join(problems))
        return cls(
            origin=origin,
            torch_version=text["torch.version"],
            torch_git_version=text["torch.git_version"],
            torch_cuda=text["torch.cuda"],
            torch_hip=text["torch.hip"],
            torch_record=text["torch.record_blake3"],
            torch_source_key=text["torch.source_key"],
            torch_key_hash=text["torch.key_hash"],
            triton_version=text["triton.version"],
            triton_record=text["triton.record_blake3"],
            gpus=gpus,
            python_version=text["python"],
            env=tuple(sorted(env.items())),
            env_scope=scope,
            notes=tuple(notes),
        )


def _section(data: Mapping[str, Any], key: str, problems: list[str]) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        problems.append(f"{key}: expected an object")
        return {}
    return value


def _parse_gpus(value: Any, problems: list[str]) -> tuple[GpuInfo, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        problems.append("gpus: expected a list or null")
        return None
    gpus = []
    for i, g in enumerate(value):
        if not isinstance(g, Mapping) or not isinstance(g.get("name"), str):
            problems.append(f"gpus[{i}]: expected an object with a string name")
            continue
        cap, driver = g.get("compute_cap"), g.get("driver")
        if not all(v is None or isinstance(v, str) for v in (cap, driver)):
            problems.append(f"gpus[{i}]: compute_cap and driver must be strings or null")
            continue
        gpus.append(GpuInfo(name=g["name"], compute_cap=cap, driver=driver))
    return tuple(gpus)


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
    elif "\x00" in root or (root != "/" and any(p in ("", ".", "..") for p in root[1:].split("/"))):
        problems.append(f"root {root!r} is not a normalised absolute path (a NUL, or a '.', '..' or empty part)")
    fingerprint = None
    if doc.get("fingerprint") is not None:
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
