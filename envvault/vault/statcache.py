"""The stat cache (docs/format.md, "Stat cache"): per environment, what its last scan found (each
distribution's files, their stats, its summary and manifest id; each file's sha256 and chunks), so that an
unchanged file is not read again and an unchanged distribution is not even opened. A status verdict
(``snap/verdict.py``) names the groups file it rested on (``identity``).

Light on purpose: an unchanged ``status`` imports this module and not the ingester (``ingest.py``), whose
readers, chunker and pack writer only a changed file needs; zstandard is imported when the per-file half is.
"""

from __future__ import annotations

import json
import os
import sys
from array import array
from pathlib import Path

from envvault import __version__
from envvault.errors import CorruptError
from envvault.model.encoding import MAX_DOC_BYTES, json_loads
from envvault.vault.fsutil import atomic_write, flocked, open_regular, read_regular, read_regular_stat

__all__ = ["StatCache", "stat_key", "file_key", "groups_path", "encode_groups_file", "decode_groups_file",
           "read_groups_file", "group_problem", "encode_stats", "group_paths", "group_file_count", "unpacked_group",
           "group_stats_fresh", "unpack_stats", "portable_group", "group_from_portable"]


def stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


class StatCache:
    """Per-target cache of file stats and hashes, and per-distribution shortcuts. Not vault data.

    Two files: ``<name>.groups.bin`` (per distribution: its files, their stats, its summary; read on every
    snap: a JSON header and the files and stats packed after it, ``encode_groups_file``) and
    ``<name>.files.json.zst`` (per file: sha256 and chunk ids; read only when a file changed).
    """

    # 5: identity version 2 (summaries carry "identity", "scripts"); 6: packed files/stats; 7: the groups file
    # binary (a JSON header, then the files and stats: no base64, no JSON string of every path to parse)
    VERSION = 7
    # The groups file alone: 8, a link's stats are those of the file it leads to, and a group is kept for a
    # distribution with links only when each was read through (a version 7 group may have left its links
    # out: stale); 9, a link out of the environment to a file of RECORD's bytes is stored as that file (a
    # version 8 group's manifest recorded the link: reused, a snapshot would still hold no bytes of it). The
    # files document keeps VERSION: its entries mean what they meant.
    GROUPS_VERSION = 9

    def __init__(self, path: Path, *, lock=None, tmp_dir: Path | None = None, fresh: bool = False):
        # ``lock()``: the shared vault lock saves hold; ``tmp_dir``: where saves stage (``Vault.stat_cache``
        # passes both; the defaults are a local vault's, ``path`` being ``<vault>/state/<name>``). ``fresh``:
        # the target is new (a venv ``restore --into`` makes): nothing saved for its path is read, and the
        # first save replaces both files.
        self._lock = lock or (lambda: flocked(path.parent.parent / "locks" / "vault.lock", exclusive=False))
        self._tmp_dir = tmp_dir or path.parent.parent / "tmp"
        self.groups_path = groups_path(path)
        self.files_path = path.with_name(path.name + ".files.json.zst")
        self._files: dict[str, list] | None = None
        self.groups: dict[str, dict] = {}
        self.extra: dict = {}
        self.touched: set[str] = set()  # file entries used by this run; the rest is dropped on save
        self._touched_groups: list[tuple[str, dict]] = []  # (key prefix, group): expanded only if saved
        self._dirty_groups = False
        self._dirty_files = False
        self.listed: tuple[str, ...] | None = None  # the groups the last scan with this cache listed, in order
        self._groups_key: tuple[int, ...] | None = None  # the groups file these groups are (``identity``)
        self._epoch_path = path.parent / "gc-epoch"
        self._epoch = self._read_epoch()
        if fresh:
            self._files = {}
            self._dirty_groups = self._dirty_files = True
            return
        doc = self._load(self.groups_path, compressed=False)
        if doc:
            self.groups = doc.get("groups", {})
            extra = doc.get("extra")
            self.extra = extra if isinstance(extra, dict) else {}

    def _load(self, path: Path, compressed: bool) -> dict | None:
        """The files document (``compressed``: zstd over JSON) or the groups file (``read_groups_file``: its
        groups' files and stats read when first needed), None when it is missing, unreadable, does not decode
        or another version or envvault wrote it."""
        try:
            if compressed:
                raw, st = read_regular_stat(path, MAX_DOC_BYTES, path.name)  # no FIFO, no link to /dev/zero
                import zstandard

                try:
                    if zstandard.get_frame_parameters(raw).content_size > MAX_DOC_BYTES:
                        return None
                    raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=MAX_DOC_BYTES)
                except zstandard.ZstdError:
                    return None
                doc = json_loads(raw)
            else:
                doc, st = read_groups_file(path)
        except (OSError, ValueError, CorruptError):
            return None
        version = self.VERSION if compressed else self.GROUPS_VERSION
        if not isinstance(doc, dict) or doc.get("version") != version or doc.get("tool") != __version__:
            return None
        if not compressed:
            self._groups_key = file_key(st)
        return doc

    def identity(self) -> tuple[int, ...] | None:
        """The groups file whose groups (and ``extra``) this cache holds unchanged, as ``file_key`` of it: the
        one it loaded, or the one it last saved; None when they changed since (or there is none). A status
        verdict names it (``snap/verdict.py``): a verdict holds only while that file is the one on disk."""
        return None if self._dirty_groups else self._groups_key

    def forget_if_gc_ran(self, now: str | None = None) -> bool:
        """Called with the vault lock held (``Vault.lock``), before what this cache holds is used to write: when
        a gc ran since it was loaded (``gc-epoch`` moved on), its ids may name objects that gc deleted, which a
        scan trusts without the index. Everything it holds is dropped (the scan reads and hashes again); its next
        save writes only what was added since (when nothing was, no file: gc deleted it); True when so. ``now``:
        ``gc-epoch`` as the caller just read it (``Vault._after_gc``: one read for all its caches)."""
        now = self._read_epoch() if now is None else now
        if now == self._epoch:
            return False
        self._epoch = now
        self.groups, self._files = {}, {}
        self.touched, self._touched_groups = set(), []
        self._dirty_groups = self._dirty_files = False
        self._groups_key = None
        return True

    def _read_epoch(self) -> str:
        try:
            return read_regular(self._epoch_path, 4096, "gc-epoch").decode("ascii", "replace")
        except (OSError, CorruptError):
            return ""

    @property
    def files(self) -> dict[str, list]:
        if self._files is None:
            doc = self._load(self.files_path, compressed=True)
            self._files = doc.get("files", {}) if doc else {}
        return self._files

    def lookup(self, rel: str, st: os.stat_result) -> list | None:
        hit = self.files.get(rel)
        if hit is not None and hit[0] == stat_key(st):
            self.touched.add(rel)
            return hit
        return None

    def put(self, rel: str, st: os.stat_result, sha256: str, chunks: list[str] | None) -> None:
        self.put_key(rel, stat_key(st), sha256, chunks)

    def put_key(self, rel: str, key: list, sha256: str, chunks: list[str] | None) -> None:
        """``put`` with the file's stat key (``stat_key``) made already: kept as it is, not copied."""
        old = self.files.get(rel)
        # Keep stored chunks when a hash-only pass re-reads an unchanged file.
        if chunks is None and old is not None and old[0] == key:
            chunks = old[2]
        self.files[rel] = [key, sha256, chunks]
        self.touched.add(rel)
        self._dirty_files = True

    def forget(self, rel: str) -> None:
        """Drop the entry of ``rel`` (a link this scan could not read through: nothing known of it now)."""
        if self.files.pop(rel, None) is not None:
            self._dirty_files = True

    def learn(self, entries: dict[str, list]) -> None:
        """Take file entries another process made with ``put`` (a forked check scan's answers)."""
        if entries:
            self.files.update(entries)
            self.touched.update(entries)
            self._dirty_files = True

    def set_group(self, key: str, value: dict) -> None:
        """Keep ``value`` for ``key``; its ``files`` and ``stats`` lists (paths, stat keys) are stored packed
        (``encode_stats``), so compare groups with ``group_paths`` / the packed fields."""
        if isinstance(value.get("files"), list) and isinstance(value.get("stats"), list):
            value = dict(value)
            value["files"], value["stats"] = encode_stats(value["files"], value["stats"])
        self.groups[key] = value
        self._dirty_groups = True

    def drop_group(self, key: str) -> None:
        """Keep no group for ``key`` (the next scan builds that distribution's manifest again)."""
        if self.groups.pop(key, None) is not None:
            self._dirty_groups = True

    def mark_dirty(self) -> None:
        self._dirty_groups = True

    def touch(self, rels) -> None:
        self.touched.update(rels)

    def touch_group(self, group: dict, prefix: str = "") -> None:
        """Keep the file entries of a group's stored files (``prefix`` + each path): ``touch`` of every
        path, put off until a save that writes the file entries needs it (an unchanged scan never does)."""
        self._touched_groups.append((prefix, group))

    def _expand_touched(self) -> None:
        for prefix, group in self._touched_groups:
            paths = group_paths(group)
            self.touched.update((prefix + p for p in paths) if prefix else paths)
        self._touched_groups = []

    def save(self) -> None:
        """Write what changed; entries this run did not use are dropped. Never fails the caller.

        Saved under the vault's shared lock, and only when no gc ran since this cache was loaded: gc deletes
        objects, and the ids kept here are trusted without the index.
        """
        try:
            with self._lock():
                if self._read_epoch() != self._epoch:
                    return
                if self._files is not None:
                    self._expand_touched()
                if self._files is not None and (self._dirty_files or not self.touched >= self._files.keys()):
                    self._files = {k: v for k, v in self._files.items() if k in self.touched}
                    doc = {"version": self.VERSION, "tool": __version__, "files": self._files}
                    import zstandard

                    data = zstandard.ZstdCompressor(level=1).compress(json.dumps(doc, separators=(",", ":")).encode())
                    atomic_write(self.files_path, data, tmp_dir=self._tmp_dir, durable=False, vault=True)
                if self._dirty_groups:
                    data = encode_groups_file({"version": self.GROUPS_VERSION, "tool": __version__, "extra": self.extra},
                                              self.groups)
                    self._groups_key = file_key(atomic_write(self.groups_path, data, tmp_dir=self._tmp_dir,
                                                             durable=False, vault=True))
                    self._dirty_groups = False
                    try:  # version 6's groups file, which no version reads now
                        os.unlink(self.groups_path.with_suffix(".json"))
                    except FileNotFoundError:
                        pass
        except Exception:  # noqa: BLE001 - a cache that cannot be saved only costs speed next time
            pass


def groups_path(path: Path) -> Path:
    """The groups file of the stat cache at ``path`` (``<path>.groups.bin``)."""
    return path.with_name(path.name + ".groups.bin")


GROUPS_MAGIC = b"envvault stat cache groups\n"
# The header holds about 2 KB a distribution (8,000 of them in 16 MiB; the paths and stats are after it) and a
# row a folder of each compile cache root (``encode_groups_file`` drops those first when they do not fit);
# parsed, the largest header takes at most about 30 times its size (a list of empty objects), and it is read
# from a vault that may be someone else's: a longer one makes the cache empty.
HEADER_LIMIT = 16 << 20


def encode_groups_file(head: dict, groups: dict[str, dict]) -> bytes:
    """A groups file (docs/format.md, "Stat cache"): ``GROUPS_MAGIC``, the header's length (4 bytes,
    big-endian), the header (JSON: ``head`` and the groups, each packed group's ``files`` and ``stats`` left
    out and ``packed``, ``[bytes of its paths, files]``, put in their place), then each packed group's paths
    (UTF-8, joined by newlines) and stats (32 bytes a file), in the header's order. A header that would pass
    ``HEADER_LIMIT`` is written without the compile cache roots' groups (their ``dirs`` rows), else without
    any group: those are scanned again, the rest keeps its shortcuts."""
    out, body = {}, []
    for key, group in groups.items():
        files, stats = unpacked_group(group).get("files"), group.get("stats")
        if isinstance(files, str) and isinstance(stats, bytes):
            paths = files.encode()
            group = {k: v for k, v in group.items() if k not in ("files", "stats")}
            group["packed"] = [len(paths), len(stats) // 32]
            body += [paths, stats]
        out[key] = group
    header = json.dumps(dict(head, groups=out), separators=(",", ":")).encode()
    if len(header) > HEADER_LIMIT:  # never a file the reader refuses: what makes the header long goes first
        if any("dirs" in g for g in groups.values()):  # compile cache roots: a row a folder in the header
            return encode_groups_file(head, {k: g for k, g in groups.items() if "dirs" not in g})
        if groups:  # more distributions than a header holds: no groups (every scan reads them)
            return encode_groups_file(head, {})
        return encode_groups_file(dict(head, extra={}), {})
    return b"".join([GROUPS_MAGIC, len(header).to_bytes(4, "big"), header, *body])


class _Bytes:
    """A groups file held in memory (``decode_groups_file``)."""

    __slots__ = ("raw", "size")

    def __init__(self, raw: bytes):
        self.raw, self.size = raw, len(raw)

    def read(self, at: int, n: int) -> bytes:
        return self.raw[at:at + n]


class _File:
    """A groups file on disk, read at offsets (``os.pread``) through the descriptor it was opened with: a
    save that replaces the file (a rename) never changes what this reads. The descriptor is closed with the
    last group that needs it; a forked child reads through its own copy."""

    __slots__ = ("fd", "size")

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size

    def read(self, at: int, n: int) -> bytes:
        try:
            return os.pread(self.fd, n, at)
        except OSError:
            return b""  # a short answer: the group is stale

    def __copy__(self):  # one descriptor, closed once
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a groups file's descriptor does not leave its process but by fork")

    def __del__(self):
        try:
            os.close(self.fd)
        except (OSError, TypeError):  # TypeError: at the interpreter's exit, ``os`` may be gone
            pass


class _Packed:
    """Where a packed group's paths and stats lie in its groups file. Read the first time something needs
    them (``unpacked_group``), mostly in the forked child that checks the group: loading a cache parses the
    header alone (the paths and stats of a 70,000-file venv are 5 MB)."""

    __slots__ = ("source", "at", "size", "count")

    def __init__(self, source, at: int, size: int, count: int):
        self.source, self.at, self.size, self.count = source, at, size, count

    def __eq__(self, other) -> bool:  # groups compare by what they hold, read or not
        return isinstance(other, _Packed) and self.read() == other.read()

    __hash__ = None

    def read(self) -> tuple[str, bytes] | None:
        """(paths joined by newlines, stats), or None when the bytes are short or the paths not UTF-8."""
        data = self.source.read(self.at, self.size + 32 * self.count)
        if len(data) != self.size + 32 * self.count:
            return None
        try:
            return data[:self.size].decode(), data[self.size:]
        except UnicodeDecodeError:
            return None


def read_groups_file(path: Path) -> tuple[dict | None, os.stat_result]:
    """The groups file at ``path`` (opened as every file of a vault: no link, no FIFO) and its stat: its
    header, each packed group's files and stats left in the file until needed (``unpacked_group``); None
    for a file that is not one whole (``decode_groups_file``). OSError, CorruptError as ``open_regular``."""
    fd, st = open_regular(path, path.name)
    source = _File(fd, st.st_size)  # closes the descriptor once no group needs it
    if st.st_size > MAX_DOC_BYTES:
        return None, st
    return _parse_groups(source), st


def decode_groups_file(raw: bytes) -> dict | None:
    """``read_groups_file`` of a groups file held in memory."""
    return _parse_groups(_Bytes(raw))


def _parse_groups(source) -> dict | None:
    """A groups file's header, each packed group's ``packed`` made a ``_Packed`` (where its files and stats
    lie); None when it is not one whole (no magic, a header that is not a JSON object, a count that is not one,
    bytes missing or left over, a group with a problem: ``group_problem``). Never raises."""
    start = len(GROUPS_MAGIC) + 4
    lead = source.read(0, start)
    if len(lead) != start or not lead.startswith(GROUPS_MAGIC):
        return None
    at = start + int.from_bytes(lead[len(GROUPS_MAGIC):], "big")
    if at > source.size or at - start > HEADER_LIMIT:
        return None
    try:
        doc = json_loads(source.read(start, at - start))
    except (ValueError, CorruptError):
        return None
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not isinstance(groups, dict):
        return None
    for group in groups.values():
        if not isinstance(group, dict):
            return None  # every group an object, or no cache: a scan reads each with .get
        if "packed" not in group:
            continue
        packed = group["packed"]
        if not (isinstance(packed, list) and len(packed) == 2 and all(type(n) is int and n >= 0 for n in packed)):
            return None
        if "files" in group or "stats" in group:
            return None  # packed, and the lists too
        size, count = packed
        group["packed"] = _Packed(source, at, size, count)
        at += size + 32 * count
        if at > source.size:
            return None
    if at != source.size or any(group_problem(group) for group in groups.values()):
        return None
    return doc


def unpacked_group(group: dict) -> dict:
    """``group`` with its packed files and stats read from its groups file (once: they replace ``packed``).
    Bytes that are short or paths that are not UTF-8 leave it without files and stats: stale, read again
    (docs/format.md, "Stat cache")."""
    body = group.get("packed")
    if isinstance(body, _Packed):
        got = body.read()
        del group["packed"]
        if got is not None:
            group["files"], group["stats"] = got
    return group


def group_file_count(group: dict) -> int:
    """How many files a stat cache group lists, without reading them."""
    body = group.get("packed")
    if isinstance(body, _Packed):
        return body.count
    stats = group.get("stats")
    if isinstance(stats, bytes):
        return len(stats) // 32
    return len(stats) if isinstance(stats, list) else 0


def _ints(v, n: int | None = None) -> bool:
    return type(v) is list and (n is None or len(v) == n) and all(type(x) is int for x in v)


def _strs(v) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _obj(v) -> bool:
    return type(v) is dict


def _hex_id(v) -> bool:
    return type(v) is str and len(v) == 64


# What a group's fields must be for its readers (``snap/scan.py``, ``snap/fresh.py``, ``caches/archive.py``)
# to use it as they do; a field a group lacks is not checked (each reader looks for its own).
_GROUP_FIELDS = {
    "record_stat": lambda v: _ints(v, 4),
    "meta_stat": lambda v: _ints(v, 4),
    "missing": _strs,
    "summary": _obj,
    "manifest_full": _hex_id,
    "manifest_check": _hex_id,
    "lock": lambda v: (_obj(v) and _ints(v.get("record_stat"), 4) and _ints(v.get("meta_stat"), 4)
                       and _obj(v.get("summary"))),
    "dirs": lambda v: type(v) is list and all(type(d) is list and len(d) == 3 and type(d[0]) is str
                                              and _ints(d[1:]) for d in v),
    "tree_fp": _obj,
    "env_key": lambda v: type(v) is str,
    "entry": _obj,
}


def group_problem(group) -> str | None:
    """Why a stat cache group (as ``decode_groups_file`` gives it back) cannot be used, or None: not an
    object, a field of the wrong type (``_GROUP_FIELDS``), or files and stats that do not pair up (a
    newline-joined string with 32 bytes of stats a path, or two lists of the same length, each stat key four
    integers). Any problem makes the whole groups file nothing (docs/format.md, "Stat cache")."""
    if type(group) is not dict:
        return "not an object"
    for name, ok in _GROUP_FIELDS.items():
        if name in group and not ok(group[name]):
            return f"{name}: not what a group holds"
    if ("manifest_full" in group or "manifest_check" in group) and "summary" not in group:
        return "a manifest id without its summary"
    files, stats = group.get("files"), group.get("stats")
    if files is None and stats is None:  # none, or packed: their bytes were counted against the file's
        return None
    if type(files) is str and type(stats) is bytes:  # packed: the loader sliced 32 bytes a counted file
        # (paths that are not that count only make the group stale: the freshness rule compares all of them)
        return None if len(stats) % 32 == 0 else "files and stats do not pair up"
    if _strs(files) and type(stats) is list and len(stats) == len(files) and all(_ints(k, 4) for k in stats):
        return None
    return "files and stats do not pair up"


def file_key(st: os.stat_result) -> tuple[int, ...]:
    """Which file a stat cache's groups file is: its size, mtime and inode (not its ctime, which a rename
    moves: the key of a file written is taken before it is renamed into place, ``atomic_write``). Every
    save writes a new file, so a file that is replaced never keeps its key."""
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def encode_stats(paths: list[str], stats: list[list[int]]) -> tuple:
    """``files`` and ``stats`` of a stat cache group as kept (docs/format.md, "Stat cache"): the paths joined
    by newlines and the stat keys packed as little-endian int64, four a file, or the lists as they are when a
    path holds a newline or a stat does not fit 64 bits."""
    if any("\n" in p for p in paths) or len(paths) != len(stats):
        return list(paths), [list(k) for k in stats]
    arr = array("q")
    try:
        for key in stats:
            arr.extend(key)
    except (OverflowError, TypeError):
        return list(paths), [list(k) for k in stats]
    if len(arr) != 4 * len(paths):
        return list(paths), [list(k) for k in stats]
    if sys.byteorder != "little":
        arr.byteswap()
    return "\n".join(paths), arr.tobytes()


def portable_group(group: dict) -> dict:
    """``group`` as JSON carries it (a forked child's answer, ``snap/scan.py``): its packed stats as hex;
    ``group_from_portable`` gives it back."""
    stats = unpacked_group(group).get("stats")
    return dict(group, stats=stats.hex()) if isinstance(stats, bytes) else group


def group_from_portable(group: dict) -> dict:
    """The group ``portable_group`` made (``ValueError`` for stats that are not hex)."""
    stats = group.get("stats")
    return dict(group, stats=bytes.fromhex(stats)) if isinstance(stats, str) else group


def group_paths(group: dict) -> list[str]:
    """The stored files of a stat cache group, in order."""
    files = unpacked_group(group).get("files")
    if isinstance(files, str):
        return files.split("\n") if files else []
    return list(files or ())


def unpack_stats(group: dict) -> tuple[list[str], bytes] | None:
    """A packed stat cache group's stored files and their stat keys (32 bytes a file), split once for the
    checks of its parts (``group_stats_fresh``); None when the group is not packed."""
    files, stats = unpacked_group(group).get("files"), group.get("stats")
    if not (isinstance(files, str) and isinstance(stats, bytes)):
        return None
    return (files.split("\n") if files else []), stats


def group_stats_fresh(base: str, group: dict, start: int = 0, stop: int | None = None,
                      unpacked: tuple[list[str], bytes] | None = None) -> bool:
    """True when every stored file of ``group`` (paths relative to ``base``, which ends with a slash), or
    those from ``start`` to ``stop``, still has the stat key recorded: one ``stat`` a file, compared packed.
    A symlink is followed: a link's recorded key is the file's it leads to (``snap/manifests._link_state``),
    a regular file's is the same either way, and a file a link replaced has another inode or ctime.
    ``unpacked``: the group's ``unpack_stats``, when the caller split it already. False on any error."""
    files, stats = unpacked_group(group).get("files"), group.get("stats")
    lstat = os.stat  # (named for what it is to a regular file, which is every file but links)
    try:
        if unpacked is None and isinstance(files, str) and isinstance(stats, bytes):
            unpacked = unpack_stats(group)
        if unpacked is not None:
            paths, want = unpacked
            now = array("q")
            add = now.extend
            if start or stop is not None:
                want = want[start * 32:len(want) if stop is None else stop * 32]
                paths = paths[start:stop]
            for rel in paths:
                st = lstat(base + rel)
                add((st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
            if sys.byteorder != "little":
                now.byteswap()
            return now.tobytes() == want
        if len(files) != len(stats):
            return False
        for rel, key in zip(files[start:stop], stats[start:stop], strict=True):
            st = lstat(base + rel)
            if [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns] != key:
                return False
        return True
    except (OSError, TypeError, ValueError, OverflowError):
        return False
