"""Canonical JSON and ids: the same document always gives the same bytes and the same id."""

from __future__ import annotations

import json
import os
import time
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any

import blake3

from envvault.errors import CorruptError

__all__ = ["canonical_json", "object_id", "parse_json", "short", "utc_timestamp", "MAX_DOC_BYTES", "not_utf8", "recordable",
           "toml_loads"]

# A snapshot or manifest larger than this is refused as hostile or damaged.
MAX_DOC_BYTES = 512 * 1024 * 1024


def not_utf8(text: str | os.PathLike) -> bool:
    """True for a name or path Python decoded from bytes that are not UTF-8 (surrogate escapes): no document
    of envvault's can record it (every one is UTF-8 JSON), so it is refused or left out with a warning."""
    try:
        os.fspath(text).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def recordable(text: str) -> str:
    """``text`` as a UTF-8 document can hold it: bytes that are not UTF-8 (a path or a message on the command
    line, a variable of another locale, as Python decodes them: surrogate escapes) are written ``\\xNN``,
    as the user typed them, never a failed snap."""
    if not not_utf8(text):
        return text
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def canonical_json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def object_id(data: bytes | memoryview) -> str:
    return blake3.blake3(data).hexdigest()


def json_loads(data: bytes | str) -> Any:
    """``json.loads`` for bytes read from disk, a vault or a bucket: a document nested past the interpreter's
    recursion limit is a ValueError like any other bad JSON (``json.loads`` raises RecursionError), so the
    callers' ``except ValueError`` ignore or report it instead of failing the command."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def toml_loads(text: str) -> dict:
    """``text`` as TOML (``tomllib``, or ``tomli`` on Python 3.10); ``ValueError`` (``TOMLDecodeError``) when
    it is not TOML or nests too deeply to read."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except RecursionError:  # nested arrays or tables thousands deep: not a document to read
        raise ValueError("nested too deeply") from None


def parse_json(data: bytes, what: str) -> Any:
    if len(data) > MAX_DOC_BYTES:
        raise CorruptError(f"{what} is {len(data)} bytes, larger than any document envvault writes")
    try:
        return json_loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptError(f"{what} is not valid JSON ({err}); run `envvault verify`") from None


def short(oid: str) -> str:
    return oid[:12]


def utc_timestamp(digits: int = 6) -> str:
    """Now, as the vault's documents write a time (``created``, a restore marker's ``at``): UTC with
    microseconds, ``2026-12-01T02:56:00.123456Z``; ``digits=3``: milliseconds, as a stamp's ``time``."""
    now = time.time()  # one clock read: seconds and the fraction must agree
    scale = 10 ** digits
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * scale) % scale:0{digits}d}Z"
