"""Canonical JSON and ids: the same document always gives the same bytes and the same id."""

from __future__ import annotations

import json
from typing import Any

import blake3

from envvault.errors import CorruptError

__all__ = ["canonical_json", "object_id", "parse_json", "short", "MAX_DOC_BYTES"]

# A snapshot or manifest larger than this is refused as hostile or damaged.
MAX_DOC_BYTES = 512 * 1024 * 1024


def canonical_json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def object_id(data: bytes | memoryview) -> str:
    return blake3.blake3(data).hexdigest()


def parse_json(data: bytes, what: str) -> Any:
    if len(data) > MAX_DOC_BYTES:
        raise CorruptError(f"{what} is {len(data)} bytes, larger than any document envvault writes")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptError(f"{what} is not valid JSON ({err}); run `envvault verify`") from None


def short(oid: str) -> str:
    return oid[:12]
