"""The verdict of the last ``status`` that found an environment equal to its snapshot, and the quick
``status`` that answers from it (docs/format.md, "Status verdicts": ``state/verdict-<key>.bin``).

A ``status`` that finds nothing changed (and a snap, or a restore in place whose verify scan found the
environment equal to the snapshot, once that snapshot is its baseline) writes what its answer rested on: the
snapshot and the note printed with it, the vault's side (``vault_stamp``: the stat keys of ``snapshots/`` and
of the environment's ``restored-`` marker, taken before the baseline was chosen, and of the snapshot's file),
the stat cache's groups file its scan used (``StatCache.identity``: the one it loaded unchanged, or the one it
saved), the interpreter's memo, and its table: the dist-info folders its scan listed, in order, each with
what the freshness rule reads of its group (RECORD's and METADATA's stat keys, the files recorded missing,
the stored files and their stat keys, packed: no JSON to parse for them).

The next ``status`` answers "unchanged" from the verdict alone (``unchanged_since``) when the vault's side
is the same, the groups file is still that one (one ``lstat``: its groups are not read, the table has what
the check needs), the interpreter still answers from the memo, the environment lists the same dist-info
folders and every one of them is still fresh (the scan's own rule, ``fresh.py``: one ``lstat`` a file): then
the full command would scan the same groups into the same packages against the same snapshot. It imports
neither the CLI, nor the model, the diff or the ingester. Anything else (another snapshot, a restore, an
interrupted restore, a changed file, a new or removed distribution, a verdict that does not parse) sends the
command down its full path, which writes a new verdict when it finds nothing changed.

A verdict in a vault copied from someone else is no more trusted than the stat cache beside it: it answers
only when every file of the environment has the size, mtime, inode and ctime recorded there.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from envvault.errors import CorruptError, EnvvaultError
from envvault.model.encoding import MAX_DOC_BYTES
from envvault.vault.fsutil import read_regular
from envvault.vault.statcache import StatCache, env_cache_name, file_key, groups_path, packed_group, stat_key

from .fresh import base_of, entry_key, fresh_groups, journal_left

__all__ = ["Verdict", "VerdictGroup", "Paths", "parse_verdict", "pack_verdict", "verdict_name", "restored_name",
           "vault_stamp", "verdict_stamp", "snapshots_dir", "snapshot_stamp", "record_verdict",
           "unchanged_since", "unchanged_text"]

_ID = re.compile(r"[0-9a-f]{64}")
VERSION = 2  # 1: a JSON file (verdict-<key>.json) naming the groups; 2: with the groups' files and stats
MAGIC = b"envvault-verdict\n"
_HEAD_LIMIT = 64 << 20  # the header lists one small object a distribution: thousands are well under a MiB


class VerdictGroup(NamedTuple):
    """One distribution of a verdict's table: its stat cache group, as the scan's freshness rule reads it."""

    key: str  # the dist-info folder's path under the environment (the group's key)
    record_stat: tuple[int, ...]  # RECORD's stat key
    meta_stat: tuple[int, ...]  # METADATA's
    missing: tuple[str, ...]  # files RECORD lists that were not there
    paths: Paths  # the stored files, relative to the environment
    stats: bytes  # their stat keys, packed (32 bytes a file: ``statcache.unpack_stats``)


class Paths:
    """A table entry's stored files: their UTF-8 bytes, joined by newlines, split into a list only when
    first read (by the forked child that checks them: the quick status's own process splits none but its
    share). A sequence of str of the count the parser checked."""

    __slots__ = ("_raw", "_count", "_split")

    def __init__(self, raw: bytes, count: int):
        self._raw, self._count, self._split = raw, count, None

    def _list(self) -> list[str]:
        if self._split is None:
            self._split = self._raw.decode().split("\n") if self._raw else []
        return self._split

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        return self._list()[index]

    def __iter__(self):
        return iter(self._list())


class Verdict(NamedTuple):
    """``state/verdict-<key>.bin``, parsed (``parse_verdict``)."""

    venv: str  # the environment's path as the command named it
    snapshot: str  # the id of the snapshot it matched
    note: str  # what the command printed after the id ("" for none)
    vault: tuple[int, ...]  # vault_stamp before the baseline was chosen
    snapshot_stat: tuple[int, ...]  # snapshot_stamp of that snapshot's file
    groups: tuple[int, ...]  # the stat cache's groups file the scan used (``StatCache.identity``)
    probe: dict  # the interpreter's memo the scan used (``VenvReader``: {"key": [...], "value": {...}})
    table: tuple[VerdictGroup, ...]  # the dist-info folders the scan listed, in order, with their groups


def _ints(value, what: str, problems: list[str], count: int | None = None) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(v) is int for v in value) \
            or (count is not None and len(value) != count):
        problems.append(f"{what}: not a list of {count or ''} integers".replace("  ", " "))
        return ()
    return tuple(value)


def pack_verdict(header: dict, body: list[bytes]) -> bytes:
    """A verdict file: ``MAGIC``, the header's length (4 bytes, big-endian), the header (JSON) and the body
    (each table entry's paths, then its stats)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, len(head).to_bytes(4, "big"), head, *body])


def parse_verdict(data: bytes) -> tuple[Verdict | None, list[str]]:
    """A verdict from its file's bytes and the problems found (each with its place); ``(None, problems)``
    when there are any. A verdict that does not parse is simply not used."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        return None, ["verdict: not a verdict file (no magic)"]
    size = int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "big")
    at = len(MAGIC) + 4 + size
    if size > _HEAD_LIMIT or at > len(data):
        return None, [f"verdict: a header of {size} bytes, beyond the file's end or its limit"]
    try:
        doc = json.loads(data[len(MAGIC) + 4:at])
    except (ValueError, RecursionError):
        return None, ["verdict: the header is not JSON"]
    if not isinstance(doc, dict):
        return None, ["verdict: the header is not an object"]
    problems: list[str] = []
    if doc.get("version") != VERSION:
        problems.append(f"verdict.version: not {VERSION}")
    venv, sid, note, probe = doc.get("venv"), doc.get("snapshot"), doc.get("note"), doc.get("probe")
    if not isinstance(venv, str) or not venv:
        problems.append("verdict.venv: not a path")
    if not isinstance(sid, str) or not _ID.fullmatch(sid):
        problems.append("verdict.snapshot: not a snapshot id")
    if not isinstance(note, str) or len(note) > 4096:
        problems.append("verdict.note: not a text of at most 4096 characters")
    if not isinstance(probe, dict) or not isinstance(probe.get("key"), list) \
            or not isinstance(probe.get("value"), dict):
        problems.append("verdict.probe: not an interpreter memo ({key: [...], value: {...}})")
    vault = _ints(doc.get("vault"), "verdict.vault", problems)
    snap = _ints(doc.get("snapshot_stat"), "verdict.snapshot_stat", problems)
    groups = _ints(doc.get("groups"), "verdict.groups", problems, 3)
    table, body_end = _parse_table(doc.get("table"), data, at, problems)
    if body_end is not None and body_end != len(data):
        problems.append(f"verdict: {len(data) - body_end} bytes after the table's end")
    unknown = sorted(set(doc) - set(Verdict._fields) - {"version"})
    if unknown:
        problems.append(f"verdict: unknown fields {', '.join(map(str, unknown))}")
    if problems:
        return None, problems
    return Verdict(venv, sid, note, vault, snap, groups, probe, table), []


def _parse_table(entries, data: bytes, at: int, problems: list[str]) -> tuple[tuple, int | None]:
    """The verdict's table from its header entries and the body from ``at``; (table, where the body
    ended), the end None when the header's entries could not be read."""
    if not isinstance(entries, list):
        problems.append("verdict.table: not a list")
        return (), None
    table = []
    for n, e in enumerate(entries):
        where = f"verdict.table[{n}]"
        if not isinstance(e, dict) or set(e) != {"key", "record_stat", "meta_stat", "missing", "files", "paths"}:
            problems.append(f"{where}: not an object of key, record_stat, meta_stat, missing, files, paths")
            return (), None
        key, missing, files, size = e["key"], e["missing"], e["files"], e["paths"]
        bad = len(problems)
        if not isinstance(key, str) or not key:
            problems.append(f"{where}.key: not a path")
        if not isinstance(missing, list) or not all(isinstance(m, str) and m for m in missing):
            problems.append(f"{where}.missing: not a list of paths")
        if type(files) is not int or files < 0 or type(size) is not int or size < 0:
            problems.append(f"{where}.files, .paths: not counts")
            return (), None
        record = _ints(e["record_stat"], f"{where}.record_stat", problems, 4)
        meta = _ints(e["meta_stat"], f"{where}.meta_stat", problems, 4)
        stop = at + size + 32 * files
        if stop > len(data):
            problems.append(f"{where}: its files and stats run past the file's end")
            return (), None
        raw = data[at:at + size]
        if not raw.isascii():  # (what is ASCII is UTF-8: the one pass over every path, in C)
            try:
                raw.decode()
            except UnicodeDecodeError:
                problems.append(f"{where}.paths: not UTF-8")
        count = raw.count(b"\n") + 1 if raw else 0
        if count != files:
            problems.append(f"{where}.paths: {count} paths for {files} files")
        if len(problems) == bad:
            table.append(VerdictGroup(key, record, meta, tuple(missing), Paths(raw, count), data[at + size:stop]))
        at = stop
    return tuple(table), at


def verdict_name(target: str | os.PathLike) -> str:
    """The state file holding the verdict of the environment at ``target``."""
    from envvault.safepaths import env_key

    return f"verdict-{env_key(target)}.bin"


def restored_name(target: str | os.PathLike) -> str:
    """The state file naming the snapshot last restored onto ``target`` (``restore/baseline.py``)."""
    from envvault.safepaths import env_key

    return f"restored-{env_key(target)}.json"


def _stat_key_or_absent(path: Path) -> list[int]:
    """The ``lstat`` key of ``path``, or ``[-1]`` when there is nothing there."""
    try:
        return stat_key(os.lstat(path))
    except FileNotFoundError:
        return [-1]


def vault_stamp(snapshots_dir: Path, state_dir: Path, target: str | os.PathLike) -> tuple[int, ...]:
    """What the baseline of ``target`` depends on in a local vault: the stat keys of its ``snapshots/``
    folder (any snapshot added or removed changes it) and of the environment's ``restored-`` marker
    (``[-1]`` when there is none). ``lstat``: a folder replaced by a link does not match."""
    return tuple(_stat_key_or_absent(snapshots_dir) + _stat_key_or_absent(state_dir / restored_name(target)))


def verdict_stamp(vault, target: Path) -> tuple[int, ...] | None:
    """``vault_stamp`` of an open vault (``store.Vault``), None for a vault in a bucket: its snapshots are
    not a folder whose stat tells a change."""
    from envvault.vault.local import LocalBackend

    if type(vault.backend) is not LocalBackend:
        return None
    return vault_stamp(snapshots_dir(vault.backend.root), vault.state.dir, target)


def snapshots_dir(root: Path) -> Path:
    """The folder of a local vault's snapshot files (docs/format.md, "Directory tree")."""
    return Path(root) / "snapshots"


def snapshot_stamp(snapshot_file: Path) -> tuple[int, ...]:
    """The stat key of a snapshot's file (a document rewritten in place does not match)."""
    return tuple(_stat_key_or_absent(snapshot_file))


def record_verdict(vault, cache: StatCache, *, target: Path, sid: str, note: str | None,
                   stamp: tuple[int, ...]) -> None:
    """Write the verdict that the environment at ``target`` matched snapshot ``sid`` (of the open local
    ``vault``) when ``cache``'s last scan (``cache.listed``) was made, the vault's side being ``stamp``
    (``verdict_stamp``) before the baseline was chosen. Call it once ``cache`` is saved: nothing is written
    when its groups are not those of a file on disk (``identity``), no scan listed them, a listed group has
    no manifest id or cannot be packed, or the interpreter's memo is not there. Never fails."""
    groups, listed, probe = cache.identity(), cache.listed, cache.extra.get("probe")
    if groups is None or listed is None or not isinstance(probe, dict):
        return
    entries, body = [], []
    for key in listed:
        group = cache.groups.get(key)
        packed = packed_group(group) if group else None
        if packed is None or not (group.get("manifest_check") or group.get("manifest_full")) \
                or not isinstance(group.get("record_stat"), list) or not isinstance(group.get("meta_stat"), list):
            return  # the scan would not take it as unchanged either
        paths = packed[0].encode()
        entries.append({"key": key, "record_stat": group["record_stat"], "meta_stat": group["meta_stat"],
                        "missing": list(group.get("missing", ())), "files": len(packed[1]) // 32,
                        "paths": len(paths)})
        body += [paths, packed[1]]
    header = {"version": VERSION, "venv": str(target), "snapshot": sid, "note": note or "", "vault": list(stamp),
              "snapshot_stat": list(snapshot_stamp(vault.backend.path("snapshots", sid))), "groups": list(groups),
              "probe": probe, "table": entries}
    try:
        vault.state.write(verdict_name(target), pack_verdict(header, body), durable=False)
        os.unlink(vault.state.dir / verdict_name(target).replace(".bin", ".json"))  # a version 1 verdict, unread
    except FileNotFoundError:
        pass
    except (OSError, EnvvaultError):
        pass  # a cache: the next status answers in full


class _ProbeMemo:
    """A verdict's copy of the interpreter's memo, as a reader's ``Memo`` (never written)."""

    def __init__(self, probe: dict):
        self.extra = {"probe": probe}

    def mark_dirty(self) -> None:
        pass


def unchanged_since(root: Path, venv: str | None) -> tuple[Path, Verdict] | None:
    """``(target, verdict)`` when the environment ``venv`` (or the active one) is unchanged since the
    snapshot its last full ``status`` found it equal to, by the rules of the module docstring; None when that
    cannot be told without the full command (which then answers, errors included)."""
    from envvault.env.probe import find_target, system_of
    from envvault.env.venv import VenvReader
    from envvault.vault.local import LocalBackend
    from envvault.vault.state import LocalState

    try:
        target = find_target(venv)
    except EnvvaultError:
        return None
    if system_of(target) is not None or not (target / "pyvenv.cfg").is_file():
        return None  # a system environment: its baseline depends on the interpreter in use
    backend, state = LocalBackend(root), LocalState.in_vault(root)
    if journal_left(target, state.dir):
        return None  # an interrupted restore: the full command settles it
    try:
        verdict, _ = parse_verdict(read_regular(state.dir / verdict_name(target), MAX_DOC_BYTES, "verdict"))
    except (OSError, CorruptError):
        return None
    if verdict is None or verdict.venv != str(target):
        return None
    if vault_stamp(snapshots_dir(root), state.dir, target) != verdict.vault or verdict.snapshot_stat == (-1,) \
            or snapshot_stamp(backend.path("snapshots", verdict.snapshot)) != verdict.snapshot_stat:
        return None
    try:  # the groups file is still the one the verdict rested on (not read: its table is in the verdict)
        st = os.lstat(groups_path(state.dir / env_cache_name(target)))
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or file_key(st) != verdict.groups:
        return None
    reader = VenvReader(target, _ProbeMemo(verdict.probe))
    try:
        if reader.memoised_interpreter() is None:  # the interpreter or pyvenv.cfg changed
            return None
        listed = reader.dist_entries()
        if len(listed) != len(verdict.table):
            return None
        base, entries, unpacked = base_of(target), [], {}
        for n, ((dist_info, site), group) in enumerate(zip(listed, verdict.table)):
            if entry_key(dist_info, target, base) != group.key:
                return None
            # (as the scan's: True, a manifest id is there; the verdict was written only so)
            entries.append((dist_info, site, {"record_stat": list(group.record_stat),
                                              "meta_stat": list(group.meta_stat), "missing": group.missing}, True))
            unpacked[n] = (group.paths, group.stats)
    except (EnvvaultError, OSError, ValueError):
        return None
    if len(fresh_groups(entries, target, unpacked)) != len(entries):
        return None
    return target, verdict


def unchanged_text(target: str | os.PathLike, sid: str, note: str | None) -> str:
    """What ``status`` prints for an unchanged environment (the full command and the quick one)."""
    from envvault.output import style

    return f"{target}: unchanged since snapshot {style(sid[:12], 'yellow')}" + (f" ({note})" if note else "")
