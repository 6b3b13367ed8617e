"""Which distributions of an environment are unchanged since its stat cache (``vault/statcache.py``): RECORD,
METADATA and every stored file keep the stats of the last scan, one ``lstat`` a file, shared out to forked
children on a large environment (``forked.py``). Used by every scan (``scan.py``) and by the quick ``status``
(``verdict.py``), which must not import the scan's ingester and manifest builder.
"""

from __future__ import annotations

import os
from pathlib import Path

from envvault.vault.statcache import group_file_count, group_stats_fresh, stat_key, unpack_stats

from envvault.vault.forked import check_all

__all__ = ["JOURNAL_NAME", "STATE_JOURNAL", "journal_left", "env_cache_name", "base_of", "entry_key", "fresh_groups"]

# envvault.journal.JOURNAL_NAME, spelt out: a scan that finds no journal need not import the restore journal
# (tests/test_snap_fastpath.py checks the two agree).
JOURNAL_NAME = ".envvault-restore.json"
STATE_JOURNAL = "journal-{key}.json"  # a system environment's, in the vault's state/ (journal.journal_file)


def journal_left(prefix: Path, state_dir: Path) -> bool:
    """A restore of the environment at ``prefix`` was killed: its journal is in the environment (a venv)
    or in the vault's ``state_dir`` (a system environment's); a scan settles it first, the quick ``status``
    leaves it to the full command."""
    from envvault.safepaths import env_key

    return os.path.lexists(os.path.join(prefix, JOURNAL_NAME)) or os.path.lexists(
        os.path.join(state_dir, STATE_JOURNAL.format(key=env_key(prefix))))


def env_cache_name(target: str | os.PathLike) -> str:
    """The name of the stat cache of the environment at ``target`` (``state/stat-<key>``: one per real path;
    every scan's, and the quick ``status``'s)."""
    from envvault.safepaths import env_key

    return f"stat-{env_key(target)}"


def base_of(prefix: Path) -> str:
    """``prefix`` as the start of the paths under it: a system environment's root "/" gives "/", not "//"."""
    return f"{str(prefix).rstrip('/')}/"


def entry_key(dist_info: Path, prefix: Path, base: str) -> str:
    """The key of a dist-info folder's group in the stat cache: its path under ``prefix`` (``base`` is
    ``base_of(prefix)``; string work: pathlib's is 0.1 ms a call)."""
    where = str(dist_info)
    return where[len(base):] if where.startswith(base) else dist_info.relative_to(prefix).as_posix()


def _group_fresh(group: dict, prefix: Path, dist_info: Path, start: int = 0, stop: int | None = None,
                 unpacked: tuple | None = None) -> bool:
    """True when RECORD and every stored file still have the stats recorded at the last snap. With
    ``start``/``stop``, only those of the group's files (``group_stats_fresh``, given the group's
    ``unpacked`` stats when decoded once for all its parts); the group's own checks (RECORD, METADATA, files
    recorded missing) are made by the part that starts at 0."""
    base = base_of(prefix)
    try:
        if start == 0:
            if stat_key(os.stat(dist_info / "RECORD")) != group["record_stat"]:
                return False
            if group.get("meta_stat") != stat_key(os.stat(dist_info / "METADATA")):
                return False
            if any(os.path.lexists(base + rel) for rel in group.get("missing", ())):
                return False
        if not group_stats_fresh(base, group, start, stop, unpacked):
            return False
    except (OSError, KeyError, TypeError, ValueError):
        return False
    return True


_PART_FILES = 3000  # a large distribution's files are checked in parts of this many (torch: 11,700)


def fresh_groups(entries: list, prefix: Path) -> set[int]:
    """The entries (by position) whose stat cache group is still fresh (``_group_fresh``): every stored
    file's ``lstat``, in parts of ``_PART_FILES`` files shared out to forked children on a large
    environment (``forked.check_all``); a group is fresh when all its parts are."""
    parts, weights = [], []  # (entry, start, stop): the last part of a group runs to its end; files in each
    split: dict[int, tuple | None] = {}  # a group of several parts: its files read and split once, before any fork
    for n, (_, _, group, mid) in enumerate(entries):
        if mid:
            count = group_file_count(group)  # a group of one part is read by the process that checks it
            if count > _PART_FILES:
                split[n] = unpack_stats(group)
            for a in range(0, max(count, 1), _PART_FILES):
                last = a + _PART_FILES >= count
                parts.append((n, a, None if last else a + _PART_FILES))
                weights.append((count if last else a + _PART_FILES) - a + 1)
    flags = check_all(lambda p: _group_fresh(entries[p[0]][2], prefix, entries[p[0]][0], p[1], p[2], split.get(p[0])),
                      parts, weights)
    stale = {p[0] for p, ok in zip(parts, flags) if not ok}
    return {p[0] for p in parts} - stale

