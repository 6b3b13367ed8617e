"""RECORD files (the wheel spec's installed-files list): parse and write them, in one place.

Pure: text in, records out. Modelled on pypa/installer's ``records.py``: ``RecordEntry`` trusts its
arguments; ``parse_record`` validates every row and lists every problem with its row number, so a caller
can report them all at once. Rows an installer legitimately writes without a hash or size (RECORD itself,
bytecode, the folder rows virtualenv's seeder writes, and pdm's ``sha256=`` with no digest for the files it
links into its cache) parse cleanly, as rows without a hash.
"""

from __future__ import annotations

import threading
from binascii import b2a_base64
from collections import OrderedDict
from envvault.model.records import dataclass

__all__ = ["RecordEntry", "RecordProblem", "parse_record", "format_record", "record_sha256"]


@dataclass(frozen=True, slots=True)
class RecordEntry:
    """One RECORD row: ``path`` exactly as RECORD writes it (relative to the site directory, ``../`` for
    files outside it), the hash as ``algo`` and its urlsafe-base64 ``digest`` (both None when the row has
    no hash), and ``size`` in bytes (None when the row gives none)."""

    path: str
    algo: str | None
    digest: str | None
    size: int | None

    @property
    def hash_field(self) -> str:
        """The row's middle field: ``algo=digest``, or empty."""
        return f"{self.algo}={self.digest}" if self.algo is not None else ""

    def to_row(self) -> list[str]:
        return [self.path, self.hash_field, "" if self.size is None else str(self.size)]


@dataclass(frozen=True, slots=True)
class RecordProblem:
    """What is wrong with one row; ``row`` counts from 1 (lines of the file, blank lines included)."""

    row: int
    problem: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.problem}"


_ALGOS = {name: name for name in ("sha256", "sha384", "sha512", "sha1", "md5")}


def _entry(row: list[str], number: int, problems: list[RecordProblem]) -> RecordEntry | None:
    found = []
    if len(row) != 3:
        problems.append(RecordProblem(number, f"has {len(row)} fields, not 3"))
        return None
    path, hash_field, size_field = row
    if not path:
        found.append("has an empty path")
    algo = digest = None
    if hash_field:
        algo, sep, digest = hash_field.partition("=")
        if sep and algo in _ALGOS and not digest:
            algo = digest = None  # ``sha256=``: no hash (pdm's rows for the files it links into its cache)
        elif not sep or not algo or not digest:
            found.append(f"has a bad hash {hash_field[:40]!r} (want algo=digest)")
            algo = digest = None
        else:  # one "sha256" for every row, not a string a row (a scan holds tens of thousands of rows)
            algo = _ALGOS.get(algo, algo)
    size = None
    if size_field:
        if size_field.isdigit():
            size = int(size_field)
        else:
            found.append(f"has a bad size {size_field[:20]!r}")
    if found:
        problems.extend(RecordProblem(number, f"{path[:200]!r} {why}") for why in found)
        return None
    return RecordEntry(path, algo, digest, size)


# The last few large RECORDs parsed, by a digest of their text (the text itself is not kept): one command
# reads the same RECORD several times (a restore: its first scan, the plan's reading of the distributions it
# replaces, the verify scan; torch's 11,700 rows are 60-100 ms a parse, its digest 2 ms). Entries are frozen;
# each caller gets lists of its own.
_MEMO_MIN = 64 << 10  # characters: smaller RECORDs parse in well under a millisecond
_MEMO_SIZE = 4
_memo: "OrderedDict[bytes, tuple[tuple[RecordEntry, ...], tuple[RecordProblem, ...]]]" = OrderedDict()
_memo_lock = threading.Lock()


def parse_record(text: str) -> tuple[list[RecordEntry], list[RecordProblem]]:
    """Every well-formed row of ``text`` as a ``RecordEntry``, and every problem found (empty when the
    whole file is well formed). Blank lines are skipped."""
    if len(text) < _MEMO_MIN:
        return _parse(text)
    key = _text_key(text)
    with _memo_lock:
        hit = _memo.get(key)
        if hit is not None:
            _memo.move_to_end(key)
    if hit is None:
        entries, problems = _parse(text)
        if problems:  # a garbled RECORD is refused or ignored, not read again: never held (it may be huge)
            return entries, problems
        hit = (tuple(entries), ())
        with _memo_lock:
            _memo[key] = hit
            while len(_memo) > _MEMO_SIZE:
                _memo.popitem(last=False)
    return list(hit[0]), list(hit[1])


def _text_key(text: str) -> bytes:
    import hashlib

    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=32).digest()


def _parse(text: str) -> tuple[list[RecordEntry], list[RecordProblem]]:
    import csv  # here: a quick command (status, a second snap) parses no RECORD
    import io

    entries: list[RecordEntry] = []
    problems: list[RecordProblem] = []
    reader = csv.reader(io.StringIO(text))
    try:
        for row in reader:
            if not row:
                continue
            entry = _entry(row, reader.line_num, problems)
            if entry is not None:
                entries.append(entry)
    except csv.Error as err:
        problems.append(RecordProblem(reader.line_num, f"is not CSV ({err})"))
    return entries, problems


def format_record(rows) -> str:
    """RECORD text for ``rows`` (``RecordEntry`` or lists of three strings), CSV as installers write it."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in rows:
        writer.writerow(row.to_row() if isinstance(row, RecordEntry) else row)
    return buf.getvalue()


def record_sha256(digest: bytes) -> str:
    """A raw digest (sha256, or another algorithm a RECORD names) as RECORD writes it: urlsafe base64 without
    padding."""
    return b2a_base64(digest, newline=False).translate(_URLSAFE).rstrip(b"=").decode("ascii")


_URLSAFE = bytes.maketrans(b"+/", b"-_")

