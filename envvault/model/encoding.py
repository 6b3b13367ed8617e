"""Canonical JSON and ids: the same document always gives the same bytes and the same id."""

from __future__ import annotations

import json
import time
from typing import Any

import blake3

from envvault.errors import CorruptError

__all__ = ["canonical_json", "object_id", "parse_json", "short", "utc_timestamp", "MAX_DOC_BYTES"]

# A snapshot or manifest larger than this is refused as hostile or damaged.
MAX_DOC_BYTES = 512 * 1024 * 1024


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
