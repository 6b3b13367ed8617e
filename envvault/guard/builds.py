"""Is the wheel a tool plans to install the same build as the distribution already installed?

A version string is not an identity (docs/format.md, "build id"): two builds can share ``2.11.0``. pip's
report gives the planned wheel's URL and sha256, which no installed file records (except
``direct_url.json`` for URL installs). What both sides do record is RECORD: the wheel carries one, and the
installed distribution keeps it. Files under site-packages are installed verbatim, so their RECORD rows
match exactly when the builds are the same. The wheel's RECORD is read from a local file, or over HTTP
range requests (a few small reads, not the whole wheel), or from a full download of a small wheel.
"""

from __future__ import annotations

import io
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from envvault.env.static import read_env_file
from envvault.errors import CorruptError
from envvault.model.identity import verbatim_rows
from envvault.model.record import parse_record
from envvault.model.encoding import json_loads

__all__ = ["same_build", "wheel_rows", "installed_rows", "comparable_rows"]

_FULL_DOWNLOAD_LIMIT = 64 * 1024 * 1024
_BLOCK = 256 * 1024
_TIMEOUT = 20


def comparable_rows(rows: dict[str, str]) -> dict[str, str]:
    """RECORD rows an installer copies verbatim (``envvault.model.identity.verbatim_rows``)."""
    return verbatim_rows(rows)


def _parse_record(text: str) -> dict[str, str]:
    entries, _problems = parse_record(text)  # a garbled row only costs this comparison its precision
    return {e.path: e.hash_field for e in entries}


def _dist_file(dist_info: Path, name: str, errors: str = "replace") -> str:
    """A dist-info file's text (a FIFO or a device in a site folder is never waited on: CorruptError)."""
    return read_env_file(dist_info / name).decode("utf-8", errors=errors)


def installed_rows(dist_info: Path) -> dict[str, str] | None:
    try:
        return _parse_record(_dist_file(dist_info, "RECORD"))
    except (OSError, CorruptError):
        return None


class _NoRanges(Exception):
    pass


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests (enough for zipfile)."""

    def __init__(self, url: str, size: int, tail: bytes) -> None:
        self.url, self.size, self.pos = url, size, 0
        self.blocks: dict[int, bytes] = {}
        self.tail_start = size - len(tail)
        self.tail = tail

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _fetch(self, start: int, end: int) -> bytes:
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end - 1}"})
        with urllib.request.urlopen(req, timeout=_TIMEOUT) as resp:
            if resp.status != 206:
                raise _NoRanges()
            return resp.read()

    def readinto(self, buffer) -> int:
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        if self.pos >= self.tail_start:
            data = self.tail[self.pos - self.tail_start : self.pos - self.tail_start + want]
        else:
            data = self._fetch(self.pos, min(self.pos + max(want, _BLOCK), self.tail_start))[:want]
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _open_remote(url: str) -> io.IOBase | None:
    req = urllib.request.Request(url, headers={"Range": f"bytes=-{_BLOCK}"})
    resp = urllib.request.urlopen(req, timeout=_TIMEOUT)
    with resp:
        if resp.status == 206:
            total = resp.headers.get("Content-Range", "").rpartition("/")[2]
            if total.isdigit():
                return io.BufferedReader(_RangeFile(url, int(total), resp.read()), buffer_size=_BLOCK)
            return None
        # The server ignores ranges: read the whole wheel only when it is small.
        length = resp.headers.get("Content-Length")
        if length is None or int(length) > _FULL_DOWNLOAD_LIMIT:
            return None
        return io.BytesIO(resp.read(_FULL_DOWNLOAD_LIMIT + 1))


def wheel_rows(url: str) -> dict[str, str] | None:
    """The RECORD rows of the wheel at ``url`` (``file://`` or ``http(s)://``); None when it cannot be read."""
    parsed = urllib.parse.urlsplit(url)
    if not parsed.path.endswith(".whl"):
        return None
    try:
        if parsed.scheme == "file":
            source: io.IOBase | None = open(urllib.request.url2pathname(parsed.path), "rb")
        elif parsed.scheme in ("http", "https"):
            source = _open_remote(url)
        else:
            return None
        if source is None:
            return None
        with source, zipfile.ZipFile(source) as zf:
            name = next((n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")), None)
            if name is None:
                return None
            return _parse_record(zf.read(name).decode("utf-8", errors="replace"))
    except (OSError, zipfile.BadZipFile, urllib.error.URLError, _NoRanges, ValueError, EOFError):
        return None


def _direct_url_sha256(dist_info: Path) -> str | None:
    """The wheel hash pip keeps in ``direct_url.json`` for URL and path installs."""

    try:
        info = json_loads(_dist_file(dist_info, "direct_url.json", "strict")).get("archive_info") or {}
    except (OSError, CorruptError, ValueError, AttributeError):
        return None
    sha = (info.get("hashes") or {}).get("sha256")
    if not sha and str(info.get("hash", "")).startswith("sha256="):
        sha = info["hash"].split("=", 1)[1]
    return sha


def same_build(dist_info: Path, *, url: str | None, sha256: str | None,
               known_sha256: set[str] = frozenset()) -> bool | None:
    """True when the wheel (``url``, ``sha256``) holds the build installed at ``dist_info``, False when it
    holds another one, None when that cannot be told. ``known_sha256``: wheel hashes already known to have
    produced this installed build (direct_url.json, provenance of earlier snapshots)."""
    if sha256 and (sha256 in known_sha256 or sha256 == _direct_url_sha256(dist_info)):
        return True
    if not url:
        return None
    wheel = wheel_rows(url)
    mine = installed_rows(dist_info)
    if wheel is None or mine is None:
        return None
    return comparable_rows(wheel) == comparable_rows(mine)
