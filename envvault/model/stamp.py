"""Checkpoint stamps: the typed record and its validating parser (docs/format.md, "Checkpoint stamps").

A stamp arrives inside a stranger's checkpoint, so :func:`parse_stamp` is the gate every reader goes through
(``inspect``, ``diff CKPT``, ``restore CKPT``, checkpoint folders): types, sizes, ids and paths are checked and
every problem is named with its place (``git.commit: expected a 40- or 64-hex string``) before anything acts
on a stamp. ``Stamp.to_dict`` gives the document back as it was: the keys it had, those this envvault does not
know included.


Pure: plain values in, records out; standard library only (the checkpoint readers run without envvault's
dependencies installed).
"""

from __future__ import annotations

import json
import re
from envvault.model.records import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from envvault.errors import CorruptError

__all__ = [
    "STAMP_FORMAT", "STAMP_KEY", "STAMP_RECORD", "SIDECAR_NAME", "GitState", "DriftChange", "Drift", "Stamp",
    "parse_stamp",
]

STAMP_FORMAT = 1
# Where a stamp lives in a checkpoint.
STAMP_KEY = "envvault"  # top-level key of a dict checkpoint; key in safetensors __metadata__
STAMP_RECORD = "extra/envvault.json"  # record under the torch zip's <prefix>/
SIDECAR_NAME = "envvault.json"  # file in a checkpoint directory

# Sizes a stamp may have (a real one is a few KiB; records and sidecars are read up to 1 MiB anyway).
MAX_TEXT = 1024  # tool, torch, cuda, python, host, time, git branch, package names and versions
MAX_PATH = 4096  # venv, vault location, executable, cwd, git root (PATH_MAX)
MAX_ARG = 128 << 10  # one argv entry or env value (the kernel's MAX_ARG_STRLEN)
MAX_ARGV = 10_000
MAX_ENV = 4096
MAX_WARNINGS = 1000
MAX_CHANGED = 100_000  # drift entries
_MAX_PROBLEMS = 10

_ID = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_KNOWN = ("format", "tool", "snapshot", "snapshot_lock_only", "vault", "fingerprint", "venv", "torch", "cuda",
          "python", "executable", "host", "argv", "cwd", "time", "env", "git", "drift", "warnings")


# --- stamps ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GitState:
    """The git work tree holding the cwd of the process that stamped."""

    root: str
    commit: str | None
    branch: str | None
    dirty: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "commit": self.commit, "branch": self.branch, "dirty": self.dirty}


@dataclass(frozen=True, slots=True)
class DriftChange:
    """One distribution that changed on disk: ``old``/``new`` version (None: installed/removed)."""

    name: str
    old: str | None
    new: str | None
    other_build: bool

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "old": self.old, "new": self.new, "other_build": self.other_build}


@dataclass(frozen=True, slots=True)
class Drift:
    """How the environment on disk differs from the one the process started with."""

    fingerprint: str | None
    changed: tuple[DriftChange, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "changed": [c.to_dict() for c in self.changed]}


@dataclass(frozen=True, slots=True, kw_only=True)
class Stamp:
    """A checkpoint stamp (docs/format.md). Fields a document lacked are None (``warnings`` empty) and named
    in ``absent``; ``extra`` holds the keys this envvault does not know (readers ignore them). ``to_dict``
    gives back the document: the keys it had, nothing added."""

    format: int = STAMP_FORMAT
    tool: str | None = None
    snapshot: str | None = None
    snapshot_lock_only: bool | None = None
    vault: str | None = None
    fingerprint: str | None = None
    venv: str | None = None
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    executable: str | None = None
    host: str | None = None
    argv: tuple[str, ...] | None = None
    cwd: str | None = None
    time: str | None = None
    env: Mapping[str, str] | None = None
    git: GitState | None = None
    drift: Drift | None = None
    warnings: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    absent: frozenset[str] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, a fresh object the caller may change; the keys in ``absent`` left out."""
        out = json.loads(json.dumps(dict(self.extra)))
        out.update({
            "format": self.format, "tool": self.tool, "snapshot": self.snapshot,
            "snapshot_lock_only": self.snapshot_lock_only, "vault": self.vault, "fingerprint": self.fingerprint,
            "venv": self.venv, "torch": self.torch, "cuda": self.cuda, "python": self.python,
            "executable": self.executable, "host": self.host,
            "argv": list(self.argv) if self.argv is not None else None, "cwd": self.cwd, "time": self.time,
            "env": dict(self.env) if self.env is not None else None,
            "git": self.git.to_dict() if self.git else None, "drift": self.drift.to_dict() if self.drift else None,
            "warnings": list(self.warnings),
        })
        for key in self.absent:
            del out[key]
        return out


class Problems(list):
    """Problems found while parsing, each ``place: what``; ``raise_if_any`` lists up to ten."""

    def add(self, at: str, what: str) -> None:
        self.append(f"{at}: {what}")

    def raise_if_any(self, where: str) -> None:
        if self:
            more = f"; and {len(self) - _MAX_PROBLEMS} more" if len(self) > _MAX_PROBLEMS else ""
            raise CorruptError(f"{where}: " + "; ".join(self[:_MAX_PROBLEMS]) + more)


def _text(doc: Mapping, key: str, at: str, problems: Problems, *, limit: int = MAX_TEXT,
          single_line: bool = True, pattern: re.Pattern | None = None, what: str = "a string") -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        problems.add(at, f"expected {what} or null, not {type(value).__name__}")
    elif len(value) > limit:
        problems.add(at, f"{len(value)} characters, over {limit}")
    elif pattern is not None and not pattern.fullmatch(value):
        problems.add(at, f"expected {what}")
    elif single_line and _CONTROL.search(value):
        problems.add(at, "contains a control character")
    else:
        return value
    return None


def _path(doc: Mapping, key: str, at: str, problems: Problems) -> str | None:
    """An absolute path or None; a folder name may hold any character but NUL (renderers escape them)."""
    value = _text(doc, key, at, problems, limit=MAX_PATH, single_line=False, what="an absolute path")
    if value is not None and (not value.startswith("/") or "\0" in value):
        problems.add(at, "expected an absolute path")
        return None
    return value


def _flag(doc: Mapping, key: str, at: str, problems: Problems) -> bool | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, bool):
        problems.add(at, "expected true, false or null")
        return None
    return value


def _strings(value: Any, at: str, problems: Problems, *, count: int, limit: int) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        problems.add(at, "expected a list of strings")
        return None
    if len(value) > count:
        problems.add(at, f"{len(value)} entries, over {count}")
        return None
    for i, v in enumerate(value):
        if not isinstance(v, str) or len(v) > limit:
            problems.add(f"{at}[{i}]", f"expected a string of at most {limit} characters")
            return None
    return tuple(value)


def _env(value: Any, problems: Problems) -> Mapping[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.add("env", "expected an object of strings or null")
        return None
    if len(value) > MAX_ENV:
        problems.add("env", f"{len(value)} variables, over {MAX_ENV}")
        return None
    for k, v in value.items():
        if len(k) > MAX_TEXT or _CONTROL.search(k) or not isinstance(v, str) or len(v) > MAX_ARG:
            problems.add(f"env[{k[:40]!r}]", "expected a variable name and a string value")
            return None
    return MappingProxyType(dict(value))


def _git(value: Any, problems: Problems) -> GitState | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.add("git", "expected an object or null")
        return None
    before = len(problems)
    root = _path(value, "root", "git.root", problems)
    if root is None and len(problems) == before:
        problems.add("git.root", "expected an absolute path")
    commit = _text(value, "commit", "git.commit", problems, pattern=_COMMIT, what="a 40- or 64-hex string")
    branch = _text(value, "branch", "git.branch", problems)
    dirty = _flag(value, "dirty", "git.dirty", problems)
    return GitState(root, commit, branch, dirty) if len(problems) == before else None


def _drift(value: Any, problems: Problems) -> Drift | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.add("drift", "expected an object or null")
        return None
    before = len(problems)
    fp = _text(value, "fingerprint", "drift.fingerprint", problems, pattern=_ID, what="a 64-hex id")
    raw = value.get("changed")
    if not isinstance(raw, list) or len(raw) > MAX_CHANGED:
        problems.add("drift.changed", f"expected a list of at most {MAX_CHANGED} changes")
        return None
    changed = []
    for i, c in enumerate(raw):
        at = f"drift.changed[{i}]"
        if not isinstance(c, dict):
            problems.add(at, "expected an object")
            break
        name = _text(c, "name", f"{at}.name", problems) if isinstance(c.get("name"), str) else None
        if not isinstance(c.get("name"), str):
            problems.add(f"{at}.name", "expected a string")
        old = _text(c, "old", f"{at}.old", problems)
        new = _text(c, "new", f"{at}.new", problems)
        other = c.get("other_build")
        if not isinstance(other, bool):
            problems.add(f"{at}.other_build", "expected true or false")
        if len(problems) > before:
            break  # one bad entry is enough to name; the rest are likely alike
        changed.append(DriftChange(name, old, new, other))
    return Drift(fp, tuple(changed)) if len(problems) == before else None


def parse_stamp(doc: object, where: str = "stamp") -> Stamp:
    """Validate a stamp read from a checkpoint (any JSON value). Raises :class:`CorruptError` naming every
    problem with its place; a stamp of a newer format is one of them."""
    if not isinstance(doc, dict):
        raise CorruptError(f"{where}: expected a JSON object, not {type(doc).__name__}")
    problems = Problems()
    fmt = doc.get("format")
    if type(fmt) is not int or fmt < 1:
        problems.add("format", "expected a positive integer")
    elif fmt > STAMP_FORMAT:
        problems.add("format", f"{fmt} is newer than this envvault reads ({STAMP_FORMAT}); upgrade envvault")
    values: dict[str, Any] = {}
    for key in ("tool", "torch", "cuda", "python", "host", "time"):
        values[key] = _text(doc, key, key, problems)
    for key in ("snapshot", "fingerprint"):
        values[key] = _text(doc, key, key, problems, pattern=_ID, what="a 64-hex id")
    for key in ("venv", "cwd"):
        values[key] = _path(doc, key, key, problems)
    values["vault"] = _text(doc, "vault", "vault", problems, limit=MAX_PATH)  # a path, or s3://bucket/prefix
    values["executable"] = _text(doc, "executable", "executable", problems, limit=MAX_PATH, single_line=False)
    values["snapshot_lock_only"] = _flag(doc, "snapshot_lock_only", "snapshot_lock_only", problems)
    argv = doc.get("argv")
    values["argv"] = None if argv is None else _strings(argv, "argv", problems, count=MAX_ARGV, limit=MAX_ARG)
    warnings = doc.get("warnings")
    values["warnings"] = () if warnings is None else (
        _strings(warnings, "warnings", problems, count=MAX_WARNINGS, limit=MAX_ARG) or ())
    values["env"] = _env(doc.get("env"), problems)
    values["git"] = _git(doc.get("git"), problems)
    values["drift"] = _drift(doc.get("drift"), problems)
    problems.raise_if_any(where)
    extra = {k: v for k, v in doc.items() if k not in _KNOWN}
    absent = frozenset(k for k in _KNOWN if k not in doc)
    return Stamp(format=fmt, extra=MappingProxyType(json.loads(json.dumps(extra))), absent=absent, **values)
